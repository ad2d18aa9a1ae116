/* Find projections: see projection.h. */
#include "storage/projection.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/pipeline_int.h"

typedef enum {
	P_INTERNAL = 0, /* has children */
	P_INCLUDE,
	P_EXCLUDE,
	P_SLICE,     /* find only */
	P_ELEMMATCH, /* find only */
	P_EXPR,      /* aggregation only: a computed field */
} paction;

typedef struct pnode pnode;
struct pnode {
	char *name;
	paction action;
	pnode **kids;
	size_t nkids;
	int64_t skip; /* $slice: [skip, limit]; for $slice: N, skip = N and has_limit false */
	int64_t limit;
	bool has_limit;
	bool has_expr; /* a P_EXPR at or below this node (set after parsing) */
	sdb_matcher *em;
	expr *x; /* P_EXPR */
};

struct sdb_projection {
	pnode root;
	sdb_projection_kind kind;
	int mode;    /* 0 undecided, 1 inclusion, -1 exclusion; ADD_FIELDS keeps 0 */
	int id_mode; /* -1 default (include), 0 excluded, 1 included */
	bool any_elemmatch;
};

/* MongoDB prefixes the $project stage's parse errors with the stage name. */
static const char *stage_prefix(const sdb_projection *p)
{
	return p->kind == SDB_PROJECTION_PROJECT ? "Invalid $project :: caused by :: " : "";
}

static void pnode_clear(pnode *n)
{
	for (size_t i = 0; i < n->nkids; i++) {
		pnode_clear(n->kids[i]);
		free(n->kids[i]);
	}
	free(n->kids);
	free(n->name);
	sdb_matcher_free(n->em);
	agg_expr_free(n->x);
	memset(n, 0, sizeof *n);
}

static pnode *pnode_kid(const pnode *n, const char *name, size_t len)
{
	for (size_t i = 0; i < n->nkids; i++)
		if (strlen(n->kids[i]->name) == len && memcmp(n->kids[i]->name, name, len) == 0)
			return n->kids[i];
	return NULL;
}

/* Insert path into the tree; returns the new leaf or NULL on a path collision. */
static pnode *pnode_insert(pnode *root, const char *path)
{
	pnode *cur = root;
	const char *p = path;

	for (;;) {
		const char *dot = strchr(p, '.');
		size_t len = dot ? (size_t)(dot - p) : strlen(p);
		pnode *k = pnode_kid(cur, p, len);

		if (k) {
			if (k->action != P_INTERNAL || !dot)
				return NULL; /* "a" then "a.b", or "a.b" then "a", or "a" twice */
		} else {
			k = sdb_calloc(1, sizeof *k);
			k->name = sdb_strndup(p, len);
			cur->kids = sdb_realloc(cur->kids, (cur->nkids + 1) * sizeof *cur->kids);
			cur->kids[cur->nkids++] = k;
		}
		if (!dot)
			return k;
		cur = k;
		p = dot + 1;
	}
}

/* Set has_expr on every node; returns n's. */
static bool mark_exprs(pnode *n)
{
	n->has_expr = n->action == P_EXPR;
	for (size_t i = 0; i < n->nkids; i++)
		if (mark_exprs(n->kids[i]))
			n->has_expr = true;
	return n->has_expr;
}

static bool whole_i64(const bson_iter_t *it, int64_t *out)
{
	double d;

	switch (bson_iter_type(it)) {
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
		*out = bson_iter_as_int64(it);
		return true;
	case BSON_TYPE_DOUBLE:
		d = bson_iter_double(it);
		if (!(d > -9.2e18 && d < 9.2e18))
			return false;
		*out = (int64_t)d;
		return true;
	default:
		return false;
	}
}

static int parse_slice(pnode *n, const bson_iter_t *it, const ectx *pe)
{
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t e;
		int64_t v[2];
		int count = 0;

		if (!bson_iter_recurse(it, &e))
			return efail(pe, 2, "corrupt $slice argument");
		while (bson_iter_next(&e)) {
			if (count == 2 || !whole_i64(&e, &v[count]))
				return efail(pe, 28724,
					     "First argument to $slice must be an array, second "
					     "argument must be a number");
			count++;
		}
		if (count != 2)
			return efail(pe, 28724, "$slice array argument must have exactly two numbers");
		if (v[1] <= 0)
			return efail(pe, 28724, "$slice limit must be positive");
		n->skip = v[0];
		n->limit = v[1];
		n->has_limit = true;
		return 0;
	}
	if (!whole_i64(it, &n->skip))
		return efail(pe, 2, "$slice only supports numbers and [skip, limit] arrays");
	n->has_limit = false;
	return 0;
}

static int add_field(sdb_projection *p, const char *path, const bson_iter_t *it, const ectx *pe,
		     int depth);

static int add_nested(sdb_projection *p, const char *prefix, const bson_iter_t *it,
		      const ectx *pe, int depth)
{
	bson_iter_t c;

	if (depth > 100)
		return efail(pe, 2, "projection nested too deeply");
	if (!bson_iter_recurse(it, &c))
		return efail(pe, 2, "corrupt projection");
	while (bson_iter_next(&c)) {
		char *path = sdb_asprintf("%s.%s", prefix, bson_iter_key(&c));
		int rc = add_field(p, path, &c, pe, depth + 1);

		free(path);
		if (rc)
			return rc;
	}
	return 0;
}

/* A boolean or number is an inclusion/exclusion flag (*ok); its truth in the result. */
static bool proj_flag(const bson_iter_t *it, bool *ok)
{
	*ok = true;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_BOOL:
		return bson_iter_bool(it);
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
		return bson_iter_as_int64(it) != 0;
	case BSON_TYPE_DOUBLE:
		return bson_iter_double(it) != 0;
	case BSON_TYPE_DECIMAL128: {
		bson_decimal128_t d;
		char buf[BSON_DECIMAL128_STRING];

		bson_iter_decimal128(it, &d);
		bson_decimal128_to_string(&d, buf);
		return strtod(buf, NULL) != 0;
	}
	default:
		*ok = false;
		return false;
	}
}

/* The find-only operators: {path: {$slice: ...}} and {path: {$elemMatch: ...}}; c is on
 * the operator ($slice or $elemMatch). */
static int add_find_operator(sdb_projection *p, const char *path, bson_iter_t *c,
			     const ectx *pe)
{
	const char *op = bson_iter_key(c);
	pnode *n;
	int rc;

	n = pnode_insert(&p->root, path);
	if (!n)
		return efail(pe, 31250, "Path collision at %s", path);
	if (op[1] == 's') {
		n->action = P_SLICE;
		rc = parse_slice(n, c, pe);
	} else {
		const bson_value_t *v;
		bson_iter_t cc = *c;
		bson_t cond;

		if (strchr(path, '.'))
			return efail(pe, 2, "Cannot use $elemMatch projection on a nested field.");
		if (!BSON_ITER_HOLDS_DOCUMENT(c))
			return efail(pe, 2, "elemMatch: Invalid argument, object required.");
		n->action = P_ELEMMATCH;
		p->any_elemmatch = true;
		v = bson_iter_value(&cc);
		if (!v->value.v_doc.data ||
		    !bson_init_static(&cond, v->value.v_doc.data, v->value.v_doc.data_len))
			return efail(pe, 2, "corrupt $elemMatch argument");
		rc = sdb_matcher_new_elem(&cond, &n->em, pe->code, pe->err, pe->errlen);
	}
	if (rc)
		return rc;
	if (bson_iter_next(c))
		return efail(pe, 2, "projection operator object must have one field");
	return 0;
}

/* A computed field: the value at it is an aggregation expression (find takes them too
 * since MongoDB 4.4). */
static int add_expr(sdb_projection *p, const char *path, const bson_iter_t *it, const ectx *pe)
{
	pnode *n;

	if (p->kind != SDB_PROJECTION_ADD_FIELDS) {
		if (p->mode < 0)
			return efail(pe, 31252,
				     "%sCannot use expression other than $meta in exclusion "
				     "projection",
				     stage_prefix(p));
		p->mode = 1;
	}
	n = pnode_insert(&p->root, path);
	if (!n)
		return efail(pe, 31250, "Path collision at %s", path);
	n->action = P_EXPR;
	return agg_expr_parse(it, &n->x, pe);
}

static int add_field(sdb_projection *p, const char *path, const bson_iter_t *it, const ectx *pe,
		     int depth)
{
	pnode *n;
	bool ok, inc;
	size_t len = strlen(path);

	if (len == 0 || path[len - 1] == '.' || strstr(path, "..") || path[0] == '.')
		return efail(pe, 40352, "FieldPath field names may not be empty strings.");
	if (sdb_path_components(path) > SDB_PATH_MAX_COMPONENTS)
		return efail(pe, SDB_ERR_PATH_TOO_LONG, "FieldPath is too long");
	if (p->kind == SDB_PROJECTION_FIND &&
	    (strcmp(path, "$") == 0 || strstr(path, ".$") != NULL))
		return efail(pe, 2,
			     "positional projection operator $ is not supported by stripedb "
			     "(field %s)",
			     path);
	if (path[0] == '$' || strstr(path, ".$") != NULL)
		return efail(pe, 16410, "FieldPath field names may not start with '$'. Consider "
					"using $getField or $setField.");
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t c;

		if (!bson_iter_recurse(it, &c) || !bson_iter_next(&c)) {
			if (p->kind == SDB_PROJECTION_ADD_FIELDS)
				return add_expr(p, path, it, pe); /* the literal {} */
			return efail(pe, 51270, "An empty sub-projection is not a valid value. "
						"Found empty object at path");
		}
		if (bson_iter_key(&c)[0] != '$')
			return add_nested(p, path, it, pe, depth);
		if (strcmp(bson_iter_key(&c), "$meta") == 0)
			return efail(pe, 2, "$meta projection is not supported by stripedb");
		if (p->kind == SDB_PROJECTION_FIND && (strcmp(bson_iter_key(&c), "$slice") == 0 ||
						       strcmp(bson_iter_key(&c), "$elemMatch") == 0))
			return add_find_operator(p, path, &c, pe);
		return add_expr(p, path, it, pe);
	}
	inc = proj_flag(it, &ok);
	if (!ok || p->kind == SDB_PROJECTION_ADD_FIELDS)
		return add_expr(p, path, it, pe);
	if (strcmp(path, "_id") == 0) {
		if (pnode_kid(&p->root, "_id", 3))
			return efail(pe, 31250, "Path collision at %s", path);
		p->id_mode = inc ? 1 : 0;
		return 0;
	}
	if (inc && p->mode < 0)
		return efail(pe, 31253, "%sCannot do inclusion on field %s in exclusion projection",
			     stage_prefix(p), path);
	if (!inc && p->mode > 0)
		return efail(pe, 31254, "%sCannot do exclusion on field %s in inclusion projection",
			     stage_prefix(p), path);
	p->mode = inc ? 1 : -1;
	n = pnode_insert(&p->root, path);
	if (!n)
		return efail(pe, 31250, "Path collision at %s", path);
	n->action = inc ? P_INCLUDE : P_EXCLUDE;
	return 0;
}

int sdb_projection_new_kind(const bson_t *spec, sdb_projection_kind kind, sdb_projection **out,
			    int *code, char *err, size_t errlen)
{
	return sdb_projection_new_vars(spec, kind, NULL, out, code, err, errlen);
}

int sdb_projection_new_vars(const bson_t *spec, sdb_projection_kind kind, const bson_t *vars,
			    sdb_projection **out, int *code, char *err, size_t errlen)
{
	sdb_projection *p = sdb_calloc(1, sizeof *p);
	const ectx pe = {.code = code, .err = err, .errlen = errlen, .vars = vars};
	bson_iter_t it;
	int rc = 0;

	*out = NULL;
	if (code)
		*code = 0;
	p->kind = kind;
	p->id_mode = -1;
	if (!bson_iter_init(&it, spec)) {
		rc = efail(&pe, 2, "corrupt projection document");
		goto fail;
	}
	while (bson_iter_next(&it)) {
		rc = add_field(p, bson_iter_key(&it), &it, &pe, 0);
		if (rc)
			goto fail;
	}
	mark_exprs(&p->root);
	if (p->mode == 0 && kind != SDB_PROJECTION_ADD_FIELDS) {
		/* only _id, $slice and/or $elemMatch: {_id: 1}, an _id expression or
		 * $elemMatch alone is an inclusion, {_id: 0} or $slice alone an exclusion, {}
		 * returns everything */
		if (p->any_elemmatch || p->id_mode == 1 || p->root.has_expr)
			p->mode = 1;
		else
			p->mode = -1;
	}
	*out = p;
	return 0;
fail:
	sdb_projection_free(p);
	return rc;
}

int sdb_projection_new(const bson_t *spec, sdb_projection **out, int *code, char *err,
		       size_t errlen)
{
	return sdb_projection_new_kind(spec, SDB_PROJECTION_FIND, out, code, err, errlen);
}

bool sdb_projection_is_inclusion(const sdb_projection *p)
{
	return p->mode > 0;
}

void sdb_projection_free(sdb_projection *p)
{
	if (!p)
		return;
	pnode_clear(&p->root);
	free(p);
}

/* ---- apply ------------------------------------------------------------------------ */

static void append_slice(const pnode *n, bson_t *out, const char *key, size_t keylen,
			 const bson_iter_t *it)
{
	bson_iter_t e;
	int64_t count = 0, start, end, i = 0;
	bson_t arr;
	char ibuf[16];
	const char *ikey;
	uint32_t outi = 0;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e)) {
		bson_append_iter(out, key, (int)keylen, it);
		return;
	}
	while (bson_iter_next(&e))
		count++;
	if (!n->has_limit) {
		if (n->skip >= 0) {
			start = 0;
			end = n->skip < count ? n->skip : count;
		} else {
			start = count + n->skip < 0 ? 0 : count + n->skip;
			end = count;
		}
	} else {
		if (n->skip >= 0)
			start = n->skip < count ? n->skip : count;
		else
			start = count + n->skip < 0 ? 0 : count + n->skip;
		end = n->limit > count - start ? count : start + n->limit;
	}
	bson_append_array_begin(out, key, (int)keylen, &arr);
	bson_iter_recurse(it, &e);
	while (bson_iter_next(&e)) {
		if (i >= start && i < end) {
			bson_uint32_to_string(outi++, &ikey, ibuf, sizeof ibuf);
			bson_append_iter(&arr, ikey, -1, &e);
		}
		i++;
	}
	bson_append_array_end(out, &arr);
}

static void append_elemmatch(const pnode *n, bson_t *out, const char *key, size_t keylen,
			     const bson_iter_t *it)
{
	bson_iter_t e;
	bson_t arr;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &e))
		return;
	while (bson_iter_next(&e)) {
		if (sdb_matcher_match_value(n->em, &e)) {
			bson_append_array_begin(out, key, (int)keylen, &arr);
			bson_append_iter(&arr, "0", 1, &e);
			bson_append_array_end(out, &arr);
			return;
		}
	}
}

/* One application: the projection, the whole input document (expressions read it as
 * $$ROOT/$$CURRENT) and where errors go. */
typedef struct actx {
	const sdb_projection *p;
	const bson_t *root;
	const ectx *e;
} actx;

static const uint8_t empty_doc[5] = {5, 0, 0, 0, 0};

static int apply_doc(const actx *a, const pnode *n, const uint8_t *data, size_t len, bson_t *out,
		     bool top, int depth);

/* Append the document n makes of data[0..len) under key (every level of a computed path
 * is a document, also where the input held a scalar or nothing: empty_doc). */
static int append_sub(const actx *a, const pnode *n, const uint8_t *data, size_t len,
		      bson_t *out, const char *key, size_t keylen, bool skip_empty, int depth)
{
	bson_t sub = BSON_INITIALIZER;
	int rc = apply_doc(a, n, data, len, &sub, false, depth + 1);

	if (rc == 0 && !(skip_empty && bson_empty(&sub)))
		bson_append_document(out, key, (int)keylen, &sub);
	bson_destroy(&sub);
	return rc;
}

/* Evaluate the computed field n and append it under key; "missing" ($$REMOVE, a missing
 * path) appends nothing. */
static int append_expr(const actx *a, const pnode *n, bson_t *out, const char *key,
		       size_t keylen)
{
	docbuild_node *v = NULL;
	int rc = agg_expr_eval(n->x, a->root, &v, a->e);

	if (rc == 0 && v != NULL && docbuild_depth(v, SDB_BSON_MAX_DEPTH) >= SDB_BSON_MAX_DEPTH)
		rc = efail(a->e, 15,
			   "cannot convert document to BSON because it exceeds the limit of %d "
			   "levels of nesting",
			   SDB_BSON_MAX_DEPTH); /* as a stage's output (pipeline.c node_to_heap) */
	if (rc == 0 && v != NULL)
		docbuild_append(out, key, (int)keylen, v);
	docbuild_free(v);
	return rc;
}

/* Project one array element or sub-document it under the internal node n. */
static int apply_value(const actx *a, const pnode *n, const bson_iter_t *it, bson_t *out,
		       const char *key, size_t keylen, int depth)
{
	const sdb_projection *p = a->p;
	bson_iter_t c = *it;
	const bson_value_t *v;
	bson_t sub;
	int rc = 0;

	if (depth > SDB_BSON_MAX_DEPTH)
		return efail(a->e, 2, "projection: document nested too deeply");
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		v = bson_iter_value(&c);
		return append_sub(a, n, v->value.v_doc.data, v->value.v_doc.data_len, out, key,
				  keylen, false, depth);
	}
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t e;
		uint32_t i = 0;
		char ibuf[16];
		const char *ikey;

		bson_append_array_begin(out, key, (int)keylen, &sub);
		if (bson_iter_recurse(it, &e)) {
			while (rc == 0 && bson_iter_next(&e)) {
				bool doc = BSON_ITER_HOLDS_DOCUMENT(&e);
				bool container = doc || BSON_ITER_HOLDS_ARRAY(&e);

				if (p->kind == SDB_PROJECTION_ADD_FIELDS && !container) {
					/* $addFields makes every scalar element a document (arrays recurse below) */
					bson_uint32_to_string(i++, &ikey, ibuf, sizeof ibuf);
					rc = append_sub(a, n, empty_doc, sizeof empty_doc, &sub, ikey,
							strlen(ikey), false, depth);
					continue;
				}
				if (!container && p->mode > 0) {
					/* inclusion drops scalars inside arrays; computed fields
					 * replace them by documents */
					if (!n->has_expr)
						continue;
					bson_uint32_to_string(i++, &ikey, ibuf, sizeof ibuf);
					rc = append_sub(a, n, empty_doc, sizeof empty_doc, &sub, ikey,
							strlen(ikey), false, depth);
					continue;
				}
				bson_uint32_to_string(i++, &ikey, ibuf, sizeof ibuf);
				if (!container) {
					bson_append_iter(&sub, ikey, -1, &e);
					continue;
				}
				rc = apply_value(a, n, &e, &sub, ikey, strlen(ikey), depth + 1);
			}
		}
		bson_append_array_end(out, &sub);
		return rc;
	}
	return 0;
}

static size_t kid_index(const pnode *n, const char *name, size_t len)
{
	for (size_t i = 0; i < n->nkids; i++)
		if (strlen(n->kids[i]->name) == len && memcmp(n->kids[i]->name, name, len) == 0)
			return i;
	return SIZE_MAX;
}

/* The fields of a computed subtree the input did not have: appended after the input's
 * fields, in the specification's order (MongoDB's inclusion and $addFields order). */
static int append_missing(const actx *a, const pnode *n, const bool *seen, bson_t *out,
			  int depth)
{
	int rc = 0;

	for (size_t i = 0; i < n->nkids && rc == 0; i++) {
		const pnode *k = n->kids[i];

		if (seen[i] || !k->has_expr)
			continue;
		if (k->action == P_EXPR)
			rc = append_expr(a, k, out, k->name, strlen(k->name));
		else
			rc = append_sub(a, k, empty_doc, sizeof empty_doc, out, k->name,
					strlen(k->name), a->p->kind != SDB_PROJECTION_ADD_FIELDS,
					depth);
	}
	return rc;
}

static int apply_doc(const actx *a, const pnode *n, const uint8_t *data, size_t len, bson_t *out,
		     bool top, int depth)
{
	const sdb_projection *p = a->p;
	const bool add_fields = p->kind == SDB_PROJECTION_ADD_FIELDS;
	bool seen_stack[16] = {false};
	bool *seen = n->nkids <= 16 ? seen_stack : sdb_calloc(n->nkids, sizeof *seen);
	bson_iter_t it;
	int rc = 0;

	if (!data || !bson_iter_init_from_data(&it, data, len)) {
		rc = efail(a->e, 2, "projection: corrupt document");
		goto done;
	}
	while (rc == 0 && bson_iter_next(&it)) {
		const char *key = bson_iter_key(&it);
		size_t keylen = bson_iter_key_len(&it);
		size_t ki = kid_index(n, key, keylen);
		const pnode *k = ki != SIZE_MAX ? n->kids[ki] : NULL;

		if (top && !k && p->id_mode != -1 && strcmp(key, "_id") == 0) {
			if (p->id_mode == 1)
				bson_append_iter(out, key, (int)keylen, &it);
			continue;
		}
		if (!k) {
			/* not named: kept by exclusion and $addFields; by inclusion only the
			 * top-level _id */
			if (p->mode <= 0 || (top && strcmp(key, "_id") == 0))
				bson_append_iter(out, key, (int)keylen, &it);
			continue;
		}
		switch (k->action) {
		case P_INCLUDE:
			bson_append_iter(out, key, (int)keylen, &it);
			break;
		case P_EXCLUDE:
			break;
		case P_SLICE:
			append_slice(k, out, key, keylen, &it);
			break;
		case P_ELEMMATCH:
			append_elemmatch(k, out, key, keylen, &it);
			break;
		case P_EXPR:
			/* $addFields replaces the field in place; an inclusion appends its
			 * computed fields after the included ones */
			if (add_fields) {
				rc = append_expr(a, k, out, key, keylen);
				seen[ki] = true;
			}
			break;
		case P_INTERNAL:
			if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
				rc = apply_value(a, k, &it, out, key, keylen, depth);
				seen[ki] = true;
			} else if (add_fields) {
				/* a scalar under a computed path becomes a document */
				rc = append_sub(a, k, empty_doc, sizeof empty_doc, out, key, keylen,
						false, depth);
				seen[ki] = true;
			} else if (p->mode < 0) {
				bson_append_iter(out, key, (int)keylen, &it);
			}
			break;
		}
	}
	if (rc == 0 && p->mode >= 0 && n->has_expr)
		rc = append_missing(a, n, seen, out, depth);
done:
	if (seen != seen_stack)
		free(seen);
	return rc;
}

int sdb_projection_eval(const sdb_projection *p, const bson_t *doc, bson_t *out, int *code,
			char *err, size_t errlen)
{
	const ectx e = {.code = code, .err = err, .errlen = errlen};
	const actx a = {.p = p, .root = doc, .e = &e};

	if (code)
		*code = 0;
	return apply_doc(&a, &p->root, bson_get_data(doc), doc->len, out, true, 0);
}

int sdb_projection_apply(const sdb_projection *p, const bson_t *doc, bson_t *out, char *err,
			 size_t errlen)
{
	return sdb_projection_eval(p, doc, out, NULL, err, errlen);
}
