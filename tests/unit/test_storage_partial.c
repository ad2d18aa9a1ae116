/* Unit tests of partial indexes: when two partialFilterExpressions are the same index
 * option (store_partial_same) and which query filters imply a partial index's filter
 * (store_partial_implied), both storage/partial.c; the one-time rebuild of partial
 * indexes a release before issue #20 built whole (index.c store_partial_rebuild, run by
 * sdb_store_open). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/partial.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

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

/* The integer the one-row, one-column query sql gives on the SQLite file at path. */
static int64_t file_query_int(const char *path, const char *sql)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	int64_t v;

	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* A store whose partial index was built whole (an entry for every document, as releases
 * before issue #20 built them) and whose meta partial_idx is unset: opening it rebuilds
 * the index under its filter, once. The whole index is made by copying the entries of a
 * full index over the same key and documents in another collection. */
static void test_partial_index_rebuilt_on_open(void **state)
{
	char dir[64], path[128], sql[256], err[512];
	sdb_store *st;
	sdb_store_conn *c;
	bool created;
	int code;

	(void)state;
	snprintf(dir, sizeof dir, "/tmp/sdb-partial-test-XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/shard.db", dir);
	assert_int_equal(sdb_store_open(dir, NULL, &st, err, sizeof err), 0);
	assert_int_equal(sdb_store_conn_open(st, &c, err, sizeof err), 0);
	assert_int_equal(sdb_store_begin(c, true, err, sizeof err), 0);
	for (int i = 1; i <= 4; i++) {
		bson_t *d = BCON_NEW("_id", BCON_INT32(i), "a", BCON_INT32(i));

		assert_int_equal(sdb_store_insert(c, "db", "part", d, NULL, NULL, err, sizeof err), 0);
		assert_int_equal(sdb_store_insert(c, "db", "full", d, NULL, NULL, err, sizeof err), 0);
		bson_destroy(d);
	}
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1",
				"partialFilterExpression", "{", "a", "{", "$gt", BCON_INT32(2), "}",
				"}");
	assert_int_equal(sdb_store_index_create(c, "db", "part", spec, NULL, &created, &code, err,
						sizeof err),
			 0);
	bson_destroy(spec);
	spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	assert_int_equal(sdb_store_index_create(c, "db", "full", spec, NULL, &created, &code, err,
						sizeof err),
			 0);
	bson_destroy(spec);
	assert_int_equal(sdb_store_commit(c, err, sizeof err), 0);
	sdb_store_conn_close(c);
	sdb_store_close(st);

	int64_t part = file_query_int(path, "SELECT tbl FROM catalog_index WHERE coll = 'part'"
					    " AND name = 'a_1'");
	int64_t full = file_query_int(path, "SELECT tbl FROM catalog_index WHERE coll = 'full'"
					    " AND name = 'a_1'");
	snprintf(sql, sizeof sql, "SELECT count(*) FROM i_%lld", (long long)part);
	assert_int_equal(file_query_int(path, sql), 2); /* built under its filter: 3 and 4 */
	assert_int_equal(file_query_int(path, "SELECT v FROM meta WHERE k = 'partial_idx'"), 1);
	{
		sqlite3 *db;
		char w[256];

		snprintf(w, sizeof w,
			 "DELETE FROM meta WHERE k = 'partial_idx';"
			 "INSERT OR IGNORE INTO i_%lld SELECT k, id FROM i_%lld",
			 (long long)part, (long long)full);
		assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
		assert_int_equal(sqlite3_exec(db, w, NULL, NULL, NULL), SQLITE_OK);
		sqlite3_close(db);
	}
	assert_int_equal(file_query_int(path, sql), 4); /* as an old release built it */

	for (int round = 0; round < 2; round++) { /* the second open finds partial_idx = 1 */
		bson_t problems = BSON_INITIALIZER;
		int np = -1;

		assert_int_equal(sdb_store_open(dir, NULL, &st, err, sizeof err), 0);
		assert_int_equal(sdb_store_conn_open(st, &c, err, sizeof err), 0);
		assert_int_equal(sdb_store_begin(c, false, err, sizeof err), 0);
		assert_int_equal(sdb_store_check(c, &problems, &np, err, sizeof err), 0);
		if (np != 0) {
			char *j = bson_as_relaxed_extended_json(&problems, NULL);
			fail_msg("problems after the rebuild: %s", j);
		}
		bson_destroy(&problems);
		sdb_store_rollback(c);
		sdb_store_conn_close(c);
		sdb_store_close(st);
		assert_int_equal(file_query_int(path, sql), 2);
		assert_int_equal(file_query_int(path, "SELECT v FROM meta WHERE k = 'partial_idx'"),
				 1);
	}
	snprintf(sql, sizeof sql, "rm -rf %s", dir);
	assert_int_equal(system(sql), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partial_filter_implication),
		cmocka_unit_test(test_partial_filter_identity),
		cmocka_unit_test(test_partial_index_rebuilt_on_open),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
