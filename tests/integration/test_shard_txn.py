"""Multi-document transactions on one shard (issue #16, src/shard/txn.c).

Real shard processes (one-member and three-member replica sets) and pymongo's own
transaction API (start_transaction, with_transaction), so the commands on the wire are
exactly a driver's: lsid, txnNumber, autocommit: false, startTransaction on the first
statement, commitTransaction / abortTransaction on admin. Where a test needs a command a
driver would only send on a retry (a second commitTransaction) it sends it raw with the
same session fields.

Jepsen-style bank tests: concurrent transfers between accounts with with_transaction; the
total is checked exactly against the initial total, no balance may go negative, and every
member of a set ends with the same documents and oplog.
"""
import json
import os
import signal
import subprocess
import threading

import pymongo
import pytest
from bson import Int64
from bson.son import SON
from pymongo.errors import NotMasterError as NotPrimaryError
from pymongo.errors import OperationFailure, PyMongoError

from conftest import MONGOSH, free_port, needs_node_client, node_env, wait_until
from test_shard_replset import direct, primary_index, start_set

SET = "rs-test"
HERE = os.path.dirname(os.path.abspath(__file__))


def one_member(start_role, tmp_path, extra=()):
    """A one-member replica set (named, so drivers allow transactions): (proc, port, uri)."""
    wire, raft = free_port(), free_port()
    p = start_role(["--role=shard", f"--replica-set={SET}", "--node-id=1",
                    f"--data-dir={tmp_path / 'one'}", f"--listen=127.0.0.1:{wire}",
                    f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members=1@127.0.0.1:{raft}",
                    "--raft-tls=disabled", "--shutdown-quiesce-ms=0", *extra])
    p.raft_port = raft
    return p, wire, f"mongodb://127.0.0.1:{wire}/?replicaSet={SET}"


def client(uri, **kw):
    kw.setdefault("serverSelectionTimeoutMS", 20000)
    return pymongo.MongoClient(uri, **kw)


def labels(e):
    return (e.details or {}).get("errorLabels", []) if isinstance(e, OperationFailure) else []


def raw_end(c, s, name, txn):
    """commitTransaction / abortTransaction as a driver's retry sends it."""
    return c.admin.command(SON([(name, 1), ("txnNumber", Int64(txn)), ("autocommit", False)]),
                           session=s)


def test_commit_abort_and_read_your_own_writes(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    c, other = client(uri), client(uri)
    acc = c.bank.acc
    acc.insert_many([{"_id": 1, "n": 100}, {"_id": 2, "n": 0}])
    seen = {}

    def transfer(s):
        acc.update_one({"_id": 1}, {"$inc": {"n": -30}}, session=s)
        acc.update_one({"_id": 2}, {"$inc": {"n": 30}}, session=s)
        acc.insert_one({"_id": 3, "n": 7}, session=s)
        # read your own writes inside (find, count, aggregate)
        seen["inside"] = list(acc.find({}, session=s).sort("_id", 1))
        seen["count"] = acc.count_documents({}, session=s)
        seen["agg"] = list(acc.aggregate([{"$group": {"_id": None, "t": {"$sum": "$n"}}}],
                                         session=s))
        # nothing visible to another client before the commit
        seen["outside"] = list(other.bank.acc.find({}).sort("_id", 1))

    with c.start_session() as s:
        s.with_transaction(transfer)
    assert seen["inside"] == [{"_id": 1, "n": 70}, {"_id": 2, "n": 30}, {"_id": 3, "n": 7}]
    assert seen["count"] == 3
    assert seen["agg"] == [{"_id": None, "t": 107}]
    assert seen["outside"] == [{"_id": 1, "n": 100}, {"_id": 2, "n": 0}]
    assert list(other.bank.acc.find({}).sort("_id", 1)) == seen["inside"]

    # abort: nothing of it is applied
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": 1}, {"$inc": {"n": -70}}, session=s)
        acc.delete_one({"_id": 3}, session=s)
        acc.insert_one({"_id": 4}, session=s)
        assert acc.find_one({"_id": 1}, session=s) == {"_id": 1, "n": 0}
        assert acc.find_one({"_id": 3}, session=s) is None
        s.abort_transaction()
    assert list(other.bank.acc.find({}).sort("_id", 1)) == seen["inside"]

    # the commit's writes are one entry's oplog entries, tagged with the session
    ops = list(c.local["oplog.rs"].find({"ns": "bank.acc", "txnNumber": {"$exists": True},
                                         "stmtResult": {"$exists": False}}))
    assert [(o["op"], o["o"]["_id"]) for o in ops] == [("u", 1), ("u", 2), ("i", 3)]
    assert len({o["txnNumber"] for o in ops}) == 1
    assert c.admin.command("stripedbCheck")["nProblems"] == 0
    # a getMore of a cursor opened in the transaction is served from its snapshot
    with c.start_session() as s:
        s.start_transaction()
        acc.insert_many([{"_id": 100 + i} for i in range(10)], session=s)
        got = [d["_id"] for d in acc.find({"_id": {"$gte": 100}}, session=s, batch_size=3)]
        assert got == list(range(100, 110))
        s.commit_transaction()
    assert other.bank.acc.count_documents({"_id": {"$gte": 100}}) == 10


def test_errors_labels_and_session_rules(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    c = client(uri, retryWrites=False)
    coll = c.app.c
    coll.insert_one({"_id": 1, "n": 0})
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        # a command that is not allowed in a transaction: refused, the transaction goes on
        with pytest.raises(OperationFailure) as e:
            c.app.command("createIndexes", "c", indexes=[{"key": {"n": 1}, "name": "n_1"}],
                          session=s)
        assert e.value.code == 263 and e.value.details["codeName"] == \
            "OperationNotSupportedInTransaction"
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        s.commit_transaction()
        txn = s._server_session.transaction_id
        assert coll.find_one({"_id": 1})["n"] == 2
        # a retried commitTransaction answers ok (from the durable session record)
        assert raw_end(c, s, "commitTransaction", txn)["ok"] == 1.0
        # starting the committed txnNumber again: TransactionCommitted
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn)),
                               ("startTransaction", True), ("autocommit", False)]), session=s)
        assert e.value.code == 256 and f"Transaction {txn} has been committed" in str(e.value)
        # a retryable write cannot reuse a transaction's number
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("insert", "c"), ("documents", [{"_id": 9}]),
                               ("txnNumber", Int64(txn))]), session=s)
        assert e.value.code == 217, e.value.details
        # an older txnNumber: TransactionTooOld
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn - 1)),
                               ("startTransaction", True), ("autocommit", False)]), session=s)
        assert e.value.code == 225
        # a retryable write's txnNumber cannot start a transaction
        c.app.command(SON([("insert", "c"), ("documents", [{"_id": 10}]),
                           ("txnNumber", Int64(txn + 5))]), session=s)
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 5)),
                               ("startTransaction", True), ("autocommit", False)]), session=s)
        assert e.value.code == 50911, e.value.details
        # a retryable write with an older txnNumber than an open transaction's:
        # TransactionTooOld; a newer one aborts the open transaction (mongod's rules)
        c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 20)),
                           ("startTransaction", True), ("autocommit", False)]), session=s)
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("insert", "c"), ("documents", [{"_id": 12}]),
                               ("txnNumber", Int64(txn + 19))]), session=s)
        assert e.value.code == 225
        c.app.command(SON([("insert", "c"), ("documents", [{"_id": 13}]),
                           ("txnNumber", Int64(txn + 21))]), session=s)
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 20)),
                               ("autocommit", False)]), session=s)
        assert e.value.code == 251 and "newer retryable write" in str(e.value)
        txn += 20
        # a statement of a transaction that does not exist: NoSuchTransaction, transient
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 6)),
                               ("autocommit", False)]), session=s)
        assert e.value.code == 251 and "TransientTransactionError" in labels(e.value)
        # readConcern on a later statement, writeConcern on a statement: InvalidOptions
        c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 7)),
                           ("startTransaction", True), ("autocommit", False),
                           ("readConcern", {"level": "snapshot"})]), session=s)
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 7)),
                               ("autocommit", False), ("readConcern", {"level": "local"})]),
                          session=s)
        assert e.value.code == 72 and "readConcern" in str(e.value)
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("insert", "c"), ("documents", [{"_id": 11}]),
                               ("txnNumber", Int64(txn + 7)), ("autocommit", False),
                               ("writeConcern", {"w": 1})]), session=s)
        assert e.value.code == 72
        # autocommit: true is refused
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("find", "c"), ("txnNumber", Int64(txn + 8)),
                               ("startTransaction", True), ("autocommit", True)]), session=s)
        assert e.value.code == 72
        # abort of an unknown transaction: NoSuchTransaction
        with pytest.raises(OperationFailure) as e:
            raw_end(c, s, "abortTransaction", txn + 9)
        assert e.value.code == 251
        # commit of a transaction that never committed: NoSuchTransaction (from the log)
        with pytest.raises(OperationFailure) as e:
            raw_end(c, s, "commitTransaction", txn + 9)
        assert e.value.code == 251 and "TransientTransactionError" in labels(e.value)
    # a duplicate key at commit aborts the whole transaction (a new client: the pooled
    # session's txnNumber was moved on by the raw commands above)
    c = client(uri, retryWrites=False)
    c.app.d.create_index("u", unique=True)
    with c.start_session() as s:
        s.start_transaction()
        c.app.d.insert_one({"_id": 1, "u": 1}, session=s)
        c.app.d.insert_one({"_id": 2, "u": 2}, session=s)
        other = client(uri)
        other.app.d.insert_one({"_id": 3, "u": 2})  # outside, not a key the txn touched
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 11000, e.value.details
    assert list(c.app.d.find({}).sort("_id", 1)) == [{"_id": 3, "u": 2}]
    assert c.admin.command("stripedbCheck")["nProblems"] == 0


def test_transaction_lifetime_limit_aborts(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path, extra=["--transaction-lifetime-limit-seconds=1"])
    c = client(uri)
    coll = c.app.c
    coll.insert_one({"_id": 1, "n": 0})
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        err = []

        def aborted():
            try:
                coll.find_one({"_id": 1}, session=s)
                return False
            except OperationFailure as e:
                err.append(e)
                return True
        wait_until(aborted, 30, interval=0.1, what="the transaction aborted by its time limit")
        assert err[0].code == 251 and "TransientTransactionError" in labels(err[0])
        assert "transactionLifetimeLimitSeconds" in str(err[0])
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 0}


def test_foreign_raft_leader_does_not_abort_transactions(start_role, tmp_path):
    """A stray member of another replica set (an interrupted run's process whose peer
    address this shard's Raft port now reuses) sends its AppendEntries heartbeat with a
    higher term: the shard refuses the connection (not a member of its configuration)
    instead of stepping down, so its open transaction is not aborted ("the primary stepped
    down": test_transaction_lifetime_limit_aborts failed that way beside the parallel
    suite)."""
    import socket
    import struct
    p, _, uri = one_member(start_role, tmp_path)
    c = client(uri)
    coll = c.app.c
    coll.insert_one({"_id": 1, "n": 0})
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        addr = b"127.0.0.1:1\0"
        addr += b"\0" * (-len(addr) % 8)
        body = struct.pack("<QQQQQ", 1000, 0, 0, 0, 0) + b"\0" * 8  # term 1000, no entries
        raw = struct.pack("<QQQ", 1, 2, len(addr)) + addr + struct.pack("<QQ", 1, len(body)) + body
        sock = socket.create_connection(("127.0.0.1", p.raft_port), timeout=15)
        sock.sendall(raw)
        try:  # closed (EOF, or a reset: the shard did not read the message)
            assert sock.recv(16) == b"", "the shard answered the stray leader"
        except ConnectionResetError:
            pass
        sock.close()
        assert "raft peer's server id is not in the configuration" in p.tail(200000)
        assert coll.find_one({"_id": 1}, session=s) == {"_id": 1, "n": 1}
        s.commit_transaction()
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1}
    assert c.admin.command("hello")["isWritablePrimary"] is True


def test_write_conflict_is_transient_and_with_transaction_retries(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    c, other = client(uri), client(uri)
    coll = c.app.c
    coll.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}])
    # a statement after a conflicting outside write
    with c.start_session() as s:
        s.start_transaction()
        assert coll.find_one({"_id": 1}, session=s)["n"] == 0
        other.app.c.update_one({"_id": 1}, {"$set": {"n": 5}})
        with pytest.raises(OperationFailure) as e:
            coll.update_one({"_id": 2}, {"$set": {"n": 1}}, session=s)
        assert e.value.code == 112 and e.value.details["codeName"] == "WriteConflict"
        assert "TransientTransactionError" in labels(e.value)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251
    # at commit
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 2}, {"$inc": {"n": 1}}, session=s)
        other.app.c.update_one({"_id": 2}, {"$inc": {"n": 10}})
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 112 and "TransientTransactionError" in labels(e.value)
    assert coll.find_one({"_id": 2})["n"] == 10
    # a write outside to a document the transaction only read (write skew guard)
    attempts = []

    def cb(s):
        attempts.append(1)
        n = coll.find_one({"_id": 1}, session=s)["n"]
        if len(attempts) == 1:
            other.app.c.update_one({"_id": 1}, {"$inc": {"n": 100}})
        coll.update_one({"_id": 2}, {"$set": {"n": n}}, session=s)
    with c.start_session() as s:
        s.with_transaction(cb)
    assert len(attempts) == 2
    assert coll.find_one({"_id": 2})["n"] == coll.find_one({"_id": 1})["n"] == 105
    # a non-_id filter reads the whole collection: any write to it conflicts
    with c.start_session() as s:
        s.start_transaction()
        coll.find_one({"n": 105}, session=s)
        other.app.c.insert_one({"_id": 3})
        with pytest.raises(OperationFailure) as e:
            coll.insert_one({"_id": 4}, session=s)
        assert e.value.code == 112
    # DDL conflicts with every open transaction
    with c.start_session() as s:
        s.start_transaction()
        coll.find_one({"_id": 1}, session=s)
        other.app.other.create_index("x")
        with pytest.raises(OperationFailure) as e:
            coll.find_one({"_id": 1}, session=s)
        assert e.value.code == 112
    # a migration's traffic switch (a version bump) aborts every open transaction: none
    # is half applied on the chunk that moves
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        other.admin.command(SON([("stripedbSetVersion", 1), ("chunk", "7"), ("token", 2)]))
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 112
    assert coll.find_one({"_id": 1})["n"] == 105
    # a statement with an older version token than the shard's: StaleConfig, transient
    # (the proxy refreshes its routing and retries the transaction), the transaction aborts
    with c.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            c.app.command(SON([("update", "c"),
                               ("updates", [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]),
                               ("$stripedbVersion", {"chunk": "7", "token": 1})]), session=s)
        assert e.value.code == 13388 and "TransientTransactionError" in labels(e.value)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251
    assert coll.find_one({"_id": 1})["n"] == 105


def bank(uri, n_accounts=10, n_threads=4, transfers=40):
    """Concurrent with_transaction transfers; returns (commits, aborted attempts)."""
    c = client(uri)
    c.bank.acc.drop()
    c.bank.acc.insert_many([{"_id": i, "n": 100} for i in range(n_accounts)])
    stats = {"commits": 0, "attempts": 0, "refused": 0}
    lock = threading.Lock()
    errors = []

    def worker(seed):
        import random
        rnd = random.Random(seed)
        cl = client(uri)
        acc = cl.bank.acc
        try:
            for _ in range(transfers):
                a, b = rnd.sample(range(n_accounts), 2)
                amount = rnd.randint(1, 60)

                def cb(s):
                    with lock:
                        stats["attempts"] += 1
                    x = acc.find_one({"_id": a}, session=s)["n"]
                    acc.find_one({"_id": b}, session=s)
                    if x < amount:
                        return False  # overdraft refused, the transaction commits nothing
                    acc.update_one({"_id": a}, {"$inc": {"n": -amount}}, session=s)
                    acc.update_one({"_id": b}, {"$inc": {"n": amount}}, session=s)
                    return True
                with cl.start_session() as s:
                    done = s.with_transaction(cb)
                with lock:
                    stats["commits"] += 1
                    stats["refused"] += 0 if done else 1
        except PyMongoError as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            cl.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    docs = list(c.bank.acc.find({}))
    assert sum(d["n"] for d in docs) == 100 * n_accounts, docs
    assert all(d["n"] >= 0 for d in docs), docs
    assert stats["commits"] == n_threads * transfers
    print(f"\nbank: {stats['commits']} transactions committed ({stats['refused']} refused an "
          f"overdraft), {stats['attempts'] - stats['commits']} attempts aborted and retried")
    c.close()
    return stats


def test_bank_one_member(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    stats = bank(uri)
    assert stats["attempts"] >= stats["commits"]


def member_state(port):
    with direct(port) as c:
        docs = list(c.bank.acc.find({}, sort=[("_id", 1)]))
        oplog = [(e["ts"], e["op"], e["ns"], e["o"].get("_id"), e.get("txnNumber"))
                 for e in c.local["oplog.rs"].find({"ns": "bank.acc"})]
        check = c.admin.command("stripedbCheck")
        assert check["nProblems"] == 0, check
    return docs, oplog


def converged(wires):
    states = []

    def same():
        states[:] = [member_state(p) for p in wires]
        return all(s == states[0] for s in states[1:])
    wait_until(same, 60, interval=0.2, what="every member holding the same state")
    return states[0]


def test_three_members_bank_failover_and_commit_retry(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=3)
    stats = bank(uri)
    assert stats["attempts"] >= stats["commits"]
    docs, oplog = converged(wires)
    assert sum(d["n"] for d in docs) == 1000

    # a transaction on a secondary: NotWritablePrimary, nothing started
    p = primary_index(wires)
    with direct(wires[(p + 1) % 3]) as sec:
        with sec.start_session() as s:
            with pytest.raises((OperationFailure, NotPrimaryError)) as e:
                sec.bank.command(SON([("update", "acc"),
                                      ("updates", [{"q": {"_id": 0}, "u": {"$inc": {"n": 1}}}]),
                                      ("txnNumber", Int64(1)), ("startTransaction", True),
                                      ("autocommit", False)]), session=s)
            assert e.value.details["code"] == 10107
    c = client(uri, retryWrites=False)
    acc = c.bank.acc
    # a committed transaction whose commit is retried after a failover: ok on the new
    # primary, from the replicated session record
    s1 = c.start_session()  # kept open: its lsid is the one the retry must carry
    s1.start_transaction()
    acc.update_one({"_id": 0}, {"$inc": {"n": -1}}, session=s1)
    acc.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
    s1.commit_transaction()
    committed_txn = s1._server_session.transaction_id
    # an open transaction when the primary is SIGKILLed: nothing of it applies
    before = {d["_id"]: d["n"] for d in acc.find({"_id": {"$in": [2, 3, 4]}})}
    s2 = c.start_session()
    s2.start_transaction()
    acc.update_one({"_id": 2}, {"$inc": {"n": -50}}, session=s2)
    acc.update_one({"_id": 3}, {"$inc": {"n": 50}}, session=s2)
    killed_txn = s2._server_session.transaction_id
    victim = primary_index(wires)
    procs[victim].signal(signal.SIGKILL)
    procs[victim].p.wait(timeout=10)
    with pytest.raises(PyMongoError) as e:
        acc.update_one({"_id": 4}, {"$inc": {"n": 1}}, session=s2)
    assert e.value.has_error_label("TransientTransactionError"), repr(e.value)
    s2.abort_transaction()  # best effort, as with_transaction does; errors swallowed
    # wait for a new primary
    rest = [w for i, w in enumerate(wires) if i != victim]
    wait_until(lambda: primary_index(rest) is not None, 60, interval=0.2, what="a new primary")
    # its commit on the new primary: NoSuchTransaction, transient (retry the whole thing)
    with pytest.raises(OperationFailure) as e:
        raw_end(c, s2, "commitTransaction", killed_txn)
    assert e.value.code == 251 and e.value.has_error_label("TransientTransactionError")
    s2.end_session()
    # the committed transaction's commit retried after the failover: ok, from the
    # replicated session record
    assert raw_end(c, s1, "commitTransaction", committed_txn)["ok"] == 1.0
    s1.end_session()
    # transactions go on on the new primary
    with c.start_session() as s:
        s.with_transaction(lambda ss: (acc.update_one({"_id": 5}, {"$inc": {"n": -7}},
                                                      session=ss),
                                       acc.update_one({"_id": 6}, {"$inc": {"n": 7}},
                                                      session=ss)))
    procs[victim].restart()
    procs[victim].wait_healthy()
    docs, _ = converged(wires)
    assert sum(d["n"] for d in docs) == 1000
    # nothing of the killed transaction, on any member (the restarted one included)
    assert {d["_id"]: d["n"] for d in docs if d["_id"] in (2, 3, 4)} == before
    c.close()


MONGOSH_TXN = r"""
const acc = db.getSiblingDB('bank').acc;
acc.insertMany([{_id: 1, n: 100}, {_id: 2, n: 0}]);
const s = db.getMongo().startSession();
const sacc = s.getDatabase('bank').acc;
s.withTransaction(() => {
  sacc.updateOne({_id: 1}, {$inc: {n: -40}});
  sacc.updateOne({_id: 2}, {$inc: {n: 40}});
});
s.startTransaction();
sacc.insertOne({_id: 3, n: 1});
const inside = sacc.countDocuments({});
const outside = acc.countDocuments({});
s.abortTransaction();
let err = null;
try {
  s.startTransaction();
  sacc.findOne({_id: 1});
  acc.updateOne({_id: 1}, {$inc: {n: 1}});
  sacc.updateOne({_id: 2}, {$inc: {n: 1}});
  s.commitTransaction();
} catch (e) {
  err = {code: e.code, labels: e.errorLabels || []};
  try { s.abortTransaction(); } catch (e2) {}
}
print(JSON.stringify({docs: acc.find().sort({_id: 1}).toArray(), inside, outside, err}));
"""


@needs_node_client("mongosh")
def test_mongosh_transactions(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", MONGOSH_TXN],
                       capture_output=True, text=True, timeout=120, cwd=HERE, env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"docs": [{"_id": 1, "n": 61}, {"_id": 2, "n": 40}], "inside": 3,
                   "outside": 2, "err": {"code": 112, "labels": ["TransientTransactionError"]}}


def test_refused_in_a_transaction_and_txn_numbers_owned_by_it(start_role, tmp_path):
    """Review of #16: count and anything on the admin database are refused inside a
    transaction (263), and a retryable write may not reuse the txnNumber of a transaction
    this primary knows (aborted here): nothing of it applies."""
    _, _, uri = one_member(start_role, tmp_path)
    c = client(uri, retryWrites=False)
    c.app.c.insert_one({"_id": 1})
    with c.start_session() as s:
        s.start_transaction()
        c.app.c.find_one({"_id": 1}, session=s)
        for fn in (lambda: c.app.command("count", "c", session=s),
                   lambda: c.admin.x.insert_one({"_id": 1}, session=s)):
            with pytest.raises(OperationFailure) as e:
                fn()
            assert e.value.code == 263, e.value.details
        s.abort_transaction()
        txn = s._server_session.transaction_id
        lsid = s.session_id
    assert c.admin.x.find_one({"_id": 1}) is None
    for n, code in ((txn, 217), (txn - 1, 225)):
        r = c.app.command(SON([("insert", "c"), ("documents", [{"_id": 100 + n}]),
                               ("lsid", lsid), ("txnNumber", Int64(n))]), check=False)
        assert r["ok"] == 0.0 and r["code"] == code, r
    assert c.app.c.count_documents({"_id": {"$gte": 100}}) == 0
