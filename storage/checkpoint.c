/* WAL checkpoints of a store on a thread of their own (issue #19). Contract in
 * store_int.h ("WAL checkpoints") and store.h.
 *
 * Why: SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000
 * frames, on the committing thread. A shard commits every Raft entry on its event loop
 * thread, so each checkpoint (about 1,000 page writes and two fsyncs) stopped that thread
 * for 10-50 ms: no request read, no reply written, no Raft message sent or answered. In a
 * 3-member set the members apply the same entries, so their WALs cross the threshold
 * together and stall together, and a write waits for the majority: under YCSB A the
 * checkpoints were the writes' p95/p99 (34/67 ms against a 6.5 ms p50).
 *
 * How (every connection's WAL hook, sqlite3_wal_hook, replaces the automatic checkpoint;
 * it runs on the committing thread after each commit, with the WAL's frame count):
 *  - the bulk: once the WAL holds STORE_CKPT_FRAMES frames, the hook wakes the thread,
 *    which runs a PASSIVE checkpoint (sqlite3_wal_checkpoint_v2) on its own connection,
 *    beside the writers and readers (PASSIVE neither waits for nor blocks them);
 *  - the tail: SQLite restarts the WAL from its start only when a write transaction
 *    begins with every frame copied, which a checkpoint beside a busy writer rarely
 *    achieves (the writer commits more frames meanwhile; retrying chased them hundreds of
 *    times a second, each with two fsyncs). So once the thread has copied all but at most
 *    STORE_CKPT_TAIL frames, the next commit's hook copies the rest itself (a few hundred
 *    frames, where it used to copy all of them), and the write after restarts the WAL;
 *  - behind: should the WAL grow by STORE_CKPT_FRAMES_BEHIND frames while the thread
 *    copies (writes outpace the copy), the commit waits for the copy to end, which bounds
 *    the WAL as SQLite's automatic checkpoint did (an idle thread is always woken, never
 *    replaced by a commit's whole copy: one big commit, such as an oplog trim, is copied
 *    by the thread);
 *  - bounded: from STORE_CKPT_FRAMES_BEHIND frames on, the tail a commit completes may be
 *    STORE_CKPT_FRAMES long, and at STORE_CKPT_FRAMES_MAX an idle thread's whole remainder
 *    is copied by the commit (the disk cannot keep up with the writes);
 *  - a restarted WAL is told by its header (wal_generation), not by its frame count;
 *  - blocked: a checkpoint that could not copy every frame although nothing wrote
 *    meanwhile was stopped by a reader's older snapshot (an open read transaction); no
 *    commit checkpoints again until the WAL restarts or the thread copies everything,
 *    and the thread is woken every STORE_CKPT_FRAMES / 2 frames meanwhile (the WAL grows
 *    for as long as the reader stays, as it did with the automatic checkpoint).
 *
 * Durability does not change: a commit is durable by its own WAL write (synchronous);
 * a checkpoint copies committed frames into the database file, fsyncing the WAL before
 * and the database after (SQLite's checkpoint protocol). A checkpoint that fails with a
 * disk error is recorded (sdb_store_checkpoint_fault): commits only write the WAL and
 * would not see it, while the WAL grew without end.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/store_int.h"

struct store_ckpt {
	sdb_store *st;
	sqlite3 *db; /* the thread's own connection */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cond; /* wakes the thread */
	pthread_cond_t done; /* a copy ended (running became false) */
	int page;            /* the store's page size (4 KiB for a store made before 8 KiB) */
	/* the thresholds of store_int.h in frames of this store's page size (same bytes) */
	int frames, frames_behind, frames_max, tail;
	/* under mu */
	bool wanted;     /* a hook asked the thread for a checkpoint */
	bool running;    /* the thread is in a checkpoint */
	bool stop;
	bool blocked;    /* a reader keeps frames from being copied (see above) */
	int backfilled;  /* frames of the current WAL copied by the last checkpoint */
	int last_frames; /* the WAL's frames at the last hook that acted (a drop: restarted) */
	int woken_at;    /* the WAL's frames when the thread was last woken */
	uint64_t gen;    /* the WAL's generation (wal_generation) at the last hook that acted:
			  * a result of an older generation is dropped */
	/* statistics and the first disk error (any thread) */
	_Atomic uint64_t runs;    /* checkpoints run by the thread */
	_Atomic uint64_t inlined; /* checkpoints a committing connection ran itself */
	_Atomic uint64_t waits;   /* commits that waited for the thread (behind) */
	_Atomic int fault;        /* SQLite extended code of a failed checkpoint, 0 none */
};

/* A checkpoint's result (rc, nlog frames in the WAL when it began, nckpt copied), begun
 * in WAL generation gen, under k->mu. */
static void note_result(store_ckpt *k, sqlite3 *db, uint64_t gen, int rc, int nlog,
			int nckpt)
{
	if (rc == SQLITE_OK) {
		if (gen != k->gen)
			return; /* the WAL restarted since: the counts are of the old frames */
		k->backfilled = nckpt;
		/* PASSIVE copies up to the frames it found; fewer means a reader held them */
		k->blocked = nckpt < nlog;
		return;
	}
	switch (rc & 0xff) {
	case SQLITE_BUSY: /* another checkpoint is under way */
	case SQLITE_LOCKED:
		return;
	default:
		break;
	}
	int expected = 0;
	/* the connection's extended code when it is of this error (sync_db's is not) */
	int code = (sqlite3_extended_errcode(db) & 0xff) == (rc & 0xff)
			   ? sqlite3_extended_errcode(db)
			   : rc;
	if (atomic_compare_exchange_strong(&k->fault, &expected, code))
		sdb_error("store: WAL checkpoint failed: the database file cannot be written",
			  "path=%s sqlite=%d error=\"%s\"", k->st->path, code, sqlite3_errstr(code));
}

/* fdatasync the database file (through SQLite's own handle of it). SQLite syncs it at the
 * end of a checkpoint only when the checkpoint copied every frame, as it stood when the
 * copy ended: one beside a busy writer rarely does, and the next complete checkpoint (the
 * commit's copy of the tail) then synced all of this one's pages (4 MB: 10-20 ms on the
 * loop thread). An early sync is only earlier durability. Returns the SQLite code. */
static int sync_db(store_ckpt *k)
{
	sqlite3_file *f = NULL;

	if (sqlite3_file_control(k->db, "main", SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK || !f ||
	    !f->pMethods)
		return SQLITE_OK;
	return f->pMethods->xSync(f, SQLITE_SYNC_NORMAL);
}

static void *ckpt_main(void *arg)
{
	store_ckpt *k = arg;

	pthread_mutex_lock(&k->mu);
	for (;;) {
		while (!k->wanted && !k->stop)
			pthread_cond_wait(&k->cond, &k->mu);
		if (k->stop)
			break;
		k->wanted = false;
		k->running = true;
		uint64_t gen = k->gen; /* no restart until this copy completes */
		int before = k->backfilled;
		pthread_mutex_unlock(&k->mu);
		int nlog = 0, nckpt = 0;
		int rc = sqlite3_wal_checkpoint_v2(k->db, "main", SQLITE_CHECKPOINT_PASSIVE, &nlog,
						   &nckpt);
		atomic_fetch_add(&k->runs, 1);
		if (rc == SQLITE_OK && nckpt > before)
			rc = sync_db(k);
		pthread_mutex_lock(&k->mu);
		k->running = false;
		pthread_cond_broadcast(&k->done);
		note_result(k, k->db, gen, rc, nlog, nckpt);
	}
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

/* The generation of db's WAL: its header's checkpoint sequence number and first salt
 * (SQLite's WAL file format, offsets 12 and 16), both changed by every restart. The frame
 * count alone can miss a restart (a first commit as large as the last one before it).
 * 0 when the header cannot be read. */
static uint64_t wal_generation(sqlite3 *db)
{
	sqlite3_file *f = NULL;
	unsigned char h[24];

	if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) != SQLITE_OK || !f ||
	    !f->pMethods || f->pMethods->xRead(f, h, sizeof h, 0) != SQLITE_OK)
		return 0;
	return (uint64_t)h[12] << 56 | (uint64_t)h[13] << 48 | (uint64_t)h[14] << 40 |
	       (uint64_t)h[15] << 32 | (uint64_t)h[16] << 24 | (uint64_t)h[17] << 16 |
	       (uint64_t)h[18] << 8 | h[19];
}

/* sqlite3_wal_hook callback, on the committing thread after each commit: nframes is the
 * number of frames in the WAL. Always SQLITE_OK: the commit itself succeeded. */
static int ckpt_hook(void *arg, sqlite3 *db, const char *name, int nframes)
{
	store_ckpt *k = arg;
	bool run_here = false;

	/* after the commit, its write lock released: a read transaction kept open
	 * (sdb_store_keep_reads) that began before it is not taken over (store.c) */
	atomic_fetch_add(&k->st->commit_epoch, 1);
	if (nframes < k->frames)
		return SQLITE_OK;
	uint64_t g = wal_generation(db);
	pthread_mutex_lock(&k->mu);
	if (g != k->gen || nframes < k->last_frames) {
		/* the WAL restarted since the last look: its frames are new ones */
		k->backfilled = 0;
		k->woken_at = 0;
		k->blocked = false;
		k->gen = g;
	}
	k->last_frames = nframes;
	if (!k->running && !k->wanted) {
		int behind = nframes - k->backfilled;
		/* a bigger tail once the WAL is big: a copy beside steady writes always left
		 * more than STORE_CKPT_TAIL behind, and the WAL never restarted */
		int tail = nframes >= k->frames_behind ? k->frames : k->tail;
		if (!k->blocked && k->backfilled > 0 && behind >= 0 && behind <= tail)
			run_here = true; /* the tail: complete it so the next write restarts */
		else if (!k->blocked && nframes >= k->frames_max)
			run_here = true; /* overload: the disk cannot copy as fast as commits write */
		else if (behind >= k->frames / 2 &&
			 (!k->blocked || nframes - k->woken_at >= k->frames / 2)) {
			k->wanted = true;
			k->woken_at = nframes;
			pthread_cond_signal(&k->cond);
		}
	} else if (!k->blocked && nframes - k->woken_at >= k->frames_behind) {
		/* the WAL grew this much while the thread copies: writes outpace the copy, so
		 * wait for it (back-pressure, which bounds the WAL as SQLite's automatic
		 * checkpoint did); the next commit wakes the thread for the rest */
		atomic_fetch_add(&k->waits, 1);
		while ((k->running || k->wanted) && !k->stop)
			pthread_cond_wait(&k->done, &k->mu);
	}
	uint64_t gen = k->gen;
	if (run_here)
		k->running = true; /* the thread stays out meanwhile */
	pthread_mutex_unlock(&k->mu);
	if (run_here) {
		int nlog = 0, nckpt = 0;
		int rc = sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, &nlog,
						   &nckpt);
		atomic_fetch_add(&k->inlined, 1);
		pthread_mutex_lock(&k->mu);
		k->running = false;
		pthread_cond_broadcast(&k->done);
		note_result(k, db, gen, rc, nlog, nckpt);
		pthread_mutex_unlock(&k->mu);
	}
	return SQLITE_OK;
}

/* n frames of STORE_PAGE_BYTES in frames of page bytes (at least 1) */
static int ckpt_scale(int page, int n)
{
	int64_t f = (int64_t)n * STORE_PAGE_BYTES / page;
	return f < 1 ? 1 : (int)f;
}

int store_ckpt_frames(const sdb_store *st, int n)
{
	return st->ckpt ? ckpt_scale(st->ckpt->page, n) : n;
}

int store_ckpt_start(sdb_store *st, int (*pragmas)(sdb_store *, sqlite3 *, char *, size_t),
		     char *err, size_t errlen)
{
	store_ckpt *k = sdb_calloc(1, sizeof *k);
	int rc;

	k->st = st;
	if (sqlite3_open_v2(st->path, &k->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		rc = sdb_errf(err, errlen, SDB_EIO, "store: open %s for checkpoints: %s",
			      st->path, k->db ? sqlite3_errmsg(k->db) : "out of memory");
		sqlite3_close(k->db);
		free(k);
		return rc;
	}
	rc = pragmas(st, k->db, err, errlen);
	if (rc) {
		sqlite3_close(k->db);
		free(k);
		return rc;
	}
	sqlite3_wal_hook(k->db, NULL, NULL); /* it commits nothing */
	{
		/* the store's page size: a store made before 8 KiB pages keeps 4 KiB, and its
		 * thresholds count twice the frames (the bytes measured, store_int.h) */
		sqlite3_stmt *s = NULL;
		k->page = STORE_PAGE_BYTES;
		if (sqlite3_prepare_v2(k->db, "PRAGMA page_size", -1, &s, NULL) == SQLITE_OK &&
		    sqlite3_step(s) == SQLITE_ROW && sqlite3_column_int(s, 0) >= 512)
			k->page = sqlite3_column_int(s, 0);
		sqlite3_finalize(s);
		k->frames = ckpt_scale(k->page, STORE_CKPT_FRAMES);
		k->frames_behind = ckpt_scale(k->page, STORE_CKPT_FRAMES_BEHIND);
		k->frames_max = ckpt_scale(k->page, STORE_CKPT_FRAMES_MAX);
		k->tail = ckpt_scale(k->page, STORE_CKPT_TAIL);
	}
	pthread_mutex_init(&k->mu, NULL);
	pthread_cond_init(&k->cond, NULL);
	pthread_cond_init(&k->done, NULL);
	if (pthread_create(&k->thread, NULL, ckpt_main, k) != 0) {
		pthread_mutex_destroy(&k->mu);
		pthread_cond_destroy(&k->cond);
		pthread_cond_destroy(&k->done);
		sqlite3_close(k->db);
		free(k);
		return sdb_errf(err, errlen, SDB_EIO, "store: cannot start the checkpoint thread");
	}
	st->ckpt = k;
	return 0;
}

void store_ckpt_stop(sdb_store *st)
{
	store_ckpt *k = st->ckpt;

	if (!k)
		return;
	pthread_mutex_lock(&k->mu);
	k->stop = true;
	pthread_cond_signal(&k->cond);
	pthread_cond_broadcast(&k->done);
	pthread_mutex_unlock(&k->mu);
	pthread_join(k->thread, NULL);
	sqlite3_close(k->db);
	pthread_mutex_destroy(&k->mu);
	pthread_cond_destroy(&k->cond);
	pthread_cond_destroy(&k->done);
	free(k);
	st->ckpt = NULL;
}

void store_ckpt_attach(sdb_store *st, sqlite3 *db)
{
	if (st->ckpt)
		sqlite3_wal_hook(db, ckpt_hook, st->ckpt);
}

void sdb_store_checkpoint_counts(sdb_store *st, uint64_t *background, uint64_t *inlined,
				 uint64_t *waits)
{
	*background = st->ckpt ? atomic_load(&st->ckpt->runs) : 0;
	*inlined = st->ckpt ? atomic_load(&st->ckpt->inlined) : 0;
	*waits = st->ckpt ? atomic_load(&st->ckpt->waits) : 0;
}

int sdb_store_checkpoint_fault(sdb_store *st)
{
	return st->ckpt ? atomic_load(&st->ckpt->fault) : 0;
}
