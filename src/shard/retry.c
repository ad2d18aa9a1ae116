/* Retryable writes on the shard (issue #16): the session fields of a write command and the
 * per-statement records of storage/session.c, as mongod's TransactionParticipant does for
 * retryable writes (checkStatementExecuted before a statement, the statement's outcome
 * written with the statement).
 *
 * Wire fields (MongoDB): lsid {id: UUID, uid?}, txnNumber (long), and per statement a
 * stmtId: stmtIds[i] when the command carries `stmtIds` (what mongos sends a shard), else
 * `stmtId` + i (stmtId defaults to 0), as write_ops::getStmtIdForWriteAt.
 *
 * Multi-document transactions are txn.c's: the dispatcher hands every command carrying
 * autocommit/startTransaction, and commitTransaction / abortTransaction, to it; what
 * reaches a worker with those fields anyway is refused here (IllegalOperation 20).
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "common/metrics.h"
#include "shard/shard.h"
#include "shard/txn.h"
#include "shard/util.h"

#define ERR_TXN_REFUSED_FMT                                                                    \
	"%s: a transaction command reached the shard outside its transaction path; refused, "  \
	"nothing of it was applied"

bool shard_txn_refuse_fields(shard_ctx *x)
{
	bson_iter_t it;
	if (util_ctx_find(x, "startTransaction", &it)) {
		shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION, ERR_TXN_REFUSED_FMT, "startTransaction");
		return true;
	}
	if (util_ctx_find(x, "autocommit", &it)) {
		shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION, ERR_TXN_REFUSED_FMT,
			   "a command with autocommit");
		return true;
	}
	return false;
}

void shard_cmd_txn_refuse(shard_ctx *x)
{
	bson_iter_t it;
	const char *name = "commitTransaction";
	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it))
		name = bson_iter_key(&it);
	shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION, ERR_TXN_REFUSED_FMT, name);
}

bool shard_txn_parse(shard_ctx *x, shard_txn *t, uint32_t count)
{
	bson_iter_t it;
	bool have_lsid = false, have_txn = false;
	memset(t, 0, sizeof *t);
	if (bson_iter_init_find(&it, x->cmd, "lsid") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		have_lsid = bson_init_static(&t->lsid, data, len);
	}
	if (bson_iter_init_find(&it, x->cmd, "txnNumber")) {
		if (!sdb_bson_as_int64_exact(&it, &t->txn) || t->txn < 0) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
				   "BSON field 'txnNumber' must be a non-negative long");
			return false;
		}
		have_txn = true;
	}
	if (!have_txn)
		return true; /* a plain write (lsid alone records nothing, as mongod) */
	if (!have_lsid) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "Transaction number requires a session ID to also be specified");
		return false;
	}
	int64_t base = 0;
	if (bson_iter_init_find(&it, x->cmd, "stmtId") &&
	    (!sdb_bson_as_int64_exact(&it, &base) || base < 0 || base > INT32_MAX - (int64_t)count)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH, "BSON field 'stmtId' must be an int");
		return false;
	}
	t->base = (int32_t)base;
	if (bson_iter_init_find(&it, x->cmd, "stmtIds")) {
		bson_iter_t a;
		uint32_t n = 0;
		if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &a)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH, "BSON field 'stmtIds' must be an array");
			return false;
		}
		t->ids = sdb_calloc(count ? count : 1, sizeof *t->ids);
		while (bson_iter_next(&a)) {
			int64_t v;
			if (n >= count || !sdb_bson_as_int64_exact(&a, &v) || v < 0 || v > INT32_MAX) {
				free(t->ids);
				t->ids = NULL;
				shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
					   "stmtIds must hold one non-negative int per statement "
					   "(%u statements)",
					   count);
				return false;
			}
			t->ids[n++] = (int32_t)v;
		}
		if (n != count) {
			free(t->ids);
			t->ids = NULL;
			shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
				   "The size of stmtIds (%u) must match the number of operations (%u)",
				   n, count);
			return false;
		}
	}
	t->on = true;
	return true;
}

void shard_txn_free(shard_txn *t)
{
	free(t->ids);
	t->ids = NULL;
}

bool shard_txn_start(shard_ctx *x, shard_txn *t)
{
	if (!t->on)
		return true;
	int64_t stored = 0;
	int rc = sdb_store_session_begin(x->conn, &t->lsid, t->txn, &stored, x->err,
					 sizeof x->err);
	if (rc == SDB_ESTALE) {
		shard_fail(x, WIRE_ERR_TRANSACTION_TOO_OLD, "%s", x->err);
		return false;
	}
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return false;
	}
	/* a txnNumber that committed a multi-document transaction (txn.c) is not a
	 * retryable write's (mongod: _beginOrContinueRetryableWrite) */
	bson_t *mark = NULL;
	rc = sdb_store_session_stmt_get(x->conn, &t->lsid, SHARD_STMT_TXN_COMMITTED, &mark,
					x->err, sizeof x->err);
	sdb_doc_free(mark);
	if (rc == 1) {
		shard_fail(x, WIRE_ERR_INCOMPLETE_TXN_HISTORY,
			   "Cannot retry a retryable write that has been converted into a "
			   "transaction");
		return false;
	}
	if (rc < 0) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return false;
	}
	return true;
}

void shard_cmd_stmt_result(shard_ctx *x)
{
	shard_txn t;
	bson_t *res = NULL;
	if (!shard_txn_parse(x, &t, 1))
		return;
	if (!t.on) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "stripedbStmtResult needs lsid, txnNumber and stmtId");
		return;
	}
	int rc = sdb_store_begin(x->conn, false, x->err, sizeof x->err);
	if (rc == 0)
		rc = sdb_store_session_peek(x->conn, &t.lsid, t.txn, shard_txn_stmt_id(&t, 0),
					    &res, x->err, sizeof x->err);
	sdb_store_rollback(x->conn);
	shard_txn_free(&t);
	if (rc < 0) {
		wire_req_error(x->req, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return;
	}
	bson_t *reply = bson_new();
	BSON_APPEND_BOOL(reply, "executed", rc == 1);
	if (res) {
		BSON_APPEND_DOCUMENT(reply, "result", res);
		sdb_doc_free(res);
	}
	wire_req_reply(x->req, reply);
}

int32_t shard_txn_stmt_id(const shard_txn *t, uint32_t i)
{
	return t->ids ? t->ids[i] : t->base + (int32_t)i;
}

int shard_txn_lookup(shard_ctx *x, shard_txn *t, uint32_t i, bson_t **res)
{
	*res = NULL;
	if (!t->on)
		return 0;
	int rc = sdb_store_session_stmt_get(x->conn, &t->lsid, shard_txn_stmt_id(t, i), res,
					    x->err, sizeof x->err);
	if (rc < 0) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return -1;
	}
	if (rc == 0) {
		/* no record: unless the session's history for this txnNumber is known to be
		 * incomplete (a migrated chunk whose history could not be carried), run it */
		bson_t *mark = NULL;
		rc = sdb_store_session_stmt_get(x->conn, &t->lsid, SDB_STMT_INCOMPLETE_HISTORY,
						&mark, x->err, sizeof x->err);
		if (mark)
			sdb_doc_free(mark);
		if (rc < 0) {
			shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
			return -1;
		}
		if (rc == 1) {
			char *j = bson_as_relaxed_extended_json(&t->lsid, NULL);
			shard_fail(x, WIRE_ERR_INCOMPLETE_TXN_HISTORY,
				   "Incomplete history detected for transaction %lld on session "
				   "%s: statement %d may have run before its chunk migrated here and "
				   "cannot be run again",
				   (long long)t->txn, j ? j : "?", shard_txn_stmt_id(t, i));
			bson_free(j);
			return -1;
		}
	}
	if (rc == 1)
		sdb_counter_inc(sdb_metrics_counter(
			"stripedb_shard_retried_statements_total",
			"Statements of retryable writes answered from their record (a retry of an "
			"executed statement, not run again)",
			"role=\"shard\""));
	return rc;
}

void shard_txn_tag(shard_ctx *x, shard_txn *t, uint32_t i)
{
	if (t->on)
		sdb_store_set_op_session(x->conn, &t->lsid, t->txn, shard_txn_stmt_id(t, i));
}

int shard_txn_record(shard_ctx *x, shard_txn *t, uint32_t i, const bson_t *res)
{
	if (!t->on)
		return 0;
	int rc = sdb_store_oplog_stmt_result(x->conn, res, x->err, sizeof x->err);
	sdb_store_set_op_session(x->conn, NULL, 0, 0);
	if (rc)
		return rc;
	return sdb_store_session_stmt_put(x->conn, &t->lsid, shard_txn_stmt_id(t, i), res,
					  x->err, sizeof x->err);
}

/* The number of statements of a write command (0: not a write that records statements). */
static uint32_t write_statements(shard_ctx *x)
{
	static const struct {
		const char *cmd, *arr;
	} w[] = {{"insert", "documents"}, {"update", "updates"}, {"delete", "deletes"}};
	const char *name = wire_req_name(x->req);
	bson_iter_t it, a;
	uint32_t n = 0;

	if (strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0)
		return 1;
	for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
		if (strcmp(name, w[i].cmd) != 0)
			continue;
		if (bson_iter_init_find(&it, x->cmd, w[i].arr) && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &a))
			while (bson_iter_next(&a))
				n++;
	}
	return n;
}

bool shard_txn_fail_point(shard_ctx *x)
{
	if (!x->req || !wire_req_conn(x->req) || !wire_failpoint_primary_write_armed(x->req))
		return false; /* off, or a member applying a replicated command */
	uint32_t count = write_statements(x);
	if (count == 0)
		return false;
	shard_txn t;
	if (!shard_txn_parse(x, &t, count))
		return true; /* answered: malformed session fields */
	bool fresh = false;
	if (t.on && sdb_store_begin(x->conn, false, x->err, sizeof x->err) == 0) {
		for (uint32_t i = 0; i < count && !fresh; i++) {
			bson_t *res = NULL;
			int rc = sdb_store_session_peek(x->conn, &t.lsid, t.txn,
							shard_txn_stmt_id(&t, i), &res, x->err,
							sizeof x->err);
			sdb_doc_free(res);
			fresh = rc == 0;
		}
		sdb_store_rollback(x->conn);
	}
	shard_txn_free(&t);
	return fresh && wire_failpoint_primary_write(x->req);
}
