#!/bin/sh
# Install the Debian 12 packages stripedb needs. Idempotent; run as root.
#
#   scripts/install-deps.sh          what building and running stripedb and its demo need
#                                    (the README's first command, scripts/quickstart.sh)
#   scripts/install-deps.sh --test   that, plus the test, fuzz, benchmark and packaging
#                                    toolchain and the Node.js clients of the integration
#                                    tests (the README's second command, tests/all.sh)
#
# Node.js: the integration tests run mongosh and the MongoDB Node.js driver, pinned in
# tests/integration/package-lock.json to versions that run on Debian 12's Node.js 18 (see
# tests/integration/README.md for how the lockfile is made). A node already on PATH is used
# when it is a supported version (18 or newer), and said so; otherwise Debian's nodejs and npm
# are installed. `npm ci` installs exactly the lockfile and never rewrites it.
set -eu
export DEBIAN_FRONTEND=noninteractive

test_set=0
case "$#:${1:-}" in
0:) ;;
1:--test) test_set=1 ;;
*)
	echo "usage: scripts/install-deps.sh [--test]" >&2
	exit 2
	;;
esac

# Building stripedb (configure checks each of these with pkg-config) and running the
# quickstart (python3-pymongo drives the smoke test) and `stripedb demo`.
BUILD_PKGS="build-essential autoconf automake libtool pkg-config ca-certificates
libuv1-dev libraft-dev libsqlite3-dev libbson-dev libmongoc-dev librdkafka-dev
libssl-dev libcmocka-dev libmicrohttpd-dev libinih-dev libxxhash-dev libpcre2-dev
libgrpc-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libcurl4-openssl-dev libxml2-dev libicu-dev
libgoogle-perftools-dev
python3 python3-pymongo"
# Tests (pytest, its per-test timeout, pytest-xdist for the parallel phase of tests/integration/run.sh,
# grpcio, h2/hpack for raw HTTP/2 frames, kcat, curl, sqlite3, Redis for the rate
# limiter benchmark, network namespaces and sshd for the multi-host test), the fuzzers
# (clang, and libclang-rt-14-dev for the libFuzzer runtime, which clang only recommends), the
# static analysis and format checks (clang-tidy, clang-format, cppcheck: tests/check-lint.sh,
# tests/check-format.sh) and
# the package builds (debhelper, rpm, lintian, debootstrap), and the S3 server of the CDC
# archive tests (Ceph's radosgw on a one-node Ceph: tests/integration/s3_server.py).
TEST_PKGS="git sqlite3 python3-pytest python3-pytest-timeout python3-pytest-xdist python3-grpcio python3-grpc-tools
python3-prometheus-client python3-h2 redis-server kcat clang libclang-rt-14-dev clang-tidy clang-format cppcheck
curl iproute2 openssh-client openssh-server
debhelper dpkg-dev fakeroot rpm lintian debootstrap
radosgw ceph-mon ceph-osd ceph-common"

PKGS=$BUILD_PKGS
[ "$test_set" = 1 ] && PKGS="$PKGS $TEST_PKGS"

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ "$test_set" = 1 ]; then
	if command -v node >/dev/null 2>&1; then
		if [ "$(node_major)" -lt 18 ]; then
			echo "install-deps: $(command -v node) is Node.js $(node --version 2>/dev/null || echo '(does not run)'); the tests need 18 or newer (Debian 12's nodejs is 18): remove it or put a newer one first on PATH" >&2
			exit 1
		fi
		echo "install-deps: using Node.js $(node --version) at $(command -v node) (the tests support 18 or newer)"
		command -v npm >/dev/null 2>&1 || missing="$missing npm"
	else
		missing="$missing nodejs npm"
	fi
fi

if [ -n "$missing" ]; then
	apt-get update -qq
	# openssh-server's postinst starts sshd through the init system, which a container or a
	# chroot may not have (tests/integration/test_multihost.py runs its own sshd per network
	# namespace and needs none running). Unless the machine has a policy already, deny
	# service starts during the install (invoke-rc.d(8): policy-rc.d exit 101).
	policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		trap 'rm -f "$policy"' EXIT
		trap 'rm -f "$policy"; exit 130' INT HUP TERM
	fi
	# Wait for another apt run to finish rather than failing on its lock.
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 $missing
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT INT HUP TERM
	fi
fi

# The Node.js driver and mongosh, exactly as pinned in package-lock.json. Optional native
# dependencies (kerberos, the OS keychain, ...) are left out: they need C headers Debian does
# not install by default (gssapi/gssapi.h) and no test uses them.
if [ "$test_set" = 1 ]; then
	here=$(cd "$(dirname "$0")/.." && pwd)
	(cd "$here/tests/integration" && npm ci --omit=optional --no-audit --no-fund)
fi
