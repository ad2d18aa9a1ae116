"""The proxy's loop finds sent together on one connection (src/proxy/forwarder.h, commit
25b7e20) against what can go wrong with them: a shard that runs some on a worker (a view,
a batchSize that leaves a cursor, a document near 16 MiB) between others it answers on its
loop; answers of several MB split across reads; a failCommand on one of them; a shard
stopped or killed with 8 in flight; the proxy's stop with them in flight or arriving;
StaleConfig on each of a connection's finds; many threads. Every client must get its own
answer and the proxy must exit cleanly (no sanitizer report)."""
import random
import signal
import socket
import threading

import pytest

from conftest import assert_clean_exit, op_msg, wait_until
from forwarder_helpers import cluster  # noqa: F401 - the fixture
from forwarder_helpers import (FALLBACK, IN_FLIGHT, LOOP, greeted_sockets, listener_closed,
                               paused_cmds, recv_msg, sharded_cluster, socket_timeout_cluster,
                               warm)

SENDS = "stripedb_proxy_loop_find_sends_total"
MB = 1 << 20


def _find(coll, _id, **kw):
    return dict({"find": coll, "filter": {"_id": _id}, "$db": "fwdb"}, **kw)


def _check(answers, expected):
    for i, ((rto, body), exp) in enumerate(zip(answers, expected)):
        assert rto == 100 + i, (i, rto)
        assert body.get("ok") == 1.0, (i, body)
        assert body["cursor"]["id"] == 0, (i, body)
        assert body["cursor"]["firstBatch"] == exp, (i, [len(str(d)) for d in exp],
                                                      str(body)[:300])


def _assert_clean_exit(proc):
    assert proc.p.wait(timeout=60) == 0, proc.tail()
    assert "ERROR: AddressSanitizer" not in proc.tail(), proc.tail()
    assert "LeakSanitizer" not in proc.tail(), proc.tail()


def _all_clean(cluster):
    """The proxy, then the shards, stopped gracefully with no sanitizer report."""
    assert_clean_exit(cluster.proxy_procs[0])
    for sid in cluster.shard_ids:
        assert_clean_exit(cluster.shard_procs[sid])


def _small(cluster, n=8):
    coll = cluster.proxy_client(0).fwdb.t
    coll.insert_many([{"_id": i, "v": i * 3} for i in range(n)])
    warm(coll)
    return [_find("t", i) for i in range(n)], [[{"_id": i, "v": i * 3}] for i in range(n)]


def test_finds_the_shard_runs_on_a_worker_between_loop_ones_keep_their_order(cluster):
    """One round's finds mixing what the shard answers on its loop (small documents, a
    missing one) with what it hands to a worker (a find on a view; batchSize 1, which
    leaves a cursor; a document near 16 MiB) and answers of several MB: each client gets
    its own answer (the shard answers a connection's messages in order)."""
    c = cluster.proxy_client(0)
    db = c.fwdb
    db.t.insert_many([{"_id": i, "v": i} for i in range(8)])
    db.src.insert_many([{"_id": i, "v": i} for i in range(5)])
    db.command({"create": "vw", "viewOn": "src", "pipeline": [{"$match": {"v": {"$gte": 2}}}]})
    bigs = {i: {"_id": i, "p": chr(ord("a") + i) * (3 * MB + i)} for i in range(3)}
    bigs[9] = {"_id": 9, "p": "z" * (15 * MB)}
    for d in bigs.values():
        db.big.insert_one(d)
    for coll in (db.t, db.src, db.big):
        warm(coll)
    db.vw.find_one({"_id": 4})
    cmds, exp = [], []

    def add(cmd, e):
        cmds.append(cmd)
        exp.append(e)
    add(_find("t", 0), [{"_id": 0, "v": 0}])
    add(_find("vw", 3), [{"_id": 3, "v": 3}])
    add(_find("t", 1), [{"_id": 1, "v": 1}])
    add(_find("big", 0), [bigs[0]])
    add(_find("t", 2, batchSize=1), [{"_id": 2, "v": 2}])
    add(_find("big", 1), [bigs[1]])
    add(_find("vw", 1), [])
    add(_find("t", 3), [{"_id": 3, "v": 3}])
    add(_find("t", "missing"), [])
    add(_find("big", 9), [bigs[9]])
    add(_find("t", 4), [{"_id": 4, "v": 4}])
    add(_find("big", 2), [bigs[2]])
    add(_find("t", 5), [{"_id": 5, "v": 5}])
    add(_find("vw", 4), [{"_id": 4, "v": 4}])
    add(_find("t", 6, batchSize=1), [{"_id": 6, "v": 6}])
    add(_find("t", 7), [{"_id": 7, "v": 7}])
    sent = cluster.metric(0, SENDS)
    _check(paused_cmds(cluster, cmds), exp)
    # 8 at most on a connection: two sends, or one and 8 finds left to request threads
    # (no second idle connection to take)
    assert 1 <= cluster.metric(0, SENDS) - sent <= 2
    assert cluster.metric(0, IN_FLIGHT) == 0
    # and again with the big ones first
    order = [3, 9, 5, 11, 0, 1, 2, 4, 6, 7, 8, 10, 12, 13, 14, 15]
    _check(paused_cmds(cluster, [cmds[i] for i in order]), [exp[i] for i in order])
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


def test_eight_finds_in_flight_to_a_stopped_shard_are_answered_when_it_runs_again(cluster):
    cmds, exp = _small(cluster)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    fb, loop = cluster.metric(0, FALLBACK), cluster.metric(0, LOOP)
    shard.pause()

    def resume():
        wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 8, 20, what="8 in flight")
        shard.signal(signal.SIGCONT)
    _check(paused_cmds(cluster, cmds, then=resume), exp)
    assert cluster.metric(0, FALLBACK) == fb
    assert cluster.metric(0, LOOP) == loop + 8
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


def test_eight_finds_in_flight_to_a_killed_shard(cluster):
    """Eight finds sent together to a shard that is stopped, then killed and restarted:
    the connection fails with all of them on it; each goes to a request thread (a find
    has no side effect), which answers it once the shard is back."""
    cmds, exp = _small(cluster)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    fb = cluster.metric(0, FALLBACK)
    shard.pause()

    def kill():
        wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 8, 20, what="8 in flight")
        shard.kill()
        shard.restart()
    _check(paused_cmds(cluster, cmds, then=kill), exp)
    assert cluster.metric(0, FALLBACK) == fb + 8
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


def test_the_proxy_stop_with_eight_finds_in_flight(cluster):
    """SIGTERM while 8 finds sent together wait for a stopped shard: they stay, are
    answered once it runs again, and the proxy exits cleanly."""
    cmds, exp = _small(cluster)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    proxy = cluster.proxy_procs[0]
    port = cluster.proxy_ports[0]
    shard.pause()

    def stop():
        wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 8, 20, what="8 in flight")
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: listener_closed(port), 20, what="the proxy's stop began")
        assert proxy.p.poll() is None
        shard.signal(signal.SIGCONT)
    _check(paused_cmds(cluster, cmds, then=stop), exp)
    _assert_clean_exit(proxy)


def test_the_proxy_stop_while_finds_arrive_together(cluster):
    """SIGTERM sent while the proxy is stopped and 8 finds wait to be read: each client
    gets its own answer or a closed connection, and the proxy exits cleanly."""
    cmds, exp = _small(cluster)
    proxy = cluster.proxy_procs[0]
    socks = []
    try:
        socks = greeted_sockets(cluster, len(cmds))
        proxy.pause()
        for i, (s, cmd) in enumerate(zip(socks, cmds)):
            s.sendall(op_msg(100 + i, cmd))
        proxy.signal(signal.SIGTERM)
        proxy.signal(signal.SIGCONT)
        for i, s in enumerate(socks):
            try:
                rto, body = recv_msg(s)
            except (AssertionError, ConnectionError):
                continue  # closed by the stop before it was read
            assert rto == 100 + i
            if body.get("ok") == 1.0:
                assert body["cursor"]["firstBatch"] == exp[i], body
    finally:
        for s in socks:
            s.close()
    _assert_clean_exit(proxy)


@pytest.mark.parametrize("data", [{"closeConnection": True},
                                  {"errorCode": 11602}, {"errorCode": 2}])
def test_a_fail_point_on_one_of_the_finds_sent_together(cluster, data):
    """The shard's failCommand on the first find of a connection's 8: a closed connection
    sends all 8 to request threads; a state change that one (and the error code 2 is
    answered as the shard gave it); the others are answered with their documents."""
    cmds, exp = _small(cluster)
    cluster.shard_client(cluster.shard_ids[0]).admin.command(
        {"configureFailPoint": "failCommand", "mode": {"times": 1},
         "data": dict({"failCommands": ["find"]}, **data)})
    answers = paused_cmds(cluster, cmds)
    failed = [i for i, (_, b) in enumerate(answers) if b.get("ok") != 1.0]
    if data.get("errorCode") == 2:
        assert len(failed) == 1, answers
        assert answers[failed[0]][1]["code"] == 2
        for i, (rto, body) in enumerate(answers):
            assert rto == 100 + i
            if i not in failed:
                assert body["cursor"]["firstBatch"] == exp[i], body
        assert cluster.metric(0, IN_FLIGHT) == 0
        _all_clean(cluster)
        return
    assert failed == [], answers
    _check(answers, exp)
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


def test_stale_config_on_each_find_of_one_connection(start_role, tmp_path):
    """A shard without filtering metadata refuses each of 8 finds sent together with
    StaleConfig: each goes to a request thread, which answers it; then the loop answers
    them."""
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1}, False)
    try:
        coll = cl.proxy_client(0).fwdb.s
        coll.insert_many([{"_id": i, "v": i} for i in range(8)])
        coll.update_one({"_id": 1}, {"$set": {"w": 1}})  # the primary learned
        coll.update_one({"_id": 1}, {"$unset": {"w": 1}})
        cmds = [dict({"find": "s", "filter": {"_id": i}, "$db": "fwdb"}) for i in range(8)]
        exp = [[{"_id": i, "v": i}] for i in range(8)]
        fb = cl.metric(0, FALLBACK)
        _check(paused_cmds(cl, cmds), exp)
        assert cl.metric(0, FALLBACK) - fb >= 1
        loop = cl.metric(0, LOOP)
        _check(paused_cmds(cl, cmds), exp)
        assert cl.metric(0, LOOP) - loop >= 1
        assert cl.metric(0, IN_FLIGHT) == 0
        _assert_clean_exit_after_stop(cl.proxy_procs[0])
    finally:
        cl.close()


def _assert_clean_exit_after_stop(proc):
    proc.signal(signal.SIGTERM)
    _assert_clean_exit(proc)


def test_many_threads_reading_their_own_documents(cluster):
    """32 threads reading documents of 10 B to 1.5 MB by _id, four more writing other
    documents of the same shard: each read gets its own document."""
    c = cluster.proxy_client(0, maxPoolSize=64)
    coll = c.fwdb.m
    sizes = [10, 100, 1000, 20000, 300000, 1500000]
    docs = {i: {"_id": i, "p": "x" * sizes[i % len(sizes)] + str(i)} for i in range(60)}
    coll.insert_many(list(docs.values()))
    warm(coll)
    errors = []
    stop = threading.Event()

    def reader(t):
        rnd = random.Random(t)
        try:
            for _ in range(150):
                i = rnd.randrange(70)
                got = coll.find_one({"_id": i})
                if got != docs.get(i):
                    errors.append((t, i, None if got is None else len(got.get("p", ""))))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    def writer(t):
        try:
            n = 0
            while not stop.is_set():
                coll.update_one({"_id": f"w{t}"}, {"$set": {"n": n}}, upsert=True)
                n += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    loop = cluster.metric(0, LOOP)
    ws = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    rs = [threading.Thread(target=reader, args=(t,)) for t in range(32)]
    for t in ws + rs:
        t.start()
    for t in rs:
        t.join()
    stop.set()
    for t in ws:
        t.join()
    assert errors == []
    assert cluster.metric(0, LOOP) - loop >= 32 * 150 * 0.5
    assert cluster.metric(0, IN_FLIGHT) == 0
    _assert_clean_exit_after_stop(cluster.proxy_procs[0])


def _rx_queued(port):
    """Bytes waiting in the receive queues of this host's sockets connected to 127.0.0.1:port
    (the proxy's connections to a shard: /proc/net/tcp)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            rem = fields[2]
            if int(rem.split(":")[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                total += int(fields[4].split(":")[1], 16)
    return total


@pytest.mark.parametrize("size", [10, 1 << 20])
def test_answers_that_wait_while_the_proxy_is_stopped(cluster, size):
    """8 finds in flight to a stopped shard; the proxy stopped, the shard resumed: the
    answers pile up in the proxy's socket (several in one recv; of 1 MiB each, more than
    its receive buffer, each split across recvs) and each client gets its own."""
    c = cluster.proxy_client(0)
    docs = [{"_id": i, "p": chr(97 + i) * size} for i in range(8)]
    c.fwdb.t.insert_many(docs)
    warm(c.fwdb.t)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    proxy = cluster.proxy_procs[0]
    shard.pause()

    def then():
        wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 8, 20, what="8 in flight")
        proxy.pause()
        shard.signal(signal.SIGCONT)
        wait_until(lambda: _rx_queued(cluster.shard_ports[sid]) >= min(8 * size, 64 << 10),
                   30, interval=0.01, what="answers waiting for the proxy")
        proxy.signal(signal.SIGCONT)
    fb = cluster.metric(0, FALLBACK)
    _check(paused_cmds(cluster, [_find("t", i) for i in range(8)], then=then),
           [[d] for d in docs])
    assert cluster.metric(0, FALLBACK) == fb
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


def test_the_socket_timeout_of_eight_finds_sent_together(start_role, tmp_path):
    """The shard URI's socketTimeoutMS bounds a connection's 8 finds together: past it
    all 8 go to request threads, which answer them once the shard runs again."""
    cl, proc = socket_timeout_cluster(start_role, tmp_path, 1500)
    try:
        cmds, exp = _small(cl)
        fb = cl.metric(0, FALLBACK)
        proc.pause()

        def then():
            wait_until(lambda: cl.metric(0, FALLBACK) == fb + 8, 30, what="the timeout")
            proc.signal(signal.SIGCONT)
        _check(paused_cmds(cl, cmds, then=then), exp)
        assert cl.metric(0, IN_FLIGHT) == 0
        _all_clean(cl)
    finally:
        cl.close()


def test_finds_too_large_for_one_send_go_to_request_threads(cluster):
    """8 finds whose _id is a 1 MiB string: more than the socket takes in one
    non-blocking send; what is not sent whole goes to request threads, and each client
    gets its own document."""
    coll = cluster.proxy_client(0).fwdb.t
    ids = [chr(97 + i) * MB for i in range(8)]
    for i, _id in enumerate(ids):
        coll.insert_one({"_id": _id, "i": i})
    warm(coll)
    cmds = [_find("t", _id) for _id in ids]
    exp = [[{"_id": _id, "i": i}] for i, _id in enumerate(ids)]
    for _ in range(3):
        _check(paused_cmds(cluster, cmds), exp)
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)


@pytest.mark.parametrize("when", ["queued", "in_flight"])
def test_clients_that_reset_while_their_finds_are_together(cluster, when):
    """8 clients reset their connection (SO_LINGER 0) after sending their find, before
    the proxy read it (queued) or while the finds wait for a stopped shard (in_flight):
    the proxy serves on (a 17th client reads) and exits cleanly."""
    import struct
    cmds, exp = _small(cluster)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    proxy = cluster.proxy_procs[0]
    linger = struct.pack("ii", 1, 0)
    if when == "in_flight":
        shard.pause()

        def then(socks):
            wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 8, 20, what="8 in flight")
            for s in socks:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                s.close()
            shard.signal(signal.SIGCONT)
        paused_cmds(cluster, cmds, answers=False, then=then)
    else:
        socks = greeted_sockets(cluster, len(cmds))
        proxy.pause()
        for i, (s, cmd) in enumerate(zip(socks, cmds)):
            s.sendall(op_msg(100 + i, cmd))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            s.close()
        proxy.signal(signal.SIGCONT)
    wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 0, 20, what="none in flight")
    coll = cluster.proxy_client(0).fwdb.t
    for i in range(8):
        assert coll.find_one({"_id": i}) == exp[i][0]
    _all_clean(cluster)


def test_a_slow_find_does_not_hold_the_finds_sent_with_it(cluster):
    """A point find whose projection computes for seconds (the shard runs it on a worker,
    shard/commands.c read_inline_candidate) reaches the proxy in the same round as 7
    plain point finds of other clients. The shard answers a connection's messages one at a
    time, so on one connection with it they would wait for it: the 7 must be answered
    while it still runs."""
    import select
    coll = cluster.proxy_client(0).fwdb.t
    coll.insert_many([{"_id": i, "v": i} for i in range(8)])
    warm(coll)
    slow = {"v": 1, "s": {"$reduce": {"input": {"$range": [0, 1000000]}, "initialValue": 0,
                                      "in": {"$add": ["$$value", "$$this"]}}}}
    cmds = [_find("t", 0, projection=slow)] + [_find("t", i) for i in range(1, 8)]
    loop = cluster.metric(0, LOOP)

    def then(socks):
        for i, s in enumerate(socks[1:], 1):
            rto, body = recv_msg(s)
            assert (rto, body["cursor"]["firstBatch"]) == (100 + i, [{"_id": i, "v": i}])
        # the 7 are in while the slow one runs
        assert select.select([socks[0]], [], [], 0)[0] == [], "answered behind the slow find"
        rto, body = recv_msg(socks[0])
        assert body["cursor"]["firstBatch"] == [{"_id": 0, "v": 0, "s": 499999500000}]
        for s in socks:
            s.close()
    paused_cmds(cluster, cmds, answers=False, then=then)
    # the slow one on the loop, alone; the others on the loop too when the member has
    # another idle connection, else through request threads
    assert cluster.metric(0, LOOP) - loop >= 1
    assert cluster.metric(0, IN_FLIGHT) == 0


def test_readers_through_a_shard_stopped_and_resumed_many_times(cluster):
    """24 threads reading their own documents while the shard is stopped (with finds in
    flight together) and resumed six times, then killed and restarted once: every read
    gets its own document, and the proxy exits cleanly."""
    c = cluster.proxy_client(0, maxPoolSize=64, socketTimeoutMS=60000)
    coll = c.fwdb.r
    docs = {i: {"_id": i, "p": "y" * (i * 997 % 50000)} for i in range(48)}
    coll.insert_many(list(docs.values()))
    warm(coll)
    sid = cluster.shard_ids[0]
    shard = cluster.shard_procs[sid]
    errors, stop = [], threading.Event()

    def reader(t):
        rnd = random.Random(t)
        try:
            while not stop.is_set():
                i = rnd.randrange(48)
                got = coll.find_one({"_id": i})
                if got != docs[i]:
                    errors.append((t, i, None if got is None else len(got["p"])))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    rs = [threading.Thread(target=reader, args=(t,)) for t in range(24)]
    for t in rs:
        t.start()
    try:
        for _ in range(6):
            shard.pause()
            wait_until(lambda: cluster.metric(0, IN_FLIGHT) >= 1, 20, what="finds in flight")
            shard.signal(signal.SIGCONT)
            loop = cluster.metric(0, LOOP)
            wait_until(lambda: cluster.metric(0, LOOP) > loop + 50, 30, what="reads again")
        shard.pause()
        wait_until(lambda: cluster.metric(0, IN_FLIGHT) >= 1, 20, what="finds in flight")
        shard.kill()
        shard.restart()
        loop = cluster.metric(0, LOOP)
        wait_until(lambda: cluster.metric(0, LOOP) > loop + 50, 60, what="reads again")
    finally:
        stop.set()
        for t in rs:
            t.join()
    assert errors == []
    assert cluster.metric(0, IN_FLIGHT) == 0
    _all_clean(cluster)
