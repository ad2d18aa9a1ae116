/* Query matcher: MongoDB's query language over BSON documents (parsing and evaluation;
 * the $bits* operators are storage/matcher_bits.c, the index-bounds analysis of a filter
 * is storage/bounds.c). See matcher.h. */
#include "storage/matcher.h"
#include "storage/matcher_int.h"
#include "storage/pipeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonget.h"
#include "common/bsonval.h"
#include "storage/decimal.h"
#include "storage/path.h"

#define ERR_REGEX_FLAG 51108
#define ERR_REGEX_INVALID 51091
#define MATCHER_MAX_DEPTH 100 /* nesting of $and/$or/$not/$elemMatch in one filter */

int matcher_fail(perr *pe, int code, const char *fmt, ...)
{
	va_list ap;

	pe->code = code;
	if (pe->err && pe->errlen) {
		va_start(ap, fmt);
		vsnprintf(pe->err, pe->errlen, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
}

/* ---- nodes ------------------------------------------------------------------------ */

static node *node_new(node_kind kind)
{
	node *n = sdb_calloc(1, sizeof *n);

	n->kind = kind;
	return n;
}

static void regex_free(regex *r)
{
	if (r->code)
		pcre2_code_free(r->code);
	free(r->pattern);
	free(r->flags);
	memset(r, 0, sizeof *r);
}

static void node_free(node *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		node_free(n->kids[i]);
	free(n->kids);
	free(n->path);
	if (n->val.value_type != BSON_TYPE_EOD)
		bson_value_destroy(&n->val);
	for (size_t i = 0; i < n->nin; i++)
		bson_value_destroy(&n->in[i]);
	free(n->in);
	free(n->in_sorted);
	for (size_t i = 0; i < n->nin_re; i++)
		regex_free(&n->in_re[i]);
	free(n->in_re);
	regex_free(&n->re);
	sdb_matcher_free(n->sub);
	sdb_expr_free(n->x);
	free(n->bits);
	free(n);
}

static void node_add(node *parent, node *kid)
{
	parent->kids = sdb_realloc(parent->kids, (parent->nkids + 1) * sizeof *parent->kids);
	parent->kids[parent->nkids++] = kid;
}

static node *path_node(const char *path, op_kind op)
{
	node *n = node_new(N_PATH);

	n->op = op;
	n->path = path ? sdb_strdup(path) : NULL;
	return n;
}

/* ---- regex ------------------------------------------------------------------------ */

static int regex_compile(regex *r, const char *pattern, const char *flags, perr *pe)
{
	uint32_t opts = PCRE2_UTF;
	int errcode;
	PCRE2_SIZE erroff;

	for (const char *f = flags; *f; f++) {
		switch (*f) {
		case 'i':
			opts |= PCRE2_CASELESS;
			break;
		case 'm':
			opts |= PCRE2_MULTILINE;
			break;
		case 's':
			opts |= PCRE2_DOTALL;
			break;
		case 'x':
			opts |= PCRE2_EXTENDED;
			break;
		case 'u':
			break;
		default:
			return matcher_fail(pe, ERR_REGEX_FLAG,
					    "invalid flag in regex options: %c", *f);
		}
	}
	r->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &errcode, &erroff,
				NULL);
	if (!r->code) {
		PCRE2_UCHAR msg[256];

		pcre2_get_error_message(errcode, msg, sizeof msg);
		return matcher_fail(pe, ERR_REGEX_INVALID, "Regular expression is invalid: %s", (char *)msg);
	}
	r->pattern = sdb_strdup(pattern);
	r->flags = sdb_strdup(flags);
	return 0;
}

pcre2_code *sdb_regex_compile(const char *pattern, const char *flags, int *code, char *err,
			      size_t errlen)
{
	perr pe = {.err = err, .errlen = errlen};
	regex r = {0};
	pcre2_code *c;

	if (regex_compile(&r, pattern, flags, &pe) != 0) {
		*code = pe.code;
		regex_free(&r);
		return NULL;
	}
	c = r.code;
	r.code = NULL;
	regex_free(&r);
	return c;
}

static bool regex_match(const regex *r, const bson_value_t *v)
{
	const char *s;
	size_t len;
	pcre2_match_data *md;
	int rc;

	switch (v->value_type) {
	case BSON_TYPE_UTF8:
		s = v->value.v_utf8.str;
		len = v->value.v_utf8.len;
		break;
	case BSON_TYPE_SYMBOL:
		s = v->value.v_symbol.symbol;
		len = v->value.v_symbol.len;
		break;
	case BSON_TYPE_REGEX:
		return strcmp(v->value.v_regex.regex, r->pattern) == 0 &&
		       strcmp(v->value.v_regex.options, r->flags) == 0;
	default:
		return false;
	}
	md = pcre2_match_data_create_from_pattern(r->code, NULL);
	if (!md) {
		/* out of memory: the stripedb policy (common/alloc.h) is to abort loudly */
		fprintf(stderr, "stripedb: out of memory (pcre2 match data)\n");
		abort();
	}
	rc = pcre2_match(r->code, (PCRE2_SPTR)s, len, 0, 0, md, NULL);
	pcre2_match_data_free(md);
	return rc >= 0;
}

/* ---- evaluation ------------------------------------------------------------------- */

/* One evaluation's $expr context: the whole document and the first error (rc != 0). */
typedef struct evalctx {
	const bson_t *root;
	int rc;
	int code;
	char *err;
	size_t errlen;
} evalctx;

static bool eval(const node *n, const bson_t *doc, evalctx *ev);
static bool eval_single(const node *n, const bson_iter_t *v);

/* EQ/LT/LTE/GT/GTE of one present value against the operand (MongoDB's
 * ComparisonMatchExpressionBase::matchesSingleElement). */
static bool cmp_value(op_kind op, const bson_value_t *rhs, const bson_value_t *v)
{
	int bv = sdb_bson_bracket(v->value_type), br = sdb_bson_bracket(rhs->value_type);
	int c;

	if (bv != br) {
		/* null and undefined are the same for EQ, LTE, GTE */
		if (bv + br == SDB_BRACKET_NULL + SDB_BRACKET_UNDEFINED &&
		    (bv == SDB_BRACKET_NULL || br == SDB_BRACKET_NULL))
			return op == OP_EQ || op == OP_LTE || op == OP_GTE;
		if (rhs->value_type == BSON_TYPE_MINKEY || rhs->value_type == BSON_TYPE_MAXKEY) {
			c = sdb_bson_value_cmp(v, rhs);
			if (op == OP_LT || op == OP_LTE)
				return c < 0;
			if (op == OP_GT || op == OP_GTE)
				return c > 0;
		}
		return false;
	}
	if (bv == SDB_BRACKET_NUMBER && (is_nan(v) || is_nan(rhs))) {
		if (!(is_nan(v) && is_nan(rhs)))
			return false;
		return op == OP_EQ || op == OP_LTE || op == OP_GTE;
	}
	c = sdb_bson_value_cmp(v, rhs);
	switch (op) {
	case OP_EQ:
		return c == 0;
	case OP_LT:
		return c < 0;
	case OP_LTE:
		return c <= 0;
	case OP_GT:
		return c > 0;
	case OP_GTE:
		return c >= 0;
	default:
		return false;
	}
}

static bool mod_value(const node *n, const bson_value_t *v)
{
	int64_t x;

	if (matcher_num_i64(v, &x, NULL) != MATCHER_I64_OK)
		return false;
	if (n->mod_d == -1)
		return n->mod_r == 0; /* avoid INT64_MIN % -1 */
	return x % n->mod_d == n->mod_r;
}

static bool array_len_is(const bson_iter_t *it, int64_t want)
{
	bson_iter_t c;
	int64_t count = 0;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &c))
		return false;
	while (bson_iter_next(&c))
		count++;
	return count == want;
}

static bool elem_object_match(const sdb_matcher *sub, const bson_iter_t *e)
{
	const bson_value_t *v;
	bson_iter_t c = *e;
	bson_t doc;

	if (!BSON_ITER_HOLDS_DOCUMENT(&c) && !BSON_ITER_HOLDS_ARRAY(&c))
		return false;
	v = bson_iter_value(&c);
	if (!v->value.v_doc.data ||
	    !bson_init_static(&doc, v->value.v_doc.data, v->value.v_doc.data_len))
		return false;
	return eval(sub->root, &doc, NULL); /* no $expr inside $elemMatch */
}

/* Whether v equals a value of n's sorted $in list, with cmp_value's OP_EQ semantics:
 * null and undefined equal each other, NaN equals only NaN, other values equal when
 * sdb_bson_value_cmp says 0 (never across brackets). O(log n). */
static bool in_sorted_has(const node *n, const bson_value_t *v)
{
	int bv = sdb_bson_bracket(v->value_type);

	if (bv == SDB_BRACKET_NULL || bv == SDB_BRACKET_UNDEFINED)
		return n->in_null || n->in_undef;
	if (bv == SDB_BRACKET_NUMBER && is_nan(v))
		return n->in_nan;
	size_t lo = 0, hi = n->nin_sorted;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = sdb_bson_value_cmp(n->in_sorted[mid], v);

		if (c == 0)
			return sdb_bson_bracket(n->in_sorted[mid]->value_type) == bv;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* A path predicate's test of one present value (from the walk, or an element). */
static bool pred_present(const node *n, const bson_iter_t *it)
{
	bson_iter_t c = *it;
	const bson_value_t *v = bson_iter_value(&c);

	switch (n->op) {
	case OP_EQ:
	case OP_LT:
	case OP_LTE:
	case OP_GT:
	case OP_GTE:
		return cmp_value(n->op, &n->val, v);
	case OP_IN:
		if (n->in_sorted && sdb_bson_collator_get() == n->in_sorted_coll) {
			if (in_sorted_has(n, v))
				return true;
		} else {
			for (size_t i = 0; i < n->nin; i++)
				if (cmp_value(OP_EQ, &n->in[i], v))
					return true;
		}
		for (size_t i = 0; i < n->nin_re; i++)
			if (regex_match(&n->in_re[i], v))
				return true;
		return false;
	case OP_REGEX:
		return regex_match(&n->re, v);
	case OP_TYPE: {
		unsigned t = (unsigned)v->value_type & 0xff;

		return (n->types[t >> 3] >> (t & 7)) & 1;
	}
	case OP_MOD:
		return mod_value(n, v);
	case OP_BITS_ALL_SET:
	case OP_BITS_ALL_CLEAR:
	case OP_BITS_ANY_SET:
	case OP_BITS_ANY_CLEAR:
		return matcher_bits_value(n, v);
	case OP_EXISTS:
		return true;
	case OP_SIZE:
		return array_len_is(it, n->size);
	case OP_ELEM_VALUE:
	case OP_ELEM_OBJECT: {
		bson_iter_t e;

		if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
			return false;
		while (bson_iter_next(&e)) {
			if (n->op == OP_ELEM_VALUE ? eval_single(n->kids[0], &e)
						   : elem_object_match(n->sub, &e))
				return true;
		}
		return false;
	}
	}
	return false;
}

/* Does a missing value satisfy the predicate? */
static bool pred_missing(const node *n)
{
	switch (n->op) {
	case OP_EQ:
	case OP_LTE:
	case OP_GTE:
		return n->val.value_type == BSON_TYPE_NULL;
	case OP_IN:
		return n->in_null;
	case OP_EXISTS:
		return false;
	default:
		return false;
	}
}

typedef struct visit_ctx {
	const node *n;
} visit_ctx;

static bool visit_pred(void *ctx, const bson_iter_t *it, unsigned flags)
{
	visit_ctx *vc = ctx;
	const node *n = vc->n;

	if (flags & SDB_PATH_MISSING)
		return pred_missing(n);
	/* $size, $elemMatch and $type: "array" look at whole arrays, not their elements */
	if ((flags & SDB_PATH_ELEM) && (n->op == OP_SIZE || n->op == OP_ELEM_VALUE ||
					n->op == OP_ELEM_OBJECT))
		return false;
	return pred_present(n, it);
}

static bool eval_path(const node *n, const bson_t *doc)
{
	visit_ctx vc = {.n = n};

	if (sdb_path_walk(doc, n->path, SDB_PATH_EXPAND_LEAF, visit_pred, &vc))
		return true;
	/* The walk reports MISSING itself for a missing field, a scalar on the way, or a
	 * sub-document without the field; it reports nothing only when it went through
	 * arrays that hold no sub-document ({a: [1, 2]} and "a.b"), which MongoDB treats as
	 * "no value" but not as missing: {"a.b": null} does not match it. */
	return false;
}

static bool eval(const node *n, const bson_t *doc, evalctx *ev)
{
	bool t;

	switch (n->kind) {
	case N_AND:
		for (size_t i = 0; i < n->nkids; i++)
			if (!eval(n->kids[i], doc, ev))
				return false;
		return true;
	case N_OR:
		for (size_t i = 0; i < n->nkids; i++) {
			t = eval(n->kids[i], doc, ev);
			if (ev && ev->rc)
				return false;
			if (t)
				return true;
		}
		return false;
	case N_NOR:
		for (size_t i = 0; i < n->nkids; i++)
			if (eval(n->kids[i], doc, ev) || (ev && ev->rc))
				return false;
		return true;
	case N_NOT:
		t = eval(n->kids[0], doc, ev);
		return !t && !(ev && ev->rc);
	case N_FALSE:
		return false;
	case N_PATH:
		return eval_path(n, doc);
	case N_EXPR:
		if (!ev || n->x == NULL)
			return false;
		if (sdb_expr_truthy(n->x, ev->root, &t, &ev->code, ev->err, ev->errlen) != 0) {
			ev->rc = SDB_EINVAL;
			return false;
		}
		return t;
	}
	return false;
}

/* Value-level evaluation (path-less nodes of $elemMatch value form and new_elem). */
static bool eval_single(const node *n, const bson_iter_t *v)
{
	switch (n->kind) {
	case N_AND:
		for (size_t i = 0; i < n->nkids; i++)
			if (!eval_single(n->kids[i], v))
				return false;
		return true;
	case N_OR:
		for (size_t i = 0; i < n->nkids; i++)
			if (eval_single(n->kids[i], v))
				return true;
		return false;
	case N_NOR:
		for (size_t i = 0; i < n->nkids; i++)
			if (eval_single(n->kids[i], v))
				return false;
		return true;
	case N_NOT:
		return !eval_single(n->kids[0], v);
	case N_FALSE:
		return false;
	case N_PATH:
		return pred_present(n, v);
	case N_EXPR: /* never built in a value-form $elemMatch */
		return false;
	}
	return false;
}

/* ---- parsing ---------------------------------------------------------------------- */

static int parse_query(const bson_t *q, node *and_out, int depth, perr *pe);
static int parse_ops(const char *path, const bson_iter_t *opdoc, node *and_out, int depth,
		     perr *pe);

static bool true_value(const bson_iter_t *it)
{
	switch (bson_iter_type(it)) {
	case BSON_TYPE_BOOL:
		return bson_iter_bool(it);
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128: {
		bson_iter_t c = *it;
		sdb_bson_num n;

		sdb_bson_num_canon(bson_iter_value(&c), &n);
		return n.cls != 3;
	}
	case BSON_TYPE_NULL:
	case BSON_TYPE_UNDEFINED:
	case BSON_TYPE_EOD:
		return false;
	default:
		return true;
	}
}

/* A document value whose first field starts with '$' is an operator document, except a
 * DBRef ({$ref, $id, $db}), which MongoDB compares as a literal. */
static bool is_op_doc(const bson_iter_t *it)
{
	bson_iter_t c;
	const char *k;

	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &c) || !bson_iter_next(&c))
		return false;
	k = bson_iter_key(&c);
	return k[0] == '$' && strcmp(k, "$ref") != 0 && strcmp(k, "$id") != 0 &&
	       strcmp(k, "$db") != 0;
}

matcher_i64 matcher_num_i64(const bson_value_t *v, int64_t *out, bool *whole)
{
	switch (v->value_type) {
	case BSON_TYPE_INT32:
		*out = v->value.v_int32;
		break;
	case BSON_TYPE_INT64:
		*out = v->value.v_int64;
		break;
	case BSON_TYPE_DOUBLE: {
		double d = v->value.v_double;

		if (!isfinite(d) || d >= 9.2233720368547758e18 || d < -9.2233720368547758e18)
			goto out_of_range;
		*out = (int64_t)d;
		if (whole)
			*whole = (double)*out == d;
		return MATCHER_I64_OK;
	}
	case BSON_TYPE_DECIMAL128: {
		char buf[BSON_DECIMAL128_STRING];
		long double ld;

		bson_decimal128_to_string(&v->value.v_decimal128, buf);
		ld = strtold(buf, NULL);
		if (!isfinite(ld) || ld >= 9.2233720368547758e18L || ld < -9.2233720368547758e18L)
			goto out_of_range;
		*out = (int64_t)ld;
		if (whole) {
			/* exact: 2.0000000000000000000001 is not whole though its long double is */
			bson_value_t iv = {.value_type = BSON_TYPE_INT64};

			iv.value.v_int64 = *out;
			*whole = sdb_bson_value_cmp(v, &iv) == 0;
		}
		return MATCHER_I64_OK;
	}
	default:
		return MATCHER_I64_NOT_NUMBER;
	}
	if (whole)
		*whole = true;
	return MATCHER_I64_OK;
out_of_range:
	*out = 0;
	if (whole)
		*whole = false;
	return MATCHER_I64_OUT_OF_RANGE;
}

/* A number operand (it) as an int64 for the parser: false when it is not a number; an
 * out-of-range one gives 0, not whole (matcher_num_i64). */
static bool num_as_i64(const bson_iter_t *it, int64_t *out, bool *whole)
{
	bson_iter_t c = *it;

	*whole = true;
	return matcher_num_i64(bson_iter_value(&c), out, whole) != MATCHER_I64_NOT_NUMBER;
}

static const struct {
	const char *name;
	int code;
} type_aliases[] = {
	{"double", 1},	   {"string", 2},     {"object", 3},	 {"array", 4},
	{"binData", 5},	   {"undefined", 6},  {"objectId", 7},	 {"bool", 8},
	{"date", 9},	   {"null", 10},      {"regex", 11},	 {"dbPointer", 12},
	{"javascript", 13}, {"symbol", 14},   {"javascriptWithScope", 15},
	{"int", 16},	   {"timestamp", 17}, {"long", 18},	 {"decimal", 19},
	{"minKey", -1},	   {"maxKey", 127},
};

bool sdb_bson_type_code(const char *name, size_t len, int *code)
{
	for (size_t i = 0; i < sizeof type_aliases / sizeof type_aliases[0]; i++) {
		if (strlen(type_aliases[i].name) == len && memcmp(type_aliases[i].name, name, len) == 0) {
			*code = type_aliases[i].code;
			return true;
		}
	}
	return false;
}

bool sdb_bson_type_known(int code)
{
	for (size_t i = 0; i < sizeof type_aliases / sizeof type_aliases[0]; i++)
		if (type_aliases[i].code == code)
			return true;
	return false;
}

static void type_set(node *n, int code)
{
	unsigned t = (unsigned)code & 0xff;

	n->types[t >> 3] |= (uint8_t)(1u << (t & 7));
}

static int type_add(node *n, const bson_iter_t *it, perr *pe)
{
	if (BSON_ITER_HOLDS_UTF8(it)) {
		const char *s = bson_iter_utf8(it, NULL);

		if (strcmp(s, "number") == 0) {
			type_set(n, BSON_TYPE_INT32);
			type_set(n, BSON_TYPE_INT64);
			type_set(n, BSON_TYPE_DOUBLE);
			type_set(n, BSON_TYPE_DECIMAL128);
			return 0;
		}
		int code;
		if (sdb_bson_type_code(s, strlen(s), &code)) {
			type_set(n, code);
			return 0;
		}
		return matcher_fail(pe, ERR_BAD_VALUE, "Unknown type name alias: %s", s);
	}
	{
		int64_t code;
		bool whole;

		if (!num_as_i64(it, &code, &whole))
			return matcher_fail(pe, ERR_BAD_VALUE,
				    "type must be represented as a number or a string");
		if (!whole)
			return matcher_fail(pe, ERR_BAD_VALUE, "Invalid numerical type code");
		if (!((code >= 1 && code <= 19) || code == -1 || code == 127))
			return matcher_fail(pe, ERR_BAD_VALUE, "Invalid numerical type code: %lld",
				    (long long)code);
		type_set(n, (int)code);
		return 0;
	}
}

static void copy_value(const bson_iter_t *it, bson_value_t *out)
{
	bson_iter_t c = *it;

	bson_value_copy(bson_iter_value(&c), out);
}

/* $in lists at least this long get a sorted copy for binary search (in_sorted_has). */
#define IN_SORTED_MIN 16

static int in_sorted_cmp(const void *a, const void *b)
{
	return sdb_bson_value_cmp(*(const bson_value_t *const *)a,
				  *(const bson_value_t *const *)b);
}

/* Build n->in_sorted from n->in under the thread's collation (see matcher_int.h). */
static void in_sort(node *n)
{
	if (n->nin < IN_SORTED_MIN)
		return;
	n->in_sorted = sdb_malloc(n->nin * sizeof *n->in_sorted);
	for (size_t i = 0; i < n->nin; i++) {
		const bson_value_t *v = &n->in[i];
		int b = sdb_bson_bracket(v->value_type);

		if (b == SDB_BRACKET_UNDEFINED)
			n->in_undef = true;
		else if (b == SDB_BRACKET_NUMBER && is_nan(v))
			n->in_nan = true;
		else if (b != SDB_BRACKET_NULL)
			n->in_sorted[n->nin_sorted++] = v;
	}
	qsort(n->in_sorted, n->nin_sorted, sizeof *n->in_sorted, in_sorted_cmp);
	n->in_sorted_coll = sdb_bson_collator_get();
}

static int parse_in_list(node *n, const bson_iter_t *it, const char *opname, perr *pe)
{
	bson_iter_t e;
	size_t cap = 0;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
		return matcher_fail(pe, ERR_BAD_VALUE, "%s needs an array", opname);
	{
		bson_iter_t cnt = e;

		while (bson_iter_next(&cnt))
			cap++;
	}
	if (cap)
		n->in = sdb_malloc(cap * sizeof *n->in);
	while (bson_iter_next(&e)) {
		if (BSON_ITER_HOLDS_REGEX(&e)) {
			const char *opts;
			const char *pat = bson_iter_regex(&e, &opts);
			int rc;

			n->in_re = sdb_realloc(n->in_re, (n->nin_re + 1) * sizeof *n->in_re);
			memset(&n->in_re[n->nin_re], 0, sizeof n->in_re[0]);
			rc = regex_compile(&n->in_re[n->nin_re], pat, opts, pe);
			n->nin_re++;
			if (rc)
				return rc;
			continue;
		}
		if (is_op_doc(&e))
			return matcher_fail(pe, ERR_BAD_VALUE, "cannot nest $ under %s", opname);
		if (BSON_ITER_HOLDS_NULL(&e))
			n->in_null = true;
		copy_value(&e, &n->in[n->nin++]);
	}
	in_sort(n);
	return 0;
}

static int parse_mod(node *n, const bson_iter_t *it, perr *pe)
{
	bson_iter_t e;
	int64_t v[2];
	int count = 0;
	bool whole;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
		return matcher_fail(pe, ERR_BAD_VALUE, "malformed mod, needs to be an array");
	while (bson_iter_next(&e)) {
		if (count == 2)
			return matcher_fail(pe, ERR_BAD_VALUE, "malformed mod, too many elements");
		if (!num_as_i64(&e, &v[count], &whole))
			return matcher_fail(pe, ERR_BAD_VALUE, "malformed mod, %s not a number",
				    count == 0 ? "divisor" : "remainder");
		if (BSON_ITER_HOLDS_DOUBLE(&e) && !isfinite(bson_iter_double(&e)))
			return matcher_fail(pe, ERR_BAD_VALUE, "malformed mod, %s value is invalid :: caused by :: %s",
				    count == 0 ? "divisor" : "remainder", "value must be finite");
		count++;
	}
	if (count < 2)
		return matcher_fail(pe, ERR_BAD_VALUE, "malformed mod, not enough elements");
	if (v[0] == 0)
		return matcher_fail(pe, ERR_BAD_VALUE, "divisor cannot be 0");
	n->mod_d = v[0];
	n->mod_r = v[1];
	return 0;
}

static int parse_regex_pair(const char *path, const bson_iter_t *re_it, const bson_iter_t *opt_it,
			    node *and_out, perr *pe)
{
	const char *pattern, *flags = "";
	node *n;
	int rc;

	if (BSON_ITER_HOLDS_UTF8(re_it)) {
		pattern = bson_iter_utf8(re_it, NULL);
	} else if (BSON_ITER_HOLDS_REGEX(re_it)) {
		pattern = bson_iter_regex(re_it, &flags);
	} else {
		return matcher_fail(pe, ERR_BAD_VALUE, "$regex has to be a string");
	}
	if (opt_it) {
		if (!BSON_ITER_HOLDS_UTF8(opt_it))
			return matcher_fail(pe, ERR_BAD_VALUE, "$options has to be a string");
		if (BSON_ITER_HOLDS_REGEX(re_it) && *flags)
			return matcher_fail(pe, ERR_BAD_VALUE,
				    "options set in both $regex and $options");
		flags = bson_iter_utf8(opt_it, NULL);
	}
	if (strlen(pattern) != (BSON_ITER_HOLDS_UTF8(re_it) ? bson_iter_utf8_len_unsafe(re_it)
							     : strlen(pattern)))
		return matcher_fail(pe, 51108,
				    "Regular expression cannot contain an embedded null byte");
	n = path_node(path, OP_REGEX);
	rc = regex_compile(&n->re, pattern, flags, pe);
	if (rc) {
		node_free(n);
		return rc;
	}
	node_add(and_out, n);
	return 0;
}

static int parse_elem_match(const char *path, const bson_iter_t *it, node *and_out, int depth,
			    perr *pe)
{
	bson_iter_t c;
	bson_t sub;
	const bson_value_t *v;
	node *n;
	int rc;
	bool value_form = false;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return matcher_fail(pe, ERR_BAD_VALUE, "$elemMatch needs an Object");
	c = *it;
	v = bson_iter_value(&c);
	if (!v->value.v_doc.data ||
	    !bson_init_static(&sub, v->value.v_doc.data, v->value.v_doc.data_len))
		return matcher_fail(pe, ERR_BAD_VALUE, "$elemMatch: corrupt document");
	if (bson_iter_recurse(it, &c) && bson_iter_next(&c)) {
		const char *k = bson_iter_key(&c);

		value_form = k[0] == '$' && strcmp(k, "$and") != 0 && strcmp(k, "$or") != 0 &&
			     strcmp(k, "$nor") != 0 && strcmp(k, "$where") != 0 &&
			     strcmp(k, "$expr") != 0 && strcmp(k, "$comment") != 0;
	}
	if (value_form) {
		node *inner = node_new(N_AND);

		rc = parse_ops(NULL, it, inner, depth + 1, pe);
		if (rc) {
			node_free(inner);
			return rc;
		}
		n = path_node(path, OP_ELEM_VALUE);
		node_add(n, inner);
	} else {
		n = path_node(path, OP_ELEM_OBJECT);
		bool was_in_elem = pe->in_elem;

		n->sub = sdb_calloc(1, sizeof *n->sub);
		n->sub->root = node_new(N_AND);
		pe->in_elem = true;
		rc = parse_query(&sub, n->sub->root, depth + 1, pe);
		pe->in_elem = was_in_elem;
		if (rc) {
			node_free(n);
			return rc;
		}
	}
	node_add(and_out, n);
	return 0;
}

static int parse_all(const char *path, const bson_iter_t *it, node *and_out, int depth, perr *pe)
{
	bson_iter_t e;
	int n_elem = 0, n_other = 0;
	int rc;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
		return matcher_fail(pe, ERR_BAD_VALUE, "$all needs an array");
	while (bson_iter_next(&e)) {
		bson_iter_t c;

		if (BSON_ITER_HOLDS_DOCUMENT(&e) && bson_iter_recurse(&e, &c) && bson_iter_next(&c) &&
		    strcmp(bson_iter_key(&c), "$elemMatch") == 0) {
			n_elem++;
			if (n_other)
				return matcher_fail(pe, ERR_BAD_VALUE, "$all/$elemMatch has to be consistent");
			rc = parse_elem_match(path, &c, and_out, depth, pe);
			if (rc)
				return rc;
			if (bson_iter_next(&c))
				return matcher_fail(pe, ERR_BAD_VALUE, "$all/$elemMatch has to be consistent");
			continue;
		}
		if (n_elem)
			return matcher_fail(pe, ERR_BAD_VALUE,
					    "$all/$elemMatch has to be consistent");
		n_other++;
		if (BSON_ITER_HOLDS_REGEX(&e)) {
			rc = parse_regex_pair(path, &e, NULL, and_out, pe);
			if (rc)
				return rc;
			continue;
		}
		if (is_op_doc(&e))
			return matcher_fail(pe, ERR_BAD_VALUE, "no $ expressions in $all");
		{
			node *n = path_node(path, OP_EQ);

			copy_value(&e, &n->val);
			node_add(and_out, n);
		}
	}
	if (n_elem + n_other == 0) /* $all: [] matches nothing */
		node_add(and_out, node_new(N_FALSE));
	return 0;
}

/* Parse {$op: arg, ...} applied to path (NULL: to the value itself) into and_out. */
static int parse_ops(const char *path, const bson_iter_t *opdoc, node *and_out, int depth,
		     perr *pe)
{
	bson_iter_t it, re_it, opt_it;
	bool have_re = false, have_opt = false;
	int rc;

	if (depth > MATCHER_MAX_DEPTH)
		return matcher_fail(pe, ERR_BAD_VALUE,
				    "exceeded depth limit of %d when parsing the filter",
				    MATCHER_MAX_DEPTH);
	if (!bson_iter_recurse(opdoc, &it))
		return matcher_fail(pe, ERR_BAD_VALUE, "corrupt operator document");
	while (bson_iter_next(&it)) {
		const char *op = bson_iter_key(&it);
		op_kind cmp = 0;
		node *n;

		if (op[0] != '$')
			return matcher_fail(pe, ERR_BAD_VALUE, "unknown operator: %s", op);
		if (strcmp(op, "$eq") == 0)
			cmp = OP_EQ;
		else if (strcmp(op, "$lt") == 0)
			cmp = OP_LT;
		else if (strcmp(op, "$lte") == 0)
			cmp = OP_LTE;
		else if (strcmp(op, "$gt") == 0)
			cmp = OP_GT;
		else if (strcmp(op, "$gte") == 0)
			cmp = OP_GTE;
		if (cmp) {
			/* {$eq: /re/} is equality with the regex value, not a pattern match */
			n = path_node(path, cmp);
			copy_value(&it, &n->val);
			node_add(and_out, n);
			continue;
		}
		if (strcmp(op, "$ne") == 0) {
			node *neg = node_new(N_NOT);

			n = path_node(path, OP_EQ);
			copy_value(&it, &n->val);
			node_add(neg, n);
			node_add(and_out, neg);
			continue;
		}
		if (strcmp(op, "$in") == 0 || strcmp(op, "$nin") == 0) {
			n = path_node(path, OP_IN);
			rc = parse_in_list(n, &it, op, pe);
			if (rc) {
				node_free(n);
				return rc;
			}
			if (op[1] == 'n') {
				node *neg = node_new(N_NOT);

				node_add(neg, n);
				n = neg;
			}
			node_add(and_out, n);
			continue;
		}
		if (strcmp(op, "$exists") == 0) {
			n = path_node(path, OP_EXISTS);
			if (true_value(&it)) {
				node_add(and_out, n);
			} else {
				node *neg = node_new(N_NOT);

				node_add(neg, n);
				node_add(and_out, neg);
			}
			continue;
		}
		if (strcmp(op, "$type") == 0) {
			n = path_node(path, OP_TYPE);
			if (BSON_ITER_HOLDS_ARRAY(&it)) {
				bson_iter_t e;
				int count = 0;

				if (bson_iter_recurse(&it, &e)) {
					while (bson_iter_next(&e)) {
						count++;
						if ((rc = type_add(n, &e, pe))) {
							node_free(n);
							return rc;
						}
					}
				}
				if (count == 0) {
					node_free(n);
					return matcher_fail(pe, ERR_BAD_VALUE,
						    "%s must match at least one type", op);
				}
			} else if ((rc = type_add(n, &it, pe))) {
				node_free(n);
				return rc;
			}
			node_add(and_out, n);
			continue;
		}
		if (strcmp(op, "$size") == 0) {
			int64_t sz;
			bool whole;

			if (!num_as_i64(&it, &sz, &whole))
				return matcher_fail(pe, ERR_BAD_VALUE, "$size needs a number");
			if (!whole)
				return matcher_fail(pe, ERR_BAD_VALUE,
						    "$size must be a whole number");
			if (sz < 0)
				return matcher_fail(pe, ERR_BAD_VALUE, "$size may not be negative");
			n = path_node(path, OP_SIZE);
			n->size = sz;
			node_add(and_out, n);
			continue;
		}
		if (strcmp(op, "$mod") == 0) {
			n = path_node(path, OP_MOD);
			if ((rc = parse_mod(n, &it, pe))) {
				node_free(n);
				return rc;
			}
			node_add(and_out, n);
			continue;
		}
		if (strncmp(op, "$bits", 5) == 0) {
			op_kind bk = matcher_bits_op(op);

			if (bk == 0)
				return matcher_fail(pe, ERR_BAD_VALUE, "unknown operator: %s", op);
			n = path_node(path, bk);
			if ((rc = matcher_parse_bits(n, op, &it, pe))) {
				node_free(n);
				return rc;
			}
			node_add(and_out, n);
			continue;
		}
		if (strcmp(op, "$regex") == 0) {
			re_it = it;
			have_re = true;
			continue;
		}
		if (strcmp(op, "$options") == 0) {
			opt_it = it;
			have_opt = true;
			continue;
		}
		if (strcmp(op, "$all") == 0) {
			if ((rc = parse_all(path, &it, and_out, depth, pe)))
				return rc;
			continue;
		}
		if (strcmp(op, "$elemMatch") == 0) {
			if ((rc = parse_elem_match(path, &it, and_out, depth, pe)))
				return rc;
			continue;
		}
		if (strcmp(op, "$not") == 0) {
			node *neg = node_new(N_NOT), *inner = node_new(N_AND);

			node_add(neg, inner);
			if (BSON_ITER_HOLDS_REGEX(&it)) {
				rc = parse_regex_pair(path, &it, NULL, inner, pe);
			} else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
				bson_iter_t c;

				if (!bson_iter_recurse(&it, &c) || !bson_iter_next(&c))
					rc = matcher_fail(pe, ERR_BAD_VALUE,
							  "$not cannot be empty");
				else
					rc = parse_ops(path, &it, inner, depth + 1, pe);
			} else {
				rc = matcher_fail(pe, ERR_BAD_VALUE,
						  "$not needs a regex or a document");
			}
			if (rc) {
				node_free(neg);
				return rc;
			}
			node_add(and_out, neg);
			continue;
		}
		if (strcmp(op, "$comment") == 0)
			continue;
		if (strcmp(op, "$expr") == 0 || strcmp(op, "$where") == 0)
			return matcher_fail(pe, ERR_BAD_VALUE,
					    "%s is not supported by stripedb", op);
		/* MongoDB's geospatial query operators: no geo indexes or geometry here */
		if (strcmp(op, "$geoWithin") == 0 || strcmp(op, "$geoIntersects") == 0 ||
		    strcmp(op, "$near") == 0 || strcmp(op, "$nearSphere") == 0 ||
		    strcmp(op, "$within") == 0)
			return matcher_fail(pe, ERR_BAD_VALUE,
					    "%s (a geospatial query operator) is not supported by "
					    "stripedb",
					    op);
		return matcher_fail(pe, ERR_BAD_VALUE, "unknown operator: %s", op);
	}
	if (have_opt && !have_re)
		return matcher_fail(pe, ERR_BAD_VALUE, "$options needs a $regex");
	if (have_re)
		return parse_regex_pair(path, &re_it, have_opt ? &opt_it : NULL, and_out, pe);
	return 0;
}

static int parse_logical(node_kind kind, const char *name, const bson_iter_t *it, node *and_out,
			 int depth, perr *pe)
{
	bson_iter_t e;
	node *n;
	int count = 0, rc;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
		return matcher_fail(pe, ERR_BAD_VALUE, "%s must be an array", name);
	n = node_new(kind);
	while (bson_iter_next(&e)) {
		bson_iter_t c = e;
		const bson_value_t *v;
		bson_t sub;
		node *kid;

		if (!BSON_ITER_HOLDS_DOCUMENT(&e)) {
			node_free(n);
			return matcher_fail(pe, ERR_BAD_VALUE, "$or/$and/$nor entries need to be full objects");
		}
		v = bson_iter_value(&c);
		if (!v->value.v_doc.data ||
	    !bson_init_static(&sub, v->value.v_doc.data, v->value.v_doc.data_len)) {
			node_free(n);
			return matcher_fail(pe, ERR_BAD_VALUE, "corrupt document in %s", name);
		}
		kid = node_new(N_AND);
		node_add(n, kid);
		if ((rc = parse_query(&sub, kid, depth + 1, pe))) {
			node_free(n);
			return rc;
		}
		count++;
	}
	if (count == 0) {
		node_free(n);
		return matcher_fail(pe, ERR_BAD_VALUE, "$and/$or/$nor must be a nonempty array");
	}
	node_add(and_out, n);
	return 0;
}

/* {$expr: <aggregation expression>} (MongoDB 3.6+): true where the expression is. */
static int parse_expr(const bson_iter_t *it, node *and_out, perr *pe)
{
	node *n;

	if (pe->in_elem)
		return matcher_fail(pe, ERR_BAD_VALUE, "$expr can only be applied to the top-level document");
	if (!pe->allow_expr)
		return matcher_fail(pe, ERR_BAD_VALUE,
			    "$expr is not supported here by stripedb (only in the filters of find, "
			    "count, distinct, update, delete, findAndModify and $match)");
	n = node_new(N_EXPR);
	if (pe->expr_shape) {
		node_add(and_out, n);
		return 0;
	}
	if (sdb_expr_parse(it, pe->vars, &n->x, &pe->code, pe->err, pe->errlen) != 0) {
		node_free(n);
		return SDB_EINVAL;
	}
	node_add(and_out, n);
	return 0;
}

static int parse_query(const bson_t *q, node *and_out, int depth, perr *pe)
{
	bson_iter_t it;
	int rc;

	if (depth > MATCHER_MAX_DEPTH)
		return matcher_fail(pe, ERR_BAD_VALUE,
				    "exceeded depth limit of %d when parsing the filter",
				    MATCHER_MAX_DEPTH);
	if (!bson_iter_init(&it, q))
		return matcher_fail(pe, ERR_BAD_VALUE, "corrupt filter document");
	while (bson_iter_next(&it)) {
		const char *key = bson_iter_key(&it);
		node *n;

		if (key[0] == '$') {
			if (strcmp(key, "$and") == 0)
				rc = parse_logical(N_AND, key, &it, and_out, depth, pe);
			else if (strcmp(key, "$or") == 0)
				rc = parse_logical(N_OR, key, &it, and_out, depth, pe);
			else if (strcmp(key, "$nor") == 0)
				rc = parse_logical(N_NOR, key, &it, and_out, depth, pe);
			else if (strcmp(key, "$comment") == 0)
				rc = 0;
			else if (strcmp(key, "$expr") == 0)
				rc = parse_expr(&it, and_out, pe);
			else if (strcmp(key, "$where") == 0 || strcmp(key, "$text") == 0 ||
				 strcmp(key, "$jsonSchema") == 0 || strcmp(key, "$sampleRate") == 0)
				rc = matcher_fail(pe, ERR_BAD_VALUE, "%s is not supported by stripedb", key);
			else
				rc = matcher_fail(pe, ERR_BAD_VALUE,
						  "unknown top level operator: %s", key);
			if (rc)
				return rc;
			continue;
		}
		if (is_op_doc(&it)) {
			if ((rc = parse_ops(key, &it, and_out, depth, pe)))
				return rc;
			continue;
		}
		if (BSON_ITER_HOLDS_REGEX(&it)) {
			if ((rc = parse_regex_pair(key, &it, NULL, and_out, pe)))
				return rc;
			continue;
		}
		n = path_node(key, OP_EQ);
		copy_value(&it, &n->val);
		node_add(and_out, n);
	}
	return 0;
}

/* ---- public API ------------------------------------------------------------------- */

static int matcher_build(const bson_t *filter, bool elem, unsigned flags, const bson_t *vars,
			 sdb_matcher **out, int *code, char *err, size_t errlen)
{
	perr pe = {.code = 0, .err = err, .errlen = errlen,
		   .allow_expr = (flags & (SDB_MATCHER_EXPR | SDB_MATCHER_EXPR_SHAPE)) != 0,
		   .expr_shape = (flags & SDB_MATCHER_EXPR_SHAPE) != 0, .vars = vars};
	sdb_matcher *m = sdb_calloc(1, sizeof *m);
	int rc;

	*out = NULL;
	if (code)
		*code = 0;
	if (err && errlen)
		err[0] = '\0';
	m->root = node_new(N_AND);
	if (elem) {
		bson_iter_t it;

		if (bson_iter_init(&it, filter) && bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);

			m->value_form = k[0] == '$' && strcmp(k, "$and") != 0 &&
					strcmp(k, "$or") != 0 && strcmp(k, "$nor") != 0;
		}
	}
	if (m->value_form) {
		bson_t wrap = BSON_INITIALIZER;
		bson_iter_t it;

		BSON_APPEND_DOCUMENT(&wrap, "c", filter);
		bson_iter_init_find(&it, &wrap, "c");
		rc = parse_ops(NULL, &it, m->root, 0, &pe);
		bson_destroy(&wrap);
	} else {
		rc = parse_query(filter, m->root, 0, &pe);
	}
	if (rc) {
		if (code)
			*code = pe.code;
		sdb_matcher_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int sdb_matcher_new(const bson_t *filter, sdb_matcher **out, int *code, char *err, size_t errlen)
{
	return matcher_build(filter, false, 0, NULL, out, code, err, errlen);
}

int sdb_matcher_new_opts(const bson_t *filter, unsigned flags, sdb_matcher **out, int *code,
			 char *err, size_t errlen)
{
	return matcher_build(filter, false, flags, NULL, out, code, err, errlen);
}

int sdb_matcher_new_vars(const bson_t *filter, unsigned flags, const bson_t *vars,
			 sdb_matcher **out, int *code, char *err, size_t errlen)
{
	return matcher_build(filter, false, flags, vars, out, code, err, errlen);
}

int sdb_matcher_new_elem(const bson_t *cond, sdb_matcher **out, int *code, char *err,
			 size_t errlen)
{
	return matcher_build(cond, true, 0, NULL, out, code, err, errlen);
}

bool sdb_matcher_match(const sdb_matcher *m, const bson_t *doc)
{
	evalctx ev = {.root = doc};

	if (m->value_form)
		return false;
	return eval(m->root, doc, &ev) && ev.rc == 0;
}

int sdb_matcher_eval(const sdb_matcher *m, const bson_t *doc, int *code, char *err,
		     size_t errlen)
{
	evalctx ev = {.root = doc, .err = err, .errlen = errlen};
	bool t;

	if (code)
		*code = 0;
	if (m->value_form)
		return 0;
	t = eval(m->root, doc, &ev);
	if (ev.rc) {
		if (code)
			*code = ev.code;
		return ev.rc;
	}
	return t ? 1 : 0;
}

bool sdb_matcher_match_value(const sdb_matcher *m, const bson_iter_t *value)
{
	if (m->value_form)
		return eval_single(m->root, value);
	return elem_object_match(m, value) && BSON_ITER_HOLDS_DOCUMENT(value);
}

void sdb_matcher_free(sdb_matcher *m)
{
	if (!m)
		return;
	node_free(m->root);
	free(m);
}
