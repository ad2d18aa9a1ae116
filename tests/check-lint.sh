#!/bin/sh
# Static analysis of the product's C sources (docs/conventions.md "Build": cppcheck and
# clang-tidy clean): every .c under src/, storage/, raft/ and cli/ (generated protobuf-c
# files excepted) through
#   - cppcheck (warning and portability checks; a finding that is a false positive is
#     suppressed where it stands, `/* cppcheck-suppress ID */` with the reason beside it),
#   - clang-tidy with the checks of the checked-in .clang-tidy (every one an error),
# compiled with the build's own preprocessor and compiler flags (STRIPEDB_LINT_CFLAGS, set
# by `make check`; compiler warnings are -Werror's job and silenced here).
# Run by `make check` from the build directory; by hand: `make check TESTS=tests/check-lint.sh`.
# Exit 77 (skipped) when cppcheck or clang-tidy is not installed, unless
# STRIPEDB_REQUIRE_LINT=1 (tests/all.sh sets it: CI must not skip it), or when
# SDB_SKIP_LINT=1 (tests/all.sh sets it for distcheck's second build of the same sources).
srcdir=${STRIPEDB_SRCDIR:-$(dirname "$0")/..}
[ "${SDB_SKIP_LINT:-0}" = 1 ] && { echo "check-lint: SDB_SKIP_LINT=1"; exit 77; }
tidy=$(command -v clang-tidy-14 || command -v clang-tidy)
for t in cppcheck "$tidy"; do
	if [ -z "$t" ] || ! command -v "$t" >/dev/null 2>&1; then
		echo "check-lint: ${t:-clang-tidy} is not installed (scripts/install-deps.sh --test)"
		[ "${STRIPEDB_REQUIRE_LINT:-0}" = 1 ] && exit 1
		exit 77
	fi
done
if [ -z "${STRIPEDB_LINT_CFLAGS:-}" ]; then
	echo "check-lint: STRIPEDB_LINT_CFLAGS is not set: run it through make check"
	exit 1
fi
jobs=$(nproc 2>/dev/null || echo 2)
files=$(find "$srcdir/src" "$srcdir/storage" "$srcdir/raft" "$srcdir/cli" -name '*.c' \
	! -name '*.pb-c.c' | sort)
bad=0

echo "cppcheck $(cppcheck --version | sed 's/^Cppcheck //') over $(echo "$files" | wc -l) files"
# -I .: build_config.h of this build directory
# shellcheck disable=SC2086
if ! cppcheck -q -j"$jobs" --enable=warning,portability --std=c11 --inline-suppr \
	--suppress=missingIncludeSystem --error-exitcode=1 \
	--template='{file}:{line}: {severity} [{id}] {message}' \
	-I "$srcdir/src" -I "$srcdir" -I . -I src $files; then
	echo "check-lint: cppcheck found the problems above"
	bad=1
fi

echo "$("$tidy" --version | grep -i 'version' | head -n 1 | sed 's/^ *//') over the same files"
# a finding is an error (.clang-tidy's WarningsAsErrors), as is a file that does not compile
# shellcheck disable=SC2086
echo "$files" | xargs -P "$jobs" -n 16 sh -c '"$0" --quiet "$@" -- '"$STRIPEDB_LINT_CFLAGS"' -w' \
	"$tidy" > lint-tidy.out 2>&1
if grep -q 'error:' lint-tidy.out; then
	cat lint-tidy.out
	echo "check-lint: clang-tidy found the problems above (.clang-tidy lists the checks)"
	bad=1
fi
rm -f lint-tidy.out
[ "$bad" = 0 ] && echo "check-lint: clean"
exit "$bad"
