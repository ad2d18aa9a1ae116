/* libFuzzer target for the Raft transport's handshake decoder (raft/handshake.c): what a
 * peer sends before any Raft message reaches libraft (hello, key proof, libraft's
 * preamble with its address length), all untrusted.
 *
 * Input: byte 0 picks the side (bit 0: acceptor, else connector), whether this member
 * has a cluster key (bit 1) and, with a key, two keys of a rotation (bit 2; an acceptor
 * then checks the proof against both); the rest is what the peer sends. It is fed twice: at once,
 * and split at the points given by byte 1 (chunked reads), which must give the same
 * outcome. Invariants (abort): a member with a key never completes (the fuzzer does not
 * know the key: completing would be a forged proof); a completed acceptor has a peer id
 * > 0 and a NUL-terminated address shorter than SDB_HS_ADDR_MAX; need() never exceeds the
 * step buffer; consumed never exceeds the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "raft/handshake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run(bool server, bool key, bool two, const uint8_t *in, size_t len, size_t chunk,
	       sdb_hs *h)
{
	static const uint8_t k[2][SDB_HS_KEY_LEN] = {"fuzz-key-not-guessable-01234567",
						     "fuzz-key-two-not-guessable-0123"};
	static const uint8_t nonce[SDB_HS_NONCE_LEN] = "fixed-nonce-of-this-member-0123";
	int rc = SDB_HS_MORE;
	sdb_hs_init_keys(h, server, k, key ? (two ? 2 : 1) : 0, nonce);
	while (len > 0 && rc == SDB_HS_MORE) {
		uint8_t out[SDB_HS_OUT_MAX];
		size_t used = 0, outlen = 0, n = len < chunk ? len : chunk;
		if (sdb_hs_need(h) > sizeof h->buf)
			abort();
		rc = sdb_hs_feed(h, in, n, &used, out, &outlen);
		if (used > n || outlen > SDB_HS_OUT_MAX)
			abort();
		if (rc == SDB_HS_MORE && used == 0 && outlen == 0)
			abort(); /* no progress */
		in += used;
		len -= used;
	}
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static sdb_hs a, b;
	bool server, key;
	size_t chunk;
	int ra, rb;
	if (size < 2)
		return 0;
	server = data[0] & 1;
	key = data[0] & 2;
	chunk = (size_t)data[1] % 64 + 1;
	ra = run(server, key, data[0] & 4, data + 2, size - 2, size, &a);
	rb = run(server, key, data[0] & 4, data + 2, size - 2, chunk, &b);
	if (ra != rb)
		abort();
	if (ra == SDB_HS_DONE) {
		if (key)
			abort();
		if (server && (a.peer_id == 0 || strlen(a.peer_addr) >= SDB_HS_ADDR_MAX ||
			       a.peer_id != b.peer_id || strcmp(a.peer_addr, b.peer_addr) != 0))
			abort();
	}
	if (ra == SDB_HS_FAILED && !a.error)
		abort();
	return 0;
}
