/* Merging shard results on the proxy: see merge.h. */
#include "proxy/merge.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/collation.h"
#include "storage/path.h"

struct merge_sort {
	const sdb_collator *coll; /* strings compare under it (NULL: simple) */
	size_t n;
	char *paths[MERGE_MAX_SORT_FIELDS];
	int dir[MERGE_MAX_SORT_FIELDS];
};

int merge_sort_parse(const bson_t *spec, merge_sort **out, int *code, char *err, size_t errlen)
{
	merge_sort *s = sdb_calloc(1, sizeof *s);
	bson_iter_t it;
	int c = 0;

	if (spec != NULL && bson_iter_init(&it, spec)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			double d;
			if (strcmp(k, "$natural") == 0)
				continue;
			if (!BSON_ITER_HOLDS_NUMBER(&it)) {
				c = 15975;
				goto bad;
			}
			d = bson_iter_as_double(&it);
			if (d != 1.0 && d != -1.0) {
				c = 15975;
				goto bad;
			}
			if (k[0] == '\0' || s->n == MERGE_MAX_SORT_FIELDS) {
				c = 2;
				sdb_errf(err, errlen, SDB_EINVAL, "bad sort field '%s'", k);
				goto err;
			}
			s->paths[s->n] = sdb_strdup(k);
			s->dir[s->n] = d > 0 ? 1 : -1;
			s->n++;
		}
	}
	*out = s;
	return 0;
bad:
	sdb_errf(err, errlen, SDB_EINVAL,
		 "$sort key ordering must be 1 (for ascending) or -1 (for descending)");
err:
	if (code)
		*code = c;
	merge_sort_free(s);
	return SDB_EINVAL;
}

void merge_sort_free(merge_sort *s)
{
	size_t i;

	if (s == NULL)
		return;
	for (i = 0; i < s->n; i++)
		free(s->paths[i]);
	free(s);
}

size_t merge_sort_nfields(const merge_sort *s)
{
	return s ? s->n : 0;
}

const char *merge_sort_path(const merge_sort *s, size_t i)
{
	return s->paths[i];
}

void merge_sort_set_collation(merge_sort *s, const sdb_collator *coll)
{
	if (s)
		s->coll = coll;
}

int merge_sort_cmp(const merge_sort *s, const bson_t *a, const bson_t *b)
{
	size_t i;
	int r = 0;
	const sdb_collator *prev;

	if (s == NULL || s->n == 0)
		return 0;
	/* a getMore merges on whatever thread runs it: the sort's own collation when set,
	 * else the thread's (the request's, exec.c) */
	prev = s->coll ? sdb_collation_use(s->coll) : sdb_collation_current();
	for (i = 0; i < s->n; i++) {
		bson_value_t va, vb;
		sdb_path_sort_value(a, s->paths[i], s->dir[i] < 0, &va);
		sdb_path_sort_value(b, s->paths[i], s->dir[i] < 0, &vb);
		r = sdb_bson_value_cmp(&va, &vb);
		if (r != 0) {
			r = s->dir[i] * (r < 0 ? -1 : 1);
			break;
		}
	}
	if (s->coll)
		sdb_collation_use(prev);
	return r;
}

ssize_t merge_pick(const merge_sort *s, const bson_t *const *heads, size_t n)
{
	ssize_t best = -1;
	size_t i;

	for (i = 0; i < n; i++) {
		if (heads[i] == NULL)
			continue;
		if (best < 0 || merge_sort_cmp(s, heads[i], heads[best]) < 0)
			best = (ssize_t)i;
	}
	return best;
}

/* |limit|, where INT64_MIN (whose negation is undefined behaviour) counts as INT64_MAX:
 * callers refuse it at parse time (common/bsonget.h); this keeps the helpers total. */
static int64_t abs_limit(int64_t limit)
{
	if (limit == INT64_MIN)
		return INT64_MAX;
	return limit < 0 ? -limit : limit;
}

int64_t merge_count_window(int64_t total, int64_t skip, int64_t limit)
{
	int64_t n;

	if (skip < 0)
		skip = 0;
	limit = abs_limit(limit);
	n = total > skip ? total - skip : 0;
	if (limit > 0 && n > limit)
		n = limit;
	return n;
}

int64_t merge_pushdown_limit(int64_t skip, int64_t limit)
{
	limit = abs_limit(limit);
	if (limit == 0)
		return 0;
	if (skip < 0)
		skip = 0;
	if (skip > INT64_MAX - limit)
		return 0;
	return limit + skip;
}

/* ---------- distinct ---------- */

struct merge_distinct {
	bson_value_t *v; /* owned copies, sorted in MongoDB order, no two equal */
	size_t n, cap;
};

merge_distinct *merge_distinct_new(void)
{
	return sdb_calloc(1, sizeof(merge_distinct));
}

void merge_distinct_free(merge_distinct *d)
{
	size_t i;

	if (d == NULL)
		return;
	for (i = 0; i < d->n; i++)
		bson_value_destroy(&d->v[i]);
	free(d->v);
	free(d);
}

void merge_distinct_add_value(merge_distinct *d, const bson_value_t *v)
{
	size_t lo = 0, hi = d->n, mid;

	while (lo < hi) { /* first element >= v */
		mid = lo + (hi - lo) / 2;
		if (sdb_bson_value_cmp(&d->v[mid], v) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < d->n && sdb_bson_value_cmp(&d->v[lo], v) == 0)
		return;
	if (d->n == d->cap) {
		d->cap = d->cap ? d->cap * 2 : 16;
		d->v = sdb_realloc(d->v, d->cap * sizeof *d->v);
	}
	memmove(&d->v[lo + 1], &d->v[lo], (d->n - lo) * sizeof *d->v);
	bson_value_copy(v, &d->v[lo]);
	d->n++;
}

static bool distinct_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	merge_distinct *d = ctx;

	if (it == NULL || (flags & SDB_PATH_MISSING))
		return false;
	if (BSON_ITER_HOLDS_ARRAY(it) && !(flags & SDB_PATH_ELEM))
		return false; /* the array itself: its elements follow */
	merge_distinct_add_value(d, bson_iter_value((bson_iter_t *)it));
	return false;
}

void merge_distinct_add_doc(merge_distinct *d, const bson_t *doc, const char *path)
{
	sdb_path_walk(doc, path, SDB_PATH_EXPAND_LEAF, distinct_visit, d);
}

void merge_distinct_append(merge_distinct *d, bson_t *out, const char *name)
{
	bson_t arr;
	char k[24];
	size_t i;

	bson_append_array_begin(out, name, -1, &arr);
	for (i = 0; i < d->n; i++) {
		snprintf(k, sizeof k, "%zu", i);
		BSON_APPEND_VALUE(&arr, k, &d->v[i]);
	}
	bson_append_array_end(out, &arr);
}

size_t merge_distinct_count(const merge_distinct *d)
{
	return d->n;
}
