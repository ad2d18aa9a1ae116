/* Unit tests of src/routing/owned.c: a shard's owned ranges (merged, keyenc-encoded) answer
 * as route_chunk_of_doc does on the same snapshot, for ranged, compound and hashed keys,
 * whatever the order documents come in (the hint). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/routing/owned.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* A snapshot of db.c on key pattern `key` from chunks given as {min, max} documents
 * (the chunk list of an install: every chunk is the shard's). */
static route_coll *coll_of(const bson_t *key, const bson_t *const *mins,
			   const bson_t *const *maxs, size_t n)
{
	bson_t table = BSON_INITIALIZER, arr, ch;
	route_coll *c = NULL;
	char err[256], k[16];

	BSON_APPEND_ARRAY_BEGIN(&table, "chunks", &arr);
	for (size_t i = 0; i < n; i++) {
		snprintf(k, sizeof k, "%zu", i);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &ch);
		BSON_APPEND_INT64(&ch, "id", (int64_t)i + 1);
		BSON_APPEND_UTF8(&ch, "ns", "db.c");
		BSON_APPEND_DOCUMENT(&ch, "min", mins[i]);
		BSON_APPEND_DOCUMENT(&ch, "max", maxs[i]);
		BSON_APPEND_UTF8(&ch, "shard", "self");
		BSON_APPEND_INT64(&ch, "token", 1);
		bson_append_document_end(&arr, &ch);
	}
	bson_append_array_end(&table, &arr);
	assert_int_equal(route_coll_build("db.c", key, &table, &c, err, sizeof err), 0);
	bson_destroy(&table);
	return c;
}

/* route_owned_has_doc(doc) must equal route_chunk_of_doc(doc) >= 0, with the hint carried
 * from the previous call (any order) and with a fresh hint. */
static void check_same(const route_owned *o, const bson_t *doc, sdb_key *buf, size_t *hint)
{
	bool want = route_chunk_of_doc(route_owned_coll(o), doc) >= 0;
	size_t fresh = 0;

	assert_int_equal(route_owned_has_doc(o, doc, buf, hint), want);
	assert_int_equal(route_owned_has_doc(o, doc, buf, &fresh), want);
}

/* Ranged key k: chunks [MinKey,100) [100,200) [300,400) [400,MaxKey) are 2 ranges;
 * numbers, strings, null (missing) and arrays located as route_chunk_of_doc does. */
static void test_ranged_merge_and_lookup(void **state)
{
	(void)state;
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	bson_t *mins[4] = {BCON_NEW("k", BCON_MINKEY), BCON_NEW("k", BCON_INT32(100)),
			   BCON_NEW("k", BCON_INT32(300)), BCON_NEW("k", BCON_DOUBLE(400.0))};
	bson_t *maxs[4] = {BCON_NEW("k", BCON_INT32(100)), BCON_NEW("k", BCON_INT64(200)),
			   BCON_NEW("k", BCON_INT64(400)), BCON_NEW("k", BCON_MAXKEY)};
	route_coll *c = coll_of(key, (const bson_t *const *)mins, (const bson_t *const *)maxs, 4);
	route_owned *o = NULL;
	char err[128];
	sdb_key buf;
	size_t hint = 0;

	sdb_key_init(&buf);
	assert_int_equal(route_owned_build(c, &o, err, sizeof err), 0);
	route_coll_unref(c); /* o holds its own reference */
	assert_int_equal(route_owned_nranges(o), 2);

	/* expected values stated: owned below 200 and from 300 on, not in [200, 300) */
	struct {
		double k;
		bool owned;
	} pts[] = {{-5, true}, {99.5, true}, {100, true}, {199, true}, {200, false},
		   {250, false}, {299.99, false}, {300, true}, {400, true}, {1e9, true}};
	for (size_t i = 0; i < sizeof pts / sizeof pts[0]; i++) {
		bson_t *d = BCON_NEW("_id", BCON_INT32(1), "k", BCON_DOUBLE(pts[i].k));
		size_t h = 0;
		assert_int_equal(route_owned_has_doc(o, d, &buf, &h), pts[i].owned);
		bson_destroy(d);
	}
	/* an ascending sweep (the incremental path) and a descending one, every answer as
	 * route_chunk_of_doc's */
	for (int v = -10; v < 600; v += 7) {
		bson_t *d = BCON_NEW("k", BCON_INT32(v));
		check_same(o, d, &buf, &hint);
		bson_destroy(d);
	}
	for (int v = 600; v > -10; v -= 13) {
		bson_t *d = BCON_NEW("k", BCON_INT64(v));
		check_same(o, d, &buf, &hint);
		bson_destroy(d);
	}
	/* other types: a string sorts above every number (in the last range: owned), a missing
	 * key is null (below numbers: in [MinKey, 100)), an array is never a key value */
	bson_t *s = BCON_NEW("k", BCON_UTF8("x"));
	bson_t *missing = BCON_NEW("a", BCON_INT32(1));
	bson_t *arr = BCON_NEW("k", "[", BCON_INT32(1), "]");
	assert_true(route_owned_has_doc(o, s, &buf, &hint));
	assert_true(route_owned_has_doc(o, missing, &buf, &hint));
	assert_false(route_owned_has_doc(o, arr, &buf, &hint));
	check_same(o, s, &buf, &hint);
	check_same(o, missing, &buf, &hint);
	check_same(o, arr, &buf, &hint);
	bson_destroy(s);
	bson_destroy(missing);
	bson_destroy(arr);

	route_owned_unref(o);
	sdb_key_free(&buf);
	for (int i = 0; i < 4; i++) {
		bson_destroy(mins[i]);
		bson_destroy(maxs[i]);
	}
	bson_destroy(key);
}

/* Every other chunk of 64 owned (nothing merges: 32 ranges) on a compound key {a, b}. */
static void test_compound_alternating(void **state)
{
	(void)state;
	bson_t *key = BCON_NEW("a", BCON_INT32(1), "b", BCON_INT32(1));
	bson_t *mins[32], *maxs[32];
	for (int i = 0; i < 32; i++) {
		mins[i] = BCON_NEW("a", BCON_INT32(2 * i), "b", BCON_UTF8("m"));
		maxs[i] = BCON_NEW("a", BCON_INT32(2 * i + 1), "b", BCON_UTF8("m"));
	}
	route_coll *c = coll_of(key, (const bson_t *const *)mins, (const bson_t *const *)maxs, 32);
	route_owned *o = NULL;
	char err[128];
	sdb_key buf;
	size_t hint = 0;

	sdb_key_init(&buf);
	assert_int_equal(route_owned_build(c, &o, err, sizeof err), 0);
	route_coll_unref(c);
	assert_int_equal(route_owned_nranges(o), 32);
	const char *bs[] = {"a", "m", "n", "z"};
	for (int a = -1; a < 66; a++)
		for (size_t j = 0; j < 4; j++) {
			bson_t *d = BCON_NEW("a", BCON_INT32(a), "b", BCON_UTF8(bs[j]));
			check_same(o, d, &buf, &hint);
			bson_destroy(d);
		}
	/* {a: 4, b: "m"} is a chunk's min (owned), {a: 5, b: "m"} its max (not) */
	bson_t *in = BCON_NEW("a", BCON_INT32(4), "b", BCON_UTF8("m"));
	bson_t *out = BCON_NEW("a", BCON_INT32(5), "b", BCON_UTF8("m"));
	assert_true(route_owned_has_doc(o, in, &buf, &hint));
	assert_false(route_owned_has_doc(o, out, &buf, &hint));
	bson_destroy(in);
	bson_destroy(out);
	route_owned_unref(o);
	sdb_key_free(&buf);
	for (int i = 0; i < 32; i++) {
		bson_destroy(mins[i]);
		bson_destroy(maxs[i]);
	}
	bson_destroy(key);
}

/* Hashed key: the shard owns [MinKey, -2^62) and [0, 2^62); documents are located by the
 * NumberLong hash of their value, as route_chunk_of_doc does. */
static void test_hashed(void **state)
{
	(void)state;
	bson_t *key = BCON_NEW("h", BCON_UTF8("hashed"));
	bson_t *mins[2] = {BCON_NEW("h", BCON_MINKEY), BCON_NEW("h", BCON_INT64(0))};
	bson_t *maxs[2] = {BCON_NEW("h", BCON_INT64(-(INT64_C(1) << 62))),
			   BCON_NEW("h", BCON_INT64(INT64_C(1) << 62))};
	route_coll *c = coll_of(key, (const bson_t *const *)mins, (const bson_t *const *)maxs, 2);
	route_owned *o = NULL;
	char err[128];
	sdb_key buf;
	size_t hint = 0, owned = 0;

	sdb_key_init(&buf);
	assert_int_equal(route_owned_build(c, &o, err, sizeof err), 0);
	route_coll_unref(c);
	assert_int_equal(route_owned_nranges(o), 2);
	for (int v = 0; v < 400; v++) {
		bson_t *d = BCON_NEW("h", BCON_INT32(v));
		check_same(o, d, &buf, &hint);
		owned += route_owned_has_doc(o, d, &buf, &hint);
		bson_destroy(d);
	}
	/* the ranges cover half the hash space: some values in, some out */
	assert_true(owned > 100 && owned < 300);
	route_owned_unref(o);
	sdb_key_free(&buf);
	for (int i = 0; i < 2; i++) {
		bson_destroy(mins[i]);
		bson_destroy(maxs[i]);
	}
	bson_destroy(key);
}

/* No chunk: nothing is owned. */
static void test_empty(void **state)
{
	(void)state;
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = coll_of(key, NULL, NULL, 0);
	route_owned *o = NULL;
	char err[128];
	sdb_key buf;
	size_t hint = 0;

	sdb_key_init(&buf);
	assert_int_equal(route_owned_build(c, &o, err, sizeof err), 0);
	route_coll_unref(c);
	assert_int_equal(route_owned_nranges(o), 0);
	bson_t *d = BCON_NEW("k", BCON_INT32(1));
	assert_false(route_owned_has_doc(o, d, &buf, &hint));
	bson_destroy(d);
	route_owned_unref(o);
	sdb_key_free(&buf);
	bson_destroy(key);
}

/* Decimal128 keys around a decimal chunk bound (issue #20): chunks [MinKey, B) and
 * [B, MaxKey) with B = 1234567890123456789012.902 owned separately. Chunk membership is
 * route_key_cmp's order (decimals through their nearest long double, the order every chunk
 * placement was made in before exact decimals), so .901 and .903, which tie B there, are in
 * B's chunk, as is B and ...9011 (1.9 below; the long doubles there are 128 apart);
 * ...8000 is not. The owned filter (memcmp of the
 * frozen encodings) and route_chunk_of_doc agree on every one. */
static void test_decimal_ties(void **state)
{
	(void)state;
	bson_decimal128_t b, d;
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	assert_true(bson_decimal128_from_string("1234567890123456789012.902", &b));
	bson_t *mins[1] = {BCON_NEW("k", BCON_DECIMAL128(&b))};
	bson_t *maxs[1] = {BCON_NEW("k", BCON_MAXKEY)};
	route_coll *c = coll_of(key, (const bson_t *const *)mins, (const bson_t *const *)maxs, 1);
	route_owned *o = NULL;
	char err[128];
	sdb_key buf;
	size_t hint = 0;
	const struct {
		const char *v;
		bool owned;
	} pts[] = {{"1234567890123456789012.901", true}, {"1234567890123456789012.902", true},
		   {"1234567890123456789012.903", true},  {"1234567890123456789012.9019999", true},
		   {"1234567890123456788000", false},     {"1234567890123456789011", true},
		   {"-1234567890123456789012.902", false}, {"1E+30", true}, {"1E+21", false}};

	sdb_key_init(&buf);
	assert_int_equal(route_owned_build(c, &o, err, sizeof err), 0);
	for (size_t i = 0; i < sizeof pts / sizeof pts[0]; i++) {
		assert_true(bson_decimal128_from_string(pts[i].v, &d));
		bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "k", BCON_DECIMAL128(&d));
		if (route_owned_has_doc(o, doc, &buf, &hint) != pts[i].owned)
			fail_msg("%s: owned %d, want %d", pts[i].v, !pts[i].owned, pts[i].owned);
		check_same(o, doc, &buf, &hint);
		bson_destroy(doc);
	}
	sdb_key_free(&buf);
	route_owned_unref(o);
	route_coll_unref(c);
	bson_destroy(key);
	bson_destroy(mins[0]);
	bson_destroy(maxs[0]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ranged_merge_and_lookup),
		cmocka_unit_test(test_compound_alternating),
		cmocka_unit_test(test_hashed),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_decimal_ties),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
