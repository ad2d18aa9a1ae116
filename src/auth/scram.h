/* Server side of SCRAM (RFC 5802) as MongoDB drivers speak it: SCRAM-SHA-256 (RFC 7677)
 * and SCRAM-SHA-1 (with MongoDB's password digest, see below), carried in saslStart /
 * saslContinue payloads and in hello's speculativeAuthenticate. This module is the pure
 * conversation (no I/O, no clock): auth/gate.c feeds it the payloads and the user's stored
 * verifier from the metadata service.
 *
 * Messages (RFC 5802 §7):
 *   client-first  "n,,n=USER,r=CNONCE"     (gs2 header "n,," or "y,,"; channel binding
 *                                           "p=" and an authzid "a=" are refused)
 *   server-first  "r=CNONCE SNONCE,s=BASE64(SALT),i=ITERATIONS"
 *   client-final  "c=BASE64(GS2HEADER),r=NONCE,p=BASE64(PROOF)"
 *   server-final  "v=BASE64(SERVERSIGNATURE)"
 * Verification: ClientSignature = HMAC(StoredKey, AuthMessage), ClientKey = Proof XOR
 * ClientSignature, accepted iff H(ClientKey) == StoredKey (constant-time compare);
 * ServerSignature = HMAC(ServerKey, AuthMessage). Primitives from OpenSSL.
 * SCRAM-SHA-1 in MongoDB hashes HEX(MD5(USER ":mongo:" PASSWORD)) instead of the password
 * (auth_scram_verifier does that for SHA-1). SASLprep is not applied: ASCII passwords.
 */
#ifndef SDB_AUTH_SCRAM_H
#define SDB_AUTH_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { AUTH_SCRAM_SHA1 = 1, AUTH_SCRAM_SHA256 = 2 } auth_mech;

#define AUTH_SCRAM_MAX_KEY 32      /* bytes: SHA-256 digest; SHA-1 uses 20 */
#define AUTH_SCRAM_MAX_SALT 64     /* bytes */
#define AUTH_SCRAM_MAX_USER 128    /* bytes of a user name, after =2C/=3D unescaping */
#define AUTH_SCRAM_MAX_MSG 1024    /* bytes: longest client message accepted */
#define AUTH_SCRAM_MIN_ITERATIONS 4096

/* A stored verifier (RFC 5802 §3): never the password. */
typedef struct auth_scram_creds {
	auth_mech mech;
	uint8_t salt[AUTH_SCRAM_MAX_SALT];
	size_t salt_len;
	int iterations;
	uint8_t stored_key[AUTH_SCRAM_MAX_KEY];
	uint8_t server_key[AUTH_SCRAM_MAX_KEY];
} auth_scram_creds;

/* One conversation. Plain data (no heap); zero it with auth_scram_init before use. */
typedef enum {
	AUTH_SCRAM_START = 0,   /* waiting for client-first */
	AUTH_SCRAM_FIRST_SEEN,  /* client-first parsed; waiting for the verifier */
	AUTH_SCRAM_SENT_FIRST,  /* server-first sent; waiting for client-final */
	AUTH_SCRAM_DONE,        /* client proved the password; server-final sent */
	AUTH_SCRAM_FAILED,
} auth_scram_state;

typedef struct auth_scram {
	auth_mech mech;
	auth_scram_state state;
	char user[AUTH_SCRAM_MAX_USER + 1];
	char gs2[8];                               /* "n,," or "y,," */
	char client_first_bare[AUTH_SCRAM_MAX_MSG + 1];
	char server_first[AUTH_SCRAM_MAX_MSG + 1];
	char nonce[AUTH_SCRAM_MAX_MSG + 1];        /* client nonce + server nonce */
	auth_scram_creds creds;
} auth_scram;

/* Digest length of mech in bytes (20 or 32). */
size_t auth_scram_key_len(auth_mech mech);

/* Mechanism from its SASL name ("SCRAM-SHA-256", "SCRAM-SHA-1"); 0 when unknown. */
auth_mech auth_scram_mech_parse(const char *name);
const char *auth_scram_mech_name(auth_mech mech);

void auth_scram_init(auth_scram *s, auth_mech mech);

/* Parse client-first (payload, len bytes, not NUL-terminated; untrusted). On success
 * state becomes FIRST_SEEN and s->user holds the unescaped user name. Errors: SDB_EPROTO
 * (wrong state, malformed, too long, channel binding asked, authzid given) with a
 * message; state becomes FAILED. */
int auth_scram_client_first(auth_scram *s, const uint8_t *payload, size_t len, char *err,
			    size_t errlen);

/* Build server-first for the user's verifier (copied into s). snonce: the server nonce
 * bytes (random, from the caller so tests can fix it), snonce_len >= 16. Writes a
 * NUL-terminated message into out (outlen bytes; AUTH_SCRAM_MAX_MSG + 1 is enough) and
 * returns 0. Errors: SDB_EINVAL when called in the wrong state, creds' mechanism differs
 * or the message does not fit (state FAILED). */
int auth_scram_server_first(auth_scram *s, const auth_scram_creds *creds, const uint8_t *snonce,
			    size_t snonce_len, char *out, size_t outlen, char *err, size_t errlen);

/* Check client-final (untrusted). On a valid proof state becomes DONE, server-final is
 * written into out (NUL-terminated) and 0 is returned. Errors: SDB_EPROTO (wrong state,
 * malformed, wrong channel binding or nonce, out too small) or SDB_EAUTH (wrong proof:
 * wrong password), with state FAILED. */
int auth_scram_client_final(auth_scram *s, const uint8_t *payload, size_t len, char *out,
			    size_t outlen, char *err, size_t errlen);

/* Compute a verifier from a password (for ctl and tests): salt (salt_len bytes, 16..64)
 * and iterations >= 4096; for SHA-1, user is needed (MongoDB's MD5 digest). Errors:
 * SDB_EINVAL (bad salt length, iterations or user) / SDB_EINTERNAL (OpenSSL failure). */
int auth_scram_verifier(auth_mech mech, const char *user, const char *password,
			const uint8_t *salt, size_t salt_len, int iterations,
			auth_scram_creds *out, char *err, size_t errlen);

/* MongoDB's SCRAM-SHA-1 password (auth spec, "SCRAM-SHA-1"): HEX(MD5(user ":mongo:"
 * password)), 32 lowercase hex digits, written NUL-terminated into out (33 bytes).
 * Errors: SDB_EINTERNAL (OpenSSL failure; no message: it takes no err). */
int auth_scram_mongo_digest(const char *user, const char *password, char out[33]);

/* RFC 5802 §3 verifier from the SCRAM password as is (no MongoDB digest): what
 * auth_scram_verifier computes after the digest; exposed for the RFC test vectors, whose
 * salts are shorter (salt_len 1..64 here). Otherwise the arguments of
 * auth_scram_verifier. Errors: SDB_EINVAL, SDB_EINTERNAL, as auth_scram_verifier. */
int auth_scram_verifier_raw(auth_mech mech, const char *scram_password, const uint8_t *salt,
			    size_t salt_len, int iterations, auth_scram_creds *out, char *err,
			    size_t errlen);

/* Bytes of a server-final ("v=" and a base64 SHA-256 signature) with its NUL. */
#define AUTH_SCRAM_SERVER_FINAL_MAX 64

/* Client side (RFC 5802 §3, §5): client-final for server_first in a conversation whose
 * client-first-bare was client_first_bare ("n=USER,r=CNONCE", user already escaped),
 * written NUL-terminated into out (outlen bytes; AUTH_SCRAM_MAX_MSG + 1 is enough), and
 * the server-final the server must answer ("v=BASE64(ServerSignature)") into
 * server_final, for the caller to compare (constant time) before it trusts the server.
 * For SHA-1, password is digested as MongoDB's (auth_scram_mongo_digest). Checks that the
 * server's nonce extends the client's and that salt and iterations (4096 .. 10^7) are
 * sane. Key material is cleansed before returning. Errors: SDB_EPROTO (bad server-first,
 * nonce, salt or iterations), SDB_EINVAL (out too small, unknown mechanism),
 * SDB_EINTERNAL (OpenSSL). Used by auth_cluster_authenticate (internal clients). */
int auth_scram_client_final_ex(auth_mech mech, const char *user, const char *password,
			       const char *client_first_bare, const char *server_first, char *out,
			       size_t outlen, char server_final[AUTH_SCRAM_SERVER_FINAL_MAX],
			       char *err, size_t errlen);

/* auth_scram_client_final_ex without the server's expected answer (tests and fuzzing).
 * Errors: as auth_scram_client_final_ex. */
int auth_scram_client_final_make(auth_mech mech, const char *user, const char *password,
				 const char *client_first_bare, const char *server_first,
				 char *out, size_t outlen, char *err, size_t errlen);

/* Base64 (RFC 4648, with padding). Returns: (encode) the length written (NUL-terminated)
 * or -1 when out is too small; (decode, strict: rejects bad characters and lengths) the
 * byte count or -1. Not SDB_E* statuses. */
int auth_b64_encode(const uint8_t *in, size_t len, char *out, size_t outlen);
int auth_b64_decode(const char *in, size_t len, uint8_t *out, size_t outlen);

#endif
