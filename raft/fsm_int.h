/* Internals of the metadata state machine (raft/fsm.c: SQL and argument helpers, schema,
 * apply, snapshots, queries, members; fsm_routing.c: shards, databases, collections and
 * chunks; fsm_migration.c: migrations and leases; fsm_auth.c: tenants and users). Not for
 * use outside raft/fsm*.c. */
#ifndef SDB_RAFT_FSM_INT_H
#define SDB_RAFT_FSM_INT_H

#include <bson/bson.h>
#include <sqlite3.h>
#include <stdint.h>

#include "raft/fsm.h"

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
#define E_CONFLICTING_OPERATION 117, "ConflictingOperationInProgress"
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

/* An op: apply command c (its args a view into the log entry) inside the entry's SQLite
 * transaction. Returns 0 (res filled), LOGICAL (a logical error already written to res
 * by fsm_lerr: the transaction is rolled back, the entry still applies) or an SDB_E*
 * code (I/O: the member stops). */
typedef int (*op_fn)(sdb_fsm *f, cmdctx *c, bson_t *res);

/* SQL helpers. fmt names the bind types of the variadic arguments, one letter each:
 * 't' text (const char *; NULL binds NULL), 'i' int64_t, 'b' blob (const uint8_t *, int
 * length; NULL binds NULL), any other letter NULL (no argument consumed). fsm_q: a
 * prepared, bound statement (caller finalizes) or NULL; fsm_x: execute (Errors: SDB_EIO,
 * also a failed bind); fsm_q_int: the first column of the first row into *out. Returns:
 * (fsm_q_int) 1, 0 when there is no row (*out untouched), or SDB_EIO. */
/* Schema upgrade of the dbs table (issue #18): adds the primary_shard column (TEXT, NULL =
 * the lowest shard id, the behaviour before primaries were recorded) when a data directory or
 * snapshot image of an earlier version lacks it. Idempotent and deterministic (the same
 * on every member: it depends on the schema only). Run after the CREATE statements at open
 * and after a snapshot restore. Errors: SDB_EIO (logged). */
int fsm_dbs_schema(sqlite3 *db);
sqlite3_stmt *fsm_q(sdb_fsm *f, const char *sql, const char *fmt, ...);
int fsm_x(sdb_fsm *f, const char *sql, const char *fmt, ...);
int fsm_q_int(sdb_fsm *f, int64_t *out, const char *sql, const char *fmt, ...);

/* The integer under key in the meta table (*out 0 when absent), and setting it. Errors:
 * SDB_EIO. */
int fsm_meta_get(sdb_fsm *f, const char *key, int64_t *out);
int fsm_meta_set(sdb_fsm *f, const char *key, int64_t v);

/* Command arguments: a UTF-8 field (NULL when missing or not a string, borrowed from
 * args); an integer field (int32, int64 or an in-range double: 1, else 0 and *out
 * untouched); a subdocument (or array, want_array) as a static view into args (1, else 0).
 * Returns: (fsm_arg_int, fsm_arg_doc) 1 found, 0 missing or of another type; never an
 * SDB_E* status.
 */
const char *fsm_arg_str(const bson_t *args, const char *key);
int fsm_arg_int(const bson_t *args, const char *key, int64_t *out);
int fsm_arg_doc(const bson_t *args, const char *key, bson_t *out, int want_array);

/* Write a logical error (code, codeName: name, errmsg) into res; returns LOGICAL. Used
 * with the E_* macros: fsm_lerr(res, E_BAD_VALUE, "...", ...). Returns: always LOGICAL. */
int fsm_lerr(bson_t *res, int code, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Returns: fsm_cmp_key compares two shard-key value documents (<0, 0, >0) in the order of
 * the entry's op version opv (its "opVersion" argument, 0 when absent): from
 * MIGSTATE_OP_VERSION_KEY_ORDER (raft/migstate.h) MongoDB's order (common/bsonval.h
 * sdb_bson_key_cmp, the one routing uses), below it the earlier simplified order
 * (fsm.c cmp_value_v1), so that an old log replays as it applied; fsm_key_matches is 1
 * when doc has exactly keypat's fields in keypat's order, else 0. Neither fails. */
int fsm_cmp_key(const bson_t *a, const bson_t *b, int64_t opv);
int fsm_key_matches(const bson_t *keypat, const bson_t *doc);

/* Returns: the id of a non-terminal migration of chunk `chunk` of ns written into busy
 * (NUL-terminated, n bytes) and 1 when there is one, 0 when not, or SDB_EIO (op versions 3
 * and 4, raft/migstate.h: one migration per chunk; no split or merge of a migrating
 * chunk). */
int fsm_active_migration_of_chunk(sdb_fsm *f, const char *ns, int64_t chunk, char *busy,
				  size_t n);

/* Bump the routing version (pruning the routing diff log) into *rv, and take the next
 * value of counter key into *out. Errors: SDB_EIO. fsm_exists Returns: 1 when sql with
 * the one text parameter val returns a row, 0 when not, or SDB_EIO. */
int fsm_bump_routing(sdb_fsm *f, int64_t *rv);
int fsm_next_id(sdb_fsm *f, const char *key, int64_t *out);
int fsm_exists(sdb_fsm *f, const char *sql, const char *val);

/* Length of a heap document, read from its data (libbson declares bson_t 128-byte
 * aligned but its allocator does not align that much: UBSan's alignment check).
 * Returns: the length in bytes. */
int fsm_doc_len(const bson_t *b);

/* The ops, by family (the table is in fsm.c), each an op_fn. Returns: 0 (res filled) or
 * LOGICAL (a logical error written to res by fsm_lerr: bad arguments, unknown or
 * conflicting objects). Errors: SDB_EIO (a SQLite statement failed: the member stops).
 * Every op below follows this contract. */
int fsm_op_add_shard(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_create_database(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_create_tenant(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_create_user(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_delete_migration(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_drop_collection(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_drop_database(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_drop_user(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_lease(sdb_fsm *f, cmdctx *c, bson_t *res);
/* Whether the lease name (acquireLease) is held by holder and live at ts (epoch ms, an
 * entry's leader stamp). Returns: 1 held, 0 not (absent, expired or another holder's), or
 * SDB_EIO. */
int fsm_lease_held(sdb_fsm *f, const char *name, const char *holder, int64_t ts);
/* setOpVersion {version: 2..MIGSTATE_OP_VERSION_MAX}: the cluster op version (meta key
 * op_version) the leader stamps on registerMigration (raft/migstate.h). Returns and
 * Errors: as every op (0, LOGICAL, SDB_EIO). */
int fsm_op_set_op_version(sdb_fsm *f, cmdctx *c, bson_t *res);
/* setShardDraining {id, draining: bool (default true)}, op version 3 only (an older
 * member does not know it): shards.state 'draining' or 'active'; shardCollection entries
 * of op version 3 place no chunk on a draining shard. Returns and Errors: as every op. */
int fsm_op_set_shard_draining(sdb_fsm *f, cmdctx *c, bson_t *res);
/* pingProxy {addr "H:P", startedMS (epoch ms the proxy started; default and upper bound the
 * entry's ts), version}, op version 3 only: upsert the proxies row with ping_ms = ts (the
 * leader's stamp); rows not pinged for 7 days are dropped. Read by listProxies
 * (config.mongos through a proxy). Returns and Errors: as every op. */
int fsm_op_ping_proxy(sdb_fsm *f, cmdctx *c, bson_t *res);
/* The remaining ops (fsm_routing.c, fsm_migration.c, fsm_auth.c). Returns and Errors: as
 * every op (0, LOGICAL, SDB_EIO). */
int fsm_op_merge_chunks(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_register_migration(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_remove_shard(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_set_chunk_shard(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_shard_collection(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_split_chunk(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_tenant_doc(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_update_migration(sdb_fsm *f, cmdctx *c, bson_t *res);
int fsm_op_update_user(sdb_fsm *f, cmdctx *c, bson_t *res);

#endif
