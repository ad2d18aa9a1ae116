/* The CDC log: every shard's oplog entries, in oplog order, behind one interface with two
 * backends (DESIGN.md §7, issue #7).
 *
 *   embedded:DIR     append-only segment files on local disk (embedded.c, format in segdir.h)
 *   kafka:BOOTSTRAP  one Kafka topic per shard, one partition (kafka.c)
 *
 * An event is one oplog entry of local.oplog.rs, stored byte-for-byte as the shard returned
 * it ({ts, t, v, op, ns, ui, o, o2, wall, origin}): BSON types, field order and size (up to
 * CDC_MAX_EVENT) are kept exactly. Each event has an offset in its shard's log (0, 1, 2, ...:
 * the Kafka offset, or the embedded log's record number) and the oplog ts
 * (Timestamp packed secs << 32 | inc, as storage/store.h sdb_store_ts_pack).
 *
 * Positions: consumers name a position by oplog ts ("everything after ts X"; 0 = from the
 * beginning); ts are strictly increasing along a shard's log after dedupe, so a consumer
 * that remembers the last ts it applied resumes exactly there (reader.h).
 *
 * Checkpoint of the publisher: the log itself. The published position of a shard is the ts
 * of the last event in its log (cdc_writer_last_ts after cdc_log_writer_open), so a
 * publisher that restarts, or another coordinator that takes over, resumes the oplog with
 * {ts: {$gt: last}}: nothing is skipped; an event appended twice (Kafka: a produce that
 * was delivered although its publisher died before learning it) has the ts of its first
 * copy and is dropped by every reader (reader.c dedupes on ts).
 *
 * Threading: a cdc_log may be shared by threads; a writer or a source is used by one
 * thread at a time.
 */
#ifndef SDB_CDC_LOG_H
#define SDB_CDC_LOG_H

#include <stddef.h>
#include <stdint.h>

/* Largest event accepted: a 16 MiB document (WIRE_MAX_BSON_SIZE) plus the oplog entry's
 * own fields. Anything longer read from disk or Kafka is SDB_ECORRUPT. */
#define CDC_MAX_EVENT (16 * 1024 * 1024 + 64 * 1024)

/* Kafka topic of a shard: CDC_TOPIC_PREFIX + shard id ("stripedb.cdc.shard-a"). */
#define CDC_TOPIC_PREFIX "stripedb.cdc."

typedef struct cdc_event {
	uint64_t offset;     /* position in the shard's log */
	uint64_t ts;         /* oplog ts, secs << 32 | inc */
	const uint8_t *data; /* the oplog entry (BSON), owned by the source; valid until the
				next call on it */
	size_t len;          /* bytes */
} cdc_event;

/* When the embedded log calls fsync (cdc-fsync option). */
typedef enum {
	CDC_FSYNC_BATCH = 0, /* at every cdc_writer_flush (the publisher flushes per batch) */
	CDC_FSYNC_SEGMENT,   /* when a segment is closed only */
	CDC_FSYNC_NEVER,     /* leave it to the kernel */
} cdc_fsync_policy;

typedef struct cdc_log_opts {
	cdc_fsync_policy fsync;
	uint64_t segment_bytes;   /* embedded: start a new segment beyond this size (bytes) */
	uint64_t retention_bytes; /* embedded: keep at most this many bytes of closed segments
				     on disk; older ones go to the archive, then are deleted
				     (0 = keep everything) */
	const char *archive;      /* "file:DIR", "s3://BUCKET[/PREFIX]" or NULL (copied) */
	/* s3 archive only (archive.h), used while cdc_log_open runs (not kept): */
	const char *s3_endpoint;         /* http(s)://HOST[:PORT] */
	const char *s3_region;           /* signing region, NULL: us-east-1 */
	const char *s3_credentials_file; /* NULL: AWS_* environment variables */
} cdc_log_opts;

typedef struct cdc_log cdc_log;
typedef struct cdc_writer cdc_writer;
typedef struct cdc_archive cdc_archive;

/* Parse "fsync" option text ("batch", "segment", "never"). Errors: SDB_EINVAL (anything
 * else; no message). */
int cdc_fsync_parse(const char *s, cdc_fsync_policy *out);

/* Open the log named by spec ("embedded:DIR" or "kafka:HOST:PORT,..."). Embedded creates
 * DIR when missing. Kafka connects lazily (errors show on the first writer or read).
 * Free with cdc_log_close. Errors: SDB_EINVAL (bad spec), SDB_EIO (DIR not creatable,
 * archive not usable). */
int cdc_log_open(const char *spec, const cdc_log_opts *opts, cdc_log **out, char *err,
		 size_t errlen);
void cdc_log_close(cdc_log *log);
/* "embedded" or "kafka". */
const char *cdc_log_backend(const cdc_log *log);
/* The archive configured with the log, or NULL. Owned by the log. */
cdc_archive *cdc_log_archive(cdc_log *log);

/* Open the append side of shard's log. Only one writer per shard may exist: the embedded
 * log takes an exclusive flock on DIR/SHARD/LOCK (released by the kernel when a process
 * dies, so kill -9 never leaves it stuck); Kafka relies on the cdc/<shard> lease and its
 * idempotent producer. The embedded writer recovers the log first: a torn record at the
 * tail (a crash mid-append) is cut and the index rebuilt. Errors: SDB_EBUSY (another
 * writer holds the lock), SDB_EIO, SDB_ECORRUPT (a damaged record that is not at the
 * tail), SDB_EUNAVAILABLE (Kafka unreachable). */
int cdc_log_writer_open(cdc_log *log, const char *shard, cdc_writer **out, char *err,
			size_t errlen);
/* Ts of the last event in the log (0 when empty): the published position, i.e. the
 * checkpoint. Offset the next append gets. */
uint64_t cdc_writer_last_ts(const cdc_writer *w);
uint64_t cdc_writer_next_offset(const cdc_writer *w);
/* Append one event. ts must be greater than cdc_writer_last_ts (else SDB_EINVAL: the
 * caller is replaying). len <= CDC_MAX_EVENT (else SDB_ETOOBIG). The event may be
 * buffered until cdc_writer_flush. Errors: SDB_EIO, SDB_EUNAVAILABLE. */
int cdc_writer_append(cdc_writer *w, uint64_t ts, const uint8_t *data, size_t len, char *err,
		      size_t errlen);
/* Make every appended event durable (fsync policy / Kafka delivery acknowledged by the
 * broker, all in-sync replicas). Blocks up to 30 s. After it returns 0 the events are
 * visible to readers. Errors: SDB_EIO, SDB_ETIMEOUT, SDB_EUNAVAILABLE. */
int cdc_writer_flush(cdc_writer *w, char *err, size_t errlen);
/* Flush what can be flushed and release the writer (and the lock). */
void cdc_writer_close(cdc_writer *w);

/* The live log's range for shard: offsets [first, next) and the ts of the first and last
 * event there (0 when empty). A shard never written has all four 0. Errors: SDB_EIO,
 * SDB_EUNAVAILABLE. */
typedef struct cdc_range {
	uint64_t first_offset, next_offset;
	uint64_t first_ts, last_ts;
} cdc_range;
/* cdc_log_range: the range above into *out. Errors: SDB_EIO, SDB_EUNAVAILABLE (Kafka). */
int cdc_log_range(cdc_log *log, const char *shard, cdc_range *out, char *err, size_t errlen);

/* ---- backend interface (implemented by embedded.c and kafka.c; used by log.c parts of
 * embedded.c, reader.c and the publisher through the functions above) ---- */

/* A source reads one shard's live log sequentially from an offset. next returns 1 with
 * *ev filled, 0 when no event is there yet (after waiting up to timeout_ms), or an
 * SDB_E* code. SDB_ENOTFOUND from open or next: the offset is not in the live log (aged
 * out): the reader then goes to the archive. */
typedef struct cdc_backend {
	const char *name;
	int (*open)(cdc_log *log, const char *arg, char *err, size_t errlen);
	void (*close)(cdc_log *log);
	int (*writer_open)(cdc_log *log, const char *shard, void **w, uint64_t *next_offset,
			   uint64_t *last_ts, char *err, size_t errlen);
	int (*append)(void *w, uint64_t offset, uint64_t ts, const uint8_t *data, size_t len,
		      char *err, size_t errlen);
	int (*flush)(void *w, char *err, size_t errlen);
	void (*writer_close)(void *w);
	int (*range)(cdc_log *log, const char *shard, cdc_range *out, char *err, size_t errlen);
	/* First offset in the live log whose event has ts > after_ts (next_offset if none). */
	int (*locate)(cdc_log *log, const char *shard, uint64_t after_ts, uint64_t *offset,
		      char *err, size_t errlen);
	int (*src_open)(cdc_log *log, const char *shard, uint64_t offset, void **src, char *err,
			size_t errlen);
	int (*src_next)(void *src, cdc_event *ev, int timeout_ms, char *err, size_t errlen);
	void (*src_close)(void *src);
} cdc_backend;

struct cdc_log {
	const cdc_backend *be;
	cdc_log_opts opts;   /* archive string copied into archive_spec */
	char *archive_spec;
	cdc_archive *archive; /* NULL without --archive */
	void *impl;
};

extern const cdc_backend cdc_backend_embedded;
extern const cdc_backend cdc_backend_kafka;

/* Backend helpers reached through the log (thin wrappers over cdc_backend). Errors: the
 * backend's; locate as cdc_log_range (embedded SDB_EIO; Kafka SDB_EUNAVAILABLE and its
 * reader's errors). */
int cdc_log_locate(cdc_log *log, const char *shard, uint64_t after_ts, uint64_t *offset,
		   char *err, size_t errlen);

#endif
