/* $out and $merge through a proxy (issue #20; mongos' placement of a writing stage,
 * cluster_aggregation_planner.cpp and DocumentSourceOut/Merge on mongos).
 *
 * Source and target unsharded (no sharded $lookup/$unionWith collection either) with the
 * same primary shard: the whole aggregate goes to that shard, which runs the pipeline and
 * writes through its replicated write path (src/shard/cmd_outmerge.c). Otherwise the proxy
 * runs the pipeline before the writing stage through its own routing (px_sub_aggregate:
 * the same path as a client's aggregate) and writes the output itself:
 *  - $merge: update statements built as a shard builds them (common/aggwrite.h
 *    sdb_aggw_merge_stmt; inserts for whenMatched fail), run in batches through the
 *    proxy's write path (px_do_write / px_do_insert on a copy of the request), so a
 *    sharded target's documents are routed per statement by their `on` filter, with the
 *    StaleConfig retries of any write; whenNotMatched fail checks every statement matched
 *    (13113). The `on` fields need a unique index of the target (listIndexes: 51183);
 *    without `on`, a sharded target's `on` is its document key (shard key fields and
 *    _id), as mongos.
 *  - $out: refused for a sharded target (28769, as mongod); else a temporary collection
 *    `tmp.agg_out.<uuid>` on the target database's primary shard gets the target's
 *    secondary indexes and the documents (inserted on that shard), then renameCollection
 *    with dropTarget moves it over the target there in one step; on an error the temporary
 *    collection is dropped.
 * An aggregate in a transaction is refused (263), as mongod. A database-level
 * {aggregate: 1} ($documents) runs on the database's primary shard the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/aggwrite.h"
#include "common/alloc.h"
#include "common/err.h"
#include "proxy/exec.h"
#include "routing/route.h"
#include "storage/pipeline.h"

#define OM_BATCH_DOCS SDB_AGGW_BATCH_DOCS
#define OM_BATCH_BYTES SDB_AGGW_BATCH_BYTES

/* The outcome of one write of the proxy. */
typedef struct om_res {
	int code; /* 0, or the command's / its first writeError's code */
	char errmsg[1024];
	bson_t extra; /* keyPattern / keyValue */
	int64_t n;
	bson_t wce; /* the last writeConcernError (empty: none) */
} om_res;

/* Read a write's reply (ok: 1) into r: n, the first writeError, a writeConcernError. */
static void read_reply(const bson_t *reply, om_res *r)
{
	bson_iter_t f;
	r->n = px_get_int(reply, "n", 0);
	sdb_aggw_first_write_error(reply, &r->code, r->errmsg, sizeof r->errmsg, &r->extra);
	if (bson_iter_init_find(&f, reply, "writeConcernError") && BSON_ITER_HOLDS_DOCUMENT(&f)) {
		bson_t d;
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&f, &len, &data);
		if (bson_init_static(&d, data, len)) {
			bson_reinit(&r->wce);
			bson_concat(&r->wce, &d);
		}
	}
}

/* Run cmd through the handler run on a copy t of the target's ctx (px_sub_run). */
static void sub_write(ctx *t, int (*run)(ctx *), const bson_t *cmd, om_res *r)
{
	bson_t *reply = NULL;
	int code = 0;
	if (px_sub_run(t, run, cmd, &reply, &code, r->errmsg, sizeof r->errmsg) != 0) {
		r->code = code ? code : WIRE_ERR_INTERNAL;
		return;
	}
	read_reply(reply, r);
	bson_destroy(reply);
}

/* Run cmd on shard in t->db (px_run_on) into r. */
static void shard_write(ctx *t, const char *shard, const bson_t *cmd, om_res *r)
{
	bson_t reply;
	char nerr[256];
	bson_iter_t f;
	int cls = px_run_on(t, shard, cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls == SHARDCONN_NET_ERR) {
		r->code = WIRE_ERR_HOST_UNREACHABLE;
		snprintf(r->errmsg, sizeof r->errmsg, "%s", nerr);
	} else if (cls != SHARDCONN_OK) {
		r->code = bson_iter_init_find(&f, &reply, "code") ? (int)bson_iter_as_int64(&f)
								  : WIRE_ERR_INTERNAL;
		snprintf(r->errmsg, sizeof r->errmsg, "%s",
			 bson_iter_init_find(&f, &reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&f)
				 ? bson_iter_utf8(&f, NULL)
				 : "shard error");
	} else {
		read_reply(&reply, r);
	}
	bson_destroy(&reply);
}

static int do_update(ctx *c)
{
	return px_do_write(c, true);
}

/* The client's writeConcern and bypassDocumentValidation on a write built for it. */
static void append_client_opts(const ctx *c, bson_t *cmd)
{
	bson_t wc;
	bson_iter_t it;
	if (px_get_doc(c->cmd, "writeConcern", &wc))
		BSON_APPEND_DOCUMENT(cmd, "writeConcern", &wc);
	if (bson_iter_init_find(&it, c->cmd, "bypassDocumentValidation"))
		BSON_APPEND_BOOL(cmd, "bypassDocumentValidation", bson_iter_as_bool(&it));
}

/* The target's index specs (listIndexes through the proxy's routing) without `_id_`, as
 * an array into specs (initialised by the caller); *count of them. A missing collection
 * has none. Returns: 0, or the error code with the message in r. */
static int target_indexes(ctx *t, bson_t *specs, uint32_t *count, om_res *r)
{
	bson_t cmd = BSON_INITIALIZER, cur, *reply = NULL;
	bson_iter_t it, c2, arr;
	int code = 0;
	BSON_APPEND_UTF8(&cmd, "listIndexes", t->coll);
	bson_append_document_begin(&cmd, "cursor", -1, &cur);
	bson_append_document_end(&cmd, &cur);
	int rc = px_sub_run(t, px_do_list_indexes, &cmd, &reply, &code, r->errmsg,
			    sizeof r->errmsg);
	bson_destroy(&cmd);
	*count = 0;
	if (rc != 0)
		return code == WIRE_ERR_NAMESPACE_NOT_FOUND ? 0 : (r->code = code ? code : 1);
	if (bson_iter_init_find(&it, reply, "cursor") && bson_iter_recurse(&it, &c2) &&
	    bson_iter_find(&c2, "firstBatch") && bson_iter_recurse(&c2, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t f;
			bson_t spec = BSON_INITIALIZER;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_recurse(&arr, &f);
			bool is_id = false;
			while (bson_iter_next(&f)) {
				const char *k = bson_iter_key(&f);
				if (strcmp(k, "name") == 0 && BSON_ITER_HOLDS_UTF8(&f) &&
				    strcmp(bson_iter_utf8(&f, NULL), "_id_") == 0)
					is_id = true;
				if (strcmp(k, "v") != 0 && strcmp(k, "ns") != 0)
					bson_append_iter(&spec, NULL, 0, &f);
			}
			if (!is_id) {
				char key[16];
				const char *kp;
				bson_uint32_to_string((*count)++, &kp, key, sizeof key);
				BSON_APPEND_DOCUMENT(specs, kp, &spec);
			}
			bson_destroy(&spec);
		}
	}
	bson_destroy(reply);
	return 0;
}

/* $merge's 51183: a unique index of the target on exactly the `on` fields. */
static int check_unique(ctx *t, const sdb_aggw *w, om_res *r)
{
	bson_t specs = BSON_INITIALIZER;
	uint32_t n;
	bson_iter_t it;
	bool found = false;
	if (w->n_on == 1 && strcmp(w->on[0], "_id") == 0) {
		bson_destroy(&specs);
		return 0;
	}
	if (target_indexes(t, &specs, &n, r) != 0) {
		bson_destroy(&specs);
		return r->code;
	}
	bson_iter_init(&it, &specs);
	while (!found && bson_iter_next(&it)) {
		bson_t spec, key;
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		if (!bson_init_static(&spec, data, len) || !px_get_doc(&spec, "key", &key))
			continue;
		found = sdb_aggw_index_supports(w, &key, &spec);
	}
	bson_destroy(&specs);
	if (!found) {
		r->code = 51183;
		snprintf(r->errmsg, sizeof r->errmsg,
			 "Cannot find index to verify that join fields will be unique");
	}
	return r->code;
}

static void run_merge(ctx *c, ctx *t, const sdb_aggw *w, const bson_t *vars, bson_t **docs,
		      size_t n, om_res *r)
{
	size_t pos = 0;
	bool fail_mode = w->when_matched == SDB_WM_FAIL;
	while (pos < n && r->code == 0) {
		bson_t cmd = BSON_INITIALIZER, arr;
		size_t bytes = 0, k = 0;
		BSON_APPEND_UTF8(&cmd, fail_mode ? "insert" : "update", w->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, fail_mode ? "documents" : "updates", &arr);
		while (pos < n && k < OM_BATCH_DOCS &&
		       (k == 0 || bytes + 2 * docs[pos]->len < OM_BATCH_BYTES)) {
			bson_t d, st, f;
			char key[16];
			const char *kp;
			sdb_aggw_with_id(w, docs[pos], &d);
			bson_uint32_to_string((uint32_t)k++, &kp, key, sizeof key);
			if (fail_mode) {
				r->code = sdb_aggw_on_filter(w, &d, &f, r->errmsg, sizeof r->errmsg);
				bson_destroy(&f);
				BSON_APPEND_DOCUMENT(&arr, kp, &d);
			} else {
				bson_append_document_begin(&arr, kp, -1, &st);
				r->code = sdb_aggw_merge_stmt(w, &d, vars, sdb_pipeline_eval_expr_vars, &st,
							      r->errmsg, sizeof r->errmsg);
				bson_append_document_end(&arr, &st);
			}
			bytes += 2 * d.len;
			bson_destroy(&d);
			pos++;
			if (r->code != 0)
				break;
		}
		bson_append_array_end(&cmd, &arr);
		BSON_APPEND_BOOL(&cmd, "ordered", true);
		append_client_opts(c, &cmd);
		if (r->code == 0) {
			sub_write(t, fail_mode ? px_do_insert : do_update, &cmd, r);
			if (r->code == 0 && w->when_not_matched == SDB_WNM_FAIL && r->n != (int64_t)k) {
				r->code = 13113; /* MergeStageNoMatchingDocument */
				snprintf(r->errmsg, sizeof r->errmsg,
					 "$merge could not find a matching document in the target "
					 "collection for at least one document in the source "
					 "collection");
			}
		}
		bson_destroy(&cmd);
	}
}

/* The target's create options (listCollections on its primary shard, without uuid:
 * mongod's _originalOutOptions) into opts (initialised by the caller), so the output keeps
 * them; *exists whether the target exists, *view whether it is a view. Nothing when the
 * target does not exist or cannot be read (the create then makes a plain collection). */
static void target_options(ctx *t, const char *primary, bson_t *opts, bool *exists, bool *view)
{
	bson_t lc = BSON_INITIALIZER, f, reply;
	bson_iter_t it, cur, arr, e, o;
	char nerr[256];
	*exists = *view = false;
	BSON_APPEND_INT32(&lc, "listCollections", 1);
	bson_append_document_begin(&lc, "filter", -1, &f);
	BSON_APPEND_UTF8(&f, "name", t->coll);
	bson_append_document_end(&lc, &f);
	int cls = px_run_on(t, primary, &lc, NULL, &reply, nerr, sizeof nerr);
	bson_destroy(&lc);
	if (cls == SHARDCONN_OK && bson_iter_init_find(&it, &reply, "cursor") &&
	    bson_iter_recurse(&it, &cur) && bson_iter_find(&cur, "firstBatch") &&
	    bson_iter_recurse(&cur, &arr) && bson_iter_next(&arr) &&
	    BSON_ITER_HOLDS_DOCUMENT(&arr)) {
		*exists = true;
		if (bson_iter_recurse(&arr, &e) && bson_iter_find(&e, "type") &&
		    BSON_ITER_HOLDS_UTF8(&e) && strcmp(bson_iter_utf8(&e, NULL), "view") == 0)
			*view = true;
		if (bson_iter_recurse(&arr, &e) && bson_iter_find(&e, "options") &&
		    BSON_ITER_HOLDS_DOCUMENT(&e) && bson_iter_recurse(&e, &o)) {
			while (bson_iter_next(&o)) {
				if (strcmp(bson_iter_key(&o), "viewOn") == 0)
					*view = true;
				if (strcmp(bson_iter_key(&o), "uuid") != 0 &&
				    strcmp(bson_iter_key(&o), "create") != 0)
					bson_append_iter(opts, NULL, 0, &o);
			}
		}
	}
	bson_destroy(&reply);
}

static void run_out(ctx *c, ctx *t, const sdb_aggw *w, const char *primary, bson_t **docs,
		    size_t n, om_res *r)
{
	char tmp[128], uh[33];
	bson_oid_t oid;
	bson_t specs = BSON_INITIALIZER, cmd;
	uint32_t nspecs = 0;
	static const char hex[] = "0123456789abcdef";

	bson_oid_init(&oid, NULL);
	for (int i = 0; i < 16; i++) {
		uint8_t b = i < 12 ? oid.bytes[i] : 0;
		uh[2 * i] = hex[b >> 4];
		uh[2 * i + 1] = hex[b & 15];
	}
	uh[32] = '\0';
	snprintf(tmp, sizeof tmp, "tmp.agg_out.%.8s-%.4s-%.4s-%.4s-%.12s", uh, uh + 8, uh + 12,
		 uh + 16, uh + 20);
	bson_t opts = BSON_INITIALIZER, expect = BSON_INITIALIZER;
	bool exists, view;
	/* a view first, named as the shard names it (not the temporary collection) */
	target_options(t, primary, &opts, &exists, &view);
	if (view) {
		r->code = 166; /* CommandNotSupportedOnView */
		snprintf(r->errmsg, sizeof r->errmsg, "Namespace %s.%s is a view, not a collection",
			 w->db, w->coll);
		bson_destroy(&opts);
		bson_destroy(&expect);
		bson_destroy(&specs);
		return;
	}
	if (target_indexes(t, &specs, &nspecs, r) != 0) {
		bson_destroy(&opts);
		bson_destroy(&expect);
		bson_destroy(&specs);
		return;
	}
	/* the rename checks on the shard, in its own transaction, that the target's options
	 * and indexes are still these (mongod's internalRenameIfOptionsAndIndexesMatch: 125);
	 * read here before the writes, through listCollections and listIndexes */
	BSON_APPEND_BOOL(&expect, "exists", exists);
	BSON_APPEND_DOCUMENT(&expect, "options", &opts);
	BSON_APPEND_ARRAY(&expect, "indexes", &specs);
	bson_init(&cmd);
	BSON_APPEND_UTF8(&cmd, "create", tmp);
	bson_concat(&cmd, &opts);
	bson_destroy(&opts);
	shard_write(t, primary, &cmd, r);
	bson_destroy(&cmd);
	bool created = r->code == 0;
	if (r->code == 0 && nspecs > 0) {
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "createIndexes", tmp);
		BSON_APPEND_ARRAY(&cmd, "indexes", &specs);
		/* a copy of the target's existing specs: not refused for the options a
		 * client may no longer ask for (src/shard/cmd_admin.c refuse_index_options) */
		BSON_APPEND_BOOL(&cmd, "$stripedbIndexCopy", true);
		shard_write(t, primary, &cmd, r);
		bson_destroy(&cmd);
	}
	bson_destroy(&specs);
	size_t pos = 0;
	while (r->code == 0 && pos < n) {
		bson_init(&cmd);
		sdb_aggw_insert_batch(&cmd, tmp, docs, n, &pos);
		append_client_opts(c, &cmd);
		shard_write(t, primary, &cmd, r);
		bson_destroy(&cmd);
	}
	if (r->code == 0) {
		char from[512], to[512];
		ctx ta = *t;
		ta.db = "admin";
		snprintf(from, sizeof from, "%s.%s", w->db, tmp);
		snprintf(to, sizeof to, "%s.%s", w->db, w->coll);
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "renameCollection", from);
		BSON_APPEND_UTF8(&cmd, "to", to);
		BSON_APPEND_BOOL(&cmd, "dropTarget", true);
		BSON_APPEND_DOCUMENT(&cmd, "$stripedbIfTargetMatches", &expect);
		append_client_opts(c, &cmd);
		shard_write(&ta, primary, &cmd, r);
		bson_destroy(&cmd);
	}
	bson_destroy(&expect);
	if (r->code != 0 && created) {
		om_res dr;
		memset(&dr, 0, sizeof dr);
		bson_init(&dr.extra);
		bson_init(&dr.wce);
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "drop", tmp);
		shard_write(t, primary, &cmd, &dr); /* best effort, as mongod's cleanup */
		bson_destroy(&cmd);
		bson_destroy(&dr.extra);
		bson_destroy(&dr.wce);
	}
}

/* exec.h */
int px_agg_write(ctx *c, const sdb_aggw *w, int64_t batch)
{
	const char *stage = w->kind == SDB_AGGW_OUT ? "$out" : "$merge";
	char err[512];
	route_coll *src = NULL, *tgt = NULL;
	char *psrc = NULL, *ptgt = NULL;
	bool cross = false, foreign_sharded = false;
	int st = 0;

	if (c->tx != NULL)
		return px_error(c, 263, "%s cannot be used in a transaction", stage);
	ctx t = *c;
	t.db = w->db;
	t.coll = w->coll;
	snprintf(t.ns, sizeof t.ns, "%s.%s", w->db, w->coll);
	memset(&t.txn, 0, sizeof t.txn);
	t.rp_data = NULL;
	t.rp_len = 0;
	tgt = px_route(&t, false, err, sizeof err);
	if (tgt == NULL)
		return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
	if (c->coll != NULL) {
		src = px_route(c, false, err, sizeof err);
		if (src == NULL) {
			route_coll_unref(tgt);
			return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
		}
	}
	if ((st = px_agg_placement(c, &w->stages, &cross, &foreign_sharded)) != 0)
		goto out;
	psrc = px_primary(c);
	ptgt = px_primary(&t);
	if (psrc == NULL || ptgt == NULL) {
		st = px_error(c, WIRE_ERR_SHARD_NOT_FOUND,
			      "no shard is registered in the metadata service");
		goto out;
	}
	if ((src == NULL || src->nkeys == 0) && !foreign_sharded && tgt->nkeys == 0 &&
	    strcmp(psrc, ptgt) == 0) {
		/* everything on one shard: it runs the whole aggregate and writes itself */
		st = px_forward_primary_cursor(c, batch, false);
		goto out;
	}
	if (w->kind == SDB_AGGW_OUT && tgt->nkeys > 0) {
		st = px_error(c, 28769, "%s cannot be sharded", t.ns);
		goto out;
	}
	om_res r;
	memset(&r, 0, sizeof r);
	bson_init(&r.extra);
	bson_init(&r.wce);
	/* mongos: without `on`, a sharded target's document key (its shard key fields and
	 * _id) is the `on` of $merge (ensureFieldsUniqueOrResolveDocumentKey), so that every
	 * statement is routed to one shard; no unique index is needed for it */
	sdb_aggw wk = *w; /* a shallow copy: only its `on` differs; w owns the rest */
	if (w->kind == SDB_AGGW_MERGE && !w->on_given && tgt->nkeys > 0) {
		wk.n_on = 0;
		for (size_t i = 0; i < tgt->nkeys && wk.n_on < SDB_AGGW_MAX_ON; i++)
			snprintf(wk.on[wk.n_on++], sizeof wk.on[0], "%s", tgt->keys[i]);
		bool has_id = false;
		for (size_t i = 0; i < wk.n_on; i++)
			has_id |= strcmp(wk.on[i], "_id") == 0;
		if (!has_id && wk.n_on < SDB_AGGW_MAX_ON)
			snprintf(wk.on[wk.n_on++], sizeof wk.on[0], "_id");
	}
	if (w->kind == SDB_AGGW_MERGE && w->on_given)
		check_unique(&t, w, &r);
	bson_t **docs = NULL;
	size_t n = 0;
	bson_t vars = BSON_INITIALIZER;
	if (r.code == 0) {
		int code = 0;
		bson_destroy(&vars);
		if ((st = px_let(c, &vars)) != 0) {
			bson_destroy(&r.extra);
			bson_destroy(&r.wce);
			goto out;
		}
		if (px_sub_aggregate(c, c->coll, &w->stages, &vars, &docs, &n, &code, r.errmsg,
				     sizeof r.errmsg) != 0)
			r.code = code ? code : WIRE_ERR_INTERNAL;
	}
	if (r.code == 0) {
		if (w->kind == SDB_AGGW_MERGE)
			run_merge(c, &t, &wk, &vars, docs, n, &r);
		else
			run_out(c, &t, w, ptgt, docs, n, &r);
	}
	bson_destroy(&vars);
	for (size_t i = 0; i < n; i++)
		bson_destroy(docs[i]);
	free(docs);
	if (r.code != 0) {
		st = px_error_extra(c, r.code, bson_empty(&r.extra) ? NULL : bson_copy(&r.extra),
				    "%s", r.errmsg);
	} else {
		bson_t *reply = bson_new(), cur, arr;
		bson_append_document_begin(reply, "cursor", -1, &cur);
		BSON_APPEND_ARRAY_BEGIN(&cur, "firstBatch", &arr);
		bson_append_array_end(&cur, &arr);
		BSON_APPEND_INT64(&cur, "id", 0);
		BSON_APPEND_UTF8(&cur, "ns", c->ns);
		bson_append_document_end(reply, &cur);
		if (!bson_empty(&r.wce))
			BSON_APPEND_DOCUMENT(reply, "writeConcernError", &r.wce);
		st = px_reply(c, reply);
	}
	bson_destroy(&r.extra);
	bson_destroy(&r.wce);
out:
	free(psrc);
	free(ptgt);
	if (src)
		route_coll_unref(src);
	route_coll_unref(tgt);
	return st;
}
