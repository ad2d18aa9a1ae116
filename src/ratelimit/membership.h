/* Rate-limit peer membership through the metadata service (issue #23).
 *
 * A rate limiter or proxy started with --metadata and without --peers registers its
 * gRPC peer address (`registerRatelimitPeer`, src/metadata/peers.h) with a lease of
 * --ratelimit-lease-ms (default 3000), renewed every third of it, and long-polls the
 * membership version (`waitRatelimitPeers`, at most 1 s per poll). When the version
 * changes it reads the member list (`listRatelimitPeers`) and installs it as its ring
 * (rl_cluster_set_peers; this node is always in its own ring). A member whose lease
 * lapses is removed by a log entry that the metadata leader proposes, so every member
 * builds its ring from the same list at the same version; it then leaves every ring
 * within one poll of the removal.
 *
 * Two threads, each with its own libmongoc client (cluster key credentials when
 * configured, auth/cluster.h): the renewer registers every lease/3 with every timeout at
 * lease/6 (250 ms..2 s), and after any failure retries at once on a fresh client, which
 * finds the current leader among all the --metadata seeds, so a leader that hangs
 * (SIGSTOP) is replaced within the lease; the watcher long-polls and installs the ring.
 * Metadata errors are logged (once per streak) and retried every 250 ms (at most lease/6);
 * the ring in place stays meanwhile.
 *
 * Every registration carries this process's instance id (random per start); the metadata
 * refuses an address whose lease is live under another instance (a second process with
 * the same --advertise, raft/fsm_peers.h). rl_membership_start makes the first
 * registration itself: refused, it waits up to one lease for the holder's lease to lapse
 * (a predecessor killed without deregistering), then fails, and the process exits
 * non-zero. Metadata unreachable at the start: the renewer keeps trying, and logs a
 * refusal it meets later as an error. On stop the node deregisters its own instance
 * (best effort, so its keys move at once instead of after the lease; the address stays
 * when another instance holds it) and the threads are joined.
 */
#ifndef SDB_RATELIMIT_MEMBERSHIP_H
#define SDB_RATELIMIT_MEMBERSHIP_H

#include <stddef.h>
#include <stdint.h>

#include "ratelimit/cluster.h"

typedef struct rl_membership rl_membership;

/* metadata: the metadata members' wire addresses "H:P,..."; advertise: this node's peer
 * address; kind: "ratelimit" or "proxy"; lease_ms: 1000..600000; cl: the cluster whose
 * ring follows the membership (borrowed; stop this first).
 * Blocks for the first registration (one metadata round trip; up to lease_ms + 1 s while
 * refused as a duplicate, above).
 * Errors: SDB_EUSAGE (lease out of range), SDB_EEXISTS (advertise is held by another live
 * process), SDB_EIO (thread). */
int rl_membership_start(const char *metadata, const char *advertise, const char *kind,
			int64_t lease_ms, rl_cluster *cl, rl_membership **out, char *err,
			size_t errlen);

/* Stop polling (within one poll, at most ~2 s), deregister, join, free. NULL: no-op. */
void rl_membership_stop(rl_membership *m);

#endif
