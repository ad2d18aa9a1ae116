/* The metadata state machine on SQLite. Contract in fsm.h; command reference in
 * src/metadata/README.md. */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/bsonval.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "raft/migstate.h"
#include "raft/fsm_peers.h"
#include "raft/routing.h"
#include "raft/fsm_int.h"

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
sqlite3_stmt *fsm_q(sdb_fsm *f, const char *sql, const char *fmt, ...)
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
int fsm_x(sdb_fsm *f, const char *sql, const char *fmt, ...)
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
int fsm_q_int(sdb_fsm *f, int64_t *out, const char *sql, const char *fmt, ...)
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

int fsm_meta_get(sdb_fsm *f, const char *key, int64_t *out)
{
	*out = 0;
	int rc = fsm_q_int(f, out, "SELECT v FROM meta WHERE k = ?", "t", key);
	return rc < 0 ? rc : 0;
}

int fsm_meta_set(sdb_fsm *f, const char *key, int64_t v)
{
	return fsm_x(f, "INSERT INTO meta(k, v) VALUES(?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
		 "ti", key, v);
}

/* ---------------------------------------------------------------- bson helpers */

const char *fsm_arg_str(const bson_t *args, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, args, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* Apply side of the integer rule. The leader (src/metadata/role.c h_write) refuses a
 * fractional, NaN or out-of-range double with common/bsonget.h's sdb_bson_get_int64 before
 * proposing, so entries written from now on hold exact integers. This function must still
 * apply every entry already in a log or snapshot exactly as the earlier versions did, on
 * every member, or members replaying the same log would disagree (rolling upgrade): those
 * versions took a double within +-9.2e18 truncated toward zero (2.5 -> 2) and treated NaN
 * and anything beyond that bound as missing. So: the bound first (note it is narrower than
 * sdb_bson_as_int64's 2^63), then the common rule for int32, int64 and integral doubles,
 * then the legacy truncation, which only an old leader's entry can reach. Deterministic:
 * the IEEE double and its truncation are the same on every member. */
int fsm_arg_int(const bson_t *args, const char *key, int64_t *out)
{
	bson_iter_t it;
	double d;

	if (!bson_iter_init_find(&it, args, key))
		return 0;
	if (BSON_ITER_HOLDS_DOUBLE(&it)) {
		d = bson_iter_double(&it);
		if (d != d || d < -9.2e18 || d > 9.2e18)
			return 0;
	}
	if (sdb_bson_as_int64(&it, out))
		return 1;
	if (BSON_ITER_HOLDS_DOUBLE(&it)) {
		*out = (int64_t)bson_iter_double(&it); /* legacy entries only, see above */
		return 1;
	}
	return 0;
}

/* Document or array view of args[key]; returns 1 when found with that type. */
int fsm_arg_doc(const bson_t *args, const char *key, bson_t *out, int want_array)
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

int fsm_lerr(bson_t *res, int code, const char *name, const char *fmt, ...)
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

/* The key order of entries stamped below MIGSTATE_OP_VERSION_KEY_ORDER (and of unstamped
 * ones), kept exactly as it was so that an old log replays to the same chunks: a rank of
 * the BSON type (MongoDB's comparison order, simplified: all numbers compare together;
 * null == undefined, regex, code, dbPointer... one rank), then int32/int64 by value,
 * other numbers through bson_iter_as_double (a Decimal128 reads as 0, a NaN equals every
 * number), strings bytewise, bool/date/ObjectId by value, anything else (documents,
 * arrays, binary data, timestamps...) equal within its rank. Do not change it. */
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

static int cmp_value_v1(const bson_iter_t *a, const bson_iter_t *b)
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

/* Compare two shard-key documents field by field (positionally), in the order of the
 * entry's op version (fsm_int.h). */
int fsm_cmp_key(const bson_t *a, const bson_t *b, int64_t opv)
{
	bson_iter_t ia, ib;
	if (opv >= MIGSTATE_OP_VERSION_KEY_ORDER)
		return sdb_bson_key_cmp_v4(a, b); /* op version 4: decimals as long doubles */
	if (!bson_iter_init(&ia, a) || !bson_iter_init(&ib, b))
		return 0;
	for (;;) {
		bool na = bson_iter_next(&ia), nb = bson_iter_next(&ib);
		if (!na || !nb)
			return na == nb ? 0 : (na ? 1 : -1);
		int c = cmp_value_v1(&ia, &ib);
		if (c)
			return c;
	}
}

/* Does the document have exactly the key's fields in order? */
int fsm_key_matches(const bson_t *keypat, const bson_t *doc)
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
	/* issue #18: the proxies' pings, for config.mongos (pingProxy, op version 3) */
	"CREATE TABLE IF NOT EXISTS proxies (addr TEXT PRIMARY KEY, started_ms INTEGER NOT NULL,"
	" ping_ms INTEGER NOT NULL, version TEXT);"
	SDB_FSM_PEERS_SCHEMA; /* issue #23: rate-limit peer membership (fsm_peers.c) */

/* Tables hashed by sdb_fsm_hash, in a fixed order. */
static const char *const hash_tables[] = {"meta",   "shards", "dbs",     "colls", "chunks",
					  "migrations", "leases", "tenants", "users", "user_sha1",
					  "members", "ratelimit_peers", "routing_removed"};

static int load_cache(sdb_fsm *f)
{
	int64_t v;
	if (fsm_meta_get(f, "last_applied", &v) != 0)
		return SDB_EIO;
	f->last_applied = (uint64_t)v;
	if (fsm_meta_get(f, "routing_version", &v) != 0)
		return SDB_EIO;
	f->routing_version = v;
	return 0;
}

/* --------------------------------------------------------------- ops */

int fsm_bump_routing(sdb_fsm *f, int64_t *rv)
{
	int64_t v;
	if (fsm_meta_get(f, "routing_version", &v) != 0)
		return SDB_EIO;
	v++;
	if (fsm_meta_set(f, "routing_version", v) != 0 || fsm_routing_prune(f->db, v) != 0)
		return SDB_EIO;
	*rv = v;
	return 0;
}

int fsm_next_id(sdb_fsm *f, const char *key, int64_t *out)
{
	int64_t v;
	if (fsm_meta_get(f, key, &v) != 0)
		return SDB_EIO;
	v++;
	if (fsm_meta_set(f, key, v) != 0)
		return SDB_EIO;
	*out = v;
	return 0;
}

int fsm_exists(sdb_fsm *f, const char *sql, const char *val)
{
	int64_t one;
	return fsm_q_int(f, &one, sql, "t", val);
}

static int op_register_member(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id;
	const char *raft = fsm_arg_str(&c->args, "raft"), *wire = fsm_arg_str(&c->args, "wire");
	if (!fsm_arg_int(&c->args, "id", &id) || id <= 0)
		return fsm_lerr(res, E_BAD_VALUE, "registerMember needs a positive id");
	return fsm_x(f,
		 "INSERT INTO members(id, raft, wire) VALUES(?, ?, ?) ON CONFLICT(id) DO UPDATE"
		 " SET raft = coalesce(excluded.raft, raft), wire = coalesce(excluded.wire, wire)",
		 "itt", id, raft, wire)
		       ? SDB_EIO
		       : 0;
}

static int op_remove_member(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id;
	if (!fsm_arg_int(&c->args, "id", &id))
		return fsm_lerr(res, E_BAD_VALUE, "removeMember needs an id");
	return fsm_x(f, "DELETE FROM members WHERE id = ?", "i", id) ? SDB_EIO : 0;
}

/* issue #23: rate-limit peer membership, kept in its own file (raft/fsm_peers.c) */
static int op_ratelimit_peers(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int rc = sdb_fsm_peers_apply(f->db, c->op, c->ts, &c->args, res);
	return rc == 1 ? LOGICAL : rc;
}

static const struct {
	const char *name;
	op_fn fn;
} ops[] = {
	{"addShard", fsm_op_add_shard},
	{"removeShard", fsm_op_remove_shard},
	{"createDatabase", fsm_op_create_database},
	{"dropDatabase", fsm_op_drop_database},
	{"shardCollection", fsm_op_shard_collection},
	{"dropCollection", fsm_op_drop_collection},
	{"splitChunk", fsm_op_split_chunk},
	{"mergeChunks", fsm_op_merge_chunks},
	{"setChunkShard", fsm_op_set_chunk_shard},
	{"registerMigration", fsm_op_register_migration},
	{"updateMigration", fsm_op_update_migration},
	{"deleteMigration", fsm_op_delete_migration},
	{"setOpVersion", fsm_op_set_op_version},
	{"setShardDraining", fsm_op_set_shard_draining},
	{"pingProxy", fsm_op_ping_proxy},
	{"acquireLease", fsm_op_lease},
	{"renewLease", fsm_op_lease},
	{"releaseLease", fsm_op_lease},
	{"createTenant", fsm_op_create_tenant},
	{"setQuota", fsm_op_tenant_doc},
	{"setPolicy", fsm_op_tenant_doc},
	{"createUser", fsm_op_create_user},
	{"updateUser", fsm_op_update_user},
	{"dropUser", fsm_op_drop_user},
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
	c.op = fsm_arg_str(cmd, "op");
	if (!fsm_arg_int(cmd, "ts", &c.ts))
		c.ts = 0;
	if (!fsm_arg_doc(cmd, "args", &c.args, 0))
		bson_init(&c.args);
	for (size_t i = 0; c.op && i < sizeof ops / sizeof ops[0]; i++)
		if (strcmp(ops[i].name, c.op) == 0)
			fn = ops[i].fn;

	if (sqlite3_exec(f->db, "BEGIN IMMEDIATE; SAVEPOINT op;", NULL, NULL, NULL) != SQLITE_OK) {
		fsm_lerr(result, 1, "InternalError", "fsm: begin: %s", sqlite3_errmsg(f->db));
		return SDB_EIO;
	}
	if (!fn) {
		rc = fsm_lerr(result, E_FAILED_TO_PARSE, "unknown metadata command %s",
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
	if (fsm_meta_set(f, "last_applied", (int64_t)index) != 0)
		goto fail;
	/* The apply chain: a hash over every applied command and its index, in order, so
	 * two members with equal chains applied the same commands in the same order (not
	 * merely reached the same state). */
	{
		int64_t prev;
		if (fsm_meta_get(f, "apply_chain", &prev) != 0)
			goto fail;
		uint64_t chain = XXH64(bson_get_data(cmd), (size_t)fsm_doc_len(cmd), (uint64_t)prev ^ index);
		if (fsm_meta_set(f, "apply_chain", (int64_t)chain) != 0)
			goto fail;
	}
	if (sqlite3_exec(f->db, "COMMIT;", NULL, NULL, NULL) != SQLITE_OK)
		goto fail;
	f->last_applied = index;
	if (fsm_meta_get(f, "routing_version", &f->routing_version) != 0)
		return SDB_EIO;
	free(f->wire_cache);
	f->wire_cache = NULL;
	return 0;
fail:
	sdb_error("fsm: apply failed", "index=%llu op=%s err=\"%s\"", (unsigned long long)index,
		  c.op ? c.op : "-", sqlite3_errmsg(f->db));
	sqlite3_exec(f->db, "ROLLBACK;", NULL, NULL, NULL);
	fsm_lerr(result, 1, "InternalError", "state machine storage failure");
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
		  valid && fsm_arg_str(&cmd, "op") ? fsm_arg_str(&cmd, "op") : "-",
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

static int vt_snapshot(struct raft_fsm *vt, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	sdb_fsm *f = vt->data;
	sqlite3_int64 size = 0;
	double t0 = ((double)sdb_mono_ns() / 1e6);
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
		 (unsigned long long)f->last_applied, (long long)size, ((double)sdb_mono_ns() / 1e6) - t0);
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
	    fsm_routing_schema(f->db) != 0 || fsm_dbs_schema(f->db) != 0)
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
	double t0 = ((double)sdb_mono_ns() / 1e6);
	int rc = restore_image(f, buf->base, buf->len);
	if (rc != 0)
		return RAFT_CORRUPT;
	sdb_info("fsm: restored snapshot", "last_applied=%llu routing_version=%lld bytes=%zu ms=%.1f",
		 (unsigned long long)f->last_applied, (long long)f->routing_version, buf->len,
		 ((double)sdb_mono_ns() / 1e6) - t0);
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
	    fsm_routing_schema(f->db) != 0 || fsm_dbs_schema(f->db) != 0) {
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
	fsm_meta_get(f, "apply_chain", &v);
	return (uint64_t)v;
}
int64_t sdb_fsm_routing_version(const sdb_fsm *f) { return f->routing_version; }

const char *sdb_fsm_member_wire(sdb_fsm *f, uint64_t id)
{
	sqlite3_stmt *st = fsm_q(f, "SELECT wire FROM members WHERE id = ?", "i", (int64_t)id);
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

int64_t sdb_fsm_op_version(sdb_fsm *f)
{
	int64_t v = 0;
	if (fsm_meta_get(f, "op_version", &v) != 0 || v < MIGSTATE_OP_VERSION)
		return MIGSTATE_OP_VERSION;
	return v;
}

bool sdb_fsm_op_version_set(sdb_fsm *f)
{
	int64_t v = 0;
	return fsm_q_int(f, &v, "SELECT v FROM meta WHERE k = ?", "t", "op_version") == 1;
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
	{
		/* proxies (op version 3) only once it has rows, so that members of a version
		 * without the table hash an equal state equally during a rolling upgrade */
		sqlite3_stmt *st;
		bool named = false;
		if (sqlite3_prepare_v2(f->db, "SELECT addr, started_ms, ping_ms, version FROM proxies"
					   " ORDER BY 1", -1, &st, NULL) == SQLITE_OK) {
			while (sqlite3_step(st) == SQLITE_ROW) {
				if (!named)
					XXH64_update(h, "proxies", 7);
				named = true;
				for (int i = 0; i < 4; i++) {
					int64_t v = sqlite3_column_int64(st, i);
					int n = sqlite3_column_bytes(st, i);
					const void *p = sqlite3_column_blob(st, i);
					if (i == 1 || i == 2)
						XXH64_update(h, &v, sizeof v);
					else if (p && n > 0)
						XXH64_update(h, p, (size_t)n);
				}
			}
			sqlite3_finalize(st);
		}
	}
	{
		/* ratelimit_peer_instances (issue #23 retest) likewise only once it has rows */
		sqlite3_stmt *st;
		bool named = false;
		if (sqlite3_prepare_v2(f->db, "SELECT addr, instance FROM ratelimit_peer_instances"
					   " ORDER BY 1", -1, &st, NULL) == SQLITE_OK) {
			while (sqlite3_step(st) == SQLITE_ROW) {
				if (!named)
					XXH64_update(h, "ratelimit_peer_instances", 24);
				named = true;
				for (int i = 0; i < 2; i++) {
					int n = sqlite3_column_bytes(st, i);
					const void *p = sqlite3_column_blob(st, i);
					XXH64_update(h, &n, sizeof n);
					if (p && n > 0)
						XXH64_update(h, p, (size_t)n);
				}
			}
			sqlite3_finalize(st);
		}
	}
	out = XXH64_digest(h);
	XXH64_freeState(h);
	return out;
}
