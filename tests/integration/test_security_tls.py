"""TLS on the proxy's client listener (issue #10): --tls-mode=required serves TLS clients
and refuses plaintext ones; allowed serves both; authentication works over TLS."""
import json
import struct
import subprocess

import bson
import pymongo
import pytest
from pymongo.errors import ServerSelectionTimeoutError

from conftest import free_port, op_msg, tls_send_then_close_notify, wait_until
from proxy_helpers import ProxyCluster
from test_ratelimit_grpc import pb  # noqa: F401 - the stubs fixture


def make_certs(d):
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl CLI)."""
    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=stripedb-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key")


def tls_args(tmp_path, mode):
    d = tmp_path / "certs"
    d.mkdir()
    ca, cert, key = make_certs(d)
    return ca, [f"--tls-mode={mode}", f"--tls-cert={cert}", f"--tls-key={key}"]


def plain_client(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                               serverSelectionTimeoutMS=1500, connectTimeoutMS=1500)


def tls_client(port, ca, **kw):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                               serverSelectionTimeoutMS=10000, tls=True, tlsCAFile=ca,
                               retryWrites=False, **kw)


def test_tls_required_rejects_plaintext(start_role, tmp_path):
    ca, args = tls_args(tmp_path, "required")
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      proxy_args=args + ["--auth=enabled"])
    cl.meta_cmd({"createTenant": "A"})
    cl.create_database("adb", tenant="A")
    cl.meta_cmd({"createUser": "alice", "tenant": "A", "password": "pw"})
    port = cl.proxy_ports[0]
    # TLS + SCRAM: works
    c = tls_client(port, ca, username="alice", password="pw", authSource="admin")
    assert c.admin.command("ping")["ok"] == 1.0
    wait_until(lambda: c.adb.t.insert_one({"_id": 1, "big": "x" * 100000}), 20,
               what="write over TLS")
    assert c.adb.t.find_one({"_id": 1})["big"] == "x" * 100000
    c.close()
    # plaintext: the connection is closed, the driver never gets a hello answer
    p = plain_client(port)
    with pytest.raises(ServerSelectionTimeoutError):
        p.admin.command("ping")
    p.close()
    # a TLS client that does not trust the server's CA fails the handshake
    bad = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                              serverSelectionTimeoutMS=1500, tls=True)
    with pytest.raises(ServerSelectionTimeoutError):
        bad.admin.command("ping")
    bad.close()
    cl.close()


def test_tls_allowed_serves_both(start_role, tmp_path):
    ca, args = tls_args(tmp_path, "allowed")
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=args)
    port = cl.proxy_ports[0]
    t = tls_client(port, ca)
    wait_until(lambda: t.db.c.insert_one({"_id": 1}), 20, what="TLS write")
    p = plain_client(port)
    assert list(p.db.c.find({})) == [{"_id": 1}]
    t.close()
    p.close()
    cl.close()


def test_a_client_that_sends_close_notify_still_gets_its_reply(start_role, tmp_path):
    """A TLS client may send its request and then close its side with close_notify (TLS
    1.3's half-close, RFC 8446 6.1), as a plaintext client may shut down its write side:
    it still gets the whole reply, here several MB (far larger than the socket buffers), and
    then the close. The server closed at the close_notify: nothing came back."""
    ca, args = tls_args(tmp_path, "allowed")
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=args)
    port = cl.proxy_ports[0]
    c = tls_client(port, ca)
    c.t.big.insert_many([{"_id": i, "s": "x" * (1 << 20)} for i in range(14)])
    c.close()

    plain = tls_send_then_close_notify(port, ca, op_msg(7, {"find": "big", "batchSize": 100, "$db": "t"}))
    assert len(plain) >= 16, f"no reply after close_notify ({len(plain)} bytes)"
    length, _rid, response_to, _op = struct.unpack("<iiii", plain[:16])
    assert len(plain) == length, f"reply of {length} bytes cut at {len(plain)}"
    reply = bson.decode(plain[21:length])
    assert response_to == 7 and reply["ok"] == 1.0, reply.get("errmsg")
    ids = [d["_id"] for d in reply["cursor"]["firstBatch"]]  # the proxy cuts the batch
    assert ids == list(range(len(ids))) and length > 4 << 20, (ids, length)
    cl.close()


def test_tls_mode_without_certificate_is_a_usage_error(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=0)
    port = cl.add_proxy(["--tls-mode=required"], wait=False)
    proc = cl.proxy_procs[-1]
    assert proc.p.wait(timeout=20) != 0
    assert "--tls-mode=required needs --tls-cert and --tls-key" in proc.tail()
    assert port > 0
    cl.close()


def test_sighup_reloads_the_certificate(start_role, tmp_path):
    import shutil
    import signal
    ca1, args = tls_args(tmp_path, "required")
    d2 = tmp_path / "certs2"
    d2.mkdir()
    ca2, cert2, key2 = make_certs(d2)
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=args)
    port = cl.proxy_ports[0]
    c1 = tls_client(port, ca1)
    assert c1.admin.command("ping")["ok"] == 1.0
    c1.close()
    # new certificate and key from another CA in place, then SIGHUP
    shutil.copy(cert2, tmp_path / "certs" / "server.pem")
    shutil.copy(key2, tmp_path / "certs" / "server.key")
    proc = cl.proxy_procs[0]
    proc.signal(signal.SIGHUP)
    wait_until(lambda: "tls certificate reloaded" in proc.tail(100000), 20, what="reload")
    c2 = tls_client(port, ca2)
    assert c2.admin.command("ping")["ok"] == 1.0
    c2.close()
    old = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                              serverSelectionTimeoutMS=1500, tls=True, tlsCAFile=ca1)
    with pytest.raises(ServerSelectionTimeoutError):
        old.admin.command("ping")
    old.close()
    cl.close()


# ---- TLS between roles: shard and metadata listeners, mutual TLS, --tls-internal ----

def make_pki(d):
    """CA + a certificate for 127.0.0.1/localhost (server and client use: every role
    presents it), a combined cert+key PEM for pymongo, and a rogue CA with a client
    certificate the cluster must refuse."""
    ca, cert, key = make_certs(d)

    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue-ca.key", "-out",
        "rogue-ca.pem", "-days", "2", "-subj", "/CN=rogue-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.csr",
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "rogue.csr", "-CA", "rogue-ca.pem", "-CAkey", "rogue-ca.key",
        "-CAcreateserial", "-out", "rogue.pem", "-days", "2", "-extfile", "ext.cnf")
    for out, crt, k in (("client.pem", "server.pem", "server.key"),
                        ("rogue-client.pem", "rogue.pem", "rogue.key")):
        (d / out).write_text((d / crt).read_text() + (d / k).read_text())
    return {"ca": ca, "cert": cert, "key": key, "client": str(d / "client.pem"),
            "rogue": str(d / "rogue-client.pem")}


def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    return make_pki(d)


def mtls_args(p, mode="required", internal=False):
    a = [f"--tls-mode={mode}", f"--tls-cert={p['cert']}", f"--tls-key={p['key']}",
         f"--tls-ca={p['ca']}"]
    return a + (["--tls-internal=true"] if internal else [])


def mtls_client(port, p, cert="client", timeout=10000, **kw):
    opts = dict(directConnection=True, serverSelectionTimeoutMS=timeout, tls=True,
                tlsCAFile=p["ca"], retryWrites=False)
    if cert:
        opts["tlsCertificateKeyFile"] = p[cert]
    opts.update(kw)
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", **opts)


def refused(client):
    try:
        client.admin.command("ping")
    except ServerSelectionTimeoutError:
        return True
    finally:
        client.close()
    return False


def start_shard(start_role, tmp_path, args, name="shard"):
    port = free_port()
    d = tmp_path / name
    d.mkdir()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"] + args)
    return proc, port


def test_shard_tls_required_mutual(start_role, tmp_path):
    p = pki(tmp_path)
    _, port = start_shard(start_role, tmp_path, mtls_args(p))
    c = mtls_client(port, p)
    c.db.t.insert_one({"_id": 1, "v": "over mutual TLS"})
    assert c.db.t.find_one({"_id": 1}) == {"_id": 1, "v": "over mutual TLS"}
    c.close()
    # plaintext: closed by the shard
    assert refused(plain_client(port))
    # TLS without a client certificate: the shard requires one (--tls-ca on an internal
    # listener)
    assert refused(mtls_client(port, p, cert=None, timeout=1500))
    # a client certificate from another CA: the handshake fails
    assert refused(mtls_client(port, p, cert="rogue", timeout=1500))


def test_proxy_shard_metadata_coordinator_all_tls(start_role, tmp_path):
    """Every listener TLS-required with mutual TLS, every role --tls-internal: the proxy's
    metadata and shard pools, the member's own registration, the coordinator and its CDC
    publishers all connect with TLS and client certificates."""
    p = pki(tmp_path)
    tls = mtls_args(p, internal=True)
    mport, raft = free_port(), free_port()
    md = tmp_path / "meta"
    md.mkdir()
    meta = start_role(["--role=metadata", "--node-id=1", f"--data-dir={md}",
                       f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{raft}",
                       f"--bootstrap-members=1@127.0.0.1:{raft}",
                       "--raft-election-timeout-ms=300"] + tls)
    # the Raft port is mutual TLS too (issue #21): no plaintext warning
    assert "tls=mutual" in meta.tail(100000)
    assert "raft transport is plaintext" not in meta.tail(100000)
    assert refused(plain_client(mport))
    m = mtls_client(mport, p)
    wait_until(lambda: m.admin.command("hello").get("isWritablePrimary"), 30,
               what="metadata leader over TLS")
    # the member registers its own address through an internal (TLS) client
    wait_until(lambda: m.admin.command("hello")["hosts"] == [f"127.0.0.1:{mport}"], 30,
               what="member registered over internal TLS")
    sports = {}
    for sid in ("shard-a", "shard-b"):
        _, sports[sid] = start_shard(start_role, tmp_path, tls, name=sid)
        m.admin.command({"addShard": sid, "uri": f"mongodb://127.0.0.1:{sports[sid]}/"})
    m.admin.command({"createDatabase": "app"})
    m.admin.command({"shardCollection": "app.c", "key": {"k": 1},
                     "shards": ["shard-a", "shard-b"], "splitPoints": [{"k": 50}]})
    pport = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                f"--metadata=127.0.0.1:{mport}"] + tls)
    c = mtls_client(pport, p, cert=None)  # applications need no client certificate
    docs = [{"_id": i, "k": i} for i in range(100)]
    wait_until(lambda: c.app.c.insert_many(docs), 30, what="inserts through the proxy")
    assert sorted(d["_id"] for d in c.app.c.find({})) == list(range(100))
    assert c.app.c.find_one({"k": 7}) == {"_id": 7, "k": 7}
    # the documents really are on the TLS-only shards
    sa, sb = mtls_client(sports["shard-a"], p), mtls_client(sports["shard-b"], p)
    assert (sa.app.c.count_documents({}), sb.app.c.count_documents({})) == (50, 50)
    # a migration run by a TLS coordinator (bulk import, CDC replication, switch)
    start_role(["--role=coordinator", f"--metadata=127.0.0.1:{mport}",
                f"--cdc=embedded:{tmp_path / 'cdc'}", "--cdc-lease-ms=1500"] + tls)
    chunks = m.admin.command({"getRoutingTable": "app.c", "sinceVersion": 0})["chunks"]
    low = [ch for ch in chunks if ch["shard"] == "shard-a"][0]
    m.admin.command({"registerMigration": "mig-tls", "ns": "app.c", "chunk": low["id"],
                     "from": "shard-a", "to": "shard-b", "graceMS": 300})
    wait_until(lambda: m.admin.command({"getMigration": "mig-tls"})["migration"]["state"]
               in ("complete", "aborted", "rolled_back"), 60, what="migration over TLS")
    assert m.admin.command({"getMigration": "mig-tls"})["migration"]["state"] == "complete"
    assert sb.app.c.count_documents({}) == 100
    assert sorted(d["_id"] for d in c.app.c.find({})) == list(range(100))
    for cl in (c, sa, sb, m):
        cl.close()


def test_tls_internal_without_ca_is_a_usage_error(start_role, tmp_path):
    p = pki(tmp_path)
    port = free_port()
    proc = start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                       "--metadata=127.0.0.1:1", "--tls-internal=true",
                       f"--tls-cert={p['cert']}", f"--tls-key={p['key']}"], wait=False)
    assert proc.p.wait(timeout=20) == 2
    assert "--tls-internal needs --tls-ca" in proc.tail()


# ---- gRPC (rate limiter) over TLS ----

def grpc_tls_channel(addr, p, cert=True, ca=None):
    import grpc
    rd = lambda f: open(f, "rb").read()  # noqa: E731
    creds = grpc.ssl_channel_credentials(
        root_certificates=rd(ca or p["ca"]),
        private_key=rd(p["key"]) if cert else None,
        certificate_chain=rd(p["cert"]) if cert else None)
    return grpc.secure_channel(addr, creds)


def live(pb, channel, timeout=2):
    import grpc
    try:
        pb[1].V1Stub(channel).LiveCheck(pb[0].LiveCheckReq(), timeout=timeout)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()


def start_rl(start_role, args, gport, peers=None):
    from test_ratelimit_grpc import port_open
    a = ["--role=ratelimit", f"--grpc-listen=127.0.0.1:{gport}"] + args
    if peers:
        a.append(f"--peers={peers}")
    proc = start_role(a)
    wait_until(lambda: port_open(gport), what=f"gRPC port {gport}")
    return proc


def test_grpc_mutual_tls_and_tls_peers(start_role, tmp_path, pb):
    import grpc
    from test_ratelimit_grpc import req
    p = pki(tmp_path)
    ports = [free_port(), free_port()]
    peers = ",".join(f"127.0.0.1:{g}" for g in ports)
    for g in ports:
        start_rl(start_role, mtls_args(p, internal=True), g, peers)
    a, b = (f"127.0.0.1:{g}" for g in ports)
    wait_until(lambda: live(pb, grpc_tls_channel(a, p)), 20, what="LiveCheck over mutual TLS")
    # plaintext, TLS without a client certificate: refused
    assert not live(pb, grpc.insecure_channel(a))
    assert not live(pb, grpc_tls_channel(a, p, cert=False))
    # a key owned by the other node: forwarded over the TLS peer channel, one count
    ca, cb = grpc_tls_channel(a, p), grpc_tls_channel(b, p)
    va, vb = pb[1].V1Stub(ca), pb[1].V1Stub(cb)

    def get(stub, key):
        (r,) = stub.GetRateLimits(pb[0].GetRateLimitsReq(requests=[req(pb, key)]),
                                  timeout=10).responses
        return r
    keys = [f"tls-{i}" for i in range(20)]
    owners = {k: get(va, k) for k in keys}
    remote = [k for k, r in owners.items() if r.metadata["owner"] == b]
    assert remote, "no key owned by the second node among 20"
    k = remote[0]
    assert (owners[k].error, owners[k].remaining) == ("", 9)
    r = get(vb, k)
    assert (r.error, r.remaining, r.metadata["owner"]) == ("", 8, b)
    ca.close()
    cb.close()


def test_sighup_reloads_shard_and_grpc_certificates(start_role, tmp_path, pb):
    import shutil
    import signal
    p = pki(tmp_path)
    d2 = tmp_path / "certs2"
    d2.mkdir()
    ca2, cert2, key2 = make_certs(d2)
    args = ["--tls-mode=required", f"--tls-cert={p['cert']}", f"--tls-key={p['key']}"]
    gport = free_port()
    rl = start_rl(start_role, args, gport)
    addr = f"127.0.0.1:{gport}"
    shard, sport = start_shard(start_role, tmp_path, args)
    wait_until(lambda: live(pb, grpc_tls_channel(addr, p, cert=False)), 20, what="gRPC TLS")
    assert not refused(mtls_client(sport, p, cert=None))
    shutil.copy(cert2, p["cert"])
    shutil.copy(key2, p["key"])
    for proc in (rl, shard):
        proc.signal(signal.SIGHUP)
        wait_until(lambda proc=proc: "tls certificate reloaded" in proc.tail(100000), 20,
                   what="reload")
    # new connections are served with the new certificate (from the second CA)
    assert live(pb, grpc_tls_channel(addr, p, cert=False, ca=ca2))
    assert not live(pb, grpc_tls_channel(addr, p, cert=False))
    assert not refused(mtls_client(sport, p, cert=None, tlsCAFile=ca2))
    assert refused(mtls_client(sport, p, cert=None, timeout=1500))


# ---- HTTPS on the HTTP listener (--http-tls) ----

def test_http_tls_with_curl(start_role, tmp_path):
    p = pki(tmp_path)
    hport = free_port()
    proc = start_role(["--role=ratelimit", f"--http-listen=127.0.0.1:{hport}", "--http-tls",
                       f"--tls-cert={p['cert']}", f"--tls-key={p['key']}"], wait=False)
    wait_until(lambda: "http listening" in proc.tail(100000), 20, what="HTTP listener")
    if "tls=https" not in proc.tail(100000):
        pytest.skip("src/common/role.c does not start the HTTP listener with "
                    "sdb_http_acquire_cfg yet (--http-tls not wired)")

    def curl(*args):
        return subprocess.run(["curl", "-sS", "--max-time", "5"] + list(args),
                              capture_output=True, text=True)
    url = f"https://127.0.0.1:{hport}"
    r = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(
        curl("--cacert", p["ca"], f"{url}/healthz")), 20, what="/healthz over HTTPS")
    assert r.stdout.strip() == "ok"
    r = curl("--cacert", p["ca"], "-X", "POST", "-d", '{"requests": []}',
             f"{url}/v1/GetRateLimits")
    assert r.returncode == 0
    assert json.loads(r.stdout) == {"responses": []}
    # plaintext HTTP and an untrusting client both fail
    assert curl(f"http://127.0.0.1:{hport}/healthz").returncode != 0
    assert curl(f"{url}/healthz").returncode != 0
    # SIGHUP: new connections get the new certificate (from another CA)
    import shutil
    import signal
    d2 = tmp_path / "certs2"
    d2.mkdir()
    ca2, cert2, key2 = make_certs(d2)
    shutil.copy(cert2, p["cert"])
    shutil.copy(key2, p["key"])
    proc.signal(signal.SIGHUP)
    wait_until(lambda: "http: TLS certificate reloaded" in proc.tail(100000), 20,
               what="HTTPS reload")
    r = curl("--cacert", ca2, f"{url}/healthz")
    assert (r.returncode, r.stdout.strip()) == (0, "ok")
    assert curl("--cacert", p["ca"], f"{url}/healthz").returncode != 0


def test_metadata_raft_port_uses_mutual_tls(start_role, tmp_path):
    """With --tls-cert/--tls-key/--tls-ca the Raft port is mutual TLS (issue #21,
    raft/transport.h): the member logs it and no plaintext warning; with
    --raft-tls=disabled it warns once that the port is plaintext."""
    p = pki(tmp_path)
    for i, extra in enumerate(([], ["--raft-tls=disabled"])):
        md = tmp_path / f"meta{i}"
        md.mkdir()
        raft = free_port()
        proc = start_role(["--role=metadata", "--node-id=1", f"--data-dir={md}",
                           f"--listen=127.0.0.1:{free_port()}", f"--raft-listen=0.0.0.0:{raft}",
                           f"--bootstrap-members=1@127.0.0.1:{raft}"] + mtls_args(p) + extra)
        warn = "the raft transport is plaintext and unauthenticated"
        if extra:
            wait_until(lambda: warn in proc.tail(100000), 20, what="raft warning")
            assert proc.tail(100000).count(warn) == 1
            assert f"raft_listen=0.0.0.0:{raft}" in proc.tail(100000)
        else:
            wait_until(lambda: "raft: secure transport" in proc.tail(100000), 20,
                       what="raft tls")
            assert "tls=mutual" in proc.tail(100000)
            assert warn not in proc.tail(100000)
        proc.stop()


def test_ctl_over_internal_tls(start_role, tmp_path):
    """`stripedb ctl` reaches a TLS-only metadata member with STRIPEDB_TLS_INTERNAL,
    STRIPEDB_TLS_CA, STRIPEDB_TLS_CERT, STRIPEDB_TLS_KEY (auth_cluster_tls_setup_env)."""
    import os

    from conftest import BIN, SRCDIR
    with open(os.path.join(SRCDIR, "cli", "ctl.c")) as f:
        if "auth_cluster_tls_setup_env" not in f.read():
            pytest.skip("cli/ctl.c does not call auth_cluster_tls_setup_env yet")
    p = pki(tmp_path)
    mport, raft = free_port(), free_port()
    md = tmp_path / "meta"
    md.mkdir()
    start_role(["--role=metadata", "--node-id=1", f"--data-dir={md}",
                f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{raft}",
                f"--bootstrap-members=1@127.0.0.1:{raft}"] + mtls_args(p, internal=True))
    env = dict(os.environ, STRIPEDB_TLS_INTERNAL="true", STRIPEDB_TLS_CA=p["ca"],
               STRIPEDB_TLS_CERT=p["cert"], STRIPEDB_TLS_KEY=p["key"])

    def ctl(env, *args):
        return subprocess.run([BIN, "ctl", f"--metadata=127.0.0.1:{mport}", *args], env=env,
                              capture_output=True, text=True, timeout=60)
    r = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(ctl(env, "ping")),
                   30, what="ctl ping over TLS")
    assert r.stdout.split() == [f"127.0.0.1:{mport}", "leader"]
    plain = {k: v for k, v in env.items() if not k.startswith("STRIPEDB_TLS_")}
    assert ctl(plain, "ping").returncode == 1
    r = ctl(dict(plain, STRIPEDB_TLS_INTERNAL="true"), "ping")
    assert (r.returncode, r.stderr) == (2, "stripedb ctl: STRIPEDB_TLS_INTERNAL needs "
                                           "STRIPEDB_TLS_CA\n")


def test_failed_reload_keeps_the_internal_client_certificate(start_role, tmp_path):
    """SIGHUP with a broken --tls-cert keeps the client certificate internal connections
    use (the private cert+key copy is replaced only by a pair that loads and matches)."""
    import glob
    import shutil
    import signal
    p = pki(tmp_path)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    d = tmp_path / "shard"
    d.mkdir()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{free_port()}", f"--data-dir={d}",
                       "--tls-internal=true", f"--tls-ca={p['ca']}", f"--tls-cert={p['cert']}",
                       f"--tls-key={p['key']}"], env={"TMPDIR": str(tmpdir)})
    (copy,) = glob.glob(str(tmpdir / "stripedb-client-*.pem"))
    good = open(copy).read()
    assert "BEGIN CERTIFICATE" in good and "PRIVATE KEY" in good
    shutil.copy(p["cert"], tmp_path / "cert.bak")
    with open(p["cert"], "w") as f:
        f.write("garbage\n")
    proc.signal(signal.SIGHUP)
    wait_until(lambda: "TLS reload failed" in proc.tail(100000), 20, what="failed reload")
    assert "not a PEM certificate" in proc.tail(100000)
    assert glob.glob(str(tmpdir / "stripedb-client-*.pem")) == [copy]
    assert open(copy).read() == good
    # a good pair again: reloaded
    shutil.copy(tmp_path / "cert.bak", p["cert"])
    proc.signal(signal.SIGHUP)
    wait_until(lambda: "internal TLS client certificate reloaded" in proc.tail(100000), 20,
               what="reload")
    assert open(copy).read() == good
