#!/bin/bash
# Build the RPM from `make dist`'s tarball with packaging/rpm/stripedb.spec:
#
#   packaging/build-rpm.sh [OUTDIR]        -> OUTDIR/stripedb-VERSION-1.ARCH.rpm (default OUTDIR: .)
#
# Tarball as for build-deb.sh ($SDB_DIST_TARBALL or `make dist`). On Debian (rpm package)
# the BuildRequires cannot be checked against an RPM database, so rpmbuild runs with
# --nodeps and without a debuginfo subpackage; the build dependencies are the Debian
# packages of packaging/debian/control. Prints the path of the .rpm on the last line.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-.}" && cd "${1:-.}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdb-build-rpm.XXXXXX")
[ "${SDB_KEEP_TMP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT

# shellcheck source=packaging/dist.sh
. "$src/packaging/dist.sh"
tarball=$(sdb_dist_tarball "$src" "$tmp")
version=$(basename "$tarball" .tar.gz)
version=${version#stripedb-}
spec_version=$(sed -n 's/^Version: *//p' "$src/packaging/rpm/stripedb.spec")
if [ "$spec_version" != "$version" ]; then
	echo "build-rpm: packaging/rpm/stripedb.spec is at $spec_version but the tarball is $version" >&2
	exit 1
fi

top="$tmp/rpmbuild"
mkdir -p "$top/SOURCES" "$top/SPECS"
cp "$tarball" "$top/SOURCES/"
cp "$src/packaging/rpm/stripedb.spec" "$top/SPECS/"
nodeps=--nodeps
# On an RPM distribution, check the BuildRequires for real.
[ -f /etc/redhat-release ] || [ -f /etc/SuSE-release ] && nodeps=
echo "build-rpm: rpmbuild -bb in $top" >&2
rpmbuild -bb $nodeps --define "_topdir $top" --define "debug_package %{nil}" \
	--define "_smp_mflags -j$(nproc)" "$top/SPECS/stripedb.spec" >"$tmp/rpmbuild.log" 2>&1 || {
	tail -n 60 "$tmp/rpmbuild.log" >&2
	echo "build-rpm: rpmbuild failed (log above)" >&2
	exit 1
}
rpm=$(ls "$top"/RPMS/*/stripedb-"$version"-*.rpm)
cp "$rpm" "$top/../rpmbuild.log" "$out/"
mv "$out/rpmbuild.log" "$out/$(basename "$rpm" .rpm).build.log"
echo "build-rpm: $(grep -c -E '\.[ch]:[0-9]+:[0-9]+: warning:' "$out/$(basename "$rpm" .rpm).build.log") compiler warnings (log: $out/$(basename "$rpm" .rpm).build.log)" >&2
echo "$out/$(basename "$rpm")"
