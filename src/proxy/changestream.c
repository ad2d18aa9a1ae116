/* Change streams through the proxy (issue #20): `watch()` on a collection, a database
 * (`aggregate: 1`) or the deployment (`aggregate: 1` on admin with allChangesForCluster),
 * as mongos 6.0 runs them (src/mongo/s/query/async_results_merger.cpp,
 * document_source_change_stream*.cpp).
 *
 * The proxy opens a `$changeStream` cursor with `$stripedbMerge: true` (no invalidates:
 * the proxy decides them; fullDocument "default": the proxy does updateLookup) on the
 * primary of EVERY shard (a collection's chunks may move anywhere), and merges their
 * events in resume-token order (sdb_cs_token_cmp, /work/cs/CONTRACT.md). The merge rule
 * is the high-water mark of mongos' AsyncResultsMerger: the smallest buffered event X is
 * released only when every shard without a buffered event has a postBatchResumeToken
 * (PBRT) above X; the client's PBRT is the merged position (the last event released, or,
 * once nothing is releasable, the smallest PBRT of all shards: every event at or below it
 * was delivered). A shard whose PBRT holds the merge back while an event waits gets
 * `appendOplogNote {maxClusterTime: <the newest ts any shard reported>}` once per such
 * wait, so its next PBRT passes every buffered event. A stream opened without a start point
 * starts at the newest of the shards' first PBRTs (the floor; lagging shards get a note
 * above it before the client is answered).
 *
 * Per event, when it is released: drop / rename / dropDatabase are reported only from the
 * database's primary shard (every shard that had the collection reports one); then
 * updateLookup (a find by documentKey through the proxy's own routing), the stages after
 * $changeStream ($match, $project, $addFields/$set, $unset, $replaceRoot/$replaceWith, run
 * by the storage pipeline engine), the _id check (280), and the invalidate of a
 * collection stream (drop, rename, dropDatabase) or a database stream (dropDatabase).
 *
 * Failover of a shard under an open stream: its stream is opened again after its last
 * PBRT (transparent to the client); when that fails within the retry budget the client
 * gets the error with the ResumableChangeStreamError label (drivers resume). Shards added
 * later are opened at the merged position (the shard list is compared at every getMore).
 *
 * Waiting (cswait.h): a getMore runs rounds of non-blocking shard getMores on a request
 * worker and parks between them (no worker, no shard connection held) until a shard
 * watcher sees a move that can concern the stream (its namespace), its await ends, its
 * cursor is killed or its client goes; it then runs again with the same await's end
 * (px_cs.park_req / park_deadline). A round asks only the shards that moved for the stream
 * since it last asked them (cs_shard.asked_seq), those whose last batch had events, and,
 * while an event waits, the holdouts the merge rule needs (candidate()).
 *
 * Threading: request worker threads; a cursor is used by one request at a time (checked
 * out of cursor.c's table; checked in while its getMore is parked); fan-out units touch
 * only their own shard entry.
 */
#include "proxy/changestream_int.h"

/* ---------- tokens ---------- */

static bool field_token(const bson_t *d, const char *name, sdb_cs_token *t)
{
	bson_t sub;
	char err[128];

	return px_get_doc(d, name, &sub) && sdb_cs_token_parse(&sub, t, err, sizeof err) == 0;
}


/* ---------- shard calls ---------- */

static void shard_entry_init(cs_shard *s, const char *id, bool added)
{
	memset(s, 0, sizeof *s);
	s->id = sdb_strdup(id);
	s->added = added;
	bson_init(&s->err_reply);
}

static void shard_drop_events(cs_shard *s)
{
	for (size_t i = s->pos; i < s->n; i++)
		proxy_doc_free(s->ev[i]);
	s->n = s->pos = 0;
}

/* Take a shard's cursor reply: the batch (firstBatch or nextBatch) into s's buffer (s is
 * empty: refilled only then), the cursor id, the PBRT. Returns: 0, or SDB_EPROTO when the
 * reply is not a change stream cursor. */
static int take_reply(cs_shard *s, const bson_t *reply, const char *field)
{
	bson_t cur, arr;
	bson_iter_t it;
	sdb_cs_token t;

	if (!px_get_doc(reply, "cursor", &cur) || !px_get_array(&cur, field, &arr))
		return SDB_EPROTO;
	s->cursor_id = px_get_int(&cur, "id", 0);
	shard_drop_events(s);
	if (bson_iter_init(&it, &arr)) {
		while (bson_iter_next(&it)) {
			uint32_t len;
			const uint8_t *data;
			bson_t d;

			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				return SDB_EPROTO;
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&d, data, len) || !field_token(&d, "_id", &t))
				return SDB_EPROTO;
			if (s->n == s->cap) {
				s->cap = s->cap ? s->cap * 2 : 64;
				s->ev = sdb_realloc(s->ev, s->cap * sizeof *s->ev);
				s->tok = sdb_realloc(s->tok, s->cap * sizeof *s->tok);
			}
			s->tok[s->n] = t;
			s->ev[s->n++] = proxy_doc_copy(&d);
		}
	}
	s->more = s->n > 0;
	if (!field_token(&cur, "postBatchResumeToken", &t))
		return SDB_EPROTO;
	if (!s->have_pbrt || sdb_cs_token_cmp(&t, &s->pbrt) > 0)
		s->pbrt = t;
	s->have_pbrt = true;
	s->opened = true;
	return 0;
}

/* Work of one fan-out round (cs_round_one). */
enum { CS_OP_OPEN, CS_OP_GETMORE, CS_OP_NOTE };
typedef struct cs_job {
	proxy *p;
	px_cs *cs;
	size_t *idx;
	int op;
	int64_t await_ms;   /* CS_OP_GETMORE */
	uint64_t note_ts;   /* CS_OP_NOTE */
} cs_job;

static void open_cmd(px_cs *cs, cs_shard *s, bson_t *cmd)
{
	bson_t pl, st, spec, cur;

	if (cs->coll)
		BSON_APPEND_UTF8(cmd, "aggregate", cs->coll);
	else
		BSON_APPEND_INT32(cmd, "aggregate", 1);
	bson_append_array_begin(cmd, "pipeline", -1, &pl);
	bson_append_document_begin(&pl, "0", -1, &st);
	bson_append_document_begin(&st, "$changeStream", -1, &spec);
	bson_concat(&spec, &cs->spec);
	if (s->opened && s->have_pbrt) {
		/* reopened (failover, lost cursor): after what it last told us */
		sdb_cs_token_append(&spec, "resumeAfter", &s->pbrt);
	} else if (s->added && cs->have_pos) {
		/* a shard found after the open: from the merged position */
		sdb_cs_token_append(&spec, "resumeAfter", &cs->pos);
	} else {
		bson_concat(&spec, &cs->start);
	}
	BSON_APPEND_BOOL(&spec, "$stripedbMerge", true);
	/* the id tokens name the shard by: metadata's, the same for every proxy (a shard's
	 * replica set name may be unset or differ) */
	BSON_APPEND_UTF8(&spec, "$stripedbShardId", s->id);
	bson_append_document_end(&st, &spec);
	bson_append_document_end(&pl, &st);
	bson_append_array_end(cmd, &pl);
	bson_append_document_begin(cmd, "cursor", -1, &cur);
	BSON_APPEND_INT32(&cur, "batchSize", CS_SHARD_BATCH);
	bson_append_document_end(cmd, &cur);
}

static void cs_round_one(void *arg, size_t k)
{
	cs_job *j = arg;
	cs_shard *s = &j->cs->sh[j->idx[k]];
	bson_t cmd = BSON_INITIALIZER, reply;
	const char *db = j->cs->db;
	const char *field = "nextBatch";

	switch (j->op) {
	case CS_OP_OPEN:
		open_cmd(j->cs, s, &cmd);
		s->sid = 0;
		field = "firstBatch";
		break;
	case CS_OP_GETMORE:
		BSON_APPEND_INT64(&cmd, "getMore", s->cursor_id);
		BSON_APPEND_UTF8(&cmd, "collection", j->cs->gm_coll);
		BSON_APPEND_INT32(&cmd, "batchSize", CS_SHARD_BATCH);
		BSON_APPEND_INT64(&cmd, "maxTimeMS", j->await_ms > 0 ? j->await_ms : 1);
		break;
	default: {
		bson_t data;
		BSON_APPEND_INT32(&cmd, "appendOplogNote", 1);
		bson_append_document_begin(&cmd, "data", -1, &data);
		BSON_APPEND_UTF8(&data, "msg", "stripedb proxy: change stream merge");
		bson_append_document_end(&cmd, &data);
		BSON_APPEND_TIMESTAMP(&cmd, "maxClusterTime", (uint32_t)(j->note_ts >> 32),
				      (uint32_t)j->note_ts);
		db = "admin";
		break;
	}
	}
	uint32_t nsid = j->op == CS_OP_GETMORE ? s->sid : 0;
	s->status = proxy_shard_command(j->p, s->id, db, &cmd, &nsid, &reply, s->neterr,
					sizeof s->neterr);
	bson_reinit(&s->err_reply);
	if (s->status == SHARDCONN_OK && j->op != CS_OP_NOTE) {
		s->sid = nsid;
		int tr = take_reply(s, &reply, field);
		if (tr == 0 && s->cursor_id == 0)
			s->ended_ms = sdb_mono_ms(); /* the shard closed it: reopened later */
		if (tr != 0) {
			s->status = SHARDCONN_NET_ERR;
			snprintf(s->neterr, sizeof s->neterr,
				 "shard %s: a $changeStream reply without a cursor, an event token or "
				 "a postBatchResumeToken",
				 s->id);
			s->cursor_id = 0;
		}
	} else if (s->status != SHARDCONN_OK) {
		bson_copy_to_excluding_noinit(&reply, &s->err_reply, "$clusterTime",
					      "operationTime", NULL);
		if (j->op == CS_OP_GETMORE)
			s->cursor_id = 0;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* How long past its await a round's shard call may take before the proxy gives up on it
 * (the shard stopped answering without closing its connection: SIGSTOP, a stalled disk):
 * the call fails, that shard's stream is reopened after its PBRT by the next round or the
 * client gets a resumable error, instead of libmongoc's 5-minute socket timeout holding
 * the client's getMore and a worker (mongos answers an await on time the same way). */
#define CS_ROUND_GRACE_MS 10000

static void cs_round(proxy *p, px_cs *cs, size_t *idx, size_t n, int op, int64_t await_ms,
		     uint64_t note_ts)
{
	cs_job j = {p, cs, idx, op, await_ms, note_ts};
	uint64_t prev = shardconn_op_deadline();
	uint64_t dl = sdb_mono_ms() + (uint64_t)(await_ms > 0 ? await_ms : 0) + CS_ROUND_GRACE_MS;

	if (n == 0)
		return;
	if (prev == 0 || dl < prev)
		shardconn_set_op_deadline(dl);
	proxy_shard_fanout(p, n, cs_round_one, &j);
	shardconn_set_op_deadline(prev);
}

static int err_code(const cs_shard *s)
{
	if (s->status == SHARDCONN_NET_ERR)
		return WIRE_ERR_HOST_UNREACHABLE;
	int64_t code = px_get_int(&s->err_reply, "code", WIRE_ERR_INTERNAL);
	return code > 0 && code < INT32_MAX ? (int)code : WIRE_ERR_INTERNAL;
}

static const char *err_msg(const cs_shard *s)
{
	bson_iter_t it;

	if (s->status == SHARDCONN_NET_ERR)
		return s->neterr;
	if (bson_iter_init_find(&it, &s->err_reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return "shard error";
}

/* Errors after which a shard's stream is opened again after its PBRT (a failover, a
 * restart that lost the cursor): MongoDB's resumable change stream errors
 * (ResumableChangeStreamError: the network, not-primary and shutdown family, and
 * CursorNotFound). */
/* Did s's last round hit CS_ROUND_GRACE_MS (the shard took its await and 10 s more without
 * answering: stopped, stalled)? Its stream is then reopened after its PBRT later; until
 * then it holds the merge back and the client gets empty batches, as mongos answers an
 * await on time while a remote request is pending. */
static bool round_timed_out(const cs_shard *s)
{
	return s->status != SHARDCONN_OK && s->status != SHARDCONN_NET_ERR &&
	       err_code(s) == WIRE_ERR_MAX_TIME_EXPIRED;
}

static bool reopenable(const cs_shard *s)
{
	static const int codes[] = {6,	   7,	  89,	 91,	189,   262,   9001,  10107,
				    11600, 11602, 13435, 13436, 63,	150,   13388, 234,
				    133,   43,	  0};

	if (s->status == SHARDCONN_NET_ERR)
		return true;
	int code = err_code(s);
	for (size_t i = 0; codes[i]; i++)
		if (codes[i] == code)
			return true;
	return false;
}

/* Answer the failure of shard s: its error; a resumable one (the shard is unreachable or
 * has no primary after the retry budget) with the ResumableChangeStreamError label, so
 * that the driver opens the stream again after its last token. Returns: the code. */
static int answer_shard_failure(ctx *c, const cs_shard *s)
{
	int code = err_code(s);

	if (reopenable(s)) {
		bson_t *extra = bson_new(), arr;

		bson_append_array_begin(extra, "errorLabels", -1, &arr);
		BSON_APPEND_UTF8(&arr, "0", "ResumableChangeStreamError");
		bson_append_array_end(extra, &arr);
		return px_error_extra(c, code, extra, "change stream on shard %s: %s", s->id,
				      err_msg(s));
	}
	return px_error(c, code, "%s", err_msg(s));
}

/* ---------- the shard set ---------- */

static bool has_shard(const px_cs *cs, const char *id)
{
	for (size_t i = 0; i < cs->nsh; i++)
		if (strcmp(cs->sh[i].id, id) == 0)
			return true;
	return false;
}

/* Compare the shard list with the stream's: new shards are added (opened at the next
 * round, at the merged position), shards no longer listed hold nothing back. */
static void sync_shards(ctx *c, px_cs *cs, bool added)
{
	char **ids = NULL;
	/* at the open: metadata's list (reloaded); later, at every getMore, the list the
	 * refresh thread reloads every second (no metadata call per getMore) */
	size_t n = added && c->p->sc != NULL && c->p->cluster == NULL
			   ? shardconn_shard_ids(c->p->sc, &ids)
			   : px_shard_ids(c, &ids);

	for (size_t i = 0; i < n; i++) {
		if (!has_shard(cs, ids[i])) {
			cs->sh = sdb_realloc(cs->sh, (cs->nsh + 1) * sizeof *cs->sh);
			shard_entry_init(&cs->sh[cs->nsh++], ids[i], added);
			if (added)
				sdb_log(SDB_LOG_INFO, "change stream: new shard, opened at the merged "
						      "position", "shard=%s", ids[i]);
		}
	}
	for (size_t k = 0; k < cs->nsh && n > 0; k++) {
		bool listed = false;
		for (size_t i = 0; i < n; i++)
			if (strcmp(cs->sh[k].id, ids[i]) == 0)
				listed = true;
		cs->sh[k].gone = !listed;
	}
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
}

/* Open every live shard whose cursor is not open (first open, reopen, new shard). A shard
 * added later whose oplog does not reach back to the merged position (286) is opened at
 * its present instead. w non-NULL (a getMore's rounds): a shard its watcher reports stalled
 * is left closed for a later round (it holds the merge back; opened after its PBRT then).
 * Returns: NULL when all opened, else the failed shard. */
static cs_shard *open_closed(proxy *p, px_cs *cs, px_cswait *w)
{
	size_t *idx = sdb_calloc(cs->nsh ? cs->nsh : 1, sizeof *idx), n = 0;
	cs_shard *bad = NULL;

	uint64_t now = sdb_mono_ms();
	for (size_t i = 0; i < cs->nsh; i++)
		if (cs->sh[i].cursor_id == 0 && !cs->sh[i].gone &&
		    (cs->sh[i].ended_ms == 0 || now >= cs->sh[i].ended_ms + 100) &&
		    !px_cswait_stalled(w, cs->sh[i].id))
			idx[n++] = i;
	if (cs->have_pos) {
		/* a shard found after the open is opened after the merged position, which holds
		 * another shard's ts: its writes must come after it, so it gets a note above
		 * it first (its clock may be behind; a reviewer lost a new shard's first five
		 * inserts). A failed note leaves the shard closed: tried again next round. */
		size_t *nidx = sdb_calloc(n ? n : 1, sizeof *nidx), nn = 0;
		for (size_t k = 0; k < n; k++)
			if (cs->sh[idx[k]].added && !cs->sh[idx[k]].opened &&
			    cs->sh[idx[k]].noted_ts < cs->pos.ts)
				nidx[nn++] = idx[k];
		cs_round(p, cs, nidx, nn, CS_OP_NOTE, 0, cs->pos.ts);
		for (size_t k = 0; k < nn; k++) {
			cs_shard *s = &cs->sh[nidx[k]];
			if (s->status == SHARDCONN_OK)
				s->noted_ts = cs->pos.ts;
		}
		size_t m = 0;
		for (size_t k = 0; k < n; k++) {
			cs_shard *s = &cs->sh[idx[k]];
			if (!s->added || s->opened || s->noted_ts >= cs->pos.ts)
				idx[m++] = idx[k];
		}
		n = m;
		free(nidx);
	}
	cs_round(p, cs, idx, n, CS_OP_OPEN, 0, 0);
	for (size_t k = 0; k < n && bad == NULL; k++) {
		cs_shard *s = &cs->sh[idx[k]];
		if (s->status == SHARDCONN_OK) {
			s->asked_seq = s->pbrt_seq = cs->round_seq;
			continue;
		}
		if (s->opened && round_timed_out(s)) {
			s->ended_ms = sdb_mono_ms(); /* a reopen that hung: again later */
			continue;
		}
		if (s->added && !s->opened && err_code(s) == ERR_CS_HISTORY_LOST) {
			size_t one = idx[k];
			bool had = cs->have_pos;
			cs->have_pos = false; /* open_cmd: no resume field */
			bson_t keep = cs->start;
			bson_init(&cs->start);
			cs_round(p, cs, &one, 1, CS_OP_OPEN, 0, 0);
			bson_destroy(&cs->start);
			cs->start = keep;
			cs->have_pos = had;
			if (s->status == SHARDCONN_OK) {
				s->asked_seq = s->pbrt_seq = cs->round_seq;
				continue;
			}
		}
		bad = s;
	}
	free(idx);
	return bad;
}

/* ---------- the merge ---------- */

/* The shard whose next buffered event is the smallest, or -1. */
static ssize_t min_head(const px_cs *cs)
{
	ssize_t best = -1;

	for (size_t i = 0; i < cs->nsh; i++) {
		const cs_shard *s = &cs->sh[i];
		if (s->pos < s->n &&
		    (best < 0 || sdb_cs_token_cmp(&s->tok[s->pos],
						  &cs->sh[best].tok[cs->sh[best].pos]) < 0))
			best = (ssize_t)i;
	}
	return best;
}

/* May the event with token x (the smallest buffered) be released? Every live shard
 * without buffered events must have promised, by its PBRT, that it has nothing below. */
static bool releasable(const px_cs *cs, const sdb_cs_token *x)
{
	for (size_t i = 0; i < cs->nsh; i++) {
		const cs_shard *s = &cs->sh[i];
		if (s->gone || s->pos < s->n)
			continue;
		if (!s->have_pbrt || sdb_cs_token_cmp(&s->pbrt, x) <= 0)
			return false;
	}
	return true;
}

/* With nothing releasable: the smallest PBRT of the live shards becomes the position
 * (when above it): every event at or below it was delivered. */
static void advance_to_hwm(px_cs *cs)
{
	const sdb_cs_token *m = NULL;

	for (size_t i = 0; i < cs->nsh; i++) {
		const cs_shard *s = &cs->sh[i];
		if (s->gone)
			continue;
		if (!s->have_pbrt)
			return;
		if (m == NULL || sdb_cs_token_cmp(&s->pbrt, m) < 0)
			m = &s->pbrt;
	}
	if (m != NULL && (!cs->have_pos || sdb_cs_token_cmp(m, &cs->pos) > 0)) {
		cs->pos = *m;
		cs->have_pos = true;
	}
}

/* ---------- per event ---------- */

static bool str_field(const bson_t *d, const char *path, const char **out)
{
	bson_iter_t it, f;

	if (!bson_iter_init(&it, d) || !bson_iter_find_descendant(&it, path, &f) ||
	    !BSON_ITER_HOLDS_UTF8(&f))
		return false;
	*out = bson_iter_utf8(&f, NULL);
	return true;
}

/* The current document for an update event's documentKey through the proxy's routing
 * (MongoDB's updateLookup: null when it is gone). Returns: 0 with *out (heap, or NULL for
 * none), else the code of the error answered on c. */
static int lookup_doc(ctx *c, const bson_t *ev, bson_t **out)
{
	const char *db, *coll;
	bson_t key, stages = BSON_INITIALIZER, st;
	bson_t **docs = NULL;
	size_t n = 0;
	int code = 0, rc;
	char err[512];
	ctx sub;

	*out = NULL;
	if (!str_field(ev, "ns.db", &db) || !str_field(ev, "ns.coll", &coll) ||
	    !px_get_doc(ev, "documentKey", &key))
		return 0;
	sub = *c;
	sub.db = db;
	sub.tx = NULL;
	sub.rp_data = NULL;
	bson_append_document_begin(&stages, "0", -1, &st);
	BSON_APPEND_DOCUMENT(&st, "$match", &key);
	bson_append_document_end(&stages, &st);
	bson_append_document_begin(&stages, "1", -1, &st);
	BSON_APPEND_INT32(&st, "$limit", 1);
	bson_append_document_end(&stages, &st);
	rc = px_sub_aggregate(&sub, coll, &stages, NULL, &docs, &n, &code, err, sizeof err);
	bson_destroy(&stages);
	if (rc != 0)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "updateLookup: %s", err);
	if (n > 0)
		*out = proxy_doc_copy(docs[0]);
	for (size_t i = 0; i < n; i++)
		bson_destroy(docs[i]);
	free(docs);
	return 0;
}

/* ev with fullDocument set to doc (NULL: null), in MongoDB's field order (before ns). */
static bson_t *with_full_document(const bson_t *ev, const bson_t *doc)
{
	bson_t *out = proxy_doc_new();
	bson_iter_t it;
	bool put = false;

	if (bson_iter_init(&it, ev)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "fullDocument") == 0)
				continue;
			if (!put && (strcmp(k, "ns") == 0 || strcmp(k, "documentKey") == 0 ||
				     strcmp(k, "updateDescription") == 0)) {
				if (doc)
					BSON_APPEND_DOCUMENT(out, "fullDocument", doc);
				else
					BSON_APPEND_NULL(out, "fullDocument");
				put = true;
			}
			bson_append_iter(out, k, -1, &it);
		}
	}
	if (!put) {
		if (doc)
			BSON_APPEND_DOCUMENT(out, "fullDocument", doc);
		else
			BSON_APPEND_NULL(out, "fullDocument");
	}
	return out;
}

/* The client's stages over ev into *out (heap; NULL when filtered out). Returns: 0, or
 * the code of the error answered on c (a stage's, or 280 for a changed _id). */
static int run_stages(ctx *c, px_cs *cs, const bson_t *ev, bson_t **out)
{
	bson_t *r = NULL;
	int code = 0, rc;
	char err[1024];

	*out = NULL;
	if (cs->pl == NULL) {
		*out = proxy_doc_copy(ev);
		return 0;
	}
	rc = sdb_pipeline_run_one(cs->pl, ev, &r, &code, err, sizeof err);
	if (rc < 0)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	if (rc == 0)
		return 0;
	if (sdb_cs_check_id(ev, r, err, sizeof err) != 0) {
		bson_destroy(r);
		return px_error(c, ERR_CS_FATAL, "%s", err);
	}
	*out = proxy_doc_copy(r);
	bson_destroy(r);
	return 0;
}

/* The invalidate event that follows ev (its token with kind INVALIDATE). */
static bson_t *invalidate_event(const bson_t *ev, const sdb_cs_token *t)
{
	bson_t *inv = proxy_doc_new();
	sdb_cs_token it = *t;
	bson_iter_t f;

	it.kind = SDB_CS_INVALIDATE;
	sdb_cs_token_append(inv, "_id", &it);
	BSON_APPEND_UTF8(inv, "operationType", "invalidate");
	if (bson_iter_init_find(&f, ev, "clusterTime"))
		bson_append_iter(inv, "clusterTime", -1, &f);
	if (bson_iter_init_find(&f, ev, "wallTime"))
		bson_append_iter(inv, "wallTime", -1, &f);
	return inv;
}

/* Append doc to the batch arr (k documents so far, *bytes). */
static void batch_add(bson_t *arr, size_t *k, size_t *bytes, const bson_t *doc)
{
	char key[24];

	snprintf(key, sizeof key, "%zu", (*k)++);
	BSON_APPEND_DOCUMENT(arr, key, doc);
	*bytes += proxy_bson_len(doc);
}

/* Release one event (the smallest, already taken out of its shard's buffer, ev owned):
 * the DDL dedup, updateLookup, the client's stages, the invalidate. The position moves to
 * its token whatever the stages keep. Returns: 0, or the code of the error answered. */
static int emit(ctx *c, px_cs *cs, bson_t *ev, const sdb_cs_token *t, bson_t *arr, size_t *k,
		size_t *bytes)
{
	const char *op = "", *db = NULL, *coll = NULL;
	bson_t *cur = ev, *out = NULL;
	int st = 0;

	cs->pos = *t;
	cs->have_pos = true;
	str_field(ev, "operationType", &op);
	str_field(ev, "ns.db", &db);
	str_field(ev, "ns.coll", &coll);
	bool ddl = strcmp(op, "drop") == 0 || strcmp(op, "rename") == 0 ||
		   strcmp(op, "dropDatabase") == 0;
	if (ddl && db != NULL) {
		/* each shard that had the collection reports it: the database's primary
		 * shard's copy stands for all (resume-stable: the same copy every time) */
		char *prim = proxy_db_primary(c->p, db);
		if (prim == NULL)
			prim = proxy_primary(c->p);
		bool mine = prim == NULL || strcmp(prim, t->shard) == 0;
		free(prim);
		if (!mine) {
			proxy_doc_free(ev);
			return 0;
		}
	}
	if (cs->update_lookup && strcmp(op, "update") == 0) {
		bson_t *doc = NULL;
		if ((st = lookup_doc(c, ev, &doc)) != 0) {
			proxy_doc_free(ev);
			return st;
		}
		cur = with_full_document(ev, doc);
		proxy_doc_free(doc);
	}
	st = run_stages(c, cs, cur, &out);
	if (st == 0 && out != NULL)
		batch_add(arr, k, bytes, out);
	proxy_doc_free(out);
	if (st == 0 && ddl) {
		bool inv = false;
		if (cs->level == CS_COLL)
			inv = strcmp(op, "dropDatabase") == 0 ||
			      (coll != NULL && strcmp(coll, cs->coll) == 0);
		else if (cs->level == CS_DB)
			inv = strcmp(op, "dropDatabase") == 0;
		if (inv) {
			bson_t *ie = invalidate_event(ev, t), *io = NULL;
			st = run_stages(c, cs, ie, &io);
			if (st == 0 && io != NULL)
				batch_add(arr, k, bytes, io);
			proxy_doc_free(io);
			cs->pos.kind = SDB_CS_INVALIDATE;
			cs->invalidated = true;
			proxy_doc_free(ie);
		}
	}
	if (cur != ev)
		proxy_doc_free(cur);
	proxy_doc_free(ev);
	return st;
}

/* Release every releasable event into arr (at most batch events, ~8 MiB), then move the
 * position to the shards' high-water mark when nothing more is releasable. Returns: 0, or
 * the code of the error answered on c. */
static int release(ctx *c, px_cs *cs, bson_t *arr, size_t *k, size_t *bytes, int64_t batch)
{
	for (;;) {
		if (cs->invalidated)
			return 0;
		ssize_t h = min_head(cs);
		if (h < 0 || !releasable(cs, &cs->sh[h].tok[cs->sh[h].pos]))
			break;
		if ((batch >= 0 && (int64_t)*k >= batch) || *bytes >= CS_MAX_BATCH_BYTES)
			return 0; /* full with more to release: the position is the last event */
		cs_shard *s = &cs->sh[h];
		sdb_cs_token t = s->tok[s->pos];
		bson_t *ev = s->ev[s->pos++];
		if (cs->have_floor && sdb_cs_token_cmp(&t, &cs->floor) <= 0) {
			proxy_doc_free(ev); /* before the stream's start */
			continue;
		}
		int st = emit(c, cs, ev, &t, arr, k, bytes);
		if (st != 0)
			return st;
	}
	advance_to_hwm(cs);
	return 0;
}

/* One wait for more: reopen closed streams, note the holdouts of a waiting event, then a
 * getMore on every live shard without buffered events that could hold something back.
 * Returns: 0, or the code of the error answered on c. */
/* Which shards a round asks (fetch's mode): every one without a buffered event (a getMore
 * that waits on its worker, the old way: no watcher), or, for a getMore that parks, only
 * those that moved for the stream since they were last asked (cswait.h), or those that
 * moved at all (at an await's end: the client's position moves on). */
enum { CS_ASK_ALL, CS_ASK_MOVED, CS_ASK_REFRESH };

/* How long an idle stream's position may stay behind writes elsewhere: at an await's end,
 * a stream whose last round is older and whose shards moved (for other streams) asks
 * them, so the client's postBatchResumeToken moves on (bounded resume work). */
#define CS_POS_REFRESH_MS 5000

static void cs_filter(const px_cs *cs, px_cswait_filter *f)
{
	f->level = cs->level == CS_COLL ? PX_CSWAIT_COLL
		   : cs->level == CS_DB ? PX_CSWAIT_DB
					: PX_CSWAIT_CLUSTER;
	f->db = cs->db;
	f->coll = cs->coll;
}

/* Is shard i one a getMore round may ask now (h: min_head)? Returns: 0 no (gone, events
 * buffered, closed: open_closed's, stalled, or above the waiting event); 1 a holdout (an
 * event waits for its position: asked every round); 2 asked when it moved. */
static int candidate(const px_cs *cs, px_cswait *w, size_t i, ssize_t h)
{
	const cs_shard *s = &cs->sh[i];

	if (s->gone || s->pos < s->n || s->cursor_id == 0 || px_cswait_stalled(w, s->id))
		return 0;
	if (h >= 0)
		return s->have_pbrt && sdb_cs_token_cmp(&s->pbrt, &cs->sh[h].tok[cs->sh[h].pos]) > 0
			       ? 0
			       : 1;
	return 2;
}

/* Did shard s move for cs since it was last asked (any: in any way since its PBRT was last
 * taken)? A shard whose last batch had events, or without a position, counts as moved. */
static bool shard_moved(const px_cs *cs, px_cswait *w, const cs_shard *s, bool any)
{
	px_cswait_filter f;

	cs_filter(cs, &f);
	if (s->more || !s->have_pbrt)
		return true;
	return any ? px_cswait_moved(w, NULL, s->id, s->pbrt_seq)
		   : px_cswait_moved(w, &f, s->id, s->asked_seq);
}

static int fetch(ctx *c, px_cs *cs, int64_t await_ms, int mode)
{
	proxy *p = c->p;
	size_t *idx = sdb_calloc(cs->nsh ? cs->nsh : 1, sizeof *idx), n = 0;
	cs_shard *bad;
	ssize_t h;
	int st = 0;

	cs->round_seq = px_cswait_seq(p->csw); /* before the round: a move during it is seen */
	cs->round_ms = sdb_mono_ms();
	if ((bad = open_closed(p, cs, p->csw)) != NULL) {
		st = answer_shard_failure(c, bad);
		goto out;
	}
	h = min_head(cs);
	if (h >= 0) {
		/* an event waits: the shards whose PBRT is below it get a note above its ts */
		const sdb_cs_token *x = &cs->sh[h].tok[cs->sh[h].pos];
		/* the note goes above the newest ts any shard reported (not only x's), so
		 * that one round releases every buffered event, not one */
		uint64_t top = x->ts;
		for (size_t i = 0; i < cs->nsh; i++) {
			const cs_shard *s = &cs->sh[i];
			if (s->have_pbrt && s->pbrt.ts > top)
				top = s->pbrt.ts;
			if (s->pos < s->n && s->tok[s->n - 1].ts > top)
				top = s->tok[s->n - 1].ts;
		}
		for (size_t i = 0; i < cs->nsh; i++) {
			cs_shard *s = &cs->sh[i];
			if (!s->gone && s->pos == s->n && s->cursor_id != 0 && s->noted_ts < x->ts &&
			    (!s->have_pbrt || sdb_cs_token_cmp(&s->pbrt, x) <= 0) &&
			    !px_cswait_stalled(p->csw, s->id))
				idx[n++] = i;
		}
		cs_round(p, cs, idx, n, CS_OP_NOTE, 0, top);
		for (size_t k = 0; k < n; k++) {
			cs_shard *s = &cs->sh[idx[k]];
			if (s->status == SHARDCONN_OK)
				s->noted_ts = top; /* a failed note is sent again next round */
			else
				sdb_debug("change stream: appendOplogNote failed", "shard=%s err=%s",
					  s->id, err_msg(s));
		}
		if (await_ms > CS_NOTE_AWAIT_MS)
			await_ms = CS_NOTE_AWAIT_MS;
	}
	n = 0;
	for (size_t i = 0; i < cs->nsh; i++) {
		cs_shard *s = &cs->sh[i];
		/* not: events buffered, closed, stopped answering (cswait.h: holds the merge
		 * back), above the waiting event (holds nothing back) */
		int cand = candidate(cs, p->csw, i, h);
		if (cand == 0)
			continue;
		if (cand == 2 && mode != CS_ASK_ALL &&
		    !shard_moved(cs, p->csw, s, mode == CS_ASK_REFRESH)) {
			s->asked_seq = cs->round_seq; /* nothing for this stream up to there */
			continue;
		}
		idx[n++] = i;
	}
	if (n == 0 && await_ms > 0) /* nothing to ask (every holdout stalled): not a spin */
		uv_sleep(10);
	cs_round(p, cs, idx, n, CS_OP_GETMORE, await_ms, 0);
	for (size_t k = 0; k < n; k++) {
		cs_shard *s = &cs->sh[idx[k]];
		if (s->status == SHARDCONN_OK) {
			s->asked_seq = s->pbrt_seq = cs->round_seq;
			continue;
		}
		if (round_timed_out(s)) {
			/* reopened after its PBRT by a later round, not now (it would wait again) */
			s->cursor_id = 0;
			s->ended_ms = sdb_mono_ms();
			continue;
		}
		if (!reopenable(s)) {
			st = answer_shard_failure(c, s);
			goto out;
		}
		/* failover or lost cursor: open it again after its last PBRT, now */
		sdb_log(SDB_LOG_INFO, "change stream: shard stream reopened", "shard=%s code=%d",
			s->id, err_code(s));
		s->cursor_id = 0;
	}
	if ((bad = open_closed(p, cs, p->csw)) != NULL)
		st = answer_shard_failure(c, bad);
out:
	free(idx);
	return st;
}

/* Answer c with one batch of cursor id (0 = closed) of ns. */
static int answer_batch(ctx *c, px_cs *cs, int64_t id, const char *ns, const char *field,
			bson_t *arr)
{
	bson_t *out = bson_new(), cd;

	bson_append_document_begin(out, "cursor", -1, &cd);
	BSON_APPEND_INT64(&cd, "id", id);
	BSON_APPEND_UTF8(&cd, "ns", ns);
	bson_append_array(&cd, field, -1, arr);
	if (cs->have_pos)
		sdb_cs_token_append(&cd, "postBatchResumeToken", &cs->pos);
	bson_append_document_end(out, &cd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	return px_reply(c, out);
}

/* ---------- lifecycle ---------- */

void px_cs_free(proxy *p, px_cs *cs)
{
	size_t *idx, n = 0;

	if (cs == NULL)
		return;
	if (cs->park_req != NULL && p->csw != NULL)
		px_cswait_wake_req(p->csw, cs->park_req); /* killed while parked: answer now */
	idx = sdb_calloc(cs->nsh ? cs->nsh : 1, sizeof *idx);
	for (size_t i = 0; i < cs->nsh; i++)
		if (cs->sh[i].cursor_id != 0)
			idx[n++] = i;
	if (n > 0) {
		/* killCursors on each shard still open */
		for (size_t k = 0; k < n; k++) {
			cs_shard *s = &cs->sh[idx[k]];
			bson_t cmd = BSON_INITIALIZER, reply, arr;
			char err[128];

			BSON_APPEND_UTF8(&cmd, "killCursors", cs->gm_coll);
			bson_append_array_begin(&cmd, "cursors", -1, &arr);
			BSON_APPEND_INT64(&arr, "0", s->cursor_id);
			bson_append_array_end(&cmd, &arr);
			proxy_shard_command(p, s->id, cs->db, &cmd, &s->sid, &reply, err, sizeof err);
			bson_destroy(&reply);
			bson_destroy(&cmd);
		}
	}
	free(idx);
	for (size_t i = 0; i < cs->nsh; i++) {
		cs_shard *s = &cs->sh[i];
		shard_drop_events(s);
		free(s->ev);
		free(s->tok);
		free(s->id);
		bson_destroy(&s->err_reply);
	}
	free(cs->sh);
	sdb_pipeline_free(cs->pl);
	bson_destroy(&cs->spec);
	bson_destroy(&cs->start);
	free(cs->db);
	free(cs->coll);
	free(cs->gm_coll);
	free(cs);
}

int px_do_change_stream(ctx *c, const bson_t *stages, int64_t batch)
{
	px_cs *cs;
	bson_iter_t it, first;
	bool cluster = false;
	int st;
	char ns[600];

	if (px_cs_pipeline_kind(stages) < 0)
		return px_error(c, 40602, "$changeStream is only valid as the first stage in a pipeline");
	if (c->tx != NULL)
		return px_error(c, ERR_NOT_IN_TXN,
				"Cannot run '$changeStream' in a multi-document transaction.");
	{
		bson_iter_t ci;

		if (bson_iter_init_find(&ci, c->cmd, "collation")) /* refused, never ignored */
			return px_error(c, WIRE_ERR_NOT_IMPLEMENTED,
					"collation on a $changeStream aggregate is not supported");
	}
	cs = sdb_calloc(1, sizeof *cs);
	bson_init(&cs->spec);
	bson_init(&cs->start);
	cs->db = sdb_strdup(c->db);
	if (!bson_iter_init(&it, stages) || !bson_iter_next(&it) ||
	    !bson_iter_recurse(&it, &first) || !bson_iter_next(&first)) {
		px_cs_free(c->p, cs);
		return px_error(c, WIRE_ERR_INTERNAL, "no $changeStream stage");
	}
	if ((st = cs_parse_spec(c, cs, &first, &cluster)) != 0 ||
	    (st = cs_parse_stages(c, cs, stages)) != 0) {
		px_cs_free(c->p, cs);
		return st;
	}
	if (c->coll != NULL) {
		cs->level = CS_COLL;
		cs->coll = sdb_strdup(c->coll);
		cs->gm_coll = sdb_strdup(c->coll);
		snprintf(ns, sizeof ns, "%s.%s", c->db, c->coll);
	} else {
		cs->level = cluster ? CS_CLUSTER : CS_DB;
		cs->gm_coll = sdb_strdup("$cmd.aggregate");
		snprintf(ns, sizeof ns, "%s.$cmd.aggregate", c->db);
	}
	/* every shard: a collection's chunks may move to any of them */
	sync_shards(c, cs, false);
	if (cs->nsh == 0) {
		px_cs_free(c->p, cs);
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
	}
	cs->round_seq = px_cswait_seq(c->p->csw);
	cs->round_ms = sdb_mono_ms();
	cs_shard *bad = open_closed(c->p, cs, NULL); /* every shard, or an error */
	if (bad != NULL) {
		st = px_error(c, err_code(bad), "%s", err_msg(bad));
		px_cs_free(c->p, cs);
		return st;
	}
	if (!cs->have_pos) {
		/* no start point: the stream starts where every shard has started */
		for (size_t i = 0; i < cs->nsh; i++) {
			const cs_shard *s = &cs->sh[i];
			if (s->have_pbrt &&
			    (!cs->have_floor || sdb_cs_token_cmp(&s->pbrt, &cs->floor) > 0)) {
				cs->floor = s->pbrt;
				cs->have_floor = true;
			}
		}
		if (cs->have_floor) {
			cs->pos = cs->floor;
			cs->have_pos = true;
			/* the shards behind the start get a note above it before the client
			 * hears of the stream: their next writes then come after the start,
			 * not dropped below it (shard clocks are not gossiped) */
			size_t *idx = sdb_calloc(cs->nsh, sizeof *idx), n = 0;
			for (size_t i = 0; i < cs->nsh; i++)
				if (cs->sh[i].have_pbrt && cs->sh[i].pbrt.ts < cs->floor.ts)
					idx[n++] = i;
			cs_round(c->p, cs, idx, n, CS_OP_NOTE, 0, cs->floor.ts);
			const cs_shard *failed = NULL;
			for (size_t k = 0; k < n; k++) {
				cs_shard *s = &cs->sh[idx[k]];
				if (s->status == SHARDCONN_OK) {
					s->noted_ts = cs->floor.ts;
				} else if (failed == NULL) {
					failed = s;
					sdb_log(SDB_LOG_WARN,
						"change stream: appendOplogNote at the start failed",
						"shard=%s err=%s", s->id, err_msg(s));
				}
			}
			free(idx);
			if (failed != NULL) {
				/* that shard's next writes could fall below the start and be
				 * dropped by the floor: the stream is not opened (a retry opens it) */
				st = px_error(c, err_code(failed), "change stream: shard %s: %s",
					      failed->id, err_msg(failed));
				px_cs_free(c->p, cs);
				return st;
			}
		}
	}
	/* the first batch: what is releasable now (no wait, as mongos' first batch) */
	bson_t arr = BSON_INITIALIZER;
	size_t k = 0, bytes = 0;
	if ((st = release(c, cs, &arr, &k, &bytes, batch)) != 0) {
		bson_destroy(&arr);
		px_cs_free(c->p, cs);
		return st;
	}
	if (cs->invalidated) {
		st = answer_batch(c, cs, 0, ns, "firstBatch", &arr);
		bson_destroy(&arr);
		px_cs_free(c->p, cs);
		return st;
	}
	proxy_cursor *cur = proxy_cursor_new_cs(c->p, ns, cs);
	int64_t id = proxy_cursor_register(c->p, cur, c->user);
	st = answer_batch(c, cs, id, ns, "firstBatch", &arr);
	bson_destroy(&arr);
	return st;
}

/* A parked getMore's retry when something is pending that no watcher reports: an event
 * waits for a holdout shard's PBRT (noted, or stopped), or a shard's stream is closed (to
 * reopen 100 ms after it ended). */
#define CS_PARK_RETRY_MS 100

static bool pending(const px_cs *cs, px_cswait *w)
{
	ssize_t h = min_head(cs);

	if (h >= 0) {
		/* an event waits: for a holdout that answers (a stalled one's watcher wakes us
		 * when it answers again) */
		const sdb_cs_token *x = &cs->sh[h].tok[cs->sh[h].pos];
		for (size_t i = 0; i < cs->nsh; i++) {
			const cs_shard *s = &cs->sh[i];
			if (!s->gone && s->pos == s->n &&
			    (!s->have_pbrt || sdb_cs_token_cmp(&s->pbrt, x) <= 0) &&
			    !px_cswait_stalled(w, s->id))
				return true;
		}
	}
	for (size_t i = 0; i < cs->nsh; i++)
		if (!cs->sh[i].gone && cs->sh[i].cursor_id == 0 &&
		    !px_cswait_stalled(w, cs->sh[i].id)) /* its watcher wakes us */
			return true;
	return false;
}

/* Must a getMore that parks run a round before parking? When something is pending, or a
 * shard it would ask moved for it since it last asked it (cswait.h); a shard that did not
 * is marked seen up to now. */
static bool need_round(px_cs *cs, px_cswait *w)
{
	if (pending(cs, w))
		return true;
	ssize_t h = min_head(cs);
	uint64_t q = px_cswait_seq(w);
	bool r = false;
	for (size_t i = 0; i < cs->nsh; i++) {
		int cand = candidate(cs, w, i, h);
		if (cand == 1 || (cand == 2 && shard_moved(cs, w, &cs->sh[i], false)))
			r = true;
		else if (cand == 2)
			cs->sh[i].asked_seq = q;
	}
	return r;
}

/* Does an event wait for a holdout shard that has not been sent its note yet (the round
 * that buffered the event did not ask it: it had not moved for the stream)? Then the next
 * round notes it at once, instead of after a park's retry. */
static bool note_due(const px_cs *cs, px_cswait *w)
{
	ssize_t h = min_head(cs);

	if (h < 0)
		return false;
	for (size_t i = 0; i < cs->nsh; i++)
		if (candidate(cs, w, i, h) == 1 &&
		    cs->sh[i].noted_ts < cs->sh[h].tok[cs->sh[h].pos].ts)
			return true;
	return false;
}

/* At an await's end: would a refresh round (CS_ASK_REFRESH) ask a shard? */
static bool refresh_due(px_cs *cs, px_cswait *w, uint64_t now)
{
	if (now < cs->round_ms + CS_POS_REFRESH_MS)
		return false;
	ssize_t h = min_head(cs);
	for (size_t i = 0; i < cs->nsh; i++)
		if (candidate(cs, w, i, h) == 2 && shard_moved(cs, w, &cs->sh[i], true))
			return true;
	return false;
}

/* The shards a park checks for a move it has not seen: those need_round looks at.
 * Returns: their number; *out (free it) borrows the ids from cs. */
static size_t park_checks(const px_cs *cs, px_cswait *w, px_cswait_check **out)
{
	px_cswait_check *ck = sdb_calloc(cs->nsh ? cs->nsh : 1, sizeof *ck);
	ssize_t h = min_head(cs);
	size_t n = 0;

	for (size_t i = 0; i < cs->nsh; i++) {
		int cand = candidate(cs, w, i, h);
		if (cand == 0)
			continue;
		ck[n].id = cs->sh[i].id;
		ck[n].since = cs->sh[i].asked_seq;
		ck[n].any = cand == 1;
		n++;
	}
	*out = ck;
	return n;
}

int px_cs_get_more(ctx *c, proxy_cursor *cur, px_cs *cs, int64_t id, const char *ns)
{
	int64_t batch = px_get_int(c->cmd, "batchSize", 0);
	int64_t await = px_get_int(c->cmd, "maxTimeMS", CS_DEFAULT_AWAIT_MS);
	uint64_t deadline, now = sdb_mono_ms();
	bson_t arr = BSON_INITIALIZER;
	size_t k = 0, bytes = 0;
	int st = 0;
	/* parking (cswait.h): the worker and the shard connections are free while the
	 * stream waits; each run does non-blocking shard getMores. Not in a transaction (its
	 * statement bookkeeping runs around the handler) nor without the table (unit tests):
	 * there the getMore waits on its worker, each round awaiting on the shards. */
	px_cswait *w = c->p->csw;
	bool can_park = w != NULL && c->req != NULL && !pxtxn_is_txn_cmd(c->cmd);
	bool fetched = false, refreshed = false, note_now = false;

	if (batch <= 0)
		batch = -1;
	if (await <= 0 || await > INT32_MAX)
		await = CS_DEFAULT_AWAIT_MS;
	if (cs->park_req != NULL && cs->park_req != c->req && now < cs->park_deadline + 1000) {
		/* another getMore of this cursor is parked (MongoDB: one at a time) */
		proxy_cursor_checkin(c->p, cur);
		bson_destroy(&arr);
		return px_error(c, ERR_CURSOR_IN_USE, "cursor id %lld is already in use",
				(long long)id);
	}
	if (cs->park_req == c->req && c->resumed)
		deadline = cs->park_deadline; /* the same getMore, woken: its await goes on */
	else
		deadline = now + (uint64_t)await;
	cs->park_req = NULL;
	sync_shards(c, cs, true);
	for (;;) {
		if (c->req != NULL && wire_req_conn_gone(c->req)) {
			/* its client closed the connection (a parked getMore is woken for it):
			 * the cursor ends, as mongod interrupts the operation of a client that
			 * disconnected (ClientDisconnect); the answer is not sent */
			st = px_error(c, ERR_CLIENT_DISCONNECT,
				      "operation was interrupted because a client disconnected");
			break;
		}
		if (c->req != NULL && wire_req_killed(c->req)) {
			/* killOp (a parked getMore is woken for it): the cursor ends, as a
			 * getMore's failure ends it on mongod */
			st = px_error(c, WIRE_ERR_INTERRUPTED, "operation was interrupted");
			break;
		}
		if ((st = release(c, cs, &arr, &k, &bytes, batch)) != 0)
			break;
		if (k > 0 || cs->invalidated)
			break;
		now = sdb_mono_ms();
		if (now >= deadline) {
			if (can_park && !refreshed && refresh_due(cs, w, now)) {
				/* the position moves on (shards moved for other streams) */
				refreshed = true;
				if ((st = fetch(c, cs, 0, CS_ASK_REFRESH)) != 0)
					break;
				continue;
			}
			break;
		}
		if (!can_park) {
			if ((st = fetch(c, cs, (int64_t)(deadline - now), CS_ASK_ALL)) != 0)
				break;
			continue;
		}
		if (fetched && !note_now && note_due(cs, w)) {
			/* an event waits for a shard not noted yet: now, once per run (a note that
			 * fails is sent again after the park's retry, not in a loop) */
			note_now = true;
			fetched = false;
			continue;
		}
		if (fetched) {
			/* a round found nothing to return: wait without a thread */
			uint64_t until = deadline;
			bool pend = pending(cs, w);
			if (pend && now + CS_PARK_RETRY_MS < until)
				until = now + CS_PARK_RETRY_MS;
			px_cswait_filter f;
			px_cswait_check *ck;
			size_t nck = park_checks(cs, w, &ck);
			cs_filter(cs, &f);
			cs->park_req = c->req;
			cs->park_deadline = deadline;
			int r = px_cswait_park(w, c->req, c->user, &f, pend, ck, nck, until, cur);
			free(ck);
			if (r == 1) {
				bson_destroy(&arr);
				return px_parked(c); /* cur is checked in; cs is not ours now */
			}
			cs->park_req = NULL;
			if (r < 0)
				break; /* the proxy stops: answer what there is */
			fetched = false; /* a shard moved for it during the round: another */
			continue;
		}
		if (!need_round(cs, w)) {
			fetched = true; /* no shard it would ask moved for it since it asked */
			continue;
		}
		if ((st = fetch(c, cs, 0, CS_ASK_MOVED)) != 0)
			break;
		fetched = true;
	}
	if (st != 0) {
		bson_destroy(&arr);
		proxy_cursor_destroy(c->p, cur);
		return st;
	}
	if (cs->invalidated) {
		st = answer_batch(c, cs, 0, ns, "nextBatch", &arr);
		proxy_cursor_destroy(c->p, cur);
	} else {
		st = answer_batch(c, cs, id, ns, "nextBatch", &arr);
		proxy_cursor_checkin(c->p, cur);
	}
	bson_destroy(&arr);
	return st;
}
