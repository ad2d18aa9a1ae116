/* Command handlers of the proxy (issue #6): routing, scatter/gather, merge, StaleConfig
 * retries. Every handler runs on a worker thread (shardconn_submit) and completes its
 * request exactly once with wire_req_reply / wire_req_error.
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
#include "proxy/proxy.h"
#include "proxy/txn.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

#define ERR_SHARD_KEY_NOT_FOUND 61
#define ERR_CURSOR_IN_USE 292
#define TWO_PHASE_IN_BATCH 5000
#define COLLECT_BATCH 5000

typedef struct ctx {
	proxy *p;
	wire_req *req;
	const char *user; /* the authenticated user (copied on the loop thread), or NULL */
	const bson_t *cmd;
	const char *db;
	char ns[512];
	const char *coll;
	uint64_t deadline_ms;
	int backoff_ms;
	proxy_txn txn; /* session fields of a retryable write (txn.h), forwarded to shards */
} ctx;

static uint64_t now_ms(void)
{
	return uv_hrtime() / 1000000u;
}

/* ---------- small helpers ---------- */

static bool is_session_field(const char *k)
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
static void copy_cmd(const bson_t *cmd, bson_t *out, const char *const *skip)
{
	bson_iter_t it;
	size_t i;

	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool drop = is_session_field(k);
		for (i = 0; skip && skip[i] && !drop; i++)
			if (strcmp(k, skip[i]) == 0)
				drop = true;
		if (!drop)
			bson_append_iter(out, k, -1, &it);
	}
}

static void append_version(bson_t *cmd, const route_chunk *ch)
{
	bson_t v;

	bson_append_document_begin(cmd, "$stripedbVersion", -1, &v);
	BSON_APPEND_UTF8(&v, "chunk", ch->id);
	BSON_APPEND_INT64(&v, "token", ch->token);
	bson_append_document_end(cmd, &v);
}

static bool get_doc(const bson_t *d, const char *name, bson_t *out)
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
static bool stmt_filter(const bson_iter_t *it, bson_t *sq)
{
	bson_t st;
	uint32_t len;
	const uint8_t *data;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	if (!bson_init_static(&st, data, len))
		return false;
	if (!get_doc(&st, "q", sq))
		bson_init(sq);
	return true;
}

static bool get_array(const bson_t *d, const char *name, bson_t *out)
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
 * def when absent or not one. Client arguments are range-checked with client_int. */
static int64_t get_int(const bson_t *d, const char *name, int64_t def)
{
	bson_iter_t it;
	int64_t v;

	if (bson_iter_init_find(&it, d, name) && sdb_bson_as_int64(&it, &v))
		return v;
	return def;
}

/* The client's argument `name` of c->cmd as a whole number in [lo, hi] (def when absent),
 * by common/bsonget.h's rules. On a bad value replies its MongoDB error and returns false. */
static bool client_int(ctx *c, const char *name, int64_t lo, int64_t hi, int64_t def,
		       int64_t *out)
{
	sdb_bson_err e;

	if (sdb_bson_find_int64(c->cmd, name, lo, hi, def, out, &e) == 0)
		return true;
	wire_req_error(c->req, e.code, "%s", e.msg);
	return false;
}

static bool get_bool(const bson_t *d, const char *name, bool def)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name))
		return bson_iter_as_bool(&it);
	return def;
}

/* True when doc uses server-side JavaScript ($where, $function, $accumulator). */
static bool uses_js(const bson_t *doc, int depth)
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
			if (bson_init_static(&sub, data, len) && uses_js(&sub, depth + 1))
				return true;
		}
	}
	return false;
}

static void reply_copy(wire_req *req, const bson_t *reply)
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
static void reply_shard_error(wire_req *req, int cls, const bson_t *reply, const char *neterr)
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
static void reply_retryable_net_error(wire_req *req, bool nothing_written, const char *neterr)
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
static bool stale_backoff(ctx *c)
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

static route_coll *refresh(ctx *c, route_coll *old)
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
static int run_on(ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid, bson_t *reply,
		  char *neterr, size_t nelen)
{
	uint32_t local = 0;

	return shardconn_command(c->p->sc, shard, c->db, cmd, sid ? sid : &local, reply, neterr,
				 nelen);
}

/* Wrap a cursor reply of one shard into a proxy cursor and answer the client. */
static void answer_cursor(ctx *c, proxy_cursor *cur, int64_t batch, bool single,
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

static void stream_init(pstream *s, const char *shard, const char *db, const char *coll)
{
	memset(s, 0, sizeof *s);
	s->shard = sdb_strdup(shard);
	s->db = sdb_strdup(db);
	s->coll = sdb_strdup(coll);
	s->chunk = -1;
	bson_init(&s->err_reply);
}

/* Forward a cursor-returning command to one shard as is, and answer through a proxy cursor. */
static void forward_cursor(ctx *c, const char *shard, const bson_t *cmd, int64_t batch,
			   bool single)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	pstream *s = proxy_calloc_bson(1, sizeof *s);
	char nerr[256];
	int r;
	bson_iter_t it, cur;
	const char *ns = c->ns;
	char nsbuf[512];

	copy_cmd(cmd, &fwd, NULL);
	stream_init(s, shard, c->db, c->coll ? c->coll : "");
	r = run_on(c, shard, &fwd, &s->server_id, &reply, nerr, sizeof nerr);
	if (r != SHARDCONN_OK) {
		reply_shard_error(c->req, r, &reply, nerr);
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
		reply_copy(c->req, &reply);
		goto fail;
	}
	bson_destroy(&reply);
	bson_destroy(&fwd);
	answer_cursor(c, proxy_cursor_new(c->p, ns, s, 1, NULL, NULL, 0, 0), batch, single,
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
static void forward_plain(ctx *c, const char *shard, const bson_t *cmd)
{
	bson_t fwd = BSON_INITIALIZER, reply;
	char nerr[256];
	int r;

	copy_cmd(cmd, &fwd, NULL);
	if (c->txn.on && cmd == c->cmd) {
		/* an unsharded collection: the whole retryable write (copy_cmd kept its
		 * stmtId / stmtIds as given) */
		BSON_APPEND_DOCUMENT(&fwd, "lsid", &c->txn.lsid);
		BSON_APPEND_INT64(&fwd, "txnNumber", c->txn.txn);
	}
	r = run_on(c, shard, &fwd, NULL, &reply, nerr, sizeof nerr);
	if (r == SHARDCONN_OK || r == SHARDCONN_CMD_ERR || r == SHARDCONN_STALE)
		reply_copy(c->req, &reply);
	else if (c->txn.on && cmd == c->cmd)
		reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
	else
		reply_shard_error(c->req, r, &reply, nerr);
	bson_destroy(&reply);
	bson_destroy(&fwd);
}

static bool with_primary(ctx *c, char **primary)
{
	*primary = proxy_primary(c->p);
	if (*primary == NULL) {
		wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND,
			       "no shard is registered in the metadata service");
		return false;
	}
	return true;
}

/* ---------- scatter reads: per-chunk streams ---------- */

/* Options of a client's find that each per-chunk find carries as they are. */
static void copy_find_options(const bson_t *cmd, bson_t *out)
{
	static const char *const keep[] = {"hint", "collation", "maxTimeMS", "comment",
					   "allowDiskUse", "let", "min", "max", NULL};
	bson_iter_t it;
	size_t i;

	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it))
		for (i = 0; keep[i]; i++)
			if (strcmp(bson_iter_key(&it), keep[i]) == 0)
				bson_append_iter(out, keep[i], -1, &it);
}

typedef struct scatter {
	ctx *c;
	route_coll *rc;
	size_t *chunks; /* chunk indexes */
	size_t n;
	pstream *s;     /* n streams */
	bson_t *cmds;   /* n commands */
} scatter;

static void scatter_one(void *arg, size_t i)
{
	scatter *sc = arg;
	pstream *s = &sc->s[i];
	bson_t reply;

	s->status = run_on(sc->c, s->shard, &sc->cmds[i], &s->server_id, &reply, s->neterr,
			   sizeof s->neterr);
	if (s->status == SHARDCONN_OK) {
		if (pstream_take_batch(s, &reply, "firstBatch") != 0) {
			s->status = SHARDCONN_CMD_ERR;
			bson_destroy(&s->err_reply);
			bson_init(&s->err_reply);
			BSON_APPEND_INT32(&s->err_reply, "code", WIRE_ERR_INTERNAL);
			BSON_APPEND_UTF8(&s->err_reply, "errmsg", "shard answered without a cursor");
		}
	} else {
		bson_destroy(&s->err_reply);
		bson_copy_to(&reply, &s->err_reply);
	}
	bson_destroy(&reply);
}

/* Open one find cursor per selected chunk. base is the find command body without the
 * collection name, filter, projection or version (those are added here).
 * Returns SHARDCONN_OK with *out streams (count *nout), or the first failure class with
 * *fail pointing at the failed stream's error (streams freed, shard cursors killed). */
static int scatter_open(ctx *c, route_coll *rc, const bool *sel, const bson_t *filter,
			const bson_t *sort, const bson_t *proj, int64_t batch, pstream **out,
			size_t *nout, bson_t *err_reply, char *neterr, size_t nelen)
{
	scatter sc;
	size_t i, k = 0;
	int cls = SHARDCONN_OK;

	memset(&sc, 0, sizeof sc);
	sc.c = c;
	sc.rc = rc;
	sc.chunks = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sc.chunks);
	for (i = 0; i < rc->nchunks; i++)
		if (sel[i])
			sc.chunks[sc.n++] = i;
	sc.s = proxy_calloc_bson(sc.n, sizeof *sc.s);
	sc.cmds = proxy_calloc_bson(sc.n, sizeof *sc.cmds);
	for (i = 0; i < sc.n; i++) {
		route_chunk *ch = &rc->chunks[sc.chunks[i]];
		stream_init(&sc.s[i], ch->shard, c->db, c->coll);
		sc.s[i].rcoll = rc;
		route_coll_ref(rc);
		sc.s[i].chunk = (ssize_t)sc.chunks[i];
		bson_init(&sc.cmds[i]);
		BSON_APPEND_UTF8(&sc.cmds[i], "find", c->coll);
		if (filter && !bson_empty(filter))
			BSON_APPEND_DOCUMENT(&sc.cmds[i], "filter", filter);
		if (sort && !bson_empty(sort))
			BSON_APPEND_DOCUMENT(&sc.cmds[i], "sort", sort);
		if (proj && !bson_empty(proj))
			BSON_APPEND_DOCUMENT(&sc.cmds[i], "projection", proj);
		BSON_APPEND_INT64(&sc.cmds[i], "batchSize", batch);
		copy_find_options(c->cmd, &sc.cmds[i]);
		append_version(&sc.cmds[i], ch);
	}
	shardconn_fanout(c->p->sc, sc.n, scatter_one, &sc);
	for (i = 0; i < sc.n; i++) {
		if (sc.s[i].status != SHARDCONN_OK && cls == SHARDCONN_OK) {
			cls = sc.s[i].status;
			bson_copy_to(&sc.s[i].err_reply, err_reply);
			snprintf(neterr, nelen, "%s", sc.s[i].neterr);
		}
		if (sc.s[i].status == SHARDCONN_STALE)
			cls = SHARDCONN_STALE;
	}
	for (i = 0; i < sc.n; i++)
		bson_destroy(&sc.cmds[i]);
	free(sc.cmds);
	free(sc.chunks);
	if (cls != SHARDCONN_OK) {
		proxy_cursor *tmp = proxy_cursor_new(c->p, c->ns, sc.s, sc.n, NULL, NULL, 0, 0);
		proxy_cursor_destroy(c->p, tmp);
		*out = NULL;
		*nout = 0;
		return cls;
	}
	*out = sc.s;
	*nout = sc.n;
	(void)k;
	return SHARDCONN_OK;
}

/* A merged cursor over the chunks a filter targets, retrying StaleConfig within budget.
 * On failure the client has been answered and NULL is returned. */
static proxy_cursor *open_merged(ctx *c, route_coll **rcp, const bson_t *filter,
				 const bson_t *sort_spec, const bson_t *shard_proj, merge_sort *sort,
				 sdb_projection *proj, int64_t skip, int64_t limit, int64_t batch)
{
	for (;;) {
		route_coll *rc = *rcp;
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact;
		size_t nsel = route_target(rc, filter, sel, &exact);
		pstream *s;
		size_t n;
		bson_t err_reply;
		char nerr[256];
		int cls;

		bson_init(&err_reply);
		if (nsel < rc->nchunks)
			sdb_counter_inc(c->p->m_targeted);
		else
			sdb_counter_inc(c->p->m_scatter);
		cls = scatter_open(c, rc, sel, filter, sort_spec, shard_proj, batch, &s, &n,
				   &err_reply, nerr, sizeof nerr);
		free(sel);
		if (cls == SHARDCONN_OK) {
			bson_destroy(&err_reply);
			return proxy_cursor_new(c->p, c->ns, s, n, sort, proj, skip, limit);
		}
		if (cls == SHARDCONN_STALE && stale_backoff(c)) {
			bson_destroy(&err_reply);
			*rcp = refresh(c, *rcp);
			continue;
		}
		reply_shard_error(c->req, cls, &err_reply, nerr);
		bson_destroy(&err_reply);
		merge_sort_free(sort);
		sdb_projection_free(proj);
		return NULL;
	}
}

static route_coll *route_or_fail(ctx *c)
{
	char err[256];
	route_coll *rc = proxy_route(c->p, c->ns, false, err, sizeof err);

	if (rc == NULL)
		wire_req_error(c->req, WIRE_ERR_HOST_UNREACHABLE,
			       "routing of %s unavailable: %s", c->ns, err);
	return rc;
}

/* ---------- find / getMore / killCursors ---------- */

static void do_find(ctx *c)
{
	bson_t filter, sort_spec, proj_spec;
	bool has_filter = get_doc(c->cmd, "filter", &filter);
	bool has_sort = get_doc(c->cmd, "sort", &sort_spec);
	bool has_proj = get_doc(c->cmd, "projection", &proj_spec);
	int64_t skip, limit, batch;
	bool single = get_bool(c->cmd, "singleBatch", false);
	route_coll *rc;
	merge_sort *sort = NULL;
	sdb_projection *proj = NULL;
	proxy_cursor *cur;
	int code = 0;
	char err[256];
	int64_t pushed;

	if (has_filter && uses_js(&filter, 0)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	/* find_command.idl: skip, limit and batchSize are safeInt64 with `gte: 0` */
	if (!client_int(c, "skip", 0, INT64_MAX, 0, &skip) ||
	    !client_int(c, "limit", 0, INT64_MAX, 0, &limit) ||
	    !client_int(c, "batchSize", 0, INT64_MAX, 101, &batch))
		return;
	rc = route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (with_primary(c, &primary)) {
			forward_cursor(c, primary, c->cmd, batch, single);
			free(primary);
		}
		return;
	}
	if (merge_sort_parse(has_sort ? &sort_spec : NULL, &sort, &code, err, sizeof err) != 0) {
		route_coll_unref(rc);
		wire_req_error(c->req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	if (has_proj && !bson_empty(&proj_spec) &&
	    sdb_projection_new(&proj_spec, &proj, &code, err, sizeof err) != 0) {
		route_coll_unref(rc);
		merge_sort_free(sort);
		wire_req_error(c->req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	pushed = merge_pushdown_limit(skip, limit);
	if (pushed == 0 || pushed > 1000)
		pushed = 1000;
	if (batch > 0 && batch + skip < pushed)
		pushed = batch + skip;
	if (pushed < 1)
		pushed = 1;
	cur = open_merged(c, &rc, has_filter ? &filter : NULL, has_sort ? &sort_spec : NULL, NULL,
			  sort, proj, skip, limit, pushed);
	route_coll_unref(rc);
	if (cur)
		answer_cursor(c, cur, batch, single, "firstBatch", c->ns);
}

static void do_get_more(ctx *c)
{
	bson_iter_t it;
	int64_t id = 0;
	const char *coll = NULL;
	proxy_cursor *cur;
	bson_t *out, cd, arr;
	int code = 0, r;
	char err[512], ns[512];

	if (bson_iter_init_find(&it, c->cmd, "getMore") && BSON_ITER_HOLDS_NUMBER(&it))
		id = bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, c->cmd, "collection") && BSON_ITER_HOLDS_UTF8(&it))
		coll = bson_iter_utf8(&it, NULL);
	if (id == 0 || coll == NULL) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "getMore needs a cursor id and collection");
		return;
	}
	snprintf(ns, sizeof ns, "%s.%s", c->db, coll);
	switch (proxy_cursor_check(c->p, id, ns, c->user)) {
	case PROXY_CURSOR_OTHER_USER: /* MongoDB's wording; the namespace is not revealed */
		wire_req_error(c->req, WIRE_ERR_UNAUTHORIZED,
			       "cursor id %lld was not created by the authenticated user",
			       (long long)id);
		return;
	case PROXY_CURSOR_OTHER_NS:
		wire_req_error(c->req, WIRE_ERR_UNAUTHORIZED,
			       "Requested getMore on namespace '%s', but cursor %lld belongs to a "
			       "different namespace",
			       ns, (long long)id);
		return;
	case PROXY_CURSOR_OK:
		break;
	}
	cur = proxy_cursor_checkout(c->p, id, NULL);
	if (cur == NULL) {
		wire_req_error(c->req, WIRE_ERR_CURSOR_NOT_FOUND, "cursor id %lld not found",
			       (long long)id);
		return;
	}
	bson_init(&arr);
	r = proxy_cursor_fill(c->p, cur, &arr, get_int(c->cmd, "batchSize", 0) > 0 ?
						      get_int(c->cmd, "batchSize", 0) : -1,
			      &code, err,
			      sizeof err);
	if (r < 0) {
		bson_destroy(&arr);
		proxy_cursor_destroy(c->p, cur);
		wire_req_error(c->req, code ? code : WIRE_ERR_INTERNAL, "%s", err);
		return;
	}
	out = bson_new();
	bson_append_document_begin(out, "cursor", -1, &cd);
	if (r == 1) {
		proxy_cursor_destroy(c->p, cur);
		BSON_APPEND_INT64(&cd, "id", 0);
	} else {
		proxy_cursor_checkin(c->p, cur);
		BSON_APPEND_INT64(&cd, "id", id);
	}
	BSON_APPEND_UTF8(&cd, "ns", ns);
	bson_append_array(&cd, "nextBatch", -1, &arr);
	bson_append_document_end(out, &cd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	bson_destroy(&arr);
	wire_req_reply(c->req, out);
}

static void do_kill_cursors(ctx *c)
{
	bson_t ids, *out, killed, notfound, empty;
	bson_iter_t it;
	size_t nk = 0, nn = 0;
	char k[24];

	/* every cursor named must be the caller's and of this namespace, or nothing is killed
	 * (MongoDB: Unauthorized) */
	if (get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
		while (bson_iter_next(&it)) {
			int64_t id = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
			if (proxy_cursor_check(c->p, id, c->ns, c->user) != PROXY_CURSOR_OK) {
				wire_req_error(c->req, WIRE_ERR_UNAUTHORIZED,
					       "not authorized to kill cursor %lld on %s",
					       (long long)id, c->ns);
				return;
			}
		}
	}
	out = bson_new();

	bson_append_array_begin(out, "cursorsKilled", -1, &killed);
	if (get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
		while (bson_iter_next(&it)) {
			int64_t id = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
			proxy_cursor *cur = proxy_cursor_checkout(c->p, id, NULL);
			if (cur) {
				proxy_cursor_destroy(c->p, cur);
				snprintf(k, sizeof k, "%zu", nk++);
				BSON_APPEND_INT64(&killed, k, id);
			}
		}
	}
	bson_append_array_end(out, &killed);
	bson_append_array_begin(out, "cursorsNotFound", -1, &notfound);
	if (get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
		while (bson_iter_next(&it)) {
			int64_t id = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
			bool was_killed = false;
			bson_iter_t kit;
			if (bson_iter_init(&kit, out) && bson_iter_find(&kit, "cursorsKilled")) {
				bson_iter_t a;
				bson_iter_recurse(&kit, &a);
				while (bson_iter_next(&a))
					if (bson_iter_as_int64(&a) == id)
						was_killed = true;
			}
			if (!was_killed) {
				snprintf(k, sizeof k, "%zu", nn++);
				BSON_APPEND_INT64(&notfound, k, id);
			}
		}
	}
	bson_append_array_end(out, &notfound);
	bson_append_array_begin(out, "cursorsAlive", -1, &empty);
	bson_append_array_end(out, &empty);
	bson_append_array_begin(out, "cursorsUnknown", -1, &empty);
	bson_append_array_end(out, &empty);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	wire_req_reply(c->req, out);
}

/* ---------- write results ---------- */

typedef struct wresult {
	int64_t n, n_modified;
	bson_t errors;   /* array being collected unsorted: {index, code, errmsg, ...} */
	size_t nerr;
	bson_t upserted; /* {index, _id} */
	size_t nups;
	uv_mutex_t mu;
	bool stop;       /* ordered batch stopped */
	int64_t first_err_index;
	size_t n_net;        /* statements failed by a network error (outcome unknown or not) */
	size_t n_unexecuted; /* ... of which the shard certainly did not execute */
	char net_msg[512];   /* the first network error */
} wresult;

static void wresult_init(wresult *w)
{
	memset(w, 0, sizeof *w);
	bson_init(&w->errors);
	bson_init(&w->upserted);
	uv_mutex_init(&w->mu);
	w->first_err_index = INT64_MAX;
}

static void wresult_destroy(wresult *w)
{
	bson_destroy(&w->errors);
	bson_destroy(&w->upserted);
	uv_mutex_destroy(&w->mu);
}

/* Add a write error at the client's index idx: from a shard's entry (copied except index)
 * or from code/msg; label: with errorLabels ["RetryableWriteError"] (it certainly did not
 * execute). */
static void wresult_error_ex(wresult *w, int64_t idx, const bson_iter_t *entry, int code,
			     const char *msg, bool label)
{
	bson_t e;
	char k[24];

	uv_mutex_lock(&w->mu);
	snprintf(k, sizeof k, "%zu", w->nerr++);
	bson_append_document_begin(&w->errors, k, -1, &e);
	BSON_APPEND_INT64(&e, "index", idx);
	if (entry) {
		bson_iter_t it;
		bson_iter_recurse(entry, &it);
		while (bson_iter_next(&it))
			if (strcmp(bson_iter_key(&it), "index") != 0)
				bson_append_iter(&e, bson_iter_key(&it), -1, &it);
	} else {
		BSON_APPEND_INT32(&e, "code", code);
		BSON_APPEND_UTF8(&e, "codeName", wire_code_name(code));
		BSON_APPEND_UTF8(&e, "errmsg", msg);
	}
	if (label) {
		bson_t labels;
		bson_append_array_begin(&e, "errorLabels", -1, &labels);
		BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
		bson_append_array_end(&e, &labels);
	}
	bson_append_document_end(&w->errors, &e);
	if (idx < w->first_err_index)
		w->first_err_index = idx;
	uv_mutex_unlock(&w->mu);
}

static void wresult_error(wresult *w, int64_t idx, const bson_iter_t *entry, int code,
			  const char *msg)
{
	wresult_error_ex(w, idx, entry, code, msg, false);
}

/* A statement that failed on shard write reply (class cls): a shard's error, or a network
 * error counted for answer_write and labelled when the shard certainly did not run it. */
static void wresult_error_from(wresult *w, int64_t idx, const bson_t *reply, int cls,
			       const char *neterr);

static void wresult_upserted(wresult *w, int64_t idx, const bson_iter_t *id)
{
	bson_t e;
	char k[24];

	uv_mutex_lock(&w->mu);
	snprintf(k, sizeof k, "%zu", w->nups++);
	bson_append_document_begin(&w->upserted, k, -1, &e);
	BSON_APPEND_INT64(&e, "index", idx);
	bson_append_iter(&e, "_id", -1, id);
	bson_append_document_end(&w->upserted, &e);
	uv_mutex_unlock(&w->mu);
}

/* Documents kept as (data, len) rather than bson_t: a bson_t view points at itself and
 * must never be moved (qsort, realloc). */
typedef struct idxdoc {
	int64_t idx;
	const uint8_t *data;
	uint32_t len;
} idxdoc;

static int idx_cmp(const void *a, const void *b)
{
	const idxdoc *x = a, *y = b;

	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Append an array `name` of the documents of src sorted by their index field. */
static void append_sorted(bson_t *out, const char *name, const bson_t *src, size_t n)
{
	idxdoc *v = sdb_calloc(n ? n : 1, sizeof *v);
	bson_iter_t it;
	bson_t arr;
	size_t i = 0;
	char k[24];

	if (bson_iter_init(&it, src))
		while (bson_iter_next(&it) && i < n) {
			uint32_t len;
			const uint8_t *data;
			bson_t view;
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&view, data, len))
				continue;
			v[i].data = data;
			v[i].len = len;
			v[i].idx = get_int(&view, "index", 0);
			i++;
		}
	sdb_qsort(v, i, sizeof *v, idx_cmp);
	bson_append_array_begin(out, name, -1, &arr);
	for (size_t j = 0; j < i; j++) {
		bson_t view;
		snprintf(k, sizeof k, "%zu", j);
		if (bson_init_static(&view, v[j].data, v[j].len))
			BSON_APPEND_DOCUMENT(&arr, k, &view);
	}
	bson_append_array_end(out, &arr);
	free(v);
}

static void answer_write(ctx *c, wresult *w, bool is_update)
{
	bson_t *out;

	/* A network error in a retryable write: the whole command may be resent (the shards
	 * answer executed statements from their records), so it is a top-level retryable
	 * error, as a driver expects. Without session fields the same holds when no statement
	 * was executed and every failure certainly did not execute. */
	if (w->n_net > 0 &&
	    (c->txn.on || (w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0))) {
		reply_retryable_net_error(c->req,
					  w->n_unexecuted == w->nerr && w->n == 0 && w->nups == 0,
					  w->net_msg);
		return;
	}
	out = bson_new();

	/* int32 as mongod and mongos send them: libmongoc reads n/nModified only when they
	 * hold an int32 (an int64 n made update_one report matchedCount 0) */
	BSON_APPEND_INT32(out, "n", (int32_t)(w->n > INT32_MAX ? INT32_MAX : w->n));
	if (is_update) {
		BSON_APPEND_INT32(out, "nModified",
				  (int32_t)(w->n_modified > INT32_MAX ? INT32_MAX : w->n_modified));
		if (w->nups)
			append_sorted(out, "upserted", &w->upserted, w->nups);
	}
	if (w->nerr)
		append_sorted(out, "writeErrors", &w->errors, w->nerr);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	wire_req_reply(c->req, out);
}

/* Fold one shard write reply into w; map[i] is the client index of the i-th statement
 * sent. Returns the number of statements the shard reported as errors. */
static size_t fold_write_reply(wresult *w, const bson_t *reply, const int64_t *map, size_t nmap)
{
	bson_iter_t it, arr;
	size_t nerr = 0;

	uv_mutex_lock(&w->mu);
	w->n += get_int(reply, "n", 0);
	w->n_modified += get_int(reply, "nModified", 0);
	uv_mutex_unlock(&w->mu);
	if (bson_iter_init_find(&it, reply, "upserted") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t e, id;
			int64_t i = 0;
			if (!bson_iter_recurse(&arr, &e))
				continue;
			if (bson_iter_find(&e, "index"))
				i = bson_iter_as_int64(&e);
			bson_iter_recurse(&arr, &id);
			if (bson_iter_find(&id, "_id") && i >= 0 && (size_t)i < nmap)
				wresult_upserted(w, map[i], &id);
		}
	}
	if (bson_iter_init_find(&it, reply, "writeErrors") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t e;
			int64_t i = 0;
			if (!bson_iter_recurse(&arr, &e))
				continue;
			if (bson_iter_find(&e, "index"))
				i = bson_iter_as_int64(&e);
			if (i < 0 || (size_t)i >= nmap)
				i = 0;
			wresult_error(w, map[i], &arr, 0, NULL);
			nerr++;
		}
	}
	return nerr;
}

static void error_from_reply(const bson_t *reply, int cls, const char *neterr, int *code,
			     char *msg, size_t msglen);

static void wresult_error_from(wresult *w, int64_t idx, const bson_t *reply, int cls,
			       const char *neterr)
{
	int code;
	char msg[512];
	bool unexecuted = cls == SHARDCONN_NET_ERR && shardconn_unexecuted(reply);

	error_from_reply(reply, cls, neterr, &code, msg, sizeof msg);
	if (cls == SHARDCONN_NET_ERR) {
		uv_mutex_lock(&w->mu);
		if (w->n_net++ == 0)
			snprintf(w->net_msg, sizeof w->net_msg, "%s", msg);
		if (unexecuted)
			w->n_unexecuted++;
		uv_mutex_unlock(&w->mu);
	}
	wresult_error_ex(w, idx, NULL, code, msg, unexecuted);
}

static void error_from_reply(const bson_t *reply, int cls, const char *neterr, int *code,
			     char *msg, size_t msglen)
{
	bson_iter_t it;

	if (cls == SHARDCONN_NET_ERR) {
		*code = WIRE_ERR_HOST_UNREACHABLE;
		snprintf(msg, msglen, "%s", neterr);
		return;
	}
	*code = (int)get_int(reply, "code", WIRE_ERR_INTERNAL);
	if (bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(msg, msglen, "%s", bson_iter_utf8(&it, NULL));
	else
		snprintf(msg, msglen, "shard error");
}

/* ---------- insert ---------- */

typedef struct ins_doc {
	int64_t idx;      /* client index */
	const uint8_t *data; /* the document, inside the command */
	uint32_t len;
	ssize_t chunk;
} ins_doc;

static void ins_view(const ins_doc *d, bson_t *view)
{
	if (!bson_init_static(view, d->data, d->len))
		bson_init(view);
}

typedef struct ins_group {
	ctx *c;
	route_coll *rc;
	ins_doc **docs;
	size_t n;
	ssize_t chunk;
	bool ordered;
	wresult *w;
	int cls;        /* result class */
	size_t done;    /* docs handled before a stale answer (ordered) */
} ins_group;

static void ins_send(void *arg, size_t gi)
{
	ins_group *g = &((ins_group *)arg)[gi];
	route_chunk *ch = &g->rc->chunks[g->chunk];
	bson_t cmd = BSON_INITIALIZER, arr, reply;
	int64_t *map = sdb_calloc(g->n, sizeof *map);
	char k[24], nerr[256];
	size_t i;

	BSON_APPEND_UTF8(&cmd, "insert", g->c->coll);
	bson_append_array_begin(&cmd, "documents", -1, &arr);
	for (i = 0; i < g->n; i++) {
		bson_t view;
		snprintf(k, sizeof k, "%zu", i);
		ins_view(g->docs[i], &view);
		BSON_APPEND_DOCUMENT(&arr, k, &view);
		map[i] = g->docs[i]->idx;
	}
	bson_append_array_end(&cmd, &arr);
	BSON_APPEND_BOOL(&cmd, "ordered", g->ordered);
	append_version(&cmd, ch);
	proxy_txn_append(&g->c->txn, &cmd, map, g->n);
	g->cls = run_on(g->c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (g->cls == SHARDCONN_OK) {
		fold_write_reply(g->w, &reply, map, g->n);
	} else if (g->cls != SHARDCONN_STALE) {
		for (i = 0; i < g->n; i++) {
			wresult_error_from(g->w, g->docs[i]->idx, &reply, g->cls, nerr);
			if (g->ordered)
				break;
		}
	}
	free(map);
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* Insert docs (client order) with routing rc; retries StaleConfig parts. */
static void insert_docs(ctx *c, route_coll **rcp, ins_doc **docs, size_t n, bool ordered,
			wresult *w)
{
	size_t i;

	while (n > 0) {
		route_coll *rc = *rcp;
		ins_group *g = sdb_calloc(n, sizeof *g);
		size_t ng = 0, nstale = 0;
		ins_doc **stale = sdb_calloc(n, sizeof *stale);
		char err[256];

		for (i = 0; i < n; i++) {
			bson_t key = BSON_INITIALIZER, view;
			docs[i]->chunk = -1;
			ins_view(docs[i], &view);
			if (route_key_from_doc(rc, &view, &key, err, sizeof err) != 0) {
				bson_destroy(&key);
				wresult_error(w, docs[i]->idx, NULL, WIRE_ERR_BAD_VALUE, err);
				if (ordered)
					break;
				continue;
			}
			docs[i]->chunk = route_find_chunk(rc, &key);
			bson_destroy(&key);
			if (docs[i]->chunk < 0) {
				wresult_error(w, docs[i]->idx, NULL, WIRE_ERR_SHARD_NOT_FOUND,
					      "no chunk of the routing table holds this shard key");
				if (ordered)
					break;
			}
		}
		if (ordered) {
			/* consecutive runs, one at a time, stop at the first error */
			size_t start = 0;
			while (start < n && docs[start]->chunk >= 0) {
				size_t end = start;
				ins_group run;
				size_t before = w->nerr;
				while (end < n && docs[end]->chunk == docs[start]->chunk)
					end++;
				memset(&run, 0, sizeof run);
				run.c = c;
				run.rc = rc;
				run.docs = &docs[start];
				run.n = end - start;
				run.chunk = docs[start]->chunk;
				run.ordered = true;
				run.w = w;
				ins_send(&run, 0);
				if (run.cls == SHARDCONN_STALE) {
					for (i = start; i < n; i++)
						stale[nstale++] = docs[i];
					break;
				}
				if (w->nerr > before)
					break;
				start = end;
			}
		} else {
			/* one group per chunk, sent in parallel */
			for (i = 0; i < n; i++) {
				size_t j;
				if (docs[i]->chunk < 0)
					continue;
				for (j = 0; j < ng; j++)
					if (g[j].chunk == docs[i]->chunk)
						break;
				if (j == ng) {
					g[ng].c = c;
					g[ng].rc = rc;
					g[ng].docs = sdb_calloc(n, sizeof *g[ng].docs);
					g[ng].chunk = docs[i]->chunk;
					g[ng].w = w;
					ng++;
				}
				g[j].docs[g[j].n++] = docs[i];
			}
			shardconn_fanout(c->p->sc, ng, ins_send, g);
			for (i = 0; i < ng; i++) {
				if (g[i].cls == SHARDCONN_STALE)
					for (size_t j = 0; j < g[i].n; j++)
						stale[nstale++] = g[i].docs[j];
				free(g[i].docs);
			}
		}
		free(g);
		if (nstale == 0) {
			free(stale);
			return;
		}
		if (!stale_backoff(c)) {
			for (i = 0; i < nstale; i++) {
				wresult_error(w, stale[i]->idx, NULL, WIRE_ERR_STALE_CONFIG,
					      "routing kept changing: StaleConfig retry budget exhausted");
				if (ordered)
					break;
			}
			free(stale);
			return;
		}
		*rcp = refresh(c, *rcp);
		memmove(docs, stale, nstale * sizeof *docs);
		n = nstale;
		free(stale);
	}
}

static void do_insert(ctx *c)
{
	bson_t docs;
	bson_iter_t it;
	route_coll *rc;
	ins_doc *items = NULL, **ptrs = NULL;
	size_t n = 0, cap = 0, i;
	wresult w;
	bool ordered = get_bool(c->cmd, "ordered", true);

	rc = route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (with_primary(c, &primary)) {
			forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	if (!get_array(c->cmd, "documents", &docs)) {
		route_coll_unref(rc);
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "insert needs a documents array");
		return;
	}
	bson_iter_init(&it, &docs);
	while (bson_iter_next(&it)) {
		uint32_t len;
		const uint8_t *data;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			items = sdb_realloc(items, cap * sizeof *items);
		}
		items[n].idx = (int64_t)n;
		items[n].data = NULL;
		items[n].len = 0;
		if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			items[n].data = data;
			items[n].len = len;
		}
		n++;
	}
	ptrs = sdb_calloc(n ? n : 1, sizeof *ptrs);
	for (i = 0; i < n; i++)
		ptrs[i] = &items[i];
	wresult_init(&w);
	insert_docs(c, &rc, ptrs, n, ordered, &w);
	route_coll_unref(rc);
	answer_write(c, &w, false);
	wresult_destroy(&w);
	free(ptrs);
	free(items);
}

/* ---------- two-phase writes: collect owned documents of one chunk ---------- */

static void key_projection(const route_coll *rc, bson_t *proj)
{
	size_t i;

	BSON_APPEND_INT32(proj, "_id", 1);
	for (i = 0; i < rc->nkeys; i++)
		if (strcmp(rc->keys[i], "_id") != 0)
			BSON_APPEND_INT32(proj, rc->keys[i], 1);
}

/* Collect from chunk ci the owned documents matching q (in sort order when sort is given),
 * at most limit (0 = all): their _id values into ids (an array being built; *n counts),
 * or, when docs is not NULL, the whole documents into docs. Returns SHARDCONN_*;
 * on failure err_reply/nerr hold the error. */
static int collect_owned(ctx *c, route_coll *rc, size_t ci, const bson_t *q, const bson_t *sort,
			 int64_t limit, bson_t *ids, bson_t *docs, size_t *n, bson_t *err_reply,
			 char *nerr, size_t nelen)
{
	route_chunk *ch = &rc->chunks[ci];
	pstream *s = proxy_calloc_bson(1, sizeof *s);
	bson_t cmd = BSON_INITIALIZER, proj = BSON_INITIALIZER, reply;
	proxy_cursor *cur;
	int cls, code = 0;
	char err[512], k[24];

	stream_init(s, ch->shard, c->db, c->coll);
	s->rcoll = rc;
	route_coll_ref(rc);
	s->chunk = (ssize_t)ci;
	BSON_APPEND_UTF8(&cmd, "find", c->coll);
	if (q && !bson_empty(q))
		BSON_APPEND_DOCUMENT(&cmd, "filter", q);
	if (sort && !bson_empty(sort))
		BSON_APPEND_DOCUMENT(&cmd, "sort", sort);
	if (docs == NULL) {
		key_projection(rc, &proj);
		BSON_APPEND_DOCUMENT(&cmd, "projection", &proj);
	}
	BSON_APPEND_INT64(&cmd, "batchSize", limit > 0 && limit < COLLECT_BATCH ? limit + 16
									     : COLLECT_BATCH);
	append_version(&cmd, ch);
	cls = run_on(c, ch->shard, &cmd, &s->server_id, &reply, nerr, nelen);
	bson_destroy(&cmd);
	bson_destroy(&proj);
	if (cls == SHARDCONN_OK && pstream_take_batch(s, &reply, "firstBatch") != 0) {
		cls = SHARDCONN_CMD_ERR;
		bson_destroy(&reply);
		bson_init(&reply);
		BSON_APPEND_INT32(&reply, "code", WIRE_ERR_INTERNAL);
		BSON_APPEND_UTF8(&reply, "errmsg", "shard answered find without a cursor");
	}
	if (cls != SHARDCONN_OK) {
		bson_copy_to(&reply, err_reply);
		bson_destroy(&reply);
		pstream_clear(s);
		bson_destroy(&s->err_reply);
		free(s);
		return cls;
	}
	bson_destroy(&reply);
	cur = proxy_cursor_new(c->p, c->ns, s, 1, NULL, NULL, 0, limit);
	for (;;) {
		bson_t *d;
		int r = proxy_cursor_next(c->p, cur, &d, &code, err, sizeof err);
		bson_iter_t it;
		if (r < 0) {
			cls = SHARDCONN_CMD_ERR;
			bson_init(err_reply);
			BSON_APPEND_INT32(err_reply, "code", code ? code : WIRE_ERR_INTERNAL);
			BSON_APPEND_UTF8(err_reply, "errmsg", err);
			break;
		}
		if (r == 0)
			break;
		snprintf(k, sizeof k, "%zu", *n);
		if (docs) {
			BSON_APPEND_DOCUMENT(docs, k, d);
			(*n)++;
		} else if (bson_iter_init_find(&it, d, "_id")) {
			bson_append_iter(ids, k, -1, &it);
			(*n)++;
		}
		proxy_doc_free(d);
	}
	proxy_cursor_destroy(c->p, cur);
	return cls;
}

/* ---------- update / delete ---------- */

typedef struct wstmt {
	bool is_update;
	int64_t idx;       /* client index */
	bson_t stmt;       /* view: {q, u, multi, upsert, ...} or {q, limit} */
	bson_t q;
	bool multi;
	bool upsert;
} wstmt;

/* Send one statement (possibly rewritten with q2) to chunk ci. Returns SHARDCONN_*; folds
 * the result into w (with index idx) unless stale. */
static int send_stmt(ctx *c, route_coll *rc, size_t ci, const wstmt *s, const bson_t *q2,
		     bool force_multi, wresult *w)
{
	route_chunk *ch = &rc->chunks[ci];
	bson_t cmd = BSON_INITIALIZER, arr, st, reply;
	bson_iter_t it;
	int64_t map[1] = {s->idx};
	char nerr[256];
	int cls;

	BSON_APPEND_UTF8(&cmd, s->is_update ? "update" : "delete", c->coll);
	bson_append_array_begin(&cmd, s->is_update ? "updates" : "deletes", -1, &arr);
	bson_append_document_begin(&arr, "0", -1, &st);
	bson_iter_init(&it, &s->stmt);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (q2 && strcmp(k, "q") == 0)
			BSON_APPEND_DOCUMENT(&st, "q", q2);
		else if (force_multi && s->is_update && strcmp(k, "multi") == 0)
			continue;
		else if (q2 && strcmp(k, "upsert") == 0)
			continue;
		else
			bson_append_iter(&st, k, -1, &it);
	}
	if (force_multi && s->is_update)
		BSON_APPEND_BOOL(&st, "multi", true);
	bson_append_document_end(&arr, &st);
	bson_append_array_end(&cmd, &arr);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	append_version(&cmd, ch);
	if (!s->multi) /* drivers never retry multi statements; they are not recorded */
		proxy_txn_append(&c->txn, &cmd, map, 1);
	cls = run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls == SHARDCONN_OK) {
		fold_write_reply(w, &reply, map, 1);
	} else if (cls != SHARDCONN_STALE) {
		wresult_error_from(w, s->idx, &reply, cls, nerr);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return cls;
}

/* {$and: [q, {_id: {$in: ids}}]} */
static void and_ids(const bson_t *q, const bson_t *ids, bson_t *out)
{
	bson_t and, d, idd;

	bson_init(out);
	bson_append_array_begin(out, "$and", -1, &and);
	BSON_APPEND_DOCUMENT(&and, "0", q);
	bson_append_document_begin(&and, "1", -1, &d);
	bson_append_document_begin(&d, "_id", -1, &idd);
	bson_append_array(&idd, "$in", -1, ids);
	bson_append_document_end(&d, &idd);
	bson_append_document_end(&and, &d);
	bson_append_array_end(out, &and);
}

/* Multi statement over chunk ci: collect owned ids, then write them in batches.
 * Returns SHARDCONN_* (STALE: nothing of this chunk is known to be applied in the failed
 * batch; earlier batches were applied and are not re-sent). */
static int multi_on_chunk(ctx *c, route_coll *rc, size_t ci, const wstmt *s, wresult *w,
			  int64_t limit, bool *touched)
{
	bson_t ids = BSON_INITIALIZER, err_reply = BSON_INITIALIZER;
	size_t n = 0;
	char nerr[256];
	int cls;

	cls = collect_owned(c, rc, ci, &s->q, NULL, limit, &ids, NULL, &n, &err_reply, nerr,
			    sizeof nerr);
	if (cls != SHARDCONN_OK) {
		if (cls != SHARDCONN_STALE)
			wresult_error_from(w, s->idx, &err_reply, cls, nerr);
		goto out;
	}
	if (n > 0) {
		/* send in batches of TWO_PHASE_IN_BATCH ids */
		bson_iter_t it;
		size_t done = 0;
		bson_iter_init(&it, &ids);
		while (done < n) {
			bson_t part = BSON_INITIALIZER, q2;
			size_t k = 0;
			char key[24];
			while (k < TWO_PHASE_IN_BATCH && bson_iter_next(&it)) {
				snprintf(key, sizeof key, "%zu", k++);
				bson_append_iter(&part, key, -1, &it);
			}
			done += k;
			and_ids(&s->q, &part, &q2);
			cls = send_stmt(c, rc, ci, s, &q2, s->multi, w);
			bson_destroy(&q2);
			bson_destroy(&part);
			if (k == 0 || cls != SHARDCONN_OK)
				break;
			*touched = true;
		}
	}
out:
	bson_destroy(&ids);
	bson_destroy(&err_reply);
	return cls;
}

static bool stmt_parse(const bson_iter_t *elem, bool is_update, int64_t idx, wstmt *s)
{
	uint32_t len;
	const uint8_t *data;

	memset(s, 0, sizeof *s);
	s->is_update = is_update;
	s->idx = idx;
	if (!BSON_ITER_HOLDS_DOCUMENT(elem))
		return false;
	bson_iter_document(elem, &len, &data);
	if (!bson_init_static(&s->stmt, data, len))
		return false;
	if (!get_doc(&s->stmt, "q", &s->q))
		bson_init(&s->q);
	if (is_update) {
		s->multi = get_bool(&s->stmt, "multi", false);
		s->upsert = get_bool(&s->stmt, "upsert", false);
	} else {
		s->multi = get_int(&s->stmt, "limit", 0) == 0;
	}
	return true;
}

/* A retryable single-document write without an exact shard key runs where its collect
 * phase finds a document, which may differ between an attempt and its retry: ask each
 * shard owning a selected chunk whether it already executed this statement (issue #16).
 * 1: executed there, *res = its recorded result (caller destroys); 0: nowhere; -1: a shard
 * did not answer (unknown: the caller fails the statement with a retryable error, after
 * filling err_reply/nerr). */
static int probe_executed(ctx *c, route_coll *rc, const bool *sel, int64_t idx, bson_t *res,
			  bson_t *err_reply, char *nerr, size_t nelen)
{
	char **asked = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *asked);
	size_t nasked = 0, i, k;
	int out = 0;

	for (i = 0; i < rc->nchunks && out == 0; i++) {
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_iter_t it;
		bool dup = false;
		int cls;
		if (!sel[i])
			continue;
		for (k = 0; k < nasked && !dup; k++)
			dup = strcmp(asked[k], rc->chunks[i].shard) == 0;
		if (dup)
			continue;
		asked[nasked++] = rc->chunks[i].shard;
		BSON_APPEND_INT32(&cmd, "stripedbStmtResult", 1);
		BSON_APPEND_DOCUMENT(&cmd, "lsid", &c->txn.lsid);
		BSON_APPEND_INT64(&cmd, "txnNumber", c->txn.txn);
		BSON_APPEND_INT32(&cmd, "stmtId", proxy_txn_stmt_id(&c->txn, idx));
		cls = run_on(c, rc->chunks[i].shard, &cmd, NULL, &reply, nerr, nelen);
		bson_destroy(&cmd);
		if (cls != SHARDCONN_OK) {
			bson_copy_to(&reply, err_reply);
			out = -1;
		} else if (get_bool(&reply, "executed", false) &&
			   bson_iter_init_find(&it, &reply, "result") &&
			   BSON_ITER_HOLDS_DOCUMENT(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t view;
			bson_iter_document(&it, &len, &data);
			if (bson_init_static(&view, data, len)) {
				bson_copy_to(&view, res);
				out = 1;
			}
		}
		bson_destroy(&reply);
	}
	free(asked);
	return out;
}

/* Fold a shard's recorded result of one update/delete statement ({n, nModified?,
 * upserted?: _id}, src/shard/retry.c) into w as the statement's outcome. */
static void fold_recorded(wresult *w, const bson_t *res, int64_t idx)
{
	bson_t reply = BSON_INITIALIZER, arr, e;
	bson_iter_t it;
	int64_t map[1] = {idx};
	bool up = bson_iter_init_find(&it, res, "upserted");

	BSON_APPEND_INT64(&reply, "n", get_int(res, "n", 0) + (up ? 1 : 0));
	BSON_APPEND_INT64(&reply, "nModified", get_int(res, "nModified", 0));
	if (up) {
		bson_append_array_begin(&reply, "upserted", -1, &arr);
		bson_append_document_begin(&arr, "0", -1, &e);
		BSON_APPEND_INT32(&e, "index", 0);
		bson_append_iter(&e, "_id", -1, &it);
		bson_append_document_end(&arr, &e);
		bson_append_array_end(&reply, &arr);
	}
	fold_write_reply(w, &reply, map, 1);
	bson_destroy(&reply);
}

/* One update/delete statement on a sharded collection. Returns false when an ordered
 * batch must stop (the statement failed). */
static bool write_stmt(ctx *c, route_coll **rcp, const wstmt *s, wresult *w)
{
	size_t before = w->nerr;
	char err[512];
	bool *done_ranges = NULL;
	/* pending chunk ranges (min/max copies) still to process for a multi statement */
	bson_t **pmin = NULL, **pmax = NULL;
	size_t npend = 0, cap = 0, i;
	bool first = true;

	if (uses_js(&s->q, 0)) {
		wresult_error(w, s->idx, NULL, WIRE_ERR_BAD_VALUE,
			      "$where and server-side JavaScript are not allowed on stripedb");
		return false;
	}
	if (s->is_update) {
		bson_t u;
		if (get_doc(&s->stmt, "u", &u) && route_update_changes_key(*rcp, &u, &s->q, err,
									    sizeof err)) {
			bool no_key = strstr(err, "without specifying") != NULL;
			wresult_error(w, s->idx, NULL,
				      no_key ? ERR_SHARD_KEY_NOT_FOUND : WIRE_ERR_IMMUTABLE_FIELD, err);
			return false;
		}
	}
	for (;;) {
		route_coll *rc = *rcp;
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact, stale = false, touched = false;
		size_t nsel = route_target(rc, &s->q, sel, &exact);

		if (!first) {
			/* restrict to the ranges refused as stale */
			bool *r = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *r);
			bool *acc = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *acc);
			for (i = 0; i < npend; i++) {
				route_target_range(rc, pmin[i], pmax[i], r);
				for (size_t j = 0; j < rc->nchunks; j++)
					acc[j] = acc[j] || r[j];
			}
			nsel = 0;
			for (i = 0; i < rc->nchunks; i++) {
				sel[i] = sel[i] && acc[i];
				nsel += sel[i];
			}
			free(r);
			free(acc);
			for (i = 0; i < npend; i++) {
				bson_destroy(pmin[i]);
				bson_destroy(pmax[i]);
			}
			npend = 0;
		}
		first = false;
		if (nsel < rc->nchunks)
			sdb_counter_inc(c->p->m_targeted);
		else
			sdb_counter_inc(c->p->m_scatter);
		if (exact && nsel == 1) {
			for (i = 0; !sel[i]; i++)
				;
			if (send_stmt(c, rc, i, s, NULL, false, w) == SHARDCONN_STALE)
				stale = true;
		} else if (s->upsert) {
			wresult_error(w, s->idx, NULL, ERR_SHARD_KEY_NOT_FOUND,
				      "Failed to target upsert by query :: could not extract exact "
				      "shard key");
		} else if (nsel == 0) {
			/* nothing can match */
		} else if (s->multi) {
			for (i = 0; i < rc->nchunks && w->nerr == before; i++) {
				if (!sel[i])
					continue;
				if (multi_on_chunk(c, rc, i, s, w, 0, &touched) == SHARDCONN_STALE) {
					if (npend == cap) {
						cap = cap ? cap * 2 : 8;
						pmin = sdb_realloc(pmin, cap * sizeof *pmin);
						pmax = sdb_realloc(pmax, cap * sizeof *pmax);
					}
					pmin[npend] = bson_copy(rc->chunks[i].min);
					pmax[npend] = bson_copy(rc->chunks[i].max);
					npend++;
					stale = true;
				}
			}
		} else {
			/* single document without an exact key: the first owned match */
			int64_t n_before = w->n;
			if (c->txn.on) {
				bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
				char nerr[256];
				int pr = probe_executed(c, rc, sel, s->idx, &res, &er, nerr,
							sizeof nerr);
				if (pr == 1)
					fold_recorded(w, &res, s->idx);
				else if (pr < 0)
					wresult_error_from(w, s->idx, &er,
							   get_int(&er, "code", 0) ? SHARDCONN_CMD_ERR
										 : SHARDCONN_NET_ERR,
							   nerr);
				bson_destroy(&res);
				bson_destroy(&er);
				if (pr != 0)
					n_before = -1; /* answered: skip the chunk walk */
			}
			for (i = 0; n_before >= 0 && i < rc->nchunks && w->nerr == before &&
				    w->n == n_before;
			     i++) {
				if (!sel[i])
					continue;
				if (multi_on_chunk(c, rc, i, s, w, 1, &touched) == SHARDCONN_STALE) {
					stale = true;
					break;
				}
			}
		}
		free(sel);
		if (!stale)
			break;
		if (!stale_backoff(c)) {
			wresult_error(w, s->idx, NULL, WIRE_ERR_STALE_CONFIG,
				      "routing kept changing: StaleConfig retry budget exhausted");
			break;
		}
		*rcp = refresh(c, *rcp);
		if (!s->multi || npend == 0)
			first = true; /* redo the whole statement */
	}
	for (i = 0; i < npend; i++) {
		bson_destroy(pmin[i]);
		bson_destroy(pmax[i]);
	}
	free(pmin);
	free(pmax);
	free(done_ranges);
	return w->nerr == before;
}

static void do_write(ctx *c, bool is_update)
{
	bson_t stmts;
	bson_iter_t it;
	route_coll *rc;
	wresult w;
	bool ordered = get_bool(c->cmd, "ordered", true);
	int64_t idx = 0;

	rc = route_or_fail(c);
	if (rc == NULL)
		return;
	if (!get_array(c->cmd, is_update ? "updates" : "deletes", &stmts)) {
		route_coll_unref(rc);
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "%s needs a %s array",
			       is_update ? "update" : "delete", is_update ? "updates" : "deletes");
		return;
	}
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (uses_js(&stmts, 0)) {
			wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
				       "$where and server-side JavaScript are not allowed on stripedb");
			return;
		}
		if (with_primary(c, &primary)) {
			forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	wresult_init(&w);
	bson_iter_init(&it, &stmts);
	while (bson_iter_next(&it)) {
		wstmt s;
		bool ok;
		if (!stmt_parse(&it, is_update, idx, &s)) {
			wresult_error(&w, idx, NULL, WIRE_ERR_BAD_VALUE, "statement is not a document");
			ok = false;
		} else {
			ok = write_stmt(c, &rc, &s, &w);
		}
		idx++;
		if (!ok && ordered)
			break;
	}
	route_coll_unref(rc);
	answer_write(c, &w, is_update);
	wresult_destroy(&w);
}

/* ---------- findAndModify ---------- */

static void do_find_and_modify(ctx *c)
{
	bson_t query, sort, update;
	bool has_q = get_doc(c->cmd, "query", &query);
	bool has_sort = get_doc(c->cmd, "sort", &sort);
	bool upsert = get_bool(c->cmd, "upsert", false);
	route_coll *rc;
	merge_sort *ms = NULL;
	char err[512];
	int attempt;
	const int64_t fam_stmt = 0; /* findAndModify is statement 0 (stmtId as given) */
	bool probed = false;

	if (!has_q)
		bson_init(&query);
	if (uses_js(&query, 0)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	rc = route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (with_primary(c, &primary)) {
			forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	if (get_doc(c->cmd, "update", &update) &&
	    route_update_changes_key(rc, &update, &query, err, sizeof err)) {
		route_coll_unref(rc);
		wire_req_error(c->req,
			       strstr(err, "without specifying") ? ERR_SHARD_KEY_NOT_FOUND
								  : WIRE_ERR_IMMUTABLE_FIELD,
			       "%s", err);
		return;
	}
	merge_sort_parse(has_sort ? &sort : NULL, &ms, NULL, err, sizeof err);
	for (attempt = 0;; attempt++) {
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact;
		size_t nsel = route_target(rc, &query, sel, &exact), i, best_chunk = 0;
		bson_t reply, fwd = BSON_INITIALIZER, best = BSON_INITIALIZER;
		bool have_best = false, stale = false;
		char nerr[256];
		int cls;

		if (exact && nsel == 1) {
			for (i = 0; !sel[i]; i++)
				;
			copy_cmd(c->cmd, &fwd, NULL);
			append_version(&fwd, &rc->chunks[i]);
			proxy_txn_append(&c->txn, &fwd, &fam_stmt, 1);
			cls = run_on(c, rc->chunks[i].shard, &fwd, NULL, &reply, nerr, sizeof nerr);
			free(sel);
			bson_destroy(&fwd);
			bson_destroy(&best);
			if (cls == SHARDCONN_STALE && stale_backoff(c)) {
				bson_destroy(&reply);
				rc = refresh(c, rc);
				continue;
			}
			if (cls == SHARDCONN_NET_ERR && c->txn.on)
				reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
			else if (cls == SHARDCONN_NET_ERR)
				reply_shard_error(c->req, cls, &reply, nerr);
			else
				reply_copy(c->req, &reply);
			bson_destroy(&reply);
			break;
		}
		if (upsert) {
			free(sel);
			bson_destroy(&fwd);
			bson_destroy(&best);
			wire_req_error(c->req, ERR_SHARD_KEY_NOT_FOUND,
				       "Query for sharded findAndModify with upsert: true must contain "
				       "the shard key");
			break;
		}
		if (c->txn.on && !probed) {
			/* a retry of a findAndModify that ran on some shard: its recorded reply */
			bson_t res = BSON_INITIALIZER, er = BSON_INITIALIZER;
			int pr = probe_executed(c, rc, sel, fam_stmt, &res, &er, nerr, sizeof nerr);
			probed = true;
			if (pr != 0) {
				free(sel);
				bson_destroy(&fwd);
				bson_destroy(&best);
				if (pr == 1) {
					bson_t *out = bson_new();
					bson_copy_to_excluding_noinit(&res, out, "ok", NULL);
					BSON_APPEND_DOUBLE(out, "ok", 1.0);
					wire_req_reply(c->req, out);
				} else if (get_int(&er, "code", 0)) {
					reply_shard_error(c->req, SHARDCONN_CMD_ERR, &er, nerr);
				} else {
					reply_retryable_net_error(c->req, shardconn_unexecuted(&er), nerr);
				}
				bson_destroy(&res);
				bson_destroy(&er);
				break;
			}
			bson_destroy(&res);
			bson_destroy(&er);
		}
		/* find the first owned candidate across chunks */
		for (i = 0; i < rc->nchunks && !stale; i++) {
			bson_t docs = BSON_INITIALIZER, er = BSON_INITIALIZER;
			size_t n = 0;
			bson_iter_t it;
			if (!sel[i])
				continue;
			cls = collect_owned(c, rc, i, &query, has_sort ? &sort : NULL, 1, NULL, &docs,
					    &n, &er, nerr, sizeof nerr);
			if (cls == SHARDCONN_STALE) {
				stale = true;
			} else if (cls != SHARDCONN_OK) {
				reply_shard_error(c->req, cls, &er, nerr);
				bson_destroy(&docs);
				bson_destroy(&er);
				free(sel);
				bson_destroy(&fwd);
				bson_destroy(&best);
				goto out;
			} else if (n > 0 && bson_iter_init(&it, &docs) && bson_iter_next(&it)) {
				uint32_t len;
				const uint8_t *data;
				bson_t d;
				bson_iter_document(&it, &len, &data);
				bson_init_static(&d, data, len);
				if (!have_best || merge_sort_cmp(ms, &d, &best) < 0) {
					bson_destroy(&best);
					bson_copy_to(&d, &best);
					best_chunk = i;
					have_best = true;
				}
			}
			bson_destroy(&docs);
			bson_destroy(&er);
		}
		free(sel);
		sel = NULL;
		if (stale) {
			bson_destroy(&fwd);
			bson_destroy(&best);
			if (!stale_backoff(c)) {
				wire_req_error(c->req, WIRE_ERR_STALE_CONFIG,
					       "routing kept changing: StaleConfig retry budget exhausted");
				break;
			}
			rc = refresh(c, rc);
			continue;
		}
		if (!have_best) {
			bson_t *out = bson_new(), leo;
			bson_destroy(&fwd);
			bson_destroy(&best);
			bson_append_document_begin(out, "lastErrorObject", -1, &leo);
			BSON_APPEND_INT32(&leo, "n", 0);
			if (!get_bool(c->cmd, "remove", false))
				BSON_APPEND_BOOL(&leo, "updatedExisting", false);
			bson_append_document_end(out, &leo);
			BSON_APPEND_NULL(out, "value");
			BSON_APPEND_DOUBLE(out, "ok", 1.0);
			wire_req_reply(c->req, out);
			break;
		}
		{
			bson_iter_t it, idit;
			bson_t q2, and, idq;
			bson_init(&q2);
			bson_append_array_begin(&q2, "$and", -1, &and);
			BSON_APPEND_DOCUMENT(&and, "0", &query);
			bson_append_document_begin(&and, "1", -1, &idq);
			if (bson_iter_init_find(&idit, &best, "_id"))
				bson_append_iter(&idq, "_id", -1, &idit);
			bson_append_document_end(&and, &idq);
			bson_append_array_end(&q2, &and);
			bson_iter_init(&it, c->cmd);
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (is_session_field(k) || strcmp(k, "sort") == 0)
					continue;
				if (strcmp(k, "query") == 0)
					continue;
				bson_append_iter(&fwd, k, -1, &it);
			}
			BSON_APPEND_DOCUMENT(&fwd, "query", &q2);
			append_version(&fwd, &rc->chunks[best_chunk]);
			proxy_txn_append(&c->txn, &fwd, &fam_stmt, 1);
			bson_destroy(&q2);
		}
		cls = run_on(c, rc->chunks[best_chunk].shard, &fwd, NULL, &reply, nerr, sizeof nerr);
		bson_destroy(&fwd);
		bson_destroy(&best);
		if (cls == SHARDCONN_STALE && stale_backoff(c)) {
			bson_destroy(&reply);
			rc = refresh(c, rc);
			continue;
		}
		if (cls == SHARDCONN_OK && attempt < 3) {
			bson_iter_t v;
			if (bson_iter_init_find(&v, &reply, "value") && BSON_ITER_HOLDS_NULL(&v)) {
				/* the candidate changed under us: look again */
				bson_destroy(&reply);
				continue;
			}
		}
		if (cls == SHARDCONN_NET_ERR && c->txn.on)
			reply_retryable_net_error(c->req, shardconn_unexecuted(&reply), nerr);
		else if (cls == SHARDCONN_NET_ERR)
			reply_shard_error(c->req, cls, &reply, nerr);
		else
			reply_copy(c->req, &reply);
		bson_destroy(&reply);
		break;
	}
out:
	merge_sort_free(ms);
	route_coll_unref(rc);
}

/* ---------- count / distinct ---------- */

typedef struct agg_chunk {
	ctx *c;
	route_coll *rc;
	size_t ci;
	const bson_t *q;
	const char *distinct_key;
	int64_t count;
	merge_distinct *vals;
	int cls;
	bson_t err_reply;
	char nerr[256];
} agg_chunk;

static void count_one(void *arg, size_t i)
{
	agg_chunk *a = &((agg_chunk *)arg)[i];
	bson_t docs = BSON_INITIALIZER, ids = BSON_INITIALIZER;
	size_t n = 0;

	if (a->distinct_key) {
		bson_iter_t it;
		a->cls = collect_owned(a->c, a->rc, a->ci, a->q, NULL, 0, NULL, &docs, &n,
				       &a->err_reply, a->nerr, sizeof a->nerr);
		if (a->cls == SHARDCONN_OK && bson_iter_init(&it, &docs)) {
			while (bson_iter_next(&it)) {
				uint32_t len;
				const uint8_t *data;
				bson_t d;
				bson_iter_document(&it, &len, &data);
				if (bson_init_static(&d, data, len))
					merge_distinct_add_doc(a->vals, &d, a->distinct_key);
			}
		}
	} else {
		a->cls = collect_owned(a->c, a->rc, a->ci, a->q, NULL, 0, &ids, NULL, &n,
				       &a->err_reply, a->nerr, sizeof a->nerr);
		a->count = (int64_t)n;
	}
	bson_destroy(&docs);
	bson_destroy(&ids);
}

/* Run count (distinct_key NULL) or distinct over the chunks q targets. */
static void count_or_distinct(ctx *c, const bson_t *q, const char *distinct_key)
{
	route_coll *rc = route_or_fail(c);

	if (rc == NULL)
		return;
	if (uses_js(q, 0)) {
		route_coll_unref(rc);
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (with_primary(c, &primary)) {
			forward_plain(c, primary, c->cmd);
			free(primary);
		}
		return;
	}
	for (;;) {
		bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
		bool exact;
		size_t nsel = route_target(rc, q, sel, &exact), i, k = 0;
		agg_chunk *a = proxy_calloc_bson(nsel, sizeof *a);
		int64_t total = 0;
		int cls = SHARDCONN_OK;
		size_t bad = 0;

		for (i = 0; i < rc->nchunks; i++) {
			if (!sel[i])
				continue;
			a[k].c = c;
			a[k].rc = rc;
			a[k].ci = i;
			a[k].q = q;
			a[k].distinct_key = distinct_key;
			a[k].vals = distinct_key ? merge_distinct_new() : NULL;
			bson_init(&a[k].err_reply);
			k++;
		}
		shardconn_fanout(c->p->sc, k, count_one, a);
		for (i = 0; i < k; i++) {
			if (a[i].cls != SHARDCONN_OK && (cls == SHARDCONN_OK || a[i].cls == SHARDCONN_STALE)) {
				cls = a[i].cls;
				bad = i;
			}
			total += a[i].count;
		}
		if (cls == SHARDCONN_OK) {
			bson_t *out = bson_new();
			if (distinct_key) {
				merge_distinct *all = merge_distinct_new();
				for (i = 0; i < k; i++) {
					bson_t tmp = BSON_INITIALIZER;
					bson_iter_t it, arr;
					merge_distinct_append(a[i].vals, &tmp, "v");
					if (bson_iter_init_find(&it, &tmp, "v") && bson_iter_recurse(&it, &arr))
						while (bson_iter_next(&arr))
							merge_distinct_add_value(all, bson_iter_value(&arr));
					bson_destroy(&tmp);
				}
				merge_distinct_append(all, out, "values");
				merge_distinct_free(all);
			} else {
				BSON_APPEND_INT64(out, "n", merge_count_window(total,
									      get_int(c->cmd, "skip", 0),
									      get_int(c->cmd, "limit", 0)));
			}
			BSON_APPEND_DOUBLE(out, "ok", 1.0);
			wire_req_reply(c->req, out);
		} else if (cls != SHARDCONN_STALE || !stale_backoff(c)) {
			reply_shard_error(c->req, cls, &a[bad].err_reply, a[bad].nerr);
			cls = SHARDCONN_OK; /* answered */
		}
		for (i = 0; i < k; i++) {
			bson_destroy(&a[i].err_reply);
			merge_distinct_free(a[i].vals);
		}
		free(a);
		free(sel);
		if (cls != SHARDCONN_STALE)
			break;
		rc = refresh(c, rc);
	}
	route_coll_unref(rc);
}

static void do_count(ctx *c)
{
	bson_t q;
	int64_t v;

	/* count_request.cpp: skip >= 0; limit any int64 but the minimum (-n means n) */
	if (!client_int(c, "skip", 0, INT64_MAX, 0, &v))
		return;
	if (sdb_bson_find_int64(c->cmd, "limit", INT64_MIN, INT64_MAX, 0, &v, NULL) == 0 &&
	    v == INT64_MIN) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "limit value for count cannot be min long");
		return;
	}
	if (!client_int(c, "limit", INT64_MIN, INT64_MAX, 0, &v))
		return;
	if (!get_doc(c->cmd, "query", &q))
		bson_init(&q);
	count_or_distinct(c, &q, NULL);
}

static void do_distinct(ctx *c)
{
	bson_t q;
	bson_iter_t it;

	if (!get_doc(c->cmd, "query", &q))
		bson_init(&q);
	if (!bson_iter_init_find(&it, c->cmd, "key") || !BSON_ITER_HOLDS_UTF8(&it)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE, "distinct needs a key string");
		return;
	}
	count_or_distinct(c, &q, bson_iter_utf8(&it, NULL));
}

/* ---------- aggregate ---------- */

typedef struct agg_in {
	proxy *p;
	proxy_cursor *cur;
	bson_t *last;
} agg_in;

static int agg_next(void *arg, const bson_t **doc, int *code, char *err, size_t errlen)
{
	agg_in *in = arg;
	bson_t *d;
	int r;

	if (in->last) {
		proxy_doc_free(in->last);
		in->last = NULL;
	}
	r = proxy_cursor_next(in->p, in->cur, &d, code, err, errlen);
	if (r <= 0)
		return r;
	in->last = d;
	*doc = d;
	return 1;
}

static void do_coll_stats_stage(ctx *c, const bson_t *spec);

static void do_aggregate(ctx *c)
{
	bson_t stages, cursor_opts;
	route_coll *rc;
	sdb_pipeline *pl = NULL;
	sdb_pipeline_pushdown_t pd;
	sdb_pipeline_cursor *pc = NULL;
	merge_sort *ms = NULL;
	proxy_cursor *in_cur;
	agg_in in;
	pstream *out_s;
	int64_t batch = 101;
	int code = 0, r;
	char err[512];
	size_t cap = 0;

	if (!get_array(c->cmd, "pipeline", &stages)) {
		wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE, "aggregate needs a pipeline array");
		return;
	}
	if (get_doc(c->cmd, "cursor", &cursor_opts))
		batch = get_int(&cursor_opts, "batchSize", 101);
	{
		/* $collStats: answered by the proxy from the shards' collStats (mongos' way) */
		bson_iter_t st, first;
		if (c->coll && bson_iter_init(&st, &stages) && bson_iter_next(&st) &&
		    BSON_ITER_HOLDS_DOCUMENT(&st) && bson_iter_recurse(&st, &first) &&
		    bson_iter_next(&first) && strcmp(bson_iter_key(&first), "$collStats") == 0) {
			bson_t spec;
			uint32_t len;
			const uint8_t *data;
			if (bson_iter_next(&st)) {
				wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
					       "$collStats is supported as the only stage of a pipeline");
				return;
			}
			if (!BSON_ITER_HOLDS_DOCUMENT(&first)) {
				wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
					       "$collStats must take a nested object");
				return;
			}
			bson_iter_document(&first, &len, &data);
			if (bson_init_static(&spec, data, len))
				do_coll_stats_stage(c, &spec);
			return;
		}
	}
	if (uses_js(&stages, 0)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	if (c->coll == NULL) {
		char *primary;
		if (with_primary(c, &primary)) {
			forward_cursor(c, primary, c->cmd, batch, false);
			free(primary);
		}
		return;
	}
	rc = route_or_fail(c);
	if (rc == NULL)
		return;
	if (rc->nkeys == 0) {
		char *primary;
		route_coll_unref(rc);
		if (with_primary(c, &primary)) {
			forward_cursor(c, primary, c->cmd, batch, false);
			free(primary);
		}
		return;
	}
	if (sdb_pipeline_parse(&stages, NULL, &pl, &code, err, sizeof err) != 0) {
		route_coll_unref(rc);
		wire_req_error(c->req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	sdb_pipeline_pushdown(pl, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT | SDB_PUSHDOWN_LIMIT, &pd);
	if (merge_sort_parse(&pd.sort, &ms, &code, err, sizeof err) != 0) {
		sdb_pipeline_pushdown_destroy(&pd);
		sdb_pipeline_free(pl);
		route_coll_unref(rc);
		wire_req_error(c->req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	in_cur = open_merged(c, &rc, &pd.filter, &pd.sort, NULL, ms, NULL, pd.skip,
			     pd.limit > 0 ? pd.limit : 0,
			     pd.limit > 0 && pd.limit + pd.skip < 1000 ? pd.limit + pd.skip : 1000);
	route_coll_unref(rc);
	if (in_cur == NULL) {
		sdb_pipeline_pushdown_destroy(&pd);
		sdb_pipeline_free(pl);
		return;
	}
	/* run the rest of the pipeline on the proxy, materialising its output */
	in.p = c->p;
	in.cur = in_cur;
	in.last = NULL;
	sdb_pipeline_open(pl, agg_next, &in, &pc);
	out_s = proxy_calloc_bson(1, sizeof *out_s);
	memset(out_s, 0, sizeof *out_s);
	out_s->chunk = -1;
	bson_init(&out_s->err_reply);
	for (;;) {
		const bson_t *d;
		r = sdb_pipeline_cursor_next(pc, &d, &code, err, sizeof err);
		if (r <= 0)
			break;
		if (out_s->n == cap) {
			cap = cap ? cap * 2 : 64;
			out_s->docs = sdb_realloc(out_s->docs, cap * sizeof *out_s->docs);
		}
		out_s->docs[out_s->n++] = proxy_doc_copy(d);
	}
	sdb_pipeline_cursor_free(pc);
	proxy_doc_free(in.last);
	proxy_cursor_destroy(c->p, in_cur);
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_free(pl);
	if (r < 0) {
		pstream_clear(out_s);
		bson_destroy(&out_s->err_reply);
		free(out_s);
		wire_req_error(c->req, code ? code : WIRE_ERR_INTERNAL, "%s", err);
		return;
	}
	answer_cursor(c, proxy_cursor_new(c->p, c->ns, out_s, 1, NULL, NULL, 0, 0), batch, false,
		      "firstBatch", c->ns);
}

/* ---------- broadcast and listings ---------- */

typedef struct bcast {
	ctx *c;
	char **ids;
	const bson_t *cmd;
	bson_t *replies;
	int *cls;
	char (*nerr)[256];
} bcast;

static void bcast_one(void *arg, size_t i)
{
	bcast *b = arg;

	b->cls[i] = run_on(b->c, b->ids[i], b->cmd, NULL, &b->replies[i], b->nerr[i],
			   sizeof b->nerr[i]);
}

/* Run cmd (stripped) on every shard. Returns the number of shards; fills b. */
static size_t broadcast(ctx *c, const bson_t *cmd, bcast *b)
{
	bson_t *fwd = bson_new();
	size_t n;
	char err[256];

	proxy_load_shards(c->p, err, sizeof err);
	copy_cmd(cmd, fwd, NULL);
	memset(b, 0, sizeof *b);
	b->c = c;
	n = shardconn_shard_ids(c->p->sc, &b->ids);
	b->cmd = fwd;
	b->replies = proxy_calloc_bson(n, sizeof *b->replies);
	b->cls = sdb_calloc(n ? n : 1, sizeof *b->cls);
	b->nerr = sdb_calloc(n ? n : 1, sizeof *b->nerr);
	shardconn_fanout(c->p->sc, n, bcast_one, b);
	return n;
}

static void bcast_free(bcast *b, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		bson_destroy(&b->replies[i]);
		free(b->ids[i]);
	}
	free(b->ids);
	free(b->replies);
	free(b->cls);
	free(b->nerr);
	bson_destroy((bson_t *)b->cmd);
}

static void do_broadcast(ctx *c)
{
	bcast b;
	size_t n = broadcast(c, c->cmd, &b), i, ok_i = SIZE_MAX, err_i = SIZE_MAX;

	if (n == 0) {
		bcast_free(&b, n);
		wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
		return;
	}
	for (i = 0; i < n; i++) {
		if (b.cls[i] == SHARDCONN_OK) {
			if (ok_i == SIZE_MAX)
				ok_i = i;
		} else if (err_i == SIZE_MAX) {
			int code = (int)get_int(&b.replies[i], "code", 0);
			/* dropping what a shard never had is fine */
			if (b.cls[i] == SHARDCONN_CMD_ERR &&
			    (code == WIRE_ERR_NAMESPACE_NOT_FOUND || code == WIRE_ERR_INDEX_NOT_FOUND ||
			     code == WIRE_ERR_NAMESPACE_EXISTS))
				continue;
			err_i = i;
		}
	}
	if (err_i != SIZE_MAX)
		reply_shard_error(c->req, b.cls[err_i], &b.replies[err_i], b.nerr[err_i]);
	else if (ok_i != SIZE_MAX)
		reply_copy(c->req, &b.replies[ok_i]);
	else
		reply_copy(c->req, &b.replies[0]);
	bcast_free(&b, n);
}

/* createIndexes on a sharded collection: a unique index each shard cannot enforce alone
 * (not prefixed by the shard key, nor by _id) is refused with CannotCreateIndex (67) before any
 * shard builds it, as mongod refuses it on a sharded collection; everything else is broadcast.
 * Source: MongoDB's checkUniqueIndexConstraints (create_indexes.cpp). */
static void do_create_indexes(ctx *c)
{
	route_coll *rc = route_or_fail(c);
	bson_iter_t it, arr, spec;

	if (rc == NULL)
		return; /* answered: routing unavailable, no shard builds an unchecked index */
	if (rc->nkeys > 0 && bson_iter_init_find(&it, c->cmd, "indexes") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t f;
			bson_t key;
			const uint8_t *data;
			uint32_t len;
			bool unique = false, has_key = false;

			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &spec))
				continue; /* the shards refuse a malformed spec */
			while (bson_iter_next(&spec)) {
				if (strcmp(bson_iter_key(&spec), "unique") == 0)
					unique = bson_iter_as_bool(&spec);
				else if (strcmp(bson_iter_key(&spec), "key") == 0 &&
					 BSON_ITER_HOLDS_DOCUMENT(&spec))
					f = spec, has_key = true;
			}
			if (!unique || !has_key)
				continue;
			bson_iter_document(&f, &len, &data);
			if (!bson_init_static(&key, data, len) || route_unique_index_compatible(rc, &key))
				continue;
			{
				char *ks = bson_as_relaxed_extended_json(&key, NULL);
				bson_t sk = BSON_INITIALIZER;
				char *ss;
				size_t i;
				for (i = 0; i < rc->nkeys; i++) {
					if (rc->hashed)
						BSON_APPEND_UTF8(&sk, rc->keys[i], "hashed");
					else
						BSON_APPEND_INT32(&sk, rc->keys[i], 1);
				}
				ss = bson_as_relaxed_extended_json(&sk, NULL);
				wire_req_error(c->req, WIRE_ERR_CANNOT_CREATE_INDEX,
					       "cannot create unique index over %s with shard key pattern %s",
					       ks ? ks : "?", ss ? ss : "?");
				bson_free(ks);
				bson_free(ss);
				bson_destroy(&sk);
			}
			route_coll_unref(rc);
			return;
		}
	}
	route_coll_unref(rc);
	do_broadcast(c);
}

static void do_list_indexes(ctx *c)
{
	route_coll *rc = route_or_fail(c);
	char *shard = NULL;

	if (rc == NULL)
		return;
	if (rc->nchunks > 0)
		shard = sdb_strdup(rc->chunks[0].shard);
	route_coll_unref(rc);
	if (shard == NULL && !with_primary(c, &shard))
		return;
	forward_cursor(c, shard, c->cmd, -1, false);
	free(shard);
}

/* Sharded collections metadata knows that no shard has created yet (nothing inserted):
 * listed too, unless the client filtered the listing (the filter ran on the shards). */
static void add_metadata_collections(ctx *c, bson_t *merged, size_t *count)
{
	bson_t cmd = BSON_INITIALIZER, reply, f;
	bson_iter_t it, arr, e;
	char err[256];
	int code;
	bool name_only = get_bool(c->cmd, "nameOnly", false);

	if (get_doc(c->cmd, "filter", &f) && !bson_empty(&f))
		return;
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_UTF8(&cmd, "db", c->db);
	if (proxy_meta_command(c->p, &cmd, &reply, &code, err, sizeof err) == 0 &&
	    bson_iter_init_find(&it, &reply, "collections") && bson_iter_recurse(&it, &arr)) {
		size_t dblen = strlen(c->db);
		while (bson_iter_next(&arr)) {
			const char *ns, *name;
			bool dup = false;
			bson_iter_t m;
			if (!bson_iter_recurse(&arr, &e) || !bson_iter_find(&e, "ns") ||
			    !BSON_ITER_HOLDS_UTF8(&e))
				continue;
			ns = bson_iter_utf8(&e, NULL);
			if (strncmp(ns, c->db, dblen) != 0 || ns[dblen] != '.')
				continue;
			name = ns + dblen + 1;
			if (bson_iter_init(&m, merged))
				while (bson_iter_next(&m)) {
					bson_iter_t mf;
					if (bson_iter_recurse(&m, &mf) && bson_iter_find(&mf, "name") &&
					    BSON_ITER_HOLDS_UTF8(&mf) && strcmp(bson_iter_utf8(&mf, NULL), name) == 0)
						dup = true;
				}
			if (!dup) {
				char k[24];
				bson_t d, o, info;
				snprintf(k, sizeof k, "%zu", (*count)++);
				bson_append_document_begin(merged, k, -1, &d);
				BSON_APPEND_UTF8(&d, "name", name);
				BSON_APPEND_UTF8(&d, "type", "collection");
				if (!name_only) {
					bson_append_document_begin(&d, "options", -1, &o);
					bson_append_document_end(&d, &o);
					bson_append_document_begin(&d, "info", -1, &info);
					BSON_APPEND_BOOL(&info, "readOnly", false);
					bson_append_document_end(&d, &info);
				}
				bson_append_document_end(merged, &d);
			}
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* Union over shards of a listing: arrays at path cursor.firstBatch or `field`, deduplicated
 * by `name`; sizes (sizeOnDisk) summed for databases. */
static void do_list_union(ctx *c, bool databases)
{
	bcast b;
	size_t n = broadcast(c, c->cmd, &b), i, count = 0;
	bson_t merged = BSON_INITIALIZER, *out;
	int64_t total = 0;
	bool any_ok = false;

	for (i = 0; i < n; i++) {
		bson_iter_t it, sub, arr;
		if (b.cls[i] != SHARDCONN_OK)
			continue;
		any_ok = true;
		if (databases) {
			if (!bson_iter_init_find(&it, &b.replies[i], "databases") ||
			    !bson_iter_recurse(&it, &arr))
				continue;
		} else {
			if (!bson_iter_init_find(&it, &b.replies[i], "cursor") ||
			    !bson_iter_recurse(&it, &sub) || !bson_iter_find(&sub, "firstBatch") ||
			    !bson_iter_recurse(&sub, &arr))
				continue;
		}
		while (bson_iter_next(&arr)) {
			bson_iter_t f, m;
			const char *name = NULL;
			bool dup = false;
			int64_t size = 0;
			if (!bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "name") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					name = bson_iter_utf8(&f, NULL);
				if (strcmp(bson_iter_key(&f), "sizeOnDisk") == 0 &&
				    BSON_ITER_HOLDS_NUMBER(&f))
					size = bson_iter_as_int64(&f);
			}
			total += size;
			if (name == NULL)
				continue;
			if (bson_iter_init(&m, &merged))
				while (bson_iter_next(&m)) {
					bson_iter_t mf;
					bson_iter_recurse(&m, &mf);
					if (bson_iter_find(&mf, "name") &&
					    strcmp(bson_iter_utf8(&mf, NULL), name) == 0)
						dup = true;
				}
			if (!dup) {
				char k[24];
				uint32_t len;
				const uint8_t *data;
				bson_t d;
				snprintf(k, sizeof k, "%zu", count++);
				bson_iter_document(&arr, &len, &data);
				bson_init_static(&d, data, len);
				BSON_APPEND_DOCUMENT(&merged, k, &d);
			}
		}
	}
	if (!any_ok) {
		if (n > 0)
			reply_shard_error(c->req, b.cls[0], &b.replies[0], b.nerr[0]);
		else
			wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
		bcast_free(&b, n);
		bson_destroy(&merged);
		return;
	}
	if (!databases)
		add_metadata_collections(c, &merged, &count);
	out = bson_new();
	if (databases) {
		bson_append_array(out, "databases", -1, &merged);
		BSON_APPEND_INT64(out, "totalSize", total);
	} else {
		bson_t cd;
		char ns[512];
		snprintf(ns, sizeof ns, "%s.$cmd.listCollections", c->db);
		bson_append_document_begin(out, "cursor", -1, &cd);
		BSON_APPEND_INT64(&cd, "id", 0);
		BSON_APPEND_UTF8(&cd, "ns", ns);
		bson_append_array(&cd, "firstBatch", -1, &merged);
		bson_append_document_end(out, &cd);
	}
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	wire_req_reply(c->req, out);
	bson_destroy(&merged);
	bcast_free(&b, n);
}

/* Every command the proxy routes (registered by proxy_exec_register). */
static const char *const proxy_cmds[] = {
	"find",          "getMore",       "killCursors",   "insert",      "update",
	"delete",        "findAndModify", "findandmodify", "count",       "distinct",
	"aggregate",     "createIndexes", "dropIndexes",   "drop",        "create",
	"collMod",       "dropDatabase",  "listIndexes",   "listCollections",
	"listDatabases", "explain",       "dbStats",       "dbstats",     "collStats",
	"collstats",     NULL};

/* ---------- collStats / dbStats / explain (mongos' combined replies) ---------- */

/* One command for one shard, run in parallel with others (a fan-out unit). */
typedef struct pcall {
	ctx *c;
	char *shard;  /* heap */
	bson_t cmd;
	bson_t reply; /* always initialised */
	int cls;      /* SHARDCONN_* */
	char nerr[256];
} pcall;

static void pcall_one(void *arg, size_t i)
{
	pcall *pc = &((pcall *)arg)[i];

	bson_destroy(&pc->reply);
	pc->cls = run_on(pc->c, pc->shard, &pc->cmd, NULL, &pc->reply, pc->nerr, sizeof pc->nerr);
}

/* n calls for the shards ids (their strings are taken over; the array is freed). */
static pcall *pcalls_new(ctx *c, char **ids, size_t n)
{
	pcall *pc = proxy_calloc_bson(n ? n : 1, sizeof *pc);
	size_t i;

	for (i = 0; i < n; i++) {
		pc[i].c = c;
		pc[i].shard = ids[i];
		bson_init(&pc[i].cmd);
		bson_init(&pc[i].reply);
	}
	free(ids);
	return pc;
}

static void pcalls_free(pcall *pc, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		free(pc[i].shard);
		bson_destroy(&pc[i].cmd);
		bson_destroy(&pc[i].reply);
	}
	free(pc);
}

/* The first failed call (NULL when all succeeded); codes in skip_codes (0-terminated) of
 * shard errors are not failures. */
static pcall *pcalls_failed(pcall *pc, size_t n, const int *skip_codes)
{
	size_t i, k;

	for (i = 0; i < n; i++) {
		bool skip = false;
		if (pc[i].cls == SHARDCONN_OK)
			continue;
		for (k = 0; skip_codes && skip_codes[k] && pc[i].cls == SHARDCONN_CMD_ERR; k++)
			if (get_int(&pc[i].reply, "code", 0) == skip_codes[k])
				skip = true;
		if (!skip)
			return &pc[i];
	}
	return NULL;
}

/* A shard's reply as a sub-document, without the cluster time fields. */
static void append_shard_reply(bson_t *out, const char *key, const bson_t *reply)
{
	bson_t d;
	bson_iter_t it;

	bson_append_document_begin(out, key, -1, &d);
	if (bson_iter_init(&it, reply))
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "$clusterTime") == 0 || strcmp(k, "operationTime") == 0)
				continue;
			bson_append_iter(&d, k, -1, &it);
		}
	bson_append_document_end(out, &d);
}

/* cmd with its command name (first key) replaced by name (dbstats -> dbStats: the shards
 * know the canonical names only), other fields as copy_cmd keeps them. */
static void copy_renamed(const bson_t *cmd, bson_t *out, const char *name)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return;
	bson_append_value(out, name, -1, bson_iter_value(&it));
	while (bson_iter_next(&it))
		if (!is_session_field(bson_iter_key(&it)))
			bson_append_iter(out, bson_iter_key(&it), -1, &it);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards owning a chunk of rc, sorted by id (heap array of heap strings). */
static size_t owning_shards(const route_coll *rc, char ***out)
{
	char **ids = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *ids);
	size_t i, k, n = 0;

	for (i = 0; i < rc->nchunks; i++) {
		bool dup = false;
		for (k = 0; k < n && !dup; k++)
			dup = strcmp(ids[k], rc->chunks[i].shard) == 0;
		if (!dup)
			ids[n++] = sdb_strdup(rc->chunks[i].shard);
	}
	sdb_qsort(ids, n, sizeof *ids, str_cmp);
	*out = ids;
	return n;
}

/* Per-index sums of collStats.indexSizes. */
typedef struct isizes {
	char **names;
	int64_t *vals;
	size_t n, cap;
} isizes;

static void isizes_add(isizes *s, const char *name, int64_t v)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		if (strcmp(s->names[i], name) == 0) {
			s->vals[i] += v;
			return;
		}
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 8;
		s->names = sdb_realloc(s->names, s->cap * sizeof *s->names);
		s->vals = sdb_realloc(s->vals, s->cap * sizeof *s->vals);
	}
	s->names[s->n] = sdb_strdup(name);
	s->vals[s->n++] = v;
}

static void isizes_free(isizes *s)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		free(s->names[i]);
	free(s->names);
	free(s->vals);
}

/* collStats (mongos' cluster collStats): sent to every shard owning a chunk of the
 * collection (unsharded: its primary shard); count, size, storageSize, totalIndexSize and
 * indexSizes are summed, nindexes is the largest, avgObjSize = size / count, the replies
 * are kept under shards.<id>. A shard that has no document of a sharded collection yet
 * answers NamespaceNotFound and adds nothing. */
/* Run collStats on every shard owning a chunk of c->ns (unsharded: its primary): the
 * client's command renamed (stage false) or {collStats: coll} (stage true, for the
 * $collStats aggregation stage). Returns the calls (pcalls_free them) with *n, *sharded
 * and *nchunks, or NULL after answering the error. */
static pcall *coll_stats_calls(ctx *c, bool stage, size_t *n_out, bool *sharded,
			       int64_t *nchunks)
{
	static const int absent[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};
	route_coll *rc = route_or_fail(c);
	char **ids = NULL;
	size_t n, i;
	pcall *pc, *bad;

	if (rc == NULL)
		return NULL;
	*sharded = rc->nkeys > 0;
	*nchunks = *sharded ? (int64_t)rc->nchunks : 1;
	if (*sharded) {
		n = owning_shards(rc, &ids);
		route_coll_unref(rc);
	} else {
		char *primary;
		route_coll_unref(rc);
		if (!with_primary(c, &primary))
			return NULL;
		ids = sdb_calloc(1, sizeof *ids);
		ids[0] = primary;
		n = 1;
	}
	pc = pcalls_new(c, ids, n);
	for (i = 0; i < n; i++) {
		if (stage)
			BSON_APPEND_UTF8(&pc[i].cmd, "collStats", c->coll);
		else
			copy_renamed(c->cmd, &pc[i].cmd, "collStats");
	}
	shardconn_fanout(c->p->sc, n, pcall_one, pc);
	bad = pcalls_failed(pc, n, *sharded ? absent : NULL);
	if (bad) {
		if (bad->cls == SHARDCONN_NET_ERR)
			reply_shard_error(c->req, bad->cls, &bad->reply, bad->nerr);
		else
			reply_copy(c->req, &bad->reply); /* e.g. the collection does not exist */
		pcalls_free(pc, n);
		return NULL;
	}
	*n_out = n;
	return pc;
}

/* {$collStats: {storageStats: {...}, count: {}}} as the first (and only) stage of an
 * aggregate (what mongosh's coll.stats() runs): one document per shard, as mongos answers,
 * {ns, shard, host, localTime, storageStats: <the shard's collStats>, count: {count}}.
 * latencyStats and queryExecStats are not kept by stripedb: FailedToParse (9), as a
 * server that does not know them, so mongosh falls back to the collStats command. */
static void do_coll_stats_stage(ctx *c, const bson_t *spec)
{
	bson_iter_t it;
	size_t n = 0, i;
	bool sharded, want_storage = false, want_count = false;
	int64_t nchunks;
	pcall *pc;
	bson_t *out, cur, batch;

	if (bson_iter_init(&it, spec)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "storageStats") == 0)
				want_storage = true;
			else if (strcmp(k, "count") == 0)
				want_count = true;
			else {
				wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
					       "$collStats: %s is not supported by stripedb "
					       "(storageStats and count are)",
					       k);
				return;
			}
		}
	}
	pc = coll_stats_calls(c, true, &n, &sharded, &nchunks);
	if (pc == NULL)
		return;
	out = bson_new();
	bson_append_document_begin(out, "cursor", -1, &cur);
	BSON_APPEND_INT64(&cur, "id", 0);
	BSON_APPEND_UTF8(&cur, "ns", c->ns);
	bson_append_array_begin(&cur, "firstBatch", -1, &batch);
	for (i = 0; i < n; i++) {
		bson_t d, st, cnt;
		char key[24], *hosts;
		bson_iter_t f;
		if (pc[i].cls != SHARDCONN_OK)
			continue;
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&batch, key, -1, &d);
		BSON_APPEND_UTF8(&d, "ns", c->ns);
		BSON_APPEND_UTF8(&d, "shard", pc[i].shard);
		hosts = shardconn_shard_hosts(c->p->sc, pc[i].shard);
		if (hosts)
			BSON_APPEND_UTF8(&d, "host", hosts);
		free(hosts);
		bson_append_now_utc(&d, "localTime", -1);
		if (want_storage) {
			bson_append_document_begin(&d, "storageStats", -1, &st);
			if (bson_iter_init(&f, &pc[i].reply))
				while (bson_iter_next(&f))
					if (strcmp(bson_iter_key(&f), "ok") != 0 &&
					    strcmp(bson_iter_key(&f), "$clusterTime") != 0 &&
					    strcmp(bson_iter_key(&f), "operationTime") != 0)
						bson_append_iter(&st, NULL, 0, &f);
			bson_append_document_end(&d, &st);
		}
		if (want_count) {
			bson_append_document_begin(&d, "count", -1, &cnt);
			BSON_APPEND_INT64(&cnt, "count", get_int(&pc[i].reply, "count", 0));
			bson_append_document_end(&d, &cnt);
		}
		bson_append_document_end(&batch, &d);
	}
	bson_append_array_end(&cur, &batch);
	bson_append_document_end(out, &cur);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	pcalls_free(pc, n);
	(void)sharded;
	(void)nchunks;
	wire_req_reply(c->req, out);
}

static void do_coll_stats(ctx *c)
{
	size_t n = 0, i;
	pcall *pc;
	bool sharded;
	int64_t nchunks, count = 0, size = 0, storage = 0, total_idx = 0, nindexes = 0;
	isizes sizes;
	bson_t *out, shards, idx;

	pc = coll_stats_calls(c, false, &n, &sharded, &nchunks);
	if (pc == NULL)
		return;
	memset(&sizes, 0, sizeof sizes);
	out = bson_new();
	BSON_APPEND_UTF8(out, "ns", c->ns);
	BSON_APPEND_BOOL(out, "sharded", sharded);
	if (!sharded)
		BSON_APPEND_UTF8(out, "primary", pc[0].shard);
	bson_append_document_begin(out, "shards", -1, &shards);
	for (i = 0; i < n; i++) {
		bson_iter_t it, sub;
		if (pc[i].cls != SHARDCONN_OK)
			continue;
		count += get_int(&pc[i].reply, "count", 0);
		size += get_int(&pc[i].reply, "size", 0);
		storage += get_int(&pc[i].reply, "storageSize", 0);
		total_idx += get_int(&pc[i].reply, "totalIndexSize", 0);
		if (get_int(&pc[i].reply, "nindexes", 0) > nindexes)
			nindexes = get_int(&pc[i].reply, "nindexes", 0);
		if (bson_iter_init_find(&it, &pc[i].reply, "indexSizes") &&
		    BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub))
			while (bson_iter_next(&sub))
				if (BSON_ITER_HOLDS_NUMBER(&sub))
					isizes_add(&sizes, bson_iter_key(&sub), bson_iter_as_int64(&sub));
		append_shard_reply(&shards, pc[i].shard, &pc[i].reply);
	}
	bson_append_document_end(out, &shards);
	BSON_APPEND_INT64(out, "count", count);
	BSON_APPEND_INT64(out, "size", size);
	BSON_APPEND_INT64(out, "storageSize", storage);
	BSON_APPEND_INT64(out, "totalIndexSize", total_idx);
	BSON_APPEND_INT64(out, "avgObjSize", count ? size / count : 0);
	BSON_APPEND_INT64(out, "nindexes", nindexes);
	bson_append_document_begin(out, "indexSizes", -1, &idx);
	for (i = 0; i < sizes.n; i++)
		BSON_APPEND_INT64(&idx, sizes.names[i], sizes.vals[i]);
	bson_append_document_end(out, &idx);
	BSON_APPEND_BOOL(out, "capped", false);
	BSON_APPEND_INT64(out, "nchunks", nchunks);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	isizes_free(&sizes);
	pcalls_free(pc, n);
	wire_req_reply(c->req, out);
}

/* dbStats (mongos' cluster dbStats): sent to every shard, as mongos does; collections,
 * views, objects, dataSize, storageSize, indexes and indexSize are summed (a collection
 * with documents on k shards counts k times, as on mongos), avgObjSize = dataSize /
 * objects, each shard's reply under raw.<id>. */
static void do_db_stats(ctx *c)
{
	static const char *const sums[] = {"collections", "views",   "objects",   "dataSize",
					   "storageSize", "indexes", "indexSize", NULL};
	int64_t tot[7] = {0};
	bcast b;
	bson_t fwd = BSON_INITIALIZER, *out, raw;
	size_t n, i, k;

	copy_renamed(c->cmd, &fwd, "dbStats");
	n = broadcast(c, &fwd, &b);
	bson_destroy(&fwd);

	if (n == 0) {
		bcast_free(&b, n);
		wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
		return;
	}
	for (i = 0; i < n; i++)
		if (b.cls[i] != SHARDCONN_OK) {
			reply_shard_error(c->req, b.cls[i], &b.replies[i], b.nerr[i]);
			bcast_free(&b, n);
			return;
		}
	out = bson_new();
	bson_append_document_begin(out, "raw", -1, &raw);
	for (i = 0; i < n; i++) {
		for (k = 0; sums[k]; k++)
			tot[k] += get_int(&b.replies[i], sums[k], 0);
		append_shard_reply(&raw, b.ids[i], &b.replies[i]);
	}
	bson_append_document_end(out, &raw);
	BSON_APPEND_UTF8(out, "db", c->db);
	for (k = 0; sums[k]; k++) {
		BSON_APPEND_INT64(out, sums[k], tot[k]);
		if (strcmp(sums[k], "objects") == 0)
			BSON_APPEND_DOUBLE(out, "avgObjSize",
					   tot[k] ? (double)tot[3] / (double)tot[k] : 0.0);
	}
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	bcast_free(&b, n);
	wire_req_reply(c->req, out);
}

/* Commands explain accepts (as mongos: the explainable commands the proxy routes). */
static const char *const explainable[] = {"find",   "count",         "distinct",
					  "aggregate", "update", "delete", "findAndModify",
					  "findandmodify", NULL};

static bool in_list(const char *const *list, const char *name)
{
	size_t i;

	for (i = 0; list[i]; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}


/* OR into sel the chunks the inner command verb would target (the same route_target
 * calls its handler makes; aggregate: its first $match stage, as pushed down). */
static void explain_target(route_coll *rc, const char *verb, const bson_t *inner, bool *sel)
{
	bson_t q, arr, empty = BSON_INITIALIZER;
	bson_iter_t it;
	bool exact, any = false;
	bool *tmp = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *tmp);
	size_t i;

	if (strcmp(verb, "update") == 0 || strcmp(verb, "delete") == 0) {
		if (get_array(inner, verb[0] == 'u' ? "updates" : "deletes", &arr) &&
		    bson_iter_init(&it, &arr))
			while (bson_iter_next(&it)) {
				bson_t sq;
				if (!stmt_filter(&it, &sq))
					continue;
				memset(tmp, 0, rc->nchunks * sizeof *tmp);
				route_target(rc, &sq, tmp, &exact);
				for (i = 0; i < rc->nchunks; i++)
					sel[i] = sel[i] || tmp[i];
				any = true;
			}
		if (!any)
			route_target(rc, &empty, sel, &exact);
		free(tmp);
		return;
	}
	if (strcmp(verb, "find") == 0)
		any = get_doc(inner, "filter", &q);
	else if (strcmp(verb, "aggregate") == 0) {
		if (get_array(inner, "pipeline", &arr) && bson_iter_init(&it, &arr) &&
		    bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_t st;
			uint32_t len;
			const uint8_t *data;
			bson_iter_document(&it, &len, &data);
			if (bson_init_static(&st, data, len))
				any = get_doc(&st, "$match", &q);
		}
	} else
		any = get_doc(inner, "query", &q);
	route_target(rc, any ? &q : &empty, sel, &exact);
	free(tmp);
}

/* The inner command as the proxy sends it to a shard: session fields dropped; a sharded
 * find gets limit + skip pushed down and no skip (the proxy skips after the merge). */
static void explain_inner(const char *verb, const bson_t *inner, bool sharded, bson_t *out)
{
	static const char *const find_skip[] = {"skip", "limit", NULL};
	int64_t skip = get_int(inner, "skip", 0), limit = get_int(inner, "limit", 0);

	if (sharded && strcmp(verb, "find") == 0 && skip > 0) {
		copy_cmd(inner, out, find_skip);
		if (limit != 0)
			BSON_APPEND_INT64(out, "limit", merge_pushdown_limit(skip, limit));
		return;
	}
	copy_cmd(inner, out, NULL);
}

/* Sum (or max) of a number field of the shards' executionStats. */
static int64_t exec_stat(pcall *pc, size_t n, const char *field, bool max)
{
	int64_t r = 0, v;
	size_t i;
	bson_t es;

	for (i = 0; i < n; i++) {
		if (!get_doc(&pc[i].reply, "executionStats", &es))
			continue;
		v = get_int(&es, field, 0);
		r = max ? (v > r ? v : r) : r + v;
	}
	return r;
}

/* The mongos form of explain (cluster_explain.cpp): queryPlanner.winningPlan {stage,
 * shards: [per shard]} and, with executionStats or allPlansExecution, executionStats with
 * executionStages {stage, sums, shards: [per shard]}. */
static void explain_answer(ctx *c, const bson_t *inner, const char *verbosity, bool sorted,
			   pcall *pc, size_t n)
{
	const char *stage = n == 1 ? "SINGLE_SHARD" : sorted ? "SHARD_MERGE_SORT" : "SHARD_MERGE";
	bool stats = strcmp(verbosity, "queryPlanner") != 0;
	bson_t *out = bson_new(), qp, wp, arr, d, es, st, sarr, info, cmd;
	char key[24], host[256];
	size_t i;

	bson_append_document_begin(out, "queryPlanner", -1, &qp);
	BSON_APPEND_INT32(&qp, "mongosPlannerVersion", 1);
	bson_append_document_begin(&qp, "winningPlan", -1, &wp);
	BSON_APPEND_UTF8(&wp, "stage", stage);
	bson_append_array_begin(&wp, "shards", -1, &arr);
	for (i = 0; i < n; i++) {
		char *hosts = shardconn_shard_hosts(c->p->sc, pc[i].shard);
		bson_t sq, si;
		bson_iter_t it;
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "shardName", pc[i].shard);
		BSON_APPEND_UTF8(&d, "connectionString", hosts ? hosts : "");
		free(hosts);
		if (get_doc(&pc[i].reply, "serverInfo", &si))
			BSON_APPEND_DOCUMENT(&d, "serverInfo", &si);
		if (get_doc(&pc[i].reply, "queryPlanner", &sq)) {
			if (bson_iter_init(&it, &sq))
				while (bson_iter_next(&it))
					bson_append_iter(&d, bson_iter_key(&it), -1, &it);
		} else if (bson_iter_init(&it, &pc[i].reply)) {
			/* a plan the shard describes otherwise (aggregate without a query) */
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (strcmp(k, "ok") != 0 && strcmp(k, "serverInfo") != 0 &&
				    strcmp(k, "executionStats") != 0 && strcmp(k, "$clusterTime") != 0 &&
				    strcmp(k, "operationTime") != 0)
					bson_append_iter(&d, k, -1, &it);
			}
		}
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&wp, &arr);
	bson_append_document_end(&qp, &wp);
	bson_append_document_end(out, &qp);
	if (stats) {
		int64_t nret = exec_stat(pc, n, "nReturned", false);
		int64_t ms = exec_stat(pc, n, "executionTimeMillis", true);
		int64_t keys = exec_stat(pc, n, "totalKeysExamined", false);
		int64_t docs = exec_stat(pc, n, "totalDocsExamined", false);
		bson_append_document_begin(out, "executionStats", -1, &es);
		BSON_APPEND_INT64(&es, "nReturned", nret);
		BSON_APPEND_INT64(&es, "executionTimeMillis", ms);
		BSON_APPEND_INT64(&es, "totalKeysExamined", keys);
		BSON_APPEND_INT64(&es, "totalDocsExamined", docs);
		bson_append_document_begin(&es, "executionStages", -1, &st);
		BSON_APPEND_UTF8(&st, "stage", stage);
		BSON_APPEND_INT64(&st, "nReturned", nret);
		BSON_APPEND_INT64(&st, "executionTimeMillis", ms);
		BSON_APPEND_INT64(&st, "totalKeysExamined", keys);
		BSON_APPEND_INT64(&st, "totalDocsExamined", docs);
		BSON_APPEND_INT64(&st, "totalChildMillis", exec_stat(pc, n, "executionTimeMillis",
								       false));
		bson_append_array_begin(&st, "shards", -1, &sarr);
		for (i = 0; i < n; i++) {
			bson_t ses, one;
			bool have = get_doc(&pc[i].reply, "executionStats", &ses);
			snprintf(key, sizeof key, "%zu", i);
			bson_append_document_begin(&sarr, key, -1, &one);
			BSON_APPEND_UTF8(&one, "shardName", pc[i].shard);
			BSON_APPEND_BOOL(&one, "executionSuccess",
					 have ? get_bool(&ses, "executionSuccess", true) : true);
			if (have) {
				BSON_APPEND_INT64(&one, "nReturned", get_int(&ses, "nReturned", 0));
				BSON_APPEND_INT64(&one, "executionTimeMillis",
						  get_int(&ses, "executionTimeMillis", 0));
				BSON_APPEND_INT64(&one, "totalKeysExamined",
						  get_int(&ses, "totalKeysExamined", 0));
				BSON_APPEND_INT64(&one, "totalDocsExamined",
						  get_int(&ses, "totalDocsExamined", 0));
				BSON_APPEND_DOCUMENT(&one, "executionStages", &ses);
			}
			bson_append_document_end(&sarr, &one);
		}
		bson_append_array_end(&st, &sarr);
		bson_append_document_end(&es, &st);
		if (strcmp(verbosity, "allPlansExecution") == 0) {
			bson_t ap, one, none;
			bson_append_array_begin(&es, "allPlansExecution", -1, &ap);
			for (i = 0; i < n; i++) {
				snprintf(key, sizeof key, "%zu", i);
				bson_append_document_begin(&ap, key, -1, &one);
				BSON_APPEND_UTF8(&one, "shardName", pc[i].shard);
				bson_append_array_begin(&one, "allPlans", -1, &none);
				bson_append_array_end(&one, &none);
				bson_append_document_end(&ap, &one);
			}
			bson_append_array_end(&es, &ap);
		}
		bson_append_document_end(out, &es);
	}
	if (gethostname(host, sizeof host) != 0)
		snprintf(host, sizeof host, "localhost");
	host[sizeof host - 1] = '\0';
	bson_append_document_begin(out, "serverInfo", -1, &info);
	BSON_APPEND_UTF8(&info, "host", host);
	BSON_APPEND_UTF8(&info, "version", "6.0.0-stripedb-" PACKAGE_VERSION);
	bson_append_document_end(out, &info);
	bson_init(&cmd);
	copy_cmd(inner, &cmd, NULL);
	BSON_APPEND_DOCUMENT(out, "command", &cmd);
	bson_destroy(&cmd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	wire_req_reply(c->req, out);
}

/* explain (mongos' cluster explain): {explain: <find | count | distinct | aggregate |
 * update | delete | findAndModify>, verbosity}. The inner command is targeted as its own
 * handler targets it (route_target on its filter); each targeted shard gets
 * {explain: <inner as the proxy sends it>, verbosity, $stripedbVersion: <the token of
 * its first targeted chunk>} once, so a shard that lost the chunk answers StaleConfig
 * and the proxy reloads the routing and explains again (within --stale-retry-ms). */
static void do_explain(ctx *c)
{
	static const char *const verbs[] = {"queryPlanner", "executionStats", "allPlansExecution",
					    NULL};
	bson_t inner, sort;
	bson_iter_t it;
	const char *verbosity = "allPlansExecution", *verb;
	ctx x;
	route_coll *rc;

	if (!bson_iter_init_find(&it, c->cmd, "explain") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !get_doc(c->cmd, "explain", &inner)) {
		wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
			       "explain command requires a nested object");
		return;
	}
	if (bson_iter_init_find(&it, c->cmd, "verbosity")) {
		if (!BSON_ITER_HOLDS_UTF8(&it)) {
			wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
				       "explain verbosity must be a string");
			return;
		}
		verbosity = bson_iter_utf8(&it, NULL);
		if (!in_list(verbs, verbosity)) {
			wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
				       "verbosity string must be one of {'queryPlanner', "
				       "'executionStats', 'allPlansExecution'}");
			return;
		}
	}
	if (!bson_iter_init(&it, &inner) || !bson_iter_next(&it)) {
		wire_req_error(c->req, WIRE_ERR_FAILED_TO_PARSE,
			       "explain command requires a nested object");
		return;
	}
	verb = bson_iter_key(&it);
	if (!in_list(explainable, verb)) {
		if (in_list(proxy_cmds, verb))
			wire_req_error(c->req, WIRE_ERR_ILLEGAL_OPERATION, "Cannot explain cmd: %s",
				       verb);
		else
			wire_req_error(c->req, WIRE_ERR_COMMAND_NOT_FOUND,
				       "Explain failed due to unknown command: %s", verb);
		return;
	}
	if (uses_js(&inner, 0)) {
		wire_req_error(c->req, WIRE_ERR_BAD_VALUE,
			       "$where and server-side JavaScript are not allowed on stripedb");
		return;
	}
	x = *c;
	x.cmd = &inner;
	x.coll = NULL;
	x.ns[0] = '\0';
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		x.coll = bson_iter_utf8(&it, NULL);
		snprintf(x.ns, sizeof x.ns, "%s.%s", x.db, x.coll);
	} else if (strcmp(verb, "aggregate") != 0) {
		wire_req_error(c->req, WIRE_ERR_INVALID_NAMESPACE,
			       "%s needs a collection name string as its first field", verb);
		return;
	}
	rc = x.coll ? route_or_fail(&x) : route_coll_unsharded("", 0);
	if (rc == NULL)
		return;
	for (;;) {
		char **ids;
		size_t *first, n = 0, i, k;
		pcall *pc, *bad;
		bool sharded = rc->nkeys > 0, *sel;

		if (!sharded) {
			char *primary;
			if (!with_primary(&x, &primary))
				break;
			ids = sdb_calloc(1, sizeof *ids);
			first = sdb_calloc(1, sizeof *first);
			ids[n++] = primary;
		} else {
			sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
			explain_target(rc, verb, &inner, sel);
			ids = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *ids);
			first = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *first);
			for (i = 0; i < rc->nchunks; i++) {
				bool dup = false;
				if (!sel[i])
					continue;
				for (k = 0; k < n && !dup; k++)
					dup = strcmp(ids[k], rc->chunks[i].shard) == 0;
				if (!dup) {
					ids[n] = sdb_strdup(rc->chunks[i].shard);
					first[n++] = i;
				}
			}
			free(sel);
			/* by shard id, so the answer is deterministic */
			for (i = 1; i < n; i++)
				for (k = i; k > 0 && strcmp(ids[k - 1], ids[k]) > 0; k--) {
					char *t = ids[k];
					size_t f = first[k];
					ids[k] = ids[k - 1];
					first[k] = first[k - 1];
					ids[k - 1] = t;
					first[k - 1] = f;
				}
		}
		if (n == 0) { /* a sharded collection without chunks: nothing to explain */
			ids[n] = proxy_primary(c->p);
			if (ids[n] == NULL) {
				free(ids);
				free(first);
				wire_req_error(c->req, WIRE_ERR_SHARD_NOT_FOUND,
					       "no shard is registered in the metadata service");
				break;
			}
			first[n++] = SIZE_MAX;
		}
		pc = pcalls_new(c, ids, n);
		for (i = 0; i < n; i++) {
			bson_t in;
			bson_append_document_begin(&pc[i].cmd, "explain", -1, &in);
			explain_inner(verb, &inner, sharded, &in);
			bson_append_document_end(&pc[i].cmd, &in);
			BSON_APPEND_UTF8(&pc[i].cmd, "verbosity", verbosity);
			if (sharded && first[i] != SIZE_MAX)
				append_version(&pc[i].cmd, &rc->chunks[first[i]]);
		}
		free(first);
		shardconn_fanout(c->p->sc, n, pcall_one, pc);
		bad = pcalls_failed(pc, n, NULL);
		for (i = 0; i < n; i++)
			if (pc[i].cls == SHARDCONN_STALE)
				bad = &pc[i];
		if (bad && bad->cls == SHARDCONN_STALE && stale_backoff(c)) {
			pcalls_free(pc, n);
			rc = refresh(&x, rc);
			continue;
		}
		if (bad)
			reply_shard_error(c->req, bad->cls, &bad->reply, bad->nerr);
		else
			explain_answer(c, &inner, verbosity,
				       strcmp(verb, "find") == 0 && get_doc(&inner, "sort", &sort) &&
					       !bson_empty(&sort),
				       pc, n);
		pcalls_free(pc, n);
		break;
	}
	route_coll_unref(rc);
}

/* ---------- dispatch ---------- */

static bool policy_ok(ctx *c, const char *name);

/* Admission: the tenant's quotas (proxy/quota.h). Answers and returns false when over. */
static bool admit(ctx *c, const char *name)
{
	int64_t docs = 0, retry = 0;
	char msg[256];
	bson_t arr;
	bson_iter_t it;
	const char *field = NULL;

	if (strcmp(name, "killCursors") == 0)
		return true;
	if (strcmp(name, "insert") == 0)
		field = "documents";
	else if (strcmp(name, "update") == 0)
		field = "updates";
	else if (strcmp(name, "delete") == 0)
		field = "deletes";
	else if (strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0)
		docs = 1;
	if (field && get_array(c->cmd, field, &arr) && bson_iter_init(&it, &arr))
		while (bson_iter_next(&it))
			docs++;
	if (proxy_quota_admit(c->p->quota, c->db, docs, (int64_t)proxy_bson_len(c->cmd), &retry, msg,
			      sizeof msg))
		return true;
	sdb_counter_inc(c->p->m_rejected);
	{
		bson_t *extra = bson_new();
		BSON_APPEND_INT64(extra, "retryAfterMS", retry);
		wire_req_error_extra(c->req, WIRE_ERR_RATE_LIMITED, extra, "%s", msg);
	}
	return false;
}

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
	if (!admit(&c, name) || !policy_ok(&c, name))
		goto out;
	if (strcmp(name, "getMore") == 0) {
		do_get_more(&c);
		goto out;
	}
	if (strcmp(name, "killCursors") == 0) {
		do_kill_cursors(&c);
		goto out;
	}
	if (strcmp(name, "listDatabases") == 0) {
		do_list_union(&c, true);
		goto out;
	}
	if (strcmp(name, "listCollections") == 0) {
		do_list_union(&c, false);
		goto out;
	}
	if (strcmp(name, "dropDatabase") == 0) {
		do_broadcast(&c);
		goto out;
	}
	if (strcmp(name, "aggregate") == 0) {
		do_aggregate(&c);
		goto out;
	}
	if (strcmp(name, "explain") == 0) {
		do_explain(&c);
		goto out;
	}
	if (strcmp(name, "dbStats") == 0 || strcmp(name, "dbstats") == 0) {
		do_db_stats(&c);
		goto out;
	}
	if (c.coll == NULL) {
		wire_req_error(c.req, WIRE_ERR_INVALID_NAMESPACE,
			       "%s needs a collection name string as its first field", name);
		goto out;
	}
	if (strcmp(name, "find") == 0)
		do_find(&c);
	else if (strcmp(name, "insert") == 0)
		do_insert(&c);
	else if (strcmp(name, "update") == 0)
		do_write(&c, true);
	else if (strcmp(name, "delete") == 0)
		do_write(&c, false);
	else if (strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0)
		do_find_and_modify(&c);
	else if (strcmp(name, "count") == 0)
		do_count(&c);
	else if (strcmp(name, "distinct") == 0)
		do_distinct(&c);
	else if (strcmp(name, "listIndexes") == 0)
		do_list_indexes(&c);
	else if (strcmp(name, "collStats") == 0 || strcmp(name, "collstats") == 0)
		do_coll_stats(&c);
	else if (strcmp(name, "createIndexes") == 0)
		do_create_indexes(&c);
	else
		do_broadcast(&c); /* dropIndexes, drop, create, collMod */
out:
	proxy_txn_free(&c.txn);
	free(j->user);
	free(j);
}

/* ---------- collection policy ("minimum features") ---------- */

#define ERR_NO_QUERY_EXECUTION_PLANS 291

/* True when the shard would scan the whole collection for filter q (explain). */
static bool plan_is_collscan(ctx *c, const char *shard, const bson_t *q)
{
	bson_t cmd = BSON_INITIALIZER, inner, reply;
	bson_iter_t it;
	char nerr[256];
	bool scan = false;

	bson_append_document_begin(&cmd, "explain", -1, &inner);
	BSON_APPEND_UTF8(&inner, "find", c->coll);
	BSON_APPEND_DOCUMENT(&inner, "filter", q);
	bson_append_document_end(&cmd, &inner);
	BSON_APPEND_UTF8(&cmd, "verbosity", "queryPlanner");
	if (run_on(c, shard, &cmd, NULL, &reply, nerr, sizeof nerr) == SHARDCONN_OK &&
	    bson_iter_init(&it, &reply) &&
	    bson_iter_find_descendant(&it, "queryPlanner.winningPlan.stage", &it) &&
	    BSON_ITER_HOLDS_UTF8(&it))
		scan = strcmp(bson_iter_utf8(&it, NULL), "COLLSCAN") == 0;
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return scan;
}

/* Check one filter against the scatter and unindexed switches. */
static bool policy_filter_ok(ctx *c, unsigned flags, route_coll *rc, const bson_t *q)
{
	char *shard = NULL;
	bool ok = true;

	if (rc->nchunks > 0) {
		bool *sel = sdb_calloc(rc->nchunks, sizeof *sel), exact;
		size_t nsel = route_target(rc, q, sel, &exact), i;
		if ((flags & PROXY_POLICY_NO_SCATTER) && rc->nchunks > 1 && nsel == rc->nchunks &&
		    !exact) {
			wire_req_error(c->req, WIRE_ERR_ILLEGAL_OPERATION,
				       "scatter-gather queries are forbidden on %s by its collection "
				       "policy: the filter must use the shard key",
				       c->ns);
			ok = false;
		}
		for (i = 0; ok && i < rc->nchunks && shard == NULL; i++)
			if (sel[i])
				shard = sdb_strdup(rc->chunks[i].shard);
		free(sel);
	} else {
		shard = proxy_primary(c->p);
	}
	if (ok && (flags & PROXY_POLICY_NO_UNINDEXED) && shard && plan_is_collscan(c, shard, q)) {
		wire_req_error(c->req, ERR_NO_QUERY_EXECUTION_PLANS,
			       "No indexed plans available for this filter on %s, and its collection "
			       "policy forbids unindexed queries (forbidUnindexed)",
			       c->ns);
		ok = false;
	}
	free(shard);
	return ok;
}

/* The collection policy switches (proxy/quota.h). Answers and returns false on refusal. */
static bool policy_ok(ctx *c, const char *name)
{
	unsigned flags;
	bson_t q, arr, empty = BSON_INITIALIZER;
	bool bounded = true, ok = true, has_q = false;
	const char *stmts = NULL;
	route_coll *rc;
	char err[256];
	bson_iter_t it;

	if (c->coll == NULL)
		return true;
	flags = proxy_policy(c->p->quota, c->db, c->ns);
	if (flags == 0)
		return true;
	if (strcmp(name, "find") == 0) {
		has_q = get_doc(c->cmd, "filter", &q);
		bounded = get_int(c->cmd, "limit", 0) != 0;
	} else if (strcmp(name, "count") == 0 || strcmp(name, "distinct") == 0 ||
		   strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0) {
		has_q = get_doc(c->cmd, "query", &q);
	} else if (strcmp(name, "aggregate") == 0) {
		bounded = false;
		if (get_array(c->cmd, "pipeline", &arr) && bson_iter_init(&it, &arr)) {
			bool first = true;
			while (bson_iter_next(&it)) {
				bson_t st;
				uint32_t len;
				const uint8_t *data;
				if (!BSON_ITER_HOLDS_DOCUMENT(&it))
					continue;
				bson_iter_document(&it, &len, &data);
				if (!bson_init_static(&st, data, len))
					continue;
				if (bson_has_field(&st, "$limit") || bson_has_field(&st, "$count"))
					bounded = true;
				if (first && get_doc(&st, "$match", &q))
					has_q = true;
				first = false;
			}
		}
	} else if (strcmp(name, "update") == 0) {
		stmts = "updates";
	} else if (strcmp(name, "delete") == 0) {
		stmts = "deletes";
	} else {
		return true;
	}
	if ((flags & PROXY_POLICY_NO_UNBOUNDED) && !bounded) {
		wire_req_error(c->req, WIRE_ERR_ILLEGAL_OPERATION,
			       "unbounded result sets are forbidden on %s by its collection policy: "
			       "give a limit",
			       c->ns);
		return false;
	}
	if (!(flags & (PROXY_POLICY_NO_SCATTER | PROXY_POLICY_NO_UNINDEXED)))
		return true;
	rc = proxy_route(c->p, c->ns, false, err, sizeof err);
	if (rc == NULL)
		return true; /* the handler reports the routing problem */
	if (stmts) {
		if (get_array(c->cmd, stmts, &arr) && bson_iter_init(&it, &arr)) {
			while (ok && bson_iter_next(&it)) {
				bson_t sq;
				if (stmt_filter(&it, &sq))
					ok = policy_filter_ok(c, flags, rc, &sq);
			}
		}
	} else {
		ok = policy_filter_ok(c, flags, rc, has_q ? &q : &empty);
	}
	route_coll_unref(rc);
	return ok;
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
