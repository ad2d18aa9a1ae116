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
* certificates rotate on SIGHUP under a write load without a client error.
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
                 addr_override=None):
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
                                 "--raft-election-timeout-ms=500"] + list(extra))
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


def rogue_hmac(port, key, payload):
    """Speak our handshake with a key (the wrong one): hello, read the member's hello and
    proof, send a proof made with `key`, then the Raft bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = os.urandom(32)
    s.sendall(b"SDBRAFT\x01" + b"\x01" + b"\0" * 7 + nonce)
    data = b""
    s.settimeout(10)
    while len(data) < 80:
        chunk = s.recv(80 - len(data))
        if not chunk:
            s.close()
            return True
        data += chunk
    k = hmac.new(key.encode(), b"stripedb raft transport v1", hashlib.sha256).digest()
    proof = hmac.new(k, b"stripedb raft proof v1" + b"C" + nonce + data[16:48] + b"\0" * 32,
                     hashlib.sha256).digest()
    try:
        s.sendall(proof + payload)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return closed_by_peer(s)


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
        assert refused_total(m) >= n0 + (3 if mode == "key" else 4)
        assert m.proc.p.poll() is None  # still running
    assert "raft: transport peer refused" in g.members[0].proc.tail(200000)
    commits(g, "after-rogue")  # the group still works
    g.close()


def test_rogue_request_vote_disrupts_a_plaintext_group(start_role, tmp_path):
    """Control: the same bytes against --raft-tls=disabled reach libraft and bump the
    term (so the test above would fail if the transport let them through)."""
    g = Group(start_role, tmp_path, extra=["--raft-tls=disabled"])
    commits(g, "plain")
    leader = g.leader()
    victim = next(m for m in g.members if m is not leader)
    t0 = g.status(victim)["term"]
    port = int(victim.raft.rsplit(":", 1)[1])
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
