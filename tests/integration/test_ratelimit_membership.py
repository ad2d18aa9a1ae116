"""Rate-limit peers discovered through the metadata service (issue #23).

Real processes on loopback: one metadata member, rate limiters and proxies started with
--metadata and no --peers. They register with a lease (--ratelimit-lease-ms), watch the
membership and rebuild their ring; a member that is SIGKILLed leaves every ring when the
metadata leader expires its lease. Checked under a request load: every member's ring
(GET /debug/ratelimit/peers) is the same set of live members, every key has one owner
that every rate limiter names (metadata.owner of its answers), no request sent to a live
member fails, and GLOBAL hits queued for an owner that dies are applied by the next owner
(no acknowledged hit is lost).
"""
import json
import random
import signal
import subprocess
import threading
import time

import pytest

from conftest import BIN, free_port, http_get, wait_until
from metadata_cluster import Cluster
from test_ratelimit_grpc import MINUTE, T0, Node, pb, port_open, req  # noqa: F401 (fixture)

LEASE_MS = 2000
# a lease no test outlasts: a member hung (SIGSTOP) with it stays in every ring until the test
# removes its registration
HUNG_LEASE_MS = 600000


def ring_of(http_port):
    """(version, [addresses]) of a member's ring, from its debug endpoint."""
    st, body = http_get(http_port, "/debug/ratelimit/peers", timeout=2)
    assert st == 200
    d = json.loads(body)
    return d["version"], sorted(p["address"] for p in d["peers"])


class Member:
    """A rate limiter or a proxy in the ring."""

    def __init__(self, proc, grpc_port, http_port, node=None):
        self.proc = proc
        self.addr = f"127.0.0.1:{grpc_port}"
        self.http_port = http_port
        self.node = node  # gRPC client (rate limiters only)


def start_ratelimit(start_role, pb, meta, env=None, lease_ms=LEASE_MS):
    gp, hp = free_port(), free_port()
    proc = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{gp}",
                       f"--http-listen=127.0.0.1:{hp}", f"--metadata={meta}",
                       f"--ratelimit-lease-ms={lease_ms}"], env=env)
    wait_until(lambda: port_open(gp), what=f"gRPC port {gp}")
    nd = Node(proc, gp, hp, pb)
    wait_until(lambda: nd.v1.LiveCheck(nd.pb2.LiveCheckReq(), timeout=1) is not None,
               what=f"LiveCheck on {nd.addr}")
    return Member(proc, gp, hp, nd)


def start_proxy(start_role, meta):
    gp, hp, wp = free_port(), free_port(), free_port()
    proc = start_role(["--role=proxy", f"--listen=127.0.0.1:{wp}", f"--metadata={meta}",
                       f"--grpc-listen=127.0.0.1:{gp}", f"--http-listen=127.0.0.1:{hp}",
                       f"--ratelimit-lease-ms={LEASE_MS}"])
    return Member(proc, gp, hp)


def rings_agree(members, expected):
    """Every member's ring is exactly `expected` (addresses); returns the versions."""
    versions = set()
    for m in members:
        v, ring = ring_of(m.http_port)
        if ring != sorted(expected):
            return None
        versions.add(v)
    return versions if len(versions) == 1 else None


def owners_seen(members, pb, keys, name="membership_probe"):
    """{key: owner} of (name, key) as each rate limiter reports it (hits=0 queries); None
    unless every rate limiter names the same owner for every key."""
    owners = None
    for m in members:
        if m.node is None:
            continue
        out = m.node.get(*[req(pb, k, hits=0, name=name) for k in keys])
        got = {k: r.metadata["owner"] for k, r in zip(keys, out)}
        if any(r.error for r in out):
            return None
        if owners is None:
            owners = got
        elif got != owners:
            return None
    return owners


class Load:
    """Clients sending one-request GetRateLimits calls to the live rate limiters while
    the ring changes; records every per-item error and every failed call."""

    def __init__(self, pb, targets):
        self.pb = pb
        self.targets = list(targets)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.calls = 0
        self.item_errors = []
        self.call_errors = []
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(2)]
        for t in self.threads:
            t.start()

    def set_targets(self, targets):
        with self.lock:
            self.targets = list(targets)

    def run(self, i):
        rnd = random.Random(i)
        while not self.stop.is_set():
            with self.lock:
                m = rnd.choice(self.targets)
            key = f"load-{rnd.randrange(500)}"
            try:
                r = m.node.one(req(self.pb, key, hits=1, limit=1000000, name="membership_load"))
            except Exception as e:  # noqa: BLE001 - recorded, asserted on below
                with self.lock:
                    if m in self.targets:  # a call to a member being killed may fail
                        self.call_errors.append((m.addr, repr(e)))
                continue
            with self.lock:
                self.calls += 1
                if r.error:
                    self.item_errors.append((m.addr, key, r.error))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def test_discovery_join_and_leave_under_load(start_role, tmp_path, pb):
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    seeds = meta.seeds()
    rls = [start_ratelimit(start_role, pb, seeds) for _ in range(3)]
    proxies = [start_proxy(start_role, seeds) for _ in range(2)]
    members = rls + proxies
    # discovery: no --peers anywhere, every member's ring holds all five
    wait_until(lambda: rings_agree(members, [m.addr for m in members]), 30,
               what="five members in every ring")
    keys = [f"k-{i}" for i in range(40)]
    owners = wait_until(lambda: owners_seen(rls, pb, keys), 20, what="one owner per key")
    assert set(owners.values()) <= {m.addr for m in members}

    load = Load(pb, rls)
    try:
        wait_until(lambda: load.calls > 50, 30, what="load running")
        # a fourth rate limiter joins
        rl4 = start_ratelimit(start_role, pb, seeds)
        rls.append(rl4)
        members.append(rl4)
        wait_until(lambda: rings_agree(members, [m.addr for m in members]), 30,
                   what="the new member in every ring")
        load.set_targets(rls)
        # one leaves without a word: SIGKILL, its lease lapses, the leader removes it
        gone = rls[1]
        load.set_targets([m for m in rls if m is not gone])
        t_kill = time.monotonic()
        gone.proc.kill()
        live = [m for m in members if m is not gone]
        versions = wait_until(lambda: rings_agree(live, [m.addr for m in live]), 30,
                              what="the killed member out of every ring")
        print(f"ring converged {time.monotonic() - t_kill:.2f} s after SIGKILL "
              f"(lease {LEASE_MS} ms), version {versions}")
        rls.remove(gone)
        members = live
        owners = wait_until(lambda: owners_seen(rls, pb, keys), 20, what="one owner per key")
        assert gone.addr not in owners.values()
        assert set(owners.values()) <= {m.addr for m in live}
        wait_until(lambda: load.calls > 200, 30, what="more load after the change")
    finally:
        load.finish()
    assert load.item_errors == []
    assert load.call_errors == []
    # the registry agrees: ctl-visible membership is the live set
    reply = meta.leader().cmd("listRatelimitPeers")
    assert sorted(p["addr"] for p in reply["peers"]) == sorted(m.addr for m in members)
    kinds = {p["addr"]: p["kind"] for p in reply["peers"]}
    assert {kinds[p.addr] for p in proxies} == {"proxy"}
    assert {kinds[r.addr] for r in rls} == {"ratelimit"}


def test_graceful_stop_leaves_at_once(start_role, tmp_path, pb):
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    rls = [start_ratelimit(start_role, pb, meta.seeds()) for _ in range(2)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="both in the ring")
    # stripedb ctl ratelimit peers: the registry, in ring order, both live
    ctl = [BIN, "ctl", f"--metadata={meta.seeds()}"]
    out = subprocess.run(ctl + ["ratelimit", "peers"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ring version ")
    assert [l.split()[:3] for l in lines[1:]] == \
        [[a, "ratelimit", "live"] for a in sorted(m.addr for m in rls)]
    out = subprocess.run(ctl + ["--json", "ratelimit", "peers"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [p["addr"] for p in doc["peers"]] == sorted(m.addr for m in rls)
    assert all(p["state"] == "live" and 0 < p["leaseLeftMS"] <= LEASE_MS
               for p in doc["peers"])
    bad = subprocess.run(ctl + ["ratelimit", "nope"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2
    assert rls[1].proc.stop() == 0  # SIGTERM: deregisters before exiting
    # removed by its own deregistration, not by expiry: the registry no longer has it
    reply = meta.leader().cmd("listRatelimitPeers")
    assert [p["addr"] for p in reply["peers"]] == [rls[0].addr]
    wait_until(lambda: rings_agree(rls[:1], [rls[0].addr]), 30, what="ring of one")


def test_global_hits_survive_owner_sigkill(start_role, tmp_path, pb):
    """GLOBAL hits a member (a) takes while the key's owner (b) hangs (SIGSTOP) are
    re-queued when their delivery fails and reach the next owner (c): once b is SIGKILLed
    and out of the rings, c holds every one of them, once. The key's next owner is c, not
    a: hits a re-queues for a key it then owns are already in its copy, so only a delivery
    to another member shows whether re-queued hits were lost (a as the next owner:
    test_global_hits_exact_on_the_member_taking_over).

    A hung member leaves the rings one lease after its last renewal. With a 2 s lease that
    was 1.3-2 s after the SIGSTOP: a's hits taken or flushed later (a loaded machine) went
    straight to the next owner, so no delivery failed and nothing was re-queued. The members
    here have a lease longer than the test (HUNG_LEASE_MS): b stays in every ring while it
    hangs, and after the SIGKILL the test removes its registration as the lease's expiry
    would (leaving on expiry: test_discovery_join_and_leave_under_load)."""
    pb2 = pb[0]
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    env = {"GUBER_GLOBAL_SYNC_WAIT": "50ms", "GUBER_BATCH_TIMEOUT": "300ms"}
    name = "global_hits"
    cand = [f"g-{i}" for i in range(200)]
    a, c = [start_ratelimit(start_role, pb, meta.seeds(), env=env, lease_ms=HUNG_LEASE_MS)
            for _ in range(2)]
    wait_until(lambda: rings_agree([a, c], [a.addr, c.addr]), 30, what="a and c in the ring")
    # a key's owner in the ring without b is its owner once b has left (consistent hashing)
    without_b = wait_until(lambda: owners_seen([a, c], pb, cand, name=name), 20,
                           what="owners without b")
    b = start_ratelimit(start_role, pb, meta.seeds(), env=env, lease_ms=HUNG_LEASE_MS)
    rls = [a, b, c]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    # a key owned by b (of (name, key): the name of the GLOBAL requests below) that moves
    # to c when b leaves
    owners = wait_until(lambda: owners_seen(rls, pb, cand, name=name), 20, what="owners")
    key = next(k for k in cand if owners[k] == b.addr and without_b[k] == c.addr)
    b_instance = next(p["instance"] for p in registry(meta)["peers"] if p["addr"] == b.addr)
    # b hangs (SIGSTOP): hits a takes for the key cannot reach it
    b.proc.signal(signal.SIGSTOP)
    acked = 0
    for i in range(5):
        r = a.node.one(req(pb, key, hits=1, limit=100, behavior=pb2.GLOBAL, at=T0 + i,
                           name=name))
        assert r.error == ""
        assert r.status == pb2.UNDER_LIMIT
        if i == 0:
            # queued for b: nothing has failed yet, so b is a's owner of the key (later
            # hits name c once the failed delivery has marked b dead)
            assert r.metadata["owner"] == b.addr
        acked += 1
    # b is in a's ring for the whole lease: a's delivery of the hits to it fails (deadline
    # GUBER_BATCH_TIMEOUT) and they are re-queued
    wait_until(lambda: a.node.metric("stripedb_ratelimit_global_hits_requeued_total") > 0,
               30, what="the undelivered hits re-queued")
    # ... then b dies and leaves the ring (its registration removed, as its lease's
    # expiry would); the key moves to c
    b.proc.kill()
    reply = meta.leader().cmd("deregisterRatelimitPeer", b.addr, instance=b_instance)
    assert reply["removed"]
    live = [a, c]
    wait_until(lambda: rings_agree(live, [m.addr for m in live]), 30, what="b out of the rings")

    def owner_count():
        # a plain query (hits 0, not GLOBAL) is decided by the key's owner
        r = a.node.one(req(pb, key, hits=0, limit=100, at=T0 + 10, name=name))
        assert r.error == ""
        return r if r.metadata["owner"] == c.addr and r.remaining <= 100 - acked else None

    r = wait_until(owner_count, 30, what="c holding every acknowledged hit")
    # every acknowledged hit is counted once
    time.sleep(0.5)
    r = owner_count()
    assert r.remaining == 100 - acked
    assert a.node.metric("stripedb_ratelimit_global_hits_dropped_total") == 0


def test_metadata_restart_expires_no_one(start_role, tmp_path, pb):
    """Leases that run out while the metadata service is down are renewed, not expired:
    a new leader gives every peer one full lease before it may expire it."""
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    rls = [start_ratelimit(start_role, pb, meta.seeds()) for _ in range(3)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    before = meta.leader().cmd("listRatelimitPeers")
    version = before["version"]
    last_expiry = max(p["expiresMS"] for p in before["peers"])
    m = meta.members[0]
    meta.kill(m)
    # down for longer than every lease
    wait_until(lambda: time.time() * 1000 > last_expiry + 200, 30, what="every lease lapsed")
    meta.restart(m)
    meta.leader()
    t_up = time.time() * 1000

    def renewed():
        r = meta.leader().cmd("listRatelimitPeers")
        return r if len(r["peers"]) == 3 and all(p["expiresMS"] > t_up for p in r["peers"]) \
            else None
    after = wait_until(renewed, 30, what="every peer renewed with the restarted leader")
    # nobody was expired and re-added: same membership version, same rings
    assert after["version"] == version
    assert sorted(p["addr"] for p in after["peers"]) == sorted(m.addr for m in rls)
    assert rings_agree(rls, [m.addr for m in rls]) == {version}


def test_global_hits_exact_on_the_member_taking_over(start_role, tmp_path, pb):
    """Issue #23 retest: GLOBAL hits a member answered and queued for an owner that died
    are counted once when that member is the owner's successor (they were counted twice:
    once when answered from the local copy, once more when the queue was flushed to the
    member itself)."""
    pb2 = pb[0]
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    env = {"GUBER_GLOBAL_SYNC_WAIT": "50ms", "GUBER_BATCH_TIMEOUT": "300ms"}
    rls = [start_ratelimit(start_role, pb, meta.seeds(), env=env) for _ in range(3)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    a = rls[0]
    name = "global_takeover"
    cand = [f"t-{i}" for i in range(200)]
    owners = wait_until(lambda: owners_seen(rls, pb, cand, name=name), 20, what="owners")
    b = next(m for m in rls[1:] if sum(1 for k in cand if owners[k] == m.addr) >= 12)
    keys = [k for k in cand if owners[k] == b.addr][:12]
    b.proc.kill()  # SIGKILL: the hits a queues for b cannot be delivered
    acked = 4
    for i in range(acked):
        out = a.node.get(*[req(pb, k, hits=1, limit=1000, behavior=pb2.GLOBAL, at=T0 + i,
                               name=name) for k in keys])
        assert [r.error for r in out] == [""] * len(keys)
        time.sleep(0.1)
    live = [m for m in rls if m is not b]
    wait_until(lambda: rings_agree(live, [m.addr for m in live]), 30, what="b out of the rings")

    def counts():
        # plain queries (hits 0, not GLOBAL) are decided by each key's owner
        out = a.node.get(*[req(pb, k, hits=0, limit=1000, at=T0 + 10, name=name)
                           for k in keys])
        assert [r.error for r in out] == [""] * len(keys)
        return out if all(r.remaining <= 1000 - acked for r in out) else None

    wait_until(counts, 30, what="every key's new owner holding the hits")
    time.sleep(1)  # anything counted twice would have arrived by now
    out = counts()
    new_owners = {r.metadata["owner"] for r in out}
    assert a.addr in new_owners  # the case under test: a took over some of the keys
    assert {k: 1000 - r.remaining for k, r in zip(keys, out)} == {k: acked for k in keys}
    assert a.node.metric("stripedb_ratelimit_global_hits_dropped_total") == 0


def registry(meta, exclude=()):
    return meta.leader(exclude=exclude).cmd("listRatelimitPeers")


def test_paused_metadata_leader_expires_no_one(start_role, tmp_path, pb):
    """Issue #23 retest: a metadata leader paused (SIGSTOP) longer than the lease. The
    members renew with the new leader within the lease (a short per-call timeout, then a
    fresh client that finds the new leader), so nobody is expired, before or after the old
    leader resumes (it used to expire all of them one lease after the election)."""
    meta = Cluster(start_role, tmp_path, 3)
    old = meta.leader()
    rls = [start_ratelimit(start_role, pb, meta.seeds()) for _ in range(3)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    version = registry(meta)["version"]
    old.proc.signal(signal.SIGSTOP)
    try:
        new = meta.leader(exclude=(old,))
        t_new = time.monotonic()
        # two leases with the new leader: anyone not renewing with it would be expired
        while time.monotonic() < t_new + 2 * LEASE_MS / 1000 + 0.5:
            r = new.cmd("listRatelimitPeers")
            assert r["version"] == version, r
            time.sleep(0.2)
        assert sorted(p["addr"] for p in r["peers"]) == sorted(m.addr for m in rls)
    finally:
        old.proc.signal(signal.SIGCONT)
    time.sleep(2 * LEASE_MS / 1000)
    r = registry(meta)
    assert r["version"] == version
    assert len(r["peers"]) == 3
    assert rings_agree(rls, [m.addr for m in rls]) == {version}


def test_all_metadata_paused_expires_no_one(start_role, tmp_path, pb):
    """Issue #23 retest: every metadata member paused for four leases. When they resume,
    no member could have renewed meanwhile; the leader (the same one, or a new one) gives
    every lease a full ttl again instead of expiring all of them at once."""
    meta = Cluster(start_role, tmp_path, 3)
    meta.leader()
    rls = [start_ratelimit(start_role, pb, meta.seeds()) for _ in range(3)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    version = registry(meta)["version"]
    for m in meta.members:
        m.proc.signal(signal.SIGSTOP)
    time.sleep(4 * LEASE_MS / 1000)
    for m in meta.members:
        m.proc.signal(signal.SIGCONT)
    t_up = time.time() * 1000

    def renewed():
        r = registry(meta)
        return r if len(r["peers"]) == 3 and all(p["expiresMS"] > t_up for p in r["peers"]) \
            else None
    wait_until(renewed, 30, what="every peer renewed after the pause")
    time.sleep(LEASE_MS / 1000)
    r = registry(meta)
    assert r["version"] == version, r
    assert rings_agree(rls, [m.addr for m in rls]) == {version}


def test_duplicate_advertise_refused(start_role, tmp_path, pb):
    """Issue #23 retest: a second process started with a live member's --advertise is
    refused (it exits non-zero saying why) and its stop does not remove the live member;
    after a SIGKILL the address can be taken over once the dead process's lease lapses."""
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    rl1 = start_ratelimit(start_role, pb, meta.seeds())
    wait_until(lambda: rings_agree([rl1], [rl1.addr]), 30, what="rl1 in its ring")
    before = registry(meta)
    inst = before["peers"][0]["instance"]
    gp = free_port()
    t0 = time.monotonic()
    dup = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{gp}",
                      f"--advertise={rl1.addr}", f"--metadata={meta.seeds()}",
                      f"--ratelimit-lease-ms={LEASE_MS}"], wait=False)
    rc = dup.p.wait(timeout=30)
    assert rc != 0
    assert time.monotonic() - t0 < LEASE_MS / 1000 + 10
    log = open(dup.log_path).read()
    assert "is registered in metadata by another live process" in log, log[-2000:]
    after = registry(meta)
    assert [(p["addr"], p["instance"]) for p in after["peers"]] == [(rl1.addr, inst)]
    assert after["version"] == before["version"]
    # an older client's deregistration would remove it; ours names its instance
    meta.leader().cmd("deregisterRatelimitPeer", rl1.addr, instance="not-rl1")
    assert [p["addr"] for p in registry(meta)["peers"]] == [rl1.addr]
    # a restart after SIGKILL with the same address: refused while the lease is live,
    # then admitted (the start waits up to one lease for it)
    rl1.proc.kill()
    gp2, hp2 = free_port(), free_port()
    again = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{gp2}",
                        f"--http-listen=127.0.0.1:{hp2}", f"--advertise={rl1.addr}",
                        f"--metadata={meta.seeds()}", f"--ratelimit-lease-ms={LEASE_MS}"])
    wait_until(lambda: [p.get("instance") for p in registry(meta)["peers"]
                        if p["addr"] == rl1.addr] not in ([], [inst]), 30,
               what="the restarted process holding the address")
    assert again.p.poll() is None


def test_restart_with_a_shorter_lease_waits_for_the_predecessors(start_role, tmp_path):
    """Issue #23 retest: a member SIGKILLed with an 8 s lease and restarted at once with a
    1 s lease waits for the predecessor's lease as metadata reports it (leaseLeftMS), not
    for its own: it starts and holds the address (it used to give up after its own lease
    and exit non-zero)."""
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    gp, hp = free_port(), free_port()
    addr = f"127.0.0.1:{gp}"
    first = start_role(["--role=ratelimit", f"--grpc-listen={addr}",
                        f"--http-listen=127.0.0.1:{hp}", f"--metadata={meta.seeds()}",
                        "--ratelimit-lease-ms=8000"])
    wait_until(lambda: [p["addr"] for p in registry(meta)["peers"]] == [addr], 30,
               what="the first process registered")
    inst = registry(meta)["peers"][0]["instance"]
    first.p.kill()
    first.p.wait(timeout=10)
    again = start_role(["--role=ratelimit", f"--grpc-listen={addr}",
                        f"--http-listen=127.0.0.1:{free_port()}", f"--metadata={meta.seeds()}",
                        "--ratelimit-lease-ms=1000"], wait=False)
    wait_until(lambda: again.p.poll() is not None or
               [p.get("instance") for p in registry(meta)["peers"]
                if p["addr"] == addr] not in ([], [inst]), 30,
               what="the restarted process holding the address or exiting")
    assert again.p.poll() is None, open(again.log_path).read()[-2000:]


def test_metadata_needs_grpc_listen_and_peers_win(start_role, tmp_path):
    """Issue #23 retest: a rate limiter with --metadata but no --grpc-listen would run
    unregistered and alone: refused (exit 2, one line on stderr). --peers with --metadata:
    the static ring wins, with a warning saying --metadata is ignored."""
    out = subprocess.run([BIN, "--role=ratelimit", "--metadata=127.0.0.1:1",
                          f"--http-listen=127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "ratelimit: --metadata needs --grpc-listen" in out.stderr
    gp = free_port()
    p = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{gp}",
                    f"--peers=127.0.0.1:{gp}", "--metadata=127.0.0.1:1"])
    assert p.stop() == 0
    log = open(p.log_path).read()
    assert "--peers and --metadata both given: the ring is --peers" in log


def test_global_hits_exact_after_owner_broadcast(start_role, tmp_path, pb):
    """GLOBAL hits a member took and has not delivered yet survive a broadcast of the
    owner's state that replaces its copy: the copy is the owner's state plus those hits,
    so when the owner then dies every hit is counted once, whoever takes the key over."""
    pb2 = pb[0]
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    slow = {"GUBER_GLOBAL_SYNC_WAIT": "3s", "GUBER_BATCH_TIMEOUT": "300ms"}
    fast = {"GUBER_GLOBAL_SYNC_WAIT": "50ms", "GUBER_BATCH_TIMEOUT": "300ms"}
    rls = [start_ratelimit(start_role, pb, meta.seeds(), env=slow)] + \
        [start_ratelimit(start_role, pb, meta.seeds(), env=fast) for _ in range(2)]
    wait_until(lambda: rings_agree(rls, [m.addr for m in rls]), 30, what="three in the ring")
    a = rls[0]
    name = "global_bcast"
    cand = [f"b-{i}" for i in range(200)]
    owners = wait_until(lambda: owners_seen(rls, pb, cand, name=name), 20, what="owners")
    b = next(m for m in rls[1:] if sum(1 for k in cand if owners[k] == m.addr) >= 12)
    keys = [k for k in cand if owners[k] == b.addr][:12]
    # a takes 4 hits per key: queued for b, sent in 3 s
    for i in range(4):
        out = a.node.get(*[req(pb, k, hits=1, limit=1000, behavior=pb2.GLOBAL, at=T0 + i,
                               name=name) for k in keys])
        assert [r.error for r in out] == [""] * len(keys)
    # one hit per key on the owner itself: its broadcast (50 ms) replaces a's copies
    out = b.node.get(*[req(pb, k, hits=1, limit=1000, behavior=pb2.GLOBAL, at=T0 + 5,
                           name=name) for k in keys])
    assert [r.error for r in out] == [""] * len(keys)
    time.sleep(0.8)
    # a answers from the owner's state plus its own undelivered hits
    out = a.node.get(*[req(pb, k, hits=0, limit=1000, behavior=pb2.GLOBAL, at=T0 + 6,
                           name=name) for k in keys])
    assert [1000 - r.remaining for r in out] == [5] * len(keys)
    b.proc.kill()
    live = [m for m in rls if m is not b]
    wait_until(lambda: rings_agree(live, [m.addr for m in live]), 30, what="b out of the rings")

    def counts():
        out = a.node.get(*[req(pb, k, hits=0, limit=1000, at=T0 + 10, name=name)
                           for k in keys])
        assert [r.error for r in out] == [""] * len(keys)
        return out if all(r.remaining <= 1000 - 5 for r in out) else None

    wait_until(counts, 30, what="every key's new owner holding the hits")
    time.sleep(3.5)  # a's sync period: anything counted twice would have arrived
    out = counts()
    assert a.addr in {r.metadata["owner"] for r in out}
    assert {k: 1000 - r.remaining for k, r in zip(keys, out)} == {k: 5 for k in keys}
