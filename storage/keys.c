/* Index keys of documents: key extraction by key pattern (multikey arrays, missing fields),
 * duplicate-key values for E11000 messages, and the _id set a scan uses to skip duplicates
 * (see store_int.h). */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/keyenc.h"
#include "storage/path.h"
#include "storage/store_int.h"


/* ------------------------------------------------------------------ keys */


void store_keyset_init(store_keyset *ks)
{
	ks->keys = NULL;
	ks->n = 0;
}

void store_keyset_destroy(store_keyset *ks)
{
	if (ks->keys)
		sdb_index_keys_free(ks->keys, ks->n);
	ks->keys = NULL;
	ks->n = 0;
}

#define STORE_MAX_INDEX_FIELDS 32

/* Split a key pattern into paths and directions. Returns the number of fields. */
static size_t pattern_fields(const bson_t *pattern, const char **paths, bool *desc)
{
	bson_iter_t it;
	size_t n = 0;
	if (!bson_iter_init(&it, pattern))
		return 0;
	while (bson_iter_next(&it) && n < STORE_MAX_INDEX_FIELDS) {
		paths[n] = bson_iter_key(&it);
		desc[n] = BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_double(&it) < 0;
		n++;
	}
	return n;
}

static bool visit_present(void *ctx, const bson_iter_t *it, unsigned flags)
{
	(void)it;
	if (!(flags & SDB_PATH_MISSING)) {
		*(bool *)ctx = true;
		return true;
	}
	return false;
}

const char *store_key_hashed_field(const bson_t *pattern)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, pattern) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it) ||
	    strcmp(bson_iter_utf8(&it, NULL), "hashed") != 0)
		return NULL;
	const char *f = bson_iter_key(&it);
	return bson_iter_next(&it) ? NULL : f;
}

/* The value at a dotted path through documents only (MongoDB's
 * extractElementAtPathOrArrayAlongPath): 1 found (*out set), 0 missing (a missing field
 * or a scalar on the way), -1 an array at or along the path (*out at the array). */
static int hashed_path_find(const bson_t *doc, const char *path, bson_iter_t *out)
{
	bson_iter_t it, sub;
	const char *p = path;
	if (!bson_iter_init(&it, doc))
		return 0;
	for (;;) {
		const char *dot = strchr(p, '.');
		size_t n = dot ? (size_t)(dot - p) : strlen(p);
		if (!bson_iter_find_w_len(&it, p, (int)n))
			return 0;
		*out = it;
		if (BSON_ITER_HOLDS_ARRAY(&it))
			return -1;
		if (dot == NULL)
			return 1;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub))
			return 0;
		it = sub;
		p = dot + 1;
	}
}

/* The one key of doc for the hashed index on path: enc(NumberLong(hash of the value)). */
static int hashed_keys(const char *path, const bson_t *doc, store_keyset *ks,
		       bool *all_missing, int *code_out, char *err, size_t errlen)
{
	bson_iter_t it;
	int r = hashed_path_find(doc, path, &it);
	if (r < 0) {
		if (code_out)
			*code_out = 16766;
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Error: hashed indexes do not currently support array values. "
				"Found array at path: %s",
				path);
	}
	bson_value_t h = {.value_type = BSON_TYPE_INT64};
	h.value.v_int64 = sdb_keyenc_hash_value(r ? bson_iter_value(&it) : NULL);
	ks->keys = sdb_calloc(1, sizeof *ks->keys);
	ks->n = 1;
	sdb_key_init(&ks->keys[0]);
	int rc = sdb_keyenc_append_value(&ks->keys[0], &h, false, err, errlen);
	if (rc) {
		store_keyset_destroy(ks);
		return rc;
	}
	*all_missing = r == 0;
	return 0;
}

int store_key_index_keys(const bson_t *pattern, const sdb_collator *coll, const bson_t *doc,
			 store_keyset *ks, bool *all_missing, bool *multikey_out, int *code_out,
			 char *err, size_t errlen)
{
	const char *hashed = store_key_hashed_field(pattern);
	if (multikey_out)
		*multikey_out = false;
	if (hashed)
		return hashed_keys(hashed, doc, ks, all_missing, code_out, err, errlen);
	const char *paths[STORE_MAX_INDEX_FIELDS];
	bool desc[STORE_MAX_INDEX_FIELDS];
	size_t nf = pattern_fields(pattern, paths, desc);
	bool multikey = false;
	int code = 0;
	const sdb_collator *prev = sdb_keyenc_collation_swap(coll);
	int rc = sdb_index_keys(doc, paths, desc, nf, &ks->keys, &ks->n, &multikey, &code, err,
				errlen);
	sdb_keyenc_collation_swap(prev);
	if (rc) {
		if (code_out)
			*code_out = code;
		return rc;
	}
	bool any = false;
	for (size_t i = 0; i < nf && !any; i++)
		sdb_path_walk(doc, paths[i], 0, visit_present, &any);
	*all_missing = !any;
	if (multikey_out)
		*multikey_out = multikey;
	return 0;
}

/* Key patterns: field -> 1 / -1 (any non-zero number), or one field -> "hashed" alone;
 * "text", "2d", compound hashed are refused. */
int store_key_check_pattern(const bson_t *pattern, char *err, size_t errlen)
{
	bson_iter_t it;
	size_t n = 0;
	if (!bson_iter_init(&it, pattern))
		return sdb_errf(err, errlen, SDB_EINVAL, "bad key pattern");
	size_t nkeys = bson_count_keys(pattern);
	while (bson_iter_next(&it)) {
		char perr[128];
		const char *f = bson_iter_key(&it);
		/* MongoDB's wildcard indexes ("$**", "a.$**"): not built */
		size_t flen = strlen(f);
		if (strcmp(f, "$**") == 0 || (flen > 4 && strcmp(f + flen - 4, ".$**") == 0))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"wildcard indexes ('%s') are not supported by stripedb", f);
		if (!sdb_path_valid(f, perr, sizeof perr))
			return sdb_errf(err, errlen, SDB_EINVAL, "Error in specification: %s", perr);
		if (BSON_ITER_HOLDS_UTF8(&it) &&
		    strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0) {
			if (nkeys != 1)
				return sdb_errf(err, errlen, SDB_EINVAL,
						"Compound hashed indexes are not supported by the "
						"embedded shard: a hashed index has one field "
						"({%s: \"hashed\"} alone)",
						bson_iter_key(&it));
			n++;
			continue;
		}
		if (BSON_ITER_HOLDS_UTF8(&it))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"Unknown index plugin '%s' (the embedded shard supports "
					"ascending, descending and single-field hashed indexes "
					"only)",
					bson_iter_utf8(&it, NULL));
		if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_double(&it) == 0)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"Values in the index key pattern can only be numbers or "
					"strings: bad value for field %s",
					bson_iter_key(&it));
		n++;
	}
	if (n > STORE_MAX_INDEX_FIELDS)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Index key pattern has more than %d fields", STORE_MAX_INDEX_FIELDS);
	return 0;
}

typedef struct first_value {
	bson_value_t v;
	bool found;
} first_value;

static bool visit_first(void *ctx, const bson_iter_t *it, unsigned flags)
{
	first_value *fv = ctx;
	if (flags & SDB_PATH_MISSING)
		return false;
	fv->v = *bson_iter_value((bson_iter_t *)it);
	fv->found = true;
	return true;
}

/* keyValue of a duplicate-key error: {field: value-at-path (first reached, or null)}. */
void store_key_dup_value(const bson_t *pattern, const bson_t *doc, bson_t *out)
{
	bson_init(out);
	bson_iter_t it;
	if (!bson_iter_init(&it, pattern))
		return;
	while (bson_iter_next(&it)) {
		first_value fv = {0};
		sdb_path_walk(doc, bson_iter_key(&it), 0, visit_first, &fv);
		if (fv.found)
			bson_append_value(out, bson_iter_key(&it), -1, &fv.v);
		else
			bson_append_null(out, bson_iter_key(&it), -1);
	}
}

/* The clashing key of a multikey unique index names the element that clashed, as
 * mongod's keyValue does ({tags: "x"}, not the whole array): for each field in turn,
 * find a value the path reaches (leaf arrays expanded) whose encoding is the next
 * component of the encoded key. */
typedef struct dup_probe {
	const uint8_t *key;
	size_t len, off;
	bool desc, found;
	bson_value_t v;
	size_t vlen;
} dup_probe;

static bool dup_probe_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	dup_probe *p = ctx;
	sdb_key k = {0};
	char e[128];
	bool missing = (flags & SDB_PATH_MISSING) || it == NULL;
	if (sdb_keyenc_append_iter(&k, missing ? NULL : it, p->desc, e, sizeof e) == 0 &&
	    p->off + k.len <= p->len && memcmp(p->key + p->off, k.data, k.len) == 0) {
		if (missing)
			p->v.value_type = BSON_TYPE_NULL; /* a missing field is indexed as null */
		else
			p->v = *bson_iter_value((bson_iter_t *)it);
		p->vlen = k.len;
		p->found = true;
	}
	sdb_key_free(&k);
	return p->found;
}

/* keyValue for the encoded key (key, len) of doc under pattern; false when some field's
 * component was not recognised (then the caller reports the first values reached). */
bool store_key_dup_value_of(const bson_t *pattern, const bson_t *doc, const uint8_t *key,
			    size_t len, bson_t *out)
{
	bson_iter_t it;
	size_t off = 0;
	bson_init(out);
	if (!bson_iter_init(&it, pattern))
		return false;
	while (bson_iter_next(&it)) {
		dup_probe p = {.key = key, .len = len, .off = off,
			       .desc = bson_iter_as_double(&it) < 0};
		sdb_path_walk(doc, bson_iter_key(&it), SDB_PATH_EXPAND_LEAF, dup_probe_visit, &p);
		if (!p.found)
			return false; /* out stays initialized: the caller destroys it */
		bson_append_value(out, bson_iter_key(&it), -1, &p.v);
		off += p.vlen;
	}
	return off == len;
}

/* A set of byte strings (document keys already returned by a multikey index scan). */

void store_idset_init(store_idset *s)
{
	memset(s, 0, sizeof *s);
}

void store_idset_destroy(store_idset *s)
{
	for (size_t i = 0; i < s->cap; i++)
		sdb_key_free(&s->slots[i]);
	free(s->slots);
	memset(s, 0, sizeof *s);
}

static uint64_t blob_hash(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

/* Add (p, n); false when it was there already. Empty slots have data == NULL. */
bool store_idset_add(store_idset *s, const void *p, size_t n)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 64;
		sdb_key *ns = sdb_calloc(ncap, sizeof *ns);
		for (size_t i = 0; i < s->cap; i++) {
			if (!s->slots[i].data)
				continue;
			size_t j = blob_hash(s->slots[i].data, s->slots[i].len) & (ncap - 1);
			while (ns[j].data)
				j = (j + 1) & (ncap - 1);
			ns[j] = s->slots[i];
		}
		free(s->slots);
		s->slots = ns;
		s->cap = ncap;
	}
	size_t j = blob_hash(p, n) & (s->cap - 1);
	while (s->slots[j].data) {
		if (s->slots[j].len == n && memcmp(s->slots[j].data, p, n) == 0)
			return false;
		j = (j + 1) & (s->cap - 1);
	}
	sdb_key_init(&s->slots[j]);
	sdb_key_append(&s->slots[j], n ? p : "", n ? n : 1);
	if (!n)
		s->slots[j].len = 0;
	s->n++;
	return true;
}
