/* A shard transaction's commit (issue #16; split from txn.c): the Raft proposal the
 * primary builds ({stripedbApplyTxn: 1, lsid, txnNumber, ops, check?}) and its replicated
 * apply on every member. Contract in txn.h, design in src/shard/README.md "Transactions". */
#include "shard/txn.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "shard/repl.h"
#include "shard/repl_int.h"
#include "storage/keyenc.h"
#include "shard/txn_int.h"

/* ------------------------------------------------------------------ proposal */

bson_t *shard_txn_commit_build(shard *sh, shard_txn_rec *t, wire_req *req,
			       shard_txn_rec *const *prev, size_t n_prev)
{
	shard_txns *T = txn_table(sh);
	bson_t lsid;
	bool conflict = false;
	if (!T || !bson_init_static(&lsid, t->lsid, t->lsid_len)) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "the shard is shutting down");
		shard_txn_rec_free(t);
		return NULL;
	}
	if (!t->check) {
		conflict = !txn_valid(T, t);
		for (size_t i = 0; !conflict && i < n_prev; i++)
			for (size_t j = 0; !conflict && prev[i] && j < prev[i]->n_ops; j++)
				conflict = txn_touches(t, prev[i]->ops[j].ns, prev[i]->ops[j].k,
						   prev[i]->ops[j].klen, false);
	}
	if (conflict) {
		shard_txn_rec *tomb = txn_find_rec(T, &lsid);
		if (tomb && tomb->txn == t->txn && tomb->state == TXN_QUEUED) {
			tomb->state = TXN_ABORTED;
			snprintf(tomb->why, sizeof tomb->why, "a write conflict at commit");
			txn_trim_log(T);
		}
		sdb_counter_inc(T->c_conflicts);
		sdb_counter_inc(T->c_aborted);
		txn_fail(req, WIRE_ERR_WRITE_CONFLICT,
		     "Write conflict during commit: a document this transaction read or wrote "
		     "was written since it started. Please retry the transaction.");
		shard_txn_rec_free(t);
		return NULL;
	}
	bson_t *c = bson_new();
	bson_t ops, op;
	char key[24];
	BSON_APPEND_INT32(c, "stripedbApplyTxn", 1);
	BSON_APPEND_DOCUMENT(c, "lsid", &lsid);
	BSON_APPEND_INT64(c, "txnNumber", t->txn);
	if (t->check)
		BSON_APPEND_BOOL(c, "check", true);
	bson_append_array_begin(c, "ops", -1, &ops);
	for (size_t i = 0; i < t->n_ops; i++) {
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&ops, key, -1, &op);
		char o[2] = {t->ops[i].op, 0};
		BSON_APPEND_UTF8(&op, "op", o);
		BSON_APPEND_UTF8(&op, "ns", t->ops[i].ns);
		BSON_APPEND_DOCUMENT(&op, "o", t->ops[i].o);
		if (t->ops[i].ud)
			BSON_APPEND_DOCUMENT(&op, "ud", t->ops[i].ud);
		bson_append_document_end(&ops, &op);
	}
	bson_append_array_end(c, &ops);
	if (!t->check) {
		shard_txn_rec *tomb = txn_find_rec(T, &lsid);
		if (tomb && tomb->txn == t->txn && tomb->state == TXN_QUEUED) {
			tomb->state = TXN_COMMITTED;
			txn_trim_log(T);
		}
		sdb_counter_inc(T->c_committed);
	}
	return c;
}

/* ------------------------------------------------------------------ replicated apply */

void shard_cmd_apply_txn(shard_ctx *x)
{
	bson_iter_t it, arr;
	bson_t lsid;
	int64_t txn = -1;
	bool check = false, have_lsid = false;
	if (bson_iter_init_find(&it, x->cmd, "lsid") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		have_lsid = bson_init_static(&lsid, data, len);
	}
	if (bson_iter_init_find(&it, x->cmd, "txnNumber") && BSON_ITER_HOLDS_INT64(&it))
		txn = bson_iter_int64(&it);
	if (bson_iter_init_find(&it, x->cmd, "check"))
		check = bson_iter_as_bool(&it);
	if (!have_lsid || txn < 0 || !bson_iter_init_find(&it, x->cmd, "ops") ||
	    !BSON_ITER_HOLDS_ARRAY(&it)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "malformed stripedbApplyTxn");
		return;
	}
	if (!shard_begin(x, true))
		return;
	bson_t *mark = NULL;
	int rc = sdb_store_session_peek(x->conn, &lsid, txn, SHARD_STMT_TXN_COMMITTED, &mark,
					x->err, sizeof x->err);
	sdb_doc_free(mark);
	if (rc < 0) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return;
	}
	if (rc == 1) {
		/* committed before (a retried commitTransaction): the same answer */
		sdb_store_rollback(x->conn);
		wire_req_reply(x->req, bson_new());
		return;
	}
	if (check) {
		sdb_store_rollback(x->conn);
		txn_fail(x->req, WIRE_ERR_NO_SUCH_TRANSACTION,
		     "Transaction %lld has been aborted or was never committed on this replica "
		     "set.",
		     (long long)txn);
		return;
	}
	int64_t stored = 0;
	rc = sdb_store_session_begin(x->conn, &lsid, txn, &stored, x->err, sizeof x->err);
	if (rc == SDB_ESTALE) {
		shard_fail(x, WIRE_ERR_TRANSACTION_TOO_OLD, "%s", x->err);
		return;
	}
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return;
	}
	bson_iter_recurse(&it, &arr);
	int32_t i = 0;
	while (bson_iter_next(&arr)) {
		bson_iter_t f;
		const char *op = NULL, *ns = NULL;
		bson_t o, ud;
		bool have_o = false, have_ud = false, bad_ud = false;
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &f))
			continue;
		while (bson_iter_next(&f)) {
			const char *k = bson_iter_key(&f);
			if (strcmp(k, "op") == 0 && BSON_ITER_HOLDS_UTF8(&f))
				op = bson_iter_utf8(&f, NULL);
			else if (strcmp(k, "ns") == 0 && BSON_ITER_HOLDS_UTF8(&f))
				ns = bson_iter_utf8(&f, NULL);
			else if (strcmp(k, "o") == 0 && BSON_ITER_HOLDS_DOCUMENT(&f)) {
				uint32_t len;
				const uint8_t *data;
				bson_iter_document(&f, &len, &data);
				have_o = bson_init_static(&o, data, len);
			} else if (strcmp(k, "ud") == 0) {
				uint32_t len = 0;
				const uint8_t *data = NULL;
				if (BSON_ITER_HOLDS_DOCUMENT(&f))
					bson_iter_document(&f, &len, &data);
				have_ud = data && bson_init_static(&ud, data, len);
				bad_ud = !have_ud;
			}
		}
		if (!op || !ns || !have_o || bad_ud) {
			shard_fail(x, WIRE_ERR_BAD_VALUE, "malformed stripedbApplyTxn op %d", i);
			return;
		}
		sdb_store_dup dup = {0};
		sdb_store_set_op_session(x->conn, &lsid, txn, i);
		sdb_store_set_op_txn(x->conn);
		rc = txn_apply_op(x->conn, op[0], ns, &o, have_ud ? &ud : NULL, &dup, x->err,
			      sizeof x->err);
		if (rc == SDB_EEXISTS && dup.set) {
			bson_t *extra = bson_new();
			BSON_APPEND_DOCUMENT(extra, "keyPattern", &dup.key_pattern);
			BSON_APPEND_DOCUMENT(extra, "keyValue", &dup.key_value);
			sdb_store_rollback(x->conn);
			wire_req_error_extra(x->req, WIRE_ERR_DUPLICATE_KEY, extra,
					     "%s (the transaction was aborted: nothing of it was "
					     "applied)",
					     dup.errmsg ? dup.errmsg : "E11000 duplicate key error");
			sdb_store_dup_clear(&dup);
			return;
		}
		sdb_store_dup_clear(&dup);
		if (rc) {
			shard_fail(x, shard_code_of(rc),
				   "transaction op %d failed, nothing of the transaction was "
				   "applied: %s",
				   i, x->err);
			return;
		}
		i++;
	}
	sdb_store_set_op_session(x->conn, NULL, 0, 0);
	bson_t m = BSON_INITIALIZER;
	BSON_APPEND_BOOL(&m, "committed", true);
	BSON_APPEND_INT32(&m, "ops", i);
	rc = sdb_store_session_stmt_put(x->conn, &lsid, SHARD_STMT_TXN_COMMITTED, &m, x->err,
					sizeof x->err);
	bson_destroy(&m);
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: session: %s", x->err);
		return;
	}
	if (!shard_commit(x))
		return;
	wire_req_reply(x->req, bson_new());
}
