"""The metadata role (issue #5): a Raft group of 3 or 5 real processes on loopback.

Writes survive SIGKILL of the leader; a new leader is elected and serves, and the driver
finds it with replicaSet=stripedb-meta; a killed member catches up from the log and from a
snapshot; membership add/remove and leadership transfer; a minority member refuses writes;
routing reads and the routing-version long poll; SCRAM verifiers never store the password.
"""
import os
import signal
import threading
import time

import pymongo
from bson.max_key import MaxKey
from bson.min_key import MinKey
import pytest
from pymongo.errors import NotMasterError as NotPrimaryError, OperationFailure

from prometheus_client.parser import text_string_to_metric_families

from conftest import http_get, wait_until
from metadata_cluster import Cluster, scram_stored_key


def seed_routing(c):
    c.write("addShard", "shard-a", uri="mongodb://a.example:27017")
    c.write("addShard", "shard-b", uri="mongodb://b.example:27017")
    c.write("createDatabase", "app")
    r = c.write("shardCollection", "app.users", key={"uid": 1},
                splitPoints=[{"uid": 100}, {"uid": 200}])
    assert r["chunks"] == 3
    return r["routingVersion"]


@pytest.mark.parametrize("n", [3, 5])
def test_writes_survive_leader_kill_and_driver_finds_new_leader(start_role, tmp_path, n):
    c = Cluster(start_role, tmp_path, n)
    rs = c.rs_client()
    assert rs.admin.command("addShard", "shard-a", uri="mongodb://a:1")["shardAdded"] == "shard-a"
    assert rs.admin.command("addShard", "shard-b", uri="mongodb://b:1")["ok"] == 1.0
    old = c.leader()
    # every member lists every member in hello, and names the leader as primary
    hello = c.members[-1].cmd("hello")
    assert hello["setName"] == "stripedb-meta"
    assert sorted(hello["hosts"]) == sorted(m.wire for m in c.members)
    wait_until(lambda: c.members[-1].cmd("hello").get("primary") == old.wire,
               what="primary in hello")

    c.kill(old)
    new = c.leader(exclude=[old])
    assert new is not old

    # the driver, given every member, finds the new leader by itself
    def add_after():
        try:
            return rs.admin.command("addShard", "shard-c", uri="mongodb://c:1")["ok"] == 1.0
        except OperationFailure as e:
            if e.code == 11000:  # a retried attempt had committed
                return True
            raise
        except pymongo.errors.AutoReconnect:
            return False
    wait_until(add_after, 30, what="a write through the driver after failover")
    shards = [s["id"] for s in rs.admin.command("listShards")["shards"]]
    assert shards == ["shard-a", "shard-b", "shard-c"]
    hello = new.cmd("hello")
    assert hello["isWritablePrimary"] is True
    assert hello["primary"] == new.wire

    # the killed member restarts and catches up from its log
    c.restart(old)
    h = c.converged(c.members)
    assert all(m.status()["stateHash"] == h for m in c.members)
    st = old.status()
    assert st["state"] == "follower"
    old_shards = [s["id"] for s in old.cmd("listShards", allowStale=True)["shards"]]
    assert old_shards == ["shard-a", "shard-b", "shard-c"]
    rs.close()


def test_catch_up_from_snapshot(start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3, snapshot_threshold=8)
    seed_routing(c)
    leader = c.leader()
    lagging = next(m for m in c.members if m is not leader)
    c.kill(lagging)
    for i in range(40):
        c.write("registerMigration", f"bulk-{i}", ns="app.users")
    lst = leader.status()
    assert lst["snapshotIndex"] > 0
    c.restart(lagging)
    h = c.converged(c.members)
    st = lagging.status()
    assert st["stateHash"] == h
    # its log now starts at a snapshot it received (it missed entries that were compacted)
    assert st["snapshotIndex"] > 0
    assert "restored snapshot" in lagging.proc.tail(200000)
    migs = lagging.cmd("listMigrations", allowStale=True)["migrations"]
    assert len(migs) == 40
    # and a restart of a member with a snapshot on disk does not re-apply anything
    c.kill(lagging)
    c.restart(lagging)
    assert c.converged(c.members) == h


@pytest.mark.parametrize("n", [3, 5])
def test_minority_refuses_writes(start_role, tmp_path, n):
    c = Cluster(start_role, tmp_path, n)
    seed_routing(c)
    leader = c.leader()
    # the minority: the leader and, with 5 members, one follower; the rest is stopped
    minority = [leader] + [m for m in c.members if m is not leader][:(n - 1) // 2 - 1]
    stopped = [m for m in c.members if m not in minority]
    assert len(minority) == (n - 1) // 2 and len(stopped) == n // 2 + 1
    for m in stopped:
        m.proc.signal(signal.SIGSTOP)
    try:
        # cut off from the majority, the old leader steps down
        wait_until(lambda: not any(m.status()["ready"] for m in minority), 20,
                   what="the isolated leader to step down")
        for m in minority:
            # (pymongo 3 raises NotMasterError for NotWritablePrimary)
            with pytest.raises(NotPrimaryError) as ei:
                m.cmd("addShard", "shard-x", uri="mongodb://x:1")
            assert ei.value.details["code"] == 10107
            assert "not primary" in ei.value.details["errmsg"]
            assert m.cmd("hello")["isWritablePrimary"] is False
            # a direct connection reads with primaryPreferred: served from local state
            assert [s["id"] for s in m.cmd("listShards")["shards"]] == ["shard-a", "shard-b"]
            # routing reads still answer from local state, with the version attached
            rt = m.cmd("getRoutingTable", "app.users")
            assert rt["routingVersion"] == 1 and len(rt["chunks"]) == 3
    finally:
        for m in stopped:
            m.proc.signal(signal.SIGCONT)
    # the majority is back: writes go on and nothing from the minority leaked in
    c.write("addShard", "shard-y", uri="mongodb://y:1")
    c.converged(c.members)
    shards = [s["id"] for s in c.leader().cmd("listShards")["shards"]]
    assert shards == ["shard-a", "shard-b", "shard-y"]


def test_membership_add_transfer_remove(start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3)
    seed_routing(c)
    new = c.add_member()  # id 4, no bootstrap list
    leader = c.leader()
    r = leader.cmd("addMember", new.id, raft=new.raft, wire=new.wire)
    assert sorted(m["id"] for m in r["members"]) == [1, 2, 3, 4]

    def voter4():
        st = leader.status()
        return any(m["id"] == 4 and m["role"] == "voter" for m in st["members"])
    wait_until(voter4, 20, what="member 4 to become a voter")
    c.wait_registered()
    c.converged(c.members)

    # leadership transfer to the new member
    r = c.leader().cmd("transferLeadership", new.id)
    assert r["leaderId"] == new.id
    assert c.leader() is new

    # remove member 1 through the new leader; the group of 3 goes on
    victim = c.members[0]
    r = new.cmd("removeMember", victim.id)
    assert sorted(m["id"] for m in r["members"]) == [2, 3, 4]
    c.kill(victim)
    c.write("addShard", "shard-z", uri="mongodb://z:1")
    rest = c.members[1:]
    c.converged(rest)
    assert sorted(new.cmd("hello")["hosts"]) == sorted(m.wire for m in rest)
    assert [m["id"] for m in new.cmd("listMembers")["registered"]] == [2, 3, 4]


def test_routing_reads_and_long_poll(start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3)
    v = seed_routing(c)
    assert v == 1
    leader = c.leader()
    follower = next(m for m in c.members if m is not leader)
    wait_until(lambda: follower.cmd("getRoutingTable", "app.users")["routingVersion"] == 1,
               what="follower routing version")
    rt = follower.cmd("getRoutingTable", "app.users")
    assert [(ch["shard"], ch["token"]) for ch in rt["chunks"]] == [
        ("shard-a", 1), ("shard-b", 1), ("shard-a", 1)]
    assert rt["chunks"][0]["min"] == {"uid": MinKey()}
    assert rt["chunks"][0]["max"] == {"uid": 100}
    assert rt["chunks"][2]["max"] == {"uid": MaxKey()}
    assert follower.cmd("getRoutingTable", "app.users", sinceVersion=1)["chunks"] == []

    # a long poll on a follower is answered when the version moves
    out = {}

    def poll():
        cl = pymongo.MongoClient(follower.wire, directConnection=True, socketTimeoutMS=30000)
        out["r"] = cl.admin.command("waitRoutingVersion", 1, gt=1, timeoutMS=20000)
        cl.close()
    t = threading.Thread(target=poll)
    t.start()
    # poll until the follower has parked it, without sleeping as synchronisation: the
    # answer can only come after the split below commits
    chunk_id = rt["chunks"][1]["id"]
    r = c.write("splitChunk", chunk_id, at={"uid": 150})
    assert r["routingVersion"] == 2
    t.join(30)
    assert out["r"]["routingVersion"] == 2 and out["r"]["changed"] is True
    # timeout path
    r = follower.cmd("waitRoutingVersion", 1, gt=2, timeoutMS=100)
    assert r["timedOut"] is True and r["routingVersion"] == 2
    # compare-and-set on the version token
    r = c.write("setChunkShard", chunk_id, shard="shard-b", expectToken=1, token=2)
    assert r["token"] == 2 and r["routingVersion"] == 3
    with pytest.raises(OperationFailure) as ei:
        c.leader().cmd("setChunkShard", chunk_id, shard="shard-a", expectToken=1, token=3)
    assert ei.value.code == 112
    assert ei.value.details["currentToken"] == 2
    # a fraction in an integer argument is refused by the leader before proposing (FailedToParse
    # 9, common/bsonget.h): apply still truncates 3.5 to 3 for entries earlier leaders wrote,
    # so it must never reach the log; nothing applied
    with pytest.raises(OperationFailure) as ei:
        c.leader().cmd("setChunkShard", chunk_id, shard="shard-a", expectToken=2, token=3.5)
    assert ei.value.code == 9
    assert c.leader().cmd("getRoutingTable", "app.users")["routingVersion"] == 3

    # /metrics of the leader
    ldr = c.leader()

    def metrics():
        st, body = http_get(ldr.http_port, "/metrics")
        assert st == 200
        vals = {}
        for fam in text_string_to_metric_families(body.decode()):
            for smp in fam.samples:
                if smp.name.startswith("stripedb_metadata_"):
                    vals[smp.name] = smp.value
        return vals
    wait_until(lambda: metrics().get("stripedb_metadata_routing_version") == 3,
               what="routing version gauge")
    m = metrics()
    assert m["stripedb_metadata_is_leader"] == 1
    assert m["stripedb_metadata_commits_total"] >= 1
    assert m["stripedb_metadata_commit_seconds_count"] >= 1


def test_scram_verifier_never_stores_the_password(start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3)
    c.write("createTenant", "acme")
    c.write("setQuota", "acme", quota={"opsPerSec": 500})
    secret = "correct-horse-battery-staple-42"
    c.write("createUser", "alice", tenant="acme", password=secret)
    u = c.leader().cmd("getUser", "alice")["user"]
    assert u["mechanism"] == "SCRAM-SHA-256"
    assert u["iterations"] == 15000
    assert u["storedKey"] == scram_stored_key(secret, u["salt"], u["iterations"])
    # a name the verifier cannot carry is the caller's error, not the service's
    for bad in ("", "u" * 300):
        e = c.write("createUser", bad, tenant="acme", password="pw", ok_codes=(2,))
        assert (e["code"], e["codeName"]) == (2, "BadValue"), e
        assert "the user name must be 1 to 255 bytes" in e["errmsg"]
    e = c.write("createUser", "__system", tenant="acme", password="pw", ok_codes=(2,))
    assert "reserved for cluster members" in e["errmsg"], e
    c.converged(c.members)
    for m in c.members:
        for root, _, files in os.walk(m.data_dir):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    assert secret.encode() not in fh.read(), f"password found in {f}"


def test_start_errors_are_one_clear_line(tmp_path):
    import socket
    import subprocess
    from conftest import BIN, free_port
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    base = ["--role=metadata", f"--data-dir={tmp_path / 'd'}",
            f"--listen=127.0.0.1:{free_port()}"]
    r = subprocess.run([BIN] + base + ["--node-id=abc", f"--raft-listen=127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, env=env, timeout=30)
    # a bad flag value is a usage error: exit 2 and exactly one line
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["stripedb: metadata: --node-id must be a positive integer, got abc"]
    # the raft port is taken: start fails (and the process exits instead of hanging)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    r = subprocess.run([BIN] + base + ["--node-id=1", f"--raft-listen=127.0.0.1:{port}",
                                       f"--bootstrap-members=1@127.0.0.1:{port}"],
                       capture_output=True, text=True, env=env, timeout=30)
    s.close()
    assert r.returncode == 1
    assert f"stripedb: metadata: raft start on 127.0.0.1:{port}: I/O error" in r.stderr
