/* Multi-document transactions on one shard (issue #16): MongoDB's transaction protocol as
 * mongod speaks it (lsid, txnNumber, autocommit: false, startTransaction: true on the first
 * statement; commitTransaction / abortTransaction on admin), run by the primary.
 *
 * State lives in the primary's memory (one record per lsid): the transaction's effects so
 * far (insert / replace-by-_id / delete-by-_id with full images), the keys it read or wrote
 * (ns + encoded _id, or a whole namespace: "coarse") and its start sequence (the Raft index
 * applied when its first statement ran). A statement runs on the loop thread on the apply
 * connection inside a transaction that is always rolled back: the effects so far are
 * replayed, the statement runs with the ordinary command code, its effects are read back
 * from the oplog rows it wrote. Nothing reaches Raft before commit.
 *
 * Isolation by validation: while a transaction is open the primary's apply records every
 * applied write (Raft index, ns, _id key; DDL, stripedbSetVersion and stripedbSetFiltering
 * conflict with everything). A write recorded after a transaction's start sequence that
 * matches one of its keys or coarse namespaces aborts it with WriteConflict (112,
 * TransientTransactionError): so what it read is what a snapshot at its start holds.
 * Commit validates once more when the next Raft entry is built (nothing else in flight)
 * and proposes the effects as one command {stripedbApplyTxn: 1, lsid, txnNumber, ops}
 * at the head of that entry, applied by every member in one savepoint with the durable
 * session record (txn_sessions + the committed marker). See src/shard/README.md,
 * "Transactions". Loop thread only unless said.
 */
#ifndef SDB_SHARD_TXN_H
#define SDB_SHARD_TXN_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "shard/shard.h"

typedef struct shard_txns shard_txns;
/* One session's transaction (open, or a tombstone of an aborted/committed one), or a
 * commit on its way to Raft (owned by the proposal queue then). */
typedef struct shard_txn_rec shard_txn_rec;

/* The statement id of the "transaction committed" marker in txn_stmts (storage/session.c):
 * present for a session's active txnNumber once its transaction committed. */
#define SHARD_STMT_TXN_COMMITTED (-2)

/* Start the transaction table of the shard with its lifetime limit (s, > 0) and its
 * expiry timer. Never fails. */
shard_txns *shard_txns_start(shard *sh, int64_t limit_s);
/* Abort everything and close the timer; cb(arg) on the loop when closed. t may be NULL. */
void shard_txns_stop(shard_txns *t, void (*cb)(void *arg), void *arg);

/* Does req belong to the transaction protocol (commitTransaction, abortTransaction, or
 * a command carrying autocommit or startTransaction)? Any thread. */
bool shard_txn_wants(wire_req *req);
/* Handle such a request (loop thread): a statement runs tentatively now, commit queues
 * the transaction's effects for the next Raft entry. Always answers req. */
void shard_txn_dispatch(shard *sh, wire_req *req);

/* A retryable write (a write with lsid and txnNumber, no autocommit) against the session's
 * transaction, as mongod's beginOrContinue (loop thread, before it is queued): a newer
 * txnNumber aborts the open transaction; an older one than an open transaction's is
 * answered TransactionTooOld (225), the same one IncompleteTransactionHistory (217).
 * True when req was answered. */
bool shard_txn_retryable_check(shard *sh, wire_req *req);

/* The apply's hooks (repl.c, loop thread). active: is any transaction open (only then are
 * applied writes recorded)? note_apply: inside the apply transaction of Raft entry index,
 * record the oplog entries written after ts before (all: the entry had a DDL or version
 * command, which conflicts with every open transaction). */
bool shard_txns_active(shard *sh);
void shard_txns_note_apply(shard *sh, sdb_store_conn *conn, uint64_t index, uint64_t before,
			   bool all);
/* The member is no longer the primary: abort every open transaction. */
void shard_txns_abort_all(shard *sh, const char *why);

/* Proposal (repl.c): the stripedbApplyTxn command of t (heap, bson_destroy) when t is
 * still valid against every write applied since its start and against the effects of
 * the commits in prev[0..n_prev) that precede it in the same entry; otherwise NULL after
 * answering req (WriteConflict with TransientTransactionError) and freeing t. */
bson_t *shard_txn_commit_build(shard *sh, shard_txn_rec *t, wire_req *req,
			       shard_txn_rec *const *prev, size_t n_prev);
/* Free a record (a queued commit refused before its proposal). NULL is a no-op. */
void shard_txn_rec_free(shard_txn_rec *t);

/* {stripedbApplyTxn: 1, lsid, txnNumber, ops: [{op: "i"|"u"|"d", ns, o, o2?, ud?}], check?}
 * (ud: a "u" op's updateDescription, as its statement's entry had it; none: a replacement):
 * the replicated apply of a commit (never accepted from a client). */
void shard_cmd_apply_txn(shard_ctx *x);

#endif
