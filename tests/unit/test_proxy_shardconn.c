/* Unit tests of the proxy's per-thread signed $clusterTime (src/proxy/shardconn.c,
 * shardconn_cluster_time_doc, issue #19): for every time and every cluster key the
 * document it hands out holds the bytes ct_append_signed builds afresh, whether it was
 * built, reused or overwritten in place for a new time. */
/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a. */
#include "../../src/proxy/shardconn.c"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* shardconn_cluster_time_doc(ct) against ct_append_signed(ct), signed with secret (NULL:
 * unsigned, keyId 0). */
static void expect_doc(uint64_t ct, const uint8_t *secret)
{
	bson_t got, want = BSON_INITIALIZER;
	uint8_t hash[CT_HASH_LEN];

	if (secret)
		ct_sign(secret, ct, hash);
	ct_append_signed(&want, ct, secret ? hash : NULL);
	shardconn_cluster_time_doc(ct, &got);
	assert_int_equal(got.len, want.len);
	assert_memory_equal(bson_get_data(&got), bson_get_data(&want), want.len);
	assert_int_equal(ct_of_reply(&got), ct);
	bson_destroy(&want);
}

static void write_key_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static void test_cluster_time_doc(void **state)
{
	uint8_t first[32], second[32];
	char path[64], err[256];
	(void)state;

	/* no cluster key: unsigned; the same time again, a new one (overwritten in
	 * place), an older one */
	expect_doc(((uint64_t)100 << 32) | 1, NULL);
	expect_doc(((uint64_t)100 << 32) | 1, NULL);
	expect_doc(((uint64_t)101 << 32) | 7, NULL);
	expect_doc((uint64_t)99 << 32, NULL);

	/* a key loaded (a new generation): the time held is signed now, and so are the
	 * next ones */
	snprintf(path, sizeof path, "/tmp/sdb-ctdoc-keyfile-%d", (int)getpid());
	write_key_file(path, "b2xka2V5b2xk\n");
	assert_int_equal(auth_cluster_load(path, err, sizeof err), 0);
	assert_true(auth_cluster_derive(CT_SIGN_LABEL, first));
	expect_doc((uint64_t)99 << 32, first);
	expect_doc(((uint64_t)102 << 32) | 1, first);
	expect_doc(((uint64_t)102 << 32) | 2, first);

	/* rotation: the new first key signs from the next call on */
	write_key_file(path, "- bmV3a2V5bmV3\n- b2xka2V5b2xk\n");
	assert_int_equal(auth_cluster_reload(err, sizeof err), 0);
	assert_true(auth_cluster_derive(CT_SIGN_LABEL, second));
	assert_memory_not_equal(first, second, sizeof first);
	expect_doc(((uint64_t)102 << 32) | 2, second);
	expect_doc(((uint64_t)103 << 32) | 5, second);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_time_doc),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
