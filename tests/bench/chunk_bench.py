#!/usr/bin/python3
"""Cost of a query against the chunk count (issue #17): the same data (--docs documents) in
collections sharded on `k` in 2, 16, 64, 256 and 1,024 ranged chunks over 2 and 4 embedded
shards, through one proxy. Queries:
  scatter find  find({g: G}).limit(50)           (a non-key filter: every shard)
  count         count_documents({g: G})
  aggregate     [{$match: {g: G}}, {$group: {_id: "$h", n: {$sum: 1}}}]
  update_many   update_many({k: {$in: [a, b]}}, {$inc: {v: 1}})   (2 keys)
in two modes:
  shard         the filtering metadata installed on each shard as the coordinator does
                (stripedbSetFiltering): one request per shard with $stripedbShardVersion.
                Measured INTERLEAVED: every collection is loaded first, then each rep runs
                the query once on the baseline collection (the smallest chunk count) and
                once on the N-chunk one, in alternating order, so the noise of a shared
                machine hits both sides alike. Reported per query: the median time of each
                side and the median of the per-rep ratios N-chunks / baseline.
  per-chunk     shards without filtering metadata: one request per chunk, ownership
                filter on the proxy (the behaviour before issue #17; --legacy-reps runs,
                skipped above --max-legacy-chunks, it is slow; --legacy-reps 0: skipped).

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/chunk_bench.py \
        [--docs 20000] [--reps 15] [--chunks 2,16,64,256,1024] [--shards 2,4] \
        [--legacy-reps 3]

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
from proxy_helpers import ProxyCluster, install_filtering  # noqa: E402


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


def timed(fn, reps):
    """Median of reps runs of fn (ms), after one warm-up run; None when reps is 0."""
    if reps <= 0:
        return None
    fn()  # warm (routing cache, connections)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def interleaved(base_fn, fn, reps):
    """base_fn and fn run alternately (base first on even reps, second on odd ones) after
    one warm-up each. Returns (median ms of base_fn, median ms of fn, median of the per-rep
    ratios fn / base_fn)."""
    base_fn()
    fn()
    tb, tn, ratios = [], [], []
    for r in range(reps):
        pair = [(base_fn, tb), (fn, tn)]
        if r % 2:
            pair.reverse()
        for f, acc in pair:
            t0 = time.perf_counter()
            f()
            acc.append((time.perf_counter() - t0) * 1000)
        ratios.append(tn[-1] / tb[-1])
    return statistics.median(tb), statistics.median(tn), statistics.median(ratios)


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


NAMES = ["scatter find", "count", "aggregate", "update_many"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--legacy-reps", type=int, default=3)
    ap.add_argument("--chunks", default="2,16,64,256,1024")
    ap.add_argument("--shards", default="2,4")
    ap.add_argument("--max-legacy-chunks", type=int, default=256)
    a = ap.parse_args()
    chunk_counts = sorted({int(x) for x in a.chunks.split(",")})
    base = chunk_counts[0]
    rows = []  # (nshards, nchunks, {query: (base ms, N ms, ratio, per-chunk ms or None)})
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
                legacy = {}
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
                    if nch <= a.max_legacy_chunks:
                        for name, fn in workloads(p0.db, ns_coll, a.docs).items():
                            legacy[(nch, name)] = timed(fn, a.legacy_reps)
                    install_filtering(cl, ns, key)
                p1 = cl.proxy_client(1, socketTimeoutMS=600000)
                wb = workloads(p1.db, f"c{base}", a.docs)
                for nch in chunk_counts:
                    res = {}
                    wn = workloads(p1.db, f"c{nch}", a.docs)
                    for name in NAMES:
                        tb, tn, ratio = interleaved(wb[name], wn[name], a.reps)
                        res[name] = (tb, tn, ratio, legacy.get((nch, name)))
                    rows.append((nshards, nch, res))
                    print(nshards, nch, {n: tuple(round(x, 2) if x is not None else None
                                                  for x in v) for n, v in res.items()},
                          flush=True)
            finally:
                cl.close()
                st.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"Shard mode, interleaved with the {base}-chunk collection, {a.reps} reps: median ms "
          f"{base} chunks / N chunks, median ratio N/{base}; per-chunk mode median ms")
    print()
    print("| shards | chunks | " + " | ".join(f"{n}: ms {base} / N (ratio); per-chunk"
                                           for n in NAMES) + " |")
    print("|---:|---:|" + "---:|" * len(NAMES))
    for nshards, nch, res in rows:
        cells = []
        for n in NAMES:
            tb, tn, ratio, lg = res[n]
            lgs = f"{lg:.1f}" if lg is not None else "-"
            cells.append(f"{tb:.2f} / {tn:.2f} (**{ratio:.2f}x**); {lgs}")
        print(f"| {nshards} | {nch} | " + " | ".join(cells) + " |")
    print()
    for nshards in sorted({r[0] for r in rows}):
        mine = {nch: res for s, nch, res in rows if s == nshards}
        hi = max(mine)
        ratios = ", ".join(f"{n} {mine[hi][n][2]:.2f}x" for n in NAMES)
        print(f"{nshards} shards, shard mode, {hi} vs {base} chunks (median of interleaved "
              f"ratios): {ratios}")


if __name__ == "__main__":
    main()
