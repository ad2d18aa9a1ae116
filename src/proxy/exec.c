/* The proxy's job runner and shared helpers (issue #6, split by concern in issue #24):
 * every routed command is submitted to a worker thread (shardconn_submit), checked (a
 * transaction's statement checks its session out, txnroute.c; unsupported options,
 * retryable-write fields, admission, collection policy) and dispatched to its handler in
 * read.c, write.c, admin.c or explain.c; except a point read or a small write of an
 * unsharded collection the loop thread can send and answer itself (forwarder.h, issue
 * #19).
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
#include "common/clock.h"
#include "common/cmdopts.h"
#include "common/curop.h"
#include "common/err.h"
#include "common/fieldscan.h"
#include "common/log.h"
#include "common/readconcern.h"
#include "proxy/cswait.h"
#include "proxy/exec.h"
#include "proxy/forwarder.h"
#include "storage/collation.h"
#include "proxy/txn.h"
#include "storage/pipeline.h"
#include "storage/projection.h"
#include "storage/store.h"

/* ---------- answers: recorded by handlers, sent once by run_job ---------- */

/* Record an answer unless one is recorded already (a handler bug: logged, dropped). */
static bool answer_slot(ctx *c, const char *what)
{
	if (c->ans->state == 0)
		return true;
	sdb_error("proxy handler answered twice", "cmd=%s dropped=%s",
		  c->req ? wire_req_name(c->req) : "?", what);
#ifdef SDB_DEBUG
	abort();
#endif
	return false;
}

/* The status a reply document stands for: 0 unless it says `ok: 0` (a shard's error reply
 * passed on as it is), then its code (InternalError 1 when it has none). */
static int reply_status(const bson_t *reply)
{
	bson_iter_t it;
	int64_t code;

	if (!bson_iter_init_find(&it, reply, "ok") || bson_iter_as_bool(&it))
		return 0;
	code = px_get_int(reply, "code", 0);
	return code > 0 && code <= INT32_MAX ? (int)code : WIRE_ERR_INTERNAL;
}

int px_reply(ctx *c, bson_t *reply)
{
	int st = reply_status(reply);

	if (!answer_slot(c, "reply")) {
		bson_destroy(reply);
		return st;
	}
	c->ans->state = 1;
	c->ans->reply = reply;
	return st;
}

static int error_va(ctx *c, int code, bson_t *extra, const char *fmt, va_list ap)
{
	if (!answer_slot(c, "error")) {
		if (extra)
			bson_destroy(extra);
		return code;
	}
	c->ans->state = 2;
	c->ans->code = code;
	c->ans->extra = extra;
	c->ans->msg = bson_strdupv_printf(fmt, ap);
	return code;
}

int px_error(ctx *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_va(c, code, NULL, fmt, ap);
	va_end(ap);
	return code;
}

int px_error_extra(ctx *c, int code, bson_t *extra, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_va(c, code, extra, fmt, ap);
	va_end(ap);
	return code;
}

int px_parked(ctx *c)
{
	if (answer_slot(c, "parked"))
		c->ans->state = 3;
	return 0;
}

bool px_answered(const ctx *c)
{
	return c->ans->state != 0;
}

int px_answer_status(const ctx *c)
{
	switch (c->ans->state) {
	case 1:
		return reply_status(c->ans->reply);
	case 2:
		return c->ans->code;
	default:
		return -1;
	}
}

int px_check_answer(int status, const px_answer *a)
{
	switch (a->state) {
	case 1:
		return status == reply_status(a->reply) ? PX_ANSWER_OK : PX_ANSWER_MISMATCH;
	case 2:
		return status != 0 && status == a->code ? PX_ANSWER_OK : PX_ANSWER_MISMATCH;
	case 3:
		return status == 0 ? PX_ANSWER_OK : PX_ANSWER_MISMATCH;
	default:
		return PX_ANSWER_NONE;
	}
}

void px_answer_clear(px_answer *a)
{
	if (a->reply)
		bson_destroy(a->reply);
	if (a->extra)
		bson_destroy(a->extra);
	bson_free(a->msg);
	memset(a, 0, sizeof *a);
}

/* The job runner's check of what the handler returned (status) against what it recorded
 * in a: a broken contract is a bug, logged, and debug builds (the test suites) abort. A
 * release build still sends the recorded answer: it is what the handler did (a write it
 * reports applied was applied), where an InternalError instead could make a client redo
 * it. */
static void answer_check(const char *name, int status, px_answer *a)
{
	int v = px_check_answer(status, a);

	if (v == PX_ANSWER_OK || v == PX_ANSWER_NONE) /* none: answer_send logs it */
		return;
	sdb_error("proxy handler status does not match its answer",
		  "cmd=%s status=%d answer=%s code=%d", name, status,
		  a->state == 1 ? "reply" : "error", a->state == 2 ? a->code : 0);
#ifdef SDB_DEBUG
	abort();
#endif
}

/* Send the recorded answer: the one place a routed request is completed. */
void px_answer_send(wire_req *req, px_answer *a)
{
	px_answer_mask_state_change(a); /* a shard's state-change error is not the proxy's */
	switch (a->state) {
	case 1:
		wire_req_reply(req, a->reply);
		break;
	case 2:
		wire_req_error_extra(req, a->code, a->extra, "%s", a->msg);
		bson_free(a->msg);
		break;
	case 3: /* parked (cswait.h): answered by a later run of the request */
		break;
	default:
		sdb_error("proxy handler returned without an answer", "cmd=%s", wire_req_name(req));
#ifdef SDB_DEBUG
		abort();
#endif
		wire_req_error(req, WIRE_ERR_INTERNAL, "%s returned without an answer",
			       wire_req_name(req));
		break;
	}
	memset(a, 0, sizeof *a);
}

/* ---------- small helpers ---------- */

bool px_is_session_field(const char *k)
{
	static const char *const drop[] = {"$db", "lsid", "txnNumber", "$clusterTime",
					   "$readPreference", "autocommit", "startTransaction",
					   "apiVersion", "apiStrict", "apiDeprecationErrors",
					   "$audit", "$client", NULL};
	size_t i;

	/* the first letters of the names above: most fields are told apart without a strcmp
	 * (12 strcmps a field were ~2% of a proxied point read, issue #19) */
	switch (k[0]) {
	case '$':
	case 'l':
	case 't':
	case 'a':
	case 's':
		break;
	default:
		return false;
	}
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
			if (skip[i][0] == k[0] && strcmp(k, skip[i]) == 0)
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

/* A static view of the document (array: false) or array (true) field name of d. */
static bool get_sub(const bson_t *d, const char *name, bool array, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;

	if (!bson_iter_init_find(&it, d, name))
		return false;
	if (array ? !BSON_ITER_HOLDS_ARRAY(&it) : !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	if (array)
		bson_iter_array(&it, &len, &data);
	else
		bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len);
}

bool px_get_doc(const bson_t *d, const char *name, bson_t *out)
{
	return get_sub(d, name, false, out);
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
	return get_sub(d, name, true, out);
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
 * by common/bsonget.h's rules. On a bad value answers its MongoDB error, returns its code. */
int px_client_int(ctx *c, const char *name, int64_t lo, int64_t hi, int64_t def,
		  int64_t *out)
{
	sdb_bson_err e;

	if (sdb_bson_find_int64(c->cmd, name, lo, hi, def, out, &e) == 0)
		return 0;
	return px_error(c, e.code, "%s", e.msg);
}

void px_append_let(const ctx *c, bson_t *cmd)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, c->cmd, "let"))
		bson_append_iter(cmd, "let", 3, &it);
}

void px_append_collation(const bson_t *from, bson_t *cmd)
{
	bson_iter_t it;

	if (from && bson_iter_init_find(&it, from, "collation"))
		bson_append_iter(cmd, "collation", 9, &it);
}

int px_let(ctx *c, bson_t *vars)
{
	bson_iter_t it;
	int code = 0;
	char err[256];

	if (!bson_iter_init_find(&it, c->cmd, "let")) {
		bson_init(vars);
		return 0;
	}
	if (sdb_let_parse(&it, NULL, "let", vars, &code, err, sizeof err) == 0)
		return 0;
	bson_destroy(vars);
	return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
}

int px_client_int_field(ctx *c, const bson_iter_t *it, const char *name, int64_t lo,
			int64_t hi, int64_t def, int64_t *out)
{
	sdb_bson_err e;

	if (it == NULL) {
		*out = def;
		return 0;
	}
	if (sdb_bson_get_int64(it, name, lo, hi, out, &e) == 0)
		return 0;
	return px_error(c, e.code, "%s", e.msg);
}

bool px_get_bool(const bson_t *d, const char *name, bool def)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name))
		return bson_iter_as_bool(&it);
	return def;
}

/* True when doc uses server-side JavaScript ($where, $function, $accumulator). */
static bool uses_js(const bson_t *doc, int depth, bool code_values)
{
	bson_iter_t it;

	if (depth > 64 || !bson_iter_init(&it, doc))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "$where") == 0 || strcmp(k, "$function") == 0 ||
		    strcmp(k, "$accumulator") == 0)
			return true;
		if (code_values && (BSON_ITER_HOLDS_CODE(&it) || BSON_ITER_HOLDS_CODEWSCOPE(&it)))
			return true;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t sub;
			if (BSON_ITER_HOLDS_DOCUMENT(&it))
				bson_iter_document(&it, &len, &data);
			else
				bson_iter_array(&it, &len, &data);
			if (bson_init_static(&sub, data, len) &&
			    uses_js(&sub, depth + 1, code_values))
				return true;
		}
	}
	return false;
}

bool px_uses_js(const bson_t *doc, int depth)
{
	return uses_js(doc, depth, true);
}

bool px_uses_js_ops(const bson_t *doc)
{
	return uses_js(doc, 0, false);
}

int px_refuse_js(ctx *c, const bson_t *doc)
{
	if (!px_uses_js(doc, 0))
		return 0;
	return px_error(c, WIRE_ERR_BAD_VALUE,
			"$where and server-side JavaScript are not allowed on stripedb");
}

int px_reply_copy(ctx *c, const bson_t *reply)
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
	return px_reply(c, out);
}

/* ---------- forwarding to one shard ---------- */

/* px_answer_cursor, with wce (NULL or empty: none) the writeConcernError of the shard's
 * first reply, answered next to the cursor as mongod does for an aggregate with $out or
 * $merge (issue #20: a shard's writeConcernError is never dropped). */
static int answer_cursor_wce(ctx *c, proxy_cursor *cur, int64_t batch, bool single,
			     const char *batch_field, const char *ns, const bson_t *wce)
{
	bson_t *out = proxy_cursor_answer_new(cur, batch);
	int code = 0;
	char err[512];
	int r;

	proxy_cursor_set_txn(cur, pxtxn_cursor_fields(c));
	/* find's noCursorTimeout (forwarded to the shards: read.c copy_find_options); run_job
	 * noted it for the request's own command (a lookup of the absent field walked all of
	 * it: ~2% of a proxied point read, issue #19) */
	bson_iter_t first;
	bool nct;
	if (c->nct_of != NULL && c->nct_of == c->cmd)
		nct = c->nct;
	else
		nct = px_get_bool(c->cmd, "noCursorTimeout", false);
	proxy_cursor_set_no_timeout(cur, nct && bson_iter_init(&first, c->cmd) &&
						 bson_iter_next(&first) &&
						 strcmp(bson_iter_key(&first), "find") == 0);
	r = proxy_cursor_answer(c->p, cur, batch, batch_field, ns, out, &code, err, sizeof err);
	if (r < 0) {
		bson_destroy(out);
		proxy_cursor_destroy(c->p, cur);
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	}
	if (r == 1 || single)
		proxy_cursor_destroy(c->p, cur);
	else
		proxy_cursor_answer_id(out, proxy_cursor_register(c->p, cur, c->user));
	if (wce != NULL && !bson_empty(wce))
		BSON_APPEND_DOCUMENT(out, "writeConcernError", wce);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	return px_reply(c, out);
}

/* Wrap a cursor reply of one shard into a proxy cursor and answer the client. */
int px_answer_cursor(ctx *c, proxy_cursor *cur, int64_t batch, bool single,
		     const char *batch_field, const char *ns)
{
	return answer_cursor_wce(c, cur, batch, single, batch_field, ns, NULL);
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

/* ---- views (issue #20) ----
 * Metadata does not know views: a view's name routes as an unsharded collection, to its
 * database's primary shard, which would resolve a view over a sharded collection against
 * its own share of the documents only. So reads sent this way carry
 * $stripedbViewCheck: {allow: [...]}; a shard whose read resolves a view to a source not in
 * allow answers 169 naming the source (src/shard/cmd_aggregate.c view_check). An unsharded
 * source is added to allow and the read sent again (the primary holds all of it); a
 * sharded one is refused with 238, never answered from one shard. The shard reports the
 * collections a pipeline's $lookup/$unionWith read the same way (a view's own pipeline may
 * name a sharded one). Not inside a transaction (see run_view_checked). */
#define VIEW_SOURCE_TAG "resolvedView.ns="
#define VIEW_MAX_SOURCES 32

/* Does the command read a collection a view could stand for? */
static bool view_read(const bson_t *cmd)
{
	bson_iter_t it;
	const char *k;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return false;
	k = bson_iter_key(&it);
	return strcmp(k, "find") == 0 || strcmp(k, "aggregate") == 0 || strcmp(k, "count") == 0 ||
	       strcmp(k, "distinct") == 0 || strcmp(k, "explain") == 0;
}

/* The source a shard's 169 names (into buf), or false for any other reply. */
static bool view_source(const bson_t *reply, char *buf, size_t buflen)
{
	bson_iter_t it;
	const char *msg, *tag;

	if (!bson_iter_init_find(&it, reply, "code") || !BSON_ITER_HOLDS_NUMBER(&it) ||
	    bson_iter_as_int64(&it) != WIRE_ERR_COMMAND_ON_SHARDED_VIEW ||
	    !bson_iter_init_find(&it, reply, "errmsg") || !BSON_ITER_HOLDS_UTF8(&it))
		return false;
	msg = bson_iter_utf8(&it, NULL);
	if ((tag = strstr(msg, VIEW_SOURCE_TAG)) == NULL)
		return false;
	snprintf(buf, buflen, "%s", tag + strlen(VIEW_SOURCE_TAG));
	return buf[0] != '\0';
}

/* A shard-style error reply into reply (initialised here). */
static void error_reply(bson_t *reply, int code, const char *msg)
{
	bson_init(reply);
	BSON_APPEND_DOUBLE(reply, "ok", 0.0);
	BSON_APPEND_UTF8(reply, "errmsg", msg);
	BSON_APPEND_INT32(reply, "code", code);
	BSON_APPEND_UTF8(reply, "codeName", wire_code_name(code));
}

void px_append_view_check(bson_t *cmd, const char *const *allow, size_t nallow)
{
	bson_t vc, arr;

	bson_append_document_begin(cmd, "$stripedbViewCheck", -1, &vc);
	bson_append_array_begin(&vc, "allow", -1, &arr);
	for (size_t i = 0; i < nallow; i++) {
		char k[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)i, &kp, k, sizeof k);
		BSON_APPEND_UTF8(&arr, kp, allow[i]);
	}
	bson_append_array_end(&vc, &arr);
	bson_append_document_end(cmd, &vc);
}

/* px_run_on for a command forwarded whole to one shard (an unsharded collection's, or a
 * view's): reads go with $stripedbViewCheck and are sent again, with the source allowed,
 * while the views they meet resolve to unsharded collections (at most VIEW_MAX_SOURCES); a
 * view over a sharded collection gets a 238 reply. Returns: as px_run_on. */
static int run_view_checked(ctx *c, const char *shard, const bson_t *fwd, uint32_t *sid,
			    bson_t *reply, char *nerr, size_t nerrlen)
{
	char *allow[VIEW_MAX_SOURCES];
	size_t nallow = 0;
	int r;

	/* not inside a transaction: a shard aborts the transaction on any failed statement,
	 * so the 169 of the first try would abort it (a view there reads as before) */
	if (!view_read(fwd) || c->tx != NULL)
		return px_run_on(c, shard, fwd, sid, reply, nerr, nerrlen);
	for (;;) {
		bson_t cmd;
		char src[512], rerr[256], msg[1400];

		/* the commands forwarded here seldom carry one: then a copy of the bytes, not a
		 * field by field rebuild (issue #19) */
		bson_init(&cmd);
		if (bson_has_field(fwd, "$stripedbViewCheck"))
			bson_copy_to_excluding_noinit(fwd, &cmd, "$stripedbViewCheck", NULL);
		else
			bson_concat(&cmd, fwd);
		px_append_view_check(&cmd, (const char *const *)allow, nallow);
		r = px_run_on(c, shard, &cmd, sid, reply, nerr, nerrlen);
		bson_destroy(&cmd);
		if (r != SHARDCONN_CMD_ERR || !view_source(reply, src, sizeof src))
			break;
		bson_destroy(reply);
		ctx c2 = *c; /* the routing of the source, as the request's own */
		snprintf(c2.ns, sizeof c2.ns, "%s", src);
		route_coll *rc = px_route(&c2, false, rerr, sizeof rerr);
		if (rc == NULL) {
			snprintf(msg, sizeof msg, "routing of %s (a view's source) unavailable: %s",
				 src, rerr);
			error_reply(reply, WIRE_ERR_HOST_UNREACHABLE, msg);
			break;
		}
		bool sharded = rc->nkeys > 0;
		route_coll_unref(rc);
		if (sharded) {
			snprintf(msg, sizeof msg,
				 "a view over the sharded collection %s is not supported through a "
				 "proxy (the view would see one shard's documents): query %s with "
				 "the view's pipeline",
				 src, src);
			error_reply(reply, WIRE_ERR_NOT_IMPLEMENTED, msg);
			break;
		}
		if (nallow == VIEW_MAX_SOURCES) {
			snprintf(msg, sizeof msg,
				 "a read of more than %d collections through views, $lookup or "
				 "$unionWith is not supported through a proxy",
				 VIEW_MAX_SOURCES);
			error_reply(reply, WIRE_ERR_NOT_IMPLEMENTED, msg);
			break;
		}
		allow[nallow++] = sdb_strdup(src);
	}
	for (size_t i = 0; i < nallow; i++)
		free(allow[i]);
	return r;
}

/* Forward a cursor-returning command to one shard as is, and answer through a proxy cursor. */
int px_forward_cursor(ctx *c, const char *shard, const bson_t *cmd, int64_t batch,
		      bool single)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	pstream *s = sdb_calloc_bson(1, sizeof *s);
	char nerr[256];
	int r, st;
	bson_iter_t it, cur;
	const char *ns = c->ns;
	char nsbuf[512];

	px_copy_cmd(cmd, &fwd, NULL);
	px_stream_init(s, shard, c->db, c->coll ? c->coll : "");
	r = run_view_checked(c, shard, &fwd, &s->server_id, &reply, nerr, sizeof nerr);
	if (r != SHARDCONN_OK) {
		st = px_reply_shard_error(c, r, &reply, nerr);
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
	/* the writeConcernError of a writing aggregate ($out / $merge of an unsharded
	 * collection run whole by its primary shard) reaches the client, as mongos'
	 * (cluster_aggregate.cpp appends the shard's one); the shard's $clusterTime and
	 * operationTime are not copied, as px_reply_copy does not */
	bson_t wce = BSON_INITIALIZER, w;
	if (px_get_doc(&reply, "writeConcernError", &w))
		bson_concat(&wce, &w);
	if (pstream_take_batch(s, &reply, "firstBatch") != 0) {
		bson_destroy(&wce);
		st = px_reply_copy(c, &reply);
		goto fail;
	}
	bson_destroy(&reply);
	bson_destroy(&fwd);
	st = answer_cursor_wce(c, proxy_cursor_new(c->p, ns, s, 1, NULL, NULL, 0, 0), batch,
			       single, "firstBatch", ns, &wce);
	bson_destroy(&wce);
	return st;
fail:
	pstream_clear(s);
	bson_destroy(&s->err_reply);
	free(s);
	bson_destroy(&reply);
	bson_destroy(&fwd);
	return st;
}

/* Forward c->cmd to one shard and answer with its result. */
static int forward_plain(ctx *c, const char *shard)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	char nerr[256];
	int r, st;

	px_copy_cmd(c->cmd, &fwd, NULL);
	if (c->txn.on) {
		/* an unsharded collection: the whole retryable write (px_copy_cmd kept its
		 * stmtId / stmtIds as given) */
		BSON_APPEND_DOCUMENT(&fwd, "lsid", &c->txn.lsid);
		BSON_APPEND_INT64(&fwd, "txnNumber", c->txn.txn);
	}
	r = run_view_checked(c, shard, &fwd, NULL, &reply, nerr, sizeof nerr);
	st = px_reply_write_result(c, r, &reply, nerr);
	bson_destroy(&reply);
	bson_destroy(&fwd);
	return st;
}

int px_forward_primary(ctx *c)
{
	char *primary;
	int st;

	if ((st = px_with_primary(c, &primary)) != 0)
		return st;
	st = forward_plain(c, primary);
	free(primary);
	return st;
}

int px_forward_primary_cursor(ctx *c, int64_t batch, bool single)
{
	char *primary;
	int st;

	if ((st = px_with_primary(c, &primary)) != 0)
		return st;
	st = px_forward_cursor(c, primary, c->cmd, batch, single);
	free(primary);
	return st;
}

int px_route_sharded(ctx *c, px_fwd fwd, int64_t batch, bool single, route_coll **out)
{
	route_coll *rc;
	int st = px_route_or_fail(c, &rc);

	*out = NULL;
	if (st != 0)
		return st;
	if (rc->nkeys > 0) {
		*out = rc;
		return 0;
	}
	route_coll_unref(rc);
	if (fwd == PX_FWD_CURSOR)
		return px_forward_primary_cursor(c, batch, single);
	return px_forward_primary(c);
}

/* ---------- dispatch: the command table ---------- */

static int do_update(ctx *c)
{
	return px_do_write(c, true);
}

static int do_delete(ctx *c)
{
	return px_do_write(c, false);
}

static int do_list_databases(ctx *c)
{
	return px_do_list_union(c, true);
}

static int do_list_collections(ctx *c)
{
	return px_do_list_union(c, false);
}

/* Every command the proxy routes (registered by proxy_exec_register), with how the job
 * runner checks it before its handler runs. */
static const px_cmd cmd_table[] = {
	{"find", px_do_find, PXC_COLL, NULL, PXP_FIND},
	{"getMore", px_do_get_more, 0, NULL, PXP_NONE},
	{"killCursors", px_do_kill_cursors, PXC_FREE, NULL, PXP_NONE},
	{"insert", px_do_insert, PXC_COLL | PXC_WRITE, "documents", PXP_NONE},
	{"update", do_update, PXC_COLL | PXC_WRITE, "updates", PXP_STMTS},
	{"delete", do_delete, PXC_COLL | PXC_WRITE, "deletes", PXP_STMTS},
	{"findAndModify", px_do_find_and_modify, PXC_COLL | PXC_WRITE | PXC_ONE_DOC, NULL,
	 PXP_QUERY},
	{"findandmodify", px_do_find_and_modify, PXC_COLL | PXC_WRITE | PXC_ONE_DOC, NULL,
	 PXP_QUERY},
	{"count", px_do_count, PXC_COLL, NULL, PXP_QUERY},
	{"distinct", px_do_distinct, PXC_COLL, NULL, PXP_QUERY},
	{"aggregate", px_do_aggregate, 0, NULL, PXP_AGGREGATE}, /* db-level: no collection */
	{"createIndexes", px_do_create_indexes, PXC_COLL, NULL, PXP_NONE},
	{"dropIndexes", px_do_broadcast, PXC_COLL, NULL, PXP_NONE},
	/* its alias (drop_indexes.idl command_alias), forwarded as such: a shard knows it */
	{"deleteIndexes", px_do_broadcast, PXC_COLL, NULL, PXP_NONE},
	{"drop", px_do_drop, PXC_COLL, NULL, PXP_NONE}, /* sharding metadata too (sharding.c) */
	{"create", px_do_broadcast, PXC_COLL, NULL, PXP_NONE},
	{"collMod", px_do_broadcast, PXC_COLL, NULL, PXP_NONE},
	{"dropDatabase", px_do_drop_database, 0, NULL, PXP_NONE},
	/* admin only; unsharded collections, on their database's primary shard (sharding.c) */
	{"renameCollection", px_do_rename_collection, 0, NULL, PXP_NONE},
	{"listIndexes", px_do_list_indexes, PXC_COLL, NULL, PXP_NONE},
	{"listCollections", do_list_collections, 0, NULL, PXP_NONE},
	{"listDatabases", do_list_databases, 0, NULL, PXP_NONE},
	{"explain", px_do_explain, 0, NULL, PXP_NONE}, /* exempt from the policy switches */
	{"dbStats", px_do_db_stats, 0, NULL, PXP_NONE},
	{"dbstats", px_do_db_stats, 0, NULL, PXP_NONE},
	{"collStats", px_do_coll_stats, PXC_COLL, NULL, PXP_NONE},
	{"collstats", px_do_coll_stats, PXC_COLL, NULL, PXP_NONE},
	{"validate", px_do_validate, PXC_COLL, NULL, PXP_NONE},
	/* sharding administration, as on a mongos (sharding.c, issue #18) */
	{"enableSharding", px_do_enable_sharding, 0, NULL, PXP_NONE},
	{"enablesharding", px_do_enable_sharding, 0, NULL, PXP_NONE},
	{"shardCollection", px_do_shard_collection, 0, NULL, PXP_NONE},
	{"shardcollection", px_do_shard_collection, 0, NULL, PXP_NONE},
	{"listShards", px_do_list_shards, 0, NULL, PXP_NONE},
	{"listshards", px_do_list_shards, 0, NULL, PXP_NONE},
	{"addShard", px_do_add_shard, 0, NULL, PXP_NONE},
	{"addshard", px_do_add_shard, 0, NULL, PXP_NONE},
	{"balancerStatus", px_do_balancer, 0, NULL, PXP_NONE},
	{"balancerStart", px_do_balancer, 0, NULL, PXP_NONE},
	{"balancerStop", px_do_balancer, 0, NULL, PXP_NONE},
	{"split", px_do_split, 0, NULL, PXP_NONE},
	{"moveChunk", px_do_move_chunk, 0, NULL, PXP_NONE},
	{"movechunk", px_do_move_chunk, 0, NULL, PXP_NONE},
	{"moveRange", px_do_move_range, 0, NULL, PXP_NONE},
	{"mergeChunks", px_do_merge_chunks, 0, NULL, PXP_NONE},
	{"mergechunks", px_do_merge_chunks, 0, NULL, PXP_NONE},
	{"removeShard", px_do_remove_shard, 0, NULL, PXP_NONE},
	{"removeshard", px_do_remove_shard, 0, NULL, PXP_NONE},
	{"refineCollectionShardKey", px_do_refused_sharding, 0, NULL, PXP_NONE},
	{"reshardCollection", px_do_refused_sharding, 0, NULL, PXP_NONE},
	{"movePrimary", px_do_refused_sharding, 0, NULL, PXP_NONE},
	{"moveprimary", px_do_refused_sharding, 0, NULL, PXP_NONE},
	/* issue #20 (currentop.c): the shards' operations; killOp's "shard:opid" form (a
	 * number is answered on the loop thread, h_kill_op) */
	{"currentOp", px_do_current_op, PXC_FREE, NULL, PXP_NONE},
	{"killOp", px_do_kill_op, PXC_FREE, NULL, PXP_NONE},
	/* transactions (txnroute.c, issue #16) */
	{"commitTransaction", pxtxn_do_commit, PXC_TXN_END | PXC_FREE, NULL, PXP_NONE},
	{"abortTransaction", pxtxn_do_abort, PXC_TXN_END | PXC_FREE, NULL, PXP_NONE},
};

const px_cmd *px_cmd_find(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof cmd_table / sizeof cmd_table[0]; i++)
		if (strcmp(cmd_table[i].name, name) == 0)
			return &cmd_table[i];
	return NULL;
}

typedef struct pjob {
	proxy *p;
	wire_req *req;
	char *user; /* auth_gate_conn_user, copied on the loop thread; NULL without auth */
	bool resumed; /* px_exec_resume: a parked request run again */
} pjob;

/* What run_job notes of the client's command in one pass over it (sdb_bson_find_fields,
 * common/fieldscan.h), for the checks and lookups before the handler: a lookup of a field
 * the command does not have walks all of it, and these are seldom there (issue #19).
 * RF_ indexes req_field_names; RF(RF_X) is its bit in req_fields.has, and at[RF_X].it is on
 * its first occurrence when the bit is set (what a lookup by name gives). */
enum {
	RF_INTERNAL,	    /* the first field named $stripedb... */
	RF_AUTOCOMMIT,	    /* a transaction's statement (pxtxn_is_txn_cmd) */
	RF_COLLECTION_UUID,
	RF_READ_PREF,	    /* $readPreference */
	RF_READ_CONCERN,
	RF_COLLATION,
	RF_MAX_TIME,	    /* maxTimeMS */
	RF_NO_CURSOR_TIMEOUT, /* find's noCursorTimeout (answer_cursor_wce) */
	RF_N
};
#define RF(rf) SDB_FIELD_BIT(rf)
_Static_assert(RF_N <= SDB_FIELDS_MAX, "run_job's fields fit one sdb_bson_find_fields");

static const char *const req_field_names[RF_N] = {
	[RF_INTERNAL] = "$stripedb*",
	[RF_AUTOCOMMIT] = "autocommit",
	[RF_COLLECTION_UUID] = "collectionUUID",
	[RF_READ_PREF] = "$readPreference",
	[RF_READ_CONCERN] = "readConcern",
	[RF_COLLATION] = "collation",
	[RF_MAX_TIME] = "maxTimeMS",
	[RF_NO_CURSOR_TIMEOUT] = "noCursorTimeout",
};

typedef struct req_fields {
	uint64_t has;		/* RF(RF_X) bits */
	sdb_field_iter at[RF_N]; /* at[RF_X].it valid when RF(RF_X) is set */
} req_fields;

/* The checks every routed command passes before its handler, in order: options the shards
 * would refuse, stripedb's internal fields, the retryable-write fields of a write, the
 * tenant's quotas, the collection policy, a collection name where the command needs one.
 * f: req_fields of c->cmd.
 * Returns: 0 when the command may run, else the code of the refusal answered on c. */
static int job_checks(ctx *c, const px_cmd *cmd, const req_fields *f)
{
	char err[256];
	int code, st;

	/* the fields the coordinator and the proxy itself send to shards ($stripedbOrigin tags
	 * a migration's writes, $stripedbSession(s) writes session records,
	 * $stripedbVersion / $stripedbShardVersion gate): never from a client */
	if (f->has & RF(RF_INTERNAL))
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"field '%s' is internal to stripedb: a client cannot send it",
				bson_iter_key(&f->at[RF_INTERNAL].it));

	/* options the shards would refuse, refused before the proxy builds requests of its own
	 * from the command (merge sorts, findAndModify's candidate finds) */
	code = sdb_cmd_unsupported_option(cmd->name, c->cmd, err, sizeof err);
	if (code != 0)
		return px_error(c, code, "%s", err);
	/* MongoDB 6.0's collectionUUID (honoured by a shard, src/shard/commands.c): each shard
	 * creates its part of a collection under its own UUID, so no UUID names a sharded
	 * collection on every shard, and the proxy rebuilds most commands without the field:
	 * refused rather than ignored (issue #20; docs/compat.md) */
	if (f->has & RF(RF_COLLECTION_UUID))
		return px_error(c, 238,
				"collectionUUID is not supported through a stripedb proxy: the "
				"shards of a collection each hold it under their own UUID (send "
				"it to a shard, or leave it out)");
	if ((cmd->flags & PXC_WRITE) && c->tx == NULL &&
	    !proxy_txn_parse(c->cmd, cmd->stmts, &c->txn, &code, err, sizeof err))
		return px_error(c, code, "%s", err);
	/* a read's readConcern outside a transaction, refused here as a shard refuses it
	 * (common/readconcern.h): the per-chunk commands of a sharded read are built by the
	 * proxy and would otherwise lose it (issue #20); what passes is forwarded */
	if (!(cmd->flags & PXC_WRITE) && c->tx == NULL && !(f->has & RF(RF_AUTOCOMMIT)) &&
	    (f->has & RF(RF_READ_CONCERN))) {
		sdb_read_concern rcn;
		code = sdb_read_concern_parse(c->cmd, false, &rcn, err, sizeof err);
		if (code != 0)
			return px_error(c, code, "%s", err);
	}
	/* without $readPreference: c->rp_data stays NULL (run_job zeroes c) */
	if (((f->has & RF(RF_READ_PREF)) &&
	     (st = px_read_pref_check(c, cmd, &f->at[RF_READ_PREF].it)) != 0) ||
	    (st = px_admit(c, cmd)) != 0 || (st = px_policy_check(c, cmd)) != 0)
		return st;
	if ((cmd->flags & PXC_COLL) && c->coll == NULL)
		return px_error(c, WIRE_ERR_INVALID_NAMESPACE,
				"%s needs a collection name string as its first field", cmd->name);
	return 0;
}

/* The checks, then the handler. Returns: the status of the answer recorded. */
static int run_checked(ctx *c, const px_cmd *cmd, const req_fields *f)
{
	bool done;
	int st;

	if (!c->resumed && (st = job_checks(c, cmd, f)) != 0)
		return st;
	st = px_config_db(c, cmd, &done);
	if (done)
		return st;
	/* the command's collation (issue #20): validated as mongos does (the shards get it
	 * as sent), and the request thread's while the handler merges, sorts, dedups and
	 * runs pipeline stages */
	if (f->has & RF(RF_COLLATION)) {
		int code = 0;
		char err[512];

		if (sdb_collation_parse(&f->at[RF_COLLATION].it, &c->collator, &code, err,
					sizeof err) != 0)
			return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
	}
	const sdb_collator *prev = sdb_collation_use(c->collator);
	st = cmd->run(c);
	sdb_collation_use(prev);
	return st;
}

/* The client's deadline of c (monotonic ms) from its maxTimeMS (a positive number; 0 or
 * none: no limit), for shardconn_set_op_deadline; 0 for a getMore (its maxTimeMS is a
 * tailable cursor's await time, forwarded to the shard) and for every command of a
 * transaction (a statement or commit abandoned half-way would leave the transaction's
 * shards in a state the proxy does not track; the shards still get the statement's
 * maxTimeMS). f: req_fields of c->cmd (no maxTimeMS: no deadline). */
static uint64_t op_deadline(const ctx *c, const req_fields *f)
{
	int64_t ms;

	if (!(f->has & RF(RF_MAX_TIME)) || (f->has & RF(RF_AUTOCOMMIT)) ||
	    strcmp(wire_req_name(c->req), "getMore") == 0)
		return 0;
	/* a whole number by the shared getter's rules (a fractional, huge or NaN double is
	 * not one: no deadline here, and the handler's own checks refuse it) */
	if (!sdb_bson_as_int64(&f->at[RF_MAX_TIME].it, &ms))
		return 0;
	return ms > 0 && ms <= INT32_MAX ? sdb_mono_ms() + (uint64_t)ms : 0;
}

/* What the interruption check of the proxy's own evaluation looks at for one request. */
typedef struct px_limits {
	wire_req *req;
	uint64_t deadline_ms; /* op_deadline: 0 = none */
} px_limits;

/* The interruption check of what the proxy evaluates itself (storage's
 * sdb_store_set_interrupt, asked by the expression loops of the stages it runs after the
 * shards' part, storage/pipeline_expr*.c): killOp marked the request, or its maxTimeMS
 * passed (then marked expired: answered 50 MaxTimeMSExpired, as mongos). */
static bool px_interrupted(const void *arg)
{
	const px_limits *l = arg;

	if (wire_req_killed(l->req))
		return true;
	if (l->deadline_ms != 0 && sdb_mono_ms() >= l->deadline_ms) {
		wire_req_expire(l->req);
		return true;
	}
	return false;
}

/* A request on a worker thread: checks, the handler, its contract checked
 * (answer_check), then its one answer. */
static void run_job(void *arg)
{
	pjob *j = arg;
	ctx c;
	px_limits lim;
	px_answer ans;
	pxtxn_stmt st;
	bson_iter_t it;
	const char *name = wire_req_name(j->req);
	const px_cmd *cmd = px_cmd_find(name);
	int status;

	memset(&c, 0, sizeof c);
	memset(&ans, 0, sizeof ans);
	c.p = j->p;
	c.req = j->req;
	c.ans = &ans;
	c.cmd = wire_req_cmd(j->req);
	c.db = wire_req_db(j->req);
	c.deadline_ms = sdb_mono_ms() + (uint64_t)j->p->stale_retry_ms;
	c.user = j->user;
	c.resumed = j->resumed;
	if (bson_iter_init(&it, c.cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it)) {
		size_t dl, cl;

		c.coll = bson_iter_utf8(&it, NULL);
		dl = strlen(c.db);
		cl = strlen(c.coll);
		/* "db.coll", cut short as snprintf would (memcpy: snprintf was ~1% of a
		 * proxy point read) */
		if (dl > sizeof c.ns - 1)
			dl = sizeof c.ns - 1;
		memcpy(c.ns, c.db, dl);
		if (dl + 1 < sizeof c.ns) {
			c.ns[dl] = '.';
			if (cl > sizeof c.ns - 2 - dl)
				cl = sizeof c.ns - 2 - dl;
			memcpy(c.ns + dl + 1, c.coll, cl);
			c.ns[dl + 1 + cl] = '\0';
		} else {
			c.ns[dl] = '\0';
		}
	}
	shardconn_set_current_req(c.req); /* its waits are reported as such (shardconn.h) */
	/* the fields the checks look up, noted in one pass (issue #19); RF_AUTOCOMMIT is
	 * pxtxn_is_txn_cmd. Cannot fail: RF_N <= SDB_FIELDS_MAX (asserted at the table). */
	req_fields f;
	(void)sdb_bson_find_fields(c.cmd, req_field_names, RF_N, &f.has, f.at);
	c.nct_of = c.cmd;
	c.nct = (f.has & RF(RF_NO_CURSOR_TIMEOUT)) &&
		bson_iter_as_bool(&f.at[RF_NO_CURSOR_TIMEOUT].it);
	lim.req = c.req;
	lim.deadline_ms = op_deadline(&c, &f);
	shardconn_set_op_deadline(lim.deadline_ms);
	sdb_store_set_interrupt(px_interrupted, &lim);
	if (cmd == NULL) { /* registered from cmd_table only: cannot happen */
		status = px_error(&c, WIRE_ERR_COMMAND_NOT_FOUND, "no such command: '%s'", name);
		answer_check(name, status, &ans);
	} else if ((cmd->flags & PXC_TXN_END) || !(f.has & RF(RF_AUTOCOMMIT))) {
		status = run_checked(&c, cmd, &f);
		answer_check(name, status, &ans);
	} else if ((status = pxtxn_begin(&c, &st)) != 0) {
		answer_check(name, status, &ans);
	} else { /* a statement of a transaction (txnroute.h) */
		status = run_checked(&c, cmd, &f);
		answer_check(name, status, &ans);
		pxtxn_end(&c); /* may replace the answer with the transaction's failure */
	}
	shardconn_set_current_req(NULL);
	shardconn_set_op_deadline(0);
	sdb_store_set_interrupt(NULL, NULL);
	px_answer_send(c.req, &ans);
	proxy_txn_free(&c.txn);
	free(j->user);
	free(j);
}

void px_exec_submit(proxy *p, wire_req *req)
{
	pjob *j = sdb_calloc(1, sizeof *j);

	const char *user = p->auth ? auth_gate_conn_user(wire_req_conn(req)) : NULL;

	j->p = p;
	j->req = req;
	j->user = user ? sdb_strdup(user) : NULL; /* the loop thread owns the connection state */
	/* a getMore may park (a change stream's, cswait.h): its client's close wakes it
	 * (role.c's gone hook), so it is dropped at once, not at its await's end */
	if (strcmp(wire_req_name(req), "getMore") == 0)
		wire_req_watch_close(req);
	shardconn_submit(p->sc, run_job, j);
}

static void h_submit(wire_req *req, void *data)
{
	proxy *p = data;

	/* a point read or a small write of an unsharded collection: sent and answered by
	 * the loop thread itself when it can (forwarder.h) */
	if (px_forward_try(p->fw, req))
		return;
	px_exec_submit(p, req);
}

void px_exec_resume(proxy *p, wire_req *req, const char *user)
{
	pjob *j = sdb_calloc(1, sizeof *j);

	j->p = p;
	j->req = req;
	j->user = user ? sdb_strdup(user) : NULL;
	j->resumed = true;
	shardconn_submit(p->sc, run_job, j);
}

/* killOp (issue #20), on the loop thread, which owns the connections: a number is one of
 * the proxy's own operations (mongos' killLocalOperation: marked killed, see
 * wire_req_kill; answered {ok: 1} whether or not it exists, and when the caller may not
 * kill it: another user's); a string "shard:opid" goes to a worker (px_do_kill_op). */
static void h_kill_op(wire_req *req, void *data)
{
	proxy *p = data;
	bson_iter_t it;
	char err[256];
	int32_t opid;
	int code;

	if (strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "killOp may only be run against the admin database.");
		return;
	}
	if (!bson_iter_init_find(&it, wire_req_cmd(req), "op")) {
		wire_req_error(req, 50759, "Did not provide \"op\" field");
		return;
	}
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		h_submit(req, data);
		return;
	}
	if (!BSON_ITER_HOLDS_NUMBER(&it) && !BSON_ITER_HOLDS_DECIMAL128(&it)) {
		wire_req_error(req, 50760, "\"op\" field was of unsupported type %s",
			       sdb_bson_type_name(bson_iter_type(&it)));
		return;
	}
	code = sdb_curop_parse_opid(wire_req_cmd(req), &opid, err, sizeof err);
	if (code) {
		wire_req_error(req, code, "%s", err);
		return;
	}
	wire_req *victim = wire_server_find_op(p->srv, opid);
	const char *me = p->auth ? auth_gate_conn_user(wire_req_conn(req)) : NULL;
	const char *owner = victim && p->auth ? auth_gate_conn_user(wire_req_conn(victim)) : NULL;
	bool may = me == owner || (me && (strcmp(me, "__system") == 0 ||
					  (owner && strcmp(me, owner) == 0)));
	if (me && strcmp(me, "__system") != 0 && (!victim || !may)) {
		/* a tenant (no killop action): only its own op, else Unauthorized, as
		 * mongod's KillOpCmdBase::checkAuthForCommand */
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED, "Unauthorized");
		return;
	}
	if (victim && victim != req && may) {
		wire_req_kill(victim);
		/* a parked change stream getMore is answered now (Interrupted), not at its
		 * await's end */
		if (p->csw != NULL)
			px_cswait_wake_req(p->csw, victim);
	}
	wire_req_reply(req, NULL);
}

/* currentOp (issue #20), on the loop thread: a tenant's {$ownOps: true} (the gate lets a
 * tenant through with it only) is answered here with its own operations on this proxy,
 * the only ones that are its own (the shards see the proxy's connections); anything else
 * gathers the shards' ops on a worker (px_do_current_op). */
static void h_current_op(wire_req *req, void *data)
{
	proxy *p = data;
	const char *me = p->auth ? auth_gate_conn_user(wire_req_conn(req)) : NULL;

	if (!me || strcmp(me, "__system") == 0) {
		h_submit(req, data);
		return;
	}
	px_current_op_own(p->srv, req, me);
}

void proxy_exec_register(proxy *p)
{
	for (size_t i = 0; i < sizeof cmd_table / sizeof cmd_table[0]; i++)
		wire_server_register(p->srv, cmd_table[i].name, h_submit);
	wire_server_refuse_js(p->srv);
	wire_server_register(p->srv, "killOp", h_kill_op);
	wire_server_register(p->srv, "currentOp", h_current_op);
}

