/* The aggregate command of the shard role (MongoDB 6.0 semantics and codes): a pipeline
 * over a collection, a view (its pipeline first), a leading $documents (of
 * {aggregate: 1}) or $collStats, run by the storage pipeline engine (storage/pipeline.h)
 * with a leading $match / $sort / $limit pushed down to the query; shard_agg_exec is also
 * what count, distinct, explain and a find on a view run through (cmd_read_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/aggwrite.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "shard/changestream.h"
#include "shard/cmd_read_int.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "common/bsonval.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/pipeline.h"
#include "storage/projection.h"
#include "storage/query.h"

/* ------------------------------------------------------------------ aggregate */

typedef struct agg_input {
	sdb_query *q;
} agg_input;

static int agg_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	agg_input *in = ctx;
	if (!in->q)
		return 0;
	return sdb_query_next(in->q, doc, code, err, errlen);
}

bool shard_coll_is_view(shard_ctx *x, const char *coll)
{
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	return sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) == 0 &&
	       bson_iter_init_find(&it, co->options, "viewOn");
}

/* Append the stages after it (an iterator over a BSON array) to stages (*nst so far). */
static void stages_append_rest(bson_t *stages, uint32_t *nst, bson_iter_t *it)
{
	while (bson_iter_next(it)) {
		char k[16];
		const char *kp;
		bson_uint32_to_string((*nst)++, &kp, k, sizeof k);
		bson_append_iter(stages, kp, -1, it);
	}
}

/* Append every stage of arr (a BSON array) to stages. */
static void stages_append(bson_t *stages, uint32_t *nst, const bson_t *arr)
{
	bson_iter_t it;
	if (bson_iter_init(&it, arr))
		stages_append_rest(stages, nst, &it);
}

/* Is db.coll a view? Then *source gets its viewOn (in buf) and the view's pipeline
 * stages are appended to *stages (an array builder, keys from *nst). Follows views of
 * views (at most 20 levels). Needs an open transaction. Returns false when not a view. */
static bool view_resolve(shard_ctx *x, const char *coll, char *buf, size_t buflen,
			 bson_t *stages, uint32_t *nst)
{
	bool any = false;
	char cur[256];
	snprintf(cur, sizeof cur, "%s", coll);
	/* collect levels innermost-last, then append outermost source's pipeline first */
	bson_t levels[20];
	int nl = 0;
	for (int depth = 0; depth < 20; depth++) {
		const sdb_store_coll *co = NULL;
		if (sdb_store_coll_get(x->conn, x->db, cur, &co, NULL, 0) != 0)
			break;
		bson_iter_t it, pit;
		if (!bson_iter_init_find(&it, co->options, "viewOn") || !BSON_ITER_HOLDS_UTF8(&it))
			break;
		bson_init(&levels[nl]);
		if (bson_iter_init_find(&pit, co->options, "pipeline") &&
		    BSON_ITER_HOLDS_ARRAY(&pit))
			util_iter_copy(&pit, &levels[nl]);
		nl++;
		snprintf(cur, sizeof cur, "%s", bson_iter_utf8(&it, NULL));
		any = true;
	}
	if (!any)
		return false;
	for (int l = nl - 1; l >= 0; l--) {
		stages_append(stages, nst, &levels[l]);
		bson_destroy(&levels[l]);
	}
	snprintf(buf, buflen, "%s", cur);
	return true;
}

/* Views through a proxy (issue #20): a proxy forwards reads of a collection it does not
 * know as sharded with $stripedbViewCheck: {allow: ["db.src", ...]}, because metadata does
 * not know views and a view over a sharded collection resolved here would read only this
 * shard's share of it. A read whose view resolves to a source outside allow answers 169
 * CommandOnShardedViewNotSupportedOnMongod (mongod's answer to mongos for a view over a
 * sharded collection) naming the source at the end of errmsg, after VIEW_SOURCE_TAG; the
 * proxy decides (src/proxy/exec.c): an unsharded source goes into allow and the read is
 * sent again, a sharded one is refused. A $lookup/$unionWith/$graphLookup collection read
 * on this shard (shard_foreign) is reported the same way, view or not. Returns true when
 * source (a collection of x->db) must be reported, with the message in err. */
#define VIEW_SOURCE_TAG "resolvedView.ns="
static bool view_check(shard_ctx *x, const char *view, const char *source, char *err,
		       size_t errlen)
{
	bson_iter_t it, sub, arr;
	char ns[512];

	if (!bson_iter_init_find(&it, x->cmd, "$stripedbViewCheck") ||
	    !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	snprintf(ns, sizeof ns, "%s.%s", x->db, source);
	if (bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, "allow") &&
	    BSON_ITER_HOLDS_ARRAY(&sub) && bson_iter_recurse(&sub, &arr))
		while (bson_iter_next(&arr))
			if (BSON_ITER_HOLDS_UTF8(&arr) && strcmp(bson_iter_utf8(&arr, NULL), ns) == 0)
				return false;
	snprintf(err, errlen, "Namespace %s.%s reads %s (a view's source or a $lookup/$unionWith "
		 "collection); the proxy must check where it lives; " VIEW_SOURCE_TAG "%s",
		 x->db, view, ns, ns);
	return true;
}

/* The document of a leading {$collStats: spec} over db.coll (a copy for util_docs_free):
 * {ns, host, localTime, storageStats?: the collStats fields, count?: N (a long, at the top
 * level as mongod's appendCollectionRecordCount puts it)}. Replies and returns false for
 * latencyStats or queryExecStats (238 NotImplemented, as the proxy), another option (40415,
 * MongoDB's strict IDL spec), a view (166
 * CommandNotSupportedOnView) or a missing collection with storageStats or count (26
 * NamespaceNotFound, as mongod). Needs x's open read transaction. */
static bool coll_stats_doc(shard_ctx *x, const char *coll, const bson_iter_t *spec,
			   bson_t **out)
{
	bool want_storage = false, want_count = false;
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	bson_t d = BSON_INITIALIZER, sub;

	if (!BSON_ITER_HOLDS_DOCUMENT(spec) || !bson_iter_recurse(spec, &it)) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "$collStats must take a nested object but found a non-object");
		return false;
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "storageStats") == 0) {
			want_storage = true;
		} else if (strcmp(k, "count") == 0) {
			want_count = true;
		} else if (strcmp(k, "latencyStats") == 0 || strcmp(k, "queryExecStats") == 0) {
			/* MongoDB 6.0's, not kept by stripedb: refused, never ignored */
			shard_fail(x, 238,
				   "$collStats: %s is not supported by stripedb (storageStats and "
				   "count are)",
				   k);
			return false;
		} else {
			/* DocumentSourceCollStatsSpec is a strict IDL struct */
			shard_fail(x, 40415, "BSON field '$collStats.%s' is an unknown field.", k);
			return false;
		}
	}
	if (shard_coll_is_view(x, coll)) {
		shard_fail(x, 166, "Namespace %s.%s is a view, not a collection", x->db, coll);
		return false;
	}
	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0)
		co = NULL;
	if (co == NULL && (want_storage || want_count)) {
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "Unable to retrieve %s in "
			   "$collStats stage :: caused by :: Collection [%s.%s] not found.",
			   want_storage ? "storageStats" : "count", x->db, coll);
		return false;
	}
	char *ns = sdb_ns_join(x->db, coll);
	BSON_APPEND_UTF8(&d, "ns", ns);
	free(ns);
	BSON_APPEND_UTF8(&d, "host", "stripedb-shard");
	bson_append_now_utc(&d, "localTime", -1);
	if (want_storage) {
		bson_append_document_begin(&d, "storageStats", -1, &sub);
		shard_coll_stats_append(x, coll, co, &sub);
		bson_append_document_end(&d, &sub);
	}
	if (want_count) /* mongod's appendCollectionRecordCount: a top-level long */
		BSON_APPEND_INT64(&d, "count", sdb_store_count(x->conn, x->db, coll));
	*out = sdb_doc_copy(&d);
	bson_destroy(&d);
	return true;
}

typedef struct array_input {
	bson_t **docs;
	size_t n, pos;
} array_input;

static int array_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	array_input *in = ctx;
	if (in->pos >= in->n)
		return 0;
	*doc = in->docs[in->pos++];
	return 1;
}

/* The documents of a $unionWith / $lookup foreign collection, materialised (array_input
 * plus its own storage). */
typedef struct foreign_docs {
	array_input in;
} foreign_docs;

static void foreign_close(void *ctx)
{
	foreign_docs *f = ctx;
	util_docs_free(f->in.docs, f->in.n);
	free(f);
}

/* sdb_pipeline_foreign_fn of the shard: run stages over db.coll of this shard (a view's
 * pipeline first) in the request's open read transaction (the same snapshot as the main
 * collection), with the variables let; no orphan filtering (the foreign collection has no
 * shard version in the request: a proxy only sends a cross-collection stage to a shard
 * when both collections are unsharded). Nested $unionWith/$lookup use this again. */
static int shard_foreign(void *arg, const char *coll, const bson_t *stages, const bson_t *let,
			 sdb_pipeline_source *out, int *code, char *err, size_t errlen)
{
	shard_ctx *x = arg;
	char source[256];
	bson_t all = BSON_INITIALIZER;
	uint32_t nst = 0;
	sdb_pipeline *p = NULL;
	sdb_pipeline_cursor *pc = NULL;
	agg_input in = {0};
	int rc;

	bool is_view = view_resolve(x, coll, source, sizeof source, &all, &nst);
	/* the collection read here, a view's source or not: a proxy that sent the pipeline
	 * whole (it found every collection unsharded) still checks it, since a view's own
	 * pipeline may name a sharded one and routing may have changed */
	if (view_check(x, coll, is_view ? source : coll, err, errlen)) {
		bson_destroy(&all);
		*code = WIRE_ERR_COMMAND_ON_SHARDED_VIEW;
		return SDB_EINVAL;
	}
	if (is_view)
		coll = source;
	stages_append(&all, &nst, stages);
	sdb_pipeline_opts po = {.let = let, .foreign = shard_foreign, .foreign_arg = x};
	rc = sdb_pipeline_parse(&all, &po, &p, code, err, errlen);
	bson_destroy(&all);
	if (rc != 0)
		return rc;
	sdb_pipeline_pushdown_t pd;
	sdb_pipeline_pushdown(p, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT | SDB_PUSHDOWN_LIMIT, &pd);
	sdb_query_spec spec = {
		.filter = &pd.filter,
		.sort = bson_empty(&pd.sort) ? NULL : &pd.sort,
		.skip = pd.skip,
		.limit = pd.limit > 0 ? pd.limit : 0,
		.let = let,
	};
	rc = sdb_query_open(x->conn, x->db, coll, &spec, &in.q, code, err, errlen);
	sdb_pipeline_pushdown_destroy(&pd);
	if (rc != 0) {
		sdb_pipeline_free(p);
		return rc;
	}
	foreign_docs *f = sdb_calloc(1, sizeof *f);
	size_t cap = 0;
	const bson_t *d;
	sdb_pipeline_open(p, agg_next, &in, &pc);
	while ((rc = sdb_pipeline_cursor_next(pc, &d, code, err, errlen)) == 1)
		util_docs_push(&f->in.docs, &f->in.n, &cap, sdb_doc_copy(d));
	sdb_pipeline_cursor_free(pc);
	sdb_pipeline_free(p);
	sdb_query_free(in.q);
	if (rc < 0) {
		foreign_close(f);
		return rc;
	}
	out->next = array_next;
	out->close = foreign_close;
	out->ctx = f;
	return 0;
}

/* cmd_read_int.h */
bool shard_agg_exec(shard_ctx *x, const char *coll, const bson_t *stages,
		     const bson_iter_t *hint, bson_t ***docs_out, size_t *n_out,
		     sdb_query **q_out)
{
	char source[256];
	bson_t all = BSON_INITIALIZER;
	uint32_t nst = 0;
	array_input sessions = {0};
	bool array_in = false; /* the input is sessions: $listLocalSessions, $documents */
	bson_iter_t it, st;
	bool first_is_documents = bson_iter_init(&it, stages) && bson_iter_next(&it) &&
				  BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) &&
				  bson_iter_next(&st) &&
				  strcmp(bson_iter_key(&st), "$documents") == 0;
	if (coll && first_is_documents) {
		bson_destroy(&all);
		shard_fail(x, WIRE_ERR_INVALID_NAMESPACE,
			   "'$documents' can only be run with {aggregate: 1}");
		return false;
	}
	bool first_is_coll_stats = bson_iter_init(&it, stages) && bson_iter_next(&it) &&
				   BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) &&
				   bson_iter_next(&st) &&
				   strcmp(bson_iter_key(&st), "$collStats") == 0;
	if (coll && first_is_coll_stats) {
		/* the input is one document about the collection (MongoDB's $collStats; this
		 * shard's share, as on a mongod: the proxy adds one per shard) */
		bson_t *d;
		if (!coll_stats_doc(x, coll, &st, &d)) {
			bson_destroy(&all);
			return false;
		}
		array_in = true;
		sessions.docs = sdb_calloc(1, sizeof *sessions.docs);
		sessions.docs[0] = d;
		sessions.n = 1;
		stages_append_rest(&all, &nst, &it);
		coll = NULL; /* no collection scan */
	}
	if (coll && view_resolve(x, coll, source, sizeof source, &all, &nst)) {
		char verr[1024];
		if (view_check(x, coll, source, verr, sizeof verr)) {
			bson_destroy(&all);
			util_docs_free(sessions.docs, sessions.n);
			shard_fail(x, WIRE_ERR_COMMAND_ON_SHARDED_VIEW, "%s", verr);
			return false;
		}
		coll = source;
		hint = NULL;
	}
	if (!coll && first_is_documents) {
		/* MongoDB's desugaring (document_source_documents.cpp): one empty document,
		 * {$project: {f: <the expression>}}, {$unwind: "$f"}, {$replaceWith: "$f"}; the
		 * expression reads `let`, a value that is not an array of documents fails in
		 * $replaceWith (40228) */
		static const char *const f = "__stripedb_documents";
		bson_t sp, proj;
		char path[64];
		array_in = true; /* the input is the array below */
		sessions.docs = sdb_calloc(1, sizeof *sessions.docs);
		bson_t empty = BSON_INITIALIZER;
		sessions.docs[0] = sdb_doc_copy(&empty); /* freed by util_docs_free */
		sessions.n = 1;
		shard_stage_open(&all, &nst, &sp);
		bson_append_document_begin(&sp, "$project", -1, &proj);
		BSON_APPEND_INT32(&proj, "_id", 0);
		bson_append_iter(&proj, f, -1, &st);
		bson_append_document_end(&sp, &proj);
		bson_append_document_end(&all, &sp);
		snprintf(path, sizeof path, "$%s", f);
		shard_stage_open(&all, &nst, &sp);
		BSON_APPEND_UTF8(&sp, "$unwind", path);
		bson_append_document_end(&all, &sp);
		shard_stage_open(&all, &nst, &sp);
		BSON_APPEND_UTF8(&sp, "$replaceWith", path);
		bson_append_document_end(&all, &sp);
		stages_append_rest(&all, &nst, &it);
	} else if (!coll && bson_iter_init(&it, stages) &&
		   bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it) &&
		   bson_iter_recurse(&it, &st) && bson_iter_next(&st) &&
		   strcmp(bson_iter_key(&st), "$currentOp") == 0) {
		/* the op documents taken on the loop thread (src/shard/currentop.c) */
		if (!shard_curop_take(x->sh, wire_req_opid(x->req), &sessions.docs,
				      &sessions.n)) {
			bson_destroy(&all);
			shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
				   "$currentOp is supported only as the first stage of an aggregate "
				   "command (not in explain, a view or a transaction)");
			return false;
		}
		array_in = true;
		stages_append_rest(&all, &nst, &it);
	} else if (!coll && bson_iter_init(&it, stages) &&
		   bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it) &&
		   bson_iter_recurse(&it, &st) && bson_iter_next(&st) &&
		   strcmp(bson_iter_key(&st), "$listLocalSessions") == 0) {
		array_in = true;
		shard_sessions_list(x->sh, &sessions.docs, &sessions.n);
		stages_append_rest(&all, &nst, &it);
	}
	if (!array_in)
		stages_append(&all, &nst, stages);
	sdb_pipeline *p = NULL;
	int code = 0;
	sdb_pipeline_opts po = {.let = shard_let(x), .foreign = shard_foreign, .foreign_arg = x};
	/* the proxy's sharded $sample (src/proxy/read.c): emit each document's random key */
	bson_iter_t sk;
	po.sample_key_out = bson_iter_init_find(&sk, x->cmd, SDB_PIPELINE_SAMPLE_KEY) &&
			    bson_iter_as_bool(&sk);
	if (sdb_pipeline_parse(&all, &po, &p, &code, x->err, sizeof x->err) != 0) {
		bson_destroy(&all);
		util_docs_free(sessions.docs, sessions.n);
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return false;
	}
	bson_destroy(&all);
	sdb_pipeline_pushdown_t pd;
	sdb_pipeline_pushdown(p, coll ? (SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT |
					 SDB_PUSHDOWN_LIMIT)
				      : 0,
			      &pd);
	agg_input in = {0};
	if (coll) {
		sdb_query_spec spec = {
			.filter = &pd.filter,
			.sort = bson_empty(&pd.sort) ? NULL : &pd.sort,
			.hint = hint,
			.skip = pd.skip,
			.limit = pd.limit > 0 ? pd.limit : 0,
			.let = shard_let(x),
		};
		shard_filtering_spec(x, &spec);
		if (sdb_query_open(x->conn, x->db, coll, &spec, &in.q, &code, x->err,
				   sizeof x->err) != 0) {
			sdb_pipeline_pushdown_destroy(&pd);
			sdb_pipeline_free(p);
			shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
			return false;
		}
	}
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_cursor *pc = NULL;
	if (array_in)
		sdb_pipeline_open(p, array_next, &sessions, &pc);
	else
		sdb_pipeline_open(p, agg_next, &in, &pc);
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	const bson_t *d;
	int rc;
	while ((rc = sdb_pipeline_cursor_next(pc, &d, &code, x->err, sizeof x->err)) == 1)
		util_docs_push(&docs, &n, &cap, sdb_doc_copy(d));
	sdb_pipeline_cursor_free(pc);
	sdb_pipeline_free(p);
	util_docs_free(sessions.docs, sessions.n);
	if (rc < 0) {
		sdb_query_free(in.q);
		util_docs_free(docs, n);
		shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
		return false;
	}
	if (q_out) {
		*q_out = in.q;
	} else {
		sdb_query_free(in.q);
		sdb_store_rollback(x->conn);
	}
	*docs_out = docs;
	*n_out = n;
	return true;
}

static bool run_parsed(shard_ctx *x, const bson_t *cmd, const char *coll, const bson_t *stages,
		       bson_t ***docs_out, size_t *n_out, int64_t *batch, bool explain,
		       sdb_query **q_out);

/* cmd_read_int.h */
bool shard_run_aggregate(shard_ctx *x, const bson_t *cmd, const char **coll_out,
			  bson_t ***docs_out, size_t *n_out, int64_t *batch, bool explain,
			  sdb_query **q_out)
{
	bson_iter_t it;
	const char *coll = NULL;
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it)) {
		if (BSON_ITER_HOLDS_UTF8(&it))
			coll = bson_iter_utf8(&it, NULL);
		else if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1) {
			shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
				   "Invalid command format: the 'aggregate' field must specify a "
				   "collection name or 1");
			return false;
		}
	}
	*coll_out = coll;
	if (shard_cs_wanted(cmd)) {
		/* run by shard_cs_aggregate; explain, views and count/distinct never get one */
		shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
			   "explain of a $changeStream aggregate is not supported by stripedb");
		return false;
	}
	bson_t stages;
	if (!bson_iter_init_find(&it, cmd, "pipeline") || !BSON_ITER_HOLDS_ARRAY(&it)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "'pipeline' option must be specified as an array");
		return false;
	}
	util_iter_bson(&it, &stages);
	/* an explained $out/$merge shows the pipeline before it (nothing is written) */
	sdb_aggw ew;
	bool ew_on = false;
	if (explain) {
		int code = sdb_aggw_parse(&stages, x->db, &ew, x->err, sizeof x->err);
		if (code) {
			sdb_aggw_destroy(&ew);
			shard_fail(x, code, "%s", x->err);
			return false;
		}
		ew_on = true;
		stages = ew.stages; /* a view of ew's array, released below */
	}
	bool ok = run_parsed(x, cmd, coll, &stages, docs_out, n_out, batch, explain, q_out);
	if (ew_on)
		sdb_aggw_destroy(&ew);
	return ok;
}

/* The rest of shard_run_aggregate once the pipeline is known. */
static bool run_parsed(shard_ctx *x, const bson_t *cmd, const char *coll, const bson_t *stages,
		       bson_t ***docs_out, size_t *n_out, int64_t *batch, bool explain,
		       sdb_query **q_out)
{
	bson_iter_t it;
	*batch = -1;
	bool have_cursor = false;
	if (bson_iter_init_find(&it, cmd, "cursor")) {
		bson_t cur = BSON_INITIALIZER;
		if (!util_get_doc(x, "aggregate", &it, &cur)) {
			bson_destroy(&cur);
			return false;
		}
		have_cursor = true;
		bson_iter_t bi;
		bool ok = true;
		if (bson_iter_init_find(&bi, &cur, "batchSize"))
			ok = util_get_int(x, "aggregate", &bi, 0, INT64_MAX, batch);
		bson_destroy(&cur);
		if (!ok)
			return false;
	}
	if (!have_cursor && !explain) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "The 'cursor' option is required, except for aggregate with the explain "
			   "argument");
		return false;
	}
	bson_iter_t hint;
	bool have_hint = false;
	if (bson_iter_init_find(&hint, cmd, "hint") &&
	    (BSON_ITER_HOLDS_UTF8(&hint) || BSON_ITER_HOLDS_DOCUMENT(&hint)))
		have_hint = true;
	if (!shard_begin(x, false))
		return false;
	return shard_agg_exec(x, coll, stages, have_hint ? &hint : NULL, docs_out, n_out, q_out);
}

/* An aggregate ending with $out or $merge (w): the checks, the pipeline before it, the
 * writes (cmd_outmerge.c), then an empty cursor as mongod answers (with the writes'
 * writeConcernError, if any). */
static void aggregate_write(shard_ctx *x, const sdb_aggw *w)
{
	const char *coll;
	bson_t **docs;
	size_t n;
	int64_t batch;
	bson_t *wce = NULL;
	if (!shard_aggw_check(x, w))
		return;
	/* the command with the pipeline before the writing stage */
	bson_t cmd = BSON_INITIALIZER;
	bson_iter_t it;
	bson_iter_init(&it, x->cmd);
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "pipeline") == 0)
			BSON_APPEND_ARRAY(&cmd, "pipeline", &w->stages);
		else
			bson_append_iter(&cmd, NULL, 0, &it);
	}
	bool ok = shard_run_aggregate(x, &cmd, &coll, &docs, &n, &batch, false, NULL);
	if (!ok) {
		bson_destroy(&cmd);
		return;
	}
	char *ns = coll ? sdb_ns_join(x->db, coll)
			: sdb_asprintf("%s.$cmd.aggregate", x->db);
	bson_destroy(&cmd); /* coll pointed into it: ns is a copy */
	sdb_store_rollback(x->conn);
	ok = shard_aggw_run(x, w, docs, n, &wce);
	util_docs_free(docs, n);
	if (ok) {
		bson_t *reply = bson_new();
		size_t taken;
		shard_cursor_reply(reply, ns, 0, true, NULL, 0, 0, &taken, NULL);
		if (wce)
			BSON_APPEND_DOCUMENT(reply, "writeConcernError", wce);
		wire_req_reply(x->req, reply);
	}
	if (wce)
		bson_destroy(wce);
	free(ns);
}

void shard_cmd_aggregate(shard_ctx *x)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, x->cmd, "explain") && bson_iter_as_bool(&it)) {
		shard_cmd_explain(x);
		return;
	}
	if (shard_cs_wanted(x->cmd)) {
		shard_cs_aggregate(x);
		return;
	}
	const char *coll;
	bson_t **docs;
	size_t n;
	int64_t batch;
	if (bson_iter_init_find(&it, x->cmd, "pipeline") && BSON_ITER_HOLDS_ARRAY(&it)) {
		bson_t arr;
		sdb_aggw w;
		util_iter_bson(&it, &arr);
		int code = sdb_aggw_parse(&arr, x->db, &w, x->err, sizeof x->err);
		if (code) {
			sdb_aggw_destroy(&w);
			shard_fail(x, code, "%s", x->err);
			return;
		}
		if (w.kind != SDB_AGGW_NONE) {
			aggregate_write(x, &w);
			sdb_aggw_destroy(&w);
			return;
		}
		sdb_aggw_destroy(&w);
	}
	if (!shard_run_aggregate(x, x->cmd, &coll, &docs, &n, &batch, false, NULL))
		return;
	char *ns = coll ? sdb_ns_join(x->db, coll) : sdb_asprintf("%s.$cmd.aggregate",
									      x->db);
	shard_reply_cursor(x, ns, docs, n, batch, false, NULL, NULL);
	free(ns);
}

