/* Internals of a shard replica set member shared by src/shard/repl.c (state machine,
 * proposals, start/stop) and src/shard/repl_hello.c (hello, read gates, read concern,
 * member registration). Not for other files: the contract is repl.h. Loop thread unless
 * a field says otherwise. */
#ifndef SDB_SHARD_REPL_INT_H
#define SDB_SHARD_REPL_INT_H

#include <pthread.h>
#include <raft.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/metrics.h"
#include "raft/node.h"
#include "shard/repl.h"
#include "shard/txn.h"

/* The progress of an insert applied in parts (shard/repl.h SHARD_INSERT_PART). */
typedef struct repl_part {
	uint32_t off, total; /* the next document of the command, its documents */
	int64_t n;           /* documents the parts so far inserted */
	bool ordered;
	bson_t *werrs;       /* their writeErrors, indexes of the whole command (bson_new: a
			      * bson_t needs an alignment calloc does not give) */
	uint32_t n_werrs;
	size_t errmsg_bytes; /* their errmsg bytes (mongod's 1 MiB budget per reply) */
} repl_part;

/* A repl_part (heap) when the write named name with body cmd is an insert to apply in
 * parts, else NULL. */
repl_part *repl_insert_parts(const char *name, const bson_t *cmd);
/* Documents in the next part. */
uint32_t repl_part_len(const repl_part *p);
/* *out (initialized here; the caller destroys it): the next part of cmd, i.e. cmd with
 * documents (and stmtIds when it has txnNumber or stmtIds) sliced. */
void repl_part_cmd(const repl_part *p, const bson_t *cmd, bson_t *out);
/* Merge the reply (owned) of the part just applied: NULL and *more when another part
 * follows (the reply destroyed), else the reply to send (owned). */
bson_t *repl_part_done(repl_part *p, bson_t *reply, bool *more);
void repl_part_free(repl_part *p);

/* A write waiting to be proposed. */
typedef struct repl_item {
	struct repl_item *next;
	wire_req *req;
	int32_t w;
	int64_t wtimeout;  /* ms bound on the replication wait (0: none) */
	bool by_maxtime;   /* the bound is the command's maxTimeMS */
	shard_txn_rec *txn; /* a transaction's commit (txn.h): proposed first, validated then */
	int64_t part_n;    /* a multi-document delete applied in parts (repl.c, REPL_DELETE_PART):
			    * documents deleted by its earlier parts; -1: an ordinary write */
	repl_part *part;   /* an insert applied in parts (owned), else NULL */
} repl_item;

/* One proposed entry: the requests its replies go to, in command order. */
typedef struct repl_batch {
	struct repl_batch *next, *prev;
	shard_repl *r;
	wire_req **reqs; /* NULL slots: already answered (stop) */
	int32_t *w;      /* each command's numeric writeConcern.w (0: majority or less) */
	int64_t *wtimeout; /* its wtimeout in ms (0: none) */
	bool *by_maxtime;  /* that bound is maxTimeMS (MaxTimeMSExpired when it passes) */
	int64_t *part_n;   /* repl_item.part_n of each command */
	repl_part **part;  /* repl_item.part of each command (owned until its reply) */
	size_t n;
	uint64_t start_ns;
} repl_batch;

/* A reply held until writeConcern.w members hold its entry (w above a majority). */
typedef struct wc_wait {
	struct wc_wait *next;
	wire_req *req;
	bson_t *reply;
	uint64_t index;
	int32_t w;
	uint64_t deadline_ms; /* sdb_mono_ms; 0: none (wait as long as it takes) */
	bool by_maxtime;      /* the deadline is the command's maxTimeMS */
} wc_wait;

typedef struct member_wire {
	uint64_t id;
	char *wire;
} member_wire;

/* Samples of the log's growth kept for lag in ms: 4096 ticks of 50 ms, over 3 minutes of
 * continuous writes (64 KiB). */
#define REPL_VIEW_RING 4096

/* What the primary last heard from a member (repl_view.c, sampled every 50 ms). */
typedef struct member_contact {
	uint64_t id;
	uint64_t seen_ms;   /* sdb_mono_ms of its last answer seen (or of the election) */
	uint64_t caught_ms; /* sdb_wall_ms when it last held the primary's whole log */
} member_contact;

/* A follower's registration with the primary in flight (repl_hello.c): r is the member, or
 * NULL once it closed (the callback then only frees this). */
struct repl_reg_async {
	struct shard_repl *r;
};

struct shard_repl {
	shard *sh;
	sdb_node *node;
	struct raft *raft;
	struct raft_fsm fsm;
	sdb_store_conn *conn; /* the apply connection (loop thread) */
	uint64_t last_applied;
	bson_t *last_result;
	char *set_name; /* --replica-set or NULL (hello looks standalone) */
	char *me;       /* this member's wire address */
	char *raft_addr;
	uint64_t id;
	/* writes queued by workers for the loop */
	uv_async_t async;
	bool async_init;
	uv_timer_t reg_timer; /* retries ensure_registered until the map has this member */
	pthread_mutex_t mu;
	repl_item *head, *tail;
	bool closed; /* no more proposals: queued writes are refused */
	repl_batch *inflight;
	unsigned n_inflight; /* entries proposed, not applied yet (<= REPL_MAX_INFLIGHT) */
	wc_wait *wc_waits; /* replies waiting for more members than a majority */
	struct lin_read *lin_reads; /* linearizable reads waiting for their barrier */
	struct reg_req *reg_reqs;   /* stripedbRegisterMember waiting for its commit */
	/* reads waiting for afterClusterTime (repl_causal.c) */
	struct ct_read *ct_reads;
	uint64_t ct_noop_want;    /* highest T they wait for (packed ts; 0: none) */
	uint64_t ct_noop_done;    /* highest T a no-op request to the primary succeeded for */
	uint64_t ct_noop_next_ms; /* sdb_mono_ms before which no request goes (back-off) */
	struct ct_noop *ct_noop;  /* the request in flight, or NULL */
	uint64_t ct_close_ms;     /* the stop's quiesce ends (sdb_mono_ms; 0: not stopping) */
	uv_timer_t wc_timer;
	uv_timer_t stall_timer; /* measures how long the loop thread was busy (see stall_cb) */
	/* ends the read transaction the loop's reads keep open on conn
	 * (sdb_store_keep_reads) after each round of the loop's I/O callbacks */
	uv_check_t read_check;
	uv_timer_t read_release; /* read_check_cb's: ends a kept read transaction */
	uint64_t stall_last_ns;
	/* member wire addresses (replicated: op "shardMember") */
	member_wire *members;
	size_t n_members;
	/* the primary's view of every member (repl_view.c) */
	member_contact contacts[SHARD_REPL_MAX_MEMBERS];
	size_t n_contacts;
	uint64_t contacts_term; /* term the contacts were gathered in (0: not leader) */
	/* when this member's log reached which index (every 50 ms tick that saw it grow),
	 * oldest first from ring_head: when an entry a lagging member lacks is no longer in
	 * memory, its append time is read here (to 50 ms) */
	struct {
		uint64_t index;
		int64_t wall_ms;
	} ring[REPL_VIEW_RING];
	size_t ring_head, ring_n;
	/* the promotion of a new member whose current catch-up round includes installing a
	 * snapshot (repl_view.c promotion_watch) */
	uint64_t promo_id;
	unsigned promo_round;
	uint64_t promo_round_start;
	bool promo_snap;
	uint64_t reg_last_ms;
	int reg_inflight;
	/* the registration in flight (shard_repl_ensure_registered): its callback may come
	 * after the member is freed, so it holds this context, whose r the close sets NULL */
	struct repl_reg_async *reg_async;
	/* what hello last said, to wake held awaitable hellos on a change */
	bool topo_ready;
	uint64_t topo_leader, topo_term;
	/* metrics */
	sdb_gauge *g_term, *g_primary, *g_applied;
	sdb_counter *c_batches, *c_cmds, *c_not_primary, *c_ct_noops;
	sdb_gauge *g_ct_parked;
	sdb_histogram *h_commit, *h_apply, *h_stall;
	/* for /healthz and other threads */
	atomic_int h_state, h_members;
	atomic_bool h_ready, h_stopped;
	atomic_llong h_term, h_leader;
	void (*closed_cb)(void *arg);
	void *closed_arg;
};

typedef struct lin_read {
	struct lin_read *next, *prev;
	shard_repl *r;
	wire_req *req; /* NULL once answered by shard_repl_abandon */
	shard_cmd_fn fn;
} lin_read;

/* A read with readConcern afterClusterTime waiting for this member's oplog to reach T
 * (repl_causal.c). */
typedef struct ct_read {
	struct ct_read *next, *prev;
	wire_req *req;
	shard_cmd_fn fn;
	uint64_t after;       /* afterClusterTime (packed ts) */
	uint64_t deadline_ms; /* its maxTimeMS (sdb_mono_ms); 0: none */
} ct_read;

typedef struct reg_req {
	struct reg_req *next, *prev;
	shard_repl *r;
	wire_req *req; /* NULL once answered by shard_repl_abandon */
} reg_req;

/* Answer req NotWritablePrimary (10107) naming the primary when known. */
void shard_repl_reply_not_primary(shard_repl *r, wire_req *req);
/* Answer a write whose outcome is unknown: InterruptedAtShutdown (11600) when status is
 * SDB_ECANCELED, else InterruptedDueToReplStateChange (11602). */
void shard_repl_reply_unknown(wire_req *req, int status);
/* How long a new member may take to install a snapshot (copy shard.db from another
 * member: as long as the data needs) before the leader gives up on it: libraft's
 * catch-up round limit while the member being promoted installs one (repl_view.c).
 * 30 minutes: 2 GB copy in about a minute on loopback. */
#define REPL_SNAPSHOT_INSTALL_MS (30u * 60 * 1000)
/* libraft's default catch-up round limit (RAFT_MAX_CATCH_UP_ROUND_DURATION): a member being
 * promoted that does not answer for that long is given up. */
#define REPL_CATCH_UP_ROUND_MS 5000u

/* Every REPL_STALL_TICK_MS on the loop (repl.c stall_cb): on the primary, note which
 * members answered since the last tick (libraft's recent_recv, which it clears every
 * election timeout) and which hold the whole log, for shard_repl_view. */
void shard_repl_view_tick(shard_repl *r);
/* Make sure the replicated member map has this member's wire address: the primary
 * proposes its own, a follower asks the primary (stripedbRegisterMember). */
void shard_repl_ensure_registered(shard_repl *r);

/* repl_wc.c: the client's writeConcern.
 * repl_wc_parse: *w the numeric w (0 for "majority", 0 or 1), *wtimeout ms (0: none; a
 * command's maxTimeMS bounds the wait too, *maxtime ms). Answers req and returns false when
 * it cannot be honoured before anything runs: a tag set (UnknownReplWriteConcern 79) or a
 * malformed one (FailedToParse 9), as mongod (WriteConcernOptions::parse).
 * repl_wc_reply: finish command i of batch b (applied at index) by its writeConcern: at most
 * a majority answers now; above the set's size UnsatisfiableWriteConcern (100) with the
 * reply, as mongod; otherwise the reply waits in r->wc_waits. Takes reply.
 * repl_wc_abandon: answer every waiting reply with WriteConcernFailed (shutdown). */
bool repl_wc_parse(wire_req *req, int32_t *w, int64_t *wtimeout, int64_t *maxtime);
void repl_wc_reply(shard_repl *r, repl_batch *b, size_t i, bson_t *reply, uint64_t index);
void repl_wc_abandon(shard_repl *r);

/* repl_causal.c: afterClusterTime reads waiting for the oplog (mongod's waitForReadConcernImpl).
 * repl_ct_park: park req (fn: its command) until this member applied an entry with
 * ts >= after (packed), and ask the primary for a no-op write at or above it
 * (makeNoopWriteIfNeeded: one request in flight, for the highest T wanted; a failure waits
 * 200 ms, parks included). req is answered at once with 11600 when the member stops, with
 * 50 when its maxTimeMS passed already.
 * repl_ct_wake: after an apply, hand every read whose T is now applied to the pool
 * (shard_cmd_run_read).
 * repl_ct_tick: every 50 ms (repl.c stall_cb) and on killOp: wake, then answer the parked
 * reads killed (11601), whose client closed (279), past their maxTimeMS (50) or past the
 * stop's quiesce (11600), and
 * retry a failed no-op request after its back-off.
 * repl_ct_abandon: answer every parked read 11600 (shutdown) and forget the no-op in
 * flight (its callback then only frees). Loop thread, all. */
void repl_ct_park(shard_repl *r, wire_req *req, shard_cmd_fn fn, uint64_t after);
void repl_ct_wake(shard_repl *r);
void repl_ct_tick(shard_repl *r);
void repl_ct_abandon(shard_repl *r);

#endif
