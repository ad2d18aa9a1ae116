"""Document validation and collMod (issue #20), as mongod 6.0: `create` with validator /
validationLevel / validationAction, enforcement by insert, update, replace, upsert and
findAndModify with 121 DocumentValidationFailure and MongoDB 5.0+'s errInfo
{failingDocumentId, details}, bypassDocumentValidation, $jsonSchema's keywords and parse
errors, collMod of validation options and of an index (hidden, expireAfterSeconds), on a
shard, on a replica set across a failover and a restart, and through a proxy to a sharded
collection."""
import datetime
import signal

import pymongo
import pytest
from pymongo.errors import OperationFailure, WriteError

from conftest import free_port, wait_until
from proxy_helpers import ProxyCluster
from test_shard_replset import direct, primary_index, start_set


def client(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=10000)


def write_fails(fn):
    """Run fn, expect a 121 write error; return its details (errInfo included)."""
    with pytest.raises((WriteError, OperationFailure)) as e:
        fn()
    assert e.value.code == 121, e.value.details
    assert e.value.details["errmsg"] == "Document failed validation"
    return e.value.details


def cmd_fails(db, code, *args, **kw):
    with pytest.raises(OperationFailure) as e:
        db.command(*args, **kw)
    assert e.value.code == code, e.value.details
    return e.value.details["errmsg"]


def test_query_validator_enforced_with_details(shard):
    _, port = shard
    with client(port) as c:
        db = c.v
        db.command("create", "c", validator={"a": {"$gt": 0}, "b": {"$type": "string"}})
        db.c.insert_one({"_id": 1, "a": 1, "b": "x"})
        # insert: one failing clause of two -> $and with that clause
        d = write_fails(lambda: db.c.insert_one({"_id": 2, "a": -1, "b": "y"}))
        assert d["errInfo"]["failingDocumentId"] == 2
        det = d["errInfo"]["details"]
        assert det["operatorName"] == "$and"
        assert det["clausesNotSatisfied"] == [
            {"index": 0, "details": {"operatorName": "$gt", "specifiedAs": {"a": {"$gt": 0}},
                                     "reason": "comparison failed", "consideredValue": -1}}]
        # a missing field, and $type's consideredType
        det = write_fails(lambda: db.c.insert_one({"_id": 3, "b": 5}))["errInfo"]["details"]
        assert [x["details"]["reason"] for x in det["clausesNotSatisfied"]] == \
            ["field was missing", "type did not match"]
        assert det["clausesNotSatisfied"][1]["details"]["consideredType"] == "int"
        # a path through an array: every value reached is considered
        db.command("create", "arr", validator={"x.y": {"$gt": 5}})
        det = write_fails(lambda: db.arr.insert_one({"x": [{"y": 1}, {"y": 2}]}))
        assert det["errInfo"]["details"] == {
            "operatorName": "$gt", "specifiedAs": {"x.y": {"$gt": 5}},
            "reason": "comparison failed", "consideredValues": [1, 2]}
        # an insert batch: the valid documents are written, the invalid one is reported
        with pytest.raises(pymongo.errors.BulkWriteError) as e:
            db.c.insert_many([{"_id": 4, "a": 2, "b": "z"}, {"_id": 5, "a": 0, "b": "z"},
                              {"_id": 6, "a": 3, "b": "z"}], ordered=False)
        errs = e.value.details["writeErrors"]
        assert [(w["index"], w["code"], w["errInfo"]["failingDocumentId"]) for w in errs] == \
            [(1, 121, 5)]
        assert sorted(x["_id"] for x in db.c.find()) == [1, 4, 6]
        # update, replacement, upsert, findAndModify
        d = write_fails(lambda: db.c.update_one({"_id": 1}, {"$set": {"a": -5}}))
        assert d["errInfo"]["failingDocumentId"] == 1
        write_fails(lambda: db.c.replace_one({"_id": 1}, {"a": 1}))
        d = write_fails(lambda: db.c.update_one({"_id": 9}, {"$set": {"a": -1, "b": "q"}},
                                                upsert=True))
        assert d["errInfo"]["failingDocumentId"] == 9
        d = write_fails(lambda: db.c.find_one_and_update({"_id": 1}, {"$set": {"b": 1}}))
        assert d["errInfo"]["failingDocumentId"] == 1
        assert d["errInfo"]["details"]["operatorName"] == "$and"
        write_fails(lambda: db.c.find_one_and_replace({"_id": 1}, {"a": 1}))
        write_fails(lambda: db.c.find_one_and_update({"_id": 10}, {"$set": {"a": 0}},
                                                     upsert=True))
        assert db.c.find_one({"_id": 1}) == {"_id": 1, "a": 1, "b": "x"}
        assert db.c.count_documents({"_id": {"$in": [9, 10]}}) == 0
        # valid writes go through
        db.c.update_one({"_id": 1}, {"$set": {"a": 7}})
        db.c.update_one({"_id": 11}, {"$set": {"a": 1, "b": "u"}}, upsert=True)
        # bypassDocumentValidation on insert, update, findAndModify
        db.c.insert_one({"_id": 20, "a": -1}, bypass_document_validation=True)
        db.c.update_one({"_id": 1}, {"$set": {"a": -1}}, bypass_document_validation=True)
        db.command("findAndModify", "c", query={"_id": 4}, update={"$set": {"b": 0}},
                   bypassDocumentValidation=True)
        assert db.c.find_one({"_id": 20}) == {"_id": 20, "a": -1}
        assert db.c.find_one({"_id": 4})["b"] == 0
        # aggregate accepts the flag (no stage writes through it yet)
        assert len(list(db.c.aggregate([{"$match": {}}], bypassDocumentValidation=True))) == 5
        # listCollections shows the options as given
        (info,) = list(db.list_collections(filter={"name": "c"}))
        assert info["options"] == {"validator": {"a": {"$gt": 0}, "b": {"$type": "string"}}}


def test_levels_actions_and_coll_mod(shard):
    proc, port = shard
    with client(port) as c:
        db = c.v
        db.c.insert_many([{"_id": 1, "a": -1}, {"_id": 2, "a": 1}])
        # collMod adds a validator to an existing collection; strict: any update of an
        # invalid document must leave it valid
        assert db.command("collMod", "c", validator={"a": {"$gte": 0}})["ok"] == 1
        write_fails(lambda: db.c.update_one({"_id": 1}, {"$set": {"x": 1}}))
        write_fails(lambda: db.c.update_one({"_id": 2}, {"$set": {"a": -2}}))
        # moderate: updates of documents that did not match are allowed, valid ones stay so
        db.command("collMod", "c", validationLevel="moderate")
        db.c.update_one({"_id": 1}, {"$set": {"x": 1}})
        write_fails(lambda: db.c.update_one({"_id": 2}, {"$set": {"a": -2}}))
        write_fails(lambda: db.c.insert_one({"_id": 3, "a": -3}))
        # off: nothing is checked
        db.command("collMod", "c", validationLevel="off")
        db.c.insert_one({"_id": 3, "a": -3})
        # warn: logged and written
        db.command("collMod", "c", validationLevel="strict", validationAction="warn",
                   validator={"a": {"$lt": 100}})
        db.c.insert_one({"_id": 4, "a": 500})
        assert db.c.find_one({"_id": 4}) == {"_id": 4, "a": 500}
        wait_until(lambda: "Document would fail validation" in proc.tail(), 10,
                   what="the warning")
        assert "failingDocumentId" in proc.tail()
        db.command("collMod", "c", validationAction="error")
        write_fails(lambda: db.c.insert_one({"_id": 5, "a": 500}))
        (info,) = list(db.list_collections(filter={"name": "c"}))
        assert info["options"] == {"validator": {"a": {"$lt": 100}}, "validationLevel": "strict",
                                   "validationAction": "error"}
        # collMod is in the oplog as mongod's entry
        last = c.local["oplog.rs"].find_one({"op": "c", "o.collMod": "c"},
                                            sort=[("$natural", -1)])
        assert last["ns"] == "v.$cmd" and last["o"] == {"collMod": "c",
                                                         "validationAction": "error"}
        # create's option errors
        assert "Enumeration value 'sometimes'" in cmd_fails(db, 2, "create", "d",
                                                            validationLevel="sometimes")
        cmd_fails(db, 2, "create", "d", validationAction="explode")
        cmd_fails(db, 14, "create", "d", validator=5)
        cmd_fails(db, 14, "create", "d", validationLevel=1)
        assert "Parsing of collection validator failed" in cmd_fails(
            db, 2, "create", "d", validator={"$foo": 1})
        # collMod's errors
        assert cmd_fails(db, 40415, "collMod", "c", bogus=1) == \
            "BSON field 'collMod.bogus' is an unknown field."
        cmd_fails(db, 26, "collMod", "nothere", validator={})
        cmd_fails(db, 72, "collMod", "c", viewOn="x")
        cmd_fails(db, 2, "collMod", "c", validationLevel="never")
        cmd_fails(db, 238, "collMod", "c", changeStreamPreAndPostImages={"enabled": True})
        cmd_fails(db, 72, "create", "vw", viewOn="c", pipeline=[], validator={"a": 1})
        db.command("create", "vw", viewOn="c", pipeline=[])
        cmd_fails(db, 72, "collMod", "vw", validator={"a": 1})
        # a view's pipeline can be changed
        db.command("collMod", "vw", viewOn="c", pipeline=[{"$match": {"_id": 1}}])
        assert [d["_id"] for d in db.vw.find()] == [1]
    # the validator survives a restart
    proc.stop()
    proc.restart()
    proc.wait_healthy()
    with client(port) as c:
        write_fails(lambda: c.v.c.insert_one({"_id": 6, "a": 500}))
        c.v.c.insert_one({"_id": 6, "a": 5})


SCHEMA_CASES = [
    # (schema, a valid document, an invalid one, the failing rule's operatorName)
    ({"required": ["a", "b"]}, {"a": 1, "b": 2}, {"a": 1}, "required"),
    ({"bsonType": "object", "properties": {"a": {"bsonType": ["int", "long"]}}},
     {"a": 1}, {"a": "x"}, "properties"),
    ({"properties": {"a": {"type": "string"}}}, {"a": "s"}, {"a": 1}, "properties"),
    ({"properties": {"n": {"minimum": 1, "maximum": 5, "exclusiveMaximum": True}}},
     {"n": 4}, {"n": 5}, "properties"),
    ({"properties": {"n": {"multipleOf": 3}}}, {"n": 9}, {"n": 10}, "properties"),
    ({"properties": {"s": {"minLength": 2, "maxLength": 3}}}, {"s": "éé"}, {"s": "abcd"},
     "properties"),
    ({"properties": {"s": {"pattern": "^a+$"}}}, {"s": "aaa"}, {"s": "ab"}, "properties"),
    ({"properties": {"e": {"enum": [1, "x", {"k": 1}]}}}, {"e": {"k": 1}}, {"e": 2},
     "properties"),
    ({"properties": {"l": {"items": {"bsonType": "int"}, "minItems": 1, "maxItems": 3,
                           "uniqueItems": True}}}, {"l": [1, 2]}, {"l": [1, 1]},
     "properties"),
    ({"properties": {"l": {"items": [{"bsonType": "int"}], "additionalItems": False}}},
     {"l": [1]}, {"l": [1, 2]}, "properties"),
    ({"properties": {"_id": {}, "a": {}}, "additionalProperties": False}, {"_id": 1, "a": 1},
     {"_id": 1, "a": 1, "z": 1}, "additionalProperties"),
    ({"patternProperties": {"^x": {"bsonType": "int"}}}, {"x1": 1, "y": "s"}, {"x1": "s"},
     "patternProperties"),
    ({"minProperties": 3, "maxProperties": 4}, {"_id": 1, "a": 1, "b": 2}, {"_id": 1},
     "minProperties"),
    ({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1, "b": 1}, {"a": 1},
     "allOf"),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"b": 1}, {"c": 1}, "anyOf"),
    ({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"b": 1}, {"a": 1, "b": 1},
     "oneOf"),
    ({"not": {"required": ["secret"]}}, {"a": 1}, {"secret": 1}, "not"),
    ({"dependencies": {"card": ["address"]}}, {"card": 1, "address": 2}, {"card": 1},
     "dependencies"),
    ({"dependencies": {"card": {"required": ["zip"]}}}, {"card": 1, "zip": 2}, {"card": 1},
     "dependencies"),
    ({"title": "t", "description": "d", "bsonType": "object", "required": ["a"]},
     {"a": 1}, {"b": 1}, "required"),
]


@pytest.mark.parametrize("case", range(len(SCHEMA_CASES)))
def test_json_schema_keywords(shard, case):
    schema, good, bad, op = SCHEMA_CASES[case]
    _, port = shard
    with client(port) as c:
        db = c.v
        db.command("create", "s", validator={"$jsonSchema": schema})
        db.s.insert_one(dict(good))
        d = write_fails(lambda: db.s.insert_one(dict(bad, _id="bad")))
        assert d["errInfo"]["failingDocumentId"] == "bad"
        det = d["errInfo"]["details"]
        assert det["operatorName"] == "$jsonSchema"
        assert [r["operatorName"] for r in det["schemaRulesNotSatisfied"]] == [op], det


def test_json_schema_details_and_parse_errors(shard):
    _, port = shard
    with client(port) as c:
        db = c.v
        db.command("create", "s", validator={"$jsonSchema": {
            "bsonType": "object", "required": ["name", "age"],
            "properties": {"name": {"bsonType": "string", "description": "a string"},
                           "age": {"bsonType": "int", "minimum": 0}}}})
        det = write_fails(lambda: db.s.insert_one({"_id": 1, "name": 5}))["errInfo"]["details"]
        assert det["schemaRulesNotSatisfied"] == [
            {"operatorName": "required", "specifiedAs": {"required": ["name", "age"]},
             "missingProperties": ["age"]},
            {"operatorName": "properties", "propertiesNotSatisfied": [
                {"propertyName": "name", "description": "a string", "details": [
                    {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
                     "reason": "type did not match", "consideredValue": 5,
                     "consideredType": "int"}]}]}]
        # a top-level type other than object matches nothing
        db.command("create", "never", validator={"$jsonSchema": {"bsonType": "array"}})
        write_fails(lambda: db.never.insert_one({}))
        # $jsonSchema beside other clauses and inside $or
        db.command("create", "mix", validator={"$or": [{"$jsonSchema": {"required": ["a"]}},
                                                        {"b": 1}]})
        db.mix.insert_many([{"a": 1}, {"b": 1}])
        det = write_fails(lambda: db.mix.insert_one({"c": 1}))["errInfo"]["details"]
        assert det["operatorName"] == "$or" and len(det["clausesNotSatisfied"]) == 2
        # parse errors, as mongod's json_schema_parser.cpp
        for schema, code, msg in [
                ({"format": "email"}, 9, "$jsonSchema keyword 'format' is not currently supported"),
                ({"$ref": "#"}, 9, "$jsonSchema keyword '$ref' is not currently supported"),
                ({"default": 1}, 9, "$jsonSchema keyword 'default' is not currently supported"),
                ({"frobnicate": 1}, 9, "Unknown $jsonSchema keyword: frobnicate"),
                ({"type": "integer"}, 9, "$jsonSchema type 'integer' is not currently supported."),
                ({"bsonType": "nope"}, 2, "Unknown type name alias: nope"),
                ({"type": "string", "bsonType": "string"}, 9, "Cannot specify both"),
                ({"required": []}, 9, "cannot be an empty array"),
                ({"required": "a"}, 14, "must be an array"),
                ({"minimum": "x"}, 14, "must be a number"),
                ({"exclusiveMinimum": True}, 9, "must be a present if"),
                ({"multipleOf": 0}, 9, "must have a positive value"),
                ({"pattern": "("}, 51091, "Regular expression is invalid"),
                ({"enum": []}, 9, "cannot be an empty array"),
                ({"allOf": []}, 2, "must be a non-empty array"),
                ({"properties": {"a": 1}}, 14, "must be an object"),
                ({"minLength": -1}, 2, "Expected a positive number"),
        ]:
            msg_got = cmd_fails(db, code, "create", "bad", validator={"$jsonSchema": schema})
            assert msg_got.startswith("Parsing of collection validator failed"), msg_got
            assert msg in msg_got, (schema, msg_got)
        cmd_fails(db, 14, "create", "bad", validator={"$jsonSchema": 1})


def test_coll_mod_index_hidden_and_ttl(start_role, tmp_path):
    port = free_port()
    d = tmp_path / "shard"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}",
                "--ttl-monitor-sleep-secs=1"])
    with client(port) as c:
        db = c.v
        db.h.create_index("a")
        db.h.insert_many([{"_id": i, "a": i} for i in range(10)])

        def plan():
            return db.h.find({"a": 3}).explain()["queryPlanner"]["winningPlan"]["stage"]

        assert plan() == "IXSCAN"
        r = db.command("collMod", "h", index={"keyPattern": {"a": 1}, "hidden": True})
        assert (r["hidden_old"], r["hidden_new"]) == (False, True)
        assert plan() == "COLLSCAN"
        specs = {ix["name"]: ix for ix in db.h.list_indexes()}
        assert specs["a_1"]["hidden"] is True
        # a hidden index is not hinted, and is maintained while hidden
        with pytest.raises(OperationFailure):
            list(db.h.find({"a": 3}).hint("a_1"))
        db.h.insert_one({"_id": 100, "a": 100})
        db.h.delete_one({"_id": 3})
        # hiding a hidden index changes nothing (no old/new in the reply)
        r = db.command("collMod", "h", index={"name": "a_1", "hidden": True})
        assert "hidden_new" not in r
        db.command("collMod", "h", index={"name": "a_1", "hidden": False})
        assert plan() == "IXSCAN"
        assert [x["_id"] for x in db.h.find({"a": {"$gte": 99}}).hint("a_1")] == [100]
        assert list(db.h.find({"a": 3}).hint("a_1")) == []
        assert c.admin.command("stripedbCheck")["nProblems"] == 0
        # an index created hidden is maintained and not planned until unhidden
        db.h.create_index("b", hidden=True)
        db.h.insert_one({"_id": 200, "a": 0, "b": 7})
        assert db.h.find({"b": 7}).explain()["queryPlanner"]["winningPlan"]["stage"] == \
            "COLLSCAN"
        db.command("collMod", "h", index={"name": "b_1", "hidden": False})
        assert db.h.find({"b": 7}).explain()["queryPlanner"]["winningPlan"]["stage"] == \
            "IXSCAN"
        assert [x["_id"] for x in db.h.find({"b": 7})] == [200]
        # errors, as coll_mod.cpp
        cmd_fails(db, 72, "collMod", "h", index={"name": "a_1"})
        cmd_fails(db, 72, "collMod", "h", index={"name": "a_1", "keyPattern": {"a": 1},
                                                 "hidden": True})
        cmd_fails(db, 72, "collMod", "h", index={"hidden": True})
        cmd_fails(db, 72, "collMod", "h", index={"name": "a_1", "hidden": 1})
        cmd_fails(db, 72, "collMod", "h", index={"name": "a_1", "expireAfterSeconds": 5})
        cmd_fails(db, 27, "collMod", "h", index={"name": "zz_1", "hidden": True})
        cmd_fails(db, 27, "collMod", "h", index={"keyPattern": {"zz": 1}, "hidden": True})
        cmd_fails(db, 2, "collMod", "h", index={"name": "_id_", "hidden": True})
        cmd_fails(db, 40415, "collMod", "h", index={"name": "a_1", "hidden": True, "x": 1})
        # expireAfterSeconds of a TTL index: a day, then a minute (the monitor uses it)
        now = datetime.datetime.now(datetime.timezone.utc)
        db.t.create_index("at", expireAfterSeconds=86400)
        db.t.insert_many([{"_id": 1, "at": now - datetime.timedelta(hours=1)},
                          {"_id": 2, "at": now}])
        r = db.command("collMod", "t", index={"keyPattern": {"at": 1},
                                              "expireAfterSeconds": 60})
        assert (r["expireAfterSeconds_old"], r["expireAfterSeconds_new"]) == (86400, 60)
        assert {ix["name"]: ix for ix in db.t.list_indexes()}["at_1"]["expireAfterSeconds"] == 60
        wait_until(lambda: [x["_id"] for x in db.t.find()] == [2], 20,
                   what="the TTL monitor using the new expireAfterSeconds")
        oplog = list(c.local["oplog.rs"].find({"op": "c", "o.collMod": {"$exists": True}}))
        assert [e["o"] for e in oplog] == [
            {"collMod": "h", "index": {"keyPattern": {"a": 1}, "hidden": True}},
            {"collMod": "h", "index": {"name": "a_1"}},
            {"collMod": "h", "index": {"name": "a_1", "hidden": False}},
            {"collMod": "h", "index": {"name": "b_1", "hidden": False}},
            {"collMod": "t", "index": {"keyPattern": {"at": 1}, "expireAfterSeconds": 60}}]


def test_replica_set_enforces_after_failover(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        db = c.app
        db.command("create", "c", validator={"$jsonSchema": {"required": ["a"]}})
        db.c.insert_one({"_id": 1, "a": 1})
        write_fails(lambda: db.c.insert_one({"_id": 2}))
        db.command("collMod", "c", validator={"a": {"$type": "int"}})
    old = primary_index(wires)
    procs[old].p.send_signal(signal.SIGKILL)
    procs[old].p.wait(timeout=10)
    wait_until(lambda: primary_index([w for i, w in enumerate(wires) if i != old]) is not None,
               20, interval=0.1, what="a new primary")
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        d = write_fails(lambda: c.app.c.insert_one({"_id": 3, "a": "x"}))
        assert d["errInfo"]["details"]["operatorName"] == "$type"
        c.app.c.insert_one({"_id": 3, "a": 3})
    for i, w in enumerate(wires):
        if i == old:
            continue
        with direct(w) as m:
            (info,) = list(m.app.list_collections(filter={"name": "c"}))
            assert info["options"] == {"validator": {"a": {"$type": "int"}}}
            ops = [e["o"] for e in m.local["oplog.rs"].find({"op": "c", "o.collMod": "c"})]
            assert ops == [{"collMod": "c", "validator": {"a": {"$type": "int"}}}]


def test_through_a_proxy_to_a_sharded_collection(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("pv.c", {"_id": 1}, split_points=[{"_id": 100}])
        db = cl.proxy_client(0).pv
        db.c.insert_many([{"_id": 1, "a": 1}, {"_id": 150, "a": 2}])
        r = db.command("collMod", "c", validator={"a": {"$gte": 0}})
        assert r["ok"] == 1
        for sid in cl.shard_ids:
            (info,) = list(cl.shard_client(sid).pv.list_collections(filter={"name": "c"}))
            assert info["options"] == {"validator": {"a": {"$gte": 0}}}, sid
        for _id in (5, 500):  # one on each shard
            d = write_fails(lambda: db.c.insert_one({"_id": _id, "a": -1}))
            assert d["errInfo"]["failingDocumentId"] == _id
            assert d["errInfo"]["details"]["operatorName"] == "$gte"
        write_fails(lambda: db.c.update_one({"_id": 150}, {"$set": {"a": -1}}))
        write_fails(lambda: db.c.update_many({}, {"$set": {"a": -1}}))
        d = write_fails(lambda: db.c.find_one_and_update({"_id": 1}, {"$set": {"a": -1}}))
        assert d["errInfo"]["failingDocumentId"] == 1
        db.c.insert_one({"_id": 7, "a": -7}, bypass_document_validation=True)
        db.c.update_one({"_id": 150}, {"$set": {"a": -150}}, bypass_document_validation=True)
        assert sorted((x["_id"], x["a"]) for x in db.c.find()) == \
            [(1, 1), (7, -7), (150, -150)]
        db.command("collMod", "c", validationAction="warn")
        db.c.insert_one({"_id": 300, "a": -3})
        assert db.c.count_documents({}) == 4
        # an empty collection that exists on its primary shard only (created by an insert,
        # emptied) given a validator, then sharded through the proxy with chunks on both
        # shards: every shard gets the validator (the proxy copies it with collMod)
        db.h.insert_one({"_id": "tmp"})
        db.h.delete_one({"_id": "tmp"})
        db.command("collMod", "h", validator={"a": {"$type": "int"}})
        assert sum("h" in cl.shard_client(sid).pv.list_collection_names()
                   for sid in cl.shard_ids) == 1
        cl.proxy_client(0).admin.command("shardCollection", "pv.h", key={"_id": "hashed"},
                                         numInitialChunks=4)
        for sid in cl.shard_ids:
            (info,) = list(cl.shard_client(sid).pv.list_collections(filter={"name": "h"}))
            assert info["options"] == {"validator": {"a": {"$type": "int"}}}, sid
        for i in range(20):
            write_fails(lambda: db.h.insert_one({"_id": i, "a": "x"}))
        db.h.insert_many([{"_id": i, "a": i} for i in range(20)])
        assert all(cl.shard_client(sid).pv.h.count_documents({}) > 0 for sid in cl.shard_ids)
    finally:
        cl.close()


def test_validator_travels_with_a_migrated_chunk(start_role, tmp_path):
    """A shard that gets its first chunk of a collection by migration gets the validator too
    (the coordinator's register step copies it with collMod), so every owner enforces it;
    the migration's own writes are not checked (a document inserted with bypass moves)."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "mv.c"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}], shards=["shard-a"])
        db = cl.proxy_client().mv
        db.c.insert_many([{"_id": i, "k": i} for i in range(0, 200, 10)])
        db.command("collMod", "c", validator={"k": {"$type": "int"}},
                   validationLevel="moderate")
        db.c.insert_one({"_id": "odd", "k": 150.5}, bypass_document_validation=True)
        assert "c" not in cl.shard_client("shard-b").mv.list_collection_names()
        (c1,) = [c for c in cl.chunks(ns) if c["min"].get("k") == 100]
        m = cl.wait_migration(cl.migrate(ns, c1["id"], "shard-b", "--grace-ms=200"))
        assert m["state"] == "complete", m
        (info,) = list(cl.shard_client("shard-b").mv.list_collections(filter={"name": "c"}))
        assert info["options"] == {"validator": {"k": {"$type": "int"}},
                                   "validationLevel": "moderate"}
        assert cl.shard_client("shard-b").mv.c.find_one({"_id": "odd"})["k"] == 150.5
        d = write_fails(lambda: db.c.insert_one({"_id": "bad", "k": 170.5}))
        assert d["errInfo"]["failingDocumentId"] == "bad"
        db.c.insert_one({"_id": "good", "k": 171})
    finally:
        cl.close()


def test_large_details_are_truncated(shard):
    """An errInfo over 1 MiB, and the errInfos of a batch past 4 MiB, keep failingDocumentId
    and details.operatorName only, so the reply stays under the BSON limit."""
    _, port = shard
    with client(port) as c:
        db = c.v
        db.command("create", "big", validator={"s": {"$regex": "^a"}})
        d = write_fails(lambda: db.big.insert_one({"_id": 1, "s": "b" * (2 << 20)}))
        assert d["errInfo"] == {"failingDocumentId": 1, "details": {
            "operatorName": "$regex", "reason": "details omitted: the error would be too large"}}
        with pytest.raises(pymongo.errors.BulkWriteError) as e:
            db.big.insert_many([{"_id": i, "s": "b" * (700 << 10)} for i in range(12)],
                               ordered=False)
        errs = e.value.details["writeErrors"]
        assert [w["errInfo"]["failingDocumentId"] for w in errs] == list(range(12))
        assert all(w["errInfo"]["details"]["operatorName"] == "$regex" for w in errs)
        full = [w for w in errs if "consideredValue" in w["errInfo"]["details"]]
        assert 0 < len(full) < 12
        assert db.big.count_documents({}) == 0


def test_a_validator_that_throws_fails_the_document(shard):
    """mongod 6.0 catches an error of the validator's evaluation (a $divide by zero) and
    fails the document with 121 (warn: logs and writes it; moderate: an old document that
    throws counts as invalid, so its update is allowed)."""
    proc, port = shard
    with client(port) as c:
        db = c.v
        db.c.insert_many([{"_id": 1, "x": 0}, {"_id": 2, "x": 1}])
        db.command("collMod", "c", validator={"$expr": {"$gt": [{"$divide": [1, "$x"]}, 0]}})
        d = write_fails(lambda: db.c.insert_one({"_id": 3, "x": 0}))
        assert d["errInfo"]["failingDocumentId"] == 3
        det = d["errInfo"]["details"]
        assert det["reason"] == "failed to evaluate aggregation expression"
        assert det["details"]["code"] != 121
        db.c.insert_one({"_id": 4, "x": 2})
        write_fails(lambda: db.c.update_one({"_id": 1}, {"$set": {"y": 1}}))
        # moderate: the old document throws, so it was invalid: its update is allowed
        db.command("collMod", "c", validationLevel="moderate")
        db.c.update_one({"_id": 1}, {"$set": {"y": 1}})
        write_fails(lambda: db.c.update_one({"_id": 2}, {"$set": {"x": 0}}))
        # warn: logged and written
        db.command("collMod", "c", validationLevel="strict", validationAction="warn")
        db.c.insert_one({"_id": 5, "x": 0})
        assert db.c.find_one({"_id": 5}) == {"_id": 5, "x": 0}
        wait_until(lambda: "failed to evaluate aggregation expression" in proc.tail(), 10,
                   what="the warning")


def test_no_validators_in_internal_databases_nor_on_system_collections(shard):
    """mongod's parseValidator: 72 InvalidOptions for a validator on a collection of admin,
    local or config, or on a system.* collection (create and collMod); {} is allowed."""
    _, port = shard
    with client(port) as c:
        for dbname in ("admin", "local", "config"):
            msg = cmd_fails(c[dbname], 72, "create", "vc", validator={"a": 1})
            assert msg == ("Document validators are not allowed on collections in the "
                           f"{dbname} database")
        # (system.* collections cannot be created on a shard at all: 73 before the check)
        c.v.command("create", "plain")
        c.v.command("create", "plain2", validator={})
        c.v.command("collMod", "plain", validator={})
        c.v.command("create", "vc2", validator={"a": 1})


def test_regex_limits_and_cached_validator(shard):
    """A $jsonSchema pattern that backtracks catastrophically is a 2 BadValue write error
    (PCRE2's match limit), quickly, never a silent pass; patternProperties too. A collMod
    that changes the validator takes effect at once (the compiled-validator cache is keyed
    by the validator's bytes)."""
    _, port = shard
    with client(port) as c:
        db = c.v
        db.command("create", "r", validator={"$jsonSchema": {
            "properties": {"s": {"pattern": "^(a+)+$"}},
            "patternProperties": {"^(a+)+$": {"bsonType": "int"}},
            "additionalProperties": True}})
        db.r.insert_one({"_id": 1, "s": "aaaa"})
        write_fails(lambda: db.r.insert_one({"_id": 2, "s": "b"}))
        for doc in ({"_id": 3, "s": "a" * 40 + "b"},
                    {"_id": 4, **{"a" * (30 + i) + "b": "str" for i in range(50)}}):
            with pytest.raises((WriteError, OperationFailure)) as e:
                db.r.insert_one(doc)
            assert e.value.code == 2, e.value.details
            assert "match limit" in e.value.details["errmsg"]
        assert db.r.count_documents({}) == 1
        db.command("collMod", "r", validator={"s": {"$type": "int"}})
        write_fails(lambda: db.r.insert_one({"_id": 5, "s": "aaaa"}))
        db.r.insert_one({"_id": 5, "s": 5})
        db.command("collMod", "r", validator={"s": {"$type": "string"}})
        db.r.insert_one({"_id": 6, "s": "x"})
        write_fails(lambda: db.r.insert_one({"_id": 7, "s": 5}))
        # a large enum and uniqueItems over a large array, through the cache
        db.command("create", "e", validator={"$jsonSchema": {"properties": {
            "k": {"enum": list(range(100000))},
            "arr": {"uniqueItems": True}}}})
        db.e.insert_one({"_id": 1, "k": 99999, "arr": list(range(20000))})
        d = write_fails(lambda: db.e.insert_one({"_id": 2, "arr": list(range(20000)) + [7]}))
        rules = d["errInfo"]["details"]["schemaRulesNotSatisfied"]
        assert rules[0]["propertiesNotSatisfied"][0]["details"][0]["duplicatedValue"] == 7
        write_fails(lambda: db.e.insert_one({"_id": 3, "k": 100000}))


def test_validator_compares_under_the_collection_default_collation(shard):
    """mongod parses a validator with the collection's collator: under a case-insensitive
    default, {$nin: ["admin"]} refuses "ADMIN" and {$in: ["a"]} accepts "A", whatever the
    write's own collation (a fresh user found both the other way round)."""
    _, port = shard
    c = client(port)
    db = c.vcoll
    ci = {"locale": "en", "strength": 2}
    db.command("create", "users", validator={"name": {"$nin": ["admin", "root"]}}, collation=ci)
    write_fails(lambda: db.users.insert_one({"name": "ADMIN"}))
    db.users.insert_one({"name": "alice"})
    db.command("create", "opts", validator={"n": {"$in": ["a", "b"]}}, collation=ci)
    db.opts.insert_one({"n": "A"})
    db.command("create", "ex", validator={"$expr": {"$eq": ["$n", "x"]}}, collation=ci)
    db.ex.insert_one({"n": "X"})
    # a collection without a default collation compares bytes
    db.command("create", "plain", validator={"n": {"$in": ["a"]}})
    write_fails(lambda: db.plain.insert_one({"n": "A"}))
    assert db.users.count_documents({}) == 1 and db.opts.count_documents({}) == 1
    assert db.ex.count_documents({}) == 1 and db.plain.count_documents({}) == 0
    c.close()
