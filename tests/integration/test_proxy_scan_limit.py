"""Short sorted range scans through the proxy (issue #19, YCSB E on a sharded collection):
find({_id: {$gte: K}}).sort({_id: 1}).limit(L) as mongos runs it. The proxy targets the
shards whose chunks can hold matching documents, sends each of them the limit (limit +
skip) when the shard filters its own orphans (filtering metadata: one request per shard),
so a shard closes its cursor itself once it has returned that many documents and the proxy
has no shard cursor to kill; it merges the sorted streams and applies skip and limit.
Per-chunk requests (a shard without filtering metadata) go without a limit: the shard
would count its orphans, which the proxy drops, against it."""
import pytest
from bson import MaxKey, MinKey

from conftest import wait_until
from proxy_helpers import ProxyCluster, shard_cmd_count
from proxy_helpers import install_filtering

N = 300  # documents _id 0..299
SPLITS = [60, 120, 180, 240]  # 5 chunks over 3 shards: one shard holds two of them
KS = [-5, 0, 1, 59, 60, 61, 119, 120, 179, 200, 239, 240, 241, 290, 299, 300, 400]
LIMITS = [1, 2, 7, 59, 60, 61, 100]


def make_coll(cl, filtering):
    ns = "db.c"
    cl.shard_collection(ns, {"_id": 1}, split_points=[{"_id": s} for s in SPLITS])
    chunks = install_filtering(cl, ns, {"_id": 1}) if filtering else cl.routing(ns)["chunks"]
    assert len(chunks) == len(SPLITS) + 1
    coll = cl.proxy_client(0).db.c
    coll.insert_many([{"_id": i, "pad": "x" * 200} for i in range(N)])
    return coll, chunks


def owners_from(chunks, k, ascending=True):
    """The shards whose chunks can hold an _id >= k (ascending) or <= k (descending)."""
    out = set()
    for ch in chunks:
        lo, hi = ch["min"]["_id"], ch["max"]["_id"]
        if ascending and (isinstance(hi, MaxKey) or hi > k):
            out.add(ch["shard"])
        if not ascending and (isinstance(lo, MinKey) or lo <= k):
            out.add(ch["shard"])
    return out


def counts(cl, cmd):
    return {s: shard_cmd_count(cl, s, cmd) for s in cl.shard_ids}


def delta(after, before):
    return {s: after[s] - before[s] for s in after}


@pytest.fixture
def cl3(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    yield cl
    cl.close()


def test_short_scans_send_the_limit_and_leave_no_shard_cursor(cl3):
    """Every K (chunk bounds and either side of them, below and above all documents) and
    limit, ascending ($gte, sort 1) and descending ($lte, sort -1): the merged result is
    exactly the L documents from K on in order; only the shards whose chunks can hold
    matching documents get a find; and with the limit pushed down no shard cursor is left
    open, so no killCursors reaches a shard (main: one per targeted shard and scan)."""
    cl = cl3
    coll, chunks = make_coll(cl, filtering=True)
    kills = counts(cl, "killCursors")
    for k in KS:
        for lim in LIMITS:
            finds = counts(cl, "find")
            got = [d["_id"] for d in coll.find({"_id": {"$gte": k}}).sort("_id", 1).limit(lim)]
            assert got == list(range(max(k, 0), N))[:lim], (k, lim)
            hit = {s for s, n in delta(counts(cl, "find"), finds).items() if n}
            assert hit == owners_from(chunks, k, True), (k, lim, hit)
            finds = counts(cl, "find")
            got = [d["_id"] for d in coll.find({"_id": {"$lte": k}}).sort("_id", -1).limit(lim)]
            assert got == list(range(min(k, N - 1), -1, -1))[:lim], (k, lim)
            hit = {s for s, n in delta(counts(cl, "find"), finds).items() if n}
            assert hit == owners_from(chunks, k, False), (k, lim, hit)
    assert delta(counts(cl, "killCursors"), kills) == {s: 0 for s in cl.shard_ids}


def test_limit_with_skip_batch_size_and_get_more(cl3):
    """limit + skip pushed down, a client batchSize below the limit (getMores through the
    proxy, the shards' cursors continued), no limit at all: every document once, in
    order; closing the client's cursor early kills the shard cursors still open."""
    cl = cl3
    coll, chunks = make_coll(cl, filtering=True)
    for k in (0, 55, 118, 235):
        for skip, lim, batch in ((0, 100, 7), (10, 50, 0), (59, 61, 13), (3, 150, 0),
                                 (0, 0, 11), (200, 20, 5)):
            want = list(range(k, N))[skip:][:lim] if lim else list(range(k, N))[skip:]
            cur = coll.find({"_id": {"$gte": k}}).sort("_id", 1).skip(skip).limit(lim)
            if batch:
                cur = cur.batch_size(batch)
            assert [d["_id"] for d in cur] == want, (k, skip, lim, batch)
            want = list(range(N - 1 - k, -1, -1))[skip:]
            want = want[:lim] if lim else want
            cur = coll.find({"_id": {"$lte": N - 1 - k}}).sort("_id", -1).skip(skip).limit(lim)
            if batch:
                cur = cur.batch_size(batch)
            assert [d["_id"] for d in cur] == want, (k, skip, lim, batch)
    # an aggregate's pushed-down $sort/$skip/$limit goes the same way (limit + skip)
    for k, skip, lim in ((0, 0, 5), (55, 3, 61), (118, 10, 100), (235, 0, 100)):
        pipe = [{"$match": {"_id": {"$gte": k}}}, {"$sort": {"_id": 1}}]
        pipe += [{"$skip": skip}] if skip else []
        pipe += [{"$limit": lim}, {"$project": {"pad": 0}}]
        got = [d["_id"] for d in coll.aggregate(pipe, batchSize=7)]
        assert got == list(range(k, N))[skip:][:lim], (k, skip, lim)
    # a cursor given up after its first batch: the shards that still hold an open cursor
    # for it get a killCursors from the proxy
    kills = counts(cl, "killCursors")
    cur = coll.find({"_id": {"$gte": 0}}).sort("_id", 1).limit(250).batch_size(5)
    assert [next(cur)["_id"] for _ in range(5)] == [0, 1, 2, 3, 4]
    cur.close()
    wait_until(lambda: all(delta(counts(cl, "killCursors"), kills).values()), 10,
               what="killCursors on every shard")
    assert delta(counts(cl, "killCursors"), kills) == {s: 1 for s in cl.shard_ids}


@pytest.mark.parametrize("filtering", [True, False])
def test_orphans_do_not_take_the_limit(cl3, filtering):
    """Documents on a shard that does not own them (what a migration leaves behind) ahead
    of that shard's own documents in the scan order: with filtering metadata the shard drops
    them before its limit; without it (per-chunk requests, the proxy's ownership filter)
    the proxy sends no limit, so the shard's own documents behind them still come."""
    cl = cl3
    coll, chunks = make_coll(cl, filtering=filtering)
    owner = {ch["min"]["_id"]: ch["shard"] for ch in chunks if isinstance(ch["min"]["_id"], int)}
    # 30 orphans in chunk [180, 240) (not owned by the shard of [240, max)) on the shard of
    # [240, max), keys 230.01..230.30: ahead of that shard's own 240.. in the scan
    on = owner[240]
    assert owner[180] != on
    cl.shard_client(on).db.c.insert_many(
        [{"_id": 230 + j / 100, "orphan": True} for j in range(1, 31)])
    got = list(coll.find({"_id": {"$gte": 230}}).sort("_id", 1).limit(20))
    assert [d["_id"] for d in got] == list(range(230, 250))
    got = list(coll.find({"_id": {"$gte": 230}}).sort("_id", 1).limit(20).batch_size(3))
    assert [d["_id"] for d in got] == list(range(230, 250))
    got = list(coll.find({"_id": {"$lte": 241}}).sort("_id", -1).skip(1).limit(12))
    assert [d["_id"] for d in got] == list(range(240, 228, -1))
