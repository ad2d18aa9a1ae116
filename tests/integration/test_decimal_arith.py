"""Decimal128 arithmetic (issue #20) on a shard and through a proxy to a sharded collection:
$group $sum/$avg of Decimal128 amounts are exact Decimal128 totals over every shard's
documents, expressions give Decimal128 results, and $inc/$mul on a Decimal128 balance stay
exact (MongoDB 6.0's semantics: storage/decimal.h, docs/compat.md)."""
import datetime
import decimal

import pymongo
import pytest
from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64

from proxy_helpers import ProxyCluster

D = Decimal128
CTX = create_decimal128_context()  # 34 digits, half even: Decimal128's arithmetic


def accounts():
    docs = []
    for i in range(120):
        docs.append({"_id": i, "acct": i % 3, "amt": D(f"{i}.{(i * 7) % 100:02d}")})
    return docs


def want_totals(docs):
    out = {}
    for d in docs:
        s, n = out.get(d["acct"], (decimal.Decimal(0), 0))
        out[d["acct"]] = (CTX.add(s, d["amt"].to_decimal()), n + 1)
    return {k: (D(s), D(CTX.divide(s, decimal.Decimal(n)))) for k, (s, n) in out.items()}


def check(db):
    docs = accounts()
    db.ledger.insert_many(docs)
    got = {g["_id"]: (g["s"], g["a"]) for g in db.ledger.aggregate(
        [{"$group": {"_id": "$acct", "s": {"$sum": "$amt"}, "a": {"$avg": "$amt"}}}])}
    want = want_totals(docs)
    assert got == want
    for s, a in got.values():  # Decimal128 results, digit for digit (equality is on the bits)
        assert isinstance(s, Decimal128) and isinstance(a, Decimal128)

    # 0.1 + 0.2 is 0.3 in decimal, the two values on different shards
    db.small.insert_many([{"_id": 1, "v": D("0.1")}, {"_id": 90, "v": D("0.2")}])
    (g,) = db.small.aggregate([{"$group": {"_id": None, "s": {"$sum": "$v"},
                                           "a": {"$avg": "$v"}}}])
    assert g == {"_id": None, "s": D("0.3"), "a": D("0.15")}

    # widening: ints and longs join a decimal total exactly; a double by its exact value
    db.mixed.insert_many([{"_id": 1, "g": "i", "v": D("1.5")}, {"_id": 2, "g": "i", "v": 2},
                          {"_id": 91, "g": "i", "v": Int64(3)},
                          {"_id": 3, "g": "d", "v": D("1")}, {"_id": 92, "g": "d", "v": 0.1},
                          {"_id": 4, "g": "n", "v": 0.1}, {"_id": 93, "g": "n", "v": 0.2}])
    got = {g["_id"]: g["s"] for g in db.mixed.aggregate(
        [{"$group": {"_id": "$g", "s": {"$sum": "$v"}}}])}
    assert got == {"i": D("6.5"), "d": D("1.100000000000000005551115123125783"),
                   "n": 0.30000000000000004}

    # expressions over a decimal field (the proxy runs $project after its reads)
    (p,) = db.small.aggregate([{"$match": {"_id": 1}}, {"$project": {
        "_id": 0, "add": {"$add": ["$v", 2]}, "mul": {"$multiply": ["$v", 3]},
        "div": {"$divide": [D("1"), 3]}, "sub": {"$subtract": ["$v", D("0.30")]},
        "sum": {"$sum": ["$v", D("0.2")]}}}])
    assert p == {"add": D("2.1"), "mul": D("0.3"),
                 "div": D("0.3333333333333333333333333333333333"), "sub": D("-0.20"),
                 "sum": D("0.3")}

    # $inc / $mul on a Decimal128 balance
    db.ledger.insert_one({"_id": 1000, "acct": 9, "bal": D("100.10")})
    for _ in range(3):
        db.ledger.update_one({"_id": 1000}, {"$inc": {"bal": D("-0.15")}})
    assert db.ledger.find_one({"_id": 1000})["bal"] == D("99.65")
    db.ledger.update_one({"_id": 1000}, {"$inc": {"bal": 1}})
    assert db.ledger.find_one({"_id": 1000})["bal"] == D("100.65")
    db.ledger.update_one({"_id": 1000}, {"$mul": {"bal": D("2")}, "$inc": {"fee": D("0.01")}})
    doc = db.ledger.find_one({"_id": 1000})
    assert doc["bal"] == D("201.30") and doc["fee"] == D("0.01")
    # a double increment is Decimal128(double): 15 significant digits
    db.ledger.update_one({"_id": 1000}, {"$inc": {"bal": 0.1}})
    assert db.ledger.find_one({"_id": 1000})["bal"] == D("201.400000000000000")


def test_decimal_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check(c.dec)
    finally:
        c.close()


def test_decimal_through_a_proxy_over_every_shard(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        for coll in ("ledger", "small", "mixed"):
            cl.shard_collection(f"dec.{coll}", {"_id": 1}, split_points=[{"_id": 60}])
        check(cl.proxy_client(0).dec)
    finally:
        cl.close()


def test_add_overflow_and_arithmetic_no_ops_as_mongod(shard):
    """$add over an int64 overflow continues in double from the total before it (mongod's
    AddState), a date overflow is 15; an $inc/$mul whose result equals the stored value
    (SafeNum::isIdentical: decimals numerically) leaves the field and its digits alone."""
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.dec_noop
    db.c.insert_one({"_id": 1, "bal": D("1.5"), "p": D("-7.9E+3"), "z": D("-0"),
                     "d": -0.0})
    big = Int64(2**63 - 1)

    def add(*args):
        return next(db.c.aggregate([{"$project": {"_id": 0, "v": {"$add": list(args)}}}]))["v"]

    assert add(560, big, D("0.00301")) == D("9223372036854775808.00301")
    assert add(big, big) == float(2**64)
    assert add(big, 1) == 9.223372036854775808e18
    assert add(Int64(-2**63), -1) == -9.223372036854775808e18
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        add(datetime.datetime(2020, 1, 1), big)
    assert e.value.code == 15
    r = db.c.update_one({"_id": 1}, {"$inc": {"bal": D("0.00")}})
    assert r.modified_count == 0
    r = db.c.update_one({"_id": 1}, {"$mul": {"p": 1.0}, "$inc": {"z": 0, "d": 0}})
    assert r.modified_count == 0
    doc = db.c.find_one({"_id": 1})
    assert (doc["bal"], doc["p"], doc["z"]) == (D("1.5"), D("-7.9E+3"), D("-0"))
    assert str(doc["d"]) == "-0.0"
    assert db.c.update_one({"_id": 1}, {"$inc": {"bal": D("0.01")}}).modified_count == 1
    assert db.c.find_one({"_id": 1})["bal"] == D("1.51")


def test_date_minus_a_number_as_mongod(shard):
    """$subtract [date, n]: Value::coerceToLong truncates a double (1.7 ms is 1 ms), takes
    a long as it is (no rounding through a double), and a duration that cannot be negated
    (NaN, out of range) is 159 DurationOverflow."""
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.dec_date
    t = datetime.datetime(2020, 1, 1)
    db.c.insert_one({"_id": 1, "t": t})

    def sub(n):
        return next(db.c.aggregate([{"$project": {"_id": 0,
                                                  "v": {"$subtract": ["$t", n]}}}]))["v"]

    ms = datetime.timedelta(milliseconds=1)
    assert sub(1.7) == t - ms
    assert sub(-1.7) == t + ms
    epoch = datetime.datetime(1970, 1, 1)
    far = next(db.c.aggregate([{"$project": {"_id": 0, "v": {"$subtract": [
        {"$subtract": ["$t", Int64(2**53 + 1)]}, epoch]}}}]))["v"]
    assert far == 1577836800000 - (2**53 + 1)  # exact, not rounded through a double
    for bad in (float("nan"), 1e300, D("NaN")):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            sub(bad)
        assert e.value.code == 159, bad
