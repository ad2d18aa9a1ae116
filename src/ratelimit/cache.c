/* Sharded LRU cache of rate-limit states (see cache.h). */
#include "ratelimit/cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define RL_CACHE_DEFAULT_CAPACITY 50000
#define RL_CACHE_DEFAULT_SHARDS 64

typedef struct entry {
	struct entry *hnext; /* hash chain */
	struct entry *prev;  /* LRU list: head.next is the most recent */
	struct entry *next;
	uint64_t hash;
	rl_state state;
	uint32_t keylen;
	uint8_t ref; /* CLOCK reference bit: set by a hit, cleared by the eviction scan */
	char key[];
} entry;

/* A shard. A decision on a key that is cached touches only the first cache line (the
 * lock, the bucket array, its mask and the tallies: with glibc's 40-byte mutex they fill
 * 60 bytes), the key's bucket slot and the key's entry; both cores deciding on every
 * shard move each of those lines between them, so every line kept off the hot path counts
 * (tests/bench/README.md, 1 vs 2 threads). The rest is written on inserts and evictions. */
struct rl_cache_shard {
	pthread_mutex_t mu;
	entry **buckets;
	uint32_t mask;                  /* buckets - 1 */
	uint32_t tally[RL_TALLIES];     /* under mu; folded into tally_hi before they wrap */
	rl_cache *cache;
	size_t count;                   /* keys in this shard (under mu) */
	uint64_t evicted;               /* written under mu, read relaxed by rl_cache_evictions */
	uint64_t tally_hi[RL_TALLIES];  /* under mu */
	entry lru;                      /* sentinel: lru.next = MRU, lru.prev = LRU */
} __attribute__((aligned(64)));

_Static_assert(offsetof(rl_cache_shard, tally) + sizeof(((rl_cache_shard *)0)->tally) <= 64,
	       "a shard's hot fields fit one cache line");

struct rl_cache {
	rl_cache_shard *shards;
	size_t nshards; /* power of two */
	size_t capacity;
	size_t count;      /* keys in the whole cache (atomic) */
	unsigned victim;   /* rotating start for cross-shard eviction (atomic, approximate) */
};

static size_t pow2_ceil(size_t n)
{
	size_t p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

rl_cache *rl_cache_new(size_t capacity, size_t nshards)
{
	rl_cache *c = sdb_calloc(1, sizeof(*c));
	size_t i;

	if (capacity == 0)
		capacity = RL_CACHE_DEFAULT_CAPACITY;
	if (nshards == 0)
		nshards = RL_CACHE_DEFAULT_SHARDS;
	nshards = pow2_ceil(nshards);
	while (nshards > 1 && nshards > capacity)
		nshards >>= 1;
	c->capacity = capacity;
	c->nshards = nshards;
	/* the cache-line aligned shard array (common/alloc.h) */
	c->shards = sdb_aligned_calloc(64, nshards * sizeof(rl_cache_shard));
	for (i = 0; i < nshards; i++) {
		rl_cache_shard *s = &c->shards[i];
		size_t nb;
		pthread_mutex_init(&s->mu, NULL);
		s->cache = c;
		nb = pow2_ceil(capacity / nshards < 8 ? 8 : capacity / nshards);
		s->buckets = sdb_calloc(nb, sizeof(entry *));
		s->mask = (uint32_t)(nb - 1);
		s->lru.next = s->lru.prev = &s->lru;
	}
	return c;
}

void rl_cache_free(rl_cache *c)
{
	size_t i;

	if (c == NULL)
		return;
	for (i = 0; i < c->nshards; i++) {
		rl_cache_shard *s = &c->shards[i];
		entry *e = s->lru.next;
		while (e != &s->lru) {
			entry *n = e->next;
			free(e);
			e = n;
		}
		free(s->buckets);
		pthread_mutex_destroy(&s->mu);
	}
	free(c->shards);
	free(c);
}

rl_cache_shard *rl_cache_lock(rl_cache *c, uint64_t hash)
{
	/* the high bits pick the shard, the low bits the bucket inside it */
	rl_cache_shard *s = &c->shards[(hash >> 40) & (c->nshards - 1)];
	pthread_mutex_lock(&s->mu);
	return s;
}

void rl_cache_unlock(rl_cache_shard *s)
{
	pthread_mutex_unlock(&s->mu);
}

static void lru_unlink(entry *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
}

static void lru_push_front(rl_cache_shard *s, entry *e)
{
	e->next = s->lru.next;
	e->prev = &s->lru;
	s->lru.next->prev = e;
	s->lru.next = e;
}

static entry **chain_slot(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen)
{
	entry **pp = &s->buckets[hash & s->mask];
	while (*pp != NULL) {
		entry *e = *pp;
		if (e->hash == hash && e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			return pp;
		pp = &e->hnext;
	}
	return pp;
}

rl_state *rl_cache_find(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen)
{
	entry *e = *chain_slot(s, hash, key, keylen);
	if (e == NULL)
		return NULL;
	/* CLOCK (second chance): a hit only marks the key; the list is reordered by the
	 * eviction scan. Moving the key to the front on every hit wrote to three other
	 * keys' entries and the shard's list head, cache lines that bounce between the
	 * cores deciding on this shard (tests/bench/README.md: 1 vs 2 threads). */
	if (!e->ref)
		e->ref = 1;
	return &e->state;
}

static void drop(rl_cache_shard *s, entry *e)
{
	entry **pp = chain_slot(s, e->hash, e->key, e->keylen);
	*pp = e->hnext;
	lru_unlink(e);
	free(e);
	s->count--;
	__atomic_fetch_sub(&s->cache->count, 1, __ATOMIC_RELAXED);
}

/* Evict one key of a locked shard, CLOCK style: walking from the least recent end, a
 * key hit since the scan last passed (reference bit set) gets a second chance (bit
 * cleared, moved to the front); among the first 4 keys without the bit, an expired one
 * goes first, else the first of them. Every key loses its bit at most once per pass, so
 * the scan is amortised O(1) per hit. Returns false when the shard is empty. */
static bool evict_one(rl_cache_shard *s, int64_t now)
{
	entry *victim = NULL, *e = s->lru.prev;
	int seen = 0;

	if (e == &s->lru)
		return false;
	while (e != &s->lru && seen < 4) {
		entry *prev = e->prev;
		if (e->ref) {
			e->ref = 0;
			lru_unlink(e);
			lru_push_front(s, e);
			if (prev == &s->lru) /* wrapped: every key was referenced */
				prev = s->lru.prev;
		} else {
			if (victim == NULL)
				victim = e;
			if (e->state.expire_at <= now) {
				victim = e;
				break;
			}
			seen++;
		}
		e = prev;
	}
	if (victim == NULL)
		victim = s->lru.prev;
	drop(s, victim);
	__atomic_store_n(&s->evicted, s->evicted + 1, __ATOMIC_RELAXED);
	return true;
}

/* Double a shard's bucket array when its chains get long (a shard may hold more than its
 * even share of the capacity, since the capacity is global). */
static void grow(rl_cache_shard *s)
{
	size_t nb = ((size_t)s->mask + 1) * 2, i;
	entry **b = sdb_calloc(nb, sizeof(entry *));

	for (i = 0; i <= s->mask; i++) {
		entry *e = s->buckets[i];
		while (e != NULL) {
			entry *n = e->hnext;
			e->hnext = b[e->hash & (nb - 1)];
			b[e->hash & (nb - 1)] = e;
			e = n;
		}
	}
	free(s->buckets);
	s->buckets = b;
	s->mask = (uint32_t)(nb - 1);
}

rl_state *rl_cache_insert(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen,
			  int64_t now)
{
	rl_cache *c = s->cache;
	entry *e;
	entry **pp;

	/* The capacity is global: reserve a slot; while the cache is over capacity, evict from
	 * this shard, or (this shard being empty) from another shard whose lock is free. Only
	 * when every other shard is busy at that instant may the cache hold a key more than
	 * its capacity, until a later insert evicts it. */
	__atomic_fetch_add(&c->count, 1, __ATOMIC_RELAXED);
	while (__atomic_load_n(&c->count, __ATOMIC_RELAXED) > c->capacity) {
		size_t start, i;
		bool done = evict_one(s, now);
		if (!done) {
			start = __atomic_fetch_add(&c->victim, 1, __ATOMIC_RELAXED);
			for (i = 0; i < c->nshards && !done; i++) {
				rl_cache_shard *o = &c->shards[(start + i) & (c->nshards - 1)];
				if (o == s || pthread_mutex_trylock(&o->mu) != 0)
					continue;
				done = evict_one(o, now);
				pthread_mutex_unlock(&o->mu);
			}
		}
		if (!done)
			break;
	}
	if (s->count >= 2 * ((size_t)s->mask + 1) && s->mask < UINT32_MAX / 2)
		grow(s);
	e = sdb_malloc(sizeof(*e) + keylen);
	memset(e, 0, sizeof(*e));
	e->hash = hash;
	e->keylen = (uint32_t)keylen;
	memcpy(e->key, key, keylen);
	pp = &s->buckets[hash & s->mask];
	e->hnext = *pp;
	*pp = e;
	lru_push_front(s, e);
	s->count++;
	return &e->state;
}

int rl_cache_remove(rl_cache_shard *s, uint64_t hash, const char *key, size_t keylen)
{
	entry *e = *chain_slot(s, hash, key, keylen);
	if (e == NULL)
		return 0;
	drop(s, e);
	return 1;
}

void rl_cache_tally(rl_cache_shard *s, int which)
{
	if (++s->tally[which] == UINT32_MAX) {
		s->tally_hi[which] += s->tally[which];
		s->tally[which] = 0;
	}
}

void rl_cache_take_tallies(rl_cache *c, uint64_t out[RL_TALLIES])
{
	for (size_t i = 0; i < c->nshards; i++) {
		rl_cache_shard *s = &c->shards[i];
		pthread_mutex_lock(&s->mu);
		for (int k = 0; k < RL_TALLIES; k++) {
			out[k] += s->tally_hi[k] + s->tally[k];
			s->tally_hi[k] = 0;
			s->tally[k] = 0;
		}
		pthread_mutex_unlock(&s->mu);
	}
}

size_t rl_cache_size(rl_cache *c)
{
	size_t n = __atomic_load_n(&c->count, __ATOMIC_RELAXED);
	return n < c->capacity ? n : c->capacity; /* hide a reservation in progress */
}

size_t rl_cache_capacity(const rl_cache *c)
{
	return c->capacity;
}

uint64_t rl_cache_evictions(rl_cache *c)
{
	uint64_t n = 0;
	size_t i;
	for (i = 0; i < c->nshards; i++)
		n += __atomic_load_n(&c->shards[i].evicted, __ATOMIC_RELAXED);
	return n;
}
