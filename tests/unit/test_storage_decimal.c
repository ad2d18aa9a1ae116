/* Unit tests of storage/decimal.c: Decimal128 arithmetic through GCC's _Decimal128, checked
 * against libbson's string conversions (exact digits and exponents), mongod's 15-digit
 * conversion of doubles and the DoubleDoubleSummation. */

/* The module under test, compiled into this binary (statics included). */
#include "../../storage/decimal.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static bson_decimal128_t D(const char *s)
{
	bson_decimal128_t d;

	if (!bson_decimal128_from_string(s, &d)) {
		fail_msg("bad decimal %s", s);
	}
	return d;
}

static char buf[8][BSON_DECIMAL128_STRING];
static int bufi;

static const char *S(bson_decimal128_t d)
{
	char *b = buf[bufi++ % 8];

	bson_decimal128_to_string(&d, b);
	return b;
}

/* bson_decimal128_t's {low, high} is _Decimal128's memory: a literal and libbson agree. */
static void test_layout(void **state)
{
	(void)state;
#if !defined(__clang__) /* clang has no decimal literals (decimal.c calls libgcc then) */
	bson_decimal128_t a = from_d(1.5DL), b = D("1.5");

	assert_int_equal(a.low, b.low);
	assert_int_equal(a.high, b.high);
	assert_string_equal(S(from_d(-0.000123DL)), "-0.000123");
#endif
	/* round trips of the special values through _Decimal128 and back */
	const char *specials[] = {"NaN", "Infinity", "-Infinity", "-0", "0E+10", "-0.00",
				  "9.999999999999999999999999999999999E+6144", "1E-6176"};
	for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
		bson_decimal128_t x = D(specials[i]);
		bson_decimal128_t y = from_d(to_d(x));

		assert_string_equal(S(y), S(x));
	}
	assert_true(sdb_dec_is_nan(D("NaN")));
	assert_false(sdb_dec_is_nan(D("Infinity")));
	assert_true(sdb_dec_is_zero(D("-0.00")));
	assert_false(sdb_dec_is_zero(D("1E-6176")));
}

static void test_add_sub(void **state)
{
	(void)state;
	assert_string_equal(S(sdb_dec_add(D("0.1"), D("0.2"))), "0.3");
	assert_string_equal(S(sdb_dec_add(D("1.10"), D("2.205"))), "3.305");
	assert_string_equal(S(sdb_dec_sub(D("100.00"), D("0.01"))), "99.99");
	assert_string_equal(S(sdb_dec_sub(D("1"), D("1"))), "0");
	/* 34 digits: the 35th is rounded half to even */
	assert_string_equal(S(sdb_dec_add(D("1000000000000000000000000000000000"), D("0.5"))),
			    "1000000000000000000000000000000000");
	assert_string_equal(S(sdb_dec_add(D("1000000000000000000000000000000001"), D("0.5"))),
			    "1000000000000000000000000000000002");
	/* overflow to Infinity, NaN propagation, Inf - Inf */
	assert_string_equal(S(sdb_dec_add(D("9.999999999999999999999999999999999E+6144"),
					  D("1E+6111"))),
			    "Infinity");
	assert_string_equal(S(sdb_dec_add(D("NaN"), D("1"))), "NaN");
	assert_string_equal(S(sdb_dec_sub(D("Infinity"), D("Infinity"))), "NaN");
	assert_string_equal(S(sdb_dec_add(D("-Infinity"), D("5"))), "-Infinity");
	/* signed zeros: -0 + 0 = 0, -0 + -0 = -0 (IEEE 754 round-half-even rules) */
	assert_string_equal(S(sdb_dec_add(D("-0"), D("0"))), "0");
	assert_string_equal(S(sdb_dec_add(D("-0"), D("-0"))), "-0");
	/* non-canonical coefficient (2^113 - 1 > 10^34 - 1) reads as zero */
	bson_decimal128_t nc = {.low = ~0ULL, .high = 0x3041ffffffffffffULL};

	assert_true(sdb_dec_is_zero(nc));
	assert_string_equal(S(sdb_dec_add(nc, D("7"))), "7");
}

static void test_mul_div(void **state)
{
	(void)state;
	assert_string_equal(S(sdb_dec_mul(D("1.50"), D("3"))), "4.50");
	assert_string_equal(S(sdb_dec_mul(D("-1.5"), D("0"))), "-0.0");
	assert_string_equal(S(sdb_dec_div(D("1"), D("3"))), "0.3333333333333333333333333333333333");
	assert_string_equal(S(sdb_dec_div(D("2"), D("3"))), "0.6666666666666666666666666666666667");
	assert_string_equal(S(sdb_dec_div(D("10"), D("4"))), "2.5");
	assert_string_equal(S(sdb_dec_div(D("1"), D("0"))), "Infinity");
	assert_string_equal(S(sdb_dec_div(D("-1"), D("0"))), "-Infinity");
	assert_string_equal(S(sdb_dec_div(D("0"), D("0"))), "NaN");
	assert_string_equal(S(sdb_dec_mul(D("1E+6000"), D("1E+6000"))), "Infinity");
}

static void test_mod_abs_floor_ceil(void **state)
{
	(void)state;
	assert_string_equal(S(sdb_dec_mod(D("10"), D("3"))), "1");
	assert_string_equal(S(sdb_dec_mod(D("-10"), D("3"))), "-1");
	assert_string_equal(S(sdb_dec_mod(D("10"), D("-3"))), "1");
	assert_string_equal(S(sdb_dec_mod(D("5.5"), D("2"))), "1.5");
	assert_string_equal(S(sdb_dec_mod(D("1E+20"), D("7"))), "2"); /* 10^20 mod 7 = 2 */
	assert_string_equal(S(sdb_dec_mod(D("0.3"), D("0.10"))), "0.00");
	assert_string_equal(S(sdb_dec_mod(D("1"), D("1E+40"))), "1");
	assert_string_equal(S(sdb_dec_mod(D("7"), D("Infinity"))), "7");
	assert_string_equal(S(sdb_dec_mod(D("Infinity"), D("7"))), "NaN");
	assert_string_equal(S(sdb_dec_mod(D("NaN"), D("7"))), "NaN");
	assert_string_equal(S(sdb_dec_mod(D("7"), D("0"))), "NaN");

	assert_string_equal(S(sdb_dec_abs(D("-2.50"))), "2.50");
	assert_string_equal(S(sdb_dec_abs(D("-Infinity"))), "Infinity");
	assert_string_equal(S(sdb_dec_abs(D("-0"))), "0");

	assert_string_equal(S(sdb_dec_floor(D("2.7"))), "2");
	assert_string_equal(S(sdb_dec_floor(D("-2.1"))), "-3");
	assert_string_equal(S(sdb_dec_ceil(D("2.1"))), "3");
	assert_string_equal(S(sdb_dec_ceil(D("-2.7"))), "-2");
	assert_string_equal(S(sdb_dec_ceil(D("-0.5"))), "-0");
	assert_string_equal(S(sdb_dec_floor(D("5.000"))), "5");
	assert_string_equal(S(sdb_dec_floor(D("1.2E+3"))), "1200");
	assert_string_equal(S(sdb_dec_floor(D("1E+40"))), "NaN");
	assert_string_equal(S(sdb_dec_floor(D("Infinity"))), "NaN");
	assert_string_equal(S(sdb_dec_ceil(D("0.000001"))), "1");
}

static void test_conversions(void **state)
{
	(void)state;
	/* Decimal128(double) rounds to exactly 15 significant digits */
	assert_string_equal(S(sdb_dec_from_double(0.1, true)), "0.100000000000000");
	assert_string_equal(S(sdb_dec_from_double(2.5, true)), "2.50000000000000");
	assert_string_equal(S(sdb_dec_from_double(-1.0 / 3, true)), "-0.333333333333333");
	assert_string_equal(S(sdb_dec_from_double(1e300, true)), "1.00000000000000E+300");
	assert_string_equal(S(sdb_dec_from_double(9.9999999999999999e22, true)),
			    "1.00000000000000E+23");
	/* zero is not quantized: Intel's binary64_to_bid128 gives 0 (exponent 0) */
	assert_string_equal(S(sdb_dec_from_double(0.0, true)), "0");
	assert_string_equal(S(sdb_dec_from_double(-0.0, true)), "-0");
	/* 34 digits keeps the exact value of a short binary fraction without trailing zeros */
	assert_string_equal(S(sdb_dec_from_double(0.5, false)), "0.5");
	assert_string_equal(S(sdb_dec_from_double(2.0, false)), "2");
	assert_string_equal(S(sdb_dec_from_double(INFINITY, true)), "Infinity");
	assert_true(sdb_dec_is_nan(sdb_dec_from_double(NAN, true)));
	/* ... and to 34 digits when asked (the exact binary value, rounded) */
	assert_string_equal(S(sdb_dec_from_double(0.1, false)),
			    "0.1000000000000000055511151231257827");
	/* integers exactly */
	assert_string_equal(S(sdb_dec_from_int64(INT64_MIN)), "-9223372036854775808");
	assert_string_equal(S(sdb_dec_from_int64(42)), "42");
	/* to int64: half to even, INT64_MIN when it does not fit */
	assert_int_equal(sdb_dec_to_int64(D("2.5")), 2);
	assert_int_equal(sdb_dec_to_int64(D("3.5")), 4);
	assert_int_equal(sdb_dec_to_int64(D("-2.51")), -3);
	assert_int_equal(sdb_dec_to_int64(D("1.2E+3")), 1200);
	assert_int_equal(sdb_dec_to_int64(D("-9223372036854775808")), INT64_MIN);
	assert_int_equal(sdb_dec_to_int64(D("9223372036854775807")), INT64_MAX);
	assert_int_equal(sdb_dec_to_int64(D("9223372036854775808")), INT64_MIN);
	assert_int_equal(sdb_dec_to_int64(D("1E+30")), INT64_MIN);
	assert_int_equal(sdb_dec_to_int64(D("NaN")), INT64_MIN);
	/* to double: nearest, half even */
	assert_true(sdb_dec_to_double(D("0.1")) == 0.1);
	assert_true(sdb_dec_to_double(D("1E+400")) == INFINITY);
	assert_true(isnan(sdb_dec_to_double(D("NaN"))));

	bson_value_t v = {0};
	bson_decimal128_t out;

	v.value_type = BSON_TYPE_INT32;
	v.value.v_int32 = -7;
	assert_true(sdb_dec_from_value(&v, &out));
	assert_string_equal(S(out), "-7");
	v.value_type = BSON_TYPE_DOUBLE;
	v.value.v_double = 0.2;
	assert_true(sdb_dec_from_value(&v, &out));
	assert_string_equal(S(out), "0.200000000000000");
	v.value_type = BSON_TYPE_UTF8;
	assert_false(sdb_dec_from_value(&v, &out));
}

static void test_ddsum(void **state)
{
	(void)state;
	sdb_ddsum s = {0};

	/* ten 0.1s: the compensated sum is the double nearest 1 */
	for (int i = 0; i < 10; i++) {
		sdb_ddsum_add_double(&s, 0.1);
	}
	assert_true(sdb_ddsum_double(&s) == 1.0);

	/* int64s beyond 2^53 stay exact */
	sdb_ddsum l = {0};

	sdb_ddsum_add_long(&l, INT64_MAX);
	sdb_ddsum_add_long(&l, -1);
	assert_true(sdb_ddsum_fits_long(&l));
	assert_int_equal(sdb_ddsum_long(&l), INT64_MAX - 1);
	sdb_ddsum_add_long(&l, 2);
	assert_false(sdb_ddsum_fits_long(&l));
	assert_string_equal(S(sdb_ddsum_decimal(&l)), "9223372036854775808");

	/* Infinity plus finite values: the plain sum, not NaN */
	sdb_ddsum inf = {0};

	sdb_ddsum_add_double(&inf, INFINITY);
	sdb_ddsum_add_double(&inf, 1);
	assert_true(sdb_ddsum_double(&inf) == INFINITY);
	assert_false(sdb_ddsum_fits_long(&inf));
	assert_string_equal(S(sdb_ddsum_decimal(&inf)), "Infinity");

	/* getDecimal of 0.5 + 0.25: the doubles' exact values */
	sdb_ddsum h = {0};

	sdb_ddsum_add_double(&h, 0.5);
	sdb_ddsum_add_double(&h, 0.25);
	assert_true(sdb_dec_to_double(sdb_ddsum_decimal(&h)) == 0.75);
	assert_true(sdb_dec_is_zero(sdb_dec_sub(sdb_ddsum_decimal(&h), D("0.75"))));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),	    cmocka_unit_test(test_add_sub),
		cmocka_unit_test(test_mul_div),	    cmocka_unit_test(test_mod_abs_floor_ceil),
		cmocka_unit_test(test_conversions), cmocka_unit_test(test_ddsum),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
