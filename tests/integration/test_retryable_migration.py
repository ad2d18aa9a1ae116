"""Exactly-once writes across chunk migrations (issue #16): the session records of
retryable writes travel with a migrating chunk (MongoDB's session catalog migration).

The source shard's oplog entry of a retryable statement carries lsid, txnNumber, stmtId and
the statement's recorded outcome (stmtResult); the coordinator's replicator writes that
record on the target in the same transaction as the replayed write (and the records of
statements that ran before the import's snapshot, read from the CDC log), so after the
traffic switch a retry that reaches the new owner is answered from the record, not run
again. A statement whose history cannot be known (a delete before the import whose chunk
cannot be told) is refused with IncompleteTransactionHistory (217), never run twice.
"""
import random
import threading
import uuid

import pytest
from bson import Binary, Int64
from bson.son import SON
from pymongo.errors import OperationFailure, PyMongoError

import pymongo

from conftest import free_port, http_get, wait_until
from migration_helpers import MigCluster

NS = "bank.acc"


def strip(r):
    return {k: v for k, v in r.items() if k not in ("$clusterTime", "operationTime")}


def new_lsid():
    return {"id": Binary(uuid.uuid4().bytes, 4)}


def run(client, cmd, lsid):
    """cmd (with its txnNumber) in the session lsid, through client (the proxy)."""
    with client.start_session() as s:
        s._server_session.session_id = lsid
        return client.bank.command(SON(cmd), session=s)  # pymongo adds fields to its copy


def retried_on(cl, sid):
    _, body = http_get(cl.shard_procs[sid].http_port, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("stripedb_shard_retried_statements_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_shard_session_fields_of_a_migration(start_role, tmp_path):
    """One shard, the wire side of the feature: a retryable statement's oplog entry carries
    stmtResult; $stripedbSession / $stripedbSessions are a migration's only (BadValue
    without $stripedbOrigin or with a txnNumber); an imported record answers a retry; the
    marker refuses an unrecorded statement (217); stripedbSessionList pages the sessions."""
    port = free_port()
    (tmp_path / "s").mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={tmp_path / 's'}"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            serverSelectionTimeoutMS=10000, retryWrites=False)
    try:
        db = c.bank
        lsid = new_lsid()
        with c.start_session() as s:
            s._server_session.session_id = lsid
            db.command(SON([("insert", "acc"), ("documents", [{"_id": 1, "n": 0}]),
                            ("txnNumber", Int64(4))]), session=s)
        (e,) = list(c.local.oplog.rs.find({"op": "i", "ns": "bank.acc"}))
        assert (e["txnNumber"], e["stmtId"], e["stmtResult"]) == (4, 0, {"n": 1}), e
        rec = {"lsid": new_lsid(), "txnNumber": Int64(7), "stmtId": 3,
               "result": {"n": 1, "nModified": 1}}
        stmt = {"q": {"_id": 2}, "u": {"_id": 2, "n": 1}, "upsert": True,
                "$stripedbSession": rec}
        # (pymongo cannot send an empty updates array: a statement that matches nothing)
        none = [{"q": {"_id": -1}, "u": {"$set": {"x": 1}}}]
        for bad in (SON([("update", "acc"), ("updates", [stmt])]),
                    SON([("update", "acc"), ("updates", [stmt]), ("txnNumber", Int64(1)),
                         ("$stripedbOrigin", "mig-t")]),
                    SON([("update", "acc"), ("updates", none), ("$stripedbSessions", [rec])]),
                    SON([("update", "acc"), ("updates", none), ("$stripedbOrigin", "mig-t"),
                         ("$stripedbSessions", [{"lsid": rec["lsid"]}])])):
            with c.start_session() as s, pytest.raises(OperationFailure) as ex:
                s._server_session.session_id = new_lsid()
                db.command(bad, session=s)
            assert ex.value.code == 2, ex.value.details
        assert db.acc.count_documents({"_id": 2}) == 0
        db.command(SON([("update", "acc"), ("updates", [stmt]), ("$stripedbOrigin", "mig-t")]))
        marker = {"lsid": new_lsid(), "txnNumber": Int64(2), "incompleteHistory": True}
        db.command(SON([("update", "acc"), ("updates", none), ("$stripedbOrigin", "mig-t"),
                        ("$stripedbSessions", [marker])]))
        # the replayed statement's entry carries the record again (a later migration)
        (u,) = list(c.local.oplog.rs.find({"ns": "bank.acc", "o._id": 2}))
        assert (u["origin"], u["txnNumber"], u["stmtId"]) == ("mig-t", 7, 3), u
        assert u["stmtResult"] == {"n": 1, "nModified": 1}
        retry = SON([("update", "acc"), ("updates", [{"q": {"_id": 9}, "u": {"$inc": {"n": 1}}}] * 4),
                     ("txnNumber", Int64(7)), ("stmtId", 0)])
        with c.start_session() as s:
            s._server_session.session_id = rec["lsid"]
            r = db.command(retry, session=s)  # statement 3 answered from its record
        assert strip(r) == {"n": 1, "nModified": 1, "ok": 1.0}
        with c.start_session() as s:
            s._server_session.session_id = marker["lsid"]
            with pytest.raises(OperationFailure) as ex:
                db.command(SON([("delete", "acc"), ("deletes", [{"q": {"_id": 1}, "limit": 1}]),
                                ("txnNumber", Int64(2))]), session=s)
            assert ex.value.code == 217, ex.value.details
        assert db.acc.count_documents({"_id": 1}) == 1
        listed = db.command({"stripedbSessionList": 1, "limit": 2})
        assert len(listed["sessions"]) == 2 and listed["more"] is True
        last = listed["sessions"][-1]["lsid"]["id"]  # decoded as a UUID: its bytes again
        rest = db.command({"stripedbSessionList": 1, "after": {"id": Binary(last.bytes, 4)}})
        assert len(rest["sessions"]) == 1 and rest["more"] is False
        got = {(x["lsid"]["id"].bytes, x["txnNumber"])
               for x in listed["sessions"] + rest["sessions"]}
        assert got == {(bytes(l["id"]), t) for l, t in ((lsid, 4), (rec["lsid"], 7),
                                                         (marker["lsid"], 2))}
    finally:
        c.close()


def make_cluster(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    # [MinKey, 100) on shard-a (the chunk that moves), [100, MaxKey) on shard-b; the shard
    # key is not _id, so a delete's oplog entry ({_id}) does not tell its chunk
    cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 100}], shards=["shard-a", "shard-b"])
    c = cl.proxy_client()
    c.bank.acc.insert_many([{"_id": f"a{i}", "k": i, "n": 0, "ids": []} for i in range(200)])
    (chunk,) = [ch for ch in cl.chunks(NS) if ch["shard"] == "shard-a"]
    return cl, c, chunk


def ops(tag, base):
    """The three retryable writes of the issue: an update with $inc, a findAndModify and an
    insert (two documents), on accounts base, base+1 of the moving chunk."""
    return [
        SON([("update", "acc"),
             ("updates", [{"q": {"k": base}, "u": {"$inc": {"n": 1}, "$push": {"ids": tag}}}]),
             ("txnNumber", Int64(1))]),
        SON([("findAndModify", "acc"), ("query", {"k": base + 1}),
             ("update", {"$inc": {"n": 5}, "$push": {"ids": tag}}), ("new", True),
             ("txnNumber", Int64(1))]),
        SON([("insert", "acc"),
             ("documents", [{"_id": f"{tag}-x", "k": base + 2, "n": 1, "ids": [tag]},
                            {"_id": f"{tag}-y", "k": base + 3, "n": 1, "ids": [tag]}]),
             ("txnNumber", Int64(1))]),
    ]


def test_retry_after_migration_answers_the_recorded_result(start_role, tmp_path):
    """Writes executed on the source before the migration (their records travel from the
    CDC log's history window) and while it replicates (their records ride on the replayed
    writes); after the switch each is retried with its lsid/txnNumber through the proxy:
    the new owner answers the original reply and nothing is applied twice."""
    cl, c, chunk = make_cluster(start_role, tmp_path)
    try:
        before = [(cmd, new_lsid()) for cmd in ops("pre", 10)]
        first = [run(c, cmd, lsid) for cmd, lsid in before]
        # a retryable delete before the import: its chunk cannot be told from {_id}
        dlsid = new_lsid()
        dcmd = SON([("delete", "acc"), ("deletes", [{"q": {"k": 30}, "limit": 1}]),
                    ("txnNumber", Int64(1))])
        assert strip(run(c, dcmd, dlsid)) == {"n": 1, "ok": 1.0}

        # replication paused before the migration starts (what `ctl migration pause` takes),
        # so that the writes below run on the source after the import's snapshot
        mid = "mig-sessions-1"
        pause = {"acquireLease": f"mig-pause/{mid}", "holder": "test", "ttlMS": 600000}
        cl.meta_write(pause)
        assert cl.migrate(NS, chunk["id"], "shard-b", "--grace-ms=300", f"--id={mid}") == mid
        cl.wait_migration(mid, {"replicating"})
        during = [(cmd, new_lsid()) for cmd in ops("mid", 20)]
        first += [run(c, cmd, lsid) for cmd, lsid in during]
        cl.meta_write({"releaseLease": f"mig-pause/{mid}", "holder": "test"})
        m = cl.wait_migration(mid)
        assert m["state"] == "complete", m
        assert [ch["shard"] for ch in cl.chunks(NS)] == ["shard-b", "shard-b"]
        assert cl.shard_client("shard-a").bank.acc.count_documents({}) == 0

        # the retries reach the new owner
        assert retried_on(cl, "shard-b") == 0
        again = [run(c, cmd, lsid) for cmd, lsid in before + during]
        assert [strip(r) for r in again] == [strip(r) for r in first]
        assert retried_on(cl, "shard-b") == 8  # 1 update + 1 findAndModify + 2 inserts, x2
        # applied once
        acc = {d["_id"]: d for d in c.bank.acc.find()}
        for tag, base in (("pre", 10), ("mid", 20)):
            assert acc[f"a{base}"]["n"] == 1 and acc[f"a{base}"]["ids"] == [tag]
            assert acc[f"a{base + 1}"]["n"] == 5 and acc[f"a{base + 1}"]["ids"] == [tag]
            assert acc[f"{tag}-x"]["ids"] == [tag] and acc[f"{tag}-y"]["ids"] == [tag]
        assert first[1]["value"]["n"] == 5 and again[1]["value"] == first[1]["value"]
        # the delete's history is unknown at the new owner: refused, not run again
        r = strip(run(c, dcmd, dlsid))
        assert r["n"] == 0, r
        (we,) = r["writeErrors"]
        assert we["code"] == 217 and we["codeName"] == "IncompleteTransactionHistory", we
        assert c.bank.acc.count_documents({}) == 200 - 1 + 4
        # a new txnNumber of the same sessions runs normally on the new owner
        nxt = SON(list(before[0][0].items()))
        nxt["txnNumber"] = Int64(2)
        assert strip(run(c, nxt, before[0][1]))["nModified"] == 1
        assert c.bank.acc.find_one({"_id": "a10"})["n"] == 2
        dnext = SON([("delete", "acc"), ("deletes", [{"q": {"k": 32}, "limit": 1}]),
                     ("txnNumber", Int64(2))])
        assert strip(run(c, dnext, dlsid)) == {"n": 1, "ok": 1.0}
    finally:
        cl.close()


def test_history_that_cannot_be_carried_is_refused_not_run_twice(start_role, tmp_path):
    """A migration that carries no session history from before its import (spec
    sessionHistoryMS 0: what happens when the CDC log's retention dropped it): every session
    live on the source is marked on the target; a retry there of a statement that ran on
    the source is refused with IncompleteTransactionHistory (217), not run a second time,
    and a newer txnNumber of the same session runs normally."""
    cl, c, chunk = make_cluster(start_role, tmp_path)
    try:
        lsid = new_lsid()
        upd, fam, _ = ops("pre", 10)
        assert strip(run(c, upd, lsid))["nModified"] == 1
        flsid = new_lsid()
        assert run(c, fam, flsid)["value"]["n"] == 5
        mid = "mig-no-history"
        cl.meta_write({"registerMigration": mid, "ns": NS, "chunk": chunk["id"],
                       "from": "shard-a", "to": "shard-b", "graceMS": 300,
                       "sessionHistoryMS": 0})
        m = cl.wait_migration(mid)
        assert m["state"] == "complete", m
        r = strip(run(c, upd, lsid))
        assert r["n"] == 0 and [e["code"] for e in r["writeErrors"]] == [217], r
        with pytest.raises(OperationFailure) as e:
            run(c, fam, flsid)
        assert e.value.code == 217, e.value.details
        acc = {d["_id"]: d for d in c.bank.acc.find({"_id": {"$in": ["a10", "a11"]}})}
        assert acc["a10"]["n"] == 1 and acc["a11"]["n"] == 5  # not run again
        nxt = SON(list(upd.items()))
        nxt["txnNumber"] = Int64(2)
        assert strip(run(c, nxt, lsid)) == {"n": 1, "nModified": 1, "ok": 1.0}
        assert c.bank.acc.find_one({"_id": "a10"})["n"] == 2
    finally:
        cl.close()


class RetryLoad:
    """Writers of retryable writes through the proxy, each write in its own session
    (lsid, txnNumber 1), so any of them can be retried later: pushes of unique ids onto
    accounts of the moving chunk and inserts of unique documents. A write whose reply was
    lost is retried with the same lsid/txnNumber until it answers (what a driver does);
    some acknowledged writes are sent again at random while the migration runs."""

    def __init__(self, c, writers=2):
        self.c = c
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = []      # (cmd, lsid, reply, uid, kind)
        self.mismatch = []  # (cmd, first reply, retry reply)
        self.retries = 0
        self.threads = [threading.Thread(target=self.run, args=(w,)) for w in range(writers)]

    def send(self, cmd, lsid):
        for _ in range(50):
            try:
                return run(self.c, cmd, lsid)
            except PyMongoError as e:
                last = e
                if self.stop.wait(0.02):  # pacing after an error only
                    pass
        raise last

    def run(self, w):
        rnd = random.Random(w)
        i = 0
        while not self.stop.is_set():
            uid = f"w{w}-{i}"
            i += 1
            lsid = new_lsid()
            if rnd.random() < 0.7:
                kind = "push"
                cmd = SON([("update", "acc"),
                           ("updates", [{"q": {"k": rnd.randrange(0, 100)},
                                         "u": {"$push": {"ids": uid}, "$inc": {"n": 1}}}]),
                           ("txnNumber", Int64(1))])
            else:
                kind = "insert"
                cmd = SON([("insert", "acc"),
                           ("documents", [{"_id": uid, "k": rnd.randrange(0, 100), "n": 0,
                                           "ids": []}]),
                           ("txnNumber", Int64(1))])
            reply = self.send(cmd, lsid)
            with self.lock:
                self.done.append((cmd, lsid, reply, uid, kind))
                old = rnd.choice(self.done) if rnd.random() < 0.3 else None
            if old:
                self.retry(old)

    def retry(self, op):
        cmd, lsid, reply, _, _ = op
        r = self.send(cmd, lsid)
        with self.lock:
            self.retries += 1
            if strip(r) != strip(reply):
                self.mismatch.append((cmd, reply, r))

    def count(self):
        with self.lock:
            return len(self.done)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def sample(ops, first, k=200):
    """The first `first` operations (at most k of them) and k random others: what a test
    retries (all of them would take longer than the CI budget)."""
    head, rest = ops[:min(first, k)], ops[min(first, k):]
    return head + random.Random(0).sample(rest, min(k, len(rest)))


def check_exactly_once(c, load):
    """The final state against what was acknowledged: each id pushed or inserted exactly
    once, every acknowledged one present, counters equal to the ids pushed."""
    seen = {}
    for d in c.bank.acc.find():
        assert d["n"] == len(d["ids"]), d
        for u in d["ids"]:
            seen[u] = seen.get(u, 0) + 1
        if d["_id"].startswith("w"):
            seen[d["_id"]] = seen.get(d["_id"], 0) + 1
    dup = {u: k for u, k in seen.items() if k > 1}
    assert not dup, dup
    missing = [uid for _, _, _, uid, _ in load.done if uid not in seen]
    assert not missing, missing[:10]
    assert not load.mismatch, load.mismatch[:3]

def test_retryable_write_load_across_a_migration_applies_each_write_once(start_role,
                                                                          tmp_path):
    """Jepsen style: a load of retryable writes (each id pushed or inserted once) while the
    chunk migrates; acknowledged writes are retried at random during the migration and all
    of the source's are retried again after the switch, at the new owner. Checked against
    the final state: every id present exactly once, each account's counter equal to its
    ids, every retry answered with the original reply."""
    cl, c, chunk = make_cluster(start_role, tmp_path)
    try:
        load = RetryLoad(c).start()
        wait_until(lambda: load.count() >= 60, 30, what="retryable load running")
        mid = cl.migrate(NS, chunk["id"], "shard-b", "--grace-ms=300")
        m = cl.wait_migration(mid)
        n_at_switch = load.count()
        wait_until(lambda: load.count() >= n_at_switch + 30, 30, what="writes after the switch")
        load.finish()
        assert m["state"] == "complete", m
        assert not load.mismatch, load.mismatch[:3]
        # the writes acknowledged before the switch (those ran on the source) and others
        # are retried once more, at the new owner
        before = retried_on(cl, "shard-b")
        again = sample(load.done, n_at_switch)
        for op in again:
            load.retry(op)
        assert not load.mismatch, load.mismatch[:3]
        assert retried_on(cl, "shard-b") - before == len(again)

        check_exactly_once(c, load)
        assert len(load.done) >= 90 and load.retries > 200
    finally:
        cl.close()


def test_retryable_load_with_coordinator_crashes_and_a_rollback(start_role, tmp_path):
    """The same load while the coordinator is killed at replication and switch points (the
    replayed writes and their records are applied again, idempotently), then the switch is
    rolled back: writes acknowledged by the new owner travel back with their records
    (reverse replication). Every acknowledged write is retried at the target after the
    switch and at the source after the rollback: the original reply each time, and each id
    applied once."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=0)
    try:
        cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        c = cl.proxy_client()
        c.bank.acc.insert_many([{"_id": f"a{i}", "k": i, "n": 0, "ids": []}
                                for i in range(200)])
        (chunk,) = [ch for ch in cl.chunks(NS) if ch["shard"] == "shard-a"]
        load = RetryLoad(c).start()
        wait_until(lambda: load.count() >= 40, 30, what="retryable load running")
        mid = cl.migrate(NS, chunk["id"], "shard-b", "--grace-ms=600000")
        for pt in ["after:importing", "mid:replicate", "mid:switch", "after:switched"]:
            co = cl.start_role(["--role=coordinator", f"--metadata={cl.metadata}",
                                f"--cdc={cl.cdc}", f"--cdc-lease-ms={cl.lease_ms}"],
                               env={"STRIPEDB_MIGRATION_CRASH": pt}, wait=False)
            co.p.wait(timeout=60)
            assert co.p.returncode == 86, (pt, co.tail())
        cl.coords.append(cl.start_coordinator())
        m = cl.wait_migration(mid, {"switched", "aborted"})
        assert m["state"] == "switched", m
        n_switch = load.count()
        wait_until(lambda: load.count() >= n_switch + 30, 30, what="writes on the new owner")
        before = retried_on(cl, "shard-b")
        done = sample(list(load.done), n_switch)  # those that ran on the source first
        for op in done:
            load.retry(op)
        assert retried_on(cl, "shard-b") - before >= len(done)
        r = cl.ctl("migration", "rollback", mid)
        assert r.stdout.decode().strip() == f"{mid}: switched -> rolling_back"
        m = cl.wait_migration(mid)
        assert m["state"] == "rolled_back", m
        assert m["stats"]["reverseApplied"] > 0
        n_back = n = load.count()
        wait_until(lambda: load.count() >= n + 30, 30, what="writes after the rollback")
        load.finish()
        before = retried_on(cl, "shard-a")
        # the writes acknowledged by the new owner (reverse replication carried them back)
        # and others
        done = sample(list(load.done)[n_switch:n_back], 0) + list(load.done)[:50]
        for op in done:
            load.retry(op)
        assert retried_on(cl, "shard-a") - before == len(done)
        check_exactly_once(c, load)
    finally:
        cl.close()
