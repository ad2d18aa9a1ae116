/* Rate-limit peer membership commands of the metadata role: see peers.h. */
#include "metadata/peers.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "raft/fsm.h"
#include "raft/fsm_peers.h"

#define MAX_WAIT_MS 60000
#define TICK_MS 100
#define GAP_MS 1000 /* ticks further apart than this: the loop did not run */

typedef struct pwaiter {
	wire_req *req;
	int64_t gt;
	uint64_t deadline_ms; /* uv_now */
	struct pwaiter *next;
} pwaiter;

struct meta_peers {
	uv_loop_t *loop;
	sdb_node *node;
	meta_peers_of_fn of;
	uv_timer_t tick;
	uv_check_t check;
	int handles_open;
	int expire_inflight;
	bool stopping;
	bool was_ready;      /* the node was the ready leader at the last tick */
	int64_t ready_since; /* epoch ms when it became the ready leader (this clock) */
	uint64_t last_tick;  /* sdb_mono_ms of the last tick (0 before the first) */
	pwaiter *waiters;
	uint64_t seen_applied; /* last_applied when the version was last read */
	int64_t version;       /* membership version as of seen_applied */
	void (*closed)(void *);
	void *closed_arg;
};

static sqlite3 *db_of(meta_peers *mp)
{
	return sdb_fsm_db(sdb_node_fsm(mp->node));
}

/* The local membership version, re-read only after something was applied. */
static int64_t version_now(meta_peers *mp)
{
	uint64_t applied = sdb_fsm_last_applied(sdb_node_fsm(mp->node));
	if (applied != mp->seen_applied || mp->version < 0) {
		mp->version = sdb_fsm_peers_version(db_of(mp));
		mp->seen_applied = applied;
	}
	return mp->version;
}

static void waiter_reply(meta_peers *mp, pwaiter *w, bool timed_out)
{
	bson_t *r = bson_new();
	BSON_APPEND_INT64(r, "version", version_now(mp));
	BSON_APPEND_BOOL(r, "changed", !timed_out);
	BSON_APPEND_BOOL(r, "timedOut", timed_out);
	wire_req_reply(w->req, r);
	free(w);
}

static void wake(meta_peers *mp, bool all)
{
	pwaiter **pp = &mp->waiters;
	int64_t v;
	uint64_t now;

	if (mp->waiters == NULL)
		return;
	v = version_now(mp);
	now = uv_now(mp->loop);
	while (*pp) {
		pwaiter *w = *pp;
		bool changed = v > w->gt;
		if (all || changed || now >= w->deadline_ms) {
			*pp = w->next;
			waiter_reply(mp, w, !changed);
		} else {
			pp = &w->next;
		}
	}
}

/* ---- commands ---- */

typedef struct pw_req {
	wire_req *req;
} pw_req;

static void write_done(void *arg, int status, bson_t *result)
{
	pw_req *w = arg;
	if (status == 0) {
		wire_req_reply(w->req, result); /* takes it over */
	} else if (status == SDB_ENOTLEADER) {
		bson_t *r = bson_new();
		BSON_APPEND_DOUBLE(r, "ok", 0.0);
		BSON_APPEND_UTF8(r, "errmsg", "leadership lost before the command committed; its "
					       "outcome is unknown");
		BSON_APPEND_INT32(r, "code", 11602);
		BSON_APPEND_UTF8(r, "codeName", "InterruptedDueToReplStateChange");
		wire_req_reply(w->req, r);
	} else if (status == SDB_ECANCELED) {
		wire_req_error(w->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
	} else {
		wire_req_error(w->req, WIRE_ERR_INTERNAL, "write: %s", sdb_strerror(status));
	}
	free(w);
}

static void copy_field(const bson_t *cmd, const char *from, bson_t *args, const char *to)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, cmd, from))
		bson_append_value(args, to, -1, bson_iter_value(&it));
}

/* The accessor from the wire server's role data to our state: the same function for
 * every metadata role in the process (set by meta_peers_start). */
static meta_peers_of_fn peers_of;

/* {registerRatelimitPeer: "H:P", kind, ttlMS, instance} / {deregisterRatelimitPeer: "H:P",
 * instance} */
static void h_write(wire_req *req, void *data)
{
	meta_peers *mp = peers_of(data);
	const char *name = wire_req_name(req);
	const bson_t *cmd = wire_req_cmd(req);
	bson_t args = BSON_INITIALIZER;
	bson_iter_t it;
	pw_req *w;
	int rc;

	if (mp == NULL || mp->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (!sdb_node_ready(mp->node)) {
		wire_req_error(req, WIRE_ERR_NOT_WRITABLE_PRIMARY,
			       "not primary: this metadata member is not the ready Raft leader");
		return;
	}
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it))
		bson_append_value(&args, "addr", -1, bson_iter_value(&it));
	copy_field(cmd, "kind", &args, "kind");
	copy_field(cmd, "ttlMS", &args, "ttlMS");
	copy_field(cmd, "instance", &args, "instance");
	/* the leader, not the client, says whether `instance` counts: only once the cluster
	 * op version reached MIGSTATE_OP_VERSION_PEER_INSTANCE (raft/migstate.h), so that
	 * no older member of a mixed-version group applies the entry differently */
	BSON_APPEND_INT32(&args, "opVersion", (int32_t)sdb_fsm_op_version(sdb_node_fsm(mp->node)));
	w = sdb_calloc(1, sizeof *w);
	w->req = req;
	rc = sdb_node_propose(mp->node, name, &args, write_done, w);
	bson_destroy(&args);
	if (rc != 0) {
		free(w);
		if (rc == SDB_ENOTLEADER)
			wire_req_error(req, WIRE_ERR_NOT_WRITABLE_PRIMARY,
				       "not primary: this metadata member is not the ready Raft "
				       "leader");
		else
			wire_req_error(req, WIRE_ERR_INTERNAL, "%s: %s", name, sdb_strerror(rc));
	}
}

/* {listRatelimitPeers: 1}: local state (any member), with lastApplied. */
static void h_list(wire_req *req, void *data)
{
	meta_peers *mp = peers_of(data);
	bson_t *reply;

	if (mp == NULL || mp->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	reply = bson_new();
	if (sdb_fsm_peers_query(db_of(mp), reply) != 0) {
		bson_destroy(reply);
		wire_req_error(req, WIRE_ERR_INTERNAL, "listRatelimitPeers: state machine read failed");
		return;
	}
	BSON_APPEND_INT64(reply, "lastApplied",
			  (int64_t)sdb_fsm_last_applied(sdb_node_fsm(mp->node)));
	wire_req_reply(req, reply);
}

/* {waitRatelimitPeers: 1, gt: N, timeoutMS: T} */
static void h_wait(wire_req *req, void *data)
{
	meta_peers *mp = peers_of(data);
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	int64_t gt = -1, tmo = 10000;
	pwaiter *w;

	if (mp == NULL || mp->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (!bson_iter_init_find(&it, cmd, "gt") || !BSON_ITER_HOLDS_NUMBER(&it)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "waitRatelimitPeers needs gt: N");
		return;
	}
	gt = bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, cmd, "timeoutMS") && BSON_ITER_HOLDS_NUMBER(&it))
		tmo = bson_iter_as_int64(&it);
	if (tmo < 0)
		tmo = 0;
	if (tmo > MAX_WAIT_MS)
		tmo = MAX_WAIT_MS;
	w = sdb_calloc(1, sizeof *w);
	w->req = req;
	w->gt = gt;
	w->deadline_ms = uv_now(mp->loop) + (uint64_t)tmo;
	if (version_now(mp) > gt) {
		waiter_reply(mp, w, false);
		return;
	}
	w->next = mp->waiters;
	mp->waiters = w;
}

/* ---- lease expiry, proposed by the leader ---- */

static void maybe_closed(meta_peers *mp)
{
	if (!mp->stopping || mp->handles_open > 0 || mp->expire_inflight > 0)
		return;
	void (*closed)(void *) = mp->closed;
	void *arg = mp->closed_arg;
	free(mp);
	if (closed)
		closed(arg);
}

static void expire_done(void *arg, int status, bson_t *result)
{
	meta_peers *mp = arg;
	bson_iter_t it, sub;

	mp->expire_inflight--;
	if (status == 0 && result != NULL && bson_iter_init_find(&it, result, "expired") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &sub)) {
		while (bson_iter_next(&sub))
			if (BSON_ITER_HOLDS_UTF8(&sub))
				sdb_info("metadata: rate-limit peer lease expired, removed from the ring",
					 "peer=%s", bson_iter_utf8(&sub, NULL));
	}
	if (result != NULL)
		bson_destroy(result);
	maybe_closed(mp);
}

static void tick_cb(uv_timer_t *t)
{
	meta_peers *mp = t->data;
	bson_t args = BSON_INITIALIZER;
	bool ready = sdb_node_ready(mp->node);
	uint64_t now = sdb_mono_ms();
	uint64_t gap_ms = mp->last_tick != 0 ? now - mp->last_tick : 0;
	bool gap = gap_ms > GAP_MS;

	mp->last_tick = now;
	wake(mp, false);
	/* grace after a leader change (raft/fsm_peers.h): leases that lapsed while there was
	 * no leader get one full ttl with this leader before they can be expired. Likewise
	 * after a gap in the ticks (this process was stopped, e.g. SIGSTOP, or its loop
	 * blocked): nobody could renew with it meanwhile, so the clock starts again; a
	 * leader paused together with every other member would otherwise expire every lease
	 * the moment it resumed. */
	if (ready && (!mp->was_ready || gap)) {
		if (gap && mp->was_ready)
			sdb_info("metadata: ticks resumed after a gap, rate-limit leases get a full"
				 " ttl again", "gap_ms=%llu", (unsigned long long)gap_ms);
		mp->ready_since = sdb_wall_ms();
	}
	mp->was_ready = ready;
	if (mp->stopping || mp->expire_inflight > 0 || !ready)
		return;
	if (sdb_fsm_peers_next_expiry(db_of(mp), mp->ready_since) > sdb_wall_ms())
		return;
	BSON_APPEND_INT64(&args, "sinceMS", mp->ready_since);
	if (sdb_node_propose(mp->node, "expireRatelimitPeers", &args, expire_done, mp) == 0)
		mp->expire_inflight++;
	bson_destroy(&args);
}

static void check_cb(uv_check_t *c)
{
	wake(c->data, false);
}

meta_peers *meta_peers_start(uv_loop_t *loop, sdb_node *node, wire_server *srv,
			     meta_peers_of_fn of)
{
	meta_peers *mp = sdb_calloc(1, sizeof *mp);

	mp->loop = loop;
	mp->node = node;
	mp->of = of;
	mp->version = -1;
	peers_of = of;
	wire_server_register(srv, "registerRatelimitPeer", h_write);
	wire_server_register(srv, "deregisterRatelimitPeer", h_write);
	wire_server_register(srv, "listRatelimitPeers", h_list);
	wire_server_register(srv, "waitRatelimitPeers", h_wait);
	uv_timer_init(loop, &mp->tick);
	mp->tick.data = mp;
	uv_timer_start(&mp->tick, tick_cb, TICK_MS, TICK_MS);
	uv_check_init(loop, &mp->check);
	mp->check.data = mp;
	uv_check_start(&mp->check, check_cb);
	mp->handles_open = 2;
	return mp;
}

static void handle_closed(uv_handle_t *h)
{
	meta_peers *mp = h->data;
	mp->handles_open--;
	maybe_closed(mp);
}

void meta_peers_stop(meta_peers *mp, void (*closed)(void *arg), void *arg)
{
	wake(mp, true);
	mp->stopping = true;
	mp->closed = closed;
	mp->closed_arg = arg;
	uv_timer_stop(&mp->tick);
	uv_check_stop(&mp->check);
	uv_close((uv_handle_t *)&mp->tick, handle_closed);
	uv_close((uv_handle_t *)&mp->check, handle_closed);
}
