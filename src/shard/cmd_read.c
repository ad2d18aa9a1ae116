/* Read commands of the shard role: find, getMore, killCursors, count, distinct, aggregate,
 * explain, and the stripedbSnapshot point-in-time read. MongoDB 6.0 semantics and codes.
 *
 * Why one file of ~1,600 lines (shard_agg_exec's $documents and $collStats inputs joined it):
 * every command here is built on the same three private pieces (the find option parser
 * parse_find_opts, the streaming batch stream_batch with the oplog scan, and the
 * aggregation executor shard_agg_exec that count, distinct and explain run through), so a split
 * would only move them into a shared header. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "shard/cmd_read_int.h"
#include "shard/changestream.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "common/bsonval.h"
#include "storage/collation.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/pipeline.h"
#include "storage/projection.h"
#include "storage/query.h"

static const char OPLOG_DB[] = "local";
/* The most _id values a find run on the loop thread may look up (an equality, or null's
 * two points); shard_pool_run_inline. */
#define INLINE_MAX_POINTS 2
static const char OPLOG_COLL[] = "oplog.rs";

/* Open the next stage of stages (*nst of them so far) as st; the caller appends the stage's
 * field and closes it with bson_append_document_end(stages, st). */
void shard_stage_open(bson_t *stages, uint32_t *nst, bson_t *st)
{
	char k[16];
	const char *kp;
	bson_uint32_to_string((*nst)++, &kp, k, sizeof k);
	BSON_APPEND_DOCUMENT_BEGIN(stages, kp, st);
}

/* Append {name: value-doc} as the next stage of stages. */
void shard_stage_doc(bson_t *stages, uint32_t *nst, const char *name, const bson_t *v)
{
	bson_t st;
	shard_stage_open(stages, nst, &st);
	BSON_APPEND_DOCUMENT(&st, name, v);
	bson_append_document_end(stages, &st);
}

/* Append {name: v} as the next stage of stages. */
void shard_stage_int(bson_t *stages, uint32_t *nst, const char *name, int64_t v)
{
	bson_t st;
	shard_stage_open(stages, nst, &st);
	BSON_APPEND_INT64(&st, name, v);
	bson_append_document_end(stages, &st);
}

/* ------------------------------------------------------------------ find */

typedef struct find_opts {
	bson_t filter, projection, sort;
	bool have_projection, have_sort;
	bson_iter_t hint;
	bool have_hint;
	int64_t skip, limit, batch;
	bool have_batch, single_batch, tailable, await_data, snapshot;
	int64_t max_time_ms;
	bson_t key_range; /* keyRange (find, stripedbSnapshot: shard_filtering_key_range) */
	bool have_key_range;
} find_opts;

static bool parse_find_opts(shard_ctx *x, const bson_t *cmd, const char *cmdname,
			    find_opts *o)
{
	memset(o, 0, sizeof *o);
	bson_init(&o->filter);
	bson_init(&o->projection);
	bson_init(&o->sort);
	bson_init(&o->key_range);
	bson_iter_t it;
	if (!bson_iter_init(&it, cmd))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		/* the first byte of every name below: the command's other fields (its name,
		 * $db, lsid, $clusterTime, txnNumber ...) skip the chain of strcmp (0.9% of a
		 * shard's CPU on point reads, issue #19) */
		if (k[0] == '\0' || strchr("fqpshlbtamk", k[0]) == NULL)
			continue;
		if (strcmp(k, "filter") == 0 || strcmp(k, "query") == 0) {
			if (!util_get_doc(x, cmdname, &it, &o->filter))
				return false;
		} else if (strcmp(k, "projection") == 0 || strcmp(k, "fields") == 0) {
			if (!util_get_doc(x, cmdname, &it, &o->projection))
				return false;
			o->have_projection = true;
		} else if (strcmp(k, "sort") == 0) {
			if (!util_get_doc(x, cmdname, &it, &o->sort))
				return false;
			o->have_sort = true;
		} else if (strcmp(k, "hint") == 0) {
			if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
				uint32_t len;
				const uint8_t *d;
				bson_iter_document(&it, &len, &d);
				if (len > 5) {
					o->hint = it;
					o->have_hint = true;
				}
			} else if (BSON_ITER_HOLDS_UTF8(&it)) {
				if (*bson_iter_utf8(&it, NULL)) {
					o->hint = it;
					o->have_hint = true;
				}
			} else {
				shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
					   "hint must be a string or an object");
				return false;
			}
		} else if (strcmp(k, "skip") == 0) {
			if (!util_get_int(x, cmdname, &it, 0, INT64_MAX, &o->skip))
				return false;
		} else if (strcmp(k, "limit") == 0 && strcmp(cmdname, "count") == 0) {
			/* count_request.cpp countParseLimit: -n means n, except the one value
			 * whose absolute value an int64 cannot hold */
			if (!util_get_int(x, cmdname, &it, INT64_MIN, INT64_MAX, &o->limit))
				return false;
			if (o->limit == INT64_MIN) {
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "limit value for count cannot be min long");
				return false;
			}
			if (o->limit < 0)
				o->limit = -o->limit;
		} else if (strcmp(k, "limit") == 0) {
			/* find_command.idl: limit is a safeInt64 with `validator: { gte: 0 }`
			 * (a negative limit meaning "single batch" is the legacy OP_QUERY form,
			 * which drivers translate to limit + singleBatch) */
			if (!util_get_int(x, cmdname, &it, 0, INT64_MAX, &o->limit))
				return false;
		} else if (strcmp(k, "batchSize") == 0) {
			if (!util_get_int(x, cmdname, &it, 0, INT64_MAX, &o->batch))
				return false;
			o->have_batch = true;
		} else if (strcmp(k, "singleBatch") == 0) {
			o->single_batch = o->single_batch || bson_iter_as_bool(&it);
		} else if (strcmp(k, "tailable") == 0) {
			o->tailable = bson_iter_as_bool(&it);
		} else if (strcmp(k, "awaitData") == 0) {
			o->await_data = bson_iter_as_bool(&it);
		} else if (strcmp(k, "maxTimeMS") == 0) {
			if (!util_get_int(x, cmdname, &it, 0, INT32_MAX, &o->max_time_ms))
				return false;
		} else if (strcmp(k, "stripedbSnapshot") == 0) {
			o->snapshot = bson_iter_as_bool(&it);
		} else if (strcmp(k, "keyRange") == 0) {
			if (strcmp(cmdname, "find") != 0 && strcmp(cmdname, "stripedbSnapshot") != 0) {
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "keyRange is only allowed on find and stripedbSnapshot");
				return false;
			}
			if (!util_get_doc(x, cmdname, &it, &o->key_range))
				return false;
			o->have_key_range = true;
		}
	}
	if (o->await_data && !o->tailable) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "Cannot set 'awaitData' without also setting 'tailable'");
		return false;
	}
	return true;
}

static void find_opts_destroy(find_opts *o)
{
	bson_destroy(&o->filter);
	bson_destroy(&o->projection);
	bson_destroy(&o->sort);
	bson_destroy(&o->key_range);
}

/* parse_find_opts of the command cmdname (cmd) and, with begin, the read transaction
 * (shard_begin). Replies and returns false on failure, o then released; else the caller
 * releases o with find_opts_destroy. */
static bool find_opts_get(shard_ctx *x, const bson_t *cmd, const char *cmdname, bool begin,
			  find_opts *o)
{
	if (parse_find_opts(x, cmd, cmdname, o) && (!begin || shard_begin(x, false)))
		return true;
	find_opts_destroy(o);
	return false;
}

/* The collection of x->cmd (shard_coll_arg), then find_opts_get of x->cmd. NULL after a
 * reply on failure (o then released). */
static const char *find_args(shard_ctx *x, const char *cmdname, bool begin, find_opts *o)
{
	const char *coll = shard_coll_arg(x);
	return coll && find_opts_get(x, x->cmd, cmdname, begin, o) ? coll : NULL;
}

/* The query of o (filter, sort, hint, skip, limit), restricted to the documents this shard
 * owns: with kr, to o's keyRange when it has one (kr then holds its bounds and must outlive
 * spec), else by shard_filtering_spec. Returns 0 or the code of a refused keyRange (message
 * in x->err). */
static int find_spec(shard_ctx *x, const char *coll, const find_opts *o, shard_key_range *kr,
		     sdb_query_spec *spec)
{
	*spec = (sdb_query_spec){
		.filter = &o->filter,
		.sort = o->have_sort ? &o->sort : NULL,
		.hint = o->have_hint ? &o->hint : NULL,
		.skip = o->skip,
		.limit = o->limit,
		.let = shard_let(x),
	};
	if (!kr || !o->have_key_range) {
		shard_filtering_spec(x, spec);
		return 0;
	}
	char *kns = sdb_ns_join(x->db, coll);
	int kc = shard_filtering_key_range(x, kns, &o->key_range, kr, spec);
	free(kns);
	return kc;
}

/* sdb_query_open of spec on db.coll over x->conn; replies (the query's code, else BadValue)
 * and returns NULL on failure. The caller frees the query with sdb_query_free. */
static sdb_query *query_open(shard_ctx *x, const char *coll, const sdb_query_spec *spec)
{
	sdb_query *q = NULL;
	int code = 0;
	if (sdb_query_open(x->conn, x->db, coll, spec, &q, &code, x->err, sizeof x->err) != 0) {
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return NULL;
	}
	return q;
}

/* Does x's command ask for a cursor that is never killed for idleness (find's
 * noCursorTimeout: true; MongoDB 6.0 has it on find only)? */
static bool wants_no_timeout(const shard_ctx *x)
{
	bson_iter_t it;

	return bson_iter_init(&it, x->cmd) && bson_iter_next(&it) &&
	       strcmp(bson_iter_key(&it), "find") == 0 &&
	       bson_iter_init_find(&it, x->cmd, "noCursorTimeout") && bson_iter_as_bool(&it);
}

/* Reply with a cursor over docs (ownership taken). batch < 0: default. */
void shard_reply_cursor(shard_ctx *x, const char *ns, bson_t **docs, size_t n, int64_t batch,
			 bool single, const bson_t *extra, shard_cursor *tail)
{
	size_t take;
	if (batch == 0 && !single)
		take = 0;
	else
		take = shard_batch_fit(docs, n, batch > 0 ? (size_t)batch : SHARD_DEFAULT_BATCH);
	int64_t id = 0;
	bool more = take < n && !single;
	if (tail) {
		/* tailable: the cursor lives on even when drained */
		for (size_t i = take; i < n; i++)
			sdb_doc_free(docs[i]);
		n = take;
		tail->no_timeout = wants_no_timeout(x);
		id = shard_cursor_add(x->sh, tail);
	} else if (more) {
		shard_cursor *c = sdb_calloc_bson(1, sizeof *c);
		c->ns = sdb_strdup(ns);
		bson_init(&c->filter);
		c->docs = sdb_calloc(n - take + 1, sizeof *c->docs);
		for (size_t i = take; i < n; i++)
			c->docs[c->n_docs++] = docs[i];
		n = take;
		c->no_timeout = wants_no_timeout(x);
		id = shard_cursor_add(x->sh, c);
	}
	bson_t *reply = bson_new();
	size_t taken;
	shard_cursor_reply(reply, ns, id, true, docs, take, 0, &taken, extra);
	for (size_t i = 0; i < take; i++)
		sdb_doc_free(docs[i]);
	for (size_t i = take; i < n; i++)
		sdb_doc_free(docs[i]);
	free(docs);
	wire_req_reply(x->req, reply);
}

/* Pack the Timestamp at it into the oplog ts. */
static bool ts_of(const bson_iter_t *it, uint64_t *out)
{
	if (!BSON_ITER_HOLDS_TIMESTAMP(it))
		return false;
	uint32_t t, i;
	bson_iter_timestamp(it, &t, &i);
	*out = sdb_store_ts_pack(t, i);
	return true;
}

/* Lower bound of an oplog filter: {ts: {$gt: T}} / {$gte: T} / {ts: T}. */
static uint64_t oplog_after(const bson_t *filter)
{
	bson_iter_t it, sub;
	uint64_t ts = 0;
	if (!bson_iter_init_find(&it, filter, "ts"))
		return 0;
	if (ts_of(&it, &ts))
		return ts ? ts - 1 : 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub))
		return 0;
	uint64_t best = 0;
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (!ts_of(&sub, &ts))
			continue;
		if (strcmp(k, "$gt") == 0 && ts > best)
			best = ts;
		else if ((strcmp(k, "$gte") == 0 || strcmp(k, "$eq") == 0) && ts && ts - 1 > best)
			best = ts - 1;
	}
	return best;
}

/* Read matching oplog entries with ts > *after into docs (up to limit matches, scanning at
 * most max_scan entries); *after advances to the last entry scanned. */
static int oplog_scan(shard_ctx *x, const sdb_matcher *m, uint64_t *after, size_t limit,
		      size_t max_scan, bson_t ***docs, size_t *n, size_t *cap)
{
	size_t scanned = 0;
	while (scanned < max_scan && (!limit || *n < limit)) {
		bson_t **raw = NULL;
		size_t nraw = 0;
		int rc = sdb_store_oplog_read(x->conn, *after, 1000, &raw, &nraw, x->err,
					      sizeof x->err);
		if (rc)
			return rc;
		size_t i = 0;
		for (; i < nraw; i++) {
			bson_iter_t it;
			uint64_t ts = 0;
			if (bson_iter_init_find(&it, raw[i], "ts"))
				ts_of(&it, &ts);
			*after = ts;
			scanned++;
			if (sdb_matcher_match(m, raw[i])) {
				util_docs_push(docs, n, cap, raw[i]);
				raw[i] = NULL;
				if (limit && *n >= limit) {
					i++;
					break;
				}
			}
		}
		for (size_t j = 0; j < nraw; j++)
			if (raw[j])
				sdb_doc_free(raw[j]);
		free(raw);
		if (nraw < 1000 || i < nraw)
			break;
	}
	return 0;
}

static void find_oplog(shard_ctx *x, find_opts *o)
{
	sdb_matcher *m = NULL;
	int code = 0;
	if (sdb_matcher_new(&o->filter, &m, &code, x->err, sizeof x->err) != 0) {
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return;
	}
	if (!shard_begin(x, false)) {
		sdb_matcher_free(m);
		return;
	}
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	uint64_t start_after = oplog_after(&o->filter);
	uint64_t after = start_after;
	bool natural_desc = false;
	bson_iter_t it;
	if (o->have_sort && bson_iter_init_find(&it, &o->sort, "$natural"))
		natural_desc = bson_iter_as_double(&it) < 0;
	int rc;
	if (natural_desc && !o->tailable) {
		/* newest first, in chunks, until the limit is met or the oplog ends */
		uint64_t before = 0;
		rc = 0;
		for (;;) {
			bson_t **raw = NULL;
			size_t nraw = 0;
			rc = sdb_store_oplog_read_desc(x->conn, start_after, before, 1000, &raw,
						       &nraw, x->err, sizeof x->err);
			for (size_t i = 0; i < nraw; i++) {
				bson_iter_t ti;
				uint64_t ts = 0;
				if (bson_iter_init_find(&ti, raw[i], "ts"))
					ts_of(&ti, &ts);
				before = ts;
				if ((!o->limit || (int64_t)n < o->limit) &&
				    sdb_matcher_match(m, raw[i]))
					util_docs_push(&docs, &n, &cap, raw[i]);
				else
					sdb_doc_free(raw[i]);
			}
			free(raw);
			if (rc || nraw < 1000 || before == 0 || (o->limit && (int64_t)n >= o->limit))
				break;
		}
	} else {
		/* a tailable cursor reads only its first batch now (getMore resumes from
		 * there), so catching up from far back never loads the whole oplog */
		size_t want = o->limit > 0 ? (size_t)o->limit : 0;
		if (o->tailable) {
			size_t b = o->have_batch ? (size_t)o->batch : SHARD_DEFAULT_BATCH;
			if (b == 0)
				b = 1;
			if (!want || b < want)
				want = b;
		}
		rc = oplog_scan(x, m, &after, want, SIZE_MAX, &docs, &n, &cap);
	}
	sdb_store_rollback(x->conn);
	if (rc) {
		util_docs_free(docs, n);
		sdb_matcher_free(m);
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	if (o->skip > 0) {
		size_t s = (size_t)o->skip < n ? (size_t)o->skip : n;
		for (size_t i = 0; i < s; i++)
			sdb_doc_free(docs[i]);
		memmove(docs, docs + s, (n - s) * sizeof *docs);
		n -= s;
	}
	shard_cursor *tail = NULL;
	if (o->tailable && !o->single_batch) {
		tail = sdb_calloc_bson(1, sizeof *tail);
		tail->ns = sdb_strdup("local.oplog.rs");
		tail->tailable = true;
		tail->await_data = o->await_data;
		/* resume after what this batch returns; the rest is read again by getMore */
		size_t take = o->have_batch && o->batch == 0
				      ? 0
				      : shard_batch_fit(docs, n,
							o->have_batch ? (size_t)o->batch
								      : SHARD_DEFAULT_BATCH);
		if (take < n) {
			bson_iter_t ti;
			uint64_t ts = 0;
			if (take > 0 && bson_iter_init_find(&ti, docs[take - 1], "ts"))
				ts_of(&ti, &ts);
			tail->last_ts = take > 0 ? ts : start_after;
		} else {
			tail->last_ts = after;
		}
		bson_copy_to(&o->filter, &tail->filter);
	}
	sdb_matcher_free(m);
	shard_reply_cursor(x, "local.oplog.rs", docs, n, o->have_batch ? o->batch : -1, o->single_batch,
		     NULL, tail);
}

/* Append to arr up to batch documents (0 = no count limit) of q, projected, within the
 * reply byte cap; a document that does not fit waits in *pending for the next batch.
 * *done is set when q has nothing more (looked ahead one document, so an exactly drained
 * query closes its cursor). Returns the count appended, or -1 (x->err, *code). */
static int stream_batch(shard_ctx *x, sdb_query *q, const sdb_projection *proj,
			bson_t **pending, size_t batch, bson_t *arr, bool *done, int *code)
{
	size_t k = 0, bytes = 0;
	*done = false;
	for (;;) {
		bson_t *d = *pending;
		*pending = NULL;
		if (!d) {
			const bson_t *raw;
			int r = sdb_query_next(q, &raw, code, x->err, sizeof x->err);
			if (r < 0)
				return -1;
			if (r == 0) {
				*done = true;
				break;
			}
			d = sdb_doc_new();
			if (proj) {
				if (sdb_projection_apply(proj, raw, d, x->err, sizeof x->err) != 0) {
					sdb_doc_free(d);
					*code = WIRE_ERR_BAD_VALUE;
					return -1;
				}
			} else {
				bson_concat(d, raw);
			}
		}
		char key[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)k, &kp, key, sizeof key);
		/* the array element costs its key and type byte too: with small documents that
		 * overhead alone pushed a full getMore past 16 MiB */
		size_t len = sdb_store_doc_len(d) + strlen(kp) + 2;
		if ((batch && k >= batch) || (k > 0 && bytes + len > SHARD_MAX_REPLY_BYTES)) {
			*pending = d; /* the look-ahead: there is more */
			break;
		}
		bson_append_document(arr, kp, -1, d);
		sdb_doc_free(d);
		bytes += len;
		k++;
	}
	return (int)k;
}

/* A find inside a multi-document transaction (txn.c): it runs on x->conn, where the
 * transaction's own writes are, and its result is materialized (getMore serves it from
 * memory). Takes proj. */
static void find_in_txn(shard_ctx *x, const char *coll, find_opts *o, sdb_projection *proj)
{
	if (!shard_begin(x, false)) {
		sdb_projection_free(proj);
		return;
	}
	if (shard_coll_is_view(x, coll)) {
		sdb_projection_free(proj);
		shard_fail(x, 263 /* OperationNotSupportedInTransaction */,
			   "a find on a view is not supported in a transaction by stripedb");
		return;
	}
	sdb_query_spec spec;
	find_spec(x, coll, o, NULL, &spec);
	sdb_query *q = query_open(x, coll, &spec);
	if (!q) {
		sdb_projection_free(proj);
		return;
	}
	int code = 0;
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	int k;
	for (;;) {
		const bson_t *raw;
		k = sdb_query_next(q, &raw, &code, x->err, sizeof x->err);
		if (k <= 0)
			break;
		bson_t *d = sdb_doc_new();
		if (proj && sdb_projection_apply(proj, raw, d, x->err, sizeof x->err) != 0) {
			sdb_doc_free(d);
			code = WIRE_ERR_BAD_VALUE;
			k = -1;
			break;
		}
		if (!proj)
			bson_concat(d, raw);
		util_docs_push(&docs, &n, &cap, d);
	}
	sdb_query_free(q);
	sdb_projection_free(proj);
	if (k < 0) {
		util_docs_free(docs, n);
		shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	sdb_store_rollback(x->conn);
	char *ns = sdb_ns_join(x->db, coll);
	shard_reply_cursor(x, ns, docs ? docs : sdb_calloc(1, sizeof *docs), n,
		     o->have_batch ? o->batch : -1, o->single_batch, NULL, NULL);
	free(ns);
}

/* run_find's end with its pooled connection fc: x->conn is worker_conn again, fc goes back
 * to the pool and proj is freed. */
static void find_conn_put(shard_ctx *x, sdb_store_conn *worker_conn, sdb_store_conn *fc,
			  sdb_projection *proj)
{
	x->conn = worker_conn;
	if (fc == worker_conn)
		sdb_store_rollback(fc); /* a read on the loop thread: its own connection */
	else
		shard_conn_put(x->sh, fc);
	sdb_projection_free(proj);
}

/* The pipeline that runs o over a view (appended to stages, *nst of them so far): $match,
 * with find_stages a non-empty $sort, then $skip and $limit when set, with find_stages a
 * non-empty $project. A count passes find_stages false. */
static void view_stages(const find_opts *o, bool find_stages, bson_t *stages, uint32_t *nst)
{
	shard_stage_doc(stages, nst, "$match", &o->filter);
	if (find_stages && o->have_sort && !bson_empty(&o->sort))
		shard_stage_doc(stages, nst, "$sort", &o->sort);
	if (o->skip)
		shard_stage_int(stages, nst, "$skip", o->skip);
	if (o->limit)
		shard_stage_int(stages, nst, "$limit", o->limit);
	if (find_stages && o->have_projection && !bson_empty(&o->projection))
		shard_stage_doc(stages, nst, "$project", &o->projection);
}

static void run_find(shard_ctx *x, const char *coll, find_opts *o, bool snapshot)
{
	sdb_projection *proj = NULL;
	int code = 0;
	if (o->have_projection && bson_count_keys(&o->projection) > 0 &&
	    sdb_projection_new_vars(&o->projection, SDB_PROJECTION_FIND, shard_let(x), &proj,
				    &code, x->err, sizeof x->err) != 0) {
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return;
	}
	if (o->tailable) {
		sdb_projection_free(proj);
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "error processing query: tailable cursor requested on non capped "
			   "collection");
		return;
	}
	/* The query runs on a pooled connection that a cursor can keep (every batch from one
	 * snapshot); the version check and the view lookup run in that same transaction. */
	sdb_store_conn *worker_conn = x->conn;
	if (x->in_txn) {
		find_in_txn(x, coll, o, proj);
		return;
	}
	/* on the loop thread, the read ends within this call (a point read: a cursor left
	 * open is deferred below), so it runs on the connection it was given */
	sdb_store_conn *fc = x->inline_run ? x->conn : shard_conn_get(x->sh, x->err, sizeof x->err);
	if (!fc) {
		sdb_projection_free(proj);
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return;
	}
	x->conn = fc;
	if (!shard_begin(x, false)) {
		find_conn_put(x, worker_conn, fc, proj);
		return;
	}
	if (x->inline_run && shard_coll_is_view(x, coll)) {
		/* an aggregation over the view's source: not bounded, a worker runs it */
		sdb_store_rollback(x->conn);
		find_conn_put(x, worker_conn, fc, proj);
		x->deferred = true;
		return;
	}
	if (o->have_key_range && shard_coll_is_view(x, coll)) {
		sdb_store_rollback(x->conn);
		find_conn_put(x, worker_conn, fc, proj);
		shard_fail(x, WIRE_ERR_BAD_VALUE, "keyRange is not allowed on a view");
		return;
	}
	if (shard_coll_is_view(x, coll)) {
		/* a find on a view is an aggregation over its source */
		bson_t **docs;
		size_t n;
		bson_t stages = BSON_INITIALIZER;
		uint32_t nst = 0;
		view_stages(o, true, &stages, &nst);
		bool ok = shard_agg_exec(x, coll, &stages, NULL, &docs, &n, NULL);
		bson_destroy(&stages);
		find_conn_put(x, worker_conn, fc, proj);
		if (!ok)
			return;
		char *ns = sdb_ns_join(x->db, coll);
		shard_reply_cursor(x, ns, docs, n, o->have_batch ? o->batch : -1, o->single_batch, NULL,
			     NULL);
		free(ns);
		return;
	}
	sdb_query_spec spec;
	shard_key_range kr;
	int kc = find_spec(x, coll, o, &kr, &spec);
	if (kc)
		shard_fail(x, kc, "%s", x->err);
	sdb_query *q = kc ? NULL : query_open(x, coll, &spec); /* x->conn is fc */
	if (!q) {
		find_conn_put(x, worker_conn, fc, proj);
		return;
	}
	if (x->inline_run && !sdb_query_is_point(q, INLINE_MAX_POINTS)) {
		/* its cost may grow with the collection: a worker runs it */
		sdb_query_free(q);
		sdb_store_rollback(x->conn);
		find_conn_put(x, worker_conn, fc, proj);
		x->deferred = true;
		return;
	}
	code = 0;
	uint64_t at = snapshot ? sdb_store_oplog_last(fc) : 0;
	size_t batch = o->have_batch ? (size_t)o->batch : SHARD_DEFAULT_BATCH;
	bson_t *reply = bson_new();
	bson_t cur, arr;
	bson_t *pending = NULL;
	bool done = false;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
	BSON_APPEND_ARRAY_BEGIN(&cur, "firstBatch", &arr);
	int k = 0;
	if (!(o->have_batch && o->batch == 0 && !o->single_batch))
		k = stream_batch(x, q, proj, &pending, batch, &arr, &done, &code);
	bson_append_array_end(&cur, &arr);
	if (k < 0) {
		bson_destroy(reply);
		sdb_query_free(q);
		sdb_doc_free(pending);
		shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
		find_conn_put(x, worker_conn, fc, proj);
		return;
	}
	if (x->inline_run && !done && !o->single_batch) {
		/* more than one batch (a small batchSize, documents near 16 MiB): a cursor
		 * needs a connection of its own; nothing was sent, a worker runs it again */
		bson_destroy(reply);
		sdb_query_free(q);
		sdb_doc_free(pending);
		find_conn_put(x, worker_conn, fc, proj);
		x->deferred = true;
		return;
	}
	x->conn = worker_conn;
	char *ns = sdb_ns_join(x->db, coll);
	int64_t id = 0;
	if (done || o->single_batch) {
		sdb_query_free(q);
		sdb_doc_free(pending);
		find_conn_put(x, worker_conn, fc, proj);
	} else {
		shard_cursor *c = sdb_calloc_bson(1, sizeof *c);
		c->ns = sdb_strdup(ns);
		bson_init(&c->filter);
		c->conn = fc;
		c->q = q;
		c->proj = proj;
		c->pending = pending;
		c->no_timeout = wants_no_timeout(x);
		id = shard_cursor_add(x->sh, c);
	}
	BSON_APPEND_INT64(&cur, "id", id);
	BSON_APPEND_UTF8(&cur, "ns", ns);
	if (snapshot)
		BSON_APPEND_TIMESTAMP(&cur, "atOplogTs", (uint32_t)(at >> 32), (uint32_t)at);
	bson_append_document_end(reply, &cur);
	free(ns);
	wire_req_reply(x->req, reply);
}

void shard_cmd_find(shard_ctx *x)
{
	find_opts o;
	if (x->inline_run && strcmp(x->db, OPLOG_DB) == 0) {
		x->deferred = true; /* the oplog is scanned, not looked up: a worker reads it */
		return;
	}
	const char *coll = find_args(x, "find", false, &o);
	if (!coll)
		return;
	if (strcmp(x->db, OPLOG_DB) == 0 && strcmp(coll, OPLOG_COLL) == 0 && o.have_key_range)
		shard_fail(x, WIRE_ERR_BAD_VALUE, "keyRange is not allowed on the oplog");
	else if (strcmp(x->db, OPLOG_DB) == 0 && strcmp(coll, OPLOG_COLL) == 0)
		find_oplog(x, &o);
	else
		run_find(x, coll, &o, o.snapshot);
	find_opts_destroy(&o);
}

void shard_cmd_snapshot(shard_ctx *x)
{
	find_opts o;
	const char *coll = find_args(x, "stripedbSnapshot", false, &o);
	if (!coll)
		return;
	run_find(x, coll, &o, true);
	find_opts_destroy(&o);
}

/* ------------------------------------------------------------------ getMore */


static void getmore_resume(shard_ctx *x);

/* One pass of a tailable getMore: scan the oplog after c->last_ts (at most batch matching
 * entries, 0 = no limit); with awaitData and nothing new before deadline_ms (monotonic),
 * park the request (shard_await_park) instead of blocking this worker, so any number of
 * tailers costs no worker while they wait; it runs again after the next oplog commit. */
static void getmore_tail(shard_ctx *x, shard_cursor *c, int64_t batch, int64_t deadline)
{
	sdb_matcher *m = NULL;
	int code = 0;
	if (wire_req_killed(x->req)) {
		/* killOp: a killed getMore's cursor goes too, as on mongod (Interrupted) */
		shard_cursor_put(x->sh, c, true);
		shard_fail(x, WIRE_ERR_INTERRUPTED, "operation was interrupted");
		return;
	}
	if (sdb_matcher_new(&c->filter, &m, &code, x->err, sizeof x->err) != 0) {
		shard_cursor_put(x->sh, c, true);
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return;
	}
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	if (!shard_begin(x, false)) {
		shard_cursor_put(x->sh, c, false);
		sdb_matcher_free(m);
		return;
	}
	uint64_t after = c->last_ts;
	int rc = oplog_scan(x, m, &after, batch > 0 ? (size_t)batch : 0, 100000, &docs, &n, &cap);
	sdb_store_rollback(x->conn);
	if (rc) {
		shard_cursor_put(x->sh, c, false);
		sdb_matcher_free(m);
		util_docs_free(docs, n);
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	c->last_ts = after;
	if (n == 0 && c->await_data) {
		shard_await *a = sdb_calloc(1, sizeof *a);
		a->fn = getmore_resume;
		a->req = x->req;
		a->c = c;
		a->batch = batch;
		a->deadline_ms = deadline;
		if (shard_await_park(x->sh, a, c->last_ts)) {
			sdb_matcher_free(m);
			util_docs_free(docs, n);
			return; /* answered by a later pass */
		}
		free(a);
	}
	sdb_matcher_free(m);
	bson_t *reply = bson_new();
	size_t taken;
	shard_cursor_reply(reply, c->ns, c->id, false, docs, n, 0, &taken, NULL);
	/* every scanned doc fits by construction unless the reply cap hit: then resume after
	 * the last returned one */
	if (taken < n) {
		bson_iter_t ti;
		uint64_t ts = 0;
		if (taken > 0 && bson_iter_init_find(&ti, docs[taken - 1], "ts"))
			ts_of(&ti, &ts);
		c->last_ts = ts;
	}
	util_docs_free(docs, n);
	shard_cursor_put(x->sh, c, false);
	wire_req_reply(x->req, reply);
}

/* A parked tailable getMore queued again (shard_ctx.resume is its shard_await). */
static void getmore_resume(shard_ctx *x)
{
	shard_await *a = x->resume;
	shard_cursor *c = a->c;
	int64_t batch = a->batch, deadline = a->deadline_ms;
	free(a);
	getmore_tail(x, c, batch, deadline);
}

void shard_cmd_getmore(shard_ctx *x)
{
	bson_iter_t it;
	int64_t id = 0, batch = 0, max_time = 0;
	const char *coll = NULL;
	if (!bson_iter_init_find(&it, x->cmd, "getMore") || !BSON_ITER_HOLDS_INT64(&it)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "BSON field 'getMore.getMore' is the wrong type, expected type 'long'");
		return;
	}
	id = bson_iter_int64(&it);
	if (!bson_iter_init_find(&it, x->cmd, "collection") || !BSON_ITER_HOLDS_UTF8(&it)) {
		shard_fail(x, 40414, "BSON field 'getMore.collection' is missing but a required "
				     "field");
		return;
	}
	coll = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, x->cmd, "batchSize") &&
	    !util_get_int(x, "getMore", &it, 0, INT64_MAX, &batch))
		return;
	bool max_time_given = bson_iter_init_find(&it, x->cmd, "maxTimeMS");
	if (max_time_given && !util_get_int(x, "getMore", &it, 0, INT32_MAX, &max_time))
		return;
	bool busy = false;
	shard_cursor *c = shard_cursor_take(x->sh, id, &busy);
	if (!c) {
		if (busy)
			shard_fail(x, WIRE_ERR_OPERATION_FAILED, "cursor id %lld is already in use",
				   (long long)id);
		else
			shard_fail(x, WIRE_ERR_CURSOR_NOT_FOUND, "cursor id %lld not found",
				   (long long)id);
		return;
	}
	char *ns = sdb_ns_join(x->db, coll);
	if (strcmp(ns, c->ns) != 0) {
		shard_cursor_put(x->sh, c, false);
		shard_fail(x, WIRE_ERR_UNAUTHORIZED,
			   "Requested getMore on namespace '%s', but cursor belongs to a different "
			   "namespace %s",
			   ns, c->ns);
		free(ns);
		return;
	}
	free(ns);
	if (max_time_given && !(c->tailable && c->await_data)) {
		/* mongod's getMore: maxTimeMS is the await time of an awaitData cursor only */
		shard_cursor_put(x->sh, c, false);
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "cannot set maxTimeMS on getMore command for a non-awaitData cursor");
		return;
	}
	if (c->cs) {
		/* a change stream: awaitData as a tailable oplog cursor (changestream.c) */
		shard_cs_getmore(x, c, batch,
				 (int64_t)sdb_mono_ms() + (max_time > 0 ? max_time : 1000));
		return;
	}
	if (c->tailable) {
		/* mongod: an awaitData getMore waits up to maxTimeMS (default 1 s) for new
		 * entries, then answers with an empty batch */
		getmore_tail(x, c, batch, (int64_t)sdb_mono_ms() + (max_time > 0 ? max_time : 1000));
		return;
	}
	if (c->q) {
		/* the find's collation, as mongod's cursor keeps its expression context (the
		 * thread's is restored when the command ends: shard_ctx_run) */
		sdb_collation_use(c->collation);
		bson_t *reply = bson_new();
		bson_t cur, arr;
		bool done = false;
		int code = 0;
		BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
		BSON_APPEND_ARRAY_BEGIN(&cur, "nextBatch", &arr);
		int k = stream_batch(x, c->q, c->proj, &c->pending, batch > 0 ? (size_t)batch : 0,
				     &arr, &done, &code);
		bson_append_array_end(&cur, &arr);
		if (k < 0) {
			bson_destroy(reply);
			shard_cursor_put(x->sh, c, true);
			shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
			return;
		}
		BSON_APPEND_INT64(&cur, "id", done ? 0 : c->id);
		BSON_APPEND_UTF8(&cur, "ns", c->ns);
		bson_append_document_end(reply, &cur);
		shard_cursor_put(x->sh, c, done);
		wire_req_reply(x->req, reply);
		return;
	}
	bson_t *reply = bson_new();
	size_t taken;
	shard_cursor_reply(reply, c->ns, 0, false, c->docs + c->pos, c->n_docs - c->pos,
			   batch > 0 ? (size_t)batch : 0, &taken, NULL);
	bool exhausted = c->pos + taken >= c->n_docs;
	if (!exhausted) {
		/* rewrite the id: the cursor goes on */
		bson_destroy(reply);
		reply = bson_new();
		shard_cursor_reply(reply, c->ns, c->id, false, c->docs + c->pos,
				   c->n_docs - c->pos, batch > 0 ? (size_t)batch : 0, &taken, NULL);
	}
	for (size_t i = 0; i < taken; i++)
		sdb_doc_free(c->docs[c->pos + i]);
	c->pos += taken;
	shard_cursor_put(x->sh, c, exhausted);
	wire_req_reply(x->req, reply);
}

void shard_cmd_killcursors(shard_ctx *x)
{
	bson_iter_t it, sub;
	if (!shard_coll_arg(x))
		return;
	if (!bson_iter_init_find(&it, x->cmd, "cursors") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &sub)) {
		shard_fail(x, 40414,
			   "BSON field 'killCursors.cursors' is missing but a required field");
		return;
	}
	bson_t *reply = bson_new();
	bson_t killed, notfound, alive, unknown;
	bson_t k = BSON_INITIALIZER, nf = BSON_INITIALIZER;
	int nk = 0, nn = 0;
	while (bson_iter_next(&sub)) {
		int64_t id = 0; /* sdb_cmd_check refused other types; no cast of a double */
		char key[16];
		(void)sdb_bson_as_int64_exact(&sub, &id);
		if (shard_cursor_kill(x->sh, id)) {
			snprintf(key, sizeof key, "%d", nk++);
			BSON_APPEND_INT64(&k, key, id);
		} else {
			snprintf(key, sizeof key, "%d", nn++);
			BSON_APPEND_INT64(&nf, key, id);
		}
	}
	BSON_APPEND_ARRAY_BEGIN(reply, "cursorsKilled", &killed);
	bson_concat(&killed, &k);
	bson_append_array_end(reply, &killed);
	BSON_APPEND_ARRAY_BEGIN(reply, "cursorsNotFound", &notfound);
	bson_concat(&notfound, &nf);
	bson_append_array_end(reply, &notfound);
	BSON_APPEND_ARRAY_BEGIN(reply, "cursorsAlive", &alive);
	bson_append_array_end(reply, &alive);
	BSON_APPEND_ARRAY_BEGIN(reply, "cursorsUnknown", &unknown);
	bson_append_array_end(reply, &unknown);
	bson_destroy(&k);
	bson_destroy(&nf);
	wire_req_reply(x->req, reply);
}

/* ------------------------------------------------------------------ count / distinct */

/* Run a query over db.coll on x->conn (o's filter and hint, with paged its skip and limit
 * too, restricted by shard_filtering_spec) and call each(ctx, doc) on every document.
 * Returns true, or false after replying the query's error (its code, else BadValue when it
 * does not open, InternalError when it fails midway). o stays the caller's. */
static bool query_each(shard_ctx *x, const char *coll, const find_opts *o, bool paged,
		       void (*each)(void *ctx, const bson_t *doc), void *ctx)
{
	sdb_query_spec spec = {.filter = &o->filter, .hint = o->have_hint ? &o->hint : NULL};
	if (paged) {
		spec.skip = o->skip;
		spec.limit = o->limit;
	}
	shard_filtering_spec(x, &spec);
	sdb_query *q = query_open(x, coll, &spec);
	if (!q)
		return false;
	const bson_t *d;
	int code = 0, rc;
	while ((rc = sdb_query_next(q, &d, &code, x->err, sizeof x->err)) == 1)
		each(ctx, d);
	sdb_query_free(q);
	if (rc < 0)
		shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
	return rc >= 0;
}

static void count_doc(void *ctx, const bson_t *doc)
{
	(void)doc;
	(*(int64_t *)ctx)++;
}

void shard_cmd_count(shard_ctx *x)
{
	find_opts o;
	const char *coll = find_args(x, "count", true, &o);
	if (!coll)
		return;
	int64_t n = 0;
	if (shard_coll_is_view(x, coll)) {
		bson_t stages = BSON_INITIALIZER, st;
		uint32_t nst = 0;
		view_stages(&o, false, &stages, &nst);
		shard_stage_open(&stages, &nst, &st);
		BSON_APPEND_UTF8(&st, "$count", "n");
		bson_append_document_end(&stages, &st);
		bson_t **docs = NULL;
		size_t nd = 0;
		bool ok = shard_agg_exec(x, coll, &stages, NULL, &docs, &nd, NULL);
		bson_destroy(&stages);
		find_opts_destroy(&o);
		if (!ok)
			return;
		bson_iter_t it;
		if (nd == 1 && bson_iter_init_find(&it, docs[0], "n"))
			n = bson_iter_as_int64(&it);
		util_docs_free(docs, nd);
		bson_t *reply = bson_new();
		BSON_APPEND_INT32(reply, "n", (int32_t)n);
		wire_req_reply(x->req, reply);
		return;
	}
	if (bson_empty(&o.filter) && !o.have_hint && !x->owner) {
		n = sdb_store_count(x->conn, x->db, coll);
		n -= o.skip;
		if (n < 0)
			n = 0;
		if (o.limit && n > o.limit)
			n = o.limit;
	} else if (!query_each(x, coll, &o, true, count_doc, &n)) {
		find_opts_destroy(&o);
		return;
	}
	sdb_store_rollback(x->conn);
	find_opts_destroy(&o);
	bson_t *reply = bson_new();
	if (n <= INT32_MAX)
		BSON_APPEND_INT32(reply, "n", (int32_t)n);
	else
		BSON_APPEND_INT64(reply, "n", n);
	wire_req_reply(x->req, reply);
}

typedef struct distinct_acc {
	const char *key;
	bson_value_t *vals;
	size_t n, cap;
} distinct_acc;

static bool distinct_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	distinct_acc *a = ctx;
	if (!it || (flags & SDB_PATH_MISSING))
		return false;
	if (BSON_ITER_HOLDS_ARRAY(it) && !(flags & SDB_PATH_ELEM))
		return false; /* its elements follow */
	const bson_value_t *v = bson_iter_value((bson_iter_t *)it);
	for (size_t i = 0; i < a->n; i++)
		if (sdb_bson_value_eq(&a->vals[i], v))
			return false;
	if (a->n == a->cap) {
		a->cap = a->cap ? a->cap * 2 : 16;
		a->vals = sdb_realloc(a->vals, a->cap * sizeof *a->vals);
	}
	bson_value_copy(v, &a->vals[a->n++]);
	return false;
}

static void distinct_doc(void *ctx, const bson_t *doc)
{
	distinct_acc *a = ctx;
	sdb_path_walk(doc, a->key, SDB_PATH_EXPAND_LEAF, distinct_visit, a);
}

static int value_cmp(const void *a, const void *b)
{
	return sdb_bson_value_cmp(a, b);
}

void shard_cmd_distinct(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, x->cmd, "key") || !BSON_ITER_HOLDS_UTF8(&it)) {
		shard_fail(x, 40414, "BSON field 'distinct.key' is missing but a required field");
		return;
	}
	const char *key = bson_iter_utf8(&it, NULL);
	char perr[128];
	if (!sdb_path_valid(key, perr, sizeof perr)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "%s", perr);
		return;
	}
	find_opts o;
	if (!find_opts_get(x, x->cmd, "distinct", true, &o))
		return;
	distinct_acc acc = {.key = key};
	bool ok;
	if (shard_coll_is_view(x, coll)) {
		/* a view: its documents through its pipeline and the query's $match (as mongod
		 * runs a distinct on a view as an aggregation), each walked as a collection's
		 * (a view's distinct returned nothing before) */
		bson_t stages = BSON_INITIALIZER;
		uint32_t nst = 0;
		bson_t **docs = NULL;
		size_t nd = 0;
		view_stages(&o, false, &stages, &nst);
		ok = shard_agg_exec(x, coll, &stages, NULL, &docs, &nd, NULL);
		bson_destroy(&stages);
		for (size_t i = 0; ok && i < nd; i++)
			distinct_doc(&acc, docs[i]);
		util_docs_free(docs, nd);
	} else {
		ok = query_each(x, coll, &o, false, distinct_doc, &acc);
	}
	sdb_store_rollback(x->conn);
	find_opts_destroy(&o);
	if (!ok) {
		for (size_t i = 0; i < acc.n; i++)
			bson_value_destroy(&acc.vals[i]);
		free(acc.vals);
		return;
	}
	sdb_qsort(acc.vals, acc.n, sizeof *acc.vals, value_cmp);
	bson_t *reply = bson_new();
	bson_t arr;
	BSON_APPEND_ARRAY_BEGIN(reply, "values", &arr);
	for (size_t i = 0; i < acc.n; i++) {
		char k[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)i, &kp, k, sizeof k);
		bson_append_value(&arr, kp, -1, &acc.vals[i]);
		bson_value_destroy(&acc.vals[i]);
	}
	bson_append_array_end(reply, &arr);
	free(acc.vals);
	wire_req_reply(x->req, reply);
}

/* ------------------------------------------------------------------ explain */

void shard_cmd_explain(shard_ctx *x)
{
	bson_iter_t it;
	bson_t inner;
	bool stats = true;
	bool agg_flag = strcmp(wire_req_name(x->req), "aggregate") == 0;
	if (agg_flag) {
		bson_copy_to(x->cmd, &inner);
		stats = false;
	} else {
		if (!bson_iter_init_find(&it, x->cmd, "explain") ||
		    !BSON_ITER_HOLDS_DOCUMENT(&it)) {
			shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
				   "explain command requires a nested object");
			return;
		}
		bson_t tmp;
		util_iter_bson(&it, &tmp);
		bson_copy_to(&tmp, &inner);
		if (bson_iter_init_find(&it, x->cmd, "verbosity") && BSON_ITER_HOLDS_UTF8(&it) &&
		    strcmp(bson_iter_utf8(&it, NULL), "queryPlanner") == 0)
			stats = false;
	}
	bson_iter_t first;
	if (!bson_iter_init(&first, &inner) || !bson_iter_next(&first)) {
		bson_destroy(&inner);
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE, "explain: empty command");
		return;
	}
	const char *verb = bson_iter_key(&first);
	const char *coll = BSON_ITER_HOLDS_UTF8(&first) ? bson_iter_utf8(&first, NULL) : NULL;
	bson_t *reply = bson_new();
	if (strcmp(verb, "aggregate") == 0) {
		const char *c2;
		bson_t **docs;
		size_t n;
		int64_t batch;
		sdb_query *q = NULL;
		if (!shard_run_aggregate(x, &inner, &c2, &docs, &n, &batch, true, &q)) {
			bson_destroy(reply);
			bson_destroy(&inner);
			return;
		}
		if (q)
			sdb_query_explain(q, stats, reply);
		sdb_query_free(q);
		sdb_store_rollback(x->conn);
		util_docs_free(docs, n);
	} else if (coll && (strcmp(verb, "find") == 0 || strcmp(verb, "count") == 0 ||
			    strcmp(verb, "distinct") == 0 || strcmp(verb, "findAndModify") == 0 ||
			    strcmp(verb, "update") == 0 || strcmp(verb, "delete") == 0)) {
		find_opts o;
		bson_t sub;
		const bson_t *src = &inner;
		bson_init(&sub);
		/* update/delete: explain the first statement's query */
		if ((strcmp(verb, "update") == 0 || strcmp(verb, "delete") == 0) &&
		    bson_iter_init_find(&it, &inner,
					strcmp(verb, "update") == 0 ? "updates" : "deletes")) {
			bson_iter_t arr;
			if (BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr) &&
			    bson_iter_next(&arr) && BSON_ITER_HOLDS_DOCUMENT(&arr)) {
				bson_t st;
				util_iter_bson(&arr, &st);
				bson_iter_t qi;
				if (bson_iter_init_find(&qi, &st, "q"))
					bson_append_iter(&sub, "filter", -1, &qi);
				if (bson_iter_init_find(&qi, &st, "hint"))
					bson_append_iter(&sub, "hint", -1, &qi);
			}
			src = &sub;
		}
		/* sub outlives the query: o.hint is an iterator into it */
		bool ok = parse_find_opts(x, src, verb, &o);
		sdb_query_spec spec;
		shard_key_range kr;
		int kc = 0;
		sdb_query *q = NULL;
		if (ok && shard_begin(x, false) && !(kc = find_spec(x, coll, &o, &kr, &spec)))
			q = query_open(x, coll, &spec);
		else if (kc)
			shard_fail(x, kc, "%s", x->err);
		if (!q) {
			find_opts_destroy(&o);
			bson_destroy(&sub);
			bson_destroy(reply);
			bson_destroy(&inner);
			return;
		}
		int code = 0, r = 0;
		const bson_t *d;
		if (stats)
			while ((r = sdb_query_next(q, &d, &code, x->err, sizeof x->err)) == 1)
				;
		if (r < 0) {
			/* the query failed (e.g. a $expr's evaluation): so does its explain */
			sdb_query_free(q);
			sdb_store_rollback(x->conn);
			find_opts_destroy(&o);
			bson_destroy(&sub);
			bson_destroy(reply);
			bson_destroy(&inner);
			shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
			return;
		}
		sdb_query_explain(q, stats, reply);
		sdb_query_free(q);
		sdb_store_rollback(x->conn);
		find_opts_destroy(&o);
		bson_destroy(&sub);
	} else {
		bson_destroy(reply);
		bson_destroy(&inner);
		shard_fail(x, WIRE_ERR_COMMAND_NOT_FOUND,
			   "Explain failed due to unknown command: %s", verb);
		return;
	}
	bson_t si;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "serverInfo", &si);
	BSON_APPEND_UTF8(&si, "host", "stripedb-shard");
	BSON_APPEND_UTF8(&si, "version", "6.0.0");
	bson_append_document_end(reply, &si);
	bson_destroy(&inner);
	wire_req_reply(x->req, reply);
}
