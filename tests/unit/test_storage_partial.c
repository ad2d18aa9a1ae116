/* Unit tests of storage/partial.c: when two partialFilterExpressions are the same index
 * option (store_partial_same) and which query filters imply a partial index's filter
 * (store_partial_implied). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/partial.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "storage/matcher.h"
#include "storage/store.h"
#include "storage/store_int.h"

/* store_partial_implied (storage/partial.c): which query filters imply a partial index's
 * filter (the planner may use the index only then). */
static bool implied(const char *query_json, const char *pfe_json)
{
	bson_error_t e;
	bson_t *q = bson_new_from_json((const uint8_t *)query_json, -1, &e);
	bson_t *pf = bson_new_from_json((const uint8_t *)pfe_json, -1, &e);
	assert_non_null(q);
	assert_non_null(pf);
	sdb_store_index ix;
	memset(&ix, 0, sizeof ix);
	ix.spec = bson_new();
	BSON_APPEND_DOCUMENT(ix.spec, "partialFilterExpression", pf);
	char err[256];
	assert_int_equal(sdb_matcher_new(pf, &ix.partial, NULL, err, sizeof err), 0);
	bool r = store_partial_implied(q, &ix);
	sdb_matcher_free(ix.partial);
	bson_destroy(ix.spec);
	bson_destroy(pf);
	bson_destroy(q);
	return r;
}

/* store_partial_same on two filters in extended JSON. */
static bool same_filter(const char *a_json, const char *b_json)
{
	bson_error_t e;
	bson_t *a = bson_new_from_json((const uint8_t *)a_json, -1, &e);
	bson_t *b = bson_new_from_json((const uint8_t *)b_json, -1, &e);
	assert_non_null(a);
	assert_non_null(b);
	bson_t x = BSON_INITIALIZER, y = BSON_INITIALIZER;
	BSON_APPEND_DOCUMENT(&x, "f", a);
	BSON_APPEND_DOCUMENT(&y, "f", b);
	bson_iter_t ia, ib;
	assert_true(bson_iter_init_find(&ia, &x, "f"));
	assert_true(bson_iter_init_find(&ib, &y, "f"));
	bool r = store_partial_same(&ia, &ib);
	assert_true(store_partial_same(&ib, &ia) == r);
	bson_destroy(&x);
	bson_destroy(&y);
	bson_destroy(a);
	bson_destroy(b);
	return r;
}

static void test_partial_filter_identity(void **state)
{
	(void)state;
	assert_true(same_filter("{\"a\": {\"$gt\": 1, \"$lt\": 5}}",
				"{\"a\": {\"$lt\": 5, \"$gt\": 1}}"));
	assert_true(same_filter("{\"a\": {\"$gt\": 1, \"$lt\": 5}}",
				"{\"$and\": [{\"a\": {\"$lt\": 5}}, {\"a\": {\"$gt\": 1}}]}"));
	assert_true(same_filter("{\"a\": {\"$in\": [1, 2]}}", "{\"a\": {\"$in\": [2, 1, 1.0]}}"));
	assert_true(same_filter("{\"a\": {\"$eq\": 1}}", "{\"a\": 1}"));
	assert_true(same_filter("{\"a\": {\"$in\": [1]}}", "{\"a\": 1}"));
	assert_true(same_filter("{\"$and\": [{\"a\": 1}]}", "{\"a\": 1}"));
	assert_true(same_filter("{\"$or\": [{\"a\": 1, \"b\": 1}]}", "{\"b\": 1, \"a\": 1}"));
	assert_true(same_filter("{\"$or\": [{\"a\": 1}, {\"$or\": [{\"b\": 1}, {\"c\": 1}]}]}",
				"{\"$or\": [{\"c\": 1}, {\"b\": 1}, {\"a\": 1}]}"));
	assert_true(same_filter("{\"a\": {\"$numberDouble\": \"NaN\"}}",
				"{\"a\": {\"$numberDecimal\": \"NaN\"}}"));
	assert_false(same_filter("{\"a\": 1}", "{\"a\": 2}"));
	assert_false(same_filter("{\"a\": \"x\"}", "{\"a\": \"X\"}"));
	assert_false(same_filter("{\"a\": {\"$gt\": 1}}", "{\"a\": {\"$gte\": 1}}"));
	assert_false(same_filter("{\"$or\": [{\"a\": 1}, {\"b\": 1}]}", "{\"a\": 1, \"b\": 1}"));
	assert_false(same_filter("{\"a\": {\"$in\": [1, 2]}}", "{\"a\": {\"$in\": [1]}}"));
	assert_false(same_filter("{\"a\": 1, \"b\": 1}", "{\"a\": 1}"));
	/* ($type sets: test_index_options.py, libbson's JSON parser reads "$type" as
	 * legacy extended JSON) */
	/* $all of values: an $and of equalities */
	assert_true(same_filter("{\"a\": {\"$all\": [1]}}", "{\"a\": 1}"));
	assert_true(same_filter("{\"a\": {\"$all\": [1, 2]}}",
				"{\"$and\": [{\"a\": 2}, {\"a\": 1}]}"));
	assert_false(same_filter("{\"a\": {\"$all\": [1, 2]}}", "{\"a\": 1}"));
}

static void test_partial_filter_implication(void **state)
{
	(void)state;
	/* the same predicate, and narrower ranges of the same type */
	assert_true(implied("{\"a\": 1, \"x\": 6}", "{\"a\": 1}"));
	assert_true(implied("{\"x\": {\"$gt\": 7}}", "{\"x\": {\"$gt\": 5}}"));
	assert_true(implied("{\"x\": {\"$gte\": 6}}", "{\"x\": {\"$gt\": 5}}"));
	assert_true(implied("{\"x\": 6}", "{\"x\": {\"$gt\": 5}}"));
	assert_true(implied("{\"x\": {\"$gt\": 10}}", "{\"x\": {\"$gte\": 10}}"));
	assert_true(implied("{\"a\": {\"$lte\": 1}}", "{\"a\": {\"$lte\": 1.5}}"));
	assert_false(implied("{\"a\": {\"$lt\": 1.6}}", "{\"a\": {\"$lte\": 1.5}}"));
	assert_false(implied("{\"x\": {\"$gte\": 5}}", "{\"x\": {\"$gt\": 5}}"));
	assert_false(implied("{\"x\": 5}", "{\"x\": {\"$gt\": 5}}"));
	/* another type bracket never implies a range ("b" sorts above 5 but $gt: 5 wants
	 * numbers) */
	assert_false(implied("{\"x\": {\"$gt\": \"b\"}}", "{\"x\": {\"$gt\": 5}}"));
	assert_false(implied("{\"x\": null}", "{\"x\": {\"$lte\": 5}}"));
	/* nothing about the filter's field */
	assert_false(implied("{}", "{\"a\": 1}"));
	assert_false(implied("{\"b\": 1}", "{\"a\": 1}"));
	/* $exists: true by any predicate that needs the field, not by null */
	assert_true(implied("{\"a\": {\"$gt\": 1}}", "{\"a\": {\"$exists\": true}}"));
	assert_true(implied("{\"a\": \"s\"}", "{\"a\": {\"$exists\": true}}"));
	assert_true(implied("{\"a\": {\"$type\": \"int\"}}", "{\"a\": {\"$exists\": true}}"));
	assert_false(implied("{\"a\": null}", "{\"a\": {\"$exists\": true}}"));
	assert_false(implied("{\"a\": {\"$ne\": 1}}", "{\"a\": {\"$exists\": true}}"));
	assert_false(implied("{\"a\": {\"$gte\": {\"$minKey\": 1}}}",
			     "{\"a\": {\"$exists\": true}}"));
	/* $in: a value or a subset of the list */
	assert_true(implied("{\"a\": 3}", "{\"a\": {\"$in\": [3, 5]}}"));
	assert_true(implied("{\"a\": {\"$in\": [5]}}", "{\"a\": {\"$in\": [3, 5]}}"));
	assert_false(implied("{\"a\": {\"$lt\": 6}}", "{\"a\": {\"$in\": [3, 5]}}"));
	assert_false(implied("{\"a\": {\"$in\": [3, 4]}}", "{\"a\": {\"$in\": [3, 5]}}"));
	/* $and flattened on both sides; every conjunct of the filter is needed */
	assert_true(implied("{\"$and\": [{\"a\": 1}, {\"b\": {\"$gt\": 3}}]}",
			    "{\"a\": 1, \"b\": {\"$gt\": 2}}"));
	assert_false(implied("{\"a\": 1}", "{\"$and\": [{\"a\": 1}, {\"b\": 2}]}"));
	/* $or: one implied branch; a query $or only by the same $or */
	assert_true(implied("{\"a\": 5, \"b\": 5}",
			    "{\"$or\": [{\"a\": 3}, {\"$and\": [{\"a\": 5}, {\"b\": 5}]}]}"));
	assert_false(implied("{\"a\": 5, \"b\": 1}",
			     "{\"$or\": [{\"a\": 3}, {\"$and\": [{\"a\": 5}, {\"b\": 5}]}]}"));
	assert_true(implied("{\"$or\": [{\"a\": 1}, {\"b\": 1}]}",
			    "{\"$or\": [{\"a\": 1}, {\"b\": 1}]}"));
	assert_false(implied("{\"$or\": [{\"a\": 1}, {\"c\": 1}]}",
			     "{\"$or\": [{\"a\": 1}, {\"b\": 1}]}"));
	/* $all of values: an $and of equalities, on either side */
	assert_true(implied("{\"a\": {\"$all\": [1, 2]}}", "{\"a\": 1}"));
	assert_true(implied("{\"a\": {\"$all\": [1, 2]}}", "{\"a\": {\"$lt\": 2}}"));
	assert_true(implied("{\"a\": 1, \"b\": 0}", "{\"a\": {\"$all\": [1]}}"));
	assert_false(implied("{\"a\": 1}", "{\"a\": {\"$all\": [1, 2]}}"));
	assert_true(implied("{\"a\": 2, \"$and\": [{\"a\": 1}]}",
			    "{\"a\": {\"$all\": [1, 2]}}"));
	/* NaN (double or decimal) equals only NaN, though it sorts below every number
	 * (mongod expression_algo.cpp _isSubsetOf) */
	static const char *const nans[] = {
		"{\"$numberDouble\": \"NaN\"}",
		"{\"$numberDecimal\": \"NaN\"}",
	};
	static const char *const ranges[] = {"$lt", "$lte", "$gt", "$gte"};
	char q[160], f[160];
	for (size_t i = 0; i < 2; i++) {
		for (size_t r = 0; r < 4; r++) {
			snprintf(f, sizeof f, "{\"a\": {\"%s\": 5}}", ranges[r]);
			snprintf(q, sizeof q, "{\"a\": %s}", nans[i]);
			assert_false(implied(q, f));
			for (size_t o = 0; o < 4; o++) {
				snprintf(q, sizeof q, "{\"a\": {\"%s\": %s}}", ranges[o], nans[i]);
				assert_false(implied(q, f));
			}
		}
		/* NaN within NaN: only when both operators match the value itself */
		for (size_t j = 0; j < 2; j++) {
			snprintf(q, sizeof q, "{\"a\": %s}", nans[i]);
			snprintf(f, sizeof f, "{\"a\": {\"$lte\": %s}}", nans[j]);
			assert_true(implied(q, f));
			snprintf(f, sizeof f, "{\"a\": {\"$gte\": %s}}", nans[j]);
			assert_true(implied(q, f));
			snprintf(f, sizeof f, "{\"a\": {\"$in\": [1, %s]}}", nans[j]);
			assert_true(implied(q, f));
			snprintf(f, sizeof f, "{\"a\": {\"$lt\": %s}}", nans[j]);
			assert_false(implied(q, f));
			snprintf(q, sizeof q, "{\"a\": {\"$gte\": %s}}", nans[i]);
			snprintf(f, sizeof f, "{\"a\": {\"$lte\": %s}}", nans[j]);
			assert_true(implied(q, f));
			snprintf(q, sizeof q, "{\"a\": {\"$gt\": %s}}", nans[i]);
			assert_false(implied(q, f));
		}
		snprintf(q, sizeof q, "{\"a\": 5}");
		snprintf(f, sizeof f, "{\"a\": {\"$lte\": %s}}", nans[i]);
		assert_false(implied(q, f));
		snprintf(f, sizeof f, "{\"a\": {\"$in\": [%s]}}", nans[i]);
		assert_false(implied(q, f));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partial_filter_implication),
		cmocka_unit_test(test_partial_filter_identity),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
