/* Unit tests of src/routing/route.c: table building, O(log n) chunk lookup, hashed keys,
 * query targeting and shard-key update checks. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/routing/route.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "routing/route.h"

/* A routing table reply with chunks [MinKey,100) a, [100,200) b, [200,MaxKey) c on key k. */
static route_coll *ranged_table(void)
{
	bson_t *t = BCON_NEW("routingVersion", BCON_INT64(7), "chunks", "[",
			     "{", "id", BCON_INT64(2), "ns", "db.c", "min", "{", "k", BCON_INT32(100), "}",
			     "max", "{", "k", BCON_INT32(200), "}", "shard", "b", "token", BCON_INT64(3), "}",
			     "{", "id", BCON_INT64(1), "ns", "db.c", "min", "{", "k", BCON_MINKEY, "}",
			     "max", "{", "k", BCON_INT32(100), "}", "shard", "a", "token", BCON_INT64(1), "}",
			     "{", "id", BCON_INT64(3), "ns", "db.c", "min", "{", "k", BCON_INT32(200), "}",
			     "max", "{", "k", BCON_MAXKEY, "}", "shard", "c", "token", BCON_INT64(1), "}",
			     "{", "id", BCON_INT64(9), "ns", "db.other", "min", "{", "k", BCON_MINKEY, "}",
			     "max", "{", "k", BCON_MAXKEY, "}", "shard", "c", "token", BCON_INT64(1), "}",
			     "]");
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = NULL;
	char err[256];

	assert_int_equal(route_coll_build("db.c", key, t, &c, err, sizeof err), 0);
	bson_destroy(t);
	bson_destroy(key);
	return c;
}

static ssize_t chunk_of(route_coll *c, bson_t *doc)
{
	ssize_t r = route_chunk_of_doc(c, doc);
	bson_destroy(doc);
	return r;
}

/* The per-shard summary built with the snapshot: shards in first-chunk order, each shard's
 * largest token, the chunk -> shard index, the collection's largest token; and after an
 * incremental update that moves a chunk. */
static void test_shard_summary(void **state)
{
	route_coll *c = ranged_table(), *c2 = NULL;
	route_update *u = route_update_new("db.c", false);
	bson_t *ch = BCON_NEW("c", "{", "id", BCON_INT64(2), "ns", "db.c", "min", "{", "k",
			      BCON_INT32(100), "}", "max", "{", "k", BCON_INT32(200), "}", "shard",
			      "a", "token", BCON_INT64(5), "}");
	bson_iter_t it;
	char err[128];

	(void)state;
	assert_int_equal(c->nshards, 3);
	assert_string_equal(c->shards[0].id, "a");
	assert_string_equal(c->shards[1].id, "b");
	assert_string_equal(c->shards[2].id, "c");
	assert_int_equal(c->shards[1].version, 3);
	assert_int_equal(c->shards[1].first, 1);
	assert_int_equal(c->shards[1].nchunks, 1);
	assert_int_equal(c->shard_of[2], 2);
	assert_int_equal(c->max_token, 3);
	assert_ptr_equal(route_shard_find(c, "b"), &c->shards[1]);
	assert_null(route_shard_find(c, "zz"));

	/* chunk 2 moves to a with token 5: a owns chunks 0 and 1, b none */
	assert_true(bson_iter_init_find(&it, ch, "c"));
	assert_int_equal(route_update_chunk(u, &it, err, sizeof err), 0);
	assert_int_equal(route_update_apply(u, c, 8, &c2, err, sizeof err), 0);
	assert_int_equal(c2->nshards, 2);
	assert_string_equal(c2->shards[0].id, "a");
	assert_int_equal(c2->shards[0].nchunks, 2);
	assert_int_equal(c2->shards[0].version, 5);
	assert_int_equal(c2->shard_of[1], 0);
	assert_int_equal(c2->shard_of[2], 1);
	assert_int_equal(c2->max_token, 5);
	assert_null(route_shard_find(c2, "b"));
	route_coll_unref(c2);
	route_update_free(u);
	bson_destroy(ch);
	route_coll_unref(c);
}

/* 300 chunks placed round-robin on 100 shards (past the summary's first hash table size):
 * every chunk's shard index, each shard's first chunk, count and largest token. */
static void test_shard_summary_many(void **state)
{
	bson_t table = BSON_INITIALIZER, arr, ch, b;
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = NULL;
	char err[128], k[16], shard[16];

	(void)state;
	BSON_APPEND_ARRAY_BEGIN(&table, "chunks", &arr);
	for (int i = 0; i < 300; i++) {
		snprintf(k, sizeof k, "%d", i);
		snprintf(shard, sizeof shard, "s%d", i % 100);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &ch);
		BSON_APPEND_INT64(&ch, "id", i + 1);
		BSON_APPEND_UTF8(&ch, "ns", "db.m");
		BSON_APPEND_DOCUMENT_BEGIN(&ch, "min", &b);
		if (i == 0)
			BSON_APPEND_MINKEY(&b, "k");
		else
			BSON_APPEND_INT32(&b, "k", i);
		bson_append_document_end(&ch, &b);
		BSON_APPEND_DOCUMENT_BEGIN(&ch, "max", &b);
		if (i == 299)
			BSON_APPEND_MAXKEY(&b, "k");
		else
			BSON_APPEND_INT32(&b, "k", i + 1);
		bson_append_document_end(&ch, &b);
		BSON_APPEND_UTF8(&ch, "shard", shard);
		BSON_APPEND_INT64(&ch, "token", i);
		bson_append_document_end(&arr, &ch);
	}
	bson_append_array_end(&table, &arr);
	assert_int_equal(route_coll_build("db.m", key, &table, &c, err, sizeof err), 0);
	assert_int_equal(c->nshards, 100);
	assert_int_equal(c->max_token, 299);
	for (int i = 0; i < 300; i++)
		assert_int_equal(c->shard_of[i], i % 100);
	for (int s = 0; s < 100; s++) {
		snprintf(shard, sizeof shard, "s%d", s);
		const route_shard *rs = route_shard_find(c, shard);
		assert_non_null(rs);
		assert_string_equal(rs->id, shard);
		assert_int_equal(rs->first, s);
		assert_int_equal(rs->nchunks, 3);
		assert_int_equal(rs->version, 200 + s);
	}
	route_coll_unref(c);
	bson_destroy(&table);
	bson_destroy(key);
}

static void test_build_and_lookup(void **state)
{
	route_coll *c = ranged_table();

	(void)state;
	assert_int_equal(c->nchunks, 3);
	assert_int_equal(c->version, 7);
	assert_string_equal(c->chunks[0].id, "1");
	assert_string_equal(c->chunks[0].shard, "a");
	assert_string_equal(c->chunks[1].id, "2");
	assert_int_equal(c->chunks[1].token, 3);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_INT32(0))), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_INT32(-5000))), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_DOUBLE(99.5))), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_INT64(100))), 1);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_DOUBLE(199.99))), 1);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_INT32(200))), 2);
	/* strings sort after numbers: last chunk; missing and null before numbers: first */
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_UTF8("a"))), 2);
	assert_int_equal(chunk_of(c, BCON_NEW("other", BCON_INT32(500))), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("k", BCON_NULL)), 0);
	/* arrays are not shard keys */
	assert_int_equal(chunk_of(c, BCON_NEW("k", "[", BCON_INT32(1), "]")), -1);
	route_coll_unref(c);
}

static void test_overlap_refused(void **state)
{
	bson_t *t = BCON_NEW("chunks", "[",
			     "{", "id", BCON_INT64(1), "min", "{", "k", BCON_MINKEY, "}",
			     "max", "{", "k", BCON_INT32(100), "}", "shard", "a", "}",
			     "{", "id", BCON_INT64(2), "min", "{", "k", BCON_INT32(50), "}",
			     "max", "{", "k", BCON_MAXKEY, "}", "shard", "b", "}", "]");
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = NULL;
	char err[256];

	(void)state;
	assert_int_equal(route_coll_build("db.c", key, t, &c, err, sizeof err), -2);
	assert_non_null(strstr(err, "overlap"));
	bson_destroy(t);
	bson_destroy(key);
}

static size_t target(route_coll *c, bson_t *filter, bool *sel, bool *exact)
{
	size_t n = route_target(c, filter, sel, exact);
	bson_destroy(filter);
	return n;
}

static void test_targeting(void **state)
{
	route_coll *c = ranged_table();
	bool sel[3], exact;

	(void)state;
	assert_int_equal(target(c, BCON_NEW("k", BCON_INT32(150)), sel, &exact), 1);
	assert_true(exact);
	assert_true(sel[1]);
	assert_int_equal(target(c, BCON_NEW("k", "{", "$eq", BCON_INT32(5), "}"), sel, &exact), 1);
	assert_true(sel[0] && exact);
	assert_int_equal(target(c, BCON_NEW("k", "{", "$in", "[", BCON_INT32(5), BCON_INT32(250),
					    "]", "}"),
			       sel, &exact),
			 2);
	assert_true(sel[0] && !sel[1] && sel[2] && exact);
	/* ranges: [100, 150] -> chunk b only; (.., 100) -> a only ($lt 100 excludes b) */
	assert_int_equal(target(c, BCON_NEW("k", "{", "$gte", BCON_INT32(100), "$lte",
					    BCON_INT32(150), "}"),
			       sel, &exact),
			 1);
	assert_true(sel[1] && !exact);
	/* $lt 100 keeps b, whose min is 100: chunks hold keys by route_key_cmp, where a
	 * Decimal128 such as 99.99999999999999999999 ties 100 (same nearest long double) and so
	 * lives in b, yet matches $lt 100 */
	assert_int_equal(target(c, BCON_NEW("k", "{", "$lt", BCON_INT32(100), "}"), sel, &exact), 2);
	assert_true(sel[0] && sel[1] && !sel[2]);
	/* $lt 99 ties nothing of b: a only */
	assert_int_equal(target(c, BCON_NEW("k", "{", "$lt", BCON_INT32(99), "}"), sel, &exact), 1);
	assert_true(sel[0]);
	assert_int_equal(target(c, BCON_NEW("k", "{", "$gt", BCON_INT32(150), "}"), sel, &exact), 2);
	assert_true(!sel[0] && sel[1] && sel[2]);
	/* inside $and */
	assert_int_equal(target(c, BCON_NEW("$and", "[", "{", "x", BCON_INT32(1), "}", "{", "k",
					    BCON_INT32(250), "}", "]"),
			       sel, &exact),
			 1);
	assert_true(sel[2] && exact);
	/* no key, $ne, regex: scatter */
	assert_int_equal(target(c, BCON_NEW("x", BCON_INT32(1)), sel, &exact), 3);
	assert_false(exact);
	assert_int_equal(target(c, BCON_NEW("k", "{", "$ne", BCON_INT32(1), "}"), sel, &exact), 3);
	assert_int_equal(target(c, bson_new(), sel, &exact), 3);
	route_coll_unref(c);
}

static void test_hashed(void **state)
{
	bson_t *t = BCON_NEW("chunks", "[",
			     "{", "id", BCON_INT64(1), "min", "{", "h", BCON_MINKEY, "}",
			     "max", "{", "h", BCON_INT64(0), "}", "shard", "a", "}",
			     "{", "id", BCON_INT64(2), "min", "{", "h", BCON_INT64(0), "}",
			     "max", "{", "h", BCON_MAXKEY, "}", "shard", "b", "}", "]");
	bson_t *key = BCON_NEW("h", BCON_UTF8("hashed"));
	route_coll *c = NULL;
	char err[256];
	bson_value_t v1, v2, v3;
	bool sel[2], exact;
	int i, counts[2] = {0, 0};

	(void)state;
	assert_int_equal(route_coll_build("db.h", key, t, &c, err, sizeof err), 0);
	assert_true(c->hashed);
	/* equal numbers of different types hash equally; different values differ */
	v1.value_type = BSON_TYPE_INT32;
	v1.value.v_int32 = 42;
	v2.value_type = BSON_TYPE_DOUBLE;
	v2.value.v_double = 42.0;
	v3.value_type = BSON_TYPE_INT64;
	v3.value.v_int64 = 43;
	assert_true(route_hash_value(&v1) == route_hash_value(&v2));
	assert_true(route_hash_value(&v1) != route_hash_value(&v3));
	/* a range query on a hashed key scatters; equality targets one chunk */
	assert_int_equal(target(c, BCON_NEW("h", "{", "$gt", BCON_INT32(5), "}"), sel, &exact), 2);
	assert_int_equal(target(c, BCON_NEW("h", BCON_INT32(42)), sel, &exact), 1);
	assert_true(exact);
	assert_true(sel[route_hash_value(&v1) < 0 ? 0 : 1]);
	/* consecutive values spread over both chunks */
	for (i = 0; i < 200; i++) {
		bson_t *d = BCON_NEW("h", BCON_INT32(i));
		ssize_t ch = route_chunk_of_doc(c, d);
		assert_true(ch == 0 || ch == 1);
		counts[ch]++;
		bson_destroy(d);
	}
	assert_true(counts[0] > 50 && counts[1] > 50);
	bson_destroy(t);
	bson_destroy(key);
	route_coll_unref(c);
}

static void test_compound(void **state)
{
	bson_t *t = BCON_NEW("chunks", "[",
			     "{", "id", BCON_INT64(1), "min", "{", "a", BCON_MINKEY, "b", BCON_MINKEY, "}",
			     "max", "{", "a", BCON_INT32(5), "b", BCON_UTF8("m"), "}", "shard", "a", "}",
			     "{", "id", BCON_INT64(2), "min", "{", "a", BCON_INT32(5), "b", BCON_UTF8("m"), "}",
			     "max", "{", "a", BCON_MAXKEY, "b", BCON_MAXKEY, "}", "shard", "b", "}", "]");
	bson_t *key = BCON_NEW("a", BCON_INT32(1), "b", BCON_INT32(1));
	route_coll *c = NULL;
	char err[256];
	bool sel[2], exact;

	(void)state;
	assert_int_equal(route_coll_build("db.k", key, t, &c, err, sizeof err), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("a", BCON_INT32(5), "b", BCON_UTF8("a"))), 0);
	assert_int_equal(chunk_of(c, BCON_NEW("a", BCON_INT32(5), "b", BCON_UTF8("m"))), 1);
	assert_int_equal(chunk_of(c, BCON_NEW("b", BCON_UTF8("z"), "a", BCON_INT32(4))), 0);
	/* equality on the prefix only: both chunks hold a == 5 */
	assert_int_equal(target(c, BCON_NEW("a", BCON_INT32(5)), sel, &exact), 2);
	assert_false(exact);
	assert_int_equal(target(c, BCON_NEW("a", BCON_INT32(1)), sel, &exact), 1);
	assert_true(sel[0]);
	assert_int_equal(target(c, BCON_NEW("a", BCON_INT32(5), "b", BCON_UTF8("x")), sel, &exact), 1);
	assert_true(sel[1] && exact);
	bson_destroy(t);
	bson_destroy(key);
	route_coll_unref(c);
}

static route_key_change changes(route_coll *c, bson_t *u, bson_t *q)
{
	char err[256];
	route_key_change r = route_update_changes_key(c, u, q, err, sizeof err);
	bson_destroy(u);
	bson_destroy(q);
	return r;
}

static void test_update_key(void **state)
{
	route_coll *c = ranged_table();

	(void)state;
	assert_int_equal(ROUTE_KEY_KEPT, changes(c, BCON_NEW("$set", "{", "x", BCON_INT32(1), "}"), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("$set", "{", "k", BCON_INT32(2), "}"), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_KEPT, changes(c, BCON_NEW("$set", "{", "k", BCON_DOUBLE(1.0), "}"), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("$inc", "{", "k", BCON_INT32(1), "}"), bson_new()));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("$unset", "{", "k", BCON_UTF8(""), "}"), bson_new()));
	assert_int_equal(ROUTE_KEY_KEPT, changes(c, BCON_NEW("$set", "{", "kk", BCON_INT32(1), "}"), bson_new()));
	/* $setOnInsert of the pinned value (an upsert's insert; $merge keepExisting) is kept,
	 * of another value or unpinned it is not */
	assert_int_equal(ROUTE_KEY_KEPT, changes(c, BCON_NEW("$setOnInsert", "{", "k", BCON_INT32(1), "w", BCON_INT32(2), "}"), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("$setOnInsert", "{", "k", BCON_INT32(2), "}"), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("$setOnInsert", "{", "k", BCON_INT32(2), "}"), bson_new()));
	/* replacements keep the pinned key or are refused */
	assert_int_equal(ROUTE_KEY_KEPT, changes(c, BCON_NEW("k", BCON_INT32(1), "x", BCON_INT32(2)), BCON_NEW("k", BCON_INT32(1))));
	assert_int_equal(ROUTE_KEY_CHANGED, changes(c, BCON_NEW("k", BCON_INT32(3)), BCON_NEW("k", BCON_INT32(1))));
	/* the filter does not pin the key: ShardKeyNotFound, not ImmutableField */
	assert_int_equal(ROUTE_KEY_NOT_PINNED, changes(c, BCON_NEW("x", BCON_INT32(3)), BCON_NEW("x", BCON_INT32(1))));
	route_coll_unref(c);
}

static void test_cache(void **state)
{
	route_cache *rc = route_cache_new();
	route_coll *a = ranged_table(), *b = ranged_table(), *got;
	char **names;
	size_t n;

	(void)state;
	b->version = 3; /* older than a (7) */
	route_cache_put(rc, a);
	route_cache_put(rc, b); /* ignored: older */
	got = route_cache_get(rc, "db.c");
	assert_ptr_equal(got, a);
	assert_int_equal(got->version, 7);
	route_coll_unref(got);
	route_cache_put(rc, route_coll_unsharded("db.u", 9));
	n = route_cache_names(rc, &names);
	assert_int_equal(n, 2);
	free(names[0]);
	free(names[1]);
	free(names);
	route_cache_drop(rc, "db.c");
	assert_null(route_cache_get(rc, "db.c"));
	got = route_cache_get(rc, "db.u");
	assert_int_equal(got->nkeys, 0);
	route_coll_unref(got);
	route_cache_free(rc);
}


/* paths_conflict (static of route.c, reachable because the test includes it): an update
 * path touches the shard key when one path is the other or a dotted prefix of it; a plain
 * string prefix ("a" and "ab") is a different field. */
static void test_static_paths_conflict(void **state)
{
	(void)state;
	assert_true(paths_conflict("a", "a"));
	assert_true(paths_conflict("a", "a.b"));
	assert_true(paths_conflict("a.b", "a"));
	assert_true(paths_conflict("a.b.c", "a.b"));
	assert_false(paths_conflict("a", "ab"));
	assert_false(paths_conflict("ab", "a"));
	assert_false(paths_conflict("a.b", "a.c"));
	assert_false(paths_conflict("a.bc", "a.b"));
	assert_false(paths_conflict("b", "a.b"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_build_and_lookup), cmocka_unit_test(test_overlap_refused),
		cmocka_unit_test(test_targeting),        cmocka_unit_test(test_hashed),
		cmocka_unit_test(test_compound),         cmocka_unit_test(test_update_key),
		cmocka_unit_test(test_cache),
		cmocka_unit_test(test_shard_summary),
		cmocka_unit_test(test_shard_summary_many),
		cmocka_unit_test(test_static_paths_conflict),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
