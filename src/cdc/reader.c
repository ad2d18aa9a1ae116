/* The CDC consumer: archive first, live log next, dedupe on ts. See reader.h. */
#include "cdc/reader.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cdc/archive.h"
#include "cdc/segdir.h"
#include "common/alloc.h"
#include "common/err.h"

struct cdc_reader {
	cdc_log *log;
	char *shard;
	cdc_archive *archive; /* NULL without archive */
	char *view;           /* the reader's view of the archive (archive.h) */
	uint64_t next;     /* offset of the next event to read */
	uint64_t last_ts;  /* position */
	uint64_t archived;
	void *live;        /* backend source, or NULL */
	cdc_segread *arch; /* archive reader, or NULL */
};

static int ranges(cdc_reader *r, cdc_range *live, cdc_range *arch, char *err, size_t errlen)
{
	int rc = cdc_log_range(r->log, r->shard, live, err, errlen);
	memset(arch, 0, sizeof *arch);
	if (rc == 0 && r->archive)
		rc = cdc_archive_range(r->archive, r->shard, arch, err, errlen);
	return rc;
}

static int covers(const cdc_range *g, uint64_t off)
{
	return g->next_offset > g->first_offset && off >= g->first_offset && off < g->next_offset;
}

static void drop_sources(cdc_reader *r)
{
	if (r->live)
		r->log->be->src_close(r->live);
	r->live = NULL;
	cdc_segread_close(r->arch);
	r->arch = NULL;
}

/* Open the source that holds r->next. */
static int resolve(cdc_reader *r, char *err, size_t errlen)
{
	cdc_range live, arch;
	int rc = ranges(r, &live, &arch, err, errlen);
	drop_sources(r);
	if (rc)
		return rc;
	if (r->next >= live.first_offset || live.next_offset == 0) {
		rc = r->log->be->src_open(r->log, r->shard, r->next, &r->live, err, errlen);
		if (rc != SDB_ENOTFOUND)
			return rc;
	}
	if (covers(&arch, r->next)) {
		rc = cdc_archive_read_open(r->archive, r->shard, r->view, r->next, &r->arch, err,
					   errlen);
		if (rc != SDB_ENOTFOUND) /* else a segment missing inside the archive's range */
			return rc;
	}
	return sdb_errf(err, errlen, SDB_ENOTFOUND,
			"cdc %s: offset %" PRIu64 " is neither in the log (offsets %" PRIu64
			"..%" PRIu64 ") nor in the archive (%" PRIu64 "..%" PRIu64 ")",
			r->shard, r->next, live.first_offset, live.next_offset, arch.first_offset,
			arch.next_offset);
}

int cdc_reader_open(cdc_log *log, const char *shard, uint64_t after_ts, cdc_reader **out,
		    char *err, size_t errlen)
{
	cdc_reader *r = sdb_calloc(1, sizeof *r);
	cdc_range live, arch;
	int rc;
	r->log = log;
	r->shard = sdb_strdup(shard);
	r->last_ts = after_ts;
	r->archive = cdc_log_archive(log);
	if (r->archive)
		r->view = cdc_archive_view_open(r->archive, shard);
	rc = ranges(r, &live, &arch, err, errlen);
	if (rc)
		goto fail;
	int from_archive = arch.next_offset > arch.first_offset && after_ts < arch.last_ts;
	const cdc_range *src = from_archive ? &arch : &live;
	const cdc_range *other = from_archive ? &live : &arch;
	if (from_archive)
		rc = cdc_archive_locate(r->archive, shard, r->view, after_ts, &r->next, err, errlen);
	else
		rc = cdc_log_locate(log, shard, after_ts, &r->next, err, errlen);
	/* the ranges again: the archive's retention (another coordinator) may have deleted
	 * segments while we located, and the check below must see the archive's first offset
	 * as it is now, or a position that exists nowhere would be skipped silently */
	if (rc == 0 && r->archive)
		rc = ranges(r, &live, &arch, err, errlen);
	if (rc)
		goto fail;
	/* Starting at the oldest event a source has is only safe if the event before it is
	 * somewhere (then its ts <= after_ts) or if the log really began there (offset 0).
	 * And the source's retention may have passed the position while we located it: then
	 * it exists nowhere unless the other source has it. */
	bool passed = r->next < src->first_offset && !covers(other, r->next);
	if (passed ||
	    (r->next == src->first_offset && r->next > 0 && !covers(other, r->next - 1))) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
			      "cdc %s: position %u:%u exists nowhere: the oldest event kept is "
			      "offset %" PRIu64 " (ts %u:%u) in the %s; older events were dropped "
			      "by retention%s",
			      shard, (unsigned)(after_ts >> 32), (unsigned)after_ts, src->first_offset,
			      (unsigned)(src->first_ts >> 32), (unsigned)src->first_ts,
			      from_archive ? "archive" : "log",
			      r->archive ? " and are not in the archive" : " with no archive");
		goto fail;
	}
	*out = r;
	return 0;
fail:
	cdc_reader_close(r);
	return rc;
}

int cdc_reader_next(cdc_reader *r, cdc_event *ev, int timeout_ms, char *err, size_t errlen)
{
	int resolves = 0;
	for (;;) {
		int rc;
		if (r->live == NULL && r->arch == NULL) {
			if (resolves++ > 2)
				return 0;
			rc = resolve(r, err, errlen);
			if (rc)
				return rc;
		}
		if (r->arch) {
			rc = cdc_segread_next(r->arch, ev, err, errlen);
			if (rc == 0) { /* end of the archive: on to the live log */
				drop_sources(r);
				continue;
			}
			if (rc == 1)
				r->archived++;
		} else {
			rc = r->log->be->src_next(r->live, ev, timeout_ms, err, errlen);
			if (rc == SDB_ENOTFOUND) {
				drop_sources(r);
				continue;
			}
			if (rc == 0) {
				/* aged out under us while we lagged? then the archive has it */
				cdc_range live;
				char e2[128];
				if (cdc_log_range(r->log, r->shard, &live, e2, sizeof e2) == 0 &&
				    r->next < live.first_offset) {
					drop_sources(r);
					continue;
				}
				return 0;
			}
		}
		if (rc < 0)
			return rc;
		r->next = ev->offset + 1;
		if (ev->ts <= r->last_ts)
			continue; /* duplicate of an event already delivered */
		r->last_ts = ev->ts;
		return 1;
	}
}

uint64_t cdc_reader_position(const cdc_reader *r)
{
	return r->last_ts;
}

uint64_t cdc_reader_archived_events(const cdc_reader *r)
{
	return r->archived;
}

void cdc_reader_close(cdc_reader *r)
{
	if (r == NULL)
		return;
	drop_sources(r);
	free(r->shard);
	if (r->archive)
		cdc_archive_view_close(r->archive, r->view);
	free(r);
}
