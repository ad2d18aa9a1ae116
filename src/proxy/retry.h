/* The proxy's one retry path (issue #24), shaped after mongo-c-driver's retryable
 * command: an operation gives an execute callback (one attempt with one routing snapshot)
 * and px_retry_run owns the loop: StaleConfig classification, exponential backoff within
 * --stale-retry-ms, routing refresh, and the answer when the budget is spent. Also here:
 * target selection (px_target), fan-out of per-shard calls (pcall), and the classification
 * of a failed shard call into the client's error (RetryableWriteError labels).
 *
 * Resending to one shard is here too (px_shard_call): a command a shard certainly did not
 * execute (restarting, no primary) or, for reads and retryable writes, whose outcome is
 * unknown is sent again with backoff. Every retry of a client request, StaleConfig or
 * resend, draws on one budget: ctx.deadline_ms (--stale-retry-ms from the request's
 * start), so the worst case is one budget, never one per shard call inside one per
 * attempt. shardconn.c is transport only (one attempt per call).
 *
 * The shard connection layer: every shard command, fan-out and routing lookup the proxy's
 * handlers and cursors make goes through the proxy's px_cluster (proxy->cluster; NULL =
 * px_cluster_default: shardconn.h pools and role.c's routing cache), so a replica-set shard
 * client changes one place (px_cluster_default's functions in retry.c) and a unit test
 * gives a fake cluster.
 *
 * Not a public contract: only src/proxy includes it (through exec.h).
 */
#ifndef SDB_PROXY_RETRY_H
#define SDB_PROXY_RETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

#include "routing/route.h"

struct ctx;
struct proxy;

/* How handlers reach the cluster. impl is the proxy (default) or a test's state. */
typedef struct px_cluster {
	/* One attempt of cmd in db on shard id: SHARDCONN_* (shardconn_command's contract:
	 * reply always initialised, the caller destroys it; *sid the server for getMores;
	 * *fate on NET_ERR: SHARDCONN_UNSENT, SHARDCONN_UNKNOWN_OUTCOME or
	 * SHARDCONN_UNREGISTERED). */
	int (*command)(void *impl, const char *shard, const char *db, const bson_t *cmd,
		       uint32_t *sid, bson_t *reply, char *neterr, size_t nelen, int *fate);
	/* Run fn(arg, 0..n-1), in parallel when it can, and return when all have. */
	void (*fanout)(void *impl, size_t n, void (*fn)(void *arg, size_t i), void *arg);
	/* proxy_route's contract: the routing of ns (a reference), reloaded when force. */
	route_coll *(*route)(void *impl, const char *ns, bool force, char *err, size_t errlen);
	/* proxy_primary's contract: the primary shard id (heap) or NULL. */
	char *(*primary)(void *impl);
	/* The ids of every known shard (*out: heap array of heap strings), the shard list
	 * reloaded from metadata first (proxy_load_shards; a failure keeps the known list). */
	size_t (*shard_ids)(void *impl, char ***out);
	/* The hosts of shard id ("h1:p1,h2:p2", heap) or NULL. */
	char *(*shard_hosts)(void *impl, const char *id);
	/* shardconn_shard_down / shardconn_set_shard_down's contracts; NULL: no circuit
	 * state (every call gets the request's budget). */
	bool (*shard_down)(void *impl, const char *id);
	void (*set_shard_down)(void *impl, const char *id, bool down);
} px_cluster;

/* Backoff of a resend to a shard that had not executed a command: 50 ms doubling to
 * 500 ms (a restart or an election takes about a second). */
#define PX_RESEND_MIN_MS 50
#define PX_RESEND_MAX_MS 500
/* Backoff after StaleConfig: 5 ms doubling to 200 ms (the routing refresh is the wait). */
#define PX_STALE_MIN_MS 5
#define PX_STALE_MAX_MS 200

/* Run cmd in db on shard (one call of p's cluster, resent as below) before deadline_ms
 * (monotonic ms: the request's budget). Returns: a SHARDCONN_* class (not an SDB_E*
 * status); reply always initialised (the caller destroys it); *sid as in
 * shardconn_command; neterr holds the message of a NET_ERR.
 * Resent (issue #11, #15) with backoff PX_RESEND_* until deadline_ms when the shard
 * certainly did not execute cmd: it was never sent (SHARDCONN_UNSENT: down or restarting),
 * or the shard refused it before execution (wire_not_executed_code): ShutdownInProgress
 * (91, a stopping shard in quiesce), NotWritablePrimary (10107), NotPrimaryNoSecondaryOk
 * (13435), NotPrimaryOrSecondary (13436) or LegacyNotPrimary (10058) (a replica-set member
 * that is not primary; the next attempt selects the new one). After an unknown outcome (a
 * network error after sending; InterruptedDueToReplStateChange 11602, InterruptedAtShutdown
 * 11600 or PrimarySteppedDown 189: the primary lost its role before the command committed)
 * only idempotent reads (find, count, distinct, list*, *Stats, ping) and retryable writes
 * (lsid and txnNumber: the shard answers a retry from its record, issue #16) are resent,
 * so a write is never applied twice; a transaction's statement (cmd has `autocommit`) is
 * not (the proxy answers TransientTransactionError), its commitTransaction and
 * abortTransaction are, as mongod's. A call pinned to a server (*sid non-zero: a
 * cursor's member) is not resent after any state-change code (wire_state_change_code:
 * another attempt there cannot help).
 * When the budget is spent on a command the shard certainly did not execute, the result
 * is NET_ERR and reply holds SHARDCONN_UNEXECUTED_FIELD: true (shardconn_unexecuted), and
 * the shard is marked down: its later commands get one attempt until it answers again (a
 * shard that is down for good fails fast instead of holding every request for the
 * budget). Metric: every resend counts in stripedb_proxy_shard_retries_total. */
int px_shard_call(struct proxy *p, uint64_t deadline_ms, const char *shard, const char *db,
		  const bson_t *cmd, uint32_t *sid, bson_t *reply, char *neterr, size_t nelen);

/* The real cluster: impl is the proxy. */
extern const px_cluster px_cluster_default;

/* Results of an attempt (px_retry.execute). */
enum {
	PX_RETRY_DONE = 0,  /* finished: the operation answered or kept its result */
	PX_RETRY_STALE = 1, /* a shard refused with StaleConfig: refresh routing, back off, again */
	PX_RETRY_AGAIN = 2, /* run again at once with the same routing (a candidate changed) */
};

/* A failed shard call kept for the answer (the shard's reply, or a network error). */
typedef struct px_failure {
	bson_t reply; /* always initialised */
	int cls;      /* SHARDCONN_*; SHARDCONN_OK = none kept */
	char nerr[256];
} px_failure;

/* Keep (a copy of) a failed call in f, replacing what it held. */
void px_failure_set(px_failure *f, int cls, const bson_t *reply, const char *nerr);

/* One operation on a routed collection. */
typedef struct px_retry {
	px_failure last; /* the StaleConfig refusal of the last attempt (execute may set it) */
	struct ctx *c;
	route_coll *rc; /* the current snapshot: a reference the caller gave and takes back
			 * (px_retry_run replaces it on refresh) */
	int attempt;    /* 0 for the first call of execute, then 1, 2, ... */
	/* The status of the answer the operation gave (exec.h's answers: 0 reply, else the
	 * error's code), -1 while it has given none. execute and exhausted set it when they
	 * answer (r->status = px_reply(...)); px_retry_run sets it when it answers for a NULL
	 * exhausted. The handler returns it after the run. */
	int status;
	/* One attempt with r->rc. On PX_RETRY_STALE nothing was answered; the operation keeps
	 * in its arg what it needs to resume (the refused documents or ranges). An attempt
	 * that answers sets r->status. */
	int (*execute)(struct px_retry *r, void *arg);
	/* The budget is spent after a stale attempt: answer (setting r->status) or record the
	 * failure. NULL: the shard's refusal in r->last is answered as it is
	 * (px_reply_shard_error), or, when execute kept none, StaleConfig (13388) "routing
	 * kept changing". */
	void (*exhausted)(struct px_retry *r, void *arg);
	void *arg;
} px_retry;

/* Prepare r for operation execute(arg) of c with routing rc (a reference, taken: the final
 * snapshot is r->rc after the run, released by px_retry_done). */
void px_retry_init(px_retry *r, struct ctx *c, route_coll *rc,
		   int (*execute)(px_retry *r, void *arg), void (*exhausted)(px_retry *r, void *arg),
		   void *arg);
/* Run r until an attempt is not stale or the budget (c->deadline_ms, shared with the
 * resends of px_shard_call) is spent, backing off PX_STALE_* between attempts. Returns:
 * PX_RETRY_DONE, or PX_RETRY_STALE after r->exhausted ran. Metric: every stale attempt
 * counts in stripedb_proxy_stale_retries_total. */
int px_retry_run(px_retry *r);
/* Release r's routing reference and kept failure. */
void px_retry_done(px_retry *r);

/* The chunks of rc that filter q (NULL: every chunk) targets (route_target): a flag per
 * chunk (heap, at least one element; free()), *nsel of them set, *exact when the key pins
 * them. coll_from is the client's command or write statement whose `collation` q runs
 * under (NULL: none): with a non-simple one, a filter that compares a string cannot be
 * targeted by the chunks' binary bounds (strings equal under the collation lie in other
 * chunks), so every chunk is selected (mongos' rule: with a non-simple collation, string
 * values of the shard key do not target; stripedb broadcasts when any string is compared,
 * which is the same on the shard key and a superset elsewhere). */
bool *px_target(route_coll *rc, const bson_t *q, const bson_t *coll_from, size_t *nsel,
		bool *exact);
/* Count a request as targeted (nsel < rc->nchunks) or scatter in the proxy's metrics. */
void px_note_target(struct ctx *c, const route_coll *rc, size_t nsel);

#endif
