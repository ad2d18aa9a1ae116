/* The rate limiter's gRPC service: pb.gubernator.V1 (GetRateLimits, HealthCheck,
 * LiveCheck) and pb.gubernator.PeersV1 (GetPeerRateLimits, UpdatePeerGlobals), served by
 * libnghttp2 (HTTP/2) on one libuv loop thread of its own (never the role's loop; no
 * hand-off between threads for a call answered locally), with protobuf-c messages
 * generated from gubernator.proto. gRPC's framing over HTTP/2 (5-byte length prefix,
 * headers, grpc-status/grpc-message trailers) is grpc_server.c's. The peer client
 * (peers.c) stays on gRPC's C core.
 *
 * GetRateLimits is answered asynchronously: keys owned by other peers are forwarded by
 * the cluster layer and the call completes when the last answer arrives (the completion
 * is handed back to the loop thread with uv_async), without holding a thread.
 * Status codes (as Gubernator): more than 1000 requests -> OUT_OF_RANGE;
 * a body that is not a valid protobuf message -> INVALID_ARGUMENT; an unknown method ->
 * UNIMPLEMENTED; while stopping -> UNAVAILABLE; a reserved bucket name ->
 * PERMISSION_DENIED. Per-request problems are per-item `error` strings with status OK.
 * As gRPC servers: grpc-encoding other than identity -> UNIMPLEMENTED with
 * grpc-accept-encoding: identity; a request message over 4 MiB, or one arriving while a
 * connection's unfinished requests hold 32 MiB -> RESOURCE_EXHAUSTED;
 * grpc-timeout is honoured (DEADLINE_EXCEEDED when it passes before the answer);
 * content-type not application/grpc -> HTTP 415, a method other than POST -> HTTP 405.
 * HTTP/2: up to 4096 concurrent streams per connection, 1 MiB stream windows, 16 MiB
 * connection window; a connection whose output backs up past 8 MiB stops being read
 * until it drains; bytes that are not HTTP/2 close the connection (GOAWAY when possible).
 * TLS (issue #10): when the "ratelimit" listener is configured the port serves TLS only,
 * through tls/tls.h with ALPN "h2"; a SIGHUP reload applies to new connections.
 */
#ifndef SDB_RATELIMIT_GRPC_SERVER_H
#define SDB_RATELIMIT_GRPC_SERVER_H

#include <stddef.h>

#include "common/role.h"
#include "ratelimit/cluster.h"
#include "ratelimit/limiter.h"

/* The TLS listener name (tls/tls.h) of the gRPC port: --tls-* options of the ratelimit
 * role configure it, SIGHUP reloads it. */
#define RL_GRPC_TLS_ROLE "ratelimit"

typedef struct rl_grpc_server rl_grpc_server;

typedef struct rl_grpc_server_opts {
	const char *listen;  /* "HOST:PORT" (port 0: any free port) */
	rl_cluster *cluster; /* decides; borrowed, must outlive the server's use (see free) */
	int threads;         /* ignored (one loop thread); kept for source compatibility */
	int64_t handshake_ms; /* a connection without the TLS handshake, the HTTP/2 preface and
			       * the client's SETTINGS by then is closed; 0: 20000 */
	int64_t max_idle_ms;  /* a connection without open streams this long gets GOAWAY and
			       * is closed; 0: 300000 */
	int64_t max_conns;    /* connections open at once; more are closed on accept; 0: 10000 */
} rl_grpc_server_opts;

/* Bind and start serving. Errors: SDB_EINVAL (no address), SDB_EIO (bind failed:
 * address in use or invalid), with a message in err. */
int rl_grpc_server_new(const rl_grpc_server_opts *opts, rl_grpc_server **out, char *err,
		       size_t errlen);

/* Returns: the bound port. */
int rl_grpc_server_port(const rl_grpc_server *srv);

/* Stop in three steps, so that no call touches a freed cluster:
 * rl_grpc_server_shutdown() closes the listener (no new connection) and fences the
 * cluster off: a call that arrives later on an open connection gets UNAVAILABLE (it
 * waits for a call being dispatched on the loop thread, never for a peer); the caller
 * then frees the cluster, which completes the decisions still pending (their answers go
 * out on the loop thread); rl_grpc_server_free() closes the connections (calls still
 * open are dropped), ends the loop thread and frees. Any thread but the loop's. */
void rl_grpc_server_shutdown(rl_grpc_server *srv);
void rl_grpc_server_free(rl_grpc_server *srv);

/* Turn off Abseil's mutex deadlock detection for the process (for the gRPC core peer
 * client and the benchmark's client) when the linked Abseil has
 * it on (Debian 12 builds Abseil without NDEBUG, so every absl::Mutex lock inside gRPC
 * core maintains a lock-order graph: about 5% of the CPU of a gRPC call measured with
 * perf, tests/bench/README.md). Looked up at run time (dlsym) under the Debian and the
 * upstream LTS namespaces; a no-op when absent. Call before grpc_init(); idempotent. */
void rl_grpc_tune_runtime(void);

/* ---- role hook (called from role.c) ---- */

typedef struct rl_grpc rl_grpc;

/* Start the gRPC service and the peer cluster of a ratelimit role, from its options:
 * --grpc-listen (else GUBER_GRPC_ADDRESS), --advertise (else GUBER_ADVERTISE_ADDRESS,
 * else the gRPC address), --peers (static list, self included; absent: a cluster of one)
 * and the GUBER_BATCH_* / GUBER_GLOBAL_* variables (rl_cluster_opts_from_env).
 * On success, when gRPC is configured, fe->decide/decide_ctx become the cluster's entry
 * point (rl_cluster_decide) and fe->peer_count the ring size, so the HTTP gateway
 * forwards too; *out is then freed by rl_grpc_stop(). Without a gRPC address (and
 * without --peers) nothing starts: *out is NULL and fe is untouched.
 * fe->limiter must be set and outlive *out. Call on the role's loop thread.
 * Errors: SDB_EUSAGE (--peers without a gRPC address, bad GUBER_* value), SDB_EIO (bind),
 * with a message in err. */
int rl_grpc_start(sdb_role *role, rl_frontend *fe, rl_grpc **out, char *err, size_t errlen);

/* Stop serving gRPC and leave the cluster; restores fe to the local limiter
 * (rl_decide_local). Blocks until calls in flight finish (bounded by the peer call
 * deadline). NULL is a no-op. */
void rl_grpc_stop(rl_grpc *g);

/* Returns: the bound gRPC port of a started hook (for logs and tests); 0 when g is NULL. */
int rl_grpc_port(const rl_grpc *g);

/* Does a public pb.gubernator.V1 batch (reqs[0..n), gRPC or the HTTP gateway) name a
 * bucket reserved for the cluster's own limits (auth_cluster_reserved_name: with a key
 * loaded, names starting with "stripedb_")? True with the refusal message for the first
 * one in msg (msglen bytes): answer PERMISSION_DENIED. Thread-safe. */
bool rl_v1_reserved(const rl_req *reqs, size_t n, char *msg, size_t msglen);

#endif
