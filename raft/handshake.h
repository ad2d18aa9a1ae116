/* The connection handshake of stripedb's Raft transport (raft/transport.h), as a pure
 * codec: no I/O, no clock, no random (the caller gives the nonce), so it can be unit
 * tested and fuzzed (tests/fuzz/fuzz_raft_handshake.c).
 *
 * It runs at the start of every Raft connection, inside TLS when TLS is on, before any
 * Raft message byte is handed to libraft. Connector = "client", acceptor = "server".
 *
 *   both sides  -> HELLO  48 bytes: magic "SDBRAFT\1" (8) | flags (1; bit 0: the sender
 *                         proves the cluster key) | 7 zero bytes | nonce (32, random)
 *   both sides  -> PROOF  32 bytes, only when the cluster key is configured (flags bit 0):
 *                         HMAC-SHA256(K, "stripedb raft proof v1" | role (1 byte: 'C' for
 *                         the connector, 'S' for the acceptor) | client nonce | server
 *                         nonce | binding (32))
 *                         each side sends its proof as soon as it has the peer's hello and
 *                         checks the peer's proof with CRYPTO_memcmp (constant time)
 *   client      -> PREAMBLE libraft's own TCP handshake (src/uv_tcp_connect.c): protocol
 *                         u64 LE (= 1) | server id u64 LE | address length u64 LE (a
 *                         multiple of 8, 8..SDB_HS_ADDR_MAX) | address, NUL padded
 *
 * Key rotation (issue #21): the server may hold several keys (K1 first, then the others
 * of the key file). The client proves with its one key; the server checks the client's
 * proof against each of its keys and sends its own proof only after one matched, made
 * with that key (so the client, which knows one key, can check it). A client with
 * several keys uses the first. Compatible with the one-key version of this protocol,
 * whose client sends its proof without waiting for the server's.
 *
 * K is the 32-byte key the caller derives from the cluster key (auth_cluster_derive). The
 * role byte keeps a proof from being reflected back; both nonces make it fresh (MongoDB's
 * keyFile authentication is the same idea with SCRAM). binding is the TLS exporter value
 * of the session when TLS is on (SSL_export_keying_material), zeros otherwise, so a proof
 * cannot be relayed into another TLS session.
 *
 * Either side refuses when the peer's magic is wrong, when exactly one side has a key
 * (flag mismatch), when the proof is wrong, or, on the server, when the preamble's
 * protocol is not 1, the id is 0, the address length is out of range or the address is
 * not NUL-terminated. Refusal = sdb_hs_feed returns SDB_HS_FAILED with h->error set; the
 * caller closes the connection.
 */
#ifndef SDB_RAFT_HANDSHAKE_H
#define SDB_RAFT_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SDB_HS_MAGIC "SDBRAFT\x01"
#define SDB_HS_HELLO_LEN 48
#define SDB_HS_PROOF_LEN 32
#define SDB_HS_KEY_LEN 32
#define SDB_HS_KEYS_MAX 8 /* keys a server accepts at once (rotation) */
#define SDB_HS_NONCE_LEN 32
#define SDB_HS_PREAMBLE_HDR 24
#define SDB_HS_ADDR_MAX 1024 /* bytes, padded address of the preamble */
#define SDB_HS_OUT_MAX SDB_HS_PROOF_LEN /* most bytes one feed asks the caller to send */

enum { SDB_HS_MORE = 0, SDB_HS_DONE = 1, SDB_HS_FAILED = -1 };

typedef struct sdb_hs {
	bool server;
	bool has_key;
	int state; /* internal step */
	uint8_t key[SDB_HS_KEYS_MAX][SDB_HS_KEY_LEN]; /* key[0]: the client's; server: any */
	size_t nkeys;
	size_t key_used; /* server: the key that matched the client's proof */
	uint8_t nonce_self[SDB_HS_NONCE_LEN];
	uint8_t nonce_peer[SDB_HS_NONCE_LEN];
	uint8_t binding[32];
	uint8_t buf[SDB_HS_ADDR_MAX]; /* the step being read */
	size_t have, need;
	uint64_t peer_id;                    /* server: from the preamble */
	char peer_addr[SDB_HS_ADDR_MAX + 1]; /* server: from the preamble, NUL-terminated */
	const char *error;                   /* static text after SDB_HS_FAILED */
} sdb_hs;

/* Start a handshake. key: SDB_HS_KEY_LEN bytes, or NULL for none (TLS alone). nonce:
 * SDB_HS_NONCE_LEN random bytes. binding: 32 bytes or NULL (zeros); may be set later
 * with sdb_hs_set_binding, before the peer's hello is fed. */
void sdb_hs_init(sdb_hs *h, bool server, const uint8_t *key, const uint8_t *nonce);

/* The same with nkeys keys (keys[0] first; nkeys 0 = none; more than SDB_HS_KEYS_MAX are
 * ignored): a client proves with keys[0], a server accepts a proof made with any of them
 * (h->key_used tells which once done). */
void sdb_hs_init_keys(sdb_hs *h, bool server, const uint8_t (*keys)[SDB_HS_KEY_LEN],
		      size_t nkeys, const uint8_t *nonce);
void sdb_hs_set_binding(sdb_hs *h, const uint8_t binding[32]);

/* Start libraft's bare plaintext handshake (the transport's plaintext mode, wire-compatible
 * with libraft's own TCP transport): no hello, no proof. A server reads the connector's
 * preamble only (checked as above: protocol 1, id > 0, padded address length within
 * 8..SDB_HS_ADDR_MAX, NUL-terminated address); a client is done at once (it sends the
 * preamble). Never send a hello after this. */
void sdb_hs_init_plain(sdb_hs *h, bool server);

/* Write this side's hello (SDB_HS_HELLO_LEN bytes) into out; send it first. */
void sdb_hs_hello(const sdb_hs *h, uint8_t out[SDB_HS_HELLO_LEN]);

/* Bytes the current step still needs (> 0 while SDB_HS_MORE): a reader that must not
 * consume bytes past the handshake reads at most this many. 0 when done or failed. */
size_t sdb_hs_need(const sdb_hs *h);

/* Feed up to len received bytes. *consumed: bytes used (the rest belong to what follows
 * the handshake: Raft messages); out (SDB_HS_OUT_MAX bytes) receives bytes to send,
 * *outlen their count (0 if none). Returns: SDB_HS_MORE, SDB_HS_DONE (client: now send
 * the preamble; server: peer_id and peer_addr are set) or SDB_HS_FAILED (the reason in
 * h->error); a handshake state, not an SDB_E* status. */
int sdb_hs_feed(sdb_hs *h, const uint8_t *in, size_t len, size_t *consumed, uint8_t *out,
		size_t *outlen);

/* Encode libraft's TCP preamble for (id, address) into out (outmax bytes). Returns the
 * length, or 0 when the address is empty or too long. */
size_t sdb_hs_preamble(uint64_t id, const char *address, uint8_t *out, size_t outmax);

#endif
