/* Secondary indexes of the embedded shard engine: createIndexes / dropIndexes, index
 * tables of order-preserving keys (storage/keyenc.h) built over the existing documents,
 * unique checks and multikey marks, and the index entries of each document written
 * (store_indexes_add / _remove / _update). See store.h; internals in store_int.h. */
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
#include "storage/collation.h"
#include "storage/keyenc.h"
#include "storage/path.h"
#include "storage/store_int.h"
#include "common/bsonval.h"
#include "storage/matcher.h"

/* ------------------------------------------------------------------ indexes */

static int index_build(sdb_store_conn *c, const sdb_store_coll *co, sdb_store_index *ix,
		       sdb_store_dup *dup, int *code, char *err, size_t errlen);

int sdb_store_index_create(sdb_store_conn *c, const char *db, const char *coll,
			   const bson_t *spec, const char *origin, bool *created, int *mongo_code,
			   char *err, size_t errlen)
{
	*created = false;
	*mongo_code = 0;
	bson_iter_t it;
	const char *name = NULL;
	bson_t key;
	bool have_key = false, unique = false, sparse = false;
	if (bson_iter_init_find(&it, spec, "name") && BSON_ITER_HOLDS_UTF8(&it))
		name = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, spec, "key") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		have_key = bson_init_static(&key, data, len);
	}
	if (bson_iter_init_find(&it, spec, "unique"))
		unique = bson_iter_as_bool(&it);
	if (bson_iter_init_find(&it, spec, "sparse"))
		sparse = bson_iter_as_bool(&it);
	if (!have_key || bson_count_keys(&key) == 0) {
		*mongo_code = 67; /* CannotCreateIndex */
		return sdb_errf(err, errlen, SDB_EINVAL, "Index keys cannot be empty.");
	}
	if (!name) {
		*mongo_code = 9;
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Error in specification %s :: caused by :: The 'name' field is a "
				"required property of an index specification",
				"{}");
	}
	int rc = store_key_check_pattern(&key, err, errlen);
	if (rc) {
		*mongo_code = 67;
		return rc;
	}
	bool hashed = store_key_hashed_field(&key) != NULL;
	if (hashed && unique) {
		*mongo_code = 16764;
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Currently hashed indexes cannot guarantee uniqueness. Use a "
				"regular index.");
	}
	if (bson_iter_init_find(&it, spec, "expireAfterSeconds")) {
		/* a TTL index (expired documents are deleted by the shard's TTL monitor,
		 * src/shard/ttl.c): MongoDB's rules */
		double v = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_double(&it) : -1;
		if (!BSON_ITER_HOLDS_NUMBER(&it) || v != v || v < 0 || v > 2147483647.0) {
			*mongo_code = 67;
			return sdb_errf(err, errlen, SDB_EINVAL,
					"TTL index 'expireAfterSeconds' option must be within an "
					"acceptable range, try a lower number");
		}
		if (bson_count_keys(&key) != 1) {
			*mongo_code = 67;
			return sdb_errf(err, errlen, SDB_EINVAL,
					"TTL indexes are single-field indexes, compound indexes do "
					"not support TTL");
		}
		if (bson_iter_init_find(&it, &key, "_id")) {
			*mongo_code = 67;
			return sdb_errf(err, errlen, SDB_EINVAL,
					"The field 'expireAfterSeconds' is not valid for an _id index "
					"specification");
		}
	}
	/* partialFilterExpression (issue #20, storage/partial.c): MongoDB 6.0's operators */
	bson_iter_t pfe;
	bool partial = bson_iter_init_find(&pfe, spec, "partialFilterExpression");
	if (partial) {
		rc = store_partial_check(&pfe, mongo_code, err, errlen);
		if (rc)
			return rc;
		if (sparse) {
			*mongo_code = 67;
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cannot mix \"partialFilterExpression\" and \"sparse\" "
					"options");
		}
	}
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co) {
		rc = sdb_store_coll_create(c, db, coll, NULL, origin, &co, err, errlen);
		if (rc) {
			*mongo_code = c->write_code; /* 13297 DatabaseDifferCase, else 0 */
			return rc;
		}
	}
	/* the index's collation (issue #20): its own `collation`, else the collection's
	 * default, as MongoDB; stored as the full spec, none when simple */
	const sdb_collator *icoll = NULL;
	/* v: 1 or 2 (src/shard/cmd_admin.c checked it), stored as given; a v: 1 index does
	 * not inherit the collection's collation (mongod's validateIndexSpecCollation) */
	int version = 2;
	if (bson_iter_init_find(&it, spec, "v") && BSON_ITER_HOLDS_NUMBER(&it) &&
	    bson_iter_as_double(&it) == 1.0)
		version = 1;
	bool have_coll = bson_iter_init_find(&it, spec, "collation");
	if (have_coll ||
	    (version == 2 && bson_iter_init_find(&it, co->options, "collation"))) {
		int ccode = 0;
		rc = sdb_collation_parse(&it, &icoll, &ccode, err, errlen);
		if (rc) {
			*mongo_code = ccode ? ccode : 2;
			return rc;
		}
	}
	if (icoll && hashed) {
		*mongo_code = 238;
		return sdb_errf(err, errlen, SDB_EINVAL,
				"collation is not supported by stripedb on a hashed index (only "
				"{locale: \"simple\"}; see docs/compat.md)");
	}
	/* _id index: only {_id: 1} named _id_ is accepted (exists already). */
	bool is_id_key = bson_count_keys(&key) == 1 && bson_iter_init_find(&it, &key, "_id") &&
			 !hashed; /* {_id: "hashed"} is an ordinary secondary index */
	if (strcmp(name, "_id_") == 0 || is_id_key) {
		if (strcmp(name, "_id_") == 0 && is_id_key)
			return SDB_EEXISTS;
		if (is_id_key && !unique && strcmp(name, "_id_") != 0) {
			*mongo_code = 85;
			return sdb_errf(err, errlen, SDB_ECONFLICT,
					"Index already exists with a different name: _id_");
		}
		*mongo_code = 67;
		return sdb_errf(err, errlen, SDB_EINVAL, "cannot create an index named _id_");
	}
	for (size_t i = 0; i < co->n_indexes; i++) {
		const sdb_store_index *ix = &co->indexes[i];
		bool same_key = bson_equal(ix->key, &key);
		bool same_name = strcmp(ix->name, name) == 0;
		bool same_coll = ix->coll == icoll ||
				 (ix->coll && icoll &&
				  bson_equal(sdb_collator_spec(ix->coll), sdb_collator_spec(icoll)));
		/* key pattern, collation and partial filter identify an index (MongoDB's
		 * IndexDescriptor::compareIndexOptions): two indexes may share a key pattern
		 * when their filters differ */
		bson_iter_t ipfe;
		bool ipartial = bson_iter_init_find(&ipfe, ix->spec, "partialFilterExpression");
		bool same_partial = ipartial == partial &&
				    (!partial || store_partial_same(&ipfe, &pfe));
		if (same_key && same_name) {
			if (ix->unique != unique || ix->sparse != sparse || !same_coll ||
			    !same_partial) {
				*mongo_code = 86; /* IndexKeySpecsConflict */
				return sdb_errf(err, errlen, SDB_ECONFLICT,
						"An existing index has the same name as the "
						"requested index but different options. Requested "
						"index name: %s",
						name);
			}
			return SDB_EEXISTS;
		}
		if (same_name) {
			*mongo_code = 86;
			return sdb_errf(err, errlen, SDB_ECONFLICT,
					"An existing index has the same name as the requested "
					"index. When index names are not specified, they are "
					"auto generated and can cause conflicts. Please refer to "
					"our documentation. Requested index name: %s",
					name);
		}
		if (same_key && same_coll && same_partial) {
			*mongo_code = 85; /* IndexOptionsConflict */
			return sdb_errf(err, errlen, SDB_ECONFLICT,
					"Index already exists with a different name: %s",
					ix->name);
		}
	}
	int64_t tbl = store_query_int(c, "SELECT v FROM meta WHERE k='next_tbl'", 1);
	char sql[160];
	snprintf(sql, sizeof sql,
		 "CREATE TABLE i_%lld(k BLOB NOT NULL, id BLOB NOT NULL, PRIMARY KEY(k, id)) "
		 "WITHOUT ROWID",
		 (long long)tbl);
	rc = store_exec_sql(c->db, sql, err, errlen);
	if (rc)
		return rc;
	c->ddl = true;
	/* stored spec: {v: 1 or 2, key, name, ...the rest as given} */
	bson_t stored = BSON_INITIALIZER;
	BSON_APPEND_INT32(&stored, "v", version);
	BSON_APPEND_DOCUMENT(&stored, "key", &key);
	BSON_APPEND_UTF8(&stored, "name", name);
	if (bson_iter_init(&it, spec)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "key") == 0 || strcmp(k, "name") == 0 ||
			    strcmp(k, "v") == 0 || strcmp(k, "ns") == 0 ||
			    strcmp(k, "collation") == 0)
				continue;
			bson_append_iter(&stored, k, -1, &it);
		}
	}
	if (icoll)
		BSON_APPEND_DOCUMENT(&stored, "collation", sdb_collator_spec(icoll));
	sqlite3_stmt *s = store_stmt_get(c,
				   "INSERT INTO catalog_index(db, coll, name, tbl, spec) "
				   "VALUES(?, ?, ?, ?, ?)",
				   err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 4, tbl);
	sqlite3_bind_blob(s, 5, bson_get_data(&stored), (int)stored.len, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "catalog index");
	if (rc)
		goto out;
	s = store_stmt_get(c, "UPDATE meta SET v = ? WHERE k='next_tbl'", err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_int64(s, 1, tbl + 1);
	rc = store_step_done(c, s, err, errlen, "next_tbl");
	if (rc)
		goto out;
	rc = store_catalog_bump(c, err, errlen);
	if (rc)
		goto out;
	co = store_cache_find(c, db, coll);
	const sdb_store_index *ix = NULL;
	for (size_t i = 0; co && i < co->n_indexes; i++)
		if (strcmp(co->indexes[i].name, name) == 0)
			ix = &co->indexes[i];
	if (!ix) {
		rc = sdb_errf(err, errlen, SDB_EINTERNAL, "index vanished");
		goto out;
	}
	sdb_store_dup dup = {0};
	int build_code = 0;
	rc = index_build(c, co, (sdb_store_index *)ix, &dup, &build_code, err, errlen);
	if (rc == SDB_EEXISTS)
		*mongo_code = 11000;
	else if (rc && build_code)
		*mongo_code = build_code; /* 171 parallel arrays, 16766 an array for a hashed index */
	sdb_store_dup_clear(&dup);
	if (rc)
		goto out;
	bson_t o = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&o, "createIndexes", coll);
	if (bson_iter_init(&it, &stored)) {
		while (bson_iter_next(&it))
			bson_append_iter(&o, bson_iter_key(&it), -1, &it);
	}
	char *ns = sdb_asprintf("%s.$cmd", db);
	rc = store_oplog_append(c, "c", ns, co->uuid, &o, NULL, origin, err, errlen);
	free(ns);
	bson_destroy(&o);
	if (rc == 0)
		*created = true;
out:
	bson_destroy(&stored);
	return rc;
}

/* Index every document of co in ix. *code: the MongoDB code of a document's key error. */
static int index_build(sdb_store_conn *c, const sdb_store_coll *co, sdb_store_index *ix,
		       sdb_store_dup *dup, int *code, char *err, size_t errlen)
{
	char sql[96];
	snprintf(sql, sizeof sql, "SELECT k, doc FROM c_%lld ORDER BY k", (long long)co->tbl);
	sqlite3_stmt *s = NULL;
	/* a private statement: index_insert_keys uses the cache meanwhile */
	if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK)
		return store_sqlerr(c->db, err, errlen, "index build");
	int rc = 0, r;
	sdb_key idk;
	sdb_key_init(&idk);
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		bson_t doc;
		if (!bson_init_static(&doc, sqlite3_column_blob(s, 1),
				      (size_t)sqlite3_column_bytes(s, 1))) {
			rc = sdb_errf(err, errlen, SDB_ECORRUPT, "corrupt document in %s.%s",
				      co->db, co->coll);
			break;
		}
		if (!store_partial_covers(ix, &doc))
			continue; /* outside the partial filter: no entry */
		sdb_key_reset(&idk);
		sdb_key_append(&idk, sqlite3_column_blob(s, 0),
				     (size_t)sqlite3_column_bytes(s, 0));
		store_keyset ks;
		store_keyset_init(&ks);
		bool missing = false, multikey = false;
		rc = store_key_index_keys(ix->key, ix->coll, &doc, &ks, &missing, &multikey, code, err,
					  errlen);
		if (rc == 0 && multikey && !ix->multikey)
			rc = store_index_mark_multikey(c, co, ix, err, errlen);
		if (rc == 0 && !(ix->sparse && missing))
			rc = store_index_insert_keys(c, co, ix, &ks, &idk, &doc, dup, err, errlen);
		store_keyset_destroy(&ks);
		if (rc)
			break;
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = store_sqlerr(c->db, err, errlen, "index build");
	sdb_key_free(&idk);
	sqlite3_finalize(s);
	return rc;
}

int sdb_store_index_drop(sdb_store_conn *c, const char *db, const char *coll,
			 const char *name, const char *origin, char *err, size_t errlen)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found %s.%s", db, coll);
	if (strcmp(name, "_id_") == 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "cannot drop _id index");
	const sdb_store_index *ix = NULL;
	for (size_t i = 0; i < co->n_indexes; i++)
		if (strcmp(co->indexes[i].name, name) == 0)
			ix = &co->indexes[i];
	if (!ix)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "index not found with name [%s]",
				name);
	uint8_t uuid[16];
	memcpy(uuid, co->uuid, 16);
	int rc = store_drop_table(c, "i", ix->tbl, err, errlen);
	if (rc)
		return rc;
	c->ddl = true;
	sqlite3_stmt *s = store_stmt_get(
		c, "DELETE FROM catalog_index WHERE db = ? AND coll = ? AND name = ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, name, -1, SQLITE_TRANSIENT);
	rc = store_step_done(c, s, err, errlen, "catalog index delete");
	if (rc)
		return rc;
	bson_t o = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&o, "dropIndexes", coll);
	BSON_APPEND_UTF8(&o, "index", name);
	rc = store_catalog_bump(c, err, errlen);
	if (rc == 0) {
		char *ns = sdb_asprintf("%s.$cmd", db);
		rc = store_oplog_append(c, "c", ns, uuid, &o, NULL, origin, err, errlen);
		free(ns);
	}
	bson_destroy(&o);
	return rc;
}

/* Empty and rebuild the partial indexes of one collection (store_partial_rebuild). */
static int partial_rebuild_coll(sdb_store_conn *c, sdb_store_coll *co, char *err, size_t errlen)
{
	int rc = 0;

	for (size_t i = 0; rc == 0 && i < co->n_indexes; i++) {
		sdb_store_index *ix = &co->indexes[i];
		char sql[64];

		if (!ix->partial)
			continue;
		snprintf(sql, sizeof sql, "DELETE FROM i_%lld", (long long)ix->tbl);
		rc = store_exec_sql(c->db, sql, err, errlen);
		if (rc == 0) {
			/* a subset of a unique index's entries: no duplicate can appear */
			int code = 0;
			rc = index_build(c, co, ix, NULL, &code, err, errlen);
		}
		if (rc == 0)
			sdb_info("store: partial index rebuilt", "ns=%s.%s index=%s", co->db, co->coll,
				 ix->name);
	}
	return rc;
}

int store_partial_rebuild(sdb_store *st, char *err, size_t errlen)
{
	return store_upgrade_once(st, "partial_idx", 1, partial_rebuild_coll, NULL, NULL, err,
				  errlen);
}

/* ------------------------------------------------------------------ index entries of
 * a document (moved from store.c: inserting, removing and updating a document's keys) */

/* "{ a: 1, b: \"x\" }" as MongoDB prints dup keys. */
static char *format_dup_key(const bson_t *kv)
{
	bson_string_t *s = bson_string_new("{ ");
	bson_iter_t it;
	bool first = true;
	if (bson_iter_init(&it, kv)) {
		while (bson_iter_next(&it)) {
			bson_t one = BSON_INITIALIZER;
			bson_append_iter(&one, "v", 1, &it);
			size_t len;
			char *js = bson_as_relaxed_extended_json(&one, &len);
			/* js is `{ "v" : VALUE }` */
			const char *v = js ? strstr(js, ": ") : NULL;
			bson_string_append_printf(s, "%s%s: ", first ? "" : ", ",
						  bson_iter_key(&it));
			if (v && len >= 2) {
				v += 2;
				size_t vlen = strlen(v);
				if (vlen >= 2)
					vlen -= 2; /* strip " }" */
				char *tmp = sdb_strndup(v, vlen);
				bson_string_append(s, tmp);
				free(tmp);
			}
			bson_free(js);
			bson_destroy(&one);
			first = false;
		}
	}
	bson_string_append(s, first ? "}" : " }");
	return bson_string_free(s, false);
}

/* (store_int.h) */
void store_dup_fill(sdb_store_dup *dup, const char *db, const char *coll, const char *index,
		     const bson_t *pattern, const bson_t *value)
{
	if (!dup)
		return;
	sdb_store_dup_clear(dup);
	char *k = format_dup_key(value);
	dup->errmsg = sdb_asprintf("E11000 duplicate key error collection: %s.%s index: %s "
				   "dup key: %s",
				   db, coll, index, k);
	free(k);
	bson_copy_to(pattern, &dup->key_pattern);
	bson_copy_to(value, &dup->key_value);
	dup->set = true;
}


/* Index keys of doc for index ix: a set of encoded keys (multikey expands arrays). */
int store_index_keys(const sdb_store_index *ix, const bson_t *doc, store_keyset *ks,
		      bool *all_missing, char *err, size_t errlen)
{
	return store_key_index_keys(ix->key, ix->coll, doc, ks, all_missing, NULL, NULL, err, errlen);
}

/* Record that ix became multikey (in this transaction; the cache entry is updated in
 * place, other connections reload the catalog at their next transaction; a rollback of
 * this one drops this connection's cache: c->cache_touched). */
int store_index_mark_multikey(sdb_store_conn *c, const sdb_store_coll *co,
			       sdb_store_index *ix, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c,
				   "UPDATE catalog_index SET multikey = 1 WHERE db = ? AND coll = ? "
				   "AND name = ?",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, co->db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, co->coll, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 3, ix->name, -1, SQLITE_STATIC);
	int rc = store_step_done(c, s, err, errlen, "multikey");
	if (rc)
		return rc;
	s = store_stmt_get(c, "UPDATE meta SET v = v + 1 WHERE k='catalog_gen'", err, errlen);
	if (!s)
		return SDB_EIO;
	rc = store_step_done(c, s, err, errlen, "catalog gen");
	if (rc == 0) {
		ix->multikey = true;
		c->cache_touched = true; /* a rollback drops the cache (sdb_store_rollback) */
	}
	return rc;
}

int store_index_insert_keys(sdb_store_conn *c, const sdb_store_coll *co,
			     const sdb_store_index *ix, const store_keyset *ks,
			     const sdb_key *idk, const bson_t *doc, sdb_store_dup *dup,
			     char *err, size_t errlen)
{
	char sql[160];
	for (size_t i = 0; i < ks->n; i++) {
		if (ix->unique) {
			snprintf(sql, sizeof sql,
				 "SELECT 1 FROM i_%lld WHERE k = ? AND id <> ? LIMIT 1",
				 (long long)ix->tbl);
			sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
			if (!s)
				return SDB_EIO;
			sqlite3_bind_blob(s, 1, ks->keys[i].data, (int)ks->keys[i].len,
					  SQLITE_STATIC);
			sqlite3_bind_blob(s, 2, idk->data, (int)idk->len, SQLITE_STATIC);
			int r = sqlite3_step(s);
			sqlite3_reset(s);
			if (r == SQLITE_ROW) {
				bson_t kv;
				if (!store_key_dup_value_of(ix->key, doc, ks->keys[i].data,
							    ks->keys[i].len, &kv)) {
					bson_destroy(&kv);
					store_key_dup_value(ix->key, doc, &kv);
				}
				store_dup_fill(dup, co->db, co->coll, ix->name, ix->key, &kv);
				bson_destroy(&kv);
				return sdb_errf(err, errlen, SDB_EEXISTS, "%s",
						dup ? dup->errmsg : "duplicate key");
			}
			if (r != SQLITE_DONE)
				return store_sqlerr(c->db, err, errlen, "unique check");
		}
		snprintf(sql, sizeof sql, "INSERT OR IGNORE INTO i_%lld(k, id) VALUES(?, ?)",
			 (long long)ix->tbl);
		sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
		if (!s)
			return SDB_EIO;
		sqlite3_bind_blob(s, 1, ks->keys[i].data, (int)ks->keys[i].len, SQLITE_STATIC);
		sqlite3_bind_blob(s, 2, idk->data, (int)idk->len, SQLITE_STATIC);
		int rc = store_step_done(c, s, err, errlen, "index insert");
		if (rc)
			return rc;
	}
	return 0;
}

static int index_delete_keys(sdb_store_conn *c, const sdb_store_index *ix,
			     const store_keyset *ks, const sdb_key *idk, char *err,
			     size_t errlen)
{
	char sql[128];
	snprintf(sql, sizeof sql, "DELETE FROM i_%lld WHERE k = ? AND id = ?",
		 (long long)ix->tbl);
	for (size_t i = 0; i < ks->n; i++) {
		sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
		if (!s)
			return SDB_EIO;
		sqlite3_bind_blob(s, 1, ks->keys[i].data, (int)ks->keys[i].len, SQLITE_STATIC);
		sqlite3_bind_blob(s, 2, idk->data, (int)idk->len, SQLITE_STATIC);
		int rc = store_step_done(c, s, err, errlen, "index delete");
		if (rc)
			return rc;
	}
	return 0;
}

int store_indexes_add(sdb_store_conn *c, sdb_store_coll *co, const bson_t *doc,
		       const sdb_key *idk, sdb_store_dup *dup, char *err, size_t errlen)
{
	for (size_t i = 0; i < co->n_indexes; i++) {
		sdb_store_index *ix = &co->indexes[i];
		if (!store_partial_covers(ix, doc))
			continue; /* a partial index holds only the documents its filter matches */
		store_keyset ks;
		store_keyset_init(&ks);
		bool missing = false, multikey = false;
		int rc = store_key_index_keys(ix->key, ix->coll, doc, &ks, &missing, &multikey,
					      &c->write_code, err, errlen);
		if (rc == 0 && multikey && !ix->multikey)
			rc = store_index_mark_multikey(c, co, ix, err, errlen);
		if (rc == 0 && !(ix->sparse && missing))
			rc = store_index_insert_keys(c, co, ix, &ks, idk, doc, dup, err, errlen);
		store_keyset_destroy(&ks);
		if (rc)
			return rc;
	}
	return 0;
}

int store_indexes_remove(sdb_store_conn *c, const sdb_store_coll *co, const bson_t *doc,
			  const sdb_key *idk, char *err, size_t errlen)
{
	for (size_t i = 0; i < co->n_indexes; i++) {
		const sdb_store_index *ix = &co->indexes[i];
		if (!store_partial_covers(ix, doc))
			continue; /* never indexed (store_indexes_add) */
		store_keyset ks;
		store_keyset_init(&ks);
		bool missing = false;
		int rc = store_index_keys(ix, doc, &ks, &missing, err, errlen);
		if (rc == 0)
			rc = index_delete_keys(c, ix, &ks, idk, err, errlen);
		store_keyset_destroy(&ks);
		if (rc)
			return rc;
	}
	return 0;
}

/* Whether two keysets hold the same keys in the same order. */
static bool keysets_equal(const store_keyset *a, const store_keyset *b)
{
	if (a->n != b->n)
		return false;
	for (size_t i = 0; i < a->n; i++)
		if (a->keys[i].len != b->keys[i].len ||
		    memcmp(a->keys[i].data, b->keys[i].data, a->keys[i].len) != 0)
			return false;
	return true;
}

/* Index maintenance of the document with _id key idk replaced, old_doc (the stored image)
 * by new_doc: store_indexes_remove of old_doc then store_indexes_add of new_doc, except
 * that an index whose entries stay the same (the document in it before and after with the
 * same keys in the same order, or in it neither before nor after: partial filter, sparse)
 * is not written; it is still marked multikey when new_doc makes it so. Errors: theirs. */
int store_indexes_update(sdb_store_conn *c, sdb_store_coll *co, const bson_t *old_doc,
			  const bson_t *new_doc, const sdb_key *idk, sdb_store_dup *dup,
			  char *err, size_t errlen)
{
	for (size_t i = 0; i < co->n_indexes; i++) {
		sdb_store_index *ix = &co->indexes[i];
		bool old_cov = store_partial_covers(ix, old_doc);
		bool new_cov = store_partial_covers(ix, new_doc);
		bool old_missing = false, new_missing = false, multikey = false;
		store_keyset oks, nks;
		int rc = 0;

		store_keyset_init(&oks);
		store_keyset_init(&nks);
		if (old_cov)
			rc = store_index_keys(ix, old_doc, &oks, &old_missing, err, errlen);
		if (rc == 0 && new_cov)
			rc = store_key_index_keys(ix->key, ix->coll, new_doc, &nks, &new_missing,
						  &multikey, &c->write_code, err, errlen);
		if (rc == 0 && multikey && !ix->multikey)
			rc = store_index_mark_multikey(c, co, ix, err, errlen);
		bool old_in = old_cov && !(ix->sparse && old_missing);
		bool new_in = new_cov && !(ix->sparse && new_missing);
		if (rc == 0 && !(old_in == new_in && (!old_in || keysets_equal(&oks, &nks)))) {
			if (old_cov)
				rc = index_delete_keys(c, ix, &oks, idk, err, errlen);
			if (rc == 0 && new_in)
				rc = store_index_insert_keys(c, co, ix, &nks, idk, new_doc, dup,
							     err, errlen);
		}
		store_keyset_destroy(&oks);
		store_keyset_destroy(&nks);
		if (rc)
			return rc;
	}
	return 0;
}
