/* Routing tables (collections, shard keys, chunks): see route.h. */
#include "routing/route.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/keyenc.h"

/* ---------- snapshots ---------- */

/* The shared part of a chunk, freed with the last snapshot holding it: ONE allocation
 * holding the two bson_t bounds (static views, 128-byte aligned as libbson declares
 * bson_t), the reference count, the id and shard strings and the bounds' bytes. Two
 * bson_copy() bounds would cost ~330 bytes each; this block costs ~450 in all. */
typedef struct chunk_body {
	int refs;    /* atomic */
	void *block; /* what to free */
	char data[]; /* id NUL shard NUL min-bytes max-bytes */
} chunk_body;

#define BODY_BOUNDS (2 * sizeof(bson_t)) /* the two bson_t before the header */

static void chunk_free(route_chunk *ch)
{
	chunk_body *b = ch->body;

	if (b == NULL)
		return;
	if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	free(b->block);
}

/* Another snapshot holds ch: share its body. */
static void chunk_share(route_chunk *ch)
{
	__atomic_add_fetch(&((chunk_body *)ch->body)->refs, 1, __ATOMIC_RELAXED);
}

void route_coll_ref(route_coll *c)
{
	__atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void route_coll_unref(route_coll *c)
{
	size_t i;

	if (c == NULL || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	for (i = 0; i < c->nchunks; i++)
		chunk_free(&c->chunks[i]);
	free(c->chunks);
	free(c->shards);
	free(c->shard_of);
	for (i = 0; i < c->nkeys; i++)
		free(c->keys[i]);
	free(c->ns);
	free(c);
}

int route_key_cmp(const bson_t *a, const bson_t *b)
{
	/* the one chunk-membership order, shared with the metadata state machine (op version
	 * 4: decimals through long double, common/bsonval.h) */
	return sdb_bson_key_cmp_v4(a, b);
}

static int chunk_qsort_cmp(const void *a, const void *b)
{
	const route_chunk *x = a, *y = b;

	return route_key_cmp(x->min, y->min);
}

/* A view of a bound document; nkeys 0: any number of fields (checked later). */
static int bound_view(bson_iter_t *it, const char *name, size_t nkeys, const uint8_t **data,
		      uint32_t *len, char *err, size_t errlen)
{
	bson_iter_t sub;
	size_t n = 0;
	bson_t view;

	if (!bson_iter_find(it, name) || !BSON_ITER_HOLDS_DOCUMENT(it))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk without a %s document", name);
	bson_iter_document(it, len, data);
	if (!bson_init_static(&view, *data, *len))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk %s: corrupt document", name);
	if (nkeys) {
		if (bson_iter_recurse(it, &sub))
			while (bson_iter_next(&sub))
				n++;
		if (n != nkeys)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"chunk %s has %zu fields, key has %zu", name, n, nkeys);
	}
	return 0;
}

static size_t doc_fields(const bson_t *d)
{
	bson_iter_t it;
	size_t n = 0;

	if (bson_iter_init(&it, d))
		while (bson_iter_next(&it))
			n++;
	return n;
}

/* Parse one chunk document into ch (with a body of one reference). nkeys 0: bounds are
 * not checked here. */
static int chunk_parse_doc(const bson_iter_t *elem, size_t nkeys, route_chunk *ch, char *err,
			   size_t errlen)
{
	bson_iter_t it;
	char idbuf[32];
	const char *id = NULL, *shard;
	int64_t nid = 0;
	size_t li, ls;
	chunk_body *b;
	void *block;
	bson_t *bounds;
	const uint8_t *dmin = NULL, *dmax = NULL;
	uint32_t lmin = 0, lmax = 0;
	int rc;

	memset(ch, 0, sizeof *ch);
	if (!BSON_ITER_HOLDS_DOCUMENT(elem) || !bson_iter_recurse(elem, &it))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk is not a document");
	/* Metadata numbers chunks (int64 ids); the shard's version gate keys chunks by string:
	 * the decimal form of the id is the chunk's name on shards ($stripedbVersion.chunk). */
	if ((bson_iter_find(&it, "id") || (bson_iter_recurse(elem, &it) && bson_iter_find(&it, "_id"))) &&
	    (BSON_ITER_HOLDS_UTF8(&it) || BSON_ITER_HOLDS_INT(&it))) {
		if (BSON_ITER_HOLDS_UTF8(&it)) {
			id = bson_iter_utf8(&it, NULL);
			nid = strtoll(id, NULL, 10);
		} else {
			nid = bson_iter_as_int64(&it);
			snprintf(idbuf, sizeof idbuf, "%lld", (long long)nid);
			id = idbuf;
		}
	} else {
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk without an id");
	}
	bson_iter_recurse(elem, &it);
	if (!bson_iter_find(&it, "shard") || !BSON_ITER_HOLDS_UTF8(&it))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk %s without a shard", id);
	shard = bson_iter_utf8(&it, NULL);
	bson_iter_recurse(elem, &it);
	if (bson_iter_find(&it, "token") && BSON_ITER_HOLDS_NUMBER(&it))
		ch->token = bson_iter_as_int64(&it);
	bson_iter_recurse(elem, &it);
	if (bson_iter_find(&it, "version") && BSON_ITER_HOLDS_NUMBER(&it))
		ch->version = bson_iter_as_int64(&it);
	bson_iter_recurse(elem, &it);
	rc = bound_view(&it, "min", nkeys, &dmin, &lmin, err, errlen);
	if (rc == 0) {
		bson_iter_recurse(elem, &it);
		rc = bound_view(&it, "max", nkeys, &dmax, &lmax, err, errlen);
	}
	if (rc != 0) {
		memset(ch, 0, sizeof *ch);
		return rc;
	}
	li = strlen(id);
	ls = strlen(shard);
	/* [pad to 128][bson_t min][bson_t max][chunk_body: refs, block, id, shard, bytes] */
	block = sdb_malloc(127 + BODY_BOUNDS + sizeof *b + li + ls + 2 + lmin + lmax);
	bounds = (bson_t *)(((uintptr_t)block + 127) & ~(uintptr_t)127);
	b = (chunk_body *)((char *)bounds + BODY_BOUNDS);
	b->refs = 1;
	b->block = block;
	memcpy(b->data, id, li + 1);
	memcpy(b->data + li + 1, shard, ls + 1);
	memcpy(b->data + li + ls + 2, dmin, lmin);
	memcpy(b->data + li + ls + 2 + lmin, dmax, lmax);
	bson_init_static(&bounds[0], (const uint8_t *)b->data + li + ls + 2, lmin);
	bson_init_static(&bounds[1], (const uint8_t *)b->data + li + ls + 2 + lmin, lmax);
	ch->min = &bounds[0];
	ch->max = &bounds[1];
	ch->body = b;
	ch->id = b->data;
	ch->shard = b->data + li + 1;
	ch->nid = nid;
	return 0;
}

static int chunk_parse(const bson_iter_t *elem, const route_coll *c, route_chunk *ch,
		       bool *skip, char *err, size_t errlen)
{
	bson_iter_t it;

	*skip = false;
	memset(ch, 0, sizeof *ch);
	if (!BSON_ITER_HOLDS_DOCUMENT(elem) || !bson_iter_recurse(elem, &it))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunk is not a document");
	if (bson_iter_find(&it, "ns") && BSON_ITER_HOLDS_UTF8(&it) &&
	    strcmp(bson_iter_utf8(&it, NULL), c->ns) != 0) {
		*skip = true;
		return 0;
	}
	return chunk_parse_doc(elem, c->nkeys, ch, err, errlen);
}

/* Parse a key pattern into c (keys, nkeys, hashed). */
static int keys_parse(route_coll *c, const bson_t *key, char *err, size_t errlen)
{
	bson_iter_t it;
	const char *ns = c->ns;

	if (key == NULL || !bson_iter_init(&it, key))
		return sdb_errf(err, errlen, SDB_EINVAL, "%s: no shard key pattern", ns);
	while (bson_iter_next(&it)) {
		if (c->nkeys == ROUTE_MAX_KEY_FIELDS)
			return sdb_errf(err, errlen, SDB_EINVAL, "%s: shard key has too many fields",
					ns);
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0)
			c->hashed = true;
		else if (!BSON_ITER_HOLDS_NUMBER(&it))
			return sdb_errf(err, errlen, SDB_EINVAL, "%s: bad shard key pattern field %s",
					ns, bson_iter_key(&it));
		c->keys[c->nkeys++] = sdb_strdup(bson_iter_key(&it));
	}
	if (c->nkeys == 0 || (c->hashed && c->nkeys != 1))
		return sdb_errf(err, errlen, SDB_EINVAL,
				"%s: shard key must have 1..%d fields, hashed only alone", ns,
				ROUTE_MAX_KEY_FIELDS);
	return 0;
}

/* FNV-1a of a shard id: a table index, not security. */
static uint64_t shard_hash(const char *id)
{
	uint64_t h = 1469598103934665603ULL;

	for (; *id; id++)
		h = (h ^ (unsigned char)*id) * 1099511628211ULL;
	return h;
}

/* Fill c's per-shard summary (shards, nshards, shard_of, max_token) from its chunks: one
 * pass; a chunk's shard is looked up first as the previous chunk's, else in an
 * open-addressing table of the shards seen (index + 1, 0 = empty; kept at most half full),
 * so the pass costs O(chunks) whatever the number of shards. */
static void coll_summarise(route_coll *c)
{
	size_t i, s = 0, cap = 0, tcap = 16;
	uint32_t *tab = sdb_calloc(tcap, sizeof *tab);

	free(c->shards);
	free(c->shard_of);
	c->shards = NULL;
	c->nshards = 0;
	c->max_token = 0;
	c->shard_of = sdb_calloc(c->nchunks ? c->nchunks : 1, sizeof *c->shard_of);
	for (i = 0; i < c->nchunks; i++) {
		const route_chunk *ch = &c->chunks[i];
		if (ch->token > c->max_token)
			c->max_token = ch->token;
		if (c->nshards == 0 || strcmp(c->shards[s].id, ch->shard) != 0) {
			size_t h = (size_t)shard_hash(ch->shard) & (tcap - 1);
			while (tab[h] != 0 && strcmp(c->shards[tab[h] - 1].id, ch->shard) != 0)
				h = (h + 1) & (tcap - 1);
			if (tab[h] != 0) {
				s = tab[h] - 1;
			} else {
				s = c->nshards;
				if (c->nshards == cap) {
					cap = cap ? cap * 2 : 4;
					c->shards = sdb_realloc(c->shards, cap * sizeof *c->shards);
				}
				c->shards[s] = (route_shard){.id = ch->shard, .first = i};
				c->nshards++;
				tab[h] = (uint32_t)c->nshards;
				if (2 * c->nshards > tcap) { /* grow and re-insert */
					free(tab);
					tcap *= 2;
					tab = sdb_calloc(tcap, sizeof *tab);
					for (size_t k = 0; k < c->nshards; k++) {
						h = (size_t)shard_hash(c->shards[k].id) & (tcap - 1);
						while (tab[h] != 0)
							h = (h + 1) & (tcap - 1);
						tab[h] = (uint32_t)(k + 1);
					}
				}
			}
		}
		c->shard_of[i] = (uint32_t)s;
		c->shards[s].nchunks++;
		if (ch->token > c->shards[s].version)
			c->shards[s].version = ch->token;
	}
	free(tab);
}

const route_shard *route_shard_find(const route_coll *c, const char *shard)
{
	size_t s;

	for (s = 0; s < c->nshards; s++)
		if (strcmp(c->shards[s].id, shard) == 0)
			return &c->shards[s];
	return NULL;
}

int route_coll_build(const char *ns, const bson_t *key, const bson_t *table, route_coll **out,
		     char *err, size_t errlen)
{
	route_coll *c = sdb_calloc(1, sizeof *c);
	bson_iter_t it, arr;
	size_t cap = 0, i;
	int rc = SDB_EINVAL;

	c->ns = sdb_strdup(ns);
	c->refs = 1;
	if (keys_parse(c, key, err, errlen) != 0)
		goto err;
	if (table != NULL && bson_iter_init(&it, table)) {
		if (bson_iter_find(&it, "routingVersion") && BSON_ITER_HOLDS_NUMBER(&it))
			c->version = bson_iter_as_int64(&it);
		if (bson_iter_init(&it, table) && bson_iter_find(&it, "chunks") &&
		    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
			while (bson_iter_next(&arr)) {
				bool skip;
				if (c->nchunks == cap) {
					cap = cap ? cap * 2 : 8;
					c->chunks = sdb_realloc(c->chunks, cap * sizeof *c->chunks);
				}
				rc = chunk_parse(&arr, c, &c->chunks[c->nchunks], &skip, err, errlen);
				if (rc != 0 || skip) {
					chunk_free(&c->chunks[c->nchunks]);
					if (rc != 0) {
						sdb_errwrap(err, errlen, rc, "%s", ns);
						goto err;
					}
					continue;
				}
				c->nchunks++;
			}
		}
	}
	if (c->nchunks > 1)
		sdb_qsort(c->chunks, c->nchunks, sizeof *c->chunks, chunk_qsort_cmp);
	for (i = 0; i + 1 < c->nchunks; i++) {
		if (route_key_cmp(c->chunks[i].max, c->chunks[i + 1].min) > 0) {
			sdb_errf(err, errlen, SDB_EINVAL, "%s: chunks %s and %s overlap", ns,
				 c->chunks[i].id, c->chunks[i + 1].id);
			goto err;
		}
	}
	coll_summarise(c);
	*out = c;
	return 0;
err:
	route_coll_unref(c);
	return SDB_EINVAL;
}

route_coll *route_coll_unsharded(const char *ns, int64_t version)
{
	route_coll *c = sdb_calloc(1, sizeof *c);

	c->ns = sdb_strdup(ns);
	c->refs = 1;
	c->version = version;
	return c;
}

/* ---------- incremental updates (issue #26) ---------- */

struct route_update {
	char *ns;
	bool full;     /* a full load: start from nothing */
	bool dropped;  /* the collection was dropped (and maybe re-created) since old */
	bson_t *key;   /* key pattern, or NULL */
	route_chunk *ch; /* chunks in their current state, as fed (bodies owned) */
	size_t n, cap;
	int64_t *gone; /* ids of removed chunks */
	size_t ngone, capgone;
	char *shards[ROUTE_UPDATE_MAX_SHARDS]; /* distinct shards of the fed chunks */
	size_t nshards;
	bool many_shards;
};

route_update *route_update_new(const char *ns, bool full)
{
	route_update *u = sdb_calloc(1, sizeof *u);

	u->ns = sdb_strdup(ns);
	u->full = full;
	return u;
}

void route_update_free(route_update *u)
{
	size_t i;

	if (u == NULL)
		return;
	for (i = 0; i < u->n; i++)
		chunk_free(&u->ch[i]);
	free(u->ch);
	free(u->gone);
	for (i = 0; i < u->nshards; i++)
		free(u->shards[i]);
	if (u->key)
		bson_destroy(u->key);
	free(u->ns);
	free(u);
}

void route_update_set_key(route_update *u, const bson_t *key)
{
	if (u->key)
		bson_destroy(u->key);
	u->key = bson_copy(key);
}

int route_update_chunk(route_update *u, const bson_iter_t *elem, char *err, size_t errlen)
{
	int rc;

	if (u->n == u->cap) {
		u->cap = u->cap ? u->cap * 2 : 16;
		u->ch = sdb_realloc(u->ch, u->cap * sizeof *u->ch);
	}
	rc = chunk_parse_doc(elem, 0, &u->ch[u->n], err, errlen);
	if (rc != 0)
		return rc;
	if (!u->many_shards) {
		const char *sh = u->ch[u->n].shard;
		size_t i;
		for (i = 0; i < u->nshards && strcmp(u->shards[i], sh) != 0; i++)
			;
		if (i == u->nshards) {
			if (u->nshards == ROUTE_UPDATE_MAX_SHARDS)
				u->many_shards = true;
			else
				u->shards[u->nshards++] = sdb_strdup(sh);
		}
	}
	u->n++;
	return 0;
}

size_t route_update_shards(const route_update *u, char *const **out, bool *many)
{
	*out = u->shards;
	*many = u->many_shards;
	return u->nshards;
}

void route_update_removed(route_update *u, const bson_iter_t *elem)
{
	bson_iter_t it;

	if (!BSON_ITER_HOLDS_DOCUMENT(elem) || !bson_iter_recurse(elem, &it))
		return;
	if (bson_iter_find(&it, "collection") && bson_iter_as_bool(&it)) {
		/* everything fed before belongs to the dropped incarnation */
		for (size_t i = 0; i < u->n; i++)
			chunk_free(&u->ch[i]);
		u->n = 0;
		u->ngone = 0;
		u->dropped = true;
		return;
	}
	bson_iter_recurse(elem, &it);
	if (!bson_iter_find(&it, "id") || !BSON_ITER_HOLDS_NUMBER(&it))
		return;
	if (u->ngone == u->capgone) {
		u->capgone = u->capgone ? u->capgone * 2 : 16;
		u->gone = sdb_realloc(u->gone, u->capgone * sizeof *u->gone);
	}
	u->gone[u->ngone++] = bson_iter_as_int64(&it);
}

size_t route_update_size(const route_update *u)
{
	return u->n + u->ngone + (u->dropped ? 1 : 0);
}

static int i64_cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* by id, newest version first (so the first of equal ids is the one to keep) */
static int chunk_id_cmp(const void *a, const void *b)
{
	const route_chunk *x = a, *y = b;

	if (x->nid != y->nid)
		return x->nid < y->nid ? -1 : 1;
	return x->version > y->version ? -1 : x->version < y->version;
}

static bool id_in(const int64_t *v, size_t n, int64_t id)
{
	return n && bsearch(&id, v, n, sizeof *v, i64_cmp) != NULL;
}

/* First index in [lo, hi) of chunks whose min is > key's min (upper bound). */
static size_t upper_bound(const route_chunk *v, size_t lo, size_t hi, const bson_t *min)
{
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (route_key_cmp(v[mid].min, min) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int route_update_apply(route_update *u, const route_coll *old, int64_t version,
		       route_coll **out, char *err, size_t errlen)
{
	route_coll *c = sdb_calloc(1, sizeof *c);
	bool fresh = u->full || u->dropped || old == NULL || old->nkeys == 0;
	int64_t *drop = NULL;
	size_t ndrop = 0, i, j, nk = 0, pos, nfed = 0;
	route_chunk *kept = NULL;
	size_t *ins = NULL;

	c->ns = sdb_strdup(u->ns);
	c->refs = 1;
	c->version = version;
	*out = NULL;
	/* the key pattern: the old snapshot's, unless starting from nothing */
	if (!fresh) {
		for (i = 0; i < old->nkeys; i++)
			c->keys[i] = sdb_strdup(old->keys[i]);
		c->nkeys = old->nkeys;
		c->hashed = old->hashed;
	} else if (u->key != NULL) {
		if (keys_parse(c, u->key, err, errlen) != 0)
			goto err;
	} else if (u->n > 0) {
		sdb_errf(err, errlen, SDB_EINVAL, "%s: chunks without a shard key pattern", u->ns);
		goto err;
	} else {
		/* no chunks and no key: the collection is not sharded (any more, or yet) */
		*out = c;
		return 0;
	}
	/* the fed chunks: newest state of each id, sorted by min */
	if (u->n > 1) {
		sdb_qsort(u->ch, u->n, sizeof *u->ch, chunk_id_cmp);
		for (i = 1, j = 1; i < u->n; i++) {
			if (u->ch[i].nid == u->ch[j - 1].nid)
				chunk_free(&u->ch[i]);
			else
				u->ch[j++] = u->ch[i];
		}
		u->n = j;
	}
	for (i = 0; i < u->n; i++) {
		if (doc_fields(u->ch[i].min) != c->nkeys || doc_fields(u->ch[i].max) != c->nkeys) {
			sdb_errf(err, errlen, SDB_EINVAL, "%s: chunk %s has bounds of %zu fields, key has %zu",
				 u->ns, u->ch[i].id, doc_fields(u->ch[i].min), c->nkeys);
			goto err;
		}
	}
	if (u->n > 1)
		sdb_qsort(u->ch, u->n, sizeof *u->ch, chunk_qsort_cmp);
	/* the old chunks that stay: neither removed nor changed (shared, not copied) */
	if (!fresh) {
		ndrop = u->ngone + u->n;
		drop = sdb_malloc((ndrop ? ndrop : 1) * sizeof *drop);
		if (u->ngone)
			memcpy(drop, u->gone, u->ngone * sizeof *drop);
		for (i = 0; i < u->n; i++)
			drop[u->ngone + i] = u->ch[i].nid;
		qsort(drop, ndrop, sizeof *drop, i64_cmp);
		kept = sdb_malloc((old->nchunks ? old->nchunks : 1) * sizeof *kept);
		for (i = 0; i < old->nchunks; i++)
			if (!id_in(drop, ndrop, old->chunks[i].nid)) {
				kept[nk] = old->chunks[i];
				chunk_share(&kept[nk++]);
			}
	}
	/* merge: each fed chunk goes where its min belongs among the kept ones */
	nfed = u->n;
	c->chunks = sdb_malloc((nk + u->n ? nk + u->n : 1) * sizeof *c->chunks);
	ins = sdb_malloc((u->n ? u->n : 1) * sizeof *ins);
	for (i = 0, pos = 0; i < u->n; i++) {
		size_t at = upper_bound(kept, pos, nk, u->ch[i].min);
		if (at > pos)
			memcpy(c->chunks + c->nchunks, kept + pos, (at - pos) * sizeof *kept);
		c->nchunks += at - pos;
		pos = at;
		ins[i] = c->nchunks;
		c->chunks[c->nchunks++] = u->ch[i];
	}
	if (nk > pos)
		memcpy(c->chunks + c->nchunks, kept + pos, (nk - pos) * sizeof *kept);
	c->nchunks += nk - pos;
	/* the fed chunks moved into c (their one reference with them) */
	u->n = 0;
	/* overlaps can only appear next to an inserted chunk */
	for (j = 0; j < nfed; j++) {
		size_t at = ins[j];
		if ((at > 0 && route_key_cmp(c->chunks[at - 1].max, c->chunks[at].min) > 0) ||
		    (at + 1 < c->nchunks &&
		     route_key_cmp(c->chunks[at].max, c->chunks[at + 1].min) > 0)) {
			sdb_errf(err, errlen, SDB_EINVAL, "%s: chunk %s overlaps a neighbour", u->ns,
				 c->chunks[at].id);
			goto err;
		}
	}
	free(drop);
	free(kept);
	free(ins);
	coll_summarise(c);
	*out = c;
	return 0;
err:
	free(drop);
	free(kept);
	free(ins);
	route_coll_unref(c);
	return SDB_EINVAL;
}

/* ---------- keys ---------- */

int64_t route_hash_value(const bson_value_t *v)
{
	return sdb_keyenc_hash_value(v); /* the shard's hashed indexes use the same function */
}

/* Find the value at a dotted path through documents only. Returns 1 found (it set),
 * 0 missing, -1 when an array lies on the path. */
static int path_find(const bson_t *doc, const char *path, bson_iter_t *out)
{
	bson_iter_t it, sub;
	const char *p = path, *dot;
	char comp[256];
	size_t n;

	if (!bson_iter_init(&it, doc))
		return 0;
	for (;;) {
		dot = strchr(p, '.');
		n = dot ? (size_t)(dot - p) : strlen(p);
		if (n >= sizeof comp)
			return 0;
		memcpy(comp, p, n);
		comp[n] = '\0';
		if (!bson_iter_find(&it, comp))
			return 0;
		if (BSON_ITER_HOLDS_ARRAY(&it))
			return -1;
		if (dot == NULL) {
			*out = it;
			return 1;
		}
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub))
			return 0;
		it = sub;
		p = dot + 1;
	}
}

int route_key_from_doc(const route_coll *c, const bson_t *doc, bson_t *out, char *err,
		       size_t errlen)
{
	size_t i;
	bson_iter_t it;
	int r;

	for (i = 0; i < c->nkeys; i++) {
		r = path_find(doc, c->keys[i], &it);
		if (r < 0)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"Shard key cannot contain an array: field %s", c->keys[i]);
		if (c->hashed) {
			BSON_APPEND_INT64(out, c->keys[i],
					  route_hash_value(r ? bson_iter_value(&it) : NULL));
		} else if (r) {
			bson_append_iter(out, c->keys[i], -1, &it);
		} else {
			BSON_APPEND_NULL(out, c->keys[i]);
		}
	}
	return 0;
}

int route_key_encode(const route_coll *c, const bson_t *doc, sdb_key *out)
{
	size_t start = out->len, i;
	bson_iter_t it;
	bson_value_t v;
	bool legacy;
	char err[64];

	for (i = 0; i < c->nkeys; i++) {
		int r = path_find(doc, c->keys[i], &it);
		if (r < 0)
			goto bad;
		if (r) {
			v = *bson_iter_value(&it);
		} else {
			memset(&v, 0, sizeof v);
			v.value_type = BSON_TYPE_NULL;
		}
		if (c->hashed) {
			int64_t h = sdb_keyenc_hash_value(&v);
			memset(&v, 0, sizeof v);
			v.value_type = BSON_TYPE_INT64;
			v.value.v_int64 = h;
		}
		legacy = sdb_keyenc_legacy_numbers(true); /* route_key_cmp's order */
		r = sdb_keyenc_append_value(out, &v, false, err, sizeof err);
		sdb_keyenc_legacy_numbers(legacy);
		if (r != 0)
			goto bad;
	}
	return 0;
bad:
	out->len = start;
	return SDB_EINVAL;
}

ssize_t route_find_chunk(const route_coll *c, const bson_t *key)
{
	size_t lo = 0, hi = c->nchunks, mid;

	/* last chunk with min <= key */
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (route_key_cmp(c->chunks[mid].min, key) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	if (route_key_cmp(key, c->chunks[lo - 1].max) >= 0)
		return -1;
	return (ssize_t)(lo - 1);
}

ssize_t route_chunk_of_doc(const route_coll *c, const bson_t *doc)
{
	bson_t key = BSON_INITIALIZER;
	ssize_t r = -1;
	char err[128];

	if (route_key_from_doc(c, doc, &key, err, sizeof err) == 0)
		r = route_find_chunk(c, &key);
	bson_destroy(&key);
	return r;
}

/* ---------- targeting ---------- */

enum { COND_NONE = 0, COND_POINTS, COND_RANGE };

typedef struct cond {
	int kind;
	bson_value_t pts[ROUTE_MAX_POINTS];
	size_t npts;
	bool has_lo, lo_incl, has_hi, hi_incl;
	bson_value_t lo, hi;
} cond;

static bool value_is_point(const bson_iter_t *it)
{
	bson_iter_t sub;

	if (BSON_ITER_HOLDS_REGEX(it) || BSON_ITER_HOLDS_ARRAY(it))
		return false;
	if (BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &sub) && bson_iter_next(&sub) &&
	    bson_iter_key(&sub)[0] == '$')
		return false;
	return true;
}

static void cond_from_value(const bson_iter_t *v, cond *cd)
{
	bson_iter_t ops, arr;

	if (value_is_point(v)) {
		cd->kind = COND_POINTS;
		cd->pts[0] = *bson_iter_value((bson_iter_t *)v);
		cd->npts = 1;
		return;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(v) || !bson_iter_recurse(v, &ops))
		return;
	while (bson_iter_next(&ops)) {
		const char *op = bson_iter_key(&ops);
		if (strcmp(op, "$eq") == 0 && value_is_point(&ops)) {
			cd->kind = COND_POINTS;
			cd->pts[0] = *bson_iter_value(&ops);
			cd->npts = 1;
			return;
		}
		if (strcmp(op, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&ops) &&
		    bson_iter_recurse(&ops, &arr)) {
			size_t n = 0;
			bool ok = true;
			while (bson_iter_next(&arr)) {
				if (n == ROUTE_MAX_POINTS || !value_is_point(&arr)) {
					ok = false;
					break;
				}
				cd->pts[n++] = *bson_iter_value(&arr);
			}
			if (ok) {
				cd->kind = COND_POINTS;
				cd->npts = n;
				return;
			}
			continue;
		}
		if (strcmp(op, "$gt") == 0 || strcmp(op, "$gte") == 0) {
			cd->has_lo = true;
			cd->lo_incl = op[3] == 'e';
			cd->lo = *bson_iter_value(&ops);
		} else if (strcmp(op, "$lt") == 0 || strcmp(op, "$lte") == 0) {
			cd->has_hi = true;
			cd->hi_incl = op[3] == 'e';
			cd->hi = *bson_iter_value(&ops);
		}
	}
	if (cd->has_lo || cd->has_hi)
		cd->kind = COND_RANGE;
}

/* Find the condition on path in filter (top level or inside top-level $and). */
static void cond_find(const bson_t *filter, const char *path, cond *cd, int depth)
{
	bson_iter_t it, arr;

	if (filter == NULL || !bson_iter_init(&it, filter))
		return;
	while (bson_iter_next(&it) && cd->kind != COND_POINTS) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, path) == 0) {
			cond tmp;
			memset(&tmp, 0, sizeof tmp);
			cond_from_value(&it, &tmp);
			if (tmp.kind == COND_POINTS || (tmp.kind == COND_RANGE && cd->kind == COND_NONE))
				*cd = tmp;
		} else if (strcmp(k, "$and") == 0 && depth < 4 && BSON_ITER_HOLDS_ARRAY(&it) &&
			   bson_iter_recurse(&it, &arr)) {
			while (bson_iter_next(&arr)) {
				uint32_t len;
				const uint8_t *data;
				bson_t sub;
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				bson_iter_document(&arr, &len, &data);
				if (bson_init_static(&sub, data, len))
					cond_find(&sub, path, cd, depth + 1);
			}
		}
	}
}

/* A chunk bound's first value vs a query's bound v in route_key_cmp's order (decimals
 * through long double), binary whatever the request's collation. */
static int value_cmp_bound(const bson_iter_t *first_of_bound, const bson_value_t *v)
{
	return sdb_bson_value_cmp_v4(bson_iter_value((bson_iter_t *)first_of_bound), v);
}

static bool first_elem(const bson_t *doc, bson_iter_t *it)
{
	return bson_iter_init(it, doc) && bson_iter_next(it);
}

/* Select chunks whose first component may overlap [lo, hi] (lo/hi NULL = unbounded). */
static size_t select_first_range(const route_coll *c, const bson_value_t *lo,
				 const bson_value_t *hi, bool hi_incl, bool *sel)
{
	size_t i, n = 0;
	bson_iter_t mn, mx;

	for (i = 0; i < c->nchunks; i++) {
		if (sel[i]) {
			continue;
		}
		if (!first_elem(c->chunks[i].min, &mn) || !first_elem(c->chunks[i].max, &mx)) {
			sel[i] = true;
			n++;
			continue;
		}
		/* A chunk holds the documents whose key is in [min, max) by route_key_cmp, in
		 * which a number ties every number with the same nearest long double: one below
		 * min by exact value can be in the chunk, one at or above max cannot. So max
		 * compares as route_key_cmp does (its documents are below max exactly too), and a
		 * min that ties a numeric hi keeps the chunk even when hi is exclusive. */
		if (lo != NULL) {
			int r = value_cmp_bound(&mx, lo);
			if (r < 0 || (r == 0 && c->nkeys == 1))
				continue;
		}
		if (hi != NULL) {
			int r = value_cmp_bound(&mn, hi);
			if (r > 0 || (r == 0 && !hi_incl && sdb_bson_bracket(hi->value_type) !=
								   SDB_BRACKET_NUMBER))
				continue;
		}
		sel[i] = true;
		n++;
	}
	return n;
}

size_t route_target(const route_coll *c, const bson_t *filter, bool *sel, bool *exact)
{
	cond *cds = sdb_calloc(c->nkeys, sizeof *cds);
	size_t i, n = 0, total = 1;
	bool all_points = true;

	*exact = false;
	memset(sel, 0, c->nchunks * sizeof *sel);
	for (i = 0; i < c->nkeys; i++) {
		cond_find(filter, c->keys[i], &cds[i], 0);
		if (cds[i].kind != COND_POINTS)
			all_points = false;
		else
			total *= cds[i].npts;
		if (total > ROUTE_MAX_POINTS)
			all_points = false;
	}
	if (all_points) {
		size_t idx[ROUTE_MAX_KEY_FIELDS] = {0};
		size_t p;
		for (p = 0; p < total; p++) {
			bson_t key = BSON_INITIALIZER;
			ssize_t ch;
			size_t rem = p;
			for (i = 0; i < c->nkeys; i++) {
				idx[i] = rem % cds[i].npts;
				rem /= cds[i].npts;
				if (c->hashed)
					BSON_APPEND_INT64(&key, c->keys[i],
							  route_hash_value(&cds[i].pts[idx[i]]));
				else
					BSON_APPEND_VALUE(&key, c->keys[i], &cds[i].pts[idx[i]]);
			}
			ch = route_find_chunk(c, &key);
			bson_destroy(&key);
			if (ch >= 0 && !sel[ch]) {
				sel[ch] = true;
				n++;
			}
		}
		*exact = true;
		goto out;
	}
	if (!c->hashed && cds[0].kind == COND_POINTS) {
		for (i = 0; i < cds[0].npts; i++)
			n += select_first_range(c, &cds[0].pts[i], &cds[0].pts[i], true, sel);
		goto out;
	}
	if (!c->hashed && cds[0].kind == COND_RANGE) {
		n = select_first_range(c, cds[0].has_lo ? &cds[0].lo : NULL,
				       cds[0].has_hi ? &cds[0].hi : NULL, cds[0].hi_incl, sel);
		goto out;
	}
	for (i = 0; i < c->nchunks; i++)
		sel[i] = true;
	n = c->nchunks;
out:
	free(cds);
	return n;
}

size_t route_target_range(const route_coll *c, const bson_t *min, const bson_t *max, bool *sel)
{
	size_t i, n = 0;

	for (i = 0; i < c->nchunks; i++) {
		sel[i] = route_key_cmp(c->chunks[i].min, max) < 0 &&
			 route_key_cmp(min, c->chunks[i].max) < 0;
		n += sel[i];
	}
	return n;
}

/* ---------- shard key updates ---------- */

static bool paths_conflict(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t m = la < lb ? la : lb;

	if (strncmp(a, b, m) != 0)
		return false;
	if (la == lb)
		return true;
	return (la < lb ? b[la] : a[lb]) == '.';
}

static bool filter_point(const bson_t *filter, const char *path, bson_value_t *v)
{
	cond cd;

	memset(&cd, 0, sizeof cd);
	cond_find(filter, path, &cd, 0);
	if (cd.kind != COND_POINTS || cd.npts != 1)
		return false;
	*v = cd.pts[0];
	return true;
}

route_key_change route_update_changes_key(const route_coll *c, const bson_t *update,
					  const bson_t *filter, char *err, size_t errlen)
{
	bson_iter_t it, f;
	size_t i;
	bson_value_t pinned;

	if (!bson_iter_init(&it, update) || !bson_iter_next(&it))
		return ROUTE_KEY_KEPT;
	if (bson_iter_key(&it)[0] == '$') {
		bson_iter_init(&it, update);
		while (bson_iter_next(&it)) {
			const char *op = bson_iter_key(&it);
			if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &f))
				continue;
			while (bson_iter_next(&f)) {
				for (i = 0; i < c->nkeys; i++) {
					if (strcmp(c->keys[i], "_id") == 0)
						continue; /* immutable anyway: the shard refuses changes */
					if (!paths_conflict(bson_iter_key(&f), c->keys[i]))
						continue;
					/* $set, or $setOnInsert (which only sets it on an upsert's
					 * insert), of the very value the filter pins: kept */
					if ((strcmp(op, "$set") == 0 ||
					     strcmp(op, "$setOnInsert") == 0) &&
					    strcmp(bson_iter_key(&f), c->keys[i]) == 0 &&
					    filter_point(filter, c->keys[i], &pinned) &&
					    sdb_bson_value_eq_simple(bson_iter_value(&f), &pinned))
						continue;
					sdb_errf(err, errlen, SDB_EINVAL,
						 "After applying the update, the (immutable) field '%s' "
						 "was found to have been altered: updating the shard key "
						 "of a document is not supported",
						 c->keys[i]);
					return ROUTE_KEY_CHANGED;
				}
			}
		}
		return ROUTE_KEY_KEPT;
	}
	/* replacement (an _id key is kept by the shard: _id is immutable there) */
	for (i = 0; i < c->nkeys; i++) {
		bson_iter_t v;
		if (strcmp(c->keys[i], "_id") == 0)
			continue;
		int r = path_find(update, c->keys[i], &v);
		bson_value_t null_v;
		null_v.value_type = BSON_TYPE_NULL;
		if (!filter_point(filter, c->keys[i], &pinned)) {
			sdb_errf(err, errlen, SDB_EINVAL,
				 "Shard key update is not allowed without specifying the full "
				 "shard key in the query: field '%s'",
				 c->keys[i]);
			return ROUTE_KEY_NOT_PINNED;
		}
		if (r < 0 || !sdb_bson_value_eq_simple(r ? bson_iter_value(&v) : &null_v, &pinned)) {
			sdb_errf(err, errlen, SDB_EINVAL,
				 "After applying the update, the (immutable) field '%s' was found "
				 "to have been altered",
				 c->keys[i]);
			return ROUTE_KEY_CHANGED;
		}
	}
	return ROUTE_KEY_KEPT;
}

/* ---------- cache ---------- */

struct route_cache {
	uv_mutex_t mu;
	route_coll **v;
	size_t n, cap;
};

route_cache *route_cache_new(void)
{
	route_cache *rc = sdb_calloc(1, sizeof *rc);

	uv_mutex_init(&rc->mu);
	return rc;
}

void route_cache_free(route_cache *rc)
{
	size_t i;

	if (rc == NULL)
		return;
	for (i = 0; i < rc->n; i++)
		route_coll_unref(rc->v[i]);
	free(rc->v);
	uv_mutex_destroy(&rc->mu);
	free(rc);
}

/* Index of ns in the sorted cache, or where it would go (*found tells). Locked. */
static size_t cache_find(route_cache *rc, const char *ns, bool *found)
{
	size_t lo = 0, hi = rc->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(rc->v[mid]->ns, ns);
		if (r == 0) {
			*found = true;
			return mid;
		}
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

route_coll *route_cache_get(route_cache *rc, const char *ns)
{
	route_coll *c = NULL;
	bool found;
	size_t i;

	uv_mutex_lock(&rc->mu);
	i = cache_find(rc, ns, &found);
	if (found) {
		c = rc->v[i];
		route_coll_ref(c);
	}
	uv_mutex_unlock(&rc->mu);
	return c;
}

void route_cache_put(route_cache *rc, route_coll *c)
{
	bool found;
	size_t i;

	uv_mutex_lock(&rc->mu);
	i = cache_find(rc, c->ns, &found);
	if (found) {
		if (rc->v[i]->version > c->version) {
			uv_mutex_unlock(&rc->mu);
			route_coll_unref(c);
			return;
		}
		route_coll_unref(rc->v[i]);
		rc->v[i] = c;
		uv_mutex_unlock(&rc->mu);
		return;
	}
	if (rc->n == rc->cap) {
		rc->cap = rc->cap ? rc->cap * 2 : 16;
		rc->v = sdb_realloc(rc->v, rc->cap * sizeof *rc->v);
	}
	memmove(rc->v + i + 1, rc->v + i, (rc->n - i) * sizeof *rc->v);
	rc->v[i] = c;
	rc->n++;
	uv_mutex_unlock(&rc->mu);
}

void route_cache_drop(route_cache *rc, const char *ns)
{
	size_t i, j = 0;

	uv_mutex_lock(&rc->mu);
	for (i = 0; i < rc->n; i++) {
		if (ns == NULL || strcmp(rc->v[i]->ns, ns) == 0)
			route_coll_unref(rc->v[i]);
		else
			rc->v[j++] = rc->v[i];
	}
	rc->n = j;
	uv_mutex_unlock(&rc->mu);
}

size_t route_cache_names(route_cache *rc, char ***out)
{
	size_t i, n;

	uv_mutex_lock(&rc->mu);
	n = rc->n;
	*out = sdb_calloc(n ? n : 1, sizeof **out);
	for (i = 0; i < n; i++)
		(*out)[i] = sdb_strdup(rc->v[i]->ns);
	uv_mutex_unlock(&rc->mu);
	return n;
}

bool route_unique_index_compatible(const route_coll *c, const bson_t *key)
{
	bson_iter_t it;
	size_t i = 0;

	if (!bson_iter_init(&it, key))
		return false;
	while (bson_iter_next(&it)) {
		const char *f = bson_iter_key(&it);
		if (i == 0 && strcmp(f, "_id") == 0)
			return true;
		if (i == c->nkeys)
			return true;
		if (strcmp(f, c->keys[i]) != 0)
			return false;
		i++;
	}
	return i == c->nkeys;
}

size_t route_cache_chunks(route_cache *rc)
{
	size_t i, n = 0;

	uv_mutex_lock(&rc->mu);
	for (i = 0; i < rc->n; i++)
		n += rc->v[i]->nchunks;
	uv_mutex_unlock(&rc->mu);
	return n;
}
