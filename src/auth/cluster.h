/* Internal trust between roles: the cluster key (issue #10).
 *
 * With --cluster-key-file=PATH, the shard and metadata wire listeners refuse every command
 * but hello/isMaster, ping, saslStart and saslContinue until the connection has
 * authenticated with SCRAM-SHA-256 as the internal user "__system" whose password is the
 * key, exactly as MongoDB's keyFile internal authentication works (so libmongoc speaks it
 * unchanged). Internal commands (routing updates and registrations on metadata,
 * stripedbSetVersion and replication writes on shards) are therefore reachable only by
 * cluster members; clients of the cluster go through the proxy, which authenticates to
 * shards and metadata with the key (auth_cluster_uri_apply).
 *
 * Key file (MongoDB's rules): the file must not be readable by group or others
 * (mode & 077 == 0) and holds either
 *   - one key: 6..1024 characters of the base64 alphabet once whitespace is removed (a
 *     key wrapped over several lines, as `openssl rand -base64 756` writes it, is ONE
 *     key, as in MongoDB), or
 *   - several keys (rotation, issue #21), MongoDB's YAML list form: one `- KEY` item per
 *     key (optionally quoted with ' or "; an indented line continues the item above;
 *     blank lines and lines starting with # are ignored), at most AUTH_CLUSTER_KEYS_MAX.
 * Outgoing authentication (the SCRAM password of internal clients, the PeersV1 token,
 * the Raft handshake proof) uses the FIRST key; incoming authentication accepts ANY key
 * of the file (MongoDB's keyfile rotation). auth_cluster_reload (SIGHUP) re-reads the
 * file. One key file per process (all roles of a process share it). Thread-safe after
 * setup.
 */
#ifndef SDB_AUTH_CLUSTER_H
#define SDB_AUTH_CLUSTER_H

#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/config.h"
#include "wire/server.h"

#define AUTH_CLUSTER_USER "__system"
#define AUTH_CLUSTER_KEY_MAX 1024 /* characters of one key */
#define AUTH_CLUSTER_KEYS_MAX 8   /* keys in one file */

/* Parse a key file's text (len bytes, untrusted, not NUL-terminated) into keys (each
 * NUL-terminated), *n of them (>= 1 on success), in file order. Errors: SDB_EINVAL with a
 * message naming what (and the line) is wrong; what names the file in messages. No I/O:
 * exposed for the unit tests. */
int auth_cluster_parse_keys(const char *text, size_t len, const char *what,
			    char keys[][AUTH_CLUSTER_KEY_MAX + 1], size_t *n, char *err,
			    size_t errlen);

/* Read the key of cfg's --cluster-key-file (a no-op when unset), then, with
 * --tls-internal=true, the internal TLS client settings (auth_cluster_tls_load with
 * --tls-ca, --tls-cert, --tls-key). Idempotent for the same key. Errors: SDB_EINVAL when
 * another role of the process gave a different key, the file breaks the rules above or
 * cannot be read (the role exits 2), or a TLS file is refused; SDB_EUSAGE for
 * --tls-internal without --tls-ca or with only one of --tls-cert/--tls-key; SDB_EIO when
 * a TLS file cannot be read or the combined client PEM written; SDB_EINTERNAL (no
 * randomness, OpenSSL failure); message in err. */
int auth_cluster_setup(const sdb_config *cfg, char *err, size_t errlen);

/* Load the key(s) from a path directly (used by setup, ctl and tests); idempotent for a
 * file with the same keys. Errors: SDB_EIO (the file cannot be read or is not a regular
 * file: setup turns this into SDB_EINVAL), SDB_EINVAL (too large, breaks the rules above,
 * or differs from the keys already loaded), SDB_EINTERNAL (no randomness). */
int auth_cluster_load(const char *path, char *err, size_t errlen);

/* Re-read the key file loaded by auth_cluster_load (the "cluster key" SIGHUP hook that the
 * first successful auth_cluster_load registers): the new keys replace the old ones for
 * every connection and internal client made afterwards (SCRAM __system, PeersV1, Raft
 * handshakes); connections already authenticated stay. 0 also when no key is loaded.
 * Errors: SDB_EIO / SDB_EINVAL as auth_cluster_load, SDB_EINTERNAL, with a message: the
 * old keys stay in use. Thread-safe. */
int auth_cluster_reload(char *err, size_t errlen);

/* Number of keys loaded (0: none). */
size_t auth_cluster_key_count(void);

/* Bumped by every auth_cluster_reload that changed the keys (starts at 1 once loaded):
 * holders of long-lived internal clients or pools compare it to rebuild them with the
 * new first key. */
uint64_t auth_cluster_generation(void);

/* Is a cluster key loaded in this process? */
bool auth_cluster_enabled(void);

/* Derive a 32-byte secret for one purpose from the key: HMAC-SHA-256(key, label) (the key
 * itself never leaves this file). False (out untouched) when no key is loaded. Used by
 * the Raft transport's handshake (label "stripedb raft transport v1"). Thread-safe. */
bool auth_cluster_derive(const char *label, uint8_t out[32]);

/* The same derivation for every key, in file order (out[0]: the first key, used for
 * outgoing connections; all of them are accepted on incoming ones): the count written
 * (at most max), 0 when no key is loaded. Thread-safe. */
size_t auth_cluster_derive_all(const char *label, uint8_t out[][32], size_t max);

/* The wire gate for internal listeners: NULL when no key is loaded (nothing changes),
 * else a wire_gate_fn that ignores its role_data. */
wire_gate_fn auth_cluster_gate(void);

/* Give a client URI the cluster credentials (user __system, the key, authSource admin,
 * SCRAM-SHA-256) when a key is loaded, and the internal TLS options when
 * auth_cluster_tls_enabled(): tls=true, tlsCAFile=--tls-ca and
 * tlsCertificateKeyFile=the client PEM (see auth_cluster_tls_load), each only when the URI
 * does not set that option itself. libmongoc applies URI TLS options to clients and
 * pools made from the URI (mongoc_client_new_from_uri, mongoc_client_pool_new).
 * No-op when neither is configured. Returns true on success. */
bool auth_cluster_uri_apply(mongoc_uri_t *uri);

/* mongoc_client_new(uri) with the cluster credentials and internal TLS applied (a drop-in
 * replacement for internal clients). NULL when the URI is invalid. */
mongoc_client_t *auth_cluster_client_new(const char *uri);

/* Called on the loop thread when an auth_cluster_command_async command has finished:
 * ok is true when the peer answered {ok: 1}; reply is its answer (an empty document when
 * none came), valid during the call only. */
typedef void (*auth_cluster_command_cb)(void *arg, bool ok, const bson_t *reply);

/* Send one admin-database command to a peer of the same cluster ("host:port", a direct
 * connection with the cluster credentials and internal TLS, 1 s connect and 2 s
 * socket/server-selection timeouts) on libuv's thread pool, then call cb(arg, ok) on the
 * loop thread (never synchronously). cmd is copied. what names the caller in the debug
 * log line written when the command fails. Used by Raft-replicated roles whose followers
 * register themselves with the leader. Errors: SDB_EIO when the work could not be queued
 * (cb is then never called). */
int auth_cluster_command_async(uv_loop_t *loop, const char *host, const bson_t *cmd,
			       const char *what, auth_cluster_command_cb cb, void *arg);

/* The transport of auth_cluster_authenticate: send cmd (a complete command, $db included)
 * on the caller's connection and put the answer into reply, which the function
 * initialises in every case (the caller destroys it). Returns 0 when an answer came,
 * whatever its ok, else an SDB_E* status with a message in err. */
typedef int (*auth_cluster_run_fn)(void *arg, const bson_t *cmd, bson_t *reply, char *err,
				   size_t errlen);

/* Authenticate a connection of an internal client as a cluster member, as a driver does
 * with the key file (MongoDB's auth spec, SCRAM-SHA-256, RFC 5802/7677): saslStart and
 * saslContinue (and the empty last saslContinue when the server asks for it) as __system
 * with the first key, through run; the server's signature is checked, so a peer that
 * does not know the key is refused. Returns 0 at once, sending nothing, when no key is
 * loaded. Errors: SDB_EAUTH (refused, or the server's signature is wrong), SDB_EPROTO (a
 * malformed answer), SDB_EINTERNAL (no randomness, OpenSSL), or run's status; message in
 * err. Any thread (the key is copied under the module's lock, cleansed after use). Used
 * by the proxy's own shard connections (proxy/shardwire.c). */
int auth_cluster_authenticate(auth_cluster_run_fn run, void *arg, char *err, size_t errlen);

/* ---- internal TLS: the client side of mutual TLS between roles (issue #10) ----
 * Explicit, per process: --tls-internal=true (config file: tls-internal = true) makes
 * every internal client (libmongoc to shards and metadata members through the helpers
 * above, rate-limit peers over gRPC in ratelimit/peers.c) use TLS, verify the server's
 * certificate and host name against --tls-ca, and present --tls-cert/--tls-key as client
 * certificate. It does not depend on --tls-mode (which is about this process's own
 * listeners). libmongoc wants certificate and key in one PEM file: when --tls-cert and
 * --tls-key name the same file it is used as is, otherwise the two are concatenated into
 * a private file (mode 600) $TMPDIR/stripedb-client-XXXXXX.pem (TMPDIR unset: /tmp),
 * rewritten on reload and removed at exit. One setting per process. */

/* Set the internal TLS client settings: ca (required), cert and key (both or neither).
 * Idempotent for the same paths. Errors: SDB_EUSAGE (no ca, cert without key), SDB_EINVAL
 * (different paths already loaded by another role, or unreadable PEM), SDB_EIO (the
 * combined file cannot be written), with a message. Thread-safe. */
int auth_cluster_tls_load(const char *ca, const char *cert, const char *key, char *err,
			  size_t errlen);

/* For processes without role options (`stripedb ctl`, which loads the key itself): with
 * STRIPEDB_TLS_INTERNAL=true (or 1, yes), internal TLS from STRIPEDB_TLS_CA,
 * STRIPEDB_TLS_CERT, STRIPEDB_TLS_KEY (empty variables count as unset). 0 when
 * STRIPEDB_TLS_INTERNAL is unset or false. Errors: as auth_cluster_tls_load (SDB_EUSAGE
 * for STRIPEDB_TLS_INTERNAL without STRIPEDB_TLS_CA), message in err. */
int auth_cluster_tls_setup_env(char *err, size_t errlen);

/* Is internal TLS configured in this process? Thread-safe. */
bool auth_cluster_tls_enabled(void);

/* Rewrite the combined client PEM from the current --tls-cert/--tls-key files (SIGHUP,
 * the "internal TLS" hook that the first successful auth_cluster_tls_load registers);
 * clients and pools made afterwards present the new certificate. 0 also when internal TLS
 * is off. Errors: SDB_EIO/SDB_EINVAL (unreadable or refused files, the file cannot be
 * written), SDB_EINTERNAL (OpenSSL); the old file stays. */
int auth_cluster_tls_reload(char *err, size_t errlen);

/* The PEM texts for a TLS stack that takes memory (gRPC peers): *ca, and *cert and *key (NULL
 * when no client certificate is configured); heap strings the caller frees. Errors:
 * SDB_ENOTFOUND (internal TLS off), SDB_EIO/SDB_EINVAL (unreadable), with a message. */
int auth_cluster_tls_pem(char **ca, char **cert, char **key, char *err, size_t errlen);

/* PeersV1 (rate-limit peer ring, gRPC): peers send the gRPC metadata
 * AUTH_CLUSTER_PEER_HEADER: HEX(HMAC-SHA-256(key, "stripedb PeersV1")), a token derived from
 * the key (seeing it on the wire does not reveal the key). */
#define AUTH_CLUSTER_PEER_HEADER "x-stripedb-cluster-token"

/* The rate limiter's buckets of the cluster itself (tenant quotas, authentication failure
 * counts) are named with this prefix. With a key loaded, the public pb.gubernator.V1 API
 * (gRPC and the HTTP gateway) refuses such names (PERMISSION_DENIED), so a client cannot
 * drain or reset a tenant's quota; members reach them in-process or through PeersV1. */
#define AUTH_CLUSTER_RESERVED_LIMIT_PREFIX "stripedb_"

/* Is name (a bucket name of a public V1 request: untrusted, may be NULL) reserved? True
 * with the refusal message in msg (msglen bytes) when a key is loaded and name starts with
 * AUTH_CLUSTER_RESERVED_LIMIT_PREFIX; false otherwise. The rate limiter applies it to
 * every request of a batch (rl_v1_reserved in ratelimit/grpc_server.h). */
bool auth_cluster_reserved_name(const char *name, char *msg, size_t msglen);

/* The token of the first key (64 hex characters, never freed: a reload that changes the
 * first key makes a new string and leaves the old one valid) or NULL when no key is
 * loaded. */
const char *auth_cluster_peer_token(void);

/* Does value (len bytes, untrusted) carry the token of any loaded key? True when no key
 * is loaded (nothing to check). Constant-time comparisons. */
bool auth_cluster_peer_token_ok(const char *value, size_t len);

#endif
