/* Proxy reads (issue #6): per-chunk scatter streams merged into proxy cursors (find,
 * aggregate), getMore / killCursors, the gated collect of owned documents (shared with the
 * two-phase writes of write.c), count and distinct. See exec.c for version gating. */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/gate.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/cmdopts.h"
#include "common/err.h"
#include "common/fieldscan.h"
#include "common/log.h"
#include "common/aggwrite.h"
#include "proxy/exec.h"
#include "proxy/txn.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

/* ---------- scatter reads: per-chunk streams ---------- */

/* Copy the fields of cmd named in keep (NULL-terminated) to out, as they are. */
static void copy_options(const bson_t *cmd, bson_t *out, const char *const *keep)
{
	bson_iter_t it;
	size_t i;

	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it))
		for (i = 0; keep[i]; i++)
			if (strcmp(bson_iter_key(&it), keep[i]) == 0)
				bson_append_iter(out, keep[i], -1, &it);
}

/* Options of a client's find that each per-chunk find carries as they are. */
static void copy_find_options(const bson_t *cmd, bson_t *out)
{
	static const char *const keep[] = {"hint", "collation", "maxTimeMS", "comment",
					   "allowDiskUse", "let", "min", "max",
					   "readConcern", "noCursorTimeout", NULL};

	copy_options(cmd, out, keep);
}

/* exec.h. */
void px_find_shard_cmd(const ctx *c, const route_coll *rc, size_t ci, bool per_shard,
		       const bson_t *filter, const bson_t *sort, const bson_t *proj,
		       int64_t batch, int64_t limit, bson_t *out)
{
	const route_chunk *ch = &rc->chunks[ci];

	BSON_APPEND_UTF8(out, "find", c->coll);
	if (filter && !bson_empty(filter))
		BSON_APPEND_DOCUMENT(out, "filter", filter);
	if (sort && !bson_empty(sort))
		BSON_APPEND_DOCUMENT(out, "sort", sort);
	if (proj && !bson_empty(proj))
		BSON_APPEND_DOCUMENT(out, "projection", proj);
	BSON_APPEND_INT64(out, "batchSize", batch);
	if (per_shard && limit > 0)
		BSON_APPEND_INT64(out, "limit", limit);
	copy_find_options(c->cmd, out);
	if (per_shard)
		px_append_shard_version(out, rc, ch->shard);
	else
		px_append_version(out, ch);
}

/* exec.h. */
int64_t px_find_first_batch(int64_t skip, int64_t limit, int64_t batch)
{
	int64_t pushed = merge_pushdown_limit(skip, limit);

	if (pushed == 0 || pushed > 1000)
		pushed = 1000;
	if (batch > 0 && skip < pushed && batch < pushed - skip)
		pushed = batch + skip;
	if (pushed < 1)
		pushed = 1;
	return pushed;
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

	s->status = px_run_on(sc->c, s->shard, &sc->cmds[i], &s->server_id, &reply, s->neterr,
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

/* Options of a client's aggregate that a shard's sampling aggregate carries as they are. */
static void copy_agg_options(const bson_t *cmd, bson_t *out)
{
	static const char *const keep[] = {"hint", "collation", "maxTimeMS", "comment",
					   "allowDiskUse", "let", "readConcern", NULL};

	copy_options(cmd, out, keep);
}

/* The sampling aggregate of a shard for an aggregate whose pipeline starts (after its
 * leading $match) with {$sample: {size: sample}}: the shard samples its own documents (its
 * orphans filtered by the shard version) and sends each one's random key
 * ($stripedbSampleKey: storage/pipeline.h SDB_PIPELINE_SAMPLE_KEY), which the proxy's
 * $sample then merges (mongod's DocumentSourceSample::distributedPlanLogic). */
static void sample_cmd(ctx *c, const bson_t *filter, int64_t sample, int64_t batch,
		       bson_t *cmd)
{
	bson_t pl, st, sub, cur;

	BSON_APPEND_UTF8(cmd, "aggregate", c->coll);
	bson_append_array_begin(cmd, "pipeline", -1, &pl);
	bson_append_document_begin(&pl, "0", -1, &st);
	if (filter)
		BSON_APPEND_DOCUMENT(&st, "$match", filter);
	else {
		bson_append_document_begin(&st, "$match", -1, &sub);
		bson_append_document_end(&st, &sub);
	}
	bson_append_document_end(&pl, &st);
	bson_append_document_begin(&pl, "1", -1, &st);
	bson_append_document_begin(&st, "$sample", -1, &sub);
	BSON_APPEND_INT64(&sub, "size", sample);
	bson_append_document_end(&st, &sub);
	bson_append_document_end(&pl, &st);
	bson_append_array_end(cmd, &pl);
	bson_append_document_begin(cmd, "cursor", -1, &cur);
	BSON_APPEND_INT64(&cur, "batchSize", batch);
	bson_append_document_end(cmd, &cur);
	BSON_APPEND_BOOL(cmd, SDB_PIPELINE_SAMPLE_KEY, true);
	copy_agg_options(c->cmd, cmd);
}

/* Open the find cursors of the selected chunks: ONE per target shard that has filtering
 * metadata (shard version, the shard drops orphans: shardver.c), else one per chunk with the
 * ownership filter. base is the find command body without the collection name, filter,
 * projection or version (those are added here). sample >= 0: a request to a shard (not
 * per chunk: the ownership filter would drop sampled documents after the fact) is the
 * sampling aggregate of sample_cmd instead of a find (sort and proj then unused).
 * limit > 0 (the client's limit + skip, merge_pushdown_limit): each per-shard find gets it
 * as its limit, as mongos sends a find's limit to its shards (issue #19): a shard then
 * returns at most that many documents in all and closes its cursor itself once it has
 * (cursor id 0 in the reply), so a short sorted scan needs no killCursors afterwards. The
 * shard counts only the documents it owns (its orphan filter runs before the limit,
 * storage/query.h). Per-chunk finds go without it: their shard also returns the documents
 * of its other chunks and its orphans, which the proxy drops (pstream_take_batch), so a
 * limit there could stop before the chunk's own documents.
 * partial_ok (a find's allowPartialResults): a request its shard did not answer
 * (SHARDCONN_NET_ERR: down, timeout; never a command error) leaves its stream empty and
 * exhausted instead of failing, and sets *dropped.
 * Returns SHARDCONN_OK with *out streams (count *nout), or the first failure class with
 * *fail pointing at the failed stream's error (streams freed, shard cursors killed). */
static int scatter_open_once(ctx *c, route_coll *rc, const bool *sel, const bson_t *filter,
			     const bson_t *sort, const bson_t *proj, int64_t batch, int64_t limit,
			     int64_t sample, bool partial_ok, pstream **out, size_t *nout,
			     bson_t *err_reply, char *neterr, size_t nelen, bool *nometa,
			     bool *dropped)
{
	scatter sc;
	size_t i, j, nsel = 0;
	int cls = SHARDCONN_OK;

	memset(&sc, 0, sizeof sc);
	sc.c = c;
	sc.rc = rc;
	/* arrays sized by the requests sent (one per shard in shard mode), not by chunks */
	px_mode_memo *memo = sdb_calloc(1, sizeof *memo);
	nsel = px_stream_bound(memo, rc, sel, c->tx != NULL);
	sc.chunks = sdb_calloc(nsel ? nsel : 1, sizeof *sc.chunks);
	sc.s = sdb_calloc_bson(nsel ? nsel : 1, sizeof *sc.s);
	sc.cmds = sdb_calloc_bson(nsel ? nsel : 1, sizeof *sc.cmds);
	for (i = 0; i < rc->nchunks; i++) {
		route_chunk *ch = &rc->chunks[i];
		bool per_shard;
		ssize_t slot;
		if (!sel[i])
			continue;
		/* a transaction's statements use per-chunk requests: a shard without filtering
		 * metadata would refuse a shard-versioned one with StaleConfig, which aborts the
		 * transaction (the proxy does not retry inside one) */
		per_shard = c->tx == NULL && px_shard_mode_memo(memo, rc, i, &slot);
		if (per_shard) {
			if (slot >= 0 && memo->stream[slot] >= 0)
				continue; /* this shard's request is there already */
			for (j = 0; slot < 0 && j < sc.n; j++)
				if (sc.s[j].chunk < 0 && strcmp(sc.s[j].shard, ch->shard) == 0)
					break;
			if (slot < 0 && j < sc.n)
				continue;
			if (slot >= 0)
				memo->stream[slot] = (ssize_t)sc.n;
		}
		px_stream_init(&sc.s[sc.n], ch->shard, c->db, c->coll);
		if (!per_shard) {
			sc.s[sc.n].rcoll = rc;
			route_coll_ref(rc);
			sc.s[sc.n].chunk = (ssize_t)i;
		}
		sc.chunks[sc.n] = i;
		bson_init(&sc.cmds[sc.n]);
		if (per_shard && sample >= 0) {
			sample_cmd(c, filter, sample, batch, &sc.cmds[sc.n]);
			px_append_shard_version(&sc.cmds[sc.n], rc, ch->shard);
			sc.n++;
			continue;
		}
		px_find_shard_cmd(c, rc, i, per_shard, filter, sort, proj, batch, limit,
				  &sc.cmds[sc.n]);
		sc.n++;
	}
	free(memo);
	px_fanout(c, sc.n, scatter_one, &sc);
	for (i = 0; i < sc.n; i++) {
		if (partial_ok && sc.s[i].status == SHARDCONN_NET_ERR) {
			/* allowPartialResults: this shard's part is left out */
			sdb_info("find: a shard's part dropped (allowPartialResults)",
				 "ns=%s shard=%s err=%s", c->ns, sc.s[i].shard, sc.s[i].neterr);
			sc.s[i].status = SHARDCONN_OK;
			sc.s[i].cursor_id = 0;
			*dropped = true;
			continue;
		}
		if (sc.s[i].status != SHARDCONN_OK && cls == SHARDCONN_OK) {
			cls = sc.s[i].status;
			bson_copy_to(&sc.s[i].err_reply, err_reply);
			snprintf(neterr, nelen, "%s", sc.s[i].neterr);
		}
		if (sc.s[i].status == SHARDCONN_STALE) {
			cls = SHARDCONN_STALE;
			if (sc.s[i].chunk < 0 &&
			    px_shard_mode_note(rc, sc.s[i].shard, &sc.s[i].err_reply))
				*nometa = true;
		}
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
	return SHARDCONN_OK;
}

/* open_merged's operation: the per-chunk streams of one routing snapshot. */
typedef struct merged_op {
	const bson_t *filter, *sort_spec, *shard_proj;
	int64_t batch;
	int64_t limit;  /* > 0: each shard's limit (limit + skip; scatter_open_once) */
	int64_t sample; /* >= 0: the shards sample (scatter_open_once) */
	pstream *s; /* the streams opened (count n) ... */
	size_t n;
	bool opened; /* ... when done without an answer */
	bool redone; /* an attempt was run again for a shard without filtering metadata */
	bool partial_ok; /* a find's allowPartialResults (scatter_open_once) ... */
	bool dropped;    /* ... and the opened streams miss an unreachable shard's part */
} merged_op;

static int merged_execute(px_retry *r, void *arg)
{
	merged_op *m = arg;
	size_t nsel;
	bool exact;
	bool *sel = px_target(r->rc, m->filter, r->c->cmd, &nsel, &exact);
	bson_t err_reply = BSON_INITIALIZER;
	char nerr[256];
	bool nometa = false;
	int cls;

	px_note_target(r->c, r->rc, nsel);
	m->dropped = false; /* of this attempt */
	cls = scatter_open_once(r->c, r->rc, sel, m->filter, m->sort_spec, m->shard_proj,
				m->batch, m->limit, m->sample, m->partial_ok, &m->s, &m->n, &err_reply, nerr,
				sizeof nerr, &nometa, &m->dropped);
	free(sel);
	if (cls == SHARDCONN_STALE && nometa && !m->redone) {
		/* a shard without filtering metadata (now remembered): the retry loop runs the
		 * attempt again at once, per chunk for that shard */
		m->redone = true;
		bson_destroy(&err_reply);
		return PX_RETRY_AGAIN;
	}
	if (cls == SHARDCONN_OK)
		m->opened = true;
	else if (cls == SHARDCONN_STALE)
		px_failure_set(&r->last, cls, &err_reply, nerr);
	else
		r->status = px_reply_shard_error(r->c, cls, &err_reply, nerr);
	bson_destroy(&err_reply);
	return cls == SHARDCONN_STALE ? PX_RETRY_STALE : PX_RETRY_DONE;
}

/* Does c, a find, ask for partial results (allowPartialResults: true)? Honoured outside
 * transactions only (a transaction's statement fails as a whole). */
static bool find_partial_ok(const ctx *c)
{
	bson_iter_t it;

	return c->tx == NULL && bson_iter_init(&it, c->cmd) && bson_iter_next(&it) &&
	       strcmp(bson_iter_key(&it), "find") == 0 &&
	       px_get_bool(c->cmd, "allowPartialResults", false);
}

/* A merged cursor over the chunks a filter targets (px_retry_run: StaleConfig retried
 * within budget) into *out. Takes sort and proj. *rcp: the routing, replaced by a newer one
 * after a refresh. A find with allowPartialResults leaves out the shards that do not
 * answer (find_partial_ok; the cursor reports it: proxy_cursor_set_partial). Returns: 0
 * with *out, or the code of the error answered on c (*out NULL). */
static int open_merged_ex(ctx *c, route_coll **rcp, const bson_t *filter,
			  const bson_t *sort_spec, const bson_t *shard_proj, merge_sort *sort,
			  sdb_projection *proj, int64_t skip, int64_t limit, int64_t batch,
			  int64_t sample, proxy_cursor **out)
{
	merged_op m = {filter, sort_spec, shard_proj, batch, merge_pushdown_limit(skip, limit),
		       sample, NULL, 0, false, false, find_partial_ok(c), false};
	px_retry r;

	px_retry_init(&r, c, *rcp, merged_execute, NULL, &m);
	px_retry_run(&r);
	*rcp = r.rc;
	r.rc = NULL; /* the caller's reference */
	px_retry_done(&r);
	*out = NULL;
	if (m.opened) {
		merge_sort_set_collation(sort, c->collator);
		*out = proxy_cursor_new(c->p, c->ns, m.s, m.n, sort, proj, skip, limit);
		if (m.partial_ok)
			proxy_cursor_set_partial(*out, m.dropped);
		return 0;
	}
	merge_sort_free(sort);
	sdb_projection_free(proj);
	return r.status; /* answered by merged_execute or px_retry_run */
}

/* open_merged_ex with finds only. */
static int open_merged(ctx *c, route_coll **rcp, const bson_t *filter, const bson_t *sort_spec,
		       const bson_t *shard_proj, merge_sort *sort, sdb_projection *proj,
		       int64_t skip, int64_t limit, int64_t batch, proxy_cursor **out)
{
	return open_merged_ex(c, rcp, filter, sort_spec, shard_proj, sort, proj, skip, limit,
			      batch, -1, out);
}

/* ---------- find / getMore / killCursors ---------- */

int px_do_find(ctx *c)
{
	/* the options read here, in one pass over the command (common/fieldscan.h); at[F_X].it
	 * is on field F_X when has & SDB_FIELD_BIT(F_X) */
	enum { F_FILTER, F_SORT, F_PROJ, F_SINGLE, F_SKIP, F_LIMIT, F_BATCH, F_TAILABLE, F_N };
	static const char *const names[F_N] = {"filter",    "sort",  "projection",
					       "singleBatch", "skip",  "limit",
					       "batchSize",   "tailable"};
	sdb_field_iter at[F_N];
	uint64_t has;
	(void)sdb_bson_find_fields(c->cmd, names, F_N, &has, at); /* F_N <= SDB_FIELDS_MAX */
#define FOUND(f) ((has & SDB_FIELD_BIT(f)) ? &at[f].it : NULL)
	bson_t filter, sort_spec, proj_spec;
	bool has_filter = FOUND(F_FILTER) && sdb_bson_iter_doc(&at[F_FILTER].it, &filter);
	bool has_sort = FOUND(F_SORT) && sdb_bson_iter_doc(&at[F_SORT].it, &sort_spec);
	bool has_proj = FOUND(F_PROJ) && sdb_bson_iter_doc(&at[F_PROJ].it, &proj_spec);
	int64_t skip, limit, batch;
	bool single = FOUND(F_SINGLE) && bson_iter_as_bool(&at[F_SINGLE].it);
	route_coll *rc;
	merge_sort *sort = NULL;
	sdb_projection *proj = NULL;
	proxy_cursor *cur;
	int code = 0, st;
	char err[256];
	int64_t pushed;

	if (has_filter && (st = px_refuse_js(c, &filter)) != 0)
		return st;
	/* find_command.idl: skip, limit and batchSize are safeInt64 with `gte: 0` */
	if ((st = px_client_int_field(c, FOUND(F_SKIP), names[F_SKIP], 0, INT64_MAX, 0,
				      &skip)) != 0 ||
	    (st = px_client_int_field(c, FOUND(F_LIMIT), names[F_LIMIT], 0, INT64_MAX, 0,
				      &limit)) != 0 ||
	    (st = px_client_int_field(c, FOUND(F_BATCH), names[F_BATCH], 0, INT64_MAX, 101,
				      &batch)) != 0)
		return st;
	if ((st = px_route_sharded(c, PX_FWD_CURSOR, batch, single, &rc)) != 0 || rc == NULL)
		return st;
	if (FOUND(F_TAILABLE) && bson_iter_as_bool(&at[F_TAILABLE].it)) {
		/* what a shard answers an unsharded collection's (no collection is capped) */
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"error processing query: tailable cursor requested on non capped "
				"collection");
	}
	if (merge_sort_parse(has_sort ? &sort_spec : NULL, &sort, &code, err, sizeof err) != 0) {
		route_coll_unref(rc);
		return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
	}
	if (has_proj && !bson_empty(&proj_spec)) {
		bson_t vars;

		st = px_let(c, &vars);
		if (st == 0) {
			if (sdb_projection_new_vars(&proj_spec, SDB_PROJECTION_FIND, &vars, &proj,
						    &code, err, sizeof err) != 0)
				st = px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
			bson_destroy(&vars);
		}
		if (st != 0) {
			route_coll_unref(rc);
			merge_sort_free(sort);
			return st;
		}
	}
	pushed = px_find_first_batch(skip, limit, batch);
	st = open_merged(c, &rc, has_filter ? &filter : NULL, has_sort ? &sort_spec : NULL, NULL,
			 sort, proj, skip, limit, pushed, &cur);
	route_coll_unref(rc);
	if (st != 0)
		return st;
	return px_answer_cursor(c, cur, batch, single, "firstBatch", c->ns);
#undef FOUND
}

int px_do_get_more(ctx *c)
{
	bson_iter_t it;
	int64_t id = 0;
	const char *coll = NULL;
	proxy_cursor *cur;
	bson_t *out;
	int code = 0, r;
	char err[512], ns[512];

	if (bson_iter_init_find(&it, c->cmd, "getMore") && BSON_ITER_HOLDS_NUMBER(&it))
		id = bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, c->cmd, "collection") && BSON_ITER_HOLDS_UTF8(&it))
		coll = bson_iter_utf8(&it, NULL);
	if (id == 0 || coll == NULL)
		return px_error(c, WIRE_ERR_BAD_VALUE, "getMore needs a cursor id and collection");
	snprintf(ns, sizeof ns, "%s.%s", c->db, coll);
	switch (proxy_cursor_check(c->p, id, ns, c->user)) {
	case PROXY_CURSOR_OTHER_USER: /* MongoDB's wording; the namespace is not revealed */
		return px_error(c, WIRE_ERR_UNAUTHORIZED,
				"cursor id %lld was not created by the authenticated user",
				(long long)id);
	case PROXY_CURSOR_OTHER_NS:
		return px_error(c, WIRE_ERR_UNAUTHORIZED,
				"Requested getMore on namespace '%s', but cursor %lld belongs to a "
				"different namespace",
				ns, (long long)id);
	case PROXY_CURSOR_OK:
		break;
	}
	cur = proxy_cursor_checkout(c->p, id, NULL);
	if (cur == NULL)
		return px_error(c, WIRE_ERR_CURSOR_NOT_FOUND, "cursor id %lld not found",
				(long long)id);
	if (proxy_cursor_cs(cur) != NULL) /* a change stream (changestream.c) */
		return px_cs_get_more(c, cur, proxy_cursor_cs(cur), id, ns);
	if (bson_iter_init_find(&it, c->cmd, "maxTimeMS")) {
		/* mongod's getMore: maxTimeMS is the await time of an awaitData cursor only,
		 * and the proxy's other cursors are not tailable */
		proxy_cursor_checkin(c->p, cur);
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"cannot set maxTimeMS on getMore command for a non-awaitData cursor");
	}
	int64_t bs = px_get_int(c->cmd, "batchSize", 0);
	if (bs <= 0)
		bs = -1; /* getMore: absent or 0 = no count limit */
	out = proxy_cursor_answer_new(cur, bs);
	r = proxy_cursor_answer(c->p, cur, bs, "nextBatch", ns, out, &code, err, sizeof err);
	if (r < 0) {
		bson_destroy(out);
		proxy_cursor_destroy(c->p, cur);
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	}
	if (r == 1) {
		proxy_cursor_destroy(c->p, cur);
	} else {
		proxy_cursor_checkin(c->p, cur);
		proxy_cursor_answer_id(out, id);
	}
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	return px_reply(c, out);
}

int px_do_kill_cursors(ctx *c)
{
	bson_t ids, *out, killed, notfound, empty;
	bson_iter_t it;
	size_t nk = 0, nn = 0;
	char k[24];

	/* every cursor named must be the caller's and of this namespace, or nothing is killed
	 * (MongoDB: Unauthorized) */
	if (px_get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
		while (bson_iter_next(&it)) {
			int64_t id = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
			if (proxy_cursor_check(c->p, id, c->ns, c->user) != PROXY_CURSOR_OK) {
				return px_error(c, WIRE_ERR_UNAUTHORIZED,
						"not authorized to kill cursor %lld on %s",
						(long long)id, c->ns);
			}
		}
	}
	out = bson_new();

	bson_append_array_begin(out, "cursorsKilled", -1, &killed);
	if (px_get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
		while (bson_iter_next(&it)) {
			int64_t id = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
			proxy_cursor *cur = proxy_cursor_checkout(c->p, id, NULL);
			bool gone = cur != NULL;
			if (cur)
				proxy_cursor_destroy(c->p, cur);
			else /* in use by a running getMore: killed when it ends (as mongod) */
				gone = proxy_cursor_kill(c->p, id);
			if (gone) {
				snprintf(k, sizeof k, "%zu", nk++);
				BSON_APPEND_INT64(&killed, k, id);
			}
		}
	}
	bson_append_array_end(out, &killed);
	bson_append_array_begin(out, "cursorsNotFound", -1, &notfound);
	if (px_get_array(c->cmd, "cursors", &ids) && bson_iter_init(&it, &ids)) {
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
	return px_reply(c, out);
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
int px_collect_owned(ctx *c, route_coll *rc, size_t ci, const bson_t *q, const bson_t *sort,
			 const bson_t *coll_from, int64_t limit, bson_t *ids, bson_t *docs, size_t *n, bson_t *err_reply,
			 char *nerr, size_t nelen)
{
	route_chunk *ch = &rc->chunks[ci];
	pstream *s = sdb_calloc_bson(1, sizeof *s);
	bson_t cmd = BSON_INITIALIZER, proj = BSON_INITIALIZER, reply;
	proxy_cursor *cur;
	int cls, code = 0;
	char err[512], k[24];

	px_stream_init(s, ch->shard, c->db, c->coll);
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
	px_append_let(c, &cmd); /* q may read the client's let */
	px_append_collation(coll_from, &cmd); /* and match under the client's collation */
	px_append_version(&cmd, ch);
	cls = px_run_on(c, ch->shard, &cmd, &s->server_id, &reply, nerr, nelen);
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
		const bson_t *d;
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
	}
	proxy_cursor_destroy(c->p, cur);
	return cls;
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
	bool per_shard; /* one count/distinct for the shard of chunk ci (shardver.c) */
	bool nometa;    /* ... refused: the shard has no filtering metadata */
	int cls;
	bson_t err_reply;
	char nerr[256];
} agg_chunk;

/* count or distinct of a whole shard, gated by its shard version (the shard drops orphans). */
static void count_shard(agg_chunk *a)
{
	const char *shard = a->rc->chunks[a->ci].shard;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;

	if (a->distinct_key) {
		BSON_APPEND_UTF8(&cmd, "distinct", a->c->coll);
		BSON_APPEND_UTF8(&cmd, "key", a->distinct_key);
	} else {
		BSON_APPEND_UTF8(&cmd, "count", a->c->coll);
	}
	if (a->q && !bson_empty(a->q))
		BSON_APPEND_DOCUMENT(&cmd, "query", a->q);
	if (bson_iter_init_find(&it, a->c->cmd, "hint"))
		bson_append_iter(&cmd, "hint", -1, &it);
	if (bson_iter_init_find(&it, a->c->cmd, "maxTimeMS"))
		bson_append_iter(&cmd, "maxTimeMS", -1, &it);
	if (bson_iter_init_find(&it, a->c->cmd, "readConcern")) /* afterClusterTime */
		bson_append_iter(&cmd, "readConcern", -1, &it);
	px_append_collation(a->c->cmd, &cmd); /* the shard counts and dedups under it */
	px_append_shard_version(&cmd, a->rc, shard);
	a->cls = px_run_on(a->c, shard, &cmd, NULL, &reply, a->nerr, sizeof a->nerr);
	if (a->cls == SHARDCONN_OK) {
		if (a->distinct_key) {
			if (bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &arr))
				while (bson_iter_next(&arr))
					merge_distinct_add_value(a->vals, bson_iter_value(&arr));
		} else {
			a->count = px_get_int(&reply, "n", 0);
		}
	} else {
		bson_copy_to(&reply, &a->err_reply);
		if (a->cls == SHARDCONN_STALE)
			a->nometa = px_shard_mode_note(a->rc, shard, &reply);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

static void count_one(void *arg, size_t i)
{
	agg_chunk *a = &((agg_chunk *)arg)[i];
	bson_t docs = BSON_INITIALIZER, ids = BSON_INITIALIZER;
	size_t n = 0;

	if (a->per_shard) {
		count_shard(a);
		return;
	}
	if (a->distinct_key) {
		bson_iter_t it;
		a->cls = px_collect_owned(a->c, a->rc, a->ci, a->q, NULL, a->c->cmd, 0, NULL, &docs, &n,
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
		a->cls = px_collect_owned(a->c, a->rc, a->ci, a->q, NULL, a->c->cmd, 0, &ids, NULL, &n,
				       &a->err_reply, a->nerr, sizeof a->nerr);
		a->count = (int64_t)n;
	}
	bson_destroy(&docs);
	bson_destroy(&ids);
}

/* count_or_distinct's operation. */
typedef struct cd_op {
	const bson_t *q;
	const char *distinct_key; /* NULL: count */
	bool redone; /* an attempt was run again for a shard without filtering metadata */
} cd_op;

/* One attempt: a gated collect per targeted chunk, in parallel; the answer once all
 * succeeded. */
static int cd_execute(px_retry *r, void *arg)
{
	cd_op *o = arg;
	ctx *c = r->c;
	route_coll *rc = r->rc;
	bool exact;
	size_t nsel, i, k = 0;
	bool *sel = px_target(rc, o->q, c->cmd, &nsel, &exact);
	/* one entry per request sent (one per shard in shard mode), not per chunk */
	px_mode_memo *memo = sdb_calloc(1, sizeof *memo);
	size_t nreq = px_stream_bound(memo, rc, sel, c->tx != NULL);
	agg_chunk *a = sdb_calloc_bson(nreq ? nreq : 1, sizeof *a);
	int64_t total = 0;
	int cls = SHARDCONN_OK;
	size_t bad = 0;
	bool again = false;

	for (i = 0; i < rc->nchunks; i++) {
		size_t j;
		ssize_t slot;
		if (!sel[i])
			continue;
		/* per-chunk in a transaction, as above; a[k] is written only once the chunk
		 * gets a request (a has one entry per request) */
		bool per_shard = c->tx == NULL && px_shard_mode_memo(memo, rc, i, &slot);
		if (per_shard) {
			if (slot >= 0 && memo->stream[slot] >= 0)
				continue; /* this shard's request is there already */
			for (j = 0; slot < 0 && j < k; j++)
				if (a[j].per_shard &&
				    strcmp(rc->chunks[a[j].ci].shard, rc->chunks[i].shard) == 0)
					break;
			if (slot < 0 && j < k)
				continue;
			if (slot >= 0)
				memo->stream[slot] = (ssize_t)k;
		}
		a[k].per_shard = per_shard;
		a[k].c = c;
		a[k].rc = rc;
		a[k].ci = i;
		a[k].q = o->q;
		a[k].distinct_key = o->distinct_key;
		a[k].vals = o->distinct_key ? merge_distinct_new() : NULL;
		bson_init(&a[k].err_reply);
		k++;
	}
	px_fanout(c, k, count_one, a);
	if (!o->redone) {
		/* a shard without filtering metadata (now remembered): the retry loop runs the
		 * attempt again at once, per chunk for that shard (PX_RETRY_AGAIN) */
		bool redo = false, other = false;
		for (i = 0; i < k; i++) {
			if (a[i].cls == SHARDCONN_STALE && a[i].nometa)
				redo = true;
			else if (a[i].cls != SHARDCONN_OK)
				other = true;
		}
		again = o->redone = redo && !other;
	}
	for (i = 0; i < k && !again; i++) {
		if (a[i].cls != SHARDCONN_OK && (cls == SHARDCONN_OK || a[i].cls == SHARDCONN_STALE)) {
			cls = a[i].cls;
			bad = i;
		}
		total += a[i].count;
	}
	if (again) {
		; /* nothing answered: the next attempt does */
	} else if (cls == SHARDCONN_OK) {
		bson_t *out = bson_new();
		if (o->distinct_key) {
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
								      px_get_int(c->cmd, "skip", 0),
								      px_get_int(c->cmd, "limit", 0)));
		}
		BSON_APPEND_DOUBLE(out, "ok", 1.0);
		r->status = px_reply(c, out);
	} else if (cls == SHARDCONN_STALE) {
		px_failure_set(&r->last, cls, &a[bad].err_reply, a[bad].nerr);
	} else {
		r->status = px_reply_shard_error(c, cls, &a[bad].err_reply, a[bad].nerr);
	}
	for (i = 0; i < k; i++) {
		bson_destroy(&a[i].err_reply);
		merge_distinct_free(a[i].vals);
	}
	free(a);
	free(sel);
	free(memo);
	if (again)
		return PX_RETRY_AGAIN;
	return cls == SHARDCONN_STALE ? PX_RETRY_STALE : PX_RETRY_DONE;
}

/* Run count (distinct_key NULL) or distinct over the chunks q targets. Returns: the status
 * of the answer. */
static int count_or_distinct(ctx *c, const bson_t *q, const char *distinct_key)
{
	route_coll *rc;
	cd_op o = {q, distinct_key};
	px_retry r;
	int st;

	if ((st = px_route_or_fail(c, &rc)) != 0)
		return st;
	if ((st = px_refuse_js(c, q)) != 0) {
		route_coll_unref(rc);
		return st;
	}
	if (rc->nkeys == 0) {
		route_coll_unref(rc);
		return px_forward_primary(c);
	}
	px_retry_init(&r, c, rc, cd_execute, NULL, &o);
	px_retry_run(&r);
	px_retry_done(&r);
	return r.status; /* answered by cd_execute or px_retry_run */
}

int px_do_count(ctx *c)
{
	bson_t q;
	int64_t v;
	int st;

	/* count_request.cpp: skip >= 0; limit any int64 but the minimum (-n means n) */
	if ((st = px_client_int(c, "skip", 0, INT64_MAX, 0, &v)) != 0)
		return st;
	if (sdb_bson_find_int64(c->cmd, "limit", INT64_MIN, INT64_MAX, 0, &v, NULL) == 0 &&
	    v == INT64_MIN)
		return px_error(c, WIRE_ERR_BAD_VALUE, "limit value for count cannot be min long");
	if ((st = px_client_int(c, "limit", INT64_MIN, INT64_MAX, 0, &v)) != 0)
		return st;
	if (!px_get_doc(c->cmd, "query", &q))
		bson_init(&q);
	return count_or_distinct(c, &q, NULL);
}

int px_do_distinct(ctx *c)
{
	bson_t q;
	bson_iter_t it;

	if (!px_get_doc(c->cmd, "query", &q))
		bson_init(&q);
	if (!bson_iter_init_find(&it, c->cmd, "key") || !BSON_ITER_HOLDS_UTF8(&it))
		return px_error(c, WIRE_ERR_BAD_VALUE, "distinct needs a key string");
	return count_or_distinct(c, &q, bson_iter_utf8(&it, NULL));
}

/* ---------- aggregate ---------- */

typedef struct agg_in {
	proxy *p;
	proxy_cursor *cur;
} agg_in;

/* The pipeline's input: the cursor's next document, valid until the next call (the
 * contract of sdb_pipeline_next_fn and of proxy_cursor_next alike). */
static int agg_next(void *arg, const bson_t **doc, int *code, char *err, size_t errlen)
{
	agg_in *in = arg;

	return proxy_cursor_next(in->p, in->cur, doc, code, err, errlen);
}

int px_agg_args(ctx *c, bson_t *pipeline, int64_t *batch)
{
	bson_t cursor_opts;

	if (!px_get_array(c->cmd, "pipeline", pipeline))
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE, "aggregate needs a pipeline array");
	*batch = 101;
	if (px_get_doc(c->cmd, "cursor", &cursor_opts))
		*batch = px_get_int(&cursor_opts, "batchSize", 101);
	return 0;
}

typedef struct arr_in {
	bson_t **docs;
	size_t n, pos;
} arr_in;

static int arr_next(void *arg, const bson_t **doc, int *code, char *err, size_t errlen)
{
	arr_in *in = arg;

	(void)code;
	(void)err;
	(void)errlen;
	if (in->pos >= in->n)
		return 0;
	*doc = in->docs[in->pos++];
	return 1;
}

/* Run pl over next/arg to its end and hold its output as one proxy stream (a materialised
 * cursor for px_answer_cursor). Returns the stream (the caller's), or NULL with *code and
 * err set when the pipeline failed (nothing held then). */
static pstream *run_to_stream(const sdb_pipeline *pl, sdb_pipeline_next_fn next, void *arg,
			      int *code, char *err, size_t errlen)
{
	sdb_pipeline_cursor *pc = NULL;
	pstream *out = sdb_calloc_bson(1, sizeof *out);
	bson_t arr = BSON_INITIALIZER;
	uint32_t k = 0;
	int r;

	out->chunk = -1;
	bson_init(&out->err_reply);
	sdb_pipeline_open(pl, next, arg, &pc);
	for (;;) {
		const bson_t *d;
		r = sdb_pipeline_cursor_next(pc, &d, code, err, errlen);
		if (r <= 0)
			break;
		if (!pstream_docs_append(&arr, k++, d)) {
			*code = WIRE_ERR_BSON_TOO_LARGE;
			/* libbson grows a document 2x by 2x, up to INT32_MAX: past 1 GiB */
			snprintf(err, errlen, "aggregate output too large for the proxy to hold "
					      "(over 1 GiB after %u documents)",
				 (unsigned)(k - 1));
			r = -1;
			break;
		}
	}
	sdb_pipeline_cursor_free(pc);
	if (r < 0) {
		bson_destroy(&arr);
		pstream_clear(out);
		bson_destroy(&out->err_reply);
		free(out);
		return NULL;
	}
	pstream_take_docs(out, &arr);
	bson_destroy(&arr);
	return out;
}

/* The pipeline pl (its leading part pd removed) over an unsharded collection c->coll whose
 * pipeline reads a sharded foreign collection: the input is pd's filter/sort/skip/limit run
 * on the primary shard (px_sub_aggregate), the rest runs here; answers c with the cursor.
 * Returns: the answer's status. */
/* Run pl (still the caller's) over in's documents, which it frees, and answer the output
 * as a cursor of batch documents in its first batch. Returns: the answer's status. */
static int answer_docs(ctx *c, const sdb_pipeline *pl, arr_in *in, int64_t batch)
{
	int code = 0;
	char err[512];
	pstream *out_s = run_to_stream(pl, arr_next, in, &code, err, sizeof err);

	for (size_t i = 0; i < in->n; i++)
		bson_destroy(in->docs[i]);
	free(in->docs);
	if (out_s == NULL)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	return px_answer_cursor(c, proxy_cursor_new(c->p, c->ns, out_s, 1, NULL, NULL, 0, 0),
				batch, false, "firstBatch", c->ns);
}

static int unsharded_input(ctx *c, const sdb_pipeline_pushdown_t *pd, sdb_pipeline *pl,
			   int64_t batch)
{
	bson_t pre = BSON_INITIALIZER, sp;
	uint32_t k = 0;
	char key[16];
	const char *kp;
	arr_in in = {0};
	int code = 0, r;
	char err[512];

	bson_uint32_to_string(k++, &kp, key, sizeof key);
	bson_append_document_begin(&pre, kp, -1, &sp);
	BSON_APPEND_DOCUMENT(&sp, "$match", &pd->filter);
	bson_append_document_end(&pre, &sp);
	if (!bson_empty(&pd->sort)) {
		bson_uint32_to_string(k++, &kp, key, sizeof key);
		bson_append_document_begin(&pre, kp, -1, &sp);
		BSON_APPEND_DOCUMENT(&sp, "$sort", &pd->sort);
		bson_append_document_end(&pre, &sp);
	}
	if (pd->skip > 0) {
		bson_uint32_to_string(k++, &kp, key, sizeof key);
		bson_append_document_begin(&pre, kp, -1, &sp);
		BSON_APPEND_INT64(&sp, "$skip", pd->skip);
		bson_append_document_end(&pre, &sp);
	}
	if (pd->limit > 0) {
		bson_uint32_to_string(k++, &kp, key, sizeof key);
		bson_append_document_begin(&pre, kp, -1, &sp);
		BSON_APPEND_INT64(&sp, "$limit", pd->limit);
		bson_append_document_end(&pre, &sp);
	}
	{
		bson_t vars;
		int st = px_let(c, &vars);

		if (st != 0) {
			bson_destroy(&pre);
			return st;
		}
		r = px_sub_aggregate(c, c->coll, &pre, &vars, &in.docs, &in.n, &code, err,
				     sizeof err);
		bson_destroy(&vars);
	}
	bson_destroy(&pre);
	if (r != 0)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	return answer_docs(c, pl, &in, batch);
}

/* An aggregate whose first stage is {$collStats: spec} (rest: an iterator on that stage
 * of the pipeline array): the shards' $collStats documents (px_coll_stats_stage_docs),
 * then the later stages run on the proxy over them, as mongos merges them. Returns: the
 * answer's status. */
static int coll_stats_pipeline(ctx *c, const bson_t *spec, bson_iter_t *rest, int64_t batch)
{
	bson_t later = BSON_INITIALIZER, vars;
	sdb_pipeline *pl = NULL;
	arr_in in = {0};
	uint32_t k = 0;
	int code = 0, st = 0;
	char err[512];

	while (bson_iter_next(rest)) {
		char key[16];
		const char *kp;
		bson_uint32_to_string(k++, &kp, key, sizeof key);
		bson_append_iter(&later, kp, -1, rest);
	}
	/* the later stages are checked before any shard is asked */
	if ((st = px_refuse_js(c, &later)) == 0 && (st = px_let(c, &vars)) == 0) {
		sdb_pipeline_opts po = {.let = &vars, .foreign = px_agg_foreign, .foreign_arg = c};

		if (sdb_pipeline_parse(&later, &po, &pl, &code, err, sizeof err) != 0)
			st = px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		bson_destroy(&vars);
	}
	bson_destroy(&later);
	if (st != 0)
		return st;
	if ((st = px_coll_stats_stage_docs(c, spec, &in.docs, &in.n)) != 0 || in.docs == NULL) {
		sdb_pipeline_free(pl);
		return st;
	}
	st = answer_docs(c, pl, &in, batch);
	sdb_pipeline_free(pl);
	return st;
}

/* aggregate with `explain: true` (mongod's legacy form of explain for aggregate): the
 * explain command of the same aggregate at queryPlanner verbosity, as mongod answers it,
 * whatever the collection's routing (it was ignored for a sharded collection: documents
 * came back instead of a plan). Returns: px_do_explain's. */
static int agg_explain(ctx *c)
{
	bson_t wrapper = BSON_INITIALIZER, inner;
	ctx x = *c;
	int st;

	bson_init(&inner);
	bson_copy_to_excluding_noinit(c->cmd, &inner, "explain", NULL);
	BSON_APPEND_DOCUMENT(&wrapper, "explain", &inner);
	BSON_APPEND_UTF8(&wrapper, "verbosity", "queryPlanner");
	x.cmd = &wrapper;
	st = px_do_explain(&x); /* answers on c: x shares c's answer */
	bson_destroy(&inner);
	bson_destroy(&wrapper);
	return st;
}

int px_do_aggregate(ctx *c)
{
	bson_t stages;
	route_coll *rc;
	sdb_pipeline *pl = NULL;
	sdb_pipeline_pushdown_t pd;
	merge_sort *ms = NULL;
	proxy_cursor *in_cur;
	agg_in in;
	pstream *out_s;
	int64_t batch = 101;
	int code = 0, st;
	char err[512];

	{
		bson_iter_t ex;

		if (bson_iter_init_find(&ex, c->cmd, "explain")) {
			if (!BSON_ITER_HOLDS_BOOL(&ex))
				return px_error(c, WIRE_ERR_TYPE_MISMATCH,
						"BSON field 'aggregate.explain' is the wrong type '%s', "
						"expected type 'bool'",
						sdb_bson_type_name(bson_iter_type(&ex)));
			if (bson_iter_bool(&ex))
				return agg_explain(c);
		}
	}
	if ((st = px_agg_args(c, &stages, &batch)) != 0)
		return st;
	if (px_cs_pipeline_kind(&stages) != 0) /* issue #20: changestream.c */
		return px_do_change_stream(c, &stages, batch);
	if ((st = px_refuse_current_op_stage(c, &stages)) != 0)
		return st;
	{
		/* $collStats: answered by the proxy from the shards' collStats (mongos' way) */
		bson_iter_t st, first;
		if (c->coll && bson_iter_init(&st, &stages) && bson_iter_next(&st) &&
		    BSON_ITER_HOLDS_DOCUMENT(&st) && bson_iter_recurse(&st, &first) &&
		    bson_iter_next(&first) && strcmp(bson_iter_key(&first), "$collStats") == 0) {
			bson_t spec;
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&first))
				return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
						"$collStats must take a nested object");
			bson_iter_document(&first, &len, &data);
			if (!bson_init_static(&spec, data, len))
				return px_error(c, WIRE_ERR_INTERNAL, "malformed $collStats");
			return coll_stats_pipeline(c, &spec, &st, batch);
		}
	}
	if ((st = px_refuse_js(c, &stages)) != 0)
		return st;
	{
		/* a last $out / $merge (outmerge.c) */
		sdb_aggw w;
		int wcode = sdb_aggw_parse(&stages, c->db, &w, err, sizeof err);
		if (wcode != 0) {
			sdb_aggw_destroy(&w);
			return px_error(c, wcode, "%s", err);
		}
		if (w.kind != SDB_AGGW_NONE) {
			st = px_agg_write(c, &w, batch);
			sdb_aggw_destroy(&w);
			return st;
		}
		sdb_aggw_destroy(&w);
	}
	/* $unionWith / $lookup / $graphLookup: with every collection unsharded the primary
	 * shard runs the whole pipeline (it reads them in one snapshot); with a sharded foreign collection the
	 * proxy runs the pipeline and reads the foreign side through its routing */
	bool cross, foreign_sharded;
	if ((st = px_agg_placement(c, &stages, &cross, &foreign_sharded)) != 0)
		return st;
	if (c->coll == NULL) {
		if (foreign_sharded)
			return px_error(c, 238 /* NotImplemented */,
					"$unionWith/$lookup/$graphLookup of a sharded collection in an "
					"{aggregate: 1} pipeline is not supported by stripedb");
		return px_forward_primary_cursor(c, batch, false);
	}
	if (foreign_sharded) {
		if ((st = px_route_or_fail(c, &rc)) != 0)
			return st;
	} else if ((st = px_route_sharded(c, PX_FWD_CURSOR, batch, false, &rc)) != 0 ||
		   rc == NULL) {
		return st;
	}
	{
		bson_t vars;

		st = px_let(c, &vars);
		if (st == 0) {
			/* sample_key_in: a leading $sample merges the keys of the shards'
			 * samples (sample_cmd) */
			sdb_pipeline_opts po = {.let = &vars, .foreign = px_agg_foreign,
						.foreign_arg = c, .sample_key_in = true};

			if (sdb_pipeline_parse(&stages, &po, &pl, &code, err, sizeof err) != 0)
				st = px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
			bson_destroy(&vars);
		}
		if (st != 0) {
			route_coll_unref(rc);
			return st;
		}
	}
	sdb_pipeline_pushdown(pl, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT | SDB_PUSHDOWN_LIMIT, &pd);
	if (rc->nkeys == 0) {
		/* an unsharded collection with a sharded foreign one: its pushed-down part runs
		 * on the primary (a sub-aggregate), the rest here */
		route_coll_unref(rc);
		st = unsharded_input(c, &pd, pl, batch);
		sdb_pipeline_pushdown_destroy(&pd);
		sdb_pipeline_free(pl);
		return st;
	}
	if (merge_sort_parse(&pd.sort, &ms, &code, err, sizeof err) != 0) {
		sdb_pipeline_pushdown_destroy(&pd);
		sdb_pipeline_free(pl);
		route_coll_unref(rc);
		return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
	}
	/* a $sample right after the leading $match: each shard samples its documents, the
	 * proxy's $sample keeps the smallest keys of their union */
	int64_t sample = bson_empty(&pd.sort) && pd.skip == 0 && pd.limit < 0
				 ? sdb_pipeline_first_sample(pl)
				 : -1;
	st = open_merged_ex(c, &rc, &pd.filter, &pd.sort, NULL, ms, NULL, pd.skip,
			    pd.limit > 0 ? pd.limit : 0,
			    pd.limit > 0 && pd.skip < 1000 && pd.limit < 1000 - pd.skip
				    ? pd.limit + pd.skip
			    : sample > 0 && sample < 1000 ? sample
							  : 1000,
			    sample, &in_cur);
	route_coll_unref(rc);
	if (st != 0) {
		sdb_pipeline_pushdown_destroy(&pd);
		sdb_pipeline_free(pl);
		return st;
	}
	/* run the rest of the pipeline on the proxy, materialising its output */
	in.p = c->p;
	in.cur = in_cur;
	out_s = run_to_stream(pl, agg_next, &in, &code, err, sizeof err);
	proxy_cursor_destroy(c->p, in_cur);
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_free(pl);
	if (out_s == NULL)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	return px_answer_cursor(c, proxy_cursor_new(c->p, c->ns, out_s, 1, NULL, NULL, 0, 0),
				batch, false, "firstBatch", c->ns);
}

