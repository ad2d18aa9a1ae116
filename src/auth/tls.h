/* TLS (OpenSSL, memory BIOs) for the MongoDB wire protocol listeners (issue #10).
 *
 * A role configures TLS for its wire listener with --tls-mode=disabled|allowed|required,
 * --tls-cert (PEM chain), --tls-key (PEM) and optionally --tls-ca (PEM: client
 * certificates are then verified when presented). The role hands its wire server the TLS
 * provider auth_tls_wire() fills (wire_server_opts.tls: the listener's mode and the session
 * functions; wire does not include auth); each connection decides on its first byte: a
 * TLS handshake record (0x16) starts TLS, anything else is plaintext, which `required`
 * refuses by closing the connection (a driver sees a network error, as with mongod's
 * net.tls.mode=requireTLS). Sockets stay libuv streams: ciphertext goes through memory
 * BIOs (auth_tls_conn_feed / auth_tls_conn_write), so no blocking I/O happens in OpenSSL.
 * auth_tls_reload re-reads the certificate and key (for SIGHUP); new connections use them.
 *
 * Listeners (role names): "proxy" (applications), "shard", "metadata" (wire, through
 * src/wire/server.c) and "ratelimit" (the gRPC listener, which reads the PEM texts with
 * auth_tls_listener_pem and serves TLS whenever the mode is not disabled, since one gRPC
 * port cannot serve both). With --tls-ca the proxy verifies client certificates when
 * presented; every other listener requires one signed by the CA (mutual TLS between
 * roles; MongoDB's default allowConnectionsWithoutCertificates=false). The client side of
 * internal connections is --tls-internal, in auth/cluster.h.
 */
#ifndef SDB_AUTH_TLS_H
#define SDB_AUTH_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "wire/server.h"

typedef enum { AUTH_TLS_DISABLED = 0, AUTH_TLS_ALLOWED, AUTH_TLS_REQUIRED } auth_tls_mode;

/* Read the --tls-* options of cfg for the listener of role (e.g. "proxy"). 0 when the mode
 * is disabled or unset. Errors: SDB_EUSAGE for a bad mode (also a bad --raft-tls), a
 * missing cert/key or too many listeners; SDB_EINVAL when OpenSSL refuses the files;
 * message in err. */
int auth_tls_setup(const sdb_config *cfg, const char *role, char *err, size_t errlen);

/* The mode of role's listener (AUTH_TLS_DISABLED when not set up). Thread-safe. */
auth_tls_mode auth_tls_listener_mode(const char *role);

/* Re-read certificate, key and CA of every configured listener, then the client
 * certificate of --tls-internal (auth_cluster_tls_reload), the Raft transport's contexts
 * (auth_raft_reload) and the --http-tls servers. Errors: the first failure's code
 * (SDB_EINVAL, SDB_EIO, SDB_EINTERNAL from the calls above; the others are still
 * reloaded, the failing one keeps its old files). Thread-safe; called on SIGHUP by
 * common/role.c. */
int auth_tls_reload(char *err, size_t errlen);

#define AUTH_TLS_PEM_MAX (1 << 20) /* bytes: larger PEM files are refused */

/* The PEM texts of role's listener files, for TLS stacks that take memory (gRPC).
 * *gen is the caller's generation (0 the first time): when the listener was reloaded
 * since (or on the first call) the files are read, *cert, *key and *ca (NULL without
 * --tls-ca) are heap strings the caller frees, *gen is updated and 1 is returned; 0 when
 * unchanged (nothing allocated). Errors: SDB_ENOTFOUND (no TLS for role), SDB_EIO or
 * SDB_EINVAL (unreadable, larger than AUTH_TLS_PEM_MAX), with a message. Thread-safe. */
int auth_tls_listener_pem(const char *role, unsigned *gen, char **cert, char **key, char **ca,
			  char *err, size_t errlen);

/* Read a whole PEM file (at most AUTH_TLS_PEM_MAX bytes) into a NUL-terminated heap string
 * the caller frees. Errors: SDB_EIO (cannot be read) or SDB_EINVAL (too large) with a
 * message. */
int auth_tls_read_pem(const char *path, char **out, char *err, size_t errlen);

typedef struct auth_tls_conn auth_tls_conn;
typedef void (*auth_tls_out_fn)(void *arg, const uint8_t *data, size_t len);

/* A server-side TLS session for role's listener; NULL when it has no TLS. */
auth_tls_conn *auth_tls_conn_new(const char *role);
void auth_tls_conn_free(auth_tls_conn *c); /* NULL is a no-op */

/* Feed len ciphertext bytes received. Decrypted bytes go to plain(arg, ...), bytes to send
 * (handshake, alerts) to send(arg, ...), both called synchronously. Errors: SDB_EPROTO
 * when the session failed or was closed by the peer (close the connection). */
int auth_tls_conn_feed(auth_tls_conn *c, const uint8_t *in, size_t len, auth_tls_out_fn plain,
		       auth_tls_out_fn send, void *arg);

/* Encrypt len plaintext bytes; the ciphertext goes to send(arg, ...). Errors: SDB_EPROTO
 * (the session failed). */
int auth_tls_conn_write(auth_tls_conn *c, const uint8_t *data, size_t len, auth_tls_out_fn send,
			void *arg);

/* The wire server's TLS provider for role's listener (wire_server_opts.tls): its mode
 * (auth_tls_listener_mode) and the session functions above. Fills *out; thread-safe. */
void auth_tls_wire(const char *role, wire_tls *out);

#endif
