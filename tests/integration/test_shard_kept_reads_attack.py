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

from conftest import metric_counter as _counter, point_reads, threads_running, wait_until
from test_shard_replset import primary_index, start_set, wait_converged


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

    with threads_running(stop, point_reads,
                         [(stop, port, "idle", "c", 100, k, 7) for k in range(6)]), \
            pymongo.MongoClient(uri) as w:
        for i in range(40):
            w.idle.c.update_one({"_id": i}, {"$set": {"v": i}})
            time.sleep(0.02)
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


def test_causal_reads_on_secondaries_see_the_session_writes(start_role, tmp_path):
    """A causally consistent session writes on the primary and reads on secondaries
    (afterClusterTime: the secondary waits until it applied the write, then answers on its
    loop, where other readers keep transactions open): every read sees the session's own
    writes, and an insert or delete just acknowledged."""
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_many([{"_id": i, "v": 0} for i in range(50)])
    p = primary_index(wires)
    sec = [i for i in range(3) if i != p]
    taken0 = [_counter(procs[i], TAKEN) for i in sec]
    stop = threading.Event()
    problems = []

    with threads_running(stop, point_reads,
                         [(stop, wires[s], "app", "c", 50, k, 11) for s in sec for k in range(2)]):
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000,
                                 readPreference="secondary") as c:
            coll = c.app.c
            with c.start_session(causal_consistency=True) as s:
                for i in range(1, 301):
                    coll.update_one({"_id": 0}, {"$set": {"v": i}}, session=s)
                    d = coll.find_one({"_id": 0}, session=s)
                    if d is None or d["v"] != i:
                        problems.append(f"after update v={i} the session read {d}")
                    coll.insert_one({"_id": 1000 + i}, session=s)
                    if coll.find_one({"_id": 1000 + i}, session=s) is None:
                        problems.append(f"after insert {1000 + i} the session missed it")
                    if i % 10 == 0:
                        coll.delete_one({"_id": 1000 + i - 5}, session=s)
                        if coll.find_one({"_id": 1000 + i - 5}, session=s) is not None:
                            problems.append(f"after delete of {1000 + i - 5} still read it")
    assert not problems, problems[:10]
    moved = [_counter(procs[i], TAKEN) - t0 for i, t0 in zip(sec, taken0)]
    assert sum(moved) > 0, f"no read took a kept transaction over: {moved}"


def test_causal_reads_on_secondaries_through_ddl(start_role, tmp_path):
    """Drops, creates, renames and index builds in a causally consistent session, each
    followed by point reads on a secondary (the loop's reads, beside readers keeping
    transactions open there): every read answers the catalog the session last wrote."""
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 1, "r": -1})
        c.app.other.insert_many([{"_id": i} for i in range(20)])
    p = primary_index(wires)
    sec = [i for i in range(3) if i != p]
    stop = threading.Event()
    problems = []

    def hammer(port, k):
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                 maxPoolSize=1) as c:
            n = 0
            while not stop.is_set():
                try:
                    c.app.other.find_one({"_id": (k + n) % 20})
                    c.app.c.find_one({"_id": 1})
                    c.app.d.find_one({"_id": 1})
                except OperationFailure as e:
                    problems.append(f"hammer read failed: {e!r}")
                n += 1

    with threads_running(stop, hammer, [(wires[s], k) for s in sec for k in range(2)]):
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000,
                                 readPreference="secondary") as c:
            db = c.app
            with c.start_session(causal_consistency=True) as s:
                for r in range(25):
                    db.c.replace_one({"_id": 1}, {"_id": 1, "r": r}, upsert=True, session=s)
                    got = db.c.find_one({"_id": 1}, session=s)
                    if got != {"_id": 1, "r": r}:
                        problems.append(f"round {r}: after the write read {got}")
                    db.c.create_index("r", session=s)
                    if db.c.find_one({"_id": 1}, session=s) != {"_id": 1, "r": r}:
                        problems.append(f"round {r}: after createIndex read changed")
                    db.c.rename("d", session=s)
                    if db.c.find_one({"_id": 1}, session=s) is not None:
                        problems.append(f"round {r}: renamed-away collection still read")
                    if db.d.find_one({"_id": 1}, session=s) != {"_id": 1, "r": r}:
                        problems.append(f"round {r}: renamed collection not read")
                    db.d.drop(session=s)
                    if db.d.find_one({"_id": 1}, session=s) is not None:
                        problems.append(f"round {r}: dropped collection still read")
                    db.create_collection("c", session=s)
                    if db.c.find_one({"_id": 1}, session=s) is not None:
                        problems.append(f"round {r}: recreated collection has a document")
    assert not problems, problems[:10]
    wait_converged(wires)


def test_reads_through_a_primary_stopped_and_replaced(start_role, tmp_path):
    """Retryable $inc writes (w: majority) through the set while its primary is stopped
    (SIGSTOP) long enough for an election, then resumed as a secondary; linearizable reads
    after each acknowledgement see at least that count, and readers on direct connections
    to every member (the loop's point reads) never see the count go back on one
    connection."""
    from pymongo.read_concern import ReadConcern
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 0, "n": 0})
    stop = threading.Event()
    problems = []
    acked = [0]
    attempted = [0]

    def reader(port, k):
        last = 0
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                maxPoolSize=1, serverSelectionTimeoutMS=2000,
                                socketTimeoutMS=3000)
        try:
            while not stop.is_set():
                try:
                    d = c.app.c.find_one({"_id": 0})
                    if d is None:
                        # a secondary that has not applied the first insert yet; after a
                        # read of it on this connection, its absence is a lost document
                        if last > 0:
                            problems.append(f"reader {k}@{port}: the document vanished")
                        continue
                    if d["n"] < last:
                        problems.append(f"reader {k}@{port}: n went back {last} -> {d['n']}")
                    last = max(last, d["n"])
                except (AutoReconnect, ConnectionFailure):
                    # a timed-out request may leave the connection: a new one promises
                    # nothing of the old one's reads
                    last = 0
                    time.sleep(0.05)
        finally:
            c.close()

    def writer():
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, w="majority",
                                 retryWrites=True, socketTimeoutMS=5000) as c:
            coll = c.app.c
            lin = coll.with_options(read_concern=ReadConcern("linearizable"))
            while not stop.is_set():
                attempted[0] += 1
                try:
                    coll.update_one({"_id": 0}, {"$inc": {"n": 1}})
                except (AutoReconnect, ConnectionFailure, OperationFailure):
                    return  # unknown outcome: stop counting exactly
                acked[0] += 1
                try:
                    d = lin.find_one({"_id": 0})
                except (AutoReconnect, ConnectionFailure, OperationFailure):
                    continue
                if d["n"] < acked[0]:
                    problems.append(f"linearizable read after {acked[0]} acks saw {d['n']}")

    rs = [threading.Thread(target=reader, args=(w, k)) for w in wires for k in range(2)]
    wt = threading.Thread(target=writer)
    for t in rs + [wt]:
        t.start()
    try:
        wait_until(lambda: acked[0] > 100 or problems, 60, what="writes")
        p = primary_index(wires)
        assert p is not None
        procs[p].pause()
        try:
            wait_until(lambda: primary_index(wires) not in (None, p), 30,
                       what="another member elected")
            before = acked[0]
            wait_until(lambda: acked[0] > before + 100 or not wt.is_alive() or problems, 60,
                       what="writes on the new primary")
        finally:
            procs[p].signal(signal.SIGCONT)
        before = acked[0]
        wait_until(lambda: acked[0] > before + 100 or not wt.is_alive() or problems, 60,
                   what="writes after the old primary resumed")
    finally:
        stop.set()
        wt.join(timeout=60)
        for t in rs:
            t.join(timeout=60)
    assert not problems, problems[:10]
    docs, _ = wait_converged(wires)
    n = docs[0]["n"]
    assert acked[0] <= n <= attempted[0], (acked[0], n, attempted[0])
    print(f"acknowledged {acked[0]} of {attempted[0]}, final n={n}")


def test_transaction_commits_are_atomic_and_seen_by_loop_reads(start_role, tmp_path):
    """Transfers between two documents in multi-document transactions (run tentatively on
    the apply's connection, then applied at commit) while point readers of both documents
    ($in of two _ids: one read, one snapshot, on the loop) keep transactions open: every
    read sees the sum unchanged, and a read after a commit is acknowledged sees it."""
    from conftest import start_one_member_set
    proc, port = start_one_member_set(start_role, str(tmp_path / "one"))
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.app.acct.insert_many([{"_id": 1, "b": 100}, {"_id": 2, "b": 0}])
    taken0 = _counter(proc, TAKEN)
    stop = threading.Event()
    problems = []

    def reader(k):
        with pymongo.MongoClient(uri, maxPoolSize=1) as c:
            while not stop.is_set():
                docs = list(c.app.acct.find({"_id": {"$in": [1, 2]}}))
                if len(docs) != 2 or sum(d["b"] for d in docs) != 100:
                    problems.append(f"reader {k}: {docs}")

    with threads_running(stop, reader, [(k,) for k in range(4)]):
        with pymongo.MongoClient(uri) as c, pymongo.MongoClient(uri, maxPoolSize=1) as chk:
            coll, ccoll = c.app.acct, chk.app.acct
            for i in range(1, 101):
                with c.start_session() as s:
                    with s.start_transaction():
                        coll.update_one({"_id": 1}, {"$inc": {"b": -1}}, session=s)
                        coll.update_one({"_id": 2}, {"$inc": {"b": 1}}, session=s)
                d = ccoll.find_one({"_id": 2})
                if d["b"] != i:
                    problems.append(f"after commit {i} a read saw b={d['b']}")
    assert not problems, problems[:10]
    assert _counter(proc, TAKEN) > taken0, "no read took a kept transaction over"
