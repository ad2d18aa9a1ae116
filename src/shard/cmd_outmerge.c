/* $out and $merge on a shard (issue #20; MongoDB 6.0's DocumentSourceOut and
 * DocumentSourceMerge with merge_processor.cpp's strategies). The pipeline before the
 * writing stage runs as any aggregate (materialised in one read transaction); its output
 * is then written through the shard's ordinary replicated write path: each write is a
 * command (create, createIndexes, insert, update, renameCollection, drop) submitted to
 * the replica set as a detached request (shard_repl_submit, as the TTL monitor does), so
 * it is one Raft entry applied by every member, in the oplog, captured by CDC and
 * majority-durable before the next one is sent. The worker waits for each reply.
 *
 * $out: a temporary collection `tmp.agg_out.<uuid hex>` in the target's database gets the
 * target's secondary indexes, then the documents, then renameCollection with dropTarget
 * moves it over the target in one step (storage/catalog.c: one transaction); on an error
 * the temporary collection is dropped. $merge: batches of update statements (replace:
 * a replacement; merge: $set; keepExisting: $setOnInsert; a pipeline: the pipeline with
 * c = {new, let variables}, upsertSupplied for insert), upsert when whenNotMatched is
 * insert; whenNotMatched fail checks every statement matched (13113); whenMatched fail
 * inserts (11000 on a match through the unique index on `on`). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/aggwrite.h"
#include "common/alloc.h"
#include "common/log.h"
#include "shard/cmd_read_int.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "storage/pipeline.h"
#include "storage/store.h"

/* One batch: the proxy's bounds too (common/aggwrite.h) */
#define OM_BATCH_DOCS SDB_AGGW_BATCH_DOCS
#define OM_BATCH_BYTES SDB_AGGW_BATCH_BYTES

typedef struct om_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} om_wait;

static void om_done(void *arg, wire_req *req)
{
	om_wait *w = arg;
	(void)req;
	pthread_mutex_lock(&w->mu);
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* The temporary collections of the $out stages running on this process ("db\0coll"
 * names; shard_aggw_drop_temps leaves them alone). */
#define OM_LIVE_MAX 256
static pthread_mutex_t om_live_mu = PTHREAD_MUTEX_INITIALIZER;
static char om_live[OM_LIVE_MAX][320];

static void om_live_set(const char *tmp, bool on)
{
	pthread_mutex_lock(&om_live_mu);
	for (size_t i = 0; i < OM_LIVE_MAX; i++) {
		if (on && om_live[i][0] == '\0') {
			snprintf(om_live[i], sizeof om_live[i], "%s", tmp);
			break;
		}
		if (!on && strcmp(om_live[i], tmp) == 0) {
			om_live[i][0] = '\0';
			break;
		}
	}
	pthread_mutex_unlock(&om_live_mu);
}

static bool om_live_has(const char *tmp)
{
	bool found = false;
	pthread_mutex_lock(&om_live_mu);
	for (size_t i = 0; i < OM_LIVE_MAX && !found; i++)
		found = strcmp(om_live[i], tmp) == 0;
	pthread_mutex_unlock(&om_live_mu);
	return found;
}

static void temp_drop_done(void *arg, wire_req *req)
{
	char *ns = arg;
	bson_t *reply = wire_req_detached_take(req);
	bson_iter_t it;
	if (reply && bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		sdb_info("shard: leftover $out temporary collection not dropped",
			 "ns=%s err=\"%s\"", ns, bson_iter_utf8(&it, NULL));
	else
		sdb_info("shard: dropped a leftover $out temporary collection", "ns=%s", ns);
	if (reply)
		bson_destroy(reply);
	wire_req_detached_free(req);
	free(ns);
}

void shard_aggw_drop_temps(shard *sh)
{
	char err[256];
	char **names = NULL;
	size_t n = 0;
	sdb_store_conn *conn = NULL;

	if (!sh->repl || sdb_store_conn_open(sh->store, &conn, err, sizeof err) != 0)
		return;
	if (sdb_store_begin(conn, false, err, sizeof err) != 0) {
		sdb_store_conn_close(conn);
		return;
	}
	if (sdb_store_coll_list(conn, NULL, &names, &n, err, sizeof err) != 0)
		n = 0;
	for (size_t i = 0; i < n; i++) {
		const char *db = names[2 * i], *coll = names[2 * i + 1];
		char key[320];
		if (strncmp(coll, "tmp.agg_out.", 12) != 0)
			continue;
		snprintf(key, sizeof key, "%s.%s", db, coll);
		if (om_live_has(key))
			continue;
		bson_t cmd = BSON_INITIALIZER;
		BSON_APPEND_UTF8(&cmd, "drop", coll);
		wire_req *req = wire_req_detached_new(db, &cmd);
		bson_destroy(&cmd);
		wire_req_detached_on_done(req, temp_drop_done, sdb_strdup(key));
		shard_repl_submit(sh->repl, req);
	}
	sdb_store_names_free(names, n);
	sdb_store_rollback(conn);
	sdb_store_conn_close(conn);
}

/* The outcome of one internal write. */
typedef struct om_res {
	int code;        /* 0 ok, else the command's or its first writeError's code */
	char errmsg[1024];
	bson_t extra;    /* keyPattern/keyValue of a duplicate key error */
	int64_t n;       /* the reply's n */
	bson_t *wce;     /* a writeConcernError (heap copy) or NULL */
} om_res;

static void om_res_init(om_res *r)
{
	memset(r, 0, sizeof *r);
	bson_init(&r->extra);
}

static void om_res_destroy(om_res *r)
{
	bson_destroy(&r->extra);
	if (r->wce)
		bson_destroy(r->wce);
	r->wce = NULL;
}

/* How many internal writes the stage running on this worker thread has submitted
 * (shard_aggw_run resets it): after the first one, a "not primary" answer no longer
 * means that nothing of the stage was applied. */
static _Thread_local unsigned om_submitted;

/* Is code an answer of a member that lost (or never had) the primary role, or is
 * shutting down? NotWritablePrimary 10107, NotPrimaryNoSecondaryOk 13435,
 * NotPrimaryOrSecondary 13436, ShutdownInProgress 91, PrimarySteppedDown 189,
 * InterruptedAtShutdown 11600. */
static bool om_not_primary(int code)
{
	return code == WIRE_ERR_NOT_WRITABLE_PRIMARY || code == WIRE_ERR_NOT_PRIMARY_NO_SECONDARY_OK ||
	       code == 13436 || code == WIRE_ERR_SHUTDOWN_IN_PROGRESS || code == 189 ||
	       code == WIRE_ERR_INTERRUPTED_AT_SHUTDOWN;
}

/* Run cmd on database db through the replicated write path and wait for its reply. The
 * command's writeConcern is the aggregate's (when it has one), bypassDocumentValidation is
 * passed on. Fills r (initialised by the caller). */
static void om_run(shard_ctx *x, const char *db, bson_t *cmd, om_res *r)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, x->cmd, "writeConcern") && BSON_ITER_HOLDS_DOCUMENT(&it))
		bson_append_iter(cmd, "writeConcern", -1, &it);
	wire_req *req = wire_req_detached_new(db, cmd);
	om_wait w = {.done = false};
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	wire_req_detached_on_done(req, om_done, &w);
	bool earlier = om_submitted > 0;
	om_submitted++;
	wire_req_wait_begin(x->req);
	shard_repl_submit(x->sh->repl, req);
	pthread_mutex_lock(&w.mu);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	wire_req_wait_end(x->req);
	pthread_mutex_destroy(&w.mu);
	pthread_cond_destroy(&w.cv);
	bson_t *reply = wire_req_detached_take(req);
	wire_req_detached_free(req);
	if (!reply) {
		r->code = 1;
		snprintf(r->errmsg, sizeof r->errmsg, "internal write got no reply");
		return;
	}
	bson_iter_t f;
	bool ok = bson_iter_init_find(&f, reply, "ok") && bson_iter_as_bool(&f);
	if (!ok) {
		r->code = bson_iter_init_find(&f, reply, "code") ? (int)bson_iter_as_int64(&f) : 1;
		if (bson_iter_init_find(&f, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&f))
			snprintf(r->errmsg, sizeof r->errmsg, "%s", bson_iter_utf8(&f, NULL));
		if (bson_iter_init_find(&f, reply, "primary"))
			bson_append_iter(&r->extra, "primary", -1, &f);
	}
	if (bson_iter_init_find(&f, reply, "n") && BSON_ITER_HOLDS_NUMBER(&f))
		r->n = bson_iter_as_int64(&f);
	bson_iter_t fe;
	if (ok)
		sdb_aggw_first_write_error(reply, &r->code, r->errmsg, sizeof r->errmsg, &r->extra);
	if (bson_iter_init_find(&fe, reply, "writeConcernError") &&
	    BSON_ITER_HOLDS_DOCUMENT(&fe)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&fe, &len, &data);
		r->wce = bson_new_from_data(data, len);
	}
	bson_destroy(reply);
	if (earlier && om_not_primary(r->code)) {
		/* earlier writes of the stage may be committed: the aggregate's outcome is
		 * unknown, never "not executed" (which a router or driver would resend, applying
		 * a $merge twice): InterruptedDueToReplStateChange, without errorLabels */
		char m[sizeof r->errmsg];
		snprintf(m, sizeof m, "%s", r->errmsg);
		snprintf(r->errmsg, sizeof r->errmsg,
			 "the primary changed after part of the output of $out/$merge was written; "
			 "its outcome is unknown :: caused by :: %.800s (code %d)", m, r->code);
		r->code = WIRE_ERR_INTERRUPTED_REPL_CHANGE;
		bson_reinit(&r->extra);
	}
}

/* Answer x with r's error (the extra fields kept). */
static void om_fail(shard_ctx *x, om_res *r)
{
	bson_t *extra = bson_copy(&r->extra);
	wire_req_error_extra(x->req, r->code, extra, "%s", r->errmsg);
}

/* The checks mongod makes before running the pipeline, in a read transaction of x:
 * $out/$merge into a view (166), $merge's unique index for `on` (51183). Replies and
 * returns false when refused. */
bool shard_aggw_check(shard_ctx *x, const sdb_aggw *w)
{
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	if (x->in_txn) {
		shard_fail(x, 263, "%s cannot be used in a transaction",
			   w->kind == SDB_AGGW_OUT ? "$out" : "$merge");
		return false;
	}
	if (!shard_begin(x, false))
		return false;
	bool exists = sdb_store_coll_get(x->conn, w->db, w->coll, &co, NULL, 0) == 0 && co;
	if (exists && bson_iter_init_find(&it, co->options, "viewOn")) {
		shard_fail(x, 166, "Namespace %s.%s is a view, not a collection", w->db, w->coll);
		return false;
	}
	if (w->kind == SDB_AGGW_MERGE && !(w->n_on == 1 && strcmp(w->on[0], "_id") == 0)) {
		bool found = false;
		for (size_t i = 0; exists && i < co->n_indexes && !found; i++)
			found = sdb_aggw_index_supports(w, co->indexes[i].key, co->indexes[i].spec);
		if (!found) {
			shard_fail(x, 51183, "Cannot find index to verify that join fields will be "
				   "unique");
			return false;
		}
	}
	sdb_store_rollback(x->conn);
	return true;
}

static void append_bypass(shard_ctx *x, bson_t *cmd)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, x->cmd, "bypassDocumentValidation"))
		BSON_APPEND_BOOL(cmd, "bypassDocumentValidation", bson_iter_as_bool(&it));
}

/* Append the documents docs[*pos..] to an insert into db.coll, a batch at a time, until
 * all are written or one fails (r->code). */
static void om_insert_all(shard_ctx *x, const char *db, const char *coll, bson_t **docs,
			  size_t n, om_res *r, bson_t **wce)
{
	size_t pos = 0;
	while (pos < n && r->code == 0) {
		bson_t cmd = BSON_INITIALIZER;
		sdb_aggw_insert_batch(&cmd, coll, docs, n, &pos);
		append_bypass(x, &cmd);
		om_res_destroy(r);
		om_res_init(r);
		om_run(x, db, &cmd, r);
		bson_destroy(&cmd);
		if (r->wce) {
			if (*wce)
				bson_destroy(*wce);
			*wce = r->wce;
			r->wce = NULL;
		}
	}
}

static void om_drop(shard_ctx *x, const char *db, const char *coll)
{
	bson_t cmd = BSON_INITIALIZER;
	om_res r;
	om_res_init(&r);
	BSON_APPEND_UTF8(&cmd, "drop", coll);
	om_run(x, db, &cmd, &r);
	bson_destroy(&cmd);
	om_res_destroy(&r);
}

static bool run_out_tmp(shard_ctx *x, const sdb_aggw *w, const char *tmp, bson_t **docs,
			size_t n, bson_t **wce);

/* $out: temp collection with the target's indexes, the documents, rename over target. */
static bool run_out(shard_ctx *x, const sdb_aggw *w, bson_t **docs, size_t n, bson_t **wce)
{
	char tmp[128];
	uint8_t u[16];
	bson_oid_t oid;

	/* a random name: an ObjectId's 12 bytes and 4 of the clock-free counter */
	bson_oid_init(&oid, NULL);
	memcpy(u, oid.bytes, 12);
	memset(u + 12, 0, 4);
	static const char hex[] = "0123456789abcdef";
	char uh[33];
	for (int i = 0; i < 16; i++) {
		uh[2 * i] = hex[u[i] >> 4];
		uh[2 * i + 1] = hex[u[i] & 15];
	}
	uh[32] = '\0';
	snprintf(tmp, sizeof tmp, "tmp.agg_out.%.8s-%.4s-%.4s-%.4s-%.12s", uh, uh + 8, uh + 12,
		 uh + 16, uh + 20);

	char live[320];
	snprintf(live, sizeof live, "%s.%s", w->db, tmp);
	om_live_set(live, true);
	bool ok = run_out_tmp(x, w, tmp, docs, n, wce);
	om_live_set(live, false);
	return ok;
}

/* run_out's work, with the temporary collection tmp registered as in use. */
static bool run_out_tmp(shard_ctx *x, const sdb_aggw *w, const char *tmp, bson_t **docs,
			size_t n, bson_t **wce)
{
	om_res r;
	bson_t specs = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	uint32_t nspecs = 0;
	const sdb_store_coll *co = NULL;

	/* the target's secondary index specs, to build on the temporary collection */
	if (!shard_begin(x, false)) {
		bson_destroy(&specs);
		bson_destroy(&opts);
		return false;
	}
	bool existed = sdb_store_coll_get(x->conn, w->db, w->coll, &co, NULL, 0) == 0 && co;
	if (existed) {
		/* and its create options (mongod's _originalOutOptions without uuid), so the
		 * output keeps them (a validator, a collation ...) */
		bson_iter_t oi;
		bson_iter_init(&oi, co->options);
		while (bson_iter_next(&oi))
			if (strcmp(bson_iter_key(&oi), "uuid") != 0 &&
			    strcmp(bson_iter_key(&oi), "create") != 0)
				bson_append_iter(&opts, NULL, 0, &oi);
		for (size_t i = 0; i < co->n_indexes; i++) {
			bson_t spec = BSON_INITIALIZER;
			bson_iter_t it;
			bson_iter_init(&it, co->indexes[i].spec);
			while (bson_iter_next(&it))
				if (strcmp(bson_iter_key(&it), "ns") != 0 &&
				    strcmp(bson_iter_key(&it), "v") != 0)
					bson_append_iter(&spec, NULL, 0, &it);
			char key[16];
			const char *kp;
			bson_uint32_to_string(nspecs++, &kp, key, sizeof key);
			BSON_APPEND_DOCUMENT(&specs, kp, &spec);
			bson_destroy(&spec);
		}
	}
	sdb_store_rollback(x->conn);

	/* what the rename checks, in its own transaction, has not changed (mongod's
	 * internalRenameIfOptionsAndIndexesMatch): 125 otherwise */
	bson_t expect = BSON_INITIALIZER;
	BSON_APPEND_BOOL(&expect, "exists", existed);
	BSON_APPEND_DOCUMENT(&expect, "options", &opts);
	BSON_APPEND_ARRAY(&expect, "indexes", &specs);

	bson_t cmd = BSON_INITIALIZER;
	om_res_init(&r);
	BSON_APPEND_UTF8(&cmd, "create", tmp);
	bson_concat(&cmd, &opts);
	bson_destroy(&opts);
	om_run(x, w->db, &cmd, &r);
	bson_destroy(&cmd);
	if (r.code == 0 && nspecs > 0) {
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "createIndexes", tmp);
		BSON_APPEND_ARRAY(&cmd, "indexes", &specs);
		/* a copy of the target's existing specs: not refused for the options a
		 * client may no longer ask for (src/shard/cmd_admin.c refuse_index_options) */
		BSON_APPEND_BOOL(&cmd, "$stripedbIndexCopy", true);
		om_res_destroy(&r);
		om_res_init(&r);
		om_run(x, w->db, &cmd, &r);
		bson_destroy(&cmd);
		if (r.code != 0) {
			char m[sizeof r.errmsg];
			snprintf(m, sizeof m, "%s", r.errmsg);
			snprintf(r.errmsg, sizeof r.errmsg, "Copying indexes for $out failed :: "
				 "caused by :: %.900s", m);
		}
	}
	bson_destroy(&specs);
	bool created = r.code == 0;
	if (r.code == 0)
		om_insert_all(x, w->db, tmp, docs, n, &r, wce);
	if (r.code == 0) {
		char from[512], to[512];
		snprintf(from, sizeof from, "%s.%s", w->db, tmp);
		snprintf(to, sizeof to, "%s.%s", w->db, w->coll);
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "renameCollection", from);
		BSON_APPEND_UTF8(&cmd, "to", to);
		BSON_APPEND_BOOL(&cmd, "dropTarget", true);
		BSON_APPEND_DOCUMENT(&cmd, "$stripedbIfTargetMatches", &expect);
		om_res_destroy(&r);
		om_res_init(&r);
		om_run(x, "admin", &cmd, &r);
		bson_destroy(&cmd);
		if (r.wce) {
			if (*wce)
				bson_destroy(*wce);
			*wce = r.wce;
			r.wce = NULL;
		}
	}
	bson_destroy(&expect);
	if (r.code != 0) {
		if (created)
			om_drop(x, w->db, tmp); /* best effort, as mongod's cleanup */
		om_fail(x, &r);
		om_res_destroy(&r);
		return false;
	}
	om_res_destroy(&r);
	return true;
}

/* $merge, with update statements (or inserts for whenMatched fail). */
static bool run_merge(shard_ctx *x, const sdb_aggw *w, bson_t **docs, size_t n, bson_t **wce)
{
	om_res r;
	om_res_init(&r);

	/* documents without _id get one when `on` includes it (makeBatchObject) */
	bson_t **ready = sdb_calloc(n ? n : 1, sizeof *ready);
	for (size_t i = 0; i < n; i++) {
		bson_t d;
		sdb_aggw_with_id(w, docs[i], &d);
		ready[i] = sdb_doc_copy(&d);
		bson_destroy(&d);
	}
	if (w->when_matched == SDB_WM_FAIL) {
		/* check the `on` values first, as makeBatchObject does for every document */
		for (size_t i = 0; i < n && r.code == 0; i++) {
			bson_t f;
			r.code = sdb_aggw_on_filter(w, ready[i], &f, r.errmsg, sizeof r.errmsg);
			bson_destroy(&f);
		}
		if (r.code == 0)
			om_insert_all(x, w->db, w->coll, ready, n, &r, wce);
		goto done;
	}
	size_t pos = 0;
	while (pos < n && r.code == 0) {
		bson_t cmd = BSON_INITIALIZER, arr;
		BSON_APPEND_UTF8(&cmd, "update", w->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "updates", &arr);
		size_t bytes = 0, k = 0;
		while (pos < n && k < OM_BATCH_DOCS &&
		       (k == 0 || bytes + 2 * ready[pos]->len < OM_BATCH_BYTES)) {
			const bson_t *d = ready[pos];
			bson_t st;
			char key[16];
			const char *kp;
			bson_uint32_to_string((uint32_t)k++, &kp, key, sizeof key);
			bson_append_document_begin(&arr, kp, -1, &st);
			r.code = sdb_aggw_merge_stmt(w, d, shard_let(x), sdb_pipeline_eval_expr_vars,
						     &st, r.errmsg, sizeof r.errmsg);
			bson_append_document_end(&arr, &st);
			bytes += 2 * d->len;
			pos++;
			if (r.code != 0)
				break;
		}
		bson_append_array_end(&cmd, &arr);
		BSON_APPEND_BOOL(&cmd, "ordered", true);
		append_bypass(x, &cmd);
		if (r.code == 0) {
			om_res_destroy(&r);
			om_res_init(&r);
			om_run(x, w->db, &cmd, &r);
			if (r.wce) {
				if (*wce)
					bson_destroy(*wce);
				*wce = r.wce;
				r.wce = NULL;
			}
			if (r.code == 0 && w->when_not_matched == SDB_WNM_FAIL && r.n != (int64_t)k) {
				r.code = 13113; /* MergeStageNoMatchingDocument */
				snprintf(r.errmsg, sizeof r.errmsg,
					 "$merge could not find a matching document in the target "
					 "collection for at least one document in the source "
					 "collection");
			}
		}
		bson_destroy(&cmd);
	}
done:
	util_docs_free(ready, n);
	if (r.code != 0) {
		om_fail(x, &r);
		om_res_destroy(&r);
		return false;
	}
	om_res_destroy(&r);
	return true;
}

bool shard_aggw_run(shard_ctx *x, const sdb_aggw *w, bson_t **docs, size_t n, bson_t **wce)
{
	*wce = NULL;
	om_submitted = 0;
	if (w->kind == SDB_AGGW_OUT)
		return run_out(x, w, docs, n, wce);
	return run_merge(x, w, docs, n, wce);
}
