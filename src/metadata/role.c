/* The metadata role (issue #5, DESIGN.md §4): a Raft member (raft/node.h) serving the
 * metadata commands over the MongoDB wire protocol, presented to drivers as the replica
 * set "stripedb-meta". Command reference: src/metadata/README.md. */
#include <mongoc/mongoc.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "auth/policy.h"
#include "auth/raftsec.h"
#include "auth/scram.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/metauri.h"
#include "common/bsonget.h"
#include "raft/migstate.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role.h"
#include "tls/tls.h"
#include "metadata/peers.h"
#include "raft/node.h"
#include "wire/server.h"

#define META_MAX_WAIT_MS 60000
#define META_SCRAM_ITERATIONS 15000
#define META_SCRAM_SHA1_ITERATIONS 10000 /* MongoDB's scramIterationCount default */
#define ERR_INTERRUPTED_REPL_CHANGE 11602
#define ERR_NOT_PRIMARY_NO_SECONDARY_OK 13435
#define ERR_BSON_OBJECT_TOO_LARGE 10334 /* BSONObjectTooLarge */

typedef struct waiter {
	wire_req *req;
	int64_t gt;
	bool want_ns; /* namespaces: true: name the collections that changed */
	uint64_t deadline_ms; /* uv_now */
	struct waiter *next;
} waiter;

typedef struct meta {
	sdb_role *role;
	sdb_node *node;
	wire_server *srv;
	uint64_t id;
	char *wire_addr;
	char *raft_addr;
	waiter *waiters;
	meta_peers *rlpeers; /* issue #23: rate-limit peer membership (peers.c) */
	uv_timer_t tick;
	uv_check_t check;
	int handles_open;
	int reg_inflight;      /* follower registration work items running */
	uint64_t reg_last_ms;  /* uv_now of the last attempt */
	char *new_cluster;     /* DATA_DIR/new-cluster: bootstrapped by this binary (heap) */
	bool opv_inflight;     /* the new cluster's setOpVersion is being proposed */
	int stopping;
	int stopped_signalled;
	/* for the HTTP health check (other threads) */
	atomic_int h_state;
	atomic_llong h_term;
	atomic_llong h_leader;
	sdb_gauge *g_term, *g_leader, *g_rv, *g_applied;
	sdb_counter *c_commits, *c_rejected;
	sdb_histogram *h_commit;
	/* getRoutingTable answers (issue #26): replies, bytes and chunks sent, by kind */
	sdb_counter *c_rt_full, *c_rt_diff, *c_rt_full_bytes, *c_rt_diff_bytes;
	sdb_counter *c_rt_full_chunks, *c_rt_diff_chunks;
	int64_t max_chunks; /* --max-chunks-per-command */

	/* what hello last reported, to wake held awaitable hellos when it changes */
	int topo_ready;
	uint64_t topo_leader, topo_term;
} meta;

static const sdb_metric_def meta_metrics[] = {
	SDB_METRIC_GAUGE(meta, g_term, "stripedb_metadata_raft_term", "Current Raft term."),
	SDB_METRIC_GAUGE(meta, g_leader, "stripedb_metadata_is_leader",
			 "1 when this member is the ready Raft leader."),
	SDB_METRIC_GAUGE(meta, g_rv, "stripedb_metadata_routing_version",
			 "Routing version applied on this member."),
	SDB_METRIC_GAUGE(meta, g_applied, "stripedb_metadata_last_applied",
			 "Index of the last command applied to the state machine."),
	SDB_METRIC_COUNTER(meta, c_commits, "stripedb_metadata_commits_total",
			   "Commands committed through this member as leader."),
	SDB_METRIC_COUNTER(meta, c_rejected, "stripedb_metadata_not_primary_total",
			   "Requests refused because this member is not the ready leader."),
	SDB_METRIC_HISTOGRAM(meta, h_commit, "stripedb_metadata_commit_seconds",
			     "Latency from receiving a write to its commit and apply."),
	SDB_METRIC_COUNTER_L(meta, c_rt_full, "stripedb_metadata_routing_replies_total",
			     "getRoutingTable replies sent, by kind (full load or diff).",
			     "kind=\"full\""),
	SDB_METRIC_COUNTER_L(meta, c_rt_diff, "stripedb_metadata_routing_replies_total",
			     "getRoutingTable replies sent, by kind (full load or diff).",
			     "kind=\"diff\""),
	SDB_METRIC_COUNTER_L(meta, c_rt_full_bytes, "stripedb_metadata_routing_reply_bytes_total",
			     "Bytes of getRoutingTable replies sent, by kind.", "kind=\"full\""),
	SDB_METRIC_COUNTER_L(meta, c_rt_diff_bytes, "stripedb_metadata_routing_reply_bytes_total",
			     "Bytes of getRoutingTable replies sent, by kind.", "kind=\"diff\""),
	SDB_METRIC_COUNTER_L(meta, c_rt_full_chunks, "stripedb_metadata_routing_chunks_sent_total",
			     "Chunks sent in getRoutingTable replies, by kind.", "kind=\"full\""),
	SDB_METRIC_COUNTER_L(meta, c_rt_diff_chunks, "stripedb_metadata_routing_chunks_sent_total",
			     "Chunks sent in getRoutingTable replies, by kind.", "kind=\"diff\""),
};

/* ------------------------------------------------------------------ helpers */

static void reply_not_primary(meta *m, wire_req *req)
{
	bson_t *extra = bson_new();
	uint64_t lid;
	const char *laddr;
	sdb_node_leader(m->node, &lid, &laddr);
	const char *lw = lid ? sdb_fsm_member_wire(sdb_node_fsm(m->node), lid) : NULL;
	if (lw)
		BSON_APPEND_UTF8(extra, "primary", lw);
	BSON_APPEND_INT64(extra, "leaderId", (int64_t)lid);
	sdb_counter_inc(m->c_rejected);
	wire_req_error_extra(req, WIRE_ERR_NOT_WRITABLE_PRIMARY, extra,
			     "not primary: this metadata member (id %llu) is not the ready Raft leader%s%s",
			     (unsigned long long)m->id, lw ? "; leader is " : "", lw ? lw : "");
}

static void reply_status(wire_req *req, int rc, const char *what)
{
	switch (rc) {
	case SDB_ENOTLEADER: {
		bson_t *r = bson_new();
		BSON_APPEND_DOUBLE(r, "ok", 0.0);
		BSON_APPEND_UTF8(r, "errmsg", "leadership lost before the command committed; its "
					       "outcome is unknown");
		BSON_APPEND_INT32(r, "code", ERR_INTERRUPTED_REPL_CHANGE);
		BSON_APPEND_UTF8(r, "codeName", "InterruptedDueToReplStateChange");
		wire_req_reply(req, r);
		return;
	}
	case SDB_ECANCELED:
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "%s: shutting down", what);
		return;
	case SDB_EINVAL:
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "%s: invalid member id or address", what);
		return;
	case SDB_EBUSY:
		wire_req_error(req, WIRE_ERR_OPERATION_FAILED, "%s: a membership change is in progress",
			       what);
		return;
	case SDB_ETIMEOUT:
		wire_req_error(req, WIRE_ERR_OPERATION_FAILED, "%s: did not complete in time", what);
		return;
	default:
		wire_req_error(req, WIRE_ERR_INTERNAL, "%s: %s", what, sdb_strerror(rc));
		return;
	}
}

/* First element of the command as int64 (int32, int64 or an integral double). */
static int first_int(const bson_t *cmd, int64_t *out)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) || !sdb_bson_as_int64(&it, out))
		return 0;
	return 1;
}

static const char *field_str(const bson_t *cmd, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, cmd, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* Which args field the command's first value fills ({addShard: "a"} -> id: "a"). */
static const struct {
	const char *cmd;
	const char *field;
} first_field[] = {
	{"addShard", "id"},         {"removeShard", "id"},      {"createDatabase", "name"},
	{"dropDatabase", "name"},   {"shardCollection", "ns"},  {"dropCollection", "ns"},
	{"splitChunk", "id"},       {"mergeChunks", "ns"},      {"setChunkShard", "id"},
	{"registerMigration", "id"}, {"updateMigration", "id"}, {"deleteMigration", "id"},
	{"acquireLease", "name"},   {"renewLease", "name"},     {"releaseLease", "name"},
	{"createTenant", "name"},   {"setQuota", "tenant"},     {"setPolicy", "tenant"},
	{"createUser", "name"},     {"registerMember", "id"},   {"removeMember", "id"},
	{"updateUser", "name"},     {"dropUser", "name"},       {"setOpVersion", "version"},
	{"setShardDraining", "id"}, {"pingProxy", "addr"},
};

/* Build the args document of a write: every field but the command key, driver
 * bookkeeping ($db, lsid, $clusterTime, ...) and the plaintext password. */
static void build_args(const bson_t *cmd, const char *name, bson_t *args)
{
	bson_iter_t it;
	const char *ff = NULL;
	bool first = true;
	bson_init(args);
	for (size_t i = 0; i < sizeof first_field / sizeof first_field[0]; i++)
		if (strcmp(first_field[i].cmd, name) == 0)
			ff = first_field[i].field;
	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (first) {
			first = false;
			if (ff && !bson_has_field(cmd, ff))
				bson_append_value(args, ff, -1, bson_iter_value(&it));
			continue;
		}
		if (k[0] == '$' || strcmp(k, "lsid") == 0 || strcmp(k, "txnNumber") == 0 ||
		    strcmp(k, "password") == 0 || strcmp(k, "pwd") == 0 ||
		    strcmp(k, "writeConcern") == 0 ||
		    strcmp(k, "readConcern") == 0 || strcmp(k, "opVersion") == 0)
			continue;
		bson_append_value(args, k, -1, bson_iter_value(&it));
	}
}

/* SCRAM-SHA-256 verifier (RFC 7677, RFC 5802 §3): SaltedPassword = PBKDF2-HMAC-SHA-256
 * (password, salt, i); StoredKey = H(HMAC(SaltedPassword, "Client Key")); ServerKey =
 * HMAC(SaltedPassword, "Server Key"). Computed on the leader before proposing, so the
 * password never enters the Raft log. (SASLprep of the password is not applied: use
 * ASCII passwords.) Returns 0 or -1. */
static int scram_verifier(const char *password, bson_t *args)
{
	/* salt: 28 bytes, MongoDB's length for SHA-256 (libmongoc refuses any other) */
	unsigned char salt[28], salted[32], ckey[32], skey[32], stored[32];
	unsigned int len = 0;
	if (RAND_bytes(salt, sizeof salt) != 1)
		return -1;
	if (PKCS5_PBKDF2_HMAC(password, (int)strlen(password), salt, sizeof salt,
			      META_SCRAM_ITERATIONS, EVP_sha256(), sizeof salted, salted) != 1)
		return -1;
	if (!HMAC(EVP_sha256(), salted, sizeof salted, (const unsigned char *)"Client Key", 10, ckey,
		  &len) ||
	    !HMAC(EVP_sha256(), salted, sizeof salted, (const unsigned char *)"Server Key", 10, skey,
		  &len))
		return -1;
	SHA256(ckey, sizeof ckey, stored);
	BSON_APPEND_BINARY(args, "salt", BSON_SUBTYPE_BINARY, salt, sizeof salt);
	BSON_APPEND_INT32(args, "iterations", META_SCRAM_ITERATIONS);
	BSON_APPEND_BINARY(args, "storedKey", BSON_SUBTYPE_BINARY, stored, sizeof stored);
	BSON_APPEND_BINARY(args, "serverKey", BSON_SUBTYPE_BINARY, skey, sizeof skey);
	return 0;
}

/* SCRAM-SHA-1 verifier (issue #10) as args.scramSha1 {salt, iterations, storedKey,
 * serverKey}: MongoDB's parameters (16-byte salt, 10000 iterations) over its password
 * digest HEX(MD5(user ":mongo:" password)) (auth/scram.h). Returns 0 or -1. */
static int scram_sha1_verifier(const char *user, const char *password, bson_t *args)
{
	uint8_t salt[16];
	auth_scram_creds c;
	char err[128];
	bson_t d;
	if (RAND_bytes(salt, sizeof salt) != 1 ||
	    auth_scram_verifier(AUTH_SCRAM_SHA1, user, password, salt, sizeof salt,
				META_SCRAM_SHA1_ITERATIONS, &c, err, sizeof err) != 0)
		return -1;
	BSON_APPEND_DOCUMENT_BEGIN(args, "scramSha1", &d);
	BSON_APPEND_BINARY(&d, "salt", BSON_SUBTYPE_BINARY, c.salt, (uint32_t)c.salt_len);
	BSON_APPEND_INT32(&d, "iterations", c.iterations);
	BSON_APPEND_BINARY(&d, "storedKey", BSON_SUBTYPE_BINARY, c.stored_key, 20);
	BSON_APPEND_BINARY(&d, "serverKey", BSON_SUBTYPE_BINARY, c.server_key, 20);
	bson_append_document_end(args, &d);
	OPENSSL_cleanse(&c, sizeof c);
	return 0;
}

/* ------------------------------------------------------------------ writes */

typedef struct wreq {
	meta *m;
	wire_req *req;
	uint64_t start_ns;
} wreq;

static void write_done(void *arg, int status, bson_t *result)
{
	wreq *w = arg;
	if (status == 0) {
		sdb_counter_inc(w->m->c_commits);
		sdb_histogram_observe_ns(w->m->h_commit, sdb_mono_ns() - w->start_ns);
		wire_req_reply(w->req, bson_copy(result));
		bson_destroy(result);
	} else {
		reply_status(w->req, status, "write");
	}
	free(w);
}

/* The arguments the state machine reads as integers (raft/fsm*.c fsm_arg_int). "id" and
 * "chunk" may also be strings (a migration's id, a decimal chunk id), so only numbers are
 * checked here; a value of another type is refused or ignored at apply as before. */
static const char *const int_args[] = {"id", "chunk", "version", "startedMS", "ttlMS",
				       "iterations", "numChunks", "token", "expectToken"};

/* The proposing side of the integer rule (common/bsonget.h): a number among int_args must
 * be an int32, an int64 or an integral double inside the int64 range, so that no fraction,
 * NaN or infinity enters the log (apply truncated 2.5 to 2, and must keep doing so for the
 * entries earlier leaders wrote: raft/fsm.c fsm_arg_int). 0, or SDB_EINVAL and *e. */
static int check_int_args(const bson_t *args, sdb_bson_err *e)
{
	bson_iter_t it;
	int64_t v;

	for (size_t i = 0; i < sizeof int_args / sizeof int_args[0]; i++)
		if (bson_iter_init_find(&it, args, int_args[i]) && BSON_ITER_HOLDS_NUMBER(&it) &&
		    sdb_bson_get_int64(&it, int_args[i], INT64_MIN, INT64_MAX, &v, e) != 0)
			return SDB_EINVAL;
	return 0;
}

/* The leader's check of an updateMigration before proposing it (args: the entry's
 * arguments): expectState is required, and a new state must be a legal edge from it
 * (raft/migstate.h). Returns: 0, or a MongoDB code (2 BadValue: no expectState or an
 * unknown state name; 20 IllegalOperation: not an edge) with the reason in why. */
static int updmig_precheck(const bson_t *args, char *why, size_t whylen)
{
	bson_iter_t it;
	const char *expect = NULL, *state = NULL;

	if (bson_iter_init_find(&it, args, "expectState") && BSON_ITER_HOLDS_UTF8(&it))
		expect = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, args, "state") && BSON_ITER_HOLDS_UTF8(&it))
		state = bson_iter_utf8(&it, NULL);
	if (expect == NULL) {
		snprintf(why, whylen, "expectState (the state the migration is in) is required");
		return WIRE_ERR_BAD_VALUE;
	}
	if (migrate_state_parse(expect) == MIG_UNKNOWN ||
	    (state != NULL && migrate_state_parse(state) == MIG_UNKNOWN)) {
		snprintf(why, whylen, "unknown migration state %s",
			 migrate_state_parse(expect) == MIG_UNKNOWN ? expect : state);
		return WIRE_ERR_BAD_VALUE;
	}
	if (state != NULL && strcmp(state, expect) != 0 &&
	    !migrate_transition_ok(migrate_state_parse(expect), migrate_state_parse(state))) {
		snprintf(why, whylen, "illegal transition %s -> %s", expect, state);
		return WIRE_ERR_ILLEGAL_OPERATION;
	}
	return 0;
}

static void h_write(wire_req *req, void *data)
{
	meta *m = data;
	const char *name = wire_req_name(req);
	const bson_t *cmd = wire_req_cmd(req);
	sdb_bson_err e;
	bson_t args;
	wreq *w;
	int rc;

	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (!sdb_node_ready(m->node)) {
		reply_not_primary(m, req);
		return;
	}
	if ((strcmp(name, "pingProxy") == 0 || strcmp(name, "setShardDraining") == 0) &&
	    sdb_fsm_op_version(sdb_node_fsm(m->node)) < MIGSTATE_OP_VERSION_EXCLUSIVE) {
		/* refused here, not at apply: no log entry for each proxy's ping (and apply
		 * refuses it too, for an entry a leader of another version proposed) */
		wire_req_error(req, WIRE_ERR_ILLEGAL_OPERATION,
			       "%s needs cluster op version %d (setOpVersion)", name,
			       MIGSTATE_OP_VERSION_EXCLUSIVE);
		return;
	}
	build_args(cmd, name, &args);
	if (check_int_args(&args, &e) != 0) {
		bson_destroy(&args);
		wire_req_error(req, e.code, "%s: %s", name, e.msg);
		return;
	}
	if (strcmp(name, "updateMigration") == 0) {
		/* checked here too, before anything is in the log: an entry this leader stamps
		 * names expectState and a legal expectState -> state edge, so a member of an
		 * older binary (which applies stamped entries with the old rules but checks
		 * expectState) reaches the same state as the new ones during a rolling upgrade */
		char why[160];
		int code = updmig_precheck(&args, why, sizeof why);
		if (code != 0) {
			bson_destroy(&args);
			wire_req_error(req, code, "updateMigration: %s", why);
			return;
		}
		/* the leader, not the client, says which rules apply (raft/migstate.h) */
		BSON_APPEND_INT32(&args, "opVersion", MIGSTATE_OP_VERSION);
	}
	else if (strcmp(name, "registerMigration") == 0 || strcmp(name, "shardCollection") == 0 ||
		 strcmp(name, "setShardDraining") == 0 || strcmp(name, "pingProxy") == 0 ||
		 strcmp(name, "splitChunk") == 0 || strcmp(name, "mergeChunks") == 0)
		/* 3 (one active migration per chunk; MongoDB's hashed initial split points and
		 * no chunks on a draining shard) and 4 (chunk bounds in MongoDB's key order:
		 * shardCollection, splitChunk, mergeChunks) only once the cluster was raised to
		 * it with setOpVersion, so that no older member applies it (raft/migstate.h) */
		BSON_APPEND_INT32(&args, "opVersion",
				  (int32_t)sdb_fsm_op_version(sdb_node_fsm(m->node)));
	if (strcmp(name, "shardCollection") == 0) {
		/* issue #26: the chunk count of one command is an operator's limit, checked
		 * here on the leader (apply itself has no cap, so members never disagree) */
		bson_iter_t cit, sp;
		int64_t want = 0;
		if (bson_iter_init_find(&cit, &args, "numChunks")) {
			/* an integral count, checked here as the leader's other limits are: a
			 * string, NaN, 2.5 or 0 used to become the default of 2 chunks */
			if (sdb_bson_get_int64(&cit, "numChunks", 1, INT32_MAX, &want, &e) != 0) {
				bson_destroy(&args);
				wire_req_error(req, e.code, "shardCollection: %s", e.msg);
				return;
			}
		}
		else if (bson_iter_init_find(&cit, &args, "splitPoints") &&
			 BSON_ITER_HOLDS_ARRAY(&cit) && bson_iter_recurse(&cit, &sp))
			for (want = 1; bson_iter_next(&sp);)
				want++;
		if (want > m->max_chunks) {
			bson_destroy(&args);
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "shardCollection: %lld chunks exceed --max-chunks-per-command=%lld",
				       (long long)want, (long long)m->max_chunks);
			return;
		}
	}
	if (strcmp(name, "setPolicy") == 0) {
		/* a policy the proxy could not read would grant nothing (fail closed): refuse it
		 * here, naming the field, instead of storing it */
		bson_iter_t pit;
		uint32_t plen;
		const uint8_t *pdata;
		bson_t pdoc;
		char perr[300];
		if (bson_iter_init_find(&pit, &args, "policy") && BSON_ITER_HOLDS_DOCUMENT(&pit)) {
			bson_iter_document(&pit, &plen, &pdata);
			if (bson_init_static(&pdoc, pdata, plen) &&
			    auth_policy_validate(&pdoc, perr, sizeof perr) != 0) {
				bson_destroy(&args);
				wire_req_error(req, WIRE_ERR_BAD_VALUE, "setPolicy: %s", perr);
				return;
			}
		}
	}
	if (strcmp(name, "createUser") == 0 || strcmp(name, "updateUser") == 0) {
		/* the password (MongoDB's pwd, or password) never enters the Raft log: the
		 * leader proposes SCRAM-SHA-256 and SCRAM-SHA-1 verifiers instead */
		const char *pw = field_str(cmd, "password"), *name_arg = field_str(&args, "name");
		char user[256]; /* copied: appending to args moves its buffer */
		if (!pw)
			pw = field_str(cmd, "pwd");
		snprintf(user, sizeof user, "%s", name_arg ? name_arg : "");
		if (name_arg && strcmp(name_arg, AUTH_CLUSTER_USER) == 0) {
			bson_destroy(&args);
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "%s: the user name " AUTH_CLUSTER_USER
				       " is reserved for cluster members",
				       name);
			return;
		}
		if (pw && (!name_arg || name_arg[0] == '\0' || strlen(name_arg) >= sizeof user)) {
			bson_destroy(&args);
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "%s: the user name must be 1 to %zu bytes", name,
				       sizeof user - 1);
			return;
		}
		if (pw && (scram_verifier(pw, &args) != 0 ||
			   scram_sha1_verifier(user, pw, &args) != 0)) {
			bson_destroy(&args);
			wire_req_error(req, WIRE_ERR_INTERNAL, "%s: SCRAM verifier failed", name);
			return;
		}
	}
	w = sdb_calloc(1, sizeof *w);
	w->m = m;
	w->req = req;
	w->start_ns = sdb_mono_ns();
	rc = sdb_node_propose(m->node, name, &args, write_done, w);
	bson_destroy(&args);
	if (rc == SDB_ENOTLEADER) {
		free(w);
		reply_not_primary(m, req);
	} else if (rc != 0) {
		free(w);
		reply_status(req, rc, name);
	}
}

/* ------------------------------------------------------------------ reads */

/* Count one getRoutingTable answer in the metrics (issue #26): full loads and diffs,
 * reply bytes and chunks sent. */
static void count_routing(meta *m, const bson_t *reply)
{
	bson_iter_t it, arr;
	bool full = true;
	int64_t n = 0;
	uint32_t len;
	memcpy(&len, bson_get_data(reply), 4); /* heap bson_t: never touch its members */
	len = BSON_UINT32_FROM_LE(len);
	if (bson_iter_init_find(&it, reply, "full") && BSON_ITER_HOLDS_BOOL(&it))
		full = bson_iter_bool(&it);
	if (bson_iter_init_find(&it, reply, "chunks") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr))
		while (bson_iter_next(&arr))
			n++;
	sdb_counter_inc(full ? m->c_rt_full : m->c_rt_diff);
	sdb_counter_add(full ? m->c_rt_full_bytes : m->c_rt_diff_bytes, (uint64_t)len);
	sdb_counter_add(full ? m->c_rt_full_chunks : m->c_rt_diff_chunks, (uint64_t)n);
}

static void run_query(meta *m, wire_req *req)
{
	char err[256] = "";
	bson_t *reply = bson_new();
	int rc = sdb_fsm_query(sdb_node_fsm(m->node), wire_req_name(req), wire_req_cmd(req), reply,
			       err, sizeof err);
	if (rc == 0) {
		BSON_APPEND_INT64(reply, "lastApplied", (int64_t)sdb_fsm_last_applied(sdb_node_fsm(m->node)));
		if (strcmp(wire_req_name(req), "getRoutingTable") == 0)
			count_routing(m, reply);
		wire_req_reply(req, reply);
		return;
	}
	if (rc == SDB_ENSNOTFOUND) {
		/* getRoutingTable's "not sharded" says at which routingVersion it is true */
		bson_iter_t it;
		bson_t *extra = bson_new();
		if (bson_iter_init_find(&it, reply, "routingVersion"))
			bson_append_iter(extra, "routingVersion", -1, &it);
		bson_destroy(reply);
		wire_req_error_extra(req, WIRE_ERR_NAMESPACE_NOT_FOUND, extra, "%s", err);
		return;
	}
	bson_destroy(reply);
	if (rc == SDB_ENOTFOUND)
		wire_req_error(req, WIRE_ERR_NO_SUCH_KEY, "%s", err);
	else if (rc == SDB_EINVAL)
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "%s", err);
	else if (rc == SDB_ETOOBIG)
		wire_req_error(req, ERR_BSON_OBJECT_TOO_LARGE, "%s", err);
	else
		wire_req_error(req, WIRE_ERR_INTERNAL, "%s", err[0] ? err : "state machine read failed");
}

typedef struct rreq {
	meta *m;
	wire_req *req;
} rreq;

static void read_fenced(void *arg, int status)
{
	rreq *r = arg;
	if (status == 0)
		run_query(r->m, r->req);
	else if (status == SDB_ENOTLEADER)
		reply_not_primary(r->m, r->req);
	else
		reply_status(r->req, status, "read");
	free(r);
}

/* Does the command accept a possibly stale local answer? ($readPreference other than
 * primary, or allowStale: true; never with readConcern {level: "linearizable"}.) */
static bool stale_ok(const bson_t *cmd)
{
	bson_iter_t it, sub;
	if (bson_iter_init_find(&it, cmd, "readConcern") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, "level") &&
	    BSON_ITER_HOLDS_UTF8(&sub) && strcmp(bson_iter_utf8(&sub, NULL), "linearizable") == 0)
		return false;
	if (bson_iter_init_find(&it, cmd, "allowStale") && bson_iter_as_bool(&it))
		return true;
	if (bson_iter_init_find(&it, cmd, "$readPreference") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, "mode") &&
	    BSON_ITER_HOLDS_UTF8(&sub) && strcmp(bson_iter_utf8(&sub, NULL), "primary") != 0)
		return true;
	return false;
}

/* Linearizable read: on the ready leader through a barrier (dissertation §6.4); on a
 * follower only when the client accepts staleness. */
static void h_read(wire_req *req, void *data)
{
	meta *m = data;
	rreq *r;
	int rc;
	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (!sdb_node_ready(m->node)) {
		if (stale_ok(wire_req_cmd(req))) {
			run_query(m, req);
			return;
		}
		sdb_counter_inc(m->c_rejected);
		wire_req_error(req, ERR_NOT_PRIMARY_NO_SECONDARY_OK,
			       "not primary and secondaryOk=false: linearizable reads are served by "
			       "the leader (or pass allowStale: true)");
		return;
	}
	r = sdb_calloc(1, sizeof *r);
	r->m = m;
	r->req = req;
	rc = sdb_node_barrier(m->node, read_fenced, r);
	if (rc != 0) {
		free(r);
		if (rc == SDB_ENOTLEADER)
			reply_not_primary(m, req);
		else
			reply_status(req, rc, "read");
	}
}

/* Routing reads: any member, answered from local state with the routing version
 * attached (version tokens make stale routing safe). */
static void h_routing(wire_req *req, void *data)
{
	meta *m = data;
	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	run_query(m, req);
}

static void waiter_reply(meta *m, waiter *w, bool timed_out)
{
	bson_t *r = bson_new();
	BSON_APPEND_INT64(r, "routingVersion", sdb_fsm_routing_version(sdb_node_fsm(m->node)));
	BSON_APPEND_BOOL(r, "changed", !timed_out);
	BSON_APPEND_BOOL(r, "timedOut", timed_out);
	/* issue #26: which collections changed after gt, so a client refreshes only those */
	if (!timed_out && w->want_ns &&
	    sdb_fsm_routing_changed(sdb_node_fsm(m->node), w->gt, r) != 0)
		BSON_APPEND_BOOL(r, "namespacesAll", true);
	wire_req_reply(w->req, r);
	free(w);
}

/* {waitRoutingVersion: 1, gt: N, timeoutMS: T}: answer as soon as the local routing
 * version exceeds N, or after T ms (at most 60000) with timedOut: true. The request is
 * parked; the loop is never blocked. */
static void h_wait_routing(wire_req *req, void *data)
{
	meta *m = data;
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	int64_t gt = -1, tmo = 10000;
	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (bson_iter_init_find(&it, cmd, "gt") && BSON_ITER_HOLDS_NUMBER(&it))
		gt = bson_iter_as_int64(&it);
	else if (!first_int(cmd, &gt)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "waitRoutingVersion needs gt: N");
		return;
	}
	if (bson_iter_init_find(&it, cmd, "timeoutMS") && BSON_ITER_HOLDS_NUMBER(&it))
		tmo = bson_iter_as_int64(&it);
	if (tmo < 0)
		tmo = 0;
	if (tmo > META_MAX_WAIT_MS)
		tmo = META_MAX_WAIT_MS;
	waiter *w = sdb_calloc(1, sizeof *w);
	w->req = req;
	w->gt = gt;
	w->want_ns = bson_iter_init_find(&it, cmd, "namespaces") && bson_iter_as_bool(&it);
	w->deadline_ms = uv_now(m->role->loop) + (uint64_t)tmo;
	if (sdb_fsm_routing_version(sdb_node_fsm(m->node)) > gt) {
		waiter_reply(m, w, false);
		return;
	}
	w->next = m->waiters;
	m->waiters = w;
}

static void wake_waiters(meta *m, bool all)
{
	int64_t rv = sdb_fsm_routing_version(sdb_node_fsm(m->node));
	uint64_t now = uv_now(m->role->loop);
	waiter **pp = &m->waiters;
	while (*pp) {
		waiter *w = *pp;
		bool changed = rv > w->gt;
		if (all || changed || now >= w->deadline_ms) {
			*pp = w->next;
			waiter_reply(m, w, !changed);
		} else {
			pp = &w->next;
		}
	}
}

/* ------------------------------------------------------------------ membership */

typedef struct mreq {
	meta *m;
	wire_req *req;
	uint64_t id;
	char *wire;
	char *raft;
	int remove;
} mreq;

static void mreq_free(mreq *r)
{
	free(r->wire);
	free(r->raft);
	free(r);
}

static void member_registered(void *arg, int status, bson_t *result)
{
	mreq *r = arg;
	if (status == 0) {
		bson_t *rep = bson_new();
		BSON_APPEND_INT64(rep, "id", (int64_t)r->id);
		sdb_node_append_config(r->m->node, rep, "members");
		BSON_APPEND_DOUBLE(rep, "ok", 1.0);
		wire_req_reply(r->req, rep);
		bson_destroy(result);
	} else {
		reply_status(r->req, status, r->remove ? "removeMember" : "addMember");
	}
	mreq_free(r);
}

static void member_changed(void *arg, int status)
{
	mreq *r = arg;
	bson_t args = BSON_INITIALIZER;
	int rc;
	if (status != 0) {
		reply_status(r->req, status, r->remove ? "removeMember" : "addMember");
		mreq_free(r);
		return;
	}
	BSON_APPEND_INT64(&args, "id", (int64_t)r->id);
	if (!r->remove) {
		BSON_APPEND_UTF8(&args, "raft", r->raft);
		if (r->wire)
			BSON_APPEND_UTF8(&args, "wire", r->wire);
	}
	rc = sdb_node_propose(r->m->node, r->remove ? "removeMember" : "registerMember", &args,
			      member_registered, r);
	bson_destroy(&args);
	if (rc != 0) {
		reply_status(r->req, rc, r->remove ? "removeMember" : "addMember");
		mreq_free(r);
	}
}

/* {addMember: ID, raft: "H:P", wire: "H:P"} / {removeMember: ID}: one-server
 * membership change on the leader, then the member's wire address is recorded (or
 * dropped) in the state machine. */
static void h_member(wire_req *req, void *data)
{
	meta *m = data;
	const bson_t *cmd = wire_req_cmd(req);
	int remove = strcmp(wire_req_name(req), "removeMember") == 0;
	int64_t id;
	mreq *r;
	int rc;
	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	if (!first_int(cmd, &id) || id <= 0) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "%s needs a positive member id",
			       wire_req_name(req));
		return;
	}
	if (!remove && !field_str(cmd, "raft")) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "addMember needs raft: \"HOST:PORT\"");
		return;
	}
	if (!sdb_node_ready(m->node)) {
		reply_not_primary(m, req);
		return;
	}
	r = sdb_calloc(1, sizeof *r);
	r->m = m;
	r->req = req;
	r->id = (uint64_t)id;
	r->remove = remove;
	if (!remove) {
		r->raft = sdb_strdup(field_str(cmd, "raft"));
		if (field_str(cmd, "wire"))
			r->wire = sdb_strdup(field_str(cmd, "wire"));
		rc = sdb_node_add(m->node, r->id, r->raft, member_changed, r);
	} else {
		rc = sdb_node_remove(m->node, r->id, member_changed, r);
	}
	if (rc != 0) {
		mreq_free(r);
		if (rc == SDB_ENOTLEADER)
			reply_not_primary(m, req);
		else
			reply_status(req, rc, wire_req_name(req));
	}
}

static void transfer_done(void *arg, int status)
{
	rreq *r = arg;
	if (status == 0) {
		uint64_t lid;
		const char *la;
		bson_t *rep = bson_new();
		sdb_node_leader(r->m->node, &lid, &la);
		BSON_APPEND_INT64(rep, "leaderId", (int64_t)lid);
		wire_req_reply(r->req, rep);
	} else {
		reply_status(r->req, status, "transferLeadership");
	}
	free(r);
}

/* {transferLeadership: ID or 0}: raft_transfer on the leader (dissertation §3.10). */
static void h_transfer(wire_req *req, void *data)
{
	meta *m = data;
	int64_t id = 0;
	rreq *r;
	int rc;
	first_int(wire_req_cmd(req), &id);
	if (id < 0 || (uint64_t)id == m->id) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "transferLeadership needs another member's id");
		return;
	}
	if (m->stopping || !sdb_node_ready(m->node)) {
		reply_not_primary(m, req);
		return;
	}
	r = sdb_calloc(1, sizeof *r);
	r->m = m;
	r->req = req;
	rc = sdb_node_transfer(m->node, (uint64_t)id, transfer_done, r);
	if (rc != 0) {
		free(r);
		reply_status(req, rc, "transferLeadership");
	}
}

/* {metadataStatus: 1}: this member's view (any member, never blocks). */
static void h_status(wire_req *req, void *data)
{
	meta *m = data;
	if (m->stopping) {
		wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN, "metadata member stopping");
		return;
	}
	sdb_fsm *f = sdb_node_fsm(m->node);
	struct raft *r = sdb_node_raft(m->node);
	bson_t *rep = bson_new();
	bson_t dummy = BSON_INITIALIZER;
	uint64_t lid;
	const char *la;
	char err[64];
	int st = raft_state(r);
	sdb_node_leader(m->node, &lid, &la);
	BSON_APPEND_INT64(rep, "id", (int64_t)m->id);
	BSON_APPEND_UTF8(rep, "state",
			 st == RAFT_LEADER      ? "leader"
			 : st == RAFT_FOLLOWER  ? "follower"
			 : st == RAFT_CANDIDATE ? "candidate"
						: "unavailable");
	BSON_APPEND_BOOL(rep, "ready", sdb_node_ready(m->node));
	BSON_APPEND_INT64(rep, "term", (int64_t)sdb_node_term(m->node));
	BSON_APPEND_INT64(rep, "leaderId", (int64_t)lid);
	BSON_APPEND_INT64(rep, "commitIndex", (int64_t)r->commit_index);
	BSON_APPEND_INT64(rep, "lastApplied", (int64_t)raft_last_applied(r));
	BSON_APPEND_INT64(rep, "fsmLastApplied", (int64_t)sdb_fsm_last_applied(f));
	BSON_APPEND_INT64(rep, "lastIndex", (int64_t)raft_last_index(r));
	BSON_APPEND_INT64(rep, "snapshotIndex", (int64_t)r->log.snapshot.last_index);
	BSON_APPEND_INT64(rep, "routingVersion", sdb_fsm_routing_version(f));
	BSON_APPEND_INT64(rep, "opVersion", sdb_fsm_op_version(f));
	char hash[32];
	snprintf(hash, sizeof hash, "%016llx", (unsigned long long)sdb_fsm_hash(f));
	BSON_APPEND_UTF8(rep, "stateHash", hash);
	snprintf(hash, sizeof hash, "%016llx", (unsigned long long)sdb_fsm_apply_chain(f));
	BSON_APPEND_UTF8(rep, "applyChain", hash);
	sdb_node_append_config(m->node, rep, "members");
	sdb_fsm_query(f, "listMembers", &dummy, rep, err, sizeof err);
	wire_req_reply(req, rep);
}

/* ------------------------------------------------------------------ hello */

/* sdb_node_hello's address lookup: this member's own wire address (it may not be in the
 * state machine's member table yet), else the registered one. */
static const char *hello_wire(void *ctx, uint64_t id)
{
	meta *m = ctx;
	return id == m->id ? m->wire_addr : sdb_fsm_member_wire(sdb_node_fsm(m->node), id);
}

static void hello_hook(void *data, const bson_t *cmd, bson_t *reply)
{
	meta *m = data;

	if (m->stopping) { /* the node may already be gone: say only "not writable" */
		sdb_hello_set_writable(cmd, reply, false);
		BSON_APPEND_UTF8(reply, "setName", SDB_META_REPLICA_SET);
		return;
	}
	bool ready = sdb_node_ready(m->node);
	sdb_node_hello_info h = {.set_name = SDB_META_REPLICA_SET,
			    .set_version = 1,
			    .me = m->wire_addr,
			    .ready = ready,
			    .secondary = !ready,
			    .wire = hello_wire,
			    .ctx = m};
	sdb_node_hello(m->node, cmd, reply, &h);
}

/* ------------------------------------------------------------------ follower registration */

/* A follower's registration with the leader has finished (ok: the leader committed it). */
static void reg_after(void *arg, bool ok, const bson_t *reply)
{
	meta *m = arg;
	(void)reply;
	m->reg_inflight--;
	(void)ok; /* a failure is logged by the helper; ensure_registered tries again */
}

static void propose_self_done(void *arg, int status, bson_t *result)
{
	meta *m = arg;
	(void)m;
	if (result) {
		bson_destroy(result);
	}
	if (status != 0)
		sdb_debug("metadata: self registration did not commit", "status=%d", status);
}

/* Make sure the state machine knows this member's wire address, so that every member
 * can list it in hello's hosts. The leader proposes it; a follower asks the leader. */
static void ensure_registered(meta *m)
{
	sdb_fsm *f = sdb_node_fsm(m->node);
	const char *mine = sdb_fsm_member_wire(f, m->id);
	uint64_t now = uv_now(m->role->loop), lid;
	const char *la;
	if (m->stopping || (mine && strcmp(mine, m->wire_addr) == 0))
		return;
	if (m->reg_inflight || now - m->reg_last_ms < 300)
		return;
	m->reg_last_ms = now;
	if (sdb_node_ready(m->node)) {
		bson_t args = BSON_INITIALIZER;
		BSON_APPEND_INT64(&args, "id", (int64_t)m->id);
		BSON_APPEND_UTF8(&args, "raft", m->raft_addr);
		BSON_APPEND_UTF8(&args, "wire", m->wire_addr);
		sdb_node_propose(m->node, "registerMember", &args, propose_self_done, m);
		bson_destroy(&args);
		return;
	}
	sdb_node_leader(m->node, &lid, &la);
	const char *lw = lid && lid != m->id ? sdb_fsm_member_wire(f, lid) : NULL;
	if (!lw)
		return;
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_INT64(&cmd, "registerMember", (int64_t)m->id);
	BSON_APPEND_UTF8(&cmd, "raft", m->raft_addr);
	BSON_APPEND_UTF8(&cmd, "wire", m->wire_addr);
	if (auth_cluster_command_async(m->role->loop, lw, &cmd, "metadata registerMember",
				       reg_after, m) == 0)
		m->reg_inflight++;
	bson_destroy(&cmd);
}

/* ------------------------------------------------------------------ loop hooks */

static void update_gauges(meta *m)
{
	uint64_t lid;
	const char *la;
	sdb_node_leader(m->node, &lid, &la);
	int st = raft_state(sdb_node_raft(m->node));
	atomic_store(&m->h_state, st);
	atomic_store(&m->h_term, (long long)sdb_node_term(m->node));
	atomic_store(&m->h_leader, (long long)lid);
	sdb_gauge_set(m->g_term, (int64_t)sdb_node_term(m->node));
	sdb_gauge_set(m->g_leader, sdb_node_ready(m->node) ? 1 : 0);
	sdb_gauge_set(m->g_rv, sdb_fsm_routing_version(sdb_node_fsm(m->node)));
	sdb_gauge_set(m->g_applied, (int64_t)sdb_fsm_last_applied(sdb_node_fsm(m->node)));
	/* SDAM streaming: a held awaitable hello must learn of an election or step-down now,
	 * not after maxAwaitTimeMS (wire/server.h: wire_server_topology_changed). */
	{
		int ready = sdb_node_ready(m->node) ? 1 : 0;
		uint64_t term = sdb_node_term(m->node);
		if (m->srv != NULL && !m->stopping &&
		    (ready != m->topo_ready || lid != m->topo_leader || term != m->topo_term)) {
			m->topo_ready = ready;
			m->topo_leader = lid;
			m->topo_term = term;
			wire_server_topology_changed(m->srv);
		}
	}
}

static void opv_done(void *arg, int status, bson_t *result)
{
	meta *m = arg;
	m->opv_inflight = false;
	if (result)
		bson_destroy(result);
	if (status != 0)
		sdb_debug("metadata: the new cluster's op version did not commit", "status=%d",
			  status);
}

/* A cluster this binary bootstrapped (raft/node.h bootstrap_marker) starts at the newest
 * op version (raft/migstate.h), as a new MongoDB deployment starts at the newest
 * featureCompatibilityVersion: every member of a new cluster runs the binary that created
 * it. Its leader proposes setOpVersion MIGSTATE_OP_VERSION_MAX once; an existing cluster
 * upgraded in place keeps its op version until an operator raises it (ctl metadata
 * op-version) after upgrading every member. The marker goes once an op version is set. */
static void ensure_op_version(meta *m)
{
	sdb_fsm *f = sdb_node_fsm(m->node);
	if (m->stopping || m->opv_inflight || !m->new_cluster)
		return;
	if (sdb_fsm_op_version_set(f)) {
		if (unlink(m->new_cluster) == 0 || errno == ENOENT) {
			free(m->new_cluster);
			m->new_cluster = NULL;
		}
		return;
	}
	if (!sdb_node_ready(m->node) || access(m->new_cluster, F_OK) != 0)
		return;
	bson_t args = BSON_INITIALIZER;
	BSON_APPEND_INT32(&args, "version", MIGSTATE_OP_VERSION_MAX);
	if (sdb_node_propose(m->node, "setOpVersion", &args, opv_done, m) == 0) {
		m->opv_inflight = true;
		sdb_info("metadata: a new cluster starts at the newest op version", "version=%d",
			 MIGSTATE_OP_VERSION_MAX);
	}
	bson_destroy(&args);
}

static void on_change(void *data)
{
	meta *m = data;
	update_gauges(m);
	ensure_registered(m);
	ensure_op_version(m);
}

static void tick_cb(uv_timer_t *t)
{
	meta *m = t->data;
	wake_waiters(m, false);
	ensure_registered(m);
	ensure_op_version(m);
	update_gauges(m);
}

static void check_cb(uv_check_t *c)
{
	meta *m = c->data;
	if (m->waiters)
		wake_waiters(m, false);
}

static int health(void *data, char *msg, size_t msglen)
{
	meta *m = data;
	int st = atomic_load(&m->h_state);
	snprintf(msg, msglen, "raft state=%s term=%lld leader=%lld",
		 st == RAFT_LEADER      ? "leader"
		 : st == RAFT_FOLLOWER  ? "follower"
		 : st == RAFT_CANDIDATE ? "candidate"
					: "unavailable",
		 (long long)atomic_load(&m->h_term), (long long)atomic_load(&m->h_leader));
	return 1;
}

/* ------------------------------------------------------------------ start/stop */

static const char *const write_cmds[] = {
	"addShard",      "removeShard",       "createDatabase",  "dropDatabase",
	"shardCollection", "dropCollection",  "splitChunk",      "mergeChunks",
	"setChunkShard", "registerMigration", "updateMigration", "deleteMigration",
	"acquireLease",  "renewLease",        "releaseLease",    "createTenant",
	"setQuota",      "setPolicy",         "createUser",      "registerMember",
	"updateUser",    "dropUser",          "setOpVersion",    "setShardDraining",
	"pingProxy",
};

static const char *const read_cmds[] = {
	"listShards", "listDatabases", "listCollections", "getMigration", "listMigrations",
	"listTenants", "getUser", "listMembers", "getLease", "listUsers", "listProxies",
};

/* issue #23: the rate-limit membership commands find their state through this */
static meta_peers *rlpeers_of(void *data)
{
	return ((meta *)data)->rlpeers;
}

static void maybe_stopped(meta *m);

static void rlpeers_closed(void *arg)
{
	meta *m = arg;
	m->rlpeers = NULL;
	m->handles_open--;
	maybe_stopped(m);
}

static void free_meta(meta *m)
{
	free(m->wire_addr);
	free(m->raft_addr);
	free(m->new_cluster);
	free(m);
}

static void failed_start_closed(void *arg)
{
	free_meta(arg);
}

static int metadata_start(sdb_role *role)
{
	const sdb_config *cfg = role->cfg;
	const char *listen = sdb_config_get(cfg, SDB_OPT_listen);
	const char *node_id = sdb_config_get(cfg, SDB_OPT_node_id);
	const char *raft_listen = sdb_config_get(cfg, SDB_OPT_raft_listen);
	const char *data_dir = sdb_config_get(cfg, SDB_OPT_data_dir);
	char host[256];
	int port, rc;
	char *end = NULL;
	meta *m;
	sdb_node_opts no;
	sdb_transport_opts to;
	uint8_t raft_key[32];
	bool raft_secure = false;
	wire_server_opts wo;
	char nodebuf[32];

	if (!listen || !node_id || !raft_listen || !data_dir)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"needs --node-id, --data-dir, --listen and --raft-listen");
	unsigned long long id = strtoull(node_id, &end, 10);
	if (!end || *end || id == 0)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"--node-id must be a positive integer, got %s", node_id);
	rc = sdb_addr_split(listen, host, sizeof host, &port, role->err, sizeof role->err);
	if (rc != 0)
		return rc;
	mongoc_init();
	snprintf(nodebuf, sizeof nodebuf, "%llu", id);
	sdb_log_set_thread("metadata", nodebuf);

	m = sdb_calloc(1, sizeof *m);
	m->role = role;
	m->id = id;
	m->raft_addr = sdb_strdup(raft_listen);
	m->max_chunks = sdb_config_get_int(cfg, SDB_OPT_max_chunks_per_command, 1000000);
	SDB_METRICS_REGISTER(m, meta_metrics, NULL);

	memset(&wo, 0, sizeof wo);
	wo.listen = listen;
	wo.role = "metadata";
	wo.max_connections = (int)sdb_config_get_int(cfg, SDB_OPT_max_connections, 10000);
	wo.role_data = m;
	wo.hello = hello_hook;
	wo.quiesce_ms = (uint64_t)sdb_config_get_int(cfg, SDB_OPT_shutdown_quiesce_ms, 0);
	/* issue #10: with --cluster-key-file only cluster members may run commands */
	rc = auth_cluster_setup(cfg, role->err, sizeof role->err);
	if (rc == 0) /* --raft-tls is bad usage in every role (auth/raftsec.h) */
		rc = auth_raft_check_mode(cfg, role->err, sizeof role->err);
	if (rc == 0) /* issue #10: TLS on the wire listener (tls/tls.h) */
		rc = tls_setup(cfg, "metadata", TLS_CLIENTS_INTERNAL, role->err, sizeof role->err);
	if (rc == 0) /* issue #21: the raft port's transport (auth/raftsec.h) */
		rc = auth_raft_setup(cfg, &to, raft_key, &raft_secure, role->err, sizeof role->err);
	if (rc == 0 && m->max_chunks < 1) /* 0 would refuse every shardCollection */
		rc = sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			      "--max-chunks-per-command must be at least 1, not %lld",
			      (long long)m->max_chunks);
	if (rc != 0) {
		free_meta(m);
		return rc;
	}
	wo.gate = auth_cluster_gate();
	wo.tls = tls_listener_get("metadata"); /* issue #10: NULL when not set up */
	rc = wire_server_new(role->loop, &wo, &m->srv, role->err, sizeof role->err);
	if (rc != 0) {
		free_meta(m);
		return rc;
	}
	/* The address drivers and peers use: --advertise when given (e.g. listening on
	 * 0.0.0.0), else the --listen host with the bound port. */
	if (sdb_config_get(cfg, SDB_OPT_advertise))
		m->wire_addr = sdb_strdup(sdb_config_get(cfg, SDB_OPT_advertise));
	else
		m->wire_addr = sdb_asprintf("%s:%d", host, wire_server_port(m->srv));

	memset(&no, 0, sizeof no);
	no.id = id;
	no.data_dir = data_dir;
	no.raft_addr = raft_listen;
	no.bootstrap = sdb_config_get(cfg, SDB_OPT_bootstrap_members);
	m->new_cluster = sdb_asprintf("%s/new-cluster", data_dir);
	no.bootstrap_marker = m->new_cluster;
	no.snapshot_threshold = (unsigned)sdb_config_get_int(cfg, SDB_OPT_raft_snapshot_threshold, 1024);
	no.election_timeout_ms =
		(unsigned)sdb_config_get_int(cfg, SDB_OPT_raft_election_timeout_ms, 1000);
	no.on_change = on_change;
	no.data = m;
	no.transport = raft_secure ? &to : NULL;
	rc = sdb_node_start(role->loop, &no, &m->node, role->err, sizeof role->err);
	OPENSSL_cleanse(raft_key, sizeof raft_key);
	if (rc != 0) {
		/* The runner runs the loop after a failed start: close the listener there. */
		wire_server_close(m->srv, 0, failed_start_closed, m);
		return rc;
	}

	for (size_t i = 0; i < sizeof write_cmds / sizeof write_cmds[0]; i++)
		wire_server_register(m->srv, write_cmds[i], h_write);
	for (size_t i = 0; i < sizeof read_cmds / sizeof read_cmds[0]; i++)
		wire_server_register(m->srv, read_cmds[i], h_read);
	wire_server_register(m->srv, "getRoutingTable", h_routing);
	wire_server_register(m->srv, "waitRoutingVersion", h_wait_routing);
	wire_server_register(m->srv, "addMember", h_member);
	wire_server_register(m->srv, "removeMember", h_member);
	wire_server_register(m->srv, "transferLeadership", h_transfer);
	wire_server_register(m->srv, "metadataStatus", h_status);
	m->rlpeers = meta_peers_start(role->loop, m->node, m->srv, rlpeers_of);

	uv_timer_init(role->loop, &m->tick);
	m->tick.data = m;
	uv_timer_start(&m->tick, tick_cb, 50, 50);
	uv_check_init(role->loop, &m->check);
	m->check.data = m;
	uv_check_start(&m->check, check_cb);
	m->handles_open = 3; /* tick, check, rlpeers */
	if (role->http)
		sdb_http_add_health(role->http, "metadata", health, m);
	update_gauges(m);
	role->impl = m;
	sdb_info("metadata: started", "wire=%s raft=%s data_dir=%s", m->wire_addr, raft_listen,
		 data_dir);
	return 0;
}

static void maybe_stopped(meta *m)
{
	if (m->handles_open > 0 || m->reg_inflight > 0 || m->node || m->srv ||
	    m->stopped_signalled)
		return;
	m->stopped_signalled = 1;
	sdb_role *role = m->role;
	role->impl = NULL;
	free_meta(m);
	sdb_role_stopped(role);
}

static void handle_closed(uv_handle_t *h)
{
	meta *m = h->data;
	m->handles_open--;
	maybe_stopped(m);
}

static void wire_closed(void *arg)
{
	meta *m = arg;
	m->srv = NULL;
	maybe_stopped(m);
}

static void node_closed(void *arg)
{
	meta *m = arg;
	m->node = NULL;
	wire_server_close(m->srv, (uint64_t)sdb_config_get_int(m->role->cfg,
							       SDB_OPT_shutdown_timeout_ms, 10000),
			  wire_closed, m);
}

/* Drain retry of the follower registration (work items finish within ~2 s). */
static void reg_drain(uv_timer_t *t)
{
	meta *m = t->data;
	if (m->reg_inflight > 0)
		return;
	uv_timer_stop(t);
	uv_close((uv_handle_t *)t, handle_closed);
}

static void stop_after_handover(meta *m);

/* Rolling restarts (issue #11): a leader that stops hands leadership to the most
 * up-to-date voter first (raft_transfer, dissertation §3.10), so the group never waits an
 * election timeout for a new leader. Bounded by libraft: the callback fires when the
 * target won or after an election timeout; either way the stop goes on. */
static void stop_transfer_done(void *arg, int status)
{
	meta *m = arg;
	uint64_t lid = 0;
	const char *laddr = NULL;

	sdb_node_leader(m->node, &lid, &laddr);
	if (status == 0)
		sdb_info("metadata: leadership transferred before stopping", "new_leader=%llu",
			 (unsigned long long)lid);
	else
		sdb_warn("metadata: leadership transfer before stopping did not complete",
			 "status=%d leader=%llu", status, (unsigned long long)lid);
	stop_after_handover(m);
}

static void metadata_stop(sdb_role *role)
{
	meta *m = role->impl;
	int rc;

	if (!m) {
		sdb_role_stopped(role);
		return;
	}
	if (raft_state(sdb_node_raft(m->node)) == RAFT_LEADER &&
	    sdb_node_raft(m->node)->configuration.n > 1) {
		sdb_info("metadata: leader stopping: transferring leadership", "term=%llu",
			 (unsigned long long)sdb_node_term(m->node));
		rc = sdb_node_transfer(m->node, 0, stop_transfer_done, m);
		if (rc == 0)
			return;
		sdb_warn("metadata: leadership transfer before stopping refused", "rc=%d", rc);
	}
	stop_after_handover(m);
}

/* The rest of a graceful stop, once this member is no longer the leader (or could not
 * hand leadership over). */
static void stop_after_handover(meta *m)
{
	sdb_role *role = m->role;

	m->stopping = 1;
	if (role->http)
		sdb_http_unroute(role->http, m);
	wake_waiters(m, true);
	meta_peers_stop(m->rlpeers, rlpeers_closed, m);
	uv_check_stop(&m->check);
	uv_close((uv_handle_t *)&m->check, handle_closed);
	/* reuse the tick timer to wait for registration work to drain */
	uv_timer_stop(&m->tick);
	uv_timer_start(&m->tick, reg_drain, 0, 20);
	/* Raft first: pending proposals complete (with errors) while the wire server can
	 * still send their replies; then the wire server drains and closes. */
	sdb_node_close(m->node, node_closed, m);
}

const sdb_role_def sdb_role_metadata = {
	.name = "metadata",
	.start = metadata_start,
	.stop = metadata_stop,
};
