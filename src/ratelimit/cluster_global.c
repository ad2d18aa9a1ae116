/* GLOBAL behaviour of the rate limiter's peer cluster (see cluster.h for the behaviour
 * and its sources): the hits a non-owner queues for each key's owner, the owner's
 * broadcasts of its state (PeersV1/UpdatePeerGlobals) and their installation on the
 * receiving peers. The rest of the cluster (ring, forwarding, BATCHING, the flusher
 * thread that calls cl_global_flush) is cluster.c; the shared struct is cluster_int.h. */
#include "ratelimit/cluster_int.h"

#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/metrics.h"

#define MD_NAME "name"
#define MD_UNIQUE_KEY "unique_key"
#define MD_STATE "sdb_state"

/* ---- GLOBAL maps ---- */

static cl_gent *gmap_get(cl_gmap *m, uint64_t hash, const char *name, const char *uk,
			 bool *created)
{
	cl_gent **slot = &m->buckets[hash % GMAP_BUCKETS], *e;

	for (e = *slot; e != NULL; e = e->chain)
		if (e->hash == hash && strcmp(e->name, name) == 0 && strcmp(e->uk, uk) == 0) {
			*created = false;
			return e;
		}
	e = sdb_calloc(1, sizeof(*e));
	e->hash = hash;
	e->name = sdb_strdup(name);
	e->uk = sdb_strdup(uk);
	e->chain = *slot;
	*slot = e;
	e->next = m->list;
	m->list = e;
	m->n++;
	*created = true;
	return e;
}

/* The entry of (name, uk) in m, or NULL. */
static cl_gent *gmap_find(cl_gmap *m, uint64_t hash, const char *name, const char *uk)
{
	cl_gent *e;

	for (e = m->buckets[hash % GMAP_BUCKETS]; e != NULL; e = e->chain)
		if (e->hash == hash && strcmp(e->name, name) == 0 && strcmp(e->uk, uk) == 0)
			return e;
	return NULL;
}

/* Move every entry of m into the returned list and empty m. */
static cl_gent *gmap_take(cl_gmap *m)
{
	cl_gent *list = m->list;

	memset(m, 0, sizeof(*m));
	return list;
}

static void gent_free_list(cl_gent *e)
{
	while (e != NULL) {
		cl_gent *next = e->next;
		free(e->name);
		free(e->uk);
		free(e);
		e = next;
	}
}

/* Called with cl->mu held after an insertion. */
static void global_armed(rl_cluster *cl)
{
	if (cl->g_deadline_us == 0) {
		cl->g_deadline_us = (int64_t)sdb_mono_us() + cl->sync_wait_us;
		pthread_cond_signal(&cl->cv);
	}
	if (cl->hits.n >= cl->global_batch_limit || cl->bcast.n >= cl->global_batch_limit)
		pthread_cond_signal(&cl->cv);
}

void cl_queue_bcast(rl_cluster *cl, const rl_req *r, uint64_t hash)
{
	bool created;

	cl_view *v = cl_view_get(cl);
	size_t npeers = v->n_peers;

	cl_view_put(v);
	if (npeers < 2)
		return;
	pthread_mutex_lock(&cl->mu);
	if (!cl->stopping) {
		cl_gent *e = gmap_get(&cl->bcast, hash, r->name, r->unique_key, &created);
		int64_t at = created ? r->created_at : e->req.created_at;

		/* the latest configuration, and the latest request clock seen */
		e->req = *r;
		e->req.name = e->name;
		e->req.unique_key = e->uk;
		e->req.metadata = NULL;
		e->req.n_metadata = 0;
		e->req.created_at = at > r->created_at ? at : r->created_at;
		global_armed(cl);
	}
	pthread_mutex_unlock(&cl->mu);
}

void cl_queue_hits(rl_cluster *cl, const rl_req *r, uint64_t hash, int owner)
{
	cl_gent *e;
	bool created;

	pthread_mutex_lock(&cl->mu);
	if (!cl->stopping) {
		e = gmap_get(&cl->hits, hash, r->name, r->unique_key, &created);
		if (created) {
			e->req = *r;
			e->req.hits = 0;
		}
		/* the latest configuration wins; hits add up */
		e->req.limit = r->limit;
		e->req.duration = r->duration;
		e->req.algorithm = r->algorithm;
		e->req.burst = r->burst;
		e->req.behavior = r->behavior | e->req.behavior;
		e->req.created_at = r->created_at;
		e->req.hits += r->hits;
		e->req.name = e->name;
		e->req.unique_key = e->uk;
		e->req.metadata = NULL;
		e->req.n_metadata = 0;
		e->owner = owner;
		global_armed(cl);
	}
	pthread_mutex_unlock(&cl->mu);
}

/* ---- GLOBAL sync ---- */

/* Put hits that could not be delivered back into the hits map (merged with hits queued
 * since: they add up; the newer configuration wins), so the next sync sends them to the
 * key's owner then: the next live peer clockwise while the failed one is marked dead,
 * or its successor once the ring no longer has it. Beyond global_queue_max keys queued,
 * hits are dropped and counted. Takes the list over. */
static void requeue_hits(rl_cluster *cl, cl_gent *list)
{
	uint64_t requeued = 0, dropped = 0;
	cl_gent *e;

	pthread_mutex_lock(&cl->mu);
	for (e = list; e != NULL; e = e->next) {
		cl_gent *q;
		bool created;

		if (cl->stopping || cl->hits.n >= cl->global_queue_max) {
			dropped++;
			continue;
		}
		q = gmap_get(&cl->hits, e->hash, e->name, e->uk, &created);
		if (created) {
			q->req = e->req;
			q->req.name = q->name;
			q->req.unique_key = q->uk;
		} else {
			q->req.hits += e->req.hits;
			q->req.behavior |= e->req.behavior & RL_RESET_REMAINING;
		}
		requeued++;
	}
	if (requeued > 0 && !cl->stopping)
		global_armed(cl);
	pthread_mutex_unlock(&cl->mu);
	if (requeued)
		sdb_counter_add(cl->m_global_requeued, requeued);
	if (dropped)
		sdb_counter_add(cl->m_global_dropped, dropped);
	gent_free_list(list);
}

static void global_hits_done(void *arg, int status, const uint8_t *data, size_t len,
			     const char *details)
{
	cl_batch *b = arg; /* items unused: cl, peer and the hits sent */
	cl_gent *hits = b->hits;

	(void)data;
	(void)len;
	if (status != GRPC_STATUS_OK) {
		sdb_counter_inc(b->cl->m_peer_errors);
		if (status == GRPC_STATUS_UNAVAILABLE || status == GRPC_STATUS_DEADLINE_EXCEEDED) {
			/* A deadline may hide hits the owner did apply: re-sending them counts
			 * them twice (the limit errs towards refusing), never loses them. */
			cl_mark_dead(b->cl, b->peer, details);
			requeue_hits(b->cl, hits);
			hits = NULL;
		} else if (hits != NULL) {
			size_t n = 0;
			for (cl_gent *e = hits; e != NULL; e = e->next)
				n++;
			sdb_counter_add(b->cl->m_global_dropped, n);
		}
	}
	gent_free_list(hits);
	free(b);
}

static void update_done(void *arg, int status, const uint8_t *data, size_t len,
			const char *details)
{
	cl_batch *b = arg;

	(void)data;
	(void)len;
	if (status != GRPC_STATUS_OK) {
		sdb_counter_inc(b->cl->m_peer_errors);
		if (status == GRPC_STATUS_UNAVAILABLE || status == GRPC_STATUS_DEADLINE_EXCEEDED)
			cl_mark_dead(b->cl, b->peer, details);
	}
	free(b);
}

static void send_global_hits(rl_cluster *cl, cl_conn *c, rl_req *reqs, uint64_t *hashes,
			     size_t n)
{
	Pb__Gubernator__RateLimitReq *pbs = sdb_calloc(n, sizeof(*pbs));
	cl_batch *b = sdb_calloc(1, sizeof(*b));
	size_t i;

	for (i = 0; i < n; i++)
		rl_proto_req_to_pb(&reqs[i], &pbs[i]);
	for (i = n; i-- > 0;) { /* own copies, re-queued if the call fails */
		cl_gent *e = sdb_calloc(1, sizeof(*e));
		e->hash = hashes[i];
		e->name = sdb_strdup(reqs[i].name);
		e->uk = sdb_strdup(reqs[i].unique_key);
		e->req = reqs[i];
		e->req.name = e->name;
		e->req.unique_key = e->uk;
		e->next = b->hits;
		b->hits = e;
	}
	sdb_counter_add(cl->m_global_hits, n);
	if (cl_call_get_peer(cl, c, b, pbs, n, global_hits_done) != 0) {
		requeue_hits(cl, b->hits);
		free(b);
	}
}

/* Aggregated GLOBAL hits to their owners. The owner consumes what it can:
 * DRAIN_OVER_LIMIT is set on aggregated hits, since this node has already admitted them.
 * Hits whose owner is now this node (the owner died, was marked dead or left the ring)
 * are not applied again: they were applied to this node's copy of the key when this node
 * answered them (rl_cluster_decide, the non-owner GLOBAL path), and that copy is now the
 * owner's state; the key is only queued for a broadcast of that state. Applying them
 * again counted every such hit twice (issue #23 retest). */
static void flush_hits(rl_cluster *cl, cl_gent *list)
{
	size_t n = 0, cap = 0, i;
	cl_gent *e;
	rl_req *reqs = NULL;
	uint64_t *hashes = NULL;
	int *owners = NULL;
	cl_view *v = cl_view_get(cl);

	for (e = list; e != NULL; e = e->next) {
		int owner = cl_owner_index(v, e->hash);
		e->req.behavior |= RL_DRAIN_OVER_LIMIT;
		if (owner == v->self) {
			cl_queue_bcast(cl, &e->req, e->hash);
			continue;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			reqs = sdb_realloc(reqs, cap * sizeof(*reqs));
			hashes = sdb_realloc(hashes, cap * sizeof(*hashes));
			owners = sdb_realloc(owners, cap * sizeof(*owners));
		}
		reqs[n] = e->req;
		hashes[n] = e->hash;
		owners[n] = owner;
		n++;
	}
	for (i = 0; i < v->n_peers; i++) {
		rl_req *mine;
		uint64_t *mh;
		size_t m = 0, k;

		if ((int)i == v->self)
			continue;
		mine = sdb_calloc(n ? n : 1, sizeof(*mine));
		mh = sdb_calloc(n ? n : 1, sizeof(*mh));
		for (k = 0; k < n; k++)
			if (owners[k] == (int)i) {
				mh[m] = hashes[k];
				mine[m++] = reqs[k];
			}
		for (k = 0; k < m; k += RL_MAX_BATCH)
			send_global_hits(cl, v->peers[i].c, mine + k, mh + k,
					 m - k > RL_MAX_BATCH ? RL_MAX_BATCH : m - k);
		free(mine);
		free(mh);
	}
	cl_view_put(v);
	free(reqs);
	free(hashes);
	free(owners);
}

/* The state travels in status.metadata "sdb_state" so stripedb peers install it exactly;
 * key, status, algorithm, duration and created_at are filled as Gubernator does, so a
 * Gubernator-style reader can rebuild an approximation. */
static void state_encode(const rl_state *s, char *buf, size_t n)
{
	snprintf(buf, n,
		 "%" PRId32 ",%" PRId32 ",%" PRId32 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
		 ",%.17g,%.17g,%" PRId64 ",%" PRId64 ",%" PRId64,
		 s->algorithm, s->behavior, s->status, s->limit, s->duration, s->burst,
		 s->remaining, s->remaining_f, s->tat, s->created_at, s->updated_at, s->expire_at);
}

static int state_decode(const char *buf, rl_state *s)
{
	int used = 0;

	memset(s, 0, sizeof(*s));
	if (sscanf(buf,
		   "%" SCNd32 ",%" SCNd32 ",%" SCNd32 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64
		   ",%lg,%lg,%" SCNd64 ",%" SCNd64 ",%" SCNd64 "%n",
		   &s->algorithm, &s->behavior, &s->status, &s->limit, &s->duration, &s->burst,
		   &s->remaining, &s->remaining_f, &s->tat, &s->created_at, &s->updated_at,
		   &s->expire_at, &used) != 12 ||
	    buf[used] != '\0')
		return SDB_EINVAL;
	if (!isfinite(s->remaining_f) || !isfinite(s->tat))
		return SDB_EINVAL;
	return 0;
}

typedef struct bcast_slot {
	Pb__Gubernator__UpdatePeerGlobal g;
	rl_pb_resp status;
	rl_resp resp;
	Pb__Gubernator__RateLimitResp__MetadataEntry md[3];
	Pb__Gubernator__RateLimitResp__MetadataEntry *mdp[5];
	char key[RL_MAX_KEY_LEN + 2]; /* name "_" unique_key */
	char state[400];
} bcast_slot;

static void send_updates(rl_cluster *cl, Pb__Gubernator__UpdatePeerGlobal **ptrs, size_t n)
{
	Pb__Gubernator__UpdatePeerGlobalsReq msg = PB__GUBERNATOR__UPDATE_PEER_GLOBALS_REQ__INIT;
	uint8_t *buf;
	size_t len, i;
	cl_view *v = cl_view_get(cl);
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};

	msg.n_globals = n;
	msg.globals = ptrs;
	buf = rl_proto_pack(&msg.base, &len);
	for (i = 0; i < v->n_peers; i++) {
		cl_batch *b;
		if ((int)i == v->self || !cl_peer_alive(i, &a))
			continue;
		b = sdb_calloc(1, sizeof(*b));
		b->cl = cl;
		b->peer = v->peers[i].c;
		sdb_counter_inc(cl->m_calls_update);
		if (rl_peer_call(b->peer->conn, RL_METHOD_UPDATE_PEER_GLOBALS, buf, len,
				 cl->batch_timeout_ms, update_done, b) != 0)
			free(b);
	}
	cl_view_put(v);
	free(buf);
}

static void flush_bcast(rl_cluster *cl, cl_gent *list)
{
	size_t n = 0, cap = 0, i;
	cl_gent *e;
	bcast_slot *slots = NULL;
	Pb__Gubernator__UpdatePeerGlobal **ptrs;

	for (e = list; e != NULL; e = e->next)
		cap++;
	if (cap == 0)
		return;
	slots = sdb_calloc(cap, sizeof(*slots));
	for (e = list; e != NULL; e = e->next) {
		bcast_slot *s = &slots[n];
		rl_state st;
		rl_req q = e->req;
		rl_resp qr;
		size_t m;

		/* The key's current state, read as Gubernator does with a hits=0 request on the
		 * owner at the latest request clock seen (not the wall clock: requests may carry
		 * their own created_at). */
		q.hits = 0;
		q.behavior &= ~(RL_RESET_REMAINING | RL_DRAIN_OVER_LIMIT);
		if (rl_limiter_decide_owner(cl->lim, &q, &qr, &st) != 0)
			continue;
		pb__gubernator__update_peer_global__init(&s->g);
		snprintf(s->key, sizeof(s->key), "%s_%s", e->name, e->uk);
		s->g.key = s->key;
		s->g.algorithm = (Pb__Gubernator__Algorithm)st.algorithm;
		s->g.duration = st.duration;
		s->g.created_at = st.created_at;
		s->resp = qr;
		snprintf(s->resp.owner, sizeof(s->resp.owner), "%s", cl->advertise);
		rl_proto_resp_to_pb(&s->resp, &s->status);
		/* extend the metadata: name, unique_key, sdb_state */
		state_encode(&st, s->state, sizeof(s->state));
		for (m = 0; m < s->status.msg.n_metadata; m++)
			s->mdp[m] = s->status.msg.metadata[m];
		pb__gubernator__rate_limit_resp__metadata_entry__init(&s->md[0]);
		s->md[0].key = (char *)MD_NAME;
		s->md[0].value = e->name;
		pb__gubernator__rate_limit_resp__metadata_entry__init(&s->md[1]);
		s->md[1].key = (char *)MD_UNIQUE_KEY;
		s->md[1].value = e->uk;
		pb__gubernator__rate_limit_resp__metadata_entry__init(&s->md[2]);
		s->md[2].key = (char *)MD_STATE;
		s->md[2].value = s->state;
		s->mdp[m++] = &s->md[0];
		s->mdp[m++] = &s->md[1];
		s->mdp[m++] = &s->md[2];
		s->status.msg.metadata = s->mdp;
		s->status.msg.n_metadata = m;
		s->g.status = &s->status.msg;
		n++;
	}
	ptrs = sdb_calloc(n ? n : 1, sizeof(*ptrs));
	for (i = 0; i < n; i++)
		ptrs[i] = &slots[i].g;
	for (i = 0; i < n; i += RL_MAX_BATCH)
		send_updates(cl, ptrs + i, n - i > RL_MAX_BATCH ? RL_MAX_BATCH : n - i);
	free(ptrs);
	free(slots);
}

/* After the owner's state replaced this node's copy of (name, uk): hits this node took
 * for the key and has not sent yet (still in cl->hits) are not in that state; apply them
 * to the copy again as the owner will (DRAIN_OVER_LIMIT), so the copy stays the owner's
 * state plus this node's undelivered hits. Otherwise, should this node become the key's owner before delivering them
 * (flush_hits then only broadcasts its copy), they would be lost. Hits already taken out
 * for sending are either in a later broadcast or re-queued on failure. */
static void reapply_pending(rl_cluster *cl, const char *name, const char *uk)
{
	uint64_t hash = rl_key_hash(name, uk);
	cl_gent *e;
	rl_req q;
	rl_resp out;
	char *n = NULL, *k = NULL;

	pthread_mutex_lock(&cl->mu);
	e = gmap_find(&cl->hits, hash, name, uk);
	if (e != NULL && (e->req.hits > 0 || (e->req.behavior & RL_RESET_REMAINING))) {
		q = e->req;
		n = sdb_strdup(e->name);
		k = sdb_strdup(e->uk);
	}
	pthread_mutex_unlock(&cl->mu);
	if (n == NULL)
		return;
	q.name = n;
	q.unique_key = k;
	q.behavior |= RL_DRAIN_OVER_LIMIT; /* as the owner will apply them (flush_hits) */
	rl_limiter_decide(cl->lim, &q, 1, &out, NULL, 0);
	free(n);
	free(k);
}

void rl_cluster_apply_globals(rl_cluster *cl, const Pb__Gubernator__UpdatePeerGlobalsReq *req)
{
	size_t i, m;

	for (i = 0; i < req->n_globals; i++) {
		const Pb__Gubernator__UpdatePeerGlobal *g = req->globals[i];
		const char *name = NULL, *uk = NULL, *state = NULL;
		rl_state st;

		if (g == NULL || g->status == NULL)
			goto skip;
		for (m = 0; m < g->status->n_metadata; m++) {
			const Pb__Gubernator__RateLimitResp__MetadataEntry *e = g->status->metadata[m];
			if (e == NULL || e->key == NULL || e->value == NULL)
				continue;
			if (strcmp(e->key, MD_NAME) == 0)
				name = e->value;
			else if (strcmp(e->key, MD_UNIQUE_KEY) == 0)
				uk = e->value;
			else if (strcmp(e->key, MD_STATE) == 0)
				state = e->value;
		}
		if (name == NULL || uk == NULL || state == NULL || state_decode(state, &st) != 0)
			goto skip; /* not from a stripedb peer: cannot split Gubernator's key */
		if (rl_limiter_set_state(cl->lim, name, uk, &st) != 0)
			goto skip;
		reapply_pending(cl, name, uk);
		sdb_counter_inc(cl->m_global_apply);
		continue;
	skip:
		sdb_counter_inc(cl->m_global_skip);
	}
}

/* ---- the flusher's entry points ---- */

void cl_global_flush(rl_cluster *cl)
{
	cl_gent *hits = gmap_take(&cl->hits);
	cl_gent *bcast = gmap_take(&cl->bcast);

	cl->g_deadline_us = 0;
	pthread_mutex_unlock(&cl->mu);
	/* hits first: an owner that is this node queues more broadcasts */
	flush_hits(cl, hits);
	flush_bcast(cl, bcast);
	gent_free_list(hits);
	gent_free_list(bcast);
	pthread_mutex_lock(&cl->mu);
}

void cl_global_clear(rl_cluster *cl)
{
	gent_free_list(gmap_take(&cl->hits));
	gent_free_list(gmap_take(&cl->bcast));
}
