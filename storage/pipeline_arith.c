/* Arithmetic of aggregation expressions (issue #20): $add, $multiply, $subtract and the
 * $sum/$avg accumulation shared by the expression forms and the $group/$bucket
 * accumulators, with MongoDB 6.0's widening (int32 < int64 < double < Decimal128) and exact
 * Decimal128 arithmetic (storage/decimal.h). Split from pipeline_expr.c, which dispatches to
 * these (pipeline_int.h). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"
#include "storage/path.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/docbuild.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"

/* $add as MongoDB 6.0's AddState (expression.cpp): one running total of the widest type so
 * far (int32 < int64 < double < decimal); widening converts it (a long total to a double,
 * a long total exactly or a double total to 34 digits into a decimal), later operands are
 * coerced to that type (a double to 15 digits into a decimal). An int64 overflow moves to a
 * double. One date allowed: its milliseconds join as an int64 and the result is a date
 * (from a double total: 15 Overflow outside int64's range; from a decimal: toLong). */
int agg_eval_add(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	int64_t ltotal = 0;
	double dtotal = 0;
	bson_decimal128_t dec = {0};
	int widest = 0; /* 0 int32, 1 int64, 2 double, 3 decimal */
	bool has_date = false;

	for (size_t i = 0; i < x->n; i++) {
		docbuild_node *v = vals[i];
		bson_value_t add;
		int old = widest;

		if (is_nullish(v)) {
			*out = v_null();
			return 0;
		}
		if (v->type == BSON_TYPE_DATE_TIME) {
			if (has_date) {
				return efail(e, 16612, "only one date allowed in an $add expression");
			}
			has_date = true;
			memset(&add, 0, sizeof add);
			add.value_type = BSON_TYPE_INT64;
			add.value.v_int64 = v->value.value.v_datetime;
		} else if (!is_number(v)) {
			return efail(e, 16554, "$add only supports numeric or date types, not %s",
				     type_name(v->type));
		} else {
			int t = v->type == BSON_TYPE_INT32   ? 0
				: v->type == BSON_TYPE_INT64 ? 1
				: v->type == BSON_TYPE_DOUBLE ? 2
							      : 3;

			widest = t > widest ? t : widest;
			add = v->value;
		}
		if (old != widest && widest == 2) {
			dtotal = (double)ltotal;
		} else if (old != widest && widest == 3) {
			dec = old == 2 ? sdb_dec_from_double(dtotal, false) : sdb_dec_from_int64(ltotal);
		}
		switch (widest) {
		case 0:
		case 1: {
			int64_t iv = add.value_type == BSON_TYPE_INT64 ? add.value.v_int64 : add.value.v_int32;

			int64_t sum;

			/* mongod's AddState: on overflow the double total is built from the
			 * total before it (the wrapped sum is never used) */
			if (__builtin_add_overflow(ltotal, iv, &sum)) {
				widest = 2;
				dtotal = (double)ltotal + (double)iv;
			} else {
				ltotal = sum;
			}
			break;
		}
		case 2:
			dtotal += add.value_type == BSON_TYPE_DOUBLE  ? add.value.v_double
				  : add.value_type == BSON_TYPE_INT64 ? (double)add.value.v_int64
								      : (double)add.value.v_int32;
			break;
		default: {
			bson_decimal128_t d;

			(void)sdb_dec_from_value(&add, &d);
			dec = sdb_dec_add(dec, d);
			break;
		}
		}
	}
	if (has_date) {
		switch (widest) {
		case 0:
		case 1:
			*out = v_date(ltotal);
			return 0;
		case 2:
			/* the upper bound is exclusive: (double)INT64_MAX rounds up to 2^63 */
			if (!(dtotal >= -9223372036854775808.0 && dtotal < 9223372036854775808.0)) {
				return efail(e, 15, "date overflow in $add");
			}
			*out = v_date((int64_t)llround(dtotal));
			return 0;
		default:
			*out = v_date(sdb_dec_to_int64(dec)); /* not checked for overflow, as mongod */
			return 0;
		}
	}
	switch (widest) {
	case 0:
		*out = ltotal >= INT32_MIN && ltotal <= INT32_MAX ? v_int32((int32_t)ltotal)
								    : v_int64(ltotal);
		break;
	case 1:
		*out = v_int64(ltotal);
		break;
	case 2:
		*out = v_double(dtotal);
		break;
	default:
		*out = v_decimal(dec);
		break;
	}
	return 0;
}

/* $multiply: int32 -> int64 -> double widening as MongoDB (an int64 overflow or a
 * non-finite factor moves to the double product). A Decimal128 operand makes it a decimal
 * (MongoDB 6.0 ExpressionMultiply): the product so far converted at the first decimal (a
 * double product to 15 digits), the rest multiplied in decimal (doubles to 15 digits). */
int agg_eval_multiply(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	int64_t iacc = 1;
	double dacc = 1;
	bool is_long = false, is_double = false, has_dec = false;
	bson_decimal128_t dec = {0};

	for (size_t i = 0; i < x->n; i++) {
		docbuild_node *v = vals[i];

		if (is_nullish(v)) {
			*out = v_null();
			return 0;
		}
		if (!is_number(v)) {
			return efail(e, 16555, "$multiply only supports numeric types, not %s",
				     type_name(v->type));
		}
		if (has_dec || v->type == BSON_TYPE_DECIMAL128) {
			bson_decimal128_t d;

			if (!has_dec) {
				dec = is_double ? sdb_dec_from_double(dacc, true) : sdb_dec_from_int64(iacc);
				has_dec = true;
			}
			(void)sdb_dec_from_value(&v->value, &d);
			dec = sdb_dec_mul(dec, d);
			continue;
		}
		dacc *= num_double(v);
		if (v->type == BSON_TYPE_DOUBLE) {
			is_double = true;
		} else if (!is_double) {
			if (v->type == BSON_TYPE_INT64) {
				is_long = true;
			}
			if (__builtin_mul_overflow(iacc, v->type == BSON_TYPE_INT64 ? v->value.value.v_int64
										: v->value.value.v_int32,
						   &iacc)) {
				is_double = true; /* the long product abandoned */
			}
		}
	}
	if (has_dec) {
		*out = v_decimal(dec);
	} else if (is_double) {
		*out = v_double(dacc);
	} else if (is_long || iacc < INT32_MIN || iacc > INT32_MAX) {
		*out = v_int64(iacc);
	} else {
		*out = v_int32((int32_t)iacc);
	}
	return 0;
}

int agg_eval_subtract(docbuild_node *a, docbuild_node *b, docbuild_node **out, const ectx *e)
{
	if (is_nullish(a) || is_nullish(b)) {
		*out = v_null();
		return 0;
	}
	if (a->type == BSON_TYPE_DATE_TIME && b->type == BSON_TYPE_DATE_TIME) {
		*out = v_int64(a->value.value.v_datetime - b->value.value.v_datetime);
		return 0;
	}
	if (a->type == BSON_TYPE_DATE_TIME && is_number(b)) {
		/* Value::coerceToLong: a decimal by Decimal128::toLong (half to even), a double
		 * truncated (x86's conversion: NaN and out-of-range values give INT64_MIN), an
		 * integer as it is; then Date_t - Milliseconds, which negates the duration */
		int64_t ms;

		if (b->type == BSON_TYPE_DECIMAL128) {
			ms = sdb_dec_to_int64(b->value.value.v_decimal128);
		} else if (b->type == BSON_TYPE_DOUBLE) {
			double d = b->value.value.v_double;

			ms = (d >= -9223372036854775808.0 && d < 9223372036854775808.0) ? (int64_t)d
											 : INT64_MIN;
		} else {
			ms = b->type == BSON_TYPE_INT64 ? b->value.value.v_int64
							: b->value.value.v_int32;
		}
		if (ms == INT64_MIN) {
			return efail(e, 159, "Cannot negate the minimum duration");
		}
		*out = v_date((int64_t)((uint64_t)a->value.value.v_datetime - (uint64_t)ms));
		return 0;
	}
	if (!is_number(a) || !is_number(b)) {
		return efail(e, 16556, "cant $subtract a%s %s from a %s",
			     b->type == BSON_TYPE_INT32 ? "n" : "", type_name(b->type),
			     type_name(a->type));
	}
	if (a->type == BSON_TYPE_DECIMAL128 || b->type == BSON_TYPE_DECIMAL128) {
		/* MongoDB: left.coerceToDecimal().subtract(right.coerceToDecimal()) */
		bson_decimal128_t x, y;

		(void)sdb_dec_from_value(&a->value, &x);
		(void)sdb_dec_from_value(&b->value, &y);
		*out = v_decimal(sdb_dec_sub(x, y));
		return 0;
	}
	if (a->type == BSON_TYPE_DOUBLE || b->type == BSON_TYPE_DOUBLE) {
		*out = v_double(num_double(a) - num_double(b));
		return 0;
	}
	int64_t x = a->type == BSON_TYPE_INT64 ? a->value.value.v_int64 : a->value.value.v_int32;
	int64_t y = b->type == BSON_TYPE_INT64 ? b->value.value.v_int64 : b->value.value.v_int32;
	int64_t r;

	if (__builtin_sub_overflow(x, y, &r)) {
		*out = v_double((double)x - (double)y);
	} else if (a->type == BSON_TYPE_INT64 || b->type == BSON_TYPE_INT64 || r < INT32_MIN ||
		   r > INT32_MAX) {
		*out = v_int64(r);
	} else {
		*out = v_int32((int32_t)r);
	}
	return 0;
}

/* pipeline_int.h */
void agg_sum_add(agg_sum *s, const docbuild_node *v)
{
	if (!is_number(v)) {
		return;
	}
	s->count++;
	switch (v->type) {
	case BSON_TYPE_INT32:
		sdb_ddsum_add_double(&s->nondec, v->value.value.v_int32);
		break;
	case BSON_TYPE_INT64:
		sdb_ddsum_add_long(&s->nondec, v->value.value.v_int64);
		s->widest = s->widest < 1 ? 1 : s->widest;
		break;
	case BSON_TYPE_DOUBLE:
		sdb_ddsum_add_double(&s->nondec, v->value.value.v_double);
		s->widest = s->widest < 2 ? 2 : s->widest;
		break;
	default: /* decimal128: Decimal128() (0, exponent 0) plus each value */
		s->dec = sdb_dec_add(s->has_dec ? s->dec : sdb_dec_from_int64(0),
				     v->value.value.v_decimal128);
		s->has_dec = true;
		s->widest = 3;
		break;
	}
}

/* pipeline_int.h */
docbuild_node *agg_sum_result(const agg_sum *s, bool avg)
{
	bson_decimal128_t total;

	if (avg && s->count == 0) {
		return v_null();
	}
	if (s->widest == 3) {
		total = sdb_dec_add(s->dec, sdb_ddsum_decimal(&s->nondec));
		if (avg) {
			total = sdb_dec_div(total, sdb_dec_from_int64(s->count));
		}
		return v_decimal(total);
	}
	if (avg) {
		return v_double(sdb_ddsum_double(&s->nondec) / (double)s->count);
	}
	if (s->widest < 2 && sdb_ddsum_fits_long(&s->nondec)) {
		int64_t l = sdb_ddsum_long(&s->nondec);

		if (s->widest == 0 && l >= INT32_MIN && l <= INT32_MAX) {
			return v_int32((int32_t)l);
		}
		return v_int64(l);
	}
	return v_double(sdb_ddsum_double(&s->nondec));
}

void agg_stddev_add(agg_stddev *s, const docbuild_node *v)
{
	double val, delta;

	if (!is_number(v)) {
		return;
	}
	val = num_double(v);
	s->count++;
	delta = val - s->mean;
	if (delta != 0.0) {
		s->mean += delta / (double)s->count;
		s->m2 += delta * (val - s->mean);
	}
}

docbuild_node *agg_stddev_result(const agg_stddev *s, bool samp)
{
	int64_t n = samp ? s->count - 1 : s->count;

	if (n <= 0) {
		return v_null();
	}
	return v_double(sqrt(s->m2 / (double)n));
}

docbuild_node *agg_eval_sum_avg(bool avg, docbuild_node **items, size_t n)
{
	agg_sum s = {0};

	for (size_t i = 0; i < n; i++) {
		agg_sum_add(&s, items[i]);
	}
	return agg_sum_result(&s, avg);
}
