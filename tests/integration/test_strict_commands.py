"""Strict command parsing (issue #20): what MongoDB refuses is refused, never accepted and
ignored, by a shard and through a proxy to an unsharded and to a sharded collection.

- An unknown top-level field of find, aggregate, count, distinct, insert, update, delete,
  findAndModify and getMore, or an unknown field of an update/delete statement: 40415
  "BSON field '<cmd>.<field>' is an unknown field.", nothing executed; the generic
  arguments drivers send (comment, maxTimeMS, readConcern, writeConcern, lsid ...) pass.
- An _id holding a $-prefixed field name at any depth: 52 DollarPrefixedFieldName "_id
  fields may not contain '$'-prefixed fields: $a is not valid for storage.", on insert and
  on the document an upsert inserts; a DBRef _id ($ref/$id) is valid, as on mongod.
- `create` options stripedb does not honour (capped, storageEngine ...): 238; a bad
  validator or validation option: mongod's error (tests/integration/test_validation.py);
  an option create does not know: 40415; nothing created.
- A writeConcern on a command that never writes (find, count, distinct, getMore, an
  aggregate without $out/$merge, ping ...): 72 InvalidOptions "Command does not support
  writeConcern", as mongod and mongos; writes and $out/$merge aggregates take one.
"""
import pymongo
import pytest
from bson import DBRef
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster


def _code(db, cmd):
    """The error code db answers cmd with (the first writeError's for a write that is
    answered ok: 1), or None when it was accepted."""
    try:
        reply = db.command(cmd)
    except OperationFailure as e:
        return e.code, str(e)
    if reply.get("writeErrors"):
        w = reply["writeErrors"][0]
        return w["code"], w["errmsg"]
    return None, reply


UNKNOWN = [
    {"find": "C", "filter": {}, "bogus": 1},
    {"aggregate": "C", "pipeline": [], "cursor": {}, "bogus": 1},
    {"count": "C", "query": {}, "bogus": 1},
    {"distinct": "C", "key": "a", "bogus": 1},
    {"insert": "C", "documents": [{"_id": 100}], "bogus": 1},
    {"update": "C", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 9}}}], "bogus": 1},
    {"update": "C", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 9}}, "bogus": 1}]},
    {"delete": "C", "deletes": [{"q": {"_id": 1}, "limit": 1}], "bogus": 1},
    {"delete": "C", "deletes": [{"q": {"_id": 1}, "limit": 1, "bogus": 1}]},
    {"findAndModify": "C", "query": {"_id": 1}, "update": {"$set": {"a": 9}}, "bogus": 1},
]


def _check_strict(db, coll):
    db[coll].insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    for cmd in UNKNOWN:
        cmd = dict(cmd)
        first = next(iter(cmd))
        cmd[first] = coll
        code, msg = _code(db, cmd)
        assert code == 40415, (cmd, code, msg)
        assert "is an unknown field" in msg and "bogus" in msg, msg
    # nothing of the refused writes happened
    assert sorted((d["_id"], d["a"]) for d in db[coll].find()) == [(1, 1), (2, 2)]
    # getMore: an unknown field refused, the cursor still usable
    reply = db.command({"find": coll, "filter": {}, "batchSize": 1, "sort": {"_id": 1}})
    cid = reply["cursor"]["id"]
    assert cid != 0
    code, msg = _code(db, {"getMore": cid, "collection": coll, "bogus": 1})
    assert code == 40415, msg
    more = db.command({"getMore": cid, "collection": coll})["cursor"]["nextBatch"]
    assert [d["_id"] for d in more] == [2]
    # the generic arguments drivers send pass
    got = db.command({"find": coll, "filter": {"_id": 1}, "comment": "c", "maxTimeMS": 5000,
                      "readConcern": {"level": "local"}, "batchSize": 10, "singleBatch": True,
                      "apiVersion": "1"})
    assert got["cursor"]["firstBatch"] == [{"_id": 1, "a": 1}]
    assert db[coll].count_documents({}, comment="x", maxTimeMS=5000) == 2


WC_REFUSED = [
    {"find": "C", "filter": {}},
    {"count": "C", "query": {}},
    {"distinct": "C", "key": "a"},
    {"aggregate": "C", "pipeline": [{"$match": {}}], "cursor": {}},
    {"listIndexes": "C"},
    {"listCollections": 1},
    {"ping": 1},
    # explain never takes one of its own, whatever it explains (explain_cmd.cpp)
    {"explain": {"find": "C", "filter": {}}},
    {"explain": {"delete": "C", "deletes": [{"q": {"a": 1}, "limit": 1}]}},
]


def _check_wc_on_reads(db, coll):
    db[coll].insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    for wc in ({"w": 1}, {}, {"w": "majority"}):
        for cmd in WC_REFUSED:
            cmd = dict(cmd)
            first = next(iter(cmd))
            if cmd[first] == "C":
                cmd[first] = coll
            elif first == "explain":
                inner = dict(cmd["explain"])
                inner[next(iter(inner))] = coll
                cmd["explain"] = inner
            cmd["writeConcern"] = wc
            code, msg = _code(db, cmd)
            assert code == 72, (cmd, code, msg)
            assert msg.startswith("Command does not support writeConcern"), msg
    assert db[coll].count_documents({}) == 2  # the explained delete did not run
    # a writeConcern inside the explained command is not looked at (mongod checks only the
    # explain's own; the inner parser takes it as a generic argument), whatever it explains
    for inner in ({"find": coll, "filter": {}},
                  {"delete": coll, "deletes": [{"q": {"a": 1}, "limit": 1}]},
                  {"aggregate": coll, "pipeline": [{"$match": {}}], "cursor": {}},
                  {"aggregate": coll, "pipeline": [{"$out": coll + "_o"}], "cursor": {}}):
        inner = dict(inner, writeConcern={"w": 1})
        assert db.command({"explain": inner})["ok"] == 1, inner
    assert db[coll].count_documents({}) == 2  # nothing ran
    assert coll + "_o" not in db.list_collection_names()
    # any writeConcern, not parsed first (mongod: commands_that_do_not_write_do_not_accept_wc.js)
    assert _code(db, {"find": coll, "writeConcern": {"w": []}})[0] == 72
    assert _code(db, {"count": coll, "writeConcern": {"w": "invalid"}})[0] == 72
    assert _code(db, {"getLog": "global", "writeConcern": {"w": 1}})[0] == 72
    cid = db.command({"find": coll, "filter": {}, "batchSize": 1})["cursor"]["id"]
    code, msg = _code(db, {"getMore": cid, "collection": coll, "writeConcern": {"w": 1}})
    assert code == 72, msg
    # what writes takes one: a write, an aggregate with $out
    db.command({"insert": coll, "documents": [{"_id": 3, "a": 3}], "writeConcern": {"w": 1}})
    db.command({"aggregate": coll, "pipeline": [{"$match": {"a": {"$gte": 2}}},
                                                {"$out": coll + "_out"}],
                "cursor": {}, "writeConcern": {"w": 1}})
    assert sorted(d["_id"] for d in db[coll + "_out"].find()) == [2, 3]
    # and a driver's ordinary reads send none
    assert db[coll].count_documents({}) == 3
    assert sorted(db[coll].distinct("a")) == [1, 2, 3]


def _check_ids(db, coll):
    for cmd in (
        {"insert": coll, "documents": [{"_id": {"$a": 1}}]},
        {"insert": coll, "documents": [{"_id": {"x": [{"$b": 1}]}, "k": 3}]},
        {"update": coll, "updates": [{"q": {"k": 4}, "u": {"_id": {"$a": 1}, "k": 4},
                                      "upsert": True}]},
        {"findAndModify": coll, "query": {"k": 5}, "update": {"_id": {"$a": 1}, "k": 5},
         "upsert": True},
    ):
        code, msg = _code(db, cmd)
        assert code == 52, (cmd, code, msg)
        assert "_id fields may not contain '$'-prefixed fields" in msg
        assert "is not valid for storage." in msg
    assert db[coll].count_documents({"k": {"$in": [3, 4, 5]}}) == 0
    assert db[coll].count_documents({"_id": {"$type": "object"}}) == 0
    # valid: a DBRef _id, dotted and $-containing (not prefixed) names inside _id
    db[coll].insert_one({"_id": DBRef("c", 7)})
    # (raw: pymongo's insert_one refuses dotted keys before sending)
    assert db.command({"insert": coll, "documents": [{"_id": {"a.b": 1, "c$": 2}}]})["n"] == 1
    assert db[coll].count_documents({"_id": {"$type": "object"}}) == 2


def _check_create(db):
    for opts, code, frag in (
        ({"validator": {"$foo": 1}}, 2, "Parsing of collection validator failed"),
        ({"validationLevel": "sometimes"}, 2, "Enumeration value 'sometimes'"),
        ({"capped": True, "size": 4096}, 238, "capped collections"),
        ({"storageEngine": {"wiredTiger": {}}}, 238, "storage engine options"),
        ({"indexOptionDefaults": {}}, 238, "index option defaults"),
        ({"expireAfterSeconds": 5}, 238, "clustered collections"),
        ({"bogus": 1}, 40415, "BSON field 'create.bogus' is an unknown field."),
    ):
        got, msg = _code(db, {"create": "newc", **opts})
        assert got == code, (opts, got, msg)
        assert frag in msg, msg
    assert "newc" not in db.list_collection_names()
    # what create honours still works: capped: false, a view
    db.command({"create": "newc", "capped": False})
    assert "newc" in db.list_collection_names()


def test_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.strict
    _check_strict(db, "c")
    _check_ids(db, "i")
    _check_create(db)
    _check_wc_on_reads(db, "w")
    c.close()


def test_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("strict.s", {"_id": 1}, split_points=[{"_id": 2}])
        cl.shard_collection("strict.si", {"k": 1}, split_points=[{"k": 4}])
        db = cl.proxy_client(0).strict
        _check_strict(db, "c")  # unsharded
        _check_strict(db, "s")  # sharded over two shards
        _check_ids(db, "i")
        _check_ids(db, "si")
        _check_create(db)
        _check_wc_on_reads(db, "w")  # unsharded
        cl.shard_collection("strict.ws", {"_id": 1}, split_points=[{"_id": 2}])
        _check_wc_on_reads(db, "ws")  # sharded
    finally:
        cl.close()
