#!/bin/bash
# The README's first command: install what building and running stripedb needs (only that:
# scripts/install-deps.sh without --test), build stripedb into build-release/, start a local
# embedded shard and drive it with a real MongoDB driver (pymongo), stop it gracefully and
# remove its temp dir, then run `stripedb demo` (its logs and data stay in stripedb-demo/,
# or $STRIPEDB_DEMO_DIR). Everything runs on loopback ports chosen free at start, and the
# checkout stays clean (build-release/ and stripedb-demo/ are ignored by git). Run as root
# on Debian 12 (it installs packages with apt-get).
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
