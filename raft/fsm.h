/* The metadata state machine: deterministic BSON commands applied to SQLite.
 *
 * Every committed Raft COMMAND entry carries one BSON document (the "command"):
 *
 *   { op: "<name>", ts: <int64 epoch ms stamped by the leader>,
 *     rnd: <binary, optional, leader-stamped random bytes>, args: { ... } }
 *
 * Apply reads nothing but the command and the database: no clock, no random, no
 * environment. Logical failures (unknown shard, compare-and-set mismatch, ...) are
 * RESULTS ({ok: 0, code, errmsg}) handed back to the proposer; apply itself returns a
 * non-zero status only when SQLite fails, which stalls raft on purpose (the node is
 * then unhealthy and is expected to abort).
 *
 * The index of the last applied command is written to the `meta` table in the same
 * SQLite transaction as the command's effects, so a replay after restart (libraft
 * replays every entry after the last snapshot) skips entries already applied.
 * Snapshots are sqlite3_serialize() images; restore copies the image into the on-disk
 * file with the backup API (Raft paper §7, dissertation §5.1).
 *
 * The op names, their arguments and their results are documented in
 * src/metadata/README.md. Every op that changes routing (shardCollection,
 * dropCollection, dropDatabase, splitChunk, mergeChunks, setChunkShard) increments the
 * routing version exactly once in its transaction; chunks carry the routing version
 * of their last change, and removed chunks and collections leave tombstones with the
 * version that removed them, so getRoutingTable answers diffs (raft/routing.h).
 */
#ifndef SDB_RAFT_FSM_H
#define SDB_RAFT_FSM_H

#include <bson/bson.h>
#include <raft.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sdb_fsm sdb_fsm;

/* Open (creating when missing) the state machine database at path (a file path, or
 * ":memory:" for tests) and create the schema. Free with sdb_fsm_close(). Single-threaded:
 * use it from the raft loop thread only. Errors: SDB_EIO with a message (the database
 * cannot be opened, given its schema or its meta read; *out untouched). */
int sdb_fsm_open(const char *path, sdb_fsm **out, char *err, size_t errlen);
void sdb_fsm_close(sdb_fsm *fsm);

/* The raft_fsm vtable (version 1) backed by fsm, to pass to raft_init or
 * raft_fixture_init. Owned by fsm. */
struct raft_fsm *sdb_fsm_raft(sdb_fsm *fsm);

/* Tell the fsm which raft instance drives it: apply derives the entry index as
 * raft_last_applied(r) + 1 (libraft updates last_applied after apply returns). Call
 * before raft_start. */
void sdb_fsm_bind(sdb_fsm *fsm, struct raft *r);

/* Apply one command document at log index `index` (used by the raft vtable and by
 * tests directly). Entries with index <= the stored last applied index are skipped
 * and get {ok: 1, skipped: true}. result must be an initialised document (bson_new()
 * or BSON_INITIALIZER); it is cleared and receives the result. A command refused for its
 * content (unknown op, bad arguments, a conflict) is not an error: 0 with {ok: 0, code,
 * errmsg} in result, the op's writes rolled back (the entry still counts as applied).
 * Errors: SDB_EIO when SQLite failed (the transaction is rolled back and *result holds
 * an error doc). */
int sdb_fsm_apply_doc(sdb_fsm *fsm, uint64_t index, const bson_t *cmd, bson_t *result);

/* The result of the most recent raft apply (a bson_new() document), handed over to the
 * caller (who frees it with bson_destroy), or NULL. The raft apply callback of the proposer runs right after
 * the entry is applied, in the same call stack, so it can take its result here. */
bson_t *sdb_fsm_take_result(sdb_fsm *fsm);

/* Read-only queries (any member). name is the wire command name, cmd the command
 * document; reply (initialised by the caller) gets the answer fields. Supported:
 * listShards, listDatabases(Meta), listCollections, getRoutingTable, getMigration,
 * listMigrations, listTenants, listUsers (names and tenants, no verifiers), getUser,
 * listMembers, getLease, listRatelimitPeers (raft/fsm_peers.h). getUser, listUsers and
 * listTenants also answer usersVersion:
 * the number of committed createUser/updateUser/dropUser (callers cache verifiers and
 * user lists per version). Errors: SDB_EINVAL
 * (bad argument, message in err), SDB_ENOTFOUND (unknown query or object),
 * SDB_ENSNOTFOUND (getRoutingTable of a collection that is not sharded: NamespaceNotFound
 * 26 on the wire), SDB_ETOOBIG (getRoutingTable without a cursor over one reply), SDB_EIO. */
int sdb_fsm_query(sdb_fsm *fsm, const char *name, const bson_t *cmd, bson_t *reply,
		  char *err, size_t errlen);

/* Append which namespaces changed routing after version gt to reply: namespaces:
 * [ns...], or namespacesAll: true when this member cannot tell (gt older than the
 * removal horizon, or too many). O(changed chunks). Errors: SDB_EIO. See
 * raft/routing.h. */
int sdb_fsm_routing_changed(sdb_fsm *f, int64_t gt, bson_t *reply);

/* Current values (cheap: cached in memory, refreshed by every apply/restore). */
uint64_t sdb_fsm_last_applied(const sdb_fsm *fsm);
int64_t sdb_fsm_routing_version(const sdb_fsm *fsm);
/* Member wire address recorded with registerMember, or NULL. Pointer valid until the
 * next apply/restore; copy it. */
const char *sdb_fsm_member_wire(sdb_fsm *fsm, uint64_t id);
/* The cluster op version set by setOpVersion (raft/migstate.h): MIGSTATE_OP_VERSION (2)
 * until an operator raises it, also when it cannot be read. Call on the loop thread. */
int64_t sdb_fsm_op_version(sdb_fsm *fsm);
/* Whether a setOpVersion was ever applied (the op_version key exists). */
bool sdb_fsm_op_version_set(sdb_fsm *fsm);

/* The apply chain: XXH64 folded over (index, command bytes) of every command applied,
 * in order (stored with the state, so it survives restarts and travels in snapshots).
 * Equal on two members exactly when they applied the same commands in the same order. */
uint64_t sdb_fsm_apply_chain(sdb_fsm *fsm);

/* XXH64 over every row of every table in primary-key order: equal on two members
 * exactly when they applied the same commands. */
uint64_t sdb_fsm_hash(sdb_fsm *fsm);

/* The state machine's SQLite handle, for the state machine's extension files
 * (raft/fsm_peers.c) to read between applies on the loop thread. Never write to it
 * outside an apply. */
struct sqlite3 *sdb_fsm_db(sdb_fsm *fsm);

/* Is op a known command that the leader may propose? Returns: 1 yes, 0 no. */
int sdb_fsm_is_command(const char *op);

#endif
