#!/bin/sh
# Runs the pytest integration suite against the freshly built binary ($STRIPEDB_BIN, set by
# `make check`). Exit 77 (automake's "skipped") when SDB_SKIP_INTEGRATION=1, e.g. in
# `make distcheck`, where the same suite already ran from the source tree.
#
# The suite runs in two phases: first every test not marked `serial` (pytest.ini) in
# SDB_TEST_JOBS parallel pytest-xdist workers (default 4) with `--dist loadfile`, so all the
# tests of a file run in one worker, in order, and module-scoped fixtures keep working; then
# the tests marked `serial` (those that cannot share the machine: see the marker's comment in
# each) in one plain pytest. Most tests wait (elections, leases, polls, start-up under ASan)
# rather than compute, so 4 workers on 2 cores cut the wall time by about half (measured:
# phase 1 took 19 min with 4 workers, 28 min with 3, on a 2-core machine loaded by other jobs).
# The exit status is non-zero when either phase fails.
#
# PYTEST_ARGS runs a subset instead, in one plain pytest (no workers) in this directory, e.g.
#   make check PYTEST_ARGS="test_proxy.py -k txn"
# SDB_TEST_JOBS=1 runs the whole suite that way too (one pytest, serial tests included).
if [ "${SDB_SKIP_INTEGRATION:-0}" = 1 ]; then
	echo "integration suite skipped (SDB_SKIP_INTEGRATION=1)"
	exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
: "${STRIPEDB_BIN:?set STRIPEDB_BIN to the stripedb binary}"
case $STRIPEDB_BIN in /*) ;; *) STRIPEDB_BIN=$(pwd)/$STRIPEDB_BIN ;; esac
export STRIPEDB_BIN
jobs=${SDB_TEST_JOBS:-4}
pytest="/usr/bin/python3 -m pytest -q -p no:cacheprovider -o junit_family=xunit2"
# From the suite's directory: test file names in PYTEST_ARGS are relative to it, and without
# any, pytest.ini's testpaths (.) selects the whole suite.
cd "$here" || exit 99

if [ -n "${PYTEST_ARGS:-}" ] || [ "$jobs" -le 1 ]; then
	# shellcheck disable=SC2086 # PYTEST_ARGS is a list of words
	exec $pytest ${PYTEST_ARGS:-}
fi

# pytest-xdist (python3-pytest-xdist, scripts/install-deps.sh --test) runs the workers.
if ! /usr/bin/python3 -c 'import xdist' 2>/dev/null; then
	echo "run.sh: pytest-xdist is not installed (python3-pytest-xdist): run" \
		"scripts/install-deps.sh --test, or SDB_TEST_JOBS=1 for one serial pytest" >&2
	exit 99
fi

# Exit 5 is pytest's "no tests collected" (e.g. no test is marked serial): not a failure.
status=0
echo "=== integration phase 1: tests not marked serial, $jobs workers (pytest-xdist, --dist loadfile)"
$pytest -n "$jobs" --dist loadfile -m "not serial"
rc=$?
[ "$rc" = 0 ] || [ "$rc" = 5 ] || status=1
echo "=== integration phase 2: tests marked serial, one at a time"
$pytest -m serial
rc=$?
[ "$rc" = 0 ] || [ "$rc" = 5 ] || status=1
exit $status
