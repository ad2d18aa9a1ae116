/* Planner and executor of the embedded shard (see query.h). */
#include "storage/query.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "storage/collation.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"
#include "storage/store_int.h"

#define QUERY_MAX_SORT_BYTES (100u * 1024u * 1024u)

static _Atomic uint64_t total_keys, total_docs, total_returned; /* sdb_query_totals */

typedef struct held_doc {
	bson_t *doc;
	size_t seq;
} held_doc;

struct sdb_query {
	char *db, *coll;
	bson_t filter;
	sdb_matcher *matcher;
	sdb_sortspec *sort;
	bson_t sort_doc;
	/* plan */
	bool empty;        /* bounds proved nothing matches */
	size_t id_points;  /* the plan looks up this many _id values (0: another plan) */
	bool collscan;     /* no bounds, no index */
	char *index;       /* secondary index name, NULL = _id / collection order */
	bool multikey;     /* the chosen index is multikey */
	const sdb_collator *icoll; /* the chosen index's collation (NULL: simple) */
	bson_t key_pattern;
	bool reverse;
	bool blocking_sort;
	size_t n_ranges;
	sdb_store_range *ranges;
	sdb_key *range_keys; /* 2 per range: owned lo and hi */
	/* execution */
	sdb_store_cursor *cur;
	int64_t skip, limit, skipped, returned;
	int64_t keys, docs;
	uint64_t start_ns, end_ns;
	size_t max_sort_bytes;
	bool sorted_ready;
	held_doc *held;
	size_t n_held, held_pos;
	bool done;
	bson_t cur_doc;
	/* orphan filter (sdb_query_spec.owns) */
	bool (*owns)(void *arg, const bson_t *doc);
	void *owns_arg;
	void (*owns_free)(void *arg);
	int64_t orphans; /* matching documents skipped as not owned */
};

/* ------------------------------------------------------------------ plan helpers */

static void key_invert(const sdb_key *in, sdb_key *out)
{
	sdb_key_reset(out);
	for (size_t i = 0; i < in->len; i++) {
		uint8_t b = in->data[i] ^ 0xFF;
		sdb_key_append(out, &b, 1);
	}
}

/* Append one ascending-key-space range [lo, hi) of first-component prefixes to q. */
static void add_range(sdb_query *q, const sdb_key *lo, bool lo_incl, const sdb_key *hi,
		      bool hi_incl)
{
	size_t i = q->n_ranges++;
	q->ranges = sdb_realloc(q->ranges, q->n_ranges * sizeof *q->ranges);
	q->range_keys = sdb_realloc(q->range_keys, q->n_ranges * 2 * sizeof *q->range_keys);
	sdb_key *klo = &q->range_keys[i * 2], *khi = &q->range_keys[i * 2 + 1];
	sdb_key_init(klo);
	sdb_key_init(khi);
	sdb_store_range *r = &q->ranges[i];
	memset(r, 0, sizeof *r);
	r->lo_incl = true;
	r->hi_incl = false;
	if (lo && lo->len) {
		if (lo_incl) {
			sdb_key_append(klo, lo->data, lo->len);
			r->lo = (const uint8_t *)1; /* fixed up below */
		} else if (sdb_key_prefix_successor(lo->data, lo->len, klo)) {
			r->lo = (const uint8_t *)1;
		} else {
			/* nothing sorts after an all-0xFF prefix: an empty range */
			sdb_key_append(klo, "\xff\xff\xff\xff", 4);
			r->lo = (const uint8_t *)1;
		}
	}
	if (hi && hi->len) {
		if (hi_incl) {
			if (sdb_key_prefix_successor(hi->data, hi->len, khi))
				r->hi = (const uint8_t *)1;
		} else {
			sdb_key_append(khi, hi->data, hi->len);
			r->hi = (const uint8_t *)1;
		}
	}
}

/* Pointers into range_keys are fixed once every range is added (realloc moves them). */
static void ranges_fix(sdb_query *q)
{
	for (size_t i = 0; i < q->n_ranges; i++) {
		sdb_store_range *r = &q->ranges[i];
		if (r->lo) {
			r->lo = q->range_keys[i * 2].data ? q->range_keys[i * 2].data
							  : (const uint8_t *)"";
			r->lo_len = q->range_keys[i * 2].len;
		}
		if (r->hi) {
			r->hi = q->range_keys[i * 2 + 1].data ? q->range_keys[i * 2 + 1].data
							      : (const uint8_t *)"";
			r->hi_len = q->range_keys[i * 2 + 1].len;
		}
	}
}

static void bounds_to_ranges(sdb_query *q, const sdb_bounds *b, bool desc)
{
	if (!desc) {
		for (size_t i = 0; i < b->n; i++)
			add_range(q, &b->iv[i].lo, b->iv[i].lo_incl, &b->iv[i].hi,
				  b->iv[i].hi_incl);
	} else {
		sdb_key a, z;
		sdb_key_init(&a);
		sdb_key_init(&z);
		for (size_t i = b->n; i-- > 0;) {
			key_invert(&b->iv[i].hi, &a);
			key_invert(&b->iv[i].lo, &z);
			add_range(q, b->iv[i].hi.len ? &a : NULL, b->iv[i].hi_incl,
				  b->iv[i].lo.len ? &z : NULL, b->iv[i].lo_incl);
		}
		sdb_key_free(&a);
		sdb_key_free(&z);
	}
	ranges_fix(q);
}

static int hashed_iv_cmp(const void *a, const void *b)
{
	return sdb_key_cmp(&((const sdb_interval *)a)->lo, &((const sdb_interval *)b)->lo);
}

/* The bounds of a hashed index from the bounds b of its field's values: each point v
 * becomes the point enc(NumberLong(hash(v))) (sorted, deduplicated); EMPTY stays EMPTY.
 * False (out untouched) for ALL and RANGE: a range of values is no range of hashes, and
 * for a point that is a document or array holding a number (its frozen hash cannot be
 * rebuilt from its exact bytes, storage/keyenc.h sdb_keyenc_hash_encoded). A
 * document matching an equality or $in has a value whose encoding is one of the points
 * (arrays, which the hashed index refuses, aside), so its key is among the hashed points;
 * the matcher still checks every document fetched (hash collisions). */
static bool hashed_bounds(const sdb_bounds *b, sdb_bounds *out)
{
	if (b->kind == SDB_BOUNDS_EMPTY) {
		memset(out, 0, sizeof *out);
		out->kind = SDB_BOUNDS_EMPTY;
		return true;
	}
	if (b->kind != SDB_BOUNDS_POINTS)
		return false;
	for (size_t i = 0; i < b->n; i++) {
		int64_t h;

		if (!sdb_keyenc_hash_encoded(b->iv[i].lo.data, b->iv[i].lo.len, &h))
			return false; /* a nested number: hash not computable from its bytes */
	}
	memset(out, 0, sizeof *out);
	out->kind = SDB_BOUNDS_POINTS;
	out->iv = sdb_calloc(b->n, sizeof *out->iv);
	for (size_t i = 0; i < b->n; i++) {
		bson_value_t h = {.value_type = BSON_TYPE_INT64};
		sdb_keyenc_hash_encoded(b->iv[i].lo.data, b->iv[i].lo.len, &h.value.v_int64);
		sdb_interval *iv = &out->iv[out->n++];
		sdb_key_init(&iv->lo);
		sdb_key_init(&iv->hi);
		char e[64];
		sdb_keyenc_append_value(&iv->lo, &h, false, e, sizeof e); /* a NumberLong: no error */
		sdb_key_append(&iv->hi, iv->lo.data, iv->lo.len);
		iv->lo_incl = iv->hi_incl = true;
	}
	sdb_qsort(out->iv, out->n, sizeof *out->iv, hashed_iv_cmp);
	size_t j = 0;
	for (size_t i = 0; i < out->n; i++) {
		if (j && sdb_key_cmp(&out->iv[j - 1].lo, &out->iv[i].lo) == 0) {
			sdb_key_free(&out->iv[i].lo);
			sdb_key_free(&out->iv[i].hi);
			continue;
		}
		out->iv[j++] = out->iv[i];
	}
	out->n = j;
	return true;
}

/* The bounds of index ix from b, the bounds of its first field's values (b is taken): b
 * itself for an index of values; for a hashed index its points hashed (hashed_bounds), or
 * false (b freed) when b does not bound the hashes. */
static bool index_bounds(const sdb_store_index *ix, sdb_bounds *b)
{
	sdb_bounds hb;
	bool ok;

	if (!ix->hashed)
		return true;
	ok = hashed_bounds(b, &hb);
	sdb_bounds_free(b);
	if (ok)
		*b = hb;
	return ok;
}

static int bounds_score(const sdb_bounds *b)
{
	switch (b->kind) {
	case SDB_BOUNDS_POINTS:
		return 3;
	case SDB_BOUNDS_RANGE:
		return 2;
	case SDB_BOUNDS_EMPTY:
		return 4;
	default:
		return 0;
	}
}

/* Does scanning pattern (forward or backward) yield the sort order? *reverse set. */
/* Are two collations the same (NULL: simple)? */
static bool same_coll(const sdb_collator *a, const sdb_collator *b)
{
	return a == b || (a && b && bson_equal(sdb_collator_spec(a), sdb_collator_spec(b)));
}

/* May q use ix? A partial index (issue #20) holds only the documents its filter matches:
 * it serves a query only when the query's filter implies it, compared under one collation
 * (MongoDB: the query's and the index's collations must match, and expression::isSubsetOf). */
static bool partial_ok(const sdb_query *q, const sdb_store_index *ix)
{
	if (!ix->partial)
		return true;
	return same_coll(ix->coll, sdb_collation_current()) && store_partial_implied(&q->filter, ix);
}

static bool pattern_provides_sort(const bson_t *pattern, const sdb_sortspec *s, bool *reverse,
				  const sdb_collator *ic)
{
	/* an index orders strings by its collation (ic; NULL: binary): it gives the sort only
	 * to a query of the same collation (else a blocking sort orders by the query's) */
	if (!same_coll(ic, sdb_collation_current()) && s && sdb_sortspec_nfields(s))
		return false;
	size_t n = s ? sdb_sortspec_nfields(s) : 0;
	if (n == 0)
		return false;
	bson_iter_t it;
	if (!bson_iter_init(&it, pattern))
		return false;
	int rel = 0; /* 1 same direction, -1 opposite */
	for (size_t i = 0; i < n; i++) {
		if (!bson_iter_next(&it))
			return false;
		if (strcmp(bson_iter_key(&it), sdb_sortspec_path(s, i)) != 0 ||
		    !BSON_ITER_HOLDS_NUMBER(&it))
			return false; /* another field, or "hashed" (hash order, not value order) */
		int pdir = bson_iter_as_double(&it) < 0 ? -1 : 1;
		int r = pdir == sdb_sortspec_dir(s, i) ? 1 : -1;
		if (rel && r != rel)
			return false;
		rel = r;
	}
	*reverse = rel < 0;
	return true;
}

static const char *first_field(const bson_t *pattern, bool *desc)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, pattern) || !bson_iter_next(&it))
		return NULL;
	*desc = bson_iter_as_double(&it) < 0;
	return bson_iter_key(&it);
}

static void set_pattern(sdb_query *q, const bson_t *pattern)
{
	bson_destroy(&q->key_pattern);
	bson_copy_to(pattern, &q->key_pattern);
}

/* Does the document hold a string or symbol value anywhere (keys aside), or with regex a
 * regular expression ($regex or a BSON regex)? */
static bool has_strings(const uint8_t *data, size_t len, int depth, bool regex)
{
	bson_iter_t it;

	if (depth > SDB_BSON_MAX_DEPTH || !bson_iter_init_from_data(&it, data, len))
		return true;
	while (bson_iter_next(&it)) {
		if (regex ? (BSON_ITER_HOLDS_REGEX(&it) || strcmp(bson_iter_key(&it), "$regex") == 0)
			  : (BSON_ITER_HOLDS_UTF8(&it) || BSON_ITER_HOLDS_SYMBOL(&it)))
			return true;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			const uint8_t *d;
			uint32_t n;

			if (BSON_ITER_HOLDS_DOCUMENT(&it))
				bson_iter_document(&it, &n, &d);
			else
				bson_iter_array(&it, &n, &d);
			if (has_strings(d, n, depth + 1, regex))
				return true;
		}
	}
	return false;
}

/* May the plan use bounds on an index of collation ic (NULL: binary keys)? A string has
 * bounds only in an index of the query's collation (the thread's, storage/collation.h;
 * MongoDB: an index whose collation differs from the query's is not used for string
 * bounds), so a filter comparing any string gets no bounds from another index (a collection
 * scan, or the hinted index scanned whole); and a regex prefix's bounds are binary, so a
 * collated index gets none for a filter with a regex. Other filters keep their bounds. */
static bool bounds_allowed(const sdb_query *q, const sdb_collator *ic)
{
	const uint8_t *f = bson_get_data(&q->filter);

	if (ic != NULL && has_strings(f, q->filter.len, 0, true))
		return false;
	return same_coll(ic, sdb_collation_current()) || !has_strings(f, q->filter.len, 0, false);
}

/* sdb_matcher_bounds of path for an index of collation ic, encoded as its keys. Returns:
 * its result, or -1 when bounds_allowed refuses. */
static int coll_bounds(const sdb_query *q, const sdb_collator *ic, const char *path,
		       bool multikey, sdb_bounds *b)
{
	const sdb_collator *prev;
	int rc;

	if (!bounds_allowed(q, ic))
		return -1;
	prev = sdb_keyenc_collation_swap(ic);
	rc = sdb_matcher_bounds(&q->filter, path, multikey, b, NULL, 0);
	sdb_keyenc_collation_swap(prev);
	return rc;
}

static int plan_hint(sdb_query *q, const sdb_store_coll *co, const bson_iter_t *hint,
		     int *code, char *err, size_t errlen)
{
	const sdb_store_index *ix = NULL;
	bool is_id = false, natural = false;
	int natural_dir = 1;
	if (BSON_ITER_HOLDS_UTF8(hint)) {
		const char *name = bson_iter_utf8(hint, NULL);
		if (strcmp(name, "_id_") == 0)
			is_id = true;
		for (size_t i = 0; co && i < co->n_indexes; i++)
			if (strcmp(co->indexes[i].name, name) == 0 && !co->indexes[i].hidden)
				ix = &co->indexes[i];
	} else if (BSON_ITER_HOLDS_DOCUMENT(hint)) {
		bson_t h;
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(hint, &len, &data);
		if (!bson_init_static(&h, data, len))
			goto bad;
		bson_iter_t it;
		if (bson_iter_init_find(&it, &h, "$natural")) {
			natural = true;
			natural_dir = bson_iter_as_double(&it) < 0 ? -1 : 1;
		} else if (bson_count_keys(&h) == 1 && bson_iter_init_find(&it, &h, "_id")) {
			is_id = true;
		} else {
			const sdb_store_index *second = NULL;
			for (size_t i = 0; co && i < co->n_indexes; i++)
				if (bson_equal(co->indexes[i].key, &h) && !co->indexes[i].hidden) {
					if (!ix)
						ix = &co->indexes[i];
					else if (!second)
						second = &co->indexes[i];
				}
			if (second) {
				/* partial indexes may share a key pattern (mongod query_planner.cpp) */
				*code = 27; /* IndexNotFound */
				return sdb_errf(err, errlen, SDB_EINVAL,
						"Hint matched multiple indexes, must hint by index "
						"name. Matched: %s and %s",
						ix->name, second->name);
			}
		}
	}
	if (!co)
		return 0; /* no collection: nothing to scan whatever the hint */
	if (natural) {
		q->collscan = true;
		q->reverse = natural_dir < 0;
		return 0;
	}
	if (is_id) {
		sdb_bounds b = {0};
		bson_t pat = BSON_INITIALIZER;
		BSON_APPEND_INT32(&pat, "_id", 1);
		set_pattern(q, &pat);
		bson_destroy(&pat);
		if (bounds_allowed(q, NULL) &&
		    sdb_matcher_bounds(&q->filter, "_id", false, &b, NULL, 0) == 0) {
			if (b.kind == SDB_BOUNDS_EMPTY)
				q->empty = true;
			else if (b.kind != SDB_BOUNDS_ALL)
				bounds_to_ranges(q, &b, false);
		}
		sdb_bounds_free(&b);
		return 0;
	}
	if (ix && !partial_ok(q, ix)) {
		/* mongod cannot plan a hinted partial index the query does not imply */
		*code = 2;
		return sdb_errf(err, errlen, SDB_EINVAL,
				"hint provided does not correspond to an existing index: the "
				"partial index '%s' does not hold every document this query can "
				"match (its filter must imply the index's partialFilterExpression)",
				ix->name);
	}
	if (ix) {
		bool desc = false;
		const char *path = first_field(ix->key, &desc);
		q->index = sdb_strdup(ix->name);
		q->multikey = ix->multikey;
		set_pattern(q, ix->key);
		q->icoll = ix->coll;
		sdb_bounds b = {0};
		bool usable = path && coll_bounds(q, ix->coll, path, ix->multikey, &b) == 0;
		/* a hashed index's keys are hashes: equality / $in points hashed, else it is
		 * scanned whole */
		usable = usable && index_bounds(ix, &b);
		if (usable) {
			if (b.kind == SDB_BOUNDS_EMPTY && !ix->sparse)
				q->empty = true;
			else if (b.kind != SDB_BOUNDS_ALL && b.kind != SDB_BOUNDS_EMPTY)
				bounds_to_ranges(q, &b, desc);
		}
		sdb_bounds_free(&b);
		return 0;
	}
bad:
	*code = 2;
	return sdb_errf(err, errlen, SDB_EINVAL,
			"hint provided does not correspond to an existing index");
}

/* The key range of spec (sdb_query_spec.range_field): plan an index scan of its bounds
 * (on the hashed index of range_field when spec->range_hashed, else on an index of its
 * values). Returns false (nothing planned) when no usable index has range_field first. */
static bool plan_range(sdb_query *q, const sdb_store_coll *co, const sdb_query_spec *spec,
		       char *err, size_t errlen)
{
	const sdb_store_index *ix = NULL;
	bool is_id = !spec->range_hashed && strcmp(spec->range_field, "_id") == 0;
	bool desc = false, rev = false;
	for (size_t i = 0; !is_id && i < co->n_indexes; i++) {
		const sdb_store_index *c = &co->indexes[i];
		bool d = false;
		const char *f = first_field(c->key, &d);
		if (c->sparse || c->partial || c->multikey || c->coll ||
		    c->hashed != spec->range_hashed || !f ||
		    strcmp(f, spec->range_field) != 0)
			continue;
		if (!ix || (!pattern_provides_sort(ix->key, q->sort, &rev, NULL) &&
			    pattern_provides_sort(c->key, q->sort, &rev, NULL))) {
			ix = c;
			desc = d;
		}
	}
	if (!is_id && !ix)
		return false;
	sdb_key lo, hi, a, z;
	sdb_key_init(&lo);
	sdb_key_init(&hi);
	sdb_key_init(&a);
	sdb_key_init(&z);
	bool ok = (!spec->range_lo ||
		   sdb_keyenc_append_value(&lo, spec->range_lo, false, err, errlen) == 0) &&
		  (!spec->range_hi ||
		   sdb_keyenc_append_value(&hi, spec->range_hi, false, err, errlen) == 0);
	if (ok) {
		if (is_id) {
			bson_t pat = BSON_INITIALIZER;
			BSON_APPEND_INT32(&pat, "_id", 1);
			set_pattern(q, &pat);
			bson_destroy(&pat);
		} else {
			q->index = sdb_strdup(ix->name);
			set_pattern(q, ix->key);
		}
		if (!desc) {
			add_range(q, spec->range_lo ? &lo : NULL, true, spec->range_hi ? &hi : NULL,
				  spec->range_hi_incl);
		} else {
			key_invert(&hi, &a);
			key_invert(&lo, &z);
			add_range(q, spec->range_hi ? &a : NULL, spec->range_hi_incl,
				  spec->range_lo ? &z : NULL, true);
		}
		ranges_fix(q);
	}
	sdb_key_free(&lo);
	sdb_key_free(&hi);
	sdb_key_free(&a);
	sdb_key_free(&z);
	return ok;
}

static int plan(sdb_query *q, const sdb_store_coll *co, const bson_iter_t *hint, int *code,
		char *err, size_t errlen)
{
	bson_t idpat = BSON_INITIALIZER;
	BSON_APPEND_INT32(&idpat, "_id", 1);
	set_pattern(q, &idpat);
	if (hint) {
		bson_destroy(&idpat);
		int rc = plan_hint(q, co, hint, code, err, errlen);
		if (rc == 0 && q->sort && !q->collscan) {
			bool rev = false;
			q->blocking_sort = q->multikey ||
					   !pattern_provides_sort(&q->key_pattern, q->sort, &rev,
								  q->icoll);
			if (!q->blocking_sort)
				q->reverse = rev;
		} else if (q->sort && sdb_sortspec_nfields(q->sort)) {
			q->blocking_sort = true;
		}
		return rc;
	}
	if (!co) {
		bson_destroy(&idpat);
		return 0;
	}
	int best_score = 0;
	bool best_sort = false;
	const sdb_store_index *best = NULL; /* NULL with best_score > 0: _id */
	sdb_bounds best_b = {0};
	bool best_desc = false;

	sdb_bounds b = {0};
	if (bounds_allowed(q, NULL) &&
	    sdb_matcher_bounds(&q->filter, "_id", false, &b, NULL, 0) == 0) {
		bool rev;
		best_score = bounds_score(&b);
		best_sort = pattern_provides_sort(&idpat, q->sort, &rev, NULL);
		best_b = b;
		memset(&b, 0, sizeof b);
	}
	for (size_t i = 0; i < co->n_indexes && best_score < 4; i++) {
		const sdb_store_index *ix = &co->indexes[i];
		if (ix->sparse || ix->hidden || !partial_ok(q, ix))
			continue; /* a sparse index misses documents: only by hint; a hidden one
				   * is never planned; a partial one only for a query within it */
		bool desc = false;
		const char *path = first_field(ix->key, &desc);
		if (!path || coll_bounds(q, ix->coll, path, ix->multikey, &b) != 0)
			continue;
		/* hashed: equality / $in on f are the points' hashes; a range of f's values does
		 * not bound its hashes (the index is skipped) */
		if (!index_bounds(ix, &b))
			continue;
		int score = bounds_score(&b);
		bool rev;
		bool gives_sort =
			!ix->multikey && pattern_provides_sort(ix->key, q->sort, &rev, ix->coll);
		if (score > best_score || (score == best_score && score > 0 && gives_sort &&
					   !best_sort)) {
			sdb_bounds_free(&best_b);
			best_b = b;
			memset(&b, 0, sizeof b);
			best = ix;
			best_score = score;
			best_sort = gives_sort;
			best_desc = desc;
		} else {
			sdb_bounds_free(&b);
		}
	}
	if (best_score == 4) {
		q->empty = true;
	} else if (best_score > 0) {
		if (!best && best_b.kind == SDB_BOUNDS_POINTS)
			q->id_points = best_b.n;
		if (best) {
			q->index = sdb_strdup(best->name);
			q->multikey = best->multikey;
			q->icoll = best->coll;
			set_pattern(q, best->key);
		}
		bounds_to_ranges(q, &best_b, best_desc);
	} else {
		/* no usable bounds: an index that gives the sort, else a collection scan */
		bool rev = false;
		if (pattern_provides_sort(&idpat, q->sort, &rev, NULL)) {
			/* _id order is the collection's own order */
		} else {
			const sdb_store_index *si = NULL;
			for (size_t i = 0; i < co->n_indexes && !si; i++)
				if (!co->indexes[i].sparse && !co->indexes[i].multikey &&
				    !co->indexes[i].hidden && partial_ok(q, &co->indexes[i]) &&
				    pattern_provides_sort(co->indexes[i].key, q->sort, &rev,
							  co->indexes[i].coll))
					si = &co->indexes[i];
			if (si) {
				q->index = sdb_strdup(si->name);
				q->icoll = si->coll;
				set_pattern(q, si->key);
			} else {
				q->collscan = true;
			}
		}
	}
	sdb_bounds_free(&best_b);
	bson_destroy(&idpat);
	if (q->sort && sdb_sortspec_nfields(q->sort)) {
		bool rev = false;
		if (!q->collscan && !q->multikey &&
		    pattern_provides_sort(&q->key_pattern, q->sort, &rev, q->icoll)) {
			q->reverse = rev;
		} else {
			q->blocking_sort = true;
		}
	}
	if (q->sort && sdb_sortspec_natural(q->sort) < 0)
		q->reverse = true;
	return 0;
}

/* ------------------------------------------------------------------ open/next */

int sdb_query_open(sdb_store_conn *c, const char *db, const char *coll,
		   const sdb_query_spec *spec, sdb_query **out, int *code, char *err,
		   size_t errlen)
{
	*out = NULL;
	*code = 0;
	sdb_query *q = sdb_calloc_bson(1, sizeof *q);
	q->start_ns = sdb_mono_ns();
	q->owns = spec->owns;
	q->owns_arg = spec->owns_arg;
	q->owns_free = spec->owns_free;
	q->db = sdb_strdup(db);
	q->coll = sdb_strdup(coll);
	bson_init(&q->key_pattern);
	if (spec->filter)
		bson_copy_to(spec->filter, &q->filter);
	else
		bson_init(&q->filter);
	if (spec->sort)
		bson_copy_to(spec->sort, &q->sort_doc);
	else
		bson_init(&q->sort_doc);
	q->skip = spec->skip > 0 ? spec->skip : 0;
	q->limit = spec->limit > 0 ? spec->limit : 0;
	q->max_sort_bytes = spec->max_sort_bytes ? spec->max_sort_bytes : QUERY_MAX_SORT_BYTES;
	int rc = sdb_matcher_new_vars(&q->filter, SDB_MATCHER_EXPR, spec->let, &q->matcher, code,
				      err, errlen);
	if (rc) {
		if (!*code)
			*code = 2;
		goto fail;
	}
	if (spec->sort) {
		rc = sdb_sortspec_parse(spec->sort, &q->sort, code, err, errlen);
		if (rc) {
			if (!*code)
				*code = 2;
			goto fail;
		}
	}
	const sdb_store_coll *co = NULL;
	sdb_store_coll_get(c, db, coll, &co, NULL, 0);
	if (co && !spec->hint && spec->range_field && plan_range(q, co, spec, err, errlen)) {
		if (q->sort && sdb_sortspec_nfields(q->sort)) {
			bool rev = false;
			if (pattern_provides_sort(&q->key_pattern, q->sort, &rev, NULL))
				q->reverse = rev;
			else
				q->blocking_sort = true;
		}
		rc = 0;
	} else {
		rc = plan(q, co, spec->hint, code, err, errlen);
	}
	if (rc)
		goto fail;
	if (co && !q->empty) {
		rc = sdb_store_scan(c, db, coll, q->index, q->ranges, q->n_ranges, q->reverse,
				    &q->cur, err, errlen);
		if (rc == SDB_ENOTFOUND) {
			rc = 0;
		} else if (rc) {
			*code = 1;
			goto fail;
		}
	}
	*out = q;
	return 0;
fail:
	sdb_query_free(q);
	return rc;
}

/* Next matching document from the plan (before sort/skip/limit). */
static int scan_next(sdb_query *q, bson_t *doc, int *code, char *err, size_t errlen)
{
	if (!q->cur)
		return 0;
	for (;;) {
		int r = sdb_store_cursor_next(q->cur, doc, err, errlen);
		if (r <= 0) {
			if (r < 0)
				*code = 1;
			return r;
		}
		r = sdb_matcher_eval(q->matcher, doc, code, err, errlen);
		if (r < 0)
			return r; /* a $expr failed: the query fails, as on mongod */
		if (r == 1) {
			if (q->owns && !q->owns(q->owns_arg, doc)) {
				q->orphans++;
				continue;
			}
			return 1;
		}
	}
}

static int held_cmp(const void *a, const void *b, void *arg)
{
	const held_doc *x = a, *y = b;
	int c = sdb_sortspec_cmp(arg, x->doc, y->doc);
	if (c)
		return c;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static __thread sdb_sortspec *tls_sort;

static int held_cmp_tls(const void *a, const void *b)
{
	return held_cmp(a, b, tls_sort);
}

static int load_sorted(sdb_query *q, int *code, char *err, size_t errlen)
{
	size_t cap = 0, bytes = 0;
	bson_t d;
	int r;
	while ((r = scan_next(q, &d, code, err, errlen)) == 1) {
		bytes += d.len + sizeof(held_doc);
		if (bytes > q->max_sort_bytes) {
			*code = 292;
			return sdb_errf(err, errlen, SDB_ETOOBIG,
					"Executor error during find command :: caused by :: Sort "
					"exceeded memory limit of %zu bytes, but did not opt in to "
					"external sorting.",
					q->max_sort_bytes);
		}
		if (q->n_held == cap) {
			cap = cap ? cap * 2 : 64;
			q->held = sdb_realloc(q->held, cap * sizeof *q->held);
		}
		q->held[q->n_held].doc = sdb_doc_copy(&d);
		q->held[q->n_held].seq = q->n_held;
		q->n_held++;
	}
	if (r < 0)
		return r;
	if (q->n_held > 1) {
		tls_sort = q->sort;
		sdb_qsort(q->held, q->n_held, sizeof *q->held, held_cmp_tls);
		tls_sort = NULL;
	}
	q->sorted_ready = true;
	return 0;
}

int sdb_query_next(sdb_query *q, const bson_t **doc, int *code, char *err, size_t errlen)
{
	*code = 0;
	if (q->done || q->empty)
		goto end;
	for (;;) {
		if (q->limit && q->returned >= q->limit)
			goto end;
		if (q->blocking_sort) {
			if (!q->sorted_ready) {
				int rc = load_sorted(q, code, err, errlen);
				if (rc)
					return rc;
			}
			if (q->held_pos >= q->n_held)
				goto end;
			const bson_t *d = q->held[q->held_pos++].doc;
			if (q->skipped < q->skip) {
				q->skipped++;
				continue;
			}
			q->returned++;
			*doc = d;
			return 1;
		}
		int r = scan_next(q, &q->cur_doc, code, err, errlen);
		if (r < 0)
			return r;
		if (r == 0)
			goto end;
		if (q->skipped < q->skip) {
			q->skipped++;
			continue;
		}
		q->returned++;
		*doc = &q->cur_doc;
		return 1;
	}
end:
	if (!q->done) {
		q->done = true;
		q->end_ns = sdb_mono_ns();
	}
	return 0;
}

bool sdb_query_is_point(const sdb_query *q, size_t max_points)
{
	return q->empty || (q->id_points > 0 && q->id_points <= max_points);
}

void sdb_query_stats(const sdb_query *q, int64_t *n_returned, int64_t *keys, int64_t *docs)
{
	int64_t k = 0, d = 0;
	sdb_store_cursor_stats(q->cur, &k, &d);
	if (!q->index && !q->collscan && q->cur)
		k = d; /* _id lookups: one key per document fetched */
	if (n_returned)
		*n_returned = q->returned;
	if (keys)
		*keys = k;
	if (docs)
		*docs = d;
}

void sdb_query_explain(const sdb_query *q, bool stats, bson_t *out)
{
	bson_t qp, wp, es;
	char ns[512];
	snprintf(ns, sizeof ns, "%s.%s", q->db, q->coll);
	BSON_APPEND_DOCUMENT_BEGIN(out, "queryPlanner", &qp);
	BSON_APPEND_INT32(&qp, "plannerVersion", 1);
	BSON_APPEND_UTF8(&qp, "namespace", ns);
	BSON_APPEND_DOCUMENT(&qp, "parsedQuery", &q->filter);
	BSON_APPEND_DOCUMENT_BEGIN(&qp, "winningPlan", &wp);
	if (q->empty) {
		BSON_APPEND_UTF8(&wp, "stage", "EOF");
	} else if (q->collscan) {
		BSON_APPEND_UTF8(&wp, "stage", "COLLSCAN");
		BSON_APPEND_DOCUMENT(&wp, "filter", &q->filter);
		BSON_APPEND_UTF8(&wp, "direction", q->reverse ? "backward" : "forward");
	} else {
		BSON_APPEND_UTF8(&wp, "stage", "IXSCAN");
		BSON_APPEND_UTF8(&wp, "indexName", q->index ? q->index : "_id_");
		BSON_APPEND_DOCUMENT(&wp, "keyPattern", &q->key_pattern);
		BSON_APPEND_BOOL(&wp, "isMultiKey", q->multikey);
		BSON_APPEND_UTF8(&wp, "direction", q->reverse ? "backward" : "forward");
		BSON_APPEND_INT32(&wp, "intervals", (int32_t)q->n_ranges);
	}
	BSON_APPEND_BOOL(&wp, "sortStage", q->blocking_sort);
	if (q->skip)
		BSON_APPEND_INT64(&wp, "skip", q->skip);
	if (q->limit)
		BSON_APPEND_INT64(&wp, "limit", q->limit);
	bson_append_document_end(&qp, &wp);
	bson_t rej;
	BSON_APPEND_ARRAY_BEGIN(&qp, "rejectedPlans", &rej);
	bson_append_array_end(&qp, &rej);
	bson_append_document_end(out, &qp);
	if (!stats)
		return;
	int64_t n, k, d;
	sdb_query_stats(q, &n, &k, &d);
	uint64_t end = q->end_ns ? q->end_ns : sdb_mono_ns();
	BSON_APPEND_DOCUMENT_BEGIN(out, "executionStats", &es);
	BSON_APPEND_BOOL(&es, "executionSuccess", true);
	BSON_APPEND_INT32(&es, "nReturned", n > INT32_MAX ? INT32_MAX : (int32_t)n);
	BSON_APPEND_INT32(&es, "executionTimeMillis", (int32_t)((end - q->start_ns) / 1000000));
	BSON_APPEND_INT32(&es, "totalKeysExamined", k > INT32_MAX ? INT32_MAX : (int32_t)k);
	BSON_APPEND_INT32(&es, "totalDocsExamined", d > INT32_MAX ? INT32_MAX : (int32_t)d);
	if (q->owns) /* MongoDB's SHARDING_FILTER stage counts these as chunkSkips */
		BSON_APPEND_INT64(&es, "chunkSkips", q->orphans);
	bson_append_document_end(out, &es);
}

void sdb_query_totals(uint64_t *keys, uint64_t *docs, uint64_t *returned)
{
	*returned = atomic_load_explicit(&total_returned, memory_order_relaxed);
	*keys = atomic_load_explicit(&total_keys, memory_order_relaxed);
	*docs = atomic_load_explicit(&total_docs, memory_order_relaxed);
}

void sdb_query_free(sdb_query *q)
{
	if (!q)
		return;
	int64_t k = 0, d = 0, n = 0;
	sdb_query_stats(q, &n, &k, &d);
	atomic_fetch_add_explicit(&total_returned, (uint64_t)n, memory_order_relaxed);
	atomic_fetch_add_explicit(&total_keys, (uint64_t)k, memory_order_relaxed);
	atomic_fetch_add_explicit(&total_docs, (uint64_t)d, memory_order_relaxed);
	sdb_store_cursor_close(q->cur);
	if (q->owns_free)
		q->owns_free(q->owns_arg);
	sdb_matcher_free(q->matcher);
	sdb_sortspec_free(q->sort);
	bson_destroy(&q->filter);
	bson_destroy(&q->sort_doc);
	bson_destroy(&q->key_pattern);
	for (size_t i = 0; i < q->n_ranges * 2; i++)
		sdb_key_free(&q->range_keys[i]);
	free(q->range_keys);
	free(q->ranges);
	for (size_t i = 0; i < q->n_held; i++)
		sdb_doc_free(q->held[i].doc);
	free(q->held);
	free(q->index);
	free(q->db);
	free(q->coll);
	free(q);
}
