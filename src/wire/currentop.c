/* Running operations of a wire server, for currentOp / killOp (issue #20): every request
 * read from a client is an operation (conn->inflight) with an opid; this file describes them
 * as mongod's CurOp::reportState does (src/mongo/db/curop.cpp, current_op_common.cpp) and
 * finds one by opid for killOp. The roles own the commands (src/shard/currentop.c,
 * src/proxy/currentop.c): filters, authorization, the proxy's aggregation over shards. */
#ifdef HAVE_CONFIG_H
#include "build_config.h"
#endif

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "wire/internal.h"

/* mongod's truncateOps limit: a command over this many bytes is reported truncated */
#define CUROP_MAX_COMMAND 1000

static atomic_int next_opid = 1;

int32_t wire__next_opid(void)
{
	int id = atomic_fetch_add(&next_opid, 1);

	if (id <= 0) { /* wrapped: start again at 1 */
		atomic_store(&next_opid, 2);
		id = 1;
	}
	return (int32_t)id;
}

int32_t wire_req_opid(const wire_req *req)
{
	return req->opid;
}

bool wire_req_killed(const wire_req *req)
{
	return atomic_load(&((wire_req *)req)->killed) != 0;
}

void wire_req_kill(wire_req *req)
{
	int none = 0;

	/* 1: killOp; an expired request (2) becomes Interrupted too only if not yet marked */
	atomic_compare_exchange_strong(&req->killed, &none, 1);
}

void wire_req_expire(wire_req *req)
{
	int none = 0;

	atomic_compare_exchange_strong(&req->killed, &none, 2);
}

wire_req *wire_server_find_op(wire_server *srv, int32_t opid)
{
	for (wire_conn *c = srv->conns; c; c = c->next) {
		wire_req *r = c->inflight;
		if (r && r->name && r->opid == opid && !atomic_load(&r->completed))
			return r;
	}
	return NULL;
}

/* mongod's logical op of a command (CurOp::setLogicalOp by the command): find "query",
 * getMore "getmore", insert/update/delete, every other command "command". */
static const char *op_type(const char *name)
{
	if (strcmp(name, "find") == 0)
		return "query";
	if (strcmp(name, "getMore") == 0)
		return "getmore";
	if (strcmp(name, "insert") == 0)
		return "insert";
	if (strcmp(name, "update") == 0)
		return "update";
	if (strcmp(name, "delete") == 0)
		return "remove";
	return "command";
}

/* "db.coll" when the command names a collection (its first value is a non-empty string;
 * getMore: its `collection`), else "db.$cmd". */
static void op_ns(const wire_req *r, char *ns, size_t len)
{
	bson_iter_t it;
	const char *coll = NULL;

	if (strcmp(r->name, "getMore") == 0) {
		if (bson_iter_init_find(&it, r->cmd, "collection") && BSON_ITER_HOLDS_UTF8(&it))
			coll = bson_iter_utf8(&it, NULL);
	} else if (bson_iter_init(&it, r->cmd) && bson_iter_next(&it) &&
		   BSON_ITER_HOLDS_UTF8(&it)) {
		coll = bson_iter_utf8(&it, NULL);
	}
	snprintf(ns, len, "%s.%s", r->db ? r->db : "", coll && coll[0] ? coll : "$cmd");
}

/* The command as mongod's CurOp::appendAsObjOrString reports it. */
static void append_command(bson_t *op, const bson_t *cmd, bool truncate)
{
	bson_t t;
	bson_iter_t it;
	char *json;
	size_t n;

	if (!truncate || cmd->len <= CUROP_MAX_COMMAND) {
		BSON_APPEND_DOCUMENT(op, "command", cmd);
		return;
	}
	json = bson_as_relaxed_extended_json(cmd, &n);
	if (!json) {
		json = bson_strdup("{...}");
		n = strlen(json);
	}
	if (n > CUROP_MAX_COMMAND) {
		size_t cut = CUROP_MAX_COMMAND - 3;
		/* do not cut a UTF-8 sequence in two */
		while (cut > 0 && ((unsigned char)json[cut] & 0xC0) == 0x80)
			cut--;
		memcpy(json + cut, "...", 4);
	}
	BSON_APPEND_DOCUMENT_BEGIN(op, "command", &t);
	BSON_APPEND_UTF8(&t, "$truncated", json);
	if (bson_iter_init_find(&it, cmd, "comment"))
		bson_append_iter(&t, "comment", -1, &it);
	bson_append_document_end(op, &t);
	bson_free(json);
}

/* A multi-document transaction's statement: transaction.parameters as mongod reports them
 * (TransactionParticipant::reportStashedState, in part). */
static void append_txn(bson_t *op, const bson_t *cmd)
{
	bson_iter_t it, ac;
	bson_t t, p;

	if (!bson_iter_init_find(&ac, cmd, "autocommit") ||
	    !bson_iter_init_find(&it, cmd, "txnNumber"))
		return;
	BSON_APPEND_DOCUMENT_BEGIN(op, "transaction", &t);
	BSON_APPEND_DOCUMENT_BEGIN(&t, "parameters", &p);
	bson_append_iter(&p, "txnNumber", -1, &it);
	bson_append_iter(&p, "autocommit", -1, &ac);
	bson_append_document_end(&t, &p);
	bson_append_document_end(op, &t);
}

void wire_server_each_op(wire_server *srv, const wire_op_opts *o)
{
	char host[256], hp[320], desc[32], ns[512];
	uint64_t now = sdb_mono_ns();

	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "localhost");
	host[sizeof host - 1] = '\0';
	snprintf(hp, sizeof hp, "%s:%d", host, srv->port);
	for (wire_conn *c = srv->conns; c; c = c->next) {
		wire_req *r = c->inflight;
		bool active = r && r->name && !atomic_load(&r->completed);
		bson_t op = BSON_INITIALIZER;
		bson_iter_t it;

		if (!active && !o->idle)
			continue;
		BSON_APPEND_UTF8(&op, "type", active ? "op" : "idleConnection");
		BSON_APPEND_UTF8(&op, "host", hp);
		snprintf(desc, sizeof desc, "conn%lld", (long long)c->id);
		BSON_APPEND_UTF8(&op, "desc", desc);
		BSON_APPEND_INT64(&op, "connectionId", c->id);
		BSON_APPEND_UTF8(&op, "client", c->peer);
		BSON_APPEND_BOOL(&op, "active", active);
		if (active) {
			uint64_t us = now > r->start_ns ? (now - r->start_ns) / 1000u : 0;
			BSON_APPEND_BOOL(&op, "threaded", true);
			BSON_APPEND_INT32(&op, "opid", r->opid);
			if (bson_iter_init_find(&it, r->cmd, "lsid"))
				bson_append_iter(&op, "lsid", -1, &it);
			append_txn(&op, r->cmd);
			BSON_APPEND_INT64(&op, "secs_running", (int64_t)(us / 1000000u));
			BSON_APPEND_INT64(&op, "microsecs_running", (int64_t)us);
			BSON_APPEND_UTF8(&op, "op", op_type(r->name));
			op_ns(r, ns, sizeof ns);
			BSON_APPEND_UTF8(&op, "ns", ns);
			append_command(&op, r->cmd, o->truncate);
			BSON_APPEND_INT32(&op, "numYields", 0);
			bson_t locks;
			BSON_APPEND_DOCUMENT_BEGIN(&op, "locks", &locks);
			bson_append_document_end(&op, &locks);
			BSON_APPEND_BOOL(&op, "waitingForLock", false);
			if (atomic_load(&r->killed))
				BSON_APPEND_BOOL(&op, "killPending", true);
		}
		if (o->decorate)
			o->decorate(o->arg, c, &op);
		o->each(o->arg, c, &op);
		bson_destroy(&op);
	}
}
