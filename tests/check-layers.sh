#!/bin/sh
# Dependencies point one way (DEVELOPERS: "the wire layer must not reach into auth, the
# storage engine must not know about roles"): the shared layers include only themselves and
# src/common, never a role, auth, cli or each other. Exit 1 naming every include that
# breaks a rule.
#   src/common  -> common
#   src/wire    -> wire, common
#   storage     -> storage, common
#   raft        -> raft, common
#   src/routing -> routing, storage, common
#   src/auth    -> auth, wire, raft, common, and the token-bucket library's
#                  ratelimit/limiter.h (login throttling; no role code behind it)
# An allowed entry is a folder or one header (folder/file.h).
# Run by `make check`; by hand: tests/check-layers.sh [SRCDIR]
srcdir=${1:-${STRIPEDB_SRCDIR:-$(dirname "$0")/..}}
bad=0
check() { # DIR ALLOWED-PREFIX...
	dir=$1
	shift
	allowed=$*
	for f in $(find "$srcdir/$dir" -name '*.[ch]'); do
		grep -n '^#include "[a-z_]*/' "$f" | while IFS= read -r line; do
			inc=$(printf '%s\n' "$line" | sed 's/.*#include "\([a-z_]*\)\/.*/\1/')
			hdr=$(printf '%s\n' "$line" | sed 's/.*#include "\([^"]*\)".*/\1/')
			ok=0
			for a in $allowed; do
				[ "$inc" = "$a" ] || [ "$hdr" = "$a" ] && ok=1
			done
			[ $ok = 1 ] || echo "${f#"$srcdir"/}:${line%%:*}: $dir must not include $inc/ (allowed: $allowed)"
		done
	done
}
out=$(check src/common common; check src/wire wire common; check storage storage common;
      check raft raft common; check src/routing routing storage common
      check src/auth auth wire raft common ratelimit/limiter.h)
if [ -n "$out" ]; then
	printf '%s\n' "$out" >&2
	bad=1
fi
exit $bad
