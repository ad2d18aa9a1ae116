"""Integration tests of the embedded shard (`stripedb --role=shard`, issue #4) through pymongo:
durability across kill -9, version gating under concurrency, the oplog (shape, origin tag,
tailable awaitData cursors), point-in-time reads, the planner's explain, duplicate-key errors
and cursors.
"""
import threading
import time

import pymongo
import pytest
from bson import Timestamp, encode as bson_encode
from pymongo.errors import OperationFailure, DuplicateKeyError

from conftest import free_port, http_get, wait_until


def client_for(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=10000, retryWrites=False)


@pytest.fixture
def shard_with_dir(start_role, tmp_path):
    """A shard with a known data dir and wire port: (proc, port, data_dir)."""
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    return p, port, data


def check_ok(db):
    r = db.command("stripedbCheck", 1)
    assert r["problems"] == [], r
    assert r["nProblems"] == 0


# ----------------------------------------------------------------------------- crash safety

def test_kill9_during_acknowledged_inserts_loses_nothing(shard_with_dir):
    proc, port, _ = shard_with_dir
    c = client_for(port)
    db = c.crash
    db.c.create_index("k")
    acked = []
    stop = threading.Event()
    errors = []

    def writer(wid):
        wc = client_for(port)
        i = 0
        while not stop.is_set():
            doc_id = f"w{wid}-{i}"
            try:
                wc.crash.c.insert_one({"_id": doc_id, "k": i, "pad": "x" * 200})
                acked.append(doc_id)  # list.append is atomic under the GIL
            except pymongo.errors.PyMongoError as e:
                errors.append(e)
                return
            i += 1
        wc.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 400, timeout=60, what="400 acknowledged inserts")
    proc.p.kill()  # SIGKILL while the writers are still writing
    proc.p.wait(timeout=10)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    snapshot = list(acked)
    assert len(snapshot) >= 400
    proc.log.close()
    proc.restart().wait_healthy()
    c2 = client_for(port)
    have = {d["_id"] for d in c2.crash.c.find({}, {"_id": 1})}
    missing = [a for a in snapshot if a not in have]
    assert missing == []
    # every stored document came from a writer (acknowledged or in flight at the kill)
    assert all(h.startswith("w") for h in have)
    check_ok(c2.crash)
    # the oplog holds exactly one insert per stored document
    n_ins = len(list(c2.local["oplog.rs"].find({"op": "i", "ns": "crash.c"})))
    assert n_ins == len(have)
    # the index agrees with the collection: an indexed query finds every document
    assert c2.crash.c.count_documents({"k": {"$gte": 0}}) == len(have)


def test_overlong_field_paths_are_refused_and_survive_a_restart(shard_with_dir):
    """A field path of more than 200 components is refused (MongoDB's Overflow, 15,
    "FieldPath is too long") by projections, expressions and pipeline updates, before
    anything recurses once per component: a 20,000-component path used to overflow the
    stack, and through a pipeline update reached the replicated log, so the shard crashed
    again at every restart. The shard answers, restarts and keeps its data."""
    proc, port, _ = shard_with_dir
    db = client_for(port).lp
    db.c.insert_one({"_id": 1, "a": 1})
    ok_path = ".".join(["a"] * 200)
    assert list(db.c.find({}, {ok_path: 1, "_id": 0})) == [{}]
    long_path = ".".join(["a"] * 20000)
    attempts = [
        lambda: list(db.c.find({}, {long_path: {"$literal": 1}})),
        lambda: list(db.c.find({}, {".".join(["a"] * 201): 1})),
        lambda: list(db.c.aggregate([{"$addFields": {long_path: 1}}])),
        lambda: list(db.c.aggregate([{"$project": {"x": "$" + long_path}}])),
        lambda: list(db.c.aggregate([{"$unset": long_path}])),
        lambda: db.c.update_one({}, [{"$set": {long_path: 1}}]),
    ]
    for attempt in attempts:
        with pytest.raises(OperationFailure) as e:
            attempt()
        assert e.value.code == 15 and "FieldPath is too long" in str(e.value)
    proc.stop()
    proc.log.close()
    proc.restart().wait_healthy()
    assert list(client_for(port).lp.c.find()) == [{"_id": 1, "a": 1}]


def test_oplog_ts_increases_across_restart(shard_with_dir):
    proc, port, _ = shard_with_dir
    c = client_for(port)
    c.t.c.insert_many([{"_id": i} for i in range(5)])
    last = c.local["oplog.rs"].find().sort("$natural", -1).limit(1)[0]["ts"]
    assert proc.stop() == 0
    proc.restart().wait_healthy()
    c2 = client_for(port)
    c2.t.c.insert_one({"_id": 99})
    new = c2.local["oplog.rs"].find().sort("$natural", -1).limit(1)[0]
    assert new["o"] == {"_id": 99}
    assert new["ts"] > last


# ----------------------------------------------------------------------------- version gating

def test_stale_config_reply_and_forward_only_bump(shard):
    _, port = shard
    db = client_for(port).g
    r = db.command("stripedbSetVersion", 1, chunk="ch1", token=5)
    assert r["token"] == 5
    r = db.command("stripedbSetVersion", 1, chunk="ch1", token=3)
    assert r["token"] == 5  # never backwards
    with pytest.raises(OperationFailure) as ei:
        db.command("insert", "c", documents=[{"_id": 1}],
                   **{"$stripedbVersion": {"chunk": "ch1", "token": 4}})
    d = ei.value.details
    assert d["code"] == 13388
    assert d["codeName"] == "StaleConfig"
    assert d["chunk"] == "ch1"
    assert d["storedToken"] == 5
    assert db.c.count_documents({}) == 0
    r = db.command("insert", "c", documents=[{"_id": 1}],
                   **{"$stripedbVersion": {"chunk": "ch1", "token": 5}})
    assert r["n"] == 1
    # reads are gated too
    with pytest.raises(OperationFailure) as ei:
        db.command("find", "c", filter={}, **{"$stripedbVersion": {"chunk": "ch1", "token": 1}})
    assert ei.value.code == 13388


def test_version_gating_under_concurrency(shard):
    """Writers race a token bump; once the bump has returned, no old-token write lands."""
    _, port = shard
    admin = client_for(port)
    rounds = 12
    for rnd in range(rounds):
        chunk = f"chunk-{rnd}"
        admin.vg.command("stripedbSetVersion", 1, chunk=chunk, token=1)
        acked, stale, other = [], [], []
        go = threading.Event()
        stop = threading.Event()

        def writer(wid):
            wc = client_for(port)
            i = 0
            go.wait()
            while not stop.is_set():
                _id = f"{rnd}-{wid}-{i}"
                i += 1
                try:
                    wc.vg.command("insert", "c", documents=[{"_id": _id, "chunk": chunk}],
                                  **{"$stripedbVersion": {"chunk": chunk, "token": 1}})
                    acked.append(_id)
                except OperationFailure as e:
                    (stale if e.code == 13388 else other).append((_id, e.code))
            wc.close()

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        go.set()
        wait_until(lambda: len(acked) >= 20, timeout=30, what="writes before the bump")
        r = admin.vg.command("stripedbSetVersion", 1, chunk=chunk, token=2)
        assert r["token"] == 2
        after_bump = {d["_id"] for d in admin.vg.c.find({"chunk": chunk}, {"_id": 1})}
        wait_until(lambda: len(stale) >= 20, timeout=30, what="stale rejections")
        stop.set()
        for t in threads:
            t.join(timeout=30)
        final = {d["_id"] for d in admin.vg.c.find({"chunk": chunk}, {"_id": 1})}
        assert other == []
        assert final == after_bump, "a write with the old token landed after the bump"
        assert set(acked) == final
        assert not (set(s for s, _ in stale) & final)


# ----------------------------------------------------------------------------- oplog

def test_oplog_entries_shape_and_origin(shard):
    _, port = shard
    c = client_for(port)
    db = c.o
    db.command("insert", "c", documents=[{"_id": 1, "a": 1}],
               **{"$stripedbOrigin": "mig-42"})
    db.c.update_one({"_id": 1}, {"$set": {"a": 2}})
    db.c.delete_one({"_id": 1})
    ops = list(c.local["oplog.rs"].find({"ns": "o.c"}))
    assert [o["op"] for o in ops] == ["i", "u", "d"]
    assert ops[0]["o"] == {"_id": 1, "a": 1}
    assert ops[0]["origin"] == "mig-42"
    assert "origin" not in ops[1]
    assert ops[1]["o"] == {"_id": 1, "a": 2}
    assert ops[1]["o2"] == {"_id": 1}
    assert ops[2]["o"] == {"_id": 1}
    assert isinstance(ops[0]["ts"], Timestamp)
    assert ops[0]["ts"] < ops[1]["ts"] < ops[2]["ts"]
    create = c.local["oplog.rs"].find_one({"op": "c", "ns": "o.$cmd"})
    assert create["o"] == {"create": "c"}


def test_tailable_await_oplog_cursor(shard):
    _, port = shard
    c = client_for(port)
    c.tail.c.insert_one({"_id": "before"})
    start = c.local["oplog.rs"].find().sort("$natural", -1).limit(1)[0]["ts"]
    cur = c.local["oplog.rs"].find({"ts": {"$gt": start}},
                                   cursor_type=pymongo.CursorType.TAILABLE_AWAIT
                                   ).max_await_time_ms(200)

    def produce():
        w = client_for(port)
        for i in range(5):
            w.tail.c.insert_one({"_id": i})
        w.close()

    t = threading.Thread(target=produce)
    t.start()
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 5 and time.monotonic() < deadline and cur.alive:
        try:
            got.append(cur.next())
        except StopIteration:
            continue
    t.join()
    assert [g["o"]["_id"] for g in got] == [0, 1, 2, 3, 4]
    assert all(g["op"] == "i" and g["ns"] == "tail.c" for g in got)
    assert all(g["ts"] > start for g in got)
    cur.close()


def test_waiting_tailers_do_not_hold_workers(shard):
    """awaitData getMores with nothing to return are parked, not blocking one of the
    shard's worker threads: more tailers than workers, waiting up to 10 minutes each,
    leave every other command running, and one insert wakes them all with its entry."""
    import concurrent.futures
    import os
    import re

    from conftest import http_get
    proc, port = shard
    http = proc.http_port

    def parked(hp):
        _, body = http_get(hp, "/metrics")
        m = re.search(rb'^stripedb_shard_parked_getmores\{role="shard"\} (\d+)$', body, re.M)
        return int(m.group(1)) if m else 0
    c = client_for(port)
    c.park.c.insert_one({"_id": "start"})
    start = c.local["oplog.rs"].find().sort("$natural", -1).limit(1)[0]["ts"]
    # src/shard/pool.c shard_pool_workers(): twice the CPUs this process may use, 4 to 32
    workers = max(4, min(32, 2 * len(os.sched_getaffinity(0))))
    ntail = workers + 4
    tailers = []
    for _ in range(ntail):
        t = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                socketTimeoutMS=120000)
        r = t.local.command("find", "oplog.rs", filter={"ns": "park.c", "ts": {"$gt": start}},
                            tailable=True, awaitData=True)
        assert r["cursor"]["firstBatch"] == []
        tailers.append((t, r["cursor"]["id"]))

    def wait_next(tc):
        t, cid = tc
        g = t.local.command("getMore", cid, collection="oplog.rs", maxTimeMS=600000)
        return [e["o"]["_id"] for e in g["cursor"]["nextBatch"]]

    pool = concurrent.futures.ThreadPoolExecutor(len(tailers))
    futs = [pool.submit(wait_next, tc) for tc in tailers]
    # every tailer's getMore is parked on the shard before the commands below
    wait_until(lambda: parked(http) == ntail, 30, what=f"{ntail} parked getMores")
    w = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            socketTimeoutMS=60000)
    # with the tailers parked, reads, writes and index builds still run (before the fix
    # they queued behind the workers blocked for 10 minutes: this socket timeout fired)
    for i in range(20):
        w.park.other.insert_one({"_id": i})
    assert w.park.other.count_documents({}) == 20
    w.park.other.create_index("x")
    # the writes to park.other woke the tailers, which found nothing of park.c and parked
    # again
    wait_until(lambda: parked(http) == ntail, 30, what=f"{ntail} parked getMores again")
    assert not any(f.done() for f in futs)
    w.park.c.insert_one({"_id": "wake"})
    assert [f.result(timeout=60) for f in futs] == [["wake"]] * ntail
    assert parked(http) == 0
    pool.shutdown()
    for t, cid in tailers:
        t.local.command("killCursors", "oplog.rs", cursors=[cid])
        t.close()
    w.close()


def test_reserved_namespaces_and_dollar_fields_are_refused(shard):
    _, port = shard
    c = client_for(port)
    c.rz.c.insert_one({"_id": 1, "a": [1, 2]})
    cases = [
        # the oplog is read with find only: a count would silently see nothing
        (lambda: c.local.command("count", "oplog.rs"), 115, "CommandNotSupported"),
        (lambda: c.local.command("aggregate", "oplog.rs", pipeline=[], cursor={}), 115,
         "CommandNotSupported"),
        (lambda: c.local["oplog.rs"].insert_one({"x": 1}), 73, "InvalidNamespace"),
        (lambda: c.rz["system.x"].insert_one({"x": 1}), 73, "InvalidNamespace"),
        (lambda: c.rz.command("create", "system.y"), 73, "InvalidNamespace"),
        (lambda: c.rz.c.update_one({"_id": 1}, {"$set": {"$x": 1}}), 52,
         "DollarPrefixedFieldName"),
        (lambda: c.rz.c.update_one({"_id": 1, "b": 1}, {"$rename": {"_x": "a.5"}},
                                   upsert=False), None, None),
    ]
    c.rz.c.update_one({"_id": 1}, {"$set": {"m": 1}})
    for fn, code, name in cases:
        if code is None:
            fn()  # a missing source renames nothing
            continue
        with pytest.raises(OperationFailure) as ei:
            fn()
        assert (ei.value.code, ei.value.details.get("codeName")) == (code, name)
    with pytest.raises(OperationFailure) as ei:
        c.rz.c.update_one({"_id": 1}, {"$rename": {"m": "a.5"}})
    assert ei.value.code == 2
    assert "destination field cannot be an array element" in str(ei.value)
    assert c.rz.c.find_one({"_id": 1}) == {"_id": 1, "a": [1, 2], "m": 1}
    assert "system.x" not in c.rz.list_collection_names()


def test_server_status(shard):
    proc, port = shard
    c = client_for(port)
    for i in range(3):
        c.ss.c.insert_one({"_id": i})
    assert len(list(c.ss.c.find({}))) == 3
    assert c.ss.c.find_one({"_id": 1}) == {"_id": 1}
    st = c.admin.command("serverStatus")
    assert st["ok"] == 1.0
    assert st["process"] == "mongod"
    assert st["pid"] == proc.p.pid
    assert st["host"].endswith(f":{port}")
    assert (st["opcounters"]["insert"], st["opcounters"]["query"]) == (3, 2)
    assert st["opcounters"]["command"] >= 1  # hello, serverStatus itself is counted after
    assert st["connections"]["current"] >= 1
    assert st["uptimeMillis"] >= 0 and st["mem"]["bits"] == 64
    assert st["mem"]["resident"] > 0 and st["mem"]["virtual"] >= st["mem"]["resident"]


def test_parked_tailer_is_answered_during_the_quiesce(start_role, tmp_path):
    """SIGTERM with a quiesce period: a parked awaitData getMore is answered with an empty
    batch by the end of the quiesce (not an error, not its 60 s deadline), and the
    process then exits 0."""
    import concurrent.futures
    import signal
    port = free_port()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={tmp_path}",
                       "--shutdown-quiesce-ms=1500", "--shutdown-timeout-ms=20000"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            socketTimeoutMS=120000)
    c.q.c.insert_one({"_id": 1})
    r = c.local.command("find", "oplog.rs", filter={"ns": "q.other"}, tailable=True,
                        awaitData=True)
    cid = r["cursor"]["id"]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(lambda: c.local.command("getMore", cid, collection="oplog.rs",
                                              maxTimeMS=60000))
    wait_until(lambda: b'stripedb_shard_parked_getmores{role="shard"} 1' in
               http_get(proc.http_port, "/metrics")[1], 20, what="the parked getMore")
    proc.signal(signal.SIGTERM)
    assert fut.result(timeout=30)["cursor"]["nextBatch"] == []
    assert proc.p.wait(timeout=30) == 0
    pool.shutdown()
    c.close()


def test_point_in_time_read_with_oplog_position(shard):
    _, port = shard
    c = client_for(port)
    c.pit.c.insert_many([{"_id": i, "v": i} for i in range(10)])
    r = c.pit.command("stripedbSnapshot", "c", filter={"v": {"$lt": 5}}, batchSize=2)
    at = r["cursor"]["atOplogTs"]
    first = r["cursor"]["firstBatch"]
    assert [d["_id"] for d in first] == [0, 1]
    # writes after the snapshot are not in it, and they are exactly the oplog after `at`
    c.pit.c.insert_one({"_id": 100, "v": 1})
    c.pit.c.delete_one({"_id": 0})
    rest = []
    cid = r["cursor"]["id"]
    while cid:
        g = c.pit.command("getMore", cid, collection="c")
        rest.extend(g["cursor"]["nextBatch"])
        cid = g["cursor"]["id"]
    assert [d["_id"] for d in first + rest] == [0, 1, 2, 3, 4]
    later = list(c.local["oplog.rs"].find({"ts": {"$gt": at}}))
    assert [(o["op"], o["o"]["_id"]) for o in later] == [("i", 100), ("d", 0)]


# ----------------------------------------------------------------------------- planner

def test_explain_ixscan_and_collscan(shard):
    _, port = shard
    db = client_for(port).ex
    db.c.insert_many([{"_id": i, "a": i % 10, "b": i} for i in range(100)])
    db.c.create_index("a")
    e = db.command("explain", {"find": "c", "filter": {"a": 3}}, verbosity="executionStats")
    wp = e["queryPlanner"]["winningPlan"]
    assert wp["stage"] == "IXSCAN"
    assert wp["indexName"] == "a_1"
    st = e["executionStats"]
    assert st["nReturned"] == 10
    assert st["totalKeysExamined"] == 10
    assert st["totalDocsExamined"] == 10
    e = db.command("explain", {"find": "c", "filter": {"b": 3}}, verbosity="executionStats")
    assert e["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    assert e["executionStats"]["totalDocsExamined"] == 100
    assert e["executionStats"]["nReturned"] == 1
    # range and $in on the index
    e = db.command("explain", {"find": "c", "filter": {"a": {"$in": [1, 2]}}},
                   verbosity="executionStats")
    assert e["queryPlanner"]["winningPlan"]["indexName"] == "a_1"
    assert e["executionStats"]["totalDocsExamined"] == 20
    e = db.command("explain", {"find": "c", "filter": {"a": {"$gte": 8}}},
                   verbosity="executionStats")
    assert e["executionStats"]["totalKeysExamined"] == 20
    assert e["executionStats"]["nReturned"] == 20
    # _id equality uses the primary key
    e = db.command("explain", {"find": "c", "filter": {"_id": 42}}, verbosity="executionStats")
    assert e["queryPlanner"]["winningPlan"]["indexName"] == "_id_"
    assert e["executionStats"]["totalDocsExamined"] == 1
    # hint forces the plan; an unknown hint is an error
    e = db.command("explain", {"find": "c", "filter": {"a": 3}, "hint": {"$natural": 1}},
                   verbosity="executionStats")
    assert e["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    with pytest.raises(OperationFailure) as ei:
        db.command("find", "c", filter={}, hint="nope_1")
    assert ei.value.code == 2
    # sort by the index: no blocking sort, results in order
    e = db.command("explain", {"find": "c", "filter": {}, "sort": {"a": -1}},
                   verbosity="queryPlanner")
    assert e["queryPlanner"]["winningPlan"]["stage"] == "IXSCAN"
    assert e["queryPlanner"]["winningPlan"]["sortStage"] is False
    docs = list(db.c.find({"a": {"$gte": 7}}).sort("a", -1).limit(3))
    assert [d["a"] for d in docs] == [9, 9, 9]
    # an update's explain follows its statement's hint, also when the statement is larger
    # than a document's inline storage (its copy must outlive the query: ASan)
    big = {"b": {"$nin": [f"not-a-value-{i:04d}" for i in range(40)]}, "a": 3}
    for verb, key, stmt in (("update", "updates", {"q": big, "u": {"$set": {"z": 1}},
                                                   "hint": {"$natural": 1}}),
                            ("delete", "deletes", {"q": big, "limit": 0,
                                                   "hint": {"$natural": 1}})):
        e = db.command("explain", {verb: "c", key: [stmt]}, verbosity="executionStats")
        assert e["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN", verb
        assert e["executionStats"]["nReturned"] == 10, verb
    # a query that fails under executionStats fails its explain
    with pytest.raises(OperationFailure) as ei:
        db.command("explain", {"find": "c", "filter": {"$expr": {"$divide": [1, "$a"]}}},
                   verbosity="executionStats")
    assert ei.value.code == 16608


def test_descending_compound_index_ranges(shard):
    _, port = shard
    db = client_for(port).cx
    db.c.insert_many([{"_id": i, "a": i % 5, "b": i} for i in range(50)])
    db.c.create_index([("a", -1), ("b", 1)])
    got = [d["_id"] for d in db.c.find({"a": {"$gt": 1, "$lte": 3}}).sort([("a", -1), ("b", 1)])]
    want = sorted([i for i in range(50) if 1 < i % 5 <= 3], key=lambda i: (-(i % 5), i))
    assert got == want
    e = db.command("explain", {"find": "c", "filter": {"a": 2}}, verbosity="executionStats")
    assert e["queryPlanner"]["winningPlan"]["indexName"] == "a_-1_b_1"
    assert e["executionStats"]["totalKeysExamined"] == 10


# ----------------------------------------------------------------------------- errors, cursors

def test_duplicate_key_on_a_multikey_index_names_the_clashing_element(shard):
    _, port = shard
    db = client_for(port).dupm
    db.t.create_index("tags", unique=True)
    db.t.insert_one({"_id": 1, "tags": ["a", "b"]})
    with pytest.raises(DuplicateKeyError) as ei:
        db.t.insert_one({"_id": 2, "tags": ["c", "b"]})
    assert ei.value.details["keyValue"] == {"tags": "b"}
    assert ei.value.details["errmsg"].endswith('dup key: { tags: "b" }')
    # compound, one descending field, the array in a sub-document path
    db.u.create_index([("k", 1), ("x.tags", -1)], unique=True)
    db.u.insert_one({"_id": 1, "k": 7, "x": {"tags": [1, 2, 3]}})
    with pytest.raises(DuplicateKeyError) as ei:
        db.u.insert_one({"_id": 2, "k": 7, "x": {"tags": [9, 3]}})
    assert ei.value.details["keyValue"] == {"k": 7, "x.tags": 3}
    # a missing field is indexed as null
    db.u.insert_one({"_id": 3, "x": {"tags": 5}})
    with pytest.raises(DuplicateKeyError) as ei:
        db.u.insert_one({"_id": 4, "x": {"tags": [4, 5]}})
    assert ei.value.details["keyValue"] == {"k": None, "x.tags": 5}


def test_duplicate_key_error_names_index_and_key(shard):
    _, port = shard
    db = client_for(port).dup
    db.c.create_index("a", unique=True)
    db.c.insert_one({"_id": 1, "a": 1})
    with pytest.raises(DuplicateKeyError) as ei:
        db.c.insert_one({"_id": 2, "a": 1})
    d = ei.value.details
    assert d["code"] == 11000
    assert d["errmsg"] == ("E11000 duplicate key error collection: dup.c index: a_1 "
                           "dup key: { a: 1 }")
    assert d["keyPattern"] == {"a": 1}
    assert d["keyValue"] == {"a": 1}
    # unordered batch: the other documents still go in, with per-item writeErrors
    r = db.command("insert", "c", documents=[{"_id": 3, "a": 3}, {"_id": 4, "a": 1},
                                             {"_id": 1, "a": 9}, {"_id": 5, "a": 5}],
                   ordered=False)
    assert r["n"] == 2
    assert [(e["index"], e["code"]) for e in r["writeErrors"]] == [(1, 11000), (2, 11000)]
    assert "index: _id_ dup key: { _id: 1 }" in r["writeErrors"][1]["errmsg"]
    assert sorted(d["_id"] for d in db.c.find()) == [1, 3, 5]
    # an update that would duplicate fails and changes nothing
    with pytest.raises(DuplicateKeyError):
        db.c.update_one({"_id": 3}, {"$set": {"a": 1}})
    assert db.c.find_one({"_id": 3})["a"] == 3
    check_ok(db)


def test_getmore_batches_and_killcursors(shard):
    _, port = shard
    db = client_for(port).cur
    db.c.insert_many([{"_id": i} for i in range(250)])
    r = db.command("find", "c", filter={}, batchSize=100)
    assert len(r["cursor"]["firstBatch"]) == 100
    cid = r["cursor"]["id"]
    assert cid != 0
    g = db.command("getMore", cid, collection="c", batchSize=100)
    assert [d["_id"] for d in g["cursor"]["nextBatch"]] == list(range(100, 200))
    k = db.command("killCursors", "c", cursors=[cid, 12345])
    assert k["cursorsKilled"] == [cid]
    assert k["cursorsNotFound"] == [12345]
    with pytest.raises(OperationFailure) as ei:
        db.command("getMore", cid, collection="c")
    assert ei.value.code == 43
    r = db.command("find", "c", filter={}, batchSize=10, singleBatch=True)
    assert r["cursor"]["id"] == 0
    assert len(r["cursor"]["firstBatch"]) == 10


def test_catalog_commands(shard):
    _, port = shard
    c = client_for(port)
    db = c.cat
    db.command("create", "a")
    with pytest.raises(OperationFailure) as ei:
        db.command("create", "a")
    assert ei.value.code == 48
    db.b.insert_one({"x": 1})
    assert sorted(db.list_collection_names()) == ["a", "b"]
    assert "cat" in c.list_database_names()
    db.b.create_index([("x", 1)], name="x_1")
    assert [i["name"] for i in db.b.list_indexes()] == ["_id_", "x_1"]
    db.b.drop_index("x_1")
    assert [i["name"] for i in db.b.list_indexes()] == ["_id_"]
    st = db.command("collStats", "b")
    assert st["count"] == 1
    assert st["size"] > 0
    assert db.command("dbStats")["objects"] == 1
    db.drop_collection("a")
    assert db.list_collection_names() == ["b"]
    c.drop_database("cat")
    assert "cat" not in c.list_database_names()


def test_oplog_capped_by_size(start_role, tmp_path):
    port = free_port()
    data = tmp_path / "capped"
    data.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"],
               env={"STRIPEDB_OPLOG_MAX_BYTES": "20000"})
    c = client_for(port)
    for i in range(300):
        c.cap.c.insert_one({"_id": i, "pad": "p" * 100})
    entries = list(c.local["oplog.rs"].find())
    assert 0 < len(entries) < 300
    assert entries[-1]["o"] == {"_id": 299, "pad": "p" * 100}
    assert sum(len(bson_encode(e)) for e in entries) <= 20000 + 1000
    assert c.cap.c.count_documents({}) == 300
    check_ok(c.cap)


def test_write_limits(shard):
    _, port = shard
    db = client_for(port).lim
    deep = {"x": 1}
    for _ in range(120):
        deep = {"d": deep}
    r = db.command("insert", "c", documents=[{"_id": 1, "d": deep}, {"_id": 2}], ordered=False)
    assert r["n"] == 1
    assert [(e["index"], e["code"]) for e in r["writeErrors"]] == [(0, 15)]
    with pytest.raises(OperationFailure) as ei:
        db.command("insert", "c", documents=[{"_id": 3}], **{"$stripedbVersion": {"chunk": 1}})
    assert ei.value.code == 2


def test_find_and_modify_and_update_forms(shard):
    _, port = shard
    db = client_for(port).fam
    db.c.insert_many([{"_id": 1, "a": 5, "g": [{"x": 1}, {"x": 7}]},
                      {"_id": 2, "a": 3, "g": []}, {"_id": 3, "a": 9, "g": []}])
    # sort picks the document; new returns the post-image; fields projects it
    r = db.command("findAndModify", "c", query={"a": {"$gte": 4}}, sort={"a": -1},
                   update={"$inc": {"a": 1}}, new=True, fields={"a": 1})
    assert r["value"] == {"_id": 3, "a": 10}
    assert r["lastErrorObject"] == {"n": 1, "updatedExisting": True}
    r = db.command("findAndModify", "c", query={"_id": 2}, remove=True)
    assert r["value"] == {"_id": 2, "a": 3, "g": []}
    assert r["lastErrorObject"]["n"] == 1
    r = db.command("findAndModify", "c", query={"_id": 50}, update={"$set": {"a": 0}},
                   upsert=True, new=True)
    assert r["value"] == {"_id": 50, "a": 0}
    assert r["lastErrorObject"]["upserted"] == 50
    r = db.command("findAndModify", "c", query={"_id": 51}, update={"$set": {"a": 0}})
    assert r["value"] is None
    assert r["lastErrorObject"] == {"n": 0, "updatedExisting": False}
    with pytest.raises(OperationFailure) as ei:
        db.command("findAndModify", "c", query={}, remove=True, update={"$set": {"a": 1}})
    assert ei.value.code == 9
    # arrayFilters, replacement, multi
    r = db.command("update", "c", updates=[{"q": {"_id": 1}, "u": {"$set": {"g.$[e].x": 0}},
                                            "arrayFilters": [{"e.x": {"$gt": 5}}]}])
    assert (r["n"], r["nModified"]) == (1, 1)
    assert db.c.find_one({"_id": 1})["g"] == [{"x": 1}, {"x": 0}]
    r = db.command("update", "c", updates=[{"q": {"_id": 3}, "u": {"b": 1}}])
    assert db.c.find_one({"_id": 3}) == {"_id": 3, "b": 1}
    r = db.command("update", "c", updates=[{"q": {}, "u": {"$set": {"m": True}}, "multi": True}])
    assert (r["n"], r["nModified"]) == (3, 3)
    r = db.command("update", "c", updates=[{"q": {}, "u": {"z": 1}, "multi": True}])
    assert r["writeErrors"][0]["code"] == 9
    r = db.command("update", "c", updates=[{"q": {"_id": 1}, "u": {"$set": {"_id": 2}}}])
    assert r["writeErrors"][0]["code"] == 66
    # delete limit 1 and 0
    db.d.insert_many([{"_id": i, "k": i % 2} for i in range(6)])
    assert db.command("delete", "d", deletes=[{"q": {"k": 0}, "limit": 1}])["n"] == 1
    assert db.command("delete", "d", deletes=[{"q": {"k": 0}, "limit": 0}])["n"] == 2
    assert sorted(d["_id"] for d in db.d.find()) == [1, 3, 5]
    check_ok(db)


def test_cursor_reads_one_snapshot_across_getmores(shard):
    _, port = shard
    db = client_for(port).snap
    db.c.insert_many([{"_id": i} for i in range(100)])
    r = db.command("find", "c", filter={}, batchSize=10)
    cid = r["cursor"]["id"]
    got = [d["_id"] for d in r["cursor"]["firstBatch"]]
    db.c.delete_many({})  # committed while the cursor is open
    db.c.insert_one({"_id": 1000})
    while cid:
        g = db.command("getMore", cid, collection="c", batchSize=25)
        got.extend(d["_id"] for d in g["cursor"]["nextBatch"])
        cid = g["cursor"]["id"]
    assert got == list(range(100))
    assert [d["_id"] for d in db.c.find()] == [1000]
    # a cursor drained exactly by its first batch is closed at once
    r = db.command("find", "c", filter={}, batchSize=1)
    assert r["cursor"]["id"] == 0


def test_oplog_newest_first_reads_in_chunks(shard):
    _, port = shard
    c = client_for(port)
    c.nf.c.insert_many([{"_id": i} for i in range(2500)])
    last = list(c.local["oplog.rs"].find().sort("$natural", -1).limit(2))
    assert [e["o"]["_id"] for e in last] == [2499, 2498]
    # a filter that only matches far back in the oplog (beyond the first chunks)
    old = list(c.local["oplog.rs"].find({"o._id": 5}).sort("$natural", -1).limit(1))
    assert [(e["op"], e["o"]) for e in old] == [("i", {"_id": 5})]
    n = len(list(c.local["oplog.rs"].find({"ns": "nf.c"}).sort("$natural", -1)))
    assert n == 2500


def test_tailable_catch_up_in_batches_without_gaps(shard):
    _, port = shard
    c = client_for(port)
    c.cu.c.insert_one({"_id": "start"})
    start = c.local["oplog.rs"].find().sort("$natural", -1).limit(1)[0]["ts"]
    c.cu.c.insert_many([{"_id": i} for i in range(300)])
    r = c.local.command("find", "oplog.rs", filter={"ts": {"$gt": start}}, tailable=True,
                        awaitData=True, batchSize=50)
    got = [e["o"]["_id"] for e in r["cursor"]["firstBatch"]]
    assert got == list(range(50))
    cid = r["cursor"]["id"]
    assert cid != 0
    for _ in range(20):
        if len(got) >= 301:
            break
        if len(got) == 300:
            c.cu.c.insert_one({"_id": 300})
        g = c.local.command("getMore", cid, collection="oplog.rs", batchSize=100,
                            maxTimeMS=2000)
        got.extend(e["o"]["_id"] for e in g["cursor"]["nextBatch"])
        assert g["cursor"]["id"] == cid  # a tailable cursor stays open
    assert got == list(range(301))
    c.local.command("killCursors", "oplog.rs", cursors=[cid])


def test_plain_find_over_many_small_documents_stays_under_16_mib_per_batch(shard):
    # 800k documents of ~24 bytes: the array keys and type bytes alone add ~7 MB to a
    # batch, which once pushed a getMore reply past maxBsonObjectSize (10334)
    import pymongo
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    coll = c.big.small
    n = 800_000
    for start in range(0, n, 100_000):
        coll.insert_many([{"_id": i} for i in range(start, start + 100_000)], ordered=False)
    seen = 0
    for _ in coll.find({}, {"_id": 1}):
        seen += 1
    assert seen == n
    c.close()


@pytest.mark.parametrize("token", [float("inf"), float("nan"), 1e300, 1.5, "7"])
def test_version_tokens_must_be_integers(shard, token):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        c.admin.command({"stripedbSetVersion": 1, "chunk": "c-bad", "token": token})
    assert e.value.code == 2
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        c.db.command({"insert": "t", "documents": [{"_id": 1}],
                      "$stripedbVersion": {"chunk": "c-bad", "token": token}})
    assert e.value.code == 2
    assert c.db.t.count_documents({}) == 0
    # an integral double is an integer token
    r = c.admin.command({"stripedbSetVersion": 1, "chunk": "c-ok", "token": 3.0})
    assert r["token"] == 3
    c.close()


def test_writes_and_index_builds_on_a_view_are_refused(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.vw
    db.g.insert_many([{"_id": 1, "k": "a"}, {"_id": 2, "k": "b"}])
    db.create_collection("gv", viewOn="g", pipeline=[{"$match": {"k": "a"}}])
    for op in (lambda: db.gv.insert_one({"a": 1}),
               lambda: db.gv.update_many({}, {"$set": {"zz": 1}}),
               lambda: db.gv.delete_many({}),
               lambda: db.gv.create_index("k")):
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            op()
        assert e.value.code == 166
    assert list(db.gv.find()) == [{"_id": 1, "k": "a"}]
    assert db.g.count_documents({}) == 2
    c.close()


def test_document_faults_carry_mongodb_codes(shard):
    """Errors as codes (issue #24): the store reports why a document was refused as a code
    (sdb_store_write_code), not as a message the shard matches: an array, regex or undefined
    _id is InvalidIdField (53), parallel arrays in a compound index key
    CannotIndexParallelArrays (171), a duplicate DuplicateKey (11000); nothing is applied."""
    _, port = shard
    db = client_for(port).codes
    db.c.create_index([("a", 1), ("b", 1)])
    db.c.insert_one({"_id": 1})
    cases = [({"_id": [1, 2]}, 53), ({"_id": 2, "a": [1, 2], "b": [3, 4]}, 171),
             ({"_id": 1}, 11000)]
    for doc, code in cases:
        r = db.command("insert", "c", documents=[doc], check=False)
        assert r["ok"] == 1.0 and r["n"] == 0, r
        assert [(e["index"], e["code"]) for e in r["writeErrors"]] == [(0, code)], r
    from bson.regex import Regex
    r = db.command("insert", "c", documents=[{"_id": Regex("x")}], check=False)
    assert [e["code"] for e in r["writeErrors"]] == [53], r
    # an update that would make parallel arrays: 171 as a writeError too
    db.c.insert_one({"_id": 3, "a": [1, 2]})
    r = db.command("update", "c", updates=[{"q": {"_id": 3}, "u": {"$set": {"b": [5, 6]}}}],
                   check=False)
    assert [e["code"] for e in r["writeErrors"]] == [171], r
    assert sorted(d["_id"] for d in db.c.find()) == [1, 3]
    assert db.c.find_one({"_id": 3}) == {"_id": 3, "a": [1, 2]}
