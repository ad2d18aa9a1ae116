/* WAL checkpoints of a store on a thread of their own (issue #19). Contract in
 * store_int.h ("WAL checkpoints").
 *
 * Why: SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000
 * frames, on the committing thread. A shard commits every Raft entry on its event loop
 * thread, so each checkpoint (about 1,000 page writes and two fsyncs) stopped that thread
 * for 10-50 ms: no request read, no reply written, no Raft message sent or answered. In a
 * 3-member set the members apply the same entries, so their WALs cross the threshold
 * together and stall together, and a write waits for the majority: under YCSB A the
 * checkpoints were the writes' p95/p99 (34/67 ms against a 6.5 ms p50).
 *
 * How: every connection's WAL hook (sqlite3_wal_hook, which replaces the automatic
 * checkpoint) wakes this thread once the WAL holds STORE_CKPT_FRAMES frames; the thread
 * runs a PASSIVE checkpoint (sqlite3_wal_checkpoint_v2) on its own connection, beside the
 * writers and readers (PASSIVE neither waits for nor blocks them). The next write
 * transaction after a checkpoint that copied every frame restarts the WAL from its start,
 * as after an automatic checkpoint. Should the thread fall behind (the WAL at
 * STORE_CKPT_FRAMES_INLINE frames), the committing connection checkpoints itself, as
 * SQLite's automatic checkpoint did, so the WAL stays bounded.
 *
 * Durability does not change: a commit is durable by its own WAL write (synchronous);
 * a checkpoint only copies committed frames into the database file, fsyncing the WAL
 * before and the database after (SQLite's checkpoint protocol).
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
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
	pthread_cond_t cond;
	bool wanted; /* under mu: a hook asked for a checkpoint */
	bool stop;   /* under mu */
	_Atomic uint64_t runs;    /* checkpoints run by the thread */
	_Atomic uint64_t inlined; /* checkpoints a committing connection ran itself */
};

static void *ckpt_main(void *arg)
{
	store_ckpt *k = arg;
	unsigned long warned = 0;

	pthread_mutex_lock(&k->mu);
	for (;;) {
		while (!k->wanted && !k->stop)
			pthread_cond_wait(&k->cond, &k->mu);
		if (k->stop)
			break;
		k->wanted = false;
		pthread_mutex_unlock(&k->mu);
		int nlog = 0, nckpt = 0;
		int rc = sqlite3_wal_checkpoint_v2(k->db, "main", SQLITE_CHECKPOINT_PASSIVE, &nlog,
						   &nckpt);
		atomic_fetch_add(&k->runs, 1);
		/* SQLITE_BUSY: a committing connection's own checkpoint is running; the next
		 * wake-up catches up. A disk error leaves the frames in the WAL (the commits are
		 * durable there) and is met again by the writers, which stop the member. */
		if (rc != SQLITE_OK && rc != SQLITE_BUSY && warned++ % 1000 == 0)
			sdb_warn("store: WAL checkpoint failed", "path=%s error=%s", k->st->path,
				 sqlite3_errmsg(k->db));
		pthread_mutex_lock(&k->mu);
	}
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

/* sqlite3_wal_hook callback, on the committing thread after each commit: nframes is the
 * number of frames in the WAL. */
static int ckpt_hook(void *arg, sqlite3 *db, const char *name, int nframes)
{
	store_ckpt *k = arg;

	if (nframes >= STORE_CKPT_FRAMES_INLINE) {
		atomic_fetch_add(&k->inlined, 1);
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
		return SQLITE_OK; /* the commit itself succeeded either way */
	}
	if (nframes >= STORE_CKPT_FRAMES) {
		pthread_mutex_lock(&k->mu);
		if (!k->wanted) {
			k->wanted = true;
			pthread_cond_signal(&k->cond);
		}
		pthread_mutex_unlock(&k->mu);
	}
	return SQLITE_OK;
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
	pthread_mutex_init(&k->mu, NULL);
	pthread_cond_init(&k->cond, NULL);
	if (pthread_create(&k->thread, NULL, ckpt_main, k) != 0) {
		pthread_mutex_destroy(&k->mu);
		pthread_cond_destroy(&k->cond);
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
	pthread_mutex_unlock(&k->mu);
	pthread_join(k->thread, NULL);
	sqlite3_close(k->db);
	pthread_mutex_destroy(&k->mu);
	pthread_cond_destroy(&k->cond);
	free(k);
	st->ckpt = NULL;
}

void store_ckpt_attach(sdb_store *st, sqlite3 *db)
{
	if (st->ckpt)
		sqlite3_wal_hook(db, ckpt_hook, st->ckpt);
}

void sdb_store_checkpoint_counts(sdb_store *st, uint64_t *background, uint64_t *inlined)
{
	*background = st->ckpt ? atomic_load(&st->ckpt->runs) : 0;
	*inlined = st->ckpt ? atomic_load(&st->ckpt->inlined) : 0;
}
