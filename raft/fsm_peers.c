/* Rate-limit peer membership in the metadata state machine: see fsm_peers.h. */
#include "raft/fsm_peers.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "raft/migstate.h"

#define VERSION_KEY "ratelimit_peers_version"
#define TTL_MIN_MS 1000
#define TTL_MAX_MS 600000
#define ADDR_MAX 255
#define INSTANCE_MAX 64

static const char *arg_str(const bson_t *args, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, args, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

static int bad_value(bson_t *res, const char *fmt, const char *a)
{
	char msg[300];
	snprintf(msg, sizeof msg, fmt, a);
	bson_reinit(res);
	BSON_APPEND_DOUBLE(res, "ok", 0.0);
	BSON_APPEND_UTF8(res, "errmsg", msg);
	BSON_APPEND_INT32(res, "code", 2);
	BSON_APPEND_UTF8(res, "codeName", "BadValue");
	return 1;
}

/* Run one statement with up to two text and two int64 bindings (NULL/unused skipped by
 * the format: t = text, i = int64). Returns 0 or SDB_EIO; *changes gets the rows
 * changed when non-NULL. */
static int exec(sqlite3 *db, const char *sql, const char *fmt, const char *t1,
		const char *t2, int64_t i1, int64_t i2, int *changes)
{
	sqlite3_stmt *st = NULL;
	int rc, k = 1, ti = 0, ii = 0;

	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		sdb_error("fsm: prepare failed", "err=\"%s\"", sqlite3_errmsg(db));
		return SDB_EIO;
	}
	for (const char *p = fmt; *p; p++, k++) {
		if (*p == 't')
			sqlite3_bind_text(st, k, ti++ == 0 ? t1 : t2, -1, SQLITE_TRANSIENT);
		else
			sqlite3_bind_int64(st, k, ii++ == 0 ? i1 : i2);
	}
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
		sdb_error("fsm: exec failed", "err=\"%s\"", sqlite3_errmsg(db));
		return SDB_EIO;
	}
	if (changes != NULL)
		*changes = sqlite3_changes(db);
	return 0;
}

int64_t sdb_fsm_peers_version(sqlite3 *db)
{
	sqlite3_stmt *st = NULL;
	int64_t v = 0;

	if (sqlite3_prepare_v2(db, "SELECT v FROM meta WHERE k = '" VERSION_KEY "'", -1, &st,
			       NULL) != SQLITE_OK)
		return -1;
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

int64_t sdb_fsm_peers_next_expiry(sqlite3 *db, int64_t since_ms)
{
	sqlite3_stmt *st = NULL;
	int64_t v = INT64_MAX;

	if (sqlite3_prepare_v2(db,
			       "SELECT min(max(expires_ms, ? + ttl_ms)) FROM ratelimit_peers", -1,
			       &st, NULL) != SQLITE_OK)
		return INT64_MAX;
	sqlite3_bind_int64(st, 1, since_ms);
	if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

static int bump(sqlite3 *db, int64_t *version)
{
	int64_t v = sdb_fsm_peers_version(db);

	if (v < 0)
		return SDB_EIO;
	*version = v + 1;
	return exec(db,
		    "INSERT INTO meta(k, v) VALUES('" VERSION_KEY "', ?) ON CONFLICT(k) DO UPDATE"
		    " SET v = excluded.v",
		    "i", NULL, NULL, *version, 0, NULL);
}

/* The peers version after a write that changed `changes` rows: bumped (and stored) when
 * it changed any, else the current one as sdb_fsm_peers_version reads it (-1 when it
 * cannot). Stores it in *version. Returns 0, or SDB_EIO when the bump failed. */
static int version_after(sqlite3 *db, int changes, int64_t *version)
{
	if (changes > 0)
		return bump(db, version) != 0 ? SDB_EIO : 0;
	*version = sdb_fsm_peers_version(db);
	return 0;
}

int sdb_fsm_peers_is_op(const char *op)
{
	return op != NULL &&
	       (strcmp(op, "registerRatelimitPeer") == 0 ||
		strcmp(op, "deregisterRatelimitPeer") == 0 || strcmp(op, "expireRatelimitPeers") == 0);
}

/* The instance recorded for addr (copied into buf, n bytes) and, in *expires, the lease end
 * of addr (0 when not registered). Returns 1 when an instance is recorded, 0 when not,
 * SDB_EIO on a storage failure. */
static int holder(sqlite3 *db, const char *addr, char *buf, size_t n, int64_t *expires)
{
	sqlite3_stmt *st = NULL;
	int found = 0;

	*expires = 0;
	buf[0] = '\0';
	if (sqlite3_prepare_v2(db,
			       "SELECT p.expires_ms, i.instance FROM ratelimit_peers p LEFT JOIN"
			       " ratelimit_peer_instances i ON i.addr = p.addr WHERE p.addr = ?",
			       -1, &st, NULL) != SQLITE_OK)
		return SDB_EIO;
	sqlite3_bind_text(st, 1, addr, -1, SQLITE_TRANSIENT);
	if (sqlite3_step(st) == SQLITE_ROW) {
		*expires = sqlite3_column_int64(st, 0);
		if (sqlite3_column_type(st, 1) == SQLITE_TEXT) {
			snprintf(buf, n, "%s", (const char *)sqlite3_column_text(st, 1));
			found = 1;
		}
	}
	sqlite3_finalize(st);
	return found;
}

/* The entry's `instance`, or NULL when the entry predates
 * MIGSTATE_OP_VERSION_PEER_INSTANCE (no opVersion stamped by the leader, or a lower one):
 * such entries apply as before instance ids existed, on every member alike. */
static const char *entry_instance(const bson_t *args)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, args, "opVersion") || !BSON_ITER_HOLDS_NUMBER(&it) ||
	    bson_iter_as_int64(&it) < MIGSTATE_OP_VERSION_PEER_INSTANCE)
		return NULL;
	return arg_str(args, "instance");
}

static int op_register(sqlite3 *db, int64_t ts, const bson_t *args, bson_t *res)
{
	const char *addr = arg_str(args, "addr"), *kind = arg_str(args, "kind");
	const char *inst = entry_instance(args);
	int64_t ttl = 0, version, held_until;
	int changes = 0, rc;
	bson_iter_t it;
	sqlite3_stmt *st = NULL;
	int exists = 0;
	char cur[INSTANCE_MAX + 1];

	if (addr == NULL || addr[0] == '\0' || strlen(addr) > ADDR_MAX || strchr(addr, ':') == NULL)
		return bad_value(res, "registerRatelimitPeer needs addr: \"HOST:PORT\"%s", "");
	if (kind == NULL)
		kind = "ratelimit";
	if (strcmp(kind, "ratelimit") != 0 && strcmp(kind, "proxy") != 0)
		return bad_value(res, "registerRatelimitPeer: kind must be ratelimit or proxy, not %s",
				 kind);
	if (bson_iter_init_find(&it, args, "ttlMS") && BSON_ITER_HOLDS_NUMBER(&it))
		ttl = bson_iter_as_int64(&it);
	if (ttl < TTL_MIN_MS || ttl > TTL_MAX_MS)
		return bad_value(res, "registerRatelimitPeer needs ttlMS in 1000..600000%s", "");
	if (inst != NULL && (inst[0] == '\0' || strlen(inst) > INSTANCE_MAX))
		return bad_value(res, "registerRatelimitPeer: instance must be 1..64 bytes%s", "");
	if (inst != NULL) {
		rc = holder(db, addr, cur, sizeof cur, &held_until);
		if (rc < 0)
			return rc;
		if (rc == 1 && held_until > ts && strcmp(cur, inst) != 0) {
			char msg[400];
			snprintf(msg, sizeof msg,
				 "registerRatelimitPeer: %s is registered by another live process"
				 " (instance %s, lease ends in %lld ms); each member needs its own"
				 " --advertise address",
				 addr, cur, (long long)(held_until - ts));
			bson_reinit(res);
			BSON_APPEND_DOUBLE(res, "ok", 0.0);
			BSON_APPEND_UTF8(res, "errmsg", msg);
			BSON_APPEND_INT32(res, "code", 11000);
			BSON_APPEND_UTF8(res, "codeName", "DuplicateKey");
			/* how long the holder's lease still runs: a restarted member waits that
			 * long for a predecessor it replaces (src/ratelimit/membership.c) */
			BSON_APPEND_INT64(res, "leaseLeftMS", (int64_t)(held_until - ts));
			return 1;
		}
	}
	if (sqlite3_prepare_v2(db, "SELECT 1 FROM ratelimit_peers WHERE addr = ?", -1, &st, NULL) !=
	    SQLITE_OK)
		return SDB_EIO;
	sqlite3_bind_text(st, 1, addr, -1, SQLITE_TRANSIENT);
	exists = sqlite3_step(st) == SQLITE_ROW;
	sqlite3_finalize(st);
	rc = exec(db,
		  "INSERT INTO ratelimit_peers(addr, kind, expires_ms, registered_ms, ttl_ms)"
		  " VALUES(?1, ?2, ?3, ?4, ?3 - ?4) ON CONFLICT(addr) DO UPDATE SET"
		  " kind = excluded.kind, expires_ms = excluded.expires_ms, ttl_ms = excluded.ttl_ms",
		  "ttii", addr, kind, ts + ttl, ts, &changes);
	if (rc != 0)
		return rc;
	if (inst != NULL &&
	    exec(db,
		 "INSERT INTO ratelimit_peer_instances(addr, instance) VALUES(?, ?)"
		 " ON CONFLICT(addr) DO UPDATE SET instance = excluded.instance",
		 "tt", addr, inst, 0, 0, NULL) != 0)
		return SDB_EIO;
	if (!exists) {
		if (bump(db, &version) != 0)
			return SDB_EIO;
	} else {
		version = sdb_fsm_peers_version(db);
	}
	BSON_APPEND_INT64(res, "version", version);
	BSON_APPEND_INT64(res, "expiresMS", ts + ttl);
	BSON_APPEND_BOOL(res, "added", !exists);
	return 0;
}

/* deregisterRatelimitPeer {addr, instance}: remove the peer (with instance: only while
 * that instance holds it); res gets the version (bumped when it was removed) and removed.
 * Returns: 0, 1 without addr (res then is the BadValue error, bad_value), or SDB_EIO. */
static int op_deregister(sqlite3 *db, const bson_t *args, bson_t *res)
{
	const char *addr = arg_str(args, "addr"), *inst = entry_instance(args);
	int64_t version, held_until;
	int changes = 0, rc;
	char cur[INSTANCE_MAX + 1];

	if (addr == NULL || addr[0] == '\0')
		return bad_value(res, "deregisterRatelimitPeer needs addr: \"HOST:PORT\"%s", "");
	if (inst != NULL) {
		rc = holder(db, addr, cur, sizeof cur, &held_until);
		if (rc < 0)
			return rc;
		if (rc == 1 && strcmp(cur, inst) != 0) {
			/* another process holds the address now: not ours to remove */
			if (version_after(db, 0, &version) != 0)
				return SDB_EIO;
			BSON_APPEND_INT64(res, "version", version);
			BSON_APPEND_BOOL(res, "removed", false);
			return 0;
		}
	}
	if (exec(db, "DELETE FROM ratelimit_peers WHERE addr = ?", "t", addr, NULL, 0, 0,
		 &changes) != 0 ||
	    exec(db, "DELETE FROM ratelimit_peer_instances WHERE addr = ?", "t", addr, NULL, 0, 0,
		 NULL) != 0)
		return SDB_EIO;
	if (version_after(db, changes, &version) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(res, "version", version);
	BSON_APPEND_BOOL(res, "removed", changes > 0);
	return 0;
}

/* expireRatelimitPeers {sinceMS}: at ts (epoch ms) remove the peers whose lease ran out
 * (expires_ms <= ts) and whose ttl has also passed since sinceMS (sinceMS + ttl_ms <= ts);
 * res gets expired (their addrs, sorted) and the version (bumped when any went). Returns:
 * 0 or SDB_EIO. */
static int op_expire(sqlite3 *db, int64_t ts, const bson_t *args, bson_t *res)
{
	sqlite3_stmt *st = NULL;
	bson_t arr;
	bson_iter_t it;
	int n = 0, changes = 0;
	int64_t version, since = 0;
	char k[16];

	if (bson_iter_init_find(&it, args, "sinceMS") && BSON_ITER_HOLDS_NUMBER(&it))
		since = bson_iter_as_int64(&it);
	if (sqlite3_prepare_v2(db,
			       "SELECT addr FROM ratelimit_peers WHERE expires_ms <= ?1"
			       " AND ?2 + ttl_ms <= ?1 ORDER BY addr",
			       -1, &st, NULL) != SQLITE_OK)
		return SDB_EIO;
	sqlite3_bind_int64(st, 1, ts);
	sqlite3_bind_int64(st, 2, since);
	bson_append_array_begin(res, "expired", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", n++);
		BSON_APPEND_UTF8(&arr, k, (const char *)sqlite3_column_text(st, 0));
	}
	bson_append_array_end(res, &arr);
	sqlite3_finalize(st);
	if (exec(db, "DELETE FROM ratelimit_peers WHERE expires_ms <= ?1 AND ?2 + ttl_ms <= ?1",
		 "ii", NULL, NULL, ts, since, &changes) != 0)
		return SDB_EIO;
	if (changes > 0 &&
	    exec(db,
		 "DELETE FROM ratelimit_peer_instances WHERE addr NOT IN"
		 " (SELECT addr FROM ratelimit_peers)",
		 "", NULL, NULL, 0, 0, NULL) != 0)
		return SDB_EIO;
	if (version_after(db, changes, &version) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(res, "version", version);
	return 0;
}

int sdb_fsm_peers_apply(sqlite3 *db, const char *op, int64_t ts, const bson_t *args,
			bson_t *res)
{
	if (strcmp(op, "registerRatelimitPeer") == 0)
		return op_register(db, ts, args, res);
	if (strcmp(op, "deregisterRatelimitPeer") == 0)
		return op_deregister(db, args, res);
	return op_expire(db, ts, args, res);
}

int sdb_fsm_peers_query(sqlite3 *db, bson_t *reply)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	int64_t version = sdb_fsm_peers_version(db);

	if (version < 0)
		return SDB_EIO;
	if (sqlite3_prepare_v2(db,
			       "SELECT p.addr, p.kind, p.expires_ms, p.registered_ms, i.instance"
			       " FROM ratelimit_peers p LEFT JOIN ratelimit_peer_instances i"
			       " ON i.addr = p.addr ORDER BY p.addr",
			       -1, &st, NULL) != SQLITE_OK)
		return SDB_EIO;
	BSON_APPEND_INT64(reply, "version", version);
	bson_append_array_begin(reply, "peers", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "addr", (const char *)sqlite3_column_text(st, 0));
		BSON_APPEND_UTF8(&d, "kind", (const char *)sqlite3_column_text(st, 1));
		BSON_APPEND_INT64(&d, "expiresMS", sqlite3_column_int64(st, 2));
		BSON_APPEND_INT64(&d, "registeredMS", sqlite3_column_int64(st, 3));
		if (sqlite3_column_type(st, 4) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "instance", (const char *)sqlite3_column_text(st, 4));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}
