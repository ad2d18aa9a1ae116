/* BSON value comparison in MongoDB's order: see bsonval.h. */
#include "common/bsonval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sdb_bson_bracket(bson_type_t t)
{
	switch (t) {
	case BSON_TYPE_MINKEY:
		return SDB_BRACKET_MINKEY;
	case BSON_TYPE_UNDEFINED:
		return SDB_BRACKET_UNDEFINED;
	case BSON_TYPE_EOD:
	case BSON_TYPE_NULL:
		return SDB_BRACKET_NULL;
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128:
		return SDB_BRACKET_NUMBER;
	case BSON_TYPE_UTF8:
	case BSON_TYPE_SYMBOL:
		return SDB_BRACKET_STRING;
	case BSON_TYPE_DOCUMENT:
		return SDB_BRACKET_OBJECT;
	case BSON_TYPE_ARRAY:
		return SDB_BRACKET_ARRAY;
	case BSON_TYPE_BINARY:
		return SDB_BRACKET_BINARY;
	case BSON_TYPE_OID:
		return SDB_BRACKET_OID;
	case BSON_TYPE_BOOL:
		return SDB_BRACKET_BOOL;
	case BSON_TYPE_DATE_TIME:
		return SDB_BRACKET_DATE;
	case BSON_TYPE_TIMESTAMP:
		return SDB_BRACKET_TIMESTAMP;
	case BSON_TYPE_REGEX:
		return SDB_BRACKET_REGEX;
	case BSON_TYPE_DBPOINTER:
		return SDB_BRACKET_DBPOINTER;
	case BSON_TYPE_CODE:
		return SDB_BRACKET_CODE;
	case BSON_TYPE_CODEWSCOPE:
		return SDB_BRACKET_CODEWSCOPE;
	case BSON_TYPE_MAXKEY:
	default:
		return SDB_BRACKET_MAXKEY;
	}
}

/* |mag| != 0 as (exp, frac): exp = index of the top bit, frac = the bits below it,
 * left-aligned. */
static void num_from_u64(uint64_t mag, sdb_bson_num *out)
{
	int p = 63 - __builtin_clzll(mag);

	out->exp = p;
	out->frac = p == 0 ? 0 : mag << (64 - p);
}

static void num_from_int(int64_t v, sdb_bson_num *out)
{
	uint64_t mag;

	if (v == 0) {
		out->cls = 3;
		return;
	}
	mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
	out->cls = v < 0 ? 2 : 4;
	num_from_u64(mag, out);
}

static void num_from_double(double d, sdb_bson_num *out)
{
	uint64_t bits, mant;
	int e;

	if (isnan(d)) {
		out->cls = 0;
		return;
	}
	if (isinf(d)) {
		out->cls = d < 0 ? 1 : 5;
		return;
	}
	if (d == 0) {
		out->cls = 3;
		return;
	}
	out->cls = d < 0 ? 2 : 4;
	memcpy(&bits, &d, sizeof bits);
	e = (int)((bits >> 52) & 0x7ff);
	mant = bits & ((UINT64_C(1) << 52) - 1);
	if (e != 0) {
		out->exp = e - 1023;
		out->frac = mant << 12;
	} else {
		/* subnormal: value = mant * 2^-1074 */
		num_from_u64(mant, out);
		out->exp -= 1074;
	}
}

/* ---- Decimal128 (IEEE 754-2008 decimal128, BID encoding) --------------------------------
 * A decimal is sign, a 14-bit biased exponent (bias 6176) and a 113-bit coefficient; a
 * coefficient above 10^34 - 1, or one written in the "11" combination form, is
 * non-canonical and reads as 0 (IEEE 754-2008 3.5.2, as MongoDB's Intel library does).
 * Comparison is by exact value, as mongod's compareDecimals/compareDecimalToDouble/
 * compareDecimalToLong (mongo/base/compare_numbers.h). */

__extension__ typedef unsigned __int128 u128;

#define P19 ((u128)UINT64_C(10000000000000000000))
static const u128 pow10_tab[39] = {
	1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000,
	UINT64_C(10000000000), UINT64_C(100000000000), UINT64_C(1000000000000),
	UINT64_C(10000000000000), UINT64_C(100000000000000), UINT64_C(1000000000000000),
	UINT64_C(10000000000000000), UINT64_C(100000000000000000),
	UINT64_C(1000000000000000000), P19, P19 * 10, P19 * 100, P19 * 1000, P19 * 10000,
	P19 * 100000, P19 * 1000000, P19 * 10000000, P19 * 100000000, P19 * 1000000000,
	P19 * UINT64_C(10000000000), P19 * UINT64_C(100000000000),
	P19 * UINT64_C(1000000000000), P19 * UINT64_C(10000000000000),
	P19 * UINT64_C(100000000000000), P19 * UINT64_C(1000000000000000),
	P19 * UINT64_C(10000000000000000), P19 * UINT64_C(100000000000000000),
	P19 * UINT64_C(1000000000000000000), P19 * P19};

/* A decoded decimal: cls as in sdb_bson_num; for cls 2/4 the value is coef * 10^exp. */
typedef struct dec {
	int cls;
	int32_t exp;
	u128 coef;
} dec;

static void dec_decode(const bson_decimal128_t *d, dec *o)
{
	uint64_t hi = d->high;
	bool neg = (hi >> 63) != 0;

	o->exp = 0;
	o->coef = 0;
	if ((hi & UINT64_C(0x7c00000000000000)) == UINT64_C(0x7c00000000000000)) {
		o->cls = 0; /* NaN (quiet or signalling, either sign) */
		return;
	}
	if ((hi & UINT64_C(0x7c00000000000000)) == UINT64_C(0x7800000000000000)) {
		o->cls = neg ? 1 : 5;
		return;
	}
	if ((hi & UINT64_C(0x6000000000000000)) == UINT64_C(0x6000000000000000)) {
		/* coefficient 0b100... > 10^34 - 1: non-canonical, zero */
		o->exp = (int32_t)((hi >> 47) & 0x3fff) - 6176;
	} else {
		o->exp = (int32_t)((hi >> 49) & 0x3fff) - 6176;
		o->coef = ((u128)(hi & UINT64_C(0x1ffffffffffff)) << 64) | d->low;
		if (o->coef >= pow10_tab[34])
			o->coef = 0;
	}
	o->cls = o->coef == 0 ? 3 : neg ? 2 : 4;
}

/* Number of decimal digits of c > 0 (1..39). */
static int u128_digits(u128 c)
{
	uint64_t hi = (uint64_t)(c >> 64);
	int bl = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll((uint64_t)c);
	int t = (bl * 1233) >> 12; /* floor(bl * log10(2)) */

	return t + (c >= pow10_tab[t]);
}

static int cmp3_u128(u128 a, u128 b)
{
	return (a > b) - (a < b);
}

/* Exact three-way compare of two decoded decimals. */
static int dec_cmp(const dec *a, const dec *b)
{
	int na, nb, c;
	int32_t adja, adjb;
	u128 ca, cb;

	if (a->cls != b->cls)
		return a->cls < b->cls ? -1 : 1;
	if (a->cls != 2 && a->cls != 4)
		return 0;
	na = u128_digits(a->coef);
	nb = u128_digits(b->coef);
	adja = a->exp + na;
	adjb = b->exp + nb;
	if (adja != adjb) {
		c = adja < adjb ? -1 : 1;
	} else {
		/* same magnitude: left-align the shorter coefficient (both stay <= 34 digits) */
		ca = na < nb ? a->coef * pow10_tab[nb - na] : a->coef;
		cb = nb < na ? b->coef * pow10_tab[na - nb] : b->coef;
		c = cmp3_u128(ca, cb);
	}
	return a->cls == 2 ? -c : c;
}

static void dec_from_int(int64_t v, dec *o)
{
	o->exp = 0;
	o->coef = v < 0 ? (u128)((uint64_t)0 - (uint64_t)v) : (u128)(uint64_t)v;
	o->cls = v == 0 ? 3 : v < 0 ? 2 : 4;
}

/* A small unsigned big integer (32-bit limbs, little-endian), enough for 10^6176 * 2^130. */
#define BN_LIMBS 660
typedef struct bn {
	int n; /* limbs in use; w[n - 1] != 0 unless n == 0 */
	uint32_t w[BN_LIMBS];
} bn;

static void bn_set(bn *a, u128 v)
{
	a->n = 0;
	while (v) {
		a->w[a->n++] = (uint32_t)v;
		v >>= 32;
	}
}

static void bn_mul_small(bn *a, uint32_t m)
{
	uint64_t carry = 0;

	for (int i = 0; i < a->n; i++) {
		uint64_t t = (uint64_t)a->w[i] * m + carry;

		a->w[i] = (uint32_t)t;
		carry = t >> 32;
	}
	if (carry && a->n < BN_LIMBS)
		a->w[a->n++] = (uint32_t)carry;
}

static void bn_mul_pow10(bn *a, int k)
{
	for (; k >= 9; k -= 9)
		bn_mul_small(a, 1000000000u);
	if (k > 0)
		bn_mul_small(a, (uint32_t)pow10_tab[k]);
}

static int bn_bitlen(const bn *a)
{
	return a->n ? 32 * (a->n - 1) + 32 - __builtin_clz(a->w[a->n - 1]) : 0;
}

/* Bit i of a (0 = least significant). */
static unsigned bn_bit(const bn *a, int i)
{
	return i / 32 < a->n ? (a->w[i / 32] >> (i % 32)) & 1u : 0u;
}

static void bn_shl(bn *a, int bits)
{
	int limbs = bits / 32, b = bits % 32, n = a->n + limbs + 1;

	if (a->n == 0 || bits <= 0)
		return;
	if (n > BN_LIMBS)
		n = BN_LIMBS; /* never reached with decimal128 exponents (see BN_LIMBS) */
	for (int i = n - 1; i >= 0; i--) {
		int s = i - limbs;
		uint32_t hi = s >= 0 && s < a->n ? a->w[s] : 0;
		uint32_t lo = s - 1 >= 0 && s - 1 < a->n ? a->w[s - 1] : 0;

		a->w[i] = b ? (hi << b) | (lo >> (32 - b)) : hi;
	}
	a->n = n;
	while (a->n && a->w[a->n - 1] == 0)
		a->n--;
}

static void bn_shr1(bn *a)
{
	for (int i = 0; i < a->n; i++)
		a->w[i] = (a->w[i] >> 1) | (i + 1 < a->n ? a->w[i + 1] << 31 : 0);
	while (a->n && a->w[a->n - 1] == 0)
		a->n--;
}

static int bn_cmp(const bn *a, const bn *b)
{
	if (a->n != b->n)
		return a->n < b->n ? -1 : 1;
	for (int i = a->n - 1; i >= 0; i--)
		if (a->w[i] != b->w[i])
			return a->w[i] < b->w[i] ? -1 : 1;
	return 0;
}

/* a -= b, a >= b */
static void bn_sub(bn *a, const bn *b)
{
	int64_t borrow = 0;

	for (int i = 0; i < a->n; i++) {
		int64_t t = (int64_t)a->w[i] - (i < b->n ? (int64_t)b->w[i] : 0) - borrow;

		borrow = t < 0;
		a->w[i] = (uint32_t)(t + (borrow ? (INT64_C(1) << 32) : 0));
	}
	while (a->n && a->w[a->n - 1] == 0)
		a->n--;
}

/* |v| = coef * 10^exp (coef > 0) as m * 2^(e - 63) rounded toward zero, m in [2^63, 2^64).
 * Returns true when that is exact. */
static bool dec_floor64(u128 coef, int32_t exp, int32_t *e, uint64_t *m)
{
	static __thread bn num, den;
	bool exact = true;

	/* fast paths: everything fits 128-bit arithmetic (the usual decimals) */
	if (exp >= 0 && u128_digits(coef) + exp <= 38) {
		u128 n = coef * pow10_tab[exp];
		uint64_t hi = (uint64_t)(n >> 64);
		int L = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll((uint64_t)n);

		*e = L - 1;
		if (L <= 64) {
			*m = (uint64_t)n << (64 - L);
			return true;
		}
		*m = (uint64_t)(n >> (L - 64));
		return (n & (((u128)1 << (L - 64)) - 1)) == 0;
	}
	if (exp < 0 && exp >= -19) {
		u128 dn = pow10_tab[-exp], q, r;
		uint64_t chi = (uint64_t)(coef >> 64);
		int c = chi ? 128 - __builtin_clzll(chi) : 64 - __builtin_clzll((uint64_t)coef);
		int d = 64 - __builtin_clzll((uint64_t)dn);
		int sh = 64 + d - c; /* as below: the quotient has 64 or 65 bits */

		if (sh >= 0) {
			q = (coef << sh) / dn; /* coef << sh has 64 + d <= 128 bits */
			r = (coef << sh) % dn;
		} else {
			q = coef / (dn << -sh);
			r = coef % (dn << -sh);
		}
		exact = r == 0;
		if (q >> 64) {
			exact = exact && !(q & 1);
			q >>= 1;
			sh--;
		}
		*e = 63 - sh;
		*m = (uint64_t)q;
		return exact;
	}
	bn_set(&num, coef);
	if (exp >= 0) {
		int L, i;
		uint64_t top = 0;

		bn_mul_pow10(&num, exp);
		L = bn_bitlen(&num);
		*e = L - 1;
		if (L <= 64) {
			*m = (uint64_t)(num.w[0] | (num.n > 1 ? (uint64_t)num.w[1] << 32 : 0))
			     << (64 - L);
			return true;
		}
		for (i = 0; i < 64; i++)
			top = (top << 1) | bn_bit(&num, L - 1 - i);
		for (i = 0; i < (L - 64) / 32 && exact; i++)
			exact = num.w[i] == 0;
		for (i = ((L - 64) / 32) * 32; i < L - 64 && exact; i++)
			exact = bn_bit(&num, i) == 0;
		*m = top;
		return exact;
	} else {
		int c, d, s, i;
		u128 q = 0;

		bn_set(&den, 1);
		bn_mul_pow10(&den, -exp);
		c = bn_bitlen(&num);
		d = bn_bitlen(&den);
		s = 64 + d - c; /* coef * 2^s / 10^-exp in (2^63, 2^65) */
		if (s > 0)
			bn_shl(&num, s);
		else
			bn_shl(&den, -s);
		bn_shl(&den, 64);
		for (i = 64; i >= 0; i--) {
			if (bn_cmp(&num, &den) >= 0) {
				bn_sub(&num, &den);
				q |= (u128)1 << i;
			}
			bn_shr1(&den);
		}
		exact = num.n == 0;
		if (q >> 64) {
			exact = exact && !(q & 1);
			q >>= 1;
			s--;
		}
		*e = 63 - s;
		*m = (uint64_t)q;
		return exact;
	}
}

static void num_from_decimal(const bson_decimal128_t *d128, sdb_bson_num *out)
{
	dec d;
	int32_t e;
	uint64_t m;

	dec_decode(d128, &d);
	out->cls = d.cls;
	if (d.cls != 2 && d.cls != 4)
		return;
	if (dec_floor64(d.coef, d.exp, &e, &m)) {
		out->exp = e;
		out->frac = m << 1;
	} else {
		int nd = u128_digits(d.coef);
		u128 norm = d.coef * pow10_tab[34 - nd];

		out->exp = e;
		out->frac = (m << 1) | 1;
		out->dexp = d.exp + nd - 1;
		out->dhi = (uint64_t)(norm >> 64);
		out->dlo = (uint64_t)norm;
	}
}

bool sdb_bson_num_canon(const bson_value_t *v, sdb_bson_num *out)
{
	memset(out, 0, sizeof *out);
	switch (v->value_type) {
	case BSON_TYPE_INT32:
		num_from_int(v->value.v_int32, out);
		return true;
	case BSON_TYPE_INT64:
		num_from_int(v->value.v_int64, out);
		return true;
	case BSON_TYPE_DOUBLE:
		num_from_double(v->value.v_double, out);
		return true;
	case BSON_TYPE_DECIMAL128:
		num_from_decimal(&v->value.v_decimal128, out);
		return true;
	default:
		return false;
	}
}

static int cmp3_i64(int64_t a, int64_t b)
{
	return (a > b) - (a < b);
}

static int cmp3_u64(uint64_t a, uint64_t b)
{
	return (a > b) - (a < b);
}

int sdb_bson_num_cmp(const sdb_bson_num *a, const sdb_bson_num *b)
{
	int c;

	if (a->cls != b->cls)
		return a->cls < b->cls ? -1 : 1;
	if (a->cls != 2 && a->cls != 4)
		return 0;
	c = cmp3_i64(a->exp, b->exp);
	if (c == 0)
		c = cmp3_u64(a->frac, b->frac);
	if (c == 0 && (a->frac & 1)) {
		c = cmp3_i64(a->dexp, b->dexp);
		if (c == 0)
			c = cmp3_u64(a->dhi, b->dhi);
		if (c == 0)
			c = cmp3_u64(a->dlo, b->dlo);
	}
	return a->cls == 2 ? -c : c;
}

static int bytes_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;

	if (c)
		return c < 0 ? -1 : 1;
	return (alen > blen) - (alen < blen);
}

static const bson_value_t null_value = {.value_type = BSON_TYPE_NULL};

/* the thread's collation (sdb_bson_collator_set); NULL = simple */
static _Thread_local const sdb_bson_collator *cur_collator;

const sdb_bson_collator *sdb_bson_collator_set(const sdb_bson_collator *c)
{
	const sdb_bson_collator *prev = cur_collator;

	cur_collator = c;
	return prev;
}

const sdb_bson_collator *sdb_bson_collator_get(void)
{
	return cur_collator;
}

static int value_cmp(const bson_value_t *a, const bson_value_t *b, int depth, bool legacy);

/* Compare two documents/arrays given as raw BSON. */
static int docs_cmp(const uint8_t *ad, size_t alen, const uint8_t *bd, size_t blen, bool names,
		    int depth, bool legacy)
{
	bson_iter_t ia, ib;
	bool ha, hb;
	int ok_a, ok_b;

	if (depth > SDB_BSON_MAX_DEPTH)
		return bytes_cmp(ad, alen, bd, blen);
	/* libbson hands out NULL data for a malformed nested document */
	ok_a = ad && bson_iter_init_from_data(&ia, ad, alen);
	ok_b = bd && bson_iter_init_from_data(&ib, bd, blen);
	if (!ok_a || !ok_b)
		return ok_a - ok_b; /* corrupt sorts as empty */
	for (;;) {
		int c;

		ha = bson_iter_next(&ia);
		hb = bson_iter_next(&ib);
		if (!ha || !hb)
			return (int)ha - (int)hb;
		c = sdb_bson_bracket(bson_iter_type(&ia)) - sdb_bson_bracket(bson_iter_type(&ib));
		if (c)
			return c < 0 ? -1 : 1;
		if (names) {
			c = bytes_cmp(bson_iter_key(&ia), bson_iter_key_len(&ia), bson_iter_key(&ib),
				      bson_iter_key_len(&ib));
			if (c)
				return c;
		}
		c = value_cmp(bson_iter_value(&ia), bson_iter_value(&ib), depth + 1, legacy);
		if (c)
			return c;
	}
}

static void str_of(const bson_value_t *v, const char **s, size_t *len)
{
	switch (v->value_type) {
	case BSON_TYPE_UTF8:
		*s = v->value.v_utf8.str;
		*len = v->value.v_utf8.len;
		break;
	case BSON_TYPE_SYMBOL:
		*s = v->value.v_symbol.symbol;
		*len = v->value.v_symbol.len;
		break;
	case BSON_TYPE_CODE:
		*s = v->value.v_code.code;
		*len = v->value.v_code.code_len;
		break;
	case BSON_TYPE_CODEWSCOPE:
		*s = v->value.v_codewscope.code;
		*len = v->value.v_codewscope.code_len;
		break;
	default:
		*s = "";
		*len = 0;
		break;
	}
}

/* Fast exact paths when one side is a decimal: decimal vs decimal, int32 or int64 through
 * decoded decimals (128-bit arithmetic). Returns 2 for decimal vs double, which goes
 * through the canonical binary form (sdb_bson_num_canon). */
static int decimal_cmp(const bson_value_t *a, const bson_value_t *b)
{
	dec da, db;
	const bson_value_t *v[2] = {a, b};
	dec *o[2] = {&da, &db};

	for (int i = 0; i < 2; i++) {
		switch (v[i]->value_type) {
		case BSON_TYPE_DECIMAL128:
			dec_decode(&v[i]->value.v_decimal128, o[i]);
			break;
		case BSON_TYPE_INT32:
			dec_from_int(v[i]->value.v_int32, o[i]);
			break;
		case BSON_TYPE_INT64:
			dec_from_int(v[i]->value.v_int64, o[i]);
			break;
		default:
			return 2;
		}
	}
	return dec_cmp(&da, &db);
}

/* The decimal order of releases before the exact one (op version 4 chunk bounds): a
 * decimal128 through its nearest long double (x86-64: 64-bit significand). */
static void num_from_long_double(long double x, sdb_bson_num *out)
{
	long double m;
	int e;
	uint64_t u;

	if (isnan(x)) {
		out->cls = 0;
		return;
	}
	if (isinf(x)) {
		out->cls = x < 0 ? 1 : 5;
		return;
	}
	if (x == 0) {
		out->cls = 3;
		return;
	}
	out->cls = x < 0 ? 2 : 4;
	m = frexpl(fabsl(x), &e); /* m in [0.5, 1) */
	out->exp = e - 1;
	u = (uint64_t)ldexpl(m, 64); /* in [2^63, 2^64) */
	out->frac = u << 1;
}

bool sdb_bson_num_canon_legacy(const bson_value_t *v, sdb_bson_num *out)
{
	char buf[BSON_DECIMAL128_STRING];

	if (v->value_type != BSON_TYPE_DECIMAL128)
		return sdb_bson_num_canon(v, out);
	memset(out, 0, sizeof *out);
	bson_decimal128_to_string(&v->value.v_decimal128, buf);
	num_from_long_double(strtold(buf, NULL), out);
	return true;
}

static int value_cmp(const bson_value_t *a, const bson_value_t *b, int depth, bool legacy)
{
	int ba, bb, c;

	if (!a)
		a = &null_value;
	if (!b)
		b = &null_value;
	ba = sdb_bson_bracket(a->value_type);
	bb = sdb_bson_bracket(b->value_type);
	if (ba != bb)
		return ba < bb ? -1 : 1;
	switch (ba) {
	case SDB_BRACKET_NUMBER: {
		sdb_bson_num na, nb;

		if (a->value_type == BSON_TYPE_DOUBLE && b->value_type == BSON_TYPE_DOUBLE) {
			double x = a->value.v_double, y = b->value.v_double;

			if (x < y)
				return -1;
			if (x > y)
				return 1;
			if (x == y)
				return 0; /* -0 == 0 */
			return isnan(x) ? (isnan(y) ? 0 : -1) : 1; /* NaN lowest */
		}
		if ((a->value_type == BSON_TYPE_INT32 || a->value_type == BSON_TYPE_INT64) &&
		    (b->value_type == BSON_TYPE_INT32 || b->value_type == BSON_TYPE_INT64)) {
			int64_t x = a->value_type == BSON_TYPE_INT32 ? a->value.v_int32
								     : a->value.v_int64;
			int64_t y = b->value_type == BSON_TYPE_INT32 ? b->value.v_int32
								     : b->value.v_int64;

			return cmp3_i64(x, y);
		}
		if (legacy) {
			sdb_bson_num_canon_legacy(a, &na);
			sdb_bson_num_canon_legacy(b, &nb);
			return sdb_bson_num_cmp(&na, &nb);
		}
		if (a->value_type == BSON_TYPE_DECIMAL128 || b->value_type == BSON_TYPE_DECIMAL128) {
			c = decimal_cmp(a, b);
			if (c != 2)
				return c;
		}
		sdb_bson_num_canon(a, &na);
		sdb_bson_num_canon(b, &nb);
		return sdb_bson_num_cmp(&na, &nb);
	}
	case SDB_BRACKET_STRING:
	case SDB_BRACKET_CODE: {
		const char *sa, *sb;
		size_t la, lb;

		str_of(a, &sa, &la);
		str_of(b, &sb, &lb);
		if (ba == SDB_BRACKET_STRING && cur_collator) {
			c = cur_collator->cmp(cur_collator, sa, la, sb, lb);
			return c < 0 ? -1 : c > 0;
		}
		return bytes_cmp(sa, la, sb, lb);
	}
	case SDB_BRACKET_OBJECT:
	case SDB_BRACKET_ARRAY:
		return docs_cmp(a->value.v_doc.data, a->value.v_doc.data_len, b->value.v_doc.data,
				b->value.v_doc.data_len, ba == SDB_BRACKET_OBJECT, depth, legacy);
	case SDB_BRACKET_BINARY:
		if (a->value.v_binary.data_len != b->value.v_binary.data_len)
			return a->value.v_binary.data_len < b->value.v_binary.data_len ? -1 : 1;
		if (a->value.v_binary.subtype != b->value.v_binary.subtype)
			return a->value.v_binary.subtype < b->value.v_binary.subtype ? -1 : 1;
		return bytes_cmp(a->value.v_binary.data, a->value.v_binary.data_len,
				 b->value.v_binary.data, b->value.v_binary.data_len);
	case SDB_BRACKET_OID:
		return bytes_cmp(a->value.v_oid.bytes, 12, b->value.v_oid.bytes, 12);
	case SDB_BRACKET_BOOL:
		return (int)a->value.v_bool - (int)b->value.v_bool;
	case SDB_BRACKET_DATE:
		return cmp3_i64(a->value.v_datetime, b->value.v_datetime);
	case SDB_BRACKET_TIMESTAMP:
		c = cmp3_u64(a->value.v_timestamp.timestamp, b->value.v_timestamp.timestamp);
		return c ? c : cmp3_u64(a->value.v_timestamp.increment, b->value.v_timestamp.increment);
	case SDB_BRACKET_REGEX:
		c = bytes_cmp(a->value.v_regex.regex, strlen(a->value.v_regex.regex),
			      b->value.v_regex.regex, strlen(b->value.v_regex.regex));
		if (c)
			return c;
		return bytes_cmp(a->value.v_regex.options, strlen(a->value.v_regex.options),
				 b->value.v_regex.options, strlen(b->value.v_regex.options));
	case SDB_BRACKET_DBPOINTER:
		if (a->value.v_dbpointer.collection_len != b->value.v_dbpointer.collection_len)
			return a->value.v_dbpointer.collection_len <
					       b->value.v_dbpointer.collection_len
				       ? -1
				       : 1;
		c = bytes_cmp(a->value.v_dbpointer.collection, a->value.v_dbpointer.collection_len,
			      b->value.v_dbpointer.collection, b->value.v_dbpointer.collection_len);
		return c ? c : bytes_cmp(a->value.v_dbpointer.oid.bytes, 12,
					 b->value.v_dbpointer.oid.bytes, 12);
	case SDB_BRACKET_CODEWSCOPE: {
		const char *sa, *sb;
		size_t la, lb;

		str_of(a, &sa, &la);
		str_of(b, &sb, &lb);
		c = bytes_cmp(sa, la, sb, lb);
		if (c)
			return c;
		return docs_cmp(a->value.v_codewscope.scope_data, a->value.v_codewscope.scope_len,
				b->value.v_codewscope.scope_data, b->value.v_codewscope.scope_len, true,
				depth, legacy);
	}
	default: /* MinKey, MaxKey, undefined, null: one value each */
		return 0;
	}
}

int sdb_bson_value_cmp(const bson_value_t *a, const bson_value_t *b)
{
	return value_cmp(a, b, 0, false);
}

int sdb_bson_cmp(const bson_iter_t *a, const bson_iter_t *b)
{
	bson_iter_t ca, cb;

	if (a)
		ca = *a;
	if (b)
		cb = *b;
	return value_cmp(a ? bson_iter_value(&ca) : NULL, b ? bson_iter_value(&cb) : NULL, 0, false);
}

static int key_cmp(const bson_t *a, const bson_t *b, bool legacy)
{
	bson_iter_t ia, ib;
	bool ha, hb;
	int r = 0;
	const sdb_bson_collator *prev;

	if (!bson_iter_init(&ia, a) || !bson_iter_init(&ib, b))
		return 0;
	prev = sdb_bson_collator_set(NULL); /* chunk bounds compare binary */
	for (;;) {
		ha = bson_iter_next(&ia);
		hb = bson_iter_next(&ib);
		if (!ha || !hb) {
			r = (int)ha - (int)hb;
			break;
		}
		r = value_cmp(bson_iter_value(&ia), bson_iter_value(&ib), 0, legacy);
		if (r != 0)
			break;
	}
	sdb_bson_collator_set(prev);
	return r;
}

int sdb_bson_key_cmp(const bson_t *a, const bson_t *b)
{
	return key_cmp(a, b, false);
}

int sdb_bson_key_cmp_v4(const bson_t *a, const bson_t *b)
{
	return key_cmp(a, b, true);
}

int sdb_bson_doc_cmp(const bson_t *a, const bson_t *b)
{
	return docs_cmp(bson_get_data(a), a->len, bson_get_data(b), b->len, true, 0, false);
}

bool sdb_bson_value_eq(const bson_value_t *a, const bson_value_t *b)
{
	return value_cmp(a, b, 0, false) == 0;
}

int sdb_bson_value_cmp_v4(const bson_value_t *a, const bson_value_t *b)
{
	const sdb_bson_collator *prev = sdb_bson_collator_set(NULL);
	int r = value_cmp(a, b, 0, true);

	sdb_bson_collator_set(prev);
	return r;
}

int sdb_bson_value_cmp_simple(const bson_value_t *a, const bson_value_t *b)
{
	const sdb_bson_collator *prev = sdb_bson_collator_set(NULL);
	int r = value_cmp(a, b, 0, false);

	sdb_bson_collator_set(prev);
	return r;
}

bool sdb_bson_value_eq_simple(const bson_value_t *a, const bson_value_t *b)
{
	return sdb_bson_value_cmp_simple(a, b) == 0;
}

bool sdb_bson_iter_eq(const bson_iter_t *a, const bson_iter_t *b)
{
	return sdb_bson_cmp(a, b) == 0;
}

static bool depth_ok(bson_iter_t *it, int level, int max_depth)
{
	while (bson_iter_next(it)) {
		bson_iter_t child;

		if (!BSON_ITER_HOLDS_DOCUMENT(it) && !BSON_ITER_HOLDS_ARRAY(it))
			continue;
		if (level + 1 > max_depth)
			return false;
		if (!bson_iter_recurse(it, &child))
			return false;
		if (!depth_ok(&child, level + 1, max_depth))
			return false;
	}
	/* the iteration ended at the document's end, not at a malformed element (which
	 * bson_validate's BSON_VALIDATE_NONE lets through inside nested documents) */
	return it->err_off == 0;
}

bool sdb_bson_depth_ok(const bson_t *doc, int max_depth)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, doc))
		return false;
	return depth_ok(&it, 0, max_depth);
}

