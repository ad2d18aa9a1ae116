/* The rate limiter's cluster behaviour: owner lookup, forwarding, BATCHING, GLOBAL.
 *
 * Gubernator's model (architecture.md of gubernator-io/gubernator): every key
 * (name, unique_key) has one owner peer chosen by consistent hashing (ring.h) over the
 * peer list; the owner decides, the other peers forward to it.
 *  - BATCHING (the default): requests for the same owner that arrive within batch_wait
 *    (GUBER_BATCH_WAIT, 500 us) go to it in one PeersV1/GetPeerRateLimits call, at most
 *    batch_limit (GUBER_BATCH_LIMIT, 1000) per call; a full batch leaves at once.
 *  - NO_BATCHING: the request leaves in its own peer call immediately.
 *  - GLOBAL: any peer answers at once from its local copy of the key (deciding on it as
 *    if it owned it) and queues the hits; every global_sync_wait (GUBER_GLOBAL_SYNC_WAIT,
 *    100 ms) or when global_batch_limit keys are queued (GUBER_GLOBAL_BATCH_LIMIT, 1000)
 *    the aggregated hits go to each owner in GetPeerRateLimits calls; the owner applies
 *    them and, on the same period, broadcasts the keys' new state to every other peer
 *    with PeersV1/UpdatePeerGlobals, which replaces their local copies.
 *  - A peer call that fails with UNAVAILABLE or DEADLINE_EXCEEDED (peer call deadline:
 *    batch_timeout, GUBER_BATCH_TIMEOUT, 500 ms) marks the peer dead for dead_ms; its
 *    requests are re-routed at once to the next owner clockwise on the ring (possibly
 *    this node), so clients see no error. The dead peer's state is lost for those keys
 *    (documented: in-memory by design). After dead_ms the peer is tried again.
 *  - Every answer carries metadata "owner": the advertise address of the ring owner that
 *    decided (for GLOBAL, the owner whose state the local copy follows).
 *
 * Threads: decisions run on the caller's thread (local keys) or complete on the peer
 * client's completion thread (forwarded keys); one flusher thread times batches and
 * GLOBAL syncs with CLOCK_MONOTONIC. Every function is thread-safe.
 *
 * Membership: the peer list given at creation (--peers, static), replaced at any time by
 * rl_cluster_set_peers (the metadata membership watch, ratelimit/membership.h). A new
 * ring takes effect for the next request; requests queued for a batch are re-routed to
 * their owner on the new ring; GLOBAL hits not yet delivered go to the new owner at the
 * next sync. A key that changes owner starts empty on its new owner (Gubernator).
 */
#ifndef SDB_RATELIMIT_CLUSTER_H
#define SDB_RATELIMIT_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ratelimit/gubernator_c.pb-c.h"
#include "ratelimit/limiter.h"

typedef struct rl_cluster rl_cluster;

typedef struct rl_cluster_opts {
	const char *advertise;     /* this node's peer address HOST:PORT; required */
	const char *const *peers;  /* peer gRPC addresses, self included (added if missing) */
	size_t n_peers;            /* 0: a cluster of one */
	int64_t batch_wait_us;     /* 0 = 500 */
	int64_t batch_limit;       /* 0 = 1000 (at most RL_MAX_BATCH) */
	int64_t batch_timeout_ms;  /* 0 = 500: deadline of every peer call */
	int64_t global_sync_wait_us; /* 0 = 100000 */
	int64_t global_batch_limit;  /* 0 = 1000 (at most RL_MAX_BATCH) */
	int64_t dead_ms;           /* 0 = 2000 */
	unsigned vnodes;           /* 0 = RL_RING_DEFAULT_VNODES */
	int64_t global_queue_max;  /* 0 = 100000: GLOBAL keys queued for owners, then dropped */
	rl_clock_fn clock;         /* epoch ms for requests without created_at; NULL = realtime */
	void *clock_data;
} rl_cluster_opts;

/* Fill the unset (zero) fields of opts from Gubernator's environment variables
 * GUBER_BATCH_WAIT, GUBER_BATCH_TIMEOUT, GUBER_GLOBAL_SYNC_WAIT (Go durations such as
 * "500us", "100ms", "1s"), GUBER_BATCH_LIMIT and GUBER_GLOBAL_BATCH_LIMIT (integers),
 * read through getenv. Errors: SDB_EUSAGE naming the bad variable. */
int rl_cluster_opts_from_env(rl_cluster_opts *opts, char *err, size_t errlen);

/* Parse a Go time.Duration string ("1h2m", "1.5s", "500us", "300µs", "10ns", "0") into
 * microseconds (ns rounded down). Errors: SDB_EINVAL (not a Go duration, or out of range;
 * no message: it takes no err). */
int rl_parse_go_duration(const char *s, int64_t *out_us);

/* Create a cluster deciding with lim (borrowed; must outlive the cluster), open channels
 * to the other peers and start the flusher thread.
 * Errors: SDB_EINVAL (no advertise address, bad peer list), SDB_EIO (threads). */
int rl_cluster_new(rl_limiter *lim, const rl_cluster_opts *opts, rl_cluster **out, char *err,
		   size_t errlen);

/* Stop: fail queued requests with an error, cancel peer calls in flight and wait until
 * every pending rl_cluster_decide_async callback has fired, join the threads, free.
 * NULL is a no-op. No other rl_cluster call may run concurrently or after. */
void rl_cluster_free(rl_cluster *cl);

/* Completion of an asynchronous decision: out (as given) is filled. */
typedef void (*rl_cluster_done_fn)(void *arg);

/* Decide n client requests (GetRateLimits): out[i] answers reqs[i]. reqs is copied as
 * needed (may be freed on return); out must stay valid until done fires. done fires
 * exactly once, on this thread before the function returns when every key is local, or
 * later on a peer completion thread. Per-item problems (invalid request, peer error)
 * go to out[i].error.
 * Errors: SDB_EINVAL when n > RL_MAX_BATCH (message as Gubernator:
 * "Requests.RateLimits list too large; max size is '1000'"); done never fires then. */
int rl_cluster_decide_async(rl_cluster *cl, const rl_req *reqs, size_t n, rl_resp *out,
			    rl_cluster_done_fn done, void *arg, char *err, size_t errlen);

/* rl_decide_fn (limiter.h) over the cluster, for the HTTP gateway and the proxy: blocks
 * the calling thread until every answer is in. ctx is the rl_cluster. Errors: as
 * rl_cluster_decide_async (SDB_EINVAL when n > RL_MAX_BATCH); per-request failures go to
 * out[i].error. */
int rl_cluster_decide(void *ctx, const rl_req *reqs, size_t n, rl_resp *out, char *err,
		      size_t errlen);

/* PeersV1/GetPeerRateLimits on the receiving side: decide every request here, as the
 * authoritative peer (never forwarded again); GLOBAL requests are applied as the
 * owner's and their keys queued for the broadcast. Synchronous. n <= RL_MAX_BATCH. */
void rl_cluster_peer_decide(rl_cluster *cl, const rl_req *reqs, size_t n, rl_resp *out);

/* PeersV1/UpdatePeerGlobals on the receiving side: install each broadcast state into the
 * local limiter. Entries this node cannot read are skipped (counted in metrics). */
void rl_cluster_apply_globals(rl_cluster *cl, const Pb__Gubernator__UpdatePeerGlobalsReq *req);

/* HealthCheck: peers in the ring including self, and whether every peer is reachable
 * (returns true) or not (false, with "peer H:P unreachable; ..." in msg). */
bool rl_cluster_health(rl_cluster *cl, int *peer_count, char *msg, size_t msglen);
/* rl_frontend.peer_count adapter (ctx is the rl_cluster). Returns: the number of peers in
 * the ring, self included. */
int rl_cluster_peer_count(void *ctx);

/* Replace the ring: peers (gRPC addresses; this node is added when missing) as of
 * membership version `version` (informational, reported by rl_cluster_members).
 * Thread-safe; no-op when the set of peers is unchanged.
 * Errors: SDB_EINVAL (bad list, see rl_ring_new), SDB_ECANCELED (stopping). */
int rl_cluster_set_peers(rl_cluster *cl, const char *const *peers, size_t n, uint64_t version,
			 char *err, size_t errlen);

/* One member of the current ring as this node sees it. */
typedef struct rl_member {
	char addr[256];
	bool self;
	bool alive;          /* false while marked dead after a failed call */
	int64_t dead_for_ms; /* how much longer it is skipped (0 when alive) */
} rl_member;

/* Fill up to max members of the current ring (ascending address order) and the
 * membership version it was built from; returns the ring's size (may exceed max). */
size_t rl_cluster_members(rl_cluster *cl, rl_member *out, size_t max, uint64_t *version);

/* This node's advertise address (owned by the cluster). */
const char *rl_cluster_advertise(const rl_cluster *cl);

/* The address of the ring owner of (name, unique_key) as this node sees it now (dead
 * peers skipped). For tests and diagnostics. Returned string owned by the cluster. */
const char *rl_cluster_owner_of(rl_cluster *cl, const char *name, const char *unique_key);

#endif
