/* Unit tests of src/common/fieldscan.c: several top-level fields in one pass, answered as
 * bson_iter_init_find answers each (first occurrence), prefix names, and the mask's limit. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/fieldscan.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/fieldscan.h"

/* Checks that each name's answer is what bson_iter_init_find gives for it (exact names
 * only): the same presence, and an iterator on the same element. */
static void assert_as_single_lookups(const bson_t *doc, const char *const *names, size_t n,
				     uint64_t found, const sdb_field_iter *its)
{
	for (size_t i = 0; i < n; i++) {
		bson_iter_t one;
		bool there = bson_iter_init_find(&one, doc, names[i]);

		assert_int_equal(there, (found & SDB_FIELD_BIT(i)) != 0);
		if (there) {
			assert_ptr_equal(bson_iter_key(&its[i].it), bson_iter_key(&one));
			assert_int_equal(bson_iter_type(&its[i].it), bson_iter_type(&one));
		}
	}
}

static void test_present_and_absent(void **state)
{
	bson_t *doc = BCON_NEW("find", "c", "filter", "{", "a", BCON_INT32(1), "}", "limit",
			       BCON_INT32(5), "$db", "test");
	static const char *const names[] = {"limit", "sort", "filter", "$db", "skip"};
	sdb_field_iter its[5];
	uint64_t found = 99;

	(void)state;
	assert_int_equal(sdb_bson_find_fields(doc, names, 5, &found, its), 0);
	/* limit (0), filter (2) and $db (3) occur; sort (1) and skip (4) do not */
	assert_int_equal(found, SDB_FIELD_BIT(0) | SDB_FIELD_BIT(2) | SDB_FIELD_BIT(3));
	assert_string_equal(bson_iter_key(&its[0].it), "limit");
	assert_int_equal(bson_iter_int32(&its[0].it), 5);
	assert_true(BSON_ITER_HOLDS_DOCUMENT(&its[2].it));
	assert_string_equal(bson_iter_utf8(&its[3].it, NULL), "test");
	assert_as_single_lookups(doc, names, 5, found, its);
	/* without iterators: the same mask */
	found = 0;
	assert_int_equal(sdb_bson_find_fields(doc, names, 5, &found, NULL), 0);
	assert_int_equal(found, SDB_FIELD_BIT(0) | SDB_FIELD_BIT(2) | SDB_FIELD_BIT(3));
	bson_destroy(doc);
}

static void test_empty_doc_and_no_names(void **state)
{
	bson_t empty = BSON_INITIALIZER;
	bson_t *doc = BCON_NEW("a", BCON_INT32(1));
	static const char *const names[] = {"a", ""};
	sdb_field_iter its[2];
	uint64_t found = 7;

	(void)state;
	assert_int_equal(sdb_bson_find_fields(&empty, names, 2, &found, its), 0);
	assert_int_equal(found, 0);
	/* no names: nothing found, even in a document with fields */
	found = 7;
	assert_int_equal(sdb_bson_find_fields(doc, NULL, 0, &found, NULL), 0);
	assert_int_equal(found, 0);
	/* the empty name is the empty key, absent here */
	assert_int_equal(sdb_bson_find_fields(doc, names, 2, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(0));
	bson_destroy(doc);
	/* ... and present here */
	doc = BCON_NEW("", BCON_INT32(9));
	assert_int_equal(sdb_bson_find_fields(doc, names, 2, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(1));
	assert_int_equal(bson_iter_int32(&its[1].it), 9);
	bson_destroy(doc);
}

static void test_duplicate_keys_first_wins(void **state)
{
	bson_t doc = BSON_INITIALIZER;
	static const char *const names[] = {"x", "y"};
	sdb_field_iter its[2];
	uint64_t found;

	(void)state;
	/* {x: 1, y: "first", x: 2, y: "second"}: built by hand, BCON would do the same */
	BSON_APPEND_INT32(&doc, "x", 1);
	BSON_APPEND_UTF8(&doc, "y", "first");
	BSON_APPEND_INT32(&doc, "x", 2);
	BSON_APPEND_UTF8(&doc, "y", "second");
	assert_int_equal(sdb_bson_find_fields(&doc, names, 2, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(0) | SDB_FIELD_BIT(1));
	assert_int_equal(bson_iter_int32(&its[0].it), 1);
	assert_string_equal(bson_iter_utf8(&its[1].it, NULL), "first");
	assert_as_single_lookups(&doc, names, 2, found, its);
	bson_destroy(&doc);
}

static void test_prefix_of_another_name(void **state)
{
	bson_t *doc = BCON_NEW("tomorrow", BCON_INT32(1), "maxTimeMSX", BCON_INT32(2), "to",
			       BCON_INT32(3), "max", BCON_INT32(4));
	/* "to" and "max" are prefixes of keys before them; "maxTimeMS" is a prefix of a key,
	 * "tomorrowland" has a key as its prefix: only equal keys match */
	static const char *const names[] = {"to", "max", "maxTimeMS", "tomorrowland", "m"};
	sdb_field_iter its[5];
	uint64_t found;

	(void)state;
	assert_int_equal(sdb_bson_find_fields(doc, names, 5, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(0) | SDB_FIELD_BIT(1));
	assert_int_equal(bson_iter_int32(&its[0].it), 3);
	assert_int_equal(bson_iter_int32(&its[1].it), 4);
	assert_as_single_lookups(doc, names, 5, found, its);
	bson_destroy(doc);
}

static void test_prefix_names(void **state)
{
	bson_t *doc = BCON_NEW("find", "c", "$stripedbVersion", BCON_INT32(1), "$stripedb",
			       BCON_INT32(2), "*", BCON_INT32(3), "$db", "d");
	/* a prefix name reports its first match; an exact name of the same key is answered
	 * too; "$db*" matches "$db" itself; a lone "*" is the key "*" */
	static const char *const names[] = {"$stripedb*", "$stripedb", "$db*", "*", "f*",
					    "$stripedbX*"};
	sdb_field_iter its[6];
	uint64_t found;

	(void)state;
	assert_int_equal(sdb_bson_find_fields(doc, names, 6, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(0) | SDB_FIELD_BIT(1) | SDB_FIELD_BIT(2) |
					SDB_FIELD_BIT(3) | SDB_FIELD_BIT(4));
	assert_string_equal(bson_iter_key(&its[0].it), "$stripedbVersion");
	assert_int_equal(bson_iter_int32(&its[1].it), 2);
	assert_string_equal(bson_iter_key(&its[2].it), "$db");
	assert_int_equal(bson_iter_int32(&its[3].it), 3);
	assert_string_equal(bson_iter_key(&its[4].it), "find");
	bson_destroy(doc);
}

/* 64 names (the mask's width) work, bit 63 included; 65 are refused, nothing looked up. */
static void test_mask_limit(void **state)
{
	char bufs[SDB_FIELDS_MAX + 1][8];
	const char *names[SDB_FIELDS_MAX + 1];
	sdb_field_iter its[SDB_FIELDS_MAX + 1];
	bson_t doc = BSON_INITIALIZER;
	uint64_t found;

	(void)state;
	for (size_t i = 0; i <= SDB_FIELDS_MAX; i++) {
		snprintf(bufs[i], sizeof bufs[i], "f%zu", i);
		names[i] = bufs[i];
	}
	/* f0, f63 and f64 occur */
	BSON_APPEND_INT32(&doc, "f64", 64);
	BSON_APPEND_INT32(&doc, "f63", 63);
	BSON_APPEND_INT32(&doc, "f0", 0);
	assert_int_equal(sdb_bson_find_fields(&doc, names, SDB_FIELDS_MAX, &found, its), 0);
	assert_true(found == (SDB_FIELD_BIT(0) | SDB_FIELD_BIT(63)));
	assert_int_equal(bson_iter_int32(&its[63].it), 63);
	assert_int_equal(bson_iter_int32(&its[0].it), 0);
	assert_as_single_lookups(&doc, names, SDB_FIELDS_MAX, found, its);
	found = 5;
	assert_int_equal(sdb_bson_find_fields(&doc, names, SDB_FIELDS_MAX + 1, &found, its),
			 SDB_EINVAL);
	assert_int_equal(found, 0);
	assert_int_equal(sdb_bson_find_fields(&doc, NULL, 1, &found, its), SDB_EINVAL);
	bson_destroy(&doc);
}

/* Names whose first bytes share a bucket of the prefilter (byte & 63: 'a' and '!' are
 * bucket 33, 'B' and the UTF-8 lead byte 0xc2 of "¡" bucket 2) are told apart by the
 * comparison. */
static void test_shared_first_byte_bucket(void **state)
{
	bson_t *doc = BCON_NEW("ax", BCON_INT32(1), "\xc2\xa1x", BCON_INT32(2), "Ax",
			       BCON_INT32(3));
	static const char *const names[] = {"!x", "ax", "\xc2\xa1x", "Bx", "Ax"};
	sdb_field_iter its[5];
	uint64_t found;

	(void)state;
	assert_int_equal(sdb_bson_find_fields(doc, names, 5, &found, its), 0);
	assert_int_equal(found, SDB_FIELD_BIT(1) | SDB_FIELD_BIT(2) | SDB_FIELD_BIT(4));
	assert_int_equal(bson_iter_int32(&its[1].it), 1);
	assert_int_equal(bson_iter_int32(&its[2].it), 2);
	assert_int_equal(bson_iter_int32(&its[4].it), 3);
	assert_as_single_lookups(doc, names, 5, found, its);
	bson_destroy(doc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_present_and_absent),
		cmocka_unit_test(test_empty_doc_and_no_names),
		cmocka_unit_test(test_duplicate_keys_first_wins),
		cmocka_unit_test(test_prefix_of_another_name),
		cmocka_unit_test(test_prefix_names),
		cmocka_unit_test(test_mask_limit),
		cmocka_unit_test(test_shared_first_byte_bucket),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
