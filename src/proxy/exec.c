/* The proxy's job runner and shared helpers (issue #6, split by concern in issue #24):
 * every routed command is submitted to a worker thread (shardconn_submit), checked
 * (transactions, unsupported options, retryable-write fields, admission, collection
 * policy) and dispatched to its handler in read.c, write.c, admin.c or explain.c.
 *
 * Version gating (DESIGN.md §5, §6 step 5): every request for a sharded collection is sent
 * PER CHUNK with `$stripedbVersion: {chunk: ID, token: N}`, so a shard that no longer owns
 * the chunk (or owns a newer version of it) refuses it with StaleConfig before applying
 * anything. A shard holding several chunks of a collection answers each per-chunk request
 * with its matches for the whole collection; the proxy keeps only the documents whose
 * shard key falls in that request's chunk (the "ownership filter"), which also drops
 * orphans left behind by a migration. Writes that may touch several chunks run in two
 * phases per chunk: collect the _id of the owned matching documents (gated read), then
 * apply the write to {$and: [filter, {_id: {$in: ids}}]} (gated write); a write pinned to
 * one chunk by an equality on the whole shard key goes straight to its shard.
 * Projections of sharded finds run on the proxy (the shard key and sort fields must come
 * back for the ownership filter and the merge).
 */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/gate.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/cmdopts.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "proxy/txn.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

static uint64_t now_ms(void)
{
	return uv_hrtime() / 1000000u;
}

/* ---------- small helpers ---------- */

bool px_is_session_field(const char *k)
{
	static const char *const drop[] = {"$db", "lsid", "txnNumber", "$clusterTime",
					   "$readPreference", "autocommit", "startTransaction",
					   "apiVersion", "apiStrict", "apiDeprecationErrors",
					   "$audit", "$client", "readConcern", NULL};
	size_t i;

	for (i = 0; drop[i]; i++)
		if (strcmp(k, drop[i]) == 0)
			return true;
	return false;
}

/* Copy cmd without session fields and without the names in skip (NULL-terminated). */
void px_copy_cmd(const bson_t *cmd, bson_t *out, const char *const *skip)
{
	bson_iter_t it;
	size_t i;

	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool drop = px_is_session_field(k);
		for (i = 0; skip && skip[i] && !drop; i++)
			if (strcmp(k, skip[i]) == 0)
				drop = true;
		if (!drop)
			bson_append_iter(out, k, -1, &it);
	}
}

void px_append_version(bson_t *cmd, const route_chunk *ch)
{
	bson_t v;

	bson_append_document_begin(cmd, "$stripedbVersion", -1, &v);
	BSON_APPEND_UTF8(&v, "chunk", ch->id);
	BSON_APPEND_INT64(&v, "token", ch->token);
	bson_append_document_end(cmd, &v);
}

bool px_get_doc(const bson_t *d, const char *name, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;

	if (!bson_iter_init_find(&it, d, name) || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len);
}

/* The filter q of one update/delete statement (it: an element of updates/deletes) into sq
 * (static, or empty when the statement has none); false when it is not a document. */
bool px_stmt_filter(const bson_iter_t *it, bson_t *sq)
{
	bson_t st;
	uint32_t len;
	const uint8_t *data;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	if (!bson_init_static(&st, data, len))
		return false;
	if (!px_get_doc(&st, "q", sq))
		bson_init(sq);
	return true;
}

bool px_get_array(const bson_t *d, const char *name, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;

	if (!bson_iter_init_find(&it, d, name) || !BSON_ITER_HOLDS_ARRAY(&it))
		return false;
	bson_iter_array(&it, &len, &data);
	return bson_init_static(out, data, len);
}

/* A whole number read back from a reply or a checked command (common/bsonget.h rules);
 * def when absent or not one. Client arguments are range-checked with px_client_int. */
int64_t px_get_int(const bson_t *d, const char *name, int64_t def)
{
	bson_iter_t it;
	int64_t v;

	if (bson_iter_init_find(&it, d, name) && sdb_bson_as_int64(&it, &v))
		return v;
	return def;
}

/* The client's argument `name` of c->cmd as a whole number in [lo, hi] (def when absent),
 * by common/bsonget.h's rules. On a bad value replies its MongoDB error and returns false. */
bool px_client_int(ctx *c, const char *name, int64_t lo, int64_t hi, int64_t def,
		       int64_t *out)
{
	sdb_bson_err e;

	if (sdb_bson_find_int64(c->cmd, name, lo, hi, def, out, &e) == 0)
		return true;
	wire_req_error(c->req, e.code, "%s", e.msg);
	return false;
}

bool px_get_bool(const bson_t *d, const char *name, bool def)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name))
		return bson_iter_as_bool(&it);
	return def;
}

/* True when doc uses server-side JavaScript ($where, $function, $accumulator). */
bool px_uses_js(const bson_t *doc, int depth)
{
	bson_iter_t it;

	if (depth > 64 || !bson_iter_init(&it, doc))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "$where") == 0 || strcmp(k, "$function") == 0 ||
		    strcmp(k, "$accumulator") == 0)
			return true;
		if (BSON_ITER_HOLDS_CODE(&it) || BSON_ITER_HOLDS_CODEWSCOPE(&it))
			return true;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t sub;
			if (BSON_ITER_HOLDS_DOCUMENT(&it))
				bson_iter_document(&it, &len, &data);
			else
				bson_iter_array(&it, &len, &data);
			if (bson_init_static(&sub, data, len) && px_uses_js(&sub, depth + 1))
				return true;
		}
	}
	return false;
}

void px_reply_copy(wire_req *req, const bson_t *reply)
{
	bson_t *out = bson_new();
	bson_iter_t it;

	if (bson_iter_init(&it, reply))
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "$clusterTime") == 0 || strcmp(k, "operationTime") == 0)
				continue;
			bson_append_iter(out, k, -1, &it);
		}
	wire_req_reply(req, out);
}

/* Answer with the error a shard gave (code and errmsg kept). */
void px_reply_shard_error(wire_req *req, int cls, const bson_t *reply, const char *neterr)
{
	bson_iter_t it;
	int code = WIRE_ERR_INTERNAL;
	const char *msg = "shard error";

	if (cls == SHARDCONN_NET_ERR) {
		bson_t *extra = NULL;
		bson_t labels;
		/* issue #11: a driver retries a write only on this label, so it is given only
		 * when the shard certainly did not execute the command; after a network error
		 * with an unknown outcome the error goes to the application unlabelled (reads
		 * are retried by drivers on HostUnreachable's code anyway) */
		if (shardconn_unexecuted(reply)) {
			extra = bson_new();
			bson_append_array_begin(extra, "errorLabels", -1, &labels);
			BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
			bson_append_array_end(extra, &labels);
		}
		wire_req_error_extra(req, WIRE_ERR_HOST_UNREACHABLE, extra, "%s", neterr);
		return;
	}
	if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		code = (int)bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		msg = bson_iter_utf8(&it, NULL);
	wire_req_error(req, code, "%s", msg);
}

/* A network error of a retryable write (txn.h: the shards recognise a retry, so the
 * driver may resend it whatever its outcome was): HostUnreachable with the
 * RetryableWriteError label, plus NoWritesPerformed when no shard executed any of it. */
void px_reply_retryable_net_error(wire_req *req, bool nothing_written, const char *neterr)
{
	bson_t *extra = bson_new();
	bson_t labels;

	bson_append_array_begin(extra, "errorLabels", -1, &labels);
	BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
	if (nothing_written)
		BSON_APPEND_UTF8(&labels, "1", "NoWritesPerformed");
	bson_append_array_end(extra, &labels);
	wire_req_error_extra(req, WIRE_ERR_HOST_UNREACHABLE, extra, "%s", neterr);
}

/* Sleep for the StaleConfig backoff; false when the budget is spent. */
bool px_stale_backoff(ctx *c)
{
	uint64_t now = now_ms();

	sdb_counter_inc(c->p->m_stale_retries);
	if (now >= c->deadline_ms)
		return false;
	if (c->backoff_ms == 0)
		c->backoff_ms = 5;
	else if (c->backoff_ms < 200)
		c->backoff_ms *= 2;
	if (now + (uint64_t)c->backoff_ms > c->deadline_ms)
		c->backoff_ms = (int)(c->deadline_ms - now);
	uv_sleep((unsigned)c->backoff_ms);
	return true;
}

route_coll *px_refresh(ctx *c, route_coll *old)
{
	char err[256];
	route_coll *n = route_cache_get(c->p->rc, c->ns);

	/* another request (or the refresh thread) may have loaded a newer table already */
	if (n != NULL && old != NULL && n->version > old->version) {
		route_coll_unref(old);
		return n;
	}
	if (n != NULL)
		route_coll_unref(n);
	n = proxy_route(c->p, c->ns, true, err, sizeof err);

	if (n == NULL)
		return old;
	if (old)
		route_coll_unref(old);
	return n;
}

/* ---------- forwarding to one shard ---------- */

/* Run a command on a shard; returns SHARDCONN_* and fills reply. */
int px_run_on(ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid, bson_t *reply,
		  char *neterr, size_t nelen)
{
	uint32_t local = 0;

	return shardconn_command(c->p->sc, shard, c->db, cmd, sid ? sid : &local, reply, neterr,
				 nelen);
}

/* Wrap a cursor reply of one shard into a proxy cursor and answer the client. */
void px_answer_cursor(ctx *c, proxy_cursor *cur, int64_t batch, bool single,
			  const char *batch_field, const char *ns)
{
	bson_t *out = bson_new();
	bson_t cd, arr;
	int code = 0;
	char err[512];
	int r;

	bson_init(&arr);
	r = proxy_cursor_fill(c->p, cur, &arr, batch, &code, err, sizeof err);
	if (r < 0) {
		bson_destroy(&arr);
		bson_destroy(out);
		proxy_cursor_destroy(c->p, cur);
		wire_req_error(c->req, code ? code : WIRE_ERR_INTERNAL, "%s", err);
		return;
	}
	bson_append_document_begin(out, "cursor", -1, &cd);
	if (r == 1 || single) {
		proxy_cursor_destroy(c->p, cur);
		BSON_APPEND_INT64(&cd, "id", 0);
	} else {
		BSON_APPEND_INT64(&cd, "id", proxy_cursor_register(c->p, cur, c->user));
	}
	BSON_APPEND_UTF8(&cd, "ns", ns);
	bson_append_array(&cd, batch_field, -1, &arr);
	bson_append_document_end(out, &cd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	bson_destroy(&arr);
	wire_req_reply(c->req, out);
}

void px_stream_init(pstream *s, const char *shard, const char *db, const char *coll)
{
	memset(s, 0, sizeof *s);
	s->shard = sdb_strdup(shard);
	s->db = sdb_strdup(db);
	s->coll = sdb_strdup(coll);
	s->chunk = -1;
	bson_init(&s->err_reply);
}

/* Forward a cursor-returning command to one shard as is, and answer through a proxy cursor. */
void px_forward_cursor(ctx *c, const char *shard, const bson_t *cmd, int64_t batch,
			   bool single)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	pstream *s = proxy_calloc_bson(1, sizeof *s);
	char nerr[256];
	int r;
	bson_iter_t it, cur;
	const char *ns = c->ns;
	char nsbuf[512];

	px_copy_cmd(cmd, &fwd, NULL);
	px_stream_init(s, shard, c->db, c->coll ? c->coll : "");
	r = px_run_on(c, shard, &fwd, &s->server_id, &reply, nerr, sizeof nerr);
	if (r != SHARDCONN_OK) {
		px_reply_shard_error(c->req, r, &reply, nerr);
		goto fail;
	}
	if (bson_iter_init_find(&it, &reply, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "ns") && BSON_ITER_HOLDS_UTF8(&cur)) {
		const char *dot;
		snprintf(nsbuf, sizeof nsbuf, "%s", bson_iter_utf8(&cur, NULL));
		ns = nsbuf;
		dot = strchr(nsbuf, '.');
		if (dot) {
			free(s->coll);
			s->coll = sdb_strdup(dot + 1);
		}
	}
	if (pstream_take_batch(s, &reply, "firstBatch") != 0) {
		px_reply_copy(c->req, &reply);
		goto fail;
	}
	bson_destroy(&reply);
	bson_destroy(&fwd);
	px_answer_cursor(c, proxy_cursor_new(c->p, ns, s, 1, NULL, NULL, 0, 0), batch, single,
		      "firstBatch", ns);
	return;
fail:
	pstream_clear(s);
	bson_destroy(&s->err_reply);
	free(s);
	bson_destroy(&reply);
	bson_destroy(&fwd);
}

/* Forward a command to one shard and copy its reply. */
void px_forward_plain(ctx *c, const char *shard, const bson_t *cmd)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	char nerr[256];
	int r;

	px_copy_cmd(cmd, &fwd, NULL);
	if (c->txn.on && cmd == c->cmd) {
		/* an unsharded collection: the whole retryable write (px_copy_cmd kept its
		 * stmtId / stmtIds as given) */
		BSON_APPEND_DOCUMENT(&fwd, "lsid", &c->txn.lsid);
		BSON_APPEND_INT64(&fwd, "txnNumber", c->txn.txn);
	}
	r = px_run_on(c, shard, &fwd, NULL, &reply, nerr, sizeof nerr);
	if (r == SHARDCONN_OK || r == SHARDCONN_CMD_ERR || r == SHARDCONN_STALE)
		px_reply_copy(c->req, &reply);
	else if (c->txn.on && cmd == c->cmd)
		px_reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
	else
		px_reply_shard_error(c->req, r, &reply, nerr);
	bson_destroy(&reply);
	bson_destroy(&fwd);
}

bool px_with_primary(ctx *c, char **primary)
{
	*primary = proxy_primary(c->p);
	if (*primary == NULL) {
		wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND,
			       "no shard is registered in the metadata service");
		return false;
	}
	return true;
}

route_coll *px_route_or_fail(ctx *c)
{
	char err[256];
	route_coll *rc = proxy_route(c->p, c->ns, false, err, sizeof err);

	if (rc == NULL)
		wire_req_error(c->req, WIRE_ERR_HOST_UNREACHABLE,
			       "routing of %s unavailable: %s", c->ns, err);
	return rc;
}

/* Every command the proxy routes (registered by proxy_exec_register). */
const char *const proxy_cmds[] = {
	"find",          "getMore",       "killCursors",   "insert",      "update",
	"delete",        "findAndModify", "findandmodify", "count",       "distinct",
	"aggregate",     "createIndexes", "dropIndexes",   "drop",        "create",
	"collMod",       "dropDatabase",  "listIndexes",   "listCollections",
	"listDatabases", "explain",       "dbStats",       "dbstats",     "collStats",
	"collstats",     NULL};

/* ---------- dispatch ---------- */

typedef struct pjob {
	proxy *p;
	wire_req *req;
	char *user; /* auth_gate_conn_user, copied on the loop thread; NULL without auth */
} pjob;

static void run_job(void *arg)
{
	pjob *j = arg;
	ctx c;
	bson_iter_t it;
	const char *name = wire_req_name(j->req);

	memset(&c, 0, sizeof c);
	c.p = j->p;
	c.req = j->req;
	c.cmd = wire_req_cmd(j->req);
	c.db = wire_req_db(j->req);
	c.deadline_ms = now_ms() + (uint64_t)j->p->stale_retry_ms;
	c.user = j->user;
	if (bson_iter_init(&it, c.cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it)) {
		c.coll = bson_iter_utf8(&it, NULL);
		snprintf(c.ns, sizeof c.ns, "%s.%s", c.db, c.coll);
	}
	if (proxy_txn_refuse(c.req))
		goto out;
	{
		/* options the shards would refuse, refused before the proxy builds requests of
		 * its own from the command (merge sorts, findAndModify's candidate finds) */
		char err[256];
		int code = sdb_cmd_unsupported_option(name, c.cmd, err, sizeof err);
		if (code != 0) {
			wire_req_error(c.req, code, "%s", err);
			goto out;
		}
	}
	{
		const char *stmts = NULL;
		int code = 0;
		char err[256];
		bool is_write = true;
		if (strcmp(name, "insert") == 0)
			stmts = "documents";
		else if (strcmp(name, "update") == 0)
			stmts = "updates";
		else if (strcmp(name, "delete") == 0)
			stmts = "deletes";
		else if (strcmp(name, "findAndModify") != 0 && strcmp(name, "findandmodify") != 0)
			is_write = false;
		if (is_write && !proxy_txn_parse(c.cmd, stmts, &c.txn, &code, err, sizeof err)) {
			wire_req_error(c.req, code, "%s", err);
			goto out;
		}
	}
	if (!px_admit(&c, name) || !px_policy_ok(&c, name))
		goto out;
	if (strcmp(name, "getMore") == 0) {
		px_do_get_more(&c);
		goto out;
	}
	if (strcmp(name, "killCursors") == 0) {
		px_do_kill_cursors(&c);
		goto out;
	}
	if (strcmp(name, "listDatabases") == 0) {
		px_do_list_union(&c, true);
		goto out;
	}
	if (strcmp(name, "listCollections") == 0) {
		px_do_list_union(&c, false);
		goto out;
	}
	if (strcmp(name, "dropDatabase") == 0) {
		px_do_broadcast(&c);
		goto out;
	}
	if (strcmp(name, "aggregate") == 0) {
		px_do_aggregate(&c);
		goto out;
	}
	if (strcmp(name, "explain") == 0) {
		px_do_explain(&c);
		goto out;
	}
	if (strcmp(name, "dbStats") == 0 || strcmp(name, "dbstats") == 0) {
		px_do_db_stats(&c);
		goto out;
	}
	if (c.coll == NULL) {
		wire_req_error(c.req, WIRE_ERR_INVALID_NAMESPACE,
			       "%s needs a collection name string as its first field", name);
		goto out;
	}
	if (strcmp(name, "find") == 0)
		px_do_find(&c);
	else if (strcmp(name, "insert") == 0)
		px_do_insert(&c);
	else if (strcmp(name, "update") == 0)
		px_do_write(&c, true);
	else if (strcmp(name, "delete") == 0)
		px_do_write(&c, false);
	else if (strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0)
		px_do_find_and_modify(&c);
	else if (strcmp(name, "count") == 0)
		px_do_count(&c);
	else if (strcmp(name, "distinct") == 0)
		px_do_distinct(&c);
	else if (strcmp(name, "listIndexes") == 0)
		px_do_list_indexes(&c);
	else if (strcmp(name, "collStats") == 0 || strcmp(name, "collstats") == 0)
		px_do_coll_stats(&c);
	else if (strcmp(name, "createIndexes") == 0)
		px_do_create_indexes(&c);
	else
		px_do_broadcast(&c); /* dropIndexes, drop, create, collMod */
out:
	proxy_txn_free(&c.txn);
	free(j->user);
	free(j);
}

static void h_submit(wire_req *req, void *data)
{
	proxy *p = data;
	pjob *j = sdb_calloc(1, sizeof *j);

	const char *user = p->auth ? auth_gate_conn_user(wire_req_conn(req)) : NULL;

	j->p = p;
	j->req = req;
	j->user = user ? sdb_strdup(user) : NULL; /* the loop thread owns the connection state */
	shardconn_submit(p->sc, run_job, j);
}

static void h_refuse_js(wire_req *req, void *data)
{
	(void)data;
	wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND,
		       "%s is not supported: server-side JavaScript is never accepted by stripedb",
		       wire_req_name(req));
}

void proxy_exec_register(proxy *p)
{
	static const char *const js[] = {"mapReduce", "mapreduce", "eval", "$eval", "group",
					 NULL};
	size_t i;

	for (i = 0; proxy_cmds[i]; i++)
		wire_server_register(p->srv, proxy_cmds[i], h_submit);
	for (i = 0; js[i]; i++)
		wire_server_register(p->srv, js[i], h_refuse_js);
	wire_server_register(p->srv, "commitTransaction", proxy_txn_refuse_handler);
	wire_server_register(p->srv, "abortTransaction", proxy_txn_refuse_handler);
}

