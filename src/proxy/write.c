/* Proxy writes (issue #6): insert batches split by chunk, update/delete statements (one
 * chunk when the shard key pins it, otherwise two phases per chunk: collect owned _ids,
 * then write them), findAndModify, and the write results folded back to the client's
 * indexes. Retryable writes forward lsid/txnNumber/stmtIds (txn.h). */
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

/* ---------- write results ---------- */

typedef struct wresult {
	int64_t n, n_modified;
	bson_t errors;   /* array being collected unsorted: {index, code, errmsg, ...} */
	size_t nerr;
	bson_t upserted; /* {index, _id} */
	size_t nups;
	uv_mutex_t mu;
	bool stop;       /* ordered batch stopped */
	int64_t first_err_index;
	size_t n_net;        /* statements failed by a network error (outcome unknown or not) */
	size_t n_unexecuted; /* ... of which the shard certainly did not execute */
	char net_msg[512];   /* the first network error */
} wresult;

static void wresult_init(wresult *w)
{
	memset(w, 0, sizeof *w);
	bson_init(&w->errors);
	bson_init(&w->upserted);
	uv_mutex_init(&w->mu);
	w->first_err_index = INT64_MAX;
}

static void wresult_destroy(wresult *w)
{
	bson_destroy(&w->errors);
	bson_destroy(&w->upserted);
	uv_mutex_destroy(&w->mu);
}

/* Add a write error at the client's index idx: from a shard's entry (copied except index)
 * or from code/msg; label: with errorLabels ["RetryableWriteError"] (it certainly did not
 * execute). */
static void wresult_error_ex(wresult *w, int64_t idx, const bson_iter_t *entry, int code,
			     const char *msg, bool label)
{
	bson_t e;
	char k[24];

	uv_mutex_lock(&w->mu);
	snprintf(k, sizeof k, "%zu", w->nerr++);
	bson_append_document_begin(&w->errors, k, -1, &e);
	BSON_APPEND_INT64(&e, "index", idx);
	if (entry) {
		bson_iter_t it;
		bson_iter_recurse(entry, &it);
		while (bson_iter_next(&it))
			if (strcmp(bson_iter_key(&it), "index") != 0)
				bson_append_iter(&e, bson_iter_key(&it), -1, &it);
	} else {
		BSON_APPEND_INT32(&e, "code", code);
		BSON_APPEND_UTF8(&e, "codeName", wire_code_name(code));
		BSON_APPEND_UTF8(&e, "errmsg", msg);
	}
	if (label) {
		bson_t labels;
		bson_append_array_begin(&e, "errorLabels", -1, &labels);
		BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
		bson_append_array_end(&e, &labels);
	}
	bson_append_document_end(&w->errors, &e);
	if (idx < w->first_err_index)
		w->first_err_index = idx;
	uv_mutex_unlock(&w->mu);
}

static void wresult_error(wresult *w, int64_t idx, const bson_iter_t *entry, int code,
			  const char *msg)
{
	wresult_error_ex(w, idx, entry, code, msg, false);
}

/* A statement that failed on shard write reply (class cls): a shard's error, or a network
 * error counted for answer_write and labelled when the shard certainly did not run it. */
static void wresult_error_from(wresult *w, int64_t idx, const bson_t *reply, int cls,
			       const char *neterr);

static void wresult_upserted(wresult *w, int64_t idx, const bson_iter_t *id)
{
	bson_t e;
	char k[24];

	uv_mutex_lock(&w->mu);
	snprintf(k, sizeof k, "%zu", w->nups++);
	bson_append_document_begin(&w->upserted, k, -1, &e);
	BSON_APPEND_INT64(&e, "index", idx);
	bson_append_iter(&e, "_id", -1, id);
	bson_append_document_end(&w->upserted, &e);
	uv_mutex_unlock(&w->mu);
}

/* Documents kept as (data, len) rather than bson_t: a bson_t view points at itself and
 * must never be moved (qsort, realloc). */
typedef struct idxdoc {
	int64_t idx;
	const uint8_t *data;
	uint32_t len;
} idxdoc;

static int idx_cmp(const void *a, const void *b)
{
	const idxdoc *x = a, *y = b;

	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Append an array `name` of the documents of src sorted by their index field. */
static void append_sorted(bson_t *out, const char *name, const bson_t *src, size_t n)
{
	idxdoc *v = sdb_calloc(n ? n : 1, sizeof *v);
	bson_iter_t it;
	bson_t arr;
	size_t i = 0;
	char k[24];

	if (bson_iter_init(&it, src))
		while (bson_iter_next(&it) && i < n) {
			uint32_t len;
			const uint8_t *data;
			bson_t view;
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&view, data, len))
				continue;
			v[i].data = data;
			v[i].len = len;
			v[i].idx = px_get_int(&view, "index", 0);
			i++;
		}
	sdb_qsort(v, i, sizeof *v, idx_cmp);
	bson_append_array_begin(out, name, -1, &arr);
	for (size_t j = 0; j < i; j++) {
		bson_t view;
		snprintf(k, sizeof k, "%zu", j);
		if (bson_init_static(&view, v[j].data, v[j].len))
			BSON_APPEND_DOCUMENT(&arr, k, &view);
	}
	bson_append_array_end(out, &arr);
	free(v);
}

static void answer_write(ctx *c, wresult *w, bool is_update)
{
	bson_t *out;

	/* A network error in a retryable write: the whole command may be resent (the shards
	 * answer executed statements from their records), so it is a top-level retryable
	 * error, as a driver expects. Without session fields the same holds when no statement
	 * was executed and every failure certainly did not execute. */
	if (w->n_net > 0 &&
	    (c->txn.on || (w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0))) {
		px_reply_retryable_net_error(c->req,
					  w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0,
					  w->net_msg);
		return;
	}
	out = bson_new();

	/* int32 as mongod and mongos send them: libmongoc reads n/nModified only when they
	 * hold an int32 (an int64 n made update_one report matchedCount 0) */
	BSON_APPEND_INT32(out, "n", (int32_t)(w->n > INT32_MAX ? INT32_MAX : w->n));
	if (is_update) {
		BSON_APPEND_INT32(out, "nModified",
				  (int32_t)(w->n_modified > INT32_MAX ? INT32_MAX : w->n_modified));
		if (w->nups)
			append_sorted(out, "upserted", &w->upserted, w->nups);
	}
	if (w->nerr)
		append_sorted(out, "writeErrors", &w->errors, w->nerr);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	wire_req_reply(c->req, out);
}

/* Fold one shard write reply into w; map[i] is the client index of the i-th statement
 * sent. Returns the number of statements the shard reported as errors. */
static size_t fold_write_reply(wresult *w, const bson_t *reply, const int64_t *map, size_t nmap)
{
	bson_iter_t it, arr;
	size_t nerr = 0;

	uv_mutex_lock(&w->mu);
	w->n += px_get_int(reply, "n", 0);
	w->n_modified += px_get_int(reply, "nModified", 0);
	uv_mutex_unlock(&w->mu);
	if (bson_iter_init_find(&it, reply, "upserted") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t e, id;
			int64_t i = 0;
			if (!bson_iter_recurse(&arr, &e))
				continue;
			if (bson_iter_find(&e, "index"))
				i = bson_iter_as_int64(&e);
			bson_iter_recurse(&arr, &id);
			if (bson_iter_find(&id, "_id") && i >= 0 && (size_t)i < nmap)
				wresult_upserted(w, map[i], &id);
		}
	}
	if (bson_iter_init_find(&it, reply, "writeErrors") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t e;
			int64_t i = 0;
			if (!bson_iter_recurse(&arr, &e))
				continue;
			if (bson_iter_find(&e, "index"))
				i = bson_iter_as_int64(&e);
			if (i < 0 || (size_t)i >= nmap)
				i = 0;
			wresult_error(w, map[i], &arr, 0, NULL);
			nerr++;
		}
	}
	return nerr;
}

static void error_from_reply(const bson_t *reply, int cls, const char *neterr, int *code,
			     char *msg, size_t msglen);

static void wresult_error_from(wresult *w, int64_t idx, const bson_t *reply, int cls,
			       const char *neterr)
{
	int code;
	char msg[512];
	bool unexecuted = cls == SHARDCONN_NET_ERR && shardconn_unexecuted(reply);

	error_from_reply(reply, cls, neterr, &code, msg, sizeof msg);
	if (cls == SHARDCONN_NET_ERR) {
		uv_mutex_lock(&w->mu);
		if (w->n_net++ == 0)
			snprintf(w->net_msg, sizeof w->net_msg, "%s", msg);
		if (unexecuted)
			w->n_unexecuted++;
		uv_mutex_unlock(&w->mu);
	}
	wresult_error_ex(w, idx, NULL, code, msg, unexecuted);
}

static void error_from_reply(const bson_t *reply, int cls, const char *neterr, int *code,
			     char *msg, size_t msglen)
{
	bson_iter_t it;

	if (cls == SHARDCONN_NET_ERR) {
		*code = WIRE_ERR_HOST_UNREACHABLE;
		snprintf(msg, msglen, "%s", neterr);
		return;
	}
	*code = (int)px_get_int(reply, "code", WIRE_ERR_INTERNAL);
	if (bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(msg, msglen, "%s", bson_iter_utf8(&it, NULL));
	else
		snprintf(msg, msglen, "shard error");
}

/* ---------- insert ---------- */

typedef struct ins_doc {
	int64_t idx;      /* client index */
	const uint8_t *data; /* the document, inside the command */
	uint32_t len;
	ssize_t chunk;
} ins_doc;

static void ins_view(const ins_doc *d, bson_t *view)
{
	if (!bson_init_static(view, d->data, d->len))
		bson_init(view);
}

typedef struct ins_group {
	ctx *c;
	route_coll *rc;
	ins_doc **docs;
	size_t n;
	ssize_t chunk;
	bool ordered;
	wresult *w;
	int cls;        /* result class */
	size_t done;    /* docs handled before a stale answer (ordered) */
} ins_group;

static void ins_send(void *arg, size_t gi)
{
	ins_group *g = &((ins_group *)arg)[gi];
	route_chunk *ch = &g->rc->chunks[g->chunk];
	bson_t cmd = BSON_INITIALIZER, arr, reply;
	int64_t *map = sdb_calloc(g->n, sizeof *map);
	char k[24], nerr[256];
	size_t i;

	BSON_APPEND_UTF8(&cmd, "insert", g->c->coll);
	bson_append_array_begin(&cmd, "documents", -1, &arr);
	for (i = 0; i < g->n; i++) {
		bson_t view;
		snprintf(k, sizeof k, "%zu", i);
		ins_view(g->docs[i], &view);
		BSON_APPEND_DOCUMENT(&arr, k, &view);
		map[i] = g->docs[i]->idx;
	}
	bson_append_array_end(&cmd, &arr);
	BSON_APPEND_BOOL(&cmd, "ordered", g->ordered);
	px_append_version(&cmd, ch);
	proxy_txn_append(&g->c->txn, &cmd, map, g->n);
	g->cls = px_run_on(g->c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (g->cls == SHARDCONN_OK) {
		fold_write_reply(g->w, &reply, map, g->n);
	} else if (g->cls != SHARDCONN_STALE) {
		for (i = 0; i < g->n; i++) {
			wresult_error_from(g->w, g->docs[i]->idx, &reply, g->cls, nerr);
			if (g->ordered)
				break;
		}
	}
	free(map);
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* Insert docs (client order) with routing rc; retries StaleConfig parts. */
static void insert_docs(ctx *c, route_coll **rcp, ins_doc **docs, size_t n, bool ordered,
			wresult *w)
{
	size_t i;

	while (n > 0) {
		route_coll *rc = *rcp;
		ins_group *g = sdb_calloc(n, sizeof *g);
		size_t ng = 0, nstale = 0;
		ins_doc **stale = sdb_calloc(n, sizeof *stale);
		char err[256];

		for (i = 0; i < n; i++) {
			bson_t key = BSON_INITIALIZER, view;
			docs[i]->chunk = -1;
			ins_view(docs[i], &view);
			if (route_key_from_doc(rc, &view, &key, err, sizeof err) != 0) {
				bson_destroy(&key);
				wresult_error(w, docs[i]->idx, NULL, WIRE_ERR_BAD_VALUE, err);
				if (ordered)
					break;
				continue;
			}
			docs[i]->chunk = route_find_chunk(rc, &key);
			bson_destroy(&key);
			if (docs[i]->chunk < 0) {
				wresult_error(w, docs[i]->idx, NULL, WIRE_ERR_SHARD_NOT_FOUND,
					      "no chunk of the routing table holds this shard key");
				if (ordered)
					break;
			}
		}
		if (ordered) {
			/* consecutive runs, one at a time, stop at the first error */
			size_t start = 0;
			while (start < n && docs[start]->chunk >= 0) {
				size_t end = start;
				ins_group run;
				size_t before = w->nerr;
				while (end < n && docs[end]->chunk == docs[start]->chunk)
					end++;
				memset(&run, 0, sizeof run);
				run.c = c;
				run.rc = rc;
				run.docs = &docs[start];
				run.n = end - start;
				run.chunk = docs[start]->chunk;
				run.ordered = true;
				run.w = w;
				ins_send(&run, 0);
				if (run.cls == SHARDCONN_STALE) {
					for (i = start; i < n; i++)
						stale[nstale++] = docs[i];
					break;
				}
				if (w->nerr > before)
					break;
				start = end;
			}
		} else {
			/* one group per chunk, sent in parallel */
			for (i = 0; i < n; i++) {
				size_t j;
				if (docs[i]->chunk < 0)
					continue;
				for (j = 0; j < ng; j++)
					if (g[j].chunk == docs[i]->chunk)
						break;
				if (j == ng) {
					g[ng].c = c;
					g[ng].rc = rc;
					g[ng].docs = sdb_calloc(n, sizeof *g[ng].docs);
					g[ng].chunk = docs[i]->chunk;
					g[ng].w = w;
					ng++;
				}
				g[j].docs[g[j].n++] = docs[i];
			}
			shardconn_fanout(c->p->sc, ng, ins_send, g);
			for (i = 0; i < ng; i++) {
				if (g[i].cls == SHARDCONN_STALE)
					for (size_t j = 0; j < g[i].n; j++)
						stale[nstale++] = g[i].docs[j];
				free(g[i].docs);
			}
		}
		free(g);
		if (nstale == 0) {
			free(stale);
			return;
		}
		if (!px_stale_backoff(c)) {
			for (i = 0; i < nstale; i++) {
				wresult_error(w, stale[i]->idx, NULL, WIRE_ERR_STALE_CONFIG,
					      "routing kept changing: StaleConfig retry budget exhausted");
				if (ordered)
					break;
			}
			free(stale);
			return;
		}
		*rcp = px_refresh(c, *rcp);
		memmove(docs, stale, nstale * sizeof *docs);
		n = nstale;
		free(stale);
	}
}

void px_do_insert(ctx *c)
{
	bson_t docs;
	bson_iter_t it;
	route_coll *rc;
	ins_doc *items = NULL, **ptrs = NULL;
	size_t n = 0, cap = 0, i;
	wresult w;
	bool ordered = px_get_bool(c->cmd, "ordered", true);

	rc = px_route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (px_with_primary(c, &primary)) {
			px_forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	if (!px_get_array(c->cmd, "documents", &docs)) {
		route_coll_unref(rc);
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "insert needs a documents array");
		return;
	}
	bson_iter_init(&it, &docs);
	while (bson_iter_next(&it)) {
		uint32_t len;
		const uint8_t *data;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			items = sdb_realloc(items, cap * sizeof *items);
		}
		items[n].idx = (int64_t)n;
		items[n].data = NULL;
		items[n].len = 0;
		if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			items[n].data = data;
			items[n].len = len;
		}
		n++;
	}
	ptrs = sdb_calloc(n ? n : 1, sizeof *ptrs);
	for (i = 0; i < n; i++)
		ptrs[i] = &items[i];
	wresult_init(&w);
	insert_docs(c, &rc, ptrs, n, ordered, &w);
	route_coll_unref(rc);
	answer_write(c, &w, false);
	wresult_destroy(&w);
	free(ptrs);
	free(items);
}

/* ---------- update / delete ---------- */

typedef struct wstmt {
	bool is_update;
	int64_t idx;       /* client index */
	bson_t stmt;       /* view: {q, u, multi, upsert, ...} or {q, limit} */
	bson_t q;
	bool multi;
	bool upsert;
} wstmt;

/* Send one statement (possibly rewritten with q2) to chunk ci. Returns SHARDCONN_*; folds
 * the result into w (with index idx) unless stale. */
static int send_stmt(ctx *c, route_coll *rc, size_t ci, const wstmt *s, const bson_t *q2,
		     bool force_multi, wresult *w)
{
	route_chunk *ch = &rc->chunks[ci];
	bson_t cmd = BSON_INITIALIZER, arr, st, reply;
	bson_iter_t it;
	int64_t map[1] = {s->idx};
	char nerr[256];
	int cls;

	BSON_APPEND_UTF8(&cmd, s->is_update ? "update" : "delete", c->coll);
	bson_append_array_begin(&cmd, s->is_update ? "updates" : "deletes", -1, &arr);
	bson_append_document_begin(&arr, "0", -1, &st);
	bson_iter_init(&it, &s->stmt);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (q2 && strcmp(k, "q") == 0)
			BSON_APPEND_DOCUMENT(&st, "q", q2);
		else if (force_multi && s->is_update && strcmp(k, "multi") == 0)
			continue;
		else if (q2 && strcmp(k, "upsert") == 0)
			continue;
		else
			bson_append_iter(&st, k, -1, &it);
	}
	if (force_multi && s->is_update)
		BSON_APPEND_BOOL(&st, "multi", true);
	bson_append_document_end(&arr, &st);
	bson_append_array_end(&cmd, &arr);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	px_append_version(&cmd, ch);
	if (!s->multi) /* drivers never retry multi statements; they are not recorded */
		proxy_txn_append(&c->txn, &cmd, map, 1);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls == SHARDCONN_OK) {
		fold_write_reply(w, &reply, map, 1);
	} else if (cls != SHARDCONN_STALE) {
		wresult_error_from(w, s->idx, &reply, cls, nerr);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return cls;
}

/* {$and: [q, {_id: {$in: ids}}]} */
static void and_ids(const bson_t *q, const bson_t *ids, bson_t *out)
{
	bson_t and, d, idd;

	bson_init(out);
	bson_append_array_begin(out, "$and", -1, &and);
	BSON_APPEND_DOCUMENT(&and, "0", q);
	bson_append_document_begin(&and, "1", -1, &d);
	bson_append_document_begin(&d, "_id", -1, &idd);
	bson_append_array(&idd, "$in", -1, ids);
	bson_append_document_end(&d, &idd);
	bson_append_document_end(&and, &d);
	bson_append_array_end(out, &and);
}

/* Multi statement over chunk ci: collect owned ids, then write them in batches.
 * Returns SHARDCONN_* (STALE: nothing of this chunk is known to be applied in the failed
 * batch; earlier batches were applied and are not re-sent). */
static int multi_on_chunk(ctx *c, route_coll *rc, size_t ci, const wstmt *s, wresult *w,
			  int64_t limit, bool *touched)
{
	bson_t ids = BSON_INITIALIZER, err_reply = BSON_INITIALIZER;
	size_t n = 0;
	char nerr[256];
	int cls;

	cls = px_collect_owned(c, rc, ci, &s->q, NULL, limit, &ids, NULL, &n, &err_reply, nerr,
			    sizeof nerr);
	if (cls != SHARDCONN_OK) {
		if (cls != SHARDCONN_STALE)
			wresult_error_from(w, s->idx, &err_reply, cls, nerr);
		goto out;
	}
	if (n > 0) {
		/* send in batches of TWO_PHASE_IN_BATCH ids */
		bson_iter_t it;
		size_t done = 0;
		bson_iter_init(&it, &ids);
		while (done < n) {
			bson_t part = BSON_INITIALIZER, q2;
			size_t k = 0;
			char key[24];
			while (k < TWO_PHASE_IN_BATCH && bson_iter_next(&it)) {
				snprintf(key, sizeof key, "%zu", k++);
				bson_append_iter(&part, key, -1, &it);
			}
			done += k;
			and_ids(&s->q, &part, &q2);
			cls = send_stmt(c, rc, ci, s, &q2, s->multi, w);
			bson_destroy(&q2);
			bson_destroy(&part);
			if (k == 0 || cls != SHARDCONN_OK)
				break;
			*touched = true;
		}
	}
out:
	bson_destroy(&ids);
	bson_destroy(&err_reply);
	return cls;
}

static bool stmt_parse(const bson_iter_t *elem, bool is_update, int64_t idx, wstmt *s)
{
	uint32_t len;
	const uint8_t *data;

	memset(s, 0, sizeof *s);
	s->is_update = is_update;
	s->idx = idx;
	if (!BSON_ITER_HOLDS_DOCUMENT(elem))
		return false;
	bson_iter_document(elem, &len, &data);
	if (!bson_init_static(&s->stmt, data, len))
		return false;
	if (!px_get_doc(&s->stmt, "q", &s->q))
		bson_init(&s->q);
	if (is_update) {
		s->multi = px_get_bool(&s->stmt, "multi", false);
		s->upsert = px_get_bool(&s->stmt, "upsert", false);
	} else {
		s->multi = px_get_int(&s->stmt, "limit", 0) == 0;
	}
	return true;
}

/* A retryable single-document write without an exact shard key runs where its collect
 * phase finds a document, which may differ between an attempt and its retry: ask each
 * shard owning a selected chunk whether it already executed this statement (issue #16).
 * 1: executed there, *res = its recorded result (caller destroys); 0: nowhere; -1: a shard
 * did not answer (unknown: the caller fails the statement with a retryable error, after
 * filling err_reply/nerr). */
static int probe_executed(ctx *c, route_coll *rc, const bool *sel, int64_t idx, bson_t *res,
			  bson_t *err_reply, char *nerr, size_t nelen)
{
	char **asked = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *asked);
	size_t nasked = 0, i, k;
	int out = 0;

	for (i = 0; i < rc->nchunks && out == 0; i++) {
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_iter_t it;
		bool dup = false;
		int cls;
		if (!sel[i])
			continue;
		for (k = 0; k < nasked && !dup; k++)
			dup = strcmp(asked[k], rc->chunks[i].shard) == 0;
		if (dup)
			continue;
		asked[nasked++] = rc->chunks[i].shard;
		BSON_APPEND_INT32(&cmd, "stripedbStmtResult", 1);
		BSON_APPEND_DOCUMENT(&cmd, "lsid", &c->txn.lsid);
		BSON_APPEND_INT64(&cmd, "txnNumber", c->txn.txn);
		BSON_APPEND_INT32(&cmd, "stmtId", proxy_txn_stmt_id(&c->txn, idx));
		cls = px_run_on(c, rc->chunks[i].shard, &cmd, NULL, &reply, nerr, nelen);
		bson_destroy(&cmd);
		if (cls != SHARDCONN_OK) {
			bson_copy_to(&reply, err_reply);
			out = -1;
		} else if (px_get_bool(&reply, "executed", false) &&
			   bson_iter_init_find(&it, &reply, "result") &&
			   BSON_ITER_HOLDS_DOCUMENT(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t view;
			bson_iter_document(&it, &len, &data);
			if (bson_init_static(&view, data, len)) {
				bson_copy_to(&view, res);
				out = 1;
			}
		}
		bson_destroy(&reply);
	}
	free(asked);
	return out;
}

/* Fold a shard's recorded result of one update/delete statement ({n, nModified?,
 * upserted?: _id}, src/shard/retry.c) into w as the statement's outcome. */
static void fold_recorded(wresult *w, const bson_t *res, int64_t idx)
{
	bson_t reply = BSON_INITIALIZER, arr, e;
	bson_iter_t it;
	int64_t map[1] = {idx};
	bool up = bson_iter_init_find(&it, res, "upserted");

	BSON_APPEND_INT64(&reply, "n", px_get_int(res, "n", 0) + (up ? 1 : 0));
	BSON_APPEND_INT64(&reply, "nModified", px_get_int(res, "nModified", 0));
	if (up) {
		bson_append_array_begin(&reply, "upserted", -1, &arr);
		bson_append_document_begin(&arr, "0", -1, &e);
		BSON_APPEND_INT32(&e, "index", 0);
		bson_append_iter(&e, "_id", -1, &it);
		bson_append_document_end(&arr, &e);
		bson_append_array_end(&reply, &arr);
	}
	fold_write_reply(w, &reply, map, 1);
	bson_destroy(&reply);
}

/* One update/delete statement on a sharded collection. Returns false when an ordered
 * batch must stop (the statement failed). */
static bool write_stmt(ctx *c, route_coll **rcp, const wstmt *s, wresult *w)
{
	size_t before = w->nerr;
	char err[512];
	bool *done_ranges = NULL;
	/* pending chunk ranges (min/max copies) still to process for a multi statement */
	bson_t **pmin = NULL, **pmax = NULL;
	size_t npend = 0, cap = 0, i;
	bool first = true;

	if (px_uses_js(&s->q, 0)) {
		wresult_error(w, s->idx, NULL, WIRE_ERR_BAD_VALUE,
			      "$where and server-side JavaScript are not allowed on stripedb");
		return false;
	}
	if (s->is_update) {
		bson_t u;
		if (px_get_doc(&s->stmt, "u", &u) && route_update_changes_key(*rcp, &u, &s->q, err,
									    sizeof err)) {
			bool no_key = strstr(err, "without specifying") != NULL;
			wresult_error(w, s->idx, NULL,
				      no_key ? ERR_SHARD_KEY_NOT_FOUND : WIRE_ERR_IMMUTABLE_FIELD, err);
			return false;
		}
	}
	for (;;) {
		route_coll *rc = *rcp;
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact, stale = false, touched = false;
		size_t nsel = route_target(rc, &s->q, sel, &exact);

		if (!first) {
			/* restrict to the ranges refused as stale */
			bool *r = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *r);
			bool *acc = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *acc);
			for (i = 0; i < npend; i++) {
				route_target_range(rc, pmin[i], pmax[i], r);
				for (size_t j = 0; j < rc->nchunks; j++)
					acc[j] = acc[j] || r[j];
			}
			nsel = 0;
			for (i = 0; i < rc->nchunks; i++) {
				sel[i] = sel[i] && acc[i];
				nsel += sel[i];
			}
			free(r);
			free(acc);
			for (i = 0; i < npend; i++) {
				bson_destroy(pmin[i]);
				bson_destroy(pmax[i]);
			}
			npend = 0;
		}
		first = false;
		if (nsel < rc->nchunks)
			sdb_counter_inc(c->p->m_targeted);
		else
			sdb_counter_inc(c->p->m_scatter);
		if (exact && nsel == 1) {
			for (i = 0; !sel[i]; i++)
				;
			if (send_stmt(c, rc, i, s, NULL, false, w) == SHARDCONN_STALE)
				stale = true;
		} else if (s->upsert) {
			wresult_error(w, s->idx, NULL, ERR_SHARD_KEY_NOT_FOUND,
				      "Failed to target upsert by query :: could not extract exact "
				      "shard key");
		} else if (nsel == 0) {
			/* nothing can match */
		} else if (s->multi) {
			for (i = 0; i < rc->nchunks && w->nerr == before; i++) {
				if (!sel[i])
					continue;
				if (multi_on_chunk(c, rc, i, s, w, 0, &touched) == SHARDCONN_STALE) {
					if (npend == cap) {
						cap = cap ? cap * 2 : 8;
						pmin = sdb_realloc(pmin, cap * sizeof *pmin);
						pmax = sdb_realloc(pmax, cap * sizeof *pmax);
					}
					pmin[npend] = bson_copy(rc->chunks[i].min);
					pmax[npend] = bson_copy(rc->chunks[i].max);
					npend++;
					stale = true;
				}
			}
		} else {
			/* single document without an exact key: the first owned match */
			int64_t n_before = w->n;
			if (c->txn.on) {
				bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
				char nerr[256];
				int pr = probe_executed(c, rc, sel, s->idx, &res, &er, nerr,
							sizeof nerr);
				if (pr == 1)
					fold_recorded(w, &res, s->idx);
				else if (pr < 0)
					wresult_error_from(w, s->idx, &er,
							   px_get_int(&er, "code", 0) ? SHARDCONN_CMD_ERR
										 : SHARDCONN_NET_ERR,
							   nerr);
				bson_destroy(&res);
				bson_destroy(&er);
				if (pr != 0)
					n_before = -1; /* answered: skip the chunk walk */
			}
			for (i = 0; n_before >= 0 && i < rc->nchunks && w->nerr == before &&
				    w->n == n_before;
			     i++) {
				if (!sel[i])
					continue;
				if (multi_on_chunk(c, rc, i, s, w, 1, &touched) == SHARDCONN_STALE) {
					stale = true;
					break;
				}
			}
		}
		free(sel);
		if (!stale)
			break;
		if (!px_stale_backoff(c)) {
			wresult_error(w, s->idx, NULL, WIRE_ERR_STALE_CONFIG,
				      "routing kept changing: StaleConfig retry budget exhausted");
			break;
		}
		*rcp = px_refresh(c, *rcp);
		if (!s->multi || npend == 0)
			first = true; /* redo the whole statement */
	}
	for (i = 0; i < npend; i++) {
		bson_destroy(pmin[i]);
		bson_destroy(pmax[i]);
	}
	free(pmin);
	free(pmax);
	free(done_ranges);
	return w->nerr == before;
}

void px_do_write(ctx *c, bool is_update)
{
	bson_t stmts;
	bson_iter_t it;
	route_coll *rc;
	wresult w;
	bool ordered = px_get_bool(c->cmd, "ordered", true);
	int64_t idx = 0;

	rc = px_route_or_fail(c);
	if (rc == NULL)
		return;
	if (!px_get_array(c->cmd, is_update ? "updates" : "deletes", &stmts)) {
		route_coll_unref(rc);
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "%s needs a %s array",
			       is_update ? "update" : "delete", is_update ? "updates" : "deletes");
		return;
	}
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (px_uses_js(&stmts, 0)) {
			wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
				       "$where and server-side JavaScript are not allowed on stripedb");
			return;
		}
		if (px_with_primary(c, &primary)) {
			px_forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	wresult_init(&w);
	bson_iter_init(&it, &stmts);
	while (bson_iter_next(&it)) {
		wstmt s;
		bool ok;
		if (!stmt_parse(&it, is_update, idx, &s)) {
			wresult_error(&w, idx, NULL, WIRE_ERR_BAD_VALUE, "statement is not a document");
			ok = false;
		} else {
			ok = write_stmt(c, &rc, &s, &w);
		}
		idx++;
		if (!ok && ordered)
			break;
	}
	route_coll_unref(rc);
	answer_write(c, &w, is_update);
	wresult_destroy(&w);
}

/* ---------- findAndModify ---------- */

void px_do_find_and_modify(ctx *c)
{
	bson_t query, sort, update;
	bool has_q = px_get_doc(c->cmd, "query", &query);
	bool has_sort = px_get_doc(c->cmd, "sort", &sort);
	bool upsert = px_get_bool(c->cmd, "upsert", false);
	route_coll *rc;
	merge_sort *ms = NULL;
	char err[512];
	int attempt;
	const int64_t fam_stmt = 0; /* findAndModify is statement 0 (stmtId as given) */
	bool probed = false;

	if (!has_q)
		bson_init(&query);
	if (px_uses_js(&query, 0)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	rc = px_route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (px_with_primary(c, &primary)) {
			px_forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	if (px_get_doc(c->cmd, "update", &update) &&
	    route_update_changes_key(rc, &update, &query, err, sizeof err)) {
		route_coll_unref(rc);
		wire_req_error(c->req,
			       strstr(err, "without specifying") ? ERR_SHARD_KEY_NOT_FOUND
								  : WIRE_ERR_IMMUTABLE_FIELD,
			       "%s", err);
		return;
	}
	merge_sort_parse(has_sort ? &sort : NULL, &ms, NULL, err, sizeof err);
	for (attempt = 0;; attempt++) {
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact;
		size_t nsel = route_target(rc, &query, sel, &exact), i, best_chunk = 0;
		bson_t reply, fwd = BSON_INITIALIZER, best = BSON_INITIALIZER;
		bool have_best = false, stale = false;
		char nerr[256];
		int cls;

		if (exact && nsel == 1) {
			for (i = 0; !sel[i]; i++)
				;
			px_copy_cmd(c->cmd, &fwd, NULL);
			px_append_version(&fwd, &rc->chunks[i]);
			proxy_txn_append(&c->txn, &fwd, &fam_stmt, 1);
			cls = px_run_on(c, rc->chunks[i].shard, &fwd, NULL, &reply, nerr, sizeof nerr);
			free(sel);
			bson_destroy(&fwd);
			bson_destroy(&best);
			if (cls == SHARDCONN_STALE && px_stale_backoff(c)) {
				bson_destroy(&reply);
				rc = px_refresh(c, rc);
				continue;
			}
			if (cls == SHARDCONN_NET_ERR && c->txn.on)
				px_reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
			else if (cls == SHARDCONN_NET_ERR)
				px_reply_shard_error(c->req, cls, &reply, nerr);
			else
				px_reply_copy(c->req, &reply);
			bson_destroy(&reply);
			break;
		}
		if (upsert) {
			free(sel);
			bson_destroy(&fwd);
			bson_destroy(&best);
			wire_req_error(c->req, ERR_SHARD_KEY_NOT_FOUND,
				       "Query for sharded findAndModify with upsert: true must contain "
				       "the shard key");
			break;
		}
		if (c->txn.on && !probed) {
			/* a retry of a findAndModify that ran on some shard: its recorded reply */
			bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
			int pr = probe_executed(c, rc, sel, fam_stmt, &res, &er, nerr, sizeof nerr);
			probed = true;
			if (pr != 0) {
				free(sel);
				bson_destroy(&fwd);
				bson_destroy(&best);
				if (pr == 1) {
					bson_t *out = bson_new();
					bson_copy_to_excluding_noinit(&res, out, "ok", NULL);
					BSON_APPEND_DOUBLE(out, "ok", 1.0);
					wire_req_reply(c->req, out);
				} else if (px_get_int(&er, "code", 0)) {
					px_reply_shard_error(c->req, SHARDCONN_CMD_ERR, &er, nerr);
				} else {
					px_reply_retryable_net_error(c->req, shardconn_unexecuted(&er), nerr);
				}
				bson_destroy(&res);
				bson_destroy(&er);
				break;
			}
			bson_destroy(&res);
			bson_destroy(&er);
		}
		/* find the first owned candidate across chunks */
		for (i = 0; i < rc->nchunks && !stale; i++) {
			bson_t docs = BSON_INITIALIZER, er = BSON_INITIALIZER;
			size_t n = 0;
			bson_iter_t it;
			if (!sel[i])
				continue;
			cls = px_collect_owned(c, rc, i, &query, has_sort ? &sort : NULL, 1, NULL, &docs,
					    &n, &er, nerr, sizeof nerr);
			if (cls == SHARDCONN_STALE) {
				stale = true;
			} else if (cls != SHARDCONN_OK) {
				px_reply_shard_error(c->req, cls, &er, nerr);
				bson_destroy(&docs);
				bson_destroy(&er);
				free(sel);
				bson_destroy(&fwd);
				bson_destroy(&best);
				goto out;
			} else if (n > 0 && bson_iter_init(&it, &docs) && bson_iter_next(&it)) {
				uint32_t len;
				const uint8_t *data;
				bson_t d;
				bson_iter_document(&it, &len, &data);
				bson_init_static(&d, data, len);
				if (!have_best || merge_sort_cmp(ms, &d, &best) < 0) {
					bson_destroy(&best);
					bson_copy_to(&d, &best);
					best_chunk = i;
					have_best = true;
				}
			}
			bson_destroy(&docs);
			bson_destroy(&er);
		}
		free(sel);
		sel = NULL;
		if (stale) {
			bson_destroy(&fwd);
			bson_destroy(&best);
			if (!px_stale_backoff(c)) {
				wire_req_error(c->req, WIRE_ERR_STALE_CONFIG,
					       "routing kept changing: StaleConfig retry budget exhausted");
				break;
			}
			rc = px_refresh(c, rc);
			continue;
		}
		if (!have_best) {
			bson_t *out = bson_new(), leo;
			bson_destroy(&fwd);
			bson_destroy(&best);
			bson_append_document_begin(out, "lastErrorObject", -1, &leo);
			BSON_APPEND_INT32(&leo, "n", 0);
			if (!px_get_bool(c->cmd, "remove", false))
				BSON_APPEND_BOOL(&leo, "updatedExisting", false);
			bson_append_document_end(out, &leo);
			BSON_APPEND_NULL(out, "value");
			BSON_APPEND_DOUBLE(out, "ok", 1.0);
			wire_req_reply(c->req, out);
			break;
		}
		{
			bson_iter_t it, idit;
			bson_t q2, and, idq;
			bson_init(&q2);
			bson_append_array_begin(&q2, "$and", -1, &and);
			BSON_APPEND_DOCUMENT(&and, "0", &query);
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
			px_append_version(&fwd, &rc->chunks[best_chunk]);
			proxy_txn_append(&c->txn, &fwd, &fam_stmt, 1);
			bson_destroy(&q2);
		}
		cls = px_run_on(c, rc->chunks[best_chunk].shard, &fwd, NULL, &reply, nerr, sizeof nerr);
		bson_destroy(&fwd);
		bson_destroy(&best);
		if (cls == SHARDCONN_STALE && px_stale_backoff(c)) {
			bson_destroy(&reply);
			rc = px_refresh(c, rc);
			continue;
		}
		if (cls == SHARDCONN_OK && attempt < 3) {
			bson_iter_t v;
			if (bson_iter_init_find(&v, &reply, "value") && BSON_ITER_HOLDS_NULL(&v)) {
				/* the candidate changed under us: look again */
				bson_destroy(&reply);
				continue;
			}
		}
		if (cls == SHARDCONN_NET_ERR && c->txn.on)
			px_reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
		else if (cls == SHARDCONN_NET_ERR)
			px_reply_shard_error(c->req, cls, &reply, nerr);
		else
			px_reply_copy(c->req, &reply);
		bson_destroy(&reply);
		break;
	}
out:
	merge_sort_free(ms);
	route_coll_unref(rc);
}

