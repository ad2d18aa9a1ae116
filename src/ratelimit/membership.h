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
 * One thread with its own libmongoc client (cluster key credentials when configured,
 * auth/cluster.h). Metadata errors are logged (rate-limited) and retried every 250 ms;
 * the ring in place stays meanwhile. On stop the node deregisters itself (best effort,
 * so its keys move at once instead of after the lease) and the thread is joined.
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
 * Errors: SDB_EUSAGE (lease out of range), SDB_EIO (thread). */
int rl_membership_start(const char *metadata, const char *advertise, const char *kind,
			int64_t lease_ms, rl_cluster *cl, rl_membership **out, char *err,
			size_t errlen);

/* Stop polling (within one poll, at most ~1 s), deregister, join, free. NULL: no-op. */
void rl_membership_stop(rl_membership *m);

#endif
