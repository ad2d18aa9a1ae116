/* A directory of CDC segment files: the embedded log's on-disk format, also used by the
 * file: archive (archived segments are copies of closed segments, read the same way).
 *
 * Layout of one shard's directory:
 *   LOCK                          flock'd by the single writer (embedded log only)
 *   <first offset, 20 digits>.seg records, appended
 *   <first offset, 20 digits>.idx one entry per record, derived from .seg (rebuilt on
 *                                 recovery)
 *
 * Record (little endian), CDC_REC_HDR = 32 bytes then the payload:
 *   u32 magic 0x31434443 ("CDC1") | u32 len | u64 offset | u64 ts | u32 xxh32 | u32 0
 *   payload: len bytes, the oplog entry BSON
 * xxh32 (seed 0) covers the first 24 header bytes then the payload. A record is valid
 * when magic, len (<= CDC_MAX_EVENT), offset (the previous one + 1) and the checksum
 * agree. Index entry, 24 bytes: u64 ts | u64 offset | u64 file position of the record.
 *
 * A segment is closed (never written again) once a segment with a larger first offset
 * exists. Readers in other processes read the open segment while it grows: a record that
 * is not complete yet reads as "no event yet".
 */
#ifndef SDB_CDC_SEGDIR_H
#define SDB_CDC_SEGDIR_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"

#define CDC_REC_HDR 32
#define CDC_IDX_ENT 24
#define CDC_REC_MAGIC 0x31434443u

typedef struct cdc_seginfo {
	uint64_t first_offset; /* from the file name */
	uint64_t next_offset;  /* first_offset + records in the index */
	uint64_t first_ts, last_ts; /* 0 when empty */
	uint64_t bytes;        /* .seg size */
} cdc_seginfo;

/* List the segments of dir sorted by first offset into *segs (heap, caller frees; *n may
 * be 0 with *segs NULL). A missing dir is an empty list. Ranges come from the index
 * files. Errors: SDB_EIO. */
int cdc_segdir_list(const char *dir, cdc_seginfo **segs, size_t *n, char *err, size_t errlen);

/* Range of the whole directory (first segment's first offset .. last one's next).
 * Errors: SDB_EIO. */
int cdc_segdir_range(const char *dir, cdc_range *out, char *err, size_t errlen);

/* First offset with ts > after_ts in dir (binary search of the indexes); the range's
 * next_offset when none. Errors: SDB_EIO. */
int cdc_segdir_locate(const char *dir, uint64_t after_ts, uint64_t *offset, char *err,
		      size_t errlen);

/* Sequential reader over dir from offset. Errors: (open) SDB_ENOTFOUND when offset is not
 * inside a segment of dir (nor the next offset of the last one), SDB_EIO. next returns 1
 * (an event), 0 (no more yet); Errors: (next) SDB_ECORRUPT a damaged record in a closed
 * segment, SDB_EIO. */
typedef struct cdc_segread cdc_segread;
int cdc_segread_open(const char *dir, uint64_t offset, cdc_segread **out, char *err,
		     size_t errlen);
int cdc_segread_next(cdc_segread *r, cdc_event *ev, char *err, size_t errlen);
void cdc_segread_close(cdc_segread *r);

/* Writer (one per dir; see cdc_log_writer_open for locking and recovery). An empty dir
 * starts with a segment at first_if_empty (the Kafka archiver starts where the broker's
 * log starts). append sets *rolled when it closed a segment and opened the next.
 * Duplicated ts are accepted (an archive copies a Kafka range as it is). Errors: (open)
 * SDB_EBUSY (another writer holds DIR/LOCK), SDB_EIO; (append) SDB_EINVAL (offset is not
 * the next one), SDB_ETOOBIG (event over CDC_MAX_EVENT), SDB_EIO; (flush) SDB_EIO. */
typedef struct cdc_segwriter cdc_segwriter;
int cdc_segwriter_open(const char *dir, cdc_fsync_policy fsync, uint64_t segment_bytes,
		       uint64_t first_if_empty, cdc_segwriter **out, uint64_t *next_offset,
		       uint64_t *last_ts, char *err, size_t errlen);
int cdc_segwriter_append(cdc_segwriter *w, uint64_t offset, uint64_t ts, const uint8_t *data,
			 size_t len, int *rolled, char *err, size_t errlen);
int cdc_segwriter_flush(cdc_segwriter *w, char *err, size_t errlen);
void cdc_segwriter_close(cdc_segwriter *w);

/* Copy segment first_offset (its .seg and .idx) from src_dir to dst_dir durably (write to
 * a temporary name, fsync, rename, fsync the directory). An existing copy is replaced.
 * Errors: SDB_EIO. */
int cdc_segdir_copy(const char *src_dir, const char *dst_dir, uint64_t first_offset, char *err,
		    size_t errlen);
/* Delete segment first_offset from dir (files already gone are not an error). Errors:
 * SDB_EIO. */
int cdc_segdir_remove(const char *dir, uint64_t first_offset, char *err, size_t errlen);

/* mkdir -p. Errors: SDB_EIO. */
int cdc_mkdirs(const char *path, char *err, size_t errlen);

#endif
