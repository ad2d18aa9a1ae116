/* Filtering metadata of sharded collections in shard.db (storage/store.h, issue #17): one
 * row per namespace, read in the transaction of the command it gates. */
#include <string.h>

#include "common/err.h"
#include "storage/store_int.h"

int sdb_store_filtering_get(sdb_store_conn *c, const char *ns, int64_t *cver, int64_t *sver,
			    int64_t *gen, bson_t **doc, char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(
		c, "SELECT cversion, sversion, gen, doc FROM filtering WHERE ns = ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, ns, -1, SQLITE_STATIC);
	int r = sqlite3_step(s);
	int rc = 0;
	if (r == SQLITE_ROW) {
		*cver = sqlite3_column_int64(s, 0);
		*sver = sqlite3_column_int64(s, 1);
		*gen = sqlite3_column_int64(s, 2);
		if (doc) {
			const uint8_t *data = sqlite3_column_blob(s, 3);
			int len = sqlite3_column_bytes(s, 3);
			*doc = len > 0 ? bson_new_from_data(data, (size_t)len) : NULL;
			if (!*doc)
				rc = sdb_errf(err, errlen, SDB_EIO,
					      "filtering metadata of %s is not valid BSON", ns);
		}
	} else if (r == SQLITE_DONE) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND, "no filtering metadata for %s", ns);
	} else {
		rc = sdb_store_int_sqlerr(c, err, errlen, "filtering get");
	}
	sqlite3_reset(s);
	return rc;
}

int sdb_store_filtering_set(sdb_store_conn *c, const char *ns, int64_t cver, int64_t sver,
			    const bson_t *doc, char *err, size_t errlen)
{
	int64_t oc = 0, os = 0, og = 0;
	int rc = sdb_store_filtering_get(c, ns, &oc, &os, &og, NULL, err, errlen);
	if (rc == 0 && cver < oc)
		return sdb_errf(err, errlen, SDB_ESTALE,
				"filtering metadata of %s is at collection version %lld, the install "
				"carries the older %lld",
				ns, (long long)oc, (long long)cver);
	if (rc != 0 && rc != SDB_ENOTFOUND)
		return rc;
	sqlite3_stmt *s = sdb_store_int_stmt(
		c,
		"INSERT INTO filtering(ns, cversion, sversion, gen, doc) VALUES(?1, ?2, ?3, ?5, ?4) "
		"ON CONFLICT(ns) DO UPDATE SET cversion = ?2, sversion = ?3, gen = ?5, doc = ?4",
		err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, ns, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, cver);
	sqlite3_bind_int64(s, 3, sver);
	sqlite3_bind_blob(s, 4, bson_get_data(doc), (int)doc->len, SQLITE_STATIC);
	sqlite3_bind_int64(s, 5, og + 1);
	return sdb_store_int_step_done(c, s, err, errlen, "filtering set");
}

int sdb_store_filtering_list(sdb_store_conn *c, sdb_store_filtering_fn fn, void *arg, char *err,
			     size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(
		c, "SELECT ns, cversion, sversion, gen FROM filtering ORDER BY ns", err, errlen);
	int r, rc = 0;
	if (!s)
		return SDB_EIO;
	while ((r = sqlite3_step(s)) == SQLITE_ROW)
		if (!fn(arg, (const char *)sqlite3_column_text(s, 0), sqlite3_column_int64(s, 1),
			sqlite3_column_int64(s, 2), sqlite3_column_int64(s, 3)))
			break;
	if (r != SQLITE_ROW && r != SQLITE_DONE)
		rc = sdb_store_int_sqlerr(c, err, errlen, "filtering list");
	sqlite3_reset(s);
	return rc;
}

int sdb_store_filtering_drop(sdb_store_conn *c, const char *ns, char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(c, "DELETE FROM filtering WHERE ns = ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, ns, -1, SQLITE_STATIC);
	return sdb_store_int_step_done(c, s, err, errlen, "filtering drop");
}

int sdb_store_filtering_drop_db(sdb_store_conn *c, const char *db, char *err, size_t errlen)
{
	sqlite3_stmt *s = sdb_store_int_stmt(
		c, "DELETE FROM filtering WHERE substr(ns, 1, length(?1) + 1) = ?1 || '.'", err,
		errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	return sdb_store_int_step_done(c, s, err, errlen, "filtering drop");
}
