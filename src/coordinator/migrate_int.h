/* Internals of the Data Movement Platform (migrate.h), shared by its files. Not a public
 * interface: only src/coordinator/migrate*.c include it.
 *
 * Where each step lives (the states are described in migrate.h):
 *   migrate.c            the runner (budgets, leases mig/<id>) and the worker thread that
 *                        runs one migration's steps in a loop
 *   migrate_record.c     the migration's record in metadata (load, save = compare-and-set
 *                        on the state, fail), its lease, pause and crash points, the chunk
 *                        as routed and its range
 *   migrate_shard.c      shard I/O: clients, commands, the source's oplog head, and the
 *                        range-bounded read of the chunk (mig_scan_chunk)
 *   migrate_import.c     registered -> importing -> replicating: indexes, the snapshot
 *                        import, the session history window before it
 *   migrate_replicate.c  the CDC replicator (both directions) and the replicating step
 *   migrate_verify.c     verifying: both sides compared as (_id, hash)
 *   migrate_switch.c     switching, switched (reverse replication, grace) and rolling_back
 *   migrate_cleanup.c    cleaning (the source's copy), an aborted migration's target copy
 *
 * Conventions of every mig_* function below: m is the worker's migration (never NULL);
 * an error returns an SDB_E* code with a message in m->err (m->code: the server's error
 * code of the last failed shard command, -1 for a transport error); a step returns 0 when
 * it made progress or has nothing to do yet (the worker calls it again), SDB_ECONFLICT
 * when the record's state changed under it (the worker reloads), SDB_ECANCELED when the
 * worker is stopping, any other error to be retried after a reload.
 */
#ifndef SDB_COORDINATOR_MIGRATE_INT_H
#define SDB_COORDINATOR_MIGRATE_INT_H

#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cdc/reader.h"
#include "common/metrics.h"
#include "coordinator/migrate.h"
#include "coordinator/migrate_hashes.h"
#include "coordinator/migrate_sess.h"
#include "routing/route.h"

#define LEASE_BUSY 46
#define WRITE_CONFLICT 112
#define APPLY_BATCH_DOCS 500
#define APPLY_BATCH_BYTES (4u << 20)
#define IMPORT_BATCH_DOCS 1000
#define CHECKPOINT_EVERY_MS 1000
#define MAX_LISTED_DIFFS 20
/* most (_id, hash) entries the import keeps for the verification (about 40 bytes each plus
 * long _ids: 4M entries, ~160 MB); a larger chunk is verified by reading it again */
#define IMPORT_HASHES_MAX (4u << 20)

/* The bulk import's insert order (spec.importOrder, migrate.h): the shard-key index order
 * ("index"; _id for hashed keys), the source's scan order ("arrival": no sort) or _id order
 * ("id": the embedded store's clustering key). */
typedef enum mig_import_order { MIG_ORDER_INDEX, MIG_ORDER_ARRIVAL, MIG_ORDER_ID } mig_import_order;
/* The order of a spec's importOrder string s ("index", "arrival", "id"; "" or anything else:
 * MIG_IMPORT_ORDER_DEFAULT). s must not be NULL. No errors. */
mig_import_order mig_import_order_parse(const char *s);
/* _id order: fastest on the embedded store (migrate.h, spec.importOrder) */
#define MIG_IMPORT_ORDER_DEFAULT MIG_ORDER_ID

typedef struct mig_job {
	char *id;
	pthread_t th;
	atomic_int done;
	struct migrate_runner *r;
	struct mig_job *next;
} mig_job;

struct migrate_runner {
	cdc_log *log;
	char *meta_uri;
	char *holder;
	int64_t lease_ms;
	int budget_global, budget_shard;
	atomic_int stop;
	pthread_mutex_t mu;
	mig_job *jobs;
	/* migrations whose import sorted by _id on the source took over half the lease before
	 * its first batch (the lease may have been lost in that one call): their next import
	 * here reads in arrival order (no sort), so a chunk too slow to sort cannot keep a
	 * migration importing forever (under mu) */
	char **sortless;
	size_t nsortless;
	/* /metrics */
	sdb_histogram *h_pause;
	sdb_counter *c_switches, *c_rolled, *c_complete, *c_aborted;
	sdb_gauge *g_running;
};

/* ------------------------------------------------------------ one migration */

/* An event read beyond a replicator's stop position, kept for its next run. */
typedef struct pending_ev {
	uint8_t *data;
	size_t len, cap;
	uint64_t ts;
	bool have;
} pending_ev;

/* A replicator: one direction of CDC replay (forward: source -> target; reverse after the
 * switch: target -> source). Owned by its mig. */
typedef struct repl {
	const char *shard; /* whose log */
	cdc_reader *rd;
	uint64_t pos;      /* last ts applied (or skipped) */
	pending_ev pend;   /* an event read beyond a stop position */
	bool caught_up;    /* the last poll found nothing new */
	mongoc_client_t *to;
	bson_t batch;      /* pending update statements */
	uint32_t nbatch;
	bson_t recs;       /* pending session records alone ($stripedbSessions) */
	uint32_t nrecs;
	size_t batch_bytes;
	uint64_t batch_pos; /* pos once the batch is applied */
	int64_t applied, skipped;
} repl;

/* One migration driven by this coordinator: its record (spec, checkpoint, stats) as
 * loaded from metadata, its clients and its replicators. Owned by its worker thread;
 * never shared between threads. */
typedef struct mig {
	migrate_runner *r;
	mig_job *job;
	char id[128];
	mongoc_client_t *meta;
	mig_state state;
	/* spec */
	char ns[256], db[128], coll[128];
	int64_t chunk;
	char chunk_s[32];
	char src[64], dst[64];
	char *src_uri, *dst_uri;
	int64_t lag_since, max_catchup_ms;
	int64_t apply_rate; /* spec.applyRate: max events/s the replicator applies (0 = no cap) */
	int64_t rate_t0, rate_n;
	int64_t pause_checked;
	int64_t import_latency_ms, throttled_ms;
	int64_t session_history_ms; /* spec.sessionHistoryMS (session_history_start) */
	bool is_paused;
	int code; /* server error code of the last failed shard command */
	int64_t max_pause_ms, grace_ms, delete_batch, delete_delay_ms, max_attempts;
	mig_import_order import_order; /* spec.importOrder (mig_import_order) */
	/* routing view of the chunk (built from the checkpoint's range) */
	route_coll *rc;
	bson_t *min, *max;
	bson_t *key; /* key pattern */
	/* checkpoint */
	uint64_t ts, import_ts, rev_ts, bump_ts;
	int64_t token;
	int64_t attempts;
	bool target_cleaned;
	/* stats */
	int64_t imported, import_bytes, import_ms, deleted;
	int64_t pauses[64];
	int npauses;
	int64_t last_pause_ms;
	int64_t verify_count, verify_missing, verify_extra, verify_different;
	/* stats.verifySource: how the source side of the verification was obtained: mode
	 * "imported" (import hashes + the source's oplog) or "full" (the chunk read again),
	 * oplog entries read, changed _ids, documents read on the source, post-images used */
	char verify_mode[16];
	int64_t verify_oplog, verify_changed, verify_read, verify_post;
	/* the import's (_id, hash) of every document it loaded, sorted by _id (migrate_import.c,
	 * kept in memory only: gone after a coordinator restart); usable by the verification
	 * when imp_ts == import_ts and !imp_over (more than IMPORT_HASHES_MAX documents) */
	mig_hashes imp;
	uint64_t imp_ts;
	bool imp_over;
	char error[1024];
	/* work */
	mongoc_client_t *sc, *dc;
	repl fwd, rev;
	int64_t last_ckpt;
	/* the lease mig/<id>: renewed by its own thread (mig_lease_start), whatever the worker
	 * is blocked in (a slow import batch, a stopped shard); last_renew is the monotonic ms
	 * of the last renewal the metadata leader acknowledged; lost is set by that thread
	 * (LockBusy: another holder) or by mig_stopping once lease - lease/5 passed without
	 * a renewal (the lease may have expired: another coordinator may hold it) */
	_Atomic int64_t last_renew;
	atomic_bool lost;
	pthread_t ka_th;
	bool ka_started;
	bool ka_stop; /* under ka_mu */
	pthread_mutex_t ka_mu;
	pthread_cond_t ka_cv;
	mongoc_client_t *ka_meta;
	char err[512];
} mig;

/* ------------------------------------------------------------ migrate_record.c */

/* Fault injection (STRIPEDB_MIGRATION_CRASH, tests only): _exit(86) at point kind:what. */
void mig_crash_point(const char *kind, const char *what);
/* The lease was lost or the runner is stopping: the step must return at once. */
bool mig_stopping(mig *m);
/* Sleep up to ms, waking early when stopping. */
void mig_nap(mig *m, int64_t ms);
/* A command on metadata's admin database. Returns: 0, the server's error code (> 0) or -1
 * (transport) with a message in err; not an SDB_E* status. *reply is always initialised. */
int mig_meta_run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err,
		 size_t errlen);
/* acquireLease / renewLease / releaseLease of mig/<id>. Returns: as mig_meta_run. */
int mig_lease(mongoc_client_t *c, const char *verb, const char *id, const char *holder,
	      int64_t ttl, char *err, size_t errlen);
/* Start the thread that renews mig/<id> every third of its ttl on its own metadata
 * client (the worker's clients stay the worker's), from now (the runner just acquired
 * it). A renewal answered LockBusy sets m->lost; a renewal that fails otherwise
 * (metadata unreachable, no leader) is retried every lease/10, and the lease counts as
 * lost once lease - lease/5 passed since the last acknowledged one (mig_stopping).
 * Returns: 0, or SDB_ENOMEM/SDB_EIO (no client or no thread: the worker must not run). */
int mig_lease_start(mig *m);
/* Stop and join that thread (no renewal after it returns: release the lease after). */
void mig_lease_stop(mig *m);
/* Fencing check between steps and batches (the renewal itself is mig_lease_start's):
 * sets m->lost when the lease's deadline passed without a renewal. */
void mig_keepalive(mig *m);
/* Whether `ctl migration pause` holds mig-pause/<id> (checked at most every 500 ms). */
bool mig_paused(mig *m);
/* For the steps that time the catch-up (replicating, switching): when mig_paused, restart
 * that clock (m->lag_since; time paused is not lag), nap 100 ms and return true (the step
 * then returns 0 and runs again); otherwise false at once. */
bool mig_catchup_paused(mig *m);
/* Field readers of a reply: a missing or mistyped field gives false / def / 0. it_doc's
 * out borrows d's bytes. */
bool mig_it_str(const bson_t *d, const char *k, char *out, size_t n);
int64_t mig_it_int(const bson_t *d, const char *k, int64_t def);
uint64_t mig_it_ts(const bson_t *d, const char *k);
bool mig_it_doc(const bson_t *d, const char *k, bson_t *out);
/* updateMigration to state `to` (to == m->state: save the checkpoint and stats only),
 * compare-and-set on m->state. Errors: SDB_ECONFLICT (the state changed: WriteConflict),
 * SDB_EINVAL (transition not in the table), SDB_EIO (any other failure). */
int mig_save(mig *m, mig_state to);
/* Load the record into m. Errors: SDB_ENOTFOUND (metadata answered an error: no such
 * migration), SDB_EIO (unreachable, bad reply), SDB_EINVAL (bad spec). */
int mig_load(mig *m);
/* Abort for good with the reason (mig_save to aborted). Errors: as mig_save. */
int mig_fail(mig *m, const char *why);
/* The chunk as routed now: its shard and token; fills m->min/max/key when m has none.
 * Errors: SDB_ENOTFOUND (no such chunk any more), SDB_EIO. */
int mig_routing_chunk(mig *m, char *shard, size_t shardlen, int64_t *token);
/* Build m->rc (a one-chunk routing view) from m->key/min/max. Errors: SDB_EINVAL (range
 * unknown, or route_coll_build refused it). */
int mig_build_view(mig *m);
/* Whether doc's shard key lies in the chunk (hashed keys through the hash). */
bool mig_in_chunk(mig *m, const bson_t *doc);
/* Whether every shard key field is _id (a document's chunk follows from its _id). */
bool mig_key_is_id(mig *m);

/* ------------------------------------------------------------ migrate_shard.c */

/* Resolve the source's and target's URIs (listShards) and open their clients (once).
 * Errors: SDB_EINVAL (a shard of the migration is not registered, or its URI is bad:
 * permanent, message in m->err), SDB_EIO (listShards failed). */
int mig_connect_shards(mig *m);
/* A command on m->db of a shard; a reply with writeErrors is an error (SDB_EIO). With
 * reply_out (not NULL), *reply_out is a copy of the reply on success only. Errors:
 * SDB_EUNAVAILABLE (the command failed: transport, or the shard answered an error whose
 * code is in m->code), SDB_EIO (writeErrors). */
int mig_shard_run(mig *m, mongoc_client_t *c, const bson_t *cmd, bson_t *reply_out);
/* Whether shard c has an index whose key pattern is exactly the shard key m->key (for a
 * hashed key {k: "hashed"}: the index that bounds keyRange reads and deletes; shards of
 * collections created before the embedded shard had hashed indexes lack it). *has false
 * when the collection is missing there. Errors: as mig_shard_run. */
int mig_has_key_index(mig *m, mongoc_client_t *c, bool *has);
/* The shard's oplog head (0 for an empty oplog). Errors: as mig_shard_run. */
int mig_oplog_head(mig *m, mongoc_client_t *c, uint64_t *ts);
/* Make every later write of shard c have an oplog ts above `ts` (an oplog ts of another
 * shard, secs << 32 | inc): mongod's `appendOplogNote {data, maxClusterTime: ts}` on admin,
 * which writes a replicated no-op entry above ts when c's newest entry is not already
 * above it. Called on the new owner at a switch, after the old owner's last write of the
 * chunk is replicated, so that change streams (which merge shards by ts) report the new
 * owner's writes of a document after the old owner's. Errors: SDB_EUNAVAILABLE (the
 * command failed; m->code holds the server's code, -1 for transport). */
int mig_ts_floor(mig *m, mongoc_client_t *c, uint64_t ts);

/* Called for each document of the chunk by mig_scan_chunk (doc borrowed for the call);
 * a non-zero return stops the scan and is returned. */
typedef int (*doc_fn)(mig *m, const bson_t *doc, void *arg);
/* The documents of the chunk in m->coll on shard c, and only them: the shard is asked
 * for the chunk's key range (keyRange, src/shard/README.md: it scans the shard-key index
 * between the bounds where it has one and checks ownership of every document exactly).
 * A snapshot (stripedbSnapshot, *at = its atOplogTs) when at is not NULL, else a find;
 * sorted by sort (NULL: none); projected by proj (NULL: whole documents). With at, a
 * getMore slower than spec.importLatencyMS backs off as long (the import throttle).
 * Errors: SDB_EUNAVAILABLE (the query or a getMore failed), SDB_ECANCELED (stopping), or
 * the non-zero value fn returned. */
int mig_scan_chunk(mig *m, mongoc_client_t *c, const bson_t *sort, const bson_t *proj,
		   uint64_t *at, doc_fn fn, void *arg);
/* Run cmd (a find-shaped command answering a cursor: find, stripedbSnapshot) in database
 * db of shard client c on one selected server, and open its cursor there (getMores pinned
 * to that server) into *out (the caller destroys it). With at: *at = the reply's
 * cursor.atOplogTs (stripedbSnapshot), 0 when absent. what names the step in m->err.
 * Errors: SDB_EUNAVAILABLE (no server, or the command failed: m->code = the server's
 * code, -1 for a network error). */
int mig_cursor_open(mig *m, mongoc_client_t *c, const char *db, const bson_t *cmd,
		    uint64_t *at, const char *what, mongoc_cursor_t **out);

/* ------------------------------------------------------------ migrate_cleanup.c */

/* Delete the chunk's documents from shard c in batches of at most spec.deleteBatch,
 * spec.deleteDelayMS apart, tagged $stripedbOrigin; m->deleted counts. Ranged keys: each
 * batch is one delete statement with keyRange/keyRangeLimit that the shard answers from
 * its shard-key index (until a batch deletes fewer); hashed keys the same on the hashed
 * index {k: "hashed"}. A hashed key on a shard without that index (a keyRange delete would
 * examine the whole collection per batch): the chunk is read once by mig_scan_chunk and
 * deleted by _id.
 * Errors: SDB_ECANCELED (stopping), and those of mig_shard_run and mig_scan_chunk. */
int mig_delete_chunk(mig *m, mongoc_client_t *c);

/* ------------------------------------------------------------ migrate_replicate.c */

/* Run replicator p from position start until its position reaches `until` (0: until a
 * poll finds nothing) or deadline_ms (monotonic; 0 none). 0 when reached (p->caught_up:
 * the log was drained). Errors: the position never moves past an unapplied event;
 * SDB_ETIMEOUT (deadline), SDB_ECANCELED (stopping), the CDC reader's (cdc_reader_open,
 * cdc_reader_next: SDB_ENOTFOUND a gap, SDB_ECORRUPT, SDB_EIO, SDB_EUNAVAILABLE),
 * SDB_ECORRUPT (an event that does not parse), and applying to the target's
 * (mig_shard_run). */
int mig_repl_run(mig *m, repl *p, uint64_t start, uint64_t until, int64_t deadline_ms);
/* Catch up with the head of p's CDC log as of now and, when src (the client of p's
 * source shard) is not NULL, with that shard's oplog head as of now too (the log lags the
 * oplog while a publisher is down or slow: "caught up" with the log alone would be a
 * claim about the past). p->caught_up when reached before deadline_ms. Errors: as
 * mig_repl_run, cdc_log_range's (reading the log's head) or mig_oplog_head's. */
int mig_repl_catch_up(mig *m, repl *p, uint64_t start, mongoc_client_t *src,
		      int64_t deadline_ms);
/* Close p's reader; unapplied statements are dropped (read again from p->pos). */
void mig_repl_close(repl *p);

/* ------------------------------------------------------------ the steps, one per state */

/* Each step follows the contract at the top of this file. Returns: 0 (progress made, or
 * nothing to do yet: called again). Errors: SDB_ECONFLICT (the record's state changed:
 * reload), SDB_ECANCELED (stopping), any other SDB_E* code of the helpers above to be
 * retried after a reload (message in m->err). */
int mig_step_register(mig *m);      /* migrate_import.c:    registered -> importing */
int mig_step_import(mig *m);        /* migrate_import.c:    importing -> replicating */
int mig_step_replicate(mig *m);     /* migrate_replicate.c: replicating -> verifying */
int mig_step_verify(mig *m);        /* migrate_verify.c:    verifying -> switching */
int mig_step_switch(mig *m);        /* migrate_switch.c:    switching -> switched | replicating */
/* switched -> cleaning after spec.graceMS; *since: when switched began (0: now).
 * Returns and Errors: the step contract above. */
int mig_step_switched(mig *m, int64_t *since);
int mig_step_rollback(mig *m);      /* migrate_switch.c:    rolling_back -> rolled_back | switched */
int mig_step_clean(mig *m);         /* migrate_cleanup.c:   cleaning -> complete */
/* migrate_cleanup.c: aborted, target copy not yet deleted -> targetCleaned. Returns and
 * Errors: the step contract above. */
int mig_step_aborted_cleanup(mig *m);

#endif
