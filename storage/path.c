/* Dotted paths with MongoDB's array semantics: see path.h. */
#include "storage/path.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"

#define PATH_MAX_COMPS 256

typedef struct comp {
	const char *s;
	size_t len;
	long idx; /* array index when the component is a decimal index, else -1 */
} comp;

typedef struct walker {
	comp comps[PATH_MAX_COMPS];
	size_t n;
	unsigned opts;
	sdb_path_visit_fn fn;
	void *ctx;
	size_t first_array; /* smallest prefix length whose value was an array used by the walk */
} walker;

static long comp_index(const char *s, size_t len)
{
	long v = 0;

	if (len == 0 || len > 9 || (len > 1 && s[0] == '0'))
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v;
}

static bool split(walker *w, const char *path)
{
	const char *p = path;

	w->n = 0;
	for (;;) {
		const char *dot = strchr(p, '.');
		size_t len = dot ? (size_t)(dot - p) : strlen(p);

		if (w->n == PATH_MAX_COMPS)
			return false;
		w->comps[w->n].s = p;
		w->comps[w->n].len = len;
		w->comps[w->n].idx = comp_index(p, len);
		w->n++;
		if (!dot)
			return true;
		p = dot + 1;
	}
}

/* Find field c in the document held by it (a document or array value). */
static bool lookup(const bson_iter_t *container, const comp *c, bson_iter_t *child)
{
	bson_iter_t it;

	if (!bson_iter_recurse(container, &it))
		return false;
	while (bson_iter_next(&it)) {
		if (bson_iter_key_len(&it) == c->len && memcmp(bson_iter_key(&it), c->s, c->len) == 0) {
			*child = it;
			return true;
		}
	}
	return false;
}

static bool report(walker *w, const bson_iter_t *it, unsigned flags)
{
	return w->fn(w->ctx, it, flags);
}

/* it holds the value at prefix length i. */
static bool walk_value(walker *w, const bson_iter_t *it, size_t i, unsigned flags)
{
	bson_iter_t child, elems;

	if (i == w->n) {
		if (report(w, it, flags))
			return true;
		if (BSON_ITER_HOLDS_ARRAY(it) && (w->opts & SDB_PATH_EXPAND_LEAF)) {
			if (i < w->first_array)
				w->first_array = i;
			if (!bson_iter_recurse(it, &elems))
				return false;
			while (bson_iter_next(&elems)) {
				if (report(w, &elems, flags | SDB_PATH_ELEM))
					return true;
			}
		}
		return false;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		if (lookup(it, &w->comps[i], &child))
			return walk_value(w, &child, i + 1, flags);
		return report(w, NULL, flags | SDB_PATH_MISSING);
	}
	if (BSON_ITER_HOLDS_ARRAY(it)) {
		const comp *c = &w->comps[i];

		if (i < w->first_array)
			w->first_array = i;
		flags |= SDB_PATH_VIA_ARRAY;
		if (c->idx >= 0 && lookup(it, c, &child)) {
			if (walk_value(w, &child, i + 1, flags))
				return true;
		}
		if (!bson_iter_recurse(it, &elems))
			return false;
		while (bson_iter_next(&elems)) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&elems))
				continue;
			if (lookup(&elems, c, &child)) {
				if (walk_value(w, &child, i + 1, flags))
					return true;
			} else if (c->idx < 0) {
				if (report(w, NULL, flags | SDB_PATH_MISSING))
					return true;
			}
		}
		return false;
	}
	return report(w, NULL, flags | SDB_PATH_MISSING);
}

static bool walk_container(walker *w, const uint8_t *data, size_t len)
{
	bson_iter_t it, child;
	const comp *c = &w->comps[0];

	if (!data || !bson_iter_init_from_data(&it, data, len))
		return false;
	while (bson_iter_next(&it)) {
		if (bson_iter_key_len(&it) == c->len && memcmp(bson_iter_key(&it), c->s, c->len) == 0) {
			child = it;
			return walk_value(w, &child, 1, 0);
		}
	}
	return report(w, NULL, SDB_PATH_MISSING);
}

static bool walk_init(walker *w, const char *path, unsigned opts, sdb_path_visit_fn fn, void *ctx)
{
	w->opts = opts;
	w->fn = fn;
	w->ctx = ctx;
	w->first_array = (size_t)-1;
	return split(w, path);
}

bool sdb_path_walk(const bson_t *doc, const char *path, unsigned opts, sdb_path_visit_fn fn,
		   void *ctx)
{
	walker *w = sdb_malloc(sizeof *w);
	bool stopped = false;

	if (walk_init(w, path, opts, fn, ctx))
		stopped = walk_container(w, bson_get_data(doc), doc->len);
	free(w);
	return stopped;
}

bool sdb_path_walk_iter(const bson_iter_t *container, const char *path, unsigned opts,
			sdb_path_visit_fn fn, void *ctx)
{
	walker *w;
	bool stopped = false;
	bson_iter_t c = *container;
	const bson_value_t *v;

	if (!BSON_ITER_HOLDS_DOCUMENT(&c) && !BSON_ITER_HOLDS_ARRAY(&c))
		return false;
	w = sdb_malloc(sizeof *w);
	if (walk_init(w, path, opts, fn, ctx)) {
		if (BSON_ITER_HOLDS_ARRAY(&c)) {
			/* treat like a value reached at prefix 0 with more components */
			stopped = walk_value(w, &c, 0, 0);
		} else {
			v = bson_iter_value(&c);
			stopped = walk_container(w, v->value.v_doc.data, v->value.v_doc.data_len);
		}
	}
	free(w);
	return stopped;
}

bool sdb_path_valid(const char *path, char *err, size_t errlen)
{
	const char *p = path;
	size_t n = 0;

	if (!path || !*path) {
		sdb_errf(err, errlen, SDB_EINVAL, "FieldPath cannot be constructed with empty string");
		return false;
	}
	for (;;) {
		const char *dot = strchr(p, '.');
		size_t len = dot ? (size_t)(dot - p) : strlen(p);

		if (len == 0) {
			sdb_errf(err, errlen, SDB_EINVAL,
				 "FieldPath field names may not be empty strings.");
			return false;
		}
		if (p[0] == '$') {
			sdb_errf(err, errlen, SDB_EINVAL,
				 "FieldPath field names may not start with '$'.");
			return false;
		}
		if (++n > 255) {
			sdb_errf(err, errlen, SDB_EINVAL, "FieldPath is too long");
			return false;
		}
		if (!dot)
			return true;
		p = dot + 1;
	}
}

/* ---- sort values ------------------------------------------------------------------- */

static const bson_value_t null_value = {.value_type = BSON_TYPE_NULL};
static const bson_value_t undefined_value = {.value_type = BSON_TYPE_UNDEFINED};

typedef struct sortctx {
	bool desc;
	bool have;
	bson_value_t best;
} sortctx;

static void sort_offer(sortctx *s, const bson_value_t *v)
{
	int c;

	if (!s->have) {
		s->best = *v;
		s->have = true;
		return;
	}
	c = sdb_bson_value_cmp(v, &s->best);
	if (s->desc ? c > 0 : c < 0)
		s->best = *v;
}

static bool is_empty_array(const bson_iter_t *it)
{
	bson_iter_t c;

	return bson_iter_recurse(it, &c) && !bson_iter_next(&c);
}

static bool sort_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	sortctx *s = ctx;
	bson_iter_t c;

	if (flags & SDB_PATH_MISSING) {
		sort_offer(s, &null_value);
		return false;
	}
	if (!(flags & SDB_PATH_ELEM) && BSON_ITER_HOLDS_ARRAY(it)) {
		if (is_empty_array(it))
			sort_offer(s, &undefined_value);
		return false; /* its elements follow */
	}
	c = *it;
	sort_offer(s, bson_iter_value(&c));
	return false;
}

void sdb_path_sort_value(const bson_t *doc, const char *path, bool desc, bson_value_t *out)
{
	sortctx s = {.desc = desc};

	sdb_path_walk(doc, path, SDB_PATH_EXPAND_LEAF, sort_visit, &s);
	*out = s.have ? s.best : null_value;
}

/* ---- index keys ------------------------------------------------------------------- */

typedef struct valset {
	bson_value_t *v;
	size_t n, cap;
	bool array;
} valset;

static void valset_add(valset *vs, const bson_value_t *v)
{
	if (vs->n == vs->cap) {
		vs->cap = vs->cap ? vs->cap * 2 : 4;
		vs->v = sdb_realloc(vs->v, vs->cap * sizeof *vs->v);
	}
	vs->v[vs->n++] = *v;
}

static bool index_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	valset *vs = ctx;
	bson_iter_t c;

	if (flags & (SDB_PATH_VIA_ARRAY | SDB_PATH_ELEM))
		vs->array = true;
	if (flags & SDB_PATH_MISSING) {
		valset_add(vs, &null_value);
		return false;
	}
	if (!(flags & SDB_PATH_ELEM) && BSON_ITER_HOLDS_ARRAY(it)) {
		vs->array = true;
		if (is_empty_array(it))
			valset_add(vs, &undefined_value);
		return false;
	}
	c = *it;
	valset_add(vs, bson_iter_value(&c));
	return false;
}

static int key_qsort_cmp(const void *a, const void *b)
{
	return sdb_key_cmp(a, b);
}

void sdb_index_keys_free(sdb_key *keys, size_t nkeys)
{
	if (!keys)
		return;
	for (size_t i = 0; i < nkeys; i++)
		sdb_key_free(&keys[i]);
	free(keys);
}

int sdb_index_keys(const bson_t *doc, const char *const *paths, const bool *desc, size_t nfields,
		   sdb_key **keys, size_t *nkeys, bool *multikey, int *code, char *err,
		   size_t errlen)
{
	valset vs[32];
	size_t arr_field = 0, n_arr = 0, arr_len[32];
	sdb_key *out = NULL;
	size_t total = 1, i, f, n_out = 0;
	int rc = 0;
	walker *w = NULL;

	*keys = NULL;
	*nkeys = 0;
	*multikey = false;
	if (code)
		*code = 0;
	if (nfields == 0 || nfields > 32) {
		if (code)
			*code = 2;
		return sdb_errf(err, errlen, SDB_EINVAL, "index must have 1 to 32 fields");
	}
	memset(vs, 0, sizeof vs);
	w = sdb_malloc(sizeof *w);
	for (f = 0; f < nfields; f++) {
		if (!sdb_path_valid(paths[f], err, errlen)) {
			if (code)
				*code = 2;
			rc = SDB_EINVAL;
			goto out;
		}
		walk_init(w, paths[f], SDB_PATH_EXPAND_LEAF, index_visit, &vs[f]);
		walk_container(w, bson_get_data(doc), doc->len);
		if (vs[f].n == 0)
			valset_add(&vs[f], &null_value);
		arr_len[f] = 0;
		if (vs[f].array) {
			size_t plen = 0;

			*multikey = true;
			/* the array's own path: its first first_array components */
			for (i = 0; i < w->first_array && i < w->n; i++)
				plen += w->comps[i].len + (i ? 1 : 0);
			arr_len[f] = plen;
			if (n_arr == 1 && (arr_len[arr_field] != plen ||
					   strncmp(paths[arr_field], paths[f], plen) != 0)) {
				const char *a = paths[arr_field], *b = paths[f];
				const char *la = a, *lb = b;

				/* MongoDB names the arrays' field names: [later] [earlier] */
				for (i = 0; i < arr_len[arr_field]; i++)
					if (a[i] == '.')
						la = a + i + 1;
				for (i = 0; i < plen; i++)
					if (b[i] == '.')
						lb = b + i + 1;
				if (code)
					*code = 171;
				rc = sdb_errf(err, errlen, SDB_EINVAL,
					      "cannot index parallel arrays [%.*s] [%.*s]",
					      (int)(plen - (size_t)(lb - b)), lb,
					      (int)(arr_len[arr_field] - (size_t)(la - a)), la);
				goto out;
			}
			if (n_arr == 0)
				arr_field = f, n_arr++;
		}
		if (total > (size_t)1 << 20) {
			if (code)
				*code = 2;
			rc = sdb_errf(err, errlen, SDB_EINVAL, "too many index keys for one document");
			goto out;
		}
		total *= vs[f].n;
	}
	out = sdb_calloc(total, sizeof *out);
	for (i = 0; i < total; i++) {
		size_t rem = i;

		for (f = 0; f < nfields; f++) {
			size_t pick = rem % vs[f].n;

			rem /= vs[f].n;
			rc = sdb_keyenc_append_value(&out[i], &vs[f].v[pick], desc ? desc[f] : false,
						     err, errlen);
			if (rc) {
				if (code)
					*code = 2;
				n_out = total;
				goto out;
			}
		}
	}
	n_out = total;
	sdb_qsort(out, total, sizeof *out, key_qsort_cmp);
	/* dedupe */
	{
		size_t j = 0;

		for (i = 0; i < total; i++) {
			if (j > 0 && sdb_key_cmp(&out[j - 1], &out[i]) == 0) {
				sdb_key_free(&out[i]);
				continue;
			}
			if (j != i) {
				out[j] = out[i];
				sdb_key_init(&out[i]);
			}
			j++;
		}
		n_out = j;
	}
	*keys = out;
	*nkeys = n_out;
	out = NULL;
out:
	if (out)
		sdb_index_keys_free(out, n_out);
	for (f = 0; f < nfields; f++)
		free(vs[f].v);
	free(w);
	return rc;
}
