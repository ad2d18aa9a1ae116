/* Proxy findAndModify (issue #6): straight to the chunk an exact shard key pins; otherwise
 * (not for upserts) two phases, the first owned candidate across the targeted chunks by the
 * command's sort, then the command on {$and: [query, {_id: candidate's}]} at its chunk. A
 * retried retryable findAndModify without an exact key is answered from the shard's
 * record of it (px_probe_executed, write.c). */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proxy/exec.h"
#include "proxy/txn.h"
#include "proxy/write_int.h"

/* findAndModify's operation on a sharded collection. */
typedef struct fam_op {
	const bson_t *query;
	const bson_t *sort; /* NULL: none */
	merge_sort *ms;     /* the order of candidates across chunks */
	bool upsert;
	bool probed;        /* a retryable write's shards were asked for its recorded result */
	bool stale_copy;    /* the last stale refusal is answered as the shard gave it */
} fam_op;

static const int64_t fam_stmt = 0; /* findAndModify is statement 0 (stmtId as given) */

/* The shard's answer of a pinned or final findAndModify sent to chunk ci of r->rc as fwd.
 * PX_RETRY_STALE keeps the refusal (answered as it is when the budget is spent). */
static int fam_send(px_retry *r, fam_op *o, size_t ci, bson_t *fwd, bool check_value)
{
	ctx *c = r->c;
	bson_t reply;
	char nerr[256];
	int cls;

	px_append_version(fwd, &r->rc->chunks[ci]);
	px_append_key_check(r->rc, c->cmd, "update", fwd);
	proxy_txn_append(&c->txn, fwd, &fam_stmt, 1);
	cls = px_run_on(c, r->rc->chunks[ci].shard, fwd, NULL, &reply, nerr, sizeof nerr);
	if (cls == SHARDCONN_STALE) {
		px_failure_set(&r->last, cls, &reply, nerr);
		o->stale_copy = true;
		bson_destroy(&reply);
		return PX_RETRY_STALE;
	}
	if (cls == SHARDCONN_OK && check_value && r->attempt < 3) {
		bson_iter_t v;
		if (bson_iter_init_find(&v, &reply, "value") && BSON_ITER_HOLDS_NULL(&v)) {
			/* the candidate changed under us: look again */
			bson_destroy(&reply);
			return PX_RETRY_AGAIN;
		}
	}
	r->status = px_reply_write_result(c, cls, &reply, nerr);
	bson_destroy(&reply);
	return PX_RETRY_DONE;
}

/* A retry of a retryable findAndModify that ran on some shard: answer its recorded reply.
 * True when answered (recorded, or a shard could not be asked), *status then the answer's
 * status. */
static bool fam_probe(ctx *c, route_coll *rc, const bool *sel, int *status)
{
	bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
	char nerr[256];
	int pr = px_probe_executed(c, rc, sel, fam_stmt, &res, &er, nerr, sizeof nerr);

	if (pr == 1) {
		bson_t *out = bson_new();
		bson_copy_to_excluding_noinit(&res, out, "ok", NULL);
		BSON_APPEND_DOUBLE(out, "ok", 1.0);
		*status = px_reply(c, out);
	} else if (pr < 0 && px_get_int(&er, "code", 0)) {
		*status = px_reply_shard_error(c, SHARDCONN_CMD_ERR, &er, nerr);
	} else if (pr < 0) {
		*status = px_reply_retryable_net_error(c, shardconn_unexecuted(&er), nerr);
	}
	bson_destroy(&res);
	bson_destroy(&er);
	return pr != 0;
}

/* Two phases: the first owned candidate across the selected chunks (by the sort), then
 * the command on {$and: [query, {_id: <candidate's>}]} at its chunk. */
static int fam_two_phase(px_retry *r, fam_op *o, const bool *sel)
{
	ctx *c = r->c;
	route_coll *rc = r->rc;
	bson_t fwd = BSON_INITIALIZER, best = BSON_INITIALIZER;
	bool have_best = false;
	size_t i, best_chunk = 0;
	char nerr[256];
	int cls, res;

	for (i = 0; i < rc->nchunks; i++) {
		bson_t docs = BSON_INITIALIZER, er = BSON_INITIALIZER;
		size_t n = 0;
		bson_iter_t it;
		if (!sel[i])
			continue;
		cls = px_collect_owned(c, rc, i, o->query, o->sort, c->cmd, 1, NULL, &docs, &n, &er, nerr,
				       sizeof nerr);
		if (cls != SHARDCONN_OK) {
			if (cls != SHARDCONN_STALE)
				r->status = px_reply_shard_error(c, cls, &er, nerr);
			bson_destroy(&docs);
			bson_destroy(&er);
			bson_destroy(&best);
			o->stale_copy = false;
			return cls == SHARDCONN_STALE ? PX_RETRY_STALE : PX_RETRY_DONE;
		}
		if (n > 0 && bson_iter_init(&it, &docs) && bson_iter_next(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t d;
			bson_iter_document(&it, &len, &data);
			bson_init_static(&d, data, len);
			if (!have_best || merge_sort_cmp(o->ms, &d, &best) < 0) {
				bson_destroy(&best);
				bson_copy_to(&d, &best);
				best_chunk = i;
				have_best = true;
			}
		}
		bson_destroy(&docs);
		bson_destroy(&er);
	}
	if (!have_best) {
		bson_t *out = bson_new(), leo;
		bson_destroy(&best);
		bson_append_document_begin(out, "lastErrorObject", -1, &leo);
		BSON_APPEND_INT32(&leo, "n", 0);
		if (!px_get_bool(c->cmd, "remove", false))
			BSON_APPEND_BOOL(&leo, "updatedExisting", false);
		bson_append_document_end(out, &leo);
		BSON_APPEND_NULL(out, "value");
		BSON_APPEND_DOUBLE(out, "ok", 1.0);
		r->status = px_reply(c, out);
		return PX_RETRY_DONE;
	}
	{
		bson_iter_t it, idit;
		bson_t q2, and, idq;
		bson_init(&q2);
		bson_append_array_begin(&q2, "$and", -1, &and);
		BSON_APPEND_DOCUMENT(&and, "0", o->query);
		bson_append_document_begin(&and, "1", -1, &idq);
		if (bson_iter_init_find(&idit, &best, "_id"))
			bson_append_iter(&idq, "_id", -1, &idit);
		bson_append_document_end(&and, &idq);
		bson_append_array_end(&q2, &and);
		bson_iter_init(&it, c->cmd);
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (px_is_session_field(k) || strcmp(k, "sort") == 0)
				continue;
			if (strcmp(k, "query") == 0)
				continue;
			bson_append_iter(&fwd, k, -1, &it);
		}
		BSON_APPEND_DOCUMENT(&fwd, "query", &q2);
		bson_destroy(&q2);
	}
	res = fam_send(r, o, best_chunk, &fwd, true);
	bson_destroy(&fwd);
	bson_destroy(&best);
	return res;
}

/* One attempt: straight to the chunk an exact shard key pins; otherwise (not for upserts)
 * the recorded result of a retried retryable write, or the two phases. */
static int fam_execute(px_retry *r, void *arg)
{
	fam_op *o = arg;
	ctx *c = r->c;
	size_t nsel, i;
	bool exact;
	bool *sel = px_target(r->rc, o->query, c->cmd, &nsel, &exact);
	int res = PX_RETRY_DONE;

	if (exact && nsel == 1) {
		bson_t fwd = BSON_INITIALIZER;
		for (i = 0; !sel[i]; i++)
			;
		px_copy_cmd(c->cmd, &fwd, NULL);
		res = fam_send(r, o, i, &fwd, false);
		bson_destroy(&fwd);
	} else if (o->upsert) {
		r->status = px_error(c, ERR_SHARD_KEY_NOT_FOUND,
				     "Query for sharded findAndModify with upsert: true must contain "
				     "the shard key");
	} else {
		bool answered = false;
		if (c->txn.on && !o->probed) {
			o->probed = true;
			answered = fam_probe(c, r->rc, sel, &r->status);
		}
		if (!answered)
			res = fam_two_phase(r, o, sel);
	}
	free(sel);
	return res;
}

/* The budget is spent: a refusal of the command itself is answered as the shard gave it,
 * one of the candidate search as StaleConfig. */
static void fam_exhausted(px_retry *r, void *arg)
{
	fam_op *o = arg;

	if (o->stale_copy)
		r->status = px_reply_copy(r->c, &r->last.reply);
	else
		r->status = px_error(r->c, WIRE_ERR_STALE_CONFIG,
				     "routing kept changing: StaleConfig retry budget exhausted");
}

int px_do_find_and_modify(ctx *c)
{
	bson_t query, sort, update;
	bool has_q = px_get_doc(c->cmd, "query", &query);
	bool has_sort = px_get_doc(c->cmd, "sort", &sort);
	route_coll *rc;
	char err[512];
	fam_op o;
	px_retry r;
	int st;

	if (!has_q)
		bson_init(&query);
	if ((st = px_refuse_js(c, &query)) != 0)
		return st;
	if ((st = px_route_sharded(c, PX_FWD_PLAIN, 0, false, &rc)) != 0 || rc == NULL)
		return st;
	/* under a collation the query pins no key bytes: the shard checks (px_append_key_check) */
	route_key_change kc = px_get_doc(c->cmd, "update", &update) && !px_holder_collated(c->cmd)
				      ? route_update_changes_key(rc, &update, &query, err, sizeof err)
				      : ROUTE_KEY_KEPT;
	if (kc != ROUTE_KEY_KEPT) {
		route_coll_unref(rc);
		return px_error(c,
				kc == ROUTE_KEY_NOT_PINNED ? ERR_SHARD_KEY_NOT_FOUND
				: WIRE_ERR_IMMUTABLE_FIELD,
				"%s", err);
	}
	memset(&o, 0, sizeof o);
	o.query = &query;
	o.sort = has_sort ? &sort : NULL;
	o.upsert = px_get_bool(c->cmd, "upsert", false);
	merge_sort_parse(o.sort, &o.ms, NULL, err, sizeof err);
	px_retry_init(&r, c, rc, fam_execute, fam_exhausted, &o);
	px_retry_run(&r);
	px_retry_done(&r);
	merge_sort_free(o.ms);
	return r.status; /* answered by fam_execute or fam_exhausted */
}
