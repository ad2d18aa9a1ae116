"""The loop's kept read transaction now outlives the round of I/O callbacks that kept it
(src/shard/repl.c read_check_cb / read_release_cb, REPL_READ_KEEP_MS), and idle scan
statements are found by their shape (storage/scan.c scan_key) instead of their SQL text.
Beside test_shard_kept_reads.py and test_shard_kept_reads_attack.py, these check:

- multi-range cursors on the loop ($in on _id, both directions) and index scans on a
  worker, through collection renames, index drops and builds (new index tables), drops and
  recreations, each followed at once by reads on another connection while readers keep
  the loop's transaction open across rounds: every read answers the state the last
  acknowledged operation left (a statement of another table or shape, or a snapshot
  older than an acknowledged operation, would answer otherwise);
- a shard stopped (SIGTERM) while readers keep its loop's transaction open and its
  release timer armed exits cleanly (ASan build: no use-after-free of the timer or the
  connection, no leak), several times over the same data.
Neither depends on timing: the counter stripedb_shard_read_txns_taken_over_total must
move, else the first checked nothing of the change."""
import signal
import threading
import time

import pymongo
from pymongo.errors import AutoReconnect, ConnectionFailure

from conftest import assert_clean_exit, free_port, metric_counter as _counter, point_reads, \
    threads_running, wait_until

TAKEN = "stripedb_shard_read_txns_taken_over_total"


def test_multi_range_and_index_reads_through_ddl_see_the_last_acknowledged_state(shard):
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.rounds.bg.insert_many([{"_id": i} for i in range(50)])
    taken0 = _counter(proc, TAKEN)
    stop = threading.Event()
    problems = []

    def hammer(k):
        # point reads and two-value $in reads (a multi-range cursor) on the loop: the
        # loop's transaction stays kept across rounds, its scan statements idle
        with pymongo.MongoClient(uri, maxPoolSize=1) as c:
            n = 0
            while not stop.is_set():
                c.rounds.bg.find_one({"_id": (k * 7 + n) % 50})
                got = [d["_id"] for d in c.rounds.bg.find(
                    {"_id": {"$in": [n % 50, (n + 1) % 50]}}).sort("_id", -1)]
                want = sorted({n % 50, (n + 1) % 50}, reverse=True)
                if got != want:
                    problems.append(f"hammer {k}: $in read {got}, want {want}")
                c.rounds.a.find_one({"_id": 1})
                c.rounds.b.find_one({"_id": 1})
                n += 1

    with threads_running(stop, hammer, [(k,) for k in range(3)]), \
            pymongo.MongoClient(uri) as wc, pymongo.MongoClient(uri, maxPoolSize=1) as rc:
        db, rdb = wc.rounds, rc.rounds

        def check(what, got, want):
            if got != want:
                problems.append(f"{what}: read {got}, want {want}")

        for r in range(12):
            base = r * 100
            db.a.insert_many([{"_id": i, "x": base + i} for i in range(6)])
            # loop reads: one range, two ranges ascending and descending
            check(f"r{r} point", rdb.a.find_one({"_id": 4}), {"_id": 4, "x": base + 4})
            check(f"r{r} $in desc", [d["x"] for d in rdb.a.find(
                {"_id": {"$in": [1, 3]}}).sort("_id", -1)], [base + 3, base + 1])
            check(f"r{r} $in asc", [d["x"] for d in rdb.a.find(
                {"_id": {"$in": [3, 1]}}).sort("_id", 1)], [base + 1, base + 3])
            db.a.rename("b")
            check(f"r{r} renamed away", rdb.a.find_one({"_id": 1}), None)
            check(f"r{r} renamed away $in", list(rdb.a.find({"_id": {"$in": [1, 3]}})), [])
            check(f"r{r} renamed to", [d["x"] for d in rdb.b.find(
                {"_id": {"$in": [1, 3]}}).sort("_id", -1)], [base + 3, base + 1])
            # an index (a new index table each round): scans of it both ways, then of
            # the collection with the same bounds shape
            db.b.create_index("x")
            check(f"r{r} index desc", [d["_id"] for d in rdb.b.find(
                {"x": {"$gte": base + 2, "$lt": base + 5}}).sort("x", -1).hint("x_1")],
                [4, 3, 2])
            check(f"r{r} index asc", [d["_id"] for d in rdb.b.find(
                {"x": {"$gt": base + 1, "$lte": base + 4}}).sort("x", 1).hint("x_1")],
                [2, 3, 4])
            check(f"r{r} coll scan", [d["_id"] for d in rdb.b.find(
                {"_id": {"$gte": 2, "$lt": 5}}).sort("_id", -1).hint("_id_")], [4, 3, 2])
            db.b.update_one({"_id": 3}, {"$set": {"x": base - 50}})
            check(f"r{r} index after update", [d["_id"] for d in rdb.b.find(
                {"x": {"$gte": base + 2, "$lt": base + 5}}).sort("x", -1).hint("x_1")],
                [4, 2])
            check(f"r{r} point after update", rdb.b.find_one({"_id": 3}),
                  {"_id": 3, "x": base - 50})
            # the index dropped and another built on the same key, descending
            db.b.drop_index("x_1")
            db.b.create_index([("x", -1)])
            check(f"r{r} new index", [d["_id"] for d in rdb.b.find(
                {"x": {"$gte": base - 60, "$lt": base + 3}}).sort("x", -1).hint("x_-1")],
                [2, 1, 0, 3])
            db.b.drop()
            check(f"r{r} dropped", rdb.b.find_one({"_id": 1}), None)
            check(f"r{r} dropped $in", list(rdb.b.find({"_id": {"$in": [1, 3]}})), [])
            # recreated empty, then one document
            db.create_collection("b")
            check(f"r{r} recreated", list(rdb.b.find({"_id": {"$in": [1, 3]}})), [])
            db.b.insert_one({"_id": 3, "x": -r})
            check(f"r{r} recreated $in", list(rdb.b.find({"_id": {"$in": [1, 3]}})),
                  [{"_id": 3, "x": -r}])
            db.b.drop()
    assert not problems, problems[:10]
    assert _counter(proc, TAKEN) > taken0, "no read took a kept transaction over"


def test_a_shard_stopped_under_loop_reads_exits_cleanly(start_role, tmp_path):
    data = tmp_path / "shard"
    data.mkdir()
    port = free_port()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.stopping.c.insert_many([{"_id": i, "v": i} for i in range(100)])
    for rnd in range(3):
        taken0 = _counter(proc, TAKEN)
        stop = threading.Event()
        reads = [0]
        wrong = []

        def reader(k):
            c = pymongo.MongoClient(uri, maxPoolSize=1, serverSelectionTimeoutMS=500,
                                    socketTimeoutMS=5000)
            try:
                n = 0
                while not stop.is_set():
                    try:
                        d = c.stopping.c.find_one({"_id": (k * 13 + n) % 100})
                        if d is not None and d["v"] != (k * 13 + n) % 100:
                            wrong.append(d)
                        reads[0] += 1
                    except (AutoReconnect, ConnectionFailure, pymongo.errors.OperationFailure):
                        pass  # stopping
                    n += 1
            finally:
                c.close()

        with threads_running(stop, reader, [(k,) for k in range(4)]):
            wait_until(lambda: _counter(proc, TAKEN) > taken0 + 100, 60,
                       what="reads taking the kept transaction over")
            # stopped while its readers keep the loop's transaction kept
            assert_clean_exit(proc)
        assert not wrong, wrong[:5]
        proc.restart()
        proc.wait_healthy()
        with pymongo.MongoClient(uri) as c:
            assert c.stopping.c.count_documents({}) == 100
            c.stopping.c.update_one({"_id": rnd}, {"$set": {"v": rnd}})
    assert_clean_exit(proc)


def test_the_wal_restarts_under_continuous_loop_reads_and_writes(shard, tmp_path):
    """A kept read transaction holds back the WAL's restart while it is open: under point
    reads that never pause (each reader's next read comes in a later round, within the
    kept transaction's life) and large writes, the WAL must still restart, so that its file
    stays far smaller than what was written through it."""
    import os
    proc, port = shard
    wal = str(tmp_path / "shard" / "shard.db-wal")
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.walgrow.c.insert_many([{"_id": i, "v": 0} for i in range(20)])
    taken0 = _counter(proc, TAKEN)
    stop = threading.Event()

    pad = "p" * (64 * 1024)
    max_wal = 0
    written = 0
    with threads_running(stop, point_reads,
                         [(stop, port, "walgrow", "c", 20, k) for k in range(3)]), \
            pymongo.MongoClient(uri) as w:
        for i in range(1200):
            w.walgrow.c.update_one({"_id": i % 20}, {"$set": {"v": i, "pad": pad + str(i)}})
            written += len(pad)
            if i % 20 == 0:
                max_wal = max(max_wal, os.path.getsize(wal))
        taken = _counter(proc, TAKEN) - taken0
    max_wal = max(max_wal, os.path.getsize(wal))
    # each update writes its document and its oplog entry: > 2 * written through the WAL
    assert taken > 0, "no read took a kept transaction over"
    assert max_wal < written / 2, (max_wal, written)


def test_causal_reads_on_every_member_through_a_kill_a_snapshot_install_and_a_stepdown(
        start_role, tmp_path):
    """A history of w: majority writes, each checked at once on every other member by a
    read with afterClusterTime the write's operationTime (the member waits until it applied
    it, then answers on its loop, where readers keep transactions open across rounds):
    through a secondary SIGKILLed, restarted and installing a snapshot, then the primary
    stopped gracefully (it hands leadership over) and restarted as a secondary. Every read
    of a member that answers must see the write it was sent after."""
    from test_shard_replset import primary_index, start_set, wait_converged
    procs, wires, uri = start_set(start_role, tmp_path,
                                  extra=["--raft-snapshot-threshold=64"])
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_many([{"_id": i, "v": 0} for i in range(20)])
    stop = threading.Event()
    problems = []
    checked = [0] * 3
    down = set()

    readers = [pymongo.MongoClient(f"mongodb://127.0.0.1:{w}/?directConnection=true",
                                   maxPoolSize=1, serverSelectionTimeoutMS=1000,
                                   socketTimeoutMS=20000) for w in wires]
    acked = [0]

    def write_and_check(wc, n):
        """n w: majority writes; after each, a causal read on every other member."""
        for _ in range(n):
            i = acked[0] + 1
            with wc.start_session(causal_consistency=True) as s:
                wc.app.c.update_one({"_id": 0}, {"$set": {"v": i}}, session=s)
                wc.app.c.insert_one({"_id": 1000 + i}, session=s)
                t, ct = s.operation_time, s.cluster_time
            acked[0] = i
            for m in range(3):
                if m in down:
                    continue
                try:
                    # the read's session starts where the write's ended: afterClusterTime
                    # is its operationTime, and its $clusterTime is gossiped along
                    with readers[m].start_session(causal_consistency=True) as rs:
                        rs.advance_cluster_time(ct)
                        rs.advance_operation_time(t)
                        docs = {d["_id"]: d for d in readers[m].app.c.find(
                            {"_id": {"$in": [0, 1000 + i]}}, session=rs, max_time_ms=15000)}
                except (AutoReconnect, ConnectionFailure):
                    continue  # the member is stopping or starting: it answered nothing
                except pymongo.errors.OperationFailure as e:
                    if e.code in (11600, 11602, 91, 189, 10107, 13435):
                        continue  # shutting down / not yet serving
                    problems.append(f"member {m} after write {i}: {e!r}")
                    continue
                checked[m] += 1
                if 0 not in docs or docs[0]["v"] < i:
                    problems.append(f"member {m} after write {i}: _id 0 is {docs.get(0)}")
                if 1000 + i not in docs:
                    problems.append(f"member {m} after write {i}: insert {1000 + i} missing")

    with threads_running(stop, point_reads,
                         [(stop, wires[i], "app", "c", 20, k, 7, True)
                          for i in range(3) for k in range(2)]):
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, w="majority",
                                 retryWrites=True) as wc:
            write_and_check(wc, 40)
            p = primary_index(wires)
            victim = (p + 1) % 3
            down.add(victim)
            procs[victim].signal(signal.SIGKILL)
            procs[victim].p.wait(timeout=10)
            write_and_check(wc, 200)   # the primary compacts its log past the victim
            procs[victim].restart()
            wait_until(lambda: "installed a snapshot from another member"
                       in procs[victim].tail(1 << 20), 60,
                       what="the killed secondary installing a snapshot")
            down.discard(victim)
            write_and_check(wc, 60)
            # the primary stopped gracefully: it hands leadership to another member
            p = primary_index(wires)
            down.add(p)
            procs[p].signal(signal.SIGTERM)
            procs[p].p.wait(timeout=30)
            write_and_check(wc, 60)
            assert primary_index(wires) not in (None, p)
            procs[p].restart()
            procs[p].wait_healthy()
            down.discard(p)
            write_and_check(wc, 60)
    for r in readers:
        r.close()
    assert not problems, problems[:10]
    assert all(n > 50 for n in checked), checked
    assert sum(_counter(procs[i], TAKEN) for i in range(3)) > 0, "no read took one over"
    docs, _ = wait_converged(wires, timeout=120)
    ids = {d["_id"] for d in docs}
    assert all(1000 + i in ids for i in range(1, acked[0] + 1))


def _register_reads(stop, uri, tag, out):
    """Read the register (lin.r, _id 0) on one connection to uri until stop is set, as a
    point read on the loop and, every third read, a three-value $in on a worker; append
    (start ns, end ns, value, tag + (n,)) for each to out at the end."""
    mine = []
    with pymongo.MongoClient(uri, maxPoolSize=1) as c:
        coll = c.lin.r
        n = 0
        while not stop.is_set():
            t0 = time.monotonic_ns()
            if n % 3 == 2:
                docs = list(coll.find({"_id": {"$in": [0, 1, 2]}}))
                v = [d["v"] for d in docs if d["_id"] == 0][0]
            else:
                v = coll.find_one({"_id": 0})["v"]
            mine.append((t0, time.monotonic_ns(), v, tag + (n,)))
            n += 1
    out.extend(mine)


def _real_time_violations(history):
    """history: [(start_ns, end_ns, value, who)] of reads of a register that only grows.
    Linearizable reads: a read that began after another ended never returns less. Returns
    the violating pairs (at most 10)."""
    out = []
    by_end = sorted(history, key=lambda h: h[1])
    j = 0
    best = None  # the read of the highest value among those ended so far
    for h in sorted(history, key=lambda h: h[0]):
        while j < len(by_end) and by_end[j][1] < h[0]:
            if best is None or by_end[j][2] > best[2]:
                best = by_end[j]
            j += 1
        if best is not None and h[2] < best[2]:
            out.append((best, h))
            if len(out) >= 10:
                break
    return out


def test_reads_on_the_loop_and_on_workers_are_linearizable_across_connections(shard):
    """Point reads on the loop (kept transactions taken over across rounds) and reads on
    workers (three _id values: not a point read) of a register that w: 1 updates only
    increase, on many connections: a read that began after another ended (in this
    process's monotonic clock) never returns a smaller value, and none returns less than
    what was acknowledged before it began."""
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c:
        c.lin.r.insert_many([{"_id": i, "v": 0} for i in range(3)])
    taken0 = _counter(proc, TAKEN)
    stop = threading.Event()
    history = []
    acked = []  # (ack_ns, value)
    problems = []

    with threads_running(stop, _register_reads,
                         [(stop, uri, (k,), history) for k in range(5)]):
        with pymongo.MongoClient(uri, maxPoolSize=1) as w:
            for i in range(1, 2001):
                w.lin.r.update_one({"_id": 0}, {"$set": {"v": i}})
                acked.append((time.monotonic_ns(), i))
                if i % 7 == 0:
                    # other writes between: the epoch moves without the register
                    w.lin.r.update_one({"_id": 1}, {"$inc": {"v": 1}})
    for s_ns, e_ns, v, who in history:
        # the newest value acknowledged before the read began
        lo = 0
        for a_ns, a_v in acked:
            if a_ns < s_ns:
                lo = a_v
            else:
                break
        if v < lo:
            problems.append(f"read {who} returned {v} after {lo} was acknowledged")
            if len(problems) > 10:
                break
    assert not problems, problems
    bad = _real_time_violations(history)
    assert not bad, bad
    assert len(history) > 1000, len(history)
    assert _counter(proc, TAKEN) > taken0, "no read took a kept transaction over"


def test_a_secondarys_reads_are_monotonic_across_its_connections(start_role, tmp_path):
    """On a secondary (its loop applies the primary's writes on the connection its point
    reads keep transactions on), under w: 1 writes on the primary: a read that began after
    another read of the same member ended never returns a smaller value of a register
    that only grows, across connections (the member's applied state only grows)."""
    from test_shard_replset import primary_index, start_set
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.lin.r.insert_many([{"_id": i, "v": 0} for i in range(3)])
    p = primary_index(wires)
    sec = [i for i in range(3) if i != p]
    for m in sec:
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{wires[m]}/?directConnection=true",
                                 maxPoolSize=1) as c:
            wait_until(lambda: c.lin.r.count_documents({}) == 3, 30,
                       what="the secondary applying the first writes")
    taken0 = [_counter(procs[i], TAKEN) for i in sec]
    stop = threading.Event()
    history = {i: [] for i in sec}

    with threads_running(stop, _register_reads,
                         [(stop, f"mongodb://127.0.0.1:{wires[m]}/?directConnection=true",
                           (m, k), history[m]) for m in sec for k in range(3)]):
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{wires[p]}/?directConnection=true",
                                 maxPoolSize=1, retryWrites=False) as w:
            for i in range(1, 801):
                w.lin.r.update_one({"_id": 0}, {"$set": {"v": i}})
                if i % 5 == 0:
                    w.lin.r.update_one({"_id": 1}, {"$inc": {"v": 1}})
    for m in sec:
        bad = _real_time_violations(history[m])
        assert not bad, bad
        assert len(history[m]) > 300, len(history[m])
        assert max(h[2] for h in history[m]) > 0, "the secondary never saw a write"
    moved = [_counter(procs[i], TAKEN) - t0 for i, t0 in zip(sec, taken0)]
    assert sum(moved) > 0, f"no read took a kept transaction over: {moved}"
