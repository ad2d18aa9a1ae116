/* Unit tests of src/common/throttle.c: the import throttle rule shared by the migration
 * import and backups (back off as long as a batch took when it took longer than the
 * latency limit; a limit of 0 disables it). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/throttle.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/throttle.h"

static void test_under_the_limit_no_backoff(void **state)
{
	(void)state;
	assert_int_equal(sdb_import_backoff_ms(0, 50), 0);
	assert_int_equal(sdb_import_backoff_ms(49999, 50), 0);
	assert_int_equal(sdb_import_backoff_ms(50000, 50), 0); /* "longer than": not equal */
}

static void test_over_the_limit_backs_off_as_long_as_it_took(void **state)
{
	(void)state;
	assert_int_equal(sdb_import_backoff_ms(50001, 50), 50);
	assert_int_equal(sdb_import_backoff_ms(120500, 50), 120);
	assert_int_equal(sdb_import_backoff_ms(1500, 1), 1);
	assert_int_equal(sdb_import_backoff_ms(3000000, 50), 3000);
}

static void test_zero_or_negative_limit_disables(void **state)
{
	(void)state;
	assert_int_equal(sdb_import_backoff_ms(3000000, 0), 0);
	assert_int_equal(sdb_import_backoff_ms(3000000, -1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_under_the_limit_no_backoff),
		cmocka_unit_test(test_over_the_limit_backs_off_as_long_as_it_took),
		cmocka_unit_test(test_zero_or_negative_limit_disables),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
