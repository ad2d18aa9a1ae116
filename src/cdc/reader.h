/* The CDC consumer API: read one shard's events from a position, through the archive and
 * then the live log, without a gap (DESIGN.md §7; the Data Movement Platform's async
 * replication reads here, never from the source shard).
 *
 *   cdc_reader *r;
 *   rc = cdc_reader_open(log, "shard-a", checkpoint_ts, &r, err, sizeof err);
 *   while ((rc = cdc_reader_next(r, &ev, 1000, err, sizeof err)) >= 0)
 *           if (rc == 1) apply(ev.data, ev.len), checkpoint_ts = ev.ts;
 *
 * Positions are oplog ts (secs << 32 | inc): open returns the events with ts > after_ts
 * (0 = the whole log). Events come in log order with strictly increasing ts: a duplicate
 * (same or older ts, e.g. a Kafka produce retried by a publisher that took over) is
 * dropped here, so a consumer that checkpoints the last ts it applied sees every oplog
 * entry exactly once. Not thread-safe: one reader per thread.
 */
#ifndef SDB_CDC_READER_H
#define SDB_CDC_READER_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"

typedef struct cdc_reader cdc_reader;

/* Open a reader of shard after after_ts. Errors: SDB_ENOTFOUND when the position exists
 * nowhere: events after it were dropped from the log and are not in the archive (the
 * message names the oldest position still available); SDB_EIO, SDB_EUNAVAILABLE. */
int cdc_reader_open(cdc_log *log, const char *shard, uint64_t after_ts, cdc_reader **out,
		    char *err, size_t errlen);

/* Next event: 1 with *ev filled (data valid until the next call), 0 when none arrived
 * within timeout_ms (the reader stays usable). Errors: SDB_ENOTFOUND when the next
 * offset vanished from both the log and the archive (a gap: never skipped silently),
 * SDB_ECORRUPT, SDB_EIO, SDB_EUNAVAILABLE. */
int cdc_reader_next(cdc_reader *r, cdc_event *ev, int timeout_ms, char *err, size_t errlen);

/* Ts of the last event returned (after_ts before the first). */
uint64_t cdc_reader_position(const cdc_reader *r);
/* Events read from the archive so far (observability, tests). */
uint64_t cdc_reader_archived_events(const cdc_reader *r);

void cdc_reader_close(cdc_reader *r);

#endif
