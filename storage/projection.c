/* Find projections: see projection.h. */
#include "storage/projection.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/bsonval.h"
#include "storage/matcher.h"

typedef enum {
	P_INTERNAL = 0, /* has children */
	P_INCLUDE,
	P_EXCLUDE,
	P_SLICE,
	P_ELEMMATCH,
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
	sdb_matcher *em;
};

struct sdb_projection {
	pnode root;
	int mode;    /* 0 undecided, 1 inclusion, -1 exclusion */
	int id_mode; /* -1 default (include), 0 excluded, 1 included */
	bool any_elemmatch;
};

typedef struct perr {
	int *code;
	char *err;
	size_t errlen;
} perr;

static int fail(perr *pe, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(perr *pe, int code, const char *fmt, ...)
{
	va_list ap;

	if (pe->code)
		*pe->code = code;
	if (pe->err && pe->errlen) {
		va_start(ap, fmt);
		vsnprintf(pe->err, pe->errlen, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
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

static int parse_slice(pnode *n, const bson_iter_t *it, perr *pe)
{
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t e;
		int64_t v[2];
		int count = 0;

		if (!bson_iter_recurse(it, &e))
			return fail(pe, 2, "corrupt $slice argument");
		while (bson_iter_next(&e)) {
			if (count == 2 || !whole_i64(&e, &v[count]))
				return fail(pe, 28724,
					    "First argument to $slice must be an array, second "
					    "argument must be a number");
			count++;
		}
		if (count != 2)
			return fail(pe, 28724, "$slice array argument must have exactly two numbers");
		if (v[1] <= 0)
			return fail(pe, 28724, "$slice limit must be positive");
		n->skip = v[0];
		n->limit = v[1];
		n->has_limit = true;
		return 0;
	}
	if (!whole_i64(it, &n->skip))
		return fail(pe, 2, "$slice only supports numbers and [skip, limit] arrays");
	n->has_limit = false;
	return 0;
}

static int add_field(sdb_projection *p, const char *path, const bson_iter_t *it, perr *pe,
		     int depth);

static int add_nested(sdb_projection *p, const char *prefix, const bson_iter_t *it, perr *pe,
		      int depth)
{
	bson_iter_t c;

	if (depth > 100)
		return fail(pe, 2, "projection nested too deeply");
	if (!bson_iter_recurse(it, &c))
		return fail(pe, 2, "corrupt projection");
	while (bson_iter_next(&c)) {
		char *path = sdb_asprintf("%s.%s", prefix, bson_iter_key(&c));
		int rc = add_field(p, path, &c, pe, depth + 1);

		free(path);
		if (rc)
			return rc;
	}
	return 0;
}

static bool truthy(const bson_iter_t *it, bool *ok)
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

static int add_field(sdb_projection *p, const char *path, const bson_iter_t *it, perr *pe,
		     int depth)
{
	pnode *n;
	bool ok, inc;
	size_t len = strlen(path);

	if (path[0] == '$')
		return fail(pe, 2, "FieldPath field names may not start with '$'. Consider using "
				   "$getField or $setField.");
	if (len == 0 || path[len - 1] == '.' || strstr(path, "..") || path[0] == '.')
		return fail(pe, 2, "FieldPath field names may not be empty strings.");
	if (strcmp(path, "$") == 0 || strstr(path, ".$") || (len >= 2 && strcmp(path + len - 2, ".$") == 0))
		return fail(pe, 2, "positional projection operator $ is not supported by stripedb "
				   "(field %s)",
			    path);
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t c;
		const char *op;

		if (!bson_iter_recurse(it, &c) || !bson_iter_next(&c))
			return fail(pe, 51270, "An empty sub-projection is not a valid value. Found "
					       "empty object at path");
		op = bson_iter_key(&c);
		if (op[0] != '$')
			return add_nested(p, path, it, pe, depth);
		if (strcmp(op, "$slice") == 0 || strcmp(op, "$elemMatch") == 0) {
			int rc;

			n = pnode_insert(&p->root, path);
			if (!n)
				return fail(pe, 31250, "Path collision at %s", path);
			if (op[1] == 's') {
				n->action = P_SLICE;
				rc = parse_slice(n, &c, pe);
			} else {
				const bson_value_t *v;
				bson_iter_t cc = c;
				bson_t cond;

				if (strchr(path, '.'))
					return fail(pe, 2,
						    "Cannot use $elemMatch projection on a nested field.");
				if (!BSON_ITER_HOLDS_DOCUMENT(&c))
					return fail(pe, 2, "elemMatch: Invalid argument, object required.");
				n->action = P_ELEMMATCH;
				p->any_elemmatch = true;
				v = bson_iter_value(&cc);
				if (!v->value.v_doc.data ||
				    !bson_init_static(&cond, v->value.v_doc.data,
						      v->value.v_doc.data_len))
					return fail(pe, 2, "corrupt $elemMatch argument");
				rc = sdb_matcher_new_elem(&cond, &n->em, pe->code, pe->err, pe->errlen);
			}
			if (rc)
				return rc;
			if (bson_iter_next(&c))
				return fail(pe, 2, "projection operator object must have one field");
			return 0;
		}
		if (strcmp(op, "$meta") == 0)
			return fail(pe, 2, "$meta projection is not supported by stripedb");
		return fail(pe, 31325, "Unknown expression %s", op);
	}
	inc = truthy(it, &ok);
	if (!ok)
		return fail(pe, 2,
			    "computed projection fields are not supported by stripedb (field %s)",
			    path);
	if (strcmp(path, "_id") == 0) {
		p->id_mode = inc ? 1 : 0;
		return 0;
	}
	if (inc && p->mode < 0)
		return fail(pe, 31253, "Cannot do inclusion on field %s in exclusion projection",
			    path);
	if (!inc && p->mode > 0)
		return fail(pe, 31254, "Cannot do exclusion on field %s in inclusion projection",
			    path);
	p->mode = inc ? 1 : -1;
	n = pnode_insert(&p->root, path);
	if (!n)
		return fail(pe, 31250, "Path collision at %s", path);
	n->action = inc ? P_INCLUDE : P_EXCLUDE;
	return 0;
}

int sdb_projection_new(const bson_t *spec, sdb_projection **out, int *code, char *err,
		       size_t errlen)
{
	sdb_projection *p = sdb_calloc(1, sizeof *p);
	perr pe = {.code = code, .err = err, .errlen = errlen};
	bson_iter_t it;
	int rc = 0;

	*out = NULL;
	if (code)
		*code = 0;
	p->id_mode = -1;
	if (!bson_iter_init(&it, spec)) {
		rc = fail(&pe, 2, "corrupt projection document");
		goto fail;
	}
	while (bson_iter_next(&it)) {
		rc = add_field(p, bson_iter_key(&it), &it, &pe, 0);
		if (rc)
			goto fail;
	}
	if (p->mode == 0) {
		/* only _id, $slice and/or $elemMatch: {_id: 1} or $elemMatch alone is an
		 * inclusion, {_id: 0} or $slice alone an exclusion, {} returns everything */
		if (p->any_elemmatch || p->id_mode == 1)
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

static int apply_doc(const sdb_projection *p, const pnode *n, const uint8_t *data, size_t len,
		     bson_t *out, bool top, int depth);

/* Project one value under an internal node; returns true when something was appended. */
static int apply_value(const sdb_projection *p, const pnode *n, const bson_iter_t *it, bson_t *out,
		       const char *key, size_t keylen, int depth)
{
	bson_iter_t c = *it;
	const bson_value_t *v;
	bson_t sub;
	int rc;

	if (depth > SDB_BSON_MAX_DEPTH)
		return SDB_EINVAL;
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		v = bson_iter_value(&c);
		bson_append_document_begin(out, key, (int)keylen, &sub);
		rc = apply_doc(p, n, v->value.v_doc.data, v->value.v_doc.data_len, &sub, false,
			       depth + 1);
		bson_append_document_end(out, &sub);
		return rc;
	}
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t e;
		uint32_t i = 0;
		char ibuf[16];
		const char *ikey;

		bson_append_array_begin(out, key, (int)keylen, &sub);
		if (bson_iter_recurse(it, &e)) {
			while (bson_iter_next(&e)) {
				bool container =
					BSON_ITER_HOLDS_DOCUMENT(&e) || BSON_ITER_HOLDS_ARRAY(&e);

				if (!container && p->mode > 0)
					continue; /* inclusion drops scalars inside arrays */
				bson_uint32_to_string(i++, &ikey, ibuf, sizeof ibuf);
				if (!container) {
					bson_append_iter(&sub, ikey, -1, &e);
					continue;
				}
				rc = apply_value(p, n, &e, &sub, ikey, strlen(ikey), depth + 1);
				if (rc) {
					bson_append_array_end(out, &sub);
					return rc;
				}
			}
		}
		bson_append_array_end(out, &sub);
		return 0;
	}
	if (p->mode < 0)
		bson_append_iter(out, key, (int)keylen, it);
	return 0;
}

static int apply_doc(const sdb_projection *p, const pnode *n, const uint8_t *data, size_t len,
		     bson_t *out, bool top, int depth)
{
	bson_iter_t it;
	int rc;

	if (!data || !bson_iter_init_from_data(&it, data, len))
		return SDB_EINVAL;
	while (bson_iter_next(&it)) {
		const char *key = bson_iter_key(&it);
		size_t keylen = bson_iter_key_len(&it);
		const pnode *k;

		if (top && strcmp(key, "_id") == 0 && p->id_mode != -1 &&
		    !pnode_kid(n, key, keylen)) {
			if (p->id_mode == 1)
				bson_append_iter(out, key, (int)keylen, &it);
			continue;
		}
		k = pnode_kid(n, key, keylen);
		if (!k) {
			/* not named: kept by exclusion; by inclusion only the top-level _id */
			if (p->mode < 0 || (top && strcmp(key, "_id") == 0))
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
		case P_INTERNAL:
			rc = apply_value(p, k, &it, out, key, keylen, depth);
			if (rc)
				return rc;
			break;
		}
	}
	return 0;
}

int sdb_projection_apply(const sdb_projection *p, const bson_t *doc, bson_t *out, char *err,
			 size_t errlen)
{
	int rc = apply_doc(p, &p->root, bson_get_data(doc), doc->len, out, true, 0);

	if (rc)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"projection: document nested too deeply or corrupt");
	return 0;
}
