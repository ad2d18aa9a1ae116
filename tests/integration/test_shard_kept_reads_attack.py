"""Adversarial checks of the loop's kept read transaction (issue #19, storage/store.h
sdb_store_keep_reads, src/shard/repl.c read_check_cb), beside test_shard_kept_reads.py:

- a shard that stops being read holds no SQLite snapshot: an outside connection's
  wal_checkpoint(TRUNCATE) succeeds (a kept read transaction left open while the loop
  waits would make it busy for as long as the shard stays idle, and the WAL could not
  restart);
- on a 3-member set, reads on a secondary (the loop's point reads, on the apply's
  connection) under w: majority writes on the primary and a snapshot install on that
  secondary (it was stopped while the primary compacted its log): every reader connection
  sees monotonic values, a read on the primary sent after an acknowledgement sees it, and
  every acknowledged write is on every member at the end. The counter
  stripedb_shard_read_txns_taken_over_total must move on the secondary, else the test
  checked nothing of the change."""
import os
import signal
import sqlite3
import threading
import time

import pymongo
from pymongo.errors import AutoReconnect, ConnectionFailure, OperationFailure

from conftest import http_get, wait_until
from test_shard_replset import direct, primary_index, start_set, wait_converged


def _counter(proc, name):
    st, body = http_get(proc.http_port, "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


TAKEN = "stripedb_shard_read_txns_taken_over_total"


def _truncate_checkpoint(path):
    """(busy, wal frames, frames checkpointed) of PRAGMA wal_checkpoint(TRUNCATE) run from
    an outside connection (it waits up to 0.5 s for readers)."""
    db = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        return tuple(db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
    finally:
        db.close()


def test_an_idle_shard_holds_no_read_snapshot(shard, tmp_path):
    proc, port = shard
    path = str(tmp_path / "shard" / "shard.db")
    assert os.path.exists(path)
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.idle.c.insert_many([{"_id": i, "v": 0} for i in range(100)])
    taken0 = _counter(proc, TAKEN)
    stop = threading.Event()

    def reader(k):
        with pymongo.MongoClient(uri, maxPoolSize=1) as c:
            n = 0
            while not stop.is_set():
                c.idle.c.find_one({"_id": (k * 7 + n) % 100})
                n += 1

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    with pymongo.MongoClient(uri) as w:
        for i in range(40):
            w.idle.c.update_one({"_id": i}, {"$set": {"v": i}})
            time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join()
    assert _counter(proc, TAKEN) > taken0, "no read took a kept transaction over"
    # the shard is idle now (its clients closed): nothing may hold a snapshot. The
    # shard's own checkpoint thread may be running: retry for a while.
    last = []

    def truncated():
        last[:] = [_truncate_checkpoint(path)]
        return last[0][0] == 0

    try:
        wait_until(truncated, 10, interval=0.2, what="a TRUNCATE checkpoint of an idle shard")
    except TimeoutError:
        raise AssertionError(f"an idle shard still holds a read snapshot: {last}")
    assert os.path.getsize(path + "-wal") == 0
    # and the shard goes on answering from the truncated WAL
    with pymongo.MongoClient(uri) as c:
        assert c.idle.c.find_one({"_id": 39}) == {"_id": 39, "v": 39}
        c.idle.c.update_one({"_id": 39}, {"$set": {"v": -1}})
        assert c.idle.c.find_one({"_id": 39}) == {"_id": 39, "v": -1}


def test_secondary_reads_stay_monotonic_through_writes_and_a_snapshot_install(
        start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path,
                                  extra=["--raft-snapshot-threshold=64"])
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 0, "v": 0})
    p = primary_index(wires)
    assert p is not None
    sec = [i for i in range(3) if i != p]
    victim = sec[0]
    other = sec[1]
    taken0 = _counter(procs[other], TAKEN)

    stop = threading.Event()
    problems = []
    acked_v = [0]           # the newest counter value acknowledged (w: majority)
    acked_ids = []          # inserted _ids acknowledged
    lock = threading.Lock()
    reads = [0]

    def secondary_reader(k, port):
        # one connection: the values it sees never go back; an _id once seen stays
        last = 0
        seen = set()
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                maxPoolSize=1, serverSelectionTimeoutMS=3000,
                                socketTimeoutMS=10000)
        try:
            n = 0
            while not stop.is_set():
                try:
                    d = c.app.c.find_one({"_id": 0})
                    if d is not None:
                        if d["v"] < last:
                            problems.append(f"reader {k}@{port}: v went back {last} -> {d['v']}")
                        last = max(last, d["v"])
                    with lock:
                        ids = acked_ids[-50:]
                    if ids:
                        i = ids[n % len(ids)]
                        got = c.app.c.find_one({"_id": i}) is not None
                        if got:
                            seen.add(i)
                        elif i in seen:
                            problems.append(f"reader {k}@{port}: _id {i} seen, then gone")
                    for i in list(seen)[:3]:
                        if c.app.c.find_one({"_id": i}) is None:
                            problems.append(f"reader {k}@{port}: _id {i} seen, then gone")
                    n += 1
                    reads[0] += 1
                except (AutoReconnect, ConnectionFailure):
                    # the member was killed: a new connection promises nothing of the
                    # old one's reads
                    last = 0
                    seen = set()
                    time.sleep(0.05)
        finally:
            c.close()

    def writer():
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{wires[p]}/?directConnection=true",
                                retryWrites=False, serverSelectionTimeoutMS=5000,
                                socketTimeoutMS=10000, w="majority")
        chk = pymongo.MongoClient(f"mongodb://127.0.0.1:{wires[p]}/?directConnection=true",
                                  maxPoolSize=1, serverSelectionTimeoutMS=5000)
        pad = "x" * 1000
        try:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    c.app.c.update_one({"_id": 0}, {"$set": {"v": i}})
                    acked_v[0] = i
                    c.app.c.insert_one({"_id": 1000 + i, "v": i, "pad": pad})
                    with lock:
                        acked_ids.append(1000 + i)
                except (AutoReconnect, ConnectionFailure, OperationFailure) as e:
                    problems.append(f"write {i} failed: {e!r}")
                    return
                # sent after both acknowledgements: the primary's loop read sees them
                d = chk.app.c.find_one({"_id": 0})
                if d is None or d["v"] < i:
                    problems.append(f"primary read after ack of v={i} saw {d}")
                if chk.app.c.find_one({"_id": 1000 + i}) is None:
                    problems.append(f"primary read after ack of insert {1000 + i} missed it")
        finally:
            c.close()
            chk.close()

    readers = [threading.Thread(target=secondary_reader, args=(k, wires[s]))
               for k in range(3) for s in sec]
    for t in readers:
        t.start()
    wt = threading.Thread(target=writer)
    wt.start()
    try:
        wait_until(lambda: len(acked_ids) > 100 or problems, 60, what="writes")
        # kill one secondary while the other keeps the majority: the primary compacts its
        # log past it, so once restarted it installs a snapshot while its readers read
        procs[victim].signal(signal.SIGKILL)
        procs[victim].p.wait(timeout=10)
        before = len(acked_ids)
        wait_until(lambda: len(acked_ids) > before + 300 or problems, 120,
                   what="writes while a secondary is down")
        procs[victim].restart()
        wait_until(lambda: "installed a snapshot from another member"
                   in procs[victim].tail(1 << 20) or problems, 60,
                   what="the stopped secondary installing a snapshot")
        before = len(acked_ids)
        wait_until(lambda: len(acked_ids) > before + 100 or problems, 60,
                   what="writes after the install")
    finally:
        stop.set()
        wt.join(timeout=60)
        for t in readers:
            t.join(timeout=60)
    assert not problems, problems[:10]
    assert "installed a snapshot from another member" in procs[victim].tail(1 << 20)
    docs, _ = wait_converged(wires, timeout=120)
    ids = {d["_id"] for d in docs}
    lost = [i for i in acked_ids if i not in ids]
    assert not lost, f"{len(lost)} acknowledged inserts lost: {lost[:20]}"
    assert [d for d in docs if d["_id"] == 0][0]["v"] >= acked_v[0]
    # reads on both secondaries took kept transactions over (the restarted one's counter
    # began at its restart): else the test checked nothing of the change
    assert _counter(procs[other], TAKEN) > taken0, "no read took a kept transaction over"
    assert _counter(procs[victim], TAKEN) > 0, "no read took a kept transaction over"
