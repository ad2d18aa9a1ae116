"""Collation (issue #20, ICU as MongoDB 6.0's CollatorFactoryICU / CollatorInterfaceICU) on a
shard and through a proxy to a sharded collection whose documents lie on several shards:
case-insensitive equality and ranges in the matcher, sort order (numericOrdering),
distinct's dedup, $group keys, update/delete/findAndModify with a collation, a collection's
default collation (create, listCollections, commands without their own collation), the
option errors with mongod's codes, and the refusals that remain (index collations)."""
import pymongo
import pytest
from pymongo.collation import Collation
from pymongo.errors import OperationFailure, WriteError

from proxy_helpers import ProxyCluster

CI = {"locale": "en_US", "strength": 2}  # case-insensitive
NUM = {"locale": "en", "numericOrdering": True}
WORDS = [{"_id": i, "x": x, "n": n} for i, (x, n) in enumerate(
    [("ping", "10"), ("PONG", "9"), ("Ping", "100"), ("apple", "2"), ("Banana", "1"),
     ("pong", "20"), ("café", "3")])]


def code_of(fn):
    with pytest.raises(OperationFailure) as e:
        fn()
    return e.value.code


def check(db):
    c = db.words
    # find: equality, $in, $ne, ranges compare under the collation; without one, by bytes
    assert [d["x"] for d in c.find({"x": "PING"}, collation=CI).sort("_id", 1)] == [
        "ping", "Ping"]
    assert list(c.find({"x": "PING"})) == []
    assert sorted(d["x"] for d in c.find({"x": {"$in": ["APPLE", "banana"]}}, collation=CI)) == [
        "Banana", "apple"]
    assert c.count_documents({"x": {"$ne": "pong"}}, collation=CI) == 5
    assert sorted(d["x"] for d in c.find({"x": {"$gte": "P", "$lt": "pq"}}, collation=CI)) == [
        "PONG", "Ping", "ping", "pong"]
    assert c.count_documents({"x": "CAFE"}, collation={"locale": "fr", "strength": 1}) == 1
    assert c.count_documents({"x": "CAFE"}, collation=CI) == 0  # strength 2 sees accents
    # the command's own collation object from pymongo
    assert c.count_documents({"x": "ping"}, collation=Collation("en", strength=2)) == 2
    # sort: binary puts upper case first; en_US orders letters case-insensitively first
    assert [d["x"] for d in c.find({}, {"x": 1}).sort("x", 1)] == [
        "Banana", "PONG", "Ping", "apple", "café", "ping", "pong"]
    assert [d["x"] for d in c.find({}, {"x": 1}, collation={"locale": "en_US"}).sort("x", 1)] == [
        "apple", "Banana", "café", "ping", "Ping", "pong", "PONG"]
    # numericOrdering: "9" < "10" < "20" < "100"
    assert [d["n"] for d in c.find({}, collation=NUM).sort("n", 1)] == [
        "1", "2", "3", "9", "10", "20", "100"]
    assert [d["n"] for d in c.find({}).sort("n", 1)] == ["1", "10", "100", "2", "20", "3", "9"]
    # distinct dedups under the collation
    assert len(c.distinct("x", collation=CI)) == 5
    assert len(c.distinct("x")) == 7
    # aggregate: $match, $group keys, $sort
    out = list(c.aggregate([{"$match": {"x": {"$in": ["ping", "pong"]}}},
                            {"$group": {"_id": {"$toLower": "$x"}, "n": {"$sum": 1}}},
                            {"$sort": {"_id": 1}}], collation=CI))
    assert out == [{"_id": "ping", "n": 2}, {"_id": "pong", "n": 2}]
    groups = list(c.aggregate([{"$group": {"_id": "$x", "n": {"$sum": 1}}},
                               {"$sort": {"n": -1, "_id": 1}}], collation=CI))
    assert [g["n"] for g in groups] == [2, 2, 1, 1, 1]
    assert list(c.aggregate([{"$project": {"_id": 0, "e": {"$eq": ["$x", "PING"]}}},
                             {"$match": {"e": True}}], collation=CI)) == [{"e": True}] * 2

    # update / delete / findAndModify with a collation
    r = c.update_many({"x": "PONG"}, {"$set": {"hit": True}}, collation=CI)
    assert r.matched_count == 2
    assert c.count_documents({"hit": True}) == 2
    doc = c.find_one_and_update({"x": "BANANA"}, {"$set": {"fam": 1}}, collation=CI,
                                return_document=pymongo.ReturnDocument.AFTER)
    assert doc["x"] == "Banana" and doc["fam"] == 1
    # identity stays binary: an _id changing case is a change of _id (66)
    db.ids.insert_one({"_id": "abc", "v": 1})
    with pytest.raises(WriteError) as e:
        db.ids.replace_one({"_id": "ABC"}, {"_id": "ABC", "v": 2}, collation=CI)
    assert e.value.code == 66
    assert db.ids.find_one({"_id": "abc"}, collation=CI)["v"] == 1
    assert c.delete_many({"x": "ping"}, collation=CI).deleted_count == 2
    assert c.count_documents({}) == 5

    # errors as mongod (collator_factory_icu.cpp)
    assert code_of(lambda: list(c.find({}, collation={"locale": "bogus"}))) == 2
    assert code_of(lambda: list(c.find({}, collation={"locale": "en", "strength": 7}))) == 9
    assert code_of(lambda: list(c.find({}, collation={"locale": "en", "foo": 1}))) == 9
    assert code_of(lambda: list(c.find({}, collation={"strength": 2}))) == 4
    assert code_of(lambda: list(c.find({}, collation={"locale": "simple", "strength": 2}))) == 9
    assert code_of(lambda: c.distinct("x", collation={"locale": "bogus"})) == 2
    with pytest.raises(WriteError) as e:
        c.update_one({"x": "a"}, {"$set": {"y": 1}}, collation={"locale": "bogus"})
    assert e.value.code == 2

    # a collection's default collation: stored in full by create, shown by listCollections,
    # used by commands without their own; a command's own collation wins
    db.create_collection("ci", collation=CI)
    info = next(db.list_collections(filter={"name": "ci"}))
    spec = info["options"]["collation"]
    assert spec["locale"] == "en_US" and spec["strength"] == 2
    assert spec["caseLevel"] is False and spec["alternate"] == "non-ignorable"
    db.ci.insert_many([{"_id": 1, "x": "ping"}, {"_id": 2, "x": "PING"}, {"_id": 3, "x": "pong"}])
    assert db.ci.count_documents({"x": "Ping"}) == 2
    assert db.ci.count_documents({"x": "Ping"}, collation={"locale": "simple"}) == 0
    assert sorted(db.ci.distinct("x")) == ["ping", "pong"] or sorted(db.ci.distinct("x")) == [
        "PING", "pong"]
    assert db.ci.update_many({"x": "PING"}, {"$set": {"u": 1}}).modified_count == 2
    assert code_of(lambda: db.create_collection("bad", collation={"locale": "bogus"})) == 2

    # an index with a collation: its keys are ICU sort keys (listIndexes shows the full
    # spec); it serves bounds and sorts to queries of its collation only
    assert sorted(d["x"] for d in c.find({})) == ["Banana", "PONG", "apple", "café", "pong"]
    c.create_index("x", name="x_ci", collation=CI)
    ix = [i for i in c.list_indexes() if i["name"] == "x_ci"][0]
    assert ix["collation"]["locale"] == "en_US" and ix["collation"]["strength"] == 2
    assert sorted(d["x"] for d in c.find({"x": "pong"}, collation=CI).hint("x_ci")) == [
        "PONG", "pong"]
    assert sorted(d["x"] for d in c.find({"x": {"$gte": "b", "$lt": "D"}}, collation=CI)
                  .hint("x_ci")) == ["Banana", "café"]
    assert [d["x"] for d in c.find({"x": "pong"}).hint("x_ci")] == ["pong"]  # binary query
    assert [d["x"] for d in c.find({"x": {"$regex": "^p"}}, collation=CI).hint("x_ci")] == [
        "pong"]
    assert [d["x"] for d in c.find({}, collation=CI).sort([("x", 1), ("_id", 1)])
            .hint("x_ci")] == ["apple", "Banana", "café", "PONG", "pong"]
    assert [d["x"] for d in c.find({"x": {"$gt": "a"}}).sort("x", 1).hint("x_ci")] == [
        "apple", "café", "pong"]  # binary order, though the index orders by en_US
    # a unique index under a case-insensitive collation: "K" duplicates "k"
    db.uq.create_index("k", unique=True, collation=CI)
    db.uq.insert_one({"_id": 1, "k": "k"})
    with pytest.raises(pymongo.errors.DuplicateKeyError):
        db.uq.insert_one({"_id": 2, "k": "K"})
    # an index without a collation on a collection with a default one inherits it (MongoDB)
    db.ci.create_index("x")
    assert [i for i in db.ci.list_indexes() if i["name"] == "x_1"][0]["collation"][
        "strength"] == 2
    # explain takes the explained command's collation
    explain = db.command("explain", {"find": "words", "filter": {"x": "PONG"},
                                     "collation": CI, "hint": "x_ci"},
                         verbosity="executionStats")
    assert "queryPlanner" in explain
    assert code_of(lambda: c.create_index("y", collation={"locale": "bogus"})) == 2
    assert code_of(lambda: c.create_index([("y", "hashed")], collation=CI)) == 238


def check_get_more(db):
    """A find's getMores compare under its collation as its first batch does (a reviewer
    found batch_size=10 returning 11 of 200 matches: getMore ran under the simple one),
    with the command's collation and with the collection's default."""
    db.many.insert_many([{"_id": i, "a": "b" if i % 2 else "B"} for i in range(400)])
    for bs in (10, 101, 0):
        cur = db.many.find({"a": "b"}, collation=CI, batch_size=bs)
        assert len(list(cur)) == 400, bs
        cur = db.many.find({"a": {"$gte": "b"}}, collation=CI, batch_size=bs).sort("_id", 1)
        assert [d["_id"] for d in cur] == list(range(400)), bs
    db.create_collection("many_ci", collation=CI)
    db.many_ci.insert_many([{"_id": i, "a": "b" if i % 2 else "B"} for i in range(500)])
    assert len(list(db.many_ci.find({"a": "B"}, batch_size=7))) == 500
    assert db.many.count_documents({"a": "b"}, collation=CI) == 400


def test_collation_on_a_shard(shard):
    _, port = shard
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        db = client.coll
        db.words.insert_many(WORDS)
        check(db)
        check_get_more(db)
        # with an index on x the planner must not use it for strings under a collation
        db.idx.create_index("x")
        db.idx.insert_many(WORDS)
        assert sorted(d["x"] for d in db.idx.find({"x": "PING"}, collation=CI)) == ["Ping", "ping"]
        # ping and Ping tie under strength 2: _id breaks the tie
        assert [d["x"] for d in db.idx.find({"x": {"$gte": "p"}}, collation=CI).hint("x_1")
                .sort([("x", 1), ("_id", 1)])] == ["ping", "Ping", "PONG", "pong"]
        assert db.idx.count_documents({"x": {"$in": ["APPLE", 3]}}, collation=CI) == 1
        # explain plans as the command runs: an index of the query's collation gives string
        # bounds, another one is scanned whole
        db.idx.create_index("x", name="x_ci", collation=CI)

        def keys(filt, coll, hint):
            cmd = {"find": "idx", "filter": filt, "hint": hint}
            if coll:
                cmd["collation"] = coll
            return db.command("explain", cmd, verbosity="executionStats")[
                "executionStats"]["totalKeysExamined"]
        assert keys({"x": "PING"}, CI, "x_ci") == 2
        assert keys({"x": "PING"}, None, "x_ci") == 7
        assert keys({"x": "PING"}, CI, "x_1") == 7
        assert keys({"x": "ping"}, None, "x_1") == 1
    finally:
        client.close()


def test_collation_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("coll.words", {"_id": 1}, split_points=[{"_id": 3}])
        cl.shard_collection("coll.byx", {"x": 1}, split_points=[{"x": "a"}])
        db = cl.proxy_client(0).coll
        db.words.insert_many(WORDS)
        for sid in cl.shard_ids:
            assert cl.shard_client(sid).coll.words.count_documents({}) > 0, sid
        # the merge of sorted streams from both shards follows the collation
        assert [d["n"] for d in db.words.find({}, collation=NUM).sort("n", 1)] == [
            "1", "2", "3", "9", "10", "20", "100"]
        assert [d["x"] for d in db.words.find({}, collation={"locale": "en_US"})
                .sort("x", -1)] == ["PONG", "pong", "Ping", "ping", "café", "Banana", "apple"]
        # a string equality on the shard key cannot target one chunk under a collation:
        # "PING" (chunk [MinKey, "a")) and "ping" (chunk ["a", MaxKey)) both match
        db.byx.insert_many([{"_id": 1, "x": "PING"}, {"_id": 2, "x": "ping"}])
        assert sorted(d["x"] for d in db.byx.find({"x": "ping"}, collation=CI)) == ["PING", "ping"]
        assert db.byx.count_documents({"x": "Ping"}, collation=CI) == 2
        assert db.byx.count_documents({"x": "Ping"}) == 0
        # the count and distinct commands too, sent per shard by the proxy once the shard
        # holds the collection's filtering metadata (shardCollection through the proxy
        # installs it): they carry the collation (a fresh user found count answering 1
        # where 2 match: the collation was dropped)
        p = cl.proxy_client(0)
        assert p.admin.command("shardCollection", "coll.byk", key={"x": 1})["ok"] == 1
        holder = [sid for sid in cl.shard_ids
                  if cl.shard_client(sid).admin.command("stripedbGetFiltering",
                                                        "coll.byk")["installed"]]
        assert holder, "no shard holds coll.byk's filtering metadata"
        db.byk.insert_many([{"_id": 1, "x": "PING"}, {"_id": 2, "x": "ping"}])
        assert db.command({"count": "byk", "query": {"x": "Ping"}, "collation": CI})["n"] == 2
        assert db.command({"count": "byk", "query": {"x": "Ping"}})["n"] == 0
        assert sorted(db.command({"distinct": "byk", "key": "_id", "query": {"x": "PiNG"},
                                  "collation": CI})["values"]) == [1, 2]
        assert db.command({"distinct": "byk", "key": "x", "collation": CI})["values"] in (
            ["PING"], ["ping"])
        # a replacement or findAndModify whose filter matches the shard key only under the
        # collation: the shard checks the key is kept (a fresh user got 66 for an unchanged
        # key, the proxy comparing the filter's "ABC" with the new "abc" by bytes)
        db.byk.insert_one({"_id": 3, "x": "abc"})
        assert db.byk.replace_one({"x": "ABC"}, {"_id": 3, "x": "abc", "v": 5},
                                  collation=CI).modified_count == 1
        assert db.byk.find_one({"_id": 3}) == {"_id": 3, "x": "abc", "v": 5}
        with pytest.raises(OperationFailure) as e:
            db.byk.replace_one({"x": "ABC"}, {"_id": 3, "x": "xyz"}, collation=CI)
        assert e.value.code == 66, e.value.details
        d = db.byk.find_one_and_replace({"x": "ABC"}, {"x": "abc", "v": 6}, collation=CI,
                                        return_document=True)
        assert d == {"_id": 3, "x": "abc", "v": 6}
        with pytest.raises(OperationFailure) as e:
            db.byk.find_one_and_update({"x": "ABC"}, {"$set": {"x": "xyz"}}, collation=CI)
        assert e.value.code == 66, e.value.details
        assert db.byk.find_one({"_id": 3}) == {"_id": 3, "x": "abc", "v": 6}
        check(db)
        cl.shard_collection("coll.many", {"_id": 1}, split_points=[{"_id": 150}])
        check_get_more(db)
        # $lookup of a sharded collection: the foreign side matches under the collation
        db.orders.insert_many([{"_id": 1, "w": "APPLE"}, {"_id": 2, "w": "pong"}])
        out = list(db.orders.aggregate([
            {"$lookup": {"from": "byx", "localField": "w", "foreignField": "x", "as": "m"}},
            {"$project": {"n": {"$size": "$m"}}}, {"$sort": {"_id": 1}}], collation=CI))
        assert out == [{"_id": 1, "n": 0}, {"_id": 2, "n": 0}]
        out = list(db.orders.aggregate([
            {"$lookup": {"from": "byx", "pipeline": [{"$match": {"x": "PiNg"}}], "as": "m"}},
            {"$project": {"n": {"$size": "$m"}}}, {"$sort": {"_id": 1}}], collation=CI))
        assert out == [{"_id": 1, "n": 2}, {"_id": 2, "n": 2}]
        assert [d["n"] for d in db.orders.aggregate([
            {"$lookup": {"from": "byx", "pipeline": [{"$match": {"x": "PiNg"}}], "as": "m"}},
            {"$project": {"n": {"$size": "$m"}}}])] == [0, 0]  # without: bytes
        # a collection with a non-simple default collation is not sharded (the routing
        # compares shard key strings by bytes): refused, never routed wrongly
        db.create_collection("dflt", collation=CI)
        with pytest.raises(OperationFailure) as e:
            cl.proxy_client(0).admin.command("shardCollection", "coll.dflt", key={"x": 1})
        assert e.value.code == 238 and "default collation" in str(e.value)
    finally:
        cl.close()
