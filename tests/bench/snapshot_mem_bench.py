#!/usr/bin/python3
"""Memory of a snapshot copy to a new shard replica-set member (issue #15, "Must show": a
2 GB shard snapshotted and copied to a new member with every member's peak RSS under
512 MB).

 1. A 3-member shard set (this build) with a low --raft-snapshot-threshold, so that the
    set compacts its Raft log while it is loaded.
 2. --gb GB of documents inserted fast: --threads clients, each sending insert commands of
    --batch documents of --doc-kb KiB of random bytes (one command stays under the
    512 KiB that one Raft entry of writes carries when it is not alone).
 3. A fourth member started empty (the set's --bootstrap-members without its own id) and
    added online (`stripedb ctl shard member add`): the primary's log no longer starts at
    1, so it installs a snapshot, i.e. copies shard.db from the member that sent it
    (src/shard/snapfile.c: SQLite backup API, 8 MiB chunks).
 4. Reported, next to the data size (dbStats dataSize, and shard.db on disk): every
    member's peak RSS (VmHWM of /proc/PID/status) during the load and, reset before the
    add (`echo 5 > /proc/PID/clear_refs`), during the copy; the time of the add (ctl
    returns once the member votes) and until it has applied everything the primary has.

Usage (release build; see tests/bench/README.md):
    /usr/bin/python3 tests/bench/snapshot_mem_bench.py --bin /tmp/build-rel/stripedb \\
        [--gb 0.2] [--doc-kb 64] [--batch 6] [--threads 4] [--threshold 64] [--dir DIR]
        [--keep]
Prints key=value lines and a summary table; exit 1 when a member's peak RSS (VmHWM) is
over --limit-mb (512). Beside it, each member's peak anonymous memory (RssAnon) and mapped
file pages (RssFile + RssShmem), sampled every 50 ms: VmHWM also counts shard.db's pages
mapped by SQLite's mmap, which are the page cache's. Never part of `make check`.
"""
import argparse
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import pymongo  # noqa: E402
from bson.binary import Binary  # noqa: E402
from pymongo.errors import PyMongoError  # noqa: E402

from conftest import free_port, wait_until  # noqa: E402

SET = "memrs"


class Member:
    def __init__(self, binary, args, log):
        with open(log, "ab") as f:
            self.p = subprocess.Popen([binary] + args, stdout=f, stderr=subprocess.STDOUT,
                                      env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"),
                                      start_new_session=True)

    def status_kb(self, key):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return -1

    def rss_parts_kb(self):
        """(RssAnon, RssFile, RssShmem) in KiB, or None once the process is gone."""
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                v = {}
                for line in f:
                    k, _, rest = line.partition(":")
                    if k in ("RssAnon", "RssFile", "RssShmem"):
                        v[k] = int(rest.split()[0])
            return v.get("RssAnon", 0), v.get("RssFile", 0), v.get("RssShmem", 0)
        except OSError:
            return None

    def reset_peak(self):
        # Linux >= 4.0: writing 5 resets VmHWM to the current RSS
        with open(f"/proc/{self.p.pid}/clear_refs", "w") as f:
            f.write("5")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class AnonPeaks:
    """Every member's peak RssAnon and peak RssFile, sampled every 50 ms on a thread.
    VmHWM counts every resident page, the shard.db pages mapped by SQLite's mmap (the
    first GiB, storage/store.c) included: those are the page cache's, shared and dropped
    under memory pressure, not the process's own memory. RssAnon is what the process
    itself holds (heap, stacks, the copy's buffers); RssShmem is counted with the file
    pages (a data directory on tmpfs maps shard.db as shmem)."""

    def __init__(self, procs):
        self.procs = procs
        self.anon = {}
        self.file = {}
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_ev.wait(0.05):
            for k, m in list(self.procs.items()):
                v = m.rss_parts_kb()
                if v is not None:
                    self.anon[k] = max(self.anon.get(k, 0), v[0])
                    self.file[k] = max(self.file.get(k, 0), v[1] + v[2])

    def take(self):
        """The peaks so far (KiB), then start again from zero."""
        a, f = dict(self.anon), dict(self.file)
        self.anon.clear()
        self.file.clear()
        return a, f

    def stop(self):
        self.stop_ev.set()
        self.t.join()


def direct(port, timeout_ms=5000):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=timeout_ms,
                               socketTimeoutMS=timeout_ms * 12)


def rs_status(port):
    with direct(port) as c:
        return c.admin.command("replSetGetStatus")


def primary_of(wires):
    for i, p in enumerate(wires):
        try:
            with direct(p, 1000) as c:
                if c.admin.command("hello").get("isWritablePrimary"):
                    return i
        except PyMongoError:
            continue
    return None


def member_args(tmp, i, wire, raft, members, threshold):
    return ["--role=shard", f"--replica-set={SET}", f"--node-id={i}",
            f"--data-dir={tmp / f'm{i}'}", f"--listen=127.0.0.1:{wire}",
            f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members={members}",
            f"--http-listen=127.0.0.1:{free_port()}", "--raft-tls=disabled",
            f"--raft-snapshot-threshold={threshold}"]


def load(uri, total_bytes, doc_kb, batch, threads):
    """Insert about total_bytes of documents; returns (documents, seconds)."""
    per_doc = doc_kb * 1024
    n_docs = max(1, total_bytes // per_doc)
    next_id = [0]
    lock = threading.Lock()
    errors = []

    def worker():
        with pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=30000,
                                 socketTimeoutMS=120000) as c:
            coll = c.bench.big
            while True:
                with lock:
                    start = next_id[0]
                    if start >= n_docs:
                        return
                    next_id[0] = min(n_docs, start + batch)
                    end = next_id[0]
                docs = [{"_id": i, "p": Binary(os.urandom(per_doc))} for i in range(start, end)]
                for attempt in range(20):
                    try:
                        coll.insert_many(docs, ordered=False)
                        break
                    except pymongo.errors.BulkWriteError as e:
                        # a retry after an unknown outcome: duplicates are documents
                        # already in
                        if all(w.get("code") == 11000 for w in e.details["writeErrors"]):
                            break
                        errors.append(repr(e)[:200])
                    except PyMongoError as e:
                        errors.append(repr(e)[:200])
                        time.sleep(0.2)  # back off while a new primary is elected
    t0 = time.monotonic()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    last = t0
    while any(t.is_alive() for t in ts):
        for t in ts:
            t.join(5)
        if time.monotonic() - last > 15:
            last = time.monotonic()
            print(f"progress_docs={next_id[0]}/{n_docs} s={last - t0:.0f}", flush=True)
    if errors:
        print(f"load_retried_errors={len(errors)} first={errors[0]!r}", flush=True)
    return n_docs, time.monotonic() - t0


def file_mb(path):
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.path.getsize(str(path) + suffix)
        except OSError:
            pass
    return total / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(HERE.parent.parent / "build" / "stripedb"))
    ap.add_argument("--gb", type=float, default=0.2, help="data to insert, GB (2 for the issue)")
    ap.add_argument("--doc-kb", type=int, default=64)
    ap.add_argument("--batch", type=int, default=6, help="documents per insert command")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--threshold", type=int, default=64, help="--raft-snapshot-threshold")
    ap.add_argument("--limit-mb", type=int, default=512)
    ap.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    args = ap.parse_args()

    tmp = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="snapmem-"))
    tmp.mkdir(parents=True, exist_ok=True)
    need_gb = args.gb * 4 * 1.5 + args.gb * 2
    free_gb = shutil.disk_usage(tmp).free / 2**30
    print(f"dir={tmp} free_gb={free_gb:.1f} need_about_gb={need_gb:.1f}", flush=True)
    if free_gb < need_gb:
        print("not enough disk for 4 members, the snapshot copies and the oplog: pass a "
              "smaller --gb", file=sys.stderr)
        return 2

    wires = [free_port() for _ in range(4)]
    rafts = [free_port() for _ in range(4)]
    members = ",".join(f"{i + 1}@127.0.0.1:{rafts[i]}" for i in range(3))
    procs = {}
    try:
        for i in range(3):
            procs[i + 1] = Member(args.bin, member_args(tmp, i + 1, wires[i], rafts[i], members,
                                                        args.threshold), tmp / f"m{i + 1}.log")
        uri = f"mongodb://{','.join(f'127.0.0.1:{p}' for p in wires[:3])}/?replicaSet={SET}"
        wait_until(lambda: primary_of(wires[:3]) is not None, 60, interval=0.2,
                   what="a primary")

        sampler = AnonPeaks(procs)
        n_docs, load_s = load(uri, int(args.gb * 1e9), args.doc_kb, args.batch, args.threads)
        pi = primary_of(wires[:3])
        with direct(wires[pi]) as c:
            stats = c.bench.command("dbStats")
        data_mb = stats["dataSize"] / 2**20
        db_mb = file_mb(tmp / f"m{pi + 1}" / "shard.db")
        pst = rs_status(wires[pi])
        print(f"docs={n_docs} load_s={load_s:.1f} load_mb_s={data_mb / load_s:.1f} "
              f"data_mb={data_mb:.0f} shard_db_mb={db_mb:.0f} primary=m{pi + 1} "
              f"applied={pst['applied']}", flush=True)
        peak_load = {k: m.status_kb("VmHWM") for k, m in procs.items()}
        anon_load, file_load = sampler.take()

        # the new member: empty, waits to be added
        procs[4] = Member(args.bin, member_args(tmp, 4, wires[3], rafts[3], members,
                                                args.threshold), tmp / "m4.log")
        wait_until(lambda: rs_status(wires[3]) is not None, 60, interval=0.2,
                   what="the new member up")
        for m in procs.values():
            m.reset_peak()
        t0 = time.monotonic()
        r = subprocess.run([args.bin, "ctl", "--timeout-ms=600000", "shard", "member", "add",
                            uri, "4", f"--raft=127.0.0.1:{rafts[3]}",
                            f"--wire=127.0.0.1:{wires[3]}"],
                           capture_output=True, text=True, timeout=3600,
                           env={k: v for k, v in os.environ.items()
                                if k != "STRIPEDB_METADATA"})
        add_s = time.monotonic() - t0
        if r.returncode != 0:
            print(f"member add failed: {r.stderr.strip()}", file=sys.stderr)
            return 1

        def caught_up():
            p = primary_of(wires)
            return p is not None and rs_status(wires[3])["applied"] >= rs_status(wires[p])["applied"]
        wait_until(caught_up, 3600, interval=0.5, what="the new member caught up")
        copy_s = time.monotonic() - t0
        peak_copy = {k: m.status_kb("VmHWM") for k, m in procs.items()}
        anon_copy, file_copy = sampler.take()
        sampler.stop()
        rss_now = {k: m.status_kb("VmRSS") for k, m in procs.items()}
        installed = "installing a snapshot" in (tmp / "m4.log").read_text(errors="replace")
        new_db_mb = file_mb(tmp / "m4" / "shard.db")
        print(f"snapshot_installed={installed} add_s={add_s:.1f} caught_up_s={copy_s:.1f} "
              f"copy_mb_s={db_mb / copy_s:.1f} new_member_shard_db_mb={new_db_mb:.0f}",
              flush=True)
        for k in sorted(procs):
            print(f"m{k}_peak_rss_load_mb={peak_load.get(k, -1024) / 1024:.0f} "
                  f"m{k}_peak_rss_copy_mb={peak_copy[k] / 1024:.0f} "
                  f"m{k}_rss_after_mb={rss_now[k] / 1024:.0f} "
                  f"m{k}_peak_anon_load_mb={anon_load.get(k, -1024) / 1024:.0f} "
                  f"m{k}_peak_anon_copy_mb={anon_copy.get(k, -1024) / 1024:.0f} "
                  f"m{k}_peak_file_copy_mb={file_copy.get(k, -1024) / 1024:.0f}", flush=True)

        print()
        print("| data (dataSize) | shard.db | docs | load | add (votes) | caught up |")
        print("|---:|---:|---:|---:|---:|---:|")
        print(f"| {data_mb:,.0f} MB | {db_mb:,.0f} MB | {n_docs:,} | {load_s:.0f} s | "
              f"{add_s:.1f} s | {copy_s:.1f} s |")
        print()
        print("| member | role | peak RSS during load (anonymous) | peak RSS during the copy "
              "(anonymous) | mapped file pages at the copy's peak |")
        print("|---|---|---:|---:|---:|")
        for k in sorted(procs):
            role = ("primary" if k == pi + 1 else "new member" if k == 4 else "secondary")
            load_txt = (f"{peak_load[k] / 1024:.0f} MB ({anon_load.get(k, 0) / 1024:.0f} MB)"
                        if k in peak_load else "-")
            print(f"| m{k} | {role} | {load_txt} | {peak_copy[k] / 1024:.0f} MB "
                  f"({anon_copy.get(k, 0) / 1024:.0f} MB) | {file_copy.get(k, 0) / 1024:.0f} MB |")
        worst = max(list(peak_copy.values()) + list(peak_load.values())) / 1024
        worst_anon = max(list(anon_copy.values()) + list(anon_load.values())) / 1024
        # the verdict is on VmHWM (every resident page, shard.db's mapped ones included),
        # the measure; the anonymous peak says how much of it the member holds
        print(f"\nmax_peak_rss_mb={worst:.0f} max_peak_anon_mb={worst_anon:.0f} "
              f"limit_mb={args.limit_mb} {'OK' if worst <= args.limit_mb else 'OVER'}")
        return 0 if worst <= args.limit_mb else 1
    finally:
        for m in procs.values():
            m.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
