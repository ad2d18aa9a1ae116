/* Unit tests of src/auth/scram.c: RFC 7677 / MongoDB spec vectors, round trips, and
 * rejection of malformed or wrong client messages. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/auth/scram.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "auth/scram.h"
#include "common/err.h"

#define U8(s) ((const uint8_t *)(s))

/* Drive a conversation to SENT_FIRST with a fixed server-first (the spec's nonce is not
 * base64 of bytes, so it is set directly). */
static void start_with(auth_scram *s, auth_mech mech, const char *cf, const char *sfirst,
		       const char *full_nonce, const char *user, const char *pw)
{
	char err[256];
	uint8_t salt[64];
	const char *sp = strstr(sfirst, ",s="), *ip = strstr(sfirst, ",i=");
	int sl = auth_b64_decode(sp + 3, (size_t)(ip - sp - 3), salt, sizeof salt);
	auth_scram_creds c;

	assert_true(sl >= 16);
	assert_int_equal(auth_scram_verifier(mech, user, pw, salt, (size_t)sl, atoi(ip + 3), &c,
					     err, sizeof err),
			 0);
	auth_scram_init(s, mech);
	assert_int_equal(auth_scram_client_first(s, U8(cf), strlen(cf), err, sizeof err), 0);
	assert_string_equal(s->user, user);
	s->creds = c;
	strcpy(s->nonce, full_nonce);
	strcpy(s->server_first, sfirst);
	s->state = AUTH_SCRAM_SENT_FIRST;
}

static void test_rfc7677_vector(void **state)
{
	(void)state;
	auth_scram s;
	char out[512], err[256];
	const char *cfin = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
			   "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";

	start_with(&s, AUTH_SCRAM_SHA256, "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
		   "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
		   "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
		   "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0", "user", "pencil");
	assert_int_equal(auth_scram_client_final(&s, U8(cfin), strlen(cfin), out, sizeof out, err,
						 sizeof err),
			 0);
	assert_string_equal(out, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
	assert_int_equal(s.state, AUTH_SCRAM_DONE);
}

/* MongoDB's SCRAM-SHA-1 (auth spec): the password is HEX(MD5("user:mongo:pencil")). */
static void test_mongodb_sha1_vector(void **state)
{
	(void)state;
	auth_scram s;
	char out[512], err[256];
	const char *cfin = "c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,"
			   "p=MC2T8BvbmWRckDw8oWl5IVghwCY=";

	start_with(&s, AUTH_SCRAM_SHA1, "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
		   "r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,"
		   "s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000",
		   "fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE", "user", "pencil");
	assert_int_equal(auth_scram_client_final(&s, U8(cfin), strlen(cfin), out, sizeof out, err,
						 sizeof err),
			 0);
	assert_string_equal(out, "v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=");
}

/* RFC 5802 §5's example: plain SCRAM-SHA-1 over the password "pencil" itself (no
 * MongoDB digest): salt QSXCR+Q6sek8bf92 (12 bytes), i=4096; proof and server signature
 * from the RFC. */
static void test_rfc5802_vector(void **state)
{
	(void)state;
	auth_scram s;
	auth_scram_creds c;
	uint8_t salt[64];
	char out[512], err[256];
	const char *cf = "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL";
	const char *cfin = "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,"
			   "p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=";
	int sl = auth_b64_decode("QSXCR+Q6sek8bf92", 16, salt, sizeof salt);

	assert_int_equal(sl, 12);
	/* auth_scram_verifier (stored verifiers) wants 16 bytes; the raw form takes the RFC's */
	assert_int_equal(auth_scram_verifier(AUTH_SCRAM_SHA1, "user", "pencil", salt, (size_t)sl,
					     4096, &c, err, sizeof err),
			 SDB_EINVAL);
	assert_int_equal(auth_scram_verifier_raw(AUTH_SCRAM_SHA1, "pencil", salt, (size_t)sl, 4096,
						 &c, err, sizeof err),
			 0);
	auth_scram_init(&s, AUTH_SCRAM_SHA1);
	assert_int_equal(auth_scram_client_first(&s, U8(cf), strlen(cf), err, sizeof err), 0);
	s.creds = c;
	strcpy(s.nonce, "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j");
	strcpy(s.server_first, "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,"
			       "i=4096");
	s.state = AUTH_SCRAM_SENT_FIRST;
	assert_int_equal(auth_scram_client_final(&s, U8(cfin), strlen(cfin), out, sizeof out, err,
						 sizeof err),
			 0);
	assert_string_equal(out, "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=");
	/* the same proof against MongoDB's verifier of "pencil" (the MD5 digest) fails */
	assert_int_equal(auth_scram_verifier(AUTH_SCRAM_SHA1, "user", "pencil", (const uint8_t *)
					     "0123456789abcdef", 16, 4096, &c, err, sizeof err),
			 0);
	auth_scram_init(&s, AUTH_SCRAM_SHA1);
	assert_int_equal(auth_scram_client_first(&s, U8(cf), strlen(cf), err, sizeof err), 0);
	s.creds = c;
	strcpy(s.nonce, "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j");
	strcpy(s.server_first, "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,"
			       "i=4096");
	s.state = AUTH_SCRAM_SENT_FIRST;
	assert_int_equal(auth_scram_client_final(&s, U8(cfin), strlen(cfin), out, sizeof out, err,
						 sizeof err),
			 SDB_EAUTH);
}

/* The MongoDB auth spec's digest of user "user", password "pencil". */
static void test_mongodb_digest(void **state)
{
	(void)state;
	char d[33];
	assert_int_equal(auth_scram_mongo_digest("user", "pencil", d), 0);
	assert_string_equal(d, "1c33006ec1ffd90f9cadcbcc0e118200");
}

/* A full conversation with a random-looking server nonce; then the same with a wrong
 * password fails with SDB_EAUTH. */
static void round_trip(auth_mech mech, const char *pw_client, int expect)
{
	const uint8_t salt[16] = "0123456789abcdef", snonce[24] = "server-nonce-bytes-24-xx";
	auth_scram_creds c;
	auth_scram s;
	char sf[1100], cf[1100], out[256], err[256], sfinal[AUTH_SCRAM_SERVER_FINAL_MAX];
	const char *cfirst = "n,,n=al=2Cice=3D,r=clientnonce123";

	assert_int_equal(auth_scram_verifier(mech, "al,ice=", "s3cret", salt, 16, 4096, &c, err,
					     sizeof err),
			 0);
	auth_scram_init(&s, mech);
	assert_int_equal(auth_scram_client_first(&s, U8(cfirst), strlen(cfirst), err, sizeof err),
			 0);
	assert_string_equal(s.user, "al,ice=");
	assert_int_equal(auth_scram_server_first(&s, &c, snonce, sizeof snonce, sf, sizeof sf, err,
						 sizeof err),
			 0);
	assert_int_equal(strncmp(sf, "r=clientnonce123", 16), 0);
	assert_int_equal(auth_scram_client_final_ex(mech, "al,ice=", pw_client, cfirst + 3, sf,
						    cf, sizeof cf, sfinal, err, sizeof err),
			 0);
	assert_int_equal(auth_scram_client_final(&s, U8(cf), strlen(cf), out, sizeof out, err,
						 sizeof err),
			 expect);
	assert_int_equal(s.state, expect == 0 ? AUTH_SCRAM_DONE : AUTH_SCRAM_FAILED);
	/* the client's expected server-final is what a server knowing the password sends */
	if (expect == 0)
		assert_string_equal(out, sfinal);
}

/* The client refuses a server-first whose nonce does not extend its own (RFC 5802 §5.1)
 * and absurd iteration counts. */
static void test_client_checks_server_first(void **state)
{
	char cf[256], sfinal[AUTH_SCRAM_SERVER_FINAL_MAX], err[256];
	const char *bare = "n=__system,r=abcdef";
	static const char *const bad[] = {
		"r=abcdeX123,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096", /* another nonce */
		"r=abcdef,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096",    /* nothing of the server's */
		"r=abc,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096",       /* shorter */
		"r=abcdef99,s=c2FsdHNhbHRzYWx0c2FsdA==,i=1",     /* iterations */
		"r=abcdef99,s=c2FsdHNhbHRzYWx0c2FsdA==,i=99999999999",
		"r=abcdef99,s=!!!,i=4096", /* salt */
		"r=abcdef99,i=4096",       /* no salt */
	};
	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		assert_int_equal(auth_scram_client_final_ex(AUTH_SCRAM_SHA256, "__system", "k", bare,
							    bad[i], cf, sizeof cf, sfinal, err,
							    sizeof err),
				 SDB_EPROTO);
	assert_int_equal(auth_scram_client_final_ex(AUTH_SCRAM_SHA256, "__system", "k", bare,
						    "r=abcdef99,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096",
						    cf, sizeof cf, sfinal, err, sizeof err),
			 0);
	assert_int_equal(strncmp(cf, "c=biws,r=abcdef99,p=", 20), 0);
	assert_int_equal(strncmp(sfinal, "v=", 2), 0);
}

static void test_round_trip_sha256(void **state)
{
	(void)state;
	round_trip(AUTH_SCRAM_SHA256, "s3cret", 0);
	round_trip(AUTH_SCRAM_SHA256, "wrong", SDB_EAUTH);
}

static void test_round_trip_sha1(void **state)
{
	(void)state;
	round_trip(AUTH_SCRAM_SHA1, "s3cret", 0);
	round_trip(AUTH_SCRAM_SHA1, "s3cret ", SDB_EAUTH);
}

static void test_client_first_rejects(void **state)
{
	(void)state;
	static const char *const bad[] = {
		"",                       /* empty */
		"p=tls-unique,,n=u,r=x",  /* channel binding */
		"n,a=admin,n=u,r=x",      /* authzid */
		"n,,n=,r=x",              /* empty user */
		"n,,n=u",                 /* no nonce */
		"n,,n=u=2X,r=x",          /* bad escape */
		"n,,r=x,n=u",             /* order */
		"n,,n=u,r=",              /* empty nonce */
		"x,,n=u,r=abc",           /* gs2 flag */
		"n,,n=u,r=a\x01z",        /* unprintable nonce */
	};
	char err[256];
	auth_scram s;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		auth_scram_init(&s, AUTH_SCRAM_SHA256);
		assert_int_equal(auth_scram_client_first(&s, U8(bad[i]), strlen(bad[i]), err,
							 sizeof err),
				 SDB_EPROTO);
		assert_int_equal(s.state, AUTH_SCRAM_FAILED);
	}
	/* a NUL inside */
	auth_scram_init(&s, AUTH_SCRAM_SHA256);
	assert_int_equal(auth_scram_client_first(&s, U8("n,,n=u\0,r=x"), 11, err, sizeof err),
			 SDB_EPROTO);
	/* client-final before server-first */
	auth_scram_init(&s, AUTH_SCRAM_SHA256);
	assert_int_equal(auth_scram_client_final(&s, U8("c=biws"), 6, err, sizeof err, err,
						 sizeof err),
			 SDB_EPROTO);
}

static void test_client_final_rejects(void **state)
{
	(void)state;
	static const char *const bad[] = {
		"c=eSws,r=N,p=AAAA",    /* channel binding flag differs */
		"c=biws,r=M,p=AAAA",    /* nonce mismatch */
		"c=biws,r=N,p=@@@@",    /* bad base64 */
		"c=biws,r=N,p=AAAA",    /* proof of the wrong length */
		"c=biws,r=N",           /* no proof */
		"c=biws",
	};
	char out[256], err[256];
	auth_scram s;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		start_with(&s, AUTH_SCRAM_SHA256, "n,,n=user,r=N", "r=N,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
			   "N", "user", "pencil");
		assert_int_equal(auth_scram_client_final(&s, U8(bad[i]), strlen(bad[i]), out,
							 sizeof out, err, sizeof err),
				 SDB_EPROTO);
		assert_int_equal(s.state, AUTH_SCRAM_FAILED);
	}
}

static void test_base64(void **state)
{
	(void)state;
	char out[16];
	uint8_t b[16];
	assert_int_equal(auth_b64_encode(U8("n,,"), 3, out, sizeof out), 4);
	assert_string_equal(out, "biws");
	assert_int_equal(auth_b64_encode(U8("ab"), 2, out, sizeof out), 4);
	assert_string_equal(out, "YWI=");
	assert_int_equal(auth_b64_decode("YWI=", 4, b, sizeof b), 2);
	assert_memory_equal(b, "ab", 2);
	assert_int_equal(auth_b64_decode("YQ==", 4, b, sizeof b), 1);
	assert_int_equal(auth_b64_decode("Y===", 4, b, sizeof b), -1);
	assert_int_equal(auth_b64_decode("YW=I", 4, b, sizeof b), -1);
	assert_int_equal(auth_b64_decode("YWI", 3, b, sizeof b), -1);
	/* non-canonical: the bits dropped by padding are not zero (found by fuzz_sasl) */
	assert_int_equal(auth_b64_decode("alt=", 4, b, sizeof b), -1);
	assert_int_equal(auth_b64_decode("YR==", 4, b, sizeof b), -1);
	assert_int_equal(auth_b64_encode(U8("abcdef"), 6, out, 8), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rfc7677_vector),   cmocka_unit_test(test_mongodb_sha1_vector),
		cmocka_unit_test(test_rfc5802_vector),   cmocka_unit_test(test_mongodb_digest),
		cmocka_unit_test(test_round_trip_sha256), cmocka_unit_test(test_round_trip_sha1),
		cmocka_unit_test(test_client_checks_server_first),
		cmocka_unit_test(test_client_first_rejects),
		cmocka_unit_test(test_client_final_rejects), cmocka_unit_test(test_base64),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
