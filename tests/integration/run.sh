#!/bin/sh
# Runs the pytest integration suite against the freshly built binary ($STRIPEDB_BIN, set by
# `make check`). Exit 77 (automake's "skipped") when SDB_SKIP_INTEGRATION=1, e.g. in
# `make distcheck`, where the same suite already ran from the source tree.
if [ "${SDB_SKIP_INTEGRATION:-0}" = 1 ]; then
	echo "integration suite skipped (SDB_SKIP_INTEGRATION=1)"
	exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
: "${STRIPEDB_BIN:?set STRIPEDB_BIN to the stripedb binary}"
export STRIPEDB_BIN
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider -o junit_family=xunit2 "$here" ${PYTEST_ARGS:-}
