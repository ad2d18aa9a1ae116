"""Causal reads on secondaries (issue #20): readConcern {afterClusterTime: T} on a secondary
whose newest applied oplog entry is below T waits for it (mongod's waitForReadConcernImpl)
instead of failing, and the secondary asks the primary for an appendOplogNote no-op above T
(makeNoopWriteIfNeeded) so the wait ends even when nobody writes. The wait is bounded by
maxTimeMS (50), interrupted by killOp (11601), and visible in currentOp.

Real 3-member shard sets on loopback (test_shard_replset.start_set); a member is cut off
from the others with SIGSTOP.
"""
import signal
import threading
import time

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure
from pymongo.read_preferences import Secondary

from conftest import free_port, wait_until
from metadata_cluster import Cluster
from test_shard_replset import direct, primary_index, start_set

NOOP = {"noop write for afterClusterTime read concern": 1}
SIG = {"hash": b"\x00" * 20, "keyId": 0}


def secondary_client(port, **kw):
    """A direct connection to one member that reads from it (pymongo sends secondaryOk)."""
    opts = dict(serverSelectionTimeoutMS=5000, socketTimeoutMS=30000,
                readPreference="secondaryPreferred")
    opts.update(kw)
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", **opts)


def read_at(client, t, **extra):
    """find on app.c with readConcern afterClusterTime t, t gossiped as $clusterTime (as a
    driver does after talking to another shard) through a session pymongo sends it with."""
    with client.start_session(causal_consistency=False) as s:
        s.advance_cluster_time({"clusterTime": t, "signature": SIG})
        return client.app.command(dict({"find": "c", "filter": {},
                                         "readConcern": {"afterClusterTime": t}}, **extra),
                                  session=s)


def waiting_causal_ops(port):
    with direct(port) as c:
        return [op for op in c.admin.command("currentOp")["inprog"]
                if op.get("command", {}).get("readConcern", {}).get("afterClusterTime")
                is not None]


def test_causal_session_reads_its_writes_on_secondaries(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        coll = c.app.get_collection("c", read_preference=Secondary())
        with c.start_session(causal_consistency=True) as s:
            for i in range(150):
                c.app.c.insert_one({"_id": i, "v": i}, session=s)
                # served by a secondary, which waits for the write if it lags
                assert coll.find_one({"_id": i}, session=s) == {"_id": i, "v": i}, i
                c.app.c.update_one({"_id": i}, {"$set": {"v": -i}}, session=s)
                assert coll.count_documents({"v": -i}, session=s) == 1, i
    # a lagging secondary: stopped while the write commits on the two others, resumed,
    # and read at once with the session's time: it waits for its catch-up, never answers
    # without the write
    p = primary_index(wires)
    lag = (p + 1) % 3
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c, \
            secondary_client(wires[lag]) as sc:
        for i in range(5):
            with c.start_session(causal_consistency=True) as s:
                procs[lag].signal(signal.SIGSTOP)
                try:
                    c.app.c.insert_one({"_id": f"lag{i}"}, session=s)
                finally:
                    procs[lag].signal(signal.SIGCONT)
                with sc.start_session(causal_consistency=True) as s2:
                    s2.advance_cluster_time(s.cluster_time)
                    s2.advance_operation_time(s.operation_time)
                    got = sc.app.c.find_one({"_id": f"lag{i}"}, session=s2)
                    assert got == {"_id": f"lag{i}"}, i


def test_read_above_every_write_completes_through_a_noop_on_the_primary(start_role,
                                                                         tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    p = primary_index(wires)
    sec = (p + 1) % 3
    with direct(wires[p]) as pc:
        pc.app.c.insert_one({"_id": 1})
    # a time a few seconds ahead of every write, gossiped to the secondary with the read
    # (as a driver does after talking to another shard): nothing is written after it
    t = Timestamp(int(time.time()) + 5, 3)
    with secondary_client(wires[sec]) as sc:
        t0 = time.monotonic()
        r = read_at(sc, t)
        assert r["ok"] == 1 and r["cursor"]["firstBatch"] == [{"_id": 1}], r
        assert time.monotonic() - t0 < 4.5  # served by the no-op, not by the clock
    with direct(wires[p]) as pc:
        notes = list(pc.local["oplog.rs"].find({"op": "n", "o": NOOP}))
    assert notes, "no appendOplogNote no-op in the primary's oplog"
    assert any(n["ts"] >= t for n in notes), (notes, t)
    # the same time again: served at once, no second no-op
    with secondary_client(wires[sec]) as sc:
        r = read_at(sc, t)
        assert r["ok"] == 1
    with direct(wires[p]) as pc:
        assert len(list(pc.local["oplog.rs"].find({"op": "n", "o": NOOP}))) == len(notes)
    # the primary serves such a read at once; above its cluster time it is still 72
    with direct(wires[p]) as pc:
        r = read_at(pc, t)
        assert r["ok"] == 1
        # a time ahead of its own oplog (from another shard): the primary, too, waits for
        # its oplog to reach it (a deposed primary must not serve it: test_shard_partition),
        # and writes the no-op itself
        t2 = Timestamp(int(time.time()) + 6, 1)
        r = read_at(pc, t2)
        assert r["ok"] == 1 and r["cursor"]["firstBatch"] == [{"_id": 1}], r
        notes2 = list(pc.local["oplog.rs"].find({"op": "n", "o": NOOP}))
        assert any(n["ts"] >= t2 for n in notes2), (notes2, t2)
        far = Timestamp(int(time.time()) + 3600, 1)
        with pytest.raises(OperationFailure) as e:
            pc.app.command({"find": "c", "filter": {}, "readConcern": {"afterClusterTime": far}})
        assert e.value.code == 72
    with secondary_client(wires[sec]) as sc:
        with pytest.raises(OperationFailure) as e:
            sc.app.command({"find": "c", "filter": {},
                            "readConcern": {"afterClusterTime": far}})
        assert e.value.code == 72


def test_cut_off_secondary_answers_max_time_and_kill_op(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    p = primary_index(wires)
    sec = (p + 1) % 3
    others = [i for i in range(3) if i != sec]
    with direct(wires[p]) as pc:
        pc.app.c.insert_one({"_id": 1})
    t = Timestamp(int(time.time()) + 2, 1)
    for i in others:
        procs[i].signal(signal.SIGSTOP)
    try:
        with secondary_client(wires[sec]) as sc:
            # maxTimeMS: 50 in about that time
            t0 = time.monotonic()
            with pytest.raises(OperationFailure) as e:
                read_at(sc, t, maxTimeMS=700)
            took = time.monotonic() - t0
            assert e.value.code == 50, e.value.details
            assert e.value.details["codeName"] == "MaxTimeMSExpired"
            assert 0.65 <= took < 3.0, took
            # no maxTimeMS: waits, visible in currentOp, until killOp
            out = {}

            def reader():
                try:
                    out["r"] = read_at(sc, t)
                except OperationFailure as ex:
                    out["e"] = ex
            th = threading.Thread(target=reader)
            th.start()
            ops = wait_until(lambda: waiting_causal_ops(wires[sec]), 10,
                             what="the waiting read in currentOp")
            assert ops[0]["op"] == "query" and ops[0]["ns"] == "app.c", ops
            with direct(wires[sec]) as kc:
                kc.admin.command("killOp", op=ops[0]["opid"])
            th.join(10)
            assert not th.is_alive()
            assert "e" in out and out["e"].code == 11601, out
            assert waiting_causal_ops(wires[sec]) == []
        # clients that give up (socketTimeoutMS) and close leave nothing parked: each read
        # is dropped when its connection closes (mongod kills a closed client's operation)
        for _ in range(3):
            with secondary_client(wires[sec], socketTimeoutMS=500, retryReads=False) as gc:
                with pytest.raises(pymongo.errors.PyMongoError):
                    read_at(gc, t)
        wait_until(lambda: waiting_causal_ops(wires[sec]) == [], 10,
                   what="the reads of closed clients dropped")
    finally:
        for i in others:
            procs[i].signal(signal.SIGCONT)
    # back in touch with the primary: the same read completes (by the no-op if needed)
    with secondary_client(wires[sec]) as sc:
        r = read_at(sc, t)
        assert r["cursor"]["firstBatch"] == [{"_id": 1}]
    # a read waiting when its member stops is answered InterruptedAtShutdown (quiesce 0)
    t2 = Timestamp(int(time.time()) + 30, 1)
    for i in others:
        procs[i].signal(signal.SIGSTOP)
    try:
        # no retry: the driver would retry an 11600 read on the stopped member
        with secondary_client(wires[sec], retryReads=False) as sc:
            out = {}

            def reader2():
                try:
                    out["r"] = read_at(sc, t2)
                except Exception as ex:  # noqa: BLE001 - checked below
                    out["e"] = ex
            th = threading.Thread(target=reader2)
            th.start()
            wait_until(lambda: waiting_causal_ops(wires[sec]), 10,
                       what="the waiting read in currentOp")
            assert procs[sec].stop() == 0
            th.join(10)
            assert not th.is_alive()
            # pymongo raises NotPrimaryError for the shutdown codes
            assert "e" in out and getattr(out["e"], "details", {}).get("code") == 11600, out
    finally:
        for i in others:
            procs[i].signal(signal.SIGCONT)


def test_causal_secondary_reads_through_the_proxy_on_a_sharded_collection(start_role,
                                                                           tmp_path):
    procs, wires, rs_uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs_uri})
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}"])
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/",
                             serverSelectionTimeoutMS=20000) as c:
        wait_until(lambda: c.admin.command("shardCollection", "app.s", key={"k": 1}), 30,
                   what="shardCollection through the proxy")
        coll = c.app.get_collection("s", read_preference=Secondary())
        with c.start_session(causal_consistency=True) as s:
            for i in range(60):
                c.app.s.insert_one({"_id": i, "k": i}, session=s)
                assert coll.find_one({"k": i}, session=s) == {"_id": i, "k": i}, i
                assert coll.count_documents({}, session=s) == i + 1, i
