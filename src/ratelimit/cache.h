/* The rate limiter's bounded cache of key states (LRU approximated by CLOCK).
 *
 * Gubernator's cache (LRU, GUBER_CACHE_SIZE items, default 50,000, items expire at their
 * reset time) made safe for many threads: the keys are split over a power-of-two number
 * of shards by hash (xxh64 of the key bytes), each shard with its own mutex, hash table
 * and recency list. A hit sets the key's reference bit (no list writes, so threads that
 * decide on the same shard do not pass the neighbours' cache lines around); eviction is
 * CLOCK (second chance): from the least recent end, referenced keys are moved to the
 * front with the bit cleared. The capacity is global (one atomic count): an insert into
 * a full cache evicts an expired key among the first 4 unreferenced keys of that scan in
 * the inserting shard, else the first of them (so recency is per shard, approximately
 * global). The cache
 * never holds more than `capacity` keys, except transiently when an empty shard inserts
 * while every other shard's lock is taken (see rl_cache_insert).
 *
 * Memory per key: one heap block (entry header + rl_state + key bytes) plus one bucket
 * pointer; tests/bench/ratelimit_cache reports the measured bytes per key.
 */
#ifndef SDB_RATELIMIT_CACHE_H
#define SDB_RATELIMIT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "ratelimit/limiter.h"

typedef struct rl_cache rl_cache;
typedef struct rl_cache_shard rl_cache_shard;

/* capacity: max keys (0 = 50000). nshards: mutex stripes (0 = 64), rounded up to a power
 * of two and lowered so that every shard holds at least one key. Never fails (allocation
 * aborts). Free with rl_cache_free() when no thread uses it. */
rl_cache *rl_cache_new(size_t capacity, size_t nshards);
void rl_cache_free(rl_cache *c);

/* Lock and return the shard that holds keys of this hash. Every find/insert/remove of
 * such a key happens between lock and unlock, on the same thread. */
rl_cache_shard *rl_cache_lock(rl_cache *c, uint64_t hash);
void rl_cache_unlock(rl_cache_shard *s);

/* Find key (keylen bytes) in a locked shard; on a hit set its reference bit and
 * return its state (valid until unlock). NULL when absent. Expiry is the caller's call
 * (the algorithms renew expired states in place). */
rl_state *rl_cache_find(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen);

/* Insert key (which must be absent) into a locked shard and return its zeroed state.
 * When the cache is full, first drops a key of this shard by the CLOCK scan (an expired
 * one, expire_at <= now, among the first 4 unreferenced, else the first of them); when this
 * shard is empty, one of another shard whose lock is free. */
rl_state *rl_cache_insert(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen,
			  int64_t now);

/* Remove key from a locked shard. Returns: 1 when it was there, else 0 (never an error). */
int rl_cache_remove(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen);

/* Per-shard decision tallies (RL_TALLY_*), counted under the shard's lock so the hot
 * path has no shared atomic; rl_cache_take_tallies() locks each shard in turn, adds its
 * tallies into out[] and zeroes them. */
enum { RL_TALLY_UNDER, RL_TALLY_OVER, RL_TALLIES };
void rl_cache_tally(rl_cache_shard *s, int which);
void rl_cache_take_tallies(rl_cache *c, uint64_t out[RL_TALLIES]);

/* Keys held, capacity, and keys evicted to make room so far (all shards; relaxed reads). */
size_t rl_cache_size(rl_cache *c);
size_t rl_cache_capacity(const rl_cache *c);
uint64_t rl_cache_evictions(rl_cache *c);

#endif
