#!/bin/bash
# The README's two commands on a truly fresh Debian 12, as a newcomer runs them.
#
#   tests/fresh/test-fresh-root.sh          (as root; 15-25 min; needs the Debian and npm
#                                            registries)
#
# 1. debootstrap bookworm (the default variant: Debian's base system and nothing else) into a
#    temp dir, from a base tarball cached in $SDB_FRESH_CACHE (default
#    /var/cache/stripedb-tests; made once with `debootstrap --make-tarball`, reused while it
#    is younger than 14 days);
# 2. in the root, what the README says: `apt-get install -y git`, `git clone` of this
#    repository (its committed HEAD), `scripts/quickstart.sh` to the demo's checker verdict;
# 3. in the same root, the dependency and build steps of the second command
#    (`tests/all.sh --build-only`: install-deps.sh --test with npm ci, the ASan+UBSan build),
#    then the integration tests that run mongosh and the Node.js driver (pytest -m
#    node_clients, with STRIPEDB_REQUIRE_NODE_CLIENTS=1 so that a missing or broken client
#    fails instead of skipping).
# Fails on any `npm ERR!` or `npm error`, any EBADENGINE warning, any apt error line (E:),
# a missing checker verdict, a failed test, and on a dirty checkout (`git status --porcelain`
# not empty) after each of the two commands.
# Env: SDB_KEEP_TMP=1 keeps the root; SDB_DEBIAN_MIRROR overrides the mirror.
# Prints "test-fresh-root: PASS (N checks, S s)" and exits 0, or each failure and exits 1.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "test-fresh-root: must run as root (debootstrap, chroot)"; exit 1; }
command -v debootstrap >/dev/null || { echo "test-fresh-root: debootstrap is not installed"; exit 1; }
command -v git >/dev/null || { echo "test-fresh-root: git is not installed"; exit 1; }
start=$(date +%s)
cache=${SDB_FRESH_CACHE:-/var/cache/stripedb-tests}
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/sdb-fresh-root.XXXXXX")
root="$tmp/root"
cleanup() {
	# Anything still running in the root (a failed demo, a test's process) goes first.
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -KILL "${p#/proc/}" 2>/dev/null || true
	done
	# Every mount under the root, deepest first: ours, and any that propagated in from the
	# host meanwhile (an `ip netns add` of another test mounts /run/netns).
	local m
	awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
	if [ "${SDB_KEEP_TMP:-0}" = 1 ]; then echo "test-fresh-root: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
checks=0
fails=0
check() { # DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then
		checks=$((checks + 1))
		echo "ok   $what"
	else
		fails=$((fails + 1))
		echo "FAIL $what"
	fi
}
step() { printf '\n=== %s (%s, %d s)\n' "$1" "$(date -u +%H:%M:%S)" $(($(date +%s) - start)); }
# no_line FILE REGEX: FILE has no line matching the extended REGEX (prints the ones it has).
no_line() {
	if grep -E -n "$2" "$1" | head -n 20 | grep .; then return 1; fi
	return 0
}

host_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] && cat "$f"
	done | sed -n -e 's#^URIs: *\(http[^ ]*/debian\)/*$#\1#p' \
		-e 's#^deb \(\[[^]]*\] \)\?\(http[^ ]*/debian\)/* bookworm .*#\2#p' | head -n1
}
mirror=${SDB_DEBIAN_MIRROR:-$(host_mirror || true)}
mirror=${mirror:-http://deb.debian.org/debian}

step "debootstrap a fresh Debian 12 root (mirror $mirror)"
mkdir -p "$cache"
tarball="$cache/bookworm-base.tgz"
if [ -f "$tarball" ] && [ -n "$(find "$tarball" -mtime -14)" ]; then
	echo "base tarball: $tarball (cached)"
else
	rm -f "$tarball"
	debootstrap --make-tarball="$tarball.new" bookworm "$tmp/tarball-work" "$mirror" >"$tmp/tarball.log" 2>&1 || {
		tail -n 30 "$tmp/tarball.log"
		echo "test-fresh-root: debootstrap --make-tarball failed"
		exit 1
	}
	mv "$tarball.new" "$tarball"
	rm -rf "$tmp/tarball-work"
	echo "base tarball: $tarball (made now)"
fi
debootstrap --unpack-tarball="$tarball" bookworm "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
	tail -n 30 "$tmp/debootstrap.log"
	echo "test-fresh-root: debootstrap failed"
	exit 1
}
tail -n 1 "$tmp/debootstrap.log"
# A fresh install's sources: the release, its updates and the security archive.
security=${mirror%/debian}/debian-security
[ "$mirror" = "http://deb.debian.org/debian" ] || security=http://deb.debian.org/debian-security
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
mnt() { mount "$@"; mount --make-rprivate "${@: -1}"; }
mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt --bind /dev "$root/dev"
mnt -t devpts devpts "$root/dev/pts"
mnt -t tmpfs tmpfs "$root/dev/shm"
mkdir -p "$root/mnt/src"
mnt --bind "$src" "$root/mnt/src"
mount -o remount,bind,ro "$root/mnt/src"
# The MongoDB specification tests beside the clone, where the suite looks for them
# (../shared/compat, as CI lays it out), so the Node driver's CRUD smoke set runs too.
compat=$(cd "$src/.." && pwd)/shared/compat
if [ -d "$compat" ]; then
	mkdir -p "$root/root/shared/compat"
	mnt --bind "$compat" "$root/root/shared/compat"
	mount -o remount,bind,ro "$root/root/shared/compat"
fi
# This machine's own trust anchors (a TLS-intercepting egress proxy's CA in
# /usr/local/share/ca-certificates) go into the root, as a newcomer on the same network would
# have them: ca-certificates (installed by the first command) adds them to the system bundle,
# and Node.js, which trusts only its built-in roots, is pointed at that bundle.
extra_env=()
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
	mkdir -p "$root/usr/local/share/ca-certificates"
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
	extra_env+=(NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt)
fi
in_root() {
	chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LANG=C.UTF-8 TERM=dumb "${extra_env[@]}" "$@"
}
check "the root is Debian 12" grep -q '^VERSION_ID="12"' "$root/etc/os-release"
check "the root has no git, node or compiler" test ! -e "$root/usr/bin/git" -a ! -e "$root/usr/bin/node" -a ! -e "$root/usr/bin/gcc"

step "README step 0: apt-get install -y git; git clone"
in_root sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q git' >"$tmp/git.log" 2>&1 || {
	tail -n 30 "$tmp/git.log"
	echo "test-fresh-root: apt-get install git failed"
	exit 1
}
check "apt: no error installing git" no_line "$tmp/git.log" '^(E|Err):'
# (safe.directory: the checkout may belong to another user than root, as with sudo)
in_root git -c safe.directory='*' clone -q /mnt/src /root/stripedb
echo "cloned $(git -C "$src" rev-parse --short HEAD) into /root/stripedb"

step "README command 1: scripts/quickstart.sh"
set +e
in_root sh -c 'cd /root/stripedb && scripts/quickstart.sh' >"$tmp/quickstart.log" 2>&1
rc=$?
set -e
echo "quickstart.sh exit $rc after $(($(date +%s) - start)) s; its last lines:"
tail -n 25 "$tmp/quickstart.log"
check "quickstart.sh exits 0" test "$rc" = 0
check "the demo reports the checker verdict OK" grep -q '^checker verdict: OK' "$tmp/quickstart.log"
check "no npm error" no_line "$tmp/quickstart.log" 'npm (ERR!|error)'
check "no apt error" no_line "$tmp/quickstart.log" '^(E|Err):'
check "no EBADENGINE" no_line "$tmp/quickstart.log" 'EBADENGINE'
check "quickstart installed no Node.js (only what the build and demo need)" test ! -e "$root/usr/bin/node"
check "quickstart left no temp dir" test -z "$(ls -d "$root"/tmp/stripedb-quickstart-* 2>/dev/null)"
st=$(in_root git -C /root/stripedb status --porcelain)
[ -z "$st" ] || echo "$st"
check "git status --porcelain is empty after command 1" test -z "$st"
echo "packages in the root after command 1: $(in_root dpkg-query -W -f='.\n' | wc -l)"

step "README command 2, its dependency and build steps: tests/all.sh --build-only"
set +e
in_root sh -c 'cd /root/stripedb && tests/all.sh --build-only' >"$tmp/all.log" 2>&1
rc=$?
set -e
tail -n 15 "$tmp/all.log"
check "tests/all.sh --build-only exits 0" test "$rc" = 0
check "no npm error" no_line "$tmp/all.log" 'npm (ERR!|error)'
check "no apt error" no_line "$tmp/all.log" '^(E|Err):'
check "no EBADENGINE" no_line "$tmp/all.log" 'EBADENGINE'
echo "node in the root: $(in_root node --version 2>&1), npm $(in_root npm --version 2>&1)"
check "Debian's Node.js 18 is the node" sh -c "chroot '$root' node --version | grep -q '^v18\.'"

step "the mongosh and Node.js driver integration tests, in the root"
set +e
in_root sh -c 'cd /root/stripedb && STRIPEDB_BIN=$PWD/build/stripedb STRIPEDB_REQUIRE_NODE_CLIENTS=1 \
	ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	/usr/bin/python3 -m pytest -q -p no:cacheprovider -m node_clients tests/integration' >"$tmp/node-tests.log" 2>&1
rc=$?
set -e
tail -n 15 "$tmp/node-tests.log"
check "the node_clients tests pass" test "$rc" = 0
# A skip for a missing spec-test folder (../shared/compat) is the suite's own rule; a skip for a
# missing Node client must not happen with STRIPEDB_REQUIRE_NODE_CLIENTS=1.
check "no node_clients test skipped for a missing client" no_line "$tmp/node-tests.log" '^SKIPPED.*Node\.js client'
st=$(in_root git -C /root/stripedb status --porcelain)
[ -z "$st" ] || echo "$st"
check "git status --porcelain is empty after command 2's steps" test -z "$st"

secs=$(($(date +%s) - start))
if [ "$fails" -gt 0 ]; then
	for f in quickstart all node-tests; do
		[ -f "$tmp/$f.log" ] && { echo "--- $f.log (last 60 lines)"; tail -n 60 "$tmp/$f.log"; }
	done
	echo "test-fresh-root: FAIL ($fails of $((checks + fails)) checks failed, $secs s)"
	exit 1
fi
echo "test-fresh-root: PASS ($checks checks, $secs s)"
