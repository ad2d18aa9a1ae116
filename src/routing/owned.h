/* What one shard owns of a sharded collection, as byte ranges (issue #17).
 *
 * Built once per filtering-metadata install (src/shard/filtering.c) from the snapshot of the
 * chunks the shard owns (route.h): adjacent chunks (one's max equal to the next one's min)
 * are merged into one range, and each range's [min, max) bounds are encoded with
 * storage/keyenc.h (ascending, one component per key field, in the routed space: hashed
 * keys as their NumberLong). A document is then located by encoding its shard key once
 * (route_key_encode, into a buffer the caller reuses) and a binary search over the ranges
 * with memcmp: no BSON built, no allocation, O(log ranges) byte compares; a hint (the range
 * of the previous document) makes documents read in shard-key order O(1) each.
 *
 * Same answers as route_chunk_of_doc(coll, doc) >= 0 on the snapshot it was built from
 * (bounds and keys are encoded with numbers in the frozen form, storage/keyenc.h
 * sdb_keyenc_legacy_numbers, so memcmp orders them as route_key_cmp does: decimals through
 * their nearest long double, the chunk-membership order).
 *
 * Immutable once built, shared by reference counting: worker threads read it without a lock.
 */
#ifndef SDB_ROUTING_OWNED_H
#define SDB_ROUTING_OWNED_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "routing/route.h"
#include "storage/keyenc.h"

typedef struct route_owned route_owned;

/* The ranges of every chunk of c (all of them are taken as owned: build c from the owned
 * chunks only). Takes a reference on c (released with the last reference of *out). Returns
 * 0 and *out (one reference; release with route_owned_unref). Errors: SDB_EINVAL with a
 * message (a bound nests deeper than keyenc encodes). */
int route_owned_build(route_coll *c, route_owned **out, char *err, size_t errlen);
void route_owned_ref(route_owned *o);
void route_owned_unref(route_owned *o);

/* The snapshot o was built from (its key pattern). Valid while o is. */
const route_coll *route_owned_coll(const route_owned *o);
/* How many merged ranges o holds. */
size_t route_owned_nranges(const route_owned *o);

/* True when the encoded key (route_key_encode of c) lies in one of o's ranges. *hint is
 * the caller's state between calls (start it at 0): the range found last, tried first. */
bool route_owned_has_key(const route_owned *o, const uint8_t *key, size_t len, size_t *hint);
/* True when doc's shard key lies in one of o's ranges: route_key_encode into buf (reset
 * first; the caller's, reused across documents) then route_owned_has_key. False for a
 * document whose key cannot be encoded (an array on a key path), as route_chunk_of_doc. */
bool route_owned_has_doc(const route_owned *o, const bson_t *doc, sdb_key *buf, size_t *hint);

#endif
