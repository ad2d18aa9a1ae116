/* Shard replica sets: the client's writeConcern (issue #15). Every acknowledged write is
 * on a majority's fsync'ed Raft log; a w above the majority waits, on the loop thread, for
 * that many voters to hold the write's entry (checked every 5 ms), up to wtimeout or the
 * command's maxTimeMS or a killOp (writeConcernError Interrupted, 11601); what cannot be honoured gets mongod's writeConcernError
 * (WriteConcernOptions, replication_coordinator_impl.cpp awaitReplication). Contract in
 * repl_int.h. */
#include <math.h>
#include <raft.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/clock.h"
#include "shard/repl.h"
#include "shard/repl_int.h"

/* Voting members of the current configuration. */
static unsigned voters(shard_repl *r)
{
	unsigned n = 0;
	for (unsigned i = 0; i < r->raft->configuration.n; i++)
		n += r->raft->configuration.servers[i].role == RAFT_VOTER;
	return n;
}

/* How many voters hold index (leader only; 0 otherwise). */
static unsigned holders(shard_repl *r, uint64_t index)
{
	unsigned n = 0;
	if (raft_state(r->raft) != RAFT_LEADER)
		return 0;
	for (unsigned i = 0; i < r->raft->configuration.n; i++) {
		const struct raft_server *s = &r->raft->configuration.servers[i];
		if (s->role != RAFT_VOTER)
			continue;
		if (s->id == r->id ? r->raft->last_stored >= index
				   : r->raft->leader_state.progress[i].match_index >= index)
			n++;
	}
	return n;
}

static void add_wce(bson_t *reply, int code, const char *msg, bool wtimeout)
{
	bson_t wce, info;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "writeConcernError", &wce);
	BSON_APPEND_INT32(&wce, "code", code);
	BSON_APPEND_UTF8(&wce, "codeName", wire_code_name(code));
	BSON_APPEND_UTF8(&wce, "errmsg", msg);
	if (wtimeout) {
		BSON_APPEND_DOCUMENT_BEGIN(&wce, "errInfo", &info);
		BSON_APPEND_BOOL(&info, "wtimeout", true);
		bson_append_document_end(&wce, &info);
	}
	bson_append_document_end(reply, &wce);
}

static void wc_check(uv_timer_t *t)
{
	shard_repl *r = t->data;
	uint64_t now = sdb_mono_ms();
	wc_wait **pp = &r->wc_waits;
	while (*pp) {
		wc_wait *w = *pp;
		bool enough = holders(r, w->index) >= (unsigned)w->w;
		bool late = w->deadline_ms && now >= w->deadline_ms;
		bool gone = r->closed || raft_state(r->raft) != RAFT_LEADER;
		bool killed = wire_req_killed(w->req);
		if (!enough && !late && !gone && !killed) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		if (!enough && killed && !gone)
			/* killOp: mongod's awaitReplication is interrupted (the write stays) */
			add_wce(w->reply, WIRE_ERR_INTERRUPTED, "operation was interrupted", false);
		else if (!enough && late && !gone && w->by_maxtime)
			add_wce(w->reply, WIRE_ERR_MAX_TIME_EXPIRED,
				"operation exceeded time limit (maxTimeMS) while waiting for "
				"replication; the write is committed on a majority",
				false);
		else if (!enough)
			add_wce(w->reply, WIRE_ERR_WRITE_CONCERN_FAILED,
				gone ? "waiting for replication interrupted: no longer "
				       "primary; the write is committed on a majority"
				     : "waiting for replication timed out; the write is "
				       "committed on a majority",
				late && !gone);
		wire_req_reply(w->req, w->reply);
		free(w);
	}
	if (!r->wc_waits)
		uv_timer_stop(&r->wc_timer);
}

void repl_wc_reply(shard_repl *r, repl_batch *b, size_t i, bson_t *reply, uint64_t index)
{
	int32_t w = b->w[i];
	unsigned nv = voters(r);
	if (w <= (int32_t)(nv / 2 + 1)) {
		wire_req_reply(b->reqs[i], reply);
		return;
	}
	if (w > (int32_t)nv) {
		add_wce(reply, 100, "Not enough data-bearing nodes", false);
		wire_req_reply(b->reqs[i], reply);
		return;
	}
	wc_wait *ww = sdb_calloc(1, sizeof *ww);
	ww->req = b->reqs[i];
	ww->reply = reply;
	ww->index = index;
	ww->w = w;
	ww->deadline_ms = b->wtimeout[i] > 0 ? sdb_mono_ms() + (uint64_t)b->wtimeout[i] : 0;
	ww->by_maxtime = b->by_maxtime[i];
	ww->next = r->wc_waits;
	r->wc_waits = ww;
	if (!uv_is_active((uv_handle_t *)&r->wc_timer))
		uv_timer_start(&r->wc_timer, wc_check, 5, 5);
}

bool repl_wc_parse(wire_req *req, int32_t *w, int64_t *wtimeout, int64_t *maxtime)
{
	bson_iter_t it, sub;
	*w = 0;
	*wtimeout = 0;
	*maxtime = 0;
	int64_t mt;
	if (bson_iter_init_find(&it, wire_req_cmd(req), "maxTimeMS") &&
	    sdb_bson_as_int64(&it, &mt) && mt > 0)
		*maxtime = mt;
	if (!bson_iter_init_find(&it, wire_req_cmd(req), "writeConcern"))
		return true;
	if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub)) {
		wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE, "writeConcern must be an object");
		return false;
	}
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "w") == 0) {
			if (BSON_ITER_HOLDS_UTF8(&sub)) {
				const char *m = bson_iter_utf8(&sub, NULL);
				if (strcmp(m, "majority") != 0) {
					wire_req_error(req, 79,
						       "unrecognized write concern mode: %s (tag sets "
						       "are not supported; use a number or \"majority\")",
						       m);
					return false;
				}
			} else if (BSON_ITER_HOLDS_NUMBER(&sub)) {
				double v = bson_iter_as_double(&sub);
				if (!(v >= 0 && v <= 50 && v == trunc(v))) {
					wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
						       "w has to be a non-negative integer not greater "
						       "than 50, or \"majority\"");
					return false;
				}
				*w = (int32_t)v;
			} else {
				wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
					       "w has to be a number or a string");
				return false;
			}
		} else if (strcmp(k, "wtimeout") == 0 || strcmp(k, "wtimeoutMS") == 0) {
			double v = BSON_ITER_HOLDS_NUMBER(&sub) ? bson_iter_as_double(&sub) : -1;
			/* no cast before the range check: (int64_t)inf is undefined */
			if (!(v >= 0 && v <= INT32_MAX && v == trunc(v))) {
				wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
					       "wtimeout must be a non-negative integer (ms)");
				return false;
			}
			*wtimeout = (int64_t)v;
		} else if (strcmp(k, "j") == 0 || strcmp(k, "fsync") == 0) {
			/* every acknowledged write is in a majority's fsync'ed Raft log */
			if (!BSON_ITER_HOLDS_BOOL(&sub) && !BSON_ITER_HOLDS_NUMBER(&sub)) {
				wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
					       "%s must be numeric or a boolean value", k);
				return false;
			}
		} else if (strcmp(k, "provenance") != 0 && strcmp(k, "getLastError") != 0) {
			wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
				       "unrecognized write concern field: %s", k);
			return false;
		}
	}
	return true;
}

void repl_wc_abandon(shard_repl *r)
{
	while (r->wc_waits) {
		wc_wait *w = r->wc_waits;
		r->wc_waits = w->next;
		add_wce(w->reply, WIRE_ERR_WRITE_CONCERN_FAILED,
			"waiting for replication interrupted by shutdown; the write "
			"is committed on a majority",
			false);
		wire_req_reply(w->req, w->reply);
		free(w);
	}
}
