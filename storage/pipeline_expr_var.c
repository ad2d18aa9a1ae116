/* The variables an aggregation expression binds while it is evaluated, and the operators
 * that bind them, with MongoDB 6.0's argument checks, codes and messages
 * (mongo/db/pipeline/expression.cpp ExpressionLet/Map/Filter/Reduce, variables.cpp):
 *
 *   {$let: {vars: {name: expr, ...}, in: expr}}         vars see only the outer scope
 *   {$map: {input, as: "name" (default "this"), in}}
 *   {$filter: {input, as, cond, limit}}
 *   {$reduce: {input, initialValue, in}}                 in sees $$this and $$value
 *
 * A bound name is resolved at parse time (agg_lvar_parse: a $$name that no enclosing
 * operator binds falls back to the command's `let` constants, else 17276), and read at
 * evaluation time from the chain of agg_var frames the binding operators push on the C
 * stack (ectx.lvars): the chains of parse and evaluation have the same shape, so the
 * innermost frame of a name is the binding the parser saw. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

enum { V_LET = 0, V_MAP, V_FILTER, V_REDUCE };

void agg_expr_push(expr *x, expr *arg)
{
	x->args = sdb_realloc(x->args, (x->n + 1) * sizeof *x->args);
	if (x->keys != NULL) {
		x->keys = sdb_realloc(x->keys, (x->n + 1) * sizeof *x->keys);
		x->keys[x->n] = NULL;
	}
	x->args[x->n++] = arg;
}

int agg_expr_parse_list(const char *name, const bson_iter_t *arg, expr *x, int min, int max,
			const ectx *e)
{
	int rc = 0;

	if (BSON_ITER_HOLDS_ARRAY(arg)) {
		bson_iter_t sub;

		bson_iter_recurse(arg, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = agg_expr_parse(&sub, &a, e);
			agg_expr_push(x, a);
		}
	} else {
		expr *a = NULL;

		rc = agg_expr_parse(arg, &a, e);
		agg_expr_push(x, a);
	}
	if (rc != 0) {
		return rc;
	}
	if ((int)x->n < min || (max >= 0 && (int)x->n > max)) {
		if (min == max) {
			return efail(e, 16020, "Expression %s takes exactly %d arguments. %zu were passed in.",
				     name, min, x->n);
		}
		if (max >= 0 && (int)x->n > max) {
			return efail(e, 16020, "Expression %s takes at most %d arguments, and %zu were passed in.",
				     name, max, x->n);
		}
		return efail(e, 16020, "Expression %s takes at least %d arguments, and %zu were passed in.",
			     name, min, x->n);
	}
	return 0;
}

/* MongoDB's Variables::uassertValidNameForUserRead: 16869 empty, 16870 a bad first
 * character (a letter or non-ASCII), 16871 a bad character. */
static int read_name_ok(const char *var, size_t len, const ectx *e)
{
	const unsigned char *c = (const unsigned char *)var;

	if (len == 0) {
		return efail(e, 16869, "empty variable names are not allowed");
	}
	if (!((c[0] >= 'a' && c[0] <= 'z') || (c[0] >= 'A' && c[0] <= 'Z') || (c[0] & 0x80))) {
		return efail(e, 16870, "'%.*s' starts with an invalid character for a variable name",
			     (int)len, var);
	}
	for (size_t i = 1; i < len; i++) {
		if (!((c[i] >= 'a' && c[i] <= 'z') || (c[i] >= 'A' && c[i] <= 'Z') ||
		      (c[i] >= '0' && c[i] <= '9') || c[i] == '_' || (c[i] & 0x80))) {
			return efail(e, 16871,
				     "'%.*s' contains an invalid character for a variable name: '%c'",
				     (int)len, var, c[i]);
		}
	}
	return 0;
}

static const agg_var *lookup(const agg_var *v, const char *name, size_t len)
{
	for (; v != NULL; v = v->up) {
		if (v->len == len && memcmp(v->name, name, len) == 0) {
			return v;
		}
	}
	return NULL;
}

int agg_lvar_parse(const char *var, size_t len, expr *x, const ectx *e)
{
	int rc = read_name_ok(var, len, e);

	if (rc != 0) {
		return rc;
	}
	const agg_var *v;
	bool repeated = false;

	for (v = e->lvars; v != NULL; v = v->up) {
		if (v->len == len && memcmp(v->name, var, len) == 0) {
			break;
		}
		repeated = repeated || v->loop;
	}
	if (v == NULL) {
		return 1;
	}
	x->kind = X_LVAR;
	x->path = sdb_strdup(var);
	if (v->use != NULL) {
		x->bind = v->use;
		x->rep = repeated;
	}
	return var[len] == '.' ? agg_field_path_ok(var + len + 1, e) : 0;
}

docbuild_node *agg_node_path(const docbuild_node *v, const char *path)
{
	if (v == NULL) {
		return NULL;
	}
	if (v->type == BSON_TYPE_DOCUMENT) {
		const char *dot = strchr(path, '.');
		size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
		const docbuild_node *kid = docbuild_field(v, path, len, NULL);
		docbuild_node *r;

		if (kid == NULL) {
			return NULL;
		}
		if (dot != NULL) {
			return agg_node_path(kid, dot + 1);
		}
		r = docbuild_clone(kid);
		docbuild_set_key(r, NULL);
		return r;
	}
	if (v->type == BSON_TYPE_ARRAY) {
		docbuild_node *arr = docbuild_new_array(NULL);

		for (size_t i = 0; i < v->n; i++) {
			if (v->kids[i]->type == BSON_TYPE_DOCUMENT || v->kids[i]->type == BSON_TYPE_ARRAY) {
				docbuild_node *r = agg_node_path(v->kids[i], path);

				if (r != NULL) {
					docbuild_push(arr, r);
				}
			}
		}
		return arr;
	}
	return NULL;
}

/* The binding of x's variable (NULL: 17276 in e), its value in *val. */
static const agg_var *lvar_find(const expr *x, const docbuild_node **val, const ectx *e)
{
	const char *dot = strchr(x->path, '.');
	size_t len = dot != NULL ? (size_t)(dot - x->path) : strlen(x->path);
	const agg_var *v = lookup(e->lvars, x->path, len);

	*val = NULL;
	if (v == NULL) {
		efail(e, 17276, "Use of undefined variable: %.*s", (int)len, x->path);
		return NULL;
	}
	*val = v->own != NULL ? *v->own : v->val;
	return v;
}

int agg_lvar_ref(const expr *x, const docbuild_node **out, const ectx *e)
{
	return lvar_find(x, out, e) != NULL ? 0 : SDB_EINVAL;
}

int agg_lvar_eval(const expr *x, docbuild_node **out, const ectx *e)
{
	const char *dot = strchr(x->path, '.');
	const docbuild_node *val;
	const agg_var *v = lvar_find(x, &val, e);

	*out = NULL;
	if (v == NULL) {
		return SDB_EINVAL;
	}
	if (dot != NULL) {
		*out = agg_node_path(val, dot + 1);
	} else if (x->take && v->own != NULL) {
		/* the only read of $reduce's $$value: the accumulator moves, not copied */
		*out = *v->own;
		*v->own = NULL;
	} else if (val != NULL) {
		*out = docbuild_clone(val);
		docbuild_set_key(*out, NULL);
	}
	return 0;
}

char *agg_node_str(const docbuild_node *v)
{
	bson_t b = BSON_INITIALIZER;
	char *json, *r;
	size_t len, start, end;

	if (v == NULL) {
		return sdb_strdup("missing");
	}
	docbuild_append(&b, "", 0, v);
	json = bson_as_relaxed_extended_json(&b, &len);
	bson_destroy(&b);
	/* { "" : VALUE } */
	start = strlen("{ \"\" : ");
	end = len >= 2 ? len - 2 : 0;
	r = json != NULL && len > start + 2 ? sdb_strndup(json + start, end - start)
					  : sdb_strdup("?");
	bson_free(json);
	return r;
}

/* ---- parsing ---- */

/* an iterator in an array (bson_iter_t alone is over-aligned for one) */
typedef struct {
	bson_iter_t it;
} iterbox;

/* The fields of an operator's object argument: names[i] -> *found[i] (an iterator copy;
 * found_set[i] tells it was there). Unknown field: code ucode "<umsg><field>". */
static int split_args(const bson_iter_t *arg, const char *const *names, size_t n,
		      iterbox *found, bool *found_set, int ucode, const char *umsg,
		      const ectx *e)
{
	bson_iter_t sub;

	bson_iter_recurse(arg, &sub);
	while (bson_iter_next(&sub)) {
		size_t i;

		for (i = 0; i < n; i++) {
			if (strcmp(bson_iter_key(&sub), names[i]) == 0) {
				break;
			}
		}
		if (i == n) {
			return efail(e, ucode, "%s%s", umsg, bson_iter_key(&sub));
		}
		found[i].it = sub;
		found_set[i] = true;
	}
	return 0;
}

static int parse_push(const bson_iter_t *it, expr *x, const ectx *e)
{
	expr *a = NULL;
	int rc = agg_expr_parse(it, &a, e);

	agg_expr_push(x, a);
	return rc;
}

/* {$let: {vars, in}}: args = the vars' expressions then `in`; keys = the vars' names. */
static int parse_let(const bson_iter_t *arg, expr *x, const ectx *e)
{
	static const char *const names[] = {"vars", "in"};
	iterbox f[2];
	bson_iter_t v;
	bool have[2] = {false, false};
	agg_var *frames = NULL;
	size_t nvars = 0;
	ectx sub = *e;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 16874, "$let only supports an object as its argument");
	}
	rc = split_args(arg, names, 2, f, have, 16875, "Unrecognized parameter to $let: ", e);
	if (rc == 0 && !have[0]) {
		rc = efail(e, 16876, "Missing 'vars' parameter to $let");
	}
	if (rc == 0 && !have[1]) {
		rc = efail(e, 16877, "Missing 'in' parameter to $let");
	}
	if (rc == 0 && !BSON_ITER_HOLDS_DOCUMENT(&f[0].it)) {
		rc = efail(e, 10065, "invalid parameter: expected an object (vars)");
	}
	if (rc != 0) {
		return rc;
	}
	x->keys = sdb_calloc(1, sizeof *x->keys);
	bson_iter_recurse(&f[0].it, &v);
	while (rc == 0 && bson_iter_next(&v)) {
		rc = parse_push(&v, x, e); /* the vars see the outer scope only */
		if (rc == 0) {
			x->keys[x->n - 1] = sdb_strdup(bson_iter_key(&v));
			nvars++;
		}
	}
	if (rc != 0) {
		return rc;
	}
	frames = sdb_calloc(nvars + 1, sizeof *frames);
	sub.lvars = e->lvars;
	for (size_t i = 0; i < nvars && rc == 0; i++) {
		rc = agg_let_name_ok(x->keys[i], e);
		frames[i].up = sub.lvars;
		frames[i].name = x->keys[i];
		frames[i].len = strlen(x->keys[i]);
		sub.lvars = &frames[i];
	}
	if (rc == 0) {
		rc = parse_push(&f[1].it, x, &sub);
	}
	free(frames);
	return rc;
}

/* $map {input, as, in} / $filter {input, as, cond, limit}: args = input, in/cond[, limit];
 * path = the variable's name. */
static int parse_map_filter(const bson_iter_t *arg, expr *x, bool filter, const ectx *e)
{
	static const char *const mnames[] = {"input", "as", "in"};
	static const char *const fnames[] = {"input", "as", "cond", "limit"};
	iterbox f[4];
	bool have[4] = {false, false, false, false};
	const char *op = filter ? "$filter" : "$map";
	agg_var frame = {0};
	ectx sub = *e;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, filter ? 28646 : 16878, "%s only supports an object as its argument",
			     op);
	}
	rc = filter ? split_args(arg, fnames, 4, f, have, 28647, "Unrecognized parameter to $filter: ", e)
		    : split_args(arg, mnames, 3, f, have, 16879, "Unrecognized parameter to $map: ", e);
	if (rc == 0 && !have[0]) {
		rc = efail(e, filter ? 28648 : 16880, "Missing 'input' parameter to %s", op);
	}
	if (rc == 0 && !have[2]) {
		rc = filter ? efail(e, 28650, "Missing 'cond' parameter to $filter")
			    : efail(e, 16882, "Missing 'in' parameter to $map");
	}
	if (rc == 0) {
		rc = parse_push(&f[0].it, x, e);
	}
	if (rc != 0) {
		return rc;
	}
	if (have[1]) {
		if (!BSON_ITER_HOLDS_UTF8(&f[1].it)) {
			/* BSONElement::str() of a non-string is "" */
			x->path = sdb_strdup("");
		} else {
			x->path = sdb_strdup(bson_iter_utf8(&f[1].it, NULL));
		}
	} else {
		x->path = sdb_strdup("this");
	}
	rc = agg_let_name_ok(x->path, e);
	if (rc != 0) {
		return rc;
	}
	frame.up = e->lvars;
	frame.name = x->path;
	frame.len = strlen(x->path);
	frame.loop = true;
	sub.lvars = &frame;
	rc = parse_push(&f[2].it, x, &sub);
	if (rc == 0 && filter && have[3]) {
		rc = parse_push(&f[3].it, x, e);
	}
	return rc;
}

/* How many reads of the binding u (X_LVAR nodes stamped with it) the tree t holds; *last:
 * the last one found. Sub-expressions all live in args (as agg_expr_free walks them), so
 * the walk sees exactly the nodes that will be evaluated. */
static int count_reads(const expr *t, const agg_var_use *u, expr **last)
{
	int n = 0;

	if (t == NULL) {
		return 0;
	}
	if (t->kind == X_LVAR && t->bind == u) {
		n++;
		*last = (expr *)t;
	}
	for (size_t i = 0; i < t->n; i++) {
		n += count_reads(t->args[i], u, last);
	}
	return n;
}

/* Forget the stamps of u in t (its address is a stack slot, reused by later parses). */
static void clear_reads(expr *t, const agg_var_use *u)
{
	if (t == NULL) {
		return;
	}
	if (t->kind == X_LVAR && t->bind == u) {
		t->bind = NULL;
	}
	for (size_t i = 0; i < t->n; i++) {
		clear_reads(t->args[i], u);
	}
}

/* Can the read r move the accumulator: a whole $$value (no path), outside any loop? */
static bool takeable(const expr *r)
{
	return r != NULL && !r->rep && strchr(r->path, '.') == NULL;
}

/* Mark the read of $reduce's $$value (binding u) in `in` that may move the accumulator:
 * - the only read of `in`, when whole and outside any loop: nothing else reads it;
 * - else, when `in` is a $cond or a $switch, e.g. {$cond: [{$lt: [{$size: "$$value"},
 *   10]}, {$concatArrays: ["$$value", ["$$this"]]}, "$$value"]}: its conditions are
 *   evaluated (into values of their own) before one branch runs, and only one branch runs,
 *   so a branch whose one read is whole and outside any loop may move it too; nothing
 *   reads $$value after it in that element. A branch with two reads moves nothing. */
static void mark_take(expr *in, const agg_var_use *u)
{
	expr *last = NULL;
	int total = count_reads(in, u, &last);

	if (total == 1) {
		if (takeable(last)) {
			last->take = true;
		}
		return;
	}
	if (total < 2 || in == NULL || in->kind != X_OP ||
	    (in->op != OP_COND && in->op != OP_SWITCH)) {
		return;
	}
	for (size_t i = 0; i < in->n; i++) {
		/* $cond: args if, then, else; $switch: case, then, ..., [default] */
		bool branch = in->op == OP_COND ? i > 0 : (i % 2 == 1 || i + 1 == in->n);
		expr *r = NULL;

		if (branch && count_reads(in->args[i], u, &r) == 1 && takeable(r)) {
			r->take = true;
		}
	}
}

/* {$reduce: {input, initialValue, in}}: args = input, initialValue, in. */
static int parse_reduce(const bson_iter_t *arg, expr *x, const ectx *e)
{
	static const char *const names[] = {"input", "initialValue", "in"};
	iterbox f[3];
	bool have[3] = {false, false, false};
	agg_var frames[2] = {{0}, {0}};
	agg_var_use use = {0};
	ectx sub = *e;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 40075, "$reduce requires an object as an argument, found: %s",
			     type_name(bson_iter_type(arg)));
	}
	rc = split_args(arg, names, 3, f, have, 40076, "$reduce found an unknown argument: ", e);
	if (rc == 0 && !have[0]) {
		rc = efail(e, 40077, "$reduce requires 'input' to be specified");
	}
	if (rc == 0 && !have[1]) {
		rc = efail(e, 40078, "$reduce requires 'initialValue' to be specified");
	}
	if (rc == 0 && !have[2]) {
		rc = efail(e, 40079, "$reduce requires 'in' to be specified");
	}
	if (rc == 0) {
		rc = parse_push(&f[0].it, x, e);
	}
	if (rc == 0) {
		rc = parse_push(&f[1].it, x, e);
	}
	if (rc != 0) {
		return rc;
	}
	frames[0] = (agg_var){.up = e->lvars, .name = "this", .len = 4, .loop = true};
	frames[1] = (agg_var){.up = &frames[0], .name = "value", .len = 5, .loop = true,
			      .use = &use};
	sub.lvars = &frames[1];
	rc = parse_push(&f[2].it, x, &sub);
	/* a read of $$value evaluated last in its element may move the accumulator
	 * (eval_reduce owns it between elements) instead of copying it: mark_take */
	if (x->n == 3) {
		if (rc == 0) {
			mark_take(x->args[2], &use);
		}
		clear_reads(x->args[2], &use);
	}
	return rc;
}

int agg_xvar_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e)
{
	if (strcmp(name, "$let") == 0) {
		x->op = OP_XVAR;
		x->sub = V_LET;
		return parse_let(arg, x, e);
	}
	if (strcmp(name, "$map") == 0 || strcmp(name, "$filter") == 0) {
		x->op = OP_XVAR;
		x->sub = name[1] == 'm' ? V_MAP : V_FILTER;
		return parse_map_filter(arg, x, x->sub == V_FILTER, e);
	}
	if (strcmp(name, "$reduce") == 0) {
		x->op = OP_XVAR;
		x->sub = V_REDUCE;
		return parse_reduce(arg, x, e);
	}
	return 1;
}

/* ---- evaluation ---- */

/* 146 when used bytes reach AGG_EXPR_MAX_BYTES. */
static int mem_over(const char *op, long long used, const ectx *e)
{
	if (used >= AGG_EXPR_MAX_BYTES) {
		return efail(e, 146, "%s would use too much memory (%lld bytes) and cannot spill to "
				     "disk. Memory limit: %lld bytes",
			     op, used, (long long)AGG_EXPR_MAX_BYTES);
	}
	return 0;
}

/* 146 when *used (plus v's size, v NULL = missing) exceeds AGG_EXPR_MAX_BYTES. */
static int mem_add(const char *op, long long *used, const docbuild_node *v, const ectx *e)
{
	*used += v != NULL ? (long long)node_size(v) : 0;
	return mem_over(op, *used, e);
}

static int eval_let(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	size_t nvars = x->n - 1;
	docbuild_node **vals = sdb_calloc(nvars + 1, sizeof *vals);
	agg_var *frames = sdb_calloc(nvars + 1, sizeof *frames);
	ectx sub = *e;
	long long used = 0;
	int rc = 0;

	for (size_t i = 0; i < nvars && rc == 0; i++) {
		rc = agg_expr_eval(x->args[i], root, &vals[i], e);
		if (rc == 0) {
			rc = mem_add("$let", &used, vals[i], e);
		}
	}
	for (size_t i = 0; i < nvars && rc == 0; i++) {
		frames[i] = (agg_var){.up = sub.lvars, .name = x->keys[i],
				      .len = strlen(x->keys[i]), .val = vals[i]};
		sub.lvars = &frames[i];
	}
	if (rc == 0) {
		rc = agg_expr_eval(x->args[nvars], root, out, &sub);
	}
	for (size_t i = 0; i < nvars; i++) {
		docbuild_free(vals[i]);
	}
	free(vals);
	free(frames);
	return rc;
}

/* $filter's limit (6.0): null = none; else an integral value in int32 > 0. */
static int filter_limit(const expr *x, const bson_t *root, int64_t *limit, const ectx *e)
{
	docbuild_node *l = NULL;
	int rc;

	*limit = -1;
	if (x->n < 3) {
		return 0;
	}
	rc = agg_expr_eval(x->args[2], root, &l, e);
	if (rc == 0 && !is_nullish(l)) {
		double d = is_number(l) ? num_double(l) : 0.5;
		char *json = agg_node_str(l);
		if (!(d == floor(d) && d >= (double)INT32_MIN && d <= (double)INT32_MAX)) {
			rc = efail(e, 327391,
				   "$filter: limit must be represented as a 32-bit integral value: %s",
				   json);
		} else if (d <= 0) {
			rc = efail(e, 327392, "$filter: limit must be greater than 0: %s", json);
		} else {
			*limit = (int64_t)d;
		}
		free(json);
	}
	docbuild_free(l);
	return rc;
}

static int eval_map_filter(const expr *x, const bson_t *root, docbuild_node **out,
			   const ectx *e)
{
	bool filter = x->sub == V_FILTER;
	docbuild_node *in = NULL, *res;
	agg_var frame = {.up = e->lvars, .name = x->path, .len = strlen(x->path)};
	ectx sub = *e;
	int64_t limit = -1;
	long long used = 0;
	bool own_in = true;
	int rc = agg_expr_eval_ref(x->args[0], root, &in, &own_in, e);

	if (rc != 0) {
		return rc;
	}
	if (is_nullish(in)) {
		agg_ref_free(in, own_in);
		*out = v_null();
		return 0;
	}
	if (in->type != BSON_TYPE_ARRAY) {
		rc = filter ? efail(e, 28651, "input to $filter must be an array not %s",
				    type_name(in->type))
			    : efail(e, 16883, "input to $map must be an array not %s",
				    type_name(in->type));
		agg_ref_free(in, own_in);
		return rc;
	}
	if (in->n == 0) {
		agg_ref_free(in, own_in);
		*out = docbuild_new_array(NULL);
		return 0;
	}
	if (filter) {
		rc = filter_limit(x, root, &limit, e);
	}
	sub.lvars = &frame;
	res = docbuild_new_array(NULL);
	for (size_t i = 0; i < in->n && rc == 0 && (limit < 0 || (int64_t)res->n < limit); i++) {
		docbuild_node *v = NULL;

		rc = agg_check_interrupt(i, e);
		if (rc != 0) {
			break;
		}
		frame.val = in->kids[i];
		rc = agg_expr_eval(x->args[1], root, &v, &sub);
		if (rc != 0) {
			break;
		}
		if (!filter) {
			rc = mem_add("$map", &used, v, e);
			docbuild_push(res, v != NULL ? v : v_null());
			continue;
		}
		if (truthy(v)) {
			docbuild_node *c = docbuild_clone(in->kids[i]);

			docbuild_set_key(c, NULL);
			docbuild_push(res, c);
		}
		docbuild_free(v);
	}
	agg_ref_free(in, own_in);
	if (rc != 0) {
		docbuild_free(res);
		return rc;
	}
	*out = res;
	return 0;
}

/* $reduce. The accumulator is read by reference: $$value lends it, or moves it when `in`
 * reads it once (expr.take), and a $concatArrays or $mergeObjects that receives it grows
 * it in place, so {$concatArrays: ["$$value", [...]]} and {$mergeObjects: ["$$value",
 * {...}]} cost what they add, not the accumulator's size
 * (mongod's Values are reference-counted: neither copies the array per element). Its size
 * against AGG_EXPR_MAX_BYTES is then counted from what was appended (agg_acc_size), and
 * walked afresh (node_size) after any other `in`. */
static int eval_reduce(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *in = NULL, *acc = NULL;
	agg_var frames[2] = {{.up = e->lvars, .name = "this", .len = 4},
			     {.up = &frames[0], .name = "value", .len = 5, .own = &acc}};
	agg_acc_size size = {0};
	bool grows = agg_expr_grows_acc(x->args[2]);
	bool own_in = true;
	ectx sub = *e;
	int rc = agg_expr_eval_ref(x->args[0], root, &in, &own_in, e);

	if (rc != 0) {
		return rc;
	}
	if (is_nullish(in)) {
		agg_ref_free(in, own_in);
		*out = v_null();
		return 0;
	}
	if (in->type != BSON_TYPE_ARRAY) {
		char *json = agg_node_str(in);

		rc = efail(e, 40080, "$reduce requires that 'input' be an array, found: %s", json);
		free(json);
		agg_ref_free(in, own_in);
		return rc;
	}
	rc = agg_expr_eval(x->args[1], root, &acc, e);
	if (rc == 0) {
		size.bytes = acc != NULL ? (long long)node_size(acc) : 0;
		rc = mem_over("$reduce", size.bytes, e);
	}
	sub.lvars = &frames[1];
	sub.acc = &size;
	for (size_t i = 0; i < in->n && rc == 0; i++) {
		docbuild_node *next = NULL, *prev = acc;

		rc = agg_check_interrupt(i, e);
		if (rc != 0) {
			break;
		}
		frames[0].val = in->kids[i];
		size.appended = false;
		size.stale = false;
		rc = agg_expr_eval(x->args[2], root, &next, &sub);
		docbuild_free(acc); /* NULL when `in` moved it */
		acc = next;
		if (size.idx_of != acc) {
			/* the merge index is for a node that is not the accumulator (any more):
			 * dropped before that node's address can be reused */
			free(size.idx_slots);
			size.idx_slots = NULL;
			size.idx_of = NULL;
		}
		if (rc == 0) {
			/* grown in place (bytes counted the append), or, for a $cond/$switch
			 * branch that is $$value itself, handed back unchanged: no walk */
			bool same = grows && !size.appended && !size.stale && acc == prev &&
				    acc != NULL;
			if (!same &&
			    !(grows && size.appended && !size.stale &&
			      (ntype(acc) == BSON_TYPE_ARRAY || ntype(acc) == BSON_TYPE_DOCUMENT))) {
				size.bytes = acc != NULL ? (long long)node_size(acc) : 0;
			}
			rc = mem_over("$reduce", size.bytes, e);
		}
	}
	agg_ref_free(in, own_in);
	free(size.idx_slots);
	if (rc != 0) {
		docbuild_free(acc);
		return rc;
	}
	*out = acc;
	return 0;
}

int agg_xvar_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	*out = NULL;
	switch (x->sub) {
	case V_LET: return eval_let(x, root, out, e);
	case V_MAP:
	case V_FILTER: return eval_map_filter(x, root, out, e);
	case V_REDUCE: return eval_reduce(x, root, out, e);
	default: return efail(e, C_INTERNAL, "unhandled variable expression");
	}
}
