"""Linearizability of single-document operations on a shard replica set (issue #15, "Must
show"), with the Wing & Gong checker of linearizability.py.

Clients (pymongo, replicaSet URI, retryWrites and retryReads off: the driver hides nothing)
run on a few registers, documents {_id: K, v: V}: reads (find_one on the primary), blind
writes (update_one $set to a value unique to the operation) and compare-and-set
(find_one_and_update({_id: K, v: X}, {$set: {v: Y}}): a document back is a success, None a
failure, i.e. v != X at that point). A nemesis alternates SIGKILL of the primary (restarted
shortly after) and a partition of the primary from the two other members (each member runs
in its own network namespace, shard_net.py; healed shortly after).

Error classification: NotWritablePrimary (10107) and NotPrimaryNoSecondaryOk (13435) are
refusals before anything was proposed (no effect, dropped from the history); any other error
of a write or CAS is an unknown outcome (it may take effect at any time after its call, or
never); a failed read is dropped.

Bounded for CI: STRIPEDB_LIN_SECONDS (default 15) of load per nemesis.
"""
import os
import random
import signal
import threading
import time

import pymongo
import pytest
from pymongo.errors import PyMongoError

from linearizability import check
from shard_net import ShardNet, skip_reason

_SKIP = skip_reason()
# Compaction every 128 entries: members killed or cut off catch up from a snapshot
# installed from another member as well as from the log.
COMPACTION = ["--raft-snapshot-threshold=128"]
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

KEYS = ["r0", "r1", "r2"]


@pytest.fixture
def net(tmp_path, request):
    n = ShardNet(tmp_path, 3)
    try:
        n.up()
        yield n
        failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
        if failed:
            print(n.logs())
    finally:
        problems = n.down()
    assert not problems, "\n".join(problems)


def refused(e):
    details = getattr(e, "details", None) or {}
    return details.get("code") in (10107, 13435)


class Client(threading.Thread):
    def __init__(self, uri, n, history, lock, stop, seed):
        super().__init__(daemon=True)
        self.uri, self.n = uri, n
        self.history, self.lock, self.stop = history, lock, stop
        self.rng = random.Random(seed)
        self.seq = 0

    def record(self, d):
        with self.lock:
            self.history.append(d)

    def run(self):
        c = pymongo.MongoClient(self.uri, retryWrites=False, retryReads=False,
                                serverSelectionTimeoutMS=5000, connectTimeoutMS=1000,
                                socketTimeoutMS=3000, heartbeatFrequencyMS=500)
        coll = c.app.reg
        try:
            while not self.stop.is_set():
                k = self.rng.choice(KEYS)
                r = self.rng.random()
                self.seq += 1
                val = self.n * 1_000_000 + self.seq
                t0 = time.monotonic()
                if r < 0.4:
                    d = {"key": k, "kind": "read", "call": t0}
                    try:
                        doc = coll.find_one({"_id": k})
                        d.update(ret=time.monotonic(), value=doc["v"])
                        self.record(d)
                    except PyMongoError:
                        self.stop.wait(0.02)  # pacing after an error only
                    continue
                if r < 0.7:
                    d = {"key": k, "kind": "write", "call": t0, "value": val}
                else:
                    # expect a value some operation on k wrote (known to this client)
                    with self.lock:
                        seen = [o.get("value", o.get("new")) for o in self.history[-50:]
                                if o["key"] == k and o.get("outcome", "ok") == "ok"]
                    seen = [v for v in seen if v is not None] or [0]
                    d = {"key": k, "kind": "cas", "call": t0, "expect": self.rng.choice(seen),
                         "new": val}
                try:
                    if d["kind"] == "write":
                        res = coll.update_one({"_id": k}, {"$set": {"v": val}})
                        assert res.matched_count == 1
                        d.update(ret=time.monotonic(), outcome="ok")
                    else:
                        res = coll.find_one_and_update({"_id": k, "v": d["expect"]},
                                                       {"$set": {"v": val}})
                        d.update(ret=time.monotonic(),
                                 outcome="ok" if res is not None else "fail")
                    self.record(d)
                except PyMongoError as e:
                    if refused(e):
                        continue
                    d.update(ret=None, outcome="unknown")
                    self.record(d)
                    self.stop.wait(0.02)
        finally:
            c.close()


class Nemesis(threading.Thread):
    def __init__(self, net, rs, stop, seed, kinds):
        super().__init__(daemon=True)
        self.net, self.rs, self.stop = net, rs, stop
        self.rng = random.Random(seed)
        self.kinds = kinds
        self.done = {"kill": 0, "partition": 0}
        self.error = None

    def run(self):
        try:
            n = 0
            while not self.stop.wait(self.rng.uniform(1.0, 2.0)):
                kind = self.kinds[n % len(self.kinds)]
                n += 1
                p = self.rs.primary()
                if p is None:
                    continue
                if kind == "kill":
                    proc = self.rs.procs[p]
                    proc.signal(signal.SIGKILL)
                    proc.p.wait(timeout=10)
                    proc.log.close()
                    self.stop.wait(self.rng.uniform(1.0, 2.0))
                    proc.restart().wait_healthy()
                else:
                    self.net.partition([self.rs.hosts[p]],
                                       [self.rs.hosts[i] for i in range(3) if i != p])
                    self.stop.wait(self.rng.uniform(1.5, 3.0))
                    self.net.heal()
                self.done[kind] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.net.heal()


@pytest.mark.parametrize("kinds", [["kill"], ["partition"]], ids=["kill", "partition"])
def test_single_document_read_write_cas_linearizable(net, kinds):
    seconds = float(os.environ.get("STRIPEDB_LIN_SECONDS", "15"))
    seed = int(os.environ.get("STRIPEDB_LIN_SEED", str(int(time.time()))))
    print(f"seed={seed} seconds={seconds} nemesis={kinds}")
    rs = net.replset("rs-lin", [1, 2, 3], COMPACTION)
    with pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=20000) as c:
        c.app.reg.insert_many([{"_id": k, "v": 0} for k in KEYS])
    history, lock, stop = [], threading.Lock(), threading.Event()
    clients = [Client(rs.uri, i + 1, history, lock, stop, seed + i) for i in range(4)]
    nemesis = Nemesis(net, rs, stop, seed, kinds)
    for t in clients:
        t.start()
    nemesis.start()
    stop.wait(seconds)
    stop.set()
    nemesis.join(60)
    for t in clients:
        t.join(30)
    assert nemesis.error is None, nemesis.error
    assert sum(nemesis.done.values()) >= 2, nemesis.done

    done = [o for o in history if o["ret"] is not None]
    assert sum(1 for o in done if o["kind"] != "read" and o["outcome"] == "ok") >= 20
    assert sum(1 for o in done if o["kind"] == "read") >= 20
    t0 = time.monotonic()
    ok, details = check(history, {k: 0 for k in KEYS}, budget_s=60)
    unknown = sum(1 for o in history if o["ret"] is None)
    print(f"{len(history)} operations ({unknown} unknown), nemesis {nemesis.done}, checked in"
          f" {time.monotonic() - t0:.2f}s: {details}")
    assert ok is True, details

    # every member ends with the same registers, and they are values some operation wrote
    docs, _ = rs.converged("app", "reg")
    written = {o.get("value", o.get("new")) for o in history if o["kind"] != "read"} | {0}
    assert all(d["v"] in written for d in docs), docs
