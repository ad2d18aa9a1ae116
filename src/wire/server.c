/* The MongoDB wire protocol server: framing, one request at a time per connection,
 * completion from any thread, graceful close. See server.h for the contract and msg.h for
 * the codec. */
#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/cmdopts.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "wire/internal.h"
#include "wire/msg.h"

#define WIRE_READ_CHUNK (64 * 1024)

static atomic_int_fast64_t next_conn_id = 1;

typedef struct wire_write {
	uv_write_t req;
	wire_conn *conn;
	uint8_t *buf;
} wire_write;

static void srv_maybe_finish(wire_server *srv);
static void conn_start_reading(wire_conn *conn);

/* True while connections are read and their commands dispatched: running, or quiescing
 * (wire_server_close phase 2: commands are read to be refused with ShutdownInProgress). */
static bool srv_reading(const wire_server *srv)
{
	return srv->state == WIRE_SRV_RUNNING ||
	       (srv->state == WIRE_SRV_DRAINING && srv->quiescing);
}

/* ---- connection state machine ---- */

#ifdef SDB_DEBUG
static const bool conn_transitions[3][3] = {
	/* to:            READING BUSY   CLOSING */
	[WIRE_CONN_READING] = {false, true, true},
	[WIRE_CONN_BUSY] = {true, false, true},
	[WIRE_CONN_CLOSING] = {false, false, false},
};
#endif

static void conn_set_state(wire_conn *conn, enum wire_conn_state to)
{
#ifdef SDB_DEBUG
	if (!conn_transitions[conn->state][to]) {
		sdb_error("wire: illegal connection state transition", "conn=%lld from=%d to=%d",
			  (long long)conn->id, (int)conn->state, (int)to);
		abort();
	}
#endif
	conn->state = to;
}

static void conn_unref(wire_conn *conn)
{
	assert(conn->refs > 0);
	if (--conn->refs > 0)
		return;
	if (conn->data_free)
		conn->data_free(conn->data);
	tls_conn_free(conn->tls);
	uv_mutex_destroy(&conn->wmu);
	wire__exhaust_free(conn->exhaust);
	free(conn->rbuf);
	free(conn->out);
	free(conn);
}

/* ---- requests ---- */

static wire_req *req_new(wire_conn *conn, int32_t request_id, int32_t op_code, bool no_reply)
{
	wire_req *req = sdb_calloc(1, sizeof *req);

	req->srv = conn->srv;
	req->conn = conn;
	req->request_id = request_id;
	req->op_code = op_code == WIRE_OP_QUERY ? WIRE_OP_QUERY : WIRE_OP_MSG;
	req->no_reply = no_reply;
	req->start_ns = sdb_mono_ns();
	req->entry = &conn->srv->invalid;
	req->cmd = bson_new();
	atomic_init(&req->completed, 0);
	atomic_init(&req->waiting, 0);
	atomic_init(&req->killed, 0);
	atomic_init(&req->conn_gone, false);
	req->opid = wire__next_opid();
	conn->refs++;
	conn->inflight = req;
	conn->srv->n_outstanding++;
	sdb_gauge_add(conn->srv->m_running, 1);
	conn_set_state(conn, WIRE_CONN_BUSY);
	uv_mutex_lock(&conn->wmu);
	/* not while earlier replies are held (conn->out): they go first */
	conn->direct_ok =
		conn->tls == NULL && conn->writes_pending == 0 && conn->out_len == 0 && !no_reply;
	uv_mutex_unlock(&conn->wmu);
	return req;
}

void wire__req_free(wire_req *req)
{
	bson_destroy(req->cmd);
	if (req->reply)
		bson_destroy(req->reply);
	if (req->reply_extra)
		bson_destroy(req->reply_extra);
	free(req->name);
	free(req->db);
	free(req->out);
	free(req->coll);
	free(req);
}

static void on_finish(uv_idle_t *h);

/* The handler's thread (not the loop): send req's reply on its connection now, when the
 * loop allowed it (conn->direct_ok). Sets req->sent, or leaves in req->out what the loop
 * must write. A failed send is left to the loop's write, which meets the error again
 * and closes the connection. */
static void reply_direct(wire_req *req)
{
	wire_conn *conn = req->conn;

	if (req->no_reply || req->close_after || req->legacy_cursor)
		return;
	uv_mutex_lock(&conn->wmu);
	if (conn->direct_ok && req->op_code == WIRE_OP_MSG &&
	    wire_bson_len(req->reply) <= WIRE_MAX_REPLY_BSON) {
		conn->direct_ok = false;
		wire__reply_send_direct(req);
	} else if (conn->direct_ok) {
		size_t len;
		uint8_t *buf = wire__reply_encode(req, &len);
		ssize_t n;

		conn->direct_ok = false;
		do {
			n = send(conn->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		} while (n < 0 && errno == EINTR);
		if (n > 0) /* the loop counts only what it writes (conn_write_rest) */
			sdb_counter_add(req->srv->m_bytes_out, (uint64_t)n);
		if (n == (ssize_t)len) {
			free(buf);
			req->sent = true;
		} else {
			req->out = buf;
			req->out_len = len;
			req->out_off = n > 0 ? (size_t)n : 0;
		}
	}
	uv_mutex_unlock(&conn->wmu);
}

void wire__req_complete(wire_req *req, bson_t *reply)
{
	wire_server *srv = req->srv;

	if (atomic_fetch_add(&req->completed, 1) != 0) {
		sdb_error("wire: request completed twice", "cmd=%s",
			  req->name ? req->name : "(none)");
		abort();
	}
	if (srv && srv->ct_out && reply)
		srv->ct_out(req, srv->role_data, reply);
	req->reply = reply;
	if (!srv) {
		/* detached: the owner takes the reply, or its completion callback does */
		if (req->detached_done)
			req->detached_done(req->detached_arg, req);
		return;
	}
	/* metrics now, not when the loop finishes the request: a lazily finished one
	 * (reply_direct) may wait for the loop's next wakeup */
	{
		uint64_t ns = sdb_mono_ns() - req->start_ns;
		bool ok = wire__reply_is_ok(reply);

		sdb_gauge_add(srv->m_running, -1);
		sdb_counter_inc(ok ? req->entry->ok : req->entry->error);
		sdb_histogram_observe_ns(req->entry->duration, ns);
		sdb_debug("wire: command done", "conn=%lld cmd=%s db=%s ok=%d us=%llu",
			  (long long)req->conn->id, req->name ? req->name : "(invalid)",
			  req->db ? req->db : "", ok, (unsigned long long)(ns / 1000));
	}
	bool on_loop = false;
	if (srv->loop_thread_known) {
		uv_thread_t self = uv_thread_self();
		on_loop = uv_thread_equal(&self, &srv->loop_thread);
	}
	if (!on_loop)
		reply_direct(req);
	uv_mutex_lock(&srv->mu);
	if (srv->done_tail)
		srv->done_tail->next = req;
	else
		srv->done_head = req;
	srv->done_tail = req;
	if (!on_loop) {
		if (req->sent && srv->lazy_ok && !req->conn->want_done) {
			/* the client has its reply: the loop finishes it when it next wakes */
			atomic_store(&srv->lazy_pending, true);
			uv_mutex_unlock(&srv->mu);
			return;
		}
		/* uv_async_send under the mutex: once the loop thread has seen this request
		 * (and may free the server), this thread no longer touches srv. */
		uv_async_send(&srv->async);
		uv_mutex_unlock(&srv->mu);
		return;
	}
	uv_mutex_unlock(&srv->mu);
	/* on the loop thread: finished by the idle handle (internal.h) */
	if (!srv->finish_active) {
		uv_idle_start(&srv->finish, on_finish);
		srv->finish_active = true;
	}
}

static void on_conn_closed(uv_handle_t *h)
{
	wire_conn *conn = h->data;
	wire_server *srv = conn->srv;

	if (conn->prev)
		conn->prev->next = conn->next;
	else
		srv->conns = conn->next;
	if (conn->next)
		conn->next->prev = conn->prev;
	srv->n_conns--;
	sdb_gauge_add(srv->m_conns, -1);
	sdb_debug("wire: connection closed", "conn=%lld peer=%s", (long long)conn->id, conn->peer);
	conn_unref(conn);
	srv_maybe_finish(srv);
}

void wire__conn_close(wire_conn *conn)
{
	if (conn->state == WIRE_CONN_CLOSING)
		return;
	if (conn->out_len > 0) { /* held replies (conn_write_rest): what the socket takes */
		uv_buf_t held = uv_buf_init((char *)conn->out, (unsigned)conn->out_len);
		(void)uv_try_write((uv_stream_t *)&conn->tcp, &held, 1);
	}
	conn->out_len = 0;
	/* no reply is sent on the socket from here on (reply_direct) */
	uv_mutex_lock(&conn->wmu);
	conn->direct_ok = false;
	uv_mutex_unlock(&conn->wmu);
	conn_set_state(conn, WIRE_CONN_CLOSING);
	conn->reading = false;
	uv_close((uv_handle_t *)&conn->tcp, on_conn_closed);
	wire__hello_cancel_conn(conn->srv, conn);
}

static void out_flush(wire_conn *conn);
static bool conn_next_whole(const wire_conn *conn);

/* Close a connection that has nothing left to do when the server is draining or the
 * connection was marked to close once its reply is written (its held replies written
 * first). */
void wire__conn_maybe_close_idle(wire_conn *conn)
{
	if (conn->state != WIRE_CONN_READING ||
	    !(conn->close_when_idle || !srv_reading(conn->srv)))
		return;
	/* a half-closed client's messages sent before its close_notify run first */
	if (conn->peer_done && srv_reading(conn->srv) && conn_next_whole(conn))
		return;
	out_flush(conn); /* held replies are written first */
	if (conn->state == WIRE_CONN_READING && conn->writes_pending == 0)
		wire__conn_close(conn);
}

static void on_write(uv_write_t *wr, int status)
{
	wire_write *w = (wire_write *)wr;
	wire_conn *conn = w->conn;
	wire_server *srv = conn->srv;

	free(w->buf);
	free(w);
	conn->writes_pending--;
	if (status < 0 && status != UV_ECANCELED) {
		sdb_debug("wire: write failed, closing connection", "conn=%lld peer=%s error=%s",
			  (long long)conn->id, conn->peer, uv_strerror(status));
		wire__conn_close(conn);
	} else {
		wire__conn_maybe_close_idle(conn);
		if (conn->exhaust && conn->writes_pending == 0 && conn->state == WIRE_CONN_READING)
			wire__conn_process(conn); /* the exhaust stream waited for this write */
	}
	(void)srv;
	conn_unref(conn);
}

static void conn_write_rest(wire_conn *conn, uint8_t *buf, size_t len, size_t off);

/* Queue buf (len bytes, heap, taken over) on conn as is. */
void wire__conn_write_raw(wire_conn *conn, uint8_t *buf, size_t len)
{
	conn_write_rest(conn, buf, len, 0);
}

static void conn_send(wire_conn *conn, uint8_t *buf, size_t len, size_t off);

/* Has conn a whole message read and not yet run (a pipelined one)? */
static bool conn_next_whole(const wire_conn *conn)
{
	int32_t mlen;

	if (conn->rlen < 4)
		return false;
	mlen = wire_msg_peek_length(conn->rbuf);
	return wire_msg_length_ok(mlen) && (size_t)mlen <= conn->rlen;
}

/* Write what conn holds (conn->out), if anything. */
static void out_flush(wire_conn *conn)
{
	uint8_t *buf = conn->out;
	size_t len = conn->out_len;

	if (len == 0)
		return;
	conn->out = NULL;
	conn->out_len = conn->out_cap = 0;
	conn_send(conn, buf, len, 0);
}

/* Queue buf[off, len) (buf heap, taken over) on conn as is: the first off bytes went out
 * already (reply_direct). While finish_done runs (srv->batching), a reply followed by a
 * whole pipelined message is held (conn->out) and written with the replies after it, in
 * one send, once the run of pipelined messages ends (a reply with no whole message after
 * it) or the pass does (out_flush_all): a proxy sends its point reads to a shard several
 * on one connection (proxy/forwarder.h), and the shard answers those it runs on its loop
 * in one pass (issue #19). A reply with nothing held and no message after it, every one
 * a client that does not pipeline gets, is written at once, as before. */
static void conn_write_rest(wire_conn *conn, uint8_t *buf, size_t len, size_t off)
{
	wire_server *srv = conn->srv;

	if (!srv->batching || conn->state == WIRE_CONN_CLOSING ||
	    (conn->out_len == 0 && !conn_next_whole(conn))) {
		conn_send(conn, buf, len, off);
		return;
	}
	if (conn->out_cap - conn->out_len < len - off) {
		size_t cap = conn->out_cap ? conn->out_cap : 4096;
		while (cap - conn->out_len < len - off)
			cap *= 2;
		conn->out = sdb_realloc(conn->out, cap);
		conn->out_cap = cap;
	}
	memcpy(conn->out + conn->out_len, buf + off, len - off);
	conn->out_len += len - off;
	free(buf);
	if (!conn_next_whole(conn)) { /* the run ends here */
		out_flush(conn);
		return;
	}
	if (!conn->out_queued) {
		conn->out_queued = true;
		conn->refs++; /* until out_flush_all */
		conn->out_next = srv->out_conns;
		srv->out_conns = conn;
	}
}

/* finish_done's end: write what every connection still holds. */
static void out_flush_all(wire_server *srv)
{
	while (srv->out_conns) {
		wire_conn *conn = srv->out_conns;

		srv->out_conns = conn->out_next;
		conn->out_next = NULL;
		conn->out_queued = false;
		if (conn->state != WIRE_CONN_CLOSING)
			out_flush(conn);
		conn_unref(conn);
	}
}

/* Write buf[off, len) (buf heap, taken over) on conn now, or queue the rest. */
static void conn_send(wire_conn *conn, uint8_t *buf, size_t len, size_t off)
{
	wire_write *w;
	uv_buf_t b;
	int rc;

	if (conn->state == WIRE_CONN_CLOSING) {
		free(buf);
		return;
	}
	/* Written now when the socket takes it all (a reply almost always fits the send
	 * buffer): no write request, so libuv neither queues a completion for the next loop
	 * iteration nor re-arms the socket's epoll registration after it (issue #19: an
	 * epoll_ctl and an extra epoll_wait per reply). libuv refuses (EAGAIN) while earlier
	 * writes are queued, so the order of the bytes holds. */
	rc = uv_try_write((uv_stream_t *)&conn->tcp,
			  &(uv_buf_t){.base = (char *)buf + off, .len = len - off}, 1);
	if (rc == (int)(len - off)) {
		free(buf);
		sdb_counter_add(conn->srv->m_bytes_out, len - off);
		return;
	}
	if (rc < 0 && rc != UV_EAGAIN) {
		sdb_debug("wire: write failed, closing connection", "conn=%lld peer=%s error=%s",
			  (long long)conn->id, conn->peer, uv_strerror(rc));
		free(buf);
		wire__conn_close(conn);
		return;
	}
	size_t done = off + (rc > 0 ? (size_t)rc : 0);
	w = sdb_malloc(sizeof *w);
	w->conn = conn;
	w->buf = buf;
	b = uv_buf_init((char *)buf + done, (unsigned)(len - done));
	rc = uv_write(&w->req, (uv_stream_t *)&conn->tcp, &b, 1, on_write);
	if (rc != 0) {
		sdb_debug("wire: write failed, closing connection", "conn=%lld peer=%s error=%s",
			  (long long)conn->id, conn->peer, uv_strerror(rc));
		free(buf);
		free(w);
		wire__conn_close(conn);
		return;
	}
	conn->refs++;
	conn->writes_pending++;
	sdb_counter_add(conn->srv->m_bytes_out, len - off);
}

/* Loop thread: write req's reply, or what reply_direct left of it. */
static void send_reply(wire_req *req)
{
	size_t len;
	uint8_t *buf;

	if (req->sent)
		return;
	if (req->out) {
		buf = req->out;
		req->out = NULL;
		conn_write_rest(req->conn, buf, req->out_len, req->out_off);
		return;
	}
	buf = wire__reply_encode(req, &len);
	wire__conn_write(req->conn, buf, len);
}

static void finish_done(wire_server *srv);

/* Loop thread: finish every request completed by another thread since the last wakeup. */
static void on_async(uv_async_t *a)
{
	finish_done(a->data);
}

/* Loop thread: finish the requests completed on this thread (req_complete). */
static void on_finish(uv_idle_t *h)
{
	wire_server *srv = h->data;

	uv_idle_stop(&srv->finish);
	srv->finish_active = false;
	finish_done(srv);
}

#define FINISH_ROUNDS 64 /* finish_done's rounds, at most */

/* One round of finish_done: the requests on the done list now. False when it was empty. */
static bool finish_round(wire_server *srv)
{
	wire_req *req, *next;

	uv_mutex_lock(&srv->mu);
	req = srv->done_head;
	srv->done_head = srv->done_tail = NULL;
	for (wire_req *r = req; r; r = r->next)
		r->conn->want_done = false;
	uv_mutex_unlock(&srv->mu);
	if (req == NULL)
		return false;

	for (; req; req = next) {
		wire_conn *conn = req->conn;

		next = req->next;
		srv->n_outstanding--;
		if (conn->inflight == req)
			conn->inflight = NULL;
		conn->watch_eof = false;
		if (conn->state != WIRE_CONN_CLOSING) {
			if (!req->no_reply)
				send_reply(req);
			if (req->close_after) {
				conn->close_when_idle = true;
				conn->peer_done = false; /* nothing more runs */
			}
			if (conn->state == WIRE_CONN_BUSY) {
				conn_set_state(conn, WIRE_CONN_READING);
				wire__conn_maybe_close_idle(conn);
				if (conn->state == WIRE_CONN_READING &&
				    (!conn->close_when_idle || conn->peer_done) && srv_reading(srv))
					wire__conn_process(conn);
			}
		}
		wire__req_free(req);
		conn_unref(conn);
	}
	return true;
}

/* Loop thread: send the replies of every request on the done list, in completion order,
 * and go on reading their connections. A connection's next pipelined message runs then,
 * and when it completes on the loop (a shard's point read) its request is finished in the
 * same pass, its reply held with the one before (conn_write_rest), up to
 * FINISH_ROUNDS rounds, so that a proxy's pipelined reads cost the shard one read and
 * one write of the socket, not one each plus a loop iteration (issue #19). */
static void finish_done(wire_server *srv)
{
	bool outer = srv->batching;

	srv->batching = true;
	for (int round = 0; round < FINISH_ROUNDS && finish_round(srv); round++)
		;
	if (!outer) {
		bool empty;

		out_flush_all(srv);
		srv->batching = false;
		/* what completed on the loop in the last round was finished in it: no idle
		 * round (and no epoll_wait without a timeout) for an empty list */
		uv_mutex_lock(&srv->mu);
		empty = srv->done_head == NULL;
		uv_mutex_unlock(&srv->mu);
		if (empty && srv->finish_active) {
			uv_idle_stop(&srv->finish);
			srv->finish_active = false;
		}
	}
	srv_maybe_finish(srv);
}

/* Loop thread: finish the requests finished lazily (reply_direct) if there are any. Not
 * from inside conn_process: finishing one processes its connection's next message. */
static void srv_finish_lazy(wire_server *srv)
{
	if (atomic_load(&srv->lazy_pending) && atomic_exchange(&srv->lazy_pending, false))
		finish_done(srv);
}

/* Before the loop blocks: the requests finished lazily since it last woke. */
static void on_drain(uv_prepare_t *h)
{
	srv_finish_lazy(h->data);
}

/* Loop thread: conn's request must wake the loop when it completes (its connection has
 * bytes or an EOF waiting), even when its reply goes out from the handler's thread. If it
 * completed already, the idle handle finishes it. */
static void conn_want_done(wire_conn *conn)
{
	wire_server *srv = conn->srv;
	bool queued;

	uv_mutex_lock(&srv->mu);
	conn->want_done = true;
	queued = srv->done_head != NULL;
	uv_mutex_unlock(&srv->mu);
	if (queued && !srv->finish_active) {
		uv_idle_start(&srv->finish, on_finish);
		srv->finish_active = true;
	}
}

/* Answer a message that cannot reach a handler with an error, through the normal
 * completion path so that ordering and metrics are the same as for commands. */
static void reply_error_now(wire_conn *conn, const wire_msg_header *hdr, int32_t op_code,
			    int32_t reply_flags, bool close_after, int code, const char *msg)
{
	wire_req *req = req_new(conn, hdr->request_id, op_code, false);

	req->reply_flags = reply_flags;
	req->close_after = close_after;
	wire_req_error(req, code, "%s", msg);
}

/* Whether ns names commands: "<db>.$cmd". */
static bool is_cmd_namespace(const char *ns)
{
	const char *dot = strchr(ns, '.');

	return dot && strcmp(dot, ".$cmd") == 0;
}

static char *db_from_namespace(const char *ns)
{
	const char *dot = strchr(ns, '.');

	if (!dot || dot == ns || strcmp(dot, ".$cmd") != 0)
		return NULL;
	return sdb_strndup(ns, (size_t)(dot - ns));
}

/* Commands a closing server still runs: they continue work the client already has here
 * (a cursor, a session), so refusing them would surface as an error instead of a retry.
 * hello answers ShutdownInProgress by itself (commands.c). */
static bool refused_at_shutdown(const char *name)
{
	static const char *const allowed[] = {"getMore", "killCursors", "endSessions", "hello",
					      "isMaster", "ismaster"};

	for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
		if (strcmp(name, allowed[i]) == 0)
			return false;
	return true;
}

/* Answer a command that was not executed with ShutdownInProgress (91) and the
 * RetryableWriteError label: drivers of MongoDB 4.4+ retry a write only when the server
 * labels the error (retryable writes spec), and retry reads on code 91. */
static void refuse_shutdown(wire_req *req)
{
	bson_t *extra = bson_new();
	bson_t labels;

	bson_append_array_begin(extra, "errorLabels", -1, &labels);
	BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
	bson_append_array_end(extra, &labels);
	wire__append_topology_version(req->srv, extra);
	sdb_debug("wire: command refused at shutdown", "conn=%lld cmd=%s",
		  (long long)req->conn->id, req->name);
	wire_req_error_extra(req, WIRE_ERR_SHUTDOWN_IN_PROGRESS, extra,
			     "The server is in quiesce mode and will shut down; command '%.100s' "
			     "was not executed",
			     req->name);
}

static void req_dispatch(wire_req *req);

/* Loop thread, conn READING: run the next getMore of the legacy exhaust cursor whose
 * OP_REPLY was just queued (conn->exhaust), as a request answering that reply. */
static void exhaust_next(wire_conn *conn)
{
	wire_exhaust *x = conn->exhaust;
	wire_req *req = req_new(conn, x->response_to, WIRE_OP_QUERY, false);

	conn->exhaust = NULL;
	req->legacy_cursor = true;
	req->exhaust = true;
	req->legacy_batch = x->batch;
	req->starting_from = x->starting_from;
	wire_msg_legacy_get_more(x->cursor_id, x->db, x->coll, x->batch, req->cmd);
	req->db = x->db;
	req->coll = x->coll;
	free(x);
	req_dispatch(req);
}

/* Handle one complete message buf[0 .. len). Loop thread; conn is READING. */
static void handle_message(wire_conn *conn, const uint8_t *buf, size_t len)
{
	wire_msg msg;
	wire_req *req;
	bson_iter_t it;
	char err[256];
	int code = 0;
	int rc;

	rc = wire_msg_parse(buf, len, &msg, &code, err, sizeof err);
	if (rc != 0) {
		bool legacy = msg.hdr.op_code == WIRE_OP_QUERY ||
			      msg.hdr.op_code == WIRE_OP_GET_MORE;
		bool can_reply = (msg.hdr.op_code == WIRE_OP_MSG && !msg.more_to_come &&
				  !(msg.flags & WIRE_MSG_FLAG_MORE_TO_COME)) ||
				 legacy;
		sdb_warn("wire: bad message", "conn=%lld peer=%s op=%d error=\"%s\" action=%s",
			 (long long)conn->id, conn->peer, (int)msg.hdr.op_code, err,
			 can_reply ? "reply" : "close");
		if (can_reply)
			reply_error_now(conn, &msg.hdr, legacy ? WIRE_OP_QUERY : msg.hdr.op_code,
					legacy ? WIRE_REPLY_FLAG_QUERY_FAILURE : 0, false, code,
					err);
		else
			wire__conn_close(conn);
		return;
	}
	if (msg.hdr.op_code == WIRE_OP_COMPRESSED) {
		snprintf(err, sizeof err,
			 "OP_COMPRESSED (compressor %u) is not supported: stripedb offers no "
			 "compression in hello",
			 (unsigned)msg.compressor_id);
		sdb_warn("wire: refused OP_COMPRESSED", "conn=%lld peer=%s", (long long)conn->id,
			 conn->peer);
		reply_error_now(conn, &msg.hdr, WIRE_OP_MSG, 0, false, WIRE_ERR_NOT_IMPLEMENTED, err);
		return;
	}

	if (msg.hdr.op_code == WIRE_OP_GET_MORE ||
	    (msg.hdr.op_code == WIRE_OP_QUERY && !is_cmd_namespace(msg.full_collection_name))) {
		/* a legacy query or getMore: run as find or getMore, answered as OP_REPLY
		 * documents */
		req = req_new(conn, msg.hdr.request_id, WIRE_OP_QUERY, false);
		req->legacy_cursor = true;
		if (msg.hdr.op_code == WIRE_OP_GET_MORE) {
			rc = wire_msg_legacy_get_more_cmd(&msg, req->cmd, &req->db, &req->coll,
							  &code, err, sizeof err);
		} else {
			req->exhaust = msg.query_flags & WIRE_QUERY_FLAG_EXHAUST;
			rc = wire_msg_legacy_find(&msg, req->cmd, &req->db, &req->coll,
						  &req->legacy_batch, &code, err, sizeof err);
			/* mongos refused it (ClusterFind, code 18526): pymongo 3.x does too */
			if (rc == 0 && req->exhaust && conn->srv->is_mongos) {
				rc = SDB_EINVAL;
				code = WIRE_ERR_EXHAUST_ON_MONGOS;
				snprintf(err, sizeof err,
					 "The 'exhaust' query option is invalid for mongos queries: "
					 "%.100s",
					 msg.full_collection_name);
			}
		}
		if (rc != 0) {
			wire_req_error(req, code, "%s", err);
			return;
		}
		req_dispatch(req);
		return;
	}
	req = req_new(conn, msg.hdr.request_id, msg.hdr.op_code, msg.more_to_come);
	rc = wire_msg_command(&msg, req->cmd, &code, err, sizeof err);
	if (rc != 0) {
		if (req->no_reply) {
			req->close_after = true;
			wire_req_reply(req, NULL);
		} else {
			wire_req_error(req, code, "%s", err);
		}
		return;
	}
	if (msg.hdr.op_code == WIRE_OP_QUERY) {
		req->db = db_from_namespace(msg.full_collection_name);
		if (!req->db) {
			req->reply_flags = WIRE_REPLY_FLAG_QUERY_FAILURE;
			wire_req_error(req, WIRE_ERR_INVALID_NAMESPACE,
				       "OP_QUERY: invalid command namespace '%.100s'",
				       msg.full_collection_name);
			return;
		}
	} else {
		wire__req_index_cmd(req);
		if (!wire_req_cmd_find(req, "$db", &it) || !BSON_ITER_HOLDS_UTF8(&it) ||
		    bson_iter_utf8(&it, NULL)[0] == '\0') {
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "OP_MSG requests require a $db argument");
			return;
		}
		req->db = sdb_strdup(bson_iter_utf8(&it, NULL));
	}
	req_dispatch(req);
}

/* Run req (its cmd and db set) through the checks every command passes and its handler:
 * a message's command (handle_message) or an exhaust cursor's getMore (exhaust_next). */
static void req_dispatch(wire_req *req)
{
	wire_server *srv = req->srv;
	wire_cmd_entry *entry;
	bson_iter_t it;
	char err[256];
	int code;

	if (!req->keys_indexed) /* handle_message's did, when it could */
		wire__req_index_cmd(req);
	if (!bson_iter_init(&it, req->cmd) || !bson_iter_next(&it)) {
		wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND, "no command in an empty document");
		return;
	}
	req->name = sdb_strdup(bson_iter_key(&it));
	entry = wire__lookup(srv, req->name);
	req->entry = entry ? entry : &srv->unknown;
	if (srv->state != WIRE_SRV_RUNNING && refused_at_shutdown(req->name)) {
		refuse_shutdown(req);
		return;
	}
	if (srv->gate && !srv->gate(req, srv->role_data))
		return;
	if (entry && srv->ct_in && !srv->ct_in(req, srv->role_data))
		return;
	if (!entry) {
		wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND, "no such command: '%.200s'",
			       req->name);
		return;
	}
	/* a duplicate field (40413), then apiVersion, apiStrict, apiDeprecationErrors: for
	 * every role alike, in one pass over the fields */
	if ((code = sdb_cmd_fields_check(req->name, req->cmd, err, sizeof err)) != 0) {
		wire_req_error(req, code, "%s", err);
		return;
	}
	if (srv->fp && wire__failpoint_intercept(req, entry))
		return;
	entry->fn(req, srv->role_data);
}

/* Consume complete messages from the read buffer while the connection may run one. */
void wire__conn_process(wire_conn *conn)
{
	size_t off = 0;

	/* A legacy exhaust stream goes on before anything the client sent (it only reads),
	 * one reply at a time: the next getMore waits until the socket took the previous
	 * reply (on_write), so a slow reader does not make the server queue the collection. */
	if (conn->exhaust && conn->writes_pending == 0 && conn->state == WIRE_CONN_READING &&
	    srv_reading(conn->srv))
		exhaust_next(conn);
	while (conn->state == WIRE_CONN_READING && !conn->exhaust && srv_reading(conn->srv) &&
	       conn->rlen - off >= 4) {
		int32_t mlen = wire_msg_peek_length(conn->rbuf + off);
		if (!wire_msg_length_ok(mlen)) {
			sdb_warn("wire: invalid messageLength, closing connection",
				 "conn=%lld peer=%s messageLength=%d min=%d max=%d",
				 (long long)conn->id, conn->peer, (int)mlen, WIRE_MSG_HEADER_LEN,
				 WIRE_MAX_MESSAGE_SIZE);
			wire__conn_close(conn);
			return;
		}
		if (conn->rlen - off < (size_t)mlen)
			break;
		handle_message(conn, conn->rbuf + off, (size_t)mlen);
		off += (size_t)mlen;
	}
	if (off > 0) {
		memmove(conn->rbuf, conn->rbuf + off, conn->rlen - off);
		conn->rlen -= off;
	}
	if (conn->rlen == 0) {
		free(conn->rbuf);
		conn->rbuf = NULL;
		conn->rcap = 0;
	}
	if (conn->state == WIRE_CONN_READING) {
		if (conn->exhaust) {
			/* an exhaust stream waits for its reply to be written (on_write): what
			 * the client sends meanwhile stops the read until the stream ends */
			if (conn->reading &&
			    (conn->rlen > 0 || (conn->tls_state == 2 && !conn->watch_eof))) {
				uv_read_stop((uv_stream_t *)&conn->tcp);
				conn->reading = false;
			}
		} else if (!conn->reading && !conn->close_when_idle && srv_reading(conn->srv)) {
			conn_start_reading(conn);
		}
		return;
	}
	if (conn->state != WIRE_CONN_BUSY)
		return;
	/* Busy. A busy plaintext connection is read while nothing is buffered: a client
	 * waits for its reply, so nothing comes, and stopping and restarting the read cost
	 * two epoll_ctl calls per request (issue #19); and a reply sent by the handler's
	 * thread (reply_direct) does not wake the loop: the client's next message does, so
	 * it must be read. Bytes that do come (a pipelined message) stop the read until the
	 * reply, and then the request's end must wake the loop (conn_want_done) to hand the
	 * message over. TLS is not read while busy: a close_notify must not end the session
	 * before its reply is sent. EOF while busy: on_read. */
	if (conn->rlen > 0 || (conn->tls_state == 2 && !conn->watch_eof)) {
		if (conn->reading) {
			uv_read_stop((uv_stream_t *)&conn->tcp);
			conn->reading = false;
		}
		if (conn->rlen > 0)
			conn_want_done(conn);
	} else if (!conn->reading && conn->tls_state != 2 && !conn->close_when_idle &&
		   srv_reading(conn->srv)) {
		conn_start_reading(conn);
	}
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	wire_conn *conn = h->data;
	size_t want = WIRE_READ_CHUNK;

	(void)suggested;
	if (conn->rlen >= 4) {
		int32_t mlen = wire_msg_peek_length(conn->rbuf);
		if (wire_msg_length_ok(mlen) && (size_t)mlen > conn->rlen &&
		    (size_t)mlen - conn->rlen > want)
			want = (size_t)mlen - conn->rlen;
	}
	if (conn->rcap - conn->rlen < want) {
		conn->rcap = conn->rlen + want;
		conn->rbuf = sdb_realloc(conn->rbuf, conn->rcap);
	}
	*buf = uv_buf_init((char *)conn->rbuf + conn->rlen, (unsigned)(conn->rcap - conn->rlen));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	wire_conn *conn = s->data;

	(void)buf;
	if (nread < 0 && conn->state == WIRE_CONN_BUSY) {
		/* its request may be done, its reply sent (reply_direct) */
		srv_finish_lazy(conn->srv);
		if (conn->state == WIRE_CONN_CLOSING)
			return;
	}
	if (nread < 0 && conn->state == WIRE_CONN_BUSY && !conn->watch_eof) {
		/* The client shut down its side (EOF) or reset the connection while its
		 * command runs, as before, when a busy connection was not read: after EOF it
		 * may still read the reply; either way the connection stays in srv->conns
		 * until the reply, so the running command stays in currentOp, killOp finds it
		 * and a stop that times out names it. Read again after the reply, which
		 * meets the EOF again (or the write meets the reset) and closes. A watched
		 * request (watch_eof) is told at once, below. */
		uv_read_stop((uv_stream_t *)&conn->tcp);
		conn->reading = false;
		conn_want_done(conn);
		return;
	}
	if (nread == UV_EOF && conn->state == WIRE_CONN_READING && conn->writes_pending > 0) {
		/* a half-closed client still reads the replies queued for it (one larger than
		 * the socket buffers is partly queued): close once they are written, on_write */
		uv_read_stop((uv_stream_t *)&conn->tcp);
		conn->reading = false;
		conn->close_when_idle = true;
		return;
	}
	if (nread < 0) {
		sdb_debug("wire: peer closed the connection", "conn=%lld peer=%s reason=%s",
			  (long long)conn->id, conn->peer,
			  nread == UV_EOF ? "eof" : uv_strerror((int)nread));
		wire__conn_close(conn);
		wire__conn_gone(conn);
		return;
	}
	if (nread == 0)
		return;
	if (conn->srv->tls_mode != TLS_MODE_DISABLED && !wire__tls_on_read(conn, (size_t)nread))
		return; /* issue #10: TLS consumed the bytes */
	conn->rlen += (size_t)nread;
	sdb_counter_add(conn->srv->m_bytes_in, (uint64_t)nread);
	if (conn->state == WIRE_CONN_BUSY) {
		/* usually the client's next message after a reply sent by the handler's
		 * thread: finish that request first (which processes these bytes) */
		srv_finish_lazy(conn->srv);
		if (conn->state == WIRE_CONN_CLOSING)
			return;
	}
	/* A message whose length is already known to be invalid is refused before more
	 * bytes are buffered. */
	wire__conn_process(conn);
}

static void conn_start_reading(wire_conn *conn)
{
	int rc = uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read);
	if (rc != 0) {
		sdb_debug("wire: read start failed", "conn=%lld error=%s", (long long)conn->id,
			  uv_strerror(rc));
		wire__conn_close(conn);
		return;
	}
	conn->reading = true;
}

/* The client of conn closed it: tell the handler of a watched request in flight. */
void wire__conn_gone(wire_conn *conn)
{
	wire_req *req = conn->inflight;

	if (req == NULL || !req->watch_close || atomic_load(&req->completed))
		return;
	atomic_store(&req->conn_gone, true);
	if (conn->srv->gone)
		conn->srv->gone(req, conn->srv->role_data);
}

void wire_req_watch_close(wire_req *req)
{
	if (req->conn == NULL || req->conn->state != WIRE_CONN_BUSY)
		return;
	req->watch_close = true;
	wire__conn_watch_eof(req->conn);
}

bool wire_req_conn_gone(const wire_req *req)
{
	return atomic_load(&((wire_req *)req)->conn_gone);
}

void wire__conn_watch_eof(wire_conn *conn)
{
	conn->watch_eof = true;
	if (conn->state == WIRE_CONN_BUSY && !conn->reading && conn->rlen == 0)
		conn_start_reading(conn);
}

static void format_peer(uv_tcp_t *tcp, char *out, size_t n)
{
	struct sockaddr_storage ss;
	int len = sizeof ss;
	char host[64] = "?";
	int port = 0;

	if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
			uv_ip4_name(sin, host, sizeof host);
			port = ntohs(sin->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
			uv_ip6_name(sin6, host, sizeof host);
			port = ntohs(sin6->sin6_port);
			snprintf(out, n, "[%s]:%d", host, port);
			return;
		}
	}
	snprintf(out, n, "%s:%d", host, port);
}

static void on_refused_closed(uv_handle_t *h)
{
	free(h);
}

static void on_connection(uv_stream_t *listener, int status)
{
	wire_server *srv = listener->data;
	wire_conn *conn;

	if (status < 0) {
		sdb_warn("wire: accept failed", "error=%s", uv_strerror(status));
		return;
	}
	if (srv->state != WIRE_SRV_RUNNING)
		return;
	if (!srv->loop_thread_known) {
		srv->loop_thread = uv_thread_self();
		srv->loop_thread_known = true;
	}
	if (srv->n_conns >= (size_t)srv->max_connections) {
		uv_tcp_t *t = sdb_malloc(sizeof *t);
		uv_tcp_init(srv->loop, t);
		if (uv_accept(listener, (uv_stream_t *)t) == 0) {
			/* at most one line per second: a runaway client must not flood the log
			 * (the refused counter has the exact number) */
			static _Thread_local uint64_t last_ms;
			static _Thread_local uint64_t suppressed;
			uint64_t now = uv_now(srv->loop);
			if (last_ms == 0 || now - last_ms >= 1000) {
				char peer[64];
				format_peer(t, peer, sizeof peer);
				sdb_warn("wire: connection limit reached, refusing connections",
					 "peer=%s max_connections=%d suppressed=%llu", peer,
					 srv->max_connections, (unsigned long long)suppressed);
				last_ms = now;
				suppressed = 0;
			} else {
				suppressed++;
			}
		}
		sdb_counter_inc(srv->m_refused);
		uv_close((uv_handle_t *)t, on_refused_closed);
		return;
	}
	conn = sdb_calloc(1, sizeof *conn);
	uv_mutex_init(&conn->wmu);
	conn->fd = -1;
	conn->srv = srv;
	conn->id = atomic_fetch_add(&next_conn_id, 1);
	conn->state = WIRE_CONN_READING;
	conn->refs = 1;
	uv_tcp_init(srv->loop, &conn->tcp);
	conn->tcp.data = conn;
	conn->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = conn;
	srv->conns = conn;
	srv->n_conns++;
	sdb_gauge_add(srv->m_conns, 1);
	if (uv_accept(listener, (uv_stream_t *)&conn->tcp) != 0) {
		wire__conn_close(conn);
		return;
	}
	uv_tcp_nodelay(&conn->tcp, 1);
	if (uv_fileno((uv_handle_t *)&conn->tcp, &conn->fd) != 0)
		conn->fd = -1;
	format_peer(&conn->tcp, conn->peer, sizeof conn->peer);
	sdb_debug("wire: connection accepted", "conn=%lld peer=%s", (long long)conn->id,
		  conn->peer);
	conn_start_reading(conn);
}

/* ---- server lifecycle ---- */

static void srv_free(wire_server *srv)
{
	for (size_t i = 0; i < srv->n_cmds; i++) {
		free(srv->cmds[i]->name);
		free(srv->cmds[i]);
	}
	free(srv->cmds);
	wire__failpoint_free(srv->fp);
	wire__ptw_free(srv->ptw);
	uv_mutex_destroy(&srv->mu);
	free(srv->role);
	free(srv);
}

static void on_srv_handle_closed(uv_handle_t *h)
{
	wire_server *srv = h->data;
	void (*cb)(void *);
	void *arg;

	if (--srv->handles_closing > 0)
		return;
	cb = srv->close_cb;
	arg = srv->close_arg;
	sdb_info("wire: server closed", "port=%d", srv->port);
	srv_free(srv);
	if (cb)
		cb(arg);
}

static void on_listener_closed(uv_handle_t *h)
{
	wire_server *srv = h->data;
	srv->listener_open = false;
	srv_maybe_finish(srv);
}

static void srv_maybe_finish(wire_server *srv)
{
	if (srv->state != WIRE_SRV_DRAINING || srv->listener_open || srv->n_conns > 0 ||
	    srv->n_outstanding > 0)
		return;
	srv->state = WIRE_SRV_CLOSING;
	uv_timer_stop(&srv->close_timer);
	srv->handles_closing = 4;
	uv_close((uv_handle_t *)&srv->close_timer, on_srv_handle_closed);
	uv_close((uv_handle_t *)&srv->async, on_srv_handle_closed);
	uv_close((uv_handle_t *)&srv->drain, on_srv_handle_closed); /* stops it */
	uv_close((uv_handle_t *)&srv->finish, on_srv_handle_closed); /* stops it */
	srv->finish_active = false;
}

static void on_close_timeout(uv_timer_t *t);

/* wire_server_close phase 3: stop reading; close idle connections now, busy ones once
 * their reply is written; force-close everything at close_deadline. */
static void srv_drain(wire_server *srv)
{
	wire_conn *conn, *next;
	uint64_t now = uv_now(srv->loop);

	srv->quiescing = false;
	for (conn = srv->conns; conn; conn = next) {
		next = conn->next;
		if (conn->reading) {
			uv_read_stop((uv_stream_t *)&conn->tcp);
			conn->reading = false;
		}
		if (conn->state == WIRE_CONN_READING && conn->writes_pending == 0)
			wire__conn_close(conn);
	}
	uv_timer_start(&srv->close_timer, on_close_timeout,
		       srv->close_deadline > now ? srv->close_deadline - now : 0, 0);
	srv_maybe_finish(srv);
}

static void on_close_timeout(uv_timer_t *t)
{
	wire_server *srv = t->data;
	wire_conn *conn, *next;

	if (srv->quiescing) {
		sdb_info("wire: quiesce period over, draining",
			 "port=%d connections=%zu requests_running=%zu", srv->port, srv->n_conns,
			 srv->n_outstanding);
		srv_drain(srv);
		return;
	}
	/* Finish first what completed and waits for the loop (a reply its handler's thread
	 * sent, finished lazily; one whose wakeup is not handled yet): a reply not written
	 * yet is written before the close. Due before the idle handle when the timeout is
	 * 0. */
	atomic_store(&srv->lazy_pending, false);
	finish_done(srv);
	if (srv->state != WIRE_SRV_DRAINING)
		return; /* that was the last request: srv_maybe_finish closed the server */
	sdb_warn("wire: shutdown timeout, closing connections",
		 "connections=%zu requests_running=%zu", srv->n_conns, srv->n_outstanding);
	for (conn = srv->conns; conn; conn = next) {
		next = conn->next;
		/* a handler that never replies and waits on nothing is a bug: name it (the
		 * integration suite fails the test whose process logs this,
		 * tests/integration/conftest.py); one waiting on another server is slow. One
		 * its handler completed is answered: its thread may have sent the reply and not
		 * yet queued the request (req_complete), so finish_done above did not see it. */
		wire_req *r = conn->inflight;
		if (r != NULL && !atomic_load(&r->completed)) {
			unsigned long long ms = (sdb_mono_ns() - r->start_ns) / 1000000u;
			const char *name = r->name ? r->name : "(invalid)";
			if (atomic_load(&r->waiting) > 0)
				sdb_info("wire: request waiting at shutdown",
					 "port=%d conn=%lld cmd=%s db=%s running_ms=%llu",
					 srv->port, (long long)conn->id, name, r->db ? r->db : "",
					 ms);
			else
				sdb_warn("wire: unanswered request at shutdown",
					 "port=%d conn=%lld cmd=%s db=%s running_ms=%llu",
					 srv->port, (long long)conn->id, name, r->db ? r->db : "",
					 ms);
		}
		wire__conn_close(conn);
	}
}

void wire_server_close(wire_server *srv, uint64_t timeout_ms, void (*cb)(void *arg), void *arg)
{
	uint64_t quiesce = srv->quiesce_ms < timeout_ms ? srv->quiesce_ms : timeout_ms;

	if (srv->state != WIRE_SRV_RUNNING)
		return;
	srv->state = WIRE_SRV_DRAINING;
	/* every completion wakes the loop from here on; the ones finished lazily so far are
	 * finished by the idle handle (not here: this may run inside a command) */
	uv_mutex_lock(&srv->mu);
	srv->lazy_ok = false;
	uv_mutex_unlock(&srv->mu);
	if (atomic_exchange(&srv->lazy_pending, false) && !srv->finish_active) {
		uv_idle_start(&srv->finish, on_finish);
		srv->finish_active = true;
	}
	srv->close_cb = cb;
	srv->close_arg = arg;
	srv->close_deadline = uv_now(srv->loop) + timeout_ms;
	sdb_info("wire: server closing",
		 "port=%d connections=%zu requests_running=%zu quiesce_ms=%llu", srv->port,
		 srv->n_conns, srv->n_outstanding, (unsigned long long)quiesce);
	uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
	/* SDAM: a changed topologyVersion and a ShutdownInProgress hello tell drivers now */
	srv->topology_counter++;
	wire__hello_flush(srv);
	if (quiesce > 0) {
		srv->quiescing = true;
		uv_timer_start(&srv->close_timer, on_close_timeout, quiesce, 0);
		srv_maybe_finish(srv);
		return;
	}
	srv_drain(srv);
}

/* Split "HOST:PORT" / "[V6]:PORT" and resolve into *sa. */
static int parse_listen(const char *addr, struct sockaddr_storage *sa, char *err, size_t errlen)
{
	char host[256];
	const char *colon, *hs = addr;
	size_t hl;
	char *end;
	long port;
	struct addrinfo hints, *res = NULL;
	int rc;

	if (!addr || !*addr)
		return sdb_errf(err, errlen, SDB_EINVAL, "empty listen address");
	colon = strrchr(addr, ':');
	if (!colon)
		return sdb_errf(err, errlen, SDB_EINVAL, "listen address '%s' is not HOST:PORT",
				addr);
	hl = (size_t)(colon - addr);
	if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
		hs = addr + 1;
		hl -= 2;
	}
	if (hl == 0 || hl >= sizeof host)
		return sdb_errf(err, errlen, SDB_EINVAL, "listen address '%s': bad host", addr);
	memcpy(host, hs, hl);
	host[hl] = '\0';
	port = strtol(colon + 1, &end, 10);
	if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535)
		return sdb_errf(err, errlen, SDB_EINVAL, "listen address '%s': bad port", addr);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc != 0 || !res)
		return sdb_errf(err, errlen, SDB_EINVAL, "listen address '%s': %s", addr,
				gai_strerror(rc));
	memset(sa, 0, sizeof *sa);
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	if (sa->ss_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)sa)->sin6_port = htons((uint16_t)port);
	return 0;
}

static void on_failed_listener_closed(uv_handle_t *h)
{
	srv_free(h->data);
}

static const sdb_metric_def server_metrics[] = {
	SDB_METRIC_GAUGE(wire_server, m_conns, "stripedb_wire_connections",
			 "Open wire protocol client connections."),
	SDB_METRIC_COUNTER(wire_server, m_bytes_in, "stripedb_wire_bytes_in_total",
			   "Bytes read from wire protocol clients."),
	SDB_METRIC_COUNTER(wire_server, m_bytes_out, "stripedb_wire_bytes_out_total",
			   "Bytes written to wire protocol clients."),
	SDB_METRIC_COUNTER(wire_server, m_refused, "stripedb_wire_connections_refused_total",
			   "Connections refused because max-connections was reached."),
	SDB_METRIC_GAUGE(wire_server, m_running, "stripedb_wire_requests_running",
			 "Wire protocol requests received and not answered yet."),
};

int wire_server_new(uv_loop_t *loop, const wire_server_opts *opts, wire_server **out, char *err,
		    size_t errlen)
{
	struct sockaddr_storage sa;
	struct sockaddr_storage bound;
	int blen = sizeof bound;
	wire_server *srv;
	int rc;

	*out = NULL;
	rc = parse_listen(opts->listen, &sa, err, errlen);
	if (rc != 0)
		return rc;

	srv = sdb_calloc(1, sizeof *srv);
	srv->loop = loop;
	srv->role = sdb_strdup(opts->role ? opts->role : "unknown");
	srv->max_connections = opts->max_connections > 0 ? opts->max_connections : 10000;
	srv->role_data = opts->role_data;
	srv->hello = opts->hello;
	srv->ct_in = opts->ct_in;
	srv->ct_out = opts->ct_out;
	srv->gone = opts->gone;
	srv->gate = opts->gate;
	srv->tls = opts->tls;
	srv->tls_mode = opts->tls ? tls_listener_get_mode(opts->tls) : TLS_MODE_DISABLED;
	srv->is_mongos = opts->is_mongos;
	srv->fp = opts->test_commands ? wire__failpoint_new() : NULL;
	srv->ptw = opts->test_commands && !opts->is_mongos ? wire__ptw_new() : NULL;
	srv->quiesce_ms = opts->quiesce_ms;
	bson_oid_init(&srv->process_id, NULL);
	uv_mutex_init(&srv->mu);

	uv_tcp_init(loop, &srv->listener);
	srv->listener.data = srv;
	rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&sa, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
	if (rc != 0) {
		sdb_errf(err, errlen, SDB_EIO, "listen on %s: %s", opts->listen, uv_strerror(rc));
		uv_close((uv_handle_t *)&srv->listener, on_failed_listener_closed);
		return SDB_EIO;
	}
	srv->listener_open = true;
	if (uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &blen) == 0)
		srv->port = ntohs(bound.ss_family == AF_INET
					  ? ((struct sockaddr_in *)&bound)->sin_port
					  : ((struct sockaddr_in6 *)&bound)->sin6_port);

	uv_async_init(loop, &srv->async, on_async);
	srv->async.data = srv;
	uv_idle_init(loop, &srv->finish);
	srv->finish.data = srv;
	srv->lazy_ok = true;
	atomic_init(&srv->lazy_pending, false);
	uv_prepare_init(loop, &srv->drain);
	srv->drain.data = srv;
	uv_prepare_start(&srv->drain, on_drain);
	uv_timer_init(loop, &srv->close_timer);
	srv->close_timer.data = srv;

	{
		char labels[128];
		snprintf(labels, sizeof labels, "role=\"%s\"", srv->role);
		SDB_METRICS_REGISTER(srv, server_metrics, labels);
	}
	wire__entry_init_metrics(srv, &srv->unknown, "unknown");
	wire__entry_init_metrics(srv, &srv->invalid, "invalid");
	wire__register_builtins(srv);

	sdb_info("wire: listening", "addr=%s port=%d", opts->listen, srv->port);
	*out = srv;
	return 0;
}

int wire_server_port(const wire_server *srv)
{
	return srv->port;
}
