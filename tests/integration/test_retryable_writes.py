"""Retryable writes on the embedded shard (issue #16): a write carrying lsid/txnNumber is
recorded per statement in the same transaction as the write, a retry of an executed statement
returns the recorded outcome without running it again, an older txnNumber is refused with
TransactionTooOld (225), the records survive kill -9, and a statement of a transaction is
never applied at once (transactions: test_shard_txn.py).

Commands are sent raw (db.command with an explicit session, so pymongo adds that session's
lsid) exactly as a driver's retry sends them: the same lsid, txnNumber and statements.
"""
import subprocess

import pymongo
import pytest
from bson import Int64
from bson.son import SON
from pymongo.errors import AutoReconnect, OperationFailure

from conftest import BIN, free_port


def client_for(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=10000, retryWrites=False)


@pytest.fixture
def shard_with_dir(start_role, tmp_path):
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    return p, port


def strip(reply):
    """A reply without the fields that legitimately differ between two answers."""
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def update_cmd(txn, stmts, **extra):
    cmd = SON([("update", "c"), ("updates", stmts), ("ordered", True),
               ("txnNumber", Int64(txn))])
    cmd.update(extra)
    return cmd


def oplog_for(c, ns, op):
    return list(c.local.oplog.rs.find({"ns": ns, "op": op}))


def test_same_update_twice_is_applied_once_and_replies_are_equal(shard_with_dir):
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_one({"_id": 1, "n": 0, "ids": []})
    stmt = {"q": {"_id": 1}, "u": {"$inc": {"n": 1}, "$push": {"ids": "a"}}}
    with c.start_session() as s:
        r1 = db.command(update_cmd(1, [stmt]), session=s)
        r2 = db.command(update_cmd(1, [stmt]), session=s)
        lsid = s.session_id
    assert strip(r1) == strip(r2) == {"n": 1, "nModified": 1, "ok": 1.0}
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "n": 1, "ids": ["a"]}
    # the oplog has one update entry, tagged with the session fields
    ups = oplog_for(c, "rw.c", "u")
    assert len(ups) == 1
    assert ups[0]["lsid"]["id"].bytes == bytes(lsid["id"])
    assert ups[0]["txnNumber"] == 1 and ups[0]["stmtId"] == 0
    # a new txnNumber on the same session (pymongo hands the pooled session out again) is
    # a new write, once
    with c.start_session() as s:
        assert s.session_id == lsid
        db.command(update_cmd(1, [stmt]), session=s)
        db.command(update_cmd(2, [stmt]), session=s)
        db.command(update_cmd(2, [stmt]), session=s)
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "n": 2, "ids": ["a", "a"]}
    # an upsert retried returns the same upserted id and inserts once
    up = {"q": {"_id": 7}, "u": {"$inc": {"n": 5}}, "upsert": True}
    with c.start_session() as s:
        a = db.command(update_cmd(3, [up]), session=s)
        b = db.command(update_cmd(3, [up]), session=s)
    assert strip(a) == strip(b)
    assert a["upserted"] == [{"index": 0, "_id": 7}]
    assert db.c.find_one({"_id": 7}) == {"_id": 7, "n": 5}


def test_insert_batch_retry_skips_executed_statements(shard_with_dir):
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_one({"_id": "blocker"})
    docs = [{"_id": "a", "v": 1}, {"_id": "blocker", "v": 2}, {"_id": "b", "v": 3}]
    with c.start_session() as s:
        cmd = SON([("insert", "c"), ("documents", docs), ("ordered", False),
                   ("txnNumber", Int64(1))])
        r1 = db.command(cmd, session=s)
        assert r1["n"] == 2
        assert [e["index"] for e in r1["writeErrors"]] == [1]
        # the retry: statements 0 and 2 are not run again (they would be duplicate-key
        # errors), statement 1 (which failed) runs again and fails again
        r2 = db.command(cmd, session=s)
        assert r2["n"] == 2
        assert [(e["index"], e["code"]) for e in r2["writeErrors"]] == [(1, 11000)]
        # once the blocker is gone the retry executes statement 1 only
        db.c.delete_one({"_id": "blocker"})
        r3 = db.command(cmd, session=s)
        assert strip(r3) == {"n": 3, "ok": 1.0}
        # explicit stmtIds (what a proxy sends a shard for its share of a split batch)
        cmd2 = SON([("insert", "c"), ("documents", [{"_id": "x"}, {"_id": "y"}]),
                    ("txnNumber", Int64(2)), ("stmtIds", [10, 11])])
        assert strip(db.command(cmd2, session=s)) == {"n": 2, "ok": 1.0}
        cmd3 = SON([("insert", "c"), ("documents", [{"_id": "y"}, {"_id": "z"}]),
                    ("txnNumber", Int64(2)), ("stmtIds", [11, 12])])
        # stmtId 11 is recognised (no duplicate-key error), 12 is new
        assert strip(db.command(cmd3, session=s)) == {"n": 2, "ok": 1.0}
        bad = SON([("insert", "c"), ("documents", [{"_id": "q"}]), ("txnNumber", Int64(2)),
                   ("stmtIds", [1, 2])])
        with pytest.raises(OperationFailure) as e:
            db.command(bad, session=s)
        assert e.value.code == 72
    assert sorted(d["_id"] for d in db.c.find()) == ["a", "b", "blocker", "x", "y", "z"]
    inserts = oplog_for(c, "rw.c", "i")
    assert sorted(e["o"]["_id"] for e in inserts) == ["a", "b", "blocker", "blocker", "x", "y", "z"]
    tagged = {e["o"]["_id"]: (e.get("txnNumber"), e.get("stmtId")) for e in inserts
              if "txnNumber" in e}
    assert tagged == {"a": (1, 0), "b": (1, 2), "blocker": (1, 1), "x": (2, 10), "y": (2, 11),
                      "z": (2, 12)}


def test_find_and_modify_retry_returns_the_same_images(shard_with_dir):
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_many([{"_id": 1, "n": 10}, {"_id": 2, "n": 20}, {"_id": 3, "n": 30}])
    with c.start_session() as s:
        pre = SON([("findAndModify", "c"), ("query", {"_id": 1}),
                   ("update", {"$inc": {"n": 1}}), ("txnNumber", Int64(1))])
        a, b = db.command(pre, session=s), db.command(pre, session=s)
        assert strip(a) == strip(b)
        assert a["value"] == {"_id": 1, "n": 10}
        post = SON([("findAndModify", "c"), ("query", {"_id": 2}),
                    ("update", {"$inc": {"n": 1}}), ("new", True), ("txnNumber", Int64(2))])
        a, b = db.command(post, session=s), db.command(post, session=s)
        assert strip(a) == strip(b)
        assert a["value"] == {"_id": 2, "n": 21}
        rm = SON([("findAndModify", "c"), ("query", {"_id": 3}), ("remove", True),
                  ("txnNumber", Int64(3))])
        a, b = db.command(rm, session=s), db.command(rm, session=s)
        assert strip(a) == strip(b)
        assert a["value"] == {"_id": 3, "n": 30} and a["lastErrorObject"]["n"] == 1
    assert list(db.c.find().sort("_id", 1)) == [{"_id": 1, "n": 11}, {"_id": 2, "n": 21}]


def test_find_and_modify_of_a_large_document_keeps_its_oplog_entry_readable(shard_with_dir):
    """A retryable findAndModify's entry carries the document in `o` and its recorded reply
    (the document again) in stmtResult: for a 9 MiB document that would be an 18 MiB entry
    that no oplog read can return (CDC tailing would stick on it). Such an entry goes
    without stmtResult; a retry on the shard is still answered from its session record."""
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    big = "x" * (9 << 20)
    db.c.insert_one({"_id": 1, "s": big})
    db.c.insert_one({"_id": 2, "s": "small"})
    with c.start_session() as s:
        cmd = SON([("findAndModify", "c"), ("query", {"_id": 1}),
                   ("update", {"_id": 1, "s": big, "v": 2}), ("new", True),
                   ("txnNumber", Int64(1))])
        a = db.command(cmd, session=s)
        b = db.command(cmd, session=s)  # the retry: answered from the record
        assert strip(a) == strip(b)
        assert a["value"]["v"] == 2 and len(a["value"]["s"]) == len(big)
        small = SON([("findAndModify", "c"), ("query", {"_id": 2}),
                     ("update", {"$set": {"v": 3}}), ("txnNumber", Int64(2))])
        db.command(small, session=s)
    # every entry of the oplog is readable, in order, by a tailing read
    entries = list(c.local.oplog.rs.find({"ns": "rw.c", "op": "u"}))
    assert [e["o2"]["_id"] for e in entries] == [1, 2]
    assert "stmtResult" not in entries[0] and entries[0]["txnNumber"] == 1
    assert entries[1]["stmtResult"]["value"] == {"_id": 2, "s": "small"}
    assert db.c.find_one({"_id": 1}, {"v": 1}) == {"_id": 1, "v": 2}


def test_older_txn_number_is_transaction_too_old(shard_with_dir):
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_one({"_id": 1, "n": 0})
    stmt = {"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}
    with c.start_session() as s:
        db.command(update_cmd(5, [stmt]), session=s)
        with pytest.raises(OperationFailure) as e:
            db.command(update_cmd(4, [stmt]), session=s)
        assert e.value.code == 225
        assert e.value.details["codeName"] == "TransactionTooOld"
        db.command(update_cmd(6, [stmt]), session=s)
        # txnNumber 5 is now older than 6: its retry is refused too, not re-run
        with pytest.raises(OperationFailure) as e:
            db.command(update_cmd(5, [stmt]), session=s)
        assert e.value.code == 225
        dels = SON([("delete", "c"), ("deletes", [{"q": {"_id": 1}, "limit": 1}]),
                    ("txnNumber", Int64(1))])
        with pytest.raises(OperationFailure) as e:
            db.command(dels, session=s)
        assert e.value.code == 225
    # another session (a new client: pymongo pools its sessions) is independent
    other = client_for(port)
    with other.start_session() as s:
        other.rw.command(update_cmd(1, [stmt]), session=s)
    assert db.c.find_one({"_id": 1})["n"] == 3


def test_multi_document_statements_are_refused_in_a_retryable_write(shard_with_dir):
    """An update with multi: true or a delete with limit: 0 cannot be recorded for an
    exactly-once retry: with a txnNumber it is refused with InvalidOptions (72), as mongod
    does, and nothing is applied (it used to run, and run again on a retry)."""
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.m.insert_many([{"_id": i, "x": 1} for i in range(3)])
    with c.start_session() as s:
        for n, cmd in enumerate((
                SON([("update", "m"), ("updates", [{"q": {"x": 1}, "u": {"$inc": {"z": 1}},
                                                    "multi": True}]),
                     ("txnNumber", Int64(1))]),
                SON([("delete", "m"), ("deletes", [{"q": {"x": 1}, "limit": 0}]),
                     ("txnNumber", Int64(2))]))):
            with pytest.raises(OperationFailure) as e:
                db.command(cmd, session=s)
            assert e.value.code == 72, e.value.details
            assert "retryable writes with multi=true" in str(e.value)
    assert sorted(d.get("z", 0) for d in db.m.find()) == [0, 0, 0]
    # without a txnNumber (what drivers send for multi writes) it runs once
    assert db.command({"update": "m", "updates": [{"q": {"x": 1}, "u": {"$inc": {"z": 1}},
                                                   "multi": True}]})["nModified"] == 3
    c.close()


def test_records_survive_kill9_and_restart(shard_with_dir):
    proc, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_one({"_id": 1, "n": 0, "ids": []})
    stmt = {"q": {"_id": 1}, "u": {"$inc": {"n": 1}, "$push": {"ids": "once"}}}
    s = c.start_session()
    lsid = s.session_id
    r1 = db.command(update_cmd(1, [stmt]), session=s)
    proc.p.kill()
    proc.p.wait(timeout=10)
    proc.log.close()
    proc.restart().wait_healthy()
    # the driver's retry after the restart: same session (lsid), same txnNumber
    r2 = db.command(update_cmd(1, [stmt]), session=s)
    assert s.session_id == lsid
    assert strip(r1) == strip(r2) == {"n": 1, "nModified": 1, "ok": 1.0}
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "n": 1, "ids": ["once"]}
    s.end_session()


def test_transaction_statement_is_not_applied_before_commit(shard_with_dir):
    """A write with startTransaction runs in a transaction (tests/integration/
    test_shard_txn.py has the protocol): never applied at once, nothing after an abort."""
    _, port = shard_with_dir
    c = client_for(port)
    db = c.rw
    db.c.insert_one({"_id": 1, "n": 0})
    with c.start_session() as s:
        cmd = SON([("update", "c"), ("updates", [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]),
                   ("txnNumber", Int64(1)), ("startTransaction", True), ("autocommit", False)])
        assert db.command(cmd, session=s)["nModified"] == 1
        assert db.c.find_one({"_id": 1}) == {"_id": 1, "n": 0}
        c.admin.command(SON([("abortTransaction", 1), ("txnNumber", Int64(1)),
                             ("autocommit", False)]), session=s)
        with pytest.raises(OperationFailure) as e:
            c.admin.command(SON([("commitTransaction", 1), ("txnNumber", Int64(1)),
                                 ("autocommit", False)]), session=s)
        assert e.value.code == 251
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "n": 0}


@pytest.mark.parametrize("value", ["0", "525601"])
def test_session_timeout_option_is_checked(tmp_path, value):
    r = subprocess.run([BIN, "--role=shard", f"--data-dir={tmp_path}",
                        f"--listen=127.0.0.1:{free_port()}",
                        f"--logical-session-timeout-minutes={value}"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("stripedb: shard: --logical-session-timeout-minutes must be "
                                "between 1 and 525600")


def test_configure_fail_point_is_refused_without_test_commands(shard_with_dir):
    _, port = shard_with_dir
    c = client_for(port)
    with pytest.raises(OperationFailure) as e:
        c.admin.command(SON([("configureFailPoint", "failCommand"), ("mode", "alwaysOn"),
                             ("data", {"failCommands": ["insert"], "errorCode": 91})]))
    assert e.value.code == 59
    assert "--enable-test-commands" in str(e.value)
    c.t.c.insert_one({"_id": 1})  # nothing was armed


def test_fail_command_with_test_commands(start_role, tmp_path):
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}",
                "--enable-test-commands"])
    c = client_for(port)
    fp = lambda mode, data: c.admin.command(SON([("configureFailPoint", "failCommand"),
                                                 ("mode", mode), ("data", data)]))
    # {times: 2}: the next two inserts fail before running, with the labels given
    fp({"times": 2}, {"failCommands": ["insert"], "errorCode": 112,
                      "errorLabels": ["RetryableWriteError"]})
    for i in range(2):
        with pytest.raises(OperationFailure) as e:
            c.t.c.insert_one({"_id": i})
        assert e.value.code == 112
        assert e.value.has_error_label("RetryableWriteError")
    c.t.c.insert_one({"_id": 10})
    c.t.c.update_one({"_id": 10}, {"$set": {"a": 1}})
    assert sorted(d["_id"] for d in c.t.c.find()) == [10]
    # {skip: 1}: the first matching command runs, later ones fail until turned off
    fp({"skip": 1}, {"failCommands": ["update", "delete"], "errorCode": 96})
    c.t.c.update_one({"_id": 10}, {"$set": {"a": 2}})
    with pytest.raises(OperationFailure) as e:
        c.t.c.update_one({"_id": 10}, {"$set": {"a": 3}})
    assert e.value.code == 96
    with pytest.raises(OperationFailure):
        c.t.c.delete_one({"_id": 10})
    r = c.admin.command(SON([("configureFailPoint", "failCommand"), ("mode", "off")]))
    assert r["count"] == 2  # it fired twice (the update and the delete)
    c.t.c.update_one({"_id": 10}, {"$set": {"a": 4}})
    assert c.t.c.find_one({"_id": 10}) == {"_id": 10, "a": 4}
    # blockConnection without an error: the command waits, then runs
    fp({"times": 1}, {"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 50})
    assert c.t.c.find_one({"_id": 10})["a"] == 4
    # closeConnection: no reply, the connection goes; nothing ran
    fp({"times": 1}, {"failCommands": ["insert"], "closeConnection": True})
    with pytest.raises(AutoReconnect):
        c.t.c.insert_one({"_id": 20})
    assert c.t.c.find_one({"_id": 20}) is None
    # writeConcernError: the command runs and its ok reply carries the error
    fp({"times": 1}, {"failCommands": ["insert"],
                      "writeConcernError": {"code": 91, "errmsg": "shutting down"}})
    r = c.t.command(SON([("insert", "c"), ("documents", [{"_id": 21}])]))
    assert r["ok"] == 1 and r["n"] == 1 and r["writeConcernError"]["code"] == 91
    assert "errorLabels" not in r  # no txnNumber: not a retryable write
    # options not implemented are refused, never ignored
    for data in ({"failCommands": ["insert"], "errorCode": 1, "appName": "x"},
                 {"failCommands": ["insert"], "errorCode": 1, "failInternalCommands": True},
                 {"failCommands": ["insert"], "blockConnection": True}):
        with pytest.raises(OperationFailure) as e:
            fp("alwaysOn", data)
        assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        c.admin.command(SON([("configureFailPoint", "hangAfterCollectionInserts"),
                             ("mode", "alwaysOn")]))
    assert e.value.code == 2
    c.t.c.insert_one({"_id": 11})  # no refused setting stayed armed
