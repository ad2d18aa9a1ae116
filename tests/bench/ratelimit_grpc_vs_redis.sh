#!/bin/sh
# Issue #23: gRPC one request per call vs Redis 7 EVALSHA, alternated rounds, with the
# server's CPU per call. The (c') and (d') rows of ratelimit_bench.sh alone: h2load (64
# connections, one call in flight each, one ready-made GetRateLimitsReq, one key) against
# `stripedb --role=ratelimit`, and redis-benchmark (64 connections, one key) against
# redis-server running ratelimit_token_bucket.lua with EVALSHA; both clients use
# RL_THREADS threads. Server CPU per call = (utime + stime of the server process over the
# run, /proc/PID/stat) / calls.
#
# Usage: tests/bench/ratelimit_grpc_vs_redis.sh SECONDS ROUNDS BIN [BIN...]
#   each BIN (a release stripedb) is measured in every round, then Redis, in the order
#   given in odd rounds and reversed in even ones.
# Needs: redis-server, redis-cli, redis-benchmark, h2load (Debian packages redis-server,
# redis-tools, nghttp2-client).
set -eu
SECS=${1:?usage: $0 SECONDS ROUNDS BIN [BIN...]}
ROUNDS=${2:?}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
CONNS=${RL_CONNS:-64}
THREADS=${RL_THREADS:-$(nproc)}
HZ=$(getconf CLK_TCK)
tmp=$(mktemp -d)
PID=
trap 'if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT INT TERM

free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() {
	i=0
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 400 ]; then echo "timed out waiting for: $*" >&2; exit 1; fi
		sleep 0.05
	done
}
decisions() { # under/over-limit decisions of the stripedb on $HP
	curl -sf "http://127.0.0.1:$HP/metrics" |
		awk '/^stripedb_ratelimit_decisions_total\{status="(under|over)_limit"\}/ {n += $2} END {printf "%d", n}'
}
cpu_ticks() { # utime + stime of process $1
	awk '{print $14 + $15}' "/proc/$1/stat"
}

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

grpc_run() { # BIN LABEL
	HP=$(free_port)
	GP=$(free_port)
	"$1" --role=ratelimit --http-listen=127.0.0.1:$HP --grpc-listen=127.0.0.1:$GP \
		--log-level=warn >"$tmp/stripedb.log" 2>&1 &
	PID=$!
	wait_for curl -sf "http://127.0.0.1:$HP/v1/LiveCheck"
	h2load -n 2000 -c "$CONNS" -m 1 -t "$THREADS" -H 'content-type: application/grpc' \
		-H 'te: trailers' -d "$tmp/grpc_body" \
		"http://127.0.0.1:$GP/pb.gubernator.V1/GetRateLimits" >/dev/null 2>&1 # warm-up
	d0=$(decisions)
	c0=$(cpu_ticks "$PID")
	h2load -D "$SECS" -c "$CONNS" -m 1 -t "$THREADS" \
		-H 'content-type: application/grpc' -H 'te: trailers' -d "$tmp/grpc_body" \
		"http://127.0.0.1:$GP/pb.gubernator.V1/GetRateLimits" >"$tmp/h2load.out" 2>&1
	c1=$(cpu_ticks "$PID")
	d1=$(decisions)
	kill "$PID"
	wait "$PID" || true
	PID=
	/usr/bin/python3 - "$tmp/h2load.out" "$c0" "$c1" "$HZ" "$2" "$((d1 - d0))" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
c0, c1, hz, label, dec = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
rate = float(re.search(r"finished in [^,]+, ([0-9.]+) req/s", out).group(1))
ok = int(re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out).group(1))
if dec < ok:  # h2load sees HTTP 200, not grpc-status: the server must have decided each
    sys.exit(f"{label}: h2load counted {ok} calls, the server made {dec} decisions")
print(f"{label} rate={rate:.0f} calls={ok} cpu_us_per_call={(c1 - c0) / hz * 1e6 / max(ok, 1):.1f}")
PY
}

redis_run() {
	RP=$(free_port)
	redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
	PID=$!
	wait_for redis-cli -p "$RP" ping
	SHA=$(redis-cli -p "$RP" SCRIPT LOAD "$(cat "$here/ratelimit_token_bucket.lua")")
	redis-benchmark -p "$RP" -c "$CONNS" -n 2000 --threads "$THREADS" -q \
		EVALSHA "$SHA" 1 "rl:account:0000000" 100 60000 1 >/dev/null 2>&1 # warm-up
	# as many calls as the gRPC run of this round made (the last line of $tmp/round)
	N=$(awk -F'calls=' '{split($2, a, " "); n = a[1]} END {print (n > 50000 ? n : 50000)}' "$tmp/round")
	c0=$(cpu_ticks "$PID")
	redis-benchmark -p "$RP" -c "$CONNS" -n "$N" --threads "$THREADS" --csv \
		EVALSHA "$SHA" 1 "rl:account:0000000" 100 60000 1 >"$tmp/redis1.csv"
	c1=$(cpu_ticks "$PID")
	kill "$PID"
	wait "$PID" || true
	PID=
	tail -1 "$tmp/redis1.csv" | tr -d '"' | awk -F, -v c0="$c0" -v c1="$c1" -v hz="$HZ" -v n="$N" \
		'{printf "redis rate=%.0f calls=%d cpu_us_per_call=%.1f\n", $2, n, (c1 - c0) / hz * 1e6 / n}'
}

echo "# $(nproc) CPUs, $(uname -sr); conns=$CONNS threads=$THREADS seconds=$SECS; $(uptime)"
r=1
while [ "$r" -le "$ROUNDS" ]; do
	[ -f "$tmp/round" ] && cp "$tmp/round" "$tmp/prev"
	if [ $((r % 2)) -eq 1 ]; then
		: >"$tmp/round"
		for b in "$@"; do grpc_run "$b" "grpc_h2load[$b]" | tee -a "$tmp/round"; done
		redis_run | tee -a "$tmp/round"
	else # Redis first, sized by the previous round, then the builds in reverse order
		cp "$tmp/prev" "$tmp/round"
		redis_run >"$tmp/r1"
		: >"$tmp/round"
		tee -a "$tmp/round" <"$tmp/r1"
		for b in $(printf '%s\n' "$@" | tac); do
			grpc_run "$b" "grpc_h2load[$b]" | tee -a "$tmp/round"
		done
	fi
	/usr/bin/python3 - "$tmp/round" "$r" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if "rate=" in l]
kv = {r[0]: dict(x.split("=", 1) for x in r[1:]) for r in rows}
red = float(kv["redis"]["rate"])
for k, v in kv.items():
    if k != "redis":
        print(f"round {sys.argv[2]}: {k} / redis = {float(v['rate']) / red:.2f}x; "
              f"cpu per call {v['cpu_us_per_call']} us vs redis {kv['redis']['cpu_us_per_call']} us")
PY
	echo "# $(uptime)"
	r=$((r + 1))
done
