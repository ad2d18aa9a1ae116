/* The embedded CDC log backend: embedded:DIR, one segment directory per shard
 * (DIR/<shard>/, format in segdir.h), retention by bytes of closed segments, closed
 * segments archived before they are deleted. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdc/archive.h"
#include "cdc/log.h"
#include "cdc/segdir.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

typedef struct emb_writer {
	cdc_log *log;
	char *shard;
	char *dir;
	cdc_segwriter *sw;
	uint64_t retry_at_ms; /* archive failed: retry retention at flush from then (monotonic) */
	uint64_t retry_delay_ms; /* current backoff, 0 after a success */
} emb_writer;

/* After an archive failure, retry no sooner than this (ms), doubling up to the max. */
#define EMB_ARCHIVE_RETRY_MS 1000
#define EMB_ARCHIVE_RETRY_MAX_MS 8000

typedef struct emb_src {
	cdc_segread *r; /* NULL while the shard's log has no segment yet */
	char *dir;
	uint64_t offset;
} emb_src;

static char *shard_dir(cdc_log *log, const char *shard)
{
	return sdb_asprintf("%s/%s", (const char *)log->impl, shard);
}

static int emb_open(cdc_log *log, const char *arg, char *err, size_t errlen)
{
	int rc;
	if (arg[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "embedded: empty directory");
	rc = cdc_mkdirs(arg, err, errlen);
	if (rc)
		return sdb_errwrap(err, errlen, rc, "embedded");
	log->impl = sdb_strdup(arg);
	return 0;
}

static void emb_close(cdc_log *log)
{
	free(log->impl);
	log->impl = NULL;
}

/* Archive then delete the oldest closed segments while closed segments exceed the
 * retention. A segment is deleted only after the archive confirmed it; when the archive
 * fails (an S3 endpoint down, refused credentials), the segment stays, the failure is
 * logged, publishing goes on, and the retention is retried at the next roll or at a
 * flush after a backoff (EMB_ARCHIVE_RETRY_MS doubling). */
static int emb_retain(emb_writer *w, char *err, size_t errlen)
{
	cdc_seginfo *s;
	size_t n;
	uint64_t keep = w->log->opts.retention_bytes, total = 0;
	int rc;
	if (keep == 0)
		return 0;
	if (w->retry_at_ms && sdb_mono_ms() < w->retry_at_ms)
		return 0; /* the archive failed recently: keep everything until the backoff ends */
	rc = cdc_segdir_list(w->dir, &s, &n, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i + 1 < n; i++)
		total += s[i].bytes;
	for (size_t i = 0; i + 1 < n && total > keep; i++) {
		if (w->log->archive) {
			rc = cdc_archive_put(w->log->archive, w->shard, w->dir, s[i].first_offset,
					     err, errlen);
			if (rc) {
				sdb_warn("cdc segment kept: archive failed",
					 "shard=%s first=%" PRIu64 " error=\"%s\"", w->shard,
					 s[i].first_offset, err);
				w->retry_delay_ms = w->retry_delay_ms == 0 ? EMB_ARCHIVE_RETRY_MS
						    : w->retry_delay_ms * 2 > EMB_ARCHIVE_RETRY_MAX_MS
							    ? EMB_ARCHIVE_RETRY_MAX_MS
							    : w->retry_delay_ms * 2;
				w->retry_at_ms = sdb_mono_ms() + w->retry_delay_ms;
				free(s);
				return 0;
			}
		}
		rc = cdc_segdir_remove(w->dir, s[i].first_offset, err, errlen);
		if (rc)
			break;
		sdb_info("cdc segment retired", "shard=%s first=%" PRIu64 " next=%" PRIu64
			 " archived=%d", w->shard, s[i].first_offset, s[i].next_offset,
			 w->log->archive != NULL);
		total -= s[i].bytes;
	}
	free(s);
	if (rc == 0)
		w->retry_delay_ms = 0;
	return rc;
}

static int emb_writer_open(cdc_log *log, const char *shard, void **out, uint64_t *next_offset,
			   uint64_t *last_ts, char *err, size_t errlen)
{
	emb_writer *w = sdb_calloc(1, sizeof *w);
	int rc;
	w->log = log;
	w->shard = sdb_strdup(shard);
	w->dir = shard_dir(log, shard);
	rc = cdc_segwriter_open(w->dir, log->opts.fsync, log->opts.segment_bytes, 0, &w->sw,
				next_offset, last_ts, err, errlen);
	if (rc == 0)
		rc = emb_retain(w, err, errlen);
	if (rc) {
		cdc_segwriter_close(w->sw);
		free(w->shard);
		free(w->dir);
		free(w);
		return rc;
	}
	*out = w;
	return 0;
}

static int emb_append(void *wp, uint64_t offset, uint64_t ts, const uint8_t *data, size_t len,
		      char *err, size_t errlen)
{
	emb_writer *w = wp;
	int rolled = 0;
	int rc = cdc_segwriter_append(w->sw, offset, ts, data, len, &rolled, err, errlen);
	if (rc == 0 && rolled)
		rc = emb_retain(w, err, errlen);
	return rc;
}

static int emb_flush(void *wp, char *err, size_t errlen)
{
	emb_writer *w = wp;
	int rc = cdc_segwriter_flush(w->sw, err, errlen);
	if (rc == 0 && w->retry_at_ms && sdb_mono_ms() >= w->retry_at_ms) {
		w->retry_at_ms = 0;
		rc = emb_retain(w, err, errlen);
	}
	return rc;
}

static void emb_writer_close(void *wp)
{
	emb_writer *w = wp;
	cdc_segwriter_close(w->sw);
	free(w->shard);
	free(w->dir);
	free(w);
}

static int emb_range(cdc_log *log, const char *shard, cdc_range *out, char *err, size_t errlen)
{
	char *dir = shard_dir(log, shard);
	int rc = cdc_segdir_range(dir, out, err, errlen);
	free(dir);
	return rc;
}

static int emb_locate(cdc_log *log, const char *shard, uint64_t after_ts, uint64_t *offset,
		      char *err, size_t errlen)
{
	char *dir = shard_dir(log, shard);
	int rc = cdc_segdir_locate(dir, after_ts, offset, err, errlen);
	free(dir);
	return rc;
}

static int emb_src_open(cdc_log *log, const char *shard, uint64_t offset, void **out, char *err,
			size_t errlen)
{
	emb_src *s = sdb_calloc(1, sizeof *s);
	cdc_range g;
	s->dir = shard_dir(log, shard);
	s->offset = offset;
	int rc = cdc_segread_open(s->dir, offset, &s->r, err, errlen);
	/* a log never written yet: wait for its first segment */
	if (rc == SDB_ENOTFOUND && offset == 0 && cdc_segdir_range(s->dir, &g, err, errlen) == 0 &&
	    g.next_offset == 0)
		rc = 0;
	if (rc) {
		free(s->dir);
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static int emb_src_next(void *sp, cdc_event *ev, int timeout_ms, char *err, size_t errlen)
{
	emb_src *s = sp;
	uint64_t start = sdb_mono_ms();
	int64_t nap_ms = 1;
	for (;;) {
		int rc = 0;
		if (s->r == NULL) {
			rc = cdc_segread_open(s->dir, s->offset, &s->r, err, errlen);
			if (rc != 0 && rc != SDB_ENOTFOUND)
				return rc;
		}
		if (s->r != NULL)
			rc = cdc_segread_next(s->r, ev, err, errlen);
		if (rc != 0 && rc != SDB_ENOTFOUND)
			return rc;
		int64_t waited = (int64_t)(sdb_mono_ms() - start);
		if (waited >= timeout_ms)
			return 0;
		/* the log grows by appends from another thread or process: poll it, backing
		 * off from 1 ms to 50 ms while nothing comes */
		int64_t left = timeout_ms - waited;
		int64_t ms = nap_ms < left ? nap_ms : left;
		struct timespec d = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
		nanosleep(&d, NULL);
		if (nap_ms < 50)
			nap_ms *= 2;
	}
}

static void emb_src_close(void *sp)
{
	emb_src *s = sp;
	cdc_segread_close(s->r);
	free(s->dir);
	free(s);
}

const cdc_backend cdc_backend_embedded = {
	.name = "embedded",
	.open = emb_open,
	.close = emb_close,
	.writer_open = emb_writer_open,
	.append = emb_append,
	.flush = emb_flush,
	.writer_close = emb_writer_close,
	.range = emb_range,
	.locate = emb_locate,
	.src_open = emb_src_open,
	.src_next = emb_src_next,
	.src_close = emb_src_close,
};
