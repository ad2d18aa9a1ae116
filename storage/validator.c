/* Document validation: the validator's clauses and $jsonSchema (see validator.h). */
#include "storage/validator.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/bsonval.h"
#include "common/err.h"
#include "storage/decimal.h"
#include "storage/matcher.h"
#include "storage/path.h"

#define C_BAD_VALUE 2
#define C_FAILED_TO_PARSE 9
#define C_TYPE_MISMATCH 14
#define C_REGEX_INVALID 51091

typedef enum { N_AND, N_OR, N_NOR, N_SCHEMA, N_LEAF } nkind;

typedef struct vnode {
	nkind kind;
	bson_t *spec;	   /* leaf: {field: value}; schema: the schema; lists: unused */
	sdb_matcher *m;	   /* leaf */
	struct vnode *kid; /* lists: one node per clause (AND) or per member filter */
	size_t n;
} vnode;

/* One compiled pattern of the validator (pattern, patternProperties' keys), compiled once
 * when the validator is built; sorted by pat for bsearch. */
typedef struct {
	char *pat;
	pcre2_code *re;
} rx_entry;

typedef struct {
	rx_entry *v;
	size_t n, cap;
	pcre2_match_context *mctx;
} rx_cache;

struct sdb_validator {
	vnode root;
	rx_cache rx; /* its regexes, compiled once (read-only while checked) */
};

/* ------------------------------------------------------------------ helpers */

static int failf(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (code)
		*code = c;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return SDB_EINVAL;
}

static bson_t *iter_doc(const bson_iter_t *it)
{
	uint32_t len;
	const uint8_t *data;

	if (BSON_ITER_HOLDS_DOCUMENT(it))
		bson_iter_document(it, &len, &data);
	else
		bson_iter_array(it, &len, &data);
	return bson_new_from_data(data, len);
}

static bool sub_static(const bson_iter_t *it, bson_t *out)
{
	uint32_t len;
	const uint8_t *data;

	if (BSON_ITER_HOLDS_DOCUMENT(it))
		bson_iter_document(it, &len, &data);
	else if (BSON_ITER_HOLDS_ARRAY(it))
		bson_iter_array(it, &len, &data);
	else
		return false;
	return bson_init_static(out, data, len);
}

static bool is_num(bson_type_t t)
{
	return t == BSON_TYPE_INT32 || t == BSON_TYPE_INT64 || t == BSON_TYPE_DOUBLE ||
	       t == BSON_TYPE_DECIMAL128;
}

/* A number as a double (decimal128 through its string form: bson_iter_as_double gives 0
 * for it). */
static double num_of(const bson_iter_t *it)
{
	if (BSON_ITER_HOLDS_DECIMAL128(it)) {
		bson_decimal128_t d;
		char buf[BSON_DECIMAL128_STRING];
		bson_iter_decimal128(it, &d);
		bson_decimal128_to_string(&d, buf);
		return strtod(buf, NULL);
	}
	return bson_iter_as_double(it);
}

/* PCRE2's bounds on one match (pcre2_set_match_limit / pcre2_set_depth_limit): a pattern
 * with catastrophic backtracking (^(a+)+$) fails quickly instead of holding the shard's
 * write lock; hitting one is an error of the write, never a silent pass or fail. */
#define RX_MATCH_LIMIT 100000
#define RX_DEPTH_LIMIT 1000

static pcre2_code *regex_compile(const char *pat, char *msg, size_t msglen)
{
	int errcode;
	PCRE2_SIZE erroff;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errcode,
				       &erroff, NULL);

	if (!re && msg) {
		PCRE2_UCHAR m[256];
		pcre2_get_error_message(errcode, m, sizeof m);
		snprintf(msg, msglen, "%s", (char *)m);
	}
	return re;
}

/* The cache of the validator being checked on this thread (set by sdb_validator_check),
 * and the first PCRE2 error (a limit hit) of that check (0: none). */
static _Thread_local const rx_cache *tl_rx;
static _Thread_local int tl_rx_err;

static int rx_entry_cmp(const void *a, const void *b)
{
	return strcmp(((const rx_entry *)a)->pat, ((const rx_entry *)b)->pat);
}

static pcre2_match_context *rx_mctx_new(void)
{
	pcre2_match_context *m = pcre2_match_context_create(NULL);
	if (!m) {
		fprintf(stderr, "stripedb: out of memory (pcre2 match context)\n");
		abort();
	}
	pcre2_set_match_limit(m, RX_MATCH_LIMIT);
	pcre2_set_depth_limit(m, RX_DEPTH_LIMIT);
	return m;
}

/* Does pat match s? On a PCRE2 error (the match or depth limit) records it in tl_rx_err and
 * answers false; the check then fails with that error. */
static bool regex_test(const char *pat, const char *s, size_t len)
{
	pcre2_code *re = NULL, *own = NULL;
	pcre2_match_context *mctx = NULL, *own_ctx = NULL;
	pcre2_match_data *md;
	int rc;

	if (tl_rx_err)
		return false; /* the check already failed: do not pay the limit again */
	if (tl_rx && tl_rx->n) {
		rx_entry key = {(char *)pat, NULL};
		const rx_entry *e = bsearch(&key, tl_rx->v, tl_rx->n, sizeof key, rx_entry_cmp);
		if (e)
			re = e->re;
		mctx = tl_rx->mctx;
	}
	if (!re)
		re = own = regex_compile(pat, NULL, 0);
	if (!re)
		return false;
	if (!mctx)
		mctx = own_ctx = rx_mctx_new();
	md = pcre2_match_data_create_from_pattern(re, NULL);
	if (!md) {
		fprintf(stderr, "stripedb: out of memory (pcre2 match data)\n");
		abort();
	}
	rc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, md, mctx);
	pcre2_match_data_free(md);
	if (own)
		pcre2_code_free(own);
	if (own_ctx)
		pcre2_match_context_free(own_ctx);
	if ((rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
	     rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_NOMEMORY) &&
	    !tl_rx_err)
		tl_rx_err = rc;
	return rc >= 0;
}

static void rx_add(rx_cache *c, const char *pat)
{
	pcre2_code *re;

	re = regex_compile(pat, NULL, 0);
	if (!re)
		return; /* refused when parsed; a value that merely looks like one is ignored */
	if (c->n == c->cap) {
		c->cap = c->cap ? c->cap * 2 : 8;
		c->v = sdb_realloc(c->v, c->cap * sizeof *c->v);
	}
	c->v[c->n].pat = sdb_strdup(pat);
	c->v[c->n].re = re;
	c->n++;
}

/* Collect every `pattern` string and `patternProperties` key of doc (recursively: the
 * schema may nest anywhere under the validator's clauses). Over-collecting (a field named
 * pattern inside an enum value) only costs a compile. */
static void rx_collect(rx_cache *c, const bson_t *doc, int depth)
{
	bson_iter_t it, p;
	bson_t sub;

	if (depth > 200 || !bson_iter_init(&it, doc))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "pattern") == 0 && BSON_ITER_HOLDS_UTF8(&it))
			rx_add(c, bson_iter_utf8(&it, NULL));
		if (strcmp(k, "patternProperties") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it) &&
		    bson_iter_recurse(&it, &p))
			while (bson_iter_next(&p))
				rx_add(c, bson_iter_key(&p));
		if (sub_static(&it, &sub))
			rx_collect(c, &sub, depth + 1);
	}
}

static void rx_cache_build(rx_cache *c, const bson_t *validator)
{
	size_t i, j;

	rx_collect(c, validator, 0);
	sdb_qsort(c->v, c->n, sizeof *c->v, rx_entry_cmp);
	for (i = 0, j = 0; i < c->n; i++) {
		if (j && strcmp(c->v[j - 1].pat, c->v[i].pat) == 0) {
			free(c->v[i].pat);
			pcre2_code_free(c->v[i].re);
			continue;
		}
		c->v[j++] = c->v[i];
	}
	c->n = j;
	c->mctx = rx_mctx_new();
}

static void rx_cache_free(rx_cache *c)
{
	for (size_t i = 0; i < c->n; i++) {
		free(c->v[i].pat);
		pcre2_code_free(c->v[i].re);
	}
	free(c->v);
	if (c->mctx)
		pcre2_match_context_free(c->mctx);
	memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------------ multipleOf */

/* Is val a multiple of div (> 0)? As mongod's InternalSchemaFmodMatchExpression: the
 * Decimal128 remainder of val by div (each as numberDecimal(): a double rounded to 15
 * significant digits, integers and decimals exactly; storage/decimal.h) is 0, so
 * {multipleOf: 0.1} accepts 0.3; NaN and infinite values are not multiples. */
static bool multiple_of(const bson_iter_t *val, const bson_iter_t *div)
{
	bson_iter_t vi = *val, di = *div;
	bson_decimal128_t a, b, r;

	if (!sdb_dec_from_value(bson_iter_value(&vi), &a) ||
	    !sdb_dec_from_value(bson_iter_value(&di), &b))
		return false;
	r = sdb_dec_mod(a, b);
	return !sdb_dec_is_nan(r) && sdb_dec_is_zero(r);
}

/* ------------------------------------------------------------------ uniqueness */

typedef struct {
	bson_iter_t it;
	size_t idx;
} uitem;

static int uitem_cmp(const void *pa, const void *pb)
{
	const uitem *a = pa, *b = pb;
	int c = sdb_bson_cmp(&a->it, &b->it);
	if (c)
		return c;
	return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Does the array at *arr hold two equal values (MongoDB's comparison, sdb_bson_cmp, the
 * order of the indexes)? In n log n: sorted, then equal neighbours. With dup != NULL,
 * *dup is the first element (in array order) that has an equal one after it, as the
 * pairwise scan mongod's uniqueItems does reports. *n_out (when not NULL) receives the
 * count of elements. */
static bool array_has_duplicate(const bson_iter_t *arr, bson_iter_t *dup, size_t *n_out)
{
	bson_iter_t a;
	size_t n = 0, cap = 16, i, best = SIZE_MAX;
	uitem *v;
	bool found = false;

	if (n_out)
		*n_out = 0;
	if (!bson_iter_recurse(arr, &a))
		return false;
	v = sdb_malloc(cap * sizeof *v);
	while (bson_iter_next(&a)) {
		if (n == cap) {
			cap *= 2;
			v = sdb_realloc(v, cap * sizeof *v);
		}
		v[n].it = a;
		v[n].idx = n;
		n++;
	}
	if (n_out)
		*n_out = n;
	if (n > 1)
		sdb_qsort(v, n, sizeof *v, uitem_cmp);
	for (i = 1; i < n; i++) {
		if (sdb_bson_cmp(&v[i - 1].it, &v[i].it) != 0)
			continue;
		found = true;
		/* the run's first element has the smallest index of its run (ties by index) */
		size_t j = i - 1;
		while (j > 0 && sdb_bson_cmp(&v[j - 1].it, &v[j].it) == 0)
			j--;
		if (v[j].idx < best) {
			best = v[j].idx;
			if (dup)
				*dup = v[j].it;
		}
		if (!dup)
			break;
		while (i + 1 < n && sdb_bson_cmp(&v[i].it, &v[i + 1].it) == 0)
			i++;
	}
	free(v);
	return found;
}

/* ------------------------------------------------------------------ $jsonSchema: types */

static const struct {
	const char *name;
	int code;
} bson_aliases[] = {
	{"double", 1},	    {"string", 2},     {"object", 3},	   {"array", 4},
	{"binData", 5},	    {"undefined", 6},  {"objectId", 7},	   {"bool", 8},
	{"date", 9},	    {"null", 10},      {"regex", 11},	   {"dbPointer", 12},
	{"javascript", 13}, {"symbol", 14},    {"javascriptWithScope", 15},
	{"int", 16},	    {"timestamp", 17}, {"long", 18},	   {"decimal", 19},
	{"minKey", 255},    {"maxKey", 127},
};

/* Does type t belong to the alias name (json: the `type` keyword's JSON aliases)? -1 when
 * the alias is unknown. */
static int alias_has(const char *name, bool json, bson_type_t t)
{
	if (json) {
		if (strcmp(name, "object") == 0)
			return t == BSON_TYPE_DOCUMENT;
		if (strcmp(name, "array") == 0)
			return t == BSON_TYPE_ARRAY;
		if (strcmp(name, "number") == 0)
			return is_num(t);
		if (strcmp(name, "boolean") == 0)
			return t == BSON_TYPE_BOOL;
		if (strcmp(name, "string") == 0)
			return t == BSON_TYPE_UTF8;
		if (strcmp(name, "null") == 0)
			return t == BSON_TYPE_NULL;
		return -1;
	}
	if (strcmp(name, "number") == 0)
		return is_num(t);
	for (size_t i = 0; i < sizeof bson_aliases / sizeof bson_aliases[0]; i++)
		if (strcmp(name, bson_aliases[i].name) == 0)
			return (int)t == bson_aliases[i].code;
	return -1;
}

static bool type_ok(const bson_iter_t *spec, bool json, bson_type_t t)
{
	bson_iter_t a;

	if (BSON_ITER_HOLDS_UTF8(spec))
		return alias_has(bson_iter_utf8(spec, NULL), json, t) == 1;
	if (!bson_iter_recurse(spec, &a))
		return false;
	while (bson_iter_next(&a))
		if (BSON_ITER_HOLDS_UTF8(&a) && alias_has(bson_iter_utf8(&a, NULL), json, t) == 1)
			return true;
	return false;
}

/* ------------------------------------------------------------------ $jsonSchema: parse check */

static int js_check(const bson_t *schema, int depth, int *code, char *err, size_t errlen);

static int check_type_spec(const bson_iter_t *it, bool json, int *code, char *err,
			   size_t errlen)
{
	const char *kw = bson_iter_key(it);
	bson_iter_t a;
	int n = 0;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		const char *s = bson_iter_utf8(it, NULL);
		if (strcmp(s, "integer") == 0)
			return failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "$jsonSchema type 'integer' is not currently supported.");
		if (alias_has(s, json, BSON_TYPE_EOD) < 0)
			return failf(code, C_BAD_VALUE, err, errlen, "Unknown type name alias: %s",
				     s);
		return 0;
	}
	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be either a string or an array of "
			     "strings",
			     kw);
	while (bson_iter_next(&a)) {
		if (!BSON_ITER_HOLDS_UTF8(&a))
			return failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' array elements must be strings", kw);
		const char *s = bson_iter_utf8(&a, NULL);
		if (strcmp(s, "integer") == 0)
			return failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "$jsonSchema type 'integer' is not currently supported.");
		if (alias_has(s, json, BSON_TYPE_EOD) < 0)
			return failf(code, C_BAD_VALUE, err, errlen, "Unknown type name alias: %s",
				     s);
		n++;
	}
	if (n == 0)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' must name at least one type", kw);
	return 0;
}

static int check_len(const bson_iter_t *it, int *code, char *err, size_t errlen)
{
	if (!is_num(bson_iter_type(it)))
		return failf(code, C_FAILED_TO_PARSE, err, errlen, "Expected a number in: %s",
			     bson_iter_key(it));
	double d = num_of(it);
	if (d < 0)
		return failf(code, C_BAD_VALUE, err, errlen, "Expected a positive number in: %s",
			     bson_iter_key(it));
	if (d != floor(d))
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "Expected an integer in: %s", bson_iter_key(it));
	return 0;
}

static int check_nested(const bson_iter_t *it, const char *what, int depth, int *code,
			char *err, size_t errlen)
{
	bson_t sub;

	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !sub_static(it, &sub))
		return failf(code, C_TYPE_MISMATCH, err, errlen, "%s must be an object", what);
	return js_check(&sub, depth + 1, code, err, errlen);
}

static int check_schema_list(const bson_iter_t *it, int depth, int *code, char *err,
			     size_t errlen)
{
	const char *kw = bson_iter_key(it);
	bson_iter_t a;
	int n = 0, rc;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be an array", kw);
	while (bson_iter_next(&a)) {
		char what[96];
		n++;
		if (!BSON_ITER_HOLDS_DOCUMENT(&a))
			return failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' must be an array of objects, but "
				     "found an element of type %s",
				     kw, sdb_bson_type_name(bson_iter_type(&a)));
		snprintf(what, sizeof what, "$jsonSchema keyword '%s'", kw);
		if ((rc = check_nested(&a, what, depth, code, err, errlen)) != 0)
			return rc;
	}
	if (n == 0)
		return failf(code, C_BAD_VALUE, err, errlen,
			     "$jsonSchema keyword '%s' must be a non-empty array", kw);
	return 0;
}

static int check_unique_array(const bson_iter_t *it, const char *kw, bool strings, int *code,
			      char *err, size_t errlen)
{
	bson_iter_t a;
	size_t n = 0;
	bool dup;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be an array", kw);
	while (bson_iter_next(&a))
		if (strings && !BSON_ITER_HOLDS_UTF8(&a))
			return failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' must contain only strings", kw);
	dup = array_has_duplicate(it, NULL, &n);
	if (dup)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' array cannot contain duplicate values", kw);
	if (n == 0)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' cannot be an empty array", kw);
	return 0;
}

static int check_regex(const char *pat, int *code, char *err, size_t errlen)
{
	char msg[256];
	pcre2_code *re = regex_compile(pat, msg, sizeof msg);

	if (!re)
		return failf(code, C_REGEX_INVALID, err, errlen,
			     "Regular expression is invalid: %s", msg);
	pcre2_code_free(re);
	return 0;
}

static int js_check(const bson_t *schema, int depth, int *code, char *err, size_t errlen)
{
	static const char *const unsupported[] = {"$ref", "$schema", "default", "definitions",
						  "format", "id"};
	bson_iter_t it, a;
	bool have_type = false, have_bson_type = false, have_min = false, have_max = false;
	bool have_xmin = false, have_xmax = false;
	int rc;

	if (depth > 100)
		return failf(code, C_BAD_VALUE, err, errlen, "$jsonSchema nested too deeply");
	if (!bson_iter_init(&it, schema))
		return failf(code, C_BAD_VALUE, err, errlen, "invalid $jsonSchema");
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bson_type_t t = bson_iter_type(&it);
		for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
			if (strcmp(k, unsupported[i]) == 0)
				return failf(code, C_FAILED_TO_PARSE, err, errlen,
					     "$jsonSchema keyword '%s' is not currently supported",
					     k);
		if (strcmp(k, "type") == 0 || strcmp(k, "bsonType") == 0) {
			bool json = k[0] == 't';
			if (json)
				have_type = true;
			else
				have_bson_type = true;
			if ((rc = check_type_spec(&it, json, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "title") == 0 || strcmp(k, "description") == 0) {
			if (t != BSON_TYPE_UTF8)
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be of type string", k);
		} else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0 ||
			   strcmp(k, "multipleOf") == 0) {
			if (!is_num(t))
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be a number", k);
			if (k[1] == 'u' && num_of(&it) <= 0)
				return failf(code, C_FAILED_TO_PARSE, err, errlen,
					     "$jsonSchema keyword 'multipleOf' must have a "
					     "positive value");
			if (strcmp(k, "minimum") == 0)
				have_min = true;
			if (strcmp(k, "maximum") == 0)
				have_max = true;
		} else if (strcmp(k, "exclusiveMinimum") == 0 ||
			   strcmp(k, "exclusiveMaximum") == 0 || strcmp(k, "uniqueItems") == 0) {
			if (t != BSON_TYPE_BOOL)
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be a boolean", k);
			if (strcmp(k, "exclusiveMinimum") == 0)
				have_xmin = true;
			if (strcmp(k, "exclusiveMaximum") == 0)
				have_xmax = true;
		} else if (strcmp(k, "minLength") == 0 || strcmp(k, "maxLength") == 0 ||
			   strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0 ||
			   strcmp(k, "minProperties") == 0 || strcmp(k, "maxProperties") == 0) {
			if ((rc = check_len(&it, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "pattern") == 0) {
			if (t != BSON_TYPE_UTF8)
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'pattern' must be a string");
			if ((rc = check_regex(bson_iter_utf8(&it, NULL), code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "required") == 0) {
			if ((rc = check_unique_array(&it, k, true, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "enum") == 0) {
			if ((rc = check_unique_array(&it, k, false, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 ||
			   strcmp(k, "oneOf") == 0) {
			if ((rc = check_schema_list(&it, depth, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "not") == 0) {
			if ((rc = check_nested(&it, "$jsonSchema keyword 'not'", depth, code, err,
					       errlen)) != 0)
				return rc;
		} else if (strcmp(k, "properties") == 0 || strcmp(k, "patternProperties") == 0) {
			if (t != BSON_TYPE_DOCUMENT || !bson_iter_recurse(&it, &a))
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be an object", k);
			while (bson_iter_next(&a)) {
				char what[320];
				snprintf(what, sizeof what,
					 "Nested schema for $jsonSchema property '%s'",
					 bson_iter_key(&a));
				if (k[0] == 'p' && k[1] == 'a' &&
				    (rc = check_regex(bson_iter_key(&a), code, err, errlen)) != 0)
					return rc;
				if ((rc = check_nested(&a, what, depth, code, err, errlen)) != 0)
					return rc;
			}
		} else if (strcmp(k, "additionalProperties") == 0 ||
			   strcmp(k, "additionalItems") == 0) {
			if (t == BSON_TYPE_BOOL)
				continue;
			if (t != BSON_TYPE_DOCUMENT)
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be either an object or "
					     "a boolean, but got a %s",
					     k, sdb_bson_type_name(t));
			char what[96];
			snprintf(what, sizeof what, "$jsonSchema keyword '%s'", k);
			if ((rc = check_nested(&it, what, depth, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "items") == 0) {
			if (t == BSON_TYPE_DOCUMENT) {
				if ((rc = check_nested(&it, "$jsonSchema keyword 'items'", depth,
						       code, err, errlen)) != 0)
					return rc;
			} else if (t == BSON_TYPE_ARRAY) {
				bson_iter_recurse(&it, &a);
				while (bson_iter_next(&a)) {
					if (!BSON_ITER_HOLDS_DOCUMENT(&a))
						return failf(code, C_TYPE_MISMATCH, err, errlen,
							     "$jsonSchema keyword 'items' requires "
							     "that each element of the array is an "
							     "object, but found a %s",
							     sdb_bson_type_name(bson_iter_type(&a)));
					if ((rc = check_nested(&a, "$jsonSchema keyword 'items'",
							       depth, code, err, errlen)) != 0)
						return rc;
				}
			} else {
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'items' must be an array or an "
					     "object, not %s",
					     sdb_bson_type_name(t));
			}
		} else if (strcmp(k, "dependencies") == 0) {
			if (t != BSON_TYPE_DOCUMENT || !bson_iter_recurse(&it, &a))
				return failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'dependencies' must be an object");
			while (bson_iter_next(&a)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&a)) {
					if ((rc = check_nested(&a, "Nested schema for $jsonSchema "
								   "dependent field",
							       depth, code, err, errlen)) != 0)
						return rc;
				} else if (BSON_ITER_HOLDS_ARRAY(&a)) {
					if ((rc = check_unique_array(&a, "dependencies", true, code,
								     err, errlen)) != 0)
						return rc;
				} else {
					return failf(code, C_TYPE_MISMATCH, err, errlen,
						     "property '%s' in $jsonSchema keyword "
						     "'dependencies' must be either an object or an "
						     "array",
						     bson_iter_key(&a));
				}
			}
		} else {
			return failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "Unknown $jsonSchema keyword: %s", k);
		}
	}
	if (have_type && have_bson_type)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "Cannot specify both $jsonSchema keywords 'type' and 'bsonType'");
	if (have_xmin && !have_min)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword 'minimum' must be a present if exclusiveMinimum "
			     "is present");
	if (have_xmax && !have_max)
		return failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword 'maximum' must be a present if exclusiveMaximum "
			     "is present");
	return 0;
}

/* ------------------------------------------------------------------ $jsonSchema: evaluation */

/* Failing rules are appended to an array being built (rules, its next index *n); rules NULL
 * when only the verdict is wanted. */
typedef struct rules {
	bson_t *arr;
	uint32_t n;
} rules;

static bool js_eval(const bson_t *schema, const bson_iter_t *val, bool top, rules *out);

static void rule_begin(rules *r, bson_t *rule, const char *op)
{
	char key[16];

	snprintf(key, sizeof key, "%u", r->n++);
	BSON_APPEND_DOCUMENT_BEGIN(r->arr, key, rule);
	BSON_APPEND_UTF8(rule, "operatorName", op);
}

static void spec_as(bson_t *rule, const bson_iter_t *kw)
{
	bson_t s;

	BSON_APPEND_DOCUMENT_BEGIN(rule, "specifiedAs", &s);
	bson_append_iter(&s, bson_iter_key(kw), -1, kw);
	bson_append_document_end(rule, &s);
}

/* A leaf rule: {operatorName: kw, specifiedAs: {kw: spec}, reason, consideredValue}. */
static void leaf_rule(rules *r, const bson_iter_t *kw, const char *reason,
		      const bson_iter_t *val, bool with_type)
{
	bson_t rule;

	if (!r)
		return;
	rule_begin(r, &rule, bson_iter_key(kw));
	spec_as(&rule, kw);
	BSON_APPEND_UTF8(&rule, "reason", reason);
	if (val) {
		bson_append_iter(&rule, "consideredValue", -1, val);
		if (with_type)
			BSON_APPEND_UTF8(&rule, "consideredType",
					 sdb_bson_type_name(bson_iter_type(val)));
	}
	bson_append_document_end(r->arr, &rule);
}

/* Evaluate the sub-schema held by it on val; with r, the sub-schema's failing rules go
 * into a "details" array of parent. */
static bool sub_eval(const bson_iter_t *sch, const bson_iter_t *val, bson_t *parent,
		     const char *field)
{
	bson_t sub, arr;
	rules rr;
	bool ok;

	if (!sub_static(sch, &sub))
		return true;
	if (!parent)
		return js_eval(&sub, val, false, NULL);
	BSON_APPEND_ARRAY_BEGIN(parent, field, &arr);
	rr.arr = &arr;
	rr.n = 0;
	ok = js_eval(&sub, val, false, &rr);
	bson_append_array_end(parent, &arr);
	return ok;
}

/* A sub-schema's title and description (sch: its element), appended to an entry that
 * reports it (mongod's appendSchemaAnnotations). */
static void annotations(const bson_iter_t *sch, bson_t *entry)
{
	bson_t sub;
	bson_iter_t d;

	if (!sub_static(sch, &sub))
		return;
	if (bson_iter_init_find(&d, &sub, "title"))
		bson_append_iter(entry, "title", -1, &d);
	if (bson_iter_init_find(&d, &sub, "description"))
		bson_append_iter(entry, "description", -1, &d);
}

static bool has_field(const bson_iter_t *obj, const char *name)
{
	bson_iter_t c;

	return bson_iter_recurse(obj, &c) && bson_iter_find(&c, name);
}

/* Is name a property listed in properties or matched by a patternProperties regex? */
static bool prop_known(const bson_t *schema, const char *name)
{
	bson_iter_t it, p;

	if (bson_iter_init_find(&it, schema, "properties") && bson_iter_recurse(&it, &p) &&
	    bson_iter_find(&p, name))
		return true;
	if (bson_iter_init_find(&it, schema, "patternProperties") && bson_iter_recurse(&it, &p))
		while (bson_iter_next(&p))
			if (regex_test(bson_iter_key(&p), name, strlen(name)))
				return true;
	return false;
}

static size_t utf8_len(const char *s, size_t n)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++)
		if (((unsigned char)s[i] & 0xc0) != 0x80)
			c++;
	return c;
}

/* One schema on one value (top: the document itself). Returns true when satisfied; with
 * out, appends the failing rules. */
static bool js_eval(const bson_t *schema, const bson_iter_t *val, bool top, rules *out)
{
	bson_iter_t kw, a, b;
	bson_type_t t = bson_iter_type(val);
	bool all = true;
	bool is_obj = t == BSON_TYPE_DOCUMENT, is_arr = t == BSON_TYPE_ARRAY;
	bson_t rule;

	if (!bson_iter_init(&kw, schema))
		return true;
	while (bson_iter_next(&kw)) {
		const char *k = bson_iter_key(&kw);
		bool ok = true;

		if (strcmp(k, "type") == 0 || strcmp(k, "bsonType") == 0) {
			ok = type_ok(&kw, k[0] == 't', t);
			if (!ok)
				leaf_rule(out, &kw, "type did not match", val, true);
		} else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0) {
			if (top || !is_num(t))
				continue;
			bool excl = false, mx = k[1] == 'a';
			if (bson_iter_init_find(&a, schema,
						mx ? "exclusiveMaximum" : "exclusiveMinimum"))
				excl = bson_iter_as_bool(&a);
			int c = sdb_bson_value_cmp(bson_iter_value((bson_iter_t *)val),
						   bson_iter_value(&kw));
			ok = mx ? (excl ? c < 0 : c <= 0) : (excl ? c > 0 : c >= 0);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				bson_t s;
				BSON_APPEND_DOCUMENT_BEGIN(&rule, "specifiedAs", &s);
				bson_append_iter(&s, k, -1, &kw);
				if (excl)
					bson_append_iter(&s, bson_iter_key(&a), -1, &a);
				bson_append_document_end(&rule, &s);
				BSON_APPEND_UTF8(&rule, "reason", "comparison failed");
				bson_append_iter(&rule, "consideredValue", -1, val);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "multipleOf") == 0) {
			if (top || !is_num(t))
				continue;
			ok = multiple_of(val, &kw);
			if (!ok)
				leaf_rule(out, &kw,
					  "considered value is not a multiple of the specified "
					  "value",
					  val, false);
		} else if (strcmp(k, "minLength") == 0 || strcmp(k, "maxLength") == 0) {
			if (top || t != BSON_TYPE_UTF8)
				continue;
			uint32_t len;
			const char *s = bson_iter_utf8(val, &len);
			double n = (double)utf8_len(s, len), lim = num_of(&kw);
			ok = k[1] == 'i' ? n >= lim : n <= lim;
			if (!ok)
				leaf_rule(out, &kw, "specified string length was not satisfied", val,
					  false);
		} else if (strcmp(k, "pattern") == 0) {
			if (top || t != BSON_TYPE_UTF8)
				continue;
			uint32_t len;
			const char *s = bson_iter_utf8(val, &len);
			ok = regex_test(bson_iter_utf8(&kw, NULL), s, len);
			if (!ok)
				leaf_rule(out, &kw, "regular expression did not match", val, false);
		} else if (strcmp(k, "enum") == 0) {
			ok = false;
			if (bson_iter_recurse(&kw, &a))
				while (!ok && bson_iter_next(&a))
					ok = sdb_bson_iter_eq(&a, val);
			if (!ok)
				leaf_rule(out, &kw, "value was not found in enum", val, false);
		} else if (strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0) {
			if (!is_arr)
				continue;
			double n = 0, lim = num_of(&kw);
			if (bson_iter_recurse(val, &a))
				while (bson_iter_next(&a))
					n++;
			ok = k[1] == 'i' ? n >= lim : n <= lim;
			if (!ok)
				leaf_rule(out, &kw, "array did not match specified length", val,
					  false);
		} else if (strcmp(k, "uniqueItems") == 0) {
			if (!is_arr || !bson_iter_as_bool(&kw))
				continue;
			ok = !array_has_duplicate(val, &a, NULL);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason", "found a duplicate item");
				bson_append_iter(&rule, "consideredValue", -1, val);
				bson_append_iter(&rule, "duplicatedValue", -1, &a);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "minProperties") == 0 || strcmp(k, "maxProperties") == 0) {
			if (!is_obj)
				continue;
			double n = 0, lim = num_of(&kw);
			if (bson_iter_recurse(val, &a))
				while (bson_iter_next(&a))
					n++;
			ok = k[1] == 'i' ? n >= lim : n <= lim;
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason",
						 "specified number of properties was not satisfied");
				BSON_APPEND_INT32(&rule, "numberOfProperties", (int32_t)n);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "required") == 0) {
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			bson_t miss = BSON_INITIALIZER;
			uint32_t nm = 0;
			while (bson_iter_next(&a)) {
				const char *p = bson_iter_utf8(&a, NULL);
				if (!has_field(val, p)) {
					char key[16];
					snprintf(key, sizeof key, "%u", nm++);
					BSON_APPEND_UTF8(&miss, key, p);
				}
			}
			ok = nm == 0;
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_ARRAY(&rule, "missingProperties", &miss);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&miss);
		} else if (strcmp(k, "properties") == 0 || strcmp(k, "patternProperties") == 0) {
			bool pattern = k[1] == 'a';
			bson_t pns, arr;
			uint32_t np = 0;
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			bson_init(&pns);
			while (bson_iter_next(&a)) {
				bson_iter_t f;
				if (!bson_iter_recurse(val, &f))
					break;
				while (bson_iter_next(&f)) {
					const char *fname = bson_iter_key(&f);
					if (pattern ? !regex_test(bson_iter_key(&a), fname,
								  strlen(fname))
						    : strcmp(fname, bson_iter_key(&a)) != 0)
						continue;
					if (sub_eval(&a, &f, NULL, NULL))
						continue;
					ok = false;
					if (out) {
						bson_t e;
						char key[16];
						snprintf(key, sizeof key, "%u", np++);
						BSON_APPEND_DOCUMENT_BEGIN(&pns, key, &e);
						BSON_APPEND_UTF8(&e, "propertyName", fname);
						annotations(&a, &e);
						if (pattern)
							BSON_APPEND_UTF8(&e, "regexMatched",
									 bson_iter_key(&a));
						sub_eval(&a, &f, &e, "details");
						bson_append_document_end(&pns, &e);
					}
				}
			}
			if (!ok && out) {
				rule_begin(out, &rule, k);
				BSON_APPEND_ARRAY_BEGIN(&rule, "propertiesNotSatisfied", &arr);
				bson_concat(&arr, &pns);
				bson_append_array_end(&rule, &arr);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&pns);
		} else if (strcmp(k, "additionalProperties") == 0) {
			bson_iter_t f;
			bson_t extra = BSON_INITIALIZER;
			uint32_t ne = 0;
			if (!is_obj || !bson_iter_recurse(val, &f))
				continue;
			while (bson_iter_next(&f)) {
				const char *fname = bson_iter_key(&f);
				if (prop_known(schema, fname))
					continue;
				bool fine = BSON_ITER_HOLDS_BOOL(&kw) ? bson_iter_bool(&kw)
								      : sub_eval(&kw, &f, NULL, NULL);
				if (fine)
					continue;
				ok = false;
				if (!out)
					break;
				if (BSON_ITER_HOLDS_BOOL(&kw)) {
					char key[16];
					snprintf(key, sizeof key, "%u", ne++);
					BSON_APPEND_UTF8(&extra, key, fname);
				} else if (ne++ == 0) {
					rule_begin(out, &rule, k);
					BSON_APPEND_UTF8(&rule, "reason",
							 "at least one additional property did not "
							 "match the subschema");
					BSON_APPEND_UTF8(&rule, "failingProperty", fname);
					sub_eval(&kw, &f, &rule, "details");
					bson_append_document_end(out->arr, &rule);
				}
			}
			if (!ok && out && BSON_ITER_HOLDS_BOOL(&kw)) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_ARRAY(&rule, "additionalProperties", &extra);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&extra);
		} else if (strcmp(k, "dependencies") == 0) {
			bson_t fails = BSON_INITIALIZER;
			uint32_t nf = 0;
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			while (bson_iter_next(&a)) {
				const char *dep = bson_iter_key(&a);
				if (!has_field(val, dep))
					continue;
				char key[16];
				bson_t e;
				if (BSON_ITER_HOLDS_ARRAY(&a)) {
					bson_t miss = BSON_INITIALIZER;
					uint32_t nm = 0;
					bson_iter_recurse(&a, &b);
					while (bson_iter_next(&b)) {
						const char *p = bson_iter_utf8(&b, NULL);
						if (!has_field(val, p)) {
							char mk[16];
							snprintf(mk, sizeof mk, "%u", nm++);
							BSON_APPEND_UTF8(&miss, mk, p);
						}
					}
					if (nm > 0) {
						ok = false;
						snprintf(key, sizeof key, "%u", nf++);
						BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
						BSON_APPEND_UTF8(&e, "conditionalProperty", dep);
						BSON_APPEND_ARRAY(&e, "missingProperties", &miss);
						bson_append_document_end(&fails, &e);
					}
					bson_destroy(&miss);
				} else if (!sub_eval(&a, val, NULL, NULL)) {
					ok = false;
					snprintf(key, sizeof key, "%u", nf++);
					BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
					BSON_APPEND_UTF8(&e, "conditionalProperty", dep);
					sub_eval(&a, val, &e, "details");
					bson_append_document_end(&fails, &e);
				}
			}
			if (!ok && out) {
				rule_begin(out, &rule, k);
				BSON_APPEND_ARRAY(&rule, "failingDependencies", &fails);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&fails);
		} else if (strcmp(k, "items") == 0) {
			if (!is_arr || !bson_iter_recurse(val, &a))
				continue;
			if (BSON_ITER_HOLDS_DOCUMENT(&kw)) {
				int32_t i = 0;
				while (bson_iter_next(&a)) {
					if (!sub_eval(&kw, &a, NULL, NULL)) {
						ok = false;
						if (out) {
							rule_begin(out, &rule, k);
							BSON_APPEND_UTF8(&rule, "reason",
									 "At least one item did not "
									 "match the sub-schema");
							BSON_APPEND_INT32(&rule, "itemIndex", i);
							sub_eval(&kw, &a, &rule, "details");
							bson_append_document_end(out->arr, &rule);
						}
						break;
					}
					i++;
				}
			} else {
				int32_t i = 0;
				bson_iter_recurse(&kw, &b);
				while (bson_iter_next(&b) && bson_iter_next(&a)) {
					if (!sub_eval(&b, &a, NULL, NULL)) {
						ok = false;
						if (out) {
							rule_begin(out, &rule, k);
							BSON_APPEND_UTF8(&rule, "reason",
									 "An array item did not match "
									 "the specified subschema at "
									 "the same index");
							BSON_APPEND_INT32(&rule, "itemIndex", i);
							sub_eval(&b, &a, &rule, "details");
							bson_append_document_end(out->arr, &rule);
						}
						break;
					}
					i++;
				}
			}
		} else if (strcmp(k, "additionalItems") == 0) {
			bson_iter_t items;
			if (!is_arr || !bson_iter_init_find(&items, schema, "items") ||
			    !BSON_ITER_HOLDS_ARRAY(&items) || !bson_iter_recurse(val, &a))
				continue;
			int32_t nt = 0, i = 0;
			bson_iter_recurse(&items, &b);
			while (bson_iter_next(&b))
				nt++;
			while (bson_iter_next(&a)) {
				if (i++ < nt)
					continue;
				bool fine = BSON_ITER_HOLDS_BOOL(&kw) ? bson_iter_bool(&kw)
								      : sub_eval(&kw, &a, NULL, NULL);
				if (fine)
					continue;
				ok = false;
				if (out) {
					rule_begin(out, &rule, k);
					if (BSON_ITER_HOLDS_BOOL(&kw)) {
						spec_as(&rule, &kw);
						BSON_APPEND_UTF8(&rule, "reason",
								 "found additional items");
						bson_append_iter(&rule, "additionalItems", -1, val);
					} else {
						BSON_APPEND_UTF8(&rule, "reason",
								 "At least one additional item did "
								 "not match the sub-schema");
						BSON_APPEND_INT32(&rule, "itemIndex", i - 1);
						sub_eval(&kw, &a, &rule, "details");
					}
					bson_append_document_end(out->arr, &rule);
				}
				break;
			}
		} else if (strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 ||
			   strcmp(k, "oneOf") == 0) {
			int32_t i = 0, nmatch = 0;
			bson_t fails = BSON_INITIALIZER, matched = BSON_INITIALIZER;
			uint32_t nf = 0;
			bson_iter_recurse(&kw, &a);
			while (bson_iter_next(&a)) {
				char key[16];
				if (sub_eval(&a, val, NULL, NULL)) {
					snprintf(key, sizeof key, "%d", nmatch++);
					BSON_APPEND_INT32(&matched, key, i);
				} else if (out) {
					bson_t e;
					snprintf(key, sizeof key, "%u", nf++);
					BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
					BSON_APPEND_INT32(&e, "index", i);
					annotations(&a, &e);
					sub_eval(&a, val, &e, "details");
					bson_append_document_end(&fails, &e);
				}
				i++;
			}
			bool one = strcmp(k, "oneOf") == 0;
			if (strcmp(k, "allOf") == 0)
				ok = nmatch == i;
			else if (strcmp(k, "anyOf") == 0)
				ok = nmatch > 0;
			else
				ok = nmatch == 1;
			if (!ok && out) {
				rule_begin(out, &rule, k);
				if (one && nmatch > 1) {
					BSON_APPEND_UTF8(&rule, "reason",
							 "more than one subschema matched");
					BSON_APPEND_ARRAY(&rule, "matchingSchemaIndexes", &matched);
				} else {
					BSON_APPEND_ARRAY(&rule, "schemasNotSatisfied", &fails);
				}
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&fails);
			bson_destroy(&matched);
		} else if (strcmp(k, "not") == 0) {
			ok = !sub_eval(&kw, val, NULL, NULL);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason", "child expression matched");
				bson_append_document_end(out->arr, &rule);
			}
		}
		/* title, description, exclusive*: no rule of their own */
		if (!ok) {
			all = false;
			if (!out)
				return false;
		}
	}
	return all;
}

/* ------------------------------------------------------------------ clauses */

static void node_free(vnode *n)
{
	for (size_t i = 0; i < n->n; i++)
		node_free(&n->kid[i]);
	free(n->kid);
	if (n->spec)
		bson_destroy(n->spec);
	sdb_matcher_free(n->m);
	memset(n, 0, sizeof *n);
}

static int parse_filter(const bson_t *f, vnode *out, int depth, int *code, char *err,
			size_t errlen);

/* One clause of a filter (it: its element) into n. */
static int parse_clause(const bson_iter_t *it, vnode *n, int depth, int *code, char *err,
			size_t errlen)
{
	const char *k = bson_iter_key(it);
	int rc;

	memset(n, 0, sizeof *n);
	if (strcmp(k, "$jsonSchema") == 0) {
		bson_t sub;
		if (!BSON_ITER_HOLDS_DOCUMENT(it) || !sub_static(it, &sub))
			return failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema must be an object");
		if ((rc = js_check(&sub, 0, code, err, errlen)) != 0)
			return rc;
		n->kind = N_SCHEMA;
		n->spec = iter_doc(it);
		return 0;
	}
	if (strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0 || strcmp(k, "$nor") == 0) {
		bson_iter_t a;
		size_t cnt = 0;
		if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
			return failf(code, C_BAD_VALUE, err, errlen, "%s must be an array", k);
		n->kind = k[1] == 'a' ? N_AND : k[1] == 'o' ? N_OR : N_NOR;
		while (bson_iter_next(&a)) {
			bson_t sub;
			if (!BSON_ITER_HOLDS_DOCUMENT(&a) || !sub_static(&a, &sub))
				return failf(code, C_BAD_VALUE, err, errlen,
					     "%s argument's entries must be objects", k);
			n->kid = sdb_realloc(n->kid, (cnt + 1) * sizeof *n->kid);
			n->n = ++cnt;
			if ((rc = parse_filter(&sub, &n->kid[cnt - 1], depth + 1, code, err,
					       errlen)) != 0)
				return rc;
		}
		if (cnt == 0)
			return failf(code, C_BAD_VALUE, err, errlen,
				     "%s argument must be a non-empty array", k);
		return 0;
	}
	n->kind = N_LEAF;
	n->spec = bson_new();
	bson_append_iter(n->spec, k, -1, it);
	return sdb_matcher_new_opts(n->spec, SDB_MATCHER_EXPR, &n->m, code, err, errlen);
}

/* A filter document: an AND of its clauses (a single clause stands alone). */
static int parse_filter(const bson_t *f, vnode *out, int depth, int *code, char *err,
			size_t errlen)
{
	bson_iter_t it;
	size_t cnt = 0;
	int rc;

	memset(out, 0, sizeof *out);
	out->kind = N_AND;
	if (depth > 100)
		return failf(code, C_BAD_VALUE, err, errlen, "validator nested too deeply");
	if (!bson_iter_init(&it, f))
		return failf(code, C_BAD_VALUE, err, errlen, "invalid validator");
	while (bson_iter_next(&it)) {
		out->kid = sdb_realloc(out->kid, (cnt + 1) * sizeof *out->kid);
		out->n = ++cnt;
		if ((rc = parse_clause(&it, &out->kid[cnt - 1], depth, code, err, errlen)) != 0)
			return rc;
	}
	return 0;
}

static const char *leaf_reason(const char *op, bool missing)
{
	static const struct {
		const char *op, *reason;
	} reasons[] = {
		{"$eq", "comparison failed"},
		{"$ne", "comparison succeeded"},
		{"$gt", "comparison failed"},
		{"$gte", "comparison failed"},
		{"$lt", "comparison failed"},
		{"$lte", "comparison failed"},
		{"$in", "no matching value found in array"},
		{"$nin", "matching value found in array"},
		{"$exists", "path does not exist"},
		{"$type", "type did not match"},
		{"$regex", "regular expression did not match"},
		{"$size", "array length was not equal to given size"},
		{"$all", "array did not contain all specified values"},
		{"$elemMatch", "array did not satisfy the child predicate"},
		{"$mod", "$mod did not evaluate to expected remainder"},
		{"$not", "child expression matched"},
	};

	if (strcmp(op, "$exists") == 0)
		return missing ? "path does not exist" : "path does exist";
	if (missing && strcmp(op, "$ne") != 0 && strcmp(op, "$nin") != 0 &&
	    strcmp(op, "$not") != 0)
		return "field was missing";
	for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
		if (strcmp(reasons[i].op, op) == 0)
			return reasons[i].reason;
	return "expression did not match";
}

/* The values a path reaches (storage/path.h, arrays along the path traversed, a leaf
 * array as one value), gathered for consideredValue(s): at most 10 (mongod's
 * kMaxConsideredValuesElements is larger; the details stay small). */
typedef struct considered {
	bson_t arr, types;
	uint32_t n;
} considered;

static bool consider(void *ctx, const bson_iter_t *it, unsigned flags)
{
	considered *c = ctx;
	char key[16];

	if (!it || (flags & SDB_PATH_MISSING))
		return false;
	snprintf(key, sizeof key, "%u", c->n++);
	bson_append_iter(&c->arr, key, -1, it);
	BSON_APPEND_UTF8(&c->types, key, sdb_bson_type_name(bson_iter_type(it)));
	return c->n >= 10;
}

/* Details of a leaf {field: {op: v}} / {field: v} that failed on doc: consideredValue (one
 * value) or consideredValues (several, through arrays), as mongod's generatePathError. */
static void leaf_one(bson_t *det, const char *field, const char *op, const bson_t *spec,
		     const bson_t *doc)
{
	considered c;
	bool type_op = strcmp(op, "$type") == 0;
	bson_iter_t it;

	bson_init(&c.arr);
	bson_init(&c.types);
	c.n = 0;
	sdb_path_walk(doc, field, 0, consider, &c);
	BSON_APPEND_UTF8(det, "operatorName", op);
	BSON_APPEND_DOCUMENT(det, "specifiedAs", spec);
	BSON_APPEND_UTF8(det, "reason", leaf_reason(op, c.n == 0));
	if (c.n == 1 && bson_iter_init(&it, &c.arr) && bson_iter_next(&it)) {
		bson_append_iter(det, "consideredValue", -1, &it);
		if (type_op)
			BSON_APPEND_UTF8(det, "consideredType",
					 sdb_bson_type_name(bson_iter_type(&it)));
	} else if (c.n > 1) {
		BSON_APPEND_ARRAY(det, "consideredValues", &c.arr);
		if (type_op)
			BSON_APPEND_ARRAY(det, "consideredTypes", &c.types);
	}
	bson_destroy(&c.arr);
	bson_destroy(&c.types);
}

static void leaf_details(const vnode *n, const bson_t *doc, bson_t *det)
{
	bson_iter_t it, ops;
	const char *field;

	bson_init(det);
	if (!bson_iter_init(&it, n->spec) || !bson_iter_next(&it))
		return;
	field = bson_iter_key(&it);
	if (field[0] == '$') {
		BSON_APPEND_UTF8(det, "operatorName", field);
		BSON_APPEND_DOCUMENT(det, "specifiedAs", n->spec);
		if (strcmp(field, "$expr") == 0) {
			BSON_APPEND_UTF8(det, "reason", "expression did not match");
			BSON_APPEND_BOOL(det, "expressionResult", false);
		} else {
			BSON_APPEND_UTF8(det, "reason", "expression did not match");
		}
		return;
	}
	bool opdoc = false, has_regex = false;
	size_t nops = 0;
	if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &ops)) {
		while (bson_iter_next(&ops)) {
			const char *o = bson_iter_key(&ops);
			if (o[0] != '$') {
				opdoc = false;
				break;
			}
			opdoc = true;
			nops++;
			if (strcmp(o, "$regex") == 0 || strcmp(o, "$options") == 0)
				has_regex = true;
		}
	}
	if (!opdoc) {
		leaf_one(det, field, "$eq", n->spec, doc);
		return;
	}
	if (nops == 1 || has_regex) {
		bson_iter_recurse(&it, &ops);
		bson_iter_next(&ops);
		leaf_one(det, field, has_regex ? "$regex" : bson_iter_key(&ops), n->spec, doc);
		return;
	}
	/* several operators on one path: an $and of those that fail */
	bson_t arr;
	uint32_t i = 0, nf = 0;
	BSON_APPEND_UTF8(det, "operatorName", "$and");
	BSON_APPEND_ARRAY_BEGIN(det, "clausesNotSatisfied", &arr);
	bson_iter_recurse(&it, &ops);
	while (bson_iter_next(&ops)) {
		bson_t one = BSON_INITIALIZER, inner;
		sdb_matcher *m = NULL;
		BSON_APPEND_DOCUMENT_BEGIN(&one, field, &inner);
		bson_append_iter(&inner, bson_iter_key(&ops), -1, &ops);
		bson_append_document_end(&one, &inner);
		char e2[256];
		int c2 = 0;
		if (sdb_matcher_new_opts(&one, SDB_MATCHER_EXPR, &m, &c2, e2, sizeof e2) == 0 &&
		    sdb_matcher_eval(m, doc, &c2, e2, sizeof e2) == 0) {
			char key[16];
			bson_t e, d;
			snprintf(key, sizeof key, "%u", nf++);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, key, &e);
			BSON_APPEND_INT32(&e, "index", (int32_t)i);
			BSON_APPEND_DOCUMENT_BEGIN(&e, "details", &d);
			leaf_one(&d, field, bson_iter_key(&ops), &one, doc);
			bson_append_document_end(&e, &d);
			bson_append_document_end(&arr, &e);
		}
		sdb_matcher_free(m);
		bson_destroy(&one);
		i++;
	}
	bson_append_array_end(det, &arr);
}

/* Evaluate n on doc: 1 / 0 (with det != NULL: *det initialised to the details) / error. */
static int node_eval(const vnode *n, const bson_t *doc, bson_t *det, int *code, char *err,
		     size_t errlen)
{
	switch (n->kind) {
	case N_LEAF: {
		int rc = sdb_matcher_eval(n->m, doc, code, err, errlen);
		if (rc == 0 && det)
			leaf_details(n, doc, det);
		return rc;
	}
	case N_SCHEMA: {
		bson_t wrap = BSON_INITIALIZER, arr;
		bson_iter_t it;
		rules r;
		bool ok;
		BSON_APPEND_DOCUMENT(&wrap, "d", doc);
		bson_iter_init_find(&it, &wrap, "d");
		if (!det) {
			ok = js_eval(n->spec, &it, true, NULL);
			bson_destroy(&wrap);
			return ok ? 1 : 0;
		}
		bson_init(det);
		BSON_APPEND_UTF8(det, "operatorName", "$jsonSchema");
		bson_iter_t m;
		if (bson_iter_init_find(&m, n->spec, "title"))
			bson_append_iter(det, "title", -1, &m);
		if (bson_iter_init_find(&m, n->spec, "description"))
			bson_append_iter(det, "description", -1, &m);
		BSON_APPEND_ARRAY_BEGIN(det, "schemaRulesNotSatisfied", &arr);
		r.arr = &arr;
		r.n = 0;
		ok = js_eval(n->spec, &it, true, &r);
		bson_append_array_end(det, &arr);
		bson_destroy(&wrap);
		if (ok)
			bson_destroy(det);
		return ok ? 1 : 0;
	}
	case N_AND:
	case N_OR:
	case N_NOR: {
		bson_t fails = BSON_INITIALIZER;
		uint32_t nf = 0;
		int verdict = n->kind == N_OR ? 0 : 1;
		for (size_t i = 0; i < n->n; i++) {
			bson_t kd;
			int rc = node_eval(&n->kid[i], doc, det ? &kd : NULL, code, err, errlen);
			if (rc < 0) {
				bson_destroy(&fails);
				return rc;
			}
			bool bad = n->kind == N_NOR ? rc == 1 : rc == 0;
			if (n->kind == N_OR && rc == 1) {
				verdict = 1;
				if (!det)
					break;
			}
			if (n->kind != N_OR && bad)
				verdict = 0;
			if (!det) {
				if (verdict == 0 && n->kind != N_OR)
					break;
				continue;
			}
			if (bad || (n->kind == N_OR && rc == 0)) {
				char key[16];
				bson_t e;
				snprintf(key, sizeof key, "%u", nf++);
				BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
				BSON_APPEND_INT32(&e, "index", (int32_t)i);
				if (n->kind == N_NOR) {
					bson_t d;
					BSON_APPEND_DOCUMENT_BEGIN(&e, "details", &d);
					BSON_APPEND_UTF8(&d, "reason", "child expression matched");
					bson_append_document_end(&e, &d);
				} else {
					BSON_APPEND_DOCUMENT(&e, "details", &kd);
				}
				bson_append_document_end(&fails, &e);
			}
			if (rc == 0 && det)
				bson_destroy(&kd);
		}
		if (verdict == 1 || !det) {
			bson_destroy(&fails);
			return verdict;
		}
		/* one clause of an implicit AND: its own details */
		if (n->kind == N_AND && n->n == 1) {
			bson_iter_t it, d;
			bson_init(det);
			if (bson_iter_init(&it, &fails) && bson_iter_next(&it) &&
			    bson_iter_recurse(&it, &d) && bson_iter_find(&d, "details")) {
				bson_t sub;
				if (sub_static(&d, &sub))
					bson_concat(det, &sub);
			}
			bson_destroy(&fails);
			return 0;
		}
		bson_init(det);
		BSON_APPEND_UTF8(det, "operatorName",
				 n->kind == N_AND ? "$and" : n->kind == N_OR ? "$or" : "$nor");
		BSON_APPEND_ARRAY(det, "clausesNotSatisfied", &fails);
		bson_destroy(&fails);
		return 0;
	}
	}
	return 1;
}

/* ------------------------------------------------------------------ API */

int sdb_validator_new(const bson_t *validator, sdb_validator **out, int *code, char *err,
		      size_t errlen)
{
	sdb_validator *v = sdb_calloc(1, sizeof *v);
	char msg[512];
	int c = C_BAD_VALUE;

	*out = NULL;
	if (parse_filter(validator, &v->root, 0, &c, msg, sizeof msg) != 0) {
		node_free(&v->root);
		free(v);
		if (code)
			*code = c;
		snprintf(err, errlen, "Parsing of collection validator failed :: caused by :: %s",
			 msg);
		return SDB_EINVAL;
	}
	rx_cache_build(&v->rx, validator);
	*out = v;
	return 0;
}

int sdb_validator_check(const sdb_validator *v, const bson_t *doc, bson_t *details, int *code,
			char *err, size_t errlen)
{
	const rx_cache *saved = tl_rx;
	int rc;

	tl_rx = &v->rx;
	tl_rx_err = 0;
	rc = node_eval(&v->root, doc, details, code, err, errlen);
	tl_rx = saved;
	if (tl_rx_err) {
		PCRE2_UCHAR m[128];
		pcre2_get_error_message(tl_rx_err, m, sizeof m);
		tl_rx_err = 0;
		if (rc == 0 && details)
			bson_destroy(details);
		if (code)
			*code = C_BAD_VALUE;
		snprintf(err, errlen,
			 "Regular expression of the collection validator could not be evaluated "
			 "on the document: %s (a $jsonSchema pattern or patternProperties key "
			 "backtracks too much)",
			 (char *)m);
		return SDB_ETOOBIG;
	}
	return rc;
}

void sdb_validator_free(sdb_validator *v)
{
	if (!v)
		return;
	node_free(&v->root);
	rx_cache_free(&v->rx);
	free(v);
}
