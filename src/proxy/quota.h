/* Admission of the proxy: per-tenant quotas through the rate limiter (DESIGN.md §5 step 2).
 *
 * Tenants and their quotas come from the metadata service (listTenants: {name, quota};
 * listDatabases: {name, tenant}); a request's tenant is the tenant owning its database.
 * A quota document may hold (all optional; token buckets of periodMS, default 1000 ms):
 *   {requestsPerSec: N, docsWrittenPerSec: N, bytesPerSec: N, periodMS: P}
 * (with periodMS the limits are "N per P ms", e.g. for quotas per minute).
 * A request is admitted only when every bucket of its tenant has room: requests count 1,
 * documents written count the documents of insert and the statements of update/delete,
 * bytes count the command document's size. Decisions use Gubernator's model through the
 * rate limiter's C API (ratelimit/limiter.h): name "stripedb_tenant_requests" /
 * "..._docs_written" / "..._bytes", unique_key the tenant name. With --grpc-listen and
 * --peers the proxy joins the rate-limit peer ring (ratelimit/grpc_server.h), so a
 * tenant's buckets have one owner and the quota holds across every proxy.
 * Over quota: MongoDB-style error 462 (WIRE_ERR_RATE_LIMITED) with a `retryAfterMS` field,
 * and nothing is executed.
 */
#ifndef SDB_PROXY_QUOTA_H
#define SDB_PROXY_QUOTA_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "auth/gate.h"
#include "common/role.h"

typedef struct proxy_quota proxy_quota;

/* Start the limiter (and the peer ring when the role has --grpc-listen). Free with
 * proxy_quota_free. Errors: as rl_grpc_start (SDB_EUSAGE, SDB_EIO) with a message. */
int proxy_quota_new(sdb_role *role, proxy_quota **out, char *err, size_t errlen);
void proxy_quota_free(proxy_quota *q);

/* Replace the tenant tables from metadata replies (listTenants, listDatabases). */
void proxy_quota_load(proxy_quota *q, const bson_t *tenants, const bson_t *dbs);

/* Per-collection "minimum features" switches (DESIGN.md §5), from the tenant's policy
 * document (setPolicy): {collections: {"db.coll": {forbidScatter: true,
 * forbidUnindexed: true, forbidUnbounded: true}}}. */
enum {
	PROXY_POLICY_NO_SCATTER = 1,   /* queries must target a subset of the chunks */
	PROXY_POLICY_NO_UNINDEXED = 2, /* the shard's plan must not be a collection scan */
	PROXY_POLICY_NO_UNBOUNDED = 4, /* finds need a limit, pipelines a $limit */
};
/* The switches for ns (a bit set of PROXY_POLICY_*), 0 when none. Thread-safe. */
unsigned proxy_policy(proxy_quota *q, const char *db, const char *ns);

/* Does a tenant own db (its quotas and policy may apply to db's commands)? Never blocks
 * (a read lock on the tables). Thread-safe. Returns: true when db is a tenant's. */
bool proxy_quota_tenant_db(proxy_quota *q, const char *db);

/* With a peer ring: ask each other peer once (hits: 0 on a probe key it owns) so that the
 * channels are up before quotas matter; true once every peer answered and none is marked
 * dead (always true without a ring). Blocking: call from the refresh thread. */
bool proxy_quota_ring_probe(proxy_quota *q);

/* The counters of the auth gate's brute-force limit (auth_failures_fn, ctx the
 * proxy_quota; auth_gate_opts.failures_*): token buckets "stripedb_auth_failures" of
 * window_ms with unique_key the key (Gubernator's model, ratelimit/limiter.h).
 * proxy_quota_auth_local decides on a limiter private to the gate's local view (never
 * blocks; a rate limiter of its own, so the cluster's count is not made twice in one
 * place); proxy_quota_auth_cluster on the proxy's rate limiter (the peer ring when it has
 * one, else its private limiter): may block (forwarding to a key's owner), thread-pool
 * threads only. Errors: the decide's (rl_decide_local or rl_cluster_decide: SDB_EINVAL
 * when n > RL_MAX_BATCH); for the local one also SDB_EINVAL when its bucket answered an
 * error (the cluster one leaves such a bucket out of *under). Message in err.
 * Thread-safe. */
int proxy_quota_auth_local(void *q, const auth_failure_key *keys, size_t n, int64_t hits,
			   int64_t window_ms, bool *under, char *err, size_t errlen);
int proxy_quota_auth_cluster(void *q, const auth_failure_key *keys, size_t n, int64_t hits,
			     int64_t window_ms, bool *under, char *err, size_t errlen);

/* Admit a request on db carrying docs documents written and bytes bytes. Returns true to
 * go on; false with *retry_after_ms, the tenant and a message filled. Thread-safe. */
bool proxy_quota_admit(proxy_quota *q, const char *db, int64_t docs, int64_t bytes,
		       int64_t *retry_after_ms, char *msg, size_t msglen);

#endif
