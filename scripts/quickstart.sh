#!/bin/bash
# The README's first command: install dependencies, build stripedb, start a local embedded
# shard and drive it with a real MongoDB driver (pymongo), then stop it gracefully.
# Everything runs on loopback ports chosen free at start; data goes to a temp dir that is
# removed at the end. Run as root on Debian 12 (it installs packages with apt-get).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=$(nproc 2>/dev/null || echo 2)

echo "==> installing dependencies (apt-get)"
scripts/install-deps.sh
echo "==> building stripedb (build-release/)"
[ -f configure ] || autoreconf -fi
mkdir -p build-release
(cd build-release && { [ -f Makefile ] || ../configure >configure.out; } && make -j"$jobs" >make.out 2>&1) || { tail -n 40 build-release/make.out; exit 1; }
/usr/bin/python3 scripts/quickstart.py "$top/build-release/stripedb" && exec "$top/build-release/stripedb" demo --dir "${STRIPEDB_DEMO_DIR:-$top/stripedb-demo}" "$@"
