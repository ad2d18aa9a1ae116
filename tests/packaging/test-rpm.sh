#!/bin/bash
# Build the .rpm, list its contents and compare them with the .deb's.
#
#   tests/packaging/test-rpm.sh [RPM DEB]     (several minutes: builds both packages)
#
# Builds both packages from one `make dist` tarball (unless RPM and DEB are given), prints
# the RPM's header, file list (with modes and owners), config files and requirements,
# then checks that both packages install the same files. Normalisation before comparing:
# Debian's /lib/systemd (bookworm's unit directory) is /usr/lib/systemd, man pages are
# compared without their .gz suffix, and /usr/share/doc/stripedb* (README.md in both, plus
# copyright and changelog on Debian) and RPM's /usr/lib/.build-id links are left out. Directories are compared for
# the one each package owns, /var/lib/stripedb. Exits 0 on "test-rpm: PASS".
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
for t in rpm rpmbuild dpkg-deb; do
	command -v "$t" >/dev/null || { echo "test-rpm: $t is not installed"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdb-test-rpm.XXXXXX")
[ "${SDB_KEEP_TMP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
checks=0
fails=0
check() {
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

if [ $# -ge 2 ]; then
	rpmf=$1
	deb=$2
else
	step "make dist"
	. "$src/packaging/dist.sh"
	export SDB_DIST_TARBALL
	SDB_DIST_TARBALL=$(sdb_dist_tarball "$src" "$tmp")
	step "build the .rpm"
	rpmf=$("$src/packaging/build-rpm.sh" "$tmp/out" | tail -n1)
	step "build the .deb"
	deb=$("$src/packaging/build-deb.sh" "$tmp/out" | tail -n1)
fi

step "the .rpm"
echo "$rpmf"
rpm -qip "$rpmf" 2>/dev/null
echo "--- files (rpm -qlvp)"
rpm -qlvp "$rpmf" 2>/dev/null
echo "--- config files (rpm -qcp)"
rpm -qcp "$rpmf" 2>/dev/null
echo "--- requires (rpm -qRp)"
rpm -qRp "$rpmf" 2>/dev/null
echo "--- scriptlets (rpm -qp --scripts)"
rpm -qp --scripts "$rpmf" 2>/dev/null

norm() { sed -e 's#^\./#/#' -e 's#/$##' -e 's#^/lib/systemd/#/usr/lib/systemd/#' -e 's#\.gz$##' |
	grep -v -e '^/usr/share/doc/stripedb' -e '^/usr/lib/\.build-id/' -e '^$' | sort; }
# Files (not directories) of each package.
rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$rpmf" 2>/dev/null | awk '$1 !~ /^d/ {print $2}' | norm >"$tmp/rpm.files"
dpkg-deb --fsys-tarfile "$deb" | tar -t -v | awk '$1 !~ /^d/ {print $NF}' | norm >"$tmp/deb.files"
echo "--- files in both packages"
cat "$tmp/rpm.files"

step "compare with $(basename "$deb")"
if diff -u "$tmp/deb.files" "$tmp/rpm.files" >"$tmp/files.diff"; then
	check "same files in the .deb and the .rpm ($(wc -l <"$tmp/rpm.files") files)" true
else
	cat "$tmp/files.diff"
	check "same files in the .deb and the .rpm" false
fi
check "at least 7 files" test "$(wc -l <"$tmp/rpm.files")" -ge 7
check "same config files (rpm -qc = deb conffiles)" test \
	"$(rpm -qcp "$rpmf" 2>/dev/null | sort)" = "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | sort)"
check "the .rpm owns /var/lib/stripedb as stripedb:stripedb 0750" test \
	"$(rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$rpmf" 2>/dev/null | grep ' /var/lib/stripedb$')" \
	= "drwxr-x--- stripedb:stripedb /var/lib/stripedb"
check "the .deb has /var/lib/stripedb (its postinst hands it to stripedb)" \
	sh -c "dpkg-deb -c '$deb' | grep -q ' \./var/lib/stripedb/\$'"
# Same bytes for the files both install from the source tree.
mkdir -p "$tmp/rpmroot" "$tmp/debroot"
rpm2archive - <"$rpmf" | tar -xz -C "$tmp/rpmroot"
dpkg-deb -x "$deb" "$tmp/debroot"
check "same /etc/stripedb/stripedb.conf" cmp -s "$tmp/rpmroot/etc/stripedb/stripedb.conf" "$tmp/debroot/etc/stripedb/stripedb.conf"
check "same stripedb@.service" cmp -s "$tmp/rpmroot/usr/lib/systemd/system/stripedb@.service" "$tmp/debroot/lib/systemd/system/stripedb@.service"
check "same sysusers.d/stripedb.conf" cmp -s "$tmp/rpmroot/usr/lib/sysusers.d/stripedb.conf" "$tmp/debroot/usr/lib/sysusers.d/stripedb.conf"
for m in man1/stripedb.1 man1/stripedb-ctl.1 man5/stripedb.conf.5; do
	check "same man page $m" test "$(zcat -f "$tmp"/rpmroot/usr/share/man/$m*)" = "$(zcat -f "$tmp"/debroot/usr/share/man/$m*)"
done
ver=$(rpm -qp --qf '%{VERSION}' "$rpmf" 2>/dev/null)
check "the .rpm's binary prints 'stripedb $ver'" test "$("$tmp/rpmroot/usr/bin/stripedb" --version)" = "stripedb $ver"
check "same version in both ($ver)" test "$ver" = "$(dpkg-deb -f "$deb" Version)"

echo
if [ "$fails" = 0 ]; then
	echo "test-rpm: PASS ($checks checks) $(basename "$rpmf") vs $(basename "$deb")"
else
	echo "test-rpm: FAIL ($fails of $((checks + fails)) checks failed)"
	exit 1
fi
