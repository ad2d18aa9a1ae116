/* A shard's owned key ranges as memcmp-comparable bytes: see owned.h. */
#include "routing/owned.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

/* One merged range [lo, hi): offsets and lengths into route_owned.bytes. */
typedef struct owned_range {
	size_t lo, lo_len, hi, hi_len;
} owned_range;

struct route_owned {
	int refs; /* atomic */
	route_coll *coll;
	owned_range *r; /* sorted, disjoint */
	size_t n;
	uint8_t *bytes; /* every bound, back to back */
};

/* Append the encoding of a bound document (one element per key field) to k, numbers in
 * the frozen form (storage/keyenc.h sdb_keyenc_legacy_numbers) as route_key_encode encodes
 * documents' keys: memcmp order is then route_key_cmp's order. */
static int bound_encode(const bson_t *b, sdb_key *k, char *err, size_t errlen)
{
	bson_iter_t it;
	bool legacy;
	int rc = 0;

	if (!bson_iter_init(&it, b))
		return sdb_errf(err, errlen, SDB_EINVAL, "corrupt chunk bound");
	legacy = sdb_keyenc_legacy_numbers(true);
	while (rc == 0 && bson_iter_next(&it))
		if (sdb_keyenc_append_iter(k, &it, false, err, errlen) != 0)
			rc = SDB_EINVAL;
	sdb_keyenc_legacy_numbers(legacy);
	return rc;
}

int route_owned_build(route_coll *c, route_owned **out, char *err, size_t errlen)
{
	route_owned *o = sdb_calloc(1, sizeof *o);
	sdb_key k;
	size_t i;

	sdb_key_init(&k);
	o->refs = 1;
	route_coll_ref(c);
	o->coll = c;
	o->r = sdb_calloc(c->nchunks ? c->nchunks : 1, sizeof *o->r);
	for (i = 0; i < c->nchunks; i++) {
		const route_chunk *ch = &c->chunks[i];
		/* chunks are sorted by min and never overlap: one continuing the previous
		 * range starts where it ends */
		bool cont = o->n > 0 && route_key_cmp(c->chunks[i - 1].max, ch->min) == 0;
		if (!cont) {
			o->r[o->n].lo = k.len;
			if (bound_encode(ch->min, &k, err, errlen) != 0)
				goto err;
			o->r[o->n].lo_len = k.len - o->r[o->n].lo;
			o->n++;
		}
		/* the range's end: this chunk's max (a merged range keeps its last max) */
		owned_range *r = &o->r[o->n - 1];
		if (cont)
			k.len = r->hi; /* drop the previous chunk's max: this one extends it */
		r->hi = k.len;
		if (bound_encode(ch->max, &k, err, errlen) != 0)
			goto err;
		r->hi_len = k.len - r->hi;
	}
	o->bytes = k.data; /* the key's buffer, now o's */
	*out = o;
	return 0;
err:
	sdb_key_free(&k);
	route_owned_unref(o);
	return SDB_EINVAL;
}

void route_owned_ref(route_owned *o)
{
	__atomic_add_fetch(&o->refs, 1, __ATOMIC_RELAXED);
}

void route_owned_unref(route_owned *o)
{
	if (o == NULL || __atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	route_coll_unref(o->coll);
	free(o->r);
	free(o->bytes);
	free(o);
}

const route_coll *route_owned_coll(const route_owned *o)
{
	return o->coll;
}

size_t route_owned_nranges(const route_owned *o)
{
	return o->n;
}

/* key vs range i: <0 below its min, 0 inside, >0 at or above its max */
static int range_cmp(const route_owned *o, size_t i, const uint8_t *key, size_t len)
{
	const owned_range *r = &o->r[i];

	if (sdb_key_cmp_raw(key, len, o->bytes + r->lo, r->lo_len) < 0)
		return -1;
	if (sdb_key_cmp_raw(key, len, o->bytes + r->hi, r->hi_len) >= 0)
		return 1;
	return 0;
}

bool route_owned_has_key(const route_owned *o, const uint8_t *key, size_t len, size_t *hint)
{
	size_t lo = 0, hi = o->n, mid;
	int c;

	if (o->n == 0)
		return false;
	if (*hint < o->n) {
		c = range_cmp(o, *hint, key, len);
		if (c == 0)
			return true;
		/* in shard-key order the next document is in the next range or a gap before it */
		if (c > 0 && *hint + 1 < o->n) {
			int c2 = range_cmp(o, *hint + 1, key, len);
			if (c2 == 0) {
				(*hint)++;
				return true;
			}
			if (c2 < 0)
				return false; /* between the two ranges */
			lo = *hint + 2;
		} else if (c > 0) {
			return false; /* above the last range */
		} else {
			hi = *hint;
		}
	}
	/* the last range whose min <= key, in [lo, hi) */
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (sdb_key_cmp_raw(o->bytes + o->r[mid].lo, o->r[mid].lo_len, key, len) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || range_cmp(o, lo - 1, key, len) != 0)
		return false;
	*hint = lo - 1;
	return true;
}

bool route_owned_has_doc(const route_owned *o, const bson_t *doc, sdb_key *buf, size_t *hint)
{
	sdb_key_reset(buf);
	if (route_key_encode(o->coll, doc, buf) != 0)
		return false;
	return route_owned_has_key(o, buf->data, buf->len, hint);
}
