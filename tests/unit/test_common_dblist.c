/* Unit tests of src/common/dblist.c: the databases of a listDatabases reply, entry by entry
 * (the auth gate reads each database's tenant, the proxy its primary shard). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/dblist.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/dblist.h"

static void test_entries_with_name_and_field(void **state)
{
	bson_t *r = BCON_NEW("databases", "[", "{", "name", "a", "primary", "s1", "tenant", "t",
			     "}", "{", "name", "b", "}", "{", "primary", "s2", "}", "]", "ok",
			     BCON_DOUBLE(1));
	const char *name, *value;
	sdb_dblist l;

	(void)state;
	sdb_dblist_init(&l, r);
	assert_true(sdb_dblist_next(&l, "primary", &name, &value));
	assert_string_equal(name, "a");
	assert_string_equal(value, "s1");
	assert_true(sdb_dblist_next(&l, "primary", &name, &value));
	assert_string_equal(name, "b");
	assert_null(value); /* no primary: NULL, not the previous entry's */
	assert_true(sdb_dblist_next(&l, "primary", &name, &value));
	assert_null(name);
	assert_string_equal(value, "s2");
	assert_false(sdb_dblist_next(&l, "primary", &name, &value));
	assert_false(sdb_dblist_next(&l, "primary", &name, &value)); /* stays at the end */
	bson_destroy(r);
}

static void test_other_field_and_types_skipped(void **state)
{
	/* a non-document entry is skipped; a non-string field counts as absent; the last of a
	 * repeated field wins */
	bson_t *r = BCON_NEW("databases", "[", BCON_INT32(7), "{", "name", BCON_INT32(1),
			     "tenant", "t1", "tenant", "t2", "}", "]");
	const char *name, *value;
	sdb_dblist l;

	(void)state;
	sdb_dblist_init(&l, r);
	assert_true(sdb_dblist_next(&l, "tenant", &name, &value));
	assert_null(name);
	assert_string_equal(value, "t2");
	assert_false(sdb_dblist_next(&l, "tenant", &name, &value));
	bson_destroy(r);
}

static void test_no_databases_array(void **state)
{
	bson_t *none = BCON_NEW("ok", BCON_DOUBLE(1));
	bson_t *wrong = BCON_NEW("databases", "{", "name", "a", "}");
	const char *name = "x", *value = "y";
	sdb_dblist l;

	(void)state;
	sdb_dblist_init(&l, none);
	assert_false(sdb_dblist_next(&l, "primary", &name, &value));
	sdb_dblist_init(&l, wrong);
	assert_false(sdb_dblist_next(&l, "primary", &name, &value));
	assert_string_equal(name, "x"); /* untouched at the end */
	assert_string_equal(value, "y");
	bson_destroy(none);
	bson_destroy(wrong);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_entries_with_name_and_field),
		cmocka_unit_test(test_other_field_and_types_skipped),
		cmocka_unit_test(test_no_databases_array),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
