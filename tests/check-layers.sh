#!/bin/sh
# Dependencies point one way (DEVELOPERS: "the wire layer must not reach into auth, the
# storage engine must not know about roles"; issue #24: common <- tls <- wire <- auth <-
# roles): a shared layer includes only itself and the layers below it, never a role, cli
# or a layer above. Exit 1 naming every include that breaks a rule.
#   src/common  -> common
#   src/tls     -> tls, common
#   src/wire    -> wire, tls, common
#   storage     -> storage, common
#   raft        -> raft, common
#   src/routing -> routing, storage, common
#   src/auth    -> auth, tls, wire, raft, common (no exception: login throttling gets its
#                  counters from the proxy, auth_gate_opts.failures_*)
# Roles never include each other, except where one runs inside the other by design:
#   src/shard       -> shard and the shared layers
#   src/proxy       -> proxy, ratelimit/limiter.h and ratelimit/grpc_server.h (the tenant
#                      quotas: the proxy joins the rate limiter's ring in process)
#   src/metadata    -> metadata and the shared layers
#   src/coordinator -> coordinator, cdc (the coordinator runs the CDC publishers, archive
#                      and backups)
#   src/ratelimit, src/cdc, src/bench -> themselves and the shared layers
# (the shared layers: common, tls, wire, auth, raft, routing, storage; so no include circle
# is possible among wire, auth, proxy and shard).
# An allowed entry is a folder or one header (folder/file.h). Any spelling of the directive
# counts (leading blanks, `# include`, <folder/x.h>, "../folder/x.h").
# Run by `make check`; by hand: tests/check-layers.sh [SRCDIR]
srcdir=${1:-${STRIPEDB_SRCDIR:-$(dirname "$0")/..}}
bad=0
check() { # DIR ALLOWED-PREFIX...
	dir=$1
	shift
	allowed=$*
	for f in $(find "$srcdir/$dir" -name '*.[ch]'); do
		# "folder/x.h" and <folder/x.h> (both found through -I src), and "../folder/x.h"
		# (resolved against the file's own folder)
		fdir=$(dirname "${f#"$srcdir"/}")
		grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<](\.\./)*[a-z_]+/' "$f" |
		while IFS= read -r line; do
			hdr=$(printf '%s\n' "$line" | sed -E 's/.*include[[:space:]]*["<]([^">]*)[">].*/\1/')
			case $hdr in
			../*) # relative: the folder it names, as a path under src/ or the top
				rel=$fdir/$hdr
				while printf '%s' "$rel" | grep -q '[^/]*/\.\./'; do
					rel=$(printf '%s' "$rel" | sed -E 's#[^/]+/\.\./##')
				done
				hdr=${rel#src/} ;;
			esac
			inc=${hdr%%/*}
			# a library's own header (<bson/bson.h>, <mongoc/...>) names no layer of ours
			[ -d "$srcdir/src/$inc" ] || [ -d "$srcdir/$inc" ] || continue
			ok=0
			for a in $allowed; do
				[ "$inc" = "$a" ] || [ "$hdr" = "$a" ] && ok=1
			done
			[ $ok = 1 ] || echo "${f#"$srcdir"/}:${line%%:*}: $dir must not include $inc/ (allowed: $allowed)"
		done
	done
}
out=$(check src/common common; check src/tls tls common; check src/wire wire tls common
      check storage storage common; check raft raft common
      check src/routing routing storage common; check src/auth auth tls wire raft common
      shared="common tls wire auth raft routing storage"
      check src/shard shard $shared; check src/metadata metadata $shared
      check src/proxy proxy ratelimit/limiter.h ratelimit/grpc_server.h $shared
      check src/coordinator coordinator cdc $shared
      check src/ratelimit ratelimit $shared; check src/cdc cdc $shared
      check src/bench bench $shared)
if [ -n "$out" ]; then
	printf '%s\n' "$out" >&2
	bad=1
fi
exit $bad
