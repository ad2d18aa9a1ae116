/* Retryable-write records of the store (storage/store.h "retryable writes"): MongoDB's
 * config.transactions (one document per session: txnNum, lastWriteDate) plus the outcome
 * of each executed statement, which mongod rebuilds from its oplog chain and we keep as a
 * row. See the server's transaction_participant.cpp (checkStatementExecuted,
 * onWriteOpCompletedOnPrimary) and the driver specification "Retryable Writes".
 *
 * Tables (store.c schema):
 *   txn_sessions(lsid BLOB PRIMARY KEY, txn INTEGER, last_use INTEGER epoch ms)
 *   txn_stmts(lsid BLOB, stmt INTEGER, result BLOB (BSON), PRIMARY KEY(lsid, stmt))
 * txn_stmts only holds statements of the session's active txnNumber.
 */
#include <string.h>

#include "common/err.h"
#include "storage/store.h"
#include "storage/store_int.h"

#define SESSION_SWEEP_EVERY_MS (60 * 1000)

static void bind_lsid(sqlite3_stmt *s, int col, const bson_t *lsid)
{
	sqlite3_bind_blob(s, col, bson_get_data(lsid), (int)sdb_store_doc_len(lsid), SQLITE_STATIC);
}

/* The cached statement sql with the session id lsid (its BSON bytes) bound as parameter 1.
 * Returns: the statement, or NULL with the error in err (the caller answers SDB_EIO). */
static sqlite3_stmt *lsid_stmt(sdb_store_conn *c, const char *sql, const bson_t *lsid,
			       char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(c, sql, err, errlen);

	if (s)
		bind_lsid(s, 1, lsid);
	return s;
}

static int forget_stmts(sdb_store_conn *c, const bson_t *lsid, char *err, size_t errlen)
{
	sqlite3_stmt *s = lsid_stmt(c, "DELETE FROM txn_stmts WHERE lsid = ?", lsid, err, errlen);
	if (!s)
		return SDB_EIO;
	return sdb_store_int_step_done(c, s, err, errlen, "txn_stmts delete");
}

/* Delete sessions unused since before cutoff with their statements. */
static int sweep(sdb_store_conn *c, int64_t cutoff, char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(
		c,
		"DELETE FROM txn_stmts WHERE lsid IN (SELECT lsid FROM txn_sessions WHERE "
		"last_use < ?)",
		err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, cutoff);
	int rc = sdb_store_int_step_done(c, s, err, errlen, "session sweep");
	if (rc)
		return rc;
	s = sdb_store_int_stmt(c, "DELETE FROM txn_sessions WHERE last_use < ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, cutoff);
	return sdb_store_int_step_done(c, s, err, errlen, "session sweep");
}

/* The session's current txnNumber (*cur) and whether it is live (*found: a record last
 * used at or after live_since, epoch ms; an older one counts as swept). 0 or SDB_EIO. */
static int session_read(sdb_store_conn *c, const bson_t *lsid, int64_t live_since, bool *found,
			int64_t *cur, char *err, size_t errlen)
{
	sqlite3_stmt *s =
		lsid_stmt(c, "SELECT txn, last_use FROM txn_sessions WHERE lsid = ?", lsid, err,
			  errlen);
	if (!s)
		return SDB_EIO;
	int step = sqlite3_step(s);
	*found = false;
	*cur = 0;
	if (step == SQLITE_ROW) {
		*cur = sqlite3_column_int64(s, 0);
		*found = sqlite3_column_int64(s, 1) >= live_since;
	}
	sqlite3_reset(s);
	if (step != SQLITE_ROW && step != SQLITE_DONE)
		return sdb_store_int_sqlerr(c, err, errlen, "txn_sessions read");
	return 0;
}

/* Make txn the session's current txnNumber, used at now (epoch ms); forget: drop the
 * statements recorded for older txnNumbers first. 0 or SDB_EIO. */
static int session_write(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int64_t now,
			 bool forget, char *err, size_t errlen)
{
	if (forget) {
		int rc = forget_stmts(c, lsid, err, errlen);
		if (rc)
			return rc;
	}
	sqlite3_stmt *s = lsid_stmt(
		c, "INSERT OR REPLACE INTO txn_sessions(lsid, txn, last_use) VALUES(?, ?, ?)", lsid,
		err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 2, txn);
	sqlite3_bind_int64(s, 3, now);
	return sdb_store_int_step_done(c, s, err, errlen, "txn_sessions write");
}

int sdb_store_session_begin(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int64_t *stored,
			    char *err, size_t errlen)
{
	if (!sdb_store_int_in_write(c))
		return sdb_errf(err, errlen, SDB_EINVAL, "store: session write outside a write "
							 "transaction");
	int64_t now = sdb_store_int_now_ms(c);
	int64_t timeout = sdb_store_int_session_timeout_ms(c);
	int64_t *mark = sdb_store_int_sweep_mark(c);
	int rc;
	if (now >= *mark) {
		rc = sweep(c, now - timeout, err, errlen);
		if (rc)
			return rc;
		*mark = now + (timeout < SESSION_SWEEP_EVERY_MS ? timeout : SESSION_SWEEP_EVERY_MS);
	}
	bool found;
	int64_t cur;
	rc = session_read(c, lsid, now - timeout, &found, &cur, err, errlen);
	if (rc)
		return rc;
	*stored = found ? cur : txn;
	if (found && txn < cur)
		return sdb_errf(err, errlen, SDB_ESTALE,
				"Retryable write with txnNumber %lld is prohibited on session "
				"because a newer retryable write with txnNumber %lld has already "
				"started on this session.",
				(long long)txn, (long long)cur);
	return session_write(c, lsid, txn, now, !found || txn > cur, err, errlen);
}

int sdb_store_session_import(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int32_t stmt,
			     const bson_t *result, char *err, size_t errlen)
{
	if (!sdb_store_int_in_write(c))
		return sdb_errf(err, errlen, SDB_EINVAL, "store: session write outside a write "
							 "transaction");
	int64_t now = sdb_store_int_now_ms(c);
	int64_t timeout = sdb_store_int_session_timeout_ms(c);
	bool live;
	int64_t cur;
	int rc = session_read(c, lsid, now - timeout, &live, &cur, err, errlen);
	if (rc)
		return rc;
	if (live && txn < cur)
		return 0; /* the session moved on here: the older statement cannot be retried */
	rc = session_write(c, lsid, txn, now, !live || txn > cur, err, errlen);
	if (rc)
		return rc;
	bson_t marker = BSON_INITIALIZER;
	if (!result) {
		BSON_APPEND_BOOL(&marker, "incompleteHistory", true);
		result = &marker;
		stmt = SDB_STMT_INCOMPLETE_HISTORY;
	}
	rc = sdb_store_session_stmt_put(c, lsid, stmt, result, err, errlen);
	bson_destroy(&marker);
	return rc;
}

int sdb_store_session_stmt_get(sdb_store_conn *c, const bson_t *lsid, int32_t stmt,
			       bson_t **out, char *err, size_t errlen)
{
	*out = NULL;
	sqlite3_stmt *s = lsid_stmt(c, "SELECT result FROM txn_stmts WHERE lsid = ? AND stmt = ?",
				    lsid, err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 2, stmt);
	int step = sqlite3_step(s);
	int rc = 0;
	if (step == SQLITE_ROW) {
		const void *p = sqlite3_column_blob(s, 0);
		int n = sqlite3_column_bytes(s, 0);
		*out = p && n > 0 ? sdb_doc_new_from_data(p, (size_t)n) : NULL;
		rc = *out ? 1 : sdb_errf(err, errlen, SDB_ECORRUPT, "store: bad statement record");
	} else if (step != SQLITE_DONE) {
		rc = sdb_store_int_sqlerr(c, err, errlen, "txn_stmts read");
	}
	sqlite3_reset(s);
	return rc;
}

int sdb_store_session_stmt_put(sdb_store_conn *c, const bson_t *lsid, int32_t stmt,
			       const bson_t *result, char *err, size_t errlen)
{
	sqlite3_stmt *s = lsid_stmt(
		c, "INSERT OR REPLACE INTO txn_stmts(lsid, stmt, result) VALUES(?, ?, ?)", lsid, err,
		errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 2, stmt);
	sqlite3_bind_blob(s, 3, bson_get_data(result), (int)sdb_store_doc_len(result),
			  SQLITE_STATIC);
	return sdb_store_int_step_done(c, s, err, errlen, "txn_stmts write");
}

int sdb_store_session_peek(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int32_t stmt,
			   bson_t **out, char *err, size_t errlen)
{
	bool live;
	int64_t cur;
	int rc;

	*out = NULL;
	rc = session_read(c, lsid, sdb_store_int_now_ms(c) - sdb_store_int_session_timeout_ms(c),
			  &live, &cur, err, errlen);
	if (rc)
		return rc;
	if (!live || cur != txn)
		return 0;
	return sdb_store_session_stmt_get(c, lsid, stmt, out, err, errlen);
}

int64_t sdb_store_session_count(sdb_store_conn *c)
{
	char err[128];
	sqlite3_stmt *s = sdb_store_int_stmt(c, "SELECT count(*) FROM txn_sessions WHERE "
						"last_use >= ?",
					     err, sizeof err);
	if (!s)
		return -1;
	sqlite3_bind_int64(s, 1, sdb_store_int_now_ms(c) - sdb_store_int_session_timeout_ms(c));
	int64_t n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
	sqlite3_reset(s);
	return n;
}

int64_t sdb_store_session_list(sdb_store_conn *c, const bson_t *after, int64_t max,
			       void (*fn)(const bson_t *lsid, int64_t txn, void *arg), void *arg,
			       char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(c,
					     "SELECT lsid, txn FROM txn_sessions WHERE lsid > ? AND "
					     "last_use >= ? ORDER BY lsid LIMIT ?",
					     err, errlen);
	if (!s)
		return SDB_EIO;
	if (after)
		bind_lsid(s, 1, after);
	else
		sqlite3_bind_zeroblob(s, 1, 0);
	sqlite3_bind_int64(s, 2, sdb_store_int_now_ms(c) - sdb_store_int_session_timeout_ms(c));
	sqlite3_bind_int64(s, 3, max);
	int64_t n = 0;
	int step;
	while ((step = sqlite3_step(s)) == SQLITE_ROW) {
		const void *p = sqlite3_column_blob(s, 0);
		int len = sqlite3_column_bytes(s, 0);
		bson_t lsid;
		if (p && len > 0 && bson_init_static(&lsid, p, (size_t)len))
			fn(&lsid, sqlite3_column_int64(s, 1), arg);
		n++;
	}
	int64_t rc = step == SQLITE_DONE ? n : sdb_store_int_sqlerr(c, err, errlen, "txn_sessions list");
	sqlite3_reset(s);
	return rc;
}

int sdb_store_session_txn(sdb_store_conn *c, const bson_t *lsid, int64_t *txn, char *err,
			  size_t errlen)
{
	bool found;
	int rc = session_read(c, lsid,
			      sdb_store_int_now_ms(c) - sdb_store_int_session_timeout_ms(c),
			      &found, txn, err, errlen);
	if (rc)
		return rc;
	return found ? 1 : 0;
}
