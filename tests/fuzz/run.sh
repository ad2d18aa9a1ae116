#!/bin/sh
# Run a fuzz target for DURATION_S seconds; builds nothing.
#
#   tests/fuzz/run.sh DURATION_S [TARGET [CORPUS]]
#
# TARGET defaults to tests/fuzz/fuzz_wire_msg in the current directory (a build dir
# configured with `CC=clang ../configure --enable-fuzzing` and `make
# tests/fuzz/fuzz_wire_msg`). CORPUS is the seed corpus folder name under tests/fuzz/corpus
# (default: wire for fuzz_wire_msg, storage_query for fuzz_storage_query, else the target's
# name without the fuzz_ prefix). The seed corpus is only read; new
# inputs go to a temporary directory. Exits non-zero when the fuzzer finds a crash (the
# reproducer is left in the current directory as crash-*/leak-*/timeout-*).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dur=${1:?usage: tests/fuzz/run.sh DURATION_S [TARGET]}
target=${2:-tests/fuzz/fuzz_wire_msg}
if [ ! -x "$target" ]; then
	echo "run.sh: fuzz target $target not built (CC=clang ./configure --enable-fuzzing && make tests/fuzz/fuzz_wire_msg)" >&2
	exit 2
fi
name=$(basename "$target")
case "$name" in
fuzz_wire_msg) def=wire ;;
*) def=${name#fuzz_} ;;
esac
corpus="$here/corpus/${3:-$def}"
[ -d "$corpus" ] || corpus=""
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Seeds first in the corpus list so libFuzzer writes new inputs to $work only.
"$target" -max_total_time="$dur" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 "$work" $corpus
