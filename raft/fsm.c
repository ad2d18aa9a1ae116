/* The metadata state machine on SQLite. Contract in fsm.h; command reference in
 * src/metadata/README.md. */
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

/* MongoDB error codes carried in results (src/mongo/base/error_codes.yml). */
#define E_BAD_VALUE 2, "BadValue"
#define E_NO_SUCH_KEY 4, "NoSuchKey"
#define E_USER_NOT_FOUND 11, "UserNotFound"
#define E_ILLEGAL 20, "IllegalOperation"
#define E_NS_NOT_FOUND 26, "NamespaceNotFound"
#define E_LOCK_BUSY 46, "LockBusy"
#define E_NS_EXISTS 48, "NamespaceExists"
#define E_SHARD_NOT_FOUND 70, "ShardNotFound"
#define E_WRITE_CONFLICT 112, "WriteConflict"
#define E_DUPLICATE 11000, "DuplicateKey"
#define E_FAILED_TO_PARSE 9, "FailedToParse"

#define LOGICAL 1 /* op outcome: a logical error, result already filled */

struct sdb_fsm {
	sqlite3 *db;
	struct raft_fsm vt;
	struct raft *raft;
	uint64_t last_applied;
	int64_t routing_version;
	bson_t *last_result;
	char *wire_cache;
};

typedef struct cmdctx {
	const char *op;
	int64_t ts;       /* leader-stamped epoch ms */
	bson_t args;      /* view */
	uint64_t index;   /* log index */
} cmdctx;

/* ---------------------------------------------------------------- sql helpers */

/* Bind values by a format string: t = text (const char *), i = int64, b = blob
 * (const uint8_t *, int len), n = null. */
static int vbind(sqlite3_stmt *st, const char *fmt, va_list ap)
{
	int i = 1;
	int rc = SQLITE_OK;
	for (const char *p = fmt; p && *p && rc == SQLITE_OK; p++, i++) {
		switch (*p) {
		case 't': {
			const char *s = va_arg(ap, const char *);
			rc = s ? sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT)
			       : sqlite3_bind_null(st, i);
			break;
		}
		case 'i':
			rc = sqlite3_bind_int64(st, i, va_arg(ap, int64_t));
			break;
		case 'b': {
			const uint8_t *b = va_arg(ap, const uint8_t *);
			int len = va_arg(ap, int);
			rc = b ? sqlite3_bind_blob(st, i, b, len, SQLITE_TRANSIENT)
			       : sqlite3_bind_null(st, i);
			break;
		}
		default:
			rc = sqlite3_bind_null(st, i);
			break;
		}
	}
	return rc;
}

/* Prepare and bind; NULL on failure (logged). */
static sqlite3_stmt *q(sdb_fsm *f, const char *sql, const char *fmt, ...)
{
	sqlite3_stmt *st = NULL;
	va_list ap;
	if (sqlite3_prepare_v2(f->db, sql, -1, &st, NULL) != SQLITE_OK) {
		sdb_error("fsm: prepare failed", "err=\"%s\"", sqlite3_errmsg(f->db));
		return NULL;
	}
	va_start(ap, fmt);
	int rc = vbind(st, fmt, ap);
	va_end(ap);
	if (rc != SQLITE_OK) {
		sdb_error("fsm: bind failed", "err=\"%s\"", sqlite3_errmsg(f->db));
		sqlite3_finalize(st);
		return NULL;
	}
	return st;
}

/* Execute a statement that returns no rows. Returns 0 or SDB_EIO. */
static int x(sdb_fsm *f, const char *sql, const char *fmt, ...)
{
	sqlite3_stmt *st = NULL;
	va_list ap;
	int rc;
	if (sqlite3_prepare_v2(f->db, sql, -1, &st, NULL) != SQLITE_OK) {
		sdb_error("fsm: prepare failed", "err=\"%s\"", sqlite3_errmsg(f->db));
		return SDB_EIO;
	}
	va_start(ap, fmt);
	rc = vbind(st, fmt, ap);
	va_end(ap);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
		sdb_error("fsm: exec failed", "err=\"%s\"", sqlite3_errmsg(f->db));
		return SDB_EIO;
	}
	return 0;
}

/* Single int64 from a query; returns 1 when a row exists, 0 when none, SDB_EIO. */
static int q_int(sdb_fsm *f, int64_t *out, const char *sql, const char *fmt, ...)
{
	sqlite3_stmt *st = NULL;
	va_list ap;
	int rc;
	if (sqlite3_prepare_v2(f->db, sql, -1, &st, NULL) != SQLITE_OK)
		return SDB_EIO;
	va_start(ap, fmt);
	rc = vbind(st, fmt, ap);
	va_end(ap);
	if (rc != SQLITE_OK) {
		sqlite3_finalize(st);
		return SDB_EIO;
	}
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*out = sqlite3_column_int64(st, 0);
		sqlite3_finalize(st);
		return 1;
	}
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? 0 : SDB_EIO;
}

static int meta_get(sdb_fsm *f, const char *key, int64_t *out)
{
	*out = 0;
	int rc = q_int(f, out, "SELECT v FROM meta WHERE k = ?", "t", key);
	return rc < 0 ? rc : 0;
}

static int meta_set(sdb_fsm *f, const char *key, int64_t v)
{
	return x(f, "INSERT INTO meta(k, v) VALUES(?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
		 "ti", key, v);
}

/* ---------------------------------------------------------------- bson helpers */

static const char *arg_str(const bson_t *args, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, args, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

static int arg_int(const bson_t *args, const char *key, int64_t *out)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, args, key))
		return 0;
	if (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it)) {
		*out = bson_iter_as_int64(&it);
		return 1;
	}
	if (BSON_ITER_HOLDS_DOUBLE(&it)) {
		double d = bson_iter_double(&it);
		if (d != d || d < -9.2e18 || d > 9.2e18)
			return 0;
		*out = (int64_t)d;
		return 1;
	}
	return 0;
}

/* Document or array view of args[key]; returns 1 when found with that type. */
static int arg_doc(const bson_t *args, const char *key, bson_t *out, int want_array)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	if (!bson_iter_init_find(&it, args, key))
		return 0;
	if (want_array ? !BSON_ITER_HOLDS_ARRAY(&it) : !BSON_ITER_HOLDS_DOCUMENT(&it))
		return 0;
	if (want_array)
		bson_iter_array(&it, &len, &data);
	else
		bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len) ? 1 : 0;
}

static int lerr(bson_t *res, int code, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int lerr(bson_t *res, int code, const char *name, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	bson_reinit(res);
	BSON_APPEND_DOUBLE(res, "ok", 0.0);
	BSON_APPEND_UTF8(res, "errmsg", msg);
	BSON_APPEND_INT32(res, "code", code);
	BSON_APPEND_UTF8(res, "codeName", name);
	return LOGICAL;
}

/* Rank of a BSON type for ordering shard-key values (MongoDB's comparison order,
 * simplified: all numbers compare together). */
static int type_rank(bson_type_t t)
{
	switch (t) {
	case BSON_TYPE_MINKEY:
		return 0;
	case BSON_TYPE_NULL:
	case BSON_TYPE_UNDEFINED:
		return 1;
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128:
		return 2;
	case BSON_TYPE_UTF8:
	case BSON_TYPE_SYMBOL:
		return 3;
	case BSON_TYPE_DOCUMENT:
		return 4;
	case BSON_TYPE_ARRAY:
		return 5;
	case BSON_TYPE_BINARY:
		return 6;
	case BSON_TYPE_OID:
		return 7;
	case BSON_TYPE_BOOL:
		return 8;
	case BSON_TYPE_DATE_TIME:
		return 9;
	case BSON_TYPE_TIMESTAMP:
		return 10;
	case BSON_TYPE_MAXKEY:
		return 100;
	default:
		return 50;
	}
}

static int cmp_value(const bson_iter_t *a, const bson_iter_t *b)
{
	bson_type_t ta = bson_iter_type(a), tb = bson_iter_type(b);
	int ra = type_rank(ta), rb = type_rank(tb);
	if (ra != rb)
		return ra < rb ? -1 : 1;
	if (ra == 2) {
		if ((ta == BSON_TYPE_INT32 || ta == BSON_TYPE_INT64) &&
		    (tb == BSON_TYPE_INT32 || tb == BSON_TYPE_INT64)) {
			int64_t x1 = bson_iter_as_int64(a), x2 = bson_iter_as_int64(b);
			return x1 < x2 ? -1 : x1 > x2;
		}
		double d1 = bson_iter_as_double(a), d2 = bson_iter_as_double(b);
		return d1 < d2 ? -1 : d1 > d2;
	}
	if (ra == 3) {
		uint32_t l1, l2;
		const char *s1 = bson_iter_utf8(a, &l1), *s2 = bson_iter_utf8(b, &l2);
		int c = memcmp(s1, s2, l1 < l2 ? l1 : l2);
		if (c)
			return c < 0 ? -1 : 1;
		return l1 < l2 ? -1 : l1 > l2;
	}
	if (ra == 0 || ra == 1 || ra == 100)
		return 0;
	/* Other types: compare raw value bytes (stable, not MongoDB-exact). */
	const bson_value_t *va = bson_iter_value((bson_iter_t *)a);
	const bson_value_t *vb = bson_iter_value((bson_iter_t *)b);
	if (ta == BSON_TYPE_BOOL)
		return va->value.v_bool < vb->value.v_bool ? -1 : va->value.v_bool > vb->value.v_bool;
	if (ta == BSON_TYPE_DATE_TIME)
		return va->value.v_datetime < vb->value.v_datetime
			       ? -1
			       : va->value.v_datetime > vb->value.v_datetime;
	if (ta == BSON_TYPE_OID)
		return bson_oid_compare(&va->value.v_oid, &vb->value.v_oid) < 0
			       ? -1
			       : bson_oid_compare(&va->value.v_oid, &vb->value.v_oid) > 0;
	return 0;
}

/* Compare two shard-key documents field by field (positionally). */
static int cmp_key(const bson_t *a, const bson_t *b)
{
	bson_iter_t ia, ib;
	if (!bson_iter_init(&ia, a) || !bson_iter_init(&ib, b))
		return 0;
	for (;;) {
		bool na = bson_iter_next(&ia), nb = bson_iter_next(&ib);
		if (!na || !nb)
			return na == nb ? 0 : (na ? 1 : -1);
		int c = cmp_value(&ia, &ib);
		if (c)
			return c;
	}
}

/* Does the document have exactly the key's fields in order? */
static int key_matches(const bson_t *keypat, const bson_t *doc)
{
	bson_iter_t ik, id;
	if (!bson_iter_init(&ik, keypat) || !bson_iter_init(&id, doc))
		return 0;
	for (;;) {
		bool nk = bson_iter_next(&ik), nd = bson_iter_next(&id);
		if (!nk || !nd)
			return nk == nd;
		if (strcmp(bson_iter_key(&ik), bson_iter_key(&id)) != 0)
			return 0;
	}
}

/* --------------------------------------------------------------- schema */

static const char *const schema_sql =
	"CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS shards (id TEXT PRIMARY KEY, uri TEXT NOT NULL,"
	" state TEXT NOT NULL, created_ms INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS dbs (name TEXT PRIMARY KEY, tenant TEXT,"
	" created_ms INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS colls (ns TEXT PRIMARY KEY, db TEXT NOT NULL,"
	" key BLOB NOT NULL, hashed INTEGER NOT NULL, created_ms INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, ns TEXT NOT NULL,"
	" min BLOB NOT NULL, max BLOB NOT NULL, shard TEXT NOT NULL, token INTEGER NOT NULL,"
	" version INTEGER NOT NULL);"
	"CREATE INDEX IF NOT EXISTS chunks_ns ON chunks(ns);"
	"CREATE TABLE IF NOT EXISTS migrations (id TEXT PRIMARY KEY, ns TEXT, state TEXT NOT NULL,"
	" version INTEGER NOT NULL, spec BLOB, checkpoint BLOB, stats BLOB,"
	" created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL,"
	" expires_ms INTEGER NOT NULL, epoch INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, quota BLOB, policy BLOB,"
	" created_ms INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, tenant TEXT NOT NULL,"
	" mechanism TEXT NOT NULL, salt BLOB NOT NULL, iterations INTEGER NOT NULL,"
	" stored_key BLOB NOT NULL, server_key BLOB NOT NULL);"
	/* SCRAM-SHA-1 verifiers (issue #10), next to the SHA-256 one in users; a separate
	 * table so that databases and snapshots of earlier versions gain it by CREATE */
	"CREATE TABLE IF NOT EXISTS user_sha1 (name TEXT PRIMARY KEY, salt BLOB NOT NULL,"
	" iterations INTEGER NOT NULL, stored_key BLOB NOT NULL, server_key BLOB NOT NULL);"
	"CREATE TABLE IF NOT EXISTS members (id INTEGER PRIMARY KEY, raft TEXT, wire TEXT);"
	SDB_FSM_PEERS_SCHEMA; /* issue #23: rate-limit peer membership (fsm_peers.c) */

/* Tables hashed by sdb_fsm_hash, in a fixed order. */
static const char *const hash_tables[] = {"meta",   "shards", "dbs",     "colls", "chunks",
					  "migrations", "leases", "tenants", "users", "user_sha1",
					  "members", "ratelimit_peers", "routing_removed"};

static int load_cache(sdb_fsm *f)
{
	int64_t v;
	if (meta_get(f, "last_applied", &v) != 0)
		return SDB_EIO;
	f->last_applied = (uint64_t)v;
	if (meta_get(f, "routing_version", &v) != 0)
		return SDB_EIO;
	f->routing_version = v;
	return 0;
}

/* --------------------------------------------------------------- ops */

static int bump_routing(sdb_fsm *f, int64_t *rv)
{
	int64_t v;
	if (meta_get(f, "routing_version", &v) != 0)
		return SDB_EIO;
	v++;
	if (meta_set(f, "routing_version", v) != 0 || fsm_routing_prune(f->db, v) != 0)
		return SDB_EIO;
	*rv = v;
	return 0;
}

static int next_id(sdb_fsm *f, const char *key, int64_t *out)
{
	int64_t v;
	if (meta_get(f, key, &v) != 0)
		return SDB_EIO;
	v++;
	if (meta_set(f, key, v) != 0)
		return SDB_EIO;
	*out = v;
	return 0;
}

static int exists(sdb_fsm *f, const char *sql, const char *val)
{
	int64_t one;
	return q_int(f, &one, sql, "t", val);
}

static int op_add_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = arg_str(&c->args, "id"), *uri = arg_str(&c->args, "uri");
	if (!id || !*id || !uri || !*uri)
		return lerr(res, E_BAD_VALUE, "addShard needs string fields id and uri");
	int e = exists(f, "SELECT 1 FROM shards WHERE id = ?", id);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_DUPLICATE, "shard %s already exists", id);
	if (x(f, "INSERT INTO shards(id, uri, state, created_ms) VALUES(?, ?, 'active', ?)", "tti",
	      id, uri, c->ts))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "shardAdded", id);
	return 0;
}

static int op_remove_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = arg_str(&c->args, "id");
	int64_t n = 0;
	if (!id)
		return lerr(res, E_BAD_VALUE, "removeShard needs a string field id");
	int e = exists(f, "SELECT 1 FROM shards WHERE id = ?", id);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", id);
	if (q_int(f, &n, "SELECT count(*) FROM chunks WHERE shard = ?", "t", id) < 0)
		return SDB_EIO;
	if (n > 0)
		return lerr(res, E_ILLEGAL, "shard %s still owns %lld chunks", id, (long long)n);
	if (x(f, "DELETE FROM shards WHERE id = ?", "t", id))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "shardRemoved", id);
	return 0;
}

static int op_create_database(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name"), *tenant = arg_str(&c->args, "tenant");
	if (!name || !*name || strchr(name, '.'))
		return lerr(res, E_BAD_VALUE, "createDatabase needs a name without dots");
	if (tenant) {
		int e = exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
		if (e < 0)
			return e;
		if (!e)
			return lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	}
	int e = exists(f, "SELECT 1 FROM dbs WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_NS_EXISTS, "database %s already exists", name);
	if (x(f, "INSERT INTO dbs(name, tenant, created_ms) VALUES(?, ?, ?)", "tti", name, tenant,
	      c->ts))
		return SDB_EIO;
	return 0;
}

static int op_drop_database(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name");
	int64_t n = 0, rv;
	if (!name)
		return lerr(res, E_BAD_VALUE, "dropDatabase needs a string field name");
	int e = exists(f, "SELECT 1 FROM dbs WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NS_NOT_FOUND, "database %s not found", name);
	if (q_int(f, &n, "SELECT count(*) FROM colls WHERE db = ?", "t", name) < 0)
		return SDB_EIO;
	/* the routing change (and its tombstones, issue #26) before the rows go */
	if (n > 0 && (bump_routing(f, &rv) || fsm_routing_remove_db(f->db, rv, name)))
		return SDB_EIO;
	if (x(f, "DELETE FROM chunks WHERE ns IN (SELECT ns FROM colls WHERE db = ?)", "t", name) ||
	    x(f, "DELETE FROM colls WHERE db = ?", "t", name) ||
	    x(f, "DELETE FROM dbs WHERE name = ?", "t", name))
		return SDB_EIO;
	if (n > 0)
		BSON_APPEND_INT64(res, "routingVersion", rv);
	return 0;
}

/* Build a key document {f1: v, f2: v, ...} with the same value for every field of
 * keypat (used for MinKey/MaxKey bounds). */
static bson_t *key_fill(const bson_t *keypat, bson_type_t t)
{
	bson_iter_t it;
	bson_t *out = bson_new();
	if (!bson_iter_init(&it, keypat))
		return out;
	while (bson_iter_next(&it)) {
		if (t == BSON_TYPE_MINKEY)
			bson_append_minkey(out, bson_iter_key(&it), -1);
		else
			bson_append_maxkey(out, bson_iter_key(&it), -1);
	}
	return out;
}

/* Length of a heap document, read from its data: libbson declares bson_t 128-byte
 * aligned but its allocator does not align that much, so we never touch members of a
 * heap bson_t (UBSan's alignment check). */
static int doc_len(const bson_t *b)
{
	uint32_t len;
	memcpy(&len, bson_get_data(b), 4);
	return (int)BSON_UINT32_FROM_LE(len);
}

static int insert_chunk(sdb_fsm *f, int64_t id, const char *ns, const bson_t *min,
			const bson_t *max, const char *shard, int64_t token, int64_t version)
{
	return x(f,
		 "INSERT INTO chunks(id, ns, min, max, shard, token, version) VALUES(?, ?, ?, ?, ?, ?, ?)",
		 "itbbtii", id, ns, bson_get_data(min), doc_len(min), bson_get_data(max),
		 doc_len(max), shard, token, version);
}

static int op_shard_collection(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *ns = arg_str(&c->args, "ns");
	bson_t key, split, shards_arr;
	bson_iter_t it;
	int hashed = 0, nfields = 0, have_split, have_shards, rc = 0;
	int64_t nchunks = 0, rv, n;
	char dbname[256];
	char **shards = NULL;
	size_t nshards = 0, i;
	bson_t **bounds = NULL; /* bson_new()'d: bson_t needs libbson's alignment */
	size_t nbounds = 0;

	if (!ns || !strchr(ns, '.') || strchr(ns, '.') == ns || strlen(ns) >= sizeof dbname)
		return lerr(res, E_BAD_VALUE, "shardCollection needs ns of the form db.coll");
	if (!arg_doc(&c->args, "key", &key, 0))
		return lerr(res, E_BAD_VALUE, "shardCollection needs a key document");
	bson_iter_init(&it, &key);
	while (bson_iter_next(&it)) {
		nfields++;
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0)
			hashed = 1;
		else if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1)
			return lerr(res, E_BAD_VALUE, "shard key field %s must be 1 or \"hashed\"",
				    bson_iter_key(&it));
	}
	if (nfields == 0)
		return lerr(res, E_BAD_VALUE, "shard key must have at least one field");
	if (hashed && nfields != 1)
		return lerr(res, E_BAD_VALUE, "a hashed shard key has exactly one field");
	memcpy(dbname, ns, (size_t)(strchr(ns, '.') - ns));
	dbname[strchr(ns, '.') - ns] = '\0';
	int e = exists(f, "SELECT 1 FROM dbs WHERE name = ?", dbname);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NS_NOT_FOUND, "database %s not found (createDatabase first)",
			    dbname);
	e = exists(f, "SELECT 1 FROM colls WHERE ns = ?", ns);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_NS_EXISTS, "collection %s is already sharded", ns);

	/* Placement: the given shards, or every shard in id order. */
	have_shards = arg_doc(&c->args, "shards", &shards_arr, 1);
	if (have_shards) {
		bson_iter_init(&it, &shards_arr);
		while (bson_iter_next(&it)) {
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				rc = lerr(res, E_BAD_VALUE, "shards must be an array of shard ids");
				goto out;
			}
			const char *sid = bson_iter_utf8(&it, NULL);
			e = exists(f, "SELECT 1 FROM shards WHERE id = ?", sid);
			if (e < 0) {
				rc = e;
				goto out;
			}
			if (!e) {
				rc = lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", sid);
				goto out;
			}
			shards = sdb_realloc(shards, (nshards + 1) * sizeof *shards);
			shards[nshards++] = sdb_strdup(sid);
		}
	} else {
		sqlite3_stmt *st = q(f, "SELECT id FROM shards ORDER BY id", NULL);
		if (!st)
			return SDB_EIO;
		while (sqlite3_step(st) == SQLITE_ROW) {
			shards = sdb_realloc(shards, (nshards + 1) * sizeof *shards);
			shards[nshards++] = sdb_strdup((const char *)sqlite3_column_text(st, 0));
		}
		sqlite3_finalize(st);
	}
	if (nshards == 0) {
		rc = lerr(res, E_SHARD_NOT_FOUND, "no shards to place %s on", ns);
		goto out;
	}

	/* Boundaries: MinKey, split points..., MaxKey. */
	have_split = arg_doc(&c->args, "splitPoints", &split, 1);
	if (!arg_int(&c->args, "numChunks", &nchunks))
		nchunks = 0;
	if (have_split && nchunks) {
		rc = lerr(res, E_BAD_VALUE, "give splitPoints or numChunks, not both");
		goto out;
	}
	/* No fixed cap here (issue #26): the leader refuses more than
	 * --max-chunks-per-command before proposing (src/metadata/role.c); apply only
	 * bounds the value to what the id space can hold. */
	if (nchunks < 0 || nchunks > INT32_MAX) {
		rc = lerr(res, E_BAD_VALUE, "numChunks must be 1..%d", INT32_MAX);
		goto out;
	}
	if (nchunks > 1 && !hashed) {
		rc = lerr(res, E_BAD_VALUE, "numChunks needs a hashed key; use splitPoints");
		goto out;
	}
	if (!have_split && nchunks == 0)
		nchunks = hashed ? (int64_t)nshards : 1;
	if (have_split) {
		/* Explicit boundaries: MinKey, split points..., MaxKey (views into args). */
		size_t cap = 2;
		bson_iter_init(&it, &split);
		while (bson_iter_next(&it))
			cap++;
		bounds = sdb_calloc(cap, sizeof *bounds);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MINKEY);
		bson_iter_init(&it, &split);
		while (bson_iter_next(&it)) {
			bson_t sp;
			const uint8_t *d;
			uint32_t l;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				rc = lerr(res, E_BAD_VALUE, "splitPoints must be key documents");
				goto out;
			}
			bson_iter_document(&it, &l, &d);
			if (!bson_init_static(&sp, d, l) || !key_matches(&key, &sp)) {
				rc = lerr(res, E_BAD_VALUE, "split point does not match the shard key");
				goto out;
			}
			if (cmp_key(bounds[nbounds - 1], &sp) >= 0) {
				rc = lerr(res, E_BAD_VALUE, "splitPoints must be strictly increasing");
				goto out;
			}
			bounds[nbounds++] = bson_copy(&sp);
		}
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MAXKEY);
		nchunks = (int64_t)nbounds - 1;
	} else {
		/* MinKey and MaxKey only: the inner bounds of an even split of the int64
		 * hash space are generated while inserting (no per-chunk memory). */
		bounds = sdb_calloc(2, sizeof *bounds);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MINKEY);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MAXKEY);
	}

	if (x(f, "INSERT INTO colls(ns, db, key, hashed, created_ms) VALUES(?, ?, ?, ?, ?)", "ttbii",
	      ns, dbname, bson_get_data(&key), (int)key.len, (int64_t)hashed, c->ts) ||
	    bump_routing(f, &rv)) {
		rc = SDB_EIO;
		goto out;
	}
	{
		/* One prepared statement and one id reservation for all chunks: a million
		 * chunks insert in seconds, not minutes. */
		int64_t first_id;
		const char *fld = NULL;
		uint64_t step = 0;
		sqlite3_stmt *ins;
		if (meta_get(f, "next_chunk_id", &first_id) != 0 ||
		    meta_set(f, "next_chunk_id", first_id + nchunks) != 0) {
			rc = SDB_EIO;
			goto out;
		}
		if (!have_split && nchunks > 1) {
			bson_iter_init(&it, &key);
			bson_iter_next(&it);
			fld = bson_iter_key(&it);
			step = UINT64_MAX / (uint64_t)nchunks;
		}
		ins = q(f, "INSERT INTO chunks(id, ns, min, max, shard, token, version)"
			   " VALUES(?, ?, ?, ?, ?, 1, ?)", NULL);
		if (!ins) {
			rc = SDB_EIO;
			goto out;
		}
		for (int64_t k = 0; k < nchunks; k++) {
			bson_t lo, hi;
			const bson_t *plo, *phi;
			int step_rc;
			bson_init(&lo);
			bson_init(&hi);
			if (have_split) {
				plo = bounds[k];
				phi = bounds[k + 1];
			} else {
				if (k == 0)
					plo = bounds[0];
				else {
					BSON_APPEND_INT64(&lo, fld, (int64_t)((uint64_t)INT64_MIN +
									      (uint64_t)k * step));
					plo = &lo;
				}
				if (k + 1 == nchunks)
					phi = bounds[1];
				else {
					BSON_APPEND_INT64(&hi, fld,
							  (int64_t)((uint64_t)INT64_MIN +
								    (uint64_t)(k + 1) * step));
					phi = &hi;
				}
			}
			sqlite3_reset(ins);
			sqlite3_bind_int64(ins, 1, first_id + k + 1);
			sqlite3_bind_text(ins, 2, ns, -1, SQLITE_STATIC);
			sqlite3_bind_blob(ins, 3, bson_get_data(plo), doc_len(plo), SQLITE_TRANSIENT);
			sqlite3_bind_blob(ins, 4, bson_get_data(phi), doc_len(phi), SQLITE_TRANSIENT);
			sqlite3_bind_text(ins, 5, shards[(size_t)k % nshards], -1, SQLITE_STATIC);
			sqlite3_bind_int64(ins, 6, rv);
			step_rc = sqlite3_step(ins);
			bson_destroy(&lo);
			bson_destroy(&hi);
			if (step_rc != SQLITE_DONE) {
				sdb_error("fsm: insert chunk failed", "err=\"%s\"", sqlite3_errmsg(f->db));
				sqlite3_finalize(ins);
				rc = SDB_EIO;
				goto out;
			}
		}
		sqlite3_finalize(ins);
	}
	n = nchunks;
	BSON_APPEND_UTF8(res, "collectionSharded", ns);
	BSON_APPEND_INT64(res, "chunks", n);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	for (i = 0; i < nbounds; i++)
		bson_destroy(bounds[i]);
	free(bounds);
	for (i = 0; i < nshards; i++)
		free(shards[i]);
	free(shards);
	return rc;
}

static int op_drop_collection(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *ns = arg_str(&c->args, "ns");
	int64_t rv;
	if (!ns)
		return lerr(res, E_BAD_VALUE, "dropCollection needs a string field ns");
	int e = exists(f, "SELECT 1 FROM colls WHERE ns = ?", ns);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NS_NOT_FOUND, "collection %s not found", ns);
	if (bump_routing(f, &rv) || fsm_routing_remove_ns(f->db, rv, ns) ||
	    x(f, "DELETE FROM chunks WHERE ns = ?", "t", ns) ||
	    x(f, "DELETE FROM colls WHERE ns = ?", "t", ns))
		return SDB_EIO;
	BSON_APPEND_INT64(res, "routingVersion", rv);
	return 0;
}

typedef struct chunk_row {
	int64_t id;
	char ns[512];
	char shard[256];
	bson_t *min, *max; /* owned, bson_new()'d */
	int64_t token;
} chunk_row;

/* Load one chunk; 1 found, 0 missing, SDB_EIO. Found rows must be freed with
 * chunk_free. */
static int chunk_load(sdb_fsm *f, int64_t id, chunk_row *out)
{
	sqlite3_stmt *st = q(f, "SELECT ns, min, max, shard, token FROM chunks WHERE id = ?", "i", id);
	int rc;
	if (!st)
		return SDB_EIO;
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		return rc == SQLITE_DONE ? 0 : SDB_EIO;
	}
	out->id = id;
	snprintf(out->ns, sizeof out->ns, "%s", (const char *)sqlite3_column_text(st, 0));
	snprintf(out->shard, sizeof out->shard, "%s", (const char *)sqlite3_column_text(st, 3));
	out->token = sqlite3_column_int64(st, 4);
	out->min = bson_new_from_data(sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1));
	out->max = bson_new_from_data(sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2));
	if (!out->min)
		out->min = bson_new();
	if (!out->max)
		out->max = bson_new();
	sqlite3_finalize(st);
	return 1;
}

static void chunk_free(chunk_row *c)
{
	bson_destroy(c->min);
	bson_destroy(c->max);
}

static int op_split_chunk(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id, nid, rv;
	bson_t at, key;
	chunk_row ch;
	int rc = 0;
	if (!arg_int(&c->args, "id", &id) || !arg_doc(&c->args, "at", &at, 0))
		return lerr(res, E_BAD_VALUE, "splitChunk needs id and an at key document");
	int e = chunk_load(f, id, &ch);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NO_SUCH_KEY, "chunk %lld not found", (long long)id);
	/* The split point must match the collection's key and lie strictly inside. */
	sqlite3_stmt *st = q(f, "SELECT key FROM colls WHERE ns = ?", "t", ch.ns);
	if (!st) {
		rc = SDB_EIO;
		goto out;
	}
	if (sqlite3_step(st) != SQLITE_ROW ||
	    !bson_init_static(&key, sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0)) ||
	    !key_matches(&key, &at)) {
		sqlite3_finalize(st);
		rc = lerr(res, E_BAD_VALUE, "split point does not match the shard key of %s", ch.ns);
		goto out;
	}
	sqlite3_finalize(st);
	if (cmp_key(ch.min, &at) >= 0 || cmp_key(&at, ch.max) >= 0) {
		rc = lerr(res, E_BAD_VALUE, "split point is not inside chunk %lld", (long long)id);
		goto out;
	}
	if (bump_routing(f, &rv) || next_id(f, "next_chunk_id", &nid) ||
	    x(f, "UPDATE chunks SET max = ?, version = ? WHERE id = ?", "bii", bson_get_data(&at),
	      (int)at.len, rv, id) ||
	    insert_chunk(f, nid, ch.ns, &at, ch.max, ch.shard, ch.token, rv)) {
		rc = SDB_EIO;
		goto out;
	}
	BSON_APPEND_INT64(res, "left", id);
	BSON_APPEND_INT64(res, "right", nid);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	chunk_free(&ch);
	return rc;
}

static int op_merge_chunks(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	bson_t ids;
	bson_iter_t it;
	chunk_row *rows = NULL;
	size_t n = 0, i;
	int rc = 0;
	int64_t rv, token = 0;
	if (!arg_doc(&c->args, "ids", &ids, 1))
		return lerr(res, E_BAD_VALUE, "mergeChunks needs an ids array");
	bson_iter_init(&it, &ids);
	while (bson_iter_next(&it)) {
		if (!BSON_ITER_HOLDS_NUMBER(&it) || n >= 1000) {
			rc = lerr(res, E_BAD_VALUE, "ids must be at most 1000 chunk ids");
			goto out;
		}
		rows = sdb_realloc(rows, (n + 1) * sizeof *rows);
		int e = chunk_load(f, bson_iter_as_int64(&it), &rows[n]);
		if (e < 0) {
			rc = e;
			goto out;
		}
		if (!e) {
			rc = lerr(res, E_NO_SUCH_KEY, "chunk %lld not found",
				  (long long)bson_iter_as_int64(&it));
			goto out;
		}
		n++;
	}
	if (n < 2) {
		rc = lerr(res, E_BAD_VALUE, "mergeChunks needs at least two chunks");
		goto out;
	}
	/* Sort by min (insertion sort; n is small). */
	for (i = 1; i < n; i++) {
		chunk_row t = rows[i];
		size_t j = i;
		while (j > 0 && cmp_key(rows[j - 1].min, t.min) > 0) {
			rows[j] = rows[j - 1];
			j--;
		}
		rows[j] = t;
	}
	for (i = 0; i < n; i++) {
		if (strcmp(rows[i].ns, rows[0].ns) || strcmp(rows[i].shard, rows[0].shard)) {
			rc = lerr(res, E_ILLEGAL, "chunks to merge must share collection and shard");
			goto out;
		}
		if (i > 0 && cmp_key(rows[i - 1].max, rows[i].min) != 0) {
			rc = lerr(res, E_ILLEGAL, "chunks %lld and %lld are not adjacent",
				  (long long)rows[i - 1].id, (long long)rows[i].id);
			goto out;
		}
		if (rows[i].token > token)
			token = rows[i].token;
	}
	if (bump_routing(f, &rv) ||
	    x(f, "UPDATE chunks SET max = ?, token = ?, version = ? WHERE id = ?", "biii",
	      bson_get_data(rows[n - 1].max), doc_len(rows[n - 1].max), token, rv, rows[0].id)) {
		rc = SDB_EIO;
		goto out;
	}
	for (i = 1; i < n; i++)
		if (fsm_routing_remove_chunk(f->db, rv, rows[i].id) ||
		    x(f, "DELETE FROM chunks WHERE id = ?", "i", rows[i].id)) {
			rc = SDB_EIO;
			goto out;
		}
	BSON_APPEND_INT64(res, "merged", rows[0].id);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	for (i = 0; i < n; i++)
		chunk_free(&rows[i]);
	free(rows);
	return rc;
}

static int op_set_chunk_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id, token, expect, rv;
	const char *shard = arg_str(&c->args, "shard");
	chunk_row ch;
	int rc = 0;
	if (!arg_int(&c->args, "id", &id) || !shard)
		return lerr(res, E_BAD_VALUE, "setChunkShard needs id and shard");
	int e = chunk_load(f, id, &ch);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NO_SUCH_KEY, "chunk %lld not found", (long long)id);
	e = exists(f, "SELECT 1 FROM shards WHERE id = ?", shard);
	if (e <= 0) {
		rc = e < 0 ? e : lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", shard);
		goto out;
	}
	if (arg_int(&c->args, "expectToken", &expect) && expect != ch.token) {
		rc = lerr(res, E_WRITE_CONFLICT, "chunk %lld has token %lld, expected %lld",
			  (long long)id, (long long)ch.token, (long long)expect);
		BSON_APPEND_INT64(res, "currentToken", ch.token);
		goto out;
	}
	if (!arg_int(&c->args, "token", &token))
		token = ch.token + 1;
	if (token < ch.token) {
		rc = lerr(res, E_BAD_VALUE, "token %lld is older than the chunk's %lld",
			  (long long)token, (long long)ch.token);
		goto out;
	}
	if (bump_routing(f, &rv) ||
	    x(f, "UPDATE chunks SET shard = ?, token = ?, version = ? WHERE id = ?", "tiii", shard,
	      token, rv, id)) {
		rc = SDB_EIO;
		goto out;
	}
	BSON_APPEND_INT64(res, "token", token);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	chunk_free(&ch);
	return rc;
}

static int op_register_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = arg_str(&c->args, "id"), *state = arg_str(&c->args, "state");
	const char *ns = arg_str(&c->args, "ns");
	char gen[64];
	if (!id) {
		/* Deterministic id from the log index. */
		snprintf(gen, sizeof gen, "mig-%llu", (unsigned long long)c->index);
		id = gen;
	}
	int64_t opv = 1;
	if (!state)
		state = "registered";
	if (arg_int(&c->args, "opVersion", &opv) && opv >= MIGSTATE_OP_VERSION &&
	    migrate_state_parse(state) != MIG_REGISTERED)
		return lerr(res, E_ILLEGAL, "a migration starts in state registered, not %s", state);
	int e = exists(f, "SELECT 1 FROM migrations WHERE id = ?", id);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_DUPLICATE, "migration %s already exists", id);
	if (x(f,
	      "INSERT INTO migrations(id, ns, state, version, spec, checkpoint, stats, created_ms,"
	      " updated_ms) VALUES(?, ?, ?, 1, ?, NULL, NULL, ?, ?)",
	      "tttbii", id, ns, state, bson_get_data(&c->args), (int)c->args.len, c->ts, c->ts))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "id", id);
	BSON_APPEND_UTF8(res, "state", state);
	BSON_APPEND_INT64(res, "version", 1);
	return 0;
}

static int op_update_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = arg_str(&c->args, "id"), *state = arg_str(&c->args, "state");
	const char *expect = arg_str(&c->args, "expectState");
	bson_t cp, stats;
	int has_cp = arg_doc(&c->args, "checkpoint", &cp, 0);
	int has_stats = arg_doc(&c->args, "stats", &stats, 0);
	int64_t ver = 0, opv = 1;
	/* entries from MIGSTATE_OP_VERSION on are checked; older ones replay as they were */
	int checked = arg_int(&c->args, "opVersion", &opv) && opv >= MIGSTATE_OP_VERSION;
	if (!id)
		return lerr(res, E_BAD_VALUE, "updateMigration needs a string field id");
	sqlite3_stmt *st = q(f, "SELECT state, version FROM migrations WHERE id = ?", "t", id);
	if (!st)
		return SDB_EIO;
	if (sqlite3_step(st) != SQLITE_ROW) {
		sqlite3_finalize(st);
		return lerr(res, E_NO_SUCH_KEY, "migration %s not found", id);
	}
	char cur[128];
	snprintf(cur, sizeof cur, "%s", (const char *)sqlite3_column_text(st, 0));
	ver = sqlite3_column_int64(st, 1);
	sqlite3_finalize(st);
	if (checked && !expect)
		return lerr(res, E_BAD_VALUE, "updateMigration needs expectState (the state %s is in)",
			    id);
	if (expect && strcmp(expect, cur) != 0) {
		lerr(res, E_WRITE_CONFLICT, "migration %s is in state %s, expected %s", id, cur,
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
		lerr(res, E_ILLEGAL, "migration %s: illegal transition %s -> %s", id, cur, state);
		BSON_APPEND_UTF8(res, "currentState", cur);
		BSON_APPEND_INT64(res, "version", ver);
		return LOGICAL;
	}
	ver++;
	if (x(f, "UPDATE migrations SET state = ?, version = ?, updated_ms = ? WHERE id = ?", "tiit",
	      state, ver, c->ts, id))
		return SDB_EIO;
	if (has_cp && x(f, "UPDATE migrations SET checkpoint = ? WHERE id = ?", "bt",
			bson_get_data(&cp), (int)cp.len, id))
		return SDB_EIO;
	if (has_stats && x(f, "UPDATE migrations SET stats = ? WHERE id = ?", "bt",
			   bson_get_data(&stats), (int)stats.len, id))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "id", id);
	BSON_APPEND_UTF8(res, "previousState", cur);
	BSON_APPEND_UTF8(res, "state", state);
	BSON_APPEND_INT64(res, "version", ver);
	return 0;
}

static int op_delete_migration(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = arg_str(&c->args, "id");
	if (!id)
		return lerr(res, E_BAD_VALUE, "deleteMigration needs a string field id");
	int e = exists(f, "SELECT 1 FROM migrations WHERE id = ?", id);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NO_SUCH_KEY, "migration %s not found", id);
	return x(f, "DELETE FROM migrations WHERE id = ?", "t", id) ? SDB_EIO : 0;
}

/* Leases use the leader-stamped epoch ms (c->ts) so that expiry means the same on
 * every member and across leader changes. */
static int op_lease(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name"), *holder = arg_str(&c->args, "holder");
	int64_t ttl = 0, expires = 0, epoch = 0;
	int found = 0;
	char cur[256] = "";
	if (!name || !holder)
		return lerr(res, E_BAD_VALUE, "%s needs name and holder", c->op);
	if (strcmp(c->op, "releaseLease") != 0 &&
	    (!arg_int(&c->args, "ttlMS", &ttl) || ttl <= 0 || ttl > 86400000))
		return lerr(res, E_BAD_VALUE, "%s needs ttlMS in 1..86400000", c->op);
	sqlite3_stmt *st =
		q(f, "SELECT holder, expires_ms, epoch FROM leases WHERE name = ?", "t", name);
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
			lerr(res, E_LOCK_BUSY, "lease %s is held by %s", name, cur);
			BSON_APPEND_UTF8(res, "holder", cur);
			BSON_APPEND_INT64(res, "expiresMS", expires);
			return LOGICAL;
		}
		if (!(live && mine))
			epoch++;
	} else if (strcmp(c->op, "renewLease") == 0) {
		if (!live || !mine)
			return lerr(res, E_LOCK_BUSY, "lease %s is not held by %s", name, holder);
	} else { /* releaseLease */
		if (!mine)
			return lerr(res, E_LOCK_BUSY, "lease %s is not held by %s", name, holder);
		if (x(f, "DELETE FROM leases WHERE name = ?", "t", name))
			return SDB_EIO;
		return 0;
	}
	expires = c->ts + ttl;
	if (x(f,
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

static int op_create_tenant(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name");
	if (!name || !*name)
		return lerr(res, E_BAD_VALUE, "createTenant needs a string field name");
	int e = exists(f, "SELECT 1 FROM tenants WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_DUPLICATE, "tenant %s already exists", name);
	return x(f, "INSERT INTO tenants(name, created_ms) VALUES(?, ?)", "ti", name, c->ts)
		       ? SDB_EIO
		       : 0;
}

static int op_tenant_doc(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *tenant = arg_str(&c->args, "tenant");
	int quota = strcmp(c->op, "setQuota") == 0;
	bson_t d;
	if (!tenant || !arg_doc(&c->args, quota ? "quota" : "policy", &d, 0))
		return lerr(res, E_BAD_VALUE, "%s needs tenant and a %s document", c->op,
			    quota ? "quota" : "policy");
	int e = exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	return x(f,
		 quota ? "UPDATE tenants SET quota = ? WHERE name = ?"
		       : "UPDATE tenants SET policy = ? WHERE name = ?",
		 "bt", bson_get_data(&d), (int)d.len, tenant)
		       ? SDB_EIO
		       : 0;
}

static int arg_bin(const bson_t *args, const char *key, const uint8_t **data, uint32_t *len)
{
	bson_iter_t it;
	bson_subtype_t st;
	if (!bson_iter_init_find(&it, args, key) || !BSON_ITER_HOLDS_BINARY(&it))
		return 0;
	bson_iter_binary(&it, &st, len, data);
	return 1;
}

/* A SCRAM verifier in args (RFC 5802 §3): salt (16..64 bytes), iterations >= 4096,
 * storedKey and serverKey of keylen bytes (32: SHA-256, 20: SHA-1). */
typedef struct verifier {
	const uint8_t *salt, *sk, *svk;
	uint32_t lsalt, lsk, lsvk;
	int64_t iters;
} verifier;

static int arg_verifier(const bson_t *args, uint32_t keylen, verifier *v)
{
	return arg_bin(args, "salt", &v->salt, &v->lsalt) &&
	       arg_bin(args, "storedKey", &v->sk, &v->lsk) &&
	       arg_bin(args, "serverKey", &v->svk, &v->lsvk) &&
	       arg_int(args, "iterations", &v->iters) && v->iters >= 4096 &&
	       v->iters <= 10000000 && v->lsk == keylen && v->lsvk == keylen && v->lsalt >= 16 &&
	       v->lsalt <= 64;
}

/* Optional scramSha1: {salt, iterations, storedKey, serverKey}. Returns 1 when present and
 * valid (*has set), 1 when absent (*has clear), 0 when present but malformed. */
static int arg_sha1(const bson_t *args, verifier *v, int *has)
{
	bson_t d;
	*has = 0;
	if (!bson_has_field(args, "scramSha1"))
		return 1;
	if (!arg_doc(args, "scramSha1", &d, 0) || !arg_verifier(&d, 20, v))
		return 0;
	*has = 1;
	return 1;
}

/* Replace the user's SHA-1 verifier (none when has is 0). */
static int put_sha1(sdb_fsm *f, const char *name, int has, const verifier *v)
{
	if (x(f, "DELETE FROM user_sha1 WHERE name = ?", "t", name))
		return SDB_EIO;
	if (has && x(f,
		     "INSERT INTO user_sha1(name, salt, iterations, stored_key, server_key)"
		     " VALUES(?, ?, ?, ?, ?)",
		     "tbibb", name, v->salt, (int)v->lsalt, v->iters, v->sk, (int)v->lsk, v->svk,
		     (int)v->lsvk))
		return SDB_EIO;
	return 0;
}

/* Every change of a user's credentials bumps meta users_version (getUser and listTenants
 * report it; the proxy drops cached verifiers of older versions). */
static int bump_users(sdb_fsm *f)
{
	int64_t v;
	return next_id(f, "users_version", &v);
}

static int op_create_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name"), *tenant = arg_str(&c->args, "tenant");
	verifier v, v1;
	int has1 = 0;
	if (!name || !*name || !tenant || !arg_verifier(&c->args, 32, &v) ||
	    !arg_sha1(&c->args, &v1, &has1))
		return lerr(res, E_BAD_VALUE,
			    "createUser needs name, tenant and a SCRAM-SHA-256 verifier (salt, "
			    "iterations >= 4096, storedKey, serverKey), optionally scramSha1");
	int e = exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	e = exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return lerr(res, E_DUPLICATE, "user %s already exists", name);
	if (x(f,
	      "INSERT INTO users(name, tenant, mechanism, salt, iterations, stored_key, server_key)"
	      " VALUES(?, ?, 'SCRAM-SHA-256', ?, ?, ?, ?)",
	      "ttbibb", name, tenant, v.salt, (int)v.lsalt, v.iters, v.sk, (int)v.lsk, v.svk,
	      (int)v.lsvk) ||
	    put_sha1(f, name, has1, &v1) || bump_users(f))
		return SDB_EIO;
	return 0;
}

/* updateUser (MongoDB's name): new verifiers for an existing user. The SHA-1 verifier is
 * replaced too, or removed when the command carries none, so an old password never
 * keeps working through the other mechanism. */
static int op_update_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name");
	verifier v, v1;
	int has1 = 0;
	if (!name || !*name || !arg_verifier(&c->args, 32, &v) || !arg_sha1(&c->args, &v1, &has1))
		return lerr(res, E_BAD_VALUE,
			    "updateUser needs name and a SCRAM-SHA-256 verifier (salt, iterations "
			    ">= 4096, storedKey, serverKey), optionally scramSha1");
	int e = exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_USER_NOT_FOUND, "Could not find user \"%s\"", name);
	if (x(f,
	      "UPDATE users SET mechanism = 'SCRAM-SHA-256', salt = ?, iterations = ?,"
	      " stored_key = ?, server_key = ? WHERE name = ?",
	      "bibbt", v.salt, (int)v.lsalt, v.iters, v.sk, (int)v.lsk, v.svk, (int)v.lsvk, name) ||
	    put_sha1(f, name, has1, &v1) || bump_users(f))
		return SDB_EIO;
	return 0;
}

static int op_drop_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = arg_str(&c->args, "name");
	if (!name || !*name)
		return lerr(res, E_BAD_VALUE, "dropUser needs a string field name");
	int e = exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return lerr(res, E_USER_NOT_FOUND, "Could not find user \"%s\"", name);
	if (x(f, "DELETE FROM users WHERE name = ?", "t", name) ||
	    x(f, "DELETE FROM user_sha1 WHERE name = ?", "t", name) || bump_users(f))
		return SDB_EIO;
	return 0;
}

static int op_register_member(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id;
	const char *raft = arg_str(&c->args, "raft"), *wire = arg_str(&c->args, "wire");
	if (!arg_int(&c->args, "id", &id) || id <= 0)
		return lerr(res, E_BAD_VALUE, "registerMember needs a positive id");
	return x(f,
		 "INSERT INTO members(id, raft, wire) VALUES(?, ?, ?) ON CONFLICT(id) DO UPDATE"
		 " SET raft = coalesce(excluded.raft, raft), wire = coalesce(excluded.wire, wire)",
		 "itt", id, raft, wire)
		       ? SDB_EIO
		       : 0;
}

static int op_remove_member(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id;
	if (!arg_int(&c->args, "id", &id))
		return lerr(res, E_BAD_VALUE, "removeMember needs an id");
	return x(f, "DELETE FROM members WHERE id = ?", "i", id) ? SDB_EIO : 0;
}

/* issue #23: rate-limit peer membership, kept in its own file (raft/fsm_peers.c) */
static int op_ratelimit_peers(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int rc = sdb_fsm_peers_apply(f->db, c->op, c->ts, &c->args, res);
	return rc == 1 ? LOGICAL : rc;
}

typedef int (*op_fn)(sdb_fsm *f, cmdctx *c, bson_t *res);

static const struct {
	const char *name;
	op_fn fn;
} ops[] = {
	{"addShard", op_add_shard},
	{"removeShard", op_remove_shard},
	{"createDatabase", op_create_database},
	{"dropDatabase", op_drop_database},
	{"shardCollection", op_shard_collection},
	{"dropCollection", op_drop_collection},
	{"splitChunk", op_split_chunk},
	{"mergeChunks", op_merge_chunks},
	{"setChunkShard", op_set_chunk_shard},
	{"registerMigration", op_register_migration},
	{"updateMigration", op_update_migration},
	{"deleteMigration", op_delete_migration},
	{"acquireLease", op_lease},
	{"renewLease", op_lease},
	{"releaseLease", op_lease},
	{"createTenant", op_create_tenant},
	{"setQuota", op_tenant_doc},
	{"setPolicy", op_tenant_doc},
	{"createUser", op_create_user},
	{"updateUser", op_update_user},
	{"dropUser", op_drop_user},
	{"registerMember", op_register_member},
	{"removeMember", op_remove_member},
	{"registerRatelimitPeer", op_ratelimit_peers},
	{"deregisterRatelimitPeer", op_ratelimit_peers},
	{"expireRatelimitPeers", op_ratelimit_peers},
};

int sdb_fsm_is_command(const char *op)
{
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		if (strcmp(ops[i].name, op) == 0)
			return 1;
	return 0;
}

/* --------------------------------------------------------------- apply */

int sdb_fsm_apply_doc(sdb_fsm *f, uint64_t index, const bson_t *cmd, bson_t *result)
{
	cmdctx c;
	op_fn fn = NULL;
	int rc;

	bson_reinit(result);
	if (index <= f->last_applied) {
		BSON_APPEND_DOUBLE(result, "ok", 1.0);
		BSON_APPEND_BOOL(result, "skipped", true);
		return 0;
	}
	memset(&c, 0, sizeof c);
	c.index = index;
	c.op = arg_str(cmd, "op");
	if (!arg_int(cmd, "ts", &c.ts))
		c.ts = 0;
	if (!arg_doc(cmd, "args", &c.args, 0))
		bson_init(&c.args);
	for (size_t i = 0; c.op && i < sizeof ops / sizeof ops[0]; i++)
		if (strcmp(ops[i].name, c.op) == 0)
			fn = ops[i].fn;

	if (sqlite3_exec(f->db, "BEGIN IMMEDIATE; SAVEPOINT op;", NULL, NULL, NULL) != SQLITE_OK) {
		lerr(result, 1, "InternalError", "fsm: begin: %s", sqlite3_errmsg(f->db));
		return SDB_EIO;
	}
	if (!fn) {
		rc = lerr(result, E_FAILED_TO_PARSE, "unknown metadata command %s",
			  c.op ? c.op : "(none)");
	} else {
		rc = fn(f, &c, result);
	}
	if (rc < 0)
		goto fail;
	if (rc == LOGICAL) {
		if (sqlite3_exec(f->db, "ROLLBACK TO op;", NULL, NULL, NULL) != SQLITE_OK)
			goto fail;
	} else if (!bson_has_field(result, "ok")) {
		BSON_APPEND_DOUBLE(result, "ok", 1.0);
	}
	if (sqlite3_exec(f->db, "RELEASE op;", NULL, NULL, NULL) != SQLITE_OK)
		goto fail;
	if (meta_set(f, "last_applied", (int64_t)index) != 0)
		goto fail;
	/* The apply chain: a hash over every applied command and its index, in order, so
	 * two members with equal chains applied the same commands in the same order (not
	 * merely reached the same state). */
	{
		int64_t prev;
		if (meta_get(f, "apply_chain", &prev) != 0)
			goto fail;
		uint64_t chain = XXH64(bson_get_data(cmd), (size_t)doc_len(cmd), (uint64_t)prev ^ index);
		if (meta_set(f, "apply_chain", (int64_t)chain) != 0)
			goto fail;
	}
	if (sqlite3_exec(f->db, "COMMIT;", NULL, NULL, NULL) != SQLITE_OK)
		goto fail;
	f->last_applied = index;
	if (meta_get(f, "routing_version", &f->routing_version) != 0)
		return SDB_EIO;
	free(f->wire_cache);
	f->wire_cache = NULL;
	return 0;
fail:
	sdb_error("fsm: apply failed", "index=%llu op=%s err=\"%s\"", (unsigned long long)index,
		  c.op ? c.op : "-", sqlite3_errmsg(f->db));
	sqlite3_exec(f->db, "ROLLBACK;", NULL, NULL, NULL);
	lerr(result, 1, "InternalError", "state machine storage failure");
	return SDB_EIO;
}

/* The BSON document at the start of an entry buffer. libraft's disk format pads entry
 * data to a multiple of 8 bytes, so an entry loaded from disk may be longer than the
 * document: the length comes from the document's own int32 header, checked against the
 * buffer (never trusted beyond it). Returns 1 on success. */
static int entry_doc(const struct raft_buffer *buf, bson_t *out)
{
	uint32_t len;
	if (buf->len < 5 || buf->len > INT32_MAX)
		return 0;
	memcpy(&len, buf->base, 4);
	len = BSON_UINT32_FROM_LE(len);
	if (len < 5 || len > buf->len)
		return 0;
	return bson_init_static(out, buf->base, len) ? 1 : 0;
}

static int vt_apply(struct raft_fsm *vt, const struct raft_buffer *buf, void **result)
{
	sdb_fsm *f = vt->data;
	bson_t cmd, *res = bson_new();
	uint64_t index = f->raft ? raft_last_applied(f->raft) + 1 : f->last_applied + 1;
	int rc, valid;

	*result = NULL;
	if (f->last_result) {
		bson_destroy(f->last_result);
		f->last_result = NULL;
	}
	valid = entry_doc(buf, &cmd);
	if (!valid) {
		/* A malformed entry: applied as a no-op so every member agrees. */
		bson_t empty = BSON_INITIALIZER;
		rc = sdb_fsm_apply_doc(f, index, &empty, res);
	} else {
		rc = sdb_fsm_apply_doc(f, index, &cmd, res);
	}
	sdb_debug("fsm: apply", "index=%llu op=%s last_applied=%llu len=%zu", (unsigned long long)index,
		  valid && arg_str(&cmd, "op") ? arg_str(&cmd, "op") : "-",
		  (unsigned long long)f->last_applied, buf->len);
	if (rc != 0) {
		bson_destroy(res);
		return RAFT_IOERR;
	}
	f->last_result = res;
	return 0;
}

bson_t *sdb_fsm_take_result(sdb_fsm *f)
{
	bson_t *r = f->last_result;
	f->last_result = NULL;
	return r;
}

/* --------------------------------------------------------------- snapshots */

/* Monotonic ms, for the snapshot and restore durations logged (issue #26). */
static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int vt_snapshot(struct raft_fsm *vt, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	sdb_fsm *f = vt->data;
	sqlite3_int64 size = 0;
	double t0 = mono_ms();
	unsigned char *img = sqlite3_serialize(f->db, "main", &size, 0);
	if (!img || size < 100)
		return RAFT_IOERR;
	*bufs = raft_malloc(sizeof **bufs);
	if (!*bufs) {
		sqlite3_free(img);
		return RAFT_NOMEM;
	}
	(*bufs)[0].base = raft_malloc((size_t)size);
	if (!(*bufs)[0].base) {
		raft_free(*bufs);
		sqlite3_free(img);
		return RAFT_NOMEM;
	}
	memcpy((*bufs)[0].base, img, (size_t)size);
	/* File format bytes 18/19 say "WAL" for our on-disk db; a deserialized image must
	 * use the rollback journal (https://sqlite.org/fileformat.html §1.3.3). */
	((unsigned char *)(*bufs)[0].base)[18] = 1;
	((unsigned char *)(*bufs)[0].base)[19] = 1;
	(*bufs)[0].len = (size_t)size;
	*n_bufs = 1;
	sqlite3_free(img);
	sdb_info("fsm: snapshot taken", "last_applied=%llu bytes=%lld ms=%.1f",
		 (unsigned long long)f->last_applied, (long long)size, mono_ms() - t0);
	return 0;
}

static int restore_image(sdb_fsm *f, const void *data, size_t len)
{
	sqlite3 *tmp = NULL;
	sqlite3_backup *bk;
	unsigned char *copy;
	int rc = SDB_EIO;

	if (len < 100 || len > ((size_t)1 << 31))
		return SDB_ECORRUPT;
	if (sqlite3_open(":memory:", &tmp) != SQLITE_OK)
		goto out;
	copy = sqlite3_malloc64(len);
	if (!copy)
		goto out;
	memcpy(copy, data, len);
	if (sqlite3_deserialize(tmp, "main", copy, (sqlite3_int64)len, (sqlite3_int64)len,
				SQLITE_DESERIALIZE_FREEONCLOSE | SQLITE_DESERIALIZE_RESIZEABLE) !=
	    SQLITE_OK)
		goto out;
	bk = sqlite3_backup_init(f->db, "main", tmp, "main");
	if (!bk)
		goto out;
	sqlite3_backup_step(bk, -1);
	if (sqlite3_backup_finish(bk) != SQLITE_OK)
		goto out;
	/* an image from an earlier version lacks the newer tables (user_sha1) */
	if (sqlite3_exec(f->db, schema_sql, NULL, NULL, NULL) != SQLITE_OK ||
	    fsm_routing_schema(f->db) != 0)
		goto out;
	free(f->wire_cache);
	f->wire_cache = NULL;
	rc = load_cache(f);
out:
	if (rc != 0)
		sdb_error("fsm: restore failed", "err=\"%s\"", tmp ? sqlite3_errmsg(tmp) : "open");
	sqlite3_close(tmp);
	return rc;
}

static int vt_restore(struct raft_fsm *vt, struct raft_buffer *buf)
{
	sdb_fsm *f = vt->data;
	double t0 = mono_ms();
	int rc = restore_image(f, buf->base, buf->len);
	if (rc != 0)
		return RAFT_CORRUPT;
	sdb_info("fsm: restored snapshot", "last_applied=%llu routing_version=%lld bytes=%zu ms=%.1f",
		 (unsigned long long)f->last_applied, (long long)f->routing_version, buf->len,
		 mono_ms() - t0);
	raft_free(buf->base);
	return 0;
}

/* --------------------------------------------------------------- open/close */

int sdb_fsm_open(const char *path, sdb_fsm **out, char *err, size_t errlen)
{
	sdb_fsm *f = sdb_calloc(1, sizeof *f);
	int mem = strcmp(path, ":memory:") == 0;
	if (sqlite3_open_v2(path, &f->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
	    SQLITE_OK) {
		sdb_errf(err, errlen, SDB_EIO, "fsm: open %s: %s", path,
			 f->db ? sqlite3_errmsg(f->db) : "out of memory");
		goto fail;
	}
	if (sqlite3_exec(f->db,
			 mem ? "PRAGMA foreign_keys=OFF;"
			     : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
			 NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_exec(f->db, schema_sql, NULL, NULL, NULL) != SQLITE_OK ||
	    fsm_routing_schema(f->db) != 0) {
		sdb_errf(err, errlen, SDB_EIO, "fsm: schema %s: %s", path, sqlite3_errmsg(f->db));
		goto fail;
	}
	if (load_cache(f) != 0) {
		sdb_errf(err, errlen, SDB_EIO, "fsm: read meta: %s", sqlite3_errmsg(f->db));
		goto fail;
	}
	f->vt.version = 1;
	f->vt.data = f;
	f->vt.apply = vt_apply;
	f->vt.snapshot = vt_snapshot;
	f->vt.restore = vt_restore;
	*out = f;
	return 0;
fail:
	sqlite3_close(f->db);
	free(f);
	return SDB_EIO;
}

void sdb_fsm_close(sdb_fsm *f)
{
	if (!f)
		return;
	if (f->last_result)
		bson_destroy(f->last_result);
	free(f->wire_cache);
	sqlite3_close(f->db);
	free(f);
}

struct raft_fsm *sdb_fsm_raft(sdb_fsm *f) { return &f->vt; }
void sdb_fsm_bind(sdb_fsm *f, struct raft *r) { f->raft = r; }
struct sqlite3 *sdb_fsm_db(sdb_fsm *f)
{
	return f->db;
}

uint64_t sdb_fsm_last_applied(const sdb_fsm *f) { return f->last_applied; }

uint64_t sdb_fsm_apply_chain(sdb_fsm *f)
{
	int64_t v = 0;
	meta_get(f, "apply_chain", &v);
	return (uint64_t)v;
}
int64_t sdb_fsm_routing_version(const sdb_fsm *f) { return f->routing_version; }

const char *sdb_fsm_member_wire(sdb_fsm *f, uint64_t id)
{
	sqlite3_stmt *st = q(f, "SELECT wire FROM members WHERE id = ?", "i", (int64_t)id);
	const char *w = NULL;
	if (!st)
		return NULL;
	if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_TEXT) {
		free(f->wire_cache);
		f->wire_cache = sdb_strdup((const char *)sqlite3_column_text(st, 0));
		w = f->wire_cache;
	}
	sqlite3_finalize(st);
	return w;
}

uint64_t sdb_fsm_hash(sdb_fsm *f)
{
	XXH64_state_t *h = XXH64_createState();
	uint64_t out;
	char sql[128];
	XXH64_reset(h, 0);
	for (size_t t = 0; t < sizeof hash_tables / sizeof hash_tables[0]; t++) {
		sqlite3_stmt *st;
		snprintf(sql, sizeof sql, "SELECT * FROM %s ORDER BY 1", hash_tables[t]);
		if (sqlite3_prepare_v2(f->db, sql, -1, &st, NULL) != SQLITE_OK)
			continue;
		XXH64_update(h, hash_tables[t], strlen(hash_tables[t]));
		while (sqlite3_step(st) == SQLITE_ROW) {
			int nc = sqlite3_column_count(st);
			for (int i = 0; i < nc; i++) {
				unsigned char ty = (unsigned char)sqlite3_column_type(st, i);
				XXH64_update(h, &ty, 1);
				if (ty == SQLITE_INTEGER) {
					int64_t v = sqlite3_column_int64(st, i);
					XXH64_update(h, &v, sizeof v);
				} else if (ty == SQLITE_TEXT || ty == SQLITE_BLOB) {
					const void *p = sqlite3_column_blob(st, i);
					int n = sqlite3_column_bytes(st, i);
					XXH64_update(h, &n, sizeof n);
					if (p && n > 0)
						XXH64_update(h, p, (size_t)n);
				}
			}
		}
		sqlite3_finalize(st);
	}
	out = XXH64_digest(h);
	XXH64_freeState(h);
	return out;
}

/* --------------------------------------------------------------- queries */

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

int sdb_fsm_query(sdb_fsm *f, const char *name, const bson_t *cmd, bson_t *reply, char *err,
		  size_t errlen)
{
	sqlite3_stmt *st = NULL;
	bson_t arr, d;
	char k[16];
	int i = 0;

	if (strcmp(name, "getRoutingTable") == 0)
		return query_routing(f, cmd, reply, err, errlen);
	if (strcmp(name, "listRatelimitPeers") == 0)
		return sdb_fsm_peers_query(f->db, reply);
	if (strcmp(name, "listShards") == 0) {
		st = q(f, "SELECT id, uri, state FROM shards ORDER BY id", NULL);
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
	} else if (strcmp(name, "listDatabases") == 0) {
		st = q(f, "SELECT name, tenant FROM dbs ORDER BY name", NULL);
		if (!st)
			return SDB_EIO;
		bson_append_array_begin(reply, "databases", -1, &arr);
		while (sqlite3_step(st) == SQLITE_ROW) {
			snprintf(k, sizeof k, "%d", i++);
			bson_append_document_begin(&arr, k, -1, &d);
			BSON_APPEND_UTF8(&d, "name", (const char *)sqlite3_column_text(st, 0));
			if (sqlite3_column_type(st, 1) == SQLITE_TEXT)
				BSON_APPEND_UTF8(&d, "tenant", (const char *)sqlite3_column_text(st, 1));
			bson_append_document_end(&arr, &d);
		}
		bson_append_array_end(reply, &arr);
	} else if (strcmp(name, "listCollections") == 0) {
		const char *db = arg_str(cmd, "db");
		st = db ? q(f, "SELECT ns, key, hashed FROM colls WHERE db = ? ORDER BY ns", "t", db)
			: q(f, "SELECT ns, key, hashed FROM colls ORDER BY ns", NULL);
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
	} else if (strcmp(name, "getMigration") == 0) {
		const char *id = first_str(cmd);
		if (!id)
			return sdb_errf(err, errlen, SDB_EINVAL, "getMigration needs a migration id");
		st = q(f, "SELECT " MIG_COLS " FROM migrations WHERE id = ?", "t", id);
		if (!st)
			return SDB_EIO;
		if (sqlite3_step(st) != SQLITE_ROW) {
			sqlite3_finalize(st);
			return sdb_errf(err, errlen, SDB_ENOTFOUND, "migration %s not found", id);
		}
		append_migration(reply, "migration", st);
	} else if (strcmp(name, "listMigrations") == 0) {
		const char *state = arg_str(cmd, "state");
		st = state ? q(f, "SELECT " MIG_COLS " FROM migrations WHERE state = ? ORDER BY id",
			       "t", state)
			   : q(f, "SELECT " MIG_COLS " FROM migrations ORDER BY id", NULL);
		if (!st)
			return SDB_EIO;
		bson_append_array_begin(reply, "migrations", -1, &arr);
		while (sqlite3_step(st) == SQLITE_ROW) {
			snprintf(k, sizeof k, "%d", i++);
			append_migration(&arr, k, st);
		}
		bson_append_array_end(reply, &arr);
	} else if (strcmp(name, "listTenants") == 0) {
		int64_t uv;
		if (meta_get(f, "users_version", &uv) != 0)
			return SDB_EIO;
		BSON_APPEND_INT64(reply, "usersVersion", uv);
		st = q(f, "SELECT name, quota, policy FROM tenants ORDER BY name", NULL);
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
	} else if (strcmp(name, "listUsers") == 0) {
		int64_t uv;
		if (meta_get(f, "users_version", &uv) != 0)
			return SDB_EIO;
		BSON_APPEND_INT64(reply, "usersVersion", uv);
		st = q(f, "SELECT name, tenant FROM users ORDER BY name", NULL);
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
	} else if (strcmp(name, "getUser") == 0) {
		const char *u = first_str(cmd);
		if (!u)
			return sdb_errf(err, errlen, SDB_EINVAL, "getUser needs a user name");
		st = q(f,
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
		st = q(f,
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
			if (meta_get(f, "users_version", &uv) != 0) {
				sqlite3_finalize(st);
				return SDB_EIO;
			}
			BSON_APPEND_INT64(reply, "usersVersion", uv);
		}
	} else if (strcmp(name, "listMembers") == 0) {
		st = q(f, "SELECT id, raft, wire FROM members ORDER BY id", NULL);
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
	} else if (strcmp(name, "getLease") == 0) {
		const char *n = first_str(cmd);
		if (!n)
			return sdb_errf(err, errlen, SDB_EINVAL, "getLease needs a lease name");
		st = q(f, "SELECT holder, expires_ms, epoch FROM leases WHERE name = ?", "t", n);
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
	} else {
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "unknown metadata query %s", name);
	}
	sqlite3_finalize(st);
	return 0;
}
