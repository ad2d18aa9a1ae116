#!/bin/sh
# Install every Debian 12 package stripedb needs to build, test, benchmark and package.
# Idempotent; run as root. Node.js and npm come from Debian unless a node is already there.
set -eu
export DEBIAN_FRONTEND=noninteractive
PKGS="build-essential autoconf automake libtool pkg-config git
libuv1-dev libraft-dev libsqlite3-dev sqlite3 libbson-dev libmongoc-dev librdkafka-dev
libssl-dev libcmocka-dev libmicrohttpd-dev libinih-dev libxxhash-dev libpcre2-dev
libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libcurl4-openssl-dev
python3 python3-pymongo python3-pytest python3-pytest-timeout python3-grpcio python3-grpc-tools
python3-prometheus-client redis-server kcat clang curl ca-certificates
iproute2 openssh-client openssh-server
debhelper dpkg-dev fakeroot rpm lintian debootstrap"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	missing="$missing nodejs npm"
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
	fi
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
fi
# The Node.js driver and mongosh, for the integration tests (pinned in package-lock.json).
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -f "$here/tests/integration/package.json" ]; then
	(cd "$here/tests/integration" && { [ -f package-lock.json ] && npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; })
fi
