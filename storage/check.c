/* Integrity checks of the embedded shard engine (validate): every document's index keys
 * present and no stray ones, counts and the catalog consistent. See store.h; internals in
 * store_int.h. */
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

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/keyenc.h"
#include "storage/path.h"
#include "storage/store_int.h"

/* ------------------------------------------------------------------ integrity */

static void problem(bson_t *problems, int *n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void problem(bson_t *problems, int *n, const char *fmt, ...)
{
	char buf[512], key[16];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	snprintf(key, sizeof key, "%d", *n);
	if (*n < 1000)
		BSON_APPEND_UTF8(problems, key, buf);
	(*n)++;
}

/* Check each document of co (parses, key matches its _id, every index key present) and
 * each index's rows (as many as the documents give, none without a document). With v,
 * also count the records, the invalid documents and each index's rows into v. */
static int check_coll(sdb_store_conn *c, const sdb_store_coll *co, bson_t *problems, int *n,
		      sdb_store_validation *v, char *err, size_t errlen)
{
	char sql[160];
	snprintf(sql, sizeof sql, "SELECT k, doc FROM c_%lld", (long long)co->tbl);
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK)
		return store_sqlerr(c->db, err, errlen, "check");
	int64_t *expect = sdb_calloc(co->n_indexes + 1, sizeof *expect);
	sdb_key idk;
	sdb_key_init(&idk);
	int r;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		bson_t doc;
		if (v)
			v->nrecords++;
		if (!bson_init_static(&doc, sqlite3_column_blob(s, 1),
				      (size_t)sqlite3_column_bytes(s, 1)) ||
		    !bson_validate(&doc, BSON_VALIDATE_NONE, NULL)) {
			problem(problems, n, "%s.%s: a document is not valid BSON", co->db,
				co->coll);
			if (v)
				v->n_invalid++;
			continue;
		}
		bson_iter_t id_it;
		char kerr[64];
		if (store_id_key(&doc, &idk, &id_it, NULL, kerr, sizeof kerr) != 0 ||
		    idk.len != (size_t)sqlite3_column_bytes(s, 0) ||
		    memcmp(idk.data, sqlite3_column_blob(s, 0), idk.len) != 0) {
			problem(problems, n, "%s.%s: a document's key does not match its _id",
				co->db, co->coll);
			if (v)
				v->n_invalid++;
			continue;
		}
		for (size_t i = 0; i < co->n_indexes; i++) {
			const sdb_store_index *ix = &co->indexes[i];
			store_keyset ks;
			store_keyset_init(&ks);
			bool missing = false, multikey = false;
			if (store_partial_covers(ix, &doc) &&
			    store_key_index_keys(ix->key, ix->coll, &doc, &ks, &missing, &multikey,
						 NULL, kerr, sizeof kerr) == 0 &&
			    !(ix->sparse && missing)) {
				if (multikey && !ix->multikey) {
					/* the planner would intersect bounds and give sorts from an
					 * index that holds several keys of one document */
					char *js = bson_as_relaxed_extended_json(&doc, NULL);
					problem(problems, n,
						"%s.%s: index %s is not marked multikey but holds an "
						"array of document %.200s",
						co->db, co->coll, ix->name, js ? js : "?");
					bson_free(js);
				}
				char q[128];
				snprintf(q, sizeof q, "SELECT 1 FROM i_%lld WHERE k = ? AND id = ?",
					 (long long)ix->tbl);
				for (size_t j = 0; j < ks.n; j++) {
					sqlite3_stmt *q2 = store_stmt_get(c, q, err, errlen);
					if (!q2)
						break;
					sqlite3_bind_blob(q2, 1, ks.keys[j].data,
							  (int)ks.keys[j].len, SQLITE_STATIC);
					sqlite3_bind_blob(q2, 2, idk.data, (int)idk.len,
							  SQLITE_STATIC);
					if (sqlite3_step(q2) != SQLITE_ROW) {
						char *js = bson_as_relaxed_extended_json(&doc, NULL);
						problem(problems, n,
							"%s.%s: index %s misses a key of document %.200s",
							co->db, co->coll, ix->name, js ? js : "?");
						bson_free(js);
					}
					sqlite3_reset(q2);
				}
				expect[i] += (int64_t)ks.n;
			}
			store_keyset_destroy(&ks);
		}
	}
	sqlite3_finalize(s);
	sdb_key_free(&idk);
	for (size_t i = 0; i < co->n_indexes; i++) {
		snprintf(sql, sizeof sql, "SELECT count(*) FROM i_%lld",
			 (long long)co->indexes[i].tbl);
		int64_t have = store_query_int(c, sql, -1);
		if (v)
			v->index_keys[i] = have;
		if (have != expect[i])
			problem(problems, n, "%s.%s: index %s has %lld entries, documents give %lld",
				co->db, co->coll, co->indexes[i].name, (long long)have,
				(long long)expect[i]);
		snprintf(sql, sizeof sql,
			 "SELECT count(*) FROM i_%lld i WHERE NOT EXISTS (SELECT 1 FROM c_%lld c "
			 "WHERE c.k = i.id)",
			 (long long)co->indexes[i].tbl, (long long)co->tbl);
		int64_t orphans = store_query_int(c, sql, -1);
		if (orphans != 0)
			problem(problems, n, "%s.%s: index %s has %lld entries without a document",
				co->db, co->coll, co->indexes[i].name, (long long)orphans);
	}
	free(expect);
	return r == SQLITE_DONE || r == SQLITE_ROW ? 0 : store_sqlerr(c->db, err, errlen, "check");
}

/* Replay the retained oplog per namespace and compare with the data. */
static int check_oplog(sdb_store_conn *c, bson_t *problems, int *n, char *err, size_t errlen)
{
	bool trimmed = store_query_int(c, "SELECT v FROM meta WHERE k='oplog_trimmed'", 0) != 0;
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v2(c->db, "SELECT entry FROM oplog ORDER BY ts", -1, &s, NULL) !=
	    SQLITE_OK)
		return store_sqlerr(c->db, err, errlen, "check oplog");
	/* latest image per (ns, id key): a temp table keeps memory bounded */
	int rc = store_exec_sql(c->db,
			  "CREATE TEMP TABLE IF NOT EXISTS chk(ns TEXT, k BLOB, doc BLOB,"
			  " PRIMARY KEY(ns, k)) WITHOUT ROWID; DELETE FROM temp.chk;"
			  "CREATE TEMP TABLE IF NOT EXISTS chkns(ns TEXT PRIMARY KEY)"
			  " WITHOUT ROWID; DELETE FROM temp.chkns;",
			  err, errlen);
	if (rc) {
		sqlite3_finalize(s);
		return rc;
	}
	sdb_key idk;
	sdb_key_init(&idk);
	int r;
	uint64_t prev_ts = 0;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		bson_t e;
		if (!bson_init_static(&e, sqlite3_column_blob(s, 0),
				      (size_t)sqlite3_column_bytes(s, 0)))
			continue;
		bson_iter_t it;
		const char *op = "", *ns = "";
		uint32_t tsec = 0, tinc = 0;
		if (bson_iter_init_find(&it, &e, "ts") && BSON_ITER_HOLDS_TIMESTAMP(&it))
			bson_iter_timestamp(&it, &tsec, &tinc);
		uint64_t ts = sdb_store_ts_pack(tsec, tinc);
		if (ts <= prev_ts)
			problem(problems, n, "oplog: ts not increasing at %u:%u", tsec, tinc);
		prev_ts = ts;
		if (bson_iter_init_find(&it, &e, "op") && BSON_ITER_HOLDS_UTF8(&it))
			op = bson_iter_utf8(&it, NULL);
		if (bson_iter_init_find(&it, &e, "ns") && BSON_ITER_HOLDS_UTF8(&it))
			ns = bson_iter_utf8(&it, NULL);
		bson_t o;
		bool have_o = false;
		if (bson_iter_init_find(&it, &e, "o") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_iter_document(&it, &len, &data);
			have_o = bson_init_static(&o, data, len);
		}
		if (!have_o)
			continue;
		if (strcmp(op, "c") == 0) {
			/* drop / dropDatabase: forget the namespaces' history */
			const char *dbend = strstr(ns, ".$cmd");
			char *db = dbend ? sdb_strndup(ns, (size_t)(dbend - ns)) : sdb_strdup(ns);
			if (bson_iter_init_find(&it, &o, "drop") && BSON_ITER_HOLDS_UTF8(&it)) {
				char *dns = sdb_asprintf("%s.%s", db, bson_iter_utf8(&it, NULL));
				sqlite3_stmt *d = store_stmt_get(c, "DELETE FROM temp.chk WHERE ns = ?",
							   err, errlen);
				if (d) {
					sqlite3_bind_text(d, 1, dns, -1, SQLITE_STATIC);
					store_step_done(c, d, err, errlen, "chk");
				}
				free(dns);
			} else if (bson_iter_init_find(&it, &o, "renameCollection") &&
				   BSON_ITER_HOLDS_UTF8(&it)) {
				/* the target's history goes (dropTarget), the source's becomes
				 * the target's */
				const char *from = bson_iter_utf8(&it, NULL), *to = NULL;
				if (bson_iter_init_find(&it, &o, "to") && BSON_ITER_HOLDS_UTF8(&it))
					to = bson_iter_utf8(&it, NULL);
				sqlite3_stmt *d = to ? store_stmt_get(c,
								      "DELETE FROM temp.chk WHERE ns = ?",
								      err, errlen)
						     : NULL;
				if (d) {
					sqlite3_bind_text(d, 1, to, -1, SQLITE_STATIC);
					store_step_done(c, d, err, errlen, "chk");
				}
				d = to ? store_stmt_get(c, "UPDATE temp.chk SET ns = ?2 WHERE ns = ?1",
							err, errlen)
				       : NULL;
				if (d) {
					sqlite3_bind_text(d, 1, from, -1, SQLITE_STATIC);
					sqlite3_bind_text(d, 2, to, -1, SQLITE_STATIC);
					store_step_done(c, d, err, errlen, "chk");
				}
			} else if (bson_iter_init_find(&it, &o, "dropDatabase")) {
				char *pfx = sdb_asprintf("%s.", db);
				sqlite3_stmt *d = store_stmt_get(
					c, "DELETE FROM temp.chk WHERE substr(ns, 1, length(?1)) = ?1",
					err, errlen);
				if (d) {
					sqlite3_bind_text(d, 1, pfx, -1, SQLITE_STATIC);
					store_step_done(c, d, err, errlen, "chk");
				}
				free(pfx);
			}
			free(db);
			continue;
		}
		if (strcmp(op, "i") != 0 && strcmp(op, "u") != 0 && strcmp(op, "d") != 0)
			continue; /* a no-op ("n", appendOplogNote): its o is not a document */
		bson_iter_t id_it;
		char kerr[64];
		const bson_t *idsrc = &o;
		bson_t o2;
		if (strcmp(op, "u") == 0 && bson_iter_init_find(&it, &e, "o2") &&
		    BSON_ITER_HOLDS_DOCUMENT(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_iter_document(&it, &len, &data);
			if (bson_init_static(&o2, data, len))
				idsrc = &o2;
		}
		if (store_id_key(idsrc, &idk, &id_it, NULL, kerr, sizeof kerr) != 0)
			continue;
		sqlite3_stmt *u = store_stmt_get(c,
					   "INSERT OR REPLACE INTO temp.chk(ns, k, doc) "
					   "VALUES(?, ?, ?)",
					   err, errlen);
		if (!u)
			break;
		sqlite3_bind_text(u, 1, ns, -1, SQLITE_STATIC);
		sqlite3_bind_blob(u, 2, idk.data, (int)idk.len, SQLITE_STATIC);
		if (strcmp(op, "d") == 0)
			sqlite3_bind_null(u, 3);
		else
			sqlite3_bind_blob(u, 3, bson_get_data(&o), (int)o.len, SQLITE_STATIC);
		store_step_done(c, u, err, errlen, "chk");
		sqlite3_stmt *u2 =
			store_stmt_get(c, "INSERT OR IGNORE INTO temp.chkns(ns) VALUES(?)", err, errlen);
		if (u2) {
			sqlite3_bind_text(u2, 1, ns, -1, SQLITE_STATIC);
			store_step_done(c, u2, err, errlen, "chk");
		}
	}
	sqlite3_finalize(s);
	sdb_key_free(&idk);
	/* compare every collection against the replayed images */
	for (size_t i = 0; i < c->n_colls; i++) {
		const sdb_store_coll *co = &c->colls[i];
		char *ns = sdb_ns_join(co->db, co->coll);
		char sql[400];
		/* images that disagree with the stored document (or a document that should
		 * exist and does not) */
		snprintf(sql, sizeof sql,
			 "SELECT count(*) FROM temp.chk h LEFT JOIN c_%lld c ON c.k = h.k WHERE "
			 "h.ns = ?1 AND ((h.doc IS NULL AND c.k IS NOT NULL) OR (h.doc IS NOT "
			 "NULL AND (c.doc IS NULL OR c.doc <> h.doc)))",
			 (long long)co->tbl);
		sqlite3_stmt *q = store_stmt_get(c, sql, err, errlen);
		if (q) {
			sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
			if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int64(q, 0) != 0)
				problem(problems, n,
					"%s: %lld documents disagree with their latest oplog entry",
					ns, (long long)sqlite3_column_int64(q, 0));
			sqlite3_reset(q);
		}
		if (!trimmed) {
			snprintf(sql, sizeof sql,
				 "SELECT count(*) FROM c_%lld c WHERE NOT EXISTS (SELECT 1 FROM "
				 "temp.chk h WHERE h.ns = ?1 AND h.k = c.k)",
				 (long long)co->tbl);
			q = store_stmt_get(c, sql, err, errlen);
			if (q) {
				sqlite3_bind_text(q, 1, ns, -1, SQLITE_STATIC);
				if (sqlite3_step(q) == SQLITE_ROW &&
				    sqlite3_column_int64(q, 0) != 0)
					problem(problems, n,
						"%s: %lld documents have no oplog entry", ns,
						(long long)sqlite3_column_int64(q, 0));
				sqlite3_reset(q);
			}
		}
		free(ns);
	}
	/* namespaces with live images in the oplog but no collection */
	sqlite3_stmt *q = store_stmt_get(c,
				   "SELECT ns, count(*) FROM temp.chk WHERE doc IS NOT NULL GROUP "
				   "BY ns",
				   err, errlen);
	if (q) {
		while (sqlite3_step(q) == SQLITE_ROW) {
			const char *ns = (const char *)sqlite3_column_text(q, 0);
			const char *dot = strchr(ns, '.');
			bool found = false;
			for (size_t i = 0; dot && i < c->n_colls; i++)
				if (strlen(c->colls[i].db) == (size_t)(dot - ns) &&
				    strncmp(c->colls[i].db, ns, (size_t)(dot - ns)) == 0 &&
				    strcmp(c->colls[i].coll, dot + 1) == 0)
					found = true;
			if (!found)
				problem(problems, n, "%s: oplog has %lld live documents, no collection",
					ns, (long long)sqlite3_column_int64(q, 1));
		}
		sqlite3_reset(q);
	}
	store_exec_sql(c->db, "DELETE FROM temp.chk; DELETE FROM temp.chkns", NULL, 0);
	return r == SQLITE_DONE ? 0 : store_sqlerr(c->db, err, errlen, "check oplog");
}

int sdb_store_check(sdb_store_conn *c, bson_t *problems, int *n_problems, char *err,
		    size_t errlen)
{
	*n_problems = 0;
	store_release_kept(c);
	if (store_exec_sql(c->db, "PRAGMA quick_check", NULL, 0) != 0)
		problem(problems, n_problems, "sqlite quick_check failed");
	for (size_t i = 0; i < c->n_colls; i++) {
		int rc = check_coll(c, &c->colls[i], problems, n_problems, NULL, err, errlen);
		if (rc)
			return rc;
	}
	return check_oplog(c, problems, n_problems, err, errlen);
}

int sdb_store_validate(sdb_store_conn *c, const char *db, const char *coll, bool metadata_only,
		       sdb_store_validation *v, bson_t *problems, int *n_problems, char *err,
		       size_t errlen)
{
	const sdb_store_coll *co;
	int rc;

	store_release_kept(c);
	memset(v, 0, sizeof *v);
	*n_problems = 0;
	if ((rc = sdb_store_coll_get(c, db, coll, &co, err, errlen)) != 0)
		return rc;
	v->n_indexes = co->n_indexes;
	v->index_names = sdb_calloc(co->n_indexes + 1, sizeof *v->index_names);
	v->index_keys = sdb_calloc(co->n_indexes + 1, sizeof *v->index_keys);
	for (size_t i = 0; i < co->n_indexes; i++) {
		char perr[256];
		v->index_names[i] = sdb_strdup(co->indexes[i].name);
		if (store_key_check_pattern(co->indexes[i].key, perr, sizeof perr) != 0)
			problem(problems, n_problems, "%s.%s: index %s: %s", db, coll,
				co->indexes[i].name, perr);
	}
	if (metadata_only)
		return 0;
	return check_coll(c, co, problems, n_problems, v, err, errlen);
}

void sdb_store_validation_free(sdb_store_validation *v)
{
	for (size_t i = 0; v->index_names && i < v->n_indexes; i++)
		free(v->index_names[i]);
	free(v->index_names);
	free(v->index_keys);
	memset(v, 0, sizeof *v);
}
