/* The routing part of the metadata state machine (issue #26): incremental routing reads
 * and the replicated record of removed chunk ranges. Internal to raft/ (fsm.c calls it
 * with its own SQLite handle, on the raft loop thread).
 *
 * Tables (created with the rest of the schema, see FSM_ROUTING_SCHEMA):
 *
 *   routing_removed(seq INTEGER PRIMARY KEY, version, ns, chunk, min, max)
 *       one row per chunk a routing change removed (mergeChunks: the absorbed chunks),
 *       chunk/min/max NULL for a whole collection removed (dropCollection,
 *       dropDatabase). `version` is the routing version of the change that removed it.
 *       Replicated and hashed like every table; pruned deterministically in apply: every
 *       routing change deletes the rows with version <= routingVersion - FSM_ROUTING_HORIZON.
 *   routing_local(k, v)
 *       member-local facts, not hashed: "upgrade_horizon", the routing version at which
 *       this database first got routing_removed (removals before it were not recorded).
 *
 * Indexes chunks(version) and chunks(ns, version) make a diff O(changed chunks).
 *
 * getRoutingTable (src/metadata/README.md has the reference):
 *   {getRoutingTable: NS | "all", sinceVersion: S, cursor: {batchSize: N},
 *    resumeAfter: {version: V, id: I}}
 *   S absent or <= 0, or S older than the horizon: a full load (full: true, every chunk).
 *   Otherwise a diff (full: false): the chunks whose version > S (their current state)
 *   and, in the first batch, `removed` (the tombstones with version > S).
 *   Without `cursor` the whole answer must fit one reply (else BSONObjectTooLarge);
 *   with `cursor` each reply holds at most batchSize chunks and FSM_ROUTING_BATCH_BYTES,
 *   and says more: true with resumeAfter to pass back. A client that reads several
 *   batches treats the routingVersion of the FIRST batch as the version it now holds
 *   (later batches may already show newer states; the next diff since that version
 *   repairs any mix).
 */
#ifndef SDB_RAFT_ROUTING_H
#define SDB_RAFT_ROUTING_H

#include <bson/bson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

/* Routing versions of removals kept: a client further behind gets a full load. */
#define FSM_ROUTING_HORIZON 10000
/* Bytes of chunk documents in one cursor batch (well under the 16 MB reply limit). */
#define FSM_ROUTING_BATCH_BYTES (8 * 1024 * 1024)
/* Bytes of one reply without a cursor: above it the query fails with TOOBIG. */
#define FSM_ROUTING_REPLY_BYTES (15 * 1024 * 1024)
/* Namespaces named by waitRoutingVersion at most (more: namespacesAll). */
#define FSM_ROUTING_MAX_NS 1000

/* Schema of the routing tables and indexes (idempotent; run after the chunks table). */
#define FSM_ROUTING_SCHEMA                                                                   \
	"CREATE INDEX IF NOT EXISTS chunks_version ON chunks(version);"                      \
	"CREATE INDEX IF NOT EXISTS chunks_ns_version ON chunks(ns, version);"               \
	"CREATE TABLE IF NOT EXISTS routing_removed (seq INTEGER PRIMARY KEY,"               \
	" version INTEGER NOT NULL, ns TEXT NOT NULL, chunk INTEGER, min BLOB, max BLOB);"   \
	"CREATE INDEX IF NOT EXISTS routing_removed_version ON routing_removed(version);"    \
	"CREATE TABLE IF NOT EXISTS routing_local (k TEXT PRIMARY KEY, v INTEGER NOT NULL);"

/* Create the routing tables; on a database that predates them, record the current
 * routing version as this member's upgrade horizon. Errors: SDB_EIO. */
int fsm_routing_schema(sqlite3 *db);

/* Append to out, under key, the BSON document stored in a SQLite blob (blob, len bytes, as
 * sqlite3_column_blob/bytes give it), or null when the blob is empty or not a document.
 * Shared by fsm.c and routing.c's query answers. */
void fsm_append_blob_doc(bson_t *out, const char *key, const void *blob, int len);

/* Tombstones, written in the transaction of the change, BEFORE the rows are deleted,
 * with rv the routing version of the change. Errors: SDB_EIO. */
int fsm_routing_remove_chunk(sqlite3 *db, int64_t rv, int64_t chunk_id);
int fsm_routing_remove_ns(sqlite3 *db, int64_t rv, const char *ns);
int fsm_routing_remove_db(sqlite3 *db, int64_t rv, const char *dbname);

/* Drop tombstones older than the horizon (deterministic: depends on rv only). Errors:
 * SDB_EIO. */
int fsm_routing_prune(sqlite3 *db, int64_t rv);

/* getRoutingTable (see top). rv: the current routing version. reply (initialised)
 * gets the answer fields (and routingVersion with SDB_ENSNOTFOUND). Errors:
 * SDB_ENSNOTFOUND ("collection ... is not sharded"),
 * SDB_EINVAL (bad argument), SDB_ETOOBIG (no cursor and the table does not fit one
 * reply), SDB_EIO. Messages in err. */
int fsm_routing_query(sqlite3 *db, int64_t rv, const bson_t *cmd, bson_t *reply, char *err,
		      size_t errlen);

/* Append to reply which namespaces changed routing after version gt:
 * namespaces: [ns...] (sorted), or namespacesAll: true when gt is older than the
 * horizon or more than FSM_ROUTING_MAX_NS changed. O(changed chunks). Errors: SDB_EIO. */
int fsm_routing_changed_ns(sqlite3 *db, int64_t rv, int64_t gt, bson_t *reply);

#endif
