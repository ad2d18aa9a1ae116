"""Cluster-time gossip (issue #20; common/clustertime.h, src/shard/clustertime.c,
src/proxy/clustertime.c): shards and proxies answer every command with $clusterTime and
operationTime as mongod and mongos do, take the $clusterTime of requests, and a shard's
next oplog entry sorts above every cluster time it was given. So one client's
sequential writes over several shards, whose clocks disagree by seconds (the test hook
STRIPEDB_TEST_CLOCK_OFFSET_MS), come out of a proxy's change stream in the order they
were acknowledged, through one proxy or two. A gossiped time more than a year ahead of
the wall clock is refused with mongod's ClusterTimeFailsRateLimiter (205)."""
import socket
import struct
import time

import bson
import pymongo
from bson.timestamp import Timestamp

from conftest import free_port
from migration_helpers import MigCluster

# the shards' clocks: a five seconds ahead, b right, c five seconds behind, so that
# without gossip a write to a then b then c would get ts a > b > c
OFFSETS = {"shard-a": 5000, "shard-b": 0, "shard-c": -5000}


def make_cluster(start_role, tmp_path, proxies=1):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=0, proxies=proxies,
                    coordinators=0)
    for sid, off in OFFSETS.items():
        port = free_port()
        d = tmp_path / sid
        d.mkdir()
        cl.shard_procs[sid] = start_role(
            ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"],
            env={"STRIPEDB_TEST_CLOCK_OFFSET_MS": str(off)})
        cl.shard_ids.append(sid)
        cl.shard_ports[sid] = port
        cl.meta_write({"addShard": sid, "uri": f"mongodb://127.0.0.1:{port}/"})
    # chunk i on shard i: k in [0,100) on a, [100,200) on b, [200,...) on c
    cl.shard_collection("app.c", {"k": 1}, split_points=[{"k": 100}, {"k": 200}],
                        shards=list(OFFSETS))
    return cl


def tok(event_id):
    """(ts, shard) of a resume token (src/common/changestream.h)."""
    b = bytes.fromhex(event_id["_data"])
    n = b[10]
    return int.from_bytes(b[1:9], "big"), b[11:11 + n].decode()


def drain(stream, n, timeout=60.0):
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(out) < n:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def ts_int(t):
    return (t.time << 32) | t.inc


def raw_command(port, doc):
    """One OP_MSG on a fresh socket, exactly doc (no driver adds or replaces
    $clusterTime): the reply document."""
    body = b"\x00\x00\x00\x00" + b"\x00" + bson.encode(doc)
    msg = struct.pack("<iiii", 16 + len(body), 1, 0, 2013) + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(msg)
        hdr = b""
        while len(hdr) < 16:
            hdr += s.recv(16 - len(hdr))
        ln = struct.unpack("<i", hdr[:4])[0]
        rest = b""
        while len(rest) < ln - 16:
            rest += s.recv(ln - 16 - len(rest))
    assert rest[4] == 0, rest[:8]  # flags, then a kind-0 section
    return bson.decode(rest[5:])


def check_in_order(cl, evs, n):
    assert len(evs) == n, len(evs)
    ids = [e["documentKey"]["_id"] for e in evs]
    assert ids == list(range(n)), ids[:20]
    toks = [tok(e["_id"]) for e in evs]
    assert [t[0] for t in toks] == sorted(t[0] for t in toks)
    # every shard took part, round robin
    assert [t[1] for t in toks[:6]] == ["shard-a", "shard-b", "shard-c"] * 2


def k_of(i):
    """The shard key of write i: round robin over shard-a, shard-b, shard-c."""
    return (i % 3) * 100 + (i // 3) % 100


def test_sequential_writes_over_skewed_shards_come_in_acknowledged_order(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        coll = cli.app.c
        n = 300
        with coll.watch(max_await_time_ms=300) as cs:
            for i in range(n):
                coll.insert_one({"_id": i, "k": k_of(i)})
            evs = drain(cs, n)
        check_in_order(cl, evs, n)
    finally:
        cl.close()


def test_sequential_writes_through_two_proxies_alternately(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path, proxies=2)
    try:
        c0, c1 = cl.proxy_client(0), cl.proxy_client(1)
        s0, s1 = c0.start_session(), c1.start_session()
        colls = [c0.app.c, c1.app.c]
        sessions = [s0, s1]
        n = 300
        with c0.app.c.watch(max_await_time_ms=300) as cs:
            prev = None
            for i in range(n):
                s = sessions[i % 2]
                if prev is not None and prev.cluster_time is not None:
                    # the application carries the causality from one client to the
                    # other, as drivers do within one client
                    s.advance_cluster_time(prev.cluster_time)
                colls[i % 2].insert_one({"_id": i, "k": k_of(i)}, session=s)
                prev = s
            evs = drain(cs, n)
        check_in_order(cl, evs, n)
        s0.end_session()
        s1.end_session()
        # one MongoClient given both proxies (pymongo spreads its commands over them and
        # gossips its cluster time itself)
        both = pymongo.MongoClient(
            f"mongodb://127.0.0.1:{cl.proxy_ports[0]},127.0.0.1:{cl.proxy_ports[1]}/",
            serverSelectionTimeoutMS=10000, retryWrites=False, localThresholdMS=1000)
        try:
            with c0.app.c.watch(max_await_time_ms=300) as cs:
                for i in range(n, n + 150):
                    both.app.c.insert_one({"_id": i, "k": k_of(i)})
                evs = drain(cs, 150)
            assert [e["documentKey"]["_id"] for e in evs] == list(range(n, n + 150))
        finally:
            both.close()
    finally:
        cl.close()


def test_replies_carry_cluster_time_and_operation_time(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        for port in [cl.proxy_ports[0]] + [cl.shard_ports[s] for s in OFFSETS]:
            r = raw_command(port, {"ping": 1, "$db": "admin"})
            assert r["ok"] == 1
            ct = r["$clusterTime"]
            assert isinstance(ct["clusterTime"], Timestamp)
            assert ct["signature"]["hash"] == b"\x00" * 20
            assert ct["signature"]["keyId"] == 0
            assert isinstance(r["operationTime"], Timestamp)
        # an error reply carries them too
        r = raw_command(cl.proxy_ports[0], {"noSuchCommand": 1, "$db": "admin"})
        assert r["ok"] == 0 and "$clusterTime" in r and "operationTime" in r
        # a write on a shard: operationTime and $clusterTime at or above its oplog ts
        sh = cl.shard_client("shard-a")
        r = sh.app.d.database.command({"insert": "d", "documents": [{"_id": 1}]})
        last = sh.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
        assert ts_int(r["operationTime"]) >= ts_int(last)
        assert ts_int(r["$clusterTime"]["clusterTime"]) >= ts_int(last)
        # through the proxy: the proxy's time is at or above the shard's write
        r = cl.proxy_client().app.command({"insert": "c", "documents": [{"_id": 1, "k": 1}]})
        last = sh.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
        assert ts_int(r["$clusterTime"]["clusterTime"]) >= ts_int(last)
        assert ts_int(r["operationTime"]) >= ts_int(last)
        # a causally consistent session (pymongo sends readConcern afterClusterTime with
        # its reads): through the proxy and directly to a shard, reads see the writes
        for j, c in enumerate((cl.proxy_client(), sh)):
            with c.start_session(causal_consistency=True) as s:
                for i in range(10 + 20 * j, 16 + 20 * j):
                    c.app.c.insert_one({"_id": i, "k": k_of(i)}, session=s)
                    assert s.operation_time is not None
                    assert c.app.c.find_one({"_id": i}, session=s)["_id"] == i
                    assert c.app.c.count_documents({"_id": i}, session=s) == 1
    finally:
        cl.close()


def test_gossiped_time_raises_the_next_oplog_ts_and_far_future_is_refused(start_role,
                                                                          tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        now = int(time.time())
        for port in (cl.shard_ports["shard-c"], cl.proxy_ports[0]):
            far = Timestamp(now + 366 * 86400, 1)
            r = raw_command(port, {"ping": 1, "$db": "admin",
                                   "$clusterTime": {"clusterTime": far, "signature": {
                                       "hash": b"\x00" * 20, "keyId": 0}}})
            assert r["ok"] == 0 and r["code"] == 205, r
            assert r["codeName"] == "ClusterTimeFailsRateLimiter"
            assert r["errmsg"].startswith(f"New $clusterTime, {now + 366 * 86400}, is too "
                                          "far from this node's wall clock time, "), r
            # malformed
            r = raw_command(port, {"ping": 1, "$db": "admin", "$clusterTime": 5})
            assert r["ok"] == 0 and r["code"] == 14, r
        # an hour ahead is taken: shard-c (its clock 5 s behind) writes above it, even
        # when the time came with a read
        ahead = Timestamp(now + 3600, 7)
        port = cl.shard_ports["shard-c"]
        r = raw_command(port, {"ping": 1, "$db": "admin",
                               "$clusterTime": {"clusterTime": ahead, "signature": {
                                   "hash": b"\x00" * 20, "keyId": 0}}})
        assert r["ok"] == 1 and r["$clusterTime"]["clusterTime"] >= ahead, r
        r = raw_command(port, {"insert": "z", "documents": [{"_id": 1}], "$db": "app"})
        assert r["ok"] == 1 and r["n"] == 1, r
        sh = cl.shard_client("shard-c")
        last = sh.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
        assert ts_int(last) > ts_int(ahead), (last, ahead)
        # the proxy passes a client's time on to the shards it writes to
        ahead2 = Timestamp(now + 7200, 3)
        r = raw_command(cl.proxy_ports[0], {
            "insert": "c", "documents": [{"_id": 5, "k": 150}], "$db": "app",
            "$clusterTime": {"clusterTime": ahead2, "signature": {"hash": b"\x00" * 20,
                                                                  "keyId": 0}}})
        assert r["ok"] == 1 and r["n"] == 1, r
        assert r["$clusterTime"]["clusterTime"] >= ahead2
        shb = cl.shard_client("shard-b")
        last = shb.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
        assert ts_int(last) > ts_int(ahead2), (last, ahead2)
    finally:
        cl.close()


def test_shard_added_later_is_raised_above_the_cluster_time(start_role, tmp_path):
    """addShard through a proxy notes the new shard above the proxy's cluster time, so a
    shard whose clock is far behind does not write below what streams have merged."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=1, proxies=1, coordinators=0)
    try:
        cli = cl.proxy_client()
        cli.app.c.insert_one({"_id": 1})
        ct = cli.admin.command("ping")["$clusterTime"]["clusterTime"]
        port = free_port()
        d = tmp_path / "late"
        d.mkdir()
        cl.shard_procs["late"] = start_role(
            ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"],
            env={"STRIPEDB_TEST_CLOCK_OFFSET_MS": "-60000"})
        r = cli.admin.command({"addShard": f"127.0.0.1:{port}", "name": "late"})
        assert r["shardAdded"] == "late"
        late = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
        try:
            notes = list(late.local["oplog.rs"].find({"op": "n"}))
            assert notes and ts_int(notes[-1]["ts"]) > ts_int(ct), (notes, ct)
        finally:
            late.close()
    finally:
        cl.close()


KEY = "c3RyaXBlZGItdGVzdC1jbHVzdGVyLWtleQ"


def test_keyed_cluster_signs_and_an_authenticated_proxy_verifies(start_role, tmp_path):
    """With a cluster key: shards and proxies sign their cluster time (keyId 1); a proxy
    with --auth takes a client's time above its own only with a valid signature (any
    proxy's: the key is shared), else 204 TimeProofMismatch; an unauthenticated hello's
    time does not move a keyed shard's clock."""
    import os
    from conftest import wait_until
    keyfile = tmp_path / "cluster.key"
    keyfile.write_text(KEY + "\n")
    os.chmod(keyfile, 0o600)
    key = f"--cluster-key-file={keyfile}"
    mport, rport, sport = free_port(), free_port(), free_port()
    (tmp_path / "meta").mkdir()
    (tmp_path / "shard").mkdir()
    start_role(["--role=metadata", "--node-id=1", f"--data-dir={tmp_path / 'meta'}",
                f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{rport}",
                f"--bootstrap-members=1@127.0.0.1:{rport}", "--raft-election-timeout-ms=300",
                key])
    start_role(["--role=shard", f"--listen=127.0.0.1:{sport}",
                f"--data-dir={tmp_path / 'shard'}", key])

    def member(port):
        return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                                   username="__system", password=KEY, authSource="admin",
                                   authMechanism="SCRAM-SHA-256", retryWrites=False)
    meta = member(mport)
    wait_until(lambda: meta.admin.command("metadataStatus")["ready"], 20, what="leader")
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{sport}/"})
    meta.admin.command({"createTenant": "T"})
    meta.admin.command({"createDatabase": "tdb", "tenant": "T"})
    meta.admin.command({"createUser": "alice", "tenant": "T", "password": "alice-pw"})
    pports = [free_port(), free_port()]
    for p in pports:
        start_role(["--role=proxy", f"--listen=127.0.0.1:{p}",
                    f"--metadata=127.0.0.1:{mport}", key])
    alice = [pymongo.MongoClient(f"mongodb://127.0.0.1:{p}/", directConnection=True,
                                 username="alice", password="alice-pw", authSource="admin",
                                 retryWrites=False) for p in pports]
    sh = member(sport)
    try:
        wait_until(lambda: alice[0].tdb.c.insert_one({"_id": 0}), 20, what="first write")
        wait_until(lambda: alice[1].tdb.c.find_one({"_id": 0}), 20, what="second proxy")
        # signed replies, shard and proxy
        for r in (sh.admin.command("ping"), alice[0].tdb.command("ping")):
            sig = r["$clusterTime"]["signature"]
            assert sig["keyId"] == 1 and sig["hash"] != b"\x00" * 20, r
        # proxy 0's signed time, brought by the client to proxy 1: accepted
        s0, s1 = alice[0].start_session(), alice[1].start_session()
        alice[0].tdb.c.insert_one({"_id": 1}, session=s0)
        for _ in range(3):  # proxy 0's clock moves ahead of proxy 1's
            alice[0].tdb.c.insert_one({"_id": 2 + _}, session=s0)
        s1.advance_cluster_time(s0.cluster_time)
        alice[1].tdb.c.insert_one({"_id": 10}, session=s1)
        # a forged (unsigned) time above the proxy's clock: 204
        s2 = alice[1].start_session()
        now = int(time.time())
        s2.advance_cluster_time({"clusterTime": Timestamp(now + 3600, 1),
                                 "signature": {"hash": b"\x00" * 20, "keyId": 0}})
        try:
            alice[1].tdb.c.insert_one({"_id": 11}, session=s2)
            assert False, "a forged cluster time was accepted"
        except pymongo.errors.OperationFailure as e:
            assert e.code == 204 and e.details["codeName"] == "TimeProofMismatch", e.details
        # an unauthenticated connection's time (hello, ping) does not move the shard's clock
        before = sh.admin.command("ping")["$clusterTime"]["clusterTime"]
        r = raw_command(sport, {"ping": 1, "$db": "admin", "$clusterTime": {
            "clusterTime": Timestamp(now + 7200, 1),
            "signature": {"hash": b"\x00" * 20, "keyId": 0}}})
        assert r["ok"] == 1, r
        after = sh.admin.command("ping")["$clusterTime"]["clusterTime"]
        assert after.time < now + 7200 and after >= before, (before, after)
        for s in (s0, s1, s2):
            s.end_session()
    finally:
        for c in alice + [sh, meta]:
            c.close()


def test_streams_keep_delivering_after_a_time_gossiped_far_ahead(start_role, tmp_path):
    """A review (issue #20): a $clusterTime months ahead, accepted from any client without a
    cluster key (as mongod without auth), raised one shard's writes there; the proxy's notes
    to the idle shards (appendOplogNote up to that time) were refused for being more than an
    hour ahead, so the stream released nothing. The note's bound is now the gossip's. And a
    floor at the bound with increment 0xFFFFFFFF must not make the shards answer a time the
    cluster then refuses (205) to well-behaved clients."""
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        coll = cli.app.c
        now = int(time.time())
        with coll.watch(max_await_time_ms=300) as cs:
            r = raw_command(cl.proxy_ports[0], {
                "ping": 1, "$db": "admin",
                "$clusterTime": {"clusterTime": Timestamp(now + 364 * 86400, 5), "signature": {
                    "hash": bson.Binary(b"\0" * 20), "keyId": bson.Int64(0)}}})
            assert r["ok"] == 1, r
            for i in range(6):
                coll.insert_one({"_id": i, "k": k_of(i)})
            evs = drain(cs, 6)
        assert [e["documentKey"]["_id"] for e in evs] == list(range(6))
        # a floor near the bound with the largest increment: the writes after it carry into
        # the next second, and clients gossiping that back are not refused (20 s under the
        # bound: these shards' clocks are 10 s apart, and a node refuses what is a year
        # ahead of its own clock; the exact edge is tests/unit/test_common_clustertime.c)
        edge = Timestamp(now + 365 * 86400 - 20, 0xFFFFFFFF)
        r = raw_command(cl.proxy_ports[0], {
            "ping": 1, "$db": "admin",
            "$clusterTime": {"clusterTime": edge, "signature": {
                "hash": bson.Binary(b"\0" * 20), "keyId": bson.Int64(0)}}})
        assert r["ok"] == 1, r
        for i in range(6, 30):
            coll.insert_one({"_id": i, "k": k_of(i)})  # pymongo gossips the replies' time
        assert coll.count_documents({}) == 30
    finally:
        cl.close()
