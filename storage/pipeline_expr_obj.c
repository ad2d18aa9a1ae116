/* The object operators of the aggregation expression language, with MongoDB 6.0's
 * argument checks, codes and messages (mongo/db/pipeline/expression.cpp): $mergeObjects
 * (the expression; the $group accumulator of that name is not built), $objectToArray,
 * $arrayToObject, $getField, $setField and $unsetField (whose `field` must be a constant
 * string, as in 6.0). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

enum { O_MERGE = AGG_XOBJ_MERGE, O_TOARRAY, O_FROMARRAY, O_GETFIELD, O_SETFIELD, O_UNSETFIELD };

static docbuild_node *kid_copy(const docbuild_node *n, const char *key)
{
	docbuild_node *c = docbuild_clone(n);

	docbuild_set_key(c, key);
	return c;
}

/* The constant string of a `field` argument (an X_LIT or {$literal}) into x->path.
 * getfield: $getField's codes (5654600-5654602), else $setField's (4161106-4161108). */
static int const_field(const char *op, expr *f, expr *x, bool getfield, const ectx *e)
{
	const docbuild_node *v = NULL;

	if (f->kind == X_PATH || f->kind == X_VAR || f->kind == X_LVAR) {
		const char *p = f->path != NULL ? f->path : (f->root ? "ROOT" : "CURRENT");
		const char *pre = f->kind == X_PATH && f->path != NULL && !f->root ? "$" : "$$";

		if (f->kind == X_VAR) {
			p = f->path + 1; /* "v" + ".a.b" */
		}
		return efail(e, getfield ? 5654600 : 4161108,
			     "'%s%s' is a field path reference which is not allowed in this context. "
			     "Did you mean {$literal: '%s%s'}?",
			     pre, p, pre, p);
	}
	if (f->kind == X_LIT) {
		v = f->lit;
	} else if (f->kind == X_OP && f->op == OP_LITERAL) {
		v = f->args[0]->lit;
	}
	if (v == NULL && f->kind != X_REMOVE) {
		return efail(e, getfield ? 5654601 : 4161106,
			     "%s requires 'field' to evaluate to a constant, but got a non-constant argument",
			     op);
	}
	if (ntype(v) != BSON_TYPE_UTF8) {
		return efail(e, getfield ? 5654602 : 4161107,
			     "%s requires 'field' to evaluate to type String, but got %s", op,
			     type_name(ntype(v)));
	}
	if (strlen(v->value.value.v_utf8.str) != v->value.value.v_utf8.len) {
		return efail(e, C_BAD_VALUE, "%s: 'field' cannot contain an embedded null byte", op);
	}
	x->path = sdb_strndup(v->value.value.v_utf8.str, v->value.value.v_utf8.len);
	return 0;
}

static int parse_push(const bson_iter_t *it, expr *x, const ectx *e)
{
	expr *a = NULL;
	int rc = agg_expr_parse(it, &a, e);

	agg_expr_push(x, a);
	return rc;
}

/* $getField: args = input ($$CURRENT when the shorthand), path = field. */
static int parse_getfield(const bson_iter_t *arg, expr *x, const ectx *e)
{
	bson_iter_t sub, fit, iit;
	bool have_f = false, have_i = false, shorthand = false;
	expr *f = NULL;
	int rc = 0;

	if (BSON_ITER_HOLDS_DOCUMENT(arg)) {
		bson_iter_recurse(arg, &sub);
		while (bson_iter_next(&sub)) {
			const char *k = bson_iter_key(&sub);

			if (!have_f && !have_i && k[0] == '$') {
				shorthand = true; /* {$getField: {$literal: "a"}} */
				break;
			} else if (strcmp(k, "field") == 0) {
				fit = sub;
				have_f = true;
			} else if (strcmp(k, "input") == 0) {
				iit = sub;
				have_i = true;
			} else {
				return efail(e, 3041701, "$getField found an unknown argument: %s", k);
			}
		}
	} else {
		shorthand = true;
	}
	if (shorthand) {
		fit = *arg;
		have_f = have_i = true;
	}
	if (!have_f) {
		return efail(e, 3041702, "$getField requires 'field' to be specified");
	}
	if (!have_i) {
		return efail(e, 3041703, "$getField requires 'input' to be specified");
	}
	rc = agg_expr_parse(&fit, &f, e);
	if (rc == 0) {
		rc = const_field("$getField", f, x, true, e);
	}
	agg_expr_free(f);
	if (rc != 0) {
		return rc;
	}
	if (shorthand) {
		expr *cur = sdb_calloc(1, sizeof *cur);

		cur->kind = X_PATH; /* $$CURRENT */
		agg_expr_push(x, cur);
		return 0;
	}
	return parse_push(&iit, x, e);
}

/* $setField {field, input, value} / $unsetField {field, input}: args = input[, value],
 * path = field. */
static int parse_setfield(const char *op, const bson_iter_t *arg, expr *x, bool unset,
			  const ectx *e)
{
	struct {
		bson_iter_t it;
	} it[3];
	bson_iter_t sub;
	bool have[3] = {false, false, false};
	expr *f = NULL;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, 4161100, "%s only supports an object as its argument", op);
	}
	bson_iter_recurse(arg, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		int which = strcmp(k, "field") == 0 ? 0 : strcmp(k, "input") == 0 ? 1 : -1;

		if (!unset && strcmp(k, "value") == 0) {
			which = 2;
		}
		if (which < 0) {
			return efail(e, 4161101, "%s found an unknown argument: %s", op, k);
		}
		it[which].it = sub;
		have[which] = true;
	}
	if (!have[0]) {
		return efail(e, 4161102, "%s requires 'field' to be specified", op);
	}
	if (!unset && !have[2]) {
		return efail(e, 4161103, "%s requires 'value' to be specified", op);
	}
	if (!have[1]) {
		return efail(e, 4161109, "%s requires 'input' to be specified", op);
	}
	rc = agg_expr_parse(&it[0].it, &f, e);
	if (rc == 0) {
		rc = const_field(op, f, x, false, e);
	}
	agg_expr_free(f);
	if (rc == 0) {
		rc = parse_push(&it[1].it, x, e);
	}
	if (rc == 0 && !unset) {
		rc = parse_push(&it[2].it, x, e);
	}
	return rc;
}

int agg_xobj_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e)
{
	if (strcmp(name, "$mergeObjects") == 0) {
		x->op = OP_XOBJ;
		x->sub = O_MERGE;
		return agg_expr_parse_list(name, arg, x, 0, -1, e);
	}
	if (strcmp(name, "$objectToArray") == 0 || strcmp(name, "$arrayToObject") == 0) {
		x->op = OP_XOBJ;
		x->sub = name[1] == 'o' ? O_TOARRAY : O_FROMARRAY;
		return agg_expr_parse_list(name, arg, x, 1, 1, e);
	}
	if (strcmp(name, "$getField") == 0) {
		x->op = OP_XOBJ;
		x->sub = O_GETFIELD;
		return parse_getfield(arg, x, e);
	}
	if (strcmp(name, "$setField") == 0 || strcmp(name, "$unsetField") == 0) {
		x->op = OP_XOBJ;
		x->sub = name[1] == 's' ? O_SETFIELD : O_UNSETFIELD;
		return parse_setfield(name, arg, x, x->sub == O_UNSETFIELD, e);
	}
	return 1;
}

/* The field names of a document being built, hashed (open addressing; slots hold a
 * child's position + 1, 0 = empty), so that $mergeObjects finds a field in O(1) and a
 * merge costs what it merges, not (fields merged) x (fields held). */
typedef struct fidx {
	size_t *slots;
	size_t cap; /* a power of two, at least twice the fields held */
} fidx;

static size_t fhash(const char *k, size_t len)
{
	size_t h = 1469598103934665603u;

	for (size_t i = 0; i < len; i++) {
		h = (h ^ (unsigned char)k[i]) * 1099511628211u;
	}
	return h;
}

/* The slot of key in ix (d's fields): the one holding it, or the empty one ending its
 * probe sequence. */
static size_t fidx_slot(const fidx *ix, const docbuild_node *d, const char *key, size_t len)
{
	size_t s = fhash(key, len) & (ix->cap - 1);

	while (ix->slots[s] != 0) {
		const char *k = d->kids[ix->slots[s] - 1]->key;

		if (strncmp(k, key, len) == 0 && k[len] == '\0') {
			break;
		}
		s = (s + 1) & (ix->cap - 1);
	}
	return s;
}

/* (Re)build ix over d's fields with room for want fields. Returns false when d holds a
 * field name twice (then ix is left empty). */
static bool fidx_build(fidx *ix, const docbuild_node *d, size_t want)
{
	size_t cap = 16;

	while (cap < 2 * want + 2) {
		cap *= 2;
	}
	free(ix->slots);
	ix->slots = sdb_calloc(cap, sizeof *ix->slots);
	ix->cap = cap;
	for (size_t i = 0; i < d->n; i++) {
		size_t s = fidx_slot(ix, d, d->kids[i]->key, strlen(d->kids[i]->key));

		if (ix->slots[s] != 0) {
			return false;
		}
		ix->slots[s] = i + 1;
	}
	return true;
}

/* Set field f->key of d (indexed by ix) to f (owned): replaces a field of that name in
 * place (MongoDB's MutableDocument: the first occurrence's position, the last value),
 * else appends. Returns the bytes (node_size) d grew by, negative when it shrank. */
static long long fidx_put(fidx *ix, docbuild_node *d, docbuild_node *f)
{
	size_t len = strlen(f->key);
	size_t s = fidx_slot(ix, d, f->key, len);
	long long grew = (long long)node_size(f);

	if (ix->slots[s] != 0) {
		size_t i = ix->slots[s] - 1;

		grew -= (long long)node_size(d->kids[i]);
		docbuild_replace(d, i, f);
		return grew;
	}
	docbuild_push(d, f);
	ix->slots[s] = d->n;
	if (2 * d->n + 2 > ix->cap) {
		fidx_build(ix, d, d->n * 2);
	}
	return grew;
}

/* Set field key of document d to v (owned; replaces in place, as MutableDocument). */
static void put(docbuild_node *d, const char *key, size_t len, docbuild_node *v)
{
	size_t idx;
	char *k = sdb_strndup(key, len);

	if (docbuild_field(d, key, len, &idx) != NULL) {
		docbuild_set_key(v, k);
		docbuild_replace(d, idx, v);
	} else {
		docbuild_set_key(v, k);
		docbuild_push(d, v);
	}
	free(k);
}

static int eval_from_array(const docbuild_node *in, docbuild_node **out, const ectx *e)
{
	docbuild_node *d;
	fidx ix = {0};
	bool pairs;
	int rc = 0;

	if (is_nullish(in)) {
		*out = v_null();
		return 0;
	}
	if (in->type != BSON_TYPE_ARRAY) {
		return efail(e, 40386, "$arrayToObject requires an array input, found: %s",
			     type_name(in->type));
	}
	d = docbuild_new_doc(NULL);
	if (in->n == 0) {
		*out = d;
		return 0;
	}
	if (in->kids[0]->type == BSON_TYPE_ARRAY) {
		pairs = true;
	} else if (in->kids[0]->type == BSON_TYPE_DOCUMENT) {
		pairs = false;
	} else {
		docbuild_free(d);
		return efail(e, 40398, "Unrecognised input type format for $arrayToObject: %s",
			     type_name(in->kids[0]->type));
	}
	fidx_build(&ix, d, in->n); /* pairs with one key keep its first position */
	for (size_t i = 0; i < in->n && rc == 0; i++) {
		const docbuild_node *el = in->kids[i], *k, *v;

		if (pairs) {
			if (el->type != BSON_TYPE_ARRAY) {
				rc = efail(e, 40396, "$arrayToObject requires a consistent input format. Elements mustall be arrays or all be objects. Array was detected, now found: %s",
					   type_name(el->type));
				break;
			}
			if (el->n != 2) {
				rc = efail(e, 40397, "$arrayToObject requires an array of size 2 arrays,found array of size: %zu",
					   el->n);
				break;
			}
			k = el->kids[0];
			v = el->kids[1];
			if (k->type != BSON_TYPE_UTF8) {
				rc = efail(e, 40395, "$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: %s",
					   type_name(k->type));
				break;
			}
		} else {
			if (el->type != BSON_TYPE_DOCUMENT) {
				rc = efail(e, 40391, "$arrayToObject requires a consistent input format. Elements mustall be arrays or all be objects. Object was detected, now found: %s",
					   type_name(el->type));
				break;
			}
			if (el->n != 2) {
				rc = efail(e, 40392, "$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:%zu",
					   el->n);
				break;
			}
			k = docbuild_field(el, "k", 1, NULL);
			v = docbuild_field(el, "v", 1, NULL);
			if (k == NULL || v == NULL) {
				char *s = agg_node_str(el);

				rc = efail(e, 40393, "$arrayToObject requires an object with keys 'k' and 'v'. Missing either or both keys from: %s",
					   s);
				free(s);
				break;
			}
			if (k->type != BSON_TYPE_UTF8) {
				rc = efail(e, 40394, "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string. Found type: %s",
					   type_name(k->type));
				break;
			}
		}
		if (strlen(k->value.value.v_utf8.str) != k->value.value.v_utf8.len) {
			rc = efail(e, pairs ? 4940400 : 4940401,
				   "Key field cannot contain an embedded null byte");
			break;
		}
		{
			char *key = sdb_strndup(k->value.value.v_utf8.str, k->value.value.v_utf8.len);

			fidx_put(&ix, d, kid_copy(v, key));
			free(key);
		}
	}
	free(ix.slots);
	if (rc != 0) {
		docbuild_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

/* $mergeObjects (ExpressionMergeObjects::evaluate: a MutableDocument that each operand's
 * fields are set into; null/missing operands skipped, others not objects 40400). The
 * first operand, when it is ours (a value computed for us, or $reduce's accumulator
 * moved out of $$value), is the result grown in place: {$mergeObjects: ["$$value",
 * {...}]} in a $reduce costs what it merges, and the accumulator's size (e->acc) is kept
 * up to date from what changed. */
static int eval_merge(const expr *x, docbuild_node **vals, bool *owned, docbuild_node **out,
		      const ectx *e)
{
	docbuild_node *d = NULL;
	fidx ix = {0};
	size_t from = 0;
	long long grew = 0;
	bool acc = e->acc != NULL && x->n > 0 && agg_expr_moved_acc(x->args[0]);

	for (size_t i = 0; i < x->n; i++) {
		if (!is_nullish(vals[i]) && vals[i]->type != BSON_TYPE_DOCUMENT) {
			char *s = agg_node_str(vals[i]);
			int rc = efail(e, 40400, "$mergeObjects requires object inputs, but input %s is of type %s",
				       s, type_name(vals[i]->type));

			free(s);
			return rc;
		}
	}
	if (acc && owned[0] && vals[0] != NULL && vals[0] == e->acc->idx_of) {
		/* the accumulator this $reduce's merges grew: its index is up to date */
		ix.slots = e->acc->idx_slots;
		ix.cap = e->acc->idx_cap;
		e->acc->idx_slots = NULL;
		e->acc->idx_of = NULL;
		d = vals[0];
		vals[0] = NULL;
		from = 1;
	} else if (x->n > 0 && owned[0] && ntype(vals[0]) == BSON_TYPE_DOCUMENT &&
		   fidx_build(&ix, vals[0], vals[0]->n)) {
		d = vals[0];
		vals[0] = NULL;
		docbuild_set_key(d, NULL);
		from = 1;
	} else {
		d = docbuild_new_doc(NULL);
		fidx_build(&ix, d, 8);
	}
	for (size_t i = from; i < x->n; i++) {
		if (is_nullish(vals[i])) {
			continue;
		}
		for (size_t k = 0; k < vals[i]->n; k++) {
			docbuild_node *f = owned[i] ? vals[i]->kids[k] : docbuild_clone(vals[i]->kids[k]);

			grew += fidx_put(&ix, d, f);
		}
		if (owned[i]) {
			vals[i]->n = 0; /* its fields moved into d */
		}
	}
	if (acc) {
		free(e->acc->idx_slots);
		e->acc->idx_slots = NULL;
		e->acc->idx_of = NULL;
		if (from == 1) {
			e->acc->bytes += grew;
			e->acc->appended = true;
			/* kept for the next element's merge into d */
			e->acc->idx_slots = ix.slots;
			e->acc->idx_cap = ix.cap;
			e->acc->idx_of = d;
			ix.slots = NULL;
		} else {
			e->acc->stale = true; /* rebuilt: eval_reduce measures it afresh */
		}
	}
	free(ix.slots);
	*out = d;
	return 0;
}

static int eval_one(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e)
{
	switch (x->sub) {
	case O_TOARRAY:
		if (is_nullish(vals[0])) {
			*out = v_null();
			return 0;
		}
		if (vals[0]->type != BSON_TYPE_DOCUMENT) {
			return efail(e, 40390, "$objectToArray requires a document input, found: %s",
				     type_name(vals[0]->type));
		}
		*out = docbuild_new_array(NULL);
		for (size_t k = 0; k < vals[0]->n; k++) {
			const docbuild_node *f = vals[0]->kids[k];
			docbuild_node *kv = docbuild_new_doc(NULL);
			docbuild_node *key = v_string(f->key, strlen(f->key));

			docbuild_set_key(key, "k");
			docbuild_push(kv, key);
			docbuild_push(kv, kid_copy(f, "v"));
			docbuild_push(*out, kv);
		}
		return 0;
	case O_FROMARRAY:
		return eval_from_array(vals[0], out, e);
	case O_GETFIELD:
		if (is_nullish(vals[0])) {
			*out = vals[0] == NULL ? NULL : v_null();
			return 0;
		}
		if (vals[0]->type == BSON_TYPE_DOCUMENT) {
			const docbuild_node *f = docbuild_field(vals[0], x->path, strlen(x->path), NULL);

			*out = f != NULL ? kid_copy(f, NULL) : NULL;
		}
		return 0;
	case O_SETFIELD:
	case O_UNSETFIELD: {
		size_t idx;

		if (is_nullish(vals[0])) {
			*out = v_null();
			return 0;
		}
		if (vals[0]->type != BSON_TYPE_DOCUMENT) {
			return efail(e, 4161105, "%s requires 'input' to evaluate to type Object",
				     x->sub == O_SETFIELD ? "$setField" : "$unsetField");
		}
		*out = docbuild_clone(vals[0]);
		docbuild_set_key(*out, NULL);
		if (x->sub == O_SETFIELD && vals[1] != NULL) {
			put(*out, x->path, strlen(x->path), kid_copy(vals[1], NULL));
		} else if (docbuild_field(*out, x->path, strlen(x->path), &idx) != NULL) {
			docbuild_free(docbuild_take(*out, idx));
		}
		return 0;
	}
	default:
		return efail(e, C_INTERNAL, "unhandled object expression");
	}
}

int agg_xobj_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node **vals = sdb_calloc(x->n + 1, sizeof *vals);
	bool *owned = sdb_calloc(x->n + 1, sizeof *owned);
	int rc = 0;

	*out = NULL;
	for (size_t i = 0; i < x->n && rc == 0; i++) {
		if (x->sub == O_MERGE) {
			/* lent when only read (variables, literals); owned ones may be moved */
			rc = agg_expr_eval_ref(x->args[i], root, &vals[i], &owned[i], e);
		} else {
			rc = agg_expr_eval(x->args[i], root, &vals[i], e);
			owned[i] = true;
		}
	}
	if (rc == 0) {
		rc = x->sub == O_MERGE ? eval_merge(x, vals, owned, out, e) : eval_one(x, vals, out, e);
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
