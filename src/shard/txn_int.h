/* Internals of the shard's transactions shared by txn.c (records, the table, statements,
 * commit/abort) and txn_apply.c (the commit's Raft proposal and its replicated apply).
 * Not for use outside src/shard/txn*.c; the contract is txn.h. */
#ifndef SDB_SHARD_TXN_INT_H
#define SDB_SHARD_TXN_INT_H

#include "shard/txn.h"
#include "common/metrics.h"
#include "storage/store.h"

#define WIRE_ERR_WRITE_CONFLICT 112
#define WIRE_ERR_NO_SUCH_TRANSACTION 251
#define WIRE_ERR_TRANSACTION_COMMITTED 256
#define WIRE_ERR_NOT_IN_TRANSACTION 263 /* OperationNotSupportedInTransaction */
#define WIRE_ERR_TXN_NUMBER_IN_USE 50911
/* tombstones of finished transactions are kept this long (answers to late statements) */
#define TXN_TOMBSTONE_MS (10 * 60 * 1000)

enum { TXN_OPEN, TXN_ABORTED, TXN_COMMITTED, TXN_QUEUED };

typedef struct txn_key {
	char *ns;
	uint8_t *k; /* keyenc of _id; NULL: the whole namespace (coarse) */
	size_t klen;
} txn_key;

typedef struct txn_op {
	char op; /* 'i', 'u', 'd' */
	char *ns;
	bson_t *o; /* the document (i, u: full post-image) or {_id} (d) */
	bson_t *ud; /* u: the entry's updateDescription (a modifier or pipeline update), or NULL */
	uint8_t *k;
	size_t klen;
} txn_op;

struct shard_txn_rec {
	shard_txn_rec *next;
	uint8_t *lsid; /* the lsid document's bytes */
	size_t lsid_len;
	int64_t txn;
	int state;
	bool check;	    /* a commit retry: only the durable record answers */
	bool read_only_ok;  /* committed without effects (answers a commit retry) */
	uint64_t start_seq; /* Raft index applied at the first statement */
	uint64_t start_ms;  /* sdb_mono_ms of the first statement */
	uint64_t end_ms;    /* when it stopped being open */
	char why[128];	    /* why it was aborted */
	txn_op *ops;
	size_t n_ops, cap_ops;
	txn_key *keys;
	size_t n_keys, cap_keys;
};

typedef struct wlog_ent {
	uint64_t seq;
	char *ns;
	uint8_t *k;
	size_t klen;
	bool all;
} wlog_ent;

struct shard_txns {
	shard *sh;
	uv_timer_t timer;
	int64_t limit_ms;
	shard_txn_rec *list;
	wlog_ent *log;
	size_t n_log, cap_log;
	void (*closed_cb)(void *arg);
	void *closed_arg;
	sdb_counter *c_started, *c_committed, *c_aborted, *c_conflicts;
	sdb_gauge *g_open;
};

/* The member's transaction table (sh's). */
shard_txns *txn_table(shard *sh);
/* The record of session lsid in T, or NULL. */
shard_txn_rec *txn_find_rec(shard_txns *T, const bson_t *lsid);
/* Is t still valid against T's write log (no later write touched its keys)? */
bool txn_valid(shard_txns *T, const shard_txn_rec *t);
/* Does a write of ns (key k of klen bytes, or the whole namespace when all) touch one of
 * t's keys? */
bool txn_touches(const shard_txn_rec *t, const char *ns, const uint8_t *k, size_t klen,
		 bool all);
/* Drop the write-log entries no open transaction needs any more. */
void txn_trim_log(shard_txns *T);
/* Answer req with error code (mongod's wording in fmt) and, for the codes after which the
 * whole transaction may be retried, the TransientTransactionError label. */
void txn_fail(wire_req *req, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Apply one effect (op 'i'/'u'/'d' of ns with document o; ud: a "u" effect's
 * updateDescription or NULL) on conn. Returns: 0. Errors: an SDB_E* code (SDB_EEXISTS on a
 * duplicate key: dup filled) with the message in err. */
int txn_apply_op(sdb_store_conn *conn, char op, const char *ns, const bson_t *o,
		 const bson_t *ud, sdb_store_dup *dup, char *err, size_t errlen);

#endif
