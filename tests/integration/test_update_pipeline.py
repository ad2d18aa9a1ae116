"""Pipeline-style updates (MongoDB 4.2+, issue #20): `u` given as an array of stages
($addFields/$set, $project/$unset, $replaceRoot/$replaceWith) with aggregation expressions,
on a shard and through a proxy to a sharded collection.

Through a proxy the shard checks that the new document keeps its shard key value (the
proxy cannot tell from the stages): a change is refused with 66 ImmutableField before
anything is written, as for an operator update that changes it; before, a pipeline that
changed the key left the document on a shard that does not own its new key (an orphan)."""
import pytest
from pymongo import MongoClient, ReturnDocument
from pymongo.errors import OperationFailure, WriteError

from proxy_helpers import ProxyCluster


def test_pipeline_updates_on_a_shard(shard):
    _, port = shard
    with MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as cl:
        c = cl.app.c
        c.insert_many([{"_id": 1, "a": 1, "b": 2}, {"_id": 2, "a": 10, "b": 20},
                       {"_id": 3, "sub": {"x": 1}}])
        r = c.update_one({"_id": 1}, [{"$set": {"s": {"$add": ["$a", "$b"]}}},
                                      {"$unset": ["a"]}])
        assert (r.matched_count, r.modified_count) == (1, 1)
        assert c.find_one({"_id": 1}) == {"_id": 1, "b": 2, "s": 3}
        r = c.update_many({"b": {"$exists": True}},
                          [{"$addFields": {"b": {"$multiply": ["$b", 10]}}}])
        assert r.modified_count == 2
        assert [d["b"] for d in c.find({}, sort=[("_id", 1)]) if "b" in d] == [20, 200]
        # the result replaces the document; its _id is kept even when a stage drops it
        c.update_one({"_id": 3}, [{"$replaceWith": "$sub"}])
        assert c.find_one({"_id": 3}) == {"_id": 3, "x": 1}
        c.update_one({"_id": 2}, [{"$project": {"_id": 0, "a": 1}}])
        assert c.find_one({"_id": 2}) == {"_id": 2, "a": 10}
        # an upsert applies the stages to the filter's equality fields
        r = c.update_one({"_id": 9, "k": "x"}, [{"$set": {"n": {"$concat": ["$k", "y"]}}}],
                         upsert=True)
        assert r.upserted_id == 9
        assert c.find_one({"_id": 9}) == {"_id": 9, "k": "x", "n": "xy"}
        d = c.find_one_and_update({"_id": 9}, [{"$set": {"n": "z"}}],
                                  return_document=ReturnDocument.AFTER)
        assert d == {"_id": 9, "k": "x", "n": "z"}
        # refused, nothing written
        before = list(c.find({}, sort=[("_id", 1)]))
        for stages, code in (([{"$set": {"_id": 5}}], 66), ([{"$group": {"_id": None}}], 72),
                             ([{"$match": {"a": 1}}], 72), ([{"$set": {"v": "$$NOW"}}], 17276)):
            with pytest.raises(WriteError) as e:
                c.update_one({"_id": 1}, stages)
            assert e.value.code == code, (stages, e.value.details)
        r = cl.app.command({"update": "c", "updates": [
            {"q": {"_id": 1}, "u": [{"$set": {"a": 1}}], "arrayFilters": [{"e": 1}]}]})
        assert r["nModified"] == 0 and r["writeErrors"][0]["code"] == 9, r
        assert "arrayFilters" in r["writeErrors"][0]["errmsg"], r
        assert list(c.find({}, sort=[("_id", 1)])) == before


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 50}],
                        shards=["shard-a", "shard-b"])
    yield cl
    cl.close()


def placement(cl):
    return {d["_id"]: (s, d) for s in ("shard-a", "shard-b")
            for d in cl.shard_client(s).db.c.find()}


def test_pipeline_updates_through_a_proxy_keep_the_shard_key(cluster):
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": i, "v": i} for i in range(0, 100, 10)])
    r = c.update_many({}, [{"$set": {"w": {"$multiply": ["$v", 2]}}}, {"$unset": "v"}])
    assert (r.matched_count, r.modified_count) == (10, 10)
    got = placement(cluster)
    assert {i: (s, d["w"]) for i, (s, d) in got.items()} == {
        i: ("shard-a" if i < 50 else "shard-b", 2 * i) for i in range(0, 100, 10)}
    r = c.update_one({"k": 200}, [{"$set": {"z": 1}}], upsert=True)
    assert r.upserted_id is not None
    before = placement(cluster)
    refused = [
        lambda: c.update_one({"k": 10}, [{"$set": {"k": 99}}]),
        lambda: c.update_one({"_id": 10}, [{"$unset": "k"}]),
        lambda: c.update_many({}, [{"$set": {"k": {"$add": ["$k", 1]}}}]),
        lambda: c.update_one({"k": 20}, [{"$replaceWith": {"k": 21}}]),
        lambda: c.update_one({"k": 300}, [{"$set": {"k": 301}}], upsert=True),
        lambda: c.find_one_and_update({"k": 30}, [{"$set": {"k": 70}}]),
    ]
    for op in refused:
        with pytest.raises(OperationFailure) as e:
            op()
        assert e.value.code == 66, e.value.details
        assert "shard key" in str(e.value)
    assert placement(cluster) == before
    # a pipeline that writes the key's own value keeps it: allowed
    r = c.update_one({"k": 40}, [{"$set": {"k": "$k", "t": 1}}])
    assert r.modified_count == 1
    assert placement(cluster)[40] == ("shard-a", {"_id": 40, "k": 40, "w": 80, "t": 1})
