/* TLS (OpenSSL, memory BIOs) for the listeners of the roles (issue #10, issue #24: its own
 * layer, below wire: common <- tls <- wire <- auth <- roles; it includes only common).
 *
 * A role configures TLS for its listener with --tls-mode=disabled|allowed|required,
 * --tls-cert (PEM chain), --tls-key (PEM) and optionally --tls-ca (PEM: client
 * certificates are then verified when presented), through tls_setup. A wire server
 * created with wire_server_opts.tls serves the TLS of its role's listener (wire/server.c
 * calls the session functions below); each connection decides on its first byte: a TLS
 * handshake record (0x16) starts TLS, anything else is plaintext, which `required`
 * refuses by closing the connection (a driver sees a network error, as with mongod's
 * net.tls.mode=requireTLS). Sockets stay libuv streams: ciphertext goes through memory
 * BIOs (tls_conn_feed / tls_conn_write), so no blocking I/O happens in OpenSSL.
 * The first successful tls_setup registers tls_reload as the "TLS" SIGHUP hook of the role
 * runner (common/role.h sdb_on_sighup); new connections use the reloaded certificates.
 *
 * Listeners (role names): "proxy" (applications), "shard", "metadata" (wire, through
 * src/wire/server.c) and "ratelimit" (the gRPC listener, which reads the PEM texts with
 * tls_listener_pem and serves TLS whenever the mode is not disabled, since one gRPC
 * port cannot serve both). With --tls-ca the proxy verifies client certificates when
 * presented; every other listener requires one signed by the CA (mutual TLS between
 * roles; MongoDB's default allowConnectionsWithoutCertificates=false). The client side of
 * internal connections is --tls-internal, in auth/cluster.h.
 */
#ifndef SDB_TLS_TLS_H
#define SDB_TLS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* The mode of a listener (--tls-mode). */
typedef enum { TLS_MODE_DISABLED = 0, TLS_MODE_ALLOWED, TLS_MODE_REQUIRED } tls_mode;

/* Who may connect to a listener, as its role says (tls_setup). */
typedef enum {
	TLS_CLIENTS_INTERNAL = 0, /* cluster members: with a CA, a client certificate is
				   * required (every role but the proxy) */
	TLS_CLIENTS_APPLICATIONS, /* applications' drivers: a client certificate is checked
				   * when presented, not required (the proxy) */
} tls_clients;

/* Read the --tls-* options of cfg for the listener of role (e.g. "proxy"; a name for
 * tls_listener_get and the logs) whose clients are `clients`; the first listener set up
 * registers tls_reload as the "TLS" SIGHUP hook. 0 when the mode is disabled or unset.
 * Errors: SDB_EUSAGE for a bad mode, a missing cert/key or too many listeners; SDB_EINVAL
 * when OpenSSL refuses the files; message in err. */
int tls_setup(const sdb_config *cfg, const char *role, tls_clients clients, char *err,
	      size_t errlen);

/* The mode of role's listener (TLS_MODE_DISABLED when not set up). Thread-safe. */
tls_mode tls_listener_mode(const char *role);

/* A listener set up by tls_setup, as a role hands it to its wire server
 * (wire_server_opts.tls): role's listener, or NULL when it has none. The handle lives as
 * long as the process; its context is replaced in place by tls_reload. Thread-safe. */
typedef struct tls_listener tls_listener;
tls_listener *tls_listener_get(const char *role);
/* The mode of listener l (not NULL). Thread-safe. */
tls_mode tls_listener_get_mode(const tls_listener *l);

/* Make listener l (not NULL) an HTTP/2 one: its TLS handshakes select the ALPN protocol
 * "h2" when the client offers it (gRPC clients require it), now and after each reload.
 * Idempotent. Thread-safe. */
void tls_listener_set_alpn_h2(tls_listener *l);

/* Re-read certificate, key and CA of every configured listener and bump the generation of
 * each one reloaded (tls_listener_pem). Only the listeners of this file: the other
 * certificates (--tls-internal, the Raft port, --http-tls) have their own SIGHUP hooks.
 * 0, or Errors: the first failure's SDB_EINVAL / SDB_EIO, message in err (the old context
 * of a failing listener stays; the others are still reloaded).
 * Thread-safe; an sdb_reload_fn, run on SIGHUP by common/role.c. */
int tls_reload(char *err, size_t errlen);

#define TLS_PEM_MAX (1 << 20) /* bytes: larger PEM files are refused */

/* The PEM texts of role's listener files, for TLS stacks that take memory (gRPC).
 * *gen is the caller's generation (0 the first time): when the listener was reloaded
 * since (or on the first call) the files are read, *cert, *key and *ca (NULL without
 * --tls-ca) are heap strings the caller frees, *gen is updated and 1 is returned; 0 when
 * unchanged (nothing allocated). Errors: SDB_ENOTFOUND (no TLS for role), SDB_EIO or
 * SDB_EINVAL (unreadable, larger than TLS_PEM_MAX), with a message. Thread-safe. */
int tls_listener_pem(const char *role, unsigned *gen, char **cert, char **key, char **ca,
		     char *err, size_t errlen);

/* Read a whole PEM file (at most TLS_PEM_MAX bytes) into a NUL-terminated heap string
 * the caller frees. Errors: SDB_EIO (cannot be read) or SDB_EINVAL (too large) with a
 * message. */
int tls_read_pem(const char *path, char **out, char *err, size_t errlen);

typedef struct tls_conn tls_conn;
/* Where a session hands bytes: data (len bytes) is valid during the call only. */
typedef void (*tls_out_fn)(void *arg, const uint8_t *data, size_t len);

/* A server-side TLS session on listener l's current context (tls_listener_get); NULL when
 * l is NULL or OpenSSL could not allocate one. Free with tls_conn_free. */
tls_conn *tls_conn_new(tls_listener *l);
void tls_conn_free(tls_conn *c); /* NULL is a no-op */

/* Feed len ciphertext bytes received. Decrypted bytes go to plain(arg, ...), bytes to send
 * (handshake, alerts) to send(arg, ...), both called synchronously. Returns 0, or 1 when
 * the peer closed its side with close_notify (RFC 8446 6.1: it sends nothing more; the
 * bytes before it were handed to plain, and c may still encrypt replies). Errors:
 * SDB_EPROTO when the session failed (close the connection). */
int tls_conn_feed(tls_conn *c, const uint8_t *in, size_t len, tls_out_fn plain, tls_out_fn send,
		  void *arg);

/* Encrypt len plaintext bytes; the ciphertext goes to send(arg, ...). Errors: SDB_EPROTO
 * (the session failed). */
int tls_conn_write(tls_conn *c, const uint8_t *data, size_t len, tls_out_fn send, void *arg);

/* Has the handshake of c completed? */
bool tls_conn_ready(const tls_conn *c);

#endif
