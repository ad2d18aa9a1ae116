/* Benchmark of the Raft transport itself (raft/transport.c, issue #21): the cost of the
 * HMAC handshake and of the TLS socketpair bridge, against libraft's stock TCP transport.
 *
 * One libuv loop runs both ends (so the number is the CPU cost of moving bytes, both
 * sides included): a connector writes COUNT messages of SIZE bytes (libraft's stream use:
 * uv_write of whole messages) on the stream its transport handed over, the acceptor's
 * stream reads them. Per mode: connection set-up time (TCP + handshake, mean of 200
 * connections) and throughput (MB/s, messages/s). TLS uses a self-signed P-256
 * certificate made at start (it is its own CA).
 *
 *   tests/bench/raft_transport_bench [SIZE [COUNT]]     (defaults 512 and 200000)
 */
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include "raft/transport.h"

static SSL_CTX *srv_ctx, *cli_ctx;

static SSL_CTX *tls_ctx(bool server, void *arg)
{
	SSL_CTX *c = server ? srv_ctx : cli_ctx;
	(void)arg;
	SSL_CTX_up_ref(c);
	return c;
}

static void make_tls(void)
{
	EVP_PKEY *k = EVP_EC_gen("P-256");
	X509 *x = X509_new();
	X509_NAME *n;
	X509_STORE *st;
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), -60);
	X509_gmtime_adj(X509_getm_notAfter(x), 3600);
	X509_set_pubkey(x, k);
	n = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"bench", -1, -1, 0);
	X509_set_issuer_name(x, n);
	X509_sign(x, k, EVP_sha256());
	for (int s = 0; s < 2; s++) {
		SSL_CTX *c = SSL_CTX_new(s ? TLS_server_method() : TLS_client_method());
		SSL_CTX_use_certificate(c, x);
		SSL_CTX_use_PrivateKey(c, k);
		st = SSL_CTX_get_cert_store(c);
		X509_STORE_add_cert(st, x);
		SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
		if (s)
			srv_ctx = c;
		else
			cli_ctx = c;
	}
	X509_free(x);
	EVP_PKEY_free(k);
}

typedef struct bench {
	uv_loop_t loop;
	struct raft_uv_transport a, b;
	struct raft_uv_connect req;
	uv_stream_t *in, *out;
	size_t size, count, sent, got;
	char *msg, rbuf[65536];
	int connected, status, closed;
	size_t done; /* writes completed */
	uv_stream_t *data_out;
} bench;

static void free_h(uv_handle_t *h)
{
	raft_free(h);
}

static uint64_t now_ns(void)
{
	return uv_hrtime();
}

static void alloc_cb(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
	bench *b = h->data;
	(void)sz;
	*buf = uv_buf_init(b->rbuf, sizeof b->rbuf);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	bench *b = s->data;
	(void)buf;
	if (n > 0)
		b->got += (size_t)n;
}

static void accept_cb(struct raft_uv_transport *t, raft_id id, const char *a, uv_stream_t *s)
{
	bench *b = t->data;
	(void)id;
	(void)a;
	if (b->in) { /* set-up runs: close at once */
		uv_close((uv_handle_t *)s, free_h);
		return;
	}
	b->in = s;
	s->data = b;
	uv_read_start(s, alloc_cb, read_cb);
}

static void connect_cb(struct raft_uv_connect *req, uv_stream_t *s, int status)
{
	bench *b = req->data;
	b->connected++;
	b->status = status;
	b->out = s;
}

static void closed_cb(struct raft_uv_transport *t)
{
	((bench *)t->data)->closed++;
}

static void write_cb(uv_write_t *w, int status)
{
	bench *b = w->data;
	(void)status;
	b->done++;
}

static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	bind(s, (struct sockaddr *)&a, sizeof a);
	getsockname(s, (struct sockaddr *)&a, &l);
	close(s);
	return ntohs(a.sin_port);
}

static void run(const char *mode, size_t size, size_t count)
{
	static const uint8_t key[32] = "bench-key-0123456789abcdefghijkl";
	bench *b = calloc(1, sizeof *b);
	sdb_transport_opts o = {0};
	char addr[64];
	uint64_t t0, setup = 0;
	const int conns = 200;
	bool stock = strcmp(mode, "plain") == 0;

	if (strstr(mode, "hmac"))
		o.key = key;
	if (strstr(mode, "tls"))
		o.tls_ctx = tls_ctx;
	uv_loop_init(&b->loop);
	b->a.data = b->b.data = b;
	b->req.data = b;
	b->size = size;
	b->count = count;
	snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
	if (stock) {
		raft_uv_tcp_init(&b->a, &b->loop);
		raft_uv_tcp_init(&b->b, &b->loop);
	} else {
		sdb_transport_init(&b->a, &b->loop, &o);
		sdb_transport_init(&b->b, &b->loop, &o);
	}
	b->a.init(&b->a, 1, addr);
	b->b.init(&b->b, 2, "127.0.0.1:1");
	b->a.listen(&b->a, accept_cb);
	/* set-up cost: connections opened (handshake included) one after the other */
	for (int i = 0; i <= conns; i++) {
		uint64_t c0 = now_ns();
		b->connected = 0;
		b->out = NULL;
		b->b.connect(&b->b, &b->req, 1, addr, connect_cb);
		while (!b->connected)
			uv_run(&b->loop, UV_RUN_ONCE);
		if (b->status != 0) {
			fprintf(stderr, "%s: connect failed %d\n", mode, b->status);
			exit(1);
		}
		if (i > 0) { /* the first also waited for the accept of the data stream */
			setup += now_ns() - c0;
			uv_close((uv_handle_t *)b->out, free_h);
		}
		if (i == 0) { /* the data stream */
			b->data_out = b->out;
			while (!b->in)
				uv_run(&b->loop, UV_RUN_ONCE);
		}
	}
	{
		uv_stream_t *out = b->data_out;
		uv_write_t *reqs = calloc(256, sizeof *reqs);
		uv_buf_t buf;
		b->msg = malloc(size);
		memset(b->msg, 'x', size);
		buf = uv_buf_init(b->msg, (unsigned)size);
		t0 = now_ns();
		while (b->sent < count || b->got < size * count) {
			/* keep at most 256 messages in flight, as a leader's pipeline would */
			while (b->sent < count && b->sent - b->done < 256) {
				reqs[b->sent % 256].data = b;
				uv_write(&reqs[b->sent % 256], out, &buf, 1, write_cb);
				b->sent++;
			}
			uv_run(&b->loop, UV_RUN_ONCE);
		}
		{
			double secs = (double)(now_ns() - t0) / 1e9;
			printf("| %s | %.0f | %.1f | %.0f |\n", mode, (double)setup / conns / 1000.0,
			       (double)(size * count) / secs / 1e6, (double)count / secs);
		}
		uv_close((uv_handle_t *)out, free_h);
		free(reqs);
	}
	uv_close((uv_handle_t *)b->in, free_h);
	b->a.close(&b->a, closed_cb);
	b->b.close(&b->b, closed_cb);
	while (b->closed < 2)
		uv_run(&b->loop, UV_RUN_ONCE);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	if (stock) {
		raft_uv_tcp_close(&b->a);
		raft_uv_tcp_close(&b->b);
	} else {
		sdb_transport_close(&b->a);
		sdb_transport_close(&b->b);
	}
	uv_loop_close(&b->loop);
	free(b->msg);
	free(b);
}

int main(int argc, char **argv)
{
	size_t size = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
	size_t count = argc > 2 ? strtoul(argv[2], NULL, 10) : 200000;
	const char *modes[] = {"plain", "hmac", "tls", "tls+hmac"};
	make_tls();
	printf("messages of %zu bytes, %zu of them, both ends on one loop\n\n", size, count);
	printf("| transport | connection set-up us | MB/s | messages/s |\n|---|---:|---:|---:|\n");
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
		run(modes[i], size, count);
	return 0;
}
