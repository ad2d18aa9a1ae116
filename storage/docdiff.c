/* The pre-image/post-image diff of a document as a change event's updateDescription
 * (MongoDB's document_diff_calculator.cpp rules; see docdiff.h for the contract). */
#include "storage/docdiff.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonval.h"
#include "common/err.h"

/* ------------------------------------------------------------------ diff tree */

typedef struct dd_node dd_node;

/* One modification: a field (documents: name) or an element (arrays: idx) whose post-image
 * value is val, or whose sub-diff is sub. */
typedef struct dd_ent {
	const char *name; /* documents: the field name (borrowed from pre's or post's buffer) */
	size_t idx;	  /* arrays: the element's index */
	bson_iter_t val;  /* the post-image element (update/insert), unless sub */
	dd_node *sub;	  /* a sub-diff (owned), or NULL */
} dd_ent;

typedef struct dd_vec {
	dd_ent *v;
	size_t n, cap;
} dd_vec;

/* A document or array diff node, with MongoDB's approximate BSON size of its $v:2 form
 * (diff_tree::InternalNode::getObjSize, which is the exact size of the serialized diff). */
struct dd_node {
	bool array;
	size_t size;
	/* documents: the u, i and d sections and the sub-diffs, each in the order added;
	 * arrays: upd holds the u<i> and s<i> entries in index order */
	dd_vec upd, ins, del, sub;
	bool resized; /* arrays: shrunk to new_size elements (the l field) */
	size_t new_size;
};

static dd_ent *vec_push(dd_vec *v)
{
	if (v->n == v->cap) {
		v->cap = v->cap ? 2 * v->cap : 4;
		v->v = sdb_realloc(v->v, v->cap * sizeof *v->v);
	}
	dd_ent *e = &v->v[v->n++];
	memset(e, 0, sizeof *e);
	return e;
}

static void node_free(dd_node *n);

static void vec_free(dd_vec *v)
{
	for (size_t i = 0; i < v->n; i++)
		node_free(v->v[i].sub);
	free(v->v);
}

static void node_free(dd_node *n)
{
	if (!n)
		return;
	vec_free(&n->upd);
	vec_free(&n->ins);
	vec_free(&n->del);
	vec_free(&n->sub);
	free(n);
}

static dd_node *node_new(bool array, size_t size)
{
	dd_node *n = sdb_calloc(1, sizeof *n);
	n->array = array;
	n->size = size;
	return n;
}

/* ------------------------------------------------------------------ elements */

/* The element's bytes: type, name, value (BSONElement::binaryEqual compares these). */
static bool el_equal(const bson_iter_t *a, const bson_iter_t *b)
{
	uint32_t la = a->next_off - a->off, lb = b->next_off - b->off;
	return la == lb && memcmp(a->raw + a->off, b->raw + b->off, la) == 0;
}

/* BSONElement::valuesize: the element's size without its type byte and name. */
static size_t el_valuesize(const bson_iter_t *it)
{
	return (size_t)(it->next_off - it->off) - 2 - bson_iter_key_len(it);
}

static bool el_container(const bson_iter_t *it)
{
	return BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it);
}

/* The embedded document or array at it as a static bson_t. */
static bool el_sub(const bson_iter_t *it, bson_t *out)
{
	uint32_t len = 0;
	const uint8_t *data = NULL;
	if (BSON_ITER_HOLDS_DOCUMENT(it))
		bson_iter_document(it, &len, &data);
	else
		bson_iter_array(it, &len, &data);
	return data && bson_init_static(out, data, len);
}

static size_t digits(size_t i)
{
	size_t d = 1;
	while (i >= 10) {
		i /= 10;
		d++;
	}
	return d;
}

/* ------------------------------------------------------------------ calculator */

/* Sizes of diff_tree (document_diff_serialization.h/.cpp): an empty document diff, an empty
 * array diff ({a: true}), the wrapping of a document's first u/i/d entry (type byte, one-
 * letter name, NUL, empty object), the l field of a shrunk array. */
enum { SZ_EMPTY_DOC = 5, SZ_EMPTY_ARRAY = 9, SZ_WRAP = 8, SZ_RESIZE = 7 };

static void doc_add_value(dd_node *n, dd_vec *sec, const char *name, const bson_iter_t *val)
{
	n->size += strlen(name) + 2 + el_valuesize(val) + (sec->n ? 0 : SZ_WRAP);
	dd_ent *e = vec_push(sec);
	e->name = name;
	e->val = *val;
}

static void doc_add_delete(dd_node *n, const char *name)
{
	n->size += strlen(name) + 2 + 1 + (n->del.n ? 0 : SZ_WRAP);
	vec_push(&n->del)->name = name;
}

static void arr_add_value(dd_node *n, size_t idx, const bson_iter_t *val)
{
	n->size += 1 + digits(idx) + 2 + el_valuesize(val);
	dd_ent *e = vec_push(&n->upd);
	e->idx = idx;
	e->val = *val;
}

static int doc_diff(const bson_t *pre, const bson_t *post, bool limit, size_t padding, int depth,
		    dd_node **out);
static int arr_diff(const bson_t *pre, const bson_t *post, int depth, dd_node **out);

/* calculateSubDiffHelper: the sub-diff of two documents or two arrays (pi, qi of the same
 * type) added to parent under name (documents) or idx (arrays); the whole post-image value
 * instead when the sub-diff is not smaller than it (or nesting is deeper than
 * SDB_BSON_MAX_DEPTH, where we stop recursing). Errors: SDB_EINVAL (corrupt BSON). */
static int sub_diff(dd_node *parent, const char *name, size_t idx, const bson_iter_t *pi,
		    const bson_iter_t *qi, int depth)
{
	bson_t a, b;
	dd_node *c = NULL;
	if (!el_sub(pi, &a) || !el_sub(qi, &b))
		return SDB_EINVAL;
	if (depth < SDB_BSON_MAX_DEPTH) {
		int rc = BSON_ITER_HOLDS_ARRAY(pi) ? arr_diff(&a, &b, depth + 1, &c)
						   : doc_diff(&a, &b, true, 0, depth + 1, &c);
		if (rc)
			return rc;
	}
	if (parent->array) {
		if (!c) {
			arr_add_value(parent, idx, qi);
			return 0;
		}
		parent->size += 1 + digits(idx) + 2 + c->size;
		dd_ent *e = vec_push(&parent->upd);
		e->idx = idx;
		e->sub = c;
		return 0;
	}
	if (!c) {
		doc_add_value(parent, &parent->upd, name, qi);
		return 0;
	}
	parent->size += strlen(name) + 2 + c->size + 1; /* + the 's' prefix */
	dd_ent *e = vec_push(&parent->sub);
	e->name = name;
	e->sub = c;
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* computeArrayDiff. *out: the diff, or NULL when it is not smaller than post. Errors:
 * SDB_EINVAL (corrupt BSON). */
static int arr_diff(const bson_t *pre, const bson_t *post, int depth, dd_node **out)
{
	bson_iter_t pi, qi;
	*out = NULL;
	if (!bson_iter_init(&pi, pre) || !bson_iter_init(&qi, post))
		return SDB_EINVAL;
	dd_node *n = node_new(true, SZ_EMPTY_ARRAY);
	size_t post_size = post->len, idx = 0;
	bool pm = bson_iter_next(&pi), qm = bson_iter_next(&qi);
	int rc = 0;
	for (; pm && qm; pm = bson_iter_next(&pi), qm = bson_iter_next(&qi), idx++) {
		if (post_size < n->size)
			goto too_big; /* bail out: the diff so far outgrew the post-image */
		if (el_equal(&pi, &qi))
			continue;
		if (bson_iter_type(&pi) == bson_iter_type(&qi) && el_container(&pi)) {
			if ((rc = sub_diff(n, NULL, idx, &pi, &qi, depth)) != 0)
				goto fail;
		} else {
			arr_add_value(n, idx, &qi);
		}
	}
	for (; qm; qm = bson_iter_next(&qi), idx++)
		arr_add_value(n, idx, &qi);
	if (pi.err_off || qi.err_off) {
		rc = SDB_EINVAL;
		goto fail;
	}
	if (pm) {
		n->resized = true;
		n->new_size = idx;
		n->size += SZ_RESIZE;
	}
	if (post_size > n->size) {
		*out = n;
		return 0;
	}
too_big:
	node_free(n);
	return 0;
fail:
	node_free(n);
	return rc;
}

/* computeDocDiff. limit: apply the size heuristic (the root of a modifier update does
 * not); padding: bytes added to the diff's size. *out: the diff, or NULL when it is not
 * smaller than post. Errors: SDB_EINVAL (corrupt BSON). */
static int doc_diff(const bson_t *pre, const bson_t *post, bool limit, size_t padding, int depth,
		    dd_node **out)
{
	bson_iter_t pi, qi;
	*out = NULL;
	if (!bson_iter_init(&pi, pre) || !bson_iter_init(&qi, post))
		return SDB_EINVAL;
	dd_node *n = node_new(false, SZ_EMPTY_DOC + padding);
	const char **dels = NULL; /* the calculator's std::set<StringData> deletes */
	size_t ndels = 0, capdels = 0;
	const size_t post_size = post->len;
	bool pm = bson_iter_next(&pi), qm = bson_iter_next(&qi);
	int rc = 0;
	while (pm && qm) {
		if (limit && post_size < n->size)
			goto too_big;
		if (el_equal(&pi, &qi)) {
			pm = bson_iter_next(&pi);
			qm = bson_iter_next(&qi);
			continue;
		}
		const char *name = bson_iter_key(&pi);
		if (strcmp(name, bson_iter_key(&qi)) == 0) {
			if (bson_iter_type(&pi) == bson_iter_type(&qi) && el_container(&pi)) {
				if ((rc = sub_diff(n, name, 0, &pi, &qi, depth)) != 0)
					goto fail;
			} else {
				doc_add_value(n, &n->upd, name, &qi);
			}
			pm = bson_iter_next(&pi);
			qm = bson_iter_next(&qi);
		} else {
			/* removed, unless it comes back among post's remaining fields */
			if (ndels == capdels) {
				capdels = capdels ? 2 * capdels : 4;
				dels = sdb_realloc(dels, capdels * sizeof *dels);
			}
			dels[ndels++] = name;
			pm = bson_iter_next(&pi);
		}
	}
	for (; pm; pm = bson_iter_next(&pi))
		doc_add_delete(n, bson_iter_key(&pi));
	for (; qm; qm = bson_iter_next(&qi))
		doc_add_value(n, &n->ins, bson_iter_key(&qi), &qi);
	if (pi.err_off || qi.err_off) {
		rc = SDB_EINVAL;
		goto fail;
	}
	if (ndels) {
		/* the set's order, without duplicates and without the names inserted again */
		const char **ins = sdb_malloc((n->ins.n ? n->ins.n : 1) * sizeof *ins);
		for (size_t i = 0; i < n->ins.n; i++)
			ins[i] = n->ins.v[i].name;
		sdb_qsort(dels, ndels, sizeof *dels, cmp_name);
		sdb_qsort(ins, n->ins.n, sizeof *ins, cmp_name);
		for (size_t i = 0; i < ndels; i++) {
			if (i && strcmp(dels[i], dels[i - 1]) == 0)
				continue;
			if (n->ins.n &&
			    bsearch(&dels[i], ins, n->ins.n, sizeof *ins, cmp_name) != NULL)
				continue;
			doc_add_delete(n, dels[i]);
		}
		free(ins);
	}
	free(dels);
	if (!limit || post_size > n->size) {
		*out = n;
		return 0;
	}
	node_free(n);
	return 0;
too_big:
	free(dels);
	node_free(n);
	return 0;
fail:
	free(dels);
	node_free(n);
	return rc;
}

/* ------------------------------------------------------------------ description */

typedef struct dd_out {
	bson_t upd, rem, trunc;
	uint32_t nrem, ntrunc;
	char *path; /* the dotted path of the current level */
	size_t len, cap;
} dd_out;

/* Append component (name, or the decimal idx when name is NULL) to the path; returns the
 * length to restore. */
static size_t path_push(dd_out *o, const char *name, size_t idx)
{
	char num[24];
	size_t old = o->len;
	if (!name) {
		snprintf(num, sizeof num, "%zu", idx);
		name = num;
	}
	size_t nl = strlen(name);
	if (o->len + nl + 2 > o->cap) {
		o->cap = 2 * (o->len + nl + 2);
		o->path = sdb_realloc(o->path, o->cap);
	}
	if (o->len)
		o->path[o->len++] = '.';
	memcpy(o->path + o->len, name, nl + 1);
	o->len += nl;
	return old;
}

static void path_pop(dd_out *o, size_t old)
{
	o->len = old;
	o->path[old] = 0;
}

static void out_updated(dd_out *o, const char *name, size_t idx, const bson_iter_t *val)
{
	size_t old = path_push(o, name, idx);
	bson_append_iter(&o->upd, o->path, (int)o->len, val);
	path_pop(o, old);
}

/* buildUpdateDescriptionWithDeltaOplog over the diff node n at o->path. */
static void emit(dd_out *o, const dd_node *n)
{
	char key[16];
	const char *k;
	if (n->array) {
		if (n->resized) {
			bson_t t;
			bson_uint32_to_string(o->ntrunc++, &k, key, sizeof key);
			bson_append_document_begin(&o->trunc, k, -1, &t);
			bson_append_utf8(&t, "field", 5, o->path, (int)o->len);
			BSON_APPEND_INT32(&t, "newSize", (int32_t)n->new_size);
			bson_append_document_end(&o->trunc, &t);
		}
		for (size_t i = 0; i < n->upd.n; i++) {
			const dd_ent *e = &n->upd.v[i];
			if (e->sub) {
				size_t old = path_push(o, NULL, e->idx);
				emit(o, e->sub);
				path_pop(o, old);
			} else {
				out_updated(o, NULL, e->idx, &e->val);
			}
		}
		return;
	}
	for (size_t i = 0; i < n->upd.n; i++)
		out_updated(o, n->upd.v[i].name, 0, &n->upd.v[i].val);
	for (size_t i = 0; i < n->ins.n; i++)
		out_updated(o, n->ins.v[i].name, 0, &n->ins.v[i].val);
	for (size_t i = 0; i < n->del.n; i++) {
		size_t old = path_push(o, n->del.v[i].name, 0);
		bson_uint32_to_string(o->nrem++, &k, key, sizeof key);
		bson_append_utf8(&o->rem, k, -1, o->path, (int)o->len);
		path_pop(o, old);
	}
	for (size_t i = 0; i < n->sub.n; i++) {
		size_t old = path_push(o, n->sub.v[i].name, 0);
		emit(o, n->sub.v[i].sub);
		path_pop(o, old);
	}
}

int sdb_docdiff_describe(const bson_t *pre, const bson_t *post, sdb_docdiff_kind kind,
			 bson_t *out)
{
	dd_node *root = NULL;
	bool pipeline = kind == SDB_DOCDIFF_PIPELINE;
	bson_init(out);
	int rc = doc_diff(pre, post, pipeline, pipeline ? SDB_DOCDIFF_PADDING : 0, 0, &root);
	if (rc)
		return rc;
	if (!root)
		return 0;
	dd_out o;
	memset(&o, 0, sizeof o);
	bson_init(&o.upd);
	bson_init(&o.rem);
	bson_init(&o.trunc);
	o.cap = 64;
	o.path = sdb_malloc(o.cap);
	o.path[0] = 0;
	emit(&o, root);
	BSON_APPEND_DOCUMENT(out, "updatedFields", &o.upd);
	BSON_APPEND_ARRAY(out, "removedFields", &o.rem);
	BSON_APPEND_ARRAY(out, "truncatedArrays", &o.trunc);
	bson_destroy(&o.upd);
	bson_destroy(&o.rem);
	bson_destroy(&o.trunc);
	free(o.path);
	node_free(root);
	return 1;
}
