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

bool sdb_bson_num_canon(const bson_value_t *v, sdb_bson_num *out)
{
	char buf[BSON_DECIMAL128_STRING];

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
		bson_decimal128_to_string(&v->value.v_decimal128, buf);
		num_from_long_double(strtold(buf, NULL), out);
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

static int value_cmp(const bson_value_t *a, const bson_value_t *b, int depth);

/* Compare two documents/arrays given as raw BSON. */
static int docs_cmp(const uint8_t *ad, size_t alen, const uint8_t *bd, size_t blen, bool names,
		    int depth)
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
		c = value_cmp(bson_iter_value(&ia), bson_iter_value(&ib), depth + 1);
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

static int value_cmp(const bson_value_t *a, const bson_value_t *b, int depth)
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
				b->value.v_doc.data_len, ba == SDB_BRACKET_OBJECT, depth);
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
				depth);
	}
	default: /* MinKey, MaxKey, undefined, null: one value each */
		return 0;
	}
}

int sdb_bson_value_cmp(const bson_value_t *a, const bson_value_t *b)
{
	return value_cmp(a, b, 0);
}

int sdb_bson_cmp(const bson_iter_t *a, const bson_iter_t *b)
{
	bson_iter_t ca, cb;

	if (a)
		ca = *a;
	if (b)
		cb = *b;
	return value_cmp(a ? bson_iter_value(&ca) : NULL, b ? bson_iter_value(&cb) : NULL, 0);
}

int sdb_bson_key_cmp(const bson_t *a, const bson_t *b)
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
		r = sdb_bson_cmp(&ia, &ib);
		if (r != 0)
			break;
	}
	sdb_bson_collator_set(prev);
	return r;
}

int sdb_bson_doc_cmp(const bson_t *a, const bson_t *b)
{
	return docs_cmp(bson_get_data(a), a->len, bson_get_data(b), b->len, true, 0);
}

bool sdb_bson_value_eq(const bson_value_t *a, const bson_value_t *b)
{
	return value_cmp(a, b, 0) == 0;
}

int sdb_bson_value_cmp_simple(const bson_value_t *a, const bson_value_t *b)
{
	const sdb_bson_collator *prev = sdb_bson_collator_set(NULL);
	int r = value_cmp(a, b, 0);

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

