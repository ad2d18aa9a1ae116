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
#include "storage/docdiff.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/store_int.h"
#include "common/bsonval.h"


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

void store_release_kept(sdb_store_conn *c)
{
	if (!c->kept)
		return;
	c->kept = false; /* first: the ROLLBACK below goes through store_stmt_get */
	store_exec_cached(c, "ROLLBACK", NULL, 0);
}

void sdb_store_keep_reads(sdb_store_conn *c, bool on)
{
	c->keep_reads = on;
	if (!on)
		store_release_kept(c);
}

void sdb_store_release_read(sdb_store_conn *c)
{
	if (c)
		store_release_kept(c);
}

bool sdb_store_read_kept(const sdb_store_conn *c)
{
	return c != NULL && c->kept;
}

uint64_t sdb_store_reads_taken_over(sdb_store *st)
{
	return atomic_load_explicit(&st->reads_taken_over, memory_order_relaxed);
}

/* A prepared statement from the connection's cache, reset and unbound. */
sqlite3_stmt *store_stmt_get(sdb_store_conn *c, const char *sql, char *err, size_t errlen)
{
	/* a statement outside sdb_store_begin(c, false) must not run in a kept snapshot */
	if (c->kept)
		store_release_kept(c);
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

static void slots_forget(stmt_slot *slots, int n)
{
	for (int i = 0; i < n; i++) {
		if (slots[i].stmt) {
			sqlite3_finalize(slots[i].stmt);
			free(slots[i].sql);
			slots[i].stmt = NULL;
			slots[i].sql = NULL;
		}
	}
}

/* Drop cached statements that name table tbl (before DROP TABLE). */
void store_stmt_forget_all(sdb_store_conn *c)
{
	slots_forget(c->stmts, STORE_STMT_CACHE);
	for (int i = 0; i < STORE_SCAN_IDLE; i++) {
		sqlite3_finalize(c->scan_idle[i].stmt);
		c->scan_idle[i].stmt = NULL;
	}
}

int store_exec_cached(sdb_store_conn *c, const char *sql, char *err, size_t errlen)
{
	sqlite3_stmt *s = store_stmt_get(c, sql, err, errlen);
	if (s == NULL)
		return SDB_EIO;
	return store_step_done(c, s, err, errlen, sql);
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

bson_t *sdb_doc_new(void)
{
	bson_t *b = sdb_calloc_bson(1, sizeof *b);
	bson_init(b);
	return b;
}

bson_t *sdb_doc_copy(const bson_t *src)
{
	bson_t *b = sdb_calloc_bson(1, sizeof *b);
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
	"INSERT OR IGNORE INTO meta(k, v) VALUES('format', 2), ('catalog_gen', 1),"
	" ('next_tbl', 1), ('oplog_trimmed', 0);";

static int conn_pragmas(sdb_store *st, sqlite3 *db, char *err, size_t errlen)
{
	sqlite3_busy_timeout(db, 10000);
	/* page_size: 8 KiB pages for a new database (SQLite applies it only when the file is
	 * created: an existing store keeps its size, and every path here reads either). A
	 * collection is a WITHOUT ROWID table (catalog.c), whose b-tree cells hold whole rows,
	 * interior cells included; with 4 KiB pages a row over ~1,000 bytes spills to an
	 * overflow page, and every comparison of a lookup's descent copied the whole row out
	 * (perf, YCSB A on one shard, 50,000 documents of ~1.1 KiB: sqlite3BtreeIndexMoveto's
	 * memmove and sqlite3Get4byte's overflow walks about 8% of the shard's CPU). 8 KiB
	 * keeps such rows on their page (up to ~2,000 bytes) and the tree shallower: shard CPU
	 * per op about -15% on YCSB C and A (alternated A/B, tests/bench/README.md); 16
	 * KiB saved a little more on reads but cost the updates more (a WAL frame is a page).
	 * Copies (copy.c) take the source's page size unless asked for another, and a copy
	 * of another size than the store's is rewritten at its size before the install
	 * (SQLite's backup into a WAL database takes only its own size). */
	int rc = store_exec_sql(db, "PRAGMA page_size=" STORE_STR(STORE_PAGE_BYTES), err,
				errlen);
	if (rc)
		return rc;
	rc = store_exec_sql(db, "PRAGMA journal_mode=WAL", err, errlen);
	if (rc)
		return rc;
	rc = store_exec_sql(db,
		      st->opts.sync_normal ? "PRAGMA synchronous=NORMAL"
					   : "PRAGMA synchronous=FULL",
		      err, errlen);
	if (rc)
		return rc;
	/* temp_store=FILE: a savepoint's statement journal over 64 KiB spills to a temporary
	 * file. In memory (temp_store=MEMORY) it is a chunk list that SQLite walks from its head
	 * at every seek and truncate, which perf showed at 28% of a shard's CPU applying
	 * 1,000-document inserts (one savepoint per document in one transaction); on a shard of
	 * 150,000 2 KiB documents an entry of 1,000 of them applied in 215-254 ms instead of
	 * 242-330 ms (3 alternating runs, release build). */
	rc = store_exec_sql(db, "PRAGMA cache_size=-16384; PRAGMA temp_store=FILE", err, errlen);
	if (rc)
		return rc;
	/* mmap_size: the first GiB of the database file is read through a shared memory map
	 * instead of pread into each connection's page cache (16 MiB, smaller than a shard's
	 * data): perf showed pread at 11% of a shard's CPU on point reads (YCSB C, 50,000
	 * documents of 1 KiB, 16 clients), and the map cut the shard's CPU per read by 25%
	 * (release build, alternating runs). Writes still go through the WAL. The price,
	 * SQLite's documented one: a disk error while reading a mapped page is a SIGBUS, so the
	 * member stops (fail-stop, as mongod's fassert on an I/O error) instead of answering
	 * the read with an error; its replica set elects another primary. */
	return store_exec_sql(db, "PRAGMA mmap_size=" STORE_MMAP_SIZE, err, errlen);
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
		if (fmt != STORE_FORMAT && fmt != STORE_FORMAT_LONG_DOUBLE_KEYS) {
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
	db = NULL;
	rc = store_migrate_decimal_keys(st, err, errlen);
	if (rc == 0)
		rc = store_partial_rebuild(st, err, errlen);
	if (rc == 0)
		rc = store_ckpt_start(st, conn_pragmas, err, errlen);
	if (rc)
		goto fail;
	*out = st;
	return 0;
fail:
	store_ckpt_stop(st);
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
	store_ckpt_stop(st);
	pthread_mutex_destroy(&st->write_mu);
	pthread_mutex_destroy(&st->ts_mu);
	free(st->path);
	free(st);
}

void store_cache_clear(sdb_store_conn *c)
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
			sdb_matcher_free(co->indexes[j].partial);
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
	store_ckpt_attach(st, c->db);
	*out = c;
	return 0;
}

void sdb_store_conn_close(sdb_store_conn *c)
{
	if (!c)
		return;
	c->keep_reads = false;
	sdb_store_rollback(c);
	store_release_kept(c);
	store_stmt_forget_all(c);
	store_cache_clear(c);
	sqlite3_close(c->db);
	free(c);
}

/* ------------------------------------------------------------------ transactions */

/* c's state for a transaction it just opened, or took over (a kept read) */
static void txn_opened(sdb_store_conn *c, bool write)
{
	c->in_txn = true;
	c->write = write;
	c->pending_oplog_bytes = 0;
	c->pending_ts = 0;
	c->ddl = false;
	c->cache_touched = false;
	c->savepoints = 0;
}

int sdb_store_begin(sdb_store_conn *c, bool write, char *err, size_t errlen)
{
	if (c->in_txn)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: transaction already open");
	if (c->kept) {
		/* the read transaction the last read left open (sdb_store_keep_reads): its
		 * snapshot is the store's newest while nothing committed since it began, and
		 * its catalog cache was loaded in it; SQLite must still have it open.
		 * commits_running first: a commit that is visible (another connection may
		 * have read it) either still runs or has moved the epoch by the time the
		 * epoch is read */
		if (!write && !c->apply && atomic_load(&c->st->commits_running) == 0 &&
		    atomic_load(&c->st->commit_epoch) == c->txn_epoch &&
		    !sqlite3_get_autocommit(c->db)) {
			c->kept = false;
			txn_opened(c, false);
			atomic_fetch_add_explicit(&c->st->reads_taken_over, 1, memory_order_relaxed);
			return 0;
		}
		store_release_kept(c);
	}
	if (c->apply) {
		/* one command of a replicated apply: a savepoint inside the apply transaction */
		int rc = store_exec_cached(c, "SAVEPOINT cmd", err, errlen);
		if (rc)
			return rc;
		c->in_txn = true;
		c->write = true;
		c->savepoints = 0;
		c->cmd_pending_bytes = c->pending_oplog_bytes;
		c->cmd_last_ts = c->st->last_ts;
		/* a cache loaded in this apply transaction is current: only this connection
		 * writes until it commits, and its own catalog writes reload the cache, update
		 * it in place (multikey) or, rolled back, clear it (cache_gen -1) */
		if (c->cache_gen != -1)
			return 0;
		rc = store_cache_load(c, err, errlen);
		if (rc) {
			sdb_store_rollback(c);
			return rc;
		}
		return 0;
	}
	if (write)
		pthread_mutex_lock(&c->st->write_mu);
	/* before the snapshot begins (at the catalog's read below): a commit that lands after
	 * this load moves the epoch past it, so a kept snapshot is never taken for newer */
	c->txn_epoch = atomic_load(&c->st->commit_epoch);
	int rc = store_exec_cached(c, write ? "BEGIN IMMEDIATE" : "BEGIN", err, errlen);
	if (rc) {
		if (write)
			pthread_mutex_unlock(&c->st->write_mu);
		return sqlite3_errcode(c->db) == SQLITE_BUSY ? SDB_EBUSY : rc;
	}
	txn_opened(c, write);
	/* The first read fixes the snapshot; the catalog is read in it. */
	rc = store_cache_load(c, err, errlen);
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
			atomic_fetch_add(&c->st->commit_epoch, 1); /* the WAL hook did too */
		}
		pthread_mutex_unlock(&c->st->write_mu);
	}
	if (c->ddl) {
		/* another statement cache entry may name a dropped table */
		store_stmt_forget_all(c);
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
		rc = store_exec_cached(c, "RELEASE cmd", err, errlen);
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
	atomic_fetch_add(&c->st->commits_running, 1);
	rc = store_exec_cached(c, "COMMIT", err, errlen);
	if (rc) {
		atomic_fetch_sub(&c->st->commits_running, 1);
		sdb_store_rollback(c);
		return rc;
	}
	txn_end(c, true); /* moves commit_epoch */
	atomic_fetch_sub(&c->st->commits_running, 1);
	return 0;
}

bool sdb_store_conn_idle(const sdb_store_conn *c)
{
	return !c->in_txn && !c->apply;
}

void sdb_store_rollback(sdb_store_conn *c)
{
	if (!c || !c->in_txn)
		return;
	if (c->apply) {
		store_exec_cached(c, "ROLLBACK TO cmd", NULL, 0);
		store_exec_cached(c, "RELEASE cmd", NULL, 0);
		c->pending_oplog_bytes = c->cmd_pending_bytes;
		/* the ts counter goes back too: a member that restarts derives it from disk */
		c->st->last_ts = c->cmd_last_ts;
		c->in_txn = false;
		c->op_lsid = NULL;
		c->cache_gen = -1;
		store_cache_load(c, NULL, 0);
		return;
	}
	if (c->keep_reads && !c->write && !c->ddl && !c->cache_touched && c->savepoints == 0 &&
	    c->st->ckpt != NULL && !sqlite3_get_autocommit(c->db)) {
		/* a read: left open for the next (sdb_store_keep_reads); only on a store
		 * with its checkpoint thread, whose WAL hook moves the epoch after every
		 * commit of every connection, those outside sdb_store_commit too */
		c->kept = true;
		txn_end(c, false);
		return;
	}
	store_exec_cached(c, "ROLLBACK", NULL, 0);
	if (c->ddl || c->cache_touched)
		store_cache_clear(c);
	txn_end(c, false);
}

int sdb_store_savepoint(sdb_store_conn *c)
{
	char sql[64];
	snprintf(sql, sizeof sql, "SAVEPOINT sp%d", c->savepoints + 1);
	int rc = store_exec_cached(c, sql, NULL, 0);
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
	store_exec_cached(c, sql, NULL, 0);
}

void sdb_store_savepoint_rollback(sdb_store_conn *c)
{
	char sql[64];
	if (c->savepoints <= 0)
		return;
	snprintf(sql, sizeof sql, "ROLLBACK TO sp%d", c->savepoints);
	store_exec_cached(c, sql, NULL, 0);
	snprintf(sql, sizeof sql, "RELEASE sp%d", c->savepoints--);
	store_exec_cached(c, sql, NULL, 0);
	/* a rolled-back DDL must not leave a stale cache */
	c->cache_gen = -1;
	store_cache_load(c, NULL, 0);
}

/* ------------------------------------------------------------------ replicated apply */

int sdb_store_apply_begin(sdb_store_conn *c, const sdb_store_det *det, char *err,
			  size_t errlen)
{
	if (c->in_txn || c->apply)
		return sdb_errf(err, errlen, SDB_EINVAL, "store: transaction already open");
	store_release_kept(c);
	pthread_mutex_lock(&c->st->write_mu);
	int rc = store_exec_cached(c, "BEGIN IMMEDIATE", err, errlen);
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
	c->cache_touched = false;
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
	/* the catalog cache is reloaded only when catalog_gen moved: every catalog write bumps
	 * it (store_catalog_bump, store_index_mark_multikey), a whole-store copy moves it past
	 * both stores' (sdb_store_replace_from), and a rollback clears the cache */
	rc = store_cache_load(c, err, errlen);
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
		atomic_fetch_add(&c->st->commit_epoch, 1); /* the WAL hook did too */
	}
	if (c->ddl || !committed) {
		store_stmt_forget_all(c);
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
	if (rc == 0) {
		atomic_fetch_add(&c->st->commits_running, 1);
		rc = store_exec_cached(c, "COMMIT", err, errlen);
		if (rc)
			atomic_fetch_sub(&c->st->commits_running, 1);
	}
	if (rc) {
		sdb_store_apply_rollback(c);
		return rc;
	}
	apply_end(c, true); /* moves commit_epoch */
	atomic_fetch_sub(&c->st->commits_running, 1);
	return 0;
}

void sdb_store_apply_rollback(sdb_store_conn *c)
{
	if (!c->apply)
		return;
	store_exec_sql(c->db, "ROLLBACK", NULL, 0);
	store_cache_clear(c);
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

int sdb_store_write_code(const sdb_store_conn *c)
{
	return c->write_code;
}

uint64_t sdb_store_applied_index(sdb_store_conn *c)
{
	return (uint64_t)store_query_int(c, "SELECT v FROM meta WHERE k='raft_applied'", 0);
}

int sdb_store_set_durability(sdb_store_conn *c, bool full, char *err, size_t errlen)
{
	store_release_kept(c);
	return store_exec_sql(c->db, full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
			err, errlen);
}

int sdb_store_sync(sdb_store_conn *c, char *err, size_t errlen)
{
	store_release_kept(c);
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

	store_release_kept(c);
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
	c->op_in_txn = false;
}

void sdb_store_set_op_txn(sdb_store_conn *c)
{
	c->op_in_txn = c->op_lsid != NULL;
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

int store_id_key(const bson_t *doc, sdb_key *kb, bson_iter_t *id_it, int *code, char *err,
		 size_t errlen)
{
	if (!bson_iter_init_find(id_it, doc, "_id")) {
		if (code)
			*code = 2; /* BadValue */
		return sdb_errf(err, errlen, SDB_EINVAL, "document has no _id");
	}
	bson_type_t t = bson_iter_type(id_it);
	if (t == BSON_TYPE_ARRAY || t == BSON_TYPE_REGEX || t == BSON_TYPE_UNDEFINED) {
		if (code)
			*code = 53; /* InvalidIdField */
		if (t == BSON_TYPE_ARRAY)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"The '_id' value cannot be of type array");
		return sdb_errf(err, errlen, SDB_EINVAL, "can't use a %s for _id",
				t == BSON_TYPE_REGEX ? "regex" : "undefined");
	}
	sdb_key_reset(kb);
	return sdb_keyenc_append_iter(kb, id_it, false, err, errlen);
}


static void id_doc(const bson_iter_t *id_it, bson_t *out)
{
	bson_init(out);
	bson_append_iter(out, "_id", 3, id_it);
}

/* The documentKey of doc (MongoDB's getDocumentKey, op_observer_util.cpp, and
 * ShardKeyPattern::extractShardKeyFromDoc's template extraction) as the write records it
 * in its oplog entry: when the store has filtering metadata for db.coll (a sharded
 * collection) the shard key's fields of doc (in the key pattern's order, those present, a
 * dotted field under its dotted name, a hashed field's value itself) then _id (unless the
 * pattern names it), else {_id}. id_it: doc's _id. Read in the write's transaction, so it
 * is the key known when the write happened: a later drop, re-creation with another key
 * or shardCollection leaves it as it was. out is initialised on every path (bson_destroy
 * it). Errors: SDB_EIO (the filtering metadata cannot be read or does not parse; out is
 * then {_id}). */
static int doc_key(sdb_store_conn *c, const char *db, const char *coll, const bson_t *doc,
		   const bson_iter_t *id_it, bson_t *out, char *err, size_t errlen)
{
	int64_t cv, sv, gen;
	bson_t *fdoc = NULL;
	bson_iter_t k, v, d;
	bool id_in_key = false;
	char *ns = sdb_ns_join(db, coll);
	int rc = sdb_store_filtering_get(c, ns, &cv, &sv, &gen, &fdoc, err, errlen);

	free(ns);
	if (rc == SDB_ENOTFOUND || (rc == 0 && !fdoc)) {
		id_doc(id_it, out);
		return 0;
	}
	if (rc != 0 || !bson_iter_init_find(&k, fdoc, "key") || !BSON_ITER_HOLDS_DOCUMENT(&k) ||
	    !bson_iter_recurse(&k, &k)) {
		if (rc == 0)
			rc = sdb_errf(err, errlen, SDB_EIO,
				      "filtering metadata of %s.%s has no key pattern", db, coll);
		if (fdoc)
			bson_destroy(fdoc);
		id_doc(id_it, out);
		return rc;
	}
	bson_init(out);
	while (bson_iter_next(&k)) {
		const char *f = bson_iter_key(&k);
		if (strcmp(f, "_id") == 0) {
			id_in_key = true;
			bson_append_iter(out, "_id", 3, id_it);
		} else if (bson_iter_init(&v, doc) && bson_iter_find_descendant(&v, f, &d)) {
			bson_append_iter(out, f, -1, &d);
		}
	}
	if (!id_in_key)
		bson_append_iter(out, "_id", 3, id_it);
	bson_destroy(fdoc);
	return 0;
}

/* The cached statement of sql_fmt (one %lld: the collection's table number) for co.
 * Returns: the statement (store_stmt_get's), or NULL with the error in err. */
static sqlite3_stmt *coll_stmt(sdb_store_conn *c, const sdb_store_coll *co, const char *sql_fmt,
			       char *err, size_t errlen)
{
	char sql[160];

	snprintf(sql, sizeof sql, sql_fmt, (long long)co->tbl);
	return store_stmt_get(c, sql, err, errlen);
}

/* Most bytes of o, o2 and updateDescription together in one document write's oplog entry
 * (16 MiB + 16 KiB, mongod's BSONObjMaxInternalSize, less 1 KiB for the other fields). */
#define STORE_OPLOG_OBJS_MAX (16 * 1024 * 1024 + 15 * 1024)

/* Append an oplog entry (op "i", "u" or "d") for a write to db.coll: o the entry's object,
 * o2 (may be NULL) its o2, ud (may be NULL) an update's description; each records its
 * documentKey (doc_key: o2 of "i"/"u", o of "d") and says so (docKey: true). Errors:
 * SDB_EINVAL (o, o2 and ud above STORE_OPLOG_OBJS_MAX), store_oplog_append_ud's. */
static int coll_oplog(sdb_store_conn *c, const char *op, const char *db, const char *coll,
		      const sdb_store_coll *co, const bson_t *o, const bson_t *o2,
		      const bson_t *ud, const char *origin, char *err, size_t errlen)
{
	/* an entry must stay readable in one reply (mongod's BSONObjMaxInternalSize):
	 * a document near 16 MiB whose documentKey is huge too (a multi-MiB _id or shard
	 * key value) would not be; refused like mongod's oversized oplog entry (BadValue) */
	if ((size_t)o->len + (o2 ? o2->len : 0) + (ud ? ud->len : 0) > STORE_OPLOG_OBJS_MAX)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"the oplog entry of this write (the document and its documentKey) "
				"would exceed %d bytes",
				STORE_OPLOG_OBJS_MAX);
	char *ns = sdb_ns_join(db, coll);
	int rc = store_oplog_append_ud(c, op, ns, co->uuid, o, o2, ud, true, origin, err, errlen);

	free(ns);
	return rc;
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
	c->write_code = 0;
	rc = store_id_key(doc, &idk, &id_it, &c->write_code, err, errlen);
	if (rc)
		goto out;
	sqlite3_stmt *s =
		coll_stmt(c, co, "INSERT OR IGNORE INTO c_%lld(k, doc) VALUES(?, ?)", err, errlen);
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
		store_dup_fill(dup, db, coll, "_id_", &kp, &kv);
		rc = sdb_errf(err, errlen, SDB_EEXISTS, "%s",
			      dup ? dup->errmsg : "duplicate key");
		bson_destroy(&kp);
		bson_destroy(&kv);
		goto out;
	}
	rc = store_indexes_add(c, (sdb_store_coll *)co, doc, &idk, dup, err, errlen);
	if (rc)
		goto out;
	/* o2: the documentKey, as mongod 5.3+ writes an insert (OpObserverImpl::onInserts;
	 * a migration's copies too, with this shard's filtering metadata) */
	bson_t key;
	rc = doc_key(c, db, coll, doc, &id_it, &key, err, errlen);
	if (rc == 0)
		rc = coll_oplog(c, "i", db, coll, co, doc, &key, NULL, origin, err, errlen);
	bson_destroy(&key);
out:
	sdb_key_free(&idk);
	return rc;
}

/* Load the stored document for key idk into out (heap copy). Returns 0 or SDB_ENOTFOUND. */
static int load_doc(sdb_store_conn *c, const sdb_store_coll *co, const sdb_key *idk,
		    bson_t *out, char *err, size_t errlen)
{
	sqlite3_stmt *s = coll_stmt(c, co, "SELECT doc FROM c_%lld WHERE k = ?", err, errlen);
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

/* The first half of deleting the document with _id key idk: its stored
 * image into *stored (*have_stored set once it is; the caller destroys it) and its index
 * entries removed; index maintenance works from the stored image, never a caller's copy.
 * Returns: 0, or load_doc's / indexes_remove's error. */
static int unindex_stored(sdb_store_conn *c, const sdb_store_coll *co, const sdb_key *idk,
			  bson_t *stored, bool *have_stored, char *err, size_t errlen)
{
	int rc = load_doc(c, co, idk, stored, err, errlen);

	if (rc)
		return rc;
	*have_stored = true;
	return store_indexes_remove(c, co, stored, idk, err, errlen);
}

#ifdef SDB_DEBUG
/* Debug builds: abort unless image is, byte for byte, the stored document with key idk
 * (the promise of sdb_store_update_stored's caller). */
static void check_stored_image(sdb_store_conn *c, const sdb_store_coll *co, const sdb_key *idk,
			       const bson_t *image)
{
	bson_t stored;
	char err[128];

	if (load_doc(c, co, idk, &stored, err, sizeof err) != 0)
		return; /* no such document: the UPDATE finds none and says so */
	if (stored.len != image->len ||
	    memcmp(bson_get_data(&stored), bson_get_data(image), stored.len) != 0) {
		fprintf(stderr, "store: sdb_store_update_stored given an image that is not the "
				"stored document\n");
		abort();
	}
	bson_destroy(&stored);
}
#endif

/* sdb_store_replace, sdb_store_update and sdb_store_update_stored: the "u" entry carries
 * ud when given, else the description of kind (computed from the stored image and
 * new_doc). old_is_stored: old_doc is the stored image (sdb_store_update_stored), so the
 * document is not read again: the UPDATE by key is the write's one descent of the
 * collection's B-tree, and no row updated means no such document. */
static int replace_doc(sdb_store_conn *c, const char *db, const char *coll,
		       const bson_t *old_doc, bool old_is_stored, const bson_t *new_doc,
		       sdb_store_upd_kind kind, const bson_t *ud, const char *origin,
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
	c->write_code = 0;
	int rc = store_id_key(old_doc, &idk, &id_it, &c->write_code, err, errlen);
	if (rc)
		goto out;
	rc = store_id_key(new_doc, &idk2, &id2, &c->write_code, err, errlen);
	if (rc)
		goto out;
	if (idk.len != idk2.len || memcmp(idk.data, idk2.data, idk.len) != 0) {
		rc = sdb_errf(err, errlen, SDB_EINVAL,
			      "Performing an update on the path '_id' would modify the immutable "
			      "field '_id'");
		goto out;
	}
	const bson_t *pre = &stored; /* the stored image */
	if (old_is_stored) {
#ifdef SDB_DEBUG
		check_stored_image(c, co, &idk, old_doc);
#endif
		pre = old_doc;
	} else {
		rc = load_doc(c, co, &idk, &stored, err, errlen);
		if (rc)
			goto out;
		have_stored = true;
	}
	sqlite3_stmt *s = coll_stmt(c, co, "UPDATE c_%lld SET doc = ? WHERE k = ?", err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_blob(s, 1, bson_get_data(new_doc), (int)sdb_store_doc_len(new_doc), SQLITE_STATIC);
	sqlite3_bind_blob(s, 2, idk.data, (int)idk.len, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "update");
	if (rc)
		goto out;
	/* index entries go after the row is known to exist: nothing to undo otherwise */
	if (old_is_stored && sqlite3_changes(c->db) == 0) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND, "no such document");
		goto out;
	}
	rc = store_indexes_update(c, (sdb_store_coll *)co, pre, new_doc, &idk, dup, err, errlen);
	if (rc)
		goto out;
	bson_t o2, desc;
	bool have_desc = false;
	if (!ud && kind != SDB_STORE_UPD_REPLACE) {
		/* both images in hand: the stored one (loaded here, or the stored image the
		 * caller of sdb_store_update_stored read) and the new one */
		int drc = sdb_docdiff_describe(pre, new_doc,
					       kind == SDB_STORE_UPD_PIPELINE ? SDB_DOCDIFF_PIPELINE
									      : SDB_DOCDIFF_MODIFIER,
					       &desc);
		if (drc < 0) {
			bson_destroy(&desc);
			rc = sdb_errf(err, errlen, SDB_ECORRUPT,
				      "update description: a document that does not parse");
			goto out;
		}
		have_desc = drc == 1;
		if (have_desc)
			ud = &desc;
		else
			bson_destroy(&desc); /* a pipeline update logged as a replacement */
	}
	if (ud && (size_t)new_doc->len + ud->len > SDB_STORE_UD_MAX_BYTES)
		ud = NULL; /* the entry would not fit in a reply: logged as a replacement */
	/* o2: the documentKey of the stored pre-image (mongod's update stage:
	 * args.criteria = collDesc.extractDocumentKey(oldObj) for a user's write, the
	 * document's {_id} for an internal one: a migration's, with origin) */
	if (origin)
		id_doc(&id_it, &o2);
	else
		rc = doc_key(c, db, coll, pre, &id_it, &o2, err, errlen);
	if (rc == 0)
		rc = coll_oplog(c, "u", db, coll, co, new_doc, &o2, ud, origin, err, errlen);
	bson_destroy(&o2);
	if (have_desc)
		bson_destroy(&desc);
out:
	if (have_stored)
		bson_destroy(&stored);
	sdb_key_free(&idk);
	sdb_key_free(&idk2);
	return rc;
}

int sdb_store_replace(sdb_store_conn *c, const char *db, const char *coll,
		      const bson_t *old_doc, const bson_t *new_doc, const char *origin,
		      sdb_store_dup *dup, char *err, size_t errlen)
{
	return replace_doc(c, db, coll, old_doc, false, new_doc, SDB_STORE_UPD_REPLACE, NULL,
			   origin, dup, err, errlen);
}

int sdb_store_update(sdb_store_conn *c, const char *db, const char *coll,
		     const bson_t *old_doc, const bson_t *new_doc, sdb_store_upd_kind kind,
		     const bson_t *ud, const char *origin, sdb_store_dup *dup, char *err,
		     size_t errlen)
{
	return replace_doc(c, db, coll, old_doc, false, new_doc, kind, ud, origin, dup, err,
			   errlen);
}

int sdb_store_update_stored(sdb_store_conn *c, const char *db, const char *coll,
			    const bson_t *stored, const bson_t *new_doc, sdb_store_upd_kind kind,
			    const bson_t *ud, const char *origin, sdb_store_dup *dup, char *err,
			    size_t errlen)
{
	return replace_doc(c, db, coll, stored, true, new_doc, kind, ud, origin, dup, err,
			   errlen);
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
	int rc = store_id_key(doc, &idk, &id_it, NULL, err, errlen);
	if (rc)
		goto out;
	rc = unindex_stored(c, co, &idk, &stored, &have_stored, err, errlen);
	if (rc)
		goto out;
	sqlite3_stmt *s = coll_stmt(c, co, "DELETE FROM c_%lld WHERE k = ?", err, errlen);
	rc = SDB_EIO;
	if (!s)
		goto out;
	sqlite3_bind_blob(s, 1, idk.data, (int)idk.len, SQLITE_STATIC);
	rc = store_step_done(c, s, err, errlen, "delete");
	if (rc)
		goto out;
	/* o: the documentKey of the stored image (OpObserverImpl::onDelete's
	 * documentKey.getShardKeyAndId(); a range deletion's too) */
	bson_t o;
	rc = doc_key(c, db, coll, &stored, &id_it, &o, err, errlen);
	if (rc == 0)
		rc = coll_oplog(c, "d", db, coll, co, &o, NULL, NULL, origin, err, errlen);
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
