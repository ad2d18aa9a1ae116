/* Routing tables: collections, shard keys and chunks, as the metadata service serves them.
 * Shared by the proxy (its routing cache, src/proxy/catalog.c), the coordinator and ctl
 * (migrations), and the shard (its filtering metadata, src/shard/filtering.c).
 *
 * Source of the behaviour: DESIGN.md §1 (chunks are half-open shard-key ranges [min, max)),
 * §5 (route by shard key: equality -> one chunk, range -> overlapping chunks, none -> all),
 * MongoDB's chunk model (config.chunks: min/max documents with MinKey/MaxKey ends, ordered
 * by the shard key pattern; hashed keys route on the NumberLong hash of the value).
 *
 * A route_coll is an immutable snapshot of one collection's routing (built once, never
 * changed, shared by reference counting), so worker threads look chunks up without a lock
 * while the cache swaps in a newer snapshot. Chunks are kept sorted by min (compared
 * component by component with sdb_bson_cmp, MongoDB's order), so a lookup is a binary
 * search: O(log chunks).
 *
 * Key values: a shard key value is a BSON document with one element per key field, in the
 * key pattern's order ({a: 5, b: "x"}); field names are ignored when comparing. A field
 * missing from a document counts as null (MongoDB 4.4+). Arrays are never valid key values.
 *
 * Hashed keys (a single field declared "hashed"): the routed value is
 *     NumberLong((int64_t) XXH64(keyenc(value), seed 0))   (sdb_keyenc_hash_value, storage/keyenc.h)
 * where keyenc(value) is the order-preserving encoding of storage/keyenc.h of the value
 * (ascending). keyenc maps equal numbers of different types (1, 1.0, NumberLong(1)) to the
 * same bytes, so they hash equally; chunk bounds of hashed collections are NumberLongs
 * (or MinKey/MaxKey), as in MongoDB.
 */
#ifndef SDB_ROUTING_ROUTE_H
#define SDB_ROUTING_ROUTE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ROUTE_MAX_KEY_FIELDS 8  /* compound shard keys longer than this are refused */
#define ROUTE_MAX_POINTS 256    /* $in point sets larger than this scatter */

/* One chunk. Its strings and bounds live in a reference-counted body shared by every
 * snapshot that holds the chunk unchanged (a diff copies the entries, not the bounds). */
typedef struct route_chunk {
	char *id;        /* chunk id: metadata's int64 id in decimal ("17"), the name shards gate on */
	bson_t *min;     /* inclusive lower bound, one element per key field (heap) */
	bson_t *max;     /* exclusive upper bound (heap) */
	char *shard;     /* owning shard id */
	int64_t token;   /* version token the shard checks ($stripedbVersion) */
	int64_t nid;     /* metadata's numeric id (0 when the id is not numeric) */
	int64_t version; /* routing version of the chunk's last change */
	void *body;      /* the shared body owning id, shard, min and max (private) */
} route_chunk;

/* One shard of a snapshot (issue #17): what a request sent once per shard needs, computed
 * once when the snapshot is built so a request does not walk the chunks for it. */
typedef struct route_shard {
	const char *id;  /* shard id (a chunk's string: valid as long as the snapshot) */
	int64_t version; /* largest token over the shard's chunks (its ShardVersion) */
	size_t first;    /* index of the shard's first chunk in chunks[] */
	size_t nchunks;  /* how many chunks the shard owns */
} route_shard;

typedef struct route_coll {
	char *ns;                              /* "db.coll" */
	size_t nkeys;                          /* 1..ROUTE_MAX_KEY_FIELDS */
	char *keys[ROUTE_MAX_KEY_FIELDS];      /* dotted key paths, heap */
	bool hashed;                           /* single hashed field */
	route_chunk *chunks;                   /* sorted by min */
	size_t nchunks;
	int64_t version;                       /* routing version this snapshot reflects */
	int refs;                              /* atomic */
	/* per-shard summary, built with the snapshot: the distinct shards of chunks[] in the
	 * order they first appear, shard_of[i] the index in shards[] of chunks[i].shard, and
	 * max_token the largest token of all chunks (the collection version; 0 when none) */
	route_shard *shards;
	size_t nshards;
	uint32_t *shard_of;
	int64_t max_token;
} route_coll;

/* Build a snapshot from metadata replies.
 *   ns: namespace; key: the key pattern document ({a: 1, b: 1} or {a: "hashed"});
 *   table: a getRoutingTable reply {routingVersion: N, chunks: [{id, ns, min, max, shard,
 *   token}]}; chunks of other namespaces are skipped.
 * Returns 0 and *out (one reference; release with route_coll_unref). Errors: SDB_EINVAL
 * with a message (bad key pattern, a chunk without id/min/max/shard, bounds with the wrong
 * number of fields, chunks that overlap). A table with no chunk for ns is valid (an
 * unsharded or empty collection: nchunks 0). */
int route_coll_build(const char *ns, const bson_t *key, const bson_t *table, route_coll **out,
		     char *err, size_t errlen);
/* A snapshot for a collection metadata does not shard (nkeys 0, nchunks 0): it lives whole on
 * the primary shard. One reference; never fails. */
route_coll *route_coll_unsharded(const char *ns, int64_t version);
void route_coll_ref(route_coll *c);
void route_coll_unref(route_coll *c);

/* The summary of shard in c (route_coll.shards), or NULL when c has no chunk on it.
 * O(shards) string compares. */
const route_shard *route_shard_find(const route_coll *c, const char *shard);

/* The hash of a hashed shard key value (see top). v NULL means missing (hashes as null). */
int64_t route_hash_value(const bson_value_t *v);

/* Compare two key values (documents with nkeys elements) component by component in
 * MongoDB order, ignoring names; a shorter document compares below. Returns: <0, 0, >0.
 * The chunk-membership order: sdb_bson_key_cmp_v4 (common/bsonval.h), which metadata orders
 * chunk bounds with from op version 4, so that routing and metadata never disagree; a
 * Decimal128 compares through its nearest long double (issue #20: every chunk placement was
 * made in this order; exact placement would strand documents that tie a bound). The shard's
 * ownership filter (owned.h) and keyRange reads (src/shard/filtering.c) use it too. */
int route_key_cmp(const bson_t *a, const bson_t *b);

/* Extract the shard key value of a document (insert, replacement) into out (initialised
 * by the caller, appended to): missing fields are null; hashed keys hash. Errors:
 * SDB_EINVAL when a key field holds an array or a document nests too deep. */
int route_key_from_doc(const route_coll *c, const bson_t *doc, bson_t *out, char *err,
		       size_t errlen);

/* Append to out the order-preserving encoding (storage/keyenc.h, ascending) of doc's shard
 * key in c's routed space: per key field, in the pattern's order, the field's value (null
 * when missing; for a hashed key the NumberLong hash). Two such encodings, and those of
 * bounds encoded the same way, compare with memcmp order (sdb_key_cmp_raw) as route_key_cmp
 * compares the key values. Builds no BSON: out's buffer is only grown (reuse one buffer to
 * encode many documents without allocating). Errors: SDB_EINVAL (a key field holds an array,
 * or a value nests too deep); out->len is then restored. */
struct sdb_key;
int route_key_encode(const route_coll *c, const bson_t *doc, struct sdb_key *out);

/* Index of the chunk holding key (a key value in the routed space: hashed already).
 * Returns -1 when no chunk holds it (a hole in the table) or the table is empty. */
ssize_t route_find_chunk(const route_coll *c, const bson_t *key);

/* The chunk of a document (route_key_from_doc + route_find_chunk). -1 on a bad key or no
 * chunk. */
ssize_t route_chunk_of_doc(const route_coll *c, const bson_t *doc);

/* Targeting of a query filter. Fills sel (c->nchunks booleans, caller-allocated) with the
 * chunks that may hold matching documents and returns how many; *exact is set when the
 * filter pins the whole shard key to one or more points (equality or $in on every key
 * field), so each targeted chunk holds only documents of those points.
 * Rules: equality / $eq / $in on every key field -> the chunks of those points (at most
 * ROUTE_MAX_POINTS, else scatter); for ranged keys, bounds ($gt, $gte, $lt, $lte, $eq)
 * on the first key field -> the chunks whose first-component range overlaps; otherwise
 * every chunk. Looks inside top-level $and. Never under-selects. */
size_t route_target(const route_coll *c, const bson_t *filter, bool *sel, bool *exact);

/* Chunks whose range overlaps [min, max) of another (older) snapshot's chunk, used to
 * re-target the part of an operation refused by StaleConfig. Fills sel; returns count. */
size_t route_target_range(const route_coll *c, const bson_t *min, const bson_t *max, bool *sel);

/* True when the update document (op-style or replacement) would change the shard key:
 * op-style when any modifier path equals, contains or lies inside a key path (except $set
 * or $setOnInsert of the value the filter already pins); replacement when its key differs from eq_key (or any
 * key field is missing and eq_key is NULL). eq_key is the filter's pinned key value
 * (unhashed field values) or NULL. A key field _id is never checked here: _id is immutable
 * and the shard itself refuses to change it (ImmutableField). Returns what the update does
 * to the key; when not ROUTE_KEY_KEPT, err names the field (MongoDB's message). */
typedef enum {
	ROUTE_KEY_KEPT = 0,	/* the update leaves the shard key alone */
	ROUTE_KEY_CHANGED,	/* it changes a key field: ImmutableField (66) */
	ROUTE_KEY_NOT_PINNED,	/* a replacement whose filter does not pin the whole key:
				 * ShardKeyNotFound (61) */
} route_key_change;
route_key_change route_update_changes_key(const route_coll *c, const bson_t *update,
					  const bson_t *filter, char *err, size_t errlen);

/* ---------- incremental updates (issue #26) ----------
 *
 * A route_update collects what getRoutingTable replies say about one collection (chunks
 * in their current state, removals, the key pattern) over one or more cursor batches,
 * then builds the next snapshot from the previous one: unchanged chunks are shared (their
 * bounds are not copied), removed and changed ones are dropped, changed and new ones are
 * inserted at their place (binary search). Cost: O(changed x log chunks) comparisons plus
 * one copy of the collection's entry array (pointers and ints, 72 bytes per chunk) and one
 * pass rebuilding the per-shard summary (a 4-byte shard index per chunk, a hash lookup each);
 * other collections are not touched. */
typedef struct route_update route_update;

/* A new, empty update for ns. full: the replies are a full load (the previous snapshot is
 * ignored). Never fails; free with route_update_free. */
route_update *route_update_new(const char *ns, bool full);
void route_update_free(route_update *u);
/* The key pattern of the collection (getRoutingTable's key, or collections[].key). */
void route_update_set_key(route_update *u, const bson_t *key);
/* One element of a reply's chunks array ({id, ns, min, max, shard, token, version});
 * the ns is not checked (the caller dispatches). Errors: SDB_EINVAL (a malformed chunk
 * document, with a message). */
int route_update_chunk(route_update *u, const bson_iter_t *elem, char *err, size_t errlen);
/* One element of a reply's removed array: {ns, id, ...} (a chunk) or {ns, collection:
 * true} (the whole collection was dropped: chunks fed later are a new incarnation). */
void route_update_removed(route_update *u, const bson_iter_t *elem);
/* Chunks and removals fed so far. */
size_t route_update_size(const route_update *u);
/* The distinct shards of the chunks fed so far (pointers valid until the update is
 * freed; apply does not touch them); *many is set when more than ROUTE_UPDATE_MAX_SHARDS
 * were seen (then the list is incomplete). Lets a caller check the shards a diff names
 * without walking the whole collection. */
#define ROUTE_UPDATE_MAX_SHARDS 64
size_t route_update_shards(const route_update *u, char *const **out, bool *many);
/* The snapshot at routing version `version`: old (NULL, unsharded or a full update: start
 * from nothing) with the update applied. Returns 0 and *out (one reference). Errors:
 * SDB_EINVAL (no key pattern for a collection that has chunks, bounds with the wrong
 * number of fields, chunks that overlap after the update: the caller then reloads in full). */
int route_update_apply(route_update *u, const route_coll *old, int64_t version,
		       route_coll **out, char *err, size_t errlen);

/* The thread-safe cache: ns -> current snapshot (sorted by ns: O(log collections)). */
typedef struct route_cache route_cache;

route_cache *route_cache_new(void);
void route_cache_free(route_cache *rc);
/* Current snapshot for ns with a reference taken (caller unrefs), or NULL when unknown.
 * A known-unsharded collection is cached as a snapshot with nchunks 0. */
route_coll *route_cache_get(route_cache *rc, const char *ns);
/* Install c (takes one reference from the caller) unless the cached one is newer. */
void route_cache_put(route_cache *rc, route_coll *c);
/* Forget ns (or everything when ns is NULL). */
void route_cache_drop(route_cache *rc, const char *ns);
/* Copy the cached namespaces, sorted (heap array of heap strings, caller frees each and
 * the array). */
size_t route_cache_names(route_cache *rc, char ***out);
/* Chunks held by the cached snapshots (for the memory-per-chunk gauge). */
size_t route_cache_chunks(route_cache *rc);

/* May a unique index with key pattern `key` ({f: 1, g: -1}) exist on a collection sharded as c
 * (c->nkeys > 0)? Only if uniqueness can be enforced by each shard alone: the key begins with
 * _id (unique everywhere by itself) or has the shard key's fields as its leading fields, in
 * order (directions and "hashed" ignored). MongoDB's ShardKeyPattern::isUniqueIndexCompatible
 * (src/mongo/s/shard_key_pattern.cpp); a refused index is CannotCreateIndex (67). */
bool route_unique_index_compatible(const route_coll *c, const bson_t *key);

#endif
