/* Unit tests of the verification's (_id, hash) lists and the expected-content merge
 * (src/coordinator/migrate_hashes.c). */

/* The module under test, compiled into this binary (statics included). */
#include "../../src/coordinator/migrate_hashes.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static void add_int(mig_hashes *l, int64_t id, uint64_t hash, bool present, uint64_t ts)
{
	bson_value_t v = {.value_type = BSON_TYPE_INT64, .value.v_int64 = id};
	mig_hashes_add(l, &v, hash, present, ts);
}

/* later entries of an _id win; the order is MongoDB's (numbers before strings) */
static void sort_unique_keeps_last(void **state)
{
	(void)state;
	mig_hashes l = {0};
	add_int(&l, 5, 50, true, 1);
	add_int(&l, 1, 10, true, 2);
	add_int(&l, 5, 51, false, 3);
	add_int(&l, 3, 30, true, 4);
	add_int(&l, 5, 52, true, 5);
	bson_value_t s = {.value_type = BSON_TYPE_UTF8};
	s.value.v_utf8.str = "a";
	s.value.v_utf8.len = 1;
	mig_hashes_add(&l, &s, 99, true, 6);
	mig_hashes_sort_unique(&l);
	assert_int_equal(l.n, 4);
	assert_int_equal(l.v[0].id.value.v_int64, 1);
	assert_int_equal(l.v[1].id.value.v_int64, 3);
	assert_int_equal(l.v[2].id.value.v_int64, 5);
	assert_int_equal(l.v[2].hash, 52);
	assert_int_equal(l.v[2].ts, 5);
	assert_int_equal(l.v[3].id.value_type, BSON_TYPE_UTF8);
	bson_value_t k = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 3};
	assert_int_equal(mig_hashes_find(&l, &k), 1); /* 3 (int32) == 3 (int64) */
	k.value.v_int32 = 4;
	assert_int_equal(mig_hashes_find(&l, &k), -1);
	mig_hashes_free(&l);
	assert_int_equal(l.n, 0);
}

/* base {1,2,3,4}, changes: 2 deleted, 3 updated, 6 moved into the chunk, 7 gone (absent,
 * not in base): expected {1, 3', 4, 6} */
static void merge_replaces_changed_ids(void **state)
{
	(void)state;
	mig_hashes base = {0}, ch = {0}, out = {0};
	for (int i = 1; i <= 4; i++)
		add_int(&base, i, (uint64_t)(100 + i), true, 0);
	add_int(&ch, 2, 0, false, 9);
	add_int(&ch, 3, 333, true, 9);
	add_int(&ch, 6, 666, true, 9);
	add_int(&ch, 7, 0, false, 9);
	mig_hashes_merge(&base, &ch, &out);
	assert_int_equal(out.n, 4);
	const int64_t ids[] = {1, 3, 4, 6};
	const uint64_t hs[] = {101, 333, 104, 666};
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(out.v[i].id.value.v_int64, ids[i]);
		assert_int_equal(out.v[i].hash, hs[i]);
	}
	mig_hashes_free(&out);
	/* no changes: the base; everything deleted: empty */
	mig_hashes none = {0};
	mig_hashes_merge(&base, &none, &out);
	assert_int_equal(out.n, 4);
	mig_hashes_free(&out);
	for (int i = 1; i <= 4; i++)
		add_int(&none, i, 0, false, 1);
	mig_hashes_merge(&base, &none, &out);
	assert_int_equal(out.n, 0);
	mig_hashes_free(&out);
	mig_hashes_free(&none);
	mig_hashes_free(&base);
	mig_hashes_free(&ch);
}

static void doc_hash_and_missing_id(void **state)
{
	(void)state;
	mig_hashes l = {0};
	bson_t *d = BCON_NEW("_id", BCON_INT32(7), "v", BCON_UTF8("x"));
	bson_t *noid = BCON_NEW("v", BCON_INT32(1));
	assert_true(mig_hashes_add_doc(&l, d));
	assert_false(mig_hashes_add_doc(&l, noid));
	assert_int_equal(l.n, 1);
	assert_int_equal(l.v[0].hash, XXH64(bson_get_data(d), d->len, 0));
	assert_true(l.v[0].present);
	bson_destroy(d);
	bson_destroy(noid);
	mig_hashes_free(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sort_unique_keeps_last),
		cmocka_unit_test(merge_replaces_changed_ids),
		cmocka_unit_test(doc_hash_and_missing_id),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
