#!/usr/bin/python3
"""Benchmark of the Data Movement Platform (issue #8). Never run by `make check`.

    STRIPEDB_BIN=/tmp/build-rel/stripedb /usr/bin/python3 tests/bench/migration_bench.py \
        [--docs 50000] [--doc-bytes 200] [--backlog 20000] [--migrations 20]

Starts 1 metadata member, 2 embedded shards, 1 proxy and 1 coordinator on free loopback
ports (tmp dir), then measures:
  (a) bulk import: the same N documents (random _ids, inserted in random shard-key order,
      shard key k with its index) migrated with importOrder=index (snapshot sorted by
      the shard key), importOrder=arrival (no sort: the source's shard-key index scan)
      and importOrder=id (sorted by _id, the embedded store's clustering key), the three
      alternating, --import-reps times each (a fresh collection per migration); docs/s
      and MB/s from the migration's stats (imported, importBytes, importMS), the median
      per order and the ratios of the medians (index/arrival, id/arrival, id/index);
  (b) replication: the migration's replication paused (`ctl migration pause`), a backlog
      of B events written on the source (the CDC publisher keeps publishing it), then
      resumed: events/s from resume until the replicator caught up and the migration left
      replicating (read from the CDC log + apply to the target), and the lag at resume
      (that same time: how far behind the replicator was);
  (c) the write pause at the switch over M migrations of one chunk back and forth under a
      light write load through the proxy: p50 / p99 / max of stats.pausesMS;
  (d) reading only the chunk (issue #17): a collection of --chunk-docs documents (ranged
      key k with its index) of which one chunk holds --chunk-fraction (default 1%), and a
      second collection holding only that chunk's documents (same keys, same bytes); the
      chunk of each is moved to the other shard in the same run: documents examined on
      the source (the shard's stripedb_shard_docs_examined_total / _returned_total, read
      from /metrics around each migration), the migration's wall time (ctl migrate to
      complete, grace 0) and its importMS, and the ratios big / small (medians of
      --chunk-reps moves of each, alternating, the chunk going back and forth); the
      verification's source side (stats.verifySource: oplog entries read, changed _ids,
      documents read by _id). --chunk-writes W: W documents of the chunk updated through
      the proxy after each import's snapshot (replication paused meanwhile), changes the
      verification has to read.
--parts selects the measurements (default import,repl,pause,chunk).
Prints one key=value line per measurement.
"""
import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from conftest import Proc, free_port, http_get  # noqa: E402
from migration_helpers import MigCluster  # noqa: E402


def percentile(v, p):
    v = sorted(v)
    if not v:
        return 0
    k = max(1, min(len(v), int(-(-p * len(v) // 100))))
    return v[k - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=50000)
    ap.add_argument("--doc-bytes", type=int, default=200)
    ap.add_argument("--backlog", type=int, default=20000)
    ap.add_argument("--migrations", type=int, default=20)
    ap.add_argument("--chunk-docs", type=int, default=100000)
    ap.add_argument("--chunk-fraction", type=float, default=0.01)
    ap.add_argument("--chunk-reps", type=int, default=3)
    ap.add_argument("--chunk-writes", type=int, default=0)
    ap.add_argument("--import-reps", type=int, default=2)
    ap.add_argument("--parts", default="import,repl,pause,chunk")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="migbench-"))
    procs = []
    n = [0]

    def start_role(args, http=True, env=None, wait=True):
        args = list(args)
        port = free_port()
        args.append(f"--http-listen=127.0.0.1:{port}")
        n[0] += 1
        p = Proc(args, str(tmp / f"proc{n[0]}.log"), port, env)
        procs.append(p)
        if wait:
            p.wait_healthy()
        return p

    cl = MigCluster(start_role, tmp, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        pad = "x" * a.doc_bytes
        if "chunk" in parts:
            chunk_bench(cl, a, pad)
        # (a) bulk import: index, arrival and _id order, alternating
        keys = list(range(a.docs))
        random.Random(1).shuffle(keys)
        rnd = random.Random(2)
        ids = [f"{rnd.getrandbits(64):016x}" for _ in range(a.docs)]
        orders = ("index", "arrival", "id")
        res = {o: [] for o in orders}
        for rep in range(a.import_reps if "import" in parts else 0):
            for order in orders:
                name = f"{order}{rep}"
                ns = f"bench.{name}"
                cl.shard_collection(ns, {"k": 1}, shards=["shard-a"])
                cl.proxy_client()["bench"][name].create_index("k")
                # loaded on the source shard directly (its only chunk), faster than
                # through the proxy; random _ids: unrelated to the shard-key order
                coll = cl.shard_client("shard-a")["bench"][name]
                for s in range(0, a.docs, 1000):
                    coll.insert_many([{"_id": ids[k], "k": k, "pad": pad}
                                      for k in keys[s:s + 1000]])
                (c,) = cl.chunks(ns)
                mid = cl.migrate(ns, c["id"], "shard-b", f"--import-order={order}",
                                 "--grace-ms=0")
                m = cl.wait_migration(mid, timeout=600)
                st = m["stats"]
                ms = max(1, st["importMS"])
                rate = st["imported"] / ms * 1000
                res[order].append(rate)
                print(f"import_{order}_rep={rep} import_{order}_docs={st['imported']} "
                      f"import_{order}_ms={ms} import_{order}_docs_per_s={rate:.0f} "
                      f"import_{order}_mb_per_s={st['importBytes'] / ms / 1000:.1f} "
                      f"import_{order}_throttled_ms={st.get('importThrottledMS', 0)}",
                      flush=True)
        if res["index"]:
            med = {o: sorted(v)[len(v) // 2] if len(v) % 2 else
                   (sorted(v)[len(v) // 2 - 1] + sorted(v)[len(v) // 2]) / 2
                   for o, v in res.items()}
            print(" ".join(f"import_{o}_median_docs_per_s={med[o]:.0f}" for o in orders),
                  flush=True)
            print(f"import_index_over_arrival={med['index'] / med['arrival']:.2f} "
                  f"import_id_over_arrival={med['id'] / med['arrival']:.2f} "
                  f"import_id_over_index={med['id'] / med['index']:.2f}", flush=True)
        if "repl" in parts:
            repl_bench(cl, a, pad)
        if "pause" in parts:
            pause_bench(cl, a)
    finally:
        cl.close()
        for p in procs:
            p.stop()


def repl_bench(cl, a, pad):
    """(b) replication of a backlog: replication paused (ctl migration pause), B events
    written on the source, then resumed; events/s until the replicator caught up."""
    ns = "bench.repl"
    cl.shard_collection(ns, {"k": 1}, shards=["shard-a"])
    (c,) = cl.chunks(ns)
    cl.proxy_client()["bench"]["repl"].insert_one({"_id": "seed", "k": -1})
    cl.ctl("migration", "pause", "bench-repl")
    mid = cl.migrate(ns, c["id"], "shard-b", "--grace-ms=0", "--id=bench-repl")
    cl.wait_migration(mid, {"replicating"}, timeout=120)
    src = cl.shard_client("shard-a")["bench"]["repl"]
    for s in range(0, a.backlog, 1000):
        src.insert_many([{"_id": f"r{i}", "k": i, "pad": pad}
                         for i in range(s, min(a.backlog, s + 1000))])
    t0 = time.monotonic()
    cl.ctl("migration", "resume", mid)
    cl.wait_migration(mid, {"verifying", "switching", "switched", "cleaning", "complete"},
                      timeout=600)
    dt = time.monotonic() - t0
    m = cl.wait_migration(mid, timeout=120)
    assert m["state"] == "complete", m
    print(f"replication_events={a.backlog} replication_s={dt:.2f} "
          f"replication_events_per_s={a.backlog / dt:.0f} replication_lag_max_s={dt:.2f} "
          f"applied={m['stats']['applied']}", flush=True)


def pause_bench(cl, a):
    """(c) write pause over M migrations under a light write load."""
    ns = "bench.pause"
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 1000}],
                        shards=["shard-a", "shard-b"])
    stop = threading.Event()
    writes = [0]

    def writer():
        coll = cl.proxy_client()["bench"]["pause"]
        i = 0
        while not stop.is_set():
            i += 1
            coll.update_one({"_id": i % 500, "k": i % 500}, {"$set": {"v": i}}, upsert=True)
            writes[0] += 1
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    pauses = []
    for i in range(a.migrations):
        (c,) = [x for x in cl.chunks(ns) if x["min"]["k"] != 1000]
        to = "shard-b" if c["shard"] == "shard-a" else "shard-a"
        mid = cl.migrate(ns, c["id"], to, "--grace-ms=0")
        m = cl.wait_migration(mid, timeout=120)
        assert m["state"] == "complete", m
        pauses += m["stats"]["pausesMS"]
    stop.set()
    t.join()
    print(f"pause_migrations={a.migrations} pause_samples={len(pauses)} "
          f"pause_p50_ms={percentile(pauses, 50)} pause_p99_ms={percentile(pauses, 99)} "
          f"pause_max_ms={max(pauses)} writes_during={writes[0]}", flush=True)


def shard_counters(cl, sid):
    st, body = http_get(cl.shard_procs[sid].http_port, "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("stripedb_shard_docs_"):
            k, v = line.rsplit(" ", 1)
            out[k] = int(float(v))
    return out


MIG_SEQ = [0]


def timed_migration(cl, ns, chunk_id, writes=None):
    """Move the chunk to the other shard: (wall seconds, migration record, documents
    examined and returned on the source). With writes (a function of the source shard's
    id), the migration's replication is paused (the lease `ctl migration pause` takes)
    until the import's snapshot is taken, writes() runs (through the proxy: after the
    snapshot, so they are changes the verification must read), then it is resumed; what
    the writes' own queries examined on the source is left out of the counts, and so is
    the paused time (wall)."""
    (chunk,) = [c for c in cl.chunks(ns) if c["id"] == chunk_id]
    src = chunk["shard"]
    dst = "shard-b" if src == "shard-a" else "shard-a"
    MIG_SEQ[0] += 1
    mid = f"bench-{MIG_SEQ[0]}"
    pause = f"mig-pause/{mid}"
    if writes:
        cl.meta_write({"acquireLease": pause, "holder": "bench", "ttlMS": 600000})
    before = shard_counters(cl, src)
    t0 = time.monotonic()
    assert cl.migrate(ns, chunk_id, dst, "--grace-ms=0", f"--id={mid}") == mid
    paused = 0.0
    if writes:
        cl.wait_migration(mid, {"replicating"}, timeout=1800)
        p0 = time.monotonic()
        w0 = shard_counters(cl, src)
        writes(src)
        w1 = shard_counters(cl, src)
        for k in before:
            before[k] += w1[k] - w0[k]
        cl.meta_write({"releaseLease": pause, "holder": "bench"})
        paused = time.monotonic() - p0
    m = cl.wait_migration(mid, timeout=1800)
    dt = time.monotonic() - t0 - paused
    assert m["state"] == "complete", m
    after = shard_counters(cl, src)
    ex = after["stripedb_shard_docs_examined_total"] - before["stripedb_shard_docs_examined_total"]
    rt = after["stripedb_shard_docs_returned_total"] - before["stripedb_shard_docs_returned_total"]
    return dt, m, ex, rt


def chunk_bench(cl, a, pad):
    """(d) Moving one chunk of a large collection reads that chunk, not the collection."""
    n = a.chunk_docs
    c_n = max(1, int(n * a.chunk_fraction))
    lo = n // 2
    t0 = time.monotonic()
    big, small = "bench.big", "bench.small"
    cl.shard_collection(big, {"k": 1}, split_points=[{"k": lo}, {"k": lo + c_n}],
                        shards=["shard-a"])
    cl.shard_collection(small, {"k": 1}, shards=["shard-a"])
    db = cl.proxy_client()["bench"]
    db["big"].create_index("k")
    db["small"].create_index("k")
    rnd = random.Random(3)
    keys = list(range(n))
    rnd.shuffle(keys)
    for s in range(0, n, 5000):
        db["big"].insert_many([{"_id": k, "k": k, "pad": pad} for k in keys[s:s + 5000]],
                              ordered=False)
    db["small"].insert_many([{"_id": k, "k": k, "pad": pad} for k in range(lo, lo + c_n)],
                            ordered=False)
    print(f"chunk_load_docs={n + c_n} chunk_load_s={time.monotonic() - t0:.1f}", flush=True)
    (cb,) = [c for c in cl.chunks(big) if c["min"] == {"k": lo}]
    (cs,) = cl.chunks(small)
    res = {"small": [], "big": []}
    # alternately the collection holding only the chunk and the big one, --chunk-reps
    # times each (the chunk moves back and forth); medians
    for rep in range(a.chunk_reps):
        for name, ns, ch in (("small", small, cs), ("big", big, cb)):
            writes = None
            if a.chunk_writes:
                coll = db[ns.split(".", 1)[1]]

                def writes(_src, coll=coll, rep=rep):
                    # --chunk-writes documents of the chunk updated one by one (one
                    # oplog entry each), spread over the chunk
                    step = max(1, c_n // a.chunk_writes)
                    for k in range(lo, lo + c_n, step)[:a.chunk_writes]:
                        coll.update_one({"_id": k, "k": k}, {"$set": {"w": rep}})
            dt, m, ex, rt = timed_migration(cl, ns, ch["id"], writes)
            st = m["stats"]
            assert st["imported"] == c_n, st
            vs = st.get("verifySource", {})
            res[name].append((dt, st["importMS"], ex, rt))
            # per read: the import read the chunk (imported), the verification read
            # vs["read"] documents by _id, the cleanup deleted the chunk (deleted); the
            # shard's counter gives the total (the oplog read is not a planner query: it is
            # not in the counter, its entries are reported apart)
            print(f"chunk_{name}_rep={rep} chunk_{name}_collection_docs="
                  f"{n if name == 'big' else c_n} chunk_{name}_moved={st['imported']} "
                  f"chunk_{name}_wall_s={dt:.2f} chunk_{name}_import_ms={st['importMS']} "
                  f"chunk_{name}_source_examined={ex} chunk_{name}_source_returned={rt} "
                  f"chunk_{name}_verify_mode={vs.get('mode')} "
                  f"chunk_{name}_verify_oplog_entries={vs.get('oplogEntries')} "
                  f"chunk_{name}_verify_changed={vs.get('changed')} "
                  f"chunk_{name}_verify_read={vs.get('read')} "
                  f"chunk_{name}_verify_post_images={vs.get('postImages')} "
                  f"chunk_{name}_deleted={st['deleted']}",
                  flush=True)
    for name in res:
        res[name] = tuple(sorted(r[i] for r in res[name])[len(res[name]) // 2]
                          for i in range(4))
    (dt_b, im_b, ex_b, rt_b), (dt_s, im_s, ex_s, rt_s) = res["big"], res["small"]
    print(f"chunk_big_examined_over_collection={ex_b / n:.4f} "
          f"chunk_big_returned_over_collection={rt_b / n:.4f} "
          f"chunk_examined_big_over_small={ex_b / max(1, ex_s):.2f} "
          f"chunk_returned_big_over_small={rt_b / max(1, rt_s):.2f} "
          f"chunk_wall_big_over_small={dt_b / dt_s:.2f} "
          f"chunk_import_big_over_small={im_b / max(1, im_s):.2f}", flush=True)


if __name__ == "__main__":
    main()
