/* The CDC publisher of one shard (DESIGN.md §7): tails the shard's local.oplog.rs with a
 * tailable awaitData cursor through libmongoc (raw find/getMore commands, so the entries
 * are copied byte for byte and each getMore batch is flushed as one unit), from the
 * published position (cdc_writer_last_ts: the log is the checkpoint, see log.h), and
 * appends the entries in order to the CDC log.
 *
 * It runs on its own thread (never on an event loop): open the writer (retrying while
 * another writer holds it, e.g. the coordinator that held the lease before is still
 * closing), tail, append, flush per batch; on a shard or log error it logs, waits 200 ms
 * and resumes from the published position. A lease fence: the publisher appends only
 * while the monotonic time is below the deadline its owner sets with
 * cdc_publisher_fence (the lease expiry minus a margin), so a coordinator that cannot renew
 * its lease stops publishing before another one can take over.
 *
 * With the Kafka backend and an archive, the publisher also runs the shard's archiver
 * (archive.h) after each batch: the topic is copied into the archive as it grows.
 *
 * A published position that is no longer in the shard's oplog (the oplog was trimmed past
 * it while no publisher ran) stops the publisher with "oplog history lost" rather than
 * silently skipping what was trimmed (as a change stream's ChangeStreamHistoryLost).
 *
 * Metrics (label shard="ID"): stripedb_cdc_published_ts_seconds, stripedb_cdc_published_offset,
 * stripedb_cdc_events_published_total, stripedb_cdc_lag_seconds, stripedb_cdc_lag_events
 * (capped at CDC_LAG_EVENTS_CAP), stripedb_cdc_publish_errors_total,
 * stripedb_cdc_archived_events_total (Kafka archiver).
 */
#ifndef SDB_CDC_PUBLISHER_H
#define SDB_CDC_PUBLISHER_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"

#define CDC_LAG_EVENTS_CAP 1000

typedef struct cdc_publisher cdc_publisher;

typedef struct cdc_publisher_status {
	int running;           /* the writer is open and tailing */
	uint64_t published_ts; /* ts of the last event in the log (0 = none) */
	uint64_t next_offset;  /* offset the next event gets */
	uint64_t head_ts;      /* newest oplog ts seen on the shard (0 = unknown) */
	int64_t lag_events;    /* oplog entries after published_ts (-1 = unknown) */
	uint64_t events;       /* events appended by this publisher */
	char last_error[256];  /* "" when none */
} cdc_publisher_status;

/* Start publishing shard (reachable at MongoDB URI uri) into log. The thread starts at
 * once; errors (shard down, log busy) are retried in the background and reported in the
 * status. fence_ms: initial monotonic deadline (CLOCK_MONOTONIC ms), 0 = no fence.
 * Free with cdc_publisher_stop. Errors: SDB_EINVAL (bad uri). */
int cdc_publisher_start(cdc_log *log, const char *shard, const char *uri, int64_t fence_ms,
			cdc_publisher **out, char *err, size_t errlen);
/* Move the fence (thread-safe). */
void cdc_publisher_fence(cdc_publisher *p, int64_t fence_ms);
/* Snapshot of the status (thread-safe). */
void cdc_publisher_get_status(cdc_publisher *p, cdc_publisher_status *out);
/* Ask the thread to stop without waiting (thread-safe). cdc_publisher_stopped returns 1
 * once the thread has flushed and closed its writer (else 0); cdc_publisher_stop then
 * returns at once. Returns: (stopped) 1 or 0. */
void cdc_publisher_request_stop(cdc_publisher *p);
int cdc_publisher_stopped(cdc_publisher *p);
/* Ask the thread to stop, wait for it (at most about one awaitData wait, 500 ms), flush
 * and close the writer, free p. */
void cdc_publisher_stop(cdc_publisher *p);

#endif
