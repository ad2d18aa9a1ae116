"""The coordinator's filtering-metadata reconciler (issue #17, src/coordinator/reconcile.h):
a collection sharded through metadata directly (no proxy shardCollection, no migration) gets
its filtering metadata installed on exactly the shards that own its chunks, and is then
served with one request per shard, orphans dropped by the shards; a shard that lost its
metadata gets it back."""
import pytest
from bson import MinKey

from conftest import wait_until
from migration_helpers import MigCluster
from proxy_helpers import shard_cmd_count


def filtering(cl, sid, ns):
    return cl.shard_client(sid).admin.command({"stripedbGetFiltering": ns})


def wait_installed(cl, sid, ns, timeout=60):
    return wait_until(lambda: (lambda f: f if f["installed"] else None)(filtering(cl, sid, ns)),
                      timeout, interval=0.2, what=f"filtering metadata of {ns} on {sid}")


@pytest.fixture
def cl3(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=3, proxies=1, coordinators=1)
    yield cl
    cl.close()


def test_a_collection_sharded_through_metadata_gets_its_filtering_metadata(cl3):
    cl = cl3
    ns = "db.c"
    # chunks on shard-a and shard-b only; shard-c owns none
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 25 * i} for i in range(1, 8)],
                        shards=["shard-a", "shard-b"])
    chunks = cl.chunks(ns)
    assert len(chunks) == 8
    cver = max(c["token"] for c in chunks)
    for sid in ("shard-a", "shard-b"):
        f = wait_installed(cl, sid, ns)
        mine = sorted(str(c["id"]) for c in chunks if c["shard"] == sid)
        assert len(mine) == 4
        assert sorted(c["id"] for c in f["chunks"]) == mine
        assert f["collectionVersion"] == cver
        assert f["key"] == {"k": 1}
    # the shard-key index a proxy's shardCollection creates, created on the (empty) shards
    for sid in ("shard-a", "shard-b"):
        keys = [ix["key"] for ix in cl.shard_client(sid).db.c.list_indexes()]
        assert {"k": 1} in keys, (sid, keys)
    # the shard owning nothing is listed by the same pass but gets nothing
    listed = cl.shard_client("shard-c").admin.command({"stripedbListFiltering": 1})
    assert [n["ns"] for n in listed["namespaces"]] == []
    listed = cl.shard_client("shard-a").admin.command({"stripedbListFiltering": 1})
    assert [(n["ns"], n["collectionVersion"]) for n in listed["namespaces"]] == [(ns, cver)]

    prox = cl.proxy_client(0).db.c
    prox.insert_many([{"_id": i, "k": i} for i in range(200)])
    # orphans: copies, on the other shard, of documents each chunk's owner holds
    n_orphans = 0
    for ch in chunks:
        lo = ch["min"]["k"]
        lo = -1 if isinstance(lo, MinKey) else lo
        other = "shard-b" if ch["shard"] == "shard-a" else "shard-a"
        cl.shard_client(other).db.c.insert_many(
            [{"_id": f"o{lo}-{j}", "k": lo + j, "orphan": True} for j in range(1, 3)])
        n_orphans += 2
    before = {s: shard_cmd_count(cl, s, "find") for s in ("shard-a", "shard-b")}
    got = list(prox.find({}, batch_size=1000))
    assert sorted(d["_id"] for d in got) == list(range(200))
    # one find per shard (versioned, filtered on the shard), not one per chunk (4 each)
    assert all(shard_cmd_count(cl, s, "find") - before[s] == 1 for s in before), before
    assert prox.count_documents({}) == 200
    assert prox.count_documents({"orphan": True}) == 0
    r = prox.update_many({}, {"$set": {"touched": True}})
    assert r.matched_count == 200
    left = sum(cl.shard_client(s).db.c.count_documents({"orphan": True, "touched": True})
               for s in ("shard-a", "shard-b"))
    assert left == 0


def test_hashed_and_non_empty_collections(cl3):
    """A hashed key gets its {h: "hashed"} index on the owning shards (keyRange reads of its
    chunks are bounded on it); a collection that already holds documents on a shard without
    a shard-key index gets its filtering metadata but no index build behind the operator's
    back (it would hold the shard's writes)."""
    cl = cl3
    cl.shard_collection("db.h", {"h": "hashed"}, shards=["shard-a", "shard-b"])
    cl.shard_client("shard-a").db.full.insert_many([{"_id": i, "k": i} for i in range(10)])
    cl.shard_collection("db.full", {"k": 1}, split_points=[{"k": 5}],
                        shards=["shard-a", "shard-b"])
    owners = {c["shard"] for c in cl.chunks("db.h")}
    for sid in owners:
        f = wait_installed(cl, sid, "db.h")
        assert f["key"] == {"h": "hashed"}
        keys = [ix["key"] for ix in cl.shard_client(sid).db.h.list_indexes()]
        assert {"h": "hashed"} in keys, (sid, keys)
    wait_installed(cl, "shard-a", "db.full")
    keys = [ix["key"] for ix in cl.shard_client("shard-a").db.full.list_indexes()]
    assert keys == [{"_id": 1}], keys
    # the empty side got its index
    wait_installed(cl, "shard-b", "db.full")
    keys = [ix["key"] for ix in cl.shard_client("shard-b").db.full.list_indexes()]
    assert {"k": 1} in keys, keys


def test_a_shard_that_lost_its_filtering_metadata_gets_it_back(cl3):
    cl = cl3
    ns = "db.r"
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 50}], shards=["shard-a", "shard-b"])
    first = wait_installed(cl, "shard-b", ns)
    prox = cl.proxy_client(0).db.r
    prox.insert_many([{"_id": i, "k": i} for i in range(100)])
    # as a shard rebuilt from an empty disk: the metadata is gone (gated requests answer
    # StaleConfig with vWanted null, the proxy falls back to per-chunk requests meanwhile)
    cl.shard_client("shard-b").admin.command({"stripedbSetFiltering": ns, "drop": True})
    assert filtering(cl, "shard-b", ns)["installed"] is False
    assert prox.count_documents({}) == 100
    again = wait_installed(cl, "shard-b", ns)
    assert again["chunks"] == first["chunks"]
    assert again["collectionVersion"] == first["collectionVersion"]
    assert prox.count_documents({}) == 100
    assert sorted(d["_id"] for d in prox.find({})) == list(range(100))


def test_a_proxy_probes_a_shard_again_after_it_got_its_metadata(cl3):
    """A proxy that met a shard without filtering metadata sends it per-chunk requests, and
    probes it again later (src/proxy/shardver.c PX_LEGACY_RECHECK_MS): once the reconciler
    has installed the metadata, the proxy's queries go to that shard once, not per chunk,
    with no routing change in between."""
    cl = cl3
    ns = "db.p"
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 10 * i} for i in range(1, 8)],
                        shards=["shard-a", "shard-b"])
    version = cl.meta_read({"getRoutingTable": "all", "sinceVersion": 2**62})["routingVersion"]
    wait_installed(cl, "shard-a", ns)
    wait_installed(cl, "shard-b", ns)
    prox = cl.proxy_client(0).db.p
    prox.insert_many([{"_id": i, "k": i} for i in range(80)])
    # the coordinator stopped, so that the proxy meets the shard without metadata
    coord = cl.coords[0]
    coord.kill()
    cl.shard_client("shard-b").admin.command({"stripedbSetFiltering": ns, "drop": True})
    before = shard_cmd_count(cl, "shard-b", "find")
    assert len(list(prox.find({}))) == 80
    # the versioned find refused (StaleConfig, vWanted null), then one find per chunk (4)
    assert shard_cmd_count(cl, "shard-b", "find") - before == 5
    coord.restart()
    wait_installed(cl, "shard-b", ns)

    def one_find():
        b = shard_cmd_count(cl, "shard-b", "find")
        assert sorted(d["_id"] for d in prox.find({})) == list(range(80))
        return shard_cmd_count(cl, "shard-b", "find") - b == 1
    wait_until(one_find, 90, interval=1.0, what="the proxy's probe of shard-b")
    # no routing change made it happen
    assert cl.meta_read({"getRoutingTable": "all", "sinceVersion": 2**62})["routingVersion"] \
        == version


def test_a_collection_dropped_and_sharded_again(cl3):
    """Dropped through a proxy and sharded again through metadata under the same name (its
    tokens start again at 1): the shards get the new collection's chunks, not the old."""
    cl = cl3
    ns = "db.again"
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 10}], shards=["shard-a", "shard-b"])
    old = wait_installed(cl, "shard-a", ns)
    prox = cl.proxy_client(0).db
    prox.again.insert_many([{"_id": i, "k": i} for i in range(20)])
    prox.drop_collection("again")
    assert filtering(cl, "shard-a", ns)["installed"] is False
    cl.shard_collection(ns, {"j": 1}, split_points=[{"j": 5}, {"j": 50}],
                        shards=["shard-a", "shard-b"])
    chunks = cl.chunks(ns)

    def fresh():
        f = filtering(cl, "shard-a", ns)
        return f if f["installed"] and f["key"] == {"j": 1} else None
    new = wait_until(fresh, 60, interval=0.2, what="the new collection's install")
    mine = sorted(str(c["id"]) for c in chunks if c["shard"] == "shard-a")
    assert sorted(c["id"] for c in new["chunks"]) == mine
    assert not set(mine) & {c["id"] for c in old["chunks"]}
    prox.again.insert_many([{"_id": i, "j": i} for i in range(100)])
    assert prox.again.count_documents({}) == 100


def test_ctl_collection_drop_then_create_again(cl3):
    """`ctl collection drop` removes only metadata's sharding: the reconciler drops the
    shards' filtering metadata of the collection metadata no longer lists, so the same name
    sharded again (its tokens start again at 1) gets its own install and the proxy serves
    it (it answered StaleConfig forever before: found by a review)."""
    cl = cl3
    ns = "db.y"
    cl.meta_write({"createDatabase": "db"}, ok_codes=(48, 11000))
    cl.ctl("collection", "create", ns, "--shard-key", "k", "--on", "shard-a,shard-b")
    wait_installed(cl, "shard-a", ns)
    cl.ctl("collection", "drop", ns)
    wait_until(lambda: not filtering(cl, "shard-a", ns)["installed"], 60, interval=0.2,
               what="the dropped collection's install gone")
    cl.ctl("collection", "create", ns, "--shard-key", "j", "--on", "shard-a,shard-b")

    def fresh():
        f = filtering(cl, "shard-a", ns)
        return f if f["installed"] and f["key"] == {"j": 1} else None
    wait_until(fresh, 60, interval=0.2, what="the new collection's install")
    prox = cl.proxy_client(0).db.y
    prox.insert_many([{"_id": i, "j": i} for i in range(30)])
    assert prox.count_documents({}) == 30
    assert len(list(prox.find({}))) == 30
