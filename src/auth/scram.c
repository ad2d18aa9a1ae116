/* SCRAM server conversation (RFC 5802, RFC 7677). See auth/scram.h. */
#include "auth/scram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/md5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static const EVP_MD *mech_md(auth_mech mech)
{
	return mech == AUTH_SCRAM_SHA1 ? EVP_sha1() : EVP_sha256();
}

size_t auth_scram_key_len(auth_mech mech)
{
	return mech == AUTH_SCRAM_SHA1 ? 20 : 32;
}

auth_mech auth_scram_mech_parse(const char *name)
{
	if (name && strcmp(name, "SCRAM-SHA-256") == 0)
		return AUTH_SCRAM_SHA256;
	if (name && strcmp(name, "SCRAM-SHA-1") == 0)
		return AUTH_SCRAM_SHA1;
	return 0;
}

const char *auth_scram_mech_name(auth_mech mech)
{
	return mech == AUTH_SCRAM_SHA1 ? "SCRAM-SHA-1" : "SCRAM-SHA-256";
}

void auth_scram_init(auth_scram *s, auth_mech mech)
{
	memset(s, 0, sizeof *s);
	s->mech = mech;
	s->state = AUTH_SCRAM_START;
}

/* ------------------------------------------------------------ base64 */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int auth_b64_encode(const uint8_t *in, size_t len, char *out, size_t outlen)
{
	size_t need = 4 * ((len + 2) / 3) + 1, i, o = 0;
	if (outlen < need)
		return -1;
	for (i = 0; i + 2 < len; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
		out[o++] = b64[v >> 18];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = b64[(v >> 6) & 63];
		out[o++] = b64[v & 63];
	}
	if (i < len) {
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
		out[o++] = b64[v >> 18];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
	return (int)o;
}

static int b64_val(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

int auth_b64_decode(const char *in, size_t len, uint8_t *out, size_t outlen)
{
	size_t i, o = 0;
	if (len % 4 != 0)
		return -1;
	for (i = 0; i < len; i += 4) {
		int v[4], pad = 0, k;
		for (k = 0; k < 4; k++) {
			if (in[i + k] == '=' && i + 4 == len && k >= 2) {
				v[k] = 0;
				pad++;
				continue;
			}
			if (pad) /* "=" then a character */
				return -1;
			v[k] = b64_val(in[i + k]);
			if (v[k] < 0)
				return -1;
		}
		/* canonical only (RFC 4648 §3.5): the bits padding drops must be zero */
		if ((pad == 1 && (v[2] & 3)) || (pad == 2 && (v[1] & 15)))
			return -1;
		uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
			     (uint32_t)v[3];
		if (o + (size_t)(3 - pad) > outlen)
			return -1;
		out[o++] = (uint8_t)(w >> 16);
		if (pad < 2)
			out[o++] = (uint8_t)(w >> 8);
		if (pad < 1)
			out[o++] = (uint8_t)w;
	}
	return (int)o;
}

/* ------------------------------------------------------------ primitives */

static int hmac(auth_mech mech, const uint8_t *key, size_t klen, const void *data, size_t dlen,
		uint8_t *out)
{
	unsigned int len = 0;
	return HMAC(mech_md(mech), key, (int)klen, data, dlen, out, &len) ? 0 : -1;
}

static int hash(auth_mech mech, const uint8_t *data, size_t len, uint8_t *out)
{
	unsigned int olen = 0;
	return EVP_Digest(data, len, out, &olen, mech_md(mech), NULL) == 1 ? 0 : -1;
}

int auth_scram_mongo_digest(const char *user, const char *password, char out[33])
{
	uint8_t md[MD5_DIGEST_LENGTH];
	unsigned int mdlen = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1 &&
		 EVP_DigestUpdate(ctx, user, strlen(user)) == 1 &&
		 EVP_DigestUpdate(ctx, ":mongo:", 7) == 1 &&
		 EVP_DigestUpdate(ctx, password, strlen(password)) == 1 &&
		 EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == MD5_DIGEST_LENGTH;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return SDB_EINTERNAL;
	for (unsigned i = 0; i < MD5_DIGEST_LENGTH; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	OPENSSL_cleanse(md, sizeof md);
	return 0;
}

int auth_scram_verifier_raw(auth_mech mech, const char *pw, const uint8_t *salt,
			    size_t salt_len, int iterations, auth_scram_creds *out, char *err,
			    size_t errlen)
{
	uint8_t salted[AUTH_SCRAM_MAX_KEY], ckey[AUTH_SCRAM_MAX_KEY];
	size_t kl = auth_scram_key_len(mech);
	int rc = 0;

	if ((mech != AUTH_SCRAM_SHA1 && mech != AUTH_SCRAM_SHA256) || !pw || !salt ||
	    salt_len < 1 || salt_len > AUTH_SCRAM_MAX_SALT ||
	    iterations < AUTH_SCRAM_MIN_ITERATIONS)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"scram verifier: bad mechanism, salt (1..64 bytes) or iterations");
	memset(out, 0, sizeof *out);
	out->mech = mech;
	memcpy(out->salt, salt, salt_len);
	out->salt_len = salt_len;
	out->iterations = iterations;
	if (PKCS5_PBKDF2_HMAC(pw, (int)strlen(pw), salt, (int)salt_len, iterations, mech_md(mech),
			      (int)kl, salted) != 1 ||
	    hmac(mech, salted, kl, "Client Key", 10, ckey) != 0 ||
	    hmac(mech, salted, kl, "Server Key", 10, out->server_key) != 0 ||
	    hash(mech, ckey, kl, out->stored_key) != 0)
		rc = sdb_errf(err, errlen, SDB_EINTERNAL, "scram verifier: OpenSSL failed");
	OPENSSL_cleanse(salted, sizeof salted);
	OPENSSL_cleanse(ckey, sizeof ckey);
	return rc;
}

int auth_scram_verifier(auth_mech mech, const char *user, const char *password,
			const uint8_t *salt, size_t salt_len, int iterations,
			auth_scram_creds *out, char *err, size_t errlen)
{
	char digest[2 * MD5_DIGEST_LENGTH + 1];
	int rc;

	if (!password || (mech == AUTH_SCRAM_SHA1 && !user) || salt_len < 16)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"scram verifier: a password (for SCRAM-SHA-1 a user) and a salt of "
				"16..64 bytes are needed");
	if (mech != AUTH_SCRAM_SHA1)
		return auth_scram_verifier_raw(mech, password, salt, salt_len, iterations, out,
					       err, errlen);
	/* MongoDB: SCRAM-SHA-1 hashes HEX(MD5(user ":mongo:" password)) */
	if (auth_scram_mongo_digest(user, password, digest) != 0)
		return sdb_errf(err, errlen, SDB_EINTERNAL, "scram verifier: MD5 failed");
	rc = auth_scram_verifier_raw(mech, digest, salt, salt_len, iterations, out, err, errlen);
	OPENSSL_cleanse(digest, sizeof digest);
	return rc;
}

/* ------------------------------------------------------------ conversation */

static int fail(auth_scram *s, char *err, size_t errlen, int rc, const char *msg)
{
	s->state = AUTH_SCRAM_FAILED;
	return sdb_errf(err, errlen, rc, "%s", msg);
}

/* A printable nonce: %x21-7E except ',' (RFC 5802 §7 "printable"). */
static bool nonce_ok(const char *p, size_t n)
{
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if (p[i] < 0x21 || p[i] > 0x7e || p[i] == ',')
			return false;
	return true;
}

int auth_scram_client_first(auth_scram *s, const uint8_t *payload, size_t len, char *err,
			    size_t errlen)
{
	const char *p = (const char *)payload, *end, *bare, *c;
	size_t u = 0;

	if (s->state != AUTH_SCRAM_START)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: unexpected client-first");
	if (len == 0 || len > AUTH_SCRAM_MAX_MSG || memchr(payload, '\0', len))
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad client-first length");
	end = p + len;
	if (len < 3 || (p[0] != 'n' && p[0] != 'y') || p[1] != ',') {
		if (p[0] == 'p')
			return fail(s, err, errlen, SDB_EPROTO,
				    "SCRAM: channel binding is not supported");
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad gs2 header");
	}
	if (p[2] != ',')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: authzid is not supported");
	memcpy(s->gs2, p, 3);
	s->gs2[3] = '\0';
	bare = p + 3;
	if (end - bare < 2 || bare[0] != 'n' || bare[1] != '=')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: client-first needs n=USER");
	for (c = bare + 2; c < end && *c != ','; c++) {
		char ch = *c;
		if (ch == '=') {
			if (end - c >= 3 && c[1] == '2' && c[2] == 'C')
				ch = ',';
			else if (end - c >= 3 && c[1] == '3' && c[2] == 'D')
				ch = '=';
			else
				return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad user name escape");
			c += 2;
		}
		if (u >= AUTH_SCRAM_MAX_USER)
			return fail(s, err, errlen, SDB_EPROTO, "SCRAM: user name too long");
		s->user[u++] = ch;
	}
	s->user[u] = '\0';
	if (u == 0)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: empty user name");
	if (end - c < 3 || c[0] != ',' || c[1] != 'r' || c[2] != '=')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: client-first needs r=NONCE");
	c += 3;
	{
		const char *ne = memchr(c, ',', (size_t)(end - c));
		size_t nl = (size_t)((ne ? ne : end) - c);
		if (!nonce_ok(c, nl))
			return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad client nonce");
		memcpy(s->nonce, c, nl);
		s->nonce[nl] = '\0';
	}
	memcpy(s->client_first_bare, bare, (size_t)(end - bare));
	s->client_first_bare[end - bare] = '\0';
	s->state = AUTH_SCRAM_FIRST_SEEN;
	return 0;
}

int auth_scram_server_first(auth_scram *s, const auth_scram_creds *creds, const uint8_t *snonce,
			    size_t snonce_len, char *out, size_t outlen, char *err, size_t errlen)
{
	char nb[128], sb[128];
	int n;

	if (s->state != AUTH_SCRAM_FIRST_SEEN || creds->mech != s->mech || snonce_len < 16 ||
	    snonce_len > 64 || creds->salt_len == 0 || creds->salt_len > AUTH_SCRAM_MAX_SALT)
		return fail(s, err, errlen, SDB_EINVAL, "SCRAM: server-first in the wrong state");
	s->creds = *creds;
	if (auth_b64_encode(snonce, snonce_len, nb, sizeof nb) < 0 ||
	    auth_b64_encode(creds->salt, creds->salt_len, sb, sizeof sb) < 0 ||
	    strlen(s->nonce) + strlen(nb) >= sizeof s->nonce)
		return fail(s, err, errlen, SDB_EINVAL, "SCRAM: nonce too long");
	strcat(s->nonce, nb);
	n = snprintf(s->server_first, sizeof s->server_first, "r=%s,s=%s,i=%d", s->nonce, sb,
		     creds->iterations);
	if (n < 0 || (size_t)n >= sizeof s->server_first || (size_t)n >= outlen)
		return fail(s, err, errlen, SDB_EINVAL, "SCRAM: server-first too long");
	memcpy(out, s->server_first, (size_t)n + 1);
	s->state = AUTH_SCRAM_SENT_FIRST;
	return 0;
}

/* AuthMessage = client-first-bare "," server-first "," client-final-without-proof. */
static int auth_message(const auth_scram *s, const char *cfwp, size_t cfwp_len, char *am,
			size_t amlen)
{
	int n = snprintf(am, amlen, "%s,%s,%.*s", s->client_first_bare, s->server_first,
			 (int)cfwp_len, cfwp);
	return (n < 0 || (size_t)n >= amlen) ? -1 : n;
}

int auth_scram_client_final(auth_scram *s, const uint8_t *payload, size_t len, char *out,
			    size_t outlen, char *err, size_t errlen)
{
	const char *p = (const char *)payload, *end = p + len, *pp, *r, *re;
	char am[3 * AUTH_SCRAM_MAX_MSG + 8], gs2b[16];
	uint8_t proof[AUTH_SCRAM_MAX_KEY + 3], sig[AUTH_SCRAM_MAX_KEY], ckey[AUTH_SCRAM_MAX_KEY],
		stored[AUTH_SCRAM_MAX_KEY], ssig[AUTH_SCRAM_MAX_KEY];
	size_t kl = auth_scram_key_len(s->mech), cl;
	int amn, pl;

	if (s->state != AUTH_SCRAM_SENT_FIRST)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: unexpected client-final");
	if (len == 0 || len > AUTH_SCRAM_MAX_MSG || memchr(payload, '\0', len))
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad client-final length");
	/* c=BASE64(gs2 header) */
	if (auth_b64_encode((const uint8_t *)s->gs2, strlen(s->gs2), gs2b, sizeof gs2b) < 0)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: gs2 header");
	cl = strlen(gs2b);
	if (len < 2 + cl + 1 || memcmp(p, "c=", 2) != 0 || memcmp(p + 2, gs2b, cl) != 0 ||
	    p[2 + cl] != ',')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: channel binding mismatch");
	r = p + 2 + cl + 1;
	if (end - r < 2 || r[0] != 'r' || r[1] != '=')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: client-final needs r=NONCE");
	r += 2;
	re = memchr(r, ',', (size_t)(end - r));
	if (!re || (size_t)(re - r) != strlen(s->nonce) ||
	    CRYPTO_memcmp(r, s->nonce, (size_t)(re - r)) != 0)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: nonce mismatch");
	/* the proof is the last attribute */
	for (pp = end - 1; pp > re && *pp != ','; pp--)
		;
	if (end - pp < 3 || pp[1] != 'p' || pp[2] != '=')
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: client-final needs p=PROOF");
	pl = auth_b64_decode(pp + 3, (size_t)(end - pp - 3), proof, sizeof proof);
	if (pl != (int)kl)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: bad proof encoding");
	amn = auth_message(s, p, (size_t)(pp - p), am, sizeof am);
	if (amn < 0 || hmac(s->mech, s->creds.stored_key, kl, am, (size_t)amn, sig) != 0)
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: auth message");
	for (size_t i = 0; i < kl; i++)
		ckey[i] = proof[i] ^ sig[i];
	if (hash(s->mech, ckey, kl, stored) != 0 ||
	    CRYPTO_memcmp(stored, s->creds.stored_key, kl) != 0)
		return fail(s, err, errlen, SDB_EAUTH, "SCRAM: wrong proof");
	if (hmac(s->mech, s->creds.server_key, kl, am, (size_t)amn, ssig) != 0 || outlen < 3 ||
	    (memcpy(out, "v=", 2), auth_b64_encode(ssig, kl, out + 2, outlen - 2) < 0))
		return fail(s, err, errlen, SDB_EPROTO, "SCRAM: server signature");
	s->state = AUTH_SCRAM_DONE;
	return 0;
}

int auth_scram_client_final_ex(auth_mech mech, const char *user, const char *password,
			       const char *client_first_bare, const char *server_first, char *out,
			       size_t outlen, char server_final[AUTH_SCRAM_SERVER_FINAL_MAX],
			       char *err, size_t errlen)
{
	uint8_t salt[AUTH_SCRAM_MAX_SALT], salted[AUTH_SCRAM_MAX_KEY], ckey[AUTH_SCRAM_MAX_KEY],
		skey[AUTH_SCRAM_MAX_KEY], stored[AUTH_SCRAM_MAX_KEY], sig[AUTH_SCRAM_MAX_KEY],
		ssig[AUTH_SCRAM_MAX_KEY], proof[AUTH_SCRAM_MAX_KEY];
	char nonce[AUTH_SCRAM_MAX_MSG + 1], am[3 * AUTH_SCRAM_MAX_MSG + 8], pb[64], digest[33];
	const char *sp, *ip, *cn, *pw = password;
	int sl, n, rc = 0;
	long iters;
	size_t kl = auth_scram_key_len(mech);

	if (kl == 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "client: unknown mechanism");
	if (strlen(server_first) > AUTH_SCRAM_MAX_MSG ||
	    sscanf(server_first, "r=%1024[^,]", nonce) != 1 ||
	    !(sp = strstr(server_first, ",s=")) || !(ip = strstr(server_first, ",i=")) || ip < sp)
		return sdb_errf(err, errlen, SDB_EPROTO, "client: bad server-first");
	/* RFC 5802 §5.1: the server's nonce starts with the client's */
	cn = strstr(client_first_bare, ",r=");
	if (cn == NULL || strncmp(nonce, cn + 3, strlen(cn + 3)) != 0 ||
	    strlen(nonce) <= strlen(cn + 3))
		return sdb_errf(err, errlen, SDB_EPROTO, "client: server nonce does not extend ours");
	sl = auth_b64_decode(sp + 3, (size_t)(ip - sp - 3), salt, sizeof salt);
	iters = strtol(ip + 3, NULL, 10);
	if (sl < 1 || iters < AUTH_SCRAM_MIN_ITERATIONS || iters > 10000000)
		return sdb_errf(err, errlen, SDB_EPROTO, "client: bad salt or iterations");
	if (mech == AUTH_SCRAM_SHA1) {
		if (auth_scram_mongo_digest(user, password, digest) != 0)
			return sdb_errf(err, errlen, SDB_EINTERNAL, "client: MD5 failed");
		pw = digest;
	}
	n = snprintf(out, outlen, "c=biws,r=%s", nonce);
	if (n < 0 || (size_t)n >= outlen)
		return sdb_errf(err, errlen, SDB_EINVAL, "client: out too small");
	if (snprintf(am, sizeof am, "%s,%s,%s", client_first_bare, server_first, out) >=
	    (int)sizeof am)
		return sdb_errf(err, errlen, SDB_EINVAL, "client: too long");
	/* RFC 5802 §3: SaltedPassword, ClientKey, StoredKey, ClientProof, ServerSignature */
	if (PKCS5_PBKDF2_HMAC(pw, (int)strlen(pw), salt, sl, (int)iters, mech_md(mech), (int)kl,
			      salted) != 1 ||
	    hmac(mech, salted, kl, "Client Key", 10, ckey) != 0 ||
	    hmac(mech, salted, kl, "Server Key", 10, skey) != 0 ||
	    hash(mech, ckey, kl, stored) != 0 || hmac(mech, stored, kl, am, strlen(am), sig) != 0 ||
	    hmac(mech, skey, kl, am, strlen(am), ssig) != 0) {
		rc = sdb_errf(err, errlen, SDB_EINTERNAL, "client: OpenSSL failed");
		goto out;
	}
	for (size_t i = 0; i < kl; i++)
		proof[i] = ckey[i] ^ sig[i];
	if (auth_b64_encode(proof, kl, pb, sizeof pb) < 0 ||
	    (size_t)n + 3 + strlen(pb) >= outlen) {
		rc = sdb_errf(err, errlen, SDB_EINVAL, "client: out too small");
		goto out;
	}
	strcat(out, ",p=");
	strcat(out, pb);
	memcpy(server_final, "v=", 2);
	if (auth_b64_encode(ssig, kl, server_final + 2, AUTH_SCRAM_SERVER_FINAL_MAX - 2) < 0)
		rc = sdb_errf(err, errlen, SDB_EINTERNAL, "client: server signature");
out:
	OPENSSL_cleanse(salted, sizeof salted);
	OPENSSL_cleanse(ckey, sizeof ckey);
	OPENSSL_cleanse(skey, sizeof skey);
	OPENSSL_cleanse(digest, sizeof digest);
	return rc;
}

int auth_scram_client_final_make(auth_mech mech, const char *user, const char *password,
				 const char *client_first_bare, const char *server_first,
				 char *out, size_t outlen, char *err, size_t errlen)
{
	char server_final[AUTH_SCRAM_SERVER_FINAL_MAX];

	return auth_scram_client_final_ex(mech, user, password, client_first_bare, server_first,
					  out, outlen, server_final, err, errlen);
}
