/* Unit tests of src/common/curop.c: currentOp's options and filter, killOp's opid, as
 * mongod 6.0 parses them (current_op_common.cpp, kill_op_cmd_base.cpp). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/curop.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static bson_t *doc(const char *json)
{
	bson_error_t berr;
	bson_t *d = bson_new_from_json((const uint8_t *)json, -1, &berr);

	if (d == NULL)
		fail_msg("bad JSON %s: %s", json, berr.message);
	return d;
}

/* The filter is every field but the command name, $all/$ownOps/$truncateOps, the generic
 * arguments and the caller's internal ones; the options read as mongod's trueValue. */
static void test_args(void **state)
{
	static const char *const skip[] = {"$stripedbShard", NULL};
	bson_t *cmd = doc("{\"currentOp\": 1, \"$all\": true, \"$ownOps\": 1, \"op\": \"query\","
			  " \"lsid\": {\"id\": 1}, \"comment\": \"c\", \"$db\": \"admin\","
			  " \"$stripedbShard\": \"s\", \"ns\": {\"$regex\": \"^db\\\\.\"}}");
	bson_t *want = doc("{\"op\": \"query\", \"ns\": {\"$regex\": \"^db\\\\.\"}}");
	sdb_curop_args a;

	(void)state;
	sdb_curop_args_parse(cmd, skip, false, &a);
	assert_true(a.all);
	assert_true(a.own_ops);
	assert_true(a.truncate);
	assert_int_equal(bson_compare(&a.filter, want), 0);
	bson_destroy(&a.filter);
	bson_destroy(cmd);
	bson_destroy(want);

	/* $truncateOps: false only with test commands */
	cmd = doc("{\"currentOp\": 1, \"$truncateOps\": false}");
	sdb_curop_args_parse(cmd, NULL, false, &a);
	assert_true(a.truncate);
	assert_false(a.all);
	assert_true(bson_empty(&a.filter));
	bson_destroy(&a.filter);
	sdb_curop_args_parse(cmd, NULL, true, &a);
	assert_false(a.truncate);
	bson_destroy(&a.filter);
	bson_destroy(cmd);
}

static void expect_opid(const char *json, int code, int32_t want, const char *text)
{
	bson_t *cmd = doc(json);
	char err[256] = "";
	int32_t opid = -7;
	int got = sdb_curop_parse_opid(cmd, &opid, err, sizeof err);

	if (got != code)
		fail_msg("%s: code %d (%s), expected %d", json, got, err, code);
	if (code == 0)
		assert_int_equal(opid, want);
	if (text != NULL && strstr(err, text) == NULL)
		fail_msg("%s: message \"%s\" lacks \"%s\"", json, err, text);
	bson_destroy(cmd);
}

static void test_opid(void **state)
{
	(void)state;
	expect_opid("{\"killOp\": 1, \"op\": 12}", 0, 12, NULL);
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberLong\": \"13\"}}", 0, 13, NULL);
	expect_opid("{\"killOp\": 1, \"op\": 14.0}", 0, 14, NULL);
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberDecimal\": \"15\"}}", 0, 15, NULL);
	expect_opid("{\"killOp\": 1, \"op\": -3}", 0, -3, NULL);
	expect_opid("{\"killOp\": 1}", 4, 0, "Missing expected field \"op\"");
	expect_opid("{\"killOp\": 1, \"op\": \"shard:1\"}", 14, 0,
		    "\"op\" had the wrong type. Expected number, found string");
	expect_opid("{\"killOp\": 1, \"op\": null}", 14, 0, "found null");
	expect_opid("{\"killOp\": 1, \"op\": 1.5}", 2, 0, "exactly representable");
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberDouble\": \"NaN\"}}", 2, 0, NULL);
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberLong\": \"4294967296\"}}", 26823, 0,
		    "invalid op : 4294967296. Op ID cannot be represented with 32 bits");
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberLong\": \"-2147483649\"}}", 26823, 0, NULL);
	expect_opid("{\"killOp\": 1, \"op\": {\"$numberLong\": \"2147483647\"}}", 0, INT32_MAX,
		    NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_args),
		cmocka_unit_test(test_opid),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
