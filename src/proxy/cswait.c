/* Parked change-stream getMores and the per-shard watchers: see cswait.h. */
#include "proxy/cswait.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/changestream.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"
#include "proxy/exec.h"
#include "proxy/proxy.h"

/* A shard whose watcher's call ran into its deadline (the shard stopped answering without
 * closing its connection), until that watcher gets an answer again. */
typedef struct stall {
	char *id;
	struct stall *next;
} stall;

typedef struct park {
	wire_req *req;
	char *user;
	uint64_t until_ms;
	/* the wake filter (strings owned) */
	int level;
	char *db, *coll;
	bool pending; /* any move wakes it: an event waits for a holdout's position */
	struct park *next;
} park;

/* A watcher's report (cswait.h "move"). */
#define MOVE_NS_MAX 8 /* namespaces one move names; more: MOVE_ALL */
enum { MOVE_ALL, MOVE_NS, MOVE_POS };
typedef struct move {
	uint64_t seq;  /* 0: an empty slot */
	char *shard;   /* NULL: every shard */
	int kind;      /* MOVE_ALL: anything may have moved; MOVE_NS: events of these
			* namespaces; MOVE_POS: the position only (an oplog note) */
	size_t nns;
	char *db[MOVE_NS_MAX];
	char *coll[MOVE_NS_MAX]; /* NULL: the whole database (dropDatabase) */
} move;

struct px_cswait {
	proxy *p;
	uv_mutex_t mu;
	uv_cond_t cv; /* the parker: a new entry, or quit */
	park *head;   /* under mu */
	uint64_t seq; /* the last move's number (under mu) */
	move *ring;   /* PX_CSWAIT_RING moves, move seq at ring[seq % PX_CSWAIT_RING] (under mu) */
	bool stopping; /* no more parks (under mu) */
	atomic_bool quit; /* the threads exit */
	uv_thread_t parker;
	uv_thread_t watcher;
	bool watcher_started; /* under mu */
	sdb_gauge *m_parked;
	sdb_counter *m_wakes;
	size_t n; /* parked entries, under mu */
	stall *stalled; /* under mu */
};

/* Returns: true when the state changed. */
static bool set_stalled(px_cswait *w, const char *id, bool on)
{
	stall **pp, *e;
	bool changed = false;

	uv_mutex_lock(&w->mu);
	for (pp = &w->stalled; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->id, id) == 0)
			break;
	if (on && *pp == NULL) {
		e = sdb_calloc(1, sizeof *e);
		e->id = sdb_strdup(id);
		e->next = w->stalled;
		w->stalled = e;
		changed = true;
	} else if (!on && *pp != NULL) {
		e = *pp;
		*pp = e->next;
		free(e->id);
		free(e);
		changed = true;
	}
	uv_mutex_unlock(&w->mu);
	if (changed)
		sdb_log(on ? SDB_LOG_WARN : SDB_LOG_INFO,
			on ? "change stream watcher: shard stopped answering, streams skip it"
			   : "change stream watcher: shard answers again",
			"shard=%s", id);
	return changed;
}

static void clear_stalled(px_cswait *w)
{
	uv_mutex_lock(&w->mu);
	while (w->stalled != NULL) {
		stall *e = w->stalled;
		w->stalled = e->next;
		free(e->id);
		free(e);
	}
	uv_mutex_unlock(&w->mu);
}

bool px_cswait_stalled(px_cswait *w, const char *id)
{
	bool found = false;

	if (w == NULL)
		return false;
	uv_mutex_lock(&w->mu);
	for (stall *e = w->stalled; e != NULL && !found; e = e->next)
		found = strcmp(e->id, id) == 0;
	uv_mutex_unlock(&w->mu);
	return found;
}

/* Hand a list of entries (taken off the table) back to the request workers. */
static void resume_list(px_cswait *w, park *e)
{
	while (e != NULL) {
		park *next = e->next;
		wire_req_wait_end(e->req);
		px_exec_resume(w->p, e->req, e->user);
		free(e->user);
		free(e->db);
		free(e->coll);
		free(e);
		e = next;
	}
}

static void set_gauge(px_cswait *w);

static void move_clear(move *m)
{
	free(m->shard);
	for (size_t i = 0; i < m->nns; i++) {
		free(m->db[i]);
		free(m->coll[i]);
	}
	memset(m, 0, sizeof *m);
}

static bool same_str(const char *a, const char *b)
{
	return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* Does move m concern a stream of (level, db, coll)? any: every move does (the stream
 * waits for a holdout's position). */
static bool concerns(const move *m, int level, const char *db, const char *coll, bool any)
{
	if (m->kind == MOVE_ALL || any)
		return true;
	if (m->kind == MOVE_POS)
		return false;
	if (level == PX_CSWAIT_CLUSTER)
		return true;
	for (size_t i = 0; i < m->nns; i++) {
		if (!same_str(m->db[i], db))
			continue;
		if (level == PX_CSWAIT_DB || m->coll[i] == NULL || same_str(m->coll[i], coll))
			return true;
	}
	return false;
}

/* Under mu. */
static bool moved_locked(px_cswait *w, const px_cswait_filter *f, const char *id, uint64_t since)
{
	if (since >= w->seq)
		return false;
	if (w->seq - since >= PX_CSWAIT_RING)
		return true; /* older than the ring: may have moved */
	for (uint64_t q = since + 1; q <= w->seq; q++) {
		const move *m = &w->ring[q % PX_CSWAIT_RING];
		if (m->seq != q)
			return true;
		if (m->shard != NULL && !same_str(m->shard, id))
			continue;
		if (f == NULL ? true : concerns(m, f->level, f->db, f->coll, false))
			return true;
	}
	return false;
}

/* Number m (taken: its strings are the table's now), keep it in the ring, and hand the
 * parked getMores it concerns back to the workers. */
static void report(px_cswait *w, move *m)
{
	park *woken = NULL, **pp;
	size_t nw = 0;

	uv_mutex_lock(&w->mu);
	m->seq = ++w->seq;
	move *slot = &w->ring[m->seq % PX_CSWAIT_RING];
	move_clear(slot);
	*slot = *m;
	memset(m, 0, sizeof *m);
	for (pp = &w->head; *pp != NULL;) {
		park *e = *pp;
		if (concerns(slot, e->level, e->db, e->coll, e->pending)) {
			*pp = e->next;
			e->next = woken;
			woken = e;
			w->n--;
			nw++;
		} else {
			pp = &e->next;
		}
	}
	if (nw > 0)
		set_gauge(w);
	uv_mutex_unlock(&w->mu);
	if (nw > 0 && w->m_wakes)
		sdb_counter_add(w->m_wakes, nw);
	resume_list(w, woken);
}

/* Report "anything may have moved" on shard id (NULL: every shard). */
static void report_all(px_cswait *w, const char *id)
{
	move m;

	memset(&m, 0, sizeof m);
	m.kind = MOVE_ALL;
	m.shard = id ? sdb_strdup(id) : NULL;
	report(w, &m);
}

/* Add namespace (db, coll) (coll NULL: the database) to m, once; past MOVE_NS_MAX m
 * becomes MOVE_ALL. */
static void move_add_ns(move *m, const char *db, const char *coll)
{
	if (m->kind == MOVE_ALL)
		return;
	for (size_t i = 0; i < m->nns; i++)
		if (same_str(m->db[i], db) &&
		    (m->coll[i] == NULL ? coll == NULL : same_str(m->coll[i], coll)))
			return;
	if (m->nns == MOVE_NS_MAX) {
		m->kind = MOVE_ALL;
		return;
	}
	m->db[m->nns] = sdb_strdup(db);
	m->coll[m->nns] = coll ? sdb_strdup(coll) : NULL;
	m->nns++;
	m->kind = MOVE_NS;
}

/* Add the namespaces of event ev (`ns`, and `to` of a rename) to m; an event whose `ns`
 * has no database name makes m MOVE_ALL (it cannot be classified). */
static void move_add_event(move *m, const bson_t *ev)
{
	static const char *const fields[] = {"ns", "to"};

	for (size_t k = 0; k < 2; k++) {
		bson_t d;
		bson_iter_t it;
		const char *db = NULL, *coll = NULL;

		if (!px_get_doc(ev, fields[k], &d)) {
			if (k == 0)
				m->kind = MOVE_ALL;
			continue;
		}
		if (bson_iter_init_find(&it, &d, "db") && BSON_ITER_HOLDS_UTF8(&it))
			db = bson_iter_utf8(&it, NULL);
		if (bson_iter_init_find(&it, &d, "coll") && BSON_ITER_HOLDS_UTF8(&it))
			coll = bson_iter_utf8(&it, NULL);
		if (db == NULL) {
			m->kind = MOVE_ALL;
			continue;
		}
		move_add_ns(m, db, coll);
	}
}

static void set_gauge(px_cswait *w)
{
	if (w->m_parked)
		sdb_gauge_set(w->m_parked, (int64_t)w->n);
}

/* ---------- the parker: deadlines ---------- */

static void parker_main(void *arg)
{
	px_cswait *w = arg;

	uv_mutex_lock(&w->mu);
	while (!atomic_load(&w->quit)) {
		uint64_t now = sdb_mono_ms(), next = now + 1000;
		park *due = NULL, **pp = &w->head;
		while (*pp != NULL) {
			park *e = *pp;
			if (e->until_ms <= now) {
				*pp = e->next;
				e->next = due;
				due = e;
				w->n--;
			} else {
				if (e->until_ms < next)
					next = e->until_ms;
				pp = &e->next;
			}
		}
		if (due != NULL) {
			set_gauge(w);
			uv_mutex_unlock(&w->mu);
			resume_list(w, due);
			uv_mutex_lock(&w->mu);
			continue;
		}
		uv_cond_timedwait(&w->cv, &w->mu, (next - now) * 1000000ULL);
	}
	uv_mutex_unlock(&w->mu);
}

/* ---------- watchers: one awaitData tail per shard ---------- */

typedef struct watch_set {
	px_cswait *w;
	char **ids;
	size_t n;
	atomic_bool restart; /* the shard list changed: every unit ends, the set is made anew */
} watch_set;

/* Sleep ms unless the proxy stops. */
static void watch_pause(px_cswait *w, uint64_t ms)
{
	uint64_t end = sdb_mono_ms() + ms;

	while (!atomic_load(&w->quit) && sdb_mono_ms() < end)
		uv_sleep(20);
}

static bool same_ids(char **a, size_t na, char **b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return true;
}

static void free_ids(char **ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
}

/* One shard's watcher: a deployment-wide change stream on it (every event and note moves
 * its postBatchResumeToken), each awaitData getMore's answer compared with the last. */
static void watch_unit(void *arg, size_t i)
{
	watch_set *ws = arg;
	px_cswait *w = ws->w;
	const char *id = ws->ids[i];
	int64_t cursor = 0;
	uint32_t sid = 0;
	sdb_cs_token last;
	bool have = false;

	memset(&last, 0, sizeof last);
	while (!atomic_load(&w->quit) && !atomic_load(&ws->restart)) {
		bson_t cmd = BSON_INITIALIZER, reply, cur, arr, tokd;
		const char *field = "nextBatch";
		char err[256];
		bool moved = false;

		if (cursor == 0) {
			bson_t pl, st, spec, c;
			BSON_APPEND_INT32(&cmd, "aggregate", 1);
			bson_append_array_begin(&cmd, "pipeline", -1, &pl);
			bson_append_document_begin(&pl, "0", -1, &st);
			bson_append_document_begin(&st, "$changeStream", -1, &spec);
			BSON_APPEND_BOOL(&spec, "allChangesForCluster", true);
			BSON_APPEND_UTF8(&spec, "fullDocument", "default");
			BSON_APPEND_BOOL(&spec, "$stripedbMerge", true);
			BSON_APPEND_UTF8(&spec, "$stripedbShardId", id);
			bson_append_document_end(&st, &spec);
			bson_append_document_end(&pl, &st);
			bson_append_array_end(&cmd, &pl);
			bson_append_document_begin(&cmd, "cursor", -1, &c);
			BSON_APPEND_INT32(&c, "batchSize", 1000);
			bson_append_document_end(&cmd, &c);
			field = "firstBatch";
			sid = 0;
		} else {
			BSON_APPEND_INT64(&cmd, "getMore", cursor);
			BSON_APPEND_UTF8(&cmd, "collection", "$cmd.aggregate");
			BSON_APPEND_INT32(&cmd, "batchSize", 1000);
			BSON_APPEND_INT64(&cmd, "maxTimeMS", PX_CSWAIT_WATCH_AWAIT_MS);
		}
		/* a shard that stops answering (SIGSTOP) fails the call after the await and
		 * 10 s, not libmongoc's socket timeout */
		shardconn_set_op_deadline(sdb_mono_ms() + PX_CSWAIT_WATCH_AWAIT_MS + 10000);
		int st = proxy_shard_command(w->p, id, "admin", &cmd, &sid, &reply, err, sizeof err);
		shardconn_set_op_deadline(0);
		sdb_cs_token t;
		char terr[128];
		move m;
		memset(&m, 0, sizeof m);
		m.kind = MOVE_POS;
		if (st == SHARDCONN_OK && px_get_doc(&reply, "cursor", &cur) &&
		    px_get_array(&cur, field, &arr) && px_get_doc(&cur, "postBatchResumeToken", &tokd) &&
		    sdb_cs_token_parse(&tokd, &t, terr, sizeof terr) == 0) {
			bson_iter_t it;
			cursor = px_get_int(&cur, "id", 0);
			/* what moved: the namespaces of its events; the first answer of a cursor
			 * (opened at the shard's present: what came before it was not seen) and
			 * anything it cannot classify move everything */
			moved = !bson_empty(&arr) || !have || sdb_cs_token_cmp(&t, &last) != 0;
			if (!have)
				m.kind = MOVE_ALL;
			if (bson_iter_init(&it, &arr)) {
				while (bson_iter_next(&it) && m.kind != MOVE_ALL) {
					uint32_t len;
					const uint8_t *data;
					bson_t ev;
					if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
						m.kind = MOVE_ALL;
						break;
					}
					bson_iter_document(&it, &len, &data);
					if (!bson_init_static(&ev, data, len)) {
						m.kind = MOVE_ALL;
						break;
					}
					move_add_event(&m, &ev);
				}
			}
			last = t;
			have = true;
			if (set_stalled(w, id, false)) {
				moved = true; /* the streams may ask it again */
				m.kind = MOVE_ALL;
			}
		} else {
			/* past its deadline (the proxy answered MaxTimeMSExpired for it): the
			 * shard is stalled; the streams' rounds skip it until it answers */
			if (st == SHARDCONN_CMD_ERR &&
			    px_get_int(&reply, "code", 0) == WIRE_ERR_MAX_TIME_EXPIRED)
				set_stalled(w, id, true);
			/* down, failover, lost cursor: the streams see it in their own round */
			sdb_debug("change stream watcher: shard call failed", "shard=%s err=%s", id,
				  st == SHARDCONN_OK ? "no cursor in the reply" : err);
			cursor = 0;
			have = false; /* the reopened cursor's first answer moves everything */
			moved = true;
			m.kind = MOVE_ALL;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		if (moved) {
			m.shard = sdb_strdup(id);
			report(w, &m); /* takes m's strings */
		} else {
			move_clear(&m);
		}
		if (cursor == 0)
			watch_pause(w, PX_CSWAIT_WATCH_RETRY_MS);
		/* the shard list the refresh thread keeps (reloaded every second) */
		char **now_ids = NULL;
		size_t nn = shardconn_shard_ids(w->p->sc, &now_ids);
		if (!same_ids(now_ids, nn, ws->ids, ws->n))
			atomic_store(&ws->restart, true);
		free_ids(now_ids, nn);
	}
	if (cursor != 0) {
		bson_t cmd = BSON_INITIALIZER, reply, arr;
		char err[128];
		BSON_APPEND_UTF8(&cmd, "killCursors", "$cmd.aggregate");
		bson_append_array_begin(&cmd, "cursors", -1, &arr);
		BSON_APPEND_INT64(&arr, "0", cursor);
		bson_append_array_end(&cmd, &arr);
		shardconn_set_op_deadline(sdb_mono_ms() + 2000);
		proxy_shard_command(w->p, id, "admin", &cmd, &sid, &reply, err, sizeof err);
		shardconn_set_op_deadline(0);
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
}

static void watcher_main(void *arg)
{
	px_cswait *w = arg;

	while (!atomic_load(&w->quit)) {
		watch_set ws;
		memset(&ws, 0, sizeof ws);
		ws.w = w;
		ws.n = shardconn_shard_ids(w->p->sc, &ws.ids);
		atomic_init(&ws.restart, false);
		if (ws.n == 0) {
			free_ids(ws.ids, ws.n);
			watch_pause(w, 500);
			continue;
		}
		proxy_shard_fanout(w->p, ws.n, watch_unit, &ws);
		free_ids(ws.ids, ws.n);
		clear_stalled(w); /* the new set's watchers say again */
		/* the set changed: a new shard may have moved before its watcher opened */
		report_all(w, NULL);
	}
}

/* ---------- the table ---------- */

px_cswait *px_cswait_new(proxy *p)
{
	px_cswait *w = sdb_calloc(1, sizeof *w);

	w->p = p;
	uv_mutex_init(&w->mu);
	uv_cond_init(&w->cv);
	atomic_init(&w->quit, false);
	w->m_parked = sdb_metrics_gauge("stripedb_proxy_cs_parked",
					"Change stream getMores parked on the proxy (waiting for a "
					"shard to move or their await to end, holding no thread).",
					NULL);
	w->m_wakes = sdb_metrics_counter("stripedb_proxy_cs_wakes_total",
					 "Parked change stream getMores woken by a watcher's move (a "
					 "shard moved in a way that can concern their stream).",
					 NULL);
	w->ring = sdb_calloc(PX_CSWAIT_RING, sizeof *w->ring);
	if (sdb_uv_thread_create(&w->parker, parker_main, w) != 0)
		abort();
	return w;
}

void px_cswait_stop(px_cswait *w)
{
	park *all;

	if (w == NULL)
		return;
	uv_mutex_lock(&w->mu);
	w->stopping = true;
	all = w->head;
	w->head = NULL;
	w->n = 0;
	set_gauge(w);
	uv_mutex_unlock(&w->mu);
	resume_list(w, all);
}

void px_cswait_free(px_cswait *w)
{
	if (w == NULL)
		return;
	px_cswait_stop(w);
	uv_mutex_lock(&w->mu);
	atomic_store(&w->quit, true);
	uv_cond_broadcast(&w->cv);
	bool started = w->watcher_started;
	uv_mutex_unlock(&w->mu);
	uv_thread_join(&w->parker);
	if (started)
		uv_thread_join(&w->watcher);
	clear_stalled(w);
	for (size_t i = 0; i < PX_CSWAIT_RING; i++)
		move_clear(&w->ring[i]);
	free(w->ring);
	uv_cond_destroy(&w->cv);
	uv_mutex_destroy(&w->mu);
	free(w);
}

uint64_t px_cswait_seq(px_cswait *w)
{
	if (w == NULL)
		return 0;
	uv_mutex_lock(&w->mu);
	uint64_t q = w->seq;
	uv_mutex_unlock(&w->mu);
	return q;
}

bool px_cswait_moved(px_cswait *w, const px_cswait_filter *f, const char *id, uint64_t since)
{
	if (w == NULL)
		return false;
	uv_mutex_lock(&w->mu);
	bool r = moved_locked(w, f, id, since);
	uv_mutex_unlock(&w->mu);
	return r;
}

int px_cswait_park(px_cswait *w, wire_req *req, const char *user, const px_cswait_filter *f,
		   bool pending, const px_cswait_check *checks, size_t n, uint64_t until_ms,
		   struct proxy_cursor *cur)
{
	park *e;

	uv_mutex_lock(&w->mu);
	if (w->stopping || atomic_load(&w->quit)) {
		uv_mutex_unlock(&w->mu);
		return -1;
	}
	if (wire_req_conn_gone(req)) {
		/* its client closed (wire gone hook): not parked, the getMore drops it */
		uv_mutex_unlock(&w->mu);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (moved_locked(w, checks[i].any ? NULL : f, checks[i].id, checks[i].since)) {
			uv_mutex_unlock(&w->mu);
			return 0;
		}
	}
	if (!w->watcher_started) {
		if (sdb_uv_thread_create(&w->watcher, watcher_main, w) != 0)
			abort();
		w->watcher_started = true;
	}
	e = sdb_calloc(1, sizeof *e);
	e->req = req;
	e->user = user ? sdb_strdup(user) : NULL;
	e->until_ms = until_ms;
	e->level = f->level;
	e->db = f->db ? sdb_strdup(f->db) : NULL;
	e->coll = f->coll ? sdb_strdup(f->coll) : NULL;
	e->pending = pending;
	e->next = w->head;
	w->head = e;
	w->n++;
	set_gauge(w);
	/* a stop reports it as waiting, not unanswered (wire/server.h) */
	wire_req_wait_begin(req);
	proxy_cursor_checkin(w->p, cur); /* lock order: w->mu, then p->cmu */
	uv_cond_signal(&w->cv);
	uv_mutex_unlock(&w->mu);
	return 1;
}

void px_cswait_wake_all(px_cswait *w)
{
	report_all(w, NULL);
}

void px_cswait_wake_req(px_cswait *w, const wire_req *req)
{
	park *found = NULL, **pp;

	uv_mutex_lock(&w->mu);
	for (pp = &w->head; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->req == req) {
			found = *pp;
			*pp = found->next;
			found->next = NULL;
			w->n--;
			set_gauge(w);
			break;
		}
	}
	uv_mutex_unlock(&w->mu);
	resume_list(w, found);
}
