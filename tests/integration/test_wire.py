"""The shared MongoDB wire protocol server (src/wire, issue #2) against real clients.

Runs against `stripedb --role=shard`. While the shard role is not built yet (it fails to
start with "not implemented yet"), the same tests run against tests/integration/
wire_test_server, a stand-alone program serving only src/wire's shared commands; the
skipped-role case is reported in the test's output, never silently.

Bad input (truncated, wrong length, 50 MB, garbage, OP_COMPRESSED) must get the connection
closed or a clear error, while a second pymongo client on the same process keeps working.
The Node.js driver and mongosh checks need `scripts/install-deps.sh --test` (CI runs it).
"""
import contextlib
import json
import os
import random
import signal
import socket
import ssl
import struct
import subprocess

import bson
import pymongo
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_security_tls import tls_args
from conftest import (BIN, MONGOSH, assert_clean_exit, free_port, no_gossip, http_get,
                      tls_send_then_close_notify,
                      needs_node_client, node_env, op_msg, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_SERVER = os.path.join(os.path.dirname(os.path.abspath(BIN)), "tests", "integration",
                           "wire_test_server")

OP_MSG = 2013
OP_COMPRESSED = 2012


class WireServer:
    def __init__(self, port, http_port, role, proc=None):
        self.port = port
        self.http_port = http_port
        self.role = role
        self.proc = proc

    def client(self, **kw):
        return pymongo.MongoClient("127.0.0.1", self.port, directConnection=True,
                                   serverSelectionTimeoutMS=10000, **kw)


def _can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def wire(start_role, tmp_path):
    """A process serving the wire protocol: the shard role, or the stand-alone test server
    while the shard role is not implemented."""
    port, http_port = free_port(), free_port()
    data = tmp_path / "shard"
    data.mkdir()
    try:
        if os.environ.get("STRIPEDB_WIRE_TEST_SERVER_ONLY") == "1":
            raise RuntimeError("not implemented yet (STRIPEDB_WIRE_TEST_SERVER_ONLY=1)")
        start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}",
                    f"--http-listen=127.0.0.1:{http_port}"])
        # /healthz may answer before the role's listener is up
        wait_until(lambda: _can_connect(port), what=f"wire port {port}")
        yield WireServer(port, http_port, "shard")
        return
    except RuntimeError as e:
        if "not implemented yet" not in str(e):
            raise
        print(f"shard role not built yet; using {TEST_SERVER}")
    assert os.access(TEST_SERVER, os.X_OK), f"{TEST_SERVER} not built (make check builds it)"
    port, http_port = free_port(), free_port()
    log = open(tmp_path / "wire_test_server.log", "wb")
    p = subprocess.Popen([TEST_SERVER, f"--listen=127.0.0.1:{port}",
                          f"--http-listen=127.0.0.1:{http_port}"],
                         stdout=subprocess.PIPE, stderr=log)
    try:
        line = p.stdout.readline().decode()
        assert line == f"port={port}\n", line
        wait_until(lambda: http_get(http_port, "/healthz", timeout=1.0)[0] == 200,
                   what="wire_test_server /healthz")
        yield WireServer(port, http_port, "wiretest", p)
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=20)
        log.close()
        # graceful close drained and the loop closed with no handle left
        assert rc == 0, (tmp_path / "wire_test_server.log").read_text()


# ---- raw protocol helpers ----

def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_reply(s):
    """One OP_MSG reply -> (responseTo, body dict), or None when the server closed."""
    hdr = recv_exact(s, 16)
    if hdr is None:
        return None
    length, _rid, response_to, opcode = struct.unpack("<iiii", hdr)
    rest = recv_exact(s, length - 16)
    assert rest is not None
    assert opcode == OP_MSG
    flags, kind = struct.unpack("<IB", rest[:5])
    assert kind == 0
    return response_to, bson.decode(rest[5:])


def closed_by_server(s):
    """True when the server closed the connection (EOF or reset)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def raw(wire):
    s = socket.create_connection(("127.0.0.1", wire.port), timeout=20)
    return s


# ---- tests ----

def test_ping_hello_buildinfo_unknown(wire):
    c = wire.client()
    try:
        assert no_gossip(c.admin.command("ping")) == {"ok": 1.0}
        h = c.admin.command("hello")
        assert h["ok"] == 1.0
        assert h["isWritablePrimary"] is True
        assert h["helloOk"] is True
        assert h["maxWireVersion"] == 17
        assert h["minWireVersion"] == 0
        assert h["maxBsonObjectSize"] == 16 * 1024 * 1024
        assert h["maxMessageSizeBytes"] == 48000000
        assert h["maxWriteBatchSize"] == 100000
        assert h["logicalSessionTimeoutMinutes"] == 30
        assert h["readOnly"] is False
        assert h["topologyVersion"]["counter"] == 0
        assert isinstance(h["topologyVersion"]["processId"], bson.ObjectId)
        assert "msg" not in h  # not a mongos
        legacy = c.admin.command("isMaster")
        assert legacy["ismaster"] is True
        bi = c.admin.command("buildInfo")
        assert bi["version"].startswith("6.0.0-stripedb-")
        assert bi["versionArray"] == [6, 0, 0, 0]
        assert c.admin.command("getParameter", 1, featureCompatibilityVersion=1)[
            "featureCompatibilityVersion"] == {"version": "6.0"}
        assert c.admin.command("getLog", "startupWarnings")["log"] == []
        you = c.admin.command("whatsmyuri")["you"]
        assert you.startswith("127.0.0.1:")
        assert c.admin.command("connectionStatus")["authInfo"] == {
            "authenticatedUsers": [], "authenticatedUserRoles": []}
        with pytest.raises(pymongo.errors.OperationFailure) as ei:
            c.admin.command("noSuchCommandX")
        assert ei.value.code == 59
        assert ei.value.details["errmsg"] == "no such command: 'noSuchCommandX'"
        assert ei.value.details["codeName"] == "CommandNotFound"
    finally:
        c.close()


def test_missing_db_is_bad_value(wire):
    with raw(wire) as s:
        s.sendall(op_msg(41, {"ping": 1}))
        rto, body = recv_reply(s)
        assert rto == 41
        assert no_gossip(body) == {"ok": 0.0,
                                   "errmsg": "OP_MSG requests require a $db argument",
                                   "code": 2, "codeName": "BadValue"}


def _send_50mb(s):
    """Send a 50,000,000-byte OP_MSG; the server closes after reading the length."""
    total = 50_000_000
    hdr = struct.pack("<iiii", total, 1, 0, OP_MSG)
    try:
        s.sendall(hdr)
        chunk = b"\x00" * (1 << 20)
        sent = 16
        while sent < total:
            n = min(len(chunk), total - sent)
            s.sendall(chunk[:n])
            sent += n
    except (BrokenPipeError, ConnectionResetError):
        pass


def _big_body_msg(request_id, nbytes):
    """OP_MSG whose body is a {insert: "c", $db: "test", blob: <nbytes of binary>}."""
    blob = b"\x05blob\x00" + struct.pack("<i", nbytes) + b"\x00" + b"\x00" * nbytes
    fields = (b"\x02insert\x00" + struct.pack("<i", 2) + b"c\x00"
              + b"\x02$db\x00" + struct.pack("<i", 5) + b"test\x00" + blob)
    doc = struct.pack("<i", 4 + len(fields) + 1) + fields + b"\x00"
    payload = struct.pack("<I", 0) + b"\x00" + doc
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_MSG) + payload


def _deep_scope_msg(request_id, depth):
    """OP_MSG {find: "c", $db: "test", filter: {x: CodeWScope("x", {a: {a: ... {}}})}}
    whose scope nests `depth` levels (8 bytes a level)."""
    doc = b"\x05\x00\x00\x00\x00"
    for _ in range(depth):
        doc = struct.pack("<i", len(doc) + 8) + b"\x03a\x00" + doc + b"\x00"
    cws = struct.pack("<i", 2) + b"x\x00" + doc
    cws = struct.pack("<i", len(cws) + 4) + cws
    filt = b"\x0fx\x00" + cws
    filt = struct.pack("<i", len(filt) + 5) + filt + b"\x00"
    fields = (b"\x02find\x00" + struct.pack("<i", 2) + b"c\x00"
              + b"\x02$db\x00" + struct.pack("<i", 5) + b"test\x00" + b"\x03filter\x00" + filt)
    body = struct.pack("<i", len(fields) + 5) + fields + b"\x00"
    payload = struct.pack("<I", 0) + b"\x00" + body
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_MSG) + payload


def _bad_key_msg(request_id):
    """OP_MSG {ping: 1, $db: "admin", "a\\xff": 1}: a field name that is not UTF-8."""
    fields = (b"\x10ping\x00" + struct.pack("<i", 1) + b"\x02$db\x00" + struct.pack("<i", 6)
              + b"admin\x00" + b"\x10a\xff\x00" + struct.pack("<i", 1))
    body = struct.pack("<i", len(fields) + 5) + fields + b"\x00"
    payload = struct.pack("<I", 0) + b"\x00" + body
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_MSG) + payload


BAD_INPUTS = {
    # framing is valid (17 MiB < 48 MB) but the body is over maxBsonObjectSize
    "body_over_16MiB": (lambda s: s.sendall(_big_body_msg(6, 17 * 1024 * 1024)),
                        ("error", 6, 10334)),
    # a 150-byte message of which 50 bytes arrive, then the peer stops sending: the server
    # must not answer a partial message; it closes when the peer shuts its side down
    "truncated": (lambda s: (s.sendall(op_msg(1, {"ping": 1, "$db": "admin",
                                                  "pad": "x" * 100})[:50]),
                             s.shutdown(socket.SHUT_WR)), "closed"),
    "length_below_header": (lambda s: s.sendall(struct.pack("<i", 5) + b"x" * 12), "closed"),
    "length_negative": (lambda s: s.sendall(struct.pack("<i", -20) + b"x" * 12), "closed"),
    "length_50MB": (_send_50mb, "closed"),
    "garbage": (lambda s: s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "closed"),
    # valid framing, body document length pointing past the message: a clear error
    "length_inside_wrong": (lambda s: s.sendall(
        struct.pack("<iiii", 16 + 4 + 1 + 5, 7, 0, OP_MSG) + struct.pack("<I", 0) + b"\x00"
        + struct.pack("<i", 99) + b"\x00"), ("error", 7, 22)),
    "op_compressed": (lambda s: s.sendall(
        struct.pack("<iiiiiiB", 16 + 9 + 4, 8, 0, OP_COMPRESSED, OP_MSG, 64, 2) + b"zzzz"),
        ("error", 8, 238)),
    # a code-with-scope whose scope nests 100,000 levels (800 KB): libbson's validation
    # recursed through it without a limit and overflowed the loop thread's stack
    "scope_nested_100000": (lambda s: s.sendall(_deep_scope_msg(9, 100_000)), ("error", 9, 22)),
    "field_name_not_utf8": (lambda s: s.sendall(_bad_key_msg(10)), ("error", 10, 22)),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_isolated(wire, case):
    send, expect = BAD_INPUTS[case]
    other = wire.client()
    try:
        assert no_gossip(other.admin.command("ping")) == {"ok": 1.0}
        with raw(wire) as s:
            send(s)
            if expect == "closed":
                assert closed_by_server(s)
            else:
                _, rid, code = expect
                rto, body = recv_reply(s)
                assert rto == rid
                assert body["ok"] == 0.0
                assert body["code"] == code
                assert body["errmsg"]
                # and the same connection still serves commands
                s.sendall(op_msg(rid + 100, {"ping": 1, "$db": "admin"}))
                rto, body = recv_reply(s)
                assert (rto, no_gossip(body)) == (rid + 100, {"ok": 1.0})
        assert no_gossip(other.admin.command("ping")) == {"ok": 1.0}
        # a brand-new client works too
        fresh = wire.client()
        try:
            assert no_gossip(fresh.admin.command("ping")) == {"ok": 1.0}
        finally:
            fresh.close()
    finally:
        other.close()


def test_truncated_message_is_not_answered_while_incomplete(wire):
    """A partial message stays pending (no reply, no close) until its bytes arrive."""
    msg = op_msg(9, {"ping": 1, "$db": "admin"})
    with raw(wire) as s:
        s.sendall(msg[:20])
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(1)
        s.settimeout(20)
        s.sendall(msg[20:])
        rto, body = recv_reply(s)
        assert (rto, no_gossip(body)) == (9, {"ok": 1.0})


def test_metrics(wire):
    c = wire.client()
    try:
        for _ in range(3):
            c.admin.command("ping")
        with pytest.raises(pymongo.errors.OperationFailure):
            c.admin.command("noSuchCommandY")
    finally:
        c.close()

    def value(fams, name, labels):
        for fam in fams:
            for smp in fam.samples:
                if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                    return smp.value
        return None

    st, body = http_get(wire.http_port, "/metrics")
    assert st == 200
    fams = list(text_string_to_metric_families(body.decode()))
    role = wire.role
    assert value(fams, "stripedb_wire_commands_total",
                 {"role": role, "cmd": "ping", "status": "ok"}) == 3.0
    assert value(fams, "stripedb_wire_commands_total",
                 {"role": role, "cmd": "unknown", "status": "error"}) == 1.0
    assert value(fams, "stripedb_wire_command_duration_seconds_count",
                 {"role": role, "cmd": "ping"}) == 3.0
    assert value(fams, "stripedb_wire_bytes_in_total", {"role": role}) > 0
    assert value(fams, "stripedb_wire_bytes_out_total", {"role": role}) > 0
    # the client is closed; connections drop to 0 once the server saw the EOFs
    wait_until(lambda: value(list(text_string_to_metric_families(
        http_get(wire.http_port, "/metrics")[1].decode())),
        "stripedb_wire_connections", {"role": role}) == 0.0, what="connections gauge 0")


def test_awaitable_hello_waits(wire):
    """An awaitable hello (topologyVersion + maxAwaitTimeMS, as pymongo's and Node's
    streaming monitors send) is held until maxAwaitTimeMS: answering at once would make
    those drivers re-send hello in a tight loop."""
    with raw(wire) as s:
        s.sendall(op_msg(1, {"hello": 1, "$db": "admin"}))
        _, first = recv_reply(s)
        tv = first["topologyVersion"]
        s.sendall(op_msg(2, {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 2000,
                             "$db": "admin"}, flags=1 << 16))
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(1)  # held: nothing within 0.5 s of a 2 s wait
        s.settimeout(20)
        rto, body = recv_reply(s)
        assert rto == 2
        assert body["isWritablePrimary"] is True
        assert body["topologyVersion"] == tv
        # a stale topologyVersion (other processId) is answered at once
        s.sendall(op_msg(3, {"hello": 1, "maxAwaitTimeMS": 60000, "$db": "admin",
                             "topologyVersion": {"processId": bson.ObjectId(),
                                                 "counter": 0}}))
        s.settimeout(20)
        rto, body = recv_reply(s)
        assert rto == 3


NODE_SCRIPT = r"""
const { MongoClient } = require('mongodb');
(async () => {
  const c = new MongoClient(process.argv[1], { serverSelectionTimeoutMS: 10000 });
  await c.connect();
  const h = await c.db('admin').command({ hello: 1 });
  const p = await c.db('admin').command({ ping: 1 });
  let code = null;
  try { await c.db('admin').command({ noSuchNode: 1 }); } catch (e) { code = e.code; }
  console.log(JSON.stringify({ w: h.isWritablePrimary, max: h.maxWireVersion, ping: p.ok, code }));
  await c.close();
})().catch((e) => { console.error(e); process.exit(1); });
"""


@needs_node_client("mongodb")
def test_node_driver(wire):
    uri = f"mongodb://127.0.0.1:{wire.port}/?directConnection=true"
    r = subprocess.run(["node", "-e", NODE_SCRIPT, uri], capture_output=True, text=True,
                       timeout=60, cwd=HERE, env=node_env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {
        "w": True, "max": 17, "ping": 1, "code": 59}


@needs_node_client("mongosh")
def test_mongosh(wire):
    uri = f"mongodb://127.0.0.1:{wire.port}/?directConnection=true"
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval",
                        "db.runCommand({ping:1}).ok"],
                       capture_output=True, text=True, timeout=120, cwd=HERE,
                       env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "1", r.stdout + r.stderr


def stop_during_sleep(tmp_path, cmd):
    """Run wire_test_server, send cmd (a stripedbTestSleep of 10 s), SIGTERM it while the
    handler runs (its drain times out after 5 s) and return its log."""
    assert os.access(TEST_SERVER, os.X_OK), f"{TEST_SERVER} not built (make check builds it)"
    port = free_port()
    log_path = tmp_path / "wire_test_server.log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen([TEST_SERVER, f"--listen=127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=log)
        try:
            assert p.stdout.readline().decode() == f"port={port}\n"
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(op_msg(7, cmd))
            wait_until(lambda: "stripedbTestSleep started" in log_path.read_text(), 20,
                       what="the handler running")
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
            s.close()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return log_path.read_text()


def test_the_message_after_pipelined_ones_is_read(tmp_path):
    """A reply its handler's thread sends itself does not wake the loop; the client's next
    message does. So a busy connection must be read whenever nothing is buffered: after two
    pipelined messages (the second waits, unread, for the first's end) the loop hands the
    second over and must read on, or the third is never read (it was not, until something
    else woke the loop: a stall of up to a second through a proxy, for ever here, where
    nothing else wakes it). wire_test_server's stripedbTestSleep completes from a thread
    of its own. A hang fails at the socket's timeout."""
    assert os.access(TEST_SERVER, os.X_OK), f"{TEST_SERVER} not built (make check builds it)"
    port = free_port()
    with open(tmp_path / "wire_test_server.log", "wb") as log:
        p = subprocess.Popen([TEST_SERVER, f"--listen=127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=log)
        try:
            assert p.stdout.readline().decode() == f"port={port}\n"
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                for rnd in range(20):
                    rid = 10 * rnd
                    sleep = {"stripedbTestSleep": 0, "$db": "admin"}
                    s.sendall(op_msg(rid + 1, sleep) + op_msg(rid + 2, sleep))
                    assert [recv_reply(s)[0] for _ in range(2)] == [rid + 1, rid + 2]
                    for k in range(3, 6):  # one at a time, each after the last reply
                        s.sendall(op_msg(rid + k, sleep))
                        rto, body = recv_reply(s)
                        assert (rto, body["ok"], body["slept"]) == (rid + k, 1.0, 0)
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0, (tmp_path / "wire_test_server.log").read_text()


@contextlib.contextmanager
def run_test_server(tmp_path, http=False, args=()):
    """wire_test_server on free ports (and args) -> (port, http_port or None, its Popen);
    stopped with SIGTERM at the end (unless stopped already), which must close its loop
    cleanly (exit 0)."""
    assert os.access(TEST_SERVER, os.X_OK), f"{TEST_SERVER} not built (make check builds it)"
    port = free_port()
    http_port = free_port() if http else None
    args = [TEST_SERVER, f"--listen=127.0.0.1:{port}"] + list(args)
    if http:
        args.append(f"--http-listen=127.0.0.1:{http_port}")
    log_path = tmp_path / "wire_test_server.log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log)
        try:
            assert p.stdout.readline().decode() == f"port={port}\n"
            if http:
                wait_until(lambda: http_get(http_port, "/healthz", timeout=1.0)[0] == 200,
                           what="wire_test_server /healthz")
            yield port, http_port, p
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = "killed: no exit 30 s after SIGTERM"
            assert rc == 0, log_path.read_text()[-3000:]


def metric(http_port, name, labels=None):
    """The value of one sample of /metrics, or None."""
    st, body = http_get(http_port, "/metrics")
    assert st == 200
    for fam in text_string_to_metric_families(body.decode()):
        for smp in fam.samples:
            if smp.name == name and all(smp.labels.get(k) == v
                                        for k, v in (labels or {}).items()):
                return smp.value
    return None


def test_bytes_out_counts_a_reply_its_handler_thread_sent_in_part(tmp_path):
    """A reply larger than the socket buffers, completed on the handler's thread: that
    thread sends what the socket takes and the loop writes the rest. Every byte the
    client receives is counted in stripedb_wire_bytes_out_total, the part the handler's
    thread sent too."""
    with run_test_server(tmp_path, http=True) as (port, http_port, _):
        with _small_window_socket(port) as s:
            before = metric(http_port, "stripedb_wire_bytes_out_total")
            s.sendall(op_msg(1, {"stripedbTestSleep": 0, "pad": 8_000_000, "$db": "admin"}))
            hdr = recv_exact(s, 16)
            assert hdr is not None, "closed before the reply"
            length, _rid, rto, _op = struct.unpack("<iiii", hdr)
            rest = recv_exact(s, length - 16)
            assert rest is not None, f"closed inside a reply of {length} bytes"
            body = bson.decode(rest[5:])
            assert (rto, body["ok"], len(body["pad"])) == (1, 1.0, 8_000_000)
            after = metric(http_port, "stripedb_wire_bytes_out_total")
            assert after - before == length


def test_an_answered_request_is_not_named_unanswered_at_a_zero_timeout_stop(tmp_path):
    """A reply its handler's thread sent leaves the request for the loop to finish when it
    next wakes. A stop with no drain time (shutdown timeout 0: the force-close timer is due
    before the loop finishes anything) must not name that request as unanswered at
    shutdown: its client has its reply (and conftest fails a test whose process logs the
    warning)."""
    with run_test_server(tmp_path, args=["--close-timeout-ms=0"]) as (port, _, p):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            # 100 ms: the loop is asleep when the handler's thread sends the reply (one
            # that completed before the loop slept would be finished by then)
            s.sendall(op_msg(1, {"stripedbTestSleep": 100, "$db": "admin"}))
            rto, body = recv_reply(s)
            assert (rto, body["ok"], body["slept"]) == (1, 1.0, 100)
            # the client still connected (its EOF would wake the loop): the stop now
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0
    text = (tmp_path / "wire_test_server.log").read_text()
    assert "wire: server closed" in text, text[-3000:]
    assert "unanswered request at shutdown" not in text, text[-3000:]


def test_unanswered_request_is_named_when_the_stop_times_out(tmp_path):
    """A handler that never replies in time must not go unnoticed: when the graceful stop's
    drain times out (wire_test_server drains for 5 s) the server logs each unanswered
    request by name, and conftest's start_role fails any test whose process logs it."""
    text = stop_during_sleep(tmp_path, {"stripedbTestSleep": 10000, "$db": "admin"})
    assert "wire: unanswered request at shutdown" in text, text[-3000:]
    assert "wire: request waiting at shutdown" not in text, text[-3000:]
    assert "cmd=stripedbTestSleep" in text and "db=admin" in text, text[-3000:]


def test_a_request_waiting_on_io_at_the_stop_is_slow_not_unanswered(tmp_path):
    """A handler inside a wait that ends by itself (wire_req_wait_begin: a call to a shard,
    a back-off) when the stop times out is reported as waiting, not as unanswered: the
    suite fails only on requests whose handler neither answered nor waits on anything."""
    text = stop_during_sleep(tmp_path, {"stripedbTestSleep": 10000, "waiting": True,
                                        "$db": "admin"})
    assert "wire: request waiting at shutdown" in text, text[-3000:]
    assert "wire: unanswered request at shutdown" not in text, text[-3000:]
    assert "cmd=stripedbTestSleep" in text and "db=admin" in text, text[-3000:]


# ---- the connection's life around a request (issue #19's read-while-busy, uv_try_write) ----

@pytest.fixture
def tc_shard(start_role, tmp_path):
    """An embedded shard with test commands (failCommand), once it is the writable primary:
    (proc, wire port)."""
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}",
                    "--enable-test-commands=true"])
    wait_until(lambda: _can_connect(port), what=f"wire port {port}")

    def primary():
        with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                                 serverSelectionTimeoutMS=2000) as c:
            return c.admin.command("hello").get("isWritablePrimary")
    wait_until(primary, 30, interval=0.05, what="the shard to be writable")
    return p, port


BIG_DOCS = 14  # of 1 MiB each: a ~14.7 MB first batch, far over loopback's socket buffers


def _insert_big_docs(port):
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.big.insert_many([{"_id": i, "s": "x" * (1 << 20)} for i in range(BIG_DOCS)])


def _small_window_socket(port):
    """A client socket whose receive buffer (64 KiB, set before connect so the window is
    small) holds little of a big reply: the server's write of it is partial."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    return s


def _recv_whole_reply(s, what):
    """One OP_MSG reply -> (responseTo, body); fails naming what when the server closes
    before the whole reply arrived."""
    hdr = recv_exact(s, 16)
    assert hdr is not None, f"{what}: closed before the reply"
    length, _rid, response_to, opcode = struct.unpack("<iiii", hdr)
    rest = recv_exact(s, length - 16)
    assert rest is not None, f"{what}: closed inside a reply of {length} bytes (truncated)"
    assert opcode == OP_MSG
    return response_to, bson.decode(rest[5:])


def test_half_closed_client_gets_its_reply_then_the_close(tc_shard):
    """A client that sends its request and shuts down its side (shutdown(SHUT_WR), as a
    scripted client does) still reads the whole reply, then the server's close: for a small
    reply (the EOF is met while the command is busy and held until the reply) and for one
    far larger than the socket buffers (queued in part when the EOF is read: the close
    waits until it is written; closing at the EOF cut it)."""
    _, port = tc_shard
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(op_msg(1, {"ping": 1, "$db": "admin"}))
        s.shutdown(socket.SHUT_WR)
        rto, body = _recv_whole_reply(s, "half-closed ping")
        assert (rto, body["ok"]) == (1, 1.0)
        assert closed_by_server(s)
    _insert_big_docs(port)
    for rid in (2, 3):
        with _small_window_socket(port) as s:
            s.sendall(op_msg(rid, {"find": "big", "batchSize": 100, "$db": "t"}))
            s.shutdown(socket.SHUT_WR)
            rto, body = _recv_whole_reply(s, "half-closed find of ~14.7 MB")
            assert rto == rid
            assert [d["_id"] for d in body["cursor"]["firstBatch"]] == list(range(BIG_DOCS))
            assert closed_by_server(s)


def test_pipelined_messages_are_answered_in_order(tc_shard):
    """Messages sent back to back in one write (a pipelining client; fire-and-forget w:0
    inserts with moreToCome) are run one at a time, in order: every reply in order, none
    for the moreToCome inserts, and the read after them sees all of them."""
    _, port = tc_shard
    msgs = b"".join(op_msg(i, {"ping": 1, "$db": "admin"}) for i in range(1, 51))
    msgs += b"".join(op_msg(100 + i, {"insert": "p", "documents": [{"_id": i}],
                                      "writeConcern": {"w": 0}, "$db": "t"}, flags=2)
                     for i in range(100))
    msgs += op_msg(999, {"count": "p", "$db": "t"})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(msgs)
        assert [_recv_whole_reply(s, "ping")[0] for _ in range(50)] == list(range(1, 51))
        rto, body = _recv_whole_reply(s, "count")
        assert (rto, body["ok"], body["n"]) == (999, 1.0, 100)


def test_reply_larger_than_the_socket_buffers_arrives_whole_and_in_order(tc_shard):
    """A reply far larger than the socket buffers, to a client that reads only after it
    has sent its next messages: the server writes what the socket takes and queues the
    rest; the replies of the messages after it (written by then) come after it, whole."""
    _, port = tc_shard
    _insert_big_docs(port)
    big = {"find": "big", "batchSize": 100, "$db": "t"}
    with _small_window_socket(port) as s:
        s.sendall(op_msg(1, big) + op_msg(2, {"ping": 1, "$db": "admin"}) + op_msg(3, big) +
                  op_msg(4, {"ping": 1, "$db": "admin"}))
        for rid in (1, 2, 3, 4):
            rto, body = _recv_whole_reply(s, f"reply {rid}")
            assert (rto, body["ok"]) == (rid, 1.0)
            if rid in (1, 3):
                assert [d["_id"] for d in body["cursor"]["firstBatch"]] == list(range(BIG_DOCS))


def test_reset_while_busy_keeps_the_command_in_current_op(tc_shard):
    """A client that resets its connection (RST) while its command runs: the command runs
    on, so it stays in currentOp (and killOp's reach) until it ends, as when a busy
    connection was not read; the connection closes after it. Closing at the reset hid a
    running command from currentOp and killOp."""
    _, port = tc_shard
    c = pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                            serverSelectionTimeoutMS=10000)
    try:
        c.t.c.insert_one({"_id": 1})
        c.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                         "data": {"failCommands": ["find"], "blockConnection": True,
                                  "blockTimeMS": 10000}})

        def ops(idle=False):
            return list(c.admin.aggregate([{"$currentOp": {"idleConnections": idle}}]))

        def blocked():
            return [o for o in ops() if o.get("command", {}).get("find") == "c"]
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(op_msg(1, {"find": "c", "$db": "t"}))
        wait_until(blocked, what="the find blocked by failCommand")
        op = blocked()[0]
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        # the reset reached the shard before this ping, so the loop read it first
        assert c.admin.command("ping")["ok"] == 1.0
        assert [o["opid"] for o in blocked()] == [op["opid"]]
        # the connection goes once the command ends (at blockTimeMS)
        wait_until(lambda: op["connectionId"] not in
                   [o.get("connectionId") for o in ops(idle=True)], 40,
                   what="the reset connection to close after its command")
        assert blocked() == []
    finally:
        c.close()


# ---- pipelined runs finished in one pass, their replies held and written together ----
# (wire/server.c finish_done, conn_write_rest, out_flush_all: a reply followed by a whole
# pipelined message is held in the connection's out buffer until the run or the pass ends)

def _point_find(rid, _id, coll="pt"):
    """A driver's find_one by _id: a shard runs it on its loop thread."""
    return op_msg(rid, {"find": coll, "filter": {"_id": _id}, "limit": 1, "singleBatch": True,
                        "$db": "t"})


def _loop_reads(proc):
    return metric(proc.http_port, "stripedb_shard_loop_reads_total") or 0.0


def _expect_docs(s, rid, docs, what):
    rto, body = _recv_whole_reply(s, what)
    assert (rto, body.get("ok")) == (rid, 1.0), (what, rto, body)
    assert body["cursor"]["firstBatch"] == docs, (what, body)


def test_pipelined_point_reads_are_answered_in_order_with_their_documents(tc_shard):
    """Point reads sent back to back (a proxy's forwarder) run on the shard's loop and are
    answered in one pass: each reply carries its request's responseTo, in the order sent,
    with its own document (the _ids are sent shuffled, and some are missing). 1000 in one
    send cross the 64 KiB read chunk and the 64 rounds of one pass; all of them ran on the
    loop (stripedb_shard_loop_reads_total), so the batching path is the one tested."""
    proc, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": f"doc{i}"} for i in range(300)])
    order = [(i * 7919) % 400 for i in range(1000)]  # 0..399: 300..399 do not exist
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for n in (200, 1000, 3, 64, 65, 129):
            before = _loop_reads(proc)
            ids = order[:n]
            s.sendall(b"".join(_point_find(10_000 + k, i) for k, i in enumerate(ids)))
            for k, i in enumerate(ids):
                docs = [{"_id": i, "v": f"doc{i}"}] if i < 300 else []
                _expect_docs(s, 10_000 + k, docs, f"point read {k} of {n} (_id {i})")
            assert _loop_reads(proc) - before >= n, "the point reads did not run on the loop"


def test_pipelined_mixed_run_is_answered_in_order_and_whole(tc_shard):
    """One send of: point reads (on the loop), an insert (through Raft, completes later),
    point reads that must see it, a find that is not a point read (a worker thread), an
    unknown command and a message without $db (error replies), a delete, and point reads
    after each. Every reply comes in order and is right, the last one included (a reply
    held for ever fails at the socket's timeout)."""
    proc, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.mx.insert_many([{"_id": i, "v": i} for i in range(10)])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for rep in range(5):
            new = 1000 + rep
            msgs, checks = [], []
            rid = [rep * 1000]

            def add(msg_fn, check):
                rid[0] += 1
                msgs.append(msg_fn(rid[0]))
                checks.append((rid[0], check))

            def points(ids, present):
                for i in ids:
                    doc = [{"_id": i, "v": i}] if present(i) else []
                    add(lambda r, i=i: _point_find(r, i, "mx"), ("docs", doc))

            before_new = lambda i: i < 10  # noqa: E731
            points(range(10), before_new)
            points([new], lambda i: False)
            add(lambda r: op_msg(r, {"insert": "mx", "documents": [{"_id": new, "v": new}],
                                     "$db": "t"}), ("n", 1))
            with_new = lambda i: i < 10 or i == new  # noqa: E731
            points([new, 3, new, 7], with_new)
            add(lambda r: op_msg(r, {"find": "mx", "filter": {"v": {"$gte": 0}},
                                     "sort": {"_id": 1}, "$db": "t"}),
                ("docs", [{"_id": i, "v": i} for i in list(range(10)) + [new]]))
            points([new, 0, 9], with_new)
            add(lambda r: op_msg(r, {"noSuchCommandPipetest": 1, "$db": "t"}), ("code", 59))
            points([5, new], with_new)
            add(lambda r: op_msg(r, {"ping": 1}), ("code", 2))  # no $db: BadValue
            points([new, 1], with_new)
            add(lambda r: op_msg(r, {"delete": "mx", "deletes": [{"q": {"_id": new},
                                                                  "limit": 1}],
                                     "$db": "t"}), ("n", 1))
            points([new, 2, new], before_new)
            s.sendall(b"".join(msgs))
            for k, (r, (kind, want)) in enumerate(checks):
                what = f"round {rep} reply {k} (request {r}, expects {kind} {want})"
                rto, body = _recv_whole_reply(s, what)
                assert rto == r, (what, rto, body)
                if kind == "docs":
                    assert body.get("ok") == 1.0, (what, body)
                    assert body["cursor"]["firstBatch"] == want, (what, body)
                elif kind == "n":
                    assert (body.get("ok"), body.get("n")) == (1.0, want), (what, body)
                else:
                    assert (body.get("ok"), body.get("code")) == (0.0, want), (what, body)


def test_pipelined_point_reads_then_garbage_get_their_replies_before_the_close(tc_shard):
    """Point reads followed, in the same send, by bytes that are no message: every reply
    arrives, whole, before the server closes the connection. Two kinds of end: an invalid
    messageLength (the connection closes on reading it) and a moreToCome message whose
    body is broken (it cannot be answered, so the server closes on it; it is a whole
    message, so the reply before it was held when the close came)."""
    _, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(50)])
    bad_more_to_come = (struct.pack("<iiii", 16 + 4 + 1 + 5, 99, 0, OP_MSG) +
                        struct.pack("<I", 2) + b"\x00" + struct.pack("<i", 99) + b"\x00")
    ends = {"invalid messageLength": struct.pack("<i", 5) + b"x" * 40,
            "broken moreToCome message": bad_more_to_come,
            "broken moreToCome message, then garbage": bad_more_to_come + b"GET / HTTP/1.1"}
    for name, end in ends.items():
        for n in (1, 50):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"".join(_point_find(k + 1, k) for k in range(n)) + end)
                for k in range(n):
                    _expect_docs(s, k + 1, [{"_id": k, "v": k}], f"{name}: reply {k + 1}/{n}")
                assert closed_by_server(s), name


def test_pipelined_point_reads_of_a_half_closed_client_are_all_answered(tc_shard):
    """A client that sends its pipelined messages and shuts down its side at once
    (shutdown(SHUT_WR)) gets every reply, then the server's close: point reads only, and
    point reads around an insert (the EOF is met while the insert waits for Raft)."""
    _, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(100)])
    for n in (1, 2, 100):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"".join(_point_find(k + 1, k) for k in range(n)))
            s.shutdown(socket.SHUT_WR)
            for k in range(n):
                _expect_docs(s, k + 1, [{"_id": k, "v": k}], f"half-closed: {k + 1}/{n}")
            assert closed_by_server(s)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(_point_find(k + 1, k) for k in range(30)) +
                  op_msg(31, {"insert": "pt", "documents": [{"_id": 500, "v": 500}],
                              "$db": "t"}) +
                  b"".join(_point_find(32 + k, 500 - k) for k in range(30)))
        s.shutdown(socket.SHUT_WR)
        for k in range(30):
            _expect_docs(s, k + 1, [{"_id": k, "v": k}], f"half-closed, before the insert {k}")
        rto, body = _recv_whole_reply(s, "half-closed insert")
        assert (rto, body.get("ok"), body.get("n")) == (31, 1.0, 1), body
        _expect_docs(s, 32, [{"_id": 500, "v": 500}], "half-closed, the inserted document")
        for k in range(1, 30):
            _expect_docs(s, 32 + k, [], f"half-closed, after the insert {k}")
        assert closed_by_server(s)


def test_a_reset_during_a_pipelined_run_leaves_the_shard_healthy(tc_shard):
    """Clients that reset their connection (RST: SO_LINGER 0) right after sending 500
    pipelined point reads, some with reads that go to workers among them: the shard goes
    on serving (a new client's ping and point read) and stops cleanly, with no sanitizer
    report in its log (a held reply freed twice, or written after the close, would be)."""
    proc, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(100)])
    for rep in range(30):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        msgs = [_point_find(k + 1, k % 120) for k in range(500)]
        if rep % 2:
            msgs[250] = op_msg(251, {"find": "pt", "filter": {"v": {"$gte": 0}}, "$db": "t"})
            msgs[400] = op_msg(401, {"insert": "pt", "documents": [{"_id": 1000 + rep}],
                                     "$db": "t"})
        s.sendall(b"".join(msgs))
        if rep % 3 == 0:  # some read first, so the reset comes in the middle of the run
            _expect_docs(s, 1, [{"_id": 0, "v": 0}], "the first reply")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(op_msg(1, {"ping": 1, "$db": "admin"}) + _point_find(2, 7))
        rto, body = _recv_whole_reply(s, "ping after the resets")
        assert (rto, body["ok"]) == (1, 1.0)
        _expect_docs(s, 2, [{"_id": 7, "v": 7}], "point read after the resets")
    assert_clean_exit(proc)


def test_pipelined_big_point_reads_larger_than_the_socket_buffers_arrive_in_order(tc_shard):
    """Point reads of 1 MiB documents (run on the loop) among small ones and a 14.7 MB
    find (a worker), to a client whose small receive window takes little at a time: the
    held replies are more than the socket takes, so their send is partly queued; the
    replies after them must still come after them, each whole and right."""
    _, port = tc_shard
    _insert_big_docs(port)
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.big.insert_many([{"_id": 100 + i, "s": "small"} for i in range(5)])
    big_doc = lambda i: {"_id": i, "s": "x" * (1 << 20)}  # noqa: E731
    scan = (lambda r: op_msg(r, {"find": "big", "filter": {"_id": {"$lt": 100}},
                                 "batchSize": 100, "$db": "t"}),
            [big_doc(j) for j in range(BIG_DOCS)])
    # first: the worker sends what the socket takes of its reply itself, the loop holds
    # the rest with the point reads' replies after it
    plan = [scan]  # (message, expected firstBatch)
    for i in range(BIG_DOCS):
        plan.append((lambda r, i=i: _point_find(r, i, "big"), [big_doc(i)]))
        plan.append((lambda r, i=i: _point_find(r, 100 + i % 5, "big"),
                     [{"_id": 100 + i % 5, "s": "small"}]))
        if i == 5:
            plan.append(scan)
    with _small_window_socket(port) as s:
        s.sendall(b"".join(m(k + 1) for k, (m, _) in enumerate(plan)))
        for k, (_, want) in enumerate(plan):
            rto, body = _recv_whole_reply(s, f"reply {k + 1}")
            assert (rto, body.get("ok")) == (k + 1, 1.0), (k + 1, rto, body.get("errmsg"))
            got = body["cursor"]["firstBatch"]
            assert [d["_id"] for d in got] == [d["_id"] for d in want], k + 1
            assert got == want, f"reply {k + 1}: wrong documents"


def test_a_workers_reply_does_not_overtake_the_replies_held_before_it(tc_shard):
    """A connection's point reads, each pair followed by a find a worker thread runs: the
    point reads' replies are held while the pass goes on, and two other connections'
    pipelined point reads keep the pass going (one message of each connection a round)
    long enough for the worker to finish. The worker must not send its reply itself
    (direct_ok) while replies before it are held, or it overtakes them."""
    proc, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(20)])
    scan = {"find": "pt", "filter": {"v": {"$lt": 3}}, "sort": {"_id": 1}, "$db": "t"}
    flood = b"".join(_point_find(k + 1, k % 20) for k in range(3000))
    with contextlib.ExitStack() as st:
        others = [st.enter_context(socket.create_connection(("127.0.0.1", port), timeout=60))
                  for _ in range(2)]
        s = st.enter_context(socket.create_connection(("127.0.0.1", port), timeout=60))
        for rep in range(3):
            for o in others:
                o.sendall(flood)
            msgs, want = [], []
            for k in range(300):
                rid = 3 * k + 1
                msgs += [_point_find(rid, k % 20), _point_find(rid + 1, (k + 7) % 20),
                         op_msg(rid + 2, scan)]
                want += [(rid, [{"_id": k % 20, "v": k % 20}]),
                         (rid + 1, [{"_id": (k + 7) % 20, "v": (k + 7) % 20}]),
                         (rid + 2, [{"_id": i, "v": i} for i in range(3)])]
            s.sendall(b"".join(msgs))
            for rid, docs in want:
                _expect_docs(s, rid, docs, f"round {rep}, request {rid}")
            for o in others:
                for k in range(3000):
                    _expect_docs(o, k + 1, [{"_id": k % 20, "v": k % 20}],
                                 f"round {rep}, the other connection's reply {k + 1}")


def test_held_replies_go_out_before_a_slow_command_and_before_a_close(tc_shard):
    """Replies held behind a pipelined message are written when the pass ends, not when
    that message's own reply goes: point reads followed by a command blocked for 8 s
    (failCommand blockConnection) are answered while it is still blocked (it is still in
    currentOp when they arrive). And a connection closed by the server after a pipelined
    run (failCommand closeConnection) first writes every reply held before the close
    whole, 1 MiB ones to a small receive window included (the close waits for the
    write)."""
    _, port = tc_shard
    _insert_big_docs(port)
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(10)])

        def blocked_count():
            return [o for o in c.admin.aggregate([{"$currentOp": {}}])
                    if o.get("command", {}).get("count") == "pt"]
        c.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                         "data": {"failCommands": ["count"], "blockConnection": True,
                                  "blockTimeMS": 8000}})
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"".join(_point_find(k + 1, k) for k in range(5)) +
                      op_msg(6, {"count": "pt", "$db": "t"}) + _point_find(7, 9))
            for k in range(5):
                _expect_docs(s, k + 1, [{"_id": k, "v": k}], f"point read {k + 1}")
            assert blocked_count(), "the point reads' replies waited for the blocked count"
            rto, body = _recv_whole_reply(s, "the blocked count")
            assert (rto, body.get("ok"), body.get("n")) == (6, 1.0, 10), body
            _expect_docs(s, 7, [{"_id": 9, "v": 9}], "the point read after the count")

        c.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                         "data": {"failCommands": ["count"], "closeConnection": True}})
        big = lambda i: [{"_id": i, "s": "x" * (1 << 20)}]  # noqa: E731
        with _small_window_socket(port) as s:
            # 14 MiB held: more than a loopback socket's send buffer takes
            s.sendall(_point_find(1, 1) + b"".join(_point_find(2 + i, i, "big")
                                                   for i in range(BIG_DOCS)) +
                      op_msg(100, {"count": "pt", "$db": "t"}) + _point_find(101, 3))
            _expect_docs(s, 1, [{"_id": 1, "v": 1}], "reply 1 before the close")
            for i in range(BIG_DOCS):
                _expect_docs(s, 2 + i, big(i), f"reply {2 + i} before the close")
            assert closed_by_server(s)
        c.admin.command({"configureFailPoint": "failCommand", "mode": "off"})


def _tls_shard(start_role, tmp_path):
    """A shard with --tls-mode=required (test_security_tls.tls_args' certificate),
    writable: (its port, the CA file)."""
    ca, args = tls_args(tmp_path, "required")
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"] + args)
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True, tls=True,
                             tlsCAFile=ca, serverSelectionTimeoutMS=30000) as c:
        wait_until(lambda: c.admin.command("hello").get("isWritablePrimary"), 30,
                   interval=0.05, what="the shard to be writable")
    return port, ca


def test_pipelined_run_over_tls_is_answered_in_order(start_role, tmp_path):
    """The same over TLS (each held reply is its own TLS records, written together):
    pipelined point reads around an insert and a worker's find, and 1 MiB point reads
    among small ones, all answered in order, whole and right."""
    port, ca = _tls_shard(start_role, tmp_path)
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True, tls=True,
                             tlsCAFile=ca, serverSelectionTimeoutMS=30000) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(100)])
        c.t.big.insert_many([{"_id": i, "s": "x" * (1 << 20)} for i in range(6)])
    ctx = ssl.create_default_context(cafile=ca)
    plan = [(lambda r, k=k: _point_find(r, k), [{"_id": k, "v": k}]) for k in range(100)]
    plan.append((lambda r: op_msg(r, {"insert": "pt", "documents": [{"_id": 500, "v": 500}],
                                      "$db": "t"}), None))
    plan += [(lambda r: _point_find(r, 500), [{"_id": 500, "v": 500}])] * 3
    plan.append((lambda r: op_msg(r, {"find": "pt", "filter": {"v": {"$gte": 98}},
                                      "sort": {"_id": 1}, "$db": "t"}),
                 [{"_id": 98, "v": 98}, {"_id": 99, "v": 99}, {"_id": 500, "v": 500}]))
    for i in range(6):
        plan.append((lambda r, i=i: _point_find(r, i, "big"), [{"_id": i, "s": "x" * (1 << 20)}]))
        plan.append((lambda r, i=i: _point_find(r, i), [{"_id": i, "v": i}]))
    raw_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    raw_sock.settimeout(60)
    raw_sock.connect(("127.0.0.1", port))
    with ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
        s.sendall(b"".join(m(k + 1) for k, (m, _) in enumerate(plan)))
        for k, (_, want) in enumerate(plan):
            rto, body = _recv_whole_reply(s, f"TLS reply {k + 1}")
            assert (rto, body.get("ok")) == (k + 1, 1.0), (k + 1, rto, body.get("errmsg"))
            if want is None:
                assert body.get("n") == 1, body
            else:
                assert body["cursor"]["firstBatch"] == want, f"TLS reply {k + 1}"


def test_pipelined_point_reads_split_at_any_byte_are_answered_in_order(tc_shard):
    """Pipelined point reads whose bytes arrive cut at arbitrary places (sent in pieces of
    1 to 300 bytes, TCP_NODELAY, without reading in between): a reply followed by part of
    a message only must not wait for the rest of it, and every reply comes in order."""
    _, port = tc_shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(50)])
    rnd = random.Random(19)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for rep in range(5):
            n = 400
            data = b"".join(_point_find(rep * 1000 + k, k % 60) for k in range(n))
            pos = 0
            while pos < len(data):
                step = rnd.randint(1, 300)
                s.sendall(data[pos:pos + step])
                pos += step
            for k in range(n):
                i = k % 60
                _expect_docs(s, rep * 1000 + k, [{"_id": i, "v": i}] if i < 50 else [],
                             f"round {rep}, reply {k}")
        # the last message cut in two, its second half sent only after the replies of the
        # ones before it came: they must come without it
        first = b"".join(_point_find(k + 1, k) for k in range(10))
        last = _point_find(11, 10)
        s.sendall(first + last[:20])
        for k in range(10):
            _expect_docs(s, k + 1, [{"_id": k, "v": k}], f"before the cut message, {k + 1}")
        s.sendall(last[20:])
        _expect_docs(s, 11, [{"_id": 10, "v": 10}], "the cut message")


def test_tls_close_notify_after_pipelined_messages_answers_them_all(start_role, tmp_path):
    """A TLS client that sends several messages and its close_notify in one write (TLS
    1.3's half-close, the TLS form of shutdown(SHUT_WR)) gets every reply, in order, then
    the close. The close_notify is decrypted with the messages, while the first one runs:
    closing once the first reply was written dropped the others (only the first came)."""
    port, ca = _tls_shard(start_role, tmp_path)
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True, tls=True,
                             tlsCAFile=ca, serverSelectionTimeoutMS=30000) as c:
        c.t.pt.insert_many([{"_id": i, "v": i} for i in range(100)])
        c.t.big.insert_many([{"_id": i, "s": "x" * (1 << 20)} for i in range(8)])
    for n, extra in ((1, None), (2, None), (50, None), (20, "insert"), (20, "scan"),
                     (20, "big")):
        msgs = [_point_find(k + 1, k) for k in range(n)]
        if extra == "insert":  # a write (Raft) in the middle, its reply later
            msgs[10] = op_msg(11, {"insert": "pt", "documents": [{"_id": 1000 + n}],
                                   "$db": "t"})
        elif extra == "scan":  # a worker's read in the middle
            msgs[10] = op_msg(11, {"find": "pt", "filter": {"v": {"$gte": 0}}, "$db": "t"})
        elif extra == "big":  # 8 MiB of replies, more than the socket buffers take
            msgs[10] = op_msg(11, {"find": "big", "batchSize": 100, "$db": "t"})
        plain = tls_send_then_close_notify(port, ca, b"".join(msgs))
        replies = []
        while len(plain) >= 16:
            length, _rid, rto, _op = struct.unpack("<iiii", plain[:16])
            assert len(plain) >= length, f"n={n} {extra}: a reply cut"
            replies.append((rto, bson.decode(plain[21:length])))
            plain = plain[length:]
        assert [r for r, _ in replies] == list(range(1, n + 1)), (n, extra)
        for rto, body in replies:
            assert body.get("ok") == 1.0, (n, extra, rto, body)
            if rto != 11 or extra is None:
                assert body["cursor"]["firstBatch"] == [{"_id": rto - 1, "v": rto - 1}]
            elif extra == "big":
                assert [d["_id"] for d in body["cursor"]["firstBatch"]] == list(range(8))
