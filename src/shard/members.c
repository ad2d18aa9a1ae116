/* Online membership of a shard replica set: contract in members.h.
 *
 * The membership change itself is libraft's (one server at a time, dissertation §4.1):
 * raft/node.h's sdb_node_add adds the member as a spare, lets it catch up and promotes it
 * to voter; a new member is started with the set's --replica-set and a --bootstrap-members
 * list that does not contain its own --node-id, so it starts empty and waits to be added
 * (raft/node.c bootstraps only the members of the list). */
#include "shard/members.h"

#include <raft.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "auth/cluster.h"
#include "shard/repl.h"

/* how often the replica set is sampled for /metrics and /healthz */
#define SHARD_MEMBERS_SAMPLE_MS 500

sdb_node *shard_members_node(shard *sh)
{
	return sh->repl ? shard_repl_node(sh->repl) : NULL;
}

typedef struct mreq {
	shard *sh;
	sdb_node *node;
	wire_req *req;
	uint64_t id;
	char *wire;
	const char *what;
	int failed; /* addMember: the status of the change being rolled back (0: none) */
} mreq;

static void mreq_free(mreq *m)
{
	free(m->wire);
	free(m);
}

static void reply_not_primary(shard *sh, sdb_node *n, wire_req *req)
{
	uint64_t lid = 0;
	const char *la = NULL;
	const char *lw = NULL;
	bson_t *extra = bson_new();
	sdb_node_leader(n, &lid, &la);
	if (lid)
		lw = shard_repl_member_wire(sh->repl, lid);
	if (lw)
		BSON_APPEND_UTF8(extra, "primary", lw);
	wire_req_error_extra(req, WIRE_ERR_NOT_WRITABLE_PRIMARY, extra,
			     "not primary: %s must run on the primary of the replica set%s%s",
			     wire_req_name(req), lw ? "; primary is " : "", lw ? lw : "");
}

static void reply_status(mreq *m, int rc)
{
	switch (rc) {
	case SDB_ENOTLEADER:
		wire_req_error(m->req, WIRE_ERR_INTERRUPTED_REPL_CHANGE,
			       "%s: the primary stepped down before the change committed; its "
			       "outcome is unknown (see replSetGetStatus)",
			       m->what);
		return;
	case SDB_ECANCELED:
		wire_req_error(m->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "%s: shutting down",
			       m->what);
		return;
	case SDB_EINVAL:
		wire_req_error(m->req, WIRE_ERR_BAD_VALUE, "%s: invalid member id or address",
			       m->what);
		return;
	case SDB_EBUSY:
		wire_req_error(m->req, WIRE_ERR_OPERATION_FAILED,
			       "%s: a membership change is in progress", m->what);
		return;
	case SDB_ETIMEOUT:
		wire_req_error(m->req, WIRE_ERR_OPERATION_FAILED,
			       "%s: the transfer did not complete in time (no up-to-date voter?)",
			       m->what);
		return;
	default:
		wire_req_error(m->req, WIRE_ERR_INTERNAL, "%s: %s", m->what, sdb_strerror(rc));
		return;
	}
}

static void reply_members(mreq *m)
{
	bson_t *rep = bson_new();
	BSON_APPEND_INT64(rep, "id", (int64_t)m->id);
	sdb_node_append_config(m->node, rep, "members");
	wire_req_reply(m->req, rep);
}

static void wire_recorded(void *arg, int status, bson_t *result)
{
	mreq *m = arg;
	if (result)
		bson_destroy(result);
	/* the member is in the configuration whatever happened here: it registers its wire
	 * address itself when this did not commit */
	if (status != 0)
		sdb_warn("shard: member added, recording its wire address failed (it will "
			 "register itself)",
			 "id=%llu status=%d", (unsigned long long)m->id, status);
	reply_members(m);
	mreq_free(m);
}

/* The removal of a member whose add failed has finished: answer the add's failure. */
static void add_rolled_back(void *arg, int status)
{
	mreq *m = arg;
	if (status == 0)
		wire_req_error(m->req, WIRE_ERR_OPERATION_FAILED,
			       "addMember: member %llu joined as a non-voter but did not catch up "
			       "to vote (%s; is it reachable at its raft address?); it was removed "
			       "again, nothing joined",
			       (unsigned long long)m->id, sdb_strerror(m->failed));
	else
		reply_status(m, m->failed);
	mreq_free(m);
}

/* True when id is in n's configuration (in any role). */
static bool in_config(sdb_node *n, uint64_t id)
{
	const struct raft_configuration *conf = &sdb_node_raft(n)->configuration;
	for (unsigned i = 0; i < conf->n; i++)
		if (conf->servers[i].id == (raft_id)id)
			return true;
	return false;
}

static void member_changed(void *arg, int status)
{
	mreq *m = arg;
	if (status != 0) {
		/* an add that left a spare behind (libraft added it, the promotion failed): take
		 * it out again so that nothing joined, as the caller is told */
		if (strcmp(m->what, "addMember") == 0 && status != SDB_ECANCELED &&
		    sdb_node_ready(m->node) && in_config(m->node, m->id)) {
			m->failed = status;
			if (sdb_node_remove(m->node, m->id, add_rolled_back, m) == 0)
				return;
		}
		reply_status(m, status);
		mreq_free(m);
		return;
	}
	sdb_info("shard: replica set membership changed", "op=%s id=%llu", m->what,
		 (unsigned long long)m->id);
	if (m->wire) {
		bson_t args = BSON_INITIALIZER;
		BSON_APPEND_INT64(&args, "id", (int64_t)m->id);
		BSON_APPEND_UTF8(&args, "wire", m->wire);
		int rc = sdb_node_propose(m->node, "shardMember", &args, wire_recorded, m);
		bson_destroy(&args);
		if (rc == 0)
			return;
	}
	reply_members(m);
	mreq_free(m);
}

static bool first_id(wire_req *req, int64_t *id)
{
	bson_iter_t it;
	return bson_iter_init(&it, wire_req_cmd(req)) && bson_iter_next(&it) &&
	       sdb_bson_as_int64(&it, id);
}

static const char *str_field(wire_req *req, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, wire_req_cmd(req), key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* The node when this member is the ready primary; else the request is answered. */
static sdb_node *primary_node(shard *sh, wire_req *req)
{
	sdb_node *n = shard_members_node(sh);
	if (!n) {
		wire_req_error(req, WIRE_ERR_INTERNAL,
			       "%s: this shard member has no running replica set",
			       wire_req_name(req));
		return NULL;
	}
	if (!sdb_node_ready(n)) {
		reply_not_primary(sh, n, req);
		return NULL;
	}
	return n;
}

static bool valid_addr(const char *a)
{
	char host[256], err[128];
	int port = 0;
	return a && sdb_addr_split(a, host, sizeof host, &port, err, sizeof err) == 0 && port > 0;
}

/* Starts the libraft change of m (sdb_node_add, _remove or _transfer with m's callback);
 * arg is the raft address for an add. Returns 0 or an SDB_E* code (nothing started). */
typedef int (*change_fn)(mreq *m, const char *arg);

/* Start membership change `what` (a command name) of member id on primary n through fn;
 * the request is answered by the change's callback, or here when it cannot start. wire
 * (may be NULL: recorded after an add) is copied. */

static void start_change(shard *sh, sdb_node *n, wire_req *req, int64_t id, const char *what,
			 const char *wire, change_fn fn, const char *arg)
{
	mreq *m = sdb_calloc(1, sizeof *m);
	m->sh = sh;
	m->node = n;
	m->req = req;
	m->id = (uint64_t)id;
	m->what = what;
	m->wire = wire ? sdb_strdup(wire) : NULL;
	int rc = fn(m, arg);
	if (rc != 0) {
		if (rc == SDB_ENOTLEADER)
			reply_not_primary(sh, n, req);
		else
			reply_status(m, rc);
		mreq_free(m);
	}
}

static void transfer_done(void *arg, int status);

static int do_add(mreq *m, const char *raft_addr)
{
	return sdb_node_add(m->node, m->id, raft_addr, member_changed, m);
}

static int do_remove(mreq *m, const char *unused)
{
	(void)unused;
	return sdb_node_remove(m->node, m->id, member_changed, m);
}

static int do_transfer(mreq *m, const char *unused)
{
	(void)unused;
	return sdb_node_transfer(m->node, m->id, transfer_done, m);
}

/* An addMember waiting for the new member's hello. */
typedef struct add_check {
	shard *sh;
	wire_req *req;
	int64_t id;
	char *raft, *wire;
} add_check;

static void add_check_free(add_check *ac)
{
	free(ac->raft);
	free(ac->wire);
	free(ac);
}

/* The new member answered hello (or not): it must be reachable, run with this set's
 * --replica-set, and not be a primary (a running set of its own, whose data the
 * snapshot it would receive replaces). Then the change starts. */
static void add_checked(void *arg, bool ok, const bson_t *reply)
{
	add_check *ac = arg;
	shard *sh = ac->sh;
	wire_req *req = ac->req;
	const char *mine = sh->repl ? shard_repl_set_name(sh->repl) : NULL;
	const char *theirs = NULL;
	bson_iter_t it;
	bool primary = false;

	if (ok && bson_iter_init_find(&it, reply, "setName") && BSON_ITER_HOLDS_UTF8(&it))
		theirs = bson_iter_utf8(&it, NULL);
	if (ok && bson_iter_init_find(&it, reply, "isWritablePrimary") && BSON_ITER_HOLDS_BOOL(&it))
		primary = bson_iter_bool(&it);
	if (!ok) {
		wire_req_error(req, WIRE_ERR_HOST_UNREACHABLE,
			       "addMember: the new member does not answer at %s; start it first "
			       "(stripedb --role=shard --replica-set=%s --node-id=%lld ...)",
			       ac->wire, mine ? mine : "NAME", (long long)ac->id);
	} else if (!mine || !theirs || strcmp(mine, theirs) != 0) {
		wire_req_error(req, WIRE_ERR_INVALID_REPLSET_CONFIG,
			       "addMember: the member at %s runs with --replica-set=%s, not %s; "
			       "nothing joined",
			       ac->wire, theirs ? theirs : "(none)", mine ? mine : "(none)");
	} else if (primary) {
		wire_req_error(req, WIRE_ERR_INVALID_REPLSET_CONFIG,
			       "addMember: the member at %s is the primary of a running replica set "
			       "of its own; start the new member with an empty --data-dir and no "
			       "--bootstrap-members; nothing joined",
			       ac->wire);
	} else {
		sdb_node *n = primary_node(sh, req);
		if (n)
			start_change(sh, n, req, ac->id, "addMember", ac->wire, do_add, ac->raft);
	}
	add_check_free(ac);
}

static void h_add(wire_req *req, void *data)
{
	shard *sh = data;
	int64_t id = 0;
	const char *raft_addr = str_field(req, "raft"), *wire = str_field(req, "wire");
	if (!first_id(req, &id) || id <= 0) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "addMember needs a positive member id");
		return;
	}
	if (!valid_addr(raft_addr)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "addMember needs raft: \"HOST:PORT\"");
		return;
	}
	if (!valid_addr(wire)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "addMember needs wire: \"HOST:PORT\", the new member's client "
			       "address (the primary checks there that it runs with this set's "
			       "--replica-set and is not serving a set of its own)");
		return;
	}
	sdb_node *n = primary_node(sh, req);
	if (!n)
		return;
	/* refuse a duplicate before libraft sees it: one clear message, nothing changes */
	const struct raft_configuration *conf = &sdb_node_raft(n)->configuration;
	for (unsigned i = 0; i < conf->n; i++) {
		const struct raft_server *s = &conf->servers[i];
		if (s->id == (raft_id)id) {
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "addMember: member id %lld is already in the replica set (raft "
				       "%s); pick another --node-id",
				       (long long)id, s->address);
			return;
		}
		if (strcmp(s->address, raft_addr) == 0) {
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "addMember: raft address %s is already member %llu of the "
				       "replica set",
				       raft_addr, (unsigned long long)s->id);
			return;
		}
	}
	/* ask the new member who it is before it joins: a member of another set (or a
	 * running set of its own) would otherwise be overwritten by this set's snapshot */
	add_check *ac = sdb_calloc(1, sizeof *ac);
	ac->sh = sh;
	ac->req = req;
	ac->id = id;
	ac->raft = sdb_strdup(raft_addr);
	ac->wire = sdb_strdup(wire);
	bson_t hello = BSON_INITIALIZER;
	BSON_APPEND_INT32(&hello, "hello", 1);
	if (auth_cluster_command_async(sh->role->loop, wire, &hello, "shard addMember hello",
				       add_checked, ac) != 0) {
		wire_req_error(req, WIRE_ERR_INTERNAL, "addMember: cannot queue the member check");
		add_check_free(ac);
	}
	bson_destroy(&hello);
}

static void h_remove(wire_req *req, void *data)
{
	shard *sh = data;
	int64_t id = 0;
	bool found = false;
	if (!first_id(req, &id) || id <= 0) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "removeMember needs a positive member id");
		return;
	}
	sdb_node *n = primary_node(sh, req);
	if (!n)
		return;
	const struct raft_configuration *conf = &sdb_node_raft(n)->configuration;
	for (unsigned i = 0; i < conf->n; i++)
		found |= conf->servers[i].id == (raft_id)id;
	if (!found) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "removeMember: member id %lld is not in the replica set",
			       (long long)id);
		return;
	}
	if ((uint64_t)id == sdb_node_id(n)) {
		wire_req_error(req, WIRE_ERR_ILLEGAL_OPERATION,
			       "removeMember: member %lld is the primary; transfer the primary role "
			       "first (transferLeadership / stripedb ctl shard member transfer)",
			       (long long)id);
		return;
	}
	start_change(sh, n, req, id, "removeMember", NULL, do_remove, NULL);
}

static void transfer_done(void *arg, int status)
{
	mreq *m = arg;
	if (status == 0) {
		uint64_t lid = 0;
		const char *la = NULL;
		bson_t *rep = bson_new();
		sdb_node_leader(m->node, &lid, &la);
		BSON_APPEND_INT64(rep, "leaderId", (int64_t)lid);
		wire_req_reply(m->req, rep);
	} else {
		reply_status(m, status);
	}
	mreq_free(m);
}

static void h_transfer(wire_req *req, void *data)
{
	shard *sh = data;
	int64_t id = 0;
	first_id(req, &id);
	sdb_node *n = primary_node(sh, req);
	if (!n)
		return;
	if (id < 0 || (uint64_t)id == sdb_node_id(n)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "transferLeadership needs another member's id (or 0: any)");
		return;
	}
	if (sdb_node_raft(n)->configuration.n < 2) {
		wire_req_error(req, WIRE_ERR_ILLEGAL_OPERATION,
			       "transferLeadership: this replica set has one member");
		return;
	}
	start_change(sh, n, req, id, "transferLeadership", NULL, do_transfer, NULL);
}

void shard_members_register(shard *sh)
{
	wire_server_register(sh->srv, "addMember", h_add);
	wire_server_register(sh->srv, "removeMember", h_remove);
	wire_server_register(sh->srv, "transferLeadership", h_transfer);
}

/* ------------------------------------------------------------------ metrics */

/* Per-member series, one set per member id seen on this primary (kept, hidden, when the
 * member goes: a member added back reuses them). */
typedef struct member_series {
	uint64_t id;
	sdb_gauge *lag, *lag_ms, *reachable;
} member_series;

static const sdb_metric_def member_series_metrics[] = {
	SDB_METRIC_GAUGE(member_series, lag, "stripedb_shard_member_lag_entries",
			 "On the primary: Raft entries each member is behind the primary's "
			 "log (absent on other members and for removed members)."),
	SDB_METRIC_GAUGE(member_series, lag_ms,
		"stripedb_shard_member_lag_ms",
		"On the primary: how long each member has been behind, in ms (0: it holds the "
		"primary's whole log; else the age of the oldest entry it lacks; -1 unknown)."),
	SDB_METRIC_GAUGE(member_series, reachable, "stripedb_shard_member_reachable",
			 "On the primary: 1 when the member answered within an "
			 "election timeout, else 0."),
};

struct shard_members {
	uv_timer_t timer;
	shard *sh;
	sdb_gauge *g_state, *g_primary, *g_commit, *g_last;
	member_series per[SHARD_REPL_MAX_MEMBERS * 2];
	size_t n_per;
};

static const sdb_metric_def members_metrics[] = {
	SDB_METRIC_GAUGE(struct shard_members, g_state, "stripedb_shard_raft_state",
			 "Raft state of this shard member: 0 secondary, 1 candidate, "
			 "2 primary."),
	SDB_METRIC_GAUGE(struct shard_members, g_primary, "stripedb_shard_raft_primary_id",
			 "Member id of the primary as this member knows it (0: none)."),
	SDB_METRIC_GAUGE(struct shard_members, g_commit, "stripedb_shard_raft_commit_index",
			 "Raft commit index known to this shard member."),
	SDB_METRIC_GAUGE(struct shard_members, g_last, "stripedb_shard_raft_last_index",
			 "Index of the last entry of this shard member's Raft log."),
};

static member_series *series_of(struct shard_members *m, uint64_t id)
{
	char labels[48];
	for (size_t i = 0; i < m->n_per; i++)
		if (m->per[i].id == id)
			return &m->per[i];
	if (m->n_per == sizeof m->per / sizeof m->per[0])
		return NULL;
	snprintf(labels, sizeof labels, "member=\"%llu\"", (unsigned long long)id);
	member_series *p = &m->per[m->n_per++];
	p->id = id;
	SDB_METRICS_REGISTER(p, member_series_metrics, labels);
	return p;
}

static void sample(uv_timer_t *t)
{
	struct shard_members *m = t->data;
	shard *sh = m->sh;
	sdb_node *n = shard_members_node(sh);
	struct raft *r;
	uint64_t lid = 0;
	const char *la = NULL;
	int st;
	shard_member_view v[SHARD_REPL_MAX_MEMBERS];
	size_t nv;
	if (!n)
		return;
	r = sdb_node_raft(n);
	st = raft_state(r);
	sdb_node_leader(n, &lid, &la);
	sdb_gauge_set(m->g_state, st == RAFT_LEADER ? 2 : st == RAFT_CANDIDATE ? 1 : 0);
	sdb_gauge_set(m->g_primary, (int64_t)lid);
	sdb_gauge_set(m->g_commit, (int64_t)r->commit_index);
	sdb_gauge_set(m->g_last, (int64_t)raft_last_index(r));
	/* only the primary knows each member's progress: elsewhere, and for members that
	 * left the set, the series disappear */
	nv = shard_repl_view(sh->repl, v, SHARD_REPL_MAX_MEMBERS);
	for (size_t i = 0; i < m->n_per; i++) {
		bool in = false;
		for (size_t k = 0; k < nv; k++)
			in |= v[k].id == m->per[i].id;
		if (!in) {
			sdb_gauge_hide(m->per[i].lag);
			sdb_gauge_hide(m->per[i].lag_ms);
			sdb_gauge_hide(m->per[i].reachable);
		}
	}
	for (size_t k = 0; k < nv; k++) {
		member_series *p = series_of(m, v[k].id);
		if (!p)
			continue;
		sdb_gauge_set(p->lag, v[k].lag_entries);
		sdb_gauge_set(p->lag_ms, v[k].lag_ms);
		sdb_gauge_set(p->reachable, v[k].reachable ? 1 : 0);
	}
	/* the same view for /healthz?format=json (read on the HTTP thread) */
	bson_t *doc = bson_new();
	shard_repl_status(sh->repl, doc);
	pthread_mutex_lock(&sh->health_mu);
	if (sh->health_doc)
		bson_destroy(sh->health_doc);
	sh->health_doc = doc;
	pthread_mutex_unlock(&sh->health_mu);
}

void shard_members_start(shard *sh)
{
	struct shard_members *m;
	if (sh->members)
		return;
	m = sdb_calloc(1, sizeof *m);
	m->sh = sh;
	SDB_METRICS_REGISTER(m, members_metrics, NULL);
	uv_timer_init(sh->role->loop, &m->timer);
	m->timer.data = m;
	uv_timer_start(&m->timer, sample, 0, SHARD_MEMBERS_SAMPLE_MS);
	sh->members = m;
}

static void timer_closed(uv_handle_t *h)
{
	free(h->data);
}

void shard_members_stop(shard *sh)
{
	struct shard_members *m = sh->members;
	if (!m)
		return;
	sh->members = NULL;
	uv_timer_stop(&m->timer);
	uv_close((uv_handle_t *)&m->timer, timer_closed);
}
