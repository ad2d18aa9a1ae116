#!/usr/bin/python3
"""Proxy overhead benchmark (issue #6): point reads, point writes and scatter queries through
a proxy over 3 embedded shards vs directly against one embedded shard, same run, same client
code (pymongo, N threads), same data. Prints throughput and p50/p99 latency per workload and
the proxy/direct ratios.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/proxy_bench.py \
        [--seconds 5] [--threads 8] [--docs 20000]

Every server runs on a free loopback port in a temporary directory and is stopped at the end;
each workload is bounded by --seconds and stops by itself.
"""
import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import pymongo  # noqa: E402

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
        p.wait_healthy()
        return p

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


def run(name, coll, op, seconds, threads):
    lat = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(seed):
        rng = random.Random(seed)
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter_ns()
            op(coll, rng)
            mine.append(time.perf_counter_ns() - t0)
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.monotonic() - t0
    lat.sort()
    n = len(lat)
    return {"name": name, "ops": n / el, "p50": lat[n // 2] / 1e6,
            "p99": lat[min(n - 1, (n * 99) // 100)] / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--docs", type=int, default=20000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="proxy-bench-")
    st = Starter(tmp)
    try:
        from pathlib import Path
        cl = ProxyCluster(st, Path(tmp), shards=3, proxies=1)
        n = a.docs
        cl.shard_collection("bench.c", {"k": 1},
                            split_points=[{"k": n // 3}, {"k": 2 * n // 3}])
        solo_port = conftest.free_port()
        os.mkdir(os.path.join(tmp, "solo"))
        st(["--role=shard", f"--listen=127.0.0.1:{solo_port}",
            f"--data-dir={os.path.join(tmp, 'solo')}"])
        targets = {
            "proxy": pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/",
                                         directConnection=True, maxPoolSize=64),
            "direct": pymongo.MongoClient(f"mongodb://127.0.0.1:{solo_port}/",
                                          directConnection=True, maxPoolSize=64),
        }
        docs = [{"_id": i, "k": i, "g": i % 100, "pad": "x" * 100} for i in range(n)]
        for c in targets.values():
            for i in range(0, n, 1000):
                c.bench.c.insert_many(docs[i:i + 1000])
            c.bench.c.create_index("g")
            c.bench.c.create_index("k")
        counter = [n]
        cl_lock = threading.Lock()

        def point_read(c, rng):
            k = rng.randrange(n)
            assert c.find_one({"k": k})["_id"] == k

        def point_write(c, rng):
            with cl_lock:
                counter[0] += 1
                i = counter[0]
            c.insert_one({"_id": i, "k": rng.randrange(n), "g": -1})

        def scatter(c, rng):
            g = rng.randrange(100)
            assert len(list(c.find({"g": g}).sort("k", 1).limit(20))) == 20

        results = []
        for wname, op in (("point read", point_read), ("point write", point_write),
                          ("scatter (g=?, sort k, limit 20)", scatter)):
            for tname, client in targets.items():
                r = run(f"{wname} / {tname}", client.bench.c, op, a.seconds, a.threads)
                results.append(r)
                print(f"{r['name']:45s} {r['ops']:9.0f} ops/s  p50 {r['p50']:7.3f} ms  "
                      f"p99 {r['p99']:7.3f} ms", flush=True)
        print()
        for i in range(0, len(results), 2):
            p, d = results[i], results[i + 1]
            print(f"{p['name'].split(' / ')[0]:35s} proxy/direct throughput "
                  f"{p['ops'] / d['ops']:.2f}x, p50 latency {p['p50'] / d['p50']:.2f}x")
        for c in targets.values():
            c.close()
    finally:
        st.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
