/* Unit tests of the migration state machine table (src/coordinator/migrate_sm.c). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/coordinator/migrate_sm.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/migrate.h"

static void names_round_trip(void **state)
{
	(void)state;
	for (int s = 0; s < MIG__COUNT; s++)
		assert_int_equal(migrate_state_parse(migrate_state_name((mig_state)s)), s);
	assert_string_equal(migrate_state_name(MIG_ROLLING_BACK), "rolling_back");
	assert_int_equal(migrate_state_parse("nope"), MIG_UNKNOWN);
	assert_int_equal(migrate_state_parse(NULL), MIG_UNKNOWN);
	assert_string_equal(migrate_state_name(MIG_UNKNOWN), "unknown");
}

/* The exact edge set of the table in migrate.h: 17 edges. */
static void transitions(void **state)
{
	static const int edges[][2] = {
		{MIG_REGISTERED, MIG_IMPORTING},   {MIG_REGISTERED, MIG_ABORTED},
		{MIG_IMPORTING, MIG_REPLICATING},  {MIG_IMPORTING, MIG_ABORTED},
		{MIG_REPLICATING, MIG_VERIFYING},  {MIG_REPLICATING, MIG_ABORTED},
		{MIG_VERIFYING, MIG_SWITCHING},    {MIG_VERIFYING, MIG_REPLICATING},
		{MIG_VERIFYING, MIG_ABORTED},      {MIG_SWITCHING, MIG_SWITCHED},
		{MIG_SWITCHING, MIG_REPLICATING},  {MIG_SWITCHING, MIG_ABORTED},
		{MIG_SWITCHED, MIG_CLEANING},      {MIG_SWITCHED, MIG_ROLLING_BACK},
		{MIG_CLEANING, MIG_COMPLETE},      {MIG_ROLLING_BACK, MIG_ROLLED_BACK},
		{MIG_ROLLING_BACK, MIG_SWITCHED},
	};
	int n = 0;
	(void)state;
	for (int a = 0; a < MIG__COUNT; a++)
		for (int b = 0; b < MIG__COUNT; b++) {
			int want = 0;
			for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
				want |= edges[i][0] == a && edges[i][1] == b;
			assert_int_equal(migrate_transition_ok((mig_state)a, (mig_state)b), want);
			n += want;
		}
	assert_int_equal(n, 17);
	/* never abort after the switch: routing is on the target */
	assert_false(migrate_transition_ok(MIG_SWITCHED, MIG_ABORTED));
	assert_false(migrate_transition_ok(MIG_CLEANING, MIG_ABORTED));
	assert_false(migrate_transition_ok(MIG_UNKNOWN, MIG_IMPORTING));
	assert_false(migrate_transition_ok(MIG_REGISTERED, MIG__COUNT));
}

static void classes(void **state)
{
	(void)state;
	assert_true(migrate_state_terminal(MIG_COMPLETE));
	assert_true(migrate_state_terminal(MIG_ABORTED));
	assert_true(migrate_state_terminal(MIG_ROLLED_BACK));
	assert_false(migrate_state_terminal(MIG_SWITCHED));
	assert_false(migrate_state_active(MIG_REGISTERED));
	assert_true(migrate_state_active(MIG_IMPORTING));
	assert_true(migrate_state_active(MIG_ROLLING_BACK));
	assert_false(migrate_state_active(MIG_COMPLETE));
	assert_false(migrate_state_active(MIG_UNKNOWN));
}

static void percentiles(void **state)
{
	int64_t v[] = {9, 1, 5, 3, 7, 2, 8, 4, 6, 10};
	(void)state;
	assert_int_equal(migrate_percentile(v, 10, 50), 5);
	assert_int_equal(migrate_percentile(v, 10, 99), 10);
	assert_int_equal(migrate_percentile(v, 10, 100), 10);
	assert_int_equal(migrate_percentile(v, 10, 0), 1);
	assert_int_equal(migrate_percentile(v, 0, 50), 0);
	int64_t one[] = {42};
	assert_int_equal(migrate_percentile(one, 1, 99), 42);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(names_round_trip),
		cmocka_unit_test(transitions),
		cmocka_unit_test(classes),
		cmocka_unit_test(percentiles),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
