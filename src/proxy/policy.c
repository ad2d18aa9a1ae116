/* Proxy admission (tenant quotas, quota.h) and collection policy switches
 * ("minimum features": forbidScatter, forbidUnbounded, forbidUnindexed). */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/gate.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/cmdopts.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "proxy/txn.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

/* Admission: the tenant's quotas (proxy/quota.h). 0, or RateLimited answered when over. */
int px_admit(ctx *c, const px_cmd *cmd)
{
	int64_t docs = 0, retry = 0;
	char msg[256];
	bson_t arr;
	bson_iter_t it;
	const char *field = cmd->stmts;

	if (cmd->flags & PXC_FREE)
		return 0;
	if (cmd->flags & PXC_ONE_DOC)
		docs = 1;
	if (field && px_get_array(c->cmd, field, &arr) && bson_iter_init(&it, &arr))
		while (bson_iter_next(&it))
			docs++;
	if (proxy_quota_admit(c->p->quota, c->db, docs, (int64_t)proxy_bson_len(c->cmd), &retry, msg,
			      sizeof msg))
		return 0;
	sdb_counter_inc(c->p->m_rejected);
	{
		bson_t *extra = bson_new();
		BSON_APPEND_INT64(extra, "retryAfterMS", retry);
		return px_error_extra(c, WIRE_ERR_RATE_LIMITED, extra, "%s", msg);
	}
}

/* ---------- collection policy ("minimum features") ---------- */

#define ERR_NO_QUERY_EXECUTION_PLANS 291

/* True when the shard would scan the whole collection for filter q (explain). */
static bool plan_is_collscan(ctx *c, const char *shard, const bson_t *q)
{
	bson_t cmd = BSON_INITIALIZER, inner, reply;
	bson_iter_t it;
	char nerr[256];
	bool scan = false;

	bson_append_document_begin(&cmd, "explain", -1, &inner);
	BSON_APPEND_UTF8(&inner, "find", c->coll);
	BSON_APPEND_DOCUMENT(&inner, "filter", q);
	bson_append_document_end(&cmd, &inner);
	BSON_APPEND_UTF8(&cmd, "verbosity", "queryPlanner");
	if (px_run_on(c, shard, &cmd, NULL, &reply, nerr, sizeof nerr) == SHARDCONN_OK &&
	    bson_iter_init(&it, &reply) &&
	    bson_iter_find_descendant(&it, "queryPlanner.winningPlan.stage", &it) &&
	    BSON_ITER_HOLDS_UTF8(&it))
		scan = strcmp(bson_iter_utf8(&it, NULL), "COLLSCAN") == 0;
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return scan;
}

/* Check one filter against the scatter and unindexed switches: 0, or the refusal's code
 * answered. */
static int policy_filter_check(ctx *c, unsigned flags, route_coll *rc, const bson_t *q)
{
	char *shard = NULL;
	int st = 0;

	if (rc->nchunks > 0) {
		bool *sel = sdb_calloc(rc->nchunks, sizeof *sel), exact;
		size_t nsel = route_target(rc, q, sel, &exact), i;
		if ((flags & PROXY_POLICY_NO_SCATTER) && rc->nchunks > 1 && nsel == rc->nchunks &&
		    !exact) {
			st = px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				      "scatter-gather queries are forbidden on %s by its collection "
				      "policy: the filter must use the shard key",
				      c->ns);
		}
		for (i = 0; st == 0 && i < rc->nchunks && shard == NULL; i++)
			if (sel[i])
				shard = sdb_strdup(rc->chunks[i].shard);
		free(sel);
	} else {
		shard = px_primary(c);
	}
	if (st == 0 && (flags & PROXY_POLICY_NO_UNINDEXED) && shard &&
	    plan_is_collscan(c, shard, q))
		st = px_error(c, ERR_NO_QUERY_EXECUTION_PLANS,
			      "No indexed plans available for this filter on %s, and its collection "
			      "policy forbids unindexed queries (forbidUnindexed)",
			      c->ns);
	free(shard);
	return st;
}

/* The collection policy switches (proxy/quota.h): 0, or the refusal's code answered. */
int px_policy_check(ctx *c, const px_cmd *cmd)
{
	unsigned flags;
	bson_t q, arr, empty = BSON_INITIALIZER;
	bool bounded = true, has_q = false;
	int st = 0;
	const char *stmts = NULL;
	route_coll *rc;
	char err[256];
	bson_iter_t it;

	if (c->coll == NULL)
		return 0;
	flags = proxy_policy(c->p->quota, c->db, c->ns);
	if (flags == 0)
		return 0;
	switch (cmd->policy) {
	case PXP_FIND:
		has_q = px_get_doc(c->cmd, "filter", &q);
		bounded = px_get_int(c->cmd, "limit", 0) != 0;
		break;
	case PXP_QUERY:
		has_q = px_get_doc(c->cmd, "query", &q);
		break;
	case PXP_AGGREGATE:
		bounded = false;
		if (px_get_array(c->cmd, "pipeline", &arr) && bson_iter_init(&it, &arr)) {
			bool first = true;
			while (bson_iter_next(&it)) {
				bson_t st;
				uint32_t len;
				const uint8_t *data;
				if (!BSON_ITER_HOLDS_DOCUMENT(&it))
					continue;
				bson_iter_document(&it, &len, &data);
				if (!bson_init_static(&st, data, len))
					continue;
				if (bson_has_field(&st, "$limit") || bson_has_field(&st, "$count") ||
				    bson_has_field(&st, "$sample"))
					bounded = true;
				if (first && px_get_doc(&st, "$match", &q))
					has_q = true;
				first = false;
			}
		}
		break;
	case PXP_STMTS:
		stmts = cmd->stmts;
		break;
	case PXP_NONE:
		return 0;
	}
	if ((flags & PROXY_POLICY_NO_UNBOUNDED) && !bounded)
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"unbounded result sets are forbidden on %s by its collection policy: "
				"give a limit",
				c->ns);
	if (!(flags & (PROXY_POLICY_NO_SCATTER | PROXY_POLICY_NO_UNINDEXED)))
		return 0;
	rc = px_route(c, false, err, sizeof err);
	if (rc == NULL)
		return 0; /* the handler reports the routing problem */
	if (stmts) {
		if (px_get_array(c->cmd, stmts, &arr) && bson_iter_init(&it, &arr)) {
			while (st == 0 && bson_iter_next(&it)) {
				bson_t sq;
				if (px_stmt_filter(&it, &sq))
					st = policy_filter_check(c, flags, rc, &sq);
			}
		}
	} else {
		st = policy_filter_check(c, flags, rc, has_q ? &q : &empty);
	}
	route_coll_unref(rc);
	return st;
}

