/* Incremental routing reads and removal tombstones of the metadata state machine
 * (issue #26). Contract in routing.h. */
#include "raft/routing.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- sql helpers */

static sqlite3_stmt *prep(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		sdb_error("fsm: prepare failed", "err=\"%s\"", sqlite3_errmsg(db));
		return NULL;
	}
	return st;
}

static int done(sqlite3 *db, sqlite3_stmt *st)
{
	int rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
		sdb_error("fsm: exec failed", "err=\"%s\"", sqlite3_errmsg(db));
		return SDB_EIO;
	}
	return 0;
}

static int local_get(sqlite3 *db, const char *k, int64_t *v)
{
	sqlite3_stmt *st = prep(db, "SELECT v FROM routing_local WHERE k = ?");
	int rc;
	*v = 0;
	if (!st)
		return SDB_EIO;
	sqlite3_bind_text(st, 1, k, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : SDB_EIO;
}

int fsm_routing_schema(sqlite3 *db)
{
	sqlite3_stmt *st;
	int existed = 0, rc;
	st = prep(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'routing_removed'");
	if (!st)
		return SDB_EIO;
	existed = sqlite3_step(st) == SQLITE_ROW;
	sqlite3_finalize(st);
	if (sqlite3_exec(db, FSM_ROUTING_SCHEMA, NULL, NULL, NULL) != SQLITE_OK) {
		sdb_error("fsm: routing schema failed", "err=\"%s\"", sqlite3_errmsg(db));
		return SDB_EIO;
	}
	if (existed)
		return 0;
	/* removals before this point were never recorded: diffs from older versions are
	 * answered with a full load (the version is 0 on a fresh database) */
	st = prep(db, "INSERT OR REPLACE INTO routing_local(k, v) SELECT 'upgrade_horizon',"
		      " coalesce((SELECT v FROM meta WHERE k = 'routing_version'), 0)");
	if (!st)
		return SDB_EIO;
	rc = done(db, st);
	return rc;
}

int fsm_routing_remove_chunk(sqlite3 *db, int64_t rv, int64_t chunk_id)
{
	sqlite3_stmt *st = prep(db, "INSERT INTO routing_removed(version, ns, chunk, min, max)"
				    " SELECT ?, ns, id, min, max FROM chunks WHERE id = ?");
	if (!st)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, rv);
	sqlite3_bind_int64(st, 2, chunk_id);
	return done(db, st);
}

int fsm_routing_remove_ns(sqlite3 *db, int64_t rv, const char *ns)
{
	sqlite3_stmt *st = prep(db, "INSERT INTO routing_removed(version, ns) VALUES(?, ?)");
	if (!st)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, rv);
	sqlite3_bind_text(st, 2, ns, -1, SQLITE_TRANSIENT);
	return done(db, st);
}

int fsm_routing_remove_db(sqlite3 *db, int64_t rv, const char *dbname)
{
	sqlite3_stmt *st = prep(db, "INSERT INTO routing_removed(version, ns)"
				    " SELECT ?, ns FROM colls WHERE db = ? ORDER BY ns");
	if (!st)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, rv);
	sqlite3_bind_text(st, 2, dbname, -1, SQLITE_TRANSIENT);
	return done(db, st);
}

int fsm_routing_prune(sqlite3 *db, int64_t rv)
{
	sqlite3_stmt *st;
	if (rv <= FSM_ROUTING_HORIZON)
		return 0;
	st = prep(db, "DELETE FROM routing_removed WHERE version <= ?");
	if (!st)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, rv - FSM_ROUTING_HORIZON);
	return done(db, st);
}

/* The oldest sinceVersion this member can answer with a diff. */
static int horizon(sqlite3 *db, int64_t rv, int64_t *out)
{
	int64_t up = 0;
	if (local_get(db, "upgrade_horizon", &up) != 0)
		return SDB_EIO;
	*out = rv - FSM_ROUTING_HORIZON > up ? rv - FSM_ROUTING_HORIZON : up;
	return 0;
}

/* ---------------------------------------------------------------- bson helpers */

void fsm_append_blob_doc(bson_t *out, const char *key, const void *blob, int len)
{
	bson_t d;
	if (blob && len > 0 && bson_init_static(&d, blob, (size_t)len))
		bson_append_document(out, key, -1, &d);
	else
		bson_append_null(out, key, -1);
}

static int opt_int(const bson_t *doc, const char *key, int64_t *out)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, key) || !BSON_ITER_HOLDS_NUMBER(&it))
		return 0;
	*out = bson_iter_as_int64(&it);
	return 1;
}

/* ---------------------------------------------------------------- namespace set */

/* A small open-addressing set of namespace strings (the collections a batch names). */
typedef struct nsset {
	char **slot;
	size_t cap, n;
} nsset;

static void nsset_add(nsset *s, const char *ns)
{
	uint64_t h;
	size_t i;
	if ((s->n + 1) * 2 > s->cap) {
		nsset bigger = {sdb_calloc(s->cap ? s->cap * 2 : 64, sizeof(char *)),
				s->cap ? s->cap * 2 : 64, 0};
		for (i = 0; i < s->cap; i++)
			if (s->slot[i])
				nsset_add(&bigger, s->slot[i]), free(s->slot[i]);
		free(s->slot);
		*s = bigger;
	}
	h = XXH64(ns, strlen(ns), 0);
	for (i = (size_t)(h % s->cap);; i = (i + 1) % s->cap) {
		if (!s->slot[i]) {
			s->slot[i] = sdb_strdup(ns);
			s->n++;
			return;
		}
		if (strcmp(s->slot[i], ns) == 0)
			return;
	}
}

static void nsset_free(nsset *s)
{
	for (size_t i = 0; i < s->cap; i++)
		free(s->slot[i]);
	free(s->slot);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The set's names, sorted (pointers into the set). */
static char **nsset_sorted(nsset *s)
{
	char **v = sdb_calloc(s->n ? s->n : 1, sizeof *v);
	size_t k = 0;
	for (size_t i = 0; i < s->cap; i++)
		if (s->slot[i])
			v[k++] = s->slot[i];
	qsort(v, k, sizeof *v, str_cmp);
	return v;
}

/* ---------------------------------------------------------------- the query */

static const char *first_str(const bson_t *cmd)
{
	bson_iter_t it;
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* columns: id, ns, min, max, shard, token, version */
#define CHUNK_COLS "id, ns, min, max, shard, token, version"

static void append_chunk(bson_t *arr, uint32_t idx, sqlite3_stmt *st)
{
	bson_t d;
	const char *key;
	char buf[16];
	bson_uint32_to_string(idx, &key, buf, sizeof buf);
	bson_append_document_begin(arr, key, -1, &d);
	BSON_APPEND_INT64(&d, "id", sqlite3_column_int64(st, 0));
	BSON_APPEND_UTF8(&d, "ns", (const char *)sqlite3_column_text(st, 1));
	fsm_append_blob_doc(&d, "min", sqlite3_column_blob(st, 2), sqlite3_column_bytes(st, 2));
	fsm_append_blob_doc(&d, "max", sqlite3_column_blob(st, 3), sqlite3_column_bytes(st, 3));
	BSON_APPEND_UTF8(&d, "shard", (const char *)sqlite3_column_text(st, 4));
	BSON_APPEND_INT64(&d, "token", sqlite3_column_int64(st, 5));
	BSON_APPEND_INT64(&d, "version", sqlite3_column_int64(st, 6));
	bson_append_document_end(arr, &d);
}

/* Tombstones with version > since (for ns, or all). Returns 0, SDB_ETOOBIG when they
 * exceed budget bytes (the caller answers with a full load instead), SDB_EIO. */
static int append_removed(sqlite3 *db, const char *ns, int64_t since, size_t budget,
			  bson_t *reply)
{
	sqlite3_stmt *st = prep(db, ns ? "SELECT ns, chunk, min, max, version FROM routing_removed"
					  " WHERE version > ? AND ns = ? ORDER BY seq"
					: "SELECT ns, chunk, min, max, version FROM routing_removed"
					  " WHERE version > ? ORDER BY seq");
	bson_t arr, d;
	uint32_t i = 0;
	int rc = 0;
	if (!st)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, since);
	if (ns)
		sqlite3_bind_text(st, 2, ns, -1, SQLITE_TRANSIENT);
	bson_append_array_begin(reply, "removed", -1, &arr);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *key;
		char buf[16];
		if (arr.len > budget) {
			rc = SDB_ETOOBIG;
			break;
		}
		bson_uint32_to_string(i++, &key, buf, sizeof buf);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "ns", (const char *)sqlite3_column_text(st, 0));
		if (sqlite3_column_type(st, 1) != SQLITE_NULL) {
			BSON_APPEND_INT64(&d, "id", sqlite3_column_int64(st, 1));
			fsm_append_blob_doc(&d, "min", sqlite3_column_blob(st, 2),
					sqlite3_column_bytes(st, 2));
			fsm_append_blob_doc(&d, "max", sqlite3_column_blob(st, 3),
					sqlite3_column_bytes(st, 3));
		} else {
			BSON_APPEND_BOOL(&d, "collection", true);
		}
		BSON_APPEND_INT64(&d, "version", sqlite3_column_int64(st, 4));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	if (rc == SDB_ETOOBIG)
		return rc;
	return rc == SQLITE_DONE ? 0 : SDB_EIO;
}

/* Append ns's shard key to reply as "key" (a document) and "hashed" (a bool), read from
 * colls; appends nothing when ns is not there (removed meanwhile). Returns 0, or SDB_EIO
 * when the statement could not be prepared. */
static int append_key(sqlite3 *db, const char *ns, bson_t *reply)
{
	sqlite3_stmt *st = prep(db, "SELECT key, hashed FROM colls WHERE ns = ?");
	if (!st)
		return SDB_EIO;
	sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW) {
		fsm_append_blob_doc(reply, "key", sqlite3_column_blob(st, 0),
				    sqlite3_column_bytes(st, 0));
		BSON_APPEND_BOOL(reply, "hashed", sqlite3_column_int64(st, 1) != 0);
	}
	sqlite3_finalize(st);
	return 0;
}

static int append_collections(sqlite3 *db, nsset *names, bson_t *reply)
{
	sqlite3_stmt *st = prep(db, "SELECT key, hashed FROM colls WHERE ns = ?");
	char **v;
	bson_t arr, d;
	if (!st)
		return SDB_EIO;
	v = nsset_sorted(names);
	bson_append_array_begin(reply, "collections", -1, &arr);
	for (size_t i = 0; i < names->n; i++) {
		const char *key;
		char buf[16];
		sqlite3_reset(st);
		sqlite3_bind_text(st, 1, v[i], -1, SQLITE_STATIC);
		if (sqlite3_step(st) != SQLITE_ROW)
			continue; /* removed meanwhile: its chunks are gone too */
		bson_uint32_to_string((uint32_t)i, &key, buf, sizeof buf);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "ns", v[i]);
		fsm_append_blob_doc(&d, "key", sqlite3_column_blob(st, 0), sqlite3_column_bytes(st, 0));
		BSON_APPEND_BOOL(&d, "hashed", sqlite3_column_int64(st, 1) != 0);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	free(v);
	sqlite3_finalize(st);
	return 0;
}

int fsm_routing_query(sqlite3 *db, int64_t rv, const bson_t *cmd, bson_t *reply, char *err,
		      size_t errlen)
{
	const char *ns = first_str(cmd);
	int all = !ns || !*ns || strcmp(ns, "all") == 0 || strcmp(ns, "*") == 0;
	int64_t since = -1, hz, batch = INT64_MAX, rv_after = 0, id_after = 0;
	int cursor = 0, resumed = 0, full, rc = 0;
	size_t budget = FSM_ROUTING_REPLY_BYTES;
	bson_iter_t it, sub;
	sqlite3_stmt *st;
	bson_t arr;
	uint32_t n = 0;
	nsset names = {0};

	{
		/* a namespace string or "all", and an integral sinceVersion (<= 0: full load):
		 * anything else is refused, never read as "all" or as a full load */
		sdb_bson_err e;
		if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it) ||
		    !*bson_iter_utf8(&it, NULL))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"getRoutingTable needs a namespace (\"db.coll\") or \"all\"");
		if (sdb_bson_find_int64(cmd, "sinceVersion", INT64_MIN, INT64_MAX, -1, &since,
					&e) != 0)
			return sdb_errf(err, errlen, SDB_EINVAL, "%s", e.msg);
	}
	if (bson_iter_init_find(&it, cmd, "cursor")) {
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub))
			return sdb_errf(err, errlen, SDB_EINVAL, "cursor must be a document");
		cursor = 1;
		budget = FSM_ROUTING_BATCH_BYTES;
		if (bson_iter_find(&sub, "batchSize")) {
			if (!BSON_ITER_HOLDS_NUMBER(&sub) || bson_iter_as_int64(&sub) < 1)
				return sdb_errf(err, errlen, SDB_EINVAL,
						"cursor.batchSize must be a positive number");
			batch = bson_iter_as_int64(&sub);
		}
	}
	if (bson_iter_init_find(&it, cmd, "resumeAfter")) {
		bson_t r;
		const uint8_t *d;
		uint32_t l;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it))
			return sdb_errf(err, errlen, SDB_EINVAL, "resumeAfter must be a document");
		bson_iter_document(&it, &l, &d);
		if (!bson_init_static(&r, d, l) || !opt_int(&r, "id", &id_after))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"resumeAfter needs the id of the previous batch's cursor");
		opt_int(&r, "version", &rv_after);
		resumed = 1;
		cursor = 1;
		if (budget > FSM_ROUTING_BATCH_BYTES)
			budget = FSM_ROUTING_BATCH_BYTES;
	}
	if (!all) {
		st = prep(db, "SELECT key, hashed FROM colls WHERE ns = ?");
		if (!st)
			return SDB_EIO;
		sqlite3_bind_text(st, 1, ns, -1, SQLITE_STATIC);
		if (sqlite3_step(st) != SQLITE_ROW) {
			sqlite3_finalize(st);
			/* the version this answer is true at goes with it (the caller's error
			 * reply carries it): a proxy caches "not sharded" at that version, which
			 * replaces its snapshot of the collection before a drop; at version 0 its
			 * cache kept the dropped collection's chunks and routed writes by them */
			BSON_APPEND_INT64(reply, "routingVersion", rv);
			return sdb_errf(err, errlen, SDB_ENSNOTFOUND, "collection %s is not sharded",
					ns);
		}
		/* appended below, after the header fields */
		sqlite3_finalize(st);
	}
	BSON_APPEND_INT64(reply, "routingVersion", rv);
	if (since >= rv && !resumed) {
		BSON_APPEND_BOOL(reply, "changed", false);
		BSON_APPEND_BOOL(reply, "full", false);
		bson_append_array_begin(reply, "chunks", -1, &arr);
		bson_append_array_end(reply, &arr);
		bson_append_array_begin(reply, "removed", -1, &arr);
		bson_append_array_end(reply, &arr);
		return 0;
	}
	if (horizon(db, rv, &hz) != 0)
		return SDB_EIO;
	/* a resumed batch keeps the mode the client chose: sinceVersion > 0 is a diff (its
	 * chunks do not depend on tombstones, which only the first batch carries) */
	full = since <= 0 || (!resumed && since < hz);
	BSON_APPEND_BOOL(reply, "changed", true);
	BSON_APPEND_BOOL(reply, "full", full);
	if (all && full && since > 0) {
		/* a diff of every collection asked from beyond the horizon: the client reloads
		 * the collections it holds one by one, so a full load of every collection would
		 * be read and thrown away (found by the review of issue #26: 8 MB per round) */
		BSON_APPEND_BOOL(reply, "reloadEach", true);
		bson_append_array_begin(reply, "chunks", -1, &arr);
		bson_append_array_end(reply, &arr);
		return 0;
	}
	if (!all) {
		if (append_key(db, ns, reply) != 0)
			return SDB_EIO;
	}
	if (!full && !resumed) {
		rc = append_removed(db, all ? NULL : ns, since, budget / 4, reply);
		if (rc == SDB_ETOOBIG) {
			/* too many removals to list: the client reloads in full */
			bson_reinit(reply);
			BSON_APPEND_INT64(reply, "routingVersion", rv);
			BSON_APPEND_BOOL(reply, "changed", true);
			BSON_APPEND_BOOL(reply, "full", true);
			full = 1;
			if (!all) {
				if (append_key(db, ns, reply) != 0)
					return SDB_EIO;
			}
		} else if (rc != 0) {
			return rc;
		}
	}
	/* Chunk rows in resumable order: full loads by id (the rowid), diffs by (version,
	 * id) through chunks_version / chunks_ns_version: O(rows returned). */
	if (full)
		st = prep(db, all ? "SELECT " CHUNK_COLS " FROM chunks WHERE id > ?1 ORDER BY id"
				  : "SELECT " CHUNK_COLS " FROM chunks WHERE ns = ?3 AND id > ?1"
				    " ORDER BY id");
	else
		st = prep(db, all ? "SELECT " CHUNK_COLS " FROM chunks WHERE (version, id) > (?2, ?1)"
				    " ORDER BY version, id"
				  : "SELECT " CHUNK_COLS " FROM chunks WHERE ns = ?3 AND"
				    " (version, id) > (?2, ?1) ORDER BY version, id");
	if (!st)
		return SDB_EIO;
	if (full) {
		sqlite3_bind_int64(st, 1, resumed ? id_after : INT64_MIN);
	} else {
		/* first batch: every version > since (id INT64_MAX sorts after every row of
		 * version since) */
		sqlite3_bind_int64(st, 2, resumed ? rv_after : since);
		sqlite3_bind_int64(st, 1, resumed ? id_after : INT64_MAX);
	}
	if (!all)
		sqlite3_bind_text(st, 3, ns, -1, SQLITE_STATIC);
	bson_append_array_begin(reply, "chunks", -1, &arr);
	int64_t last_id = 0, last_v = 0;
	int more = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if ((int64_t)n >= batch || arr.len > budget) {
			more = 1;
			break;
		}
		append_chunk(&arr, n++, st);
		last_id = sqlite3_column_int64(st, 0);
		last_v = sqlite3_column_int64(st, 6);
		if (all)
			nsset_add(&names, (const char *)sqlite3_column_text(st, 1));
	}
	sqlite3_finalize(st);
	bson_append_array_end(reply, &arr);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		nsset_free(&names);
		return SDB_EIO;
	}
	if (more && !cursor) {
		nsset_free(&names);
		return sdb_errf(err, errlen, SDB_ETOOBIG,
				"the routing table of %s does not fit one reply (more than %u chunks"
				" in %zu bytes): pass cursor: {} and follow resumeAfter",
				all ? "all collections" : ns, n, budget);
	}
	if (all && append_collections(db, &names, reply) != 0) {
		nsset_free(&names);
		return SDB_EIO;
	}
	nsset_free(&names);
	BSON_APPEND_BOOL(reply, "more", more != 0);
	if (more) {
		bson_t r;
		bson_append_document_begin(reply, "resumeAfter", -1, &r);
		BSON_APPEND_INT64(&r, "version", full ? 0 : last_v);
		BSON_APPEND_INT64(&r, "id", last_id);
		bson_append_document_end(reply, &r);
	}
	return 0;
}

int fsm_routing_changed_ns(sqlite3 *db, int64_t rv, int64_t gt, bson_t *reply)
{
	int64_t hz;
	sqlite3_stmt *st;
	bson_t arr;
	uint32_t n = 0;
	int rc, over = 0;

	if (horizon(db, rv, &hz) != 0)
		return SDB_EIO;
	if (gt < hz || gt <= 0) {
		BSON_APPEND_BOOL(reply, "namespacesAll", true);
		return 0;
	}
	/* two index range scans (O(changed)), deduplicated here: a UNION ... ORDER BY lets
	 * SQLite scan the whole chunks_ns_version index instead */
	static const char *const sql[] = {
		"SELECT ns FROM chunks INDEXED BY chunks_version WHERE version > ?",
		"SELECT ns FROM routing_removed WHERE version > ?",
	};
	nsset names = {0};
	rc = SQLITE_DONE;
	for (size_t k = 0; k < 2 && rc == SQLITE_DONE && !over; k++) {
		st = prep(db, sql[k]);
		if (!st) {
			nsset_free(&names);
			return SDB_EIO;
		}
		sqlite3_bind_int64(st, 1, gt);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			nsset_add(&names, (const char *)sqlite3_column_text(st, 0));
			if (names.n > FSM_ROUTING_MAX_NS) {
				over = 1;
				rc = SQLITE_DONE;
				break;
			}
		}
		sqlite3_finalize(st);
	}
	if (rc != SQLITE_DONE) {
		nsset_free(&names);
		return SDB_EIO;
	}
	if (over) {
		BSON_APPEND_BOOL(reply, "namespacesAll", true);
	} else {
		char **v = nsset_sorted(&names);
		bson_append_array_begin(reply, "namespaces", -1, &arr);
		for (size_t i = 0; i < names.n; i++) {
			const char *key;
			char buf[16];
			bson_uint32_to_string(n++, &key, buf, sizeof buf);
			BSON_APPEND_UTF8(&arr, key, v[i]);
		}
		bson_append_array_end(reply, &arr);
		free(v);
	}
	nsset_free(&names);
	return 0;
}
