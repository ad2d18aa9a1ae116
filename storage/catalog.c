/* The store's catalog: collections and indexes in SQLite, and the per-connection catalog
 * cache (see store.h "Catalog" and store_int.h). */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/collation.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/store_int.h"


/* ------------------------------------------------------------------ catalog cache */

int store_cache_load(sdb_store_conn *c, char *err, size_t errlen)
{
	int64_t gen = store_query_int(c, "SELECT v FROM meta WHERE k='catalog_gen'", -1);
	if (gen == c->cache_gen)
		return 0;
	store_cache_clear(c);
	sqlite3_stmt *s = store_stmt_get(c, "SELECT db, coll, tbl, uuid, options FROM catalog_coll",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	size_t cap = 0;
	while (sqlite3_step(s) == SQLITE_ROW) {
		if (c->n_colls == cap) {
			cap = cap ? cap * 2 : 16;
			c->colls = sdb_realloc(c->colls, cap * sizeof *c->colls);
		}
		sdb_store_coll *co = &c->colls[c->n_colls++];
		memset(co, 0, sizeof *co);
		co->db = sdb_strdup((const char *)sqlite3_column_text(s, 0));
		co->coll = sdb_strdup((const char *)sqlite3_column_text(s, 1));
		co->tbl = sqlite3_column_int64(s, 2);
		if (sqlite3_column_bytes(s, 3) == 16)
			memcpy(co->uuid, sqlite3_column_blob(s, 3), 16);
		co->options = bson_new_from_data(sqlite3_column_blob(s, 4),
						 (size_t)sqlite3_column_bytes(s, 4));
		if (!co->options)
			co->options = bson_new();
	}
	sqlite3_reset(s);
	s = store_stmt_get(c,
		     "SELECT db, coll, name, tbl, spec, multikey FROM catalog_index ORDER BY tbl",
		     err, errlen);
	if (!s)
		return SDB_EIO;
	while (sqlite3_step(s) == SQLITE_ROW) {
		const char *db = (const char *)sqlite3_column_text(s, 0);
		const char *coll = (const char *)sqlite3_column_text(s, 1);
		for (size_t i = 0; i < c->n_colls; i++) {
			sdb_store_coll *co = &c->colls[i];
			if (strcmp(co->db, db) != 0 || strcmp(co->coll, coll) != 0)
				continue;
			co->indexes = sdb_realloc(co->indexes,
						  (co->n_indexes + 1) * sizeof *co->indexes);
			sdb_store_index *ix = &co->indexes[co->n_indexes++];
			memset(ix, 0, sizeof *ix);
			ix->name = sdb_strdup((const char *)sqlite3_column_text(s, 2));
			ix->tbl = sqlite3_column_int64(s, 3);
			ix->multikey = sqlite3_column_int64(s, 5) != 0;
			ix->spec = bson_new_from_data(sqlite3_column_blob(s, 4),
						      (size_t)sqlite3_column_bytes(s, 4));
			if (!ix->spec)
				ix->spec = bson_new();
			bson_iter_t it;
			ix->key = bson_new();
			if (bson_iter_init_find(&it, ix->spec, "key") &&
			    BSON_ITER_HOLDS_DOCUMENT(&it)) {
				uint32_t len;
				const uint8_t *data;
				bson_iter_document(&it, &len, &data);
				bson_destroy(ix->key);
				ix->key = bson_new_from_data(data, len);
			}
			ix->hashed = store_key_hashed_field(ix->key) != NULL;
			ix->coll = NULL;
			if (bson_iter_init_find(&it, ix->spec, "collation")) {
				int ccode = 0;
				char cerr[256];

				/* stored by sdb_store_index_create after validation */
				if (sdb_collation_parse(&it, &ix->coll, &ccode, cerr,
							sizeof cerr) != 0)
					ix->coll = NULL;
			}
			if (bson_iter_init_find(&it, ix->spec, "unique"))
				ix->unique = bson_iter_as_bool(&it);
			if (bson_iter_init_find(&it, ix->spec, "sparse"))
				ix->sparse = bson_iter_as_bool(&it);
			if (bson_iter_init_find(&it, ix->spec, "hidden"))
				ix->hidden = bson_iter_as_bool(&it);
			ix->partial = NULL;
			if (bson_iter_init_find(&it, ix->spec, "partialFilterExpression") &&
			    BSON_ITER_HOLDS_DOCUMENT(&it)) {
				/* validated by sdb_store_index_create (store_partial_check). A
				 * stored filter that no longer compiles (a catalog written by
				 * another build) leaves the index whole and out of every plan */
				bson_t pf;
				uint32_t plen;
				const uint8_t *pdata;
				char perr[256] = "not a BSON document";

				bson_iter_document(&it, &plen, &pdata);
				if (!bson_init_static(&pf, pdata, plen) ||
				    sdb_matcher_new(&pf, &ix->partial, NULL, perr, sizeof perr) != 0) {
					ix->partial = NULL;
					ix->hidden = true;
					sdb_error("store: index partialFilterExpression does not compile",
						  "ns=%s.%s index=%s err=\"%s\"", db, coll, ix->name, perr);
				}
			}
			break;
		}
	}
	sqlite3_reset(s);
	c->cache_gen = gen;
	return 0;
}

sdb_store_coll *store_cache_find(sdb_store_conn *c, const char *db, const char *coll)
{
	for (size_t i = 0; i < c->n_colls; i++)
		if (strcmp(c->colls[i].db, db) == 0 && strcmp(c->colls[i].coll, coll) == 0)
			return &c->colls[i];
	return NULL;
}

int store_catalog_bump(sdb_store_conn *c, char *err, size_t errlen)
{
	sqlite3_stmt *s =
		store_stmt_get(c, "UPDATE meta SET v = v + 1 WHERE k='catalog_gen'", err, errlen);
	if (!s)
		return SDB_EIO;
	c->ddl = true;
	int rc = store_step_done(c, s, err, errlen, "catalog gen");
	if (rc)
		return rc;
	return store_cache_load(c, err, errlen);
}

/* ------------------------------------------------------------------ catalog */

static bool valid_name(const char *s, bool is_db)
{
	if (!s || !*s || strlen(s) > (is_db ? 63u : 200u))
		return false;
	for (const char *p = s; *p; p++) {
		if (*p == '\0' || *p == '$' || (is_db && (*p == '.' || *p == '/' || *p == ' ' ||
							 *p == '\\' || *p == '"')))
			return false;
	}
	return true;
}

int sdb_store_coll_get(sdb_store_conn *c, const char *db, const char *coll,
		       const sdb_store_coll **out, char *err, size_t errlen)
{
	*out = store_cache_find(c, db, coll);
	if (!*out)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns %s.%s not found", db, coll);
	return 0;
}

static void gen_uuid(sdb_store_conn *c, uint8_t out[16])
{
	/* bson_oid_t has 12 bytes of randomness + counter; fill the rest from it twice
	 * (inside a replicated apply both come from the entry's seed: the same on every
	 * member). */
	bson_oid_t a, b;
	sdb_store_new_oid(c, &a);
	sdb_store_new_oid(c, &b);
	memcpy(out, a.bytes + 4, 8);
	memcpy(out + 8, b.bytes + 4, 8);
	if (!c->apply)
		for (int i = 0; i < 16; i++)
			out[i] ^= (uint8_t)(rand() & 0xff);
	out[6] = (out[6] & 0x0f) | 0x40;
	out[8] = (out[8] & 0x3f) | 0x80;
}

/* A database already in the catalog whose name equals db but for ASCII case (MongoDB keeps
 * one spelling per database: DatabaseHolder's "db already exists with different case").
 * Returns true with its name in other. */
static bool db_case_conflict(sdb_store_conn *c, const char *db, char *other, size_t otherlen)
{
	static const char *const reserved[] = {"admin", "config", "local"};
	char err[128];
	bool found = false;

	/* the internal databases always exist on mongod: another spelling is refused even
	 * before they hold a collection */
	for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
		if (strcmp(db, reserved[i]) != 0 && strcasecmp(db, reserved[i]) == 0) {
			snprintf(other, otherlen, "%s", reserved[i]);
			return true;
		}
	sqlite3_stmt *s = store_stmt_get(c,
					 "SELECT db FROM catalog_coll WHERE db <> ?1 AND "
					 "lower(db) = lower(?1) LIMIT 1",
					 err, sizeof err);
	if (!s)
		return false;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	if (sqlite3_step(s) == SQLITE_ROW) {
		const unsigned char *t = sqlite3_column_text(s, 0);
		snprintf(other, otherlen, "%s", t ? (const char *)t : "");
		found = true;
	}
	sqlite3_reset(s);
	return found;
}

int sdb_store_coll_create(sdb_store_conn *c, const char *db, const char *coll,
			  const bson_t *options, const char *origin, const sdb_store_coll **out,
			  char *err, size_t errlen)
{
	char other[128];

	if (out)
		*out = NULL;
	c->write_code = 0;
	if (!valid_name(db, true))
		return sdb_errf(err, errlen, SDB_EINVAL, "Invalid database name: '%s'", db);
	if (!valid_name(coll, false))
		return sdb_errf(err, errlen, SDB_EINVAL, "Invalid collection name: %s", coll);
	sdb_store_coll *co = store_cache_find(c, db, coll);
	if (co) {
		if (out)
			*out = co;
		return sdb_errf(err, errlen, SDB_EEXISTS, "Collection %s.%s already exists.", db,
				coll);
	}
	/* not for a migration's or restore's writes (origin): they carry data the cluster
	 * already holds, and a chunk must reach its new owner even where two spellings
	 * already exist (created before this check, or on different shards) */
	if (origin == NULL && db_case_conflict(c, db, other, sizeof other)) {
		c->write_code = 13297; /* DatabaseDifferCase */
		return sdb_errf(err, errlen, SDB_EINVAL,
				"db already exists with different case already have: [%s] trying "
				"to create [%s]",
				other, db);
	}
	int64_t tbl = store_query_int(c, "SELECT v FROM meta WHERE k='next_tbl'", 1);
	char sql[160];
	snprintf(sql, sizeof sql,
		 "CREATE TABLE c_%lld(k BLOB PRIMARY KEY, doc BLOB NOT NULL) WITHOUT ROWID",
		 (long long)tbl);
	int rc = store_exec_sql(c->db, sql, err, errlen);
	if (rc)
		return rc;
	c->ddl = true;
	uint8_t uuid[16];
	gen_uuid(c, uuid);
	bson_t empty = BSON_INITIALIZER;
	const bson_t *opt = options ? options : &empty;
	sqlite3_stmt *s = store_stmt_get(c,
				   "INSERT INTO catalog_coll(db, coll, tbl, uuid, options) "
				   "VALUES(?, ?, ?, ?, ?)",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 3, tbl);
	sqlite3_bind_blob(s, 4, uuid, 16, SQLITE_STATIC);
	sqlite3_bind_blob(s, 5, bson_get_data(opt), (int)sdb_store_doc_len(opt), SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "catalog insert");
	if (rc)
		return rc;
	s = store_stmt_get(c, "UPDATE meta SET v = ? WHERE k='next_tbl'", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_int64(s, 1, tbl + 1);
	rc = store_step_done(c, s, err, errlen, "next_tbl");
	if (rc)
		return rc;
	rc = store_catalog_bump(c, err, errlen);
	if (rc)
		return rc;
	bson_t o = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&o, "create", coll);
	bson_iter_t it;
	if (options && bson_iter_init(&it, options)) {
		while (bson_iter_next(&it))
			bson_append_iter(&o, bson_iter_key(&it), -1, &it);
	}
	char *ns = sdb_asprintf("%s.$cmd", db);
	rc = store_oplog_append(c, "c", ns, uuid, &o, NULL, origin, err, errlen);
	free(ns);
	bson_destroy(&o);
	if (rc)
		return rc;
	if (out)
		*out = store_cache_find(c, db, coll);
	return 0;
}

int store_drop_table(sdb_store_conn *c, const char *prefix, int64_t tbl, char *err,
		      size_t errlen)
{
	char sql[96];
	store_stmt_forget_all(c);
	snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s_%lld", prefix, (long long)tbl);
	return store_exec_sql(c->db, sql, err, errlen);
}

/* Run sql (a DELETE with parameters db = ?1 AND coll = ?2) for db.coll.
 * Returns: 0, or SDB_EIO with the error in err. */
static int catalog_delete_ns(sdb_store_conn *c, const char *sql, const char *db,
			     const char *coll, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);

	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	return store_step_done(c, s, err, errlen, "catalog delete");
}

static int coll_drop_impl(sdb_store_conn *c, sdb_store_coll *co, const char *origin,
			  bool log, char *err, size_t errlen)
{
	int rc;
	char *db = sdb_strdup(co->db), *coll = sdb_strdup(co->coll);
	uint8_t uuid[16];
	memcpy(uuid, co->uuid, 16);
	for (size_t i = 0; i < co->n_indexes; i++) {
		rc = store_drop_table(c, "i", co->indexes[i].tbl, err, errlen);
		if (rc)
			goto out;
	}
	rc = store_drop_table(c, "c", co->tbl, err, errlen);
	if (rc)
		goto out;
	c->ddl = true;
	rc = catalog_delete_ns(c, "DELETE FROM catalog_coll WHERE db = ? AND coll = ?", db, coll,
			       err, errlen);
	if (rc)
		goto out;
	rc = catalog_delete_ns(c, "DELETE FROM catalog_index WHERE db = ? AND coll = ?", db, coll,
			       err, errlen);
	if (rc)
		goto out;
	rc = store_catalog_bump(c, err, errlen); /* co is invalid from here */
	if (rc || !log)
		goto out;
	bson_t o = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&o, "drop", coll);
	char *ns = sdb_asprintf("%s.$cmd", db);
	rc = store_oplog_append(c, "c", ns, uuid, &o, NULL, origin, err, errlen);
	free(ns);
	bson_destroy(&o);
out:
	free(db);
	free(coll);
	return rc;
}

int sdb_store_coll_drop(sdb_store_conn *c, const char *db, const char *coll,
			const char *origin, char *err, size_t errlen)
{
	sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	return coll_drop_impl(c, co, origin, true, err, errlen);
}

/* Move db.coll's catalog rows (sql: an UPDATE with parameters ?1 from_db, ?2 from_coll,
 * ?3 to_db, ?4 to_coll). Returns: 0, or SDB_EIO with the error in err. */
static int catalog_move_ns(sdb_store_conn *c, const char *sql, const char *from_db,
			   const char *from_coll, const char *to_db, const char *to_coll,
			   char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);

	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, from_db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, from_coll, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, to_db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 4, to_coll, -1, SQLITE_STATIC);
	return store_step_done(c, s, err, errlen, "catalog rename");
}

int sdb_store_coll_rename(sdb_store_conn *c, const char *from_db, const char *from_coll,
			  const char *to_db, const char *to_coll, bool drop_target,
			  bool stay_temp, const char *origin, char *err, size_t errlen)
{
	sdb_store_coll *co = store_cache_find(c, from_db, from_coll), *target;
	uint8_t uuid[16], target_uuid[16];
	bool dropped = false;
	int rc;

	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "Source collection %s.%s does not exist",
				from_db, from_coll);
	if (!valid_name(to_db, true))
		return sdb_errf(err, errlen, SDB_EINVAL, "Invalid database name: '%s'", to_db);
	if (!valid_name(to_coll, false))
		return sdb_errf(err, errlen, SDB_EINVAL, "Invalid collection name: %s", to_coll);
	if (strcmp(from_db, to_db) == 0 && strcmp(from_coll, to_coll) == 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "Can't rename a collection to itself");
	c->write_code = 0;
	{
		char other[128];

		if (origin == NULL && db_case_conflict(c, to_db, other, sizeof other)) {
			c->write_code = 13297; /* DatabaseDifferCase */
			return sdb_errf(err, errlen, SDB_EINVAL,
					"db already exists with different case already have: [%s] "
					"trying to create [%s]",
					other, to_db);
		}
	}
	memcpy(uuid, co->uuid, 16);
	target = store_cache_find(c, to_db, to_coll);
	if (target) {
		if (!drop_target)
			return sdb_errf(err, errlen, SDB_EEXISTS, "target namespace exists");
		memcpy(target_uuid, target->uuid, 16);
		/* the target's tables and rows go; the rename's one oplog entry says so
		 * (dropTarget: its UUID), as MongoDB's */
		rc = coll_drop_impl(c, target, origin, false, err, errlen);
		if (rc)
			return rc;
		dropped = true; /* co and target are invalid from here (cache reloaded) */
	}
	rc = catalog_move_ns(c,
			     "UPDATE catalog_coll SET db = ?3, coll = ?4 WHERE db = ?1 AND coll = ?2",
			     from_db, from_coll, to_db, to_coll, err, errlen);
	if (rc == 0)
		rc = catalog_move_ns(c,
				     "UPDATE catalog_index SET db = ?3, coll = ?4 WHERE db = ?1 AND "
				     "coll = ?2",
				     from_db, from_coll, to_db, to_coll, err, errlen);
	if (rc == 0)
		rc = store_catalog_bump(c, err, errlen);
	if (rc)
		return rc;
	/* MongoDB's oplog entry (OpObserverImpl::onRenameCollection): ns "<source db>.$cmd",
	 * ui the source's UUID, o {renameCollection, to, stayTemp, dropTarget?: UUID} */
	bson_t o = BSON_INITIALIZER;
	char *from_ns = sdb_asprintf("%s.%s", from_db, from_coll);
	char *to_ns = sdb_asprintf("%s.%s", to_db, to_coll);
	char *ns = sdb_asprintf("%s.$cmd", from_db);
	BSON_APPEND_UTF8(&o, "renameCollection", from_ns);
	BSON_APPEND_UTF8(&o, "to", to_ns);
	BSON_APPEND_BOOL(&o, "stayTemp", stay_temp);
	if (dropped)
		bson_append_binary(&o, "dropTarget", -1, BSON_SUBTYPE_UUID, target_uuid, 16);
	rc = store_oplog_append(c, "c", ns, uuid, &o, NULL, origin, err, errlen);
	bson_destroy(&o);
	free(from_ns);
	free(to_ns);
	free(ns);
	return rc;
}

int sdb_store_db_drop(sdb_store_conn *c, const char *db, const char *origin, int *n_dropped,
		      char *err, size_t errlen)
{
	*n_dropped = 0;
	for (;;) {
		sdb_store_coll *co = NULL;
		for (size_t i = 0; i < c->n_colls; i++)
			if (strcmp(c->colls[i].db, db) == 0)
				co = &c->colls[i];
		if (!co)
			break;
		/* each collection's own {drop} entry first, then {dropDatabase}, as mongod's
		 * oplog: a change stream on a collection sees drop then invalidate */
		int rc = coll_drop_impl(c, co, origin, true, err, errlen);
		if (rc)
			return rc;
		(*n_dropped)++;
	}
	if (*n_dropped == 0)
		return 0;
	bson_t o = BSON_INITIALIZER;
	BSON_APPEND_INT32(&o, "dropDatabase", 1);
	char *ns = sdb_asprintf("%s.$cmd", db);
	int rc = store_oplog_append(c, "c", ns, NULL, &o, NULL, origin, err, errlen);
	free(ns);
	bson_destroy(&o);
	return rc;
}

int sdb_store_coll_list(sdb_store_conn *c, const char *db, char ***names, size_t *n,
			char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	*names = NULL;
	*n = 0;
	size_t k = 0;
	for (size_t i = 0; i < c->n_colls; i++) {
		if (db && strcmp(c->colls[i].db, db) != 0)
			continue;
		*names = sdb_realloc(*names, (k + 1) * 2 * sizeof **names);
		(*names)[k * 2] = sdb_strdup(c->colls[i].db);
		(*names)[k * 2 + 1] = sdb_strdup(c->colls[i].coll);
		k++;
	}
	*n = k;
	return 0;
}

void sdb_store_names_free(char **names, size_t n)
{
	for (size_t i = 0; i < n * 2; i++)
		free(names[i]);
	free(names);
}

int sdb_store_coll_mod(sdb_store_conn *c, const char *db, const char *coll,
		       const bson_t *options, const char *index_name, const bson_t *index_spec,
		       const bson_t *oplog_o, const char *origin, char *err, size_t errlen)
{
	sdb_store_coll *co = store_cache_find(c, db, coll);
	sqlite3_stmt *s;
	uint8_t uuid[16];
	int rc;

	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns does not exist");
	memcpy(uuid, co->uuid, 16);
	if (options) {
		s = store_stmt_get(c, "UPDATE catalog_coll SET options = ? WHERE db = ? AND coll = ?",
				   err, errlen);
		if (!s)
			return SDB_EIO;
		sqlite3_bind_blob(s, 1, bson_get_data(options), (int)sdb_store_doc_len(options),
				  SQLITE_STATIC);
		sqlite3_bind_text(s, 2, db, -1, SQLITE_STATIC);
		sqlite3_bind_text(s, 3, coll, -1, SQLITE_STATIC);
		if ((rc = store_step_done(c, s, err, errlen, "collMod options")) != 0)
			return rc;
	}
	if (index_name && index_spec) {
		s = store_stmt_get(c,
				   "UPDATE catalog_index SET spec = ? WHERE db = ? AND coll = ? AND "
				   "name = ?",
				   err, errlen);
		if (!s)
			return SDB_EIO;
		sqlite3_bind_blob(s, 1, bson_get_data(index_spec),
				  (int)sdb_store_doc_len(index_spec), SQLITE_STATIC);
		sqlite3_bind_text(s, 2, db, -1, SQLITE_STATIC);
		sqlite3_bind_text(s, 3, coll, -1, SQLITE_STATIC);
		sqlite3_bind_text(s, 4, index_name, -1, SQLITE_STATIC);
		if ((rc = store_step_done(c, s, err, errlen, "collMod index")) != 0)
			return rc;
	}
	c->ddl = true;
	if ((rc = store_catalog_bump(c, err, errlen)) != 0)
		return rc;
	char *ns = sdb_asprintf("%s.$cmd", db);
	rc = store_oplog_append(c, "c", ns, uuid, oplog_o, NULL, origin, err, errlen);
	free(ns);
	return rc;
}
