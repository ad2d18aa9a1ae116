"""`let` variables and update constants `c` (issue #20, MongoDB 5.0), and `$documents`, on a
shard and through a proxy to an unsharded and to a sharded collection: each value is
evaluated once before any document is read, and $$name reads it in $expr filters, pipeline
stages, find projections and pipeline updates. What MongoDB refuses is refused with its
code."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster


def _err(db, cmd):
    try:
        reply = db.command(cmd)
    except OperationFailure as e:
        return e.code, str(e)
    if reply.get("writeErrors"):
        return reply["writeErrors"][0]["code"], reply["writeErrors"][0]["errmsg"]
    raise AssertionError(("accepted", cmd, reply))


def _check(db, coll):
    db[coll].insert_many([{"_id": i, "a": i} for i in range(6)])

    # find: $expr filter, a path into a document variable, a computed projection
    got = db.command({"find": coll, "filter": {"$expr": {"$gte": ["$a", "$$lo"]}},
                      "sort": {"_id": 1}, "let": {"lo": {"$add": [2, 2]}}})
    assert [d["_id"] for d in got["cursor"]["firstBatch"]] == [4, 5]
    got = db.command({"find": coll, "filter": {"$expr": {"$eq": ["$a", "$$v.k"]}},
                      "let": {"v": {"k": 2}}})
    assert [d["_id"] for d in got["cursor"]["firstBatch"]] == [2]
    got = db.command({"find": coll, "filter": {"_id": 1},
                      "projection": {"_id": 0, "x": "$$lo", "a": 1}, "let": {"lo": "L"}})
    assert got["cursor"]["firstBatch"] == [{"a": 1, "x": "L"}]

    # aggregate: $match $expr (pushed down to the shards) and a stage after it (on the proxy
    # for a sharded collection)
    got = db.command({"aggregate": coll, "cursor": {}, "let": {"hi": 3}, "pipeline": [
        {"$match": {"$expr": {"$lt": ["$a", "$$hi"]}}}, {"$sort": {"_id": 1}},
        {"$addFields": {"t": {"$multiply": ["$a", "$$hi"]}}}]})["cursor"]["firstBatch"]
    assert [(d["_id"], d["t"]) for d in got] == [(0, 0), (1, 3), (2, 6)]

    # update: q reads let; a pipeline update reads let and the statement's constants
    r = db.command({"update": coll, "updates": [
        {"q": {"$expr": {"$eq": ["$a", "$$t"]}},
         "u": [{"$set": {"b": "$$nb", "c": "$$cc", "both": "$$same"}}],
         "c": {"cc": "C", "same": "from c"}}],
        "let": {"t": 1, "nb": "B", "same": "from let"}})
    assert r["n"] == 1 and r["nModified"] == 1, r
    assert db[coll].find_one({"_id": 1}) == {"_id": 1, "a": 1, "b": "B", "c": "C",
                                             "both": "from c"}
    # c holds constants, not expressions (mongod's PipelineExecutor): "$a" is that string
    r = db.command({"update": coll, "updates": [
        {"q": {"_id": 1}, "u": [{"$set": {"lit": "$$p"}}, {"$unset": "lit2"}],
         "c": {"p": "$a"}}]})
    assert r["n"] == 1, r
    assert db[coll].find_one({"_id": 1})["lit"] == "$a"
    db[coll].update_one({"_id": 1}, {"$unset": {"lit": ""}})
    # update_many with let (a multi-document write)
    # (raw commands: Debian's pymongo 3.11 has no let= keyword)
    r = db.command({"update": coll, "let": {"lo": 4}, "updates": [
        {"q": {"$expr": {"$gte": ["$a", "$$lo"]}}, "u": {"$set": {"hi": True}},
         "multi": True}]})
    assert r["nModified"] == 2, r
    assert sorted(d["_id"] for d in db[coll].find({"hi": True})) == [4, 5]

    # findAndModify
    doc = db.command({"findAndModify": coll, "query": {"$expr": {"$eq": ["$a", "$$t"]}},
                      "update": [{"$set": {"fm": "$$t"}}], "new": True,
                      "let": {"t": 3}})["value"]
    assert doc == {"_id": 3, "a": 3, "fm": 3}

    # delete
    r = db.command({"delete": coll, "let": {"t": 0}, "deletes": [
        {"q": {"$expr": {"$eq": ["$a", "$$t"]}}, "limit": 1}]})
    assert r["n"] == 1, r
    assert db[coll].count_documents({"_id": 0}) == 0

    # refused, nothing changed
    before = sorted(db[coll].find(), key=lambda d: d["_id"])
    for cmd, code in (
        ({"find": coll, "filter": {}, "let": {"Bad": 1}}, 16867),
        ({"find": coll, "filter": {}, "let": {"a-b": 1}}, 16868),
        ({"find": coll, "filter": {}, "let": {"v": "$a"}}, 4890500),
        ({"find": coll, "filter": {}, "let": 5}, 14),
        ({"find": coll, "filter": {"$expr": {"$eq": ["$a", "$$nope"]}}, "let": {"t": 1}},
         17276),
        ({"count": coll, "query": {}, "let": {"t": 1}}, 40415),
        ({"update": coll, "updates": [{"q": {"_id": 2}, "u": {"$set": {"z": 1}},
                                       "c": {"k": 1}}]}, 51198),
        ({"update": coll, "updates": [{"q": {"_id": 2}, "u": [{"$set": {"z": "$$k"}}],
                                       "c": {"K": 1}}]}, 16867),
        ({"delete": coll, "deletes": [{"q": {"$expr": {"$eq": ["$a", "$$t"]}}, "limit": 0}],
          "let": {"t": "$a"}}, 4890500),
    ):
        code_got, msg = _err(db, cmd)
        assert code_got == code, (cmd, code_got, msg)
    assert sorted(db[coll].find(), key=lambda d: d["_id"]) == before


def _check_documents(db):
    """$documents (a database-level aggregate), reading let."""
    got = db.command({"aggregate": 1, "cursor": {}, "let": {"k": 10}, "pipeline": [
        {"$documents": [{"a": 1}, {"a": 2}, {"a": 3}]},
        {"$match": {"a": {"$gte": 2}}},
        {"$addFields": {"b": {"$multiply": ["$a", "$$k"]}}}]})["cursor"]["firstBatch"]
    assert got == [{"a": 2, "b": 20}, {"a": 3, "b": 30}]
    got = db.command({"aggregate": 1, "cursor": {}, "let": {"docs": [{"x": 1}, {"x": 2}]},
                      "pipeline": [{"$documents": "$$docs"}, {"$count": "n"}]})
    assert got["cursor"]["firstBatch"] == [{"n": 2}]
    for cmd, code in (
        ({"aggregate": 1, "cursor": {}, "pipeline": [{"$documents": [1, 2]}]}, 40228),
        ({"aggregate": "c", "cursor": {}, "pipeline": [{"$documents": [{"a": 1}]}]}, 73),
        ({"aggregate": 1, "cursor": {}, "pipeline": [{"$match": {}},
                                                     {"$documents": [{"a": 1}]}]}, 40602),
    ):
        code_got, msg = _err(db, cmd)
        assert code_got == code, (cmd, code_got, msg)


def test_let_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    _check(c.letdb, "c")
    _check_documents(c.letdb)
    c.close()


def test_let_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("letdb.s", {"_id": 1}, split_points=[{"_id": 3}])
        db = cl.proxy_client(0).letdb
        _check(db, "c")  # unsharded
        _check(db, "s")  # sharded over two shards
        _check_documents(db)
    finally:
        cl.close()
