/* The metadata state machine's queries (sdb_fsm_query, raft/fsm.h): read-only views of
 * its tables, dispatched by a table of query names (issue #24: one file per concern of
 * raft/fsm.c). */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "raft/fsm_peers.h"
#include "raft/routing.h"
#include "raft/fsm_int.h"

static const char *first_str(const bson_t *cmd)
{
	bson_iter_t it;
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* getRoutingTable: full loads and diffs, by cursor (raft/routing.h, issue #26). */
static int query_routing(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	return fsm_routing_query(f->db, f->routing_version, cmd, reply, err, errlen);
}

int sdb_fsm_routing_changed(sdb_fsm *f, int64_t gt, bson_t *reply)
{
	return fsm_routing_changed_ns(f->db, f->routing_version, gt, reply);
}

static void append_migration(bson_t *out, const char *key, sqlite3_stmt *st)
{
	/* id, ns, state, version, spec, checkpoint, stats, created_ms, updated_ms */
	bson_t d;
	bson_append_document_begin(out, key, -1, &d);
	BSON_APPEND_UTF8(&d, "id", (const char *)sqlite3_column_text(st, 0));
	if (sqlite3_column_type(st, 1) == SQLITE_TEXT)
		BSON_APPEND_UTF8(&d, "ns", (const char *)sqlite3_column_text(st, 1));
	BSON_APPEND_UTF8(&d, "state", (const char *)sqlite3_column_text(st, 2));
	BSON_APPEND_INT64(&d, "version", sqlite3_column_int64(st, 3));
	fsm_append_blob_doc(&d, "spec", sqlite3_column_blob(st, 4), sqlite3_column_bytes(st, 4));
	fsm_append_blob_doc(&d, "checkpoint", sqlite3_column_blob(st, 5), sqlite3_column_bytes(st, 5));
	fsm_append_blob_doc(&d, "stats", sqlite3_column_blob(st, 6), sqlite3_column_bytes(st, 6));
	BSON_APPEND_INT64(&d, "createdMS", sqlite3_column_int64(st, 7));
	BSON_APPEND_INT64(&d, "updatedMS", sqlite3_column_int64(st, 8));
	bson_append_document_end(out, &d);
}

#define MIG_COLS "id, ns, state, version, spec, checkpoint, stats, created_ms, updated_ms"

/* listRatelimitPeers: the rate limiter's membership (raft/fsm_peers.h). */
static int q_list_ratelimit_peers(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err,
				  size_t errlen)
{
	(void)cmd;
	(void)err;
	(void)errlen;
	return sdb_fsm_peers_query(f->db, reply);
}

/* listProxies (raft/fsm.h sdb_fsm_query). */
static int q_list_proxies(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	st = fsm_q(f, "SELECT addr, started_ms, ping_ms, version FROM proxies ORDER BY addr",
		   NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "proxies", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "addr", (const char *)sqlite3_column_text(st, 0));
		BSON_APPEND_INT64(&d, "startedMS", sqlite3_column_int64(st, 1));
		BSON_APPEND_INT64(&d, "pingMS", sqlite3_column_int64(st, 2));
		if (sqlite3_column_type(st, 3) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "version",
					 (const char *)sqlite3_column_text(st, 3));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* listShards (raft/fsm.h sdb_fsm_query). */
static int q_list_shards(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	st = fsm_q(f, "SELECT id, uri, state FROM shards ORDER BY id", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "shards", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "id", (const char *)sqlite3_column_text(st, 0));
		BSON_APPEND_UTF8(&d, "uri", (const char *)sqlite3_column_text(st, 1));
		BSON_APPEND_UTF8(&d, "state", (const char *)sqlite3_column_text(st, 2));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* listDatabases (raft/fsm.h sdb_fsm_query). */
static int q_list_databases(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	/* primary: the recorded primary shard, or (NULL: created before primaries were
	 * recorded, or before any shard) the lowest shard id */
	st = fsm_q(f, "SELECT name, tenant, coalesce(primary_shard, (SELECT min(id) FROM"
		      " shards)) FROM dbs ORDER BY name", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "databases", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "name", (const char *)sqlite3_column_text(st, 0));
		if (sqlite3_column_type(st, 1) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "tenant", (const char *)sqlite3_column_text(st, 1));
		if (sqlite3_column_type(st, 2) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "primary", (const char *)sqlite3_column_text(st, 2));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* listCollections (raft/fsm.h sdb_fsm_query). */
static int q_list_collections(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)err;
	(void)errlen;

	const char *db = fsm_arg_str(cmd, "db");
	st = db ? fsm_q(f, "SELECT ns, key, hashed FROM colls WHERE db = ? ORDER BY ns", "t", db)
		: fsm_q(f, "SELECT ns, key, hashed FROM colls ORDER BY ns", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "collections", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "ns", (const char *)sqlite3_column_text(st, 0));
		fsm_append_blob_doc(&d, "key", sqlite3_column_blob(st, 1),
				sqlite3_column_bytes(st, 1));
		BSON_APPEND_BOOL(&d, "hashed", sqlite3_column_int64(st, 2) != 0);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* getMigration (raft/fsm.h sdb_fsm_query). */
static int q_get_migration(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;

	const char *id = first_str(cmd);
	if (!id)
		return sdb_errf(err, errlen, SDB_EINVAL, "getMigration needs a migration id");
	st = fsm_q(f, "SELECT " MIG_COLS " FROM migrations WHERE id = ?", "t", id);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "migration %s not found", id);
	}
	append_migration(reply, "migration", st);
	sqlite3_finalize(st);
	return 0;
}

/* listMigrations (raft/fsm.h sdb_fsm_query). */
static int q_list_migrations(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr;
	char k[16];
	int i = 0;
	(void)err;
	(void)errlen;

	const char *state = fsm_arg_str(cmd, "state");
	st = state ? fsm_q(f, "SELECT " MIG_COLS " FROM migrations WHERE state = ? ORDER BY id",
		       "t", state)
		   : fsm_q(f, "SELECT " MIG_COLS " FROM migrations ORDER BY id", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "migrations", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		append_migration(&arr, k, st);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* listTenants (raft/fsm.h sdb_fsm_query). */
static int q_list_tenants(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	int64_t uv;
	if (fsm_meta_get(f, "users_version", &uv) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(reply, "usersVersion", uv);
	st = fsm_q(f, "SELECT name, quota, policy FROM tenants ORDER BY name", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "tenants", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "name", (const char *)sqlite3_column_text(st, 0));
		fsm_append_blob_doc(&d, "quota", sqlite3_column_blob(st, 1),
				sqlite3_column_bytes(st, 1));
		fsm_append_blob_doc(&d, "policy", sqlite3_column_blob(st, 2),
				sqlite3_column_bytes(st, 2));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* listUsers (raft/fsm.h sdb_fsm_query). */
static int q_list_users(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	int64_t uv;
	if (fsm_meta_get(f, "users_version", &uv) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(reply, "usersVersion", uv);
	st = fsm_q(f, "SELECT name, tenant FROM users ORDER BY name", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "users", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "name", (const char *)sqlite3_column_text(st, 0));
		BSON_APPEND_UTF8(&d, "tenant", (const char *)sqlite3_column_text(st, 1));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* getUser (raft/fsm.h sdb_fsm_query). */
static int q_get_user(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t d;

	const char *u = first_str(cmd);
	if (!u)
		return sdb_errf(err, errlen, SDB_EINVAL, "getUser needs a user name");
	st = fsm_q(f,
	       "SELECT name, tenant, mechanism, salt, iterations, stored_key, server_key FROM"
	       " users WHERE name = ?",
	       "t", u);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "user %s not found", u);
	}
	bson_append_document_begin(reply, "user", -1, &d);
	BSON_APPEND_UTF8(&d, "name", (const char *)sqlite3_column_text(st, 0));
	BSON_APPEND_UTF8(&d, "tenant", (const char *)sqlite3_column_text(st, 1));
	BSON_APPEND_UTF8(&d, "mechanism", (const char *)sqlite3_column_text(st, 2));
	BSON_APPEND_BINARY(&d, "salt", BSON_SUBTYPE_BINARY, sqlite3_column_blob(st, 3),
			   (uint32_t)sqlite3_column_bytes(st, 3));
	BSON_APPEND_INT64(&d, "iterations", sqlite3_column_int64(st, 4));
	BSON_APPEND_BINARY(&d, "storedKey", BSON_SUBTYPE_BINARY, sqlite3_column_blob(st, 5),
			   (uint32_t)sqlite3_column_bytes(st, 5));
	BSON_APPEND_BINARY(&d, "serverKey", BSON_SUBTYPE_BINARY, sqlite3_column_blob(st, 6),
			   (uint32_t)sqlite3_column_bytes(st, 6));
	sqlite3_finalize(st);
	st = fsm_q(f,
	       "SELECT salt, iterations, stored_key, server_key FROM user_sha1 WHERE name = ?",
	       "t", u);
	if (!st) {
		bson_append_document_end(reply, &d);
		return SDB_EIO;
	}
	{
		bson_t m, v;
		int has1 = sqlite3_step(st) == SQLITE_ROW;
		bson_append_array_begin(&d, "mechanisms", -1, &m);
		if (has1)
			BSON_APPEND_UTF8(&m, "0", "SCRAM-SHA-1");
		BSON_APPEND_UTF8(&m, has1 ? "1" : "0", "SCRAM-SHA-256");
		bson_append_array_end(&d, &m);
		if (has1) {
			bson_append_document_begin(&d, "scramSha1", -1, &v);
			BSON_APPEND_BINARY(&v, "salt", BSON_SUBTYPE_BINARY,
					   sqlite3_column_blob(st, 0),
					   (uint32_t)sqlite3_column_bytes(st, 0));
			BSON_APPEND_INT64(&v, "iterations", sqlite3_column_int64(st, 1));
			BSON_APPEND_BINARY(&v, "storedKey", BSON_SUBTYPE_BINARY,
					   sqlite3_column_blob(st, 2),
					   (uint32_t)sqlite3_column_bytes(st, 2));
			BSON_APPEND_BINARY(&v, "serverKey", BSON_SUBTYPE_BINARY,
					   sqlite3_column_blob(st, 3),
					   (uint32_t)sqlite3_column_bytes(st, 3));
			bson_append_document_end(&d, &v);
		}
	}
	bson_append_document_end(reply, &d);
	{
		int64_t uv;
		if (fsm_meta_get(f, "users_version", &uv) != 0) {
			sqlite3_finalize(st);
			return SDB_EIO;
		}
		BSON_APPEND_INT64(reply, "usersVersion", uv);
	}
	sqlite3_finalize(st);
	return 0;
}

/* listMembers (raft/fsm.h sdb_fsm_query). */
static int q_list_members(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;
	(void)cmd;
	(void)err;
	(void)errlen;

	st = fsm_q(f, "SELECT id, raft, wire FROM members ORDER BY id", NULL);
	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, "registered", -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_INT64(&d, "id", sqlite3_column_int64(st, 0));
		if (sqlite3_column_type(st, 1) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "raft", (const char *)sqlite3_column_text(st, 1));
		if (sqlite3_column_type(st, 2) == SQLITE_TEXT)
			BSON_APPEND_UTF8(&d, "wire", (const char *)sqlite3_column_text(st, 2));
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* getLease (raft/fsm.h sdb_fsm_query). */
static int q_get_lease(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t d;

	const char *n = first_str(cmd);
	if (!n)
		return sdb_errf(err, errlen, SDB_EINVAL, "getLease needs a lease name");
	st = fsm_q(f, "SELECT holder, expires_ms, epoch FROM leases WHERE name = ?", "t", n);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "lease %s not found", n);
	}
	bson_append_document_begin(reply, "lease", -1, &d);
	BSON_APPEND_UTF8(&d, "name", n);
	BSON_APPEND_UTF8(&d, "holder", (const char *)sqlite3_column_text(st, 0));
	BSON_APPEND_INT64(&d, "expiresMS", sqlite3_column_int64(st, 1));
	BSON_APPEND_INT64(&d, "epoch", sqlite3_column_int64(st, 2));
	bson_append_document_end(reply, &d);
	sqlite3_finalize(st);
	return 0;
}

typedef int (*query_fn)(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err,
			size_t errlen);

static const struct {
	const char *name;
	query_fn fn;
} queries[] = {
	{"getRoutingTable", query_routing},
	{"listRatelimitPeers", q_list_ratelimit_peers},
	{"listProxies", q_list_proxies},
	{"listShards", q_list_shards},
	{"listDatabases", q_list_databases},
	{"listCollections", q_list_collections},
	{"getMigration", q_get_migration},
	{"listMigrations", q_list_migrations},
	{"listTenants", q_list_tenants},
	{"listUsers", q_list_users},
	{"getUser", q_get_user},
	{"listMembers", q_list_members},
	{"getLease", q_get_lease},
};

int sdb_fsm_query(sdb_fsm *f, const char *name, const bson_t *cmd, bson_t *reply, char *err,
		  size_t errlen)
{
	for (size_t i = 0; i < sizeof queries / sizeof queries[0]; i++)
		if (strcmp(queries[i].name, name) == 0)
			return queries[i].fn(f, cmd, reply, err, errlen);
	return sdb_errf(err, errlen, SDB_ENOTFOUND, "unknown metadata query %s", name);
}
