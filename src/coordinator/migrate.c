/* The migration runner and its workers (see migrate.h for the states, migrate_int.h for
 * where each step lives).
 *
 * Threads: migrate_runner_tick runs on the coordinator's manager thread and only lists
 * migrations, takes leases and starts workers; each migration this coordinator holds runs
 * on its own worker thread with its own libmongoc clients (metadata, source, target) and
 * its own CDC reader, so a long bulk import never delays the CDC publishers' lease renewals.
 * A second thread per migration renews mig/<id> every lease/3 on its own metadata client
 * (mig_lease_start), so a slow shard call (a 15 MiB import batch under load, a stopped
 * shard) never outlasts the lease; the worker checks the lease between steps and batches
 * (mig_stopping) and stops at once when it is lost or unknown.
 *
 * Shard I/O goes through libmongoc commands, so a real MongoDB shard is driven the same
 * way; the stripedb extensions used are stripedbSnapshot (atOplogTs, keyRange),
 * stripedbSetVersion and $stripedbOrigin (src/shard/README.md).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "coordinator/migrate_int.h"

/* ------------------------------------------------------------ worker */

static void mig_free(mig *m)
{
	mig_repl_close(&m->fwd);
	mig_repl_close(&m->rev);
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
	mig_hashes_free(&m->imp);
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
	/* the runner acquired the lease just before starting us */
	atomic_store(&m->last_renew, (int64_t)sdb_mono_ms());
	if (mig_lease_start(m) != 0) {
		sdb_warn("migration lease thread not started", "id=%s", m->id);
		goto out;
	}
	rc = mig_load(m);
	while (!mig_stopping(m)) {
		if (rc == 0) {
			mig_state before = m->state;
			switch (m->state) {
			case MIG_REGISTERED:
				rc = mig_step_register(m);
				break;
			case MIG_IMPORTING:
				rc = mig_step_import(m);
				break;
			case MIG_REPLICATING:
				rc = mig_step_replicate(m);
				break;
			case MIG_VERIFYING:
				rc = mig_step_verify(m);
				break;
			case MIG_SWITCHING:
				rc = mig_step_switch(m);
				break;
			case MIG_SWITCHED:
				rc = mig_step_switched(m, &switched_since);
				break;
			case MIG_ROLLING_BACK:
				rc = mig_step_rollback(m);
				break;
			case MIG_CLEANING:
				rc = mig_step_clean(m);
				break;
			case MIG_ABORTED:
				if (!m->target_cleaned) {
					rc = mig_step_aborted_cleanup(m);
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
			(void)mig_fail(m, m->err);
			rc = 0;
		}
		mig_keepalive(m);
		if (rc == SDB_ECONFLICT || rc == SDB_ENOTFOUND) {
			/* someone else changed the state (rollback or abort from the CLI) */
			mig_repl_close(&m->fwd);
			if (mig_load(m) != 0)
				break;
			rc = 0;
			continue;
		}
		if (rc != 0 && rc != SDB_ECANCELED) {
			sdb_warn("migration step failed, retrying", "id=%s state=%s error=\"%s\"", m->id,
				 migrate_state_name(m->state), m->err);
			/* the readers restart from the last applied position */
			mig_repl_close(&m->fwd);
			mig_repl_close(&m->rev);
			mig_nap(m, 200);
			rc = mig_load(m);
			if (rc == SDB_EIO) {
				mig_nap(m, 200);
				rc = 0;
			}
			m->fwd.pos = m->fwd.pos > m->ts ? m->fwd.pos : m->ts;
		}
	}
out:
	mig_lease_stop(m); /* no renewal after the release below */
	if (m->meta && !atomic_load(&m->lost)) {
		char err[256];
		(void)mig_lease(m->meta, "releaseLease", m->id, m->r->holder, 0, err, sizeof err);
	}
	mig_free(m);
	atomic_store(&job->done, 1);
	return NULL;
}

/* ------------------------------------------------------------ runner */

static const sdb_metric_def runner_metrics[] = {
	SDB_METRIC_HISTOGRAM(migrate_runner, h_pause, "stripedb_migration_switch_pause_seconds",
			     "migrations: write pause at a traffic switch (token bump "
			     "to routing commit, or to the bump's rollback)"),
	SDB_METRIC_COUNTER(migrate_runner, c_switches, "stripedb_migration_switches_total",
			   "migrations: traffic switches committed"),
	SDB_METRIC_COUNTER(migrate_runner, c_rolled, "stripedb_migration_switch_rollbacks_total",
			   "migrations: switches rolled back at the pause bound"),
	SDB_METRIC_COUNTER(migrate_runner, c_complete, "stripedb_migration_completed_total",
			   "migrations: completed"),
	SDB_METRIC_COUNTER(migrate_runner, c_aborted, "stripedb_migration_aborted_total",
			   "migrations: aborted"),
	SDB_METRIC_GAUGE(migrate_runner, g_running, "stripedb_migration_running",
			 "migrations: workers running in this coordinator"),
};

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
	SDB_METRICS_REGISTER(r, runner_metrics, NULL);
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
	int rc = mig_meta_run(c, &cmd, &reply, err, sizeof err);
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
			if (!mig_it_str(&d, "id", w->id, sizeof w->id) || !mig_it_str(&d, "state", st, sizeof st))
				continue;
			w->state = migrate_state_parse(st);
			mig_it_str(&d, "ns", w->ns, sizeof w->ns);
			w->created = mig_it_int(&d, "createdMS", 0);
			if (mig_it_doc(&d, "spec", &spec)) {
				mig_it_str(&spec, "from", w->from, sizeof w->from);
				mig_it_str(&spec, "to", w->to, sizeof w->to);
			}
			if (mig_it_doc(&d, "checkpoint", &cp)) {
				bson_t b;
				bson_iter_t ci;
				w->cleaned = bson_iter_init_find(&ci, &cp, "targetCleaned") &&
					     bson_iter_as_bool(&ci);
				if (mig_it_doc(&cp, "min", &b))
					w->min = bson_copy(&b);
				if (mig_it_doc(&cp, "max", &b))
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
		if (mig_lease(c, "acquireLease", w->id, r->holder, r->lease_ms, err, sizeof err) != 0)
			continue;
		mig_job *j = sdb_calloc(1, sizeof *j);
		j->id = sdb_strdup(w->id);
		j->r = r;
		atomic_init(&j->done, 0);
		if (sdb_thread_create(&j->th, worker, j) != 0)
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
	for (size_t i = 0; i < r->nsortless; i++)
		free(r->sortless[i]);
	free(r->sortless);
	free(r->meta_uri);
	free(r->holder);
	free(r);
}
