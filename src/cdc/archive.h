/* The CDC archive: closed segments of every shard's log kept in object storage after the
 * log's retention drops them (DESIGN.md §7). Two backends behind one small vtable
 * (cdc_archive_ops):
 *
 *   file:DIR              a directory (e.g. a mounted bucket; laptops): the segment
 *                         directory of segdir.h under DIR/<shard>/ (archive.c)
 *   s3://BUCKET[/PREFIX]  any S3-compatible object store (archive_s3.c, client in s3.h):
 *                         objects PREFIX/<shard>/<first>-<next>-<first ts>-<last ts>.idx and
 *                         .seg (20-digit decimals), each a closed segment's file as is
 *
 * Archived events are read with the segment reader of segdir.h in both cases: an S3
 * segment is downloaded (checksum verified) into a private cache directory of the reader
 * (a "view") before it is read.
 */
#ifndef SDB_CDC_ARCHIVE_H
#define SDB_CDC_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"
#include "cdc/segdir.h"

/* A backend. Every function returns 0 or an SDB_E* code with err filled. */
typedef struct cdc_archive_ops {
	const char *scheme; /* "file" or "s3" */
	void (*close)(cdc_archive *a);
	int (*put)(cdc_archive *a, const char *shard, const char *live_dir,
		   uint64_t first_offset, char *err, size_t errlen);
	int (*range)(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		     size_t errlen);
	char *(*view_open)(cdc_archive *a, const char *shard);
	void (*view_close)(cdc_archive *a, char *view);
	int (*locate)(cdc_archive *a, const char *shard, const char *view, uint64_t after_ts,
		      uint64_t *offset, char *err, size_t errlen);
	int (*read_open)(cdc_archive *a, const char *shard, const char *view, uint64_t offset,
			 cdc_segread **out, char *err, size_t errlen);
	int (*expire)(cdc_archive *a, const char *shard, uint64_t before_ts, size_t *removed,
		      char *err, size_t errlen);
	/* plain objects (backups, see cdc_archive_obj_put) */
	int (*obj_put)(cdc_archive *a, const char *key, const char *path, char *err,
		       size_t errlen);
	int (*obj_get)(cdc_archive *a, const char *key, const char *path, char *err,
		       size_t errlen);
	int (*obj_list)(cdc_archive *a, const char *prefix, char ***keys, size_t *n, char *err,
			size_t errlen);
	int (*obj_delete)(cdc_archive *a, const char *key, char *err, size_t errlen);
} cdc_archive_ops;

struct cdc_archive {
	const cdc_archive_ops *ops;
	char *spec; /* as given, for messages */
	void *impl;
};

/* Open "file:DIR" (DIR created when missing) or "s3://BUCKET[/PREFIX]" (opts->s3_*
 * give the endpoint, region and credentials; the bucket and credentials are checked with
 * one request, retried with backoff; an endpoint still down after the retries is only
 * logged, so that a coordinator starts and publishes while the store is down). Errors:
 * SDB_EINVAL (other scheme, bad spec, no endpoint), SDB_EIO, SDB_EAUTH (credentials
 * missing or refused), SDB_ENOTFOUND (no such bucket), SDB_EPROTO. Free with
 * cdc_archive_close. */
int cdc_archive_open(const char *spec, const cdc_log_opts *opts, cdc_archive **out,
		     char *err, size_t errlen);
void cdc_archive_close(cdc_archive *a);
/* "file" or "s3". */
const char *cdc_archive_scheme(const cdc_archive *a);

/* Directory holding shard's archived segments, file: archives only (heap string, caller
 * frees); NULL for s3. */
char *cdc_archive_dir(const cdc_archive *a, const char *shard);

/* Copy the closed segment first_offset of live_dir into the archive, durably (file:
 * fsync'd; s3: the server confirmed the upload), before the caller deletes it.
 * Idempotent. Errors: SDB_EIO, and for s3 those of cdc_archive_open. */
int cdc_archive_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen);

/* Offsets and ts the archive holds for shard (all 0 when nothing). Errors: SDB_EIO, and
 * for s3 those of cdc_archive_open. */
int cdc_archive_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen);

/* A reader's view of shard's archive: a handle (a string) for locate and read_open;
 * for s3 a private cache directory of downloaded segments, removed by view_close. */
char *cdc_archive_view_open(cdc_archive *a, const char *shard);
void cdc_archive_view_close(cdc_archive *a, char *view);
/* First archived offset with ts > after_ts (the range's next_offset when none). Errors:
 * SDB_EIO (a file archive's segments cannot be read); for s3 also the errors of its S3
 * requests (cdc_s3_list, cdc_s3_get_file in src/cdc/s3.h). */
int cdc_archive_locate(cdc_archive *a, const char *shard, const char *view, uint64_t after_ts,
		       uint64_t *offset, char *err, size_t errlen);
/* Sequential reader of archived events from offset (segdir.h cdc_segread_*; for s3 it
 * ends, returning 0, at the end of the segments downloaded so far: open again at the
 * next offset). Errors: SDB_ENOTFOUND (offset not archived), SDB_ECORRUPT (checksum),
 * SDB_EIO, s3 errors. */
int cdc_archive_read_open(cdc_archive *a, const char *shard, const char *view,
			  uint64_t offset, cdc_segread **out, char *err, size_t errlen);

/* Retention (--archive-retention): delete shard's archived segments from the oldest on,
 * while a segment's last event is older than before_ts (oplog ts, secs << 32 | inc); the
 * archive stays one range (no hole). *removed gets the count. Run by the holder of the
 * shard's cdc/<shard> lease. Errors: SDB_EIO, s3 errors. */
int cdc_archive_expire(cdc_archive *a, const char *shard, uint64_t before_ts, size_t *removed,
		       char *err, size_t errlen);

/* Plain objects next to the segments, for backups (src/cdc/backup.h): key is a relative
 * path of '/'-separated names ("backups/shard-a/20261202T051300.123Z/manifest.json"),
 * stored as DIR/key (file:) or PREFIX/key (s3:). No shard may be named "backups".
 *
 * obj_put: store the file at path as key, durably (file: copied to a temporary name,
 * fsync'd, renamed; s3: uploaded, multipart beyond CDC_S3_PART_BYTES, confirmed by the
 * server, SHA-256 kept as metadata); replaces an existing object. Memory: one buffer.
 * obj_get: copy key into the file path (s3: SHA-256 checked). SDB_ENOTFOUND when absent.
 * obj_list: keys under prefix (relative, sorted; *keys heap array of heap strings, free
 * each then the array). obj_delete: remove key (absent is not an error).
 * Errors: SDB_EIO, SDB_ENOTFOUND, and for s3 those of cdc_archive_open; messages name
 * the operation and the object (for s3 the bucket). */
int cdc_archive_obj_put(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen);
int cdc_archive_obj_get(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen);
int cdc_archive_obj_list(cdc_archive *a, const char *prefix, char ***keys, size_t *n,
			 char *err, size_t errlen);
int cdc_archive_obj_delete(cdc_archive *a, const char *key, char *err, size_t errlen);

/* Parse a retention duration: N, Ns, Nm, Nh or Nd (N a decimal integer; no unit =
 * seconds) into seconds. 0 disables retention. Errors: SDB_EINVAL (no message). */
int cdc_archive_retention_parse(const char *s, uint64_t *seconds);

/* The S3 backend (archive_s3.c): spec "s3://BUCKET[/PREFIX]". An unreachable endpoint is
 * not an error here (the first request shows it). Errors: as cdc_s3_open and cdc_s3_check
 * (SDB_EINVAL, SDB_EAUTH ...), SDB_EIO (the cache directory). */
int cdc_archive_s3_open(const char *spec, const cdc_log_opts *opts, cdc_archive **out,
			char *err, size_t errlen);

/* The archiver of a Kafka-backed log: copies the shard's topic, in offset order, into the
 * archive's segment directory as it grows (an s3:// archive: into a private staging
 * directory starting where the archive ends, whose closed segments are uploaded, then
 * removed locally) (Kafka offsets kept, so the reader moves between
 * archive and broker by offset), so that a consumer can still read a range after the
 * broker's retention dropped it. Run by the shard's publisher, under its lease; the
 * archive dir's flock makes it single-writer. The embedded log needs none (it archives
 * segments before its retention deletes them). */
typedef struct cdc_archiver cdc_archiver;

/* Open the archiver of shard (log's archive must be set). Errors: SDB_EBUSY (another
 * archiver holds the dir), SDB_EIO, SDB_EUNAVAILABLE. */
int cdc_archiver_open(cdc_log *log, const char *shard, cdc_archiver **out, char *err,
		      size_t errlen);
/* Copy up to max events that are in the log and not yet archived, waiting up to
 * timeout_ms for the first one; *copied gets the count. Errors: SDB_ENOTFOUND when the next offset to archive already left the broker (a
 * gap in the archive: reported, never filled with later events), SDB_EIO, SDB_EUNAVAILABLE.
 */
int cdc_archiver_step(cdc_archiver *a, size_t max, int timeout_ms, size_t *copied, char *err,
		      size_t errlen);
/* Next offset to archive. */
uint64_t cdc_archiver_next(const cdc_archiver *a);
void cdc_archiver_close(cdc_archiver *a);

#endif
