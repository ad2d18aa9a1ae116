/* Unit tests of the shared argument and output helpers of `stripedb ctl`: parse_args of
 * cli/migrate.c (one parser for migrate, migration, shard, tenant, rebalance and chunk) and
 * cli_parse_id, cli_rs_uri_*, sdb_bson_iter_doc and cli_iter_array of cli/cli.h (issue #24). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../cli/migrate.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* migrate's table: value options in both spellings, parse_common's flags, one positional. */
static void values_flags_positional(void **state)
{
	char *argv[] = {"db.c", "--chunk", "7", "--to=s2", "--wait", "--grace-ms=5"};
	const char *ns = NULL, *to = NULL, *chunk = NULL;
	mig_opts o = {.grace_ms = -1};
	const arg_opt opts[] = {{"--chunk", &chunk, NULL}, {"--to", &to, NULL}, {0}};
	(void)state;
	assert_int_equal(cmig_parse_args("migrate", 6, argv, 0, opts, &o, &ns), 0);
	assert_string_equal(ns, "db.c");
	assert_string_equal(chunk, "7");
	assert_string_equal(to, "s2");
	assert_int_equal(o.wait, 1);
	assert_int_equal(o.dry_run, 0);
	assert_int_equal(o.grace_ms, 5);
}

/* "NAME VALUE" takes the next word whatever it is; the last one given wins; first skips
 * the verb. */
static void next_word_and_last_wins(void **state)
{
	char *argv[] = {"drain", "s1", "--to", "--wait", "--to", "s3"};
	const char *shard = NULL, *to = NULL;
	mig_opts o = {.grace_ms = -1};
	const arg_opt opts[] = {{"--to", &to, NULL}, {0}};
	(void)state;
	assert_int_equal(cmig_parse_args("shard", 6, argv, 1, opts, &o, &shard), 0);
	assert_string_equal(shard, "s1");
	assert_string_equal(to, "s3");
	assert_int_equal(o.wait, 0);
}

/* Exit code 2 for: a value option with no value, a flag with "=", a second positional, a
 * positional where none is taken, a common option where parse_common is not asked. */
static void unexpected(void **state)
{
	const char *pos = NULL, *to = NULL;
	int flag = 0;
	mig_opts o = {.grace_ms = -1};
	const arg_opt vo[] = {{"--to", &to, NULL}, {0}};
	const arg_opt fo[] = {{"--json", NULL, &flag}, {0}};
	char *a1[] = {"x", "--to"};
	char *a2[] = {"--json=1"};
	char *a3[] = {"a", "b"};
	char *a4[] = {"a"};
	char *a5[] = {"--wait"};
	(void)state;
	assert_int_equal(cmig_parse_args("t", 2, a1, 0, vo, &o, &pos), 2);
	assert_null(to);
	assert_int_equal(cmig_parse_args("t", 1, a2, 0, fo, NULL, &pos), 2);
	assert_int_equal(flag, 0);
	pos = NULL;
	assert_int_equal(cmig_parse_args("t", 2, a3, 0, NULL, NULL, &pos), 2);
	assert_int_equal(cmig_parse_args("t", 1, a4, 0, fo, &o, NULL), 2);
	assert_int_equal(cmig_parse_args("t", 1, a5, 0, fo, NULL, NULL), 2);
}

/* A name that is a prefix of another ("--chunk" of "--chunks") matches only itself. */
static void prefix_names(void **state)
{
	char *argv[] = {"db.c", "--chunks=1,2", "--json"};
	const char *ns = NULL, *at = NULL, *ids = NULL, *chunk = NULL;
	int json = 0;
	const arg_opt opts[] = {{"--chunk", &chunk, NULL},
				{"--at", &at, NULL},
				{"--chunks", &ids, NULL},
				{"--json", NULL, &json},
				{0}};
	(void)state;
	assert_int_equal(cmig_parse_args("chunk", 3, argv, 0, opts, NULL, &ns), 0);
	assert_null(chunk);
	assert_null(at);
	assert_string_equal(ids, "1,2");
	assert_int_equal(json, 1);
}

static void parse_id(void **state)
{
	long long v = -5;
	(void)state;
	assert_int_equal(cli_parse_id("12", &v), 0);
	assert_int_equal(v, 12);
	assert_int_equal(cli_parse_id("-1", &v), -1);
	assert_int_equal(cli_parse_id("3x", &v), -1);
	assert_int_equal(v, 12);
}

static void rs_uri(void **state)
{
	char buf[64], small[12];
	cli_rs_uri u;
	(void)state;
	cli_rs_uri_begin(&u, buf, sizeof buf);
	cli_rs_uri_add(&u, "10.0.0.1", 27018);
	cli_rs_uri_add(&u, "127.0.0.1", 5);
	cli_rs_uri_end(&u, "shard-a");
	assert_string_equal(buf, "mongodb://10.0.0.1:27018,127.0.0.1:5/?replicaSet=shard-a");
	/* cut short, NUL-terminated */
	cli_rs_uri_begin(&u, small, sizeof small);
	cli_rs_uri_add(&u, "a", 1);
	cli_rs_uri_add(&u, "b", 2);
	cli_rs_uri_end(&u, "s");
	assert_string_equal(small, "mongodb://a");
}

/* Documents of an array in order, other elements skipped; a missing or non-array field. */
static void iter_doc_array(void **state)
{
	bson_t *d = BCON_NEW("a", "[", "{", "x", BCON_INT32(1), "}", BCON_INT32(2), "{", "x",
			     BCON_INT32(3), "}", "]", "s", "str");
	bson_iter_t it;
	bson_t e;
	int seen = 0;
	(void)state;
	assert_true(cli_iter_array(d, "a", &it));
	while (bson_iter_next(&it))
		if (sdb_bson_iter_doc(&it, &e))
			seen = seen * 10 + (int)cmig_ival(&e, "x");
	assert_int_equal(seen, 13);
	assert_false(cli_iter_array(d, "s", &it));
	assert_false(cli_iter_array(d, "none", &it));
	bson_destroy(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(values_flags_positional),
		cmocka_unit_test(next_word_and_last_wins),
		cmocka_unit_test(unexpected),
		cmocka_unit_test(prefix_names),
		cmocka_unit_test(parse_id),
		cmocka_unit_test(rs_uri),
		cmocka_unit_test(iter_doc_array),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
