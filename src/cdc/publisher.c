/* The per-shard CDC publisher thread. See publisher.h. */
#include "cdc/publisher.h"

#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdc/archive.h"
#include "auth/cluster.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"

#define BATCH 5000
#define AWAIT_MS 500
#define PROBE_EVERY_MS 1000

struct cdc_publisher {
	cdc_log *log;
	char *shard;
	char *uri;
	pthread_t thread;
	atomic_int stop;
	atomic_int done; /* the thread has closed its writer */
	atomic_llong fence_ms;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	cdc_publisher_status st; /* under mu */
	sdb_gauge *g_ts, *g_off, *g_lag_s, *g_lag_n;
	sdb_counter *c_events, *c_errors, *c_archived;
	cdc_archiver *arch; /* Kafka with an archive: copies the topic into it */
};

static const sdb_metric_def publisher_metrics[] = {
	SDB_METRIC_GAUGE(cdc_publisher, g_ts, "stripedb_cdc_published_ts_seconds",
			 "CDC: oplog ts (seconds) of the last published event"),
	SDB_METRIC_GAUGE(cdc_publisher, g_off, "stripedb_cdc_published_offset",
			 "CDC: offset the next published event gets"),
	SDB_METRIC_GAUGE(cdc_publisher, g_lag_s, "stripedb_cdc_lag_seconds",
			 "CDC: oplog head ts minus published ts (seconds)"),
	SDB_METRIC_GAUGE(cdc_publisher, g_lag_n, "stripedb_cdc_lag_events",
			 "CDC: oplog entries not published yet (capped at 1000; -1 unknown)"),
	SDB_METRIC_COUNTER(cdc_publisher, c_events, "stripedb_cdc_events_published_total",
			   "CDC: events appended to the log"),
	SDB_METRIC_COUNTER(cdc_publisher, c_errors, "stripedb_cdc_publish_errors_total",
			   "CDC: publisher errors (retried)"),
	SDB_METRIC_COUNTER(cdc_publisher, c_archived, "stripedb_cdc_archived_events_total",
			   "CDC: events copied from Kafka into the archive"),
};

/* Wait up to ms unless stopping; returns 1 when stopping. */
static int nap(cdc_publisher *p, int ms)
{
	pthread_mutex_lock(&p->mu);
	if (!atomic_load(&p->stop))
		sdb_cond_wait_ms(&p->cv, &p->mu, ms); /* p->cv is CLOCK_MONOTONIC */
	pthread_mutex_unlock(&p->mu);
	return atomic_load(&p->stop);
}

static void set_error(cdc_publisher *p, const char *msg)
{
	pthread_mutex_lock(&p->mu);
	snprintf(p->st.last_error, sizeof p->st.last_error, "%s", msg);
	pthread_mutex_unlock(&p->mu);
	sdb_counter_inc(p->c_errors);
	char q[300];
	sdb_warn("cdc publisher", "shard=%s error=%s", p->shard, sdb_logq(q, sizeof q, msg));
}

static void publish_progress(cdc_publisher *p, cdc_writer *w, uint64_t added)
{
	uint64_t ts = cdc_writer_last_ts(w);
	pthread_mutex_lock(&p->mu);
	p->st.running = 1;
	p->st.published_ts = ts;
	p->st.next_offset = cdc_writer_next_offset(w);
	p->st.events += added;
	p->st.last_error[0] = '\0';
	int caught_up = p->st.head_ts && p->st.head_ts <= ts;
	if (caught_up)
		p->st.lag_events = 0;
	if (p->st.head_ts < ts)
		p->st.head_ts = ts;
	uint64_t head = p->st.head_ts;
	pthread_mutex_unlock(&p->mu);
	sdb_gauge_set(p->g_ts, (int64_t)(ts >> 32));
	sdb_gauge_set(p->g_off, (int64_t)cdc_writer_next_offset(w));
	sdb_gauge_set(p->g_lag_s, (int64_t)(head >> 32) - (int64_t)(ts >> 32));
	if (caught_up)
		sdb_gauge_set(p->g_lag_n, 0);
	sdb_counter_add(p->c_events, added);
}

static bool ts_field(const bson_t *doc, uint64_t *ts)
{
	bson_iter_t it;
	uint32_t t, i;
	if (!bson_iter_init_find(&it, doc, "ts") || !BSON_ITER_HOLDS_TIMESTAMP(&it))
		return false;
	bson_iter_timestamp(&it, &t, &i);
	*ts = ((uint64_t)t << 32) | i;
	return true;
}

/* Head of the oplog and the number of entries after `after` (capped). */
static void probe_lag(cdc_publisher *p, mongoc_client_t *c, uint64_t after)
{
	bson_t cmd = BSON_INITIALIZER, reply, sort, filt, gt;
	bson_error_t e;
	bson_iter_t it, arr;
	uint64_t head = 0;
	int64_t n = -1;
	BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "sort", &sort);
	BSON_APPEND_INT32(&sort, "$natural", -1);
	bson_append_document_end(&cmd, &sort);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	if (mongoc_client_command_simple(c, "local", &cmd, NULL, &reply, &e) &&
	    bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "cursor.firstBatch", &arr) &&
	    BSON_ITER_HOLDS_ARRAY(&arr) && bson_iter_recurse(&arr, &it) && bson_iter_next(&it)) {
		const uint8_t *d;
		uint32_t l;
		bson_t doc;
		bson_iter_document(&it, &l, &d);
		if (bson_init_static(&doc, d, l))
			ts_field(&doc, &head);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (head != 0 && head <= after) {
		n = 0;
	} else if (head != 0) {
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &filt);
		BSON_APPEND_DOCUMENT_BEGIN(&filt, "ts", &gt);
		BSON_APPEND_TIMESTAMP(&gt, "$gt", (uint32_t)(after >> 32), (uint32_t)after);
		bson_append_document_end(&filt, &gt);
		bson_append_document_end(&cmd, &filt);
		BSON_APPEND_INT32(&cmd, "limit", CDC_LAG_EVENTS_CAP);
		BSON_APPEND_INT32(&cmd, "batchSize", CDC_LAG_EVENTS_CAP);
		BSON_APPEND_BOOL(&cmd, "singleBatch", true);
		if (mongoc_client_command_simple(c, "local", &cmd, NULL, &reply, &e) &&
		    bson_iter_init(&it, &reply) &&
		    bson_iter_find_descendant(&it, "cursor.firstBatch", &arr) &&
		    BSON_ITER_HOLDS_ARRAY(&arr) && bson_iter_recurse(&arr, &it)) {
			n = 0;
			while (bson_iter_next(&it))
				n++;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	pthread_mutex_lock(&p->mu);
	if (head > p->st.head_ts)
		p->st.head_ts = head;
	p->st.lag_events = n;
	head = p->st.head_ts;
	pthread_mutex_unlock(&p->mu);
	sdb_gauge_set(p->g_lag_n, n);
	sdb_gauge_set(p->g_lag_s, head ? (int64_t)(head >> 32) - (int64_t)(after >> 32) : 0);
}

/* Append every entry of the batch array at arr; returns 0 or an error (stops at it). */
static int append_batch(cdc_publisher *p, cdc_writer *w, bson_iter_t *arr, uint64_t *added,
			char *err, size_t errlen)
{
	bson_iter_t it;
	if (!BSON_ITER_HOLDS_ARRAY(arr) || !bson_iter_recurse(arr, &it))
		return sdb_errf(err, errlen, SDB_EPROTO, "cursor batch is not an array");
	while (bson_iter_next(&it)) {
		const uint8_t *d;
		uint32_t l;
		bson_t doc;
		uint64_t ts;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it))
			return sdb_errf(err, errlen, SDB_EPROTO, "oplog entry is not a document");
		bson_iter_document(&it, &l, &d);
		if (!bson_init_static(&doc, d, l) || !ts_field(&doc, &ts))
			return sdb_errf(err, errlen, SDB_EPROTO, "oplog entry without a Timestamp ts");
		if (ts <= cdc_writer_last_ts(w))
			continue; /* already published */
		int64_t fence = atomic_load(&p->fence_ms);
		if (fence && (int64_t)sdb_mono_ms() >= fence)
			return sdb_errf(err, errlen, SDB_ECANCELED,
					"lease not renewed in time: publishing paused");
		int rc = cdc_writer_append(w, ts, d, l, err, errlen);
		if (rc)
			return rc;
		(*added)++;
	}
	return 0;
}

/* Kafka backend with an archive: copy what the broker has and the archive has not, up to
 * `upto` (the published offset), waiting for it at most 5 s: the publisher does not run
 * ahead of its archive, so the broker's retention cannot drop a range before it is
 * archived unless the archive itself is stuck (then this is reported: status, metric,
 * log, and publishing goes on). */
static void archive_step(cdc_publisher *p, uint64_t upto)
{
	char err[512];
	size_t copied = 0;
	int rc = 0;
	if (cdc_log_archive(p->log) == NULL || strcmp(cdc_log_backend(p->log), "kafka") != 0)
		return;
	if (p->arch == NULL && cdc_archiver_open(p->log, p->shard, &p->arch, err, sizeof err) != 0) {
		p->arch = NULL;
		set_error(p, err);
		return;
	}
	int64_t deadline = (int64_t)sdb_mono_ms() + 5000;
	do {
		rc = cdc_archiver_step(p->arch, 100000, 50, &copied, err, sizeof err);
		sdb_counter_add(p->c_archived, copied);
	} while (rc == 0 && cdc_archiver_next(p->arch) < upto && (int64_t)sdb_mono_ms() < deadline &&
		 !atomic_load(&p->stop));
	if (rc)
		set_error(p, err);
}

/* Oldest oplog ts of the shard (0 when empty); -1 on error. */
static int oplog_oldest(mongoc_client_t *c, uint64_t *oldest, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply, sort;
	bson_error_t e;
	bson_iter_t it, arr;
	int rc = 0;
	*oldest = 0;
	BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "sort", &sort);
	BSON_APPEND_INT32(&sort, "$natural", 1);
	bson_append_document_end(&cmd, &sort);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	if (!mongoc_client_command_simple(c, "local", &cmd, NULL, &reply, &e)) {
		rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "shard: %s", e.message);
	} else if (bson_iter_init(&it, &reply) &&
		   bson_iter_find_descendant(&it, "cursor.firstBatch", &arr) &&
		   BSON_ITER_HOLDS_ARRAY(&arr) && bson_iter_recurse(&arr, &it) && bson_iter_next(&it) &&
		   BSON_ITER_HOLDS_DOCUMENT(&it)) {
		const uint8_t *d;
		uint32_t l;
		bson_t doc;
		bson_iter_document(&it, &l, &d);
		if (bson_init_static(&doc, d, l))
			ts_field(&doc, oldest);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* One tailing session: find + getMore until error or stop. *shard_down is set when the
 * error is the shard's (unreachable or refusing the oplog read), not the log's. */
static int tail(cdc_publisher *p, mongoc_client_t *c, cdc_writer *w, bool *shard_down,
		char *err, size_t errlen)
{
	int64_t cursor = 0, next_probe = 0;
	int rc = 0;
	while (!atomic_load(&p->stop)) {
		bson_t cmd = BSON_INITIALIZER, reply, filt, gt;
		bson_error_t e;
		bson_iter_t it, arr;
		uint64_t added = 0;
		if (cursor == 0) {
			uint64_t from = cdc_writer_last_ts(w), oldest;
			/* resume only if the published position is still in the oplog (as a
			 * change stream's resume token must be): otherwise entries after it may
			 * have been trimmed, and publishing on would hide the loss */
			rc = oplog_oldest(c, &oldest, err, errlen);
			*shard_down = rc == SDB_EUNAVAILABLE;
			if (rc == 0 && from != 0 && oldest > from)
				rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
					      "oplog history lost: the shard's oldest oplog entry "
					      "%u:%u is newer than the published position %u:%u; the "
					      "log needs a resync",
					      (unsigned)(oldest >> 32), (unsigned)oldest,
					      (unsigned)(from >> 32), (unsigned)from);
			if (rc) {
				bson_destroy(&cmd);
				break;
			}
			BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
			BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &filt);
			BSON_APPEND_DOCUMENT_BEGIN(&filt, "ts", &gt);
			BSON_APPEND_TIMESTAMP(&gt, "$gt", (uint32_t)(from >> 32), (uint32_t)from);
			bson_append_document_end(&filt, &gt);
			bson_append_document_end(&cmd, &filt);
			BSON_APPEND_BOOL(&cmd, "tailable", true);
			BSON_APPEND_BOOL(&cmd, "awaitData", true);
			BSON_APPEND_INT32(&cmd, "batchSize", BATCH);
		} else {
			BSON_APPEND_INT64(&cmd, "getMore", cursor);
			BSON_APPEND_UTF8(&cmd, "collection", "oplog.rs");
			BSON_APPEND_INT32(&cmd, "batchSize", BATCH);
			BSON_APPEND_INT64(&cmd, "maxTimeMS", AWAIT_MS);
		}
		if (!mongoc_client_command_simple(c, "local", &cmd, NULL, &reply, &e)) {
			rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "shard %s: %s", p->shard,
				      e.message);
			*shard_down = true;
			bson_destroy(&reply);
			bson_destroy(&cmd);
			break;
		}
		bson_destroy(&cmd);
		int has = bson_iter_init(&it, &reply) &&
			  (bson_iter_find_descendant(&it, "cursor.firstBatch", &arr) ||
			   (bson_iter_init(&it, &reply) &&
			    bson_iter_find_descendant(&it, "cursor.nextBatch", &arr)));
		if (has)
			rc = append_batch(p, w, &arr, &added, err, errlen);
		if (rc == 0 && added > 0)
			rc = cdc_writer_flush(w, err, errlen);
		if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "cursor.id", &arr))
			cursor = bson_iter_as_int64(&arr);
		else
			cursor = 0;
		bson_destroy(&reply);
		if (rc)
			break;
		publish_progress(p, w, added);
		if (added > 0 || (int64_t)sdb_mono_ms() >= next_probe)
			archive_step(p, cdc_writer_next_offset(w));
		if ((int64_t)sdb_mono_ms() >= next_probe) {
			probe_lag(p, c, cdc_writer_last_ts(w));
			next_probe = (int64_t)sdb_mono_ms() + PROBE_EVERY_MS;
		}
		if (cursor == 0 && added == 0 && nap(p, 100))
			break;
	}
	if (cursor != 0) {
		bson_t cmd = BSON_INITIALIZER, ids;
		BSON_APPEND_UTF8(&cmd, "killCursors", "oplog.rs");
		BSON_APPEND_ARRAY_BEGIN(&cmd, "cursors", &ids);
		BSON_APPEND_INT64(&ids, "0", cursor);
		bson_append_array_end(&cmd, &ids);
		(void)mongoc_client_command_simple(c, "local", &cmd, NULL, NULL, NULL);
		bson_destroy(&cmd);
	}
	return rc;
}

static void *run(void *arg)
{
	cdc_publisher *p = arg;
	char err[512];
	cdc_writer *w = NULL;
	mongoc_client_t *c = NULL;
	uint64_t key_gen = 0; /* auth_cluster_generation c was made with */
	sdb_log_set_thread("coordinator", p->shard);
	while (!atomic_load(&p->stop)) {
		int rc;
		if (w == NULL) {
			rc = cdc_log_writer_open(p->log, p->shard, &w, err, sizeof err);
			if (rc) {
				w = NULL;
				set_error(p, err);
				nap(p, 200);
				continue;
			}
			sdb_info("cdc publisher resumes", "shard=%s after_ts=%u:%u offset=%" PRIu64,
				 p->shard, (unsigned)(cdc_writer_last_ts(w) >> 32),
				 (unsigned)cdc_writer_last_ts(w), cdc_writer_next_offset(w));
			publish_progress(p, w, 0);
		}
		if (c != NULL && auth_cluster_generation() != key_gen) {
			mongoc_client_destroy(c); /* issue #21: made anew with the rotated key */
			c = NULL;
		}
		if (c == NULL) {
			key_gen = auth_cluster_generation();
			c = auth_cluster_client_new(p->uri); /* issue #10 */
			if (c == NULL) {
				set_error(p, "bad shard uri");
				nap(p, 1000);
				continue;
			}
			mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
			mongoc_client_set_appname(c, "stripedb-cdc");
		}
		bool shard_down = false;

		rc = tail(p, c, w, &shard_down, err, sizeof err);
		if (rc) {
			set_error(p, err);
			/* the log is the checkpoint: reopen the writer so its state is re-read
			 * (kept when only the shard was down) */
			if (!shard_down) {
				cdc_writer_close(w);
				w = NULL;
				pthread_mutex_lock(&p->mu);
				p->st.running = 0;
				pthread_mutex_unlock(&p->mu);
			}
			mongoc_client_destroy(c);
			c = NULL;
			nap(p, rc == SDB_ENOTFOUND ? 5000 : 200);
		}
	}
	if (w) {
		if (cdc_writer_flush(w, err, sizeof err) != 0)
			set_error(p, err);
		cdc_writer_close(w);
	}
	cdc_archiver_close(p->arch);
	p->arch = NULL;
	if (c)
		mongoc_client_destroy(c);
	atomic_store(&p->done, 1);
	return NULL;
}

int cdc_publisher_start(cdc_log *log, const char *shard, const char *uri, int64_t fence_ms,
			cdc_publisher **out, char *err, size_t errlen)
{
	bson_error_t e;
	mongoc_uri_t *u = mongoc_uri_new_with_error(uri, &e);
	if (u == NULL)
		return sdb_errf(err, errlen, SDB_EINVAL, "shard %s: bad uri: %s", shard, e.message);
	mongoc_uri_destroy(u);
	cdc_publisher *p = sdb_calloc(1, sizeof *p);
	char labels[200];
	p->log = log;
	p->shard = sdb_strdup(shard);
	p->uri = sdb_strdup(uri);
	atomic_init(&p->stop, 0);
	atomic_init(&p->done, 0);
	atomic_init(&p->fence_ms, fence_ms);
	p->st.lag_events = -1;
	pthread_mutex_init(&p->mu, NULL);
	sdb_cond_init_mono(&p->cv);
	snprintf(labels, sizeof labels, "shard=\"%s\"", shard);
	SDB_METRICS_REGISTER(p, publisher_metrics, labels);
	sdb_gauge_set(p->g_lag_n, -1);
	if (sdb_thread_create(&p->thread, run, p) != 0)
		abort();
	*out = p;
	return 0;
}

void cdc_publisher_fence(cdc_publisher *p, int64_t fence_ms)
{
	atomic_store(&p->fence_ms, fence_ms);
}

void cdc_publisher_get_status(cdc_publisher *p, cdc_publisher_status *out)
{
	pthread_mutex_lock(&p->mu);
	*out = p->st;
	pthread_mutex_unlock(&p->mu);
}

void cdc_publisher_request_stop(cdc_publisher *p)
{
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int cdc_publisher_stopped(cdc_publisher *p)
{
	return atomic_load(&p->done);
}

void cdc_publisher_stop(cdc_publisher *p)
{
	if (p == NULL)
		return;
	cdc_publisher_request_stop(p);
	pthread_join(p->thread, NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->shard);
	free(p->uri);
	free(p);
}
