# Sourced by packaging/build-deb.sh and build-rpm.sh.
#
# sdb_dist_tarball SRCDIR TMPDIR: print the path of stripedb-VERSION.tar.gz, the release
# tarball of SRCDIR. $SDB_DIST_TARBALL when set; otherwise SRCDIR is configured out of
# tree in TMPDIR/dist and `make dist` builds it (needs SRCDIR/configure: run
# `autoreconf -fi` in a fresh checkout). Progress goes to stderr.
sdb_dist_tarball() {
	local src=$1 tmp=$2
	if [ -n "${SDB_DIST_TARBALL:-}" ]; then
		[ -f "$SDB_DIST_TARBALL" ] || { echo "no such tarball: $SDB_DIST_TARBALL" >&2; return 1; }
		(cd "$(dirname "$SDB_DIST_TARBALL")" && echo "$(pwd)/$(basename "$SDB_DIST_TARBALL")")
		return 0
	fi
	[ -x "$src/configure" ] || { echo "$src/configure is missing: run autoreconf -fi there first" >&2; return 1; }
	mkdir -p "$tmp/dist"
	echo "make dist in $tmp/dist" >&2
	(cd "$tmp/dist" && "$src/configure" >configure.out 2>&1 && make dist >dist.out 2>&1) || {
		tail -n 30 "$tmp/dist/configure.out" "$tmp/dist/dist.out" >&2 2>/dev/null
		echo "make dist failed" >&2
		return 1
	}
	ls "$tmp"/dist/stripedb-*.tar.gz
}
