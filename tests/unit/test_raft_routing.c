/* Unit tests of incremental routing (issue #26): getRoutingTable diffs and cursors of
 * the metadata state machine (raft/routing.c), and the proxy's routing cache applying
 * them (routing/route.c route_update_*). The state machine is applied directly (no raft).
 *
 * The central check: after every routing change of a random sequence (splits, merges,
 * moves, drops and re-creations), the snapshot a client builds by applying diffs to its
 * previous snapshot equals the snapshot built from a full load, chunk for chunk. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/routing.c"
#include "../../src/routing/route.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "routing/route.h"
#include "raft/fsm.h"

typedef struct t {
	sdb_fsm *f;
	uint64_t index;
} t;

static int setup(void **state)
{
	t *x = calloc(1, sizeof *x);
	char err[256];
	assert_int_equal(sdb_fsm_open(":memory:", &x->f, err, sizeof err), 0);
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	t *x = *state;
	sdb_fsm_close(x->f);
	free(x);
	return 0;
}

static bson_t *json(const char *s)
{
	bson_error_t e;
	bson_t *b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (!b)
		fail_msg("bad json %s: %s", s, e.message);
	return b;
}

/* Apply op with args (json); returns the result (caller destroys). */
static bson_t *apply(t *x, const char *op, const char *args)
{
	bson_t *a = json(args), cmd = BSON_INITIALIZER, *res = bson_new();
	BSON_APPEND_UTF8(&cmd, "op", op);
	BSON_APPEND_INT64(&cmd, "ts", 1000);
	BSON_APPEND_DOCUMENT(&cmd, "args", a);
	assert_int_equal(sdb_fsm_apply_doc(x->f, ++x->index, &cmd, res), 0);
	bson_destroy(&cmd);
	bson_destroy(a);
	return res;
}

static int64_t int_of(const bson_t *r, const char *key)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, r, key))
		fail_msg("no field %s in %s", key, bson_as_relaxed_extended_json(r, NULL));
	return bson_iter_as_int64(&it);
}

static bool bool_of(const bson_t *r, const char *key)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, r, key) && bson_iter_as_bool(&it);
}

static void ok(t *x, const char *op, const char *args)
{
	bson_t *r = apply(x, op, args);
	if (int_of(r, "ok") != 1)
		fail_msg("%s %s: %s", op, args, bson_as_relaxed_extended_json(r, NULL));
	bson_destroy(r);
}

static int count_array(const bson_t *r, const char *key)
{
	bson_iter_t it, sub;
	int n = 0;
	if (!bson_iter_init_find(&it, r, key) || !bson_iter_recurse(&it, &sub))
		return -1;
	while (bson_iter_next(&sub))
		n++;
	return n;
}

/* The query; its status in *rc when rc is given, else it must succeed. */
static bson_t *query_rc(t *x, const char *cmdjson, int *rc)
{
	bson_t *cmd = json(cmdjson), *rep = bson_new();
	char err[256];
	int r = sdb_fsm_query(x->f, "getRoutingTable", cmd, rep, err, sizeof err);
	if (rc)
		*rc = r;
	else if (r != 0)
		fail_msg("%s: %s", cmdjson, err);
	bson_destroy(cmd);
	return rep;
}

static bson_t *query(t *x, const char *cmdjson)
{
	return query_rc(x, cmdjson, NULL);
}

static void base(t *x)
{
	ok(x, "addShard", "{\"id\": \"a\", \"uri\": \"mongodb://a\"}");
	ok(x, "addShard", "{\"id\": \"b\", \"uri\": \"mongodb://b\"}");
	ok(x, "createDatabase", "{\"name\": \"app\"}");
}

/* Does the removed array hold chunk id (or the collection when id < 0)? */
static bool removed_has(const bson_t *r, int64_t id)
{
	bson_iter_t it, arr, f;
	if (!bson_iter_init_find(&it, r, "removed") || !bson_iter_recurse(&it, &arr))
		return false;
	while (bson_iter_next(&arr)) {
		bson_iter_recurse(&arr, &f);
		if (id < 0 && bson_iter_find(&f, "collection"))
			return true;
		bson_iter_recurse(&arr, &f);
		if (id >= 0 && bson_iter_find(&f, "id") && bson_iter_as_int64(&f) == id)
			return true;
	}
	return false;
}

static void test_diff_and_tombstones(void **state)
{
	t *x = *state;
	bson_t *r;
	base(x);
	ok(x, "shardCollection", "{\"ns\": \"app.u\", \"key\": {\"k\": 1}, \"splitPoints\": "
				 "[{\"k\": 100}, {\"k\": 200}]}"); /* v1: chunks 1, 2, 3 */
	ok(x, "shardCollection", "{\"ns\": \"app.o\", \"key\": {\"k\": 1}}"); /* v2: chunk 4 */
	ok(x, "splitChunk", "{\"id\": 2, \"at\": {\"k\": 150}}");             /* v3: 2, new 5 */
	ok(x, "mergeChunks", "{\"ids\": [2, 5]}");                            /* v4: 2, 5 gone */
	ok(x, "setChunkShard", "{\"id\": 1, \"shard\": \"b\"}");              /* v5: 1 */
	assert_int_equal(sdb_fsm_routing_version(x->f), 5);

	/* one collection since v2: chunks 1 and 2 in their current state, 5 removed */
	r = query(x, "{\"getRoutingTable\": \"app.u\", \"sinceVersion\": 2}");
	assert_false(bool_of(r, "full"));
	assert_true(bool_of(r, "changed"));
	assert_int_equal(count_array(r, "chunks"), 2);
	assert_true(removed_has(r, 5));
	assert_int_equal(count_array(r, "removed"), 1);
	bson_destroy(r);
	/* since v4: only the move */
	r = query(x, "{\"getRoutingTable\": \"app.u\", \"sinceVersion\": 4}");
	assert_int_equal(count_array(r, "chunks"), 1);
	assert_int_equal(count_array(r, "removed"), 0);
	bson_destroy(r);
	/* the other collection did not change after v2 */
	r = query(x, "{\"getRoutingTable\": \"app.o\", \"sinceVersion\": 2}");
	assert_int_equal(count_array(r, "chunks"), 0);
	bson_destroy(r);
	/* all since v1: chunk 4 (v2), 2 (v4), 1 (v5); collections name both */
	r = query(x, "{\"getRoutingTable\": \"all\", \"sinceVersion\": 1}");
	assert_int_equal(count_array(r, "chunks"), 3);
	assert_int_equal(count_array(r, "collections"), 2);
	assert_true(removed_has(r, 5));
	bson_destroy(r);
	/* no sinceVersion, or 0: a full load */
	r = query(x, "{\"getRoutingTable\": \"app.u\", \"sinceVersion\": 0}");
	assert_true(bool_of(r, "full"));
	assert_int_equal(count_array(r, "chunks"), 3);
	bson_destroy(r);
	/* the long poll's list of changed namespaces */
	r = bson_new();
	assert_int_equal(sdb_fsm_routing_changed(x->f, 4, r), 0);
	assert_int_equal(count_array(r, "namespaces"), 1);
	assert_false(bool_of(r, "namespacesAll"));
	bson_destroy(r);
	r = bson_new();
	assert_int_equal(sdb_fsm_routing_changed(x->f, 1, r), 0);
	assert_int_equal(count_array(r, "namespaces"), 2);
	bson_destroy(r);

	/* a dropped collection: one tombstone for the whole collection */
	ok(x, "dropCollection", "{\"ns\": \"app.u\"}"); /* v6 */
	r = query(x, "{\"getRoutingTable\": \"all\", \"sinceVersion\": 5}");
	assert_int_equal(count_array(r, "chunks"), 0);
	assert_true(removed_has(r, -1));
	bson_destroy(r);
	/* dropDatabase: one tombstone per collection */
	ok(x, "dropDatabase", "{\"name\": \"app\"}"); /* v7 */
	r = query(x, "{\"getRoutingTable\": \"all\", \"sinceVersion\": 6}");
	assert_int_equal(count_array(r, "removed"), 1);
	assert_true(removed_has(r, -1));
	bson_destroy(r);
}

/* Follow a cursor to the end; returns the number of chunks, *batches the round trips. */
static int follow(t *x, const char *ns, int64_t since, int batch, int *batches)
{
	char buf[512], resume[128] = "";
	int total = 0;
	*batches = 0;
	for (;;) {
		bson_t *r;
		bson_iter_t it, sub;
		if (since >= 0)
			snprintf(buf, sizeof buf,
				 "{\"getRoutingTable\": \"%s\", \"sinceVersion\": %lld, \"cursor\": "
				 "{\"batchSize\": %d}%s}",
				 ns, (long long)since, batch, resume);
		else
			snprintf(buf, sizeof buf,
				 "{\"getRoutingTable\": \"%s\", \"cursor\": {\"batchSize\": %d}%s}", ns,
				 batch, resume);
		r = query(x, buf);
		(*batches)++;
		total += count_array(r, "chunks");
		if (!bool_of(r, "more")) {
			bson_destroy(r);
			return total;
		}
		assert_true(bson_iter_init_find(&it, r, "resumeAfter"));
		bson_iter_recurse(&it, &sub);
		bson_iter_find(&sub, "version");
		int64_t v = bson_iter_as_int64(&sub);
		bson_iter_recurse(&it, &sub);
		bson_iter_find(&sub, "id");
		snprintf(resume, sizeof resume, ", \"resumeAfter\": {\"version\": %lld, \"id\": %lld}",
			 (long long)v, (long long)bson_iter_as_int64(&sub));
		bson_destroy(r);
	}
}

static void test_cursor_and_large_tables(void **state)
{
	t *x = *state;
	bson_t *r;
	int rc, batches;
	base(x);
	/* more than the old fixed cap of 100,000, in one command */
	r = apply(x, "shardCollection",
		  "{\"ns\": \"app.h\", \"key\": {\"k\": \"hashed\"}, \"numChunks\": 150000}");
	assert_int_equal(int_of(r, "ok"), 1);
	assert_int_equal(int_of(r, "chunks"), 150000);
	bson_destroy(r);
	ok(x, "shardCollection", "{\"ns\": \"app.s\", \"key\": {\"k\": 1}, \"splitPoints\": "
				 "[{\"k\": 1}, {\"k\": 2}, {\"k\": 3}, {\"k\": 4}]}");
	/* too large for one reply without a cursor: a clear error, not a truncated table */
	r = query_rc(x, "{\"getRoutingTable\": \"all\"}", &rc);
	assert_int_equal(rc, SDB_ETOOBIG);
	bson_destroy(r);
	/* by cursor: every chunk, in batches of at most 8 MB */
	assert_int_equal(follow(x, "all", -1, 1000000, &batches), 150005);
	assert_true(batches >= 2);
	assert_int_equal(follow(x, "app.s", -1, 2, &batches), 5);
	assert_int_equal(batches, 3);
	/* a diff by cursor: the split changes chunk 150001 and creates 150006 */
	ok(x, "splitChunk", "{\"id\": 150002, \"at\": {\"k\": 1.5}}");
	ok(x, "setChunkShard", "{\"id\": 150004, \"shard\": \"b\"}");
	assert_int_equal(follow(x, "app.s", 2, 1, &batches), 3);
	assert_int_equal(batches, 3);
	assert_int_equal(follow(x, "all", 2, 2, &batches), 3);
	/* since the split: only the move */
	r = query(x, "{\"getRoutingTable\": \"app.s\", \"sinceVersion\": 3}");
	assert_int_equal(count_array(r, "chunks"), 1);
	bson_destroy(r);
}

/* ---------- the client side: diffs applied == full load ---------- */

/* Feed every batch of a getRoutingTable cursor for ns (since < 0: full) into an update;
 * returns the version of the first batch. */
static int64_t load(t *x, const char *ns, int64_t since, route_update **u, bool *full)
{
	char buf[512], resume[128] = "";
	int64_t v0 = -1;
	char err[256];
	for (;;) {
		bson_t *r;
		bson_iter_t it, arr, sub;
		int rc;
		if (since >= 0)
			snprintf(buf, sizeof buf,
				 "{\"getRoutingTable\": \"%s\", \"sinceVersion\": %lld, \"cursor\": "
				 "{\"batchSize\": 3}%s}",
				 ns, (long long)since, resume);
		else
			snprintf(buf, sizeof buf,
				 "{\"getRoutingTable\": \"%s\", \"cursor\": {\"batchSize\": 3}%s}", ns,
				 resume);
		r = query_rc(x, buf, &rc);
		if (rc == SDB_ENSNOTFOUND) {
			bson_destroy(r);
			*u = route_update_new(ns, true);
			*full = true;
			return (int64_t)sdb_fsm_routing_version(x->f);
		}
		assert_int_equal(rc, 0);
		if (v0 < 0) {
			v0 = int_of(r, "routingVersion");
			*full = bool_of(r, "full");
			if (*full)
				since = -1;
			*u = route_update_new(ns, *full);
			if (bson_iter_init_find(&it, r, "key") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
				uint32_t len;
				const uint8_t *d;
				bson_t key;
				bson_iter_document(&it, &len, &d);
				bson_init_static(&key, d, len);
				route_update_set_key(*u, &key);
			}
		}
		if (bson_iter_init_find(&it, r, "removed") && bson_iter_recurse(&it, &arr))
			while (bson_iter_next(&arr))
				route_update_removed(*u, &arr);
		if (bson_iter_init_find(&it, r, "chunks") && bson_iter_recurse(&it, &arr))
			while (bson_iter_next(&arr))
				assert_int_equal(route_update_chunk(*u, &arr, err, sizeof err), 0);
		if (!bool_of(r, "more")) {
			bson_destroy(r);
			return v0;
		}
		assert_true(bson_iter_init_find(&it, r, "resumeAfter"));
		bson_iter_recurse(&it, &sub);
		bson_iter_find(&sub, "version");
		int64_t v = bson_iter_as_int64(&sub);
		bson_iter_recurse(&it, &sub);
		bson_iter_find(&sub, "id");
		snprintf(resume, sizeof resume, ", \"resumeAfter\": {\"version\": %lld, \"id\": %lld}",
			 (long long)v, (long long)bson_iter_as_int64(&sub));
		bson_destroy(r);
	}
}

static route_coll *snapshot(t *x, const char *ns, const route_coll *old)
{
	route_update *u = NULL;
	route_coll *c = NULL;
	bool full;
	char err[256];
	int64_t v = load(x, ns, old && old->nkeys ? old->version : -1, &u, &full);
	if (route_update_apply(u, full ? NULL : old, v, &c, err, sizeof err) != 0)
		fail_msg("apply %s: %s", ns, err);
	route_update_free(u);
	return c;
}

static void same(const route_coll *a, const route_coll *b)
{
	assert_int_equal(a->nchunks, b->nchunks);
	assert_int_equal(a->nkeys, b->nkeys);
	for (size_t i = 0; i < a->nchunks; i++) {
		assert_string_equal(a->chunks[i].id, b->chunks[i].id);
		assert_string_equal(a->chunks[i].shard, b->chunks[i].shard);
		assert_int_equal(a->chunks[i].token, b->chunks[i].token);
		assert_int_equal(route_key_cmp(a->chunks[i].min, b->chunks[i].min), 0);
		assert_int_equal(route_key_cmp(a->chunks[i].max, b->chunks[i].max), 0);
	}
}

/* Chunk ids of ns in key order (from a full load), at most cap. */
static size_t ids_of(t *x, const char *ns, int64_t *ids, size_t cap)
{
	route_coll *c = snapshot(x, ns, NULL);
	size_t n = c->nchunks < cap ? c->nchunks : cap;
	for (size_t i = 0; i < n; i++)
		ids[i] = c->chunks[i].nid;
	route_coll_unref(c);
	return n;
}

static void test_diffs_equal_full_loads(void **state)
{
	t *x = *state;
	route_coll *held = NULL;
	unsigned seed = 26;
	char buf[256];
	int64_t ids[256];
	int step;
	base(x);
	ok(x, "shardCollection", "{\"ns\": \"app.r\", \"key\": {\"k\": 1}, \"splitPoints\": "
				 "[{\"k\": 1000}, {\"k\": 2000}, {\"k\": 3000}]}");
	held = snapshot(x, "app.r", NULL);
	for (step = 0; step < 300; step++) {
		size_t n = ids_of(x, "app.r", ids, 256);
		int op = (int)(rand_r(&seed) % 10);
		size_t i = n ? (size_t)rand_r(&seed) % n : 0;
		if (n == 0 || op == 9) {
			/* drop and re-create (a new incarnation with new chunk ids) */
			if (n)
				ok(x, "dropCollection", "{\"ns\": \"app.r\"}");
			ok(x, "shardCollection", "{\"ns\": \"app.r\", \"key\": {\"k\": 1}, "
						 "\"splitPoints\": [{\"k\": 500}]}");
		} else if (op < 4) {
			/* split inside the chunk: a point between its bounds */
			route_coll *c = snapshot(x, "app.r", NULL);
			bson_iter_t lo, hi;
			double a = -1e6, b = 1e6;
			if (bson_iter_init(&lo, c->chunks[i].min) && bson_iter_next(&lo) &&
			    BSON_ITER_HOLDS_NUMBER(&lo))
				a = bson_iter_as_double(&lo);
			if (bson_iter_init(&hi, c->chunks[i].max) && bson_iter_next(&hi) &&
			    BSON_ITER_HOLDS_NUMBER(&hi))
				b = bson_iter_as_double(&hi);
			route_coll_unref(c);
			snprintf(buf, sizeof buf, "{\"id\": %lld, \"at\": {\"k\": %.17g}}",
				 (long long)ids[i], a + (b - a) / 2);
			bson_t *r = apply(x, "splitChunk", buf);
			bson_destroy(r); /* may be refused when the range is too narrow */
		} else if (op < 6 && i + 1 < n) {
			snprintf(buf, sizeof buf, "{\"ids\": [%lld, %lld]}", (long long)ids[i],
				 (long long)ids[i + 1]);
			bson_destroy(apply(x, "mergeChunks", buf)); /* refused across shards */
		} else {
			snprintf(buf, sizeof buf, "{\"id\": %lld, \"shard\": \"%s\"}", (long long)ids[i],
				 rand_r(&seed) % 2 ? "a" : "b");
			ok(x, "setChunkShard", buf);
		}
		/* the client: a diff since what it holds, applied; then compared with a full load */
		route_coll *next = snapshot(x, "app.r", held);
		route_coll *full = snapshot(x, "app.r", NULL);
		same(next, full);
		assert_int_equal(next->version, sdb_fsm_routing_version(x->f));
		route_coll_unref(full);
		route_coll_unref(held);
		held = next;
	}
	route_coll_unref(held);
}

/* A client further behind than the removal horizon gets a full load. */
static void test_horizon(void **state)
{
	t *x = *state;
	bson_t *r;
	base(x);
	ok(x, "shardCollection", "{\"ns\": \"app.m\", \"key\": {\"k\": 1}}"); /* v1: chunk 1 */
	for (int i = 0; i < 10001; i++)
		ok(x, "setChunkShard", i % 2 ? "{\"id\": 1, \"shard\": \"a\"}"
					     : "{\"id\": 1, \"shard\": \"b\"}");
	r = query(x, "{\"getRoutingTable\": \"app.m\", \"sinceVersion\": 1}");
	assert_true(bool_of(r, "full"));
	bson_destroy(r);
	/* "all" from beyond the horizon: reload each collection, no full load sent */
	r = query(x, "{\"getRoutingTable\": \"all\", \"sinceVersion\": 1}");
	assert_true(bool_of(r, "full"));
	assert_true(bool_of(r, "reloadEach"));
	assert_int_equal(count_array(r, "chunks"), 0);
	bson_destroy(r);
	r = query(x, "{\"getRoutingTable\": \"app.m\", \"sinceVersion\": 9000}");
	assert_false(bool_of(r, "full"));
	assert_int_equal(count_array(r, "chunks"), 1);
	bson_destroy(r);
	r = bson_new();
	assert_int_equal(sdb_fsm_routing_changed(x->f, 1, r), 0);
	assert_true(bool_of(r, "namespacesAll"));
	bson_destroy(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_diff_and_tombstones, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cursor_and_large_tables, setup, teardown),
		cmocka_unit_test_setup_teardown(test_diffs_equal_full_loads, setup, teardown),
		cmocka_unit_test_setup_teardown(test_horizon, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
