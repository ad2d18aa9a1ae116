#!/usr/bin/python3
"""A/B of two stripedb builds as one shard direct (or as proxies), side by side in the same run (issue #19).

Starts one shard of each binary on loopback (`--role=shard`), loads both with
`stripedb bench` (50,000 documents of 10 x 100 bytes by default), then alternates timed
runs of the same YCSB workload against each (base first in even rounds, new first in odd
ones), after a 1 s warm-up run each time. Per run it prints ops/s, the shard's CPU per
operation (user + system of the shard process from /proc/PID/stat over the run, divided
by the run's operations) and the bench's latency lines. On a shared machine compare the
ratios of runs next to each other, never absolute figures.

    /usr/bin/python3 tests/bench/shard_ab.py --base /tmp/base/stripedb --new build/stripedb \\
        --workload c --threads 16 --seconds 6 --rounds 4 [--keep]

With --proxies the two builds are proxies instead, both in front of one shard (and one
metadata member) of --new's binary, started as pg_compare.py starts its `proxy` target
(proxy_helpers.ProxyCluster, an unsharded collection on its primary shard); each run then
prints the proxy's CPU per operation and the shard's.

    /usr/bin/python3 tests/bench/shard_ab.py --proxies --base /tmp/base/stripedb \
        --new build/stripedb --client-bin /tmp/glibc/stripedb --workload c --rounds 6

With --proxies --sharded N the proxies are in front of N shards, and ycsb.usertable is
sharded on {_id: 1} in N chunks of equal key ranges, one per shard, with the shards'
filtering metadata installed, as pg_compare.py's 4x2 target (the shard CPU printed is
then the sum over the shards).

The bench client is --client-bin, else --base's binary, for both. Exits 2 with one line on
stderr when a process does not start or a run prints no result.
"""
import pathlib
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="stripedb binary A (also the client)")
    ap.add_argument("--new", required=True, help="stripedb binary B")
    ap.add_argument("--workload", default="c", help="stripedb bench workload (default c)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--records", type=int, default=50000)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (the shards' data and logs, ~1 GB each)")
    ap.add_argument("--proxies", action="store_true",
                    help="compare the builds as proxies in front of one shard of --new")
    ap.add_argument("--sharded", type=int, default=0, metavar="N",
                    help="with --proxies: N shards, ycsb.usertable sharded on _id")
    ap.add_argument("--client-bin", help="the `stripedb bench` client (default: --base)")
    args = ap.parse_args()
    client = args.client_bin or args.base

    tmp = tempfile.mkdtemp(prefix="shard-ab-")
    shards = {}  # name -> (port, Popen or None, pid)
    stack = None
    try:
        if args.proxies:
            here = pathlib.Path(__file__).resolve().parent
            sys.path.insert(0, str(here.parent / "integration"))
            sys.path.insert(0, str(here))
            import conftest
            from pg_compare import Stack
            from proxy_helpers import ProxyCluster, install_filtering
            conftest.BIN = args.new
            stack = Stack(pathlib.Path(tmp))
            nsh = max(args.sharded, 1)
            cl = ProxyCluster(stack, pathlib.Path(tmp), shards=nsh, proxies=1)
            if args.sharded:
                n = args.records
                cl.shard_collection("ycsb.usertable", {"_id": 1},
                                    split_points=[{"_id": f"user{n * i // nsh:012d}"}
                                                  for i in range(1, nsh)])
                install_filtering(cl, "ycsb.usertable", {"_id": 1})
            conftest.BIN = args.base
            cl.add_proxy()
            shard_pids = [cl.shard_procs[s].p.pid for s in cl.shard_ids]
            shards["new"] = (cl.proxy_ports[0], None, cl.proxy_procs[0].p.pid)
            shards["base"] = (cl.proxy_ports[1], None, cl.proxy_procs[1].p.pid)
        for name, binary in (() if args.proxies else (("base", args.base), ("new", args.new))):
            port = free_port()
            d = os.path.join(tmp, name)
            os.mkdir(d)
            p = subprocess.Popen([binary, "--role=shard", f"--listen=127.0.0.1:{port}",
                                  f"--data-dir={d}"], stdout=open(d + ".log", "w"),
                                 stderr=subprocess.STDOUT)
            shards[name] = (port, p, p.pid)
        for name, (port, p, _) in (() if args.proxies else shards.items()):
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if p.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"shard_ab: the {name} shard did not start (log {tmp}/{name}.log)")
                    time.sleep(0.05)

        def bench(port, threads, seconds, load=False):
            uri = (f"mongodb://127.0.0.1:{port}/" if args.proxies
                   else f"mongodb://127.0.0.1:{port}/?directConnection=true")
            cmd = [client, "bench", "--uri", uri,
                   "--workload", args.workload, "--threads", str(threads),
                   "--records", str(args.records), "--seconds", str(seconds),
                   "--distribution", "uniform", "--quiet", "--no-check"]
            if not load:
                cmd.append("--no-load")
            return subprocess.run(cmd, capture_output=True, text=True).stdout

        for port, _, _ in (list(shards.values())[:1] if args.proxies else shards.values()):
            bench(port, 16, 1, load=True)  # proxies: one load, both read the same shard
        tick = os.sysconf("SC_CLK_TCK")
        for r in range(args.rounds):
            for name in (("base", "new") if r % 2 == 0 else ("new", "base")):
                port, p, pid = shards[name]
                bench(port, args.threads, 1)
                c0 = cpu_ticks(pid)
                s0 = sum(map(cpu_ticks, shard_pids)) if args.proxies else 0
                out = bench(port, args.threads, args.seconds)
                c1 = cpu_ticks(pid)
                s1 = sum(map(cpu_ticks, shard_pids)) if args.proxies else 0
                m = re.search(r"phase run\s+[\d.]+ s\s+(\d+) ops\s+(\d+) ops/s", out)
                if not m or int(m.group(1)) == 0:
                    print(f"shard_ab: no result from the {name} run:\n{out}", file=sys.stderr)
                    sys.exit(2)
                ops = int(m.group(1))
                lat = " / ".join(" ".join(l.split()) for l in out.splitlines() if " p50 " in l)
                what = "proxy" if args.proxies else "shard"
                extra = (f" shard_cpu_us/op={(s1 - s0) / tick * 1e6 / ops:.1f}"
                         if args.proxies else "")
                print(f"round {r} {name}: ops/s={m.group(2)} "
                      f"{what}_cpu_us/op={(c1 - c0) / tick * 1e6 / ops:.1f}{extra} | {lat}",
                      flush=True)
    finally:
        for _, p, _ in shards.values():
            if p is not None:
                p.kill()
                p.wait()
        if stack is not None:
            stack.stop()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
