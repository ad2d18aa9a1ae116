/* relay_floor: the cheapest possible event-driven proxy, for a floor under the proxy's cost
 * per request (issue #19, tests/bench/README.md "The floor of an event-driven proxy").
 *
 *   tests/bench/relay_floor LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT
 *
 * One libuv loop on one thread. For each accepted client connection it opens one
 * connection to the upstream (a shard) and copies bytes both ways as they come: no
 * parsing, no routing, no authentication, no thread hand-off. What it costs per request
 * (a client read, an upstream write, an upstream read, a client write and the loop's
 * epoll_wait) is what any proxy built on the same loop pays at least, whatever it does
 * besides; tests/bench/proxy_floor.py runs it beside the shard direct and the stripedb
 * proxy. Listens on 127.0.0.1 only; runs until killed. Exits 2 with one line on stderr on
 * bad arguments or when it cannot listen. Not part of stripedb: a measuring tool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* One side of a relayed pair: its socket, and the other side's. A pair is freed once both
 * handles are closed (refs counts the open ones). */
typedef struct side {
	uv_tcp_t tcp;
	struct side *peer;
	int *refs;
	char buf[65536];
} side;

static uv_loop_t *loop;
static struct sockaddr_in upstream;

static void on_closed(uv_handle_t *h)
{
	side *s = h->data;
	if (--*s->refs == 0) {
		free(s->refs);
		free(s->peer);
		free(s);
	}
}

static void close_pair(side *s)
{
	if (!uv_is_closing((uv_handle_t *)&s->tcp))
		uv_close((uv_handle_t *)&s->tcp, on_closed);
	if (s->peer && !uv_is_closing((uv_handle_t *)&s->peer->tcp))
		uv_close((uv_handle_t *)&s->peer->tcp, on_closed);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	side *s = h->data;
	(void)hint;
	*b = uv_buf_init(s->buf, sizeof s->buf);
}

typedef struct wreq {
	uv_write_t w;
	side *from;
	char data[];
} wreq;

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

static void on_written(uv_write_t *w, int status)
{
	wreq *r = (wreq *)w;
	side *from = r->from;
	free(r);
	if (status < 0) {
		close_pair(from);
		return;
	}
	/* the peer took the rest: read from this side again */
	if (!uv_is_closing((uv_handle_t *)&from->tcp))
		uv_read_start((uv_stream_t *)&from->tcp, on_alloc, on_read);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
	side *s = st->data;
	(void)b;
	if (n == 0)
		return;
	if (n < 0) {
		close_pair(s);
		return;
	}
	uv_buf_t out = uv_buf_init(s->buf, (unsigned)n);
	int w = uv_try_write((uv_stream_t *)&s->peer->tcp, &out, 1);
	if (w == n)
		return;
	if (w < 0 && w != UV_EAGAIN) {
		close_pair(s);
		return;
	}
	/* the rest goes through a queued write; stop reading this side until it is written */
	size_t done = w > 0 ? (size_t)w : 0, rest = (size_t)n - done;
	wreq *r = malloc(sizeof *r + rest);
	if (r == NULL) {
		close_pair(s);
		return;
	}
	memcpy(r->data, s->buf + done, rest);
	r->from = s;
	uv_read_stop(st);
	out = uv_buf_init(r->data, (unsigned)rest);
	if (uv_write(&r->w, (uv_stream_t *)&s->peer->tcp, &out, 1, on_written) != 0) {
		free(r);
		close_pair(s);
	}
}

static void on_upstream(uv_connect_t *c, int status)
{
	side *up = c->data;
	free(c);
	if (status < 0) {
		fprintf(stderr, "relay_floor: upstream connect: %s\n", uv_strerror(status));
		close_pair(up);
		return;
	}
	uv_tcp_nodelay(&up->tcp, 1);
	uv_read_start((uv_stream_t *)&up->tcp, on_alloc, on_read);
	uv_read_start((uv_stream_t *)&up->peer->tcp, on_alloc, on_read);
}

static void on_accept(uv_stream_t *srv, int status)
{
	if (status < 0)
		return;
	side *cl = calloc(1, sizeof *cl), *up = calloc(1, sizeof *up);
	int *refs = malloc(sizeof *refs);
	uv_connect_t *c = malloc(sizeof *c);
	if (!cl || !up || !refs || !c) {
		fprintf(stderr, "relay_floor: out of memory\n");
		exit(2);
	}
	*refs = 2;
	cl->peer = up;
	up->peer = cl;
	cl->refs = up->refs = refs;
	uv_tcp_init(loop, &cl->tcp);
	uv_tcp_init(loop, &up->tcp);
	cl->tcp.data = cl;
	up->tcp.data = up;
	if (uv_accept(srv, (uv_stream_t *)&cl->tcp) != 0) {
		free(c);
		close_pair(cl);
		return;
	}
	uv_tcp_nodelay(&cl->tcp, 1);
	c->data = up;
	if (uv_tcp_connect(c, &up->tcp, (const struct sockaddr *)&upstream, on_upstream) != 0) {
		free(c);
		close_pair(cl);
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in addr;
	uv_tcp_t srv;
	int rc;

	if (argc != 4 || atoi(argv[1]) <= 0 || atoi(argv[3]) <= 0) {
		fprintf(stderr, "usage: relay_floor LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT\n");
		return 2;
	}
	if (uv_ip4_addr(argv[2], atoi(argv[3]), &upstream) != 0) {
		fprintf(stderr, "relay_floor: bad upstream host %s\n", argv[2]);
		return 2;
	}
	loop = uv_default_loop();
	uv_ip4_addr("127.0.0.1", atoi(argv[1]), &addr);
	uv_tcp_init(loop, &srv);
	if ((rc = uv_tcp_bind(&srv, (const struct sockaddr *)&addr, 0)) != 0 ||
	    (rc = uv_listen((uv_stream_t *)&srv, 128, on_accept)) != 0) {
		fprintf(stderr, "relay_floor: listen on 127.0.0.1:%s: %s\n", argv[1], uv_strerror(rc));
		return 2;
	}
	return uv_run(loop, UV_RUN_DEFAULT);
}
