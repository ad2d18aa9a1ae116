/* The primary's view of its replica set (issue #15 observability): every member's state,
 * replication lag in entries and in milliseconds, whether it answers, and who is primary.
 * Contract in repl.h (shard_repl_view, shard_repl_status); used by replSetGetStatus
 * (ctl shard list / member status, ctl top), /metrics and /healthz?format=json
 * (src/shard/members.c samples it).
 *
 * Lag in milliseconds follows MongoDB's optime lag (the primary's last applied optime wall
 * time minus the member's, rs.printSecondaryReplicationInfo): here, how long ago the
 * primary appended the oldest entry the member does not hold yet, taken from the wall
 * clock the leader stamped into that entry ("ts", raft/node.c sdb_node_propose), read
 * from the leader's in-memory Raft log. Measured to now rather than to the primary's last
 * write, it keeps growing while a stopped member misses only heartbeats. When that entry
 * is no longer in memory (compacted after a snapshot), the time is read from samples of
 * the log's growth taken every 50 ms (3 minutes of continuous writes); older still, the
 * last time the member held the whole log (seen every 50 ms) bounds it from above.
 *
 * Reachability: libraft sets a member's progress.recent_recv when it answers and clears it
 * every election timeout; shard_repl_view_tick (every 50 ms) remembers when it was last
 * seen set, and a member not seen for an election timeout is unreachable.
 */
#include <raft.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "shard/repl_int.h"

/* The entry at index in the leader's in-memory log, NULL when it is not there (compacted,
 * or beyond the last). libraft 0.15 keeps the log in a circular buffer (struct raft_log,
 * raft.h; src/log.c locateEntry/positionAt): the entry of index offset+1+i is at slot
 * (front + i) % size. */
static const struct raft_entry *log_entry(const struct raft *raft, raft_index index)
{
	const struct raft_log *l = &raft->log;
	size_t n;

	if (!l->entries || l->size == 0)
		return NULL;
	n = l->back >= l->front ? l->back - l->front : l->size - l->front + l->back;
	if (n == 0 || index <= l->offset || index > l->offset + n)
		return NULL;
	return &l->entries[(l->front + (size_t)(index - 1 - l->offset)) % l->size];
}

/* The "ts" stamped by the leader that proposed the entry (wall ms), -1 when it has none
 * (a barrier, a configuration change, another format). */
static int64_t stamp_of(const struct raft_entry *e)
{
	bson_t doc;
	bson_iter_t it;
	uint32_t len;

	if (!e || e->type != RAFT_COMMAND || !e->buf.base || e->buf.len < 5)
		return -1;
	memcpy(&len, e->buf.base, 4);
	len = BSON_UINT32_FROM_LE(len);
	if (len < 5 || len > e->buf.len || !bson_init_static(&doc, e->buf.base, len))
		return -1;
	if (bson_iter_init_find(&it, &doc, "ts") && BSON_ITER_HOLDS_INT64(&it))
		return bson_iter_int64(&it);
	return -1;
}

/* The stamp of the first stamped entry from index on (up to last, at most 64 entries
 * scanned); from the oldest entry in memory when index is compacted. -1 when none. */
static int64_t first_stamp(const struct raft *raft, raft_index index, raft_index last)
{
	if (index <= raft->log.offset)
		index = raft->log.offset + 1;
	for (raft_index i = index; i <= last && i < index + 64; i++) {
		int64_t ts = stamp_of(log_entry(raft, i));
		if (ts >= 0)
			return ts;
	}
	return -1;
}

/* Record that the log reached last at wall (a log truncated by a new leader drops the
 * samples beyond its end). */
static void ring_note(shard_repl *r, uint64_t last, int64_t wall)
{
	while (r->ring_n > 0 &&
	       r->ring[(r->ring_head + r->ring_n - 1) % REPL_VIEW_RING].index > last)
		r->ring_n--;
	if (r->ring_n > 0 && r->ring[(r->ring_head + r->ring_n - 1) % REPL_VIEW_RING].index == last)
		return;
	if (r->ring_n == REPL_VIEW_RING) {
		r->ring_head = (r->ring_head + 1) % REPL_VIEW_RING;
		r->ring_n--;
	}
	size_t at = (r->ring_head + r->ring_n++) % REPL_VIEW_RING;
	r->ring[at].index = last;
	r->ring[at].wall_ms = wall;
}

/* When the log first held index according to the samples: the time of the first sample
 * at or past it, when an earlier sample shows it was not there yet (else -1: older than
 * the samples). *oldest gets the time of the oldest sample (-1: none). */
static int64_t ring_time(const shard_repl *r, uint64_t index, int64_t *oldest)
{
	size_t lo = 0, hi = r->ring_n;
	*oldest = r->ring_n ? r->ring[r->ring_head].wall_ms : -1;
	while (lo < hi) { /* first sample with ring index >= index */
		size_t mid = lo + (hi - lo) / 2;
		if (r->ring[(r->ring_head + mid) % REPL_VIEW_RING].index >= index)
			hi = mid;
		else
			lo = mid + 1;
	}
	if (lo == 0 || lo == r->ring_n)
		return -1;
	return r->ring[(r->ring_head + lo) % REPL_VIEW_RING].wall_ms;
}

static void promotion_watch(shard_repl *r);

static member_contact *contact_of(shard_repl *r, uint64_t id, uint64_t now)
{
	for (size_t i = 0; i < r->n_contacts; i++)
		if (r->contacts[i].id == id)
			return &r->contacts[i];
	if (r->n_contacts == SHARD_REPL_MAX_MEMBERS)
		return NULL;
	/* first seen in this term: count from the election */
	member_contact *c = &r->contacts[r->n_contacts++];
	c->id = id;
	c->seen_ms = now;
	c->caught_ms = 0;
	return c;
}

static bool is_leader(shard_repl *r)
{
	return r->node && !r->closed && r->raft && raft_state(r->raft) == RAFT_LEADER &&
	       r->raft->leader_state.progress;
}

void shard_repl_view_tick(shard_repl *r)
{
	if (r->node && !r->closed && r->raft)
		ring_note(r, raft_last_index(r->raft), sdb_wall_ms());
	if (!is_leader(r)) {
		r->n_contacts = 0;
		r->contacts_term = 0;
		return;
	}
	struct raft *raft = r->raft;
	uint64_t now = sdb_mono_ms(), wall = (uint64_t)sdb_wall_ms(), term = sdb_node_term(r->node);
	raft_index last = raft_last_index(raft);
	if (term != r->contacts_term) {
		r->n_contacts = 0;
		r->contacts_term = term;
	}
	/* members no longer in the configuration go */
	for (size_t i = 0; i < r->n_contacts;) {
		bool in = false;
		for (unsigned k = 0; k < raft->configuration.n; k++)
			in |= raft->configuration.servers[k].id == r->contacts[i].id;
		if (in)
			i++;
		else
			r->contacts[i] = r->contacts[--r->n_contacts];
	}
	for (unsigned k = 0; k < raft->configuration.n; k++) {
		const struct raft_server *s = &raft->configuration.servers[k];
		bool self = s->id == r->id;
		member_contact *c = contact_of(r, s->id, now);
		if (!c)
			continue;
		if (self || raft->leader_state.progress[k].recent_recv)
			c->seen_ms = now;
		if (self || raft->leader_state.progress[k].match_index >= last)
			c->caught_ms = wall;
	}
	promotion_watch(r);
}

/* libraft 0.15's progress states (src/progress.h: PROGRESS__PROBE, __PIPELINE, __SNAPSHOT) */
#define PROGRESS_SNAPSHOT 2

/* A member being added is promoted to voter after catch-up rounds (Raft dissertation
 * 4.2.1, libraft's raft_assign): libraft gives it up when a round lasts longer than
 * max_catch_up_round_duration (5 s). A member that installs a snapshot answers nothing
 * while it copies shard.db, which takes as long as the data needs (minutes for GBs): the
 * limit is raised for every round in which the leader sent the promotee a snapshot, and
 * is libraft's default otherwise (a member whose Raft address does not answer is still
 * given up after 5 s). */
static void promotion_watch(shard_repl *r)
{
	struct raft *raft = r->raft;
	uint64_t id = raft->leader_state.promotee_id;
	unsigned limit = REPL_CATCH_UP_ROUND_MS;

	if (id) {
		if (id != r->promo_id || raft->leader_state.round_number != r->promo_round ||
		    raft->leader_state.round_start != r->promo_round_start) {
			r->promo_id = id;
			r->promo_round = raft->leader_state.round_number;
			r->promo_round_start = raft->leader_state.round_start;
			r->promo_snap = false;
		}
		for (unsigned k = 0; k < raft->configuration.n; k++)
			if (raft->configuration.servers[k].id == id &&
			    raft->leader_state.progress[k].state == PROGRESS_SNAPSHOT)
				r->promo_snap = true;
		if (r->promo_snap)
			limit = REPL_SNAPSHOT_INSTALL_MS;
	} else {
		r->promo_id = 0;
		r->promo_snap = false;
	}
	if (raft->max_catch_up_round_duration != limit)
		raft_set_max_catch_up_round_duration(raft, limit);
}

static const char *role_name(int role)
{
	return role == RAFT_VOTER ? "voter" : role == RAFT_STANDBY ? "standby" : "spare";
}

size_t shard_repl_view(shard_repl *r, shard_member_view *out, size_t max)
{
	size_t n = 0;

	if (!is_leader(r))
		return 0;
	shard_repl_view_tick(r);
	struct raft *raft = r->raft;
	uint64_t now = sdb_mono_ms();
	int64_t wall = (int64_t)sdb_wall_ms();
	raft_index last = raft_last_index(raft);
	for (unsigned k = 0; k < raft->configuration.n && n < max; k++) {
		const struct raft_server *s = &raft->configuration.servers[k];
		shard_member_view *v = &out[n++];
		bool self = s->id == r->id;
		const char *wire = shard_repl_member_wire(r, s->id);
		member_contact *c = contact_of(r, s->id, now);
		raft_index match = self ? last : raft->leader_state.progress[k].match_index;

		memset(v, 0, sizeof *v);
		v->id = s->id;
		snprintf(v->host, sizeof v->host, "%s", wire ? wire : "");
		snprintf(v->raft, sizeof v->raft, "%s", s->address ? s->address : "");
		v->role = role_name(s->role);
		v->primary = self;
		v->match = match;
		v->lag_entries = last > match ? (int64_t)(last - match) : 0;
		if (match >= last) {
			v->lag_ms = 0;
		} else {
			/* when the oldest entry it lacks was appended: its stamp when the entry
			 * is in memory, else the log's growth samples, else the last time the
			 * member held the whole log (an upper bound), else the oldest time
			 * known (a lower bound) */
			int64_t oldest = -1, ts = -1;
			if (match + 1 > raft->log.offset)
				ts = first_stamp(raft, match + 1, last);
			if (ts < 0)
				ts = ring_time(r, match + 1, &oldest);
			if (ts < 0 && c && c->caught_ms)
				ts = (int64_t)c->caught_ms;
			if (ts < 0) {
				int64_t mem = first_stamp(raft, raft->log.offset + 1, last);
				ts = oldest >= 0 && (mem < 0 || oldest < mem) ? oldest : mem;
			}
			v->lag_ms = ts < 0 ? -1 : wall > ts ? wall - ts : 0;
		}
		v->last_contact_ms = self || !c ? 0 : (int64_t)(now - c->seen_ms);
		v->reachable = self || (c && now - c->seen_ms <= raft->election_timeout);
	}
	return n;
}

void shard_repl_status(shard_repl *r, bson_t *out)
{
	uint64_t lid = 0;
	const char *la = NULL;
	bson_t arr, m;
	char key[24];
	if (!r->node)
		return;
	sdb_node_leader(r->node, &lid, &la);
	BSON_APPEND_UTF8(out, "setName", r->set_name ? r->set_name : "");
	BSON_APPEND_INT64(out, "id", (int64_t)r->id);
	int st = raft_state(r->raft);
	BSON_APPEND_UTF8(out, "state",
			 sdb_node_ready(r->node) ? "PRIMARY"
			 : st == RAFT_LEADER	 ? "PRIMARY (not ready)"
			 : st == RAFT_CANDIDATE	 ? "CANDIDATE"
						 : "SECONDARY");
	BSON_APPEND_INT64(out, "term", (int64_t)sdb_node_term(r->node));
	BSON_APPEND_INT64(out, "primaryId", (int64_t)lid);
	{
		const char *pw = lid ? shard_repl_member_wire(r, lid) : NULL;
		if (pw)
			BSON_APPEND_UTF8(out, "primary", pw);
	}
	BSON_APPEND_INT64(out, "applied", (int64_t)r->last_applied);
	BSON_APPEND_INT64(out, "commitIndex", (int64_t)r->raft->commit_index);
	BSON_APPEND_INT64(out, "lastIndex", (int64_t)raft_last_index(r->raft));
	sdb_node_append_config(r->node, out, "members");

	shard_member_view v[SHARD_REPL_MAX_MEMBERS];
	size_t n = shard_repl_view(r, v, SHARD_REPL_MAX_MEMBERS);
	bson_append_array_begin(out, "memberStatus", -1, &arr);
	if (n > 0) {
		for (size_t i = 0; i < n; i++) {
			snprintf(key, sizeof key, "%zu", i);
			bson_append_document_begin(&arr, key, -1, &m);
			BSON_APPEND_INT64(&m, "id", (int64_t)v[i].id);
			BSON_APPEND_UTF8(&m, "host", v[i].host);
			BSON_APPEND_UTF8(&m, "raft", v[i].raft);
			BSON_APPEND_UTF8(&m, "role", v[i].role);
			BSON_APPEND_BOOL(&m, "primary", v[i].primary);
			BSON_APPEND_INT64(&m, "matchIndex", (int64_t)v[i].match);
			BSON_APPEND_INT64(&m, "lagEntries", v[i].lag_entries);
			BSON_APPEND_INT64(&m, "lagMillis", v[i].lag_ms);
			BSON_APPEND_BOOL(&m, "reachable", v[i].reachable);
			BSON_APPEND_INT64(&m, "lastContactMillis", v[i].last_contact_ms);
			bson_append_document_end(&arr, &m);
		}
	} else {
		/* not the primary: who is in the set and who leads; lag is the primary's to say */
		const struct raft_configuration *conf = &r->raft->configuration;
		for (unsigned k = 0; k < conf->n && k < SHARD_REPL_MAX_MEMBERS; k++) {
			const struct raft_server *s = &conf->servers[k];
			const char *wire = shard_repl_member_wire(r, s->id);
			snprintf(key, sizeof key, "%u", k);
			bson_append_document_begin(&arr, key, -1, &m);
			BSON_APPEND_INT64(&m, "id", (int64_t)s->id);
			BSON_APPEND_UTF8(&m, "host", wire ? wire : "");
			BSON_APPEND_UTF8(&m, "raft", s->address ? s->address : "");
			BSON_APPEND_UTF8(&m, "role", role_name(s->role));
			BSON_APPEND_BOOL(&m, "primary", s->id == lid);
			bson_append_document_end(&arr, &m);
		}
	}
	bson_append_array_end(out, &arr);
}
