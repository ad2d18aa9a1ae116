/* The shard role's internals (src/shard/): a worker pool running commands against the
 * store (storage/store.h) off the loop thread, and the cursor registry.
 *
 * Threading: wire handlers run on the role's loop thread and only enqueue a job; each of
 * shard_pool_workers() threads owns one sdb_store_conn and runs jobs to completion, replying with
 * wire_req_reply/wire_req_error (thread-safe). Write transactions are serialized by the
 * store; reads run concurrently on WAL snapshots.
 *
 * Command extensions (documented in docs of issue #4):
 *   $stripedbVersion: {chunk: "ID", token: N}  on any command: StaleConfig 13388
 *        ({ok: 0, code: 13388, codeName: "StaleConfig", errmsg, chunk, storedToken}) when N
 *        is older than the stored token, checked in the command's own transaction.
 *   $stripedbOrigin: "mig-42"                  on writes: recorded as `origin` in every
 *        oplog entry the command writes.
 *   With $stripedbOrigin (a migration's replicator, retry_mig.c): an update or delete
 *        statement may carry $stripedbSession: {lsid, txnNumber, stmtId, result}, the
 *        session record of the source's statement it replays, written in the statement's
 *        savepoint; an update command may carry $stripedbSessions: [{lsid, txnNumber,
 *        stmtId, result} | {lsid, txnNumber, incompleteHistory: true}], records alone.
 *   {stripedbSetVersion: 1, chunk: ID, token: N} -> {ok: 1, chunk, token: stored}: moves the
 *        token forward only.
 *   {stripedbCheck: 1} -> {ok: 1, problems: [...], nProblems}: indexes vs collections and
 *        oplog vs data (sdb_store_check).
 *   {stripedbSnapshot: "coll", filter: {...}, projection?, sort?, batchSize?}: the
 *        documents of one consistent read transaction plus `atOplogTs` (the newest oplog
 *        ts of that snapshot: replay the oplog from ts > atOplogTs to catch up); the reply
 *        is a cursor {cursor: {id, ns, firstBatch, atOplogTs}} drained with getMore.
 *   find also accepts `stripedbSnapshot: true` with the same effect on its reply.
 *   $changeStream: {..., $stripedbMerge: true, $stripedbShardId: "id"}: a proxy's shard
 *        stream (changestream.h): no invalidate, no lookup; tokens name the shard by id.
 */
#ifndef SDB_SHARD_SHARD_H
#define SDB_SHARD_SHARD_H

#include <bson/bson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/metrics.h"
#include "common/role.h"
#include "storage/query.h"
#include "storage/store.h"
#include "wire/server.h"

/* Worker threads of the pool, each with its own store connection: twice the online CPUs,
 * at least SHARD_WORKERS_MIN and at most SHARD_WORKERS_MAX (shard_pool_workers). Workers
 * never wait for one another (writes go to the apply thread, awaitData getMores park
 * off the pool), so more workers than CPUs only buys overlap with long reads, and each
 * one costs context switches: on 2 CPUs, 4 workers instead of 8 took 17% less shard CPU
 * per YCSB C point read (tests/bench/README.md, issue #19). */
#define SHARD_WORKERS_MIN 4
#define SHARD_WORKERS_MAX 32
/* A cursor not used for this long (ms, MongoDB's cursorTimeoutMillis) is reaped: the
 * default of --cursor-timeout-ms. */
#define SHARD_CURSOR_IDLE_MS (10 * 60 * 1000)
/* Documents in a first batch when the command gives no batchSize (as mongod). */
#define SHARD_DEFAULT_BATCH 101
/* Bytes of documents in one cursor batch: 16 MiB minus room for the reply's envelope. */
#define SHARD_MAX_REPLY_BYTES (16 * 1024 * 1024 - 64 * 1024)

/* Logical sessions remembered for $listLocalSessions (shard_sessions_note); when full, the
 * least recently used one is replaced. */
#define SHARD_MAX_SESSIONS 1024
/* One logical session seen in a command: id is the 16 bytes of lsid.id (a UUID). Stored by
 * value in shard.sessions under sess_mu. */
typedef struct shard_session {
	uint8_t id[16];
	int64_t last_use_ms; /* epoch ms (lastUse is a Date) */
} shard_session;

/* The shard role (struct shard below): one per process running the role, created and
 * freed by role.c. */
typedef struct shard shard;
/* The context of one command run (struct shard_ctx below). */
typedef struct shard_ctx shard_ctx;
typedef struct shard_repl shard_repl; /* repl.h: the member's Raft group */
typedef struct shard_cursor shard_cursor;

/* A command body run on a worker thread. It must complete x->req exactly once. */
typedef void (*shard_cmd_fn)(shard_ctx *x);

/* One command being run: on a worker thread (reads) or in the replicated apply (writes).
 * Every pointer is borrowed: sh, conn (the worker's or the apply's connection), req (the
 * request to complete exactly once), cmd and db (views into req's message) outlive the
 * command. err is scratch space for a store error's message (err, sizeof err), copied
 * into the reply by the code that replies. */
struct shard_ctx {
	shard *sh;
	sdb_store_conn *conn;
	wire_req *req;
	const bson_t *cmd;
	const char *db;
	const char *origin;  /* $stripedbOrigin or NULL */
	const char *chunk;   /* $stripedbVersion.chunk or NULL */
	int64_t token;
	/* $stripedbShardVersion {ns, collectionVersion, shardVersion} (filtering.c): sv_ns
	 * NULL when absent; owner is the shard's ownership of sv_ns once shard_begin checked
	 * the versions (a reference released by shard_ctx_run), for the orphan filter. */
	const char *sv_ns;
	int64_t sv_cver, sv_sver;
	struct route_owned *owner;
	void *resume; /* a parked command's continuation (shard_await), else NULL */
	/* a statement of a multi-document transaction run tentatively on the apply
	 * connection (txn.c): reads are materialized on x->conn (no pooled streaming
	 * connection: it would not see the transaction's own writes), no tailer is woken */
	bool in_txn;
	/* run on the event loop thread (shard_pool_run_inline): the command must finish in
	 * bounded time without waiting; one that finds it would not (a view, a plan that is
	 * not a point lookup) sets deferred, answers nothing and is queued for a worker */
	bool inline_run;
	bool deferred;
	/* the command's `let` variables (MongoDB 5.0: find, aggregate, update, delete,
	 * findAndModify), evaluated by shard_ctx_run (storage/pipeline.h sdb_let_parse) and
	 * released after the command; read them with shard_let */
	bson_t let;
	bool have_let;
	/* errInfo of the last failure (a DocumentValidationFailure's {failingDocumentId,
	 * details}, shard/validation.h), heap, taken by the code that replies; freed by
	 * shard_ctx_run when left */
	bson_t *err_info;
	char err[512];
};

/* Zero x and set it up to run req (its command and database, views into req) as shard sh
 * on conn (may be NULL: a command that only parses). */
void shard_ctx_init(shard_ctx *x, shard *sh, sdb_store_conn *conn, wire_req *req);

/* The command's `let` variables ({name: constant}) for sdb_query_spec.let,
 * sdb_pipeline_opts.let, sdb_projection_new_vars and sdb_update_opts.vars, or NULL. */
static inline const bson_t *shard_let(const shard_ctx *x)
{
	return x->have_let ? &x->let : NULL;
}

/* A queued command (shard_pool_submit, shard_pool_submit_write): heap, owned by the queue
 * and freed by the worker that runs it. req is completed by fn (or, for a write, by the
 * replicated apply it is handed to). */
typedef struct shard_job {
	struct shard_job *next;
	shard_cmd_fn fn;
	wire_req *req;
	bool replicate; /* a write: checked here, then proposed through repl.h */
	void *resume; /* handed to the command as shard_ctx.resume */
} shard_job;

/* An awaitData getMore that found nothing new, parked without holding a worker: it is
 * queued again (fn with resume = this) when a commit moves the oplog, when its deadline
 * passes, or when the shard stops. The cursor stays checked out (busy) while parked. */
typedef struct shard_await {
	struct shard_await *next;
	shard_cmd_fn fn;
	wire_req *req;
	shard_cursor *c;
	int64_t batch;
	int64_t deadline_ms; /* CLOCK_MONOTONIC ms: answer with an empty batch then */
} shard_await;

/* The shard role's state. Owned by role.c (created at start, freed after the stop once
 * every worker and the await thread joined); role, store and srv are the role's. Each group
 * of fields is guarded by the mutex named above it; the rest is set at start and read-only
 * after, or used on the loop thread only (timers, repl, failed_start). */
struct shard {
	sdb_role *role;
	sdb_store *store;
	/* /metrics: the store's WAL checkpoints (sdb_store_checkpoint_counts), by who ran
	 * them ([0] its checkpoint thread, [1] a committing connection), [2] the commits
	 * that waited for the thread, and the counts already added (role.c ckpt_metrics,
	 * under the metrics hook lock) */
	sdb_counter *c_ckpt[3];
	uint64_t ckpt_seen[3];
	/* /metrics: reads that took over the read transaction the loop's previous read kept
	 * open (sdb_store_reads_taken_over), and the count already added (the same hook) */
	sdb_counter *c_reads_kept;
	uint64_t reads_kept_seen;
	wire_server *srv;
	/* pool */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	shard_job *head, *tail;
	bool stopping;
	pthread_t threads[SHARD_WORKERS_MAX];
	int n_threads;
	/* parked awaitData getMores (shard_await), guarded by oplog_mu; the await thread
	 * sleeps on oplog_cv until the earliest deadline. Lock order: oplog_mu, then mu. */
	pthread_mutex_t oplog_mu;
	pthread_cond_t oplog_cv;
	shard_await *waiters;
	bool await_closed;  /* no more parking: answer at once (shutdown) */
	int64_t await_close_ms; /* shutdown: parked getMores answer by then (0: not closing) */
	bool await_stop;    /* the await thread exits */
	bool await_started;
	pthread_t await_thread;
	/* cursors */
	pthread_mutex_t cur_mu;
	shard_cursor *cursors; /* linked list */
	uv_timer_t reap_timer;
	/* --cursor-timeout-ms: an idle cursor (not noCursorTimeout) is killed after this */
	uint64_t cursor_idle_ms;
	/* spare store connections */
	pthread_mutex_t conn_mu;
	sdb_store_conn *spare[16];
	int n_spare;
	/* sessions */
	pthread_mutex_t sess_mu;
	shard_session sessions[SHARD_MAX_SESSIONS];
	size_t n_sessions;
	bool test_commands; /* --enable-test-commands: configureFailPoint accepted */
	shard_repl *repl;   /* the replica set this member belongs to (repl.h) */
	struct shard_ttl *ttl; /* the TTL monitor (ttl.h), NULL when disabled */
	struct shard_members *members; /* membership metrics sampler (members.h) */
	/* the replica set as last sampled (replSetGetStatus's document, members.c), for
	 * /healthz?format=json on the HTTP thread; guarded by health_mu */
	pthread_mutex_t health_mu;
	bson_t *health_doc;
	struct shard_txns *txns;       /* open multi-document transactions (txn.h) */
	uv_timer_t abandon_timer; /* graceful stop: answer uncommitted writes by the timeout */
	bool failed_start;        /* closing after a failed start: no sdb_role_stopped */
	/* $currentOp aggregations' op documents, from the loop thread to their worker
	 * (currentop.c), guarded by curop_mu. curop_n is their number, written under
	 * curop_mu and read without it by shard_curop_drop's fast path (every request): an
	 * atomic, since a plain read racing with the loop thread's push is a data race. */
	pthread_mutex_t curop_mu;
	struct shard_curop_snap *curop_snaps;
	_Atomic size_t curop_n;
	/* The cluster time (issue #20, clustertime.c): the highest $clusterTime gossiped
	 * to this member (packed Timestamp; the newest oplog ts is max'ed in when it is
	 * read). The primary proposes every entry of writes with it as the ts floor. */
	_Atomic uint64_t cluster_time;
};

/* --- clustertime.c (issue #20: cluster-time gossip, common/clustertime.h) --- */
/* This member's cluster time: max(the gossiped clock, the newest committed oplog ts).
 * Any thread. Returns: a packed Timestamp (0 before any write or gossip). */
uint64_t shard_cluster_time(shard *sh);
/* The wire hooks (wire_ct_in_fn, wire_ct_out_fn): in reads the request's $clusterTime,
 * refuses a malformed one (TypeMismatch 14, NoSuchKey 4) and one more than a year ahead
 * of this member's wall clock (ClusterTimeFailsRateLimiter 205, mongod's message) and
 * advances the clock; with a cluster key, only from a connection authenticated as the
 * cluster user (every client of a keyed shard is; an unauthenticated hello's time is not
 * taken, as mongod ignores an unauthenticated client's). out appends $clusterTime (signed
 * with the cluster key's derived secret when one is loaded, else zeros and keyId 0) and
 * operationTime (the newest committed oplog ts) to every reply. */
bool shard_ct_in(wire_req *req, void *role_data);
void shard_ct_out(wire_req *req, void *role_data, bson_t *reply);

/* --- pool.c --- */
/* A store connection from the shard's pool of spare connections (opened on demand), for
 * work that may outlive the command (streaming cursors). Any thread; give it back with
 * shard_conn_put. NULL on error with the message in err (sdb_store_conn_open failed). */
sdb_store_conn *shard_conn_get(shard *sh, char *err, size_t errlen);
/* Return a connection (its transaction is rolled back); extra ones are closed. */
void shard_conn_put(shard *sh, sdb_store_conn *c);
/* Close every spare pooled connection (at stop, after the workers joined). */
void shard_conns_close(shard *sh);
/* The number of worker threads shard_pool_start starts on this machine (see
 * SHARD_WORKERS_MIN). Returns: 2 x the online CPUs, clamped to [MIN, MAX]. */
int shard_pool_workers(void);
/* Start the worker threads (shard_pool_workers(), each owning one store connection) and the
 * parked-getMore machinery. Loop thread, once, at start. Errors: SDB_EIO, message in
 * err (a worker's store connection could not be opened or configured, or a thread could not
 * be created). On error the workers already started keep running and sh->n_threads counts
 * them: the caller stops them with shard_pool_stop. */
int shard_pool_start(shard *sh, char *err, size_t errlen);
/* Queue fn for req (loop thread). The job is freed by the worker; fn completes req. */
void shard_pool_submit(shard *sh, shard_cmd_fn fn, wire_req *req);
/* Run a read that passed its gates (read preference, readConcern) now or after waiting
 * (repl.h shard_repl_read_concern): a $currentOp aggregate takes its op documents here,
 * everything else goes to the pool as shard_pool_submit. Loop thread (commands.c). */
void shard_cmd_run_read(shard *sh, wire_req *req, shard_cmd_fn fn);
/* Run fn for req now, on the calling event loop thread, as a worker would (the same
 * checks, a pooled store connection), without the hand-off to a worker and back (two
 * thread wake-ups per request). For reads whose cost is bounded whatever the data: a
 * find by _id (shard_read_inline_ok). When the command finds it is not such a read (it
 * sets x->deferred before answering), it is queued for a worker as shard_pool_submit.
 * Issue #19: on a 2-core machine those wake-ups were the largest cost of a point read. */
void shard_pool_run_inline(shard *sh, shard_cmd_fn fn, wire_req *req);
/* Check a write command (command extensions, transaction fields; loop thread) and hand
 * it to shard_repl_submit. The checks only parse, so they run on the calling loop thread;
 * with the onPrimaryTransactionalWrite test fail point armed (which reads the session
 * table) a worker runs them. */
void shard_pool_submit_write(shard *sh, wire_req *req);
/* Run command fn for x (x->sh, conn, req, cmd and db set): parse the stripedb extensions
 * ($stripedbOrigin, $stripedbVersion), refuse transaction fields and evaluate the `let`
 * variables (x->let, released after fn), then call fn. Used by
 * the workers and by the replicated apply (repl.c). */
void shard_ctx_run(shard_ctx *x, shard_cmd_fn fn);
/* Park a (heap, ownership taken on true) for later: returns false, keeping a with the
 * caller, when it cannot wait (the shard stops or a->deadline_ms has passed) and the
 * command must answer now. When the oplog already moved past after_ts (a commit raced
 * the caller's scan) a is queued at once. Any worker thread. */
bool shard_await_park(shard *sh, shard_await *a, uint64_t after_ts);
/* Queue every parked getMore now and refuse new parking (the start of a shutdown: each
 * answers with what it has, so the wire server's drain does not wait for their
 * deadlines). Any thread; idempotent. */
void shard_await_close(shard *sh);
/* The start of a graceful stop with a quiesce period of ms: parked getMores (and those
 * parking meanwhile) answer by then at the latest, so a tailer is neither cut off nor
 * spun in a loop of empty batches during the quiesce; ms 0 is shard_await_close. */
void shard_await_close_by(shard *sh, int64_t ms);
/* Stop and join every worker (blocks until running jobs finish). */
void shard_pool_stop(shard *sh);
/* Wake awaitData waiters after a commit that wrote the oplog: every parked getMore is
 * queued to rescan the oplog from its last_ts (and parks again if nothing matched). */
void shard_oplog_notify(shard *sh);

/* --- commands.c --- */
/* The handler of command name (a static function, never freed), or NULL when the shard
 * does not know the command. */
shard_cmd_fn shard_cmd_lookup(const char *name);
/* Does command name change the shard's state (and so go through the Raft log)? */
bool shard_cmd_is_write(const char *name);

/* --- cursors.c --- */
/* A cursor of the registry (find, aggregate, listCollections, tailable oplog reads). Heap
 * (sdb_store_calloc_aligned: it embeds a bson_t), owned by the registry once added, freed
 * with shard_cursor_free. docs[pos..n_docs) are the documents still to return (heap, each
 * sdb_doc_free'd with the cursor) for a materialized cursor; a streaming one holds conn, q
 * and proj instead. Fields other than busy/killed/last_used_ms are used only by the
 * thread that has the cursor checked out. */
struct shard_cursor {
	shard_cursor *next;
	shard *sh;
	int64_t id;
	char *ns; /* db.coll */
	bson_t **docs;
	size_t n_docs, pos;
	bool tailable, await_data;
	uint64_t last_ts; /* tailable oplog cursors: newest ts returned */
	bson_t filter;    /* tailable: the filter re-applied to new entries */
	bool busy;        /* checked out by a getMore */
	/* find's noCursorTimeout: never reaped for idleness, only exhausted, killed or
	 * freed at stop (MongoDB's ClientCursor isNoTimeout) */
	bool no_timeout;
	bool killed;      /* killCursors while busy: dropped when put back */
	/* streaming cursors (find): the query runs in a read transaction of a pooled
	 * connection the cursor keeps, so every batch comes from one snapshot and memory
	 * stays bounded by one batch */
	sdb_store_conn *conn;
	struct sdb_query *q;
	struct sdb_projection *proj;
	bson_t *pending; /* a document that did not fit the previous batch */
	/* the collation the command ran under (shard_cursor_add takes the thread's): a
	 * streaming cursor's getMores compare strings under it too (interned, never freed) */
	const struct sdb_collator *collation;
	uint64_t last_used_ms;
	/* a change stream's state (changestream.h), NULL for other cursors; freed with the
	 * cursor (shard_cs_free) */
	struct shard_cs *cs;
};
/* Register a cursor (ownership taken, with its documents) and return its id (random,
 * non-zero, unique among the registered cursors); it keeps the calling thread's collation
 * (the command's). Any thread; never fails. */
int64_t shard_cursor_add(shard *sh, shard_cursor *c);
/* Check a cursor out for a getMore (busy until shard_cursor_put). NULL if unknown or busy;
 * *busy tells which. */
shard_cursor *shard_cursor_take(shard *sh, int64_t id, bool *busy);
/* Return a cursor after a getMore; drop it when exhausted (not tailable) or dead. */
void shard_cursor_put(shard *sh, shard_cursor *c, bool drop);
/* Kill by id; true if it existed. */
bool shard_cursor_kill(shard *sh, int64_t id);
/* Free a cursor that is not registered (or was unlinked): its documents, its pooled
 * connection (given back), its query and projection. */
void shard_cursor_free(shard_cursor *c);
/* Free every cursor not checked out that was last used more than idle_ms before now_ms
 * (MongoDB's cursorTimeoutMillis; the shard reaps after --cursor-timeout-ms, 10 minutes by
 * default), except noCursorTimeout ones; idle_ms 0 frees every cursor not checked out
 * (the shard stopping). Any thread. */
void shard_cursors_reap(shard *sh, uint64_t now_ms, uint64_t idle_ms);
/* Free every cursor (at stop, when no worker runs). */
void shard_cursors_free_all(shard *sh);

/* Build a cursor reply {cursor: {firstBatch|nextBatch: docs[0..], id, ns}} into reply (an
 * initialised document the caller owns) taking up to batch documents (0 = default 101
 * first / all for getMore) and at most SHARD_MAX_REPLY_BYTES; *taken gets the count. docs
 * are borrowed (copied into the reply); extra_cursor_fields (may be NULL) are appended to
 * the cursor sub-document. */
void shard_cursor_reply(bson_t *reply, const char *ns, int64_t id, bool first, bson_t **docs,
			size_t n, size_t batch, size_t *taken, const bson_t *extra_cursor_fields);

/* How many of docs[0..n) fit one batch of at most batch documents (0 = no count limit)
 * and SHARD_MAX_REPLY_BYTES bytes (always at least one when n > 0). */
size_t shard_batch_fit(bson_t **docs, size_t n, size_t batch);

/* --- sessions (cursors.c): logical session ids seen in commands ($listLocalSessions) --- */
/* Note the lsid (if any) of cmd, req's command or another (util_cmd_find; req may be
 * NULL). Any thread. */
void shard_sessions_note(shard *sh, const wire_req *req, const bson_t *cmd);
/* The sessions as $listLocalSessions documents {_id: {id, uid}, lastUse} (heap array of
 * heap documents; free with util_docs_free). */
void shard_sessions_list(shard *sh, bson_t ***docs, size_t *n);

/* --- retryable writes (retry.c, issue #16) ---
 * A write command's session fields. Usage in a write command with count statements:
 * shard_txn_parse before shard_begin, shard_txn_start after it; per statement i:
 * shard_txn_lookup (1: executed before, merge the recorded result and skip it),
 * shard_txn_tag before its writes (oplog entries carry lsid/txnNumber/stmtId),
 * shard_txn_record of its result inside its savepoint; shard_txn_free at the end. */
typedef struct shard_txn {
	bool on;      /* lsid and txnNumber given: statements are recorded */
	bson_t lsid;  /* static view into the command */
	int64_t txn;  /* txnNumber */
	int32_t base; /* stmtId of statement 0 when there is no stmtIds array */
	int32_t *ids; /* stmtIds (heap, count entries) or NULL */
} shard_txn;
/* Read lsid/txnNumber/stmtId/stmtIds of x->cmd for count statements. Replies (TypeMismatch
 * 14, InvalidOptions 72: txnNumber without lsid, stmtIds of another length) and returns
 * false when malformed. */
bool shard_txn_parse(shard_ctx *x, shard_txn *t, uint32_t count);
/* Inside the command's write transaction: start or continue the session's txnNumber.
 * Replies TransactionTooOld (225) or InternalError, rolls back and returns false. */
bool shard_txn_start(shard_ctx *x, shard_txn *t);
/* Test commands: MongoDB's onPrimaryTransactionalWrite fail point (wire/server.h
 * wire_failpoint_primary_write) for a retryable write received from a client that has a
 * statement not executed before. True when the fail point answered x->req (the command
 * must not run). Worker thread, before the command runs or is replicated. */
bool shard_txn_fail_point(shard_ctx *x);
/* The stmtId of statement i: stmtIds[i] when the command had the array, else base + i. */
int32_t shard_txn_stmt_id(const shard_txn *t, uint32_t i);
/* Returns: 1 when statement i already executed (*res: its recorded result, heap,
 * sdb_doc_free), 0 when not (or no session; *res NULL), -1 after replying to x->req (the
 * command is over): InternalError (1) when the session record could not be read (the
 * store's SDB_EIO or SDB_ECORRUPT), IncompleteTransactionHistory (217) when the statement
 * has no record but its txnNumber's history was not carried by a migration. Not an
 * SDB_E* status. */
int shard_txn_lookup(shard_ctx *x, shard_txn *t, uint32_t i, bson_t **res);
/* Tag the oplog entries of statement i's writes with the session fields. */
void shard_txn_tag(shard_ctx *x, shard_txn *t, uint32_t i);
/* Record statement i's result (res borrowed; same savepoint as its writes); stops tagging.
 * Nothing to do (0) without a session. Errors: SDB_EIO (the oplog entries or the session
 * record could not be written; message in x->err, nothing replied). */
int shard_txn_record(shard_ctx *x, shard_txn *t, uint32_t i, const bson_t *res);
/* Release t's stmtIds array (t->lsid is a view and needs nothing). */
void shard_txn_free(shard_txn *t);

/* A migrated statement record (retry_mig.c): $stripedbSession of a replayed statement,
 * borrowed from the command (lsid and result are static views into x->cmd: valid while
 * the command runs, nothing to free). */
typedef struct shard_mig_sess {
	bool on;
	bson_t lsid;   /* static, into the command */
	int64_t txn;
	int32_t stmt;
	bson_t result; /* static, into the command */
} shard_mig_sess;
/* Read $stripedbSession of statement st into ms (ms->on false when absent). Accepted only
 * on a command with $stripedbOrigin. Returns: 0, or the MongoDB code BadValue (2) with the
 * message in x->err (nothing replied: the caller reports it as the statement's error) when
 * the field comes without $stripedbOrigin, with the command's txnNumber, is not a document
 * or lacks lsid, txnNumber, stmtId or result. Not an SDB_E* status. */
int shard_mig_sess_parse(shard_ctx *x, const bson_t *st, shard_mig_sess *ms);
/* Before the replayed statement's writes: tag its oplog entries with the source's
 * lsid/txnNumber/stmtId. */
void shard_mig_sess_tag(shard_ctx *x, shard_mig_sess *ms);
/* After the replayed statement succeeded, in its savepoint: its oplog entries get the
 * stmtResult, the session record is imported (sdb_store_session_import). Nothing to do
 * (0) when ms->on is false. Errors: message in x->err; SDB_EIO (a write failed),
 * SDB_EINVAL (not inside a write transaction: a caller's bug). */
int shard_mig_sess_record(shard_ctx *x, shard_mig_sess *ms);
/* $stripedbSessions of an update command with $stripedbOrigin: import every record in the
 * command's transaction. Replies (BadValue on a malformed record, InternalError) and
 * returns false on failure. */
bool shard_mig_sessions_import(shard_ctx *x);
/* {stripedbSessionList: 1, after?: lsid, limit?: 1..100000 (10000)} -> {sessions: [{lsid,
 * txnNumber}], more}: the live sessions in lsid byte order (read-only; a migration marks
 * those of its source whose history it cannot carry). */
void shard_cmd_session_list(shard_ctx *x);
/* When x->cmd carries startTransaction or autocommit (a statement of a transaction that
 * did not come through txn.c, which strips them): replies IllegalOperation (20) and
 * returns true. */
bool shard_txn_refuse_fields(shard_ctx *x);
/* {stripedbStmtResult: 1, lsid, txnNumber, stmtId} -> {executed: bool, result?}: whether
 * this shard executed that statement of the session's active txnNumber, and its recorded
 * result (insert/delete {n}, update {n, nModified, upserted?}, findAndModify its reply).
 * Read-only; lets a proxy find which shard ran an untargeted single-document write. */
void shard_cmd_stmt_result(shard_ctx *x);
/* commitTransaction / abortTransaction reaching a worker (never: the dispatcher hands them
 * to txn.c): refused with IllegalOperation (20). */
void shard_cmd_txn_refuse(shard_ctx *x);

/* --- commands (commands.c) --- */
/* Register every command handler on the shard's wire server (sh->srv): reads go to the
 * worker pool, writes to the replica set's proposals (repl.h), transactions to txn.h.
 * Loop thread, at start. */
void shard_register_commands(shard *sh);
/* currentOp and killOp (currentop.c, issue #20): registered on sh->srv, answered on the
 * loop thread. Loop thread, at start (called by shard_register_commands). */
void shard_currentop_register(shard *sh);
/* An aggregate whose pipeline starts with $currentOp (loop thread, before the command
 * goes to a worker): checks it as mongod (admin and {aggregate: 1}, else 73; options
 * allUsers, idleConnections, idleSessions, idleCursors (true: 238), localOps,
 * truncateOps, backtrace, booleans, else 9; $currentOp later in the pipeline: 40602) and
 * takes the op documents now (the stage's defaults: allUsers false, truncateOps false)
 * for shard_curop_take. Returns true when it answered req (an error), false to run the
 * command. */
bool shard_curop_stage_dispatch(shard *sh, wire_req *req);
/* The op documents taken for the aggregate with this opid (worker): true with *docs
 * (free with util_docs_free) and *n, false when there are none. */
bool shard_curop_take(shard *sh, int32_t opid, bson_t ***docs, size_t *n);
/* Free what shard_curop_take did not take for opid (the command failed before its
 * pipeline ran). Worker, after the command. */
void shard_curop_drop(shard *sh, int32_t opid);
/* Free every snapshot left (at stop, the workers joined). */
void shard_curop_free_all(shard *sh);

/* helpers shared by command files (commands.c) */
/* Begin a transaction and check $stripedbVersion; on failure replies and returns false. */
bool shard_begin(shard_ctx *x, bool write);
/* The collation a find, count, distinct, aggregate, findAndModify, update or delete runs
 * with (issue #20): shard_begin calls this for the command itself (replying with its error), cmd_write.c again for
 * each update/delete statement. The `collation` of holder (the command or the statement)
 * when it has one, else the default of db.coll (create's `collation` option, stored in the
 * catalog), else simple; made the thread's collation (storage/collation.h
 * sdb_collation_use: every string comparison, sort and group key of the command follows
 * it) until shard_ctx_run ends. Needs the command's transaction open. Returns: 0, or
 * MongoDB's error code for a bad collation (collation.h lists them) with the message in
 * x->err (nothing replied; the thread's collation is then unchanged). */
int shard_collation_set(shard_ctx *x, const char *coll, const bson_t *holder);
/* Inside a transaction: when db.coll is a view, fail the request with
 * CommandNotSupportedOnView (166), roll back, and return true (MongoDB refuses writes and
 * index builds on views). */
bool shard_refuse_view(shard_ctx *x, const char *coll);
/* Commit; on failure replies with an error and returns false. On success notifies tailers
 * when write. */
bool shard_commit(shard_ctx *x);
/* The collection name of a command ({find: "c"}): the first field as a string, or NULL
 * after replying InvalidNamespace. */
const char *shard_coll_arg(shard_ctx *x);
/* Roll back x->conn's open transaction (if any) and reply {ok: 0, code, codeName, errmsg}
 * to x->req with MongoDB error code code and the printf-formatted message (copied, cut at
 * 1023 bytes). Completes the request: call it once, then return. */
void shard_fail(shard_ctx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Returns: the MongoDB code of a store error rc (SDB_E*), never an SDB_E* status:
 * SDB_EINVAL BadValue (2), SDB_EEXISTS DuplicateKey (11000), SDB_ESTALE StaleConfig
 * (13388), SDB_ENOTFOUND NamespaceNotFound (26), SDB_ETOOBIG BSONObjectTooLarge (10334),
 * anything else InternalError (1). Pure. */
int shard_code_of(int rc);

/* Command handlers (shard_cmd_fn, registered by commands.c): each runs with x's store
 * connection on a worker thread (reads) or inside the replicated apply on the loop thread
 * (writes: the same code on every member), parses x->cmd as mongod does and completes
 * x->req exactly once, with MongoDB's reply shape or `{ok: 0, errmsg, code, codeName}`.
 * cmd_read.c: find, getMore, killCursors, count, distinct, aggregate, explain,
 * stripedbSnapshot; cmd_write.c: insert, update, delete, findAndModify; cmd_admin.c:
 * create, drop, createIndexes, dropIndexes, listIndexes, listCollections, listDatabases,
 * dropDatabase, collStats, dbStats, stripedbSetVersion, stripedbCheck. */
void shard_cmd_find(shard_ctx *x);
void shard_cmd_getmore(shard_ctx *x);
void shard_cmd_killcursors(shard_ctx *x);
void shard_cmd_count(shard_ctx *x);
void shard_cmd_distinct(shard_ctx *x);
void shard_cmd_aggregate(shard_ctx *x);
void shard_cmd_explain(shard_ctx *x);
void shard_cmd_snapshot(shard_ctx *x);
void shard_cmd_insert(shard_ctx *x);
void shard_cmd_update(shard_ctx *x);
void shard_cmd_delete(shard_ctx *x);
void shard_cmd_findandmodify(shard_ctx *x);
void shard_cmd_create(shard_ctx *x);
void shard_cmd_coll_mod(shard_ctx *x); /* shard/validation.h */
void shard_cmd_drop(shard_ctx *x);
/* renameCollection (admin database only): renames an unsharded collection of this shard,
 * across databases too, keeping its documents, indexes and UUID, in one transaction with
 * one "c" oplog entry as MongoDB's (storage/store.h sdb_store_coll_rename); replicated as
 * the other catalog commands. Arguments and codes: common/renamecoll.h, then 26 (no
 * source), 166 (a view as source), 20 (the source or the target has filtering metadata:
 * a sharded collection), 48 (a view as target; a target without dropTarget). */
void shard_cmd_rename_collection(shard_ctx *x);
void shard_cmd_create_indexes(shard_ctx *x);
void shard_cmd_drop_indexes(shard_ctx *x);
void shard_cmd_list_indexes(shard_ctx *x);
void shard_cmd_list_collections(shard_ctx *x);
void shard_cmd_list_databases(shard_ctx *x);
void shard_cmd_drop_database(shard_ctx *x);
void shard_cmd_coll_stats(shard_ctx *x);
/* The collStats fields of db.coll (co its catalog entry; in x's open read transaction):
 * ns, size, count, avgObjSize, storageSize, nindexes, indexSizes, totalIndexSize, capped,
 * appended to reply (cmd_admin.c; also the $collStats stage's storageStats, cmd_read.c). */
void shard_coll_stats_append(shard_ctx *x, const char *coll, const sdb_store_coll *co,
			     bson_t *reply);
void shard_cmd_db_stats(shard_ctx *x);
/* validate: MongoDB's collection validation (cmd_admin.c; storage/store.h sdb_store_validate). */
void shard_cmd_validate(shard_ctx *x);
void shard_cmd_set_version(shard_ctx *x);
/* Filtering metadata (filtering.c, issue #17). */
void shard_cmd_set_filtering(shard_ctx *x);
void shard_cmd_get_filtering(shard_ctx *x);
void shard_cmd_list_filtering(shard_ctx *x);
/* Parse $stripedbShardVersion of x->cmd into x (sv_*). Replies BadValue and returns false
 * when it is malformed or names another namespace than the command's. */
bool shard_filtering_parse(shard_ctx *x);
/* The strict check of a stripedbSetFiltering install as it arrives, before the worker
 * proposes it (pool.c): the key pattern (1 or "hashed" alone), chunks of exactly id, min,
 * max, token with bounds naming the key's fields in order and min < max, distinct ids; the
 * local, admin and config databases and system collections refused. The Raft apply and a
 * stored install's load do not repeat it, so what an earlier version wrote applies alike on
 * every member. Any other command, and a drop, pass. Returns true when x may be proposed;
 * else replies (BadValue 2, or IllegalOperation 20 for the namespaces) and returns false. */
bool shard_filtering_precheck(shard_ctx *x);
/* The version check of $stripedbShardVersion inside x's open transaction: true with
 * x->owner set when the request's versions match what the shard has installed; else
 * replies StaleConfig (13388, nothing executed; also when the shard has no filtering
 * metadata for the namespace), rolls back and returns false. */
bool shard_filtering_gate(shard_ctx *x);
/* Set spec's orphan filter from x->owner (a new reference for the query); no-op without. */
void shard_filtering_spec(shard_ctx *x, sdb_query_spec *spec);
/* Release x->owner. */
void shard_filtering_release(shard_ctx *x);
/* keyRange: {key, min, max} of a find or stripedbSnapshot (issue #17: a migration reads
 * exactly one chunk). The bounds of the query's key range point into kr's iterators
 * (lo, hi: the caller keeps this struct until sdb_query_open returns). */
typedef struct shard_key_range {
	bson_iter_t lo, hi;
	bson_value_t lo_wide; /* a numeric min's scan start (shard_filtering_key_range) */
	bson_value_t hi_wide; /* a compound key's numeric max's scan end (the same) */
} shard_key_range;
/* Parse kr (the keyRange document of x->cmd's collection ns) into spec: the orphan
 * filter becomes "the shard key lies in [min, max)" (route.h's chunk test, ranged or
 * hashed: exactly the proxy's and the coordinator's), and the query's key range bounds
 * the scan of the shard-key index: for a ranged key the first key field from min's to
 * max's value; for a hashed key {k: "hashed"} the hashes from min's to max's NumberLong
 * on the hashed index {k: "hashed"} (storage/query.h range_hashed); MinKey / MaxKey leave
 * that side open. Without such an index on the shard (a collection created before its
 * shards had hashed indexes) every document is examined, only the chunk's returned.
 * Returns: 0, or the MongoDB code BadValue (2) with the message in x->err (nothing
 * replied) on a malformed range or together with $stripedbShardVersion. Not an SDB_E*
 * status. On error spec is unchanged (no orphan filter reference taken). */
int shard_filtering_key_range(shard_ctx *x, const char *ns, const bson_t *kr,
			      shard_key_range *r, sdb_query_spec *spec);
/* {stripedbCheck: 1} (cmd_admin.c): sdb_store_check in a read transaction, replied as
 * {ok: 1, problems: [strings], nProblems}; InternalError (1) when the check fails. */
void shard_cmd_check(shard_ctx *x);
/* {appendOplogNote: 1, data: {...}, maxClusterTime?: Timestamp} on admin (mongod's command,
 * cmd_admin.c): a replicated write that appends the no-op entry {op: "n", ns: "", o: data}
 * with a ts above maxClusterTime (nothing when the oplog's newest ts already is above it;
 * storage/store.h sdb_store_oplog_note), so that change streams' high-water marks pass
 * it. Errors: 13 off admin, 4 without data, 14 data not a document or maxClusterTime not a
 * Timestamp, 2 maxClusterTime more than a year ahead of the entry's clock. */
void shard_cmd_append_oplog_note(shard_ctx *x);

#endif
