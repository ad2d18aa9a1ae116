/* The import throttle (issue #17; issue #22 for backups): the one rule by which a bulk
 * reader of a shard's point-in-time read (stripedbSnapshot and its getMores) bounds its
 * impact on the source. A batch that took longer than the latency limit means the source
 * is busy, so the reader backs off for as long as the batch took. Used by the chunk
 * migration's import (coordinator/migrate_shard.c, importLatencyMS) and by backups
 * (cdc/backup.c, `ctl backup create --import-latency-ms`). Default limit:
 * SDB_IMPORT_LATENCY_MS. */
#ifndef SDB_COMMON_THROTTLE_H
#define SDB_COMMON_THROTTLE_H

#include <stdint.h>

/* The default latency limit in ms of the migration import and of backups. */
#define SDB_IMPORT_LATENCY_MS 50

/* How long to back off, in ms, after a read of the source that took took_us microseconds
 * (monotonic clock), with a latency limit of limit_ms milliseconds: took_us / 1000 when
 * limit_ms > 0 and took_us > limit_ms * 1000, else 0 (limit_ms <= 0 disables the throttle).
 * The caller sleeps that long (interruptibly if it can be stopped) and adds it to its
 * throttled time. Pure; thread-safe. No errors. */
int64_t sdb_import_backoff_ms(int64_t took_us, int64_t limit_ms);

#endif
