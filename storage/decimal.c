/* Decimal128 arithmetic: GCC's _Decimal128 (libgcc's BID library; with clang, the same
 * libgcc functions called directly) for + - * / and the conversions, the coefficient/exponent fields of the BID encoding for what C has no
 * operator for (quantize, fmod, the 15-digit rounding of a double). See decimal.h. */
#include "decimal.h"

#include <math.h>
#include <string.h>

typedef unsigned __int128 u128;

#if defined(__clang__)
/* clang has no _Decimal128: call the libgcc entry points GCC emits for the _Decimal128
 * operators (Intel's BID library, linked by clang from libgcc as well). A 16-byte vector is
 * passed and returned in an XMM register exactly as _Decimal128 is (x86-64 psABI: classes
 * SSE + SSEUP), so the calls are ABI-identical to GCC's. */
#if !defined(__x86_64__)
#error "storage/decimal.c with clang: only x86-64's libgcc BID ABI is known here"
#endif
typedef long long dec_t __attribute__((vector_size(16)));
dec_t __bid_addtd3(dec_t a, dec_t b);
dec_t __bid_subtd3(dec_t a, dec_t b);
dec_t __bid_multd3(dec_t a, dec_t b);
dec_t __bid_divtd3(dec_t a, dec_t b);
int __bid_eqtd2(dec_t a, dec_t b);
dec_t __bid_extenddftd(double v);
dec_t __bid_floatditd(long long v);
double __bid_trunctddf(dec_t a);
#define D_ADD(a, b) __bid_addtd3((a), (b))
#define D_SUB(a, b) __bid_subtd3((a), (b))
#define D_MUL(a, b) __bid_multd3((a), (b))
#define D_DIV(a, b) __bid_divtd3((a), (b))
#define D_FROM_DOUBLE(v) __bid_extenddftd(v)
#define D_FROM_INT64(v) __bid_floatditd(v)
#define D_TO_DOUBLE(a) __bid_trunctddf(a)
#define D_EQ(a, b) (__bid_eqtd2((a), (b)) == 0)
#else
typedef _Decimal128 dec_t;
/* + and * called as functions, not as operators: GCC treats the operators as commutative
 * and may swap the operands at -O2, and with two NaN operands the library returns its
 * first one, so the NaN that comes out (sign, payload) would depend on the optimization
 * level (replicas built differently would store different bytes). mongod keeps the first
 * operand's (Decimal128::add on `this`). */
_Decimal128 __bid_addtd3(_Decimal128 a, _Decimal128 b);
_Decimal128 __bid_multd3(_Decimal128 a, _Decimal128 b);
#define D_ADD(a, b) __bid_addtd3((a), (b))
#define D_SUB(a, b) ((a) - (b))
#define D_MUL(a, b) __bid_multd3((a), (b))
#define D_DIV(a, b) ((a) / (b))
#define D_FROM_DOUBLE(v) ((_Decimal128)(v))
#define D_FROM_INT64(v) ((_Decimal128)(v))
#define D_TO_DOUBLE(a) ((double)(a))
#define D_EQ(a, b) ((a) == (b))
#endif

/* The encoding must be the one libgcc uses: 16 bytes, BID, little-endian halves. */
_Static_assert(sizeof(dec_t) == sizeof(bson_decimal128_t), "decimal128 size");
#if !defined(__x86_64__) && !defined(__aarch64__)
#error "storage/decimal.c assumes a little-endian BID _Decimal128 (x86-64, aarch64)"
#endif

#define EXP_BIAS 6176
#define EXP_MIN (-6176)
#define EXP_MAX 6111
#define MAX_DIGITS 34

static dec_t to_d(bson_decimal128_t a)
{
	dec_t d;

	memcpy(&d, &a, sizeof d);
	return d;
}

static bson_decimal128_t from_d(dec_t d)
{
	bson_decimal128_t a;

	memcpy(&a, &d, sizeof a);
	return a;
}

/* 10^k for k in 0..38 (10^38 < 2^127). */
static u128 pow10_u128(int k)
{
	u128 p = 1;

	while (k-- > 0) {
		p *= 10;
	}
	return p;
}

static int ndigits(u128 c)
{
	int n = 1;

	while (c >= 10) {
		c /= 10;
		n++;
	}
	return n;
}

enum { K_FINITE, K_INF, K_NAN };

/* The fields of a: sign, unbiased exponent, coefficient (0 for a non-canonical one). */
static int unpack(bson_decimal128_t a, bool *neg, int *exp, u128 *coef)
{
	uint64_t hi = a.high;

	*neg = (hi >> 63) != 0;
	if (((hi >> 58) & 0x1f) == 0x1f) {
		return K_NAN;
	}
	if (((hi >> 58) & 0x1f) == 0x1e) {
		return K_INF;
	}
	if (((hi >> 61) & 3) == 3) {
		/* "11" form: coefficient 2^113 and above, always non-canonical for decimal128 */
		*exp = (int)((hi >> 47) & 0x3fff) - EXP_BIAS;
		*coef = 0;
		return K_FINITE;
	}
	*exp = (int)((hi >> 49) & 0x3fff) - EXP_BIAS;
	*coef = ((u128)(hi & 0x1ffffffffffffULL) << 64) | a.low;
	if (*coef > pow10_u128(MAX_DIGITS) - 1) {
		*coef = 0;
	}
	return K_FINITE;
}

/* coef <= 10^34-1 and exp within [EXP_MIN, EXP_MAX]. */
static bson_decimal128_t pack(bool neg, int exp, u128 coef)
{
	bson_decimal128_t a;

	a.high = ((uint64_t)neg << 63) | ((uint64_t)(exp + EXP_BIAS) << 49) | (uint64_t)(coef >> 64);
	a.low = (uint64_t)coef;
	return a;
}

static bson_decimal128_t quiet_nan(void)
{
	bson_decimal128_t a = {.low = 0, .high = 0x7c00000000000000ULL};

	return a;
}

enum { R_HALF_EVEN, R_DOWN_MAG, R_UP_MAG };

/* coef / 10^k rounded by mode (on the magnitude). */
static u128 shift_round(u128 coef, int k, int mode)
{
	u128 p, q, r;

	if (k <= 0) {
		return coef;
	}
	if (k > 38) {
		q = 0;
		r = coef;
		p = 0; /* larger than any coefficient */
	} else {
		p = pow10_u128(k);
		q = coef / p;
		r = coef % p;
	}
	if (r == 0) {
		return q;
	}
	switch (mode) {
	case R_UP_MAG:
		return q + 1;
	case R_DOWN_MAG:
		return q;
	default:
		if (p == 0) {
			return q; /* r < 10^34 < p/2 */
		}
		if (r > p / 2 || (r == p / 2 && (q & 1) != 0)) {
			return q + 1;
		}
		return q;
	}
}

bson_decimal128_t sdb_dec_add(bson_decimal128_t a, bson_decimal128_t b)
{
	return from_d(D_ADD(to_d(a), to_d(b)));
}

bson_decimal128_t sdb_dec_sub(bson_decimal128_t a, bson_decimal128_t b)
{
	return from_d(D_SUB(to_d(a), to_d(b)));
}

bson_decimal128_t sdb_dec_mul(bson_decimal128_t a, bson_decimal128_t b)
{
	return from_d(D_MUL(to_d(a), to_d(b)));
}

bson_decimal128_t sdb_dec_div(bson_decimal128_t a, bson_decimal128_t b)
{
	return from_d(D_DIV(to_d(a), to_d(b)));
}

bson_decimal128_t sdb_dec_mod(bson_decimal128_t a, bson_decimal128_t b)
{
	bool na, nb;
	int ea = 0, eb = 0;
	u128 ca = 0, cb = 0, r;
	int ka = unpack(a, &na, &ea, &ca), kb = unpack(b, &nb, &eb, &cb);

	if (ka == K_NAN || kb == K_NAN || ka == K_INF) {
		return quiet_nan();
	}
	if (kb == K_INF) {
		return a;
	}
	if (cb == 0) {
		return quiet_nan();
	}
	if (ea >= eb) {
		/* (ca * 10^(ea-eb)) mod cb, one digit at a time (cb < 2^113: no overflow) */
		r = ca % cb;
		for (int i = 0; i < ea - eb; i++) {
			r = (r * 10) % cb;
		}
		return pack(na, eb, r);
	}
	/* |a| < |b| once cb * 10^(eb-ea) passes ca (< 10^34) */
	int d = eb - ea;
	u128 p;

	if (d > MAX_DIGITS) {
		return pack(na, ea, ca);
	}
	p = pow10_u128(d);
	if (cb > ~(u128)0 / p) {
		return pack(na, ea, ca);
	}
	u128 m = cb * p;

	r = ca % m;
	return pack(na, ea, r);
}

bson_decimal128_t sdb_dec_abs(bson_decimal128_t a)
{
	a.high &= ~(1ULL << 63);
	return a;
}

static bson_decimal128_t quantize0(bson_decimal128_t a, bool toward_pos)
{
	bool neg;
	int e = 0;
	u128 c = 0;
	int k = unpack(a, &neg, &e, &c);

	if (k != K_FINITE) {
		return quiet_nan();
	}
	if (e >= 0) {
		if (c == 0) {
			return pack(neg, 0, 0);
		}
		if (e > MAX_DIGITS || ndigits(c) + e > MAX_DIGITS) {
			return quiet_nan();
		}
		return pack(neg, 0, c * pow10_u128(e));
	}
	/* toward +Inf rounds a positive magnitude up and a negative one down */
	c = shift_round(c, -e, (toward_pos != neg) ? R_UP_MAG : R_DOWN_MAG);
	return pack(neg, 0, c);
}

bson_decimal128_t sdb_dec_floor(bson_decimal128_t a)
{
	return quantize0(a, false);
}

bson_decimal128_t sdb_dec_ceil(bson_decimal128_t a)
{
	return quantize0(a, true);
}

bson_decimal128_t sdb_dec_quantize(bson_decimal128_t a, int exp, bool trunc)
{
	bool neg;
	int e = 0;
	u128 c = 0;

	if (unpack(a, &neg, &e, &c) != K_FINITE || exp < EXP_MIN || exp > EXP_MAX) {
		return quiet_nan();
	}
	if (c == 0) {
		return pack(neg, exp, 0);
	}
	if (e >= exp) {
		if (e - exp > MAX_DIGITS || ndigits(c) + (e - exp) > MAX_DIGITS) {
			return quiet_nan();
		}
		return pack(neg, exp, c * pow10_u128(e - exp));
	}
	return pack(neg, exp, shift_round(c, exp - e, trunc ? R_DOWN_MAG : R_HALF_EVEN));
}

bool sdb_dec_to_int64_trunc(bson_decimal128_t a, int64_t *out)
{
	bool neg;
	int e = 0;
	u128 c = 0;

	if (unpack(a, &neg, &e, &c) != K_FINITE) {
		return false;
	}
	if (e < 0) {
		c = shift_round(c, -e, R_DOWN_MAG);
	} else if (c != 0) {
		if (e > 19 || ndigits(c) + e > 20) {
			return false;
		}
		c *= pow10_u128(e);
	}
	if (neg ? c > (u128)INT64_MAX + 1 : c > (u128)INT64_MAX) {
		return false;
	}
	*out = neg ? (int64_t)(0 - (uint64_t)c) : (int64_t)c;
	return true;
}

bool sdb_dec_is_inf(bson_decimal128_t a)
{
	bool neg;
	int e;
	u128 c;

	return unpack(a, &neg, &e, &c) == K_INF;
}

int64_t sdb_dec_to_int64(bson_decimal128_t a)
{
	bool neg;
	int e = 0;
	u128 c = 0;

	if (unpack(a, &neg, &e, &c) != K_FINITE) {
		return INT64_MIN;
	}
	if (e < 0) {
		c = shift_round(c, -e, R_HALF_EVEN);
	} else if (c != 0) {
		if (e > 19 || c > (((u128)1) << 64) / pow10_u128(e)) {
			return INT64_MIN;
		}
		c *= pow10_u128(e);
	}
	if (c > (u128)INT64_MAX + (neg ? 1 : 0)) {
		return INT64_MIN;
	}
	return neg ? (int64_t)(0 - (uint64_t)c) : (int64_t)c;
}

bson_decimal128_t sdb_dec_from_int64(int64_t v)
{
	volatile int64_t rt = v; /* libgcc's conversion, as for doubles */

	return from_d(D_FROM_INT64(rt));
}

bson_decimal128_t sdb_dec_from_double(double v, bool digits15)
{
	/* volatile: always libgcc's binary64_to_bid128 (Intel's, as mongod), never GCC's
	 * compile-time folding of a constant, which picks other exponents (0.5 -> 0.50) */
	volatile double rt = v;
	bson_decimal128_t a = from_d(D_FROM_DOUBLE(rt)); /* exact value rounded half even */
	bool neg;
	int e = 0, n;
	u128 c = 0;

	if (!digits15 || v == 0 || !isfinite(v) || unpack(a, &neg, &e, &c) != K_FINITE) {
		return a;
	}
	/* mongod quantizes that conversion to exactly 15 significant digits */
	n = ndigits(c);
	if (n > 15) {
		c = shift_round(c, n - 15, R_HALF_EVEN);
		e += n - 15;
		if (ndigits(c) > 15) { /* 999..9 rounded up to 10^15: exact */
			c /= 10;
			e++;
		}
	} else if (n < 15) {
		c *= pow10_u128(15 - n);
		e -= 15 - n;
	}
	return pack(neg, e, c);
}

double sdb_dec_to_double(bson_decimal128_t a)
{
	return D_TO_DOUBLE(to_d(a));
}

bool sdb_dec_equal(bson_decimal128_t a, bson_decimal128_t b)
{
	if (sdb_dec_is_nan(a) || sdb_dec_is_nan(b))
		return false;
	return D_EQ(to_d(a), to_d(b));
}

bool sdb_dec_is_zero(bson_decimal128_t a)
{
	bool neg;
	int e = 0;
	u128 c = 1;

	return unpack(a, &neg, &e, &c) == K_FINITE && c == 0;
}

bool sdb_dec_is_nan(bson_decimal128_t a)
{
	bool neg;
	int e;
	u128 c;

	return unpack(a, &neg, &e, &c) == K_NAN;
}

bool sdb_dec_from_value(const bson_value_t *v, bson_decimal128_t *out)
{
	switch (v->value_type) {
	case BSON_TYPE_INT32:
		*out = sdb_dec_from_int64(v->value.v_int32);
		return true;
	case BSON_TYPE_INT64:
		*out = sdb_dec_from_int64(v->value.v_int64);
		return true;
	case BSON_TYPE_DOUBLE:
		*out = sdb_dec_from_double(v->value.v_double, true);
		return true;
	case BSON_TYPE_DECIMAL128:
		*out = v->value.v_decimal128;
		return true;
	default:
		return false;
	}
}

/* ---- DoubleDoubleSummation ------------------------------------------------------- */

void sdb_ddsum_add_double(sdb_ddsum *s, double x)
{
	double sum, z, t, ap, bp;

	s->special += x;
	/* Fast2Sum(x, addend): the addend is the smaller one */
	sum = x + s->addend;
	z = sum - x;
	t = s->addend - z;
	x = sum;
	s->addend = t;
	/* 2Sum(sum, x) */
	sum = s->sum + x;
	ap = sum - x;
	bp = sum - ap;
	t = (s->sum - ap) + (x - bp);
	s->sum = sum;
	s->addend += t;
}

void sdb_ddsum_add_long(sdb_ddsum *s, int64_t x)
{
	int64_t high = x / ((int64_t)1 << 32) * ((int64_t)1 << 32);
	int64_t low = x - high;

	sdb_ddsum_add_double(s, (double)low);
	sdb_ddsum_add_double(s, (double)high);
}

double sdb_ddsum_double(const sdb_ddsum *s)
{
	return isnan(s->sum) ? s->special : s->sum;
}

bool sdb_ddsum_fits_long(const sdb_ddsum *s)
{
	const double lim = 9223372036854775808.0; /* 2^63: (double)INT64_MAX rounds to it */

	if (s->sum > -lim && s->sum < lim) {
		return true;
	}
	if (s->sum == lim) {
		return s->addend < -0.5;
	}
	if (s->sum == -lim) {
		return s->addend >= -0.5;
	}
	return false;
}

int64_t sdb_ddsum_long(const sdb_ddsum *s)
{
	int64_t sum;

	if (s->sum == 9223372036854775808.0) {
		/* llround(addend) - INT64_MIN, computed without overflowing */
		return (int64_t)((uint64_t)llround(s->addend) + ((uint64_t)1 << 63));
	}
	sum = llround(s->sum);
	/* unsigned: at -2^63 an addend of -0.5 rounds one below (mongod overflows there too) */
	return (int64_t)((uint64_t)sum + (uint64_t)llround((s->sum - (double)sum) + s->addend));
}

bson_decimal128_t sdb_ddsum_decimal(const sdb_ddsum *s)
{
	if (!isfinite(s->sum)) {
		return sdb_dec_from_double(s->special, false);
	}
	return sdb_dec_add(sdb_dec_from_double(s->sum, false), sdb_dec_from_double(s->addend, false));
}
