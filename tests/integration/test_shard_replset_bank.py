"""The bank test of issue #16 with shard replica sets (issue #15, "Must show"): through two
proxies with driver defaults (retryWrites on), 2 shards that are each a 3-member replica set
(every member in its own network namespace, shard_net.py), registered with the metadata
service by their replica-set URI; transfers are two `$inc` updates (debit, then credit),
each also pushing its unique operation id. A nemesis alternates between the shards:
SIGKILL of the primary (restarted later); a partition of the primary from its two
secondaries (blackhole routes; the proxies still reach it, so they keep sending to it until
it steps down), healed later; the primary cut off the network (its veth down: the proxies
lose it too, with requests in flight), restored later.

Checked against the final state of every member of every set (Jepsen style):
* every member of a set holds the same documents and oplog, stripedbCheck clean;
* no operation id applied twice; every acknowledged one applied; nothing applied that was
  not sent;
* each account: n == number of applied ops and balance == initial + their amounts;
* no application error is a shard's change of primary (10107, 11602: the proxy retries);
* the sum invariant: the total balance equals the initial total plus the amounts of the
  applied halves of transfers; a transfer with only one half applied had that half or the
  other half unacknowledged (outcome unknown or failed), never both acknowledged.

Bounded for CI with STRIPEDB_BANK_CYCLES (default 6 nemesis cycles: each kind on each shard).
"""
import os
import random
import signal
import threading
import time

import pymongo
import pytest
from pymongo.errors import PyMongoError

from conftest import free_port, wait_until
from metadata_cluster import Cluster
from shard_net import ShardNet, skip_reason

_SKIP = skip_reason()
# Compaction every 128 entries: members killed or cut off catch up from a snapshot
# installed from another member as well as from the log.
COMPACTION = ["--raft-snapshot-threshold=128"]
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

ACCOUNTS = 20
INITIAL = 1000
WRITERS = 4


@pytest.fixture
def net(tmp_path, request):
    n = ShardNet(tmp_path, 6)
    try:
        n.up()
        yield n
        failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
        if failed:
            print(n.logs())
    finally:
        problems = n.down()
    assert not problems, "\n".join(problems)


class Bank:
    def __init__(self, coll, seed):
        self.coll = coll
        self.seed = seed
        self.ops = {}       # op id -> (account, signed amount)
        self.acked = set()
        self.unknown = set()
        self.transfers = []  # (debit id, credit id)
        self.errors = {}     # "ExceptionClass code: message" -> count (printed)
        self.codes = []      # the code of each error the application saw
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True)
                        for w in range(WRITERS)]

    def one(self, oid, acct, amount):
        with self.lock:
            self.ops[oid] = (acct, amount)
        try:
            r = self.coll.update_one({"_id": acct},
                                     {"$inc": {"bal": amount, "n": 1}, "$push": {"ops": oid}})
            assert r.matched_count == 1, r.raw_result
            with self.lock:
                self.acked.add(oid)
            return True
        except PyMongoError as e:
            code = (getattr(e, "details", None) or {}).get("code")
            key = f"{type(e).__name__} {code}: {str(e)[:120]}"
            with self.lock:
                self.unknown.add(oid)
                self.errors[key] = self.errors.get(key, 0) + 1
                self.codes.append(code)
            return False

    def run(self, w):
        rng = random.Random(self.seed * 100 + w)
        i = 0
        while not self.stop.is_set():
            a, b = rng.sample(range(ACCOUNTS), 2)
            amt = rng.randint(1, 50)
            d, c = f"w{w}-{i}-d", f"w{w}-{i}-c"
            i += 1
            with self.lock:
                self.transfers.append((d, c))
            if not self.one(d, a, -amt):
                time.sleep(0.05)  # pacing after an error only; not a synchronisation
                continue
            # one attempt: a credit of unknown outcome stays an unknown half (the driver
            # already retried it once with the same session fields)
            if not self.one(c, b, amt):
                time.sleep(0.05)

    def count(self):
        with self.lock:
            return len(self.acked)

    def more(self, n, what, timeout=90):
        base = self.count()
        wait_until(lambda: self.count() >= base + n, timeout, what=what)


def check_bank(docs, bank):
    applied = {}
    dups = []
    total = 0
    for d in docs:
        ops = d.get("ops", [])
        assert d.get("n", 0) == len(ops), d
        expect = INITIAL
        for oid in ops:
            if oid in applied:
                dups.append(oid)
            applied[oid] = d["_id"]
            acct, amount = bank.ops[oid]
            assert acct == d["_id"], (oid, d["_id"])
            expect += amount
        assert d["bal"] == expect, f"account {d['_id']}: balance {d['bal']} != {expect}"
        total += d["bal"]
    assert dups == [], f"{len(dups)} operations applied twice: {dups[:10]}"
    lost = [o for o in bank.acked if o not in applied]
    assert lost == [], f"{len(lost)} acknowledged operations missing: {lost[:10]}"
    stray = [o for o in applied if o not in bank.acked and o not in bank.unknown]
    assert stray == [], stray[:10]
    # the sum invariant
    assert total == ACCOUNTS * INITIAL + sum(bank.ops[o][1] for o in applied)
    half = [(d, c) for d, c in bank.transfers if (d in applied) != (c in applied)]
    both_acked = [(d, c) for d, c in half if d in bank.acked and c in bank.acked]
    assert both_acked == []
    return applied, half, total


def test_bank_through_proxies_with_primary_kills_and_partitions(start_role, tmp_path, net):
    cycles = int(os.environ.get("STRIPEDB_BANK_CYCLES", "6"))
    seed = int(os.environ.get("STRIPEDB_BANK_SEED", str(int(time.time()))))
    print(f"seed={seed} cycles={cycles}")
    sets = {"shard-a": net.replset("shard-a", [1, 2, 3], COMPACTION),
            "shard-b": net.replset("shard-b", [4, 5, 6], COMPACTION)}
    meta = Cluster(start_role, tmp_path, 1, election_ms=300)
    meta.leader()
    for sid, rs in sets.items():
        meta.write({"addShard": sid, "uri": rs.uri})
    proxies = []
    for _ in range(2):
        port = free_port()
        start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}",
                    "--stale-retry-ms=15000"])
        proxies.append(port)
    meta.write({"createDatabase": "bank"}, ok_codes=(48, 11000))
    meta.write({"shardCollection": "bank.acc", "key": {"_id": 1},
                "splitPoints": [{"_id": ACCOUNTS // 2}], "shards": list(sets)})
    hosts = ",".join(f"127.0.0.1:{p}" for p in proxies)
    client = pymongo.MongoClient(f"mongodb://{hosts}/", serverSelectionTimeoutMS=20000,
                                 socketTimeoutMS=5000, connectTimeoutMS=2000,
                                 heartbeatFrequencyMS=500)
    coll = client.bank.acc
    wait_until(lambda: coll.insert_many(
        [{"_id": i, "bal": INITIAL, "n": 0, "ops": []} for i in range(ACCOUNTS)]), 30,
        what="the accounts created through the proxy")
    bank = Bank(coll, seed)
    for t in bank.threads:
        t.start()
    done = {"kill": 0, "partition": 0, "cut": 0}
    try:
        bank.more(50, "transfers before the nemesis")
        for cyc in range(cycles):
            sid = list(sets)[cyc % 2]
            rs = sets[sid]
            p = rs.wait_primary()
            kind = ("kill", "partition", "cut")[(cyc // 2) % 3]
            others = [rs.hosts[i] for i in range(3) if i != p]
            if kind == "kill":
                rs.procs[p].signal(signal.SIGKILL)
                rs.procs[p].p.wait(timeout=10)
                rs.procs[p].log.close()
            elif kind == "partition":
                net.partition([rs.hosts[p]], others)
            else:
                net.cut(rs.hosts[p])
            done[kind] += 1
            rs.wait_primary(exclude=(p,))
            bank.more(40, f"transfers after the {kind} of {sid} member {p + 1}")
            if kind == "kill":
                rs.procs[p].restart().wait_healthy()
            elif kind == "partition":
                net.heal()
            else:
                net.restore(rs.hosts[p])
            bank.more(40, "transfers after the nemesis step")
    finally:
        bank.stop.set()
        for t in bank.threads:
            t.join(timeout=60)
        net.heal()
    states = {sid: rs.converged("bank", "acc", timeout=120) for sid, rs in sets.items()}
    docs = sorted([d for st in states.values() for d in st[0]], key=lambda d: d["_id"])
    assert [d["_id"] for d in docs] == list(range(ACCOUNTS))
    applied, half, total = check_bank(docs, bank)
    print(f"nemesis={done} ops sent={len(bank.ops)} "
          f"acked={len(bank.acked)} unknown={len(bank.unknown)} applied={len(applied)} "
          f"half-applied transfers={len(half)} total={total}")
    for k, v in sorted(bank.errors.items(), key=lambda kv: -kv[1]):
        print(f"  {v} x {k}")
    assert len(bank.acked) >= 100
    # a shard's change of primary is the proxy's to absorb (as mongos does): it retries a
    # retryable write refused by a former primary (10107) or interrupted by its step-down
    # (11602) on the new one within its retry budget; the application never sees them
    seen = [c for c in bank.codes if c in (10107, 13435, 11602, 11600)]
    assert seen == [], f"{len(seen)} primary changes reached the application: {bank.errors}"
    assert sum(done.values()) == cycles
    client.close()


def test_proxy_writes_to_the_new_primary_while_the_old_one_is_cut_off(start_role, tmp_path,
                                                                       net):
    """The primary of the only shard is cut off the network (no RST: packets vanish, as
    when a host dies), with more client threads (24) than the proxy's base request workers
    (16). A new primary is elected within about a second; writes through the proxy must
    reach it while the old one stays unreachable: the requests stuck on the old primary
    (no socket timeout short enough to help) each hold a worker, so the pool grows
    (shardconn.c) and the proxy's shard pools find the new primary (heartbeat 1 s)."""
    rs = net.replset("shard-a", [1, 2, 3], COMPACTION)
    meta = Cluster(start_role, tmp_path, 1, election_ms=300)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs.uri})
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}",
                "--stale-retry-ms=15000"])
    uri = f"mongodb://127.0.0.1:{port}/"
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        wait_until(lambda: c.app.c.insert_one({"w": "first"}), 30, what="a first write")
    stop = threading.Event()
    acked, lock = [], threading.Lock()

    def writer(n):
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, socketTimeoutMS=5000) as c:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    c.app.c.insert_one({"_id": f"{n}-{i}"})
                    with lock:
                        acked.append(time.monotonic())
                except PyMongoError:
                    pass
    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(24)]
    for t in threads:
        t.start()
    old = None
    try:
        wait_until(lambda: len(acked) >= 50, 30, what="writes before the cut")
        old = rs.primary()
        net.cut(rs.hosts[old])
        rs.wait_primary(exclude=(old,))
        elected = time.monotonic()

        def after():
            with lock:
                return sum(1 for t in acked if t > elected)
        wait_until(lambda: after() >= 100, 30,
                   what="writes acknowledged by the new primary while the old one is cut off")
    finally:
        if old is not None:
            net.restore(rs.hosts[old])
        stop.set()
        for t in threads:
            t.join(timeout=30)
