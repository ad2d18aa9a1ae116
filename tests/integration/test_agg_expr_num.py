"""Numeric, string, conversion and date expression operators (issue #20) on a shard and
through a proxy to a sharded collection: aggregate $project, an update pipeline
(update_one(f, [{"$set": ...}])) and find's $expr, with MongoDB 6.0's results and error
codes (storage/pipeline_expr_ext.c and its family files, docs/compat.md)."""
import datetime

import pymongo
import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from proxy_helpers import ProxyCluster

D = Decimal128
T = datetime.datetime(2014, 1, 1, 8, 15, 39, 736000)


def docs():
    out = []
    for i in range(40):
        out.append({"_id": i, "x": i + 0.25, "s": f"  item-{i:02d}  ", "n": str(i),
                    "t": T + datetime.timedelta(days=i), "dec": D(f"{i}.125")})
    return out


def check(db):
    db.e.insert_many(docs())
    got = list(db.e.aggregate([{"$sort": {"_id": 1}}, {"$project": {
        "_id": 1,
        "r": {"$round": ["$x", 1]},
        "tr": {"$trunc": ["$dec", 2]},
        "rd": {"$round": ["$dec", 2]},
        "p": {"$pow": ["$_id", 2]},
        "sq": {"$sqrt": {"$multiply": ["$_id", "$_id"]}},
        "trim": {"$trim": {"input": "$s"}},
        "parts": {"$split": [{"$trim": {"input": "$s"}}, "-"]},
        "up": {"$replaceAll": {"input": "$s", "find": " ", "replacement": ""}},
        "m": {"$regexMatch": {"input": "$s", "regex": "ITEM-0", "options": "i"}},
        "num": {"$toInt": "$n"},
        "str": {"$toString": "$_id"},
        "bad": {"$convert": {"input": "$s", "to": "int", "onError": -1}},
        "y": {"$year": "$t"}, "dow": {"$dayOfWeek": "$t"},
        "ds": {"$dateToString": {"date": "$t", "format": "%Y-%m-%d %H:%M", "timezone": "+05:30"}},
    }}]))
    assert len(got) == 40
    for d in got:
        i = d["_id"]
        assert d["r"] == round(i + 0.25, 1)
        assert d["tr"] == D(f"{i}.12") and d["rd"] == D(f"{i}.12")
        assert d["p"] == i * i and d["sq"] == float(i)
        assert d["trim"] == f"item-{i:02d}" and d["parts"] == ["item", f"{i:02d}"]
        assert d["up"] == f"item-{i:02d}"
        assert d["m"] == (i < 10)
        assert d["num"] == i and d["str"] == str(i) and d["bad"] == -1
        t = T + datetime.timedelta(days=i)
        assert d["y"] == t.year
        assert d["dow"] == (t.isoweekday() % 7) + 1
        assert d["ds"] == (t + datetime.timedelta(hours=5, minutes=30)).strftime("%Y-%m-%d %H:%M")

    # find's $expr
    ids = sorted(d["_id"] for d in db.e.find(
        {"$expr": {"$eq": [{"$round": ["$x", 0]}, {"$toDouble": "$n"}]}}, {"_id": 1}))
    assert ids == list(range(40))  # x = i + 0.25 rounds to i
    ids = sorted(d["_id"] for d in db.e.find(
        {"$expr": {"$and": [{"$regexMatch": {"input": "$s", "regex": "-3[0-9]"}},
                            {"$gte": [{"$strLenCP": "$s"}, 11]}]}}, {"_id": 1}))
    assert ids == list(range(30, 40))

    # an update pipeline
    r = db.e.update_one({"_id": 7}, [{"$set": {
        "r2": {"$round": [{"$multiply": ["$x", 3]}, 0]},
        "idx": {"$indexOfCP": ["$s", "7"]},
        "l": {"$toLong": "$n"},
        "dec2": {"$toDecimal": "$x"},
        "ok": {"$toBool": "$n"},
        "parts": {"$dateToParts": {"date": "$t"}},
    }}])
    assert r.modified_count == 1
    doc = db.e.find_one({"_id": 7})
    assert doc["r2"] == 22.0 and doc["idx"] == 8 and doc["l"] == Int64(7)
    assert doc["dec2"] == D("7.25000000000000") and doc["ok"] is True
    assert doc["parts"] == {"year": 2014, "month": 1, "day": 8, "hour": 8, "minute": 15,
                            "second": 39, "millisecond": 736}

    # errors: MongoDB's codes, in aggregate, find and update alike
    def agg_err(expr):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            list(db.e.aggregate([{"$project": {"v": expr}}]))
        return e.value.code

    assert agg_err({"$toInt": "$s"}) == 241
    assert agg_err({"$sqrt": -1}) == 28714
    assert agg_err({"$ln": 0}) == 28766
    assert agg_err({"$round": ["$x", 101]}) == 51083
    assert agg_err({"$split": ["$s", ""]}) == 40087
    assert agg_err({"$toDate": "not a date"}) == 241
    assert agg_err({"$year": {"date": "$t", "timezone": "Europe/Paris"}}) == 238
    assert agg_err({"$sin": 1}) == 168  # an operator still not built
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        list(db.e.find({"$expr": {"$toInt": "$s"}}))
    assert e.value.code == 241
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        db.e.update_one({"_id": 3}, [{"$set": {"v": {"$pow": [0, -1]}}}])
    assert e.value.code == 28764
    assert "v" not in db.e.find_one({"_id": 3})

    # conversions of special values
    (p,) = db.e.aggregate([{"$match": {"_id": 0}}, {"$project": {
        "_id": 0,
        "oid": {"$toObjectId": "5ab9cbfa31c2ab715d42129e"},
        "od": {"$toDate": {"$toObjectId": "5ab9cbfa31c2ab715d42129e"}},
        "nan": {"$convert": {"input": float("nan"), "to": "int", "onError": "nan"}},
        "nul": {"$convert": {"input": None, "to": "int", "onNull": "null!"}},
        "d": {"$toDate": "2018-03-20T11:00:06.575+01:00"},
        "rf": {"$regexFind": {"input": "cafétéria", "regex": "t(é)"}},
    }}])
    assert p["oid"] == ObjectId("5ab9cbfa31c2ab715d42129e")
    assert p["od"] == datetime.datetime(2018, 3, 27, 4, 43, 38)
    assert p["nan"] == "nan" and p["nul"] == "null!"
    assert p["d"] == datetime.datetime(2018, 3, 20, 10, 0, 6, 575000)
    assert p["rf"] == {"match": "té", "idx": 4, "captures": ["é"]}


def test_expr_operators_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check(c.exprnum)
    finally:
        c.close()


def test_expr_operators_through_a_proxy_over_every_shard(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("exprnum.e", {"_id": 1}, split_points=[{"_id": 20}])
        check(cl.proxy_client(0).exprnum)
    finally:
        cl.close()
