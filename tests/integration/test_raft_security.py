"""Raft transport security (issue #21): metadata members authenticate each other on the
Raft port with the cluster key (HMAC challenge-response) and/or mutual TLS, and a rogue
process that reaches the port cannot vote, append or read.

* 3-member groups with the key, with TLS, commit writes and elect a leader;
* a rogue that sends libraft's preamble and a valid-looking RequestVote / AppendEntries
  (libraft 0.15's wire format, src/uv_encoding.c) without the key, with a wrong key,
  without a certificate or with a certificate of another CA is disconnected, and every
  member's term and leader are unchanged. The same RequestVote against a group started
  with --raft-tls=disabled does bump the term (the control: the attack is real);
* a TCP proxy between members records the Raft traffic: with TLS a tenant name written
  through the leader never appears in it; with --raft-tls=disabled it does (control);
* certificates rotate on SIGHUP under a write load without a client error;
* the cluster key rotates on SIGHUP (a key file of several keys, MongoDB's procedure)
  under a write load without a client error, and a member left with only the old key is
  refused.
"""
import hashlib
import hmac
import os
import shutil
import signal
import socket
import ssl
import struct
import threading
import time

import pymongo
import pytest
from pymongo.errors import AutoReconnect, OperationFailure, ServerSelectionTimeoutError

from conftest import free_port, http_get, wait_until
from metadata_cluster import RETRYABLE, Member
from test_security_tls import make_pki

KEY = "c3RyaXBlZGItdGVzdC1jbHVzdGVyLWtleQ"
WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZw"


def keyfile(tmp_path, key=KEY, name="cluster.key"):
    p = tmp_path / name
    p.write_text(key + "\n")
    os.chmod(p, 0o600)
    return str(p)


class Group:
    """n metadata members; member i's Raft address in the bootstrap list can be replaced
    (addr_override: index -> port of a proxy that forwards to the member)."""

    def __init__(self, start_role, tmp_path, n=3, extra=(), client_opts=None,
                 addr_override=None, member_extra=None):
        self.client_opts = client_opts or {}
        self.members = []
        for i in range(n):
            d = tmp_path / f"meta{i + 1}"
            d.mkdir()
            self.members.append(Member(i, i + 1, free_port(), free_port(), free_port(), d))
        over = addr_override or {}
        boot = ",".join(f"{m.id}@127.0.0.1:{over[m.idx]}" if m.idx in over else f"{m.id}@{m.raft}"
                        for m in self.members)
        for m in self.members:
            m.proc = start_role(["--role=metadata", f"--node-id={m.id}",
                                 f"--data-dir={m.data_dir}", f"--listen={m.wire}",
                                 f"--raft-listen={m.raft}", f"--bootstrap-members={boot}",
                                 f"--http-listen=127.0.0.1:{m.http_port}",
                                 "--raft-election-timeout-ms=500"] + list(extra)
                                + (member_extra(m.idx) if member_extra else []))
            m._client = pymongo.MongoClient(
                m.wire, directConnection=True, serverSelectionTimeoutMS=5000,
                connectTimeoutMS=2000, socketTimeoutMS=10000, **self.client_opts)

    def status(self, m):
        return m.cmd("metadataStatus")

    def leader(self, timeout=30.0):
        def find():
            ready = [m for m in self.members if self.status(m)["ready"]]
            return ready[0] if len(ready) == 1 else None
        return wait_until(find, timeout, what="a ready metadata leader")

    def write(self, *args, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader(timeout=max(1.0, deadline - time.monotonic())).cmd(*args)
            except OperationFailure as e:
                if e.code not in RETRYABLE or time.monotonic() > deadline:
                    raise
            except (AutoReconnect, ServerSelectionTimeoutError):
                if time.monotonic() > deadline:
                    raise

    def converged(self, timeout=30.0):
        def same():
            sts = [self.status(m) for m in self.members]
            ok = len({(s["stateHash"], s["applyChain"], s["fsmLastApplied"]) for s in sts}) == 1
            return sts if ok else None
        return wait_until(same, timeout, what="members to converge")

    def snapshot(self):
        """(term, leader id) of every member."""
        out = []
        for m in self.members:
            st = self.status(m)
            out.append((st["term"], st.get("leaderId", st.get("leader"))))
        return out

    def close(self):
        for m in self.members:
            m.close_client()


def make_ca_and_cert(d, cn):
    """A CA named cn and a certificate for 127.0.0.1 signed by it."""
    import subprocess

    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", f"/CN={cn}")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "ext.cnf")
    return str(d / "ca.pem"), str(d / "node.pem"), str(d / "node.key")


def key_client_opts():
    return dict(username="__system", password=KEY, authSource="admin",
                authMechanism="SCRAM-SHA-256")


def raft_tls_args(p):
    # TLS on the Raft port only: --tls-mode stays disabled, the wire listener is plaintext
    return [f"--tls-cert={p['cert']}", f"--tls-key={p['key']}", f"--tls-ca={p['ca']}"]


def commits(g, tenant):
    g.write("createTenant", tenant)
    sts = g.converged()
    assert all(tenant in str(m.cmd("listTenants")) for m in g.members)
    return sts


def test_key_group_elects_and_commits(start_role, tmp_path):
    g = Group(start_role, tmp_path, extra=[f"--cluster-key-file={keyfile(tmp_path)}"],
              client_opts=key_client_opts())
    commits(g, "acme-key")
    log = g.members[0].proc.tail(100000)
    assert "raft: secure transport" in log and "cluster_key=hmac" in log
    assert "not encrypted" in log  # key alone authenticates but does not encrypt
    g.close()


def test_tls_group_elects_and_commits(start_role, tmp_path):
    p = make_pki(tmp_path)
    g = Group(start_role, tmp_path, extra=raft_tls_args(p) + [
        f"--cluster-key-file={keyfile(tmp_path)}"], client_opts=key_client_opts())
    commits(g, "acme-tls")
    log = g.members[0].proc.tail(100000)
    assert "tls=mutual" in log and "cluster_key=hmac" in log
    assert "plaintext" not in log and "not encrypted" not in log
    g.close()


# ---- libraft 0.15 wire format (src/uv_tcp_connect.c, src/uv_encoding.c) ----

def preamble(server_id, address):
    a = address.encode() + b"\0"
    a += b"\0" * (-len(a) % 8)
    return struct.pack("<QQQ", 1, server_id, len(a)) + a


def request_vote(term, candidate, last_index, last_term, disrupt=True):
    body = struct.pack("<QQQQQ", term, candidate, last_index, last_term, 1 if disrupt else 0)
    return struct.pack("<QQ", 3, len(body)) + body


def append_entries(term, prev_index, prev_term, commit):
    body = struct.pack("<QQQQQQ", term, prev_index, prev_term, commit, 0, 0)
    return struct.pack("<QQ", 1, len(body)) + body


def rogue_messages(g, victim):
    st = g.status(victim)
    t = st["term"]
    return (preamble(3, "127.0.0.1:1") + request_vote(t + 100, 3, 1 << 40, t + 99) +
            append_entries(t + 100, 0, 0, 1 << 40))


def closed_by_peer(s, timeout=15.0):
    """True once the peer closed the connection (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
        return True
    except socket.timeout:
        return False
    finally:
        s.close()


def rogue_plain(port, payload):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(payload)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return closed_by_peer(s)


def raft_key(key):
    return hmac.new(key.encode(), b"stripedb raft transport v1", hashlib.sha256).digest()


def hs_proof(key, role, client_nonce, server_nonce):
    return hmac.new(raft_key(key), b"stripedb raft proof v1" + role + client_nonce +
                    server_nonce + b"\0" * 32, hashlib.sha256).digest()


def recv_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def rogue_hmac(port, key, payload):
    """Speak our handshake with a key (the wrong one): hello, read the member's hello,
    send a proof made with `key` (the member proves itself only after checking it), then
    the Raft bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = os.urandom(32)
    s.sendall(b"SDBRAFT\x01" + b"\x01" + b"\0" * 7 + nonce)
    s.settimeout(10)
    data = recv_exactly(s, 48)
    if data is None:
        s.close()
        return True
    try:
        s.sendall(hs_proof(key, b"C", nonce, data[16:48]) + payload)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return closed_by_peer(s)


def raft_key_accepted(port, key):
    """Run the handshake with `key` up to the member's proof: True when the member accepted
    our proof and proved the same key back (then the connection is dropped before the
    preamble), False when it closed the connection instead."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(10)
    try:
        nonce = os.urandom(32)
        s.sendall(b"SDBRAFT\x01" + b"\x01" + b"\0" * 7 + nonce)
        hello = recv_exactly(s, 48)
        if hello is None:
            return False
        s.sendall(hs_proof(key, b"C", nonce, hello[16:48]))
        proof = recv_exactly(s, 32)
        if proof is None:
            return False
        assert proof == hs_proof(key, b"S", nonce, hello[16:48]), "member proved another key"
        return True
    except (ConnectionResetError, BrokenPipeError):
        return False
    finally:
        s.close()


def rogue_tls(port, payload, cert=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert)
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s = ctx.wrap_socket(raw)
        s.sendall(payload)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        raw.close()
        return True
    return closed_by_peer(s)


def refused_total(m):
    _, body = http_get(m.http_port, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("stripedb_raft_transport_refused_total"):
            return int(float(line.split()[-1]))
    return 0


def assert_unchanged(g, before):
    after = g.snapshot()
    assert after == before, f"term/leader changed: {before} -> {after}"


@pytest.mark.parametrize("mode", ["key", "tls"])
def test_rogue_peer_cannot_vote_or_append(start_role, tmp_path, mode):
    p = make_pki(tmp_path)
    if mode == "key":
        extra = [f"--cluster-key-file={keyfile(tmp_path)}"]
    else:
        extra = raft_tls_args(p) + [f"--cluster-key-file={keyfile(tmp_path)}"]
    g = Group(start_role, tmp_path, extra=extra, client_opts=key_client_opts())
    commits(g, "before-rogue")
    before = g.snapshot()
    for m in g.members:
        port = int(m.raft.rsplit(":", 1)[1])
        payload = rogue_messages(g, m)
        n0 = refused_total(m)
        # no key / no certificate: libraft's own preamble straight away
        assert rogue_plain(port, payload), "member kept a rogue connection open"
        # malformed and oversized handshake data: 1 MiB of noise
        assert rogue_plain(port, os.urandom(1 << 20))
        if mode == "key":
            assert rogue_hmac(port, WRONG_KEY, payload)
        else:
            assert rogue_tls(port, payload)  # TLS without a client certificate
            assert rogue_tls(port, payload, cert=p["rogue"])  # another CA's certificate
        assert_unchanged(g, before)
        # each attempt was refused by the member (not just dropped by the client side)
        # a TLS refusal sends its alert before the member counts it: the client can see
        # the alert first, so wait for the count
        want = n0 + (3 if mode == "key" else 4)
        wait_until(lambda: refused_total(m) >= want, 10, what=f"{want} refusals counted")
        assert m.proc.p.poll() is None  # still running
    assert "raft: transport peer refused" in g.members[0].proc.tail(200000)
    commits(g, "after-rogue")  # the group still works
    g.close()


def test_rogue_request_vote_disrupts_a_plaintext_group(start_role, tmp_path):
    """Control: against --raft-tls=disabled the bytes of the tests above (another
    cluster's member 3) reach libraft and bump the term: in a set of several voters a
    member accepts ids it does not know (a member that lagged behind a configuration
    change can only learn it from a leader it does not know yet; raft/node.c
    node_peer_ok), and without the key or TLS nothing authenticates a member. A peer
    claiming the victim's own id is refused (a member never connects to itself)."""
    g = Group(start_role, tmp_path, extra=["--raft-tls=disabled"])
    commits(g, "plain")
    leader = g.leader()
    victim = next(m for m in g.members if m is not leader)
    t0 = g.status(victim)["term"]
    port = int(victim.raft.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(preamble(victim.id, "127.0.0.1:1") + request_vote(t0 + 100, victim.id, 1 << 40, t0 + 99))
    assert closed_by_peer(s), "a peer with the victim's own id was not refused"
    assert "raft peer claims this member's own server id" in victim.proc.tail(100000)
    assert g.status(victim)["term"] == t0
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(rogue_messages(g, victim))
    wait_until(lambda: g.status(victim)["term"] >= t0 + 100, 20, what="term bumped by rogue")
    s.close()
    assert "the raft transport is plaintext and unauthenticated" in victim.proc.tail(100000)
    g.close()


# ---- traffic capture through a forwarding proxy ----

class Recorder:
    """TCP forwarder 127.0.0.1:port -> target port recording every byte both ways."""

    def __init__(self, target_port):
        self.target = target_port
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.stop = False
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while not self.stop:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                with self.lock:
                    self.buf += d
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def data(self):
        with self.lock:
            return bytes(self.buf)

    def close(self):
        self.stop = True
        self.ls.close()


@pytest.mark.parametrize("mode", ["tls", "disabled"])
def test_captured_raft_traffic_has_no_plaintext(start_role, tmp_path, mode):
    p = make_pki(tmp_path)
    # member 2 (index 1) is reached by the others through the recorder
    real = free_port()
    rec = Recorder(real)
    extra = raft_tls_args(p) if mode == "tls" else ["--raft-tls=disabled"]
    # Group picks member ports itself: pin member 2's raft port to `real`
    orig = Member.__init__

    def init(self, idx, node_id, raft_port, *a):
        orig(self, idx, node_id, real if idx == 1 else raft_port, *a)
    Member.__init__ = init
    try:
        g = Group(start_role, tmp_path, extra=extra, addr_override={1: rec.port})
    finally:
        Member.__init__ = orig
    # Replies travel to the address a sender announces in libraft's preamble (member 2's
    # real port), so the recorder sees the entries only when member 2 is a follower.
    if g.leader() is g.members[1]:
        g.members[1].cmd("transferLeadership", g.members[0].id)
        wait_until(lambda: g.leader() is not g.members[1], 30, what="leader moved off member 2")
    secret = "tenant-zebra-7f3a9c"
    g.write("createTenant", secret)
    g.converged()
    # member 2 applied the entry, which reached it through the recorder
    assert secret in str(g.members[1].cmd("listTenants"))
    data = rec.data()
    assert len(data) > 200, "the recorder saw no Raft traffic"
    if mode == "tls":
        assert secret.encode() not in data
        assert b"createTenant" not in data
    else:
        assert secret.encode() in data  # control: the capture does see plaintext
    rec.close()
    g.close()


def test_raft_tls_enabled_needs_key_or_certificates(start_role, tmp_path):
    import subprocess
    from conftest import BIN
    d = tmp_path / "m"
    d.mkdir()
    rport = free_port()
    r = subprocess.run([BIN, "--role=metadata", "--node-id=1", f"--data-dir={d}",
                        f"--listen=127.0.0.1:{free_port()}", f"--raft-listen=127.0.0.1:{rport}",
                        f"--bootstrap-members=1@127.0.0.1:{rport}", "--raft-tls=enabled"],
                       capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"))
    assert r.returncode == 2
    assert "--raft-tls=enabled needs" in r.stderr
    r = subprocess.run([BIN, "--role=metadata", "--node-id=1", f"--data-dir={d}",
                        f"--listen=127.0.0.1:{free_port()}", f"--raft-listen=127.0.0.1:{rport}",
                        "--raft-tls=sometimes"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"))
    assert r.returncode == 2 and "--raft-tls must be" in r.stderr


def test_raft_tls_auto_never_falls_back_to_plaintext_silently(tmp_path):
    """auto refuses (exit 2, one line) what would leave the Raft port open without the
    operator choosing it: a partial TLS setup, and a non-loopback --raft-listen with neither
    key nor certificates; a bad --raft-tls is bad usage in every role, not only metadata."""
    import subprocess
    from conftest import BIN
    p = make_pki(tmp_path)
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")

    def meta(raft_host, *extra):
        d = tmp_path / f"m{free_port()}"
        d.mkdir()
        rport = free_port()
        return subprocess.run([BIN, "--role=metadata", "--node-id=1", f"--data-dir={d}",
                               f"--listen=127.0.0.1:{free_port()}",
                               f"--raft-listen={raft_host}:{rport}",
                               f"--bootstrap-members=1@127.0.0.1:{rport}", *extra],
                              capture_output=True, text=True, timeout=30, env=env)
    # server TLS for the wire listener only (no --tls-ca): not a secure Raft port
    r = meta("127.0.0.1", "--tls-mode=required", f"--tls-cert={p['cert']}",
             f"--tls-key={p['key']}")
    assert r.returncode == 2, r.stderr
    assert "are not all set" in r.stderr.strip().splitlines()[-1]
    # reachable from other hosts, nothing configured
    r = meta("0.0.0.0")
    assert r.returncode == 2 and "is not a loopback address" in r.stderr, r.stderr
    # a shard and a proxy check the value too
    for role in (["--role=shard", f"--data-dir={tmp_path / 's'}"],
                 ["--role=proxy", "--metadata=127.0.0.1:1"]):
        r = subprocess.run([BIN, *role, f"--listen=127.0.0.1:{free_port()}",
                            "--raft-tls=bogus"], capture_output=True, text=True, timeout=30,
                           env=env)
        assert r.returncode == 2 and "--raft-tls must be" in r.stderr, (role, r.stderr)


def test_certificate_rotation_under_write_load(start_role, tmp_path):
    """Rotate every member's certificate to one of a new CA while writes run: first the
    CA bundle gains the new CA (SIGHUP), then the certificates change (SIGHUP), then the
    old CA goes (SIGHUP). No write fails, and every acknowledged write is applied
    everywhere; new Raft connections (forced by restarting one member) use the new
    certificates."""
    old = tmp_path / "old"
    new = tmp_path / "new"
    old.mkdir()
    new.mkdir()
    ca1, cert1, key1 = make_ca_and_cert(old, "raft-ca-2025")
    ca2, cert2, key2 = make_ca_and_cert(new, "raft-ca-2026")
    live = tmp_path / "live"
    live.mkdir()
    for src, dst in ((ca1, "ca.pem"), (cert1, "cert.pem"), (key1, "key.pem")):
        shutil.copy(src, live / dst)
    args = [f"--tls-cert={live / 'cert.pem'}", f"--tls-key={live / 'key.pem'}",
            f"--tls-ca={live / 'ca.pem'}"]
    g = Group(start_role, tmp_path, extra=args)
    commits(g, "rotation-start")
    acked, errors = [], []
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            name = f"load-{i}"
            try:
                g.write("createTenant", name, timeout=20)
                acked.append(name)
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(repr(e))
            i += 1

    t = threading.Thread(target=load, daemon=True)
    t.start()

    def hup_all():
        for m in g.members:
            m.proc.signal(signal.SIGHUP)
        for m in g.members:
            wait_until(lambda m=m: m.proc.tail(200000).count("raft: tls certificate reloaded")
                       >= hup_all.n, 20, what="raft tls reload")
    hup_all.n = 0

    def step(n_acked):
        wait_until(lambda: len(acked) >= n_acked, 30, what="writes during rotation")

    step(5)
    (live / "ca.pem").write_text(open(ca1).read() + open(ca2).read())
    hup_all.n = 1
    hup_all()
    step(len(acked) + 5)
    shutil.copy(cert2, live / "cert.pem.tmp")
    shutil.copy(key2, live / "key.pem.tmp")
    os.replace(live / "key.pem.tmp", live / "key.pem")
    os.replace(live / "cert.pem.tmp", live / "cert.pem")
    hup_all.n = 2
    hup_all()
    step(len(acked) + 5)
    shutil.copy(ca2, live / "ca.pem")
    hup_all.n = 3
    hup_all()
    # new connections now need the new CA on both sides: restart one follower
    leader = g.leader()
    f = next(m for m in g.members if m is not leader)
    f.close_client()
    f.proc.stop()
    f.proc.restart()
    f.proc.wait_healthy()
    f._client = pymongo.MongoClient(f.wire, directConnection=True, serverSelectionTimeoutMS=5000)
    step(len(acked) + 5)
    stop.set()
    t.join(timeout=60)
    assert errors == []
    g.converged()
    names = str(f.cmd("listTenants"))
    assert all(a in names for a in acked)
    g.close()


# ---- cluster key rotation (issue #21) ----

NEW_KEY = "bmV3LWNsdXN0ZXIta2V5LXJvdGF0ZWQtMjAyNg"


def key_opts(key):
    return dict(username="__system", password=key, authSource="admin",
                authMechanism="SCRAM-SHA-256")


def write_keys(path, text):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def wire_auth_ok(m, key):
    """Does a new connection authenticated as __system with key get in (SCRAM on the
    member's wire listener)?"""
    c = pymongo.MongoClient(m.wire, directConnection=True, serverSelectionTimeoutMS=5000,
                            connectTimeoutMS=2000, **key_opts(key))
    try:
        c.admin.command("metadataStatus")
        return True
    except OperationFailure as e:
        assert e.code == 18, e  # AuthenticationFailed
        return False
    finally:
        c.close()


def test_cluster_key_rotation_under_write_load(start_role, tmp_path):
    """MongoDB's keyfile rotation on a 3-member metadata group while writes run, with a
    SIGHUP per step and no restart: (1) every key file becomes [old, new] (YAML list),
    (2) [new, old], (3) new alone. After (1) both keys authenticate on the wire (SCRAM
    __system) and on the Raft port; in the middle of (2) one member, already [new, old]
    while the others are [old, new], is restarted so that every Raft connection to and from
    it is handshaken anew in the mixed state; after (3) the old key is refused everywhere.
    No write fails, every acknowledged write is on every member, the group keeps a leader
    and the same applied index. Then a member restarted with only the old key is refused
    (stripedb_raft_transport_refused_total grows on the others, which go on committing)
    and joins again once its key file is fixed and it gets a SIGHUP."""
    files = [tmp_path / f"key{i}" for i in range(3)]
    for f in files:
        write_keys(f, KEY + "\n")
    g = Group(start_role, tmp_path, client_opts=key_client_opts(),
              member_extra=lambda i: [f"--cluster-key-file={files[i]}"])
    commits(g, "keyrot-start")
    acked, errors = [], []
    stop = threading.Event()
    lock = threading.Lock()

    def leader():
        def find():
            ready = []
            for m in g.members:
                try:
                    if g.status(m)["ready"]:
                        ready.append(m)
                except Exception:  # noqa: BLE001 - a member being restarted or refused
                    pass
            return ready[0] if len(ready) == 1 else None
        return wait_until(find, 30, what="a ready metadata leader")

    def write(name):
        deadline = time.monotonic() + 30
        while True:
            try:
                with lock:
                    ldr = leader()
                return ldr.cmd("createTenant", name)
            except OperationFailure as e:
                if e.code not in RETRYABLE or time.monotonic() > deadline:
                    raise
            except (AutoReconnect, ServerSelectionTimeoutError):
                if time.monotonic() > deadline:
                    raise

    def load():
        i = 0
        while not stop.is_set():
            name = f"kr-{i}"
            try:
                write(name)
                acked.append(name)
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(repr(e))
            i += 1

    def reloaded(m, n):
        wait_until(lambda: m.proc.tail(1 << 30).count('msg="cluster key file reloaded"') >= n, 20,
                   what="cluster key reload")

    def hup(i, text, n):
        write_keys(files[i], text)
        g.members[i].proc.signal(signal.SIGHUP)
        reloaded(g.members[i], n)

    def more_writes(k=5):
        n = len(acked)
        wait_until(lambda: len(acked) >= n + k, 60, what="writes during the rotation")

    def switch_clients(key):
        with lock:
            for m in g.members:
                m.close_client()
                m.client_opts = key_opts(key)
                m._client = pymongo.MongoClient(
                    m.wire, directConnection=True, serverSelectionTimeoutMS=5000,
                    connectTimeoutMS=2000, socketTimeoutMS=10000, **key_opts(key))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    more_writes()
    # step 1: the new key second everywhere
    for i in range(3):
        hup(i, f"# rotation\n- {KEY}\n- {NEW_KEY}\n", 1)
    more_writes()
    for m in g.members:
        port = int(m.raft.rsplit(":", 1)[1])
        assert raft_key_accepted(port, KEY) and raft_key_accepted(port, NEW_KEY)
        assert wire_auth_ok(m, KEY) and wire_auth_ok(m, NEW_KEY)
        assert not wire_auth_ok(m, WRONG_KEY)
        assert not raft_key_accepted(port, WRONG_KEY)
    switch_clients(NEW_KEY)  # clients may move to the new key once every member has it
    more_writes()
    # step 2: the new key first, one member after the other; a follower goes first and
    # is restarted in the mixed state to force new Raft handshakes both ways
    ldr = leader()
    order = [m.idx for m in g.members if m is not ldr] + [ldr.idx]
    f = g.members[order[0]]
    hup(f.idx, f"- {NEW_KEY}\n- {KEY}\n", 2)
    with lock:
        f.close_client()
        f.proc.stop()
        f.proc.restart()
    f.proc.wait_healthy()
    target = g.status(ldr)["fsmLastApplied"]
    wait_until(lambda: g.status(f)["fsmLastApplied"] >= target, 60,
               what="the restarted member to catch up in the mixed state")
    more_writes()
    for i in order[1:]:
        hup(i, f"- {NEW_KEY}\n- {KEY}\n", 2)
    more_writes()
    # step 3: the old key dropped (the one-key form again)
    for i in range(3):
        hup(i, NEW_KEY + "\n", 3)  # the restarted member's log goes on in the same file
    more_writes()
    for m in g.members:
        port = int(m.raft.rsplit(":", 1)[1])
        n0 = refused_total(m)
        assert not raft_key_accepted(port, KEY)
        assert raft_key_accepted(port, NEW_KEY)
        assert refused_total(m) >= n0 + 1
        assert not wire_auth_ok(m, KEY)
        assert wire_auth_ok(m, NEW_KEY)
    more_writes()
    stop.set()
    t.join(timeout=90)
    assert errors == []
    assert len(acked) >= 30
    sts = g.converged()
    assert len({s["fsmLastApplied"] for s in sts}) == 1
    ldr = leader()
    for m in g.members:
        names = str(m.cmd("listTenants"))
        assert all(a in names for a in acked), f"member {m.id} lacks acknowledged writes"

    # a member left with only the old key (restarted with it) is refused by the others
    stale = next(m for m in g.members if m is not ldr)
    others = [m for m in g.members if m is not stale]
    before = {m.id: refused_total(m) for m in others}
    stale.close_client()
    stale.proc.stop()
    write_keys(files[stale.idx], KEY + "\n")
    stale.proc.restart()
    for m in others:
        wait_until(lambda m=m: refused_total(m) > before[m.id], 30,
                   what="the stale member's connections refused")
    assert "wrong cluster key proof" in others[0].proc.tail(400000) + \
        others[1].proc.tail(400000)
    assert not wire_auth_ok(stale, NEW_KEY)
    # the two others still elect and commit
    w = leader()
    assert w is not stale
    w.cmd("createTenant", "kr-without-stale")
    applied = g.status(w)["fsmLastApplied"]
    peer = next(m for m in others if m is not w)
    wait_until(lambda: g.status(peer)["fsmLastApplied"] >= applied, 30,
               what="the write to reach the other member")
    # fixed by a SIGHUP alone: its outgoing and incoming handshakes use the new key again
    write_keys(files[stale.idx], NEW_KEY + "\n")
    stale.proc.signal(signal.SIGHUP)
    wait_until(lambda: 'msg="cluster key file reloaded"' in stale.proc.tail(1 << 30), 20,
               what="the stale member's reload")
    stale.client_opts = key_opts(NEW_KEY)
    stale._client = pymongo.MongoClient(stale.wire, directConnection=True,
                                        serverSelectionTimeoutMS=5000, **key_opts(NEW_KEY))
    g.converged(timeout=60)
    assert "kr-without-stale" in str(stale.cmd("listTenants"))
    g.close()


def test_bad_key_file_exits_2(tmp_path):
    """A key file that breaks the rules stops the role at start with exit code 2 and a
    message naming the problem; a bad file at SIGHUP is covered by
    test_bad_key_file_at_sighup_keeps_the_keys."""
    import subprocess
    from conftest import BIN
    cases = {"- goodkey1\n- bad\n": "key 2 shorter than 6",
             "- goodkey1\nkeys: [a, b]\n": "line 2: expected '- KEY'",
             "key with spaces and a *\n": "only base64"}
    for text, msg in cases.items():
        kf = tmp_path / "bad.key"
        write_keys(kf, text)
        d = tmp_path / "m"
        d.mkdir(exist_ok=True)
        rport = free_port()
        r = subprocess.run([BIN, "--role=metadata", "--node-id=1", f"--data-dir={d}",
                            f"--listen=127.0.0.1:{free_port()}",
                            f"--raft-listen=127.0.0.1:{rport}",
                            f"--bootstrap-members=1@127.0.0.1:{rport}",
                            f"--cluster-key-file={kf}"],
                           capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"))
        assert r.returncode == 2, (text, r.stderr)
        assert msg in r.stderr, (text, r.stderr)


def test_bad_key_file_at_sighup_keeps_the_keys(start_role, tmp_path):
    """A bad key file at SIGHUP is logged as an error and the keys in use stay: the member
    still accepts the old key (wire and Raft) and does not accept the new one; the group
    commits."""
    kf = tmp_path / "cluster.key"
    write_keys(kf, KEY + "\n")
    g = Group(start_role, tmp_path, n=1, extra=[f"--cluster-key-file={kf}"],
              client_opts=key_client_opts())
    commits(g, "bad-hup")
    m = g.members[0]
    port = int(m.raft.rsplit(":", 1)[1])
    write_keys(kf, f"- {NEW_KEY}\n- bad\n")
    m.proc.signal(signal.SIGHUP)
    wait_until(lambda: "cluster key reload failed, keeping the old keys" in
               m.proc.tail(200000), 20, what="the reload error")
    assert "key 2 shorter than 6" in m.proc.tail(200000)
    assert wire_auth_ok(m, KEY) and not wire_auth_ok(m, NEW_KEY)
    assert raft_key_accepted(port, KEY) and not raft_key_accepted(port, NEW_KEY)
    os.chmod(kf, 0o644)  # permissions too open: refused the same way
    write_keys(kf, f"- {NEW_KEY}\n- {KEY}\n")
    os.chmod(kf, 0o644)
    m.proc.signal(signal.SIGHUP)
    wait_until(lambda: m.proc.tail(200000).count("keeping the old keys") >= 2, 20,
               what="the second reload error")
    assert wire_auth_ok(m, KEY) and not wire_auth_ok(m, NEW_KEY)
    commits(g, "bad-hup-after")
    assert m.proc.p.poll() is None
    g.close()
