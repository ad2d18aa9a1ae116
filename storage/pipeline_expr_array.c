/* The array and set operators of the aggregation expression language, with MongoDB 6.0's
 * argument counts, type rules, codes and messages (mongo/db/pipeline/expression.cpp):
 * $slice, $reverseArray, $range, $indexOfArray, $zip, $first / $last (the array forms;
 * the $group accumulators of those names are pipeline_parse.c's), $allElementsTrue,
 * $anyElementTrue, $setUnion, $setIntersection, $setDifference, $setEquals, $setIsSubset,
 * $sortArray (sortBy 1/-1 sorts whole values, a document sorts as $sort does), and the array
 * forms of $maxN, $minN, $firstN, $lastN (accumulator_multi.cpp).
 * Sets compare values as MongoDB's ValueComparator does (vcmp) and come out in that
 * order, as mongod's ordered ValueSet gives them. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "storage/sortspec.h"

enum {
	AR_SLICE = 0,
	AR_REVERSE,
	AR_RANGE,
	AR_INDEXOF,
	AR_ZIP,
	AR_FIRST,
	AR_LAST,
	AR_ALLTRUE,
	AR_ANYTRUE,
	AR_SETUNION,
	AR_SETINTER,
	AR_SETDIFF,
	AR_SETEQ,
	AR_SETSUB,
	AR_SORTARRAY,
	AR_MAXN,
	AR_MINN,
	AR_FIRSTN,
	AR_LASTN,
};

static const struct {
	const char *name;
	int sub;
	int min, max; /* argument counts; max -1 = any; min -1 = an object argument */
} arr_ops[] = {
	{"$slice", AR_SLICE, 2, 3},
	{"$reverseArray", AR_REVERSE, 1, 1},
	{"$range", AR_RANGE, 2, 3},
	{"$indexOfArray", AR_INDEXOF, 2, 4},
	{"$zip", AR_ZIP, -1, -1},
	{"$first", AR_FIRST, 1, 1},
	{"$last", AR_LAST, 1, 1},
	{"$allElementsTrue", AR_ALLTRUE, 1, 1},
	{"$anyElementTrue", AR_ANYTRUE, 1, 1},
	{"$setUnion", AR_SETUNION, 0, -1},
	{"$setIntersection", AR_SETINTER, 0, -1},
	{"$setDifference", AR_SETDIFF, 2, 2},
	{"$setEquals", AR_SETEQ, 0, -1},
	{"$setIsSubset", AR_SETSUB, 2, 2},
	{"$sortArray", AR_SORTARRAY, -1, -1},
	{"$maxN", AR_MAXN, -1, -1},
	{"$minN", AR_MINN, -1, -1},
	{"$firstN", AR_FIRSTN, -1, -1},
	{"$lastN", AR_LASTN, -1, -1},
};

/* The largest $range: MongoDB's internalQueryMaxRangeBytes (100 MiB), against its estimate
 * sizeof(std::vector<Value>) + length * sizeof(Value). */
#define RANGE_MAX_BYTES (100LL * 1024 * 1024)
#define C_EXCEEDED_MEMORY_LIMIT 146

/* {$zip: {inputs: [...], useLongestLength: bool, defaults: [...]}}: args = the inputs, a
 * NULL separator, the defaults; x->root = useLongestLength. */
static int parse_zip(const bson_iter_t *arg, expr *x, const ectx *e)
{
	bson_iter_t sub, inputs, defaults;
	bool have_inputs = false, have_defaults = false;
	size_t n_in = 0, n_def = 0;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 34460, "$zip only supports an object as an argument, found %s",
			     type_name(bson_iter_type(arg)));
	}
	bson_iter_recurse(arg, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (strcmp(k, "inputs") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&sub)) {
				return efail(e, 34461, "inputs must be an array of expressions, found %s",
					     type_name(bson_iter_type(&sub)));
			}
			inputs = sub;
			have_inputs = true;
		} else if (strcmp(k, "defaults") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&sub)) {
				return efail(e, 34462, "defaults must be an array of expressions, found %s",
					     type_name(bson_iter_type(&sub)));
			}
			defaults = sub;
			have_defaults = true;
		} else if (strcmp(k, "useLongestLength") == 0) {
			if (!BSON_ITER_HOLDS_BOOL(&sub)) {
				/* mongod names the type of the whole argument here */
				return efail(e, 34463, "useLongestLength must be a bool, found %s",
					     type_name(bson_iter_type(arg)));
			}
			x->root = bson_iter_bool(&sub);
		} else {
			return efail(e, 34464, "$zip found an unknown argument: %s", k);
		}
	}
	if (have_inputs) {
		bson_iter_recurse(&inputs, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = agg_expr_parse(&sub, &a, e);
			agg_expr_push(x, a);
			n_in++;
		}
	}
	agg_expr_push(x, NULL);
	if (rc == 0 && have_defaults) {
		bson_iter_recurse(&defaults, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = agg_expr_parse(&sub, &a, e);
			agg_expr_push(x, a);
			n_def++;
		}
	}
	if (rc != 0) {
		return rc;
	}
	if (n_in == 0) {
		return efail(e, 34465, "$zip requires at least one input array");
	}
	if (!x->root && n_def > 0) {
		return efail(e, 34466, "cannot specify defaults unless useLongestLength is true");
	}
	if (n_def > 0 && n_def != n_in) {
		return efail(e, 34467, "defaults and inputs must have the same length");
	}
	return 0;
}

/* {$sortArray: {input, sortBy}}: args = input; sortBy a document: x->var = a copy of it
 * (a $sort specification); a number: x->var NULL and x->root = descending. */
static int parse_sortarray(const bson_iter_t *arg, expr *x, const ectx *e)
{
	bson_iter_t sub, by;
	bool have_in = false, have_by = false;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 2942500, "$sortArray requires an object as an argument, found: %s",
			     type_name(bson_iter_type(arg)));
	}
	bson_iter_recurse(arg, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (strcmp(k, "input") == 0) {
			expr *a = NULL;

			if (have_in) {
				agg_expr_free(x->args[0]);
				x->n = 0;
			}
			rc = agg_expr_parse(&sub, &a, e);
			agg_expr_push(x, a);
			have_in = true;
		} else if (strcmp(k, "sortBy") == 0) {
			by = sub;
			have_by = true;
		} else {
			rc = efail(e, 2942501, "$sortArray found an unknown argument: %s", k);
		}
	}
	if (rc == 0 && !have_in) {
		rc = efail(e, 2942502, "$sortArray requires 'input' to be specified");
	}
	if (rc == 0 && !have_by) {
		rc = efail(e, 2942503, "$sortArray requires 'sortBy' to be specified");
	}
	if (rc != 0) {
		return rc;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(&by)) {
		const uint8_t *data;
		uint32_t len;
		bson_t spec;
		sdb_sortspec *ss = NULL;

		bson_iter_document(&by, &len, &data);
		if (!bson_init_static(&spec, data, len)) {
			return efail(e, C_BAD_VALUE, "$sortArray: corrupt sortBy");
		}
		if (bson_count_keys(&spec) == 0) {
			return efail(e, 15976, "$sortArray sort stage must have at least one sort key");
		}
		rc = sdb_sortspec_parse(&spec, &ss, e->code, e->err, e->errlen);
		if (rc == 0 && sdb_sortspec_natural(ss) != 0) {
			rc = efail(e, C_BAD_VALUE, "$natural is not allowed in $sortArray's sortBy");
		}
		sdb_sortspec_free(ss);
		if (rc != 0) {
			return SDB_EINVAL;
		}
		x->var = bson_copy(&spec);
		return 0;
	}
	if (BSON_ITER_HOLDS_NUMBER(&by)) {
		double d = bson_iter_as_double(&by);

		if (d == 1 || d == -1) {
			x->root = d < 0;
			return 0;
		}
	}
	return efail(e, 2942506, "The $sort element value must be either 1 or -1");
}

/* {$maxN|$minN|$firstN|$lastN: {n, input}} (the array forms, MongoDB 6.0's
 * accumulator_multi.cpp AccumulatorN::parseArgs): args = n, input. */
static int parse_n(const bson_iter_t *arg, expr *x, const ectx *e)
{
	bson_iter_t sub;
	expr *n = NULL, *in = NULL;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		char *s;
		docbuild_node *v = docbuild_from_iter(arg, false);

		s = agg_node_str(v);
		docbuild_free(v);
		rc = efail(e, x->sub == AR_MAXN || x->sub == AR_MINN ? 5787900 : 5787801,
			   "specification must be an object; found %s: %s", bson_iter_key(arg), s);
		free(s);
		return rc;
	}
	bson_iter_recurse(arg, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		expr **slot = strcmp(k, "n") == 0 ? &n : strcmp(k, "input") == 0 ? &in : NULL;

		if (slot == NULL) {
			rc = efail(e, 5787901, "Unknown argument for 'n' operator: %s", k);
			break;
		}
		agg_expr_free(*slot);
		*slot = NULL;
		rc = agg_expr_parse(&sub, slot, e);
	}
	if (rc == 0 && n == NULL) {
		rc = efail(e, 5787906, "Missing value for 'n'");
	}
	if (rc == 0 && in == NULL) {
		rc = efail(e, 5787907, "Missing value for 'input'");
	}
	agg_expr_push(x, n);
	agg_expr_push(x, in);
	return rc;
}

int agg_xarr_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e)
{
	for (size_t i = 0; i < sizeof arr_ops / sizeof arr_ops[0]; i++) {
		int rc;

		if (strcmp(arr_ops[i].name, name) != 0) {
			continue;
		}
		x->op = OP_XARR;
		x->sub = arr_ops[i].sub;
		if (x->sub == AR_ZIP) {
			return parse_zip(arg, x, e);
		}
		if (x->sub == AR_SORTARRAY) {
			return parse_sortarray(arg, x, e);
		}
		if (x->sub >= AR_MAXN) {
			return parse_n(arg, x, e);
		}
		rc = agg_expr_parse_list(name, arg, x, arr_ops[i].min, arr_ops[i].max, e);
		if (rc == 0 && x->sub == AR_SETEQ && x->n < 2) {
			rc = efail(e, 17045, "$setEquals needs at least two arguments had: %zu", x->n);
		}
		return rc;
	}
	return 1;
}

/* ---- helpers ---- */

static docbuild_node *kid_copy(const docbuild_node *n)
{
	docbuild_node *c = docbuild_clone(n);

	docbuild_set_key(c, NULL);
	return c;
}

/* an element being sorted, with its position: equal values keep their input order */
typedef struct {
	docbuild_node *n;
	size_t idx;
} pos_node;

static int cmp_pos_nodes(const void *pa, const void *pb)
{
	const pos_node *a = pa, *b = pb;
	int c = vcmp(a->n, b->n);

	return c != 0 ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

/* Sort the n nodes t in MongoDB order, stably: of equal values (1, 1.0, NumberLong(1)) the
 * one that came first stays first, as the first inserted stays in mongod's ValueSet (a
 * std::set: insert keeps the element already there). qsort alone is not stable (glibc's
 * is a merge sort only while it can allocate). */
static void sort_nodes_stable(docbuild_node **t, size_t n)
{
	pos_node *p = sdb_calloc(n + 1, sizeof *p);

	for (size_t i = 0; i < n; i++) {
		p[i] = (pos_node){t[i], i};
	}
	qsort(p, n, sizeof *p, cmp_pos_nodes);
	for (size_t i = 0; i < n; i++) {
		t[i] = p[i].n;
	}
	free(p);
}

/* The distinct elements of array node a, sorted, the first of equal ones kept (borrowed
 * pointers into a; free the array only). */
static docbuild_node **sorted_set(const docbuild_node *a, size_t *n)
{
	docbuild_node **s = sdb_calloc(a->n + 1, sizeof *s);
	size_t k = 0;

	if (a->n > 0) {
		memcpy(s, a->kids, a->n * sizeof *s);
	}
	sort_nodes_stable(s, a->n);
	for (size_t i = 0; i < a->n; i++) {
		if (k == 0 || vcmp(s[k - 1], s[i]) != 0) {
			s[k++] = s[i];
		}
	}
	*n = k;
	return s;
}

static bool set_has(docbuild_node *const *s, size_t n, const docbuild_node *v)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = vcmp(s[mid], v);

		if (c == 0) {
			return true;
		}
		if (c < 0) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return false;
}

/* ---- evaluation ---- */

static int eval_slice(docbuild_node **vals, size_t n, docbuild_node **out, const ectx *e)
{
	docbuild_node *arr = vals[0];
	int32_t a2 = 0, count = 0;
	size_t start, end, len;

	if (is_nullish(arr) || is_nullish(vals[1])) {
		*out = v_null();
		return 0;
	}
	if (arr->type != BSON_TYPE_ARRAY) {
		return efail(e, 28724, "First argument to $slice must be an array, but is of type: %s",
			     type_name(arr->type));
	}
	if (!is_number(vals[1])) {
		return efail(e, 28725, "Second argument to $slice must be a numeric value, but is of type: %s",
			     type_name(vals[1]->type));
	}
	if (!agg_integral32(vals[1], &a2)) {
		return efail(e, 28726, "Second argument to $slice can't be represented as a 32-bit integer: %g",
			     num_double(vals[1]));
	}
	len = arr->n;
	if (n == 2) {
		start = 0;
		end = len;
		if (a2 >= 0) {
			end = (size_t)a2 < len ? (size_t)a2 : len;
		} else {
			start = (int64_t)len + a2 > 0 ? (size_t)((int64_t)len + a2) : 0;
		}
	} else {
		if (a2 < 0) {
			start = (int64_t)len + a2 > 0 ? (size_t)((int64_t)len + a2) : 0;
		} else {
			start = (size_t)a2 < len ? (size_t)a2 : len;
		}
		if (is_nullish(vals[2])) {
			*out = v_null();
			return 0;
		}
		if (!is_number(vals[2])) {
			return efail(e, 28727, "Third argument to $slice must be numeric, but is of type: %s",
				     type_name(vals[2]->type));
		}
		if (!agg_integral32(vals[2], &count)) {
			return efail(e, 28728, "Third argument to $slice can't be represented as a 32-bit integer: %g",
				     num_double(vals[2]));
		}
		if (count <= 0) {
			return efail(e, 28729, "Third argument to $slice must be positive: %d", count);
		}
		end = (size_t)count < len - start ? start + (size_t)count : len;
	}
	*out = docbuild_new_array(NULL);
	for (size_t i = start; i < end; i++) {
		docbuild_push(*out, kid_copy(arr->kids[i]));
	}
	return 0;
}

static int eval_range(docbuild_node **vals, size_t n, docbuild_node **out, const ectx *e)
{
	int32_t start = 0, end = 0, step = 1;
	int64_t length, need;

	if (!is_number(vals[0])) {
		return efail(e, 34443, "$range requires a numeric starting value, found value of type: %s",
			     type_name(ntype(vals[0])));
	}
	if (!agg_integral32(vals[0], &start)) {
		char *s = agg_node_str(vals[0]);
		int rc = efail(e, 34444, "$range requires a starting value that can be represented as a 32-bit integer, found value: %s",
			       s);

		free(s);
		return rc;
	}
	if (!is_number(vals[1])) {
		return efail(e, 34445, "$range requires a numeric ending value, found value of type: %s",
			     type_name(ntype(vals[1])));
	}
	if (!agg_integral32(vals[1], &end)) {
		char *s = agg_node_str(vals[1]);
		int rc = efail(e, 34446, "$range requires an ending value that can be represented as a 32-bit integer, found value: %s",
			       s);

		free(s);
		return rc;
	}
	if (n == 3) {
		if (!is_number(vals[2])) {
			return efail(e, 34447, "$range requires a numeric step value, found value of type:%s",
				     type_name(ntype(vals[2])));
		}
		if (!agg_integral32(vals[2], &step)) {
			char *s = agg_node_str(vals[2]);
			int rc = efail(e, 34448, "$range requires a step value that can be represented as a 32-bit integer, found value: %s",
				       s);

			free(s);
			return rc;
		}
		if (step == 0) {
			return efail(e, 34449, "$range requires a non-zero step value");
		}
	}
	length = ((int64_t)end - start) / step;
	length = length >= 0 ? length + 1 : 0;
	/* what the array costs here (a node per element and its slot), not mongod's 16-byte
	 * Value: 1,000,000 elements raised a shard's RSS by 150 MB under MongoDB's estimate */
	need = 24 + length * (int64_t)(sizeof(docbuild_node) + sizeof(docbuild_node *) + 16);
	if (need >= RANGE_MAX_BYTES) {
		return efail(e, C_EXCEEDED_MEMORY_LIMIT,
			     "$range would use too much memory (%lld bytes) and cannot spill to disk. "
			     "Memory limit: %lld bytes",
			     (long long)need, (long long)RANGE_MAX_BYTES);
	}
	*out = docbuild_new_array(NULL);
	for (int64_t cur = start, i = 0; step > 0 ? cur < end : cur > end; cur += step, i++) {
		if (agg_check_interrupt((size_t)i, e) != 0) {
			return SDB_ECANCELED; /* the caller frees *out */
		}
		docbuild_push(*out, v_int32((int32_t)cur));
	}
	return 0;
}

static int index_arg(const docbuild_node *v, const char *what, int32_t *out, const ectx *e)
{
	char *s;
	int rc;

	if (!agg_integral32(v, out)) {
		s = agg_node_str(v);
		rc = efail(e, 40096, "$indexOfArrayrequires an integral %s, found a value of type: %s, with value: %s",
			   what, type_name(ntype(v)), s);
		free(s);
		return rc;
	}
	if (*out < 0) {
		s = agg_node_str(v);
		rc = efail(e, 40097, "$indexOfArray requires a nonnegative %s, found: %s", what, s);
		free(s);
		return rc;
	}
	return 0;
}

static int eval_indexof(docbuild_node **vals, size_t n, docbuild_node **out, const ectx *e)
{
	int32_t from = 0, to;
	int rc;

	if (is_nullish(vals[0])) {
		*out = v_null();
		return 0;
	}
	if (vals[0]->type != BSON_TYPE_ARRAY) {
		return efail(e, 40090, "$indexOfArray requires an array as a first argument, found: %s",
			     type_name(vals[0]->type));
	}
	to = vals[0]->n > INT32_MAX ? INT32_MAX : (int32_t)vals[0]->n;
	if (n > 2 && (rc = index_arg(vals[2], "starting index", &from, e)) != 0) {
		return rc;
	}
	if (n > 3) {
		int32_t t;

		if ((rc = index_arg(vals[3], "ending index", &t, e)) != 0) {
			return rc;
		}
		to = t < to ? t : to;
	}
	for (int32_t i = from; i < to; i++) {
		if (vcmp(vals[0]->kids[i], vals[1]) == 0 && vals[1] != NULL) {
			*out = v_int32(i);
			return 0;
		}
	}
	*out = v_int32(-1);
	return 0;
}

static int eval_zip(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	size_t n_in = 0, rows = 0;
	bool have_def;

	while (x->args[n_in] != NULL) {
		n_in++;
	}
	have_def = x->n > n_in + 1;
	for (size_t i = 0; i < n_in; i++) {
		if (is_nullish(vals[i])) {
			*out = v_null();
			return 0;
		}
		if (vals[i]->type != BSON_TYPE_ARRAY) {
			char *s = agg_node_str(vals[i]);
			int rc = efail(e, 34468, "$zip found a non-array expression in input: %s", s);

			free(s);
			return rc;
		}
		if (i == 0 || (x->root ? vals[i]->n > rows : vals[i]->n < rows)) {
			rows = vals[i]->n;
		}
	}
	*out = docbuild_new_array(NULL);
	for (size_t r = 0; r < rows; r++) {
		docbuild_node *row;

		if (agg_check_interrupt(r, e) != 0) {
			return SDB_ECANCELED; /* the caller frees *out */
		}
		row = docbuild_new_array(NULL);

		for (size_t i = 0; i < n_in; i++) {
			if (r < vals[i]->n) {
				docbuild_push(row, kid_copy(vals[i]->kids[r]));
			} else if (have_def && vals[n_in + 1 + i] != NULL) {
				docbuild_push(row, kid_copy(vals[n_in + 1 + i]));
			} else {
				docbuild_push(row, v_null());
			}
		}
		docbuild_push(*out, row);
	}
	return 0;
}

/* one element of a $sortArray: the node, its document (for a sortBy pattern; {} when the
 * element is not a document, so that its fields sort as missing) and its position (the
 * sort is stable, as std::stable_sort) */
typedef struct {
	const docbuild_node *n;
	bson_t doc;
	size_t idx;
	const sdb_sortspec *ss;
	int dir;
} sort_item;

static int cmp_sort_items(const void *pa, const void *pb)
{
	const sort_item *a = pa, *b = pb;
	int c = a->ss != NULL ? sdb_sortspec_cmp(a->ss, &a->doc, &b->doc)
			      : vcmp(a->n, b->n) * a->dir;

	if (c != 0) {
		return c;
	}
	return (a->idx > b->idx) - (a->idx < b->idx);
}

static int eval_sortarray(const expr *x, docbuild_node **vals, docbuild_node **out,
			  const ectx *e)
{
	sdb_sortspec *ss = NULL;
	sort_item *items;
	size_t n;

	if (is_nullish(vals[0])) {
		*out = v_null();
		return 0;
	}
	if (vals[0]->type != BSON_TYPE_ARRAY) {
		return efail(e, 2942504, "The input argument to $sortArray must be an array, but was of type: %s",
			     type_name(vals[0]->type));
	}
	if (x->var != NULL && sdb_sortspec_parse(x->var, &ss, e->code, e->err, e->errlen) != 0) {
		return SDB_EINVAL;
	}
	n = vals[0]->n;
	items = sdb_calloc(n + 1, sizeof *items);
	for (size_t i = 0; i < n; i++) {
		if (agg_check_interrupt(i, e) != 0) {
			for (size_t k = 0; k < i; k++) {
				bson_destroy(&items[k].doc);
			}
			free(items);
			sdb_sortspec_free(ss);
			return SDB_ECANCELED;
		}
		items[i] = (sort_item){.n = vals[0]->kids[i], .idx = i, .ss = ss,
				       .dir = x->root ? -1 : 1};
		if (ss != NULL && items[i].n->type == BSON_TYPE_DOCUMENT) {
			docbuild_to_bson(items[i].n, &items[i].doc);
		} else {
			bson_init(&items[i].doc);
		}
	}
	qsort(items, n, sizeof *items, cmp_sort_items);
	*out = docbuild_new_array(NULL);
	for (size_t i = 0; i < n; i++) {
		docbuild_push(*out, kid_copy(items[i].n));
		bson_destroy(&items[i].doc);
	}
	free(items);
	sdb_sortspec_free(ss);
	return 0;
}

/* $maxN / $minN (nullish elements ignored; descending / ascending), $firstN / $lastN: n
 * checked as AccumulatorN::validateN (5787902 not a number, 5787903 not integral, 5787908
 * not positive), the input an array (5788200). */
static int eval_n(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	const docbuild_node *nv = vals[0], *in = vals[1];
	docbuild_node **items;
	size_t k = 0, count, from = 0;
	double d;
	int64_t n;

	if (!is_number(nv)) {
		char *s = agg_node_str(nv);
		int rc = efail(e, 5787902, "Value for 'n' must be of integral type, but found %s", s);

		free(s);
		return rc;
	}
	d = num_double(nv);
	n = nv->type == BSON_TYPE_INT64 ? nv->value.value.v_int64
	    : d >= 9.3e18 ? INT64_MAX
	    : d <= -9.3e18 ? INT64_MIN
	    : (int64_t)d;
	if (d != d || (nv->type != BSON_TYPE_INT64 && (double)n != d)) {
		char *s = agg_node_str(nv);
		int rc = efail(e, 5787903, "Value for 'n' must be of integral type, but found %s", s);

		free(s);
		return rc;
	}
	if (n <= 0) {
		return efail(e, 5787908, "'n' must be greater than 0, found %lld", (long long)n);
	}
	if (ntype(in) != BSON_TYPE_ARRAY) {
		return efail(e, 5788200, "Input must be an array");
	}
	items = sdb_calloc(in->n + 1, sizeof *items);
	for (size_t i = 0; i < in->n; i++) {
		if ((x->sub == AR_MAXN || x->sub == AR_MINN) && is_nullish(in->kids[i])) {
			continue;
		}
		items[k++] = in->kids[i];
	}
	if (x->sub == AR_MAXN || x->sub == AR_MINN) {
		/* MongoDB's ordered multiset: equal values are kept in input order and a value
		 * equal to the worst kept one does not replace it; $maxN reads it backwards */
		sort_item *si = sdb_calloc(k + 1, sizeof *si);
		int dir = x->sub == AR_MAXN ? -1 : 1;

		for (size_t i = 0; i < k; i++) {
			si[i] = (sort_item){.n = items[i], .idx = i, .dir = dir};
		}
		qsort(si, k, sizeof *si, cmp_sort_items);
		for (size_t i = 0; i < k; i++) {
			items[i] = (docbuild_node *)si[i].n;
		}
		free(si);
		count = (uint64_t)n < k ? (size_t)n : k;
		for (size_t i = 0; x->sub == AR_MAXN && i < count;) {
			size_t j = i + 1;

			while (j < count && vcmp(items[i], items[j]) == 0) {
				j++;
			}
			for (size_t a = i, b = j - 1; a < b; a++, b--) {
				docbuild_node *t = items[a];

				items[a] = items[b];
				items[b] = t;
			}
			i = j;
		}
	}
	count = (uint64_t)n < k ? (size_t)n : k;
	if (x->sub == AR_LASTN) {
		from = k - count;
	}
	*out = docbuild_new_array(NULL);
	for (size_t i = from; i < from + count; i++) {
		docbuild_push(*out, kid_copy(items[i]));
	}
	free(items);
	return 0;
}

static int eval_set(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	docbuild_node **s = NULL, **t = NULL;
	size_t ns = 0, nt = 0;

	switch (x->sub) {
	case AR_SETUNION:
	case AR_SETINTER: {
		bool inter = x->sub == AR_SETINTER;
		docbuild_node *all = docbuild_new_array(NULL);

		for (size_t i = 0; i < x->n; i++) {
			if (is_nullish(vals[i])) {
				docbuild_free(all);
				*out = v_null();
				return 0;
			}
			if (vals[i]->type != BSON_TYPE_ARRAY) {
				docbuild_free(all);
				return efail(e, inter ? 17047 : 17043,
					     inter ? "All operands of $setIntersection must be arrays. One argument is of type: %s"
						   : "All operands of $setUnion must be arrays. One argument is of type: %s",
					     type_name(vals[i]->type));
			}
		}
		/* all: the union (or the intersection) as a sorted set */
		if (!inter) {
			size_t total = 0, k = 0;

			for (size_t i = 0; i < x->n; i++) {
				total += vals[i]->n;
			}
			t = sdb_calloc(total + 1, sizeof *t);
			for (size_t i = 0; i < x->n; i++) {
				if (vals[i]->n > 0) {
					memcpy(t + k, vals[i]->kids, vals[i]->n * sizeof *t);
				}
				k += vals[i]->n;
			}
			sort_nodes_stable(t, total);
			for (size_t i = 0; i < total; i++) {
				if (agg_check_interrupt(i, e) != 0) {
					free(t);
					docbuild_free(all);
					return SDB_ECANCELED;
				}
				if (i == 0 || vcmp(t[i - 1], t[i]) != 0) {
					docbuild_push(all, kid_copy(t[i]));
				}
			}
			free(t);
		}
		for (size_t i = 0; inter && i < x->n; i++) {
			t = sorted_set(vals[i], &nt);
			if (i == 0) {
				for (size_t k = 0; k < nt; k++) {
					docbuild_push(all, kid_copy(t[k]));
				}
			} else {
				docbuild_node *keep = docbuild_new_array(NULL);

				for (size_t k = 0; k < all->n; k++) {
					if (agg_check_interrupt(k, e) != 0) {
						free(t);
						docbuild_free(keep);
						docbuild_free(all);
						return SDB_ECANCELED;
					}
					if (set_has(t, nt, all->kids[k])) {
						docbuild_push(keep, kid_copy(all->kids[k]));
					}
				}
				docbuild_free(all);
				all = keep;
			}
			free(t);
		}
		*out = all;
		return 0;
	}
	case AR_SETDIFF: {
		for (int i = 0; i < 2; i++) {
			if (is_nullish(vals[i])) {
				*out = v_null();
				return 0;
			}
		}
		for (int i = 0; i < 2; i++) {
			if (vals[i]->type != BSON_TYPE_ARRAY) {
				return efail(e, i == 0 ? 17048 : 17049,
					     "both operands of $setDifference must be arrays. %s argument is of type: %s",
					     i == 0 ? "First" : "Second", type_name(vals[i]->type));
			}
		}
		/* the first of each distinct value of the first array that the second lacks, in
		 * the first array's order */
		{
			size_t n0 = vals[0]->n;
			sort_item *si = sdb_calloc(n0 + 1, sizeof *si);
			bool *keep = sdb_calloc(n0 + 1, sizeof *keep);

			s = sorted_set(vals[1], &ns);
			for (size_t k = 0; k < n0; k++) {
				si[k] = (sort_item){.n = vals[0]->kids[k], .idx = k, .dir = 1};
			}
			qsort(si, n0, sizeof *si, cmp_sort_items);
			for (size_t k = 0; k < n0; k++) {
				if ((k == 0 || vcmp(si[k - 1].n, si[k].n) != 0) && !set_has(s, ns, si[k].n)) {
					keep[si[k].idx] = true;
				}
			}
			*out = docbuild_new_array(NULL);
			for (size_t k = 0; k < n0; k++) {
				if (keep[k]) {
					docbuild_push(*out, kid_copy(vals[0]->kids[k]));
				}
			}
			free(keep);
			free(si);
			free(s);
		}
		return 0;
	}
	case AR_SETEQ: {
		bool eq = true;

		for (size_t i = 0; i < x->n; i++) {
			if (ntype(vals[i]) != BSON_TYPE_ARRAY) {
				free(s);
				return efail(e, 17044, "All operands of $setEquals must be arrays. One argument is of type: %s",
					     type_name(ntype(vals[i])));
			}
			if (i == 0) {
				s = sorted_set(vals[0], &ns);
				continue;
			}
			t = sorted_set(vals[i], &nt);
			if (eq && nt != ns) {
				eq = false;
			}
			for (size_t k = 0; eq && k < nt; k++) {
				eq = vcmp(s[k], t[k]) == 0;
			}
			free(t);
		}
		free(s);
		*out = v_bool(eq);
		return 0;
	}
	case AR_SETSUB: {
		bool sub = true;

		if (ntype(vals[0]) != BSON_TYPE_ARRAY) {
			return efail(e, 17046, "both operands of $setIsSubset must be arrays. First argument is of type: %s",
				     type_name(ntype(vals[0])));
		}
		if (ntype(vals[1]) != BSON_TYPE_ARRAY) {
			return efail(e, 17042, "both operands of $setIsSubset must be arrays. Second argument is of type: %s",
				     type_name(ntype(vals[1])));
		}
		s = sorted_set(vals[1], &ns);
		for (size_t k = 0; sub && k < vals[0]->n; k++) {
			sub = set_has(s, ns, vals[0]->kids[k]);
		}
		free(s);
		*out = v_bool(sub);
		return 0;
	}
	default:
		return efail(e, C_INTERNAL, "unhandled set expression");
	}
}

static int eval_one(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	switch (x->sub) {
	case AR_SLICE: return eval_slice(vals, x->n, out, e);
	case AR_RANGE: return eval_range(vals, x->n, out, e);
	case AR_INDEXOF: return eval_indexof(vals, x->n, out, e);
	case AR_ZIP: return eval_zip(x, vals, out, e);
	case AR_SORTARRAY: return eval_sortarray(x, vals, out, e);
	case AR_MAXN:
	case AR_MINN:
	case AR_FIRSTN:
	case AR_LASTN: return eval_n(x, vals, out, e);
	case AR_REVERSE:
		if (is_nullish(vals[0])) {
			*out = v_null();
			return 0;
		}
		if (vals[0]->type != BSON_TYPE_ARRAY) {
			return efail(e, 34435, "The argument to $reverseArray must be an array, but was of type: %s",
				     type_name(vals[0]->type));
		}
		*out = docbuild_new_array(NULL);
		for (size_t i = vals[0]->n; i > 0; i--) {
			docbuild_push(*out, kid_copy(vals[0]->kids[i - 1]));
		}
		return 0;
	case AR_FIRST:
	case AR_LAST:
		/* ExpressionFirst/Last: arrayElemAt(array, 0 / -1) */
		if (is_nullish(vals[0])) {
			*out = v_null();
			return 0;
		}
		if (vals[0]->type != BSON_TYPE_ARRAY) {
			return efail(e, 28689, "%s's first argument must be an array, but is %s",
				     x->sub == AR_FIRST ? "$first" : "$last", type_name(vals[0]->type));
		}
		if (vals[0]->n > 0) {
			*out = kid_copy(vals[0]->kids[x->sub == AR_FIRST ? 0 : vals[0]->n - 1]);
		}
		return 0;
	case AR_ALLTRUE:
	case AR_ANYTRUE: {
		bool all = x->sub == AR_ALLTRUE;

		if (ntype(vals[0]) != BSON_TYPE_ARRAY) {
			return efail(e, all ? 17040 : 17041, "%s's argument must be an array, but is %s",
				     all ? "$allElementsTrue" : "$anyElementTrue",
				     type_name(ntype(vals[0])));
		}
		for (size_t i = 0; i < vals[0]->n; i++) {
			if (truthy(vals[0]->kids[i]) != all) {
				*out = v_bool(!all);
				return 0;
			}
		}
		*out = v_bool(all);
		return 0;
	}
	default:
		return eval_set(x, vals, out, e);
	}
}

int agg_xarr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node **vals = sdb_calloc(x->n + 1, sizeof *vals);
	bool *owned = sdb_calloc(x->n + 1, sizeof *owned);
	int rc = 0;

	*out = NULL;
	/* the operators only read their operands: variables are lent, not copied */
	for (size_t i = 0; i < x->n && rc == 0; i++) {
		if (x->args[i] != NULL) {
			rc = agg_expr_eval_ref(x->args[i], root, &vals[i], &owned[i], e);
		}
	}
	if (rc == 0) {
		rc = eval_one(x, vals, out, e);
	}
	for (size_t i = 0; i < x->n; i++) {
		agg_ref_free(vals[i], owned[i]);
	}
	free(vals);
	free(owned);
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}
