/* The proxy's one retry path (issue #24), shaped after mongo-c-driver's retryable
 * command: an operation gives an execute callback (one attempt with one routing snapshot)
 * and px_retry_run owns the loop: StaleConfig classification, exponential backoff within
 * --stale-retry-ms, routing refresh, and the answer when the budget is spent. Also here:
 * target selection (px_target), fan-out of per-shard calls (pcall), and the classification
 * of a failed shard call into the client's error (RetryableWriteError labels).
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
	/* Run cmd in db on shard id: SHARDCONN_* (shardconn_command's contract: reply always
	 * initialised, the caller destroys it; *sid the server for getMores). */
	int (*command)(void *impl, const char *shard, const char *db, const bson_t *cmd,
		       uint32_t *sid, bson_t *reply, char *neterr, size_t nelen);
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
} px_cluster;

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
	/* One attempt with r->rc. On PX_RETRY_STALE nothing was answered; the operation keeps
	 * in its arg what it needs to resume (the refused documents or ranges). */
	int (*execute)(struct px_retry *r, void *arg);
	/* The budget is spent after a stale attempt: answer (or record the failure). NULL:
	 * the shard's refusal in r->last is answered as it is (px_reply_shard_error), or,
	 * when execute kept none, StaleConfig (13388) "routing kept changing". */
	void (*exhausted)(struct px_retry *r, void *arg);
	void *arg;
} px_retry;

/* Prepare r for operation execute(arg) of c with routing rc (a reference, taken: the final
 * snapshot is r->rc after the run, released by px_retry_done). */
void px_retry_init(px_retry *r, struct ctx *c, route_coll *rc,
		   int (*execute)(px_retry *r, void *arg), void (*exhausted)(px_retry *r, void *arg),
		   void *arg);
/* Run r until an attempt is not stale or the budget (c->deadline_ms) is spent. Returns:
 * PX_RETRY_DONE, or PX_RETRY_STALE after r->exhausted ran. Metric: every stale attempt
 * counts in stripedb_proxy_stale_retries_total. */
int px_retry_run(px_retry *r);
/* Release r's routing reference and kept failure. */
void px_retry_done(px_retry *r);

/* The chunks of rc that filter q (NULL: every chunk) targets (route_target): a flag per
 * chunk (heap, at least one element; free()), *nsel of them set, *exact when the key pins
 * them. */
bool *px_target(route_coll *rc, const bson_t *q, size_t *nsel, bool *exact);
/* Count a request as targeted (nsel < rc->nchunks) or scatter in the proxy's metrics. */
void px_note_target(struct ctx *c, const route_coll *rc, size_t nsel);

#endif
