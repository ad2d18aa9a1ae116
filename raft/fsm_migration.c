/* The metadata state machine's migration records (register, update under the one
 * transition table of raft/migstate.h with expectState as compare-and-set, delete) and
 * leases. Command reference in src/metadata/README.md; internals in fsm_int.h. */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "raft/migstate.h"
#include "raft/fsm_peers.h"
#include "raft/routing.h"
#include "raft/fsm_int.h"

int fsm_op_register_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id"), *state = fsm_arg_str(&c->args, "state");
	const char *ns = fsm_arg_str(&c->args, "ns");
	char gen[64];
	if (!id) {
		/* Deterministic id from the log index. */
		snprintf(gen, sizeof gen, "mig-%llu", (unsigned long long)c->index);
		id = gen;
	}
	int64_t opv = 1;
	if (!state)
		state = "registered";
	if (fsm_arg_int(&c->args, "opVersion", &opv) && opv >= MIGSTATE_OP_VERSION &&
	    migrate_state_parse(state) != MIG_REGISTERED)
		return fsm_lerr(res, E_ILLEGAL, "a migration starts in state registered, not %s", state);
	int e = fsm_exists(f, "SELECT 1 FROM migrations WHERE id = ?", id);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_DUPLICATE, "migration %s already exists", id);
	if (fsm_x(f,
	      "INSERT INTO migrations(id, ns, state, version, spec, checkpoint, stats, created_ms,"
	      " updated_ms) VALUES(?, ?, ?, 1, ?, NULL, NULL, ?, ?)",
	      "tttbii", id, ns, state, bson_get_data(&c->args), (int)c->args.len, c->ts, c->ts))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "id", id);
	BSON_APPEND_UTF8(res, "state", state);
	BSON_APPEND_INT64(res, "version", 1);
	return 0;
}

int fsm_op_update_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id"), *state = fsm_arg_str(&c->args, "state");
	const char *expect = fsm_arg_str(&c->args, "expectState");
	bson_t cp, stats;
	int has_cp = fsm_arg_doc(&c->args, "checkpoint", &cp, 0);
	int has_stats = fsm_arg_doc(&c->args, "stats", &stats, 0);
	int64_t ver = 0, opv = 1;
	/* entries from MIGSTATE_OP_VERSION on are checked; older ones replay as they were */
	int checked = fsm_arg_int(&c->args, "opVersion", &opv) && opv >= MIGSTATE_OP_VERSION;
	if (!id)
		return fsm_lerr(res, E_BAD_VALUE, "updateMigration needs a string field id");
	sqlite3_stmt *st = fsm_q(f, "SELECT state, version FROM migrations WHERE id = ?", "t", id);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return fsm_lerr(res, E_NO_SUCH_KEY, "migration %s not found", id);
	}
	char cur[128];
	snprintf(cur, sizeof cur, "%s", (const char *)sqlite3_column_text(st, 0));
	ver = sqlite3_column_int64(st, 1);
	sqlite3_finalize(st);
	if (checked && !expect)
		return fsm_lerr(res, E_BAD_VALUE, "updateMigration needs expectState (the state %s is in)",
			    id);
	if (expect && strcmp(expect, cur) != 0) {
		fsm_lerr(res, E_WRITE_CONFLICT, "migration %s is in state %s, expected %s", id, cur,
		     expect);
		BSON_APPEND_UTF8(res, "currentState", cur);
		BSON_APPEND_INT64(res, "version", ver);
		return LOGICAL;
	}
	if (!state)
		state = cur;
	/* the one transition table (raft/migstate.h); the same state saves progress */
	if (checked && strcmp(state, cur) != 0 &&
	    !migrate_transition_ok(migrate_state_parse(cur), migrate_state_parse(state))) {
		fsm_lerr(res, E_ILLEGAL, "migration %s: illegal transition %s -> %s", id, cur, state);
		BSON_APPEND_UTF8(res, "currentState", cur);
		BSON_APPEND_INT64(res, "version", ver);
		return LOGICAL;
	}
	ver++;
	if (fsm_x(f, "UPDATE migrations SET state = ?, version = ?, updated_ms = ? WHERE id = ?", "tiit",
	      state, ver, c->ts, id))
		return SDB_EIO;
	if (has_cp && fsm_x(f, "UPDATE migrations SET checkpoint = ? WHERE id = ?", "bt",
			bson_get_data(&cp), (int)cp.len, id))
		return SDB_EIO;
	if (has_stats && fsm_x(f, "UPDATE migrations SET stats = ? WHERE id = ?", "bt",
			   bson_get_data(&stats), (int)stats.len, id))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "id", id);
	BSON_APPEND_UTF8(res, "previousState", cur);
	BSON_APPEND_UTF8(res, "state", state);
	BSON_APPEND_INT64(res, "version", ver);
	return 0;
}

int fsm_op_delete_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id");
	if (!id)
		return fsm_lerr(res, E_BAD_VALUE, "deleteMigration needs a string field id");
	int e = fsm_exists(f, "SELECT 1 FROM migrations WHERE id = ?", id);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NO_SUCH_KEY, "migration %s not found", id);
	return fsm_x(f, "DELETE FROM migrations WHERE id = ?", "t", id) ? SDB_EIO : 0;
}

/* Leases use the leader-stamped epoch ms (c->ts) so that expiry means the same on
 * every member and across leader changes. */
int fsm_op_lease(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name"), *holder = fsm_arg_str(&c->args, "holder");
	int64_t ttl = 0, expires = 0, epoch = 0;
	int found = 0;
	char cur[256] = "";
	if (!name || !holder)
		return fsm_lerr(res, E_BAD_VALUE, "%s needs name and holder", c->op);
	if (strcmp(c->op, "releaseLease") != 0 &&
	    (!fsm_arg_int(&c->args, "ttlMS", &ttl) || ttl <= 0 || ttl > 86400000))
		return fsm_lerr(res, E_BAD_VALUE, "%s needs ttlMS in 1..86400000", c->op);
	sqlite3_stmt *st =
		fsm_q(f, "SELECT holder, expires_ms, epoch FROM leases WHERE name = ?", "t", name);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) == SQLITE_ROW) {
		found = 1;
		snprintf(cur, sizeof cur, "%s", (const char *)sqlite3_column_text(st, 0));
		expires = sqlite3_column_int64(st, 1);
		epoch = sqlite3_column_int64(st, 2);
	}
	sqlite3_finalize(st);
	int live = found && expires > c->ts;
	int mine = found && strcmp(cur, holder) == 0;
	if (strcmp(c->op, "acquireLease") == 0) {
		if (live && !mine) {
			fsm_lerr(res, E_LOCK_BUSY, "lease %s is held by %s", name, cur);
			BSON_APPEND_UTF8(res, "holder", cur);
			BSON_APPEND_INT64(res, "expiresMS", expires);
			return LOGICAL;
		}
		if (!(live && mine))
			epoch++;
	} else if (strcmp(c->op, "renewLease") == 0) {
		if (!live || !mine)
			return fsm_lerr(res, E_LOCK_BUSY, "lease %s is not held by %s", name, holder);
	} else { /* releaseLease */
		if (!mine)
			return fsm_lerr(res, E_LOCK_BUSY, "lease %s is not held by %s", name, holder);
		if (fsm_x(f, "DELETE FROM leases WHERE name = ?", "t", name))
			return SDB_EIO;
		return 0;
	}
	expires = c->ts + ttl;
	if (fsm_x(f,
	      "INSERT INTO leases(name, holder, expires_ms, epoch) VALUES(?, ?, ?, ?)"
	      " ON CONFLICT(name) DO UPDATE SET holder = excluded.holder,"
	      " expires_ms = excluded.expires_ms, epoch = excluded.epoch",
	      "ttii", name, holder, expires, epoch))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "holder", holder);
	BSON_APPEND_INT64(res, "expiresMS", expires);
	BSON_APPEND_INT64(res, "epoch", epoch);
	return 0;
}
