"""Change stream getMores that wait hold no proxy worker and no shard connection (issue #20,
src/proxy/cswait.c): a getMore with nothing to return is parked; a per-shard watcher wakes
it when a shard's oplog moves. Checked here: more idle streams than the per-shard pool (64)
do not slow point finds through the same proxy; an idle getMore answers after its await,
not earlier and not much later; a write is returned long before the await ends (the
watcher's wake-up); killCursors of a parked getMore's cursor answers it at once; a
second getMore on a cursor whose getMore is parked is CursorInUse. A write wakes only the
parked getMores it can concern (stripedb_proxy_cs_wakes_total): not streams on another
collection or database; database and deployment streams by any of theirs; a drop or rename
the stream of its collection; a shard restart loses nothing; an idle stream's position moves
on past writes elsewhere; a parked getMore whose client closed is dropped at once."""
import threading
import time

import pytest
from pymongo.errors import OperationFailure

from test_change_streams_proxy import make_cluster, tok


def _pct(lat, q):
    lat = sorted(lat)
    return lat[min(len(lat) - 1, (len(lat) * q) // 100)]


def _finds(coll, n):
    lat = []
    for i in range(n):
        t0 = time.monotonic()
        coll.find_one({"_id": i % 50})
        lat.append(time.monotonic() - t0)
    return lat


# serial: compares find latencies with and without 100 parked streams (a 5x bound on the
# 99th percentile): other tests' load on the machine skews one sample and not the other.
@pytest.mark.serial
def test_idle_streams_beyond_the_pool_do_not_slow_finds(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    stop = threading.Event()
    try:
        coll = cl.proxy_client().app.c
        coll.insert_many([{"_id": i, "k": i * 4} for i in range(50)])
        base = _finds(coll, 200)
        sc = cl.proxy_client(maxPoolSize=120, socketTimeoutMS=60000)
        errors = []
        opened = threading.Semaphore(0)

        def loop():
            try:
                with sc.app.c.watch(max_await_time_ms=1000) as cs:
                    opened.release()
                    while not stop.is_set():
                        cs.try_next()
            except Exception as e:  # noqa: BLE001 - asserted below
                errors.append(repr(e))
                opened.release()

        ts = [threading.Thread(target=loop, daemon=True) for _ in range(100)]
        for t in ts:
            t.start()
        for _ in ts:
            opened.acquire()
        time.sleep(2)  # every stream is in its getMore loop
        loaded = _finds(coll, 200)
        stop.set()
        for t in ts:
            t.join(timeout=10)
        assert errors == []
        # before parking: 100 streams held 100 connections per shard for 1 s each, over
        # the pool of 64, and finds took 0.1-0.9 s
        assert _pct(loaded, 99) < max(0.1, 5 * _pct(base, 99)), (_pct(base, 99),
                                                                   _pct(loaded, 99))
    finally:
        stop.set()
        cl.close()


# serial: an idle getMore must return within 0.5 s after its await: a loaded machine delays
# the reply by more than that.
@pytest.mark.serial
def test_await_and_wake(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        db = cli.app
        r = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})
        cid = r["cursor"]["id"]
        pbrt = r["cursor"]["postBatchResumeToken"]
        # an idle getMore: empty, after its await (not earlier, not much later), with the
        # position
        for await_ms in (300, 800):
            t0 = time.monotonic()
            g = db.command({"getMore": cid, "collection": "c", "maxTimeMS": await_ms})
            took = time.monotonic() - t0
            assert g["cursor"]["nextBatch"] == []
            assert g["cursor"]["id"] == cid
            assert "postBatchResumeToken" in g["cursor"]
            assert await_ms / 1000 - 0.005 <= took < await_ms / 1000 + 0.5, took
        # a write while the getMore is parked: returned long before its 8 s await ends
        def gm(res):
            t0 = time.monotonic()
            try:
                res["g"] = db.command({"getMore": cid, "collection": "c", "maxTimeMS": 8000})
            except OperationFailure as e:
                res["code"] = e.code
            res["took"] = time.monotonic() - t0

        res = {}
        t = threading.Thread(target=gm, args=(res,))
        t.start()
        time.sleep(0.5)
        cl.proxy_client().app.c.insert_one({"_id": 1, "k": 150})  # shard-b
        t.join(timeout=20)
        assert [e["documentKey"]["_id"] for e in res["g"]["cursor"]["nextBatch"]] == [1]
        assert res["took"] < 3, res["took"]
        assert pbrt != res["g"]["cursor"]["postBatchResumeToken"]
        # a second getMore while one is parked: CursorInUse
        res = {}
        t = threading.Thread(target=gm, args=(res,))
        t.start()
        time.sleep(0.5)
        with pytest.raises(OperationFailure) as ei:
            cl.proxy_client().app.command({"getMore": cid, "collection": "c",
                                           "maxTimeMS": 100})
        assert ei.value.code == 292
        # killCursors of the parked getMore's cursor: it is answered at once (43), the
        # cursor is gone
        k = cl.proxy_client().app.command({"killCursors": "c", "cursors": [cid]})
        assert k["cursorsKilled"] == [cid]
        t.join(timeout=20)
        assert res.get("code") == 43, res
        assert res["took"] < 3, res["took"]
        # a client that gives up (socket timeout) while its getMore is parked, and one
        # still waiting when the proxy stops: the stop answers both, nothing leaks
        # (conftest fails a process whose LeakSanitizer reports at exit, or that logs an
        # unanswered request at shutdown)
        with cl.proxy_client(socketTimeoutMS=300).app.c.watch(
                max_await_time_ms=30000) as cs1:
            _quiet(cs1.try_next)  # times out (pymongo may resume once, and time out)
        waiting = cl.proxy_client(socketTimeoutMS=60000).app.c.watch(
            max_await_time_ms=30000)
        t = threading.Thread(target=lambda: _quiet(waiting.try_next), daemon=True)
        t.start()
        time.sleep(0.5)
    finally:
        cl.close()


def _quiet(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - the proxy stops under it
        pass


def test_a_stalled_shard_is_skipped_then_merged_again(start_role, tmp_path):
    """A shard that stops answering (SIGSTOP): once its watcher's call runs past its
    deadline (await + 10 s) the streams' rounds leave it out (it holds the merge back), so
    a getMore answers after its await instead of holding a worker for the 10 s round
    deadline each time; when the shard answers again the held-back event and the shard's
    own come, in token order, nothing lost (event 1 may come during the stop when the
    stopped shard's last position was already past it)."""
    import signal
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client(socketTimeoutMS=60000).app.c
        cs = coll.watch(max_await_time_ms=500)
        coll.insert_one({"_id": 0, "k": 1})
        assert [e["documentKey"]["_id"] for e in _drain(cs, 1)] == [0]
        cl.shard_procs["shard-b"].signal(signal.SIGSTOP)
        try:
            coll.insert_one({"_id": 1, "k": 2})  # shard-a: held back by shard-b
            got, fast = [], 0
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and fast < 3:
                t0 = time.monotonic()
                ev = cs.try_next()
                if ev is not None:
                    got.append(ev)
                fast = fast + 1 if time.monotonic() - t0 < 2 else 0
            assert fast >= 3, "getMores still wait for the stopped shard's round deadline"
            # event 1 comes only if shard-b's last position was already past it (its
            # clock): otherwise shard-b holds it back
        finally:
            cl.shard_procs["shard-b"].signal(signal.SIGCONT)
        coll.insert_one({"_id": 2, "k": 150})  # shard-b
        evs = got + _drain(cs, 2 - len(got), timeout=60)
        cs.close()
        assert [e["documentKey"]["_id"] for e in evs] == [1, 2]
    finally:
        cl.close()


def _drain(cs, n, timeout=30):
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(out) < n:
        ev = cs.try_next()
        if ev is not None:
            out.append(ev)
    return out


# ---------- which parked getMores a write wakes (src/proxy/cswait.c, moves) ----------

def _metric(cl, name):
    """The value of metric name (no labels) on proxy 0."""
    from conftest import http_get
    st, body = http_get(cl.proxy_procs[0].http_port, "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}")


def _wakes(cl):
    """stripedb_proxy_cs_wakes_total of proxy 0: parked getMores woken by a watcher's move."""
    return _metric(cl, "stripedb_proxy_cs_wakes_total")


def _open(db, coll=None, **spec):
    """A raw change stream cursor on db.coll (coll None: the database; db admin with
    allChangesForCluster: the deployment). Returns (cursor id, getMore's collection)."""
    r = db.command({"aggregate": coll if coll else 1,
                    "pipeline": [{"$changeStream": spec}], "cursor": {}})
    assert r["cursor"]["firstBatch"] == []
    return r["cursor"]["id"], coll if coll else "$cmd.aggregate"


def _get_more_bg(db, cur, await_ms):
    """A getMore of cur = (id, collection) on its own thread; returns (thread, result dict:
    "g" the reply or "err" the exception, "took" seconds)."""
    res = {}

    def run():
        t0 = time.monotonic()
        try:
            res["g"] = db.command({"getMore": cur[0], "collection": cur[1],
                                   "maxTimeMS": await_ms})
        except Exception as e:  # noqa: BLE001 - asserted by the caller
            res["err"] = e
        res["took"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, res


def _settle(cl, wait=2.0):
    """Let the watchers start (at the first park) and their first answers (which move
    everything) wake and re-park every getMore: after it the wake count is steady."""
    deadline = time.monotonic() + 15
    prev = _wakes(cl)
    time.sleep(wait)
    while time.monotonic() < deadline:
        now = _wakes(cl)
        if now == prev:
            return now
        prev = now
        time.sleep(wait)
    raise AssertionError("the wake count does not settle")


def test_a_write_wakes_only_the_streams_it_concerns(start_role, tmp_path):
    """Streams on collection b (3), on another database (a database stream) parked with a
    long await; 20 inserts into collection a (both shards): none of those getMores is woken
    (stripedb_proxy_cs_wakes_total does not move, they answer empty at their await), and
    a's stream, opened before the writes, gets every insert in token order."""
    from test_change_streams_proxy import assert_token_order, drain
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        cli.app.b.insert_one({"_id": "b", "k": 1})
        cli.other.x.insert_one({"_id": "x"})
        a_stream = cli.app.c.watch(max_await_time_ms=300)
        bs = [_open(cli.app, "b") for _ in range(3)]
        other = _open(cli.other)
        waits = [_get_more_bg(cli.app, b, 12000) for b in bs]
        waits.append(_get_more_bg(cli.other, other, 12000))
        before = _settle(cl)
        for i in range(20):
            cli.app.c.insert_one({"_id": i, "k": i * 10})  # k < 100: shard-a, else shard-b
        time.sleep(1.5)  # the watchers saw every insert (their await answers at a write)
        assert _wakes(cl) == before, "a write to app.c woke streams on app.b / other"
        evs = drain(a_stream, lambda e: len(e) >= 20)
        a_stream.close()
        assert sorted(e["documentKey"]["_id"] for e in evs) == list(range(20))
        assert_token_order(evs)
        # sequential inserts through one proxy (cluster-time gossip) come in the order
        # they were made, across the shards
        assert [e["documentKey"]["_id"] for e in evs] == list(range(20))
        for t, res in waits:
            t.join(timeout=30)
            assert "err" not in res, res
            assert res["g"]["cursor"]["nextBatch"] == []
            # at its await's end the idle stream's position moved on past the writes
            # elsewhere (its last round was more than 5 s before: it asked the shards
            # that moved): shard-a took 0-9, shard-b 10-19, each is past its own
            assert tok(res["g"]["cursor"]["postBatchResumeToken"])["key"] > tok(
                evs[9]["_id"])["key"], (res["g"]["cursor"]["postBatchResumeToken"], evs[9])
    finally:
        cl.close()


def test_database_and_deployment_streams_are_woken_by_any_collection(start_role, tmp_path):
    """A database stream on app and a deployment stream, each getMore parked with a 30 s
    await: an insert into a collection neither named (app.fresh) answers both long before
    the await (the watcher's move woke them); an insert into another database wakes the
    deployment stream, and the database stream's getMore stays parked."""
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        cli.app.seed.insert_one({"_id": 0})
        dbs = _open(cli.app)
        dep = _open(cli.admin, allChangesForCluster=True)
        (td, rd), (tc, rc) = _get_more_bg(cli.app, dbs, 30000), _get_more_bg(cli.admin, dep, 30000)
        _settle(cl)
        cli.app.fresh.insert_one({"_id": "f", "k": 150})
        td.join(timeout=10)
        tc.join(timeout=10)
        assert not td.is_alive() and not tc.is_alive(), "not woken by app.fresh's insert"
        assert [(e["ns"], e["documentKey"]) for e in rd["g"]["cursor"]["nextBatch"]] == [
            ({"db": "app", "coll": "fresh"}, {"_id": "f"})]
        assert [(e["ns"], e["documentKey"]) for e in rc["g"]["cursor"]["nextBatch"]] == [
            ({"db": "app", "coll": "fresh"}, {"_id": "f"})]
        (td, rd), (tc, rc) = _get_more_bg(cli.app, dbs, 8000), _get_more_bg(cli.admin, dep, 30000)
        before = _settle(cl)
        cli.elsewhere.y.insert_one({"_id": "y"})
        tc.join(timeout=10)
        assert not tc.is_alive(), "the deployment stream was not woken"
        assert [(e["ns"], e["documentKey"]) for e in rc["g"]["cursor"]["nextBatch"]] == [
            ({"db": "elsewhere", "coll": "y"}, {"_id": "y"})]
        assert td.is_alive(), "the database stream on app answered an insert elsewhere"
        td.join(timeout=20)
        assert rd["g"]["cursor"]["nextBatch"] == []
        assert _wakes(cl) - before == 1  # the deployment stream's getMore only
    finally:
        cl.close()


def test_drop_and_rename_wake_the_collection_stream(start_role, tmp_path):
    """A collection stream's getMore parked with a 30 s await is woken by the drop of its
    collection (drop, invalidate) and another's by the rename of its collection (rename,
    invalidate); a stream on the rename's target is woken by it too (it may be concerned)."""
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        db = cli.app
        db.d.insert_one({"_id": 1})
        db.r.insert_one({"_id": 1})
        d, r = _open(db, "d"), _open(db, "r")
        (tdd, rdd), (trr, rrr) = _get_more_bg(db, d, 30000), _get_more_bg(db, r, 30000)
        _settle(cl)
        db.d.drop()
        tdd.join(timeout=10)
        assert not tdd.is_alive(), "the drop did not wake its collection's stream"
        ops = [e["operationType"] for e in rdd["g"]["cursor"]["nextBatch"]]
        if ops == ["drop"]:  # the invalidate may come in the next batch
            g = db.command({"getMore": d[0], "collection": "d", "maxTimeMS": 5000})
            ops += [e["operationType"] for e in g["cursor"]["nextBatch"]]
        assert ops == ["drop", "invalidate"], ops
        cli.admin.command({"renameCollection": "app.r", "to": "app.r2"})
        trr.join(timeout=10)
        assert not trr.is_alive(), "the rename did not wake its collection's stream"
        ops = [e["operationType"] for e in rrr["g"]["cursor"]["nextBatch"]]
        if ops == ["rename"]:
            g = db.command({"getMore": r[0], "collection": "r", "maxTimeMS": 5000})
            ops += [e["operationType"] for e in g["cursor"]["nextBatch"]]
        assert ops == ["rename", "invalidate"], ops
    finally:
        cl.close()


def test_a_shard_restart_still_delivers_everything(start_role, tmp_path):
    """A stream on app.c whose getMores park; shard-b is killed and restarted (its watcher
    fails, reopens: "anything moved"), then writes on both shards: every one comes, in
    token order; a stream on another collection gets nothing."""
    from test_change_streams_proxy import assert_token_order, drain
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        coll = cli.app.c
        cs = coll.watch(max_await_time_ms=500)
        idle = cli.app.b.watch(max_await_time_ms=500)
        coll.insert_one({"_id": 0, "k": 1})
        assert [e["documentKey"]["_id"] for e in drain(cs, lambda e: len(e) >= 1)] == [0]
        cl.restart_shard("shard-b")
        for i in range(1, 11):
            for _ in range(60):
                try:
                    coll.insert_one({"_id": i, "k": i * 20})  # both shards
                    break
                except Exception:  # noqa: BLE001 - shard-b still electing itself
                    time.sleep(0.5)
        evs = drain(cs, lambda e: len(e) >= 10, timeout=60)
        assert [e["documentKey"]["_id"] for e in evs] == list(range(1, 11))
        assert_token_order(evs)
        assert idle.try_next() is None
        cs.close()
        idle.close()
    finally:
        cl.close()


def _op_msg(doc, request_id=1):
    """One OP_MSG (opcode 2013) with one body section."""
    import struct

    import bson
    body = struct.pack("<I", 0) + b"\x00" + bson.encode(doc)
    return struct.pack("<iiii", 16 + len(body), request_id, 0, 2013) + body


def test_a_parked_getmore_whose_client_closed_is_dropped(start_role, tmp_path):
    """A getMore with a 30 s await parks; its client closes the connection: the parked
    getMore is dropped at once (stripedb_proxy_cs_parked back to 0 long before the await),
    and its cursor with it (a getMore on it then is CursorNotFound), as mongod interrupts
    the operation of a client that disconnected."""
    import socket

    from conftest import wait_until
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client(socketTimeoutMS=60000)
        cid, _ = _open(cli.app, "c")
        s = socket.create_connection(("127.0.0.1", cl.proxy_ports[0]))
        s.sendall(_op_msg({"getMore": cid, "collection": "c", "maxTimeMS": 30000,
                           "$db": "app"}))
        wait_until(lambda: _metric(cl, "stripedb_proxy_cs_parked") == 1, 10,
                   what="the getMore parked")
        time.sleep(1.5)  # the watchers' first answers woke it: parked again
        wait_until(lambda: _metric(cl, "stripedb_proxy_cs_parked") == 1, 10,
                   what="the getMore parked again")
        s.close()
        t0 = time.monotonic()
        wait_until(lambda: _metric(cl, "stripedb_proxy_cs_parked") == 0, 5,
                   what="the parked getMore dropped")
        assert time.monotonic() - t0 < 5
        with pytest.raises(OperationFailure) as ei:
            cli.app.command({"getMore": cid, "collection": "c", "maxTimeMS": 100})
        assert ei.value.code == 43
    finally:
        cl.close()
