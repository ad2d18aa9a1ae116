/* Unit tests of the cluster key file (src/auth/cluster.c, issue #21 key rotation): the
 * one-key form (whitespace, wrapped lines) and MongoDB's YAML list of keys, the errors of
 * bad files, and a reload: the new keys replace the old (first = outgoing, all accepted),
 * a bad file keeps the old ones. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/auth/cluster.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "auth/cluster.h"
#include "common/err.h"

static char keys[AUTH_CLUSTER_KEYS_MAX][AUTH_CLUSTER_KEY_MAX + 1];
static char err[512];

static int parse(const char *text, size_t *n)
{
	err[0] = '\0';
	return auth_cluster_parse_keys(text, strlen(text), "f", keys, n, err, sizeof err);
}

static void test_parse_one_key(void **state)
{
	size_t n;
	(void)state;
	assert_int_equal(parse("c2VjcmV0LWtleQ==\n", &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(keys[0], "c2VjcmV0LWtleQ==");
	/* wrapped over lines (openssl rand -base64 756): one key, as MongoDB reads it */
	assert_int_equal(parse("  abcdefgh\nijklmnop\r\n\tqrstuv+/\n\n", &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(keys[0], "abcdefghijklmnopqrstuv+/");
}

static void test_parse_yaml_list(void **state)
{
	size_t n;
	(void)state;
	assert_int_equal(parse("- newkey-is-not-base64\n", &n), SDB_EINVAL);
	assert_int_equal(parse("# rotation 2026\n- bmV3a2V5bmV3a2V5\n-   b2xka2V5b2xka2V5  \n",
			       &n),
			 0);
	assert_int_equal(n, 2);
	assert_string_equal(keys[0], "bmV3a2V5bmV3a2V5");
	assert_string_equal(keys[1], "b2xka2V5b2xka2V5");
	/* quotes, blank lines, an indented continuation of an item, no final newline */
	assert_int_equal(parse("- 'quoted1'\n\n- \"quoted2\"\n- wrapped\n  Key1234", &n), 0);
	assert_int_equal(n, 3);
	assert_string_equal(keys[0], "quoted1");
	assert_string_equal(keys[1], "quoted2");
	assert_string_equal(keys[2], "wrappedKey1234");
	/* one item is a list of one key */
	assert_int_equal(parse("- onlyonekey\n", &n), 0);
	assert_int_equal(n, 1);
}

static void test_parse_errors(void **state)
{
	size_t n;
	char big[AUTH_CLUSTER_KEYS_MAX * 16 + 32] = "";
	(void)state;
	assert_int_equal(parse("", &n), SDB_EINVAL);
	assert_non_null(strstr(err, "shorter than 6"));
	assert_int_equal(parse("abc\n", &n), SDB_EINVAL);
	assert_int_equal(parse("key with a * star\n", &n), SDB_EINVAL);
	assert_non_null(strstr(err, "only base64"));
	assert_int_equal(parse("- goodkey1\n- bad\n", &n), SDB_EINVAL);
	assert_non_null(strstr(err, "key 2 shorter than 6"));
	assert_int_equal(parse("- goodkey1\n- goodkey2\n-\n", &n), SDB_EINVAL);
	assert_int_equal(parse("- goodkey1\n-goodkey2\n", &n), SDB_EINVAL);
	assert_non_null(strstr(err, "line 2"));
	assert_int_equal(parse("- goodkey1\nkeys: [a]\n", &n), SDB_EINVAL);
	assert_non_null(strstr(err, "line 2: expected '- KEY'"));
	assert_int_equal(parse("- goodkey1\n- key#2comment\n", &n), SDB_EINVAL);
	for (int i = 0; i <= AUTH_CLUSTER_KEYS_MAX; i++)
		strcat(big, "- abcdefghij\n");
	assert_int_equal(parse(big, &n), SDB_EINVAL);
	assert_non_null(strstr(err, "more than"));
	{
		char *longk = calloc(1, AUTH_CLUSTER_KEY_MAX + 16);
		memset(longk, 'A', AUTH_CLUSTER_KEY_MAX + 1);
		assert_int_equal(parse(longk, &n), SDB_EINVAL);
		assert_non_null(strstr(err, "longer than"));
		free(longk);
	}
}

static char path[64];

static void write_file(const char *text, mode_t mode)
{
	char tmp[80];
	FILE *f;
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	f = fopen(tmp, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	chmod(tmp, mode);
	assert_int_equal(rename(tmp, path), 0);
}

static void derive(const char *key, uint8_t out[32])
{
	unsigned int ml = 0;
	HMAC(EVP_sha256(), key, (int)strlen(key), (const uint8_t *)"label", 5, out, &ml);
}

static void token(const char *key, char out[65])
{
	uint8_t mac[32];
	unsigned int ml = 0;
	HMAC(EVP_sha256(), key, (int)strlen(key), (const uint8_t *)"stripedb PeersV1", 16, mac,
	     &ml);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* One process, one key file: load, then reload through the three steps of a rotation. */
static void test_load_and_reload(void **state)
{
	uint8_t d[AUTH_CLUSTER_KEYS_MAX][32], want[32];
	char told[65], tnew[65];
	uint64_t g;
	(void)state;
	snprintf(path, sizeof path, "/tmp/sdb-keyfile-%d", (int)getpid());
	token("b2xka2V5b2xk", told);
	token("bmV3a2V5bmV3", tnew);
	/* group- or world-readable: refused */
	write_file("b2xka2V5b2xk\n", 0644);
	assert_int_equal(auth_cluster_load(path, err, sizeof err), SDB_EINVAL);
	assert_non_null(strstr(err, "permissions are too open"));
	assert_false(auth_cluster_enabled());
	assert_int_equal(auth_cluster_reload(err, sizeof err), 0); /* nothing loaded: no-op */
	write_file("b2xka2V5b2xk\n", 0600);
	assert_int_equal(auth_cluster_load(path, err, sizeof err), 0);
	assert_int_equal(auth_cluster_key_count(), 1);
	g = auth_cluster_generation();
	assert_true(auth_cluster_peer_token_ok(told, 64));
	assert_false(auth_cluster_peer_token_ok(tnew, 64));
	/* step 1: the new key second */
	write_file("- b2xka2V5b2xk\n- bmV3a2V5bmV3\n", 0600);
	assert_int_equal(auth_cluster_reload(err, sizeof err), 0);
	assert_int_equal(auth_cluster_key_count(), 2);
	assert_true(auth_cluster_generation() > g);
	assert_int_equal(auth_cluster_derive_all("label", d, AUTH_CLUSTER_KEYS_MAX), 2);
	derive("b2xka2V5b2xk", want);
	assert_memory_equal(d[0], want, 32);
	derive("bmV3a2V5bmV3", want);
	assert_memory_equal(d[1], want, 32);
	assert_string_equal(auth_cluster_peer_token(), told); /* outgoing: still the old key */
	assert_true(auth_cluster_peer_token_ok(tnew, 64));   /* incoming: both */
	assert_true(auth_cluster_peer_token_ok(told, 64));
	/* step 2: the new key first */
	write_file("- bmV3a2V5bmV3\n- b2xka2V5b2xk\n", 0600);
	assert_int_equal(auth_cluster_reload(err, sizeof err), 0);
	assert_true(auth_cluster_derive("label", d[0]));
	derive("bmV3a2V5bmV3", want);
	assert_memory_equal(d[0], want, 32);
	assert_string_equal(auth_cluster_peer_token(), tnew);
	/* a bad file at reload: an error, the keys in use stay */
	g = auth_cluster_generation();
	write_file("- bmV3a2V5bmV3\n- bad\n", 0600);
	assert_int_equal(auth_cluster_reload(err, sizeof err), SDB_EINVAL);
	assert_non_null(strstr(err, "shorter than 6"));
	write_file("bmV3a2V5bmV3\n", 0640);
	assert_int_equal(auth_cluster_reload(err, sizeof err), SDB_EINVAL);
	unlink(path);
	assert_int_equal(auth_cluster_reload(err, sizeof err), SDB_EIO);
	assert_int_equal(auth_cluster_key_count(), 2);
	assert_int_equal(auth_cluster_generation(), g);
	assert_true(auth_cluster_peer_token_ok(told, 64));
	/* step 3: the old key dropped */
	write_file("bmV3a2V5bmV3\n", 0600);
	assert_int_equal(auth_cluster_reload(err, sizeof err), 0);
	assert_int_equal(auth_cluster_key_count(), 1);
	assert_false(auth_cluster_peer_token_ok(told, 64));
	assert_true(auth_cluster_peer_token_ok(tnew, 64));
	assert_int_equal(auth_cluster_derive_all("label", d, AUTH_CLUSTER_KEYS_MAX), 1);
	/* another role of the process loading other keys is refused; the same keys are not */
	assert_int_equal(auth_cluster_load(path, err, sizeof err), 0);
	write_file("- b2xka2V5b2xk\n", 0600);
	assert_int_equal(auth_cluster_load(path, err, sizeof err), SDB_EINVAL);
	assert_non_null(strstr(err, "differs"));
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_one_key),
		cmocka_unit_test(test_parse_yaml_list),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_load_and_reload),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
