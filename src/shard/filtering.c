/* Chunk-aware shards (issue #17): the shard's filtering metadata and the shard version gate.
 *
 * For each sharded collection the shard holds what it owns (storage/store.h
 * sdb_store_filtering_*): the shard key pattern (ranged or hashed) and the chunks it owns,
 * each {id, min, max, token}. Two numbers summarise it, after MongoDB's ShardVersion
 * (src/mongo/s/chunk_version.h, CollectionShardingRuntime):
 *   shardVersion      = the largest token over the chunks the shard owns (0: none);
 *   collectionVersion = the largest token of the whole collection the installer saw.
 * A migration gives the moved chunk a token above every token of the collection and bumps
 * one remaining chunk of the donor (MongoDB's "control chunk") to it too, so the shard
 * version of both the donor and the recipient changes at every migration and never at a
 * split or merge (children keep their parent's token; a merge keeps the largest).
 *
 * Commands:
 *   {stripedbSetFiltering: "db.coll", key: {...}, collectionVersion: N,
 *    chunks: [{id: "17", min: {...}, max: {...}, token: T}]}  (or drop: true)
 *       A replicated write (a Raft entry like stripedbSetVersion): installs what the shard
 *       owns, replacing the previous install; refused StaleConfig when N is older than the
 *       installed collection version. Replies {ns, collectionVersion, shardVersion, nChunks}.
 *   {stripedbGetFiltering: "db.coll"} -> {ns, installed: bool, key, collectionVersion,
 *       shardVersion, chunks}.
 *   {stripedbListFiltering: 1} -> {namespaces: [{ns, collectionVersion, shardVersion,
 *       generation}]}: every installed namespace, in ns order, without the chunks (the
 *       coordinator's reconciler, src/coordinator/filtering.h, asks what is missing).
 *   $stripedbShardVersion: {ns: "db.coll", collectionVersion: N, shardVersion: M} on a
 *       command of db.coll: checked in the command's own transaction (shard_begin): the
 *       shard answers StaleConfig (13388, nothing executed) unless it has filtering metadata
 *       for ns, M equals its shard version and N is not older than its collection version;
 *       then every document the command reads, counts or writes through the query planner
 *       is kept only if its shard key lies in an owned chunk (orphans are skipped).
 *
 * The parsed ownership of a namespace is cached per (shard, ns, install generation): a
 * gated request reads three integers from shard.db, the ranges are parsed once per install,
 * as src/routing/owned.h's merged, keyenc-encoded ranges: a document is located by encoding
 * its shard key once (into the query's reused buffer) and a memcmp binary search, with the
 * previous document's range tried first (O(1) per document for a scan in shard-key order).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "routing/owned.h"
#include "routing/route.h"
#include "shard/shard.h"
#include "shard/util.h"

#define FCACHE_SIZE 64

typedef struct fcache_ent {
	const void *sh;
	char *ns;
	int64_t gen;
	route_owned *rc;
} fcache_ent;

static pthread_mutex_t fcache_mu = PTHREAD_MUTEX_INITIALIZER;
static fcache_ent fcache[FCACHE_SIZE];
static size_t fcache_next;

/* A reference to the cached ownership of (sh, ns, gen), or NULL. */
static route_owned *fcache_get(const void *sh, const char *ns, int64_t gen)
{
	route_owned *rc = NULL;
	pthread_mutex_lock(&fcache_mu);
	for (size_t i = 0; i < FCACHE_SIZE; i++) {
		fcache_ent *e = &fcache[i];
		if (e->rc && e->sh == sh && e->gen == gen && strcmp(e->ns, ns) == 0) {
			rc = e->rc;
			route_owned_ref(rc);
			break;
		}
	}
	pthread_mutex_unlock(&fcache_mu);
	return rc;
}

static void fcache_put(const void *sh, const char *ns, int64_t gen, route_owned *rc)
{
	pthread_mutex_lock(&fcache_mu);
	size_t slot = FCACHE_SIZE;
	for (size_t i = 0; i < FCACHE_SIZE && slot == FCACHE_SIZE; i++)
		if (fcache[i].rc && fcache[i].sh == sh && strcmp(fcache[i].ns, ns) == 0)
			slot = i; /* replace the older install of ns */
	if (slot == FCACHE_SIZE)
		slot = fcache_next++ % FCACHE_SIZE;
	fcache_ent *e = &fcache[slot];
	if (e->rc) {
		route_owned_unref(e->rc);
		free(e->ns);
	}
	e->sh = sh;
	e->ns = sdb_strdup(ns);
	e->gen = gen;
	route_owned_ref(rc);
	e->rc = rc;
	pthread_mutex_unlock(&fcache_mu);
}

/* ---- the strict check of an install as it arrives (shard_filtering_precheck) ----
 * Only at arrival, before the install is proposed: the Raft apply and the load of a stored
 * install (owner_build) stay as lenient as the version that wrote them, so an entry or a
 * row written by an earlier version is applied and loaded alike on every member. */

/* A bound of chunk n ({k1: v1, ...}) must name exactly the key pattern's fields in its
 * order. 0 or SDB_EINVAL. */
static int bound_check(const bson_t *key, const bson_t *bound, const char *which, uint32_t n,
		       char *err, size_t errlen)
{
	bson_iter_t k, b;

	if (!bson_iter_init(&k, key) || !bson_iter_init(&b, bound))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunks[%u].%s is corrupt", n, which);
	for (;;) {
		bool hk = bson_iter_next(&k), hb = bson_iter_next(&b);
		if (!hk && !hb)
			return 0;
		if (hk != hb || strcmp(bson_iter_key(&k), bson_iter_key(&b)) != 0)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"chunks[%u].%s must have exactly the shard key's fields, in "
					"its order",
					n, which);
	}
}

/* The shard key pattern: every field 1 or "hashed" (alone), the rule metadata's
 * shardCollection applies (raft/fsm_routing.c: an integer value of 1), as MongoDB's
 * "Field ... can only be 1 or 'hashed'". 0 or SDB_EINVAL. */
static int key_check(const bson_t *key, char *err, size_t errlen)
{
	bson_iter_t it;
	uint32_t n = 0;
	bool hashed = false;

	if (!bson_iter_init(&it, key))
		return sdb_errf(err, errlen, SDB_EINVAL, "key is corrupt");
	while (bson_iter_next(&it)) {
		n++;
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0)
			hashed = true;
		else if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"key field %s can only be 1 or 'hashed'", bson_iter_key(&it));
	}
	if (n == 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "key must name at least one field");
	if (hashed && n != 1)
		return sdb_errf(err, errlen, SDB_EINVAL, "a hashed shard key has exactly one field");
	return 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The install cmd ({stripedbSetFiltering: ns, key, collectionVersion, chunks}) checked
 * strictly: the key pattern (key_check), each chunk of exactly id (a non-empty string),
 * min, max (documents with the key's fields, bound_check) and token (an integer >= 0),
 * min < max, distinct ids (sorted: O(n log n) for the 8,192 chunks a shard may own).
 * Overlaps are left to route_coll_build. 0 or SDB_EINVAL with a message. */
static int install_check(const bson_t *cmd, char *err, size_t errlen)
{
	bson_iter_t it, arr;
	bson_t key;
	uint32_t len, n = 0, cap = 0;
	const uint8_t *data;
	const char **ids = NULL;
	int rc;

	if (!bson_iter_init_find(&it, cmd, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return sdb_errf(err, errlen, SDB_EINVAL, "key must be the shard key pattern");
	bson_iter_document(&it, &len, &data);
	bson_init_static(&key, data, len);
	if ((rc = key_check(&key, err, errlen)) != 0)
		return rc;
	if (!bson_iter_init_find(&it, cmd, "chunks") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return sdb_errf(err, errlen, SDB_EINVAL, "chunks must be an array");
	while (bson_iter_next(&arr)) {
		bson_iter_t f;
		bson_t ch, bmin, bmax;
		int64_t tok = -1;
		const char *id = NULL;
		bool have_min = false, have_max = false;
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) {
			rc = sdb_errf(err, errlen, SDB_EINVAL, "chunks[%u] must be a document", n);
			goto out;
		}
		bson_iter_document(&arr, &len, &data);
		bson_init_static(&ch, data, len);
		bson_iter_init(&f, &ch);
		while (bson_iter_next(&f)) {
			const char *name = bson_iter_key(&f);
			if (strcmp(name, "token") == 0) {
				util_token(&f, &tok);
			} else if (strcmp(name, "id") == 0 && BSON_ITER_HOLDS_UTF8(&f)) {
				id = bson_iter_utf8(&f, NULL);
			} else if ((strcmp(name, "min") == 0 || strcmp(name, "max") == 0) &&
				   BSON_ITER_HOLDS_DOCUMENT(&f)) {
				bool is_min = name[1] == 'i';
				bson_iter_document(&f, &len, &data);
				bson_init_static(is_min ? &bmin : &bmax, data, len);
				*(is_min ? &have_min : &have_max) = true;
			} else {
				rc = sdb_errf(err, errlen, SDB_EINVAL,
					      "chunks[%u].%s is not a chunk field (id: <string>, min, "
					      "max: <document>, token: <integer>)",
					      n, name);
				goto out;
			}
		}
		if (tok < 0 || id == NULL || id[0] == '\0' || !have_min || !have_max) {
			rc = sdb_errf(err, errlen, SDB_EINVAL,
				      "chunks[%u] needs id: <string>, min, max: <document> and token: "
				      "<integer >= 0>",
				      n);
			goto out;
		}
		if ((rc = bound_check(&key, &bmin, "min", n, err, errlen)) != 0 ||
		    (rc = bound_check(&key, &bmax, "max", n, err, errlen)) != 0)
			goto out;
		if (route_key_cmp(&bmin, &bmax) >= 0) {
			rc = sdb_errf(err, errlen, SDB_EINVAL,
				      "chunks[%u] (id %s) has min >= max: an empty range", n, id);
			goto out;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			ids = sdb_realloc(ids, cap * sizeof *ids);
		}
		ids[n++] = id; /* points into cmd, which outlives this call */
	}
	if (n > 1) {
		qsort(ids, n, sizeof *ids, cmp_str_ptr);
		for (uint32_t j = 1; j < n; j++)
			if (strcmp(ids[j - 1], ids[j]) == 0) {
				rc = sdb_errf(err, errlen, SDB_EINVAL, "chunk id %s is repeated",
					      ids[j]);
				goto out;
			}
	}
	rc = 0;
out:
	free(ids);
	return rc;
}

bool shard_filtering_precheck(shard_ctx *x)
{
	bson_iter_t it;
	const char *ns = NULL;

	if (strcmp(wire_req_name(x->req), "stripedbSetFiltering") != 0)
		return true;
	if (bson_iter_init_find(&it, x->cmd, "drop") && bson_iter_as_bool(&it))
		return true; /* a drop of an older version's install stays possible */
	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		ns = bson_iter_utf8(&it, NULL);
	if (!ns || !strchr(ns, '.') || ns[0] == '.')
		return true; /* the apply answers it (BadValue) */
	/* what shardCollection refuses to shard: the local, admin and config databases and
	 * system collections (MongoDB: IllegalOperation) */
	if (strncmp(ns, "local.", 6) == 0 || strncmp(ns, "admin.", 6) == 0 ||
	    strncmp(ns, "config.", 7) == 0 || strncmp(strchr(ns, '.') + 1, "system.", 7) == 0 ||
	    strchr(ns, '$') != NULL) {
		shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION,
			   "stripedbSetFiltering: %s cannot be sharded (a local, admin, config or "
			   "system namespace)",
			   ns);
		return false;
	}
	if (install_check(x->cmd, x->err, sizeof x->err) != 0) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "stripedbSetFiltering: %s", x->err);
		return false;
	}
	return true;
}

/* Build the ownership of ns from an install document {key, chunks: [{id, min, max, token}]}:
 * route.h's snapshot, so ranged and hashed keys locate a document's chunk exactly as the
 * proxy and the coordinator do. 0 or SDB_EINVAL with a message. */
static int owner_build(const char *ns, const bson_t *doc, route_coll **out, int64_t *sver,
		       char *err, size_t errlen)
{
	bson_iter_t it, arr;
	bson_t key, table = BSON_INITIALIZER, tarr;
	uint32_t len;
	const uint8_t *data;
	int rc;

	*sver = 0;
	if (!bson_iter_init_find(&it, doc, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return sdb_errf(err, errlen, SDB_EINVAL, "key must be the shard key pattern");
	bson_iter_document(&it, &len, &data);
	bson_init_static(&key, data, len);
	BSON_APPEND_ARRAY_BEGIN(&table, "chunks", &tarr);
	if (!bson_iter_init_find(&it, doc, "chunks") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr)) {
		bson_destroy(&table);
		return sdb_errf(err, errlen, SDB_EINVAL, "chunks must be an array");
	}
	uint32_t n = 0;
	while (bson_iter_next(&arr)) {
		bson_iter_t f;
		bson_t ch, o;
		int64_t tok = -1;
		bool have_id = false;
		char k[16];
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) {
			bson_destroy(&table);
			return sdb_errf(err, errlen, SDB_EINVAL, "chunks[%u] must be a document", n);
		}
		bson_iter_document(&arr, &len, &data);
		bson_init_static(&ch, data, len);
		if (bson_iter_init_find(&f, &ch, "token"))
			util_token(&f, &tok);
		if (bson_iter_init_find(&f, &ch, "id") && BSON_ITER_HOLDS_UTF8(&f))
			have_id = true;
		if (tok < 0 || !have_id) {
			bson_destroy(&table);
			return sdb_errf(err, errlen, SDB_EINVAL,
					"chunks[%u] needs id: <string> and token: <integer >= 0>", n);
		}
		if (tok > *sver)
			*sver = tok;
		snprintf(k, sizeof k, "%u", n++);
		BSON_APPEND_DOCUMENT_BEGIN(&tarr, k, &o);
		bson_iter_init(&f, &ch);
		while (bson_iter_next(&f)) {
			const char *name = bson_iter_key(&f);
			if (strcmp(name, "id") == 0 || strcmp(name, "min") == 0 ||
			    strcmp(name, "max") == 0 || strcmp(name, "token") == 0)
				bson_append_iter(&o, name, -1, &f);
		}
		BSON_APPEND_UTF8(&o, "ns", ns);
		BSON_APPEND_UTF8(&o, "shard", "self");
		bson_append_document_end(&tarr, &o);
	}
	bson_append_array_end(&table, &tarr);
	rc = route_coll_build(ns, &key, &table, out, err, errlen);
	bson_destroy(&table);
	return rc;
}

/* One query's orphan filter: the shared ranges plus the query's own key buffer and hint
 * (a query runs on one worker thread: no lock). */
typedef struct owns_ctx {
	route_owned *own;  /* a reference */
	sdb_key buf;       /* the document's encoded shard key, reused */
	size_t hint;       /* the range of the previous owned document */
} owns_ctx;

static bool owns_doc(void *arg, const bson_t *doc)
{
	owns_ctx *o = arg;
	return route_owned_has_doc(o->own, doc, &o->buf, &o->hint);
}

static void owns_free(void *arg)
{
	owns_ctx *o = arg;
	route_owned_unref(o->own);
	sdb_key_free(&o->buf);
	free(o);
}

/* A new orphan filter over own (takes the caller's reference). */
static owns_ctx *owns_new(route_owned *own)
{
	owns_ctx *o = sdb_calloc(1, sizeof *o);
	o->own = own;
	sdb_key_init(&o->buf);
	return o;
}

/* The owned ranges of the snapshot rc (its reference is passed on to *out). */
static int owned_of(route_coll *rc, route_owned **out, char *err, size_t errlen)
{
	int e = route_owned_build(rc, out, err, errlen);
	route_coll_unref(rc);
	return e;
}

/* ns of the command: "<db>.<first value>" into buf (of the inner command of an explain,
 * which carries the version at its top level as for $stripedbVersion); false when that value
 * is not a non-empty string. */
static bool cmd_ns(shard_ctx *x, char *buf, size_t n)
{
	bson_iter_t it, in;
	if (!bson_iter_init(&it, x->cmd) || !bson_iter_next(&it))
		return false;
	if (BSON_ITER_HOLDS_DOCUMENT(&it) && strcmp(bson_iter_key(&it), "explain") == 0 &&
	    bson_iter_recurse(&it, &in) && bson_iter_next(&in))
		it = in;
	if (!BSON_ITER_HOLDS_UTF8(&it))
		return false;
	const char *coll = bson_iter_utf8(&it, NULL);
	if (!*coll)
		return false;
	return (size_t)snprintf(buf, n, "%s.%s", x->db, coll) < n;
}

bool shard_filtering_parse(shard_ctx *x)
{
	bson_iter_t it, sub;
	bool have_c = false, have_s = false, ok;
	char ns[512];

	if (!util_ctx_find(x, "$stripedbShardVersion", &it))
		return true;
	ok = BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub);
	while (ok && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "ns") == 0 && BSON_ITER_HOLDS_UTF8(&sub))
			x->sv_ns = bson_iter_utf8(&sub, NULL);
		else if (strcmp(k, "collectionVersion") == 0 && util_token(&sub, &x->sv_cver))
			have_c = true;
		else if (strcmp(k, "shardVersion") == 0 && util_token(&sub, &x->sv_sver))
			have_s = true;
		else
			ok = false;
	}
	if (!ok || !x->sv_ns || !have_c || !have_s || x->sv_cver < 0 || x->sv_sver < 0) {
		x->sv_ns = NULL;
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "$stripedbShardVersion must be {ns: <string>, collectionVersion: "
			   "<integer >= 0>, shardVersion: <integer >= 0>}");
		return false;
	}
	if (!cmd_ns(x, ns, sizeof ns) || strcmp(ns, x->sv_ns) != 0) {
		const char *want = x->sv_ns;
		x->sv_ns = NULL;
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "$stripedbShardVersion names %s, the command runs on another namespace",
			   want);
		return false;
	}
	return true;
}

static void stale(shard_ctx *x, bool installed, int64_t cver, int64_t sver, const char *why)
{
	bson_t *extra = bson_new(), d;
	sdb_store_rollback(x->conn);
	BSON_APPEND_UTF8(extra, "ns", x->sv_ns);
	BSON_APPEND_DOCUMENT_BEGIN(extra, "vReceived", &d);
	BSON_APPEND_INT64(&d, "collectionVersion", x->sv_cver);
	BSON_APPEND_INT64(&d, "shardVersion", x->sv_sver);
	bson_append_document_end(extra, &d);
	if (installed) {
		BSON_APPEND_DOCUMENT_BEGIN(extra, "vWanted", &d);
		BSON_APPEND_INT64(&d, "collectionVersion", cver);
		BSON_APPEND_INT64(&d, "shardVersion", sver);
		bson_append_document_end(extra, &d);
	} else {
		BSON_APPEND_NULL(extra, "vWanted");
	}
	wire_req_error_extra(x->req, WIRE_ERR_STALE_CONFIG, extra,
			     "StaleConfig: %s: %s (received collectionVersion %lld shardVersion "
			     "%lld)",
			     x->sv_ns, why, (long long)x->sv_cver, (long long)x->sv_sver);
}

bool shard_filtering_gate(shard_ctx *x)
{
	int64_t cver = 0, sver = 0, gen = 0;
	int rc = sdb_store_filtering_get(x->conn, x->sv_ns, &cver, &sver, &gen, NULL, x->err,
					 sizeof x->err);
	if (rc == SDB_ENOTFOUND) {
		stale(x, false, 0, 0, "this shard has no filtering metadata for the collection");
		return false;
	}
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return false;
	}
	if (x->sv_sver != sver || x->sv_cver < cver) {
		char why[160];
		snprintf(why, sizeof why,
			 "the shard's collectionVersion is %lld and shardVersion %lld", (long long)cver,
			 (long long)sver);
		stale(x, true, cver, sver, why);
		return false;
	}
	if (x->owner) /* a second shard_begin of the same command (find's cursor connection) */
		return true;
	route_owned *own = fcache_get(x->sh, x->sv_ns, gen);
	if (!own) {
		bson_t *doc = NULL;
		int64_t sv2 = 0;
		route_coll *coll = NULL;
		rc = sdb_store_filtering_get(x->conn, x->sv_ns, &cver, &sver, &gen, &doc, x->err,
					     sizeof x->err);
		if (rc == 0)
			rc = owner_build(x->sv_ns, doc, &coll, &sv2, x->err, sizeof x->err);
		if (rc == 0)
			rc = owned_of(coll, &own, x->err, sizeof x->err);
		if (doc)
			bson_destroy(doc);
		if (rc) {
			shard_fail(x, WIRE_ERR_INTERNAL, "shard: filtering metadata of %s: %s",
				   x->sv_ns, x->err);
			return false;
		}
		fcache_put(x->sh, x->sv_ns, gen, own);
	}
	x->owner = own;
	return true;
}

void shard_filtering_spec(shard_ctx *x, sdb_query_spec *spec)
{
	if (!x->owner)
		return;
	route_owned_ref(x->owner);
	spec->owns = owns_doc;
	spec->owns_arg = owns_new(x->owner);
	spec->owns_free = owns_free;
}

void shard_filtering_release(shard_ctx *x)
{
	if (x->owner)
		route_owned_unref(x->owner);
	x->owner = NULL;
}

/* The scan end of a chunk whose min's (dir < 0) or, for a compound key, max's (dir > 0)
 * first value is the number v. The chunk holds the documents whose key is at or above min
 * and below max by route_key_cmp, where a number ties every number with the same nearest
 * long double L (common/bsonval.h sdb_bson_key_cmp_v4): some of them lie below v (above v)
 * by exact value, which is the shard-key index's order. For min they are in the chunk;
 * for a compound max too when their later fields are below max's (issue #20 review: a
 * move lost them). They all lie above the long double p just below L (below the one just
 * above L: nearest rounding is monotonic), so the scan ends at p rounded to 34 digits, a
 * Decimal128 (its rounding error, 1 part in 10^33, is far below half the distance from p
 * to L, 1 part in 2^65, so no such document is skipped); the orphan filter drops the
 * documents between p and the bound that are not in the chunk. A single-field max needs
 * none: a document below it by route_key_cmp is below it exactly too. NaN ties only NaN:
 * v itself. */
static void key_range_widen(const bson_value_t *v, int dir, bson_value_t *out)
{
	char buf[BSON_DECIMAL128_STRING + 16];
	long double l, p;

	switch (v->value_type) {
	case BSON_TYPE_INT32:
		l = v->value.v_int32;
		break;
	case BSON_TYPE_INT64:
		l = (long double)v->value.v_int64;
		break;
	case BSON_TYPE_DOUBLE:
		l = v->value.v_double;
		break;
	case BSON_TYPE_DECIMAL128:
		bson_decimal128_to_string(&v->value.v_decimal128, buf);
		l = strtold(buf, NULL);
		break;
	default:
		*out = *v;
		return;
	}
	if (isnan(l)) {
		*out = *v;
		return;
	}
	p = nextafterl(l, dir < 0 ? -INFINITY : INFINITY);
	if (isinf(p))
		snprintf(buf, sizeof buf, "%s", p < 0 ? "-Infinity" : "Infinity");
	else
		snprintf(buf, sizeof buf, "%.33Le", p);
	memset(out, 0, sizeof *out);
	out->value_type = BSON_TYPE_DECIMAL128;
	if (!bson_decimal128_from_string(buf, &out->value.v_decimal128))
		*out = *v; /* not reached: glibc prints what libbson parses */
}

int shard_filtering_key_range(shard_ctx *x, const char *ns, const bson_t *kr,
			      shard_key_range *r, sdb_query_spec *spec)
{
	bson_iter_t it;
	bson_t key, min, max, table = BSON_INITIALIZER, arr, ch;
	uint32_t len;
	const uint8_t *data;
	route_coll *rc = NULL;
	const char *bad = NULL;

	if (x->owner || x->sv_ns) {
		snprintf(x->err, sizeof x->err,
			 "keyRange cannot be combined with $stripedbShardVersion");
		return WIRE_ERR_BAD_VALUE;
	}
	bson_t *parts[3] = {&key, &min, &max};
	const char *names[3] = {"key", "min", "max"};
	for (int i = 0; i < 3 && !bad; i++) {
		if (!bson_iter_init_find(&it, kr, names[i]) || !BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bad = names[i];
			break;
		}
		bson_iter_document(&it, &len, &data);
		bson_init_static(parts[i], data, len);
	}
	if (bad || bson_count_keys(kr) != 3) {
		snprintf(x->err, sizeof x->err,
			 "keyRange must be {key: <shard key pattern>, min: <document>, max: "
			 "<document>}");
		return WIRE_ERR_BAD_VALUE;
	}
	BSON_APPEND_ARRAY_BEGIN(&table, "chunks", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &ch);
	BSON_APPEND_UTF8(&ch, "id", "keyRange");
	BSON_APPEND_UTF8(&ch, "ns", ns);
	BSON_APPEND_DOCUMENT(&ch, "min", &min);
	BSON_APPEND_DOCUMENT(&ch, "max", &max);
	BSON_APPEND_UTF8(&ch, "shard", "self");
	BSON_APPEND_INT64(&ch, "token", 1);
	bson_append_document_end(&arr, &ch);
	bson_append_array_end(&table, &arr);
	char why[256];
	int e = route_coll_build(ns, &key, &table, &rc, why, sizeof why);
	bson_destroy(&table);
	if (e) {
		snprintf(x->err, sizeof x->err, "keyRange: %s", why);
		return WIRE_ERR_BAD_VALUE;
	}
	route_owned *own = NULL;
	/* own keeps rc alive (and with it rc->keys[0], the range field below) for the query */
	e = owned_of(rc, &own, why, sizeof why);
	if (e) {
		snprintf(x->err, sizeof x->err, "keyRange: %s", why);
		return WIRE_ERR_BAD_VALUE;
	}
	spec->owns = owns_doc;
	spec->owns_arg = owns_new(own); /* the query's reference */
	spec->owns_free = owns_free;
	if (rc->nkeys == 0)
		return 0;
	if (rc->hashed) {
		/* the chunk's NumberLong bounds on the hashes: the hashed index {k: "hashed"}
		 * serves them (storage/query.h range_hashed); without one the query scans
		 * everything and owns filters (correct, slow). A bound that is neither a
		 * number nor MinKey/MaxKey leaves the range open on that side. */
		spec->range_field = rc->keys[0];
		spec->range_hashed = true;
		spec->range_hi_incl = false;
		if (bson_iter_init_find(&r->lo, &min, rc->keys[0]) &&
		    BSON_ITER_HOLDS_NUMBER(&r->lo))
			spec->range_lo = bson_iter_value(&r->lo);
		if (bson_iter_init_find(&r->hi, &max, rc->keys[0]) &&
		    BSON_ITER_HOLDS_NUMBER(&r->hi))
			spec->range_hi = bson_iter_value(&r->hi);
		return 0;
	}
	/* the first key field's values: [min, max) for one field; [min, max] for a compound
	 * key (documents whose first field equals max's may still lie below max) */
	spec->range_field = rc->keys[0];
	spec->range_hi_incl = rc->nkeys > 1;
	if (bson_iter_init_find(&r->lo, &min, rc->keys[0]) &&
	    bson_iter_type(&r->lo) != BSON_TYPE_MINKEY) {
		/* a numeric min: from below the numbers that tie it (key_range_widen) */
		key_range_widen(bson_iter_value(&r->lo), -1, &r->lo_wide);
		spec->range_lo = &r->lo_wide;
	}
	/* max: as it is for one field; for a compound key up to above the numbers that tie
	 * it (key_range_widen) */
	if (bson_iter_init_find(&r->hi, &max, rc->keys[0]) &&
	    bson_iter_type(&r->hi) != BSON_TYPE_MAXKEY) {
		if (rc->nkeys > 1) {
			key_range_widen(bson_iter_value(&r->hi), 1, &r->hi_wide);
			spec->range_hi = &r->hi_wide;
		} else {
			spec->range_hi = bson_iter_value(&r->hi);
		}
	}
	return 0;
}

void shard_cmd_set_filtering(shard_ctx *x)
{
	bson_iter_t it;
	const char *ns = NULL;
	int64_t cver = -1, sver = 0;
	bool drop = false;
	route_coll *own = NULL;

	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		ns = bson_iter_utf8(&it, NULL);
	if (!ns || !strchr(ns, '.') || ns[0] == '.') {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "stripedbSetFiltering needs the namespace \"db.coll\" as its value");
		return;
	}
	if (bson_iter_init_find(&it, x->cmd, "drop"))
		drop = bson_iter_as_bool(&it);
	if (!drop) {
		if (bson_iter_init_find(&it, x->cmd, "collectionVersion"))
			util_token(&it, &cver);
		if (cver < 0) {
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "stripedbSetFiltering needs collectionVersion: <integer >= 0>");
			return;
		}
		if (owner_build(ns, x->cmd, &own, &sver, x->err, sizeof x->err) != 0) {
			shard_fail(x, WIRE_ERR_BAD_VALUE, "stripedbSetFiltering: %s", x->err);
			return;
		}
		if (sver > cver) {
			route_coll_unref(own);
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "stripedbSetFiltering: a chunk token (%lld) above the "
				   "collectionVersion (%lld)",
				   (long long)sver, (long long)cver);
			return;
		}
	}
	if (!shard_begin(x, true)) {
		if (own)
			route_coll_unref(own);
		return;
	}
	int rc;
	size_t nchunks = own ? own->nchunks : 0;
	if (drop) {
		rc = sdb_store_filtering_drop(x->conn, ns, x->err, sizeof x->err);
	} else {
		/* what is stored: the key and the chunks as given (validated above) */
		bson_t doc = BSON_INITIALIZER;
		if (bson_iter_init_find(&it, x->cmd, "key"))
			bson_append_iter(&doc, "key", -1, &it);
		if (bson_iter_init_find(&it, x->cmd, "chunks"))
			bson_append_iter(&doc, "chunks", -1, &it);
		rc = sdb_store_filtering_set(x->conn, ns, cver, sver, &doc, x->err, sizeof x->err);
		bson_destroy(&doc);
		route_coll_unref(own);
	}
	if (rc) {
		shard_fail(x, shard_code_of(rc), "stripedbSetFiltering: %s", x->err);
		return;
	}
	if (!shard_commit(x))
		return;
	bson_t *reply = bson_new();
	BSON_APPEND_UTF8(reply, "ns", ns);
	if (!drop) {
		BSON_APPEND_INT64(reply, "collectionVersion", cver);
		BSON_APPEND_INT64(reply, "shardVersion", sver);
	}
	BSON_APPEND_INT64(reply, "nChunks", (int64_t)nchunks);
	wire_req_reply(x->req, reply);
}

void shard_cmd_get_filtering(shard_ctx *x)
{
	bson_iter_t it;
	const char *ns = NULL;
	int64_t cver = 0, sver = 0, gen = 0;
	bson_t *doc = NULL;

	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		ns = bson_iter_utf8(&it, NULL);
	if (!ns) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "stripedbGetFiltering needs the namespace \"db.coll\" as its value");
		return;
	}
	if (!shard_begin(x, false))
		return;
	int rc = sdb_store_filtering_get(x->conn, ns, &cver, &sver, &gen, &doc, x->err,
					 sizeof x->err);
	sdb_store_rollback(x->conn);
	if (rc && rc != SDB_ENOTFOUND) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return;
	}
	bson_t *reply = bson_new();
	BSON_APPEND_UTF8(reply, "ns", ns);
	BSON_APPEND_BOOL(reply, "installed", rc == 0);
	if (rc == 0) {
		BSON_APPEND_INT64(reply, "collectionVersion", cver);
		BSON_APPEND_INT64(reply, "shardVersion", sver);
		if (bson_iter_init(&it, doc))
			while (bson_iter_next(&it))
				bson_append_iter(reply, bson_iter_key(&it), -1, &it);
		bson_destroy(doc);
	}
	wire_req_reply(x->req, reply);
}

typedef struct list_arg {
	bson_t *arr;
	uint32_t n;
} list_arg;

static bool list_one(void *arg, const char *ns, int64_t cver, int64_t sver, int64_t gen)
{
	list_arg *a = arg;
	bson_t d;
	char idx[16];
	snprintf(idx, sizeof idx, "%u", a->n++);
	bson_append_document_begin(a->arr, idx, -1, &d);
	BSON_APPEND_UTF8(&d, "ns", ns);
	BSON_APPEND_INT64(&d, "collectionVersion", cver);
	BSON_APPEND_INT64(&d, "shardVersion", sver);
	BSON_APPEND_INT64(&d, "generation", gen);
	bson_append_document_end(a->arr, &d);
	return true;
}

void shard_cmd_list_filtering(shard_ctx *x)
{
	bson_t *reply, arr;
	list_arg a = {.arr = &arr};

	if (!shard_begin(x, false))
		return;
	reply = bson_new();
	bson_append_array_begin(reply, "namespaces", -1, &arr);
	int rc = sdb_store_filtering_list(x->conn, list_one, &a, x->err, sizeof x->err);
	sdb_store_rollback(x->conn);
	bson_append_array_end(reply, &arr);
	if (rc) {
		bson_destroy(reply);
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return;
	}
	wire_req_reply(x->req, reply);
}
