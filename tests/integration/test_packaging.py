"""Packaging (issue #11): what the systemd unit relies on, and the package builds.

Always run (seconds):
  - test_notify_under_unit_sandbox: every role in one process, started the way
    stripedb@.service starts it: NOTIFY_SOCKET set (Type=notify, NotifyAccess=main), and the
    kernel restrictions behind MemoryDenyWriteExecute=yes and NoNewPrivileges=yes applied
    with prctl (PR_SET_MDWE, PR_SET_NO_NEW_PRIVS). READY=1 must come from the main pid
    once every listener accepts connections; every role must then serve (SQLite, PCRE2
    $regex, libuv, gRPC core, libmicrohttpd, libraft); SIGHUP (ExecReload) must leave it
    serving; SIGTERM must bring STOPPING=1 and exit status 0.

Only with STRIPEDB_PACKAGING_TESTS=1 (minutes each; need root, debhelper, rpm, lintian,
debootstrap and the Debian mirror): tests/packaging/test-deb.sh and test-rpm.sh.
The docs/config/unit consistency checks are tests/packaging/check-files.sh (make check).
"""
import ctypes
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import BIN, SRCDIR, free_port, http_get, wait_until

PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1

PACKAGING = os.environ.get("STRIPEDB_PACKAGING_TESTS") == "1"
SKIP_REASON = ("package builds and debootstrap take minutes and need root and the Debian "
               "mirror: set STRIPEDB_PACKAGING_TESTS=1 to run them")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _sandbox():
    """preexec_fn: the restrictions of MemoryDenyWriteExecute=yes and NoNewPrivileges=yes."""
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")


def _mdwe_supported():
    probe = ("import ctypes,mmap\n"
             "libc=ctypes.CDLL(None,use_errno=True)\n"
             f"assert libc.prctl({PR_SET_MDWE},{PR_MDWE_REFUSE_EXEC_GAIN},0,0,0)==0\n"
             "try:\n"
             "  mmap.mmap(-1,4096,prot=mmap.PROT_READ|mmap.PROT_WRITE|mmap.PROT_EXEC)\n"
             "  print('wx allowed')\n"
             "except OSError:\n"
             "  print('wx refused')\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and r.stdout.strip() == "wx refused"


class Notify:
    """A NOTIFY_SOCKET as systemd provides it: AF_UNIX datagrams with sender credentials."""

    def __init__(self, path):
        self.path = path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(path)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (pid, {key: value})

    def wait_for(self, key, value, timeout):
        deadline = time.monotonic() + timeout
        while True:
            for pid, kv in self.messages:
                if kv.get(key) == value:
                    return pid, kv
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {key}={value} in {self.messages}")
            self.s.settimeout(left)
            try:
                data, anc, _, _ = self.s.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS:
                    pid, _, _ = struct.unpack("iII", cdata[:12])
            kv = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((pid, kv))

    def close(self):
        self.s.close()


def _accepts(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True


def test_notify_under_unit_sandbox(tmp_path):
    if not os.path.exists(BIN):
        pytest.skip(f"no stripedb binary at {BIN}")
    if not _mdwe_supported():
        pytest.skip("the kernel has no PR_SET_MDWE (Linux >= 6.3): cannot apply "
                    "MemoryDenyWriteExecute without systemd")
    pymongo = pytest.importorskip("pymongo")
    grpc = pytest.importorskip("grpc")

    p = {k: free_port() for k in ("meta", "raft", "meta_http", "shard", "shard_http", "proxy",
                                   "proxy_http", "rl_http", "rl_grpc", "co_http")}
    (tmp_path / "meta").mkdir()
    args = [BIN,
            "--role=metadata", "--node-id=1", f"--data-dir={tmp_path / 'meta'}",
            f"--listen=127.0.0.1:{p['meta']}", f"--raft-listen=127.0.0.1:{p['raft']}",
            f"--bootstrap-members=1@127.0.0.1:{p['raft']}",
            f"--http-listen=127.0.0.1:{p['meta_http']}", "--raft-election-timeout-ms=300",
            "--role=shard", f"--data-dir={tmp_path / 'shard'}", f"--listen=127.0.0.1:{p['shard']}",
            f"--http-listen=127.0.0.1:{p['shard_http']}",
            "--role=proxy", f"--listen=127.0.0.1:{p['proxy']}",
            f"--http-listen=127.0.0.1:{p['proxy_http']}", f"--metadata=127.0.0.1:{p['meta']}",
            "--role=ratelimit", f"--http-listen=127.0.0.1:{p['rl_http']}",
            f"--grpc-listen=127.0.0.1:{p['rl_grpc']}",
            "--role=coordinator", f"--http-listen=127.0.0.1:{p['co_http']}",
            f"--metadata=127.0.0.1:{p['meta']}", f"--cdc=embedded:{tmp_path / 'cdc'}",
            f"--archive=file:{tmp_path / 'archive'}"]
    notify = Notify(str(tmp_path / "notify.sock"))
    # The caller's environment (ASAN_OPTIONS...) without STRIPEDB_* settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIPEDB_")}
    env.update({"STRIPEDB_CONFIG": "/dev/null", "NOTIFY_SOCKET": notify.path})
    log = open(tmp_path / "stripedb.log", "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=_sandbox)
    clients = []
    try:
        pid, ready = notify.wait_for("READY", "1", timeout=60)
        # NotifyAccess=main: the message must come from the main process.
        assert pid == proc.pid
        assert ready.get("MAINPID") == str(proc.pid)
        # READY=1 promises that every listener is up: no polling here.
        for k in ("meta", "raft", "meta_http", "shard", "shard_http", "proxy", "proxy_http",
                  "rl_http", "rl_grpc", "co_http"):
            assert _accepts(p[k]) is True, k
        # Healthy is more than listening (the proxy waits for routing from metadata).
        for k in ("meta_http", "shard_http", "proxy_http", "rl_http", "co_http"):
            wait_until(lambda: http_get(p[k], "/healthz")[0] == 200, 30, what=f"{k} /healthz")

        # shard: SQLite storage and a PCRE2 $regex
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{p['shard']}/", directConnection=True,
                                serverSelectionTimeoutMS=10000)
        clients.append(c)
        c.pkg.t.insert_many([{"_id": i, "name": f"name-{i}"} for i in range(10)])
        assert [d["_id"] for d in c.pkg.t.find({"name": {"$regex": "^name-[2-4]$"}}).sort("_id", 1)] == [2, 3, 4]

        # metadata: the single member elects itself (libraft, libuv)
        m = pymongo.MongoClient(f"mongodb://127.0.0.1:{p['meta']}/", directConnection=True,
                                serverSelectionTimeoutMS=10000)
        clients.append(m)
        wait_until(lambda: m.admin.command("hello").get("isWritablePrimary") is True, 30,
                   what="metadata leader")

        # proxy: answers as a mongos
        px = pymongo.MongoClient(f"mongodb://127.0.0.1:{p['proxy']}/", directConnection=True,
                                 serverSelectionTimeoutMS=10000)
        clients.append(px)
        assert px.admin.command("hello")["msg"] == "isdbgrid"

        # ratelimit: HTTP/JSON (libmicrohttpd) and gRPC (gRPC core)
        body = json.dumps({"requests": [{"name": "pkg", "unique_key": "k", "hits": 1,
                                         "limit": 5, "duration": 60000}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{p['rl_http']}/v1/GetRateLimits",
                                     data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            resp = json.loads(r.read())
        assert int(resp["responses"][0]["remaining"]) == 4
        with grpc.insecure_channel(f"127.0.0.1:{p['rl_grpc']}") as ch:
            health = ch.unary_unary("/pb.gubernator.V1/HealthCheck")(b"", timeout=10)
        # HealthCheckResp field 1 (status), a string: tag 0x0a, length, "healthy"
        assert health[0] == 0x0A and health[2:2 + health[1]] == b"healthy"

        # ExecReload sends SIGHUP (TLS reload): the process must keep serving.
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: b"SIGHUP received" in (tmp_path / "stripedb.log").read_bytes(), 30,
                   what="SIGHUP handled")
        assert proc.poll() is None
        assert c.pkg.t.count_documents({}) == 10
        for c in clients:
            c.close()
        proc.send_signal(signal.SIGTERM)
        pid, _ = notify.wait_for("STOPPING", "1", timeout=30)
        assert pid == proc.pid
        assert proc.wait(timeout=30) == 0
    except BaseException:
        log.flush()
        print((tmp_path / "stripedb.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        notify.close()


def _run_script(name, timeout):
    script = os.path.join(SRCDIR, "tests", "packaging", name)
    r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=timeout)
    print(r.stdout[-20000:])
    print(r.stderr[-5000:])
    return r


# serial: builds the package from a tarball on every core (dpkg-buildpackage parallel=nproc,
# rpmbuild), then debootstrap and apt-get in a chroot: minutes of full CPU and disk that would
# slow every test beside it past its bounds.
@pytest.mark.serial
@pytest.mark.skipif(not PACKAGING, reason=SKIP_REASON)
@pytest.mark.timeout(3700)  # the script's own bound (3600 s: debootstrap from the mirror)
def test_deb_in_fresh_debian_root():
    if os.geteuid() != 0:
        pytest.skip("test-deb.sh needs root (debootstrap, chroot)")
    r = _run_script("test-deb.sh", timeout=3600)
    assert r.returncode == 0
    assert "test-deb: PASS" in r.stdout


# serial: builds the package from a tarball on every core (dpkg-buildpackage parallel=nproc,
# rpmbuild), then debootstrap and apt-get in a chroot: minutes of full CPU and disk that would
# slow every test beside it past its bounds.
@pytest.mark.serial
@pytest.mark.skipif(not PACKAGING, reason=SKIP_REASON)
@pytest.mark.timeout(3700)  # the script's own bound
def test_rpm_same_files_as_deb():
    r = _run_script("test-rpm.sh", timeout=3600)
    assert r.returncode == 0
    assert "test-rpm: PASS" in r.stdout
