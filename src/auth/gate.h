/* The proxy's authentication and authorization gate (issue #10, DESIGN.md §5 step 1),
 * installed as wire_server_opts.gate when --auth=enabled.
 *
 *  - Unauthenticated connections may run hello/isMaster, ping, saslStart and (inside a
 *    conversation) saslContinue; anything else fails with Unauthorized (13).
 *  - saslStart/saslContinue run SCRAM-SHA-256 or SCRAM-SHA-1 (auth/scram.h) against the
 *    verifier read from the metadata service (getUser, on the libuv thread pool: the
 *    top-level verifier, or scramSha1; a user created before SHA-1 verifiers were stored
 *    has none and fails SCRAM-SHA-1 with 18). hello answers saslSupportedMechs with both,
 *    for every name (no user enumeration).
 *  - hello's speculativeAuthenticate starts the conversation in hello when the user's
 *    verifier for that mechanism was looked up by a saslStart in the last 10 s and no
 *    user changed since (metadata usersVersion, seen through auth_gate_load and getUser);
 *    else drivers run saslStart. Such a conversation reads the verifier again from
 *    metadata before it succeeds, so a dropped user or an old password never
 *    authenticates after the change committed.
 *  - Dropped users: auth_gate_load re-reads the user names (listUsers) whenever usersVersion
 *    moved; a connection authenticated with a verifier of version V whose user is absent
 *    from a list of version >= V is logged out: its next command fails with Unauthorized
 *    (13) "command X requires authentication" (MongoDB logs a dropped user out of its
 *    sessions). A password change logs nobody out.
 *  - Every failure (unknown user, wrong password, malformed message, brute-force limit)
 *    answers AuthenticationFailed (18) "Authentication failed." exactly fail_delay_ms
 *    after the request arrived, so timing tells nothing.
 *  - Brute force: failures are counted per key, "user:NAME" and "host:IP" (limit
 *    failure_limit per 60 s, 10 times that per host), by counters the role provides
 *    (auth_gate_opts.failures_*: the proxy's are token buckets of its rate limiter, so
 *    auth does not depend on the rate limiter); once a key is exhausted, authentication
 *    is refused for it even with the right password until the window ends.
 *  - Authenticated connections: each command is mapped to actions on namespaces (including
 *    every namespace inside aggregate pipelines, views and findAndModify) and checked
 *    with auth/policy.h for the user's tenant; a denial is Unauthorized (13) and audited.
 *    listDatabases is answered here with the tenant's databases only.
 */
#ifndef SDB_AUTH_GATE_H
#define SDB_AUTH_GATE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "wire/server.h"

/* Run a command on the metadata service (blocking; called on a thread-pool thread). reply
 * is always initialised (the gate destroys it). Returns 0 or an error with *code (the
 * service's error code, 0 when unreachable) and a message. */
typedef int (*auth_meta_fn)(void *arg, const bson_t *cmd, bson_t *reply, int *code, char *err,
			    size_t errlen);

/* One key of the brute-force limit: "user:NAME" or "host:IP" (NUL-terminated, valid during
 * the call), and the failures it allows per window. */
typedef struct auth_failure_key {
	const char *key;
	int64_t limit;
} auth_failure_key;

/* A counter of failed authentications, provided by the role: count (hits 1) or check
 * (hits 0) the failures of keys[0..n) (n <= 2) in windows of window_ms. Sets *under to true
 * when every key is under its limit (hits 1: this failure fit; hits 0: an attempt is
 * left), else false. Returns 0, or an SDB_E* code with a message in err when it cannot
 * answer (*under is then unset). */
typedef int (*auth_failures_fn)(void *ctx, const auth_failure_key *keys, size_t n, int64_t hits,
				int64_t window_ms, bool *under, char *err, size_t errlen);

typedef struct auth_gate_opts {
	uv_loop_t *loop;
	auth_meta_fn meta;
	void *meta_arg;
	int64_t failure_limit;   /* failed authentications per key per 60 s; 0 = 10 */
	int64_t fail_delay_ms;   /* 0 = AUTH_GATE_FAIL_DELAY_MS */
	/* Verifier of the internal user __system (auth/cluster.h), or NULL. A connection
	 * authenticated as __system may run any command. With meta NULL the gate is the
	 * cluster gate of an internal listener: only __system can authenticate, and failures
	 * are answered at once (loop may be NULL). */
	const struct auth_scram_creds *cluster;
	/* Number of verifiers at cluster (0 counts as 1 when cluster is set): the keys of a
	 * rotation (auth/cluster.h), all with the same mechanism, salt and iterations. A
	 * conversation is answered with cluster[0]'s salt and succeeds with any of them. */
	size_t n_cluster;
	/* Where failed authentications are counted (the brute-force limit), both with
	 * failures_ctx. failures_local: counts private to this gate; never blocks (called on
	 * the loop thread); an error refuses the attempt. NULL: no limit (the cluster gate,
	 * whose __system key is not guessable). failures_cluster: the cluster's count (the
	 * proxy passes its peer ring, so every proxy sees one count per user and per client
	 * host); may block (only called on thread-pool threads); an error lets the attempt
	 * through (the fixed delay still applies), as the quota path does. NULL: none. */
	auth_failures_fn failures_local;
	auth_failures_fn failures_cluster;
	void *failures_ctx;
} auth_gate_opts;

#define AUTH_GATE_FAIL_DELAY_MS 200

typedef struct auth_gate auth_gate;

#define AUTH_GATE_CLUSTER_MAX 8 /* verifiers of __system at once (= AUTH_CLUSTER_KEYS_MAX) */

/* Replace the __system verifiers of a gate made with opts.cluster (creds: n >= 1, at
 * most AUTH_GATE_CLUSTER_MAX, copied), e.g. after the key file was reloaded. Conversations
 * already past saslStart finish against the new set. Thread-safe. */
struct auth_scram_creds;
void auth_gate_set_cluster(auth_gate *g, const struct auth_scram_creds *creds, size_t n);

/* Create (never fails; allocation aborts). Free with auth_gate_free after the wire server
 * has closed (no request in flight). */
auth_gate *auth_gate_new(const auth_gate_opts *opts);
void auth_gate_free(auth_gate *g);

/* Replace the tenant tables (listTenants and listDatabases replies of the metadata
 * service); listTenants' usersVersion invalidates older cached verifiers and, when it
 * moved, re-reads the user list with a blocking listUsers through opts.meta: call it from
 * a thread that may block (the proxy's refresher), never the loop thread. */
void auth_gate_load(auth_gate *g, const bson_t *tenants, const bson_t *dbs);

/* The wire gate (wire_gate_fn with role data g). Loop thread. */
bool auth_gate_check(auth_gate *g, wire_req *req);

/* The SASL payload of a saslStart / saslContinue command or of its reply (its "payload"
 * field, BinData or, as some drivers send it, a string): *data (borrowed from doc) and
 * *len bytes, not NUL-terminated. False when doc has none of either type. Used by the
 * gate (server side) and by auth_cluster_authenticate (client side). */
bool auth_sasl_payload(const bson_t *doc, const uint8_t **data, uint32_t *len);

/* The user conn authenticated as (a tenant user, or __system), or NULL when it has not
 * (or no gate runs on its listener). The string lives in the connection's state: call on
 * the loop thread and copy it before handing it to another thread. Used to bind cursors
 * to their user (MongoDB: a cursor is usable only by the user that created it). */
const char *auth_gate_conn_user(const wire_conn *conn);
/* currentOp's `effectiveUsers: [{user, db}]` of conn's user, appended to op (nothing when
 * conn has not authenticated); db is "local" for __system (the cluster user), else
 * "admin" (mongod's currentOp field, shard and proxy alike). Loop thread. */
void auth_gate_append_effective_users(const wire_conn *conn, bson_t *op);

/* hello hook part: adds saslSupportedMechs when the hello asks for it. */
void auth_gate_hello(auth_gate *g, const bson_t *cmd, bson_t *reply);

/* Pure command classification, exposed for unit tests and fuzzing: may tenant run cmd
 * (name = first key) on db under pol? On denial, *what names the refused action and
 * namespace (static buffer of whatlen bytes). */
struct auth_policy;
bool auth_gate_authorize(const struct auth_policy *pol, const char *tenant, const char *name,
			 const char *db, const bson_t *cmd, char *what, size_t whatlen);

#endif
