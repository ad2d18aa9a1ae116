/* Rate-limit peer membership in the metadata state machine (issue #23).
 *
 * Every rate limiter and proxy that joins the rate-limit peer ring registers its gRPC
 * peer address with a lease (`registerRatelimitPeer`) and renews it by registering
 * again. The registry is the table `ratelimit_peers (addr, kind, expires_ms,
 * registered_ms)` and a version (`meta.ratelimit_peers_version`) bumped by one in the
 * same transaction whenever the set of addresses changes (a renewal does not bump it),
 * so members long-poll the version (`waitRatelimitPeers`) and rebuild their ring only
 * on a change.
 *
 * Expiry is decided in the log, not by any reader's clock: the leader proposes
 * `expireRatelimitPeers` when it sees a lease lapse, and apply removes the rows whose
 * expires_ms <= the command's leader-stamped ts (the only clock apply sees; raft/README).
 * Every member applies the same entries, so every member removes the same peers at the
 * same log index and every ring built from a version is the same.
 * Grace after a leader change: the command carries `sinceMS`, when its proposer became
 * the ready leader (its clock, stamped like ts); a row is removed only if also
 * sinceMS + its ttl <= ts. So a peer is never expired by a leader it has not had one
 * full lease to renew with: leases that ran out while the metadata service had no
 * leader (an election, a restart) are renewed, not dropped, and no ring shrinks.
 *
 * Instances (issue #23 retest): a registration may carry `instance`, an id the process
 * draws at random when it starts. An address whose lease is live (expires_ms > ts) under
 * another instance id is refused (DuplicateKey, below): two processes advertising one
 * address would otherwise share one ring entry, and the first to stop would remove the
 * other from every ring. A lease that has run out may be taken over by a new instance
 * (a restart after SIGKILL waits at most one lease). A deregistration with an instance id
 * removes the address only while that instance holds it. Entries without instance (older
 * binaries, still in logs and snapshots) apply as before: a registration without it
 * renews whatever holds the address and keeps the recorded instance, a deregistration
 * without it removes the address.
 *
 * Commands (args as the wire command's fields, result fields on success):
 *   registerRatelimitPeer  addr "H:P", kind "ratelimit"|"proxy", ttlMS 1000..600000,
 *                          instance (optional, 1..64 bytes)
 *                          -> version, expiresMS, added (bool)
 *   deregisterRatelimitPeer addr, instance (optional) -> version, removed (bool)
 *   expireRatelimitPeers   sinceMS (default 0) -> version, expired: [addr]
 * Query:
 *   listRatelimitPeers     -> version, peers: [{addr, kind, expiresMS, registeredMS,
 *                             instance (when recorded)}] (ascending addr)
 * Errors are results {ok: 0, errmsg, code: 2, codeName: "BadValue"}, or for a live
 * address held by another instance {ok: 0, errmsg, code: 11000, codeName:
 * "DuplicateKey"} (MongoDB's code for a second document with one unique key).
 */
#ifndef SDB_RAFT_FSM_PEERS_H
#define SDB_RAFT_FSM_PEERS_H

#include <bson/bson.h>
#include <sqlite3.h>
#include <stdint.h>

/* ratelimit_peer_instances (issue #23 retest): the instance id of the process holding
 * each address, a table of its own so that databases and snapshots of the versions
 * before it gain it by CREATE (the peers table keeps its columns). */
#define SDB_FSM_PEERS_SCHEMA                                                               \
	"CREATE TABLE IF NOT EXISTS ratelimit_peers (addr TEXT PRIMARY KEY, kind TEXT NOT NULL," \
	" expires_ms INTEGER NOT NULL, registered_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL);" \
	"CREATE TABLE IF NOT EXISTS ratelimit_peer_instances (addr TEXT PRIMARY KEY,"          \
	" instance TEXT NOT NULL);"

/* Is op one of the commands above? Returns: 1 yes, 0 no (also for NULL). */
int sdb_fsm_peers_is_op(const char *op);

/* Apply op inside the caller's transaction (db: the state machine's SQLite handle; ts:
 * the leader-stamped epoch ms; args: the command's args). op must be one of
 * sdb_fsm_peers_is_op's (anything else runs the expiry sweep). Returns: 0 (res gets the
 * result fields), 1 (a logical error, BadValue or DuplicateKey: res holds {ok: 0, ...};
 * the caller rolls the op back). Errors: SDB_EIO (storage failure). */
int sdb_fsm_peers_apply(sqlite3 *db, const char *op, int64_t ts, const bson_t *args,
			bson_t *res);

/* listRatelimitPeers into reply. Errors: SDB_EIO. */
int sdb_fsm_peers_query(sqlite3 *db, bson_t *reply);

/* The membership version (0 before any registration); -1 on a storage error. */
int64_t sdb_fsm_peers_version(sqlite3 *db);

/* The earliest instant (epoch ms) at which expireRatelimitPeers with this sinceMS would
 * remove a peer (max(expires_ms, since_ms + ttl_ms), minimum over peers), or INT64_MAX
 * when none; the leader proposes it once its clock passes that instant. */
int64_t sdb_fsm_peers_next_expiry(sqlite3 *db, int64_t since_ms);

#endif
