/* The request API of the wire server (wire/server.h): completing a request with a reply or
 * an error, detached requests, a request's fields and waits, a connection's role data.
 * The connections, the loop and the completion path are in server.c. */
#include <assert.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "wire/internal.h"
#include "wire/msg.h"

bool wire__reply_is_ok(const bson_t *reply)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, reply, "ok") && bson_iter_as_bool(&it);
}

void wire_req_reply(wire_req *req, bson_t *reply)
{
	bson_iter_t it;

	if (!reply)
		reply = bson_new();
	if (!bson_iter_init_find(&it, reply, "ok"))
		BSON_APPEND_DOUBLE(reply, "ok", 1.0);
	if (req->reply_extra && wire__reply_is_ok(reply))
		bson_concat(reply, req->reply_extra); /* failCommand's writeConcernError */
	wire__req_complete(req, reply);
}

/* errmsg must be valid UTF-8 (drivers refuse to decode the reply otherwise), but it may
 * quote client bytes cut mid-character by a "%.200s": replace each byte that does not
 * start a valid sequence with '?', in place. */
static void utf8_repair(char *s)
{
	unsigned char *p = (unsigned char *)s;

	while (*p) {
		size_t len = *p < 0x80 ? 1
			     : (*p & 0xE0) == 0xC0 ? 2
			     : (*p & 0xF0) == 0xE0 ? 3
			     : (*p & 0xF8) == 0xF0 ? 4
						   : 0;
		size_t i = 1;

		while (i < len && (p[i] & 0xC0) == 0x80) /* stops at the NUL too */
			i++;
		if (len == 0 || i < len || !bson_utf8_validate((const char *)p, len, false)) {
			*p++ = '?';
			continue;
		}
		p += len;
	}
}

static bson_t *error_doc(int code, bson_t *extra, const char *fmt, va_list ap)
{
	bson_t *doc = bson_new();
	char *msg = bson_strdupv_printf(fmt, ap);

	utf8_repair(msg);

	BSON_APPEND_DOUBLE(doc, "ok", 0.0);
	BSON_APPEND_UTF8(doc, "errmsg", msg);
	BSON_APPEND_INT32(doc, "code", code);
	BSON_APPEND_UTF8(doc, "codeName", wire_code_name(code));
	if (extra) {
		bson_concat(doc, extra);
		bson_destroy(extra);
	}
	bson_free(msg);
	return doc;
}

/* The error of a request killOp marked (wire_req_kill): whatever its handler failed
 * with, mongod's Interrupted (11601) "operation was interrupted" (the error of an
 * OperationContext killed with ErrorCodes::Interrupted at an interruption point); of one
 * past its maxTimeMS (wire_req_expire), MaxTimeMSExpired (50). */
static bson_t *interrupted_doc(const wire_req *req, bson_t *extra)
{
	bson_t *doc = bson_new();
	bool expired = atomic_load(&((wire_req *)req)->killed) == 2;
	int code = expired ? WIRE_ERR_MAX_TIME_EXPIRED : WIRE_ERR_INTERRUPTED;

	if (extra)
		bson_destroy(extra);
	BSON_APPEND_DOUBLE(doc, "ok", 0.0);
	/* an expired request: mongod's MaxTimeMSExpired of an operation past maxTimeMS */
	BSON_APPEND_UTF8(doc, "errmsg",
			 expired ? "operation exceeded time limit" : "operation was interrupted");
	BSON_APPEND_INT32(doc, "code", code);
	BSON_APPEND_UTF8(doc, "codeName", wire_code_name(code));
	return doc;
}

void wire_req_error(wire_req *req, int code, const char *fmt, ...)
{
	va_list ap;
	bson_t *doc;

	if (atomic_load(&req->killed)) {
		wire__req_complete(req, interrupted_doc(req, NULL));
		return;
	}
	va_start(ap, fmt);
	doc = error_doc(code, NULL, fmt, ap);
	va_end(ap);
	wire__req_complete(req, doc);
}

void wire_req_error_extra(wire_req *req, int code, bson_t *extra, const char *fmt, ...)
{
	va_list ap;
	bson_t *doc;

	if (atomic_load(&req->killed)) {
		wire__req_complete(req, interrupted_doc(req, extra));
		return;
	}
	va_start(ap, fmt);
	doc = error_doc(code, extra, fmt, ap);
	va_end(ap);
	wire__req_complete(req, doc);
}

wire_req *wire_req_detached_new(const char *db, const bson_t *cmd)
{
	wire_req *req = sdb_calloc(1, sizeof *req);
	bson_iter_t it;

	req->cmd = bson_copy(cmd);
	wire__req_index_cmd(req);
	req->db = sdb_strdup(db);
	req->name = sdb_strdup(bson_iter_init(&it, cmd) && bson_iter_next(&it)
				       ? bson_iter_key(&it)
				       : "");
	req->op_code = WIRE_OP_MSG;
	req->start_ns = sdb_mono_ns();
	req->opid = wire__next_opid();
	return req;
}

void wire_req_detached_on_done(wire_req *req, void (*cb)(void *arg, wire_req *req), void *arg)
{
	req->detached_done = cb;
	req->detached_arg = arg;
}

bson_t *wire_req_detached_take(wire_req *req)
{
	bson_t *reply = atomic_load(&req->completed) ? req->reply : NULL;

	req->reply = NULL;
	return reply;
}

void wire_req_detached_free(wire_req *req)
{
	if (req)
		wire__req_free(req);
}

const bson_t *wire_req_cmd(const wire_req *req)
{
	return req->cmd;
}

void wire__req_index_cmd(wire_req *req)
{
	bson_iter_t it;
	uint8_t n = 0;

	req->keys_indexed = false;
	if (!bson_iter_init(&it, req->cmd))
		return;
	while (bson_iter_next(&it)) {
		uint32_t klen = bson_iter_key_len(&it);
		if (n == WIRE_REQ_KEYS || klen > UINT16_MAX)
			return; /* too many, or a key too long: lookups walk the command */
		req->key_off[n] = bson_iter_offset(&it);
		req->key_len[n] = (uint16_t)klen;
		n++;
	}
	/* a command whose bytes end early indexes the keys before that point, where
	 * bson_iter_init_find stops too */
	req->n_keys = n;
	req->keys_indexed = true;
}

bool wire_req_cmd_find(const wire_req *req, const char *name, bson_iter_t *it)
{
	if (!req->keys_indexed)
		return bson_iter_init_find(it, req->cmd, name);
	size_t len = strlen(name);
	const uint8_t *data = bson_get_data(req->cmd);
	for (uint8_t i = 0; i < req->n_keys; i++) {
		/* the element: its type byte, then its key */
		if (req->key_len[i] == len && memcmp(data + req->key_off[i] + 1, name, len) == 0)
			return bson_iter_init_from_data_at_offset(it, data, req->cmd->len,
								  req->key_off[i], (uint32_t)len);
	}
	return false;
}

bool wire_req_take_cluster_time(wire_req *req, ct_gossip *g)
{
	char err[256];
	bson_iter_t it;
	int code = ct_take_field(wire_req_cmd_find(req, "$clusterTime", &it) ? &it : NULL, g, err,
				 sizeof err);

	if (code) {
		wire_req_error(req, code, "%s", err);
		return false;
	}
	return true;
}

const char *wire_req_name(const wire_req *req)
{
	return req->name ? req->name : "";
}

const char *wire_req_db(const wire_req *req)
{
	return req->db ? req->db : "";
}

wire_conn *wire_req_conn(const wire_req *req)
{
	return req->conn;
}

uint64_t wire_req_start_ns(const wire_req *req)
{
	return req->start_ns;
}

void wire_req_wait_begin(wire_req *req)
{
	atomic_fetch_add(&req->waiting, 1);
}

void wire_req_wait_end(wire_req *req)
{
	int was = atomic_fetch_sub(&req->waiting, 1);
	assert(was > 0);
	(void)was;
}

/* ---- connections ---- */

void *wire_conn_data(const wire_conn *conn)
{
	return conn->data;
}

void wire_conn_set_data(wire_conn *conn, void *data, void (*free_fn)(void *))
{
	conn->data = data;
	conn->data_free = free_fn;
}

const char *wire_conn_peer(const wire_conn *conn)
{
	return conn->peer;
}

int64_t wire_conn_id(const wire_conn *conn)
{
	return conn->id;
}
