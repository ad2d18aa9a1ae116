/* The foreign side of $unionWith, $lookup and $graphLookup on the proxy (issue #20): where a
 * pipeline with
 * such stages runs (px_agg_placement) and how the merger reads a foreign collection
 * (px_agg_foreign): an aggregate on the foreign namespace through the proxy's own routing,
 * exactly the path a client's aggregate takes (px_do_aggregate on a copy of the request's
 * ctx), drained with getMores. See exec.h. */
#include "build_config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proxy/exec.h"
#include "storage/pipeline.h"

/* Nesting bound of the walk below, which counts $facet levels too: mongod allows
 * SDB_PIPELINE_MAX_SUB_DEPTH nested sub-pipelines and a $facet directly in a $facet is
 * 40600, so a valid pipeline is at most twice that plus one deep (auth/gate.c has the same
 * bound for its own walk). Deeper: 232, as the parse would answer. */
#define FOREIGN_MAX_DEPTH (2 * SDB_PIPELINE_MAX_SUB_DEPTH + 1)

/* The collections a pipeline names: names[i], and graph[i] when a $graphLookup names it. */
typedef struct fnames {
	char **names;
	bool *graph;
	size_t n;
	bool too_deep; /* the walk stopped at FOREIGN_MAX_DEPTH */
} fnames;

static void names_add(fnames *fn, const char *coll, bool graph)
{
	for (size_t i = 0; i < fn->n; i++)
		if (strcmp(fn->names[i], coll) == 0) {
			fn->graph[i] = fn->graph[i] || graph;
			return;
		}
	fn->names = sdb_realloc(fn->names, (fn->n + 1) * sizeof *fn->names);
	fn->graph = sdb_realloc(fn->graph, (fn->n + 1) * sizeof *fn->graph);
	fn->graph[fn->n] = graph;
	fn->names[fn->n++] = sdb_strdup(coll);
}

static void walk(bson_iter_t *arr, fnames *fn, int depth);

/* The sub-pipeline field "pipeline" of the stage argument at v, walked. */
static void walk_sub(const bson_iter_t *v, fnames *fn, int depth)
{
	bson_iter_t f, p;

	if (BSON_ITER_HOLDS_DOCUMENT(v) && bson_iter_recurse(v, &f) &&
	    bson_iter_find(&f, "pipeline") && BSON_ITER_HOLDS_ARRAY(&f) &&
	    bson_iter_recurse(&f, &p))
		walk(&p, fn, depth + 1);
}

/* Every collection named by a $unionWith / $lookup / $graphLookup of the stage array at
 * arr, their sub-pipelines and $facet's, into fn (deduplicated). Malformed stages are
 * skipped: the pipeline's parse refuses them. */
static void walk(bson_iter_t *arr, fnames *fn, int depth)
{
	if (depth > FOREIGN_MAX_DEPTH) {
		fn->too_deep = true;
		return;
	}
	while (bson_iter_next(arr)) {
		bson_iter_t st, f, p;
		const char *op;

		if (!BSON_ITER_HOLDS_DOCUMENT(arr) || !bson_iter_recurse(arr, &st) ||
		    !bson_iter_next(&st))
			continue;
		op = bson_iter_key(&st);
		if (strcmp(op, "$unionWith") == 0) {
			if (BSON_ITER_HOLDS_UTF8(&st)) {
				names_add(fn, bson_iter_utf8(&st, NULL), false);
				continue;
			}
			if (BSON_ITER_HOLDS_DOCUMENT(&st) && bson_iter_recurse(&st, &f) &&
			    bson_iter_find(&f, "coll") && BSON_ITER_HOLDS_UTF8(&f))
				names_add(fn, bson_iter_utf8(&f, NULL), false);
			walk_sub(&st, fn, depth);
		} else if (strcmp(op, "$lookup") == 0 || strcmp(op, "$graphLookup") == 0) {
			if (BSON_ITER_HOLDS_DOCUMENT(&st) && bson_iter_recurse(&st, &f) &&
			    bson_iter_find(&f, "from") && BSON_ITER_HOLDS_UTF8(&f))
				names_add(fn, bson_iter_utf8(&f, NULL), op[1] == 'g');
			if (op[1] == 'l')
				walk_sub(&st, fn, depth);
		} else if (strcmp(op, "$facet") == 0 && BSON_ITER_HOLDS_DOCUMENT(&st) &&
			   bson_iter_recurse(&st, &f)) {
			while (bson_iter_next(&f))
				if (BSON_ITER_HOLDS_ARRAY(&f) && bson_iter_recurse(&f, &p))
					walk(&p, fn, depth + 1);
		}
	}
}

/* exec.h */
int px_agg_placement(ctx *c, const bson_t *stages, bool *cross, bool *foreign_sharded)
{
	fnames fn = {0};
	bson_iter_t it;
	int st = 0;

	*cross = false;
	*foreign_sharded = false;
	if (bson_iter_init(&it, stages))
		walk(&it, &fn, 0);
	*cross = fn.n > 0;
	if (fn.too_deep)
		st = px_error(c, 232 /* MaxSubPipelineDepthExceeded */,
			      "Maximum number of nested sub-pipelines exceeded. Limit is %d",
			      SDB_PIPELINE_MAX_SUB_DEPTH);
	for (size_t i = 0; i < fn.n && st == 0; i++) {
		ctx sub = *c;
		route_coll *rc;
		char err[256];
		bool sharded;

		snprintf(sub.ns, sizeof sub.ns, "%s.%s", c->db, fn.names[i]);
		rc = px_route(&sub, false, err, sizeof err);
		if (rc == NULL) {
			st = px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
			break;
		}
		sharded = rc->nkeys > 0;
		route_coll_unref(rc);
		*foreign_sharded = *foreign_sharded || sharded;
		/* mongod's DocumentSourceGraphLookUp::performSearch: a sharded `from` only
		 * outside a transaction */
		if (sharded && fn.graph[i] && c->tx != NULL)
			st = px_error(c, 3904801,
				      "Cannot run $graphLookup with a sharded foreign collection in a "
				      "transaction");
	}
	for (size_t i = 0; i < fn.n; i++)
		free(fn.names[i]);
	free(fn.names);
	free(fn.graph);
	return st;
}

/* The documents of one batch array field (firstBatch / nextBatch) of reply's cursor
 * appended to *docs; *id gets the cursor id. False when reply has no cursor. */
static bool take_batch(const bson_t *reply, const char *field, bson_t ***docs, size_t *n,
		       size_t *cap, int64_t *id)
{
	bson_iter_t it, cur, arr;

	*id = 0;
	if (!bson_iter_init_find(&it, reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &cur))
		return false;
	while (bson_iter_next(&cur)) {
		if (strcmp(bson_iter_key(&cur), "id") == 0 && BSON_ITER_HOLDS_NUMBER(&cur)) {
			*id = bson_iter_as_int64(&cur);
		} else if (strcmp(bson_iter_key(&cur), field) == 0 && BSON_ITER_HOLDS_ARRAY(&cur) &&
			   bson_iter_recurse(&cur, &arr)) {
			while (bson_iter_next(&arr)) {
				uint32_t len;
				const uint8_t *data;
				bson_t d;

				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				bson_iter_document(&arr, &len, &data);
				if (!bson_init_static(&d, data, len))
					continue;
				if (*n == *cap) {
					*cap = *cap ? *cap * 2 : 64;
					*docs = sdb_realloc(*docs, *cap * sizeof **docs);
				}
				(*docs)[(*n)++] = bson_copy(&d);
			}
		}
	}
	return true;
}

/* exec.h */
int px_sub_run(ctx *sub, int (*run)(ctx *), const bson_t *cmd, bson_t **reply, int *code,
		   char *err, size_t errlen)
{
	px_answer ans;
	bson_iter_t it;

	memset(&ans, 0, sizeof ans);
	sub->ans = &ans;
	sub->cmd = cmd;
	*reply = NULL;
	run(sub);
	sub->ans = NULL; /* ans dies with this call: sub keeps no pointer to it */
	if (ans.state == 1 && ans.reply != NULL && bson_iter_init_find(&it, ans.reply, "ok") &&
	    bson_iter_as_double(&it) == 1.0) {
		*reply = ans.reply;
		ans.reply = NULL;
		px_answer_clear(&ans);
		return 0;
	}
	if (ans.state == 2) {
		*code = ans.code;
		snprintf(err, errlen, "%s", ans.msg ? ans.msg : "");
	} else if (ans.state == 1 && ans.reply != NULL) {
		*code = bson_iter_init_find(&it, ans.reply, "code") ? (int)bson_iter_as_int64(&it)
								       : WIRE_ERR_INTERNAL;
		snprintf(err, errlen, "%s",
			 bson_iter_init_find(&it, ans.reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it)
				 ? bson_iter_utf8(&it, NULL)
				 : "sub-request failed");
	} else {
		*code = WIRE_ERR_INTERNAL;
		snprintf(err, errlen, "sub-request gave no answer");
	}
	px_answer_clear(&ans);
	return SDB_EINVAL;
}

/* exec.h */
int px_sub_aggregate(ctx *c, const char *coll, const bson_t *stages, const bson_t *let,
		     bson_t ***docs, size_t *n, int *code, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, cur, lv, lit;
	bson_t *reply = NULL;
	size_t cap = 0;
	int64_t id = 0;
	int rc;
	ctx sub = *c;
	bson_iter_t it;

	*docs = NULL;
	*n = 0;
	if (coll != NULL)
		BSON_APPEND_UTF8(&cmd, "aggregate", coll);
	else
		BSON_APPEND_INT32(&cmd, "aggregate", 1); /* {aggregate: 1}: $documents ... */
	BSON_APPEND_ARRAY(&cmd, "pipeline", stages);
	bson_append_document_begin(&cmd, "cursor", -1, &cur);
	bson_append_document_end(&cmd, &cur);
	if (let != NULL && !bson_empty(let) && bson_iter_init(&it, let)) {
		/* evaluated values: each a {$literal} so that the shard's let parse keeps it */
		bson_append_document_begin(&cmd, "let", -1, &lv);
		while (bson_iter_next(&it)) {
			bson_append_document_begin(&lv, bson_iter_key(&it), -1, &lit);
			bson_append_iter(&lit, "$literal", -1, &it);
			bson_append_document_end(&lv, &lit);
		}
		bson_append_document_end(&cmd, &lv);
	}
	/* the foreign side compares under the pipeline's collation (issue #20) */
	px_append_collation(c->cmd, &cmd);
	sub.coll = coll;
	snprintf(sub.ns, sizeof sub.ns, "%s.%s", c->db, coll ? coll : "$cmd.aggregate");
	rc = px_sub_run(&sub, px_do_aggregate, &cmd, &reply, code, err, errlen);
	bson_destroy(&cmd);
	if (rc != 0)
		return rc;
	if (!take_batch(reply, "firstBatch", docs, n, &cap, &id))
		id = 0;
	bson_destroy(reply);
	while (id != 0) {
		bson_t gm = BSON_INITIALIZER;

		BSON_APPEND_INT64(&gm, "getMore", id);
		BSON_APPEND_UTF8(&gm, "collection", coll ? coll : "$cmd.aggregate");
		sub.coll = NULL;
		rc = px_sub_run(&sub, px_do_get_more, &gm, &reply, code, err, errlen);
		bson_destroy(&gm);
		if (rc != 0)
			break;
		if (!take_batch(reply, "nextBatch", docs, n, &cap, &id))
			id = 0;
		bson_destroy(reply);
	}
	if (rc != 0) {
		for (size_t i = 0; i < *n; i++)
			bson_destroy((*docs)[i]);
		free(*docs);
		*docs = NULL;
		*n = 0;
	}
	return rc;
}

/* The materialised documents of a foreign read (sdb_pipeline_source's ctx). */
typedef struct foreign_docs {
	bson_t **docs;
	size_t n, pos;
} foreign_docs;

static int foreign_next(void *arg, const bson_t **doc, int *code, char *err, size_t errlen)
{
	foreign_docs *f = arg;

	(void)code;
	(void)err;
	(void)errlen;
	if (f->pos >= f->n)
		return 0;
	*doc = f->docs[f->pos++];
	return 1;
}

static void foreign_close(void *arg)
{
	foreign_docs *f = arg;

	for (size_t i = 0; i < f->n; i++)
		bson_destroy(f->docs[i]);
	free(f->docs);
	free(f);
}

/* exec.h */
int px_agg_foreign(void *arg, const char *coll, const bson_t *stages, const bson_t *let,
		   sdb_pipeline_source *out, int *code, char *err, size_t errlen)
{
	ctx *c = arg;
	foreign_docs *f = sdb_calloc(1, sizeof *f);
	int rc = px_sub_aggregate(c, coll, stages, let, &f->docs, &f->n, code, err, errlen);

	if (rc != 0) {
		foreign_close(f);
		return rc;
	}
	out->next = foreign_next;
	out->close = foreign_close;
	out->ctx = f;
	return 0;
}
