/* A migration's record in metadata and what the worker keeps around it: load and save
 * (compare-and-set on the state), the lease mig/<id>, the pause lease, the fault injection
 * points, and the chunk as routed (its range, fixed at registration). See migrate_int.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "common/bsonget.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/throttle.h"
#include "coordinator/migrate_int.h"

/* Fault injection for the crash tests (tests/integration/test_migration_faults.py):
 * STRIPEDB_MIGRATION_CRASH is a comma-separated list of points; the coordinator process
 * _exit(86)s the first time a worker reaches one of them:
 *   before:STATE / after:STATE   around the metadata update that enters STATE
 *   mid:import mid:replicate mid:verify mid:switch (after the bump, before the routing
 *   update) mid:clean
 * Unset in production: mig_crash_point() is one getenv-cached strstr. */
static const char *crash_spec(void)
{
	static const char *spec;
	static int init;
	if (!init) {
		spec = getenv("STRIPEDB_MIGRATION_CRASH");
		init = 1;
	}
	return spec;
}

void mig_crash_point(const char *kind, const char *what)
{
	const char *spec = crash_spec();
	char pt[64];
	if (!spec || !*spec)
		return;
	snprintf(pt, sizeof pt, "%s:%s", kind, what);
	size_t n = strlen(pt);
	for (const char *p = spec; (p = strstr(p, pt)) != NULL; p += n) {
		if ((p == spec || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) {
			sdb_warn("migration crash point", "point=%s", pt);
			_exit(86);
		}
	}
}

/* The lease is unknown once lease - lease/5 passed since the last acknowledged renewal
 * (metadata stamps expiry from its own clock at apply: a margin for the round trip). */
static bool lease_expired(mig *m)
{
	return (int64_t)sdb_mono_ms() - atomic_load(&m->last_renew) >
	       m->r->lease_ms - m->r->lease_ms / 5;
}

bool mig_stopping(mig *m)
{
	if (!atomic_load(&m->lost) && lease_expired(m)) {
		sdb_warn("migration lease unknown, stopping", "id=%s", m->id);
		atomic_store(&m->lost, true);
	}
	return atomic_load(&m->lost) || atomic_load(&m->r->stop);
}

/* Sleep up to ms, waking early on stop. */
void mig_nap(mig *m, int64_t ms)
{
	int64_t end = (int64_t)sdb_mono_ms() + ms;
	while (!mig_stopping(m) && (int64_t)sdb_mono_ms() < end) {
		int64_t left = end - (int64_t)sdb_mono_ms();
		usleep((useconds_t)(left > 50 ? 50000 : left * 1000));
	}
}

/* ------------------------------------------------------------ metadata */

int mig_meta_run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return 0;
	sdb_errf(err, errlen, SDB_EIO, "%s", e.message);
	return e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
}

int mig_lease(mongoc_client_t *c, const char *verb, const char *id, const char *holder,
		 int64_t ttl, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	char name[200];
	snprintf(name, sizeof name, "mig/%s", id);
	BSON_APPEND_UTF8(&cmd, verb, name);
	BSON_APPEND_UTF8(&cmd, "holder", holder);
	if (strcmp(verb, "releaseLease") != 0)
		BSON_APPEND_INT64(&cmd, "ttlMS", ttl);
	int rc = mig_meta_run(c, &cmd, &reply, err, errlen);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

void mig_keepalive(mig *m)
{
	(void)mig_stopping(m);
}

/* A metadata client for the renewals: the runner's URI with every timeout lease/6
 * (250 ms..2 s), well below the renewal period, so a renewal sent to a metadata leader
 * that hangs (SIGSTOP: TCP accepted, no answer) fails in time to be retried on the new
 * leader within the lease (the runner's own 10 s socket timeout outlasted a 5 s lease:
 * review). NULL when the URI does not parse. */
static mongoc_client_t *lease_client(mig *m)
{
	int32_t t = (int32_t)(m->r->lease_ms / 6 < 250 ? 250 : m->r->lease_ms / 6 > 2000 ? 2000
					  : m->r->lease_ms / 6);
	mongoc_uri_t *u = mongoc_uri_new(m->r->meta_uri);
	mongoc_client_t *c = NULL;

	if (!u)
		return NULL;
	mongoc_uri_set_option_as_int32(u, MONGOC_URI_CONNECTTIMEOUTMS, t);
	mongoc_uri_set_option_as_int32(u, MONGOC_URI_SOCKETTIMEOUTMS, t);
	mongoc_uri_set_option_as_int32(u, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, t);
	c = auth_cluster_client_new(mongoc_uri_get_string(u));
	mongoc_uri_destroy(u);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	return c;
}

/* The renewal thread: renew every lease/3 (retry every lease/10 after a failure, on a
 * fresh client: libmongoc keeps a server that timed out in its cooldown, and the fresh
 * client looks for the leader among every seed) until mig_lease_stop or a LockBusy
 * answer. */
static void *lease_thread(void *arg)
{
	mig *m = arg;
	int64_t period = m->r->lease_ms / 3, retry = m->r->lease_ms / 10;
	uint64_t next = (uint64_t)atomic_load(&m->last_renew) + (uint64_t)period;
	char err[256];
	sdb_log_set_thread("coordinator", m->id);
	pthread_mutex_lock(&m->ka_mu);
	while (!m->ka_stop) {
		if (sdb_mono_ms() < next) {
			sdb_cond_wait_until(&m->ka_cv, &m->ka_mu, next);
			continue;
		}
		pthread_mutex_unlock(&m->ka_mu);
		int64_t sent = (int64_t)sdb_mono_ms();
		int rc = mig_lease(m->ka_meta, "renewLease", m->id, m->r->holder, m->r->lease_ms,
				   err, sizeof err);
		pthread_mutex_lock(&m->ka_mu);
		if (rc == 0) {
			/* the ttl runs from the leader's apply, after `sent`: count from sent */
			atomic_store(&m->last_renew, sent);
			next = (uint64_t)(sent + period);
		} else if (rc == LEASE_BUSY) {
			sdb_warn("migration lease lost", "id=%s code=%d err=\"%s\"", m->id, rc, err);
			atomic_store(&m->lost, true);
			break;
		} else {
			sdb_warn("migration lease renewal failed, retrying", "id=%s code=%d err=\"%s\"",
				 m->id, rc, err);
			next = sdb_mono_ms() + (uint64_t)(retry > 0 ? retry : 1);
			mongoc_client_t *fresh = lease_client(m);
			if (fresh) {
				mongoc_client_destroy(m->ka_meta);
				m->ka_meta = fresh;
			}
		}
	}
	pthread_mutex_unlock(&m->ka_mu);
	return NULL;
}

int mig_lease_start(mig *m)
{
	m->ka_meta = lease_client(m);
	if (!m->ka_meta)
		return SDB_EIO;
	pthread_mutex_init(&m->ka_mu, NULL);
	sdb_cond_init_mono(&m->ka_cv);
	m->ka_stop = false;
	if (sdb_thread_create(&m->ka_th, lease_thread, m) != 0) {
		pthread_cond_destroy(&m->ka_cv);
		pthread_mutex_destroy(&m->ka_mu);
		mongoc_client_destroy(m->ka_meta);
		m->ka_meta = NULL;
		return SDB_ENOMEM;
	}
	m->ka_started = true;
	return 0;
}

void mig_lease_stop(mig *m)
{
	if (!m->ka_started)
		return;
	pthread_mutex_lock(&m->ka_mu);
	m->ka_stop = true;
	pthread_cond_signal(&m->ka_cv);
	pthread_mutex_unlock(&m->ka_mu);
	pthread_join(m->ka_th, NULL);
	pthread_cond_destroy(&m->ka_cv);
	pthread_mutex_destroy(&m->ka_mu);
	mongoc_client_destroy(m->ka_meta);
	m->ka_meta = NULL;
	m->ka_started = false;
}


/* Replication is paused while the lease mig-pause/<id> is held (`ctl migration pause ID`
 * takes it, `resume` releases it). Checked at most every 500 ms; metadata errors keep the
 * last answer. */
bool mig_paused(mig *m)
{
	int64_t now = (int64_t)sdb_mono_ms();
	if (now - m->pause_checked < 500)
		return m->is_paused;
	m->pause_checked = now;
	bson_t cmd = BSON_INITIALIZER, reply, l;
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	char name[200], err[256];
	snprintf(name, sizeof name, "mig-pause/%s", m->id);
	BSON_APPEND_UTF8(&cmd, "getLease", name);
	int rc = mig_meta_run(m->meta, &cmd, &reply, err, sizeof err);
	if (rc == 0) {
		m->is_paused = false;
		if (bson_iter_init_find(&it, &reply, "lease") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			bson_init_static(&l, data, len);
			/* expiresMS is the leader's epoch ms */
			m->is_paused = mig_it_int(&l, "expiresMS", 0) > sdb_wall_ms();
		}
	} else if (rc > 0) {
		m->is_paused = false; /* no such lease */
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return m->is_paused;
}

bool mig_catchup_paused(mig *m)
{
	if (!mig_paused(m))
		return false;
	m->lag_since = 0;
	mig_nap(m, 100);
	return true;
}

mig_import_order mig_import_order_parse(const char *s)
{
	if (strcmp(s, "index") == 0)
		return MIG_ORDER_INDEX;
	if (strcmp(s, "arrival") == 0)
		return MIG_ORDER_ARRIVAL;
	if (strcmp(s, "id") == 0)
		return MIG_ORDER_ID;
	return MIG_IMPORT_ORDER_DEFAULT;
}

bool mig_it_str(const bson_t *d, const char *k, char *out, size_t n)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_UTF8(&it))
		return false;
	snprintf(out, n, "%s", bson_iter_utf8(&it, NULL));
	return true;
}

int64_t mig_it_int(const bson_t *d, const char *k, int64_t def)
{
	bson_iter_t it;
	int64_t v;
	if (!bson_iter_init_find(&it, d, k) || !sdb_bson_as_int64(&it, &v))
		return def;
	return v;
}

uint64_t mig_it_ts(const bson_t *d, const char *k)
{
	bson_iter_t it;
	uint32_t t, i;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_TIMESTAMP(&it))
		return 0;
	bson_iter_timestamp(&it, &t, &i);
	return (uint64_t)t << 32 | i;
}

bool mig_it_doc(const bson_t *d, const char *k, bson_t *out)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len);
}

static void append_ts(bson_t *b, const char *k, uint64_t ts)
{
	BSON_APPEND_TIMESTAMP(b, k, (uint32_t)(ts >> 32), (uint32_t)ts);
}

static void build_checkpoint(mig *m, bson_t *cp)
{
	bson_init(cp);
	append_ts(cp, "ts", m->fwd.pos ? m->fwd.pos : m->ts);
	append_ts(cp, "importTs", m->import_ts);
	append_ts(cp, "revTs", m->rev.pos ? m->rev.pos : m->rev_ts);
	append_ts(cp, "bumpTs", m->bump_ts);
	BSON_APPEND_INT64(cp, "token", m->token);
	BSON_APPEND_INT64(cp, "attempts", m->attempts);
	BSON_APPEND_BOOL(cp, "targetCleaned", m->target_cleaned);
	if (m->min && m->max && m->key) {
		BSON_APPEND_DOCUMENT(cp, "key", m->key);
		BSON_APPEND_DOCUMENT(cp, "min", m->min);
		BSON_APPEND_DOCUMENT(cp, "max", m->max);
		BSON_APPEND_BOOL(cp, "hashed", m->rc && m->rc->hashed);
	}
}

static void build_stats(mig *m, bson_t *st)
{
	bson_t a, v;
	bson_init(st);
	BSON_APPEND_INT64(st, "imported", m->imported);
	BSON_APPEND_INT64(st, "importBytes", m->import_bytes);
	BSON_APPEND_INT64(st, "importMS", m->import_ms);
	BSON_APPEND_INT64(st, "importThrottledMS", m->throttled_ms);
	BSON_APPEND_INT64(st, "applied", m->fwd.applied);
	BSON_APPEND_INT64(st, "skipped", m->fwd.skipped);
	BSON_APPEND_INT64(st, "reverseApplied", m->rev.applied);
	BSON_APPEND_INT64(st, "deleted", m->deleted);
	int64_t lag = 0;
	if (m->fwd.pos && !m->fwd.caught_up && m->fwd.pos > m->import_ts)
		lag = sdb_wall_ms() - (int64_t)(m->fwd.pos >> 32) * 1000;
	BSON_APPEND_INT64(st, "lagMS", lag < 0 ? 0 : lag);
	BSON_APPEND_BOOL(st, "caughtUp", m->fwd.caught_up);
	BSON_APPEND_BOOL(st, "paused", m->is_paused);
	BSON_APPEND_INT64(st, "switchAttempts", m->attempts);
	BSON_APPEND_ARRAY_BEGIN(st, "pausesMS", &a);
	for (int i = 0; i < m->npauses; i++) {
		char k[16];
		snprintf(k, sizeof k, "%d", i);
		BSON_APPEND_INT64(&a, k, m->pauses[i]);
	}
	bson_append_array_end(st, &a);
	BSON_APPEND_INT64(st, "pauseMS", m->last_pause_ms);
	BSON_APPEND_DOCUMENT_BEGIN(st, "verify", &v);
	BSON_APPEND_INT64(&v, "count", m->verify_count);
	BSON_APPEND_INT64(&v, "missing", m->verify_missing);
	BSON_APPEND_INT64(&v, "extra", m->verify_extra);
	BSON_APPEND_INT64(&v, "different", m->verify_different);
	bson_append_document_end(st, &v);
	if (m->verify_mode[0]) {
		BSON_APPEND_DOCUMENT_BEGIN(st, "verifySource", &v);
		BSON_APPEND_UTF8(&v, "mode", m->verify_mode);
		BSON_APPEND_INT64(&v, "oplogEntries", m->verify_oplog);
		BSON_APPEND_INT64(&v, "changed", m->verify_changed);
		BSON_APPEND_INT64(&v, "read", m->verify_read);
		BSON_APPEND_INT64(&v, "postImages", m->verify_post);
		bson_append_document_end(st, &v);
	}
	if (m->error[0])
		BSON_APPEND_UTF8(st, "error", m->error);
}

/* updateMigration with expectState = current state. to = m->state to only save progress.
 * Returns 0, SDB_ECONFLICT when the state changed under us (m->state reloaded by the
 * caller), SDB_EINVAL for a transition outside the table, SDB_EIO. */
int mig_save(mig *m, mig_state to)
{
	if (to != m->state && !migrate_transition_ok(m->state, to)) {
		sdb_error("migration: transition not allowed", "id=%s from=%s to=%s", m->id,
			  migrate_state_name(m->state), migrate_state_name(to));
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL, "transition %s -> %s not allowed",
				migrate_state_name(m->state), migrate_state_name(to));
	}
	if (to != m->state)
		mig_crash_point("before", migrate_state_name(to));
	bson_t cmd = BSON_INITIALIZER, cp, st, reply;
	BSON_APPEND_UTF8(&cmd, "updateMigration", m->id);
	BSON_APPEND_UTF8(&cmd, "expectState", migrate_state_name(m->state));
	BSON_APPEND_UTF8(&cmd, "state", migrate_state_name(to));
	build_checkpoint(m, &cp);
	build_stats(m, &st);
	BSON_APPEND_DOCUMENT(&cmd, "checkpoint", &cp);
	BSON_APPEND_DOCUMENT(&cmd, "stats", &st);
	int rc = mig_meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	bson_destroy(&cp);
	bson_destroy(&st);
	if (rc == WRITE_CONFLICT)
		return SDB_ECONFLICT;
	if (rc != 0)
		return SDB_EIO;
	mig_state from = m->state;
	m->state = to;
	m->last_ckpt = (int64_t)sdb_mono_ms();
	if (to != from) {
		sdb_info("migration state", "id=%s from=%s to=%s", m->id, migrate_state_name(from),
			 migrate_state_name(to));
		if (to == MIG_SWITCHED && from == MIG_SWITCHING)
			sdb_counter_inc(m->r->c_switches);
		else if (to == MIG_REPLICATING && from == MIG_SWITCHING)
			sdb_counter_inc(m->r->c_rolled);
		else if (to == MIG_COMPLETE)
			sdb_counter_inc(m->r->c_complete);
		else if (to == MIG_ABORTED)
			sdb_counter_inc(m->r->c_aborted);
		mig_crash_point("after", migrate_state_name(to));
	}
	return 0;
}

/* Load the record (state, spec, checkpoint, stats). Returns 0, SDB_ENOTFOUND, SDB_EIO. */
int mig_load(mig *m)
{
	bson_t cmd = BSON_INITIALIZER, reply, rec, spec, cp, st;
	char s[64];
	int rc;
	BSON_APPEND_UTF8(&cmd, "getMigration", m->id);
	rc = mig_meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&cmd);
	if (rc != 0) {
		bson_destroy(&reply);
		return rc > 0 ? SDB_ENOTFOUND : SDB_EIO;
	}
	if (!mig_it_doc(&reply, "migration", &rec) || !mig_it_str(&rec, "state", s, sizeof s)) {
		bson_destroy(&reply);
		return sdb_errf(m->err, sizeof m->err, SDB_EIO, "getMigration: bad reply");
	}
	m->state = migrate_state_parse(s);
	if (mig_it_doc(&rec, "spec", &spec)) {
		mig_it_str(&spec, "ns", m->ns, sizeof m->ns);
		m->chunk = mig_it_int(&spec, "chunk", 0);
		if (m->chunk == 0 && mig_it_str(&spec, "chunk", m->chunk_s, sizeof m->chunk_s))
			m->chunk = strtoll(m->chunk_s, NULL, 10);
		snprintf(m->chunk_s, sizeof m->chunk_s, "%" PRId64, m->chunk);
		mig_it_str(&spec, "from", m->src, sizeof m->src);
		mig_it_str(&spec, "to", m->dst, sizeof m->dst);
		m->max_pause_ms = mig_it_int(&spec, "maxPauseMS", 2000);
		m->grace_ms = mig_it_int(&spec, "graceMS", 5000);
		m->delete_batch = mig_it_int(&spec, "deleteBatch", 500);
		m->delete_delay_ms = mig_it_int(&spec, "deleteDelayMS", 5);
		m->max_attempts = mig_it_int(&spec, "maxSwitchAttempts", 5);
		m->max_catchup_ms = mig_it_int(&spec, "maxCatchUpMS", 600000);
		m->apply_rate = mig_it_int(&spec, "applyRate", 0);
		m->import_latency_ms = mig_it_int(&spec, "importLatencyMS", SDB_IMPORT_LATENCY_MS);
		m->session_history_ms = mig_it_int(&spec, "sessionHistoryMS", 31 * 60 * 1000);
		char order[32] = "";
		mig_it_str(&spec, "importOrder", order, sizeof order);
		m->import_order = mig_import_order_parse(order);
		if (m->delete_batch <= 0)
			m->delete_batch = 500;
	}
	if (mig_it_doc(&rec, "checkpoint", &cp)) {
		bson_t d;
		m->ts = mig_it_ts(&cp, "ts");
		m->import_ts = mig_it_ts(&cp, "importTs");
		m->rev_ts = mig_it_ts(&cp, "revTs");
		m->bump_ts = mig_it_ts(&cp, "bumpTs");
		m->token = mig_it_int(&cp, "token", 0);
		m->attempts = mig_it_int(&cp, "attempts", 0);
		bson_iter_t it;
		m->target_cleaned = bson_iter_init_find(&it, &cp, "targetCleaned") &&
				    bson_iter_as_bool(&it);
		if (!m->min && mig_it_doc(&cp, "min", &d)) {
			m->min = bson_copy(&d);
			if (mig_it_doc(&cp, "max", &d))
				m->max = bson_copy(&d);
			if (mig_it_doc(&cp, "key", &d))
				m->key = bson_copy(&d);
		}
	}
	if (mig_it_doc(&rec, "stats", &st)) {
		bson_iter_t it, a;
		m->imported = mig_it_int(&st, "imported", 0);
		m->import_bytes = mig_it_int(&st, "importBytes", 0);
		m->import_ms = mig_it_int(&st, "importMS", 0);
		m->fwd.applied = mig_it_int(&st, "applied", 0);
		m->fwd.skipped = mig_it_int(&st, "skipped", 0);
		m->rev.applied = mig_it_int(&st, "reverseApplied", 0);
		m->deleted = mig_it_int(&st, "deleted", 0);
		m->last_pause_ms = mig_it_int(&st, "pauseMS", 0);
		m->npauses = 0;
		if (bson_iter_init_find(&it, &st, "pausesMS") && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &a))
			while (bson_iter_next(&a) && m->npauses < 64)
				m->pauses[m->npauses++] = bson_iter_as_int64(&a);
		bson_t v;
		if (mig_it_doc(&st, "verify", &v)) {
			m->verify_count = mig_it_int(&v, "count", 0);
			m->verify_missing = mig_it_int(&v, "missing", 0);
			m->verify_extra = mig_it_int(&v, "extra", 0);
			m->verify_different = mig_it_int(&v, "different", 0);
		}
		if (mig_it_doc(&st, "verifySource", &v)) {
			mig_it_str(&v, "mode", m->verify_mode, sizeof m->verify_mode);
			m->verify_oplog = mig_it_int(&v, "oplogEntries", 0);
			m->verify_changed = mig_it_int(&v, "changed", 0);
			m->verify_read = mig_it_int(&v, "read", 0);
			m->verify_post = mig_it_int(&v, "postImages", 0);
		}
	}
	bson_destroy(&reply);
	char *dot = strchr(m->ns, '.');
	if (!dot || m->chunk <= 0 || !m->src[0] || !m->dst[0])
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL,
				"migration spec needs ns DB.COLL, chunk, from and to");
	snprintf(m->db, sizeof m->db, "%.*s", (int)(dot - m->ns), m->ns);
	snprintf(m->coll, sizeof m->coll, "%s", dot + 1);
	return 0;
}

/* Fail the migration for good (before the switch): aborted with the reason. */
int mig_fail(mig *m, const char *why)
{
	snprintf(m->error, sizeof m->error, "%s", why);
	sdb_warn("migration aborted", "id=%s reason=\"%s\"", m->id, why);
	return mig_save(m, MIG_ABORTED);
}

/* The chunk as routed now: shard and token. Returns 0, SDB_ENOTFOUND (no such chunk any
 * more), SDB_EIO. With full, also fills the key pattern and bounds when m has none. */
int mig_routing_chunk(mig *m, char *shard, size_t shardlen, int64_t *token)
{
	bson_t resume = BSON_INITIALIZER, key = BSON_INITIALIZER;
	bool more = true, first = true, found = false, have_key = false;
	int rc = 0;

	/* the collection's table by cursor (issue #26: any size, batches of at most 8 MB) */
	while (more && !found) {
		bson_t cmd = BSON_INITIALIZER, cur, reply, d;
		bson_iter_t it, arr;
		BSON_APPEND_UTF8(&cmd, "getRoutingTable", m->ns);
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
		bson_append_document_end(&cmd, &cur);
		if (!first)
			BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", &resume);
		rc = mig_meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
		bson_destroy(&cmd);
		if (rc != 0) {
			bson_destroy(&reply);
			rc = SDB_EIO;
			break;
		}
		if (first && mig_it_doc(&reply, "key", &d)) {
			bson_concat(&key, &d);
			have_key = true;
		}
		first = false;
		if (bson_iter_init_find(&it, &reply, "chunks") && bson_iter_recurse(&it, &arr)) {
			while (bson_iter_next(&arr)) {
				bson_t ch;
				const uint8_t *data;
				uint32_t len;
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				bson_iter_document(&arr, &len, &data);
				bson_init_static(&ch, data, len);
				if (mig_it_int(&ch, "id", 0) != m->chunk)
					continue;
				mig_it_str(&ch, "shard", shard, shardlen);
				*token = mig_it_int(&ch, "token", 0);
				if (!m->min && mig_it_doc(&ch, "min", &d)) {
					m->min = bson_copy(&d);
					if (mig_it_doc(&ch, "max", &d))
						m->max = bson_copy(&d);
					if (have_key)
						m->key = bson_copy(&key);
				}
				found = true;
				break;
			}
		}
		more = bson_iter_init_find(&it, &reply, "more") && bson_iter_as_bool(&it) &&
		       mig_it_doc(&reply, "resumeAfter", &d);
		if (more) {
			bson_reinit(&resume);
			bson_concat(&resume, &d);
		}
		bson_destroy(&reply);
	}
	bson_destroy(&resume);
	bson_destroy(&key);
	if (rc != 0)
		return rc;
	if (!found)
		return sdb_errf(m->err, sizeof m->err, SDB_ENOTFOUND, "chunk %" PRId64 " not in %s",
				m->chunk, m->ns);
	return 0;
}

/* Build the routing view of the chunk from key/min/max. */
int mig_build_view(mig *m)
{
	if (m->rc)
		return 0;
	if (!m->min || !m->max || !m->key)
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL, "chunk range unknown");
	bson_t table = BSON_INITIALIZER, arr, ch;
	BSON_APPEND_INT64(&table, "routingVersion", 1);
	BSON_APPEND_ARRAY_BEGIN(&table, "chunks", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &ch);
	BSON_APPEND_INT64(&ch, "id", m->chunk);
	BSON_APPEND_UTF8(&ch, "ns", m->ns);
	BSON_APPEND_DOCUMENT(&ch, "min", m->min);
	BSON_APPEND_DOCUMENT(&ch, "max", m->max);
	BSON_APPEND_UTF8(&ch, "shard", m->src);
	BSON_APPEND_INT64(&ch, "token", 1);
	bson_append_document_end(&arr, &ch);
	bson_append_array_end(&table, &arr);
	int rc = route_coll_build(m->ns, m->key, &table, &m->rc, m->err, sizeof m->err);
	bson_destroy(&table);
	return rc;
}

bool mig_in_chunk(mig *m, const bson_t *doc)
{
	return route_chunk_of_doc(m->rc, doc) == 0;
}

/* True when every key field is _id: the chunk of a document follows from its _id. */
bool mig_key_is_id(mig *m)
{
	for (size_t i = 0; i < m->rc->nkeys; i++)
		if (strcmp(m->rc->keys[i], "_id") != 0)
			return false;
	return true;
}
