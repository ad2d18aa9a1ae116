/* Proxy writes (issue #6): insert batches split by chunk, update/delete statements (one
 * chunk when the shard key pins it, otherwise two phases per chunk: collect owned _ids,
 * then write them), and the write results folded back to the client's indexes
 * (findAndModify: findandmodify.c). Retryable writes forward lsid/txnNumber/stmtIds (txn.h). */
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
#include "proxy/write_int.h"
#include "storage/collation.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

/* The client command's writeConcern, copied into a shard command built for it (an insert's
 * part for one chunk, one update or delete statement): each shard waits for it as it would
 * for the client's own command, and its writeConcernError reaches the client through
 * fold_write_reply. Without it a sharded write was acknowledged at the shard's default
 * (majority) whatever the client asked, w: 3 or a wtimeout included. */
static void append_client_wc(const ctx *c, bson_t *cmd)
{
	bson_t wc;
	bson_iter_t it;
	if (px_get_doc(c->cmd, "writeConcern", &wc))
		BSON_APPEND_DOCUMENT(cmd, "writeConcern", &wc);
	/* and the client's bypassDocumentValidation: the shards enforce validators (issue #20,
	 * src/shard/validation.h) */
	if (bson_iter_init_find(&it, c->cmd, "bypassDocumentValidation"))
		BSON_APPEND_BOOL(cmd, "bypassDocumentValidation", bson_iter_as_bool(&it));
}

bool px_holder_collated(const bson_t *holder)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, holder, "collation") && !sdb_collation_is_simple_spec(&it);
}

/* write_int.h. The shard checks the new document against the key paths: shard/cmd_write.c
 * shard_key_kept (66 ImmutableField when a value changes). */
void px_append_key_check(const route_coll *rc, const bson_t *holder, const char *field,
			 bson_t *cmd)
{
	bson_iter_t it;
	bson_t arr;
	char k[16];
	if (rc == NULL || rc->nkeys == 0)
		return;
	if (!(bson_iter_init_find(&it, holder, field) && BSON_ITER_HOLDS_ARRAY(&it)) &&
	    !px_holder_collated(holder))
		return;
	BSON_APPEND_ARRAY_BEGIN(cmd, "$stripedbShardKey", &arr);
	for (size_t i = 0, n = 0; i < rc->nkeys; i++) {
		if (strcmp(rc->keys[i], "_id") == 0)
			continue;
		snprintf(k, sizeof k, "%zu", n++);
		BSON_APPEND_UTF8(&arr, k, rc->keys[i]);
	}
	bson_append_array_end(cmd, &arr);
}

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
	bson_t wce;          /* the first shard command's writeConcernError (empty: none) */
	size_t nwce;         /* shard commands that answered a writeConcernError */
	char wce_msgs[1024]; /* their errmsgs, "; "-joined (truncated) */
} wresult;

static void wresult_init(wresult *w)
{
	memset(w, 0, sizeof *w);
	bson_init(&w->errors);
	bson_init(&w->upserted);
	bson_init(&w->wce);
	uv_mutex_init(&w->mu);
	w->first_err_index = INT64_MAX;
}

static void wresult_destroy(wresult *w)
{
	bson_destroy(&w->errors);
	bson_destroy(&w->upserted);
	bson_destroy(&w->wce);
	uv_mutex_destroy(&w->mu);
}

/* Open entry number (*n)++ of array arr as e, {index: idx, ...}; the caller appends the rest
 * and ends it with bson_append_document_end(arr, e). Under w->mu. */
static void wresult_entry_begin(bson_t *arr, size_t *n, int64_t idx, bson_t *e)
{
	char k[24];

	snprintf(k, sizeof k, "%zu", (*n)++);
	bson_append_document_begin(arr, k, -1, e);
	BSON_APPEND_INT64(e, "index", idx);
}

/* Add a write error at the client's index idx: from a shard's entry (copied except index)
 * or from code/msg; label: with errorLabels ["RetryableWriteError"] (it certainly did not
 * execute). */
static void wresult_error_ex(wresult *w, int64_t idx, const bson_iter_t *entry, int code,
			     const char *msg, bool label)
{
	bson_t e;

	uv_mutex_lock(&w->mu);
	wresult_entry_begin(&w->errors, &w->nerr, idx, &e);
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

	uv_mutex_lock(&w->mu);
	wresult_entry_begin(&w->upserted, &w->nups, idx, &e);
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

/* mongod's budget for the errmsgs of one write reply (MongoDB manual, bulk write batches:
 * past 1 MB of error messages "MongoDB truncates all remaining error messages to the empty
 * string"), so that 100,000 failed statements answer under maxBsonObjectSize. The shards
 * truncate their own replies the same way (src/shard/cmd_write.c). */
#define WRITE_ERRMSG_BUDGET (1024 * 1024)

/* Copy write error e into arr under key k; *errmsg_bytes counts the errmsg bytes appended
 * so far: past WRITE_ERRMSG_BUDGET the errmsg is "". */
static void append_write_error(bson_t *arr, const char *k, const bson_t *e, size_t *errmsg_bytes)
{
	bson_iter_t it;
	bson_t d;

	if (*errmsg_bytes < WRITE_ERRMSG_BUDGET) {
		if (bson_iter_init_find(&it, e, "errmsg") && BSON_ITER_HOLDS_UTF8(&it)) {
			uint32_t len;
			bson_iter_utf8(&it, &len);
			*errmsg_bytes += len;
		}
		BSON_APPEND_DOCUMENT(arr, k, e);
		return;
	}
	bson_append_document_begin(arr, k, -1, &d);
	if (bson_iter_init(&it, e))
		while (bson_iter_next(&it)) {
			if (strcmp(bson_iter_key(&it), "errmsg") == 0)
				BSON_APPEND_UTF8(&d, "errmsg", "");
			else
				bson_append_iter(&d, bson_iter_key(&it), -1, &it);
		}
	bson_append_document_end(arr, &d);
}

/* Append an array `name` of the documents of src sorted by their index field; errors:
 * the documents are write errors, whose errmsgs are truncated past WRITE_ERRMSG_BUDGET. */
static void append_sorted(bson_t *out, const char *name, const bson_t *src, size_t n,
			  bool errors)
{
	size_t errmsg_bytes = 0;
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
		if (!bson_init_static(&view, v[j].data, v[j].len))
			continue;
		if (errors)
			append_write_error(&arr, k, &view, &errmsg_bytes);
		else
			BSON_APPEND_DOCUMENT(&arr, k, &view);
	}
	bson_append_array_end(out, &arr);
	free(v);
}

/* The client's writeConcernError, as mongos builds it (BatchWriteOp::buildClientResponse):
 * one shard's error as that shard sent it; errors from several shard commands become one
 * WriteConcernFailed (64) naming them all. A write concern the shards could not satisfy is
 * never dropped from the answer: the documents were written, but not as durably as asked. */
static void append_write_concern_error(bson_t *out, const wresult *w)
{
	bson_t wce;
	if (w->nwce == 0)
		return;
	if (w->nwce == 1) {
		BSON_APPEND_DOCUMENT(out, "writeConcernError", &w->wce);
		return;
	}
	char msg[1200];
	snprintf(msg, sizeof msg, "multiple errors reported (%zu shard commands): %s", w->nwce,
		 w->wce_msgs);
	BSON_APPEND_DOCUMENT_BEGIN(out, "writeConcernError", &wce);
	BSON_APPEND_INT32(&wce, "code", WIRE_ERR_WRITE_CONCERN_FAILED);
	BSON_APPEND_UTF8(&wce, "codeName", wire_code_name(WIRE_ERR_WRITE_CONCERN_FAILED));
	BSON_APPEND_UTF8(&wce, "errmsg", msg);
	bson_append_document_end(out, &wce);
}

static int answer_write(ctx *c, wresult *w, bool is_update)
{
	bson_t *out;

	/* A network error in a retryable write: the whole command may be resent (the shards
	 * answer executed statements from their records), so it is a top-level retryable
	 * error, as a driver expects. Without session fields the same holds when no statement
	 * was executed and every failure certainly did not execute. */
	if (w->n_net > 0 &&
	    (c->txn.on || (w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0))) {
		return px_reply_retryable_net_error(
						    c, w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0, w->net_msg);
	}
	out = bson_new();

	/* int32 as mongod and mongos send them: libmongoc reads n/nModified only when they
	 * hold an int32 (an int64 n made update_one report matchedCount 0) */
	BSON_APPEND_INT32(out, "n", (int32_t)(w->n > INT32_MAX ? INT32_MAX : w->n));
	if (is_update) {
		BSON_APPEND_INT32(out, "nModified",
				  (int32_t)(w->n_modified > INT32_MAX ? INT32_MAX : w->n_modified));
		if (w->nups)
			append_sorted(out, "upserted", &w->upserted, w->nups, false);
	}
	if (w->nerr)
		append_sorted(out, "writeErrors", &w->errors, w->nerr, true);
	append_write_concern_error(out, w);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	return px_reply(c, out);
}

/* Fold one shard write reply into w; map[i] is the client index of the i-th statement
 * sent. Returns the number of statements the shard reported as errors. */
static size_t fold_write_reply(wresult *w, const bson_t *reply, const int64_t *map, size_t nmap)
{
	bson_iter_t it, arr;
	size_t nerr = 0;

	bson_t wce;
	uv_mutex_lock(&w->mu);
	w->n += px_get_int(reply, "n", 0);
	w->n_modified += px_get_int(reply, "nModified", 0);
	if (px_get_doc(reply, "writeConcernError", &wce)) {
		bson_iter_t mi;
		const char *m = "";
		size_t l = strlen(w->wce_msgs);
		if (w->nwce++ == 0)
			bson_concat(&w->wce, &wce);
		if (bson_iter_init_find(&mi, &wce, "errmsg") && BSON_ITER_HOLDS_UTF8(&mi))
			m = bson_iter_utf8(&mi, NULL);
		if (l + 8 < sizeof w->wce_msgs)
			snprintf(w->wce_msgs + l, sizeof w->wce_msgs - l, "%s%.200s", l ? "; " : "", m);
	}
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
	size_t done;    /* docs handled before a StaleConfig answer (not sent again) */
} ins_group;

/* The documents of one insert command sent to a shard: at most maxWriteBatchSize of them
 * and at most this many bytes of documents, so that the command stays under the shard's
 * maxBsonObjectSize (16 MiB) with room for its other fields (the session fields, the
 * version, the stmtIds array: at most ~14 bytes a document). A client's batch may be up to
 * maxMessageSizeBytes (48 MB) in a document sequence: it is sent in several commands. */
#define INS_SUB_BYTES (WIRE_MAX_BSON_SIZE - 2 * 1024 * 1024)

/* Send group gi (documents of one chunk) to its shard, in as many insert commands as the
 * limits above need, one after the other. Ordered: stops at the first command with an
 * error. A StaleConfig answer stops the group: g->done says how many of its documents were
 * handled before it (those are not sent again; the rest are the retry's). */
static void ins_send(void *arg, size_t gi)
{
	ins_group *g = &((ins_group *)arg)[gi];
	route_chunk *ch = &g->rc->chunks[g->chunk];
	int64_t *map = sdb_calloc(g->n ? g->n : 1, sizeof *map);
	char k[24], nerr[256];
	size_t i, start = 0;

	g->done = 0;
	g->cls = SHARDCONN_OK;
	while (start < g->n) {
		bson_t cmd = BSON_INITIALIZER, arr, reply;
		/* (unordered groups run in parallel and share w: its count is read only when
		 * ordered, where one group runs at a time) */
		size_t end = start, bytes = 0, nerr_before = g->ordered ? g->w->nerr : 0;

		while (end < g->n && end - start < WIRE_MAX_WRITE_BATCH &&
		       (end == start || bytes + g->docs[end]->len + 16 <= INS_SUB_BYTES)) {
			bytes += g->docs[end]->len + 16;
			end++;
		}
		BSON_APPEND_UTF8(&cmd, "insert", g->c->coll);
		bson_append_array_begin(&cmd, "documents", -1, &arr);
		for (i = start; i < end; i++) {
			bson_t view;
			snprintf(k, sizeof k, "%zu", i - start);
			ins_view(g->docs[i], &view);
			BSON_APPEND_DOCUMENT(&arr, k, &view);
			map[i - start] = g->docs[i]->idx;
		}
		bson_append_array_end(&cmd, &arr);
		BSON_APPEND_BOOL(&cmd, "ordered", g->ordered);
		append_client_wc(g->c, &cmd);
		px_append_version(&cmd, ch);
		proxy_txn_append(&g->c->txn, &cmd, map, end - start);
		g->cls = px_run_on(g->c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
		if (g->cls == SHARDCONN_OK) {
			fold_write_reply(g->w, &reply, map, end - start);
		} else if (g->cls != SHARDCONN_STALE) {
			for (i = start; i < end; i++) {
				wresult_error_from(g->w, g->docs[i]->idx, &reply, g->cls, nerr);
				if (g->ordered)
					break;
			}
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		if (g->cls == SHARDCONN_STALE)
			break;
		start = end;
		g->done = start;
		/* ordered: stop at the first error (a network error included); unordered: go
		 * on with the next command as a shard goes on with the next document */
		if (g->ordered && (g->cls != SHARDCONN_OK || g->w->nerr > nerr_before))
			break;
	}
	free(map);
}

/* insert_docs' operation: the documents still to insert (client order). */
typedef struct ins_op {
	ins_doc **docs;
	size_t n;
	bool ordered;
	wresult *w;
} ins_op;

/* One attempt: route each document, send per chunk (ordered: consecutive runs, stopping at
 * the first error; unordered: one group per chunk in parallel); the documents a shard
 * refused with StaleConfig stay in o for the next attempt. */
static int ins_execute(px_retry *r, void *arg)
{
	ins_op *o = arg;
	ctx *c = r->c;
	route_coll *rc = r->rc;
	ins_doc **docs = o->docs;
	size_t n = o->n, i;
	bool ordered = o->ordered;
	wresult *w = o->w;
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
				for (i = start + run.done; i < n; i++)
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
		px_fanout(c, ng, ins_send, g);
		for (i = 0; i < ng; i++) {
			if (g[i].cls == SHARDCONN_STALE)
				for (size_t j = g[i].done; j < g[i].n; j++)
					stale[nstale++] = g[i].docs[j];
			free(g[i].docs);
		}
	}
	free(g);
	/* the refused documents are the next attempt's */
	memmove(docs, stale, nstale * sizeof *docs);
	o->n = nstale;
	free(stale);
	return nstale == 0 ? PX_RETRY_DONE : PX_RETRY_STALE;
}

/* The budget is spent: the refused documents fail with StaleConfig (ordered: the first). */
static void ins_exhausted(px_retry *r, void *arg)
{
	ins_op *o = arg;
	size_t i;

	(void)r;
	for (i = 0; i < o->n; i++) {
		wresult_error(o->w, o->docs[i]->idx, NULL, WIRE_ERR_STALE_CONFIG,
			      "routing kept changing: StaleConfig retry budget exhausted");
		if (o->ordered)
			break;
	}
}

/* Insert docs (client order) with routing *rcp (replaced by a newer one after a refresh);
 * retries the parts refused with StaleConfig (px_retry_run). */
static void insert_docs(ctx *c, route_coll **rcp, ins_doc **docs, size_t n, bool ordered,
			wresult *w)
{
	ins_op o = {docs, n, ordered, w};
	px_retry r;

	if (n == 0)
		return;
	px_retry_init(&r, c, *rcp, ins_execute, ins_exhausted, &o);
	px_retry_run(&r);
	*rcp = r.rc;
	r.rc = NULL; /* the caller's reference */
	px_retry_done(&r);
}

/* An insert into an unsharded collection too large for one shard command (a client's
 * document sequence of up to 48 MB): the documents are sent to the primary shard in
 * consecutive commands of at most INS_SUB_BYTES / maxWriteBatchSize, each with the client
 * command's other fields (writeConcern, bypassDocumentValidation ...) and, for a retryable
 * write, the statements' own stmtIds. Ordered: stops at the first error. */
static void insert_unsharded(ctx *c, const char *shard, ins_doc **docs, size_t n, bool ordered,
			     wresult *w)
{
	static const char *const skip[] = {"documents", "stmtId", "stmtIds", NULL};
	int64_t *map = sdb_calloc(n ? n : 1, sizeof *map);
	size_t start = 0, i;
	char k[24], nerr[256];

	while (start < n) {
		bson_t cmd = BSON_INITIALIZER, arr, reply;
		size_t end = start, bytes = 0, nerr_before = w->nerr;
		int cls;

		while (end < n && end - start < WIRE_MAX_WRITE_BATCH &&
		       (end == start || bytes + docs[end]->len + 16 <= INS_SUB_BYTES)) {
			bytes += docs[end]->len + 16;
			end++;
		}
		px_copy_cmd(c->cmd, &cmd, skip);
		bson_append_array_begin(&cmd, "documents", -1, &arr);
		for (i = start; i < end; i++) {
			bson_t view;
			snprintf(k, sizeof k, "%zu", i - start);
			ins_view(docs[i], &view);
			BSON_APPEND_DOCUMENT(&arr, k, &view);
			map[i - start] = docs[i]->idx;
		}
		bson_append_array_end(&cmd, &arr);
		proxy_txn_append(&c->txn, &cmd, map, end - start);
		cls = px_run_on(c, shard, &cmd, NULL, &reply, nerr, sizeof nerr);
		if (cls == SHARDCONN_OK) {
			fold_write_reply(w, &reply, map, end - start);
		} else {
			for (i = start; i < end; i++) {
				wresult_error_from(w, docs[i]->idx, &reply, cls, nerr);
				if (ordered)
					break;
			}
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		start = end;
		if (ordered && (cls != SHARDCONN_OK || w->nerr > nerr_before))
			break;
	}
	free(map);
}

int px_do_insert(ctx *c)
{
	bson_t docs;
	bson_iter_t it;
	route_coll *rc;
	ins_doc *items = NULL, **ptrs = NULL;
	size_t n = 0, cap = 0, i;
	wresult w;
	bool ordered = px_get_bool(c->cmd, "ordered", true);
	int st;

	if ((st = px_route_or_fail(c, &rc)) != 0)
		return st;
	if (rc->nkeys == 0 && c->cmd->len <= INS_SUB_BYTES) {
		/* an unsharded collection, one command's worth: forwarded as is */
		route_coll_unref(rc);
		return px_forward_primary(c);
	}
	if (!px_get_array(c->cmd, "documents", &docs)) {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE, "insert needs a documents array");
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
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		rc = NULL;
		if ((st = px_with_primary(c, &primary)) != 0)
			goto out;
		insert_unsharded(c, primary, ptrs, n, ordered, &w);
		free(primary);
	} else {
		insert_docs(c, &rc, ptrs, n, ordered, &w);
		route_coll_unref(rc);
	}
	st = answer_write(c, &w, false);
out:
	wresult_destroy(&w);
	free(ptrs);
	free(items);
	return st;
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

/* The command of send_stmt_v into cmd (initialised by the caller). */
static void stmt_cmd(ctx *c, route_coll *rc, size_t ci, const wstmt *s, const bson_t *q2,
		     bool force_multi, bool per_shard, bson_t *cmd)
{
	route_chunk *ch = &rc->chunks[ci];
	bson_t arr, st;
	bson_iter_t it;
	int64_t map[1] = {s->idx};

	BSON_APPEND_UTF8(cmd, s->is_update ? "update" : "delete", c->coll);
	bson_append_array_begin(cmd, s->is_update ? "updates" : "deletes", -1, &arr);
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
	bson_append_array_end(cmd, &arr);
	BSON_APPEND_BOOL(cmd, "ordered", true);
	append_client_wc(c, cmd);
	px_append_let(c, cmd);
	if (s->is_update)
		px_append_key_check(rc, &s->stmt, "u", cmd);
	if (per_shard)
		px_append_shard_version(cmd, rc, ch->shard);
	else
		px_append_version(cmd, ch);
	if (!s->multi) /* drivers never retry multi statements; they are not recorded */
		proxy_txn_append(&c->txn, cmd, map, 1);
}

/* Send one statement (possibly rewritten with q2) to chunk ci, or, per_shard, to the whole
 * shard of chunk ci with its shard version (the shard skips orphans: shardver.c). Returns
 * SHARDCONN_*; folds the result into w (with index idx) unless stale. */
static int send_stmt_v(ctx *c, route_coll *rc, size_t ci, const wstmt *s, const bson_t *q2,
		       bool force_multi, bool per_shard, wresult *w)
{
	route_chunk *ch = &rc->chunks[ci];
	bson_t cmd = BSON_INITIALIZER, reply;
	int64_t map[1] = {s->idx};
	char nerr[256];
	int cls;

	stmt_cmd(c, rc, ci, s, q2, force_multi, per_shard, &cmd);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls == SHARDCONN_OK) {
		fold_write_reply(w, &reply, map, 1);
	} else if (cls != SHARDCONN_STALE) {
		wresult_error_from(w, s->idx, &reply, cls, nerr);
	} else if (per_shard) {
		px_shard_mode_note(rc, ch->shard, &reply);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return cls;
}

static int send_stmt(ctx *c, route_coll *rc, size_t ci, const wstmt *s, const bson_t *q2,
		     bool force_multi, wresult *w)
{
	return send_stmt_v(c, rc, ci, s, q2, force_multi, false, w);
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

	cls = px_collect_owned(c, rc, ci, &s->q, NULL, &s->stmt, limit, &ids, NULL, &n, &err_reply, nerr,
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

/* exec.h. */
bool px_stmt_shard_cmd(ctx *c, route_coll *rc, size_t ci, const bson_iter_t *elem,
		       bool is_update, bson_t *cmd)
{
	wstmt s;

	if (!stmt_parse(elem, is_update, 0, &s))
		return false;
	stmt_cmd(c, rc, ci, &s, NULL, false, false, cmd); /* as stmt_execute's exact send */
	return true;
}

/* exec.h. As px_do_write answers a statement send_stmt_v sent (index 0). */
int px_stmt_answer(ctx *c, bool is_update, const bson_t *reply, int cls, const char *neterr)
{
	wresult w;
	int64_t map[1] = {0};
	int st;

	wresult_init(&w);
	if (cls == SHARDCONN_OK)
		fold_write_reply(&w, reply, map, 1);
	else
		wresult_error_from(&w, 0, reply, cls, neterr);
	st = answer_write(c, &w, is_update);
	wresult_destroy(&w);
	return st;
}

/* write_int.h. Each shard is asked once, however many of its chunks are selected. */
int px_probe_executed(ctx *c, route_coll *rc, const bool *sel, int64_t idx, bson_t *res,
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

/* write_stmt's operation: one statement, and the chunk ranges of a multi statement that
 * shards refused with StaleConfig (retried alone under the new routing). */
typedef struct stmt_op {
	const wstmt *s;
	wresult *w;
	size_t before;         /* w->nerr before the statement */
	bson_t **pmin, **pmax; /* pending ranges (copies), npend of them */
	size_t npend, cap;
	bool first;            /* the whole statement (not only pending ranges) */
} stmt_op;

/* Chunk ci's range (copies) to the ranges retried alone under the next routing. */
static void pend_chunk(stmt_op *o, const route_coll *rc, size_t ci)
{
	if (o->npend == o->cap) {
		o->cap = o->cap ? o->cap * 2 : 8;
		o->pmin = sdb_realloc(o->pmin, o->cap * sizeof *o->pmin);
		o->pmax = sdb_realloc(o->pmax, o->cap * sizeof *o->pmax);
	}
	o->pmin[o->npend] = bson_copy(rc->chunks[ci].min);
	o->pmax[o->npend] = bson_copy(rc->chunks[ci].max);
	o->npend++;
}

/* A shard refused a whole-shard pass as stale (nothing applied there): its targeted chunks'
 * ranges are retried alone. */
static void stale_shard(stmt_op *o, route_coll *rc, const bool *sel, const char *shard)
{
	size_t i;

	for (i = 0; i < rc->nchunks; i++)
		if (sel[i] && strcmp(rc->chunks[i].shard, shard) == 0)
			pend_chunk(o, rc, i);
}

/* One attempt of a statement: straight to one chunk when the key pins it; otherwise the
 * owned matches of each targeted chunk (multi), or the first owned match (single). */
static int stmt_execute(px_retry *r, void *arg)
{
	stmt_op *o = arg;
	ctx *c = r->c;
	route_coll *rc = r->rc;
	const wstmt *s = o->s;
	wresult *w = o->w;
	size_t before = o->before, i, nsel;
	bool exact, stale = false, touched = false, first_attempt = o->first;
	bool *sel = px_target(rc, &s->q, &s->stmt, &nsel, &exact);

	if (!o->first) {
		/* restrict to the ranges refused as stale */
		bool *rr = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *rr);
		bool *acc = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *acc);
		for (i = 0; i < o->npend; i++) {
			route_target_range(rc, o->pmin[i], o->pmax[i], rr);
			for (size_t j = 0; j < rc->nchunks; j++)
				acc[j] = acc[j] || rr[j];
		}
		nsel = 0;
		for (i = 0; i < rc->nchunks; i++) {
			sel[i] = sel[i] && acc[i];
			nsel += sel[i];
		}
		free(rr);
		free(acc);
		for (i = 0; i < o->npend; i++) {
			bson_destroy(o->pmin[i]);
			bson_destroy(o->pmax[i]);
		}
		o->npend = 0;
	}
	o->first = false;
	px_note_target(c, rc, nsel);
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
		/* first attempt: ONE pass on each shard that holds filtering metadata (chunk-aware
		 * shards, issue #17); a retry of refused ranges, and shards without it, go per
		 * chunk in two phases (the retry must not touch the other chunks of a shard) */
		/* shards whose pass is sent: memo->stream[slot] >= 0 for the first PX_MODE_MEMO
		 * shards of rc (no string compare per chunk), done[] for the others */
		px_mode_memo *memo = sdb_calloc(1, sizeof *memo);
		char **done = sdb_calloc(nsel ? nsel : 1, sizeof *done);
		size_t ndone = 0;
		bool whole = first_attempt;
		for (i = 0; i < rc->nchunks && w->nerr == before; i++) {
			int cls;
			size_t j;
			ssize_t slot;
			if (!sel[i])
				continue;
			/* per-chunk in a transaction (a shard-versioned request to a shard without
			 * filtering metadata would abort it, see read.c scatter_open_once) */
			if (whole && c->tx == NULL && px_shard_mode_memo(memo, rc, i, &slot)) {
				if (slot >= 0 && memo->stream[slot] >= 0)
					continue; /* the shard's pass covered this chunk */
				for (j = 0; slot < 0 && j < ndone; j++)
					if (strcmp(done[j], rc->chunks[i].shard) == 0)
						break;
				if (slot < 0 && j < ndone)
					continue; /* the shard's pass covered this chunk */
				if (slot >= 0)
					memo->stream[slot] = 0;
				else
					done[ndone++] = rc->chunks[i].shard;
				cls = send_stmt_v(c, rc, i, s, NULL, true, true, w);
				if (cls == SHARDCONN_OK)
					touched = true;
				if (cls != SHARDCONN_STALE)
					continue;
				if (px_shard_mode(rc, rc->chunks[i].shard)) {
					stale_shard(o, rc, sel, rc->chunks[i].shard);
					stale = true;
					continue;
				}
				/* the shard has no filtering metadata (nothing applied there):
				 * this chunk and its others per chunk, now */
				if (slot >= 0) {
					memo->stream[slot] = -1;
					memo->on[slot] = false;
				} else {
					ndone--;
				}
			}
			if (multi_on_chunk(c, rc, i, s, w, 0, &touched) == SHARDCONN_STALE) {
				pend_chunk(o, rc, i);
				stale = true;
			}
		}
		free(done);
		free(memo);
	} else {
		/* single document without an exact key: the first owned match */
		int64_t n_before = w->n;
		if (c->txn.on) {
			bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
			char nerr[256];
			int pr = px_probe_executed(c, rc, sel, s->idx, &res, &er, nerr,
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
		return PX_RETRY_DONE;
	if (!s->multi || o->npend == 0)
		o->first = true; /* redo the whole statement */
	return PX_RETRY_STALE;
}

static void stmt_exhausted(px_retry *r, void *arg)
{
	stmt_op *o = arg;

	(void)r;
	wresult_error(o->w, o->s->idx, NULL, WIRE_ERR_STALE_CONFIG,
		      "routing kept changing: StaleConfig retry budget exhausted");
}

/* One update/delete statement on a sharded collection. Returns false when an ordered
 * batch must stop (the statement failed). */
static bool write_stmt(ctx *c, route_coll **rcp, const wstmt *s, wresult *w)
{
	stmt_op o;
	px_retry r;
	char err[512];
	size_t i;

	if (px_uses_js(&s->q, 0)) {
		wresult_error(w, s->idx, NULL, WIRE_ERR_BAD_VALUE,
			      "$where and server-side JavaScript are not allowed on stripedb");
		return false;
	}
	/* under a collation the filter pins no key bytes: the shard checks the new document
	 * instead (px_append_key_check) */
	if (s->is_update && !px_holder_collated(&s->stmt)) {
		bson_t u;
		route_key_change kc = px_get_doc(&s->stmt, "u", &u)
					      ? route_update_changes_key(*rcp, &u, &s->q, err, sizeof err)
					      : ROUTE_KEY_KEPT;
		if (kc != ROUTE_KEY_KEPT) {
			wresult_error(w, s->idx, NULL,
				      kc == ROUTE_KEY_NOT_PINNED ? ERR_SHARD_KEY_NOT_FOUND
								 : WIRE_ERR_IMMUTABLE_FIELD,
				      err);
			return false;
		}
	}
	memset(&o, 0, sizeof o);
	o.s = s;
	o.w = w;
	o.before = w->nerr;
	o.first = true;
	px_retry_init(&r, c, *rcp, stmt_execute, stmt_exhausted, &o);
	px_retry_run(&r);
	*rcp = r.rc;
	r.rc = NULL; /* the caller's reference */
	px_retry_done(&r);
	for (i = 0; i < o.npend; i++) {
		bson_destroy(o.pmin[i]);
		bson_destroy(o.pmax[i]);
	}
	free(o.pmin);
	free(o.pmax);
	return w->nerr == o.before;
}

int px_do_write(ctx *c, bool is_update)
{
	bson_t stmts;
	bson_iter_t it;
	route_coll *rc;
	wresult w;
	bool ordered = px_get_bool(c->cmd, "ordered", true);
	int64_t idx = 0;
	int rst;

	if ((rst = px_route_or_fail(c, &rc)) != 0)
		return rst;
	if (!px_get_array(c->cmd, is_update ? "updates" : "deletes", &stmts)) {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE, "%s needs a %s array",
				is_update ? "update" : "delete", is_update ? "updates" : "deletes");
	}
	if (rc->nkeys == 0) {
		bson_iter_t si;
		route_coll_unref(rc);
		/* the filters are queries (no JavaScript in them at all); the update or
		 * replacement documents may hold JavaScript code values as data, not operators */
		if (bson_iter_init(&si, &stmts))
			while (bson_iter_next(&si)) {
				bson_t st, part;
				bson_iter_t ui;
				uint32_t len;
				const uint8_t *data;
				if (!BSON_ITER_HOLDS_DOCUMENT(&si))
					continue;
				bson_iter_document(&si, &len, &data);
				if (!bson_init_static(&st, data, len))
					continue;
				if (px_get_doc(&st, "q", &part) && (rst = px_refuse_js(c, &part)) != 0)
					return rst;
				if (!bson_iter_init_find(&ui, &st, "u") ||
				    !(BSON_ITER_HOLDS_DOCUMENT(&ui) || BSON_ITER_HOLDS_ARRAY(&ui)))
					continue;
				if (BSON_ITER_HOLDS_DOCUMENT(&ui))
					bson_iter_document(&ui, &len, &data);
				else
					bson_iter_array(&ui, &len, &data);
				if (bson_init_static(&part, data, len) && px_uses_js_ops(&part))
					return px_refuse_js(c, &part);
			}
		return px_forward_primary(c);
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
	rst = answer_write(c, &w, is_update);
	wresult_destroy(&w);
	return rst;
}
