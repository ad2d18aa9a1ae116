"""Single-shard multi-document transactions through the proxy (issue #16, src/proxy/txnroute.c).

Real processes (metadata, shards, proxies on loopback) and real clients: pymongo's
start_transaction / with_transaction (the commands on the wire are exactly a driver's:
lsid, txnNumber, autocommit: false, startTransaction, commitTransaction with the
recoveryToken the proxy returned) and mongosh's session.withTransaction.

* commit, abort, read-your-own-writes on a sharded collection; a statement for a second
  shard (or a scatter read) is refused with 263 and nothing of the transaction applies;
  a write conflict is retried by with_transaction; an unsharded collection.
* the bank (Jepsen style, issue #16 "Must show"): 50 accounts in groups sharded over 3
  shards that are 3-member replica sets, the shard key is the group so a transfer is a
  single-shard transaction; transfers through two proxies with driver defaults while a
  proxy and shard primaries are SIGKILLed (and restarted), and a chunk migrates. At the
  end the total is exact, no account is negative, and every acknowledged transfer is
  applied (each transfer also pushes its id on both accounts: applied at most once, and
  both halves or neither).
"""
import json
import random
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid

import bson
import pymongo
import pytest
from bson import Binary, Int64
from bson.son import SON
from pymongo.errors import OperationFailure, PyMongoError

from conftest import MONGOSH, free_port, needs_node_client, node_env, wait_until
from proxy_helpers import ProxyCluster


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=2)
    yield cl
    cl.close()


def chunk_shards(cl, ns):
    """{lower bound of g (None = MinKey): shard} of ns's chunks."""
    out = {}
    for ch in cl.routing(ns)["chunks"]:
        lo = ch["min"]["g"]
        out[lo if isinstance(lo, int) else None] = ch["shard"]
    return out


def setup_accounts(cl, ns="bank.acc"):
    """Accounts _id 0..29, group g = _id // 10: groups 0, 1, 2 on three different shards."""
    cl.shard_collection(ns, {"g": 1}, split_points=[{"g": 1}, {"g": 2}])
    owners = chunk_shards(cl, ns)
    assert len(set(owners.values())) == 3, owners
    db, coll = ns.split(".")
    cl.proxy_client(0)[db][coll].insert_many(
        [{"_id": i, "g": i // 10, "n": 100} for i in range(30)])
    return owners


def balances(coll):
    return {d["_id"]: d["n"] for d in coll.find()}


def fails(fn, code):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == code, e.value.details
    return e.value


def test_commit_abort_second_shard_and_unsharded(cluster):
    setup_accounts(cluster)
    c = cluster.proxy_client(0)
    other = cluster.proxy_client(1).bank.acc
    acc = c.bank.acc
    before = balances(other)

    # with_transaction commit: both halves, read-your-own-writes inside, invisible outside
    seen = {}

    def transfer(s):
        acc.update_one({"_id": 1, "g": 0}, {"$inc": {"n": -10}}, session=s)
        acc.update_one({"_id": 2, "g": 0}, {"$inc": {"n": 10}}, session=s)
        seen["inside"] = acc.find_one({"_id": 1, "g": 0}, session=s)["n"]
        seen["outside"] = other.find_one({"_id": 1, "g": 0})["n"]

    with c.start_session() as s:
        s.with_transaction(transfer)
    assert seen == {"inside": 90, "outside": 100}
    after = balances(other)
    assert after[1] == 90 and after[2] == 110

    # abort: nothing applied
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": 3, "g": 0}, {"$inc": {"n": -50}}, session=s)
        acc.insert_one({"_id": 100, "g": 0, "n": 1}, session=s)
        assert acc.find_one({"_id": 3, "g": 0}, session=s)["n"] == 50
        s.abort_transaction()
    assert balances(other) == after

    # a statement for a second shard: 263, and nothing of the transaction applies
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": 4, "g": 0}, {"$inc": {"n": -7}}, session=s)
        e = fails(lambda: acc.update_one({"_id": 15, "g": 1}, {"$inc": {"n": 7}},
                                         session=s), 263)
        assert "second shard" in e.details["errmsg"]
        # the transaction is over on the proxy and on the shard
        e = fails(lambda: acc.find_one({"_id": 4, "g": 0}, session=s), 251)
        assert "TransientTransactionError" in e.details.get("errorLabels", [])
        fails(s.commit_transaction, 251)
    assert balances(other) == after

    # a scatter read as the first statement touches every shard: 263
    with c.start_session() as s:
        s.start_transaction()
        fails(lambda: list(acc.find({}, session=s)), 263)
        s.abort_transaction()

    # a multi-shard update_many: 263, nothing applied
    with c.start_session() as s:
        s.start_transaction()
        fails(lambda: acc.update_many({}, {"$inc": {"n": 1}}, session=s), 263)
        s.abort_transaction()
    assert balances(other) == after

    # unsharded collection (lives on the primary shard): commit and abort
    plain = c.bank.plain
    with c.start_session() as s:
        s.with_transaction(lambda s: plain.insert_many([{"_id": 1}, {"_id": 2}], session=s))
    with c.start_session() as s:
        s.start_transaction()
        plain.insert_one({"_id": 3}, session=s)
        plain.delete_one({"_id": 1}, session=s)
        s.abort_transaction()
    assert sorted(d["_id"] for d in cluster.proxy_client(1).bank.plain.find()) == [1, 2]
    assert balances(other) == after
    assert sum(after.values()) == sum(before.values())
    # the proxy that ran them stops cleanly (its session table freed: LeakSanitizer in CI)
    cluster.stop_proxy_clean(0)


def test_write_conflict_retried_by_with_transaction(cluster):
    setup_accounts(cluster)
    c = cluster.proxy_client(0)
    c2 = cluster.proxy_client(1)
    acc = c.bank.acc
    calls = []

    with c2.start_session() as s1:
        s1.start_transaction()
        c2.bank.acc.update_one({"_id": 5, "g": 0}, {"$inc": {"n": 1}}, session=s1)

        def cb(s):
            calls.append(1)
            acc.update_one({"_id": 5, "g": 0}, {"$inc": {"n": 10}}, session=s)
            if len(calls) == 1:
                s1.commit_transaction()  # commits first: this attempt must conflict

        with c.start_session() as s:
            s.with_transaction(cb)
    assert len(calls) == 2, calls
    assert acc.find_one({"_id": 5, "g": 0})["n"] == 111


class Raw:
    """One connection to a proxy speaking OP_MSG directly, so the session fields are
    exactly the test's (pymongo replaces lsid with its own session's)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.rid = 0

    def cmd(self, db, fields):
        self.rid += 1
        doc = bson.encode(SON([*fields, ("$db", db)]))
        payload = struct.pack("<I", 0) + b"\0" + doc
        self.sock.sendall(struct.pack("<iiii", 16 + len(payload), self.rid, 0, 2013) + payload)
        head = self._recv(16)
        body = self._recv(struct.unpack("<i", head[:4])[0] - 16)
        return bson.decode(body[5:])

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def close(self):
        self.sock.close()


def test_raw_protocol_recovery_token_and_session_rules(cluster):
    """The wire protocol as drivers send it: the reply carries the recoveryToken; the
    other proxy does not know the session (a statement there is NoSuchTransaction with
    TransientTransactionError, as a commit without recoveryToken), a commit through it WITH
    the recoveryToken (a driver unpinned after a proxy failure) commits on the shard; a
    commit retried after a success is ok again; an older txnNumber is TransactionTooOld."""
    owners = setup_accounts(cluster)
    r0, r1 = Raw(cluster.proxy_ports[0]), Raw(cluster.proxy_ports[1])
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    base = [("lsid", lsid), ("txnNumber", Int64(1)), ("autocommit", False)]
    r = r0.cmd("bank", [("update", "acc"), ("updates", [
        {"q": {"_id": 21, "g": 2}, "u": {"$inc": {"n": 5}}}]), *base,
        ("startTransaction", True)])
    assert r["ok"] == 1 and r["nModified"] == 1, r
    assert r["recoveryToken"] == {"recoveryShardId": owners[2]}
    r = r1.cmd("bank", [("find", "acc"), ("filter", {"_id": 21, "g": 2}), *base])
    assert r["code"] == 251 and "TransientTransactionError" in r["errorLabels"], r
    r = r1.cmd("admin", [("commitTransaction", 1), *base])
    assert r["code"] == 251, r
    r = r1.cmd("admin", [("commitTransaction", 1), *base,
                         ("recoveryToken", {"recoveryShardId": owners[2]})])
    assert r["ok"] == 1, r
    assert r0.cmd("admin", [("commitTransaction", 1), *base])["ok"] == 1
    assert cluster.proxy_client(0).bank.acc.find_one({"_id": 21, "g": 2})["n"] == 105
    r = r0.cmd("bank", [("find", "acc"), ("filter", {"_id": 21, "g": 2}), ("lsid", lsid),
                        ("txnNumber", Int64(0)), ("autocommit", False),
                        ("startTransaction", True)])
    assert r["code"] == 225, r
    # the same session from two connections at once: serialized, both answered
    base2 = [("lsid", lsid), ("txnNumber", Int64(2)), ("autocommit", False)]
    r = r0.cmd("bank", [("find", "acc"), ("filter", {"_id": 22, "g": 2}), *base2,
                        ("startTransaction", True)])
    assert r["ok"] == 1, r
    out = []
    r2 = Raw(cluster.proxy_ports[0])
    ts = [threading.Thread(target=lambda c=c, i=i: out.append(c.cmd("bank", [
        ("update", "acc"), ("updates", [{"q": {"_id": 22 + i, "g": 2},
                                         "u": {"$inc": {"n": 1}}}]), *base2])))
        for i, c in enumerate((r0, r2))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert [o["ok"] for o in out] == [1, 1], out
    assert r0.cmd("admin", [("commitTransaction", 1), *base2])["ok"] == 1
    got = balances(cluster.proxy_client(1).bank.acc)
    assert got[22] == 101 and got[23] == 101
    for c in (r0, r1, r2):
        c.close()


def test_commit_through_another_proxy_after_the_pinned_one_died(cluster):
    """pymongo pins a proxy for the transaction; SIGKILL of it before the commit: the
    driver's commit retry goes to the other proxy with the recoveryToken, which commits on
    the shard. The transfer is applied once."""
    setup_accounts(cluster)
    hosts = ",".join(f"127.0.0.1:{p}" for p in cluster.proxy_ports)
    c = pymongo.MongoClient(f"mongodb://{hosts}/", serverSelectionTimeoutMS=20000)
    cluster._clients.append(c)
    acc = c.bank.acc
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": 25, "g": 2}, {"$inc": {"n": -20}}, session=s)
        acc.update_one({"_id": 26, "g": 2}, {"$inc": {"n": 20}}, session=s)
        pinned = s._pinned_address
        assert pinned is not None
        i = cluster.proxy_ports.index(pinned[1])
        cluster.proxy_procs[i].signal(signal.SIGKILL)
        cluster.proxy_procs[i].p.wait(timeout=10)
        s.commit_transaction()
    got = balances(cluster.proxy_client(1 - i).bank.acc)
    assert got[25] == 80 and got[26] == 120


MONGOSH_TXN = """
const s = db.getMongo().startSession();
const acc = s.getDatabase("bank").acc;
s.withTransaction(() => {
  acc.updateOne({_id: 11, g: 1}, {$inc: {n: -30}});
  acc.updateOne({_id: 12, g: 1}, {$inc: {n: 30}});
});
s.endSession();
const plain = db.getSiblingDB("bank").acc;
print(JSON.stringify({a: plain.findOne({_id: 11, g: 1}).n, b: plain.findOne({_id: 12, g: 1}).n}));
"""


@needs_node_client("mongosh")
def test_mongosh_with_transaction(cluster):
    setup_accounts(cluster)
    uri = f"mongodb://127.0.0.1:{cluster.proxy_ports[0]}/?directConnection=true"
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", MONGOSH_TXN],
                       capture_output=True, text=True, timeout=120, env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"a": 70, "b": 130}


# ---------- the bank (Jepsen style) ----------

N_ACCOUNTS = 50
GROUPS = 5
INITIAL = 100
WRITERS = 4


def replset_cluster(start_role, tmp_path, n_shards=3, meta_members=1):
    """Metadata (meta_members members), n_shards shards that are 3-member replica sets,
    two proxies: a ProxyCluster plus {shard id: (member procs, wire ports)}."""
    from test_shard_replset import start_set
    cl = ProxyCluster(start_role, tmp_path, shards=0, proxies=0, meta_members=meta_members)
    sets = {}
    for i in range(n_shards):
        sid = f"rs-{chr(ord('a') + i)}"
        d = tmp_path / sid
        d.mkdir()
        procs, wires, uri = start_set(start_role, d, n=3)
        cl.meta_cmd({"addShard": sid, "uri": uri})
        cl.shard_ids.append(sid)
        sets[sid] = (procs, wires)
    for _ in range(2):
        cl.add_proxy()
    # the coordinator runs migrations (moveChunk through a proxy registers one)
    start_role(["--role=coordinator", f"--metadata={cl.metadata_addr}",
                f"--cdc=embedded:{tmp_path}/cdc"])
    return cl, sets


class TxnBank:
    """WRITERS threads of with_transaction transfers inside one group (one shard): read
    both balances, refuse an overdraft, else $inc both and $push the transfer id on both."""

    def __init__(self, coll, client):
        self.coll = coll
        self.client = client
        self.acked = set()      # committed transfers (with_transaction returned)
        self.noop = 0           # acknowledged, refused overdraft (read-only)
        self.attempts = 0       # callback runs (with_transaction retries included)
        self.unknown = set()    # with_transaction raised: may or may not have committed
        self.errors = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True)
                        for w in range(WRITERS)]

    def done(self):
        with self.lock:
            return len(self.acked) + self.noop

    def run(self, w):
        rnd = random.Random(w)
        n = 0
        while not self.stop.is_set():
            n += 1
            tid = f"{w}-{n}"
            g = rnd.randrange(GROUPS)
            a, b = rnd.sample([i for i in range(N_ACCOUNTS) if i % GROUPS == g], 2)
            amount = rnd.randint(1, 40)
            moved = []

            def cb(s):
                with self.lock:
                    self.attempts += 1
                moved.clear()
                src = self.coll.find_one({"_id": a, "g": g}, session=s)
                self.coll.find_one({"_id": b, "g": g}, session=s)
                if src["n"] < amount:
                    return
                self.coll.update_one({"_id": a, "g": g},
                                     {"$inc": {"n": -amount}, "$push": {"ops": tid}}, session=s)
                self.coll.update_one({"_id": b, "g": g},
                                     {"$inc": {"n": amount}, "$push": {"ops": tid}}, session=s)
                moved.append(1)

            try:
                with self.client.start_session() as s:
                    s.with_transaction(cb)
                with self.lock:
                    if moved:
                        self.acked.add(tid)
                    else:
                        self.noop += 1
            except PyMongoError as e:
                key = f"{type(e).__name__} {getattr(e, 'code', None)}: {str(e)[:100]}"
                with self.lock:
                    self.unknown.add(tid)
                    self.errors[key] = self.errors.get(key, 0) + 1

    def progress(self, n):
        """Wait until n more transfers were acknowledged (the load goes on)."""
        mark = self.done()
        wait_until(lambda: self.done() >= mark + n, 120, interval=0.05,
                   what=f"{n} more acknowledged transfers")


class IncBank(TxnBank):
    """The same transfers without a transaction: two retryable updates ($inc and $push of
    the transfer id on each account; driver defaults, so pymongo retries each once). An
    update acknowledged is in acked_ops; one that raised is in unknown_ops."""

    def __init__(self, coll, client):
        super().__init__(coll, client)
        self.acked_ops = set()    # (account, tid): the update was acknowledged
        self.unknown_ops = set()  # (account, tid): the update raised (outcome unknown)

    def run(self, w):
        rnd = random.Random(100 + w)
        n = 0
        while not self.stop.is_set():
            n += 1
            tid = f"i{w}-{n}"
            g = rnd.randrange(GROUPS)
            a, b = rnd.sample([i for i in range(N_ACCOUNTS) if i % GROUPS == g], 2)
            amount = rnd.randint(1, 40)
            ok = 0
            for acc, delta in ((a, -amount), (b, amount)):
                try:
                    self.coll.update_one({"_id": acc, "g": g},
                                         {"$inc": {"n": delta}, "$push": {"ops": tid}})
                    with self.lock:
                        self.acked_ops.add((acc, tid))
                    ok += 1
                except PyMongoError as e:
                    key = f"{type(e).__name__} {getattr(e, 'code', None)}: {str(e)[:100]}"
                    with self.lock:
                        self.unknown_ops.add((acc, tid))
                        self.errors[key] = self.errors.get(key, 0) + 1
            with self.lock:
                if ok == 2:
                    self.acked.add(tid)
                else:
                    self.unknown.add(tid)


@pytest.mark.parametrize("mode", ["transactions", "two_incs"])
def test_bank_with_proxy_primary_and_metadata_leader_kills(start_role, tmp_path, mode):
    """issue #16's bank test: 50 accounts in 5 groups over 3 shards (3-member replica sets)
    through two proxies with driver defaults, while a proxy, a shard primary and the
    metadata leader (3 members) are SIGKILLed each cycle and a chunk migrates. Transfers as
    single-shard transactions: the total is exact, each transfer applied on both accounts
    or neither, never twice. As two retryable $inc updates: no update applied twice, and
    each account's applied operations are its acknowledged ones plus at most its
    unknown-outcome ones."""
    from test_shard_replset import primary_index
    cycles = int(__import__("os").environ.get("STRIPEDB_BANK_CYCLES", "3"))
    cl, sets = replset_cluster(start_role, tmp_path, meta_members=3)
    try:
        cl.shard_collection("bank.acc", {"g": 1},
                            split_points=[{"g": i} for i in range(1, GROUPS)])
        assert len({ch["shard"] for ch in cl.routing("bank.acc")["chunks"]}) == 3
        setup = cl.proxy_client(0)
        setup.bank.acc.insert_many([{"_id": i, "g": i % GROUPS, "n": INITIAL, "ops": []}
                                    for i in range(N_ACCOUNTS)])
        hosts = ",".join(f"127.0.0.1:{p}" for p in cl.proxy_ports)
        driver = pymongo.MongoClient(f"mongodb://{hosts}/")  # driver defaults
        cl._clients.append(driver)
        bank = (TxnBank if mode == "transactions" else IncBank)(driver.bank.acc, driver)
        for t in bank.threads:
            t.start()
        bank.progress(20)
        migrated = None
        for cyc in range(cycles):
            # SIGKILL a proxy in the middle of transactions, restart it
            victim = cl.proxy_procs[cyc % 2]
            victim.signal(signal.SIGKILL)
            victim.p.wait(timeout=10)
            bank.progress(10)
            victim.restart()
            victim.wait_healthy()
            # SIGKILL a shard's primary, wait for the new one, restart the old
            sid = cl.shard_ids[cyc % len(cl.shard_ids)]
            procs, wires = sets[sid]
            p = primary_index(wires)
            assert p is not None
            procs[p].signal(signal.SIGKILL)
            procs[p].p.wait(timeout=10)
            rest = [w for i, w in enumerate(wires) if i != p]
            wait_until(lambda: primary_index(rest) is not None, 60, interval=0.2,
                       what=f"a new primary of {sid}")
            bank.progress(10)
            procs[p].restart()
            procs[p].wait_healthy()
            # SIGKILL the metadata leader (routing, the migration's records), restart it
            leader = cl.meta.leader()
            cl.meta.kill(leader)
            cl.meta.leader(timeout=60, exclude=(leader,))
            bank.progress(10)
            cl.meta.restart(leader)
            if cyc == 0:
                # a chunk migration under the load: group 0 to another shard
                ch0 = [ch for ch in cl.routing("bank.acc")["chunks"]
                       if not isinstance(ch["min"]["g"], int)][0]
                to = [s for s in cl.shard_ids if s != ch0["shard"]][0]
                r = cl.proxy_client(1, socketTimeoutMS=300000).admin.command(
                    "moveChunk", "bank.acc", find={"g": 0}, to=to, maxTimeMS=240000)
                assert r["ok"] == 1
                migrated = (ch0["shard"], to)
            bank.progress(10)
        bank.stop.set()
        for t in bank.threads:
            t.join(timeout=180)
            assert not t.is_alive()
        docs = {d["_id"]: d for d in cl.proxy_client(0).bank.acc.find()}
        assert sorted(docs) == list(range(N_ACCOUNTS))
        total = sum(d["n"] for d in docs.values())
        applied = {}
        for d in docs.values():
            assert mode == "two_incs" or d["n"] >= 0, d  # (no overdraft check without txns)
            assert len(d["ops"]) == len(set(d["ops"])), d  # no transfer applied twice
            for tid in d["ops"]:
                applied[tid] = applied.get(tid, 0) + 1
        print(f"\nbank ({mode}): acknowledged {len(bank.acked)} transfers + {bank.noop} "
              f"refused overdrafts, {len(bank.unknown)} raised (unknown outcome), applied "
              f"{len(applied)}; {bank.attempts} attempts; migrated {migrated}; "
              f"errors {bank.errors}")
        if mode == "two_incs":
            # no update applied twice (checked above per account); per account, what was
            # applied is what was acknowledged plus some of what raised
            for acc, d in docs.items():
                mine = {tid for tid in d["ops"]}
                acked = {tid for (a, tid) in bank.acked_ops if a == acc}
                unknown = {tid for (a, tid) in bank.unknown_ops if a == acc}
                assert acked <= mine, (acc, acked - mine)
                assert mine <= acked | unknown, (acc, mine - acked - unknown)
            assert len(bank.acked) > 0
            owner = [ch["shard"] for ch in cl.routing("bank.acc")["chunks"]
                     if not isinstance(ch["min"]["g"], int)][0]
            assert migrated is None or owner == migrated[1]
            return
        assert total == N_ACCOUNTS * INITIAL
        assert all(v == 2 for v in applied.values()), "a transfer half applied"
        assert bank.acked <= set(applied), "an acknowledged transfer is missing"
        assert set(applied) <= bank.acked | bank.unknown, "applied but never sent"
        # each balance is what its applied transfers say (amounts recomputed per account)
        assert len(bank.acked) > 0
        owner = [ch["shard"] for ch in cl.routing("bank.acc")["chunks"]
                 if not isinstance(ch["min"]["g"], int)][0]
        assert migrated is None or owner == migrated[1]
    finally:
        cl.close()


def test_migration_of_the_chunk_during_an_open_transaction(start_role, tmp_path):
    """issue #16: a migration's traffic switch aborts the open transactions on the moving
    chunk, and none is half applied. A transaction through the proxy writes two accounts of
    group 0, then the chunk of group 0 moves to another shard (a coordinator runs it) while
    the transaction is open: its commit fails with a TransientTransactionError (the driver's
    with_transaction would run it again) and nothing of it is visible, on the donor or the
    recipient; a new transaction on the moved chunk commits at the new owner."""
    from migration_helpers import MigCluster
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        cl.shard_collection("bank.acc", {"g": 1}, split_points=[{"g": 1}])
        p = cl.proxy_client(0)
        p.bank.acc.insert_many([{"_id": i, "g": i // 10, "n": 100} for i in range(20)])
        ch0 = [ch for ch in cl.chunks("bank.acc") if ch["max"] == {"g": 1}][0]
        to = [s for s in cl.shard_ids if s != ch0["shard"]][0]
        driver = cl.proxy_client(0)
        s = driver.start_session()
        s.start_transaction()
        coll = driver.bank.acc
        coll.update_one({"_id": 1, "g": 0}, {"$inc": {"n": -30}}, session=s)
        coll.update_one({"_id": 2, "g": 0}, {"$inc": {"n": 30}}, session=s)
        assert coll.find_one({"_id": 1, "g": 0}, session=s)["n"] == 70  # its own write
        # the chunk moves while the transaction is open (moveChunk waits for the end)
        r = cl.proxy_client(0, socketTimeoutMS=300000).admin.command(
            "moveChunk", "bank.acc", find={"g": 0}, to=to, maxTimeMS=240000)
        assert r["ok"] == 1
        assert [ch["shard"] for ch in cl.chunks("bank.acc") if ch["max"] == {"g": 1}] == [to]
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.has_error_label("TransientTransactionError"), e.value.details
        s.end_session()
        # nothing of it anywhere: the proxy, the new owner, the old owner's copy
        assert {d["_id"]: d["n"] for d in p.bank.acc.find({"g": 0})} == \
            {i: 100 for i in range(10)}
        for sid in cl.shard_ids:
            for d in cl.shard_client(sid).bank.acc.find({"g": 0}):
                assert d["n"] == 100, (sid, d)
        # the moved chunk takes transactions at its new owner
        with driver.start_session() as s2:
            s2.with_transaction(lambda ss: (
                coll.update_one({"_id": 1, "g": 0}, {"$inc": {"n": -30}}, session=ss),
                coll.update_one({"_id": 2, "g": 0}, {"$inc": {"n": 30}}, session=ss)))
        assert {d["_id"]: d["n"] for d in p.bank.acc.find({"_id": {"$in": [1, 2]}})} == \
            {1: 70, 2: 130}
        assert cl.shard_client(to).bank.acc.find_one({"_id": 1})["n"] == 70
    finally:
        cl.close()
