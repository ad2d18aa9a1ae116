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
#
# Usage: tests/bench/ratelimit_bench.sh BUILD_DIR [SECONDS]
#   BUILD_DIR: an optimised build (configure without --enable-debug/--enable-sanitizers)
#   env: RL_CONNS (concurrent HTTP/Redis clients, default 64), RL_KEYS (default 10000),
#        RL_THREADS (client/API threads, default nproc)
# Needs: wrk, redis-server, redis-cli, redis-benchmark (Debian packages wrk, redis-server,
# redis-tools).
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
kill "$RPID"
wait "$RPID" || true
RPID=

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
for f in ("mem1", "mem2"):
    m = kv(f)
    print(f"memory: cache={m['cache']} keys inserted={m['keys']} held={m['held']} "
          f"heap bytes/key={m['heap_bytes_per_key']} rss bytes/key={m['rss_bytes_per_key']} "
          f"within capacity={m['within_capacity']}")
PY
