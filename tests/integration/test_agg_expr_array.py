"""The aggregation expression operators for variables, arrays, sets and objects (issue #20,
MongoDB 6.0): $let, $map, $filter, $reduce, $slice, $range, $zip, $first/$last, the set
operators, $mergeObjects, $objectToArray/$arrayToObject, $getField/$setField/$unsetField,
used in aggregate $project, in a pipeline update and in find's $expr, on a shard and through
a proxy to an unsharded and to a sharded collection (the proxy's merger evaluates the stages
after a $sort). Bad arguments answer MongoDB's codes."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster
from test_current_op import Slow, wait_op

# one expression that reads no document while it runs for hours: 10^5 $range arrays of
# 10^5 elements built one after the other (10^10 elements)
EXPENSIVE = [{"$project": {"_id": 0, "r": {"$reduce": {
    "input": {"$range": [0, 100000]}, "initialValue": 0,
    "in": {"$add": ["$$value", {"$size": {"$range": [0, 100000]}}]}}}}}]

DOCS = [{"_id": i, "q": [i, i + 1, i + 2], "tags": ["a", "b"] if i % 2 else ["b", "c"],
         "d": {"k": i, "w": "x"}} for i in range(6)]


def _project(coll):
    return list(coll.aggregate([
        {"$sort": {"_id": 1}},
        {"$project": {
            "_id": 1,
            "m": {"$map": {"input": "$q", "as": "v", "in": {"$multiply": ["$$v", 10]}}},
            "f": {"$filter": {"input": "$q", "cond": {"$gt": ["$$this", 2]}, "limit": 1}},
            "r": {"$reduce": {"input": "$q", "initialValue": 0,
                              "in": {"$add": ["$$value", "$$this"]}}},
            "l": {"$let": {"vars": {"n": {"$size": "$q"}}, "in": {"$range": [0, "$$n"]}}},
            "s": {"$slice": ["$q", -2]},
            "z": {"$zip": {"inputs": ["$q", "$tags"]}},
            "fl": [{"$first": "$q"}, {"$last": "$q"}],
            "u": {"$setUnion": ["$tags", ["z"]]},
            "i": {"$setIntersection": ["$tags", ["a", "c"]]},
            "o": {"$arrayToObject": {"$map": {"input": {"$objectToArray": "$d"},
                                               "in": ["$$this.k", {"$toString": "$$this.v"}]}}},
            "g": {"$getField": {"field": "k", "input": "$d"}},
            "mo": {"$mergeObjects": ["$d", {"w": "y"}]},
            "mx": {"$maxN": {"n": 2, "input": "$q"}},
            "sa": {"$sortArray": {"input": "$tags", "sortBy": -1}},
        }}]))


def _want(i):
    tags = ["a", "b"] if i % 2 else ["b", "c"]
    return {"_id": i, "m": [10 * i, 10 * i + 10, 10 * i + 20],
            "f": [x for x in (i, i + 1, i + 2) if x > 2][:1],
            "r": 3 * i + 3, "l": [0, 1, 2], "s": [i + 1, i + 2],
            "z": [[i, tags[0]], [i + 1, tags[1]]], "fl": [i, i + 2],
            "u": sorted(set(tags) | {"z"}), "i": sorted(set(tags) & {"a", "c"}),
            "o": {"k": str(i), "w": "x"}, "g": i, "mo": {"k": i, "w": "y"},
            "mx": [i + 2, i + 1], "sa": sorted(tags, reverse=True)}


def _errors(db, coll):
    cases = [
        ({"$map": {"input": "$q"}}, 16882),
        ({"$range": [0, 2147483647]}, 146),
        ({"$zip": {"inputs": ["$q", 1]}}, 34468),
        ({"$let": {"vars": {"Bad": 1}, "in": 1}}, 16867),
        ("$$this", 17276),
        ({"$setField": {"field": "$a", "input": {}, "value": 1}}, 4161108),
        ({"$mergeObjects": [1]}, 40400),
        ({"$maxN": {"n": 0, "input": [1, 2, 3]}}, 5787908),
        ({"$bsonSize": "$$ROOT"}, 168),  # not built: refused clearly
    ]
    for expr, code in cases:
        with pytest.raises(OperationFailure) as ei:
            list(db[coll].aggregate([{"$project": {"x": expr}}]))
        assert ei.value.code == code, (expr, ei.value)
    # a NUL byte: a string literal keeps it (it was cut at the NUL, so $arrayToObject made
    # the key "a" of "a\0x" and overwrote a; a fresh user's find), a key refuses it
    got = list(db[coll].aggregate([{"$limit": 1}, {"$project": {
        "_id": 0, "s": "a\x00x", "c": {"$concat": ["a\x00x", "y"]}}}]))
    assert got == [{"s": "a\x00x", "c": "a\x00xy"}], got
    for expr in ({"$arrayToObject": [[["a", 1], ["a\x00x", 2]]]},
                 {"$setField": {"field": "b\x00y", "input": {}, "value": 1}}):
        with pytest.raises(OperationFailure) as ei:
            list(db[coll].aggregate([{"$project": {"x": expr}}]))
        assert "null byte" in str(ei.value), (expr, ei.value)


def _check(db, coll):
    c = db[coll]
    c.insert_many(DOCS)
    assert _project(c) == [_want(i) for i in range(6)]

    # find's $expr
    got = c.find({"$expr": {"$anyElementTrue": [
        {"$map": {"input": "$q", "in": {"$eq": ["$$this", 4]}}}]}}, sort=[("_id", 1)])
    assert [d["_id"] for d in got] == [2, 3, 4]
    got = c.find({"$expr": {"$setIsSubset": [["a"], "$tags"]}}, sort=[("_id", 1)])
    assert [d["_id"] for d in got] == [1, 3, 5]
    # $stdDevPop / $stdDevSamp, accumulators (over every shard's documents through a proxy)
    # and expressions
    g = list(c.aggregate([{"$group": {"_id": None, "p": {"$stdDevPop": "$_id"},
                                      "s": {"$stdDevSamp": "$d.k"}, "n": {"$stdDevSamp": "$d.w"}}}]))
    assert g == [{"_id": None, "p": pytest.approx((17.5 / 6) ** 0.5, rel=1e-15),
                  "s": pytest.approx((17.5 / 5) ** 0.5, rel=1e-15), "n": None}]
    got = c.aggregate([{"$sort": {"_id": 1}}, {"$limit": 1},
                       {"$project": {"_id": 0, "p": {"$stdDevPop": "$q"},
                                     "s": {"$stdDevSamp": ["$_id", 2, "x"]}}}])
    assert list(got) == [{"p": pytest.approx((2 / 3) ** 0.5, rel=1e-15), "s": 2 ** 0.5}]

    # a pipeline update
    r = c.update_one({"_id": 2}, [{"$set": {
        "q": {"$reverseArray": {"$filter": {"input": "$q", "as": "x",
                                            "cond": {"$ne": ["$$x", 3]}}}},
        "d": {"$setField": {"field": "n.m", "input": "$d", "value": "$$ROOT._id"}},
        "tags": {"$setDifference": ["$tags", ["b"]]}}}])
    assert r.modified_count == 1
    assert c.find_one({"_id": 2}) == {"_id": 2, "q": [4, 2], "tags": ["c"],
                                      "d": {"k": 2, "w": "x", "n.m": 2}}
    r = c.update_many({}, [{"$set": {"d": {"$unsetField": {"field": "w", "input": "$d"}}}}])
    assert r.modified_count == 6
    assert [d["d"] for d in c.find({}, sort=[("_id", 1)])][:2] == [{"k": 0}, {"k": 1}]

    _errors(db, coll)


def _merge_reduce(coll):
    """$mergeObjects in a $reduce grows the accumulator in place (a field index kept
    between elements): MongoDB's field order (first occurrence's position, last value),
    the accumulator read twice (copied), null operands, initialValue's own fields, and a
    result that is not the accumulator (the index must not be reused)."""
    coll.insert_one({"_id": "m"})
    one = {"$arrayToObject": [[[{"$toString": {"$mod": ["$$this", 3]}}, "$$this"]]]}
    exprs = {
        "a": {"$reduce": {"input": {"$range": [0, 7]}, "initialValue": {"z": 1, "1": "x"},
                          "in": {"$mergeObjects": ["$$value", one, None]}}},
        "b": {"$reduce": {"input": {"$range": [0, 7]}, "initialValue": {},
                          "in": {"$mergeObjects": [{"$mergeObjects": ["$$value", one]},
                                                   {"n": "$$this"}]}}},
        "c": {"$reduce": {"input": {"$range": [0, 5]}, "initialValue": {},
                          "in": {"$mergeObjects": ["$$value", one,
                                                   {"s": {"$size": {"$objectToArray":
                                                                    "$$value"}}}]}}},
        "d": {"$reduce": {"input": {"$range": [0, 6]}, "initialValue": None,
                          "in": {"$mergeObjects": ["$$value", one]}}},
        "e": {"$reduce": {"input": {"$range": [0, 6]}, "initialValue": {},
                          "in": {"$arrayToObject": {"$objectToArray": {
                              "$mergeObjects": ["$$value", one]}}}}},
        "f": {"$size": {"$objectToArray": {"$reduce": {
            "input": {"$range": [0, 20000]}, "initialValue": {},
            "in": {"$mergeObjects": ["$$value", {"$arrayToObject": [[[
                {"$toString": "$$this"}, 1]]]}]}}}}},
    }
    got = list(coll.aggregate([{"$match": {"_id": "m"}}, {"$project": exprs}]))[0]
    assert got == {"_id": "m", "a": {"z": 1, "1": 4, "0": 6, "2": 5},
                   "b": {"0": 6, "n": 6, "1": 4, "2": 5},
                   "c": {"0": 3, "s": 4, "1": 4, "2": 2},
                   "d": {"0": 3, "1": 4, "2": 5},
                   "e": {"0": 3, "1": 4, "2": 5}, "f": 20000}, got
    # a $mergeObjects operand that is not an object: 40400, in place or not
    with pytest.raises(OperationFailure) as e:
        list(coll.aggregate([{"$match": {"_id": "m"}}, {"$project": {"r": {"$reduce": {
            "input": [1, 2], "initialValue": {},
            "in": {"$mergeObjects": ["$$value", "$$this"]}}}}}]))
    assert e.value.code == 40400, e.value.details
    coll.delete_one({"_id": "m"})


def _max_time(coll):
    """maxTimeMS stops one long expression evaluation: the loops of the operators check
    the command's deadline (no document is read meanwhile): 50 MaxTimeMSExpired."""
    coll.insert_one({"_id": "one"})
    with pytest.raises(OperationFailure) as e:
        list(coll.aggregate([{"$match": {"_id": "one"}}] + EXPENSIVE, maxTimeMS=200))
    assert e.value.code == 50, e.value.details
    assert e.value.details["codeName"] == "MaxTimeMSExpired"
    # in a $map over string work too
    with pytest.raises(OperationFailure) as e:
        list(coll.aggregate([{"$match": {"_id": "one"}}, {"$project": {"r": {"$map": {
            "input": {"$range": [0, 100000]},
            "in": {"$size": {"$split": [{"$reduce": {"input": {"$range": [0, 2000]},
                                                     "initialValue": "", "in": {
                                                         "$concat": ["$$value", "a,"]}}},
                                        ","]}}}}}}], maxTimeMS=200))
    assert e.value.code == 50, e.value.details
    # a loop whose body grows expensive ($mergeObjects copying an accumulator read twice:
    # quadratic) is interrupted within one body's cost, not every 1,024 bodies
    one = {"$arrayToObject": [[[{"$toString": "$$this"}, 1]]]}
    with pytest.raises(OperationFailure) as e:
        list(coll.aggregate([{"$match": {"_id": "one"}}, {"$project": {"r": {"$reduce": {
            "input": {"$range": [0, 1000000]}, "initialValue": {},
            "in": {"$mergeObjects": ["$$value", one, {"$cond": [
                {"$eq": [{"$type": "$$value"}, "missing"]}, "$$value", {}]}]}}}}}],
            maxTimeMS=1000))
    assert e.value.code == 50, e.value.details
    # the same with the work nested: each element's body is a loop of its own
    with pytest.raises(OperationFailure) as e:
        list(coll.aggregate([{"$match": {"_id": "one"}}, {"$project": {"r": {"$map": {
            "input": {"$range": [0, 1000]}, "as": "o", "in": {"$reduce": {
                "input": {"$range": [0, 1000000]}, "initialValue": {},
                "in": {"$mergeObjects": ["$$value", one]}}}}}}}], maxTimeMS=1000))
    assert e.value.code == 50, e.value.details
    coll.delete_one({"_id": "one"})


def test_on_a_shard(shard):
    _, port = shard
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                 socketTimeoutMS=120000)
    try:
        _check(client.exparr, "c")
        _merge_reduce(client.exparr.c)
        _max_time(client.exparr.c)
        # killOp interrupts an expression as well: 11601 Interrupted
        t = Slow(lambda: list(client.exparr.c.aggregate(EXPENSIVE, comment="slow-expr")))
        client.exparr.c.insert_one({"_id": "one"})
        t.start()
        op = wait_op(client.admin, {"command.comment": "slow-expr"}, "the aggregation")
        client.admin.command({"killOp": 1, "op": op["opid"]})
        t.join(60)
        assert not t.is_alive(), "the killed expression is still running"
        assert isinstance(t.exc, OperationFailure) and t.exc.code == 11601, repr(t.exc)
        assert client.exparr.c.count_documents({}) == 7  # the shard still serves
    finally:
        client.close()


def test_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("exparr.s", {"_id": 1}, split_points=[{"_id": 3}])
        db = cl.proxy_client(0).exparr
        _check(db, "c")  # unsharded: the primary shard runs it all
        _check(db, "s")  # sharded: the $project after $sort runs on the proxy's merger
        _merge_reduce(db.s)
        _max_time(db.s)  # the shard's 50 reaches the client
    finally:
        cl.close()
