"""The rate limiter's HTTP/JSON gateway (Gubernator's grpc-gateway API) on one node.

Starts `stripedb --role=ratelimit --http-listen=... --grpc-listen=...` and drives
POST /v1/GetRateLimits, GET /v1/HealthCheck and GET /v1/LiveCheck with urllib, through
Gubernator's documented scenarios with created_at, so every expected value is exact.
"""
import json
import time
import urllib.error
import urllib.request

import pytest

from conftest import free_port, http_get, wait_until

T0 = 1700000000000  # 2023-11-14T22:13:20Z


# HTTP port -> the node's gRPC address, which every decided answer names as its "owner"
OWNERS = {}


def start_rl(start_role, extra=(), env=None):
    grpc = free_port()
    p = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{grpc}", *extra], env=env)
    OWNERS[p.http_port] = f"127.0.0.1:{grpc}"
    # /healthz can answer before the role has registered its routes: wait for ours
    wait_until(lambda: http_get(p.http_port, "/v1/LiveCheck", timeout=1.0)[0] == 200,
               what="/v1/LiveCheck")
    return p.http_port


@pytest.fixture
def rl(start_role):
    """A one-node rate limiter; returns its HTTP port."""
    return start_rl(start_role)


def strip_owner(port, body):
    """Check metadata.owner of each decided response (this node) and remove it."""
    for r in body.get("responses", []):
        md = r.get("metadata", {})
        if r.get("error") == "":
            assert md.pop("owner") == OWNERS[port], r
        else:
            md.pop("owner", None)
    return body


def post(port, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/GetRateLimits", data=data,
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, strip_owner(port, json.loads(r.read()))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get_json(port, path):
    st, body = http_get(port, path)
    return st, json.loads(body)


def one(port, **req):
    st, body = post(port, {"requests": [req]})
    assert st == 200, body
    assert len(body["responses"]) == 1
    return body["responses"][0]


def resp(status, limit, remaining, reset_time, retry_after=0, error=""):
    """The exact JSON of a RateLimitResp: proto names, int64 as strings, enum names."""
    md = {} if error else {"retry_after": str(retry_after)}
    return {"status": status, "limit": str(limit), "remaining": str(remaining),
            "reset_time": str(reset_time), "error": error, "metadata": md}


def tb(port, key, hits, at, limit=2, duration=5000, **extra):
    return one(port, name="http_tb", unique_key=key, hits=hits, limit=limit,
               duration=duration, created_at=at, **extra)


def test_token_bucket_scenario(rl):
    # Gubernator's over-the-limit scenario: limit 2 per 5 s, hits 1, 1, 1.
    assert tb(rl, "a", 1, T0) == resp("UNDER_LIMIT", 2, 1, T0 + 5000)
    assert tb(rl, "a", 1, T0 + 1) == resp("UNDER_LIMIT", 2, 0, T0 + 5000)
    assert tb(rl, "a", 1, T0 + 2) == resp("OVER_LIMIT", 2, 0, T0 + 5000, retry_after=4998)
    # a query does not consume and is not over the limit
    assert tb(rl, "a", 0, T0 + 3) == resp("UNDER_LIMIT", 2, 0, T0 + 5000)
    # the window resets at reset_time
    assert tb(rl, "a", 1, T0 + 5000) == resp("UNDER_LIMIT", 2, 1, T0 + 10000)
    # negative hits give tokens back
    assert tb(rl, "a", -2, T0 + 5001) == resp("UNDER_LIMIT", 2, 3, T0 + 10000)


def test_token_bucket_behaviors(rl):
    assert tb(rl, "d", 1, T0, limit=10, behavior="DRAIN_OVER_LIMIT") == \
        resp("UNDER_LIMIT", 10, 9, T0 + 5000)
    assert tb(rl, "d", 100, T0, limit=10, behavior="DRAIN_OVER_LIMIT") == \
        resp("OVER_LIMIT", 10, 0, T0 + 5000, retry_after=-1)
    assert tb(rl, "d", 0, T0, limit=10, behavior=32) == resp("UNDER_LIMIT", 10, 0, T0 + 5000)
    assert tb(rl, "d", 1, T0 + 1, limit=10, behavior="RESET_REMAINING") == \
        resp("UNDER_LIMIT", 10, 10, T0 + 5000)
    # a changed limit takes effect at once (the difference is added)
    assert tb(rl, "d", 1, T0 + 2, limit=20) == resp("UNDER_LIMIT", 20, 19, T0 + 5000)


def test_leaky_bucket_scenario(rl):
    # Gubernator TestLeakyBucket: 10 per 30 s, one token leaks every 3 s.
    def lb(hits, at, **extra):
        return one(rl, name="http_lb", unique_key="k", hits=hits, limit=10, duration=30000,
                   algorithm="LEAKY_BUCKET", created_at=at, **extra)
    assert lb(1, T0) == resp("UNDER_LIMIT", 10, 9, T0 + 3000)
    assert lb(1, T0 + 1000) == resp("UNDER_LIMIT", 10, 8, T0 + 1000 + 6000)
    assert lb(1, T0 + 2000) == resp("UNDER_LIMIT", 10, 7, T0 + 2000 + 9000)
    assert lb(0, T0 + 3500) == resp("UNDER_LIMIT", 10, 8, T0 + 3500 + 6000)
    assert lb(8, T0 + 3500) == resp("UNDER_LIMIT", 10, 0, T0 + 3500 + 30000)
    # 1/6 of a token is left, but a leak counts once a whole token leaked since the last
    # (Gubernator's rule): one more hit is allowed 3 s from now, not 2.5 s
    assert lb(1, T0 + 3500) == resp("OVER_LIMIT", 10, 0, T0 + 3500 + 30000, retry_after=3000)
    assert lb(1, T0 + 6499)["status"] == "OVER_LIMIT"
    # burst: 20 tokens available at once, refilled at 10 per 30 s
    r = one(rl, name="http_lb", unique_key="burst", hits=15, limit=10, duration=30000,
            burst=20, algorithm=1, created_at=T0)
    assert r == resp("UNDER_LIMIT", 10, 5, T0 + 15 * 3000)


def test_gcra_extension(rl):
    def g(hits, at):
        return one(rl, name="http_gcra", unique_key="k", hits=hits, limit=10,
                   duration=1000, algorithm="GCRA", created_at=at)
    assert g(10, T0) == resp("UNDER_LIMIT", 10, 0, T0 + 1000)
    assert g(1, T0) == resp("OVER_LIMIT", 10, 0, T0 + 1000, retry_after=100)
    assert g(1, T0 + 100) == resp("UNDER_LIMIT", 10, 0, T0 + 1100)
    assert g(0, T0 + 600) == resp("UNDER_LIMIT", 10, 5, T0 + 1100)


def test_gregorian(rl):
    feb15 = 1707991200000  # 2024-02-15T10:00:00Z
    mar1 = 1709251200000   # 2024-03-01T00:00:00Z: February 2024 has 29 days
    r = one(rl, name="http_greg", unique_key="m", hits=1, limit=100, duration=4,
            behavior="DURATION_IS_GREGORIAN", created_at=feb15)
    assert r == resp("UNDER_LIMIT", 100, 99, mar1 - 1)
    r = one(rl, name="http_greg", unique_key="min", hits=1, limit=60, duration=0,
            behavior="DURATION_IS_GREGORIAN", created_at=feb15 + 1234)
    assert r == resp("UNDER_LIMIT", 60, 59, feb15 + 60000 - 1)
    r = one(rl, name="http_greg", unique_key="w", hits=1, limit=60, duration=3,
            behavior="DURATION_IS_GREGORIAN", created_at=feb15)
    assert r == resp("UNDER_LIMIT", 0, 0, 0,
                     error="`Duration = GregorianWeeks` not yet supported")


def test_gubernator_defects_fixed(rl):
    # ("a_b", "c") and ("a", "b_c") are two keys (Gubernator joins them with "_")
    r1 = one(rl, name="a_b", unique_key="c", hits=1, limit=1, duration=60000, created_at=T0)
    r2 = one(rl, name="a", unique_key="b_c", hits=1, limit=1, duration=60000, created_at=T0)
    assert r1 == resp("UNDER_LIMIT", 1, 0, T0 + 60000)
    assert r2 == resp("UNDER_LIMIT", 1, 0, T0 + 60000)
    # OVER_LIMIT does not stick after tokens come back
    assert tb(rl, "s", 1, T0, limit=1) == resp("UNDER_LIMIT", 1, 0, T0 + 5000)
    assert tb(rl, "s", 1, T0, limit=1) == resp("OVER_LIMIT", 1, 0, T0 + 5000, retry_after=5000)
    assert tb(rl, "s", -1, T0, limit=1) == resp("UNDER_LIMIT", 1, 1, T0 + 5000)
    assert tb(rl, "s", 1, T0, limit=1) == resp("UNDER_LIMIT", 1, 0, T0 + 5000)
    # a changed duration whose window has passed renews the bucket
    assert tb(rl, "dur", 2, T0, duration=10000) == resp("UNDER_LIMIT", 2, 0, T0 + 10000)
    assert tb(rl, "dur", 1, T0 + 6000, duration=5000) == resp("UNDER_LIMIT", 2, 1, T0 + 11000)
    # raising a leaky bucket's limit does not refill it
    def lb(hits, limit):
        return one(rl, name="http_lb", unique_key="raise", hits=hits, limit=limit,
                   duration=10000, algorithm="LEAKY_BUCKET", created_at=T0)
    assert lb(10, 10) == resp("UNDER_LIMIT", 10, 0, T0 + 10000)
    assert lb(0, 20) == resp("UNDER_LIMIT", 20, 0, T0 + 10000)


def test_input_spellings(rl):
    # camelCase names, int64 as strings, enum numbers and names, combined behaviors,
    # unknown fields ignored, null as unset, metadata accepted
    body = {"requests": [
        {"name": "spell", "uniqueKey": "k", "hits": "3", "limit": "10", "duration": "60000",
         "createdAt": str(T0), "algorithm": 0, "behavior": "NO_BATCHING|DRAIN_OVER_LIMIT",
         "burst": None, "metadata": {"tenant": "t1"}, "someFutureField": [1, 2]},
        {"name": "spell", "unique_key": "k", "hits": 2.0, "limit": 10, "duration": 60000,
         "created_at": T0 + 1, "algorithm": "TOKEN_BUCKET", "behavior": 0},
    ]}
    st, out = post(rl, body)
    assert st == 200
    assert out == {"responses": [resp("UNDER_LIMIT", 10, 7, T0 + 60000),
                                 resp("UNDER_LIMIT", 10, 5, T0 + 60000)]}
    # no requests: no responses
    assert post(rl, {}) == (200, {"responses": []})
    assert post(rl, {"requests": []}) == (200, {"responses": []})


def test_invalid_items_get_per_item_errors(rl):
    good = {"name": "inv", "unique_key": "k", "hits": 1, "limit": 5, "duration": 1000,
            "created_at": T0}
    cases = [
        ({"name": ""}, "field 'namespace' cannot be empty"),
        ({"unique_key": ""}, "field 'unique_key' cannot be empty"),
        ({"algorithm": 7},
         "invalid rate limit algorithm '7'; want TOKEN_BUCKET (0), LEAKY_BUCKET (1) or GCRA (2)"),
        ({"limit": -1}, "field 'limit' cannot be negative"),
        ({"duration": -5}, "field 'duration' cannot be negative"),
        ({"duration": 0},
         "field 'duration' must be greater than 0 (ms) unless DURATION_IS_GREGORIAN is set"),
        ({"behavior": 64}, "invalid behavior '64'; known bits are 1, 2, 4, 8, 16 and 32"),
    ]
    reqs = [dict(good, **patch) for patch, _ in cases] + [good]
    st, out = post(rl, {"requests": reqs})
    assert st == 200
    assert len(out["responses"]) == len(cases) + 1
    for (patch, msg), r in zip(cases, out["responses"]):
        assert r == resp("UNDER_LIMIT", 0, 0, 0, error=msg), patch
    # the valid item after them is decided normally
    assert out["responses"][-1] == resp("UNDER_LIMIT", 5, 4, T0 + 1000)


def test_key_length_limit(rl):
    """name + unique_key longer than 4096 bytes together is a per-item error (the cache is
    bounded in keys, so long keys would pin memory); 4096 exactly is decided."""
    good = {"name": "klen", "unique_key": "k", "hits": 1, "limit": 5, "duration": 1000,
            "created_at": T0}
    msg = "fields 'name' and 'unique_key' are longer than 4096 bytes together"
    reqs = [dict(good, unique_key="x" * (4096 - 4)),
            dict(good, unique_key="y" * (4096 - 3)),
            dict(good, unique_key="z" * (1 << 20)),
            dict(good, name="n" * 5000)]
    st, out = post(rl, {"requests": reqs})
    assert st == 200
    assert out["responses"][0] == resp("UNDER_LIMIT", 5, 4, T0 + 1000)
    for r in out["responses"][1:]:
        assert r == resp("UNDER_LIMIT", 0, 0, 0, error=msg)
    # nothing cached for the refused ones: only the one valid key
    st, body = http_get(rl, "/metrics")
    assert st == 200
    text = body.decode() if isinstance(body, bytes) else body
    assert "stripedb_ratelimit_cache_keys 1\n" in text


def test_call_errors(rl):
    item = {"name": "many", "unique_key": "k", "hits": 0, "limit": 5, "duration": 1000}
    st, out = post(rl, {"requests": [item] * 1001})
    assert st == 400
    assert out == {"code": 11, "message": "Requests.RateLimits list too large; max size is '1000'",
                   "details": []}
    st, out = post(rl, {"requests": [item] * 1000})
    assert st == 200
    assert len(out["responses"]) == 1000

    st, out = post(rl, b'{"requests": [', raw=True)
    assert st == 400
    assert out["code"] == 3
    assert out["message"].startswith("malformed JSON: ")
    assert out["details"] == []
    assert post(rl, b"", raw=True) == (400, {"code": 3, "details": [],
                                            "message": "empty request body: want a JSON object"})
    assert post(rl, b"[1,2]", raw=True) == (400, {"code": 3, "details": [],
                                                 "message": "malformed JSON: want an object"})
    assert post(rl, {"requests": {"a": 1}}) == (400, {
        "code": 3, "details": [], "message": "invalid value for field 'requests': want an array"})
    assert post(rl, {"requests": [dict(item, hits="x1")]}) == (400, {
        "code": 3, "details": [],
        "message": "invalid value for field 'hits': want an int64 (number or decimal string)"})
    assert post(rl, {"requests": [dict(item, hits=1.5)]})[0] == 400
    # an integer literal beyond int64 must not wrap (libbson's reader would make 2^64+1 a 1)
    huge = (b'{"requests": [{"name": "h", "unique_key": "k", "hits": 1, '
            b'"limit": 18446744073709551617, "duration": 1000}]}')
    assert post(rl, huge, raw=True) == (400, {
        "code": 3, "details": [],
        "message": "malformed JSON: an integer literal is outside the int64 range"})
    # digits inside strings are not numbers
    st, out = post(rl, {"requests": [dict(item, unique_key="1" * 40)]})
    assert st == 200 and out["responses"][0]["error"] == ""
    assert post(rl, {"requests": [dict(item, algorithm="FOO")]}) == (400, {
        "code": 3, "details": [],
        "message": "invalid value for enum field 'algorithm': want TOKEN_BUCKET, "
                   "LEAKY_BUCKET, GCRA or a number"})
    assert post(rl, {"requests": [dict(item, name=5)]}) == (400, {
        "code": 3, "details": [], "message": "invalid value for field 'name': want a string"})
    # the server is still fine
    assert get_json(rl, "/v1/LiveCheck") == (200, {})


def test_health_and_live_check(rl):
    assert get_json(rl, "/v1/HealthCheck") == (200, {"status": "healthy", "message": "",
                                                     "peer_count": 1,
                                                     "advertise_address": OWNERS[rl]})
    assert get_json(rl, "/v1/LiveCheck") == (200, {})
    st, _ = http_get(rl, "/v1/GetRateLimits")
    assert st == 405
    one(rl, name="m", unique_key="k", hits=1, limit=5, duration=1000, created_at=T0)
    st, body = http_get(rl, "/metrics")
    assert st == 200
    assert b'stripedb_ratelimit_decisions_total{status="under_limit"}' in body


def test_clock_without_created_at(rl):
    before = int(time.time() * 1000)
    r = one(rl, name="clock", unique_key="k", hits=1, limit=5, duration=60000)
    after = int(time.time() * 1000)
    assert r["status"] == "UNDER_LIMIT" and r["remaining"] == "4"
    assert before + 60000 <= int(r["reset_time"]) <= after + 60000


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cache_size(start_role, how):
    # a cache of one key: a second key evicts the first, which then starts afresh
    if how == "flag":
        port = start_rl(start_role, ["--cache-size=1"])
    else:
        port = start_rl(start_role, env={"GUBER_CACHE_SIZE": "1"})
    assert tb(port, "first", 1, T0) == resp("UNDER_LIMIT", 2, 1, T0 + 5000)
    assert tb(port, "first", 1, T0) == resp("UNDER_LIMIT", 2, 0, T0 + 5000)
    assert tb(port, "second", 1, T0) == resp("UNDER_LIMIT", 2, 1, T0 + 5000)
    assert tb(port, "first", 1, T0) == resp("UNDER_LIMIT", 2, 1, T0 + 5000)


@pytest.mark.parametrize("form", ["host", "any"])
def test_guber_http_address(start_role, form):
    # Gubernator's GUBER_HTTP_ADDRESS works when --http-listen is not given, also in Go's
    # ":PORT" form (every interface)
    port, grpc = free_port(), free_port()
    addr = f"127.0.0.1:{port}" if form == "host" else f":{port}"
    start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{grpc}"], http=False,
               env={"GUBER_HTTP_ADDRESS": addr})
    OWNERS[port] = f"127.0.0.1:{grpc}"
    wait_until(lambda: http_get(port, "/v1/LiveCheck", timeout=1.0)[0] == 200,
               what="LiveCheck on GUBER_HTTP_ADDRESS")
    assert tb(port, "g", 1, T0) == resp("UNDER_LIMIT", 2, 1, T0 + 5000)


def test_bad_cache_size_env(start_role):
    p = start_role(["--role=ratelimit"], env={"GUBER_CACHE_SIZE": "lots"}, wait=False)
    rc = p.p.wait(timeout=20)
    assert rc != 0
    assert "GUBER_CACHE_SIZE: want a positive integer, got 'lots'" in p.tail()


def test_three_nodes_forward_http_to_owner(start_role):
    # The gateway decides through the cluster: whichever node a client asks, a key's count
    # lives on its owner, named in metadata.owner.
    grpc = [free_port() for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{g}" for g in grpc)
    ports = []
    for g in grpc:
        p = start_role(["--role=ratelimit", f"--grpc-listen=127.0.0.1:{g}", f"--peers={peers}"])
        wait_until(lambda: http_get(p.http_port, "/v1/LiveCheck", timeout=1.0)[0] == 200,
                   what="/v1/LiveCheck")
        ports.append(p.http_port)
    addrs = {f"127.0.0.1:{g}" for g in grpc}
    for port, g in zip(ports, grpc):
        assert get_json(port, "/v1/HealthCheck") == (200, {"status": "healthy", "message": "",
                                                           "peer_count": 3,
                                                           "advertise_address":
                                                               f"127.0.0.1:{g}"})

    def raw_one(port, key, at):
        body = {"requests": [{"name": "fwd", "unique_key": key, "hits": 1, "limit": 10,
                              "duration": 60000, "created_at": at}]}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/GetRateLimits",
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
            return json.loads(r.read())["responses"][0]

    owners = set()
    for i in range(12):
        key = f"acct-{i}"
        answers = [raw_one(port, key, T0 + n) for n, port in enumerate(ports)]
        owner = answers[0]["metadata"]["owner"]
        assert owner in addrs
        owners.add(owner)
        for n, a in enumerate(answers):
            assert a == {"status": "UNDER_LIMIT", "limit": "10", "remaining": str(9 - n),
                         "reset_time": str(T0 + 60000), "error": "",
                         "metadata": {"owner": owner, "retry_after": "0"}}, (key, n)
    assert len(owners) >= 2  # 12 keys over 3 peers land on more than one owner
