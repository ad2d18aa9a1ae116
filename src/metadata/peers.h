/* The metadata role's rate-limit peer membership commands (issue #23).
 *
 * Wire commands, next to the routing ones (src/metadata/README.md):
 *   {registerRatelimitPeer: "H:P", kind: "ratelimit"|"proxy", ttlMS: N, instance: ID}
 *       (leader; instance optional, a live address held by another instance is refused
 *       with DuplicateKey, raft/fsm_peers.h; a
 *       renewal is the same command) -> {version, expiresMS, added}
 *   {deregisterRatelimitPeer: "H:P", instance: ID}  (leader; with instance only while
 *       that instance holds the address) -> {version, removed}
 *   {listRatelimitPeers: 1}  (any member, local state) -> {version, peers: [{addr, kind,
 *       expiresMS, registeredMS}], lastApplied}
 *   {waitRatelimitPeers: 1, gt: N, timeoutMS: T}  (any member; parked, the loop is never
 *       blocked) -> {version, changed: true} as soon as the local membership version
 *       exceeds N, or {version, changed: false, timedOut: true} after T ms (default
 *       10000, at most 60000)
 * and, on the ready leader, a 100 ms timer that proposes expireRatelimitPeers once the
 * leader's clock passes the earliest lease expiry (raft/fsm_peers.h: expiry is decided
 * by that log entry, never by a reader's clock).
 *
 * Everything runs on the role's loop thread.
 */
#ifndef SDB_METADATA_PEERS_H
#define SDB_METADATA_PEERS_H

#include <uv.h>

#include "raft/node.h"
#include "wire/server.h"

typedef struct meta_peers meta_peers;

/* The wire server passes the role's data to every handler; this returns the role's
 * meta_peers from it. */
typedef meta_peers *(*meta_peers_of_fn)(void *role_data);

/* Register the commands on srv and start the timer and check handles on loop.
 * node and srv are borrowed (must outlive meta_peers_stop's callback). Never fails. */
meta_peers *meta_peers_start(uv_loop_t *loop, sdb_node *node, wire_server *srv,
			     meta_peers_of_fn of);

/* Answer parked waits (timedOut), refuse new commands, close the handles; closed(arg)
 * runs once everything is closed and no proposal of ours is pending (the node must
 * still be open when this is called; it may close right after). Frees mp. */
void meta_peers_stop(meta_peers *mp, void (*closed)(void *arg), void *arg);

#endif
