/* The index-bounds analysis of a query filter (sdb_matcher_bounds, see matcher.h): what a
 * compiled filter's top-level AND implies for one path's values, as key intervals for the
 * planner (storage/query.c). */
#include "storage/matcher.h"
#include "storage/matcher_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/keyenc.h"

/* ---- bounds ----------------------------------------------------------------------- */

static void interval_free(sdb_interval *iv)
{
	sdb_key_free(&iv->lo);
	sdb_key_free(&iv->hi);
}

void sdb_bounds_free(sdb_bounds *b)
{
	for (size_t i = 0; i < b->n; i++)
		interval_free(&b->iv[i]);
	free(b->iv);
	memset(b, 0, sizeof *b);
}

static void bounds_push(sdb_bounds *b, sdb_interval *iv)
{
	b->iv = sdb_realloc(b->iv, (b->n + 1) * sizeof *b->iv);
	b->iv[b->n++] = *iv;
}

static bool point_ok(const bson_value_t *v)
{
	return v->value_type != BSON_TYPE_ARRAY && v->value_type != BSON_TYPE_REGEX &&
	       !(sdb_bson_bracket(v->value_type) == SDB_BRACKET_NUMBER && is_nan(v));
}

static void push_point(sdb_bounds *b, const bson_value_t *v)
{
	sdb_interval iv = {.lo_incl = true, .hi_incl = true};

	sdb_keyenc_append_value(&iv.lo, v, false, NULL, 0);
	sdb_keyenc_append_value(&iv.hi, v, false, NULL, 0);
	bounds_push(b, &iv);
}

/* null and undefined are equal for $eq/$in (cmp_value): either gives both points. */
static void push_null_aware(sdb_bounds *b, const bson_value_t *v)
{
	static const bson_value_t undef = {.value_type = BSON_TYPE_UNDEFINED};
	static const bson_value_t null = {.value_type = BSON_TYPE_NULL};

	if (v->value_type == BSON_TYPE_NULL || v->value_type == BSON_TYPE_UNDEFINED) {
		push_point(b, &undef);
		push_point(b, &null);
		return;
	}
	push_point(b, v);
}

static int iv_cmp(const void *a, const void *b)
{
	const sdb_interval *x = a, *y = b;

	return sdb_key_cmp(&x->lo, &y->lo);
}

/* Intervals that one predicate implies; false when it implies nothing usable. */
static bool pred_bounds(const node *n, sdb_bounds *out)
{
	sdb_interval iv;
	int br;

	memset(out, 0, sizeof *out);
	switch (n->op) {
	case OP_EQ:
		if (!point_ok(&n->val))
			return false;
		push_null_aware(out, &n->val);
		out->kind = SDB_BOUNDS_POINTS;
		return true;
	case OP_IN:
		if (n->nin_re)
			return false;
		for (size_t i = 0; i < n->nin; i++)
			if (!point_ok(&n->in[i]))
				return false;
		for (size_t i = 0; i < n->nin; i++) {
			push_null_aware(out, &n->in[i]);
		}
		if (out->n == 0) {
			out->kind = SDB_BOUNDS_EMPTY;
			return true;
		}
		sdb_qsort(out->iv, out->n, sizeof *out->iv, iv_cmp);
		{
			size_t j = 0;

			for (size_t i = 0; i < out->n; i++) {
				if (j && sdb_key_cmp(&out->iv[j - 1].lo, &out->iv[i].lo) == 0) {
					interval_free(&out->iv[i]);
					continue;
				}
				out->iv[j++] = out->iv[i];
			}
			out->n = j;
		}
		out->kind = SDB_BOUNDS_POINTS;
		return true;
	case OP_LT:
	case OP_LTE:
	case OP_GT:
	case OP_GTE:
		br = sdb_bson_bracket(n->val.value_type);
		if (br == SDB_BRACKET_MINKEY || br == SDB_BRACKET_MAXKEY || br == SDB_BRACKET_NULL ||
		    br == SDB_BRACKET_UNDEFINED || br == SDB_BRACKET_ARRAY || is_nan(&n->val))
			return false;
		memset(&iv, 0, sizeof iv);
		if (n->op == OP_GT || n->op == OP_GTE) {
			uint8_t hi = (uint8_t)(sdb_keyenc_bracket_byte(br) + 1);

			sdb_keyenc_append_value(&iv.lo, &n->val, false, NULL, 0);
			iv.lo_incl = n->op == OP_GTE;
			sdb_key_append(&iv.hi, &hi, 1);
			iv.hi_incl = false;
		} else {
			uint8_t lo = sdb_keyenc_bracket_byte(br);

			sdb_key_append(&iv.lo, &lo, 1);
			iv.lo_incl = true;
			sdb_keyenc_append_value(&iv.hi, &n->val, false, NULL, 0);
			iv.hi_incl = n->op == OP_LTE;
		}
		bounds_push(out, &iv);
		out->kind = SDB_BOUNDS_RANGE;
		return true;
	default:
		return false;
	}
}

static void key_copy(sdb_key *dst, const sdb_key *src)
{
	sdb_key_init(dst);
	sdb_key_append(dst, src->data, src->len);
}

/* Intersect two sorted disjoint interval lists into out. */
static void bounds_intersect(const sdb_bounds *a, const sdb_bounds *b, sdb_bounds *out)
{
	memset(out, 0, sizeof *out);
	for (size_t i = 0; i < a->n; i++) {
		for (size_t j = 0; j < b->n; j++) {
			const sdb_interval *x = &a->iv[i], *y = &b->iv[j];
			const sdb_key *lo, *hi;
			bool lo_incl, hi_incl;
			int c;
			sdb_interval r;

			c = sdb_key_cmp(&x->lo, &y->lo);
			lo = c >= 0 ? &x->lo : &y->lo;
			lo_incl = c > 0 ? x->lo_incl : c < 0 ? y->lo_incl : (x->lo_incl && y->lo_incl);
			c = sdb_key_cmp(&x->hi, &y->hi);
			hi = c <= 0 ? &x->hi : &y->hi;
			hi_incl = c < 0 ? x->hi_incl : c > 0 ? y->hi_incl : (x->hi_incl && y->hi_incl);
			c = sdb_key_cmp(lo, hi);
			if (c > 0 || (c == 0 && !(lo_incl && hi_incl)))
				continue;
			key_copy(&r.lo, lo);
			key_copy(&r.hi, hi);
			r.lo_incl = lo_incl;
			r.hi_incl = hi_incl;
			bounds_push(out, &r);
		}
	}
	if (out->n > 1)
		sdb_qsort(out->iv, out->n, sizeof *out->iv, iv_cmp);
}

typedef struct bounds_acc {
	const char *path;
	bool multikey;
	bool have;
	bool have_points;
	sdb_bounds cur;
} bounds_acc;

/* Set kind from the intervals: EMPTY, POINTS or RANGE. */
static void bounds_fix_kind(sdb_bounds *b)
{
	if (b->n == 0) {
		b->kind = SDB_BOUNDS_EMPTY;
		return;
	}
	b->kind = SDB_BOUNDS_POINTS;
	for (size_t i = 0; i < b->n; i++) {
		if (!b->iv[i].lo_incl || !b->iv[i].hi_incl ||
		    sdb_key_cmp(&b->iv[i].lo, &b->iv[i].hi) != 0)
			b->kind = SDB_BOUNDS_RANGE;
	}
}

/* Combine one predicate's bounds (taken over) into the accumulator. */
static void acc_add(bounds_acc *acc, sdb_bounds *b)
{
	sdb_bounds r;

	if (!acc->have) {
		acc->cur = *b;
		acc->have = true;
		acc->have_points = b->kind != SDB_BOUNDS_RANGE;
		return;
	}
	if (acc->multikey) {
		/* one predicate only: prefer points (equality / $in) over a range */
		if (!acc->have_points && b->kind != SDB_BOUNDS_RANGE) {
			sdb_bounds_free(&acc->cur);
			acc->cur = *b;
			acc->have_points = true;
		} else {
			sdb_bounds_free(b);
		}
		return;
	}
	bounds_intersect(&acc->cur, b, &r);
	bounds_fix_kind(&r);
	sdb_bounds_free(&acc->cur);
	sdb_bounds_free(b);
	acc->cur = r;
}

/* pathless: collecting the value-level predicates inside a $elemMatch (value form). */
static void bounds_collect(const node *n, bounds_acc *acc, bool pathless)
{
	sdb_bounds b;

	if (n->kind == N_AND) {
		for (size_t i = 0; i < n->nkids; i++)
			bounds_collect(n->kids[i], acc, pathless);
		return;
	}
	if (n->kind != N_PATH)
		return;
	if (pathless ? n->path != NULL : (!n->path || strcmp(n->path, acc->path) != 0))
		return;
	if (!pathless && n->op == OP_ELEM_VALUE) {
		/* every predicate holds for one element, whose index key is that element:
		 * intersect them even on a multikey index (MongoDB does the same) */
		bounds_acc sub = {.path = NULL, .multikey = false};

		bounds_collect(n->kids[0], &sub, true);
		if (sub.have) {
			bounds_fix_kind(&sub.cur);
			acc_add(acc, &sub.cur);
		}
		return;
	}
	if (!pred_bounds(n, &b))
		return;
	acc_add(acc, &b);
}

int sdb_matcher_bounds(const bson_t *filter, const char *path, bool multikey, sdb_bounds *out,
		       char *err, size_t errlen)
{
	sdb_matcher *m;
	bounds_acc acc = {.path = path, .multikey = multikey};
	int rc;

	memset(out, 0, sizeof *out);
	/* $expr constrains no path, so it is not compiled (it may read `let` variables) */
	rc = sdb_matcher_new_opts(filter, SDB_MATCHER_EXPR_SHAPE, &m, NULL, err, errlen);
	if (rc)
		return rc;
	bounds_collect(m->root, &acc, false); /* $expr constrains no path: ALL */
	sdb_matcher_free(m);
	if (!acc.have)
		return 0;
	*out = acc.cur;
	bounds_fix_kind(out);
	return 0;
}
