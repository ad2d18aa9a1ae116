/* The aggregation expression language of the pipeline engine (see pipeline_int.h):
 * expressions are compiled once into a tree (agg_expr_parse) and evaluated into docbuild
 * nodes (agg_expr_eval; NULL meaning "missing"), with MongoDB's operators, argument counts,
 * type rules and error codes (mongo/db/pipeline/expression.cpp). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"
#include "storage/path.h"
#include "storage/store.h"

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

/* ---- expressions ------------------------------------------------------------------- */

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
	{"$stdDevPop", OP_STDDEVPOP, 0, -1},
	{"$stdDevSamp", OP_STDDEVSAMP, 0, -1},
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
	{"$switch", OP_SWITCH, 1, -1},
};


void agg_expr_free(expr *x)
{
	if (x == NULL) {
		return;
	}
	docbuild_free(x->lit);
	free(x->path);
	if (x->var != NULL) {
		bson_destroy(x->var);
	}
	for (size_t i = 0; i < x->n; i++) {
		agg_expr_free(x->args[i]);
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


int agg_field_path_ok(const char *p, const ectx *e)
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
	if (dots + 1 > SDB_PATH_MAX_COMPONENTS) {
		return efail(e, SDB_ERR_PATH_TOO_LONG, "FieldPath is too long");
	}
	return 0;
}

static int parse_string(const char *s, uint32_t slen, expr **out, const ectx *e)
{
	expr *x = sdb_calloc(1, sizeof *x);
	int rc = 0;

	*out = x;
	if (s[0] != '$') {
		/* the whole string: a literal may hold NUL bytes (strlen would cut it short) */
		x->kind = X_LIT;
		x->lit = v_string(s, slen);
		return 0;
	}
	if (strlen(s) != slen) {
		/* a field path or variable name read as a C string would silently be another */
		x->kind = X_LIT;
		x->lit = v_string("", 0);
		return efail(e, C_BAD_VALUE, "field path or variable name '%s' contains a null byte",
			     s);
	}
	if (s[1] == '$') {
		const char *var = s + 2;
		const char *dot = strchr(var, '.');
		size_t len = dot != NULL ? (size_t)(dot - var) : strlen(var);

		if ((len == 4 && strncmp(var, "ROOT", 4) == 0) ||
		    (len == 7 && strncmp(var, "CURRENT", 7) == 0)) {
			x->kind = X_PATH;
			x->root = len == 4;
			if (dot != NULL) {
				x->path = sdb_strdup(dot + 1);
				rc = agg_field_path_ok(x->path, e);
			}
			return rc;
		}
		if (len == 6 && strncmp(var, "REMOVE", 6) == 0 && dot == NULL) {
			x->kind = X_REMOVE;
			return 0;
		}
		bson_iter_t vit;
		char name[256];

		rc = agg_lvar_parse(var, len, x, e);
		if (rc != 1) {
			return rc;
		}
		rc = 0;

		if (e->vars != NULL && len < sizeof name) {
			memcpy(name, var, len);
			name[len] = '\0';
		}
		if (e->vars != NULL && len < sizeof name && bson_iter_init_find(&vit, e->vars, name)) {
			x->kind = X_VAR;
			x->var = bson_new();
			bson_append_iter(x->var, "v", 1, &vit);
			x->path = sdb_asprintf("v%s", dot != NULL ? dot : "");
			return dot != NULL ? agg_field_path_ok(dot + 1, e) : 0;
		}
		return efail(e, 17276, "Use of undefined variable: %.*s", (int)len, var);
	}
	x->kind = X_PATH;
	x->path = sdb_strdup(s + 1);
	return agg_field_path_ok(x->path, e);
}

/* {$switch: {branches: [{case, then}, ...], default}} into x's args: case0, then0, case1,
 * then1, ..., and the default last when there is one (an odd count). MongoDB 6.0's
 * ExpressionSwitch::parse codes (40060-40068). */
static int parse_switch(expr *x, const bson_iter_t *arg, const ectx *e)
{
	bson_iter_t sub, br;
	expr *dflt = NULL;
	bool have_branches = false;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 40060, "$switch requires an object as an argument, found: %s",
			     type_name(bson_iter_type(arg)));
	}
	bson_iter_recurse(arg, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (strcmp(k, "default") == 0) {
			agg_expr_free(dflt);
			dflt = NULL;
			rc = agg_expr_parse(&sub, &dflt, e);
			continue;
		}
		if (strcmp(k, "branches") != 0) {
			rc = efail(e, 40067, "$switch found an unknown argument: %s", k);
			break;
		}
		if (!BSON_ITER_HOLDS_ARRAY(&sub)) {
			rc = efail(e, 40061, "$switch expected an array for 'branches', found: %s",
				   type_name(bson_iter_type(&sub)));
			break;
		}
		have_branches = true;
		bson_iter_recurse(&sub, &br);
		while (rc == 0 && bson_iter_next(&br)) {
			expr *parts[2] = {NULL, NULL};
			bson_iter_t b;

			if (!BSON_ITER_HOLDS_DOCUMENT(&br)) {
				rc = efail(e, 40062,
					   "$switch expected each branch to be an object, found: %s",
					   type_name(bson_iter_type(&br)));
				break;
			}
			bson_iter_recurse(&br, &b);
			while (rc == 0 && bson_iter_next(&b)) {
				int which = strcmp(bson_iter_key(&b), "case") == 0   ? 0
					    : strcmp(bson_iter_key(&b), "then") == 0 ? 1
										    : -1;
				if (which < 0) {
					rc = efail(e, 40063, "$switch found an unknown argument to a branch: %s",
						   bson_iter_key(&b));
					break;
				}
				agg_expr_free(parts[which]);
				parts[which] = NULL;
				rc = agg_expr_parse(&b, &parts[which], e);
			}
			if (rc == 0 && parts[0] == NULL) {
				rc = efail(e, 40064, "$switch requires each branch have a 'case' expression");
			} else if (rc == 0 && parts[1] == NULL) {
				rc = efail(e, 40065, "$switch requires each branch have a 'then' expression.");
			}
			if (rc != 0) {
				agg_expr_free(parts[0]);
				agg_expr_free(parts[1]);
				break;
			}
			expr_push(x, parts[0], NULL);
			expr_push(x, parts[1], NULL);
		}
	}
	if (rc == 0 && (!have_branches || x->n == 0)) {
		rc = efail(e, 40068, "$switch requires at least one branch.");
	}
	if (dflt != NULL) {
		if (rc == 0) {
			expr_push(x, dflt, NULL);
		} else {
			agg_expr_free(dflt);
		}
	}
	return rc;
}

static int parse_op(const char *name, const bson_iter_t *arg, expr **out, const ectx *e)
{
	expr *x = sdb_calloc(1, sizeof *x);
	int idx = -1;
	int rc = 0;

	*out = x;
	x->kind = X_OP;
	rc = agg_ext_parse(name, arg, x, e);
	if (rc != 1) {
		return rc;
	}
	rc = 0;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		if (strcmp(ops[i].name, name) == 0) {
			idx = (int)i;
		}
	}
	if (idx < 0 && strcmp(name, "$rand") == 0) {
		/* a shard replica set replicates commands, not their results: every member must
		 * compute the same documents, so expressions have no randomness (nor clock) */
		return efail(e, C_NOT_IMPLEMENTED,
			     "$rand is not supported by stripedb: shard members replicate commands, "
			     "so expressions must be deterministic");
	}
	if (idx < 0) {
		/* the operators of pipeline_expr_var.c, _array.c and _obj.c */
		rc = agg_xvar_parse(name, arg, x, e);
		rc = rc == 1 ? agg_xarr_parse(name, arg, x, e) : rc;
		rc = rc == 1 ? agg_xobj_parse(name, arg, x, e) : rc;
		if (rc != 1) {
			return rc;
		}
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
	if (x->op == OP_SWITCH) {
		return parse_switch(x, arg, e);
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
			agg_expr_free(parts[which]);
			parts[which] = NULL;
			rc = agg_expr_parse(&sub, &parts[which], e);
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

			rc = agg_expr_parse(&sub, &a, e);
			expr_push(x, a, NULL);
		}
	} else {
		expr *a = NULL;

		rc = agg_expr_parse(arg, &a, e);
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

int agg_expr_parse(const bson_iter_t *it, expr **out, const ectx *e)
{
	expr *x;
	int rc = 0;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		uint32_t slen = 0;
		const char *str = bson_iter_utf8(it, &slen);

		return parse_string(str, slen, out, e);
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
			rc = agg_expr_parse(&sub, &a, e);
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

			rc = agg_expr_parse(&sub, &a, e);
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


/* The operands of x: vals[i] owned when owned[i] (see agg_expr_eval_ref). */
static int eval_args(const expr *x, const bson_t *root, docbuild_node **vals, bool *owned,
		     const ectx *e)
{
	for (size_t i = 0; i < x->n; i++) {
		int rc = agg_expr_eval_ref(x->args[i], root, &vals[i], &owned[i], e);

		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

int agg_check_interrupt(size_t i, const ectx *e)
{
	(void)i;
	if (sdb_store_interrupted()) {
		efail(e, 11601, "operation was interrupted");
		return SDB_ECANCELED;
	}
	return 0;
}

static bool grows_first(const expr *a)
{
	return a != NULL && a->kind == X_OP && a->n > 0 &&
	       (a->op == OP_CONCATARRAYS || (a->op == OP_XOBJ && a->sub == AGG_XOBJ_MERGE));
}

bool agg_expr_moved_acc(const expr *a)
{
	while (grows_first(a)) {
		a = a->args[0];
	}
	return a != NULL && a->kind == X_LVAR && a->take;
}

bool agg_expr_grows_acc(const expr *x)
{
	if (grows_first(x)) {
		return agg_expr_moved_acc(x);
	}
	if (x == NULL || x->kind != X_OP || (x->op != OP_COND && x->op != OP_SWITCH)) {
		return false;
	}
	/* a $cond/$switch whose every branch grows the moved accumulator or is the moved
	 * accumulator itself (pipeline_expr_var.c branch_take) */
	for (size_t i = 0; i < x->n; i++) {
		bool branch = x->op == OP_COND ? i > 0 : (i % 2 == 1 || i + 1 == x->n);
		const expr *b = x->args[i];

		if (branch && !(grows_first(b) && agg_expr_moved_acc(b)) &&
		    !(b != NULL && b->kind == X_LVAR && b->take)) {
			return false;
		}
	}
	return true;
}

static void free_vals(docbuild_node **vals, bool *owned, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		agg_ref_free(vals[i], owned[i]);
	}
	free(vals);
	free(owned);
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
	case BSON_TYPE_DECIMAL128: {
		char dbuf[BSON_DECIMAL128_STRING];

		bson_decimal128_to_string(&v->value.value.v_decimal128, dbuf);
		return sdb_strdup(dbuf);
	}
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

static const char *agg_type_name(const docbuild_node *v)
{
	return v == NULL ? "missing" : sdb_bson_type_name(v->type);
}

static int eval_op(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node **vals;
	bool *owned;
	int rc = 0;

	*out = NULL;
	/* short-circuit and lazy operators first */
	switch (x->op) {
	case OP_XVAR:
		return agg_xvar_eval(x, root, out, e);
	case OP_XARR:
		return agg_xarr_eval(x, root, out, e);
	case OP_XOBJ:
		return agg_xobj_eval(x, root, out, e);
	case OP_LITERAL:
		*out = docbuild_clone(x->args[0]->lit);
		return 0;
	case OP_EXT:
		return agg_ext_eval(x, root, out, e);
	case OP_COND: {
		docbuild_node *c = NULL;

		rc = agg_expr_eval(x->args[0], root, &c, e);
		if (rc == 0) {
			rc = agg_expr_eval(x->args[truthy(c) ? 1 : 2], root, out, e);
		}
		docbuild_free(c);
		return rc;
	}
	case OP_SWITCH:
		for (size_t i = 0; i + 1 < x->n; i += 2) {
			docbuild_node *c = NULL;
			bool hit;

			rc = agg_expr_eval(x->args[i], root, &c, e);
			hit = rc == 0 && truthy(c);
			docbuild_free(c);
			if (rc != 0) {
				return rc;
			}
			if (hit) {
				return agg_expr_eval(x->args[i + 1], root, out, e);
			}
		}
		if (x->n % 2 == 1) {
			return agg_expr_eval(x->args[x->n - 1], root, out, e);
		}
		return efail(e, 40066,
			     "$switch could not find a matching branch for an input, and no default "
			     "was specified.");
	case OP_IFNULL:
		for (size_t i = 0; i < x->n; i++) {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(x->args[i], root, &v, e);
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

			rc = agg_expr_eval(x->args[i], root, &v, e);
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
	owned = sdb_calloc(x->n + 1, sizeof *owned);
	rc = eval_args(x, root, vals, owned, e);
	if (rc != 0) {
		goto done;
	}
	switch (x->op) {
	case OP_ADD:
		rc = agg_eval_add(x, vals, out, e);
		break;
	case OP_MULTIPLY:
		rc = agg_eval_multiply(x, vals, out, e);
		break;
	case OP_SUBTRACT:
		rc = agg_eval_subtract(vals[0], vals[1], out, e);
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
		if (vals[0]->type == BSON_TYPE_DECIMAL128 || vals[1]->type == BSON_TYPE_DECIMAL128) {
			/* MongoDB: both coerced to Decimal128 (doubles to 15 digits), a decimal
			 * result; a zero divisor (any sign or exponent) refused */
			bson_decimal128_t a, b;

			(void)sdb_dec_from_value(&vals[0]->value, &a);
			(void)sdb_dec_from_value(&vals[1]->value, &b);
			if (sdb_dec_is_zero(b)) {
				rc = efail(e, x->op == OP_DIVIDE ? 16608 : 16610, "can't %s by zero",
					   name);
				break;
			}
			*out = v_decimal(x->op == OP_DIVIDE ? sdb_dec_div(a, b) : sdb_dec_mod(a, b));
			break;
		}
		if (num_double(vals[1]) == 0) {
			rc = efail(e, x->op == OP_DIVIDE ? 16608 : 16610, "can't %s by zero", name);
			break;
		}
		if (x->op == OP_DIVIDE) {
			*out = v_double(num_double(vals[0]) / num_double(vals[1]));
		} else if (vals[0]->type == BSON_TYPE_DOUBLE || vals[1]->type == BSON_TYPE_DOUBLE) {
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
		} else if (vals[0]->type == BSON_TYPE_DECIMAL128) {
			*out = v_decimal(sdb_dec_abs(vals[0]->value.value.v_decimal128));
		} else if (vals[0]->type == BSON_TYPE_INT32) {
			int32_t i = vals[0]->value.value.v_int32;

			/* MongoDB: |INT32_MIN| does not fit an int, it becomes a long */
			*out = i == INT32_MIN ? v_int64(-(int64_t)i) : v_int32(abs(i));
		} else if (vals[0]->type == BSON_TYPE_INT64) {
			if (vals[0]->value.value.v_int64 == INT64_MIN) {
				rc = efail(e, 28680, "can't take $abs of long long min");
			} else {
				*out = v_int64(llabs(vals[0]->value.value.v_int64));
			}
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
		*out = agg_eval_sum_avg(x->op == OP_AVG, items, n);
		break;
	}
	case OP_STDDEVPOP:
	case OP_STDDEVSAMP: {
		/* ExpressionFromAccumulator<AccumulatorStdDev*>: one argument's array elements,
		 * else each argument */
		docbuild_node **items;
		size_t n;
		agg_stddev sd = {0};

		list_operands(x, vals, &items, &n);
		for (size_t i = 0; i < n; i++) {
			agg_stddev_add(&sd, items[i]);
		}
		*out = agg_stddev_result(&sd, x->op == OP_STDDEVSAMP);
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
		docbuild_node *arr;
		long long added = 0;
		size_t from = 0;

		for (size_t i = 0; i < x->n; i++) {
			if (is_nullish(vals[i])) {
				*out = v_null();
				goto done;
			}
			if (vals[i]->type != BSON_TYPE_ARRAY) {
				rc = efail(e, 28664, "$concatArrays only supports arrays, not %s",
					   type_name(vals[i]->type));
				goto done;
			}
		}
		/* the first operand, when it is ours, is grown in place: $reduce's
		 * {$concatArrays: ["$$value", ...]} appends to its accumulator in time linear in
		 * what it appends, not in what the accumulator holds */
		if (x->n > 0 && owned[0]) {
			arr = vals[0];
			vals[0] = NULL;
			from = 1;
		} else {
			arr = docbuild_new_array(NULL);
		}
		for (size_t i = from; i < x->n; i++) {
			for (size_t k = 0; k < vals[i]->n; k++) {
				docbuild_node *c;

				if (owned[i]) {
					c = vals[i]->kids[k]; /* moved out: n is cleared below */
				} else {
					c = docbuild_clone(vals[i]->kids[k]);
					docbuild_set_key(c, NULL);
				}
				if (e->acc != NULL) {
					added += (long long)node_size(c);
				}
				docbuild_push(arr, c);
			}
			if (owned[i]) {
				vals[i]->n = 0;
			}
		}
		if (e->acc != NULL && from == 1 && agg_expr_moved_acc(x->args[0])) {
			e->acc->bytes += added;
			e->acc->appended = true;
		}
		*out = arr;
		break;
	}
	case OP_FLOOR:
	case OP_CEIL:
		if (is_nullish(vals[0])) {
			*out = v_null();
		} else if (!is_number(vals[0])) {
			rc = efail(e, 28765, "%s only supports numeric types, not %s",
				   x->op == OP_FLOOR ? "$floor" : "$ceil", type_name(vals[0]->type));
		} else if (vals[0]->type == BSON_TYPE_DECIMAL128) {
			/* Decimal128::quantize(kNormalizedZero, toward -/+ Infinity) */
			*out = v_decimal(x->op == OP_FLOOR ? sdb_dec_floor(vals[0]->value.value.v_decimal128)
							   : sdb_dec_ceil(vals[0]->value.value.v_decimal128));
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
		if (!is_number(vals[1])) {
			rc = efail(e, 28690, "$arrayElemAt's second argument must be a numeric value, but is %s",
				   type_name(vals[1]->type));
			break;
		}
		{
			/* MongoDB: an integral value in int32's range (a plain cast of a larger
			 * double would be undefined, and an index past int32 is refused) */
			double d = num_double(vals[1]);

			if (!(d == floor(d) && d >= (double)INT32_MIN && d <= (double)INT32_MAX)) {
				rc = efail(e, 28691, "$arrayElemAt's second argument must be representable as a 32-bit integer: %g",
					   d);
				break;
			}
			idx = (int64_t)d;
		}
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
	free_vals(vals, owned, x->n);
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}

int agg_expr_eval_ref(const expr *x, const bson_t *root, docbuild_node **out, bool *owned,
		      const ectx *e)
{
	*owned = true;
	if (x->kind == X_LIT && x->lit->key == NULL) {
		*out = x->lit;
		*owned = false;
		return 0;
	}
	if (x->kind == X_LVAR && !x->take && strchr(x->path, '.') == NULL) {
		const docbuild_node *v = NULL;
		int rc = agg_lvar_ref(x, &v, e);

		*out = (docbuild_node *)v;
		*owned = false;
		return rc;
	}
	return agg_expr_eval(x, root, out, e);
}

int agg_expr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
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
	case X_PATH: {
		const bson_t *base = x->root && e->root != NULL ? e->root : root;

		*out = x->path == NULL ? docbuild_from_bson(base) : path_eval(base, x->path);
		if (*out != NULL) {
			docbuild_set_key(*out, NULL);
		}
		return 0;
	}
	case X_LVAR:
		return agg_lvar_eval(x, out, e);
	case X_VAR:
		*out = path_eval(x->var, x->path);
		if (*out != NULL) {
			docbuild_set_key(*out, NULL);
		}
		return 0;
	case X_OBJ: {
		docbuild_node *d = docbuild_new_doc(NULL);

		for (size_t i = 0; i < x->n && rc == 0; i++) {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(x->args[i], root, &v, e);
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

			rc = agg_expr_eval(x->args[i], root, &v, e);
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
	return sdb_pipeline_eval_expr_vars(it, NULL, doc, out, code, err, errlen);
}

int sdb_pipeline_eval_expr_vars(const bson_iter_t *it, const bson_t *vars, const bson_t *doc,
				bson_t *out, int *code, char *err, size_t errlen)
{
	ectx e = {.code = code, .err = err, .errlen = errlen, .vars = vars};
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
	rc = agg_expr_parse(it, &x, &e);
	if (rc == 0) {
		rc = agg_expr_eval(x, doc, &v, &e);
	}
	if (rc == 0 && v != NULL) {
		docbuild_append(out, "v", 1, v);
	}
	docbuild_free(v);
	agg_expr_free(x);
	return rc;
}

/* ---- user variables (pipeline.h sdb_let_parse) ---- */

/* Does x read the document (a field path, $$ROOT, $$CURRENT)? */
static bool expr_reads_doc(const expr *x)
{
	if (x == NULL) { /* $zip's separator between inputs and defaults */
		return false;
	}
	if (x->kind == X_PATH) {
		return true;
	}
	for (size_t i = 0; i < x->n; i++) {
		if (expr_reads_doc(x->args[i])) {
			return true;
		}
	}
	return false;
}

/* MongoDB's Variables::uassertValidNameForUserWrite (variables.cpp). */
int agg_let_name_ok(const char *name, const ectx *e)
{
	const unsigned char *c = (const unsigned char *)name;

	if (name[0] == '\0') {
		return efail(e, 16866, "empty variable names are not allowed");
	}
	if (strcmp(name, "CURRENT") == 0) {
		return efail(e, C_NOT_IMPLEMENTED, "rebinding CURRENT in let is not supported by "
						   "stripedb");
	}
	if (!((c[0] >= 'a' && c[0] <= 'z') || (c[0] & 0x80))) {
		return efail(e, 16867, "'%s' starts with an invalid character for a user variable name",
			     name);
	}
	for (size_t i = 1; c[i] != '\0'; i++) {
		if (!((c[i] >= 'a' && c[i] <= 'z') || (c[i] >= 'A' && c[i] <= 'Z') ||
		      (c[i] >= '0' && c[i] <= '9') || c[i] == '_' || (c[i] & 0x80))) {
			return efail(e, 16868, "'%s' contains an invalid character for a variable name: '%c'",
				     name, c[i]);
		}
	}
	return 0;
}

int sdb_let_parse(const bson_iter_t *let, const bson_t *base, const char *what, bson_t *out,
		  int *code, char *err, size_t errlen)
{
	const ectx e = {.code = code, .err = err, .errlen = errlen};
	bson_t empty = BSON_INITIALIZER;
	bson_iter_t it;
	int rc = 0;

	bson_init(out);
	if (code != NULL) {
		*code = 0;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(let) || !bson_iter_recurse(let, &it)) {
		return efail(&e, C_TYPE_MISMATCH, "BSON field '%s' is the wrong type '%s', expected type 'object'",
			     what, sdb_bson_type_name(bson_iter_type(let)));
	}
	if (base != NULL && bson_iter_init(&it, base)) {
		bson_iter_t mine;

		while (bson_iter_next(&it)) {
			if (!bson_iter_recurse(let, &mine) || !bson_iter_find(&mine, bson_iter_key(&it))) {
				bson_append_iter(out, bson_iter_key(&it), -1, &it);
			}
		}
	}
	bson_iter_recurse(let, &it);
	while (rc == 0 && bson_iter_next(&it)) {
		expr *x = NULL;
		docbuild_node *v = NULL;
		const char *name = bson_iter_key(&it);

		rc = agg_let_name_ok(name, &e);
		if (rc == 0) {
			rc = agg_expr_parse(&it, &x, &e);
		}
		if (rc == 0 && expr_reads_doc(x)) {
			rc = efail(&e, 4890500, "Command let Expression tried to access a field, but this "
						"is not allowed because command let expressions run before "
						"the query examines any documents.");
		}
		if (rc == 0) {
			rc = agg_expr_eval(x, &empty, &v, &e);
		}
		if (rc == 0 && v != NULL) {
			docbuild_append(out, name, -1, v);
		} else if (rc == 0) {
			bson_append_null(out, name, -1);
		}
		docbuild_free(v);
		agg_expr_free(x);
	}
	if (rc != 0) {
		bson_reinit(out);
	}
	return rc;
}

/* ---- the public face for $expr in query filters (pipeline.h) ---- */

int sdb_expr_parse(const bson_iter_t *it, const bson_t *vars, sdb_expr **out, int *code,
		   char *err, size_t errlen)
{
	const ectx e = {.code = code, .err = err, .errlen = errlen, .vars = vars};
	expr *x = NULL;
	int rc;

	if (code != NULL) {
		*code = 0;
	}
	rc = agg_expr_parse(it, &x, &e);
	if (rc != 0) {
		agg_expr_free(x);
		*out = NULL;
		return rc;
	}
	*out = (sdb_expr *)x;
	return 0;
}

int sdb_expr_truthy(const sdb_expr *x, const bson_t *root, bool *out, int *code, char *err,
		    size_t errlen)
{
	const ectx e = {.code = code, .err = err, .errlen = errlen};
	docbuild_node *v = NULL;
	int rc = agg_expr_eval((const expr *)x, root, &v, &e);

	*out = rc == 0 && truthy(v);
	docbuild_free(v);
	return rc;
}

void sdb_expr_free(sdb_expr *x)
{
	agg_expr_free((expr *)x);
}
