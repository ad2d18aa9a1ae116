/* Unit tests of src/common/bsonget.c: MongoDB's numeric-field rules and the range check
 * that keeps INT64_MIN away from `x = -x`. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/bsonget.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bsonget.h"
#include "common/err.h"

/* Read field "v" of doc with sdb_bson_find_int64 in [lo, hi]; returns the status. */
static int get(const bson_t *doc, int64_t lo, int64_t hi, int64_t *out, sdb_bson_err *e)
{
	memset(e, 0, sizeof *e);
	return sdb_bson_find_int64(doc, "v", lo, hi, -7, out, e);
}

static void test_integral_types_accepted(void **state)
{
	bson_t *d32 = BCON_NEW("v", BCON_INT32(-5));
	bson_t *d64 = BCON_NEW("v", BCON_INT64(INT64_MAX));
	bson_t *dd = BCON_NEW("v", BCON_DOUBLE(42.0));
	bson_t *dneg = BCON_NEW("v", BCON_DOUBLE(-9223372036854775808.0)); /* -2^63 exact */
	sdb_bson_err e;
	int64_t v = 0;

	(void)state;
	assert_int_equal(get(d32, INT64_MIN, INT64_MAX, &v, &e), 0);
	assert_int_equal(v, -5);
	assert_int_equal(get(d64, INT64_MIN, INT64_MAX, &v, &e), 0);
	assert_true(v == INT64_MAX);
	assert_int_equal(get(dd, 0, 100, &v, &e), 0);
	assert_int_equal(v, 42);
	assert_int_equal(get(dneg, INT64_MIN, INT64_MAX, &v, &e), 0);
	assert_true(v == INT64_MIN);
	bson_destroy(d32);
	bson_destroy(d64);
	bson_destroy(dd);
	bson_destroy(dneg);
}

static void test_absent_gives_default(void **state)
{
	bson_t *d = BCON_NEW("other", BCON_INT32(1));
	sdb_bson_err e;
	int64_t v = 0;

	(void)state;
	assert_int_equal(get(d, 0, 10, &v, &e), 0);
	assert_int_equal(v, -7);
	bson_destroy(d);
}

static void test_doubles_must_be_integral_int64(void **state)
{
	const double bad[] = {1.5, -0.25, NAN, INFINITY, -INFINITY, 9223372036854775808.0,
			      -9223372036854777856.0 /* the double below -2^63 */};
	sdb_bson_err e;
	int64_t v = 123;

	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		bson_t *d = BCON_NEW("v", BCON_DOUBLE(bad[i]));
		assert_int_equal(get(d, INT64_MIN, INT64_MAX, &v, &e), SDB_EINVAL);
		assert_int_equal(e.code, SDB_BSONGET_FAILED_TO_PARSE);
		assert_non_null(strstr(e.msg, "Expected an integer: v:"));
		assert_int_equal(v, 123); /* untouched on error */
		bson_destroy(d);
	}
}

static void test_wrong_type_names_field_and_type(void **state)
{
	bson_t *s = BCON_NEW("v", BCON_UTF8("10"));
	bson_t *b = BCON_NEW("v", BCON_BOOL(true));
	sdb_bson_err e;
	int64_t v;

	(void)state;
	assert_int_equal(get(s, 0, 100, &v, &e), SDB_EINVAL);
	assert_int_equal(e.code, SDB_BSONGET_TYPE_MISMATCH);
	assert_string_equal(e.msg,
			    "BSON field 'v' is the wrong type 'string', expected types '[long, int, "
			    "double]'");
	assert_int_equal(get(b, 0, 100, &v, &e), SDB_EINVAL);
	assert_int_equal(e.code, SDB_BSONGET_TYPE_MISMATCH);
	assert_non_null(strstr(e.msg, "'bool'"));
	bson_destroy(s);
	bson_destroy(b);
}

/* The regression of issue #24: INT64_MIN as a limit must be refused before anyone negates
 * it (and the refusal itself must not overflow formatting it). */
static void test_int64_min_refused_by_range(void **state)
{
	bson_t *d = BCON_NEW("v", BCON_INT64(INT64_MIN));
	sdb_bson_err e;
	int64_t v = 0;

	(void)state;
	assert_int_equal(get(d, -INT64_MAX, INT64_MAX, &v, &e), SDB_EINVAL);
	assert_int_equal(e.code, SDB_BSONGET_BELOW_MIN);
	assert_string_equal(e.msg, "BSON field 'v' value must be >= -9223372036854775807, actual "
				   "value '-9223372036854775808'");
	assert_int_equal(get(d, 0, INT64_MAX, &v, &e), SDB_EINVAL);
	assert_int_equal(e.code, SDB_BSONGET_BELOW_MIN);
	assert_string_equal(e.msg, "BSON field 'v' value must be >= 0, actual value "
				   "'-9223372036854775808'");
	bson_destroy(d);
}

static void test_above_max_refused(void **state)
{
	bson_t *d = BCON_NEW("v", BCON_INT32(11));
	sdb_bson_err e;
	int64_t v = 0;

	(void)state;
	assert_int_equal(get(d, 0, 10, &v, &e), SDB_EINVAL);
	assert_int_equal(e.code, SDB_BSONGET_BAD_VALUE);
	assert_string_equal(e.msg, "BSON field 'v' value must be <= 10, actual value '11'");
	assert_int_equal(sdb_bson_find_int64(d, "v", 0, 10, 0, &v, NULL), SDB_EINVAL);
	bson_destroy(d);
}

static void test_as_int64_without_message(void **state)
{
	bson_t *d = BCON_NEW("a", BCON_INT32(3), "b", BCON_DOUBLE(2.5), "c", BCON_UTF8("x"));
	bson_iter_t it;
	int64_t v = 0;

	(void)state;
	assert_true(bson_iter_init_find(&it, d, "a") && sdb_bson_as_int64(&it, &v));
	assert_int_equal(v, 3);
	assert_true(bson_iter_init_find(&it, d, "b"));
	assert_false(sdb_bson_as_int64(&it, &v));
	assert_true(bson_iter_init_find(&it, d, "c"));
	assert_false(sdb_bson_as_int64(&it, &v));
	assert_string_equal(sdb_bson_type_name(BSON_TYPE_INT64), "long");
	assert_string_equal(sdb_bson_type_name(BSON_TYPE_EOD), "missing");
	bson_destroy(d);
}

/* sdb_bson_as_int64_exact: int32 and int64 as they are (INT64_MIN included); a double,
 * even an integral one, a bool and a string refused with *out untouched. */
static void test_as_int64_exact_refuses_doubles(void **state)
{
	bson_t *d = BCON_NEW("a", BCON_INT32(-7), "b", BCON_INT64(INT64_MIN), "c", BCON_DOUBLE(4.0),
			     "d", BCON_BOOL(true), "e", BCON_UTF8("5"));
	bson_iter_t it;
	int64_t v = 0;

	(void)state;
	assert_true(bson_iter_init_find(&it, d, "a") && sdb_bson_as_int64_exact(&it, &v));
	assert_int_equal(v, -7);
	assert_true(bson_iter_init_find(&it, d, "b") && sdb_bson_as_int64_exact(&it, &v));
	assert_true(v == INT64_MIN);
	v = 42;
	assert_true(bson_iter_init_find(&it, d, "c"));
	assert_false(sdb_bson_as_int64_exact(&it, &v));
	assert_true(bson_iter_init_find(&it, d, "d"));
	assert_false(sdb_bson_as_int64_exact(&it, &v));
	assert_true(bson_iter_init_find(&it, d, "e"));
	assert_false(sdb_bson_as_int64_exact(&it, &v));
	assert_int_equal(v, 42);
	bson_destroy(d);
}

/* sdb_bson_well_formed: a nested document whose last byte is not its terminator (what
 * bson_validate with BSON_VALIDATE_NONE lets through) is refused; a valid one and its
 * depth bound are honoured. */
static void test_well_formed_nested(void **state)
{
	(void)state;
	/* {a: {b: 1}} */
	uint8_t good[20] = {20, 0, 0, 0, 0x03, 'a', 0, 12, 0, 0, 0, 0x10, 'b', 0, 1, 0, 0, 0, 0, 0};
	uint8_t bad[20];
	bson_t d;
	memcpy(bad, good, sizeof bad);
	bad[18] = 0x50; /* the inner document's terminator */
	assert_true(bson_init_static(&d, good, sizeof good));
	assert_true(sdb_bson_well_formed(&d, 10));
	assert_false(sdb_bson_well_formed(&d, 0)); /* one level of nesting over a bound of 0 */
	assert_true(bson_init_static(&d, bad, sizeof bad));
	assert_false(sdb_bson_well_formed(&d, 10));
}

/* {x: CodeWScope("x", <scope>)} where the scope is {a: {a: ... {}}} nested `depth` deep
 * (the scope itself is one level). Heap buffer of *len bytes. */
static uint8_t *scope_doc(int depth, size_t *len)
{
	bson_t *inner = bson_new();
	for (int i = 0; i < depth; i++) {
		bson_t *outer = bson_new();
		BSON_APPEND_DOCUMENT(outer, "a", inner);
		bson_destroy(inner);
		inner = outer;
	}
	bson_t *d = bson_new();
	BSON_APPEND_CODE_WITH_SCOPE(d, "x", "x", inner);
	uint8_t *out = bson_destroy_with_steal(d, true, (uint32_t *)len);
	bson_destroy(inner);
	return out;
}

/* A code-with-scope's scope is a nested document for the depth bound (a scope nested
 * 100,000 deep killed the shard in bson_validate before) and must be well formed itself. */
static void test_well_formed_scope(void **state)
{
	(void)state;
	size_t len = 0;
	uint8_t *buf = scope_doc(3, &len);
	bson_t d;
	assert_true(bson_init_static(&d, buf, len));
	assert_true(sdb_bson_well_formed(&d, 4));  /* scope level 1, its {a: {a: {a: {}}}} 2..4 */
	assert_false(sdb_bson_well_formed(&d, 3));
	assert_true(bson_validate(&d, BSON_VALIDATE_NONE, NULL));
	/* the innermost empty document's length (its last byte: after it come its terminator,
	 * the three enclosing documents' and the top level's), broken: bson_validate refuses it
	 * too */
	buf[len - 1 - 3 - 1 - 1] = 0x7f;
	assert_true(bson_init_static(&d, buf, len));
	assert_false(bson_validate(&d, BSON_VALIDATE_NONE, NULL));
	assert_false(sdb_bson_well_formed(&d, 10));
	bson_free(buf);

	buf = scope_doc(5000, &len);
	assert_true(bson_init_static(&d, buf, len));
	assert_false(sdb_bson_well_formed(&d, 200));
	bson_free(buf);
}

/* Field names must be UTF-8 (bson_validate(NONE) refuses them too); an empty name is
 * allowed; a string value that is not UTF-8 is allowed, as with bson_validate(NONE) and
 * mongod's default validation. */
static void test_well_formed_utf8(void **state)
{
	(void)state;
	/* {"a\xff": 1} */
	uint8_t badkey[13] = {13, 0, 0, 0, 0x10, 'a', 0xff, 0, 1, 0, 0, 0, 0};
	/* {k: {"\xc3": 1}} */
	uint8_t badnested[20] = {20, 0, 0, 0, 0x03, 'k', 0, 12, 0, 0, 0, 0x10, 0xc3, 0, 1, 0, 0, 0,
				 0, 0};
	/* {"": "\xff"} */
	uint8_t badvalue[13] = {13, 0, 0, 0, 0x02, 0, 2, 0, 0, 0, 0xff, 0, 0};
	bson_t d;
	assert_true(bson_init_static(&d, badkey, sizeof badkey));
	assert_false(bson_validate(&d, BSON_VALIDATE_NONE, NULL));
	assert_false(sdb_bson_well_formed(&d, 10));
	assert_true(bson_init_static(&d, badnested, sizeof badnested));
	assert_false(bson_validate(&d, BSON_VALIDATE_NONE, NULL));
	assert_false(sdb_bson_well_formed(&d, 10));
	assert_true(bson_init_static(&d, badvalue, sizeof badvalue));
	assert_true(bson_validate(&d, BSON_VALIDATE_NONE, NULL));
	assert_true(sdb_bson_well_formed(&d, 10));
}

/* The reference the raw walk must agree with: the walk over libbson's iterator that
 * sdb_bson_well_formed was before (issue #19), so its verdict is libbson's own. */
static bool ref_well_formed(const bson_t *doc, int level, int max_depth)
{
	bson_iter_t it;
	if (level > max_depth || !bson_iter_init(&it, doc))
		return false;
	while (bson_iter_next(&it)) {
		const char *key = bson_iter_key(&it);
		uint32_t klen = bson_iter_key_len(&it);
		if (!bson_utf8_validate(key, klen, false))
			return false;
		const uint8_t *data = NULL;
		uint32_t len = 0, code_len = 0;
		bson_t sub;
		switch (bson_iter_type(&it)) {
		case BSON_TYPE_DOCUMENT:
			bson_iter_document(&it, &len, &data);
			break;
		case BSON_TYPE_ARRAY:
			bson_iter_array(&it, &len, &data);
			break;
		case BSON_TYPE_CODEWSCOPE:
			bson_iter_codewscope(&it, &code_len, &len, &data);
			break;
		default:
			continue;
		}
		if (data == NULL || !bson_init_static(&sub, data, len) ||
		    !ref_well_formed(&sub, level + 1, max_depth))
			return false;
	}
	return it.err_off == 0;
}

/* A document with an element of every BSON type, nested two levels (heap, *len bytes). */
static uint8_t *every_type_doc(uint32_t *len)
{
	bson_t *in = BCON_NEW("s", "str", "i", BCON_INT32(7), "l", BCON_INT64(-9), "d",
			      BCON_DOUBLE(1.5), "b", BCON_BOOL(true), "n", BCON_NULL);
	bson_t *scope = BCON_NEW("x", BCON_INT32(1));
	bson_t *d = bson_new();
	bson_oid_t oid;
	bson_decimal128_t dec;
	uint8_t bin[6] = {1, 2, 3, 4, 5, 6};

	bson_oid_init_from_string(&oid, "0123456789abcdef01234567");
	bson_decimal128_from_string("1.25", &dec);
	BSON_APPEND_UTF8(d, "s", "hello");
	BSON_APPEND_DOCUMENT(d, "doc", in);
	bson_t arr;
	BSON_APPEND_ARRAY_BEGIN(d, "arr", &arr);
	BSON_APPEND_DOCUMENT(&arr, "0", in);
	BSON_APPEND_INT32(&arr, "1", 3);
	bson_append_array_end(d, &arr);
	BSON_APPEND_BINARY(d, "bin", BSON_SUBTYPE_BINARY, bin, sizeof bin);
	BSON_APPEND_BINARY(d, "old", BSON_SUBTYPE_BINARY_DEPRECATED, bin, sizeof bin);
	BSON_APPEND_UNDEFINED(d, "u");
	BSON_APPEND_OID(d, "o", &oid);
	BSON_APPEND_BOOL(d, "f", false);
	BSON_APPEND_DATE_TIME(d, "t", 1234);
	BSON_APPEND_NULL(d, "nul");
	BSON_APPEND_REGEX(d, "re", "^a.*", "im");
	BSON_APPEND_DBPOINTER(d, "dbp", "db.coll", &oid);
	BSON_APPEND_CODE(d, "code", "function(){}");
	BSON_APPEND_SYMBOL(d, "sym", "sy");
	BSON_APPEND_CODE_WITH_SCOPE(d, "cws", "f()", scope);
	BSON_APPEND_INT32(d, "i32", -1);
	BSON_APPEND_TIMESTAMP(d, "ts", 5, 6);
	BSON_APPEND_INT64(d, "i64", 1);
	BSON_APPEND_DECIMAL128(d, "dec", &dec);
	BSON_APPEND_MAXKEY(d, "max");
	BSON_APPEND_MINKEY(d, "min");
	BSON_APPEND_UTF8(d, "\xc3\xa9t\xc3\xa9", "");
	uint8_t *out = bson_destroy_with_steal(d, true, len);
	bson_destroy(in);
	bson_destroy(scope);
	return out;
}

/* The raw walk and libbson's iterator agree on every document made by mutating one with
 * every type: bytes set to edge values or random ones (lengths, types, terminators, NULs,
 * key bytes), and truncations with the header and terminator fixed up. Each candidate is
 * copied to a buffer of exactly its length, so a read past it is AddressSanitizer's. */
static void test_well_formed_agrees_with_libbson(void **state)
{
	(void)state;
	static const uint8_t edge[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x0b, 0x0c,
				       0x0f, 0x13, 0x14, 0x7f, 0x80, 0xc3, 0xfe, 0xff};
	uint32_t len = 0;
	uint8_t *base = every_type_doc(&len);
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	unsigned accepted = 0, refused = 0;
	bson_t d;

	assert_true(bson_init_static(&d, base, len));
	assert_true(sdb_bson_well_formed(&d, 10));
	assert_true(ref_well_formed(&d, 0, 10));
	for (int round = 0; round < 200000; round++) {
		uint8_t *m = malloc(len);
		uint32_t mlen = len;
		memcpy(m, base, len);
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		int edits = 1 + (int)(seed % 3);
		for (int e = 0; e < edits; e++) {
			seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
			uint32_t at = 4 + (uint32_t)((seed >> 8) % (len - 5));
			uint8_t v = (seed >> 40) & 1 ? edge[(seed >> 48) % sizeof edge]
						     : (uint8_t)(seed >> 32);
			m[at] = v;
		}
		if (seed % 7 == 0) { /* truncate, then mend the header and the terminator */
			mlen = 5 + (uint32_t)((seed >> 20) % (len - 5));
			uint32_t le = BSON_UINT32_TO_LE(mlen);
			memcpy(m, &le, 4);
			m[mlen - 1] = 0;
		}
		uint8_t *exact = malloc(mlen);
		memcpy(exact, m, mlen);
		free(m);
		if (bson_init_static(&d, exact, mlen)) {
			int depth = (int)(seed % 4);
			bool ref = ref_well_formed(&d, 0, depth);
			bool got = sdb_bson_well_formed(&d, depth);
			if (ref != got)
				fail_msg("round %d: libbson %d, raw walk %d", round, ref, got);
			if (got)
				accepted++;
			else
				refused++;
		}
		free(exact);
	}
	/* both verdicts were exercised */
	assert_true(accepted > 1000);
	assert_true(refused > 1000);
	bson_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_integral_types_accepted),
		cmocka_unit_test(test_well_formed_nested),
		cmocka_unit_test(test_well_formed_scope),
		cmocka_unit_test(test_well_formed_utf8),
		cmocka_unit_test(test_well_formed_agrees_with_libbson),
		cmocka_unit_test(test_absent_gives_default),
		cmocka_unit_test(test_doubles_must_be_integral_int64),
		cmocka_unit_test(test_wrong_type_names_field_and_type),
		cmocka_unit_test(test_int64_min_refused_by_range),
		cmocka_unit_test(test_above_max_refused),
		cmocka_unit_test(test_as_int64_without_message),
		cmocka_unit_test(test_as_int64_exact_refuses_doubles),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
