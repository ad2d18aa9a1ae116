/* Unit tests of a store's indexes (storage/index.c through storage/store.c) and of the
 * planner (storage/query.c): duplicate keys, index entries kept or rewritten by updates,
 * multikey marks and their rollback, the integrity check's index findings, key ranges,
 * hashed indexes, plans and counters. The rest of the store: test_storage_store.c. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/store.c"
#include "../../storage/query.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/err.h"
#include "routing/route.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/query.h"
#include "storage/store.h"

#include "store_fixture.h"

static void test_unique_index_duplicate(void **state)
{
	fx *f = *state;
	begin_w(f);
	assert_int_equal(insert(f, 1, 5, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1", "unique",
				BCON_BOOL(true));
	bool created = false;
	int code = 0;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	assert_true(created);
	/* same spec again: nothing to do */
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 SDB_EEXISTS);
	bson_destroy(spec);
	commit(f);
	begin_w(f);
	sdb_store_savepoint(f->c);
	sdb_store_dup dup = {0};
	assert_int_equal(insert(f, 2, 5, &dup), SDB_EEXISTS);
	sdb_store_savepoint_rollback(f->c);
	assert_true(dup.set);
	assert_string_equal(dup.errmsg, "E11000 duplicate key error collection: db.c index: a_1 "
					"dup key: { a: 5 }");
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, &dup.key_value, "a"));
	assert_int_equal(bson_iter_int32(&it), 5);
	sdb_store_dup_clear(&dup);
	assert_int_equal(insert(f, 1, 6, &dup), SDB_EEXISTS);
	assert_string_equal(dup.errmsg, "E11000 duplicate key error collection: db.c index: _id_ "
					"dup key: { _id: 1 }");
	sdb_store_dup_clear(&dup);
	commit(f);
	/* the failed items left nothing behind */
	assert_count_and_clean(f, 1);
}

static void create_index(fx *f, bson_t *spec)
{
	bool created = false;
	int code = 0;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	assert_true(created);
	bson_destroy(spec);
}

/* Update document id to upd with sdb_store_update_stored (the stored image read by
 * sdb_store_get_by_id, as a query would give it), in its own write transaction; returns
 * its status. */
static int update_stored(fx *f, int id, bson_t *upd)
{
	bson_t id_doc = BSON_INITIALIZER, stored;
	bson_iter_t it;
	BSON_APPEND_INT32(&id_doc, "_id", id);
	assert_true(bson_iter_init_find(&it, &id_doc, "_id"));
	begin_w(f);
	assert_int_equal(sdb_store_get_by_id(f->c, "db", "c", &it, &stored, f->err,
					     sizeof f->err),
			 0);
	int rc = sdb_store_update_stored(f->c, "db", "c", &stored, upd, SDB_STORE_UPD_MODIFIER,
					 NULL, NULL, NULL, f->err, sizeof f->err);
	if (rc == 0)
		commit(f);
	else
		sdb_store_rollback(f->c);
	bson_destroy(&stored);
	bson_destroy(&id_doc);
	bson_destroy(upd);
	return rc;
}

/* Updates rewrite exactly the index entries whose keys changed: the integrity check finds
 * every index holding exactly its documents' keys after updates that keep an index's keys
 * (a field it does not cover; a scalar that becomes a one-element array, which must still
 * mark the index multikey), change them, make a sparse index's field appear and vanish,
 * and move a document in and out of a partial index; a unique index refuses a changed
 * key that clashes and keeps an unchanged one. */
static void test_update_rewrites_only_changed_index_entries(void **state)
{
	fx *f = *state;
	begin_w(f);
	for (int i = 1; i <= 3; i++)
		assert_int_equal(insert(f, i, i * 10, NULL), 0);
	create_index(f, BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1"));
	create_index(f, BCON_NEW("key", "{", "b", BCON_INT32(1), "}", "name", "b_1", "sparse",
				 BCON_BOOL(true)));
	create_index(f, BCON_NEW("key", "{", "a", BCON_INT32(-1), "}", "name", "a_-1_u",
				 "unique", BCON_BOOL(true)));
	create_index(f, BCON_NEW("key", "{", "c", BCON_INT32(1), "}", "name", "c_1",
				 "partialFilterExpression", "{", "c", "{", "$gt", BCON_INT32(5),
				 "}", "}"));
	commit(f);

	/* a field no index covers: every index keeps its entries */
	assert_int_equal(update_stored(f, 1, BCON_NEW("_id", BCON_INT32(1), "a", BCON_INT32(10),
						     "z", BCON_UTF8("x"))),
			 0);
	/* same keys, now an array: a_1 and the unique index become multikey */
	assert_int_equal(update_stored(f, 1, BCON_NEW("_id", BCON_INT32(1), "a", "[",
						     BCON_INT32(10), "]", "z", BCON_UTF8("x"))),
			 0);
	/* keys that change; a sparse field and a partial index's field appear */
	assert_int_equal(update_stored(f, 2, BCON_NEW("_id", BCON_INT32(2), "a", BCON_INT32(21),
						     "b", BCON_INT32(7), "c", BCON_INT32(9))),
			 0);
	/* the unique index: another document's key is refused, nothing written */
	assert_int_equal(update_stored(f, 3, BCON_NEW("_id", BCON_INT32(3), "a", BCON_INT32(21))),
			 SDB_EEXISTS);
	/* the sparse field vanishes, the document leaves the partial index */
	assert_int_equal(update_stored(f, 2, BCON_NEW("_id", BCON_INT32(2), "a", BCON_INT32(21),
						     "c", BCON_INT32(1))),
			 0);
	/* no document with that _id: SDB_ENOTFOUND */
	bson_t *ghost = BCON_NEW("_id", BCON_INT32(9), "a", BCON_INT32(90));
	begin_w(f);
	assert_int_equal(sdb_store_update_stored(f->c, "db", "c", ghost, ghost,
						 SDB_STORE_UPD_REPLACE, NULL, NULL, NULL, f->err,
						 sizeof f->err),
			 SDB_ENOTFOUND);
	commit(f);
	bson_destroy(ghost);

	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	const sdb_store_coll *co = NULL;
	assert_int_equal(sdb_store_coll_get(f->c, "db", "c", &co, f->err, sizeof f->err), 0);
	assert_int_equal(co->n_indexes, 4);
	assert_string_equal(co->indexes[0].name, "a_1");
	assert_true(co->indexes[0].multikey);
	assert_true(co->indexes[2].multikey);
	assert_false(co->indexes[1].multikey);
	assert_store_clean(f);
	assert_count_and_clean(f, 3);
}

/* A write transaction outside an apply that marks an index multikey (in place in the
 * connection's catalog cache) and then rolls back whole (sdb_store_rollback, here after a
 * unique index refused the same update) must not leave that connection's cache saying
 * multikey: the catalog on disk says not and catalog_gen is back to the cache's, so no
 * reload undoes it, and the connection's next array key then does not mark the index in
 * the catalog. Every other connection (and a restart) would plan the index as
 * non-multikey while it holds several keys per document. (A shard's writes run inside an
 * apply, whose rollback reloads the cache; this is the store API's other write path.) */
static void test_rolled_back_multikey_mark_leaves_no_stale_cache(void **state)
{
	fx *f = *state;
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1), "a", BCON_INT32(1), "u", BCON_INT32(1));
	bson_t *d2 = BCON_NEW("_id", BCON_INT32(2), "a", BCON_INT32(2), "u", BCON_INT32(2));
	bson_t *d3 = BCON_NEW("_id", BCON_INT32(3), "a", "[", BCON_INT32(0), BCON_INT32(5), "]",
			      "u", BCON_INT32(3));
	begin_w(f);
	assert_int_equal(sdb_store_insert(f->c, "db", "c", d1, NULL, NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_insert(f->c, "db", "c", d2, NULL, NULL, f->err, sizeof f->err),
			 0);
	create_index(f, BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1"));
	create_index(f, BCON_NEW("key", "{", "u", BCON_INT32(1), "}", "name", "u_1", "unique",
				 BCON_BOOL(true)));
	commit(f);

	/* a_1 becomes multikey, then u_1 refuses the update: the transaction rolls back */
	assert_int_equal(update_stored(f, 1, BCON_NEW("_id", BCON_INT32(1), "a", "[",
						     BCON_INT32(1), BCON_INT32(2), "]", "u",
						     BCON_INT32(2))),
			 SDB_EEXISTS);
	/* the same connection then stores an array under a_1 */
	begin_w(f);
	assert_int_equal(sdb_store_insert(f->c, "db", "c", d3, NULL, NULL, f->err, sizeof f->err),
			 0);
	commit(f);

	/* what another connection reads from the catalog: a_1 is multikey */
	sdb_store_conn *c2 = NULL;
	assert_int_equal(sdb_store_conn_open(f->st, &c2, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_begin(c2, false, f->err, sizeof f->err), 0);
	const sdb_store_coll *co = NULL;
	assert_int_equal(sdb_store_coll_get(c2, "db", "c", &co, f->err, sizeof f->err), 0);
	assert_non_null(co);
	assert_int_equal(co->n_indexes, 2);
	assert_string_equal(co->indexes[0].name, "a_1");
	assert_true(co->indexes[0].multikey);
	assert_false(co->indexes[1].multikey);
	bson_t problems = BSON_INITIALIZER;
	int np = -1;
	assert_int_equal(sdb_store_check(c2, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 0);
	bson_destroy(&problems);
	sdb_store_rollback(c2);
	sdb_store_conn_close(c2);
	assert_count_and_clean(f, 3);
	bson_destroy(d1);
	bson_destroy(d2);
	bson_destroy(d3);
}

static void test_check_finds_a_missing_index_entry(void **state)
{
	fx *f = *state;
	begin_w(f);
	for (int i = 0; i < 5; i++)
		assert_int_equal(insert(f, i, i * 10, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	commit(f);
	/* damage the index behind the store's back */
	char path[300];
	snprintf(path, sizeof path, "%s/shard.db", f->dir);
	sqlite3 *db;
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	assert_int_equal(sqlite3_exec(db, "DELETE FROM i_2 WHERE k = (SELECT min(k) FROM i_2)",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t problems = BSON_INITIALIZER;
	int np = 0;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 2); /* a missing key, and the entry count */
	bson_destroy(&problems);
	sdb_store_rollback(f->c);
}

/* sdb_store_check finds an index whose catalog entry says not multikey while a document
 * gives it an array (the planner would intersect bounds and take sorts from it): here the
 * flag cleared behind the store's back, as a lost multikey mark leaves it. */
static void test_check_finds_an_index_not_marked_multikey(void **state)
{
	fx *f = *state;
	bson_t *d = BCON_NEW("_id", BCON_INT32(1), "a", "[", BCON_INT32(1), BCON_INT32(2), "]");
	begin_w(f);
	assert_int_equal(insert(f, 0, 5, NULL), 0);
	assert_int_equal(sdb_store_insert(f->c, "db", "c", d, NULL, NULL, f->err, sizeof f->err),
			 0);
	create_index(f, BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1"));
	commit(f);
	assert_count_and_clean(f, 2);
	char path[300];
	snprintf(path, sizeof path, "%s/shard.db", f->dir);
	sqlite3 *db;
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	assert_int_equal(sqlite3_exec(db,
				      "UPDATE catalog_index SET multikey = 0 WHERE name = 'a_1'; "
				      "UPDATE meta SET v = v + 1 WHERE k = 'catalog_gen'",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t problems = BSON_INITIALIZER;
	int np = 0;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 1);
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, &problems, "0"));
	assert_non_null(strstr(bson_iter_utf8(&it, NULL), "index a_1 is not marked multikey"));
	bson_destroy(&problems);
	sdb_store_rollback(f->c);
	bson_destroy(d);
}

/* sdb_query_spec.range_field (issue #17, a migration reading one chunk): an index scan of
 * the first field's values between the bounds, on a descending index and on _id; the
 * process totals count what each query examined. */
static int64_t range_count(fx *f, const char *field, int lo, bool have_lo, int hi, bool have_hi,
			   bool hi_incl, int64_t *docs)
{
	bson_value_t vlo = {.value_type = BSON_TYPE_INT32, .value.v_int32 = lo};
	bson_value_t vhi = {.value_type = BSON_TYPE_INT32, .value.v_int32 = hi};
	sdb_query_spec qs = {.range_field = field,
			     .range_lo = have_lo ? &vlo : NULL,
			     .range_hi = have_hi ? &vhi : NULL,
			     .range_hi_incl = hi_incl};
	sdb_query *q = NULL;
	int code = 0;
	const bson_t *d;
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs, &q, &code, f->err, sizeof f->err),
			 0);
	int64_t n = 0, ret, keys;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1)
		n++;
	sdb_query_stats(q, &ret, &keys, docs);
	sdb_query_free(q);
	return n;
}

static void test_query_key_range(void **state)
{
	fx *f = *state;
	begin_w(f);
	for (int i = 0; i < 100; i++)
		assert_int_equal(insert(f, i, i % 10, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(-1), "}", "name", "a_-1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	uint64_t k0, d0, r0, k1, d1, r1;
	sdb_query_totals(&k0, &d0, &r0);
	int64_t docs = 0;
	assert_int_equal(range_count(f, "a", 3, true, 5, true, false, &docs), 20);
	assert_int_equal(docs, 20); /* only the range is read */
	assert_int_equal(range_count(f, "a", 3, true, 5, true, true, &docs), 30);
	assert_int_equal(docs, 30);
	assert_int_equal(range_count(f, "a", 0, false, 2, true, false, &docs), 20);
	assert_int_equal(docs, 20);
	assert_int_equal(range_count(f, "a", 8, true, 0, false, false, &docs), 20);
	assert_int_equal(docs, 20);
	assert_int_equal(range_count(f, "_id", 10, true, 20, true, false, &docs), 10);
	assert_int_equal(docs, 10);
	/* no index has the field first: planned as without a range (every document) */
	assert_int_equal(range_count(f, "b", 10, true, 20, true, false, &docs), 100);
	sdb_query_totals(&k1, &d1, &r1);
	assert_int_equal(d1 - d0, 20 + 30 + 20 + 20 + 10 + 100);
	assert_int_equal(r1 - r0, 20 + 30 + 20 + 20 + 10 + 100);
	sdb_store_rollback(f->c);
}

/* Hashed indexes {a: "hashed"}: the key is NumberLong(sdb_keyenc_hash_value(a)), the very
 * hash the router routes on (route_hash_value); documents are found by a range of hashes
 * (sdb_query_spec.range_hashed); arrays are refused (16766); the planner never bounds a
 * range of a's values or a sort with it. */
typedef struct hashed_scan {
	int64_t n, docs, bad; /* returned, examined, returned outside [lo, hi) */
} hashed_scan;

static hashed_scan hashed_range(fx *f, const bson_value_t *lo, const bson_value_t *hi)
{
	sdb_query_spec qs = {.range_field = "a", .range_hashed = true, .range_lo = lo,
			     .range_hi = hi};
	sdb_query *q = NULL;
	int code = 0;
	const bson_t *d;
	hashed_scan r = {0};
	int64_t ret, keys;
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs, &q, &code, f->err, sizeof f->err),
			 0);
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1) {
		bson_iter_t it;
		int64_t h = route_hash_value(bson_iter_init_find(&it, d, "a") ? bson_iter_value(&it)
									    : NULL);
		if ((lo && h < lo->value.v_int64) || (hi && h >= hi->value.v_int64))
			r.bad++;
		r.n++;
	}
	sdb_query_stats(q, &ret, &keys, &r.docs);
	sdb_query_free(q);
	return r;
}

static void test_hashed_index(void **state)
{
	fx *f = *state;
	bool created;
	int code = 0;
	/* the router's hash, one function: equal numbers of any type hash equally */
	bson_value_t i5 = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 5};
	bson_value_t l5 = {.value_type = BSON_TYPE_INT64, .value.v_int64 = 5};
	bson_value_t d5 = {.value_type = BSON_TYPE_DOUBLE, .value.v_double = 5.0};
	bson_value_t s5 = {.value_type = BSON_TYPE_UTF8};
	s5.value.v_utf8.str = "5";
	s5.value.v_utf8.len = 1;
	bson_value_t nul = {.value_type = BSON_TYPE_NULL};
	assert_true(sdb_keyenc_hash_value(&i5) == route_hash_value(&i5));
	assert_true(sdb_keyenc_hash_value(&i5) == sdb_keyenc_hash_value(&l5));
	assert_true(sdb_keyenc_hash_value(&i5) == sdb_keyenc_hash_value(&d5));
	assert_true(sdb_keyenc_hash_value(&s5) == route_hash_value(&s5));
	assert_true(sdb_keyenc_hash_value(&s5) != sdb_keyenc_hash_value(&i5));
	assert_true(sdb_keyenc_hash_value(NULL) == sdb_keyenc_hash_value(&nul));
	assert_true(sdb_keyenc_hash_value(&nul) == route_hash_value(NULL));

	/* 300 documents before the index (built over them), 100 after */
	begin_w(f);
	for (int i = 0; i < 300; i++)
		assert_int_equal(insert(f, i, i, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_UTF8("hashed"), "}", "name", "a_hashed");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	assert_true(created);
	bson_destroy(spec);
	for (int i = 300; i < 390; i++)
		assert_int_equal(insert(f, i, i, NULL), 0);
	/* other types, and a missing a (indexed as null's hash) */
	bson_t *odd[] = {BCON_NEW("_id", BCON_INT32(390), "a", BCON_DOUBLE(5.0)),
			 BCON_NEW("_id", BCON_INT32(391), "a", BCON_INT64(5)),
			 BCON_NEW("_id", BCON_INT32(392), "a", BCON_UTF8("5")),
			 BCON_NEW("_id", BCON_INT32(393), "a", "{", "b", BCON_INT32(1), "}"),
			 BCON_NEW("_id", BCON_INT32(394)),
			 BCON_NEW("_id", BCON_INT32(395), "a", BCON_NULL)};
	for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
		assert_int_equal(
			sdb_store_insert(f->c, "db", "c", odd[i], NULL, NULL, f->err, sizeof f->err),
			0);
		bson_destroy(odd[i]);
	}
	/* an array is refused with MongoDB's code (the statement rolled back, as the shard's
	 * savepoint per document does) */
	bson_t *arr = BCON_NEW("_id", BCON_INT32(1000), "a", "[", BCON_INT32(1), "]");
	f->c->write_code = 0;
	assert_int_equal(sdb_store_savepoint(f->c), 0);
	assert_int_equal(sdb_store_insert(f->c, "db", "c", arr, NULL, NULL, f->err, sizeof f->err),
			 SDB_EINVAL);
	sdb_store_savepoint_rollback(f->c);
	assert_int_equal(f->c->write_code, 16766);
	assert_non_null(strstr(f->err, "hashed indexes do not currently support array values"));
	bson_destroy(arr);
	commit(f);

	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t problems = BSON_INITIALIZER;
	int np = -1;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	if (np) {
		char *js = bson_as_relaxed_extended_json(&problems, NULL);
		fprintf(stderr, "%s\n", js);
		bson_free(js);
	}
	assert_int_equal(np, 0);
	bson_destroy(&problems);
	const sdb_store_coll *co = NULL;
	assert_int_equal(sdb_store_coll_get(f->c, "db", "c", &co, f->err, sizeof f->err), 0);
	assert_int_equal(co->n_indexes, 1);
	assert_true(co->indexes[0].hashed && !co->indexes[0].multikey);
	/* listIndexes shows the pattern as given */
	bson_iter_t it;
	assert_true(bson_iter_init(&it, co->indexes[0].key) && bson_iter_next(&it));
	assert_string_equal(bson_iter_key(&it), "a");
	assert_string_equal(bson_iter_utf8(&it, NULL), "hashed");

	/* ranges of the hash space: the halves partition the 396 documents and each reads
	 * only its own; a narrow range reads a few */
	bson_value_t zero = {.value_type = BSON_TYPE_INT64, .value.v_int64 = 0};
	hashed_scan lo = hashed_range(f, NULL, &zero), hi = hashed_range(f, &zero, NULL);
	assert_int_equal(lo.n + hi.n, 396);
	assert_true(lo.n > 100 && hi.n > 100);
	assert_int_equal(lo.bad + hi.bad, 0);
	assert_int_equal(lo.docs, lo.n);
	assert_int_equal(hi.docs, hi.n);
	bson_value_t q1 = {.value_type = BSON_TYPE_INT64, .value.v_int64 = INT64_MIN / 2};
	bson_value_t q2 = {.value_type = BSON_TYPE_INT64, .value.v_int64 = INT64_MAX / 2};
	hashed_scan mid = hashed_range(f, &q1, &q2);
	assert_int_equal(mid.bad, 0);
	assert_int_equal(mid.docs, mid.n);
	assert_true(mid.n > 50 && mid.n < 396);
	/* 5, 5.0 and NumberLong(5) share one hash: a point range of it finds all three */
	bson_value_t h5 = {.value_type = BSON_TYPE_INT64,
			   .value.v_int64 = sdb_keyenc_hash_value(&i5)};
	bson_value_t h5n = {.value_type = BSON_TYPE_INT64, .value.v_int64 = h5.value.v_int64 + 1};
	hashed_scan five = hashed_range(f, &h5, &h5n);
	assert_int_equal(five.n, 3);
	assert_int_equal(five.docs, 3);
	/* missing and null: null's hash */
	bson_value_t hn = {.value_type = BSON_TYPE_INT64,
			   .value.v_int64 = sdb_keyenc_hash_value(NULL)};
	bson_value_t hnn = {.value_type = BSON_TYPE_INT64, .value.v_int64 = hn.value.v_int64 + 1};
	assert_int_equal(hashed_range(f, &hn, &hnn).n, 2);
	/* a range of a's VALUES never uses the hashed index: planned as without a range */
	int64_t docs = 0;
	assert_int_equal(range_count(f, "a", 10, true, 20, false, false, &docs), 396);
	assert_int_equal(docs, 396);
	/* nor a filter's range, nor a sort: the results are exact */
	bson_t *filter = BCON_NEW("a", "{", "$gte", BCON_INT32(10), "$lt", BCON_INT32(20), "}");
	bson_t *sort = BCON_NEW("a", BCON_INT32(1));
	sdb_query_spec qs = {.filter = filter, .sort = sort};
	sdb_query *q = NULL;
	const bson_t *d;
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs, &q, &code, f->err, sizeof f->err),
			 0);
	int n = 0;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1) {
		assert_true(bson_iter_init_find(&it, d, "a"));
		assert_int_equal(bson_iter_as_int64(&it), 10 + n);
		n++;
	}
	assert_int_equal(n, 10);
	sdb_query_free(q);
	bson_destroy(filter);
	bson_destroy(sort);
	/* equality and $in on a use the hashed index (MongoDB does): the points' hashes,
	 * only the matching documents read (5, 5.0, NumberLong(5); "5"; null and missing) */
	bson_t *eqs[] = {BCON_NEW("a", BCON_INT32(5)),
			 BCON_NEW("a", "{", "$in", "[", BCON_INT32(5), BCON_UTF8("5"), BCON_NULL,
				  "]", "}"),
			 BCON_NEW("a", "{", "$in", "[", "]", "}")};
	int64_t want[] = {3, 6, 0};
	for (size_t i = 0; i < 3; i++) {
		sdb_query_spec qe = {.filter = eqs[i]};
		assert_int_equal(
			sdb_query_open(f->c, "db", "c", &qe, &q, &code, f->err, sizeof f->err), 0);
		n = 0;
		while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1)
			n++;
		int64_t ret, keys, examined;
		sdb_query_stats(q, &ret, &keys, &examined);
		assert_int_equal(n, want[i]);
		assert_int_equal(examined, want[i]);
		if (i == 0) {
			bson_t ex = BSON_INITIALIZER;
			bson_iter_t sub;
			sdb_query_explain(q, true, &ex);
			assert_true(bson_iter_init(&it, &ex));
			assert_true(bson_iter_find_descendant(&it, "queryPlanner.winningPlan.indexName",
							      &sub));
			assert_string_equal(bson_iter_utf8(&sub, NULL), "a_hashed");
			bson_destroy(&ex);
		}
		sdb_query_free(q);
		bson_destroy(eqs[i]);
	}
	/* by hint: the equality's hashes too; a range by hint scans the index whole */
	filter = BCON_NEW("a", "{", "$gt", BCON_INT32(380), "}");
	bson_t *hint_doc = BCON_NEW("h", BCON_UTF8("a_hashed"));
	assert_true(bson_iter_init_find(&it, hint_doc, "h"));
	sdb_query_spec qh = {.filter = filter, .hint = &it};
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qh, &q, &code, f->err, sizeof f->err),
			 0);
	n = 0;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1)
		n++;
	assert_int_equal(n, 9); /* 381..389 */
	int64_t hret, hkeys, hdocs;
	sdb_query_stats(q, &hret, &hkeys, &hdocs);
	assert_int_equal(hdocs, 396);
	sdb_query_free(q);
	bson_destroy(filter);
	bson_destroy(hint_doc);
	sdb_store_rollback(f->c);

	/* refused: unique hashed (16764), compound hashed (67); a build over an array (16766) */
	begin_w(f);
	spec = BCON_NEW("key", "{", "b", BCON_UTF8("hashed"), "}", "name", "b_hashed", "unique",
			BCON_BOOL(true));
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(code, 16764);
	bson_destroy(spec);
	spec = BCON_NEW("key", "{", "b", BCON_UTF8("hashed"), "c", BCON_INT32(1), "}", "name",
			"b_hashed_c_1");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(code, 67);
	bson_destroy(spec);
	arr = BCON_NEW("_id", BCON_INT32(1), "x", "{", "y", "[", BCON_INT32(1), "]", "}");
	assert_int_equal(sdb_store_insert(f->c, "db", "c2", arr, NULL, NULL, f->err, sizeof f->err),
			 0);
	bson_destroy(arr);
	spec = BCON_NEW("key", "{", "x.y", BCON_UTF8("hashed"), "}", "name", "x.y_hashed");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c2", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(code, 16766);
	bson_destroy(spec);
	sdb_store_rollback(f->c);
}

static void test_query_plans_and_counters(void **state)
{
	fx *f = *state;
	begin_w(f);
	for (int i = 0; i < 100; i++)
		assert_int_equal(insert(f, i, i % 10, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(-1), "}", "name", "a_-1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	/* range on a descending index, sorted ascending by the same field */
	bson_t *filter = BCON_NEW("a", "{", "$gte", BCON_INT32(3), "$lt", BCON_INT32(5), "}");
	bson_t *sort = BCON_NEW("a", BCON_INT32(1), "_id", BCON_INT32(1));
	sdb_query_spec qs = {.filter = filter, .sort = sort, .limit = 0};
	sdb_query *q = NULL;
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs, &q, &code, f->err, sizeof f->err),
			 0);
	const bson_t *d;
	int n = 0, last_a = -1, last_id = -1;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1) {
		bson_iter_t it;
		assert_true(bson_iter_init_find(&it, d, "a"));
		int a = bson_iter_int32(&it);
		assert_true(bson_iter_init_find(&it, d, "_id"));
		int id = bson_iter_int32(&it);
		assert_true(a == 3 || a == 4);
		assert_true(a > last_a || (a == last_a && id > last_id));
		last_a = a;
		last_id = id;
		n++;
	}
	assert_int_equal(n, 20);
	int64_t ret, keys, docs;
	sdb_query_stats(q, &ret, &keys, &docs);
	assert_int_equal(ret, 20);
	assert_int_equal(docs, 20);
	assert_int_equal(keys, 20); /* not multikey: both predicates bound the scan */
	bson_t ex = BSON_INITIALIZER;
	sdb_query_explain(q, true, &ex);
	bson_iter_t it;
	assert_true(bson_iter_init(&it, &ex));
	bson_iter_t sub;
	assert_true(bson_iter_find_descendant(&it, "queryPlanner.winningPlan.indexName", &sub));
	assert_string_equal(bson_iter_utf8(&sub, NULL), "a_-1");
	bson_destroy(&ex);
	sdb_query_free(q);
	/* limit and skip without an index */
	bson_t empty = BSON_INITIALIZER;
	sdb_query_spec qs2 = {.filter = &empty, .skip = 10, .limit = 5};
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs2, &q, &code, f->err, sizeof f->err),
			 0);
	n = 0;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1) {
		assert_true(bson_iter_init_find(&it, d, "_id"));
		assert_int_equal(bson_iter_int32(&it), 10 + n);
		n++;
	}
	assert_int_equal(n, 5);
	sdb_query_free(q);
	/* a bad filter is a BadValue with MongoDB's code */
	bson_t *bad = BCON_NEW("a", "{", "$bogus", BCON_INT32(1), "}");
	sdb_query_spec qs3 = {.filter = bad};
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs3, &q, &code, f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(code, 2);
	bson_destroy(bad);
	sdb_store_rollback(f->c);
	/* an array makes the index multikey: still exactly the matching documents, once each */
	begin_w(f);
	bson_t *arr = BCON_NEW("_id", BCON_INT32(1000), "a", "[", BCON_INT32(3), BCON_INT32(4),
			       BCON_INT32(100), "]");
	assert_int_equal(sdb_store_insert(f->c, "db", "c", arr, NULL, NULL, f->err, sizeof f->err),
			 0);
	bson_destroy(arr);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	const sdb_store_coll *co = NULL;
	assert_int_equal(sdb_store_coll_get(f->c, "db", "c", &co, f->err, sizeof f->err), 0);
	assert_true(co->indexes[0].multikey);
	assert_int_equal(sdb_query_open(f->c, "db", "c", &qs, &q, &code, f->err, sizeof f->err),
			 0);
	n = 0;
	int seen_1000 = 0;
	while (sdb_query_next(q, &d, &code, f->err, sizeof f->err) == 1) {
		assert_true(bson_iter_init_find(&it, d, "_id"));
		if (bson_iter_int32(&it) == 1000)
			seen_1000++;
		n++;
	}
	assert_int_equal(n, 21);
	assert_int_equal(seen_1000, 1);
	sdb_query_free(q);
	bson_destroy(filter);
	bson_destroy(sort);
	sdb_store_rollback(f->c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_unique_index_duplicate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_update_rewrites_only_changed_index_entries,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_rolled_back_multikey_mark_leaves_no_stale_cache,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_check_finds_a_missing_index_entry, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_check_finds_an_index_not_marked_multikey,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_query_key_range, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hashed_index, setup, teardown),
		cmocka_unit_test_setup_teardown(test_query_plans_and_counters, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
