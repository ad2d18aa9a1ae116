/* Session records that travel with a migrating chunk (issue #16; MongoDB's
 * session_catalog_migration_source/destination): helpers of the replicator (migrate_replicate.c).
 *
 * A shard's oplog entry of a retryable write carries lsid, txnNumber, stmtId and the
 * statement's recorded outcome stmtResult (storage/store.h); the CDC event is that entry.
 * The replicator replays the entry's write on the target with $stripedbSession (the
 * record, written in the replayed statement's savepoint) and sends the records of
 * statements that ran before the import's snapshot with $stripedbSessions (records alone,
 * in the same update command as the data batch). A statement whose outcome or chunk is
 * unknown becomes an "incomplete history" marker for its session's txnNumber: the target
 * then refuses (IncompleteTransactionHistory, 217) a retry of a statement it has no record
 * of, instead of running it a second time (src/shard/retry_mig.c).
 */
#ifndef SDB_COORDINATOR_MIGRATE_SESS_H
#define SDB_COORDINATOR_MIGRATE_SESS_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

/* The session fields of one CDC event (borrowed from the event's bytes). */
typedef struct mig_sess {
	bool on;          /* the event has lsid and txnNumber */
	bool have_result; /* ... and stmtId and stmtResult */
	bson_t lsid;
	int64_t txn;
	int32_t stmt;
	bson_t result;
} mig_sess;

/* Read lsid/txnNumber/stmtId/stmtResult of event e into s (s->on false when the event is
 * not part of a retryable write). s borrows e's bytes. */
void mig_sess_of_event(const bson_t *e, mig_sess *s);
/* Append {$stripedbSession: {lsid, txnNumber, stmtId, result}} to a statement being built
 * (s->have_result required). */
void mig_sess_append_stmt(bson_t *stmt, const mig_sess *s);
/* Append one element (key = its index n) to a $stripedbSessions array: the record, or the
 * session's incomplete-history marker when incomplete (or when s has no result). */
void mig_sess_append_record(bson_t *arr, uint32_t n, const mig_sess *s, bool incomplete);

#endif
