"""Review of the loop thread's forwarder (src/proxy/forwarder.c): cases the first tests
(test_proxy_forwarder.py) do not cover."""
import signal
import threading

import bson
import pymongo
import pytest

from conftest import free_port, wait_until
from forwarder_helpers import cluster  # noqa: F401 - the fixture
from forwarder_helpers import (FALLBACK, IN_FLIGHT, LOOP, LOOP_CONNS, in_flight,
                               listener_closed, one_doc, strip, warm)
from proxy_helpers import ProxyCluster



def test_a_loop_read_at_a_stop_past_its_timeout_is_a_wait_not_a_lost_request(start_role,
                                                                           tmp_path):
    """The proxy's stop outlasts shutdown-timeout-ms while a loop read waits for a
    stopped shard. A request thread's read is then logged as "request waiting at
    shutdown" (info, shardconn_wait_begin); the loop's was logged as "unanswered request
    at shutdown" (warn: a handler that forgot its request, which conftest fails a test
    for). It is a wait bounded by the shard (wire_req_wait_begin): the same log, and the
    proxy exits cleanly once the shard answers."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=0)
    try:
        cl.add_proxy(["--shutdown-timeout-ms=1000"])
        c = cl.proxy_client(0, socketTimeoutMS=60000, retryReads=False)
        coll = c.fwdb.t
        coll.insert_one({"_id": 1, "v": 1})
        warm(coll)
        sid = cl.shard_ids[0]
        cl.shard_procs[sid].pause()
        out = []
        t = in_flight(cl, lambda: coll.find_one({"_id": 1}), out)
        proxy = cl.proxy_procs[0]
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: listener_closed(cl.proxy_ports[0]), 20, what="the stop began")
        wait_until(lambda: "shutdown timeout, closing connections" in proxy.tail(20000), 20,
                   what="the proxy's shutdown timeout")
        cl.shard_procs[sid].signal(signal.SIGCONT)
        rc = proxy.p.wait(timeout=30)
        t.join(60)
        tail = proxy.tail(20000)
        assert rc == 0, tail
        assert "ERROR: AddressSanitizer" not in tail, tail
        assert "LeakSanitizer" not in tail, tail
        assert "unanswered request at shutdown" not in tail, tail
        assert "request waiting at shutdown" in tail, tail
    finally:
        cl.shard_procs[cl.shard_ids[0]].signal(signal.SIGCONT)
        cl.close()


def _cluster_with_timeout(start_role, tmp_path, timeout_ms, proxy_args=()):
    cl = ProxyCluster(start_role, tmp_path, shards=0, proxies=0)
    port = free_port()
    d = tmp_path / "shard-a"
    d.mkdir()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}",
                       "--enable-test-commands"])
    cl.shard_ids.append("shard-a")
    cl.shard_ports["shard-a"] = port
    cl.shard_procs["shard-a"] = proc
    cl.meta_cmd({"addShard": "shard-a",
                 "uri": f"mongodb://127.0.0.1:{port}/?socketTimeoutMS={timeout_ms}"})
    cl.add_proxy(list(proxy_args))
    return cl


@pytest.mark.parametrize("path", ["loop", "thread"])
@pytest.mark.parametrize("retryable", [True, False])
def test_an_update_slower_than_the_socket_timeout_is_applied_once(start_role, tmp_path,
                                                                  path, retryable):
    """The shard holds the update (blockConnection) longer than the URI's socket timeout,
    then runs it. A retryable one is resent (by a request thread) while the first copy
    still waits on the shard; a non-retryable one is an unknown outcome. Either way the
    document is incremented once, through the loop as through a request thread."""
    cl = _cluster_with_timeout(start_role, tmp_path, 1000)
    try:
        c = cl.proxy_client(0, socketTimeoutMS=60000)
        db = c.fwdb
        db.t.insert_one({"_id": 1, "v": 0})
        warm(db.t)
        sh = cl.shard_client("shard-a")
        sh.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                          "data": {"failCommands": ["update"], "blockConnection": True,
                                   "blockTimeMS": 2500}})
        cmd = {"update": "t", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 1}}}]}
        if path == "thread":
            cmd["comment"] = "thread"
        before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
        if retryable:
            with c.start_session() as s:
                r = db.command(dict(cmd, txnNumber=bson.Int64(5)), session=s, check=False)
        else:
            r = db.command(cmd, check=False)
        took = cl.metric(0, LOOP) + cl.metric(0, FALLBACK) - before
        assert took == (1 if path == "loop" else 0), r
        if not retryable:
            # the held copy runs at the end of blockTimeMS (its client was told the
            # outcome is unknown); nothing sends it again
            wait_until(lambda: db.t.find_one({"_id": 1})["v"] >= 1, 20, what="the held copy")
        # retryable: the answer came from the resend, which the shard answered from the
        # record the held copy left, so that copy has run
        assert db.t.find_one({"_id": 1}) == {"_id": 1, "v": 1}, r
        if retryable:
            assert r["ok"] == 1 and r["n"] == 1, r
        else:
            assert r["ok"] == 0 and r["code"] == 6, r
            assert "RetryableWriteError" not in r.get("errorLabels", []), r
    finally:
        cl.close()


@pytest.mark.parametrize("path", ["loop", "thread"])
def test_non_retryable_updates_through_graceful_shard_restarts(cluster, path):
    """Non-retryable $inc from 8 threads while the shard is stopped gracefully (SIGTERM)
    and restarted, 3 times: every acknowledged update is applied, none twice, and a
    failed one at most once, through the loop as through request threads. (Both paths
    see some 'Connection reset by peer' unknown outcomes at a graceful shard stop; the
    loop's read 'bad file descriptor' before it read what a reset left to read.)"""
    cl = cluster
    c = cl.proxy_client(0, retryWrites=False, maxPoolSize=16)
    coll = c.fwdb.cnt
    coll.insert_many([{"_id": t, "v": 0} for t in range(8)])
    warm(coll)
    acked = [0] * 8
    errors = []
    stop = threading.Event()

    def worker(t):
        while not stop.is_set():
            cmd = {"update": "cnt", "updates": [{"q": {"_id": t}, "u": {"$inc": {"v": 1}}}]}
            if path == "thread":
                cmd["comment"] = "thread"
            try:
                r = c.fwdb.command(cmd)
                assert r["n"] == 1, r
                acked[t] += 1
            except pymongo.errors.PyMongoError as e:
                errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    sid = cl.shard_ids[0]
    try:
        for _ in range(3):
            at = sum(acked)
            wait_until(lambda: sum(acked) >= at + 200, 60, what="updates")
            assert cl.shard_procs[sid].stop() == 0
            cl.shard_procs[sid].restart()
        at = sum(acked)
        wait_until(lambda: sum(acked) >= at + 200, 60, what="updates after")
    finally:
        stop.set()
        for t in ts:
            t.join()
    final = {d["_id"]: d["v"] for d in coll.find({"_id": {"$in": list(range(8))}})}
    assert not any("bad file descriptor" in e for e in errors), errors[:5]
    for t in range(8):
        assert acked[t] <= final[t] <= acked[t] + len(errors), (t, acked, final, errors[:3])


def test_odd_commands_answered_by_the_loop_as_by_a_request_thread(cluster):
    """Odd but eligible finds and updates: the loop's answer equals a request thread's
    (the same command with `comment`), on two copies of the collection."""
    cl = cluster
    c = cl.proxy_client(0)
    db = c.fwdb
    big = "x" * (4 << 20)
    seed = [{"_id": 1, "v": 1, "a": [{"b": 1}, {"b": 2}]}, {"_id": "", "v": 2},
            {"_id": bson.Timestamp(5, 1), "v": 3}, {"_id": 2, "v": 4, "big": big}]
    for name in ("loop", "thread"):
        db[name].insert_many(seed)
        db[name].create_index("v", unique=True)
        warm(db[name])
    finds = [
        {"filter": {"_id": 1}, "projection": {"a": {"$elemMatch": {"b": 2}}}},
        {"filter": {"_id": 1}, "projection": {"a": {"$slice": 1}}},
        {"filter": {"_id": 1}, "projection": {"a.$": 1}},
        {"filter": {"_id": 1}, "projection": {}},
        {"filter": {"_id": 1}, "limit": bson.Int64(2**62), "batchSize": bson.Int64(2**62)},
        {"filter": {"_id": 1}, "singleBatch": False, "limit": 1.0},
        {"filter": {"_id": ""}},
        {"filter": {"_id": bson.Timestamp(5, 1)}},
        {"filter": {"_id": 2}},  # a 4 MB answer
        {"filter": {"_id": 2}, "projection": {"big": 0}},
        {"filter": {"_id": 1}, "$readPreference": {"mode": "primary"}},
        {"filter": {"_id": "y" * 100000}},
    ]
    for q in finds:
        before = cl.metric(0, LOOP)
        loop = strip(db.command(dict({"find": "loop"}, **q), check=False))
        took = cl.metric(0, LOOP) - before
        thread = strip(db.command(dict({"find": "loop"}, **q, comment="t"), check=False))
        assert took == 1, (q, loop)
        assert loop == thread, (q, loop, thread)
    updates = [
        ({"_id": 1}, {}, {}),                                   # an empty replacement
        ({"_id": 1}, {"$set": {}}, {}),
        ({"_id": 1}, [{"$set": {"w": 1}}], {}),                 # a pipeline
        ({"_id": 7}, {"$setOnInsert": {"s": 1}, "$set": {"v": 70}}, {"upsert": True}),
        ({"_id": 8}, {"$set": {"v": 70}}, {"upsert": True}),    # duplicate key on v
        ({"_id": 1}, {"_id": 2, "v": 9}, {}),                   # _id changed
        ({"_id": 1}, {"$set": {"big2": big}}, {}),              # a 4 MB update
        ({"_id": 9}, {"v": 90, "$x": 1}, {"upsert": True}),
        ({"_id": ""}, {"$inc": {"v": 1}}, {"upsert": False, "multi": False}),
    ]
    wcs = [None, {"w": 1, "j": True}, {"w": "majority", "wtimeout": 1}, {"w": 3, "wtimeout": 50}]
    for i, (q, u, opts) in enumerate(updates):
        for wc in wcs:
            res = {}
            for name in ("loop", "thread"):
                cmd = {"update": name, "updates": [dict({"q": q, "u": u}, **opts)],
                       "ordered": False}
                if wc:
                    cmd["writeConcern"] = wc
                if name == "thread":
                    cmd["comment"] = "t"
                before = cl.metric(0, LOOP)
                res[name] = strip(db.command(cmd, check=False))
                # a pipeline is a thread's; a 4 MB update does not fit the socket's send
                # buffer (partial send: a thread's, see the test below)
                if name == "loop" and not isinstance(u, list) and "big2" not in str(u)[:20]:
                    assert cl.metric(0, LOOP) - before == 1, (q, u, wc, res)
            assert repr(res["loop"]) == repr(res["thread"]).replace("fwdb.thread", "fwdb.loop"), \
                (q, u, wc, res)
    assert sorted(db.loop.find({}, {"big": 0, "big2": 0}), key=repr) == \
        sorted(db.thread.find({}, {"big": 0, "big2": 0}), key=repr)


def test_a_command_too_big_for_one_send_keeps_the_shard_primary_known(cluster):
    """A 4 MB update does not fit a non-blocking send: the loop hands it to a request
    thread (it cannot have run: no complete message reached the shard). That is no
    failure of the member: the loop must not forget the shard's primary (and send the
    commands after it through libmongoc until a thread learns the primary again)."""
    cl = cluster
    c = cl.proxy_client(0)
    coll = c.fwdb.t
    coll.insert_many([{"_id": i, "v": i} for i in range(3)])
    warm(coll)
    big = "x" * (4 << 20)
    for i in range(3):
        coll.update_one({"_id": i}, {"$set": {"big": big}})
        before = cl.metric(0, LOOP)
        assert coll.find_one({"_id": i}, {"big": 0}) == {"_id": i, "v": i}
        assert cl.metric(0, LOOP) == before + 1, i


@pytest.mark.parametrize("what", ["find", "update"])
def test_a_client_gone_with_its_loop_command_in_flight(cluster, what):
    """The client closes its connection (its socket timeout) while its command waits
    on the loop for a stopped shard; the shard then answers. The proxy goes on serving,
    the update is applied once, and the proxy exits cleanly (no use of the freed
    connection, no leak)."""
    cl = cluster
    coll = one_doc(cl)
    impatient = cl.proxy_client(0, socketTimeoutMS=1000, retryReads=False,
                                retryWrites=False)
    icoll = impatient.fwdb.t
    icoll.find_one({"_id": "warm"})
    sid = cl.shard_ids[0]
    cl.shard_procs[sid].pause()
    before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
    with pytest.raises(pymongo.errors.NetworkTimeout):
        if what == "find":
            icoll.find_one({"_id": 1})
        else:
            icoll.update_one({"_id": 1}, {"$inc": {"v": 1}})
    assert cl.metric(0, IN_FLIGHT) == 1
    impatient.close()
    cl.shard_procs[sid].signal(signal.SIGCONT)
    wait_until(lambda: cl.metric(0, IN_FLIGHT) == 0, 20, what="the answer")
    assert cl.metric(0, LOOP) + cl.metric(0, FALLBACK) >= before + 1
    for _ in range(20):
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1 if what == "update" else 0}
    cl.stop_proxy_clean(0)


@pytest.mark.parametrize("path", ["loop", "thread"])
def test_a_retryable_update_resent_to_a_stopped_shard_is_applied_once(start_role, tmp_path,
                                                                      path):
    """SIGSTOP: every copy of a retryable update (the loop's, then the request thread's
    resends past the URI's socket timeout) waits in the shard's sockets and all run at
    SIGCONT, concurrently: the shard must apply it once."""
    cl = _cluster_with_timeout(start_role, tmp_path, 700)
    try:
        c = cl.proxy_client(0, socketTimeoutMS=60000)
        db = c.fwdb
        db.t.insert_many([{"_id": i, "v": 0} for i in range(4)])
        warm(db.t)
        sid = cl.shard_ids[0]
        out = []

        def run(i):
            cmd = {"update": "t", "updates": [{"q": {"_id": i}, "u": {"$inc": {"v": 1}}}]}
            if path == "thread":
                cmd["comment"] = "t"
            with c.start_session() as s:
                out.append(db.command(dict(cmd, txnNumber=bson.Int64(3)), session=s,
                                      check=False))
        cl.shard_procs[sid].pause()
        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        # the copies pile up: each past the socket timeout is sent again (the loop's by
        # a request thread, the request threads' by themselves)
        # (the loop takes the updates it has an idle connection for: at least one)
        if path == "loop":
            wait_until(lambda: cl.metric(0, FALLBACK) >= 1, 30, what="a loop copy handed on")
        wait_until(lambda: cl.metric(0, "stripedb_proxy_shard_retries_total")
                   >= (1 if path == "loop" else 4), 30, what="copies resent")
        cl.shard_procs[sid].signal(signal.SIGCONT)
        for t in ts:
            t.join(60)
        final = {d["_id"]: d["v"] for d in db.t.find({"_id": {"$in": list(range(4))}})}
        assert final == {i: 1 for i in range(4)}, (final, out)
    finally:
        cl.shard_procs[cl.shard_ids[0]].signal(signal.SIGCONT)
        cl.close()


@pytest.mark.parametrize("retry_writes", [True, False])
def test_loop_updates_and_reads_across_primary_transfers(start_role, tmp_path, retry_writes):
    """A shard replica set's primary handed over 8 times while writers $inc their own
    document and readers read it, both on the loop: per document acks <= v <= attempts,
    no state-change code reaches a client, and the loop took most of them."""
    from test_proxy_shard_wire_failover import _set_behind_a_proxy, _metric
    from test_shard_replset import direct, primary_index
    from sdam_watch import STATE_CHANGE
    procs, wires, proxy, c = _set_behind_a_proxy(start_role, tmp_path)
    coll = c.app.c
    writers = 4
    wait_until(lambda: coll.insert_many([{"_id": w, "v": 0} for w in range(writers)]), 30,
               what="the documents")
    coll.find_one({"_id": 0})
    stop = threading.Event()
    attempts, acks, codes, bad_reads = [0] * writers, [0] * writers, [], []

    def writer(w):
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{c.address[1]}/",
                                 directConnection=True, retryWrites=retry_writes,
                                 socketTimeoutMS=10000) as wc:
            last = 0
            while not stop.is_set():
                attempts[w] += 1
                try:
                    wc.app.c.update_one({"_id": w}, {"$inc": {"v": 1}})
                    acks[w] += 1
                except pymongo.errors.PyMongoError as e:
                    codes.append((getattr(e, "details", None) or {}).get("code"))
                try:
                    d = wc.app.c.find_one({"_id": w})
                    if d["v"] < last or d["v"] < acks[w]:
                        bad_reads.append((w, d, last, acks[w]))
                    last = d["v"]
                except pymongo.errors.PyMongoError as e:
                    codes.append((getattr(e, "details", None) or {}).get("code"))
    loop0 = _metric(proxy, LOOP)
    ts = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in ts:
        t.start()
    try:
        for _ in range(8):
            base = sum(acks)
            wait_until(lambda: sum(acks) >= base + 20, 30, what="writes")
            old = primary_index(wires)
            if old is None:
                continue
            try:
                with direct(wires[old]) as d:
                    d.admin.command({"transferLeadership": 0})
            except pymongo.errors.PyMongoError:
                pass
            wait_until(lambda: primary_index(wires) not in (None, old), 30,
                       what="a new primary")
        base = sum(acks)
        wait_until(lambda: sum(acks) >= base + 20, 30, what="writes after")
    finally:
        stop.set()
        for t in ts:
            t.join(timeout=60)
    p = primary_index(wires)
    with direct(wires[p]) as d:
        got = {doc["_id"]: doc["v"] for doc in d.app.c.find()}
    print(f"attempts={attempts} acks={acks} values={got} codes={sorted(set(map(str, codes)))} "
          f"loop={_metric(proxy, LOOP) - loop0}")
    for w in range(writers):
        assert acks[w] <= got[w] <= attempts[w], (w, acks[w], got[w], attempts[w])
    assert not STATE_CHANGE & set(codes), codes
    assert bad_reads == [], bad_reads[:5]
    assert _metric(proxy, LOOP) - loop0 > sum(attempts)
    c.close()


@pytest.mark.parametrize("path", ["loop", "thread"])
def test_unacknowledged_updates_of_one_connection_keep_their_order(cluster, path):
    """w: 0 updates (OP_MSG moreToCome: no answer awaited) sent back to back on one
    connection run in the order sent, as on a mongod: the last $set wins."""
    from pymongo.write_concern import WriteConcern
    cl = cluster
    coll = one_doc(cl, maxPoolSize=1)
    w0 = coll.with_options(write_concern=WriteConcern(w=0))
    before = cl.metric(0, LOOP)
    for i in range(1, 301):
        if path == "loop":
            w0.update_one({"_id": 1}, {"$set": {"v": i}})
        else:
            w0.update_one({"_id": 1}, {"$set": {"v": i}}, bypass_document_validation=True)
    # an acknowledged command on the same (only) connection after them
    assert coll.find_one({"_id": 1}, comment="after") is not None
    wait_until(lambda: cl.metric(0, IN_FLIGHT) == 0, 10, what="nothing in flight")
    if path == "loop":
        assert cl.metric(0, LOOP) - before >= 300
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 300}


def _conns_to(port):
    """Established TCP connections whose remote end is 127.0.0.1:port (/proc/net/tcp)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            rem, st = parts[2], parts[3]
            if st == "01" and int(rem.split(":")[1], 16) == port:
                n += 1
    return n


def test_connections_to_a_shard_member_stay_bounded(cluster):
    """The request threads' commands to a shard are bounded by its pool (64 clients), and
    the loop keeps at most PX_FORWARD_CONNS (64) connections per member besides, taken for
    good from the own ones (src/proxy/README.md), each with at most 8 finds: against a
    slow shard (blockConnection), with 64 + 64 + 64 commands in flight at once, one
    proxy's connections to the member stay within 128 (and this test's own clients)."""
    cl = cluster
    sid = cl.shard_ids[0]
    port = cl.shard_ports[sid]
    c = cl.proxy_client(0, maxPoolSize=300, socketTimeoutMS=300000, retryReads=False)
    coll = c.fwdb.t
    coll.insert_one({"_id": 1, "v": 1})
    warm(coll)

    def burst(n, thread_path):
        out = []

        def one():
            try:
                if thread_path:
                    out.append(c.fwdb.command({"find": "t", "filter": {"_id": 1},
                                               "comment": "t"}))
                else:
                    out.append(coll.find_one({"_id": 1}))
            except Exception as e:  # noqa: BLE001
                out.append(e)
        ts = [threading.Thread(target=one) for _ in range(n)]
        for t in ts:
            t.start()
        return ts, out

    sh = cl.shard_client(sid)

    def hold(on, ms=4000):
        sh.admin.command({"configureFailPoint": "failCommand",
                          "mode": "alwaysOn" if on else "off",
                          "data": {"failCommands": ["find"], "blockConnection": True,
                                   "blockTimeMS": ms}})
    # 64 own connections opened by request threads (concurrent, on a slow shard)
    hold(True)
    ts, _ = burst(64, True)
    wait_until(lambda: _conns_to(port) >= 64, 30, what="64 request-thread connections")
    hold(False)
    for t in ts:
        t.join(60)
    # the loop takes them (concurrent point reads on a slow shard: finds of one round
    # share a connection, and wait for each other there), then 64 more loop reads and 64
    # request-thread reads at once: the request threads' are capped at 64 connections,
    # the loop's at 64 with at most 8 finds each
    hold(True, 1000)
    ts, out1 = burst(64, False)
    wait_until(lambda: cl.metric(0, IN_FLIGHT) == 64, 30, what="64 loop reads in flight")
    ts2, out2 = burst(64, False)
    ts3, out3 = burst(64, True)
    wait_until(lambda: _conns_to(port) >= cl.metric(0, LOOP_CONNS) + 64, 60,
               what="the request threads' 64 connections besides the loop's")
    n = _conns_to(port)
    loop_conns = cl.metric(0, LOOP_CONNS)
    inflight = cl.metric(0, IN_FLIGHT)
    hold(False)
    for t in ts + ts2 + ts3:
        t.join(120)
    assert loop_conns <= 64, loop_conns
    assert inflight <= 8 * loop_conns, (inflight, loop_conns)
    assert n <= 128 + 8, (n, loop_conns, inflight)  # + this test's own clients
    for r in out1 + out2:
        assert r == {"_id": 1, "v": 1}, r
    for r in out3:
        assert not isinstance(r, Exception) and r["ok"] == 1.0, r


@pytest.mark.parametrize("retryable", [True, False])
def test_the_proxy_stop_with_a_loop_update_in_flight(cluster, retryable):
    """SIGTERM while a loop update waits for a stopped shard: it stays on the loop (never
    run a second time by a request thread), its answer reaches the client once the
    shard runs, it is applied once, and the proxy exits cleanly."""
    cl = cluster
    coll = one_doc(cl, socketTimeoutMS=60000, retryWrites=retryable)
    sid = cl.shard_ids[0]
    cl.shard_procs[sid].pause()
    out = []
    t = in_flight(cl, lambda: coll.update_one({"_id": 1}, {"$inc": {"v": 1}}), out)
    proxy = cl.proxy_procs[0]
    proxy.signal(signal.SIGTERM)
    wait_until(lambda: listener_closed(cl.proxy_ports[0]), 20, what="the stop began")
    cl.shard_procs[sid].signal(signal.SIGCONT)
    t.join(60)
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    assert out[0].modified_count == 1
    assert proxy.p.wait(timeout=30) == 0, proxy.tail()
    tail = proxy.tail(20000)
    assert "ERROR: AddressSanitizer" not in tail and "LeakSanitizer" not in tail, tail
    sh = cl.shard_client(sid)
    assert sh.fwdb.t.find_one({"_id": 1}) == {"_id": 1, "v": 1}


def test_more_id_types_read_and_updated_by_the_loop_as_by_a_request_thread(cluster):
    import datetime
    import uuid
    cl = cluster
    c = cl.proxy_client(0)
    db = c.fwdb
    ids = [bson.Int64(2**63 - 1), bson.Int64(-2**63), bson.Decimal128("NaN"),
           bson.Decimal128("-0"), float("nan"), float("inf"), -0.0,
           datetime.datetime(1969, 12, 31, 23, 59, 59), bson.Binary(uuid.uuid4().bytes, 4),
           bson.Binary(b"\x00", 2), bson.Binary(b"zz", 0x80), False, bson.Timestamp(0, 0),
           "é\u0000x" if False else "é", 0]
    for name in ("loop", "thread"):
        for i, x in enumerate(ids):
            try:
                db[name].insert_one({"_id": x, "i": i})
            except pymongo.errors.DuplicateKeyError:
                pass
        warm(db[name])
    for x in ids:
        before = cl.metric(0, LOOP)
        a = strip(db.command({"find": "loop", "filter": {"_id": x}}, check=False))
        assert cl.metric(0, LOOP) == before + 1, x
        b = strip(db.command({"find": "loop", "filter": {"_id": x}, "comment": "t"},
                              check=False))
        assert repr(a) == repr(b), (x, a, b)
        res = {}
        for name in ("loop", "thread"):
            cmd = {"update": name, "updates": [{"q": {"_id": x}, "u": {"$inc": {"n": 1}},
                                                "upsert": True}]}
            if name == "thread":
                cmd["comment"] = "t"
            res[name] = strip(db.command(cmd, check=False))
        assert repr(res["loop"]) == repr(res["thread"]), (x, res)
    assert repr(sorted(db.loop.find({}, {"_id": 0}), key=repr)) == \
        repr(sorted(db.thread.find({}, {"_id": 0}), key=repr))
