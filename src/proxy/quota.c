/* Tenant quotas of the proxy: see quota.h. */
#include "proxy/quota.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/shardconn.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/limiter.h"

typedef struct tenant {
	char *name;
	int64_t rps, dps, bps; /* 0 = unlimited */
	int64_t period_ms;     /* bucket window, default 1000 */
	bson_t *policy;        /* the tenant's policy document or NULL */
} tenant;

typedef struct dbmap {
	char *db;
	char *tenant;
} dbmap;

struct proxy_quota {
	rl_limiter *lim;
	rl_limiter *auth_lim; /* the auth gate's local failure counts (proxy_quota_auth_local) */
	rl_frontend fe;
	rl_grpc *grpc;
	uv_rwlock_t lock;
	tenant *t;
	size_t nt;
	dbmap *d;
	size_t nd;
};

int proxy_quota_new(sdb_role *role, proxy_quota **out, char *err, size_t errlen)
{
	proxy_quota *q = sdb_calloc(1, sizeof *q);
	int rc;

	q->lim = rl_limiter_new(NULL);
	q->auth_lim = rl_limiter_new(NULL);
	q->fe.limiter = q->lim;
	q->fe.decide = rl_decide_local;
	q->fe.decide_ctx = q->lim;
	rc = rl_grpc_start(role, &q->fe, &q->grpc, err, errlen);
	if (rc != 0) {
		rl_limiter_free(q->lim);
		rl_limiter_free(q->auth_lim);
		free(q);
		return rc;
	}
	uv_rwlock_init(&q->lock);
	*out = q;
	return 0;
}

static void tables_free(proxy_quota *q)
{
	size_t i;

	for (i = 0; i < q->nt; i++) {
		free(q->t[i].name);
		if (q->t[i].policy)
			bson_destroy(q->t[i].policy);
	}
	for (i = 0; i < q->nd; i++) {
		free(q->d[i].db);
		free(q->d[i].tenant);
	}
	free(q->t);
	free(q->d);
	q->t = NULL;
	q->d = NULL;
	q->nt = q->nd = 0;
}

void proxy_quota_free(proxy_quota *q)
{
	if (q == NULL)
		return;
	rl_grpc_stop(q->grpc);
	rl_limiter_free(q->lim);
	rl_limiter_free(q->auth_lim);
	tables_free(q);
	uv_rwlock_destroy(&q->lock);
	free(q);
}

static int64_t quota_field(const bson_iter_t *quota, const char *name)
{
	bson_iter_t it;

	if (bson_iter_recurse(quota, &it) && bson_iter_find(&it, name) && BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_int64(&it);
	return 0;
}

void proxy_quota_load(proxy_quota *q, const bson_t *tenants, const bson_t *dbs)
{
	bson_iter_t it, arr, f;
	tenant *t = NULL;
	dbmap *d = NULL;
	size_t nt = 0, nd = 0, ct = 0, cd = 0;

	if (tenants && bson_iter_init_find(&it, tenants, "tenants") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			tenant x = {0};
			if (!bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "name") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					x.name = sdb_strdup(bson_iter_utf8(&f, NULL));
				else if (strcmp(bson_iter_key(&f), "quota") == 0 &&
					 BSON_ITER_HOLDS_DOCUMENT(&f)) {
					x.rps = quota_field(&f, "requestsPerSec");
					x.dps = quota_field(&f, "docsWrittenPerSec");
					x.bps = quota_field(&f, "bytesPerSec");
					x.period_ms = quota_field(&f, "periodMS");
				} else if (strcmp(bson_iter_key(&f), "policy") == 0 &&
					   BSON_ITER_HOLDS_DOCUMENT(&f)) {
					uint32_t len;
					const uint8_t *data;
					bson_t view;
					bson_iter_document(&f, &len, &data);
					if (bson_init_static(&view, data, len))
						x.policy = bson_copy(&view);
				}
			}
			if (x.name == NULL) {
				if (x.policy)
					bson_destroy(x.policy);
				continue;
			}
			if (x.period_ms <= 0)
				x.period_ms = 1000;
			if (nt == ct) {
				ct = ct ? ct * 2 : 8;
				t = sdb_realloc(t, ct * sizeof *t);
			}
			t[nt++] = x;
		}
	}
	if (dbs && bson_iter_init_find(&it, dbs, "databases") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			dbmap x = {0};
			if (!bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (!BSON_ITER_HOLDS_UTF8(&f))
					continue;
				if (strcmp(bson_iter_key(&f), "name") == 0)
					x.db = sdb_strdup(bson_iter_utf8(&f, NULL));
				else if (strcmp(bson_iter_key(&f), "tenant") == 0)
					x.tenant = sdb_strdup(bson_iter_utf8(&f, NULL));
			}
			if (x.db == NULL || x.tenant == NULL) {
				free(x.db);
				free(x.tenant);
				continue;
			}
			if (nd == cd) {
				cd = cd ? cd * 2 : 8;
				d = sdb_realloc(d, cd * sizeof *d);
			}
			d[nd++] = x;
		}
	}
	uv_rwlock_wrlock(&q->lock);
	tables_free(q);
	q->t = t;
	q->nt = nt;
	q->d = d;
	q->nd = nd;
	uv_rwlock_wrunlock(&q->lock);
}

bool proxy_quota_tenant_db(proxy_quota *q, const char *db)
{
	bool found = false;

	if (q == NULL)
		return false;
	uv_rwlock_rdlock(&q->lock);
	for (size_t i = 0; i < q->nd && !found; i++)
		found = strcmp(q->d[i].db, db) == 0;
	uv_rwlock_rdunlock(&q->lock);
	return found;
}

unsigned proxy_policy(proxy_quota *q, const char *db, const char *ns)
{
	unsigned flags = 0;
	size_t i, j;
	bson_iter_t it, coll, f;

	if (q == NULL)
		return 0;
	uv_rwlock_rdlock(&q->lock);
	for (i = 0; i < q->nd; i++) {
		if (strcmp(q->d[i].db, db) != 0)
			continue;
		for (j = 0; j < q->nt; j++) {
			if (strcmp(q->t[j].name, q->d[i].tenant) != 0 || q->t[j].policy == NULL)
				continue;
			if (!bson_iter_init_find(&it, q->t[j].policy, "collections") ||
			    !BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &coll))
				continue;
			if (!bson_iter_find(&coll, ns) || !BSON_ITER_HOLDS_DOCUMENT(&coll) ||
			    !bson_iter_recurse(&coll, &f))
				continue;
			while (bson_iter_next(&f)) {
				const char *k = bson_iter_key(&f);
				if (!bson_iter_as_bool(&f))
					continue;
				if (strcmp(k, "forbidScatter") == 0)
					flags |= PROXY_POLICY_NO_SCATTER;
				else if (strcmp(k, "forbidUnindexed") == 0)
					flags |= PROXY_POLICY_NO_UNINDEXED;
				else if (strcmp(k, "forbidUnbounded") == 0)
					flags |= PROXY_POLICY_NO_UNBOUNDED;
			}
		}
	}
	uv_rwlock_rdunlock(&q->lock);
	return flags;
}

/* The auth failure buckets of keys[0..n) (n <= 2) decided by decide(ctx): see quota.h.
 * A bucket that answers an error (e.g. its owner on the peer ring is unreachable) fails
 * the call when strict (the local view: refuse), else it is left out of *under (the
 * cluster's count: the other key still decides). */
static int auth_failures(rl_decide_fn decide, void *ctx, bool strict, const auth_failure_key *keys,
			 size_t n, int64_t hits, int64_t window_ms, bool *under, char *err,
			 size_t errlen)
{
	rl_req r[2];
	rl_resp out[2];
	int rc;

	if (n > 2)
		return sdb_errf(err, errlen, SDB_EINVAL, "auth failures: %zu keys, at most 2", n);
	memset(r, 0, sizeof r);
	memset(out, 0, sizeof out);
	for (size_t i = 0; i < n; i++) {
		r[i].name = "stripedb_auth_failures";
		r[i].unique_key = keys[i].key;
		r[i].hits = hits;
		r[i].limit = keys[i].limit;
		r[i].duration = window_ms;
		r[i].algorithm = RL_TOKEN_BUCKET;
	}
	if ((rc = decide(ctx, r, n, out, err, errlen)) != 0)
		return rc;
	*under = true;
	for (size_t i = 0; i < n; i++) {
		if (out[i].error[0] && strict)
			return sdb_errf(err, errlen, SDB_EINVAL, "auth failures: %s", out[i].error);
		if (!out[i].error[0] &&
		    (hits > 0 ? out[i].status != RL_UNDER_LIMIT : out[i].remaining <= 0))
			*under = false;
	}
	return 0;
}

int proxy_quota_auth_local(void *ctx, const auth_failure_key *keys, size_t n, int64_t hits,
			   int64_t window_ms, bool *under, char *err, size_t errlen)
{
	proxy_quota *q = ctx;
	return auth_failures(rl_decide_local, q->auth_lim, true, keys, n, hits, window_ms, under,
			     err, errlen);
}

int proxy_quota_auth_cluster(void *ctx, const auth_failure_key *keys, size_t n, int64_t hits,
			     int64_t window_ms, bool *under, char *err, size_t errlen)
{
	proxy_quota *q = ctx;
	return auth_failures(q->fe.decide, q->fe.decide_ctx, false, keys, n, hits, window_ms, under,
			     err, errlen);
}

bool proxy_quota_ring_probe(proxy_quota *q)
{
	rl_cluster *cl;
	rl_req reqs[16];
	rl_resp resp[16];
	char keys[16][32], err[160], msg[256];
	const char *owners[16];
	size_t n = 0, i, j;
	int peers;

	if (q == NULL || q->grpc == NULL || q->fe.decide_ctx == (void *)q->lim)
		return true;
	cl = q->fe.decide_ctx;
	memset(reqs, 0, sizeof reqs);
	for (i = 0; i < 256 && n < 16; i++) {
		char key[32];
		const char *owner;
		bool seen = false;
		snprintf(key, sizeof key, "probe-%zu", i);
		owner = rl_cluster_owner_of(cl, "stripedb_ring_probe", key);
		if (owner == NULL || strcmp(owner, rl_cluster_advertise(cl)) == 0)
			continue;
		for (j = 0; j < n; j++)
			if (strcmp(owners[j], owner) == 0)
				seen = true;
		if (seen)
			continue;
		owners[n] = owner;
		snprintf(keys[n], sizeof keys[n], "%s", key);
		reqs[n].name = "stripedb_ring_probe";
		reqs[n].unique_key = keys[n];
		reqs[n].hits = 0;
		reqs[n].limit = 1;
		reqs[n].duration = 1000;
		reqs[n].behavior = RL_NO_BATCHING;
		n++;
	}
	if (n > 0 && q->fe.decide(q->fe.decide_ctx, reqs, n, resp, err, sizeof err) != 0)
		return false;
	for (i = 0; i < n; i++)
		if (resp[i].error[0])
			return false;
	return rl_cluster_health(cl, &peers, msg, sizeof msg);
}

bool proxy_quota_admit(proxy_quota *q, const char *db, int64_t docs, int64_t bytes,
		       int64_t *retry_after_ms, char *msg, size_t msglen)
{
	int rc;
	char tname[128] = "";
	int64_t lim[3] = {0, 0, 0}, hits[3] = {1, docs, bytes};
	static const char *const names[3] = {"stripedb_tenant_requests",
					      "stripedb_tenant_docs_written",
					      "stripedb_tenant_bytes"};
	static const char *const what[3] = {"requests", "documents written", "bytes"};
	int64_t period = 1000;
	rl_req reqs[3];
	rl_resp resp[3];
	size_t i, n = 0, idx[3];
	char err[128];
	bool ok = true;

	if (q == NULL)
		return true;
	uv_rwlock_rdlock(&q->lock);
	for (i = 0; i < q->nd; i++) {
		if (strcmp(q->d[i].db, db) == 0) {
			snprintf(tname, sizeof tname, "%s", q->d[i].tenant);
			break;
		}
	}
	for (i = 0; tname[0] && i < q->nt; i++) {
		if (strcmp(q->t[i].name, tname) == 0) {
			lim[0] = q->t[i].rps;
			lim[1] = q->t[i].dps;
			lim[2] = q->t[i].bps;
			period = q->t[i].period_ms;
		}
	}
	uv_rwlock_rdunlock(&q->lock);
	if (!tname[0])
		return true;
	memset(reqs, 0, sizeof reqs);
	for (i = 0; i < 3; i++) {
		if (lim[i] <= 0 || hits[i] <= 0)
			continue;
		reqs[n].name = names[i];
		reqs[n].unique_key = tname;
		reqs[n].hits = hits[i];
		reqs[n].limit = lim[i];
		reqs[n].duration = period;
		reqs[n].algorithm = RL_TOKEN_BUCKET;
		idx[n] = i;
		n++;
	}
	if (n == 0)
		return true;
	shardconn_wait_begin(); /* the decision may ask the key's owner on the peer ring */
	rc = q->fe.decide(q->fe.decide_ctx, reqs, n, resp, err, sizeof err);
	shardconn_wait_end();
	if (rc != 0) {
		sdb_warn("quota decision failed: admitting", "tenant=%s err=\"%s\"", tname, err);
		return true;
	}
	*retry_after_ms = 0;
	for (i = 0; i < n; i++) {
		if (resp[i].error[0] || resp[i].status != RL_OVER_LIMIT)
			continue;
		if (ok)
		{
			if (period == 1000)
				snprintf(msg, msglen, "tenant %s is over its quota of %lld %s/s", tname,
					 (long long)lim[idx[i]], what[idx[i]]);
			else
				snprintf(msg, msglen, "tenant %s is over its quota of %lld %s per %lld ms",
					 tname, (long long)lim[idx[i]], what[idx[i]], (long long)period);
		}
		ok = false;
		if (resp[i].retry_after < 0)
			*retry_after_ms = period;
		else if (resp[i].retry_after > *retry_after_ms)
			*retry_after_ms = resp[i].retry_after;
	}
	if (!ok && *retry_after_ms <= 0)
		*retry_after_ms = 1;
	return ok;
}
