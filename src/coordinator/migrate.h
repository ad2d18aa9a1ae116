/* The Data Movement Platform: online migration of one chunk between shards (DESIGN.md §6,
 * issue #8), run by coordinators.
 *
 * A migration is a record in metadata (registerMigration / updateMigration / getMigration,
 * src/metadata/README.md) with a state, a spec (what to move), a checkpoint (how far it got)
 * and stats (what it measured). Coordinators hold no state of their own: a coordinator
 * drives a migration only while it holds the metadata lease `mig/<id>`, and every state
 * change is a compare-and-set on the state (updateMigration expectState), so a migration is
 * resumed by any coordinator after a crash, from the last state and checkpoint.
 *
 * States and the allowed transitions (migrate_transition_ok, raft/migstate.c: checked
 * by the coordinator before every update and by the metadata state machine at apply):
 *
 *   registered -> importing -> replicating -> verifying -> switching -> switched
 *        |            |            |   ^         |   |         |  ^          |   \
 *        v            v            v   '---------'   |         |  |          v    v
 *     aborted      aborted      aborted   (retry)   aborted    |  '-- rolling_back
 *                                                              |  (pause   |
 *                          switching -> replicating (pause      |  bound)  v
 *                          bound exceeded: retry later)         |       rolled_back
 *                                                     switched -> cleaning -> complete
 *
 *   registered   recorded; the runner waits for the concurrency budget and for any older
 *                migration of an overlapping range of the same collection to finish.
 *   importing    indexes copied to the target; the chunk's documents on the target are
 *                cleared (a restarted import starts clean), then a point-in-time snapshot
 *                of the chunk on the source at oplog position T (stripedbSnapshot
 *                atOplogTs, keyRange: the shard reads only the chunk) is loaded
 *                into the target in the order of the shard-key index, in batches, every
 *                write tagged $stripedbOrigin: <id>. Checkpoint: {ts: T}.
 *   replicating  the source's CDC events after ts (src/cdc/reader.h) for the chunk are
 *                applied to the target idempotently (i/u -> replace with upsert by _id,
 *                d -> delete by _id when the target's document is in the chunk), tagged;
 *                events tagged with this migration's id are skipped. Session records
 *                travel too (issue #16, migrate_sess.h): an event of a retryable write
 *                carries lsid/txnNumber/stmtId/stmtResult and its replay on the target
 *                writes the record in the same transaction; the replicator starts
 *                spec.sessionHistoryMS before T, and for the events up to T (documents
 *                already imported) writes only the records of the chunk's statements.
 *                The position is checkpointed at most every second. Keeps retrying while the target is
 *                down. When an empty poll shows it caught up -> verifying.
 *   verifying    the source's content at a position P; the replicator applies up to P
 *                exactly; the target is read; both sides are compared as (_id, XXH64 of
 *                the document's bytes) in _id order (MongoDB's order, common/bsonval.h):
 *                missing, extra and different _ids are listed in stats.verify. A
 *                difference -> aborted with the reason; equal -> switching. The source's
 *                side (issue #17, migrate_verify.c): the (_id, hash) list the import kept
 *                in memory (snapshot at T), with every _id that the source shard's own
 *                oplog (local.oplog.rs, not the CDC log) shows written in the namespace in
 *                (T, head] replaced by its state read from a snapshot of the source by _id
 *                (P = that snapshot's position; an _id written between head and P takes
 *                its last oplog entry's post-image): the chunk is not read again. The
 *                whole chunk is read from a snapshot at P instead (mode "full")
 *                after a coordinator restart (the list is gone), past 4M
 *                documents, when the oplog was trimmed past T, on a command entry of the
 *                database in the oplog, or when as many _ids changed as were imported.
 *                stats.verifySource: {mode, oplogEntries, changed, read, postImages}.
 *   switching    only when caught up: the source's token of the chunk is bumped
 *                (stripedbSetVersion N -> N+1: from then on the source refuses every
 *                request with token N), the source's oplog head P after the bump is read,
 *                the replicator applies up to P, then metadata routes the chunk to the
 *                target with token N+1 (setChunkShard expectToken N). The pause (bump to
 *                routing commit) is measured (stats.pauses). When the catch-up does not
 *                finish within spec.maxPauseMS (default 2000), the bump is "rolled back":
 *                tokens only move forward on shards, so metadata routes the chunk to the
 *                SOURCE with token N+1 (proxies learn it through StaleConfig + refresh, and
 *                their retries succeed on the source); the migration returns to
 *                replicating and retries (aborted after spec.maxSwitchAttempts, default 5).
 *                Before the routing update the target's oplog head is saved as revTs.
 *   switched     reverse replication target -> source from revTs (skipping this
 *                migration's tagged writes: no loop) keeps the source current for a
 *                rollback, for spec.graceMS (default 5000; restarted after a coordinator
 *                crash) -> cleaning. `stripedb ctl migration rollback ID` moves it to
 *                rolling_back.
 *   rolling_back the same switch in the other direction: bump on the target, reverse
 *                replication up to the target's head, route to the source
 *                -> rolled_back (then the target's copy is deleted); on timeout routing
 *                stays on the target with the newer token and the state returns to
 *                switched.
 *   cleaning     the chunk's documents are deleted from the source by key range (the
 *                shard's shard-key index, the hashed index {k: "hashed"} for a hashed
 *                key; a hashed key on a source without that index: by _id after one
 *                read of the chunk) in batches of spec.deleteBatch (default 500),
 *                spec.deleteDelayMS (default 5) apart.
 *   complete, aborted, rolled_back: terminal. An aborted migration's target copy is
 *                deleted unless routing points at the target.
 *
 * Record (metadata migrations table):
 *   spec        {ns, chunk (int64 id), from, to, maxPauseMS 2000, graceMS 5000,
 *                importOrder "id"|"index"|"arrival" (default "id": the snapshot sorted by
 *                _id, the target's clustering key: the embedded store keeps a collection
 *                in a SQLite WITHOUT ROWID table keyed by the encoded _id, so _id order
 *                appends to that B-tree while the shard key's order scatters the inserts
 *                over it (medians measured 1.6x arrival, 1.8x index on 80,000 docs,
 *                tests/bench/README.md); "index" sorts by the shard key (_id for hashed
 *                keys), which helps where documents are appended by a RecordId and the
 *                secondary index is the scattered B-tree, as on MongoDB's WiredTiger;
 *                "arrival" takes the source's order, the chunk's shard-key index scan;
 *                the source sorts by _id in memory, and a chunk over its 100 MB
 *                blocking-sort limit (code 292) is imported in arrival order instead;
 *                so is the next attempt of an import whose sort took over half the
 *                lease before its first batch, as a lease lost inside that one call
 *                would otherwise restart the import forever),
 *                deleteBatch 500, deleteDelayMS 5,
 *                maxSwitchAttempts 5, maxCatchUpMS 600000 (replicating/switching without
 *                catching up this long -> aborted), applyRate 0 (events/s cap of the
 *                replicator: the throttle), importLatencyMS 50 (a snapshot getMore slower
 *                than this means the source is busy: the import backs off as long),
 *                sessionHistoryMS 1860000 (how far before the import's snapshot the
 *                session records of retryable writes are read from the CDC log; 0 =
 *                none: every session live on the source is marked incomplete on the
 *                target, as when the log's retention no longer reaches that far)}
 *   checkpoint  {ts (forward position), importTs (T), revTs (reverse position), bumpTs
 *                (the source's oplog head right after the bump: no client write of the
 *                chunk may follow it there), token, attempts, targetCleaned, key, min, max,
 *                hashed (the chunk's range, fixed at registration)}
 *   stats       {imported, importBytes, importMS, importThrottledMS, applied, skipped, reverseApplied,
 *                deleted, lagMS, caughtUp, paused, switchAttempts, pausesMS [..], pauseMS,
 *                verify {count, missing, extra, different}, verifySource {mode
 *                "imported"|"full", oplogEntries, changed, read, postImages}, error}
 *
 * Pause/resume: replication (and so verification and the switch) waits while the lease
 * mig-pause/<id> is held (`stripedb ctl migration pause|resume ID`).
 *
 * Fencing: a worker stops as soon as renewing mig/<id> fails (or metadata is unreachable
 * for 4/5 of the ttl); every state change is a compare-and-set on the state and the
 * routing change a compare-and-set on the chunk's token, so a worker that lost its lease
 * late cannot move a migration backwards or route a chunk twice.
 *
 * Fault injection (tests only): STRIPEDB_MIGRATION_CRASH="after:importing,mid:switch,..."
 * makes the coordinator process _exit(86) at those points (before:STATE, after:STATE,
 * mid:import|replicate|verify|switch|clean).
 *
 * Concurrency budgets: a registered migration starts only while fewer than the global
 * budget (--migration-budget, default 8) migrations are active fleet-wide and fewer than
 * the per-shard budget (--migration-shard-budget, default 2) touch each of its shards.
 */
#ifndef SDB_COORDINATOR_MIGRATE_H
#define SDB_COORDINATOR_MIGRATE_H

#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"
#include "raft/migstate.h"

/* mig_state, its names and the transition table: raft/migstate.h (one table, shared
 * with the metadata state machine, which checks it at apply, and with ctl). */

/* Percentile p (0..100) of n values (sorted in place, nearest-rank). 0 when n == 0. */
int64_t migrate_percentile(int64_t *v, size_t n, double p);

/* The runner: the part of a coordinator that drives migrations. */
typedef struct migrate_runner migrate_runner;

/* Create a runner. log: the coordinator's CDC log (borrowed, must outlive the runner);
 * meta_uri: a libmongoc URI of the metadata replica set (copied); holder: this
 * coordinator's lease holder name (copied); lease_ms: TTL of the mig/<id> leases;
 * budget_global / budget_shard: the concurrency budgets (>= 1; smaller values become 1).
 * Never fails (aborts on OOM). */
migrate_runner *migrate_runner_new(cdc_log *log, const char *meta_uri, const char *holder,
				   int64_t lease_ms, int budget_global, int budget_shard);
/* One scheduling round, on the coordinator's manager thread with its metadata client c:
 * list migrations, take the leases of runnable ones within the budgets and start a worker
 * thread for each; join workers that ended. Never blocks on a migration's work. */
void migrate_runner_tick(migrate_runner *r, mongoc_client_t *c);
/* Stop every worker (they stop at the next batch boundary; state and checkpoint stay in
 * metadata), join them, release their leases through c, free the runner. r may be NULL. */
void migrate_runner_free(migrate_runner *r, mongoc_client_t *c);
/* Returns: the number of workers running now (tests, /metrics), never an error. */
int migrate_runner_running(migrate_runner *r);

#endif
