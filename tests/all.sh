#!/bin/bash
# Install dependencies, build from scratch with AddressSanitizer + UBSan and -Werror, and run
# every test: the cmocka unit tests and the pytest integration suite (`make check`), every
# fuzz target (clang, libFuzzer: the wire protocol for 60 s, the others 20 s each), as root the
# packaging and fresh-root tests, and `make distcheck`.
#
#   sudo tests/all.sh               (as root on a fresh Debian 12 machine)
#   sudo tests/all.sh --build-only  the dependency and build steps only (build/stripedb)
#
# Builds go to build/ (sanitizers), build-fuzz/ (clang + libFuzzer); FUZZ_SECONDS=N
# changes the fuzzing time; SKIP_DISTCHECK=1 skips the distcheck step. As root, the
# packaging tests (build the .deb and .rpm, install the .deb into a fresh debootstrap root;
# a few minutes, needs the Debian mirror) run too; STRIPEDB_PACKAGING_TESTS=0 skips them. As
# root, tests/fresh/test-fresh-root.sh also runs the README's two commands in a fresh
# debootstrap root (15-25 min); STRIPEDB_FRESH_ROOT_TEST=0 skips it.
set -euo pipefail
build_only=0
case "$#:${1:-}" in
0:) ;;
1:--build-only) build_only=1 ;;
*)
	echo "usage: tests/all.sh [--build-only]" >&2
	exit 2
	;;
esac
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=$(nproc 2>/dev/null || echo 2)

step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "remove stale libmongoc counter files"
# libmongoc (before stripedb unlinks it at start) maps /dev/shm/mongoc-PID; processes killed
# by older builds left theirs behind, and a new process that gets the same pid prints a
# warning on stderr. Remove the files of processes that no longer exist.
for f in /dev/shm/mongoc-*; do
	[ -e "$f" ] || continue
	pid=${f##*-}
	case "$pid" in *[!0-9]*) continue ;; esac
	[ -d "/proc/$pid" ] || rm -f "$f"
done

step "install dependencies (scripts/install-deps.sh --test)"
scripts/install-deps.sh --test

step "autoreconf"
autoreconf -fi

step "build with ASan+UBSan"
rm -rf build && mkdir build
(cd build && ../configure --enable-sanitizers --enable-debug >configure.out && make -j"$jobs")
if [ "$build_only" = 1 ]; then
	step "built build/stripedb (--build-only: no tests run)"
	exit 0
fi

step "make check (unit + integration)"
if [ "$(id -u)" = 0 ]; then
	export STRIPEDB_PACKAGING_TESTS=${STRIPEDB_PACKAGING_TESTS:-1}
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# mongosh and the Node.js driver were installed above: their tests must run, not skip.
export STRIPEDB_REQUIRE_NODE_CLIENTS=1
# cppcheck, clang-tidy and clang-format were installed above: their checks must run, not skip.
export STRIPEDB_REQUIRE_LINT=1
# The unit tests first, then the integration suite on its own: its parallel workers load
# every CPU, and the unit tests' real loops and timers (a Raft node on loopback) ran beside
# it before (once a segfault in test_raft_node that no run alone reproduced).
if ! (cd build && SDB_SKIP_INTEGRATION=1 make -j"$jobs" check &&
	make check TESTS=tests/integration/run.sh); then
	for f in build/tests/unit/*.log build/tests/integration/*.log; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 200 "$f"; }
	done
	exit 1
fi
# run.sh runs two pytest phases (parallel, then the tests marked serial): each one's summary
# line and its slowest tests.
grep -E '^=== integration phase|^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped)' build/tests/integration/run.sh.log
tail -n 40 build/tests/integration/run.sh.log

step "fuzz the parsers (wire ${FUZZ_SECONDS:-60} s, the others ${FUZZ_SECONDS_OTHER:-20} s each)"
rm -rf build-fuzz && mkdir build-fuzz
fuzzers="fuzz_wire_msg $(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//' | grep -v '^fuzz_wire_msg$' | tr '\n' ' ')"
(cd build-fuzz && CC=clang ../configure --enable-fuzzing >configure.out &&
	make -j"$jobs" $(for f in $fuzzers; do printf 'tests/fuzz/%s ' "$f"; done))
for f in $fuzzers; do
	secs=${FUZZ_SECONDS_OTHER:-20}
	[ "$f" = fuzz_wire_msg ] && secs=${FUZZ_SECONDS:-60}
	echo "--- $f for $secs s"
	tests/fuzz/run.sh "$secs" "build-fuzz/tests/fuzz/$f" 2>&1 | tail -n 3
	[ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzzer $f found a crash"; exit 1; }
done

if [ "$(id -u)" != 0 ]; then
	step "fresh-root test SKIPPED: not root (debootstrap and chroot need root; CI runs as root)"
elif [ "${STRIPEDB_FRESH_ROOT_TEST:-1}" = 0 ]; then
	step "fresh-root test SKIPPED: STRIPEDB_FRESH_ROOT_TEST=0"
else
	step "the README's commands in a fresh Debian 12 root (tests/fresh/test-fresh-root.sh)"
	tests/fresh/test-fresh-root.sh
fi

if [ "${SKIP_DISTCHECK:-0}" != 1 ]; then
	step "make distcheck"
	(cd build && SDB_SKIP_INTEGRATION=1 SDB_SKIP_LINT=1 make -j"$jobs" distcheck >distcheck.out 2>&1) || { tail -n 60 build/distcheck.out; exit 1; }
	tail -n 4 build/distcheck.out
fi
step "all tests passed"
