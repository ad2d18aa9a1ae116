/* Shard replica sets seen from the CLI (issue #15): every member's replSetGetStatus, used by
 * `stripedb ctl shard list`, `ctl shard member ...` and `ctl top` (cli/shardset.c).
 *
 * A shard address is a replica-set URI (mongodb://h1,h2,h3/?replicaSet=NAME), a plain
 * "H:P,H:P" list, or one "H:P". Members are found from that seed list plus the hosts that
 * any reachable member's hello lists (members added online need not be in the URI).
 */
#ifndef SDB_CLI_SHARDSET_H
#define SDB_CLI_SHARDSET_H

#include <stdint.h>

#include <bson/bson.h>

#include "cli/cli.h"

#define SHARDSET_MAX 16

/* One member as it answered replSetGetStatus (reachable 0: it did not answer this
 * command; host, and what the primary says of it, are still filled). lag and lag_ms: the
 * primary's view of it (shard_repl_view on the primary: Raft entries behind the primary's
 * log, and how long it has been behind in ms), -1 when no primary answered or the primary
 * does not know the member. primary_sees: 1 the primary hears from it, 0 it does not, -1
 * unknown. */
typedef struct shardset_member {
	char host[256];
	int reachable;
	char set[128];
	char state[32];
	int64_t id, term, primary_id, applied, commit, lag, lag_ms;
	int is_primary;
	int primary_sees;
} shardset_member;

/* Query every member of the shard at addr (timeouts timeout_ms). Fills up to max entries
 * of out. Returns: how many (0: addr has no host); a member that does not answer is an
 * entry too, not an error. */
int shardset_status(const char *addr, int timeout_ms, shardset_member *out, int max);

/* Append m's fields to doc: {host, reachable, id?, state ("UNREACHABLE" when it did not
 * answer), setName, term, applied, commitIndex, primaryId (when it answered), lag,
 * lagMillis (-1 unknown), primarySees?, primary}. */
void shardset_member_bson(const shardset_member *m, bson_t *doc);

/* `ctl shard list` and `ctl shard member add|remove|transfer|status` (argv from the verb:
 * "list" or "member"). Returns: the exit code (0, 1 error from the cluster, 2 usage). */
int cli_shardset_main(cli_ctx *ctx, int argc, char **argv);

#endif
