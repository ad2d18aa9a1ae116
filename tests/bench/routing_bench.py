#!/usr/bin/python3
"""Benchmark of routing at scale (issue #26): incremental refresh with many chunks.

Usage (from the build dir; see tests/bench/README.md):
    STRIPEDB_BIN=./stripedb /usr/bin/python3 $SRCDIR/tests/bench/routing_bench.py \
        [--members 3] [--collections 1000] [--chunks-per-collection 1000] [--proxies 4] \
        [--moves 1000] [--shards 2] [--snapshot-threshold 1024]

Steps, each measured:
  1. a metadata group of --members; --shards embedded shards; --collections hashed
     collections of --chunks-per-collection chunks each (one shardCollection each);
  2. --proxies proxies started; cold start: one targeted find per collection through each
     proxy (each loads its collection by getRoutingTable cursor): wall time per proxy,
     and proxy memory per chunk = (RSS after - RSS before) / chunks cached;
  3. --moves single-chunk moves (setChunkShard on a random chunk of a random collection:
     routing only, no data), one at a time, each followed by a wait until every proxy
     reports the new routing version (stripedb_proxy_routing_version): per move, the
     getRoutingTable bytes and chunks metadata sent (its /metrics, all members), the
     proxies' refresh time (stripedb_proxy_routing_refresh_seconds), the propagation
     latency (commit -> every proxy up to date; includes this script's polling), and the
     metadata members' CPU (utime+stime from /proc);
  4. metadata with the chunks: database size, members' RSS and peak RSS (VmHWM: includes
     snapshots, taken every --snapshot-threshold entries), and the time for a restarted
     follower to be ready and caught up (restart replays from its last snapshot).
Prints key=value lines. Never part of `make check`.
"""
import argparse
import os
import pathlib
import random
import shutil
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import pymongo  # noqa: E402

import conftest  # noqa: E402
from conftest import free_port, http_get, wait_until  # noqa: E402
from metadata_cluster import Cluster  # noqa: E402


def metrics(port, prefix):
    st, body = http_get(port, "/metrics")
    out = {}
    if st != 200:
        return out
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            name, val = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(val)
    return out


def metric(port, name):
    return sum(v for k, v in metrics(port, name).items()
               if k == name or k.startswith(name + "{"))


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--collections", type=int, default=1000)
    ap.add_argument("--chunks-per-collection", type=int, default=1000)
    ap.add_argument("--proxies", type=int, default=4)
    ap.add_argument("--moves", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--snapshot-threshold", type=int, default=1024)
    ap.add_argument("--election-ms", type=int, default=2000,
                    help="raft election timeout of the metadata members (ms)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sdb-routing-bench-"))
    procs = []

    def start_role(a, http=True, env=None, wait=True):
        if not any(x.startswith("--http-listen=") for x in a):
            a = a + [f"--http-listen=127.0.0.1:{free_port()}"]
        port = int([x for x in a if x.startswith("--http-listen=")][0].rsplit(":", 1)[1])
        if not any(x.startswith("--log-level=") for x in a):
            a = a + ["--log-level=warn"]
        p = conftest.Proc(a, str(tmp / f"proc{len(procs)}.log"), port, env)
        procs.append(p)
        return p.wait_healthy(120) if wait else p

    def out(k, v):
        print(f"{k}={v}", flush=True)

    try:
        total = args.collections * args.chunks_per_collection
        meta = Cluster(start_role, tmp, args.members, election_ms=args.election_ms,
                       extra=["--log-level=info",
                              f"--raft-snapshot-threshold={args.snapshot_threshold}",
                              f"--max-chunks-per-command={args.chunks_per_collection}"])
        leader = meta.leader()
        lc = pymongo.MongoClient(leader.wire, directConnection=True, socketTimeoutMS=600000)
        shard_ids = []
        for i in range(args.shards):
            sid = f"shard-{i}"
            port = free_port()
            d = tmp / sid
            d.mkdir()
            start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
            lc.admin.command({"addShard": sid, "uri": f"mongodb://127.0.0.1:{port}/"})
            shard_ids.append(sid)
        lc.admin.command({"createDatabase": "bench"})
        t0 = time.monotonic()
        for c in range(args.collections):
            lc.admin.command({"shardCollection": f"bench.c{c}", "key": {"k": "hashed"},
                              "numChunks": args.chunks_per_collection})
        out("setup_chunks", total)
        out("setup_collections", args.collections)
        out("setup_seconds", round(time.monotonic() - t0, 1))
        rv = lc.admin.command("metadataStatus")["routingVersion"]
        meta.converged(timeout=600)

        # 2. proxies, cold start
        pports, pprocs = [], []
        for _ in range(args.proxies):
            port = free_port()
            p = start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                            f"--metadata={meta.seeds()}"])
            pports.append(port)
            pprocs.append(p)
        for p in pprocs:
            wait_until(lambda: metric(p.http_port, "stripedb_proxy_routing_version") >= rv, 60,
                       what="proxy long poll")
        cold, per_chunk = [], []
        for port, p in zip(pports, pprocs):
            rss0 = proc_status(p.p.pid, "VmRSS")
            cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                                     socketTimeoutMS=600000)
            t0 = time.monotonic()
            for c in range(args.collections):
                cl.bench[f"c{c}"].find_one({"k": c})
            cold.append(time.monotonic() - t0)
            cl.close()
            n = metric(p.http_port, "stripedb_proxy_routing_chunks")
            assert n == total, (n, total)
            per_chunk.append((proc_status(p.p.pid, "VmRSS") - rss0) / n)
        out("proxy_cold_start_seconds", " ".join(f"{x:.2f}" for x in cold))
        out("proxy_cold_start_chunks_per_second", int(total / (sum(cold) / len(cold))))
        out("proxy_memory_bytes_per_chunk", " ".join(f"{x:.0f}" for x in per_chunk))

        # 3. moves: the plan (collections and their chunk ids, read by cursor) first, so
        # that this script's own reads are not counted in the measurement
        members = meta.members
        rng = random.Random(26)
        ids = {}
        plan = [f"bench.c{rng.randrange(args.collections)}" for _ in range(args.moves)]
        for ns in sorted(set(plan)):
            ids[ns], resume = [], None
            while True:
                cmd = {"getRoutingTable": ns, "cursor": {}}
                if resume is not None:
                    cmd["resumeAfter"] = resume
                r = lc.admin.command(cmd)
                ids[ns] += [(ch["id"], ch["shard"]) for ch in r["chunks"]]
                if not r["more"]:
                    break
                resume = r["resumeAfter"]
        m0 = {m.idx: metrics(m.http_port, "stripedb_metadata_routing_") for m in members}
        p0 = [metrics(p.http_port, "stripedb_proxy_routing_") for p in pprocs]
        cpu0 = {m.idx: cpu_s(m.proc.p.pid) for m in members}
        lat = []
        leader_changes = 0
        t_all = time.monotonic()
        for ns in plan:
            j = rng.randrange(len(ids[ns]))
            cid, sh = ids[ns][j]
            to = shard_ids[(shard_ids.index(sh) + 1) % len(shard_ids)]
            ids[ns][j] = (cid, to)
            t0 = time.monotonic()
            # straight to the leader: Cluster.write() asks every member for metadataStatus,
            # whose state hash reads every chunk (it would dominate the measurement)
            while True:
                try:
                    v = lc.admin.command({"setChunkShard": cid, "shard": to})["routingVersion"]
                    break
                except (pymongo.errors.NotMasterError, pymongo.errors.AutoReconnect):
                    leader_changes += 1
                    lc.close()
                    leader = meta.leader()
                    lc = pymongo.MongoClient(leader.wire, directConnection=True,
                                             socketTimeoutMS=600000)
            for p in pprocs:
                wait_until(lambda: metric(p.http_port, "stripedb_proxy_routing_version") >= v,
                           30, interval=0.001, what="proxy refresh")
            lat.append(time.monotonic() - t0)
        t_all = time.monotonic() - t_all
        # the getRoutingTable calls this script made for chunk ids are full loads; diffs
        # are the proxies'
        m1 = {m.idx: metrics(m.http_port, "stripedb_metadata_routing_") for m in members}
        p1 = [metrics(p.http_port, "stripedb_proxy_routing_") for p in pprocs]
        cpu1 = {m.idx: cpu_s(m.proc.p.pid) for m in members}
        out("metadata_leader_changes_during_moves", leader_changes)

        def dsum(key):
            return sum(m1[i].get(key, 0) - m0[i].get(key, 0) for i in m1)
        dbytes = dsum('stripedb_metadata_routing_reply_bytes_total{kind="diff"}')
        dchunks = dsum('stripedb_metadata_routing_chunks_sent_total{kind="diff"}')
        dreplies = dsum('stripedb_metadata_routing_replies_total{kind="diff"}')
        fullr = dsum('stripedb_metadata_routing_replies_total{kind="full"}')
        n = args.moves * args.proxies
        out("moves", args.moves)
        out("move_diff_bytes_per_proxy", round(dbytes / n, 1))
        out("move_diff_chunks_per_proxy", round(dchunks / n, 3))
        out("move_diff_replies_per_proxy", round(dreplies / n, 3))
        out("move_full_reloads", int(fullr))
        pb = sum(p1[k].get("stripedb_proxy_routing_bytes_total", 0) -
                 p0[k].get("stripedb_proxy_routing_bytes_total", 0) for k in range(len(pprocs)))
        out("move_proxy_received_bytes_per_proxy", round(pb / n, 1))
        rs = sum(p1[k].get("stripedb_proxy_routing_refresh_seconds_sum", 0) -
                 p0[k].get("stripedb_proxy_routing_refresh_seconds_sum", 0)
                 for k in range(len(pprocs)))
        rc = sum(p1[k].get("stripedb_proxy_routing_refresh_seconds_count", 0) -
                 p0[k].get("stripedb_proxy_routing_refresh_seconds_count", 0)
                 for k in range(len(pprocs)))
        out("move_proxy_refresh_ms_mean", round(1000 * rs / rc, 3) if rc else "nan")
        out("move_refreshes_per_proxy", round(rc / n, 3))
        lat.sort()
        out("move_propagation_ms_p50", round(1000 * lat[len(lat) // 2], 2))
        out("move_propagation_ms_p99", round(1000 * lat[min(len(lat) - 1, int(len(lat) * .99))], 2))
        out("moves_per_second", round(args.moves / t_all, 1))
        cpu = sum(cpu1[i] - cpu0[i] for i in cpu1)
        out("metadata_cpu_ms_per_move_all_members", round(1000 * cpu / args.moves, 2))
        out("metadata_cpu_ms_per_move_leader",
            round(1000 * (cpu1[leader.idx] - cpu0[leader.idx]) / args.moves, 2))

        # 4. metadata with the chunks: size, memory, restart
        for m in members:
            size = sum(p.stat().st_size for p in pathlib.Path(m.data_dir).glob("meta.db*"))
            out(f"metadata_{m.id}_db_bytes", size)
            out(f"metadata_{m.id}_rss_bytes", proc_status(m.proc.p.pid, "VmRSS"))
            out(f"metadata_{m.id}_peak_rss_bytes", proc_status(m.proc.p.pid, "VmHWM"))
        for m in members:
            snaps = sorted(pathlib.Path(m.data_dir, "raft").glob("snapshot-*"))
            snaps = [p for p in snaps if not p.name.endswith(".meta")]
            out(f"metadata_{m.id}_snapshots_kept", len(snaps))
            if snaps:
                out(f"metadata_{m.id}_snapshot_bytes", snaps[-1].stat().st_size)
        # snapshot and restore durations, from the members' logs (fsm.c logs each)
        import re
        snap_ms, snap_bytes = [], []
        for p in procs:
            if "--role=metadata" not in p.args:
                continue
            for line in open(p.log_path, errors="replace"):
                mt = re.search(r'snapshot taken.* bytes=(\d+) ms=([\d.]+)', line)
                if mt:
                    snap_bytes.append(int(mt.group(1)))
                    snap_ms.append(float(mt.group(2)))
        out("metadata_snapshots_taken", len(snap_ms))
        if snap_ms:
            out("metadata_snapshot_ms_max", max(snap_ms))
            out("metadata_snapshot_bytes_max", max(snap_bytes))
        if args.members > 1:
            f = next(m for m in members if m is not leader)
            meta.kill(f)
            t0 = time.monotonic()
            meta.restart(f)
            want = lc.admin.command("metadataStatus")["fsmLastApplied"]
            wait_until(lambda: f.cmd("metadataStatus")["fsmLastApplied"] >= want, 300,
                       interval=0.05, what="restarted follower caught up")
            out("metadata_follower_restart_seconds", round(time.monotonic() - t0, 2))
            out("metadata_follower_restart_peak_rss_bytes", proc_status(f.proc.p.pid, "VmHWM"))
            for line in open(f.proc.log_path, errors="replace"):
                mt = re.search(r'restored snapshot.* bytes=(\d+) ms=([\d.]+)', line)
                if mt:
                    out("metadata_follower_restore_ms", mt.group(2))
        lc.close()
    finally:
        for p in reversed(procs):
            try:
                p.stop()
            except Exception:  # noqa: BLE001
                pass
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
