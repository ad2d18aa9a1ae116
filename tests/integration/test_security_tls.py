"""TLS on the proxy's client listener (issue #10): --tls-mode=required serves TLS clients
and refuses plaintext ones; allowed serves both; authentication works over TLS."""
import subprocess

import pymongo
import pytest
from pymongo.errors import ServerSelectionTimeoutError

from conftest import wait_until
from proxy_helpers import ProxyCluster


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
