/* Causal reads (issue #20): readConcern {afterClusterTime: T} on a member (a secondary,
 * or a primary of a set with more than one voter) whose newest applied oplog entry is
 * below T waits, as mongod's waitForReadConcernImpl
 * (mongo/db/read_concern_mongod.cpp): the read parks here without holding a worker, and is
 * handed to the pool once this member applied an entry with ts >= T (repl_ct_wake, called
 * after every apply); meanwhile the member asks the primary for a no-op write at or
 * above T (mongod's makeNoopWriteIfNeeded: appendOplogNote {data: {"noop write for
 * afterClusterTime read concern": 1}, maxClusterTime: T - 1}, see noop_send) so that its
 * oplog reaches T even when no client writes. A parked read answers MaxTimeMSExpired (50) at its maxTimeMS,
 * Interrupted (11601) once killOp marked it, InterruptedAtShutdown (11600) at the end of
 * the stop's quiesce; it stays in currentOp (its request is in flight) while it waits.
 *
 * Everything here runs on the loop thread: parking (dispatch), waking (the Raft apply),
 * the deadlines (repl.c stall_cb, every 50 ms), killOp (currentop.c) and the no-op's
 * answer (auth_cluster_command_async's callback). Contract in repl_int.h. */
#include <mongoc/mongoc.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "shard/repl_int.h"

/* How long after a failed no-op request (no primary known, the primary unreachable or
 * refusing) the next one may go: a park sooner does not resend either, so nothing spins. */
#define CT_NOOP_BACKOFF_MS 200

/* The in-flight no-op request's context: it outlives the member when the member closes
 * first (r NULL then; the callback only frees it). */
struct ct_noop {
	shard_repl *r;
	uint64_t ts; /* the maxClusterTime it asked for */
};

static void ct_unlink(shard_repl *r, ct_read *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		r->ct_reads = c->next;
	if (c->next)
		c->next->prev = c->prev;
	sdb_gauge_add(r->g_ct_parked, -1);
}

static void noop_send(shard_repl *r);

static void noop_after(void *arg, bool ok, const bson_t *reply)
{
	struct ct_noop *n = arg;
	shard_repl *r = n->r;

	if (!r) {
		free(n);
		return;
	}
	r->ct_noop = NULL;
	if (ok) {
		if (n->ts > r->ct_noop_done)
			r->ct_noop_done = n->ts;
	} else {
		char *js = reply ? bson_as_relaxed_extended_json(reply, NULL) : NULL;
		sdb_debug("shard: no-op write for afterClusterTime failed, retrying later",
			  "ts=%u,%u reply=%s", (unsigned)(n->ts >> 32), (unsigned)n->ts,
			  js ? js : "");
		bson_free(js);
		r->ct_noop_next_ms = sdb_mono_ms() + CT_NOOP_BACKOFF_MS;
	}
	free(n);
	/* a park wanted a higher T meanwhile: one more (coalesced) request */
	noop_send(r);
}

/* Ask the primary for a no-op write above the highest T a parked read waits for, unless
 * one is in flight, one already succeeded for it, the oplog is there already, or a
 * failure's back-off runs. */
static void noop_send(shard_repl *r)
{
	uint64_t want = r->ct_noop_want, lid = 0, now = sdb_mono_ms();
	const char *la = NULL;

	if (r->closed || !r->node || r->ct_noop || !r->ct_reads || want <= r->ct_noop_done ||
	    sdb_store_oplog_committed(r->sh->store) >= want || now < r->ct_noop_next_ms)
		return;
	sdb_node_leader(r->node, &lid, &la);
	/* the primary asks itself (its own wire address, the same command path): the note
	 * commits only while it still leads a majority */
	const char *lw = lid ? shard_repl_member_wire(r, lid) : NULL;
	if (!lw) {
		r->ct_noop_next_ms = now + CT_NOOP_BACKOFF_MS; /* no primary known yet */
		return;
	}
	bson_t cmd = BSON_INITIALIZER, data;
	BSON_APPEND_INT32(&cmd, "appendOplogNote", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "data", &data);
	BSON_APPEND_INT32(&data, "noop write for afterClusterTime read concern", 1);
	bson_append_document_end(&cmd, &data);
	/* T - 1: the shard's appendOplogNote writes unless its newest entry is ABOVE
	 * maxClusterTime (what change streams need), mongod's skips when lastApplied is AT
	 * or above it; asking for T - 1 gives mongod's rule, so a read that merely lags
	 * behind an existing entry at T adds nothing to the oplog, and a no-op written gets a
	 * ts >= T */
	uint64_t floor = want - 1;
	BSON_APPEND_TIMESTAMP(&cmd, "maxClusterTime", (uint32_t)(floor >> 32), (uint32_t)floor);
	struct ct_noop *n = sdb_calloc(1, sizeof *n);
	n->r = r;
	n->ts = want;
	if (auth_cluster_command_async(uv_handle_get_loop((uv_handle_t *)&r->async), lw, &cmd,
				       "shard appendOplogNote (afterClusterTime)", noop_after,
				       n) == 0) {
		r->ct_noop = n;
		sdb_counter_inc(r->c_ct_noops);
	} else {
		free(n);
		r->ct_noop_next_ms = now + CT_NOOP_BACKOFF_MS;
	}
	bson_destroy(&cmd);
}

/* The request's maxTimeMS deadline (sdb_mono_ms from its arrival, as the pool counts it),
 * 0: none. */
static uint64_t ct_deadline(wire_req *req)
{
	bson_iter_t it;
	int64_t ms;

	if (!bson_iter_init_find(&it, wire_req_cmd(req), "maxTimeMS") ||
	    !BSON_ITER_HOLDS_NUMBER(&it))
		return 0;
	ms = bson_iter_as_int64(&it);
	if (ms <= 0 || ms > INT32_MAX)
		return 0;
	return wire_req_start_ns(req) / 1000000u + (uint64_t)ms;
}

void repl_ct_park(shard_repl *r, wire_req *req, shard_cmd_fn fn, uint64_t after)
{
	uint64_t now = sdb_mono_ms();
	ct_read *c;

	if (r->closed || (r->ct_close_ms && now >= r->ct_close_ms)) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "interrupted at shutdown");
		return;
	}
	c = sdb_calloc(1, sizeof *c);
	c->req = req;
	c->fn = fn;
	c->after = after;
	c->deadline_ms = ct_deadline(req);
	if (c->deadline_ms && now >= c->deadline_ms) {
		free(c);
		wire_req_expire(req);
		wire_req_error(req, WIRE_ERR_MAX_TIME_EXPIRED, "operation exceeded time limit");
		return;
	}
	/* a client that gives up (socketTimeoutMS) and closes must not leave its read parked
	 * until T or maxTimeMS: the tick answers it ClientDisconnect (as mongod kills the
	 * operation of a closed connection) */
	wire_req_watch_close(req);
	c->next = r->ct_reads;
	if (r->ct_reads)
		r->ct_reads->prev = c;
	r->ct_reads = c;
	sdb_gauge_add(r->g_ct_parked, 1);
	if (after > r->ct_noop_want)
		r->ct_noop_want = after;
	/* a failed request's back-off holds for parks too: a primary that refuses at once
	 * would otherwise cost a connection and a login per parked read (the tick sends it
	 * when the back-off ends) */
	noop_send(r);
}

void repl_ct_wake(shard_repl *r)
{
	if (!r->ct_reads)
		return;
	uint64_t committed = sdb_store_oplog_committed(r->sh->store);
	ct_read *c = r->ct_reads, *next;

	/* a primary too waits for its oplog to reach T (repl_hello.c after_cluster_time_ok) */
	for (; c; c = next) {
		next = c->next;
		if (c->after > committed)
			continue;
		ct_unlink(r, c);
		shard_cmd_run_read(r->sh, c->req, c->fn);
		free(c);
	}
}

void repl_ct_tick(shard_repl *r)
{
	uint64_t now = sdb_mono_ms();
	bool closing = r->ct_close_ms && now >= r->ct_close_ms;
	ct_read *c, *next;

	repl_ct_wake(r);
	for (c = r->ct_reads; c; c = next) {
		next = c->next;
		if (closing) {
			wire_req_error(c->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
				       "interrupted at shutdown");
		} else if (wire_req_killed(c->req)) {
			/* goes out as Interrupted (11601), or 50 if expired first */
			wire_req_error(c->req, WIRE_ERR_INTERRUPTED, "operation was interrupted");
		} else if (wire_req_conn_gone(c->req)) {
			wire_req_error(c->req, WIRE_ERR_CLIENT_DISCONNECT, "client disconnected");
		} else if (c->deadline_ms && now >= c->deadline_ms) {
			wire_req_expire(c->req);
			wire_req_error(c->req, WIRE_ERR_MAX_TIME_EXPIRED,
				       "operation exceeded time limit");
		} else {
			continue;
		}
		ct_unlink(r, c);
		free(c);
	}
	if (!r->ct_reads)
		r->ct_noop_want = 0;
	else
		noop_send(r);
}

void repl_ct_abandon(shard_repl *r)
{
	while (r->ct_reads) {
		ct_read *c = r->ct_reads;
		ct_unlink(r, c);
		wire_req_error(c->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "interrupted at shutdown");
		free(c);
	}
	r->ct_noop_want = 0;
	if (r->ct_noop) {
		r->ct_noop->r = NULL; /* its callback frees it */
		r->ct_noop = NULL;
	}
}

void shard_repl_reads_close_by(shard_repl *r, int64_t ms)
{
	r->ct_close_ms = sdb_mono_ms() + (uint64_t)(ms > 0 ? ms : 0);
	if (ms <= 0)
		repl_ct_tick(r);
}

void shard_repl_reads_killed(shard_repl *r)
{
	repl_ct_tick(r);
}
