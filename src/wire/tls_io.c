/* A wire connection's TLS (issue #10): TLS through memory BIOs (src/tls/tls.h), the
 * session's bytes read and written by the wire server (server.c). Loop thread only. See
 * wire/internal.h. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/metrics.h"
#include "wire/internal.h"

typedef struct tls_out {
	uint8_t *buf;
	size_t len, cap;
} tls_out;

static void tls_collect(void *arg, const uint8_t *data, size_t len)
{
	tls_out *o = arg;
	if (o->cap - o->len < len) {
		o->cap = (o->len + len) * 2;
		o->buf = sdb_realloc(o->buf, o->cap);
	}
	memcpy(o->buf + o->len, data, len);
	o->len += len;
}

typedef struct tls_rx {
	wire_conn *conn;
	tls_out out; /* handshake bytes to send */
} tls_rx;

static void tls_rx_send(void *arg, const uint8_t *data, size_t len)
{
	tls_collect(&((tls_rx *)arg)->out, data, len);
}

/* Append decrypted bytes to the read buffer. */
static void tls_plain(void *arg, const uint8_t *data, size_t len)
{
	wire_conn *conn = ((tls_rx *)arg)->conn;
	if (conn->rcap - conn->rlen < len) {
		conn->rcap = conn->rlen + len;
		conn->rbuf = sdb_realloc(conn->rbuf, conn->rcap);
	}
	memcpy(conn->rbuf + conn->rlen, data, len);
	conn->rlen += len;
}

/* nread bytes just arrived at rbuf + rlen. Returns true when they are plaintext for the
 * normal path; false when TLS consumed them (or the connection was closed). */
bool wire__tls_on_read(wire_conn *conn, size_t nread)
{
	uint8_t *cipher;
	tls_rx rx = {conn, {0}};
	int rc;

	if (conn->tls_state == 0) {
		if (conn->rbuf[conn->rlen] == 0x16) { /* TLS handshake record */
			conn->tls = tls_conn_new(conn->srv->tls);
			conn->tls_state = conn->tls ? 2 : 1;
		} else {
			conn->tls_state = 1;
		}
		if (conn->tls_state == 1 && conn->srv->tls_mode == TLS_MODE_REQUIRED) {
			sdb_warn("wire: plaintext connection refused (--tls-mode=required)",
				 "conn=%lld peer=%s", (long long)conn->id, conn->peer);
			wire__conn_close(conn);
			return false;
		}
	}
	if (conn->tls_state == 1)
		return true;
	cipher = sdb_malloc(nread);
	memcpy(cipher, conn->rbuf + conn->rlen, nread);
	sdb_counter_add(conn->srv->m_bytes_in, (uint64_t)nread);
	rc = tls_conn_feed(conn->tls, cipher, nread, tls_plain, tls_rx_send, &rx);
	free(cipher);
	if (rx.out.len)
		wire__conn_write_raw(conn, rx.out.buf, rx.out.len);
	else
		free(rx.out.buf);
	if (rc < 0) {
		sdb_debug("wire: TLS session failed, closing connection", "conn=%lld peer=%s",
			  (long long)conn->id, conn->peer);
		wire__conn_close(conn);
		wire__conn_gone(conn);
		return false;
	}
	wire__conn_process(conn); /* what came before a close_notify runs */
	if (rc == 1 && conn->state != WIRE_CONN_CLOSING) {
		/* close_notify: the client sends nothing more, as at a plaintext EOF. It still
		 * gets the replies of what it sent, queued or to come: the connection closes
		 * once they are written (a reply larger than the socket buffers was cut). A
		 * watched request (awaitable hello) is told at once. */
		sdb_debug("wire: TLS close_notify", "conn=%lld peer=%s", (long long)conn->id,
			  conn->peer);
		if (conn->reading) {
			uv_read_stop((uv_stream_t *)&conn->tcp);
			conn->reading = false;
		}
		conn->close_when_idle = true;
		conn->peer_done = true; /* what it sent before still runs (finish_round) */
		if (conn->state == WIRE_CONN_BUSY && conn->watch_eof) {
			wire__conn_close(conn);
			wire__conn_gone(conn);
			return false;
		}
		wire__conn_maybe_close_idle(conn);
	}
	return false;
}

/* Queue buf (len bytes, heap, taken over) on conn, encrypted when the connection is TLS. */
void wire__conn_write(wire_conn *conn, uint8_t *buf, size_t len)
{
	tls_out out = {0};

	if (conn->tls_state != 2) {
		wire__conn_write_raw(conn, buf, len);
		return;
	}
	if (conn->state == WIRE_CONN_CLOSING ||
	    tls_conn_write(conn->tls, buf, len, tls_collect, &out) != 0) {
		free(buf);
		free(out.buf);
		if (conn->state != WIRE_CONN_CLOSING)
			wire__conn_close(conn);
		return;
	}
	free(buf);
	wire__conn_write_raw(conn, out.buf, out.len);
}
