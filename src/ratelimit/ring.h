/* Consistent hashing of rate-limit keys onto peers, with virtual nodes.
 *
 * Each peer address is placed on a 64-bit ring at `vnodes` points
 * XXH64("ADDR#i", seed 0) (xxhash, libxxhash); a key belongs to the peer of the first
 * point at or after XXH64(key) (wrapping). Peers are sorted and de-duplicated first, so
 * every node given the same set of addresses in any order builds the same ring, and a
 * peer joining or leaving moves only the keys whose first point changes (the keys that
 * hash to it). This is the replicated consistent hash of Gubernator (its
 * replicated_hash.go, 512 replicas of fnv1) with xxhash instead of fnv1.
 *
 * A ring is immutable once built and may be read from any thread without locking.
 */
#ifndef SDB_RATELIMIT_RING_H
#define SDB_RATELIMIT_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RL_RING_DEFAULT_VNODES 512
#define RL_RING_MAX_PEERS 1024

typedef struct rl_ring rl_ring;

/* Build a ring over n peer addresses ("HOST:PORT" strings, copied) with vnodes points
 * each (0 = RL_RING_DEFAULT_VNODES). Duplicates are merged. On success *out is a new
 * ring freed with rl_ring_free().
 * Errors: SDB_EINVAL (n == 0, n > RL_RING_MAX_PEERS, an empty address, vnodes > 4096). */
int rl_ring_new(const char *const *peers, size_t n, unsigned vnodes, rl_ring **out, char *err,
		size_t errlen);
void rl_ring_free(rl_ring *ring);

/* Number of distinct peers, and the address of peer idx (0 <= idx < size; peers are in
 * ascending strcmp order). The string is owned by the ring. */
size_t rl_ring_size(const rl_ring *ring);
const char *rl_ring_peer(const rl_ring *ring, size_t idx);
/* Returns: the index of addr among the peers, or -1 when it is not one. */
int rl_ring_find(const rl_ring *ring, const char *addr);

/* The key's hash as used on the ring (XXH64, seed 0). */
uint64_t rl_ring_hash(const void *key, size_t len);

/* Owner of a key hash (rl_ring_hash of the key bytes; rate-limit keys use
 * rl_key_hash(name, unique_key), the same XXH64 over limiter.h's rl_key_make bytes):
 * the index of the peer of the first point at or after hash, skipping points whose peer
 * alive(idx, arg) rejects (alive may be NULL: every peer is alive). So when the owner is
 * dead, the next peer clockwise takes its keys, and every node that agrees on the dead
 * set agrees on the new owner. Returns: the peer index, or -1 when no peer is alive.
 * Thread-safe. */
int rl_ring_owner(const rl_ring *ring, uint64_t hash, bool (*alive)(size_t idx, void *arg),
		  void *arg);

#endif
