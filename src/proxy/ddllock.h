/* The proxies' DDL lock (issue #20): shardCollection and renameCollection of the same
 * namespace, run at once through one or two proxies, used to both succeed (metadata then
 * listed db.a as sharded while its documents sat in the renamed, unsharded db.b). mongos
 * serialises DDL of a namespace behind its config server's DDL lock
 * (sharding_ddl_coordinator.cpp, DDLLockManager); ours is a metadata lease per namespace
 * (acquireLease "ddl/<ns>", src/metadata/README.md) that both commands hold for their whole
 * run:
 *   - shardCollection takes its namespace's lock and commits the sharding in metadata with
 *     ddlLease {name, holder}, which metadata refuses at apply (46 LockBusy, op version 5,
 *     raft/migstate.h) unless the lease is still live and its own: fenced by metadata;
 *   - renameCollection takes the source's and the target's (in name order, so two
 *     renames never wait on each other in a cycle), re-reads the routing table, and renews
 *     them just before it asks the primary shard to rename.
 * A lease lives DDL_LEASE_TTL_MS (5 minutes: longer than a shardCollection's index builds
 * are expected to take, since its commit is refused once the lease lapsed) from its last
 * acquire or renewal, so a proxy that dies holding one blocks that namespace's DDL for at
 * most that long (a waiter without maxTimeMS gives up after DDL_LOCK_WAIT_MS with 46).
 * What stays open: a renaming proxy paused for longer than that between its renewal and
 * its request to the shard could rename after another proxy sharded the collection (the
 * shard does not check a fencing token). */
#ifndef SDB_PROXY_DDLLOCK_H
#define SDB_PROXY_DDLLOCK_H

#include <stddef.h>

#include "proxy/exec.h"

/* How long a DDL lease lives after its acquire or renewal (ms). */
#define DDL_LEASE_TTL_MS 300000
/* How long a command waits for a lock another command holds when it has no maxTimeMS (ms). */
#define DDL_LOCK_WAIT_MS 60000

/* The locks one command holds: up to two namespaces, lease names "ddl/<ns>", one holder
 * string unique to this command run ("<proxy address> pid P op N"). Embedded by value;
 * px_ddl_lock_release frees nothing. */
typedef struct px_ddl_lock {
	char holder[192];
	char names[2][520];
	size_t n; /* leases held */
} px_ddl_lock;

/* Take the DDL locks of the n (1 or 2; equal ones are taken once) namespaces nss for c,
 * in name order, waiting while another command holds one (polled with a backoff of 10 to
 * 200 ms) up to c's maxTimeMS or DDL_LOCK_WAIT_MS. Blocks (worker thread). Returns: 0 with
 * l filled (release it), or the code answered on c with nothing held: 46 LockBusy "another
 * DDL operation holds the lock" after DDL_LOCK_WAIT_MS, 50 MaxTimeMSExpired after maxTimeMS,
 * metadata's error, 6 HostUnreachable when metadata cannot be reached. */
int px_ddl_lock_acquire(ctx *c, const char *const *nss, size_t n, px_ddl_lock *l);

/* Renew every lease of l (DDL_LEASE_TTL_MS from now), checking it was held all along
 * (renewLease refuses a lease that expired). Returns: 0, or the code answered on c (46
 * LockBusy "lost the DDL lock", metadata's or 6); l stays to be released either way. */
int px_ddl_lock_renew(ctx *c, px_ddl_lock *l);

/* Release the leases of l (best effort: a failure is logged, the lease then lapses after
 * DDL_LEASE_TTL_MS). Answers nothing on c. */
void px_ddl_lock_release(ctx *c, px_ddl_lock *l);

#endif
