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
 *   - a shard has new oplog entries that concern it: one watcher per shard per proxy (a
 *     deployment-wide `$changeStream` with `$stripedbMerge`, one awaitData getMore of
 *     PX_CSWAIT_WATCH_AWAIT_MS at a time) reports what it saw as a *move*: the shard and the
 *     namespaces of its events (`ns`, and `to` of a rename), or only "its position moved"
 *     (an oplog note, no event), or "anything may have moved" (its call failed, it reopened,
 *     the shard answers again after a stall, the shard list changed, more namespaces than
 *     one move holds). A move wakes the parked getMores it can concern (px_cswait_filter):
 *     a collection stream by an event of its collection or a database-wide one of its
 *     database, a database stream by an event of its database, a deployment stream by any
 *     event; "anything" wakes every parked getMore; a position-only move wakes only those
 *     waiting on a holdout shard's position (parked "pending");
 *   - its time is up (px_cswait_park's until_ms: the getMore's await, or a short retry);
 *   - its cursor is killed, its request killOp'ed, or its client closes the connection
 *     (px_cswait_wake_req; the wire layer reports the close, wire_req_watch_close), or
 *     the proxy stops (px_cswait_stop).
 * Moves are numbered (px_cswait_seq) and the last PX_CSWAIT_RING are kept, so that a stream
 * asks only the shards that moved for it since it last asked each (px_cswait_moved); an
 * older number than the table keeps counts as "moved".
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

/* What a parked getMore's stream watches (changestream.c's levels): the wake filter. */
enum { PX_CSWAIT_COLL, PX_CSWAIT_DB, PX_CSWAIT_CLUSTER };
typedef struct px_cswait_filter {
	int level;	  /* PX_CSWAIT_COLL, _DB or _CLUSTER */
	const char *db;	  /* COLL and DB: the database (borrowed) */
	const char *coll; /* COLL: the collection (borrowed), else NULL */
} px_cswait_filter;

/* One shard a park checks for moves it has not seen: a move of shard id numbered after
 * since that concerns the filter (any = true: any move, a position-only one too; for a
 * holdout shard whose position an event waits for). */
typedef struct px_cswait_check {
	const char *id; /* borrowed */
	uint64_t since;
	bool any;
} px_cswait_check;

#define PX_CSWAIT_RING 4096 /* moves kept for px_cswait_moved */

/* The number of the last move (0 before any): read it before a round of shard getMores
 * and remember it per shard asked, so that a move seen by a watcher during the round is
 * not missed. 0 for NULL w. */
uint64_t px_cswait_seq(px_cswait *w);
/* Returns: true when a move of shard id numbered after since concerns f (f NULL: any move,
 * a position-only one too), or "anything" moved (that shard or every shard) after since,
 * or the moves after since are no longer kept. False for NULL w. */
bool px_cswait_moved(px_cswait *w, const px_cswait_filter *f, const char *id, uint64_t since);
/* Park req (a getMore of user, NULL without auth; copied) until a move concerning f (any
 * move when pending: an event waits for a holdout shard's position), until_ms (monotonic
 * ms) or a wake. checks (n entries) are the shards the caller would ask: when one of them
 * moved for it since its `since` (px_cswait_moved, under the table's lock), it is not
 * parked. cur is the caller's checked-out proxy cursor: it is checked in here, under the
 * table's lock, once the park is certain (so the resumed getMore finds it free, and a
 * killCursors meanwhile can kill it). f's strings are copied.
 * Returns: 1 when parked (the caller returns without answering: the request belongs to
 * the table and the getMore runs again later); 0 when a checked shard moved (not parked:
 * run another round, the cursor is still the caller's); -1 when the proxy is stopping (not
 * parked: answer now, the cursor is still the caller's). A request whose client closed
 * (wire_req_conn_gone) is not parked (0). */
int px_cswait_park(px_cswait *w, wire_req *req, const char *user, const px_cswait_filter *f,
		   bool pending, const px_cswait_check *checks, size_t n, uint64_t until_ms,
		   struct proxy_cursor *cur);
/* True when shard id's watcher saw it stop answering (its call ran past the await and
 * 10 s without an answer: SIGSTOP, a stalled disk) and it has not answered since. A
 * getMore's round then leaves that shard out (it holds the merge back, as a round that
 * timed out on it), so streams do not each hold a worker for 10 s per round on it; when it
 * answers again every parked getMore is woken. False for NULL w. */
bool px_cswait_stalled(px_cswait *w, const char *id);
/* Record that anything may have moved on every shard and hand every parked getMore back to
 * a worker. */
void px_cswait_wake_all(px_cswait *w);
/* Hand the parked getMore req back to a worker, when it is parked (its cursor is being
 * killed, its client closed). req is only compared, never dereferenced. */
void px_cswait_wake_req(px_cswait *w, const wire_req *req);

#endif
