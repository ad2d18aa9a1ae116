#!/usr/bin/python3
"""Change streams vs the proxy's other requests (issue #20): point finds through one proxy
over 2 embedded shards, first with no change stream open, then with --streams idle change
streams open through the same proxy, each client thread looping getMore (pymongo's
try_next, maxAwaitTimeMS --await-ms). Same run, same cluster, same client code. Prints
p50/p99/max of --finds sequential point finds for both phases, and the durations of the
streams' empty getMores (the await a MongoDB client relies on: about --await-ms, not
earlier and not much later). The streams run in a child process (their client threads would
share the finds' interpreter lock). The finds with streams open stop after --budget-s (a starved
proxy answers few); n says how many were done.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/cs_starvation_bench.py \
        [--streams 300] [--finds 1000] [--await-ms 1000] [--budget-s 120]

Every server runs on a free loopback port in a temporary directory and is stopped at the end.
"""
import argparse
import json
import os
import shutil
import subprocess
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


def streams_child(uri, n, await_ms):
    """The streams' process: n threads, each with a change stream looping try_next, until
    a line on stdin; prints "opened <errors>" once all are open, then a JSON line with the
    empty getMores' durations (ms) and the errors."""
    sc = pymongo.MongoClient(uri, directConnection=True, maxPoolSize=n + 16,
                             socketTimeoutMS=120000)
    stop = threading.Event()
    empties, errors = [], []
    lock = threading.Lock()
    opened = threading.Semaphore(0)

    def streamer():
        try:
            cs = sc.bench.c.watch(max_await_time_ms=await_ms)
        except Exception as e:  # noqa: BLE001 - reported
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

    ts = [threading.Thread(target=streamer, daemon=True) for _ in range(n)]
    for t in ts:
        t.start()
    for _ in ts:
        opened.acquire()
    print(f"opened {len(errors)}", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in ts:
        t.join(timeout=await_ms / 1000 * 3 + 30)
    print(json.dumps({"empties": empties, "errors": errors}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--finds", type=int, default=1000)
    ap.add_argument("--await-ms", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=120,
                    help="time bound of the finds with streams open (a starved proxy)")
    ap.add_argument("--streams-at", help=argparse.SUPPRESS)  # the streams' child process
    a = ap.parse_args()
    if a.streams_at:
        streams_child(a.streams_at, a.streams, a.await_ms)
        return
    tmp = tempfile.mkdtemp(prefix="cs-bench-")
    st = Starter(tmp)
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

        # the streams run in a child process: their 300 client threads would otherwise
        # share this process' interpreter lock with the finds and slow them client-side
        t0 = time.monotonic()
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--streams-at", uri,
                                  "--streams", str(a.streams), "--await-ms", str(a.await_ms)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline().split()
        print(f"{a.streams} change streams opened in {time.monotonic() - t0:.1f} s "
              f"({line[1] if len(line) > 1 else '?'} errors)", flush=True)
        time.sleep(3)  # every stream is in its getMore loop
        loaded = finds(coll, a.finds, a.docs, a.budget_s)
        report(f"finds, {a.streams} idle change streams", loaded)
        out, _ = child.communicate("stop\n", timeout=a.await_ms / 1000 * 3 + 60)
        res = json.loads(out.strip().splitlines()[-1])
        empties, errors = res["empties"], res["errors"]
        if empties:
            report(f"empty getMores (await {a.await_ms} ms)", empties)
            print(f"{'':40s} min {min(empties):8.2f} ms", flush=True)
        if errors:
            print(f"stream errors: {len(errors)}, first: {errors[0]}", flush=True)
        print(f"p99 with/without streams: {pct(loaded, 99) / pct(base, 99):.2f}x, "
              f"p50 {pct(loaded, 50) / pct(base, 50):.2f}x", flush=True)
        fc.close()
    finally:
        st.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
