/* The coordinator role (DESIGN.md §2, §6-7):
 *
 *   stripedb --role=coordinator --http-listen=H:P --metadata=H:P,... \
 *            --cdc=embedded:DIR|kafka:BOOTSTRAP [--archive=file:DIR|s3://BUCKET/PREFIX] \
 *            [--cdc-fsync=batch|segment|never] [--cdc-segment-bytes=N] \
 *            [--cdc-retention-bytes=N] [--cdc-lease-ms=5000] [--archive-retention=7d] \
 *            [--backup-interval=0]
 *
 * A coordinator holds no durable state. It runs:
 *   1. the CDC publishers (issue #7): for every shard listed in metadata, it tries to take
 *      the lease `cdc/<shard id>` (holder = this coordinator's id, ttl --cdc-lease-ms);
 *      the holder runs that shard's publisher (src/cdc/publisher.h) and renews the lease
 *      every ttl/3; a publisher only appends before its fence (renewal time + ttl - ttl/5),
 *      so when a coordinator dies or is cut off, its leases expire and another coordinator
 *      takes them over and resumes from the published position in the log.
 *   2. the migration runner (issue #8): see the "migration runner" section below; it is
 *      started and stopped next to the CDC publishers and reads CDC events through
 *      src/cdc/reader.h.
 *   3. the filtering-metadata reconciler (issue #17, reconcile.h) for the shards whose CDC
 *      lease it holds, on its own thread.
 *
 * Threads: the role's loop thread only starts and stops; a manager thread does all the
 * blocking metadata work (libmongoc) and owns the publisher table (under mu, which the
 * HTTP handler also takes).
 *
 * HTTP: /healthz, /metrics (the publishers' stripedb_cdc_* series and
 * stripedb_cdc_archive_{first,next}_offset, stripedb_cdc_archive_{first,last}_ts_seconds,
 * stripedb_cdc_publisher_held), and GET /cdc/status: JSON
 *   {holder, backend, shards: [{shard, uri, running, publishedTs, nextOffset, headTs,
 *    lagSeconds, lagEvents, events, error, archive: {firstOffset, nextOffset, firstTs,
 *    lastTs}}]}  (ts as Extended JSON Timestamps).
 */
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdc/archive.h"
#include "cdc/log.h"
#include "auth/cluster.h" /* issue #10: internal clients carry the cluster key */
#include "cdc/publisher.h"
#include "cdc/backup.h" /* issue #22: --backup-interval */
#include "common/clock.h"
#include "common/alloc.h"
#include "common/shardref.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"
#include "common/role.h"
#include "common/metauri.h"
#include "coordinator/migrate.h" /* issue #8 */
#include "coordinator/filtering.h" /* cfilt_command */
#include "coordinator/reconcile.h" /* issue #17 */

#define LEASE_ERR_BUSY 46 /* LockBusy */
/* Period of the sweep of a held shard's incomplete backups (cdc_backup_sweep); the first
 * sweep runs as soon as the lease is held. */
#define SWEEP_PERIOD_MS (10 * 60 * 1000)

typedef struct coord_pub {
	char *shard;
	char *uri;
	cdc_publisher *pub;
	int64_t epoch;
	int64_t renewed_ms; /* monotonic time of the last successful acquire/renew */
	int stopping;       /* retired: its publisher is stopping (written under mu) */
	int release;        /* release the lease once stopped */
	sdb_gauge *g_held, *g_arch_first, *g_arch_next, *g_arch_first_ts, *g_arch_last_ts;
	cdc_range arch;
	uint64_t sweep_next; /* monotonic ms of its next incomplete-backup sweep (0: due) */
	struct coord_pub *next;
} coord_pub;

static const sdb_metric_def coord_pub_metrics[] = {
	SDB_METRIC_GAUGE(coord_pub, g_held, "stripedb_cdc_publisher_held",
			 "CDC: 1 while this coordinator holds the shard's publisher lease"),
	SDB_METRIC_GAUGE(coord_pub, g_arch_first, "stripedb_cdc_archive_first_offset",
			 "CDC: first offset in the archive"),
	SDB_METRIC_GAUGE(coord_pub, g_arch_next, "stripedb_cdc_archive_next_offset",
			 "CDC: offset after the last one in the archive"),
	SDB_METRIC_GAUGE(coord_pub, g_arch_first_ts, "stripedb_cdc_archive_first_ts_seconds",
			 "CDC: oplog ts (s) of the archive's first event"),
	SDB_METRIC_GAUGE(coord_pub, g_arch_last_ts, "stripedb_cdc_archive_last_ts_seconds",
			 "CDC: oplog ts (s) of the archive's last event"),
};

typedef struct coord {
	sdb_role *role;
	cdc_log *log;
	char *meta_uri;
	char *holder;
	int64_t lease_ms;
	int budget_global, budget_shard; /* --migration-budget, --migration-shard-budget */
	pthread_t mgr;
	int mgr_started;
	uint64_t arch_retention_s; /* --archive-retention (0: keep forever) */
	uint64_t backup_interval_s; /* --backup-interval (0: no scheduled backups) */
	pthread_t ret;             /* the archive thread (ranges, retention) */
	int ret_started;
	pthread_t rec;             /* the filtering reconciler's thread */
	int rec_started;
	atomic_int stop;
	pthread_mutex_t mu; /* pubs, and the manager's sleeps */
	pthread_cond_t cv;
	coord_pub *pubs;
	char meta_error[256];
	migrate_runner *mig; /* issue #8: the migration runner (coordinator/migrate.h) */
} coord;

/* ------------------------------------------------------------ metadata calls */

/* Run cmd on the metadata leader. Returns 0, or the server's error code (> 0), or -1 for
 * a network error; message in err. */
static int meta_cmd(mongoc_client_t *c, bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	return cfilt_command(c, cmd, reply, err, errlen);
}

static int lease_cmd(coord *co, mongoc_client_t *c, const char *verb, const char *shard,
		     int64_t *epoch, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it;
	char name[256];
	snprintf(name, sizeof name, "cdc/%s", shard);
	BSON_APPEND_UTF8(&cmd, verb, name);
	BSON_APPEND_UTF8(&cmd, "holder", co->holder);
	if (strcmp(verb, "releaseLease") != 0)
		BSON_APPEND_INT64(&cmd, "ttlMS", co->lease_ms);
	int rc = meta_cmd(c, &cmd, &reply, err, errlen);
	if (rc == 0 && epoch && bson_iter_init_find(&it, &reply, "epoch"))
		*epoch = bson_iter_as_int64(&it);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

typedef sdb_shard_ref shard_ref;

static int list_shards(mongoc_client_t *c, shard_ref **out, size_t *n, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	*out = NULL;
	*n = 0;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	int rc = meta_cmd(c, &cmd, &reply, err, errlen);
	if (rc == 0)
		sdb_shard_refs_parse(&reply, out, n);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* ------------------------------------------------------------ CDC publishers */

static coord_pub *find_pub(coord *co, const char *shard)
{
	for (coord_pub *p = co->pubs; p; p = p->next)
		if (strcmp(p->shard, shard) == 0)
			return p;
	return NULL;
}

static int64_t fence_after(coord *co, int64_t t0)
{
	return t0 + co->lease_ms - co->lease_ms / 5;
}

static void pub_gauges(coord_pub *p)
{
	char labels[200];
	snprintf(labels, sizeof labels, "shard=\"%s\"", p->shard);
	SDB_METRICS_REGISTER(p, coord_pub_metrics, labels);
}

/* Stop p's publisher without waiting for it (a Kafka flush may take seconds and the
 * manager must keep renewing the other leases); reap_pubs frees it once stopped and, when
 * release is set, releases its lease then (never before its writer is closed). */
static void retire_pub(coord *co, coord_pub *p, int release)
{
	if (p->stopping)
		return;
	pthread_mutex_lock(&co->mu); /* h_status reads it */
	p->stopping = 1;
	pthread_mutex_unlock(&co->mu);
	p->release = release;
	cdc_publisher_request_stop(p->pub);
	sdb_gauge_set(p->g_held, 0);
}

static void reap_pubs(coord *co, mongoc_client_t *c, int wait)
{
	char err[256];
	for (coord_pub *p = co->pubs, *nx; p; p = nx) {
		nx = p->next;
		if (!p->stopping || (!wait && !cdc_publisher_stopped(p->pub)))
			continue;
		pthread_mutex_lock(&co->mu);
		for (coord_pub **pp = &co->pubs; *pp; pp = &(*pp)->next)
			if (*pp == p) {
				*pp = p->next;
				break;
			}
		pthread_mutex_unlock(&co->mu);
		cdc_publisher_stop(p->pub); /* joins; the writer is flushed and closed */
		if (p->release && c)
			(void)lease_cmd(co, c, "releaseLease", p->shard, NULL, err, sizeof err);
		sdb_info("cdc publisher released", "shard=%s", p->shard);
		free(p->shard);
		free(p->uri);
		free(p);
	}
}

static void cdc_tick(coord *co, mongoc_client_t *c)
{
	shard_ref *shards;
	size_t n;
	char err[256];
	int rc = list_shards(c, &shards, &n, err, sizeof err);
	if (rc != 0) {
		pthread_mutex_lock(&co->mu);
		sdb_errf(co->meta_error, sizeof co->meta_error, rc, "listShards: %s", err);
		pthread_mutex_unlock(&co->mu);
	} else {
		pthread_mutex_lock(&co->mu);
		co->meta_error[0] = '\0';
		pthread_mutex_unlock(&co->mu);
	}
	reap_pubs(co, c, 0);
	/* renew what we hold; drop what we lost or what left the shard list */
	for (coord_pub *p = co->pubs, *nx; p; p = nx) {
		nx = p->next;
		if (p->stopping)
			continue;
		int listed = rc != 0;
		for (size_t i = 0; i < n && !listed; i++)
			listed = strcmp(shards[i].id, p->shard) == 0;
		int64_t t0 = (int64_t)sdb_mono_ms();
		int lrc = listed ? lease_cmd(co, c, "renewLease", p->shard, NULL, err, sizeof err)
				 : LEASE_ERR_BUSY;
		int64_t took = (int64_t)sdb_mono_ms() - t0;
		if (lrc != 0 || took > co->lease_ms / 3)
			sdb_warn("cdc lease renewal", "shard=%s code=%d took_ms=%" PRId64
				 " since_last_ms=%" PRId64 " error=\"%s\"",
				 p->shard, lrc, took, t0 - p->renewed_ms, lrc ? err : "");
		if (lrc == 0)
			p->renewed_ms = t0;
		if (lrc == 0) {
			cdc_publisher_fence(p->pub, fence_after(co, t0));
		} else if (lrc > 0) {
			sdb_warn("cdc lease lost", "shard=%s code=%d", p->shard, lrc);
			retire_pub(co, p, 0);
		}
		/* network error: keep running until the fence stops appends */
	}
	for (size_t i = 0; i < n; i++) {
		if (find_pub(co, shards[i].id))
			continue;
		int64_t epoch = 0, t0 = (int64_t)sdb_mono_ms();
		if (lease_cmd(co, c, "acquireLease", shards[i].id, &epoch, err, sizeof err) != 0)
			continue;
		coord_pub *p = sdb_calloc(1, sizeof *p);
		p->shard = sdb_strdup(shards[i].id);
		p->uri = sdb_strdup(shards[i].uri);
		p->epoch = epoch;
		p->renewed_ms = t0;
		pub_gauges(p);
		if (cdc_publisher_start(co->log, p->shard, p->uri, fence_after(co, t0), &p->pub, err,
					sizeof err) != 0) {
			sdb_warn("cdc publisher", "shard=%s error=\"%s\"", p->shard, err);
			(void)lease_cmd(co, c, "releaseLease", p->shard, NULL, err, sizeof err);
			free(p->shard);
			free(p->uri);
			free(p);
			continue;
		}
		sdb_gauge_set(p->g_held, 1);
		sdb_info("cdc publisher acquired", "shard=%s epoch=%" PRId64, p->shard, epoch);
		pthread_mutex_lock(&co->mu);
		p->next = co->pubs;
		co->pubs = p;
		pthread_mutex_unlock(&co->mu);
	}
	/* (the archive ranges of the shards we publish are refreshed by the archive thread:
	 * an object store may take seconds to answer, and renewals must not wait) */
	sdb_shard_refs_free(shards, n);
}

static void cdc_shutdown(coord *co, mongoc_client_t *c)
{
	for (coord_pub *p = co->pubs; p; p = p->next)
		retire_pub(co, p, 1); /* (one already retired after losing its lease keeps release 0) */
	reap_pubs(co, c, 1);
}

/* ------------------------------------------------------------ migration runner (issue #8)
 *
 * The Data Movement Platform starts here. migrations_tick runs on the manager thread after
 * the CDC tick, with the metadata client; migrations_shutdown before the publishers stop.
 * Replication reads CDC events with cdc_reader_open(co->log, shard, checkpoint_ts, ...)
 * (src/cdc/reader.h). Nothing yet. */

static void migrations_tick(coord *co, mongoc_client_t *c)
{
	if (co->mig == NULL)
		co->mig = migrate_runner_new(co->log, co->meta_uri, co->holder, co->lease_ms,
					     co->budget_global, co->budget_shard);
	migrate_runner_tick(co->mig, c);
}

static void migrations_shutdown(coord *co, mongoc_client_t *c)
{
	migrate_runner_free(co->mig, c);
	co->mig = NULL;
}

/* ------------------------------------------------------------ archive thread */

/* Back up shard when its newest backup is older than --backup-interval. The backup's id
 * is its start time, so "older" is a comparison of ids (they sort as time). */
static void scheduled_backup(coord *co, cdc_archive *a, const char *shard, const char *uri)
{
	char err[1024], newest[64], cutoff[40], id[40];
	int64_t now = sdb_wall_ms();
	if (cdc_backup_newest(a, shard, newest, sizeof newest, err, sizeof err) != 0) {
		sdb_warn("scheduled backup", "shard=%s error=\"%s\"", shard, err);
		return;
	}
	cdc_backup_id(now - (int64_t)co->backup_interval_s * 1000, cutoff, sizeof cutoff);
	if (newest[0] && strcmp(newest, cutoff) > 0)
		return;
	cdc_backup_stats st;
	cdc_backup_id(now, id, sizeof id);
	if (cdc_backup_shard(a, shard, uri, id, 10000, &st, err, sizeof err) != 0)
		sdb_warn("scheduled backup", "shard=%s id=%s error=\"%s\"", shard, id, err);
	else
		sdb_info("scheduled backup", "shard=%s id=%s collections=%d documents=%" PRId64
			 " bytes=%" PRId64 " throttled_ms=%" PRId64, shard, id, st.collections,
			 st.documents, st.bytes, st.throttled_ms);
}

/* Delete shard's incomplete backups that are certainly dead (src/cdc/backup.h). */
static void sweep_incomplete(cdc_archive *a, const char *shard)
{
	char err[1024];
	size_t removed = 0, kept = 0;
	int rc = cdc_backup_sweep(a, shard, sdb_wall_ms(), &removed, &kept, err, sizeof err);
	if (rc)
		sdb_warn("incomplete backup sweep", "shard=%s error=\"%s\"", shard, err);
	else if (removed || kept)
		sdb_info("incomplete backup sweep", "shard=%s deleted=%zu kept=%zu", shard,
			 removed, kept);
}

/* Runs when an archive is configured, in its own thread because an object store may take
 * seconds to answer (retries with backoff) and lease renewals in the manager must not
 * wait for it. Every second it refreshes the archive range of the shards this coordinator
 * publishes (/cdc/status, stripedb_cdc_archive_* metrics). With --archive-retention
 * (issue #22), the holder of a shard's cdc/<shard> lease (so one coordinator per shard)
 * deletes the shard's archived segments whose last event is older than the retention (by
 * the oplog ts, epoch seconds, against the injectable wall clock), every retention/4
 * clamped to 1..60 s. With --backup-interval (issue #22), the same holder backs the shard
 * up (src/cdc/backup.h) when its newest backup in the archive is older than the interval,
 * checked every interval/4 clamped to 1..60 s (a backup blocks this thread, not the
 * manager). Always, the same holder deletes the shard's incomplete backups that are
 * certainly dead (cdc_backup_sweep: no manifest, older than CDC_BACKUP_ORPHAN_AGE_MS and
 * than the newest committed backup), once it holds the lease and then every
 * SWEEP_PERIOD_MS. */
static void *archive_thread(void *arg)
{
	coord *co = arg;
	cdc_archive *a = cdc_log_archive(co->log);
	uint64_t period = co->arch_retention_s * 1000 / 4, next_expire = 0;
	uint64_t backup_period = co->backup_interval_s * 1000 / 4, next_backup = 0;
	char **uris = NULL;
	backup_period = backup_period < 1000 ? 1000 : backup_period > 60000 ? 60000 : backup_period;
	period = period < 1000 ? 1000 : period > 60000 ? 60000 : period;
	sdb_log_set_thread_role("coordinator"); /* the node id: from its role thread */
	pthread_mutex_lock(&co->mu);
	while (!atomic_load(&co->stop)) {
		sdb_cond_wait_ms(&co->cv, &co->mu, 1000);
		if (atomic_load(&co->stop))
			break;
		size_t n = 0, cap = 0;
		char **ids = NULL;
		int *sweep = NULL;
		uint64_t mono = sdb_mono_ms();
		for (coord_pub *p = co->pubs; p; p = p->next) {
			if (p->stopping)
				continue;
			if (n == cap) {
				cap = cap ? cap * 2 : 8;
				ids = sdb_realloc(ids, cap * sizeof *ids);
				uris = sdb_realloc(uris, cap * sizeof *uris);
				sweep = sdb_realloc(sweep, cap * sizeof *sweep);
			}
			sweep[n] = p->sweep_next <= mono;
			if (sweep[n])
				p->sweep_next = mono + SWEEP_PERIOD_MS;
			uris[n] = sdb_strdup(p->uri);
			ids[n++] = sdb_strdup(p->shard);
		}
		pthread_mutex_unlock(&co->mu);
		if (co->backup_interval_s && sdb_mono_ms() >= next_backup) {
			next_backup = sdb_mono_ms() + backup_period;
			for (size_t i = 0; i < n && !atomic_load(&co->stop); i++)
				scheduled_backup(co, a, ids[i], uris[i]);
		}
		for (size_t i = 0; i < n && !atomic_load(&co->stop); i++)
			if (sweep[i])
				sweep_incomplete(a, ids[i]);
		free(sweep);
		for (size_t i = 0; i < n; i++)
			free(uris[i]);
		free(uris);
		uris = NULL;
		for (size_t i = 0; i < n; i++) {
			char err[512];
			cdc_range g = {0};
			if (cdc_archive_range(a, ids[i], &g, err, sizeof err) != 0)
				continue;
			pthread_mutex_lock(&co->mu);
			coord_pub *p = find_pub(co, ids[i]);
			if (p) {
				p->arch = g;
				sdb_gauge_set(p->g_arch_first, (int64_t)g.first_offset);
				sdb_gauge_set(p->g_arch_next, (int64_t)g.next_offset);
				sdb_gauge_set(p->g_arch_first_ts, (int64_t)(g.first_ts >> 32));
				sdb_gauge_set(p->g_arch_last_ts, (int64_t)(g.last_ts >> 32));
			}
			pthread_mutex_unlock(&co->mu);
		}
		if (co->arch_retention_s == 0 || sdb_mono_ms() < next_expire) {
			for (size_t i = 0; i < n; i++)
				free(ids[i]);
			free(ids);
			pthread_mutex_lock(&co->mu);
			continue;
		}
		next_expire = sdb_mono_ms() + period;
		uint64_t now_s = (uint64_t)sdb_wall_ms() / 1000;
		uint64_t cutoff = now_s > co->arch_retention_s
					  ? (now_s - co->arch_retention_s) << 32
					  : 0;
		for (size_t i = 0; i < n; i++) {
			char err[512];
			size_t removed = 0;
			int rc = cdc_archive_expire(a, ids[i], cutoff, &removed, err, sizeof err);
			if (rc)
				sdb_warn("cdc archive retention", "shard=%s error=\"%s\"", ids[i], err);
			else if (removed)
				sdb_info("cdc archive retention", "shard=%s segments_deleted=%zu "
					 "before_ts_seconds=%" PRIu64, ids[i], removed, cutoff >> 32);
			free(ids[i]);
		}
		free(ids);
		pthread_mutex_lock(&co->mu);
	}
	pthread_mutex_unlock(&co->mu);
	return NULL;
}

/* ------------------------------------------------------------ filtering reconciler */

typedef struct rec_client {
	char *shard, *uri;
	mongoc_client_t *c;
} rec_client;

/* The client of (shard, uri) from cs[0..*n), made when missing (a changed uri replaces it). */
static mongoc_client_t *rec_client_of(rec_client **cs, size_t *n, const char *shard,
				      const char *uri)
{
	for (size_t i = 0; i < *n; i++) {
		rec_client *e = &(*cs)[i];
		if (strcmp(e->shard, shard) != 0)
			continue;
		if (strcmp(e->uri, uri) == 0)
			return e->c;
		mongoc_client_destroy(e->c);
		free(e->uri);
		e->uri = sdb_strdup(uri);
		e->c = cfilt_shard_client(uri, "stripedb-coordinator");
		return e->c;
	}
	mongoc_client_t *c = cfilt_shard_client(uri, "stripedb-coordinator");
	if (!c)
		return NULL;
	*cs = sdb_realloc(*cs, (*n + 1) * sizeof **cs);
	(*cs)[*n] = (rec_client){sdb_strdup(shard), sdb_strdup(uri), c};
	(*n)++;
	return c;
}

/* Forget the clients of shards not in ids[0..n) (no longer held). */
static void rec_clients_prune(rec_client *cs, size_t *ncs, char **ids, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < *ncs; i++) {
		bool held = false;
		for (size_t j = 0; j < n && !held; j++)
			held = strcmp(cs[i].shard, ids[j]) == 0;
		if (held) {
			cs[k++] = cs[i];
			continue;
		}
		if (cs[i].c)
			mongoc_client_destroy(cs[i].c);
		free(cs[i].shard);
		free(cs[i].uri);
	}
	*ncs = k;
}

static void rec_clients_free(rec_client *cs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (cs[i].c)
			mongoc_client_destroy(cs[i].c);
		free(cs[i].shard);
		free(cs[i].uri);
	}
	free(cs);
}

/* Every CFILT_RECONCILE_PERIOD_MS: reconcile the shards whose lease this coordinator holds
 * (reconcile.h). Its own metadata and shard clients: nothing here delays lease renewals. */
static void *reconcile_thread(void *arg)
{
	coord *co = arg;
	cfilt_reconciler *r = cfilt_reconciler_new(&co->stop);
	mongoc_client_t *meta = NULL;
	uint64_t key_gen = 0;
	rec_client *cs = NULL;
	size_t ncs = 0;

	sdb_log_set_thread_role("coordinator"); /* the node id: from its role thread */
	pthread_mutex_lock(&co->mu);
	while (!atomic_load(&co->stop)) {
		sdb_cond_wait_ms(&co->cv, &co->mu, CFILT_RECONCILE_PERIOD_MS);
		if (atomic_load(&co->stop))
			break;
		size_t n = 0;
		char **ids = NULL, **uris = NULL;
		for (coord_pub *p = co->pubs; p; p = p->next) {
			if (p->stopping)
				continue;
			ids = sdb_realloc(ids, (n + 1) * sizeof *ids);
			uris = sdb_realloc(uris, (n + 1) * sizeof *uris);
			ids[n] = sdb_strdup(p->shard);
			uris[n++] = sdb_strdup(p->uri);
		}
		pthread_mutex_unlock(&co->mu);
		if (meta == NULL || auth_cluster_generation() != key_gen) {
			/* (re)made after a cluster key rotation, as the manager's client */
			if (meta)
				mongoc_client_destroy(meta);
			key_gen = auth_cluster_generation();
			meta = auth_cluster_client_new(co->meta_uri);
			if (meta) {
				mongoc_client_set_error_api(meta, MONGOC_ERROR_API_VERSION_2);
				mongoc_client_set_appname(meta, "stripedb-coordinator");
			}
		}
		rec_clients_prune(cs, &ncs, ids, n);
		cfilt_target *t = sdb_calloc(n ? n : 1, sizeof *t);
		size_t nt = 0;
		for (size_t i = 0; i < n; i++) {
			mongoc_client_t *c = rec_client_of(&cs, &ncs, ids[i], uris[i]);
			if (c)
				t[nt++] = (cfilt_target){ids[i], c};
		}
		if (meta && nt > 0) {
			char err[512];
			size_t installed = 0;
			if (cfilt_reconcile(r, meta, t, nt, &installed, err, sizeof err) != 0)
				sdb_warn("filtering reconciler", "error=\"%s\"", err);
		}
		free(t);
		for (size_t i = 0; i < n; i++) {
			free(ids[i]);
			free(uris[i]);
		}
		free(ids);
		free(uris);
		pthread_mutex_lock(&co->mu);
	}
	pthread_mutex_unlock(&co->mu);
	rec_clients_free(cs, ncs);
	if (meta)
		mongoc_client_destroy(meta);
	cfilt_reconciler_free(r);
	return NULL;
}

/* ------------------------------------------------------------ manager thread */

static void *manager(void *arg)
{
	coord *co = arg;
	mongoc_client_t *c = auth_cluster_client_new(co->meta_uri);
	int64_t period = co->lease_ms / 3 < 500 ? co->lease_ms / 3 : 500;
	sdb_log_set_thread_role("coordinator"); /* the node id: from its role thread */
	if (c == NULL) {
		sdb_error("bad metadata uri", "uri=%s", co->meta_uri);
		return NULL;
	}
	uint64_t key_gen = auth_cluster_generation();
	mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	mongoc_client_set_appname(c, "stripedb-coordinator");
	while (!atomic_load(&co->stop)) {
		if (auth_cluster_generation() != key_gen) {
			/* issue #21: the cluster key rotated; a client keeps the password it was
			 * made with, so its next connection would use the old key */
			mongoc_client_t *n = auth_cluster_client_new(co->meta_uri);
			key_gen = auth_cluster_generation();
			if (n) {
				mongoc_client_destroy(c);
				c = n;
				mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
				mongoc_client_set_appname(c, "stripedb-coordinator");
			}
		}
		cdc_tick(co, c);
		migrations_tick(co, c);
		pthread_mutex_lock(&co->mu);
		if (!atomic_load(&co->stop))
			sdb_cond_wait_ms(&co->cv, &co->mu, period); /* co->cv is CLOCK_MONOTONIC */
		pthread_mutex_unlock(&co->mu);
	}
	migrations_shutdown(co, c);
	cdc_shutdown(co, c);
	mongoc_client_destroy(c);
	return NULL;
}

/* ------------------------------------------------------------ HTTP */

static void append_ts(bson_t *b, const char *k, uint64_t ts)
{
	BSON_APPEND_TIMESTAMP(b, k, (uint32_t)(ts >> 32), (uint32_t)ts);
}

static void h_status(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	coord *co = data;
	bson_t doc = BSON_INITIALIZER, arr, sh, ar;
	char k[16];
	const char *kp;
	uint32_t i = 0;
	(void)req;
	BSON_APPEND_UTF8(&doc, "holder", co->holder);
	BSON_APPEND_UTF8(&doc, "backend", cdc_log_backend(co->log));
	pthread_mutex_lock(&co->mu);
	if (co->meta_error[0])
		BSON_APPEND_UTF8(&doc, "metadataError", co->meta_error);
	BSON_APPEND_ARRAY_BEGIN(&doc, "shards", &arr);
	for (coord_pub *p = co->pubs; p; p = p->next) {
		cdc_publisher_status st;
		if (p->stopping)
			continue;
		cdc_publisher_get_status(p->pub, &st);
		bson_uint32_to_string(i++, &kp, k, sizeof k);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, kp, &sh);
		BSON_APPEND_UTF8(&sh, "shard", p->shard);
		BSON_APPEND_UTF8(&sh, "uri", p->uri);
		BSON_APPEND_BOOL(&sh, "running", st.running);
		append_ts(&sh, "publishedTs", st.published_ts);
		BSON_APPEND_INT64(&sh, "nextOffset", (int64_t)st.next_offset);
		append_ts(&sh, "headTs", st.head_ts);
		BSON_APPEND_INT64(&sh, "lagSeconds",
				  st.head_ts ? (int64_t)(st.head_ts >> 32) -
						       (int64_t)(st.published_ts >> 32)
					     : 0);
		BSON_APPEND_INT64(&sh, "lagEvents", st.lag_events);
		BSON_APPEND_INT64(&sh, "events", (int64_t)st.events);
		BSON_APPEND_INT64(&sh, "leaseEpoch", p->epoch);
		BSON_APPEND_UTF8(&sh, "error", st.last_error);
		BSON_APPEND_DOCUMENT_BEGIN(&sh, "archive", &ar);
		BSON_APPEND_INT64(&ar, "firstOffset", (int64_t)p->arch.first_offset);
		BSON_APPEND_INT64(&ar, "nextOffset", (int64_t)p->arch.next_offset);
		append_ts(&ar, "firstTs", p->arch.first_ts);
		append_ts(&ar, "lastTs", p->arch.last_ts);
		bson_append_document_end(&sh, &ar);
		bson_append_document_end(&arr, &sh);
	}
	pthread_mutex_unlock(&co->mu);
	bson_append_array_end(&doc, &arr);
	size_t len;
	char *j = bson_as_relaxed_extended_json(&doc, &len);
	resp->body = sdb_strndup(j, len);
	resp->body_len = len;
	bson_free(j);
	bson_destroy(&doc);
}

static int health(void *data, char *msg, size_t msglen)
{
	coord *co = data;
	snprintf(msg, msglen, "coordinator %s", co->holder);
	return 1;
}

/* ------------------------------------------------------------ role */

static void coord_free(coord *co)
{
	cdc_log_close(co->log);
	pthread_mutex_destroy(&co->mu);
	pthread_cond_destroy(&co->cv);
	free(co->meta_uri);
	free(co->holder);
	free(co);
}

static int coordinator_start(sdb_role *role)
{
	const sdb_config *cfg = role->cfg;
	const char *meta = sdb_config_get(cfg, SDB_OPT_metadata);
	const char *cdc = sdb_config_get(cfg, SDB_OPT_cdc);
	const char *http = sdb_config_get(cfg, SDB_OPT_http_listen);
	cdc_log_opts o = {0};
	int rc;

	if (meta == NULL)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --metadata=H:P,... is required");
	if (cdc == NULL)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --cdc=embedded:DIR or kafka:BOOTSTRAP is required");
	if (cdc_fsync_parse(sdb_config_get(cfg, SDB_OPT_cdc_fsync), &o.fsync) != 0)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --cdc-fsync must be batch, segment or never");
	if (sdb_config_get_int(cfg, SDB_OPT_migration_budget, 8) < 1 ||
	    sdb_config_get_int(cfg, SDB_OPT_migration_shard_budget, 2) < 1)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --migration-budget and --migration-shard-budget must "
				"be at least 1");
	o.segment_bytes = (uint64_t)sdb_config_get_int(cfg, SDB_OPT_cdc_segment_bytes, 64 << 20);
	o.retention_bytes = (uint64_t)sdb_config_get_int(cfg, SDB_OPT_cdc_retention_bytes, 0);
	o.archive = sdb_config_get(cfg, SDB_OPT_archive);
	o.s3_endpoint = sdb_config_get(cfg, SDB_OPT_s3_endpoint);
	o.s3_region = sdb_config_get(cfg, SDB_OPT_s3_region);
	o.s3_credentials_file = sdb_config_get(cfg, SDB_OPT_s3_credentials_file);
	uint64_t arch_retention_s = 0;
	if (cdc_archive_retention_parse(sdb_config_get(cfg, SDB_OPT_archive_retention),
					&arch_retention_s) != 0)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --archive-retention must be N, Ns, Nm, Nh or Nd "
				"(0 keeps archived segments forever)");
	uint64_t backup_interval_s = 0;
	if (cdc_archive_retention_parse(sdb_config_get(cfg, SDB_OPT_backup_interval),
					&backup_interval_s) != 0)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --backup-interval must be N, Ns, Nm, Nh or Nd "
				"(0: no scheduled backups)");
	if (backup_interval_s && (o.archive == NULL || o.archive[0] == '\0'))
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"coordinator: --backup-interval needs --archive (backups are kept "
				"in the archive)");
	/* Shards and metadata of a keyed cluster refuse internal commands (routing updates,
	 * version bumps, replication writes) from anyone without the key (issue #10). */
	rc = auth_cluster_setup(cfg, role->err, sizeof role->err);
	if (rc)
		return rc;

	coord *co = sdb_calloc(1, sizeof *co);
	co->role = role;
	co->lease_ms = sdb_config_get_int(cfg, SDB_OPT_cdc_lease_ms, 5000);
	co->budget_global = (int)sdb_config_get_int(cfg, SDB_OPT_migration_budget, 8);
	co->budget_shard = (int)sdb_config_get_int(cfg, SDB_OPT_migration_shard_budget, 2);
	if (co->lease_ms < 300)
		co->lease_ms = 300;
	pthread_mutex_init(&co->mu, NULL);
	sdb_cond_init_mono(&co->cv);
	atomic_init(&co->stop, 0);
	rc = cdc_log_open(cdc, &o, &co->log, role->err, sizeof role->err);
	if (rc) {
		coord_free(co);
		return sdb_errwrap(role->err, sizeof role->err, rc, "coordinator");
	}
	co->meta_uri = sdb_meta_uri(meta, false, 2000, 2000, 10000);
	char host[256];
	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "localhost");
	host[sizeof host - 1] = '\0';
	co->holder = sdb_asprintf("%s/%d/%s", host, (int)getpid(), http ? http : "-");
	mongoc_init();
	if (sdb_thread_create(&co->mgr, manager, co) != 0)
		abort();
	co->mgr_started = 1;
	co->arch_retention_s = arch_retention_s;
	co->backup_interval_s = backup_interval_s;
	if (cdc_log_archive(co->log)) {
		if (sdb_thread_create(&co->ret, archive_thread, co) != 0)
			abort();
		co->ret_started = 1;
	}
	if (sdb_thread_create(&co->rec, reconcile_thread, co) != 0)
		abort();
	co->rec_started = 1;
	if (role->http) {
		rc = sdb_http_route(role->http, "GET", "/cdc/status", h_status, co);
		if (rc == 0)
			sdb_http_add_health(role->http, "coordinator", health, co);
	}
	role->impl = co;
	sdb_info("coordinator started", "holder=%s cdc=%s lease_ms=%" PRId64, co->holder, cdc,
		 co->lease_ms);
	return 0;
}

static void coordinator_stop(sdb_role *role)
{
	coord *co = role->impl;
	if (co) {
		if (role->http)
			sdb_http_unroute(role->http, co);
		pthread_mutex_lock(&co->mu);
		atomic_store(&co->stop, 1);
		pthread_cond_broadcast(&co->cv);
		pthread_mutex_unlock(&co->mu);
		if (co->mgr_started)
			pthread_join(co->mgr, NULL);
		if (co->ret_started)
			pthread_join(co->ret, NULL);
		if (co->rec_started)
			pthread_join(co->rec, NULL);
		coord_free(co);
		role->impl = NULL;
	}
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_coordinator = {
	.name = "coordinator",
	.start = coordinator_start,
	.stop = coordinator_stop,
};
