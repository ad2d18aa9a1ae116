"""The client's writeConcern on a sharded collection's writes through a proxy.

Before the fix, the proxy built each shard's insert, update and delete without the client's
writeConcern, and dropped a shard's writeConcernError from the answer: a write asking for
more copies than a shard could give was acknowledged at the shard's default (majority)
with no error. Now every shard command carries it, and the client sees a shard's
writeConcernError as the shard sent it, or, from several shard commands, one
WriteConcernFailed (64) naming them, as mongos answers (BatchWriteOp::buildClientResponse).

The shards here are one-member replica sets: w: 5 cannot be satisfied and each shard
answers UnsatisfiableWriteConcern (100) after applying the write (as mongod does).

An aggregate with $out/$merge of an unsharded collection is forwarded whole to the
database's primary shard: its writeConcernError was dropped too (issue #20)."""
import pytest

from proxy_helpers import ProxyCluster

NS = "db.wc"


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 50}], shards=["shard-a", "shard-b"])
    yield cl
    cl.close()


def owned(cl):
    out = {}
    for s in ("shard-a", "shard-b"):
        for d in cl.shard_client(s).db.wc.find():
            out[d["_id"]] = (s, d)
    return out


def test_one_shards_write_concern_error_reaches_the_client(cluster):
    db = cluster.proxy_client(0).db
    r = db.command({"insert": "wc", "documents": [{"_id": 1, "k": 1}],
                    "writeConcern": {"w": 5}})
    assert r["n"] == 1
    assert r["writeConcernError"]["code"] == 100, r
    r = db.command({"update": "wc", "updates": [{"q": {"k": 1}, "u": {"$set": {"x": 1}}}],
                    "writeConcern": {"w": 5}})
    assert (r["n"], r["nModified"]) == (1, 1)
    assert r["writeConcernError"]["code"] == 100, r
    r = db.command({"delete": "wc", "deletes": [{"q": {"k": 1}, "limit": 1}],
                    "writeConcern": {"w": 5}})
    assert r["n"] == 1
    assert r["writeConcernError"]["code"] == 100, r
    assert owned(cluster) == {}


def test_several_shards_errors_become_one_write_concern_failed(cluster):
    db = cluster.proxy_client(0).db
    docs = [{"_id": i, "k": i} for i in (10, 60, 20, 70)]
    r = db.command({"insert": "wc", "documents": docs, "ordered": False,
                    "writeConcern": {"w": 5}})
    assert r["n"] == 4
    wce = r["writeConcernError"]
    assert wce["code"] == 64 and wce["codeName"] == "WriteConcernFailed", r
    assert "multiple errors reported" in wce["errmsg"], wce
    assert "Not enough data-bearing nodes" in wce["errmsg"], wce
    got = owned(cluster)
    assert {k: v[0] for k, v in got.items()} == {10: "shard-a", 20: "shard-a",
                                                 60: "shard-b", 70: "shard-b"}
    # a multi-statement update over both shards
    r = db.command({"update": "wc", "updates": [{"q": {}, "u": {"$set": {"y": 1}},
                                                 "multi": True}],
                    "writeConcern": {"w": 5}})
    assert r["nModified"] == 4
    assert r["writeConcernError"]["code"] == 64, r


def test_a_satisfiable_write_concern_answers_no_error(cluster):
    db = cluster.proxy_client(0).db
    for wc in ({"w": 1}, {"w": "majority", "wtimeout": 10000}, {"w": 1, "j": True}):
        r = db.command({"insert": "wc", "documents": [{"k": 5}, {"k": 55}],
                        "writeConcern": wc})
        assert r["n"] == 2 and "writeConcernError" not in r, (wc, r)
    assert len(owned(cluster)) == 6


def unsharded_docs(cl, coll):
    """The documents of the unsharded db.<coll> on whichever shard is db's primary."""
    out = []
    for s in ("shard-a", "shard-b"):
        out += list(cl.shard_client(s).db[coll].find({}, sort=[("_id", 1)]))
    return out


@pytest.mark.parametrize("stage", [{"$out": "plain_out"}, {"$merge": "plain_out"}])
def test_out_merge_of_an_unsharded_collection_answers_the_shards_error(cluster, stage):
    # issue #20: the whole aggregate goes to the primary shard, whose writeConcernError
    # the proxy dropped ({ok: 1} alone); a shard and mongos answer it next to the cursor
    db = cluster.proxy_client(0).db
    db.plain.insert_many([{"_id": i, "v": i} for i in range(3)])
    r = db.command({"aggregate": "plain", "pipeline": [stage], "cursor": {},
                    "writeConcern": {"w": 5}})
    assert r["ok"] == 1 and r["cursor"]["firstBatch"] == [], r
    wce = r["writeConcernError"]
    assert wce["code"] == 100 and wce["codeName"] == "UnsatisfiableWriteConcern", r
    assert "$clusterTime" not in wce and "operationTime" not in wce, wce
    assert unsharded_docs(cluster, "plain_out") == [{"_id": i, "v": i} for i in range(3)]
    # a satisfiable writeConcern: no error
    r = db.command({"aggregate": "plain", "pipeline": [stage], "cursor": {},
                    "writeConcern": {"w": 1}})
    assert r["ok"] == 1 and "writeConcernError" not in r, r
