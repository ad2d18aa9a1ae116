/* Proxy explain (mongos' cluster explain, cluster_explain.cpp): the inner command
 * targeted as its own handler targets it, one explain per targeted shard, the plans
 * combined into SINGLE_SHARD / SHARD_MERGE / SHARD_MERGE_SORT. */
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

/* Commands explain accepts (as mongos: the explainable commands the proxy routes). */
static const char *const explainable[] = {"find",   "count",         "distinct",
					  "aggregate", "update", "delete", "findAndModify",
					  "findandmodify", NULL};

static bool in_list(const char *const *list, const char *name)
{
	size_t i;

	for (i = 0; list[i]; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}

/* OR into sel the chunks the inner command verb would target (the same route_target
 * calls its handler makes; aggregate: its first $match stage, as pushed down). */
static void explain_target(route_coll *rc, const char *verb, const bson_t *inner, bool *sel)
{
	bson_t q, arr, empty = BSON_INITIALIZER;
	bson_iter_t it;
	bool exact, any = false;
	bool *tmp = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *tmp);
	size_t i;

	if (strcmp(verb, "update") == 0 || strcmp(verb, "delete") == 0) {
		if (px_get_array(inner, verb[0] == 'u' ? "updates" : "deletes", &arr) &&
		    bson_iter_init(&it, &arr))
			while (bson_iter_next(&it)) {
				bson_t sq;
				if (!px_stmt_filter(&it, &sq))
					continue;
				memset(tmp, 0, rc->nchunks * sizeof *tmp);
				route_target(rc, &sq, tmp, &exact);
				for (i = 0; i < rc->nchunks; i++)
					sel[i] = sel[i] || tmp[i];
				any = true;
			}
		if (!any)
			route_target(rc, &empty, sel, &exact);
		free(tmp);
		return;
	}
	if (strcmp(verb, "find") == 0)
		any = px_get_doc(inner, "filter", &q);
	else if (strcmp(verb, "aggregate") == 0) {
		if (px_get_array(inner, "pipeline", &arr) && bson_iter_init(&it, &arr) &&
		    bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_t st;
			uint32_t len;
			const uint8_t *data;
			bson_iter_document(&it, &len, &data);
			if (bson_init_static(&st, data, len))
				any = px_get_doc(&st, "$match", &q);
		}
	} else
		any = px_get_doc(inner, "query", &q);
	route_target(rc, any ? &q : &empty, sel, &exact);
	free(tmp);
}

/* The inner command as the proxy sends it to a shard: session fields dropped; a sharded
 * find gets limit + skip pushed down and no skip (the proxy skips after the merge). */
static void explain_inner(const char *verb, const bson_t *inner, bool sharded, bson_t *out)
{
	static const char *const find_skip[] = {"skip", "limit", NULL};
	int64_t skip = px_get_int(inner, "skip", 0), limit = px_get_int(inner, "limit", 0);

	if (sharded && strcmp(verb, "find") == 0 && skip > 0) {
		px_copy_cmd(inner, out, find_skip);
		if (limit != 0)
			BSON_APPEND_INT64(out, "limit", merge_pushdown_limit(skip, limit));
		return;
	}
	px_copy_cmd(inner, out, NULL);
}

/* Sum (or max) of a number field of the shards' executionStats. */
static int64_t exec_stat(pcall *pc, size_t n, const char *field, bool max)
{
	int64_t r = 0, v;
	size_t i;
	bson_t es;

	for (i = 0; i < n; i++) {
		if (!px_get_doc(&pc[i].reply, "executionStats", &es))
			continue;
		v = px_get_int(&es, field, 0);
		r = max ? (v > r ? v : r) : r + v;
	}
	return r;
}

/* The mongos form of explain (cluster_explain.cpp): queryPlanner.winningPlan {stage,
 * shards: [per shard]} and, with executionStats or allPlansExecution, executionStats with
 * executionStages {stage, sums, shards: [per shard]}. Returns: the status of the answer. */
static int explain_answer(ctx *c, const bson_t *inner, const char *verbosity, bool sorted,
			  pcall *pc, size_t n)
{
	const char *stage = n == 1 ? "SINGLE_SHARD" : sorted ? "SHARD_MERGE_SORT" : "SHARD_MERGE";
	bool stats = strcmp(verbosity, "queryPlanner") != 0;
	bson_t *out = bson_new(), qp, wp, arr, d, es, st, sarr, info, cmd;
	char key[24], host[256];
	size_t i;

	bson_append_document_begin(out, "queryPlanner", -1, &qp);
	BSON_APPEND_INT32(&qp, "mongosPlannerVersion", 1);
	bson_append_document_begin(&qp, "winningPlan", -1, &wp);
	BSON_APPEND_UTF8(&wp, "stage", stage);
	bson_append_array_begin(&wp, "shards", -1, &arr);
	for (i = 0; i < n; i++) {
		char *hosts = px_shard_hosts(c, pc[i].shard);
		bson_t sq, si;
		bson_iter_t it;
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "shardName", pc[i].shard);
		BSON_APPEND_UTF8(&d, "connectionString", hosts ? hosts : "");
		free(hosts);
		if (px_get_doc(&pc[i].reply, "serverInfo", &si))
			BSON_APPEND_DOCUMENT(&d, "serverInfo", &si);
		if (px_get_doc(&pc[i].reply, "queryPlanner", &sq)) {
			if (bson_iter_init(&it, &sq))
				while (bson_iter_next(&it))
					bson_append_iter(&d, bson_iter_key(&it), -1, &it);
		} else if (bson_iter_init(&it, &pc[i].reply)) {
			/* a plan the shard describes otherwise (aggregate without a query) */
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (strcmp(k, "ok") != 0 && strcmp(k, "serverInfo") != 0 &&
				    strcmp(k, "executionStats") != 0 && strcmp(k, "$clusterTime") != 0 &&
				    strcmp(k, "operationTime") != 0)
					bson_append_iter(&d, k, -1, &it);
			}
		}
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&wp, &arr);
	bson_append_document_end(&qp, &wp);
	bson_append_document_end(out, &qp);
	if (stats) {
		int64_t nret = exec_stat(pc, n, "nReturned", false);
		int64_t ms = exec_stat(pc, n, "executionTimeMillis", true);
		int64_t keys = exec_stat(pc, n, "totalKeysExamined", false);
		int64_t docs = exec_stat(pc, n, "totalDocsExamined", false);
		bson_append_document_begin(out, "executionStats", -1, &es);
		BSON_APPEND_INT64(&es, "nReturned", nret);
		BSON_APPEND_INT64(&es, "executionTimeMillis", ms);
		BSON_APPEND_INT64(&es, "totalKeysExamined", keys);
		BSON_APPEND_INT64(&es, "totalDocsExamined", docs);
		bson_append_document_begin(&es, "executionStages", -1, &st);
		BSON_APPEND_UTF8(&st, "stage", stage);
		BSON_APPEND_INT64(&st, "nReturned", nret);
		BSON_APPEND_INT64(&st, "executionTimeMillis", ms);
		BSON_APPEND_INT64(&st, "totalKeysExamined", keys);
		BSON_APPEND_INT64(&st, "totalDocsExamined", docs);
		BSON_APPEND_INT64(&st, "totalChildMillis", exec_stat(pc, n, "executionTimeMillis",
								       false));
		bson_append_array_begin(&st, "shards", -1, &sarr);
		for (i = 0; i < n; i++) {
			bson_t ses, one;
			bool have = px_get_doc(&pc[i].reply, "executionStats", &ses);
			snprintf(key, sizeof key, "%zu", i);
			bson_append_document_begin(&sarr, key, -1, &one);
			BSON_APPEND_UTF8(&one, "shardName", pc[i].shard);
			BSON_APPEND_BOOL(&one, "executionSuccess",
					 have ? px_get_bool(&ses, "executionSuccess", true) : true);
			if (have) {
				BSON_APPEND_INT64(&one, "nReturned", px_get_int(&ses, "nReturned", 0));
				BSON_APPEND_INT64(&one, "executionTimeMillis",
						  px_get_int(&ses, "executionTimeMillis", 0));
				BSON_APPEND_INT64(&one, "totalKeysExamined",
						  px_get_int(&ses, "totalKeysExamined", 0));
				BSON_APPEND_INT64(&one, "totalDocsExamined",
						  px_get_int(&ses, "totalDocsExamined", 0));
				BSON_APPEND_DOCUMENT(&one, "executionStages", &ses);
			}
			bson_append_document_end(&sarr, &one);
		}
		bson_append_array_end(&st, &sarr);
		bson_append_document_end(&es, &st);
		if (strcmp(verbosity, "allPlansExecution") == 0) {
			bson_t ap, one, none;
			bson_append_array_begin(&es, "allPlansExecution", -1, &ap);
			for (i = 0; i < n; i++) {
				snprintf(key, sizeof key, "%zu", i);
				bson_append_document_begin(&ap, key, -1, &one);
				BSON_APPEND_UTF8(&one, "shardName", pc[i].shard);
				bson_append_array_begin(&one, "allPlans", -1, &none);
				bson_append_array_end(&one, &none);
				bson_append_document_end(&ap, &one);
			}
			bson_append_array_end(&es, &ap);
		}
		bson_append_document_end(out, &es);
	}
	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "localhost");
	host[sizeof host - 1] = '\0';
	bson_append_document_begin(out, "serverInfo", -1, &info);
	BSON_APPEND_UTF8(&info, "host", host);
	BSON_APPEND_UTF8(&info, "version", "6.0.0-stripedb-" PACKAGE_VERSION);
	bson_append_document_end(out, &info);
	bson_init(&cmd);
	px_copy_cmd(inner, &cmd, NULL);
	BSON_APPEND_DOCUMENT(out, "command", &cmd);
	bson_destroy(&cmd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	return px_reply(c, out);
}

/* do_explain's operation: one explain per targeted shard. */
typedef struct explain_op {
	const char *verb;      /* the explained command's name */
	const bson_t *inner;   /* the explained command */
	const char *verbosity;
} explain_op;

/* One attempt: each targeted shard explains once, with the version of its first targeted
 * chunk, so a shard that lost the chunk refuses with StaleConfig. r->c: the explained
 * command's ctx (its namespace). */
static int explain_execute(px_retry *r, void *arg)
{
	explain_op *o = arg;
	ctx *c = r->c;
	route_coll *rc = r->rc;
	bson_t sort;
	char **ids;
	size_t *first, n = 0, i, k;
	pcall *pc, *bad;
	bool sharded = rc->nkeys > 0, *sel;

	if (!sharded) {
		char *primary;
		if ((r->status = px_with_primary(c, &primary)) != 0)
			return PX_RETRY_DONE; /* answered ShardNotFound */
		ids = sdb_calloc(1, sizeof *ids);
		first = sdb_calloc(1, sizeof *first);
		ids[n++] = primary;
	} else {
		sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		explain_target(rc, o->verb, o->inner, sel);
		ids = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *ids);
		first = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *first);
		for (i = 0; i < rc->nchunks; i++) {
			bool dup = false;
			if (!sel[i])
				continue;
			for (k = 0; k < n && !dup; k++)
				dup = strcmp(ids[k], rc->chunks[i].shard) == 0;
			if (!dup) {
				ids[n] = sdb_strdup(rc->chunks[i].shard);
				first[n++] = i;
			}
		}
		free(sel);
		/* by shard id, so the answer is deterministic */
		for (i = 1; i < n; i++)
			for (k = i; k > 0 && strcmp(ids[k - 1], ids[k]) > 0; k--) {
				char *t = ids[k];
				size_t f = first[k];
				ids[k] = ids[k - 1];
				first[k] = first[k - 1];
				ids[k - 1] = t;
				first[k - 1] = f;
			}
	}
	if (n == 0) { /* a sharded collection without chunks: nothing to explain */
		ids[n] = px_primary(c);
		if (ids[n] == NULL) {
			free(ids);
			free(first);
			r->status = px_error(c, WIRE_ERR_SHARD_NOT_FOUND,
					     "no shard is registered in the metadata service");
			return PX_RETRY_DONE;
		}
		first[n++] = SIZE_MAX;
	}
	pc = px_pcalls_new(c, ids, n);
	for (i = 0; i < n; i++) {
		bson_t in;
		bson_append_document_begin(&pc[i].cmd, "explain", -1, &in);
		explain_inner(o->verb, o->inner, sharded, &in);
		bson_append_document_end(&pc[i].cmd, &in);
		BSON_APPEND_UTF8(&pc[i].cmd, "verbosity", o->verbosity);
		if (sharded && first[i] != SIZE_MAX)
			px_append_version(&pc[i].cmd, &rc->chunks[first[i]]);
	}
	free(first);
	px_fanout(c, n, px_pcall_one, pc);
	bad = px_pcalls_failed(pc, n, NULL);
	for (i = 0; i < n; i++)
		if (pc[i].cls == SHARDCONN_STALE)
			bad = &pc[i];
	if (bad && bad->cls == SHARDCONN_STALE) {
		px_failure_set(&r->last, bad->cls, &bad->reply, bad->nerr);
		px_pcalls_free(pc, n);
		return PX_RETRY_STALE;
	}
	if (bad)
		r->status = px_reply_shard_error(c, bad->cls, &bad->reply, bad->nerr);
	else
		r->status = explain_answer(c, o->inner, o->verbosity,
					   strcmp(o->verb, "find") == 0 &&
						   px_get_doc(o->inner, "sort", &sort) &&
						   !bson_empty(&sort),
					   pc, n);
	px_pcalls_free(pc, n);
	return PX_RETRY_DONE;
}

/* explain (mongos' cluster explain): {explain: <find | count | distinct | aggregate |
 * update | delete | findAndModify>, verbosity}. The inner command is targeted as its own
 * handler targets it (route_target on its filter); each targeted shard gets
 * {explain: <inner as the proxy sends it>, verbosity, $stripedbVersion: <the token of
 * its first targeted chunk>} once, so a shard that lost the chunk answers StaleConfig
 * and the proxy reloads the routing and explains again (within --stale-retry-ms). */
int px_do_explain(ctx *c)
{
	static const char *const verbs[] = {"queryPlanner", "executionStats", "allPlansExecution",
					    NULL};
	bson_t inner;
	bson_iter_t it;
	const char *verbosity = "allPlansExecution", *verb;
	ctx x;
	route_coll *rc;
	explain_op o;
	px_retry r;
	int st;

	if (!bson_iter_init_find(&it, c->cmd, "explain") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !px_get_doc(c->cmd, "explain", &inner)) {
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"explain command requires a nested object");
	}
	if (bson_iter_init_find(&it, c->cmd, "verbosity")) {
		/* refused before (common/cmdopts.c, as the IDL: 14, 2); kept for a resumed run */
		if (!BSON_ITER_HOLDS_UTF8(&it)) {
			return px_error(c, WIRE_ERR_TYPE_MISMATCH,
					"BSON field 'explain.verbosity' is the wrong type, expected "
					"type 'string'");
		}
		verbosity = bson_iter_utf8(&it, NULL);
		if (!in_list(verbs, verbosity)) {
			return px_error(c, WIRE_ERR_BAD_VALUE,
					"Enumeration value '%s' for field 'explain.verbosity' is not "
					"a valid value.",
					verbosity);
		}
	}
	if (!bson_iter_init(&it, &inner) || !bson_iter_next(&it)) {
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"explain command requires a nested object");
	}
	verb = bson_iter_key(&it);
	if (!in_list(explainable, verb)) {
		if (px_cmd_find(verb) != NULL)
			return px_error(c, WIRE_ERR_ILLEGAL_OPERATION, "Cannot explain cmd: %s",
					verb);
		return px_error(c, WIRE_ERR_COMMAND_NOT_FOUND,
				"Explain failed due to unknown command: %s", verb);
	}
	if ((st = px_refuse_js(c, &inner)) != 0)
		return st;
	x = *c;
	x.cmd = &inner;
	x.coll = NULL;
	x.ns[0] = '\0';
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		x.coll = bson_iter_utf8(&it, NULL);
		snprintf(x.ns, sizeof x.ns, "%s.%s", x.db, x.coll);
	} else if (strcmp(verb, "aggregate") != 0) {
		return px_error(c, WIRE_ERR_INVALID_NAMESPACE,
				"%s needs a collection name string as its first field", verb);
	}
	if (x.coll == NULL)
		rc = route_coll_unsharded("", 0);
	else if ((st = px_route_or_fail(&x, &rc)) != 0)
		return st;
	o.verb = verb;
	o.inner = &inner;
	o.verbosity = verbosity;
	px_retry_init(&r, &x, rc, explain_execute, NULL, &o);
	px_retry_run(&r);
	px_retry_done(&r);
	return r.status; /* answered by explain_execute or px_retry_run */
}
