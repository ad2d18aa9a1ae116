"""The $collStats stage on a shard (issue #20): a leading {$collStats: {count, storageStats}}
gives one document about the collection, and the rest of the pipeline runs over it, as on a
mongod; a proxy answers one document per shard (src/proxy/admin.c)."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster


def _agg(db, coll, pipeline):
    return db.command({"aggregate": coll, "pipeline": pipeline,
                       "cursor": {}})["cursor"]["firstBatch"]


def test_coll_stats_stage_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.cs
    db.c.insert_many([{"_id": i, "a": "x" * i} for i in range(7)])
    db.c.create_index("a")
    (d,) = _agg(db, "c", [{"$collStats": {"count": {}, "storageStats": {}}}])
    # count at the top level, as mongod's appendCollectionRecordCount
    assert d["ns"] == "cs.c" and d["count"] == 7
    st = d["storageStats"]
    assert st["count"] == 7 and st["nindexes"] == 2 and st["size"] > 0
    assert set(st["indexSizes"]) == {"_id_", "a_1"}
    # the rest of the pipeline runs over that document
    assert _agg(db, "c", [{"$collStats": {"count": {}}},
                          {"$project": {"_id": 0, "n": "$count"}}]) == [{"n": 7}]
    # a collection that does not exist: its count and storageStats are NamespaceNotFound
    for pipeline, code in (([{"$collStats": {"storageStats": {}}}], 26),
                           ([{"$collStats": {"count": {}}}], 26),
                           ([{"$collStats": {"latencyStats": {}}}], 238),
                           ([{"$collStats": {"bogus": {}}}], 40415),
                           ([{"$match": {}}, {"$collStats": {}}], 40602)):
        with pytest.raises(OperationFailure) as e:
            _agg(db, "none" if code == 26 else "c", pipeline)
        assert e.value.code == code, (pipeline, e.value.details)
    db.command({"create": "v", "viewOn": "c", "pipeline": []})
    with pytest.raises(OperationFailure) as e:
        _agg(db, "v", [{"$collStats": {"count": {}}}])
    assert e.value.code == 166
    c.close()


def test_coll_stats_stage_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("cs.s", {"_id": 1}, split_points=[{"_id": 3}])
        db = cl.proxy_client(0).cs
        db.s.insert_many([{"_id": i} for i in range(7)])
        docs = _agg(db, "s", [{"$collStats": {"count": {}}}])
        assert sorted(d["shard"] for d in docs) == ["shard-a", "shard-b"]
        assert sum(d["count"] for d in docs) == 7
        # a view has no storage: 166 as mongod (a fresh user: count 0 through a proxy)
        db.create_collection("sv", viewOn="s", pipeline=[])
        with pytest.raises(OperationFailure) as e:
            _agg(db, "sv", [{"$collStats": {"count": {}}}])
        assert e.value.code == 166, e.value.details
        with pytest.raises(OperationFailure) as e:
            db.command("collStats", "sv")
        assert e.value.code == 166, e.value.details
        # later stages run over the shards' documents, as on a shard and on mongos 6.0
        # (issue #20: the proxy answered 9 "$collStats is supported as the only stage")
        out = _agg(db, "s", [{"$collStats": {"count": {}, "storageStats": {}}},
                             {"$project": {"_id": 0, "shard": 1, "n": "$count",
                                           "s": "$storageStats.count"}},
                             {"$sort": {"shard": 1}}])
        assert [d["shard"] for d in out] == ["shard-a", "shard-b"]
        assert sorted(d["n"] for d in out) == [3, 4]
        assert all(d["n"] == d["s"] and set(d) == {"shard", "n", "s"} for d in out), out
        assert _agg(db, "s", [{"$collStats": {"count": {}}},
                              {"$group": {"_id": None, "n": {"$sum": "$count"}}}]) == \
            [{"_id": None, "n": 7}]
        # the driver's cursor, with a batch size smaller than the output
        got = list(db.s.aggregate([{"$collStats": {"count": {}}}, {"$match": {"count": 4}},
                                   {"$project": {"_id": 0, "count": 1}}], batchSize=1))
        assert got == [{"count": 4}]
        # errors of the later stages and options are the shard's
        shard_db = cl.shard_client("shard-a").cs
        for pipeline in ([{"$collStats": {"count": {}}}, {"$bogus": {}}],
                         [{"$collStats": {"latencyStats": {}}}, {"$project": {"a": 1}}],
                         [{"$collStats": {"bogus": {}}}],
                         [{"$collStats": {"count": {}}}, {"$project": 1}]):
            with pytest.raises(OperationFailure) as e:
                _agg(shard_db, "s", pipeline)
            want = e.value.code
            with pytest.raises(OperationFailure) as e:
                _agg(db, "s", pipeline)
            assert e.value.code == want, (pipeline, e.value.details)
        # everything built above was freed: a clean exit, no sanitizer report
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
