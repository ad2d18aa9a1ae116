/* The MongoDB wire protocol server shared by the shard, proxy and metadata roles.
 *
 * Spec: https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/ (OP_MSG,
 * OP_QUERY/OP_REPLY for the legacy hello handshake, and legacy queries, OP_GET_MORE and
 * exhaust cursors run as find/getMore (msg.h), OP_COMPRESSED refused with a clear
 * error). One server = one TCP listener on a role's libuv loop. A connection runs one
 * message at a time: while a command is in flight, bytes that arrive (a pipelined
 * message) stop its reading until the reply (backpressure); a plaintext connection with
 * nothing buffered stays read, and an EOF or reset met then waits for the reply (a
 * half-closed client still gets it whole; the command stays in currentOp). Replies are
 * written in order, directly when the socket takes them (uv_try_write). A request
 * completed on the loop thread is finished at the next loop iteration; its connection's
 * next pipelined message runs then, and when that one also completes on the loop (a
 * shard's point read) it is finished in the same pass, its reply written with the one
 * before in one send (a proxy's finds sent together, proxy/forwarder.h). One completed on
 * another thread sends its reply from that thread when the connection is plaintext and
 * has nothing queued (send, MSG_DONTWAIT), and the loop finishes it (the connection's
 * state, its next pipelined message) when it next wakes, usually for that client's next
 * message; otherwise, or when the loop waits on it (bytes or an EOF came meanwhile, the
 * server is closing), through a uv_async wake-up. Metrics and currentOp count a request
 * done when it completes.
 *
 * Commands are dispatched through a table that the role fills (wire_server_register);
 * the shared layer answers hello/isMaster, ping, buildInfo, getParameter, getLog,
 * whatsmyuri, hostInfo, connectionStatus, endSessions, killAllSessions, configureFailPoint
 * (test commands only, see wire_server_opts.test_commands), and any of them
 * can be overridden by registering the same name. Command names match case-sensitively
 * except hello/isMaster/ismaster which are aliases.
 *
 * Threading: handlers are called on the loop thread. A handler may finish at once or
 * later, from any thread, by calling wire_req_reply()/wire_req_error() exactly once; so a
 * role can run blocking work (libmongoc, SQLite) on a thread pool.
 */
#ifndef SDB_WIRE_SERVER_H
#define SDB_WIRE_SERVER_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/clustertime.h"

/* Limits advertised in hello and enforced on input (MongoDB's values). */
#define WIRE_MAX_BSON_SIZE (16 * 1024 * 1024)      /* maxBsonObjectSize, bytes */
#define WIRE_MAX_MESSAGE_SIZE (48000000)           /* maxMessageSizeBytes, bytes */
#define WIRE_MAX_WRITE_BATCH (100000)              /* maxWriteBatchSize, documents */
#define WIRE_MIN_WIRE_VERSION 0
#define WIRE_MAX_WIRE_VERSION 17                   /* MongoDB 6.0 */

/* MongoDB error codes used across stripedb (src/mongo/base/error_codes.yml). */
#define WIRE_ERR_INTERNAL 1                  /* InternalError */
#define WIRE_ERR_BAD_VALUE 2                 /* BadValue */
#define WIRE_ERR_NO_SUCH_KEY 4
#define WIRE_ERR_UNAUTHORIZED 13             /* Unauthorized */
#define WIRE_ERR_TYPE_MISMATCH 14            /* TypeMismatch */
#define WIRE_ERR_AUTH_FAILED 18              /* AuthenticationFailed */
#define WIRE_ERR_ILLEGAL_OPERATION 20
#define WIRE_ERR_NAMESPACE_NOT_FOUND 26
#define WIRE_ERR_INDEX_NOT_FOUND 27
#define WIRE_ERR_CONFLICTING_UPDATE 40
#define WIRE_ERR_CURSOR_NOT_FOUND 43
#define WIRE_ERR_NAMESPACE_EXISTS 48
#define WIRE_ERR_MAX_TIME_EXPIRED 50
#define WIRE_ERR_DOLLAR_PREFIXED 52
#define WIRE_ERR_INVALID_ID_FIELD 53
#define WIRE_ERR_NOT_SINGLE_VALUE_FIELD 54
#define WIRE_ERR_COMMAND_NOT_FOUND 59        /* CommandNotFound */
#define WIRE_ERR_IMMUTABLE_FIELD 66
#define WIRE_ERR_CANNOT_CREATE_INDEX 67      /* CannotCreateIndex */
#define WIRE_ERR_INVALID_OPTIONS 72
#define WIRE_ERR_INVALID_NAMESPACE 73
#define WIRE_ERR_COMMAND_NOT_SUPPORTED_ON_VIEW 166 /* CommandNotSupportedOnView */
#define WIRE_ERR_COLLECTION_UUID_MISMATCH 361 /* CollectionUUIDMismatch (MongoDB 6.0) */
/* a shard asked by a proxy to report views (src/shard/cmd_aggregate.c view_check) */
#define WIRE_ERR_COMMAND_ON_SHARDED_VIEW 169 /* CommandOnShardedViewNotSupportedOnMongod */
#define WIRE_ERR_INDEX_OPTIONS_CONFLICT 85
#define WIRE_ERR_INDEX_KEY_SPECS_CONFLICT 86
#define WIRE_ERR_NETWORK_TIMEOUT 89
#define WIRE_ERR_WRITE_CONCERN_FAILED 64     /* WriteConcernFailed */
#define WIRE_ERR_OPERATION_FAILED 96
#define WIRE_ERR_CONFLICTING_OPERATION 117 /* ConflictingOperationInProgress */
#define WIRE_ERR_INTERRUPTED_AT_SHUTDOWN 11600
#define WIRE_ERR_INTERRUPTED 11601           /* Interrupted (killOp) */
#define WIRE_ERR_CLIENT_DISCONNECT 279       /* ClientDisconnect (its client closed) */
#define WIRE_ERR_SHUTDOWN_IN_PROGRESS 91     /* ShutdownInProgress: refused, not executed */
#define WIRE_ERR_NOT_WRITABLE_PRIMARY 10107  /* NotWritablePrimary */
#define WIRE_ERR_NOT_PRIMARY_NO_SECONDARY_OK 13435 /* NotPrimaryNoSecondaryOk */
#define WIRE_ERR_INTERRUPTED_REPL_CHANGE 11602 /* InterruptedDueToReplStateChange */
#define WIRE_ERR_BSON_TOO_LARGE 10334        /* BSONObjectTooLarge */
#define WIRE_ERR_DUPLICATE_KEY 11000         /* DuplicateKey */
#define WIRE_ERR_STALE_CONFIG 13388          /* StaleConfig */
#define WIRE_ERR_SHARD_NOT_FOUND 70
#define WIRE_ERR_HOST_UNREACHABLE 6
#define WIRE_ERR_INVALID_REPLSET_CONFIG 93  /* InvalidReplicaSetConfig */
#define WIRE_ERR_RATE_LIMITED 462            /* stripedb quota: IngressRequestRateLimitExceeded */
#define WIRE_ERR_FAILED_TO_PARSE 9
#define WIRE_ERR_PROTOCOL_ERROR 17            /* ProtocolError */
#define WIRE_ERR_INVALID_BSON 22              /* InvalidBSON */
#define WIRE_ERR_LOCATION_40352 40352        /* FieldPath cannot be constructed with empty string */
#define WIRE_ERR_OVERFLOW 15
#define WIRE_ERR_NOT_IMPLEMENTED 238
#define WIRE_ERR_EXHAUST_ON_MONGOS 18526   /* mongos: the exhaust query option is invalid */
#define WIRE_ERR_TRANSACTION_TOO_OLD 225     /* TransactionTooOld (retryable writes) */
#define WIRE_ERR_INCOMPLETE_TXN_HISTORY 217  /* IncompleteTransactionHistory (migrated sessions) */

/* wire_code_name returns MongoDB's codeName for a code ("BadValue"); a positive code
 * without a name is "Location<code>" as mongod says (the string lives in a per-thread
 * buffer until the next call on that thread), a non-positive one "UnknownError". */
const char *wire_code_name(int code);

/* wire_state_change_code: is code one of the SDAM spec's state-change errors, "not
 * writable primary" (NotWritablePrimary 10107, NotPrimaryNoSecondaryOk 13435,
 * LegacyNotPrimary 10058) or "node is recovering" (NotPrimaryOrSecondary 13436,
 * InterruptedDueToReplStateChange 11602, PrimarySteppedDown 189, and the "node is shutting
 * down" ones InterruptedAtShutdown 11600 and ShutdownInProgress 91)? A driver that gets one
 * from a server, top-level or in a writeConcernError, marks that server Unknown and waits
 * for its monitor to describe it again (server-discovery-and-monitoring.md, "Error
 * handling"). Returns: true for those codes. Errors: none. */
bool wire_state_change_code(int64_t code);

/* wire_not_executed_code: is code one of the state-change errors a member answers
 * before running any of the command (NotWritablePrimary 10107, NotPrimaryNoSecondaryOk
 * 13435, LegacyNotPrimary 10058, NotPrimaryOrSecondary 13436, ShutdownInProgress 91: a
 * refusal, so sending the command again elsewhere cannot apply it twice)? The other
 * state-change codes (InterruptedDueToReplStateChange 11602, InterruptedAtShutdown 11600,
 * PrimarySteppedDown 189) interrupt a command that may have run, or a write that entered
 * the member's log and may still commit on the next primary. Returns: true for the
 * refusals. Errors: none. */
bool wire_not_executed_code(int64_t code);

typedef struct wire_server wire_server;
typedef struct wire_conn wire_conn;
typedef struct wire_req wire_req;

/* A command handler. role_data is what was given to wire_server_new. The handler owns the
 * duty to call wire_req_reply/wire_req_error exactly once (now or later, any thread). */
typedef void (*wire_cmd_fn)(wire_req *req, void *role_data);

/* Hook to add role-specific fields to every hello/isMaster reply (e.g. setName, hosts,
 * primary, electionId for metadata members; msg: "isdbgrid" for proxies). Called on the
 * loop thread. reply already holds the shared fields; the hook may append more. */
typedef void (*wire_hello_fn)(void *role_data, const bson_t *cmd, bson_t *reply);

/* Hook run before any handler (e.g. authentication and authorization in the proxy).
 * Return true to continue; false after having answered req with wire_req_error(). */
typedef bool (*wire_gate_fn)(wire_req *req, void *role_data);

/* Cluster-time gossip (issue #20, common/clustertime.h). The in hook runs after the gate
 * and before the handler, on the loop thread: it reads the request's $clusterTime and
 * advances the role's clock; return true to continue, false after having answered req
 * with wire_req_error(). The out hook runs on every reply of a client request (not of a
 * detached one), on the completing thread (any thread), before it is queued: it may
 * append fields ($clusterTime, operationTime) to reply. */
typedef bool (*wire_ct_in_fn)(wire_req *req, void *role_data);
/* The first step of a role's in hook: ct_take_field of req's $clusterTime (found with
 * wire_req_cmd_find) into *g (g->present false when req carries none). Loop thread.
 * Returns: true with *g; false after having answered req with wire_req_error().
 * Errors (answered on req, with ct_take's message): TypeMismatch 14 and NoSuchKey 4 (a
 * malformed $clusterTime), ClusterTimeFailsRateLimiter 205 (too far ahead). */
bool wire_req_take_cluster_time(wire_req *req, ct_gossip *g);
typedef void (*wire_ct_out_fn)(wire_req *req, void *role_data, bson_t *reply);
/* The client closed the connection of req, still in flight, whose close its handler asked
 * to hear of (wire_req_watch_close): wire_req_conn_gone(req) is true from before the call.
 * The handler still completes req (its reply is dropped). Loop thread; must not block. */
typedef void (*wire_gone_fn)(wire_req *req, void *role_data);

typedef struct wire_server_opts {
	const char *listen;         /* "HOST:PORT" */
	const char *role;           /* role name, for logs and metric labels */
	int max_connections;        /* refuse (close) beyond this; 0 = 10000 */
	void *role_data;            /* passed to every handler and hook */
	wire_hello_fn hello;        /* optional */
	wire_gate_fn gate;          /* optional */
	wire_ct_in_fn ct_in;        /* optional (cluster-time gossip) */
	wire_ct_out_fn ct_out;      /* optional (cluster-time gossip) */
	wire_gone_fn gone;          /* optional (a watched request's client closed) */
	bool is_mongos;             /* hello says msg: "isdbgrid" */
	/* Transport security (issue #10): the TLS listener the role set up with tls_setup and
	 * hands over (tls_listener_get, tls/tls.h); its mode is read here, its context (new
	 * after a SIGHUP reload) at each connection. A connection whose first byte starts a
	 * TLS handshake record (0x16) is TLS, others are plaintext, refused (closed) when the
	 * mode is required. NULL: plaintext only. */
	struct tls_listener *tls;
	/* Test commands (--enable-test-commands, MongoDB's enableTestCommands): the shared
	 * configureFailPoint command and its failCommand fail point (wire/failpoint.c). Off:
	 * configureFailPoint is refused with CommandNotFound (59). Never in production. */
	bool test_commands;
	/* Quiesce period of wire_server_close, in ms (0 = none). See wire_server_close. */
	uint64_t quiesce_ms;
} wire_server_opts;

/* Create and start listening on loop. Errors: SDB_EINVAL (bad or unresolvable address)
 * or SDB_EIO (bind/listen failed) with a message in err. */
int wire_server_new(uv_loop_t *loop, const wire_server_opts *opts, wire_server **out,
		    char *err, size_t errlen);

/* Register a command handler by name (the first key of the command document). Must be
 * called on the loop thread. Later registrations replace earlier ones. */
void wire_server_register(wire_server *srv, const char *name, wire_cmd_fn fn);

/* Register the refusal of MongoDB's server-side JavaScript commands (mapReduce, eval,
 * group; never built by stripedb): each answers CommandNotFound (59) "<name> is not
 * supported: server-side JavaScript is never accepted by stripedb", the same on every role
 * that calls it (shard, proxy). Loop thread, as wire_server_register. */
void wire_server_refuse_js(wire_server *srv);

/* SDAM streaming: increment hello's topologyVersion.counter and answer every held
 * awaitable hello now with a fresh reply (the hello hook runs again). A role whose hello
 * state can change (metadata: isWritablePrimary, primary, electionId) calls it on every
 * change. Loop thread only. See wire/topology.h. */
void wire_server_topology_changed(wire_server *srv);

/* Returns: the bound port (useful with port 0). */
int wire_server_port(const wire_server *srv);

/* Begin a graceful stop (MongoDB's quiesce mode, mongod/mongos 5.0+):
 *  1. close the listener (new connections are refused), bump topologyVersion.counter and
 *     answer every hello, held awaitable ones first, with ShutdownInProgress (91): drivers
 *     mark the server Unknown, clear its pool and select another server;
 *  2. quiesce, for opts.quiesce_ms (capped at timeout_ms; ends early once no connection
 *     is left): open connections stay open; a new command other than getMore,
 *     killCursors and endSessions is NOT executed and is answered with ShutdownInProgress
 *     (91) carrying errorLabels ["RetryableWriteError"], which drivers retry on another
 *     server (retryable writes and reads); commands already running go on;
 *  3. drain: stop reading, let requests in flight finish and their replies be written,
 *     close each connection once idle; past timeout_ms from the start every connection
 *     is closed;
 * then call cb on the loop thread. cb waits for every handler that was called to have
 * replied (past the timeout connections are closed, but a late reply must not touch
 * freed memory). After cb, the server is freed. A command is never answered with 91
 * after it reached its handler. */
void wire_server_close(wire_server *srv, uint64_t timeout_ms, void (*cb)(void *arg), void *arg);

/* --- requests (valid from the handler call until reply/error) --- */

/* The command document. Document sequences (OP_MSG kind 1 sections, e.g. `documents` of
 * insert) are folded into the body as arrays, so handlers see one document. Owned by req. */
const bson_t *wire_req_cmd(const wire_req *req);

/* Look up the top-level field name of req's command: what
 * bson_iter_init_find(it, wire_req_cmd(req), name) answers (the first occurrence, the key
 * compared byte for byte), without walking the command: its keys were indexed when the
 * request was parsed. A lookup of a field the command does not have walked every field, and
 * a point read's handlers make ~15 (issue #19). Falls back to the walk for a command with
 * more keys than the index holds. Thread-safe (the index does not change); *it points into
 * the command (valid while req is). Returns whether the field is there. */
bool wire_req_cmd_find(const wire_req *req, const char *name, bson_iter_t *it);
/* The command name (first key), e.g. "find". */
const char *wire_req_name(const wire_req *req);
/* The target database ($db for OP_MSG; from the namespace for OP_QUERY). */
const char *wire_req_db(const wire_req *req);
/* The connection the request came on; stays valid until the request completes. */
wire_conn *wire_req_conn(const wire_req *req);
/* Monotonic receive time in ns (sdb_mono_ns, common/clock.h). */
uint64_t wire_req_start_ns(const wire_req *req);
/* A handler that waits for something that will end by itself (a call to another server
 * bounded by its socket timeout, a back-off timer) brackets the wait with these, from any
 * thread, before completing req; waits nest (a counter; a fan-out may wait on several
 * threads at once). When a graceful stop times out (wire_server_close), a request inside
 * such a wait is logged as "wire: request waiting at shutdown" (info): slow, and it will
 * be answered; one outside any wait is "wire: unanswered request at shutdown" (warn): its
 * handler neither answered nor waits on anything, a bug (the integration suite fails the
 * test whose process logs it). Every begin needs its end before req is completed. */
void wire_req_wait_begin(wire_req *req);
void wire_req_wait_end(wire_req *req);

/* Read req's connection while req is in flight (drivers do not pipeline: nothing else
 * comes on it meanwhile) so that the client's close is noticed at once: the server's gone
 * hook (wire_server_opts.gone) is then called with req, and wire_req_conn_gone says true.
 * For a handler that may wait long (a change stream getMore parked until its await's end),
 * as an awaitable hello notices a monitor's close. Loop thread (a handler, before it hands
 * req to another thread). A detached request: no-op. */
void wire_req_watch_close(wire_req *req);
/* Whether the client closed req's connection while req was in flight and watched
 * (wire_req_watch_close). Any thread. */
bool wire_req_conn_gone(const wire_req *req);

/* Complete with a reply document. Takes ownership of reply (bson_destroy'd after
 * sending); `ok: 1.0` is appended when the reply has no `ok` field. Thread-safe; called
 * off the loop thread it may write the reply to the socket before it returns (see the
 * top of this file). */
void wire_req_reply(wire_req *req, bson_t *reply);
/* Complete with {ok: 0, errmsg, code, codeName}. Thread-safe. */
void wire_req_error(wire_req *req, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Complete with an error reply that carries extra fields (e.g. retry hints): extra's
 * fields are appended after ok/errmsg/code/codeName. Takes ownership of extra (may be NULL). */
void wire_req_error_extra(wire_req *req, int code, bson_t *extra, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Detached requests: a command run by a handler without a client connection (a shard
 * replica set's members run the commands of a Raft entry this way, issue #15). The
 * handler completes it with wire_req_reply/error as usual; the reply is kept for
 * wire_req_detached_take instead of being sent. wire_req_conn() is NULL. Any thread. */
wire_req *wire_req_detached_new(const char *db, const bson_t *cmd);
/* Call cb(arg, req) on the completing thread once req is answered (it may take the reply
 * and free req). Set before the request can complete. */
void wire_req_detached_on_done(wire_req *req, void (*cb)(void *arg, wire_req *req), void *arg);
/* The reply once completed (ownership passes to the caller), else NULL. */
bson_t *wire_req_detached_take(wire_req *req);
/* Free a detached request (and an untaken reply). NULL is a no-op. */
void wire_req_detached_free(wire_req *req);

/* --- running operations: currentOp / killOp (issue #20; wire/currentop.c) ---
 *
 * Every request read from a client connection is an operation with an opid (int32, > 0,
 * process-wide, wrapping), registered from the moment it is read until its reply is
 * queued: conn->inflight, one per connection (drivers do not pipeline). */

/* The request's opid. Any thread. */
int32_t wire_req_opid(const wire_req *req);
/* Whether killOp marked req (wire_req_kill). Long-running handlers test it at their
 * interruption points (scans, waits) and fail; an error answered for a killed request,
 * whatever its code, goes out as Interrupted (11601) "operation was interrupted", as
 * mongod's killed OperationContext fails. A successful reply is sent as it is (the
 * operation finished before it reached an interruption point). Any thread. */
bool wire_req_killed(const wire_req *req);
/* Mark req killed. Loop thread (req found with wire_server_find_op). */
void wire_req_kill(wire_req *req);
/* Mark req past its maxTimeMS (issue #20): wire_req_killed says true from now on, so its
 * interruption points fail, and an error answered for it goes out as mongod's
 * MaxTimeMSExpired (50) "operation exceeded time limit" (a request killOp marked first
 * stays Interrupted). Any thread (the worker running it). */
void wire_req_expire(wire_req *req);

/* What wire_server_each_op reports. */
typedef struct wire_op_opts {
	bool idle;     /* also connections with no request in flight (currentOp $all):
			* {type: "idleConnection", active: false, ...} */
	bool truncate; /* a command over 1000 bytes becomes {$truncated: "<its JSON cut to
			* 1000 bytes, ending in ...>", comment?} (mongod's truncateOps) */
	/* Called for each op document under construction, after the shared fields, so the
	 * role appends its own (effectiveUsers ...); may be NULL. */
	void (*decorate)(void *arg, const wire_conn *conn, bson_t *op);
	/* Called with each finished op document (valid during the call only). */
	void (*each)(void *arg, const wire_conn *conn, const bson_t *op);
	void *arg;
} wire_op_opts;

/* Describe every operation of srv as mongod's currentOp does (CurOp::reportState):
 * {type: "op", host, desc: "conn<N>", connectionId, client, active: true, threaded: true,
 *  opid, lsid?, transaction: {parameters: {txnNumber, autocommit}}? (a multi-document
 *  transaction's statement), secs_running, microsecs_running, op ("query" find, "getmore",
 *  "insert", "update", "remove" delete, else "command"), ns ("db.coll" when the command
 *  names a collection, else "db.$cmd"), command, numYields: 0, locks: {},
 *  waitingForLock: false, killPending: true (only once killed)}.
 * Loop thread only (the requests stay valid while it runs). */
void wire_server_each_op(wire_server *srv, const wire_op_opts *o);

/* The request in flight with this opid, or NULL. Loop thread; valid until the loop runs
 * the server's completions again (i.e. during the calling handler). */
wire_req *wire_server_find_op(wire_server *srv, int32_t opid);

/* --- test fail points for roles (wire/failpoint.c; test commands only) --- */

/* MongoDB's onPrimaryTransactionalWrite fail point, set with configureFailPoint on a
 * server with test commands that is not a mongos: data {closeConnection: bool (default
 * true), failBeforeCommitExceptionCode: N}, modes as failCommand. mongod evaluates it for
 * each statement of a retryable write it executes on the primary; stripedb once per
 * command that executes at least one statement not executed before (a retry answered
 * wholly from the session records does not count). armed: whether it is on (a cheap
 * check before the role looks its records up). Any thread. */
bool wire_failpoint_primary_write_armed(const wire_req *req);
/* Call it for such a command before running it. Not firing: false, run it. Firing:
 * closeConnection drops the reply and closes the connection once answered; with
 * failBeforeCommitExceptionCode the command must not run: req is answered (closed, or
 * the error when closeConnection is false) and true is returned; without it false (the
 * write runs and commits, its reply is lost). Any thread. */
bool wire_failpoint_primary_write(wire_req *req);

/* --- connections --- */

/* Per-connection role state (e.g. authenticated user): a pointer the role owns, with a
 * destructor called on the loop thread when the connection closes. */
void *wire_conn_data(const wire_conn *conn);
void wire_conn_set_data(wire_conn *conn, void *data, void (*free_fn)(void *));
/* The peer address "HOST:PORT" (NUL-terminated, owned by conn). */
const char *wire_conn_peer(const wire_conn *conn);
/* A process-unique connection id (also reported as connectionId in hello). */
int64_t wire_conn_id(const wire_conn *conn);

#endif
