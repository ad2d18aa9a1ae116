/* stripedb's authenticated/TLS libraft transport. Contract in raft/transport.h; the
 * handshake codec is raft/handshake.c. */
#include "raft/transport.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "raft/handshake.h"
#include "raft/msgcheck.h"

#define BACKLOG 128
#define HIGH_WATER (4u << 20) /* bytes queued on the other side before we stop reading */
#define LOW_WATER (1u << 20)
#define RDBUF 16384

typedef struct conn conn;

typedef struct tp {
	struct raft_uv_transport *transport;
	uv_loop_t *loop;
	raft_id id;
	char *address;
	uv_tcp_t listener;
	bool listener_open; /* initialised and not yet closed */
	raft_uv_accept_cb accept_cb;
	raft_uv_transport_close_cb close_cb;
	bool closing;
	bool has_key;
	bool plaintext;
	bool (*peer_ok)(uint64_t id, const char *address, void *arg, const char **why);
	void *peer_arg;
	const char *(*announce)(void *arg);
	uint8_t key[SDB_HS_KEY_LEN];
	size_t (*keys)(uint8_t (*out)[32], size_t max, void *arg);
	void *keys_arg;
	struct ssl_ctx_st *(*tls_ctx)(bool server, void *arg);
	void *tls_arg;
	unsigned timeout_ms, max_pending, n_pending;
	conn *conns; /* every connection we still hold a handle or request of */
	uint64_t log_ms, suppressed;
	sdb_counter *c_refused;
} tp;

enum { C_HS, C_PREAMBLE, C_BRIDGE, C_DONE };

struct conn {
	tp *t;
	conn *prev, *next;
	bool server;
	int state;
	bool closing;
	int refs;           /* open handles + pending writes */
	uv_tcp_t *tcp;      /* raft_malloc'd; NULL once closed or handed to libraft */
	uv_timer_t timer;   /* handshake deadline */
	uv_pipe_t inner;    /* TLS bridge: our end */
	bool inner_open;
	bool tcp_paused, inner_paused;
	SSL *ssl;
	BIO *rbio, *wbio;   /* owned by ssl */
	bool tls_ready;
	bool check;  /* accepted and bridged: the Raft messages go through rmsg */
	sdb_rmsg rmsg;
	sdb_hs hs;
	struct raft_uv_connect *req; /* connector: answered exactly once */
	int status;                  /* connector: status given to req->cb when failing */
	char peer[80];
	uint8_t rd[RDBUF], rd2[RDBUF];
};

typedef struct wreq {
	uv_write_t req;
	conn *c;
	uv_buf_t buf;
	bool to_tcp;
	bool handover; /* connector without TLS: the preamble; hand the stream over when written */
	uint8_t data[];
} wreq;

static void conn_close(conn *c, const char *why);
static void tcp_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void inner_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* ------------------------------------------------------------ helpers */

static int parse_addr(const char *address, struct sockaddr_storage *sa)
{
	char host[256], e[128];
	int port;
	if (sdb_addr_split(address, host, sizeof host, &port, e, sizeof e) != 0)
		return RAFT_INVALID;
	if (uv_ip4_addr(host, port, (struct sockaddr_in *)sa) == 0)
		return 0;
	if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)sa) == 0)
		return 0;
	return RAFT_INVALID;
}

static void refused(conn *c, const char *why)
{
	tp *t = c->t;
	uint64_t now = uv_now(t->loop);
	sdb_counter_inc(t->c_refused);
	if (t->log_ms && now - t->log_ms < 1000) {
		t->suppressed++;
		return;
	}
	sdb_warn("raft: transport peer refused", "peer=%s side=%s reason=\"%s\" suppressed=%llu",
		 c->peer, c->server ? "accept" : "connect", why,
		 (unsigned long long)t->suppressed);
	t->log_ms = now ? now : 1;
	t->suppressed = 0;
}

static void maybe_closed(tp *t)
{
	if (t->closing && !t->listener_open && !t->conns && t->close_cb) {
		raft_uv_transport_close_cb cb = t->close_cb;
		t->close_cb = NULL;
		cb(t->transport);
	}
}

static void unref(conn *c)
{
	tp *t = c->t;
	if (--c->refs > 0)
		return;
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (c->server && c->state == C_HS)
		t->n_pending--;
	if (c->req) {
		struct raft_uv_connect *req = c->req;
		c->req = NULL;
		req->cb(req, NULL, t->closing ? RAFT_CANCELED : c->status);
	}
	SSL_free(c->ssl);
	sdb_rmsg_free(&c->rmsg);
	OPENSSL_cleanse(&c->hs, sizeof c->hs);
	free(c);
	maybe_closed(t);
}

static void free_handle(uv_handle_t *h)
{
	raft_free(h);
}

static void alloc_tcp(uv_handle_t *h, size_t sz, uv_buf_t *buf);
static void alloc_inner(uv_handle_t *h, size_t sz, uv_buf_t *buf);

static void handle_closed(uv_handle_t *h)
{
	conn *c = h->data;
	if (h == (uv_handle_t *)c->tcp) {
		raft_free(c->tcp);
		c->tcp = NULL;
	}
	unref(c);
}

/* ------------------------------------------------------------ writes */

static bool queued_high(uv_stream_t *s)
{
	return uv_stream_get_write_queue_size(s) > HIGH_WATER;
}

static void write_cb(uv_write_t *r, int status)
{
	wreq *w = (wreq *)r;
	conn *c = w->c;
	bool handover = w->handover;
	free(w);
	if (status < 0) {
		if (!c->closing)
			conn_close(c, uv_strerror(status));
	} else if (handover && !c->closing && !c->t->closing && c->tcp) {
		/* connector without TLS: the preamble is out, libraft takes the stream */
		struct raft_uv_connect *req = c->req;
		uv_stream_t *s = (uv_stream_t *)c->tcp;
		c->req = NULL;
		c->tcp = NULL;
		c->state = C_DONE;
		c->refs--; /* the tcp handle is libraft's now */
		conn_close(c, NULL);
		req->cb(req, s, 0);
	} else if (!c->closing && c->state == C_BRIDGE) {
		/* back-pressure: resume the side that was paused for this queue */
		if (c->inner_paused && c->tcp &&
		    uv_stream_get_write_queue_size((uv_stream_t *)c->tcp) < LOW_WATER) {
			c->inner_paused = false;
			uv_read_start((uv_stream_t *)&c->inner, alloc_inner, inner_read_cb);
		}
		if (c->tcp_paused && c->inner_open &&
		    uv_stream_get_write_queue_size((uv_stream_t *)&c->inner) < LOW_WATER) {
			c->tcp_paused = false;
			uv_read_start((uv_stream_t *)c->tcp, alloc_tcp, tcp_read_cb);
		}
	}
	unref(c);
}

static int stream_write(conn *c, uv_stream_t *s, const uint8_t *data, size_t len, bool handover)
{
	wreq *w;
	int rv;
	if (len == 0)
		return 0;
	w = malloc(sizeof *w + len);
	if (!w)
		return UV_ENOMEM;
	w->c = c;
	w->handover = handover;
	memcpy(w->data, data, len);
	w->buf = uv_buf_init((char *)w->data, (unsigned)len);
	rv = uv_write(&w->req, s, &w->buf, 1, write_cb);
	if (rv != 0) {
		free(w);
		return rv;
	}
	c->refs++;
	return 0;
}

/* Move the ciphertext OpenSSL produced to the TCP stream. */
static int flush_tls(conn *c)
{
	uint8_t buf[RDBUF];
	int n, rv = 0;
	while (rv == 0 && (n = BIO_read(c->wbio, buf, sizeof buf)) > 0)
		rv = stream_write(c, (uv_stream_t *)c->tcp, buf, (size_t)n, false);
	return rv;
}

/* Send plaintext to the peer: through TLS when on. */
static int send_plain(conn *c, const uint8_t *data, size_t len, bool handover)
{
	if (!c->ssl)
		return stream_write(c, (uv_stream_t *)c->tcp, data, len, handover);
	while (len > 0) {
		int chunk = len > (1u << 20) ? (1 << 20) : (int)len;
		int n = SSL_write(c->ssl, data, chunk);
		if (n <= 0) {
			ERR_clear_error();
			return UV_EPROTO;
		}
		data += n;
		len -= (size_t)n;
	}
	return flush_tls(c);
}

/* ------------------------------------------------------------ close */

static void conn_close(conn *c, const char *why)
{
	if (c->closing)
		return;
	c->closing = true;
	if (why)
		refused(c, why);
	if (c->req && c->status == 0)
		c->status = RAFT_NOCONNECTION;
	if (!uv_is_closing((uv_handle_t *)&c->timer))
		uv_close((uv_handle_t *)&c->timer, handle_closed);
	if (c->tcp && !uv_is_closing((uv_handle_t *)c->tcp))
		uv_close((uv_handle_t *)c->tcp, handle_closed);
	if (c->inner_open) {
		c->inner_open = false;
		uv_close((uv_handle_t *)&c->inner, handle_closed);
	}
}

/* ------------------------------------------------------------ bridge (TLS) */

static void alloc_inner(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
	conn *c = h->data;
	(void)sz;
	*buf = uv_buf_init((char *)c->rd2, sizeof c->rd2);
}

/* libraft wrote plaintext on its end: encrypt it to the peer. */
static void inner_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	conn *c = s->data;
	if (c->closing)
		return;
	if (nread < 0) { /* libraft closed its end */
		if (c->ssl) {
			SSL_shutdown(c->ssl);
			flush_tls(c);
		}
		conn_close(c, NULL);
		return;
	}
	if (nread == 0)
		return;
	if (send_plain(c, (const uint8_t *)buf->base, (size_t)nread, false) != 0) {
		conn_close(c, "TLS write failed");
		return;
	}
	if (c->tcp && queued_high((uv_stream_t *)c->tcp)) {
		c->inner_paused = true;
		uv_read_stop(s);
	}
}

/* The bridge: a socketpair whose one end libraft gets. Returns its end or NULL. */
static uv_stream_t *bridge_open(conn *c)
{
	int sv[2];
	uv_pipe_t *outer;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		return NULL;
	outer = raft_malloc(sizeof *outer);
	if (!outer) {
		close(sv[0]);
		close(sv[1]);
		return NULL;
	}
	uv_pipe_init(c->t->loop, &c->inner, 0);
	c->inner.data = c;
	c->inner_open = true;
	c->refs++;
	uv_pipe_init(c->t->loop, outer, 0);
	if (uv_pipe_open(&c->inner, sv[0]) != 0) {
		close(sv[0]);
		close(sv[1]);
		uv_close((uv_handle_t *)outer, free_handle);
		return NULL;
	}
	if (uv_pipe_open(outer, sv[1]) != 0) {
		close(sv[1]); /* sv[0] is the inner handle's now */
		uv_close((uv_handle_t *)outer, free_handle);
		return NULL;
	}
	uv_read_start((uv_stream_t *)&c->inner, alloc_inner, inner_read_cb);
	c->state = C_BRIDGE;
	return (uv_stream_t *)outer;
}

/* ------------------------------------------------------------ handshake */

/* sdb_rmsg_emit: checked Raft bytes to libraft's end of the bridge. */
static int to_inner(void *arg, const uint8_t *data, size_t len)
{
	conn *c = arg;
	return stream_write(c, (uv_stream_t *)&c->inner, data, len, false);
}

static void hs_done(conn *c, const uint8_t *rest, size_t restlen)
{
	tp *t = c->t;
	uv_timer_stop(&c->timer);
	if (c->server) {
		uv_stream_t *s;
		const char *why = "raft peer refused";
		t->n_pending--;
		if (t->peer_ok && !t->peer_ok(c->hs.peer_id, c->hs.peer_addr, t->peer_arg, &why)) {
			c->state = C_DONE;
			conn_close(c, why);
			return;
		}
		if (!c->ssl && !t->plaintext) {
			/* plaintext: libraft reads the Raft messages from the TCP stream itself */
			s = (uv_stream_t *)c->tcp;
			uv_read_stop(s);
			c->tcp = NULL;
			c->state = C_DONE;
			c->refs--;
			conn_close(c, NULL);
			t->accept_cb(t->transport, c->hs.peer_id, c->hs.peer_addr, s);
			return;
		}
		if (!(s = bridge_open(c))) {
			c->state = C_DONE;
			conn_close(c, "bridge socketpair failed");
			return;
		}
		/* plaintext mode (no authentication): what libraft reads from the bridge is
		 * checked first (raft/msgcheck.h); a TLS peer proved its certificate */
		c->check = t->plaintext;
		sdb_rmsg_init(&c->rmsg);
		if (restlen && (c->check ? sdb_rmsg_feed(&c->rmsg, rest, restlen, to_inner, c)
					 : stream_write(c, (uv_stream_t *)&c->inner, rest, restlen,
							false)) != 0) {
			uv_close((uv_handle_t *)s, free_handle);
			conn_close(c, c->check && c->rmsg.error ? c->rmsg.error : "bridge write failed");
			return;
		}
		t->accept_cb(t->transport, c->hs.peer_id, c->hs.peer_addr, s);
		return;
	}
	{
		uint8_t pre[SDB_HS_PREAMBLE_HDR + SDB_HS_ADDR_MAX];
		const char *self = t->announce ? t->announce(t->peer_arg) : NULL;
		size_t n = sdb_hs_preamble(t->id, self && *self ? self : t->address, pre,
					   sizeof pre);
		uv_stream_t *s;
		struct raft_uv_connect *req;
		if (n == 0) {
			conn_close(c, "own address too long");
			return;
		}
		if (!c->ssl) {
			uv_read_stop((uv_stream_t *)c->tcp);
			c->state = C_PREAMBLE;
			if (stream_write(c, (uv_stream_t *)c->tcp, pre, n, true) != 0)
				conn_close(c, "preamble write failed");
			return;
		}
		if (send_plain(c, pre, n, false) != 0 || !(s = bridge_open(c))) {
			conn_close(c, "preamble or bridge failed");
			return;
		}
		if (restlen && stream_write(c, (uv_stream_t *)&c->inner, rest, restlen, false) != 0) {
			uv_close((uv_handle_t *)s, free_handle);
			conn_close(c, "bridge write failed");
			return;
		}
		req = c->req;
		c->req = NULL;
		req->cb(req, s, 0);
	}
}

/* Plaintext from the peer (after TLS decryption when on). */
static void on_plain(conn *c, const uint8_t *data, size_t len)
{
	while (len > 0 && !c->closing) {
		if (c->state == C_BRIDGE) {
			if (c->check ? sdb_rmsg_feed(&c->rmsg, data, len, to_inner, c) != 0
				     : stream_write(c, (uv_stream_t *)&c->inner, data, len, false) != 0) {
				conn_close(c, c->check && c->rmsg.error ? c->rmsg.error
									: "bridge write failed");
				return;
			}
			if (c->tcp && queued_high((uv_stream_t *)&c->inner)) {
				c->tcp_paused = true;
				uv_read_stop((uv_stream_t *)c->tcp);
			}
			return;
		}
		if (c->state != C_HS) {
			conn_close(c, "unexpected bytes after the handshake");
			return;
		}
		{
			uint8_t out[SDB_HS_OUT_MAX];
			size_t used = 0, outlen = 0;
			int rc = sdb_hs_feed(&c->hs, data, len, &used, out, &outlen);
			data += used;
			len -= used;
			if (rc == SDB_HS_FAILED) {
				conn_close(c, c->hs.error);
				return;
			}
			if (outlen && send_plain(c, out, outlen, false) != 0) {
				conn_close(c, "handshake write failed");
				return;
			}
			if (rc == SDB_HS_DONE) {
				hs_done(c, data, len);
				return;
			}
		}
	}
}

static void send_hello(conn *c)
{
	uint8_t hello[SDB_HS_HELLO_LEN];
	sdb_hs_hello(&c->hs, hello);
	if (send_plain(c, hello, sizeof hello, false) != 0)
		conn_close(c, "handshake write failed");
}

static const char *tls_error(conn *c, char *buf, size_t len)
{
	long v = SSL_get_verify_result(c->ssl);
	unsigned long e = ERR_get_error();
	if (v != X509_V_OK)
		snprintf(buf, len, "TLS: certificate: %s", X509_verify_cert_error_string(v));
	else if (e)
		snprintf(buf, len, "TLS: %s", ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "error");
	else
		snprintf(buf, len, "TLS handshake failed");
	ERR_clear_error();
	return buf;
}

static void on_cipher(conn *c, const uint8_t *data, size_t len)
{
	uint8_t buf[RDBUF];
	char ebuf[200];
	int n;
	if (BIO_write(c->rbio, data, (int)len) != (int)len) {
		conn_close(c, "TLS buffer");
		return;
	}
	if (!c->tls_ready) {
		n = SSL_do_handshake(c->ssl);
		flush_tls(c);
		if (n <= 0) {
			if (SSL_get_error(c->ssl, n) == SSL_ERROR_WANT_READ) {
				ERR_clear_error();
				return;
			}
			conn_close(c, tls_error(c, ebuf, sizeof ebuf));
			return;
		}
		{
			uint8_t binding[32];
			static const char label[] = "EXPORTER-stripedb-raft";
			if (SSL_export_keying_material(c->ssl, binding, sizeof binding, label,
						       sizeof label - 1, NULL, 0, 0) != 1) {
				conn_close(c, "TLS exporter");
				return;
			}
			sdb_hs_set_binding(&c->hs, binding);
		}
		c->tls_ready = true;
		send_hello(c);
	}
	while (!c->closing) {
		n = SSL_read(c->ssl, buf, sizeof buf);
		if (n > 0) {
			on_plain(c, buf, (size_t)n);
			continue;
		}
		switch (SSL_get_error(c->ssl, n)) {
		case SSL_ERROR_WANT_READ:
			ERR_clear_error();
			flush_tls(c); /* e.g. key updates */
			return;
		case SSL_ERROR_ZERO_RETURN:
			conn_close(c, c->state == C_BRIDGE ? NULL : "peer closed during handshake");
			return;
		default:
			conn_close(c, tls_error(c, ebuf, sizeof ebuf));
			return;
		}
	}
}

static void alloc_tcp(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
	conn *c = h->data;
	size_t n = sizeof c->rd;
	(void)sz;
	if (!c->ssl && c->state == C_HS) {
		/* never read past the handshake: what follows belongs to libraft */
		n = sdb_hs_need(&c->hs);
		if (n == 0 || n > sizeof c->rd)
			n = 1;
	}
	*buf = uv_buf_init((char *)c->rd, (unsigned)n);
}

static void tcp_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	conn *c = s->data;
	if (c->closing)
		return;
	if (nread < 0) {
		conn_close(c, c->state == C_BRIDGE ? NULL
			   : nread == UV_EOF       ? "peer closed during handshake"
						   : uv_strerror((int)nread));
		return;
	}
	if (nread == 0)
		return;
	if (c->ssl)
		on_cipher(c, (const uint8_t *)buf->base, (size_t)nread);
	else
		on_plain(c, (const uint8_t *)buf->base, (size_t)nread);
}

static void timer_cb(uv_timer_t *h)
{
	conn *c = h->data;
	conn_close(c, "handshake timeout");
}

/* Allocate a connection with its TCP handle and deadline timer, linked into t. */
static conn *conn_new(tp *t, bool server)
{
	conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->tcp = raft_malloc(sizeof *c->tcp);
	if (!c->tcp) {
		free(c);
		return NULL;
	}
	c->t = t;
	c->server = server;
	c->state = C_HS;
	snprintf(c->peer, sizeof c->peer, "?");
	uv_tcp_init(t->loop, c->tcp);
	c->tcp->data = c;
	uv_timer_init(t->loop, &c->timer);
	c->timer.data = c;
	c->refs = 2;
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	return c;
}

/* TCP is up: set up TLS and the handshake, start reading and the deadline. */
static void conn_begin(conn *c)
{
	tp *t = c->t;
	uint8_t nonce[SDB_HS_NONCE_LEN];
	struct sockaddr_storage sa;
	int salen = sizeof sa;

	if (uv_tcp_getpeername(c->tcp, (struct sockaddr *)&sa, &salen) == 0) {
		char ip[64] = "?";
		int port = 0;
		if (sa.ss_family == AF_INET) {
			uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof ip);
			port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
		} else if (sa.ss_family == AF_INET6) {
			uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof ip);
			port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
		}
		snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
	}
	/* No Nagle: libraft writes an AppendEntries and its result as separate small
	 * messages, and with Nagle a message written while an earlier one is unacknowledged
	 * waits for the peer's delayed ACK (40 ms on Linux). A 3-member set under YCSB A
	 * (16 clients) stalled its writes that long: update p95 46 ms against 0.9 ms p50. */
	uv_tcp_nodelay(c->tcp, 1);
	uv_timer_start(&c->timer, timer_cb, t->timeout_ms, 0);
	if (t->plaintext) { /* libraft's bare handshake: the connector's preamble only */
		sdb_hs_init_plain(&c->hs, c->server);
		if (c->server)
			uv_read_start((uv_stream_t *)c->tcp, alloc_tcp, tcp_read_cb);
		else
			hs_done(c, NULL, 0);
		return;
	}
	if (RAND_bytes(nonce, sizeof nonce) != 1) {
		conn_close(c, "no randomness");
		return;
	}
	if (t->keys) { /* the current keys (rotation: reloaded on SIGHUP) */
		uint8_t k[SDB_HS_KEYS_MAX][SDB_HS_KEY_LEN];
		size_t n = t->keys(k, SDB_HS_KEYS_MAX, t->keys_arg);
		sdb_hs_init_keys(&c->hs, c->server, (const uint8_t(*)[SDB_HS_KEY_LEN])k,
				 n > SDB_HS_KEYS_MAX ? SDB_HS_KEYS_MAX : n, nonce);
		OPENSSL_cleanse(k, sizeof k);
	} else {
		sdb_hs_init(&c->hs, c->server, t->has_key ? t->key : NULL, nonce);
	}
	if (t->tls_ctx) {
		SSL_CTX *ctx = t->tls_ctx(c->server, t->tls_arg);
		if (!ctx) {
			conn_close(c, "no TLS context");
			return;
		}
		c->ssl = SSL_new(ctx);
		SSL_CTX_free(ctx);
		c->rbio = BIO_new(BIO_s_mem());
		c->wbio = BIO_new(BIO_s_mem());
		if (!c->ssl || !c->rbio || !c->wbio) {
			BIO_free(c->rbio);
			BIO_free(c->wbio);
			conn_close(c, "TLS setup");
			return;
		}
		SSL_set_bio(c->ssl, c->rbio, c->wbio);
		if (c->server) {
			SSL_set_accept_state(c->ssl);
		} else {
			SSL_set_connect_state(c->ssl);
			SSL_do_handshake(c->ssl); /* ClientHello */
			ERR_clear_error();
			flush_tls(c);
		}
	} else {
		send_hello(c);
	}
	if (!c->closing)
		uv_read_start((uv_stream_t *)c->tcp, alloc_tcp, tcp_read_cb);
}

/* ------------------------------------------------------------ raft_uv_transport */

static int tp_init(struct raft_uv_transport *transport, raft_id id, const char *address)
{
	tp *t = transport->impl;
	t->id = id;
	free(t->address);
	t->address = strdup(address);
	if (!t->address)
		return RAFT_NOMEM;
	if (uv_tcp_init(t->loop, &t->listener) != 0)
		return RAFT_IOERR;
	t->listener.data = t;
	t->listener_open = true;
	return 0;
}

static void listen_cb(uv_stream_t *s, int status)
{
	tp *t = s->data;
	conn *c;
	if (status != 0 || t->closing)
		return;
	c = conn_new(t, true);
	if (!c)
		return;
	if (uv_accept(s, (uv_stream_t *)c->tcp) != 0) {
		c->state = C_DONE;
		conn_close(c, NULL);
		return;
	}
	if (t->n_pending >= t->max_pending) {
		c->state = C_DONE;
		conn_close(c, "too many handshakes in progress");
		return;
	}
	t->n_pending++;
	conn_begin(c);
}

static int tp_listen(struct raft_uv_transport *transport, raft_uv_accept_cb cb)
{
	tp *t = transport->impl;
	struct sockaddr_storage sa;
	int rv;
	t->accept_cb = cb;
	if (parse_addr(t->address, &sa) != 0) {
		snprintf(transport->errmsg, RAFT_ERRMSG_BUF_SIZE, "bad raft address %s",
			 t->address);
		return RAFT_INVALID;
	}
	rv = uv_tcp_bind(&t->listener, (struct sockaddr *)&sa, 0);
	if (rv == 0)
		rv = uv_listen((uv_stream_t *)&t->listener, BACKLOG, listen_cb);
	if (rv != 0) {
		snprintf(transport->errmsg, RAFT_ERRMSG_BUF_SIZE, "listen on %s: %s", t->address,
			 uv_strerror(rv));
		return RAFT_IOERR;
	}
	return 0;
}

static void tcp_connect_cb(uv_connect_t *r, int status)
{
	conn *c = r->data;
	free(r);
	if (c->closing) {
		unref(c);
		return;
	}
	if (status != 0) {
		c->status = RAFT_NOCONNECTION;
		c->closing = true; /* a refused TCP connect is not worth a log line */
		uv_close((uv_handle_t *)&c->timer, handle_closed);
		uv_close((uv_handle_t *)c->tcp, handle_closed);
		unref(c);
		return;
	}
	c->refs--; /* the connect request */
	conn_begin(c);
}

static int tp_connect(struct raft_uv_transport *transport, struct raft_uv_connect *req,
		      raft_id id, const char *address, raft_uv_connect_cb cb)
{
	tp *t = transport->impl;
	struct sockaddr_storage sa;
	uv_connect_t *r;
	conn *c;
	(void)id;
	if (parse_addr(address, &sa) != 0) {
		snprintf(transport->errmsg, RAFT_ERRMSG_BUF_SIZE, "bad raft address %s", address);
		return RAFT_NOCONNECTION;
	}
	r = malloc(sizeof *r);
	c = r ? conn_new(t, false) : NULL;
	if (!c) {
		free(r);
		return RAFT_NOMEM;
	}
	snprintf(c->peer, sizeof c->peer, "%s", address);
	req->cb = cb;
	r->data = c;
	if (uv_tcp_connect(r, c->tcp, (struct sockaddr *)&sa, tcp_connect_cb) != 0) {
		free(r);
		c->closing = true;
		uv_close((uv_handle_t *)&c->timer, handle_closed);
		uv_close((uv_handle_t *)c->tcp, handle_closed);
		return RAFT_NOCONNECTION; /* req not kept: cb never fires */
	}
	c->req = req;
	c->status = RAFT_NOCONNECTION;
	c->refs++; /* the connect request */
	return 0;
}

static void listener_closed(uv_handle_t *h)
{
	tp *t = h->data;
	t->listener_open = false;
	maybe_closed(t);
}

static void tp_close(struct raft_uv_transport *transport, raft_uv_transport_close_cb cb)
{
	tp *t = transport->impl;
	t->closing = true;
	t->close_cb = cb;
	if (t->listener_open)
		uv_close((uv_handle_t *)&t->listener, listener_closed);
	for (conn *c = t->conns; c; c = c->next)
		conn_close(c, NULL);
	maybe_closed(t);
}

int sdb_transport_init(struct raft_uv_transport *transport, uv_loop_t *loop,
		       const sdb_transport_opts *opts)
{
	void *data = transport->data;
	tp *t;
	memset(transport, 0, sizeof *transport);
	transport->data = data;
	if (!opts->plaintext && !opts->key && !opts->keys && !opts->tls_ctx) {
		snprintf(transport->errmsg, RAFT_ERRMSG_BUF_SIZE,
			 "the secure transport needs a key or TLS");
		return RAFT_INVALID;
	}
	if (opts->plaintext && (opts->key || opts->keys || opts->tls_ctx)) {
		snprintf(transport->errmsg, RAFT_ERRMSG_BUF_SIZE,
			 "the plaintext transport takes neither a key nor TLS");
		return RAFT_INVALID;
	}
	t = calloc(1, sizeof *t);
	if (!t)
		return RAFT_NOMEM;
	t->transport = transport;
	t->loop = loop;
	if (opts->key) {
		t->has_key = true;
		memcpy(t->key, opts->key, SDB_HS_KEY_LEN);
	}
	t->keys = opts->keys;
	t->keys_arg = opts->keys_arg;
	t->plaintext = opts->plaintext;
	t->peer_ok = opts->peer_ok;
	t->peer_arg = opts->peer_arg;
	t->announce = opts->announce;
	t->tls_ctx = opts->tls_ctx;
	t->tls_arg = opts->tls_arg;
	t->timeout_ms = opts->handshake_timeout_ms ? opts->handshake_timeout_ms : 5000;
	t->max_pending = opts->max_pending ? opts->max_pending : 128;
	t->c_refused = sdb_metrics_counter(
		"stripedb_raft_transport_refused_total",
		"Raft connections closed by the transport: failed TLS or key handshake, "
		"malformed preamble, timeout.",
		NULL);
	transport->impl = t;
	transport->init = tp_init;
	transport->listen = tp_listen;
	transport->connect = tp_connect;
	transport->close = tp_close;
	return 0;
}

void sdb_transport_close(struct raft_uv_transport *transport)
{
	tp *t = transport->impl;
	if (!t)
		return;
	OPENSSL_cleanse(t->key, sizeof t->key);
	free(t->address);
	free(t);
	transport->impl = NULL;
}
