/* Unit tests of src/common/metauri.c: the one metadata connection string. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/metauri.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/metauri.h"

static void test_replica_set_and_direct(void **state)
{
	char *u;

	(void)state;
	u = sdb_meta_uri("a:1,b:2", false, 1500, 2000, 30000);
	assert_string_equal(u, "mongodb://a:1,b:2/?replicaSet=stripedb-meta"
			       "&serverSelectionTimeoutMS=1500&connectTimeoutMS=2000"
			       "&socketTimeoutMS=30000");
	free(u);
	u = sdb_meta_uri("127.0.0.1:7", true, 1000, 0, 2000); /* 0 leaves an option out */
	assert_string_equal(u, "mongodb://127.0.0.1:7/?directConnection=true"
			       "&serverSelectionTimeoutMS=1000&socketTimeoutMS=2000");
	free(u);
	u = sdb_meta_uri("h:1", false, 0, 0, 0);
	assert_string_equal(u, "mongodb://h:1/?replicaSet=stripedb-meta");
	free(u);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replica_set_and_direct),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
