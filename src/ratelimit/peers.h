/* gRPC client to the other rate-limit peers (pb.gubernator.PeersV1), on gRPC's C core.
 *
 * One rl_peers owns a completion queue and one thread that runs every peer call's
 * completion; one rl_peer is an insecure HTTP/2 channel to one peer address. Calls are
 * unary and asynchronous: rl_peer_call() sends already-serialised protobuf bytes and
 * later runs the callback on the completion thread with the reply bytes or the gRPC
 * status. The callback must not block (it runs on the thread that completes every
 * other peer call); it may start new calls.
 *
 * Lifecycle: rl_peers_new -> rl_peers_connect (any number) -> rl_peer_call (any thread)
 * -> rl_peers_free, which cancels the calls in flight, waits until each callback has
 * run (with GRPC_STATUS_CANCELLED), then destroys the channels and joins the thread.
 * No call may be started once rl_peers_free has begun (rl_peer_call returns
 * SDB_ECANCELED, and then its callback never fires).
 */
#ifndef SDB_RATELIMIT_PEERS_H
#define SDB_RATELIMIT_PEERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct rl_peers rl_peers;
typedef struct rl_peer rl_peer;

/* Reply of one call: status is a grpc_status_code (0 = OK); on OK, data/len hold the
 * serialised reply message (valid only during the callback); details is gRPC's status
 * message ("" when none), valid during the callback. */
typedef void (*rl_peer_cb)(void *arg, int status, const uint8_t *data, size_t len,
			   const char *details);

/* Create the client: grpc_init(), a completion queue and its thread.
 * Errors: SDB_EIO (thread creation failed). */
int rl_peers_new(rl_peers **out, char *err, size_t errlen);
/* Cancel, drain and free everything (see above). NULL is a no-op. */
void rl_peers_free(rl_peers *peers);

/* A channel to addr ("HOST:PORT"; the string is copied). The channel connects lazily
 * and reconnects with a backoff of at most 1 s. Freed by rl_peers_free. */
rl_peer *rl_peers_connect(rl_peers *peers, const char *addr);
const char *rl_peer_addr(const rl_peer *peer);

/* Start a unary call of method (e.g. "/pb.gubernator.PeersV1/GetPeerRateLimits") with
 * the request bytes (copied) and a deadline of timeout_ms from now. On 0, cb fires
 * exactly once later on the completion thread. Thread-safe.
 * Errors: SDB_ECANCELED (shutting down), SDB_EIO (gRPC refused the call); cb never
 * fires then. */
int rl_peer_call(rl_peer *peer, const char *method, const uint8_t *req, size_t len,
		 int64_t timeout_ms, rl_peer_cb cb, void *arg);

/* Number of calls in flight (for tests and metrics). */
size_t rl_peers_inflight(rl_peers *peers);

#endif
