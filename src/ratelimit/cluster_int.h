/* Internals of the rate limiter's peer cluster shared by its files: cluster.c (ring and
 * liveness, forwarding and BATCHING, the flusher thread, ring views, the public API of
 * cluster.h) and cluster_global.c (GLOBAL: the hits queued for owners, the broadcasts of
 * the owner's state, UpdatePeerGlobals received). The one private rl_cluster struct is
 * defined here: its ring view under view_mu, its queues and GLOBAL maps under mu. Not for
 * use outside those two files. */
#ifndef SDB_RATELIMIT_CLUSTER_INT_H
#define SDB_RATELIMIT_CLUSTER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "ratelimit/cluster.h"
#include "ratelimit/limiter.h"
#include "ratelimit/peers.h"
#include "ratelimit/proto.h"
#include "ratelimit/ring.h"

#define GMAP_BUCKETS 1024

/* One rl_cluster_decide_async call. */
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
 * and cl->view_mu by rl_cluster_set_peers); readers hold a reference (cl_view_get/put), so
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

/* One peer call in flight: its cluster and peer, and what it carries (forwarded items, or
 * GLOBAL hits). Freed by the call's completion callback. */
typedef struct cl_batch {
	rl_cluster *cl;
	cl_conn *peer;
	size_t n;
	cl_item **items;
	cl_gent *hits; /* GLOBAL hits sent (own copies), re-queued if the owner fails */
} cl_batch;

/* ---- ring and liveness (cluster.c) ---- */

/* The argument of cl_peer_alive: a view and the time (CLOCK_MONOTONIC ms) to judge at. */
typedef struct alive_ctx {
	cl_view *v;
	int64_t now_ms;
} alive_ctx;

/* rl_ring_owner's liveness callback: is peer idx of a->v this node, or not marked dead at
 * a->now_ms? arg is an alive_ctx. */
bool cl_peer_alive(size_t idx, void *arg);

/* The current ring view, with a reference taken (under cl->view_mu); give it back with
 * cl_view_put. Any thread. */
cl_view *cl_view_get(rl_cluster *cl);

/* Drop a reference of v (NULL: nothing); the last one frees the view. */
void cl_view_put(cl_view *v);

/* The owner of a key hash in v. Returns: its ring index: the first live peer clockwise,
 * or this node's (v->self) when none is alive. */
int cl_owner_index(cl_view *v, uint64_t hash);

/* Mark peer p dead for cl->dead_ms from now (its keys go to the next owner meanwhile);
 * logs once per outage, with why. Any thread. */
void cl_mark_dead(rl_cluster *cl, cl_conn *p, const char *why);

/* ---- forwarding (cluster.c) ---- */

/* One GetPeerRateLimits call of the n requests pbs (filled by rl_proto_req_to_pb; the array
 * is taken over) to peer p for batch b, which gets cl and p; done(b, ...) gets the answer.
 * Returns rl_peer_call's status: when it is not 0, done never fires and b is the caller's.
 * Errors: rl_peer_call's (SDB_ECANCELED shutting down, SDB_EIO gRPC refused the call). */
int cl_call_get_peer(rl_cluster *cl, cl_conn *p, cl_batch *b,
		     Pb__Gubernator__RateLimitReq *pbs, size_t n, rl_peer_cb done);

/* ---- GLOBAL (cluster_global.c) ---- */

/* Queue key r (with its hash) for a broadcast of this node's state, as the key's owner:
 * the latest configuration and the latest request clock seen are kept. Nothing when the
 * ring has one peer or the cluster is stopping. Takes cl->mu; r is copied. */
void cl_queue_bcast(rl_cluster *cl, const rl_req *r, uint64_t hash);

/* Queue r's hits for the key's owner (ring index owner), as a non-owner that answered
 * from its local copy: hits add up, the latest configuration wins. Nothing when the
 * cluster is stopping. Takes cl->mu; r is copied. */
void cl_queue_hits(rl_cluster *cl, const rl_req *r, uint64_t hash, int owner);

/* The flusher's GLOBAL sync, called with cl->mu held when it is due: takes both GLOBAL
 * maps, releases cl->mu, sends the hits to their owners and then the broadcasts (hits
 * first: an owner that is this node queues more broadcasts), and returns with cl->mu held
 * again. */
void cl_global_flush(rl_cluster *cl);

/* Drop everything queued in the GLOBAL maps (rl_cluster_free, with cl->mu held). */
void cl_global_clear(rl_cluster *cl);

#endif
