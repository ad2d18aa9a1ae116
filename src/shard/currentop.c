/* currentOp and killOp on a shard (issue #20), as mongod 6.0: current_op_common.cpp,
 * kill_op.cpp. Both run on the loop thread, which owns the wire server's connections
 * (wire_server_each_op, wire_server_find_op). The operations are the requests in flight on
 * the shard's client connections (proxies' and coordinators' requests among them); a
 * killed one fails with Interrupted (11601) at its next interruption point: a document read
 * by a query, an aggregation or a $lookup (storage's sdb_store_set_interrupt, set by
 * pool.c), a parked awaitData getMore, a writeConcern wait (repl_wc.c). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/gate.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/curop.h"
#include "common/log.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "storage/matcher.h"

/* The internal field a proxy adds to currentOp (src/proxy/currentop.c): the shard id it
 * knows this shard by. Each op is then reported as a mongod that is a shard does
 * (DocumentSourceCurrentOp): `shard: <id>` first, opid "<id>:<opid>", client renamed
 * client_s, before the filter is matched. */
#define SHARD_CUROP_ID_FIELD "$stripedbShard"

typedef struct curop_run {
	sdb_matcher *m;    /* NULL: every op (the $currentOp stage) */
	bson_t ***docs;    /* the $currentOp stage: the op documents collected, else NULL */
	size_t *n_docs, cap_docs;
	bool own;
	const char *user;  /* the caller's authenticated user, or NULL */
	const char *shard; /* SHARD_CUROP_ID_FIELD, or NULL */
	bson_t arr;
	uint32_t n;
} curop_run;

static bool same_user(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

/* effectiveUsers of an authenticated connection (on a shard: __system, the cluster user). */
static void decorate(void *arg, const wire_conn *conn, bson_t *op)
{
	(void)arg;
	auth_gate_append_effective_users(conn, op);
}

static void each(void *arg, const wire_conn *conn, const bson_t *op)
{
	curop_run *r = arg;
	bson_t out = BSON_INITIALIZER;
	const bson_t *doc = op;
	char key[16], opid[160];
	bson_iter_t it;

	if (r->own && !same_user(auth_gate_conn_user(conn), r->user))
		return;
	if (r->shard) {
		BSON_APPEND_UTF8(&out, "shard", r->shard);
		if (bson_iter_init(&it, op)) {
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (strcmp(k, "opid") == 0 && BSON_ITER_HOLDS_INT32(&it)) {
					snprintf(opid, sizeof opid, "%s:%d", r->shard,
						 (int)bson_iter_int32(&it));
					BSON_APPEND_UTF8(&out, "opid", opid);
				} else {
					bson_append_iter(&out, strcmp(k, "client") == 0 ? "client_s" : k,
							 -1, &it);
				}
			}
		}
		doc = &out;
	}
	if (r->docs) {
		util_docs_push(r->docs, r->n_docs, &r->cap_docs, sdb_doc_copy(doc));
	} else if (sdb_matcher_match(r->m, doc)) {
		snprintf(key, sizeof key, "%u", r->n++);
		BSON_APPEND_DOCUMENT(&r->arr, key, doc);
	}
	bson_destroy(&out);
}

/* {currentOp: 1, $all?, $ownOps?, $truncateOps?, <filter>...} on admin:
 * {inprog: [op...], ok: 1}. */
static void cmd_current_op(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	static const char *const skip[] = {SHARD_CUROP_ID_FIELD, NULL};
	sdb_curop_args a;
	curop_run r;
	char err[512];
	int code = 0;
	bson_iter_t it;

	if (strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "currentOp may only be run against the admin database.");
		return;
	}
	memset(&r, 0, sizeof r);
	if (bson_iter_init_find(&it, wire_req_cmd(req), SHARD_CUROP_ID_FIELD)) {
		if (!BSON_ITER_HOLDS_UTF8(&it)) {
			wire_req_error(req, WIRE_ERR_BAD_VALUE, "%s must be a string",
				       SHARD_CUROP_ID_FIELD);
			return;
		}
		r.shard = bson_iter_utf8(&it, NULL);
	}
	sdb_curop_args_parse(wire_req_cmd(req), skip, sh->test_commands, &a);
	if (sdb_matcher_new(&a.filter, &r.m, &code, err, sizeof err) != 0) {
		bson_destroy(&a.filter);
		wire_req_error(req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	r.own = a.own_ops;
	r.user = auth_gate_conn_user(wire_req_conn(req));
	bson_t *reply = bson_new();
	bson_append_array_begin(reply, "inprog", -1, &r.arr);
	wire_op_opts o = {
		.idle = a.all,
		.truncate = a.truncate,
		.decorate = decorate,
		.each = each,
		.arg = &r,
	};
	wire_server_each_op(sh->srv, &o);
	bson_append_array_end(reply, &r.arr);
	sdb_matcher_free(r.m);
	bson_destroy(&a.filter);
	wire_req_reply(req, reply);
}

/* {killOp: 1, op: <opid>} on admin: mark the op killed (the cluster user, or the op's own
 * user, may kill it; anything else is ignored, as mongod's killLocalOperation), wake what
 * waits outside a worker, and answer {info: "attempting to kill op", ok: 1} whether or not
 * the op exists (mongod: "killOp always reports success past the auth check"). */
static void cmd_kill_op(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	char err[256];
	int32_t opid = 0;
	int code;
	wire_req *victim;

	if (strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "killOp may only be run against the admin database.");
		return;
	}
	code = sdb_curop_parse_opid(wire_req_cmd(req), &opid, err, sizeof err);
	if (code) {
		wire_req_error(req, code, "%s", err);
		return;
	}
	victim = wire_server_find_op(sh->srv, opid);
	if (victim && victim != req) {
		const char *me = auth_gate_conn_user(wire_req_conn(req));
		if (!me || strcmp(me, "__system") == 0 ||
		    same_user(me, auth_gate_conn_user(wire_req_conn(victim)))) {
			sdb_info("shard: killOp", "opid=%d cmd=%s", (int)opid, wire_req_name(victim));
			wire_req_kill(victim);
			/* a parked awaitData getMore runs again and sees it killed */
			shard_oplog_notify(sh);
			/* a read waiting for afterClusterTime answers now */
			if (sh->repl)
				shard_repl_reads_killed(sh->repl);
		}
	}
	bson_t *reply = bson_new();
	BSON_APPEND_UTF8(reply, "info", "attempting to kill op");
	wire_req_reply(req, reply);
}

/* ---- the $currentOp aggregation stage (document_source_current_op.cpp) ---- */

/* The op documents of one $currentOp aggregation, taken on the loop thread when the
 * command arrives (shard_curop_stage_dispatch) and handed to the worker that runs the rest
 * of the pipeline (shard_curop_take), keyed by the aggregate's opid. */
struct shard_curop_snap {
	int32_t opid;
	bson_t **docs;
	size_t n;
	struct shard_curop_snap *next;
};

static bool stage_is(const bson_iter_t *stage, const char *name)
{
	bson_iter_t st;
	bson_iter_t s = *stage;
	return BSON_ITER_HOLDS_DOCUMENT(&s) && bson_iter_recurse(&s, &st) && bson_iter_next(&st) &&
	       strcmp(bson_iter_key(&st), name) == 0;
}

bool shard_curop_stage_dispatch(shard *sh, wire_req *req)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it, arr, st, o;
	bool all_users = false, idle = false, truncate = false;
	curop_run r;
	struct shard_curop_snap *snap;

	if (!bson_iter_init_find(&it, cmd, "pipeline") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr) || !bson_iter_next(&arr))
		return false; /* the aggregate command reports a malformed pipeline */
	if (!stage_is(&arr, "$currentOp")) {
		while (bson_iter_next(&arr)) {
			if (stage_is(&arr, "$currentOp")) {
				wire_req_error(req, 40602,
					       "$currentOp is only valid as the first stage in a "
					       "pipeline");
				return true;
			}
		}
		return false;
	}
	if (strcmp(wire_req_db(req), "admin") != 0 || !bson_iter_init(&it, cmd) ||
	    !bson_iter_next(&it) || !BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1) {
		wire_req_error(req, WIRE_ERR_INVALID_NAMESPACE,
			       "$currentOp must be run against the 'admin' database with "
			       "{aggregate: 1}");
		return true;
	}
	bson_iter_recurse(&arr, &st);
	bson_iter_next(&st);
	if (!BSON_ITER_HOLDS_DOCUMENT(&st) || !bson_iter_recurse(&st, &o)) {
		wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
			       "$currentOp options must be specified in an object, but found: %s",
			       sdb_bson_type_name(bson_iter_type(&st)));
		return true;
	}
	while (bson_iter_next(&o)) {
		const char *k = bson_iter_key(&o);
		bool v;
		if (strcmp(k, "allUsers") != 0 && strcmp(k, "idleConnections") != 0 &&
		    strcmp(k, "idleSessions") != 0 && strcmp(k, "idleCursors") != 0 &&
		    strcmp(k, "localOps") != 0 && strcmp(k, "truncateOps") != 0 &&
		    strcmp(k, "backtrace") != 0) {
			wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
				       "Unrecognized option '%s' in $currentOp stage.", k);
			return true;
		}
		if (!BSON_ITER_HOLDS_BOOL(&o)) {
			wire_req_error(req, WIRE_ERR_FAILED_TO_PARSE,
				       "The '%s' parameter of the $currentOp stage must be a boolean "
				       "value, but found: %s",
				       k, sdb_bson_type_name(bson_iter_type(&o)));
			return true;
		}
		v = bson_iter_bool(&o);
		if (strcmp(k, "allUsers") == 0)
			all_users = v;
		else if (strcmp(k, "idleConnections") == 0)
			idle = v;
		else if (strcmp(k, "truncateOps") == 0)
			truncate = v;
		else if (strcmp(k, "idleCursors") == 0 && v) {
			wire_req_error(req, WIRE_ERR_NOT_IMPLEMENTED,
				       "$currentOp idleCursors is not supported by stripedb");
			return true;
		}
		/* idleSessions: stripedb reports no idle sessions ($listLocalSessions lists
		 * them); localOps: a shard's ops are its local ops; backtrace: no lock
		 * reporting to add one to */
	}
	memset(&r, 0, sizeof r);
	snap = sdb_calloc(1, sizeof *snap);
	snap->opid = wire_req_opid(req);
	r.docs = &snap->docs;
	r.n_docs = &snap->n;
	r.own = !all_users; /* the stage's default: the caller's own ops only */
	r.user = auth_gate_conn_user(wire_req_conn(req));
	wire_op_opts wo = {
		.idle = idle, .truncate = truncate, .decorate = decorate, .each = each, .arg = &r,
	};
	wire_server_each_op(sh->srv, &wo);
	pthread_mutex_lock(&sh->curop_mu);
	snap->next = sh->curop_snaps;
	sh->curop_snaps = snap;
	atomic_fetch_add_explicit(&sh->curop_n, 1, memory_order_relaxed);
	pthread_mutex_unlock(&sh->curop_mu);
	return false;
}

static struct shard_curop_snap *snap_unlink(shard *sh, int32_t opid)
{
	struct shard_curop_snap **pp, *s = NULL;

	pthread_mutex_lock(&sh->curop_mu);
	for (pp = &sh->curop_snaps; *pp; pp = &(*pp)->next) {
		if ((*pp)->opid == opid) {
			s = *pp;
			*pp = s->next;
			atomic_fetch_sub_explicit(&sh->curop_n, 1, memory_order_relaxed);
			break;
		}
	}
	pthread_mutex_unlock(&sh->curop_mu);
	return s;
}

bool shard_curop_take(shard *sh, int32_t opid, bson_t ***docs, size_t *n)
{
	struct shard_curop_snap *s = snap_unlink(sh, opid);

	if (!s)
		return false;
	*docs = s->docs ? s->docs : sdb_calloc(1, sizeof **docs);
	*n = s->n;
	free(s);
	return true;
}

void shard_curop_drop(shard *sh, int32_t opid)
{
	struct shard_curop_snap *s;

	/* The fast path of every request: no snapshot at all, no lock. Relaxed is enough:
	 * this request's own snapshot, the only one it may drop, was pushed (the count
	 * raised) before the request was handed to this thread (the hand-off orders it), and
	 * only this request removes it, so the count read here is not 0 while it is listed;
	 * a count that another request's push or take moves meanwhile is either 0 (nothing
	 * of ours) or leads to the lock, which orders the list itself. */
	if (atomic_load_explicit(&sh->curop_n, memory_order_relaxed) == 0)
		return;
	s = snap_unlink(sh, opid);
	if (s) {
		util_docs_free(s->docs, s->n);
		free(s);
	}
}

void shard_curop_free_all(shard *sh)
{
	while (sh->curop_snaps)
		shard_curop_drop(sh, sh->curop_snaps->opid);
}

void shard_currentop_register(shard *sh)
{
	wire_server_register(sh->srv, "currentOp", cmd_current_op);
	wire_server_register(sh->srv, "killOp", cmd_kill_op);
}
