/* Command table of the shard role and helpers shared by the command files. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/cmdopts.h"
#include "common/loopread.h"
#include "common/log.h"
#include "common/metrics.h"
#include "shard/members.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "storage/collation.h"
#include "shard/snapfile.h"
#include "shard/txn.h"
#include "shard/util.h"

typedef struct cmd_entry {
	const char *name;
	shard_cmd_fn fn;
} cmd_entry;

static const cmd_entry cmd_table[] = {
	{"find", shard_cmd_find},
	{"getMore", shard_cmd_getmore},
	{"killCursors", shard_cmd_killcursors},
	{"count", shard_cmd_count},
	{"distinct", shard_cmd_distinct},
	{"aggregate", shard_cmd_aggregate},
	{"explain", shard_cmd_explain},
	{"stripedbSnapshot", shard_cmd_snapshot},
	{"insert", shard_cmd_insert},
	{"update", shard_cmd_update},
	{"delete", shard_cmd_delete},
	{"findAndModify", shard_cmd_findandmodify},
	{"findandmodify", shard_cmd_findandmodify},
	{"create", shard_cmd_create},
	{"collMod", shard_cmd_coll_mod},
	{"drop", shard_cmd_drop},
	{"renameCollection", shard_cmd_rename_collection},
	{"createIndexes", shard_cmd_create_indexes},
	{"dropIndexes", shard_cmd_drop_indexes},
	{"deleteIndexes", shard_cmd_drop_indexes},
	{"listIndexes", shard_cmd_list_indexes},
	{"listCollections", shard_cmd_list_collections},
	{"listDatabases", shard_cmd_list_databases},
	{"dropDatabase", shard_cmd_drop_database},
	{"collStats", shard_cmd_coll_stats},
	{"dbStats", shard_cmd_db_stats},
	{"validate", shard_cmd_validate},
	{"stripedbSetVersion", shard_cmd_set_version},
	{"stripedbSetFiltering", shard_cmd_set_filtering},
	{"stripedbGetFiltering", shard_cmd_get_filtering},
	{"stripedbListFiltering", shard_cmd_list_filtering},
	{"stripedbCheck", shard_cmd_check},
	{"appendOplogNote", shard_cmd_append_oplog_note},
	{"stripedbSnapshotFile", shard_cmd_snapshot_file},
	{"stripedbStmtResult", shard_cmd_stmt_result},
	{"stripedbSessionList", shard_cmd_session_list},
	{"commitTransaction", shard_cmd_txn_refuse},
	{"abortTransaction", shard_cmd_txn_refuse},
};

#define N_CMDS (sizeof cmd_table / sizeof cmd_table[0])

static sdb_counter *cmd_counters[N_CMDS];

/* Commands whose first value names a collection, and which of them write. */
static const struct {
	const char *name;
	bool write;
} ns_cmds[] = {
	{"count", false},	  {"distinct", false},	     {"aggregate", false},
	{"insert", true},	  {"update", true},	     {"delete", true},
	{"findAndModify", true},  {"findandmodify", true},   {"create", true},
	{"createIndexes", true},  {"dropIndexes", true},     {"deleteIndexes", true},
	{"drop", true},		  {"collMod", true},
};

/* Refuse namespaces the embedded shard keeps for itself before a worker sees them:
 * local.oplog.rs (read by find/getMore only: it is not a collection here, so a count or
 * an aggregate would silently see nothing) and writes to system.* collections (mongod:
 * "cannot write to 'db.system.x'", InvalidNamespace 73). Loop thread. True if answered. */
static bool refuse_reserved_ns(wire_req *req, const char *name)
{
	const bson_t *cmd = wire_req_cmd(req);
	const char *db = wire_req_db(req);
	bson_iter_t it;
	const char *coll;
	bool write = false, known = false;

	for (size_t i = 0; i < sizeof ns_cmds / sizeof ns_cmds[0]; i++) {
		if (strcmp(ns_cmds[i].name, name) == 0) {
			known = true;
			write = ns_cmds[i].write;
			break;
		}
	}
	if (!known || !bson_iter_init(&it, cmd) || !bson_iter_next(&it) ||
	    !BSON_ITER_HOLDS_UTF8(&it))
		return false; /* the command reports a bad namespace itself */
	coll = bson_iter_utf8(&it, NULL);
	if (strcmp(db, "local") == 0 && strcmp(coll, "oplog.rs") == 0) {
		if (write)
			wire_req_error(req, WIRE_ERR_INVALID_NAMESPACE,
				       "cannot write to 'local.oplog.rs': the oplog is written by "
				       "the shard only");
		else
			wire_req_error(req, 115,
				       "%s on local.oplog.rs is not supported by the embedded "
				       "shard; read the oplog with find (tailable cursors)",
				       name);
		return true;
	}
	if (write && strncmp(coll, "system.", 7) == 0) {
		wire_req_error(req, WIRE_ERR_INVALID_NAMESPACE, "cannot write to '%s.%s'", db, coll);
		return true;
	}
	return false;
}

/* Options the shard would otherwise ignore (a non-simple collation, let, sort in an update
 * statement) are refused before a worker sees the request: common/cmdopts.h. */
static bool refuse_ignored_in_cmd(wire_req *req, const char *name)
{
	char err[256];
	int code = sdb_cmd_check(name, wire_req_cmd(req), true, err, sizeof err);

	if (code == 0)
		return false;
	wire_req_error(req, code, "%s", err);
	return true;
}

/* Commands that change the shard's state: each is a Raft log entry (repl.h). */
static const char *const write_cmds[] = {
	"insert",	 "update",	  "delete",	 "findAndModify", "findandmodify",
	"create",	 "drop",	  "createIndexes", "dropIndexes",	  "deleteIndexes",
	"dropDatabase", "stripedbSetVersion", "stripedbSetFiltering", "stripedbApplyTxn",
	"renameCollection", "collMod", "appendOplogNote",
};

bool shard_cmd_is_write(const char *name)
{
	for (size_t i = 0; i < sizeof write_cmds / sizeof write_cmds[0]; i++)
		if (strcmp(write_cmds[i], name) == 0)
			return true;
	return false;
}

shard_cmd_fn shard_cmd_lookup(const char *name)
{
	/* a transaction's commit, proposed by the primary (txn.c): applied from the log
	 * only, never registered with the wire server */
	if (strcmp(name, "stripedbApplyTxn") == 0)
		return shard_cmd_apply_txn;
	for (size_t i = 0; i < N_CMDS; i++)
		if (strcmp(cmd_table[i].name, name) == 0)
			return cmd_table[i].fn;
	return NULL;
}

/* May req run on the loop thread (shard_pool_run_inline)? A find whose filter names _id
 * at its top level, without a hint: likely a point read. This only saves queueing what
 * would be deferred; the find decides by its plan (sdb_query_is_point) and defers what
 * is not a point read. A plan bounds the documents read, not the work per document: a
 * find with `let`, an expression in its filter ($expr) or a projection that is not plain
 * (projection_plain) can run for as long as its expressions do, which on the loop thread
 * would hold Raft's heartbeats (an election) and ignore maxTimeMS and killOp: a worker
 * runs those, and commands over SDB_LOOP_READ_MAX_CMD_BYTES. */
static bool read_inline_candidate(wire_req *req)
{
	bson_iter_t it, f;
	const bson_t *cmd = wire_req_cmd(req);

	if (strcmp(wire_req_name(req), "find") != 0 || cmd->len > SDB_LOOP_READ_MAX_CMD_BYTES)
		return false;
	if (wire_req_cmd_find(req, "hint", &it) || wire_req_cmd_find(req, "let", &it))
		return false;
	if (wire_req_cmd_find(req, "projection", &it) &&
	    (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &f) ||
	     !sdb_projection_plain(&f)))
		return false;
	if (!wire_req_cmd_find(req, "filter", &it) || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &f) || !bson_iter_find(&f, "_id"))
		return false;
	return bson_iter_recurse(&it, &f) && !sdb_filter_has_expr(&f);
}

void shard_cmd_run_read(shard *sh, wire_req *req, shard_cmd_fn fn)
{
	/* $currentOp: the op documents are taken here, on the loop thread, for the worker
	 * (currentop.c) */
	if (strcmp(wire_req_name(req), "aggregate") == 0 && shard_curop_stage_dispatch(sh, req))
		return;
	if (read_inline_candidate(req))
		shard_pool_run_inline(sh, fn, req);
	else
		shard_pool_submit(sh, fn, req);
}

static void dispatch(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	const char *name = wire_req_name(req);
	for (size_t i = 0; i < N_CMDS; i++) {
		if (strcmp(cmd_table[i].name, name) == 0) {
			sdb_counter_inc(cmd_counters[i]);
			if (refuse_reserved_ns(req, name) || refuse_ignored_in_cmd(req, name))
				return;
			if (shard_txn_wants(req)) {
				/* a statement of a multi-document transaction, or its end */
				shard_txn_dispatch(sh, req);
				return;
			}
			if (shard_cmd_is_write(name)) {
				/* explain of a write only plans it: a read */
				if (shard_repl_check_write(sh->repl, req) &&
				    !shard_txn_retryable_check(sh, req))
					shard_pool_submit_write(sh, req);
				return;
			}
			if (shard_repl_check_read(sh->repl, req) &&
			    shard_repl_read_concern(sh->repl, req, cmd_table[i].fn))
				shard_cmd_run_read(sh, req, cmd_table[i].fn);
			return;
		}
	}
	wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND, "no such command: '%s'", name);
}

static void dispatch_register(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	shard_repl_cmd_register(sh->repl, req);
}

/* {replSetGetStatus: 1}: this member's view of its set (MongoDB's shape, in part). */
static void dispatch_status(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	bson_t *reply = bson_new();
	shard_repl_status(sh->repl, reply);
	wire_req_reply(req, reply);
}

/* stripedb_shard_{keys,docs}_examined_total: the storage's query totals
 * (sdb_query_totals: every query of the process, added when it is freed), folded in at
 * each /metrics render. Hooks run one at a time, so the last values need no lock. */
static void examined_hook(void *arg)
{
	static sdb_counter *ck, *cd, *cr;
	static uint64_t last_k, last_d, last_r;
	(void)arg;
	if (!ck) {
		ck = sdb_metrics_counter("stripedb_shard_keys_examined_total",
					 "Index keys examined by the shard's queries (explain's "
					 "totalKeysExamined, summed)",
					 NULL);
		cd = sdb_metrics_counter("stripedb_shard_docs_examined_total",
					 "Documents examined by the shard's queries (explain's "
					 "totalDocsExamined, summed)",
					 NULL);
		cr = sdb_metrics_counter("stripedb_shard_docs_returned_total",
					 "Documents returned by the shard's queries (explain's "
					 "nReturned, summed)",
					 NULL);
	}
	uint64_t k, d, r;
	sdb_query_totals(&k, &d, &r);
	sdb_counter_add(cr, r - last_r);
	last_r = r;
	sdb_counter_add(ck, k - last_k);
	sdb_counter_add(cd, d - last_d);
	last_k = k;
	last_d = d;
}

void shard_register_commands(shard *sh)
{
	static atomic_int hooked;
	if (atomic_exchange(&hooked, 1) == 0)
		sdb_metrics_add_hook(examined_hook, NULL);
	for (size_t i = 0; i < N_CMDS; i++) {
		char labels[96];
		snprintf(labels, sizeof labels, "role=\"shard\",cmd=\"%s\"", cmd_table[i].name);
		cmd_counters[i] = sdb_metrics_counter("stripedb_shard_commands_total",
						      "Commands received by the shard role", labels);
		wire_server_register(sh->srv, cmd_table[i].name, dispatch);
	}
	wire_server_refuse_js(sh->srv); /* mapReduce, eval, group: 59, as the proxy */
	wire_server_register(sh->srv, "stripedbRegisterMember", dispatch_register);
	wire_server_register(sh->srv, "replSetGetStatus", dispatch_status);
	shard_currentop_register(sh);
	shard_members_register(sh);
}

void shard_fail(shard_ctx *x, int code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	sdb_store_rollback(x->conn);
	wire_req_error(x->req, code, "%s", msg);
}

int shard_code_of(int rc)
{
	switch (rc) {
	case SDB_EEXISTS:
		return WIRE_ERR_DUPLICATE_KEY;
	case SDB_ENOTFOUND:
		return WIRE_ERR_NAMESPACE_NOT_FOUND;
	case SDB_EINVAL:
		return WIRE_ERR_BAD_VALUE;
	case SDB_ESTALE:
		return WIRE_ERR_STALE_CONFIG;
	case SDB_ETOOBIG:
		return WIRE_ERR_BSON_TOO_LARGE;
	default:
		return WIRE_ERR_INTERNAL;
	}
}

bool shard_refuse_view(shard_ctx *x, const char *coll)
{
	const sdb_store_coll *co = NULL;
	bson_iter_t it;

	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) == 0 && co != NULL &&
	    bson_iter_init_find(&it, co->options, "viewOn")) {
		shard_fail(x, 166, "Namespace %s.%s is a view, not a collection", x->db, coll);
		return true;
	}
	return false;
}

static bool begin_checked(shard_ctx *x, bool write)
{
	int rc = sdb_store_begin(x->conn, write, x->err, sizeof x->err);
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return false;
	}
	if (!x->chunk)
		return !x->sv_ns || shard_filtering_gate(x);
	int64_t stored = 0;
	rc = sdb_store_version_check(x->conn, x->chunk, x->token, &stored, x->err,
				     sizeof x->err);
	if (rc == SDB_ESTALE) {
		sdb_store_rollback(x->conn);
		bson_t *extra = bson_new();
		BSON_APPEND_UTF8(extra, "chunk", x->chunk);
		BSON_APPEND_INT64(extra, "storedToken", stored);
		BSON_APPEND_INT64(extra, "requestToken", x->token);
		wire_req_error_extra(x->req, WIRE_ERR_STALE_CONFIG, extra,
				     "StaleConfig: chunk %s has version token %lld, the request "
				     "carries %lld",
				     x->chunk, (long long)stored, (long long)x->token);
		return false;
	}
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: %s", x->err);
		return false;
	}
	return !x->sv_ns || shard_filtering_gate(x);
}

int shard_collation_set(shard_ctx *x, const char *coll, const bson_t *holder)
{
	const sdb_collator *c = NULL;
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	int code = 0;

	if (holder && util_cmd_find(x->req, holder, "collation", &it)) {
		if (sdb_collation_parse(&it, &c, &code, x->err, sizeof x->err) != 0)
			return code ? code : WIRE_ERR_BAD_VALUE;
	} else if (coll && sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) == 0 && co &&
		   bson_iter_init_find(&it, co->options, "collation") &&
		   sdb_collation_parse(&it, &c, &code, x->err, sizeof x->err) != 0) {
		c = NULL; /* checked by create: cannot happen; compare binary */
	}
	sdb_collation_use(c);
	return 0;
}

/* The commands whose strings compare under a collation (issue #20): the command's own
 * `collation` (update and delete: each statement's, cmd_write.c), else the collection's. */
static const char *const collated_cmds[] = {"find",   "count",	       "distinct",
					    "aggregate", "findAndModify", "findandmodify",
					    "update", "delete"};

/* The commands that take MongoDB 6.0's collectionUUID (find_command.idl,
 * aggregate_command.idl, count_command.idl, distinct_command.idl, write_ops.idl with
 * findAndModify's, drop.idl): checked by shard_begin. createIndexes and dropIndexes with
 * the field are refused (238) by cmdopts.c. */
static const char *const uuid_cmds[] = {"find",	  "aggregate", "count",	       "distinct",
					"insert", "update",    "delete",       "findAndModify",
					"findandmodify", "drop"};

/* collectionUUID (MongoDB 6.0 collection_uuid_mismatch.cpp): the command runs only when
 * db.coll exists and has that UUID; else 361 CollectionUUIDMismatch with {db,
 * collectionUUID, expectedCollection, actualCollection (the collection of db that has the
 * UUID, or null)}, rolled back, nothing done. A view has no UUID (listCollections shows
 * none in MongoDB). cmdopts.c checked the field's type. Returns: true to run the command,
 * false after replying. */
static bool coll_uuid_check(shard_ctx *x, const char *coll)
{
	const sdb_store_coll *co = NULL;
	bson_iter_t it, vit;
	const uint8_t *want = NULL;
	uint32_t len = 0;
	bson_subtype_t sub;
	char **names = NULL, hex[40];
	size_t nn = 0;
	const char *actual = NULL;
	bool ok;

	if (!util_ctx_find(x, "collectionUUID", &it))
		return true;
	/* cmdopts.c refuses another type; refused here too, so that a command without that
	 * type rule never runs unchecked (review: drop ran with collectionUUID: "x") */
	if (!BSON_ITER_HOLDS_BINARY(&it)) {
		shard_fail(x, 14, "BSON field 'collectionUUID' is the wrong type '%s', expected a UUID",
			   sdb_bson_type_name(bson_iter_type(&it)));
		return false;
	}
	bson_iter_binary(&it, &sub, &len, &want);
	if (sub != BSON_SUBTYPE_UUID || len != 16) {
		shard_fail(x, 14, "BSON field 'collectionUUID' is the wrong type 'binData', "
				  "expected a UUID (binData subtype 4)");
		return false;
	}
	if (coll == NULL) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "collectionUUID is not supported on a collectionless command");
		return false;
	}
	ok = sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) == 0 && co &&
	     !bson_iter_init_find(&vit, co->options, "viewOn") && memcmp(co->uuid, want, 16) == 0;
	if (ok)
		return true;
	sdb_store_coll_list(x->conn, x->db, &names, &nn, NULL, 0);
	for (size_t i = 0; i < nn && actual == NULL; i++) {
		const sdb_store_coll *o = NULL;
		if (sdb_store_coll_get(x->conn, x->db, names[i * 2 + 1], &o, NULL, 0) == 0 && o &&
		    !bson_iter_init_find(&vit, o->options, "viewOn") && memcmp(o->uuid, want, 16) == 0)
			actual = names[i * 2 + 1];
	}
	for (int i = 0; i < 16; i++)
		snprintf(hex + i * 2, 3, "%02x", want[i]);
	bson_t *extra = bson_new();
	BSON_APPEND_UTF8(extra, "db", x->db);
	bson_append_binary(extra, "collectionUUID", -1, BSON_SUBTYPE_UUID, want, 16);
	BSON_APPEND_UTF8(extra, "expectedCollection", coll);
	if (actual)
		BSON_APPEND_UTF8(extra, "actualCollection", actual);
	else
		BSON_APPEND_NULL(extra, "actualCollection");
	sdb_store_rollback(x->conn);
	wire_req_error_extra(x->req, WIRE_ERR_COLLECTION_UUID_MISMATCH, extra,
			     "Collection UUID %.8s-%.4s-%.4s-%.4s-%.12s does not match that of the "
			     "collection %s.%s%s%s%s%s",
			     hex, hex + 8, hex + 12, hex + 16, hex + 20, x->db, coll,
			     actual ? ": it is the UUID of " : "", actual ? x->db : "",
			     actual ? "." : "", actual ? actual : "");
	sdb_store_names_free(names, nn);
	return false;
}

bool shard_begin(shard_ctx *x, bool write)
{
	bson_iter_t it;
	const char *name, *coll = NULL;

	if (!begin_checked(x, write))
		return false;
	if (!bson_iter_init(&it, x->cmd) || !bson_iter_next(&it))
		return true;
	name = bson_iter_key(&it);
	for (size_t i = 0; i < sizeof uuid_cmds / sizeof uuid_cmds[0]; i++)
		if (strcmp(uuid_cmds[i], name) == 0 &&
		    !coll_uuid_check(x, BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL)
								 : NULL))
			return false;
	const bson_t *holder = x->cmd;
	bson_t inner, stmt;
	if (strcmp(name, "explain") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		/* the explained command's collation: it is planned as it would run (an
		 * update or delete: its first statement's, the one explain plans) */
		bson_iter_t f, arr;

		if (!util_iter_bson(&it, &inner) || !bson_iter_init(&f, &inner) ||
		    !bson_iter_next(&f))
			return true;
		it = f;
		name = bson_iter_key(&it);
		holder = &inner;
		if ((strcmp(name, "update") == 0 || strcmp(name, "delete") == 0) &&
		    bson_iter_init_find(&f, &inner,
					strcmp(name, "update") == 0 ? "updates" : "deletes") &&
		    BSON_ITER_HOLDS_ARRAY(&f) && bson_iter_recurse(&f, &arr) &&
		    bson_iter_next(&arr) && BSON_ITER_HOLDS_DOCUMENT(&arr) &&
		    util_iter_bson(&arr, &stmt))
			holder = &stmt;
	}
	if (BSON_ITER_HOLDS_UTF8(&it))
		coll = bson_iter_utf8(&it, NULL);
	for (size_t i = 0; i < sizeof collated_cmds / sizeof collated_cmds[0]; i++)
		if (strcmp(collated_cmds[i], name) == 0) {
			int code = shard_collation_set(x, coll, holder);

			if (code)
				shard_fail(x, code, "%s", x->err);
			return code == 0;
		}
	return true;
}

bool shard_commit(shard_ctx *x)
{
	int rc = sdb_store_commit(x->conn, x->err, sizeof x->err);
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "shard: commit: %s", x->err);
		return false;
	}
	if (!x->in_txn) /* a tentative statement is rolled back: nothing to tail */
		shard_oplog_notify(x->sh);
	return true;
}

const char *shard_coll_arg(shard_ctx *x)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, x->cmd) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it)) {
		shard_fail(x, WIRE_ERR_INVALID_NAMESPACE,
			   "collection name has invalid type %s",
			   "(expected a string)");
		return NULL;
	}
	const char *c = bson_iter_utf8(&it, NULL);
	if (!*c) {
		shard_fail(x, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace specified '%s.'",
			   x->db);
		return NULL;
	}
	return c;
}
