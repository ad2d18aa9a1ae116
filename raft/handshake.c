/* The Raft transport's connection handshake codec. Contract in raft/handshake.h. */
#include "raft/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

enum { ST_HELLO, ST_PROOF, ST_PRE_HDR, ST_PRE_ADDR, ST_DONE, ST_FAILED };

#define PROOF_LABEL "stripedb raft proof v1"

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

void sdb_hs_init_keys(sdb_hs *h, bool server, const uint8_t (*keys)[SDB_HS_KEY_LEN],
		      size_t nkeys, const uint8_t *nonce)
{
	memset(h, 0, sizeof *h);
	h->server = server;
	if (nkeys > SDB_HS_KEYS_MAX)
		nkeys = SDB_HS_KEYS_MAX;
	if (!server && nkeys > 1)
		nkeys = 1; /* outgoing: the first key only */
	h->has_key = nkeys > 0;
	h->nkeys = nkeys;
	if (nkeys)
		memcpy(h->key, keys, nkeys * SDB_HS_KEY_LEN);
	memcpy(h->nonce_self, nonce, SDB_HS_NONCE_LEN);
	h->state = ST_HELLO;
	h->need = SDB_HS_HELLO_LEN;
}

void sdb_hs_init(sdb_hs *h, bool server, const uint8_t *key, const uint8_t *nonce)
{
	sdb_hs_init_keys(h, server, (const uint8_t(*)[SDB_HS_KEY_LEN])key, key ? 1 : 0, nonce);
}

void sdb_hs_init_plain(sdb_hs *h, bool server)
{
	memset(h, 0, sizeof *h);
	h->server = server;
	h->state = server ? ST_PRE_HDR : ST_DONE;
	h->need = server ? SDB_HS_PREAMBLE_HDR : 0;
}

void sdb_hs_set_binding(sdb_hs *h, const uint8_t binding[32])
{
	memcpy(h->binding, binding, sizeof h->binding);
}

void sdb_hs_hello(const sdb_hs *h, uint8_t out[SDB_HS_HELLO_LEN])
{
	memset(out, 0, SDB_HS_HELLO_LEN);
	memcpy(out, SDB_HS_MAGIC, 8);
	out[8] = h->has_key ? 1 : 0;
	memcpy(out + 16, h->nonce_self, SDB_HS_NONCE_LEN);
}

size_t sdb_hs_need(const sdb_hs *h)
{
	if (h->state == ST_DONE || h->state == ST_FAILED)
		return 0;
	return h->need - h->have;
}

/* The proof of the side with role 'C' or 'S' made with key k over both nonces and the
 * binding. */
static void proof(const sdb_hs *h, size_t k, char role, uint8_t out[SDB_HS_PROOF_LEN])
{
	uint8_t msg[sizeof PROOF_LABEL - 1 + 1 + 2 * SDB_HS_NONCE_LEN + 32];
	const uint8_t *cn = h->server ? h->nonce_peer : h->nonce_self;
	const uint8_t *sn = h->server ? h->nonce_self : h->nonce_peer;
	unsigned int len = 0;
	size_t o = 0;
	memcpy(msg, PROOF_LABEL, sizeof PROOF_LABEL - 1);
	o += sizeof PROOF_LABEL - 1;
	msg[o++] = (uint8_t)role;
	memcpy(msg + o, cn, SDB_HS_NONCE_LEN);
	o += SDB_HS_NONCE_LEN;
	memcpy(msg + o, sn, SDB_HS_NONCE_LEN);
	o += SDB_HS_NONCE_LEN;
	memcpy(msg + o, h->binding, 32);
	o += 32;
	HMAC(EVP_sha256(), h->key[k], SDB_HS_KEY_LEN, msg, o, out, &len);
}

static int fail(sdb_hs *h, const char *why)
{
	h->state = ST_FAILED;
	h->error = why;
	OPENSSL_cleanse(h->key, sizeof h->key);
	return SDB_HS_FAILED;
}

static void step(sdb_hs *h, int state, size_t need)
{
	h->state = state;
	h->need = need;
	h->have = 0;
}

/* A step's bytes are complete in h->buf: act on them. */
static int complete(sdb_hs *h, uint8_t *out, size_t *outlen)
{
	switch (h->state) {
	case ST_HELLO: {
		bool peer_key;
		if (memcmp(h->buf, SDB_HS_MAGIC, 8) != 0)
			return fail(h, "not a stripedb raft peer (bad magic or version)");
		if (h->buf[8] > 1)
			return fail(h, "unknown handshake flags");
		peer_key = h->buf[8] == 1;
		if (peer_key != h->has_key)
			return fail(h, h->has_key ? "peer does not prove the cluster key"
						  : "peer uses a cluster key, this member has none");
		memcpy(h->nonce_peer, h->buf + 16, SDB_HS_NONCE_LEN);
		if (memcmp(h->nonce_peer, h->nonce_self, SDB_HS_NONCE_LEN) == 0)
			return fail(h, "peer echoed our nonce");
		if (h->has_key) {
			/* the client proves first; the server answers once it knows the key */
			if (!h->server) {
				proof(h, 0, 'C', out);
				*outlen = SDB_HS_PROOF_LEN;
			}
			step(h, ST_PROOF, SDB_HS_PROOF_LEN);
			return SDB_HS_MORE;
		}
		break;
	}
	case ST_PROOF: {
		uint8_t want[SDB_HS_PROOF_LEN];
		size_t n = h->server ? h->nkeys : 1, match = n;
		for (size_t k = 0; k < n; k++) { /* every key, no early exit */
			proof(h, k, h->server ? 'C' : 'S', want);
			if (CRYPTO_memcmp(want, h->buf, SDB_HS_PROOF_LEN) == 0 && match == n)
				match = k;
		}
		OPENSSL_cleanse(want, sizeof want);
		if (match == n)
			return fail(h, "wrong cluster key proof");
		if (h->server) {
			h->key_used = match;
			proof(h, match, 'S', out);
			*outlen = SDB_HS_PROOF_LEN;
			step(h, ST_PRE_HDR, SDB_HS_PREAMBLE_HDR);
			return SDB_HS_MORE;
		}
		break;
	}
	case ST_PRE_HDR: {
		uint64_t proto = get64(h->buf), id = get64(h->buf + 8), alen = get64(h->buf + 16);
		if (proto != 1)
			return fail(h, "unknown raft transport protocol");
		if (id == 0)
			return fail(h, "raft server id 0");
		if (alen == 0 || alen > SDB_HS_ADDR_MAX || alen % 8 != 0)
			return fail(h, "raft address length out of range");
		h->peer_id = id;
		step(h, ST_PRE_ADDR, (size_t)alen);
		return SDB_HS_MORE;
	}
	case ST_PRE_ADDR:
		if (!memchr(h->buf, '\0', h->need) || h->buf[0] == '\0')
			return fail(h, "raft address not terminated");
		memcpy(h->peer_addr, h->buf, h->need);
		h->peer_addr[h->need] = '\0';
		step(h, ST_DONE, 0);
		OPENSSL_cleanse(h->key, sizeof h->key);
		return SDB_HS_DONE;
	default:
		return fail(h, "handshake already over");
	}
	/* hello without key, or a verified proof */
	if (h->server) {
		step(h, ST_PRE_HDR, SDB_HS_PREAMBLE_HDR);
		return SDB_HS_MORE;
	}
	step(h, ST_DONE, 0);
	OPENSSL_cleanse(h->key, sizeof h->key);
	return SDB_HS_DONE;
}

int sdb_hs_feed(sdb_hs *h, const uint8_t *in, size_t len, size_t *consumed, uint8_t *out,
		size_t *outlen)
{
	size_t used = 0;
	*outlen = 0;
	*consumed = 0;
	if (h->state == ST_FAILED)
		return SDB_HS_FAILED;
	if (h->state == ST_DONE)
		return SDB_HS_DONE;
	while (used < len) {
		size_t n = h->need - h->have;
		int rc;
		if (n > len - used)
			n = len - used;
		memcpy(h->buf + h->have, in + used, n);
		h->have += n;
		used += n;
		*consumed = used;
		if (h->have < h->need)
			return SDB_HS_MORE;
		rc = complete(h, out, outlen);
		if (rc != SDB_HS_MORE || *outlen > 0)
			return rc; /* done, failed, or bytes to send before reading on */
	}
	return SDB_HS_MORE;
}

size_t sdb_hs_preamble(uint64_t id, const char *address, uint8_t *out, size_t outmax)
{
	size_t alen = strlen(address), padded = (alen + 1 + 7) & ~(size_t)7;
	if (alen == 0 || padded > SDB_HS_ADDR_MAX || SDB_HS_PREAMBLE_HDR + padded > outmax)
		return 0;
	memset(out, 0, SDB_HS_PREAMBLE_HDR + padded);
	put64(out, 1);
	put64(out + 8, id);
	put64(out + 16, padded);
	memcpy(out + SDB_HS_PREAMBLE_HDR, address, alen);
	return SDB_HS_PREAMBLE_HDR + padded;
}
