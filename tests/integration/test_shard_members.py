"""Shard replica sets, membership online (issue #15): `stripedb ctl shard member
add|remove|transfer|status` against real 3-member sets, through the primary's addMember,
removeMember and transferLeadership commands (src/shard/members.c).

Jepsen-style: every write a client saw acknowledged must be on every member afterwards,
the added one included.
"""
import json
import os
import subprocess

import pymongo
import pytest
from pymongo.errors import NotMasterError as NotPrimaryError

from conftest import BIN, free_port, wait_until
from test_shard_replset import SET, direct, primary_index, start_set

# a shard given by its address needs no --metadata
CTL = [BIN, "ctl", "--timeout-ms=3000"]


def ctl(*args):
    env = {k: v for k, v in os.environ.items() if k != "STRIPEDB_METADATA"}
    return subprocess.run(CTL + list(args), capture_output=True, text=True, timeout=60, env=env)


def status(port):
    with direct(port) as c:
        return c.admin.command("replSetGetStatus")


def write_acked(uri, ids, retry=False):
    """Insert documents {_id: i}; return the ids whose insert was acknowledged (an error
    fails the test). retry: as retryable writes (lsid/txnNumber, the driver's one retry,
    applied once), as drivers send by default."""
    acked = []
    with pymongo.MongoClient(uri, retryWrites=retry, serverSelectionTimeoutMS=10000) as c:
        for i in ids:
            c.app.c.insert_one({"_id": i, "v": "x" * 32})
            acked.append(i)
    return acked


def start_joiner(start_role, tmp_path, wires, node_id, members):
    """A fresh member started with the set's list (without its own id): it waits to be
    added. Returns (proc, wire port, raft port)."""
    wire, raft = free_port(), free_port()
    p = start_role(["--role=shard", f"--replica-set={SET}", f"--node-id={node_id}",
                    f"--data-dir={tmp_path / f'm{node_id}'}", f"--listen=127.0.0.1:{wire}",
                    f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members={members}",
                    "--raft-tls=disabled", "--raft-election-timeout-ms=500",
                    "--shutdown-quiesce-ms=0"])
    return p, wire, raft


def members_of(wires):
    """--bootstrap-members of the set started by start_set (read from the primary)."""
    st = status(wires[primary_index(wires)])
    return ",".join(f"{m['id']}@{m['raft']}" for m in st["members"])


@pytest.mark.parametrize("compaction", [False, True])
def test_add_member_online_catches_up_and_serves(start_role, tmp_path, compaction):
    # with compaction the set's log no longer starts at 1: the new member installs a
    # snapshot copied from the member that sent it
    extra = ["--raft-snapshot-threshold=32"] if compaction else []
    procs, wires, uri = start_set(start_role, tmp_path, extra=extra)
    acked = write_acked(uri, range(200))
    p4, w4, r4 = start_joiner(start_role, tmp_path, wires, 4, members_of(wires))
    # before the add the new member is in no configuration and holds nothing
    assert status(w4)["members"] == []
    r = ctl("--json", "shard", "member", "add", uri, "4", f"--raft=127.0.0.1:{r4}",
            f"--wire=127.0.0.1:{w4}")
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)
    assert sorted(m["id"] for m in reply["members"]) == [1, 2, 3, 4]
    assert {m["role"] for m in reply["members"] if m["id"] == 4} == {"voter"}
    acked += write_acked(uri, range(200, 300))
    # hello lists the new member; it applied everything the primary did
    def caught_up():
        pst = status(wires[primary_index(wires)])
        st = status(w4)
        return st["applied"] >= pst["applied"] and st["state"] == "SECONDARY"
    wait_until(caught_up, 30, interval=0.1, what="the new member caught up")
    with direct(wires[primary_index(wires)]) as c:
        assert f"127.0.0.1:{w4}" in c.admin.command("hello")["hosts"]
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{w4}/?directConnection=true",
                             readPreference="secondaryPreferred") as c:
        got = sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1}))
    assert got == sorted(acked)
    # ctl shard member status lists 4 reachable members with one primary
    r = ctl("--json", "shard", "member", "status", uri)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert len(st["members"]) == 4 and all(m["reachable"] for m in st["members"])
    assert sum(m["primary"] for m in st["members"]) == 1
    assert all(m["lag"] >= 0 for m in st["members"])


def test_add_member_whose_snapshot_copy_takes_longer_than_a_catch_up_round(start_role,
                                                                          tmp_path):
    """A member being added answers nothing while it installs a snapshot (it copies
    shard.db, as long as the data needs); libraft gives a promotee up when a catch-up round
    lasts over 5 s. The copy is slowed past that (every stripedbSnapshotFile command the
    sending member receives is held 2.5 s by the failCommand fail point): the add must
    still complete and the member hold everything (src/shard/repl_view.c promotion_watch)."""
    procs, wires, uri = start_set(start_role, tmp_path,
                                  extra=["--raft-snapshot-threshold=32",
                                         "--enable-test-commands"])
    acked = write_acked(uri, range(200))
    for w in wires:
        with direct(w) as c:
            c.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 3},
                             "data": {"failCommands": ["stripedbSnapshotFile"],
                                      "blockConnection": True, "blockTimeMS": 2500}})
    p4, w4, r4 = start_joiner(start_role, tmp_path, wires, 4, members_of(wires))
    r = ctl("shard", "member", "add", uri, "4", f"--raft=127.0.0.1:{r4}",
            f"--wire=127.0.0.1:{w4}")
    assert r.returncode == 0, r.stderr
    # the copy was held: three snapshot-file commands blocked (open, read, close)
    fired = 0
    for w in wires:
        with direct(w) as c:
            fired += c.admin.command({"configureFailPoint": "failCommand",
                                      "mode": "off"})["count"]
    assert fired == 3, fired
    assert "installed a snapshot from another member" in open(p4.log_path).read()
    wait_until(lambda: status(w4)["applied"] >= status(wires[primary_index(wires)])["applied"],
               30, interval=0.1, what="the new member caught up")
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{w4}/?directConnection=true",
                             readPreference="secondaryPreferred") as c:
        assert sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1})) == sorted(acked)


def test_add_refuses_duplicate_id_and_address(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    before = status(wires[primary_index(wires)])["members"]
    raft2 = next(m["raft"] for m in before if m["id"] == 2)
    r = ctl("shard", "member", "add", uri, "2", f"--raft=127.0.0.1:{free_port()}",
            f"--wire=127.0.0.1:{free_port()}")
    assert r.returncode == 1
    assert "member id 2 is already in the replica set" in r.stderr, r.stderr
    r = ctl("shard", "member", "add", uri, "9", f"--raft={raft2}",
            f"--wire=127.0.0.1:{free_port()}")
    assert r.returncode == 1
    assert f"raft address {raft2} is already member 2" in r.stderr, r.stderr
    # usage errors exit 2 without touching the set
    assert ctl("shard", "member", "add", uri, "9").returncode == 2
    assert ctl("shard", "member", "frobnicate", uri).returncode == 2
    # a shard named by its id is looked up in metadata: that needs --metadata
    r = ctl("shard", "member", "status", "shard-a")
    assert r.returncode == 2 and "--metadata" in r.stderr, r.stderr
    assert ctl("shard", "list").returncode == 2
    # nothing joined
    assert status(wires[primary_index(wires)])["members"] == before
    # on a secondary the command itself answers NotWritablePrimary with the primary
    sec = next(p for i, p in enumerate(wires) if i != primary_index(wires))
    with direct(sec) as c:
        with pytest.raises(NotPrimaryError) as ei:
            c.admin.command({"addMember": 7, "raft": f"127.0.0.1:{free_port()}",
                             "wire": f"127.0.0.1:{free_port()}"})
        assert ei.value.details["code"] == 10107
        assert ei.value.details["primary"] in uri


def test_add_refuses_a_member_of_another_set_and_rolls_back_one_that_cannot_vote(
        start_role, tmp_path):
    """The primary asks the new member (hello at --wire) who it is before it joins: a
    member started with another --replica-set, or a running set of its own (whose
    acknowledged data the set's snapshot would replace), is refused and nothing joins; a
    member that answers but cannot be reached on its raft address is added as a spare,
    never catches up, and is removed again."""
    procs, wires, uri = start_set(start_role, tmp_path)
    before = status(wires[primary_index(wires)])["members"]
    members = members_of(wires)
    # 0. a URI naming another set than its hosts': refused by ctl, before any change
    wrong = f"mongodb://127.0.0.1:{wires[0]}/?replicaSet=shard-b"
    for args in (["status", wrong], ["add", wrong, "8", f"--raft=127.0.0.1:{free_port()}",
                                     f"--wire=127.0.0.1:{free_port()}"]):
        r = ctl("shard", "member", *args)
        assert r.returncode == 1, r.stdout
        assert f"is a member of replica set '{SET}', not 'shard-b'" in r.stderr, r.stderr
    # 1. started with another set's name (the documented way otherwise)
    wire, raft = free_port(), free_port()
    start_role(["--role=shard", "--replica-set=other-set", "--node-id=4",
                f"--data-dir={tmp_path / 'other'}", f"--listen=127.0.0.1:{wire}",
                f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members={members}",
                "--raft-tls=disabled", "--shutdown-quiesce-ms=0"])
    r = ctl("shard", "member", "add", uri, "4", f"--raft=127.0.0.1:{raft}",
            f"--wire=127.0.0.1:{wire}")
    assert r.returncode == 1, r.stderr
    assert "runs with --replica-set=other-set, not " + SET in r.stderr, r.stderr
    # 2. a running one-member set of the same name holding acknowledged data of its own
    wire2, raft2 = free_port(), free_port()
    start_role(["--role=shard", f"--replica-set={SET}", "--node-id=5",
                f"--data-dir={tmp_path / 'own'}", f"--listen=127.0.0.1:{wire2}",
                f"--raft-listen=127.0.0.1:{raft2}", "--raft-tls=disabled",
                "--shutdown-quiesce-ms=0"])
    own = f"mongodb://127.0.0.1:{wire2}/?directConnection=true"
    with pymongo.MongoClient(own, serverSelectionTimeoutMS=10000) as c:
        wait_until(lambda: c.admin.command("hello").get("isWritablePrimary"), 30,
                   what="the one-member set's primary")
        c.own.data.insert_one({"_id": "mine"})
    r = ctl("shard", "member", "add", uri, "5", f"--raft=127.0.0.1:{raft2}",
            f"--wire=127.0.0.1:{wire2}")
    assert r.returncode == 1, r.stderr
    assert "primary of a running replica set of its own" in r.stderr, r.stderr
    with pymongo.MongoClient(own, serverSelectionTimeoutMS=10000) as c:
        assert c.own.data.count_documents({}) == 1  # its data is untouched
    # 3. nobody at --wire
    r = ctl("shard", "member", "add", uri, "6", f"--raft=127.0.0.1:{free_port()}",
            f"--wire=127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "does not answer" in r.stderr, r.stderr
    # --wire is required
    assert ctl("shard", "member", "add", uri, "6", f"--raft=127.0.0.1:{free_port()}"
               ).returncode == 2
    assert status(wires[primary_index(wires)])["members"] == before
    # 4. a right joiner, but the raft address given is not where it listens: added as a
    # spare, never catches up, removed again
    p7, w7, r7 = start_joiner(start_role, tmp_path, wires, 7, members)
    r = ctl("shard", "member", "add", uri, "7", f"--raft=127.0.0.1:{free_port()}",
            f"--wire=127.0.0.1:{w7}")
    assert r.returncode == 1, r.stdout
    assert "removed again, nothing joined" in r.stderr, r.stderr
    wait_until(lambda: status(wires[primary_index(wires)])["members"] == before, 10,
               what="the configuration back to the three members")


def test_transfer_then_remove(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    acked = write_acked(uri, range(50))
    old = primary_index(wires)
    target = (old + 1) % 3 + 1  # a node id other than the primary's (ids are index + 1)
    r = ctl("--json", "shard", "member", "transfer", uri, str(target))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["leaderId"] == target
    wait_until(lambda: primary_index(wires) == target - 1, 15, interval=0.1,
               what="the new primary ready")
    acked += write_acked(uri, range(50, 100))
    # the primary cannot remove itself: transfer first
    r = ctl("shard", "member", "remove", uri, str(target))
    assert r.returncode == 1 and "is the primary" in r.stderr, r.stderr
    # an id not in the set
    r = ctl("shard", "member", "remove", uri, "42")
    assert r.returncode == 1 and "not in the replica set" in r.stderr, r.stderr
    gone = old + 1
    r = ctl("shard", "member", "remove", uri, str(gone))
    assert r.returncode == 0, r.stderr
    pst = status(wires[target - 1])
    assert sorted(m["id"] for m in pst["members"]) == sorted({1, 2, 3} - {gone})
    # the two remaining members still commit writes and hold every acknowledged one
    acked += write_acked(uri, range(100, 150))
    with direct(wires[target - 1]) as c:
        assert f"127.0.0.1:{wires[gone - 1]}" not in c.admin.command("hello")["hosts"]
    rest = [w for i, w in enumerate(wires) if i + 1 != gone]
    def same():
        return len({status(w)["applied"] for w in rest}) == 1
    wait_until(same, 15, interval=0.1, what="the remaining members applied the same")
    for w in rest:
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{w}/?directConnection=true",
                                 readPreference="secondaryPreferred") as c:
            assert sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1})) == sorted(acked)


def _metrics(port):
    from prometheus_client.parser import text_string_to_metric_families
    from conftest import http_get
    st, body = http_get(port, "/metrics")
    assert st == 200
    return {s.name + str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_metrics_show_state_primary_and_lag(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    write_acked(uri, range(20))
    pi = primary_index(wires)
    pst = status(wires[pi])

    def sampled():
        m = _metrics(procs[pi].http_port)
        return (m.get("stripedb_shard_raft_state[]") == 2
                and m.get("stripedb_shard_raft_last_index[]", 0) >= pst["applied"]
                and all(f"stripedb_shard_member_lag_entries[('member', '{i}')]" in m
                        for i in (1, 2, 3)))
    wait_until(sampled, 10, interval=0.2, what="the primary's replica-set metrics")
    m = _metrics(procs[pi].http_port)
    assert m["stripedb_shard_raft_primary_id[]"] == pi + 1
    assert m[f"stripedb_shard_member_lag_entries[('member', '{pi + 1}')]"] == 0
    for i, p in enumerate(procs):
        if i == pi:
            continue
        wait_until(lambda: _metrics(p.http_port).get("stripedb_shard_raft_primary_id[]") == pi + 1,
                   10, interval=0.2, what="a secondary's view of the primary")
        ms = _metrics(p.http_port)
        assert ms["stripedb_shard_raft_state[]"] == 0
    # a member killed: the primary's lag for it grows with new writes
    victim = (pi + 1) % 3
    procs[victim].p.kill()
    procs[victim].p.wait()
    write_acked(uri, range(20, 60))
    lag = lambda: _metrics(procs[pi].http_port)[
        f"stripedb_shard_member_lag_entries[('member', '{victim + 1}')]"]
    wait_until(lambda: lag() > 0, 10, interval=0.2, what="lag of the dead member")


def test_concurrent_writes_ride_shared_entries_and_apply_is_measured(start_role, tmp_path):
    """Group commit with one entry in flight: writes that arrive while an entry commits
    ride the next one together, so 8 concurrent writers need fewer entries than commands;
    every acknowledged write is on every member; apply time and loop stalls are exported."""
    import threading
    procs, wires, uri = start_set(start_role, tmp_path)
    pi = primary_index(wires)
    before = _metrics(procs[pi].http_port)
    acked, errors = [], []

    def writer(t):
        try:
            with pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=10000) as c:
                for i in range(40):
                    c.app.c.insert_one({"_id": f"{t}-{i}"})
                    acked.append(f"{t}-{i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert primary_index(wires) == pi, "the primary changed during the test"
    m = _metrics(procs[pi].http_port)
    cmds = m["stripedb_shard_repl_commands_total[]"] - before["stripedb_shard_repl_commands_total[]"]
    entries = m["stripedb_shard_repl_batches_total[]"] - before["stripedb_shard_repl_batches_total[]"]
    assert cmds == 320
    assert entries < cmds, f"{entries} entries for {cmds} concurrent writes: no group commit"
    assert m["stripedb_shard_apply_seconds_count[]"] >= entries
    assert "stripedb_shard_loop_stall_seconds_count[]" in m
    for w in wires:
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{w}/?directConnection=true",
                                 readPreference="secondaryPreferred") as c:
            wait_until(lambda: c.app.c.count_documents({}) == len(acked), 15, interval=0.1,
                       what="every acknowledged write on every member")
            assert sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1})) == sorted(acked)
