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

#include "cli/cli.h"

#define SHARDSET_MAX 16

/* One member as it answered replSetGetStatus (reachable 0: it did not answer; only host
 * is meaningful then). lag: the primary's applied index minus this member's, in Raft
 * entries (-1 when no primary answered). */
typedef struct shardset_member {
	char host[256];
	int reachable;
	char set[128];
	char state[32];
	int64_t id, term, primary_id, applied, commit, lag;
	int is_primary;
} shardset_member;

/* Query every member of the shard at addr (timeouts timeout_ms). Fills up to max entries
 * of out and returns how many (0: addr has no host). */
int shardset_status(const char *addr, int timeout_ms, shardset_member *out, int max);

/* `ctl shard list` and `ctl shard member add|remove|transfer|status` (argv from the verb:
 * "list" or "member"). Returns the exit code (0, 1 error from the cluster, 2 usage). */
int cli_shardset_main(cli_ctx *ctx, int argc, char **argv);

#endif
