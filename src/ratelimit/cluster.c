/* Owner lookup, forwarding, BATCHING and the flusher thread of the rate limiter's peer
 * cluster (see cluster.h for the behaviour and its sources); GLOBAL sync is
 * cluster_global.c, the private rl_cluster struct both work on is cluster_int.h. */
#include "ratelimit/cluster.h"
#include "ratelimit/cluster_int.h"

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
#include "common/thread.h"
#include "common/metrics.h"
#include "ratelimit/peers.h"
#include "ratelimit/proto.h"
#include "ratelimit/ring.h"

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

bool cl_peer_alive(size_t idx, void *arg)
{
	alive_ctx *a = arg;
	cl_peer *p = &a->v->peers[idx];

	return p->self || atomic_load(&p->c->dead_until_ms) <= a->now_ms;
}

cl_view *cl_view_get(rl_cluster *cl)
{
	cl_view *v;

	pthread_mutex_lock(&cl->view_mu);
	v = cl->view;
	atomic_fetch_add(&v->refs, 1);
	pthread_mutex_unlock(&cl->view_mu);
	return v;
}

void cl_view_put(cl_view *v)
{
	if (v == NULL || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	rl_ring_free(v->ring);
	free(v->peers);
	free(v);
}

int cl_owner_index(cl_view *v, uint64_t hash)
{
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};
	int o = rl_ring_owner(v->ring, hash, cl_peer_alive, &a);

	return o < 0 ? v->self : o;
}

void cl_mark_dead(rl_cluster *cl, cl_conn *p, const char *why)
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

/* ---- deciding here ---- */

/* Decide r on this node as the key's owner. */
static void decide_here(rl_cluster *cl, const rl_req *r, uint64_t hash, rl_resp *out)
{
	if (r->behavior & RL_GLOBAL) {
		rl_state st;
		if (rl_limiter_decide_owner(cl->lim, r, out, &st) == 0)
			cl_queue_bcast(cl, r, hash);
	} else {
		rl_limiter_decide(cl->lim, r, 1, out, NULL, 0);
	}
	if (out->error[0] == '\0')
		snprintf(out->owner, sizeof(out->owner), "%s", cl->advertise);
	sdb_counter_inc(cl->m_local);
}

/* ---- forwarding ---- */

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
			cl_mark_dead(cl, b->peer, details);
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

int cl_call_get_peer(rl_cluster *cl, cl_conn *p, cl_batch *b,
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
	rv = cl_call_get_peer(cl, p, b, pbs, n, batch_done);
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
	v = cl_view_get(cl);
	owner = cl_owner_index(v, it->hash);
	if (owner == v->self || it->attempts > (int)v->n_peers) {
		cl_view_put(v);
		decide_here(cl, &it->req, it->hash, &it->job->out[it->idx]);
		item_done(it);
		return;
	}
	p = &v->peers[owner];
	if (it->req.behavior & RL_NO_BATCHING) {
		cl_item **one = sdb_malloc(sizeof(*one));
		cl_conn *c = p->c;
		cl_view_put(v);
		one[0] = it;
		send_batch(cl, c, one, 1);
		return;
	}
	pthread_mutex_lock(&cl->mu);
	if (cl->stopping) {
		pthread_mutex_unlock(&cl->mu);
		item_fail(it, "error while fetching rate limit from peer %s: %s", p->c->addr,
			  "rate limiter shutting down");
		cl_view_put(v);
		return;
	}
	if (v != cl->view) {
		/* the ring changed meanwhile: its queues were moved; route on the new one */
		pthread_mutex_unlock(&cl->mu);
		cl_view_put(v);
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
	cl_view_put(v);
}

/* ---- the flusher thread ---- */

static void *flusher_main(void *arg)
{
	rl_cluster *cl = arg;

	sdb_log_set_thread_role("ratelimit"); /* the node id: from the thread that started it */
	pthread_mutex_lock(&cl->mu);
	while (!cl->stopping) {
		int64_t now = (int64_t)sdb_mono_us(), next = now + 1000000;
		size_t i;
		bool worked = false;
		cl_view *v = cl_view_get(cl);

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
		cl_view_put(v);
		if (cl->hits.n > 0 || cl->bcast.n > 0) {
			if (now >= cl->g_deadline_us || cl->hits.n >= cl->global_batch_limit ||
			    cl->bcast.n >= cl->global_batch_limit) {
				cl_global_flush(cl);
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
		cl_view_put(v);
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
		cl_view_put(v);
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
	cl_view_put(old);
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
	cl_view *v = cl_view_get(cl);
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
	cl_view_put(v);
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
	rv = sdb_thread_create(&cl->flusher, flusher_main, cl);
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
	cl_view_put(cl->view);
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
	cl_global_clear(cl);
	pthread_mutex_unlock(&cl->mu);
	pthread_join(cl->flusher, NULL);
	for (it = queued; it != NULL; it = next) {
		next = it->next;
		item_fail(it, "error while fetching rate limit from peer %s: %s",
			  cl->view->peers[cl_owner_index(cl->view, it->hash)].c->addr,
			  "rate limiter shutting down");
	}
	rl_peers_free(cl->client); /* cancels calls in flight; their callbacks fail items */
	pthread_cond_destroy(&cl->cv);
	pthread_mutex_destroy(&cl->mu);
	cl_view_put(cl->view);
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
	v = cl_view_get(cl);

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
		owner = cl_owner_index(v, hash);
		if (owner == v->self) {
			decide_here(cl, &r, hash, &out[i]);
		} else if (r.behavior & RL_GLOBAL) {
			rl_limiter_decide(cl->lim, &r, 1, &out[i], NULL, 0);
			if (out[i].error[0] == '\0') {
				snprintf(out[i].owner, sizeof(out[i].owner), "%s",
					 v->peers[owner].c->addr);
				if (r.hits != 0 || (r.behavior & RL_RESET_REMAINING))
					cl_queue_hits(cl, &r, hash, owner);
			}
		} else {
			atomic_fetch_add(&job->pending, 1);
			route_item(cl, item_new(job, i, &r, hash));
		}
	}
	cl_view_put(v);
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
	cl_view *v = cl_view_get(cl);
	alive_ctx a = {v, (int64_t)sdb_mono_us() / 1000};
	size_t i, off = 0;
	bool ok = true;

	if (msglen > 0)
		msg[0] = '\0';
	*peer_count = (int)v->n_peers;
	for (i = 0; i < v->n_peers; i++) {
		if (cl_peer_alive(i, &a))
			continue;
		ok = false;
		if (off < msglen) {
			int w = snprintf(msg + off, msglen - off, "%speer %s unreachable",
					 off ? "; " : "", v->peers[i].c->addr);
			if (w > 0)
				off += (size_t)w;
		}
	}
	cl_view_put(v);
	return ok;
}

int rl_cluster_peer_count(void *ctx)
{
	rl_cluster *cl = ctx;
	cl_view *v = cl_view_get(cl);
	int n = (int)v->n_peers;

	cl_view_put(v);
	return n;
}

const char *rl_cluster_advertise(const rl_cluster *cl)
{
	return cl->advertise;
}

const char *rl_cluster_owner_of(rl_cluster *cl, const char *name, const char *unique_key)
{
	cl_view *v = cl_view_get(cl);
	const char *addr = v->peers[cl_owner_index(v, rl_key_hash(name, unique_key))].c->addr;

	cl_view_put(v); /* the address string lives as long as the cluster */
	return addr;
}
