"""Command arguments of the wrong type or value (issue #20, a reviewer's data-loss report).

Through a proxy, a sharded collection's findAndModify with `query: "k == 5"` removed an
arbitrary document (a wrong-typed query read as no query), a delete statement with
`limit: 0.5` deleted every match (0.5 truncated to 0, "delete all") on a shard and through a
proxy, and the proxy accepted integer arguments a shard refused. Every command now passes
MongoDB 6.0's IDL type check (common/cmdopts.c) in both roles before it runs. Each case is
sent to a shard directly and through a proxy to a sharded collection: both must answer
the code mongod answers, and no document may be deleted or changed.
"""
import pymongo
from bson import Int64
from bson.son import SON
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

INT64_MIN = Int64(-(2 ** 63))
INT64_MAX = Int64(2 ** 63 - 1)

# (command, code, text the message must contain)
CASES = [
    # wrong-typed query/filter/sort/projection/fields: 14, never "no filter"
    (SON([("findAndModify", "c"), ("query", "k == 5"), ("remove", True)]), 14,
     "BSON field 'findAndModify.query' is the wrong type 'string', expected type 'object'"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("sort", "k"), ("remove", True)]), 14,
     "'findAndModify.sort' is the wrong type 'string'"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("fields", 1), ("remove", True)]), 14,
     "'findAndModify.fields' is the wrong type 'int'"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("remove", "yes")]), 14,
     "'findAndModify.remove' is the wrong type 'string'"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("update", {"$set": {"x": 2}}),
          ("upsert", "no")]), 14, "'findAndModify.upsert' is the wrong type"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("update", {"$set": {"x": 2}}),
          ("new", None)]), 14, "'findAndModify.new' is the wrong type 'null'"),
    (SON([("findAndModify", "c"), ("query", {"k": 5}), ("update", "x")]), 14,
     "'findAndModify.update' is the wrong type 'string'"),
    (SON([("count", "c"), ("query", "bad")]), 14, "'count.query' is the wrong type"),
    (SON([("count", "c"), ("limit", "1")]), 14, "'count.limit' is the wrong type"),
    (SON([("distinct", "c"), ("key", "x"), ("query", "bad")]), 14,
     "'distinct.query' is the wrong type"),
    (SON([("distinct", "c"), ("key", 5)]), 14, "'distinct.key' is the wrong type 'int'"),
    (SON([("find", "c"), ("filter", "x")]), 14,
     "BSON field 'find.filter' is the wrong type 'string', expected type 'object'"),
    (SON([("find", "c"), ("projection", "x")]), 14, "'find.projection' is the wrong type"),
    (SON([("find", "c"), ("sort", 1)]), 14, "'find.sort' is the wrong type"),
    (SON([("find", "c"), ("hint", 5)]), 14, "'find.hint' is the wrong type"),
    (SON([("find", "c"), ("singleBatch", "x")]), 14, "'find.singleBatch' is the wrong type"),
    (SON([("find", "c"), ("limit", -1)]), 51024, "'find.limit' value must be >= 0"),
    (SON([("find", "c"), ("skip", 1.5)]), 9, "Expected an integer"),
    (SON([("explain", SON([("find", "c"), ("filter", "x")]))]), 14,
     "'find.filter' is the wrong type"),
    # a delete statement's limit is exactly 0 or 1 (write_ops.cpp readMultiDeleteProperty)
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": 0.5}])]), 9,
     "The limit field in delete objects must be 0 or 1. Got 0.5"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": 1e300}])]), 9,
     "must be 0 or 1. Got 1e+300"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": -1}])]), 9,
     "must be 0 or 1. Got -1"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": Int64(2)}])]), 9,
     "must be 0 or 1. Got 2"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": "1"}])]), 14,
     "'delete.deletes.limit' is the wrong type 'string'"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": None}])]), 14,
     "'delete.deletes.limit' is the wrong type 'null'"),
    (SON([("delete", "c"), ("deletes", [{"q": "x", "limit": 0}])]), 14,
     "'delete.deletes.q' is the wrong type 'string'"),
    (SON([("explain", SON([("delete", "c"), ("deletes", [{"q": {}, "limit": 0.5}])]))]), 9,
     "must be 0 or 1. Got 0.5"),
    # update statements
    (SON([("update", "c"), ("updates", [{"q": {"x": 1}, "u": {"$set": {"x": 2}},
                                         "multi": "yes"}])]), 14,
     "'update.updates.multi' is the wrong type 'string'"),
    (SON([("update", "c"), ("updates", [{"q": {"x": 1}, "u": {"$set": {"x": 2}},
                                         "upsert": None}])]), 14,
     "'update.updates.upsert' is the wrong type 'null'"),
    (SON([("update", "c"), ("updates", [{"q": "x", "u": {"$set": {"x": 2}}}])]), 14,
     "'update.updates.q' is the wrong type 'string'"),
    (SON([("update", "c"), ("updates", [{"q": {}, "u": 5}])]), 14,
     "'update.updates.u' is the wrong type 'int'"),
    # aggregate: cursor.batchSize is a safeInt64 >= 0, maxTimeMS as parseMaxTimeMS
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"batchSize": INT64_MIN})]),
     51024, "'aggregate.cursor.batchSize' value must be >= 0"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"batchSize": -1})]), 51024,
     "value must be >= 0"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"batchSize": 1.5})]), 9,
     "Expected an integer"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"batchSize": "5"})]), 14,
     "'aggregate.cursor.batchSize' is the wrong type 'string'"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"batchSize": None})]), 14,
     "is the wrong type 'null'"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", "x")]), 14,
     "'aggregate.cursor' is the wrong type 'string'"),
    (SON([("aggregate", "c"), ("pipeline", "x"), ("cursor", {})]), 14,
     "'aggregate.pipeline' is the wrong type 'string'"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {}), ("maxTimeMS", None)]), 2,
     "maxTimeMS must be a number"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {}), ("maxTimeMS", True)]), 2,
     "maxTimeMS must be a number"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {}), ("maxTimeMS", -1)]), 2,
     "maxTimeMS is out of range"),
    (SON([("aggregate", "c"), ("pipeline", []), ("cursor", {}), ("maxTimeMS", INT64_MAX)]),
     2, "maxTimeMS is out of range"),
    (SON([("find", "c"), ("maxTimeMS", 1.5)]), 2, "maxTimeMS has non-integral value"),
    (SON([("find", "c"), ("maxTimeMS", float("inf"))]), 2, "maxTimeMS is out of range"),
    # getMore and killCursors (checked before any cursor is looked up)
    (SON([("getMore", Int64(12345)), ("collection", "c"), ("batchSize", INT64_MIN)]), 2,
     "Batch size for getMore must be positive"),
    (SON([("getMore", Int64(12345)), ("collection", "c"), ("batchSize", -1)]), 2,
     "Batch size for getMore must be positive, but received: -1"),
    (SON([("getMore", 1e300), ("collection", "c")]), 14,
     "'getMore.getMore' is the wrong type 'double', expected type 'long'"),
    (SON([("getMore", "x"), ("collection", "c")]), 14, "'getMore.getMore' is the wrong type"),
    (SON([("killCursors", "c"), ("cursors", "notarray")]), 14,
     "'killCursors.cursors' is the wrong type 'string', expected type 'array'"),
    (SON([("killCursors", "c"), ("cursors", [1e300])]), 14,
     "'killCursors.cursors.0' is the wrong type 'double'"),
    # writeConcern (FailedToParse, as a shard answered already)
    (SON([("insert", "c"), ("documents", [{"k": 1000, "x": 1}]),
          ("writeConcern", {"w": 1, "wtimeout": float("inf")})]), 9, "wtimeout"),
    (SON([("insert", "c"), ("documents", [{"k": 1000, "x": 1}]),
          ("writeConcern", {"w": 1, "wtimeout": None})]), 9, "wtimeout"),
    (SON([("insert", "c"), ("documents", [{"k": 1000, "x": 1}]),
          ("writeConcern", {"w": 1, "wtimeout": "5"})]), 9, "wtimeout"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": 0}]),
          ("writeConcern", {"w": 1.5})]), 9, "w has to be"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": 0}]),
          ("writeConcern", {"j": "x"})]), 9, "j must be numeric or a boolean value"),
    (SON([("delete", "c"), ("deletes", [{"q": {"x": 1}, "limit": 0}]),
          ("writeConcern", "majority")]), 9, "writeConcern must be an object"),
    # a mode the shards cannot honour: refused whole on both (a proxy used to split the
    # insert and answer it per document)
    (SON([("insert", "c"), ("documents", [{"k": 1000, "x": 1}, {"k": 1001, "x": 1}]),
          ("writeConcern", {"w": "bogusmode"})]), 79,
     "unrecognized write concern mode: bogusmode"),
]


def _answer(db, cmd):
    """(code, message) of cmd's error, or of its first writeError; (None, reply) when
    accepted."""
    try:
        r = db.command(cmd)
    except OperationFailure as e:
        return e.code, str(e)
    if r.get("writeErrors"):
        return r["writeErrors"][0]["code"], r["writeErrors"][0]["errmsg"]
    return None, r


def _snapshot(coll):
    return sorted((d["k"], d["x"]) for d in coll.find({}, {"_id": 0}))


def _check_all(db):
    before = _snapshot(db.c)
    assert len(before) == 30
    for cmd, code, text in CASES:
        got, msg = _answer(db, cmd)
        assert got == code, (dict(cmd), got, msg)
        assert text in msg, (dict(cmd), msg)
        assert _snapshot(db.c) == before, dict(cmd)
    # what stays valid: a limit of 1 as any number type deletes one document, 0 all
    # matching, a bool option given as a number, a long cursor id of an unknown cursor
    assert db.command({"delete": "c", "deletes": [{"q": {"k": 0}, "limit": 1.0}]})["n"] == 1
    assert db.command({"delete": "c", "deletes": [{"q": {"k": 1}, "limit": Int64(1)}]})["n"] == 1
    assert db.command({"delete": "c", "deletes": [{"q": {"k": {"$lt": 5}},
                                                   "limit": 0.0}]})["n"] == 3
    assert len(db.command({"find": "c", "filter": {"k": {"$gte": 25}}, "singleBatch": 1,
                           "maxTimeMS": 5000.0})["cursor"]["firstBatch"]) == 5
    code, _ = _answer(db, {"getMore": Int64(12345), "collection": "c", "batchSize": 5})
    assert code == 43  # CursorNotFound: the arguments were fine


def _fill(db):
    db.c.insert_many([{"k": i, "x": 1} for i in range(30)])


def test_arg_types_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                            serverSelectionTimeoutMS=10000, retryWrites=False)
    try:
        _fill(c.db)
        _check_all(c.db)
    finally:
        c.close()


def test_arg_types_through_a_proxy_sharded(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 15}])
        db = cl.proxy_client(0).db
        _fill(db)
        _check_all(db)
        # both shards hold documents, so "delete all" would have been visible on each
        counts = [cl.shard_client(s).db.c.count_documents({}) for s in cl.shard_ids]
        assert sorted(counts) == [10, 15], counts
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
