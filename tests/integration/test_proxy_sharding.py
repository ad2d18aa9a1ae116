"""Sharding administration through the proxy, as on a mongos (issue #18): enableSharding,
shardCollection (including of a non-empty collection: no document hidden or duplicated),
listShards, addShard, the balancer commands and the clear refusals. Real processes:
one metadata member, shards and a proxy on loopback, driven by pymongo."""
import json
import os
import subprocess

import pytest
from pymongo.errors import DuplicateKeyError, OperationFailure

from conftest import BIN, MONGOSH, free_port, needs_node_client, node_env, wait_until
from proxy_helpers import ProxyCluster


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=2)
    yield cl
    cl.close()


def fails(fn, code, words=()):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == code, e.value.details
    for w in words:
        assert w in e.value.details["errmsg"], e.value.details
    return e.value.details


def meta_chunks(cl, ns):
    return cl.routing(ns)["chunks"]


def test_enable_sharding_and_shard_empty_collection_ranged(cluster):
    admin = cluster.proxy_client(0).admin
    assert admin.command("enableSharding", "app")["ok"] == 1
    assert admin.command("enableSharding", "app")["ok"] == 1  # idempotent
    assert "app" in [d["name"] for d in cluster.meta_query({"listDatabases": 1})["databases"]]
    r = admin.command("shardCollection", "app.users", key={"uid": 1})
    assert r["collectionsharded"] == "app.users"
    t = cluster.routing("app.users")
    assert t["key"] == {"uid": 1} and len(t["chunks"]) == 1
    # the same key again is fine, another key is AlreadyInitialized (23)
    assert admin.command("shardCollection", "app.users", key={"uid": 1})["ok"] == 1
    fails(lambda: admin.command("shardCollection", "app.users", key={"x": 1}), 23,
          ["different shard key"])
    # documents written through either proxy are all read back exactly once
    c = cluster.proxy_client(1).app.users
    c.insert_many([{"_id": i, "uid": i} for i in range(50)])
    assert sorted(d["_id"] for d in cluster.proxy_client(0).app.users.find()) == list(range(50))


def test_shard_a_new_collection_on_id(cluster):
    """shardCollection {_id: 1} of a collection that does not exist yet (a fresh user: it
    was 85 "Index already exists with a different name: _id_", the proxy creating the key's
    index as "_id_1"); with unique: true too; then writes and reads through the proxy."""
    admin = cluster.proxy_client(0).admin
    assert admin.command("shardCollection", "idk.c", key={"_id": 1})["ok"] == 1
    assert admin.command("shardCollection", "idk.u", key={"_id": 1}, unique=True)["ok"] == 1
    for name in ("c", "u"):
        assert cluster.routing(f"idk.{name}")["key"] == {"_id": 1}
        c = cluster.proxy_client(0).idk[name]
        c.insert_many([{"_id": i} for i in range(20)])
        assert sorted(d["_id"] for d in c.find()) == list(range(20))
        with pytest.raises(DuplicateKeyError):
            c.insert_one({"_id": 3})
        assert [ix["name"] for ix in c.list_indexes()] == ["_id_"]


def test_shard_empty_collection_hashed_num_initial_chunks(cluster):
    admin = cluster.proxy_client(0).admin
    r = admin.command("shardCollection", "h.c", key={"_id": "hashed"}, numInitialChunks=6)
    assert r["ok"] == 1
    chunks = meta_chunks(cluster, "h.c")
    assert len(chunks) == 6
    assert {ch["shard"] for ch in chunks} == set(cluster.shard_ids)  # spread: empty
    c = cluster.proxy_client(0).h.c
    c.insert_many([{"_id": i} for i in range(200)])
    assert sorted(d["_id"] for d in c.find()) == list(range(200))
    per_shard = [cluster.shard_client(s).h.c.count_documents({}) for s in cluster.shard_ids]
    assert sum(per_shard) == 200 and all(n > 0 for n in per_shard), per_shard
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"_id": 7})


@pytest.mark.parametrize("key,extra", [({"_id": "hashed"}, {"numInitialChunks": 6}),
                                       ({"_id": 1}, {})])
def test_shard_non_empty_collection_hides_and_duplicates_nothing(cluster, key, extra):
    """The issue's reproduction: _id 1-5 inserted unsharded, then sharded."""
    p = cluster.proxy_client(0)
    p.r.c.insert_many([{"_id": i, "v": i} for i in range(1, 6)])
    holders = [s for s in cluster.shard_ids if cluster.shard_client(s).r.c.count_documents({})]
    assert len(holders) == 1
    p.admin.command("shardCollection", "r.c", key=key, **extra)
    chunks = meta_chunks(cluster, "r.c")
    assert len(chunks) == (6 if extra else 1)
    assert {ch["shard"] for ch in chunks} == set(holders)  # MongoDB: all on the holder
    for i in range(2):  # both proxies (the other learns through its refresh)
        c = cluster.proxy_client(i).r.c
        wait_until(lambda: sorted(d["_id"] for d in c.find()) == [1, 2, 3, 4, 5], 10,
                   what="every document visible once")
        assert c.count_documents({}) == 5
        for k in range(1, 6):
            assert c.find_one({"_id": k}) == {"_id": k, "v": k}
            with pytest.raises(DuplicateKeyError):
                c.insert_one({"_id": k})
    c = p.r.c
    c.insert_many([{"_id": i, "v": i} for i in range(6, 40)])
    assert sorted(d["_id"] for d in c.find()) == list(range(1, 40))
    assert c.count_documents({}) == 39
    fails(lambda: p.admin.command("shardCollection", "r.c", key={"other": 1}), 23)
    cluster.stop_proxy_clean(0)


def test_shard_collection_on_several_shards_is_refused(cluster):
    for sid in cluster.shard_ids[:2]:
        cluster.shard_client(sid).x.c.insert_one({"_id": sid})
    d = fails(lambda: cluster.proxy_client(0).admin.command(
        "shardCollection", "x.c", key={"_id": 1}), 20, ["on 2 shards"])
    assert d["codeName"] == "IllegalOperation"
    with pytest.raises(OperationFailure):
        cluster.routing("x.c")  # nothing recorded


def test_shard_collection_bad_input(cluster):
    admin = cluster.proxy_client(0).admin
    fails(lambda: cluster.proxy_client(0).app.command("shardCollection", "app.c",
                                                      key={"a": 1}), 13, ["admin database"])
    fails(lambda: admin.command("shardCollection", "nodot", key={"a": 1}), 73)
    fails(lambda: admin.command("shardCollection", "app.c"), 72, ["no shard key"])
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": -1}), 2)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": "text"}), 2)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": "hashed", "b": 1}), 72)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": "hashed"},
                                unique=True), 72, ["unique"])
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": 1},
                                numInitialChunks=4), 72, ["hashed"])
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": "hashed"},
                                numInitialChunks=-1), 51024)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": "hashed"},
                                numInitialChunks=8192 * 3 + 1), 72)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": 1},
                                collation={"locale": "fr"}), 238, ["simple"])
    fails(lambda: admin.command("shardCollection", "config.c", key={"a": 1}), 20)
    fails(lambda: admin.command("shardCollection", "app.c", key={"a": 1},
                                timeseries={"timeField": "t"}), 72, ["timeseries"])
    fails(lambda: admin.command("enableSharding", "a.b"), 73)
    fails(lambda: admin.command("enableSharding", "config"), 72)
    # collation simple is accepted; nothing of the refusals above was recorded
    assert admin.command("shardCollection", "app.c", key={"a": 1},
                         collation={"locale": "simple"})["ok"] == 1
    assert cluster.routing("app.c")["key"] == {"a": 1}


def test_unique_shard_key_is_enforced(cluster):
    admin = cluster.proxy_client(0).admin
    admin.command("shardCollection", "u.c", key={"email": 1}, unique=True)
    names = [ix["name"] for ix in cluster.proxy_client(0).u.c.list_indexes()]
    assert "email_1" in names
    c = cluster.proxy_client(0).u.c
    c.insert_one({"email": "a@x"})
    with pytest.raises(DuplicateKeyError):
        cluster.proxy_client(1).u.c.insert_one({"email": "a@x"})
    assert c.count_documents({"email": "a@x"}) == 1


def test_existing_unique_index_not_prefixed_by_the_key_is_refused(cluster):
    """MongoDB: a collection with a unique index that does not start with the proposed
    shard key cannot be sharded (72): uniqueness could not be kept across shards."""
    p = cluster.proxy_client(0)
    p.app.pre.insert_many([{"k": i, "email": f"e{i}"} for i in range(5)])
    p.app.pre.create_index("email", unique=True)
    e = fails(lambda: p.admin.command("shardCollection", "app.pre", key={"k": 1}), 72,
              ["unique index", "prefix"])
    fails(lambda: p.admin.command("shardCollection", "app.pre", key={"k": "hashed"}), 72)
    with pytest.raises(OperationFailure):
        cluster.routing("app.pre")  # nothing was sharded
    del e
    # prefixed by the key: accepted, and uniqueness holds
    p.app.ok.insert_many([{"email": f"e{i}", "n": i} for i in range(5)])
    p.app.ok.create_index([("email", 1), ("n", 1)], unique=True)
    assert p.admin.command("shardCollection", "app.ok", key={"email": 1})["ok"] == 1


def test_list_shards_and_add_shard_replica_set_uri(cluster, start_role, tmp_path):
    admin = cluster.proxy_client(0).admin
    shards = admin.command("listShards")["shards"]
    assert [s["_id"] for s in shards] == cluster.shard_ids
    for s in shards:
        assert s["host"] == f"127.0.0.1:{cluster.shard_ports[s['_id']]}" and s["state"] == 1
    # a one-member replica set "rsd", and a standalone shard
    port, raft = free_port(), free_port()
    d = tmp_path / "rs-d"
    d.mkdir()
    start_role(["--role=shard", "--replica-set=rsd", "--node-id=1", f"--data-dir={d}",
                f"--listen=127.0.0.1:{port}", f"--raft-listen=127.0.0.1:{raft}",
                f"--bootstrap-members=1@127.0.0.1:{raft}", "--raft-tls=disabled"])
    solo = free_port()
    d2 = tmp_path / "solo"
    d2.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{solo}", f"--data-dir={d2}"])
    from pymongo import MongoClient

    def answers(p):
        with MongoClient(f"mongodb://127.0.0.1:{p}/?directConnection=true",
                         serverSelectionTimeoutMS=2000) as m:
            return m.admin.command("ping")["ok"] == 1
    for p_ in (port, solo):
        wait_until(lambda: answers(p_), 30, what=f"shard on {p_} answering")
    before = cluster.meta_query({"listShards": 1})["shards"]
    # checked before anything is registered, as MongoDB's _validateHostAsShard: a host that
    # does not answer, a set name that is not the host's, a set member without its set
    # name, a standalone given as a set, a router
    fails(lambda: admin.command("addShard", "127.0.0.1:1", name="other"), 6,
          ["couldn't connect to new shard"])
    fails(lambda: admin.command("addShard", f"wrong/127.0.0.1:{port}"), 96,
          ["does not match the actual set name rsd"])
    fails(lambda: admin.command("addShard", f"127.0.0.1:{port}", name="x"), 96,
          ["host is part of set rsd"])
    fails(lambda: admin.command("addShard", f"rsx/127.0.0.1:{solo}"), 96,
          ["did not return a set name"])
    fails(lambda: admin.command("addShard", f"127.0.0.1:{cluster.proxy_ports[0]}",
                                name="router"), 96, ["can't add a mongos"])
    assert cluster.meta_query({"listShards": 1})["shards"] == before
    wait_until(lambda: admin.command("addShard", f"rsd/127.0.0.1:{port}")["shardAdded"] == "rsd",
               30, what="rsd has a primary and is added")
    got = {s["_id"]: s["host"] for s in admin.command("listShards")["shards"]}
    assert got["rsd"] == f"rsd/127.0.0.1:{port}"
    meta = {s["id"]: s["uri"] for s in cluster.meta_query({"listShards": 1})["shards"]}
    assert meta["rsd"] == f"mongodb://127.0.0.1:{port}/?replicaSet=rsd"
    r = admin.command("addShard", f"127.0.0.1:{solo}", name="other")
    assert r["shardAdded"] == "other"
    # the same shard again: ok, as on a mongos; the name for another host: 11000
    assert admin.command("addShard", f"127.0.0.1:{solo}", name="other")["shardAdded"] == "other"
    fails(lambda: admin.command("addShard", f"rsd/127.0.0.1:{port}", name="other"), 11000,
          ["already taken"])
    fails(lambda: admin.command("addShard", ""), 2)
    fails(lambda: cluster.proxy_client(0).db.command("listShards"), 13)


def test_balancer_commands_tell_the_truth(cluster):
    admin = cluster.proxy_client(0).admin
    st = admin.command("balancerStatus")
    assert st["mode"] == "off" and st["inBalancerRound"] is False
    assert "no balancer" in st["note"]
    assert "no balancer" in admin.command("balancerStop")["note"]
    d = fails(lambda: admin.command("balancerStart"), 115, ["no balancer"])
    assert d["codeName"] == "CommandNotSupported"


def test_refine_and_reshard_are_refused(cluster):
    admin = cluster.proxy_client(0).admin
    admin.command("shardCollection", "z.c", key={"a": 1})
    fails(lambda: admin.command("refineCollectionShardKey", "z.c", key={"a": 1, "b": 1}),
          115, ["refineCollectionShardKey"])
    fails(lambda: admin.command("reshardCollection", "z.c", key={"b": 1}), 115,
          ["reshardCollection"])
    assert cluster.routing("z.c")["key"] == {"a": 1}


# ---------- the config database (read-only views of metadata) ----------

def test_config_database_shapes(cluster):
    p = cluster.proxy_client(0)
    p.admin.command("shardCollection", "cfg.h", key={"_id": "hashed"}, numInitialChunks=4)
    p.admin.command("shardCollection", "cfg.r", key={"a": 1, "b": 1})
    cfg = p.config
    assert cfg.version.find_one()["_id"] == 1
    shards = list(cfg.shards.find().sort("_id", 1))
    assert [s["_id"] for s in shards] == cluster.shard_ids
    assert all(s["state"] == 1 and s["host"].startswith("127.0.0.1:") for s in shards)
    dbs = {d["_id"]: d for d in cfg.databases.find()}
    assert dbs["cfg"]["primary"] == "shard-a" and dbs["cfg"]["partitioned"] is True
    colls = {c["_id"]: c for c in cfg.collections.find({"dropped": {"$ne": True}})}
    assert colls["cfg.h"]["key"] == {"_id": "hashed"}
    assert colls["cfg.r"]["key"] == {"a": 1, "b": 1}
    # config.chunks is exactly metadata's routing table
    for ns in ("cfg.h", "cfg.r"):
        want = sorted((str(ch["id"]), ch["shard"]) for ch in cluster.routing(ns)["chunks"])
        got = sorted((str(ch["_id"]), ch["shard"]) for ch in cfg.chunks.find({"ns": ns}))
        assert got == want
    assert cfg.chunks.count_documents({"ns": "cfg.h"}) == 4
    per_shard = list(cfg.chunks.aggregate([
        {"$match": {"ns": "cfg.h"}}, {"$group": {"_id": "$shard", "n": {"$sum": 1}}},
        {"$sort": {"_id": 1}}]))
    assert sum(x["n"] for x in per_shard) == 4
    # batches: getMore through the proxy cursor
    assert len(list(cfg.chunks.find(batch_size=2))) == 5
    assert cfg.settings.find_one({"_id": "balancer"})["stopped"] is True
    assert list(cfg.changelog.find()) == []
    names = cfg.list_collection_names()
    assert {"shards", "chunks", "collections", "databases", "version"} <= set(names)
    fails(lambda: cfg.settings.insert_one({"_id": "x"}), 20, ["read-only"])
    fails(lambda: cfg.shards.drop(), 20)
    # every answer above freed what it built: a clean exit, no sanitizer report
    admin = p.admin
    admin.command("listShards")
    admin.command("balancerStatus")
    fails(lambda: admin.command("balancerStart"), 115)
    cluster.stop_proxy_clean(0)


MONGOSH_STATUS = r"""
sh.enableSharding('ms');
sh.shardCollection('ms.empty', {k: 1});
const d = db.getSiblingDB('ms');
d.full.insertMany([{_id: 1}, {_id: 2}, {_id: 3}, {_id: 4}, {_id: 5}]);
sh.shardCollection('ms.full', {_id: 'hashed'}, false, {numInitialChunks: 6});
sh.splitAt('ms.empty', {k: 10});
const st = sh.status();
const docs = d.full.find().sort({_id: 1}).toArray().map(x => x._id);
const out = {
  shards: st.value.shards.map(s => s._id),
  dbs: st.value.databases.map(x => x.database._id),
  full: st.value.databases.find(x => x.database._id === 'ms').collections['ms.full'],
  empty: st.value.databases.find(x => x.database._id === 'ms').collections['ms.empty'],
  balancerEnabled: st.value.balancer['Currently enabled'],
  balancerState: sh.getBalancerState(),
  docs,
  dist: d.full.getShardDistribution().value.Totals,
};
print(JSON.stringify(out));
"""


@needs_node_client("mongosh")
def test_mongosh_sh_status(cluster):
    uri = f"mongodb://127.0.0.1:{cluster.proxy_ports[0]}/?directConnection=true"
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", MONGOSH_STATUS],
                       capture_output=True, text=True, timeout=120, env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["shards"] == cluster.shard_ids
    assert "ms" in out["dbs"] and "config" in out["dbs"]
    full = out["full"]
    assert full["shardKey"] == {"_id": "hashed"}
    holder = [ch["shard"] for ch in cluster.routing("ms.full")["chunks"]]
    assert len(holder) == 6 and len(set(holder)) == 1  # non-empty: all on the holder
    assert full["chunkMetadata"] == [{"shard": holder[0], "nChunks": 6}]
    assert len(full["chunks"]) == 6
    assert out["balancerEnabled"] == "no" and out["balancerState"] is False
    assert out["docs"] == [1, 2, 3, 4, 5]
    assert out["dist"]["docs"] == 5 and out["dist"]["chunks"] == 6, out["dist"]
    empty = out["empty"]
    assert empty["shardKey"] == {"k": 1} and len(empty["chunks"]) == 2
    assert sum(x["nChunks"] for x in empty["chunkMetadata"]) == 2


MONGOSH_ADMIN = r"""
const added = sh.addShard('127.0.0.1:NEWPORT');
sh.enableSharding('ma');
const d = db.getSiblingDB('ma');
sh.shardCollection('ma.empty', {k: 1});
d.ranged.insertMany(Array.from({length: 100}, (_, i) => ({_id: i, k: i})));
d.ranged.createIndex({k: 1});
sh.shardCollection('ma.ranged', {k: 1});
d.hashed.insertMany(Array.from({length: 50}, (_, i) => ({_id: i, u: 'user' + i})));
sh.shardCollection('ma.hashed', {u: 'hashed'});
sh.splitAt('ma.ranged', {k: 50});
const moved = sh.moveChunk('ma.ranged', {k: 70}, added.shardAdded);
db.adminCommand({moveRange: 'ma.ranged', toShard: added.shardAdded, min: {k: 10}, max: {k: 20}});
const st = sh.status();
const ma = st.value.databases.find(x => x.database._id === 'ma');
print(JSON.stringify({
  added: added.shardAdded,
  shards: st.value.shards.map(s => s._id),
  moved: moved.ok,
  ranged: ma.collections['ma.ranged'],
  hashed: ma.collections['ma.hashed'],
  empty: ma.collections['ma.empty'],
  dist: d.ranged.getShardDistribution().value,
  count: d.ranged.countDocuments({}),
  hcount: d.hashed.countDocuments({}),
}));
"""


@needs_node_client("mongosh")
def test_mongosh_administers_sharding(start_role, tmp_path):
    """issue #18's mongosh script against a proxy: add a shard, enable sharding, shard an
    empty and two non-empty collections (ranged, hashed), split, move a chunk and a range
    (a coordinator runs the migrations), then sh.status() and getShardDistribution() are
    checked against metadata."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        port = free_port()
        d = tmp_path / "added"
        d.mkdir()
        start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
        uri = f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/?directConnection=true"
        r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval",
                            MONGOSH_ADMIN.replace("NEWPORT", str(port))],
                           capture_output=True, text=True, timeout=240, env=node_env())
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        added = out["added"]
        meta_shards = [s["id"] for s in cl.meta_read({"listShards": 1})["shards"]]
        assert sorted(out["shards"]) == sorted(meta_shards) and added in meta_shards
        assert out["moved"] == 1
        ranged = cl.chunks("ma.ranged")
        # [MinKey,10) [10,20) [20,50) on the holder; [10,20) and [50,MaxKey) moved
        on = {(str(ch["min"]), str(ch["max"])): ch["shard"] for ch in ranged}
        assert len(ranged) == 4, ranged
        assert on[(str({"k": 10}), str({"k": 20}))] == added
        assert [ch["shard"] for ch in ranged if ch["min"] == {"k": 50}] == [added]
        status = out["ranged"]
        assert status["shardKey"] == {"k": 1} and len(status["chunks"]) == 4
        per = {x["shard"]: x["nChunks"] for x in status["chunkMetadata"]}
        expect = {}
        for ch in ranged:
            expect[ch["shard"]] = expect.get(ch["shard"], 0) + 1
        assert per == expect
        assert out["count"] == 100 and out["hcount"] == 50
        dist = out["dist"]
        assert dist["Totals"]["docs"] == 100 and dist["Totals"]["chunks"] == 4, dist
        assert out["hashed"]["shardKey"] == {"u": "hashed"}
        assert out["empty"]["shardKey"] == {"k": 1}
        import pymongo
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as sh:
            there = {x["_id"] for x in sh.ma.ranged.find()}
        assert set(range(10, 20)) | set(range(50, 100)) <= there  # moved (orphans may wait)
        p = cl.proxy_client(0)
        assert sorted(x["_id"] for x in p.ma.ranged.find()) == list(range(100))
        assert sorted(x["_id"] for x in p.ma.hashed.find()) == list(range(50))
    finally:
        cl.close()


# ---------- stripedb ctl shard add|remove, db, collection ----------

def ctl(cl, *args, metadata=None):
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    return subprocess.run([BIN, "ctl", f"--metadata={metadata or cl.metadata_addr}", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def ok(r):
    assert r.returncode == 0, r.stderr
    return r.stdout


def usage_error(r, words):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words in r.stderr, r.stderr


def cluster_error(r, words):
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_ctl_catalog(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        # shard add / remove (a replica-set URI), seen by the proxy as by metadata
        uri = "mongodb://127.0.0.1:1,127.0.0.1:2/?replicaSet=rsx"
        assert ok(ctl(cl, "shard", "add", "rsx", uri)).strip() == f"shard rsx added ({uri})"
        meta = {s["id"]: s["uri"] for s in cl.meta_query({"listShards": 1})["shards"]}
        assert meta["rsx"] == uri
        hosts = {s["_id"]: s["host"] for s in
                 cl.proxy_client(0).admin.command("listShards")["shards"]}
        assert hosts["rsx"] == "rsx/127.0.0.1:1,127.0.0.1:2"
        cluster_error(ctl(cl, "shard", "add", "rsx", uri), "stripedb ctl:")
        assert ok(ctl(cl, "shard", "remove", "rsx")).strip() == "shard rsx removed"
        assert "rsx" not in {s["id"] for s in cl.meta_query({"listShards": 1})["shards"]}
        cluster_error(ctl(cl, "shard", "remove", "nosuch"), "stripedb ctl:")
        usage_error(ctl(cl, "shard", "add", "x"), "usage")
        usage_error(ctl(cl, "shard", "add", "x", "not-a-uri"), "usage")
        usage_error(ctl(cl, "shard", "remove"), "usage")

        # db create / list
        assert ok(ctl(cl, "db", "create", "cat")).strip() == "database cat created"
        cluster_error(ctl(cl, "db", "create", "cat"), "stripedb ctl:")
        cluster_error(ctl(cl, "db", "create", "t1db", "--tenant", "nosuch"), "stripedb ctl:")
        rows = [json.loads(x) for x in ok(ctl(cl, "--json", "db", "list")).splitlines()]
        assert {"name": "cat"} in [{"name": r["name"]} for r in rows]
        assert "cat" in ok(ctl(cl, "db", "list")).split()
        usage_error(ctl(cl, "db", "create"), "usage")
        usage_error(ctl(cl, "db", "create", "a.b"), "invalid database name")
        usage_error(ctl(cl, "db", "frob"), "usage")
        usage_error(ctl(cl, "db", "create", "t2db", "--primary"), "usage")
        cluster_error(ctl(cl, "db", "create", "t2db", "--primary", "nosuch"), "stripedb ctl:")

        # collection create / list / drop
        out = ok(ctl(cl, "collection", "create", "cat.h", "--shard-key", "u", "--hashed",
                     "--chunks", "4"))
        assert out.strip() == "collection cat.h sharded"
        t = cl.routing("cat.h")
        assert t["key"] == {"u": "hashed"} and t["hashed"] is True and len(t["chunks"]) == 4
        ok(ctl(cl, "collection", "create", "cat.r", "--shard-key=a,b", "--on", "shard-b"))
        t = cl.routing("cat.r")
        assert [ch["shard"] for ch in t["chunks"]] == ["shard-b"]
        rows = [json.loads(x) for x in
                ok(ctl(cl, "--json", "collection", "list", "cat")).splitlines()]
        assert sorted(r["ns"] for r in rows) == ["cat.h", "cat.r"]
        # --json after the subcommand too (it was taken for a database name)
        assert [json.loads(x) for x in
                ok(ctl(cl, "collection", "list", "cat", "--json")).splitlines()] == rows
        text = ok(ctl(cl, "collection", "list"))
        assert "cat.h" in text and "hashed" in text and "ranged" in text
        cluster_error(ctl(cl, "collection", "create", "cat.h", "--shard-key", "u"),
                      "stripedb ctl:")
        # the proxy routes by what ctl created
        c = cl.proxy_client(0).cat.r
        c.insert_many([{"_id": i, "a": i, "b": 0} for i in range(10)])
        assert cl.shard_client("shard-b").cat.r.count_documents({}) == 10
        assert ok(ctl(cl, "collection", "drop", "cat.h")).strip().startswith(
            "collection cat.h dropped")
        with pytest.raises(OperationFailure):
            cl.routing("cat.h")
        # a collection that already holds documents: its chunks start on their shard
        cl.shard_client("shard-b").cat.full.insert_many([{"_id": i} for i in range(5)])
        ok(ctl(cl, "collection", "create", "cat.full", "--shard-key", "_id", "--hashed",
               "--chunks", "4"))
        assert {ch["shard"] for ch in cl.routing("cat.full")["chunks"]} == {"shard-b"}
        assert sorted(d["_id"] for d in cl.proxy_client(0).cat.full.find()) == list(range(5))
        cl.shard_client("shard-a").cat.two.insert_one({"_id": 1})
        cl.shard_client("shard-b").cat.two.insert_one({"_id": 2})
        cluster_error(ctl(cl, "collection", "create", "cat.two", "--shard-key", "_id"),
                      "holds documents on shards")
        cl.shard_client("shard-a").cat.one.insert_one({"_id": 1})
        cluster_error(ctl(cl, "collection", "create", "cat.one", "--shard-key", "_id",
                          "--on", "shard-b"), "must start there")
        usage_error(ctl(cl, "collection", "create", "cat.x"), "--shard-key is required")
        usage_error(ctl(cl, "collection", "create", "cat.x", "--shard-key", "a,b",
                        "--hashed"), "hashed key has one field")
        usage_error(ctl(cl, "collection", "create", "cat.x", "--shard-key", "a",
                        "--chunks", "3"), "--chunks needs --hashed")
        usage_error(ctl(cl, "collection", "create", "cat.x", "--shard-key", "a",
                        "--hashed", "--chunks", "zero"), "positive integer")
        usage_error(ctl(cl, "collection", "create", "nodot", "--shard-key", "a"), "usage")
        usage_error(ctl(cl, "collection", "drop"), "usage")
        # unreachable metadata: exit 1, one line
        cluster_error(ctl(cl, "--timeout-ms=500", "db", "list", metadata="127.0.0.1:1"),
                      "stripedb ctl:")
    finally:
        cl.close()


def test_drop_through_proxy_drops_sharding_metadata(cluster):
    p = cluster.proxy_client(0)
    p.admin.command("shardCollection", "dr.c", key={"_id": "hashed"}, numInitialChunks=3)
    p.dr.c.insert_many([{"_id": i} for i in range(30)])
    p.dr.c.drop()
    with pytest.raises(OperationFailure) as e:
        cluster.routing("dr.c")
    assert e.value.code == 26
    assert all(cluster.shard_client(s).dr.c.count_documents({}) == 0 for s in cluster.shard_ids)
    # the other proxy follows; the collection is unsharded now, and can be sharded anew
    q = cluster.proxy_client(1)
    q.dr.c.insert_many([{"_id": i, "k": i} for i in range(5)])
    assert sorted(d["_id"] for d in q.dr.c.find()) == list(range(5))
    holders = [s for s in cluster.shard_ids if cluster.shard_client(s).dr.c.count_documents({})]
    assert len(holders) == 1
    q.dr.c.create_index("k")  # a collection with documents needs the shard key's index
    p.admin.command("shardCollection", "dr.c", key={"k": 1})
    assert cluster.routing("dr.c")["key"] == {"k": 1}
    assert sorted(d["_id"] for d in p.dr.c.find()) == list(range(5))
    p.dr.nothere.drop()  # dropping an unknown collection is fine


def test_writes_right_after_a_drop_follow_the_new_routing(cluster):
    """The proxy that drops a sharded collection routes the writes that follow it as
    unsharded, to the primary shard only. Its reload after the drop read metadata's "not
    sharded", which carried no routing version: cached at version 0, it could not replace
    the dropped collection's newer snapshot, so the next writes went by the dropped chunks
    to every shard; once the refresh thread caught up, the collection was unsharded and the
    documents on the other shards were hidden (an acknowledged insert no read or delete
    found: test_crud_report.py, "deletedCount: expected 1, got 0")."""
    p = cluster.proxy_client(0)
    for rnd in range(4):
        db = f"dropw{rnd}"
        cluster.shard_collection(f"{db}.c", {"_id": 1},
                                 split_points=[{"_id": 10}, {"_id": 20}])
        p[db].c.insert_many([{"_id": i} for i in range(30)])  # p's cache: the chunks
        assert len([s for s in cluster.shard_ids
                    if cluster.shard_client(s)[db].c.count_documents({})]) == 3
        p[db].c.drop()
        # metadata's "not sharded" says at which routing version it holds (what the proxy
        # caches it at): the drop's, or later
        with pytest.raises(OperationFailure) as e:
            cluster.routing(f"{db}.c")
        assert e.value.code == 26
        assert e.value.details["routingVersion"] >= cluster.routing_version() > 0
        p[db].c.insert_many([{"_id": i} for i in range(30)])
        holders = [s for s in cluster.shard_ids
                   if cluster.shard_client(s)[db].c.count_documents({})]
        assert len(holders) == 1, (rnd, holders)
        assert p[db].c.count_documents({}) == 30
        assert p[db].c.delete_one({"_id": 25}).deleted_count == 1


def test_shard_key_index_required_with_documents_and_created_without(cluster):
    """MongoDB's rule: sharding a collection that holds documents needs an index starting
    with the shard key (not sparse, not partial), else 72 InvalidOptions and nothing
    changes; sharding an empty (or absent) collection creates it on the shards."""
    p = cluster.proxy_client(0)
    p.ix.a.insert_many([{"_id": i, "k": i % 7, "x": i} for i in range(50)])
    p.ix.a.create_index([("k", 1)], sparse=True, name="k_sparse")
    p.ix.a.create_index([("x", 1), ("k", 1)])  # k is not its prefix
    with pytest.raises(OperationFailure) as e:
        p.admin.command("shardCollection", "ix.a", key={"k": 1})
    assert e.value.code == 72
    assert "Please create an index that starts with the proposed shard key" in str(e.value)
    with pytest.raises(OperationFailure):
        cluster.routing("ix.a")  # not sharded
    p.ix.a.create_index([("k", 1), ("x", 1)])  # the shard key is its prefix
    p.admin.command("shardCollection", "ix.a", key={"k": 1})
    assert cluster.routing("ix.a")["key"] == {"k": 1}
    assert p.ix.a.count_documents({}) == 50
    # empty: created on the shards with MongoDB's default name
    p.admin.command("shardCollection", "ix.b", key={"k": 1, "j": 1})
    for s in cluster.shard_ids:
        ix = {i["name"]: i["key"] for i in cluster.shard_client(s).ix.b.list_indexes()}
        assert ix.get("k_1_j_1") == {"k": 1, "j": 1}, (s, ix)


def test_tenants_cannot_administer_sharding(start_role, tmp_path):
    """--auth=enabled: cluster administration is not a tenant's (13 Unauthorized)."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=["--auth=enabled"])
    try:
        cl.meta_cmd({"createTenant": "A"})
        cl.create_database("adb", tenant="A")
        cl.meta_cmd({"createUser": "alice", "tenant": "A", "password": "alice-pw"})
        alice = cl.proxy_client(0, username="alice", password="alice-pw", authSource="admin")
        wait_until(lambda: alice.adb.c.insert_one({"_id": 1}), 20, what="alice's first write")
        for cmd in ({"enableSharding": "adb"},
                    {"shardCollection": "adb.c", "key": {"_id": 1}},
                    {"listShards": 1}, {"addShard": "127.0.0.1:1"},
                    {"balancerStatus": 1}, {"balancerStop": 1},
                    {"moveRange": "adb.c", "toShard": "shard-a", "min": {"_id": 1}},
                    {"mergeChunks": "adb.c", "bounds": [{"_id": 1}, {"_id": 2}]},
                    {"reshardCollection": "adb.c", "key": {"x": 1}}):
            fails(lambda: alice.admin.command(cmd), 13)
        fails(lambda: alice.config.shards.find_one(), 13)
        fails(lambda: alice.config.chunks.count_documents({}), 13)
        with pytest.raises(OperationFailure):
            cl.routing("adb.c")  # nothing was sharded
    finally:
        cl.close()


def test_split_at_middle(cluster):
    p = cluster.proxy_client(0)
    admin = p.admin
    admin.command("shardCollection", "sp.c", key={"k": 1})
    p.sp.c.insert_many([{"_id": i, "k": i} for i in range(100)])
    assert admin.command("split", "sp.c", middle={"k": 50})["ok"] == 1
    assert admin.command("split", "sp.c", middle={"k": 20})["ok"] == 1
    chunks = sorted(cluster.routing("sp.c")["chunks"], key=lambda ch: str(ch["min"]))
    bounds = sorted(ch["max"]["k"] for ch in chunks if isinstance(ch["max"]["k"], int))
    assert bounds == [20, 50] and len(chunks) == 3
    for i in range(2):
        c = cluster.proxy_client(i).sp.c
        wait_until(lambda: sorted(d["_id"] for d in c.find()) == list(range(100)), 10,
                   what="every document once after the splits")
    fails(lambda: admin.command("split", "sp.c", middle={"k": 50}), 2)  # a bound already
    fails(lambda: admin.command("split", "sp.c", middle={"x": 5}), 2)
    # find / bounds (sh.splitFind): at the median of the chunk's documents
    assert admin.command("split", "sp.c", find={"k": 70})["ok"] == 1  # [50, MaxKey): 50..99
    assert admin.command("split", "sp.c", bounds=[{"k": 20}, {"k": 50}])["ok"] == 1  # 20..49
    bounds = sorted(ch["max"]["k"] for ch in cluster.routing("sp.c")["chunks"]
                    if isinstance(ch["max"]["k"], int))
    assert bounds == [20, 35, 50, 75], bounds
    for i in range(2):
        c = cluster.proxy_client(i).sp.c
        wait_until(lambda: sorted(d["_id"] for d in c.find()) == list(range(100)), 10,
                   what="every document once after the median splits")
    fails(lambda: admin.command("split", "sp.c", bounds=[{"k": 0}, {"k": 21}]), 2)  # not a chunk
    p.sp.c.delete_many({"k": {"$gte": 75}})
    fails(lambda: admin.command("split", "sp.c", find={"k": 80}), 2, ["median"])  # empty chunk
    admin.command("shardCollection", "sp.h", key={"k": "hashed"})
    fails(lambda: admin.command("split", "sp.h", find={"k": 5}), 115, ["middle"])
    fails(lambda: admin.command("split", "sp.c"), 2, ["middle"])
    fails(lambda: admin.command("split", "sp.c", middle={"k": 10}, find={"k": 10}), 2)
    p.sp.u.insert_one({"_id": 1})
    d = fails(lambda: admin.command("split", "sp.u", middle={"_id": 5}), 118)
    assert d["codeName"] == "NamespaceNotSharded"
    fails(lambda: p.sp.command("split", "sp.c", middle={"k": 5}), 13)


def test_remove_shard(cluster, start_role, tmp_path):
    p = cluster.proxy_client(0)
    admin = p.admin
    port = free_port()
    d = tmp_path / "spare"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    assert admin.command("addShard", f"127.0.0.1:{port}", name="spare")["shardAdded"] == "spare"
    # shard-a is the default primary shard: refused while it holds unsharded collections
    p.keep.c.insert_one({"_id": 1})
    fails(lambda: admin.command("removeShard", "shard-a"), 20,
          ["primary shard", "keep.c", "movePrimary"])
    fails(lambda: admin.command("removeShard", "nosuch"), 70)
    fails(lambda: admin.command("removeShard", ""), 2)
    fails(lambda: p.db.command("removeShard", "spare"), 13)
    # a shard without chunks goes at once
    r = admin.command("removeShard", "spare")
    assert r["state"] == "completed" and r["shard"] == "spare"
    assert "spare" not in [s["_id"] for s in admin.command("listShards")["shards"]]
    assert "spare" not in [s["id"] for s in cluster.meta_query({"listShards": 1})["shards"]]


def test_remove_shard_drains_it_through_migrations(start_role, tmp_path):
    """removeShard of a shard that owns chunks, as on a mongos: "started" registers one
    migration per chunk (run by a coordinator), later calls report "ongoing" with the
    chunks remaining, and once drained the shard is removed ("completed"); every document
    stays visible exactly once throughout (written and read through the proxy)."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=3, proxies=1, coordinators=1)
    try:
        p = cl.proxy_client(0)
        admin = p.admin
        # six chunks, two on each shard; the victim is not the primary shard (shard-a)
        cl.shard_collection("dr.c", {"k": 1}, split_points=[{"k": 50 * i} for i in range(1, 6)],
                            shards=[cl.shard_ids[i % 3] for i in range(6)])
        p.dr.c.insert_many([{"_id": i, "k": i} for i in range(300)])
        # a shard added and removed before: the drain must never pick it as a destination
        port = free_port()
        d = tmp_path / "gone"
        d.mkdir()
        gone = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
        assert admin.command("addShard", f"127.0.0.1:{port}", name="gone")["shardAdded"] == "gone"
        assert admin.command("removeShard", "gone")["state"] == "completed"
        assert "gone" not in [s["_id"] for s in admin.command("listShards")["shards"]]
        gone.stop()
        victim = cl.shard_ids[2]
        owned = [ch for ch in cl.chunks("dr.c") if ch["shard"] == victim]
        assert owned
        r = admin.command("removeShard", victim)
        assert r["state"] == "started" and r["shard"] == victim, r
        assert r["dbsToMove"] == []
        states = ["started"]
        # config.migrations lists the drain's migrations that have not ended, as on a
        # config server; config.changelog has one entry per migration record
        active = list(p.config.migrations.find({"fromShard": victim}))
        assert {m["_id"] for m in active} <= {m["id"] for m in cl.meta_read(
            {"listMigrations": 1})["migrations"]}
        for m in active:
            assert m["ns"] == "dr.c" and m["toShard"] != victim and "min" in m and "max" in m

        def drained():
            r = admin.command("removeShard", victim)
            states.append(r["state"])
            if r["state"] == "ongoing":
                assert 0 < r["remaining"]["chunks"] <= len(owned), r
            # reads and writes go on while it drains: nothing lost, nothing doubled
            assert sorted(d["_id"] for d in p.dr.c.find({}, {"_id": 1})) == list(range(300))
            return r["state"] == "completed"
        wait_until(drained, 120, interval=0.5, what=f"{victim} drained")
        assert "ongoing" in states or len(states) == 2
        assert victim not in [s["_id"] for s in admin.command("listShards")["shards"]]
        assert all(ch["shard"] != victim for ch in cl.chunks("dr.c"))
        assert sorted(cl.owned_docs("dr.c")) == list(range(300))
        assert sorted(d["_id"] for d in p.dr.c.find()) == list(range(300))
        assert {ch["shard"] for ch in cl.chunks("dr.c")} <= set(cl.shard_ids[:2])
        assert p.config.migrations.count_documents({}) == 0
        log = list(p.config.changelog.find({"ns": "dr.c", "what": "moveChunk.commit"}))
        assert len(log) >= len(owned)
        assert all(e["details"]["from"] == victim and e["shard"] == victim for e in log)
        # the donor's entries sh.status() counts ("Migration results for the last 24 hours")
        ok = list(p.config.changelog.find({"ns": "dr.c", "what": "moveChunk.from",
                                          "details.note": "success"}))
        assert len(ok) == len(log) and all(e["_id"].endswith("-from") for e in ok)
        assert "migrations" in p.config.list_collection_names()
    finally:
        cl.close()


def test_move_range_and_merge_chunks(start_role, tmp_path):
    """moveRange (MongoDB 6.0): a sub-range of a chunk is cut out (split) and moved; a range
    spanning chunks is refused. mergeChunks: contiguous chunks of one shard become one."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        p = cl.proxy_client(0)
        admin = p.admin
        admin.command("shardCollection", "mr.c", key={"k": 1})
        p.mr.c.insert_many([{"_id": i, "k": i} for i in range(100)])
        (only,) = cl.chunks("mr.c")
        to = [s for s in cl.shard_ids if s != only["shard"]][0]
        r = admin.command("moveRange", "mr.c", toShard=to, min={"k": 20}, max={"k": 40},
                          waitForDelete=True)
        assert r["ok"] == 1 and cl.migration(r["migration"])["state"] == "complete"
        by_min = {str(ch["min"]): ch for ch in cl.chunks("mr.c")}
        assert len(by_min) == 3
        moved = by_min[str({"k": 20})]
        assert moved["max"] == {"k": 40} and moved["shard"] == to
        assert sorted(d["_id"] for d in cl.shard_client(to).mr.c.find()) == list(range(20, 40))
        assert sorted(d["_id"] for d in p.mr.c.find()) == list(range(100))
        # min only: to the end of its chunk; already there: ok
        r = admin.command("moveRange", "mr.c", toShard=to, min={"k": 40})
        assert [ch["shard"] for ch in cl.chunks("mr.c") if ch["min"] == {"k": 40}] == [to]
        assert admin.command("moveRange", "mr.c", toShard=to, min={"k": 20})["ok"] == 1
        # refused: spanning chunks, empty, no bounds, unknown shard, not sharded
        fails(lambda: admin.command("moveRange", "mr.c", toShard=only["shard"],
                                    min={"k": 10}, max={"k": 30}), 2, ["within one chunk"])
        fails(lambda: admin.command("moveRange", "mr.c", toShard=to, min={"k": 30},
                                    max={"k": 30}), 2)
        fails(lambda: admin.command("moveRange", "mr.c", toShard=to), 2, ["min or max"])
        fails(lambda: admin.command("moveRange", "mr.c", toShard="nosuch", min={"k": 1}), 70)
        fails(lambda: admin.command("moveRange", "mr.c", min={"k": 1}), 2, ["toShard"])
        p.mr.u.insert_one({"_id": 1})
        fails(lambda: admin.command("moveRange", "mr.u", toShard=to, min={"_id": 1}), 118)
        # mergeChunks: [20, MaxKey) is two chunks on `to`
        chunks = sorted(cl.chunks("mr.c"), key=lambda ch: str(ch["min"]))
        assert len(cl.chunks("mr.c")) == 3
        from bson import MaxKey, MinKey
        fails(lambda: admin.command("mergeChunks", "mr.c", bounds=[{"k": MinKey()}, {"k": MaxKey()}]),
              20, ["contiguous chunks of one shard"])
        fails(lambda: admin.command("mergeChunks", "mr.c", bounds=[{"k": 25}, {"k": MaxKey()}]),
              20, ["lower bound"])
        fails(lambda: admin.command("mergeChunks", "mr.c", bounds=[{"k": 20}]), 2)
        assert admin.command("mergeChunks", "mr.c", bounds=[{"k": 20}, {"k": MaxKey()}])["ok"] == 1
        after = cl.chunks("mr.c")
        assert len(after) == 2
        assert [ch["shard"] for ch in after if ch["min"] == {"k": 20}] == [to]
        assert [ch["max"] for ch in after if ch["min"] == {"k": 20}] == [{"k": MaxKey()}]
        assert sorted(d["_id"] for d in p.mr.c.find()) == list(range(100))
        assert p.mr.c.count_documents({"k": {"$gte": 20}}) == 80
        del chunks
    finally:
        cl.close()


def test_move_chunk_runs_a_migration(start_role, tmp_path):
    """sh.moveChunk / moveChunk through the proxy: one migration of the Data Movement
    Platform (a coordinator runs it); answered once it is complete."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        p = cl.proxy_client(0)
        admin = p.admin
        admin.command("shardCollection", "mv.c", key={"k": 1})
        admin.command("split", "mv.c", middle={"k": 50})
        p.mv.c.insert_many([{"_id": i, "k": i} for i in range(100)])
        low = [ch for ch in cl.chunks("mv.c") if ch["max"] == {"k": 50}][0]
        to = [s for s in cl.shard_ids if s != low["shard"]][0]
        r = admin.command("moveChunk", "mv.c", find={"k": 7}, to=to, _waitForDelete=True)
        assert r["ok"] == 1 and r["migration"].startswith("mig-proxy-")
        assert cl.migration(r["migration"])["state"] == "complete"
        assert [ch["shard"] for ch in cl.chunks("mv.c") if ch["max"] == {"k": 50}] == [to]
        owned = cl.owned_docs("mv.c")
        assert sorted(owned) == list(range(100))
        assert sorted(d["_id"] for d in p.mv.c.find()) == list(range(100))
        assert sorted(d["_id"] for d in cl.shard_client(to).mv.c.find({"k": {"$lt": 50}})) \
            == list(range(50))
        # by bounds, and a no-op when already there
        high = [ch for ch in cl.chunks("mv.c") if ch["min"] == {"k": 50}][0]
        assert admin.command("moveChunk", "mv.c", bounds=[high["min"], high["max"]],
                             to=high["shard"])["ok"] == 1
        fails(lambda: admin.command("moveChunk", "mv.c", bounds=[{"k": 1}, {"k": 2}], to=to), 2)
        fails(lambda: admin.command("moveChunk", "mv.c", find={"k": 1}), 2, ["to"])
        fails(lambda: admin.command("moveChunk", "mv.c", to=to), 2, ["find or bounds"])
        p.mv.u.insert_one({"_id": 1})
        fails(lambda: admin.command("moveChunk", "mv.u", find={"_id": 1}, to=to), 118)
        fails(lambda: admin.command("moveChunk", "mv.c", find={"k": 1}, to="nosuch"), 70)
        assert sorted(d["_id"] for d in p.mv.c.find()) == list(range(100))
        # a second moveChunk of a chunk whose migration has not ended: 117, as MongoDB (the
        # coordinator is stopped, so the first one stays registered)
        import signal
        for co in cl.coords:
            co.signal(signal.SIGSTOP)
        try:
            high = [ch for ch in cl.chunks("mv.c") if ch["min"] == {"k": 50}][0]
            other = [s for s in cl.shard_ids if s != high["shard"]][0]
            first = cl.migrate("mv.c", high["id"], other)
            d = fails(lambda: admin.command("moveChunk", "mv.c", find={"k": 70}, to=other), 117,
                      ["already being migrated"])
            assert d["codeName"] == "ConflictingOperationInProgress"
        finally:
            for co in cl.coords:
                co.signal(signal.SIGCONT)
        assert cl.wait_migration(first)["state"] == "complete"
        assert sorted(d["_id"] for d in p.mv.c.find()) == list(range(100))
    finally:
        cl.close()
