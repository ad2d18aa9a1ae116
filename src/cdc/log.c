/* The CDC log front: parses the spec, picks the backend, keeps writer state. See log.h. */
#include "cdc/log.h"

#include <stdlib.h>
#include <string.h>

#include "cdc/archive.h"
#include "common/alloc.h"
#include "common/err.h"

struct cdc_writer {
	cdc_log *log;
	void *impl;
	uint64_t next_offset;
	uint64_t last_ts;
};

int cdc_fsync_parse(const char *s, cdc_fsync_policy *out)
{
	if (s == NULL || strcmp(s, "batch") == 0)
		*out = CDC_FSYNC_BATCH;
	else if (strcmp(s, "segment") == 0)
		*out = CDC_FSYNC_SEGMENT;
	else if (strcmp(s, "never") == 0)
		*out = CDC_FSYNC_NEVER;
	else
		return SDB_EINVAL;
	return 0;
}

int cdc_log_open(const char *spec, const cdc_log_opts *opts, cdc_log **out, char *err,
		 size_t errlen)
{
	const cdc_backend *be;
	const char *arg;
	cdc_log *log;
	int rc;

	if (spec == NULL)
		spec = "";
	if (strncmp(spec, "embedded:", 9) == 0) {
		be = &cdc_backend_embedded;
		arg = spec + 9;
	} else if (strncmp(spec, "kafka:", 6) == 0) {
		be = &cdc_backend_kafka;
		arg = spec + 6;
	} else {
		return sdb_errf(err, errlen, SDB_EINVAL,
				"cdc log '%s': expected embedded:DIR or kafka:BOOTSTRAP", spec);
	}
	log = sdb_calloc(1, sizeof *log);
	log->be = be;
	if (opts)
		log->opts = *opts;
	if (opts && opts->archive && opts->archive[0]) {
		log->archive_spec = sdb_strdup(opts->archive);
		rc = cdc_archive_open(log->archive_spec, opts, &log->archive, err, errlen);
		if (rc)
			goto fail;
	}
	log->opts.archive = log->archive_spec;
	log->opts.s3_endpoint = log->opts.s3_region = log->opts.s3_credentials_file = NULL;
	rc = be->open(log, arg, err, errlen);
	if (rc)
		goto fail;
	*out = log;
	return 0;
fail:
	cdc_archive_close(log->archive);
	free(log->archive_spec);
	free(log);
	return rc;
}

void cdc_log_close(cdc_log *log)
{
	if (log == NULL)
		return;
	log->be->close(log);
	cdc_archive_close(log->archive);
	free(log->archive_spec);
	free(log);
}

const char *cdc_log_backend(const cdc_log *log)
{
	return log->be->name;
}

cdc_archive *cdc_log_archive(cdc_log *log)
{
	return log->archive;
}

int cdc_log_writer_open(cdc_log *log, const char *shard, cdc_writer **out, char *err,
			size_t errlen)
{
	cdc_writer *w = sdb_calloc(1, sizeof *w);
	int rc = log->be->writer_open(log, shard, &w->impl, &w->next_offset, &w->last_ts, err,
				      errlen);
	if (rc) {
		free(w);
		return rc;
	}
	w->log = log;
	*out = w;
	return 0;
}

uint64_t cdc_writer_last_ts(const cdc_writer *w)
{
	return w->last_ts;
}

uint64_t cdc_writer_next_offset(const cdc_writer *w)
{
	return w->next_offset;
}

int cdc_writer_append(cdc_writer *w, uint64_t ts, const uint8_t *data, size_t len, char *err,
		      size_t errlen)
{
	int rc;
	if (ts <= w->last_ts)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"event ts %u:%u is not after the published position %u:%u",
				(unsigned)(ts >> 32), (unsigned)ts, (unsigned)(w->last_ts >> 32),
				(unsigned)w->last_ts);
	if (len > CDC_MAX_EVENT)
		return sdb_errf(err, errlen, SDB_ETOOBIG, "event of %zu bytes (max %d)", len,
				CDC_MAX_EVENT);
	rc = w->log->be->append(w->impl, w->next_offset, ts, data, len, err, errlen);
	if (rc)
		return rc;
	w->next_offset++;
	w->last_ts = ts;
	return 0;
}

int cdc_writer_flush(cdc_writer *w, char *err, size_t errlen)
{
	return w->log->be->flush(w->impl, err, errlen);
}

void cdc_writer_close(cdc_writer *w)
{
	if (w == NULL)
		return;
	w->log->be->writer_close(w->impl);
	free(w);
}

int cdc_log_range(cdc_log *log, const char *shard, cdc_range *out, char *err, size_t errlen)
{
	return log->be->range(log, shard, out, err, errlen);
}

int cdc_log_locate(cdc_log *log, const char *shard, uint64_t after_ts, uint64_t *offset,
		   char *err, size_t errlen)
{
	return log->be->locate(log, shard, after_ts, offset, err, errlen);
}
