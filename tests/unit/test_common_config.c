/* Unit tests of src/common/config.c: precedence, scoping, validation. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/config.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/err.h"

static int parse(const char *const *args, const char *const *env, sdb_config_set *set, char *err)
{
	int argc = 0;
	while (args[argc] != NULL) {
		argc++;
	}
	return sdb_config_parse(argc, (char **)args, (char **)env, set, err, 256);
}

static void test_flag_beats_env_beats_file(void **state)
{
	char path[] = "/tmp/sdb-conf-XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");
	fprintf(f, "# comment\nlisten = 127.0.0.1:1\nhttp-listen = 127.0.0.1:2\ndata-dir = /from/file\n"
		   "[shard]\ndata-dir = /from/file/shard\n");
	fclose(f);
	char cflag[64];
	snprintf(cflag, sizeof cflag, "--config=%s", path);
	const char *args[] = {cflag, "--role=shard", "--listen=127.0.0.1:3", NULL};
	const char *env[] = {"STRIPEDB_HTTP_LISTEN=127.0.0.1:4", "PATH=/bin", NULL};
	sdb_config_set set;
	char err[256];
	assert_int_equal(parse(args, env, &set, err), 0);
	assert_int_equal(set.n_roles, 1);
	assert_string_equal(set.roles[0].role, "shard");
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_listen), "127.0.0.1:3");
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_http_listen), "127.0.0.1:4");
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_data_dir), "/from/file/shard");
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_log_level), "info");
	sdb_config_set_free(&set);
	unlink(path);
}

static void test_role_scoping(void **state)
{
	const char *args[] = {"--http-listen=127.0.0.1:9",	"--role=shard", "--listen=127.0.0.1:5",
			      "--role", "proxy", "--listen", "127.0.0.1:6", "--config=/nonexistent-ok", NULL};
	const char *env[] = {NULL};
	sdb_config_set set;
	char err[256];
	/* an explicit config file that does not exist is an error */
	assert_int_equal(parse(args, env, &set, err), SDB_EIO);
	assert_non_null(strstr(err, "/nonexistent-ok"));
	args[7] = NULL;
	assert_int_equal(parse(args, env, &set, err), 0);
	assert_int_equal(set.n_roles, 2);
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_listen), "127.0.0.1:5");
	assert_string_equal(sdb_config_get(&set.roles[1], SDB_OPT_listen), "127.0.0.1:6");
	assert_string_equal(sdb_config_get(&set.roles[1], SDB_OPT_http_listen), "127.0.0.1:9");
	sdb_config_set_free(&set);
}

static void test_usage_errors(void **state)
{
	static const struct {
		const char *args[4];
		const char *needle;
	} cases[] = {
		{{"--role=nope", NULL}, "unknown role 'nope'"},
		{{"--role=shard", "--bogus=1", NULL}, "unknown flag --bogus"},
		{{"--role=shard", "--listen=nohostport", NULL}, "--listen: bad address 'nohostport'"},
		{{"--role=shard", "--listen=127.0.0.1:70000", NULL}, "port must be 0-65535"},
		{{"--role=shard", "--max-connections=-3", NULL}, "not a non-negative integer"},
		{{"--listen=127.0.0.1:1", NULL}, "no role given"},
		{{"--role=shard", "--role=shard", NULL}, "role shard given twice"},
		{{"--role=metadata", "--bootstrap-members=1@a:1,x@b:2", NULL}, "bad member id 'x'"},
		{{"--role=shard", "--log-level=loud", NULL}, "not a log level"},
		{{"shard", NULL}, "unexpected argument 'shard'"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *env[] = {"STRIPEDB_CONFIG=/dev/null", NULL};
		sdb_config_set set;
		char err[256] = "";
		assert_int_equal(parse(cases[i].args, env, &set, err), SDB_EUSAGE);
		if (strstr(err, cases[i].needle) == NULL) {
			fail_msg("case %zu: '%s' does not contain '%s'", i, err, cases[i].needle);
		}
	}
}

static void test_env_role_and_bad_env(void **state)
{
	const char *args[] = {NULL};
	const char *env[] = {"STRIPEDB_ROLE=ratelimit", "STRIPEDB_GRPC_LISTEN=[::1]:81",
			     "STRIPEDB_CONFIG=/dev/null", NULL};
	sdb_config_set set;
	char err[256];
	assert_int_equal(parse(args, env, &set, err), 0);
	assert_string_equal(set.roles[0].role, "ratelimit");
	assert_string_equal(sdb_config_get(&set.roles[0], SDB_OPT_grpc_listen), "[::1]:81");
	sdb_config_set_free(&set);
	const char *env2[] = {"STRIPEDB_ROLE=shard", "STRIPEDB_LISTEN=bad", NULL};
	assert_int_equal(parse(args, env2, &set, err), SDB_EUSAGE);
	assert_non_null(strstr(err, "STRIPEDB_LISTEN"));
}

static void test_addr_split(void **state)
{
	char host[64];
	int port;
	char err[128];
	assert_int_equal(sdb_addr_split("[::1]:27017", host, sizeof host, &port, err, sizeof err), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 27017);
	assert_int_equal(sdb_addr_split("localhost:0", host, sizeof host, &port, err, sizeof err), 0);
	assert_string_equal(host, "localhost");
	assert_int_equal(port, 0);
	assert_int_equal(sdb_addr_split("::1:80", host, sizeof host, &port, err, sizeof err), SDB_EINVAL);
	assert_int_equal(sdb_addr_split("a b:80", host, sizeof host, &port, err, sizeof err), SDB_EINVAL);
	assert_int_equal(sdb_addr_split("host:", host, sizeof host, &port, err, sizeof err), SDB_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flag_beats_env_beats_file),
		cmocka_unit_test(test_role_scoping),
		cmocka_unit_test(test_usage_errors),
		cmocka_unit_test(test_env_role_and_bad_env),
		cmocka_unit_test(test_addr_split),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
