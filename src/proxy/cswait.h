/* Parked change-stream getMores (issue #20): a change stream's getMore that found nothing
 * to return is parked here instead of holding a request worker and pooled shard
 * connections for its await, as mongos does not tie a thread to a waiting stream
 * (src/mongo/s/query/cluster_find.cpp awaits the AsyncResultsMerger's event, not a thread;
 * the shard side does the same: src/shard/changestream.c, shard_await_park).
 *
 * While parked, the client's request is unanswered (its connection waits, as for any
 * command in flight), its proxy cursor is checked in, and nothing else is held but one
 * small entry. The entry is handed back to a request worker (the getMore runs again, see
 * px_exec_resume) when:
 *   - a shard has new oplog entries: one watcher per shard per proxy (a deployment-wide
 *     `$changeStream` with `$stripedbMerge`, one awaitData getMore of
 *     PX_CSWAIT_WATCH_AWAIT_MS at a time) sees that shard's postBatchResumeToken move or
 *     an event, or fails (then it may have missed a move); every parked getMore is woken,
 *     as every proxy stream is open on every shard;
 *   - its time is up (px_cswait_park's until_ms: the getMore's await, or a short retry);
 *   - its cursor is killed or its request killOp'ed (px_cswait_wake_req), or the proxy
 *     stops (px_cswait_stop).
 * A woken getMore runs one round of non-blocking shard getMores and parks again when it
 * still has nothing to return (changestream.c px_cs_get_more).
 *
 * Threading: any thread, except as noted. One parker thread handles the deadlines; the
 * watcher thread (started at the first park) runs one fan-out unit per shard.
 */
#ifndef SDB_PROXY_CSWAIT_H
#define SDB_PROXY_CSWAIT_H

#include <stdbool.h>
#include <stdint.h>

#include "wire/server.h"

#define PX_CSWAIT_WATCH_AWAIT_MS 1000 /* the watchers' awaitData getMore */
#define PX_CSWAIT_WATCH_RETRY_MS 200  /* a watcher's pause after a failed call */

struct proxy;
struct proxy_cursor;
typedef struct px_cswait px_cswait;

/* Make the parking table of p and start its parker thread (the watchers start at the first
 * park). Never fails (allocation and thread creation abort). Free with px_cswait_free. */
px_cswait *px_cswait_new(struct proxy *p);
/* Refuse parks from now on and hand every parked getMore back to a worker (it answers
 * with what it has). At the proxy's stop, before the wire server drains. */
void px_cswait_stop(px_cswait *w);
/* Stop and join the parker and watcher threads, then free w (parked entries left, none
 * after px_cswait_stop, are handed back first). Before shardconn_free: the watchers make
 * shard calls. NULL is a no-op. */
void px_cswait_free(px_cswait *w);

/* The wake generation: read it before a round of shard getMores, give it to
 * px_cswait_park, so that a move seen by a watcher during the round is not missed. */
uint64_t px_cswait_gen(px_cswait *w);
/* Park req (a getMore of user, NULL without auth; copied) until a watcher sees a move
 * (after gen), until_ms (monotonic ms) or a wake. cur is the caller's checked-out proxy
 * cursor: it is checked in here, under the table's lock, once the park is certain (so the
 * resumed getMore finds it free, and a killCursors meanwhile can kill it).
 * Returns: 1 when parked (the caller returns without answering: the request belongs to
 * the table and the getMore runs again later); 0 when the generation moved since gen (not
 * parked: run another round, the cursor is still the caller's); -1 when the proxy is
 * stopping (not parked: answer now, the cursor is still the caller's). */
int px_cswait_park(px_cswait *w, wire_req *req, const char *user, uint64_t gen,
		   uint64_t until_ms, struct proxy_cursor *cur);
/* True when shard id's watcher saw it stop answering (its call ran past the await and
 * 10 s without an answer: SIGSTOP, a stalled disk) and it has not answered since. A
 * getMore's round then leaves that shard out (it holds the merge back, as a round that
 * timed out on it), so streams do not each hold a worker for 10 s per round on it; when it
 * answers again every parked getMore is woken. False for NULL w. */
bool px_cswait_stalled(px_cswait *w, const char *id);
/* Hand every parked getMore back to a worker (a shard moved). */
void px_cswait_wake_all(px_cswait *w);
/* Hand the parked getMore req back to a worker, when it is parked (its cursor is being
 * killed). req is only compared, never dereferenced. */
void px_cswait_wake_req(px_cswait *w, const wire_req *req);

#endif
