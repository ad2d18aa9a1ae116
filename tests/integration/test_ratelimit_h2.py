"""The rate limiter's gRPC server on libnghttp2 (issue #23): what a gRPC client can reach
beyond the API itself. Many concurrent calls on one channel, request and response
messages larger than the HTTP/2 windows (flow control), a message over 4 MiB and more than
32 MiB of unfinished requests on one connection (RESOURCE_EXHAUSTED), deadlines, a compressed call refused (UNIMPLEMENTED), bytes that
are not HTTP/2 and connections reset mid-call (raw sockets: the node keeps serving and
ASan sees nothing), and many concurrent calls over mutual TLS (ALPN h2) after a SIGHUP
certificate reload. grpcio is the client, with stubs generated from our .proto.
Hardening (raw sockets): grpc-timeout values that would wrap 64 bits, the 16 KiB header list
limit, GOAWAY on shutdown, handshake and idle timeouts, the connection cap, and bounded
memory per connection (a window-0 client; orphaned calls in the 64 MiB budget).
"""
import shutil
import signal
import socket
import struct
import time

import grpc
import pytest

from conftest import free_port, vm_rss_kb, wait_until

from test_ratelimit_grpc import MINUTE, T0, cluster, node, owners_of, pb, req  # noqa: F401
from test_security_tls import grpc_tls_channel, live, make_certs, mtls_args, pki, start_rl


def get(nd, reqs, timeout=10, **kw):
    return list(nd.v1.GetRateLimits(nd.pb2.GetRateLimitsReq(requests=reqs), timeout=timeout,
                                    **kw).responses)


def test_many_concurrent_calls_on_one_channel(node, pb):
    futs = [node.v1.GetRateLimits.future(node.pb2.GetRateLimitsReq(
        requests=[req(pb, f"cc-{i % 100}", limit=1000)]), timeout=30) for i in range(1000)]
    rs = [f.result() for f in futs]
    assert all(len(r.responses) == 1 and r.responses[0].error == "" for r in rs)
    # each of the 100 keys was hit 10 times, by calls in flight together
    (r,) = get(node, [req(pb, "cc-7", hits=0, limit=1000)])
    assert r.remaining == 990


def test_messages_larger_than_the_windows(node, pb):
    # ~1 MB requests and answers: beyond the 64 KiB default windows of both sides
    long = "n" * 1000
    reqs = [req(pb, f"big-{i}", name=long) for i in range(1000)]
    futs = [node.v1.GetRateLimits.future(node.pb2.GetRateLimitsReq(requests=reqs), timeout=30)
            for _ in range(3)]
    for k, f in enumerate(futs):
        out = f.result().responses
        assert len(out) == 1000
        assert {r.remaining for r in out} == {9 - k} or len({r.remaining for r in out}) == 1
    (r,) = get(node, [req(pb, "big-999", name=long, hits=0)])
    assert r.remaining == 7


def test_message_over_4mib_is_resource_exhausted(node, pb):
    reqs = [req(pb, f"huge-{i}", name="h" * 5000) for i in range(1000)]
    with pytest.raises(grpc.RpcError) as e:
        get(node, reqs, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert node.one(req(pb, "after-huge")).remaining == 9


def test_many_large_calls_on_one_connection(node, pb):
    # 12 calls of ~3.5 MB in flight on one connection: more than the 32 MiB a connection's
    # unfinished requests may hold; each call is answered (OK or RESOURCE_EXHAUSTED)
    reqs = [req(pb, f"lc-{i}", name="l" * 3400) for i in range(1000)]
    futs = [node.v1.GetRateLimits.future(node.pb2.GetRateLimitsReq(requests=reqs), timeout=60)
            for _ in range(12)]
    codes = []
    for f in futs:
        try:
            f.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.OK in codes
    assert node.one(req(pb, "after-large")).remaining == 9


def test_deadline(node, pb):
    (r,) = get(node, [req(pb, "dl")], timeout=5)  # a deadline not reached: answered
    assert r.error == "" and r.remaining == 9
    # a deadline already past when the call is dispatched (grpc-timeout: 1n): the server
    # answers DEADLINE_EXCEEDED (Trailers-Only HEADERS, no DATA) and decides nothing
    msg = node.pb2.GetRateLimitsReq(requests=[req(pb, "dl")]).SerializeToString()
    errs0 = node.metric("stripedb_ratelimit_grpc_errors_total")
    with raw(node) as s:
        s.sendall(PREFACE + frame(4, 0, 0)
                  + request_headers(1, "/pb.gubernator.V1/GetRateLimits",
                                    extra=[("grpc-timeout", "1n")])
                  + frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        frames = []
        while not any(f[0] == 1 and f[2] == 1 and f[1] & 0x1 for f in frames):
            got = read_frames(s, 1)
            assert got, "connection closed"
            frames += got
        assert not any(f[0] == 0 and f[2] == 1 for f in frames)
    assert node.metric("stripedb_ratelimit_grpc_errors_total") == errs0 + 1
    assert node.one(req(pb, "dl")).remaining == 8  # the refused call took nothing


def test_compressed_call_is_refused(node, pb):
    with pytest.raises(grpc.RpcError) as e:
        get(node, [req(pb, "gz")], compression=grpc.Compression.Gzip)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "identity" in e.value.details()
    assert node.one(req(pb, "gz")).remaining == 9  # not counted, still serving


# ---- raw HTTP/2 over a socket ----
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", sid) + payload


def hpack_literal(headers):
    """Literal header fields without indexing, new names, no Huffman (RFC 7541 6.2.2)."""
    out = b""
    for k, v in headers:
        k, v = k.encode(), v.encode()
        assert len(k) < 127 and len(v) < 127
        out += b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v
    return out


def request_headers(sid, path, end_stream=False, extra=()):
    h = hpack_literal([(":method", "POST"), (":scheme", "http"), (":path", path),
                       (":authority", "localhost"), ("content-type", "application/grpc"),
                       ("te", "trailers")] + list(extra))
    return frame(1, 0x4 | (0x1 if end_stream else 0), sid, h)


def read_frames(s, until_type, timeout=5):
    s.settimeout(timeout)
    buf = b""
    frames = []
    while True:
        while len(buf) >= 9:
            n = struct.unpack(">I", b"\x00" + buf[:3])[0]
            if len(buf) < 9 + n:
                break
            ft, fl, sid = buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7fffffff
            frames.append((ft, fl, sid, buf[9:9 + n]))
            buf = buf[9 + n:]
            if ft == until_type:
                return frames
        chunk = s.recv(65536)
        if not chunk:
            return frames
        buf += chunk


def raw(node):
    host, port = node.addr.split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_raw_http2_call(node, pb):
    with raw(node) as s:
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/LiveCheck")
                  + frame(0, 0x1, 1, b"\x00\x00\x00\x00\x00"))
        frames = read_frames(s, 0)
        data = [f for f in frames if f[0] == 0 and f[2] == 1]
        assert data and data[0][3] == b"\x00\x00\x00\x00\x00"  # an empty LiveCheckResp


def test_garbage_and_resets_mid_call(node, pb):
    # bytes that are not HTTP/2: the connection is closed
    with raw(node) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 1000)
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
    # a frame whose length overruns what the peer may send, after a valid preface
    with raw(node) as s:
        s.sendall(PREFACE + frame(4, 0, 0) + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 100)
        read_frames(s, 7)  # GOAWAY (or close)
    # calls cut mid-message, mid-headers, with many streams open, then the socket reset
    for cut in range(6):
        with raw(node) as s:
            msg = node.pb2.GetRateLimitsReq(requests=[req(pb, f"cut-{cut}")]).SerializeToString()
            body = b"\x00" + struct.pack(">I", len(msg)) + msg
            out = PREFACE + frame(4, 0, 0)
            for sid in range(1, 40, 2):
                out += request_headers(sid, "/pb.gubernator.V1/GetRateLimits")
                out += frame(0, 0, sid, body[:len(body) // 2])
            out += request_headers(41, "/pb.gubernator.V1/GetRateLimits", end_stream=False)
            s.sendall(out[:len(out) - cut * 7])
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # RST: closed with SO_LINGER 0
    # a complete call whose client resets before reading the answer
    for _ in range(20):
        s = raw(node)
        msg = node.pb2.GetRateLimitsReq(requests=[req(pb, "reset")]).SerializeToString()
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/GetRateLimits")
                  + frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    # RST_STREAM mid-call, then a good call on the same connection
    with raw(node) as s:
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/LiveCheck")
                  + frame(3, 0, 1, struct.pack(">I", 8))
                  + request_headers(3, "/pb.gubernator.V1/LiveCheck")
                  + frame(0, 0x1, 3, b"\x00\x00\x00\x00\x00"))
        frames = read_frames(s, 0)
        assert any(f[0] == 0 and f[2] == 3 for f in frames)
    # the node still serves
    assert node.one(req(pb, "after-garbage")).remaining == 9


def test_concurrent_calls_over_mutual_tls_after_reload(start_role, tmp_path, pb):
    p = pki(tmp_path)
    gport = free_port()
    proc = start_rl(start_role, mtls_args(p, internal=True), gport)
    addr = f"127.0.0.1:{gport}"
    wait_until(lambda: live(pb, grpc_tls_channel(addr, p)), 20, what="LiveCheck over mTLS")

    def many(ch, prefix):
        stub = pb[1].V1Stub(ch)
        futs = [stub.GetRateLimits.future(pb[0].GetRateLimitsReq(
            requests=[req(pb, f"{prefix}-{i % 50}", limit=100)]), timeout=30)
            for i in range(300)]
        assert all(f.result().responses[0].error == "" for f in futs)
        ch.close()
    many(grpc_tls_channel(addr, p), "a")
    # a certificate from another CA in place, SIGHUP: new connections get it
    d2 = tmp_path / "certs2"
    d2.mkdir()
    ca2, cert2, key2 = make_certs(d2)
    client = dict(p, cert=str(tmp_path / "client-cert.pem"), key=str(tmp_path / "client.key"))
    shutil.copy(p["cert"], client["cert"])  # still signed by --tls-ca: the client's identity
    shutil.copy(p["key"], client["key"])
    shutil.copy(cert2, p["cert"])
    shutil.copy(key2, p["key"])
    proc.signal(signal.SIGHUP)
    wait_until(lambda: "tls certificate reloaded" in proc.tail(100000), 20, what="reload")
    assert not live(pb, grpc_tls_channel(addr, client))  # the old CA no longer verifies it
    many(grpc_tls_channel(addr, client, ca=ca2), "b")


# serial: the answer must come within 450 ms (before the 500 ms peer deadline), a bound
# other tests' load on the machine can exceed.
@pytest.mark.serial
def test_server_deadline_while_a_peer_is_hung(cluster, pb):
    """grpc-timeout passes while the call waits for a stopped owner (its peer deadline is
    500 ms): the server itself answers DEADLINE_EXCEEDED (a Trailers-Only HEADERS frame,
    no DATA) at ~100 ms, then drops the late decision."""
    pb2 = pb[0]
    victim = cluster[1]
    owners = owners_of(cluster, pb, [f"sdl-{i}" for i in range(300)])
    key = next(k for k, o in owners.items() if o == victim.addr)
    errs0 = cluster[0].metric("stripedb_ratelimit_grpc_errors_total")
    victim.proc.p.send_signal(signal.SIGSTOP)
    try:
        msg = pb2.GetRateLimitsReq(requests=[req(pb, key, behavior=pb2.NO_BATCHING)]) \
            .SerializeToString()
        with raw(cluster[0]) as s:
            t0 = time.monotonic()
            s.sendall(PREFACE + frame(4, 0, 0)
                      + request_headers(1, "/pb.gubernator.V1/GetRateLimits",
                                        extra=[("grpc-timeout", "100m")])
                      + frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
            frames = []
            while not any(f[0] == 1 and f[2] == 1 and f[1] & 0x1 for f in frames):
                got = read_frames(s, 1)
                assert got, "connection closed"
                frames += got
            took = time.monotonic() - t0
        assert not any(f[0] == 0 and f[2] == 1 for f in frames)  # no answer message
        assert took < 0.45, took  # before the 500 ms peer deadline
        assert cluster[0].metric("stripedb_ratelimit_grpc_errors_total") == errs0 + 1
    finally:
        victim.proc.p.send_signal(signal.SIGCONT)
    time.sleep(0.6)  # the late decision arrives and is dropped
    assert cluster[0].one(req(pb, "after-sdl")).remaining == 9


def test_random_frames(node, pb):
    """300 connections of seeded random HTTP/2 frames (HEADERS for every path, DATA with
    and without a gRPC prefix, unknown types and flags, RST_STREAM, WINDOW_UPDATE, bad
    stream ids), cut at random, reset or read to the end: the node keeps serving (and,
    in an ASan build, the run's log stays clean: conftest checks it)."""
    import random
    rnd = random.Random(23)
    paths = ["/pb.gubernator.V1/GetRateLimits", "/pb.gubernator.V1/HealthCheck",
             "/pb.gubernator.V1/LiveCheck", "/pb.gubernator.PeersV1/GetPeerRateLimits",
             "/pb.gubernator.PeersV1/UpdatePeerGlobals", "/nope"]
    for _ in range(300):
        out = PREFACE + frame(4, 0, 0)
        for _ in range(rnd.randint(1, 30)):
            sid = rnd.choice([1, 3, 5, 7, 9, 2, 0, 11, 13])
            t = rnd.random()
            if t < 0.3:
                out += request_headers(sid, rnd.choice(paths), end_stream=rnd.random() < 0.2)
            elif t < 0.6:
                body = rnd.randbytes(rnd.randint(0, 40))
                if rnd.random() < 0.5:
                    body = b"\x00" + struct.pack(">I", len(body)) + body
                out += frame(0, rnd.choice([0, 1, 8, 9]), sid, body)
            elif t < 0.7:
                out += frame(rnd.randint(0, 10), rnd.getrandbits(8), sid,
                             rnd.randbytes(rnd.randint(0, 20)))
            elif t < 0.8:
                out += frame(3, 0, sid, struct.pack(">I", rnd.randint(0, 14)))
            else:
                out += frame(8, 0, sid, struct.pack(">I", rnd.randint(0, 2**31)))
        if rnd.random() < 0.3:
            out = out[:rnd.randint(0, len(out))]
        with raw(node) as s:
            try:
                s.sendall(out)
                if rnd.random() < 0.5:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    s.settimeout(0.2)
                    while s.recv(65536):
                        pass
            except OSError:
                pass
    assert node.one(req(pb, "after-random")).remaining == 9


def call_frames(s, sid):
    """Frames of stream sid until its END_STREAM (HEADERS or DATA), or RST_STREAM."""
    s.settimeout(10)
    buf, frames = b"", []
    while True:
        while len(buf) >= 9:
            n = struct.unpack(">I", b"\x00" + buf[:3])[0]
            if len(buf) < 9 + n:
                break
            f = (buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7fffffff, buf[9:9 + n])
            frames.append(f)
            buf = buf[9 + n:]
            if f[2] == sid and (f[0] == 3 or (f[0] in (0, 1) and f[1] & 0x1)):
                return frames
        chunk = s.recv(65536)
        assert chunk, ("connection closed", frames)
        buf += chunk


def test_huge_grpc_timeout_is_no_deadline(node, pb):
    """grpc-timeout values whose nanoseconds wrap uint64 (x * unit, or now + timeout) are
    no deadline: the call is answered, not DEADLINE_EXCEEDED at once."""
    from hpack import Decoder
    for i, t in enumerate(["5124095H", "99999999H", "99999999M", "9999999S"]):
        msg = node.pb2.GetRateLimitsReq(requests=[req(pb, f"ht-{i}")]).SerializeToString()
        with raw(node) as s:
            s.sendall(PREFACE + frame(4, 0, 0)
                      + request_headers(1, "/pb.gubernator.V1/GetRateLimits",
                                        extra=[("grpc-timeout", t)])
                      + frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
            frames = call_frames(s, 1)
        data = b"".join(f[3] for f in frames if f[0] == 0 and f[2] == 1)
        assert data, (t, frames)
        dec, hdrs = Decoder(), []
        for f in frames:
            if f[0] == 1 and f[2] == 1:
                hdrs += dec.decode(f[3])
        assert ("grpc-status", "0") in [(k.decode() if isinstance(k, bytes) else k,
                                         v.decode() if isinstance(v, bytes) else v)
                                        for k, v in hdrs], (t, hdrs)
        r = node.pb2.GetRateLimitsResp.FromString(data[5:])
        assert r.responses[0].remaining == 9, t



def test_malformed_grpc_timeout_is_refused(node, pb):
    """A grpc-timeout that is not 1-8 digits and a unit is refused (INTERNAL, as grpc-go),
    not run without the deadline the client asked for."""
    from hpack import Decoder
    for i, t in enumerate(["abc", "10x", "-5S", "123456789S", "S"]):
        msg = node.pb2.GetRateLimitsReq(requests=[req(pb, f"mt-{i}")]).SerializeToString()
        with raw(node) as s:
            s.sendall(PREFACE + frame(4, 0, 0)
                      + request_headers(1, "/pb.gubernator.V1/GetRateLimits",
                                        extra=[("grpc-timeout", t)])
                      + frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
            frames = call_frames(s, 1)
        dec, hdrs = Decoder(), []
        for f in frames:
            if f[0] == 1 and f[2] == 1:
                hdrs += dec.decode(f[3])
        hd = [(k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
              for k, v in hdrs]
        assert ("grpc-status", "13") in hd, (t, hd)


def grpc_status(frames, sid):
    from hpack import Decoder
    dec, hdrs = Decoder(), {}
    for f in frames:
        if f[0] == 1:
            for k, v in dec.decode(f[3]):
                if f[2] == sid:
                    hdrs[k.decode() if isinstance(k, bytes) else k] = \
                        v.decode() if isinstance(v, bytes) else v
    return hdrs.get("grpc-status")


def test_max_header_list_size(node, pb):
    """The server advertises SETTINGS_MAX_HEADER_LIST_SIZE 16 KiB (gRPC core's metadata
    limit) and answers RESOURCE_EXHAUSTED to a call whose metadata is larger."""
    from hpack import Encoder
    msg = node.pb2.GetRateLimitsReq(requests=[req(pb, "mhl")]).SerializeToString()
    body = frame(0, 0x1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg)

    def call(extra):
        enc = Encoder()
        h = enc.encode([(":method", "POST"), (":scheme", "http"),
                        (":path", "/pb.gubernator.V1/GetRateLimits"),
                        (":authority", "localhost"), ("content-type", "application/grpc"),
                        ("te", "trailers")] + extra, huffman=False)
        with raw(node) as s:
            s.sendall(PREFACE + frame(4, 0, 0))
            first = read_frames(s, 4)
            settings = first[0][3]
            got = {struct.unpack(">H", settings[i:i + 2])[0]:
                   struct.unpack(">I", settings[i + 2:i + 6])[0]
                   for i in range(0, len(settings), 6)}
            assert got.get(6) == 16384, got
            chunks = [h[i:i + 8000] for i in range(0, len(h), 8000)]
            out = frame(1, 0x4 if len(chunks) == 1 else 0, 1, chunks[0])
            for k, ch in enumerate(chunks[1:], 1):
                out += frame(9, 0x4 if k == len(chunks) - 1 else 0, 1, ch)
            s.sendall(out + body)
            return grpc_status(call_frames(s, 1), 1)
    assert call([("x-md", "v" * 14000)]) == "0"
    assert call([(f"x-md-{i}", "v" * 1000) for i in range(17)]) == "8"
    assert call([("x-md", "v" * 40000)]) == "8"
    assert node.one(req(pb, "mhl")).remaining == 8  # only the first call counted


def read_until_closed(s, timeout=15):
    s.settimeout(timeout)
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    frames = []
    while len(buf) >= 9:
        n = struct.unpack(">I", b"\x00" + buf[:3])[0]
        if len(buf) < 9 + n:
            break
        frames.append((buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7fffffff,
                       buf[9:9 + n]))
        buf = buf[9 + n:]
    return frames


def goaways(frames):
    return [(struct.unpack(">I", f[3][:4])[0] & 0x7fffffff, struct.unpack(">I", f[3][4:8])[0])
            for f in frames if f[0] == 7]


def test_shutdown_sends_goaway(start_role, pb):
    """On SIGTERM the server sends GOAWAY as gRPC core's graceful shutdown does: a notice
    (last stream 2^31-1, NO_ERROR), then the final GOAWAY naming the last stream it
    processed, before it closes the connection."""
    from test_ratelimit_grpc import start_nodes
    (nd,) = start_nodes(start_role, pb, 1)
    with raw(nd) as s:
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(3, "/pb.gubernator.V1/LiveCheck")
                  + frame(0, 0x1, 3, b"\x00\x00\x00\x00\x00"))
        call_frames(s, 3)
        nd.proc.signal(signal.SIGTERM)
        frames = read_until_closed(s)
    assert goaways(frames) == [(2**31 - 1, 0), (3, 0)], frames


def closed_within(s, secs):
    """True when the peer closes s (EOF or reset) within secs."""
    s.settimeout(secs)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_handshake_and_idle_timeouts(start_role, pb):
    """A connection without the preface and SETTINGS in GUBER_GRPC_HANDSHAKE_TIMEOUT is
    closed; one without open streams for GUBER_GRPC_MAX_CONN_IDLE gets GOAWAY, then closed;
    one with a call in progress stays."""
    from test_ratelimit_grpc import start_nodes
    (nd,) = start_nodes(start_role, pb, 1, env={"GUBER_GRPC_HANDSHAKE_TIMEOUT": "1s",
                                                "GUBER_GRPC_MAX_CONN_IDLE": "1500ms"})
    with raw(nd) as s:  # nothing sent
        t0 = time.monotonic()
        assert closed_within(s, 5)
        assert 0.8 < time.monotonic() - t0 < 4
    with raw(nd) as s:  # half a preface
        s.sendall(PREFACE[:10])
        assert closed_within(s, 5)
    with raw(nd) as s:  # idle after one call
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/LiveCheck")
                  + frame(0, 0x1, 1, b"\x00\x00\x00\x00\x00"))
        call_frames(s, 1)
        t0 = time.monotonic()
        frames = read_until_closed(s, 6)
        assert 1.2 < time.monotonic() - t0 < 5
        assert goaways(frames) == [(1, 0)], frames
    with raw(nd) as s:  # a stream open (no END_STREAM) for longer than the idle time
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/LiveCheck"))
        assert not closed_within(s, 3)
        s.sendall(frame(0, 0x1, 1, b"\x00\x00\x00\x00\x00"))
        assert any(f[0] == 0 for f in call_frames(s, 1))
    assert nd.one(req(pb, "after-idle")).remaining == 9


def test_connection_cap(start_role, pb):
    """Beyond GUBER_GRPC_MAX_CONNS open connections, a new one is closed at once; /healthz
    still answers, and once connections close new ones are served again."""
    from conftest import http_get
    from test_ratelimit_grpc import start_nodes
    (nd,) = start_nodes(start_role, pb, 1, env={"GUBER_GRPC_MAX_CONNS": "4"})
    nd.channel.close()
    time.sleep(0.5)
    socks = []
    try:
        for _ in range(4):
            s = raw(nd)
            s.sendall(PREFACE + frame(4, 0, 0))
            read_frames(s, 4)
            socks.append(s)
        extra = raw(nd)
        assert closed_within(extra, 3)
        extra.close()
        assert http_get(nd.proc.http_port, "/healthz", timeout=2)[0] == 200
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)
    with raw(nd) as s:
        s.sendall(PREFACE + frame(4, 0, 0) + request_headers(1, "/pb.gubernator.V1/LiveCheck")
                  + frame(0, 0x1, 1, b"\x00\x00\x00\x00\x00"))
        assert any(f[0] == 0 for f in call_frames(s, 1))


def test_window_zero_client_memory_is_bounded(start_role, pb):
    """A client that keeps its flow-control window at 0 never receives an answer: the
    server holds at most 256 streams' packed answers per connection (the answer slots are
    freed once packed), refuses more streams, and its RSS stays bounded. (ASan's
    quarantine of freed memory is kept small here, so that RSS measures what is held.)"""
    import os
    import threading
    from test_ratelimit_grpc import start_nodes
    asan = os.environ.get("ASAN_OPTIONS", "")
    (node,) = start_nodes(start_role, pb, 1, env={
        "ASAN_OPTIONS": (asan + ":" if asan else "") + "quarantine_size_mb=4"})
    msg = node.pb2.GetRateLimitsReq(requests=[req(pb, f"w0-{i}", hits=0, limit=1000)
                                              for i in range(1000)]).SerializeToString()
    body = b"\x00" + struct.pack(">I", len(msg)) + msg
    pid = node.proc.p.pid
    rss0 = vm_rss_kb(pid)
    seen = {"rst": 0, "refused": 0, "data": 0, "bytes": 0}
    with raw(node) as s:
        def drain():
            buf = b""
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                    seen["bytes"] += len(chunk)
                    while len(buf) >= 9:
                        n = struct.unpack(">I", b"\x00" + buf[:3])[0]
                        if len(buf) < 9 + n:
                            break
                        if buf[3] == 3:
                            seen["rst"] += 1
                            seen["refused"] += struct.unpack(">I", buf[9:13])[0] == 7
                        elif buf[3] == 0 and n > 0:
                            seen["data"] += 1
                        buf = buf[9 + n:]
            except OSError:
                return
        th = threading.Thread(target=drain, daemon=True)
        th.start()
        # SETTINGS_INITIAL_WINDOW_SIZE 0: no DATA may be sent to us
        s.sendall(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 0)))
        time.sleep(0.2)
        for k in range(600):
            sid = 1 + 2 * k
            out = request_headers(sid, "/pb.gubernator.V1/GetRateLimits")
            for i in range(0, len(body), 16384):
                out += frame(0, 0x1 if i + 16384 >= len(body) else 0, sid, body[i:i + 16384])
            s.sendall(out)
        # every stream is either answered (its answer packed, waiting for a window) or refused
        wait_until(lambda: seen["rst"] + node.metric(
            "stripedb_ratelimit_grpc_decisions_total") // 1000 >= 600, 60,
            what="every stream answered or refused")
        time.sleep(1)
        rss1 = vm_rss_kb(pid)
        assert seen["data"] == 0, seen
        assert seen["refused"] > 0, seen  # streams over the concurrency limit
        print("window-0:", seen, "rss growth kB", rss1 - rss0)
        assert rss1 - rss0 < 300 * 1024, (rss0, rss1)
    assert node.one(req(pb, "after-w0")).remaining == 9


def test_orphaned_calls_count_in_the_connection_budget(start_role, pb):
    """Calls forwarded to a hung owner whose streams the client resets stay pending (their
    answer slots, ~264 KB for 1000 keys, held until the peer answers or times out): they
    count in the connection's 64 MiB budget, beyond which new streams are refused with
    RST_STREAM REFUSED_STREAM; the node serves again once they complete."""
    from test_ratelimit_grpc import start_nodes
    nodes = start_nodes(start_role, pb, 3, env={"GUBER_BATCH_TIMEOUT": "4s"})
    victim = nodes[1]
    owners = {}
    for part in range(3):
        owners.update(owners_of(nodes, pb, [f"orph-{part}-{i}" for i in range(1000)]))
    keys = [k for k, o in owners.items() if o == victim.addr][:1000]
    assert len(keys) > 500
    msg = nodes[0].pb2.GetRateLimitsReq(requests=[req(pb, k) for k in keys]).SerializeToString()
    body = b"\x00" + struct.pack(">I", len(msg)) + msg
    victim.proc.p.send_signal(signal.SIGSTOP)
    try:
        with raw(nodes[0]) as s:
            s.sendall(PREFACE + frame(4, 0, 0))
            for k in range(400):
                sid = 1 + 2 * k
                out = request_headers(sid, "/pb.gubernator.V1/GetRateLimits")
                for i in range(0, len(body), 16384):
                    out += frame(0, 0x1 if i + 16384 >= len(body) else 0, sid,
                                 body[i:i + 16384])
                s.sendall(out + frame(3, 0, sid, struct.pack(">I", 8)))  # CANCEL
            # a LiveCheck after them: refused as well while the orphans hold the budget
            s.sendall(request_headers(801, "/pb.gubernator.V1/LiveCheck")
                      + frame(0, 0x1, 801, b"\x00\x00\x00\x00\x00"))
            frames = call_frames(s, 801)
        refused = [f for f in frames if f[0] == 3 and struct.unpack(">I", f[3])[0] == 7]
        assert refused, frames[-5:]
        assert refused[-1][2] == 801
    finally:
        victim.proc.p.send_signal(signal.SIGCONT)
    time.sleep(1)
    assert nodes[0].one(req(pb, "after-orphans")).remaining == 9
