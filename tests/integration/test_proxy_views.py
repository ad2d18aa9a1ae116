"""Views through a proxy (issue #20). Metadata does not know views, so a view's name routes
as an unsharded collection to its database's primary shard; resolved there, a view over a
sharded collection would see only that shard's documents. The proxy sends such reads with
$stripedbViewCheck and the shard reports the view's source (169): an unsharded source is
read on the primary as before, a sharded one is refused with 238 NotImplemented, never
answered from one shard. Also the shard's side of the check, talked to directly."""
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

DOCS = [{"_id": i, "k": i, "g": i % 3} for i in range(30)]


def refused(fn):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == 238, e.value.details
    assert "view over the sharded collection vw.c" in e.value.details["errmsg"]


def test_views_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("vw.c", {"_id": 1}, split_points=[{"_id": 15}])
        db = cl.proxy_client(0).vw
        db.c.insert_many(DOCS)
        for sid in cl.shard_ids:  # documents on both shards
            assert 0 < cl.shard_client(sid).vw.c.count_documents({}) < 30, sid
        db.command("create", "v", viewOn="c", pipeline=[{"$match": {"g": 0}}])
        db.command("create", "vv", viewOn="v", pipeline=[{"$match": {"k": {"$gte": 10}}}])
        # before: the primary's share only (5 of 10). Now every read of such a view is
        # refused, whatever the command, through one or two views
        refused(lambda: list(db.v.find()))
        refused(lambda: db.v.count_documents({}))
        refused(lambda: db.command("count", "v"))
        refused(lambda: db.v.distinct("k"))
        refused(lambda: list(db.v.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}])))
        refused(lambda: list(db.vv.find()))
        # a $lookup / $unionWith whose foreign side is such a view (main sharded: the
        # proxy reads the foreign view itself, through the same check)
        refused(lambda: list(db.c.aggregate([{"$unionWith": "v"}])))
        refused(lambda: list(db.c.aggregate([{"$lookup": {"from": "v", "localField": "k",
                                                           "foreignField": "k", "as": "m"}}])))
        # the sharded collection itself is unaffected
        assert db.c.count_documents({"g": 0}) == 10
        # views over an unsharded collection (and a view of such a view) read everything
        db.u.insert_many(DOCS)
        db.command("create", "vu", viewOn="u", pipeline=[{"$match": {"g": 0}}])
        db.command("create", "vvu", viewOn="vu", pipeline=[{"$match": {"k": {"$gte": 10}}}])
        assert sorted(d["_id"] for d in db.vu.find()) == [i for i in range(30) if i % 3 == 0]
        assert db.vu.count_documents({}) == 10
        assert db.command("count", "vu")["n"] == 10
        assert sorted(db.vu.distinct("k")) == [i for i in range(30) if i % 3 == 0]
        assert sorted(d["_id"] for d in db.vvu.find()) == [12, 15, 18, 21, 24, 27]
        assert list(db.vu.aggregate([{"$count": "n"}])) == [{"n": 10}]
        # an unsharded main with a lookup into a view of an unsharded collection
        out = list(db.u.aggregate([{"$match": {"_id": 3}},
                                   {"$lookup": {"from": "vu", "localField": "k",
                                                "foreignField": "k", "as": "m"}}]))
        assert [len(d["m"]) for d in out] == [1]
        # a plain unsharded collection read is unchanged
        assert db.u.count_documents({}) == 30
        # a view over an unsharded collection whose own pipeline reads the sharded one
        # (found by a review: the primary read its share of vw.c)
        db.command("create", "vl", viewOn="u",
                   pipeline=[{"$lookup": {"from": "c", "localField": "k", "foreignField": "k",
                                          "as": "m"}}])
        refused(lambda: list(db.vl.find()))
        # an all-unsharded $lookup sent whole to the primary still answers everything
        out = list(db.u.aggregate([{"$match": {"_id": {"$lt": 3}}},
                                   {"$lookup": {"from": "u", "localField": "k",
                                                "foreignField": "k", "as": "m"}},
                                   {"$project": {"n": {"$size": "$m"}}}]))
        assert sorted((d["_id"], d["n"]) for d in out) == [(0, 1), (1, 1), (2, 1)]
        # inside a transaction a view of an unsharded collection reads as before (the
        # check would abort the transaction: not sent there)
        cli = cl.proxy_client(0)
        with cli.start_session() as s:
            with s.start_transaction():
                assert cli.vw.vu.count_documents({}, session=s) == 10
                assert len(list(cli.vw.vu.aggregate([{"$match": {}}], session=s))) == 10
        # the shard's side: a read carrying $stripedbViewCheck that meets a view whose
        # source is not allowed answers 169 naming the source; allowed, it runs
        primary = [cl.shard_client(s).vw for s in cl.shard_ids
                   if cl.shard_client(s).vw.u.estimated_document_count() == 30][0]
        with pytest.raises(OperationFailure) as e:
            primary.command({"find": "vu", "$stripedbViewCheck": {"allow": []}})
        assert e.value.code == 169, e.value.details
        assert e.value.details["codeName"] == "CommandOnShardedViewNotSupportedOnMongod"
        assert e.value.details["errmsg"].endswith("resolvedView.ns=vw.u")
        r = primary.command({"find": "vu", "$stripedbViewCheck": {"allow": ["vw.u"]}})
        assert len(r["cursor"]["firstBatch"]) == 10
        # without the field (a client talking to the shard directly) views resolve as before
        assert primary.vu.count_documents({}) == 10
    finally:
        cl.close()


def test_shard_collection_of_a_view_is_refused(start_role, tmp_path):
    """shardCollection of a view through a proxy (issue #20, a fresh user): it answered ok
    and registered the view as sharded (config.collections listed it, a later moveChunk
    retried forever); of a view over a sharded collection it answered 20 "its unsharded
    documents are on 2 shards". MongoDB 6.0: 166 CommandNotSupportedOnView "Namespace ...
    is a view, not a collection", nothing registered."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cli = cl.proxy_client(0)
        db, admin = cli.vw, cli.admin
        db.customers.insert_many(DOCS)
        db.create_collection("vx", viewOn="customers", pipeline=[])
        for key in ({"_id": 1}, {"_id": "hashed"}):
            with pytest.raises(OperationFailure) as e:
                admin.command("shardCollection", "vw.vx", key=key)
            assert e.value.code == 166, e.value.details
            assert e.value.details["errmsg"] == "Namespace vw.vx is a view, not a collection"
        assert cli.config.collections.find_one({"_id": "vw.vx"}) is None
        # the view still reads its source; the source itself can still be sharded
        assert db.vx.count_documents({}) == 30
        # a view over a sharded collection (documents on both shards)
        cl.shard_collection("vw.c", {"_id": 1}, split_points=[{"_id": 15}])
        db.c.insert_many(DOCS)
        for sid in cl.shard_ids:
            assert 0 < cl.shard_client(sid).vw.c.count_documents({}) < 30, sid
        db.create_collection("vs", viewOn="c", pipeline=[{"$match": {"g": 0}}])
        with pytest.raises(OperationFailure) as e:
            admin.command("shardCollection", "vw.vs", key={"_id": 1})
        assert e.value.code == 166, e.value.details
        assert e.value.details["errmsg"] == "Namespace vw.vs is a view, not a collection"
        assert cli.config.collections.find_one({"_id": "vw.vs"}) is None
        # a plain unsharded collection is still sharded as before
        assert admin.command("shardCollection", "vw.customers", key={"_id": 1})["ok"] == 1
        assert cli.config.collections.find_one({"_id": "vw.customers"}) is not None
        # everything built above was freed: a clean exit, no sanitizer report
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
