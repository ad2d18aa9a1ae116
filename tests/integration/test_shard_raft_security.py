"""Raft transport security for shard replica sets (issues #21 and #15): the members of a
3-member shard set authenticate each other on the Raft port (cluster key, mutual TLS), a
rogue process that reaches the port cannot vote or append, and captured member traffic
carries no document field in plaintext. Same transport as metadata (raft/transport.c);
the attack bytes and the recorder come from test_raft_security.py.
"""
import os

import pymongo
import pytest

from conftest import free_port, wait_until
from test_raft_security import (WRONG_KEY, Recorder, key_client_opts, keyfile,
                                raft_tls_args, refused_total, rogue_hmac, rogue_plain,
                                rogue_tls, preamble, request_vote, append_entries)
from test_security_tls import make_pki

SET = "rs-sec"


class ShardSet:
    """Three shard members; member i's Raft address in the bootstrap list may be replaced
    (addr_override: index -> port of a recorder that forwards to the member)."""

    def __init__(self, start_role, tmp_path, extra, client_opts, addr_override=None,
                 raft_ports=None):
        self.wires = [free_port() for _ in range(3)]
        self.rafts = raft_ports or [free_port() for _ in range(3)]
        over = addr_override or {}
        boot = ",".join(f"{i + 1}@127.0.0.1:{over.get(i, self.rafts[i])}" for i in range(3))
        self.http = [free_port() for _ in range(3)]
        self.procs = [start_role(["--role=shard", f"--replica-set={SET}", f"--node-id={i + 1}",
                                  f"--data-dir={tmp_path / f'm{i + 1}'}",
                                  f"--listen=127.0.0.1:{self.wires[i]}",
                                  f"--raft-listen=127.0.0.1:{self.rafts[i]}",
                                  f"--bootstrap-members={boot}",
                                  f"--http-listen=127.0.0.1:{self.http[i]}",
                                  "--raft-election-timeout-ms=500",
                                  "--shutdown-quiesce-ms=0", *extra])
                      for i in range(3)]
        self.opts = client_opts
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.wires)
        self.uri = f"mongodb://{hosts}/?replicaSet={SET}"

    def direct(self, i):
        return pymongo.MongoClient(f"mongodb://127.0.0.1:{self.wires[i]}/?directConnection=true",
                                   serverSelectionTimeoutMS=5000, **self.opts)

    def status(self, i):
        with self.direct(i) as c:
            return c.admin.command("replSetGetStatus")

    def snapshot(self):
        return [(s["term"], s["primaryId"]) for s in (self.status(i) for i in range(3))]

    def primary(self):
        def find():
            for i in range(3):
                if self.status(i)["state"] == "PRIMARY":
                    return i + 1
            return None
        return wait_until(find, 30, what="a primary") - 1

    def write(self, doc):
        with pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=30000, **self.opts) as c:
            c.app.c.insert_one(doc)

    def everywhere(self, _id):
        def ok():
            for i in range(3):
                with self.direct(i) as c:
                    if c.app.c.find_one({"_id": _id}) is None:
                        return False
            return True
        wait_until(ok, 30, what=f"_id {_id} on every member")


@pytest.mark.parametrize("mode", ["key", "tls"])
def test_rogue_peer_cannot_vote_or_append_in_a_shard_set(start_role, tmp_path, mode):
    p = make_pki(tmp_path)
    extra = [f"--cluster-key-file={keyfile(tmp_path)}"]
    if mode == "tls":
        extra = raft_tls_args(p) + extra
    s = ShardSet(start_role, tmp_path, extra, key_client_opts())
    s.write({"_id": "before"})
    s.everywhere("before")
    before = s.snapshot()
    for i in range(3):
        port = s.rafts[i]
        term = before[i][0]
        payload = (preamble(9, "127.0.0.1:1") + request_vote(term + 100, 9, 1 << 40, term + 99)
                   + append_entries(term + 100, 0, 0, 1 << 40))
        m = type("M", (), {"http_port": s.http[i]})()
        n0 = refused_total(m)
        assert rogue_plain(port, payload), "member kept a rogue connection open"
        assert rogue_plain(port, os.urandom(1 << 20))
        if mode == "key":
            assert rogue_hmac(port, WRONG_KEY, payload)
        else:
            assert rogue_tls(port, payload)
            assert rogue_tls(port, payload, cert=p["rogue"])
        # a TLS refusal sends its alert before the member counts it: the client can see
        # the alert first, so wait for the count
        want = n0 + (3 if mode == "key" else 4)
        wait_until(lambda: refused_total(m) >= want, 10, what=f"{want} refusals counted")
        assert s.procs[i].p.poll() is None
    assert s.snapshot() == before, "a rogue changed a member's term or primary"
    s.write({"_id": "after"})
    s.everywhere("after")


@pytest.mark.parametrize("mode", ["tls", "disabled"])
def test_captured_shard_raft_traffic_has_no_plaintext(start_role, tmp_path, mode):
    p = make_pki(tmp_path)
    rafts = [free_port() for _ in range(3)]
    rec = Recorder(rafts[1])  # the others reach member 2 through the recorder
    extra = raft_tls_args(p) if mode == "tls" else ["--raft-tls=disabled"]
    s = ShardSet(start_role, tmp_path, extra, {}, addr_override={1: rec.port}, raft_ports=rafts)
    # entries reach member 2 through the recorder only while it is a follower
    if s.primary() == 1:
        with s.direct(1) as c:
            c.admin.command({"transferLeadership": 1})
        wait_until(lambda: s.primary() != 1, 30, what="primary moved off member 2")
    secret = "card-holder-zebra-7f3a9c"
    s.write({"_id": 1, "name": secret})
    s.everywhere(1)
    data = rec.data()
    assert len(data) > 200, "the recorder saw no Raft traffic"
    if mode == "tls":
        assert secret.encode() not in data
    else:
        assert secret.encode() in data  # control: the capture does see plaintext
    rec.close()


def test_shard_set_certificate_rotation_under_write_load(start_role, tmp_path):
    """Rotate every shard member's Raft certificate to one of a new CA while a client writes
    through the replica-set URI: CA bundle old+new (SIGHUP), new certificates (SIGHUP), new
    CA only (SIGHUP), then a member restarts so new Raft connections use the new
    certificates. No write fails; every acknowledged write is on every member."""
    import shutil
    import signal
    import threading
    from test_raft_security import make_ca_and_cert
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    for d in (old, new, live):
        d.mkdir()
    ca1, cert1, key1 = make_ca_and_cert(old, "shard-raft-ca-2025")
    ca2, cert2, key2 = make_ca_and_cert(new, "shard-raft-ca-2026")
    for src, dst in ((ca1, "ca.pem"), (cert1, "cert.pem"), (key1, "key.pem")):
        shutil.copy(src, live / dst)
    args = [f"--tls-cert={live / 'cert.pem'}", f"--tls-key={live / 'key.pem'}",
            f"--tls-ca={live / 'ca.pem'}"]
    s = ShardSet(start_role, tmp_path, args, {})
    acked, errors = [], []
    stop = threading.Event()

    def load():
        c = pymongo.MongoClient(s.uri, serverSelectionTimeoutMS=30000, retryWrites=True)
        i = 0
        while not stop.is_set():
            try:
                c.app.c.insert_one({"_id": i})
                acked.append(i)
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(repr(e))
            i += 1
        c.close()

    t = threading.Thread(target=load, daemon=True)
    t.start()

    def hup_all(n):
        for p in s.procs:
            p.signal(signal.SIGHUP)
        for p in s.procs:
            wait_until(lambda p=p: p.tail(1 << 20).count("raft: tls certificate reloaded") >= n,
                       20, what="raft tls reload")

    def step():
        n = len(acked)
        wait_until(lambda: len(acked) >= n + 20, 30, what="writes during rotation")

    step()
    (live / "ca.pem").write_text(open(ca1).read() + open(ca2).read())
    hup_all(1)
    step()
    shutil.copy(cert2, live / "cert.pem.tmp")
    shutil.copy(key2, live / "key.pem.tmp")
    os.replace(live / "key.pem.tmp", live / "key.pem")
    os.replace(live / "cert.pem.tmp", live / "cert.pem")
    hup_all(2)
    step()
    shutil.copy(ca2, live / "ca.pem")
    hup_all(3)
    # new Raft connections need the new CA on both sides: restart a secondary
    f = (s.primary() + 1) % 3
    s.procs[f].stop()
    s.procs[f].restart()
    s.procs[f].wait_healthy()
    step()
    stop.set()
    t.join(timeout=60)
    assert errors == []
    last = acked[-1]
    s.everywhere(last)
    for i in range(3):
        with s.direct(i) as c:
            have = {d["_id"] for d in c.app.c.find({}, {"_id": 1})}
        assert set(acked) <= have, f"member {i + 1} lacks acknowledged writes"
