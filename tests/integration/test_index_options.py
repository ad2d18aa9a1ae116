"""Index options (issue #20, "nothing accepted is silently ignored"): every option MongoDB
6.0 accepts in a createIndexes specification is honoured or refused with MongoDB's code
(docs/compat.md "Index options").

- partialFilterExpression is a real partial index: only the documents the filter matches
  have entries, so a unique partial index refuses duplicates among them only; the planner
  uses it (by itself or by hint) only for a query whose filter implies the index's; a hint
  to it for another query is refused (2 BadValue); filters MongoDB refuses (anything but
  equality, $exists: true, $gt/$gte/$lt/$lte, $type, $in, $and, $or) get 67
  CannotCreateIndex; sparse with it 67; a chunk migration copies it to the target.
- Other options: type checks (14), weights outside a text index (67), wildcardProjection
  outside a '$**' index (2), v other than 1 or 2 (67), prepareUnique: true and a non-empty
  storageEngine (238 NotImplemented).
On a shard, through a proxy to a sharded collection, and across a chunk migration.
"""
import pymongo
import pytest
from bson.decimal128 import Decimal128
from bson.regex import Regex
from pymongo.errors import DuplicateKeyError, OperationFailure

from conftest import wait_until
from migration_helpers import MigCluster
from proxy_helpers import ProxyCluster


def _ids(cursor):
    return sorted(d["_id"] for d in cursor)


def _code(fn):
    with pytest.raises(OperationFailure) as e:
        fn()
    return e.value.code, e.value.details.get("errmsg")


def _check_partial_unique(coll, key_extra=None):
    """A unique partial index {email: 1} (+ key_extra fields, equal in every document)
    filtered on {active: true}: duplicates outside the filter pass, inside are refused."""
    extra = dict(key_extra or {})
    keys = [(f, 1) for f in extra] + [("email", 1)]
    name = coll.create_index(keys, unique=True, partialFilterExpression={"active": True})
    coll.insert_one({"_id": 1, "email": "a", "active": True, **extra})
    coll.insert_one({"_id": 2, "email": "a", "active": False, **extra})  # outside: passes
    coll.insert_one({"_id": 3, "email": "a", **extra})  # no 'active': outside
    with pytest.raises(DuplicateKeyError) as e:
        coll.insert_one({"_id": 4, "email": "a", "active": True, **extra})
    assert e.value.code == 11000
    assert coll.count_documents({}) == 3
    # an update that brings a document inside the filter is checked too
    with pytest.raises(DuplicateKeyError):
        coll.update_one({"_id": 2}, {"$set": {"active": True}})
    # once the first leaves the filter, the second may enter it
    coll.update_one({"_id": 1}, {"$set": {"active": False}})
    coll.update_one({"_id": 2}, {"$set": {"active": True}})
    with pytest.raises(DuplicateKeyError):
        coll.update_one({"_id": 3}, {"$set": {"active": True}})
    # deleting the indexed one frees the key
    coll.delete_one({"_id": 2})
    coll.update_one({"_id": 3}, {"$set": {"active": True}})
    assert {d["_id"]: d.get("active") for d in coll.find({})} == {1: False, 3: True}
    spec = {ix["name"]: ix for ix in coll.list_indexes()}[name]
    assert spec["partialFilterExpression"] == {"active": True}
    assert spec["unique"] is True
    return name


def _check_partial_reads(coll):
    """Reads with and without the partial index {x: 1} filtered on {x: {$gt: 5}}."""
    coll.insert_many([{"_id": 100 + i, "x": i, "g": i % 2} for i in range(10)])
    coll.create_index("x", partialFilterExpression={"x": {"$gt": 5}})
    # implied filters: the index may serve them, by itself or by hint
    assert _ids(coll.find({"x": {"$gt": 7}})) == [108, 109]
    assert _ids(coll.find({"x": {"$gt": 7}}).hint("x_1")) == [108, 109]
    assert _ids(coll.find({"x": 6}).hint("x_1")) == [106]
    assert _ids(coll.find({"x": {"$gte": 6}, "g": 1}).hint("x_1")) == [107, 109]
    assert [d["x"] for d in coll.find({"x": {"$gt": 5}}).sort("x", -1)] == [9, 8, 7, 6]
    # not implied: answered from every document, never from the index alone
    assert _ids(coll.find({"x": {"$gt": 3}})) == [104, 105, 106, 107, 108, 109]
    assert _ids(coll.find({"x": {"$lt": 2}})) == [100, 101]
    assert [d["x"] for d in coll.find({"x": {"$exists": True}}).sort("x", 1)] == list(range(10))
    assert coll.count_documents({"x": {"$gte": 0}}) == 10
    # a hint to the partial index for a query it does not cover is refused (mongod)
    code, msg = _code(lambda: list(coll.find({"x": {"$gt": 3}}).hint("x_1")))
    assert code == 2, msg
    assert "partial index 'x_1'" in msg
    code, _ = _code(lambda: list(coll.find({}).hint([("x", 1)])))
    assert code == 2
    # $in and $or filters (MongoDB 6.0): a query within one branch may use the index
    coll.create_index("g", partialFilterExpression={
        "$or": [{"x": {"$in": [1, 2]}}, {"$and": [{"x": 9}, {"g": 1}]}]})
    assert _ids(coll.find({"g": 1, "x": 1}).hint("g_1")) == [101]
    assert _ids(coll.find({"g": 1, "x": 9}).hint("g_1")) == [109]
    assert _ids(coll.find({"g": 0, "x": {"$in": [2]}}).hint("g_1")) == [102]
    assert _code(lambda: list(coll.find({"g": 1, "x": 3}).hint("g_1")))[0] == 2
    assert _code(lambda: list(coll.find({"x": 9}).hint("g_1")))[0] == 2
    assert _ids(coll.find({"g": 1, "x": {"$lt": 4}})) == [101, 103]


def _check_partial_nan(coll):
    """NaN sorts below every number but a range on numbers does not match it: a query for
    NaN is within a partial filter only when the filter is a NaN comparison that matches
    NaN ($eq/$lte/$gte NaN; mongod expression_algo.cpp _isSubsetOf)."""
    nan, dnan = float("nan"), Decimal128("NaN")
    coll.insert_many([{"_id": 1, "a": nan}, {"_id": 2, "a": 3}, {"_id": 3, "a": dnan}])
    for op in ("$lt", "$lte", "$gt", "$gte"):
        coll.create_index("a", name="p", partialFilterExpression={"a": {op: 5}})
        for v in (nan, dnan):
            for q in ({"a": v}, {"a": {"$lte": v}}, {"a": {"$gte": v}}, {"a": {"$in": [v]}}):
                assert _ids(coll.find(q).sort("a", 1)) == [1, 3], (op, q)
                assert _ids(coll.find(q)) == [1, 3], (op, q)
                code, msg = _code(lambda: list(coll.find(q).hint("p")))
                assert code == 2 and "partial index 'p'" in msg, (op, q, code, msg)
            for q in ({"a": {"$lt": v}}, {"a": {"$gt": v}}):
                assert _ids(coll.find(q).sort("a", 1)) == [], (op, q)
                assert _code(lambda: list(coll.find(q).hint("p")))[0] == 2, (op, q)
        coll.drop_index("p")
    # a filter that matches NaN holds it: a NaN query may use it (double or decimal)
    for fop in ("$lte", "$gte"):
        coll.create_index("a", name="n", partialFilterExpression={"a": {fop: nan}})
        for v in (nan, dnan):
            for q in ({"a": v}, {"a": {"$lte": v}}, {"a": {"$gte": v}}):
                assert _ids(coll.find(q).hint("n")) == [1, 3], (fop, q)
            assert _code(lambda: list(coll.find({"a": {"$lt": 5}}).hint("n")))[0] == 2
        coll.drop_index("n")


def _check_partial_identity(coll):
    """mongod compares partial filters after parsing and normalizing them
    (IndexDescriptor::compareIndexOptions: MatchExpression::equivalent): each pair below is
    one index (another name: 85; the same name: a no-op), and listIndexes shows the filter
    as first given."""
    same = [
        ({"a": {"$gt": 1, "$lt": 5}}, {"a": {"$lt": 5, "$gt": 1}}),
        ({"a": {"$gt": 1, "$lt": 5}}, {"$and": [{"a": {"$lt": 5}}, {"a": {"$gt": 1}}]}),
        ({"a": {"$in": [1, 2]}}, {"a": {"$in": [2, 1]}}),
        ({"a": {"$in": [1, 2]}}, {"a": {"$in": [2, 1, 2.0]}}),
        ({"a": {"$eq": 1}}, {"a": 1}),
        ({"a": 1}, {"a": {"$in": [1]}}),
        ({"a": 1}, {"$and": [{"a": 1}]}),
        ({"a": 1}, {"$or": [{"a": 1}]}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"$or": [{"a": 1}, {"b": 2}]}, {"$or": [{"b": 2}, {"$or": [{"a": 1}]}]}),
        ({"a": {"$exists": True}}, {"a": {"$exists": 1}}),
        ({"a": {"$all": [1]}}, {"a": 1}),
        ({"a": {"$type": "int"}}, {"a": {"$type": [16, "int"]}}),
        ({"a": {"$all": [1, 2]}}, {"$and": [{"a": 2}, {"a": 1}]}),
    ]
    for i, (f, g) in enumerate(same):
        name = f"s{i}"
        coll.create_index("k", name=name, partialFilterExpression=f)
        code, msg = _code(lambda: coll.create_index(
            "k", name=f"other{i}", partialFilterExpression=g))
        assert code == 85 and name in msg, (f, g, code, msg)
        coll.create_index("k", name=name, partialFilterExpression=g)  # exists: no-op
        specs = {ix["name"]: ix for ix in coll.list_indexes()}
        assert specs[name]["partialFilterExpression"] == f, specs[name]
        assert f"other{i}" not in specs
        coll.drop_index(name)
    # different filters stay different indexes
    differ = [({"a": 1}, {"a": 2}), ({"a": {"$gt": 1}}, {"a": {"$gte": 1}}),
              ({"a": {"$in": [1, 2]}}, {"a": {"$in": [1, 3]}}), ({"a": 1}, {"b": 1}),
              ({"$or": [{"a": 1}, {"b": 2}]}, {"a": 1, "b": 2}), ({"a": "x"}, {"a": "X"}),
              ({"a": {"$type": "number"}}, {"a": {"$type": [1, 16, 18, 19]}}),
              ({"a": {"$type": "int"}}, {"a": {"$type": "long"}})]
    for i, (f, g) in enumerate(differ):
        coll.create_index("k", name=f"d{i}", partialFilterExpression=f)
        coll.create_index("k", name=f"e{i}", partialFilterExpression=g)
        code, _ = _code(lambda: coll.create_index(
            "k", name=f"d{i}", partialFilterExpression=g))
        assert code == 86, (f, g)
        coll.drop_index(f"d{i}")
        coll.drop_index(f"e{i}")


def test_partial_index_on_a_shard(shard):
    _, port = shard
    cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
    db = cl.t
    _check_partial_unique(db.u)
    _check_partial_reads(db.r)
    _check_partial_nan(db.nan)
    _check_partial_identity(db.ident)
    # validate counts the partial index's entries against the documents it holds
    for c in ("u", "r"):
        r = db.command("validate", c)
        assert r["valid"] is True, r
    r = db.command("validate", "r")
    assert r["keysPerIndex"]["x_1"] == 4, r  # x in 6..9
    # the operators MongoDB 6.0 allows: equality, $exists: true, comparisons, $type,
    # $in, $and, $or (nested too)
    ok = [{"a": 1}, {"a": {"$eq": 3}}, {"a": {"$exists": True}}, {"a": {"$type": "string"}},
          {"a": {"$in": [1, 2]}}, {"a": {"$gte": 1, "$lt": 9}},
          {"$and": [{"a": 1}, {"b": {"$gt": 2}}]}, {"$or": [{"a": 1}, {"b": 2}]},
          {"$and": [{"$or": [{"a": 1}, {"b": 2}]}, {"c": 3}]}, {"a": {"b": 1}},
          {"a": {"$all": [5, 6]}}, {"$or": [{"a": {"$all": [7]}}, {"b": 3}]}]
    for i, f in enumerate(ok):
        db.ok.create_index([("k", 1)], name=f"k_{i}", partialFilterExpression=f)
    assert len(list(db.ok.list_indexes())) == len(ok) + 1
    # an $all of values is an $and of equalities (mongod 6.0 takes it)
    db.allf.insert_many([{"_id": 1, "k": 1, "a": [5, 6]}, {"_id": 2, "k": 1, "a": [5]}])
    db.allf.create_index("k", name="ka", partialFilterExpression={"a": {"$all": [5, 6]}})
    assert _ids(db.allf.find({"k": 1, "a": {"$all": [6, 5]}}).hint("ka")) == [1]
    assert _ids(db.allf.find({"k": 1, "a": 5, "$and": [{"a": 6}]}).hint("ka")) == [1]
    assert _code(lambda: list(db.allf.find({"k": 1, "a": 5}).hint("ka")))[0] == 2
    assert db.command("validate", "allf")["keysPerIndex"]["ka"] == 1
    # every other expression: 67 CannotCreateIndex, nothing built
    bad = [{"a": {"$ne": 1}}, {"a": {"$exists": False}}, {"a": {"$nin": [1]}},
           {"$nor": [{"a": 1}]}, {"a": {"$regex": "x"}}, {"a": {"$not": {"$gt": 1}}},
           {"a": {"$elemMatch": {"b": 1}}}, {"a": {"$size": 1}}, {"a": {"$mod": [2, 0]}},
           {"$and": [{"a": {"$ne": 1}}]}, {"$or": [{"a": 1}, {"b": {"$exists": False}}]},
           {"a": {"$all": []}}, {"a": {"$all": [1, Regex("x")]}},
           {"a": {"$all": [{"$elemMatch": {"b": 1}}]}}]
    for f in bad:
        code, msg = _code(lambda: db.bad.create_index("k", partialFilterExpression=f))
        assert code == 67, (f, code, msg)
        assert msg.startswith("Expression not supported in partial index"), msg
    # the query features createIndexes parses a filter without (mongod's
    # kBanAllSpecialFeatures: expression_parser.cpp's codes and messages)
    banned = [({"$expr": {"$eq": ["$a", 1]}}, 224, "$expr is not allowed in this context"),
              ({"$or": [{"b": 1}, {"$expr": True}]}, 224, "$expr is not allowed"),
              ({"$jsonSchema": {}}, 224, "$jsonSchema is not allowed in this context"),
              ({"$text": {"$search": "x"}}, 2, "$text is not allowed in this context"),
              ({"$where": "true"}, 2, "$where is not allowed in this context"),
              ({"a": {"$near": [0, 0]}}, 5626500, "$geoNear, $near, and $nearSphere are not"),
              ({"a": {"$nearSphere": [0, 0]}}, 5626500, "$geoNear, $near, and $nearSphere")]
    for f, want, prefix in banned:
        with pytest.raises(OperationFailure) as e:
            db.bad.create_index("k", partialFilterExpression=f)
        assert e.value.code == want, (f, e.value.details)
        assert e.value.details["errmsg"].startswith(prefix), (f, e.value.details)
        if want == 224:
            assert e.value.details["codeName"] == "QueryFeatureNotAllowed"
    # the query language's own errors first, then the type
    assert _code(lambda: db.bad.create_index(
        "k", partialFilterExpression={"a": {"$foo": 1}}))[0] == 2
    assert _code(lambda: db.command({"createIndexes": "bad", "indexes": [
        {"key": {"k": 1}, "name": "k_1", "partialFilterExpression": 5}]}))[0] == 14
    # sparse and partial do not mix (mongod)
    code, msg = _code(lambda: db.bad.create_index(
        "k", sparse=True, partialFilterExpression={"a": 1}))
    assert code == 67 and "sparse" in msg
    assert "bad" not in db.list_collection_names() or \
        len(list(db.bad.list_indexes())) == 1
    # one key pattern, two filters: two indexes; the same filter again under another
    # name: IndexOptionsConflict (85); same name, other filter: 86
    db.two.create_index("k", name="k_a", partialFilterExpression={"a": 1})
    db.two.create_index("k", name="k_b", partialFilterExpression={"b": 1})
    assert _code(lambda: db.two.create_index(
        "k", name="k_c", partialFilterExpression={"a": 1}))[0] == 85
    assert _code(lambda: db.two.create_index(
        "k", name="k_a", partialFilterExpression={"c": 1}))[0] == 86
    db.two.create_index("k", name="k_a", partialFilterExpression={"a": 1})  # exists: ok
    # a key pattern shared by two indexes names neither: mongod's codes
    db.two.insert_many([{"_id": 1, "k": 1, "a": 1}, {"_id": 2, "k": 1, "b": 1}])
    assert _ids(db.two.find({"k": 1, "a": 1}).hint("k_a")) == [1]
    assert _ids(db.two.find({"k": 1, "b": 1}).hint("k_b")) == [2]
    code, msg = _code(lambda: list(db.two.find({"k": 1, "a": 1}).hint([("k", 1)])))
    assert code == 27 and "must hint by index name" in msg, msg
    code, msg = _code(lambda: db.command({"dropIndexes": "two", "index": {"k": 1}}))
    assert code == 286 and "identify by name instead" in msg, msg
    db.two.drop_index("k_b")
    db.command({"dropIndexes": "two", "index": {"k": 1}})  # one left: by key pattern
    assert [i["name"] for i in db.two.list_indexes()] == ["_id_"]
    cl.close()


def test_other_index_options_on_a_shard(shard):
    _, port = shard
    cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
    db = cl.t

    def ci(**spec):
        s = {"key": {"k": 1}, "name": "k_1"}
        s.update(spec)
        return _code(lambda: db.command({"createIndexes": "o", "indexes": [s]}))

    assert ci(weights={"k": 2})[0] == 67
    assert ci(wildcardProjection={"a": 1})[0] == 2
    assert ci(v=3)[0] == 67
    assert ci(v=1.5)[0] == 2
    assert ci(v="2")[0] == 14
    assert ci(v=1, collation={"locale": "fr"})[0] == 67
    code, msg = ci(prepareUnique=True)
    assert code == 238 and "prepareUnique" in msg
    assert ci(unique=True, prepareUnique=True)[0] == 67
    code, msg = ci(storageEngine={"wiredTiger": {"configString": "block_compressor=zlib"}})
    assert code == 238 and "storageEngine" in msg
    assert ci(storageEngine=5)[0] == 14
    assert ci(hidden=1)[0] == 14
    assert ci(background="yes")[0] == 14
    assert ci(unique="yes")[0] == 14
    assert ci(bits="x")[0] == 14
    assert ci(default_language=1)[0] == 14
    assert ci(originalSpec={})[0] == 2
    # nothing above built anything
    assert "o" not in db.list_collection_names()
    # accepted, as mongod: background, prepareUnique false, an empty storageEngine, v 1,
    # the text and geo options (no effect on an ascending index, as on mongod)
    db.command({"createIndexes": "o", "indexes": [
        {"key": {"k": 1}, "name": "k_1", "background": True, "prepareUnique": False,
         "storageEngine": {}, "v": 1, "textIndexVersion": 3, "default_language": "fr"}]})
    db.o.insert_many([{"k": 1}, {"k": 1}])
    assert db.o.count_documents({"k": 1}) == 2
    specs = {i["name"]: i for i in db.o.list_indexes()}
    assert specs["k_1"]["v"] == 1 and specs["k_1"]["default_language"] == "fr"
    # key pattern, collation and partial filter identify an index (mongod): the same
    # key under another name is 85 even with other options
    assert _code(lambda: db.o.create_index("k", name="k_u", sparse=True))[0] == 85
    assert _code(lambda: db.o.create_index("k", name="k_1", sparse=True))[0] == 86
    # a spec an earlier release accepted (prepareUnique, storageEngine: ignored then) is
    # still copied by $out into the collection that has it, and by migrations
    db.command({"createIndexes": "legacy", "$stripedbIndexCopy": True, "indexes": [
        {"key": {"a": 1}, "name": "a_1", "prepareUnique": True,
         "storageEngine": {"wiredTiger": {}}}]})
    db.src.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    list(db.src.aggregate([{"$out": "legacy"}]))
    assert _ids(db.legacy.find({})) == [1, 2]
    specs = {i["name"]: i for i in db.legacy.list_indexes()}
    assert specs["a_1"]["prepareUnique"] is True
    cl.close()


def test_partial_index_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("db.c", {"t": 1}, split_points=[{"t": 10}],
                            shards=["shard-a", "shard-b"])
        db = cl.proxy_client(0).db
        # unique on a sharded collection: the shard key first (t: 5 -> shard-a)
        _check_partial_unique(db.c, key_extra={"t": 5})
        # an unsharded collection through the proxy
        _check_partial_reads(cl.proxy_client(0).un.r)
        _check_partial_nan(cl.proxy_client(0).un.nan)
        _check_partial_identity(db.c)
        # and on the sharded one, documents on both shards
        db.c.insert_many([{"_id": 200 + i, "t": i * 3, "x": i} for i in range(10)])
        db.c.create_index("x", partialFilterExpression={"x": {"$gt": 5}})
        assert _ids(db.c.find({"x": {"$gt": 7}})) == [208, 209]
        assert _ids(db.c.find({"x": {"$gt": 7}}).hint("x_1")) == [208, 209]
        assert _ids(db.c.find({"x": {"$gte": 4}})) == [204, 205, 206, 207, 208, 209]
        assert _code(lambda: list(db.c.find({"x": {"$gte": 4}}).hint("x_1")))[0] == 2
        for sid in cl.shard_ids:
            specs = {i["name"]: i for i in cl.shard_client(sid).db.c.list_indexes()}
            assert specs["x_1"]["partialFilterExpression"] == {"x": {"$gt": 5}}, sid
        # refusals reach the client from the shards
        assert _code(lambda: db.c.create_index(
            "y", partialFilterExpression={"y": {"$ne": 1}}))[0] == 67
        assert _code(lambda: db.c.create_index("y", prepareUnique=True))[0] == 238
        # the copy marker is stripedb's own: never from a client
        assert _code(lambda: db.command({
            "createIndexes": "c", "$stripedbIndexCopy": True,
            "indexes": [{"key": {"y": 1}, "name": "y_1", "prepareUnique": True}]}))[0] == 2
    finally:
        cl.close()


def test_migration_keeps_a_partial_index(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.p"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["p"]
        coll.create_index([("k", 1), ("email", 1)], unique=True,
                          partialFilterExpression={"active": True})
        coll.create_index("x", partialFilterExpression={"x": {"$gt": 5}})
        # on shard-a's chunk: duplicates of (k, email) outside the filter
        coll.insert_many([{"_id": i, "k": 7, "email": "e", "active": i == 0, "x": i}
                          for i in range(10)])
        (c0,) = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        mid = cl.migrate(ns, c0["id"], "shard-b", "--grace-ms=500")
        m = cl.wait_migration(mid)
        assert m["state"] == "complete", m
        assert m["stats"]["verify"]["missing"] == 0, m["stats"]
        tgt = cl.shard_client("shard-b")["app"]["p"]
        specs = {i["name"]: i for i in tgt.list_indexes()}
        assert specs["k_1_email_1"]["partialFilterExpression"] == {"active": True}
        assert specs["k_1_email_1"]["unique"] is True
        assert specs["x_1"]["partialFilterExpression"] == {"x": {"$gt": 5}}
        assert tgt.count_documents({"k": 7}) == 10
        r = cl.shard_client("shard-b")["app"].command("validate", "p")
        assert r["valid"] is True, r
        assert r["keysPerIndex"]["k_1_email_1"] == 1, r
        assert r["keysPerIndex"]["x_1"] == 4, r
        # the target enforces it as the source did
        coll.insert_one({"_id": 50, "k": 7, "email": "e", "active": False})
        with pytest.raises(DuplicateKeyError):
            coll.insert_one({"_id": 51, "k": 7, "email": "e", "active": True})
        assert _ids(coll.find({"x": {"$gt": 7}}).hint("x_1")) == [8, 9]
        assert _ids(coll.find({"x": {"$gt": 2}})) == [3, 4, 5, 6, 7, 8, 9]
        wait_until(lambda: cl.shard_client("shard-a")["app"]["p"].count_documents({}) == 0,
                   30, what="source chunk deleted")
    finally:
        cl.close()


def test_partial_ttl_index_expires_only_the_documents_it_holds(start_role, tmp_path):
    import datetime

    from conftest import free_port
    port = free_port()
    d = tmp_path / "shard"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}",
                "--ttl-monitor-sleep-secs=1"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
    db = c.t
    old = datetime.datetime(2020, 1, 1)
    db.e.create_index("at", expireAfterSeconds=0, partialFilterExpression={"kind": "temp"})
    db.e.insert_many([{"_id": i, "at": old, "kind": "temp" if i % 2 else "keep"}
                      for i in range(6)])
    wait_until(lambda: db.e.count_documents({"kind": "temp"}) == 0, 30,
               what="the temp documents expired")
    # the others are past the date too, but outside the index: kept (mongod)
    assert _ids(db.e.find({})) == [0, 2, 4]
    assert c.admin.command("stripedbCheck")["nProblems"] == 0
    c.close()


def test_partial_ttl_index_expires_under_the_index_collation(start_role, tmp_path):
    """A partial TTL index's filter is the index's, evaluated under the index's collation
    (mongod's TTL monitor deletes through the index): not under the collection's default."""
    import datetime

    from conftest import free_port
    port = free_port()
    d = tmp_path / "shard"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}",
                "--ttl-monitor-sleep-secs=1"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
    db = c.t
    old = datetime.datetime(2020, 1, 1)
    ci = {"locale": "en", "strength": 2}
    # collection case-insensitive, index simple: "TEMP" is not in the index, kept
    db.create_collection("ci", collation=ci)
    db.ci.create_index("at", expireAfterSeconds=0, partialFilterExpression={"kind": "temp"},
                       collation={"locale": "simple"})
    # collection simple, index case-insensitive: "TEMP" is in the index, expired
    db.create_collection("cs")
    db.cs.create_index("at", expireAfterSeconds=0, partialFilterExpression={"kind": "temp"},
                       collation=ci)
    for coll in (db.ci, db.cs):
        coll.insert_many([{"_id": i, "at": old, "kind": ["temp", "TEMP", "keep"][i % 3]}
                          for i in range(6)])
    wait_until(lambda: _ids(db.ci.find({})) != [0, 1, 2, 3, 4, 5] and
               _ids(db.cs.find({})) == [2, 5], 30, what="the indexed documents expired")
    assert _ids(db.ci.find({})) == [1, 2, 4, 5]
    assert c.admin.command("stripedbCheck")["nProblems"] == 0
    c.close()
