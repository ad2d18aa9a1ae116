/* libFuzzer target for the SCRAM conversation parser (src/auth/scram.c).
 *
 * Input: byte 0 picks the mechanism (odd: SCRAM-SHA-1, even: SCRAM-SHA-256); the rest is
 * client-first, a 0x00 byte, then client-final (both untrusted, as in saslStart /
 * saslContinue payloads). The server side runs with a fixed verifier and server nonce.
 * Invariants (abort): the state machine only moves forward; a parsed client-first yields a
 * non-empty user; a client-final is never accepted, as the fuzzer does not know the
 * password (accepting one would be a forged proof); base64 round-trips. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/scram.h"
#include "common/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static auth_scram_creds creds[3];
static int ready;

static void init(void)
{
	static const uint8_t salt[28] = "fuzz-salt-0123456789abcdefgh";
	char err[256];
	if (auth_scram_verifier(AUTH_SCRAM_SHA1, "user", "not-guessable-9f2c", salt, 16, 4096,
				&creds[AUTH_SCRAM_SHA1], err, sizeof err) ||
	    auth_scram_verifier(AUTH_SCRAM_SHA256, "user", "not-guessable-9f2c", salt, 28, 4096,
				&creds[AUTH_SCRAM_SHA256], err, sizeof err))
		abort();
	ready = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t snonce[24] = "fixed-server-nonce-24byt";
	auth_mech mech;
	auth_scram s;
	char out[AUTH_SCRAM_MAX_MSG + 1], err[256];
	const uint8_t *sep;
	size_t first_len;
	int rc;

	if (!ready)
		init();
	if (size < 1)
		return 0;
	mech = (data[0] & 1) ? AUTH_SCRAM_SHA1 : AUTH_SCRAM_SHA256;
	data++;
	size--;

	/* base64: whatever decodes re-encodes to the same text */
	{
		uint8_t bin[AUTH_SCRAM_MAX_MSG];
		char txt[2 * AUTH_SCRAM_MAX_MSG + 8];
		size_t n = size < 256 ? size : 256;
		int bl = auth_b64_decode((const char *)data, n, bin, sizeof bin);
		if (bl >= 0) {
			int tl = auth_b64_encode(bin, (size_t)bl, txt, sizeof txt);
			if (tl != (int)n || memcmp(txt, data, n) != 0)
				abort();
		}
	}

	sep = memchr(data, 0, size);
	first_len = sep ? (size_t)(sep - data) : size;
	auth_scram_init(&s, mech);
	rc = auth_scram_client_first(&s, data, first_len, err, sizeof err);
	if (rc != 0) {
		if (s.state != AUTH_SCRAM_FAILED)
			abort();
		return 0;
	}
	if (s.state != AUTH_SCRAM_FIRST_SEEN || s.user[0] == '\0' || strlen(s.gs2) != 3)
		abort();
	if (auth_scram_server_first(&s, &creds[mech], snonce, sizeof snonce, out, sizeof out, err,
				    sizeof err) != 0) {
		if (s.state != AUTH_SCRAM_FAILED)
			abort();
		return 0;
	}
	if (s.state != AUTH_SCRAM_SENT_FIRST || strncmp(out, "r=", 2) != 0)
		abort();
	if (!sep)
		return 0;
	rc = auth_scram_client_final(&s, sep + 1, size - first_len - 1, out, sizeof out, err,
				     sizeof err);
	if (rc == 0 || s.state != AUTH_SCRAM_FAILED)
		abort(); /* a proof was accepted without the password */
	if (rc != SDB_EPROTO && rc != SDB_EAUTH)
		abort();
	/* no second step after a failure */
	if (auth_scram_client_final(&s, sep + 1, size - first_len - 1, out, sizeof out, err,
				    sizeof err) == 0)
		abort();
	return 0;
}
