#!/bin/sh
# clang-format of the C sources (docs/conventions.md "Build": a checked-in .clang-format,
# enforced in CI): every line of a .c or .h file under src/, storage/, raft/, cli/ and
# tests/ that changed since the commit that added .clang-format must be as clang-format 14
# lays it out (git clang-format --diff from that commit, the working tree's uncommitted
# changes included). Lines older than that commit are left as they are (see .clang-format).
# Fails printing the diff that would fix it; apply it with
#   git clang-format-14 --binary clang-format-14 $(git log --diff-filter=A --format=%H -- .clang-format | tail -n 1)
# Run by `make check`; by hand: tests/check-format.sh [SRCDIR]. Exit 77 (skipped) outside a
# git checkout (a release tarball) or without clang-format 14, unless STRIPEDB_REQUIRE_LINT=1
# (tests/all.sh sets it), or when SDB_SKIP_LINT=1.
srcdir=${1:-${STRIPEDB_SRCDIR:-$(dirname "$0")/..}}
[ "${SDB_SKIP_LINT:-0}" = 1 ] && { echo "check-format: SDB_SKIP_LINT=1"; exit 77; }
skip() {
	echo "check-format: $1"
	[ "${STRIPEDB_REQUIRE_LINT:-0}" = 1 ] && exit 1
	exit 77
}
command -v clang-format-14 >/dev/null 2>&1 || skip "clang-format-14 is not installed (scripts/install-deps.sh --test)"
command -v git-clang-format-14 >/dev/null 2>&1 || skip "git-clang-format-14 is not installed (clang-format)"
cd "$srcdir" || exit 1
git rev-parse --git-dir >/dev/null 2>&1 || skip "$srcdir is not a git checkout"
base=$(git log --diff-filter=A --format=%H -- .clang-format | tail -n 1)
[ -n "$base" ] || skip ".clang-format is not committed yet"
out=$(git-clang-format-14 --binary clang-format-14 --diff --extensions c,h "$base" -- \
	src storage raft cli tests 2>&1)
case "$out" in
"" | "no modified files to format" | "clang-format did not modify any files")
	echo "check-format: every C line changed since ${base%"${base#?????????????}"} is formatted"
	exit 0 ;;
esac
printf '%s\n' "$out"
echo "check-format: the lines above are not as .clang-format lays them out"
exit 1
