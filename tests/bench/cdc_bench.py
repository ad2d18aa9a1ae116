#!/usr/bin/python3
"""Benchmark of the CDC pipeline (issue #7): events/s published and consumed per shard for
the embedded and the Kafka backend, and the source shard's write throughput with and
without a publisher attached. Never part of `make check`.

Usage (from the build dir; kafka_mock is built by `make check` or
`make tests/integration/kafka_mock`):
    STRIPEDB_BIN=./stripedb /usr/bin/python3 $SRCDIR/tests/bench/cdc_bench.py \
        [--seconds 10] [--clients 4] [--doc-bytes 200] [--batch 1] [--backends embedded,kafka]

For each backend: a fresh metadata member and embedded shard; phase 1 writes for
--seconds with no coordinator (baseline writes/s) and leaves that backlog in the oplog;
phase 2 starts a coordinator and measures how fast it publishes the backlog (published
events/s: backlog / time from the coordinator's start until the log reached the oplog
head, lease acquisition included); phase 3 writes again for --seconds with the publisher
attached (writes/s with a publisher); finally the whole log is read with
`stripedb ctl cdc read` (the consumer API, raw BSON into a pipe): consumed events/s.
Writes are inserts of --batch documents (insert_one when 1) from --clients pymongo
threads; each insert is one shard transaction (one fsync) with one oplog entry per
document.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import conftest  # noqa: E402
from cdc_helpers import CdcCluster, KafkaMock  # noqa: E402


def write_for(cl, seconds, clients, doc_bytes, base, batch):
    stop = threading.Event()
    counts = [0] * clients

    def writer(i):
        c = cl.shard_client("shard-a")
        coll = c.bench.w
        n = 0
        pad = "x" * doc_bytes
        while not stop.is_set():
            if batch == 1:
                coll.insert_one({"_id": f"{base}-{i}-{n}", "pad": pad})
            else:
                coll.insert_many([{"_id": f"{base}-{i}-{n + k}", "pad": pad}
                                  for k in range(batch)])
            n += batch
        counts[i] = n

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def run_backend(backend, args, tmp):
    procs = []

    def start_role(a, http=True, env=None, wait=True):
        a = list(a) + ["--log-level=warn"]
        port = conftest.free_port()
        a.append(f"--http-listen=127.0.0.1:{port}")
        p = conftest.Proc(a, str(tmp / f"proc{len(procs)}.log"), port, env)
        procs.append(p)
        return p.wait_healthy()

    kafka = None
    try:
        cl = CdcCluster(start_role, tmp, shards=1)
        if backend == "kafka":
            kafka = KafkaMock(1, ["stripedb.cdc.shard-a"])
            cdc = f"kafka:{kafka.bootstrap}"
        else:
            cdc = f"embedded:{tmp}/cdc"
        base = write_for(cl, args.seconds, args.clients, args.doc_bytes, "a", args.batch)
        t0 = time.perf_counter()
        co = cl.start_coordinator(cdc)
        cl.wait_published(co, "shard-a", timeout=600)
        pub_s = time.perf_counter() - t0
        backlog = cl.shard_status(co, "shard-a")["nextOffset"]
        attached = write_for(cl, args.seconds, args.clients, args.doc_bytes, "b", args.batch)
        cl.wait_published(co, "shard-a", timeout=600)
        env = dict(os.environ, STRIPEDB_CDC=cdc)
        # from the oldest event still in the log (the mock broker has its own retention)
        st = json.loads(subprocess.run(
            [conftest.BIN, "ctl", f"--metadata={cl.metadata}", "--json", "cdc", "status"],
            stdout=subprocess.PIPE, env=env, check=True).stdout)["shards"][0]["log"]
        after = [] if st["firstOffset"] == 0 else \
            [f"--after={st['firstTs']['t']}:{st['firstTs']['i']}"]
        t1 = time.perf_counter()
        r = subprocess.run([conftest.BIN, "ctl", f"--metadata={cl.metadata}", "cdc", "read",
                            "shard-a"] + after, stdout=subprocess.PIPE, env=env, check=True)
        read_s = time.perf_counter() - t1
        consumed = r.stdout.count(b"\x11ts\x00")  # one Timestamp ts per entry
        print(f"{backend:9s} writes/s no publisher {base:9.0f} | with publisher {attached:9.0f}"
              f" ({100.0 * (attached - base) / base:+.1f}%) | published a backlog of {backlog} at "
              f"{backlog / pub_s:9.0f}/s | consumed {consumed} at {consumed / read_s:9.0f}/s",
              flush=True)
        cl.close()
    finally:
        for p in procs:
            p.stop()
        if kafka:
            kafka.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--doc-bytes", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1,
                    help="documents per insert (1: insert_one, fsync-bound; 100: CPU-bound)")
    ap.add_argument("--backends", default="embedded,kafka")
    args = ap.parse_args()
    for backend in args.backends.split(","):
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"sdb-cdc-bench-{backend}-"))
        try:
            run_backend(backend, args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
