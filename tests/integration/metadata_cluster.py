"""A metadata Raft group of real `stripedb --role=metadata` processes on loopback, for the
metadata integration tests, the linearizability check and the benchmark.

Each member gets free ports for raft, wire and HTTP and its own data dir; all members are
bootstrapped with the same --bootstrap-members list.
"""
import hashlib
import time

import pymongo
from pymongo.errors import AutoReconnect, OperationFailure, ServerSelectionTimeoutError

from conftest import free_port, wait_until

SET_NAME = "stripedb-meta"
# NotWritablePrimary, InterruptedDueToReplStateChange, NotPrimaryNoSecondaryOk,
# InterruptedAtShutdown: the command may be retried elsewhere / later.
RETRYABLE = {10107, 11602, 13435, 11600}


class Member:
    def __init__(self, idx, node_id, raft_port, wire_port, http_port, data_dir,
                 client_opts=None):
        self.idx = idx
        self.client_opts = client_opts or {}  # e.g. __system credentials with a key
        self.id = node_id
        self.raft = f"127.0.0.1:{raft_port}"
        self.wire = f"127.0.0.1:{wire_port}"
        self.wire_port = wire_port
        self.http_port = http_port
        self.data_dir = data_dir
        self.proc = None
        self._client = None

    def client(self):
        if self._client is None:
            self._client = pymongo.MongoClient(
                self.wire, directConnection=True, serverSelectionTimeoutMS=5000,
                heartbeatFrequencyMS=500, connectTimeoutMS=2000, socketTimeoutMS=10000,
                **self.client_opts)
        return self._client

    def cmd(self, *args, **kw):
        return self.client().admin.command(*args, **kw)

    def status(self):
        return self.cmd("metadataStatus")

    def close_client(self):
        if self._client is not None:
            self._client.close()
            self._client = None


class Cluster:
    def __init__(self, start_role, tmp_path, n, election_ms=500, snapshot_threshold=None,
                 extra=(), client_opts=None):
        self.start_role = start_role
        self.tmp_path = tmp_path
        self.election_ms = election_ms
        self.snapshot_threshold = snapshot_threshold
        self.extra = list(extra)
        self.client_opts = client_opts
        self.members = []
        for i in range(n):
            d = tmp_path / f"meta{i + 1}"
            d.mkdir()
            self.members.append(Member(i, i + 1, free_port(), free_port(), free_port(), d,
                                       client_opts))
        self.bootstrap = ",".join(f"{m.id}@{m.raft}" for m in self.members)
        for m in self.members:
            self.start(m, bootstrap=True)
        self.wait_registered()

    def wait_registered(self, members=None, timeout=30.0):
        """Wait until every member lists every given member's wire address in hello's
        hosts (members register their address through the leader after it is elected).
        A driver drops seeds that the primary does not list, so tests start from here."""
        members = members or self.members
        want = sorted(m.wire for m in members)
        wait_until(lambda: all(sorted(m.cmd("hello")["hosts"]) == want for m in members),
                   timeout, what="every member registered in hello's hosts")

    def args(self, m, bootstrap):
        a = ["--role=metadata", f"--node-id={m.id}", f"--data-dir={m.data_dir}",
             f"--listen={m.wire}", f"--raft-listen={m.raft}",
             f"--http-listen=127.0.0.1:{m.http_port}",
             f"--raft-election-timeout-ms={self.election_ms}"]
        if bootstrap:
            a.append(f"--bootstrap-members={self.bootstrap}")
        if self.snapshot_threshold:
            a.append(f"--raft-snapshot-threshold={self.snapshot_threshold}")
        return a + self.extra

    def start(self, m, bootstrap=True):
        m.proc = self.start_role(self.args(m, bootstrap))
        return m

    def add_member(self):
        """Start a fresh member (no bootstrap list): it waits to be added."""
        i = len(self.members)
        d = self.tmp_path / f"meta{i + 1}"
        d.mkdir()
        m = Member(i, i + 1, free_port(), free_port(), free_port(), d, self.client_opts)
        self.members.append(m)
        self.start(m, bootstrap=False)
        return m

    def kill(self, m):
        m.close_client()
        m.proc.kill()

    def restart(self, m):
        m.close_client()
        m.proc.restart()
        m.proc.wait_healthy()

    def alive(self):
        return [m for m in self.members if m.proc and m.proc.p.poll() is None]

    def seeds(self):
        return ",".join(m.wire for m in self.members)

    def rs_client(self, **kw):
        """A driver client given every member: it finds the leader by itself."""
        opts = dict(replicaSet=SET_NAME, heartbeatFrequencyMS=500,
                    serverSelectionTimeoutMS=20000, connectTimeoutMS=2000,
                    socketTimeoutMS=10000)
        opts.update(kw)
        return pymongo.MongoClient(f"mongodb://{self.seeds()}/", **opts)

    def leader(self, timeout=30.0, exclude=()):
        """The member that reports itself the ready leader, once every alive member
        agrees on it."""
        def find():
            ready = []
            for m in self.alive():
                if m in exclude:
                    continue
                try:
                    st = m.status()
                except Exception:  # noqa: BLE001 - member may be restarting
                    continue
                if st["ready"]:
                    ready.append(m)
            return ready[0] if len(ready) == 1 else None
        return wait_until(find, timeout, what="a ready metadata leader")

    def write(self, *args, timeout=30.0, ok_codes=(), **kw):
        """Run a write on whichever member is leader, retrying while leadership moves.
        Error codes in ok_codes are returned as the error's details instead of raised."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader(timeout=max(1.0, deadline - time.monotonic())).cmd(*args, **kw)
            except OperationFailure as e:
                if e.code in ok_codes:
                    return e.details
                if e.code not in RETRYABLE or time.monotonic() > deadline:
                    raise
            except (AutoReconnect, ServerSelectionTimeoutError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def converged(self, members=None, timeout=30.0):
        """Wait until the given (default: alive) members applied the same commands and
        hold identical state; return the common state hash."""
        def same():
            sts = [m.status() for m in (members or self.alive())]
            hashes = {s["stateHash"] for s in sts}
            chains = {s["applyChain"] for s in sts}  # same commands, same order
            applied = {s["fsmLastApplied"] for s in sts}
            ok = len(hashes) == 1 and len(chains) == 1 and len(applied) == 1
            return sts[0]["stateHash"] if ok else None
        return wait_until(same, timeout, what="members to converge")


def scram_stored_key(password, salt, iterations):
    """RFC 5802 StoredKey for SCRAM-SHA-256 (used to check verifiers)."""
    import hmac
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest()
