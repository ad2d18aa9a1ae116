/* Decimal128 arithmetic for the aggregation engine and the update operators.
 *
 * Values are libbson's bson_decimal128_t: IEEE 754-2008 decimal128 in the BID encoding,
 * which is BSON's encoding and the one GCC's _Decimal128 uses on x86-64 (libgcc
 * implements it with Intel's BID library, the library mongod links): {low, high} are the
 * two little-endian 64-bit halves, so a memcpy moves a value between the two types. Built
 * with clang (no _Decimal128), decimal.c calls the same libgcc functions directly.
 * Every operation rounds half to even to 34 digits, like mongod's Decimal128 (its default
 * rounding mode); overflow gives +-Infinity, invalid operations (0/0, Inf-Inf) NaN.
 * Non-canonical encodings (a coefficient above 10^34-1) read as zero with their sign and
 * exponent, as IEEE 754 and Intel's library define them.
 *
 * The behaviours follow MongoDB 6.0's src/mongo/platform/decimal128.cpp (Decimal128),
 * src/mongo/util/summation.{h,cpp} (DoubleDoubleSummation) and
 * src/mongo/db/exec/document_value/value.cpp (Value::coerceToDecimal). */
#ifndef SDB_STORAGE_DECIMAL_H
#define SDB_STORAGE_DECIMAL_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

/* a + b, a - b, a * b, a / b (x/0 is +-Infinity, 0/0 NaN: callers that must refuse a
 * division by zero check sdb_dec_is_zero first, as mongod does). */
bson_decimal128_t sdb_dec_add(bson_decimal128_t a, bson_decimal128_t b);
bson_decimal128_t sdb_dec_sub(bson_decimal128_t a, bson_decimal128_t b);
bson_decimal128_t sdb_dec_mul(bson_decimal128_t a, bson_decimal128_t b);
bson_decimal128_t sdb_dec_div(bson_decimal128_t a, bson_decimal128_t b);

/* Decimal128::modulo (Intel's bid128_fmod): a - b * trunc(a / b) computed exactly, with
 * a's sign and the smaller of the two exponents; NaN when either is NaN, a is infinite or
 * b is zero; a when b is infinite and a finite. */
bson_decimal128_t sdb_dec_mod(bson_decimal128_t a, bson_decimal128_t b);

/* |a| (Decimal128::toAbs: the sign bit cleared, NaN included). */
bson_decimal128_t sdb_dec_abs(bson_decimal128_t a);

/* Decimal128::quantize(kNormalizedZero, toward -Infinity / +Infinity), what $floor and
 * $ceil do: the integer below / above a with exponent 0 (a's sign kept: ceil(-0.5) is
 * -0). NaN for NaN and +-Infinity, and for a value whose integer needs more than 34
 * digits (1E+40), as bid128_quantize answers. */
bson_decimal128_t sdb_dec_floor(bson_decimal128_t a);
bson_decimal128_t sdb_dec_ceil(bson_decimal128_t a);

/* Decimal128::quantize(10^exp, mode), what $round (half to even) and $trunc (trunc: toward
 * zero) do with a place: a with exponent exactly exp. NaN for NaN, +-Infinity, an exp out
 * of decimal128's range, and a result needing more than 34 digits (bid128_quantize's
 * invalid operation); zero keeps its sign. */
bson_decimal128_t sdb_dec_quantize(bson_decimal128_t a, int exp, bool trunc);

/* Decimal128::toLong(kRoundTowardZero) without its flags: a truncated toward zero into
 * *out. Returns: false (and *out untouched) for NaN, +-Infinity and values outside int64. */
bool sdb_dec_to_int64_trunc(bson_decimal128_t a, int64_t *out);

/* True for +-Infinity. */
bool sdb_dec_is_inf(bson_decimal128_t a);

/* Decimal128::toLong (bid128_to_int64_rnint): a rounded half to even to an integer;
 * INT64_MIN (Intel's "integer indefinite") for NaN, infinities and values out of range. */
int64_t sdb_dec_to_int64(bson_decimal128_t a);

/* Decimal128(int64_t): exact, exponent 0. */
bson_decimal128_t sdb_dec_from_int64(int64_t v);

/* Decimal128(double, kRoundTo15Digits) when digits15 (mongod's default conversion:
 * Value::coerceToDecimal, SafeNum, $multiply's partial product): the double's value
 * rounded half to even to exactly 15 significant digits, trailing zeros kept
 * (0.1 -> 0.100000000000000, 2.5 -> 2.50000000000000); zero, infinities and NaN
 * unrounded. Decimal128(double, kRoundTo34Digits) otherwise (the double's exact value
 * rounded to 34 digits, as DoubleDoubleSummation::getDecimal uses it). */
bson_decimal128_t sdb_dec_from_double(double v, bool digits15);

/* Decimal128::toDouble: the nearest double (half to even); +-Infinity beyond its range. */
double sdb_dec_to_double(bson_decimal128_t a);

/* Decimal128::isEqual: numeric equality (1.5 == 1.50, -0 == 0, Infinity == Infinity); a
 * NaN equals nothing. */
bool sdb_dec_equal(bson_decimal128_t a, bson_decimal128_t b);

/* True for +-0 with any exponent (and for non-canonical encodings, which are zeros). */
bool sdb_dec_is_zero(bson_decimal128_t a);

/* True for a quiet or signalling NaN. */
bool sdb_dec_is_nan(bson_decimal128_t a);

/* Value::coerceToDecimal of an int32, int64, double (15 digits) or decimal128 value into
 * *out. Returns: false (and *out untouched) for any other type. */
bool sdb_dec_from_value(const bson_value_t *v, bson_decimal128_t *out);

/* MongoDB's DoubleDoubleSummation: a compensated sum of doubles (and of int64s split into
 * two exact doubles) kept as an unevaluated sum + addend, exact for integer sums below
 * 2^106; `special` is the plain sum returned when the compensated one is NaN (an Infinity
 * plus a finite value). Zero-initialise ({0}) to start. */
typedef struct {
	double sum, addend, special;
} sdb_ddsum;

/* Add one double / int64 (addLong: split at 2^32 so both halves are exact doubles). */
void sdb_ddsum_add_double(sdb_ddsum *s, double x);
void sdb_ddsum_add_long(sdb_ddsum *s, int64_t x);

/* getDouble: the double nearest the sum (the plain sum when that is NaN). */
double sdb_ddsum_double(const sdb_ddsum *s);

/* fitsLong: whether the sum rounds into int64's range (false for NaN and infinities). */
bool sdb_ddsum_fits_long(const sdb_ddsum *s);

/* getLong: the sum rounded half away from zero. Only when sdb_ddsum_fits_long. */
int64_t sdb_ddsum_long(const sdb_ddsum *s);

/* getDecimal: Decimal128(sum, 34 digits) + Decimal128(addend, 34 digits), or the plain
 * sum's conversion when the sum is not finite. */
bson_decimal128_t sdb_ddsum_decimal(const sdb_ddsum *s);

#endif
