"""The bitwise query operators $bitsAllSet, $bitsAllClear, $bitsAnySet and $bitsAnyClear
(MongoDB 6.0, expression_parser.cpp parseBitTest and BitTestMatchExpression): a numeric
bitmask, an array of bit positions or a BinData bitmask; numbers tested as 64-bit two's
complement (sign-extended past bit 63), BinData bytes little-endian; non-integral doubles,
NaN, out-of-range doubles and other types never match. Bad masks: 9 FailedToParse
(numbers) or 2 BadValue. On a shard, and through a proxy to a sharded collection."""
import pymongo
import pytest
from bson import Binary, Decimal128, Int64
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

DOCS = [
    {"_id": 1, "a": 54},                    # 0b110110
    {"_id": 2, "a": 20},                    # 0b010100
    {"_id": 3, "a": 20.0},
    {"_id": 4, "a": Binary(b"\x66", 0)},    # 0b01100110
    {"_id": 5, "a": -1},
    {"_id": 6, "a": 20.5},                  # not integral: never matches
    {"_id": 7, "a": Decimal128("20")},
    {"_id": 8, "a": [54, 1]},
    {"_id": 9, "a": "text"},
    {"_id": 10, "a": float("nan")},
    {"_id": 11, "a": Int64(-2)},             # ...1110
    {"_id": 12, "a": 1e19},                 # beyond int64: never matches
    {"_id": 13},
]

CASES = [
    ({"$bitsAllClear": [1, 5]}, [2, 3, 7, 8]),
    ({"$bitsAllClear": 35}, [2, 3, 7]),
    ({"$bitsAllClear": Binary(b"\x20", 0)}, [2, 3, 7, 8]),
    ({"$bitsAllSet": [1, 5]}, [1, 4, 5, 8, 11]),
    ({"$bitsAllSet": 50}, [1, 5, 8, 11]),
    ({"$bitsAllSet": Binary(b"\x32", 0)}, [1, 5, 8, 11]),
    ({"$bitsAnySet": [1, 5]}, [1, 4, 5, 8, 11]),
    ({"$bitsAnyClear": [1, 5]}, [2, 3, 7, 8]),
    ({"$bitsAnyClear": 35}, [1, 2, 3, 4, 7, 8, 11]),
    # sign extension: positions past 63 are the sign bit for numbers, 0 for BinData
    ({"$bitsAllSet": [0, 63, 200]}, [5]),
    ({"$bitsAllSet": [200]}, [5, 11]),
    ({"$bitsAnyClear": [0]}, [1, 2, 3, 4, 7, 8, 11]),
    # an empty mask: All* match every number and BinData, Any* none
    ({"$bitsAllSet": []}, [1, 2, 3, 4, 5, 7, 8, 11]),
    ({"$bitsAllClear": 0}, [1, 2, 3, 4, 5, 7, 8, 11]),
    ({"$bitsAnySet": Binary(b"", 0)}, []),
    # positions given as integral doubles / longs
    ({"$bitsAllSet": [1.0, Int64(5)]}, [1, 4, 5, 8, 11]),
    ({"$bitsAllSet": 54.0}, [1, 5, 8, 11]),
]


def _check(coll):
    coll.insert_many(DOCS)
    for q, want in CASES:
        got = sorted(d["_id"] for d in coll.find({"a": q}))
        assert got == want, (q, got)
        n = coll.count_documents({"a": {"$not": q}})
        assert n == len(DOCS) - len(want), (q, n)
    # in $elemMatch (value form) and in an aggregate $match
    assert [d["_id"] for d in coll.find({"a": {"$elemMatch": {"$bitsAllSet": 1}}})] == [8]
    got = sorted(d["_id"] for d in coll.aggregate([{"$match": {"a": {"$bitsAnySet": 2}}}]))
    assert got == [1, 4, 5, 8, 11], got


def _errors(coll):
    cases = [
        ({"$bitsAllSet": -1}, 9, "Expected a positive number in: $bitsAllSet: -1"),
        ({"$bitsAllClear": 1.5}, 9, "Expected an integer: $bitsAllClear: 1.5"),
        ({"$bitsAnySet": float("nan")}, 9, "Expected an integer, but found NaN in"),
        ({"$bitsAnySet": 1e19}, 9, "Cannot represent as a 64-bit integer"),
        ({"$bitsAnyClear": "x"}, 2, "takes an Array, a number, or a BinData"),
        ({"$bitsAllSet": [-1]}, 2, "bit positions must be >= 0"),
        ({"$bitsAllSet": [1.5]}, 2, "bit positions must be an integer"),
        ({"$bitsAllSet": ["a"]}, 2, "bit positions must be an integer"),
        ({"$bitsAllSet": [float("nan")]}, 2, "bit positions cannot take a NaN"),
        ({"$bitsAllSet": [Int64(2 ** 31)]}, 2, "cannot be represented as a 32-bit"),
        ({"$bitsAllSet": [3e9]}, 2, "cannot be represented as a 32-bit"),
        ({"$bitsAnything": 1}, 2, "unknown operator: $bitsAnything"),
    ]
    for q, code, msg in cases:
        with pytest.raises(OperationFailure) as e:
            list(coll.find({"a": q}))
        assert e.value.code == code, (q, e.value.details)
        assert msg in e.value.details["errmsg"], (q, e.value.details)


def test_on_a_shard(shard):
    _, port = shard
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        _check(client.bits.c)
        _errors(client.bits.c)
    finally:
        client.close()


def test_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("bits.s", {"_id": 1}, split_points=[{"_id": 6}])
        db = cl.proxy_client(0).bits
        _check(db.s)
        _errors(db.s)
    finally:
        cl.close()
