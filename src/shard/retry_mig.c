/* Session records that travel with a migrating chunk (issue #16), the destination side of
 * MongoDB's session_catalog_migration_destination.cpp: the coordinator's replicator sends
 * the source's record of each retryable statement it replays ($stripedbSession on the
 * replayed update/delete statement) and the records of statements that ran before the
 * import ($stripedbSessions on an update command); they are written here in the same
 * transaction (the statement's savepoint) as the replayed write, so once the chunk is
 * routed here a retry of a statement that ran on the source answers its recorded result.
 * A session whose history could not be carried gets an "incomplete history" marker
 * (stmtId -1, MongoDB's kIncompleteHistoryStmtId): a retry of one of its statements that
 * has no record is refused with IncompleteTransactionHistory (217), never run again.
 *
 * Wire shape of one record (every field required):
 *   {lsid: {id: UUID, ...}, txnNumber: long, stmtId: int, result: {...}}
 *   {lsid, txnNumber, incompleteHistory: true}            (only in $stripedbSessions)
 * Accepted only on a command carrying $stripedbOrigin (the migration's own writes).
 */
#include <stdio.h>
#include <string.h>

#include "common/bsonget.h"
#include "common/err.h"
#include "shard/shard.h"

/* Parse one record document into ms; incomplete: set when it is a marker (allowed only
 * when incomplete != NULL). Returns 0 or BadValue with x->err. */
static int parse_record(shard_ctx *x, const bson_t *d, shard_mig_sess *ms, bool *incomplete)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	bool have_lsid = false, have_txn = false, have_stmt = false, have_res = false;
	int64_t v;
	memset(ms, 0, sizeof *ms);
	if (incomplete)
		*incomplete = false;
	if (!bson_iter_init(&it, d))
		goto bad;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "lsid") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			have_lsid = bson_init_static(&ms->lsid, data, len);
		} else if (strcmp(k, "txnNumber") == 0 && sdb_bson_as_int64(&it, &v) && v >= 0) {
			ms->txn = v;
			have_txn = true;
		} else if (strcmp(k, "stmtId") == 0 && sdb_bson_as_int64(&it, &v) && v >= 0 &&
			   v <= INT32_MAX) {
			ms->stmt = (int32_t)v;
			have_stmt = true;
		} else if (strcmp(k, "result") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			have_res = bson_init_static(&ms->result, data, len);
		} else if (strcmp(k, "incompleteHistory") == 0 && incomplete &&
			   bson_iter_as_bool(&it)) {
			*incomplete = true;
		}
	}
	if (have_lsid && have_txn && incomplete && *incomplete) {
		ms->on = true;
		return 0;
	}
	if (have_lsid && have_txn && have_stmt && have_res) {
		ms->on = true;
		return 0;
	}
bad:
	snprintf(x->err, sizeof x->err,
		 "a migrated session record needs lsid, txnNumber, stmtId and result "
		 "(or incompleteHistory: true)");
	return WIRE_ERR_BAD_VALUE;
}

int shard_mig_sess_parse(shard_ctx *x, const bson_t *st, shard_mig_sess *ms)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	bson_t d;
	memset(ms, 0, sizeof *ms);
	if (!bson_iter_init_find(&it, st, "$stripedbSession"))
		return 0;
	if (!x->origin) {
		snprintf(x->err, sizeof x->err,
			 "$stripedbSession is accepted only on a migration's writes "
			 "($stripedbOrigin)");
		return WIRE_ERR_BAD_VALUE;
	}
	bson_iter_t t;
	if (bson_iter_init_find(&t, x->cmd, "txnNumber")) {
		snprintf(x->err, sizeof x->err,
			 "$stripedbSession replays another shard's statement: not with txnNumber");
		return WIRE_ERR_BAD_VALUE;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
		snprintf(x->err, sizeof x->err, "$stripedbSession must be a document");
		return WIRE_ERR_BAD_VALUE;
	}
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&d, data, len))
		return WIRE_ERR_BAD_VALUE;
	return parse_record(x, &d, ms, NULL);
}

void shard_mig_sess_tag(shard_ctx *x, shard_mig_sess *ms)
{
	if (ms->on)
		sdb_store_set_op_session(x->conn, &ms->lsid, ms->txn, ms->stmt);
}

int shard_mig_sess_record(shard_ctx *x, shard_mig_sess *ms)
{
	if (!ms->on)
		return 0;
	int rc = sdb_store_oplog_stmt_result(x->conn, &ms->result, x->err, sizeof x->err);
	sdb_store_set_op_session(x->conn, NULL, 0, 0);
	if (rc)
		return rc;
	return sdb_store_session_import(x->conn, &ms->lsid, ms->txn, ms->stmt, &ms->result,
					x->err, sizeof x->err);
}

bool shard_mig_sessions_import(shard_ctx *x)
{
	bson_iter_t it, arr;
	if (!bson_iter_init_find(&it, x->cmd, "$stripedbSessions"))
		return true;
	if (!x->origin) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "$stripedbSessions is accepted only on a migration's writes "
			   "($stripedbOrigin)");
		return false;
	}
	if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "$stripedbSessions must be an array");
		return false;
	}
	while (bson_iter_next(&arr)) {
		const uint8_t *data;
		uint32_t len;
		bson_t d;
		shard_mig_sess ms;
		bool incomplete = false;
		int code = WIRE_ERR_BAD_VALUE;
		if (BSON_ITER_HOLDS_DOCUMENT(&arr)) {
			bson_iter_document(&arr, &len, &data);
			code = bson_init_static(&d, data, len) ? parse_record(x, &d, &ms, &incomplete)
							       : WIRE_ERR_BAD_VALUE;
		} else {
			snprintf(x->err, sizeof x->err, "$stripedbSessions holds documents");
		}
		if (code) {
			shard_fail(x, code, "%s", x->err);
			return false;
		}
		int rc = sdb_store_session_import(x->conn, &ms.lsid, ms.txn, ms.stmt,
						  incomplete ? NULL : &ms.result, x->err,
						  sizeof x->err);
		if (rc) {
			shard_fail(x, WIRE_ERR_INTERNAL, "shard: session import: %s", x->err);
			return false;
		}
	}
	return true;
}

typedef struct list_acc {
	bson_t arr;
	uint32_t n;
} list_acc;

static void list_one(const bson_t *lsid, int64_t txn, void *arg)
{
	list_acc *a = arg;
	char k[16];
	bson_t d;
	snprintf(k, sizeof k, "%u", a->n++);
	BSON_APPEND_DOCUMENT_BEGIN(&a->arr, k, &d);
	BSON_APPEND_DOCUMENT(&d, "lsid", lsid);
	BSON_APPEND_INT64(&d, "txnNumber", txn);
	bson_append_document_end(&a->arr, &d);
}

void shard_cmd_session_list(shard_ctx *x)
{
	bson_iter_t it;
	bson_t after;
	bool have_after = false;
	int64_t limit = 10000;
	if (bson_iter_init_find(&it, x->cmd, "after")) {
		const uint8_t *data;
		uint32_t len;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
			wire_req_error(x->req, WIRE_ERR_BAD_VALUE, "after must be an lsid document");
			return;
		}
		bson_iter_document(&it, &len, &data);
		have_after = bson_init_static(&after, data, len);
	}
	if (bson_iter_init_find(&it, x->cmd, "limit") &&
	    (!sdb_bson_as_int64(&it, &limit) || limit < 1 || limit > 100000)) {
		wire_req_error(x->req, WIRE_ERR_BAD_VALUE, "limit must be an integer in 1..100000");
		return;
	}
	list_acc a = {.n = 0};
	bson_init(&a.arr);
	int rc = sdb_store_begin(x->conn, false, x->err, sizeof x->err);
	int64_t n = rc ? rc
		       : sdb_store_session_list(x->conn, have_after ? &after : NULL, limit,
						list_one, &a, x->err, sizeof x->err);
	sdb_store_rollback(x->conn);
	if (n < 0) {
		bson_destroy(&a.arr);
		wire_req_error(x->req, WIRE_ERR_INTERNAL, "shard: session list: %s", x->err);
		return;
	}
	bson_t *reply = bson_new();
	BSON_APPEND_ARRAY(reply, "sessions", &a.arr);
	BSON_APPEND_BOOL(reply, "more", n == limit);
	bson_destroy(&a.arr);
	wire_req_reply(x->req, reply);
}
