"""Sharding administration at cluster op version 3 (issue #18; raft/migstate.h), through a
proxy with pymongo:

- removeShard marks the shard draining in metadata: a later shardCollection places no chunk
  on it, a later drain does not send chunks to it, and shardCollection is refused clearly
  when every shard is draining;
- hashed shardCollection with numInitialChunks N places its split points as MongoDB does
  (initial_split_policy.cpp calculateHashedSplitPoints: symmetric around 0);
- config.mongos lists the proxies (each pings metadata), in MongoDB's shape.

Below op version 3 (the default, while members may run an older binary) both behave as
before, which the tests check first.
"""
import datetime
import subprocess

import pytest
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

from conftest import BIN, OP_VERSION_MAX, wait_until
from proxy_helpers import ProxyCluster

INT64_MAX = 2**63 - 1


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    yield cl
    cl.close()


def mongodb_hashed_split_points(n):
    """MongoDB's calculateHashedSplitPoints for numInitialChunks n, as written there."""
    if n == 1:
        return []
    interval = (INT64_MAX // n) * 2
    cur, pts = 0, []
    if n % 2 == 0:
        pts.append(0)
        cur += interval
    else:
        cur += interval // 2
    for _ in range((n - 1) // 2):
        pts += [cur, -cur]
        cur += interval
    return sorted(pts)


def bounds(cl, ns):
    chunks = sorted(cl.routing(ns)["chunks"], key=lambda ch: ch["id"])
    lows = [ch["min"]["h"] for ch in chunks]
    highs = [ch["max"]["h"] for ch in chunks]
    assert isinstance(lows[0], MinKey) and isinstance(highs[-1], MaxKey)
    assert lows[1:] == highs[:-1]  # contiguous
    return lows[1:], chunks


def op_version(cluster):
    return cluster.meta_query({"metadataStatus": 1})["opVersion"]


def at_op_version_2(cluster):
    """A new cluster starts at the newest op version (its leader raises it once ready); an
    existing cluster upgraded in place stays at 2 until an operator raises it: lower it to
    2 to check the behaviour such a cluster keeps."""
    wait_until(lambda: op_version(cluster) == OP_VERSION_MAX, 30,
               what="the new cluster's newest op version")
    assert cluster.meta_cmd({"setOpVersion": 2})["previousVersion"] == OP_VERSION_MAX
    assert op_version(cluster) == 2


def test_a_new_cluster_starts_at_the_newest_op_version(cluster):
    wait_until(lambda: op_version(cluster) == OP_VERSION_MAX, 30,
               what="the newest op version with no setOpVersion")
    # the raise happens once: lowered by an operator, it stays lowered across a restart
    cluster.meta_cmd({"setOpVersion": 2})
    m = cluster.meta.members[0]
    cluster.meta.kill(m)
    cluster.meta.restart(m)
    cluster.meta.leader()
    wait_until(lambda: cluster.meta_query({"metadataStatus": 1})["ready"], 30,
               what="the restarted leader ready")
    assert op_version(cluster) == 2


def test_hashed_initial_split_points_match_mongodb(cluster):
    admin = cluster.proxy_client(0).admin
    at_op_version_2(cluster)
    # op version 2: the earlier even split from INT64_MIN, unchanged
    admin.command("shardCollection", "h.old", key={"h": "hashed"}, numInitialChunks=4)
    pts, _ = bounds(cluster, "h.old")
    assert pts == [-(2**63) + k * ((2**64 - 1) // 4) for k in range(1, 4)]

    cluster.meta_cmd({"setOpVersion": 3})
    for n in (2, 3, 4, 5, 6, 7, 12, 25):
        admin.command("shardCollection", f"h.c{n}", key={"h": "hashed"}, numInitialChunks=n)
        pts, chunks = bounds(cluster, f"h.c{n}")
        assert len(chunks) == n
        assert pts == mongodb_hashed_split_points(n), n
        assert all(isinstance(p, Int64) for p in pts)
    # the documents still land on the chunk that owns their hash: all read back once
    c = cluster.proxy_client(0).h.c7
    c.insert_many([{"_id": i, "h": i} for i in range(300)])
    assert sorted(d["_id"] for d in c.find()) == list(range(300))
    per_shard = [cluster.shard_client(s).h.c7.count_documents({}) for s in cluster.shard_ids]
    assert sum(per_shard) == 300 and all(n > 0 for n in per_shard), per_shard


def test_draining_shard_gets_no_new_chunks(cluster):
    p = cluster.proxy_client(0)
    admin = p.admin
    a, b, c = cluster.shard_ids
    # a collection whose chunks are all on c (set in metadata directly)
    cluster.create_database("dr")
    cluster.shard_collection("dr.c", {"k": 1}, split_points=[{"k": 10}], shards=[c])

    # op version 2: no mark, the old behaviour (chunks placed on every shard)
    at_op_version_2(cluster)
    r = admin.command("removeShard", c)
    assert r["state"] == "started", r
    assert not [s for s in admin.command("listShards")["shards"] if s.get("draining")]
    admin.command("shardCollection", "dr.before", key={"_id": "hashed"}, numInitialChunks=6)
    assert {ch["shard"] for ch in cluster.routing("dr.before")["chunks"]} == {a, b, c}

    cluster.meta_cmd({"setOpVersion": 3})
    r = admin.command("removeShard", c)
    assert r["state"] in ("started", "ongoing"), r
    shards = {s["_id"]: s for s in admin.command("listShards")["shards"]}
    assert shards[c].get("draining") is True
    assert not shards[a].get("draining") and not shards[b].get("draining")
    cfg = {s["_id"]: s for s in p.config.shards.find()}
    assert cfg[c].get("draining") is True and "draining" not in cfg[a]

    # shardCollection (hashed, presplit; and ranged) places nothing on the draining shard
    admin.command("shardCollection", "dr.h", key={"_id": "hashed"}, numInitialChunks=6)
    chunks = cluster.routing("dr.h")["chunks"]
    assert len(chunks) == 6
    assert {ch["shard"] for ch in chunks} == {a, b}
    admin.command("shardCollection", "dr.r", key={"x": 1})
    assert {ch["shard"] for ch in cluster.routing("dr.r")["chunks"]} <= {a, b}
    w = p.dr.h
    w.insert_many([{"_id": i} for i in range(100)])
    assert sorted(d["_id"] for d in w.find()) == list(range(100))
    assert cluster.shard_client(c).dr.h.count_documents({}) == 0

    # ctl shard drain (round-robin) never picks the draining c as a destination
    r = subprocess.run([BIN, "ctl", f"--metadata={cluster.metadata_addr}", "shard", "drain", a,
                        "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = [l.split() for l in r.stdout.splitlines() if l.startswith("would migrate")]
    assert plan and {l[-1] for l in plan} == {b}, r.stdout

    # a second drain (b) sends its chunks to a only, never to the draining c
    r = admin.command("removeShard", b)
    assert r["state"] in ("started", "ongoing"), r
    migs = cluster.meta_query({"listMigrations": 1})["migrations"]
    from_b = [m["spec"] for m in migs if m["spec"].get("from") == b]
    assert from_b and all(s["to"] == a for s in from_b), from_b
    admin.command("shardCollection", "dr.h2", key={"_id": "hashed"}, numInitialChunks=4)
    assert {ch["shard"] for ch in cluster.routing("dr.h2")["chunks"]} == {a}
    # ctl rebalance --bin-pack drains the least loaded shard (c, 4 chunks) into the next
    # least loaded one that is not draining: a, not the draining b (5 chunks)
    counts = {s: 0 for s in (a, b, c)}
    for ns in ("dr.c", "dr.before", "dr.h", "dr.r", "dr.h2"):
        for ch in cluster.routing(ns)["chunks"]:
            counts[ch["shard"]] += 1
    assert counts[c] < counts[b] < counts[a], counts
    r = subprocess.run([BIN, "ctl", f"--metadata={cluster.metadata_addr}", "rebalance",
                        "--bin-pack", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"bin-pack: drain {c} ({counts[c]} chunks) into {a}" in r.stdout, r.stdout
    plan = [l.split() for l in r.stdout.splitlines() if l.startswith("would migrate")]
    assert len(plan) == counts[c] and {l[-1] for l in plan} == {a}, r.stdout

    # a cannot be drained: every other shard is draining
    with pytest.raises(OperationFailure) as e:
        admin.command("removeShard", a)
    assert e.value.code == 20 and "not draining" in e.value.details["errmsg"]

    # every shard draining: shardCollection is refused, saying why
    cluster.meta_cmd({"setShardDraining": a, "draining": True})
    with pytest.raises(OperationFailure) as e:
        admin.command("shardCollection", "dr.none", key={"_id": "hashed"})
    assert e.value.code == 70 and "draining" in e.value.details["errmsg"], e.value.details
    with pytest.raises(OperationFailure) as e:  # and nothing was recorded
        cluster.routing("dr.none")
    assert e.value.code == 26


def test_config_mongos_lists_the_proxies(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=2)
    try:
        p = cl.proxy_client(0)
        assert "mongos" in p.config.list_collection_names()
        # a new cluster is at the newest op version (3 or more): the proxies ping (below 3
        # the pings are refused; unit test_raft_cluster.c)
        wait_until(lambda: op_version(cl) == OP_VERSION_MAX, 30, what="the newest op version")
        want = sorted(f"127.0.0.1:{port}" for port in cl.proxy_ports)
        docs = wait_until(lambda: (lambda d: d if sorted(x["_id"] for x in d) == want else None)(
            list(cl.proxy_client(1).config.mongos.find())), 30,
            what="both proxies in config.mongos")
        for d in docs:
            assert set(d) == {"_id", "advisoryHostFQDNs", "mongoVersion", "ping", "up",
                              "waiting"}, d
            assert isinstance(d["ping"], datetime.datetime)
            assert isinstance(d["up"], int) and d["up"] >= 0
            assert d["waiting"] is True
            assert d["mongoVersion"] == p.admin.command("buildInfo")["version"]
        # ping: the metadata leader's clock at the last ping, as listProxies has it
        rows = {r["addr"]: r for r in cl.meta_query({"listProxies": 1})["proxies"]}
        for d in docs:
            assert rows[d["_id"]]["pingMS"] >= int(d["ping"].replace(
                tzinfo=datetime.timezone.utc).timestamp() * 1000)
        assert p.config.mongos.count_documents({"_id": want[0]}) == 1
    finally:
        cl.close()
