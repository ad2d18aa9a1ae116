/* Online membership of a shard replica set (issue #15): the primary's wire commands
 * addMember, removeMember and transferLeadership, mirroring metadata's (src/metadata/role.c)
 * over raft/node.h's sdb_node_add / sdb_node_remove / sdb_node_transfer. See
 * src/shard/README.md, "Replica sets: membership", and `stripedb ctl shard member`.
 *
 * Everything runs on the role's loop thread.
 */
#ifndef SDB_SHARD_MEMBERS_H
#define SDB_SHARD_MEMBERS_H

#include "raft/node.h"
#include "shard/shard.h"

/* The Raft node of this member's set, or NULL before it started / after a failed start.
 * Stand-in until repl.c exports one (see the comment in members.c). */
sdb_node *shard_members_node(shard *sh);

/* Register addMember, removeMember and transferLeadership on sh's wire server:
 *   {addMember: ID, raft: "H:P", wire: "H:P"?}: one-server change on the primary (the
 *     member is added as a spare, catches up, then is promoted to voter); a duplicated id
 *     or a raft address already in the set is refused with BadValue (2) before anything
 *     changes. wire, when given, is recorded at once in the replicated member map (else
 *     the new member registers it itself). Reply {id, members: [{id, raft, role}], ok: 1}.
 *   {removeMember: ID}: remove a member other than the primary (IllegalOperation 20 for
 *     the primary: transfer first; BadValue for an id not in the set).
 *   {transferLeadership: ID or 0}: hand the primary role to ID (0: any up-to-date voter);
 *     reply {leaderId}.
 * Not on the primary: NotWritablePrimary (10107) with the primary's wire address. A change
 * already in progress: OperationFailed (96). */
void shard_members_register(shard *sh);

#endif
