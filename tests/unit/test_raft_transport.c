/* Unit tests of the Raft transport's handshake codec (raft/handshake.c) and of the
 * transport itself (raft/transport.c) on a real libuv loop with the cluster key: a
 * connector and an acceptor with the same key exchange bytes as libraft would (nothing
 * of the Raft stream is eaten by the handshake), a wrong key is refused on both sides
 * before any byte reaches the "libraft" callbacks, and closing leaves no handle. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/handshake.c"
#include "../../raft/transport.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include "raft/handshake.h"
#include "raft/transport.h"

static const uint8_t K1[32] = "key-one-0123456789abcdefghijklm";
static const uint8_t K2[32] = "key-two-0123456789abcdefghijklm";

/* Run a client codec (key ck or none) against a server codec with nsk keys sks, feeding
 * each side's output to the other until neither has more to say; returns the server's
 * result (*crc the client's). */
static int pair_keys(const uint8_t *ck, const uint8_t (*sks)[32], size_t nsk, int *crc,
		     sdb_hs *s)
{
	static sdb_hs c;
	uint8_t cn[32], sn[32], ch[48], sh[48], out[SDB_HS_OUT_MAX], cbuf[64], sbuf[64];
	size_t used, outlen, cl = 0, sl = 0;
	int src;
	memset(cn, 1, sizeof cn);
	memset(sn, 2, sizeof sn);
	sdb_hs_init(&c, false, ck, cn);
	sdb_hs_init_keys(s, true, sks, nsk, sn);
	sdb_hs_hello(&c, ch);
	sdb_hs_hello(s, sh);
	/* both hellos cross; then each output goes to the other side */
	*crc = sdb_hs_feed(&c, sh, 48, &used, out, &outlen);
	memcpy(cbuf, out, outlen);
	cl = outlen;
	src = sdb_hs_feed(s, ch, 48, &used, out, &outlen);
	memcpy(sbuf, out, outlen);
	sl = outlen;
	while ((cl || sl) && *crc != SDB_HS_FAILED && src != SDB_HS_FAILED) {
		size_t ncl = 0, nsl = 0;
		if (sl) {
			*crc = sdb_hs_feed(&c, sbuf, sl, &used, out, &outlen);
			assert_int_equal(used, sl);
			memcpy(cbuf + cl, out, outlen);
			ncl = outlen;
		}
		if (cl) {
			src = sdb_hs_feed(s, cbuf, cl, &used, out, &outlen);
			assert_int_equal(used, cl);
			memcpy(sbuf, out, outlen);
			nsl = outlen;
		}
		if (ncl)
			memmove(cbuf, cbuf + cl, ncl);
		cl = ncl;
		sl = nsl;
	}
	if (*crc == SDB_HS_FAILED || src == SDB_HS_FAILED)
		return src;
	if (*crc == SDB_HS_DONE && src == SDB_HS_MORE) {
		uint8_t pre[64];
		size_t n = sdb_hs_preamble(7, "10.0.0.7:7001", pre, sizeof pre);
		assert_int_equal(n, 24 + 16);
		src = sdb_hs_feed(s, pre, n, &used, out, &outlen);
		assert_int_equal(used, n);
	}
	return src;
}

static int pair(const uint8_t *ck, const uint8_t *sk, int *crc, sdb_hs *s)
{
	return pair_keys(ck, (const uint8_t(*)[32])sk, sk ? 1 : 0, crc, s);
}

static void test_codec(void **state)
{
	sdb_hs s;
	int crc;
	(void)state;
	/* same key: both complete, the acceptor knows who connected */
	assert_int_equal(pair(K1, K1, &crc, &s), SDB_HS_DONE);
	assert_int_equal(crc, SDB_HS_DONE);
	assert_int_equal(s.peer_id, 7);
	assert_string_equal(s.peer_addr, "10.0.0.7:7001");
	/* no key on either side (TLS alone) */
	assert_int_equal(pair(NULL, NULL, &crc, &s), SDB_HS_DONE);
	/* wrong key: the acceptor refuses before proving anything (the connector is left
	 * waiting for a proof; the transport closes the connection) */
	assert_int_equal(pair(K1, K2, &crc, &s), SDB_HS_FAILED);
	assert_int_equal(crc, SDB_HS_MORE);
	assert_string_equal(s.error, "wrong cluster key proof");
	/* a side without a key is refused by a side with one, and the other way round */
	assert_int_equal(pair(NULL, K1, &crc, &s), SDB_HS_FAILED);
	assert_int_equal(pair(K1, NULL, &crc, &s), SDB_HS_FAILED);
}

static const uint8_t K3[32] = "key-three-123456789abcdefghijkl";

/* Key rotation (issue #21): a server with several keys accepts a client proving any of
 * them and answers with the key that matched; a key it does not hold is refused on both
 * sides; a client with several keys proves with the first only. */
static void test_codec_rotation(void **state)
{
	static const uint8_t old_new[2][32] = {"key-one-0123456789abcdefghijklm",
					       "key-two-0123456789abcdefghijklm"};
	static const uint8_t new_old[2][32] = {"key-two-0123456789abcdefghijklm",
					       "key-one-0123456789abcdefghijklm"};
	sdb_hs s, c;
	int crc;
	(void)state;
	assert_int_equal(pair_keys(K1, old_new, 2, &crc, &s), SDB_HS_DONE);
	assert_int_equal(crc, SDB_HS_DONE);
	assert_int_equal(s.key_used, 0);
	assert_string_equal(s.peer_addr, "10.0.0.7:7001");
	assert_int_equal(pair_keys(K2, old_new, 2, &crc, &s), SDB_HS_DONE);
	assert_int_equal(crc, SDB_HS_DONE);
	assert_int_equal(s.key_used, 1);
	assert_int_equal(pair_keys(K1, new_old, 2, &crc, &s), SDB_HS_DONE);
	assert_int_equal(s.key_used, 1);
	/* after the old key is dropped (the last step), a member left with it is refused */
	assert_int_equal(pair_keys(K1, new_old, 1, &crc, &s), SDB_HS_FAILED);
	assert_string_equal(s.error, "wrong cluster key proof");
	assert_int_equal(crc, SDB_HS_MORE); /* the client never got a proof: it times out */
	assert_int_equal(pair_keys(K3, old_new, 2, &crc, &s), SDB_HS_FAILED);
	/* outgoing: a client given several keys proves with the first */
	{
		uint8_t n[32], h[48], out[SDB_HS_OUT_MAX];
		size_t used, outlen;
		memset(n, 3, sizeof n);
		sdb_hs_init_keys(&c, false, new_old, 2, n);
		assert_int_equal(c.nkeys, 1);
		assert_memory_equal(c.key[0], K2, 32);
		/* a server does not send its proof before it has checked the client's */
		sdb_hs_init_keys(&s, true, old_new, 2, n);
		sdb_hs_hello(&c, h);
		h[16] ^= 1; /* another nonce */
		assert_int_equal(sdb_hs_feed(&s, h, 48, &used, out, &outlen), SDB_HS_MORE);
		assert_int_equal(outlen, 0);
		assert_int_equal(sdb_hs_need(&s), SDB_HS_PROOF_LEN);
	}
}

static void test_codec_malformed(void **state)
{
	sdb_hs s;
	uint8_t n[32] = {3}, buf[128], out[SDB_HS_OUT_MAX];
	size_t used, outlen;
	(void)state;
	/* libraft's own preamble (a stock transport or a rogue) is not a hello */
	sdb_hs_init(&s, true, K1, n);
	memset(buf, 0, sizeof buf);
	buf[0] = 1;
	assert_int_equal(sdb_hs_feed(&s, buf, 48, &used, out, &outlen), SDB_HS_FAILED);
	/* an address length beyond the bound is refused before anything is allocated */
	sdb_hs_init(&s, true, NULL, n);
	memset(buf, 0, sizeof buf);
	memcpy(buf, SDB_HS_MAGIC, 8);
	buf[16] = 9;
	assert_int_equal(sdb_hs_feed(&s, buf, 48, &used, out, &outlen), SDB_HS_MORE);
	memset(buf, 0, 24);
	buf[0] = 1;
	buf[8] = 2;
	buf[16 + 4] = 1; /* 2^32 bytes */
	assert_int_equal(sdb_hs_feed(&s, buf, 24, &used, out, &outlen), SDB_HS_FAILED);
	assert_string_equal(s.error, "raft address length out of range");
	/* need() bounds a reader to the current step */
	sdb_hs_init(&s, false, NULL, n);
	assert_int_equal(sdb_hs_need(&s), SDB_HS_HELLO_LEN);
	assert_int_equal(sdb_hs_preamble(1, "", buf, sizeof buf), 0);
}

/* ---------------------------------------------------------------- on a loop */

/* TLS: self-signed P-256 certificates made here; each is its own CA. ctx[0] server,
 * ctx[1] client of the cluster; ctx[2] a client whose certificate no member trusts. */
static SSL_CTX *ctxs[3];

static X509 *self_signed(EVP_PKEY **key)
{
	X509 *x = X509_new();
	X509_NAME *n;
	*key = EVP_EC_gen("P-256");
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), -60);
	X509_gmtime_adj(X509_getm_notAfter(x), 3600);
	X509_set_pubkey(x, *key);
	n = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"member", -1, -1,
				   0);
	X509_set_issuer_name(x, n);
	X509_sign(x, *key, EVP_sha256());
	return x;
}

static void make_ctxs(void)
{
	EVP_PKEY *k, *rk;
	X509 *x = self_signed(&k), *rx = self_signed(&rk);
	for (int i = 0; i < 3; i++) {
		SSL_CTX *c = SSL_CTX_new(i == 0 ? TLS_server_method() : TLS_client_method());
		assert_non_null(c);
		SSL_CTX_use_certificate(c, i == 2 ? rx : x);
		SSL_CTX_use_PrivateKey(c, i == 2 ? rk : k);
		X509_STORE_add_cert(SSL_CTX_get_cert_store(c), x);
		SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		ctxs[i] = c;
	}
	X509_free(x);
	X509_free(rx);
	EVP_PKEY_free(k);
	EVP_PKEY_free(rk);
}

static SSL_CTX *tls_good(bool server, void *arg)
{
	(void)arg;
	SSL_CTX_up_ref(ctxs[server ? 0 : 1]);
	return ctxs[server ? 0 : 1];
}

static SSL_CTX *tls_rogue(bool server, void *arg)
{
	(void)arg;
	SSL_CTX_up_ref(ctxs[server ? 0 : 2]);
	return ctxs[server ? 0 : 2];
}

typedef struct env {
	uv_loop_t loop;
	struct raft_uv_transport a, b;
	struct raft_uv_connect req;
	char addr[64];
	int accepted, connected, conn_status, closed;
	uv_stream_t *in, *out;
	char got[64];
	size_t got_len;
	uv_write_t w;
} env;

static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *)&a, &l), 0);
	close(s);
	return ntohs(a.sin_port);
}

static void alloc_cb(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
	env *e = h->data;
	(void)sz;
	*buf = uv_buf_init(e->got + e->got_len, (unsigned)(sizeof e->got - e->got_len));
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	env *e = s->data;
	(void)buf;
	if (n > 0)
		e->got_len += (size_t)n;
}

static void accept_cb(struct raft_uv_transport *t, raft_id id, const char *address,
		      uv_stream_t *s)
{
	env *e = t->data;
	assert_int_equal(id, 2);
	assert_string_equal(address, "127.0.0.1:1");
	e->accepted++;
	e->in = s;
	s->data = e;
	uv_read_start(s, alloc_cb, read_cb);
}

static void connect_cb(struct raft_uv_connect *req, uv_stream_t *s, int status)
{
	env *e = req->data;
	e->connected++;
	e->conn_status = status;
	e->out = s;
	if (status == 0) {
		uv_buf_t b = uv_buf_init("raft bytes", 10);
		s->data = e;
		uv_write(&e->w, s, &b, 1, NULL);
	}
}

static void t_closed(struct raft_uv_transport *t)
{
	((env *)t->data)->closed++;
}

static void free_env_handle(uv_handle_t *h)
{
	raft_free(h);
}

static int run_until(env *e, int (*cond)(env *e))
{
	uint64_t deadline = uv_now(&e->loop) + 10000;
	while (!cond(e) && uv_now(&e->loop) < deadline)
		uv_run(&e->loop, UV_RUN_ONCE);
	return cond(e);
}

static int got_all(env *e) { return e->got_len >= 10; }
static int connect_done(env *e) { return e->connected > 0; }
static int both_closed(env *e) { return e->closed == 2; }

static void run_pair_tls(env *e, const uint8_t *ka, const uint8_t *kb,
			 SSL_CTX *(*tls)(bool, void *))
{
	sdb_transport_opts oa = {.key = ka, .tls_ctx = tls}, ob = {.key = kb, .tls_ctx = tls};
	assert_int_equal(uv_loop_init(&e->loop), 0);
	snprintf(e->addr, sizeof e->addr, "127.0.0.1:%d", free_port());
	e->a.data = e->b.data = e;
	e->req.data = e;
	assert_int_equal(sdb_transport_init(&e->a, &e->loop, &oa), 0);
	assert_int_equal(sdb_transport_init(&e->b, &e->loop, &ob), 0);
	assert_int_equal(e->a.init(&e->a, 1, e->addr), 0);
	assert_int_equal(e->b.init(&e->b, 2, "127.0.0.1:1"), 0);
	assert_int_equal(e->a.listen(&e->a, accept_cb), 0);
	assert_int_equal(e->b.connect(&e->b, &e->req, 1, e->addr, connect_cb), 0);
	assert_true(run_until(e, connect_done));
}

static void run_pair(env *e, const uint8_t *ka, const uint8_t *kb)
{
	run_pair_tls(e, ka, kb, NULL);
}

static void finish(env *e)
{
	if (e->in)
		uv_close((uv_handle_t *)e->in, free_env_handle);
	if (e->out)
		uv_close((uv_handle_t *)e->out, free_env_handle);
	e->a.close(&e->a, t_closed);
	e->b.close(&e->b, t_closed);
	assert_true(run_until(e, both_closed));
	uv_run(&e->loop, UV_RUN_NOWAIT);
	sdb_transport_close(&e->a);
	sdb_transport_close(&e->b);
	assert_int_equal(uv_loop_close(&e->loop), 0); /* every handle was closed */
}

/* The TCP connection handed to libraft has Nagle's algorithm off (TCP_NODELAY): with it on,
 * a small Raft message written while the previous one is unacknowledged waits for the
 * peer's delayed ACK (40 ms on Linux); a 3-member shard set stalled its writes that long. */
static void assert_nodelay(uv_stream_t *s)
{
	uv_os_fd_t fd;
	int on = 0;
	socklen_t len = sizeof on;
	assert_non_null(s);
	assert_int_equal(s->type, UV_TCP);
	assert_int_equal(uv_fileno((uv_handle_t *)s, &fd), 0);
	assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
	assert_int_not_equal(on, 0);
}

static void test_loop_same_key(void **state)
{
	env *e = calloc(1, sizeof *e);
	(void)state;
	run_pair(e, K1, K1);
	assert_int_equal(e->conn_status, 0);
	assert_true(run_until(e, got_all));
	assert_int_equal(e->accepted, 1);
	assert_int_equal(e->got_len, 10);
	assert_memory_equal(e->got, "raft bytes", 10);
	/* authenticated without TLS: libraft reads and writes the TCP streams themselves */
	assert_nodelay(e->in);
	assert_nodelay(e->out);
	finish(e);
	free(e);
}

static void test_loop_wrong_key(void **state)
{
	env *e = calloc(1, sizeof *e);
	(void)state;
	run_pair(e, K1, K2);
	assert_int_equal(e->conn_status, RAFT_NOCONNECTION);
	assert_null(e->out);
	uv_run(&e->loop, UV_RUN_NOWAIT);
	assert_int_equal(e->accepted, 0); /* libraft never saw the connection */
	finish(e);
	free(e);
}

/* The acceptor's key list, changed between connections as a SIGHUP reload would. */
static uint8_t acc_keys[2][32];
static size_t acc_n;

static size_t acceptor_keys(uint8_t (*out)[32], size_t max, void *arg)
{
	size_t n = acc_n < max ? acc_n : max;
	(void)arg;
	memcpy(out, acc_keys, n * 32);
	return n;
}

/* Key rotation on a loop: the acceptor asks its keys at each connection (opts.keys): with
 * [K2, K1] a connector proving K1 gets through and its bytes arrive; after the list
 * became [K2] a new connection with K1 is refused before libraft sees it. */
static void test_loop_key_rotation(void **state)
{
	for (int round = 0; round < 2; round++) {
		env *e = calloc(1, sizeof *e);
		sdb_transport_opts oa = {.keys = acceptor_keys}, ob = {.key = K1};
		(void)state;
		memcpy(acc_keys[0], K2, 32);
		memcpy(acc_keys[1], K1, 32);
		acc_n = round == 0 ? 2 : 1;
		assert_int_equal(uv_loop_init(&e->loop), 0);
		snprintf(e->addr, sizeof e->addr, "127.0.0.1:%d", free_port());
		e->a.data = e->b.data = e;
		e->req.data = e;
		assert_int_equal(sdb_transport_init(&e->a, &e->loop, &oa), 0);
		assert_int_equal(sdb_transport_init(&e->b, &e->loop, &ob), 0);
		assert_int_equal(e->a.init(&e->a, 1, e->addr), 0);
		assert_int_equal(e->b.init(&e->b, 2, "127.0.0.1:1"), 0);
		assert_int_equal(e->a.listen(&e->a, accept_cb), 0);
		assert_int_equal(e->b.connect(&e->b, &e->req, 1, e->addr, connect_cb), 0);
		assert_true(run_until(e, connect_done));
		if (round == 0) {
			assert_int_equal(e->conn_status, 0);
			assert_true(run_until(e, got_all));
			assert_int_equal(e->accepted, 1);
			assert_memory_equal(e->got, "raft bytes", 10);
		} else {
			assert_int_equal(e->conn_status, RAFT_NOCONNECTION);
			uv_run(&e->loop, UV_RUN_NOWAIT);
			assert_int_equal(e->accepted, 0);
		}
		finish(e);
		free(e);
	}
}

static void test_loop_tls(void **state)
{
	env *e = calloc(1, sizeof *e);
	(void)state;
	/* mutual TLS and the key: the bytes cross the socketpair bridge intact */
	run_pair_tls(e, K1, K1, tls_good);
	assert_int_equal(e->conn_status, 0);
	assert_true(run_until(e, got_all));
	assert_int_equal(e->accepted, 1);
	assert_memory_equal(e->got, "raft bytes", 10);
	finish(e);
	free(e);
	/* TLS alone */
	e = calloc(1, sizeof *e);
	run_pair_tls(e, NULL, NULL, tls_good);
	assert_int_equal(e->conn_status, 0);
	assert_true(run_until(e, got_all));
	finish(e);
	free(e);
}

static void test_loop_tls_untrusted_certificate(void **state)
{
	env *e = calloc(1, sizeof *e);
	(void)state;
	run_pair_tls(e, NULL, NULL, tls_rogue);
	assert_int_equal(e->conn_status, RAFT_NOCONNECTION);
	uv_run(&e->loop, UV_RUN_NOWAIT);
	assert_int_equal(e->accepted, 0);
	finish(e);
	free(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_codec_malformed),
		cmocka_unit_test(test_codec_rotation),
		cmocka_unit_test(test_loop_same_key),
		cmocka_unit_test(test_loop_wrong_key),
		cmocka_unit_test(test_loop_key_rotation),
		cmocka_unit_test(test_loop_tls),
		cmocka_unit_test(test_loop_tls_untrusted_certificate),
	};
	int rc;
	make_ctxs();
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	for (int i = 0; i < 3; i++)
		SSL_CTX_free(ctxs[i]);
	return rc;
}
