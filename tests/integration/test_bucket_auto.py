"""$bucketAuto (issue #20, MongoDB 6.0's DocumentSourceBucketAuto) on a shard, through a
proxy to a sharded collection whose documents lie on three shards (the proxy runs the stage
over every shard's documents) and through a proxy to an unsharded collection (passed to its
primary shard): exact buckets, equal values never split, fewer distinct values than buckets,
missing and null grouped as null, custom output accumulators, granularity, and the option
errors with MongoDB's codes."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

# v by _id; _id 10 holds null and _id 11 has no v (both group as null, below numbers)
VALUES = [5, 1, 3, 1, 2, 1, 5, 4, 1, 5]
DOCS = [{"_id": i, "v": v} for i, v in enumerate(VALUES)] + [{"_id": 10, "v": None}, {"_id": 11}]
THINGS = [{"_id": i} for i in range(100)]


def agg(coll, pipeline):
    return list(coll.aggregate(pipeline))


def code_of(coll, pipeline):
    with pytest.raises(OperationFailure) as e:
        agg(coll, pipeline)
    return e.value.code


def check(db):
    c = db.c
    # 12 documents in 4 buckets: 3 a bucket; the four 1s join the first bucket (null, null,
    # 1 and the other 1s); a bucket's max is the next bucket's min; only 3 buckets are left
    assert agg(c, [{"$bucketAuto": {"groupBy": "$v", "buckets": 4}}]) == [
        {"_id": {"min": None, "max": 2}, "count": 6},
        {"_id": {"min": 2, "max": 5}, "count": 3},
        {"_id": {"min": 5, "max": 5}, "count": 3}]
    # custom accumulators; $push is fed in groupBy order (6.0), so the middle bucket's ids
    # come in the order of their values 2, 3, 4
    out = agg(c, [{"$bucketAuto": {"groupBy": "$v", "buckets": 4, "output": {
        "n": {"$sum": 1}, "total": {"$sum": "$v"}, "lo": {"$min": "$v"}, "hi": {"$max": "$v"},
        "ids": {"$push": "$_id"}}}}])
    for b in out:
        if b["_id"]["min"] != 2:
            b["ids"].sort()
    assert out == [
        {"_id": {"min": None, "max": 2}, "n": 6, "total": 4, "lo": 1, "hi": 1,
         "ids": [1, 3, 5, 8, 10, 11]},
        {"_id": {"min": 2, "max": 5}, "n": 3, "total": 9, "lo": 2, "hi": 4, "ids": [4, 2, 7]},
        {"_id": {"min": 5, "max": 5}, "n": 3, "total": 15, "lo": 5, "hi": 5, "ids": [0, 6, 9]}]
    # more buckets than distinct values: one bucket per value
    assert agg(c, [{"$bucketAuto": {"groupBy": "$v", "buckets": 20}}]) == [
        {"_id": {"min": None, "max": 1}, "count": 2}, {"_id": {"min": 1, "max": 2}, "count": 4},
        {"_id": {"min": 2, "max": 3}, "count": 1}, {"_id": {"min": 3, "max": 4}, "count": 1},
        {"_id": {"min": 4, "max": 5}, "count": 1}, {"_id": {"min": 5, "max": 5}, "count": 3}]
    assert agg(c, [{"$bucketAuto": {"groupBy": "$v", "buckets": 1}}]) == [
        {"_id": {"min": None, "max": 5}, "count": 12}]
    # after a $match (pushed to the shards), with an expression and a stage after it
    assert agg(c, [{"$match": {"v": {"$gte": 2}}},
                   {"$bucketAuto": {"groupBy": "$v", "buckets": 2}}]) == [
        {"_id": {"min": 2, "max": 5}, "count": 3}, {"_id": {"min": 5, "max": 5}, "count": 3}]
    assert agg(c, [{"$match": {"v": {"$type": "number"}}},
                   {"$bucketAuto": {"groupBy": {"$multiply": ["$v", 10]}, "buckets": 2}},
                   {"$project": {"_id": 0, "lo": "$_id.min", "count": 1}}]) == [
        {"count": 5, "lo": 10}, {"count": 5, "lo": 30}]
    # inside $facet; and over no documents
    assert agg(c, [{"$facet": {"b": [{"$bucketAuto": {"groupBy": "$_id", "buckets": 2}}]}}]) == [
        {"b": [{"_id": {"min": 0, "max": 6}, "count": 6},
               {"_id": {"min": 6, "max": 11}, "count": 6}]}]
    assert agg(c, [{"$match": {"v": 99}}, {"$bucketAuto": {"groupBy": "$v", "buckets": 2}}]) == []

    # granularity: the manual's examples over _id 0..99 in 5 buckets
    t = db.things
    assert agg(t, [{"$bucketAuto": {"groupBy": "$_id", "buckets": 5, "granularity": "R5"}}]) == [
        {"_id": {"min": 0, "max": 25.0}, "count": 25},
        {"_id": {"min": 25.0, "max": 63.0}, "count": 38},
        {"_id": {"min": 63.0, "max": 100.0}, "count": 37}]
    assert agg(t, [{"$bucketAuto": {"groupBy": "$_id", "buckets": 5,
                                    "granularity": "POWERSOF2"}}]) == [
        {"_id": {"min": 0, "max": 32}, "count": 32}, {"_id": {"min": 32, "max": 64}, "count": 32},
        {"_id": {"min": 64, "max": 128}, "count": 36}]

    # errors (codes of document_source_bucket_auto.cpp and granularity_rounder.cpp)
    ba = lambda spec: [{"$bucketAuto": spec}]  # noqa: E731
    assert code_of(c, ba(1)) == 40240
    assert code_of(c, ba({"groupBy": "v", "buckets": 2})) == 40239
    assert code_of(c, ba({"groupBy": "$v", "buckets": "2"})) == 40241
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2.5})) == 40242
    assert code_of(c, ba({"groupBy": "$v", "buckets": 0})) == 40243
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "output": []})) == 40244
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "bogus": 1})) == 40245
    assert code_of(c, ba({"groupBy": "$v"})) == 40246
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "granularity": "R3"})) == 40257
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "granularity": 5})) == 40261
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "granularity": "R5"})) == 40258
    assert code_of(c, [{"$project": {"v": {"$subtract": [0, "$_id"]}}},
                       {"$bucketAuto": {"groupBy": "$v", "buckets": 2,
                                        "granularity": "E12"}}]) == 40260
    assert code_of(c, ba({"groupBy": "$v", "buckets": 2, "output": {"n": 1}})) == 40234


def load(db):
    db.c.insert_many(DOCS)
    db.things.insert_many(THINGS)


def test_bucket_auto_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        load(c.ba)
        check(c.ba)
    finally:
        c.close()


def test_bucket_auto_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        cl.shard_collection("ba.c", {"_id": 1}, split_points=[{"_id": 4}, {"_id": 8}])
        cl.shard_collection("ba.things", {"_id": 1}, split_points=[{"_id": 30}, {"_id": 70}])
        db = cl.proxy_client(0).ba
        load(db)
        # the documents are spread over the three shards
        for sid in cl.shard_ids:
            assert cl.shard_client(sid).ba.c.count_documents({}) > 0, sid
            assert cl.shard_client(sid).ba.things.count_documents({}) > 0, sid
        check(db)
        # an unsharded collection is forwarded to its primary shard, which runs the stage
        db.u.insert_many(DOCS)
        assert agg(db.u, [{"$bucketAuto": {"groupBy": "$v", "buckets": 4}}]) == [
            {"_id": {"min": None, "max": 2}, "count": 6},
            {"_id": {"min": 2, "max": 5}, "count": 3},
            {"_id": {"min": 5, "max": 5}, "count": 3}]
        assert code_of(db.u, [{"$bucketAuto": {"groupBy": "$v", "buckets": -1}}]) == 40243
    finally:
        cl.close()
