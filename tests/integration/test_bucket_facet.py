"""$bucket, $facet and $switch (issue #20) on a shard and through a proxy to a sharded
collection: the results of the whole collection (the proxy runs these stages over every
shard's documents, never one shard's share), and their errors."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

ARTISTS = [{"_id": i, "year_born": y} for i, y in
           enumerate([1868, 1861, 1871, 1853, 1868, 1863, 1840, 1855, 1900])] + [{"_id": 99}]
PIPELINE = [{"$bucket": {"groupBy": "$year_born", "boundaries": [1840, 1850, 1860, 1870, 1880],
                         "default": "Other",
                         "output": {"count": {"$sum": 1}, "ids": {"$push": "$_id"}}}},
            {"$project": {"count": 1, "era": {"$switch": {
                "branches": [{"case": {"$lt": ["$_id", 1860]}, "then": "early"},
                             {"case": {"$eq": ["$_id", "Other"]}, "then": "unknown"}],
                "default": "late"}}}}]
WANT = [{"_id": 1840, "count": 1, "era": "early"}, {"_id": 1850, "count": 2, "era": "early"},
        {"_id": 1860, "count": 4, "era": "late"}, {"_id": 1870, "count": 1, "era": "late"},
        {"_id": "Other", "count": 2, "era": "unknown"}]


def check(db):
    db.artists.insert_many(ARTISTS)
    assert list(db.artists.aggregate(PIPELINE)) == WANT
    with pytest.raises(OperationFailure) as e:  # no default: a value outside fails
        list(db.artists.aggregate([{"$bucket": {"groupBy": "$year_born",
                                                "boundaries": [1840, 1880]}}]))
    assert e.value.code == 40066, e.value.details
    with pytest.raises(OperationFailure) as e:
        list(db.artists.aggregate([{"$bucket": {"groupBy": "$year_born",
                                                "boundaries": [1880, 1840]}}]))
    assert e.value.code == 40194, e.value.details
    # $facet: one document whose facets each saw every document
    (f,) = db.artists.aggregate([{"$facet": {
        "n": [{"$count": "n"}],
        "eras": PIPELINE,
        "oldest": [{"$match": {"year_born": {"$exists": True}}}, {"$sort": {"year_born": 1}},
                   {"$limit": 1}, {"$project": {"_id": 1}}]}}])
    assert f == {"n": [{"n": len(ARTISTS)}], "eras": WANT, "oldest": [{"_id": 6}]}
    (f,) = db.artists.aggregate([{"$match": {"_id": -1}}, {"$facet": {"n": [{"$count": "n"}]}}])
    assert f == {"n": []}
    with pytest.raises(OperationFailure) as e:
        list(db.artists.aggregate([{"$facet": {"f": [{"$facet": {"g": []}}]}}]))
    assert e.value.code == 40600, e.value.details


def test_bucket_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check(c.bk)
    finally:
        c.close()


def test_bucket_through_a_proxy_over_every_shard(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("bk.artists", {"_id": 1}, split_points=[{"_id": 4}])
        check(cl.proxy_client(0).bk)
    finally:
        cl.close()
