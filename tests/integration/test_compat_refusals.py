"""docs/compat.md's refusal table is true: every row's example is refused with the row's code and
message by a shard, and through a proxy to an unsharded and to a sharded collection (issue #20:
whatever is not supported is refused clearly, never accepted and ignored); the proxy refuses
stripedb's internal `$stripedb*` fields from clients.

The CRUD spec runner (crud_unified.py) reports a spec test that fails only on one of these
refusals as skipped with the row's feature; this file keeps the table honest.
"""
import copy

import pymongo
import pytest
from pymongo.errors import OperationFailure

import crud_unified
from proxy_helpers import ProxyCluster

ROWS = crud_unified.REFUSALS


def _ids(rows):
    return [r["feature"].split("(")[0].strip()[:40] for r in rows]


def _check(db, row, coll=None):
    cmd = copy.deepcopy(row["example"])
    first = next(iter(cmd))
    if coll is not None and isinstance(cmd[first], str):
        cmd[first] = coll
    try:
        reply = db.command(cmd)
    except OperationFailure as e:
        code, msg, details = e.code, str(e), e.details
    else:  # a statement's refusal is a writeError of an ok: 1 reply, as mongod answers
        assert reply.get("writeErrors"), (row["feature"], "accepted", reply)
        w = reply["writeErrors"][0]
        code, msg, details = w["code"], w["errmsg"], reply
        assert reply.get("n", 0) == 0 and reply.get("nModified", 0) == 0, reply
    assert code == row["code"], (row["feature"], details)
    assert row["fragment"] in msg, (row["feature"], details)


def test_the_table_has_rows():
    # the parser found the table (a row leaves it when its feature is built: 7 remain)
    assert len(ROWS) >= 7
    # MongoDB's codes for a refusal: BadValue, IllegalOperation, CommandNotFound (a
    # command not built), CannotCreateIndex, InvalidOptions (a read concern level),
    # InvalidPipelineOperator (an expression operator not built), NotImplemented, unknown
    # field
    assert {r["code"] for r in ROWS} <= {2, 20, 59, 67, 72, 168, 238, 40415}




@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_refused_by_a_shard(shard, row):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.compat
    db.c.insert_many([{"_id": 1, "x": "ping", "a": 1}, {"_id": 2, "x": "PING", "a": 2}])
    _check(db, row)
    # nothing was changed by a refused write
    assert sorted(d["_id"] for d in db.c.find({"a": {"$in": [1, 2]}})) == [1, 2]
    assert db.c.count_documents({"a": 1}) == 1
    c.close()


def test_refused_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("compat.s", {"_id": 1}, split_points=[{"_id": 2}])
        db = cl.proxy_client(0).compat
        for coll in ("c", "s"):  # unsharded, sharded over two shards
            db[coll].insert_many([{"_id": 1, "x": "ping", "a": 1},
                                  {"_id": 2, "x": "PING", "a": 2}])
            for row in ROWS:
                _check(db, row, coll)
            assert db[coll].count_documents({"a": 1}) == 1
            assert sorted(d["x"] for d in db[coll].find({})) == ["PING", "ping"]
            # the fields the coordinator and the proxy send to shards are never a client's:
            # a write tagged as a migration's, or carrying a session record, is refused
            for field, value in (("$stripedbOrigin", "mig-x"),
                                 ("$stripedbSession", {"stmtId": 0}),
                                 ("$stripedbShardVersion", {"v": 1})):
                with pytest.raises(OperationFailure) as ei:
                    db.command({"update": coll, "updates": [{"q": {"_id": 1},
                                                             "u": {"$set": {"a": 9}}}],
                                field: value})
                assert ei.value.code == 2 and "internal to stripedb" in str(ei.value)
            assert db[coll].count_documents({"a": 9}) == 0
    finally:
        cl.close()


def test_simple_collation_is_accepted(shard):
    """{locale: "simple"} is the binary comparison stripedb does: accepted, honoured."""
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    c.compat.c.insert_many([{"_id": 1, "x": "ping"}, {"_id": 2, "x": "PING"}])
    got = c.compat.command({"find": "c", "filter": {"x": "PING"},
                            "collation": {"locale": "simple"}})["cursor"]["firstBatch"]
    assert got == [{"_id": 2, "x": "PING"}]
    c.close()
