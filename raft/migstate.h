/* The migration state machine: states, their stored names and the one table of allowed
 * transitions (CONVENTIONS.md: lifecycles are explicit state machines with a table of
 * allowed transitions; migrations are the same idea, persisted).
 *
 * Shared by the three places that move a migration: the metadata state machine
 * (raft/fsm.c op_update_migration checks every transition at apply, so the replicated
 * record can never take an edge outside the table whoever sends it), the coordinator's
 * runner (src/coordinator/migrate.c, which checks before proposing) and
 * `stripedb ctl migration rollback` (cli/migrate.c). The meaning of each state is in
 * src/coordinator/migrate.h.
 *
 *   registered -> importing -> replicating -> verifying -> switching -> switched
 *   registered, importing, replicating, verifying, switching -> aborted
 *   verifying -> replicating (a difference to re-replicate), switching -> replicating
 *   (pause bound exceeded), switched -> cleaning -> complete,
 *   switched -> rolling_back -> rolled_back | switched (rollback timed out)
 *   complete, aborted, rolled_back: terminal.
 *
 * Versioning (rolling upgrades): the check applies to updateMigration entries whose
 * args carry opVersion >= MIGSTATE_OP_VERSION, which the metadata leader stamps on every
 * updateMigration it proposes (src/metadata/role.c). Entries without it (written by an
 * older binary, or replayed from an older log) apply with the old rules (any state,
 * optional expectState), so every member replays a log to the same state whatever
 * version wrote it. The leader also checks a stamped entry before proposing it
 * (expectState present, expectState -> state an edge), so an older member, which applies
 * it with the old rules but checks expectState, reaches the same state as the new ones.
 *
 * Op version 3 (one active migration per chunk): a registerMigration entry stamped
 * opVersion >= MIGSTATE_OP_VERSION_EXCLUSIVE is refused at apply (117
 * ConflictingOperationInProgress) while a migration of the same ns and chunk is in a
 * non-terminal state. An older member would apply such an entry without the check, so the
 * leader stamps 3 only once the cluster's op version (the replicated setOpVersion, meta key
 * "op_version", default 2) is 3: an operator raises it after every member runs a binary
 * that knows it, as MongoDB's setFeatureCompatibilityVersion. Until then registrations are
 * stamped 2 and apply as before on every member.
 *
 * Op version 4 (MongoDB's key order for chunk bounds): the leader stamps the cluster op
 * version on shardCollection, splitChunk and mergeChunks; entries stamped >=
 * MIGSTATE_OP_VERSION_KEY_ORDER compare split points and bounds with
 * common/bsonval.h sdb_bson_key_cmp_v4 (decimals through their nearest long double, the
 * chunk-membership order of routing and shards, issue #20) (so a split point is "strictly inside its chunk" by the
 * order the proxies route by) and refuse array split points; older ones replay with the
 * earlier order. They also refuse (ConflictingOperationInProgress) to split or merge a chunk
 * that a non-terminal migration holds: the migration would move and clean up the range it
 * read at its start but route only the chunk id it holds.
 */
#ifndef SDB_METADATA_MIGSTATE_H
#define SDB_METADATA_MIGSTATE_H

#include <stdbool.h>

/* updateMigration's op version from which expectState is required and the transition
 * table is checked at apply. */
#define MIGSTATE_OP_VERSION 2
/* registerMigration's op version from which a second non-terminal migration of the same
 * ns and chunk is refused at apply. */
#define MIGSTATE_OP_VERSION_EXCLUSIVE 3
/* shardCollection, splitChunk and mergeChunks op version from which chunk bounds are
 * ordered as MongoDB orders values (common/bsonval.h sdb_bson_key_cmp, the order the
 * proxies route by: Decimal128 by value, NaN below every other number, documents, arrays,
 * binary data and timestamps by value) and a split point holding an array (never a
 * document's shard-key value) is refused at apply. Older entries keep the earlier order
 * (raft/fsm.c cmp_value_v1), in which a Decimal128 reads as 0 and a NaN equals every
 * number, so a split at one could invert the chunk order. Entries stamped >= 4 also refuse
 * to split or merge a chunk held by a non-terminal migration. */
#define MIGSTATE_OP_VERSION_KEY_ORDER 4
/* shardCollection op version from which an entry carrying ddlLease {name, holder} is
 * refused at apply (46 LockBusy) unless that lease (acquireLease) is live and held by
 * holder at the entry's stamped time: the proxies' DDL lock (src/proxy/ddllock.h), so a
 * shardCollection whose proxy lost its lock (expired while it built indexes) never
 * commits over a renameCollection that took the lock meanwhile. An older member would
 * apply such an entry without the check, hence the op version gate. */
#define MIGSTATE_OP_VERSION_DDL_LEASE 5
/* registerRatelimitPeer / deregisterRatelimitPeer op version from which an entry's
 * `instance` counts (issue #23: a live address held by another instance is refused, a
 * deregistration removes only its own instance's entry; raft/fsm_peers.c). An older
 * member ignores `instance` and would renew or remove where a newer one refuses or keeps,
 * so the leader stamps the cluster's op version on these entries and apply honours
 * `instance` only from this version on: no member of a mixed-version group applies them
 * differently. */
#define MIGSTATE_OP_VERSION_PEER_INSTANCE 6
/* The highest op version this binary knows (the largest value setOpVersion accepts, and
 * the one a new cluster starts at). */
#define MIGSTATE_OP_VERSION_MAX 6

typedef enum {
	MIG_REGISTERED = 0,
	MIG_IMPORTING,
	MIG_REPLICATING,
	MIG_VERIFYING,
	MIG_SWITCHING,
	MIG_SWITCHED,
	MIG_CLEANING,
	MIG_COMPLETE,
	MIG_ABORTED,
	MIG_ROLLING_BACK,
	MIG_ROLLED_BACK,
	MIG__COUNT,
	MIG_UNKNOWN = -1,
} mig_state;

/* The state's name as stored in metadata ("registered", ...); "unknown" out of range.
 * Static string. */
const char *migrate_state_name(mig_state s);
/* Parse a stored name; MIG_UNKNOWN when NULL or not one of the names. */
mig_state migrate_state_parse(const char *name);
/* True when from -> to is an edge of the transition table above (from == to is not an
 * edge: saving progress in the same state is not a transition). */
bool migrate_transition_ok(mig_state from, mig_state to);
/* complete, aborted, rolled_back. */
bool migrate_state_terminal(mig_state s);
/* States in which the migration counts against the concurrency budgets (importing ..
 * rolling_back, not registered, not terminal). */
bool migrate_state_active(mig_state s);

#endif
