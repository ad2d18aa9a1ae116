/* The embedded shard's durable store on SQLite: see store.h for the on-disk layout. */
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


/* ------------------------------------------------------------------ helpers */

static int64_t default_clock_ms(void *arg)
{
	(void)arg;
	return sdb_wall_ms();
}

static int64_t store_now_ms(const sdb_store *st)
{
	return st->opts.clock_ms(st->opts.clock_arg);
}

/* The connection's notion of now: the apply's leader-stamped time inside a replicated
 * apply (every member computes the same), else the store's clock. */
int64_t store_conn_now_ms(const sdb_store_conn *c)
{
	return c->apply ? c->det.now_ms : store_now_ms(c->st);
}

int64_t sdb_store_now_ms(const sdb_store_conn *c)
{
	return store_conn_now_ms(c);
}

void sdb_store_new_oid(sdb_store_conn *c, bson_oid_t *oid)
{
	if (!c->apply) {
		bson_oid_init(oid, NULL);
		return;
	}
	/* MongoDB's layout: 4 bytes of seconds, 5 random bytes, a 3-byte counter; here the
	 * random bytes are the leader's per-entry seed and the counter counts in the entry,
	 * so every member generates the same ids. */
	uint32_t secs = (uint32_t)(c->det.now_ms / 1000);
	uint32_t n = c->det_counter++;
	oid->bytes[0] = (uint8_t)(secs >> 24);
	oid->bytes[1] = (uint8_t)(secs >> 16);
	oid->bytes[2] = (uint8_t)(secs >> 8);
	oid->bytes[3] = (uint8_t)secs;
	memcpy(oid->bytes + 4, c->det.seed, 5);
	oid->bytes[9] = (uint8_t)(n >> 16);
	oid->bytes[10] = (uint8_t)(n >> 8);
	oid->bytes[11] = (uint8_t)n;
}

/* The last SQLite error of this thread that came from the disk or memory rather than from
 * the command (sdb_store_take_io_fault). */
static _Thread_local int io_fault;

static void note_fault(sqlite3 *db)
{
	switch (sqlite3_errcode(db) & 0xff) {
	case SQLITE_FULL:
	case SQLITE_IOERR:
	case SQLITE_CORRUPT:
	case SQLITE_NOMEM:
	case SQLITE_CANTOPEN:
	case SQLITE_NOTADB:
	case SQLITE_READONLY:
		io_fault = sqlite3_extended_errcode(db);
		break;
	default:
		break;
	}
}

int sdb_store_take_io_fault(void)
{
	int f = io_fault;
	io_fault = 0;
	return f;
}

int store_sqlerr(sqlite3 *db, char *err, size_t errlen, const char *what)
{
	note_fault(db);
	return sdb_errf(err, errlen, SDB_EIO, "sqlite %s: %s", what, sqlite3_errmsg(db));
}

int store_exec_sql(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
	char *msg = NULL;
	if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		note_fault(db);
		int rc = sdb_errf(err, errlen, SDB_EIO, "sqlite: %s: %s", sql,
				  msg ? msg : "error");
		sqlite3_free(msg);
		return rc;
	}
	return 0;
}

/* A prepared statement from the connection's cache, reset and unbound. */
sqlite3_stmt *store_stmt_get(sdb_store_conn *c, const char *sql, char *err, size_t errlen)
{
	for (int i = 0; i < STORE_STMT_CACHE; i++) {
		if (c->stmts[i].sql && strcmp(c->stmts[i].sql, sql) == 0) {
			sqlite3_reset(c->stmts[i].stmt);
			sqlite3_clear_bindings(c->stmts[i].stmt);
			return c->stmts[i].stmt;
		}
	}
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL) !=
	    SQLITE_OK) {
		store_sqlerr(c->db, err, errlen, "prepare");
		return NULL;
	}
	stmt_slot *slot = &c->stmts[c->stmt_next++ % STORE_STMT_CACHE];
	if (slot->stmt) {
		sqlite3_finalize(slot->stmt);
		free(slot->sql);
	}
	slot->sql = sdb_strdup(sql);
	slot->stmt = s;
	return s;
}

/* Drop cached statements that name table tbl (before DROP TABLE). */
static void stmt_forget_all(sdb_store_conn *c)
{
	for (int i = 0; i < STORE_STMT_CACHE; i++) {
		if (c->stmts[i].stmt) {
			sqlite3_finalize(c->stmts[i].stmt);
			free(c->stmts[i].sql);
			c->stmts[i].stmt = NULL;
			c->stmts[i].sql = NULL;
		}
	}
}

int64_t store_query_int(sdb_store_conn *c, const char *sql, int64_t def)
{
	char err[128];
	sqlite3_stmt *s = store_stmt_get(c, sql, err, sizeof err);
	if (!s)
		return def;
	int64_t v = def;
	if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
		v = sqlite3_column_int64(s, 0);
	sqlite3_reset(s);
	return v;
}

int store_step_done(sdb_store_conn *c, sqlite3_stmt *s, char *err, size_t errlen,
		     const char *what)
{
	int rc = sqlite3_step(s);
	sqlite3_reset(s);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		return store_sqlerr(c->db, err, errlen, what);
	return 0;
}

void *sdb_store_calloc_aligned(size_t size)
{
	return sdb_aligned_calloc(128, size); /* common/alloc.h */
}

bson_t *sdb_doc_new(void)
{
	bson_t *b = sdb_store_calloc_aligned(sizeof *b);
	bson_init(b);
	return b;
}

bson_t *sdb_doc_copy(const bson_t *src)
{
	bson_t *b = sdb_store_calloc_aligned(sizeof *b);
	bson_copy_to(src, b);
	return b;
}

bson_t *sdb_doc_new_from_data(const uint8_t *data, size_t len)
{
	bson_t view;
	if (!data || !bson_init_static(&view, data, len))
		return NULL;
	return sdb_doc_copy(&view);
}

void sdb_doc_free(bson_t *b)
{
	if (!b)
		return;
	bson_destroy(b);
	free(b);
}

/* ------------------------------------------------------------------ open/close */

static const char *const schema_sql =
	"CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS catalog_coll(db TEXT NOT NULL, coll TEXT NOT NULL,"
	" tbl INTEGER NOT NULL, uuid BLOB NOT NULL, options BLOB NOT NULL,"
	" PRIMARY KEY(db, coll)) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS catalog_index(db TEXT NOT NULL, coll TEXT NOT NULL,"
	" name TEXT NOT NULL, tbl INTEGER NOT NULL, spec BLOB NOT NULL,"
	" multikey INTEGER NOT NULL DEFAULT 0,"
	" PRIMARY KEY(db, coll, name)) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS oplog(ts INTEGER PRIMARY KEY, wall INTEGER NOT NULL,"
	" entry BLOB NOT NULL);"
	"CREATE TABLE IF NOT EXISTS versions(chunk TEXT PRIMARY KEY, token INTEGER NOT NULL)"
	" WITHOUT ROWID;"
	/* filtering metadata of sharded collections (storage/filtering.c, issue #17) */
	"CREATE TABLE IF NOT EXISTS filtering(ns TEXT PRIMARY KEY, cversion INTEGER NOT NULL,"
	" sversion INTEGER NOT NULL, gen INTEGER NOT NULL, doc BLOB NOT NULL) WITHOUT ROWID;"
	/* retryable writes (storage/session.c): added tables, so format 1 files open */
	"CREATE TABLE IF NOT EXISTS txn_sessions(lsid BLOB PRIMARY KEY, txn INTEGER NOT NULL,"
	" last_use INTEGER NOT NULL) WITHOUT ROWID;"
	"CREATE INDEX IF NOT EXISTS txn_sessions_last_use ON txn_sessions(last_use);"
	"CREATE TABLE IF NOT EXISTS txn_stmts(lsid BLOB NOT NULL, stmt INTEGER NOT NULL,"
	" result BLOB NOT NULL, PRIMARY KEY(lsid, stmt)) WITHOUT ROWID;"
	"INSERT OR IGNORE INTO meta(k, v) VALUES('format', 1), ('catalog_gen', 1),"
	" ('next_tbl', 1), ('oplog_trimmed', 0);";

static int conn_pragmas(sdb_store *st, sqlite3 *db, char *err, size_t errlen)
{
	sqlite3_busy_timeout(db, 10000);
	int rc = store_exec_sql(db, "PRAGMA journal_mode=WAL", err, errlen);
	if (rc)
		return rc;
	rc = store_exec_sql(db,
		      st->opts.sync_normal ? "PRAGMA synchronous=NORMAL"
					   : "PRAGMA synchronous=FULL",
		      err, errlen);
	if (rc)
		return rc;
	return store_exec_sql(db, "PRAGMA cache_size=-16384; PRAGMA temp_store=MEMORY", err, errlen);
}

int sdb_store_open(const char *dir, const sdb_store_opts *opts, sdb_store **out, char *err,
		   size_t errlen)
{
	*out = NULL;
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return sdb_errf(err, errlen, SDB_EIO, "store: mkdir %s: %s", dir,
				strerror(errno));
	sdb_store *st = sdb_calloc(1, sizeof *st);
	if (opts)
		st->opts = *opts;
	if (st->opts.oplog_max_bytes <= 0)
		st->opts.oplog_max_bytes = STORE_DEFAULT_OPLOG_BYTES;
	if (!st->opts.clock_ms)
		st->opts.clock_ms = default_clock_ms;
	st->path = sdb_asprintf("%s/shard.db", dir);
	pthread_mutex_init(&st->write_mu, NULL);
	pthread_mutex_init(&st->ts_mu, NULL);

	sqlite3 *db = NULL;
	int rc;
	if (sqlite3_open_v2(st->path, &db,
			    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "store: open %s: %s", st->path,
			      db ? sqlite3_errmsg(db) : "out of memory");
		goto fail;
	}
	rc = conn_pragmas(st, db, err, errlen);
	if (rc)
		goto fail;
	rc = store_exec_sql(db, "BEGIN IMMEDIATE", err, errlen);
	if (rc)
		goto fail;
	rc = store_exec_sql(db, schema_sql, err, errlen);
	if (rc) {
		store_exec_sql(db, "ROLLBACK", NULL, 0);
		goto fail;
	}
	rc = store_exec_sql(db, "COMMIT", err, errlen);
	if (rc)
		goto fail;
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v2(db,
			       "SELECT (SELECT v FROM meta WHERE k='format'),"
			       " (SELECT max(ts) FROM oplog), (SELECT v FROM meta WHERE k='last_ts'),"
			       " (SELECT total(length(entry)) FROM oplog)",
			       -1, &s, NULL) != SQLITE_OK) {
		rc = store_sqlerr(db, err, errlen, "read meta");
		goto fail;
	}
	if (sqlite3_step(s) == SQLITE_ROW) {
		int64_t fmt = sqlite3_column_int64(s, 0);
		uint64_t a = (uint64_t)sqlite3_column_int64(s, 1);
		uint64_t b = (uint64_t)sqlite3_column_int64(s, 2);
		st->last_ts = a > b ? a : b;
		st->oplog_bytes = (int64_t)sqlite3_column_double(s, 3);
		if (fmt != STORE_FORMAT) {
			sqlite3_finalize(s);
			rc = sdb_errf(err, errlen, SDB_ECORRUPT,
				      "store: %s has format %lld, this build reads %d", st->path,
				      (long long)fmt, STORE_FORMAT);
			goto fail;
		}
	}
	sqlite3_finalize(s);
	atomic_store(&st->committed_ts, st->last_ts);
	sqlite3_close(db);
	*out = st;
	return 0;
fail:
	if (db)
		sqlite3_close(db);
	pthread_mutex_destroy(&st->write_mu);
	pthread_mutex_destroy(&st->ts_mu);
	free(st->path);
	free(st);
	return rc;
}

void sdb_store_close(sdb_store *st)
{
	if (!st)
		return;
	pthread_mutex_destroy(&st->write_mu);
	pthread_mutex_destroy(&st->ts_mu);
	free(st->path);
	free(st);
}

static void cache_clear(sdb_store_conn *c)
{
	for (size_t i = 0; i < c->n_colls; i++) {
		sdb_store_coll *co = &c->colls[i];
		free(co->db);
		free(co->coll);
		if (co->options)
			bson_destroy(co->options);
		for (size_t j = 0; j < co->n_indexes; j++) {
			free(co->indexes[j].name);
			bson_destroy(co->indexes[j].spec);
			bson_destroy(co->indexes[j].key);
		}
		free(co->indexes);
	}
	free(c->colls);
	c->colls = NULL;
	c->n_colls = 0;
	c->cache_gen = -1;
}

int sdb_store_conn_open(sdb_store *st, sdb_store_conn **out, char *err, size_t errlen)
{
	*out = NULL;
	sdb_store_conn *c = sdb_calloc(1, sizeof *c);
	c->st = st;
	c->cache_gen = -1;
	if (sqlite3_open_v2(st->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		int rc = sdb_errf(err, errlen, SDB_EIO, "store: open %s: %s", st->path,
				  c->db ? sqlite3_errmsg(c->db) : "out of memory");
		sqlite3_close(c->db);
		free(c);
		return rc;
	}
	int rc = conn_pragmas(st, c->db, err, errlen);
	if (rc) {
		sqlite3_close(c->db);
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void sdb_store_conn_close(sdb_store_conn *c)
{
	if (!c)
		return;
	sdb_store_rollback(c);
	stmt_forget_all(c);
	cache_clear(c);
	sqlite3_close(c->db);
	free(c);
}

/* ------------------------------------------------------------------ catalog cache */

static int cache_load(sdb_store_conn *c, char *err, size_t errlen)
{
	int64_t gen = store_query_int(c, "SELECT v FROM meta WHERE k='catalog_gen'", -1);
	if (gen == c->cache_gen)
		return 0;
	cache_clear(c);
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
			if (bson_iter_init_find(&it, ix->spec, "unique"))
				ix->unique = bson_iter_as_bool(&it);
			if (bson_iter_init_find(&it, ix->spec, "sparse"))
				ix->sparse = bson_iter_as_bool(&it);
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
	return cache_load(c, err, errlen);
}

/* ------------------------------------------------------------------ transactions */

int sdb_store_begin(sdb_store_conn *c, bool write, char *err, size_t errlen)
{
	if (c->in_txn)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: transaction already open");
	if (c->apply) {
		/* one command of a replicated apply: a savepoint inside the apply transaction */
		int rc = store_exec_sql(c->db, "SAVEPOINT cmd", err, errlen);
		if (rc)
			return rc;
		c->in_txn = true;
		c->write = true;
		c->savepoints = 0;
		c->cmd_pending_bytes = c->pending_oplog_bytes;
		c->cmd_last_ts = c->st->last_ts;
		rc = cache_load(c, err, errlen);
		if (rc) {
			sdb_store_rollback(c);
			return rc;
		}
		return 0;
	}
	if (write)
		pthread_mutex_lock(&c->st->write_mu);
	int rc = store_exec_sql(c->db, write ? "BEGIN IMMEDIATE" : "BEGIN", err, errlen);
	if (rc) {
		if (write)
			pthread_mutex_unlock(&c->st->write_mu);
		return sqlite3_errcode(c->db) == SQLITE_BUSY ? SDB_EBUSY : rc;
	}
	c->in_txn = true;
	c->write = write;
	c->pending_oplog_bytes = 0;
	c->pending_ts = 0;
	c->ddl = false;
	c->savepoints = 0;
	/* The first read fixes the snapshot; the catalog is read in it. */
	rc = cache_load(c, err, errlen);
	if (rc) {
		sdb_store_rollback(c);
		return rc;
	}
	return 0;
}

static void txn_end(sdb_store_conn *c, bool committed)
{
	if (c->write) {
		if (committed) {
			c->st->oplog_bytes += c->pending_oplog_bytes;
			if (c->pending_ts)
				atomic_store(&c->st->committed_ts, c->pending_ts);
		}
		pthread_mutex_unlock(&c->st->write_mu);
	}
	if (c->ddl) {
		/* another statement cache entry may name a dropped table */
		stmt_forget_all(c);
		c->cache_gen = -1;
	}
	c->in_txn = false;
	c->write = false;
	c->op_lsid = NULL;
}

int store_oplog_trim(sdb_store_conn *c, char *err, size_t errlen);

int sdb_store_commit(sdb_store_conn *c, char *err, size_t errlen)
{
	if (!c->in_txn)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: no transaction");
	int rc = 0;
	if (c->apply) {
		rc = store_exec_sql(c->db, "RELEASE cmd", err, errlen);
		if (rc) {
			sdb_store_rollback(c);
			return rc;
		}
		c->in_txn = false;
		c->op_lsid = NULL;
		return 0;
	}
	if (c->write && c->pending_ts) {
		rc = store_oplog_trim(c, err, errlen);
		if (rc) {
			sdb_store_rollback(c);
			return rc;
		}
	}
	rc = store_exec_sql(c->db, "COMMIT", err, errlen);
	if (rc) {
		sdb_store_rollback(c);
		return rc;
	}
	txn_end(c, true);
	return 0;
}

void sdb_store_rollback(sdb_store_conn *c)
{
	if (!c->in_txn)
		return;
	if (c->apply) {
		store_exec_sql(c->db, "ROLLBACK TO cmd", NULL, 0);
		store_exec_sql(c->db, "RELEASE cmd", NULL, 0);
		c->pending_oplog_bytes = c->cmd_pending_bytes;
		/* the ts counter goes back too: a member that restarts derives it from disk */
		c->st->last_ts = c->cmd_last_ts;
		c->in_txn = false;
		c->op_lsid = NULL;
		c->cache_gen = -1;
		cache_load(c, NULL, 0);
		return;
	}
	store_exec_sql(c->db, "ROLLBACK", NULL, 0);
	if (c->ddl)
		cache_clear(c);
	txn_end(c, false);
}

int sdb_store_savepoint(sdb_store_conn *c)
{
	char sql[64];
	snprintf(sql, sizeof sql, "SAVEPOINT sp%d", c->savepoints + 1);
	int rc = store_exec_sql(c->db, sql, NULL, 0);
	if (rc == 0)
		c->savepoints++;
	return rc;
}

void sdb_store_savepoint_release(sdb_store_conn *c)
{
	char sql[64];
	if (c->savepoints <= 0)
		return;
	snprintf(sql, sizeof sql, "RELEASE sp%d", c->savepoints--);
	store_exec_sql(c->db, sql, NULL, 0);
}

void sdb_store_savepoint_rollback(sdb_store_conn *c)
{
	char sql[64];
	if (c->savepoints <= 0)
		return;
	snprintf(sql, sizeof sql, "ROLLBACK TO sp%d", c->savepoints);
	store_exec_sql(c->db, sql, NULL, 0);
	snprintf(sql, sizeof sql, "RELEASE sp%d", c->savepoints--);
	store_exec_sql(c->db, sql, NULL, 0);
	/* a rolled-back DDL must not leave a stale cache */
	c->cache_gen = -1;
	cache_load(c, NULL, 0);
}

/* ------------------------------------------------------------------ replicated apply */

int sdb_store_apply_begin(sdb_store_conn *c, const sdb_store_det *det, char *err,
			  size_t errlen)
{
	if (c->in_txn || c->apply)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: transaction already open");
	pthread_mutex_lock(&c->st->write_mu);
	int rc = store_exec_sql(c->db, "BEGIN IMMEDIATE", err, errlen);
	if (rc) {
		pthread_mutex_unlock(&c->st->write_mu);
		return sqlite3_errcode(c->db) == SQLITE_BUSY ? SDB_EBUSY : rc;
	}
	c->apply = true;
	c->det = *det;
	c->det_counter = 0;
	c->pending_oplog_bytes = 0;
	c->pending_ts = 0;
	c->ddl = false;
	c->savepoints = 0;
	/* The ts counter comes from disk, not from this process's history, so that a member
	 * that restarted allocates the same ts as one that did not. */
	{
		uint64_t a = (uint64_t)store_query_int(c, "SELECT max(ts) FROM oplog", 0);
		uint64_t b = (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='last_ts'", 0);
		pthread_mutex_lock(&c->st->ts_mu);
		c->st->last_ts = a > b ? a : b;
		pthread_mutex_unlock(&c->st->ts_mu);
	}
	c->cache_gen = -1;
	rc = cache_load(c, err, errlen);
	if (rc) {
		sdb_store_apply_rollback(c);
		return rc;
	}
	return 0;
}

static void apply_end(sdb_store_conn *c, bool committed)
{
	if (committed) {
		c->st->oplog_bytes += c->pending_oplog_bytes;
		if (c->pending_ts)
			atomic_store(&c->st->committed_ts, c->pending_ts);
	}
	if (c->ddl || !committed) {
		stmt_forget_all(c);
		c->cache_gen = -1;
	}
	c->apply = false;
	c->in_txn = false;
	c->write = false;
	c->op_lsid = NULL;
	pthread_mutex_unlock(&c->st->write_mu);
}

int sdb_store_apply_commit(sdb_store_conn *c, uint64_t index, char *err, size_t errlen)
{
	if (!c->apply || c->in_txn)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: no apply transaction to commit");
	int rc = 0;
	if (c->pending_ts)
		rc = store_oplog_trim(c, err, errlen);
	if (rc == 0) {
		sqlite3_stmt *s = store_stmt_get(
			c, "INSERT OR REPLACE INTO meta(k, v) VALUES('raft_applied', ?)", err, errlen);
		rc = SDB_EIO;
		if (s) {
			sqlite3_bind_int64(s, 1, (int64_t)index);
			rc = store_step_done(c, s, err, errlen, "raft_applied");
		}
	}
	if (rc == 0)
		rc = store_exec_sql(c->db, "COMMIT", err, errlen);
	if (rc) {
		sdb_store_apply_rollback(c);
		return rc;
	}
	apply_end(c, true);
	return 0;
}

void sdb_store_apply_rollback(sdb_store_conn *c)
{
	if (!c->apply)
		return;
	store_exec_sql(c->db, "ROLLBACK", NULL, 0);
	cache_clear(c);
	{
		/* the ts counter advanced by the rolled-back writes goes back to what disk says */
		uint64_t a = (uint64_t)store_query_int(c, "SELECT max(ts) FROM oplog", 0);
		uint64_t b = (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='last_ts'", 0);
		pthread_mutex_lock(&c->st->ts_mu);
		c->st->last_ts = a > b ? a : b;
		pthread_mutex_unlock(&c->st->ts_mu);
	}
	apply_end(c, false);
}

uint64_t sdb_store_applied_index(sdb_store_conn *c)
{
	return (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='raft_applied'", 0);
}

int sdb_store_set_durability(sdb_store_conn *c, bool full, char *err, size_t errlen)
{
	return store_exec_sql(c->db, full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
			err, errlen);
}

int sdb_store_sync(sdb_store_conn *c, char *err, size_t errlen)
{
	/* A commit with synchronous=FULL fsyncs the WAL, and with it every transaction
	 * committed before (WAL frames are appended in commit order). */
	int rc = store_exec_sql(c->db, "PRAGMA synchronous=FULL", err, errlen);
	if (rc == 0)
		rc = store_exec_sql(c->db,
			      "BEGIN IMMEDIATE; UPDATE meta SET v = v WHERE k='format'; COMMIT",
			      err, errlen);
	if (rc)
		store_exec_sql(c->db, "ROLLBACK", NULL, 0);
	store_exec_sql(c->db, "PRAGMA synchronous=NORMAL", NULL, 0);
	return rc;
}

int sdb_store_meta_put(sdb_store_conn *c, const char *key, const char *value, char *err,
		       size_t errlen)
{
	if (!c->apply && !(c->in_txn && c->write))
		return sdb_errf(err, errlen, SDB_EINVAL, "store: meta_put needs a write transaction");
	sqlite3_stmt *s = store_stmt_get(c, "INSERT OR REPLACE INTO meta(k, v) VALUES(?, ?)", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, value, -1, SQLITE_STATIC);
	return store_step_done(c, s, err, errlen, "meta put");
}

int sdb_store_meta_scan(sdb_store_conn *c, const char *prefix,
			void (*fn)(void *arg, const char *key, const char *value), void *arg)
{
	sqlite3_stmt *s = NULL;
	int rc;
	/* its own statement: the cache's may be mid-step in the caller */
	if (sqlite3_prepare_v2(c->db, "SELECT k, v FROM meta WHERE substr(k, 1, ?1) = ?2", -1, &s,
			       NULL) != SQLITE_OK)
		return store_sqlerr(c->db, NULL, 0, "meta scan");
	sqlite3_bind_int(s, 1, (int)strlen(prefix));
	sqlite3_bind_text(s, 2, prefix, -1, SQLITE_STATIC);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		const char *k = (const char *)sqlite3_column_text(s, 0);
		const char *v = (const char *)sqlite3_column_text(s, 1);
		if (k && v)
			fn(arg, k, v);
	}
	sqlite3_finalize(s);
	return rc == SQLITE_DONE ? 0 : SDB_EIO;
}

/* ------------------------------------------------------------------ whole-database copies */

int sdb_store_copy_to(sdb_store_conn *c, const char *path, uint64_t *applied, char *err,
		      size_t errlen)
{
	sqlite3 *dst = NULL;
	sqlite3_backup *bk;
	int rc = SDB_EIO;

	unlink(path);
	if (sqlite3_open_v2(path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
	    SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy: open %s: %s", path,
			      dst ? sqlite3_errmsg(dst) : "out of memory");
		goto out;
	}
	/* one step over every page: one read transaction of the source, so the copy is
	 * consistent; pages go through the page caches, so memory stays bounded */
	bk = sqlite3_backup_init(dst, "main", c->db, "main");
	if (!bk) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy: %s", sqlite3_errmsg(dst));
		goto out;
	}
	int step = sqlite3_backup_step(bk, -1);
	if (sqlite3_backup_finish(bk) != SQLITE_OK || step != SQLITE_DONE) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy to %s: %s", path, sqlite3_errmsg(dst));
		goto out;
	}
	{
		sqlite3_stmt *s = NULL;
		*applied = 0;
		if (sqlite3_prepare_v2(dst, "SELECT v FROM meta WHERE k='raft_applied'", -1, &s,
				       NULL) == SQLITE_OK &&
		    sqlite3_step(s) == SQLITE_ROW)
			*applied = (uint64_t)sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
	}
	/* the copy is a plain rollback-journal file (no -wal to ship alongside) */
	if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, NULL) != SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy: %s", sqlite3_errmsg(dst));
		goto out;
	}
	rc = 0;
out:
	sqlite3_close(dst);
	if (rc)
		unlink(path);
	return rc;
}

int sdb_store_replace_from(sdb_store_conn *c, const char *path, uint64_t *applied, char *err,
			   size_t errlen)
{
	sqlite3 *src = NULL;
	sqlite3_backup *bk;
	int rc = SDB_EIO;
	int64_t gen_before = store_query_int(c, "SELECT v FROM meta WHERE k='catalog_gen'", 0);

	if (c->in_txn || c->apply)
		return sdb_errf(err, errlen, SDB_EINVAL, "replace: a transaction is open");
	if (sqlite3_open_v2(path, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "replace: open %s: %s", path,
			      src ? sqlite3_errmsg(src) : "out of memory");
		goto out;
	}
	{
		/* a copy of another store only: same format */
		sqlite3_stmt *s = NULL;
		int64_t fmt = -1;
		if (sqlite3_prepare_v2(src, "SELECT v FROM meta WHERE k='format'", -1, &s, NULL) ==
			    SQLITE_OK &&
		    sqlite3_step(s) == SQLITE_ROW)
			fmt = sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
		if (fmt != STORE_FORMAT) {
			rc = sdb_errf(err, errlen, SDB_ECORRUPT,
				      "replace: %s is not a stripedb shard store of format %d", path,
				      STORE_FORMAT);
			goto out;
		}
	}
	pthread_mutex_lock(&c->st->write_mu);
	stmt_forget_all(c);
	bk = sqlite3_backup_init(c->db, "main", src, "main");
	if (!bk) {
		pthread_mutex_unlock(&c->st->write_mu);
		rc = sdb_errf(err, errlen, SDB_EIO, "replace: %s", sqlite3_errmsg(c->db));
		goto out;
	}
	int step;
	/* in steps, so that readers of the old content are not starved of the lock forever */
	do {
		step = sqlite3_backup_step(bk, 4096);
		if (step == SQLITE_BUSY || step == SQLITE_LOCKED)
			sqlite3_sleep(5);
	} while (step == SQLITE_OK || step == SQLITE_BUSY || step == SQLITE_LOCKED);
	int fin = sqlite3_backup_finish(bk);
	if (step != SQLITE_DONE || fin != SQLITE_OK) {
		pthread_mutex_unlock(&c->st->write_mu);
		rc = sdb_errf(err, errlen, SDB_EIO, "replace from %s: %s", path,
			      sqlite3_errmsg(c->db));
		goto out;
	}
	/* every connection's catalog cache must reload: move the generation past both */
	{
		int64_t gen_after = store_query_int(c, "SELECT v FROM meta WHERE k='catalog_gen'", 0);
		char sql[96];
		snprintf(sql, sizeof sql, "UPDATE meta SET v = %lld WHERE k='catalog_gen'",
			 (long long)((gen_after > gen_before ? gen_after : gen_before) + 1));
		if (store_exec_sql(c->db, sql, err, errlen) != 0) {
			pthread_mutex_unlock(&c->st->write_mu);
			goto out;
		}
	}
	{
		uint64_t a = (uint64_t)store_query_int(c, "SELECT max(ts) FROM oplog", 0);
		uint64_t b = (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='last_ts'", 0);
		pthread_mutex_lock(&c->st->ts_mu);
		c->st->last_ts = a > b ? a : b;
		pthread_mutex_unlock(&c->st->ts_mu);
		c->st->oplog_bytes =
			store_query_int(c, "SELECT coalesce(sum(length(entry)), 0) FROM oplog", 0);
		atomic_store(&c->st->committed_ts, c->st->last_ts);
	}
	*applied = (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='raft_applied'", 0);
	pthread_mutex_unlock(&c->st->write_mu);
	c->cache_gen = -1;
	rc = 0;
out:
	sqlite3_close(src);
	return rc;
}

/* ------------------------------------------------------------------ internals for session.c */

sqlite3_stmt *sdb_store_int_stmt(sdb_store_conn *c, const char *sql, char *err, size_t errlen)
{
	return store_stmt_get(c, sql, err, errlen);
}

int sdb_store_int_step_done(sdb_store_conn *c, sqlite3_stmt *s, char *err, size_t errlen,
			    const char *what)
{
	return store_step_done(c, s, err, errlen, what);
}

int sdb_store_int_sqlerr(sdb_store_conn *c, char *err, size_t errlen, const char *what)
{
	return store_sqlerr(c->db, err, errlen, what);
}

int64_t sdb_store_int_now_ms(sdb_store_conn *c)
{
	return store_conn_now_ms(c);
}

int64_t sdb_store_int_session_timeout_ms(sdb_store_conn *c)
{
	return c->st->opts.session_timeout_ms > 0 ? c->st->opts.session_timeout_ms
						  : SDB_STORE_SESSION_TIMEOUT_MS;
}

int64_t *sdb_store_int_sweep_mark(sdb_store_conn *c)
{
	return &c->st->session_sweep_ms;
}

bool sdb_store_int_in_write(const sdb_store_conn *c)
{
	return c->in_txn && c->write;
}

void sdb_store_set_op_session(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int32_t stmt)
{
	c->op_lsid = lsid ? bson_get_data(lsid) : NULL;
	c->op_lsid_len = lsid ? sdb_store_doc_len(lsid) : 0;
	c->op_txn = txn;
	c->op_stmt = stmt;
	c->op_first_ts = 0;
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

char *store_ns_of(const char *db, const char *coll)
{
	return sdb_asprintf("%s.%s", db, coll);
}

int sdb_store_coll_create(sdb_store_conn *c, const char *db, const char *coll,
			  const bson_t *options, const char *origin, const sdb_store_coll **out,
			  char *err, size_t errlen)
{
	if (out)
		*out = NULL;
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
	stmt_forget_all(c);
	snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s_%lld", prefix, (long long)tbl);
	return store_exec_sql(c->db, sql, err, errlen);
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
	sqlite3_stmt *s = store_stmt_get(c, "DELETE FROM catalog_coll WHERE db = ? AND coll = ?", err,
				   errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "catalog delete");
	if (rc)
		goto out;
	s = store_stmt_get(c, "DELETE FROM catalog_index WHERE db = ? AND coll = ?", err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_text(s, 1, db, -1, SQLITE_STATIC);
	sqlite3_bind_text(s, 2, coll, -1, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "catalog delete");
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
		int rc = coll_drop_impl(c, co, origin, false, err, errlen);
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

/* ------------------------------------------------------------------ keys */


void store_keyset_init(store_keyset *ks)
{
	ks->keys = NULL;
	ks->n = 0;
}

void store_keyset_destroy(store_keyset *ks)
{
	if (ks->keys)
		sdb_index_keys_free(ks->keys, ks->n);
	ks->keys = NULL;
	ks->n = 0;
}

#define STORE_MAX_INDEX_FIELDS 32

/* Split a key pattern into paths and directions. Returns the number of fields. */
static size_t pattern_fields(const bson_t *pattern, const char **paths, bool *desc)
{
	bson_iter_t it;
	size_t n = 0;
	if (!bson_iter_init(&it, pattern))
		return 0;
	while (bson_iter_next(&it) && n < STORE_MAX_INDEX_FIELDS) {
		paths[n] = bson_iter_key(&it);
		desc[n] = BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_double(&it) < 0;
		n++;
	}
	return n;
}

static bool visit_present(void *ctx, const bson_iter_t *it, unsigned flags)
{
	(void)it;
	if (!(flags & SDB_PATH_MISSING)) {
		*(bool *)ctx = true;
		return true;
	}
	return false;
}

int store_key_index_keys(const bson_t *pattern, const bson_t *doc, store_keyset *ks,
				bool *all_missing, bool *multikey_out, char *err, size_t errlen)
{
	const char *paths[STORE_MAX_INDEX_FIELDS];
	bool desc[STORE_MAX_INDEX_FIELDS];
	size_t nf = pattern_fields(pattern, paths, desc);
	bool multikey = false;
	int code = 0;
	int rc = sdb_index_keys(doc, paths, desc, nf, &ks->keys, &ks->n, &multikey, &code, err,
				errlen);
	if (rc)
		return rc;
	bool any = false;
	for (size_t i = 0; i < nf && !any; i++)
		sdb_path_walk(doc, paths[i], 0, visit_present, &any);
	*all_missing = !any;
	if (multikey_out)
		*multikey_out = multikey;
	return 0;
}

/* Key patterns: field -> 1 / -1 (any non-zero number); "hashed", "text", "2d" are refused. */
int store_key_check_pattern(const bson_t *pattern, char *err, size_t errlen)
{
	bson_iter_t it;
	size_t n = 0;
	if (!bson_iter_init(&it, pattern))
		return sdb_errf(err, errlen, SDB_EINVAL, "bad key pattern");
	while (bson_iter_next(&it)) {
		char perr[128];
		if (!sdb_path_valid(bson_iter_key(&it), perr, sizeof perr))
			return sdb_errf(err, errlen, SDB_EINVAL, "Error in specification: %s", perr);
		if (BSON_ITER_HOLDS_UTF8(&it))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"Unknown index plugin '%s' (the embedded shard supports "
					"ascending and descending indexes only)",
					bson_iter_utf8(&it, NULL));
		if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_double(&it) == 0)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"Values in the index key pattern can only be numbers or "
					"strings: bad value for field %s",
					bson_iter_key(&it));
		n++;
	}
	if (n > STORE_MAX_INDEX_FIELDS)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Index key pattern has more than %d fields", STORE_MAX_INDEX_FIELDS);
	return 0;
}

typedef struct first_value {
	bson_value_t v;
	bool found;
} first_value;

static bool visit_first(void *ctx, const bson_iter_t *it, unsigned flags)
{
	first_value *fv = ctx;
	if (flags & SDB_PATH_MISSING)
		return false;
	fv->v = *bson_iter_value((bson_iter_t *)it);
	fv->found = true;
	return true;
}

/* keyValue of a duplicate-key error: {field: value-at-path (first reached, or null)}. */
static void store_key_dup_value(const bson_t *pattern, const bson_t *doc, bson_t *out)
{
	bson_init(out);
	bson_iter_t it;
	if (!bson_iter_init(&it, pattern))
		return;
	while (bson_iter_next(&it)) {
		first_value fv = {0};
		sdb_path_walk(doc, bson_iter_key(&it), 0, visit_first, &fv);
		if (fv.found)
			bson_append_value(out, bson_iter_key(&it), -1, &fv.v);
		else
			bson_append_null(out, bson_iter_key(&it), -1);
	}
}

/* The clashing key of a multikey unique index names the element that clashed, as
 * mongod's keyValue does ({tags: "x"}, not the whole array): for each field in turn,
 * find a value the path reaches (leaf arrays expanded) whose encoding is the next
 * component of the encoded key. */
typedef struct dup_probe {
	const uint8_t *key;
	size_t len, off;
	bool desc, found;
	bson_value_t v;
	size_t vlen;
} dup_probe;

static bool dup_probe_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	dup_probe *p = ctx;
	sdb_key k = {0};
	char e[128];
	bool missing = (flags & SDB_PATH_MISSING) || it == NULL;
	if (sdb_keyenc_append_iter(&k, missing ? NULL : it, p->desc, e, sizeof e) == 0 &&
	    p->off + k.len <= p->len && memcmp(p->key + p->off, k.data, k.len) == 0) {
		if (missing)
			p->v.value_type = BSON_TYPE_NULL; /* a missing field is indexed as null */
		else
			p->v = *bson_iter_value((bson_iter_t *)it);
		p->vlen = k.len;
		p->found = true;
	}
	sdb_key_free(&k);
	return p->found;
}

/* keyValue for the encoded key (key, len) of doc under pattern; false when some field's
 * component was not recognised (then the caller reports the first values reached). */
static bool store_key_dup_value_of(const bson_t *pattern, const bson_t *doc, const uint8_t *key,
				   size_t len, bson_t *out)
{
	bson_iter_t it;
	size_t off = 0;
	bson_init(out);
	if (!bson_iter_init(&it, pattern))
		return false;
	while (bson_iter_next(&it)) {
		dup_probe p = {.key = key, .len = len, .off = off,
			       .desc = bson_iter_as_double(&it) < 0};
		sdb_path_walk(doc, bson_iter_key(&it), SDB_PATH_EXPAND_LEAF, dup_probe_visit, &p);
		if (!p.found)
			return false; /* out stays initialized: the caller destroys it */
		bson_append_value(out, bson_iter_key(&it), -1, &p.v);
		off += p.vlen;
	}
	return off == len;
}

/* A set of byte strings (document keys already returned by a multikey index scan). */
typedef struct store_idset {
	sdb_key *slots;
	size_t cap, n;
} store_idset;

static void store_idset_init(store_idset *s)
{
	memset(s, 0, sizeof *s);
}

static void store_idset_destroy(store_idset *s)
{
	for (size_t i = 0; i < s->cap; i++)
		sdb_key_free(&s->slots[i]);
	free(s->slots);
	memset(s, 0, sizeof *s);
}

static uint64_t blob_hash(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

/* Add (p, n); false when it was there already. Empty slots have data == NULL. */
static bool store_idset_add(store_idset *s, const void *p, size_t n)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 64;
		sdb_key *ns = sdb_calloc(ncap, sizeof *ns);
		for (size_t i = 0; i < s->cap; i++) {
			if (!s->slots[i].data)
				continue;
			size_t j = blob_hash(s->slots[i].data, s->slots[i].len) & (ncap - 1);
			while (ns[j].data)
				j = (j + 1) & (ncap - 1);
			ns[j] = s->slots[i];
		}
		free(s->slots);
		s->slots = ns;
		s->cap = ncap;
	}
	size_t j = blob_hash(p, n) & (s->cap - 1);
	while (s->slots[j].data) {
		if (s->slots[j].len == n && memcmp(s->slots[j].data, p, n) == 0)
			return false;
		j = (j + 1) & (s->cap - 1);
	}
	sdb_key_init(&s->slots[j]);
	sdb_key_append(&s->slots[j], n ? p : "", n ? n : 1);
	if (!n)
		s->slots[j].len = 0;
	s->n++;
	return true;
}

/* ------------------------------------------------------------------ documents */

void sdb_store_dup_clear(sdb_store_dup *d)
{
	if (!d || !d->set)
		return;
	free(d->errmsg);
	bson_destroy(&d->key_pattern);
	bson_destroy(&d->key_value);
	memset(d, 0, sizeof *d);
}

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

static void dup_fill(sdb_store_dup *dup, const char *db, const char *coll, const char *index,
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

int store_id_key(const bson_t *doc, sdb_key *kb, bson_iter_t *id_it, char *err,
		  size_t errlen)
{
	if (!bson_iter_init_find(id_it, doc, "_id"))
		return sdb_errf(err, errlen, SDB_EINVAL, "document has no _id");
	bson_type_t t = bson_iter_type(id_it);
	if (t == BSON_TYPE_ARRAY)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"The '_id' value cannot be of type array");
	if (t == BSON_TYPE_REGEX || t == BSON_TYPE_UNDEFINED)
		return sdb_errf(err, errlen, SDB_EINVAL, "can't use a %s for _id",
				t == BSON_TYPE_REGEX ? "regex" : "undefined");
	sdb_key_reset(kb);
	return sdb_keyenc_append_iter(kb, id_it, false, err, errlen);
}

/* Index keys of doc for index ix: a set of encoded keys (multikey expands arrays). */
int store_index_keys(const sdb_store_index *ix, const bson_t *doc, store_keyset *ks,
		      bool *all_missing, char *err, size_t errlen)
{
	return store_key_index_keys(ix->key, doc, ks, all_missing, NULL, err, errlen);
}

/* Record that ix became multikey (in this transaction; the cache entry is updated in
 * place, other connections reload the catalog at their next transaction). */
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
	if (rc == 0)
		ix->multikey = true;
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
				dup_fill(dup, co->db, co->coll, ix->name, ix->key, &kv);
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

/* Add doc's keys to every index of co (skipping sparse indexes where all fields are
 * missing). */
static int indexes_add(sdb_store_conn *c, sdb_store_coll *co, const bson_t *doc,
		       const sdb_key *idk, sdb_store_dup *dup, char *err, size_t errlen)
{
	for (size_t i = 0; i < co->n_indexes; i++) {
		sdb_store_index *ix = &co->indexes[i];
		store_keyset ks;
		store_keyset_init(&ks);
		bool missing = false, multikey = false;
		int rc = store_key_index_keys(ix->key, doc, &ks, &missing, &multikey, err, errlen);
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

static int indexes_remove(sdb_store_conn *c, const sdb_store_coll *co, const bson_t *doc,
			  const sdb_key *idk, char *err, size_t errlen)
{
	for (size_t i = 0; i < co->n_indexes; i++) {
		const sdb_store_index *ix = &co->indexes[i];
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

static void id_doc(const bson_iter_t *id_it, bson_t *out)
{
	bson_init(out);
	bson_append_iter(out, "_id", 3, id_it);
}

int sdb_store_insert(sdb_store_conn *c, const char *db, const char *coll, const bson_t *doc,
		     const char *origin, sdb_store_dup *dup, char *err, size_t errlen)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	int rc;
	if (!co) {
		rc = sdb_store_coll_create(c, db, coll, NULL, origin, &co, err, errlen);
		if (rc)
			return rc;
	}
	sdb_key idk;
	sdb_key_init(&idk);
	bson_iter_t id_it;
	rc = store_id_key(doc, &idk, &id_it, err, errlen);
	if (rc)
		goto out;
	char sql[128];
	snprintf(sql, sizeof sql, "INSERT OR IGNORE INTO c_%lld(k, doc) VALUES(?, ?)",
		 (long long)co->tbl);
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_blob(s, 1, idk.data, (int)idk.len, SQLITE_STATIC);
	sqlite3_bind_blob(s, 2, bson_get_data(doc), (int)sdb_store_doc_len(doc), SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "insert");
	if (rc)
		goto out;
	if (sqlite3_changes(c->db) == 0) {
		bson_t kp = BSON_INITIALIZER, kv;
		BSON_APPEND_INT32(&kp, "_id", 1);
		id_doc(&id_it, &kv);
		dup_fill(dup, db, coll, "_id_", &kp, &kv);
		rc = sdb_errf(err, errlen, SDB_EEXISTS, "%s",
			      dup ? dup->errmsg : "duplicate key");
		bson_destroy(&kp);
		bson_destroy(&kv);
		goto out;
	}
	rc = indexes_add(c, (sdb_store_coll *)co, doc, &idk, dup, err, errlen);
	if (rc)
		goto out;
	char *ns = store_ns_of(db, coll);
	rc = store_oplog_append(c, "i", ns, co->uuid, doc, NULL, origin, err, errlen);
	free(ns);
out:
	sdb_key_free(&idk);
	return rc;
}

/* Load the stored document for key idk into out (heap copy). Returns 0 or SDB_ENOTFOUND. */
static int load_doc(sdb_store_conn *c, const sdb_store_coll *co, const sdb_key *idk,
		    bson_t *out, char *err, size_t errlen)
{
	char sql[96];
	snprintf(sql, sizeof sql, "SELECT doc FROM c_%lld WHERE k = ?", (long long)co->tbl);
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_blob(s, 1, idk->data, (int)idk->len, SQLITE_STATIC);
	int r = sqlite3_step(s);
	int rc = 0;
	if (r == SQLITE_ROW) {
		const uint8_t *d = sqlite3_column_blob(s, 0);
		size_t n = (size_t)sqlite3_column_bytes(s, 0);
		bson_t view;
		if (!bson_init_static(&view, d, n))
			rc = sdb_errf(err, errlen, SDB_ECORRUPT, "corrupt document");
		else
			bson_copy_to(&view, out);
	} else if (r == SQLITE_DONE) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND, "no such document");
	} else {
		rc = store_sqlerr(c->db, err, errlen, "load");
	}
	sqlite3_reset(s);
	return rc;
}

int sdb_store_replace(sdb_store_conn *c, const char *db, const char *coll,
		      const bson_t *old_doc, const bson_t *new_doc, const char *origin,
		      sdb_store_dup *dup, char *err, size_t errlen)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	sdb_key idk, idk2;
	sdb_key_init(&idk);
	sdb_key_init(&idk2);
	bson_iter_t id_it, id2;
	bson_t stored;
	bool have_stored = false;
	int rc = store_id_key(old_doc, &idk, &id_it, err, errlen);
	if (rc)
		goto out;
	rc = store_id_key(new_doc, &idk2, &id2, err, errlen);
	if (rc)
		goto out;
	if (idk.len != idk2.len || memcmp(idk.data, idk2.data, idk.len) != 0) {
		rc = sdb_errf(err, errlen, SDB_EINVAL,
			      "Performing an update on the path '_id' would modify the immutable "
			      "field '_id'");
		goto out;
	}
	/* Index maintenance works from the stored image, never the caller's copy. */
	rc = load_doc(c, co, &idk, &stored, err, errlen);
	if (rc)
		goto out;
	have_stored = true;
	rc = indexes_remove(c, co, &stored, &idk, err, errlen);
	if (rc)
		goto out;
	char sql[128];
	snprintf(sql, sizeof sql, "UPDATE c_%lld SET doc = ? WHERE k = ?", (long long)co->tbl);
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_blob(s, 1, bson_get_data(new_doc), (int)sdb_store_doc_len(new_doc), SQLITE_STATIC);
	sqlite3_bind_blob(s, 2, idk.data, (int)idk.len, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "update");
	if (rc)
		goto out;
	rc = indexes_add(c, (sdb_store_coll *)co, new_doc, &idk, dup, err, errlen);
	if (rc)
		goto out;
	bson_t o2;
	id_doc(&id_it, &o2);
	char *ns = store_ns_of(db, coll);
	rc = store_oplog_append(c, "u", ns, co->uuid, new_doc, &o2, origin, err, errlen);
	free(ns);
	bson_destroy(&o2);
out:
	if (have_stored)
		bson_destroy(&stored);
	sdb_key_free(&idk);
	sdb_key_free(&idk2);
	return rc;
}

int sdb_store_delete(sdb_store_conn *c, const char *db, const char *coll, const bson_t *doc,
		     const char *origin, char *err, size_t errlen)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	sdb_key idk;
	sdb_key_init(&idk);
	bson_iter_t id_it;
	bson_t stored;
	bool have_stored = false;
	int rc = store_id_key(doc, &idk, &id_it, err, errlen);
	if (rc)
		goto out;
	rc = load_doc(c, co, &idk, &stored, err, errlen);
	if (rc)
		goto out;
	have_stored = true;
	rc = indexes_remove(c, co, &stored, &idk, err, errlen);
	if (rc)
		goto out;
	char sql[96];
	snprintf(sql, sizeof sql, "DELETE FROM c_%lld WHERE k = ?", (long long)co->tbl);
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_blob(s, 1, idk.data, (int)idk.len, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "delete");
	if (rc)
		goto out;
	bson_t o;
	id_doc(&id_it, &o);
	char *ns = store_ns_of(db, coll);
	rc = store_oplog_append(c, "d", ns, co->uuid, &o, NULL, origin, err, errlen);
	free(ns);
	bson_destroy(&o);
out:
	if (have_stored)
		bson_destroy(&stored);
	sdb_key_free(&idk);
	return rc;
}

int sdb_store_get_by_id(sdb_store_conn *c, const char *db, const char *coll,
			const bson_iter_t *id, bson_t *out, char *err, size_t errlen)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	sdb_key idk;
	sdb_key_init(&idk);
	int rc = sdb_keyenc_append_iter(&idk, id, false, err, errlen);
	if (rc == 0)
		rc = load_doc(c, co, &idk, out, err, errlen);
	sdb_key_free(&idk);
	return rc;
}

int64_t sdb_store_count(sdb_store_conn *c, const char *db, const char *coll)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return 0;
	char sql[96];
	snprintf(sql, sizeof sql, "SELECT count(*) FROM c_%lld", (long long)co->tbl);
	return store_query_int(c, sql, 0);
}

int64_t sdb_store_data_size(sdb_store_conn *c, const char *db, const char *coll)
{
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return 0;
	char sql[96];
	snprintf(sql, sizeof sql, "SELECT total(length(doc)) FROM c_%lld", (long long)co->tbl);
	char err[64];
	sqlite3_stmt *s = store_stmt_get(c, sql, err, sizeof err);
	if (!s)
		return 0;
	int64_t v = 0;
	if (sqlite3_step(s) == SQLITE_ROW)
		v = (int64_t)sqlite3_column_double(s, 0);
	sqlite3_reset(s);
	return v;
}

/* ------------------------------------------------------------------ scans */

struct sdb_store_cursor {
	sdb_store_conn *conn;
	sqlite3_stmt *stmt; /* private statement */
	const sdb_store_coll *co;
	const sdb_store_index *ix; /* NULL: collection scan */
	sdb_store_range *ranges;   /* copies */
	size_t n_ranges, cur_range;
	bool reverse, started;
	int64_t keys, docs;
	store_idset seen;
};

static void range_free(sdb_store_range *r)
{
	free((void *)r->lo);
	free((void *)r->hi);
}

static int cursor_prepare_range(sdb_store_cursor *cur, char *err, size_t errlen)
{
	sdb_store_conn *c = cur->conn;
	sdb_store_range open = {0};
	size_t idx = cur->reverse ? cur->n_ranges - 1 - cur->cur_range : cur->cur_range;
	const sdb_store_range *r = cur->n_ranges ? &cur->ranges[idx] : &open;
	char sql[400];
	char where[160] = "";
	const char *col = cur->ix ? "i.k" : "k";
	size_t wl = 0;
	if (r->lo)
		wl += (size_t)snprintf(where + wl, sizeof where - wl, " WHERE %s %s ?1", col,
				       r->lo_incl ? ">=" : ">");
	if (r->hi)
		snprintf(where + wl, sizeof where - wl, " %s %s %s ?2", r->lo ? "AND" : "WHERE",
			 col, r->hi_incl ? "<=" : "<");
	const char *dir = cur->reverse ? "DESC" : "ASC";
	if (cur->ix)
		snprintf(sql, sizeof sql,
			 "SELECT i.id, c.doc FROM i_%lld i JOIN c_%lld c ON c.k = i.id%s "
			 "ORDER BY i.k %s, i.id %s",
			 (long long)cur->ix->tbl, (long long)cur->co->tbl, where, dir, dir);
	else
		snprintf(sql, sizeof sql, "SELECT k, doc FROM c_%lld%s ORDER BY k %s",
			 (long long)cur->co->tbl, where, dir);
	if (cur->stmt)
		sqlite3_finalize(cur->stmt);
	cur->stmt = NULL;
	if (sqlite3_prepare_v2(c->db, sql, -1, &cur->stmt, NULL) != SQLITE_OK)
		return store_sqlerr(c->db, err, errlen, "scan");
	if (r->lo)
		sqlite3_bind_blob(cur->stmt, 1, r->lo, (int)r->lo_len, SQLITE_STATIC);
	if (r->hi)
		sqlite3_bind_blob(cur->stmt, 2, r->hi, (int)r->hi_len, SQLITE_STATIC);
	return 0;
}

int sdb_store_scan(sdb_store_conn *c, const char *db, const char *coll, const char *index,
		   const sdb_store_range *ranges, size_t n_ranges, bool reverse,
		   sdb_store_cursor **out, char *err, size_t errlen)
{
	*out = NULL;
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	const sdb_store_index *ix = NULL;
	if (index) {
		for (size_t i = 0; i < co->n_indexes; i++)
			if (strcmp(co->indexes[i].name, index) == 0)
				ix = &co->indexes[i];
		if (!ix)
			return sdb_errf(err, errlen, SDB_EINVAL, "no such index: %s", index);
	}
	sdb_store_cursor *cur = sdb_calloc(1, sizeof *cur);
	cur->conn = c;
	cur->co = co;
	cur->ix = ix;
	cur->reverse = reverse;
	cur->n_ranges = n_ranges;
	if (n_ranges) {
		cur->ranges = sdb_calloc(n_ranges, sizeof *cur->ranges);
		for (size_t i = 0; i < n_ranges; i++) {
			cur->ranges[i] = ranges[i];
			if (ranges[i].lo) {
				void *p = sdb_malloc(ranges[i].lo_len ? ranges[i].lo_len : 1);
				memcpy(p, ranges[i].lo, ranges[i].lo_len);
				cur->ranges[i].lo = p;
			}
			if (ranges[i].hi) {
				void *p = sdb_malloc(ranges[i].hi_len ? ranges[i].hi_len : 1);
				memcpy(p, ranges[i].hi, ranges[i].hi_len);
				cur->ranges[i].hi = p;
			}
		}
	}
	store_idset_init(&cur->seen);
	int rc = cursor_prepare_range(cur, err, errlen);
	if (rc) {
		sdb_store_cursor_close(cur);
		return rc;
	}
	*out = cur;
	return 0;
}

int sdb_store_cursor_next(sdb_store_cursor *cur, bson_t *doc, char *err, size_t errlen)
{
	if (!cur)
		return 0;
	for (;;) {
		if (!cur->stmt)
			return 0;
		int r = sqlite3_step(cur->stmt);
		if (r == SQLITE_ROW) {
			cur->keys++;
			const void *id = sqlite3_column_blob(cur->stmt, 0);
			size_t idlen = (size_t)sqlite3_column_bytes(cur->stmt, 0);
			if (cur->ix && !store_idset_add(&cur->seen, id, idlen))
				continue; /* multikey: seen already */
			cur->docs++;
			if (!bson_init_static(doc, sqlite3_column_blob(cur->stmt, 1),
					      (size_t)sqlite3_column_bytes(cur->stmt, 1)))
				return sdb_errf(err, errlen, SDB_ECORRUPT,
						"corrupt document in %s.%s", cur->co->db,
						cur->co->coll);
			return 1;
		}
		if (r != SQLITE_DONE)
			return store_sqlerr(cur->conn->db, err, errlen, "scan");
		if (cur->cur_range + 1 >= cur->n_ranges) {
			sqlite3_finalize(cur->stmt);
			cur->stmt = NULL;
			return 0;
		}
		cur->cur_range++;
		int rc = cursor_prepare_range(cur, err, errlen);
		if (rc)
			return rc;
	}
}

void sdb_store_cursor_stats(const sdb_store_cursor *cur, int64_t *keys, int64_t *docs)
{
	*keys = cur ? (cur->ix ? cur->keys : 0) : 0;
	*docs = cur ? cur->docs : 0;
}

void sdb_store_cursor_close(sdb_store_cursor *cur)
{
	if (!cur)
		return;
	if (cur->stmt)
		sqlite3_finalize(cur->stmt);
	for (size_t i = 0; i < cur->n_ranges; i++)
		range_free(&cur->ranges[i]);
	free(cur->ranges);
	store_idset_destroy(&cur->seen);
	free(cur);
}

/* ------------------------------------------------------------------ version tokens */

int sdb_store_version_check(sdb_store_conn *c, const char *chunk, int64_t token,
			    int64_t *stored, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c, "SELECT token FROM versions WHERE chunk = ?", err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, chunk, -1, SQLITE_STATIC);
	*stored = 0;
	int r = sqlite3_step(s);
	if (r == SQLITE_ROW)
		*stored = sqlite3_column_int64(s, 0);
	sqlite3_reset(s);
	if (r != SQLITE_ROW && r != SQLITE_DONE)
		return store_sqlerr(c->db, err, errlen, "version check");
	if (token < *stored)
		return sdb_errf(err, errlen, SDB_ESTALE,
				"version token %lld of chunk %s is older than the shard's %lld",
				(long long)token, chunk, (long long)*stored);
	return 0;
}

int sdb_store_version_set(sdb_store_conn *c, const char *chunk, int64_t token,
			  int64_t *stored, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c,
				   "INSERT INTO versions(chunk, token) VALUES(?1, ?2) "
				   "ON CONFLICT(chunk) DO UPDATE SET token = max(token, ?2)",
				   err, errlen);
	if (!s)
		return SDB_EIO;
	sqlite3_bind_text(s, 1, chunk, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, token);
	int rc = store_step_done(c, s, err, errlen, "version set");
	if (rc)
		return rc;
	return sdb_store_version_check(c, chunk, INT64_MAX, stored, err, errlen);
}
