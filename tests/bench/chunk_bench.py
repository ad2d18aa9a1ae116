#!/usr/bin/python3
"""Cost of a query against the chunk count (issue #17): the same data (--docs documents) in
collections sharded on `k` in 2, 16, 64, 256 and 1,024 ranged chunks over 2 and 4 embedded
shards, through one proxy. Per collection and mode it times (median of --reps runs, ms):
  scatter find  find({g: G}).limit(50)           (a non-key filter: every shard)
  count         count_documents({g: G})
  aggregate     [{$match: {g: G}}, {$group: {_id: "$h", n: {$sum: 1}}}]
  update_many   update_many({k: {$in: [a, b]}}, {$inc: {v: 1}})   (2 keys)
in two modes:
  per-chunk     shards without filtering metadata: one request per chunk, ownership
                filter on the proxy (the behaviour before issue #17; skipped above
                --max-legacy-chunks, it is slow);
  shard         the filtering metadata installed on each shard as the coordinator does
                (stripedbSetFiltering): one request per shard with $stripedbShardVersion.
Prints a table and, per shard count, the 1,024/2-chunk cost ratio of the shard mode.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/chunk_bench.py \
        [--docs 20000] [--reps 15] [--chunks 2,16,64,256,1024] [--shards 2,4]

Every server runs on a free loopback port in a temporary directory and is stopped at the end.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import conftest  # noqa: E402
from proxy_helpers import ProxyCluster  # noqa: E402


class Starter:
    """start_role() without pytest: starts processes, waits for /healthz, stops them all."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def __call__(self, args, http=True, env=None, wait=True):
        args = list(args)
        port = conftest.free_port()
        args.append(f"--http-listen=127.0.0.1:{port}")
        p = conftest.Proc(args, os.path.join(self.tmp, f"proc{len(self.procs)}.log"), port, env)
        self.procs.append(p)
        if wait:
            p.wait_healthy()
        return p

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


def install_filtering(cl, ns, key):
    """What the coordinator installs (src/coordinator/filtering.h)."""
    chunks = cl.routing(ns)["chunks"]
    cver = max(ch["token"] for ch in chunks)
    for sid in cl.shard_ids:
        mine = [{"id": str(ch["id"]), "min": ch["min"], "max": ch["max"], "token": ch["token"]}
                for ch in chunks if ch["shard"] == sid]
        cl.shard_client(sid).admin.command({"stripedbSetFiltering": ns, "key": key,
                                            "chunks": mine, "collectionVersion": cver})


def timed(fn, reps):
    fn()  # warm (routing cache, connections)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def workloads(db, coll, docs):
    c = db[coll]
    return {
        "scatter find": lambda: len(list(c.find({"g": 7}).limit(50))),
        "count": lambda: c.count_documents({"g": 7}),
        "aggregate": lambda: list(c.aggregate([{"$match": {"g": 7}},
                                               {"$group": {"_id": "$h", "n": {"$sum": 1}}}])),
        "update_many": lambda: c.update_many({"k": {"$in": [docs // 3, 2 * docs // 3]}},
                                             {"$inc": {"v": 1}}),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--legacy-reps", type=int, default=3)
    ap.add_argument("--chunks", default="2,16,64,256,1024")
    ap.add_argument("--shards", default="2,4")
    ap.add_argument("--max-legacy-chunks", type=int, default=256)
    a = ap.parse_args()
    chunk_counts = [int(x) for x in a.chunks.split(",")]
    rows = []
    tmp = tempfile.mkdtemp(prefix="chunk_bench_")
    try:
        for nshards in [int(x) for x in a.shards.split(",")]:
            d = os.path.join(tmp, f"s{nshards}")
            os.mkdir(d)
            st = Starter(d)
            # proxy 0 measures the per-chunk mode (it meets the shards before they have
            # filtering metadata and keeps per-chunk requests for that routing version),
            # proxy 1 the shard mode (it first queries after the install)
            cl = ProxyCluster(st, Path(d), shards=nshards, proxies=2)
            try:
                for nch in chunk_counts:
                    ns_coll = f"c{nch}"
                    ns = f"db.{ns_coll}"
                    key = {"k": 1}
                    step = a.docs / nch
                    cl.shard_collection(ns, key,
                                        split_points=[{"k": int(i * step)} for i in range(1, nch)])
                    p0 = cl.proxy_client(0, socketTimeoutMS=600000)
                    p0.db[ns_coll].insert_many(
                        [{"_id": i, "k": i, "g": i % 97, "h": i % 5, "v": 0}
                         for i in range(a.docs)], ordered=False)
                    for sid in cl.shard_ids:
                        cl.shard_client(sid).db[ns_coll].create_index("g")
                    res = {}
                    if nch <= a.max_legacy_chunks:
                        for name, fn in workloads(p0.db, ns_coll, a.docs).items():
                            res[("per-chunk", name)] = timed(fn, a.legacy_reps)
                    install_filtering(cl, ns, key)
                    p1 = cl.proxy_client(1, socketTimeoutMS=600000)
                    for name, fn in workloads(p1.db, ns_coll, a.docs).items():
                        res[("shard", name)] = timed(fn, a.reps)
                    rows.append((nshards, nch, res))
                    print(nshards, nch, {f"{k[0]}/{k[1]}": round(v, 2) for k, v in res.items()},
                          flush=True)
            finally:
                cl.close()
                st.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    names = ["scatter find", "count", "aggregate", "update_many"]
    print()
    print("| shards | chunks | " + " | ".join(f"{n} shard / per-chunk (ms)" for n in names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for nshards, nch, res in rows:
        cells = []
        for n in names:
            s = res[("shard", n)]
            lg = res.get(("per-chunk", n))
            cells.append(f"{s:.1f} / {lg:.1f}" if lg is not None else f"{s:.1f} / -")
        print(f"| {nshards} | {nch} | " + " | ".join(cells) + " |")
    print()
    for nshards in sorted({r[0] for r in rows}):
        mine = {nch: res for s, nch, res in rows if s == nshards}
        lo, hi = min(mine), max(mine)
        ratios = ", ".join(f"{n} {mine[hi][('shard', n)] / mine[lo][('shard', n)]:.2f}x"
                           for n in names)
        print(f"{nshards} shards, shard mode, {hi} vs {lo} chunks: {ratios}")


if __name__ == "__main__":
    main()
