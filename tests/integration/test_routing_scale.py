"""Routing at scale (issue #26): a proxy started cold against 200,000 chunks routes
correctly, and after a chunk move only the diff is transferred.

Real processes: one metadata member, two embedded shards, one proxy. The collection is
ranged on k with 200,000 chunks of width 10 ([10i, 10i+10), chunk i on shard i % 2), made
by ONE shardCollection (more than the old fixed cap of 100,000). Documents are inserted
through the proxy and then read on each shard DIRECTLY: every document must sit on the
shard that metadata says owns its chunk (the expected placement comes from metadata's own
table, read by cursor, not from a formula). The metadata's /metrics counters
(stripedb_metadata_routing_{replies,reply_bytes,chunks_sent}_total{kind}) then show what a
chunk move costs the proxy: one diff with the moved chunk, no full reload.
"""
import random

import pymongo
import pytest
from bson.min_key import MinKey

from conftest import http_get, wait_until
from metadata_cluster import Cluster
from proxy_helpers import ProxyCluster

NCHUNKS = 200_000
WIDTH = 10


def meta_metrics(member):
    st, body = http_get(member.http_port, "/metrics")
    assert st == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("stripedb_metadata_routing_"):
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
    return out


def full_table(client, ns):
    """Every chunk of ns by cursor (getRoutingTable batches of at most 8 MB)."""
    chunks, resume, batches = [], None, 0
    while True:
        cmd = {"getRoutingTable": ns, "cursor": {}}
        if resume is not None:
            cmd["resumeAfter"] = resume
        r = client.admin.command(cmd)
        batches += 1
        chunks.extend(r["chunks"])
        if not r["more"]:
            return chunks, batches
        resume = r["resumeAfter"]


@pytest.fixture
def cl(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield c
    c.close()


def test_cold_proxy_routes_200k_chunks_and_moves_cost_a_diff(cl):
    ns = "big.r"
    meta = cl.meta.members[0]
    mc = pymongo.MongoClient(meta.wire, directConnection=True, socketTimeoutMS=300000,
                             serverSelectionTimeoutMS=10000)
    cl.create_database("big")
    r = mc.admin.command({"shardCollection": ns, "key": {"k": 1},
                          "splitPoints": [{"k": i * WIDTH} for i in range(1, NCHUNKS)],
                          "shards": cl.shard_ids})
    assert r["chunks"] == NCHUNKS

    # without a cursor the table does not fit one reply: a clear error, never a truncation
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        mc.admin.command({"getRoutingTable": ns})
    assert e.value.code == 10334
    chunks, batches = full_table(mc, ns)
    assert len(chunks) == NCHUNKS and batches >= 2
    owner = {}  # chunk index (k // WIDTH, MinKey chunk = 0) -> shard
    for ch in chunks:
        lo = ch["min"]["k"]
        owner[0 if isinstance(lo, MinKey) else lo // WIDTH] = ch["shard"]
    assert len(owner) == NCHUNKS

    # the proxy has cached nothing: its first request loads the table (by cursor)
    before = meta_metrics(meta)
    px = cl.proxy_client(0)
    rnd = random.Random(26)
    keys = sorted(set(rnd.randrange(0, NCHUNKS * WIDTH) for _ in range(300)))
    px.big.r.insert_many([{"_id": k, "k": k} for k in keys], ordered=False)
    after = meta_metrics(meta)
    full_chunks = 'stripedb_metadata_routing_chunks_sent_total{kind="full"}'
    assert after[full_chunks] - before[full_chunks] == NCHUNKS

    # every document is on the shard metadata says owns its chunk, and only there
    on = {sid: {d["k"] for d in cl.shard_client(sid).big.r.find({}, {"k": 1})}
          for sid in cl.shard_ids}
    for k in keys:
        want = owner[k // WIDTH]
        assert k in on[want], f"k={k} not on its owner {want}"
        for sid in cl.shard_ids:
            if sid != want:
                assert k not in on[sid], f"k={k} also on {sid}"
    # and targeted reads through the proxy find each of them
    for k in keys[:50]:
        assert px.big.r.find_one({"k": k})["_id"] == k

    # move one chunk holding no documents (routing only, no data to copy)
    used = {k // WIDTH for k in keys}
    idx = next(i for i in range(NCHUNKS // 2, NCHUNKS) if i not in used)
    cid = next(ch["id"] for ch in chunks if ch["min"].get("k") == idx * WIDTH)
    src = owner[idx]
    dst = next(s for s in cl.shard_ids if s != src)
    before = meta_metrics(meta)
    mv = mc.admin.command({"setChunkShard": cid, "shard": dst})
    wait_until(lambda: cl.metric(0, "stripedb_proxy_routing_version") >= mv["routingVersion"],
               30, what="the proxy to apply the move")
    after = meta_metrics(meta)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # what the move cost the proxy: one diff holding the moved chunk, no full reload
    assert d['stripedb_metadata_routing_chunks_sent_total{kind="diff"}'] == 1
    assert d['stripedb_metadata_routing_replies_total{kind="full"}'] == 0
    assert 0 < d['stripedb_metadata_routing_reply_bytes_total{kind="diff"}'] < 10_000
    # a document in the moved chunk now lands on the new owner
    k = idx * WIDTH + 3
    px.big.r.insert_one({"_id": k, "k": k})
    assert cl.shard_client(dst).big.r.find_one({"k": k}) is not None
    assert cl.shard_client(src).big.r.find_one({"k": k}) is None
    assert px.big.r.find_one({"k": k})["_id"] == k

    # a change to a collection the proxy does not cache costs it no routing read: the
    # long poll names the collection, and the proxy only moves its version
    cl.shard_collection("big.other", {"k": 1}, split_points=[{"k": 5}])
    other = mc.admin.command({"getRoutingTable": "big.other"})["chunks"][0]
    before = meta_metrics(meta)
    mv = mc.admin.command({"setChunkShard": other["id"],
                           "shard": next(s for s in cl.shard_ids if s != other["shard"])})
    wait_until(lambda: cl.metric(0, "stripedb_proxy_routing_version") >= mv["routingVersion"],
               30, what="the proxy to see the version")
    after = meta_metrics(meta)
    for kind in ("full", "diff"):
        key = f'stripedb_metadata_routing_replies_total{{kind="{kind}"}}'
        assert after[key] - before[key] == 0, key
    mc.close()


def test_chunk_limit_is_an_option_with_a_clear_error(start_role, tmp_path):
    """shardCollection above --max-chunks-per-command is refused by the leader (BadValue,
    naming the option); at the limit it is accepted."""
    meta = Cluster(start_role, tmp_path, 1, election_ms=300,
                   extra=["--max-chunks-per-command=1000"])
    meta.write({"addShard": "a", "uri": "mongodb://127.0.0.1:1/"})
    meta.write({"createDatabase": "d"})
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        meta.write({"shardCollection": "d.h", "key": {"k": "hashed"}, "numChunks": 1001})
    assert e.value.code == 2
    assert "--max-chunks-per-command=1000" in str(e.value)
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        meta.write({"shardCollection": "d.r", "key": {"k": 1},
                    "splitPoints": [{"k": i} for i in range(1000)]})
    assert e.value.code == 2
    assert meta.write({"shardCollection": "d.h", "key": {"k": "hashed"},
                       "numChunks": 1000})["chunks"] == 1000
    assert meta.write({"shardCollection": "d.r", "key": {"k": 1},
                       "splitPoints": [{"k": i} for i in range(999)]})["chunks"] == 1000


def test_bad_routing_and_chunk_arguments_are_refused(start_role, tmp_path):
    """Found by the fresh-user review of issue #26: getRoutingTable read a non-string
    namespace as "all" and a non-integral sinceVersion as a full load, shardCollection made
    2 chunks of numChunks "10", NaN, 2.5 or 0: each is now a clear error, nothing applied."""
    meta = Cluster(start_role, tmp_path, 1, election_ms=300)
    meta.write({"addShard": "a", "uri": "mongodb://127.0.0.1:1/"})
    meta.write({"createDatabase": "d"})
    meta.write({"shardCollection": "d.ok", "key": {"k": "hashed"}, "numChunks": 4})
    for bad in (5, "", None, True):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            meta.leader().cmd("getRoutingTable", bad)
        assert "namespace" in str(e.value), bad
    for since in ("5", None, True, {}, float("nan"), 1e300, 5.7):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            meta.leader().cmd("getRoutingTable", "d.ok", sinceVersion=since)
        assert "sinceVersion" in str(e.value), since
    assert len(meta.leader().cmd("getRoutingTable", "d.ok", sinceVersion=0)["chunks"]) == 4
    for n in ("10", float("nan"), float("inf"), 2.5, 0, -5):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            meta.write({"shardCollection": f"d.bad{abs(hash(str(n))) % 1000}",
                        "key": {"k": "hashed"}, "numChunks": n})
        assert "numChunks" in str(e.value), n
    # nothing of the refused commands was applied: d.ok's 4 chunks are all there is
    chunks = meta.leader().cmd("getRoutingTable", "all")["chunks"]
    assert len(chunks) == 4 and {ch["ns"] for ch in chunks} == {"d.ok"}
