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

/* /metrics of the replica set, sampled on the loop every 500 ms from shard_members_start
 * until shard_members_stop (idempotent; the timer is closed asynchronously: the loop must
 * run once more, as at any role stop):
 *   stripedb_shard_raft_state          0 secondary (follower), 1 candidate, 2 primary
 *   stripedb_shard_raft_primary_id     the primary's member id as this member knows it (0)
 *   stripedb_shard_raft_commit_index   commit index known here
 *   stripedb_shard_raft_last_index     last index of this member's Raft log
 * and on the primary only, for each member of the current configuration (absent on the
 * other members, and gone once a member is removed), from shard_repl_view:
 *   stripedb_shard_member_lag_entries{member="ID"}  entries behind the primary's log
 *   stripedb_shard_member_lag_ms{member="ID"}       how long it has been behind (ms)
 *   stripedb_shard_member_reachable{member="ID"}    1 answered within an election timeout
 * (stripedb_shard_raft_term, _applied and stripedb_shard_is_primary come from repl.c.)
 * Each sample also refreshes sh->health_doc (replSetGetStatus's document) for
 * /healthz?format=json. */
void shard_members_start(shard *sh);
void shard_members_stop(shard *sh);

#endif
