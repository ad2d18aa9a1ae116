/* Internal interface between the proxy's command files (issue #24's split of exec.c):
 * exec.c (job runner, dispatch, shared helpers), read.c, write.c, admin.c, explain.c,
 * policy.c. Not a public contract: only src/proxy includes it.
 *
 * Threading: every function here runs on a request worker thread (shardconn_submit), with
 * one ctx per request; fan-out units (pcall_one, ...) run on the fan-out pool and touch
 * only their own unit.
 */
#ifndef SDB_PROXY_EXEC_H
#define SDB_PROXY_EXEC_H

#include "proxy/proxy.h"
#include "storage/pipeline.h"
#include "proxy/retry.h"
#include "proxy/txn.h"
#include "proxy/txnroute.h"

#define ERR_SHARD_KEY_NOT_FOUND 61
#define ERR_CURSOR_IN_USE 292
#define TWO_PHASE_IN_BATCH 5000
#define COLLECT_BATCH 5000

/* The answer a handler gives (recorded, then sent once by the job runner). */
typedef struct px_answer {
	int state;       /* 0 none yet, 1 reply, 2 error, 3 parked (px_parked: nothing sent) */
	bson_t *reply;   /* state 1: the reply document (owned) */
	int code;        /* state 2: MongoDB error code */
	bson_t *extra;   /* state 2: extra fields (errorLabels, retryAfterMS...), owned, or NULL */
	char *msg;       /* state 2: errmsg (bson_malloc'd) */
} px_answer;

/* One client request being executed. */
typedef struct ctx {
	proxy *p;
	wire_req *req;
	const char *user; /* the authenticated user (copied on the loop thread), or NULL */
	const bson_t *cmd;
	const char *db;
	char ns[512];
	const char *coll;
	uint64_t deadline_ms; /* end of the request's retry budget (monotonic ms): StaleConfig
			       * retries and resends to a shard (retry.h) */
	int backoff_ms;       /* the StaleConfig loop's current backoff step (retry.c) */
	proxy_txn txn; /* session fields of a retryable write (txn.h), forwarded to shards */
	px_answer *ans; /* where handlers put their answer (shared by copies of the ctx) */
	/* the client's $readPreference when it is not primary and the command is not a
	 * write (points into cmd; readpref.c), else NULL */
	const uint8_t *rp_data;
	uint32_t rp_len;
	pxtxn_stmt *tx; /* the transaction statement being run (txnroute.h), or NULL */
	/* the command's top-level `collation` (issue #20, storage/collation.h), NULL when
	 * simple or absent; also the request thread's collation while the handler runs */
	const struct sdb_collator *collator;
	/* the request runs again after a park (px_exec_resume): the checks before the handler
	 * (quota admission, policies) passed at its first run and are not repeated */
	bool resumed;
	/* the command's noCursorTimeout as run_job found it (truthy, as px_get_bool reads
	 * it), valid while cmd is nct_of (a copy of the ctx given another command looks its
	 * own up) */
	const bson_t *nct_of;
	bool nct;
} ctx;

/* The command table (exec.c), as src/shard/commands.c's. */
enum {
	PXC_COLL = 1,    /* needs a collection name string as its first field */
	PXC_WRITE = 2,   /* a write: its retryable-write fields are read (txn.h) */
	PXC_FREE = 4,    /* not counted by the tenant's quotas (killCursors) */
	PXC_ONE_DOC = 8, /* counts one document written for the quotas (findAndModify) */
	PXC_TXN_END = 16, /* commitTransaction / abortTransaction (txnroute.c) */
};
/* What the collection policy switches look at (policy.c). */
typedef enum {
	PXP_NONE,      /* not subject to the switches */
	PXP_FIND,      /* filter; bounded by a limit */
	PXP_QUERY,     /* query (count, distinct, findAndModify) */
	PXP_AGGREGATE, /* the first $match; bounded by $limit / $count */
	PXP_STMTS,     /* each statement's q (update, delete: the array cmd->stmts) */
} px_policy_kind;
typedef struct px_cmd {
	const char *name;
	/* the handler: records exactly one answer in c (px_reply / px_error ...) and returns
	 * its status: 0 with a reply, the error's MongoDB code with an error (see answers) */
	int (*run)(ctx *c);
	unsigned flags;       /* PXC_* */
	const char *stmts;    /* a write's statement array ("documents", ...), or NULL */
	px_policy_kind policy;
} px_cmd;
/* The routed command called name (exact case), or NULL. */
const px_cmd *px_cmd_find(const char *name);

/* ---- BSON helpers (exec.c) ---- */

/* True for the session/driver fields the proxy never forwards as they are ($db, lsid,
 * txnNumber, $clusterTime, $readPreference, api*, ...). readConcern is forwarded (outside
 * a transaction, whose first statement's readConcern txnroute.c sends itself), so the
 * shard applies or refuses it: afterClusterTime on a secondary not yet there is 238, and
 * snapshot, atClusterTime and linearizable are refused there instead of being dropped
 * into a plain read (issue #20). */
bool px_is_session_field(const char *k);
/* Append cmd to out (initialised) without session fields and without the names in skip
 * (NULL-terminated, may be NULL). */
void px_copy_cmd(const bson_t *cmd, bson_t *out, const char *const *skip);
/* Append `$stripedbVersion: {chunk: ch->id, token: ch->token}` to cmd. */
void px_append_version(bson_t *cmd, const route_chunk *ch);
/* Shard versions (shardver.c, issue #17): the collection and shard version of shard in rc
 * (largest token of the collection; largest token of the chunks rc routes to shard), read
 * from the snapshot's per-shard summary: O(shards), not O(chunks). */
void px_shard_version_of(const route_coll *rc, const char *shard, int64_t *cver, int64_t *sver);
/* Append `$stripedbShardVersion: {ns, collectionVersion, shardVersion}` for shard to cmd. */
void px_append_shard_version(bson_t *cmd, const route_coll *rc, const char *shard);
/* True when requests of rc's collection go to shard once with its shard version (the shard
 * filters orphans); false when that shard answered that it has no filtering metadata at
 * rc's routing version (then per-chunk requests with the ownership filter). */
bool px_shard_mode(const route_coll *rc, const char *shard);
/* After a StaleConfig from shard: true when its reply says the shard has no filtering
 * metadata for the collection (vWanted: null), remembered for rc's routing version. */
bool px_shard_mode_note(const route_coll *rc, const char *shard, const bson_t *err_reply);
/* px_shard_mode once per shard of one request, the shard named by its index in the
 * snapshot's per-shard summary (route_coll.shard_of[ci] of the chunk ci): no string compare,
 * no lock, no hash per chunk. Zero it before use (the first PX_MODE_MEMO shards of rc; beyond,
 * px_shard_mode is asked each time and `slot` is -1). `slot` gets the shard's index in the
 * memo, for the caller's per-shard bookkeeping (stream). */
#define PX_MODE_MEMO 32
typedef struct px_mode_memo {
	bool known[PX_MODE_MEMO];
	bool on[PX_MODE_MEMO];
	ssize_t stream[PX_MODE_MEMO]; /* caller's: the shard's request, -1 none yet */
} px_mode_memo;
bool px_shard_mode_memo(px_mode_memo *m, const route_coll *rc, size_t ci, ssize_t *slot);
/* The most requests a fan-out over the chunks selected in sel (rc->nchunks booleans) sends:
 * per shard with a selected chunk, 1 when the shard is in shard mode and per_chunk is false,
 * else its number of selected chunks. The shard mode is read through m (zeroed by the
 * caller) and stays fixed there, so the caller's fan-out, using the same memo, never sends
 * more; shards past PX_MODE_MEMO count per chunk. Lets a caller size its per-request arrays
 * by shards, not chunks. O(chunks) byte reads plus px_shard_mode once per shard. */
size_t px_stream_bound(px_mode_memo *m, const route_coll *rc, const bool *sel, bool per_chunk);
/* Static view of the document / array field name of d; false when absent or another type. */
bool px_get_doc(const bson_t *d, const char *name, bson_t *out);
bool px_get_array(const bson_t *d, const char *name, bson_t *out);
/* The filter q of one update/delete statement (it: an element of updates/deletes) into sq
 * (static, or empty when the statement has none); false when it is not a document. */
bool px_stmt_filter(const bson_iter_t *it, bson_t *sq);
/* A whole number read back from a reply or a checked command (common/bsonget.h rules);
 * def when absent or not one. Client arguments are range-checked with px_client_int. */
int64_t px_get_int(const bson_t *d, const char *name, int64_t def);
/* The client's argument name of c->cmd as a whole number in [lo, hi] (def when absent)
 * into *out. Returns: 0, or after answering c the MongoDB error code of a bad value
 * (common/bsonget.h's: TypeMismatch 14, BadValue 2, ...). */
int px_client_int(ctx *c, const char *name, int64_t lo, int64_t hi, int64_t def,
		   int64_t *out);
/* The client's `let` variables (c->cmd's `let`, evaluated: storage/pipeline.h
 * sdb_let_parse) for what the proxy parses itself (a merged find's projection, the merge
 * part of a pipeline); shards get `let` with the command. Returns: 0 with *vars
 * initialised (empty without `let`; the caller destroys it), or the code of the error
 * answered on c (sdb_let_parse's, BadValue 2 by default; *vars not initialised). */
int px_let(ctx *c, bson_t *vars);
/* Append the client's `let` (as given) to cmd, a command the proxy builds for a shard from
 * the client's (a statement, the collect phase of a multi-document write). */
void px_append_let(const ctx *c, bson_t *cmd);
/* Append the `collation` field of from (a client's command or write statement; NULL or
 * none: nothing) to cmd, a command the proxy builds for a shard (issue #20). */
void px_append_collation(const bson_t *from, bson_t *cmd);
/* A field as a boolean (bson_iter_as_bool), def when absent. */
bool px_get_bool(const bson_t *d, const char *name, bool def);
/* px_client_int over a field already found (sdb_bson_find_fields, common/fieldscan.h): it
 * on the field, or NULL when the command does not have it (then *out = def); name: the
 * field as messages name it. Returns: 0 with *out, or the code of the error answered on c
 * (px_client_int's). */
int px_client_int_field(ctx *c, const bson_iter_t *it, const char *name, int64_t lo,
			int64_t hi, int64_t def, int64_t *out);
/* An aggregate's arguments (read.c): the pipeline array of c->cmd as a static view into
 * it, and cursor.batchSize (101 when absent). Returns: 0, or FailedToParse (9) answered
 * on c when there is no pipeline array. */
int px_agg_args(ctx *c, bson_t *pipeline, int64_t *batch);
/* True when doc uses server-side JavaScript ($where, $function, $accumulator, code). */
bool px_uses_js(const bson_t *doc, int depth);
/* True when doc uses a server-side JavaScript operator ($where, $function, $accumulator)
 * anywhere; JavaScript code values are data here (a document may hold them: update and
 * replacement documents). */
bool px_uses_js_ops(const bson_t *doc);
/* Returns: 0 when doc uses no server-side JavaScript, else BadValue (2) answered on c. */
int px_refuse_js(ctx *c, const bson_t *doc);

/* ---- answers (exec.c) ----
 * A handler answers by recording ONE reply or error in c->ans and returns the status of
 * that answer: 0 for a reply, the error's MongoDB code (non-zero) for an error (a reply
 * document that says `ok: 0`, a shard's error reply passed on as it is, stands for its
 * `code`, InternalError 1 when it has none). Every answer function returns that status, so
 * the idiom is `return px_error(c, 2, "...");` or `return px_reply(c, r);`. Helpers that
 * may fail return the same status (0 = went on without answering) and give their object
 * through an out parameter; the caller propagates:
 * `if ((st = px_route_or_fail(c, &rc)) != 0) return st;`. The job runner sends the answer
 * when the handler returns, so a request is completed exactly once, and checks the
 * status against it (px_check_answer). A second answer is a bug: it is logged and dropped
 * (debug builds abort); a handler that returns without answering is answered
 * InternalError (1) and logged; one whose status does not match its answer is logged and
 * its answer sent as recorded (debug builds abort in both cases).
 * Fan-out units never answer: they keep their result for the handler. */

/* Answer with reply (taken over; `ok: 1.0` appended by the wire server when absent).
 * Returns: 0 (the code of reply when it says `ok: 0`, see above). */
int px_reply(ctx *c, bson_t *reply);
/* Answer {ok: 0, errmsg, code, codeName}. Returns: code. */
int px_error(ctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same with extra fields appended (extra taken over, may be NULL). Returns: code. */
int px_error_extra(ctx *c, int code, bson_t *extra, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Record that the handler parked c's request (cswait.h px_cswait_park returned 1): the job
 * runner sends nothing; the request is answered by a later run of it (px_exec_resume).
 * Returns: 0 (the status the handler returns with it). */
int px_parked(ctx *c);
/* Run the parked request req (of user, NULL without auth; copied) again on a request
 * worker, as a new job whose ctx has `resumed` set. Any thread. */
void px_exec_resume(proxy *p, wire_req *req, const char *user);
/* Run req (a routed command the wire server dispatched to the proxy) on a request worker:
 * its checks, its handler and its one answer (exec.c run_job). The user the command runs
 * as is read from req's connection here. Loop thread (the connection's auth state is the
 * loop's), as the dispatch hook that calls it and the forwarder that hands it requests it
 * could not answer (forwarder.h). */
void px_exec_submit(proxy *p, wire_req *req);
/* Append $stripedbViewCheck {allow: [allow ...]} (nallow names, "db.coll") to cmd (a
 * read forwarded whole to one shard, without one): a shard refuses with 169 naming the
 * source a read that meets a view over a collection not in allow (see exec.c "views"). */
void px_append_view_check(bson_t *cmd, const char *const *allow, size_t nallow);
/* Send the answer a recorded (state 1 or 2; state 3 sends nothing) as req's one
 * completion, after px_answer_mask_state_change, and clear a (what it owned is sent or
 * freed). No answer (state 0) is logged and answered InternalError (debug builds abort).
 * Any thread: the job runner's, and the loop's for the forwarder (forwarder.h). */
void px_answer_send(wire_req *req, px_answer *a);
/* True once c has an answer. */
bool px_answered(const ctx *c);
/* The status of the answer recorded in c: 0 for a reply (but see `ok: 0` above), the
 * error's code for an error, -1 when none is recorded (what run_job's check makes of
 * it: no answer). For tests and for a path that cannot know what was recorded; handlers
 * carry the status they got from the answer functions instead (operations run by
 * px_retry_run: px_retry.status). Returns: 0, an error code or -1 as above. */
int px_answer_status(const ctx *c);
/* Forget the answer recorded in a (its documents and message freed; a back to none), to
 * replace it (pxtxn_end) or drop it (a broken contract). No errors. */
void px_answer_clear(px_answer *a);
/* Verdicts of px_check_answer. */
enum {
	PX_ANSWER_OK = 0,       /* status and answer agree */
	PX_ANSWER_NONE = 1,     /* nothing recorded */
	PX_ANSWER_MISMATCH = 2, /* status 0 with an error, non-zero without the same code */
};
/* The job runner's check of a handler's contract: status (what it returned) against a
 * (what it recorded). Pure; logs nothing. Returns: a PX_ANSWER_* verdict. */
int px_check_answer(int status, const px_answer *a);

/* Answer with a shard's reply, without its $clusterTime / operationTime. Returns: 0, or
 * the reply's code when it says `ok: 0` (px_reply). */
int px_reply_copy(ctx *c, const bson_t *reply);
/* Answer with the error of a failed shard call (cls: SHARDCONN_*): the shard's code and
 * errmsg, or HostUnreachable (6) for a network error, labelled RetryableWriteError only
 * when the shard certainly did not execute the command (issue #11). Returns: the code
 * answered (InternalError 1 when the shard's reply has none). */
int px_reply_shard_error(ctx *c, int cls, const bson_t *reply, const char *neterr);
/* A network error of a retryable write: HostUnreachable with the RetryableWriteError
 * label, plus NoWritesPerformed when no shard executed any of it. Returns: 6. */
int px_reply_retryable_net_error(ctx *c, bool nothing_written, const char *neterr);
/* The answer to a write sent whole to one shard (cls, reply: its result): the reply copied;
 * a network error as px_reply_retryable_net_error when the write is retryable (c->txn.on),
 * else as px_reply_shard_error. (retry.c, with the two above.) Returns: the status of the
 * answer (px_reply_copy's for a copied reply, else the code answered). */
int px_reply_write_result(ctx *c, int cls, const bson_t *reply, const char *neterr);
/* Mask a shard's state-change error in an answer before it is sent (px_answer_send):
 * a code for which wire_state_change_code holds (NotWritablePrimary 10107,
 * InterruptedDueToReplStateChange 11602, ShutdownInProgress 91 ...), as the answer's
 * top-level code, its writeConcernError's or a writeErrors entry's (a multi-shard write
 * reports a shard's error as its statements' write errors, and pymongo 3.11 reads those
 * too: topology._handle_error clears the pool), becomes HostUnreachable (6) with errmsg
 * "<codeName> (<code>) from a shard: <errmsg>", and an error reply's top-level
 * topologyVersion (the shard's) is dropped. Why: a driver reads a state-change code as news
 * about the server that answered (SDAM "Error handling": mark it Unknown, clear its pool,
 * wait for its monitor), and that server is this proxy, whose state did not change; its
 * monitor's awaitable hello then answers only at maxAwaitTimeMS (10 s), so one shard's
 * election stalled the proxy's clients. HostUnreachable keeps what they may do: the
 * retryable reads spec retries it once, and errorLabels (RetryableWriteError on a
 * retryable write, whose resend the shard recognises; TransientTransactionError,
 * UnknownTransactionCommitResult) are kept as they are. The proxy has no state-change error
 * of its own to give through an answer (its shutdown is answered by the wire layer).
 * a: any state; changed in place. Errors: none. */
void px_answer_mask_state_change(px_answer *a);

/* ---- StaleConfig retries, routing, the cluster (retry.c; the loop is retry.h's) ---- */

/* The routing of c->ns into *out (a reference; the caller unrefs it). Returns: 0, or
 * HostUnreachable (6) answered on c (*out NULL) when metadata cannot be reached and
 * nothing is cached. */
int px_route_or_fail(ctx *c, route_coll **out);
/* The primary shard id of c->db (heap) into *primary: the database's own when metadata
 * records it (issue #18), else the cluster's default (the lowest shard id). Returns: 0,
 * or ShardNotFound (70) answered on c (*primary NULL) when no shard is registered. */
int px_with_primary(ctx *c, char **primary);
/* The routing of c->ns / the primary shard id of c->db (as px_with_primary), without
 * answering (the proxy's cluster: route and primary). */
route_coll *px_route(ctx *c, bool force, char *err, size_t errlen);
char *px_primary(ctx *c);
/* Every known shard's id (shard list reloaded first) / one shard's hosts (retry.h). */
size_t px_shard_ids(ctx *c, char ***out);
char *px_shard_hosts(ctx *c, const char *id);
/* Run fn(arg, 0..n-1) in parallel on the proxy's cluster (shardconn_fanout). */
void px_fanout(ctx *c, size_t n, void (*fn)(void *arg, size_t i), void *arg);

/* ---- read preferences (readpref.c, issue #15) ---- */

/* Parse c->cmd's $readPreference (rp: on that field of c->cmd, as the caller found it):
 * a mode other than primary on a command that is not a write is kept in c
 * (rp_data/rp_len) for px_run_on, unless it has maxStalenessSeconds (>= 90): then the
 * read goes to the primary (no secondary's staleness is known).
 * Returns: 0, or the code of the refusal answered on c: an unknown mode or a malformed
 * one, a maxStalenessSeconds that is not a number (FailedToParse 9), a negative
 * maxStalenessSeconds other than -1, maxStalenessSeconds with mode primary or (not
 * supported) secondary, non-empty tag sets (BadValue 2), maxStalenessSeconds 1..89
 * (MaxStalenessOutOfRange 160). */
int px_read_pref_check(ctx *c, const px_cmd *cmd, const bson_iter_t *rp);
/* True, with *rp (static, into c->cmd) the client's $readPreference, when fwd (a command
 * for a shard) is a read that follows it: find, aggregate, count, distinct. */
bool px_read_pref_applies(const ctx *c, const bson_t *fwd, bson_t *rp);

/* ---- one shard (px_run_on: retry.c; the rest: exec.c) ---- */

/* Run cmd on shard in c->db (px_shard_call within the request's budget c->deadline_ms; in a
 * transaction pxtxn_run_on). Returns: a SHARDCONN_* class (not an SDB_E* status; NET_ERR
 * with the message in neterr); reply is always initialised (caller
 * destroys); *sid (may be NULL) gets the server id for getMores. */
int px_run_on(ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid, bson_t *reply,
	      char *neterr, size_t nelen);
/* Initialise a stream of shard for db.coll (no ownership filter). */
void px_stream_init(pstream *s, const char *shard, const char *db, const char *coll);
/* Answer the client with the first batch of cur (batch documents at most; single: close it
 * after this batch), registering it when it has more. Takes cur. Returns: 0, or the code
 * of the error answered when the first batch fails (InternalError 1 by default). */
int px_answer_cursor(ctx *c, proxy_cursor *cur, int64_t batch, bool single,
		      const char *batch_field, const char *ns);
/* Forward a cursor-returning command to one shard as is and answer through a proxy cursor;
 * the shard's writeConcernError (an aggregate with $out / $merge) is answered with it.
 * Returns: the status of the answer (0, or the code of the shard's error). */
int px_forward_cursor(ctx *c, const char *shard, const bson_t *cmd, int64_t batch,
		       bool single);
/* Forward c->cmd as it is (session fields dropped; a retryable write keeps lsid,
 * txnNumber and its stmtIds) to the primary shard, where unsharded collections live, and
 * answer with its result (px_reply_write_result); ShardNotFound (70) when there is none.
 * Returns: the status of the answer (0, or the code of the error answered). */
int px_forward_primary(ctx *c);
/* The same for a cursor command, answered through a proxy cursor (px_forward_cursor).
 * Returns: the status of the answer (0, or the code of the error answered). */
int px_forward_primary_cursor(ctx *c, int64_t batch, bool single);
/* How px_route_sharded forwards an unsharded collection's command. */
typedef enum { PX_FWD_PLAIN, PX_FWD_CURSOR } px_fwd;
/* The routing of c->ns when it is sharded. Two outcomes:
 *  - *out the routing (a reference, the caller unrefs it), returns 0: nothing answered,
 *    the caller goes on;
 *  - *out NULL: c is answered and the status of that answer is returned (0 included!):
 *    routing unavailable (px_route_or_fail's HostUnreachable 6), or the collection is
 *    unsharded and c->cmd was forwarded whole to the primary shard (px_forward_primary,
 *    or with PX_FWD_CURSOR px_forward_primary_cursor(batch, single)).
 * Idiom: `if ((st = px_route_sharded(c, fwd, b, s, &rc)) != 0 || rc == NULL) return st;`
 * Returns: 0 or an error code as above. */
int px_route_sharded(ctx *c, px_fwd fwd, int64_t batch, bool single, route_coll **out);

/* ---- reads (read.c) ---- */

/* Collect from chunk ci the owned documents matching q (in sort order when sort is given),
 * at most limit (0 = all): their _id values into ids (an array being built; *n counts),
 * or, when docs is not NULL, the whole documents into docs. The find carries the
 * `collation` of coll_from (the client's command or write statement; NULL: none), so the
 * shard matches under it (issue #20). Returns: a SHARDCONN_* class
 * (not an SDB_E* status); on failure err_reply/nerr hold the error. */
int px_collect_owned(ctx *c, route_coll *rc, size_t ci, const bson_t *q, const bson_t *sort,
		     const bson_t *coll_from, int64_t limit, bson_t *ids, bson_t *docs, size_t *n,
		     bson_t *err_reply, char *nerr, size_t nelen);

/* The find read.c sends for chunk ci of rc (a sharded collection) into out (initialised by
 * the caller): find c->coll with filter, sort and proj when not NULL or empty, batchSize
 * batch, the client's options the shards carry (hint, collation, maxTimeMS, comment, ...
 * from c->cmd), and, per_shard (the shard keeps filtering metadata, px_shard_mode), limit
 * when > 0 and the shard's version (px_append_shard_version), else the chunk's
 * (px_append_version). Shared by scatter_open_once and the loop's sharded point reads
 * (forwarder.c), so both send the same command. No errors. */
void px_find_shard_cmd(const ctx *c, const route_coll *rc, size_t ci, bool per_shard,
		       const bson_t *filter, const bson_t *sort, const bson_t *proj,
		       int64_t batch, int64_t limit, bson_t *out);
/* The batchSize read.c asks a sharded find's shards for, given the client's skip, limit
 * (0: none) and batchSize (101 when absent): limit + skip or batch + skip when smaller,
 * at most 1000, at least 1. */
int64_t px_find_first_batch(int64_t skip, int64_t limit, int64_t batch);

/* ---- one update or delete statement of a sharded collection (write.c) ---- */

/* The command write.c sends for the update (is_update) or delete statement at elem (the
 * client's statement 0: a document) to chunk ci of rc when its filter pins that one chunk
 * exactly, into cmd (initialised by the caller): the statement as given, ordered, the
 * client's writeConcern and let, the shard key check of a pipeline update, the chunk's
 * version (px_append_version), and c->txn's session fields with stmtId 0 when the
 * statement is not multi. False when elem is not a document (nothing appended). Shared by
 * write.c's exact-target send and the loop's sharded point writes (forwarder.c). */
bool px_stmt_shard_cmd(ctx *c, route_coll *rc, size_t ci, const bson_iter_t *elem,
		       bool is_update, bson_t *cmd);
/* Answer c (px_do_write's answer) for a one-statement update (is_update) or delete that
 * was sent as px_stmt_shard_cmd built it: reply is the shard's answer when cls is
 * SHARDCONN_OK, else its error (cls a SHARDCONN_* class other than STALE, neterr the
 * network error). Returns: the answer's status, as px_do_write's. */
int px_stmt_answer(ctx *c, bool is_update, const bson_t *reply, int cls, const char *neterr);

/* ---- parallel calls, one per shard (retry.c) ---- */

/* One command for one shard, run in parallel with others (a fan-out unit). */
typedef struct pcall {
	ctx *c;
	char *shard;  /* heap */
	bson_t cmd;
	bson_t reply; /* always initialised */
	int cls;      /* SHARDCONN_* */
	char nerr[256];
} pcall;

/* Fan-out unit (shardconn_fanout): runs call i of the pcall array arg. */
void px_pcall_one(void *arg, size_t i);
/* n calls for the shards ids (their strings are taken over; the array is freed). */
pcall *px_pcalls_new(ctx *c, char **ids, size_t n);
void px_pcalls_free(pcall *pc, size_t n);
/* The first failed call (NULL when all succeeded); codes in skip_codes (0-terminated) of
 * shard errors are not failures. */
pcall *px_pcalls_failed(pcall *pc, size_t n, const int *skip_codes);

/* ---- command handlers (the command table's run): each records exactly one answer ----
 * Returns: its status (0 for a reply, else the recorded error's code; see answers above). */
int px_do_find(ctx *c);                      /* read.c */
int px_do_get_more(ctx *c);

/* ---- $unionWith / $lookup / $graphLookup (foreign.c) ---- */

/* Where an aggregate over c->db with the stage array stages runs: *cross when a
 * $unionWith/$lookup/$graphLookup (in the pipeline, a sub-pipeline or a $facet) names
 * another collection, and then *foreign_sharded when one of those is sharded (an unsharded
 * main collection's pipeline then runs on the proxy, not whole on the primary shard, so
 * that the stage sees every shard's documents). Returns: 0, HostUnreachable (6) answered on
 * c (no routing), 3904801 answered on c for a $graphLookup of a sharded collection
 * inside a transaction (mongod's refusal), or 232 MaxSubPipelineDepthExceeded answered on c
 * for a pipeline nested deeper than any valid one (FOREIGN_MAX_DEPTH). */
int px_agg_placement(ctx *c, const bson_t *stages, bool *cross, bool *foreign_sharded);
/* The output of the aggregate {aggregate: coll, pipeline: stages, let} in c->db run through
 * the proxy's own routing (px_do_aggregate on a copy of c, the same path as a client's
 * aggregate, then getMores until the cursor is exhausted). let: evaluated variables
 * ({name: value}, sent as {$literal}s) or NULL; coll NULL: {aggregate: 1} (a leading
 * $documents). *docs: a heap array of *n heap documents
 * (bson_destroy each, free the array). Errors: SDB_EINVAL with the sub-request's MongoDB
 * *code and message in err (nothing in *docs). Blocking: a worker thread only. */
int px_sub_aggregate(ctx *c, const char *coll, const bson_t *stages, const bson_t *let,
		     bson_t ***docs, size_t *n, int *code, char *err, size_t errlen);
/* Run the handler run on sub (a copy of the request's ctx, e.g. with another db/coll/ns)
 * with cmd as its command, through the same path as a client's request. 0 and its reply in
 * *reply (owned by the caller: bson_destroy). Errors: SDB_EINVAL with the answer's MongoDB
 * *code and message in err (an error answer or a reply with ok: 0). Blocking: a worker
 * thread only. */
int px_sub_run(ctx *sub, int (*run)(ctx *), const bson_t *cmd, bson_t **reply, int *code,
	       char *err, size_t errlen);
struct sdb_aggw;
/* An aggregate whose pipeline ends with $out or $merge (w, common/aggwrite.h; batch: its
 * cursor.batchSize) through the proxy (outmerge.c): forwarded whole to the primary shard
 * when source and target are unsharded there, else the pipeline runs through the proxy's
 * routing and the proxy writes its output (see outmerge.c). Answers c with an empty cursor
 * or the error (263 in a transaction, 28769 $out to a sharded collection, 51183, the
 * writes' errors, 13113 ...). Returns: the status of the answer. */
int px_agg_write(ctx *c, const struct sdb_aggw *w, int64_t batch);
/* sdb_pipeline_foreign_fn of the proxy (arg: the request's ctx *): px_sub_aggregate's
 * documents as the source. Errors: px_sub_aggregate's. */
int px_agg_foreign(void *arg, const char *coll, const bson_t *stages, const bson_t *let,
		   sdb_pipeline_source *out, int *code, char *err, size_t errlen);
int px_do_kill_cursors(ctx *c);
/* changestream.c (issue #20): where $changeStream is in the stage array stages (top level).
 * Returns: 1 first, -1 elsewhere (then 40602), 0 nowhere. */
int px_cs_pipeline_kind(const bson_t *stages);
/* An aggregate whose first stage is $changeStream (batch: its cursor.batchSize): the
 * merged change stream of every shard through a proxy cursor (see changestream.c).
 * Returns: the status of the answer (0, or the code answered: 40415, 40602, 20, 50865,
 * 40674, 260, 238, 263, a shard's error ...). */
int px_do_change_stream(ctx *c, const bson_t *stages, int64_t batch);
/* A getMore of the change stream cursor cur (checked out; id, ns the client's): waits up
 * to the getMore's maxTimeMS (1 s by default) for events, answers the batch with the
 * postBatchResumeToken, and checks cur in again or destroys it (invalidate, error).
 * Returns: the status of the answer (0, or the code answered). */
int px_cs_get_more(ctx *c, proxy_cursor *cur, px_cs *cs, int64_t id, const char *ns);
int px_do_count(ctx *c);
int px_do_distinct(ctx *c);
int px_do_aggregate(ctx *c);
int px_do_insert(ctx *c);                    /* write.c */
int px_do_write(ctx *c, bool is_update);     /* update (true) / delete (false) */
int px_do_find_and_modify(ctx *c);          /* findandmodify.c */
int px_do_broadcast(ctx *c);                 /* admin.c */
int px_do_create_indexes(ctx *c);
int px_do_list_indexes(ctx *c);
int px_do_list_union(ctx *c, bool databases); /* listDatabases / listCollections */
int px_do_coll_stats(ctx *c);
int px_do_validate(ctx *c); /* admin.c: mongos' validate (raw per shard) */
/* admin.c: the documents of a leading {$collStats: spec} through a proxy, one per shard
 * owning c->ns (mongos's), {ns, shard, host, localTime, storageStats?, count?}, into
 * *docs (heap array of *n heap documents; free each with bson_destroy, then the array).
 * Returns: 0 with *docs; with *docs NULL, the status of the answer given on c instead
 * (FailedToParse 9 for an option stripedb does not keep, a shard's error or its reply). */
int px_coll_stats_stage_docs(ctx *c, const bson_t *spec, bson_t ***docs, size_t *n);
int px_do_db_stats(ctx *c);
int px_do_explain(ctx *c);                   /* explain.c */
int px_do_enable_sharding(ctx *c);           /* sharding.c (issue #18) */
int px_do_shard_collection(ctx *c);
int px_do_list_shards(ctx *c);
int px_do_add_shard(ctx *c);
int px_do_balancer(ctx *c);                  /* balancerStatus / balancerStart / balancerStop */
int px_do_rename_collection(ctx *c);         /* renameCollection of an unsharded collection */
int px_do_refused_sharding(ctx *c);          /* refineCollectionShardKey, reshardCollection */
int px_do_remove_shard(ctx *c);              /* removeShard of a shard without chunks */
int px_do_move_chunk(ctx *c);                /* moveChunk: one migration, waited for */
int px_do_move_range(ctx *c);                /* moveRange: split out of its chunk, moved */
int px_do_merge_chunks(ctx *c);              /* mergeChunks: bounds of contiguous chunks */
int px_do_split(ctx *c);                     /* split with middle (sh.splitAt) */
int px_do_drop(ctx *c);                      /* drop: sharding metadata, then every shard */
int px_do_drop_database(ctx *c); /* dropDatabase: metadata's database, then every shard */
/* currentop.c (issue #20): currentOp over every shard (admin only: 13; a shard's failure
 * fails it); killOp's "shardid:opid" form (28625 bad format, 70 unknown shard, 9 a bad
 * opid). Returns: the status of the answer (0, or the code answered). */
int px_do_current_op(ctx *c);
int px_do_kill_op(ctx *c);
/* The $currentOp aggregation stage is not offered by the proxy (mongos would gather every
 * shard's ops; the currentOp command does): 238 NotImplemented when stages holds one at
 * the top level. Returns: 0 when there is none, else the code answered. */
int px_refuse_current_op_stage(ctx *c, const bson_t *stages);
/* Answer req, currentOp of the tenant user (its `$ownOps: true` checked by the gate), with
 * the operations of srv's connections authenticated as user, as mongod describes them
 * (wire_server_each_op, with effectiveUsers) and filtered by the command's other fields
 * (admin only: 13; a bad filter: the matcher's code). Loop thread. */
void px_current_op_own(wire_server *srv, wire_req *req, const char *user);
/* MongoDB's host string of a shard URI (heap): "rs/h1:p1,h2:p2" for a replica set, else
 * "h1:p1,..."; the URI itself when unparsable. */
char *px_shard_host_string(const char *uri);
/* The read-only config database (configdb.c, issue #18): *done true when c->db is "config"
 * and the command is answered there (find, aggregate, count, listCollections from
 * metadata; anything else but getMore/killCursors refused with IllegalOperation 20);
 * *done false (nothing answered, 0 returned) otherwise: the command's handler runs.
 * Returns: the status of the answer when *done (0 or its error code), else 0. */
int px_config_db(ctx *c, const px_cmd *cmd, bool *done);

/* ---- admission and policy (policy.c) ---- */

/* The tenant's quotas (quota.h). Returns: 0 when admitted, else RateLimited (462)
 * answered on c. */
int px_admit(ctx *c, const px_cmd *cmd);
/* The collection policy switches (quota.h). Returns: 0 when allowed, else the code of the
 * refusal answered on c. */
int px_policy_check(ctx *c, const px_cmd *cmd);

/* dbprimary.c: a primary shard per database (issue #18). All block on metadata or shards
 * (worker threads). */
/* Reload this proxy's cache of the databases' primary shards (listDatabases) at once. */
void px_reload_db_primaries(ctx *c);
/* The primary shard metadata records for db (heap), from a fresh listDatabases; NULL when
 * db is unknown or metadata unreachable. */
char *px_meta_db_primary(ctx *c, const char *db);
/* Before enableSharding gives db (not yet in metadata) primary shard ps. Returns: 0 when
 * that cannot hide anything, else the code answered on c: IllegalOperation (20) when the
 * default primary holds documents of db, or the error of asking it (HostUnreachable 6...). */
int px_db_data_stays_visible(ctx *c, const char *db, const char *ps);
/* Before metadata records database db: another database whose name differs from db only
 * in ASCII case is refused as mongod's config server refuses it (createDatabase:
 * DatabaseDifferCase 13297 "database already created with different case ..."). Returns: 0
 * (none, or metadata unreachable: the createDatabase that follows reports that), else the
 * code answered on c. Known gap: a write to an unrecorded database lands on the default
 * primary shard, which checks only its own databases (storage/catalog.c). */
int px_db_case_check(ctx *c, const char *db);
/* The unsharded collections shard id holds as the primary shard of their database: how
 * many into *count (names, up to 20, "db.coll, ..." in out). Returns: 0, or the code of
 * the error answered on c (metadata or a shard unreachable...). */
int px_unsharded_on(ctx *c, const char *id, char *out, size_t outlen, int64_t *count);

#endif
