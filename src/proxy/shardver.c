/* Shard versions on proxy requests (issue #17; the shard side is src/shard/filtering.c).
 *
 * A request for a sharded collection goes ONCE to each target shard with
 *   $stripedbShardVersion: {ns, collectionVersion, shardVersion}
 * where collectionVersion is the largest chunk token of the collection and shardVersion the
 * largest token over the chunks this snapshot routes to that shard (MongoDB's
 * ShardVersion: one version per shard and collection, not one per chunk, so the request
 * does not grow with the chunk count). The shard checks them in the command's transaction
 * (StaleConfig 13388 when they differ from what it has installed: the caller refreshes its
 * routing and retries through px_retry) and drops the documents it does not own (orphans),
 * so the proxy keeps every document the shard returns.
 *
 * A shard without filtering metadata for the collection (installed by a proxy's
 * shardCollection, by the coordinator at migrations and by its reconciler; missing for a
 * collection sharded through metadata directly, for a rebuilt shard, or after a failed
 * install, until the reconciler's next pass) answers StaleConfig with
 * vWanted: null; the proxy then remembers (shard, ns) at that routing version and uses the
 * per-chunk requests with the ownership filter for it (DESIGN.md §5) until the collection's
 * routing changes or PX_LEGACY_RECHECK_MS pass, whichever comes first: then the next
 * request probes the shard with its version again (a coordinator's reconciler,
 * src/coordinator/reconcile.h, installs what shards lack without changing the routing). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "proxy/exec.h"

/* (ns, shard) pairs without filtering metadata, one per slot of a direct-mapped table
 * (a collision forgets the older pair: one more probe of that shard, never a wrong answer) */
#define LEGACY_SLOTS 4096
/* How long a (ns, shard) pair stays on per-chunk requests before the next probe (ms): one
 * StaleConfig round trip per pair this often on a shard that really lacks the metadata. */
#define PX_LEGACY_RECHECK_MS 30000

typedef struct legacy_ent {
	char *ns, *shard;
	int64_t version;
	uint64_t until_ms; /* monotonic: probe again from then on */
} legacy_ent;

static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;
static legacy_ent legacy[LEGACY_SLOTS];

static size_t legacy_slot(const char *ns, const char *shard)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a: a table index, not security */
	const char *p;

	for (p = ns; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ULL;
	h = (h ^ 0xff) * 1099511628211ULL;
	for (p = shard; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ULL;
	return (size_t)(h % LEGACY_SLOTS);
}

void px_shard_version_of(const route_coll *rc, const char *shard, int64_t *cver, int64_t *sver)
{
	const route_shard *s = route_shard_find(rc, shard);

	*cver = rc->max_token;
	*sver = s ? s->version : 0;
}

void px_append_shard_version(bson_t *cmd, const route_coll *rc, const char *shard)
{
	bson_t v;
	int64_t cver, sver;

	px_shard_version_of(rc, shard, &cver, &sver);
	bson_append_document_begin(cmd, "$stripedbShardVersion", -1, &v);
	BSON_APPEND_UTF8(&v, "ns", rc->ns);
	BSON_APPEND_INT64(&v, "collectionVersion", cver);
	BSON_APPEND_INT64(&v, "shardVersion", sver);
	bson_append_document_end(cmd, &v);
}

bool px_shard_mode(const route_coll *rc, const char *shard)
{
	legacy_ent *e = &legacy[legacy_slot(rc->ns, shard)];
	bool on = true;

	pthread_mutex_lock(&legacy_mu);
	if (e->ns && e->version == rc->version && strcmp(e->ns, rc->ns) == 0 &&
	    strcmp(e->shard, shard) == 0 && sdb_mono_ms() < e->until_ms)
		on = false;
	pthread_mutex_unlock(&legacy_mu);
	return on;
}

bool px_shard_mode_note(const route_coll *rc, const char *shard, const bson_t *err_reply)
{
	bson_iter_t it;
	legacy_ent *e;

	if (!bson_iter_init_find(&it, err_reply, "vWanted") || !BSON_ITER_HOLDS_NULL(&it))
		return false;
	if (!px_shard_mode(rc, shard))
		return true;
	e = &legacy[legacy_slot(rc->ns, shard)];
	pthread_mutex_lock(&legacy_mu);
	free(e->ns);
	free(e->shard);
	e->ns = sdb_strdup(rc->ns);
	e->shard = sdb_strdup(shard);
	e->version = rc->version;
	e->until_ms = sdb_mono_ms() + PX_LEGACY_RECHECK_MS;
	pthread_mutex_unlock(&legacy_mu);
	return true;
}

bool px_shard_mode_memo(px_mode_memo *m, const route_coll *rc, size_t ci, ssize_t *slot)
{
	size_t s = rc->shard_of[ci];

	if (s >= PX_MODE_MEMO) {
		*slot = -1;
		return px_shard_mode(rc, rc->chunks[ci].shard);
	}
	if (!m->known[s]) {
		m->known[s] = true;
		m->on[s] = px_shard_mode(rc, rc->shards[s].id);
		m->stream[s] = -1;
	}
	*slot = (ssize_t)s;
	return m->on[s];
}

size_t px_stream_bound(px_mode_memo *m, const route_coll *rc, const bool *sel, bool per_chunk)
{
	size_t i, n = 0;
	size_t *cnt;

	if (per_chunk || rc->nshards == 0) {
		for (i = 0; i < rc->nchunks; i++)
			n += sel[i];
		return n;
	}
	cnt = sdb_calloc(rc->nshards, sizeof *cnt);
	for (i = 0; i < rc->nchunks; i++)
		cnt[rc->shard_of[i]] += sel[i];
	for (i = 0; i < rc->nshards; i++) {
		if (cnt[i] == 0)
			continue;
		if (i >= PX_MODE_MEMO) { /* asked again per chunk: may change, count them all */
			n += cnt[i];
			continue;
		}
		if (!m->known[i]) {
			m->known[i] = true;
			m->on[i] = px_shard_mode(rc, rc->shards[i].id);
			m->stream[i] = -1;
		}
		n += m->on[i] ? 1 : cnt[i];
	}
	free(cnt);
	return n;
}
