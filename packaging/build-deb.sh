#!/bin/bash
# Build the Debian package from `make dist`'s tarball:
#
#   packaging/build-deb.sh [OUTDIR]        -> OUTDIR/stripedb_VERSION_ARCH.deb (default OUTDIR: .)
#
# Configures a scratch build of this source tree in a temp dir and runs `make dist` (or
# takes the tarball from $SDB_DIST_TARBALL), unpacks it, puts packaging/debian there as
# debian/ and runs `dpkg-buildpackage -us -uc -b`. Needs the Build-Depends of
# packaging/debian/control plus debhelper and dpkg-dev. Prints the path of the .deb on the
# last line. The temp dir is removed unless SDB_KEEP_TMP=1.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-.}" && cd "${1:-.}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdb-build-deb.XXXXXX")
[ "${SDB_KEEP_TMP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT

# shellcheck source=packaging/dist.sh
. "$src/packaging/dist.sh"
tarball=$(sdb_dist_tarball "$src" "$tmp")
version=$(basename "$tarball" .tar.gz)
version=${version#stripedb-}
changelog_version=$(dpkg-parsechangelog -l "$src/packaging/debian/changelog" -S Version)
if [ "$changelog_version" != "$version" ]; then
	echo "build-deb: packaging/debian/changelog is at $changelog_version but the tarball is $version: add a changelog entry" >&2
	exit 1
fi

mkdir -p "$tmp/deb"
tar -C "$tmp/deb" -xzf "$tarball"
srcdir="$tmp/deb/stripedb-$version"
cp -r "$src/packaging/debian" "$srcdir/debian"
echo "build-deb: dpkg-buildpackage in $srcdir" >&2
(cd "$srcdir" && DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage -us -uc -b >"$tmp/dpkg-buildpackage.log" 2>&1) || {
	tail -n 60 "$tmp/dpkg-buildpackage.log" >&2
	echo "build-deb: dpkg-buildpackage failed (log above)" >&2
	exit 1
}
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
deb="stripedb_${version}_${arch}.deb"
cp "$tmp/deb/$deb" "$out/"
cp "$tmp/dpkg-buildpackage.log" "$out/stripedb_${version}_${arch}.build.log"
echo "build-deb: $(grep -c -E '\.[ch]:[0-9]+:[0-9]+: warning:' "$out/stripedb_${version}_${arch}.build.log") compiler warnings (log: $out/stripedb_${version}_${arch}.build.log)" >&2
echo "$out/$deb"
