"""The proxy's event-driven forwarder (issue #19, src/proxy/forwarder.c): a point read or
a retryable single-document update of an unsharded collection is sent to its shard and
answered by the proxy's loop thread, with no request thread. What must hold: such commands
really go that way; every answer is the one a request thread gives for the same command
(compared answer by answer); what the loop does not take, or cannot finish (a view, a
state change, a closed connection, a stopped shard, the proxy's own stop), is answered as
before, and no update is applied twice or lost."""
import signal
import threading

import bson
import pymongo
import pytest

from conftest import wait_until
from forwarder_helpers import cluster  # noqa: F401 - the fixture
from forwarder_helpers import (FALLBACK, IN_FLIGHT, LOOP, in_flight, listener_closed, one_doc,
                               paused_cmds, socket_timeout_cluster, strip, warm)

SENDS = "stripedb_proxy_loop_find_sends_total"


def _fail_next(cl, command, times=1, **data):
    """The shard's failCommand fail point on its next `times` commands named command."""
    cl.shard_client(cl.shard_ids[0]).admin.command(
        {"configureFailPoint": "failCommand", "mode": {"times": times},
         "data": dict({"failCommands": [command]}, **data)})


def test_point_reads_are_answered_by_the_loop_as_a_request_thread_answers(cluster):
    c = cluster.proxy_client(0)
    db = c.fwdb
    docs = [{"_id": 1, "v": 1, "s": "a"}, {"_id": "k", "v": 2}, {"_id": 2.5, "v": 3},
            {"_id": bson.ObjectId(), "v": 4}, {"_id": None, "v": 5},
            {"_id": bson.Int64(7), "v": 6, "sub": {"x": [1, 2]}},
            {"_id": bson.Binary(b"\x01\x02", 0), "v": 7},
            {"_id": bson.Decimal128("1.5"), "v": 8}, {"_id": True, "v": 9}]
    db.t.insert_many(docs)
    warm(db.t)
    queries = []
    for d in docs + [{"_id": "absent"}]:
        f = {"_id": d["_id"]}
        queries += [
            {"filter": f},
            {"filter": f, "projection": {"v": 1}},
            {"filter": f, "projection": {"v": 0, "_id": 0}},
            {"filter": f, "limit": 1, "singleBatch": True},
            {"filter": f, "batchSize": 1},
            {"filter": f, "batchSize": 2.0, "limit": 0},
        ]
    # an equal number 1 and 1.0 (the same _id under MongoDB's comparison)
    queries.append({"filter": {"_id": 1.0}})
    # a projection the shard refuses: an error answered by the loop, as a thread does
    queries.append({"filter": {"_id": 1}, "projection": {"v": 1, "s": 0}})
    for q in queries:
        before = cluster.metric(0, LOOP)
        loop = strip(db.command(dict({"find": "t"}, **q), check=False))
        assert cluster.metric(0, LOOP) == before + 1, q
        # `comment` is a field the loop does not take: the same read on a request thread
        before = cluster.metric(0, LOOP)
        thread = strip(db.command(dict({"find": "t"}, **q, comment="thread"), check=False))
        assert cluster.metric(0, LOOP) == before, q
        assert loop == thread, q
    assert cluster.metric(0, FALLBACK) == 0


@pytest.mark.parametrize("extra", [
    {"filter": {"_id": {"$in": [1, 2]}}},
    {"filter": {"_id": {"$gt": 0}}},
    {"filter": {"_id": [1]}},
    {"filter": {"v": 1}},
    {"filter": {"_id": 1, "v": 1}},
    {"filter": {"_id": 1}, "sort": {"_id": 1}},
    {"filter": {"_id": 1}, "skip": 0},
    {"filter": {"_id": 1}, "batchSize": 0},
    {"filter": {"_id": 1}, "readConcern": {"level": "local"}},
    {"filter": {"_id": 1}, "collation": {"locale": "simple"}},
    {"filter": {"_id": 1}, "maxTimeMS": 10000},
    {"filter": {"_id": 1}, "$readPreference": {"mode": "primaryPreferred"}},
    {"filter": {"_id": 1}, "limit": -1},
    {"filter": {"_id": 1}, "allowPartialResults": True},
])
def test_what_the_loop_does_not_take_goes_to_request_threads(cluster, extra):
    c = cluster.proxy_client(0)
    db = c.fwdb
    db.t.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 2}])
    warm(db.t)
    before = cluster.metric(0, LOOP)
    r = db.command(dict({"find": "t"}, **extra), check=False)
    assert cluster.metric(0, LOOP) == before, (extra, r)
    if extra.get("limit") == -1:
        assert r["ok"] == 0, r  # the request thread's check
    else:
        assert r["ok"] == 1, r


def test_a_view_is_read_through_a_request_thread(cluster):
    c = cluster.proxy_client(0)
    db = c.fwdb
    db.src.insert_many([{"_id": i, "v": i} for i in range(5)])
    db.command({"create": "vw", "viewOn": "src", "pipeline": [{"$match": {"v": {"$gte": 2}}}]})
    warm(db.src)
    db.vw.find_one({"_id": 4})  # its routing (unsharded) cached
    fb = cluster.metric(0, FALLBACK)
    assert db.vw.find_one({"_id": 3}) == {"_id": 3, "v": 3}
    assert db.vw.find_one({"_id": 1}) is None
    # the shard refused each with 169 naming the source; a request thread read it again
    assert cluster.metric(0, FALLBACK) == fb + 2


@pytest.mark.parametrize("code", [11602, 10107, 91])
def test_a_state_change_answer_is_resent_once_by_a_request_thread(cluster, code):
    """What px_shard_call does for a read after a state-change answer (send it again) is
    what a request thread does with the loop's read: the client gets the document."""
    coll = one_doc(cluster, retryWrites=False)
    _fail_next(cluster, "find", errorCode=code)
    fb = cluster.metric(0, FALLBACK)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 0}
    assert cluster.metric(0, FALLBACK) == fb + 1


def test_a_shard_error_is_answered_by_the_loop_not_run_again(cluster):
    """An error a request thread would pass on is passed on by the loop: the shard's
    fail point (two times) fails the loop's read once, and the next read succeeds, so
    the read was not run a second time behind the client's back."""
    coll = one_doc(cluster, retryWrites=False)
    _fail_next(cluster, "find", times=2, errorCode=2)
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        coll.find_one({"_id": 1})
    assert e.value.code == 2
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        coll.find_one({"_id": 1})
    assert e.value.code == 2
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 0}
    assert cluster.metric(0, FALLBACK) == 0


def test_a_restarted_shard_costs_no_error(cluster):
    """The loop's idle connections to a shard that was SIGKILLed were closed by the kernel:
    the loop sees that (or the send fails) and the reads go on, on new connections."""
    c = cluster.proxy_client(0, retryReads=False)
    coll = c.fwdb.t
    coll.insert_many([{"_id": i} for i in range(10)])
    warm(coll)
    for i in range(10):
        assert coll.find_one({"_id": i}) == {"_id": i}
    sid = cluster.shard_ids[0]
    cluster.shard_procs[sid].kill()
    cluster.shard_procs[sid].restart()

    def up():
        try:
            cluster.shard_client(sid).admin.command("ping")
            return True
        except pymongo.errors.PyMongoError:
            return False
    wait_until(up, 20, what="shard restarted")
    for i in range(10):
        assert coll.find_one({"_id": i}) == {"_id": i}  # no retry by the driver
    loop = cluster.metric(0, LOOP)
    coll.insert_one({"_id": "again"})  # the primary learned again
    for i in range(10):
        assert coll.find_one({"_id": i}) == {"_id": i}
    assert cluster.metric(0, LOOP) > loop


def test_a_stopped_shard_then_the_socket_timeout(start_role, tmp_path):
    """The shard URI's socketTimeoutMS bounds a loop read as it bounds a request thread's
    command: past it the read goes to a request thread, which answers once the shard
    runs again."""
    cl, proc = socket_timeout_cluster(start_role, tmp_path, 1500)
    try:
        c = cl.proxy_client(0, socketTimeoutMS=60000)
        coll = c.fwdb.t
        coll.insert_one({"_id": 1, "v": 1})
        warm(coll)
        proc.pause()
        out = []
        t = in_flight(cl, lambda: coll.find_one({"_id": 1}), out)
        wait_until(lambda: cl.metric(0, FALLBACK) == 1, 30, what="the socket timeout")
        proc.signal(signal.SIGCONT)
        t.join(60)
        assert out == [{"_id": 1, "v": 1}], out
        assert cl.metric(0, IN_FLIGHT) == 0
    finally:
        cl.close()


def test_the_proxy_stop_waits_for_a_loop_read(cluster):
    """A graceful stop while a loop read waits for a stopped shard: the read stays where
    it is (running it again elsewhere could run a write twice), is answered once the
    shard runs again, and the proxy exits cleanly (no leak, no sanitizer report)."""
    c = cluster.proxy_client(0, socketTimeoutMS=60000, retryReads=False)
    coll = c.fwdb.t
    coll.insert_one({"_id": 1, "v": 1})
    warm(coll)
    sid = cluster.shard_ids[0]
    cluster.shard_procs[sid].pause()
    out = []
    t = in_flight(cluster, lambda: coll.find_one({"_id": 1}), out)
    proxy = cluster.proxy_procs[0]
    port = cluster.proxy_ports[0]
    proxy.signal(signal.SIGTERM)

    wait_until(lambda: listener_closed(port), 20, what="the proxy's stop began")
    assert proxy.p.poll() is None  # waiting for the read
    cluster.shard_procs[sid].signal(signal.SIGCONT)
    t.join(60)
    assert out == [{"_id": 1, "v": 1}], out
    assert proxy.p.wait(timeout=30) == 0, proxy.tail()
    assert "ERROR: AddressSanitizer" not in proxy.tail(), proxy.tail()
    assert "LeakSanitizer" not in proxy.tail(), proxy.tail()


def test_concurrent_point_reads_and_writes(cluster):
    """16 threads writing and reading their own documents through one proxy: each read
    sees its thread's last acknowledged write (the loop's reads are not behind a request
    thread's writes)."""
    c = cluster.proxy_client(0, maxPoolSize=32)
    coll = c.fwdb.conc
    warm(coll)
    errors = []

    def worker(t):
        try:
            for i in range(60):
                coll.update_one({"_id": t}, {"$set": {"i": i}}, upsert=True)
                got = coll.find_one({"_id": t})
                if got != {"_id": t, "i": i}:
                    errors.append((t, i, got))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    loop = cluster.metric(0, LOOP)
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert cluster.metric(0, LOOP) - loop >= 16 * 60 * 0.5  # most reads on the loop
    assert cluster.metric(0, IN_FLIGHT) == 0


def _paused_finds(cluster, coll, ids, then=None):
    """forwarder_helpers.paused_cmds with `find coll {_id: id}` for each id of ids."""
    return paused_cmds(cluster, [{"find": coll, "filter": {"_id": i}, "$db": "fwdb"}
                                 for i in ids], then=then)


def test_the_finds_of_one_round_go_to_the_shard_in_one_send(cluster):
    """Point finds that reach the proxy together (here: sent while it was stopped) go to
    their shard together, 8 at most in one send on one connection (src/proxy/forwarder.h),
    and each client gets its own document, answered in order by the shard (one message
    at a time per connection, wire/server.h)."""
    coll = cluster.proxy_client(0).fwdb.t
    coll.insert_many([{"_id": i, "v": i * 10} for i in range(40)])
    warm(coll)
    for n in (8, 20, 20):
        ids = list(range(n))[::-1]
        loop, fallbacks, sent = (cluster.metric(0, LOOP), cluster.metric(0, FALLBACK),
                                 cluster.metric(0, SENDS))
        answers = _paused_finds(cluster, "t", ids)
        for i, (_id, (rto, body)) in enumerate(zip(ids, answers)):
            assert rto == 100 + i
            assert body["ok"] == 1.0, body
            assert body["cursor"]["firstBatch"] == [{"_id": _id, "v": _id * 10}], (_id, body)
        # the 9th and later need another connection: one the request threads opened
        # and left idle, else a request thread runs them (and opens one)
        on_loop = cluster.metric(0, LOOP) - loop
        assert on_loop == n if n <= 8 else 8 <= on_loop <= n
        assert cluster.metric(0, FALLBACK) == fallbacks
        assert cluster.metric(0, SENDS) == sent + (on_loop + 7) // 8
        assert cluster.metric(0, IN_FLIGHT) == 0


def _update_cmd(coll, q, u, txn, **kw):
    cmd = {"update": coll, "updates": [dict({"q": q, "u": u}, **kw.pop("stmt", {}))]}
    cmd.update(kw)
    return cmd


def test_retryable_updates_are_answered_by_the_loop_as_a_request_thread_answers(cluster):
    """The same updates on two copies of a collection, one through the loop and one
    (with `comment`, a field the loop does not take) through a request thread: the same
    answers and the same documents after."""
    c = cluster.proxy_client(0, retryWrites=True)
    db = c.fwdb
    seed = [{"_id": i, "v": i, "a": [1, 2]} for i in range(5)] + [{"_id": "s", "v": "x"}]
    db.loop.insert_many(seed)
    db.thread.insert_many(seed)
    warm(db.loop)
    warm(db.thread)
    stmts = [
        ({"_id": 1}, {"$inc": {"v": 1}}, {}),
        ({"_id": 1}, {"$set": {"w": {"x": 1}}}, {}),
        ({"_id": 2}, {"$push": {"a": 3}}, {}),
        ({"_id": "s"}, {"v": "replaced"}, {}),                      # a replacement
        ({"_id": 99}, {"$set": {"v": 99}}, {"upsert": True}),       # an upsert
        ({"_id": 98}, {"$set": {"v": 98}}, {}),                      # no match
        ({"_id": 3}, {"$set": {"_id": 4}}, {}),                      # ImmutableField
        ({"_id": 3}, {"$inc": {"a": 1}}, {}),                        # TypeMismatch
        ({"_id": 3}, {"$bad": {"v": 1}}, {}),                        # unknown operator
        ({"_id": 4}, {"$set": {"v": 5}}, {"multi": False, "upsert": False}),
    ]
    # two sessions open at once (pymongo reuses an ended session's lsid), each with its
    # own increasing txnNumber, as a driver's retryable writes
    s_loop, s_thread = c.start_session(), c.start_session()
    assert s_loop.session_id != s_thread.session_id
    for i, (q, u, opts) in enumerate(stmts):
        # pymongo adds a txnNumber to a retryable write it runs itself, not to
        # command(): it is given here as a driver gives it (lsid: the session's)
        base = {"txnNumber": bson.Int64(1000 + i)}  # above the warm-up's numbers
        before = cluster.metric(0, LOOP)
        loop = strip(db.command(dict(_update_cmd("loop", q, u, None, stmt=opts), **base),
                                 check=False, session=s_loop))
        assert cluster.metric(0, LOOP) == before + 1, (q, u)
        before = cluster.metric(0, LOOP)
        thread = strip(db.command(dict(_update_cmd("thread", q, u, None, stmt=opts),
                                        comment="thread", **base), check=False,
                                   session=s_thread))
        assert cluster.metric(0, LOOP) == before, (q, u)
        # errmsg names no collection here; upserted ids are the same
        assert loop == thread, (q, u, loop, thread)
    s_loop.end_session()
    s_thread.end_session()
    assert sorted(db.loop.find(), key=repr) == sorted(db.thread.find(), key=repr)
    assert cluster.metric(0, FALLBACK) == 0


def test_a_retried_update_on_the_loop_is_applied_once(cluster):
    c = cluster.proxy_client(0, retryWrites=True)
    db = c.fwdb
    db.t.insert_one({"_id": 1, "v": 0})
    warm(db.t)
    with c.start_session() as s:
        cmd = dict(_update_cmd("t", {"_id": 1}, {"$inc": {"v": 1}}, None),
                   txnNumber=bson.Int64(7))
        before = cluster.metric(0, LOOP)
        first = strip(db.command(cmd, session=s))
        # the driver's retry: answered from the shard's record
        again = strip(db.command(cmd, session=s))
        assert cluster.metric(0, LOOP) == before + 2
    assert first == again, (first, again)
    assert db.t.find_one({"_id": 1}) == {"_id": 1, "v": 1}


def test_non_retryable_updates_of_one_document_on_the_loop(cluster):
    coll = one_doc(cluster, retryWrites=False)
    before = cluster.metric(0, LOOP)
    coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
    assert cluster.metric(0, LOOP) == before + 1
    coll.update_many({"_id": 1}, {"$inc": {"v": 1}})  # multi: a request thread's
    coll.update_one({"v": 2}, {"$inc": {"v": 1}})  # not an _id equality
    assert cluster.metric(0, LOOP) == before + 1
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 3}


@pytest.mark.parametrize("code,resent", [(11602, False), (11600, False), (189, False),
                                         (10107, True), (91, True)])
def test_a_state_change_answer_to_a_non_retryable_loop_update(cluster, code, resent):
    """As px_shard_call: a refusal (it did not run) is sent again, by a request thread;
    an interruption (it may have run) is answered, masked, and never sent again."""
    coll = one_doc(cluster, retryWrites=False)
    _fail_next(cluster, "update", errorCode=code)
    fb = cluster.metric(0, FALLBACK)
    if resent:
        assert coll.update_one({"_id": 1}, {"$inc": {"v": 1}}).modified_count == 1
        assert cluster.metric(0, FALLBACK) == fb + 1
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1}
    else:
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        assert e.value.code == 6 and f"({code}) from a shard" in e.value.details["errmsg"]
        assert cluster.metric(0, FALLBACK) == fb
        # the fail point answered without running it: not run at all
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 0}


def test_a_non_retryable_update_lost_with_its_connection_is_an_unknown_outcome(cluster):
    """The shard dies with a non-retryable update in flight on the loop: it may have
    run, so it is not run again; the client gets HostUnreachable without the
    RetryableWriteError label."""
    coll = one_doc(cluster, retryWrites=False, socketTimeoutMS=60000)
    sid = cluster.shard_ids[0]
    cluster.shard_procs[sid].pause()
    out = []

    def run():
        try:
            out.append(coll.update_one({"_id": 1}, {"$inc": {"v": 1}}))
        except Exception as e:  # noqa: BLE001 - asserted below
            out.append(e)
    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 1, 20, what="a loop update in flight")
    fb = cluster.metric(0, FALLBACK)
    cluster.shard_procs[sid].kill()
    t.join(60)
    assert len(out) == 1 and isinstance(out[0], pymongo.errors.OperationFailure), out
    assert out[0].code == 6, out[0].details
    assert "RetryableWriteError" not in out[0].details.get("errorLabels", []), out[0].details
    assert cluster.metric(0, FALLBACK) == fb
    cluster.shard_procs[sid].restart()


@pytest.mark.parametrize("code", [11602, 10107, 189])
def test_a_state_change_answer_to_a_loop_update_is_resent_and_applied_once(cluster, code):
    """The shard's fail point answers the update with code without running it; the loop
    hands it to a request thread, which sends it again with the same txnNumber: applied
    once, and the client sees success (as px_shard_call's resend gives)."""
    coll = one_doc(cluster, retryWrites=True)
    _fail_next(cluster, "update", errorCode=code)
    fb = cluster.metric(0, FALLBACK)
    r = coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
    assert r.modified_count == 1
    assert cluster.metric(0, FALLBACK) == fb + 1
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1}


def test_a_write_concern_error_of_a_loop_update_is_masked(cluster):
    coll = one_doc(cluster, retryWrites=True)
    _fail_next(cluster, "update",
               writeConcernError={"code": 11602, "errmsg": "stepped down"})
    before = cluster.metric(0, LOOP)
    with pytest.raises(pymongo.errors.WriteConcernError) as e:
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
    assert e.value.code == 6, e.value.details
    assert "(11602) from a shard" in e.value.details["errmsg"]
    assert cluster.metric(0, LOOP) == before + 1


@pytest.mark.parametrize("retry_writes", [True, False])
def test_updates_through_a_restarted_shard_are_applied_once(cluster, retry_writes):
    """$inc from 4 threads while the shard is SIGKILLed and restarted: every
    acknowledged increment is in the final count, none is applied twice, and a failed
    one was applied at most once."""
    c = cluster.proxy_client(0, retryWrites=retry_writes, maxPoolSize=16)
    coll = c.fwdb.cnt
    coll.insert_many([{"_id": t, "v": 0} for t in range(4)])
    warm(coll)
    acked = [0] * 4
    unknown = [0] * 4
    stop = threading.Event()

    def worker(t):
        while not stop.is_set():
            try:
                coll.update_one({"_id": t}, {"$inc": {"v": 1}})
                acked[t] += 1
            except pymongo.errors.PyMongoError:
                unknown[t] += 1

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    wait_until(lambda: sum(acked) >= 200, 30, what="updates before the restart")
    sid = cluster.shard_ids[0]
    cluster.shard_procs[sid].kill()
    cluster.shard_procs[sid].restart()
    at_restart = sum(acked)
    wait_until(lambda: sum(acked) >= at_restart + 200, 60, what="updates after the restart")
    stop.set()
    for t in ts:
        t.join()
    final = {d["_id"]: d["v"] for d in coll.find({"_id": {"$in": list(range(4))}})}
    for t in range(4):
        # a failed update may or may not have been applied; an acknowledged one was,
        # and once
        assert acked[t] <= final[t] <= acked[t] + unknown[t], (t, acked, unknown, final)
    assert cluster.metric(0, LOOP) > 0


def test_inserts_and_deletes_are_answered_by_the_loop_as_a_request_thread_answers(cluster):
    """Inserts (one document, several, a duplicate key, ordered and not) and deletes of
    one _id on two copies of a collection, one through the loop and one (with `comment`)
    through a request thread, as retryable writes: the same answers and documents."""
    c = cluster.proxy_client(0, retryWrites=True)
    db = c.fwdb
    for name in ("loop", "thread"):
        db[name].insert_many([{"_id": i, "v": i} for i in range(5)])
        warm(db[name])
    cmds = [
        {"insert": None, "documents": [{"_id": 10, "v": 10}]},
        {"insert": None, "documents": [{"_id": 11}, {"_id": 12, "x": [1, {"y": 2}]}]},
        {"insert": None, "documents": [{"_id": 13}, {"_id": 1}, {"_id": 14}]},   # dup
        {"insert": None, "documents": [{"_id": 15}, {"_id": 2}, {"_id": 16}],
         "ordered": False},
        {"insert": None, "documents": [{"v": "no _id"}]},   # the shard makes one
        {"delete": None, "deletes": [{"q": {"_id": 3}, "limit": 1}]},
        {"delete": None, "deletes": [{"q": {"_id": 3}, "limit": 1}]},   # gone already
        {"insert": None, "documents": [{"_id": 20}], "writeConcern": {"w": 1, "j": True}},
    ]
    s_loop, s_thread = c.start_session(), c.start_session()
    for i, cmd in enumerate(cmds):
        name = next(iter(cmd))
        base = {"txnNumber": bson.Int64(2000 + i)}
        before = cluster.metric(0, LOOP)
        loop = strip(db.command(dict(cmd, **{name: "loop"}, **base), check=False,
                                 session=s_loop))
        assert cluster.metric(0, LOOP) == before + 1, (cmd, loop)
        before = cluster.metric(0, LOOP)
        thread = strip(db.command(dict(cmd, **{name: "thread"}, comment="t", **base),
                                   check=False, session=s_thread))
        assert cluster.metric(0, LOOP) == before, cmd
        for r in (loop, thread):  # errmsgs name their collection
            for we in r.get("writeErrors", []):
                we["errmsg"] = we["errmsg"].replace("fwdb.loop", "X").replace("fwdb.thread", "X")
        assert loop == thread, (cmd, loop, thread)
    s_loop.end_session()
    s_thread.end_session()

    def docs(name):  # the generated _id differs
        return sorted(({k: v for k, v in d.items() if not isinstance(v, bson.ObjectId)}
                       for d in db[name].find()), key=repr)
    assert docs("loop") == docs("thread")
    assert cluster.metric(0, FALLBACK) == 0
    # limit 0 cannot be a retryable write (InvalidOptions, the request thread's check);
    # without a txnNumber the loop takes it
    before = cluster.metric(0, LOOP)
    assert db.command({"delete": "loop", "deletes": [{"q": {"_id": 4}, "limit": 0}]})["n"] == 1
    assert cluster.metric(0, LOOP) == before + 1


def test_a_retried_insert_on_the_loop_is_applied_once(cluster):
    c = cluster.proxy_client(0, retryWrites=True)
    db = c.fwdb
    warm(db.t)
    with c.start_session() as s:
        cmd = {"insert": "t", "documents": [{"_id": "a"}, {"_id": "b"}],
               "txnNumber": bson.Int64(77)}
        first = strip(db.command(cmd, session=s))
        again = strip(db.command(cmd, session=s))
    assert first == again == {"n": 2, "ok": 1.0}, (first, again)
    assert sorted(d["_id"] for d in db.t.find()) == ["a", "b", "warm"]


@pytest.mark.parametrize("cmd", [
    {"insert": "t", "documents": [{"_id": 1}], "bypassDocumentValidation": 1},
    {"delete": "t", "deletes": [{"q": {"_id": 1}, "limit": 2}]},
    {"delete": "t", "deletes": [{"q": {"_id": 1}, "limit": 1}, {"q": {"_id": 2}, "limit": 1}]},
    {"delete": "t", "deletes": [{"q": {"_id": 1}, "limit": 1, "collation": {"locale": "fr"}}]},
    {"delete": "t", "deletes": [{"q": {"_id": {"$gt": 1}}, "limit": 0}]},
    {"insert": "t", "documents": [{"_id": i, "pad": "x" * 1000} for i in range(300)]},
    {"update": "t", "updates": [{"q": {"_id": 1}, "u": {"$set": {"v": 1}},
                                 "arrayFilters": []}]},
    {"update": "t", "updates": [{"q": {"_id": 1}, "u": [{"$set": {"v": 1}}]}]},
])
def test_writes_the_loop_does_not_take(cluster, cmd):
    c = cluster.proxy_client(0)
    db = c.fwdb
    warm(db.t)
    before = cluster.metric(0, LOOP)
    db.command(cmd, check=False)
    assert cluster.metric(0, LOOP) == before, cmd
