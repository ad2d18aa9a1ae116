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

/* How one column of a query's row becomes a field of its document (row_append). */
typedef enum {
	COL_TEXT,     /* UTF-8 string */
	COL_TEXT_OPT, /* UTF-8 string; the field is left out when the column is NULL */
	COL_INT64,    /* whole number */
	COL_BOOL,     /* true when the integer column is not 0 */
	COL_DOC,      /* a BSON document stored as a blob (fsm_append_blob_doc) */
	COL_BINARY,   /* a blob as BSON binary (subtype 0) */
} col_kind;

/* Column i of a row is field name, of kind. */
typedef struct col_spec {
	const char *name;
	col_kind kind;
} col_spec;

#define N_COLS(a) (sizeof(a) / sizeof((a)[0]))

/* Append the current row of st (its columns in the order of cols) to d. */
static void row_append(bson_t *d, sqlite3_stmt *st, const col_spec *cols, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int c = (int)i;
		switch (cols[i].kind) {
		case COL_TEXT_OPT:
			if (sqlite3_column_type(st, c) != SQLITE_TEXT)
				break;
			/* fall through */
		case COL_TEXT:
			BSON_APPEND_UTF8(d, cols[i].name, (const char *)sqlite3_column_text(st, c));
			break;
		case COL_INT64:
			BSON_APPEND_INT64(d, cols[i].name, sqlite3_column_int64(st, c));
			break;
		case COL_BOOL:
			BSON_APPEND_BOOL(d, cols[i].name, sqlite3_column_int64(st, c) != 0);
			break;
		case COL_DOC:
			fsm_append_blob_doc(d, cols[i].name, sqlite3_column_blob(st, c),
					    sqlite3_column_bytes(st, c));
			break;
		case COL_BINARY:
			BSON_APPEND_BINARY(d, cols[i].name, BSON_SUBTYPE_BINARY,
					   sqlite3_column_blob(st, c),
					   (uint32_t)sqlite3_column_bytes(st, c));
			break;
		}
	}
}

/* Append every row of st (NULL: SDB_EIO, the statement could not be prepared) to reply as
 * the array field, one document a row (row_append with cols); finalizes st.
 * Returns: 0, or SDB_EIO when st is NULL. */
static int rows_to_array(bson_t *reply, const char *field, sqlite3_stmt *st,
			 const col_spec *cols, size_t n)
{
	bson_t arr, d;
	char k[16];
	int i = 0;

	if (!st)
		return SDB_EIO;
	bson_append_array_begin(reply, field, -1, &arr);
	while (sqlite3_step(st) == SQLITE_ROW) {
		snprintf(k, sizeof k, "%d", i++);
		bson_append_document_begin(&arr, k, -1, &d);
		row_append(&d, st, cols, n);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(reply, &arr);
	sqlite3_finalize(st);
	return 0;
}

/* The one row of st appended to reply as the document field; finalizes st. NULL st is
 * SDB_EIO; no row is SDB_ENOTFOUND ("<what> <key> not found" in err).
 * Returns: 0, SDB_EIO or SDB_ENOTFOUND. */
static int row_to_doc(bson_t *reply, const char *field, sqlite3_stmt *st, const col_spec *cols,
		      size_t n, const char *what, const char *key, char *err, size_t errlen)
{
	bson_t d;

	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "%s %s not found", what, key);
	}
	bson_append_document_begin(reply, field, -1, &d);
	row_append(&d, st, cols, n);
	bson_append_document_end(reply, &d);
	sqlite3_finalize(st);
	return 0;
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

/* A migration row (MIG_COLS). */
static const col_spec mig_cols[] = {
	{"id", COL_TEXT},	  {"ns", COL_TEXT_OPT},	       {"state", COL_TEXT},
	{"version", COL_INT64},	  {"spec", COL_DOC},	       {"checkpoint", COL_DOC},
	{"stats", COL_DOC},	  {"createdMS", COL_INT64},    {"updatedMS", COL_INT64},
};

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
	static const col_spec cols[] = {{"addr", COL_TEXT},
					{"startedMS", COL_INT64},
					{"pingMS", COL_INT64},
					{"version", COL_TEXT_OPT}};
	(void)cmd;
	(void)err;
	(void)errlen;
	return rows_to_array(reply, "proxies",
			     fsm_q(f, "SELECT addr, started_ms, ping_ms, version FROM proxies"
				      " ORDER BY addr", NULL),
			     cols, N_COLS(cols));
}

/* listShards (raft/fsm.h sdb_fsm_query). */
static int q_list_shards(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {{"id", COL_TEXT}, {"uri", COL_TEXT}, {"state", COL_TEXT}};
	(void)cmd;
	(void)err;
	(void)errlen;
	return rows_to_array(reply, "shards",
			     fsm_q(f, "SELECT id, uri, state FROM shards ORDER BY id", NULL), cols,
			     N_COLS(cols));
}

/* listDatabases (raft/fsm.h sdb_fsm_query). */
static int q_list_databases(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {
		{"name", COL_TEXT}, {"tenant", COL_TEXT_OPT}, {"primary", COL_TEXT_OPT}};
	(void)cmd;
	(void)err;
	(void)errlen;
	/* primary: the recorded primary shard, or (NULL: created before primaries were
	 * recorded, or before any shard) the lowest shard id */
	return rows_to_array(reply, "databases",
			     fsm_q(f, "SELECT name, tenant, coalesce(primary_shard, (SELECT min(id)"
				      " FROM shards)) FROM dbs ORDER BY name", NULL),
			     cols, N_COLS(cols));
}

/* listCollections (raft/fsm.h sdb_fsm_query). */
static int q_list_collections(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {{"ns", COL_TEXT}, {"key", COL_DOC}, {"hashed", COL_BOOL}};
	(void)err;
	(void)errlen;
	const char *db = fsm_arg_str(cmd, "db");
	return rows_to_array(
		reply, "collections",
		db ? fsm_q(f, "SELECT ns, key, hashed FROM colls WHERE db = ? ORDER BY ns", "t", db)
		   : fsm_q(f, "SELECT ns, key, hashed FROM colls ORDER BY ns", NULL),
		cols, N_COLS(cols));
}

/* getMigration (raft/fsm.h sdb_fsm_query). */
static int q_get_migration(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	const char *id = first_str(cmd);
	if (!id)
		return sdb_errf(err, errlen, SDB_EINVAL, "getMigration needs a migration id");
	return row_to_doc(reply, "migration",
			  fsm_q(f, "SELECT " MIG_COLS " FROM migrations WHERE id = ?", "t", id),
			  mig_cols, N_COLS(mig_cols), "migration", id, err, errlen);
}

/* listMigrations (raft/fsm.h sdb_fsm_query). */
static int q_list_migrations(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	const char *state = fsm_arg_str(cmd, "state");
	return rows_to_array(
		reply, "migrations",
		state ? fsm_q(f, "SELECT " MIG_COLS " FROM migrations WHERE state = ? ORDER BY id",
			      "t", state)
		      : fsm_q(f, "SELECT " MIG_COLS " FROM migrations ORDER BY id", NULL),
		mig_cols, N_COLS(mig_cols));
}

/* Append the meta counter users_version (bumped by every change of a user's credentials,
 * raft/fsm_auth.c) to reply as usersVersion, so that a reader can tell whether what it
 * cached of the users is current.
 * Returns: 0, or SDB_EIO when the counter cannot be read (reply is left as it was). */
static int append_users_version(sdb_fsm *f, bson_t *reply)
{
	int64_t uv;
	if (fsm_meta_get(f, "users_version", &uv) != 0)
		return SDB_EIO;
	BSON_APPEND_INT64(reply, "usersVersion", uv);
	return 0;
}

/* listTenants (raft/fsm.h sdb_fsm_query). */
static int q_list_tenants(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {
		{"name", COL_TEXT}, {"quota", COL_DOC}, {"policy", COL_DOC}};
	(void)cmd;
	(void)err;
	(void)errlen;
	if (append_users_version(f, reply) != 0)
		return SDB_EIO;
	return rows_to_array(reply, "tenants",
			     fsm_q(f, "SELECT name, quota, policy FROM tenants ORDER BY name", NULL),
			     cols, N_COLS(cols));
}

/* listUsers (raft/fsm.h sdb_fsm_query). */
static int q_list_users(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {{"name", COL_TEXT}, {"tenant", COL_TEXT}};
	(void)cmd;
	(void)err;
	(void)errlen;
	if (append_users_version(f, reply) != 0)
		return SDB_EIO;
	return rows_to_array(reply, "users",
			     fsm_q(f, "SELECT name, tenant FROM users ORDER BY name", NULL), cols,
			     N_COLS(cols));
}

/* getUser (raft/fsm.h sdb_fsm_query). */
static int q_get_user(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec user_cols[] = {
		{"name", COL_TEXT},	    {"tenant", COL_TEXT},	 {"mechanism", COL_TEXT},
		{"salt", COL_BINARY},	    {"iterations", COL_INT64}, {"storedKey", COL_BINARY},
		{"serverKey", COL_BINARY},
	};
	static const col_spec sha1_cols[] = {{"salt", COL_BINARY},
					     {"iterations", COL_INT64},
					     {"storedKey", COL_BINARY},
					     {"serverKey", COL_BINARY}};
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
	row_append(&d, st, user_cols, N_COLS(user_cols));
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
			row_append(&v, st, sha1_cols, N_COLS(sha1_cols));
			bson_append_document_end(&d, &v);
		}
	}
	bson_append_document_end(reply, &d);
	if (append_users_version(f, reply) != 0) {
		sqlite3_finalize(st);
		return SDB_EIO;
	}
	sqlite3_finalize(st);
	return 0;
}

/* listMembers (raft/fsm.h sdb_fsm_query). */
static int q_list_members(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	static const col_spec cols[] = {{"id", COL_INT64}, {"raft", COL_TEXT_OPT}, {"wire", COL_TEXT_OPT}};
	(void)cmd;
	(void)err;
	(void)errlen;
	return rows_to_array(reply, "registered",
			     fsm_q(f, "SELECT id, raft, wire FROM members ORDER BY id", NULL), cols,
			     N_COLS(cols));
}

/* getLease (raft/fsm.h sdb_fsm_query). */
static int q_get_lease(sdb_fsm *f, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	/* name first: the lease's own name as the query asked for it */
	static const col_spec cols[] = {
		{"name", COL_TEXT}, {"holder", COL_TEXT}, {"expiresMS", COL_INT64}, {"epoch", COL_INT64}};
	const char *n = first_str(cmd);
	if (!n)
		return sdb_errf(err, errlen, SDB_EINVAL, "getLease needs a lease name");
	return row_to_doc(reply, "lease",
			  fsm_q(f, "SELECT name, holder, expires_ms, epoch FROM leases WHERE name = ?",
				"t", n),
			  cols, N_COLS(cols), "lease", n, err, errlen);
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
