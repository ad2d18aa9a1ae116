/* Owner lookup, forwarding, BATCHING and GLOBAL sync between rate-limit peers (see
 * cluster.h for the behaviour and its sources).
 *
 * Why one file of ~1,500 lines: its sections (jobs, configuration, ring and liveness,
 * forwarding, GLOBAL sync, the flusher thread, ring views) all work on the one private
 * rl_cluster struct (its ring view under view_mu, its queues and GLOBAL maps under mu),
 * defined once, here. */
#include "ratelimit/cluster.h"

#include <ctype.h>
#include <errno.h>
#include <grpc/status.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "ratelimit/peers.h"
#include "ratelimit/proto.h"
#include "ratelimit/ring.h"

#define GMAP_BUCKETS 1024
#define MD_NAME "name"
#define MD_UNIQUE_KEY "unique_key"
#define MD_STATE "sdb_state"

/* ---- jobs: one rl_cluster_decide_async call ---- */

typedef struct cl_job {
	atomic_size_t pending; /* items in flight + 1 while the call is being set up */
	rl_resp *out;
	rl_cluster_done_fn done;
	void *arg;
} cl_job;

/* One request that left (or may leave) this node. */
typedef struct cl_item {
	cl_job *job;
	size_t idx;
	rl_req req; /* name and unique_key point into the item's own copies */
	char *name;
	char *uk;
	uint64_t hash;
	int attempts;
	struct cl_item *next;
} cl_item;

/* One peer address this node has known, for the cluster's lifetime (so an address
 * string or connection handed out stays valid across ring changes). */
typedef struct cl_conn {
	char *addr;
	rl_peer *conn;                 /* NULL for self */
	_Atomic int64_t dead_until_ms; /* CLOCK_MONOTONIC ms; the peer is skipped until then */
	struct cl_conn *next;
} cl_conn;

/* A peer in one ring view. */
typedef struct cl_peer {
	cl_conn *c;
	bool self;
	cl_item *q_head, *q_tail; /* BATCHING queue, under cl->mu (current view only) */
	size_t q_len;
	int64_t q_deadline_us;
} cl_peer;

/* One immutable ring and its peers. The current view is cl->view (swapped under cl->mu
 * and cl->view_mu by rl_cluster_set_peers); readers hold a reference (view_get/put), so
 * a view is freed when the last reader is done. Only the current view's queues hold
 * items: a swap moves them to the new view's owners. */
typedef struct cl_view {
	atomic_int refs;
	uint64_t version; /* membership version it was built from (0: static --peers) */
	rl_ring *ring;
	cl_peer *peers; /* indexed like the ring */
	size_t n_peers;
	int self;
} cl_view;

/* GLOBAL bookkeeping: one entry per key in a chained hash map (insertion list too). */
typedef struct cl_gent {
	uint64_t hash;
	char *name;
	char *uk;
	rl_req req; /* hits map: the aggregated request */
	int owner;  /* hits map: ring index of the owner when queued */
	struct cl_gent *chain;
	struct cl_gent *next;
} cl_gent;

typedef struct cl_gmap {
	cl_gent *buckets[GMAP_BUCKETS];
	cl_gent *list;
	size_t n;
} cl_gmap;

struct rl_cluster {
	rl_limiter *lim;
	cl_view *view;            /* current ring; under view_mu (and cl->mu to swap) */
	pthread_mutex_t view_mu;
	cl_conn *conns;           /* every address ever in a view; under view_mu */
	unsigned vnodes;
	char *advertise;
	int64_t batch_wait_us;
	size_t batch_limit;
	int64_t batch_timeout_ms;
	int64_t sync_wait_us;
	size_t global_batch_limit;
	int64_t dead_ms;
	rl_clock_fn clock;
	void *clock_data;

	rl_peers *client;
	pthread_t flusher;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
	cl_gmap hits;  /* GLOBAL hits queued for owners (non-owner side) */
	cl_gmap bcast; /* GLOBAL keys to broadcast (owner side) */
	int64_t g_deadline_us;

	sdb_counter *m_calls_get;    /* peer calls GetPeerRateLimits sent */
	sdb_counter *m_calls_update; /* peer calls UpdatePeerGlobals sent */
	sdb_counter *m_forwarded;    /* requests forwarded to owners */
	sdb_counter *m_local;        /* requests decided here as owner */
	sdb_counter *m_rerouted;     /* requests re-routed after a peer failure */
	sdb_counter *m_peer_errors;  /* failed peer calls */
	sdb_counter *m_global_hits;  /* GLOBAL keys whose hits were sent to an owner */
	sdb_counter *m_global_apply; /* UpdatePeerGlobal entries installed */
	sdb_counter *m_global_skip;  /* UpdatePeerGlobal entries skipped (unreadable) */
	sdb_counter *m_global_requeued; /* GLOBAL keys re-queued after their owner failed */
	sdb_counter *m_global_dropped;  /* GLOBAL keys whose hits were dropped */
	sdb_counter *m_ring_changes;    /* ring views installed by rl_cluster_set_peers */
	size_t global_queue_max;        /* keys in cl->hits beyond which hits are dropped */
};

static const sdb_metric_def cluster_metrics[] = {
	SDB_METRIC_COUNTER_L(rl_cluster, m_calls_get, "stripedb_ratelimit_peer_calls_total",
			     "gRPC calls sent to rate-limit peers", "method=\"GetPeerRateLimits\""),
	SDB_METRIC_COUNTER_L(rl_cluster, m_calls_update, "stripedb_ratelimit_peer_calls_total",
			     "gRPC calls sent to rate-limit peers", "method=\"UpdatePeerGlobals\""),
	SDB_METRIC_COUNTER(rl_cluster, m_forwarded, "stripedb_ratelimit_forwarded_requests_total",
			   "rate-limit requests forwarded to their owner peer"),
	SDB_METRIC_COUNTER(rl_cluster, m_local, "stripedb_ratelimit_owner_decisions_total",
			   "rate-limit requests decided on this node as owner"),
	SDB_METRIC_COUNTER(rl_cluster, m_rerouted, "stripedb_ratelimit_rerouted_requests_total",
			   "rate-limit requests re-routed to the next owner after a peer failure"),
	SDB_METRIC_COUNTER(rl_cluster, m_peer_errors, "stripedb_ratelimit_peer_errors_total",
			   "failed gRPC calls to rate-limit peers"),
	SDB_METRIC_COUNTER(rl_cluster, m_global_hits, "stripedb_ratelimit_global_hits_sent_total",
			   "GLOBAL keys whose aggregated hits went to their owner"),
	SDB_METRIC_COUNTER_L(rl_cluster, m_global_apply, "stripedb_ratelimit_global_updates_total",
			     "UpdatePeerGlobals entries received, by result", "result=\"applied\""),
	SDB_METRIC_COUNTER_L(rl_cluster, m_global_skip, "stripedb_ratelimit_global_updates_total",
			     "UpdatePeerGlobals entries received, by result", "result=\"skipped\""),
	SDB_METRIC_COUNTER(rl_cluster, m_global_requeued,
		"stripedb_ratelimit_global_hits_requeued_total",
		"GLOBAL keys whose hits were queued again after their owner failed"),
	SDB_METRIC_COUNTER(rl_cluster, m_global_dropped,
		"stripedb_ratelimit_global_hits_dropped_total",
		"GLOBAL keys whose aggregated hits were dropped (queue full, refused, stopping)"),
	SDB_METRIC_COUNTER(rl_cluster, m_ring_changes, "stripedb_ratelimit_ring_changes_total",
			   "peer rings installed after a membership change"),
};


/* ---- configuration ---- */

int rl_parse_go_duration(const char *s, int64_t *out_us)
{
	static const struct {
		const char *unit;
		double us;
	} units[] = {
		{"ns", 0.001}, {"us", 1}, {"\xc2\xb5s", 1}, {"\xce\xbcs", 1}, {"ms", 1000},
		{"s", 1e6},    {"m", 6e7}, {"h", 3.6e9},
	};
	double total = 0;
	const char *p = s;

	if (s == NULL || *s == '\0')
		return SDB_EINVAL;
	if (strcmp(s, "0") == 0) {
		*out_us = 0;
		return 0;
	}
	while (*p) {
		char *end;
		double v;
		size_t k, best = 0, best_len = 0;

		if (!isdigit((unsigned char)*p) && *p != '.')
			return SDB_EINVAL;
		errno = 0;
		v = strtod(p, &end);
		if (end == p || errno != 0 || v < 0)
			return SDB_EINVAL;
		p = end;
		for (k = 0; k < sizeof(units) / sizeof(units[0]); k++) {
			size_t l = strlen(units[k].unit);
			if (strncmp(p, units[k].unit, l) == 0 && l > best_len) {
				best = k;
				best_len = l;
			}
		}
		if (best_len == 0)
			return SDB_EINVAL;
		/* "m" must not swallow "ms": longest match above handles it */
		total += v * units[best].us;
		p += best_len;
	}
	if (total > 9.2e15)
		return SDB_EINVAL;
	*out_us = (int64_t)total;
	return 0;
}

static int env_duration(const char *var, int64_t *dst_us, char *err, size_t errlen)
{
	const char *v = getenv(var);

	if (v == NULL || *v == '\0' || *dst_us != 0)
		return 0;
	if (rl_parse_go_duration(v, dst_us) != 0)
		return sdb_errf(err, errlen, SDB_EUSAGE, "%s: bad duration '%s' (e.g. 500us, 100ms)",
				var, v);
	return 0;
}

static int env_int(const char *var, int64_t *dst, char *err, size_t errlen)
{
	const char *v = getenv(var);
	char *end;
	long long n;

	if (v == NULL || *v == '\0' || *dst != 0)
		return 0;
	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno != 0 || *end != '\0' || n <= 0 || n > RL_MAX_BATCH)
		return sdb_errf(err, errlen, SDB_EUSAGE, "%s: '%s' is not an integer in 1..%d", var,
				v, RL_MAX_BATCH);
	*dst = n;
	return 0;
}

int rl_cluster_opts_from_env(rl_cluster_opts *o, char *err, size_t errlen)
{
	int rv;
	int64_t ms_us = 0;

	if ((rv = env_duration("GUBER_BATCH_WAIT", &o->batch_wait_us, err, errlen)) != 0)
		return rv;
	if ((rv = env_duration("GUBER_GLOBAL_SYNC_WAIT", &o->global_sync_wait_us, err, errlen)) != 0)
		return rv;
	if (o->batch_timeout_ms == 0) {
		if ((rv = env_duration("GUBER_BATCH_TIMEOUT", &ms_us, err, errlen)) != 0)
			return rv;
		if (ms_us > 0)
			o->batch_timeout_ms = ms_us < 1000 ? 1 : ms_us / 1000;
	}
	if ((rv = env_int("GUBER_BATCH_LIMIT", &o->batch_limit, err, errlen)) != 0)
		return rv;
	if ((rv = env_int("GUBER_GLOBAL_BATCH_LIMIT", &o->global_batch_limit, err, errlen)) != 0)
		return rv;
	return 0;
}

/* ---- ring and liveness ---- */

typedef struct alive_ctx {
	cl_view *v;
	int64_t now_ms;
} alive_ctx;

static bool peer_alive(size_t idx, void *arg)
{
	alive_ctx *a = arg;
	cl_peer *p = &a->v->peers[idx];

	return p->self || atomic_load(&p->c->dead_until_ms) <= a->now_ms;
}

static cl_view *view_get(rl_cluster *cl)
{
	cl_view *v;

	pthread_mutex_lock(&cl->view_mu);
	v = cl->view;
	atomic_fetch_add(&v->refs, 1);
	pthread_mutex_unlock(&cl->view_mu);
	return v;
}

static void view_put(cl_view *v)
{
	if (v == NULL || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	rl_ring_free(v->ring);
	free(v->peers);
	free(v);
}

static int owner_index(cl_view *v, uint64_t hash)
{
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};
	int o = rl_ring_owner(v->ring, hash, peer_alive, &a);

	return o < 0 ? v->self : o;
}

static void mark_dead(rl_cluster *cl, cl_conn *p, const char *why)
{
	int64_t until = (int64_t)sdb_mono_us() / 1000 + cl->dead_ms;
	int64_t prev = atomic_exchange(&p->dead_until_ms, until);
	char q[200];

	if (prev <= (int64_t)sdb_mono_us() / 1000)
		sdb_warn("peer unreachable, its keys move to the next owner", "peer=%s error=%s "
			 "retry_after_ms=%" PRId64, p->addr, sdb_logq(q, sizeof q, why), cl->dead_ms);
}

/* ---- jobs and items ---- */

static void job_release(cl_job *job)
{
	if (atomic_fetch_sub(&job->pending, 1) == 1) {
		job->done(job->arg);
		free(job);
	}
}

static void item_free(cl_item *it)
{
	free(it->name);
	free(it->uk);
	free(it);
}

static void item_done(cl_item *it)
{
	cl_job *job = it->job;

	item_free(it);
	job_release(job);
}

static void item_fail(cl_item *it, const char *fmt, const char *a, const char *b)
{
	rl_resp *r = &it->job->out[it->idx];

	memset(r, 0, sizeof(*r));
	snprintf(r->error, sizeof(r->error), fmt, a, b);
	item_done(it);
}

static cl_item *item_new(cl_job *job, size_t idx, const rl_req *r, uint64_t hash)
{
	cl_item *it = sdb_calloc(1, sizeof(*it));

	it->job = job;
	it->idx = idx;
	it->req = *r;
	it->name = sdb_strdup(r->name);
	it->uk = sdb_strdup(r->unique_key);
	it->req.name = it->name;
	it->req.unique_key = it->uk;
	it->req.metadata = NULL;
	it->req.n_metadata = 0;
	it->hash = hash;
	return it;
}

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

static void queue_bcast(rl_cluster *cl, const rl_req *r, uint64_t hash)
{
	bool created;

	cl_view *v = view_get(cl);
	size_t npeers = v->n_peers;

	view_put(v);
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

static void queue_hits(rl_cluster *cl, const rl_req *r, uint64_t hash, int owner)
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

/* ---- deciding here ---- */

/* Decide r on this node as the key's owner. */
static void decide_here(rl_cluster *cl, const rl_req *r, uint64_t hash, rl_resp *out)
{
	if (r->behavior & RL_GLOBAL) {
		rl_state st;
		if (rl_limiter_decide_owner(cl->lim, r, out, &st) == 0)
			queue_bcast(cl, r, hash);
	} else {
		rl_limiter_decide(cl->lim, r, 1, out, NULL, 0);
	}
	if (out->error[0] == '\0')
		snprintf(out->owner, sizeof(out->owner), "%s", cl->advertise);
	sdb_counter_inc(cl->m_local);
}

/* ---- forwarding ---- */

typedef struct cl_batch {
	rl_cluster *cl;
	cl_conn *peer;
	size_t n;
	cl_item **items;
	cl_gent *hits; /* GLOBAL hits sent (own copies), re-queued if the owner fails */
} cl_batch;

static void route_item(rl_cluster *cl, cl_item *it);

static void batch_done(void *arg, int status, const uint8_t *data, size_t len,
		       const char *details)
{
	cl_batch *b = arg;
	rl_cluster *cl = b->cl;
	cl_conn *p = b->peer;
	size_t i;

	if (status == GRPC_STATUS_OK) {
		Pb__Gubernator__GetPeerRateLimitsResp *resp =
			pb__gubernator__get_peer_rate_limits_resp__unpack(NULL, len, data);
		if (resp == NULL || resp->n_rate_limits != b->n) {
			sdb_counter_inc(cl->m_peer_errors);
			for (i = 0; i < b->n; i++)
				item_fail(b->items[i], "peer %s answered a batch with %s",
					  p->addr, resp == NULL ? "malformed protobuf"
								: "a wrong number of answers");
		} else {
			for (i = 0; i < b->n; i++) {
				rl_resp *out = &b->items[i]->job->out[b->items[i]->idx];
				rl_proto_resp_from_pb(resp->rate_limits[i], out);
				if (out->owner[0] == '\0' && out->error[0] == '\0')
					snprintf(out->owner, sizeof(out->owner), "%s", p->addr);
				item_done(b->items[i]);
			}
		}
		if (resp != NULL)
			pb__gubernator__get_peer_rate_limits_resp__free_unpacked(resp, NULL);
	} else {
		bool stopping;

		sdb_counter_inc(cl->m_peer_errors);
		pthread_mutex_lock(&cl->mu);
		stopping = cl->stopping;
		pthread_mutex_unlock(&cl->mu);
		if (!stopping &&
		    (status == GRPC_STATUS_UNAVAILABLE || status == GRPC_STATUS_DEADLINE_EXCEEDED)) {
			mark_dead(cl, b->peer, details);
			for (i = 0; i < b->n; i++) {
				b->items[i]->attempts++;
				sdb_counter_inc(cl->m_rerouted);
				route_item(cl, b->items[i]);
			}
		} else {
			for (i = 0; i < b->n; i++)
				item_fail(b->items[i],
					  "error while fetching rate limit from peer %s: %s", p->addr,
					  stopping ? "rate limiter shutting down" : details);
		}
	}
	free(b->items);
	free(b);
}

/* One GetPeerRateLimits call of the n requests pbs (filled by rl_proto_req_to_pb; the array
 * is taken over) to peer p for batch b, which gets cl and p; done(b, ...) gets the answer.
 * Returns rl_peer_call's status: when it is not 0, done never fires and b is the caller's. */
static int call_get_peer(rl_cluster *cl, cl_conn *p, cl_batch *b,
			 Pb__Gubernator__RateLimitReq *pbs, size_t n, rl_peer_cb done)
{
	Pb__Gubernator__GetPeerRateLimitsReq msg = PB__GUBERNATOR__GET_PEER_RATE_LIMITS_REQ__INIT;
	Pb__Gubernator__RateLimitReq **ptrs = sdb_calloc(n, sizeof(*ptrs));
	uint8_t *buf;
	size_t len, i;
	int rv;

	for (i = 0; i < n; i++)
		ptrs[i] = &pbs[i];
	msg.n_requests = n;
	msg.requests = ptrs;
	buf = rl_proto_pack(&msg.base, &len);
	free(ptrs);
	free(pbs);
	b->cl = cl;
	b->peer = p;
	sdb_counter_inc(cl->m_calls_get);
	rv = rl_peer_call(p->conn, RL_METHOD_GET_PEER_RATE_LIMITS, buf, len, cl->batch_timeout_ms,
			  done, b);
	free(buf);
	return rv;
}

/* Send n items (taken over) to peer p in one GetPeerRateLimits call. */
static void send_batch(rl_cluster *cl, cl_conn *p, cl_item **items, size_t n)
{
	Pb__Gubernator__RateLimitReq *pbs = sdb_calloc(n, sizeof(*pbs));
	cl_batch *b = sdb_calloc(1, sizeof(*b));
	size_t i;
	int rv;

	for (i = 0; i < n; i++)
		rl_proto_req_to_pb(&items[i]->req, &pbs[i]);
	b->n = n;
	b->items = items;
	sdb_counter_add(cl->m_forwarded, n);
	rv = call_get_peer(cl, p, b, pbs, n, batch_done);
	if (rv != 0) {
		for (i = 0; i < n; i++)
			item_fail(items[i], "error while fetching rate limit from peer %s: %s",
				  p->addr, sdb_strerror(rv));
		free(items);
		free(b);
	}
}

/* Send it to its owner now (NO_BATCHING), queue it for its owner (BATCHING) or decide
 * it here when this node is (now) the owner. Takes it over. */
static void route_item(rl_cluster *cl, cl_item *it)
{
	cl_view *v;
	int owner;
	cl_peer *p;

again:
	v = view_get(cl);
	owner = owner_index(v, it->hash);
	if (owner == v->self || it->attempts > (int)v->n_peers) {
		view_put(v);
		decide_here(cl, &it->req, it->hash, &it->job->out[it->idx]);
		item_done(it);
		return;
	}
	p = &v->peers[owner];
	if (it->req.behavior & RL_NO_BATCHING) {
		cl_item **one = sdb_malloc(sizeof(*one));
		cl_conn *c = p->c;
		view_put(v);
		one[0] = it;
		send_batch(cl, c, one, 1);
		return;
	}
	pthread_mutex_lock(&cl->mu);
	if (cl->stopping) {
		pthread_mutex_unlock(&cl->mu);
		item_fail(it, "error while fetching rate limit from peer %s: %s", p->c->addr,
			  "rate limiter shutting down");
		view_put(v);
		return;
	}
	if (v != cl->view) {
		/* the ring changed meanwhile: its queues were moved; route on the new one */
		pthread_mutex_unlock(&cl->mu);
		view_put(v);
		goto again;
	}
	it->next = NULL;
	if (p->q_tail)
		p->q_tail->next = it;
	else
		p->q_head = it;
	p->q_tail = it;
	p->q_len++;
	if (p->q_len == 1) {
		p->q_deadline_us = (int64_t)sdb_mono_us() + cl->batch_wait_us;
		pthread_cond_signal(&cl->cv);
	} else if (p->q_len >= cl->batch_limit) {
		pthread_cond_signal(&cl->cv);
	}
	pthread_mutex_unlock(&cl->mu);
	view_put(v);
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
			mark_dead(b->cl, b->peer, details);
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
			mark_dead(b->cl, b->peer, details);
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
	if (call_get_peer(cl, c, b, pbs, n, global_hits_done) != 0) {
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
	cl_view *v = view_get(cl);

	for (e = list; e != NULL; e = e->next) {
		int owner = owner_index(v, e->hash);
		e->req.behavior |= RL_DRAIN_OVER_LIMIT;
		if (owner == v->self) {
			queue_bcast(cl, &e->req, e->hash);
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
	view_put(v);
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
	cl_view *v = view_get(cl);
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};

	msg.n_globals = n;
	msg.globals = ptrs;
	buf = rl_proto_pack(&msg.base, &len);
	for (i = 0; i < v->n_peers; i++) {
		cl_batch *b;
		if ((int)i == v->self || !peer_alive(i, &a))
			continue;
		b = sdb_calloc(1, sizeof(*b));
		b->cl = cl;
		b->peer = v->peers[i].c;
		sdb_counter_inc(cl->m_calls_update);
		if (rl_peer_call(b->peer->conn, RL_METHOD_UPDATE_PEER_GLOBALS, buf, len,
				 cl->batch_timeout_ms, update_done, b) != 0)
			free(b);
	}
	view_put(v);
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

/* ---- the flusher thread ---- */

static void *flusher_main(void *arg)
{
	rl_cluster *cl = arg;

	sdb_log_set_thread("ratelimit", NULL);
	pthread_mutex_lock(&cl->mu);
	while (!cl->stopping) {
		int64_t now = (int64_t)sdb_mono_us(), next = now + 1000000;
		size_t i;
		bool worked = false;
		cl_view *v = view_get(cl);

		for (i = 0; i < v->n_peers && v == cl->view; i++) {
			cl_peer *p = &v->peers[i];
			if (p->q_len == 0)
				continue;
			if (p->q_len >= cl->batch_limit || now >= p->q_deadline_us) {
				size_t n = p->q_len < cl->batch_limit ? p->q_len : cl->batch_limit, k;
				cl_item **items = sdb_calloc(n, sizeof(*items));
				for (k = 0; k < n; k++) {
					items[k] = p->q_head;
					p->q_head = p->q_head->next;
				}
				p->q_len -= n;
				if (p->q_head == NULL)
					p->q_tail = NULL;
				pthread_mutex_unlock(&cl->mu);
				send_batch(cl, p->c, items, n);
				pthread_mutex_lock(&cl->mu);
				worked = true;
			} else if (p->q_deadline_us < next) {
				next = p->q_deadline_us;
			}
		}
		if (v != cl->view)
			worked = true; /* the ring changed while sending: look again */
		view_put(v);
		if (cl->hits.n > 0 || cl->bcast.n > 0) {
			if (now >= cl->g_deadline_us || cl->hits.n >= cl->global_batch_limit ||
			    cl->bcast.n >= cl->global_batch_limit) {
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
				worked = true;
			} else if (cl->g_deadline_us < next) {
				next = cl->g_deadline_us;
			}
		}
		if (!worked && !cl->stopping)
			sdb_cond_wait_until_us(&cl->cv, &cl->mu, (uint64_t)next);
	}
	pthread_mutex_unlock(&cl->mu);
	return NULL;
}

/* ---- ring views ---- */

static void conns_free(rl_cluster *cl)
{
	cl_conn *c, *next;

	for (c = cl->conns; c != NULL; c = next) {
		next = c->next;
		free(c->addr);
		free(c); /* the channel belongs to cl->client */
	}
	cl->conns = NULL;
}

/* The connection record of addr, created (and connected, unless it is this node) on
 * first use. Called with cl->view_mu held. */
static cl_conn *conn_for(rl_cluster *cl, const char *addr)
{
	cl_conn *c;

	for (c = cl->conns; c != NULL; c = c->next)
		if (strcmp(c->addr, addr) == 0)
			return c;
	c = sdb_calloc(1, sizeof(*c));
	c->addr = sdb_strdup(addr);
	atomic_init(&c->dead_until_ms, 0);
	if (strcmp(addr, cl->advertise) != 0)
		c->conn = rl_peers_connect(cl->client, addr);
	c->next = cl->conns;
	cl->conns = c;
	return c;
}

/* A view over addrs plus this node (duplicates merged). */
static int view_build(rl_cluster *cl, const char *const *addrs, size_t n, uint64_t version,
		      cl_view **out, char *err, size_t errlen)
{
	const char **all = sdb_calloc(n + 1, sizeof(*all));
	cl_view *v = sdb_calloc(1, sizeof(*v));
	size_t i, k = 0;
	int rv;

	for (i = 0; i < n; i++)
		all[k++] = addrs[i];
	all[k++] = cl->advertise;
	rv = rl_ring_new(all, k, cl->vnodes, &v->ring, err, errlen);
	free(all);
	if (rv != 0) {
		free(v);
		return rv;
	}
	atomic_init(&v->refs, 1);
	v->version = version;
	v->n_peers = rl_ring_size(v->ring);
	v->self = rl_ring_find(v->ring, cl->advertise);
	v->peers = sdb_calloc(v->n_peers, sizeof(*v->peers));
	pthread_mutex_lock(&cl->view_mu);
	for (i = 0; i < v->n_peers; i++) {
		v->peers[i].c = conn_for(cl, rl_ring_peer(v->ring, i));
		v->peers[i].self = (int)i == v->self;
	}
	pthread_mutex_unlock(&cl->view_mu);
	*out = v;
	return 0;
}

/* Take every item queued in v's peer queues (cl->mu held). */
static cl_item *view_take_queued(cl_view *v)
{
	cl_item *queued = NULL;

	for (size_t i = 0; i < v->n_peers; i++) {
		cl_peer *p = &v->peers[i];
		if (p->q_tail) {
			p->q_tail->next = queued;
			queued = p->q_head;
		}
		p->q_head = p->q_tail = NULL;
		p->q_len = 0;
	}
	return queued;
}

int rl_cluster_set_peers(rl_cluster *cl, const char *const *peers, size_t n, uint64_t version,
			 char *err, size_t errlen)
{
	cl_view *v, *old;
	cl_item *queued, *it, *next;
	size_t i;
	int rv;
	bool same;
	char list[512];
	size_t off = 0;

	rv = view_build(cl, peers, n, version, &v, err, errlen);
	if (rv != 0)
		return rv;
	pthread_mutex_lock(&cl->mu);
	if (cl->stopping) {
		pthread_mutex_unlock(&cl->mu);
		view_put(v);
		return SDB_ECANCELED;
	}
	old = cl->view;
	same = old->n_peers == v->n_peers;
	for (i = 0; same && i < v->n_peers; i++)
		same = old->peers[i].c == v->peers[i].c;
	if (same) {
		/* same ring: keep the queues where they are */
		__atomic_store_n(&old->version, version, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&cl->mu);
		view_put(v);
		return 0;
	}
	queued = view_take_queued(old);
	pthread_mutex_lock(&cl->view_mu);
	cl->view = v;
	pthread_mutex_unlock(&cl->view_mu);
	pthread_cond_signal(&cl->cv);
	pthread_mutex_unlock(&cl->mu);
	for (i = 0; i < v->n_peers && off < sizeof list; i++) {
		int w = snprintf(list + off, sizeof list - off, "%s%s", i ? "," : "",
				 v->peers[i].c->addr);
		if (w > 0)
			off += (size_t)w;
	}
	sdb_info("ratelimit ring changed", "version=%" PRIu64 " peers=%zu members=%s", version,
		 v->n_peers, list);
	sdb_counter_inc(cl->m_ring_changes);
	view_put(old);
	/* queued requests go to their owner on the new ring (Gubernator: keys move to their
	 * new owner, which starts without their state) */
	for (it = queued; it != NULL; it = next) {
		next = it->next;
		route_item(cl, it);
	}
	return 0;
}

size_t rl_cluster_members(rl_cluster *cl, rl_member *out, size_t max, uint64_t *version)
{
	cl_view *v = view_get(cl);
	int64_t now = (int64_t)sdb_mono_us() / 1000;
	size_t i;

	if (version != NULL)
		*version = __atomic_load_n(&v->version, __ATOMIC_RELAXED);
	for (i = 0; i < v->n_peers && i < max; i++) {
		int64_t dead = atomic_load(&v->peers[i].c->dead_until_ms);
		snprintf(out[i].addr, sizeof out[i].addr, "%s", v->peers[i].c->addr);
		out[i].self = v->peers[i].self;
		out[i].alive = out[i].self || dead <= now;
		out[i].dead_for_ms = out[i].alive ? 0 : dead - now;
	}
	i = v->n_peers;
	view_put(v);
	return i;
}

/* ---- public API ---- */

int rl_cluster_new(rl_limiter *lim, const rl_cluster_opts *opts, rl_cluster **out, char *err,
		   size_t errlen)
{
	rl_cluster *cl;
	size_t i;
	int rv;

	*out = NULL;
	if (opts->advertise == NULL || opts->advertise[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "cluster: no advertise address");
	cl = sdb_calloc(1, sizeof(*cl));
	cl->lim = lim;
	cl->advertise = sdb_strdup(opts->advertise);
	cl->batch_wait_us = opts->batch_wait_us > 0 ? opts->batch_wait_us : 500;
	cl->batch_limit = opts->batch_limit > 0 ? (size_t)opts->batch_limit : 1000;
	if (cl->batch_limit > RL_MAX_BATCH)
		cl->batch_limit = RL_MAX_BATCH;
	cl->batch_timeout_ms = opts->batch_timeout_ms > 0 ? opts->batch_timeout_ms : 500;
	cl->sync_wait_us = opts->global_sync_wait_us > 0 ? opts->global_sync_wait_us : 100000;
	cl->global_batch_limit =
		opts->global_batch_limit > 0 ? (size_t)opts->global_batch_limit : 1000;
	if (cl->global_batch_limit > RL_MAX_BATCH)
		cl->global_batch_limit = RL_MAX_BATCH;
	cl->dead_ms = opts->dead_ms > 0 ? opts->dead_ms : 2000;
	cl->clock = opts->clock ? opts->clock : rl_clock_realtime_ms;
	cl->clock_data = opts->clock_data;
	cl->vnodes = opts->vnodes;
	cl->global_queue_max = opts->global_queue_max > 0 ? (size_t)opts->global_queue_max : 100000;
	pthread_mutex_init(&cl->view_mu, NULL);

	rv = rl_peers_new(&cl->client, err, errlen);
	if (rv != 0)
		goto err_after_alloc;
	/* the advertise address is added to the ring; duplicates are merged */
	rv = view_build(cl, opts->peers, opts->n_peers, 0, &cl->view, err, errlen);
	if (rv != 0)
		goto err_after_peers;
	for (i = 0; i < opts->n_peers; i++)
		if (strcmp(opts->peers[i], cl->advertise) == 0)
			break;
	if (opts->n_peers > 0 && i == opts->n_peers)
		sdb_warn("ratelimit: the advertise address is not in --peers; added to the ring "
			 "(other peers must list it the same way or they will disagree on owners)",
			 "advertise=%s", cl->advertise);
	if (strncmp(cl->advertise, "0.0.0.0:", 8) == 0 || strncmp(cl->advertise, "[::]:", 5) == 0)
		sdb_warn("ratelimit: advertising a wildcard address; set --advertise "
			 "(or GUBER_ADVERTISE_ADDRESS) to the address peers reach this node at",
			 "advertise=%s", cl->advertise);

	SDB_METRICS_REGISTER(cl, cluster_metrics, NULL);

	pthread_mutex_init(&cl->mu, NULL);
	sdb_cond_init_mono(&cl->cv);
	rv = pthread_create(&cl->flusher, NULL, flusher_main, cl);
	if (rv != 0) {
		sdb_errf(err, errlen, SDB_EIO, "cluster: thread: %s", strerror(rv));
		rv = SDB_EIO;
		pthread_cond_destroy(&cl->cv);
		pthread_mutex_destroy(&cl->mu);
		goto err_after_view;
	}
	sdb_info("ratelimit cluster ready", "advertise=%s peers=%zu batch_wait_us=%" PRId64
		 " batch_limit=%zu global_sync_wait_us=%" PRId64,
		 cl->advertise, cl->view->n_peers, cl->batch_wait_us, cl->batch_limit,
		 cl->sync_wait_us);
	*out = cl;
	return 0;

err_after_view:
	view_put(cl->view);
err_after_peers:
	rl_peers_free(cl->client);
	conns_free(cl);
err_after_alloc:
	pthread_mutex_destroy(&cl->view_mu);
	free(cl->advertise);
	free(cl);
	return rv;
}

void rl_cluster_free(rl_cluster *cl)
{
	cl_item *queued = NULL, *it, *next;

	if (cl == NULL)
		return;
	pthread_mutex_lock(&cl->mu);
	cl->stopping = true;
	pthread_cond_signal(&cl->cv);
	queued = view_take_queued(cl->view);
	gent_free_list(gmap_take(&cl->hits));
	gent_free_list(gmap_take(&cl->bcast));
	pthread_mutex_unlock(&cl->mu);
	pthread_join(cl->flusher, NULL);
	for (it = queued; it != NULL; it = next) {
		next = it->next;
		item_fail(it, "error while fetching rate limit from peer %s: %s",
			  cl->view->peers[owner_index(cl->view, it->hash)].c->addr,
			  "rate limiter shutting down");
	}
	rl_peers_free(cl->client); /* cancels calls in flight; their callbacks fail items */
	pthread_cond_destroy(&cl->cv);
	pthread_mutex_destroy(&cl->mu);
	view_put(cl->view);
	conns_free(cl);
	pthread_mutex_destroy(&cl->view_mu);
	free(cl->advertise);
	free(cl);
}

int rl_cluster_decide_async(rl_cluster *cl, const rl_req *reqs, size_t n, rl_resp *out,
			    rl_cluster_done_fn done, void *arg, char *err, size_t errlen)
{
	cl_job *job;
	int64_t now_ms;
	cl_view *v;
	size_t i;

	if (n > RL_MAX_BATCH)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Requests.RateLimits list too large; max size is '%d'", RL_MAX_BATCH);
	job = sdb_calloc(1, sizeof(*job));
	atomic_init(&job->pending, 1);
	job->out = out;
	job->done = done;
	job->arg = arg;
	now_ms = cl->clock(cl->clock_data);
	v = view_get(cl);

	for (i = 0; i < n; i++) {
		rl_req r;
		uint64_t hash;
		int owner;

		memset(&out[i], 0, sizeof(out[i]));
		if (rl_req_validate(&reqs[i], out[i].error, sizeof(out[i].error)) != 0)
			continue;
		r = reqs[i];
		r.metadata = NULL;
		r.n_metadata = 0;
		if (r.created_at == 0)
			r.created_at = now_ms; /* the owner decides with the receiving peer's clock */
		hash = rl_key_hash(r.name, r.unique_key);
		owner = owner_index(v, hash);
		if (owner == v->self) {
			decide_here(cl, &r, hash, &out[i]);
		} else if (r.behavior & RL_GLOBAL) {
			rl_limiter_decide(cl->lim, &r, 1, &out[i], NULL, 0);
			if (out[i].error[0] == '\0') {
				snprintf(out[i].owner, sizeof(out[i].owner), "%s",
					 v->peers[owner].c->addr);
				if (r.hits != 0 || (r.behavior & RL_RESET_REMAINING))
					queue_hits(cl, &r, hash, owner);
			}
		} else {
			atomic_fetch_add(&job->pending, 1);
			route_item(cl, item_new(job, i, &r, hash));
		}
	}
	view_put(v);
	job_release(job);
	return 0;
}

typedef struct sync_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} sync_wait;

static void sync_done(void *arg)
{
	sync_wait *w = arg;

	pthread_mutex_lock(&w->mu);
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

int rl_cluster_decide(void *ctx, const rl_req *reqs, size_t n, rl_resp *out, char *err,
		      size_t errlen)
{
	sync_wait w = {.done = false};
	int rv;

	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	rv = rl_cluster_decide_async(ctx, reqs, n, out, sync_done, &w, err, errlen);
	if (rv == 0) {
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		pthread_mutex_unlock(&w.mu);
	}
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
	return rv;
}

void rl_cluster_peer_decide(rl_cluster *cl, const rl_req *reqs, size_t n, rl_resp *out)
{
	int64_t now_ms = cl->clock(cl->clock_data);
	size_t i;

	for (i = 0; i < n; i++) {
		rl_req r = reqs[i];

		memset(&out[i], 0, sizeof(out[i]));
		if (rl_req_validate(&r, out[i].error, sizeof(out[i].error)) != 0)
			continue;
		if (r.created_at == 0)
			r.created_at = now_ms;
		decide_here(cl, &r, rl_key_hash(r.name, r.unique_key), &out[i]);
	}
}

bool rl_cluster_health(rl_cluster *cl, int *peer_count, char *msg, size_t msglen)
{
	cl_view *v = view_get(cl);
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};
	size_t i, off = 0;
	bool ok = true;

	if (msglen > 0)
		msg[0] = '\0';
	*peer_count = (int)v->n_peers;
	for (i = 0; i < v->n_peers; i++) {
		if (peer_alive(i, &a))
			continue;
		ok = false;
		if (off < msglen) {
			int w = snprintf(msg + off, msglen - off, "%speer %s unreachable",
					 off ? "; " : "", v->peers[i].c->addr);
			if (w > 0)
				off += (size_t)w;
		}
	}
	view_put(v);
	return ok;
}

int rl_cluster_peer_count(void *ctx)
{
	rl_cluster *cl = ctx;
	cl_view *v = view_get(cl);
	int n = (int)v->n_peers;

	view_put(v);
	return n;
}

const char *rl_cluster_advertise(const rl_cluster *cl)
{
	return cl->advertise;
}

const char *rl_cluster_owner_of(rl_cluster *cl, const char *name, const char *unique_key)
{
	cl_view *v = view_get(cl);
	const char *addr = v->peers[owner_index(v, rl_key_hash(name, unique_key))].c->addr;

	view_put(v); /* the address string lives as long as the cluster */
	return addr;
}
