"""Decimal128 values compare exactly (issue #20, "everything accepted is honoured").

MongoDB 6.0 compares Decimal128 by exact value (mongo/base/compare_numbers.h compareDecimals,
compareDecimalToDouble / ToLong / ToInt): NumberDecimal("1") and NumberDecimal("1.000...001")
are distinct values for find, sort, distinct, $group and count, with or without an index,
while NumberDecimal("1.0") == NumberDecimal("1") == 1 == 1.0 == NumberLong(1).
"""
import pymongo
import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64

D = Decimal128

ONE = D("1")
ONE_PLUS = D("1.000000000000000000001")   # closer to 1 than 1 part in 2^64
ONE_MINUS = D("0.999999999999999999999")
TENTH = D("0.1")                            # not the double 0.1


def docs():
    return [
        {"_id": 1, "amount": ONE},
        {"_id": 2, "amount": ONE_PLUS},
        {"_id": 3, "amount": ONE_MINUS},
        {"_id": 4, "amount": D("1.000")},
        {"_id": 5, "amount": 1.0},
        {"_id": 6, "amount": Int64(1)},
        {"_id": 7, "amount": TENTH},
        {"_id": 8, "amount": 0.1},
        {"_id": 9, "amount": D("-0")},
        {"_id": 10, "amount": D("NaN")},
        {"_id": 11, "amount": D("Infinity")},
        {"_id": 12, "amount": D("-Infinity")},
        {"_id": 13, "amount": D("12345678901234567890123456789012.34")},
        {"_id": 14, "amount": D("12345678901234567890123456789012.35")},
    ]


@pytest.fixture(params=["noindex", "index"])
def coll(shard, request):
    _, port = shard
    c = pymongo.MongoClient(port=port, directConnection=True)
    col = c.pay.tx
    col.insert_many(docs())
    if request.param == "index":
        col.create_index("amount")
    yield col
    c.close()


def ids(cur):
    return sorted(d["_id"] for d in cur)


def test_equality(coll):
    # 1 == 1.000 == 1.0 == NumberLong(1), but not 1.000...001 nor 0.999...999
    assert ids(coll.find({"amount": ONE})) == [1, 4, 5, 6]
    assert ids(coll.find({"amount": 1})) == [1, 4, 5, 6]
    assert ids(coll.find({"amount": ONE_PLUS})) == [2]
    assert ids(coll.find({"amount": ONE_MINUS})) == [3]
    assert coll.count_documents({"amount": ONE}) == 4
    assert ids(coll.find({"amount": {"$in": [ONE_PLUS, ONE_MINUS]}})) == [2, 3]
    # decimal 0.1 is not the double 0.1 (0.1000000000000000055511151231257827...)
    assert ids(coll.find({"amount": TENTH})) == [7]
    assert ids(coll.find({"amount": 0.1})) == [8]
    assert ids(coll.find({"amount": D("0")})) == [9]
    assert ids(coll.find({"amount": D("NaN")})) == [10]
    assert ids(coll.find({"amount": float("nan")})) == [10]
    assert ids(coll.find({"amount": D("12345678901234567890123456789012.34")})) == [13]


def test_ranges(coll):
    assert ids(coll.find({"amount": {"$gt": ONE}})) == [2, 11, 13, 14]
    assert ids(coll.find({"amount": {"$gte": ONE, "$lt": ONE_PLUS}})) == [1, 4, 5, 6]
    assert ids(coll.find({"amount": {"$lt": ONE, "$gt": 0.5}})) == [3]
    assert ids(coll.find({"amount": {"$gt": TENTH, "$lt": 0.2}})) == [8]
    assert ids(coll.find({"amount": {"$lt": 0.1, "$gt": 0}})) == [7]
    assert ids(coll.find({"amount": {"$gt": D("12345678901234567890123456789012.34")}})) == [
        11, 14]
    assert coll.count_documents({"amount": {"$gt": ONE_MINUS, "$lt": ONE_PLUS}}) == 4


def test_sort(coll):
    order = [d["_id"] for d in coll.find({}, sort=[("amount", 1), ("_id", 1)])]
    assert order == [10, 12, 9, 7, 8, 3, 1, 4, 5, 6, 2, 13, 14, 11]
    order = [d["_id"] for d in coll.find({}, sort=[("amount", -1), ("_id", 1)])]
    assert order == [11, 14, 13, 2, 1, 4, 5, 6, 3, 8, 7, 9, 12, 10]


def test_distinct_and_group(coll):
    vals = coll.distinct("amount")
    assert len(vals) == 11, vals
    groups = list(coll.aggregate([{"$group": {"_id": "$amount", "n": {"$sum": 1}}}]))
    assert len(groups) == 11, groups
    counts = sorted(g["n"] for g in groups)
    assert counts == [1] * 10 + [4]
    s = list(coll.aggregate([{"$group": {"_id": None, "s": {"$addToSet": "$amount"}}}]))
    assert len(s[0]["s"]) == 11


def test_proxy_routes_and_merges_decimal_shard_key(start_role, tmp_path):
    """Range sharding on a Decimal128 key split at 1.000000000000000000001. Chunk
    membership is the op-version-4 order (a decimal through its nearest long double,
    docs/compat.md, test_decimal_shardkey.py): 1, 1.000000000000000000001 and
    0.999999999999999999999 tie there, so all the ones are in the split point's chunk; each
    document lands on its chunk's shard, and queries, sort and the proxy's merge sort of a
    cross-shard find are exact."""
    from proxy_helpers import ProxyCluster

    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        a, b = cl.shard_ids
        cl.shard_collection("pay.s", {"amount": 1}, split_points=[{"amount": ONE_PLUS}],
                            shards=[a, b])
        coll = cl.proxy_client()["pay"]["s"]
        want = {1: b, 2: b, 3: b, 4: b, 5: b, 6: b, 7: a, 8: a, 9: a, 10: a, 11: b, 12: a,
                13: b, 14: b}
        coll.insert_many(docs())
        for sid in (a, b):
            held = sorted(d["_id"] for d in cl.shard_client(sid)["pay"]["s"].find({}))
            assert held == sorted(i for i, s in want.items() if s == sid), sid
        assert ids(coll.find({"amount": ONE})) == [1, 4, 5, 6]
        assert ids(coll.find({"amount": ONE_PLUS})) == [2]
        assert ids(coll.find({"amount": {"$gte": ONE_PLUS}})) == [2, 11, 13, 14]
        order = [d["_id"] for d in coll.find({}, sort=[("amount", 1), ("_id", 1)])]
        assert order == [10, 12, 9, 7, 8, 3, 1, 4, 5, 6, 2, 13, 14, 11]
        assert len(coll.distinct("amount")) == 11
    finally:
        cl.close()
