/* The $bitsAllSet, $bitsAllClear, $bitsAnySet and $bitsAnyClear query operators (mongod
 * 6.0's BitTestMatchExpression): their operand's parsing and their test of one value, for
 * the matcher (matcher.c, which builds the OP_BITS_* nodes). See matcher_int.h. */
#include "storage/matcher_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonval.h"
#include "storage/decimal.h"

op_kind matcher_bits_op(const char *op)
{
	return strcmp(op, "$bitsAllSet") == 0     ? OP_BITS_ALL_SET
	       : strcmp(op, "$bitsAllClear") == 0 ? OP_BITS_ALL_CLEAR
	       : strcmp(op, "$bitsAnySet") == 0   ? OP_BITS_ANY_SET
	       : strcmp(op, "$bitsAnyClear") == 0 ? OP_BITS_ANY_CLEAR
						   : 0;
}

/* ---- evaluation ------------------------------------------------------------------- */

/* Does one bit test of n ($bitsAllSet ...) hold given bit `set`? False: the answer is
 * known (the test fails for All*, succeeds for Any*). BitTestMatchExpression::
 * needFurtherBitTests. */
static bool bits_continue(op_kind op, bool set)
{
	return op == OP_BITS_ALL_SET || op == OP_BITS_ANY_CLEAR ? set : !set;
}

bool matcher_bits_value(const node *n, const bson_value_t *v)
{
	int64_t x;
	uint64_t m = n->bitmask;

	switch (v->value_type) {
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE: {
		bool whole;

		if (matcher_num_i64(v, &x, &whole) != MATCHER_I64_OK || !whole)
			return false;
		break;
	}
	case BSON_TYPE_DECIMAL128:
		x = sdb_dec_to_int64(v->value.v_decimal128);
		break;
	case BSON_TYPE_BINARY: {
		const uint8_t *data = v->value.v_binary.data;
		uint64_t bitlen = (uint64_t)v->value.v_binary.data_len * 8;

		for (size_t i = 0; i < n->nbits; i++) {
			uint32_t b = n->bits[i];
			bool set = b < bitlen && ((data[b / 8] >> (b % 8)) & 1);

			if (!bits_continue(n->op, set))
				return n->op == OP_BITS_ANY_SET || n->op == OP_BITS_ANY_CLEAR;
		}
		return n->op == OP_BITS_ALL_SET || n->op == OP_BITS_ALL_CLEAR;
	}
	default:
		return false;
	}
	switch (n->op) {
	case OP_BITS_ALL_SET:
		return ((uint64_t)x & m) == m;
	case OP_BITS_ALL_CLEAR:
		return ((uint64_t)x & m) == 0;
	case OP_BITS_ANY_SET:
		return ((uint64_t)x & m) != 0;
	default:
		return ((uint64_t)x & m) != m;
	}
}

/* ---- parsing ---------------------------------------------------------------------- */

/* A number as mongod's BSONElement prints it in a message ("-1", "1.5", "-1.0"). */
static void num_str(const bson_iter_t *it, char *buf, size_t len)
{
	switch (bson_iter_type(it)) {
	case BSON_TYPE_DOUBLE: {
		double d = bson_iter_double(it);

		if (isfinite(d) && d == floor(d) && fabs(d) < 1e15) {
			snprintf(buf, len, "%.1f", d);
		} else {
			for (int p = 15; p <= 17; p++) {
				snprintf(buf, len, "%.*g", p, d);
				if (strtod(buf, NULL) == d)
					break;
			}
		}
		break;
	}
	case BSON_TYPE_DECIMAL128: {
		bson_decimal128_t dec;
		char s[BSON_DECIMAL128_STRING];

		bson_iter_decimal128(it, &dec);
		bson_decimal128_to_string(&dec, s);
		snprintf(buf, len, "NumberDecimal(\"%s\")", s);
		break;
	}
	default:
		snprintf(buf, len, "%lld", (long long)bson_iter_as_int64(it));
		break;
	}
}

static const char *type_name_of(const bson_iter_t *it)
{
	return sdb_bson_type_name(bson_iter_type(it));
}

static void bits_add(node *n, uint32_t pos)
{
	if ((n->nbits & (n->nbits + 1)) == 0 || n->nbits == 0)
		n->bits = sdb_realloc(n->bits, (2 * n->nbits + 2) * sizeof *n->bits);
	n->bits[n->nbits++] = pos;
	n->bitmask |= 1ull << (pos < 63 ? pos : 63);
}

int matcher_parse_bits(node *n, const char *op, const bson_iter_t *it, perr *pe)
{
	char num[64];

	if (BSON_ITER_HOLDS_NUMBER(it) || BSON_ITER_HOLDS_DECIMAL128(it)) {
		int64_t mask;
		bool whole;
		bson_iter_t c;

		num_str(it, num, sizeof num);
		if (BSON_ITER_HOLDS_DOUBLE(it)) {
			double d = bson_iter_double(it);

			if (isnan(d))
				return matcher_fail(pe, 9, "Expected an integer, but found NaN in: %s: %s", op,
					    num);
			if (d >= 9.2233720368547758e18 || d < -9.2233720368547758e18)
				return matcher_fail(pe, 9, "Cannot represent as a 64-bit integer: %s: %s", op,
					    num);
		}
		c = *it;
		matcher_num_i64(bson_iter_value(&c), &mask, &whole);
		if (!whole)
			return matcher_fail(pe, 9, "%s: %s: %s",
				    BSON_ITER_HOLDS_DOUBLE(it) ? "Expected an integer"
							       : "Cannot represent as a 64-bit integer",
				    op, num);
		if (mask < 0)
			return matcher_fail(pe, 9,
					    "Expected a positive number in: %s: %s", op, num);
		for (uint32_t b = 0; b < 63; b++)
			if ((mask >> b) & 1)
				bits_add(n, b);
		return 0;
	}
	if (BSON_ITER_HOLDS_BINARY(it)) {
		const uint8_t *data;
		uint32_t len;
		bson_subtype_t st;

		bson_iter_binary(it, &st, &len, &data);
		for (uint64_t b = 0; b < (uint64_t)len * 8; b++)
			if ((data[b / 8] >> (b % 8)) & 1)
				bits_add(n, (uint32_t)b);
		return 0;
	}
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t e;

		if (!bson_iter_recurse(it, &e))
			return matcher_fail(pe, ERR_BAD_VALUE, "corrupt array");
		while (bson_iter_next(&e)) {
			int64_t pos;

			if (!BSON_ITER_HOLDS_NUMBER(&e) && !BSON_ITER_HOLDS_DECIMAL128(&e))
				return matcher_fail(pe, ERR_BAD_VALUE,
					    "bit positions must be an integer but got: %s: %s",
					    bson_iter_key(&e), type_name_of(&e));
			num_str(&e, num, sizeof num);
			if (BSON_ITER_HOLDS_DOUBLE(&e)) {
				double d = bson_iter_double(&e);

				if (isnan(d))
					return matcher_fail(pe, ERR_BAD_VALUE,
						    "bit positions cannot take a NaN: %s: %s",
						    bson_iter_key(&e), num);
				if (d > 2147483647.0 || d < -2147483648.0)
					return matcher_fail(pe, ERR_BAD_VALUE,
						    "bit positions cannot be represented as a 32-bit signed integer: %s: %s",
						    bson_iter_key(&e), num);
				if (d != floor(d))
					return matcher_fail(pe, ERR_BAD_VALUE,
						    "bit positions must be an integer but got: %s: %s",
						    bson_iter_key(&e), num);
			}
			matcher_num_i64(bson_iter_value(&e), &pos, NULL);
			if (BSON_ITER_HOLDS_INT64(&e) && (pos > INT32_MAX || pos < INT32_MIN))
				return matcher_fail(pe, ERR_BAD_VALUE,
					    "bit positions cannot be represented as a 32-bit signed integer: %s: %s",
					    bson_iter_key(&e), num);
			if (BSON_ITER_HOLDS_DECIMAL128(&e)) {
				/* BSONElement::numberInt of a decimal: Decimal128::toInt, rounded half
				 * to even, saturated */
				bson_decimal128_t dec;

				bson_iter_decimal128(&e, &dec);
				pos = sdb_dec_to_int64(dec);
				pos = pos > INT32_MAX ? INT32_MAX : pos < INT32_MIN ? INT32_MIN : pos;
			}
			if (pos < 0)
				return matcher_fail(pe, ERR_BAD_VALUE, "bit positions must be >= 0 but got: %s: %s",
					    bson_iter_key(&e), num);
			bits_add(n, (uint32_t)pos);
		}
		return 0;
	}
	return matcher_fail(pe, ERR_BAD_VALUE, "%s takes an Array, a number, or a BinData but received: %s: %s",
		    op, op, type_name_of(it));
}
