/* One-time upgrades of a store written by an earlier release: their common frame
 * (store_upgrade_once: one write transaction, a meta flag that says it is done, one step
 * per collection), and the re-key of a store written before Decimal128 compared exactly
 * (issue #20): store_migrate_decimal_keys (store_int.h). Both upgrades (the other is
 * index.c's store_partial_rebuild) run in sdb_store_open and after a snapshot install
 * (copy.c). */
#include "storage/store.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonval.h"
#include "common/err.h"
#include "storage/keyenc.h"
#include "storage/store_int.h"

int store_upgrade_once(sdb_store *st, const char *flag, int done, store_upgrade_fn coll,
		       const char *finish_sql, const char *fail_what, char *err, size_t errlen)
{
	sdb_store_conn *c = NULL;
	char sql[96], val[24];
	int rc = sdb_store_conn_open(st, &c, err, errlen);

	if (rc)
		return rc;
	rc = sdb_store_begin(c, true, err, errlen);
	if (rc)
		goto out;
	snprintf(sql, sizeof sql, "SELECT v FROM meta WHERE k='%s'", flag);
	if (store_query_int(c, sql, 0) >= done) {
		sdb_store_rollback(c);
		goto out;
	}
	rc = store_cache_load(c, err, errlen);
	for (size_t ci = 0; rc == 0 && ci < c->n_colls; ci++)
		rc = coll(c, &c->colls[ci], err, errlen);
	snprintf(val, sizeof val, "%d", done);
	if (rc == 0)
		rc = sdb_store_meta_put(c, flag, val, err, errlen);
	if (rc == 0 && finish_sql != NULL)
		rc = store_exec_cached(c, finish_sql, err, errlen);
	if (rc == 0) {
		rc = sdb_store_commit(c, err, errlen);
	} else if (fail_what == NULL) {
		sdb_store_rollback(c);
	} else {
		char why[400];

		snprintf(why, sizeof why, "%s", err);
		sdb_store_rollback(c);
		sdb_errf(err, errlen, rc, "store: %s failed, store left as it was: %s", fail_what,
			 why);
	}
out:
	sdb_store_conn_close(c);
	return rc;
}

/* True when the document holds a Decimal128 anywhere (nested documents and arrays too). */
static bool doc_has_decimal(bson_iter_t *it, int depth)
{
	while (bson_iter_next(it)) {
		bson_iter_t child;

		if (BSON_ITER_HOLDS_DECIMAL128(it))
			return true;
		if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) &&
		    depth < SDB_BSON_MAX_DEPTH && bson_iter_recurse(it, &child) &&
		    doc_has_decimal(&child, depth + 1))
			return true;
	}
	return false;
}

/* The re-key of one collection (store_migrate_decimal_keys): every document holding a
 * decimal gets its exact _id key and index entries. */
static int rekey_coll(sdb_store_conn *c, sdb_store_coll *co, char *err, size_t errlen)
{
	int rc = 0;
	char sql[160], sel[160];
	sdb_key *oldk = NULL;
	size_t n = 0, cap = 0;

	snprintf(sql, sizeof sql, "SELECT k, doc FROM c_%lld", (long long)co->tbl);
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	if (!s)
		return SDB_EIO;
	while (sqlite3_step(s) == SQLITE_ROW) {
		bson_t doc;
		bson_iter_t it;

		if (!bson_init_static(&doc, sqlite3_column_blob(s, 1),
				      (size_t)sqlite3_column_bytes(s, 1)) ||
		    !bson_iter_init(&it, &doc) || !doc_has_decimal(&it, 0))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			oldk = sdb_realloc(oldk, cap * sizeof *oldk);
		}
		sdb_key_init(&oldk[n]);
		sdb_key_append(&oldk[n], sqlite3_column_blob(s, 0),
			       (size_t)sqlite3_column_bytes(s, 0));
		n++;
	}
	sqlite3_reset(s);
	snprintf(sel, sizeof sel, "SELECT doc FROM c_%lld WHERE k = ?", (long long)co->tbl);
	for (size_t i = 0; i < n; i++) {
		sdb_key newk;
		bson_iter_t id_it;
		bson_t *doc = NULL;

		sdb_key_init(&newk);
		if (rc == 0) {
			s = store_stmt_get(c, sel, err, errlen);
			if (!s) {
				rc = SDB_EIO;
			} else {
				sqlite3_bind_blob(s, 1, oldk[i].data, (int)oldk[i].len,
						  SQLITE_STATIC);
				if (sqlite3_step(s) == SQLITE_ROW)
					doc = bson_new_from_data(
						sqlite3_column_blob(s, 0),
						(size_t)sqlite3_column_bytes(s, 0));
				sqlite3_reset(s);
				if (!doc)
					rc = sdb_errf(err, errlen, SDB_ECORRUPT,
						      "decimal re-key: a document vanished or "
						      "does not parse");
			}
		}
		if (rc == 0)
			rc = store_id_key(doc, &newk, &id_it, NULL, err, errlen);
		if (rc == 0) {
			bool prev = sdb_keyenc_legacy_numbers(true);

			rc = store_indexes_remove(c, co, doc, &oldk[i], err, errlen);
			sdb_keyenc_legacy_numbers(prev);
		}
		if (rc == 0 && sdb_key_cmp(&newk, &oldk[i]) != 0) {
			snprintf(sql, sizeof sql, "UPDATE c_%lld SET k = ? WHERE k = ?",
				 (long long)co->tbl);
			s = store_stmt_get(c, sql, err, errlen);
			if (!s) {
				rc = SDB_EIO;
			} else {
				sqlite3_bind_blob(s, 1, newk.data, (int)newk.len, SQLITE_STATIC);
				sqlite3_bind_blob(s, 2, oldk[i].data, (int)oldk[i].len,
						  SQLITE_STATIC);
				rc = store_step_done(c, s, err, errlen, "decimal re-key: _id");
			}
		}
		if (rc == 0)
			rc = store_indexes_add(c, co, doc, &newk, NULL, err, errlen);
		sdb_key_free(&newk);
		sdb_key_free(&oldk[i]);
		if (doc)
			bson_destroy(doc);
	}
	free(oldk);
	return rc;
}

/* Stores written before Decimal128 compared exactly (meta 'keyenc' absent) keyed decimals
 * through long double: re-key every document holding a decimal (its _id key, and its
 * entries in every index, hashed ones included) with the exact encoding, once, then set
 * meta keyenc = 2.
 * - Atomic: one SQLite write transaction; a crash (SIGKILL, power) anywhere before its
 *   commit leaves the store as it was (WAL), and the next open starts over. No entry can
 *   be lost or duplicated half-way.
 * - No collisions: the exact order is finer than the old one, so no new duplicate can
 *   appear, and the new keys of decimals that need more than 64 bits (frac bit 0 set)
 *   never equal an old key, so re-keyed rows never collide with rows not yet visited.
 * - Old index entries are found by their keys, recomputed in the old encoding
 *   (sdb_keyenc_legacy_numbers), and deleted through the (k, id) primary key: no index
 *   table scan per document (absent keys delete nothing). A partial index is skipped for
 *   a document its filter does not match (store_indexes_remove); a file this old was
 *   written when partial indexes were built whole, so store_partial_rebuild, which
 *   sdb_store_open runs right after this, rebuilds every partial index from scratch.
 * - Cost: one pass over every collection's documents (each parsed once to look for a
 *   decimal), memory for the _id keys of the documents holding one (the documents are
 *   read again one by one), index work only for those documents; the WAL grows by the
 *   rewritten rows until the commit's checkpoint.
 * - Replica sets: every member runs this on its own store at open, deterministically
 *   (the keys are functions of the documents); the Raft log carries documents, never
 *   keys, so a member's store ends the same whichever encoding it had, as long as every
 *   member compares decimals alike: a set mixing earlier members (long-double order) with
 *   these can apply a unique-key entry differently (docs/operations.md: upgrade such sets
 *   all members at once). A snapshot copied
 *   from another member (sdb_store_replace_from, storage/copy.c) runs it again when the
 *   copy came from a member of an older release. */
int store_migrate_decimal_keys(sdb_store *st, char *err, size_t errlen)
{
	/* A failure (e.g. a unique partial index whose filter admits, by exact value, a
	 * document the old order kept out and that duplicates another's key) changes nothing:
	 * the store does not open, the message says why (fix the data with the old binary). */
	return store_upgrade_once(st, "keyenc", 2, rekey_coll,
				  "UPDATE meta SET v = 2 WHERE k = 'format'",
				  "re-keying Decimal128 keys to the exact order (format 2)", err, errlen);
}
