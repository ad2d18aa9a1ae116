/* Unit tests of storage/store.c: documents, the oplog (ts from an injected clock, restarts,
 * capping, document keys), version tokens, decimal key migration, renames, sessions,
 * replicated applies, and the integrity check's oplog cross-check. Indexes and the
 * planner: test_storage_index.c. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/store.c"
#include "../../storage/query.c"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/err.h"
#include "routing/route.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/query.h"
#include "storage/store.h"

#include "store_fixture.h"

static uint64_t ts_of(const bson_t *e)
{
	bson_iter_t it;
	uint32_t t = 0, i = 0;
	assert_true(bson_iter_init_find(&it, e, "ts"));
	bson_iter_timestamp(&it, &t, &i);
	return sdb_store_ts_pack(t, i);
}

static void test_crud_and_oplog(void **state)
{
	fx *f = *state;
	begin_w(f);
	assert_int_equal(insert(f, 1, 10, NULL), 0);
	assert_int_equal(insert(f, 2, 20, NULL), 0);
	commit(f);
	begin_w(f);
	bson_t *old = doc_id_a(1, 10), *neu = doc_id_a(1, 11);
	assert_int_equal(sdb_store_replace(f->c, "db", "c", old, neu, "mig-1", NULL, f->err,
					   sizeof f->err),
			 0);
	assert_int_equal(sdb_store_delete(f->c, "db", "c", neu, NULL, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_delete(f->c, "db", "c", neu, NULL, f->err, sizeof f->err),
			 SDB_ENOTFOUND);
	commit(f);
	bson_destroy(old);
	bson_destroy(neu);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_count(f->c, "db", "c"), 1);
	bson_t **e = NULL;
	size_t n = 0;
	assert_int_equal(sdb_store_oplog_read(f->c, 0, 100, &e, &n, f->err, sizeof f->err), 0);
	/* create, i, i, u, d */
	assert_int_equal(n, 5);
	const char *ops[] = {"c", "i", "i", "u", "d"};
	for (size_t i = 0; i < n; i++) {
		bson_iter_t it;
		assert_true(bson_iter_init_find(&it, e[i], "op"));
		assert_string_equal(bson_iter_utf8(&it, NULL), ops[i]);
		if (i > 0)
			assert_true(ts_of(e[i]) > ts_of(e[i - 1]));
		if (i == 3) {
			assert_true(bson_iter_init_find(&it, e[i], "origin"));
			assert_string_equal(bson_iter_utf8(&it, NULL), "mig-1");
			assert_true(bson_iter_init_find(&it, e[i], "o2"));
		}
	}
	assert_int_equal(sdb_store_oplog_last(f->c), ts_of(e[4]));
	for (size_t i = 0; i < n; i++)
		sdb_doc_free(e[i]);
	free(e);
	assert_store_clean(f);
}

/* The field of oplog entry e (a document) is byte-for-byte want. */
static void assert_entry_doc(const bson_t *e, const char *field, const bson_t *want)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	assert_true(bson_iter_init_find(&it, e, field));
	assert_true(BSON_ITER_HOLDS_DOCUMENT(&it));
	bson_iter_document(&it, &len, &data);
	assert_int_equal(len, want->len);
	assert_memory_equal(data, bson_get_data(want), len);
}

/* Every "i"/"u"/"d" entry records the documentKey of the write's time (issue #20, mongod
 * 5.3+): o2 of an insert (the new document's) and of an update (the stored pre-image's), o
 * of a delete, with docKey: true; {_id} without filtering metadata and for a migration's
 * update; the shard key of the install in force at the write, not a later one. */
static void test_oplog_records_document_key(void **state)
{
	fx *f = *state;
	bson_t *fm = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "chunks", "[", "]");
	bson_t *fm2 = BCON_NEW("key", "{", "b", BCON_INT32(1), "}", "chunks", "[", "]");
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1), "a", BCON_INT32(5), "b", BCON_INT32(9));
	bson_t *d1u = BCON_NEW("_id", BCON_INT32(1), "a", BCON_INT32(6), "b", BCON_INT32(9));
	bson_t *k_id = BCON_NEW("_id", BCON_INT32(1));
	bson_t *k_a5 = BCON_NEW("a", BCON_INT32(5), "_id", BCON_INT32(1));
	bson_t *k_b9 = BCON_NEW("b", BCON_INT32(9), "_id", BCON_INT32(1));
	bson_t **e = NULL;
	size_t n = 0;
	bson_iter_t it;

	begin_w(f);
	/* unsharded: {_id} */
	assert_int_equal(sdb_store_insert(f->c, "db", "s", d1, NULL, NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_delete(f->c, "db", "s", d1, NULL, f->err, sizeof f->err), 0);
	/* sharded on {a: 1}: insert, update (the pre-image's a), a migration's update ({_id}) */
	assert_int_equal(sdb_store_filtering_set(f->c, "db.s", 1, 1, fm, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_insert(f->c, "db", "s", d1, NULL, NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_update(f->c, "db", "s", d1, d1u, SDB_STORE_UPD_MODIFIER, NULL,
					  NULL, NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_update(f->c, "db", "s", d1u, d1u, SDB_STORE_UPD_REPLACE, NULL,
					  "mig-1", NULL, f->err, sizeof f->err),
			 0);
	/* re-sharded on {b: 1}: the delete has b; the entries before keep a */
	assert_int_equal(sdb_store_filtering_drop(f->c, "db.s", f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_filtering_set(f->c, "db.s", 2, 1, fm2, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_delete(f->c, "db", "s", d1u, NULL, f->err, sizeof f->err), 0);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_oplog_read(f->c, 0, 100, &e, &n, f->err, sizeof f->err), 0);
	/* create, i, d, i, u, u, d */
	assert_int_equal(n, 7);
	assert_entry_doc(e[1], "o2", k_id);
	assert_entry_doc(e[2], "o", k_id);
	assert_entry_doc(e[3], "o2", k_a5);
	assert_entry_doc(e[4], "o2", k_a5); /* the pre-image's a: 5, not 6 */
	assert_true(bson_iter_init_find(&it, e[4], "updateDescription"));
	assert_entry_doc(e[5], "o2", k_id); /* a migration's (origin) */
	assert_entry_doc(e[6], "o", k_b9);
	for (size_t i = 1; i < n; i++) {
		assert_true(bson_iter_init_find(&it, e[i], SDB_STORE_OPLOG_DOCKEY_FIELD));
		assert_true(bson_iter_as_bool(&it));
	}
	assert_false(bson_iter_init_find(&it, e[0], SDB_STORE_OPLOG_DOCKEY_FIELD)); /* "c" */
	for (size_t i = 0; i < n; i++)
		sdb_doc_free(e[i]);
	free(e);
	sdb_store_rollback(f->c);
	bson_destroy(fm);
	bson_destroy(fm2);
	bson_destroy(d1);
	bson_destroy(d1u);
	bson_destroy(k_id);
	bson_destroy(k_a5);
	bson_destroy(k_b9);
}

static void test_ts_monotonic_with_clock_jumps_and_restart(void **state)
{
	fx *f = *state;
	begin_w(f);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	commit(f);
	uint64_t t1 = sdb_store_oplog_committed(f->st);
	assert_int_equal(t1 >> 32, 1700000000);
	f->now_ms -= 3600 * 1000; /* the wall clock jumps back an hour */
	begin_w(f);
	assert_int_equal(insert(f, 2, 1, NULL), 0);
	commit(f);
	uint64_t t2 = sdb_store_oplog_committed(f->st);
	assert_true(t2 > t1);
	fx_close(f);
	fx_open(f, 0); /* restart with the clock still behind */
	begin_w(f);
	assert_int_equal(insert(f, 3, 1, NULL), 0);
	commit(f);
	assert_true(sdb_store_oplog_committed(f->st) > t2);
	f->now_ms += 7200 * 1000; /* and forward: seconds follow the clock again */
	begin_w(f);
	assert_int_equal(insert(f, 4, 1, NULL), 0);
	commit(f);
	uint64_t t4 = sdb_store_oplog_committed(f->st);
	assert_int_equal(t4 >> 32, 1700003600);
	assert_int_equal(t4 & 0xffffffffu, 1);
}

static void test_version_tokens(void **state)
{
	fx *f = *state;
	int64_t stored = -1;
	begin_w(f);
	assert_int_equal(sdb_store_version_check(f->c, "k", 0, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(stored, 0);
	assert_int_equal(sdb_store_version_set(f->c, "k", 7, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(stored, 7);
	assert_int_equal(sdb_store_version_set(f->c, "k", 3, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(stored, 7);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_version_check(f->c, "k", 6, &stored, f->err, sizeof f->err),
			 SDB_ESTALE);
	assert_int_equal(stored, 7);
	assert_int_equal(sdb_store_version_check(f->c, "k", 7, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_version_check(f->c, "other", 1, &stored, f->err, sizeof f->err),
			 0);
	sdb_store_rollback(f->c);
}

static void test_oplog_capped_by_size(void **state)
{
	fx *f = *state;
	fx_close(f);
	fx_open(f, 8192);
	for (int i = 0; i < 200; i++) {
		begin_w(f);
		assert_int_equal(insert(f, i, i, NULL), 0);
		commit(f);
	}
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	int64_t n = sdb_store_oplog_count(f->c);
	assert_true(n > 10);
	assert_true(n < 200);
	/* the newest entry is always kept and is the last insert */
	bson_t **e = NULL;
	size_t ne = 0;
	assert_int_equal(sdb_store_oplog_read_desc(f->c, 0, 0, 1, &e, &ne, f->err, sizeof f->err), 0);
	assert_int_equal(ne, 1);
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, e[0], "o"));
	sdb_doc_free(e[0]);
	free(e);
	assert_int_equal(sdb_store_count(f->c, "db", "c"), 200);
	assert_store_clean(f);
}

/* A store written before Decimal128 keys were exact (meta 'keyenc' absent): opening it
 * re-keys the documents holding decimals (_id key and index entries, a unique index and a
 * hashed one among them) once. The old keys are the real ones: the documents are written
 * while this thread encodes numbers the frozen way (sdb_keyenc_legacy_numbers), as a
 * binary of that release wrote them, and the keyenc mark is then removed. */
static void test_decimal_keys_migrated_on_open(void **state)
{
	fx *f = *state;
	const char *docs_json[] = {
		"{\"_id\": {\"$numberDecimal\": \"0.1\"}, \"a\": {\"$numberDecimal\": \"19.99\"}, \"u\": 1}",
		"{\"_id\": 2, \"a\": {\"$numberDecimal\": \"1.000000000000000000001\"}, \"u\": 2}",
		"{\"_id\": {\"$numberDecimal\": \"2.5\"}, \"a\": [{\"$numberDecimal\": \"7.7\"}, 1], \"u\": 3}",
		"{\"_id\": {\"$numberDecimal\": \"1234567890123456789012.901\"}, \"a\": 1, \"u\": {\"$numberDecimal\": \"1234567890123456789012.901\"}}",
		"{\"_id\": 5, \"a\": 2, \"u\": {\"$numberDecimal\": \"1234567890123456789012.902\"}}",
	};
	const size_t ndocs = sizeof docs_json / sizeof docs_json[0];
	bson_error_t je;
	bool prev = sdb_keyenc_legacy_numbers(true);

	begin_w(f);
	for (size_t i = 0; i < ndocs; i++) {
		bson_t *d = bson_new_from_json((const uint8_t *)docs_json[i], -1, &je);

		assert_non_null(d);
		assert_int_equal(sdb_store_insert(f->c, "db", "c", d, NULL, NULL, f->err,
						  sizeof f->err),
				 0);
		bson_destroy(d);
	}
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	/* no unique one on u: under the old order .901 and .902 were one key (the bug) */
	spec = BCON_NEW("key", "{", "u", BCON_UTF8("hashed"), "}", "name", "u_hashed");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	commit(f);
	sdb_keyenc_legacy_numbers(prev);
	fx_close(f);

	char path[300];
	snprintf(path, sizeof path, "%s/shard.db", f->dir);
	sqlite3 *db;
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "DELETE FROM meta WHERE k = 'keyenc';"
					  "UPDATE meta SET v = 1 WHERE k = 'format'",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);

	for (int round = 0; round < 2; round++) { /* the second open finds keyenc = 2 */
		fx_open(f, 0);
		assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
		bson_t problems = BSON_INITIALIZER;
		int np = -1;
		assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
		if (np != 0) {
			char *j = bson_as_relaxed_extended_json(&problems, NULL);
			fail_msg("problems after the re-key: %s", j);
		}
		bson_destroy(&problems);
		for (size_t i = 0; i < ndocs; i++) {
			bson_t *q = bson_new_from_json((const uint8_t *)docs_json[i], -1, &je);
			bson_iter_t id;
			bson_t out;
			assert_true(bson_iter_init_find(&id, q, "_id"));
			assert_int_equal(sdb_store_get_by_id(f->c, "db", "c", &id, &out, f->err,
							     sizeof f->err),
					 0);
			assert_true(bson_equal(&out, q));
			bson_destroy(&out);
			bson_destroy(q);
		}
		assert_int_equal(sdb_store_count(f->c, "db", "c"), (int64_t)ndocs);
		sdb_store_rollback(f->c);
		fx_close(f);
		/* upgraded: format 2 (a format-1 binary refuses it), keyenc 2 */
		assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
		sqlite3_stmt *st;
		assert_int_equal(sqlite3_prepare_v2(db, "SELECT (SELECT v FROM meta WHERE k = 'format'),"
							" (SELECT v FROM meta WHERE k = 'keyenc')",
						    -1, &st, NULL),
				 SQLITE_OK);
		assert_int_equal(sqlite3_step(st), SQLITE_ROW);
		assert_int_equal(sqlite3_column_int64(st, 0), 2);
		assert_int_equal(sqlite3_column_int64(st, 1), 2);
		sqlite3_finalize(st);
		sqlite3_close(db);
	}
	fx_open(f, 0); /* the fixture's teardown closes it */
}

/* A snapshot copied from a member of an earlier version (format 1, keys through long double)
 * is re-keyed by sdb_store_replace_from after the copy: lookups by decimal _id and the
 * index check pass, and the store is format 2. */
static void test_decimal_keys_rekeyed_after_snapshot_install(void **state)
{
	fx *f = *state;
	fx g = {.now_ms = 1700000000000LL};
	const char *docs_json[] = {
		"{\"_id\": {\"$numberDecimal\": \"1234567890123456789012.901\"}, \"a\": 1}",
		/* not ...902: under the old order that was the same _id key (the bug) */
		"{\"_id\": {\"$numberDecimal\": \"0.1\"}, \"a\": {\"$numberDecimal\": \"0.1\"}}",
	};
	bson_error_t je;
	char path[300];
	sqlite3 *db;
	uint64_t applied = 0;

	snprintf(g.dir, sizeof g.dir, "/tmp/sdb-store-test-XXXXXX");
	assert_non_null(mkdtemp(g.dir));
	fx_open(&g, 0);
	bool prev = sdb_keyenc_legacy_numbers(true); /* as a binary of that version keyed them */
	begin_w(&g);
	for (size_t i = 0; i < 2; i++) {
		bson_t *d = bson_new_from_json((const uint8_t *)docs_json[i], -1, &je);
		assert_int_equal(sdb_store_insert(g.c, "db", "c", d, NULL, NULL, g.err, sizeof g.err),
				 0);
		bson_destroy(d);
	}
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(g.c, "db", "c", spec, NULL, &created, &code, g.err,
						sizeof g.err),
			 0);
	bson_destroy(spec);
	commit(&g);
	sdb_keyenc_legacy_numbers(prev);
	fx_close(&g);
	snprintf(path, sizeof path, "%s/shard.db", g.dir);
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "DELETE FROM meta WHERE k = 'keyenc';"
					  "UPDATE meta SET v = 1 WHERE k = 'format'",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);

	assert_int_equal(sdb_store_replace_from(f->c, path, &applied, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t problems = BSON_INITIALIZER;
	int np = -1;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 0);
	bson_destroy(&problems);
	for (size_t i = 0; i < 2; i++) {
		bson_t *q = bson_new_from_json((const uint8_t *)docs_json[i], -1, &je);
		bson_iter_t id;
		bson_t out;
		assert_true(bson_iter_init_find(&id, q, "_id"));
		assert_int_equal(sdb_store_get_by_id(f->c, "db", "c", &id, &out, f->err,
						     sizeof f->err),
				 0);
		assert_true(bson_equal(&out, q));
		bson_destroy(&out);
		bson_destroy(q);
	}
	assert_int_equal(store_query_int(f->c, "SELECT v FROM meta WHERE k='format'", 0), 2);
	assert_int_equal(store_query_int(f->c, "SELECT v FROM meta WHERE k='keyenc'", 0), 2);
	sdb_store_rollback(f->c);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g.dir);
	assert_int_equal(system(cmd), 0);
}

/* The page size of a store's file (PRAGMA page_size, read-only). */
static int file_page_size(const char *path)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	int pg = -1;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &st, NULL), SQLITE_OK);
	if (sqlite3_step(st) == SQLITE_ROW)
		pg = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return pg;
}

/* A store made with 4 KiB pages (before STORE_PAGE_BYTES): its file is created as a
 * release of then did, 4 KiB and WAL, before the store opens it. */
static void fx_open_4k(fx *g)
{
	char path[300];
	sqlite3 *db = NULL;
	snprintf(g->dir, sizeof g->dir, "/tmp/sdb-store-test-XXXXXX");
	assert_non_null(mkdtemp(g->dir));
	snprintf(path, sizeof path, "%s/shard.db", g->dir);
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "PRAGMA page_size=4096; PRAGMA journal_mode=WAL", NULL,
				      NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	fx_open(g, 0);
	assert_int_equal(file_page_size(path), 4096);
}

/* Snapshots between stores of different page sizes (a set upgraded in place keeps its 4
 * KiB stores, a member added later makes an 8 KiB one): sdb_store_replace_from installs a
 * copy of either size into either, the store keeps its own size, and every document, the
 * index and the integrity check come through. Both directions. */
static void test_snapshot_install_across_page_sizes(void **state)
{
	fx *f = *state; /* a new store: STORE_PAGE_BYTES */
	char fpath[300], gpath[300], copy[300];
	snprintf(fpath, sizeof fpath, "%s/shard.db", f->dir);
	assert_int_equal(file_page_size(fpath), STORE_PAGE_BYTES);
	assert_true(STORE_PAGE_BYTES != 4096);
	fx g = {.now_ms = 1700000000000LL};
	fx_open_4k(&g);
	snprintf(gpath, sizeof gpath, "%s/shard.db", g.dir);
	for (int dir = 0; dir < 2; dir++) {
		fx *src = dir == 0 ? &g : f, *dst = dir == 0 ? f : &g;
		const int base = 1000 * (dir + 1);
		begin_w(src);
		/* rows of 3 KB: overflow pages at 4 KiB, not at 8 */
		char *big = malloc(3001);
		memset(big, 'x', 3000);
		big[3000] = 0;
		for (int i = 0; i < 300; i++) {
			bson_t *d = doc_id_a(base + i, i);
			BSON_APPEND_UTF8(d, "s", big);
			assert_int_equal(sdb_store_insert(src->c, "db", "c", d, NULL, NULL, src->err,
							  sizeof src->err),
					 0);
			bson_destroy(d);
		}
		free(big);
		if (dir == 0) {
			bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
			bool created;
			int code;
			assert_int_equal(sdb_store_index_create(src->c, "db", "c", spec, NULL, &created,
								&code, src->err, sizeof src->err),
					 0);
			bson_destroy(spec);
		}
		commit(src);
		uint64_t applied = 0;
		snprintf(copy, sizeof copy, "%s/copy.db", src->dir);
		/* 8 KiB to 4 KiB: the sender rewrites the copy at the size asked for (a receiver
		 * of before 8 KiB pages installs no other); 4 KiB to 8 KiB: the receiver does */
		assert_int_equal(sdb_store_copy_to(src->c, copy, dir == 0 ? 0 : 4096, &applied,
						   src->err, sizeof src->err),
				 0);
		assert_int_equal(file_page_size(copy), 4096);
		assert_int_equal(sdb_store_page_size(src->c), dir == 0 ? 4096 : STORE_PAGE_BYTES);
		assert_int_equal(sdb_store_page_size(dst->c), dir == 0 ? STORE_PAGE_BYTES : 4096);
		assert_int_equal(sdb_store_replace_from(dst->c, copy, &applied, dst->err,
							sizeof dst->err),
				 0);
		/* the copy is left as it was, and nothing beside it */
		assert_int_equal(file_page_size(copy), 4096);
		char conv[320];
		snprintf(conv, sizeof conv, "%s.pagesize", copy);
		assert_int_equal(access(conv, F_OK), -1);
		unlink(copy);
		assert_int_equal(file_page_size(fpath), STORE_PAGE_BYTES);
		assert_int_equal(file_page_size(gpath), 4096);
		/* the destination holds the source's documents (the first 300, then all 600) */
		assert_count_and_clean(dst, 300 * (dir + 1));
		assert_int_equal(sdb_store_begin(dst->c, true, dst->err, sizeof dst->err), 0);
		assert_int_equal(insert(dst, 99999, 1, NULL), 0);
		commit(dst);
		assert_count_and_clean(dst, 300 * (dir + 1) + 1);
		/* and keeps it after a reopen */
		fx_close(dst);
		fx_open(dst, 0);
		assert_count_and_clean(dst, 300 * (dir + 1) + 1);
		if (dir == 0) {
			/* the source goes on from the destination's content (as a set does) */
			begin_w(f);
			bson_t *d = doc_id_a(99999, 1);
			assert_int_equal(sdb_store_delete(f->c, "db", "c", d, NULL, f->err,
							  sizeof f->err),
					 0);
			bson_destroy(d);
			commit(f);
		}
	}
	fx_close(&g);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g.dir);
	assert_int_equal(system(cmd), 0);
}

static void test_catalog_drop_and_oplog_commands(void **state)
{
	fx *f = *state;
	begin_w(f);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	bool created;
	int code;
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	/* same name, other key: IndexKeySpecsConflict 86 */
	spec = BCON_NEW("key", "{", "b", BCON_INT32(1), "}", "name", "a_1");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 SDB_ECONFLICT);
	assert_int_equal(code, 86);
	bson_destroy(spec);
	assert_int_equal(sdb_store_index_drop(f->c, "db", "c", "nope", NULL, f->err, sizeof f->err),
			 SDB_ENOTFOUND);
	assert_int_equal(sdb_store_index_drop(f->c, "db", "c", "a_1", NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_coll_create(f->c, "db", "d", NULL, NULL, NULL, f->err,
					       sizeof f->err),
			 0);
	assert_int_equal(sdb_store_coll_create(f->c, "db", "d", NULL, NULL, NULL, f->err,
					       sizeof f->err),
			 SDB_EEXISTS);
	assert_int_equal(sdb_store_coll_create(f->c, "bad.db", "d", NULL, NULL, NULL, f->err,
					       sizeof f->err),
			 SDB_EINVAL);
	commit(f);
	begin_w(f);
	char **names = NULL;
	size_t n = 0;
	assert_int_equal(sdb_store_coll_list(f->c, "db", &names, &n, f->err, sizeof f->err), 0);
	assert_int_equal(n, 2);
	sdb_store_names_free(names, n);
	int dropped = 0;
	assert_int_equal(sdb_store_db_drop(f->c, "db", "mig-9", &dropped, f->err, sizeof f->err),
			 0);
	assert_int_equal(dropped, 2);
	assert_int_equal(sdb_store_count(f->c, "db", "c"), 0);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t **e = NULL;
	size_t ne = 0;
	assert_int_equal(sdb_store_oplog_read_desc(f->c, 0, 0, 1, &e, &ne, f->err, sizeof f->err), 0);
	assert_int_equal(ne, 1);
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, e[0], "o"));
	bson_iter_t sub;
	assert_true(bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, "dropDatabase"));
	assert_true(bson_iter_init_find(&it, e[0], "ns"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "db.$cmd");
	assert_true(bson_iter_init_find(&it, e[0], "origin"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "mig-9");
	sdb_doc_free(e[0]);
	free(e);
	assert_store_clean(f);
}

/* renameCollection's storage step: catalog rows moved (documents, indexes, UUID kept),
 * across databases and over a dropped target, one oplog entry as MongoDB's, and
 * stripedbCheck's replay follows it. */
static void test_coll_rename(void **state)
{
	fx *f = *state;
	const sdb_store_coll *co = NULL;
	uint8_t uuid[16];
	bool created;
	int code;

	begin_w(f);
	for (int i = 1; i <= 5; i++)
		assert_int_equal(insert(f, i, i % 2, NULL), 0);
	bson_t *spec = BCON_NEW("key", "{", "a", BCON_INT32(1), "}", "name", "a_1");
	assert_int_equal(sdb_store_index_create(f->c, "db", "c", spec, NULL, &created, &code,
						f->err, sizeof f->err),
			 0);
	bson_destroy(spec);
	assert_int_equal(sdb_store_coll_create(f->c, "db2", "t", NULL, NULL, NULL, f->err,
					       sizeof f->err),
			 0);
	assert_int_equal(sdb_store_coll_get(f->c, "db", "c", &co, NULL, 0), 0);
	memcpy(uuid, co->uuid, 16);
	/* refusals change nothing */
	assert_int_equal(sdb_store_coll_rename(f->c, "db", "nope", "db", "x", false, false, NULL,
					       f->err, sizeof f->err),
			 SDB_ENOTFOUND);
	assert_int_equal(sdb_store_coll_rename(f->c, "db", "c", "db2", "t", false, false, NULL,
					       f->err, sizeof f->err),
			 SDB_EEXISTS);
	assert_int_equal(sdb_store_coll_rename(f->c, "db", "c", "db", "c", true, false, NULL,
					       f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(sdb_store_coll_rename(f->c, "db", "c", "bad.db", "c", true, false, NULL,
					       f->err, sizeof f->err),
			 SDB_EINVAL);
	assert_int_equal(sdb_store_coll_rename(f->c, "db", "c", "db2", "t", true, false, "mig-1",
					       f->err, sizeof f->err),
			 0);
	commit(f);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_coll_get(f->c, "db", "c", &co, NULL, 0), SDB_ENOTFOUND);
	assert_int_equal(sdb_store_coll_get(f->c, "db2", "t", &co, NULL, 0), 0);
	assert_memory_equal(co->uuid, uuid, 16);
	assert_int_equal(co->n_indexes, 1);
	assert_string_equal(co->indexes[0].name, "a_1");
	assert_int_equal(sdb_store_count(f->c, "db2", "t"), 5);
	bson_t **e = NULL;
	size_t ne = 0;
	assert_int_equal(sdb_store_oplog_read_desc(f->c, 0, 0, 1, &e, &ne, f->err, sizeof f->err), 0);
	assert_int_equal(ne, 1);
	bson_iter_t it, sub;
	assert_true(bson_iter_init_find(&it, e[0], "ns"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "db.$cmd");
	assert_true(bson_iter_init_find(&it, e[0], "origin"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "mig-1");
	assert_true(bson_iter_init_find(&it, e[0], "o") && bson_iter_recurse(&it, &sub));
	assert_true(bson_iter_find(&sub, "renameCollection"));
	assert_string_equal(bson_iter_utf8(&sub, NULL), "db.c");
	assert_true(bson_iter_find(&sub, "to"));
	assert_string_equal(bson_iter_utf8(&sub, NULL), "db2.t");
	assert_true(bson_iter_find(&sub, "stayTemp") && !bson_iter_bool(&sub));
	assert_true(bson_iter_find(&sub, "dropTarget") && BSON_ITER_HOLDS_BINARY(&sub));
	sdb_doc_free(e[0]);
	free(e);
	assert_store_clean(f);
}

static void test_check_finds_data_that_disagrees_with_the_oplog(void **state)
{
	fx *f = *state;
	begin_w(f);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	assert_int_equal(insert(f, 2, 2, NULL), 0);
	commit(f);
	char path[300];
	snprintf(path, sizeof path, "%s/shard.db", f->dir);
	sqlite3 *db;
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	/* a write that bypassed the oplog: one document lost */
	assert_int_equal(sqlite3_exec(db, "DELETE FROM c_1 WHERE k = (SELECT max(k) FROM c_1)",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	bson_t problems = BSON_INITIALIZER;
	int np = 0;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 1);
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, &problems, "0"));
	assert_non_null(strstr(bson_iter_utf8(&it, NULL),
			       "db.c: 1 documents disagree with their latest oplog entry"));
	bson_destroy(&problems);
	sdb_store_rollback(f->c);
}


/* Retryable-write records (storage/session.c): a statement recorded in a committed
 * transaction is found again, one rolled back is not, a newer txnNumber forgets the older
 * statements, an older one is refused, and a session unused for the timeout is gone (the
 * injected clock moves past it). */
static void test_session_records(void **state)
{
	fx *f = *state;
	bson_t *lsid = BCON_NEW("id", BCON_UTF8("session-1"));
	bson_t *res = BCON_NEW("n", BCON_INT32(1));
	bson_t *got = NULL;
	int64_t stored = 0;

	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 3, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 0);
	assert_null(got);
	assert_int_equal(sdb_store_session_stmt_put(f->c, lsid, 0, res, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);

	/* a rolled-back statement leaves no record */
	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 3, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_put(f->c, lsid, 1, res, f->err, sizeof f->err), 0);
	sdb_store_rollback(f->c);

	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 3, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 1);
	assert_non_null(got);
	assert_true(bson_equal(got, res));
	sdb_doc_free(got);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 1, &got, f->err, sizeof f->err), 0);
	/* older: TransactionTooOld */
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 2, &stored, f->err, sizeof f->err),
			 SDB_ESTALE);
	assert_int_equal(stored, 3);
	/* newer: the statements of 3 are forgotten */
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 4, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_put(f->c, lsid, 0, res, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_count(f->c), 1);
	sdb_store_rollback(f->c);

	/* 29 minutes later the record is alive; 30 minutes after its last use it is gone */
	f->now_ms += 29 * 60 * 1000;
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_count(f->c), 1);
	sdb_store_rollback(f->c);
	f->now_ms += 60 * 1000 + 1;
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_count(f->c), 0);
	sdb_store_rollback(f->c);
	/* an expired session starts afresh: even an older txnNumber is accepted, nothing is
	 * recorded; the sweep (inside this write) deleted the old rows */
	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 1, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);

	/* the records are in the file: they survive a reopen */
	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_put(f->c, lsid, 5, res, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);
	fx_close(f);
	fx_open(f, 0);
	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 1, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 5, &got, f->err, sizeof f->err), 1);
	sdb_doc_free(got);
	sdb_store_rollback(f->c);
	bson_destroy(lsid);
	bson_destroy(res);
}


/* Issue #16 across migrations: a retryable statement's oplog entries carry its outcome
 * (stmtResult) next to lsid/txnNumber/stmtId; records imported from a migration's source
 * follow the txnNumber order (older dropped, newer forgets), and an incomplete-history
 * marker is stored as statement -1. */
static void test_session_oplog_result_and_import(void **state)
{
	fx *f = *state;
	bson_t *lsid = BCON_NEW("id", BCON_UTF8("session-m"));
	bson_t *res = BCON_NEW("n", BCON_INT32(1), "nModified", BCON_INT32(1));
	bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "v", BCON_INT32(2));
	bson_t *got = NULL, **e = NULL;
	size_t n = 0;
	int64_t stored = 0;

	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	sdb_store_set_op_session(f->c, lsid, 7, 2);
	assert_int_equal(sdb_store_insert(f->c, "db", "m", doc, NULL, NULL, f->err,
					  sizeof f->err), 0);
	assert_int_equal(sdb_store_oplog_stmt_result(f->c, res, f->err, sizeof f->err), 0);
	sdb_store_set_op_session(f->c, NULL, 0, 0);
	/* a statement that wrote nothing: nothing to amend */
	sdb_store_set_op_session(f->c, lsid, 7, 3);
	assert_int_equal(sdb_store_oplog_stmt_result(f->c, res, f->err, sizeof f->err), 0);
	sdb_store_set_op_session(f->c, NULL, 0, 0);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_oplog_read(f->c, 0, 100, &e, &n, f->err, sizeof f->err), 0);
	sdb_store_rollback(f->c);
	assert_true(n >= 2); /* the implicit create, then the insert */
	bson_iter_t it, sub;
	assert_false(bson_iter_init_find(&it, e[0], "stmtResult"));
	assert_true(bson_iter_init_find(&it, e[n - 1], "stmtId"));
	assert_int_equal(bson_iter_int32(&it), 2);
	assert_true(bson_iter_init_find(&it, e[n - 1], "txnNumber"));
	assert_int_equal(bson_iter_int64(&it), 7);
	assert_true(bson_iter_init_find(&it, e[n - 1], "stmtResult"));
	assert_true(bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, "nModified"));
	for (size_t i = 0; i < n; i++)
		sdb_doc_free(e[i]);
	free(e);

	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 3, &stored, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_put(f->c, lsid, 0, res, f->err, sizeof f->err), 0);
	/* an older txnNumber's record is dropped */
	assert_int_equal(sdb_store_session_import(f->c, lsid, 2, 1, res, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 1, &got, f->err, sizeof f->err), 0);
	/* the same txnNumber's records add up */
	assert_int_equal(sdb_store_session_import(f->c, lsid, 3, 1, res, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 1);
	sdb_doc_free(got);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 1, &got, f->err, sizeof f->err), 1);
	sdb_doc_free(got);
	/* a newer one forgets them; the marker is statement -1 */
	assert_int_equal(sdb_store_session_import(f->c, lsid, 5, 0, NULL, f->err, sizeof f->err),
			 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, 0, &got, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_session_stmt_get(f->c, lsid, SDB_STMT_INCOMPLETE_HISTORY, &got,
						    f->err, sizeof f->err),
			 1);
	sdb_doc_free(got);
	assert_int_equal(sdb_store_session_begin(f->c, lsid, 4, &stored, f->err, sizeof f->err),
			 SDB_ESTALE);
	assert_int_equal(stored, 5);
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);
	bson_destroy(lsid);
	bson_destroy(res);
	bson_destroy(doc);
}

/* Replicated apply (issue #15): two stores applying the same entries with the same
 * sdb_store_det write the same bytes (ObjectIds, collection UUIDs, oplog ts/t/wall),
 * whatever their clocks say and whether one restarted in between; a failed command in an
 * apply leaves no trace and does not move the ts counter. */
static void apply_entry(fx *f, const sdb_store_det *det, uint64_t index, int base)
{
	assert_int_equal(sdb_store_apply_begin(f->c, det, f->err, sizeof f->err), 0);
	for (int i = 0; i < 3; i++) {
		bson_oid_t oid;
		bson_t *d = bson_new();
		begin_w(f);
		sdb_store_new_oid(f->c, &oid);
		BSON_APPEND_OID(d, "_id", &oid);
		BSON_APPEND_INT32(d, "n", base + i);
		assert_int_equal(sdb_store_insert(f->c, "db", "r", d, NULL, NULL, f->err,
						  sizeof f->err),
				 0);
		bson_destroy(d);
		if (i == 1)
			sdb_store_rollback(f->c); /* a failed command: no trace */
		else
			commit(f);
	}
	assert_int_equal(sdb_store_apply_commit(f->c, index, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_applied_index(f->c), index);
}

static void oplog_of(fx *f, bson_t ***docs, size_t *n)
{
	*docs = NULL;
	*n = 0;
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_oplog_read(f->c, 0, 1000, docs, n, f->err, sizeof f->err), 0);
	sdb_store_rollback(f->c);
}

static void test_replicated_apply_is_deterministic(void **state)
{
	fx *a = *state;
	fx b_, *b = &b_;
	memset(b, 0, sizeof *b);
	snprintf(b->dir, sizeof b->dir, "/tmp/sdb-store-test-XXXXXX");
	assert_non_null(mkdtemp(b->dir));
	b->now_ms = 1600000000000LL; /* another clock: it must not matter */
	fx_open(b, 0);
	sdb_store_det d1 = {.now_ms = 1750000000123LL, .term = 3, .seed = {1, 2, 3, 4, 5}};
	sdb_store_det d2 = {.now_ms = 1750000000999LL, .term = 4, .seed = {9, 8, 7, 6, 5}};
	apply_entry(a, &d1, 10, 0);
	apply_entry(b, &d1, 10, 0);
	fx_close(b); /* b restarts between the entries */
	fx_open(b, 0);
	assert_int_equal(sdb_store_applied_index(b->c), 10);
	apply_entry(a, &d2, 11, 100);
	apply_entry(b, &d2, 11, 100);
	bson_t **oa, **ob;
	size_t na, nb;
	oplog_of(a, &oa, &na);
	oplog_of(b, &ob, &nb);
	assert_int_equal(na, 5); /* create + 2 inserts, 2 inserts */
	assert_int_equal(na, nb);
	for (size_t i = 0; i < na; i++) {
		assert_int_equal(oa[i]->len, ob[i]->len);
		assert_memory_equal(bson_get_data(oa[i]), bson_get_data(ob[i]), oa[i]->len);
		bson_iter_t it;
		assert_true(bson_iter_init_find(&it, oa[i], "t"));
		assert_int_equal(bson_iter_as_int64(&it), i < 3 ? 3 : 4);
		sdb_doc_free(oa[i]);
		sdb_doc_free(ob[i]);
	}
	free(oa);
	free(ob);
	fx_close(b);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %.250s", b->dir);
	assert_int_equal(system(cmd), 0);
}

/* A transaction's tentative statement (src/shard/txn.c) runs in an apply transaction that
 * is rolled back: it leaves no trace on disk or in memory. A store that ran one between
 * two entries writes the same oplog bytes as one that did not (the ts counter went back),
 * the committed-ts watermark did not move, the collection it created is gone; and
 * sdb_store_session_txn reads a session's live txnNumber. */
static void test_rolled_back_apply_leaves_no_trace(void **state)
{
	fx *a = *state;
	fx b_, *b = &b_;
	memset(b, 0, sizeof *b);
	snprintf(b->dir, sizeof b->dir, "/tmp/sdb-store-test-XXXXXX");
	assert_non_null(mkdtemp(b->dir));
	b->now_ms = a->now_ms;
	fx_open(b, 0);
	sdb_store_det d1 = {.now_ms = 1750000000123LL, .term = 3, .seed = {1, 2, 3, 4, 5}};
	sdb_store_det d2 = {.now_ms = 1750000000123LL, .term = 3, .seed = {9, 8, 7, 6, 5}};
	apply_entry(a, &d1, 10, 0);
	apply_entry(b, &d1, 10, 0);
	uint64_t committed = sdb_store_oplog_committed(a->st);
	/* the tentative run: writes (and an implicit create), then the rollback */
	assert_int_equal(sdb_store_apply_begin(a->c, &d2, a->err, sizeof a->err), 0);
	begin_w(a);
	bson_t *d = doc_id_a(1, 1);
	assert_int_equal(sdb_store_insert(a->c, "db", "t", d, NULL, NULL, a->err, sizeof a->err), 0);
	assert_int_equal(sdb_store_insert(a->c, "db", "r", d, NULL, NULL, a->err, sizeof a->err), 0);
	bson_destroy(d);
	commit(a);
	sdb_store_apply_rollback(a->c);
	assert_int_equal(sdb_store_oplog_committed(a->st), committed);
	assert_int_equal(sdb_store_begin(a->c, false, a->err, sizeof a->err), 0);
	const sdb_store_coll *co = NULL;
	assert_int_equal(sdb_store_coll_get(a->c, "db", "t", &co, a->err, sizeof a->err),
			 SDB_ENOTFOUND);
	assert_int_equal(sdb_store_count(a->c, "db", "r"), 2);
	sdb_store_rollback(a->c);
	apply_entry(a, &d2, 11, 100);
	apply_entry(b, &d2, 11, 100);
	bson_t **oa, **ob;
	size_t na, nb;
	oplog_of(a, &oa, &na);
	oplog_of(b, &ob, &nb);
	assert_int_equal(na, 5);
	assert_int_equal(na, nb);
	for (size_t i = 0; i < na; i++) {
		assert_int_equal(oa[i]->len, ob[i]->len);
		assert_memory_equal(bson_get_data(oa[i]), bson_get_data(ob[i]), oa[i]->len);
		sdb_doc_free(oa[i]);
		sdb_doc_free(ob[i]);
	}
	free(oa);
	free(ob);
	/* a session's live txnNumber */
	bson_t *lsid = BCON_NEW("id", BCON_INT32(42));
	bson_t *none = BCON_NEW("id", BCON_INT32(43));
	int64_t stored = 0, txn = -1;
	begin_w(a);
	assert_int_equal(sdb_store_session_begin(a->c, lsid, 5, &stored, a->err, sizeof a->err), 0);
	commit(a);
	assert_int_equal(sdb_store_begin(a->c, false, a->err, sizeof a->err), 0);
	assert_int_equal(sdb_store_session_txn(a->c, lsid, &txn, a->err, sizeof a->err), 1);
	assert_int_equal(txn, 5);
	assert_int_equal(sdb_store_session_txn(a->c, none, &txn, a->err, sizeof a->err), 0);
	sdb_store_rollback(a->c);
	bson_destroy(lsid);
	bson_destroy(none);
	fx_close(b);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %.250s", b->dir);
	assert_int_equal(system(cmd), 0);
}


/* ------------------------------------------------------------------ kept reads */

/* meta_scan callback: the value of the one key asked for (caller frees). */
static void meta_value(void *arg, const char *key, const char *value)
{
	(void)key;
	char **out = arg;
	free(*out);
	*out = strdup(value);
}

/* A read count on c in a read transaction, which c then ends (sdb_store_rollback). */
static int64_t read_count(fx *f, sdb_store_conn *c)
{
	assert_int_equal(sdb_store_begin(c, false, f->err, sizeof f->err), 0);
	int64_t n = sdb_store_count(c, "db", "c");
	sdb_store_rollback(c);
	return n;
}

/* db.c holding {_id: 1, a: 1}, and a second connection that keeps its reads (the
 * caller closes it). */
static sdb_store_conn *kept_reader(fx *f)
{
	sdb_store_conn *r = NULL;

	begin_w(f);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	commit(f);
	assert_int_equal(sdb_store_conn_open(f->st, &r, f->err, sizeof f->err), 0);
	sdb_store_keep_reads(r, true);
	return r;
}

/* sdb_store_keep_reads (issue #19): a read transaction ended by the reader stays open and
 * is taken over by the next read while nothing commits; a commit on another connection
 * makes the next read begin a new snapshot, which sees it. */
static void test_kept_read_is_taken_over_until_a_commit(void **state)
{
	fx *f = *state;
	sdb_store_conn *r = kept_reader(f);

	assert_int_equal(read_count(f, r), 1);
	/* kept: SQLite's transaction is still open, the store's is not */
	assert_true(r->kept);
	assert_true(sdb_store_conn_idle(r));
	assert_int_equal(sqlite3_get_autocommit(r->db), 0);
	uint64_t epoch = r->txn_epoch;
	/* taken over: no commit since */
	assert_int_equal(sdb_store_begin(r, false, f->err, sizeof f->err), 0);
	assert_false(r->kept);
	assert_int_equal(r->txn_epoch, epoch);
	assert_int_equal(sdb_store_count(r, "db", "c"), 1);
	sdb_store_rollback(r);
	assert_true(r->kept);
	/* a commit elsewhere: the next read must see it */
	begin_w(f);
	assert_int_equal(insert(f, 2, 2, NULL), 0);
	commit(f);
	assert_true(atomic_load(&f->st->commit_epoch) != epoch);
	assert_int_equal(read_count(f, r), 2);
	/* released: SQLite's transaction ends too */
	sdb_store_release_read(r);
	assert_false(r->kept);
	assert_int_equal(sqlite3_get_autocommit(r->db), 1);
	sdb_store_release_read(r); /* nothing kept: no-op */
	sdb_store_release_read(NULL);
	/* off: nothing is kept any more */
	assert_int_equal(read_count(f, r), 2);
	assert_true(r->kept);
	sdb_store_keep_reads(r, false);
	assert_false(r->kept);
	assert_int_equal(sqlite3_get_autocommit(r->db), 1);
	assert_int_equal(read_count(f, r), 2);
	assert_false(r->kept);
	sdb_store_conn_close(r);
}

/* Any other use of the connection ends the kept transaction first: a statement outside a
 * transaction reads the newest state, and a write or apply transaction begins. */
static void test_kept_read_ends_before_any_other_use(void **state)
{
	fx *f = *state;
	sdb_store_conn *r = NULL;
	char *v = NULL;

	begin_w(f);
	assert_int_equal(sdb_store_meta_put(f->c, "kept_k", "v1", f->err, sizeof f->err), 0);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	commit(f);
	assert_int_equal(sdb_store_conn_open(f->st, &r, f->err, sizeof f->err), 0);
	sdb_store_keep_reads(r, true);
	assert_int_equal(read_count(f, r), 1);
	assert_true(r->kept);
	begin_w(f);
	assert_int_equal(sdb_store_meta_put(f->c, "kept_k", "v2", f->err, sizeof f->err), 0);
	commit(f);
	/* outside a transaction: not in the kept (older) snapshot */
	assert_int_equal(sdb_store_meta_scan(r, "kept_k", meta_value, &v), 0);
	assert_string_equal(v, "v2");
	free(v);
	assert_false(r->kept);
	/* a cached statement outside a transaction (store_stmt_get) */
	assert_int_equal(read_count(f, r), 1);
	assert_true(r->kept);
	sdb_store_det d0 = {.now_ms = f->now_ms, .term = 1};
	assert_int_equal(sdb_store_apply_begin(f->c, &d0, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_apply_commit(f->c, 5, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_applied_index(r), 5);
	assert_false(r->kept);
	/* a write transaction on the connection */
	assert_int_equal(read_count(f, r), 1);
	assert_true(r->kept);
	assert_int_equal(sdb_store_begin(r, true, f->err, sizeof f->err), 0);
	bson_t *d = doc_id_a(3, 3);
	assert_int_equal(sdb_store_insert(r, "db", "c", d, NULL, NULL, f->err, sizeof f->err), 0);
	bson_destroy(d);
	assert_int_equal(sdb_store_commit(r, f->err, sizeof f->err), 0);
	/* an apply transaction */
	assert_int_equal(read_count(f, r), 2);
	assert_true(r->kept);
	sdb_store_det det = {.now_ms = f->now_ms, .term = 1};
	assert_int_equal(sdb_store_apply_begin(r, &det, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_apply_commit(r, 7, f->err, sizeof f->err), 0);
	assert_int_equal(read_count(f, f->c), 2);
	/* a write on the connection ended its kept snapshot: its own next read is fresh */
	assert_int_equal(read_count(f, r), 2);
	/* closing with a kept transaction */
	assert_true(r->kept);
	sdb_store_conn_close(r);
}

/* A kept transaction that SQLite ended (a ROLLBACK behind the store's back, as an
 * interrupted statement may do) is not taken over, and a read whose transaction SQLite
 * ended before the store's rollback is not kept. */
static void test_kept_read_only_when_sqlite_still_holds_it(void **state)
{
	fx *f = *state;
	sdb_store_conn *r = kept_reader(f);

	assert_int_equal(read_count(f, r), 1);
	assert_true(r->kept);
	/* SQLite ended it behind the store's back */
	assert_int_equal(sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	assert_int_equal(sdb_store_begin(r, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_count(r, "db", "c"), 1);
	assert_int_equal(sqlite3_get_autocommit(r->db), 0); /* a new one began */
	/* the read transaction ended by SQLite before the store's rollback: not kept */
	assert_int_equal(sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	sdb_store_rollback(r);
	assert_false(r->kept);
	sdb_store_conn_close(r);
}

/* A VFS shim (the default VFS's files, with xShmLock wrapped): on a thread that asks for
 * it, the release of the WAL write lock at the end of a commit sleeps, which holds the
 * committing thread between the moment its commit became visible to new readers (the
 * wal-index header was written before) and the WAL hook SQLite calls after the commit
 * statement ends (checkpoint.c ckpt_hook, which moves the commit epoch). */
static sqlite3_vfs *slow_orig;
static sqlite3_vfs slow_vfs;
static sqlite3_io_methods slow_methods;
static const sqlite3_io_methods *slow_orig_methods;
static _Thread_local bool slow_unlock;
static atomic_int slow_in_window;

static int slow_shm_lock(sqlite3_file *f, int ofst, int n, int flags)
{
	int rc = slow_orig_methods->xShmLock(f, ofst, n, flags);
	if (slow_unlock && ofst == 0 && n == 1 &&
	    flags == (SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE)) {
		slow_unlock = false;
		atomic_store(&slow_in_window, 1);
		usleep(300 * 1000);
	}
	return rc;
}

static int slow_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
	(void)vfs;
	int rc = slow_orig->xOpen(slow_orig, name, f, flags, out);
	if (rc == SQLITE_OK && f->pMethods && f->pMethods->iVersion >= 2) {
		if (!slow_orig_methods) {
			slow_orig_methods = f->pMethods;
			slow_methods = *f->pMethods;
			slow_methods.xShmLock = slow_shm_lock;
		}
		if (f->pMethods == slow_orig_methods)
			f->pMethods = &slow_methods;
	}
	return rc;
}

typedef struct slow_writer {
	fx *f;
	sdb_store_conn *w;
	int rc;
} slow_writer;

static void *slow_writer_main(void *arg)
{
	slow_writer *sw = arg;
	char err[256];
	sw->rc = sdb_store_begin(sw->w, true, err, sizeof err);
	bson_t *d = doc_id_a(2, 2);
	if (sw->rc == 0)
		sw->rc = sdb_store_insert(sw->w, "db", "c", d, NULL, NULL, err, sizeof err);
	bson_destroy(d);
	slow_unlock = true; /* the commit's release of the write lock sleeps */
	if (sw->rc == 0)
		sw->rc = sdb_store_commit(sw->w, err, sizeof err);
	return NULL;
}

/* A commit on another thread's connection is visible to new read transactions before its
 * WAL hook moves the commit epoch. A read that another connection answered with that
 * commit's write, followed by a read that takes over the kept transaction in that window,
 * must still see the write (the kept snapshot began before the commit): sdb_store_keep_reads
 * promises a kept transaction is taken over only while nothing committed since it began. */
static void test_kept_read_not_taken_over_while_a_commit_is_visible(void **state)
{
	fx *f = *state;
	sdb_store_conn *r = NULL, *p = NULL;
	slow_writer sw = {.f = f};
	pthread_t th;

	begin_w(f);
	assert_int_equal(insert(f, 1, 1, NULL), 0);
	commit(f);
	slow_orig = sqlite3_vfs_find(NULL);
	slow_vfs = *slow_orig;
	slow_vfs.zName = "sdb-slow-shm-unlock";
	slow_vfs.xOpen = slow_open;
	assert_int_equal(sqlite3_vfs_register(&slow_vfs, 1), SQLITE_OK);
	assert_int_equal(sdb_store_conn_open(f->st, &r, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_conn_open(f->st, &p, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_conn_open(f->st, &sw.w, f->err, sizeof f->err), 0);
	sqlite3_vfs_unregister(&slow_vfs); /* the connections keep it; no one else gets it */
	sdb_store_keep_reads(r, true);
	assert_int_equal(read_count(f, r), 1);
	assert_true(r->kept);
	atomic_store(&slow_in_window, 0);
	assert_int_equal(pthread_create(&th, NULL, slow_writer_main, &sw), 0);
	for (int i = 0; i < 2000 && !atomic_load(&slow_in_window); i++)
		usleep(1000);
	assert_true(atomic_load(&slow_in_window));
	/* the commit is visible: another connection's new read sees it */
	assert_int_equal(read_count(f, p), 2);
	/* so must this read, sent after that one was answered */
	int64_t n = read_count(f, r);
	pthread_join(th, NULL);
	assert_int_equal(sw.rc, 0);
	sdb_store_conn_close(sw.w);
	sdb_store_conn_close(p);
	sdb_store_conn_close(r);
	assert_int_equal(n, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_crud_and_oplog, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oplog_records_document_key, setup, teardown),
		cmocka_unit_test_setup_teardown(test_decimal_keys_migrated_on_open, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_decimal_keys_rekeyed_after_snapshot_install,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_install_across_page_sizes, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_coll_rename, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ts_monotonic_with_clock_jumps_and_restart,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_version_tokens, setup, teardown),
		cmocka_unit_test_setup_teardown(test_session_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_session_oplog_result_and_import, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_oplog_capped_by_size, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rolled_back_apply_leaves_no_trace, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_replicated_apply_is_deterministic, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_catalog_drop_and_oplog_commands, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_check_finds_data_that_disagrees_with_the_oplog,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_kept_read_is_taken_over_until_a_commit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kept_read_ends_before_any_other_use, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kept_read_only_when_sqlite_still_holds_it, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_kept_read_not_taken_over_while_a_commit_is_visible,
						setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
