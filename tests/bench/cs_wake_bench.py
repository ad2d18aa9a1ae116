#!/usr/bin/python3
"""What a write costs with idle change streams open on OTHER collections (issue #20, the
proxy's parked getMores, src/proxy/cswait.c): one proxy over 2 shards; one client inserts
into `bench.w` (sharded on _id, its inserts alternate between the shards) while one change
stream on `bench.w` measures how late each insert comes out, and --streams change streams
on `bench.idle` (nobody writes there) loop getMore in a child process.

Phases, same cluster, same client code:
  1. the writer alone (with the `bench.w` stream), --seconds;
  2. the idle streams opened, no writer, --idle-s: what the idle streams alone cost;
  3. the writer again with the idle streams open, --seconds.
For each: inserts done, inserts per 10 s, insert p50/p99, the proxy's CPU (utime + stime of
its process, /proc) per insert and per second, and the `bench.w` stream's event latency
(event received - insert sent) p50/p99.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/cs_wake_bench.py \
        [--streams 300] [--seconds 10] [--idle-s 5] [--await-ms 1000]

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

from proxy_helpers import ProxyCluster  # noqa: E402
from proxy_bench import Starter  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def pct(lat, q):
    if not lat:
        return float("nan")
    lat = sorted(lat)
    return lat[min(len(lat) - 1, (len(lat) * q) // 100)]


def cpu_s(pid):
    """utime + stime of process pid, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK


def streams_child(uri, n, await_ms, coll):
    """n threads, each with a change stream on bench.<coll> looping try_next, until a line
    on stdin; prints "opened <errors>" once all are open, then a JSON line with the errors
    and the number of empty getMores."""
    sc = pymongo.MongoClient(uri, directConnection=True, maxPoolSize=n + 16,
                             socketTimeoutMS=120000)
    stop = threading.Event()
    errors, empties = [], [0]
    lock = threading.Lock()
    opened = threading.Semaphore(0)

    def streamer():
        try:
            cs = sc.bench[coll].watch(max_await_time_ms=await_ms)
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(repr(e))
            opened.release()
            return
        opened.release()
        k = 0
        while not stop.is_set():
            try:
                if cs.try_next() is None:
                    k += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
                break
        cs.close()
        with lock:
            empties[0] += k

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
    print(json.dumps({"errors": errors, "empties": empties[0]}), flush=True)


class Watcher:
    """The stream on bench.w: arrival time (monotonic) of each inserted _id."""

    def __init__(self, client):
        self.cs = client.bench.w.watch(max_await_time_ms=1000)
        self.seen = {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            ev = self.cs.try_next()
            if ev is not None and ev["operationType"] == "insert":
                self.seen[ev["documentKey"]["_id"]] = time.monotonic()

    def close(self):
        self.stop.set()
        self.t.join(timeout=10)
        self.cs.close()


def others(pids, c0, took):
    """CPU of the other processes since c0 (cpu_s of each), % of a core."""
    return "  ".join(f"{k} {(cpu_s(v) - c0[k]) / took * 100:.1f}%" for k, v in pids.items())


def write_phase(name, coll, watcher, pid, seconds, first_id, pids):
    sent, lat = {}, []
    oc0 = {k: cpu_s(v) for k, v in pids.items()}
    c0, t0 = cpu_s(pid), time.monotonic()
    i = first_id
    while time.monotonic() < t0 + seconds:
        # alternate between the shards (split at 0)
        _id = i if i % 2 == 0 else -i
        s = time.monotonic()
        coll.insert_one({"_id": _id, "pad": "x" * 100})
        lat.append((time.monotonic() - s) * 1000)
        sent[_id] = s
        i += 1
    took = time.monotonic() - t0
    cpu = cpu_s(pid) - c0
    other = others(pids, oc0, took)
    end = time.monotonic() + 15
    while time.monotonic() < end and not all(k in watcher.seen for k in sent):
        time.sleep(0.05)
    ev = [(watcher.seen[k] - s) * 1000 for k, s in sent.items() if k in watcher.seen]
    n = len(sent)
    print(f"{name:34s} inserts {n:6d} ({n * 10 / took:7.0f} / 10 s)  insert p50 "
          f"{pct(lat, 50):6.2f} p99 {pct(lat, 99):7.2f} ms  proxy CPU {cpu * 1000 / n:6.2f} ms"
          f"/insert, {cpu / took * 100:5.1f}% of a core  event latency p50 {pct(ev, 50):7.1f}"
          f" p99 {pct(ev, 99):7.1f} ms  (events {len(ev)}/{n})", flush=True)
    print(f"{'':34s} CPU of the others: {other}", flush=True)
    return i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--idle-s", type=float, default=5)
    ap.add_argument("--await-ms", type=int, default=1000)
    ap.add_argument("--streams-at", help=argparse.SUPPRESS)  # the streams' child process
    a = ap.parse_args()
    if a.streams_at:
        streams_child(a.streams_at, a.streams, a.await_ms, "idle")
        return
    tmp = tempfile.mkdtemp(prefix="cs-wake-bench-")
    st = Starter(tmp)
    try:
        from pathlib import Path
        cl = ProxyCluster(st, Path(tmp), shards=2, proxies=1)
        cl.shard_collection("bench.w", {"_id": 1}, split_points=[{"_id": 0}])
        pid = cl.proxy_procs[0].p.pid
        pids = {sid: proc.p.pid for sid, proc in cl.shard_procs.items()}
        uri = f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/"
        fc = pymongo.MongoClient(uri, directConnection=True, maxPoolSize=4)
        fc.bench.idle.insert_one({"_id": "here"})
        fc.bench.w.insert_one({"_id": "warm"})
        watcher = Watcher(fc)
        time.sleep(1)
        nxt = write_phase("writer, no idle stream", fc.bench.w, watcher, pid, a.seconds, 1,
                          pids)

        t0 = time.monotonic()
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--streams-at", uri,
                                  "--streams", str(a.streams), "--await-ms", str(a.await_ms)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline().split()
        print(f"{a.streams} idle change streams on bench.idle opened in "
              f"{time.monotonic() - t0:.1f} s ({line[1] if len(line) > 1 else '?'} errors)",
              flush=True)
        time.sleep(3)  # every stream is in its getMore loop
        pids["streams' client"] = child.pid
        oc0 = {k: cpu_s(v) for k, v in pids.items()}
        c0, t1 = cpu_s(pid), time.monotonic()
        time.sleep(a.idle_s)
        took = time.monotonic() - t1
        idle_cpu = (cpu_s(pid) - c0) / took
        print(f"{'idle streams, no writer':34s} proxy CPU {idle_cpu * 100:5.1f}% of a core;"
              f" the others: {others(pids, oc0, took)}", flush=True)
        write_phase(f"writer, {a.streams} idle streams", fc.bench.w, watcher, pid, a.seconds,
                    nxt, pids)
        out, _ = child.communicate("stop\n", timeout=a.await_ms / 1000 * 3 + 60)
        res = json.loads(out.strip().splitlines()[-1])
        print(f"idle streams: {res['empties']} empty getMores, {len(res['errors'])} errors"
              + (f", first: {res['errors'][0]}" if res["errors"] else ""), flush=True)
        watcher.close()
        fc.close()
    finally:
        st.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
