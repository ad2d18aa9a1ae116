/* stripedb's authenticated (and optionally TLS-encrypted) libraft transport (issue #21).
 *
 * An implementation of libraft 0.15's `struct raft_uv_transport` (raft/uv.h) on libuv,
 * replacing the stock `raft_uv_tcp_init` transport, which has neither encryption nor
 * authentication. Role-agnostic: anything that runs a raft_uv backend (metadata members
 * today, shard replica sets later) can use it.
 *
 * Contract with libraft (the same as the stock src/uv_tcp*.c):
 *   - init(id, address): remember who we are; the listener handle is initialised.
 *   - listen(cb): bind `address` (IPv4 or [IPv6] literal, HOST:PORT) and accept; for each
 *     connection that completes the handshake below, cb(transport, peer id, peer address,
 *     stream) with a raft_malloc'ed uv_stream_t that libraft then owns: it reads the Raft
 *     messages from it, uv_close()s it and raft_free()s it.
 *   - connect(req, id, address, cb): connect, run the handshake, send libraft's preamble
 *     (protocol, our id, our address), then req->cb(req, stream, 0) with a stream libraft
 *     owns as above; on failure req->cb(req, NULL, RAFT_NOCONNECTION), or RAFT_CANCELED
 *     when the transport is closing. libraft writes Raft messages to that stream.
 *   - close(cb): stop accepting, cancel connects and handshakes in progress, close the
 *     TLS bridges still open, then cb(transport) once no handle of ours is left.
 *   - sdb_transport_close() frees the implementation after that callback (or when init
 *     or listen were never called).
 *
 * Each connection, before any Raft byte reaches libraft:
 *   1. TLS (when opts.tls_ctx is set): OpenSSL over memory BIOs on the libuv TCP stream,
 *      both sides present a certificate and verify the peer's against the CA of the
 *      context (mutual TLS); a peer without a valid certificate is refused.
 *   2. The handshake of raft/handshake.h: magic and version, and when opts.key is set a
 *      mutual HMAC-SHA256 challenge-response over both sides' random nonces (and the TLS
 *      exporter value when TLS is on).
 *   3. The connector's libraft preamble (server id and address), parsed with bounds, and
 *      opts.peer_ok's verdict on them (the metadata node refuses ids and addresses that
 *      are not in its Raft configuration: another cluster's member).
 * In plaintext mode steps 1 and 2 are skipped (libraft's own wire format).
 * Accepted connections in plaintext mode (unauthenticated) then go through the message
 * validator of raft/msgcheck.h: the first malformed message closes the connection, and
 * libraft never sees a byte of it. (An authenticated peer, by key or certificate, is
 * trusted as a member: its stream is libraft's as before.)
 * A connection that fails a step, or does not finish within handshake_timeout_ms, is
 * closed and logged (`raft: transport peer refused`, at most one line per second with a
 * count of the others; counter stripedb_raft_transport_refused_total).
 *
 * How libraft gets its stream:
 *   - With the key and without TLS the authenticated uv_tcp_t itself is handed over (the
 *     handshake reads exactly the bytes it needs, so nothing of the Raft stream is
 *     consumed); so is the connector's side in plaintext mode.
 *   - An accepted plaintext-mode connection gets the bridge below without TLS: the bytes
 *     pass the validator on their way to libraft.
 *   - With TLS libraft still needs a real uv_stream_t that carries plaintext, so each
 *     connection gets a bridge: a socketpair(AF_UNIX), one end a uv_pipe_t given to
 *     libraft, the other ours; plaintext read from ours is encrypted onto the TCP stream
 *     and decrypted bytes from TCP are written to ours. Cost: two extra socket copies
 *     per message and one more fd pair per connection (raft/README.md has the measured
 *     cost). Each direction stops reading when the other side has more than 4 MiB queued
 *     (back-pressure), so a slow peer cannot grow memory without bound.
 *
 * Everything runs on the loop given to sdb_transport_init; nothing is thread-safe except
 * opts.tls_ctx, which the caller makes safe (it may be swapped by a SIGHUP reload: each
 * new connection asks for the current context).
 */
#ifndef SDB_RAFT_TRANSPORT_H
#define SDB_RAFT_TRANSPORT_H

#include <raft.h>
#include <raft/uv.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

struct ssl_ctx_st;

typedef struct sdb_transport_opts {
	/* SDB_HS_KEY_LEN (32) bytes derived from the cluster key (copied), or NULL. */
	const uint8_t *key;
	/* Key rotation: when set, asked at every new connection for the current keys
	 * (instead of key): writes up to max keys into out, out[0] first (outgoing
	 * connections prove with it; incoming ones may prove with any), returns the count (0:
	 * no key). Must be thread-safe if the caller changes the keys from another thread. */
	size_t (*keys)(uint8_t (*out)[32], size_t max, void *arg);
	void *keys_arg;
	/* TLS: a new reference (SSL_CTX_up_ref) to the server (server=true) or client
	 * context, which must require and verify the peer's certificate; the transport
	 * frees it. NULL function: no TLS. A NULL return refuses the connection. */
	struct ssl_ctx_st *(*tls_ctx)(bool server, void *arg);
	void *tls_arg;
	unsigned handshake_timeout_ms; /* 0 = 5000 */
	unsigned max_pending;          /* handshakes in progress at once; 0 = 128 */
	/* Plaintext mode (no key, keys nor tls_ctx allowed with it): libraft's own bare TCP
	 * handshake (the connector sends the preamble, nothing else), wire-compatible with
	 * raft_uv_tcp_init's transport, but every accepted connection is bridged through
	 * raft/msgcheck.h so that no malformed message reaches libraft, and peer_ok applies. */
	bool plaintext;
	/* When set, asked once per accepted connection after the preamble (the connector's
	 * raft server id and address): false refuses it (closed before any byte reaches
	 * libraft, logged with *why, a static text). Runs on the loop. NULL: accept all. */
	bool (*peer_ok)(uint64_t id, const char *address, void *arg, const char **why);
	void *peer_arg;
	/* When set, asked at every outgoing connection for the address to announce in the
	 * preamble (peer_arg as argument; the string only needs to live until the call
	 * returns' preamble is encoded, on the loop); NULL or "": the address libraft gave
	 * init. The metadata node announces its address in the Raft configuration, which is
	 * what its peers check (peer_ok) and where libraft sends its replies. */
	const char *(*announce)(void *arg);
} sdb_transport_opts;

/* Initialise t (its data field is kept) as our transport on loop with opts (copied).
 * Exactly one of: plaintext, or at least one of key, keys and tls_ctx.
 * Returns: 0, or a libraft code (not an SDB_E* status): RAFT_INVALID (no key, keys or
 * tls_ctx without plaintext, or plaintext with one of them) or RAFT_NOMEM, with a message
 * in t->errmsg. */
int sdb_transport_init(struct raft_uv_transport *t, uv_loop_t *loop,
		       const sdb_transport_opts *opts);

/* Free what sdb_transport_init allocated (after close's callback, or when the transport
 * was never initialised by libraft). */
void sdb_transport_close(struct raft_uv_transport *t);

#endif
