"""The proxy's own shard connections (src/proxy/shardwire.c) across a change of a shard
replica set's primary: libmongoc watches the members; the own connections must follow
what it learns, not keep sending to a former primary until a socket times out."""
import signal
import threading

import pymongo
import pytest
from pymongo.errors import PyMongoError

from conftest import free_port, http_get, wait_until
from metadata_cluster import Cluster
from sdam_watch import STATE_CHANGE, SdamWatch
from test_shard_replset import direct, primary_index, start_set

WIRE = "stripedb_proxy_shard_wire_commands_total"


def _metric(proc, name):
    st, body = http_get(proc.http_port, "/metrics")
    assert st == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def _finds(proc):
    """stripedb_shard_commands_total{cmd="find"} of a shard member."""
    st, body = http_get(proc.http_port, "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith("stripedb_shard_commands_total{") and 'cmd="find"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _set_behind_a_proxy(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1, election_ms=300)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": uri})
    port = free_port()
    proxy = start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                        f"--metadata={meta.seeds()}"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                            retryWrites=False, socketTimeoutMS=3000,
                            serverSelectionTimeoutMS=3000)
    return procs, wires, proxy, c


def test_reads_leave_a_primary_that_stepped_down(start_role, tmp_path):
    """The primary hands its role over (transferLeadership) and stays up as a secondary.
    A read-only workload on the own connections must then reach the new primary: the
    former one refuses a find without a secondary read preference (13435,
    shard_repl_check_read), which the own connections take as a refusal (forget the
    member, send again through libmongoc), and libmongoc's monitoring sees the member
    become a secondary. (Passes on main too: a guard for the read path.)"""
    procs, wires, proxy, c = _set_behind_a_proxy(start_role, tmp_path)
    coll = c.app.c
    wait_until(lambda: coll.insert_one({"_id": "first"}), 30, what="a first write")
    before = _metric(proxy, WIRE)
    for _ in range(20):
        assert coll.find_one({"_id": "first"}) == {"_id": "first"}
    assert _metric(proxy, WIRE) - before >= 20  # they went on the own connections
    old = primary_index(wires)
    with direct(wires[old]) as d:
        d.admin.command({"transferLeadership": 0})
    wait_until(lambda: primary_index(wires) not in (None, old), 30, what="a new primary")
    new = primary_index(wires)

    def read_on_new():
        n = _finds(procs[new])
        assert coll.find_one({"_id": "first"}) == {"_id": "first"}
        return _finds(procs[new]) > n
    wait_until(read_on_new, 30, what="a read through the proxy on the new primary")
    c.close()


def test_writes_leave_a_stopped_primary_for_the_new_one(start_role, tmp_path):
    """SIGSTOP the primary the proxy's own connections go to: the kernel keeps its
    connections open, so a command sent there waits for the socket timeout (libmongoc's
    default, 300 s). libmongoc's monitor (heartbeat 1 s) sees the member stop answering
    and the new primary elected; writes through the proxy must then reach the new
    primary. The client's socket timeout (3 s) bounds each attempt; 60 s of attempts is
    far below the 300 s a command stuck on the stopped member waits."""
    procs, wires, proxy, c = _set_behind_a_proxy(start_role, tmp_path)
    coll = c.app.c
    wait_until(lambda: coll.insert_one({"_id": "first"}), 30, what="a first write")
    before = _metric(proxy, WIRE)
    for i in range(20):
        coll.insert_one({"_id": i})
    assert _metric(proxy, WIRE) - before >= 20  # they went on the own connections
    old = primary_index(wires)
    assert old is not None
    procs[old].pause()
    try:
        wait_until(lambda: primary_index([w for i, w in enumerate(wires) if i != old])
                   is not None, 30, what="a new primary")
        n = [100]

        def write():
            n[0] += 1
            try:
                coll.insert_one({"_id": n[0]})
                return True
            except PyMongoError:
                return False
        wait_until(write, 60, what="a write through the proxy on the new primary")
    finally:
        procs[old].signal(signal.SIGCONT)
    c.close()


def test_no_increment_applied_twice_across_primary_transfers(start_role, tmp_path):
    """Writers through the proxy, each $inc-ing its own document by 1 without retryable
    writes (no txnNumber: nothing on the shard can tell a resend), while the primary
    role is handed over again and again (transferLeadership: entries the old primary
    had in flight may still commit under the new one, and their writes are answered
    11602, outcome unknown). Per document, with A attempts and K acknowledgements:
    K <= v <= A. A write the proxy resent after an unknown outcome can make v > A.
    And no writer's driver ever took an error for news about the proxy (a shard's
    state-change code passed on as the proxy's: test_proxy_state_change.py): it would
    mark the proxy Unknown and wait up to 10 s for its monitor."""
    procs, wires, proxy, c = _set_behind_a_proxy(start_role, tmp_path)
    coll = c.app.c
    writers = 6
    wait_until(lambda: coll.insert_many([{"_id": w, "v": 0} for w in range(writers)]), 30,
               what="the documents")
    stop = threading.Event()
    attempts = [0] * writers
    acks = [0] * writers
    codes = []
    watch = SdamWatch()

    def writer(w):
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{c.address[1]}/",
                                 directConnection=True, retryWrites=False,
                                 socketTimeoutMS=10000, event_listeners=[watch]) as wc:
            while not stop.is_set():
                attempts[w] += 1
                try:
                    wc.app.c.update_one({"_id": w}, {"$inc": {"v": 1}})
                    acks[w] += 1
                except PyMongoError as e:
                    codes.append((getattr(e, "details", None) or {}).get("code"))
    ts = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in ts:
        t.start()
    try:
        for _ in range(16):  # main doubled an $inc in about one run in three of 8
            wait_until(lambda: sum(acks) > 0, 30, what="writes acknowledged")
            old = primary_index(wires)
            if old is None:
                continue
            try:
                with direct(wires[old]) as d:
                    d.admin.command({"transferLeadership": 0})
            except PyMongoError:
                pass
            wait_until(lambda: primary_index(wires) not in (None, old), 30,
                       what="a new primary")
            base = sum(acks)
            wait_until(lambda: sum(acks) >= base + 20, 30, what="writes on the new primary")
    finally:
        # what the drivers did while they ran (closing a client clears its pool)
        unknown, cleared = list(watch.unknown), list(watch.cleared)
        stop.set()
        for t in ts:
            t.join(timeout=60)
    p = primary_index(wires)
    with direct(wires[p]) as d:
        got = {doc["_id"]: doc["v"] for doc in d.app.c.find()}
    print(f"attempts={attempts} acks={acks} values={got} error codes={sorted(set(map(str, codes)))}")
    for w in range(writers):
        assert acks[w] <= got[w] <= attempts[w], (w, acks[w], got[w], attempts[w])
    assert not STATE_CHANGE & set(codes), codes
    assert unknown == [] and cleared == [], (unknown, cleared)
    c.close()
