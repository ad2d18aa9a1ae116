/* Unit tests of src/common/changestream.c: the resume token codec and order of the change
 * stream contract (byte layout in changestream.h). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/changestream.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/changestream.h"

static sdb_cs_token tok(uint64_t ts, uint8_t kind, const char *shard, uint32_t idx)
{
	sdb_cs_token t;

	memset(&t, 0, sizeof(t));
	t.ts = ts;
	t.kind = kind;
	snprintf(t.shard, sizeof(t.shard), "%s", shard);
	t.idx = idx;
	return t;
}

/* the hex of a token appended under "_id" */
static char *hex_of(const sdb_cs_token *t)
{
	bson_t b = BSON_INITIALIZER, sub;
	bson_iter_t it, in;
	char *s;

	sdb_cs_token_append(&b, "_id", t);
	assert_true(bson_iter_init_find(&it, &b, "_id"));
	assert_true(BSON_ITER_HOLDS_DOCUMENT(&it));
	assert_true(bson_iter_recurse(&it, &in));
	assert_true(bson_iter_find(&in, "_data"));
	s = bson_strdup(bson_iter_utf8(&in, NULL));
	(void)sub;
	bson_destroy(&b);
	return s;
}

static void test_exact_bytes(void **state)
{
	sdb_cs_token t = tok(((uint64_t)0x65000001 << 32) | 7, SDB_CS_EVENT, "s1", 3);
	sdb_cs_token h = tok(((uint64_t)2 << 32) | 1, SDB_CS_HWM, "", 0);
	char *hex;

	(void)state;
	hex = hex_of(&t);
	/* version 01 | ts 6500000100000007 | kind 00 | len 02 | "s1" 7331 | idx 00000003 */
	assert_string_equal(hex, "01650000010000000700027331" "00000003");
	bson_free(hex);
	hex = hex_of(&h);
	assert_string_equal(hex, "010000000200000001" "0200" "00000000");
	bson_free(hex);
}

static void test_round_trip(void **state)
{
	char shard64[65];
	sdb_cs_token in[4], out;
	char err[128];
	size_t i;

	(void)state;
	memset(shard64, 'z', 64);
	shard64[64] = '\0';
	in[0] = tok(UINT64_MAX, SDB_CS_EVENT, "shard-a", UINT32_MAX);
	in[1] = tok(0, SDB_CS_INVALIDATE, "b", 0);
	in[2] = tok(12345, SDB_CS_HWM, "", 0);
	in[3] = tok(99, SDB_CS_EVENT, shard64, 1);
	for (i = 0; i < 4; i++) {
		bson_t b = BSON_INITIALIZER;
		bson_iter_t it;
		bson_t sub;
		const uint8_t *data;
		uint32_t len;

		sdb_cs_token_append(&b, "t", &in[i]);
		assert_true(bson_iter_init_find(&it, &b, "t"));
		bson_iter_document(&it, &len, &data);
		assert_true(bson_init_static(&sub, data, len));
		assert_int_equal(sdb_cs_token_parse(&sub, &out, err, sizeof(err)), 0);
		assert_true(out.ts == in[i].ts);
		assert_int_equal(out.kind, in[i].kind);
		assert_string_equal(out.shard, in[i].shard);
		assert_int_equal(out.idx, in[i].idx);
		assert_int_equal(sdb_cs_token_cmp(&out, &in[i]), 0);
		bson_destroy(&b);
	}
}

static void expect_bad(const bson_t *doc, int want_code)
{
	sdb_cs_token t;
	char err[128] = "";
	int code = 0;

	assert_int_equal(sdb_cs_token_parse_code(doc, &t, &code, err, sizeof(err)), SDB_EINVAL);
	assert_int_equal(code, want_code);
	assert_true(err[0] != '\0');
}

static void test_malformed(void **state)
{
	bson_t *missing = BCON_NEW("x", BCON_INT32(1));
	bson_t *num = BCON_NEW("_data", BCON_INT32(1));
	bson_t *odd = BCON_NEW("_data", "010");
	bson_t *nothex = BCON_NEW("_data", "01000000000000000100000000000G");
	bson_t *shortt = BCON_NEW("_data", "0100");
	bson_t *badver = BCON_NEW("_data", "020000000000000001000000000000");
	bson_t *badkind = BCON_NEW("_data", "010000000000000001030000000000");
	bson_t *badlen = BCON_NEW("_data", "01000000000000000100050000000000");
	bson_t *hwmshard = BCON_NEW("_data", "0100000000000000010201610000000000");
	bson_t *lower = BCON_NEW("_data", "01650000010000000700027331000000ff");
	sdb_cs_token t;
	char err[64];

	(void)state;
	expect_bad(missing, 40647);
	expect_bad(num, 40647);
	expect_bad(NULL, 40647);
	expect_bad(odd, 9);
	expect_bad(nothex, 9);
	expect_bad(shortt, 9);
	expect_bad(badver, 9);
	expect_bad(badkind, 9);
	expect_bad(badlen, 9);
	expect_bad(hwmshard, 9);
	/* lowercase hex is accepted (a client may have re-encoded it) */
	assert_int_equal(sdb_cs_token_parse(lower, &t, err, sizeof(err)), 0);
	assert_int_equal(t.idx, 255);
	assert_string_equal(t.shard, "s1");
	bson_destroy(missing);
	bson_destroy(num);
	bson_destroy(odd);
	bson_destroy(nothex);
	bson_destroy(shortt);
	bson_destroy(badver);
	bson_destroy(badkind);
	bson_destroy(badlen);
	bson_destroy(hwmshard);
	bson_destroy(lower);
}

static void test_order(void **state)
{
	/* sorted ascending as the contract orders them */
	sdb_cs_token s[] = {
		tok(5, SDB_CS_HWM, "", 0),
		tok(6, SDB_CS_EVENT, "a", 0),
		tok(6, SDB_CS_EVENT, "a", 1),
		tok(6, SDB_CS_INVALIDATE, "a", 1),
		tok(6, SDB_CS_EVENT, "b", 0),
		tok(6, SDB_CS_EVENT, "ba", 0),
		tok(6, SDB_CS_HWM, "", 0),
		tok(((uint64_t)1 << 32), SDB_CS_EVENT, "", 0),
	};
	size_t n = sizeof(s) / sizeof(s[0]), i, j;

	(void)state;
	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++) {
			int c = sdb_cs_token_cmp(&s[i], &s[j]);

			if (i < j)
				assert_true(c < 0);
			else if (i > j)
				assert_true(c > 0);
			else
				assert_int_equal(c, 0);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_bytes),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
