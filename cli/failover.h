/* The failover step of `stripedb demo` (issue #15, cli/failover.c): SIGKILL the primary of
 * the busiest shard while the workload runs, measure the failover as a client sees it, and
 * check that nothing acknowledged was lost or duplicated.
 */
#ifndef SDB_CLI_FAILOVER_H
#define SDB_CLI_FAILOVER_H

#include <mongoc/mongoc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/dev.h"

/* What the step saw. Times in ms. failover_ms: from the kill to the end of the first
 * acknowledged probe write that started after the kill (a write on the new primary), -1
 * when none within the window. rejoin_ms: from the restart of the killed member until it
 * applied as far as the primary, -1 when it did not in 60 s. The probe: one client through
 * the proxies inserting {_id: seq, merchant: "m0000"} into pay.failover (a collection
 * with one chunk on the killed shard) with retryWrites=false; found/missing/unexpected
 * compare the final documents with the acknowledged and attempted inserts (an insert
 * whose outcome was unknown may or may not be there; a document that no insert attempted,
 * or an acknowledged one missing, is a violation). */
typedef struct demo_failover {
	char shard[32], victim[32], new_primary[32];
	int victim_pid;
	int64_t failover_ms, rejoin_ms;
	int64_t sent, acked, failed, unknown;
	int64_t found, missing, unexpected;
	char error[256]; /* why the step could not run ("" when it ran) */
} demo_failover;

/* Run the step on the dev cluster cl (its directory dir) with the proxies at proxy_uri and
 * metadata client meta: pick the shard holding the busiest merchant (m0000), start the
 * probe, SIGKILL that shard's primary, wait for the first acknowledged write after it
 * (30 s at most), restart the killed member with `stripedb dev restart` through
 * run_self(args) and wait until it caught up, stop the probe and check its documents.
 * tick() is called about once a second while waiting (the caller prints the workload's
 * status). Returns: 0 when the step ran and found no violation, -1 otherwise (reason in
 * out->error, or violations in the counts). Stops early when *stop becomes non-zero. */
int demo_failover_run(const dev_cluster *cl, const char *proxy_uri, mongoc_client_t *meta,
		      int (*run_self)(char *const *args), void (*tick)(void *arg), void *arg,
		      volatile sig_atomic_t *stop, demo_failover *out);

/* The report's lines for out. */
void demo_failover_print(const demo_failover *f, FILE *to);

#endif
