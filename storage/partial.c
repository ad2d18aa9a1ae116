/* Partial indexes (issue #20): an index's partialFilterExpression, MongoDB 6.0's rules.
 *
 * - Creation (index_catalog_impl.cpp _checkValidFilterExpressions with the 6.0 default
 *   feature flags): the filter may hold equality ({f: v}, $eq), $exists: true, $gt $gte
 *   $lt $lte, $type, $in, and $and / $or at any depth (an $all of values is an $and of
 *   equalities to mongod's parser, so it is taken too); anything else is refused with 67
 *   CannotCreateIndex "Expression not supported in partial index: ...". (6.0 also accepts
 *   $geoWithin / $geoIntersects there; the matcher has no geo operators, so they are
 *   refused as well.)
 * - Maintenance: a document has entries in the index only when it matches the filter
 *   (under the index's collation), so a unique partial index only refuses duplicates
 *   among the documents it holds.
 * - Planning: the planner uses the index, by itself or by hint, only when every document
 *   the query can return is in it: when the query's filter implies the index's
 *   (store_partial_implied, a conservative form of MongoDB's expression::isSubsetOf:
 *   each conjunct of the index's filter is implied by one of the query's top-level
 *   conjuncts, an $or of it by the query implying one of its branches).
 */
#include "storage/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/bsonval.h"
#include "common/err.h"
#include "storage/collation.h"
#include "storage/decimal.h"
#include "storage/matcher.h"
#include "storage/store_int.h"

/* ------------------------------------------------------------------ creation */

static int refuse_expr(int *code, char *err, size_t errlen, const char *path, const char *op)
{
	*code = 67; /* CannotCreateIndex */
	if (path)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Expression not supported in partial index: %s %s", path, op);
	return sdb_errf(err, errlen, SDB_EINVAL, "Expression not supported in partial index: %s",
			op);
}

static int check_filter(const bson_t *f, int depth, int *code, char *err, size_t errlen);

/* An $all of equalities: a non-empty array of values that are neither regexes nor
 * {$elemMatch: ...} clauses (mongod parses it as an $and of $eq: expression_parser.cpp
 * parseAll; an empty $all is $alwaysFalse, a regex a $regex, $elemMatch ones $elemMatch). */
static bool all_of_equalities(const bson_iter_t *v)
{
	bson_iter_t el;
	bool any = false;
	if (!BSON_ITER_HOLDS_ARRAY(v) || !bson_iter_recurse(v, &el))
		return false;
	while (bson_iter_next(&el)) {
		if (BSON_ITER_HOLDS_REGEX(&el))
			return false;
		bson_iter_t sub;
		if (BSON_ITER_HOLDS_DOCUMENT(&el) && bson_iter_recurse(&el, &sub) &&
		    bson_iter_next(&sub) && bson_iter_key(&sub)[0] == '$')
			return false;
		any = true;
	}
	return any;
}

/* The elements of a $and / $or array: each a filter document. */
static int check_list(const bson_iter_t *arr, int depth, int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	if (!bson_iter_recurse(arr, &it))
		return refuse_expr(code, err, errlen, NULL, bson_iter_key(arr));
	while (bson_iter_next(&it)) {
		bson_t sub;
		uint32_t len;
		const uint8_t *data;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it))
			return refuse_expr(code, err, errlen, NULL, bson_iter_key(arr));
		bson_iter_document(&it, &len, &data);
		if (!bson_init_static(&sub, data, len))
			return refuse_expr(code, err, errlen, NULL, bson_iter_key(arr));
		int rc = check_filter(&sub, depth + 1, code, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static int check_filter(const bson_t *f, int depth, int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	if (depth > 32)
		return refuse_expr(code, err, errlen, NULL, "(nested too deep)");
	if (!bson_iter_init(&it, f))
		return refuse_expr(code, err, errlen, NULL, "(bad document)");
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0) {
			int rc = check_list(&it, depth, code, err, errlen);
			if (rc)
				return rc;
			continue;
		}
		if (k[0] == '$')
			return refuse_expr(code, err, errlen, NULL, k);
		if (BSON_ITER_HOLDS_REGEX(&it))
			return refuse_expr(code, err, errlen, k, "regex");
		bson_iter_t ops;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &ops))
			continue; /* equality */
		bson_iter_t first = ops;
		if (!bson_iter_next(&first) || bson_iter_key(&first)[0] != '$')
			continue; /* equality to a document */
		while (bson_iter_next(&ops)) {
			const char *op = bson_iter_key(&ops);
			if (strcmp(op, "$eq") == 0 || strcmp(op, "$gt") == 0 ||
			    strcmp(op, "$gte") == 0 || strcmp(op, "$lt") == 0 ||
			    strcmp(op, "$lte") == 0 || strcmp(op, "$type") == 0 ||
			    strcmp(op, "$in") == 0)
				continue;
			if (strcmp(op, "$exists") == 0 && bson_iter_as_bool(&ops))
				continue;
			/* an $and of equalities, which 6.0 takes at any depth */
			if (strcmp(op, "$all") == 0 && all_of_equalities(&ops))
				continue;
			if (strcmp(op, "$exists") == 0)
				return refuse_expr(code, err, errlen, k, "$exists: false");
			return refuse_expr(code, err, errlen, k, op);
		}
	}
	return 0;
}

/* The query features createIndexes parses a filter without (index_catalog_impl.cpp parses
 * it with MatchExpressionParser::kBanAllSpecialFeatures; expression_parser.cpp's errors):
 * $expr and $jsonSchema 224 QueryFeatureNotAllowed, $where and $text 2 BadValue, $near
 * $nearSphere $geoNear 5626500. Walks $and / $or / $nor. Returns: 0, or SDB_EINVAL with
 * *code and err set. */
static int check_banned(const bson_t *f, int depth, int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	if (depth > 32 || !bson_iter_init(&it, f))
		return 0; /* the matcher and check_filter refuse these */
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "$expr") == 0 || strcmp(k, "$jsonSchema") == 0) {
			*code = 224; /* QueryFeatureNotAllowed */
			return sdb_errf(err, errlen, SDB_EINVAL, "%s is not allowed in this context",
					k);
		}
		if (strcmp(k, "$where") == 0 || strcmp(k, "$text") == 0) {
			*code = 2;
			return sdb_errf(err, errlen, SDB_EINVAL, "%s is not allowed in this context",
					k);
		}
		bson_iter_t sub;
		if (!bson_iter_recurse(&it, &sub))
			continue;
		if (strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0 || strcmp(k, "$nor") == 0) {
			while (bson_iter_next(&sub)) {
				uint32_t l;
				const uint8_t *d;
				bson_t c;
				if (!BSON_ITER_HOLDS_DOCUMENT(&sub))
					continue;
				bson_iter_document(&sub, &l, &d);
				if (!bson_init_static(&c, d, l))
					continue;
				int rc = check_banned(&c, depth + 1, code, err, errlen);
				if (rc)
					return rc;
			}
			continue;
		}
		if (k[0] == '$' || !BSON_ITER_HOLDS_DOCUMENT(&it))
			continue;
		while (bson_iter_next(&sub)) {
			const char *op = bson_iter_key(&sub);
			if (strcmp(op, "$near") == 0 || strcmp(op, "$nearSphere") == 0 ||
			    strcmp(op, "$geoNear") == 0) {
				*code = 5626500;
				return sdb_errf(err, errlen, SDB_EINVAL,
						"$geoNear, $near, and $nearSphere are not allowed in "
						"this context, as these operators require sorting "
						"geospatial data. If you do not need sort, consider "
						"using $geoWithin instead. Check out "
						"https://dochub.mongodb.org/core/near-sort-operation "
						"and https://dochub.mongodb.org/core/"
						"nearSphere-sort-operationfor more details.");
			}
		}
	}
	return 0;
}

int store_partial_check(const bson_iter_t *pfe, int *code, char *err, size_t errlen)
{
	*code = 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(pfe)) {
		*code = 14; /* TypeMismatch */
		return sdb_errf(err, errlen, SDB_EINVAL,
				"The field 'partialFilterExpression' must be an object, but got %s",
				sdb_bson_type_name(bson_iter_type(pfe)));
	}
	bson_t f;
	uint32_t len;
	const uint8_t *data;
	bson_iter_document(pfe, &len, &data);
	if (!bson_init_static(&f, data, len)) {
		*code = 2;
		return sdb_errf(err, errlen, SDB_EINVAL, "partialFilterExpression is not valid BSON");
	}
	/* the query features a partial filter may not use, then the query language's own
	 * errors (unknown operator, $in needs an array ...) */
	int rc = check_banned(&f, 0, code, err, errlen);
	if (rc)
		return rc;
	sdb_matcher *m = NULL;
	int mcode = 0;
	rc = sdb_matcher_new(&f, &m, &mcode, err, errlen);
	if (rc) {
		*code = mcode ? mcode : 2;
		return rc;
	}
	sdb_matcher_free(m);
	return check_filter(&f, 0, code, err, errlen);
}

/* ------------------------------------------------------------------ maintenance */

bool store_partial_covers(const sdb_store_index *ix, const bson_t *doc)
{
	if (!ix->partial)
		return true;
	const sdb_collator *prev = sdb_collation_use(ix->coll);
	bool r = sdb_matcher_match(ix->partial, doc);
	sdb_collation_use(prev);
	return r;
}

/* ------------------------------------------------------------------ implication */

/* One conjunct of a filter: {path: {op: value}}; op NULL for a top-level operator
 * ($or, $nor, $expr ...) kept whole, path then being its name. */
typedef struct atom {
	const char *path;
	const char *op;
	bson_iter_t v;
} atom;

typedef struct atoms {
	atom *a;
	size_t n, cap;
} atoms;

static void atoms_push(atoms *s, const char *path, const char *op, const bson_iter_t *v)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 8;
		s->a = sdb_realloc(s->a, s->cap * sizeof *s->a);
	}
	s->a[s->n].path = path;
	s->a[s->n].op = op;
	s->a[s->n].v = *v;
	s->n++;
}

/* The conjuncts of filter f ($and flattened). Returns false for a document libbson
 * cannot walk (nothing is then implied). */
static bool collect(const uint8_t *data, uint32_t len, atoms *s, int depth)
{
	bson_t f;
	bson_iter_t it;
	if (depth > 32 || !bson_init_static(&f, data, len) || !bson_iter_init(&it, &f))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "$and") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t el;
			if (!bson_iter_recurse(&it, &el))
				return false;
			while (bson_iter_next(&el)) {
				uint32_t l;
				const uint8_t *d;
				if (!BSON_ITER_HOLDS_DOCUMENT(&el))
					return false;
				bson_iter_document(&el, &l, &d);
				if (!collect(d, l, s, depth + 1))
					return false;
			}
			continue;
		}
		if (k[0] == '$') {
			atoms_push(s, k, NULL, &it);
			continue;
		}
		bson_iter_t ops, first;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &ops)) {
			first = ops;
			if (bson_iter_next(&first) && bson_iter_key(&first)[0] == '$') {
				while (bson_iter_next(&ops)) {
					bson_iter_t el;
					/* {f: {$all: [v, w]}} is {f: v, f: w} (mongod's parse) */
					if (strcmp(bson_iter_key(&ops), "$all") == 0 &&
					    all_of_equalities(&ops) && bson_iter_recurse(&ops, &el)) {
						while (bson_iter_next(&el))
							atoms_push(s, k, "$eq", &el);
						continue;
					}
					atoms_push(s, k, bson_iter_key(&ops), &ops);
				}
				continue;
			}
		}
		atoms_push(s, k, "$eq", &it);
	}
	return true;
}

/* Two values that are the same BSON (type and bytes): the query and the index say the
 * same thing. */
static bool same_value(const bson_iter_t *a, const bson_iter_t *b)
{
	if (bson_iter_type(a) != bson_iter_type(b))
		return false;
	bson_t x = BSON_INITIALIZER, y = BSON_INITIALIZER;
	bson_append_iter(&x, "v", 1, a);
	bson_append_iter(&y, "v", 1, b);
	bool r = bson_equal(&x, &y);
	bson_destroy(&x);
	bson_destroy(&y);
	return r;
}

/* A value whose comparisons stay inside its own bracket (not null / undefined: they
 * also match missing fields; not MinKey / MaxKey: they compare across brackets). */
static bool plain_value(const bson_iter_t *v)
{
	int b = sdb_bson_bracket(bson_iter_type(v));
	return b != SDB_BRACKET_NULL && b != SDB_BRACKET_MINKEY && b != SDB_BRACKET_MAXKEY;
}

/* Is v a NaN (double or Decimal128): mongod's std::isnan(elem.numberDouble()). */
static bool nan_value(const bson_iter_t *v)
{
	if (BSON_ITER_HOLDS_DOUBLE(v))
		return isnan(bson_iter_double(v));
	if (BSON_ITER_HOLDS_DECIMAL128(v)) {
		bson_decimal128_t d;
		bson_iter_decimal128(v, &d);
		return sdb_dec_is_nan(d);
	}
	return false;
}

/* An operator whose matches include the value itself ($eq $lte $gte): mongod's
 * expression_algo.cpp supportsEquality. */
static bool equality_op(const char *op)
{
	return strcmp(op, "$eq") == 0 || strcmp(op, "$lte") == 0 || strcmp(op, "$gte") == 0;
}

/* Does a document matching {path: {q->op: q->v}} have the field (not null)? */
static bool implies_exists(const atom *q)
{
	const char *op = q->op;
	if (strcmp(op, "$exists") == 0)
		return bson_iter_as_bool(&q->v);
	if (strcmp(op, "$type") == 0 || strcmp(op, "$regex") == 0 ||
	    strcmp(op, "$elemMatch") == 0 || strcmp(op, "$size") == 0 || strcmp(op, "$mod") == 0)
		return true;
	if (strcmp(op, "$eq") == 0 || strcmp(op, "$gt") == 0 || strcmp(op, "$gte") == 0 ||
	    strcmp(op, "$lt") == 0 || strcmp(op, "$lte") == 0)
		return plain_value(&q->v);
	if (strcmp(op, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&q->v)) {
		bson_iter_t el;
		bool any = false;
		if (!bson_iter_recurse(&q->v, &el))
			return false;
		while (bson_iter_next(&el)) {
			if (!plain_value(&el))
				return false;
			any = true;
		}
		return any;
	}
	return false;
}

/* Is value v (of an equality) one of the elements of the $in array arr? */
static bool in_list(const bson_iter_t *v, const bson_iter_t *arr)
{
	bson_iter_t el;
	if (!BSON_ITER_HOLDS_ARRAY(arr) || !bson_iter_recurse(arr, &el))
		return false;
	while (bson_iter_next(&el)) {
		if (BSON_ITER_HOLDS_REGEX(&el))
			continue;
		if (nan_value(v) || nan_value(&el)) {
			/* NaN equals only NaN (mongod _isSubsetOf: a double and a decimal NaN too) */
			if (nan_value(v) && nan_value(&el))
				return true;
			continue;
		}
		if (same_value(v, &el))
			return true;
	}
	return false;
}

static bool atom_implies(const atom *q, const atom *p);

/* Does the conjunction qs imply the filter document at data (each of its conjuncts)? */
static bool conj_implies(const atoms *qs, const uint8_t *data, uint32_t len, int depth)
{
	atoms ps = {0};
	bool ok = collect(data, len, &ps, depth);
	for (size_t i = 0; ok && i < ps.n; i++) {
		bool found = false;
		for (size_t j = 0; j < qs->n && !found; j++)
			found = atom_implies(&qs->a[j], &ps.a[i]);
		/* an $or of the filter: implied when one of its branches is */
		if (!found && !ps.a[i].op && strcmp(ps.a[i].path, "$or") == 0 &&
		    BSON_ITER_HOLDS_ARRAY(&ps.a[i].v) && depth < 32) {
			bson_iter_t br;
			if (bson_iter_recurse(&ps.a[i].v, &br)) {
				while (!found && bson_iter_next(&br)) {
					uint32_t l;
					const uint8_t *d;
					if (!BSON_ITER_HOLDS_DOCUMENT(&br))
						break;
					bson_iter_document(&br, &l, &d);
					found = conj_implies(qs, d, l, depth + 1);
				}
			}
		}
		ok = found;
	}
	free(ps.a);
	return ok;
}

/* Does the query conjunct q imply the index's conjunct p (same path)? */
static bool atom_implies(const atom *q, const atom *p)
{
	if (!p->op || !q->op) /* top-level operators: only the same one */
		return !p->op && !q->op && strcmp(p->path, q->path) == 0 && same_value(&q->v, &p->v);
	if (strcmp(q->path, p->path) != 0)
		return false;
	if (strcmp(q->op, p->op) == 0 && same_value(&q->v, &p->v))
		return true;
	const char *po = p->op, *qo = q->op;
	if (strcmp(po, "$exists") == 0)
		return bson_iter_as_bool(&p->v) && implies_exists(q);
	if (strcmp(po, "$in") == 0) {
		if (strcmp(qo, "$eq") == 0)
			return !BSON_ITER_HOLDS_ARRAY(&q->v) && !BSON_ITER_HOLDS_REGEX(&q->v) &&
			       in_list(&q->v, &p->v);
		if (strcmp(qo, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&q->v)) {
			bson_iter_t el;
			bool any = false;
			if (!bson_iter_recurse(&q->v, &el))
				return false;
			while (bson_iter_next(&el)) {
				if (BSON_ITER_HOLDS_ARRAY(&el) || BSON_ITER_HOLDS_REGEX(&el) ||
				    !in_list(&el, &p->v))
					return false;
				any = true;
			}
			return any;
		}
		return false;
	}
	bool pgt = strcmp(po, "$gt") == 0, pgte = strcmp(po, "$gte") == 0;
	bool plt = strcmp(po, "$lt") == 0, plte = strcmp(po, "$lte") == 0;
	if (!pgt && !pgte && !plt && !plte)
		return false; /* $eq, $type: only the same conjunct */
	bool qeq = strcmp(qo, "$eq") == 0, qgt = strcmp(qo, "$gt") == 0,
	     qgte = strcmp(qo, "$gte") == 0, qlt = strcmp(qo, "$lt") == 0,
	     qlte = strcmp(qo, "$lte") == 0;
	if (!plain_value(&p->v) || !plain_value(&q->v) ||
	    sdb_bson_bracket(bson_iter_type(&p->v)) != sdb_bson_bracket(bson_iter_type(&q->v)))
		return false;
	/* strings compare under the query's collation on one side and the index's on the
	 * other: the caller only asks when they are the same */
	/* NaN compares equal only to itself (mongod expression_algo.cpp _isSubsetOf): a
	 * comparison with a NaN on either side is a subset only when both are NaN and both
	 * operators match the value itself ({a: NaN} is within {a: {$lte: NaN}}, never within
	 * {a: {$lt: 5}}: NaN sorts below every number but $lt 5 does not match it) */
	if (nan_value(&q->v) || nan_value(&p->v))
		return equality_op(qo) && equality_op(po) && nan_value(&q->v) && nan_value(&p->v);
	int c = sdb_bson_value_cmp(bson_iter_value((bson_iter_t *)&q->v),
				   bson_iter_value((bson_iter_t *)&p->v));
	if (pgt)
		return (qeq && c > 0) || (qgt && c >= 0) || (qgte && c > 0);
	if (pgte)
		return (qeq || qgt || qgte) && c >= 0;
	if (plt)
		return (qeq && c < 0) || (qlt && c <= 0) || (qlte && c < 0);
	return (qeq || qlt || qlte) && c <= 0; /* plte */
}

bool store_partial_implied(const bson_t *query, const sdb_store_index *ix)
{
	if (!ix->partial)
		return true;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, ix->spec, "partialFilterExpression") ||
	    !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	uint32_t plen;
	const uint8_t *pdata;
	bson_iter_document(&it, &plen, &pdata);
	atoms qs = {0};
	bool ok = collect(bson_get_data(query), query->len, &qs, 0) &&
		  conj_implies(&qs, pdata, plen, 0);
	free(qs.a);
	return ok;
}

/* ------------------------------------------------------------------ identity */

/* A list of canonical nodes (each an owned document {path: {op: v}}, {"$or": [...]} or
 * another top-level operator kept whole). */
typedef struct nodes {
	bson_t **a;
	size_t n, cap;
} nodes;

static void nodes_push(nodes *s, bson_t *d)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 8;
		s->a = sdb_realloc(s->a, s->cap * sizeof *s->a);
	}
	s->a[s->n++] = d;
}

static void nodes_free(nodes *s)
{
	for (size_t i = 0; i < s->n; i++)
		bson_destroy(s->a[i]);
	free(s->a);
	s->a = NULL;
	s->n = s->cap = 0;
}

static int node_cmp(const void *x, const void *y)
{
	return sdb_bson_doc_cmp(*(bson_t *const *)x, *(bson_t *const *)y);
}

static int value_cmp(const void *x, const void *y)
{
	return sdb_bson_value_cmp((const bson_value_t *)x, (const bson_value_t *)y);
}

/* {path: {op: v}} */
static bson_t *leaf(const char *path, const char *op, const bson_value_t *v)
{
	bson_t *d = bson_new(), sub;
	bson_append_document_begin(d, path, -1, &sub);
	bson_append_value(&sub, op, -1, v);
	bson_append_document_end(d, &sub);
	return d;
}

/* A list node {name: [sorted nodes]}; takes the nodes. */
static bson_t *list_node(const char *name, nodes *s)
{
	qsort(s->a, s->n, sizeof *s->a, node_cmp);
	bson_t *d = bson_new(), arr;
	bson_append_array_begin(d, name, -1, &arr);
	for (size_t i = 0; i < s->n; i++) {
		char key[24];
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document(&arr, key, -1, s->a[i]);
	}
	bson_append_array_end(d, &arr);
	nodes_free(s);
	return d;
}

/* Is d the list node {name: [...]}? Then *arr iterates its nodes. */
static bool is_list(const bson_t *d, const char *name, bson_iter_t *arr)
{
	bson_iter_t it;
	return bson_iter_init(&it, d) && bson_iter_next(&it) &&
	       strcmp(bson_iter_key(&it), name) == 0 && BSON_ITER_HOLDS_ARRAY(&it) &&
	       bson_iter_recurse(&it, arr);
}

/* Push copies of a list node's nodes, or the node itself (a conjunct inside a conjunction,
 * a branch inside a disjunction: MatchExpression::optimize flattens them); takes d. */
static void splice(nodes *s, bson_t *d, const char *name)
{
	bson_iter_t el;
	if (!is_list(d, name, &el)) {
		nodes_push(s, d);
		return;
	}
	while (bson_iter_next(&el)) {
		uint32_t l;
		const uint8_t *p;
		if (!BSON_ITER_HOLDS_DOCUMENT(&el))
			continue;
		bson_iter_document(&el, &l, &p);
		nodes_push(s, bson_new_from_data(p, l));
	}
	bson_destroy(d);
}

static bson_t *canon_doc(const uint8_t *data, uint32_t len, int depth);
static bson_t *type_leaf(const char *path, const bson_iter_t *v);

/* The conjuncts of filter document data, canonical, into s. */
static void canon_conj(const uint8_t *data, uint32_t len, nodes *s, int depth)
{
	bson_t f;
	bson_iter_t it;
	if (depth > 32 || !bson_init_static(&f, data, len) || !bson_iter_init(&it, &f))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		const bson_value_t *v = bson_iter_value(&it);
		bson_iter_t el;
		if ((strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0) &&
		    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &el)) {
			bool is_and = k[1] == 'a';
			nodes br = {0};
			while (bson_iter_next(&el)) {
				uint32_t l;
				const uint8_t *p;
				if (!BSON_ITER_HOLDS_DOCUMENT(&el))
					continue;
				bson_iter_document(&el, &l, &p);
				if (is_and)
					canon_conj(p, l, s, depth + 1);
				else
					splice(&br, canon_doc(p, l, depth + 1), "$or");
			}
			if (is_and)
				continue;
			/* a one-branch $or is its branch */
			if (br.n == 1) {
				bson_t *one = br.a[0];
				free(br.a);
				splice(s, one, "$and");
			} else {
				nodes_push(s, list_node("$or", &br));
			}
			continue;
		}
		if (k[0] == '$') {
			bson_t *d = bson_new();
			bson_append_value(d, k, -1, v);
			nodes_push(s, d);
			continue;
		}
		bson_iter_t ops, first;
		bool opdoc = BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &ops);
		if (opdoc) {
			first = ops;
			opdoc = bson_iter_next(&first) && bson_iter_key(&first)[0] == '$';
		}
		if (!opdoc) {
			nodes_push(s, leaf(k, "$eq", v)); /* {f: v} is {f: {$eq: v}} */
			continue;
		}
		while (bson_iter_next(&ops)) {
			const char *op = bson_iter_key(&ops);
			const bson_value_t *ov = bson_iter_value(&ops);
			if (strcmp(op, "$exists") == 0) {
				bson_value_t b = {.value_type = BSON_TYPE_BOOL};
				b.value.v_bool = bson_iter_as_bool(&ops);
				nodes_push(s, leaf(k, op, &b));
				continue;
			}
			if (strcmp(op, "$type") == 0) {
				bson_t *t = type_leaf(k, &ops);
				nodes_push(s, t ? t : leaf(k, op, ov));
				continue;
			}
			bson_iter_t in;
			if (strcmp(op, "$all") == 0 && all_of_equalities(&ops) &&
			    bson_iter_recurse(&ops, &in)) {
				while (bson_iter_next(&in)) /* an $and of equalities */
					nodes_push(s, leaf(k, "$eq", bson_iter_value(&in)));
				continue;
			}
			if (strcmp(op, "$in") != 0 || !BSON_ITER_HOLDS_ARRAY(&ops) ||
			    !bson_iter_recurse(&ops, &in)) {
				nodes_push(s, leaf(k, op, ov));
				continue;
			}
			/* $in: a set (InMatchExpression sorts and dedups its equalities); of one
			 * value, an equality (optimize) */
			bson_value_t *vals = NULL;
			size_t n = 0, cap = 0;
			bool regex = false;
			while (bson_iter_next(&in)) {
				if (BSON_ITER_HOLDS_REGEX(&in))
					regex = true;
				if (n == cap) {
					cap = cap ? cap * 2 : 8;
					vals = sdb_realloc(vals, cap * sizeof *vals);
				}
				vals[n++] = *bson_iter_value(&in);
			}
			if (regex) { /* the regexes' order is kept by mongod: the list as given */
				free(vals);
				nodes_push(s, leaf(k, op, ov));
				continue;
			}
			qsort(vals, n, sizeof *vals, value_cmp);
			size_t m = 0;
			for (size_t i = 0; i < n; i++)
				if (m == 0 || sdb_bson_value_cmp(&vals[m - 1], &vals[i]) != 0)
					vals[m++] = vals[i];
			if (m == 1) {
				nodes_push(s, leaf(k, "$eq", &vals[0]));
			} else {
				bson_t *d = bson_new(), sub, arr;
				bson_append_document_begin(d, k, -1, &sub);
				bson_append_array_begin(&sub, op, -1, &arr);
				for (size_t i = 0; i < m; i++) {
					char key[24];
					snprintf(key, sizeof key, "%zu", i);
					bson_append_value(&arr, key, -1, &vals[i]);
				}
				bson_append_array_end(&sub, &arr);
				bson_append_document_end(d, &sub);
				nodes_push(s, d);
			}
			free(vals);
		}
	}
}

static int int_cmp(const void *x, const void *y)
{
	int a = *(const int *)x, b = *(const int *)y;
	return (a > b) - (a < b);
}

/* Add one $type operand (an alias, "number" or a code) to the set. Returns: false for
 * one the matcher would not take. */
static bool type_add_one(const bson_iter_t *it, int *codes, size_t *n, bool *number)
{
	int code;
	if (BSON_ITER_HOLDS_UTF8(it)) {
		uint32_t l;
		const char *str = bson_iter_utf8(it, &l);
		if (strcmp(str, "number") == 0) {
			*number = true;
			return true;
		}
		if (!sdb_bson_type_code(str, l, &code))
			return false;
	} else if (BSON_ITER_HOLDS_NUMBER(it)) {
		code = (int)bson_iter_as_int64(it);
	} else {
		return false;
	}
	if (*n == 64)
		return false;
	codes[(*n)++] = code;
	return true;
}

/* {path: {$type: [("number",) codes sorted, without duplicates]}}: the type set mongod's
 * TypeMatchExpression compares (MatcherTypeSet: "number" is a flag of its own, aliases are
 * their codes). NULL for a value the matcher would not take. */
static bson_t *type_leaf(const char *path, const bson_iter_t *v)
{
	int codes[64];
	size_t n = 0;
	bool number = false;
	if (BSON_ITER_HOLDS_ARRAY(v)) {
		bson_iter_t el;
		if (!bson_iter_recurse(v, &el))
			return NULL;
		while (bson_iter_next(&el))
			if (!type_add_one(&el, codes, &n, &number))
				return NULL;
	} else if (!type_add_one(v, codes, &n, &number)) {
		return NULL;
	}
	qsort(codes, n, sizeof *codes, int_cmp);
	bson_t *d = bson_new(), sub, list;
	bson_append_document_begin(d, path, -1, &sub);
	bson_append_array_begin(&sub, "$type", -1, &list);
	size_t k = 0;
	char key[24];
	if (number) {
		snprintf(key, sizeof key, "%zu", k++);
		bson_append_utf8(&list, key, -1, "number", -1);
	}
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && codes[i] == codes[i - 1])
			continue;
		snprintf(key, sizeof key, "%zu", k++);
		bson_append_int32(&list, key, -1, codes[i]);
	}
	bson_append_array_end(&sub, &list);
	bson_append_document_end(d, &sub);
	return d;
}

/* The canonical node of a filter document: its one conjunct, or {"$and": [sorted]}. */
static bson_t *canon_doc(const uint8_t *data, uint32_t len, int depth)
{
	nodes s = {0};
	canon_conj(data, len, &s, depth);
	if (s.n == 1) {
		bson_t *one = s.a[0];
		free(s.a);
		return one;
	}
	return list_node("$and", &s);
}

bool store_partial_same(const bson_iter_t *a, const bson_iter_t *b)
{
	if (!BSON_ITER_HOLDS_DOCUMENT(a) || !BSON_ITER_HOLDS_DOCUMENT(b)) {
		bson_t x = BSON_INITIALIZER, y = BSON_INITIALIZER;
		bson_append_iter(&x, "v", 1, a);
		bson_append_iter(&y, "v", 1, b);
		bool r = bson_equal(&x, &y);
		bson_destroy(&x);
		bson_destroy(&y);
		return r;
	}
	uint32_t la, lb;
	const uint8_t *da, *db;
	bson_iter_document(a, &la, &da);
	bson_iter_document(b, &lb, &db);
	/* strings by their bytes: mongod does not compare filters under the collation
	 * (SERVER-47664) */
	const sdb_bson_collator *prev = sdb_bson_collator_set(NULL);
	bson_t *ca = canon_doc(da, la, 0), *cb = canon_doc(db, lb, 0);
	bool r = sdb_bson_doc_cmp(ca, cb) == 0;
	sdb_bson_collator_set(prev);
	bson_destroy(ca);
	bson_destroy(cb);
	return r;
}
