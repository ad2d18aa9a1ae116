/* The update engine's applier (see update.h; the parser and the tree are update.c and
 * update_int.h): walks the update tree over a mutable copy of the document
 * (storage/docbuild.h), visiting the children of every node in the order MongoDB 5.0+
 * uses (numeric field names in numeric order, other names lexicographically, so fields
 * created by one update are appended in that order); resolves `$` against the query,
 * array filters and $rename; replacement updates; the upsert seed built from a filter.
 */
#include "storage/update.h"
#include "storage/decimal.h"
#include "storage/update_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/docbuild.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/collation.h"
#include "storage/keyenc.h"
#include "storage/sortspec.h"

/* ---- apply ----------------------------------------------------------------------- */

typedef struct {
	const sdb_update *u;
	bool upsert;
	docbuild_node **rename_vals; /* per rename: the source's value, or NULL when missing */
	bool pos_found;
	size_t pos_index; /* `$` */
	int *code;
	char *err;
	size_t errlen;
} actx;

static int apply_obj(actx *a, const unode *un, docbuild_node *c, const char *cname, bool fresh);

/* SafeNum::isIdentical of an $inc/$mul result and the stored value: same type and equal
 * (decimals numerically: 1.50 is identical to 1.5; doubles by ==, so -0.0 and 0.0 are, NaN
 * never), when mongod leaves the field as it is. */
static bool arith_identical(const bson_value_t *r, const bson_value_t *old)
{
	if (r->value_type != old->value_type)
		return false;
	switch (r->value_type) {
	case BSON_TYPE_INT32:
		return r->value.v_int32 == old->value.v_int32;
	case BSON_TYPE_INT64:
		return r->value.v_int64 == old->value.v_int64;
	case BSON_TYPE_DOUBLE:
		return r->value.v_double == old->value.v_double;
	case BSON_TYPE_DECIMAL128:
		return sdb_dec_equal(r->value.v_decimal128, old->value.v_decimal128);
	default:
		return false;
	}
}

/* Numbers: MongoDB's SafeNum for $inc/$mul (int32 -> int64 on overflow, int64 overflow is
 * an error, doubles win, decimals win over everything: both operands coerced to Decimal128,
 * a double to 15 digits, as SafeNum::getDecimal). Returns false on int64 overflow. */
static bool arith(bool mul, const bson_value_t *a, const bson_value_t *b, bson_value_t *out)
{
	bson_type_t ta = a->value_type, tb = b->value_type;

	memset(out, 0, sizeof *out);
	if (ta == BSON_TYPE_DECIMAL128 || tb == BSON_TYPE_DECIMAL128) {
		bson_decimal128_t x, y;

		if (!sdb_dec_from_value(a, &x) || !sdb_dec_from_value(b, &y)) {
			return false;
		}
		out->value_type = BSON_TYPE_DECIMAL128;
		out->value.v_decimal128 = mul ? sdb_dec_mul(x, y) : sdb_dec_add(x, y);
		return true;
	}
	if (ta == BSON_TYPE_DOUBLE || tb == BSON_TYPE_DOUBLE) {
		double x = ta == BSON_TYPE_DOUBLE	? a->value.v_double
			   : ta == BSON_TYPE_INT64 ? (double)a->value.v_int64
						   : (double)a->value.v_int32;
		double y = tb == BSON_TYPE_DOUBLE	? b->value.v_double
			   : tb == BSON_TYPE_INT64 ? (double)b->value.v_int64
						   : (double)b->value.v_int32;

		out->value_type = BSON_TYPE_DOUBLE;
		out->value.v_double = mul ? x * y : x + y;
		return true;
	}
	int64_t x = ta == BSON_TYPE_INT64 ? a->value.v_int64 : a->value.v_int32;
	int64_t y = tb == BSON_TYPE_INT64 ? b->value.v_int64 : b->value.v_int32;
	int64_t r;

	if (mul ? __builtin_mul_overflow(x, y, &r) : __builtin_add_overflow(x, y, &r)) {
		return false;
	}
	if (ta == BSON_TYPE_INT32 && tb == BSON_TYPE_INT32 && r >= INT32_MIN && r <= INT32_MAX) {
		out->value_type = BSON_TYPE_INT32;
		out->value.v_int32 = (int32_t)r;
	} else {
		out->value_type = BSON_TYPE_INT64;
		out->value.v_int64 = r;
	}
	return true;
}

static docbuild_node *scalar_node(const bson_value_t *v)
{
	return docbuild_from_value(v, NULL);
}

static int64_t now_ms(const sdb_update *u)
{
	if (u->clock != NULL) {
		return u->clock(u->clock_ctx);
	}
	return sdb_wall_ms();
}

/* Compare two nodes in MongoDB order. */
static int node_cmp(const docbuild_node *x, const docbuild_node *y)
{
	bson_t sx, sy;
	bson_value_t vx, vy;
	int r;

	docbuild_value(x, &sx, &vx);
	docbuild_value(y, &sy, &vy);
	r = sdb_bson_value_cmp(&vx, &vy);
	bson_destroy(&sx);
	bson_destroy(&sy);
	return r;
}

/* The memcmp-ordered sort key of one array element for $push's $sort: the element itself
 * (1/-1), or the fields of {field: 1/-1} (non-documents have every field missing). */
static void elem_sort_key(const unode *n, const docbuild_node *x, sdb_key *k)
{
	bson_t scratch;

	if (n->sort_dir != 0) {
		bson_value_t v;

		docbuild_value(x, &scratch, &v);
		(void)sdb_keyenc_append_value_coll(k, &v, n->sort_dir < 0, sdb_collation_current(), NULL, 0);
	} else {
		if (x->type == BSON_TYPE_DOCUMENT) {
			docbuild_to_bson(x, &scratch);
		} else {
			bson_init(&scratch);
		}
		(void)sdb_sortspec_key(n->sort_spec, &scratch, k, NULL, 0);
	}
	bson_destroy(&scratch);
}

typedef struct {
	sdb_key key;
	docbuild_node *node;
} keyed;

/* Stable merge sort by key (MongoDB's $push $sort is stable). */
static void keyed_sort(keyed *items, keyed *tmp, size_t n)
{
	size_t h, i, j, k;

	if (n < 2) {
		return;
	}
	h = n / 2;
	keyed_sort(items, tmp, h);
	keyed_sort(items + h, tmp, n - h);
	for (i = 0, j = h, k = 0; i < h && j < n;) {
		tmp[k++] = sdb_key_cmp(&items[j].key, &items[i].key) < 0 ? items[j++] : items[i++];
	}
	while (i < h) {
		tmp[k++] = items[i++];
	}
	while (j < n) {
		tmp[k++] = items[j++];
	}
	memcpy(items, tmp, n * sizeof *items);
}

static void sort_array(const unode *n, docbuild_node *arr)
{
	keyed *items = sdb_calloc(arr->n + 1, sizeof *items);
	keyed *tmp = sdb_calloc(arr->n + 1, sizeof *tmp);

	for (size_t i = 0; i < arr->n; i++) {
		sdb_key_init(&items[i].key);
		elem_sort_key(n, arr->kids[i], &items[i].key);
		items[i].node = arr->kids[i];
	}
	keyed_sort(items, tmp, arr->n);
	for (size_t i = 0; i < arr->n; i++) {
		arr->kids[i] = items[i].node;
		sdb_key_free(&items[i].key);
	}
	free(items);
	free(tmp);
}

static void do_push(const unode *n, docbuild_node *arr)
{
	size_t pos = arr->n;

	if (n->has_position) {
		if (n->position >= 0) {
			pos = (size_t)n->position < arr->n ? (size_t)n->position : arr->n;
		} else {
			uint64_t back = (uint64_t)(-(n->position + 1)) + 1;

			pos = back >= arr->n ? 0 : arr->n - (size_t)back;
		}
	}
	if (n->each) {
		bson_iter_t it;
		bson_t each;

		bson_init_static(&each, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &each);
		while (bson_iter_next(&it)) {
			docbuild_insert(arr, pos++, docbuild_from_iter(&it, false));
		}
	} else {
		docbuild_insert(arr, pos, scalar_node(&n->arg));
	}
	if (n->has_sort) {
		sort_array(n, arr);
	}
	if (n->has_slice) {
		if (n->slice >= 0) {
			while ((int64_t)arr->n > n->slice) {
				docbuild_free(docbuild_take(arr, arr->n - 1));
			}
		} else {
			uint64_t keep = (uint64_t)(-(n->slice + 1)) + 1;

			while ((uint64_t)arr->n > keep) {
				docbuild_free(docbuild_take(arr, 0));
			}
		}
	}
}

/* The equality key of a value (storage/keyenc.h: 1, 1.0 and NumberLong(1) are one key). */
static void value_key(const docbuild_node *x, sdb_key *k)
{
	bson_t scratch;
	bson_value_t v;

	docbuild_value(x, &scratch, &v);
	(void)sdb_keyenc_append_value_coll(k, &v, false, sdb_collation_current(), NULL, 0);
	bson_destroy(&scratch);
}

static int key_qsort_cmp(const void *a, const void *b)
{
	return sdb_key_cmp(a, b);
}

/* Add x to arr unless an equal element is there; keys: arr's keys, sorted. */
static void add_unique(docbuild_node *arr, sdb_key **keys, size_t *nkeys, docbuild_node *x)
{
	sdb_key k;
	size_t lo = 0, hi = *nkeys;

	sdb_key_init(&k);
	value_key(x, &k);
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = sdb_key_cmp(&(*keys)[mid], &k);

		if (c == 0) {
			sdb_key_free(&k);
			docbuild_free(x);
			return;
		}
		if (c < 0) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	*keys = sdb_realloc(*keys, (*nkeys + 1) * sizeof **keys);
	memmove(&(*keys)[lo + 1], &(*keys)[lo], (*nkeys - lo) * sizeof **keys);
	(*keys)[lo] = k;
	(*nkeys)++;
	docbuild_push(arr, x);
}

static void do_add_to_set(const unode *n, docbuild_node *arr)
{
	size_t nkeys = arr->n;
	sdb_key *keys = sdb_calloc(nkeys + 1, sizeof *keys);

	for (size_t i = 0; i < arr->n; i++) {
		sdb_key_init(&keys[i]);
		value_key(arr->kids[i], &keys[i]);
	}
	sdb_qsort(keys, nkeys, sizeof *keys, key_qsort_cmp);
	if (n->each) {
		bson_iter_t it;
		bson_t each;

		bson_init_static(&each, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &each);
		while (bson_iter_next(&it)) {
			add_unique(arr, &keys, &nkeys, docbuild_from_iter(&it, false));
		}
	} else {
		add_unique(arr, &keys, &nkeys, scalar_node(&n->arg));
	}
	for (size_t i = 0; i < nkeys; i++) {
		sdb_key_free(&keys[i]);
	}
	free(keys);
}

static bool pull_matches(const unode *n, const docbuild_node *x)
{
	bson_t scratch, wrap = BSON_INITIALIZER;
	bson_iter_t it;
	bool r;

	if (n->op == OP_PULL_ALL) {
		bson_t arr;

		bson_init_static(&arr, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &arr);
		while (bson_iter_next(&it)) {
			bson_value_t v;

			docbuild_value(x, &scratch, &v);
			r = sdb_bson_value_eq(&v, bson_iter_value(&it));
			bson_destroy(&scratch);
			if (r) {
				bson_destroy(&wrap);
				return true;
			}
		}
		bson_destroy(&wrap);
		return false;
	}
	if (n->pull == NULL) {
		bson_value_t v;

		docbuild_value(x, &scratch, &v);
		r = sdb_bson_value_eq(&v, &n->arg);
		bson_destroy(&scratch);
		bson_destroy(&wrap);
		return r;
	}
	docbuild_append(&wrap, "v", 1, x);
	bson_iter_init_find(&it, &wrap, "v");
	r = sdb_matcher_match_value(n->pull, &it);
	bson_destroy(&wrap);
	return r;
}

/* The value a creating modifier gives a missing field, or NULL when it creates nothing. */
static docbuild_node *create_value(actx *a, const unode *n)
{
	const sdb_update *u = a->u;

	switch (n->op) {
	case OP_SET:
	case OP_INC:
	case OP_MIN:
	case OP_MAX:
		return scalar_node(&n->arg);
	case OP_SET_ON_INSERT:
		return a->upsert ? scalar_node(&n->arg) : NULL;
	case OP_MUL: {
		/* mongod's ArithmeticNode sets a missing field to operand * int32 0 (SafeNum): 0 of
		 * the operand's type, -0.0 for a negative double, 0 with the operand's exponent
		 * (and sign) for a decimal (1.50 -> 0.00) */
		bson_value_t zero = {0}, r;

		zero.value_type = BSON_TYPE_INT32;
		if (!arith(true, &n->arg, &zero, &r)) {
			r = zero;
		}
		return scalar_node(&r);
	}
	case OP_RENAME_TO:
		return a->rename_vals[n->rename] != NULL ? docbuild_clone(a->rename_vals[n->rename])
							 : NULL;
	case OP_PUSH: {
		docbuild_node *arr = docbuild_new_array(NULL);

		do_push(n, arr);
		return arr;
	}
	case OP_ADD_TO_SET: {
		docbuild_node *arr = docbuild_new_array(NULL);

		do_add_to_set(n, arr);
		return arr;
	}
	case OP_CURRENT_DATE: {
		bson_value_t v = {0};
		int64_t ms = now_ms(u);

		if (n->as_timestamp) {
			v.value_type = BSON_TYPE_TIMESTAMP;
			v.value.v_timestamp.timestamp = (uint32_t)(ms / 1000);
			v.value.v_timestamp.increment = 1;
		} else {
			v.value_type = BSON_TYPE_DATE_TIME;
			v.value.v_datetime = ms;
		}
		return scalar_node(&v);
	}
	default:
		return NULL;
	}
}

/* Apply leaf n to the existing element c->kids[i] (cname: c's field name for messages). */
static int apply_leaf(actx *a, const unode *n, docbuild_node *c, size_t i)
{
	docbuild_node *e = c->kids[i];

	switch (n->op) {
	case OP_SET_ON_INSERT:
		if (!a->upsert) {
			return 0;
		}
		/* fallthrough */
	case OP_SET:
		docbuild_replace(c, i, scalar_node(&n->arg));
		return 0;
	case OP_RENAME_TO:
		if (a->rename_vals[n->rename] != NULL) {
			docbuild_replace(c, i, docbuild_clone(a->rename_vals[n->rename]));
		}
		return 0;
	case OP_UNSET:
	case OP_RENAME_FROM:
		if (c->type == BSON_TYPE_ARRAY) {
			docbuild_replace(c, i, docbuild_new_null(NULL));
		} else {
			docbuild_free(docbuild_take(c, i));
		}
		return 0;
	case OP_INC:
	case OP_MUL: {
		bson_value_t r;

		if (!upd_value_is_number(&e->value) || e->type == BSON_TYPE_DOCUMENT ||
		    e->type == BSON_TYPE_ARRAY) {
			char *j = upd_node_json(e);
			int rc = upd_fail(a->code, C_TYPE_MISMATCH, a->err, a->errlen,
				      "Cannot apply %s to a value of non-numeric type. The field '%s' "
				      "has the non-numeric value %s of type %s",
				      n->op == OP_INC ? "$inc" : "$mul", n->path, j, upd_type_name(e->type));

			free(j);
			return rc;
		}
		/* mongod's ArithmeticNode: the operand first (`_val += original`: with two NaN
		 * decimals the operand's comes out) */
		if (!arith(n->op == OP_MUL, &n->arg, &e->value, &r)) {
			char *j = upd_node_json(e);
			int rc = upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				      "Failed to apply %s operations to current value (%s) for the "
				      "field '%s' (overflow)",
				      n->op == OP_INC ? "$inc" : "$mul", j, n->path);

			free(j);
			return rc;
		}
		if (arith_identical(&r, &e->value))
			return 0; /* a no-op, as mongod (SafeNum::isIdentical): the stored value
				     and its digits stay, nothing is written */
		docbuild_replace(c, i, scalar_node(&r));
		return 0;
	}
	case OP_MIN:
	case OP_MAX: {
		docbuild_node *x = scalar_node(&n->arg);
		int cmp = node_cmp(x, e);

		if ((n->op == OP_MIN && cmp < 0) || (n->op == OP_MAX && cmp > 0)) {
			docbuild_replace(c, i, x);
		} else {
			docbuild_free(x);
		}
		return 0;
	}
	case OP_PUSH:
	case OP_ADD_TO_SET:
		if (e->type != BSON_TYPE_ARRAY) {
			if (n->op == OP_PUSH) {
				return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The field '%s' must be an array but is of type %s", n->path,
					    upd_type_name(e->type));
			}
			return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "Cannot apply $addToSet to non-array field. Field named '%s' has "
				    "non-array type %s",
				    n->name, upd_type_name(e->type));
		}
		if (n->op == OP_PUSH) {
			do_push(n, e);
		} else {
			do_add_to_set(n, e);
		}
		return 0;
	case OP_PULL:
	case OP_PULL_ALL:
		if (e->type != BSON_TYPE_ARRAY) {
			return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "Cannot apply $pull to a non-array value");
		}
		for (size_t k = e->n; k > 0; k--) {
			if (pull_matches(n, e->kids[k - 1])) {
				docbuild_free(docbuild_take(e, k - 1));
			}
		}
		return 0;
	case OP_POP:
		if (e->type != BSON_TYPE_ARRAY) {
			return upd_fail(a->code, C_TYPE_MISMATCH, a->err, a->errlen,
				    "Path '%s' contains an element of non-array type '%s'", n->path,
				    upd_type_name(e->type));
		}
		if (e->n > 0) {
			docbuild_free(docbuild_take(e, n->pop_first ? 0 : e->n - 1));
		}
		return 0;
	case OP_CURRENT_DATE:
		docbuild_replace(c, i, create_value(a, n));
		return 0;
	}
	return 0;
}

static bool arrayfilter_match(const afilter *f, const docbuild_node *e)
{
	bson_t wrap = BSON_INITIALIZER;
	bool r;

	docbuild_append(&wrap, f->ident, -1, e);
	r = sdb_matcher_match(f->m, &wrap);
	bson_destroy(&wrap);
	return r;
}

/* Apply un (a child of the node that addressed container c) to the element at i. */
static int apply_at(actx *a, const unode *un, docbuild_node *c, size_t i)
{
	docbuild_node *e = c->kids[i];

	if (un->leaf) {
		return apply_leaf(a, un, c, i);
	}
	if (e->type == BSON_TYPE_DOCUMENT || e->type == BSON_TYPE_ARRAY) {
		return apply_obj(a, un, e, un->name, false);
	}
	/* a scalar on the way: array updates fail, children that would create something fail */
	for (size_t k = 0; k < un->n; k++) {
		if (un->kids[k]->comp != C_FIELD) {
			char *j = upd_node_json(e);
			int rc = upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				      "Cannot apply array updates to non-array element %s: %s",
				      un->name, j);

			free(j);
			return rc;
		}
	}
	docbuild_node *tmp = docbuild_new_doc(NULL);
	int rc = apply_obj(a, un, tmp, un->name, true);
	bool created = tmp->n > 0;

	docbuild_free(tmp);
	if (rc != 0) {
		return rc;
	}
	if (created) {
		char *j = upd_node_json(e);
		const char *child = un->n > 0 ? un->kids[0]->name : "";

		rc = upd_fail(a->code, C_PATH_NOT_VIABLE, a->err, a->errlen,
			  "Cannot create field '%s' in element {%s: %s}", child,
			  c->type == BSON_TYPE_DOCUMENT ? e->key : un->name, j);
		free(j);
	}
	return rc;
}

static int array_updates_missing(actx *a, const char *cname)
{
	return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
		    "The path '%s' must exist in the document in order to apply array updates.",
		    cname);
}

/* Apply the children of un to container c (a document or an array). fresh: c was just
 * created for a missing path (positional children then fail). */
static int apply_obj(actx *a, const unode *un, docbuild_node *c, const char *cname, bool fresh)
{
	for (size_t k = 0; k < un->n; k++) {
		const unode *kid = un->kids[k];
		int rc = 0;

		if (kid->comp != C_FIELD) {
			if (fresh) {
				return array_updates_missing(a, cname);
			}
			if (c->type != BSON_TYPE_ARRAY) {
				char *j = upd_node_json(c);

				rc = upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					  "Cannot apply array updates to non-array element %s: %s",
					  cname, j);
				free(j);
				return rc;
			}
			if (kid->comp == C_POSITIONAL) {
				if (!a->pos_found) {
					return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
						    "The positional operator did not find the match "
						    "needed from the query.");
				}
				if (a->pos_index < c->n) {
					rc = apply_at(a, kid, c, a->pos_index);
				}
			} else {
				for (size_t i = 0; i < c->n && rc == 0; i++) {
					if (kid->comp == C_FILTERED &&
					    !arrayfilter_match(&a->u->filters[kid->filter], c->kids[i])) {
						continue;
					}
					rc = apply_at(a, kid, c, i);
				}
			}
			if (rc != 0) {
				return rc;
			}
			continue;
		}

		size_t idx = 0;
		bool found = false, is_index = false;

		if (c->type == BSON_TYPE_DOCUMENT) {
			found = docbuild_field(c, kid->name, strlen(kid->name), &idx) != NULL;
		} else {
			is_index = upd_is_numeric_name(kid->name, &idx);
			found = is_index && idx < c->n;
		}
		if (found) {
			if (c->type == BSON_TYPE_ARRAY &&
			    ((kid->op == OP_RENAME_TO && a->rename_vals[kid->rename] != NULL) ||
			     kid->op == OP_RENAME_FROM) &&
			    kid->leaf) {
				return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The %s field cannot be an array element, '%s' in doc with "
					    "%s",
					    kid->op == OP_RENAME_TO ? "destination" : "source", kid->path,
					    cname);
			}
			rc = apply_at(a, kid, c, idx);
			if (rc != 0) {
				return rc;
			}
			continue;
		}
		/* missing: create when a modifier below creates something */
		docbuild_node *v;

		if (kid->leaf) {
			v = create_value(a, kid);
		} else {
			v = docbuild_new_doc(NULL);
			rc = apply_obj(a, kid, v, kid->name, true);
			if (rc != 0 || v->n == 0) {
				docbuild_free(v);
				if (rc != 0) {
					return rc;
				}
				v = NULL;
			}
		}
		if (v == NULL) {
			continue;
		}
		if (c->type == BSON_TYPE_DOCUMENT) {
			docbuild_set_key(v, kid->name);
			docbuild_push(c, v);
			continue;
		}
		if (!is_index) {
			char *j = upd_node_json(c);

			rc = upd_fail(a->code, C_PATH_NOT_VIABLE, a->err, a->errlen,
				  "Cannot create field '%s' in element {%s: %s}", kid->name, cname, j);
			free(j);
			docbuild_free(v);
			return rc;
		}
		if (kid->leaf && (kid->op == OP_RENAME_TO)) {
			docbuild_free(v);
			return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "The destination field cannot be an array element, '%s' in doc "
				    "with %s",
				    kid->path, cname);
		}
		if (idx - c->n > MAX_PADDING) {
			docbuild_free(v);
			return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "can't backfill more than %d elements", MAX_PADDING);
		}
		while (c->n < idx) {
			docbuild_push(c, docbuild_new_null(NULL));
		}
		docbuild_push(c, v);
	}
	return 0;
}

/* mongod refuses a $rename whose destination path goes through an array (BadValue:
 * "The destination field cannot be an array element, 'b.0' in doc with _id: 1 has an
 * array field called 'b'"): walk `to` in the document; 0 or the failure. */
static int rename_dest_check(actx *a, const docbuild_node *root, const char *to)
{
	const docbuild_node *cur = root;
	const char *p = to;

	while (cur != NULL && cur->type == BSON_TYPE_DOCUMENT) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);

		if (dot == NULL) {
			return 0;
		}
		cur = docbuild_field(cur, p, len, NULL);
		if (cur != NULL && cur->type == BSON_TYPE_ARRAY) {
			return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "The destination field cannot be an array element, '%s' in doc "
				    "has an array field called '%.*s'",
				    to, (int)(dot - to), to);
		}
		p = dot + 1;
	}
	return 0;
}

/* Resolve the value each $rename moves (a clone of the source, or NULL when missing). */
static int resolve_renames(actx *a, const docbuild_node *root)
{
	for (size_t r = 0; r < a->u->n_renames; r++) {
		const char *p = a->u->renames[r].from;
		const docbuild_node *cur = root;

		a->rename_vals[r] = NULL;
		while (cur != NULL) {
			const char *dot = strchr(p, '.');
			size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);

			if (cur->type == BSON_TYPE_ARRAY) {
				return upd_fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The source field cannot be an array element, '%s' in doc "
					    "with %s",
					    a->u->renames[r].from, "an array on its path");
			}
			if (cur->type != BSON_TYPE_DOCUMENT) {
				cur = NULL;
				break;
			}
			cur = docbuild_field(cur, p, len, NULL);
			if (dot == NULL) {
				break;
			}
			p = dot + 1;
		}
		if (cur != NULL) {
			a->rename_vals[r] = docbuild_clone(cur);
		}
		if (a->rename_vals[r] != NULL) {
			int rc = rename_dest_check(a, root, a->u->renames[r].to);
			if (rc != 0) {
				return rc;
			}
		}
	}
	return 0;
}

/* ---- positional `$`: the first array element the query matched ---------------------- */

/* Rewrite the query's conditions on array path P into a filter over {e: element}. */
static void positional_filter(const bson_t *query, const char *arr, bson_t *out)
{
	bson_iter_t it;
	size_t alen = strlen(arr);

	bson_iter_init(&it, query);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (strcmp(k, "$and") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			while (bson_iter_next(&sub)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&sub)) {
					bson_t d;
					const uint8_t *data;
					uint32_t len;

					bson_iter_document(&sub, &len, &data);
					bson_init_static(&d, data, len);
					positional_filter(&d, arr, out);
				}
			}
			continue;
		}
		if (strncmp(k, arr, alen) != 0 || (k[alen] != '\0' && k[alen] != '.')) {
			continue;
		}
		char *nk = sdb_asprintf("e%s", k + alen);

		/* {arr: {$elemMatch: C}} -> the element itself must satisfy C */
		if (k[alen] == '\0' && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			if (bson_iter_next(&sub) && strcmp(bson_iter_key(&sub), "$elemMatch") == 0 &&
			    BSON_ITER_HOLDS_DOCUMENT(&sub)) {
				bson_iter_t cond;
				bool ops = false;

				bson_iter_recurse(&sub, &cond);
				if (bson_iter_next(&cond)) {
					ops = bson_iter_key(&cond)[0] == '$';
				}
				bson_iter_recurse(&sub, &cond);
				if (ops) {
					bson_t d;

					bson_append_document_begin(out, "e", 1, &d);
					while (bson_iter_next(&cond)) {
						bson_append_iter(&d, NULL, 0, &cond);
					}
					bson_append_document_end(out, &d);
				} else {
					while (bson_iter_next(&cond)) {
						char *ck = sdb_asprintf("e.%s", bson_iter_key(&cond));

						bson_append_iter(out, ck, -1, &cond);
						free(ck);
					}
				}
				free(nk);
				continue;
			}
		}
		bson_append_iter(out, nk, -1, &it);
		free(nk);
	}
}

/* The array path before the first `$` component of any positional leaf. */
static const unode *find_positional(const unode *n, char *buf, size_t cap, size_t used)
{
	for (size_t i = 0; i < n->n; i++) {
		const unode *k = n->kids[i];
		size_t len = strlen(k->name);

		if (k->comp == C_POSITIONAL) {
			buf[used > 0 ? used - 1 : 0] = '\0';
			return k;
		}
		if (used + len + 1 >= cap) {
			continue;
		}
		memcpy(buf + used, k->name, len);
		buf[used + len] = '.';
		if (find_positional(k, buf, cap, used + len + 1) != NULL) {
			return k;
		}
	}
	return NULL;
}

static int resolve_positional(actx *a, const bson_t *doc)
{
	char arr[1024];
	bson_t f = BSON_INITIALIZER;
	sdb_matcher *m = NULL;
	bson_iter_t it, elems;
	int rc;

	a->pos_found = false;
	if (!a->u->uses_positional || !a->u->has_query) {
		return 0;
	}
	if (find_positional(a->u->root, arr, sizeof arr, 0) == NULL) {
		return 0;
	}
	bson_t query;

	docbuild_blob_view(&a->u->query, &query);
	positional_filter(&query, arr, &f);
	if (bson_count_keys(&f) == 0) {
		bson_destroy(&f);
		return 0;
	}
	rc = sdb_matcher_new(&f, &m, a->code, a->err, a->errlen);
	bson_destroy(&f);
	if (rc != 0) {
		return rc;
	}
	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, arr, &elems) &&
	    BSON_ITER_HOLDS_ARRAY(&elems)) {
		bson_iter_t e;
		size_t i = 0;

		bson_iter_recurse(&elems, &e);
		while (bson_iter_next(&e)) {
			bson_t w = BSON_INITIALIZER;
			bool hit;

			bson_append_iter(&w, "e", 1, &e);
			hit = sdb_matcher_match(m, &w);
			bson_destroy(&w);
			if (hit) {
				a->pos_found = true;
				a->pos_index = i;
				break;
			}
			i++;
		}
	}
	sdb_matcher_free(m);
	return 0;
}

/* ---- entry points ------------------------------------------------------------------ */

static bool id_equal(const bson_t *a, const bson_t *b, bool *a_has, bool *b_has)
{
	bson_iter_t ia, ib;

	*a_has = bson_iter_init_find(&ia, a, "_id");
	*b_has = bson_iter_init_find(&ib, b, "_id");
	if (!*a_has || !*b_has) {
		return *a_has == *b_has;
	}
	if (bson_iter_type(&ia) != bson_iter_type(&ib)) {
		return false;
	}
	/* identity: binary even under a collation */
	return sdb_bson_value_eq_simple(bson_iter_value(&ia), bson_iter_value(&ib)) &&
	       bson_iter_type(&ia) == bson_iter_type(&ib);
}

/* doc replaced by rep (a replacement's document, or what an update pipeline made of doc):
 * doc's _id first (rep's when doc has none), then rep's other fields; a different _id in
 * rep is 66. */
static int apply_replacement(const bson_t *rep_doc, const bson_t *doc, bson_t *out, int *code,
			     char *err, size_t errlen)
{
	bson_iter_t it, oid, rid;
	bool doc_has = bson_iter_init_find(&oid, doc, "_id");
	bool rep_has;

	rep_has = bson_iter_init_find(&rid, rep_doc, "_id");

	if (doc_has && rep_has &&
	    (bson_iter_type(&oid) != bson_iter_type(&rid) ||
	     !sdb_bson_value_eq_simple(bson_iter_value(&oid), bson_iter_value(&rid)))) {
		char *j = upd_value_json(bson_iter_value(&rid));
		int rc = upd_fail(code, C_IMMUTABLE, err, errlen,
			      "After applying the update, the (immutable) field '_id' was found to "
			      "have been altered to _id: %s",
			      j);

		free(j);
		return rc;
	}
	if (doc_has) {
		bson_append_iter(out, "_id", 3, &oid);
	} else if (rep_has) {
		bson_append_iter(out, "_id", 3, &rid);
	}
	bson_iter_init(&it, rep_doc);
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "_id") != 0) {
			bson_append_iter(out, NULL, 0, &it);
		}
	}
	return 0;
}

/* The new document's _id (when it has one) is neither an array nor a regex (53). */
static int check_new_id(const bson_t *out, int *code, char *err, size_t errlen)
{
	bson_iter_t id;

	if (bson_iter_init_find(&id, out, "_id") &&
	    (BSON_ITER_HOLDS_ARRAY(&id) || BSON_ITER_HOLDS_REGEX(&id))) {
		return upd_fail(code, C_INVALID_ID, err, errlen, "The '_id' value cannot be of type %s",
				upd_type_name(bson_iter_type(&id)));
	}
	return 0;
}

int sdb_update_apply(const sdb_update *u, const bson_t *doc, bool is_upsert_insert, bson_t *out,
		     bool *changed, int *code, char *err, size_t errlen)
{
	actx a = {0};
	docbuild_node *root = NULL;
	int rc = 0;
	bool old_has, new_has;

	bson_init(out);
	*changed = false;
	if (code != NULL) {
		*code = 0;
	}
	if (u->kind == SDB_UPDATE_REPLACEMENT) {
		bson_t rep;
		docbuild_blob_view(&u->replacement, &rep);
		rc = apply_replacement(&rep, doc, out, code, err, errlen);
		goto done;
	}
	if (u->kind == SDB_UPDATE_PIPELINE) {
		bson_t t;
		rc = upd_pipeline_run(u, doc, &t, code, err, errlen);
		if (rc == 0)
			rc = apply_replacement(&t, doc, out, code, err, errlen);
		bson_destroy(&t);
		if (rc == 0)
			rc = check_new_id(out, code, err, errlen);
		goto done;
	}
	a.u = u;
	a.upsert = is_upsert_insert;
	a.code = code;
	a.err = err;
	a.errlen = errlen;
	a.rename_vals = sdb_calloc(u->n_renames + 1, sizeof *a.rename_vals);
	root = docbuild_from_bson(doc);
	rc = resolve_renames(&a, root);
	if (rc == 0) {
		rc = resolve_positional(&a, doc);
	}
	if (rc == 0) {
		rc = apply_obj(&a, u->root, root, "", false);
	}
	for (size_t i = 0; i < u->n_renames; i++) {
		docbuild_free(a.rename_vals[i]);
	}
	free(a.rename_vals);
	if (rc != 0) {
		goto done;
	}
	bson_destroy(out);
	docbuild_to_bson(root, out);
	if (!id_equal(doc, out, &old_has, &new_has) && old_has) {
		rc = upd_fail(code, C_IMMUTABLE, err, errlen,
			  "Performing an update on the path '_id' would modify the immutable field "
			  "'_id'");
		goto done;
	}
	if (new_has) {
		rc = check_new_id(out, code, err, errlen);
	}
done:
	docbuild_free(root);
	if (rc == 0 && out->len > MAX_DOC_SIZE) {
		rc = upd_fail(code, C_TOO_LARGE, err, errlen,
			  "Resulting document after update is larger than %d", MAX_DOC_SIZE);
	}
	if (rc == 0 && !sdb_bson_depth_ok(out, MAX_NESTING)) {
		rc = upd_fail(code, C_OVERFLOW, err, errlen,
			  "Document exceeds maximum nesting depth of %d", MAX_NESTING);
	}
	if (rc != 0) {
		bson_reinit(out);
		return rc;
	}
	*changed = out->len != doc->len || memcmp(bson_get_data(out), bson_get_data(doc), doc->len) != 0;
	return 0;
}

/* ---- upsert seed ----------------------------------------------------------------- */

/* Set path (dotted) in root to the value at it; fail with 54 on a clash. */
static int seed_set(docbuild_node *root, const char *path, const bson_iter_t *it, int *code,
		    char *err, size_t errlen)
{
	docbuild_node *cur = root;
	const char *p = path;

	while (true) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
		docbuild_node *next;

		if (len == 0) {
			return upd_fail(code, C_EMPTY_FIELD_NAME, err, errlen,
				    "An empty update path is not valid.");
		}
		next = docbuild_field(cur, p, len, NULL);
		if (dot == NULL) {
			if (next != NULL) {
				goto clash;
			}
			docbuild_node *v = docbuild_from_iter(it, false);
			char *k = sdb_strndup(p, len);

			docbuild_set_key(v, k);
			free(k);
			docbuild_push(cur, v);
			return 0;
		}
		if (next == NULL) {
			char *k = sdb_strndup(p, len);

			next = docbuild_new_doc(k);
			free(k);
			docbuild_push(cur, next);
		} else if (next->type != BSON_TYPE_DOCUMENT || next->key == NULL) {
			goto clash;
		}
		cur = next;
		p = dot + 1;
	}
clash:
	return upd_fail(code, C_NOT_SINGLE_VALUE, err, errlen,
		    "cannot infer query fields to set, path '%s' is matched twice", path);
}

static int seed_from(docbuild_node *root, const bson_t *filter, int *code, char *err,
		     size_t errlen)
{
	bson_iter_t it;

	bson_iter_init(&it, filter);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		int rc = 0;

		if (strcmp(k, "$and") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			while (rc == 0 && bson_iter_next(&sub)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&sub)) {
					bson_t d;
					const uint8_t *data;
					uint32_t len;

					bson_iter_document(&sub, &len, &data);
					bson_init_static(&d, data, len);
					rc = seed_from(root, &d, code, err, errlen);
				}
			}
		} else if (k[0] == '$' || BSON_ITER_HOLDS_REGEX(&it)) {
			continue;
		} else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			if (bson_iter_next(&sub) && bson_iter_key(&sub)[0] == '$') {
				/* operators: only $eq (and a one-element $in) seed */
				bson_iter_recurse(&it, &sub);
				while (rc == 0 && bson_iter_next(&sub)) {
					const char *op = bson_iter_key(&sub);

					if (strcmp(op, "$eq") == 0 && !BSON_ITER_HOLDS_REGEX(&sub)) {
						rc = seed_set(root, k, &sub, code, err, errlen);
					} else if (strcmp(op, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&sub)) {
						bson_iter_t one;

						bson_iter_recurse(&sub, &one);
						if (bson_iter_next(&one) && !BSON_ITER_HOLDS_REGEX(&one)) {
							bson_iter_t two = one;

							if (!bson_iter_next(&two)) {
								rc = seed_set(root, k, &one, code, err,
									      errlen);
							}
						}
					}
				}
			} else {
				rc = seed_set(root, k, &it, code, err, errlen);
			}
		} else {
			rc = seed_set(root, k, &it, code, err, errlen);
		}
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

/* Move _id to the front of a document. */
static void id_first(bson_t *doc)
{
	bson_iter_t it;
	bson_t tmp = BSON_INITIALIZER;

	if (!bson_iter_init(&it, doc) || !bson_iter_next(&it) ||
	    strcmp(bson_iter_key(&it), "_id") == 0 || !bson_iter_init_find(&it, doc, "_id")) {
		bson_destroy(&tmp);
		return;
	}
	bson_append_iter(&tmp, "_id", 3, &it);
	bson_iter_init(&it, doc);
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "_id") != 0) {
			bson_append_iter(&tmp, NULL, 0, &it);
		}
	}
	bson_destroy(doc);
	bson_init(doc);
	bson_concat(doc, &tmp);
	bson_destroy(&tmp);
}

int sdb_update_upsert_seed(const bson_t *filter, bson_t *out, int *code, char *err,
			   size_t errlen)
{
	docbuild_node *root = docbuild_new_doc(NULL);
	int rc;

	bson_init(out);
	if (code != NULL) {
		*code = 0;
	}
	if (!sdb_bson_depth_ok(filter, SDB_BSON_MAX_DEPTH)) {
		docbuild_free(root);
		return upd_fail(code, C_OVERFLOW, err, errlen, "query nests deeper than %d levels",
			    SDB_BSON_MAX_DEPTH);
	}
	rc = seed_from(root, filter, code, err, errlen);
	if (rc == 0) {
		bson_destroy(out);
		docbuild_to_bson(root, out);
		id_first(out);
		bson_iter_t id;

		if (bson_iter_init_find(&id, out, "_id") &&
		    (BSON_ITER_HOLDS_ARRAY(&id) || BSON_ITER_HOLDS_REGEX(&id))) {
			rc = upd_fail(code, C_BAD_VALUE, err, errlen,
				  "The '_id' value cannot be of type %s", upd_type_name(bson_iter_type(&id)));
			bson_reinit(out);
		}
	}
	docbuild_free(root);
	return rc;
}

int sdb_update_upsert_doc(const sdb_update *u, const bson_t *filter, bson_t *out, int *code,
			  char *err, size_t errlen)
{
	bson_t seed, res;
	bool changed;
	int rc;

	bson_init(out);
	rc = sdb_update_upsert_seed(filter, &seed, code, err, errlen);
	if (rc != 0) {
		bson_destroy(&seed);
		return rc;
	}
	if (u->kind == SDB_UPDATE_REPLACEMENT) {
		/* the replacement, with the filter's _id when it has none */
		bson_t idonly = BSON_INITIALIZER;
		bson_iter_t id;

		if (bson_iter_init_find(&id, &seed, "_id")) {
			bson_append_iter(&idonly, "_id", 3, &id);
		}
		rc = sdb_update_apply(u, &idonly, true, &res, &changed, code, err, errlen);
		bson_destroy(&idonly);
	} else {
		rc = sdb_update_apply(u, &seed, true, &res, &changed, code, err, errlen);
	}
	bson_destroy(&seed);
	if (rc != 0) {
		bson_destroy(&res);
		return rc;
	}
	bson_iter_t it;

	if (!bson_iter_init_find(&it, &res, "_id")) {
		bson_oid_t oid;

		if (u->oid != NULL)
			u->oid(u->oid_ctx, &oid);
		else
			bson_oid_init(&oid, NULL);
		bson_append_oid(out, "_id", 3, &oid);
		bson_concat(out, &res);
	} else {
		bson_concat(out, &res);
		id_first(out);
	}
	bson_destroy(&res);
	return 0;
}
