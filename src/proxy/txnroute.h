/* Single-shard multi-document transactions through the proxy (issue #16), as mongos'
 * TransactionRouter runs one whose participants are a single shard.
 *
 * State per logical session (lsid), kept by the proxy that runs the transaction (drivers
 * pin one mongos for a transaction; a proxy restart loses the state, the shard aborts the
 * transaction at its transactionLifetimeLimitSeconds): the active txnNumber, the shard the
 * transaction is pinned to (the target of its first shard command), whether
 * `startTransaction` was sent there, and the first statement's readConcern.
 *
 * A statement (a command with `autocommit: false`) is routed as usual; every shard command
 * its handler sends (px_run_on) goes through pxtxn_run_on, which pins the first shard,
 * adds `lsid`, `txnNumber`, `autocommit: false` (and on the first command for the shard
 * `startTransaction: true` + readConcern), and refuses a command for any other shard before
 * sending it: the statement then answers OperationNotSupportedInTransaction (263) and the
 * transaction is aborted on the pinned shard, so nothing of it applies. No proxy-side
 * retry inside a transaction: a StaleConfig (a chunk moved) or a network error ends the
 * statement with the TransientTransactionError label after aborting the transaction;
 * shard errors pass through with their labels. commitTransaction / abortTransaction go to
 * the pinned shard (or to a driver's recoveryToken's shard when this proxy does not know
 * the session); a commit is retried within the shard retry budget (shardconn) and an
 * unknown outcome is labelled UnknownTransactionCommitResult. Replies of a transaction
 * carry `recoveryToken: {recoveryShardId}` as mongos' do.
 *
 * Two statements of one session at once (two connections): the second waits for the first
 * (mongod checks a session out to one operation at a time).
 */
#ifndef SDB_PROXY_TXNROUTE_H
#define SDB_PROXY_TXNROUTE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

struct ctx;
struct proxy;

#define PXTXN_ERR_RESTART 50911          /* startTransaction on a started txnNumber */
#define PXTXN_ERR_WRITE_CONFLICT 112     /* WriteConflict */
#define PXTXN_ERR_NO_SUCH_TXN 251        /* NoSuchTransaction */
#define PXTXN_ERR_TXN_COMMITTED 256      /* TransactionCommitted */
#define PXTXN_ERR_NOT_IN_TXN 263         /* OperationNotSupportedInTransaction */
#define PXTXN_SESSION_TIMEOUT_MS (30LL * 60 * 1000) /* logicalSessionTimeoutMinutes */

typedef struct pxtxn_table pxtxn_table;
typedef struct pxtxn_sess pxtxn_sess;

/* The sessions of one proxy. Thread-safe. Free once no request runs. */
pxtxn_table *pxtxn_table_new(void);
void pxtxn_table_free(pxtxn_table *t);
/* Sessions currently held (for tests and the metric). */
size_t pxtxn_table_size(pxtxn_table *t);

/* One statement of a transaction being executed (ctx->tx). */
typedef struct pxtxn_stmt {
	pxtxn_sess *s;   /* the session, checked out by this statement */
	bool failed;     /* a shard command failed in a way that ends the statement */
	int fail_kind;   /* PXTXN_FAIL_* */
	int fail_cls;    /* SHARDCONN_* of that failure */
	bson_t fail_reply; /* the shard's error reply (or ours), always initialised */
	char fail_msg[512];
} pxtxn_stmt;

enum {
	PXTXN_FAIL_NONE = 0,
	PXTXN_FAIL_SECOND_SHARD, /* 263: the proxy aborts the transaction */
	PXTXN_FAIL_STALE,        /* StaleConfig: aborted, TransientTransactionError */
	PXTXN_FAIL_NET,          /* network error: aborted, TransientTransactionError */
	PXTXN_FAIL_SHARD,        /* the shard's own error (it decides about its txn) */
};

/* True when cmd takes part in a transaction (has `autocommit`). */
bool pxtxn_is_txn_cmd(const bson_t *cmd);

/* Start statement c->cmd of its session's transaction: validates lsid / txnNumber /
 * autocommit / startTransaction (mongod's rules and codes: InvalidOptions 72,
 * TransactionTooOld 225, NoSuchTransaction 251 + TransientTransactionError,
 * TransactionCommitted 256, 50911 for a txnNumber started already), checks the session out
 * (waits while another statement of the session runs) and sets c->tx = st. Returns: 0,
 * or the code of the refusal answered on c (nothing checked out). Worker thread. */
int pxtxn_begin(struct ctx *c, pxtxn_stmt *st);
/* Finish the statement: when a shard command failed (st->failed), the answer becomes
 * that failure (263 / StaleConfig / HostUnreachable with TransientTransactionError after
 * an abortTransaction to the pinned shard; a shard error with its labels); a reply gets
 * `recoveryToken`. Checks the session back in. */
void pxtxn_end(struct ctx *c);
/* px_run_on inside a transaction (c->tx set): see the top of this file. Same contract as
 * px_run_on. Returns: a SHARDCONN_* class. */
int pxtxn_run_on(struct ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid,
		 bson_t *reply, char *neterr, size_t nelen);
/* The fields a shard cursor of the current transaction needs on its getMores (lsid,
 * txnNumber, autocommit: false), a new document, or NULL outside a transaction. */
bson_t *pxtxn_cursor_fields(struct ctx *c);
/* The handlers of commitTransaction and abortTransaction (the command table's). Returns:
 * the status of the answer recorded (0 reply, else its error code; exec.h's answers). */
int pxtxn_do_commit(struct ctx *c);
int pxtxn_do_abort(struct ctx *c);

#endif
