/* The aggregation pipeline engine (see pipeline.h).
 *
 * Stages are pulled: cursor_next asks the last stage for a document, which asks the
 * stage before it, down to the store's input iterator. Documents travel between stages
 * as heap bson_t (bson_new/bson_copy give libbson's 128-byte alignment). Expressions are
 * compiled once into a tree and evaluated into docbuild nodes (NULL meaning "missing").
 */
#include "storage/pipeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/bsonval.h"
#include "storage/docbuild.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"

#define C_INTERNAL 1
#define C_BAD_VALUE 2
#define C_TYPE_MISMATCH 14
#define C_FAILED_TO_PARSE 9
#define C_INVALID_OP 168
#define C_NOT_IMPLEMENTED 238
#define C_MEMORY 292

/* ---- errors ------------------------------------------------------------------------ */

typedef struct {
	int *code;
	char *err;
	size_t errlen;
} ectx;

static int efail(const ectx *e, int c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int efail(const ectx *e, int c, const char *fmt, ...)
{
	va_list ap;

	if (e->code != NULL) {
		*e->code = c;
	}
	if (e->err != NULL && e->errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(e->err, e->errlen, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
}

static const char *type_name(bson_type_t t)
{
	return sdb_bson_type_name(t);
}

static bson_type_t ntype(const docbuild_node *n)
{
	return n == NULL ? BSON_TYPE_EOD : n->type;
}

/* ---- values -------------------------------------------------------------------------- */

static docbuild_node *v_scalar(const bson_value_t *v)
{
	return docbuild_from_value(v, NULL);
}

static docbuild_node *v_null(void)
{
	return docbuild_new_null(NULL);
}

static docbuild_node *v_bool(bool b)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_BOOL;
	v.value.v_bool = b;
	return v_scalar(&v);
}

static docbuild_node *v_int32(int32_t i)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_INT32;
	v.value.v_int32 = i;
	return v_scalar(&v);
}

static docbuild_node *v_int64(int64_t i)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_INT64;
	v.value.v_int64 = i;
	return v_scalar(&v);
}

static docbuild_node *v_double(double d)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_DOUBLE;
	v.value.v_double = d;
	return v_scalar(&v);
}

static docbuild_node *v_date(int64_t ms)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_DATE_TIME;
	v.value.v_datetime = ms;
	return v_scalar(&v);
}

static docbuild_node *v_string(const char *s, size_t len)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_UTF8;
	v.value.v_utf8.str = (char *)s;
	v.value.v_utf8.len = (uint32_t)len;
	return v_scalar(&v);
}

static bool is_nullish(const docbuild_node *n)
{
	return n == NULL || n->type == BSON_TYPE_NULL || n->type == BSON_TYPE_UNDEFINED;
}

static bool is_number(const docbuild_node *n)
{
	return n != NULL && (n->type == BSON_TYPE_INT32 || n->type == BSON_TYPE_INT64 ||
			     n->type == BSON_TYPE_DOUBLE || n->type == BSON_TYPE_DECIMAL128);
}

static double num_double(const docbuild_node *n)
{
	switch (n->type) {
	case BSON_TYPE_INT32: return n->value.value.v_int32;
	case BSON_TYPE_INT64: return (double)n->value.value.v_int64;
	case BSON_TYPE_DOUBLE: return n->value.value.v_double;
	case BSON_TYPE_DECIMAL128: {
		char s[BSON_DECIMAL128_STRING];

		bson_decimal128_to_string(&n->value.value.v_decimal128, s);
		return strtod(s, NULL);
	}
	default: return 0;
	}
}

/* Aggregation truthiness: false, null, undefined, missing and 0 are false. */
static bool truthy(const docbuild_node *n)
{
	if (is_nullish(n)) {
		return false;
	}
	if (n->type == BSON_TYPE_BOOL) {
		return n->value.value.v_bool;
	}
	if (is_number(n)) {
		return num_double(n) != 0;
	}
	return true;
}

/* Compare in MongoDB order; missing sorts below everything (aggregation semantics). */
static int vcmp(const docbuild_node *a, const docbuild_node *b)
{
	bson_t sa, sb;
	bson_value_t va, vb;
	int r;

	if (a == NULL || b == NULL) {
		return (a != NULL) - (b != NULL);
	}
	docbuild_value(a, &sa, &va);
	docbuild_value(b, &sb, &vb);
	r = sdb_bson_value_cmp(&va, &vb);
	bson_destroy(&sa);
	bson_destroy(&sb);
	return r;
}

static size_t node_size(const docbuild_node *n)
{
	size_t s = sizeof *n + 16;

	if (n->type == BSON_TYPE_DOCUMENT || n->type == BSON_TYPE_ARRAY) {
		for (size_t i = 0; i < n->n; i++) {
			s += node_size(n->kids[i]);
		}
	} else if (n->type == BSON_TYPE_UTF8) {
		s += n->value.value.v_utf8.len;
	} else if (n->type == BSON_TYPE_BINARY) {
		s += n->value.value.v_binary.data_len;
	}
	return s;
}

/* ---- expressions ------------------------------------------------------------------- */

typedef enum {
	X_LIT = 0,
	X_PATH, /* "$a.b" (path), "$$ROOT"/"$$CURRENT" (path NULL) */
	X_OBJ,
	X_ARR,
	X_OP,
	X_REMOVE, /* $$REMOVE: missing */
} xkind;

typedef enum {
	OP_ADD = 0,
	OP_SUBTRACT,
	OP_MULTIPLY,
	OP_DIVIDE,
	OP_MOD,
	OP_CONCAT,
	OP_TOUPPER,
	OP_TOLOWER,
	OP_COND,
	OP_IFNULL,
	OP_EQ,
	OP_NE,
	OP_GT,
	OP_GTE,
	OP_LT,
	OP_LTE,
	OP_CMP,
	OP_AND,
	OP_OR,
	OP_NOT,
	OP_SIZE,
	OP_ABS,
	OP_IN,
	OP_ARRAYELEMAT,
	OP_LITERAL,
	OP_SUM,
	OP_AVG,
	OP_MIN,
	OP_MAX,
	OP_TYPE,
	OP_ISARRAY,
	OP_CONCATARRAYS,
	OP_FLOOR,
	OP_CEIL,
	OP_STRLENBYTES,
	OP_SUBSTRBYTES,
	OP_TOSTRING,
} xop;

static const struct {
	const char *name;
	xop op;
	int min, max; /* argument counts; max -1 = any */
} ops[] = {
	{"$add", OP_ADD, 0, -1},
	{"$subtract", OP_SUBTRACT, 2, 2},
	{"$multiply", OP_MULTIPLY, 0, -1},
	{"$divide", OP_DIVIDE, 2, 2},
	{"$mod", OP_MOD, 2, 2},
	{"$concat", OP_CONCAT, 0, -1},
	{"$toUpper", OP_TOUPPER, 1, 1},
	{"$toLower", OP_TOLOWER, 1, 1},
	{"$cond", OP_COND, 3, 3},
	{"$ifNull", OP_IFNULL, 2, -1},
	{"$eq", OP_EQ, 2, 2},
	{"$ne", OP_NE, 2, 2},
	{"$gt", OP_GT, 2, 2},
	{"$gte", OP_GTE, 2, 2},
	{"$lt", OP_LT, 2, 2},
	{"$lte", OP_LTE, 2, 2},
	{"$cmp", OP_CMP, 2, 2},
	{"$and", OP_AND, 0, -1},
	{"$or", OP_OR, 0, -1},
	{"$not", OP_NOT, 1, 1},
	{"$size", OP_SIZE, 1, 1},
	{"$abs", OP_ABS, 1, 1},
	{"$in", OP_IN, 2, 2},
	{"$arrayElemAt", OP_ARRAYELEMAT, 2, 2},
	{"$literal", OP_LITERAL, 1, 1},
	{"$sum", OP_SUM, 0, -1},
	{"$avg", OP_AVG, 0, -1},
	{"$min", OP_MIN, 0, -1},
	{"$max", OP_MAX, 0, -1},
	{"$type", OP_TYPE, 1, 1},
	{"$isArray", OP_ISARRAY, 1, 1},
	{"$concatArrays", OP_CONCATARRAYS, 0, -1},
	{"$floor", OP_FLOOR, 1, 1},
	{"$ceil", OP_CEIL, 1, 1},
	{"$strLenBytes", OP_STRLENBYTES, 1, 1},
	{"$substrBytes", OP_SUBSTRBYTES, 3, 3},
	{"$substr", OP_SUBSTRBYTES, 3, 3},
	{"$toString", OP_TOSTRING, 1, 1},
};

typedef struct expr expr;
struct expr {
	xkind kind;
	docbuild_node *lit; /* X_LIT */
	char *path;         /* X_PATH */
	xop op;             /* X_OP */
	expr **args;        /* X_OP, X_OBJ, X_ARR */
	char **keys;        /* X_OBJ */
	size_t n;
};

static void expr_free(expr *x)
{
	if (x == NULL) {
		return;
	}
	docbuild_free(x->lit);
	free(x->path);
	for (size_t i = 0; i < x->n; i++) {
		expr_free(x->args[i]);
		if (x->keys != NULL) {
			free(x->keys[i]);
		}
	}
	free(x->args);
	free(x->keys);
	free(x);
}

static void expr_push(expr *x, expr *arg, const char *key)
{
	x->args = sdb_realloc(x->args, (x->n + 1) * sizeof *x->args);
	if (key != NULL) {
		x->keys = sdb_realloc(x->keys, (x->n + 1) * sizeof *x->keys);
		x->keys[x->n] = sdb_strdup(key);
	}
	x->args[x->n++] = arg;
}

static int expr_parse(const bson_iter_t *it, expr **out, const ectx *e);

static int field_path_ok(const char *p, const ectx *e)
{
	if (p[0] == '\0') {
		return efail(e, 40352, "FieldPath cannot be constructed with empty string");
	}
	if (p[0] == '.' || p[strlen(p) - 1] == '.' || strstr(p, "..") != NULL) {
		return efail(e, 15998, "FieldPath field names may not be empty strings.");
	}
	size_t dots = 0;

	for (const char *c = p; *c; c++) {
		if (*c == '$' && (c == p || c[-1] == '.')) {
			return efail(e, 16410, "FieldPath field names may not start with '$'.");
		}
		dots += *c == '.';
	}
	if (dots >= 255) {
		return efail(e, C_BAD_VALUE, "FieldPath '%.64s...' has more than 255 components", p);
	}
	return 0;
}

static int parse_string(const char *s, expr **out, const ectx *e)
{
	expr *x = sdb_calloc(1, sizeof *x);
	int rc = 0;

	*out = x;
	if (s[0] != '$') {
		x->kind = X_LIT;
		x->lit = v_string(s, strlen(s));
		return 0;
	}
	if (s[1] == '$') {
		const char *var = s + 2;
		const char *dot = strchr(var, '.');
		size_t len = dot != NULL ? (size_t)(dot - var) : strlen(var);

		if ((len == 4 && strncmp(var, "ROOT", 4) == 0) ||
		    (len == 7 && strncmp(var, "CURRENT", 7) == 0)) {
			x->kind = X_PATH;
			if (dot != NULL) {
				x->path = sdb_strdup(dot + 1);
				rc = field_path_ok(x->path, e);
			}
			return rc;
		}
		if (len == 6 && strncmp(var, "REMOVE", 6) == 0 && dot == NULL) {
			x->kind = X_REMOVE;
			return 0;
		}
		return efail(e, 17276, "Use of undefined variable: %.*s", (int)len, var);
	}
	x->kind = X_PATH;
	x->path = sdb_strdup(s + 1);
	return field_path_ok(x->path, e);
}

static int parse_op(const char *name, const bson_iter_t *arg, expr **out, const ectx *e)
{
	expr *x = sdb_calloc(1, sizeof *x);
	int idx = -1;
	int rc = 0;

	*out = x;
	x->kind = X_OP;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		if (strcmp(ops[i].name, name) == 0) {
			idx = (int)i;
		}
	}
	if (idx < 0) {
		return efail(e, C_INVALID_OP, "Unrecognized expression '%s'", name);
	}
	x->op = ops[idx].op;
	if (x->op == OP_LITERAL) {
		expr *l = sdb_calloc(1, sizeof *l);

		l->kind = X_LIT;
		l->lit = docbuild_from_iter(arg, false);
		expr_push(x, l, NULL);
		return 0;
	}
	if (x->op == OP_COND && BSON_ITER_HOLDS_DOCUMENT(arg)) {
		static const char *const names[3] = {"if", "then", "else"};
		expr *parts[3] = {NULL, NULL, NULL};
		bson_iter_t sub;

		bson_iter_recurse(arg, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			int which = -1;

			for (int i = 0; i < 3; i++) {
				if (strcmp(bson_iter_key(&sub), names[i]) == 0) {
					which = i;
				}
			}
			if (which < 0) {
				rc = efail(e, 17083, "Unrecognized parameter to $cond: %s",
					   bson_iter_key(&sub));
				break;
			}
			expr_free(parts[which]);
			parts[which] = NULL;
			rc = expr_parse(&sub, &parts[which], e);
		}
		for (int i = 0; i < 3; i++) {
			if (rc == 0 && parts[i] == NULL) {
				rc = efail(e, 17080 + i, "Missing '%s' parameter to $cond", names[i]);
			}
			if (parts[i] != NULL) {
				expr_push(x, parts[i], NULL);
			}
		}
		return rc;
	}
	if (BSON_ITER_HOLDS_ARRAY(arg)) {
		bson_iter_t sub;

		bson_iter_recurse(arg, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = expr_parse(&sub, &a, e);
			expr_push(x, a, NULL);
		}
	} else {
		expr *a = NULL;

		rc = expr_parse(arg, &a, e);
		expr_push(x, a, NULL);
	}
	if (rc != 0) {
		return rc;
	}
	if ((int)x->n < ops[idx].min || (ops[idx].max >= 0 && (int)x->n > ops[idx].max)) {
		if (ops[idx].min == ops[idx].max) {
			return efail(e, 16020, "Expression %s takes exactly %d arguments. %zu were passed in.",
				     name, ops[idx].min, x->n);
		}
		return efail(e, 16020, "Expression %s takes at least %d arguments, and %zu were passed in.",
			     name, ops[idx].min, x->n);
	}
	return 0;
}

static int expr_parse(const bson_iter_t *it, expr **out, const ectx *e)
{
	expr *x;
	int rc = 0;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		return parse_string(bson_iter_utf8(it, NULL), out, e);
	}
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;
		size_t n = 0;
		bool first_dollar = false;

		bson_iter_recurse(it, &sub);
		while (bson_iter_next(&sub)) {
			if (n == 0) {
				first_dollar = bson_iter_key(&sub)[0] == '$';
			}
			n++;
		}
		if (first_dollar) {
			if (n != 1) {
				*out = sdb_calloc(1, sizeof **out);
				return efail(e, 15983,
					     "an expression specification must contain exactly one field, "
					     "the name of the expression. Found %zu fields",
					     n);
			}
			bson_iter_recurse(it, &sub);
			bson_iter_next(&sub);
			return parse_op(bson_iter_key(&sub), &sub, out, e);
		}
		x = sdb_calloc(1, sizeof *x);
		*out = x;
		x->kind = X_OBJ;
		bson_iter_recurse(it, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;
			const char *k = bson_iter_key(&sub);

			if (k[0] == '$') {
				return efail(e, 16404, "a field name cannot start with '$': %s", k);
			}
			if (strchr(k, '.') != NULL) {
				return efail(e, 16412, "FieldPath field names may not contain '.'.");
			}
			rc = expr_parse(&sub, &a, e);
			expr_push(x, a, k);
		}
		return rc;
	}
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t sub;

		x = sdb_calloc(1, sizeof *x);
		*out = x;
		x->kind = X_ARR;
		bson_iter_recurse(it, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = expr_parse(&sub, &a, e);
			expr_push(x, a, "");
		}
		return rc;
	}
	x = sdb_calloc(1, sizeof *x);
	*out = x;
	x->kind = X_LIT;
	x->lit = docbuild_from_iter(it, false);
	return 0;
}

/* Field path evaluation with aggregation's array rules: an array on the way maps the rest
 * of the path over its elements (documents and nested arrays), dropping missing results. */
static docbuild_node *path_eval_iter(const bson_iter_t *it, const char *path);

static docbuild_node *path_eval_container(const bson_iter_t *container, const char *path)
{
	bson_iter_t sub;

	if (BSON_ITER_HOLDS_DOCUMENT(container)) {
		const char *dot = strchr(path, '.');
		size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);

		bson_iter_recurse(container, &sub);
		while (bson_iter_next(&sub)) {
			if (bson_iter_key_len(&sub) == len && memcmp(bson_iter_key(&sub), path, len) == 0) {
				if (dot == NULL) {
					return docbuild_from_iter(&sub, false);
				}
				return path_eval_iter(&sub, dot + 1);
			}
		}
		return NULL;
	}
	if (BSON_ITER_HOLDS_ARRAY(container)) {
		docbuild_node *arr = docbuild_new_array(NULL);

		bson_iter_recurse(container, &sub);
		while (bson_iter_next(&sub)) {
			if (BSON_ITER_HOLDS_DOCUMENT(&sub) || BSON_ITER_HOLDS_ARRAY(&sub)) {
				docbuild_node *v = path_eval_container(&sub, path);

				if (v != NULL) {
					docbuild_push(arr, v);
				}
			}
		}
		return arr;
	}
	return NULL;
}

static docbuild_node *path_eval_iter(const bson_iter_t *it, const char *path)
{
	return path_eval_container(it, path);
}

static docbuild_node *path_eval(const bson_t *doc, const char *path)
{
	const char *dot = strchr(path, '.');
	size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
	bson_iter_t it;

	if (!bson_iter_init(&it, doc)) {
		return NULL;
	}
	while (bson_iter_next(&it)) {
		if (bson_iter_key_len(&it) == len && memcmp(bson_iter_key(&it), path, len) == 0) {
			if (dot == NULL) {
				return docbuild_from_iter(&it, false);
			}
			return path_eval_container(&it, dot + 1);
		}
	}
	return NULL;
}

static int expr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);

static int eval_args(const expr *x, const bson_t *root, docbuild_node **vals, const ectx *e)
{
	for (size_t i = 0; i < x->n; i++) {
		int rc = expr_eval(x->args[i], root, &vals[i], e);

		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

static void free_vals(docbuild_node **vals, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		docbuild_free(vals[i]);
	}
	free(vals);
}

/* $add / $multiply: int32 -> int64 -> double widening as MongoDB; one date allowed in $add. */
static int eval_arith(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	bool mul = x->op == OP_MULTIPLY;
	int64_t iacc = mul ? 1 : 0;
	double dacc = mul ? 1 : 0;
	bool is_long = false, is_double = false, overflow = false, has_date = false;
	const char *name = mul ? "$multiply" : "$add";

	for (size_t i = 0; i < x->n; i++) {
		docbuild_node *v = vals[i];

		if (is_nullish(v)) {
			*out = v_null();
			return 0;
		}
		if (v->type == BSON_TYPE_DATE_TIME && !mul) {
			if (has_date) {
				return efail(e, 16612, "only one date allowed in an $add expression");
			}
			has_date = true;
			if (__builtin_add_overflow(iacc, v->value.value.v_datetime, &iacc)) {
				overflow = true;
			}
			dacc += (double)v->value.value.v_datetime;
			continue;
		}
		if (!is_number(v) || v->type == BSON_TYPE_DECIMAL128) {
			if (v->type == BSON_TYPE_DECIMAL128) {
				return efail(e, C_NOT_IMPLEMENTED,
					     "%s on decimal128 values is not supported by the embedded shard",
					     name);
			}
			return efail(e, mul ? 16555 : 16554,
				     "%s only supports numeric%s types, not %s", name,
				     mul ? "" : " or date", type_name(v->type));
		}
		if (v->type == BSON_TYPE_DOUBLE) {
			is_double = true;
		}
		if (v->type == BSON_TYPE_INT64) {
			is_long = true;
		}
		int64_t iv = v->type == BSON_TYPE_INT64 ? v->value.value.v_int64
			     : v->type == BSON_TYPE_INT32 ? v->value.value.v_int32
							  : 0;

		if (v->type != BSON_TYPE_DOUBLE &&
		    (mul ? __builtin_mul_overflow(iacc, iv, &iacc) : __builtin_add_overflow(iacc, iv, &iacc))) {
			overflow = true;
		}
		dacc = mul ? dacc * num_double(v) : dacc + num_double(v);
	}
	if (has_date) {
		*out = v_date(is_double ? (int64_t)llround(dacc) : iacc);
	} else if (is_double || overflow) {
		*out = v_double(dacc);
	} else if (is_long || iacc < INT32_MIN || iacc > INT32_MAX) {
		*out = v_int64(iacc);
	} else {
		*out = v_int32((int32_t)iacc);
	}
	return 0;
}

static int eval_subtract(docbuild_node *a, docbuild_node *b, docbuild_node **out, const ectx *e)
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
		*out = v_date(a->value.value.v_datetime - (int64_t)llround(num_double(b)));
		return 0;
	}
	if (!is_number(a) || !is_number(b) || a->type == BSON_TYPE_DECIMAL128 ||
	    b->type == BSON_TYPE_DECIMAL128) {
		return efail(e, 16556, "cant $subtract a%s %s from a %s",
			     b->type == BSON_TYPE_INT32 ? "n" : "", type_name(b->type),
			     type_name(a->type));
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

static char *to_string_value(const docbuild_node *v, const char *op, const ectx *e, int *rc)
{
	char buf[64];

	*rc = 0;
	if (is_nullish(v)) {
		return sdb_strdup("");
	}
	switch (v->type) {
	case BSON_TYPE_UTF8:
		return sdb_strndup(v->value.value.v_utf8.str, v->value.value.v_utf8.len);
	case BSON_TYPE_INT32:
		snprintf(buf, sizeof buf, "%d", v->value.value.v_int32);
		return sdb_strdup(buf);
	case BSON_TYPE_INT64:
		snprintf(buf, sizeof buf, "%lld", (long long)v->value.value.v_int64);
		return sdb_strdup(buf);
	case BSON_TYPE_DOUBLE:
		/* the shortest representation that reads back as the same double */
		for (int prec = 15; prec <= 17; prec++) {
			snprintf(buf, sizeof buf, "%.*g", prec, v->value.value.v_double);
			if (strtod(buf, NULL) == v->value.value.v_double) {
				break;
			}
		}
		return sdb_strdup(buf);
	default:
		*rc = efail(e, 16007, "can't convert from BSON type %s to String (%s)", type_name(v->type),
			    op);
		return NULL;
	}
}

/* The operands of $sum/$avg/$min/$max as expressions: the elements of the single
 * argument when it is an array, else the arguments themselves. */
static void list_operands(const expr *x, docbuild_node **vals, docbuild_node ***items, size_t *n)
{
	if (x->n == 1 && ntype(vals[0]) == BSON_TYPE_ARRAY) {
		*items = vals[0]->kids;
		*n = vals[0]->n;
	} else {
		*items = vals;
		*n = x->n;
	}
}

static docbuild_node *eval_sum_avg(bool avg, docbuild_node **items, size_t n)
{
	int64_t isum = 0;
	double dsum = 0;
	bool is_long = false, is_double = false, overflow = false;
	size_t count = 0;

	for (size_t i = 0; i < n; i++) {
		const docbuild_node *v = items[i];

		if (!is_number(v)) {
			continue;
		}
		count++;
		dsum += num_double(v);
		if (v->type == BSON_TYPE_DOUBLE || v->type == BSON_TYPE_DECIMAL128) {
			is_double = true;
			continue;
		}
		if (v->type == BSON_TYPE_INT64) {
			is_long = true;
		}
		if (__builtin_add_overflow(isum,
					   v->type == BSON_TYPE_INT64 ? v->value.value.v_int64
								      : v->value.value.v_int32,
					   &isum)) {
			overflow = true;
		}
	}
	if (avg) {
		return count == 0 ? v_null() : v_double(dsum / (double)count);
	}
	if (is_double || overflow) {
		return v_double(dsum);
	}
	if (is_long || isum < INT32_MIN || isum > INT32_MAX) {
		return v_int64(isum);
	}
	return v_int32((int32_t)isum);
}

static const char *agg_type_name(const docbuild_node *v)
{
	return v == NULL ? "missing" : sdb_bson_type_name(v->type);
}

static int eval_op(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node **vals;
	int rc = 0;

	*out = NULL;
	/* short-circuit and lazy operators first */
	switch (x->op) {
	case OP_LITERAL:
		*out = docbuild_clone(x->args[0]->lit);
		return 0;
	case OP_COND: {
		docbuild_node *c = NULL;

		rc = expr_eval(x->args[0], root, &c, e);
		if (rc == 0) {
			rc = expr_eval(x->args[truthy(c) ? 1 : 2], root, out, e);
		}
		docbuild_free(c);
		return rc;
	}
	case OP_IFNULL:
		for (size_t i = 0; i < x->n; i++) {
			docbuild_node *v = NULL;

			rc = expr_eval(x->args[i], root, &v, e);
			if (rc != 0) {
				return rc;
			}
			if (!is_nullish(v) || i == x->n - 1) {
				*out = v;
				return 0;
			}
			docbuild_free(v);
		}
		return 0;
	case OP_AND:
	case OP_OR:
		for (size_t i = 0; i < x->n; i++) {
			docbuild_node *v = NULL;
			bool t;

			rc = expr_eval(x->args[i], root, &v, e);
			t = truthy(v);
			docbuild_free(v);
			if (rc != 0) {
				return rc;
			}
			if (x->op == OP_AND && !t) {
				*out = v_bool(false);
				return 0;
			}
			if (x->op == OP_OR && t) {
				*out = v_bool(true);
				return 0;
			}
		}
		*out = v_bool(x->op == OP_AND);
		return 0;
	default:
		break;
	}
	vals = sdb_calloc(x->n + 1, sizeof *vals);
	rc = eval_args(x, root, vals, e);
	if (rc != 0) {
		goto done;
	}
	switch (x->op) {
	case OP_ADD:
	case OP_MULTIPLY:
		rc = eval_arith(x, vals, out, e);
		break;
	case OP_SUBTRACT:
		rc = eval_subtract(vals[0], vals[1], out, e);
		break;
	case OP_DIVIDE:
	case OP_MOD: {
		const char *name = x->op == OP_DIVIDE ? "$divide" : "$mod";

		if (is_nullish(vals[0]) || is_nullish(vals[1])) {
			*out = v_null();
			break;
		}
		if (!is_number(vals[0]) || !is_number(vals[1])) {
			rc = efail(e, x->op == OP_DIVIDE ? 16609 : 16611,
				   "%s only supports numeric types, not %s and %s", name,
				   type_name(vals[0]->type), type_name(vals[1]->type));
			break;
		}
		if (num_double(vals[1]) == 0) {
			rc = efail(e, x->op == OP_DIVIDE ? 16608 : 16610, "can't %s by 0", name);
			break;
		}
		if (x->op == OP_DIVIDE) {
			*out = v_double(num_double(vals[0]) / num_double(vals[1]));
		} else if (vals[0]->type == BSON_TYPE_DOUBLE || vals[1]->type == BSON_TYPE_DOUBLE ||
			   vals[0]->type == BSON_TYPE_DECIMAL128 ||
			   vals[1]->type == BSON_TYPE_DECIMAL128) {
			*out = v_double(fmod(num_double(vals[0]), num_double(vals[1])));
		} else {
			int64_t a = (int64_t)num_double(vals[0]), b = (int64_t)num_double(vals[1]);
			int64_t r = (b == -1) ? 0 : a % b;

			if (vals[0]->type == BSON_TYPE_INT64 || vals[1]->type == BSON_TYPE_INT64) {
				*out = v_int64(r);
			} else {
				*out = v_int32((int32_t)r);
			}
		}
		break;
	}
	case OP_CONCAT: {
		size_t len = 0, cap = 64;
		char *buf = sdb_malloc(cap);

		for (size_t i = 0; i < x->n; i++) {
			if (is_nullish(vals[i])) {
				*out = v_null();
				free(buf);
				goto done;
			}
			if (vals[i]->type != BSON_TYPE_UTF8) {
				rc = efail(e, 16702, "$concat only supports strings, not %s",
					   type_name(vals[i]->type));
				free(buf);
				goto done;
			}
			uint32_t l = vals[i]->value.value.v_utf8.len;

			while (len + l + 1 > cap) {
				cap *= 2;
			}
			buf = sdb_realloc(buf, cap);
			memcpy(buf + len, vals[i]->value.value.v_utf8.str, l);
			len += l;
		}
		*out = v_string(buf, len);
		free(buf);
		break;
	}
	case OP_TOUPPER:
	case OP_TOLOWER: {
		char *s = to_string_value(vals[0], x->op == OP_TOUPPER ? "$toUpper" : "$toLower", e, &rc);

		if (s != NULL) {
			for (char *c = s; *c; c++) {
				if (x->op == OP_TOUPPER && *c >= 'a' && *c <= 'z') {
					*c = (char)(*c - 'a' + 'A');
				} else if (x->op == OP_TOLOWER && *c >= 'A' && *c <= 'Z') {
					*c = (char)(*c - 'A' + 'a');
				}
			}
			*out = v_string(s, strlen(s));
			free(s);
		}
		break;
	}
	case OP_EQ:
	case OP_NE:
	case OP_GT:
	case OP_GTE:
	case OP_LT:
	case OP_LTE:
	case OP_CMP: {
		int c = vcmp(vals[0], vals[1]);

		switch (x->op) {
		case OP_EQ: *out = v_bool(c == 0); break;
		case OP_NE: *out = v_bool(c != 0); break;
		case OP_GT: *out = v_bool(c > 0); break;
		case OP_GTE: *out = v_bool(c >= 0); break;
		case OP_LT: *out = v_bool(c < 0); break;
		case OP_LTE: *out = v_bool(c <= 0); break;
		default: *out = v_int32(c < 0 ? -1 : c > 0); break;
		}
		break;
	}
	case OP_NOT:
		*out = v_bool(!truthy(vals[0]));
		break;
	case OP_SIZE:
		if (ntype(vals[0]) != BSON_TYPE_ARRAY) {
			rc = efail(e, 17124, "The argument to $size must be an array. Type of argument: %s",
				   type_name(ntype(vals[0])));
			break;
		}
		*out = v_int32((int32_t)vals[0]->n);
		break;
	case OP_ABS:
		if (is_nullish(vals[0])) {
			*out = v_null();
		} else if (!is_number(vals[0])) {
			rc = efail(e, 28765, "$abs only supports numeric types, not %s",
				   type_name(vals[0]->type));
		} else if (vals[0]->type == BSON_TYPE_INT32 && vals[0]->value.value.v_int32 != INT32_MIN) {
			*out = v_int32(abs(vals[0]->value.value.v_int32));
		} else if (vals[0]->type == BSON_TYPE_INT64 && vals[0]->value.value.v_int64 != INT64_MIN) {
			*out = v_int64(llabs(vals[0]->value.value.v_int64));
		} else {
			*out = v_double(fabs(num_double(vals[0])));
		}
		break;
	case OP_IN:
		if (ntype(vals[1]) != BSON_TYPE_ARRAY) {
			rc = efail(e, 40081, "$in requires an array as a second argument, found: %s",
				   type_name(ntype(vals[1])));
			break;
		}
		*out = v_bool(false);
		for (size_t i = 0; i < vals[1]->n; i++) {
			if (vals[0] != NULL && vcmp(vals[0], vals[1]->kids[i]) == 0) {
				docbuild_free(*out);
				*out = v_bool(true);
				break;
			}
		}
		break;
	case OP_SUM:
	case OP_AVG: {
		docbuild_node **items;
		size_t n;

		list_operands(x, vals, &items, &n);
		*out = eval_sum_avg(x->op == OP_AVG, items, n);
		break;
	}
	case OP_MIN:
	case OP_MAX: {
		docbuild_node **items;
		size_t n;
		const docbuild_node *best = NULL;

		list_operands(x, vals, &items, &n);
		for (size_t i = 0; i < n; i++) {
			if (is_nullish(items[i])) {
				continue;
			}
			if (best == NULL || (x->op == OP_MIN ? vcmp(items[i], best) < 0
							      : vcmp(items[i], best) > 0)) {
				best = items[i];
			}
		}
		*out = best != NULL ? docbuild_clone(best) : v_null();
		docbuild_set_key(*out, NULL);
		break;
	}
	case OP_TYPE: {
		const char *t = agg_type_name(vals[0]);

		*out = v_string(t, strlen(t));
		break;
	}
	case OP_ISARRAY:
		*out = v_bool(ntype(vals[0]) == BSON_TYPE_ARRAY);
		break;
	case OP_CONCATARRAYS: {
		docbuild_node *arr = docbuild_new_array(NULL);

		for (size_t i = 0; i < x->n && rc == 0; i++) {
			if (is_nullish(vals[i])) {
				docbuild_free(arr);
				arr = v_null();
				break;
			}
			if (vals[i]->type != BSON_TYPE_ARRAY) {
				rc = efail(e, 28664, "$concatArrays only supports arrays, not %s",
					   type_name(vals[i]->type));
				break;
			}
			for (size_t k = 0; k < vals[i]->n; k++) {
				docbuild_push(arr, docbuild_clone(vals[i]->kids[k]));
			}
		}
		*out = arr;
		break;
	}
	case OP_FLOOR:
	case OP_CEIL:
		if (is_nullish(vals[0])) {
			*out = v_null();
		} else if (!is_number(vals[0]) || vals[0]->type == BSON_TYPE_DECIMAL128) {
			rc = efail(e, 28765, "%s only supports numeric types, not %s",
				   x->op == OP_FLOOR ? "$floor" : "$ceil", type_name(vals[0]->type));
		} else if (vals[0]->type == BSON_TYPE_DOUBLE) {
			*out = v_double(x->op == OP_FLOOR ? floor(vals[0]->value.value.v_double)
							 : ceil(vals[0]->value.value.v_double));
		} else {
			*out = docbuild_clone(vals[0]);
		}
		break;
	case OP_STRLENBYTES:
		if (ntype(vals[0]) != BSON_TYPE_UTF8) {
			rc = efail(e, 34473, "$strLenBytes requires a string argument, found: %s",
				   type_name(ntype(vals[0])));
			break;
		}
		*out = v_int32((int32_t)vals[0]->value.value.v_utf8.len);
		break;
	case OP_SUBSTRBYTES: {
		char *str = to_string_value(vals[0], "$substrBytes", e, &rc);
		size_t len, start, count;

		if (str == NULL) {
			break;
		}
		len = strlen(str);
		if (!is_number(vals[1]) || !is_number(vals[2])) {
			rc = efail(e, 16034, "$substrBytes: starting index and length must be numeric");
			free(str);
			break;
		}
		if (num_double(vals[1]) < 0) {
			rc = efail(e, 50752, "$substrBytes: starting index must be non-negative (got: %g)",
				   num_double(vals[1]));
			free(str);
			break;
		}
		start = num_double(vals[1]) >= (double)len ? len : (size_t)num_double(vals[1]);
		count = num_double(vals[2]) < 0 || num_double(vals[2]) >= (double)(len - start)
				? len - start
				: (size_t)num_double(vals[2]);
		if ((start < len && ((unsigned char)str[start] & 0xC0) == 0x80) ||
		    (start + count < len && ((unsigned char)str[start + count] & 0xC0) == 0x80)) {
			rc = efail(e, 28656,
				   "$substrBytes:  Invalid range, starting index is a UTF-8 continuation byte.");
			free(str);
			break;
		}
		*out = v_string(str + start, count);
		free(str);
		break;
	}
	case OP_TOSTRING: {
		char buf[64];

		if (is_nullish(vals[0])) {
			*out = v_null();
			break;
		}
		switch (vals[0]->type) {
		case BSON_TYPE_BOOL:
			*out = v_string(vals[0]->value.value.v_bool ? "true" : "false",
					vals[0]->value.value.v_bool ? 4 : 5);
			break;
		case BSON_TYPE_OID:
			bson_oid_to_string(&vals[0]->value.value.v_oid, buf);
			*out = v_string(buf, strlen(buf));
			break;
		case BSON_TYPE_DATE_TIME: {
			int64_t ms = vals[0]->value.value.v_datetime;
			time_t secs = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
			struct tm tm;

			gmtime_r(&secs, &tm);
			snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
				 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
				 tm.tm_sec, (int)(((ms % 1000) + 1000) % 1000));
			*out = v_string(buf, strlen(buf));
			break;
		}
		default: {
			char *str = to_string_value(vals[0], "$toString", e, &rc);

			if (str != NULL) {
				*out = v_string(str, strlen(str));
				free(str);
			}
		}
		}
		break;
	}
	case OP_ARRAYELEMAT: {
		int64_t idx;

		if (is_nullish(vals[0]) || is_nullish(vals[1])) {
			*out = v_null();
			break;
		}
		if (vals[0]->type != BSON_TYPE_ARRAY) {
			rc = efail(e, 28689, "$arrayElemAt's first argument must be an array, but is %s",
				   type_name(vals[0]->type));
			break;
		}
		if (!is_number(vals[1]) || num_double(vals[1]) != floor(num_double(vals[1]))) {
			rc = efail(e, 28691, "$arrayElemAt's second argument must be a numeric value");
			break;
		}
		idx = (int64_t)num_double(vals[1]);
		if (idx < 0) {
			idx += (int64_t)vals[0]->n;
		}
		if (idx >= 0 && (size_t)idx < vals[0]->n) {
			*out = docbuild_clone(vals[0]->kids[idx]);
			docbuild_set_key(*out, NULL);
		}
		break;
	}
	default:
		rc = efail(e, C_INTERNAL, "unhandled expression");
		break;
	}
done:
	free_vals(vals, x->n);
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}

static int expr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	int rc = 0;

	*out = NULL;
	switch (x->kind) {
	case X_LIT:
		*out = docbuild_clone(x->lit);
		docbuild_set_key(*out, NULL);
		return 0;
	case X_REMOVE:
		return 0;
	case X_PATH:
		*out = x->path == NULL ? docbuild_from_bson(root) : path_eval(root, x->path);
		if (*out != NULL) {
			docbuild_set_key(*out, NULL);
		}
		return 0;
	case X_OBJ: {
		docbuild_node *d = docbuild_new_doc(NULL);

		for (size_t i = 0; i < x->n && rc == 0; i++) {
			docbuild_node *v = NULL;

			rc = expr_eval(x->args[i], root, &v, e);
			if (v != NULL) {
				docbuild_set_key(v, x->keys[i]);
				docbuild_push(d, v);
			}
		}
		*out = d;
		break;
	}
	case X_ARR: {
		docbuild_node *a = docbuild_new_array(NULL);

		for (size_t i = 0; i < x->n && rc == 0; i++) {
			docbuild_node *v = NULL;

			rc = expr_eval(x->args[i], root, &v, e);
			docbuild_push(a, v != NULL ? v : v_null());
		}
		*out = a;
		break;
	}
	case X_OP:
		return eval_op(x, root, out, e);
	}
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}

int sdb_pipeline_eval_expr(const bson_iter_t *it, const bson_t *doc, bson_t *out, int *code,
			   char *err, size_t errlen)
{
	ectx e = {code, err, errlen};
	expr *x = NULL;
	docbuild_node *v = NULL;
	int rc;

	bson_init(out);
	if (BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) {
		bson_t wrap = BSON_INITIALIZER;
		bool ok;

		bson_append_iter(&wrap, "v", 1, it);
		ok = sdb_bson_depth_ok(&wrap, SDB_BSON_MAX_DEPTH);
		bson_destroy(&wrap);
		if (!ok) {
			return efail(&e, 15, "expression nests deeper than %d levels", SDB_BSON_MAX_DEPTH);
		}
	}
	rc = expr_parse(it, &x, &e);
	if (rc == 0) {
		rc = expr_eval(x, doc, &v, &e);
	}
	if (rc == 0 && v != NULL) {
		docbuild_append(out, "v", 1, v);
	}
	docbuild_free(v);
	expr_free(x);
	return rc;
}

/* ---- projection trees ($project, $addFields, $unset) -------------------------------- */

typedef enum { P_SUB = 0, P_INCLUDE, P_EXCLUDE, P_EXPR } pkind;

typedef struct pnode pnode;
struct pnode {
	char *name;
	pkind kind;
	expr *x;
	pnode **kids;
	size_t n;
};

static void pnode_free(pnode *p)
{
	if (p == NULL) {
		return;
	}
	for (size_t i = 0; i < p->n; i++) {
		pnode_free(p->kids[i]);
	}
	free(p->kids);
	free(p->name);
	expr_free(p->x);
	free(p);
}

static pnode *pnode_child(pnode *p, const char *name, size_t len)
{
	for (size_t i = 0; i < p->n; i++) {
		if (strlen(p->kids[i]->name) == len && memcmp(p->kids[i]->name, name, len) == 0) {
			return p->kids[i];
		}
	}
	return NULL;
}

static pnode *pnode_add(pnode *p, const char *name, size_t len)
{
	pnode *k = sdb_calloc(1, sizeof *k);

	k->name = sdb_strndup(name, len);
	p->kids = sdb_realloc(p->kids, (p->n + 1) * sizeof *p->kids);
	p->kids[p->n++] = k;
	return k;
}

/* Place a leaf at the dotted path under root; 31250 on a collision. */
static int pnode_put(pnode *root, const char *path, const char *full, pnode **leaf, const ectx *e)
{
	pnode *cur = root;
	const char *p = path;

	while (true) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
		pnode *k;

		if (len == 0) {
			return efail(e, 40352, "FieldPath field names may not be empty strings.");
		}
		if (p[0] == '$') {
			return efail(e, 16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.");
		}
		k = pnode_child(cur, p, len);
		if (dot == NULL) {
			if (k != NULL) {
				return efail(e, 31250, "Path collision at %s", full);
			}
			*leaf = pnode_add(cur, p, len);
			return 0;
		}
		if (k == NULL) {
			k = pnode_add(cur, p, len);
			k->kind = P_SUB;
		} else if (k->kind != P_SUB) {
			return efail(e, 31250, "Path collision at %s", full);
		}
		cur = k;
		p = dot + 1;
	}
}

static bool is_true_value(const bson_iter_t *it, bool *is_flag)
{
	*is_flag = true;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_BOOL: return bson_iter_bool(it);
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128: {
		docbuild_node *n = docbuild_from_iter(it, false);
		bool t = num_double(n) != 0;

		docbuild_free(n);
		return t;
	}
	default: *is_flag = false; return false;
	}
}

typedef struct {
	bool addfields; /* $addFields/$set: every value is an expression */
	int mode;       /* $project: 0 unknown, 1 inclusion, -1 exclusion */
	bool id_set;
} pctx;

static int pspec_parse(pnode *root, const bson_t *spec, const char *prefix, pctx *pc, const ectx *e);

static int pspec_value(pnode *root, const char *path, const bson_iter_t *it, pctx *pc, const ectx *e)
{
	pnode *leaf;
	bool flag;
	bool t = is_true_value(it, &flag);
	int rc;

	if (!pc->addfields && flag) {
		bool is_id = strcmp(path, "_id") == 0;

		if (is_id) {
			pc->id_set = true;
		} else if (t && pc->mode < 0) {
			return efail(e, 31253, "Invalid $project :: caused by :: Cannot do inclusion on field %s in exclusion projection", path);
		} else if (!t && pc->mode > 0) {
			return efail(e, 31254, "Invalid $project :: caused by :: Cannot do exclusion on field %s in inclusion projection", path);
		}
		if (!is_id) {
			pc->mode = t ? 1 : -1;
		}
		rc = pnode_put(root, path, path, &leaf, e);
		if (rc == 0) {
			leaf->kind = t ? P_INCLUDE : P_EXCLUDE;
		}
		return rc;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;

		bson_iter_recurse(it, &sub);
		if (!bson_iter_next(&sub)) {
			if (pc->addfields) {
				goto as_expr;
			}
			return efail(e, 51270, "An empty sub-projection is not a valid value. Found empty object at path");
		}
		if (bson_iter_key(&sub)[0] != '$') {
			/* a nested specification */
			const uint8_t *data;
			uint32_t len;
			bson_t nested;
			char *pre = sdb_asprintf("%s.", path);

			bson_iter_document(it, &len, &data);
			bson_init_static(&nested, data, len);
			rc = pspec_parse(root, &nested, pre, pc, e);
			free(pre);
			return rc;
		}
	}
as_expr:
	if (strcmp(path, "_id") == 0) {
		pc->id_set = true;
	}
	if (!pc->addfields) {
		if (pc->mode < 0) {
			return efail(e, 31252, "Invalid $project :: caused by :: Cannot use expression other than $meta in exclusion projection");
		}
		pc->mode = 1;
	}
	rc = pnode_put(root, path, path, &leaf, e);
	if (rc != 0) {
		return rc;
	}
	leaf->kind = P_EXPR;
	return expr_parse(it, &leaf->x, e);
}

static int pspec_parse(pnode *root, const bson_t *spec, const char *prefix, pctx *pc, const ectx *e)
{
	bson_iter_t it;

	bson_iter_init(&it, spec);
	while (bson_iter_next(&it)) {
		char *path = sdb_asprintf("%s%s", prefix, bson_iter_key(&it));
		int rc = pspec_value(root, path, &it, pc, e);

		free(path);
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

static void set_field(docbuild_node *doc, const char *name, docbuild_node *v)
{
	size_t idx;

	if (docbuild_field(doc, name, strlen(name), &idx) != NULL) {
		if (v == NULL) {
			docbuild_free(docbuild_take(doc, idx));
		} else {
			docbuild_replace(doc, idx, v);
		}
		return;
	}
	if (v != NULL) {
		docbuild_set_key(v, name);
		docbuild_push(doc, v);
	}
}

static bool has_expr(const pnode *p)
{
	if (p->kind == P_EXPR) {
		return true;
	}
	for (size_t i = 0; i < p->n; i++) {
		if (has_expr(p->kids[i])) {
			return true;
		}
	}
	return false;
}

static int p_include(const pnode *spec, const docbuild_node *in, const bson_t *root,
		     docbuild_node **out, const ectx *e);

static int p_include_array(const pnode *spec, const docbuild_node *in, const bson_t *root,
			   docbuild_node **out, const ectx *e)
{
	docbuild_node *arr = docbuild_new_array(NULL);
	int rc = 0;

	for (size_t i = 0; i < in->n && rc == 0; i++) {
		docbuild_node *k = in->kids[i], *r = NULL;

		if (k->type == BSON_TYPE_DOCUMENT) {
			rc = p_include(spec, k, root, &r, e);
		} else if (k->type == BSON_TYPE_ARRAY) {
			rc = p_include_array(spec, k, root, &r, e);
		} else if (has_expr(spec)) {
			/* computed fields replace scalar elements by documents */
			docbuild_node *empty = docbuild_new_doc(NULL);

			rc = p_include(spec, empty, root, &r, e);
			docbuild_free(empty);
		}
		if (r != NULL) {
			docbuild_push(arr, r);
		}
	}
	*out = arr;
	return rc;
}

static int p_include(const pnode *spec, const docbuild_node *in, const bson_t *root,
		     docbuild_node **out, const ectx *e)
{
	docbuild_node *d = docbuild_new_doc(NULL);
	int rc = 0;

	*out = d;
	for (size_t i = 0; i < in->n && rc == 0; i++) {
		const docbuild_node *f = in->kids[i];
		pnode *s = pnode_child((pnode *)spec, f->key, strlen(f->key));
		docbuild_node *r = NULL;

		if (s == NULL || s->kind == P_EXCLUDE || s->kind == P_EXPR) {
			continue;
		}
		if (s->kind == P_INCLUDE) {
			r = docbuild_clone(f);
		} else if (f->type == BSON_TYPE_DOCUMENT) {
			rc = p_include(s, f, root, &r, e);
		} else if (f->type == BSON_TYPE_ARRAY) {
			rc = p_include_array(s, f, root, &r, e);
		}
		if (r != NULL) {
			docbuild_set_key(r, f->key);
			docbuild_push(d, r);
		}
	}
	for (size_t i = 0; i < spec->n && rc == 0; i++) {
		const pnode *s = spec->kids[i];

		if (s->kind == P_EXPR) {
			docbuild_node *v = NULL;

			rc = expr_eval(s->x, root, &v, e);
			if (rc == 0) {
				set_field(d, s->name, v);
			}
		} else if (s->kind == P_SUB && has_expr(s) &&
			   docbuild_field(d, s->name, strlen(s->name), NULL) == NULL) {
			docbuild_node *empty = docbuild_new_doc(NULL), *r = NULL;

			rc = p_include(s, empty, root, &r, e);
			docbuild_free(empty);
			if (r != NULL && r->n > 0) {
				set_field(d, s->name, r);
			} else {
				docbuild_free(r);
			}
		}
	}
	return rc;
}

static void p_exclude(const pnode *spec, docbuild_node *d)
{
	for (size_t i = d->n; i > 0; i--) {
		docbuild_node *f = d->kids[i - 1];
		const pnode *s = f->key != NULL ? pnode_child((pnode *)spec, f->key, strlen(f->key)) : NULL;

		if (s == NULL) {
			continue;
		}
		if (s->kind == P_EXCLUDE) {
			docbuild_free(docbuild_take(d, i - 1));
		} else if (s->kind == P_SUB) {
			if (f->type == BSON_TYPE_DOCUMENT) {
				p_exclude(s, f);
			} else if (f->type == BSON_TYPE_ARRAY) {
				for (size_t k = 0; k < f->n; k++) {
					if (f->kids[k]->type == BSON_TYPE_DOCUMENT) {
						p_exclude(s, f->kids[k]);
					}
				}
			}
		}
	}
}

static int p_addfields(const pnode *spec, docbuild_node *d, const bson_t *root, const ectx *e)
{
	int rc = 0;

	for (size_t i = 0; i < spec->n && rc == 0; i++) {
		const pnode *s = spec->kids[i];

		if (s->kind == P_EXPR) {
			docbuild_node *v = NULL;

			rc = expr_eval(s->x, root, &v, e);
			if (rc == 0) {
				set_field(d, s->name, v);
			}
			continue;
		}
		docbuild_node *f = docbuild_field(d, s->name, strlen(s->name), NULL);

		if (f != NULL && f->type == BSON_TYPE_DOCUMENT) {
			rc = p_addfields(s, f, root, e);
		} else if (f != NULL && f->type == BSON_TYPE_ARRAY) {
			for (size_t k = 0; k < f->n && rc == 0; k++) {
				if (f->kids[k]->type != BSON_TYPE_DOCUMENT) {
					docbuild_replace(f, k, docbuild_new_doc(NULL));
				}
				rc = p_addfields(s, f->kids[k], root, e);
			}
		} else {
			docbuild_node *sub = docbuild_new_doc(NULL);

			rc = p_addfields(s, sub, root, e);
			set_field(d, s->name, sub);
		}
	}
	return rc;
}

/* ---- stages -------------------------------------------------------------------------- */

typedef enum {
	S_MATCH = 0,
	S_PROJECT_INCL,
	S_PROJECT_EXCL,
	S_ADDFIELDS,
	S_SORT,
	S_LIMIT,
	S_SKIP,
	S_GROUP,
	S_UNWIND,
	S_REPLACE_ROOT,
} skind;

typedef enum {
	A_SUM = 0,
	A_AVG,
	A_MIN,
	A_MAX,
	A_FIRST,
	A_LAST,
	A_PUSH,
	A_ADDTOSET,
	A_COUNT,
} akind;

typedef struct {
	char *name;
	akind kind;
	expr *x;
} acc_spec;

typedef struct stage {
	skind kind;
	bson_t *spec;     /* a copy of the stage's argument (for pushdown) */
	sdb_matcher *m;   /* $match */
	pnode *proj;      /* $project/$addFields/$unset */
	sdb_sortspec *sort;
	int64_t n;        /* $limit/$skip; $sort: top-k bound from a following $limit (0 = none) */
	expr *id;         /* $group _id, $replaceRoot newRoot */
	acc_spec *accs;
	size_t n_accs;
	char *path;       /* $unwind */
	char *index_field;
	bool preserve;
	bool sort_by_count_desc; /* $sortByCount: the group is followed by a count sort */
} stage;

struct sdb_pipeline {
	stage *st;
	size_t n;
	size_t max_mem;
};

static void stage_clear(stage *s)
{
	if (s->spec != NULL) {
		bson_destroy(s->spec);
	}
	if (s->m != NULL) {
		sdb_matcher_free(s->m);
	}
	pnode_free(s->proj);
	if (s->sort != NULL) {
		sdb_sortspec_free(s->sort);
	}
	expr_free(s->id);
	for (size_t i = 0; i < s->n_accs; i++) {
		free(s->accs[i].name);
		expr_free(s->accs[i].x);
	}
	free(s->accs);
	free(s->path);
	free(s->index_field);
	memset(s, 0, sizeof *s);
}

void sdb_pipeline_free(sdb_pipeline *p)
{
	if (p == NULL) {
		return;
	}
	for (size_t i = 0; i < p->n; i++) {
		stage_clear(&p->st[i]);
	}
	free(p->st);
	free(p);
}

static stage *add_stage(sdb_pipeline *p, skind kind)
{
	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	memset(&p->st[p->n], 0, sizeof p->st[p->n]);
	p->st[p->n].kind = kind;
	return &p->st[p->n++];
}

static bool iter_doc(const bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		return false;
	}
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

static int parse_count_name(const bson_iter_t *it, const char *stagename, char **out, const ectx *e)
{
	const char *s;

	if (!BSON_ITER_HOLDS_UTF8(it)) {
		return efail(e, 40156, "the %s field must be a non-empty string", stagename);
	}
	s = bson_iter_utf8(it, NULL);
	if (s[0] == '\0') {
		return efail(e, 40157, "the %s field must be a non-empty string", stagename);
	}
	if (s[0] == '$') {
		return efail(e, 40158, "the %s field cannot be a $-prefixed path", stagename);
	}
	if (strchr(s, '.') != NULL) {
		return efail(e, 40160, "the %s field cannot contain '.'", stagename);
	}
	*out = sdb_strdup(s);
	return 0;
}

static int parse_group(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	static const struct {
		const char *name;
		akind kind;
	} accs[] = {
		{"$sum", A_SUM},	 {"$avg", A_AVG},	    {"$min", A_MIN},
		{"$max", A_MAX},	 {"$first", A_FIRST},	    {"$last", A_LAST},
		{"$push", A_PUSH},	 {"$addToSet", A_ADDTOSET}, {"$count", A_COUNT},
	};
	stage *s;
	bson_iter_t sub;
	bool has_id = false;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		return efail(e, 15947, "a group's fields must be specified in an object");
	}
	s = add_stage(p, S_GROUP);
	bson_iter_recurse(it, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		bson_iter_t a;
		int kind = -1;

		if (strcmp(k, "_id") == 0) {
			has_id = true;
			rc = expr_parse(&sub, &s->id, e);
			continue;
		}
		if (k[0] == '$' || strchr(k, '.') != NULL) {
			return efail(e, 40236, "The field name '%s' cannot %s", k,
				     k[0] == '$' ? "be an operator name" : "contain '.'");
		}
		if (!BSON_ITER_HOLDS_DOCUMENT(&sub)) {
			return efail(e, 40234, "The field '%s' must be an accumulator object", k);
		}
		bson_iter_recurse(&sub, &a);
		if (!bson_iter_next(&a)) {
			return efail(e, 40234, "The field '%s' must be an accumulator object", k);
		}
		for (size_t i = 0; i < sizeof accs / sizeof accs[0]; i++) {
			if (strcmp(accs[i].name, bson_iter_key(&a)) == 0) {
				kind = (int)accs[i].kind;
			}
		}
		if (kind < 0) {
			return efail(e, 15952, "unknown group operator '%s'", bson_iter_key(&a));
		}
		s->accs = sdb_realloc(s->accs, (s->n_accs + 1) * sizeof *s->accs);
		acc_spec *ac = &s->accs[s->n_accs++];

		ac->name = sdb_strdup(k);
		ac->kind = (akind)kind;
		ac->x = NULL;
		if (kind == A_COUNT) {
			bson_t empty;

			if (!iter_doc(&a, &empty) || !bson_empty(&empty)) {
				return efail(e, 40237, "The $count accumulator is a unary operator");
			}
			continue;
		}
		rc = expr_parse(&a, &ac->x, e);
		bson_iter_t extra = a;

		if (rc == 0 && bson_iter_next(&extra)) {
			return efail(e, 40238, "The field '%s' must specify one accumulator", k);
		}
	}
	if (rc == 0 && !has_id) {
		return efail(e, 15955, "a group specification must include an _id");
	}
	return rc;
}

static int parse_sort(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	bson_t spec;
	stage *s;

	if (!iter_doc(it, &spec)) {
		return efail(e, 15973, "the $sort key specification must be an object");
	}
	if (bson_empty(&spec)) {
		return efail(e, 15976, "$sort stage must have at least one sort key");
	}
	s = add_stage(p, S_SORT);
	s->spec = bson_copy(&spec);
	return sdb_sortspec_parse(&spec, &s->sort, e->code, e->err, e->errlen);
}

static int parse_unwind(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	stage *s = add_stage(p, S_UNWIND);
	const char *path = NULL;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		path = bson_iter_utf8(it, NULL);
	} else if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;

		bson_iter_recurse(it, &sub);
		while (bson_iter_next(&sub)) {
			const char *k = bson_iter_key(&sub);

			if (strcmp(k, "path") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					return efail(e, 28808, "expected a string as the path for $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				path = bson_iter_utf8(&sub, NULL);
			} else if (strcmp(k, "includeArrayIndex") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					return efail(e, 28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				const char *f = bson_iter_utf8(&sub, NULL);

				if (f[0] == '\0' || f[0] == '$') {
					return efail(e, 28822, "includeArrayIndex option to $unwind stage should not be prefixed with a '$': %s", f);
				}
				free(s->index_field);
				s->index_field = sdb_strdup(f);
			} else if (strcmp(k, "preserveNullAndEmptyArrays") == 0) {
				if (!BSON_ITER_HOLDS_BOOL(&sub)) {
					return efail(e, 28809, "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				s->preserve = bson_iter_bool(&sub);
			} else {
				return efail(e, 28811, "unrecognized option to $unwind stage: %s", k);
			}
		}
		if (path == NULL) {
			return efail(e, 28812, "no path specified to $unwind stage");
		}
	} else {
		return efail(e, 15981, "expected either a string or an object as specification for $unwind stage, got %s",
			     type_name(bson_iter_type(it)));
	}
	if (path[0] != '$') {
		return efail(e, 28818, "path option to $unwind stage should be prefixed with a '$': %s", path);
	}
	s->path = sdb_strdup(path + 1);
	return field_path_ok(s->path, e);
}

static int parse_num_arg(const bson_iter_t *it, const char *stagename, int64_t *out, const ectx *e)
{
	docbuild_node *n;
	double d;

	if (!BSON_ITER_HOLDS_NUMBER(it) && !BSON_ITER_HOLDS_DECIMAL128(it)) {
		return efail(e, strcmp(stagename, "$limit") == 0 ? 15957 : 15972,
			     "the %s must be specified as a number", stagename + 1);
	}
	n = docbuild_from_iter(it, false);
	d = num_double(n);
	docbuild_free(n);
	if (d != floor(d) || d > 9.2e18 || d < -9.2e18) {
		return efail(e, 5107200, "invalid argument to %s stage: Cannot represent as a 64-bit integer",
			     stagename);
	}
	*out = (int64_t)d;
	if (strcmp(stagename, "$limit") == 0 && *out <= 0) {
		return efail(e, 15958, "the limit must be positive");
	}
	if (*out < 0) {
		return efail(e, 5107200, "invalid argument to $skip stage: Expected a non-negative number in: $skip: %lld",
			     (long long)*out);
	}
	return 0;
}

static int parse_stage(sdb_pipeline *p, const bson_iter_t *st, const ectx *e)
{
	bson_iter_t it;
	const char *name;
	int rc = 0;
	bson_t spec;

	if (!BSON_ITER_HOLDS_DOCUMENT(st)) {
		return efail(e, C_TYPE_MISMATCH, "Each element of the 'pipeline' array must be an object");
	}
	bson_iter_recurse(st, &it);
	if (!bson_iter_next(&it)) {
		return efail(e, 40323, "A pipeline stage specification object must contain exactly one field.");
	}
	{
		bson_iter_t two = it;

		if (bson_iter_next(&two)) {
			return efail(e, 40323, "A pipeline stage specification object must contain exactly one field.");
		}
	}
	name = bson_iter_key(&it);
	if (strcmp(name, "$match") == 0) {
		stage *s;

		if (!iter_doc(&it, &spec)) {
			return efail(e, 15959, "the match filter must be an expression in an object");
		}
		s = add_stage(p, S_MATCH);
		bson_iter_t ex;

		if (bson_iter_init_find(&ex, &spec, "$expr")) {
			/* a top-level $expr runs through the expression engine, the rest through
			 * the matcher; such a $match is never pushed down to the store */
			bson_t rest = BSON_INITIALIZER;
			bson_iter_t f;

			rc = expr_parse(&ex, &s->id, e);
			bson_iter_init(&f, &spec);
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "$expr") != 0) {
					bson_append_iter(&rest, NULL, 0, &f);
				}
			}
			s->spec = bson_copy(&rest);
			bson_destroy(&rest);
			if (rc != 0) {
				return rc;
			}
		} else {
			s->spec = bson_copy(&spec);
		}
		return sdb_matcher_new(s->spec, &s->m, e->code, e->err, e->errlen);
	}
	if (strcmp(name, "$project") == 0 || strcmp(name, "$addFields") == 0 ||
	    strcmp(name, "$set") == 0) {
		pctx pc = {0};
		stage *s;

		pc.addfields = name[1] != 'p';
		if (!iter_doc(&it, &spec)) {
			return efail(e, pc.addfields ? 40272 : 15969, "%s specification must be an object", name);
		}
		if (bson_empty(&spec)) {
			return efail(e, pc.addfields ? 40177 : 51272,
				     pc.addfields ? "Invalid %s :: caused by :: specification must have at least one field"
						  : "Invalid %s :: caused by :: projection specification must have at least one field",
				     name);
		}
		s = add_stage(p, pc.addfields ? S_ADDFIELDS : S_PROJECT_INCL);
		s->proj = sdb_calloc(1, sizeof *s->proj);
		s->proj->name = sdb_strdup("");
		rc = pspec_parse(s->proj, &spec, "", &pc, e);
		if (rc != 0) {
			return rc;
		}
		if (!pc.addfields) {
			if (pc.mode < 0 || (pc.mode == 0 && pc.id_set &&
					    pnode_child(s->proj, "_id", 3)->kind == P_EXCLUDE)) {
				s->kind = S_PROJECT_EXCL;
			} else if (!pc.id_set) {
				pnode *id = pnode_add(s->proj, "_id", 3);

				id->kind = P_INCLUDE;
			}
		}
		return 0;
	}
	if (strcmp(name, "$unset") == 0) {
		stage *s = add_stage(p, S_PROJECT_EXCL);
		pnode *leaf;

		s->proj = sdb_calloc(1, sizeof *s->proj);
		s->proj->name = sdb_strdup("");
		if (BSON_ITER_HOLDS_UTF8(&it)) {
			rc = pnode_put(s->proj, bson_iter_utf8(&it, NULL), bson_iter_utf8(&it, NULL), &leaf, e);
			if (rc == 0) {
				leaf->kind = P_EXCLUDE;
			}
			return rc;
		}
		if (BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;
			bool any = false;

			bson_iter_recurse(&it, &sub);
			while (rc == 0 && bson_iter_next(&sub)) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					return efail(e, 31120, "$unset specification must be a string or an array containing only string values");
				}
				any = true;
				rc = pnode_put(s->proj, bson_iter_utf8(&sub, NULL), bson_iter_utf8(&sub, NULL), &leaf, e);
				if (rc == 0) {
					leaf->kind = P_EXCLUDE;
				}
			}
			if (rc == 0 && !any) {
				return efail(e, 31119, "$unset specification must be a string or an array with at least one field");
			}
			return rc;
		}
		return efail(e, 31002, "$unset specification must be a string or an array");
	}
	if (strcmp(name, "$sort") == 0) {
		return parse_sort(p, &it, e);
	}
	if (strcmp(name, "$limit") == 0 || strcmp(name, "$skip") == 0) {
		stage *s = add_stage(p, name[1] == 'l' ? S_LIMIT : S_SKIP);

		return parse_num_arg(&it, name, &s->n, e);
	}
	if (strcmp(name, "$group") == 0) {
		return parse_group(p, &it, e);
	}
	if (strcmp(name, "$unwind") == 0) {
		return parse_unwind(p, &it, e);
	}
	if (strcmp(name, "$count") == 0) {
		/* {$group: {_id: null, NAME: {$sum: 1}}}, {$project: {_id: 0}} */
		char *field = NULL;
		stage *s;

		rc = parse_count_name(&it, "count", &field, e);
		if (rc != 0) {
			return rc;
		}
		s = add_stage(p, S_GROUP);
		s->id = sdb_calloc(1, sizeof *s->id);
		s->id->kind = X_LIT;
		s->id->lit = v_null();
		s->accs = sdb_calloc(1, sizeof *s->accs);
		s->n_accs = 1;
		s->accs[0].name = field;
		s->accs[0].kind = A_COUNT;
		s = add_stage(p, S_PROJECT_EXCL);
		s->proj = sdb_calloc(1, sizeof *s->proj);
		s->proj->name = sdb_strdup("");
		pnode_add(s->proj, "_id", 3)->kind = P_EXCLUDE;
		return 0;
	}
	if (strcmp(name, "$sortByCount") == 0) {
		/* {$group: {_id: EXPR, count: {$sum: 1}}}, {$sort: {count: -1}} */
		stage *s;
		bson_t spec2 = BSON_INITIALIZER;

		if (BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL)[0] != '$'
					       : !BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_destroy(&spec2);
			return efail(e, 40148, "the sortByCount field must be defined as a $-prefixed path or an expression");
		}
		s = add_stage(p, S_GROUP);
		rc = expr_parse(&it, &s->id, e);
		s->accs = sdb_calloc(1, sizeof *s->accs);
		s->n_accs = 1;
		s->accs[0].name = sdb_strdup("count");
		s->accs[0].kind = A_COUNT;
		if (rc != 0) {
			bson_destroy(&spec2);
			return rc;
		}
		s = add_stage(p, S_SORT);
		BSON_APPEND_INT32(&spec2, "count", -1);
		s->spec = bson_copy(&spec2);
		rc = sdb_sortspec_parse(&spec2, &s->sort, e->code, e->err, e->errlen);
		bson_destroy(&spec2);
		return rc;
	}
	if (strcmp(name, "$replaceRoot") == 0 || strcmp(name, "$replaceWith") == 0) {
		stage *s = add_stage(p, S_REPLACE_ROOT);

		if (name[8] == 'R') {
			bson_iter_t nr;

			if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &nr) ||
			    !bson_iter_find(&nr, "newRoot")) {
				return efail(e, 40231, "no newRoot specified for the $replaceRoot stage");
			}
			return expr_parse(&nr, &s->id, e);
		}
		return expr_parse(&it, &s->id, e);
	}
	static const char *const known[] = {
		"$lookup", "$out", "$merge", "$facet", "$bucket", "$bucketAuto", "$graphLookup",
		"$geoNear", "$sample", "$redact", "$densify", "$fill", "$setWindowFields",
		"$unionWith", "$collStats", "$indexStats", "$currentOp", "$listSessions",
		"$search", "$changeStream", "$documents", "$planCacheStats", "$listLocalSessions",
	};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		if (strcmp(known[i], name) == 0) {
			return efail(e, C_NOT_IMPLEMENTED, "%s is not supported by the embedded shard", name);
		}
	}
	return efail(e, 40324, "Unrecognized pipeline stage name: '%s'", name);
}

int sdb_pipeline_parse(const bson_t *stages, const sdb_pipeline_opts *opts, sdb_pipeline **out,
		       int *code, char *err, size_t errlen)
{
	ectx e = {code, err, errlen};
	sdb_pipeline *p = sdb_calloc(1, sizeof *p);
	bson_iter_t it;
	int rc = 0;

	*out = NULL;
	if (code != NULL) {
		*code = 0;
	}
	p->max_mem = opts != NULL && opts->max_memory_bytes > 0 ? opts->max_memory_bytes
								: SDB_PIPELINE_MAX_MEMORY;
	if (!bson_iter_init(&it, stages)) {
		rc = efail(&e, C_TYPE_MISMATCH, "'pipeline' option must be specified as an array");
	} else if (!sdb_bson_depth_ok(stages, SDB_BSON_MAX_DEPTH)) {
		rc = efail(&e, 15, "pipeline nests deeper than %d levels", SDB_BSON_MAX_DEPTH);
	}
	while (rc == 0 && bson_iter_next(&it)) {
		rc = parse_stage(p, &it, &e);
	}
	if (rc != 0) {
		if (code != NULL && *code == 0) {
			*code = C_BAD_VALUE;
		}
		sdb_pipeline_free(p);
		return rc;
	}
	/* $sort followed by $skip/$limit: keep only the top skip+limit documents (MongoDB
	 * coalesces $sort and $limit the same way) */
	for (size_t i = 0; i < p->n; i++) {
		int64_t skipped = 0, bound = -1;

		if (p->st[i].kind != S_SORT) {
			continue;
		}
		for (size_t j = i + 1; j < p->n; j++) {
			if (p->st[j].kind == S_SKIP) {
				if (__builtin_add_overflow(skipped, p->st[j].n, &skipped)) {
					break;
				}
			} else if (p->st[j].kind == S_LIMIT) {
				int64_t end;

				if (!__builtin_add_overflow(skipped, p->st[j].n, &end) &&
				    (bound < 0 || end < bound)) {
					bound = end;
				}
			} else {
				break;
			}
		}
		if (bound > 0 && bound <= INT32_MAX) {
			p->st[i].n = bound;
		}
	}
	*out = p;
	return 0;
}

/* ---- pushdown ------------------------------------------------------------------------ */

static void drop_front(sdb_pipeline *p, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		stage_clear(&p->st[i]);
	}
	memmove(p->st, p->st + k, (p->n - k) * sizeof *p->st);
	p->n -= k;
}

int sdb_pipeline_pushdown(sdb_pipeline *p, unsigned flags, sdb_pipeline_pushdown_t *pd)
{
	size_t i = 0;
	size_t n_match = 0;

	bson_init(&pd->filter);
	bson_init(&pd->sort);
	pd->skip = 0;
	pd->limit = -1;
	if (flags & SDB_PUSHDOWN_MATCH) {
		while (i < p->n && p->st[i].kind == S_MATCH && p->st[i].id == NULL) {
			i++;
		}
		n_match = i;
		if (n_match == 1) {
			bson_concat(&pd->filter, p->st[0].spec);
		} else if (n_match > 1) {
			bson_t arr;
			char buf[16];
			const char *key;

			bson_append_array_begin(&pd->filter, "$and", 4, &arr);
			for (size_t k = 0; k < n_match; k++) {
				bson_uint32_to_string((uint32_t)k, &key, buf, sizeof buf);
				bson_append_document(&arr, key, -1, p->st[k].spec);
			}
			bson_append_array_end(&pd->filter, &arr);
		}
	}
	if ((flags & SDB_PUSHDOWN_SORT) && i < p->n && p->st[i].kind == S_SORT) {
		bson_concat(&pd->sort, p->st[i].spec);
		i++;
		if (flags & SDB_PUSHDOWN_LIMIT) {
			/* fold $skip/$limit runs: skip a then limit b = window [a, a+b) */
			while (i < p->n && (p->st[i].kind == S_SKIP || p->st[i].kind == S_LIMIT)) {
				if (p->st[i].kind == S_SKIP) {
					pd->skip += p->st[i].n;
					if (pd->limit >= 0) {
						pd->limit = pd->limit > p->st[i].n ? pd->limit - p->st[i].n : 0;
					}
				} else if (pd->limit < 0 || p->st[i].n < pd->limit) {
					pd->limit = p->st[i].n;
				}
				i++;
			}
		}
	}
	drop_front(p, i);
	return 0;
}

void sdb_pipeline_pushdown_destroy(sdb_pipeline_pushdown_t *pd)
{
	bson_destroy(&pd->filter);
	bson_destroy(&pd->sort);
}

/* ---- cursors ------------------------------------------------------------------------- */

/* A set of encoded keys (open addressing, linear probing); a slot is empty when its data
 * is NULL (an encoded value is never empty). */
typedef struct {
	sdb_key *slots;
	size_t cap;
	size_t n;
} keyset;

static uint64_t key_hash(const sdb_key *k);

static void keyset_free(keyset *s)
{
	for (size_t i = 0; i < s->cap; i++) {
		sdb_key_free(&s->slots[i]);
	}
	free(s->slots);
	memset(s, 0, sizeof *s);
}

static void keyset_place(sdb_key *slots, size_t cap, sdb_key *k)
{
	size_t i = (size_t)(key_hash(k) & (cap - 1));

	while (slots[i].data != NULL) {
		i = (i + 1) & (cap - 1);
	}
	slots[i] = *k;
}

/* Add k (taking ownership) unless an equal key is there (then k is freed). Returns true
 * when added. */
static bool keyset_add(keyset *s, sdb_key *k)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t cap = s->cap == 0 ? 16 : s->cap * 2;
		sdb_key *slots = sdb_calloc(cap, sizeof *slots);

		for (size_t i = 0; i < s->cap; i++) {
			if (s->slots[i].data != NULL) {
				keyset_place(slots, cap, &s->slots[i]);
			}
		}
		free(s->slots);
		s->slots = slots;
		s->cap = cap;
	}
	for (size_t i = (size_t)(key_hash(k) & (s->cap - 1));; i = (i + 1) & (s->cap - 1)) {
		if (s->slots[i].data == NULL) {
			s->slots[i] = *k;
			s->n++;
			return true;
		}
		if (sdb_key_cmp(&s->slots[i], k) == 0) {
			sdb_key_free(k);
			return false;
		}
	}
}

typedef struct {
	akind kind;
	keyset seen;      /* $addToSet: keys of the values in v */
	docbuild_node *v; /* min/max/first/last value, or push/addToSet array */
	bool set;
	int64_t isum;
	double dsum;
	bool is_long, is_double, overflow;
	int64_t count;
} acc_state;

typedef struct group {
	sdb_key key;
	docbuild_node *id;
	acc_state *acc;
	struct group *next_in_bucket;
} group;

typedef struct sitem {
	bson_t *doc;
	uint64_t seq;
	sdb_key key;
} sitem;

typedef struct {
	/* $sort */
	sitem *items; /* $sort: held documents with their sort keys */
	size_t n, cap;
	size_t pos;
	bool loaded;
	size_t mem;
	/* $limit/$skip */
	int64_t count;
	/* $group */
	group **buckets;
	size_t n_buckets;
	group **order;
	size_t n_groups;
	/* $unwind */
	bson_t *cur;
	docbuild_node *cur_arr;
	size_t cur_i;
} stage_state;

struct sdb_pipeline_cursor {
	const sdb_pipeline *p;
	sdb_pipeline_next_fn next;
	void *ctx;
	stage_state *ss;
	bson_t *out;
	int done_rc; /* 1 = running, 0 = ended, <0 = failed */
	int done_code;
	char done_err[256];
	bool input_done;
};

void sdb_pipeline_open(const sdb_pipeline *p, sdb_pipeline_next_fn next, void *ctx,
		       sdb_pipeline_cursor **out)
{
	sdb_pipeline_cursor *c = sdb_calloc(1, sizeof *c);

	c->p = p;
	c->next = next;
	c->ctx = ctx;
	c->ss = sdb_calloc(p->n + 1, sizeof *c->ss);
	c->done_rc = 1;
	*out = c;
}

static void state_clear(stage_state *s)
{
	for (size_t i = s->pos; i < s->n; i++) {
		bson_destroy(s->items[i].doc);
		sdb_key_free(&s->items[i].key);
	}
	free(s->items);
	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];

		sdb_key_free(&g->key);
		docbuild_free(g->id);
		/* accumulator values are freed when emitted; leftovers here */
		free(g->acc);
		free(g);
	}
	free(s->order);
	free(s->buckets);
	if (s->cur != NULL) {
		bson_destroy(s->cur);
	}
	docbuild_free(s->cur_arr);
}

void sdb_pipeline_cursor_free(sdb_pipeline_cursor *c)
{
	if (c == NULL) {
		return;
	}
	for (size_t i = 0; i < c->p->n; i++) {
		stage_state *s = &c->ss[i];

		if (c->p->st[i].kind == S_GROUP) {
			for (size_t g = s->pos; g < s->n_groups; g++) {
				for (size_t a = 0; a < c->p->st[i].n_accs; a++) {
					docbuild_free(s->order[g]->acc[a].v);
					keyset_free(&s->order[g]->acc[a].seen);
				}
			}
		}
		state_clear(s);
	}
	free(c->ss);
	if (c->out != NULL) {
		bson_destroy(c->out);
	}
	free(c);
}

static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e);

static int pull_input(sdb_pipeline_cursor *c, bson_t **doc, const ectx *e)
{
	const bson_t *in = NULL;
	int rc;

	*doc = NULL;
	if (c->input_done) {
		return 0;
	}
	rc = c->next(c->ctx, &in, e->code, e->err, e->errlen);
	if (rc < 0) {
		if (e->code != NULL && *e->code == 0) {
			*e->code = C_INTERNAL;
		}
		return rc;
	}
	if (rc == 0 || in == NULL) {
		c->input_done = true;
		return 0;
	}
	*doc = bson_copy(in);
	return 0;
}

static bson_t *node_to_heap(const docbuild_node *n)
{
	bson_t tmp;
	bson_t *b;

	docbuild_to_bson(n, &tmp);
	b = bson_copy(&tmp);
	bson_destroy(&tmp);
	return b;
}

static int memory_error(const ectx *e, const char *stage)
{
	if (e->code != NULL) {
		*e->code = C_MEMORY;
	}
	snprintf(e->err, e->errlen,
		 "Exceeded memory limit for %s, but didn't allow external sort. Pass allowDiskUse:true to opt in.",
		 stage);
	return SDB_ETOOBIG;
}

static int sitem_cmp(const sitem *x, const sitem *y)
{
	int r = sdb_key_cmp(&x->key, &y->key);

	if (r != 0) {
		return r;
	}
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Merge sort of items[0..n) with scratch space tmp (n entries); no global state, so
 * cursors on several threads may sort at once. */
static void msort(sitem *items, sitem *tmp, size_t n)
{
	size_t h, i, j, k;

	if (n < 2) {
		return;
	}
	h = n / 2;
	msort(items, tmp, h);
	msort(items + h, tmp, n - h);
	for (i = 0, j = h, k = 0; i < h && j < n;) {
		tmp[k++] = sitem_cmp(&items[j], &items[i]) < 0 ? items[j++] : items[i++];
	}
	while (i < h) {
		tmp[k++] = items[i++];
	}
	while (j < n) {
		tmp[k++] = items[j++];
	}
	memcpy(items, tmp, n * sizeof *items);
}

static size_t sitem_mem(const sitem *it)
{
	return it->doc->len + sizeof(bson_t) + it->key.len + sizeof *it;
}

/* Sort s->items[0..n) stably; keep at most keep (0 = all). */
static void sort_docs(stage_state *s, size_t keep)
{
	sitem *tmp = sdb_malloc((s->n + 1) * sizeof *tmp);

	msort(s->items, tmp, s->n);
	free(tmp);
	if (keep > 0 && s->n > keep) {
		for (size_t i = keep; i < s->n; i++) {
			s->mem -= sitem_mem(&s->items[i]);
			bson_destroy(s->items[i].doc);
			sdb_key_free(&s->items[i].key);
		}
		s->n = keep;
	}
}

static int run_sort(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];
	size_t keep = st->n > 0 ? (size_t)st->n : 0;
	uint64_t seq = 0;

	for (;;) {
		bson_t *d = NULL;
		sitem *it;
		int rc = pull(c, i, &d, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		if (s->n == s->cap) {
			s->cap = s->cap == 0 ? 64 : s->cap * 2;
			s->items = sdb_realloc(s->items, s->cap * sizeof *s->items);
		}
		it = &s->items[s->n];
		it->doc = d;
		it->seq = seq++;
		sdb_key_init(&it->key);
		/* the sort key is computed once per document (storage/sortspec.h) */
		rc = sdb_sortspec_key(st->sort, d, &it->key, e->err, e->errlen);
		s->n++;
		if (rc != 0) {
			if (e->code != NULL) {
				*e->code = C_BAD_VALUE;
			}
			return rc;
		}
		s->mem += sitem_mem(it);
		if (keep > 0 && s->n >= 2 * keep + 64) {
			sort_docs(s, keep);
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$sort");
		}
	}
	sort_docs(s, keep);
	return 0;
}

/* ---- $group ---- */

static uint64_t key_hash(const sdb_key *k)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < k->len; i++) {
		h ^= k->data[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void groups_grow(stage_state *s)
{
	size_t nb = s->n_buckets == 0 ? 64 : s->n_buckets * 2;
	group **b = sdb_calloc(nb, sizeof *b);

	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];
		size_t h = (size_t)(key_hash(&g->key) % nb);

		g->next_in_bucket = b[h];
		b[h] = g;
	}
	free(s->buckets);
	s->buckets = b;
	s->n_buckets = nb;
}

static void acc_add(acc_state *a, docbuild_node *v, size_t *mem)
{
	switch (a->kind) {
	case A_COUNT:
		a->count++;
		break;
	case A_SUM:
	case A_AVG:
		if (!is_number(v)) {
			break;
		}
		a->count++;
		a->dsum += num_double(v);
		if (v->type == BSON_TYPE_DOUBLE || v->type == BSON_TYPE_DECIMAL128) {
			a->is_double = true;
		} else {
			int64_t iv = v->type == BSON_TYPE_INT64 ? v->value.value.v_int64 : v->value.value.v_int32;

			if (v->type == BSON_TYPE_INT64) {
				a->is_long = true;
			}
			if (__builtin_add_overflow(a->isum, iv, &a->isum)) {
				a->overflow = true;
			}
		}
		break;
	case A_MIN:
	case A_MAX:
		if (is_nullish(v)) {
			break;
		}
		if (a->v == NULL || (a->kind == A_MIN ? vcmp(v, a->v) < 0 : vcmp(v, a->v) > 0)) {
			docbuild_free(a->v);
			a->v = v;
			return;
		}
		break;
	case A_FIRST:
		if (!a->set) {
			a->set = true;
			a->v = v;
			return;
		}
		break;
	case A_LAST:
		docbuild_free(a->v);
		a->v = v;
		return;
	case A_PUSH:
	case A_ADDTOSET:
		if (v == NULL) {
			break;
		}
		if (a->v == NULL) {
			a->v = docbuild_new_array(NULL);
		}
		if (a->kind == A_ADDTOSET) {
			sdb_key k;
			bson_t scratch;
			bson_value_t bv;

			sdb_key_init(&k);
			docbuild_value(v, &scratch, &bv);
			(void)sdb_keyenc_append_value(&k, &bv, false, NULL, 0);
			bson_destroy(&scratch);
			if (!keyset_add(&a->seen, &k)) {
				docbuild_free(v);
				return;
			}
			*mem += k.len + sizeof k;
		}
		*mem += node_size(v);
		docbuild_push(a->v, v);
		return;
	}
	docbuild_free(v);
}

static docbuild_node *acc_result(acc_state *a)
{
	docbuild_node *v;

	keyset_free(&a->seen);

	switch (a->kind) {
	case A_COUNT:
		return a->count <= INT32_MAX ? v_int32((int32_t)a->count) : v_int64(a->count);
	case A_SUM:
		if (a->is_double || a->overflow) {
			return v_double(a->dsum);
		}
		if (a->is_long || a->isum < INT32_MIN || a->isum > INT32_MAX) {
			return v_int64(a->isum);
		}
		return v_int32((int32_t)a->isum);
	case A_AVG:
		return a->count == 0 ? v_null() : v_double(a->dsum / (double)a->count);
	case A_PUSH:
	case A_ADDTOSET:
		v = a->v != NULL ? a->v : docbuild_new_array(NULL);
		a->v = NULL;
		return v;
	default:
		v = a->v != NULL ? a->v : v_null();
		a->v = NULL;
		return v;
	}
}

static int run_group(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		bson_t *d = NULL;
		docbuild_node *id = NULL;
		bson_t scratch;
		bson_value_t idv;
		sdb_key key;
		group *g;
		int rc = pull(c, i, &d, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		rc = expr_eval(st->id, d, &id, e);
		if (rc != 0) {
			bson_destroy(d);
			return rc;
		}
		if (id == NULL) {
			id = v_null();
		}
		sdb_key_init(&key);
		docbuild_value(id, &scratch, &idv);
		rc = sdb_keyenc_append_value(&key, &idv, false, e->err, e->errlen);
		bson_destroy(&scratch);
		if (rc != 0) {
			sdb_key_free(&key);
			docbuild_free(id);
			bson_destroy(d);
			if (e->code != NULL) {
				*e->code = C_BAD_VALUE;
			}
			return rc;
		}
		if (s->n_groups >= s->n_buckets) {
			groups_grow(s);
		}
		size_t h = (size_t)(key_hash(&key) % s->n_buckets);

		for (g = s->buckets[h]; g != NULL; g = g->next_in_bucket) {
			if (sdb_key_cmp(&g->key, &key) == 0) {
				break;
			}
		}
		if (g == NULL) {
			g = sdb_calloc(1, sizeof *g);
			g->key = key;
			g->id = id;
			g->acc = sdb_calloc(st->n_accs + 1, sizeof *g->acc);
			for (size_t a = 0; a < st->n_accs; a++) {
				g->acc[a].kind = st->accs[a].kind;
			}
			g->next_in_bucket = s->buckets[h];
			s->buckets[h] = g;
			s->order = sdb_realloc(s->order, (s->n_groups + 1) * sizeof *s->order);
			s->order[s->n_groups++] = g;
			s->mem += key.len * 2 + node_size(id) + sizeof *g + st->n_accs * sizeof *g->acc;
		} else {
			sdb_key_free(&key);
			docbuild_free(id);
		}
		for (size_t a = 0; a < st->n_accs && rc == 0; a++) {
			docbuild_node *v = NULL;

			if (st->accs[a].x != NULL) {
				rc = expr_eval(st->accs[a].x, d, &v, e);
			}
			if (rc == 0) {
				size_t before = 0;
				acc_state *as = &g->acc[a];

				if (as->kind == A_MIN || as->kind == A_MAX || as->kind == A_FIRST ||
				    as->kind == A_LAST) {
					before = as->v != NULL ? node_size(as->v) : 0;
					acc_add(as, v, &s->mem);
					s->mem += (as->v != NULL ? node_size(as->v) : 0);
					s->mem -= before < s->mem ? before : s->mem;
				} else {
					acc_add(as, v, &s->mem);
				}
			} else {
				docbuild_free(v);
			}
		}
		bson_destroy(d);
		if (rc != 0) {
			return rc;
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$group");
		}
	}
	return 0;
}

static bson_t *group_emit(const stage *st, stage_state *s)
{
	group *g = s->order[s->pos++];
	docbuild_node *d = docbuild_new_doc(NULL);
	bson_t *out;

	docbuild_set_key(g->id, "_id");
	docbuild_push(d, g->id);
	g->id = NULL;
	for (size_t a = 0; a < st->n_accs; a++) {
		docbuild_node *v = acc_result(&g->acc[a]);

		docbuild_set_key(v, st->accs[a].name);
		docbuild_push(d, v);
	}
	out = node_to_heap(d);
	docbuild_free(d);
	return out;
}

/* ---- $unwind ---- */

static void set_path(docbuild_node *doc, const char *path, docbuild_node *v)
{
	const char *dot = strchr(path, '.');
	size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
	size_t idx;
	docbuild_node *f = docbuild_field(doc, path, len, &idx);

	if (dot == NULL) {
		char *k = sdb_strndup(path, len);

		set_field(doc, k, v);
		free(k);
		return;
	}
	if (f == NULL || f->type != BSON_TYPE_DOCUMENT) {
		char *k = sdb_strndup(path, len);
		docbuild_node *sub = docbuild_new_doc(NULL);

		set_field(doc, k, sub);
		free(k);
		f = docbuild_field(doc, path, len, &idx);
	}
	set_path(f, dot + 1, v);
}

/* The value at a dotted path through documents only (no array traversal). */
static docbuild_node *unwind_value(const bson_t *doc, const char *path)
{
	bson_iter_t it, found;

	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &found)) {
		return docbuild_from_iter(&found, false);
	}
	return NULL;
}

static int unwind_next(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		if (s->cur != NULL && s->cur_arr != NULL && s->cur_i < s->cur_arr->n) {
			docbuild_node *d = docbuild_from_bson(s->cur);
			docbuild_node *el = docbuild_clone(s->cur_arr->kids[s->cur_i]);

			set_path(d, st->path, el);
			if (st->index_field != NULL) {
				set_path(d, st->index_field, v_int64((int64_t)s->cur_i));
			}
			s->cur_i++;
			*doc = node_to_heap(d);
			docbuild_free(d);
			return 0;
		}
		if (s->cur != NULL) {
			bson_destroy(s->cur);
			s->cur = NULL;
		}
		docbuild_free(s->cur_arr);
		s->cur_arr = NULL;

		bson_t *in = NULL;
		int rc = pull(c, i, &in, e);

		if (rc != 0 || in == NULL) {
			*doc = NULL;
			return rc;
		}
		docbuild_node *v = unwind_value(in, st->path);

		if (v != NULL && v->type == BSON_TYPE_ARRAY && v->n > 0) {
			s->cur = in;
			s->cur_arr = v;
			s->cur_i = 0;
			continue;
		}
		bool emptyish = v == NULL || v->type == BSON_TYPE_NULL || v->type == BSON_TYPE_ARRAY ||
				v->type == BSON_TYPE_UNDEFINED;

		if (emptyish && !st->preserve) {
			docbuild_free(v);
			bson_destroy(in);
			continue;
		}
		/* a non-array value passes as is; preserved null/missing/empty too */
		if (st->index_field != NULL) {
			docbuild_node *d = docbuild_from_bson(in);

			if (v != NULL && v->type == BSON_TYPE_ARRAY) {
				/* preserved empty array: MongoDB drops the field */
				set_path(d, st->path, NULL);
			}
			set_path(d, st->index_field, v_null());
			bson_destroy(in);
			in = node_to_heap(d);
			docbuild_free(d);
		} else if (v != NULL && v->type == BSON_TYPE_ARRAY) {
			docbuild_node *d = docbuild_from_bson(in);

			set_path(d, st->path, NULL);
			bson_destroy(in);
			in = node_to_heap(d);
			docbuild_free(d);
		}
		docbuild_free(v);
		*doc = in;
		return 0;
	}
}

/* Pull the output of stage i-1 (the input of stage i); i == 0 reads the store. */
static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st;
	stage_state *s;
	int rc;

	*doc = NULL;
	if (i == 0) {
		return pull_input(c, doc, e);
	}
	st = &c->p->st[i - 1];
	s = &c->ss[i - 1];
	for (;;) {
		bson_t *in = NULL;

		switch (st->kind) {
		case S_SORT:
			if (!s->loaded) {
				s->loaded = true;
				rc = run_sort(c, i - 1, e);
				if (rc != 0) {
					return rc;
				}
			}
			if (s->pos < s->n) {
				sdb_key_free(&s->items[s->pos].key);
				*doc = s->items[s->pos++].doc;
			}
			return 0;
		case S_GROUP:
			if (!s->loaded) {
				s->loaded = true;
				rc = run_group(c, i - 1, e);
				if (rc != 0) {
					return rc;
				}
			}
			if (s->pos < s->n_groups) {
				*doc = group_emit(st, s);
			}
			return 0;
		case S_UNWIND:
			return unwind_next(c, i - 1, doc, e);
		case S_LIMIT:
			if (s->count >= st->n) {
				return 0;
			}
			rc = pull(c, i - 1, doc, e);
			if (rc == 0 && *doc != NULL) {
				s->count++;
			}
			return rc;
		default:
			break;
		}
		rc = pull(c, i - 1, &in, e);
		if (rc != 0 || in == NULL) {
			return rc;
		}
		switch (st->kind) {
		case S_MATCH:
			if (sdb_matcher_match(st->m, in)) {
				bool keep = true;

				if (st->id != NULL) {
					docbuild_node *v = NULL;

					rc = expr_eval(st->id, in, &v, e);
					keep = truthy(v);
					docbuild_free(v);
					if (rc != 0) {
						bson_destroy(in);
						return rc;
					}
				}
				if (keep) {
					*doc = in;
					return 0;
				}
			}
			bson_destroy(in);
			continue;
		case S_SKIP:
			if (s->count < st->n) {
				s->count++;
				bson_destroy(in);
				continue;
			}
			*doc = in;
			return 0;
		case S_PROJECT_INCL:
		case S_PROJECT_EXCL:
		case S_ADDFIELDS: {
			docbuild_node *d = docbuild_from_bson(in), *r = NULL;

			rc = 0;
			if (st->kind == S_PROJECT_INCL) {
				rc = p_include(st->proj, d, in, &r, e);
				docbuild_free(d);
				d = r;
			} else if (st->kind == S_PROJECT_EXCL) {
				p_exclude(st->proj, d);
			} else {
				rc = p_addfields(st->proj, d, in, e);
			}
			if (rc == 0) {
				*doc = node_to_heap(d);
			}
			docbuild_free(d);
			bson_destroy(in);
			return rc;
		}
		case S_REPLACE_ROOT: {
			docbuild_node *v = NULL;

			rc = expr_eval(st->id, in, &v, e);
			bson_destroy(in);
			if (rc != 0) {
				return rc;
			}
			if (ntype(v) != BSON_TYPE_DOCUMENT) {
				rc = efail(e, 40228,
					   "'newRoot' expression must evaluate to an object, but resulting value was of type: %s",
					   type_name(ntype(v)));
				docbuild_free(v);
				return rc;
			}
			*doc = node_to_heap(v);
			docbuild_free(v);
			return 0;
		}
		default:
			bson_destroy(in);
			return efail(e, C_INTERNAL, "unhandled stage");
		}
	}
}

int sdb_pipeline_cursor_next(sdb_pipeline_cursor *c, const bson_t **doc, int *code, char *err,
			     size_t errlen)
{
	ectx e = {code, err, errlen};
	bson_t *d = NULL;
	int rc;

	*doc = NULL;
	if (code != NULL) {
		*code = 0;
	}
	if (c->done_rc <= 0) {
		if (code != NULL) {
			*code = c->done_code;
		}
		if (err != NULL && errlen > 0) {
			snprintf(err, errlen, "%s", c->done_err);
		}
		return c->done_rc;
	}
	if (c->out != NULL) {
		bson_destroy(c->out);
		c->out = NULL;
	}
	rc = pull(c, c->p->n, &d, &e);
	if (rc != 0) {
		if (code != NULL && *code == 0) {
			*code = C_INTERNAL;
		}
		c->done_rc = rc;
		c->done_code = code != NULL ? *code : C_INTERNAL;
		snprintf(c->done_err, sizeof c->done_err, "%s", err != NULL ? err : "");
		return rc;
	}
	if (d == NULL) {
		c->done_rc = 0;
		return 0;
	}
	c->out = d;
	*doc = d;
	return 1;
}
