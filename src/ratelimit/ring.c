/* Consistent hashing with virtual nodes (see ring.h). */
#include "ratelimit/ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"

typedef struct ring_point {
	uint64_t hash;
	uint32_t peer;
} ring_point;

struct rl_ring {
	size_t n_peers;
	char **peers;
	size_t n_points;
	ring_point *points; /* ascending by (hash, peer) */
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_point(const void *a, const void *b)
{
	const ring_point *x = a, *y = b;
	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	return (x->peer > y->peer) - (x->peer < y->peer);
}

uint64_t rl_ring_hash(const void *key, size_t len)
{
	return XXH64(key, len, 0);
}

int rl_ring_new(const char *const *peers, size_t n, unsigned vnodes, rl_ring **out, char *err,
		size_t errlen)
{
	rl_ring *r;
	size_t i, j;

	*out = NULL;
	if (n == 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "ring: no peers");
	if (n > RL_RING_MAX_PEERS)
		return sdb_errf(err, errlen, SDB_EINVAL, "ring: %zu peers, at most %d", n,
				RL_RING_MAX_PEERS);
	if (vnodes == 0)
		vnodes = RL_RING_DEFAULT_VNODES;
	if (vnodes > 4096)
		return sdb_errf(err, errlen, SDB_EINVAL, "ring: %u virtual nodes, at most 4096",
				vnodes);
	for (i = 0; i < n; i++)
		if (peers[i] == NULL || peers[i][0] == '\0')
			return sdb_errf(err, errlen, SDB_EINVAL, "ring: empty peer address");

	r = sdb_calloc(1, sizeof(*r));
	r->peers = sdb_calloc(n, sizeof(char *));
	for (i = 0; i < n; i++)
		r->peers[i] = sdb_strdup(peers[i]);
	sdb_qsort(r->peers, n, sizeof(char *), cmp_str);
	/* de-duplicate */
	for (i = 0, j = 0; i < n; i++) {
		if (j > 0 && strcmp(r->peers[j - 1], r->peers[i]) == 0) {
			free(r->peers[i]);
			continue;
		}
		r->peers[j++] = r->peers[i];
	}
	r->n_peers = j;

	r->n_points = r->n_peers * vnodes;
	r->points = sdb_calloc(r->n_points, sizeof(ring_point));
	for (i = 0; i < r->n_peers; i++) {
		for (j = 0; j < vnodes; j++) {
			char buf[600];
			int len = snprintf(buf, sizeof(buf), "%s#%zu", r->peers[i], j);
			if (len < 0 || (size_t)len >= sizeof(buf))
				len = (int)sizeof(buf) - 1; /* truncated: still deterministic */
			r->points[i * vnodes + j].hash = XXH64(buf, (size_t)len, 0);
			r->points[i * vnodes + j].peer = (uint32_t)i;
		}
	}
	sdb_qsort(r->points, r->n_points, sizeof(ring_point), cmp_point);
	*out = r;
	return 0;
}

void rl_ring_free(rl_ring *r)
{
	size_t i;

	if (r == NULL)
		return;
	for (i = 0; i < r->n_peers; i++)
		free(r->peers[i]);
	free(r->peers);
	free(r->points);
	free(r);
}

size_t rl_ring_size(const rl_ring *r)
{
	return r->n_peers;
}

const char *rl_ring_peer(const rl_ring *r, size_t idx)
{
	return idx < r->n_peers ? r->peers[idx] : NULL;
}

int rl_ring_find(const rl_ring *r, const char *addr)
{
	size_t i;

	for (i = 0; i < r->n_peers; i++)
		if (strcmp(r->peers[i], addr) == 0)
			return (int)i;
	return -1;
}

int rl_ring_owner(const rl_ring *r, uint64_t h, bool (*alive)(size_t idx, void *arg),
		  void *arg)
{
	size_t lo = 0, hi = r->n_points, k, start;

	/* first point with hash >= h */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r->points[mid].hash < h)
			lo = mid + 1;
		else
			hi = mid;
	}
	start = lo == r->n_points ? 0 : lo;
	if (alive == NULL)
		return (int)r->points[start].peer;
	for (k = 0; k < r->n_points; k++) {
		const ring_point *p = &r->points[(start + k) % r->n_points];
		if (alive(p->peer, arg))
			return (int)p->peer;
	}
	return -1;
}
