#!/usr/bin/python3
"""Benchmark of the metadata service: commits/s and p50/p99 commit latency with 3 members
on loopback, and routing reads/s from a follower. Never part of `make check`.

Usage (from the build dir):
    STRIPEDB_BIN=./stripedb /usr/bin/python3 $SRCDIR/tests/bench/metadata_bench.py \
        [--seconds 10] [--clients 8] [--members 3] [--chunks 64]
        [--raft-security plain,hmac,tls,tls+hmac]

Writes are updateMigration commands (one migration per client, so they never conflict),
sent straight to the leader; each is acknowledged after commit on a majority and apply on
the leader. Routing reads are getRoutingTable on one follower (served locally, no
barrier). Clients are Python threads with pymongo: the client side may saturate before
the server does on small machines; raise --clients and compare.
"""
import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import pymongo  # noqa: E402

import conftest  # noqa: E402
from metadata_cluster import Cluster  # noqa: E402


def percentile(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, int(round(p / 100.0 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


KEY = "c3RyaXBlZGItYmVuY2gtY2x1c3Rlci1rZXk"


def mode_args(mode, tmp):
    """--raft-tls settings of a mode: plain (--raft-tls=disabled), hmac (cluster key),
    tls (mutual TLS, no key), tls+hmac. Returns (extra args, client options)."""
    extra, opts = [], {}
    if mode == "plain":
        extra.append("--raft-tls=disabled")
    if "hmac" in mode:
        kf = tmp / "cluster.key"
        kf.write_text(KEY + "\n")
        os.chmod(kf, 0o600)
        extra.append(f"--cluster-key-file={kf}")
        opts = dict(username="__system", password=KEY, authSource="admin",
                    authMechanism="SCRAM-SHA-256")
    if "tls" in mode:
        from test_security_tls import make_pki
        d = tmp / "pki"
        d.mkdir()
        p = make_pki(d)
        extra += [f"--tls-cert={p['cert']}", f"--tls-key={p['key']}", f"--tls-ca={p['ca']}"]
    return extra, opts


def run(args, mode):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sdb-meta-bench-"))
    procs = []

    def start_role(a, http=True, env=None, wait=True):
        port = int([x for x in a if x.startswith("--http-listen=")][0].rsplit(":", 1)[1])
        p = conftest.Proc(a, str(tmp / f"proc{len(procs)}.log"), port, env)
        procs.append(p)
        return p.wait_healthy()

    try:
        extra, copts = mode_args(mode, tmp)
        c = Cluster(start_role, tmp, args.members, extra=["--log-level=warn"] + extra,
                    client_opts=copts)
        c.write("addShard", "shard-a", uri="mongodb://a:1")
        c.write("addShard", "shard-b", uri="mongodb://b:1")
        c.write("createDatabase", "bench")
        c.write("shardCollection", "bench.h", key={"k": "hashed"}, numChunks=args.chunks)
        for i in range(args.clients):
            c.write("registerMigration", f"bench-{i}", ns="bench.h")
            # the transition table is checked at apply (src/raft/migstate.h): writes
            # save progress in one state, with the expectState the leader requires
            c.write("updateMigration", f"bench-{i}", expectState="registered",
                    state="importing")
        leader = c.leader()
        follower = next(m for m in c.members if m is not leader)

        lat, lock, stop = [], threading.Lock(), threading.Event()
        errors = [0]

        def writer(i):
            cl = pymongo.MongoClient(leader.wire, directConnection=True, **copts)
            n = 0
            mine = []
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    cl.admin.command("updateMigration", f"bench-{i}", expectState="importing",
                                     checkpoint={"n": n})
                    mine.append(time.perf_counter() - t0)
                except pymongo.errors.PyMongoError:
                    errors[0] += 1
                n += 1
            with lock:
                lat.extend(mine)
            cl.close()

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.seconds)  # the measurement window, not synchronisation
        stop.set()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        lat.sort()

        reads = [0]
        stop.clear()

        def reader():
            cl = pymongo.MongoClient(follower.wire, directConnection=True, **copts)
            n = 0
            while not stop.is_set():
                cl.admin.command("getRoutingTable", "bench.h")
                n += 1
            with lock:
                reads[0] += n
            cl.close()

        threads = [threading.Thread(target=reader) for _ in range(args.clients)]
        r0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        rwall = time.perf_counter() - r0

        res = dict(mode=mode, commits=len(lat) / wall, p50=percentile(lat, 50) * 1000,
                   p99=percentile(lat, 99) * 1000, max=lat[-1] * 1000, errors=errors[0],
                   reads=reads[0] / rwall)
        print(f"[{mode}] members={args.members} clients={args.clients} seconds={args.seconds}")
        print(f"[{mode}] commits: {len(lat)} in {wall:.1f}s = {res['commits']:.0f} commits/s"
              f" (errors {errors[0]})")
        print(f"[{mode}] commit latency: p50={res['p50']:.2f} ms p99={res['p99']:.2f} ms"
              f" max={res['max']:.2f} ms")
        print(f"[{mode}] routing reads ({args.chunks} chunks, follower): {reads[0]} in"
              f" {rwall:.1f}s = {res['reads']:.0f} reads/s")
        return res
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--raft-security", default="plain",
                    help="comma-separated Raft port modes to run one after the other: "
                         "plain, hmac, tls, tls+hmac (issue #21); ratios are against the "
                         "first")
    args = ap.parse_args()
    results = [run(args, m) for m in args.raft_security.split(",")]
    if len(results) > 1:
        base = results[0]
        print("\n| Raft port | commits/s | ratio | p50 ms | p99 ms | follower reads/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['mode']} | {r['commits']:.0f} | {r['commits'] / base['commits']:.2f} |"
                  f" {r['p50']:.2f} | {r['p99']:.2f} | {r['reads']:.0f} |")


if __name__ == "__main__":
    main()
