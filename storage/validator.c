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

#include "storage/validator_int.h"

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

int vd_failf(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (code)
		*code = c;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return SDB_EINVAL;
}

bson_t *vd_iter_doc(const bson_iter_t *it)
{
	uint32_t len;
	const uint8_t *data;

	if (BSON_ITER_HOLDS_DOCUMENT(it))
		bson_iter_document(it, &len, &data);
	else
		bson_iter_array(it, &len, &data);
	return bson_new_from_data(data, len);
}

bool vd_sub_static(const bson_iter_t *it, bson_t *out)
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

bool vd_is_num(bson_type_t t)
{
	return t == BSON_TYPE_INT32 || t == BSON_TYPE_INT64 || t == BSON_TYPE_DOUBLE ||
	       t == BSON_TYPE_DECIMAL128;
}

/* A number as a double (decimal128 through its string form: bson_iter_as_double gives 0
 * for it). */
double vd_num_of(const bson_iter_t *it)
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

pcre2_code *vd_regex_compile(const char *pat, char *msg, size_t msglen)
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
bool vd_regex_test(const char *pat, const char *s, size_t len)
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
		re = own = vd_regex_compile(pat, NULL, 0);
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

	re = vd_regex_compile(pat, NULL, 0);
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
		if (vd_sub_static(&it, &sub))
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
bool vd_multiple_of(const bson_iter_t *val, const bson_iter_t *div)
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
bool vd_array_has_duplicate(const bson_iter_t *arr, bson_iter_t *dup, size_t *n_out)
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
		if (!BSON_ITER_HOLDS_DOCUMENT(it) || !vd_sub_static(it, &sub))
			return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema must be an object");
		if ((rc = vd_js_check(&sub, 0, code, err, errlen)) != 0)
			return rc;
		n->kind = N_SCHEMA;
		n->spec = vd_iter_doc(it);
		return 0;
	}
	if (strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0 || strcmp(k, "$nor") == 0) {
		bson_iter_t a;
		size_t cnt = 0;
		if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
			return vd_failf(code, C_BAD_VALUE, err, errlen, "%s must be an array", k);
		n->kind = k[1] == 'a' ? N_AND : k[1] == 'o' ? N_OR : N_NOR;
		while (bson_iter_next(&a)) {
			bson_t sub;
			if (!BSON_ITER_HOLDS_DOCUMENT(&a) || !vd_sub_static(&a, &sub))
				return vd_failf(code, C_BAD_VALUE, err, errlen,
					     "%s argument's entries must be objects", k);
			n->kid = sdb_realloc(n->kid, (cnt + 1) * sizeof *n->kid);
			n->n = ++cnt;
			if ((rc = parse_filter(&sub, &n->kid[cnt - 1], depth + 1, code, err,
					       errlen)) != 0)
				return rc;
		}
		if (cnt == 0)
			return vd_failf(code, C_BAD_VALUE, err, errlen,
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
		return vd_failf(code, C_BAD_VALUE, err, errlen, "validator nested too deeply");
	if (!bson_iter_init(&it, f))
		return vd_failf(code, C_BAD_VALUE, err, errlen, "invalid validator");
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
			ok = vd_js_eval(n->spec, &it, true, NULL);
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
		ok = vd_js_eval(n->spec, &it, true, &r);
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
				if (vd_sub_static(&d, &sub))
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
