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


# ---- the API parameters (MongoDB 6.0 initialize_api_parameters.cpp) ----

API_REFUSED = [
    # (command, code): 322 APIVersionError, 4886600 strict/deprecation without a version,
    # 14 a parameter of the wrong type, 323 APIStrictError for a command outside Version 1
    ({"find": "C", "apiVersion": "2"}, 322),
    ({"find": "C", "apiVersion": "0"}, 322),
    ({"find": "C", "apiStrict": True}, 4886600),
    ({"find": "C", "apiStrict": False}, 4886600),
    ({"find": "C", "apiDeprecationErrors": True}, 4886600),
    ({"find": "C", "apiVersion": 1}, 14),
    ({"find": "C", "apiVersion": "1", "apiStrict": 1}, 14),
    ({"find": "C", "apiVersion": "1", "apiDeprecationErrors": "yes"}, 14),
    ({"collStats": "C", "apiVersion": "1", "apiStrict": True}, 323),
    ({"dbStats": 1, "apiVersion": "1", "apiStrict": True}, 323),
    ({"insert": "C", "documents": [{"_id": 50}], "apiVersion": "2"}, 322),
    ({"ping": 1, "apiVersion": "3"}, 322),
]


def _check_api(client, coll):
    db = client.strictapi
    db[coll].insert_one({"_id": 1})
    for cmd, want in API_REFUSED:
        cmd = dict(cmd)
        first = next(iter(cmd))
        if isinstance(cmd[first], str):
            cmd[first] = coll
        code, msg = _code(db, cmd)
        assert code == want, (cmd, code, msg)
    # nothing written by the refused insert
    assert db[coll].count_documents({"_id": 50}) == 0
    # what Version 1 allows passes: the version alone, strict on a Version 1 command,
    # apiStrict: false on any command
    for cmd in [
        {"find": coll, "apiVersion": "1"},
        {"find": coll, "apiVersion": "1", "apiStrict": True, "apiDeprecationErrors": True},
        {"collStats": coll, "apiVersion": "1"},
        {"collStats": coll, "apiVersion": "1", "apiStrict": False},
        {"ping": 1, "apiVersion": "1", "apiStrict": True},
    ]:
        code, reply = _code(db, cmd)
        assert code is None, (cmd, code, reply)
    assert db.command({"find": coll, "apiVersion": "1", "apiStrict": True})[
        "cursor"]["firstBatch"] == [{"_id": 1}]


def _check_server_api_client(client, coll):
    """What a driver configured with a strict server API sends (apiVersion and apiStrict on
    every command, the handshake included; pymongo 3.11 has no ServerApi, so sent here by
    hand) works: CRUD, cursors, indexes, listings, a sharded collection's scatter-gather;
    a command outside Version 1 is refused with 323."""
    db = client.strictapi
    api = {"apiVersion": "1", "apiStrict": True, "apiDeprecationErrors": True}

    def run(cmd, d=db):
        cmd = dict(cmd)
        cmd.update(api)
        return d.command(cmd)

    assert run({"hello": 1})["ok"] == 1
    assert run({"insert": coll, "documents": [{"_id": i, "k": i} for i in range(10, 20)]})[
        "n"] == 10
    assert run({"update": coll, "updates": [{"q": {"_id": 10}, "u": {"$set": {"x": 1}}}]})[
        "nModified"] == 1
    assert run({"delete": coll, "deletes": [{"q": {"_id": 11}, "limit": 1}]})["n"] == 1
    assert run({"findAndModify": coll, "query": {"_id": 12}, "update": {"$set": {"x": 2}},
                "new": True})["value"] == {"_id": 12, "k": 12, "x": 2}
    r = run({"find": coll, "filter": {"_id": {"$gte": 10}}, "sort": {"_id": 1},
             "batchSize": 2})
    got = [d["_id"] for d in r["cursor"]["firstBatch"]]
    cid = r["cursor"]["id"]
    r = run({"getMore": cid, "collection": coll, "batchSize": 3})
    got += [d["_id"] for d in r["cursor"]["nextBatch"]]
    assert got == [10, 12, 13, 14, 15], got
    r = run({"killCursors": coll, "cursors": [r["cursor"]["id"]]})
    assert r["cursorsKilled"] == [cid], r
    assert run({"count": coll, "query": {"_id": {"$gte": 10}}})["n"] == 9
    r = run({"aggregate": coll, "pipeline": [{"$match": {"_id": {"$gte": 10}}}],
             "cursor": {}})
    assert len(r["cursor"]["firstBatch"]) == 9
    run({"createIndexes": coll, "indexes": [{"key": {"k": 1}, "name": "k_1"}]})
    names = [i["name"] for i in run({"listIndexes": coll})["cursor"]["firstBatch"]]
    assert "k_1" in names, names
    run({"dropIndexes": coll, "index": "k_1"})
    names = [c["name"] for c in run({"listCollections": 1, "nameOnly": True})["cursor"][
        "firstBatch"]]
    assert coll in names, names
    dbs = [d["name"] for d in run({"listDatabases": 1}, client.admin)["databases"]]
    assert "strictapi" in dbs, dbs
    assert "queryPlanner" in run({"explain": {"find": coll, "filter": {"_id": 13}},
                                  "verbosity": "queryPlanner"})
    assert run({"ping": 1})["ok"] == 1
    with pytest.raises(OperationFailure) as e:
        run({"collStats": coll})
    assert e.value.code == 323, e.value
    assert "the command collStats is not in API Version 1" in str(e.value)


def test_api_params_shard(shard):
    _, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    c = pymongo.MongoClient(uri)
    _check_api(c, "a")
    _check_server_api_client(c, "b")
    c.close()


def test_api_params_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("strictapi.s", {"_id": 1}, split_points=[{"_id": 15}])
        c = cl.proxy_client(0)
        _check_api(c, "a")  # unsharded
        _check_api(c, "s")  # sharded over two shards
        _check_server_api_client(c, "b")
        _check_server_api_client(c, "s")
    finally:
        cl.close()


# ---- strict parsing of the catalog and cursor commands (their 6.0 IDL: strict: true) ----

def _check_strict_catalog(client, coll):
    db = client.strictcat
    db[coll].insert_many([{"_id": i, "a": i} for i in range(1, 6)])
    db[coll].create_index("a")
    db.scratch.insert_one({"_id": 1})
    client.strictgone.x.insert_one({"_id": 1})
    unknown = [
        (db, {"createIndexes": coll, "indexes": [{"key": {"b": 1}, "name": "b_1"}],
              "bogus": 1}),
        (db, {"dropIndexes": coll, "index": "a_1", "bogus": 1}),
        (db, {"drop": "scratch", "bogus": 1}),
        (client.strictgone, {"dropDatabase": 1, "bogus": 1}),
        (db, {"listIndexes": coll, "bogus": 1}),
        (db, {"listCollections": 1, "bogus": 1}),
        (client.admin, {"listDatabases": 1, "bogus": 1}),
        (db, {"killCursors": coll, "cursors": [], "bogus": 1}),
        (db, {"explain": {"find": coll, "filter": {}}, "bogus": 1}),
    ]
    unknown.append((db, {"deleteIndexes": coll, "index": "a_1", "bogus": 1}))
    for d, cmd in unknown:
        code, msg = _code(d, cmd)
        first = next(iter(cmd))
        assert code == 40415, (cmd, code, msg)
        assert f"BSON field '{first}.bogus' is an unknown field." in msg, msg
    # nothing was done by the refused commands
    assert set(db[coll].index_information()) == {"_id_", "a_1"}
    assert "scratch" in db.list_collection_names()
    assert "strictgone" in client.list_database_names()
    # explain's verbosity: an enum (explain_verbosity.idl): 2 BadValue, 14 for a non-string
    code, msg = _code(db, {"explain": {"find": coll}, "verbosity": "bogus"})
    assert code == 2, (code, msg)
    assert "Enumeration value 'bogus' for field 'explain.verbosity' is not a valid value." \
        in msg, msg
    code, msg = _code(db, {"explain": {"find": coll}, "verbosity": 5})
    assert code == 14, (code, msg)
    # the fields the IDL defines, and the generic ones drivers send, still pass
    for d, cmd in [
        (db, {"listCollections": 1, "filter": {"name": coll}, "nameOnly": True,
              "authorizedCollections": False, "cursor": {}, "comment": "x", "maxTimeMS": 5000}),
        (client.admin, {"listDatabases": 1, "nameOnly": True, "filter": {},
                        "authorizedDatabases": False, "comment": "x"}),
        (db, {"listIndexes": coll, "cursor": {"batchSize": 1}, "comment": "x"}),
        (db, {"explain": {"find": coll, "filter": {"a": 1}}, "verbosity": "queryPlanner",
              "comment": "x"}),
        (db, {"killCursors": coll, "cursors": [], "comment": "x"}),
        (db, {"createIndexes": coll, "indexes": [{"key": {"b": 1}, "name": "b_1"}],
              "comment": "x", "writeConcern": {"w": 1}}),
        (db, {"dropIndexes": coll, "index": "b_1", "comment": "x"}),
        (db, {"createIndexes": coll, "indexes": [{"key": {"c": 1}, "name": "c_1"}]}),
        (db, {"deleteIndexes": coll, "index": "c_1"}),  # dropIndexes' alias
        (db, {"drop": "scratch", "comment": "x", "writeConcern": {"w": 1}}),
        (client.strictgone, {"dropDatabase": 1, "comment": "x"}),
    ]:
        code, reply = _code(d, cmd)
        assert code is None, (cmd, code, reply)
    assert "scratch" not in db.list_collection_names()
    assert "strictgone" not in client.list_database_names()
    assert set(db[coll].index_information()) == {"_id_", "a_1"}


def test_strict_catalog_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    _check_strict_catalog(c, "c")
    c.close()


def test_strict_catalog_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("strictcat.s", {"_id": 1}, split_points=[{"_id": 3}])
        c = cl.proxy_client(0)
        _check_strict_catalog(c, "c")  # unsharded
        _check_strict_catalog(c, "s")  # sharded over two shards
    finally:
        cl.close()


# ---- fields MongoDB 6.0 does not have, or does not take from a client ----

def _check_not_in_6_0(db, coll, proxy):
    db[coll].insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    refused = [
        # MongoDB 7.0 and later only: 40415 on 6.0
        ({"find": coll, "includeQueryStatsMetrics": True}, 40415),
        ({"aggregate": coll, "pipeline": [], "cursor": {}, "includeQueryStatsMetrics": True},
         40415),
        ({"aggregate": coll, "pipeline": [], "cursor": {}, "fromRouter": True}, 40415),
        ({"aggregate": coll, "pipeline": [], "cursor": {}, "$_needsMerge": True}, 40415),
        ({"distinct": coll, "key": "a", "sampleId": 1}, 40415),
        ({"update": coll, "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 9}},
                                       "sampleId": 1}]}, 40415),
        ({"delete": coll, "deletes": [{"q": {"_id": 1}, "limit": 1, "sampleId": 1}]}, 40415),
        # known to 6.0, not honoured by stripedb: refused, not ignored
        ({"find": coll, "encryptionInformation": {"type": 1}}, 238),
        ({"insert": coll, "documents": [{"_id": 7}], "encryptionInformation": {"type": 1}},
         238),
        ({"insert": coll, "documents": [{"_id": 7}], "isTimeseriesNamespace": True}, 238),
    ]
    if proxy:  # as mongos (cluster_aggregate.cpp)
        refused += [
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "exchange": {}}, 51028),
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "runtimeConstants": {}},
             51143),
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "fromMongos": True}, 51089),
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "needsMerge": True}, 51089),
        ]
    else:  # a shard never answers in the merge format
        refused += [
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "exchange": {}}, 238),
            ({"aggregate": coll, "pipeline": [], "cursor": {}, "needsMerge": True,
              "fromMongos": True}, 238),
        ]
    for cmd, want in refused:
        code, msg = _code(db, cmd)
        assert code == want, (cmd, code, msg)
    # nothing done by the refused writes
    assert sorted((d["_id"], d["a"]) for d in db[coll].find()) == [(1, 1), (2, 2)]
    assert db[coll].count_documents({"_id": 7}) == 0
    # isTimeseriesNamespace: false asks nothing
    assert db.command({"insert": coll, "documents": [{"_id": 8}],
                       "isTimeseriesNamespace": False})["n"] == 1


def test_not_in_6_0_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    _check_not_in_6_0(c.strict6, "c", proxy=False)
    c.close()


def test_not_in_6_0_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("strict6.s", {"_id": 1}, split_points=[{"_id": 2}])
        db = cl.proxy_client(0).strict6
        _check_not_in_6_0(db, "c", proxy=True)  # unsharded
        _check_not_in_6_0(db, "s", proxy=True)  # sharded over two shards
    finally:
        cl.close()
