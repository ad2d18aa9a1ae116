#!/usr/bin/python3
"""Change streams vs the proxy's other requests (issue #20): point finds through one proxy
over 2 embedded shards, first with no change stream open, then with --streams idle change
streams open through the same proxy, each client thread looping getMore (pymongo's
try_next, maxAwaitTimeMS --await-ms). Same run, same cluster, same client code. Prints
p50/p99/max of --finds sequential point finds for both phases, and the durations of the
streams' empty getMores (the await a MongoDB client relies on: about --await-ms, not
earlier and not much later). The finds with streams open stop after --budget-s (a starved
proxy answers few); n says how many were done.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/cs_starvation_bench.py \
        [--streams 300] [--finds 1000] [--await-ms 1000] [--budget-s 120]

Every server runs on a free loopback port in a temporary directory and is stopped at the end.
"""
import argparse
import os
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
from proxy_bench import Starter  # noqa: E402


def pct(lat, q):
    lat = sorted(lat)
    return lat[min(len(lat) - 1, (len(lat) * q) // 100)]


def finds(coll, n, docs, budget_s=None):
    lat = []
    end = time.monotonic() + budget_s if budget_s else None
    for i in range(n):
        if end is not None and time.monotonic() > end:
            break  # starved: report the finds done within the budget
        k = (i * 7919) % docs
        t0 = time.perf_counter()
        assert coll.find_one({"_id": k})["_id"] == k
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


def report(name, lat):
    print(f"{name:40s} n={len(lat):5d}  p50 {pct(lat, 50):8.2f} ms  p99 {pct(lat, 99):8.2f} ms"
          f"  max {max(lat):8.2f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--finds", type=int, default=1000)
    ap.add_argument("--await-ms", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=120,
                    help="time bound of the finds with streams open (a starved proxy)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cs-bench-")
    st = Starter(tmp)
    stop = threading.Event()
    threads = []
    try:
        from pathlib import Path
        cl = ProxyCluster(st, Path(tmp), shards=2, proxies=1)
        cl.shard_collection("bench.c", {"_id": 1}, split_points=[{"_id": a.docs // 2}])
        uri = f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/"
        fc = pymongo.MongoClient(uri, directConnection=True, maxPoolSize=4)
        coll = fc.bench.c
        coll.insert_many([{"_id": i, "pad": "x" * 100} for i in range(a.docs)])
        finds(coll, 50, a.docs)  # warm-up: routing cache, connections
        base = finds(coll, a.finds, a.docs)
        report("finds, no change stream", base)

        sc = pymongo.MongoClient(uri, directConnection=True, maxPoolSize=a.streams + 16,
                                 socketTimeoutMS=120000)
        empties = []
        errors = []
        lock = threading.Lock()
        opened = threading.Semaphore(0)

        def streamer():
            try:
                cs = sc.bench.c.watch(max_await_time_ms=a.await_ms)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                opened.release()
                return
            opened.release()
            mine = []
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    ev = cs.try_next()
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))
                    break
                if ev is None:
                    mine.append((time.perf_counter() - t0) * 1000)
            cs.close()
            with lock:
                empties.extend(mine)

        t0 = time.monotonic()
        for _ in range(a.streams):
            t = threading.Thread(target=streamer, daemon=True)
            t.start()
            threads.append(t)
        for _ in range(a.streams):
            opened.acquire()
        print(f"{a.streams} change streams opened in {time.monotonic() - t0:.1f} s "
              f"({len(errors)} errors)", flush=True)
        time.sleep(3)  # every stream is in its getMore loop
        loaded = finds(coll, a.finds, a.docs, a.budget_s)
        report(f"finds, {a.streams} idle change streams", loaded)
        stop.set()
        for t in threads:
            t.join(timeout=a.await_ms / 1000 * 3 + 30)
        if empties:
            report(f"empty getMores (await {a.await_ms} ms)", empties)
            print(f"{'':40s} min {min(empties):8.2f} ms", flush=True)
        if errors:
            print(f"stream errors: {len(errors)}, first: {errors[0]}", flush=True)
        print(f"p99 with/without streams: {pct(loaded, 99) / pct(base, 99):.2f}x, "
              f"p50 {pct(loaded, 50) / pct(base, 50):.2f}x", flush=True)
        sc.close()
        fc.close()
    finally:
        stop.set()
        st.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
