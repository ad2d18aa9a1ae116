/* The TTL monitor of a shard (MongoDB's TTLMonitor, ttlMonitorSleepSecs): every
 * --ttl-monitor-sleep-secs (default 60) the primary of a shard replica set deletes, for each
 * TTL index ({key: {F: 1}, expireAfterSeconds: S}), the documents whose F is a date (or an
 * array holding a date) older than now - S. The deletes are ordinary replicated delete
 * commands (`{delete: coll, deletes: [{q: {F: {$lt: cutoff}}, limit: 0}]}`): they reach
 * every member, the oplog and CDC like any other delete. Secondaries never delete on their
 * own. Documents without a date in F never expire (as MongoDB). Loop thread only. */
#ifndef SDB_SHARD_TTL_H
#define SDB_SHARD_TTL_H

#include <stdint.h>

#include "shard/shard.h"

typedef struct shard_ttl shard_ttl;

/* Start the monitor on its own store connection. NULL when interval_s is 0 (disabled) or
 * no connection could be opened (logged). Start after the replica set (sh->repl). */
shard_ttl *shard_ttl_start(shard *sh, int64_t interval_s);
/* Stop it after the replica set has closed (its in-flight deletes are answered by then);
 * cb(arg) on the loop when its handles are closed. t may be NULL. */
void shard_ttl_stop(shard_ttl *t, void (*cb)(void *arg), void *arg);

#endif
