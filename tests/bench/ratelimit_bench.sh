#!/bin/sh
# Rate limiter benchmark (issue #3): the same token-bucket workload (one request per call,
# hits 1, limit 100 per minute, RL_KEYS distinct keys) through
#   (a) the in-process C API (tests/bench/ratelimit_bench api),
#   (b) the HTTP/JSON gateway of `stripedb --role=ratelimit` driven by wrk,
#   (d) redis-server with the EVALSHA script ratelimit_token_bucket.lua, driven by
#       redis-benchmark,
# side by side in one run, then the cache memory measurement with 1,000,000 keys.
#   (c) the gRPC service of the same process, driven by tests/bench/ratelimit_grpc_bench
#       (a C client on gRPC's C core, --conns calls in flight over --threads channels),
#       and by h2load (nghttp2's C HTTP/2 load generator, which sends one ready-made gRPC
#       message per call and costs the machine about what redis-benchmark does: the
#       like-for-like client for issue #23's gRPC vs Redis ratio; one key, as h2load sends
#       the same body every call, so Redis is also measured on one key),
#
# Usage: tests/bench/ratelimit_bench.sh BUILD_DIR [SECONDS]
#   BUILD_DIR: an optimised build (configure without --enable-debug/--enable-sanitizers)
#   env: RL_CONNS (concurrent HTTP/Redis clients, default 64), RL_KEYS (default 10000),
#        RL_THREADS (client/API threads, default nproc)
# Needs: wrk, redis-server, redis-cli, redis-benchmark, h2load (Debian packages wrk,
# redis-server, redis-tools, nghttp2-client).
set -eu
B=$(cd "${1:?usage: $0 BUILD_DIR [SECONDS]}" && pwd)
SECS=${2:-10}
here=$(cd "$(dirname "$0")" && pwd)
BIN=$B/stripedb
BENCH=$B/tests/bench/ratelimit_bench
CONNS=${RL_CONNS:-64}
KEYS=${RL_KEYS:-10000}
THREADS=${RL_THREADS:-$(nproc)}
tmp=$(mktemp -d)
RLPID=
RPID=

cleanup() {
	if [ -n "$RLPID" ]; then kill "$RLPID" 2>/dev/null || true; wait "$RLPID" 2>/dev/null || true; fi
	if [ -n "$RPID" ]; then kill "$RPID" 2>/dev/null || true; wait "$RPID" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# poll CMD until it succeeds, at most 20 s
wait_for() {
	i=0
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 400 ]; then echo "timed out waiting for: $*" >&2; exit 1; fi
		sleep 0.05
	done
}

echo "# machine: $(nproc) CPUs, $(uname -sr); keys=$KEYS conns=$CONNS threads=$THREADS seconds=$SECS"

echo "# (a) in-process C API"
"$BENCH" api --threads 1 --ops 2000000 --keys "$KEYS" | tee "$tmp/api1"
"$BENCH" api --threads "$THREADS" --ops 2000000 --keys "$KEYS" | tee "$tmp/api"
"$BENCH" api --threads "$THREADS" --ops 2000000 --keys "$KEYS" --batch 100 | tee "$tmp/api_batch"

echo "# (b) HTTP/JSON gateway, wrk -t $THREADS -c $CONNS"
HP=$(free_port)
GP=$(free_port)
"$BIN" --role=ratelimit --http-listen=127.0.0.1:$HP --grpc-listen=127.0.0.1:$GP \
	--log-level=warn >"$tmp/stripedb.log" 2>&1 &
RLPID=$!
wait_for curl -sf "http://127.0.0.1:$HP/v1/LiveCheck"
RL_KEYS=$KEYS wrk -t "$THREADS" -c "$CONNS" -d "${SECS}s" -s "$here/ratelimit_wrk.lua" \
	"http://127.0.0.1:$HP/v1/GetRateLimits" >"$tmp/wrk.out"
grep '^http ' "$tmp/wrk.out" | tee "$tmp/http"

echo "# (c) gRPC GetRateLimits, ratelimit_grpc_bench (C client on gRPC C core): $CONNS calls in flight over $THREADS channels"
"$B/tests/bench/ratelimit_grpc_bench" --addr "127.0.0.1:$GP" --conns "$CONNS" \
	--threads "$THREADS" --seconds "$SECS" --keys "$KEYS" | tee "$tmp/grpc"
"$B/tests/bench/ratelimit_grpc_bench" --addr "127.0.0.1:$GP" --conns "$CONNS" \
	--threads "$THREADS" --seconds "$SECS" --keys "$KEYS" --batch 100 | tee "$tmp/grpc_batch"

echo "# (c') gRPC GetRateLimits, h2load: $CONNS connections, one call in flight each, $THREADS threads, one key"
# the gRPC message (length-prefixed, uncompressed) of GetRateLimitsReq{requests: [{name:
# "requests_per_sec", unique_key: "account:0000000", hits: 1, limit: 100, duration: 60000}]}
/usr/bin/python3 - "$tmp/grpc_body" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | 0x80]) if n else bytes([b])
        if not n:
            return out
def field(num, wire, payload):
    return varint(num << 3 | wire) + payload
def string(num, v):
    return field(num, 2, varint(len(v)) + v.encode())
def integer(num, v):
    return field(num, 0, varint(v))
req = string(1, "requests_per_sec") + string(2, "account:0000000") + integer(3, 1) + integer(4, 100) + integer(5, 60000)
msg = field(1, 2, varint(len(req)) + req)
open(sys.argv[1], "wb").write(b"\x00" + struct.pack(">I", len(msg)) + msg)
PY
decisions() {
	curl -sf "http://127.0.0.1:$HP/metrics" |
		awk '/^stripedb_ratelimit_decisions_total\{status="(under|over)_limit"\}/ {n += $2} END {printf "%d", n}'
}
errors() {
	curl -sf "http://127.0.0.1:$HP/metrics" |
		awk '/^stripedb_ratelimit_decisions_total\{status="error"\}/ {printf "%d", $2}'
}
d0=$(decisions)
e0=$(errors)
h2load -D "$SECS" --warm-up-time=1 -c "$CONNS" -m 1 -t "$THREADS" \
	-H 'content-type: application/grpc' -H 'te: trailers' -d "$tmp/grpc_body" \
	"http://127.0.0.1:$GP/pb.gubernator.V1/GetRateLimits" >"$tmp/h2load.out" 2>&1
d1=$(decisions)
# every call h2load counts must be a decision the server made (h2load sees HTTP status 200
# and cannot read grpc-status): the server's decision counter grew by at least that much
/usr/bin/python3 - "$tmp/h2load.out" "$d0" "$d1" "$(($(errors) - e0))" <<'PY' | tee "$tmp/grpc_h2"
import re, sys
out = open(sys.argv[1]).read()
d0, d1, errs = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4] or 0)
rate = float(re.search(r"finished in [^,]+, ([0-9.]+) req/s", out).group(1))
ok = int(re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out).group(1))
mean = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out).group(3)
us = float(mean[:-2]) if mean.endswith("us") else float(mean[:-2]) * 1000 if mean.endswith("ms") else float(mean[:-1]) * 1e6
if d1 - d0 < ok or errs:
    sys.exit(f"h2load counted {ok} calls but the server made {d1 - d0} decisions ({errs} errors)")
print(f"grpc_h2load rate={rate:.0f} mean_us={us:.0f} calls={ok} server_decisions={d1 - d0}")
PY
kill "$RLPID"
wait "$RLPID" || true
RLPID=

echo "# (d) redis-server + EVALSHA token bucket, redis-benchmark -c $CONNS"
RP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
RPID=$!
wait_for redis-cli -p "$RP" ping
SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat "$here/ratelimit_token_bucket.lua")")
# as many calls as HTTP managed in SECS, at least 200000
N=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^requests=/) {split($i, a, "="); print a[2]}}' "$tmp/http")
[ "${N:-0}" -lt 200000 ] && N=200000
redis-benchmark -p "$RP" -c "$CONNS" -n "$N" -r "$KEYS" --threads "$THREADS" --csv \
	EVALSHA "$SHA" 1 "rl:__rand_int__" 100 60000 1 >"$tmp/redis.csv"
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
tail -1 "$tmp/redis.csv" | tr -d '"' | awk -F, '{printf "redis rate=%.0f p50_us=%.0f p99_us=%.0f\n", $2, $5 * 1000, $7 * 1000}' | tee "$tmp/redis"
# one key, the like-for-like of h2load's gRPC row, with as many client threads
redis-benchmark -p "$RP" -c "$CONNS" -n "$N" --threads "$THREADS" --csv \
	EVALSHA "$SHA" 1 "rl:account:0000000" 100 60000 1 >"$tmp/redis1.csv"
tail -1 "$tmp/redis1.csv" | tr -d '"' | awk -F, '{printf "redis_one_key rate=%.0f mean_us=%.0f p50_us=%.0f p99_us=%.0f\n", $2, $3 * 1000, $5 * 1000, $7 * 1000}' | tee "$tmp/redis1"
kill "$RPID"
wait "$RPID" || true
RPID=

echo "# (a') C API scaling: 1 thread vs 2 on one limiter vs 2 on a limiter each, alternated"
"$BENCH" scale --threads 2 --rounds 9 --ops 2000000 --keys "$KEYS" | tee "$tmp/scale_rounds"
tail -1 "$tmp/scale_rounds" >"$tmp/scale"

echo "# cache memory, 1,000,000 distinct keys"
"$BENCH" memory --keys 1000000 --cache 1000000 | tee "$tmp/mem1"
"$BENCH" memory --keys 1000000 --cache 100000 | tee "$tmp/mem2"

echo "# summary (decisions/s, latency per call)"
/usr/bin/python3 - "$tmp" <<'PY'
import sys, os
d = sys.argv[1]
def kv(name):
    line = open(os.path.join(d, name)).read().split("\n")[0]
    return dict(x.split("=", 1) for x in line.split()[1:])
api1, api, apib, http, redis = kv("api1"), kv("api"), kv("api_batch"), kv("http"), kv("redis")
grpc, grpcb = kv("grpc"), kv("grpc_batch")
grpc_h2, redis1, scale = kv("grpc_h2"), kv("redis1"), kv("scale")
rows = [
    ("C API, 1 thread", float(api1["rate"]), int(api1["p50_ns"]) / 1000, int(api1["p99_ns"]) / 1000),
    (f"C API, {api['threads']} threads", float(api["rate"]), int(api["p50_ns"]) / 1000, int(api["p99_ns"]) / 1000),
    (f"C API, {apib['threads']} threads, batches of 100", float(apib["rate"]), int(apib["p50_ns"]) / 1000, int(apib["p99_ns"]) / 1000),
    ("HTTP/JSON (wrk)", float(http["rate"]), float(http["p50_us"]), float(http["p99_us"])),
    (f"gRPC (C core client, {grpc['conns']} in flight)", float(grpc["rate"]), float(grpc["p50_us"]), float(grpc["p99_us"])),
    (f"gRPC, batches of 100", float(grpcb["rate"]), float(grpcb["p50_us"]), float(grpcb["p99_us"])),
    ("Redis EVALSHA (redis-benchmark)", float(redis["rate"]), float(redis["p50_us"]), float(redis["p99_us"])),
]
r = float(redis["rate"])
print(f"| {'path':42} | {'decisions/s':>12} | {'p50 us':>9} | {'p99 us':>9} | {'x Redis':>8} |")
print(f"|{'-'*44}|{'-'*14}|{'-'*11}|{'-'*11}|{'-'*10}|")
for name, rate, p50, p99 in rows:
    print(f"| {name:42} | {rate:12.0f} | {p50:9.1f} | {p99:9.1f} | {rate / r:8.2f} |")
print(f"| {'gRPC, h2load, one key':42} | {float(grpc_h2['rate']):12.0f} | mean {float(grpc_h2['mean_us']):4.0f} | {'':9} | "
      f"{float(grpc_h2['rate']) / float(redis1['rate']):8.2f} | (x Redis one key)")
print(f"| {'Redis EVALSHA, one key':42} | {float(redis1['rate']):12.0f} | mean {float(redis1['mean_us']):4.0f} | {float(redis1['p99_us']):9.1f} | {1.0:8.2f} | (x Redis one key)")
print(f"C API scaling, 2 threads over 1 (median of {scale['rounds']} alternated rounds): "
      f"one shared limiter {scale['median_shared_ratio']}x, a limiter per thread (the machine's ceiling) "
      f"{scale['median_ceiling_ratio']}x, shared/ceiling {scale['median_shared_of_ceiling']}; "
      f"over the {scale['clean_rounds']} rounds whose 2-thread runs had both CPUs: "
      f"{scale['clean_median_shared_ratio']}x, ceiling {scale['clean_median_ceiling_ratio']}x, "
      f"shared/ceiling {scale['clean_median_shared_of_ceiling']}")
for f in ("mem1", "mem2"):
    m = kv(f)
    print(f"memory: cache={m['cache']} keys inserted={m['keys']} held={m['held']} "
          f"heap bytes/key={m['heap_bytes_per_key']} rss bytes/key={m['rss_bytes_per_key']} "
          f"within capacity={m['within_capacity']}")
PY
