/* The oplog of the embedded shard engine (local.oplog.rs): entries appended in the
 * transaction of the write they record (ts allocated under the store's ts lock), capped
 * by bytes and trimmed from the oldest, read by the tailable cursors of CDC and
 * replication. See store.h for the contract; internals in store_int.h. */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/clustertime.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/keyenc.h"
#include "storage/path.h"
#include "storage/store_int.h"

/* ------------------------------------------------------------------ oplog */

static uint64_t ts_next(sdb_store_conn *c)
{
	sdb_store *st = c->st;
	int64_t now = store_conn_now_ms(c);
	uint64_t secs = now > 0 ? (uint64_t)(now / 1000) : 0;
	pthread_mutex_lock(&st->ts_mu);
	uint64_t cand = (secs << 32) | 1;
	/* the entry's cluster-time floor (sdb_store_det.min_ts): above the gossiped time */
	if (c->apply && c->det.min_ts && cand <= c->det.min_ts)
		cand = c->det.min_ts + 1;
	if (cand <= st->last_ts)
		cand = st->last_ts + 1;
	st->last_ts = cand;
	pthread_mutex_unlock(&st->ts_mu);
	return cand;
}

/* Append an oplog entry (write txn). op "i"/"u"/"d"/"c"; o2 may be NULL; ui may be NULL. */
int store_oplog_append(sdb_store_conn *c, const char *op, const char *ns, const uint8_t *ui,
			const bson_t *o, const bson_t *o2, const char *origin, char *err,
			size_t errlen)
{
	return store_oplog_append_ud(c, op, ns, ui, o, o2, NULL, false, origin, err, errlen);
}

int store_oplog_append_ud(sdb_store_conn *c, const char *op, const char *ns, const uint8_t *ui,
			  const bson_t *o, const bson_t *o2, const bson_t *ud, bool doc_key,
			  const char *origin, char *err, size_t errlen)
{
	uint64_t ts = ts_next(c);
	int64_t wall = store_conn_now_ms(c);
	bson_t e;
	bson_init(&e);
	BSON_APPEND_TIMESTAMP(&e, "ts", (uint32_t)(ts >> 32), (uint32_t)ts);
	BSON_APPEND_INT64(&e, "t", c->apply ? c->det.term : 1);
	BSON_APPEND_INT32(&e, "v", 2);
	BSON_APPEND_UTF8(&e, "op", op);
	BSON_APPEND_UTF8(&e, "ns", ns);
	if (ui)
		bson_append_binary(&e, "ui", 2, BSON_SUBTYPE_UUID, ui, 16);
	BSON_APPEND_DOCUMENT(&e, "o", o);
	if (o2)
		BSON_APPEND_DOCUMENT(&e, "o2", o2);
	if (ud)
		BSON_APPEND_DOCUMENT(&e, "updateDescription", ud);
	if (doc_key)
		BSON_APPEND_BOOL(&e, SDB_STORE_OPLOG_DOCKEY_FIELD, true);
	BSON_APPEND_DATE_TIME(&e, "wall", wall);
	if (origin)
		BSON_APPEND_UTF8(&e, "origin", origin);
	if (c->op_lsid && strcmp(op, "c") != 0) {
		/* a statement's document writes; not the implicit create of its collection */
		bson_t lsid;
		if (bson_init_static(&lsid, c->op_lsid, c->op_lsid_len))
			BSON_APPEND_DOCUMENT(&e, "lsid", &lsid);
		BSON_APPEND_INT64(&e, "txnNumber", c->op_txn);
		BSON_APPEND_INT32(&e, "stmtId", c->op_stmt);
		if (c->op_in_txn)
			BSON_APPEND_BOOL(&e, "inTxn", true); /* change streams: lsid/txnNumber */
		if (!c->op_first_ts)
			c->op_first_ts = ts;
	}
	sqlite3_stmt *s =
		store_stmt_get(c, "INSERT INTO oplog(ts, wall, entry) VALUES(?, ?, ?)", err, errlen);
	int rc = SDB_EIO;
	if (s) {
		sqlite3_bind_int64(s, 1, (int64_t)ts);
		sqlite3_bind_int64(s, 2, wall);
		sqlite3_bind_blob(s, 3, bson_get_data(&e), (int)e.len, SQLITE_STATIC);
		rc = store_step_done(c, s, err, errlen, "oplog insert");
	}
	if (rc == 0) {
		c->pending_oplog_bytes += e.len;
		c->pending_ts = ts;
	}
	bson_destroy(&e);
	return rc;
}

int sdb_store_oplog_stmt_result(sdb_store_conn *c, const bson_t *result, char *err,
				size_t errlen)
{
	if (!c->op_lsid || !c->op_first_ts)
		return 0; /* the statement wrote nothing */
	sqlite3_stmt *s = store_stmt_get(c, "SELECT ts, entry FROM oplog WHERE ts >= ? ORDER BY ts",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, (int64_t)c->op_first_ts);
	int64_t *tss = NULL;
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	int step;
	while ((step = sqlite3_step(s)) == SQLITE_ROW) {
		const void *p = sqlite3_column_blob(s, 1);
		int len = sqlite3_column_bytes(s, 1);
		bson_t old, *e;
		bson_iter_t it;
		if (!p || len <= 0 || !bson_init_static(&old, p, (size_t)len) ||
		    !bson_iter_init_find(&it, &old, "stmtId"))
			continue; /* not an entry of the statement */
		if ((size_t)len + result->len + 16 > SDB_STORE_UD_MAX_BYTES)
			continue; /* would not fit one oplog read: the entry goes without it (a
				     migration then marks the session's history incomplete) */
		if (n == cap) {
			cap = cap ? 2 * cap : 4;
			tss = sdb_realloc(tss, cap * sizeof *tss);
			docs = sdb_realloc(docs, cap * sizeof *docs);
		}
		e = bson_new();
		bson_copy_to_excluding_noinit(&old, e, "stmtResult", NULL);
		BSON_APPEND_DOCUMENT(e, "stmtResult", result);
		c->pending_oplog_bytes += (int64_t)e->len - len;
		tss[n] = sqlite3_column_int64(s, 0);
		docs[n++] = e;
	}
	sqlite3_reset(s);
	int rc = 0;
	if (step != SQLITE_DONE)
		rc = store_sqlerr(c->db, err, errlen, "oplog read");
	for (size_t i = 0; i < n; i++) {
		if (rc == 0) {
			sqlite3_stmt *u = store_stmt_get(c, "UPDATE oplog SET entry = ? WHERE ts = ?", err,
						   errlen);
			if (!u) {
				rc = SDB_EIO;
			} else {
				sqlite3_bind_blob(u, 1, bson_get_data(docs[i]), (int)docs[i]->len,
						  SQLITE_STATIC);
				sqlite3_bind_int64(u, 2, tss[i]);
				rc = store_step_done(c, u, err, errlen, "oplog update");
			}
		}
		bson_destroy(docs[i]);
	}
	free(tss);
	free(docs);
	return rc;
}

/* Keep the oplog under its caps (write txn, at commit). Never deletes the newest entry, so
 * max(ts) on disk keeps ts increasing across restarts. */
int store_oplog_trim(sdb_store_conn *c, char *err, size_t errlen)
{
	sdb_store *st = c->st;
	int64_t bytes = st->oplog_bytes + c->pending_oplog_bytes;
	bool by_size = bytes > st->opts.oplog_max_bytes;
	bool by_age = st->opts.oplog_max_age_s > 0 && (++st->writes_since_trim % 256) == 0;
	if (!by_size && !by_age)
		return 0;
	int64_t target = st->opts.oplog_max_bytes - st->opts.oplog_max_bytes / 10;
	int64_t cutoff_wall = by_age ? store_conn_now_ms(c) - st->opts.oplog_max_age_s * 1000 : 0;
	sqlite3_stmt *s = store_stmt_get(c,
				   "SELECT ts, wall, length(entry) FROM oplog WHERE ts < (SELECT "
				   "max(ts) FROM oplog) ORDER BY ts",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	int64_t freed = 0, upto = -1;
	while (sqlite3_step(s) == SQLITE_ROW) {
		int64_t ts = sqlite3_column_int64(s, 0);
		int64_t wall = sqlite3_column_int64(s, 1);
		int64_t len = sqlite3_column_int64(s, 2);
		bool over = by_size && bytes - freed > target;
		bool old = by_age && wall < cutoff_wall;
		if (!over && !old)
			break;
		freed += len;
		upto = ts;
	}
	sqlite3_reset(s);
	if (upto < 0)
		return 0;
	s = store_stmt_get(c, "DELETE FROM oplog WHERE ts <= ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, upto);
	int rc = store_step_done(c, s, err, errlen, "oplog trim");
	if (rc)
		return rc;
	/* the newest ts trimmed (a store of an earlier version says 1: trimmed, up to an
	 * unknown ts), for change streams' history check (sdb_store_oplog_trimmed_upto) */
	s = store_stmt_get(c, "UPDATE meta SET v = max(?1, 1) WHERE k='oplog_trimmed' AND v < ?1",
			   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, upto);
	rc = store_step_done(c, s, err, errlen, "oplog trimmed flag");
	if (rc == 0)
		c->pending_oplog_bytes -= freed;
	return rc;
}

uint64_t sdb_store_oplog_committed(sdb_store *st)
{
	return atomic_load(&st->committed_ts);
}

uint64_t sdb_store_oplog_last(sdb_store_conn *c)
{
	return (uint64_t)store_query_int(c, "SELECT max(ts) FROM oplog", 0);
}

uint64_t sdb_store_oplog_first(sdb_store_conn *c)
{
	return (uint64_t)store_query_int(c, "SELECT min(ts) FROM oplog", 0);
}

int64_t sdb_store_oplog_count(sdb_store_conn *c)
{
	return store_query_int(c, "SELECT count(*) FROM oplog", 0);
}

bool sdb_store_oplog_trimmed(sdb_store_conn *c)
{
	return store_query_int(c, "SELECT v FROM meta WHERE k='oplog_trimmed'", 0) != 0;
}

uint64_t sdb_store_oplog_trimmed_upto(sdb_store_conn *c)
{
	int64_t v = store_query_int(c, "SELECT v FROM meta WHERE k='oplog_trimmed'", 0);
	return v > 0 ? (uint64_t)v : 0;
}

int sdb_store_oplog_note(sdb_store_conn *c, const bson_t *data, uint64_t min_ts, bool *written,
			 char *err, size_t errlen)
{
	sdb_store *st = c->st;
	int64_t now = store_conn_now_ms(c);
	uint64_t secs = now > 0 ? (uint64_t)(now / 1000) : 0;
	bool above;

	*written = false;
	/* the gossip's own bound (common/clustertime.h), not a tighter one: a change stream
	 * notes an idle shard up to the merged position, which a gossiped time may have put
	 * that far ahead; a tighter bound here stalled every proxy stream (issue #20 review) */
	if ((min_ts >> 32) > secs + CT_MAX_DRIFT_SECS + 1)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"maxClusterTime Timestamp(%u, %u) is more than a year ahead of "
				"this shard's clock",
				(unsigned)(min_ts >> 32), (unsigned)min_ts);
	/* "above" means the newest OPLOG entry is above min_ts (the contract): the ts
	 * allocator (last_ts) also moves for writes that fail after taking a ts (a
	 * duplicate key) and never reach the oplog, and a change stream's high-water mark
	 * only passes min_ts on an entry (wip-cs-proxy: an idle shard then held a merged
	 * stream back for good) */
	uint64_t newest = sdb_store_oplog_last(c);
	pthread_mutex_lock(&st->ts_mu);
	above = min_ts != 0 && newest > min_ts;
	if (!above && st->last_ts < min_ts)
		st->last_ts = min_ts; /* the next ts is min_ts + 1 or more */
	pthread_mutex_unlock(&st->ts_mu);
	if (above)
		return 0;
	int rc = store_oplog_append(c, "n", "", NULL, data, NULL, NULL, err, errlen);
	if (rc == 0)
		*written = true;
	return rc;
}

static int oplog_read_impl(sdb_store_conn *c, bool desc, uint64_t after, uint64_t before,
			   size_t max, bson_t ***docs, size_t *n, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c,
				   desc ? "SELECT entry FROM oplog WHERE ts > ?1 AND ts < ?2 ORDER BY "
					  "ts DESC LIMIT ?3"
					: "SELECT entry FROM oplog WHERE ts > ?1 AND ts < ?2 ORDER BY "
					  "ts LIMIT ?3",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, (int64_t)after);
	sqlite3_bind_int64(s, 2, before && before <= INT64_MAX ? (int64_t)before : INT64_MAX);
	sqlite3_bind_int64(s, 3, max > INT64_MAX ? INT64_MAX : (int64_t)max);
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		bson_t *d = sdb_doc_new_from_data(sqlite3_column_blob(s, 0),
					       (size_t)sqlite3_column_bytes(s, 0));
		if (!d)
			continue;
		*docs = sdb_realloc(*docs, (*n + 1) * sizeof **docs);
		(*docs)[(*n)++] = d;
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		return store_sqlerr(c->db, err, errlen, "oplog read");
	return 0;
}

int sdb_store_oplog_read(sdb_store_conn *c, uint64_t after, size_t max, bson_t ***docs,
			 size_t *n, char *err, size_t errlen)
{
	return oplog_read_impl(c, false, after, 0, max, docs, n, err, errlen);
}

int sdb_store_oplog_read_desc(sdb_store_conn *c, uint64_t after, uint64_t before, size_t max,
			      bson_t ***docs, size_t *n, char *err, size_t errlen)
{
	return oplog_read_impl(c, true, after, before, max, docs, n, err, errlen);
}
