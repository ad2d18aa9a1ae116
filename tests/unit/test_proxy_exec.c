/* Unit tests of the proxy's command handlers (src/proxy/read.c, write.c) and its one retry
 * path (src/proxy/retry.c, issue #24), against a fake cluster (retry.h's px_cluster seam):
 * two shards a and b, a collection db.c sharded on k with chunks [MinKey, 100) on a and
 * [100, MaxKey) on b. The fake records every command it is sent and answers as the test
 * scripted it (documents held, StaleConfig refusals, network errors); the handlers run on
 * the test's thread with a zeroed proxy, and their one answer is read from the ctx. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/proxy/exec.c"
#include "../../src/proxy/retry.c"
#include "../../src/proxy/shardver.c"
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/clock.h"
#include "proxy/exec.h"

#define ERR_STALE_CONFIG 13388

typedef struct fake {
	route_coll *rc;      /* the routing the metadata service would give */
	route_coll *next;    /* given (and kept) at the next forced reload when not NULL */
	int reloads;         /* forced reloads asked (StaleConfig refreshes) */
	bool route_down;     /* metadata unreachable and nothing cached: route gives NULL */
	int stale[2];        /* per shard (a, b): StaleConfig answers still to give */
	bool always_stale;   /* every versioned command is refused with StaleConfig */
	bool net_err_b;      /* shard b does not answer (the command never reaches it) */
	int unsent_b;        /* b's next n commands never reach it (restarting), then it answers */
	int unknown_b;       /* b's next n commands fail after being sent (outcome unknown) */
	bool down[2];        /* per shard: the retry path's circuit state (set_shard_down) */
	bool filtering;      /* the shards hold filtering metadata (issue #17); without it a
			      * command with $stripedbShardVersion is refused StaleConfig with
			      * vWanted: null before anything runs, and not logged (the tests
			      * count the per-chunk protocol) */
	int nometa;          /* such refusals */
	const bson_t *docs[2]; /* per shard: an array of the documents it holds */
	bson_t log[64];      /* every command sent (copies) ... */
	char log_shard[64];  /* ... and its shard ('a' or 'b') */
	size_t nlog;
} fake;

static int shard_index(const char *shard)
{
	return strcmp(shard, "a") == 0 ? 0 : 1;
}

static int fake_command(void *impl, const char *shard, const char *db, const bson_t *cmd,
			uint32_t *sid, bson_t *reply, char *neterr, size_t nelen, int *fate)
{
	fake *f = impl;
	int s = shard_index(shard);
	bson_iter_t it;
	const char *name = "";

	(void)sid;
	*fate = SHARDCONN_ANSWERED;
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it))
		name = bson_iter_key(&it);
	if (bson_has_field(cmd, "$stripedbShardVersion") && !f->filtering) {
		f->nometa++;
		bson_init(reply);
		BSON_APPEND_DOUBLE(reply, "ok", 0.0);
		BSON_APPEND_UTF8(reply, "errmsg", "no filtering metadata");
		BSON_APPEND_INT32(reply, "code", ERR_STALE_CONFIG);
		BSON_APPEND_UTF8(reply, "codeName", "StaleConfig");
		BSON_APPEND_NULL(reply, "vWanted");
		return SHARDCONN_STALE;
	}
	assert_true(f->nlog < 64);
	bson_copy_to(cmd, &f->log[f->nlog]);
	f->log_shard[f->nlog++] = shard[0];
	bson_init(reply);
	if (bson_has_field(cmd, "$stripedbVersion") && (f->always_stale || f->stale[s] > 0)) {
		if (f->stale[s] > 0)
			f->stale[s]--;
		BSON_APPEND_DOUBLE(reply, "ok", 0.0);
		BSON_APPEND_UTF8(reply, "errmsg", "version mismatch");
		BSON_APPEND_INT32(reply, "code", ERR_STALE_CONFIG);
		BSON_APPEND_UTF8(reply, "codeName", "StaleConfig");
		return SHARDCONN_STALE;
	}
	if (s == 1 && (f->net_err_b || f->unsent_b > 0)) {
		if (f->unsent_b > 0)
			f->unsent_b--;
		*fate = SHARDCONN_UNSENT;
		snprintf(neterr, nelen, "shard b: no suitable servers");
		return SHARDCONN_NET_ERR;
	}
	if (s == 1 && f->unknown_b > 0) {
		f->unknown_b--;
		*fate = SHARDCONN_UNKNOWN_OUTCOME;
		snprintf(neterr, nelen, "shard b: connection reset");
		return SHARDCONN_NET_ERR;
	}
	if (strcmp(name, "find") == 0) {
		bson_t cur;
		char ns[128];
		snprintf(ns, sizeof ns, "%s.%s", db, bson_iter_utf8(&it, NULL));
		bson_append_document_begin(reply, "cursor", -1, &cur);
		BSON_APPEND_INT64(&cur, "id", 0);
		BSON_APPEND_UTF8(&cur, "ns", ns);
		BSON_APPEND_ARRAY(&cur, "firstBatch", f->docs[s]);
		bson_append_document_end(reply, &cur);
	} else if (strcmp(name, "count") == 0) {
		bson_iter_t d;
		int n = 0;
		if (bson_iter_init(&d, f->docs[s]))
			while (bson_iter_next(&d))
				n++;
		BSON_APPEND_INT32(reply, "n", n); /* a real shard drops its orphans */
	} else if (strcmp(name, "insert") == 0) {
		bson_iter_t docs;
		int n = 0;
		if (bson_iter_init_find(&it, cmd, "documents") && bson_iter_recurse(&it, &docs))
			while (bson_iter_next(&docs))
				n++;
		BSON_APPEND_INT32(reply, "n", n);
	} else if (strcmp(name, "findAndModify") == 0) {
		bson_t leo;
		bson_append_document_begin(reply, "lastErrorObject", -1, &leo);
		BSON_APPEND_INT32(&leo, "n", 1);
		bson_append_document_end(reply, &leo);
		BSON_APPEND_NULL(reply, "value");
	}
	BSON_APPEND_DOUBLE(reply, "ok", 1.0);
	return SHARDCONN_OK;
}

static void fake_fanout(void *impl, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
	size_t i;

	(void)impl;
	for (i = 0; i < n; i++)
		fn(arg, i);
}

static route_coll *fake_route(void *impl, const char *ns, bool force, char *err, size_t errlen)
{
	fake *f = impl;

	(void)ns;
	if (f->route_down) {
		snprintf(err, errlen, "metadata unreachable");
		return NULL;
	}
	if (force) {
		f->reloads++;
		if (f->next) {
			route_coll_unref(f->rc);
			f->rc = f->next;
			f->next = NULL;
		}
	}
	route_coll_ref(f->rc);
	return f->rc;
}

static char *fake_primary(void *impl)
{
	(void)impl;
	return strdup("a");
}

static size_t fake_shard_ids(void *impl, char ***out)
{
	(void)impl;
	*out = calloc(2, sizeof **out);
	(*out)[0] = strdup("a");
	(*out)[1] = strdup("b");
	return 2;
}

static char *fake_shard_hosts(void *impl, const char *id)
{
	(void)impl;
	return strdup(id);
}

static bool fake_shard_down(void *impl, const char *id)
{
	fake *f = impl;

	return f->down[shard_index(id)];
}

static void fake_set_shard_down(void *impl, const char *id, bool down)
{
	fake *f = impl;

	f->down[shard_index(id)] = down;
}

static const px_cluster fake_cluster = {fake_command,	  fake_fanout,	    fake_route,
					fake_primary,	  fake_shard_ids,   fake_shard_hosts,
					fake_shard_down,  fake_set_shard_down};

/* db.c on k: [MinKey, 100) chunk "1" on a, [100, MaxKey) chunk "2" on b, tokens t1, t2. */
static route_coll *table(int64_t version, int64_t t1, int64_t t2)
{
	bson_t *t = BCON_NEW("routingVersion", BCON_INT64(version), "chunks", "[", "{", "id",
			     BCON_INT64(1), "ns", "db.c", "min", "{", "k", BCON_MINKEY, "}", "max",
			     "{", "k", BCON_INT32(100), "}", "shard", "a", "token", BCON_INT64(t1),
			     "}", "{", "id", BCON_INT64(2), "ns", "db.c", "min", "{", "k",
			     BCON_INT32(100), "}", "max", "{", "k", BCON_MAXKEY, "}", "shard", "b",
			     "token", BCON_INT64(t2), "}", "]");
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = NULL;
	char err[256];

	assert_int_equal(route_coll_build("db.c", key, t, &c, err, sizeof err), 0);
	bson_destroy(t);
	bson_destroy(key);
	return c;
}

typedef struct env {
	fake f;
	proxy p;
	px_answer ans;
	ctx c;
	bson_t *docs_a, *docs_b;
} env;

/* a holds k = 1, 2 and an orphan k = 150 a migration left behind; b holds k = 150, 160 */
static int setup(void **state)
{
	env *e = calloc(1, sizeof *e);

	e->f.rc = table(7, 1, 1);
	e->docs_a = BCON_NEW("0", "{", "_id", BCON_INT32(1), "k", BCON_INT32(1), "}", "1", "{",
			     "_id", BCON_INT32(2), "k", BCON_INT32(2), "}", "2", "{", "_id",
			     BCON_INT32(3), "k", BCON_INT32(150), "}");
	e->docs_b = BCON_NEW("0", "{", "_id", BCON_INT32(3), "k", BCON_INT32(150), "}", "1", "{",
			     "_id", BCON_INT32(4), "k", BCON_INT32(160), "}");
	e->f.docs[0] = e->docs_a;
	e->f.docs[1] = e->docs_b;
	e->p.cluster = &fake_cluster;
	e->p.cluster_impl = &e->f;
	e->p.stale_retry_ms = 5000;
	e->p.m_stale_retries = sdb_metrics_counter("test_stale_retries_total", "t", NULL);
	e->p.m_shard_retries = sdb_metrics_counter("test_shard_retries_total", "t", NULL);
	e->p.m_scatter = sdb_metrics_counter("test_routed_total", "t", "kind=\"scatter\"");
	e->p.m_targeted = sdb_metrics_counter("test_routed_total", "t", "kind=\"targeted\"");
	e->p.m_cursors = sdb_metrics_gauge("test_cursors", "t", NULL);
	e->p.txns = pxtxn_table_new();
	uv_mutex_init(&e->p.cmu);
	uv_mutex_init(&e->p.mu); /* proxy_db_primary (issue #18) */
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	env *e = *state;
	size_t i;

	for (i = 0; i < e->f.nlog; i++)
		bson_destroy(&e->f.log[i]);
	route_coll_unref(e->f.rc);
	if (e->f.next)
		route_coll_unref(e->f.next);
	if (e->ans.reply)
		bson_destroy(e->ans.reply);
	if (e->ans.extra)
		bson_destroy(e->ans.extra);
	bson_free(e->ans.msg);
	proxy_txn_free(&e->c.txn);
	bson_destroy(e->docs_a);
	bson_destroy(e->docs_b);
	proxy_cursor_reap(&e->p, true);
	pxtxn_table_free(e->p.txns);
	uv_mutex_destroy(&e->p.cmu);
	uv_mutex_destroy(&e->p.mu);
	free(e);
	return 0;
}

/* Prepare e->c for cmd (collection "c" of db "db") with a StaleConfig budget of budget_ms. */
static void request(env *e, const bson_t *cmd, int64_t budget_ms)
{
	memset(&e->c, 0, sizeof e->c);
	e->c.p = &e->p;
	e->c.ans = &e->ans;
	e->c.cmd = cmd;
	e->c.db = "db";
	e->c.coll = "c";
	snprintf(e->c.ns, sizeof e->c.ns, "db.c");
	e->c.deadline_ms = sdb_mono_ms() + (uint64_t)budget_ms;
}

static void ans_reset(env *e);

/* A handler's status checked against its answer, as run_job checks it. */
static void check_run(const env *e, int status)
{
	assert_int_equal(px_check_answer(status, &e->ans), PX_ANSWER_OK);
}

static int64_t reply_int(const env *e, const char *field)
{
	bson_iter_t it;

	assert_int_equal(e->ans.state, 1);
	assert_true(bson_iter_init_find(&it, e->ans.reply, field));
	return bson_iter_as_int64(&it);
}

/* The token the i-th logged command carried in $stripedbVersion (-1: none). */
static int64_t sent_token(const env *e, size_t i)
{
	bson_iter_t it;

	if (bson_iter_init(&it, &e->f.log[i]) &&
	    bson_iter_find_descendant(&it, "$stripedbVersion.token", &it))
		return bson_iter_as_int64(&it);
	return -1;
}

static size_t count_sent(const env *e, const char *name, char shard)
{
	size_t i, n = 0;

	for (i = 0; i < e->f.nlog; i++)
		if (e->f.log_shard[i] == shard && bson_has_field(&e->f.log[i], name))
			n++;
	return n;
}

/* count: one gated find per chunk, the orphan on a dropped by the ownership filter. */
static void test_count_owned(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");

	request(e, cmd, 5000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 4);
	assert_int_equal(e->f.nlog, 2);
	assert_int_equal(sent_token(e, 0), 1);
	assert_int_equal(sent_token(e, 1), 1);
	bson_destroy(cmd);
}

/* A StaleConfig refusal: the routing is reloaded and the count asked again under the new
 * tokens; one answer. */
static void test_count_stale_retried(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");
	uint64_t before = sdb_counter_value(e->p.m_stale_retries);

	e->f.stale[0] = 1;
	e->f.next = table(8, 5, 6);
	request(e, cmd, 5000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 4);
	assert_int_equal(e->f.reloads, 1);
	assert_int_equal(sdb_counter_value(e->p.m_stale_retries), before + 1);
	assert_int_equal(e->f.nlog, 4); /* a (refused), b, then a and b under version 8 */
	assert_int_equal(sent_token(e, 2), 5);
	assert_int_equal(sent_token(e, 3), 6);
	bson_destroy(cmd);
}

/* The budget spent: the shard's StaleConfig is the answer, given once, with no reload. */
static void test_count_stale_exhausted(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");

	e->f.always_stale = true;
	request(e, cmd, 0);
	/* answered by px_retry_run when the budget is spent: its status comes back */
	assert_int_equal(px_do_count(&e->c), ERR_STALE_CONFIG);
	assert_int_equal(e->ans.state, 2);
	assert_int_equal(e->ans.code, ERR_STALE_CONFIG);
	assert_int_equal(e->f.reloads, 0);
	bson_destroy(cmd);
}

/* Shards with filtering metadata (issue #17): count goes once to each shard with its shard
 * version (collectionVersion: the largest token; shardVersion: the largest of its chunks),
 * no per-chunk find; the shards' counts are summed. Without it (the tests above): the
 * shard-versioned request is refused at once and the per-chunk protocol runs, with no
 * StaleConfig retry counted. */
static void test_count_shard_version(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");
	bson_iter_t it;
	uint64_t before = sdb_counter_value(e->p.m_stale_retries);

	route_coll_unref(e->f.rc);
	e->f.rc = table(70, 3, 9);
	e->f.filtering = true;
	request(e, cmd, 5000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 5); /* the fake keeps a's orphan: 3 + 2 */
	assert_int_equal(e->f.nlog, 2);
	assert_int_equal(count_sent(e, "count", 'a'), 1);
	assert_int_equal(count_sent(e, "count", 'b'), 1);
	assert_true(bson_iter_init(&it, &e->f.log[0]) &&
		    bson_iter_find_descendant(&it, "$stripedbShardVersion.shardVersion", &it));
	assert_int_equal(bson_iter_as_int64(&it), e->f.log_shard[0] == 'a' ? 3 : 9);
	assert_true(bson_iter_init(&it, &e->f.log[0]) &&
		    bson_iter_find_descendant(&it, "$stripedbShardVersion.collectionVersion", &it));
	assert_int_equal(bson_iter_as_int64(&it), 9);
	assert_false(bson_has_field(&e->f.log[0], "$stripedbVersion"));
	assert_int_equal(sdb_counter_value(e->p.m_stale_retries), before);
	bson_destroy(cmd);
}

/* find merges the chunks' owned documents (k order) into one cursor batch. */
static void test_find_merged(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("find", "c", "sort", "{", "k", BCON_INT32(1), "}");
	bson_iter_t it, arr;
	int32_t ks[8];
	size_t n = 0;

	request(e, cmd, 5000);
	check_run(e, px_do_find(&e->c));
	assert_int_equal(e->ans.state, 1);
	assert_true(bson_iter_init(&it, e->ans.reply) &&
		    bson_iter_find_descendant(&it, "cursor.firstBatch", &it) &&
		    bson_iter_recurse(&it, &arr));
	while (bson_iter_next(&arr) && n < 8) {
		bson_iter_t d;
		assert_true(bson_iter_recurse(&arr, &d) && bson_iter_find(&d, "k"));
		ks[n++] = bson_iter_int32(&d);
	}
	assert_int_equal(n, 4);
	assert_int_equal(ks[0], 1);
	assert_int_equal(ks[1], 2);
	assert_int_equal(ks[2], 150);
	assert_int_equal(ks[3], 160);
	bson_destroy(cmd);
}

/* A retryable ordered insert across chunks: runs per chunk, each carrying lsid, txnNumber
 * and the ORIGINAL stmtIds of its documents (txn.h). */
static void test_insert_retryable_stmt_ids(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("insert", "c", "documents", "[", "{", "k", BCON_INT32(1), "}", "{",
			       "k", BCON_INT32(150), "}", "{", "k", BCON_INT32(2), "}", "]", "lsid",
			       "{", "id", BCON_INT32(42), "}", "txnNumber", BCON_INT64(5));
	int code = 0;
	char err[256];
	int32_t want[3] = {0, 1, 2};
	char want_shard[3] = {'a', 'b', 'a'};
	size_t i;

	request(e, cmd, 5000);
	assert_true(proxy_txn_parse(cmd, "documents", &e->c.txn, &code, err, sizeof err));
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(reply_int(e, "n"), 3);
	assert_int_equal(e->f.nlog, 3);
	for (i = 0; i < 3; i++) {
		bson_iter_t it;
		assert_int_equal(e->f.log_shard[i], want_shard[i]);
		assert_true(bson_iter_init_find(&it, &e->f.log[i], "txnNumber"));
		assert_int_equal(bson_iter_as_int64(&it), 5);
		assert_true(bson_has_field(&e->f.log[i], "lsid"));
		assert_true(bson_iter_init(&it, &e->f.log[i]) &&
			    bson_iter_find_descendant(&it, "stmtIds.0", &it));
		assert_int_equal(bson_iter_as_int64(&it), want[i]);
	}
	bson_destroy(cmd);
}

/* Unordered: only the documents of the refused chunk are sent again after the reload. */
static void test_insert_stale_resends_refused_part(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("insert", "c", "ordered", BCON_BOOL(false), "documents", "[", "{",
			       "k", BCON_INT32(1), "}", "{", "k", BCON_INT32(150), "}", "]");

	e->f.stale[1] = 1;
	e->f.next = table(8, 1, 2);
	request(e, cmd, 5000);
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(reply_int(e, "n"), 2);
	assert_int_equal(count_sent(e, "insert", 'a'), 1);
	assert_int_equal(count_sent(e, "insert", 'b'), 2);
	assert_int_equal(e->f.reloads, 1);
	bson_destroy(cmd);
}

/* A retryable write a shard did not answer: HostUnreachable labelled RetryableWriteError,
 * and not NoWritesPerformed (a's share was written). */
static void test_insert_net_error_labels(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("insert", "c", "documents", "[", "{", "k", BCON_INT32(1), "}", "{",
			       "k", BCON_INT32(150), "}", "]", "lsid", "{", "id", BCON_INT32(7),
			       "}", "txnNumber", BCON_INT64(1));
	int code = 0;
	char err[256];
	bson_iter_t it;
	bool retryable = false, nowrites = false;

	e->f.net_err_b = true;
	e->f.down[1] = true; /* one attempt (test_resend_budget_spent covers the budget) */
	request(e, cmd, 5000);
	assert_true(proxy_txn_parse(cmd, "documents", &e->c.txn, &code, err, sizeof err));
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(e->ans.state, 2);
	assert_int_equal(e->ans.code, WIRE_ERR_HOST_UNREACHABLE);
	assert_non_null(e->ans.extra);
	assert_true(bson_iter_init_find(&it, e->ans.extra, "errorLabels") &&
		    bson_iter_recurse(&it, &it));
	while (bson_iter_next(&it)) {
		retryable |= strcmp(bson_iter_utf8(&it, NULL), "RetryableWriteError") == 0;
		nowrites |= strcmp(bson_iter_utf8(&it, NULL), "NoWritesPerformed") == 0;
	}
	assert_true(retryable);
	assert_false(nowrites);
	bson_destroy(cmd);
}

/* findAndModify pinned to one chunk, refused until the budget is spent: the shard's reply
 * is the answer, once. */
static void test_find_and_modify_stale_exhausted(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("findAndModify", "c", "query", "{", "k", BCON_INT32(150), "}",
			       "update", "{", "$set", "{", "x", BCON_INT32(1), "}", "}");
	bson_iter_t it;

	e->f.always_stale = true;
	request(e, cmd, 0);
	/* fam_exhausted passes the shard's {ok: 0} refusal on as a reply: its code */
	assert_int_equal(px_do_find_and_modify(&e->c), ERR_STALE_CONFIG);
	assert_int_equal(e->ans.state, 1);
	assert_true(bson_iter_init_find(&it, e->ans.reply, "code"));
	assert_int_equal(bson_iter_as_int64(&it), ERR_STALE_CONFIG);
	assert_int_equal(count_sent(e, "findAndModify", 'b'), 1);
	assert_int_equal(count_sent(e, "findAndModify", 'a'), 0);
	bson_destroy(cmd);
}

/* findAndModify without the key: the first owned candidate by the sort across chunks, then
 * the command on {$and: [query, {_id}]} at that chunk; a null value (the candidate changed)
 * looks again, at most three attempts. */
static void test_find_and_modify_two_phase(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("findAndModify", "c", "query", "{", "}", "sort", "{", "k",
			       BCON_INT32(-1), "}", "remove", BCON_BOOL(true));

	request(e, cmd, 5000);
	check_run(e, px_do_find_and_modify(&e->c));
	assert_int_equal(e->ans.state, 1);
	/* the fake answers value: null every time: looked again 3 times, then its reply */
	assert_int_equal(count_sent(e, "findAndModify", 'b'), 4);
	assert_int_equal(count_sent(e, "findAndModify", 'a'), 0);
	assert_int_equal(count_sent(e, "find", 'a'), 4);
	assert_int_equal(count_sent(e, "find", 'b'), 4);
	bson_destroy(cmd);
}

/* An answer is recorded once; the dispatch table knows the routed commands. */
static void test_answer_and_table(void **state)
{
	env *e = *state;
	const px_cmd *fam = px_cmd_find("findandmodify");

	request(e, NULL, 0);
	assert_false(px_answered(&e->c));
	px_error(&e->c, WIRE_ERR_BAD_VALUE, "bad %d", 1);
	assert_true(px_answered(&e->c));
	assert_string_equal(e->ans.msg, "bad 1");
	assert_non_null(fam);
	assert_true(fam->flags & PXC_WRITE);
	assert_true(fam->flags & PXC_ONE_DOC);
	assert_int_equal(fam->policy, PXP_QUERY);
	assert_non_null(px_cmd_find("killCursors"));
	assert_true(px_cmd_find("killCursors")->flags & PXC_FREE);
	assert_null(px_cmd_find("mapReduce"));
	assert_null(px_cmd_find("FIND"));
}

/* The answer functions return the status of what they record; px_check_answer (run_job's
 * contract check) accepts a matching status and catches the others. */
static void test_status_contract(void **state)
{
	env *e = *state;
	bson_t *ok0 = BCON_NEW("ok", BCON_DOUBLE(0), "code", BCON_INT32(11000), "errmsg", "dup");

	request(e, NULL, 0);
	assert_int_equal(px_check_answer(0, &e->ans), PX_ANSWER_NONE);
	assert_int_equal(px_check_answer(2, &e->ans), PX_ANSWER_NONE);
	assert_int_equal(px_answer_status(&e->c), -1);
	assert_int_equal(px_error(&e->c, WIRE_ERR_BAD_VALUE, "bad"), WIRE_ERR_BAD_VALUE);
	assert_int_equal(px_check_answer(WIRE_ERR_BAD_VALUE, &e->ans), PX_ANSWER_OK);
	assert_int_equal(px_check_answer(0, &e->ans), PX_ANSWER_MISMATCH);
	assert_int_equal(px_check_answer(WIRE_ERR_FAILED_TO_PARSE, &e->ans), PX_ANSWER_MISMATCH);
	assert_int_equal(px_answer_status(&e->c), WIRE_ERR_BAD_VALUE);
	ans_reset(e);
	assert_int_equal(px_reply(&e->c, BCON_NEW("n", BCON_INT32(1))), 0);
	assert_int_equal(px_check_answer(0, &e->ans), PX_ANSWER_OK);
	assert_int_equal(px_check_answer(WIRE_ERR_BAD_VALUE, &e->ans), PX_ANSWER_MISMATCH);
	assert_int_equal(px_answer_status(&e->c), 0);
	ans_reset(e);
	/* a shard's {ok: 0} reply passed on as it is stands for its code */
	assert_int_equal(px_reply_copy(&e->c, ok0), 11000);
	assert_int_equal(e->ans.state, 1);
	assert_int_equal(px_check_answer(11000, &e->ans), PX_ANSWER_OK);
	assert_int_equal(px_check_answer(0, &e->ans), PX_ANSWER_MISMATCH);
	ans_reset(e);
	assert_int_equal(px_error_extra(&e->c, WIRE_ERR_HOST_UNREACHABLE, NULL, "down"),
			 WIRE_ERR_HOST_UNREACHABLE);
	assert_int_equal(px_check_answer(WIRE_ERR_HOST_UNREACHABLE, &e->ans), PX_ANSWER_OK);
	bson_destroy(ok0);
}

/* The errmsg and code of a reply document (static strings of doc). */
static const char *doc_msg(const bson_t *doc, int64_t *code)
{
	bson_iter_t it;

	*code = bson_iter_init_find(&it, doc, "code") ? bson_iter_as_int64(&it) : 0;
	return bson_iter_init_find(&it, doc, "errmsg") ? bson_iter_utf8(&it, NULL) : "";
}

/* px_answer_mask_state_change: a shard's state-change code (top-level, recorded as an
 * error or as a copied reply, or a writeConcernError's) becomes HostUnreachable with the
 * code in errmsg, a shard's topologyVersion is dropped, labels and other fields are
 * kept; other answers are left as they are. */
static void test_mask_state_change(void **state)
{
	(void)state;
	px_answer a;
	bson_iter_t it;
	int64_t code;

	/* an error recorded with a shard's code */
	memset(&a, 0, sizeof a);
	a.state = 2;
	a.code = WIRE_ERR_INTERRUPTED_REPL_CHANGE;
	a.msg = bson_strdup("stepped down");
	a.extra = BCON_NEW("errorLabels", "[", "RetryableWriteError", "]", "topologyVersion", "{",
			   "counter", BCON_INT64(3), "}");
	px_answer_mask_state_change(&a);
	assert_int_equal(a.code, WIRE_ERR_HOST_UNREACHABLE);
	assert_string_equal(a.msg, "InterruptedDueToReplStateChange (11602) from a shard: "
				   "stepped down");
	assert_true(bson_has_field(a.extra, "errorLabels"));
	assert_false(bson_has_field(a.extra, "topologyVersion"));
	px_answer_clear(&a);

	/* a shard's error reply copied */
	a.state = 1;
	a.reply = BCON_NEW("ok", BCON_DOUBLE(0), "errmsg", "not primary", "code", BCON_INT32(10107),
			   "codeName", "NotWritablePrimary", "topologyVersion", "{", "counter",
			   BCON_INT64(3), "}", "errorLabels", "[", "RetryableWriteError", "]");
	px_answer_mask_state_change(&a);
	assert_string_equal(doc_msg(a.reply, &code), "NotWritablePrimary (10107) from a shard: "
						     "not primary");
	assert_int_equal(code, WIRE_ERR_HOST_UNREACHABLE);
	assert_true(bson_iter_init_find(&it, a.reply, "codeName"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "HostUnreachable");
	assert_true(bson_has_field(a.reply, "errorLabels"));
	assert_false(bson_has_field(a.reply, "topologyVersion"));
	assert_int_equal(reply_status(a.reply), WIRE_ERR_HOST_UNREACHABLE);
	px_answer_clear(&a);

	/* a writeConcernError's code (the write ran) */
	a.state = 1;
	a.reply = BCON_NEW("n", BCON_INT32(1), "writeConcernError", "{", "code", BCON_INT32(189),
			   "codeName", "PrimarySteppedDown", "errmsg", "e", "errInfo", "{", "x",
			   BCON_INT32(1), "}", "}", "ok", BCON_DOUBLE(1));
	px_answer_mask_state_change(&a);
	assert_true(bson_iter_init_find(&it, a.reply, "writeConcernError"));
	{
		const uint8_t *d;
		uint32_t n;
		bson_t wce;
		bson_iter_document(&it, &n, &d);
		assert_true(bson_init_static(&wce, d, n));
		assert_string_equal(doc_msg(&wce, &code), "PrimarySteppedDown (189) from a shard: e");
		assert_int_equal(code, WIRE_ERR_HOST_UNREACHABLE);
		assert_true(bson_has_field(&wce, "errInfo"));
	}
	assert_int_equal(px_get_int(a.reply, "n", 0), 1);
	assert_int_equal(reply_status(a.reply), 0);
	px_answer_clear(&a);

	/* a writeErrors entry's code (a multi-shard write: a shard's error for its batch
	 * becomes its statements' write errors; pymongo 3.11 clears the pool of the server
	 * whose answer has one, whatever the SDAM spec says); other entries as they are */
	a.state = 1;
	a.reply = BCON_NEW("n", BCON_INT32(1), "writeErrors", "[", "{", "index", BCON_INT64(0),
			   "code", BCON_INT32(11602), "codeName", "InterruptedDueToReplStateChange",
			   "errmsg", "x", "}", "{", "index", BCON_INT64(1), "code", BCON_INT32(11000),
			   "errmsg", "dup", "}", "]", "ok", BCON_DOUBLE(1));
	px_answer_mask_state_change(&a);
	{
		bson_iter_t arr, e;
		const uint8_t *d;
		uint32_t n;
		bson_t doc;
		assert_true(bson_iter_init_find(&it, a.reply, "writeErrors"));
		assert_true(BSON_ITER_HOLDS_ARRAY(&it));
		assert_true(bson_iter_recurse(&it, &arr));
		assert_true(bson_iter_next(&arr));
		bson_iter_document(&arr, &n, &d);
		assert_true(bson_init_static(&doc, d, n));
		assert_string_equal(doc_msg(&doc, &code),
				    "InterruptedDueToReplStateChange (11602) from a shard: x");
		assert_int_equal(code, WIRE_ERR_HOST_UNREACHABLE);
		assert_true(bson_iter_init_find(&e, &doc, "index"));
		assert_int_equal(bson_iter_as_int64(&e), 0);
		assert_true(bson_iter_next(&arr));
		bson_iter_document(&arr, &n, &d);
		assert_true(bson_init_static(&doc, d, n));
		assert_string_equal(doc_msg(&doc, &code), "dup");
		assert_int_equal(code, 11000);
		assert_false(bson_iter_next(&arr));
	}
	assert_int_equal(px_get_int(a.reply, "n", 0), 1);
	px_answer_clear(&a);

	/* left alone: another error, a success, and the proxy's own errors */
	a.state = 1;
	a.reply = BCON_NEW("ok", BCON_DOUBLE(0), "code", BCON_INT32(11000), "errmsg", "dup");
	bson_t *before = a.reply;
	px_answer_mask_state_change(&a);
	assert_ptr_equal(a.reply, before);
	px_answer_clear(&a);
	a.state = 2;
	a.code = WIRE_ERR_BAD_VALUE;
	a.msg = bson_strdup("bad");
	px_answer_mask_state_change(&a);
	assert_int_equal(a.code, WIRE_ERR_BAD_VALUE);
	assert_string_equal(a.msg, "bad");
	px_answer_clear(&a);
}

/* px_config_db: not the config database, or getMore there: not done, nothing answered;
 * a write on config: done, IllegalOperation (20) returned and recorded. */
static void test_config_db_tristate(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("insert", "c");
	bool done = true;

	request(e, cmd, 5000);
	assert_int_equal(px_config_db(&e->c, px_cmd_find("insert"), &done), 0);
	assert_false(done);
	assert_false(px_answered(&e->c));
	e->c.db = "config";
	assert_int_equal(px_config_db(&e->c, px_cmd_find("getMore"), &done), 0);
	assert_false(done);
	assert_false(px_answered(&e->c));
	assert_int_equal(px_config_db(&e->c, px_cmd_find("insert"), &done), 20);
	assert_true(done);
	assert_int_equal(e->ans.state, 2);
	assert_int_equal(e->ans.code, 20);
	bson_destroy(cmd);
}

/* A handler refusing a bad argument returns the code of the one error it recorded. */
static void test_handler_status_is_error_code(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("find", "c", "skip", BCON_INT32(-1));
	int st;

	request(e, cmd, 5000);
	st = px_do_find(&e->c);
	assert_int_equal(e->ans.state, 2);
	assert_int_not_equal(st, 0);
	assert_int_equal(st, e->ans.code);
	assert_int_equal(e->f.nlog, 0); /* refused before any shard was asked */
	bson_destroy(cmd);
}

/* Helpers that fail return the code of the one error they recorded. */
static void test_helper_failure_status(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("find", "c", "limit", "x");
	route_coll *rc = (route_coll *)1;
	int64_t v = 7;

	/* metadata unreachable, nothing cached: HostUnreachable, *out NULL */
	request(e, cmd, 5000);
	e->f.route_down = true;
	assert_int_equal(px_route_or_fail(&e->c, &rc), WIRE_ERR_HOST_UNREACHABLE);
	assert_null(rc);
	assert_int_equal(e->ans.state, 2);
	assert_int_equal(e->ans.code, WIRE_ERR_HOST_UNREACHABLE);
	/* px_route_sharded: the same status, nothing forwarded */
	ans_reset(e);
	rc = (route_coll *)1;
	assert_int_equal(px_route_sharded(&e->c, PX_FWD_PLAIN, 0, false, &rc),
			 WIRE_ERR_HOST_UNREACHABLE);
	assert_null(rc);
	assert_int_equal(e->f.nlog, 0);
	e->f.route_down = false;
	/* a bad client argument: its error code, recorded once */
	ans_reset(e);
	assert_int_equal(px_client_int(&e->c, "skip", 0, INT64_MAX, 3, &v), 0);
	assert_int_equal(v, 3); /* absent: the default, nothing answered */
	assert_false(px_answered(&e->c));
	{
		int st = px_client_int(&e->c, "limit", 0, INT64_MAX, 0, &v);
		assert_int_not_equal(st, 0);
		assert_int_equal(e->ans.state, 2);
		assert_int_equal(st, e->ans.code);
	}
	bson_destroy(cmd);
}

/* ---------- single-shard transactions (txnroute.c, issue #16) ---------- */

static const uint8_t LSID_UUID[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* Forget the previous answer before the next statement of a test. */
static void ans_reset(env *e)
{
	px_answer_clear(&e->ans);
}

/* A transaction statement: cmd + lsid, txnNumber txn, autocommit: false (and
 * startTransaction: true + readConcern snapshot when start). */
static bson_t *txn_cmd(bson_t *cmd, int64_t txn, bool start)
{
	bson_t l;

	bson_append_document_begin(cmd, "lsid", -1, &l);
	BSON_APPEND_BINARY(&l, "id", BSON_SUBTYPE_UUID, LSID_UUID, 16);
	bson_append_document_end(cmd, &l);
	BSON_APPEND_INT64(cmd, "txnNumber", txn);
	BSON_APPEND_BOOL(cmd, "autocommit", false);
	if (start) {
		bson_t rc;
		BSON_APPEND_BOOL(cmd, "startTransaction", true);
		bson_append_document_begin(cmd, "readConcern", -1, &rc);
		BSON_APPEND_UTF8(&rc, "level", "snapshot");
		bson_append_document_end(cmd, &rc);
	}
	return cmd;
}

/* Run one statement as run_job does (begin, handler with its contract checked, end) in
 * db. */
static void run_stmt(env *e, const bson_t *cmd, const char *db, int (*handler)(ctx *))
{
	pxtxn_stmt st;
	int status;

	ans_reset(e);
	request(e, cmd, 5000);
	e->c.db = db;
	status = pxtxn_begin(&e->c, &st);
	if (status == 0) {
		status = handler(&e->c);
		assert_int_equal(px_check_answer(status, &e->ans), PX_ANSWER_OK);
		pxtxn_end(&e->c);
	} else { /* refused: exactly the error recorded */
		assert_int_equal(e->ans.state, 2);
		assert_int_equal(status, e->ans.code);
	}
}

static int64_t ans_code(const env *e)
{
	assert_int_equal(e->ans.state, 2);
	return e->ans.code;
}

static bool ans_has_label(const env *e, const char *label)
{
	bson_iter_t it, a;

	if (e->ans.extra == NULL || !bson_iter_init_find(&it, e->ans.extra, "errorLabels") ||
	    !bson_iter_recurse(&it, &a))
		return false;
	while (bson_iter_next(&a))
		if (strcmp(bson_iter_utf8(&a, NULL), label) == 0)
			return true;
	return false;
}

static void insert_k(env *e, int k, int64_t txn, bool start)
{
	bson_t *cmd = BCON_NEW("insert", "c", "documents", "[", "{", "k", BCON_INT32(k), "}", "]");

	run_stmt(e, txn_cmd(cmd, txn, start), "db", px_do_insert);
	bson_destroy(cmd);
}

/* commitTransaction / abortTransaction of txn on admin, with a recoveryToken naming shard
 * when it is not NULL. */
static void finish_txn(env *e, bool commit, int64_t txn, const char *shard)
{
	bson_t *cmd = BCON_NEW(commit ? "commitTransaction" : "abortTransaction", BCON_INT32(1));

	if (shard)
		BCON_APPEND(cmd, "recoveryToken", "{", "recoveryShardId", shard, "}");
	/* as run_job: commit and abort check the session out themselves (PXC_TXN_END) */
	ans_reset(e);
	request(e, txn_cmd(cmd, txn, false), 5000);
	e->c.db = "admin";
	check_run(e, (commit ? pxtxn_do_commit : pxtxn_do_abort)(&e->c));
	bson_destroy(cmd);
}

/* The first statement pins its shard and carries startTransaction + readConcern; the
 * next ones lsid/txnNumber/autocommit only (no stmtIds); replies carry recoveryToken; the
 * commit goes to the pinned shard. */
static void test_txn_pin_and_commit(void **state)
{
	env *e = *state;
	bson_iter_t it;

	insert_k(e, 1, 3, true);
	assert_int_equal(reply_int(e, "n"), 1);
	assert_true(bson_iter_init(&it, e->ans.reply) &&
		    bson_iter_find_descendant(&it, "recoveryToken.recoveryShardId", &it));
	assert_string_equal(bson_iter_utf8(&it, NULL), "a");
	insert_k(e, 2, 3, false);
	assert_int_equal(reply_int(e, "n"), 1);
	assert_int_equal(e->f.nlog, 2);
	assert_int_equal(e->f.log_shard[0], 'a');
	assert_true(px_get_bool(&e->f.log[0], "startTransaction", false));
	assert_true(bson_has_field(&e->f.log[0], "readConcern"));
	assert_false(bson_has_field(&e->f.log[1], "startTransaction"));
	assert_false(bson_has_field(&e->f.log[1], "readConcern"));
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(px_get_int(&e->f.log[i], "txnNumber", -1), 3);
		assert_true(bson_has_field(&e->f.log[i], "lsid"));
		assert_true(bson_has_field(&e->f.log[i], "autocommit"));
		assert_false(px_get_bool(&e->f.log[i], "autocommit", true));
		assert_false(bson_has_field(&e->f.log[i], "stmtIds"));
		assert_true(bson_has_field(&e->f.log[i], "$stripedbVersion"));
	}
	finish_txn(e, true, 3, NULL);
	assert_int_equal(e->ans.state, 1);
	assert_int_equal(count_sent(e, "commitTransaction", 'a'), 1);
	assert_int_equal(px_get_int(&e->f.log[2], "txnNumber", -1), 3);
	/* a statement after the commit: TransactionCommitted */
	insert_k(e, 1, 3, false);
	assert_int_equal(ans_code(e), PXTXN_ERR_TXN_COMMITTED);
	assert_int_equal(e->f.nlog, 3);
}

/* A statement for the second shard: 263, never sent there, the transaction aborted on the
 * first shard; the next statement is NoSuchTransaction with TransientTransactionError. */
static void test_txn_second_shard_refused(void **state)
{
	env *e = *state;

	insert_k(e, 1, 4, true);
	insert_k(e, 150, 4, false);
	assert_int_equal(ans_code(e), PXTXN_ERR_NOT_IN_TXN);
	assert_non_null(strstr(e->ans.msg, "second shard"));
	assert_int_equal(count_sent(e, "insert", 'b'), 0);
	assert_int_equal(count_sent(e, "abortTransaction", 'a'), 1);
	insert_k(e, 2, 4, false);
	assert_int_equal(ans_code(e), PXTXN_ERR_NO_SUCH_TXN);
	assert_true(ans_has_label(e, "TransientTransactionError"));
	finish_txn(e, true, 4, NULL);
	assert_int_equal(ans_code(e), PXTXN_ERR_NO_SUCH_TXN);
	assert_int_equal(count_sent(e, "commitTransaction", 'a'), 0);
	/* a new transaction on the session starts clean */
	insert_k(e, 150, 5, true);
	assert_int_equal(reply_int(e, "n"), 1);
	assert_int_equal(count_sent(e, "startTransaction", 'b'), 1);
}

/* A scatter first statement (count over both shards): the first shard is pinned, the
 * second refused: 263. */
static void test_txn_scatter_refused(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");

	run_stmt(e, txn_cmd(cmd, 1, true), "db", px_do_count);
	assert_int_equal(ans_code(e), PXTXN_ERR_NOT_IN_TXN);
	assert_int_equal(count_sent(e, "count", 'b'), 0);
	assert_int_equal(count_sent(e, "abortTransaction", 'a'), 1);
	bson_destroy(cmd);
}

/* StaleConfig inside a transaction: not retried by the proxy; StaleConfig with
 * TransientTransactionError, the transaction aborted. */
static void test_txn_stale_not_retried(void **state)
{
	env *e = *state;

	e->f.stale[0] = 1;
	insert_k(e, 1, 1, true);
	assert_int_equal(ans_code(e), ERR_STALE_CONFIG);
	assert_true(ans_has_label(e, "TransientTransactionError"));
	assert_int_equal(count_sent(e, "insert", 'a'), 1);
	assert_int_equal(count_sent(e, "abortTransaction", 'a'), 1);
}

/* A network error on a statement: HostUnreachable + TransientTransactionError. */
static void test_txn_net_error(void **state)
{
	env *e = *state;

	e->f.net_err_b = true;
	e->f.down[1] = true;
	insert_k(e, 150, 1, true);
	assert_int_equal(ans_code(e), WIRE_ERR_HOST_UNREACHABLE);
	assert_true(ans_has_label(e, "TransientTransactionError"));
	assert_false(ans_has_label(e, "RetryableWriteError"));
}

/* Session rules: continuing an unknown transaction, an older txnNumber, restarting one. */
static void test_txn_session_rules(void **state)
{
	env *e = *state;

	insert_k(e, 1, 7, false);
	assert_int_equal(ans_code(e), PXTXN_ERR_NO_SUCH_TXN);
	assert_true(ans_has_label(e, "TransientTransactionError"));
	assert_int_equal(e->f.nlog, 0);
	insert_k(e, 1, 7, true);
	assert_int_equal(e->ans.state, 1);
	insert_k(e, 1, 7, true);
	assert_int_equal(ans_code(e), PXTXN_ERR_RESTART);
	insert_k(e, 1, 6, true);
	assert_int_equal(ans_code(e), WIRE_ERR_TRANSACTION_TOO_OLD);
	assert_int_equal(pxtxn_table_size(e->p.txns), 1);
}

/* commit on a proxy that does not know the session: the recoveryToken's shard; a network
 * error there: UnknownTransactionCommitResult. abort without participant: 251. */
static void test_txn_commit_recovery(void **state)
{
	env *e = *state;

	finish_txn(e, true, 9, "a");
	assert_int_equal(e->ans.state, 1);
	assert_int_equal(count_sent(e, "commitTransaction", 'a'), 1);
	finish_txn(e, true, 10, NULL);
	assert_int_equal(ans_code(e), PXTXN_ERR_NO_SUCH_TXN);
	e->f.net_err_b = true;
	e->f.down[1] = true;
	finish_txn(e, true, 11, "b");
	assert_int_equal(ans_code(e), WIRE_ERR_HOST_UNREACHABLE);
	assert_true(ans_has_label(e, "UnknownTransactionCommitResult"));
	finish_txn(e, false, 12, NULL);
	assert_int_equal(ans_code(e), PXTXN_ERR_NO_SUCH_TXN);
}

/* The command table routes commit/abort only when transactions are on. */
static void test_txn_table(void **state)
{
	(void)state;
	assert_non_null(px_cmd_find("commitTransaction"));
	assert_true(px_cmd_find("abortTransaction")->flags & PXC_TXN_END);
}

/* ---- px_shard_call: resending what a shard did not execute (the one retry path) ---- */

/* b restarting: its part of a count never reached it twice, then it answers; one answer,
 * two resends counted, nothing refreshed (not StaleConfig). */
static void test_resend_until_answered(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("count", "c");
	uint64_t before = sdb_counter_value(e->p.m_shard_retries);

	e->f.unsent_b = 2;
	request(e, cmd, 60000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 4);
	assert_int_equal(count_sent(e, "count", 'b') + count_sent(e, "find", 'b'), 3);
	assert_int_equal(sdb_counter_value(e->p.m_shard_retries), before + 2);
	assert_int_equal(e->f.reloads, 0);
	assert_false(e->f.down[1]);
	bson_destroy(cmd);
}

/* The request's budget already spent (the StaleConfig loop and the resends draw on one
 * deadline): b gets one attempt, the write is answered HostUnreachable with
 * RetryableWriteError (certainly not executed), and b is marked down: the next request,
 * with a whole budget, gets one attempt there too; once b answers it is up again. */
static void test_resend_budget_spent(void **state)
{
	env *e = *state;
	bson_t *cmd = BCON_NEW("insert", "c", "documents", "[", "{", "k", BCON_INT32(150), "}",
			       "]");
	bson_t *count = BCON_NEW("count", "c");
	uint64_t before = sdb_counter_value(e->p.m_shard_retries);

	e->f.net_err_b = true;
	request(e, cmd, 0);
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(ans_code(e), WIRE_ERR_HOST_UNREACHABLE);
	assert_true(ans_has_label(e, "RetryableWriteError"));
	assert_int_equal(count_sent(e, "insert", 'b'), 1);
	assert_true(e->f.down[1]);
	ans_reset(e);
	request(e, cmd, 60000);
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(ans_code(e), WIRE_ERR_HOST_UNREACHABLE);
	assert_int_equal(count_sent(e, "insert", 'b'), 2);
	assert_int_equal(sdb_counter_value(e->p.m_shard_retries), before);
	e->f.net_err_b = false;
	ans_reset(e);
	request(e, count, 60000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 4);
	assert_false(e->f.down[1]);
	bson_destroy(count);
	bson_destroy(cmd);
}

/* An unknown outcome (sent, then the connection failed): a write without a session is
 * never sent again (it may have run: HostUnreachable, no retry label); a read is. */
static void test_unknown_outcome_resends_reads_only(void **state)
{
	env *e = *state;
	bson_t *ins = BCON_NEW("insert", "c", "documents", "[", "{", "k", BCON_INT32(150), "}",
			       "]");
	bson_t *count = BCON_NEW("count", "c");
	bson_iter_t it;

	e->f.unknown_b = 1;
	request(e, ins, 60000);
	check_run(e, px_do_insert(&e->c));
	assert_int_equal(e->ans.state, 1); /* answered with the write error of the document */
	assert_true(bson_iter_init_find(&it, e->ans.reply, "writeErrors") &&
		    bson_iter_recurse(&it, &it) && bson_iter_next(&it) &&
		    bson_iter_recurse(&it, &it) && bson_iter_find(&it, "code"));
	assert_int_equal(bson_iter_as_int64(&it), WIRE_ERR_HOST_UNREACHABLE);
	assert_true(e->ans.extra == NULL || !bson_has_field(e->ans.extra, "errorLabels"));
	assert_int_equal(count_sent(e, "insert", 'b'), 1);
	ans_reset(e);
	e->f.unknown_b = 1;
	request(e, count, 60000);
	check_run(e, px_do_count(&e->c));
	assert_int_equal(reply_int(e, "n"), 4);
	assert_int_equal(count_sent(e, "count", 'b') + count_sent(e, "find", 'b'), 2);
	bson_destroy(count);
	bson_destroy(ins);
}

/* Shard versions and the request bound of a fan-out read the snapshot's per-shard summary
 * (shardver.c): chunks on a, b, a, b with tokens 1, 4, 2, 3. */
static void test_stream_bound(void **state)
{
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	bson_t *t = BCON_NEW(
		"routingVersion", BCON_INT64(3), "chunks", "[",
		"{", "id", BCON_INT64(1), "ns", "db.sb", "min", "{", "k", BCON_MINKEY, "}", "max",
		"{", "k", BCON_INT32(10), "}", "shard", "a", "token", BCON_INT64(1), "}",
		"{", "id", BCON_INT64(2), "ns", "db.sb", "min", "{", "k", BCON_INT32(10), "}", "max",
		"{", "k", BCON_INT32(20), "}", "shard", "b", "token", BCON_INT64(4), "}",
		"{", "id", BCON_INT64(3), "ns", "db.sb", "min", "{", "k", BCON_INT32(20), "}", "max",
		"{", "k", BCON_INT32(30), "}", "shard", "a", "token", BCON_INT64(2), "}",
		"{", "id", BCON_INT64(4), "ns", "db.sb", "min", "{", "k", BCON_INT32(30), "}", "max",
		"{", "k", BCON_MAXKEY, "}", "shard", "b", "token", BCON_INT64(3), "}", "]");
	bson_t *nometa = BCON_NEW("ok", BCON_INT32(0), "vWanted", BCON_NULL);
	route_coll *rc = NULL;
	char err[128];
	bool sel[4] = {true, true, true, true}, one[4] = {false, false, true, false};
	int64_t cver, sver;
	px_mode_memo m1, m2;
	ssize_t slot;

	(void)state;
	assert_int_equal(route_coll_build("db.sb", key, t, &rc, err, sizeof err), 0);
	px_shard_version_of(rc, "a", &cver, &sver);
	assert_int_equal(cver, 4);
	assert_int_equal(sver, 2);
	px_shard_version_of(rc, "b", &cver, &sver);
	assert_int_equal(sver, 4);
	px_shard_version_of(rc, "zz", &cver, &sver);
	assert_int_equal(sver, 0);

	/* both shards in shard mode: one request each; per chunk (a transaction): 4; one chunk
	 * of a selected: 1 */
	memset(&m1, 0, sizeof m1);
	assert_int_equal(px_stream_bound(&m1, rc, sel, false), 2);
	assert_int_equal(px_stream_bound(&m1, rc, sel, true), 4);
	assert_int_equal(px_stream_bound(&m1, rc, one, false), 1);
	assert_true(px_shard_mode_memo(&m1, rc, 3, &slot));
	assert_int_equal(slot, 1);

	/* b answers it has no filtering metadata: per chunk there (2) + a once (1). The memo
	 * filled before keeps its answer (the caller's fan-out stays within its bound). */
	assert_true(px_shard_mode_note(rc, "b", nometa));
	memset(&m2, 0, sizeof m2);
	assert_int_equal(px_stream_bound(&m2, rc, sel, false), 3);
	assert_false(px_shard_mode_memo(&m2, rc, 1, &slot));
	assert_true(px_shard_mode_memo(&m1, rc, 1, &slot));

	route_coll_unref(rc);
	bson_destroy(nometa);
	bson_destroy(t);
	bson_destroy(key);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_bound),
		cmocka_unit_test(test_mask_state_change),
		cmocka_unit_test_setup_teardown(test_count_owned, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resend_until_answered, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resend_budget_spent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unknown_outcome_resends_reads_only, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_count_stale_retried, setup, teardown),
		cmocka_unit_test_setup_teardown(test_count_stale_exhausted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_merged, setup, teardown),
		cmocka_unit_test_setup_teardown(test_count_shard_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_insert_retryable_stmt_ids, setup, teardown),
		cmocka_unit_test_setup_teardown(test_insert_stale_resends_refused_part, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_insert_net_error_labels, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_and_modify_stale_exhausted, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_find_and_modify_two_phase, setup, teardown),
		cmocka_unit_test_setup_teardown(test_answer_and_table, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_pin_and_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_second_shard_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_scatter_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_stale_not_retried, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_net_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_session_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_commit_recovery, setup, teardown),
		cmocka_unit_test_setup_teardown(test_txn_table, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_contract, setup, teardown),
		cmocka_unit_test_setup_teardown(test_handler_status_is_error_code, setup, teardown),
		cmocka_unit_test_setup_teardown(test_config_db_tristate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_helper_failure_status, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
