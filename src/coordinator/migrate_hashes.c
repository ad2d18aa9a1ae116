/* (_id, hash) lists of a chunk and the expected-content merge: see migrate_hashes.h. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "coordinator/migrate_hashes.h"
#include "common/bsonval.h"

uint64_t mig_doc_hash(const bson_t *doc)
{
	return XXH64(bson_get_data(doc), doc->len, 0);
}

void mig_hashes_add(mig_hashes *l, const bson_value_t *id, uint64_t hash, bool present,
		    uint64_t ts)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 1024;
		l->v = sdb_realloc(l->v, l->cap * sizeof *l->v);
	}
	mig_hash *e = &l->v[l->n++];
	bson_value_copy(id, &e->id);
	e->hash = hash;
	e->present = present;
	e->ts = ts;
}

bool mig_hashes_add_doc(mig_hashes *l, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return false;
	mig_hashes_add(l, bson_iter_value(&it), mig_doc_hash(doc), true, 0);
	return true;
}

/* entries are first tagged with their position (in ts) so that the sort is stable */
static int hcmp(const void *a, const void *b)
{
	const mig_hash *x = a, *y = b;
	int c = sdb_bson_value_cmp(&x->id, &y->id);
	if (c)
		return c;
	return x->ts < y->ts ? -1 : x->ts > y->ts;
}

void mig_hashes_sort_unique(mig_hashes *l)
{
	if (l->n < 2)
		return;
	/* stable by appending order: keep the ts aside, sort on (id, seq), restore */
	uint64_t *ts = sdb_calloc(l->n, sizeof *ts);
	for (size_t i = 0; i < l->n; i++) {
		ts[i] = l->v[i].ts;
		l->v[i].ts = i;
	}
	sdb_qsort(l->v, l->n, sizeof *l->v, hcmp);
	size_t w = 0;
	for (size_t i = 0; i < l->n; i++) {
		if (i + 1 < l->n && sdb_bson_value_cmp(&l->v[i].id, &l->v[i + 1].id) == 0) {
			bson_value_destroy(&l->v[i].id); /* a later entry of the same _id follows */
			continue;
		}
		l->v[w] = l->v[i];
		l->v[w].ts = ts[l->v[i].ts];
		w++;
	}
	l->n = w;
	free(ts);
}

ptrdiff_t mig_hashes_find(const mig_hashes *l, const bson_value_t *id)
{
	size_t lo = 0, hi = l->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = sdb_bson_value_cmp(&l->v[mid].id, id);
		if (c == 0)
			return (ptrdiff_t)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

void mig_hashes_merge(const mig_hashes *base, const mig_hashes *changes, mig_hashes *out)
{
	size_t i = 0, j = 0;
	while (i < base->n || j < changes->n) {
		int c = i == base->n      ? 1
			: j == changes->n ? -1
					  : sdb_bson_value_cmp(&base->v[i].id, &changes->v[j].id);
		if (c < 0) {
			mig_hashes_add(out, &base->v[i].id, base->v[i].hash, true, 0);
			i++;
			continue;
		}
		/* a change replaces the base's entry of the same _id (c == 0) or adds one */
		if (changes->v[j].present)
			mig_hashes_add(out, &changes->v[j].id, changes->v[j].hash, true,
				       changes->v[j].ts);
		if (c == 0)
			i++;
		j++;
	}
}

void mig_hashes_free(mig_hashes *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n; i++)
		bson_value_destroy(&l->v[i].id);
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}
