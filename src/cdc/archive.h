/* The CDC archive: closed segments of every shard's log kept in object storage after the
 * log's retention drops them (DESIGN.md §7). Backend `file:DIR` (a directory, e.g. a
 * mounted bucket); the layout is the segment directory of segdir.h under DIR/<shard>/, so
 * archived events are read with the same code as the live embedded log.
 */
#ifndef SDB_CDC_ARCHIVE_H
#define SDB_CDC_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"

/* Open "file:DIR" (DIR created when missing). Errors: SDB_EINVAL (other scheme),
 * SDB_EIO. Free with cdc_archive_close. */
int cdc_archive_open(const char *spec, cdc_archive **out, char *err, size_t errlen);
void cdc_archive_close(cdc_archive *a);

/* Directory holding shard's archived segments (heap string, caller frees). */
char *cdc_archive_dir(const cdc_archive *a, const char *shard);

/* Copy the closed segment first_offset of live_dir into the archive, durably, before the
 * caller deletes it. Idempotent. Errors: SDB_EIO. */
int cdc_archive_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen);

/* Offsets and ts the archive holds for shard (all 0 when nothing). Errors: SDB_EIO. */
int cdc_archive_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen);

/* The archiver of a Kafka-backed log: copies the shard's topic, in offset order, into the
 * archive's segment directory as it grows (Kafka offsets kept, so the reader moves between
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
