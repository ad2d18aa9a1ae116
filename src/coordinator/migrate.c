/* The migration runner and the six steps of DESIGN.md §6 (see migrate.h for the states).
 *
 * Threads: migrate_runner_tick runs on the coordinator's manager thread and only lists
 * migrations, takes leases and starts workers; each migration this coordinator holds runs
 * on its own worker thread with its own libmongoc clients (metadata, source, target) and
 * its own CDC reader, so a long bulk import never delays the CDC publishers' lease renewals.
 * The worker renews mig/<id> every lease/3 and stops at once when the lease is lost.
 *
 * Shard I/O goes through libmongoc commands, so a real MongoDB shard is driven the same
 * way; the stripedb extensions used are stripedbSnapshot (atOplogTs), stripedbSetVersion and
 * $stripedbOrigin (src/shard/shard.h).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cdc/reader.h"
#include "auth/cluster.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "coordinator/filtering.h"
#include "coordinator/migrate.h"
#include "coordinator/migrate_sess.h"
#include "routing/route.h"
#include "storage/bsonval.h"

#define LEASE_BUSY 46
#define WRITE_CONFLICT 112
#define APPLY_BATCH_DOCS 500
#define APPLY_BATCH_BYTES (4u << 20)
#define IMPORT_BATCH_DOCS 1000
#define CHECKPOINT_EVERY_MS 1000
#define MAX_LISTED_DIFFS 20

typedef struct mig_job {
	char *id;
	pthread_t th;
	atomic_int done;
	struct migrate_runner *r;
	struct mig_job *next;
} mig_job;

struct migrate_runner {
	cdc_log *log;
	char *meta_uri;
	char *holder;
	int64_t lease_ms;
	int budget_global, budget_shard;
	atomic_int stop;
	pthread_mutex_t mu;
	mig_job *jobs;
	/* /metrics */
	sdb_histogram *h_pause;
	sdb_counter *c_switches, *c_rolled, *c_complete, *c_aborted;
	sdb_gauge *g_running;
};

/* ------------------------------------------------------------ time */

/* Time comes from common/clock.h; oplog ts and lag need the epoch (sdb_wall_ms). */

/* ------------------------------------------------------------ one migration */

typedef struct pending_ev {
	uint8_t *data;
	size_t len, cap;
	uint64_t ts;
	bool have;
} pending_ev;

typedef struct repl {
	const char *shard; /* whose log */
	cdc_reader *rd;
	uint64_t pos;      /* last ts applied (or skipped) */
	pending_ev pend;   /* an event read beyond a stop position */
	bool caught_up;    /* the last poll found nothing new */
	mongoc_client_t *to;
	bson_t batch;      /* pending update statements */
	uint32_t nbatch;
	bson_t recs;       /* pending session records alone ($stripedbSessions) */
	uint32_t nrecs;
	size_t batch_bytes;
	uint64_t batch_pos; /* pos once the batch is applied */
	int64_t applied, skipped;
} repl;

typedef struct mig {
	migrate_runner *r;
	mig_job *job;
	char id[128];
	mongoc_client_t *meta;
	mig_state state;
	/* spec */
	char ns[256], db[128], coll[128];
	int64_t chunk;
	char chunk_s[32];
	char src[64], dst[64];
	char *src_uri, *dst_uri;
	int64_t lag_since, max_catchup_ms;
	int64_t apply_rate; /* spec.applyRate: max events/s the replicator applies (0 = no cap) */
	int64_t rate_t0, rate_n;
	int64_t pause_checked;
	int64_t import_latency_ms, throttled_ms;
	int64_t session_history_ms; /* spec.sessionHistoryMS (session_history_start) */
	bool is_paused;
	int code; /* server error code of the last failed shard command */
	int64_t max_pause_ms, grace_ms, delete_batch, delete_delay_ms, max_attempts;
	bool arrival_order;
	/* routing view of the chunk (built from the checkpoint's range) */
	route_coll *rc;
	bson_t *min, *max;
	bson_t *key; /* key pattern */
	/* checkpoint */
	uint64_t ts, import_ts, rev_ts, bump_ts;
	int64_t token;
	int64_t attempts;
	bool target_cleaned;
	/* stats */
	int64_t imported, import_bytes, import_ms, deleted;
	int64_t pauses[64];
	int npauses;
	int64_t last_pause_ms;
	int64_t verify_count, verify_missing, verify_extra, verify_different;
	char error[1024];
	/* work */
	mongoc_client_t *sc, *dc;
	repl fwd, rev;
	int64_t last_renew, last_ckpt;
	bool lost;
	char err[512];
} mig;

/* Fault injection for the crash tests (tests/integration/test_migration_faults.py):
 * STRIPEDB_MIGRATION_CRASH is a comma-separated list of points; the coordinator process
 * _exit(86)s the first time a worker reaches one of them:
 *   before:STATE / after:STATE   around the metadata update that enters STATE
 *   mid:import mid:replicate mid:verify mid:switch (after the bump, before the routing
 *   update) mid:clean
 * Unset in production: crash_point() is one getenv-cached strstr. */
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

static void crash_point(const char *kind, const char *what)
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

static bool stopping(mig *m)
{
	return m->lost || atomic_load(&m->r->stop);
}

/* Sleep up to ms, waking early on stop. */
static void nap(mig *m, int64_t ms)
{
	int64_t end = (int64_t)sdb_mono_ms() + ms;
	while (!stopping(m) && (int64_t)sdb_mono_ms() < end) {
		int64_t left = end - (int64_t)sdb_mono_ms();
		usleep((useconds_t)(left > 50 ? 50000 : left * 1000));
	}
}

/* ------------------------------------------------------------ metadata */

static int meta_run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return 0;
	sdb_errf(err, errlen, SDB_EIO, "%s", e.message);
	return e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
}

static int lease(mongoc_client_t *c, const char *verb, const char *id, const char *holder,
		 int64_t ttl, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	char name[200];
	snprintf(name, sizeof name, "mig/%s", id);
	BSON_APPEND_UTF8(&cmd, verb, name);
	BSON_APPEND_UTF8(&cmd, "holder", holder);
	if (strcmp(verb, "releaseLease") != 0)
		BSON_APPEND_INT64(&cmd, "ttlMS", ttl);
	int rc = meta_run(c, &cmd, &reply, err, errlen);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* Renew the lease when a third of it passed. Sets m->lost on LockBusy. */
static void keepalive(mig *m)
{
	int64_t now = (int64_t)sdb_mono_ms();
	if (now - m->last_renew < m->r->lease_ms / 3)
		return;
	char err[256];
	int rc = lease(m->meta, "renewLease", m->id, m->r->holder, m->r->lease_ms, err, sizeof err);
	if (rc == 0)
		m->last_renew = now;
	else if (rc > 0) {
		sdb_warn("migration lease lost", "id=%s code=%d", m->id, rc);
		m->lost = true;
	} else if (now - m->last_renew > m->r->lease_ms - m->r->lease_ms / 5) {
		/* cannot reach metadata for most of the ttl: another coordinator may take over */
		sdb_warn("migration lease unknown, stopping", "id=%s", m->id);
		m->lost = true;
	}
}

static bool it_str(const bson_t *d, const char *k, char *out, size_t n);
static int64_t it_int(const bson_t *d, const char *k, int64_t def);

/* Replication is paused while the lease mig-pause/<id> is held (`ctl migration pause ID`
 * takes it, `resume` releases it). Checked at most every 500 ms; metadata errors keep the
 * last answer. */
static bool paused(mig *m)
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
	int rc = meta_run(m->meta, &cmd, &reply, err, sizeof err);
	if (rc == 0) {
		m->is_paused = false;
		if (bson_iter_init_find(&it, &reply, "lease") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			bson_init_static(&l, data, len);
			/* expiresMS is the leader's epoch ms */
			m->is_paused = it_int(&l, "expiresMS", 0) > sdb_wall_ms();
		}
	} else if (rc > 0) {
		m->is_paused = false; /* no such lease */
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return m->is_paused;
}

static bool it_str(const bson_t *d, const char *k, char *out, size_t n)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_UTF8(&it))
		return false;
	snprintf(out, n, "%s", bson_iter_utf8(&it, NULL));
	return true;
}

static int64_t it_int(const bson_t *d, const char *k, int64_t def)
{
	bson_iter_t it;
	int64_t v;
	if (!bson_iter_init_find(&it, d, k) || !sdb_bson_as_int64(&it, &v))
		return def;
	return v;
}

static uint64_t it_ts(const bson_t *d, const char *k)
{
	bson_iter_t it;
	uint32_t t, i;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_TIMESTAMP(&it))
		return 0;
	bson_iter_timestamp(&it, &t, &i);
	return (uint64_t)t << 32 | i;
}

static bool it_doc(const bson_t *d, const char *k, bson_t *out)
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
	if (m->error[0])
		BSON_APPEND_UTF8(st, "error", m->error);
}

/* updateMigration with expectState = current state. to = m->state to only save progress.
 * Returns 0, SDB_ECONFLICT when the state changed under us (m->state reloaded by the
 * caller), SDB_EINVAL for a transition outside the table, SDB_EIO. */
static int save(mig *m, mig_state to)
{
	if (to != m->state && !migrate_transition_ok(m->state, to)) {
		sdb_error("migration: transition not allowed", "id=%s from=%s to=%s", m->id,
			  migrate_state_name(m->state), migrate_state_name(to));
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL, "transition %s -> %s not allowed",
				migrate_state_name(m->state), migrate_state_name(to));
	}
	if (to != m->state)
		crash_point("before", migrate_state_name(to));
	bson_t cmd = BSON_INITIALIZER, cp, st, reply;
	BSON_APPEND_UTF8(&cmd, "updateMigration", m->id);
	BSON_APPEND_UTF8(&cmd, "expectState", migrate_state_name(m->state));
	BSON_APPEND_UTF8(&cmd, "state", migrate_state_name(to));
	build_checkpoint(m, &cp);
	build_stats(m, &st);
	BSON_APPEND_DOCUMENT(&cmd, "checkpoint", &cp);
	BSON_APPEND_DOCUMENT(&cmd, "stats", &st);
	int rc = meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
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
		crash_point("after", migrate_state_name(to));
	}
	return 0;
}

/* Load the record (state, spec, checkpoint, stats). Returns 0, SDB_ENOTFOUND, SDB_EIO. */
static int load(mig *m)
{
	bson_t cmd = BSON_INITIALIZER, reply, rec, spec, cp, st;
	char s[64];
	int rc;
	BSON_APPEND_UTF8(&cmd, "getMigration", m->id);
	rc = meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&cmd);
	if (rc != 0) {
		bson_destroy(&reply);
		return rc > 0 ? SDB_ENOTFOUND : SDB_EIO;
	}
	if (!it_doc(&reply, "migration", &rec) || !it_str(&rec, "state", s, sizeof s)) {
		bson_destroy(&reply);
		return sdb_errf(m->err, sizeof m->err, SDB_EIO, "getMigration: bad reply");
	}
	m->state = migrate_state_parse(s);
	if (it_doc(&rec, "spec", &spec)) {
		it_str(&spec, "ns", m->ns, sizeof m->ns);
		m->chunk = it_int(&spec, "chunk", 0);
		if (m->chunk == 0 && it_str(&spec, "chunk", m->chunk_s, sizeof m->chunk_s))
			m->chunk = strtoll(m->chunk_s, NULL, 10);
		snprintf(m->chunk_s, sizeof m->chunk_s, "%" PRId64, m->chunk);
		it_str(&spec, "from", m->src, sizeof m->src);
		it_str(&spec, "to", m->dst, sizeof m->dst);
		m->max_pause_ms = it_int(&spec, "maxPauseMS", 2000);
		m->grace_ms = it_int(&spec, "graceMS", 5000);
		m->delete_batch = it_int(&spec, "deleteBatch", 500);
		m->delete_delay_ms = it_int(&spec, "deleteDelayMS", 5);
		m->max_attempts = it_int(&spec, "maxSwitchAttempts", 5);
		m->max_catchup_ms = it_int(&spec, "maxCatchUpMS", 600000);
		m->apply_rate = it_int(&spec, "applyRate", 0);
		m->import_latency_ms = it_int(&spec, "importLatencyMS", 50);
		m->session_history_ms = it_int(&spec, "sessionHistoryMS", 31 * 60 * 1000);
		char order[32] = "";
		it_str(&spec, "importOrder", order, sizeof order);
		m->arrival_order = strcmp(order, "arrival") == 0;
		if (m->delete_batch <= 0)
			m->delete_batch = 500;
	}
	if (it_doc(&rec, "checkpoint", &cp)) {
		bson_t d;
		m->ts = it_ts(&cp, "ts");
		m->import_ts = it_ts(&cp, "importTs");
		m->rev_ts = it_ts(&cp, "revTs");
		m->bump_ts = it_ts(&cp, "bumpTs");
		m->token = it_int(&cp, "token", 0);
		m->attempts = it_int(&cp, "attempts", 0);
		bson_iter_t it;
		m->target_cleaned = bson_iter_init_find(&it, &cp, "targetCleaned") &&
				    bson_iter_as_bool(&it);
		if (!m->min && it_doc(&cp, "min", &d)) {
			m->min = bson_copy(&d);
			if (it_doc(&cp, "max", &d))
				m->max = bson_copy(&d);
			if (it_doc(&cp, "key", &d))
				m->key = bson_copy(&d);
		}
	}
	if (it_doc(&rec, "stats", &st)) {
		bson_iter_t it, a;
		m->imported = it_int(&st, "imported", 0);
		m->import_bytes = it_int(&st, "importBytes", 0);
		m->import_ms = it_int(&st, "importMS", 0);
		m->fwd.applied = it_int(&st, "applied", 0);
		m->fwd.skipped = it_int(&st, "skipped", 0);
		m->rev.applied = it_int(&st, "reverseApplied", 0);
		m->deleted = it_int(&st, "deleted", 0);
		m->last_pause_ms = it_int(&st, "pauseMS", 0);
		m->npauses = 0;
		if (bson_iter_init_find(&it, &st, "pausesMS") && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &a))
			while (bson_iter_next(&a) && m->npauses < 64)
				m->pauses[m->npauses++] = bson_iter_as_int64(&a);
		bson_t v;
		if (it_doc(&st, "verify", &v)) {
			m->verify_count = it_int(&v, "count", 0);
			m->verify_missing = it_int(&v, "missing", 0);
			m->verify_extra = it_int(&v, "extra", 0);
			m->verify_different = it_int(&v, "different", 0);
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
static int fail(mig *m, const char *why)
{
	snprintf(m->error, sizeof m->error, "%s", why);
	sdb_warn("migration aborted", "id=%s reason=\"%s\"", m->id, why);
	return save(m, MIG_ABORTED);
}

/* The chunk as routed now: shard and token. Returns 0, SDB_ENOTFOUND (no such chunk any
 * more), SDB_EIO. With full, also fills the key pattern and bounds when m has none. */
static int routing_chunk(mig *m, char *shard, size_t shardlen, int64_t *token)
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
		rc = meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
		bson_destroy(&cmd);
		if (rc != 0) {
			bson_destroy(&reply);
			rc = SDB_EIO;
			break;
		}
		if (first && it_doc(&reply, "key", &d)) {
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
				if (it_int(&ch, "id", 0) != m->chunk)
					continue;
				it_str(&ch, "shard", shard, shardlen);
				*token = it_int(&ch, "token", 0);
				if (!m->min && it_doc(&ch, "min", &d)) {
					m->min = bson_copy(&d);
					if (it_doc(&ch, "max", &d))
						m->max = bson_copy(&d);
					if (have_key)
						m->key = bson_copy(&key);
				}
				found = true;
				break;
			}
		}
		more = bson_iter_init_find(&it, &reply, "more") && bson_iter_as_bool(&it) &&
		       it_doc(&reply, "resumeAfter", &d);
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
static int build_view(mig *m)
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

static bool in_chunk(mig *m, const bson_t *doc)
{
	return route_chunk_of_doc(m->rc, doc) == 0;
}

/* True when every key field is _id: the chunk of a document follows from its _id. */
static bool key_is_id(mig *m)
{
	for (size_t i = 0; i < m->rc->nkeys; i++)
		if (strcmp(m->rc->keys[i], "_id") != 0)
			return false;
	return true;
}

static int shard_uri(mig *m, const char *id, char **out)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	int rc;
	*out = NULL;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	rc = meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&cmd);
	if (rc == 0 && bson_iter_init_find(&it, &reply, "shards") && bson_iter_recurse(&it, &arr))
		while (bson_iter_next(&arr)) {
			bson_t s;
			const uint8_t *data;
			uint32_t len;
			char sid[64], uri[512];
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &len, &data);
			bson_init_static(&s, data, len);
			if (it_str(&s, "id", sid, sizeof sid) && strcmp(sid, id) == 0 &&
			    it_str(&s, "uri", uri, sizeof uri))
				*out = sdb_strdup(uri);
		}
	bson_destroy(&reply);
	if (rc != 0)
		return SDB_EIO;
	if (!*out)
		return sdb_errf(m->err, sizeof m->err, SDB_ENOTFOUND, "shard %s not found", id);
	return 0;
}

static mongoc_client_t *shard_client(const char *uri)
{
	const char *opts = "serverSelectionTimeoutMS=2000&connectTimeoutMS=2000"
			   "&socketTimeoutMS=60000&serverSelectionTryOnce=true";
	char *u;
	if (strchr(uri + 10, '?'))
		u = sdb_asprintf("%s&%s", uri, opts);
	else if (strchr(uri + 10, '/'))
		u = sdb_asprintf("%s?%s", uri, opts);
	else
		u = sdb_asprintf("%s/?%s", uri, opts);
	mongoc_client_t *c = auth_cluster_client_new(u); /* issue #10 */
	free(u);
	if (c) {
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
		mongoc_client_set_appname(c, "stripedb-migration");
	}
	return c;
}

static int connect_shards(mig *m)
{
	int rc;
	if (!m->src_uri && (rc = shard_uri(m, m->src, &m->src_uri)) != 0)
		return rc;
	if (!m->dst_uri && (rc = shard_uri(m, m->dst, &m->dst_uri)) != 0)
		return rc;
	if (!m->sc)
		m->sc = shard_client(m->src_uri);
	if (!m->dc)
		m->dc = shard_client(m->dst_uri);
	if (!m->sc || !m->dc)
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL, "bad shard uri");
	m->fwd.to = m->dc;
	m->fwd.shard = m->src;
	m->rev.to = m->sc;
	m->rev.shard = m->dst;
	return 0;
}

/* Run a command on a shard; a write reply with writeErrors is an error too. */
static int shard_run(mig *m, mongoc_client_t *c, const bson_t *cmd, bson_t *reply_out)
{
	bson_t reply;
	bson_error_t e;
	bson_iter_t it;
	int rc = 0;
	m->code = 0;
	if (!mongoc_client_command_simple(c, m->db, cmd, NULL, &reply, &e)) {
		m->code = e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "%s", e.message);
	} else if (bson_iter_init_find(&it, &reply, "writeErrors")) {
		char *j = bson_as_relaxed_extended_json(&reply, NULL);
		rc = sdb_errf(m->err, sizeof m->err, SDB_EIO, "write errors: %.300s", j);
		bson_free(j);
	}
	if (reply_out && rc == 0)
		bson_copy_to(&reply, reply_out);
	bson_destroy(&reply);
	return rc;
}

/* The shard's oplog head: atOplogTs of an empty snapshot read. */
static int oplog_head(mig *m, mongoc_client_t *c, uint64_t *ts)
{
	bson_t cmd = BSON_INITIALIZER, reply, f, cur;
	BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", m->coll);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
	BSON_APPEND_UTF8(&f, "_id", "\x01stripedb-oplog-head-probe");
	bson_append_document_end(&cmd, &f);
	int rc = shard_run(m, c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc)
		return rc;
	if (!it_doc(&reply, "cursor", &cur) || !(*ts = it_ts(&cur, "atOplogTs"))) {
		/* an empty oplog has head 0 */
		*ts = 0;
	}
	bson_destroy(&reply);
	return 0;
}

/* ------------------------------------------------------------ copying documents */

typedef int (*doc_fn)(mig *m, const bson_t *doc, void *arg);

/* Iterate the documents of the chunk in collection coll on client c: a snapshot
 * (stripedbSnapshot, *at = atOplogTs) when at != NULL, else a plain find; sorted by sort
 * (or none). Only documents of the chunk reach fn. */
static int scan_chunk(mig *m, mongoc_client_t *c, const bson_t *sort, const bson_t *proj,
		      uint64_t *at, doc_fn fn, void *arg)
{
	bson_t cmd = BSON_INITIALIZER, reply, cur;
	int rc = 0;
	if (at) {
		BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", m->coll);
		bson_t f = BSON_INITIALIZER;
		BSON_APPEND_DOCUMENT(&cmd, "filter", &f);
	} else {
		BSON_APPEND_UTF8(&cmd, "find", m->coll);
	}
	if (sort)
		BSON_APPEND_DOCUMENT(&cmd, "sort", sort);
	if (proj)
		BSON_APPEND_DOCUMENT(&cmd, "projection", proj);
	BSON_APPEND_INT32(&cmd, "batchSize", 1000);
	/* pin the command and its getMores to one selected server (serverId) */
	bson_error_t e;
	mongoc_server_description_t *sd = mongoc_client_select_server(c, false, NULL, &e);
	if (!sd) {
		bson_destroy(&cmd);
		return sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "scan: %s", e.message);
	}
	uint32_t server_id = mongoc_server_description_id(sd);
	mongoc_server_description_destroy(sd);
	m->code = 0;
	if (!mongoc_client_command_simple_with_server_id(c, m->db, &cmd, NULL, server_id, &reply,
							 &e)) {
		m->code = e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "scan: %s", e.message);
		bson_destroy(&reply);
	}
	bson_destroy(&cmd);
	if (rc)
		return rc;
	if (at) {
		*at = 0;
		if (it_doc(&reply, "cursor", &cur))
			*at = it_ts(&cur, "atOplogTs");
	}
	/* takes ownership of reply */
	bson_t copts = BSON_INITIALIZER;
	BSON_APPEND_INT32(&copts, "serverId", (int32_t)server_id);
	mongoc_cursor_t *cs = mongoc_cursor_new_from_command_reply_with_opts(c, &reply, &copts);
	bson_destroy(&copts);
	const bson_t *doc;
	int64_t t_next = (int64_t)sdb_mono_us();
	while (rc == 0 && mongoc_cursor_next(cs, &doc)) {
		/* import throttle: a getMore of the snapshot slower than importLatencyMS means
		 * the source is busy; back off as long as it took */
		int64_t took = (int64_t)sdb_mono_us() - t_next;
		if (at && m->import_latency_ms > 0 && took > m->import_latency_ms * 1000) {
			m->throttled_ms += took / 1000;
			nap(m, took / 1000);
		}
		if (in_chunk(m, doc))
			rc = fn(m, doc, arg);
		if (stopping(m))
			rc = sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
		t_next = (int64_t)sdb_mono_us();
	}
	if (rc == 0 && mongoc_cursor_error(cs, &e))
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "scan: %s", e.message);
	mongoc_cursor_destroy(cs);
	return rc;
}

typedef struct id_batch {
	bson_t arr;
	uint32_t n;
	mongoc_client_t *c;
} id_batch;

static int flush_deletes(mig *m, id_batch *b)
{
	if (b->n == 0)
		return 0;
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "delete", m->coll);
	BSON_APPEND_ARRAY(&cmd, "deletes", &b->arr);
	BSON_APPEND_BOOL(&cmd, "ordered", false);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	int rc = shard_run(m, b->c, &cmd, NULL);
	bson_destroy(&cmd);
	bson_reinit(&b->arr);
	if (rc == 0)
		m->deleted += b->n;
	b->n = 0;
	if (rc == 0 && m->state == MIG_CLEANING)
		crash_point("mid", "clean");
	return rc;
}

static int add_delete(mig *m, const bson_t *doc, void *arg)
{
	id_batch *b = arg;
	bson_iter_t it;
	bson_t s, q;
	char k[16];
	if (!bson_iter_init_find(&it, doc, "_id"))
		return 0;
	snprintf(k, sizeof k, "%u", b->n++);
	BSON_APPEND_DOCUMENT_BEGIN(&b->arr, k, &s);
	BSON_APPEND_DOCUMENT_BEGIN(&s, "q", &q);
	bson_append_iter(&q, "_id", 3, &it);
	bson_append_document_end(&s, &q);
	BSON_APPEND_INT32(&s, "limit", 1);
	bson_append_document_end(&b->arr, &s);
	if (b->n >= (uint32_t)m->delete_batch) {
		int rc = flush_deletes(m, b);
		if (rc)
			return rc;
		if (m->delete_delay_ms > 0)
			nap(m, m->delete_delay_ms);
		keepalive(m);
	}
	return 0;
}

static void key_projection(mig *m, bson_t *proj)
{
	bson_init(proj);
	BSON_APPEND_INT32(proj, "_id", 1);
	for (size_t i = 0; i < m->rc->nkeys; i++)
		if (strcmp(m->rc->keys[i], "_id") != 0)
			BSON_APPEND_INT32(proj, m->rc->keys[i], 1);
}

/* Delete the chunk's documents from c (throttled batches). */
static int delete_chunk(mig *m, mongoc_client_t *c)
{
	id_batch b = {.c = c};
	bson_t proj;
	bson_init(&b.arr);
	key_projection(m, &proj);
	int rc = scan_chunk(m, c, NULL, &proj, NULL, add_delete, &b);
	if (rc == 0)
		rc = flush_deletes(m, &b);
	bson_destroy(&b.arr);
	bson_destroy(&proj);
	return rc;
}

typedef struct ins_batch {
	bson_t arr;
	uint32_t n;
	size_t bytes;
} ins_batch;

static int flush_inserts(mig *m, ins_batch *b)
{
	if (b->n == 0)
		return 0;
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "insert", m->coll);
	BSON_APPEND_ARRAY(&cmd, "documents", &b->arr);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	int rc = shard_run(m, m->dc, &cmd, NULL);
	bson_destroy(&cmd);
	bson_reinit(&b->arr);
	if (rc == 0) {
		m->imported += b->n;
		m->import_bytes += (int64_t)b->bytes;
	}
	b->n = 0;
	b->bytes = 0;
	return rc;
}

static int add_insert(mig *m, const bson_t *doc, void *arg)
{
	ins_batch *b = arg;
	int rc;
	if (b->n && (b->n >= IMPORT_BATCH_DOCS || b->bytes + doc->len > APPLY_BATCH_BYTES) &&
	    (rc = flush_inserts(m, b)) != 0)
		return rc;
	if (m->imported > 0)
		crash_point("mid", "import");
	char k[16];
	snprintf(k, sizeof k, "%u", b->n++);
	BSON_APPEND_DOCUMENT(&b->arr, k, doc);
	b->bytes += doc->len;
	keepalive(m);
	return 0;
}

/* Copy the collection's indexes from the source to the target (idempotent). */
static int copy_indexes(mig *m)
{
	bson_t cmd = BSON_INITIALIZER, reply, specs;
	bson_iter_t it, cur, fb;
	int rc;
	BSON_APPEND_UTF8(&cmd, "listIndexes", m->coll);
	rc = shard_run(m, m->sc, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc) {
		if (m->code != 26) /* NamespaceNotFound: nothing to copy, create it empty */
			return rc;
		bson_init(&reply);
	}
	uint32_t n = 0;
	bson_init(&specs);
	if (bson_iter_init_find(&it, &reply, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "firstBatch") && bson_iter_recurse(&cur, &fb))
		while (bson_iter_next(&fb)) {
			bson_t ix, out;
			const uint8_t *data;
			uint32_t len;
			char name[256];
			if (!BSON_ITER_HOLDS_DOCUMENT(&fb))
				continue;
			bson_iter_document(&fb, &len, &data);
			bson_init_static(&ix, data, len);
			if (!it_str(&ix, "name", name, sizeof name) || strcmp(name, "_id_") == 0)
				continue;
			char k[16];
			snprintf(k, sizeof k, "%u", n++);
			bson_init(&out);
			bson_copy_to_excluding_noinit(&ix, &out, "v", "ns", NULL);
			BSON_APPEND_DOCUMENT(&specs, k, &out);
			bson_destroy(&out);
		}
	bson_destroy(&reply);
	bson_t c2 = BSON_INITIALIZER;
	if (n) {
		BSON_APPEND_UTF8(&c2, "createIndexes", m->coll);
		BSON_APPEND_ARRAY(&c2, "indexes", &specs);
	} else {
		BSON_APPEND_UTF8(&c2, "create", m->coll);
	}
	BSON_APPEND_UTF8(&c2, "$stripedbOrigin", m->id);
	rc = shard_run(m, m->dc, &c2, NULL);
	if (rc && n == 0 && m->code == 48) /* NamespaceExists */
		rc = 0;
	bson_destroy(&c2);
	bson_destroy(&specs);
	return rc;
}

/* ------------------------------------------------------------ replication */

static void repl_reset_batch(repl *p)
{
	bson_reinit(&p->batch);
	p->nbatch = 0;
	p->batch_bytes = 0;
	bson_reinit(&p->recs);
	p->nrecs = 0;
}

/* Statements or records waiting for repl_flush. */
static bool repl_pending(const repl *p)
{
	return p->nbatch || p->nrecs;
}

static int repl_flush(mig *m, repl *p)
{
	if (!repl_pending(p)) {
		if (p->batch_pos > p->pos)
			p->pos = p->batch_pos;
		return 0;
	}
	/* one command, one transaction on the target: the session records alone first,
	 * then the replayed statements (each with its own record, if any) */
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "update", m->coll);
	BSON_APPEND_ARRAY(&cmd, "updates", &p->batch);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	if (p->nrecs)
		BSON_APPEND_ARRAY(&cmd, "$stripedbSessions", &p->recs);
	int rc = shard_run(m, p->to, &cmd, NULL);
	bson_destroy(&cmd);
	if (rc)
		return rc; /* the batch stays; retried */
	p->applied += p->nbatch;
	repl_reset_batch(p);
	p->pos = p->batch_pos;
	if (m->state == MIG_REPLICATING)
		crash_point("mid", "replicate");
	return 0;
}

/* Delete _id on the replica when its document there belongs to the chunk; the delete
 * carries the source statement's session record when sess has one. */
static int repl_delete(mig *m, repl *p, const bson_iter_t *idit, const mig_sess *sess)
{
	bson_t q = BSON_INITIALIZER;
	int rc = 0;
	bool del = false;
	bson_append_iter(&q, "_id", 3, idit);
	if (key_is_id(m)) {
		del = in_chunk(m, &q);
	} else {
		bson_t cmd = BSON_INITIALIZER, reply, cur;
		bson_iter_t it, fb;
		BSON_APPEND_UTF8(&cmd, "find", m->coll);
		BSON_APPEND_DOCUMENT(&cmd, "filter", &q);
		BSON_APPEND_INT32(&cmd, "limit", 1);
		BSON_APPEND_BOOL(&cmd, "singleBatch", true);
		rc = shard_run(m, p->to, &cmd, &reply);
		bson_destroy(&cmd);
		if (rc == 0) {
			if (it_doc(&reply, "cursor", &cur) && bson_iter_init_find(&it, &cur, "firstBatch") &&
			    bson_iter_recurse(&it, &fb) && bson_iter_next(&fb) &&
			    BSON_ITER_HOLDS_DOCUMENT(&fb)) {
				bson_t d;
				const uint8_t *data;
				uint32_t len;
				bson_iter_document(&fb, &len, &data);
				bson_init_static(&d, data, len);
				del = in_chunk(m, &d);
			}
			bson_destroy(&reply);
		}
	}
	if (rc == 0 && del) {
		bson_t cmd = BSON_INITIALIZER, arr, s;
		BSON_APPEND_UTF8(&cmd, "delete", m->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "deletes", &arr);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &s);
		BSON_APPEND_DOCUMENT(&s, "q", &q);
		BSON_APPEND_INT32(&s, "limit", 1);
		if (sess && sess->have_result)
			mig_sess_append_stmt(&s, sess);
		bson_append_document_end(&arr, &s);
		bson_append_array_end(&cmd, &arr);
		BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
		rc = shard_run(m, p->to, &cmd, NULL);
		bson_destroy(&cmd);
		if (rc == 0)
			p->applied++;
	}
	bson_destroy(&q);
	return rc;
}

/* Skip an event: the position moves with it once nothing before it is pending. */
static int repl_skip(repl *p, uint64_t ts)
{
	p->skipped++;
	p->batch_pos = ts;
	if (!repl_pending(p))
		p->pos = ts;
	return 0;
}

/* A statement whose replay and record together would not fit in one command (16 MiB
 * BSON): its record is replaced by its session's incomplete-history marker (a retry is
 * refused, never run twice). */
#define SESS_RECORD_MAX_BYTES (15u << 20)

/* Queue a session record alone (or the session's incomplete-history marker). */
static void repl_add_record(repl *p, const mig_sess *sess, bool incomplete)
{
	if (sess->have_result && sess->result.len > SESS_RECORD_MAX_BYTES)
		incomplete = true;
	mig_sess_append_record(&p->recs, p->nrecs++, sess, incomplete);
	p->batch_bytes += sess->lsid.len + (sess->have_result ? sess->result.len : 0) + 64;
}

/* An event of a retryable write older than the import's snapshot (its document is already
 * on the target): only its session record travels, when the statement touched the chunk.
 * A delete whose chunk cannot be told (the shard key is not _id and the document is gone)
 * marks its session's history incomplete on the target. */
static int repl_history(mig *m, repl *p, uint64_t ts, const char *op, const bson_t *o,
			const mig_sess *sess)
{
	bool in, known = true;
	if (op[0] == 'd') {
		bson_iter_t it;
		bson_t q = BSON_INITIALIZER;
		if (bson_iter_init_find(&it, o, "_id"))
			bson_append_iter(&q, "_id", 3, &it);
		known = key_is_id(m);
		in = known && in_chunk(m, &q);
		bson_destroy(&q);
	} else {
		in = in_chunk(m, o);
	}
	if (known && !in)
		return repl_skip(p, ts);
	int rc;
	if (p->nrecs >= APPLY_BATCH_DOCS && (rc = repl_flush(m, p)) != 0)
		return rc;
	repl_add_record(p, sess, !known);
	p->batch_pos = ts;
	return 0;
}

/* Apply one event (already known to be after p->pos). Returns 0 or an error (the event
 * must then be retried: it is kept pending by the caller). */
static int repl_event(mig *m, repl *p, uint64_t ts, const uint8_t *data, size_t len)
{
	bson_t e, o;
	bson_iter_t it;
	char op[4] = "", ns[256] = "", origin[128] = "";
	int rc;
	if (!bson_init_static(&e, data, len))
		return sdb_errf(m->err, sizeof m->err, SDB_ECORRUPT, "bad CDC event");
	it_str(&e, "op", op, sizeof op);
	it_str(&e, "ns", ns, sizeof ns);
	it_str(&e, "origin", origin, sizeof origin);
	if (strcmp(ns, m->ns) != 0 || strcmp(origin, m->id) == 0 ||
	    (strcmp(op, "i") && strcmp(op, "u") && strcmp(op, "d")) || !it_doc(&e, "o", &o))
		return repl_skip(p, ts);
	mig_sess sess;
	mig_sess_of_event(&e, &sess);
	bool too_big = sess.have_result && (size_t)o.len + sess.result.len > SESS_RECORD_MAX_BYTES;
	if (p == &m->fwd && ts <= m->import_ts) {
		/* the session history window before the import's snapshot */
		if (!sess.on)
			return repl_skip(p, ts);
		return repl_history(m, p, ts, op, &o, &sess);
	}
	if (op[0] == 'd' || (op[0] == 'u' && !in_chunk(m, &o))) {
		/* a delete (or an update that left the chunk): in order with the batch */
		bool with_record = op[0] == 'd' && sess.have_result && !too_big;
		if (op[0] == 'd' && sess.on && !with_record)
			repl_add_record(p, &sess, true);
		if ((rc = repl_flush(m, p)) != 0)
			return rc;
		if (!bson_iter_init_find(&it, &o, "_id"))
			return 0;
		if ((rc = repl_delete(m, p, &it, with_record ? &sess : NULL)) != 0)
			return rc;
		p->pos = p->batch_pos = ts;
		return 0;
	}
	if (!in_chunk(m, &o))
		return repl_skip(p, ts);
	size_t extra = sess.have_result && !too_big ? sess.result.len + sess.lsid.len + 64 : 0;
	if (repl_pending(p) &&
	    (p->nbatch >= APPLY_BATCH_DOCS || p->nrecs >= APPLY_BATCH_DOCS ||
	     p->batch_bytes + o.len + extra > APPLY_BATCH_BYTES) &&
	    (rc = repl_flush(m, p)) != 0)
		return rc;
	if (!bson_iter_init_find(&it, &o, "_id"))
		return 0;
	bson_t s, q;
	char k[16];
	snprintf(k, sizeof k, "%u", p->nbatch++);
	BSON_APPEND_DOCUMENT_BEGIN(&p->batch, k, &s);
	BSON_APPEND_DOCUMENT_BEGIN(&s, "q", &q);
	bson_append_iter(&q, "_id", 3, &it);
	bson_append_document_end(&s, &q);
	BSON_APPEND_DOCUMENT(&s, "u", &o);
	BSON_APPEND_BOOL(&s, "upsert", true);
	if (sess.have_result && !too_big)
		mig_sess_append_stmt(&s, &sess);
	else if (sess.on)
		repl_add_record(p, &sess, true); /* a write whose outcome is unknown or too big */
	bson_append_document_end(&p->batch, &s);
	p->batch_bytes += o.len + extra;
	p->batch_pos = ts;
	return 0;
}

static void repl_close(repl *p)
{
	if (p->rd)
		cdc_reader_close(p->rd);
	p->rd = NULL;
	free(p->pend.data);
	memset(&p->pend, 0, sizeof p->pend);
	/* unapplied statements are read again from the log after pos */
	if (repl_pending(p))
		repl_reset_batch(p);
	p->batch_pos = p->pos;
}

/* Run the replicator until its position reaches `until` (0: until a poll finds nothing),
 * or until deadline_ms (monotonic; 0 = none). Returns 0 when reached (p->caught_up tells
 * whether the log was drained), SDB_ETIMEOUT at the deadline, or an error (target down:
 * SDB_EUNAVAILABLE; the position never moves past an unapplied event). */
static int repl_run(mig *m, repl *p, uint64_t start, uint64_t until, int64_t deadline_ms)
{
	int rc;
	if (!p->rd) {
		if (p->pos < start)
			p->pos = start;
		p->batch_pos = p->pos;
		if (!p->batch.len)
			bson_init(&p->batch);
		if (!p->recs.len)
			bson_init(&p->recs);
		rc = cdc_reader_open(m->r->log, p->shard, p->pos, &p->rd, m->err, sizeof m->err);
		if (rc)
			return rc;
	}
	p->caught_up = false;
	for (;;) {
		if (stopping(m))
			return sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
		if (until && p->pos >= until && !repl_pending(p))
			return 0;
		if (deadline_ms && (int64_t)sdb_mono_ms() >= deadline_ms) {
			(void)repl_flush(m, p);
			return (until && p->pos >= until) ? 0 : SDB_ETIMEOUT;
		}
		if (!p->pend.have) {
			cdc_event ev;
			rc = cdc_reader_next(p->rd, &ev, until ? 20 : 100, m->err, sizeof m->err);
			if (rc < 0)
				return rc;
			if (rc == 0) {
				if ((rc = repl_flush(m, p)) != 0)
					return rc;
				if (!until) {
					p->caught_up = true;
					return 0;
				}
				continue;
			}
			if (ev.len > p->pend.cap) {
				p->pend.cap = ev.len;
				p->pend.data = sdb_realloc(p->pend.data, ev.len);
			}
			memcpy(p->pend.data, ev.data, ev.len);
			p->pend.len = ev.len;
			p->pend.ts = ev.ts;
			p->pend.have = true;
		}
		if (p->pend.ts <= p->batch_pos) { /* already applied (resume) */
			p->pend.have = false;
			continue;
		}
		if (until && p->pend.ts > until) {
			/* beyond the stop position: keep it pending */
			if ((rc = repl_flush(m, p)) != 0)
				return rc;
			if (p->pos < until)
				p->pos = until;
			return 0;
		}
		rc = repl_event(m, p, p->pend.ts, p->pend.data, p->pend.len);
		if (rc)
			return rc;
		p->pend.have = false;
		keepalive(m);
		if (m->apply_rate > 0) {
			/* throttle: at most apply_rate events per second */
			int64_t now = (int64_t)sdb_mono_ms();
			if (now - m->rate_t0 >= 1000) {
				m->rate_t0 = now;
				m->rate_n = 0;
			}
			if (++m->rate_n >= m->apply_rate) {
				(void)repl_flush(m, p);
				nap(m, 1000 - ((int64_t)sdb_mono_ms() - m->rate_t0));
			}
		}
	}
}

/* Catch up with the head of the source's CDC log as it is now (events keep arriving under
 * load, so "a poll found nothing" is not the test): p->caught_up when the position reached
 * that head before deadline_ms. Returns 0, SDB_ETIMEOUT or an error of repl_run. */
static int repl_catch_up(mig *m, repl *p, uint64_t start, int64_t deadline_ms)
{
	cdc_range g;
	int rc = cdc_log_range(m->r->log, p->shard, &g, m->err, sizeof m->err);
	if (rc)
		return rc;
	uint64_t head = g.last_ts;
	if (head <= (p->pos > start ? p->pos : start)) {
		rc = repl_run(m, p, start, 0, deadline_ms);
		return rc;
	}
	rc = repl_run(m, p, start, head, deadline_ms);
	p->caught_up = rc == 0;
	return rc;
}

/* ------------------------------------------------------------ steps */

static int step_register(mig *m)
{
	char shard[64] = "";
	int64_t token = 0;
	int rc = routing_chunk(m, shard, sizeof shard, &token);
	if (rc == SDB_ENOTFOUND)
		return fail(m, m->err);
	if (rc)
		return rc;
	if (strcmp(shard, m->src) != 0) {
		char why[300];
		snprintf(why, sizeof why, "chunk %" PRId64 " is on %s, not on the source %s", m->chunk,
			 shard, m->src);
		return fail(m, why);
	}
	m->token = token;
	if ((rc = build_view(m)) != 0)
		return fail(m, m->err);
	if ((rc = connect_shards(m)) != 0)
		return rc;
	if ((rc = copy_indexes(m)) != 0)
		return rc;
	return save(m, MIG_IMPORTING);
}

/* Where the forward replicator starts: spec.sessionHistoryMS (default 31 minutes: the
 * logical session timeout, 30, and a minute of slack) before the import's snapshot at,
 * so that the session records of retryable writes to the chunk that ran before the
 * snapshot travel too (their documents are in the snapshot: only the records are written,
 * repl_history). Events of that window are read from the source's CDC log; when the log
 * no longer reaches back that far (retention), the window starts at its oldest event (the
 * older history is not carried: *complete is cleared, and the caller marks the source's
 * sessions incomplete on the target). */
static uint64_t session_history_start(mig *m, uint64_t at, bool *complete)
{
	uint64_t secs = at >> 32, back = (uint64_t)(m->session_history_ms / 1000);
	uint64_t start = secs > back ? (secs - back) << 32 : 0;
	*complete = true;
	if (m->session_history_ms <= 0) {
		*complete = false;
		return at;
	}
	cdc_reader *rd = NULL;
	char err[256];
	int rc = cdc_reader_open(m->r->log, m->src, start, &rd, err, sizeof err);
	if (rd)
		cdc_reader_close(rd);
	if (rc != SDB_ENOTFOUND)
		return start;
	cdc_range g;
	if (cdc_log_range(m->r->log, m->src, &g, err, sizeof err) == 0 && g.first_ts > start &&
	    g.first_ts < at) {
		rc = cdc_reader_open(m->r->log, m->src, g.first_ts, &rd, err, sizeof err);
		if (rd)
			cdc_reader_close(rd);
		if (rc == 0)
			start = g.first_ts;
		else
			start = at;
	} else {
		start = at;
	}
	sdb_warn("migration: session history not carried in full", "id=%s from_ts=%u:%u",
		 m->id, (unsigned)(start >> 32), (unsigned)start);
	*complete = false;
	return start;
}

/* The session history before the import could not be carried in full: every session live
 * on the source gets an incomplete-history marker for its txnNumber on the target
 * (MongoDB's dead-end sentinel of a truncated history), so a retry there of one of its
 * statements that has no record is refused (217) instead of running a second time. */
static int mark_unknown_sessions(mig *m)
{
	bson_t *after = NULL;
	int rc = 0;
	int64_t marked = 0;
	for (;;) {
		bson_t cmd = BSON_INITIALIZER, reply, recs = BSON_INITIALIZER;
		bson_iter_t it, arr;
		uint32_t n = 0;
		bool more = false;
		BSON_APPEND_INT32(&cmd, "stripedbSessionList", 1);
		BSON_APPEND_INT32(&cmd, "limit", 1000);
		if (after)
			BSON_APPEND_DOCUMENT(&cmd, "after", after);
		rc = shard_run(m, m->sc, &cmd, &reply);
		bson_destroy(&cmd);
		if (rc) {
			bson_destroy(&recs);
			break;
		}
		if (bson_iter_init_find(&it, &reply, "sessions") && bson_iter_recurse(&it, &arr))
			while (bson_iter_next(&arr)) {
				bson_t d;
				mig_sess s;
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				const uint8_t *data;
				uint32_t len;
				bson_iter_document(&arr, &len, &data);
				if (!bson_init_static(&d, data, len))
					continue;
				mig_sess_of_event(&d, &s);
				if (!s.on)
					continue;
				mig_sess_append_record(&recs, n++, &s, true);
				if (after)
					bson_destroy(after);
				after = bson_copy(&s.lsid);
			}
		more = bson_iter_init_find(&it, &reply, "more") && bson_iter_as_bool(&it);
		bson_destroy(&reply);
		if (n) {
			bson_t up = BSON_INITIALIZER, none = BSON_INITIALIZER;
			BSON_APPEND_UTF8(&up, "update", m->coll);
			BSON_APPEND_ARRAY(&up, "updates", &none);
			BSON_APPEND_BOOL(&up, "ordered", true);
			BSON_APPEND_UTF8(&up, "$stripedbOrigin", m->id);
			BSON_APPEND_ARRAY(&up, "$stripedbSessions", &recs);
			rc = shard_run(m, m->dc, &up, NULL);
			bson_destroy(&up);
			bson_destroy(&none);
			marked += n;
		}
		bson_destroy(&recs);
		if (rc || !more || !n)
			break;
		keepalive(m);
	}
	if (after)
		bson_destroy(after);
	if (rc == 0 && marked)
		sdb_warn("migration: sessions marked with incomplete history on the target",
			 "id=%s sessions=%" PRId64, m->id, marked);
	return rc;
}

static int step_import(mig *m)
{
	int rc;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	int64_t t0 = (int64_t)sdb_mono_ms();
	/* a restarted import starts from a clean target */
	if ((rc = delete_chunk(m, m->dc)) != 0)
		return rc;
	m->imported = m->import_bytes = 0;
	ins_batch b = {.n = 0};
	bson_init(&b.arr);
	bson_t sort = BSON_INITIALIZER;
	if (!m->arrival_order) {
		/* the shard-key index order (B-tree locality on the target); _id for hashed keys */
		if (m->rc->hashed)
			BSON_APPEND_INT32(&sort, "_id", 1);
		else
			for (size_t i = 0; i < m->rc->nkeys; i++)
				BSON_APPEND_INT32(&sort, m->rc->keys[i], 1);
	}
	uint64_t at = 0;
	rc = scan_chunk(m, m->sc, m->arrival_order ? NULL : &sort, NULL, &at, add_insert, &b);
	if (rc == 0)
		rc = flush_inserts(m, &b);
	bson_destroy(&b.arr);
	bson_destroy(&sort);
	if (rc)
		return rc;
	m->import_ts = at;
	bool complete = true;
	uint64_t start = session_history_start(m, at, &complete);
	if (!complete && (rc = mark_unknown_sessions(m)) != 0)
		return rc;
	m->ts = m->fwd.pos = start;
	m->import_ms = (int64_t)sdb_mono_ms() - t0;
	sdb_info("migration imported", "id=%s docs=%" PRId64 " bytes=%" PRId64 " ms=%" PRId64,
		 m->id, m->imported, m->import_bytes, m->import_ms);
	return save(m, MIG_REPLICATING);
}

static int step_replicate(mig *m)
{
	int rc;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	if (paused(m)) {
		m->lag_since = 0;
		nap(m, 100);
		return 0;
	}
	rc = repl_catch_up(m, &m->fwd, m->ts, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT)
		rc = 0;
	if (rc == SDB_ENOTFOUND)
		return fail(m, m->err);
	if (rc == 0 && m->fwd.caught_up) {
		m->lag_since = 0;
		return save(m, MIG_VERIFYING);
	}
	/* a write rate the target cannot match: abort cleanly instead of lagging forever */
	if (m->lag_since == 0)
		m->lag_since = (int64_t)sdb_mono_ms();
	if (rc == 0 && (int64_t)sdb_mono_ms() - m->lag_since > m->max_catchup_ms) {
		char why[200];
		snprintf(why, sizeof why,
			 "replication could not catch up with the source within maxCatchUpMS=%" PRId64,
			 m->max_catchup_ms);
		return fail(m, why);
	}
	if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS) {
		int r2 = save(m, m->state);
		if (rc == 0)
			rc = r2;
	}
	return rc;
}

typedef struct vdoc {
	bson_value_t id; /* copied */
	uint64_t hash;
} vdoc;

typedef struct vlist {
	vdoc *v;
	size_t n, cap;
} vlist;

static int collect(mig *m, const bson_t *doc, void *arg)
{
	(void)m;
	vlist *l = arg;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return 0;
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 1024;
		l->v = sdb_realloc(l->v, l->cap * sizeof *l->v);
	}
	bson_value_copy(bson_iter_value(&it), &l->v[l->n].id);
	l->v[l->n++].hash = XXH64(bson_get_data(doc), doc->len, 0);
	return 0;
}

static int vcmp(const void *a, const void *b)
{
	return sdb_bson_value_cmp(&((const vdoc *)a)->id, &((const vdoc *)b)->id);
}

static void vfree(vlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		bson_value_destroy(&l->v[i].id);
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}

static void describe_id(const bson_value_t *v, char *out, size_t n)
{
	bson_t d = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&d, "_id", v);
	char *j = bson_as_relaxed_extended_json(&d, NULL);
	snprintf(out, n, "%s", j ? j : "?");
	bson_free(j);
	bson_destroy(&d);
}

static int step_verify(mig *m)
{
	int rc;
	vlist s = {0}, t = {0};
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	if (paused(m)) {
		nap(m, 100);
		return 0;
	}
	uint64_t at = 0;
	bson_t sort = BSON_INITIALIZER;
	BSON_APPEND_INT32(&sort, "_id", 1);
	rc = scan_chunk(m, m->sc, &sort, NULL, &at, collect, &s);
	crash_point("mid", "verify");
	/* the target at the same position: apply exactly up to `at`, within maxCatchUpMS (at
	 * most 30 s a try): a replicator that cannot reach the position in that time cannot
	 * keep up with the source's writes, and the migration aborts cleanly as it does in
	 * replicating (it used to stall 30 s a try with an empty error until its lease ran
	 * out: test_catch_up_under_a_write_rate_the_target_cannot_match) */
	if (rc == 0) {
		int64_t budget = m->max_catchup_ms < 30000 ? m->max_catchup_ms : 30000;
		rc = repl_run(m, &m->fwd, m->ts, at, (int64_t)sdb_mono_ms() + budget);
		if (rc == SDB_ETIMEOUT && budget == m->max_catchup_ms) {
			char why[200];
			bson_destroy(&sort);
			vfree(&s);
			snprintf(why, sizeof why,
				 "replication could not catch up with the source within "
				 "maxCatchUpMS=%" PRId64 " (verifying)",
				 m->max_catchup_ms);
			return fail(m, why);
		}
		if (rc == SDB_ETIMEOUT)
			snprintf(m->err, sizeof m->err,
				 "verify: the target did not reach the source's position in 30 s");
	}
	if (rc == 0)
		rc = scan_chunk(m, m->dc, &sort, NULL, NULL, collect, &t);
	bson_destroy(&sort);
	if (rc) {
		vfree(&s);
		vfree(&t);
		return rc == SDB_ENOTFOUND ? fail(m, m->err) : rc;
	}
	if (s.n > 1)
		sdb_qsort(s.v, s.n, sizeof *s.v, vcmp);
	if (t.n > 1)
		sdb_qsort(t.v, t.n, sizeof *t.v, vcmp);
	size_t i = 0, j = 0;
	int64_t miss = 0, extra = 0, diff = 0;
	char why[512] = "", one[160];
	size_t wl = 0;
	int listed = 0;
	while (i < s.n || j < t.n) {
		int c = i == s.n ? 1 : j == t.n ? -1 : sdb_bson_value_cmp(&s.v[i].id, &t.v[j].id);
		const char *kind = NULL;
		const bson_value_t *id = NULL;
		if (c < 0) {
			miss++;
			kind = "missing";
			id = &s.v[i++].id;
		} else if (c > 0) {
			extra++;
			kind = "extra";
			id = &t.v[j++].id;
		} else {
			if (s.v[i].hash != t.v[j].hash) {
				diff++;
				kind = "different";
				id = &s.v[i].id;
			}
			i++;
			j++;
		}
		if (kind && listed < MAX_LISTED_DIFFS && wl < sizeof why - 1) {
			char idj[120];
			describe_id(id, idj, sizeof idj);
			snprintf(one, sizeof one, "%s%s %s", listed ? "; " : "", kind, idj);
			wl += (size_t)snprintf(why + wl, sizeof why - wl, "%s", one);
			if (wl >= sizeof why)
				wl = sizeof why - 1;
			listed++;
		}
	}
	m->verify_count = (int64_t)s.n;
	m->verify_missing = miss;
	m->verify_extra = extra;
	m->verify_different = diff;
	vfree(&s);
	vfree(&t);
	sdb_info("migration verified", "id=%s count=%" PRId64 " missing=%" PRId64 " extra=%" PRId64
		 " different=%" PRId64, m->id, m->verify_count, miss, extra, diff);
	if (miss || extra || diff) {
		char msg[700];
		snprintf(msg, sizeof msg, "verification failed at ts %u:%u: %s", (unsigned)(at >> 32),
			 (unsigned)at, why);
		return fail(m, msg);
	}
	return save(m, MIG_SWITCHING);
}

/* Bump the token of the chunk on client c to at least tok; *stored = the shard's token. */
static int bump(mig *m, mongoc_client_t *c, int64_t tok, int64_t *stored)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT32(&cmd, "stripedbSetVersion", 1);
	BSON_APPEND_UTF8(&cmd, "chunk", m->chunk_s);
	BSON_APPEND_INT64(&cmd, "token", tok);
	bson_error_t e;
	int rc = 0;
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e))
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "stripedbSetVersion: %s",
			      e.message);
	else
		*stored = it_int(&reply, "token", tok);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* setChunkShard with compare-and-set. Returns 0, SDB_ECONFLICT (token moved), SDB_EIO. */
static int route_to(mig *m, const char *shard, int64_t token, int64_t expect)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT64(&cmd, "setChunkShard", m->chunk);
	BSON_APPEND_UTF8(&cmd, "shard", shard);
	BSON_APPEND_INT64(&cmd, "token", token);
	BSON_APPEND_INT64(&cmd, "expectToken", expect);
	int rc = meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (rc == WRITE_CONFLICT)
		return SDB_ECONFLICT;
	return rc ? SDB_EIO : 0;
}

static void record_pause(mig *m, int64_t us)
{
	sdb_histogram_observe_ns(m->r->h_pause, (uint64_t)us * 1000);
	int64_t ms = (us + 999) / 1000;
	m->last_pause_ms = ms;
	if (m->npauses == 64)
		memmove(m->pauses, m->pauses + 1, 63 * sizeof m->pauses[0]);
	else
		m->npauses++;
	m->pauses[m->npauses - 1] = ms;
}

/* The switch in one direction: from (routed now, token `cur`) to `to`; p replicates from
 * -> to. Returns 0 (routed to `to`), SDB_ETIMEOUT (pause bound: routing stays on `from`
 * with the newer token), or an error (state unchanged: retried; bump is idempotent). */
static int do_switch(mig *m, repl *p, uint64_t start, mongoc_client_t *from_c,
		     const char *from, mongoc_client_t *to_c, const char *to, int64_t cur,
		     uint64_t *to_head)
{
	int rc;
	/* never switch while replication lags: drain first */
	rc = repl_catch_up(m, p, start, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT || (rc == 0 && !p->caught_up))
		return SDB_EBUSY;
	if (rc)
		return rc;
	/* the CDC log itself may lag the source's oplog (a slow publisher): catch up with
	 * the oplog head as of now before pausing writes, else do not switch */
	uint64_t head = 0;
	if ((rc = oplog_head(m, from_c, &head)) != 0)
		return rc;
	rc = repl_run(m, p, start, head, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT)
		return SDB_EBUSY;
	if (rc)
		return rc;
	/* issue #17 (coordinator/filtering.h): the chunk's new token is above every token of
	 * the collection, and the donor's filtering metadata loses the chunk in the same step
	 * as the bump, before the oplog head is read */
	cfilt_table ft;
	if (cfilt_load(m->meta, m->ns, &ft, m->err, sizeof m->err) != 0) {
		cfilt_table_destroy(&ft);
		return SDB_EUNAVAILABLE;
	}
	int64_t t0 = (int64_t)sdb_mono_us(), stored = 0;
	rc = bump(m, from_c, cfilt_switch_token(&ft, cur), &stored);
	if (rc == 0)
		rc = cfilt_install(from_c, m->ns, from, &ft, m->chunk, stored, m->err, sizeof m->err);
	cfilt_table_destroy(&ft);
	if (rc != 0)
		return rc;
	if ((rc = oplog_head(m, from_c, &head)) != 0)
		return rc;
	m->bump_ts = head;
	crash_point("mid", "switch");
	rc = repl_run(m, p, start, head, (int64_t)sdb_mono_ms() + m->max_pause_ms);
	if (rc == 0)
		rc = oplog_head(m, to_c, to_head);
	if (rc == 0) {
		rc = route_to(m, to, stored, cur);
		record_pause(m, (int64_t)sdb_mono_us() - t0);
		if (rc == 0)
			rc = cfilt_after_route(m->meta, m->ns, from, from_c, to, to_c, m->chunk, stored,
					       m->err, sizeof m->err);
		if (rc == 0)
			sdb_info("migration switched", "id=%s to=%s token=%" PRId64 " pause_ms=%" PRId64,
				 m->id, to, stored, m->last_pause_ms);
		return rc;
	}
	/* pause bound exceeded (or the catch-up failed): routing stays on `from`, with the
	 * bumped token so proxies reach it again */
	int rc2 = route_to(m, from, stored, cur);
	record_pause(m, (int64_t)sdb_mono_us() - t0);
	if (rc2 == 0 && cfilt_refresh(m->meta, m->ns, from, from_c, m->err, sizeof m->err) != 0)
		return SDB_EUNAVAILABLE; /* retried: the switch runs again from the donor */
	sdb_warn("migration switch rolled back", "id=%s pause_ms=%" PRId64 " reason=\"%s\"", m->id,
		 m->last_pause_ms, m->err);
	if (rc2 != 0 && rc2 != SDB_ECONFLICT)
		return rc2;
	return SDB_ETIMEOUT;
}

static int step_switch(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	if (paused(m)) {
		m->lag_since = 0;
		nap(m, 100);
		return 0;
	}
	rc = routing_chunk(m, shard, sizeof shard, &token);
	if (rc == SDB_ENOTFOUND)
		return fail(m, "chunk vanished from routing before the switch (split or merged)");
	if (rc)
		return rc;
	if (strcmp(shard, m->dst) == 0) {
		/* a previous holder switched and crashed before saving */
		if (!m->rev_ts && (rc = oplog_head(m, m->dc, &m->rev_ts)) != 0)
			return rc;
		if ((rc = cfilt_after_route(m->meta, m->ns, m->src, m->sc, m->dst, m->dc, m->chunk,
					    token, m->err, sizeof m->err)) != 0)
			return rc;
		m->token = token;
		return save(m, MIG_SWITCHED);
	}
	uint64_t to_head = 0;
	rc = do_switch(m, &m->fwd, m->ts, m->sc, m->src, m->dc, m->dst, token, &to_head);
	if (rc == 0) {
		m->lag_since = 0;
		m->token = token + 1;
		m->rev_ts = to_head;
		m->rev.pos = 0;
		m->error[0] = '\0';
		return save(m, MIG_SWITCHED);
	}
	if (rc == SDB_ETIMEOUT) {
		m->attempts++;
		if (m->attempts >= m->max_attempts) {
			char why[200];
			snprintf(why, sizeof why,
				 "catch-up did not finish within maxPauseMS=%" PRId64 " in %" PRId64
				 " attempts",
				 m->max_pause_ms, m->attempts);
			return fail(m, why);
		}
		return save(m, MIG_REPLICATING);
	}
	if (rc == SDB_EBUSY) {
		/* lagging: never switch; stay in switching while the replicator catches up,
		 * abort cleanly when it cannot within maxCatchUpMS */
		if (m->lag_since == 0)
			m->lag_since = (int64_t)sdb_mono_ms();
		if ((int64_t)sdb_mono_ms() - m->lag_since > m->max_catchup_ms) {
			char why[200];
			snprintf(why, sizeof why,
				 "replication could not catch up with the source within maxCatchUpMS=%" PRId64,
				 m->max_catchup_ms);
			return fail(m, why);
		}
		if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS)
			return save(m, m->state);
		return 0;
	}
	return rc;
}

static int step_switched(mig *m, int64_t *since)
{
	int rc;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	if (*since == 0)
		*since = (int64_t)sdb_mono_ms();
	rc = repl_run(m, &m->rev, m->rev_ts, 0, (int64_t)sdb_mono_ms() + 500);
	if (rc && rc != SDB_ETIMEOUT)
		return rc;
	if ((int64_t)sdb_mono_ms() - *since >= m->grace_ms)
		return save(m, MIG_CLEANING);
	if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS)
		return save(m, m->state);
	return 0;
}

static int step_rollback(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	if ((rc = routing_chunk(m, shard, sizeof shard, &token)) != 0)
		return rc;
	if (strcmp(shard, m->src) != 0) {
		uint64_t head = 0;
		rc = do_switch(m, &m->rev, m->rev_ts, m->dc, m->dst, m->sc, m->src, token, &head);
		if (rc == SDB_ETIMEOUT)
			return save(m, MIG_SWITCHED);
		if (rc)
			return rc == SDB_EBUSY ? 0 : rc;
		m->token = token + 1;
	}
	/* routed to the source: drop the target's copy */
	if ((rc = delete_chunk(m, m->dc)) != 0)
		return rc;
	m->target_cleaned = true;
	return save(m, MIG_ROLLED_BACK);
}

static int step_clean(mig *m)
{
	int rc;
	if ((rc = connect_shards(m)) != 0 || (rc = build_view(m)) != 0)
		return rc;
	repl_close(&m->rev);
	if ((rc = delete_chunk(m, m->sc)) != 0)
		return rc;
	return save(m, MIG_COMPLETE);
}

/* An aborted migration: delete the target's copy unless routing points at the target. */
static int step_aborted_cleanup(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = connect_shards(m)) != 0)
		return rc;
	rc = routing_chunk(m, shard, sizeof shard, &token);
	if (rc && rc != SDB_ENOTFOUND)
		return rc;
	if (rc == 0 && strcmp(shard, m->dst) != 0 && build_view(m) == 0 &&
	    (rc = delete_chunk(m, m->dc)) != 0)
		return rc;
	m->target_cleaned = true;
	return save(m, m->state);
}

/* ------------------------------------------------------------ worker */

static void mig_free(mig *m)
{
	repl_close(&m->fwd);
	repl_close(&m->rev);
	if (m->fwd.batch.len)
		bson_destroy(&m->fwd.batch);
	if (m->rev.batch.len)
		bson_destroy(&m->rev.batch);
	if (m->fwd.recs.len)
		bson_destroy(&m->fwd.recs);
	if (m->rev.recs.len)
		bson_destroy(&m->rev.recs);
	if (m->rc)
		route_coll_unref(m->rc);
	if (m->min)
		bson_destroy(m->min);
	if (m->max)
		bson_destroy(m->max);
	if (m->key)
		bson_destroy(m->key);
	if (m->sc)
		mongoc_client_destroy(m->sc);
	if (m->dc)
		mongoc_client_destroy(m->dc);
	if (m->meta)
		mongoc_client_destroy(m->meta);
	free(m->src_uri);
	free(m->dst_uri);
	free(m);
}

static void *worker(void *arg)
{
	mig_job *job = arg;
	mig *m = sdb_calloc(1, sizeof *m);
	int64_t switched_since = 0;
	int rc;
	sdb_log_set_thread("coordinator", job->id);
	m->r = job->r;
	m->job = job;
	snprintf(m->id, sizeof m->id, "%s", job->id);
	m->meta = auth_cluster_client_new(m->r->meta_uri);
	if (!m->meta)
		goto out;
	mongoc_client_set_error_api(m->meta, MONGOC_ERROR_API_VERSION_2);
	m->last_renew = (int64_t)sdb_mono_ms();
	rc = load(m);
	while (!stopping(m)) {
		if (rc == 0) {
			mig_state before = m->state;
			switch (m->state) {
			case MIG_REGISTERED:
				rc = step_register(m);
				break;
			case MIG_IMPORTING:
				rc = step_import(m);
				break;
			case MIG_REPLICATING:
				rc = step_replicate(m);
				break;
			case MIG_VERIFYING:
				rc = step_verify(m);
				break;
			case MIG_SWITCHING:
				rc = step_switch(m);
				break;
			case MIG_SWITCHED:
				rc = step_switched(m, &switched_since);
				break;
			case MIG_ROLLING_BACK:
				rc = step_rollback(m);
				break;
			case MIG_CLEANING:
				rc = step_clean(m);
				break;
			case MIG_ABORTED:
				if (!m->target_cleaned) {
					rc = step_aborted_cleanup(m);
					break;
				}
				goto out;
			default:
				goto out;
			}
			if (rc == 0 && m->state != before && m->state != MIG_SWITCHED)
				switched_since = 0;
		}
		if (rc == SDB_EINVAL && m->state == MIG_REGISTERED) {
			(void)fail(m, m->err);
			rc = 0;
		}
		keepalive(m);
		if (rc == SDB_ECONFLICT || rc == SDB_ENOTFOUND) {
			/* someone else changed the state (rollback or abort from the CLI) */
			repl_close(&m->fwd);
			if (load(m) != 0)
				break;
			rc = 0;
			continue;
		}
		if (rc != 0 && rc != SDB_ECANCELED) {
			sdb_warn("migration step failed, retrying", "id=%s state=%s error=\"%s\"", m->id,
				 migrate_state_name(m->state), m->err);
			/* the readers restart from the last applied position */
			repl_close(&m->fwd);
			repl_close(&m->rev);
			nap(m, 200);
			rc = load(m);
			if (rc == SDB_EIO) {
				nap(m, 200);
				rc = 0;
			}
			m->fwd.pos = m->fwd.pos > m->ts ? m->fwd.pos : m->ts;
		}
	}
out:
	if (m->meta && !m->lost) {
		char err[256];
		(void)lease(m->meta, "releaseLease", m->id, m->r->holder, 0, err, sizeof err);
	}
	mig_free(m);
	atomic_store(&job->done, 1);
	return NULL;
}

/* ------------------------------------------------------------ runner */

migrate_runner *migrate_runner_new(cdc_log *log, const char *meta_uri, const char *holder,
				   int64_t lease_ms, int budget_global, int budget_shard)
{
	migrate_runner *r = sdb_calloc(1, sizeof *r);
	r->log = log;
	r->meta_uri = sdb_strdup(meta_uri);
	r->holder = sdb_strdup(holder);
	r->lease_ms = lease_ms;
	r->budget_global = budget_global > 0 ? budget_global : 1;
	r->budget_shard = budget_shard > 0 ? budget_shard : 1;
	atomic_init(&r->stop, 0);
	pthread_mutex_init(&r->mu, NULL);
	r->h_pause = sdb_metrics_histogram("stripedb_migration_switch_pause_seconds",
					   "migrations: write pause at a traffic switch (token bump "
					   "to routing commit, or to the bump's rollback)",
					   NULL);
	r->c_switches = sdb_metrics_counter("stripedb_migration_switches_total",
					    "migrations: traffic switches committed", NULL);
	r->c_rolled = sdb_metrics_counter("stripedb_migration_switch_rollbacks_total",
					  "migrations: switches rolled back at the pause bound", NULL);
	r->c_complete = sdb_metrics_counter("stripedb_migration_completed_total",
					    "migrations: completed", NULL);
	r->c_aborted = sdb_metrics_counter("stripedb_migration_aborted_total",
					   "migrations: aborted", NULL);
	r->g_running = sdb_metrics_gauge("stripedb_migration_running",
					 "migrations: workers running in this coordinator", NULL);
	return r;
}

static mig_job *find_job(migrate_runner *r, const char *id)
{
	for (mig_job *j = r->jobs; j; j = j->next)
		if (strcmp(j->id, id) == 0)
			return j;
	return NULL;
}

static void reap(migrate_runner *r)
{
	for (mig_job **pp = &r->jobs; *pp;) {
		mig_job *j = *pp;
		if (atomic_load(&j->done)) {
			pthread_join(j->th, NULL);
			*pp = j->next;
			free(j->id);
			free(j);
		} else {
			pp = &j->next;
		}
	}
}

int migrate_runner_running(migrate_runner *r)
{
	int n = 0;
	pthread_mutex_lock(&r->mu);
	for (mig_job *j = r->jobs; j; j = j->next)
		n += !atomic_load(&j->done);
	pthread_mutex_unlock(&r->mu);
	return n;
}

typedef struct mrow {
	char id[128], ns[256], from[64], to[64];
	mig_state state;
	bool cleaned;
	bson_t *min, *max;
	int64_t created;
} mrow;

static bool ranges_overlap(const mrow *a, const mrow *b)
{
	if (!a->min || !a->max || !b->min || !b->max)
		return true; /* unknown range: be safe */
	return route_key_cmp(a->min, b->max) < 0 && route_key_cmp(b->min, a->max) < 0;
}

void migrate_runner_tick(migrate_runner *r, mongoc_client_t *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	char err[256];
	mrow *rows = NULL;
	size_t n = 0, cap = 0;
	pthread_mutex_lock(&r->mu);
	reap(r);
	int64_t running = 0;
	for (mig_job *j = r->jobs; j; j = j->next)
		running++;
	pthread_mutex_unlock(&r->mu);
	sdb_gauge_set(r->g_running, running);
	BSON_APPEND_INT32(&cmd, "listMigrations", 1);
	int rc = meta_run(c, &cmd, &reply, err, sizeof err);
	bson_destroy(&cmd);
	if (rc == 0 && bson_iter_init_find(&it, &reply, "migrations") && bson_iter_recurse(&it, &arr))
		while (bson_iter_next(&arr)) {
			bson_t d, spec, cp;
			const uint8_t *data;
			uint32_t len;
			char st[64];
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &len, &data);
			bson_init_static(&d, data, len);
			if (n == cap) {
				cap = cap ? 2 * cap : 16;
				rows = sdb_realloc(rows, cap * sizeof *rows);
			}
			mrow *w = &rows[n];
			memset(w, 0, sizeof *w);
			if (!it_str(&d, "id", w->id, sizeof w->id) || !it_str(&d, "state", st, sizeof st))
				continue;
			w->state = migrate_state_parse(st);
			it_str(&d, "ns", w->ns, sizeof w->ns);
			w->created = it_int(&d, "createdMS", 0);
			if (it_doc(&d, "spec", &spec)) {
				it_str(&spec, "from", w->from, sizeof w->from);
				it_str(&spec, "to", w->to, sizeof w->to);
			}
			if (it_doc(&d, "checkpoint", &cp)) {
				bson_t b;
				bson_iter_t ci;
				w->cleaned = bson_iter_init_find(&ci, &cp, "targetCleaned") &&
					     bson_iter_as_bool(&ci);
				if (it_doc(&cp, "min", &b))
					w->min = bson_copy(&b);
				if (it_doc(&cp, "max", &b))
					w->max = bson_copy(&b);
			}
			n++;
		}
	bson_destroy(&reply);
	int active = 0;
	for (size_t i = 0; i < n; i++)
		active += migrate_state_active(rows[i].state);
	for (size_t i = 0; i < n && !atomic_load(&r->stop); i++) {
		mrow *w = &rows[i];
		bool want = !migrate_state_terminal(w->state) ||
			    (w->state == MIG_ABORTED && !w->cleaned);
		if (!want || w->state == MIG_UNKNOWN)
			continue;
		pthread_mutex_lock(&r->mu);
		bool mine = find_job(r, w->id) != NULL;
		pthread_mutex_unlock(&r->mu);
		if (mine)
			continue;
		if (w->state == MIG_REGISTERED) {
			/* budgets, and the order of overlapping migrations of one collection */
			int per_src = 0, per_dst = 0;
			bool blocked = active >= r->budget_global;
			for (size_t k = 0; k < n; k++) {
				mrow *o = &rows[k];
				if (k == i)
					continue;
				if (migrate_state_active(o->state)) {
					per_src += !strcmp(o->from, w->from) || !strcmp(o->to, w->from);
					per_dst += !strcmp(o->from, w->to) || !strcmp(o->to, w->to);
				}
				bool older = o->state != MIG_REGISTERED || o->created < w->created ||
					     (o->created == w->created && strcmp(o->id, w->id) < 0);
				/* an aborted one still deleting its copy on its target counts too */
				bool live = !migrate_state_terminal(o->state) ||
					    (o->state == MIG_ABORTED && !o->cleaned);
				if (!strcmp(o->ns, w->ns) && older && live && o->state != MIG_UNKNOWN &&
				    ranges_overlap(o, w))
					blocked = true;
			}
			if (blocked || per_src >= r->budget_shard || per_dst >= r->budget_shard)
				continue;
		}
		if (lease(c, "acquireLease", w->id, r->holder, r->lease_ms, err, sizeof err) != 0)
			continue;
		mig_job *j = sdb_calloc(1, sizeof *j);
		j->id = sdb_strdup(w->id);
		j->r = r;
		atomic_init(&j->done, 0);
		if (pthread_create(&j->th, NULL, worker, j) != 0)
			abort();
		if (w->state == MIG_REGISTERED)
			active++;
		sdb_info("migration acquired", "id=%s state=%s", w->id, migrate_state_name(w->state));
		pthread_mutex_lock(&r->mu);
		j->next = r->jobs;
		r->jobs = j;
		pthread_mutex_unlock(&r->mu);
	}
	for (size_t i = 0; i < n; i++) {
		if (rows[i].min)
			bson_destroy(rows[i].min);
		if (rows[i].max)
			bson_destroy(rows[i].max);
	}
	free(rows);
}

void migrate_runner_free(migrate_runner *r, mongoc_client_t *c)
{
	(void)c; /* workers release their own leases */
	if (!r)
		return;
	atomic_store(&r->stop, 1);
	pthread_mutex_lock(&r->mu);
	mig_job *jobs = r->jobs;
	r->jobs = NULL;
	pthread_mutex_unlock(&r->mu);
	while (jobs) {
		mig_job *j = jobs;
		jobs = j->next;
		pthread_join(j->th, NULL);
		free(j->id);
		free(j);
	}
	pthread_mutex_destroy(&r->mu);
	free(r->meta_uri);
	free(r->holder);
	free(r);
}
