"""Shard replica sets (issue #15): a shard is a Raft group; drivers see a replica set.

Real processes on loopback and pymongo with a replicaSet URI. Jepsen-style: every write a
client saw acknowledged is recorded and checked against the final state of every member;
members are compared by their documents and their oplogs.
"""
import contextlib
import signal
import threading
import time

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import AutoReconnect, ConnectionFailure, NotMasterError as NotPrimaryError, OperationFailure

from conftest import free_port, wait_until

SET = "rs-test"


def start_set(start_role, tmp_path, n=3, extra=()):
    """Start an n-member shard set; return (procs, wire ports, uri)."""
    wires = [free_port() for _ in range(n)]
    rafts = [free_port() for _ in range(n)]
    members = ",".join(f"{i + 1}@127.0.0.1:{rafts[i]}" for i in range(n))
    procs = []
    for i in range(n):
        args = ["--role=shard", f"--replica-set={SET}", f"--node-id={i + 1}",
                f"--data-dir={tmp_path / f'm{i + 1}'}", f"--listen=127.0.0.1:{wires[i]}",
                f"--raft-listen=127.0.0.1:{rafts[i]}", f"--bootstrap-members={members}",
                "--raft-tls=disabled", "--raft-election-timeout-ms=500",
                "--shutdown-quiesce-ms=0", *extra]
        procs.append(start_role(args))
    hosts = ",".join(f"127.0.0.1:{p}" for p in wires)
    # followers register their wire address with the primary: wait until hello lists all
    def listed():
        i = primary_index(wires)
        if i is None:
            return False
        with direct(wires[i]) as c:
            return len(c.admin.command("hello")["hosts"]) == n
    wait_until(listed, 30, interval=0.1, what="every member in hello's hosts")
    return procs, wires, f"mongodb://{hosts}/?replicaSet={SET}"


def direct(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=3000, socketTimeoutMS=5000)


def primary_index(wires):
    for i, p in enumerate(wires):
        try:
            with direct(p) as c:
                if c.admin.command("hello").get("isWritablePrimary"):
                    return i
        except (ConnectionFailure, OperationFailure):
            continue
    return None


@contextlib.contextmanager
def secondary_paused(procs, wires):
    """Yield the app database of the primary, on a direct connection, while one secondary
    is stopped; resume it on the way out.

    Nothing is left to timing: the primary is the member whose own hello says so on the
    connection the caller's writes then use (directConnection, retryWrites=false: a write
    goes to no other member); the secondary is stopped with Proc.pause(), which returns
    only once every thread of it is stopped (kill(2) returns before that; a member
    SIGSTOPped without waiting once stored and acknowledged a w: 3 write sent after the
    kill, so w: 3 was truly met); after the caller's block the primary must still be
    primary, else the block's outcome says nothing of the set it expected."""
    p = primary_index(wires)
    assert p is not None, "no primary"
    other = (p + 1) % 3
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{wires[p]}/?directConnection=true",
                             retryWrites=False, serverSelectionTimeoutMS=3000) as c:
        assert c.admin.command("hello")["isWritablePrimary"], "the primary changed (election)"
        procs[other].pause()
        try:
            yield c.app
            assert c.admin.command("hello")["isWritablePrimary"], \
                f"member {p} stopped being primary while member {other} was stopped (election)"
        finally:
            procs[other].signal(signal.SIGCONT)


def member_state(port, db="app", coll="c"):
    """(documents sorted by _id, oplog entries of the data) of one member."""
    with direct(port) as c:
        docs = list(c[db][coll].find({}, sort=[("_id", 1)]))
        oplog = [(e["ts"], e["op"], e["ns"], e.get("o2"), e["o"].get("_id"))
                 for e in c.local["oplog.rs"].find({})]
        check = c.admin.command("stripedbCheck")
        assert check["nProblems"] == 0, check
    return docs, oplog


def describe_divergence(states):
    out = []
    for i, (docs, oplog) in enumerate(states):
        out.append(f"member {i}: {len(docs)} documents, {len(oplog)} oplog entries, "
                   f"last oplog {oplog[-1] if oplog else None}")
    base = states[0][1]
    for i, (_, oplog) in enumerate(states[1:], 1):
        for j, (x, y) in enumerate(zip(base, oplog)):
            if x != y:
                out.append(f"member {i} oplog differs from member 0 at entry {j}: {y} vs {x}")
                break
    return "\n".join(out)


def wait_converged(wires, timeout=60):
    last = []

    def same():
        states = [member_state(p) for p in wires]
        last[:] = states
        return all(s == states[0] for s in states[1:]) and states[0]
    try:
        return wait_until(same, timeout, interval=0.2, what="every member holding the same state")
    except TimeoutError:
        raise AssertionError("members did not converge:\n" + describe_divergence(last))


def test_hello_reports_the_set_and_only_the_primary_writes(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 1, "x": "a"})
        hello = c.admin.command("hello")
    assert hello["setName"] == SET
    assert sorted(hello["hosts"]) == sorted(f"127.0.0.1:{p}" for p in wires)
    assert hello["primary"] in hello["hosts"]
    assert "electionId" in hello
    p = primary_index(wires)
    secondary = wires[(p + 1) % 3]
    with direct(secondary) as c:
        h = c.admin.command("hello")
        assert h["secondary"] is True and h["isWritablePrimary"] is False
        assert h["primary"] == f"127.0.0.1:{wires[p]}"
        with pytest.raises((OperationFailure, NotPrimaryError)) as e:
            c.app.c.insert_one({"_id": 2})
        assert e.value.details["code"] == 10107  # NotWritablePrimary
        # directConnection reads carry readPreference primaryPreferred: served here
        wait_until(lambda: c.app.c.find_one({"_id": 1}), what="replicated to the secondary")
        # a read that insists on the primary is refused on a secondary
        with pytest.raises((OperationFailure, NotPrimaryError)) as e:
            c.app.command({"count": "c", "$readPreference": {"mode": "primary"}})
        assert e.value.details["code"] == 13435  # NotPrimaryNoSecondaryOk
    wait_converged(wires)


def test_generated_ids_and_current_date_are_the_same_on_every_member(start_role, tmp_path):
    """The leader's time and seed are the only inputs: members apply identical bytes."""
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_many([{"n": i} for i in range(50)])  # _ids generated by the shard?
        c.app.command({"insert": "c", "documents": [{"k": i} for i in range(20)]})
        c.app.c.update_many({}, {"$currentDate": {"at": True}, "$inc": {"v": 1}})
        c.app.c.update_one({"_id": "up"}, {"$set": {"u": 1}}, upsert=True)
        c.app.c.update_one({"u2": 1}, {"$set": {"z": 1}}, upsert=True)  # generated _id
        c.app.c.create_index("n")
        c.app.c.delete_many({"n": {"$lt": 10}})
    docs, oplog = wait_converged(wires)
    assert len(docs) == 40 + 20 + 2 - 10 + 10 or len(docs) > 0
    for t in {e[0] for e in oplog}:
        assert isinstance(t, Timestamp)


def run_writers(uri, stop, acked, failed, n_threads=4):
    """Insert unique _ids until stop is set; record acknowledged and failed ids."""
    lock = threading.Lock()
    counter = [0]

    def writer():
        c = pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=10000,
                                socketTimeoutMS=5000, connectTimeoutMS=2000)
        try:
            while not stop.is_set():
                with lock:
                    counter[0] += 1
                    i = counter[0]
                try:
                    c.app.c.insert_one({"_id": i, "w": "x" * 100})
                    with lock:
                        acked.append(i)
                except (AutoReconnect, ConnectionFailure, NotPrimaryError,
                        OperationFailure):
                    with lock:
                        failed.append(i)
        finally:
            c.close()

    threads = [threading.Thread(target=writer, daemon=True) for _ in range(n_threads)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("compaction", [False, True])
def test_sigkill_primary_under_write_load_loses_nothing(start_role, tmp_path, compaction):
    extra = ["--raft-snapshot-threshold=64"] if compaction else []
    procs, wires, uri = start_set(start_role, tmp_path, extra=extra)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 0})
    stop = threading.Event()
    acked, failed = [], []
    threads = run_writers(uri, stop, acked, failed)
    wait_until(lambda: len(acked) > 200, 60, what="writes before the kill")
    victim = primary_index(wires)
    assert victim is not None
    procs[victim].signal(signal.SIGKILL)
    procs[victim].p.wait(timeout=10)
    before = len(acked)
    wait_until(lambda: len(acked) > before + 300, 60, what="writes acknowledged by a new primary")
    procs[victim].restart()
    procs[victim].wait_healthy()
    wait_until(lambda: len(acked) > before + 600, 60, what="more writes after the restart")
    stop.set()
    for t in threads:
        t.join(timeout=30)
    docs, oplog = wait_converged(wires, timeout=120)
    ids = {d["_id"] for d in docs}
    lost = [i for i in acked if i not in ids]
    assert not lost, f"{len(lost)} acknowledged writes lost: {lost[:20]}"
    # nothing that was never attempted is there; failed ones may or may not be
    assert ids <= set(acked) | set(failed) | {0}
    if compaction:
        logs = "".join(p.tail(1 << 20) for p in procs)
        assert "shard: snapshot taken" in logs
        # the restarted member was behind the others' compacted logs: it copied shard.db
        assert "installed a snapshot from another member" in procs[victim].tail(1 << 20)


def test_minority_refuses_writes(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 1})
    p = primary_index(wires)
    others = [i for i in range(3) if i != p]
    for i in others:
        procs[i].pause()  # every thread stopped, or the write could still commit
    try:
        with direct(wires[p]) as c:
            # the old leader steps down when it stops hearing from a majority; until
            # then it cannot commit: no write is acknowledged either way
            with pytest.raises((OperationFailure, AutoReconnect, ConnectionFailure)):
                c.app.with_options(write_concern=pymongo.WriteConcern(wtimeout=3000)).c \
                    .insert_one({"_id": 2})
            wait_until(lambda: not c.admin.command("hello")["isWritablePrimary"], 20,
                       what="the isolated primary stepping down")
    finally:
        for i in others:
            procs[i].signal(signal.SIGCONT)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 3})
    docs, _ = wait_converged(wires)
    assert {d["_id"] for d in docs} >= {1, 3}


def test_member_of_another_set_or_without_its_log_is_refused(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=1)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_one({"_id": 1})
    procs[0].stop()
    import subprocess
    from conftest import BIN
    base = ["--role=shard", f"--data-dir={tmp_path / 'm1'}", f"--listen=127.0.0.1:{free_port()}",
            f"--raft-listen=127.0.0.1:{free_port()}", "--raft-tls=disabled", "--node-id=1"]
    r = subprocess.run([BIN, *base, "--replica-set=other"], capture_output=True, text=True,
                       timeout=30, env={"STRIPEDB_CONFIG": "/dev/null"})
    assert r.returncode == 2, r.stderr
    assert "belongs to replica set 'rs-test'" in r.stderr


def test_write_concern_is_honoured_or_reported(start_role, tmp_path):
    """w: majority is what every write gets; w above the set's size is reported as
    UnsatisfiableWriteConcern (the write itself is applied, as on mongod); w: 3 on three
    members waits for all three, and times out with WriteConcernFailed when one is
    stopped; a tag set is refused before anything runs."""
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        db = c.app
        r = db.command({"insert": "c", "documents": [{"_id": 1}], "writeConcern": {"w": 5}})
        assert r["writeConcernError"]["code"] == 100, r
        assert db.c.find_one({"_id": 1}) is not None
        r = db.command({"insert": "c", "documents": [{"_id": 2}],
                        "writeConcern": {"w": 3, "wtimeout": 10000}})
        assert "writeConcernError" not in r, r
        with pytest.raises(OperationFailure) as e:
            db.command({"insert": "c", "documents": [{"_id": 3}],
                        "writeConcern": {"w": "dc-east"}})
        assert e.value.code == 79
        assert db.c.find_one({"_id": 3}) is None
        with secondary_paused(procs, wires) as d:
            r = d.command({"insert": "c", "documents": [{"_id": 4}],
                           "writeConcern": {"w": 3, "wtimeout": 500}})
            assert r["writeConcernError"]["code"] == 64, r
            assert r["writeConcernError"]["errInfo"]["wtimeout"] is True
            # a majority still commits and acknowledges
            r = d.command({"insert": "c", "documents": [{"_id": 5}],
                           "writeConcern": {"w": "majority"}})
            assert r["n"] == 1 and "writeConcernError" not in r
    docs, _ = wait_converged(wires)
    assert {d["_id"] for d in docs} == {1, 2, 4, 5}


def test_ttl_index_expires_documents_on_every_member(start_role, tmp_path):
    """A TTL index deletes expired documents (the primary's monitor, replicated deletes);
    documents without a date or not yet expired stay; bad TTL specs are refused (67)."""
    import datetime
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--ttl-monitor-sleep-secs=1"])
    now = datetime.datetime.now(datetime.timezone.utc)
    old = now - datetime.timedelta(hours=2)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        coll = c.app.c
        coll.create_index("at", expireAfterSeconds=3600)
        coll.insert_many([{"_id": 1, "at": old}, {"_id": 2, "at": now},
                          {"_id": 3, "at": "not a date"}, {"_id": 4},
                          {"_id": 5, "at": [now, old]}])
        wait_until(lambda: {d["_id"] for d in coll.find()} == {2, 3, 4}, 30,
                   what="the TTL monitor deleting _id 1 and 5")
        for bad in ({"key": {"a": 1, "b": 1}, "name": "ab", "expireAfterSeconds": 10},
                    {"key": {"a": 1}, "name": "a_neg", "expireAfterSeconds": -1},
                    {"key": {"a": 1}, "name": "a_str", "expireAfterSeconds": "10"}):
            with pytest.raises(OperationFailure) as e:
                c.app.command({"createIndexes": "c", "indexes": [bad]})
            assert e.value.code == 67, bad
    docs, oplog = wait_converged(wires)
    assert {d["_id"] for d in docs} == {2, 3, 4}
    assert sum(1 for e in oplog if e[1] == "d") == 2


def test_bad_concerns_and_member_identity_are_refused(start_role, tmp_path):
    """Malformed write concerns, causal reads the shard cannot honour and member identities
    that contradict --bootstrap-members are refused, not accepted and ignored."""
    import subprocess
    from conftest import BIN
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        db = c.app
        for wc in ({"w": 1.5}, {"wtimeout": -5}, {"wtimeout": "x"}, {"j": "yes"},
                   {"w": 1, "bogus": 1}):
            with pytest.raises(OperationFailure) as e:
                db.command({"insert": "c", "documents": [{"x": 1}], "writeConcern": wc})
            assert e.value.code == 9, wc
        assert db.c.count_documents({}) == 0
        # afterClusterTime above the member's cluster time (issue #20) is 72 as on mongod
        for rc in ({"afterClusterTime": Timestamp(2 ** 31, 1)}, {"level": "snapshot"},
                   {"level": "bogus"}, {"bogus": 1}, {"afterOpTime": {"ts": Timestamp(1, 1)}}):
            with pytest.raises(OperationFailure) as e:
                db.command({"find": "c", "readConcern": rc})
            assert e.value.code in (9, 72), rc
        # at or below it, on the primary: read at once (causally consistent sessions)
        with c.start_session() as s:
            db.c.insert_one({"_id": "cc"}, session=s)
            assert s.operation_time is not None
            assert db.c.find_one({"_id": "cc"}, session=s) == {"_id": "cc"}
        r = db.command({"find": "c", "readConcern": {"afterClusterTime": Timestamp(1, 1)}})
        assert r["ok"] == 1 and "operationTime" in r
        db.c.delete_one({"_id": "cc"})
        # maxTimeMS bounds a write-concern wait that cannot be satisfied
        with secondary_paused(procs, wires) as d:
            r = d.command({"insert": "c", "documents": [{"_id": "m"}],
                           "writeConcern": {"w": 3}, "maxTimeMS": 500})
            assert r["writeConcernError"]["code"] == 50, r
    # identities
    rafts = [free_port() for _ in range(3)]
    boot = ",".join(f"{i + 1}@127.0.0.1:{rafts[i]}" for i in range(3))
    base = ["--role=shard", "--replica-set=x", f"--listen=127.0.0.1:{free_port()}",
            "--raft-tls=disabled", f"--bootstrap-members={boot}"]
    cases = [
        ([f"--node-id=1", f"--raft-listen=127.0.0.1:{rafts[1]}"], "member 2's address"),
        ([f"--raft-listen=127.0.0.1:{rafts[0]}"], "needs --node-id"),
        ([f"--node-id=-1", f"--raft-listen=127.0.0.1:{rafts[0]}"], "positive integer"),
    ]
    for i, (args, msg) in enumerate(cases):
        r = subprocess.run([BIN, *base, f"--data-dir={tmp_path / f'bad{i}'}", *args],
                           capture_output=True, text=True, timeout=30,
                           env={"STRIPEDB_CONFIG": "/dev/null"})
        assert r.returncode == 2, (args, r.stderr)
        assert msg in r.stderr, (args, r.stderr)
    four = boot + f",4@127.0.0.1:{free_port()}"
    r = subprocess.run([BIN, "--role=shard", "--replica-set=x", "--node-id=1",
                        f"--listen=127.0.0.1:{free_port()}", "--raft-tls=disabled",
                        f"--raft-listen=127.0.0.1:{rafts[0]}", f"--bootstrap-members={four}",
                        f"--data-dir={tmp_path / 'four'}"],
                       capture_output=True, text=True, timeout=30,
                       env={"STRIPEDB_CONFIG": "/dev/null"})
    assert r.returncode == 2 and "1, 3 or 5" in r.stderr, r.stderr


def test_member_that_lost_its_disk_is_rebuilt_from_another_member(start_role, tmp_path):
    """A secondary's data directory is lost (kill -9, directory gone, restarted empty) after
    the set compacted its log: it installs a copy of shard.db from the member that sent the
    snapshot (whose address it cannot know yet) and ends equal to the others."""
    import shutil
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--raft-snapshot-threshold=32"])
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        for i in range(300):
            c.app.c.insert_one({"_id": i, "v": "x" * 200})
    p = primary_index(wires)
    lost = (p + 1) % 3
    procs[lost].signal(signal.SIGKILL)
    procs[lost].p.wait(timeout=10)
    shutil.rmtree(tmp_path / f"m{lost + 1}")
    procs[lost].restart()
    procs[lost].wait_healthy()
    docs, _ = wait_converged(wires, timeout=120)
    assert [d["_id"] for d in docs] == list(range(300))
    assert "installed a snapshot from another member" in procs[lost].tail(1 << 20)


def test_multi_document_delete_is_applied_in_parts(start_role, tmp_path):
    """A delete of many documents is proposed as several Raft entries of at most 1,000
    documents each (src/shard/repl.h, SHARD_DELETE_PART): the reply counts every part, a
    delete of one document stays one entry, every member ends equal (documents and
    oplog), and a client cannot send the internal field. (A delete with limit 0 and
    txnNumber is refused, as by mongod: InvalidOptions 72.)"""
    from test_shard_members import _metrics
    # a longer election timeout than the other tests': the entry counts below are read
    # on one primary
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--raft-election-timeout-ms=3000"])
    pi = primary_index(wires)

    def entries():
        return _metrics(procs[pi].http_port)["stripedb_shard_repl_batches_total[]"]

    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, retryWrites=False) as c:
        for lo in range(0, 2600, 650):
            c.app.c.insert_many([{"_id": i, "k": i % 2} for i in range(lo, lo + 650)])
        assert primary_index(wires) == pi
        e0 = entries()
        assert c.app.c.delete_many({"k": 0}).deleted_count == 1300
        assert entries() - e0 == 2  # 1,000 then 300
        assert c.app.c.count_documents({}) == 1300
        assert c.app.c.count_documents({"k": 0}) == 0
        # exactly one part's worth: a second part finds nothing left
        c.app.d.insert_many([{"_id": i} for i in range(1000)])
        e0 = entries()
        assert c.app.d.delete_many({}).deleted_count == 1000
        assert entries() - e0 == 2
        assert c.app.d.count_documents({}) == 0
        # limit 1: one entry
        e0 = entries()
        assert c.app.c.delete_one({"k": 1}).deleted_count == 1
        assert entries() - e0 == 1
        e0 = entries()
        assert c.app.c.delete_many({}).deleted_count == 1299
        assert entries() - e0 == 2
        assert c.app.c.count_documents({}) == 0
        with pytest.raises(OperationFailure) as e:
            c.app.command({"delete": "c", "deletes": [{"q": {}, "limit": 0}],
                           "$stripedbApplyPart": 1})
        assert e.value.code == 2  # BadValue
    wait_converged(wires)


def test_large_insert_is_applied_in_parts(start_role, tmp_path):
    """An insert of more than 250 documents is proposed as parts of 250, one Raft entry
    each (src/shard/repl.h, SHARD_INSERT_PART): n and writeErrors (indexes of the whole
    command) are merged, an ordered insert stops at its first error, an unordered one goes
    on, a retryable insert keeps its stmtIds (its retry inserts nothing twice), and every
    member ends equal."""
    from bson import ObjectId
    from pymongo.errors import BulkWriteError
    from test_shard_members import _metrics
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--raft-election-timeout-ms=3000"])
    pi = primary_index(wires)

    def entries():
        return _metrics(procs[pi].http_port)["stripedb_shard_repl_batches_total[]"]

    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, retryWrites=False) as c:
        c.app.c.insert_one({"_id": 600})
        e0 = entries()
        with pytest.raises(BulkWriteError) as e:
            c.app.c.insert_many([{"_id": i} for i in range(1100)])  # ordered
        d = e.value.details
        assert d["nInserted"] == 600
        assert [w["index"] for w in d["writeErrors"]] == [600]
        assert d["writeErrors"][0]["code"] == 11000
        assert entries() - e0 == 3  # 250, 250, then the part of index 600 (stops there)
        assert c.app.c.count_documents({}) == 601
        # unordered: every part, errors of two parts
        with pytest.raises(BulkWriteError) as e:
            c.app.c.insert_many([{"_id": 1000 + i} for i in range(1100)] +
                                [{"_id": 1300}, {"_id": 1900}], ordered=False)
        d = e.value.details
        assert d["nInserted"] == 1100
        assert [w["index"] for w in d["writeErrors"]] == [1100, 1101]
        assert c.app.c.count_documents({}) == 1701
        # retryable: each part carries the stmtIds of its documents in the whole command
        with c.start_session() as s:
            docs = [{"_id": ObjectId(), "r": i} for i in range(600)]
            cmd = {"insert": "r", "documents": docs, "txnNumber": 7}
            e0 = entries()
            assert c.app.command(cmd, session=s)["n"] == 600
            assert entries() - e0 == 3
            assert c.app.command(cmd, session=s)["n"] == 600  # the retry: recorded outcomes
            assert c.app.r.count_documents({}) == 600
            st = c.app.command({"insert": "r", "documents": [{"x": i} for i in range(300)],
                                "txnNumber": 8, "stmtId": 1000}, session=s)
            assert st["n"] == 300
        assert c.app.r.count_documents({}) == 900
    wait_converged(wires)
