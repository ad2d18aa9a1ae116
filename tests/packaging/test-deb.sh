#!/bin/bash
# Build the .deb, lint it, install it into a fresh Debian 12 root and check it there.
#
#   tests/packaging/test-deb.sh [DEB]      (as root; several minutes; needs the Debian mirror)
#
# 1. packaging/build-deb.sh (unless DEB is given), then lintian (no error allowed; the
#    warnings are printed);
# 2. debootstrap --variant=minbase bookworm into a temp dir, from the mirror this host's
#    apt uses; apt-get install of the .deb there, which pulls its dependencies from the same
#    mirror;
# 3. in the root: the files, the stripedb system user, the conffile, /var/lib/stripedb,
#    `stripedb --version`, and a shard run as the stripedb user with the packaged config
#    (answers /healthz, stops on SIGTERM with exit 0); a reinstall keeps a changed
#    conffile; purge removes it.
# Env: SDB_KEEP_TMP=1 keeps the temp dir; SDB_DEBIAN_MIRROR overrides the mirror.
# Prints "test-deb: PASS (N checks)" and exits 0, or prints each failure and exits 1.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "test-deb: must run as root (debootstrap, chroot)"; exit 1; }
for t in debootstrap lintian dpkg-deb curl; do
	command -v "$t" >/dev/null || { echo "test-deb: $t is not installed"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdb-test-deb.XXXXXX")
root="$tmp/root"
shard_pid=
cleanup() {
	[ -n "$shard_pid" ] && kill -KILL "$shard_pid" 2>/dev/null || true
	for m in "$root/proc" "$root/dev"; do
		mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true
	done
	[ "${SDB_KEEP_TMP:-0}" = 1 ] && echo "test-deb: kept $tmp" || rm -rf "$tmp"
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
step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "build the .deb"
if [ $# -ge 1 ]; then
	deb=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
else
	deb=$("$src/packaging/build-deb.sh" "$tmp/out" | tail -n1)
fi
echo "$deb"
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -I "$deb" | sed -n '/Package:/,$p'
dpkg-deb -c "$deb"

step "lintian"
lintian --display-info "$deb" >"$tmp/lintian.out" 2>&1 || true
cat "$tmp/lintian.out"
check "lintian: no error" test "$(grep -c '^E: ' "$tmp/lintian.out")" = 0
echo "lintian: $(grep -c '^E: ' "$tmp/lintian.out") errors, $(grep -c '^W: ' "$tmp/lintian.out") warnings, $(grep -c '^I: ' "$tmp/lintian.out") info"

step "debootstrap a Debian 12 root"
# The mirror this host's apt uses (deb822 URIs: or one-line deb entries).
host_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] && cat "$f"
	done | sed -n -e 's#^URIs: *\(http[^ ]*/debian\)/*$#\1#p' \
		-e 's#^deb \(\[[^]]*\] \)\?\(http[^ ]*/debian\)/* bookworm .*#\2#p' | head -n1
}
mirror=${SDB_DEBIAN_MIRROR:-$(host_mirror || true)}
mirror=${mirror:-http://deb.debian.org/debian}
echo "mirror: $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
	tail -n 30 "$tmp/debootstrap.log"
	echo "test-deb: debootstrap failed"
	exit 1
}
tail -n 1 "$tmp/debootstrap.log"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
check "the root is Debian 12" grep -q '^VERSION_ID="12"' "$root/etc/os-release"
check "the root has no stripedb user before the install" test -z "$(in_root getent passwd stripedb || true)"

step "apt-get install the .deb in the root"
cp "$deb" "$root/tmp/"
in_root apt-get update -q >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; exit 1; }
if ! in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	"/tmp/$(basename "$deb")" >>"$tmp/apt.log" 2>&1; then
	tail -n 40 "$tmp/apt.log"
	echo "test-deb: apt-get install failed"
	exit 1
fi
grep -E '^(Setting up|The following NEW)' "$tmp/apt.log" | head -n 40
echo "packages installed with it: $(grep -c '^Setting up' "$tmp/apt.log")"

step "check the installed package"
check "dpkg says installed" test "$(in_root dpkg-query -W -f='${Status}' stripedb)" = "install ok installed"
for f in /usr/bin/stripedb /usr/share/man/man1/stripedb.1.gz /usr/share/man/man1/stripedb-ctl.1.gz \
	/usr/share/man/man5/stripedb.conf.5.gz /etc/stripedb/stripedb.conf /lib/systemd/system/stripedb@.service \
	/usr/lib/sysusers.d/stripedb.conf /usr/share/doc/stripedb/copyright; do
	check "file $f" test -f "$root$f"
done
check "/usr/bin/stripedb is executable" test -x "$root/usr/bin/stripedb"
check "stripedb --version prints 'stripedb $version'" test "$(in_root stripedb --version)" = "stripedb $version"
check "stripedb ctl --help exits 0" in_root sh -c 'stripedb ctl --help >/dev/null'
check "the unit is the packaged one" cmp -s "$root/lib/systemd/system/stripedb@.service" "$src/packaging/systemd/stripedb@.service"
pw=$(in_root getent passwd stripedb || true)
echo "passwd: $pw"
IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
check "user stripedb exists" test -n "$pw"
check "user stripedb is a system user (uid $uid < 1000)" test "${uid:-1000}" -lt 1000
check "user stripedb home is /var/lib/stripedb" test "$home" = /var/lib/stripedb
check "user stripedb cannot log in ($shell)" test "$shell" = /usr/sbin/nologin
check "group stripedb is the user's group" test "$(in_root getent group stripedb | cut -d: -f3)" = "$gid"
check "/var/lib/stripedb is stripedb:stripedb 750" test "$(in_root stat -c '%U:%G %a' /var/lib/stripedb)" = "stripedb:stripedb 750"
conffiles=$(in_root dpkg-query -W -f='${Conffiles}' stripedb)
echo "conffiles:$conffiles"
check "/etc/stripedb/stripedb.conf is the only conffile" test "$(echo "$conffiles" | awk 'NF {print $1}')" = /etc/stripedb/stripedb.conf
check "the conffile is packaging/stripedb.conf" cmp -s "$root/etc/stripedb/stripedb.conf" "$src/packaging/stripedb.conf"
check "no instance is enabled" test -z "$(ls "$root"/etc/systemd/system/*.wants/stripedb@* 2>/dev/null)"
check "dpkg --verify is clean" test -z "$(in_root dpkg --verify stripedb)"

step "run a shard from the package as the stripedb user"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
http=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
chroot --userspec=stripedb:stripedb "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/var/lib/stripedb \
	/usr/bin/stripedb --role=shard --config=/etc/stripedb/stripedb.conf --data-dir=/var/lib/stripedb/shard \
	--listen=127.0.0.1:"$port" --http-listen=127.0.0.1:"$http" >"$tmp/shard.log" 2>&1 &
shard_pid=$!
healthy=no
for _ in $(seq 1 300); do # up to 30 s
	if curl -fsS -m 1 "http://127.0.0.1:$http/healthz" >/dev/null 2>&1; then healthy=yes; break; fi
	kill -0 "$shard_pid" 2>/dev/null || break
	sleep 0.1
done
check "the shard answers /healthz with 200" test "$healthy" = yes
check "the shard created its data dir as stripedb" test "$(in_root stat -c %U /var/lib/stripedb/shard)" = stripedb
kill -TERM "$shard_pid"
rc=0
wait "$shard_pid" || rc=$?
shard_pid=
check "the shard exits 0 on SIGTERM" test "$rc" = 0
[ "$fails" = 0 ] || tail -n 20 "$tmp/shard.log"

step "reinstall over a modified conffile"
echo "log-level = debug" >>"$root/etc/stripedb/stripedb.conf"
in_root env DEBIAN_FRONTEND=noninteractive dpkg -i "/tmp/$(basename "$deb")" >"$tmp/reinstall.log" 2>&1 || cat "$tmp/reinstall.log"
check "reinstall keeps the local change of the conffile" grep -qx 'log-level = debug' "$root/etc/stripedb/stripedb.conf"
check "reinstall keeps the user" test "$(in_root getent passwd stripedb)" = "$pw"

step "purge"
in_root env DEBIAN_FRONTEND=noninteractive dpkg --purge stripedb >"$tmp/purge.log" 2>&1 || cat "$tmp/purge.log"
check "purge removed the binary" test ! -e "$root/usr/bin/stripedb"
check "purge removed the conffile" test ! -e "$root/etc/stripedb/stripedb.conf"
check "purge kept the data in /var/lib/stripedb" test -d "$root/var/lib/stripedb/shard"

echo
if [ "$fails" = 0 ]; then
	echo "test-deb: PASS ($checks checks) $(basename "$deb")"
else
	echo "test-deb: FAIL ($fails of $((checks + fails)) checks failed)"
	exit 1
fi
