/* A request's reply as bytes on the wire: OP_MSG and OP_REPLY encoding (msg.h), a
 * legacy cursor's exhaust stream armed by its reply, and the handler thread's own send of
 * an OP_MSG without a copy. The connection's output around them is server.c's. See
 * wire/internal.h. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/metrics.h"
#include "wire/internal.h"
#include "wire/msg.h"

/* requestID of the replies this process sends (any thread) */
static atomic_int next_request_id = 1;

void wire__exhaust_free(wire_exhaust *x)
{
	if (!x)
		return;
	free(x->db);
	free(x->coll);
	free(x);
}

/* The OP_REPLY of a legacy query or exhaust getMore (req->legacy_cursor), sent as
 * requestID rid; arms the connection's next exhaust getMore when the cursor goes on. */
static uint8_t *legacy_cursor_reply(wire_req *req, int32_t rid, const bson_t *reply,
				    size_t *len)
{
	int64_t cursor_id;
	int32_t n;
	uint8_t *buf = wire_msg_encode_cursor_reply(rid, req->request_id,
						    WIRE_REPLY_FLAG_AWAIT_CAPABLE,
						    req->starting_from, reply, &cursor_id, &n, len);

	if (req->exhaust && cursor_id != 0) {
		wire_exhaust *x = sdb_calloc(1, sizeof *x);
		x->cursor_id = cursor_id;
		x->response_to = rid;
		x->batch = req->legacy_batch;
		x->starting_from = req->starting_from + n;
		x->db = sdb_strdup(req->db);
		x->coll = sdb_strdup(req->coll);
		wire__exhaust_free(req->conn->exhaust);
		req->conn->exhaust = x;
	}
	return buf;
}

/* req's reply as a message (heap, *len bytes): OP_REPLY to an OP_QUERY, else OP_MSG; one
 * over maxBsonObjectSize becomes a BSONObjectTooLarge error. Any thread, but a legacy
 * cursor's reply (it arms the connection's exhaust stream) on the loop's only. */
uint8_t *wire__reply_encode(wire_req *req, size_t *len)
{
	wire_conn *conn = req->conn;
	bson_t *reply = req->reply;
	bson_t *big = NULL;
	uint8_t *buf;
	int32_t rid = atomic_fetch_add(&next_request_id, 1);

	if (wire_bson_len(reply) > WIRE_MAX_REPLY_BSON) {
		char msg[160];
		snprintf(msg, sizeof msg, "reply of %u bytes is over maxBsonObjectSize %d",
			 (unsigned)wire_bson_len(reply), WIRE_MAX_BSON_SIZE);
		big = BCON_NEW("ok", BCON_DOUBLE(0.0), "errmsg", BCON_UTF8(msg), "code",
			       BCON_INT32(WIRE_ERR_BSON_TOO_LARGE), "codeName",
			       BCON_UTF8(wire_code_name(WIRE_ERR_BSON_TOO_LARGE)));
		sdb_warn("wire: reply too large", "conn=%lld cmd=%s bytes=%u", (long long)conn->id,
			 wire_req_name(req), (unsigned)wire_bson_len(reply));
		reply = big;
	}
	if (req->legacy_cursor)
		buf = legacy_cursor_reply(req, rid, reply, len);
	else if (req->op_code == WIRE_OP_QUERY)
		buf = wire_msg_encode_reply(rid, req->request_id,
					    req->reply_flags | WIRE_REPLY_FLAG_AWAIT_CAPABLE, reply,
					    len);
	else
		buf = wire_msg_encode_msg(rid, req->request_id, 0, reply, len);
	if (big)
		bson_destroy(big);
	return buf;
}

/* server.c reply_direct's OP_MSG (req->reply within WIRE_MAX_REPLY_BSON; conn->wmu held): the
 * message's prefix and the reply's own bytes in one sendmsg, without copying the reply
 * into a message first (a scan's batch: that copy was 3.7% of the proxy's CPU under YCSB
 * E, issue #19). What the socket did not take is copied into req->out for the loop. The
 * bytes are wire_msg_encode_msg's. */
void wire__reply_send_direct(wire_req *req)
{
	wire_conn *conn = req->conn;
	uint32_t blen = wire_bson_len(req->reply);
	size_t len = WIRE_MSG_PREFIX_LEN + blen;
	uint8_t prefix[WIRE_MSG_PREFIX_LEN];
	struct iovec iov[2];
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	ssize_t n;

	wire_msg_encode_msg_prefix(prefix, atomic_fetch_add(&next_request_id, 1),
				   req->request_id, 0, blen);
	iov[0].iov_base = prefix;
	iov[0].iov_len = sizeof prefix;
	iov[1].iov_base = (void *)bson_get_data(req->reply);
	iov[1].iov_len = blen;
	do {
		n = sendmsg(conn->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	if (n > 0) /* the loop counts only what it writes (conn_write_rest) */
		sdb_counter_add(req->srv->m_bytes_out, (uint64_t)n);
	if (n == (ssize_t)len) {
		req->sent = true;
		return;
	}
	req->out = sdb_malloc(len);
	memcpy(req->out, prefix, sizeof prefix);
	memcpy(req->out + sizeof prefix, bson_get_data(req->reply), blen);
	req->out_len = len;
	req->out_off = n > 0 ? (size_t)n : 0;
}
