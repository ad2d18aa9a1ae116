#!/usr/bin/python3
"""Benchmark of shard replica sets (issue #15), in one run:

 1. Failover: a 3-member set on loopback under a client that inserts one document at a
    time (pymongo, replicaSet URI, retryWrites off, heartbeatFrequencyMS as given); the
    primary is SIGKILLed --kills times. Measured per kill: the time from the SIGKILL to
    the first write acknowledged afterwards (necessarily by a new primary: the old one is
    dead), as the client sees it; p50, p99, max. Between kills the killed member is
    restarted and the next kill waits until it is a caught-up secondary again.
 2. YCSB A (50% reads / 50% updates) and C (100% reads), `stripedb bench` with --threads
    client threads (16), the same records and seconds, against, side by side:
      * "3-member": a 3-member set (this build), replicaSet URI;
      * "3-member-before" (--before-bin): a 3-member set of another build, to compare a
        change in the same run;
      * "1-member": a one-member set (this build, no --bootstrap-members);
      * "old-single": the single-process shard of the commit before issue #15 (--base-bin,
        e.g. a build of 30dde90), which committed every write with its own SQLite fsync.
    Prints ops/s, p50 and p99 per target and the ratios to "old-single".
    For each 3-member set, before it stops: the terms in which a member was leader (1: no
    re-election during load and runs), the longest loop-thread stall and entry apply its
    logs show, and write commands per Raft entry (group commit) from its /metrics.

Usage (release builds; see tests/bench/README.md):
    git worktree add /tmp/base 30dde90 && (cd /tmp/base && autoreconf -fi) && \\
        mkdir -p /tmp/base-rel && cd /tmp/base-rel && /tmp/base/configure && make -j2 stripedb
    /usr/bin/python3 tests/bench/replset_bench.py --bin /tmp/build-rel/stripedb \\
        --base-bin /tmp/base-rel/stripedb [--kills 20] [--threads 16] [--records 10000] \\
        [--seconds 20] [--election-ms N] [--rounds 1]
Prints key=value lines and a summary table. Never part of `make check`.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import pymongo  # noqa: E402
from pymongo.errors import PyMongoError  # noqa: E402

from conftest import free_port, wait_until  # noqa: E402

SET = "bench-rs"


class Member:
    def __init__(self, binary, args, log):
        self.binary, self.args, self.log_path = binary, args, log
        self.p = None
        self.start()

    def start(self):
        log = open(self.log_path, "ab")
        self.p = subprocess.Popen([self.binary] + self.args, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"),
                                  start_new_session=True)
        log.close()

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=10)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def hello(port):
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                             serverSelectionTimeoutMS=1000, connectTimeoutMS=500) as c:
        return c.admin.command("hello")


def make_raft_pki(tmp):
    """A CA and one certificate for 127.0.0.1 (openssl CLI): the args that put mutual TLS
    on the Raft port only (--tls-mode stays off: the wire listener is plaintext)."""
    d = tmp / "pki"
    d.mkdir(exist_ok=True)

    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=bench-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "ext.cnf")
    return [f"--tls-cert={d / 'node.pem'}", f"--tls-key={d / 'node.key'}",
            f"--tls-ca={d / 'ca.pem'}", "--raft-tls=enabled"]


def start_set(binary, tmp, n, name, extra=()):
    wires = [free_port() for _ in range(n)]
    rafts = [free_port() for _ in range(n)]
    members = ",".join(f"{i + 1}@127.0.0.1:{rafts[i]}" for i in range(n))
    procs = []
    for i in range(n):
        args = ["--role=shard", f"--replica-set={name}", f"--node-id={i + 1}",
                f"--data-dir={tmp / f'{name}-m{i + 1}'}", f"--listen=127.0.0.1:{wires[i]}",
                f"--raft-listen=127.0.0.1:{rafts[i]}",
                f"--http-listen=127.0.0.1:{free_port()}", *extra]
        if not any(a.startswith("--raft-tls=") for a in extra):
            args.append("--raft-tls=disabled")
        if n > 1:
            args.append(f"--bootstrap-members={members}")
        procs.append(Member(binary, args, tmp / f"{name}-m{i + 1}.log"))

    def listed():
        for p in wires:
            try:
                h = hello(p)
            except PyMongoError:
                continue
            if h.get("isWritablePrimary") and len(h.get("hosts", [])) == n:
                return True
        return False
    wait_until(listed, 60, interval=0.1, what=f"{name} up")
    uri = f"mongodb://{','.join(f'127.0.0.1:{p}' for p in wires)}/?replicaSet={name}"
    return procs, wires, uri


def primary_of(wires):
    for i, p in enumerate(wires):
        try:
            if hello(p).get("isWritablePrimary"):
                return i
        except PyMongoError:
            continue
    return None


def failover(args, tmp):
    extra = [f"--raft-election-timeout-ms={args.election_ms}"] if args.election_ms else []
    procs, wires, uri = start_set(args.bin, tmp, 3, SET, extra)
    client = pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=30000,
                                 connectTimeoutMS=1000, socketTimeoutMS=5000,
                                 heartbeatFrequencyMS=args.heartbeat_ms)
    coll = client.bench.failover
    coll.insert_one({"_id": "warm"})
    seq = [0]
    times, server = [], []
    try:
        for k in range(args.kills):
            p = wait_until(lambda: (primary_of(wires) or 0) + 1, 60, what="a primary") - 1
            # the other two are caught-up secondaries (the restarted one included)
            def caught_up():
                st = [hello(w) for w in wires]
                return all(h.get("secondary") or h.get("isWritablePrimary") for h in st)
            wait_until(caught_up, 60, interval=0.1, what="every member up")
            for _ in range(20):  # the client has a pooled connection to the primary
                seq[0] += 1
                coll.insert_one({"_id": seq[0]})
            t0, w0 = time.monotonic(), time.time()
            procs[p].kill()
            while True:
                seq[0] += 1
                try:
                    coll.insert_one({"_id": seq[0]})
                    break
                except PyMongoError:
                    continue
            dt = time.monotonic() - t0
            times.append(dt)
            # server side: when the new primary's own-term barrier applied ("raft: leader
            # ready" in its log, wall clock); the rest is the client finding it
            ready = leader_ready_after(procs, p, w0)
            if ready is not None:
                server.append(ready)
            print(f"failover_kill_{k + 1}_s={dt:.3f} leader_ready_s="
                  f"{'%.3f' % ready if ready is not None else '?'}", flush=True)
            procs[p].start()
    finally:
        client.close()
        for m in procs:
            m.stop()
    times.sort()
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
    server.sort()
    return {"n": len(times), "p50": statistics.median(times), "p99": p99, "max": times[-1],
            "min": times[0], "ready_p50": statistics.median(server) if server else -1,
            "ready_max": server[-1] if server else -1}


def leader_ready_after(procs, killed, wall0):
    """Seconds from wall0 to the first "raft: leader ready" logged after it by a member
    other than the killed one (None if not found)."""
    from datetime import datetime, timezone
    best = None
    for i, m in enumerate(procs):
        if i == killed:
            continue
        with open(m.log_path, errors="replace") as f:
            for line in f:
                if "raft: leader ready" not in line:
                    continue
                ts = re.match(r"ts=(\S+)Z", line)
                if not ts:
                    continue
                t = datetime.strptime(ts.group(1), "%Y-%m-%dT%H:%M:%S.%f") \
                    .replace(tzinfo=timezone.utc).timestamp()
                if t >= wall0 and (best is None or t < best):
                    best = t
    return None if best is None else best - wall0


def set_stats(procs, name, tmp):
    """Before the set stops: the Raft terms in which a member became leader (1: no
    re-election since the first), the longest loop-thread stall and entry apply logged,
    and the write commands per Raft entry summed over the members' /metrics."""
    leader_terms, stall, apply_ms, entries, cmds = set(), 0, 0, 0.0, 0.0
    for i, m in enumerate(procs):
        log = (tmp / f"{name}-m{i + 1}.log").read_text(errors="replace")
        leader_terms |= set(re.findall(r'msg="raft: state" state=leader term=(\d+)', log))
        stall = max([stall] + [int(x) for x in re.findall(r"loop thread stalled.* ms=(\d+)", log)])
        apply_ms = max([apply_ms] + [int(x) for x in
                                     re.findall(r"slow apply on the loop thread.* ms=(\d+)", log)])
        hp = [a.split("=", 1)[1] for a in m.args if a.startswith("--http-listen=")][0]
        try:
            text = urllib.request.urlopen(f"http://{hp}/metrics", timeout=5).read().decode()
        except OSError:
            continue
        for metric, acc in (("batches", "e"), ("commands", "c")):
            mm = re.search(rf"^stripedb_shard_repl_{metric}_total\S* (\S+)", text, re.M)
            if mm and acc == "e":
                entries += float(mm.group(1))
            elif mm:
                cmds += float(mm.group(1))
    return {"leader_terms": len(leader_terms), "max_stall_ms": stall, "max_apply_ms": apply_ms,
            "cmds_per_entry": cmds / entries if entries else 0.0}


def ycsb(args, tmp):
    targets = []
    extra = [f"--raft-election-timeout-ms={args.ycsb_election_ms}"] if args.ycsb_election_ms else []
    three, _, uri3 = start_set(args.bin, tmp, 3, "ycsb3", extra)
    before = []
    if args.before_bin:
        before, _, uri3b = start_set(args.before_bin, tmp, 3, "ycsb3b", extra)
    tls = []
    if args.raft_tls:
        tls, _, uri3t = start_set(args.bin, tmp, 3, "ycsb3tls", extra + make_raft_pki(tmp))
    targets = [("3-member", uri3)]
    one, old = [], []
    if not args.only_3member:
        one, _, uri1 = start_set(args.bin, tmp, 1, "ycsb1")
        port = free_port()
        old = [Member(args.base_bin, ["--role=shard", f"--data-dir={tmp / 'old'}",
                                      f"--listen=127.0.0.1:{port}",
                                      f"--http-listen=127.0.0.1:{free_port()}"],
                      tmp / "old.log")]
        wait_until(lambda: hello(port)["ok"], 30, what="old shard up")
        targets += [("1-member", uri1),
                    ("old-single", f"mongodb://127.0.0.1:{port}/?directConnection=true")]
    if args.raft_tls:
        targets.insert(1, ("3-member-raft-tls", uri3t))
    if args.before_bin:
        targets.insert(1, ("3-member-before", uri3b))
    results = {}
    try:
        for rnd in range(args.rounds):
            for wl in ("a", "c"):
                order = targets if rnd % 2 == 0 else list(reversed(targets))
                cmd = [args.bin, "bench", "--workload", wl, "--threads", str(args.threads),
                       "--records", str(args.records), "--seconds", str(args.seconds),
                       "--quiet", "--json", str(tmp / f"y{wl}{rnd}.json")]
                for label, uri in order:
                    cmd += ["--uri", uri, "--label", label]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                sys.stdout.write(r.stdout)
                if r.returncode != 0:
                    sys.stdout.write(r.stderr[-3000:])
                for i, (label, _) in enumerate(order):
                    # `stripedb bench` suffixes the JSON path with .N only with several --uri
                    jp = tmp / (f"y{wl}{rnd}.json.{i + 1}" if len(order) > 1 else f"y{wl}{rnd}.json")
                    if not os.path.exists(jp):
                        print(f"ycsb_{wl}_{label}_round{rnd}=FAILED (see stderr above)")
                        continue
                    with open(jp) as f:
                        rep = json.load(f)
                    ph = rep["phases"][0]
                    lat = ph.get("latencyMS", {})
                    results.setdefault((wl, label), []).append((ph["opsPerSec"], lat))
        sets = [("3-member", three, "ycsb3")] + (
            [("3-member-before", before, "ycsb3b")] if before else [])
        for label, procs, name in sets:
            st = set_stats(procs, name, tmp)
            print(f"ycsb_set_{re.sub('-', '_', label)}: leader_terms={st['leader_terms']} "
                  f"max_loop_stall_ms={st['max_stall_ms']} max_apply_ms={st['max_apply_ms']} "
                  f"commands_per_entry={st['cmds_per_entry']:.2f}", flush=True)
    finally:
        for m in three + before + tls + one + old:
            m.stop()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("STRIPEDB_BIN", "./stripedb"))
    ap.add_argument("--base-bin", default=None,
                    help="a build of 30dde90 (the single-process shard); required unless "
                         "--only-3member or --skip-ycsb")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--election-ms", type=int, default=0, help="0: the binary's default")
    ap.add_argument("--ycsb-election-ms", type=int, default=0,
                    help="election timeout of the YCSB 3-member set (0: the binary's default)")
    ap.add_argument("--heartbeat-ms", type=int, default=500,
                    help="the client's heartbeatFrequencyMS")
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--raft-tls", action="store_true",
                    help="also a 3-member set with mutual TLS on the Raft port (issue #21)")
    ap.add_argument("--skip-ycsb", action="store_true")
    ap.add_argument("--before-bin", default=None,
                    help="also a 3-member set of this build in the YCSB runs (before/after)")
    ap.add_argument("--only-3member", action="store_true",
                    help="YCSB only against the 3-member set(s): the bulk-load stability "
                         "runs (each round loads twice, for A and for C)")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and logs")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    if not args.base_bin and not (args.only_3member or args.skip_ycsb):
        ap.error("--base-bin is required unless --only-3member or --skip-ycsb")
    if args.base_bin:
        args.base_bin = os.path.abspath(args.base_bin)
    if args.before_bin:
        args.before_bin = os.path.abspath(args.before_bin)
    os.environ["STRIPEDB_BIN"] = args.bin
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="replset_bench."))
    try:
        if not args.skip_failover:
            f = failover(args, tmp)
            print(f"failover_kills={f['n']} failover_p50_s={f['p50']:.3f} "
                  f"failover_p99_s={f['p99']:.3f} failover_max_s={f['max']:.3f} "
                  f"failover_min_s={f['min']:.3f} leader_ready_p50_s={f['ready_p50']:.3f} "
                  f"leader_ready_max_s={f['ready_max']:.3f}", flush=True)
        if not args.skip_ycsb:
            res = ycsb(args, tmp)
            if args.only_3member:
                for (wl, label), runs in sorted(res.items()):
                    print(f"ycsb_{wl}_{re.sub('-', '_', label)}_runs="
                          f"{[round(o) for o, _ in runs]}")
                return
            print("\nworkload target        ops/s (median of rounds)  ratio to old-single")
            for wl in ("a", "c"):
                base = statistics.median(o for o, _ in res[(wl, "old-single")])
                labels = ["3-member", "1-member", "old-single"]
                if args.before_bin:
                    labels.insert(1, "3-member-before")
                if args.raft_tls:
                    labels.insert(1, "3-member-raft-tls")
                for label in labels:
                    if not res.get((wl, label)):
                        print(f"ycsb_{wl}_{re.sub('-', '_', label)}=FAILED")
                        continue
                    ops = statistics.median(o for o, _ in res[(wl, label)])
                    print(f"ycsb_{wl}_{re.sub('-', '_', label)}_ops_s={ops:.0f} "
                          f"ratio={ops / base:.2f} runs={[round(o) for o, _ in res[(wl, label)]]}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
