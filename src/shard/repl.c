/* Shard replica sets (issue #15): every change to a shard's state is a Raft log entry
 * applied on every member by the same storage code. Contract in repl.h.
 *
 * Why one file of ~1,390 lines: the proposal queue, the one-entry-in-flight batching, the
 * apply callback and the answering of waiting requests share the private shard_repl state
 * on the loop thread; the parts that stand alone are apart (repl_wc.c, repl_hello.c,
 * repl_view.c, repl_parts.c, members.c, snapfile.c).
 *
 * The write path: a write command passes the checks of a worker (fail points, command
 * extensions), then shard_repl_submit queues it for the loop thread, which proposes every
 * queued command as one entry ({op: "shardBatch", ts, args: {term, seed, cmds: [{db, cmd}]}})
 * when it wakes: concurrent writes ride one append (one fsync on each member). Every
 * member applies the entry in one SQLite transaction (sdb_store_apply_begin), each command
 * in a savepoint, with the leader's time, term and random seed as the only
 * non-deterministic inputs (storage/store.h sdb_store_det); the leader answers each
 * client with its command's reply once the entry applied, so a write is acknowledged
 * only after a majority has it (w: "majority").
 *
 * Snapshots: the state machine is shard.db itself. A snapshot is a marker {applied,
 * setName} taken after an fsync of shard.db (sdb_store_sync), so libraft may drop the
 * log before it; after a restart the entries up to meta 'raft_applied' are skipped. A
 * member that needs a snapshot it does not hold (it fell behind the leader's compacted
 * log) copies shard.db from another member (vt_restore, shard/snapfile.h). */
#include "shard/repl.h"

#include <errno.h>
#include <raft.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <mongoc/mongoc.h>
#include <openssl/crypto.h>

#include "auth/cluster.h"
#include "auth/raftsec.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/clustertime.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "raft/node.h"
#include "shard/cmd_read_int.h"
#include "shard/snapfile.h"

/* Bounds of one Raft entry of writes. Every member applies an entry in one step of its
 * loop thread, during which it neither sends nor reads heartbeats: the byte bound keeps
 * that step short (a bigger command still goes alone in its entry). */
#define REPL_BATCH_MAX_CMDS 512
#define REPL_BATCH_MAX_BYTES (256u * 1024)
/* Group commit: entries of writes proposed and not yet applied. While that many are in
 * flight, new writes wait in the queue and ride the next entry together, proposed as
 * soon as one applies (a lone writer finds nothing in flight: no linger). It also bounds
 * what a member applies in one go (libraft applies every committed entry at once). */
#define REPL_MAX_INFLIGHT 1u
#define MEMBER_KEY "member_wire:"
/* a loop-thread step longer than this is logged (heartbeats wait for it) */
#define REPL_SLOW_NS (100u * 1000 * 1000)
#define REPL_STALL_TICK_MS 50
/* How long after a round of the loop's I/O a read transaction its reads kept open may
 * stay open for the next round's reads (read_check_cb), in ms (libuv's timer unit) */
#define REPL_READ_KEEP_MS 1

#include "shard/repl_int.h"

/* ------------------------------------------------------------------ replies */

/* commitTransaction / abortTransaction whose outcome is unknown or that did not run on
 * a non-primary: mongod's labels (error_labels.cpp), so drivers retry the commit
 * (RetryableWriteError) and know its result is unknown (UnknownTransactionCommitResult). */
static void txn_end_labels(wire_req *req, bson_t *extra)
{
	const char *name = wire_req_name(req);
	bool commit = strcmp(name, "commitTransaction") == 0;
	if (!commit && strcmp(name, "abortTransaction") != 0)
		return;
	bson_t labels;
	bson_append_array_begin(extra, "errorLabels", -1, &labels);
	BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
	if (commit)
		BSON_APPEND_UTF8(&labels, "1", "UnknownTransactionCommitResult");
	bson_append_array_end(extra, &labels);
}

void shard_repl_reply_not_primary(shard_repl *r, wire_req *req)
{
	uint64_t lid = 0;
	const char *la = NULL;
	const char *lw = NULL;
	bson_t *extra = bson_new();

	if (r->node) {
		sdb_node_leader(r->node, &lid, &la);
		lw = lid ? shard_repl_member_wire(r, lid) : NULL;
	}
	if (lw)
		BSON_APPEND_UTF8(extra, "primary", lw);
	txn_end_labels(req, extra);
	sdb_counter_inc(r->c_not_primary);
	wire_req_error_extra(req, WIRE_ERR_NOT_WRITABLE_PRIMARY, extra,
			     "not primary: this member (id %llu) of replica set %s is not the "
			     "primary%s%s",
			     (unsigned long long)r->id, r->set_name ? r->set_name : "(standalone)",
			     lw ? "; primary is " : "", lw ? lw : "");
}

void shard_repl_reply_unknown(wire_req *req, int status)
{
	bson_t *extra = bson_new();
	txn_end_labels(req, extra);
	if (status == SDB_ECANCELED) {
		wire_req_error_extra(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, extra,
				     "shutting down before the write committed; its outcome is "
				     "unknown");
		return;
	}
	wire_req_error_extra(req, WIRE_ERR_INTERRUPTED_REPL_CHANGE, extra,
			     "primary stepped down before the write committed; its outcome is "
			     "unknown (status %d)",
			     status);
}

/* ------------------------------------------------------------------ members */

const char *shard_repl_set_name(const shard_repl *r)
{
	return r->set_name;
}

const char *shard_repl_member_wire(shard_repl *r, uint64_t id)
{
	if (id == r->id)
		return r->me;
	for (size_t i = 0; i < r->n_members; i++)
		if (r->members[i].id == id)
			return r->members[i].wire;
	return NULL;
}

static void member_set(shard_repl *r, uint64_t id, const char *wire)
{
	for (size_t i = 0; i < r->n_members; i++) {
		if (r->members[i].id == id) {
			free(r->members[i].wire);
			r->members[i].wire = sdb_strdup(wire);
			return;
		}
	}
	r->members = sdb_realloc(r->members, (r->n_members + 1) * sizeof *r->members);
	r->members[r->n_members].id = id;
	r->members[r->n_members].wire = sdb_strdup(wire);
	r->n_members++;
}

static void member_load(void *arg, const char *key, const char *value)
{
	shard_repl *r = arg;
	char *end = NULL;
	unsigned long long id = strtoull(key + strlen(MEMBER_KEY), &end, 10);
	if (end && !*end && id)
		member_set(r, id, value);
}

/* ------------------------------------------------------------------ apply */

static bool entry_doc(const struct raft_buffer *buf, bson_t *out)
{
	uint32_t len;
	if (buf->len < 5)
		return false;
	memcpy(&len, buf->base, 4);
	len = BSON_UINT32_FROM_LE(len);
	if (len < 5 || len > buf->len)
		return false;
	return bson_init_static(out, buf->base, len);
}

static int fatal_fault(shard_repl *r, uint64_t index, const char *what, const char *err)
{
	int fault = sdb_store_take_io_fault();
	(void)r;
	/* The other members applied (or will apply) this entry: a member that could not must
	 * not go on with a different state. Stop; a restart replays the log from disk. */
	sdb_error("shard: cannot apply a replicated entry, stopping this member",
		  "index=%llu what=%s sqlite=%d err=\"%s\"", (unsigned long long)index, what, fault,
		  err ? err : "");
	abort();
	return RAFT_IOERR;
}

/* Run one command of an entry in its savepoint; its reply (heap) is appended to replies. */
static void apply_cmd(shard_repl *r, uint64_t index, const char *db, const bson_t *cmd,
		      bson_t *replies, uint32_t i)
{
	wire_req *req = wire_req_detached_new(db, cmd);
	const char *name = wire_req_name(req);
	shard_cmd_fn fn = shard_cmd_lookup(name);
	shard_ctx x;
	char key[16];

	shard_ctx_init(&x, r->sh, r->conn, req);
	if (!fn || !shard_cmd_is_write(name))
		wire_req_error(req, WIRE_ERR_INTERNAL, "not a replicated command: '%s'", name);
	else
		shard_ctx_run(&x, fn);
	sdb_store_rollback(r->conn); /* a command that failed half-way leaves nothing */
	if (sdb_store_take_io_fault())
		fatal_fault(r, index, name, x.err);
	bson_t *reply = wire_req_detached_take(req);
	snprintf(key, sizeof key, "%u", i);
	if (reply) {
		BSON_APPEND_DOCUMENT(replies, key, reply);
		bson_destroy(reply);
	} else {
		bson_t e = BSON_INITIALIZER;
		BSON_APPEND_DOUBLE(&e, "ok", 0.0);
		BSON_APPEND_UTF8(&e, "errmsg", "the command did not reply");
		BSON_APPEND_INT32(&e, "code", WIRE_ERR_INTERNAL);
		BSON_APPEND_DOCUMENT(replies, key, &e);
		bson_destroy(&e);
	}
	wire_req_detached_free(req);
}

static int vt_apply(struct raft_fsm *vt, const struct raft_buffer *buf, void **result)
{
	shard_repl *r = vt->data;
	uint64_t index = raft_last_applied(r->raft) + 1;
	bson_t env, args, *res;
	bson_iter_t it, sub;
	sdb_store_det det;
	char err[512];
	const char *op = NULL;

	uint64_t t0 = sdb_mono_ns();
	size_t n_cmds = 0;

	*result = NULL;
	if (r->last_result) {
		bson_destroy(r->last_result);
		r->last_result = NULL;
	}
	if (index <= r->last_applied) {
		/* already in shard.db (applied before a restart): skip */
		return 0;
	}
	memset(&det, 0, sizeof det);
	bson_init(&args);
	if (entry_doc(buf, &env)) {
		if (bson_iter_init_find(&it, &env, "op") && BSON_ITER_HOLDS_UTF8(&it))
			op = bson_iter_utf8(&it, NULL);
		if (bson_iter_init_find(&it, &env, "ts") && BSON_ITER_HOLDS_INT64(&it))
			det.now_ms = bson_iter_int64(&it);
		if (bson_iter_init_find(&it, &env, "args") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_iter_document(&it, &len, &data);
			bson_destroy(&args);
			if (!bson_init_static(&args, data, len))
				bson_init(&args);
		}
	}
	if (bson_iter_init_find(&it, &args, "term") && BSON_ITER_HOLDS_INT64(&it))
		det.term = bson_iter_int64(&it);
	/* issue #20: the leader's cluster time, the floor of this entry's oplog ts
	 * (clustertime.c); absent in entries written before it */
	if (bson_iter_init_find(&it, &args, "ctFloor") && BSON_ITER_HOLDS_INT64(&it))
		det.min_ts = (uint64_t)bson_iter_int64(&it);
	{
		/* a member started with another --replica-set joined this group's log (the same
		 * member list): it must not apply another set's writes */
		const char *theirs = bson_iter_init_find(&it, &args, "setName") &&
					     BSON_ITER_HOLDS_UTF8(&it)
				     ? bson_iter_utf8(&it, NULL)
				     : NULL;
		bool same = (!theirs && !r->set_name) ||
			    (theirs && r->set_name && strcmp(theirs, r->set_name) == 0);
		if (op && strcmp(op, "shardBatch") == 0 && !same) {
			sdb_error("shard: this member's Raft log belongs to another replica set; "
				  "check --replica-set and --bootstrap-members",
				  "mine=%s log=%s index=%llu", r->set_name ? r->set_name : "(none)",
				  theirs ? theirs : "(none)", (unsigned long long)index);
			fprintf(stderr, "stripedb: shard: this member (--replica-set=%s) is in the Raft "
					"group of replica set %s\n",
				r->set_name ? r->set_name : "(none)", theirs ? theirs : "(none)");
			_exit(2);
		}
	}
	if (bson_iter_init_find(&it, &args, "seed") && BSON_ITER_HOLDS_BINARY(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_subtype_t st;
		bson_iter_binary(&it, &st, &len, &data);
		memcpy(det.seed, data, len < sizeof det.seed ? len : sizeof det.seed);
	}
	int rc = sdb_store_apply_begin(r->conn, &det, err, sizeof err);
	if (rc)
		return fatal_fault(r, index, "begin", err);
	/* open transactions (txn.h) conflict with the writes applied after their start */
	bool txns = shard_txns_active(r->sh);
	bool txn_all = false;
	uint64_t ts_before = txns ? sdb_store_oplog_last(r->conn) : 0;
	res = bson_new();
	if (op && strcmp(op, "shardBatch") == 0 && bson_iter_init_find(&it, &args, "cmds") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &sub)) {
		bson_t replies;
		uint32_t i = 0;
		bson_append_array_begin(res, "replies", -1, &replies);
		while (bson_iter_next(&sub)) {
			bson_iter_t f;
			const char *db = NULL;
			bson_t cmd;
			uint32_t len;
			const uint8_t *data;
			bson_t item;
			if (!BSON_ITER_HOLDS_DOCUMENT(&sub))
				continue;
			bson_iter_document(&sub, &len, &data);
			if (!bson_init_static(&item, data, len))
				continue;
			if (bson_iter_init_find(&f, &item, "db") && BSON_ITER_HOLDS_UTF8(&f))
				db = bson_iter_utf8(&f, NULL);
			if (!db || !bson_iter_init_find(&f, &item, "cmd") ||
			    !BSON_ITER_HOLDS_DOCUMENT(&f))
				continue;
			bson_iter_document(&f, &len, &data);
			if (!bson_init_static(&cmd, data, len))
				continue;
			if (txns && !txn_all) {
				static const char *const ddl[] = {
					"create",	"drop",	       "createIndexes",
					"dropIndexes", "deleteIndexes", "dropDatabase",
					"stripedbSetVersion", "stripedbSetFiltering",
					"renameCollection", "collMod"};
				bson_iter_t c0;
				const char *cn = bson_iter_init(&c0, &cmd) && bson_iter_next(&c0)
							 ? bson_iter_key(&c0)
							 : "";
				for (size_t k = 0; k < sizeof ddl / sizeof ddl[0]; k++)
					txn_all = txn_all || strcmp(cn, ddl[k]) == 0;
			}
			apply_cmd(r, index, db, &cmd, &replies, i++);
		}
		n_cmds = i;
		bson_append_array_end(res, &replies);
	} else if (op && strcmp(op, "shardMember") == 0) {
		int64_t id = 0;
		const char *wire = NULL;
		char key[64];
		if (bson_iter_init_find(&it, &args, "id") && BSON_ITER_HOLDS_INT64(&it))
			id = bson_iter_int64(&it);
		if (bson_iter_init_find(&it, &args, "wire") && BSON_ITER_HOLDS_UTF8(&it))
			wire = bson_iter_utf8(&it, NULL);
		if (id > 0 && wire) {
			snprintf(key, sizeof key, MEMBER_KEY "%lld", (long long)id);
			if (sdb_store_meta_put(r->conn, key, wire, err, sizeof err) != 0)
				return fatal_fault(r, index, "member", err);
			member_set(r, (uint64_t)id, wire);
			/* hello's hosts changed: answer held awaitable hellos now, or a driver
			 * that saw a shorter list keeps it (and drops the missing members from
			 * its topology) until its next heartbeat, and loses the set if the
			 * primary dies meanwhile */
			if (r->set_name && r->sh->srv)
				wire_server_topology_changed(r->sh->srv);
		}
	}
	/* anything else (an entry of a newer version, a malformed one): a no-op everywhere */
	if (txns)
		shard_txns_note_apply(r->sh, r->conn, index, ts_before, txn_all);
	rc = sdb_store_apply_commit(r->conn, index, err, sizeof err);
	if (rc)
		return fatal_fault(r, index, "commit", err);
	if ((rc = sdb_store_checkpoint_fault(r->sh->store)) != 0) {
		/* the database file cannot be written: the WAL would grow without end */
		snprintf(err, sizeof err, "a WAL checkpoint failed with SQLite code %d", rc);
		return fatal_fault(r, index, "checkpoint", err);
	}
	r->last_applied = index;
	r->last_result = res;
	shard_oplog_notify(r->sh);
	repl_ct_wake(r); /* reads waiting for afterClusterTime */
	sdb_gauge_set(r->g_applied, (int64_t)index);
	{
		uint64_t dt = sdb_mono_ns() - t0;
		sdb_histogram_observe_ns(r->h_apply, dt);
		if (dt > REPL_SLOW_NS)
			sdb_warn("shard: slow apply on the loop thread", "index=%llu ms=%llu cmds=%zu "
				 "bytes=%zu", (unsigned long long)index,
				 (unsigned long long)(dt / 1000000), n_cmds, buf->len);
	}
	return 0;
}

static int vt_snapshot(struct raft_fsm *vt, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	shard_repl *r = vt->data;
	char err[256];
	bson_t m = BSON_INITIALIZER;
	uint64_t t0 = sdb_mono_ns();

	/* the log before last_applied may go once shard.db holds it durably */
	if (sdb_store_sync(r->conn, err, sizeof err) != 0) {
		sdb_error("shard: snapshot: cannot sync shard.db", "err=\"%s\"", err);
		return RAFT_IOERR;
	}
	BSON_APPEND_INT32(&m, "shardSnapshot", 1);
	BSON_APPEND_INT64(&m, "applied", (int64_t)r->last_applied);
	if (r->set_name)
		BSON_APPEND_UTF8(&m, "setName", r->set_name);
	/* where a member that installs this snapshot can copy shard.db from: the member that
	 * took it (the leader that sends it), whose address a fresh member cannot know yet */
	BSON_APPEND_UTF8(&m, "wire", r->me);
	*bufs = raft_malloc(sizeof **bufs);
	if (!*bufs) {
		bson_destroy(&m);
		return RAFT_NOMEM;
	}
	(*bufs)[0].len = (m.len + 7u) & ~(size_t)7u;
	(*bufs)[0].base = raft_calloc(1, (*bufs)[0].len);
	if (!(*bufs)[0].base) {
		raft_free(*bufs);
		bson_destroy(&m);
		return RAFT_NOMEM;
	}
	memcpy((*bufs)[0].base, bson_get_data(&m), m.len);
	*n_bufs = 1;
	bson_destroy(&m);
	sdb_info("shard: snapshot taken", "applied=%llu ms=%llu", (unsigned long long)r->last_applied,
		 (unsigned long long)((sdb_mono_ns() - t0) / 1000000));
	return 0;
}

static int vt_restore(struct raft_fsm *vt, struct raft_buffer *buf)
{
	shard_repl *r = vt->data;
	bson_t m;
	bson_iter_t it;
	int64_t applied = -1;
	char *sender = NULL;

	if (entry_doc(buf, &m) && bson_iter_init_find(&it, &m, "applied") &&
	    BSON_ITER_HOLDS_INT64(&it))
		applied = bson_iter_int64(&it);
	if (applied >= 0 && bson_iter_init_find(&it, &m, "wire") && BSON_ITER_HOLDS_UTF8(&it))
		sender = sdb_strdup(bson_iter_utf8(&it, NULL));
	if (applied < 0) {
		sdb_error("shard: restore: not a shard snapshot", "len=%zu", buf->len);
		return RAFT_CORRUPT;
	}
	if ((uint64_t)applied > r->last_applied) {
		/* The set compacted its log past what this member holds: copy shard.db from
		 * the leader (it sent this snapshot, so it holds at least that index), else
		 * from any other member that does. */
		char err[512] = "no other member's address known";
		uint64_t lid = 0, got = 0;
		const char *la = NULL;
		int rc = SDB_EIO;
		if (r->node)
			sdb_node_leader(r->node, &lid, &la);
		const char *lw = lid && lid != r->id ? shard_repl_member_wire(r, lid) : NULL;
		sdb_info("shard: installing a snapshot from another member", "need_applied=%lld "
			 "local_applied=%llu leader=%s", (long long)applied,
			 (unsigned long long)r->last_applied, lw ? lw : "?");
		if (sender && strcmp(sender, r->me) != 0)
			rc = shard_snapshot_fetch(r->sh, r->conn, sender, (uint64_t)applied, &got,
						  err, sizeof err);
		if (rc != 0 && lw && (!sender || strcmp(lw, sender) != 0))
			rc = shard_snapshot_fetch(r->sh, r->conn, lw, (uint64_t)applied, &got, err,
						  sizeof err);
		for (size_t i = 0; rc != 0 && i < r->n_members; i++) {
			if (r->members[i].id == r->id || r->members[i].id == lid)
				continue;
			rc = shard_snapshot_fetch(r->sh, r->conn, r->members[i].wire,
						  (uint64_t)applied, &got, err, sizeof err);
		}
		free(sender);
		sender = NULL;
		if (rc != 0) {
			/* Serving on with data from before the snapshot would answer reads with
			 * missing documents: stop; a supervisor restart tries again. */
			sdb_error("shard: cannot install a snapshot from another member, stopping",
				  "need_applied=%lld err=\"%s\"", (long long)applied, err);
			abort();
		}
		r->last_applied = got;
		/* the member map came with the copy */
		for (size_t i = 0; i < r->n_members; i++)
			free(r->members[i].wire);
		r->n_members = 0;
		sdb_store_meta_scan(r->conn, MEMBER_KEY, member_load, r);
		shard_oplog_notify(r->sh);
		repl_ct_wake(r);
	}
	free(sender);
	raft_free(buf->base);
	return 0;
}

/* ------------------------------------------------------------------ node glue */

static bson_t *sm_take_result(void *impl)
{
	shard_repl *r = impl;
	bson_t *res = r->last_result;
	r->last_result = NULL;
	return res;
}

static uint64_t sm_last_applied(void *impl)
{
	return ((shard_repl *)impl)->last_applied;
}

static void sm_bind(void *impl, struct raft *raft)
{
	((shard_repl *)impl)->raft = raft;
}

/* ------------------------------------------------------------------ proposals */

static void batch_unlink(shard_repl *r, repl_batch *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		r->inflight = b->next;
	if (b->next)
		b->next->prev = b->prev;
	r->n_inflight--;
	/* writes held by the in-flight bound go now (next loop turn: not from inside
	 * libraft's apply; async_cb finds the queue empty when nothing waits) */
	if (r->async_init && !r->closed)
		uv_async_send(&r->async);
}

static void requeue(shard_repl *r, repl_item *items);

/* Whether cmd (a write to propose) is a multi-document delete that is applied in parts
 * (SHARD_DELETE_PART_FIELD, shard/repl.h): "delete" with exactly one statement whose limit
 * is 0, without keyRange (a migration's cleanup has its own bound), outside txnNumber
 * (a retryable write's record is per statement, not per part) and not a migration's. */
static bool delete_in_parts(const char *name, const bson_t *cmd)
{
	bson_iter_t it, arr, st;
	uint32_t n = 0;
	bool limit0 = false;

	if (strcmp(name, "delete") != 0 || bson_iter_init_find(&it, cmd, "txnNumber") ||
	    bson_iter_init_find(&it, cmd, "autocommit") ||
	    bson_iter_init_find(&it, cmd, "$stripedbOrigin") ||
	    bson_iter_init_find(&it, cmd, "$stripedbSessions") ||
	    !bson_iter_init_find(&it, cmd, "deletes") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return false;
	while (bson_iter_next(&arr)) {
		if (++n > 1 || !BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &st))
			return false;
		while (bson_iter_next(&st)) {
			const char *k = bson_iter_key(&st);
			if (strcmp(k, "limit") == 0)
				limit0 = BSON_ITER_HOLDS_NUMBER(&st) && bson_iter_as_int64(&st) == 0;
			else if (strcmp(k, "keyRange") == 0 || strcmp(k, "keyRangeLimit") == 0 ||
				 strcmp(k, "$stripedbSession") == 0)
				return false;
		}
	}
	return n == 1 && limit0;
}

/* The reply of one part of a delete applied in parts: NULL (reply taken) when the part
 * deleted SHARD_DELETE_PART documents without error, the command then queued again at
 * the head with its count so far; otherwise the reply to send, whose n is the whole
 * delete's (every part's). */
static bson_t *delete_part_done(shard_repl *r, repl_batch *b, size_t i, bson_t *reply)
{
	bson_iter_t it;
	double ok = 0;
	int64_t n = 0;
	bool errs = bson_iter_init_find(&it, reply, "writeErrors") ||
		    bson_iter_init_find(&it, reply, "writeConcernError");

	if (bson_iter_init_find(&it, reply, "ok") && BSON_ITER_HOLDS_NUMBER(&it))
		ok = bson_iter_as_double(&it);
	if (bson_iter_init_find(&it, reply, "n") && BSON_ITER_HOLDS_NUMBER(&it))
		n = bson_iter_as_int64(&it);
	if (ok == 1.0 && !errs && n >= SHARD_DELETE_PART && !r->closed) {
		repl_item *again = sdb_calloc(1, sizeof *again);
		again->req = b->reqs[i];
		again->w = b->w[i];
		again->wtimeout = b->wtimeout[i];
		again->by_maxtime = b->by_maxtime[i];
		again->part_n = b->part_n[i] + n;
		requeue(r, again); /* batch_unlink woke async_cb: proposed next */
		bson_destroy(reply);
		return NULL;
	}
	if (b->part_n[i] == 0 || ok != 1.0)
		return reply;
	bson_t *out = bson_new();
	int64_t total = b->part_n[i] + n;
	if (bson_iter_init(&it, reply)) {
		while (bson_iter_next(&it)) {
			if (strcmp(bson_iter_key(&it), "n") == 0) {
				if (total <= INT32_MAX)
					BSON_APPEND_INT32(out, "n", (int32_t)total);
				else
					BSON_APPEND_INT64(out, "n", total);
			} else {
				bson_append_iter(out, NULL, 0, &it);
			}
		}
	}
	bson_destroy(reply);
	return out;
}

/* Free batch b: its per-command arrays and the delete parts it still holds (the requests
 * are answered or requeued by then). */
static void batch_free(repl_batch *b)
{
	free(b->reqs);
	free(b->w);
	free(b->wtimeout);
	free(b->by_maxtime);
	free(b->part_n);
	for (size_t k = 0; k < b->n; k++)
		repl_part_free(b->part[k]);
	free(b->part);
	free(b);
}

static void batch_done(void *arg, int status, bson_t *result)
{
	repl_batch *b = arg;
	shard_repl *r = b->r;
	bson_iter_t it, sub;
	size_t i = 0;

	batch_unlink(r, b);
	if (status == 0 && result && bson_iter_init_find(&it, result, "replies") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &sub)) {
		while (bson_iter_next(&sub) && i < b->n) {
			uint32_t len;
			const uint8_t *data;
			wire_req *req = b->reqs[i++];
			if (!req)
				continue;
			bson_iter_document(&sub, &len, &data);
			bson_t *reply = bson_new_from_data(data, len);
			if (b->part_n[i - 1] >= 0 &&
			    (reply = delete_part_done(r, b, i - 1, reply)) == NULL)
				continue;
			if (b->part[i - 1]) {
				bool more = false;
				reply = repl_part_done(b->part[i - 1], reply, &more);
				if (more && !r->closed) {
					repl_item *again = sdb_calloc(1, sizeof *again);
					again->req = req;
					again->w = b->w[i - 1];
					again->wtimeout = b->wtimeout[i - 1];
					again->by_maxtime = b->by_maxtime[i - 1];
					again->part_n = -1;
					again->part = b->part[i - 1];
					b->part[i - 1] = NULL;
					requeue(r, again); /* proposed next (batch_unlink woke async_cb) */
					continue;
				}
				if (more) {
					shard_repl_reply_unknown(req, SDB_EIO);
					continue;
				}
			}
			repl_wc_reply(r, b, i - 1, reply, r->last_applied);
		}
		sdb_histogram_observe_ns(r->h_commit, sdb_mono_ns() - b->start_ns);
	}
	for (; i < b->n; i++)
		if (b->reqs[i])
			shard_repl_reply_unknown(b->reqs[i], status ? status : SDB_EIO);
	if (result)
		bson_destroy(result);
	batch_free(b);
}

/* Put items (a list) back at the head of the queue. */
static void requeue(shard_repl *r, repl_item *items)
{
	repl_item *last = items;
	if (!items)
		return;
	while (last->next)
		last = last->next;
	pthread_mutex_lock(&r->mu);
	last->next = r->head;
	r->head = items;
	if (!r->tail)
		r->tail = last;
	pthread_mutex_unlock(&r->mu);
}

/* Move the transactions' commits to the head of items (keeping their order): they are
 * validated against what applied so far, so nothing of the entry may apply before them. */
static repl_item *txns_first(repl_item *items)
{
	repl_item *txh = NULL, **txt = &txh, *rest = NULL, **rt = &rest;
	while (items) {
		repl_item *it = items;
		items = it->next;
		it->next = NULL;
		if (it->txn) {
			*txt = it;
			txt = &it->next;
		} else {
			*rt = it;
			rt = &it->next;
		}
	}
	*txt = rest;
	return txh;
}

/* About the bytes an item adds to an entry (a part: its share of the command). */
static size_t item_bytes(const repl_item *it)
{
	size_t len = wire_req_cmd(it->req)->len;
	if (it->part && it->part->total)
		len = len / it->part->total * repl_part_len(it->part);
	return len;
}

static void propose_items(shard_repl *r, repl_item *items)
{
	items = txns_first(items);
	while (items) {
		if (r->n_inflight >= REPL_MAX_INFLIGHT) {
			requeue(r, items); /* proposed when an in-flight entry applies */
			return;
		}
		bson_t args = BSON_INITIALIZER, cmds;
		repl_batch *b = sdb_calloc(1, sizeof *b);
		size_t bytes = 0, cap = 16;
		uint8_t seed[5];
		char key[16];

		b->r = r;
		b->reqs = sdb_calloc(cap, sizeof *b->reqs);
		b->w = sdb_calloc(cap, sizeof *b->w);
		b->wtimeout = sdb_calloc(cap, sizeof *b->wtimeout);
		b->by_maxtime = sdb_calloc(cap, sizeof *b->by_maxtime);
		b->part_n = sdb_calloc(cap, sizeof *b->part_n);
		b->part = sdb_calloc(cap, sizeof *b->part);
		b->start_ns = sdb_mono_ns();
		if (getrandom(seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
			bson_oid_t o; /* libbson's per-process random bytes and counter */
			bson_oid_init(&o, NULL);
			memcpy(seed, o.bytes + 4, sizeof seed);
		}
		BSON_APPEND_INT64(&args, "term", (int64_t)sdb_node_term(r->node));
		/* issue #20: the cluster time gossiped so far (every queued command's
		 * $clusterTime is in it): the entry's writes get a ts above it */
		BSON_APPEND_INT64(&args, "ctFloor",
				  (int64_t)ct_floor_clamp(atomic_load(&r->sh->cluster_time),
							  sdb_wall_ms()));
		if (r->set_name)
			BSON_APPEND_UTF8(&args, "setName", r->set_name);
		bson_append_binary(&args, "seed", -1, BSON_SUBTYPE_BINARY, seed, sizeof seed);
		bson_append_array_begin(&args, "cmds", -1, &cmds);
		shard_txn_rec *done_txns[REPL_BATCH_MAX_CMDS];
		size_t n_txns = 0;
		while (items && b->n < REPL_BATCH_MAX_CMDS &&
		       (b->n == 0 || bytes + item_bytes(items) <= REPL_BATCH_MAX_BYTES)) {
			repl_item *it = items;
			bson_t c;
			bson_t *tcmd = NULL;
			items = it->next;
			if (it->txn) {
				/* validated now: every entry proposed before has applied */
				tcmd = shard_txn_commit_build(r->sh, it->txn, it->req, done_txns,
							      n_txns);
				if (!tcmd) {
					free(it); /* answered, it->txn freed */
					continue;
				}
				done_txns[n_txns++] = it->txn;
			}
			snprintf(key, sizeof key, "%zu", b->n);
			bson_append_document_begin(&cmds, key, -1, &c);
			BSON_APPEND_UTF8(&c, "db", tcmd ? "admin" : wire_req_db(it->req));
			if (tcmd) {
				BSON_APPEND_DOCUMENT(&c, "cmd", tcmd);
			} else if (it->part_n >= 0) {
				bson_t part;
				bson_copy_to(wire_req_cmd(it->req), &part);
				BSON_APPEND_INT64(&part, SHARD_DELETE_PART_FIELD, SHARD_DELETE_PART);
				BSON_APPEND_DOCUMENT(&c, "cmd", &part);
				bson_destroy(&part);
			} else if (it->part) {
				bson_t part;
				repl_part_cmd(it->part, wire_req_cmd(it->req), &part);
				BSON_APPEND_DOCUMENT(&c, "cmd", &part);
				bson_destroy(&part);
			} else {
				BSON_APPEND_DOCUMENT(&c, "cmd", wire_req_cmd(it->req));
			}
			bson_append_document_end(&cmds, &c);
			bytes += tcmd ? tcmd->len : item_bytes(it);
			if (tcmd)
				bson_destroy(tcmd);
			if (b->n == cap) {
				cap *= 2;
				b->reqs = sdb_realloc(b->reqs, cap * sizeof *b->reqs);
				b->w = sdb_realloc(b->w, cap * sizeof *b->w);
				b->wtimeout = sdb_realloc(b->wtimeout, cap * sizeof *b->wtimeout);
				b->by_maxtime =
					sdb_realloc(b->by_maxtime, cap * sizeof *b->by_maxtime);
				b->part_n = sdb_realloc(b->part_n, cap * sizeof *b->part_n);
				b->part = sdb_realloc(b->part, cap * sizeof *b->part);
			}
			b->w[b->n] = it->w;
			b->wtimeout[b->n] = it->wtimeout;
			b->by_maxtime[b->n] = it->by_maxtime;
			b->part_n[b->n] = it->part_n;
			b->part[b->n] = it->part;
			b->reqs[b->n++] = it->req;
			free(it);
		}
		bson_append_array_end(&args, &cmds);
		for (size_t k = 0; k < n_txns; k++)
			shard_txn_rec_free(done_txns[k]);
		if (b->n == 0) {
			/* every command was a refused commit */
			bson_destroy(&args);
			batch_free(b);
			continue;
		}
		int rc = sdb_node_propose(r->node, "shardBatch", &args, batch_done, b);
		bson_destroy(&args);
		if (rc != 0) {
			for (size_t i = 0; i < b->n; i++) {
				if (rc == SDB_ENOTLEADER)
					shard_repl_reply_not_primary(r, b->reqs[i]);
				else
					shard_repl_reply_unknown(b->reqs[i], rc);
			}
			batch_free(b);
			continue;
		}
		sdb_counter_inc(r->c_batches);
		sdb_counter_add(r->c_cmds, (int64_t)b->n);
		r->n_inflight++;
		b->next = r->inflight;
		if (r->inflight)
			r->inflight->prev = b;
		r->inflight = b;
	}
}

static void async_cb(uv_async_t *h)
{
	shard_repl *r = h->data;
	repl_item *items;

	pthread_mutex_lock(&r->mu);
	items = r->head;
	r->head = r->tail = NULL;
	pthread_mutex_unlock(&r->mu);
	if (!items)
		return;
	if (!r->closed && r->node && raft_state(r->raft) == RAFT_LEADER &&
	    !sdb_node_ready(r->node)) {
		/* elected, its term's barrier not applied yet: hold the writes until it is
		 * (on_change wakes us) rather than refuse them */
		requeue(r, items);
		return;
	}
	if (r->closed || !r->node || !sdb_node_ready(r->node)) {
		while (items) {
			repl_item *it = items;
			items = it->next;
			if (r->closed)
				wire_req_error(it->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
					       "the shard is shutting down");
			else
				shard_repl_reply_not_primary(r, it->req);
			shard_txn_rec_free(it->txn);
			repl_part_free(it->part);
			free(it);
		}
		return;
	}
	propose_items(r, items);
}

/* Queue item it (its writeConcern parsed; maxtime: the command's maxTimeMS, 0 none, which
 * bounds the wait for w as wtimeout does) for the loop thread and wake it. Any thread. */
static void enqueue(shard_repl *r, repl_item *it, int64_t maxtime)
{
	if (maxtime > 0 && (it->wtimeout == 0 || maxtime < it->wtimeout)) {
		it->wtimeout = maxtime;
		it->by_maxtime = true;
	}
	pthread_mutex_lock(&r->mu);
	if (r->tail)
		r->tail->next = it;
	else
		r->head = it;
	r->tail = it;
	uv_async_send(&r->async);
	pthread_mutex_unlock(&r->mu);
}

void shard_repl_submit(shard_repl *r, wire_req *req)
{
	bson_iter_t pi;
	if (bson_iter_init_find(&pi, wire_req_cmd(req), SHARD_DELETE_PART_FIELD)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "%s is internal to a shard replica set",
			       SHARD_DELETE_PART_FIELD);
		return;
	}
	repl_item *it = sdb_calloc(1, sizeof *it);
	it->req = req;
	it->part_n = delete_in_parts(wire_req_name(req), wire_req_cmd(req)) ? 0 : -1;
	int64_t maxtime = 0;
	if (!repl_wc_parse(req, &it->w, &it->wtimeout, &maxtime)) {
		free(it);
		return;
	}
	if (it->part_n < 0)
		it->part = repl_insert_parts(wire_req_name(req), wire_req_cmd(req));
	enqueue(r, it, maxtime);
}

void shard_repl_submit_txn(shard_repl *r, wire_req *req, shard_txn_rec *t)
{
	repl_item *it = sdb_calloc(1, sizeof *it);
	it->req = req;
	it->part_n = -1; /* a transaction's commit is never applied in parts */
	int64_t maxtime = 0;
	if (!repl_wc_parse(req, &it->w, &it->wtimeout, &maxtime)) {
		shard_txn_rec_free(t);
		free(it);
		return;
	}
	it->txn = t;
	enqueue(r, it, maxtime);
}

bool shard_repl_writable(shard_repl *r)
{
	return r->node && !r->closed && sdb_node_ready(r->node);
}

sdb_store_conn *shard_repl_read_conn(shard_repl *r)
{
	if (r->closed || !r->conn || !sdb_store_conn_idle(r->conn))
		return NULL;
	return r->conn;
}

bool shard_repl_check_write(shard_repl *r, wire_req *req)
{
	if (shard_repl_writable(r) ||
	    (r->node && !r->closed && raft_state(r->raft) == RAFT_LEADER))
		return true; /* a new leader holds writes until its barrier applied */
	shard_repl_reply_not_primary(r, req);
	return false;
}

/* ------------------------------------------------------------------ state changes */

static void on_change(void *data)
{
	shard_repl *r = data;
	uint64_t lid = 0;
	const char *la = NULL;
	bool ready;

	if (r->closed)
		return;
	sdb_node_leader(r->node, &lid, &la);
	ready = sdb_node_ready(r->node);
	atomic_store(&r->h_state, raft_state(r->raft));
	atomic_store(&r->h_ready, ready);
	atomic_store(&r->h_members, (int)r->raft->configuration.n);
	atomic_store(&r->h_term, (long long)sdb_node_term(r->node));
	atomic_store(&r->h_leader, (long long)lid);
	sdb_gauge_set(r->g_term, (int64_t)sdb_node_term(r->node));
	sdb_gauge_set(r->g_primary, ready ? 1 : 0);
	shard_repl_ensure_registered(r);
	if (!ready)
		shard_txns_abort_all(r->sh, "the primary stepped down");
	if (ready || raft_state(r->raft) != RAFT_LEADER)
		uv_async_send(&r->async); /* writes held while the barrier applied */
	if (ready && !r->topo_ready)
		shard_aggw_drop_temps(r->sh); /* leftovers of an interrupted $out */
	if (ready != r->topo_ready || lid != r->topo_leader ||
	    sdb_node_term(r->node) != r->topo_term) {
		r->topo_ready = ready;
		r->topo_leader = lid;
		r->topo_term = sdb_node_term(r->node);
		/* a standalone-looking member's hello does not change: no topology version */
		if (r->sh->srv && r->set_name)
			wire_server_topology_changed(r->sh->srv);
	}
}

/* Ends the read transaction the loop's reads kept open on the apply connection
 * (sdb_store_keep_reads), REPL_READ_KEEP_MS after read_check_cb saw it. */
static void read_release_cb(uv_timer_t *t)
{
	shard_repl *r = t->data;
	if (!r->closed)
		sdb_store_release_read(r->conn);
}

/* After each round of the loop's I/O callbacks: a read transaction the loop's reads kept
 * open on the apply connection is ended REPL_READ_KEEP_MS later (read_release_cb, armed
 * once per kept transaction), so that none stays open for long while the loop waits: an
 * open snapshot keeps WAL checkpoints from passing it and the WAL from restarting. Until
 * then the next round's reads take it over while nothing commits: a single client's
 * next point read comes ~0.1 ms after its reply, and released at every round each read
 * paid the BEGIN, the catalog read and SQLite's lock calls (~10% of the shard's CPU per
 * read with one client, perf). */
static void read_check_cb(uv_check_t *h)
{
	shard_repl *r = h->data;
	if (!r->closed && sdb_store_read_kept(r->conn) &&
	    !uv_is_active((uv_handle_t *)&r->read_release))
		uv_timer_start(&r->read_release, read_release_cb, REPL_READ_KEEP_MS, 0);
}

/* Fires every REPL_STALL_TICK_MS: a late fire is time the loop thread spent elsewhere
 * (apply, snapshot, a big message), during which libraft sent no heartbeat and read
 * none. Observed in stripedb_shard_loop_stall_seconds; long ones are logged. */
static void stall_cb(uv_timer_t *t)
{
	shard_repl *r = t->data;
	uint64_t now = sdb_mono_ns();
	if (r->stall_last_ns) {
		uint64_t gap = now - r->stall_last_ns;
		uint64_t tick = (uint64_t)REPL_STALL_TICK_MS * 1000000;
		uint64_t late = gap > tick ? gap - tick : 0;
		sdb_histogram_observe_ns(r->h_stall, late);
		if (late > REPL_SLOW_NS * 2)
			sdb_warn("shard: loop thread stalled", "ms=%llu",
				 (unsigned long long)(late / 1000000));
	}
	r->stall_last_ns = now;
	shard_repl_view_tick(r);
	repl_ct_tick(r); /* afterClusterTime reads: deadlines, killOp, the no-op's retry */
}

static void reg_timer_cb(uv_timer_t *t)
{
	shard_repl *r = t->data;
	if (r->node && !r->closed) {
		shard_repl_ensure_registered(r);
		atomic_store(&r->h_members, (int)r->raft->configuration.n);
	}
}

/* ------------------------------------------------------------------ start/stop */

static void check_name(void *arg, const char *key, const char *value)
{
	(void)key;
	*(char **)arg = sdb_strdup(value);
}

static const sdb_metric_def repl_metrics[] = {
	SDB_METRIC_GAUGE(shard_repl, g_term, "stripedb_shard_raft_term",
			 "Current Raft term of this shard member."),
	SDB_METRIC_GAUGE(shard_repl, g_primary, "stripedb_shard_is_primary",
			 "1 when this shard member is the ready primary."),
	SDB_METRIC_GAUGE(shard_repl, g_applied, "stripedb_shard_raft_applied",
			 "Index of the last Raft entry applied to shard.db."),
	SDB_METRIC_COUNTER(shard_repl, c_batches, "stripedb_shard_repl_batches_total",
			   "Raft entries of writes proposed by this member."),
	SDB_METRIC_COUNTER(shard_repl, c_cmds, "stripedb_shard_repl_commands_total",
			   "Write commands proposed by this member."),
	SDB_METRIC_COUNTER(shard_repl, c_not_primary, "stripedb_shard_not_primary_total",
			   "Commands refused because this member is not primary."),
	SDB_METRIC_GAUGE(shard_repl, g_ct_parked, "stripedb_shard_causal_reads_waiting",
			 "Reads with readConcern afterClusterTime waiting on this secondary for "
			 "its oplog to reach their cluster time (without holding a worker)."),
	SDB_METRIC_COUNTER(shard_repl, c_ct_noops, "stripedb_shard_causal_noop_requests_total",
			   "appendOplogNote no-op writes this secondary asked the primary for "
			   "(makeNoopWriteIfNeeded of a waiting afterClusterTime read)."),
	SDB_METRIC_HISTOGRAM(shard_repl, h_commit, "stripedb_shard_commit_seconds",
			     "From proposing a batch of writes to its apply here."),
	SDB_METRIC_HISTOGRAM(shard_repl, h_apply, "stripedb_shard_apply_seconds",
			     "Time to apply one Raft entry to shard.db (loop thread)."),
	SDB_METRIC_HISTOGRAM(shard_repl, h_stall, "stripedb_shard_loop_stall_seconds",
			     "How late a 50 ms loop-thread timer fired (time the loop "
			     "was busy: no Raft heartbeat sent or read meanwhile)."),
};

int shard_repl_start(shard *sh, const char *wire_addr, char *err, size_t errlen)
{
	const sdb_config *cfg = sh->role->cfg;
	const char *dir = sdb_config_get(cfg, SDB_OPT_data_dir);
	const char *set = sdb_config_get(cfg, SDB_OPT_replica_set);
	const char *node_id = sdb_config_get(cfg, SDB_OPT_node_id);
	const char *raft_listen = sdb_config_get(cfg, SDB_OPT_raft_listen);
	const char *bootstrap = sdb_config_get(cfg, SDB_OPT_bootstrap_members);
	shard_repl *r = sdb_calloc(1, sizeof *r);
	sdb_transport_opts to;
	memset(&to, 0, sizeof to);
	uint8_t key[32];
	bool secure = false;
	sdb_node_opts no;
	sdb_node_sm sm;
	char *stored_set = NULL;
	char *raft_dir = NULL;
	int rc;

	r->sh = sh;
	sh->repl = r;
	pthread_mutex_init(&r->mu, NULL);
	mongoc_init(); /* followers register with the primary through libmongoc */
	r->id = 1;
	if (set && !node_id)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"a shard replica set member needs --node-id=N (its Raft id, the "
				"N of N@HOST:PORT in --bootstrap-members)");
	if (node_id) {
		char *end = NULL;
		unsigned long long v = node_id[0] >= '0' && node_id[0] <= '9'
					       ? strtoull(node_id, &end, 10)
					       : 0;
		if (end && !*end && v > 0 && v < (1ULL << 53))
			r->id = v;
		else if (set) /* a member's Raft id; a standalone shard's --node-id is a label */
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"--node-id of a replica set member must be a positive "
					"integer, got %s",
					node_id);
	}
	if (bootstrap && !set)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--bootstrap-members needs --replica-set=NAME on a shard");
	if (set && (!*set || strlen(set) > 128 || strpbrk(set, "/ ,$\"")))
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--replica-set must be a non-empty name without '/', ',', ' ', '$' "
				"or '\"' (128 bytes at most)");
	if (set && !raft_listen)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"a shard replica set member needs --raft-listen=HOST:PORT");
	if (bootstrap) {
		/* this member's own entry must be its --raft-listen, and a set has 1, 3 or 5
		 * voters (an even count tolerates no more failures than one fewer) */
		struct raft_configuration conf;
		int prc;
		raft_configuration_init(&conf);
		prc = sdb_node_parse_members(bootstrap, &conf, err, errlen);
		if (prc == 0 && conf.n != 1 && conf.n != 3 && conf.n != 5)
			prc = sdb_errf(err, errlen, SDB_EUSAGE,
				       "--bootstrap-members lists %u members: a replica set has 1, 3 "
				       "or 5",
				       conf.n);
		for (unsigned i = 0; prc == 0 && i < conf.n; i++) {
			/* the others reach this member at its entry's address, which may be
			 * a forwarder in front of --raft-listen: say so, do not refuse */
			if (conf.servers[i].id == r->id &&
			    strcmp(conf.servers[i].address, raft_listen) != 0)
				sdb_warn("shard: --bootstrap-members gives this member another Raft "
					 "address than --raft-listen; the others will connect there",
					 "id=%llu entry=%s raft_listen=%s", (unsigned long long)r->id,
					 conf.servers[i].address, raft_listen);
			if (conf.servers[i].id != r->id &&
			    strcmp(conf.servers[i].address, raft_listen) == 0)
				prc = sdb_errf(err, errlen, SDB_EUSAGE,
					       "--raft-listen=%s is member %llu's address in "
					       "--bootstrap-members, not this member's (--node-id=%llu)",
					       raft_listen, (unsigned long long)conf.servers[i].id,
					       (unsigned long long)r->id);
		}
		raft_configuration_close(&conf);
		if (prc)
			return prc == SDB_EINVAL ? SDB_EUSAGE : prc;
	}
	r->set_name = set ? sdb_strdup(set) : NULL;
	r->me = sdb_strdup(wire_addr);
	/* a one-member set without --raft-listen listens on an ephemeral loopback port */
	r->raft_addr = sdb_strdup(raft_listen ? raft_listen : "127.0.0.1:0");
	SDB_METRICS_REGISTER(r, repl_metrics, NULL);

	rc = sdb_store_conn_open(sh->store, &r->conn, err, errlen);
	if (rc)
		return rc;
	/* The Raft log is the durable record: shard.db's own commits need not fsync. */
	rc = sdb_store_set_durability(r->conn, false, err, errlen);
	if (rc)
		return rc;
	r->last_applied = sdb_store_applied_index(r->conn);
	sdb_store_meta_scan(r->conn, "replset_name", check_name, &stored_set);
	if (stored_set && (!set || strcmp(stored_set, set) != 0)) {
		rc = sdb_errf(err, errlen, SDB_EUSAGE,
			      "data directory %s belongs to replica set '%s', not %s%s%s", dir,
			      stored_set, set ? "'" : "a standalone shard", set ? set : "",
			      set ? "'" : "");
		free(stored_set);
		return rc;
	}
	free(stored_set);
	raft_dir = sdb_asprintf("%s/raft", dir);
	{
		/* shard.db that applied entries but a raft log that is gone: starting would
		 * replay a new log over it and skip its first entries. Refuse. */
		bool pristine = true;
		char *probe = sdb_asprintf("%s/metadata1", raft_dir);
		FILE *f = fopen(probe, "r");
		if (f) {
			pristine = false;
			fclose(f);
		}
		free(probe);
		if (pristine && r->last_applied > 0) {
			free(raft_dir);
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"data directory %s has shard.db at Raft index %llu but no "
					"Raft log (%s/raft): restore both together",
					dir, (unsigned long long)r->last_applied, dir);
		}
	}
	free(raft_dir);
	if (set) {
		/* remember the set's name (every member writes the same; not replicated) */
		char e2[128];
		sdb_store_det det = {0};
		if (sdb_store_apply_begin(r->conn, &det, e2, sizeof e2) == 0) {
			sdb_store_meta_put(r->conn, "replset_name", set, e2, sizeof e2);
			sdb_store_apply_commit(r->conn, r->last_applied, e2, sizeof e2);
		}
	}
	sdb_store_meta_scan(r->conn, MEMBER_KEY, member_load, r);

	r->fsm.version = 1;
	r->fsm.data = r;
	r->fsm.apply = vt_apply;
	r->fsm.snapshot = vt_snapshot;
	r->fsm.restore = vt_restore;
	sm = (sdb_node_sm){.fsm = &r->fsm,
			   .impl = r,
			   .bind = sm_bind,
			   .take_result = sm_take_result,
			   .last_applied = sm_last_applied,
			   .close = NULL};
	/* a one-member set on an ephemeral loopback port talks to nobody: no transport
	 * security to set up (and nothing to warn about) */
	memset(key, 0, sizeof key);
	if (raft_listen) {
		rc = auth_raft_setup(cfg, &to, key, &secure, err, errlen);
		if (rc)
			return rc;
	}
	uv_async_init(sh->role->loop, &r->async, async_cb);
	r->async.data = r;
	r->async_init = true;
	uv_timer_init(sh->role->loop, &r->reg_timer);
	r->reg_timer.data = r;
	uv_timer_init(sh->role->loop, &r->wc_timer);
	r->wc_timer.data = r;
	uv_timer_start(&r->reg_timer, reg_timer_cb, 300, 300);
	uv_timer_init(sh->role->loop, &r->stall_timer);
	r->stall_timer.data = r;
	uv_timer_start(&r->stall_timer, stall_cb, REPL_STALL_TICK_MS, REPL_STALL_TICK_MS);
	/* The loop's reads (shard_pool_run_inline on conn) share one read transaction
	 * within a round of I/O callbacks while nothing commits (issue #19: the BEGIN,
	 * catalog read, ROLLBACK and SQLite's two lock calls were ~15% of a shard's CPU on
	 * point reads); the check has it ended REPL_READ_KEEP_MS later. */
	uv_check_init(sh->role->loop, &r->read_check);
	r->read_check.data = r;
	uv_check_start(&r->read_check, read_check_cb);
	uv_timer_init(sh->role->loop, &r->read_release);
	r->read_release.data = r;
	sdb_store_keep_reads(r->conn, true);
	memset(&no, 0, sizeof no);
	no.id = r->id;
	no.data_dir = dir;
	no.raft_addr = r->raft_addr;
	if (bootstrap)
		no.bootstrap = bootstrap;
	else {
		/* one code path: a shard without --bootstrap-members is a one-member set */
		static char one[300];
		snprintf(one, sizeof one, "%llu@%s", (unsigned long long)r->id, r->raft_addr);
		no.bootstrap = one;
	}
	no.snapshot_threshold =
		(unsigned)sdb_config_get_int(cfg, SDB_OPT_raft_snapshot_threshold, 1024);
	/* 750 ms for a shard (metadata keeps 1000): a SIGKILLed primary is replaced in p99
	 * ~1.5 s (1000 ms: ~2.1 s), and since multi-document deletes and large inserts apply
	 * in parts no bulk load re-elected the set (7 of 7 runs kept their leader; the longest
	 * loop stall, one 250-document part's apply, 229-412 ms at load 4.5-13 on 2 cores);
	 * tests/bench/README.md, replica-set section */
	no.election_timeout_ms =
		(unsigned)sdb_config_get_int(cfg, SDB_OPT_raft_election_timeout_ms, 750);
	no.on_change = on_change;
	no.data = r;
	no.transport = secure ? &to : NULL;
	no.sm = &sm;
	rc = sdb_node_start(sh->role->loop, &no, &r->node, err, errlen);
	OPENSSL_cleanse(key, sizeof key);
	if (rc) {
		r->node = NULL; /* closed asynchronously by node.c */
		return rc;
	}
	atomic_store(&r->h_members, (int)r->raft->configuration.n);
	sdb_gauge_set(r->g_applied, (int64_t)r->last_applied);
	sdb_info("shard: replica set member", "set=%s id=%llu raft=%s wire=%s applied=%llu",
		 set ? set : "(one member)", (unsigned long long)r->id, r->raft_addr, r->me,
		 (unsigned long long)r->last_applied);
	return 0;
}

void shard_repl_abandon(shard_repl *r)
{
	r->closed = true;
	atomic_store(&r->h_stopped, true);
	/* every request must be answered before the wire server goes: the callbacks that
	 * fire later (barrier, commit) find req NULL and only free */
	for (lin_read *l = r->lin_reads; l; l = l->next) {
		if (l->req) {
			wire_req_error(l->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
				       "linearizable read interrupted by shutdown");
			l->req = NULL;
		}
	}
	for (reg_req *rr = r->reg_reqs; rr; rr = rr->next) {
		if (rr->req) {
			wire_req_error(rr->req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
				       "member registration interrupted by shutdown");
			rr->req = NULL;
		}
	}
	repl_wc_abandon(r);
	repl_ct_abandon(r);
	if (r->reg_async) {
		r->reg_async->r = NULL; /* its callback only frees it */
		r->reg_async = NULL;
	}
	for (repl_batch *b = r->inflight; b; b = b->next) {
		for (size_t i = 0; i < b->n; i++) {
			if (b->reqs[i]) {
				wire_req_error(b->reqs[i], WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
					       "shutting down before the write committed; its "
					       "outcome is unknown");
				b->reqs[i] = NULL;
			}
		}
	}
	async_cb(&r->async); /* refuse what is queued */
}

int shard_repl_transfer(shard_repl *r, sdb_node_done_cb cb, void *arg)
{
	if (!r->node || !r->set_name || r->raft->configuration.n < 2)
		return SDB_EINVAL;
	return sdb_node_transfer(r->node, 0, cb, arg);
}

static void async_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	void (*cb)(void *) = r->closed_cb;
	void *arg = r->closed_arg;
	if (r->last_result)
		bson_destroy(r->last_result);
	if (r->conn)
		sdb_store_conn_close(r->conn);
	for (size_t i = 0; i < r->n_members; i++)
		free(r->members[i].wire);
	free(r->members);
	free(r->set_name);
	free(r->me);
	free(r->raft_addr);
	pthread_mutex_destroy(&r->mu);
	free(r);
	cb(arg);
}

static void wc_timer_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	uv_close((uv_handle_t *)&r->async, async_closed);
}

static void read_release_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	uv_close((uv_handle_t *)&r->wc_timer, wc_timer_closed);
}

static void read_check_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	uv_close((uv_handle_t *)&r->read_release, read_release_closed);
}

static void stall_timer_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	uv_close((uv_handle_t *)&r->read_check, read_check_closed);
}

static void reg_timer_closed(uv_handle_t *h)
{
	shard_repl *r = h->data;
	uv_close((uv_handle_t *)&r->stall_timer, stall_timer_closed);
}

static void node_closed(void *arg)
{
	shard_repl *r = arg;
	r->node = NULL;
	if (r->async_init) {
		uv_close((uv_handle_t *)&r->reg_timer, reg_timer_closed);
	} else {
		r->async.data = r;
		async_closed((uv_handle_t *)&r->async);
	}
}

void shard_repl_close(shard_repl *r, void (*cb)(void *arg), void *arg)
{
	r->closed_cb = cb;
	r->closed_arg = arg;
	if (r->async_init)
		shard_repl_abandon(r);
	r->closed = true;
	if (r->node)
		sdb_node_close(r->node, node_closed, r);
	else
		node_closed(r);
}

sdb_node *shard_repl_node(shard_repl *r)
{
	return r->closed ? NULL : r->node;
}

bool shard_repl_healthy(shard_repl *r, char *msg, size_t msglen)
{
	if (atomic_load(&r->h_stopped)) {
		snprintf(msg, msglen, "replication stopped");
		return false;
	}
	/* a one-member set serves nothing before it is primary; a member of a larger set is
	 * healthy while it runs (its set may have no primary: replSetGetStatus says) */
	if (atomic_load(&r->h_members) == 1 && !atomic_load(&r->h_ready)) {
		snprintf(msg, msglen, "one-member set: not primary yet");
		return false;
	}
	return true;
}
