/* The metadata state machine's migration records (register, update under the one
 * transition table of raft/migstate.h with expectState as compare-and-set, delete) and
 * leases. Command reference in src/metadata/README.md; internals in fsm_int.h. */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The chunk id of a migration spec or registerMigration args: an integer, or a decimal
 * string (how the coordinator reads it, src/coordinator/migrate_record.c). 1 and *out, or
 * 0 when the field is missing or neither. */
static int spec_chunk(const bson_t *spec, int64_t *out)
{
	const char *s;
	char *end;
	if (fsm_arg_int(spec, "chunk", out))
		return 1;
	if (!(s = fsm_arg_str(spec, "chunk")) || !*s)
		return 0;
	*out = strtoll(s, &end, 10);
	return *end == '\0';
}

/* fsm_int.h */
int fsm_active_migration_of_chunk(sdb_fsm *f, const char *ns, int64_t chunk, char *busy,
				  size_t n)
{
	sqlite3_stmt *st = fsm_q(f,
				 "SELECT id, state, spec FROM migrations WHERE ns = ? AND state NOT IN"
				 " ('complete', 'aborted', 'rolled_back') ORDER BY id",
				 "t", ns);
	int found = 0;
	if (!st)
		return SDB_EIO;
	while (!found && sqlite3_step(st) == SQLITE_ROW) {
		const char *state = (const char *)sqlite3_column_text(st, 1);
		const uint8_t *blob = sqlite3_column_blob(st, 2);
		int len = sqlite3_column_bytes(st, 2);
		bson_t spec;
		int64_t other;
		if (migrate_state_terminal(migrate_state_parse(state)) || !blob || len < 5 ||
		    !bson_init_static(&spec, blob, (size_t)len))
			continue;
		if (spec_chunk(&spec, &other) && other == chunk) {
			snprintf(busy, n, "%s", (const char *)sqlite3_column_text(st, 0));
			found = 1;
		}
	}
	sqlite3_finalize(st);
	return found;
}

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
	int64_t chunk;
	if (opv >= MIGSTATE_OP_VERSION_EXCLUSIVE && ns && spec_chunk(&c->args, &chunk)) {
		/* one active migration per chunk, decided here so two registrations racing
		 * from two proxies (or ctl and a proxy) cannot both be recorded */
		char busy[256];
		e = fsm_active_migration_of_chunk(f, ns, chunk, busy, sizeof busy);
		if (e < 0)
			return e;
		if (e) {
			fsm_lerr(res, E_CONFLICTING_OPERATION,
				 "chunk %lld of %s is already being migrated by %s; try again once "
				 "that migration has ended",
				 (long long)chunk, ns, busy);
			BSON_APPEND_UTF8(res, "activeMigration", busy);
			return LOGICAL;
		}
	}
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

int fsm_op_set_op_version(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t v, cur;
	if (!fsm_arg_int(&c->args, "version", &v) || v < MIGSTATE_OP_VERSION ||
	    v > MIGSTATE_OP_VERSION_MAX)
		return fsm_lerr(res, E_BAD_VALUE, "setOpVersion needs a version in %d..%d",
				MIGSTATE_OP_VERSION, MIGSTATE_OP_VERSION_MAX);
	if (fsm_meta_get(f, "op_version", &cur) != 0 || fsm_meta_set(f, "op_version", v) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(res, "previousVersion", cur ? cur : MIGSTATE_OP_VERSION);
	BSON_APPEND_INT64(res, "version", v);
	return 0;
}

/* Rows of proxies not pinged for this long are dropped by the next ping (ms). */
#define PROXY_FORGET_MS (7LL * 24 * 3600 * 1000)

int fsm_op_ping_proxy(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *addr = fsm_arg_str(&c->args, "addr"), *ver = fsm_arg_str(&c->args, "version");
	int64_t opv = 1, started = 0;
	if (!fsm_arg_int(&c->args, "opVersion", &opv) || opv < MIGSTATE_OP_VERSION_EXCLUSIVE)
		return fsm_lerr(res, E_ILLEGAL, "pingProxy needs cluster op version %d (setOpVersion)",
				MIGSTATE_OP_VERSION_EXCLUSIVE);
	if (!addr || !*addr)
		return fsm_lerr(res, E_BAD_VALUE, "pingProxy needs a string field addr");
	if (!fsm_arg_int(&c->args, "startedMS", &started) || started <= 0 || started > c->ts)
		started = c->ts;
	if (fsm_x(f,
		  "INSERT INTO proxies(addr, started_ms, ping_ms, version) VALUES(?, ?, ?, ?)"
		  " ON CONFLICT(addr) DO UPDATE SET started_ms = excluded.started_ms,"
		  " ping_ms = excluded.ping_ms, version = excluded.version",
		  "tiit", addr, started, c->ts, ver) ||
	    fsm_x(f, "DELETE FROM proxies WHERE ping_ms < ?", "i", c->ts - PROXY_FORGET_MS))
		return SDB_EIO;
	BSON_APPEND_INT64(res, "pingMS", c->ts);
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

int fsm_lease_held(sdb_fsm *f, const char *name, const char *holder, int64_t ts)
{
	sqlite3_stmt *st =
		fsm_q(f, "SELECT holder, expires_ms FROM leases WHERE name = ?", "t", name);
	int held = 0;

	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) == SQLITE_ROW)
		held = strcmp((const char *)sqlite3_column_text(st, 0), holder) == 0 &&
		       sqlite3_column_int64(st, 1) > ts;
	sqlite3_finalize(st);
	return held;
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
