"""Shared fixtures for the integration suite.

Every test starts its own `stripedb` processes on free loopback ports and stops them at
teardown, so tests never share state. The binary comes from $STRIPEDB_BIN (set by
`make check`); logs of each process go to a file in the test's tmp dir and are printed when
a test fails.

Set STRIPEDB_TEST_KEEP_LOGS=1 to keep the tmp dirs for debugging.
"""
import contextlib
import fcntl
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import bson
import pytest

BIN = os.environ.get("STRIPEDB_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "stripedb")
SRCDIR = os.environ.get("STRIPEDB_SRCDIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))

# The newest cluster op version of this binary (raft/migstate.h MIGSTATE_OP_VERSION_MAX,
# read from the header so the tests follow it): the one a new cluster's leader raises it
# to, and `stripedb dev up` sets.
with open(os.path.join(SRCDIR, "raft", "migstate.h")) as _f:
    OP_VERSION_MAX = int(re.search(r"#define MIGSTATE_OP_VERSION_MAX (\d+)", _f.read()).group(1))

# What src/wire/server.c logs for each request still running when a graceful stop's drain
# times out; start_role fails the test whose processes log it.
UNANSWERED = "wire: unanswered request at shutdown"
# What AddressSanitizer, LeakSanitizer and UBSan write when they report (the suite runs an
# --enable-sanitizers build: tests/all.sh; no stripedb log line says either). The one test
# of a log: start_role's teardown fails a test whose processes logged one, even if the test
# itself saw nothing wrong; assert_clean_exit and shard_net's down use it too.
SANITIZER_REPORT = re.compile(r"Sanitizer|runtime error")

# Roles quiesce for --shutdown-quiesce-ms (default 2000) on SIGTERM while clients stay
# connected; test teardowns stop hundreds of processes with clients still open, so every
# process a test starts drains at once unless the test passes the flag (test_rolling.py).
os.environ.setdefault("STRIPEDB_SHUTDOWN_QUIESCE_MS", "0")


# The Node.js clients (the MongoDB Node.js driver and mongosh), installed by
# `scripts/install-deps.sh --test` (npm ci) into tests/integration/node_modules. Without them
# their tests are skipped with the reason, unless STRIPEDB_REQUIRE_NODE_CLIENTS=1 (tests/all.sh,
# and so CI, sets it): then a missing or broken client fails its test instead.
NODE_MODULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_modules")
MONGOSH = os.path.join(NODE_MODULES, ".bin", "mongosh")
NODE_CLIENTS_REQUIRED = os.environ.get("STRIPEDB_REQUIRE_NODE_CLIENTS") == "1"


def node_clients_present(what):
    """Is the Node client `what` ("mongodb" for the driver, "mongosh") installed?"""
    import shutil
    if shutil.which("node") is None:
        return False
    if what == "mongosh":
        return os.path.exists(MONGOSH)
    return os.path.isdir(os.path.join(NODE_MODULES, what))


def needs_node_client(what):
    """Decorator for a test that runs the Node client `what` ("mongodb" or "mongosh"): marks it
    `node_clients` (tests/fresh/test-fresh-root.sh selects them with -m node_clients) and skips
    it when the client is absent, unless STRIPEDB_REQUIRE_NODE_CLIENTS=1."""
    def deco(f):
        f = pytest.mark.node_clients(f)
        if not NODE_CLIENTS_REQUIRED:
            f = pytest.mark.skipif(not node_clients_present(what),
                                   reason=f"Node.js client {what} absent: run "
                                   "`scripts/install-deps.sh --test`")(f)
        return f
    return deco


def node_env(**extra):
    """Environment for node and mongosh subprocesses: NODE_PATH to the pinned modules, no
    telemetry, a HOME for mongosh's config."""
    return dict(os.environ, NODE_PATH=NODE_MODULES, DO_NOT_TRACK="1",
                HOME=os.environ.get("HOME", "/tmp"), **extra)


def no_gossip(reply):
    """reply without the cluster-time fields every shard and proxy reply carries
    ($clusterTime, operationTime: issue #20's gossip), for comparing whole replies."""
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def _port_range():
    """The loopback ports this pytest process hands out: [lo, hi).

    All below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768+ on
    Debian), so no client's outgoing connection takes a port between free_port() and the
    server's bind. Under pytest-xdist (tests/integration/run.sh runs the suite with -n N) worker
    gwK gets its own slice of [10000, 22000), so two workers never hand out the same port
    (a worker knows only the ports it handed out itself); a run without xdist (the serial
    phase of run.sh, or one file run by hand) uses [22000, 32000), starting at an offset from
    its pid so that two such runs side by side rarely meet (the bind check below catches a
    port already in use). `stripedb dev up` (test_dev.py, test_demo.py) takes its ports at
    random from the same range (STRIPEDB_DEV_PORT_RANGE, set below), each checked free by a
    bind like these, and holds them bound until its processes start. On a machine whose ephemeral range starts lower than these
    ranges need, (0, 0, 0): free_port lets the kernel choose (bind to port 0)."""
    lo, hi = 22000, 32000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = min(hi, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        k = int(worker[2:])
        n = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), k + 1)
        span = (min(22000, hi) - 10000) // n
        if span < 100:
            return 0, 0, 0
        return 10000 + k * span, 10000 + (k + 1) * span, 0
    if hi - lo < 100:
        return 0, 0, 0
    return lo, hi, (os.getpid() * 7919) % (hi - lo)


_PORT_LO, _PORT_HI, _port_next = _port_range()
if _PORT_HI - _PORT_LO >= 100:
    # `stripedb dev up` (test_dev.py, test_demo.py) draws its ports from this process's range
    # too: at random below the ephemeral range it took ports of other workers' servers (a
    # module-scoped radosgw answered by a dev cluster's HTTP listener)
    os.environ["STRIPEDB_DEV_PORT_RANGE"] = f"{_PORT_LO}-{_PORT_HI}"


# Machine-wide reservations of the ports free_port hands out: an exclusive flock(2) on a file
# named after the port in this directory, held from free_port until the end of the test
# that asked (pytest_runtest_logfinish), by which time its servers have bound their ports
# or exited. The bind check in free_port sees only ports already bound, not one handed out
# by another pytest whose server has not bound it yet; two runs side by side (two sessions'
# `-n 2` runs: both have a worker gw0 with the same slice, both starting at its first port)
# handed out the same ports and one of the two servers exited with "address already in
# use". The kernel releases a lock when its process ends, so a killed run leaves none held.
_PORT_LOCK_DIR = os.environ.get("STRIPEDB_TEST_PORT_LOCK_DIR", "/tmp/stripedb-test-ports")
_port_locks = {}  # port -> fd holding its flock, in the order taken
# past this many (a script that imports this file: no test ends) the oldest go
_PORT_LOCKS_MAX = 512


def _reserve_port(port):
    """Take the machine-wide reservation of port (see _PORT_LOCK_DIR). Returns False when
    another process holds it."""
    if port in _port_locks:
        return True
    try:
        os.makedirs(_PORT_LOCK_DIR, mode=0o1777, exist_ok=True)
        fd = os.open(os.path.join(_PORT_LOCK_DIR, str(port)),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return True  # no lock directory: the bind check alone, as before
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _port_locks[port] = fd
    while len(_port_locks) > _PORT_LOCKS_MAX:
        os.close(_port_locks.pop(next(iter(_port_locks))))
    return True


def release_ports():
    """Give up the reservations of every port free_port handed out so far (closing the fd
    drops its flock). Called at the end of each test."""
    while _port_locks:
        os.close(_port_locks.popitem()[1])


def pytest_runtest_logfinish(nodeid, location):
    release_ports()


def free_port():
    """Return a loopback TCP port that is free now, not handed out recently by this process
    (see _port_range for which ports each process uses) and not reserved by another process
    (_reserve_port: it stays reserved for this one until the test ends). Ports are handed
    out in turn through the process's range, so none twice in a turn; after the whole range
    the turn starts again (the tests that had the first ones have ended long ago), still
    skipping any port that cannot be bound now."""
    global _port_next
    size = _PORT_HI - _PORT_LO
    if size == 0:  # no range below the ephemeral one (_port_range): the kernel's choice
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port
    for _ in range(size):
        port = _PORT_LO + _port_next
        _port_next = (_port_next + 1) % size
        if not _reserve_port(port):
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        return port
    raise RuntimeError(f"no free port in [{_PORT_LO}, {_PORT_HI})")


def listens_on(pid, port):
    """Does process pid hold the listening TCP socket of loopback port `port`? (Its
    /proc/PID/fd links against the socket inodes /proc/net/tcp and tcp6 list in state LISTEN
    on that port.) True when /proc cannot tell (not Linux, no permission)."""
    inodes = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{cols[9]}]")
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def alive(pid):
    """Is pid a live process of $STRIPEDB_BIN (not a reused pid of something else)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(BIN)
    except OSError:
        return False


def vm_rss_kb(pid):
    """Resident set size of process pid in KiB (/proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def wait_until(cond, timeout=20.0, interval=0.02, what="condition"):
    """Poll cond() until it returns a truthy value or timeout (s) passes; return the value."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - polled conditions may raise until ready
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                       + (f": last error {last_exc!r}" if last_exc else ""))


def http_get(port, path, timeout=5.0):
    """GET http://127.0.0.1:port/path; return (status, body bytes)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@contextlib.contextmanager
def threads_running(stop, target, args_list, join_timeout=60):
    """Run target(*args) on a thread for each args of args_list during the with block (it
    yields the threads); at its end, error or not, set stop (the threading.Event the
    targets poll) and join them (join_timeout s each)."""
    threads = [threading.Thread(target=target, args=tuple(a)) for a in args_list]
    for t in threads:
        t.start()
    try:
        yield threads
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=join_timeout)


def point_reads(stop, port, db, coll, n_ids, k, stride=1, through_faults=False):
    """Point reads by _id on one connection to 127.0.0.1:port (directConnection) until
    stop (a threading.Event) is set: _id (k * stride + n) % n_ids for n = 0, 1, ...; a
    threads_running target for readers that only keep a shard's loop reading.
    through_faults: the member may be stopped, killed or not serving yet; a read that
    fails (connection lost, refused, timed out, or a server error) is skipped after 50 ms
    and the next one goes (short selection and socket timeouts)."""
    import pymongo
    from pymongo.errors import ConnectionFailure, OperationFailure
    opts = dict(serverSelectionTimeoutMS=1000, socketTimeoutMS=5000) if through_faults else {}
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                             maxPoolSize=1, **opts) as c:
        target = c[db][coll]
        n = 0
        while not stop.is_set():
            try:
                target.find_one({"_id": (k * stride + n) % n_ids})
            except (ConnectionFailure, OperationFailure):
                if not through_faults:
                    raise
                stop.wait(0.05)
            n += 1


def metric_counter(proc, name):
    """The value (an int) of the first sample of /metrics counter name of a role started
    with an HTTP port (proc.http_port), labels or not; 0 when it has none."""
    st, body = http_get(proc.http_port, "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def op_msg(request_id, body, flags=0):
    """One OP_MSG message (bytes): flagBits, then body (a dict) as its kind-0 section.
    Wire protocol: https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/"""
    payload = struct.pack("<I", flags) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def bson_element(key, value):
    """The bytes of one BSON element key: value (libbson's encoding, through pymongo)."""
    doc = bson.encode({key: value})
    return doc[4:-1]


def raw_doc(pairs):
    """A BSON document of (key, value) pairs in order, repeats kept (a dict cannot hold
    them)."""
    body = b"".join(bson_element(k, v) for k, v in pairs)
    return struct.pack("<i", 4 + len(body) + 1) + body + b"\x00"


def raw_msg(request_id, body, seqs=()):
    """An OP_MSG of a body (raw BSON bytes) and kind-1 sections seqs: (identifier, [dict])
    pairs, each before the body (a driver's order)."""
    payload = struct.pack("<I", 0)
    for ident, docs in seqs:
        data = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        payload += b"\x01" + struct.pack("<i", 4 + len(data)) + data
    payload += b"\x00" + body
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def tls_send_then_close_notify(port, ca, payload):
    """A TLS client through memory BIOs (Python's ssl): connect to port (a 64 KiB receive
    window, so large replies wait on the client), handshake (ca verifies the server),
    write payload and the close_notify in one go (TLS 1.3's half-close, RFC 8446 6.1,
    the TLS form of shutdown(SHUT_WR)), then read until the server closes. Returns the
    plaintext the server sent (bytes)."""
    import ssl
    raw = socket.create_connection(("127.0.0.1", port), timeout=60)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context(cafile=ca).wrap_bio(inc, out, server_hostname="127.0.0.1")

    def flush():
        data = out.read()
        if data:
            raw.sendall(data)

    def fill():
        data = raw.recv(1 << 16)
        if data:
            inc.write(data)
        else:
            inc.write_eof()
        return bool(data)

    with raw:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                flush()
                assert fill(), "closed during the handshake"
        flush()
        tls.write(payload)
        try:
            tls.unwrap()  # queues close_notify, sent with the payload
        except ssl.SSLWantReadError:
            pass
        flush()
        plain = b""
        while True:  # until the server's close (its close_notify or EOF)
            try:
                chunk = tls.read(1 << 20)
            except ssl.SSLWantReadError:
                if not fill():
                    break
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            if not chunk:
                break
            plain += chunk
    return plain


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "the server closed the connection"
        buf += chunk
    return buf


def assert_clean_exit(proc, timeout=20.0):
    """proc survived and stops gracefully: exit 0 and no sanitizer report in its log.

    Under the ASan+UBSan build a leak is reported by LeakSanitizer at exit (exit code 23
    with detect_leaks=1, the default on Linux) and undefined behaviour aborts the process,
    so a test that ends with this fails on either."""
    assert proc.p.poll() is None, f"exited early with {proc.p.returncode}: {proc.tail()}"
    code = proc.stop(timeout=timeout)
    log = proc.tail(1 << 20)
    assert not SANITIZER_REPORT.search(log), log[-6000:]
    assert code == 0, f"exit code {code}: {log[-4000:]}"


class Proc:
    """One running stripedb process."""

    def __init__(self, args, log_path, http_port=None, env=None):
        self.args = args
        self.log_path = log_path
        self.http_port = http_port
        self.env = env
        self.p = None
        self.start()

    def start(self):
        self.log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("STRIPEDB_CONFIG", "/dev/null")
        if self.env:
            env.update(self.env)
        self.p = subprocess.Popen([BIN] + self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True)

    def wait_healthy(self, timeout=30.0):
        assert self.http_port is not None
        def ok():
            # an exit ends the wait (wait_until would take an exception raised here for
            # "not yet" and poll on for the whole timeout)
            if self.p.poll() is not None:
                return True
            st, _ = http_get(self.http_port, "/healthz", timeout=1.0)
            # and from this process: another one on the port (a port race with another run)
            # answered 200 while this one, which could not bind it, was still exiting
            return st == 200 and listens_on(self.p.pid, self.http_port)
        wait_until(ok, timeout, what=f"/healthz of {' '.join(self.args)}")
        if self.p.poll() is not None:
            raise RuntimeError(f"stripedb {' '.join(self.args)} exited with "
                               f"{self.p.returncode}: {self.tail()}")
        return self

    def tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
            return data[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def signal(self, sig):
        if self.p and self.p.poll() is None:
            self.p.send_signal(sig)

    def pause(self, timeout=20.0):
        """SIGSTOP the process and return once every one of its threads is stopped.

        kill(2) returns before the process stops: the kernel wakes one thread to take the
        SIGSTOP, and only when that thread runs does it tell the others to stop. On a loaded
        machine that takes milliseconds, in which the other threads go on: a member "stopped"
        that way once still stored and acknowledged a write sent after the kill, so a w: 3
        write was rightly acknowledged and a test expecting a writeConcernError failed.
        Read /proc/PID/task/*/stat until each thread is in state T (stopped)."""
        assert self.p is not None and self.p.poll() is None, "pause() of a process that exited"
        self.p.send_signal(signal.SIGSTOP)
        task_dir = f"/proc/{self.p.pid}/task"

        def stopped():
            for tid in os.listdir(task_dir):
                try:
                    with open(f"{task_dir}/{tid}/stat") as f:
                        # the command name in parentheses may hold spaces: split after it
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (FileNotFoundError, ProcessLookupError):
                    continue  # a thread that ended
                if state not in ("T", "t"):
                    return False
            return True

        wait_until(stopped, timeout, interval=0.001, what=f"every thread of {self.p.pid} stopped")

    def kill(self):
        """SIGKILL and reap."""
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)
        self.log.close()

    def stop(self, timeout=15.0):
        """SIGTERM, wait for a graceful exit; return the exit code (SIGKILL after timeout)."""
        if self.p is None:
            return None
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self.log.close()
        return self.p.returncode

    def restart(self):
        self.start()
        return self


@pytest.fixture
def start_role(tmp_path, request):
    """start_role(args, http=True, env=None, wait=True) -> Proc.

    Starts `stripedb ARGS...`; when http is True adds --http-listen on a free port (unless
    ARGS has one) and waits for /healthz to answer 200. Every process is stopped at teardown;
    on test failure the last lines of each log are printed.
    """
    procs = []
    counter = [0]

    def _start(args, http=True, env=None, wait=True):
        args = list(args)
        http_port = None
        if http:
            for a in args:
                if a.startswith("--http-listen="):
                    http_port = int(a.rsplit(":", 1)[1])
            if http_port is None:
                http_port = free_port()
                args.append(f"--http-listen=127.0.0.1:{http_port}")
        counter[0] += 1
        proc = Proc(args, str(tmp_path / f"proc{counter[0]}.log"), http_port, env)
        procs.append(proc)
        if http and wait:
            proc.wait_healthy()
        return proc

    yield _start
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    unanswered = []
    crashed = []
    for p in procs:
        if failed:
            print(f"\n--- log of {' '.join(p.args)} ---\n{p.tail()}")
        # 16 s: longer than a graceful stop may take (--shutdown-timeout-ms, 10 s, then
        # the role's watchdog exits 5 s later), so the "unanswered request" lines of a
        # stop that timed out are always written before a SIGKILL. A request merely slow
        # (a proxy's write to a cut-off primary, inside wire_req_wait_begin) is logged as
        # "request waiting at shutdown" instead and does not fail the test.
        p.stop(timeout=16)
        log = p.tail(1 << 20)
        unanswered += [line for line in log.splitlines() if UNANSWERED in line]
        m = SANITIZER_REPORT.search(log)
        if m:
            # a crash, an undefined behaviour or a leak of a process the test started, at
            # any point of its life (a restarted process appends to the same log): the
            # test's own checks may all have passed without seeing it
            crashed.append(f"--- {' '.join(p.args)} ---\n{log[max(0, m.start() - 2000):][:8000]}")
    if unanswered and not failed:
        # a handler that never replied held the graceful stop until it timed out
        pytest.fail("requests left unanswered at shutdown:\n" + "\n".join(unanswered))
    if crashed and not failed:
        pytest.fail("a sanitizer reported on a process this test started:\n" + "\n".join(crashed))


def pytest_configure(config):
    """The per-test timeout (pytest.ini `timeout`) is pytest-timeout's: without the plugin
    pytest ignores it and a request that is never answered hangs the suite, so refuse to
    run without it (scripts/install-deps.sh --test installs python3-pytest-timeout)."""
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError("pytest-timeout is not installed (python3-pytest-timeout): "
                                "the suite's per-test timeout would be ignored")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def shard(start_role, tmp_path):
    """A running embedded shard: returns (proc, wire_port)."""
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    return p, port


def start_one_member_set(start_role, data_dir, set_name="rs-spec", extra=()):
    """Start a shard as the only member of replica set set_name (its hello reports setName,
    as a 1-member MongoDB replica set does) with data in data_dir (made here), plus extra
    arguments (e.g. --enable-test-commands); wait until it is the writable primary.
    Returns (proc, wire_port)."""
    import pymongo
    wire, raft = free_port(), free_port()
    os.makedirs(data_dir, exist_ok=True)
    p = start_role(["--role=shard", f"--replica-set={set_name}", "--node-id=1",
                    f"--listen=127.0.0.1:{wire}", f"--data-dir={data_dir}",
                    f"--raft-listen=127.0.0.1:{raft}",
                    f"--bootstrap-members=1@127.0.0.1:{raft}", "--raft-tls=disabled",
                    "--raft-election-timeout-ms=300"] + list(extra))
    uri = f"mongodb://127.0.0.1:{wire}/?directConnection=true"

    def primary():
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=2000) as c:
            return c.admin.command("hello").get("isWritablePrimary")
    wait_until(primary, 30, interval=0.05, what="the one-member set to elect its primary")
    return p, wire
