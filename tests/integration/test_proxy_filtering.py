"""Chunk-aware shards through the proxy (issue #17): once the shards hold their filtering
metadata, the proxy sends ONE request per target shard with the shard version and the
shards drop orphans; orphans inserted directly on a shard are never seen or touched through
the proxy; the differential test against a single shard holds at 1,024 chunks."""
import random

import pymongo
import pytest
from bson import MinKey

from conftest import free_port
from proxy_helpers import ProxyCluster, install_filtering, shard_cmd_count
from test_proxy import rand_doc, rand_query


@pytest.fixture
def cl2(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield cl
    cl.close()


def test_orphans_are_never_seen_or_touched_through_the_proxy(cl2):
    cl = cl2
    ns, key = "db.c", {"k": 1}
    cl.shard_collection(ns, key, split_points=[{"k": 25 * i} for i in range(1, 16)])
    chunks = install_filtering(cl, ns, key)
    assert len(chunks) == 16
    prox = cl.proxy_client(0).db.c
    prox.insert_many([{"_id": i, "k": i, "g": i % 4} for i in range(400)])
    # orphans: on each shard, copies of documents the OTHER shard owns (as a migration's
    # source keeps them until cleanup, or a recipient holds them before the switch)
    n_orphans = 0
    for ch in chunks:
        lo = ch["min"]["k"]
        lo = -1 if isinstance(lo, MinKey) else lo
        other = [s for s in cl.shard_ids if s != ch["shard"]][0]
        docs = [{"_id": f"o{lo}-{j}", "k": lo + j, "g": 0, "orphan": True} for j in range(1, 4)]
        cl.shard_client(other).db.c.insert_many(docs)
        n_orphans += len(docs)
    before = {s: shard_cmd_count(cl, s, "find") for s in cl.shard_ids}
    got = list(prox.find({}, batch_size=1000))
    assert sorted(d["_id"] for d in got) == list(range(400))
    # one find per shard, not one per chunk (8 chunks each)
    assert all(shard_cmd_count(cl, s, "find") - before[s] == 1 for s in cl.shard_ids)
    assert prox.count_documents({}) == 400
    assert prox.count_documents({"g": 0}) == 100
    assert prox.count_documents({"k": {"$gte": 20, "$lt": 80}}) == 60
    assert sorted(prox.distinct("k")) == list(range(400))
    assert not any(d.get("orphan") for d in prox.find({"k": {"$lt": 60}}))
    agg = list(prox.aggregate([{"$match": {"g": 0}}, {"$group": {"_id": None, "n": {"$sum": 1}}}]))
    assert agg[0]["n"] == 100
    before = {s: (shard_cmd_count(cl, s, "update"), shard_cmd_count(cl, s, "delete"),
                  shard_cmd_count(cl, s, "find")) for s in cl.shard_ids}
    r = prox.update_many({"g": 0}, {"$set": {"touched": True}})
    assert (r.matched_count, r.modified_count) == (100, 100)
    r = prox.delete_many({"k": {"$gte": 300}})
    assert r.deleted_count == 100
    # one pass per shard: one update and one delete each, no collecting find
    for s in cl.shard_ids:
        after = (shard_cmd_count(cl, s, "update"), shard_cmd_count(cl, s, "delete"),
                 shard_cmd_count(cl, s, "find"))
        assert [a - b for a, b in zip(after, before[s])] == [1, 1, 0], s
    assert prox.count_documents({}) == 300
    # the orphans are all still on the shards, never updated
    left = sum(cl.shard_client(s).db.c.count_documents({"orphan": True}) for s in cl.shard_ids)
    assert left == n_orphans
    assert sum(cl.shard_client(s).db.c.count_documents({"orphan": True, "touched": True})
               for s in cl.shard_ids) == 0


def test_a_shard_without_filtering_metadata_gets_per_chunk_requests(cl2):
    """Collections whose shards were never given filtering metadata (sharded before a
    migration installed it) keep the per-chunk requests and the proxy's ownership filter."""
    cl = cl2
    ns, key = "db.c", {"k": 1}
    cl.shard_collection(ns, key, split_points=[{"k": 25 * i} for i in range(1, 8)])
    prox = cl.proxy_client(0).db.c
    prox.insert_many([{"_id": i, "k": i} for i in range(200)])
    cl.shard_client("shard-b").db.c.insert_one({"_id": "orphan", "k": 1})
    assert prox.count_documents({}) == 200
    assert len(list(prox.find({}))) == 200
    before = shard_cmd_count(cl, "shard-a", "find")
    list(prox.find({}))
    assert shard_cmd_count(cl, "shard-a", "find") - before == 4  # its 4 chunks


def test_shard_collection_through_the_proxy_installs_filtering_metadata(cl2):
    """shardCollection through a proxy installs every owning shard's filtering metadata
    (as a migration's switch does), so the collection gets ONE request per shard and the
    shards drop orphans from the start, with no migration."""
    cl = cl2
    p = cl.proxy_client(0)
    p.admin.command("shardCollection", "db.h", key={"_id": "hashed"}, numInitialChunks=8)
    chunks = cl.routing("db.h")["chunks"]
    assert len(chunks) == 8
    for s in cl.shard_ids:
        mine = sorted(str(c["id"]) for c in chunks if c["shard"] == s)
        assert len(mine) == 4, (s, mine)
        f = cl.shard_client(s).admin.command({"stripedbGetFiltering": "db.h"})
        assert f["installed"] is True, f
        assert sorted(c["id"] for c in f["chunks"]) == mine
        assert f["collectionVersion"] == max(c["token"] for c in chunks)
    p.db.h.insert_many([{"_id": i, "v": i} for i in range(100)])
    # an orphan: a copy, on shard-a, of a document shard-b owns
    on_b = [d["_id"] for d in cl.shard_client("shard-b").db.h.find({}, {"_id": 1})]
    assert on_b and len(on_b) < 100
    cl.shard_client("shard-a").db.h.insert_one({"_id": on_b[0], "v": "orphan"})
    before = {s: shard_cmd_count(cl, s, "find") for s in cl.shard_ids}
    got = list(p.db.h.find({}, batch_size=1000))
    assert sorted(d["_id"] for d in got) == list(range(100))
    assert not any(d["v"] == "orphan" for d in got)
    # one find per shard, not one per chunk (4 chunks each)
    assert all(shard_cmd_count(cl, s, "find") - before[s] == 1 for s in cl.shard_ids)
    assert p.db.h.count_documents({}) == 100


@pytest.mark.parametrize("sharding", ["ranged", "hashed"])
def test_differential_vs_one_shard_at_1024_chunks(start_role, tmp_path, sharding):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        port = free_port()
        d = tmp_path / "solo"
        d.mkdir()
        start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
        solo = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True).db.c
        if sharding == "ranged":
            key = {"k": 1}
            cl.shard_collection("db.c", key,
                                split_points=[{"k": -50 + i * 400 / 1024} for i in range(1, 1024)])
        else:
            key = {"_id": "hashed"}
            cl.shard_collection("db.c", key, num_chunks=1024)
        assert len(install_filtering(cl, "db.c", key)) == 1024
        prox = cl.proxy_client(0).db.c
        rng = random.Random(17)
        docs = [rand_doc(rng, i) for i in range(600)]
        prox.insert_many(docs)
        solo.insert_many(docs)
        assert prox.count_documents({}) == 600
        for n in range(100):
            f, sort, skip, limit, proj = rand_query(rng)
            a = list(prox.find(f, proj, batch_size=rng.choice([3, 50, 1000])).sort(sort)
                     .skip(skip).limit(limit))
            b = list(solo.find(f, proj).sort(sort).skip(skip).limit(limit))
            assert a == b, f"query {n}: filter={f} sort={sort} skip={skip} limit={limit}"
            assert prox.count_documents(f) == solo.count_documents(f), f
            if n % 10 == 0:
                assert sorted(prox.distinct("a", f)) == sorted(solo.distinct("a", f))
    finally:
        cl.close()
