/* Whole-database copies: a consistent copy of shard.db into a file and its installation in
 * place (snapshots of a shard replica set, see store.h). */
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


/* ------------------------------------------------------------------ whole-database copies */

/* The page size of the database open on db in bytes, 0 when it cannot be read. */
static int db_page_size(sqlite3 *db)
{
	sqlite3_stmt *s = NULL;
	int page = 0;

	if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW)
		page = sqlite3_column_int(s, 0);
	sqlite3_finalize(s);
	return page;
}

/* Rewrite the database open on db at page bytes per page into *conv (heap, "PATH.pagesize"
 * beside path; replaced): SQLite's backup into a WAL database refuses a source of another
 * page size, so a copy of the wrong size is rewritten (VACUUM INTO: no temporary database,
 * disk for one more copy). Returns: 0, or SDB_EIO with err naming what (the caller's
 * prefix). *conv is set either way (the caller unlinks and frees it). */
static int rewrite_page_size(sqlite3 *db, const char *path, int page, char **conv,
			     const char *what, char *err, size_t errlen)
{
	*conv = sdb_asprintf("%s.pagesize", path);
	unlink(*conv);
	char *sql = sqlite3_mprintf("PRAGMA page_size=%d; VACUUM INTO %Q", page, *conv);
	int vrc = sql ? sqlite3_exec(db, sql, NULL, NULL, NULL) : SQLITE_NOMEM;
	sqlite3_free(sql);
	if (vrc != SQLITE_OK)
		return sdb_errf(err, errlen, SDB_EIO, "%s: rewriting %s with pages of %d bytes: %s",
				what, path, page, sqlite3_errmsg(db));
	return 0;
}

int sdb_store_page_size(sdb_store_conn *c)
{
	return db_page_size(c->db);
}

int sdb_store_copy_to(sdb_store_conn *c, const char *path, int page_size, uint64_t *applied,
		      char *err, size_t errlen)
{
	sqlite3 *dst = NULL;
	sqlite3_backup *bk;
	char *conv = NULL;
	int rc = SDB_EIO;

	store_release_kept(c); /* the backup reads c's snapshot: the newest */
	unlink(path);
	if (sqlite3_open_v2(path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
	    SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy: open %s: %s", path,
			      dst ? sqlite3_errmsg(dst) : "out of memory");
		goto out;
	}
	/* The source reads the copy through its page cache, not its memory map: every page
	 * of shard.db read through the map stays mapped into this process, so a copy of a
	 * 0.6 GB shard.db left the member at 790 MB of RSS (snapshot_mem_bench.py), all of
	 * it the page cache's pages but counted as the member's. The map comes back after. */
	if (sqlite3_exec(c->db, "PRAGMA mmap_size=0", NULL, NULL, NULL) != SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "copy: %s", sqlite3_errmsg(c->db));
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
	/* A copy of another page size than the store's, for a receiver that cannot install
	 * one (a release of before 8 KiB pages, whose backup into its WAL store fails on a
	 * size other than its own): rewritten beside path (VACUUM INTO, no temporary
	 * database) and renamed over it. */
	if (page_size > 0 && db_page_size(dst) != page_size) {
		if ((rc = rewrite_page_size(dst, path, page_size, &conv, "copy", err, errlen)) != 0)
			goto out;
		sqlite3_close(dst);
		dst = NULL;
		if (rename(conv, path) != 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "copy: rename %s: %s", conv,
				      strerror(errno));
			goto out;
		}
	}
	rc = 0;
out:
	if (sqlite3_exec(c->db, "PRAGMA mmap_size=" STORE_MMAP_SIZE, NULL, NULL, NULL) !=
	    SQLITE_OK)
		sdb_warn("copy: the memory map was not restored (reads go through the page cache)",
			 "err=\"%s\"", sqlite3_errmsg(c->db));
	sqlite3_close(dst);
	if (conv) {
		unlink(conv);
		free(conv);
	}
	if (rc)
		unlink(path);
	return rc;
}

int sdb_store_replace_from(sdb_store_conn *c, const char *path, uint64_t *applied, char *err,
			   size_t errlen)
{
	sqlite3 *src = NULL;
	sqlite3_backup *bk;
	char *conv = NULL; /* the copy rewritten at this store's page size, if it differed */
	int rc = SDB_EIO;
	int64_t gen_before, keyenc = 0;
	bool writing = false; /* counted in commits_running (store_int.h) */

	store_release_kept(c); /* the catalog generation below is the newest */
	gen_before = store_query_int(c, "SELECT v FROM meta WHERE k='catalog_gen'", 0);

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
		s = NULL;
		if (sqlite3_prepare_v2(src, "SELECT v FROM meta WHERE k='keyenc'", -1, &s, NULL) ==
			    SQLITE_OK &&
		    sqlite3_step(s) == SQLITE_ROW)
			keyenc = sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
		if (fmt != STORE_FORMAT && fmt != STORE_FORMAT_LONG_DOUBLE_KEYS) {
			rc = sdb_errf(err, errlen, SDB_ECORRUPT,
				      "replace: %s is not a stripedb shard store of format %d", path,
				      STORE_FORMAT);
			goto out;
		}
	}
	{
		/* A copy of a store of another page size (a store keeps the size it was made
		 * with: 4 KiB before 8 KiB pages, store.c conn_pragmas): SQLite's backup into a
		 * WAL database refuses a source of another page size (SQLITE_READONLY, "attempt
		 * to write a readonly database"), so a member with an 8 KiB store could not
		 * install a snapshot from a 4 KiB one, nor the reverse. Rewrite the copy at this
		 * store's page size beside it first (VACUUM INTO; the copy itself is left as it
		 * is), and install that. */
		int dst_pg = db_page_size(c->db);
		int src_pg = db_page_size(src);
		if (dst_pg > 0 && src_pg > 0 && dst_pg != src_pg) {
			if ((rc = rewrite_page_size(src, path, dst_pg, &conv, "replace", err,
						    errlen)) != 0)
				goto out;
			sqlite3_close(src);
			src = NULL;
			if (sqlite3_open_v2(conv, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
				rc = sdb_errf(err, errlen, SDB_EIO, "replace: open %s: %s", conv,
					      src ? sqlite3_errmsg(src) : "out of memory");
				goto out;
			}
		}
	}
	pthread_mutex_lock(&c->st->write_mu);
	/* as a COMMIT: what the backup writes is visible before the epoch moves (below) */
	atomic_fetch_add(&c->st->commits_running, 1);
	writing = true;
	store_stmt_forget_all(c);
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
			 (long long)(gen_after > gen_before ? gen_after : gen_before) + 1);
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
	/* A copy from a member of a release before exact decimal keys: re-key it as open does
	 * (store_rekey.c store_migrate_decimal_keys, one transaction). On a member installing a
	 * snapshot the caller is the only writer (the apply path), so nothing writes between
	 * the copy and the re-key; readers in between may miss a decimal (as during any
	 * install, their answers then are of no committed state anyway). */
	if (keyenc < 2)
		rc = store_migrate_decimal_keys(c->st, err, errlen);
	/* and from a release that built partial indexes whole: rebuild them (a no-op on a
	 * copy whose meta partial_idx is set) */
	if (rc == 0)
		rc = store_partial_rebuild(c->st, err, errlen);
out:
	/* whatever the backup wrote, a read transaction kept open on another connection
	 * (sdb_store_keep_reads) must not outlive it */
	atomic_fetch_add(&c->st->commit_epoch, 1);
	if (writing)
		atomic_fetch_sub(&c->st->commits_running, 1);
	sqlite3_close(src);
	if (conv) {
		unlink(conv);
		free(conv);
	}
	return rc;
}
