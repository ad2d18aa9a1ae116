/* Unit tests of storage/checkpoint.c: the store's WAL checkpoint thread (the WAL stays
 * bounded and restarts; big commits are copied by the thread, not by the committing
 * thread; a disk error under the database file is recorded). */
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

#include "storage/store.h"
#include "storage/store_int.h"

#include "store_fixture.h"

/* One write transaction of 10 documents {_id: *id++, pad} committed. */
static void commit_padded(fx *f, int *id, const char *pad)
{
	begin_w(f);
	for (int j = 0; j < 10; j++) {
		bson_t *d = bson_new();
		BSON_APPEND_INT32(d, "_id", (*id)++);
		BSON_APPEND_UTF8(d, "pad", pad);
		assert_int_equal(sdb_store_insert(f->c, "db", "c", d, NULL, NULL, f->err, sizeof f->err),
				 0);
		bson_destroy(d);
	}
	commit(f);
}

/* WAL checkpoints run on the store's own thread (storage/checkpoint.c): after ~15,000
 * frames of commits the thread has checkpointed, the WAL file stayed bounded (it restarts
 * after a complete checkpoint), and the data reads back whole. */
static void wal_checkpointed_by_its_thread(fx *f, int page)
{
	char pad[3500], wal[300];
	uint64_t bg = 0, inl = 0, waits = 0;
	struct stat sb;
	int id = 0;

	memset(pad, 'x', sizeof pad - 1);
	pad[sizeof pad - 1] = '\0';
	for (int i = 0; i < 600; i++) {
		commit_padded(f, &id, pad);
	}
	/* the thread is woken by a commit; wait for its checkpoint (bounded) */
	for (int i = 0; i < 3000; i++) {
		sdb_store_checkpoint_counts(f->st, &bg, &inl, &waits);
		if (bg > 0)
			break;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	assert_true(bg > 0);
	snprintf(wal, sizeof wal, "%s/shard.db-wal", f->dir);
	assert_int_equal(stat(wal, &sb), 0);
	/* at most STORE_CKPT_FRAMES_BEHIND frames of STORE_PAGE_BYTES (+ 24-byte frame
	 * headers) and a tail of STORE_CKPT_FRAMES, plus one commit's frames (about 100 KB);
	 * the ~60 MB written would not fit. The same bytes in a store of 4 KiB pages. */
	int frames = STORE_CKPT_FRAMES_BEHIND + STORE_CKPT_FRAMES + 800 * 1024 / STORE_PAGE_BYTES;
	frames = (int)((int64_t)frames * STORE_PAGE_BYTES / page);
	assert_true(sb.st_size <= (off_t)frames * (page + 24) + 32);
	assert_count_and_clean(f, 6000);
}

static void test_wal_checkpointed_by_its_thread(void **state)
{
	fx *f = *state;
	assert_int_equal(sdb_store_page_size(f->c), STORE_PAGE_BYTES);
	assert_int_equal(store_ckpt_frames(f->st, STORE_CKPT_FRAMES), STORE_CKPT_FRAMES);
	wal_checkpointed_by_its_thread(f, STORE_PAGE_BYTES);
}

/* A store made with 4 KiB pages (before 8 KiB, which it keeps): its thresholds are the
 * same bytes, twice the frames (before they were the same frames: half the bytes, twice
 * the checkpoints and commits held back at 16 MB instead of 32), and its WAL stays as
 * bounded. */
static void test_wal_checkpointed_by_its_thread_4k_store(void **state)
{
	fx *f = *state;
	char path[300];
	sqlite3 *db = NULL;
	fx_close(f);
	snprintf(path, sizeof path, "rm -f %s/shard.db*", f->dir);
	assert_int_equal(system(path), 0);
	snprintf(path, sizeof path, "%s/shard.db", f->dir);
	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "PRAGMA page_size=4096; PRAGMA journal_mode=WAL", NULL,
				      NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	fx_open(f, 0);
	assert_int_equal(sdb_store_page_size(f->c), 4096);
	assert_int_equal(store_ckpt_frames(f->st, STORE_CKPT_FRAMES),
			 STORE_CKPT_FRAMES * STORE_PAGE_BYTES / 4096);
	assert_int_equal(store_ckpt_frames(f->st, STORE_CKPT_FRAMES_BEHIND),
			 STORE_CKPT_FRAMES_BEHIND * STORE_PAGE_BYTES / 4096);
	wal_checkpointed_by_its_thread(f, 4096);
}

/* Commits of the same big size, each in a fresh WAL (the thread copied the last one
 * whole): the hook tells the restart by the WAL's header, not by a frame count that did
 * not drop, so the thread copies each of them and no commit copies one on its own
 * thread (it did: a ~100 ms stall of a shard's loop per such commit). */
static void test_wal_big_commits_copied_by_the_thread(void **state)
{
	fx *f = *state;
	size_t len = 3u << 20;
	char *pad = malloc(len);
	uint64_t bg = 0, inl = 0, waits = 0, before;

	assert_non_null(pad);
	memset(pad, 'y', len - 1);
	pad[len - 1] = '\0';
	for (int i = 0; i < 6; i++) {
		sdb_store_checkpoint_counts(f->st, &before, &inl, &waits);
		begin_w(f);
		bson_t *d = bson_new();
		BSON_APPEND_INT32(d, "_id", i);
		BSON_APPEND_UTF8(d, "pad", pad);
		assert_int_equal(sdb_store_insert(f->c, "db", "c", d, NULL, NULL, f->err, sizeof f->err),
				 0);
		bson_destroy(d);
		commit(f);
		/* the commit woke the thread: wait for its copy (bounded) */
		for (int j = 0; j < 3000; j++) {
			sdb_store_checkpoint_counts(f->st, &bg, &inl, &waits);
			if (bg > before)
				break;
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
		assert_true(bg > before);
	}
	sdb_store_checkpoint_counts(f->st, &bg, &inl, &waits);
	assert_int_equal(inl, 0);
	assert_int_equal(waits, 0);
	free(pad);
	assert_count_and_clean(f, 6);
}

/* A VFS over "unix" whose writes to main database files fail with SQLITE_IOERR_WRITE while
 * shim_fail_db_writes is set (the WAL and the rest stay writable): a disk that fails
 * under the database file only, which commits (WAL writes) do not see. */
typedef struct shim_file {
	sqlite3_file base;
	sqlite3_file *real; /* follows this struct in the same allocation */
	bool main_db;
} shim_file;

static sqlite3_vfs *shim_real;
static sqlite3_vfs shim_vfs;
static sqlite3_io_methods shim_io;
static atomic_bool shim_fail_db_writes;

#define SHIM_REAL(f) (((shim_file *)(f))->real)
static int shim_close(sqlite3_file *f) { return SHIM_REAL(f)->pMethods->xClose(SHIM_REAL(f)); }
static int shim_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o)
{
	return SHIM_REAL(f)->pMethods->xRead(SHIM_REAL(f), b, n, o);
}
static int shim_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
	if (((shim_file *)f)->main_db && atomic_load(&shim_fail_db_writes))
		return SQLITE_IOERR_WRITE;
	return SHIM_REAL(f)->pMethods->xWrite(SHIM_REAL(f), b, n, o);
}
static int shim_truncate(sqlite3_file *f, sqlite3_int64 n)
{
	return SHIM_REAL(f)->pMethods->xTruncate(SHIM_REAL(f), n);
}
static int shim_sync(sqlite3_file *f, int fl) { return SHIM_REAL(f)->pMethods->xSync(SHIM_REAL(f), fl); }
static int shim_size(sqlite3_file *f, sqlite3_int64 *n)
{
	return SHIM_REAL(f)->pMethods->xFileSize(SHIM_REAL(f), n);
}
static int shim_lock(sqlite3_file *f, int l) { return SHIM_REAL(f)->pMethods->xLock(SHIM_REAL(f), l); }
static int shim_unlock(sqlite3_file *f, int l) { return SHIM_REAL(f)->pMethods->xUnlock(SHIM_REAL(f), l); }
static int shim_reserved(sqlite3_file *f, int *r)
{
	return SHIM_REAL(f)->pMethods->xCheckReservedLock(SHIM_REAL(f), r);
}
static int shim_fcntl(sqlite3_file *f, int op, void *a)
{
	return SHIM_REAL(f)->pMethods->xFileControl(SHIM_REAL(f), op, a);
}
static int shim_sector(sqlite3_file *f) { return SHIM_REAL(f)->pMethods->xSectorSize(SHIM_REAL(f)); }
static int shim_devchar(sqlite3_file *f)
{
	return SHIM_REAL(f)->pMethods->xDeviceCharacteristics(SHIM_REAL(f));
}
static int shim_shm_map(sqlite3_file *f, int pg, int sz, int ext, void volatile **pp)
{
	return SHIM_REAL(f)->pMethods->xShmMap(SHIM_REAL(f), pg, sz, ext, pp);
}
static int shim_shm_lock(sqlite3_file *f, int off, int n, int fl)
{
	return SHIM_REAL(f)->pMethods->xShmLock(SHIM_REAL(f), off, n, fl);
}
static void shim_shm_barrier(sqlite3_file *f) { SHIM_REAL(f)->pMethods->xShmBarrier(SHIM_REAL(f)); }
static int shim_shm_unmap(sqlite3_file *f, int del)
{
	return SHIM_REAL(f)->pMethods->xShmUnmap(SHIM_REAL(f), del);
}
static int shim_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp)
{
	return SHIM_REAL(f)->pMethods->xFetch(SHIM_REAL(f), o, n, pp);
}
static int shim_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p)
{
	return SHIM_REAL(f)->pMethods->xUnfetch(SHIM_REAL(f), o, p);
}

static int shim_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out)
{
	shim_file *s = (shim_file *)f;
	(void)v;
	s->real = (sqlite3_file *)(s + 1);
	s->main_db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
	int rc = shim_real->xOpen(shim_real, name, s->real, flags, out);
	s->base.pMethods = rc == SQLITE_OK && s->real->pMethods ? &shim_io : NULL;
	return rc;
}

static void shim_install(void)
{
	shim_real = sqlite3_vfs_find("unix");
	assert_non_null(shim_real);
	assert_true(shim_real->iVersion >= 3);
	shim_vfs = *shim_real;
	shim_vfs.zName = "sdb-test-shim";
	shim_vfs.szOsFile = (int)sizeof(shim_file) + shim_real->szOsFile;
	shim_vfs.xOpen = shim_open;
	shim_io = (sqlite3_io_methods){3, shim_close, shim_read, shim_write, shim_truncate,
				       shim_sync, shim_size, shim_lock, shim_unlock, shim_reserved,
				       shim_fcntl, shim_sector, shim_devchar, shim_shm_map,
				       shim_shm_lock, shim_shm_barrier, shim_shm_unmap, shim_fetch,
				       shim_unfetch};
	assert_int_equal(sqlite3_vfs_register(&shim_vfs, 1), SQLITE_OK);
}

/* A checkpoint that cannot write the database file is recorded
 * (sdb_store_checkpoint_fault), while the commits, which only write the WAL, succeed:
 * the shard stops the member on it instead of acknowledging writes into a WAL that would
 * grow without end. */
static void test_wal_checkpoint_disk_error_is_recorded(void **state)
{
	fx *f = *state;
	char pad[3500];
	int id = 0;

	fx_close(f);
	shim_install();
	fx_open(f, 0);
	assert_int_equal(sdb_store_checkpoint_fault(f->st), 0);
	atomic_store(&shim_fail_db_writes, true);
	memset(pad, 'x', sizeof pad - 1);
	pad[sizeof pad - 1] = '\0';
	for (int i = 0; i < 300 && sdb_store_checkpoint_fault(f->st) == 0; i++) {
		commit_padded(f, &id, pad); /* the commits succeed: they write the WAL */
	}
	for (int i = 0; i < 3000 && sdb_store_checkpoint_fault(f->st) == 0; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	assert_int_equal(sdb_store_checkpoint_fault(f->st) & 0xff, SQLITE_IOERR);
	atomic_store(&shim_fail_db_writes, false);
	fx_close(f);
	assert_int_equal(sqlite3_vfs_unregister(&shim_vfs), SQLITE_OK);
	fx_open(f, 0); /* the data is whole: the WAL holds what the file could not take */
	assert_count_and_clean(f, id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_wal_checkpointed_by_its_thread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wal_checkpointed_by_its_thread_4k_store, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wal_big_commits_copied_by_the_thread, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wal_checkpoint_disk_error_is_recorded, setup,
						teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
