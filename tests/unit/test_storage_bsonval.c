/* Unit tests of common/bsonval.c (MongoDB comparison order) and storage/sortspec.c.
 * The central table lists values in ascending MongoDB order with a rank; equal ranks are
 * equal values. Every pair of the table is compared both ways. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/bsonval.c"
#include "../../storage/sortspec.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bsonval.h"
#include "storage/sortspec.h"

/* Tests write JSON with single quotes; turn them into double quotes. */
static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (!b)
		fail_msg("bad test JSON %s: %s", s, e.message);
	free(s);
	return b;
}

typedef struct ranked {
	int rank;
	const char *json; /* the value v of {'v': ...} */
} ranked;

/* Ascending MongoDB order (docs "Comparison/Sort Order"). */
static const ranked order[] = {
	{0, "{'$minKey': 1}"},
	{1, "{'$undefined': true}"},
	{2, "null"},
	{3, "{'$numberDouble': 'NaN'}"},
	{3, "{'$numberDecimal': 'NaN'}"},
	{4, "{'$numberDouble': '-Infinity'}"},
	{4, "{'$numberDecimal': '-Infinity'}"},
	{5, "{'$numberDecimal': '-9.999999999999999999999999999999999E+6144'}"},
	{6, "{'$numberDecimal': '-1E+400'}"},
	{7, "-1e300"},
	{8, "{'$numberDecimal': '-9223372036854775809'}"},
	{9, "{'$numberLong': '-9223372036854775808'}"},
	{9, "-9223372036854775808.0"},
	{9, "{'$numberDecimal': '-9223372036854775808'}"},
	{9, "{'$numberDecimal': '-9.223372036854775808E+18'}"},
	{10, "{'$numberLong': '-9223372036854775807'}"},
	{10, "{'$numberDecimal': '-9223372036854775807'}"},
	{11, "-2"},
	{11, "-2.0"},
	{11, "{'$numberLong': '-2'}"},
	{11, "{'$numberDecimal': '-2'}"},
	{11, "{'$numberDecimal': '-2.000'}"},
	{12, "{'$numberDecimal': '-1.500000000000000000000000000000001'}"},
	{13, "-1.5"},
	{13, "{'$numberDecimal': '-1.5'}"},
	{13, "{'$numberDecimal': '-15E-1'}"},
	{14, "{'$numberDecimal': '-1E-10'}"},
	{15, "-5e-324"},
	{16, "{'$numberDecimal': '-1E-6176'}"},
	{17, "0"},
	{17, "-0.0"},
	{17, "{'$numberLong': '0'}"},
	{17, "{'$numberDecimal': '0'}"},
	{17, "{'$numberDecimal': '-0'}"},
	{17, "{'$numberDecimal': '0E+300'}"},
	{17, "{'$numberDecimal': '-0E-6176'}"},
	{18, "{'$numberDecimal': '1E-6176'}"},
	{19, "{'$numberDecimal': '4.940656458412465441765687928682213E-324'}"},
	{20, "5e-324"},
	{21, "{'$numberDecimal': '4.940656458412465441765687928682214E-324'}"},
	{22, "{'$numberDecimal': '0.1'}"},
	{23, "{'$numberDecimal': '0.1000000000000000055511151231257827'}"},
	{24, "0.1"},
	{25, "{'$numberDecimal': '0.1000000000000000055511151231257828'}"},
	{26, "0.5"},
	{26, "{'$numberDecimal': '0.5'}"},
	{26, "{'$numberDecimal': '0.50000'}"},
	{27, "{'$numberDecimal': '0.999999999999999999999'}"},
	{28, "1"},
	{28, "1.0"},
	{28, "{'$numberLong': '1'}"},
	{28, "{'$numberDecimal': '1.0'}"},
	{28, "{'$numberDecimal': '1'}"},
	{28, "{'$numberDecimal': '1.000000000000000000000000000000000'}"},
	{28, "{'$numberDecimal': '0.001E+3'}"},
	{28, "{'$numberDecimal': '1E0'}"},
	{29, "{'$numberDecimal': '1.000000000000000000000000000000001'}"},
	{30, "{'$numberDecimal': '1.000000000000000000001'}"},
	{31, "1.0000000000000002"},
	{32, "{'$numberLong': '9007199254740992'}"},
	{32, "9007199254740992.0"},
	{32, "{'$numberDecimal': '9007199254740992'}"},
	{33, "{'$numberLong': '9007199254740993'}"},
	{33, "{'$numberDecimal': '9007199254740993'}"},
	{34, "{'$numberDecimal': '9007199254740993.5'}"},
	{35, "{'$numberLong': '9007199254740994'}"},
	{35, "9007199254740994.0"},
	{36, "{'$numberLong': '9223372036854775807'}"},
	{36, "{'$numberDecimal': '9223372036854775807'}"},
	{37, "{'$numberDecimal': '9223372036854775807.5'}"},
	{38, "9223372036854775808.0"},
	{38, "{'$numberDecimal': '9223372036854775808'}"},
	{39, "{'$numberDecimal': '18446744073709551617'}"},
	{40, "{'$numberDecimal': '18446744073709551618'}"},
	{40, "{'$numberDecimal': '1.8446744073709551618E+19'}"},
	{41, "{'$numberDecimal': '1E+300'}"},
	{42, "1e300"},
	{43, "{'$numberDecimal': '1.797693134862315708145274237317043E+308'}"},
	{44, "1.7976931348623157e308"},
	{45, "{'$numberDecimal': '1.797693134862315708145274237317044E+308'}"},
	{46, "{'$numberDecimal': '1E+400'}"},
	{47, "{'$numberDecimal': '9.999999999999999999999999999999999E+6144'}"},
	{48, "{'$numberDouble': 'Infinity'}"},
	{48, "{'$numberDecimal': 'Infinity'}"},
	{49, "''"},
	{50, "'a'"},
	{50, "{'$symbol': 'a'}"},
	{51, "'ab'"},
	{52, "'b'"},
	{53, "'\\u00e9'"},
	{54, "{}"},
	{55, "{'b': null}"},
	{56, "{'a': 1}"},
	{56, "{'a': 1.0}"},
	{57, "{'a': 1, 'b': 1}"},
	{58, "{'a': 2}"},
	{59, "{'b': 1}"},
	{60, "{'a': 'x'}"},
	{61, "{'a': {}}"},
	{62, "[]"},
	{63, "[null]"},
	{64, "[1]"},
	{64, "[1.0]"},
	{65, "[1, 2]"},
	{66, "[2]"},
	{67, "['a']"},
	{68, "[[]]"},
	{69, "{'$binary': {'base64': 'AA==', 'subType': '00'}}"},
	{70, "{'$binary': {'base64': 'AQ==', 'subType': '00'}}"},
	{71, "{'$binary': {'base64': 'AA==', 'subType': '05'}}"},
	{72, "{'$binary': {'base64': 'AAA=', 'subType': '00'}}"},
	{73, "{'$oid': '000000000000000000000000'}"},
	{74, "{'$oid': '00000000000000000000ff00'}"},
	{75, "{'$oid': 'ffffffffffffffffffffffff'}"},
	{76, "false"},
	{77, "true"},
	{78, "{'$date': {'$numberLong': '-1'}}"},
	{79, "{'$date': {'$numberLong': '0'}}"},
	{80, "{'$date': {'$numberLong': '1000000000000'}}"},
	{81, "{'$timestamp': {'t': 1, 'i': 2}}"},
	{82, "{'$timestamp': {'t': 1, 'i': 3}}"},
	{83, "{'$timestamp': {'t': 2, 'i': 0}}"},
	{84, "{'$timestamp': {'t': 4294967295, 'i': 0}}"},
	{85, "{'$regularExpression': {'pattern': 'a', 'options': ''}}"},
	{86, "{'$regularExpression': {'pattern': 'a', 'options': 'i'}}"},
	{87, "{'$regularExpression': {'pattern': 'b', 'options': ''}}"},
	{88, "{'$dbPointer': {'$ref': 'b', '$id': {'$oid': '000000000000000000000000'}}}"},
	/* dbPointer: namespace length first, so 'aa' > 'b' */
	{89, "{'$dbPointer': {'$ref': 'aa', '$id': {'$oid': '000000000000000000000000'}}}"},
	{90, "{'$dbPointer': {'$ref': 'aa', '$id': {'$oid': '000000000000000000000001'}}}"},
	{91, "{'$code': 'x'}"},
	{92, "{'$code': 'y'}"},
	{93, "{'$code': 'x', '$scope': {}}"},
	{94, "{'$code': 'x', '$scope': {'a': 1}}"},
	{95, "{'$maxKey': 1}"},
};
#define N_ORDER (sizeof order / sizeof order[0])

static bson_t *docs[N_ORDER];

static int setup(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_ORDER; i++) {
		char json[256];

		snprintf(json, sizeof json, "{'v': %s}", order[i].json);
		docs[i] = J(json);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_ORDER; i++)
		bson_destroy(docs[i]);
	return 0;
}

static void value_of(size_t i, bson_iter_t *it)
{
	assert_true(bson_iter_init_find(it, docs[i], "v"));
}

static int sign(int x)
{
	return (x > 0) - (x < 0);
}

static void test_table_order(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_ORDER; i++) {
		for (size_t j = 0; j < N_ORDER; j++) {
			bson_iter_t a, b;
			int want = sign(order[i].rank - order[j].rank);
			int got;

			value_of(i, &a);
			value_of(j, &b);
			got = sign(sdb_bson_cmp(&a, &b));
			if (got != want)
				fail_msg("cmp(%s, %s) = %d, want %d", order[i].json, order[j].json,
					 got, want);
			/* the index key encoding agrees, both directions */
			for (int desc = 0; desc < 2; desc++) {
				sdb_key ka, kb;
				char err[128];

				sdb_key_init(&ka);
				sdb_key_init(&kb);
				assert_int_equal(sdb_keyenc_append_iter(&ka, &a, desc, err, sizeof err), 0);
				assert_int_equal(sdb_keyenc_append_iter(&kb, &b, desc, err, sizeof err), 0);
				got = sign(sdb_key_cmp(&ka, &kb));
				if (got != (desc ? -want : want))
					fail_msg("keycmp(%s, %s, desc %d) = %d, want %d", order[i].json,
						 order[j].json, desc, got, want);
				sdb_key_free(&ka);
				sdb_key_free(&kb);
			}
		}
	}
}

static void test_missing_is_null(void **state)
{
	bson_iter_t it;

	(void)state;
	value_of(2, &it); /* null */
	assert_int_equal(sdb_bson_cmp(NULL, &it), 0);
	assert_int_equal(sdb_bson_cmp(&it, NULL), 0);
	value_of(0, &it); /* MinKey < missing */
	assert_int_equal(sign(sdb_bson_cmp(&it, NULL)), -1);
	value_of(16, &it); /* 1 > missing */
	assert_true(sdb_bson_cmp(&it, NULL) > 0);
	assert_int_equal(sdb_bson_cmp(NULL, NULL), 0);
}

static void test_brackets(void **state)
{
	(void)state;
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_MINKEY), -1);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_EOD), 5);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_NULL), 5);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_INT32), 10);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_DECIMAL128), 10);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_SYMBOL), 15);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_ARRAY), 25);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_TIMESTAMP), 47);
	assert_int_equal(sdb_bson_bracket(BSON_TYPE_MAXKEY), 127);
}

/* Encodings libbson's parser never produces: non-canonical coefficients read as zero
 * (IEEE 754-2008 3.5.2), NaN of either sign or signalling is NaN. */
static void test_decimal_noncanonical(void **state)
{
	static const struct {
		uint64_t high, low;
		int want_vs_zero; /* sign of cmp(value, int 0) */
	} cases[] = {
		/* exponent 0, coefficient 2^113 - 1 > 10^34 - 1 */
		{UINT64_C(0x3041ffffffffffff), UINT64_MAX, 0},
		/* negative, same */
		{UINT64_C(0xb041ffffffffffff), UINT64_MAX, 0},
		/* the "11" combination form (implicit 0b100 coefficient prefix) */
		{UINT64_C(0x6000000000000000) | (UINT64_C(6176) << 47), 5, 0},
		/* 10^34 - 1 (canonical maximum coefficient) at exponent 0 */
		{UINT64_C(0x3041ed09bead87c0), UINT64_C(0x378d8e63ffffffff), 1},
		/* -NaN, sNaN: below every number */
		{UINT64_C(0xfc00000000000000), 0, -1},
		{UINT64_C(0x7e00000000000000), 7, -1},
	};
	bson_value_t zero = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 0};
	bson_value_t nan = {.value_type = BSON_TYPE_DOUBLE, .value.v_double = NAN};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_value_t v = {.value_type = BSON_TYPE_DECIMAL128};
		sdb_key ka, kb;
		char err[64];

		v.value.v_decimal128.high = cases[i].high;
		v.value.v_decimal128.low = cases[i].low;
		assert_int_equal(sign(sdb_bson_value_cmp(&v, &zero)), cases[i].want_vs_zero);
		assert_int_equal(sign(sdb_bson_value_cmp(&zero, &v)), -cases[i].want_vs_zero);
		if (cases[i].want_vs_zero < 0)
			assert_int_equal(sdb_bson_value_cmp(&v, &nan), 0);
		sdb_key_init(&ka);
		sdb_key_init(&kb);
		assert_int_equal(sdb_keyenc_append_value(&ka, &v, false, err, sizeof err), 0);
		assert_int_equal(sdb_keyenc_append_value(&kb, &zero, false, err, sizeof err), 0);
		assert_int_equal(sign(sdb_key_cmp(&ka, &kb)), cases[i].want_vs_zero);
		sdb_key_free(&ka);
		sdb_key_free(&kb);
	}
}

/* Op version 4 chunk bounds keep the long-double decimal order (raft/fsm.c). */
static void test_key_cmp_v4(void **state)
{
	bson_t *one = J("{'k': {'$numberDecimal': '1'}}");
	bson_t *one_plus = J("{'k': {'$numberDecimal': '1.000000000000000000001'}}");
	bson_t *two = J("{'k': 2}");

	(void)state;
	assert_true(sdb_bson_key_cmp(one, one_plus) < 0);
	assert_int_equal(sdb_bson_key_cmp_v4(one, one_plus), 0);
	assert_true(sdb_bson_key_cmp_v4(one_plus, two) < 0);
	assert_true(sdb_bson_key_cmp_v4(two, one) > 0);
	bson_destroy(one);
	bson_destroy(one_plus);
	bson_destroy(two);
}

static void test_num_canon(void **state)
{
	bson_value_t v = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 6};
	sdb_bson_num n;

	(void)state;
	assert_true(sdb_bson_num_canon(&v, &n));
	/* 6 = 2^2 * 1.5 */
	assert_int_equal(n.cls, 4);
	assert_int_equal(n.exp, 2);
	assert_true(n.frac == UINT64_C(1) << 63);
	v.value_type = BSON_TYPE_DOUBLE;
	v.value.v_double = -0.75; /* -(2^-1 * 1.5) */
	assert_true(sdb_bson_num_canon(&v, &n));
	assert_int_equal(n.cls, 2);
	assert_int_equal(n.exp, -1);
	assert_true(n.frac == UINT64_C(1) << 63);
	v.value_type = BSON_TYPE_INT64;
	v.value.v_int64 = INT64_MIN;
	assert_true(sdb_bson_num_canon(&v, &n));
	assert_int_equal(n.cls, 2);
	assert_int_equal(n.exp, 63);
	assert_true(n.frac == 0);
	v.value_type = BSON_TYPE_UTF8;
	assert_false(sdb_bson_num_canon(&v, &n));
}

static void test_value_eq_and_doc_cmp(void **state)
{
	bson_t *a = J("{'x': 1, 'y': [1, {'z': 'q'}]}");
	bson_t *b = J("{'x': {'$numberLong': '1'}, 'y': [1.0, {'z': {'$symbol': 'q'}}]}");
	bson_t *c = J("{'y': [1, {'z': 'q'}], 'x': 1}");

	(void)state;
	assert_int_equal(sdb_bson_doc_cmp(a, b), 0);
	/* field order matters: 'x' < 'y' at the first element, both numbers? no: y is an
	 * array (bracket 25) vs x a number (10): the array document sorts after */
	assert_true(sdb_bson_doc_cmp(a, c) < 0);
	assert_true(sdb_bson_doc_cmp(c, a) > 0);
	bson_destroy(a);
	bson_destroy(b);
	bson_destroy(c);
}

/* sdb_bson_key_cmp: shard-key documents (chunk bounds) component by component, names
 * ignored, shorter first; the order routing and metadata share. */
static void test_key_cmp(void **state)
{
	static const struct {
		const char *a, *b;
		int want;
	} cases[] = {
		{"{'a': 1, 'b': {'$minKey': 1}}", "{'a': 1, 'b': 'x'}", -1},
		{"{'a': 1, 'b': 'x'}", "{'a': 1, 'b': {'$maxKey': 1}}", -1},
		{"{'a': 1, 'b': {'$maxKey': 1}}", "{'a': 2, 'b': {'$minKey': 1}}", -1},
		{"{'k': 100}", "{'k': {'$numberDecimal': '100.5'}}", -1},
		{"{'k': {'$numberDecimal': '100.5'}}", "{'k': 101.0}", -1},
		{"{'k': {'$numberDecimal': '50'}}", "{'k': 10}", 1}, /* by value, not as 0 */
		{"{'k': {'$numberDouble': 'NaN'}}", "{'k': {'$numberDouble': '-Infinity'}}", -1},
		{"{'k': {'$numberDouble': 'NaN'}}", "{'k': {'$numberDecimal': 'NaN'}}", 0},
		{"{'k': null}", "{'k': {'$numberDouble': 'NaN'}}", -1},
		{"{'k': {'$timestamp': {'t': 1, 'i': 2}}}", "{'k': {'$timestamp': {'t': 1, 'i': 3}}}",
		 -1},
		{"{'k': {'$binary': {'base64': 'AQ==', 'subType': '00'}}}",
		 "{'k': {'$binary': {'base64': 'AA==', 'subType': '05'}}}", -1},
		{"{'k': {'x': [1, 2]}}", "{'k': {'x': [1, 3]}}", -1},
		{"{'x': 1}", "{'y': 1.0}", 0}, /* names ignored */
		{"{'a': 1}", "{'a': 1, 'b': {'$minKey': 1}}", -1}, /* shorter first */
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *a = J(cases[i].a), *b = J(cases[i].b);
		int got = sign(sdb_bson_key_cmp(a, b)), back = sign(sdb_bson_key_cmp(b, a));

		if (got != cases[i].want || back != -cases[i].want)
			fail_msg("key_cmp(%s, %s) = %d / %d, want %d", cases[i].a, cases[i].b, got,
				 back, cases[i].want);
		bson_destroy(a);
		bson_destroy(b);
	}
}

static void test_depth(void **state)
{
	bson_t *d = J("{'a': {'b': [{'c': 1}]}}");

	(void)state;
	assert_true(sdb_bson_depth_ok(d, 3));
	assert_false(sdb_bson_depth_ok(d, 2));
	bson_destroy(d);
}

/* A document nested far beyond SDB_BSON_MAX_DEPTH compares without crashing. */
static void test_deep_compare(void **state)
{
	bson_t *d[2];

	(void)state;
	for (int k = 0; k < 2; k++) {
		bson_t *cur = bson_new();

		BSON_APPEND_INT32(cur, "leaf", k);
		for (int i = 0; i < 1000; i++) {
			bson_t *outer = bson_new();

			BSON_APPEND_DOCUMENT(outer, "a", cur);
			bson_destroy(cur);
			cur = outer;
		}
		d[k] = cur;
	}
	assert_false(sdb_bson_depth_ok(d[0], SDB_BSON_MAX_DEPTH));
	assert_true(sdb_bson_doc_cmp(d[0], d[1]) != 0);
	assert_int_equal(sdb_bson_doc_cmp(d[0], d[0]), 0);
	bson_destroy(d[0]);
	bson_destroy(d[1]);
}

/* ---- sortspec ---------------------------------------------------------------------- */

static void sort_err(const char *spec, int want_code, const char *want_msg)
{
	bson_t *s = J(spec);
	sdb_sortspec *ss = NULL;
	int code = 0;
	char err[256] = "";

	assert_int_equal(sdb_sortspec_parse(s, &ss, &code, err, sizeof err), -2);
	assert_null(ss);
	assert_int_equal(code, want_code);
	assert_string_equal(err, want_msg);
	bson_destroy(s);
}

static void test_sortspec_parse(void **state)
{
	bson_t *s = J("{'a': 1, 'b.c': -1.0, 'd': {'$numberLong': '-1'}}");
	sdb_sortspec *ss = NULL;
	char err[256];

	(void)state;
	assert_int_equal(sdb_sortspec_parse(s, &ss, NULL, err, sizeof err), 0);
	assert_int_equal(sdb_sortspec_nfields(ss), 3);
	assert_string_equal(sdb_sortspec_path(ss, 1), "b.c");
	assert_int_equal(sdb_sortspec_dir(ss, 0), 1);
	assert_int_equal(sdb_sortspec_dir(ss, 1), -1);
	assert_int_equal(sdb_sortspec_dir(ss, 2), -1);
	assert_int_equal(sdb_sortspec_natural(ss), 0);
	sdb_sortspec_free(ss);
	bson_destroy(s);

	s = J("{'$natural': -1}");
	assert_int_equal(sdb_sortspec_parse(s, &ss, NULL, err, sizeof err), 0);
	assert_int_equal(sdb_sortspec_natural(ss), -1);
	assert_int_equal(sdb_sortspec_nfields(ss), 0);
	sdb_sortspec_free(ss);
	bson_destroy(s);

	sort_err("{'a': 2}", 15975,
		 "$sort key ordering must be 1 (for ascending) or -1 (for descending)");
	sort_err("{'a': 'asc'}", 15975,
		 "$sort key ordering must be 1 (for ascending) or -1 (for descending)");
	sort_err("{'': 1}", 40352, "FieldPath cannot be constructed with empty string");
	sort_err("{'a..b': 1}", 2, "FieldPath field names may not be empty strings.");
	sort_err("{'a': {'$meta': 'textScore'}}", 2,
		 "$meta sort (field a) is not supported by stripedb");
	sort_err("{'$natural': 1, 'a': 1}", 2,
		 "$natural sort cannot be mixed with other sort fields");
}

/* Sort documents by spec with the comparator and check the resulting order of 'i'. */
static const bson_t *sort_docs_arr[16];
static const sdb_sortspec *sort_cur;

/* Stable insertion sort (ties keep the input order). */
static void stable_sort(const bson_t **a, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		const bson_t *x = a[i];
		size_t j = i;

		while (j > 0 && sdb_sortspec_cmp(sort_cur, a[j - 1], x) > 0) {
			a[j] = a[j - 1];
			j--;
		}
		a[j] = x;
	}
}

static void check_sort(const char *spec, const char *const *docs_json, size_t n,
		       const int *want_ids)
{
	bson_t *s = J(spec);
	bson_t *d[16];
	sdb_sortspec *ss = NULL;
	char err[256];

	assert_true(n <= 16);
	assert_int_equal(sdb_sortspec_parse(s, &ss, NULL, err, sizeof err), 0);
	for (size_t i = 0; i < n; i++) {
		d[i] = J(docs_json[i]);
		sort_docs_arr[i] = d[i];
	}
	sort_cur = ss;
	stable_sort(sort_docs_arr, n);
	for (size_t i = 0; i < n; i++) {
		bson_iter_t it;

		assert_true(bson_iter_init_find(&it, sort_docs_arr[i], "i"));
		if (bson_iter_int32(&it) != want_ids[i])
			fail_msg("%s: position %zu has i=%d, want %d", spec, i, bson_iter_int32(&it),
				 want_ids[i]);
	}
	/* the memcmp sort key gives the same order */
	for (size_t i = 0; i + 1 < n; i++) {
		sdb_key ka, kb;

		sdb_key_init(&ka);
		sdb_key_init(&kb);
		assert_int_equal(sdb_sortspec_key(ss, sort_docs_arr[i], &ka, err, sizeof err), 0);
		assert_int_equal(sdb_sortspec_key(ss, sort_docs_arr[i + 1], &kb, err, sizeof err), 0);
		assert_int_equal(sign(sdb_key_cmp(&ka, &kb)),
				 sign(sdb_sortspec_cmp(ss, sort_docs_arr[i], sort_docs_arr[i + 1])));
		sdb_key_free(&ka);
		sdb_key_free(&kb);
	}
	for (size_t i = 0; i < n; i++)
		bson_destroy(d[i]);
	sdb_sortspec_free(ss);
	bson_destroy(s);
}

static void test_sortspec_arrays_missing(void **state)
{
	/* MongoDB docs: ascending sort uses the smallest element, descending the largest;
	 * missing sorts as null; an empty array sorts before null. */
	static const char *const d[] = {
		"{'i': 0, 'a': [5, 1]}",   /* min 1, max 5 */
		"{'i': 1, 'a': 3}",
		"{'i': 2}",                /* missing == null */
		"{'i': 3, 'a': null}",
		"{'i': 4, 'a': []}",       /* below null */
		"{'i': 5, 'a': [2, 'z']}", /* min 2, max 'z' (string bracket) */
		"{'i': 6, 'a': 'b'}",
	};
	static const int asc[] = {4, 2, 3, 0, 5, 1, 6};
	static const int desc[] = {5, 6, 0, 1, 2, 3, 4};

	(void)state;
	check_sort("{'a': 1}", d, 7, asc);
	check_sort("{'a': -1}", d, 7, desc);
}

/* MongoDB jstests/core/query/sort/sorta.js (SERVER-2905) and
 * sort_key_with_missing_fields.js (SERVER-42565): [] sorts as undefined (equal to
 * undefined, below null), missing sorts as null. */
static void test_sortspec_jstests(void **state)
{
	static const char *const sorta[] = {
		"{'i': 0, 'a': {'$minKey': 1}}", "{'i': 1, 'a': []}", "{'i': 2, 'a': []}",
		"{'i': 3, 'a': null}",		 "{'i': 4}",	       "{'i': 5, 'a': null}",
		"{'i': 6, 'a': 1}",		 "{'i': 7, 'a': [2]}", "{'i': 8, 'a': {'$maxKey': 1}}",
	};
	static const int sorta_want[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
	static const char *const missing[] = {
		"{'i': 1, 'a': {'$undefined': true}}", "{'i': 2, 'a': null}", "{'i': 3, 'a': []}",
		"{'i': 4}", "{'i': 5}", "{'i': 6, 'a': []}", "{'i': 7, 'a': null}",
		"{'i': 8, 'a': {'$undefined': true}}",
	};
	static const int asc_want[] = {1, 3, 6, 8, 2, 4, 5, 7};
	static const int desc_want[] = {2, 4, 5, 7, 1, 3, 6, 8};

	(void)state;
	check_sort("{'a': 1, 'i': 1}", sorta, 9, sorta_want);
	check_sort("{'a': 1, 'i': 1}", missing, 8, asc_want);
	check_sort("{'a': -1, 'i': 1}", missing, 8, desc_want);
}

static void test_sortspec_compound_dotted(void **state)
{
	static const char *const d[] = {
		"{'i': 0, 'a': {'b': 2}, 'c': 1}",
		"{'i': 1, 'a': [{'b': 9}, {'b': 1}], 'c': 1}", /* asc sort value of a.b: 1 */
		"{'i': 2, 'a': {'b': 2}, 'c': 3}",
		"{'i': 3, 'a': {'b': {'$numberLong': '2'}}, 'c': 2}",
		"{'i': 4, 'a': [{'x': 1}, {'b': 3}], 'c': 0}", /* missing in an element: null */
	};
	static const int want[] = {4, 1, 2, 3, 0};

	(void)state;
	check_sort("{'a.b': 1, 'c': -1}", d, 5, want);
}

/* Property (fixed seed): for random documents, the memcmp order of sdb_sortspec_key
 * equals sdb_sortspec_cmp for every pair, for several specs (arrays, missing, dotted). */
static uint64_t prng = 0xC0FFEE1234ULL;

static unsigned rnd(unsigned n)
{
	prng ^= prng << 13;
	prng ^= prng >> 7;
	prng ^= prng << 17;
	return (unsigned)(prng % n);
}

/* A random value of order[] for the JSON generator, never a dbPointer nor code with scope:
 * libbson 1.23's JSON reader intermittently fails with "Error storing DBPointer" / "Error
 * storing Javascript code" for one inside an array (the same input passes on a rerun; the
 * ordering of both types is checked by test_table_order, outside arrays). */
static const char *pick_json(void)
{
	for (;;) {
		const char *j = order[rnd(N_ORDER)].json;
		if (strstr(j, "$dbPointer") == NULL && strstr(j, "$scope") == NULL)
			return j;
	}
}

static void test_sortspec_key_property(void **state)
{
	static const char *const specs[] = {"{'a': 1}", "{'a': -1}", "{'a': 1, 'b': -1}",
					    "{'b': -1, 'a': -1}", "{'a.x': 1, 'b': 1}"};
	enum { NDOCS = 300 };
	bson_t *d[NDOCS];
	char json[512];

	(void)state;
	for (int i = 0; i < NDOCS; i++) {
		size_t len;

		snprintf(json, sizeof json, "{");
		for (int f = 0; f < 2; f++) {
			const char *name = f ? "b" : "a";
			unsigned shape = rnd(5);

			len = strlen(json);
			if (shape == 0)
				continue; /* missing */
			if (shape == 1)
				snprintf(json + len, sizeof json - len, "%s'%s': %s", len > 1 ? ", " : "",
					 name, pick_json());
			else if (shape == 2)
				snprintf(json + len, sizeof json - len, "%s'%s': [%s, %s]",
					 len > 1 ? ", " : "", name, pick_json(),
					 pick_json());
			else if (shape == 3)
				snprintf(json + len, sizeof json - len, "%s'%s': {'x': %s}",
					 len > 1 ? ", " : "", name, pick_json());
			else
				snprintf(json + len, sizeof json - len, "%s'%s': [{'x': %s}, {'y': 1}]",
					 len > 1 ? ", " : "", name, pick_json());
		}
		strncat(json, "}", sizeof json - strlen(json) - 1);
		d[i] = J(json);
	}
	for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
		bson_t *sb = J(specs[s]);
		sdb_sortspec *ss = NULL;
		sdb_key keys[NDOCS];
		char err[128];

		assert_int_equal(sdb_sortspec_parse(sb, &ss, NULL, err, sizeof err), 0);
		for (int i = 0; i < NDOCS; i++) {
			sdb_key_init(&keys[i]);
			assert_int_equal(sdb_sortspec_key(ss, d[i], &keys[i], err, sizeof err), 0);
		}
		for (int i = 0; i < NDOCS; i++) {
			for (int j = 0; j < NDOCS; j++) {
				int c = sign(sdb_sortspec_cmp(ss, d[i], d[j]));
				int k = sign(sdb_key_cmp(&keys[i], &keys[j]));

				if (c != k) {
					char *a = bson_as_relaxed_extended_json(d[i], NULL);
					char *b = bson_as_relaxed_extended_json(d[j], NULL);

					fail_msg("%s: cmp(%s, %s) = %d, keys %d", specs[s], a, b, c, k);
				}
			}
		}
		for (int i = 0; i < NDOCS; i++)
			sdb_key_free(&keys[i]);
		sdb_sortspec_free(ss);
		bson_destroy(sb);
	}
	for (int i = 0; i < NDOCS; i++)
		bson_destroy(d[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_order),
		cmocka_unit_test(test_missing_is_null),
		cmocka_unit_test(test_brackets),
		cmocka_unit_test(test_num_canon),
		cmocka_unit_test(test_decimal_noncanonical),
		cmocka_unit_test(test_key_cmp_v4),
		cmocka_unit_test(test_value_eq_and_doc_cmp),
		cmocka_unit_test(test_key_cmp),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_deep_compare),
		cmocka_unit_test(test_sortspec_parse),
		cmocka_unit_test(test_sortspec_arrays_missing),
		cmocka_unit_test(test_sortspec_jstests),
		cmocka_unit_test(test_sortspec_compound_dotted),
		cmocka_unit_test(test_sortspec_key_property),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
