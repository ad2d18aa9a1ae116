/* Change streams on the shard (issue #20): the $changeStream aggregate, its cursor and its
 * getMore. Contract: changestream.h, common/changestream.h; README "Change streams".
 *
 * A stream's position is scan_after: every oplog entry with ts <= scan_after has been turned
 * into events and those events were returned or wait in `pending` (an entry's events are
 * produced together: at most an event and its invalidate). Each pass reads the oplog after
 * scan_after in one read transaction (a WAL snapshot: a prefix of the commits, since the
 * apply commits entries in ts order and allocates every new ts above the newest on disk),
 * so HWM(scan_after) is a sound watermark once pending is empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "shard/changestream.h"
#include "shard/cmd_read_int.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "storage/pipeline.h"
#include "storage/store.h"

/* Entries one pass reads at most (a getMore over a long stretch of other namespaces
 * answers an empty batch with an advanced postBatchResumeToken instead of running long). */
#define CS_MAX_SCAN 10000
/* The largest event a reply may carry: MongoDB's BSONObjMaxUserSize (16 MiB) plus its
 * internal slack (16793600 bytes, the limit mongod names in BSONObjectTooLarge). */
#define BSON_MAX_SIZE_EVENT 16793600u
/* Default first batch (aggregate without cursor.batchSize), as mongod. */
#define CS_DEFAULT_BATCH 101

struct shard_cs {
	shard_cs_kind kind;
	char *db, *coll;
	char shard[SDB_CS_SHARD_MAX + 1];
	bool merge, update_lookup;
	sdb_pipeline *p;     /* the stages after $changeStream, NULL when none */
	sdb_cs_token floor;  /* resume point: only events with a greater token */
	bool have_floor;
	sdb_cs_token pos;    /* the newest token returned (or the start point) */
	uint64_t scan_after; /* entries with ts <= this are processed */
	bson_t **pending;    /* events produced, not yet returned (tokens in pend_tok) */
	sdb_cs_token *pend_tok;
	size_t n_pending, cap_pending;
	bool closed;         /* an invalidate was produced: the cursor ends after pending */
	/* per pass: shard key patterns read (ns -> key copy or NULL) */
	shard_ctx *x;
	char **key_ns;
	bson_t **key_pat;
	size_t n_keys;
};

void shard_cs_free(struct shard_cs *cs)
{
	if (!cs)
		return;
	free(cs->db);
	free(cs->coll);
	if (cs->p)
		sdb_pipeline_free(cs->p);
	util_docs_free(cs->pending, cs->n_pending);
	free(cs->pend_tok);
	free(cs);
}

bool shard_cs_wanted(const bson_t *cmd)
{
	bson_iter_t it, arr, st;
	return bson_iter_init_find(&it, cmd, "pipeline") && BSON_ITER_HOLDS_ARRAY(&it) &&
	       bson_iter_recurse(&it, &arr) && bson_iter_next(&arr) &&
	       BSON_ITER_HOLDS_DOCUMENT(&arr) && bson_iter_recurse(&arr, &st) &&
	       bson_iter_next(&st) && strcmp(bson_iter_key(&st), "$changeStream") == 0;
}

/* ------------------------------------------------------------------ lookups of a pass */

static void keys_reset(struct shard_cs *cs)
{
	for (size_t i = 0; i < cs->n_keys; i++) {
		free(cs->key_ns[i]);
		if (cs->key_pat[i])
			bson_destroy(cs->key_pat[i]);
	}
	free(cs->key_ns);
	free(cs->key_pat);
	cs->key_ns = NULL;
	cs->key_pat = NULL;
	cs->n_keys = 0;
}

static const bson_t *key_of(void *arg, const char *ns)
{
	struct shard_cs *cs = arg;
	int64_t cv, sv, gen;
	bson_t *doc = NULL, *key = NULL;
	bson_iter_t it;
	char err[128];

	for (size_t i = 0; i < cs->n_keys; i++)
		if (strcmp(cs->key_ns[i], ns) == 0)
			return cs->key_pat[i];
	if (sdb_store_filtering_get(cs->x->conn, ns, &cv, &sv, &gen, &doc, err, sizeof err) == 0 &&
	    doc && bson_iter_init_find(&it, doc, "key") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_t view;
		if (util_iter_bson(&it, &view))
			key = bson_copy(&view);
	}
	if (doc)
		bson_destroy(doc);
	cs->key_ns = sdb_realloc(cs->key_ns, (cs->n_keys + 1) * sizeof *cs->key_ns);
	cs->key_pat = sdb_realloc(cs->key_pat, (cs->n_keys + 1) * sizeof *cs->key_pat);
	cs->key_ns[cs->n_keys] = sdb_strdup(ns);
	cs->key_pat[cs->n_keys++] = key;
	return key;
}

static bool lookup(void *arg, const char *db, const char *coll, const bson_iter_t *id, bson_t *out)
{
	struct shard_cs *cs = arg;
	char err[128];
	return sdb_store_get_by_id(cs->x->conn, db, coll, id, out, err, sizeof err) == 0;
}

/* ------------------------------------------------------------------ the user's stages */

/* Run the user's stages over ev (taken). 1 with *out (heap), 0 when filtered out, -1 on
 * an error (*code, x->err). */
static int run_stages(shard_ctx *x, struct shard_cs *cs, bson_t *ev, bson_t **out, int *code)
{
	if (!cs->p) {
		*out = ev;
		return 1;
	}
	int rc = sdb_pipeline_run_one(cs->p, ev, out, code, x->err, sizeof x->err);
	if (rc < 0 && !*code)
		*code = WIRE_ERR_INTERNAL;
	if (rc == 1 && sdb_cs_check_id(ev, *out, x->err, sizeof x->err) != 0) {
		bson_destroy(*out);
		*out = NULL;
		*code = 280; /* ChangeStreamFatalError */
		rc = -1;
	}
	bson_destroy(ev);
	return rc < 0 ? -1 : rc;
}

/* ------------------------------------------------------------------ passes */

static void pending_push(struct shard_cs *cs, bson_t *d, const sdb_cs_token *t)
{
	if (cs->n_pending == cs->cap_pending) {
		cs->cap_pending = cs->cap_pending ? 2 * cs->cap_pending : 8;
		cs->pending = sdb_realloc(cs->pending, cs->cap_pending * sizeof *cs->pending);
		cs->pend_tok = sdb_realloc(cs->pend_tok, cs->cap_pending * sizeof *cs->pend_tok);
	}
	cs->pending[cs->n_pending] = d;
	cs->pend_tok[cs->n_pending++] = *t;
}

static sdb_cs_token hwm(uint64_t ts)
{
	sdb_cs_token t;
	memset(&t, 0, sizeof t);
	t.ts = ts;
	t.kind = SDB_CS_HWM;
	return t;
}

/* Move pending events into the batch arr while they fit (want documents, 0 = no count
 * limit; the reply byte cap). */
static void take_pending(struct shard_cs *cs, bson_t *arr, size_t want, size_t *n, size_t *bytes)
{
	size_t i = 0;
	for (; i < cs->n_pending; i++) {
		size_t len = cs->pending[i]->len + 16;
		if ((want && *n >= want) || (*n > 0 && *bytes + len > SHARD_MAX_REPLY_BYTES))
			break;
		char key[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)*n, &kp, key, sizeof key);
		bson_append_document(arr, kp, -1, cs->pending[i]);
		*bytes += len;
		(*n)++;
		cs->pos = cs->pend_tok[i];
		bson_destroy(cs->pending[i]);
	}
	if (i == 0)
		return;
	memmove(cs->pending, cs->pending + i, (cs->n_pending - i) * sizeof *cs->pending);
	memmove(cs->pend_tok, cs->pend_tok + i, (cs->n_pending - i) * sizeof *cs->pend_tok);
	cs->n_pending -= i;
}

/* Has the oplog lost entries a stream positioned at scan_after needs (entries with
 * ts > scan_after)? Exactly when the trimming deleted one above it; a store trimmed by an
 * earlier version, which did not record how far, falls back to "its first entry is newer
 * than the position" (which may also say lost when only a gap of ts lay there). Read txn
 * open. */
static bool history_lost(shard_ctx *x, uint64_t scan_after)
{
	uint64_t upto = sdb_store_oplog_trimmed_upto(x->conn);
	if (upto == 0)
		return false;
	if (upto > 1)
		return upto > scan_after;
	return sdb_store_oplog_first(x->conn) > scan_after + 1;
}

/* One pass: fill arr with up to want events (0 = byte cap only) from pending, then from
 * the oplog after cs->scan_after. *snap_last: the newest ts of the pass's snapshot (0
 * when no oplog read). Returns 0, or -1 after replying an error (the read is rolled back;
 * the caller drops the cursor). */
static int cs_fill(shard_ctx *x, struct shard_cs *cs, size_t want, bson_t *arr, size_t *n,
		   uint64_t *snap_last)
{
	size_t bytes = 0, scanned = 0;
	int code = 0;
	*n = 0;
	*snap_last = 0;
	take_pending(cs, arr, want, n, &bytes);
	if (cs->n_pending || cs->closed || (want && *n >= want))
		return 0;
	if (!shard_begin(x, false))
		return -1;
	*snap_last = sdb_store_oplog_last(x->conn);
	if (history_lost(x, cs->scan_after)) {
		shard_fail(x, 286,
			   "Resume of change stream was not possible, as the resume point may no "
			   "longer be in the oplog.");
		return -1;
	}
	cs->x = x;
	shard_cs_scope sc = {
		.kind = cs->kind,
		.db = cs->db,
		.coll = cs->coll,
		.shard = cs->shard,
		.merge = cs->merge,
		.update_lookup = cs->update_lookup,
		.key_of = key_of,
		.lookup = lookup,
		.arg = cs,
	};
	bool stop = false;
	while (!stop && scanned < CS_MAX_SCAN) {
		bson_t **raw = NULL;
		size_t nraw = 0, i;
		int rc = sdb_store_oplog_read(x->conn, cs->scan_after, 1000, &raw, &nraw, x->err,
					      sizeof x->err);
		if (rc) {
			util_docs_free(raw, nraw);
			keys_reset(cs);
			shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
			return -1;
		}
		for (i = 0; i < nraw && !stop; i++) {
			bson_t *ev[2];
			sdb_cs_token tok[2];
			bool inv = false;
			bson_iter_t ti;
			uint64_t ts = 0;
			if (bson_iter_init_find(&ti, raw[i], "ts") && BSON_ITER_HOLDS_TIMESTAMP(&ti)) {
				uint32_t t, inc;
				bson_iter_timestamp(&ti, &t, &inc);
				ts = sdb_store_ts_pack(t, inc);
			}
			size_t ne = shard_cs_transform(&sc, raw[i], ev, tok, &inv);
			for (size_t k = 0; k < ne; k++) {
				bson_t *outd = NULL;
				if (cs->have_floor && sdb_cs_token_cmp(&tok[k], &cs->floor) <= 0) {
					bson_destroy(ev[k]);
					continue;
				}
				int r = run_stages(x, cs, ev[k], &outd, &code);
				if (r < 0) {
					for (size_t j = k + 1; j < ne; j++)
						bson_destroy(ev[j]);
					util_docs_free(raw, nraw);
					keys_reset(cs);
					shard_fail(x, code, "%s", x->err);
					return -1;
				}
				if (r == 1 && outd->len > BSON_MAX_SIZE_EVENT) {
					/* mongod: BSONObjectTooLarge (no $changeStreamSplitLargeEvent
					 * here); the stream cannot pass this event */
					snprintf(x->err, sizeof x->err,
						 "BSONObj size: %u (0x%X) is invalid. Size must be between "
						 "0 and 16793600(16MB) First element: _id: %s",
						 outd->len, outd->len, "<a change event>");
					bson_destroy(outd);
					for (size_t j = k + 1; j < ne; j++)
						bson_destroy(ev[j]);
					util_docs_free(raw, nraw);
					keys_reset(cs);
					shard_fail(x, WIRE_ERR_BSON_TOO_LARGE, "%s", x->err);
					return -1;
				}
				if (r == 1)
					pending_push(cs, outd, &tok[k]);
			}
			scanned++;
			if (ts > cs->scan_after) /* (every entry has its row's ts: never 0) */
				cs->scan_after = ts;
			if (inv && !cs->merge) {
				/* only if the invalidating event itself was past the resume point:
				 * a stream started after the invalidate goes on */
				if (!cs->have_floor || sdb_cs_token_cmp(&tok[ne ? ne - 1 : 0],
									&cs->floor) > 0)
					cs->closed = true, stop = true;
			}
			take_pending(cs, arr, want, n, &bytes);
			if (cs->n_pending || (want && *n >= want))
				stop = true;
		}
		util_docs_free(raw, nraw);
		if (nraw < 1000)
			break;
	}
	keys_reset(cs);
	sdb_store_rollback(x->conn);
	return 0;
}

/* The cursor reply: {cursor: {firstBatch|nextBatch: arr, postBatchResumeToken, id, ns}}. */
static bson_t *cs_reply(struct shard_cs *cs, bson_t *arr, bool first, int64_t id, const char *ns)
{
	bson_t *reply = bson_new(), cur;
	sdb_cs_token pbrt = cs->pos;
	if (cs->n_pending == 0 && !cs->closed) {
		sdb_cs_token h = hwm(cs->scan_after);
		if (sdb_cs_token_cmp(&h, &pbrt) > 0)
			pbrt = h;
	}
	BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
	BSON_APPEND_ARRAY(&cur, first ? "firstBatch" : "nextBatch", arr);
	sdb_cs_token_append(&cur, "postBatchResumeToken", &pbrt);
	BSON_APPEND_INT64(&cur, "id", id);
	BSON_APPEND_UTF8(&cur, "ns", ns);
	bson_append_document_end(reply, &cur);
	return reply;
}

/* ------------------------------------------------------------------ getMore */

static void cs_resume(shard_ctx *x)
{
	shard_await *a = x->resume;
	shard_cursor *c = a->c;
	int64_t batch = a->batch, deadline = a->deadline_ms;
	free(a);
	shard_cs_getmore(x, c, batch, deadline);
}

void shard_cs_getmore(shard_ctx *x, shard_cursor *c, int64_t batch, int64_t deadline_ms)
{
	struct shard_cs *cs = c->cs;
	bson_t arr = BSON_INITIALIZER;
	size_t n = 0;
	uint64_t snap_last = 0;

	if (wire_req_killed(x->req)) {
		bson_destroy(&arr);
		shard_cursor_put(x->sh, c, true);
		shard_fail(x, WIRE_ERR_INTERRUPTED, "operation was interrupted");
		return;
	}
	if (cs_fill(x, cs, batch > 0 ? (size_t)batch : 0, &arr, &n, &snap_last) != 0) {
		bson_destroy(&arr);
		shard_cursor_put(x->sh, c, true);
		return;
	}
	if (n == 0 && !cs->closed && snap_last && cs->scan_after >= snap_last) {
		/* nothing new: wait for the next commit (or the deadline) holding no worker */
		shard_await *a = sdb_calloc(1, sizeof *a);
		a->fn = cs_resume;
		a->req = x->req;
		a->c = c;
		a->batch = batch;
		a->deadline_ms = deadline_ms;
		if (shard_await_park(x->sh, a, snap_last)) {
			bson_destroy(&arr);
			return;
		}
		free(a);
	}
	bool done = cs->closed && cs->n_pending == 0;
	bson_t *reply = cs_reply(cs, &arr, false, done ? 0 : c->id, c->ns);
	bson_destroy(&arr);
	shard_cursor_put(x->sh, c, done);
	wire_req_reply(x->req, reply);
}

/* ------------------------------------------------------------------ the aggregate */

/* Parse a token option (resumeAfter / startAfter) at it into t; replies and returns false
 * on error. */
static bool token_opt(shard_ctx *x, const bson_iter_t *it, const char *name, sdb_cs_token *t)
{
	bson_t doc;
	int code = 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !util_iter_bson(it, &doc)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "BSON field '$changeStream.%s' is the wrong type '%s', expected type "
			   "'object'",
			   name, util_type_name(bson_iter_type(it)));
		return false;
	}
	if (sdb_cs_token_parse_code(&doc, t, &code, x->err, sizeof x->err) != 0) {
		shard_fail(x, code, "%s", x->err);
		return false;
	}
	return true;
}

/* The options of the $changeStream spec. */
typedef struct cs_opts {
	bool update_lookup, cluster, merge;
	bool have_resume, have_start_after, have_at;
	sdb_cs_token tok;
	uint64_t at;
	/* $stripedbShardId (wip-cs-proxy): the shard id the proxy knows this shard by
	 * (metadata's), named in the tokens; "" = the replica set name */
	char shard_id[SDB_CS_SHARD_MAX + 1];
} cs_opts;

static bool parse_spec(shard_ctx *x, const bson_iter_t *spec_it, cs_opts *o)
{
	bson_iter_t it;
	memset(o, 0, sizeof *o);
	if (!BSON_ITER_HOLDS_DOCUMENT(spec_it) || !bson_iter_recurse(spec_it, &it)) {
		shard_fail(x, 50808, "$changeStream stage expects a document as argument");
		return false;
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "fullDocument") == 0 || strcmp(k, "fullDocumentBeforeChange") == 0) {
			bool before = k[12] != '\0';
			const char *v;
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field '$changeStream.%s' is the wrong type '%s', "
					   "expected type 'string'",
					   k, util_type_name(bson_iter_type(&it)));
				return false;
			}
			v = bson_iter_utf8(&it, NULL);
			if (strcmp(v, "whenAvailable") == 0 || strcmp(v, "required") == 0) {
				shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
					   "$changeStream %s: \"%s\" needs change stream pre- and "
					   "post-images, which stripedb does not record",
					   k, v);
				return false;
			}
			if (before ? strcmp(v, "off") != 0
				   : (strcmp(v, "default") != 0 && strcmp(v, "updateLookup") != 0)) {
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "Enumeration value '%s' for field '$changeStream.%s' is not "
					   "a valid value.",
					   v, k);
				return false;
			}
			if (!before)
				o->update_lookup = strcmp(v, "updateLookup") == 0;
		} else if (strcmp(k, "resumeAfter") == 0 || strcmp(k, "startAfter") == 0) {
			bool ra = k[0] == 'r';
			if (!token_opt(x, &it, k, &o->tok))
				return false;
			if (ra)
				o->have_resume = true;
			else
				o->have_start_after = true;
		} else if (strcmp(k, "startAtOperationTime") == 0) {
			uint32_t t, i;
			if (!BSON_ITER_HOLDS_TIMESTAMP(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field '$changeStream.startAtOperationTime' is the "
					   "wrong type '%s', expected type 'timestamp'",
					   util_type_name(bson_iter_type(&it)));
				return false;
			}
			bson_iter_timestamp(&it, &t, &i);
			o->at = sdb_store_ts_pack(t, i);
			o->have_at = true;
		} else if (strcmp(k, "$stripedbShardId") == 0) {
			/* wip-cs-proxy: tokens must name the shard as every proxy does (the
			 * replica set name may be unset, "(null)" on every standalone shard) */
			uint32_t len = 0;
			const char *v = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, &len) : NULL;
			if (v == NULL || len == 0 || len > SDB_CS_SHARD_MAX || strlen(v) != len) {
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "$changeStream $stripedbShardId must be a shard id string of "
					   "1 to %d bytes",
					   SDB_CS_SHARD_MAX);
				return false;
			}
			memcpy(o->shard_id, v, len + 1);
		} else if (strcmp(k, "allChangesForCluster") == 0 ||
			   strcmp(k, "showExpandedEvents") == 0 || strcmp(k, "$stripedbMerge") == 0 ||
			   strcmp(k, "showMigrationEvents") == 0) {
			if (!BSON_ITER_HOLDS_BOOL(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field '$changeStream.%s' is the wrong type '%s', "
					   "expected type 'bool'",
					   k, util_type_name(bson_iter_type(&it)));
				return false;
			}
			bool v = bson_iter_bool(&it);
			if (k[0] == 'a')
				o->cluster = v;
			else if (k[0] == '$')
				o->merge = v;
			else if (v) {
				shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
					   "$changeStream %s: true is not supported by stripedb", k);
				return false;
			}
		} else {
			shard_fail(x, 40415, "BSON field '$changeStream.%s' is an unknown field.", k);
			return false;
		}
	}
	if (o->have_resume && o->have_start_after) {
		shard_fail(x, 50865,
			   "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream "
			   "stage");
		return false;
	}
	if (o->have_at && (o->have_resume || o->have_start_after)) {
		shard_fail(x, 40674, "Only one type of resume option is allowed, but multiple were "
				     "found");
		return false;
	}
	if (o->have_resume && o->tok.kind == SDB_CS_INVALIDATE) {
		shard_fail(x, 260,
			   "Attempting to resume a change stream using 'resumeAfter' is not allowed "
			   "from an invalidate notification");
		return false;
	}
	return true;
}

/* The stages after $changeStream (it: at the first of them): those a change stream allows
 * (MongoDB 6.0: $match, $project, $addFields, $set, $unset, $replaceRoot, $replaceWith,
 * $redact), parsed into *p (NULL when none). Replies and returns false on error. */
static bool parse_rest(shard_ctx *x, bson_iter_t *it, sdb_pipeline **p)
{
	static const char *const allowed[] = {"$match",	  "$project",	  "$addFields", "$set",
					       "$unset",  "$replaceRoot", "$replaceWith", "$redact"};
	bson_t rest = BSON_INITIALIZER;
	uint32_t nst = 0;
	int code = 0;
	*p = NULL;
	while (bson_iter_next(it)) {
		bson_iter_t st;
		const char *name;
		bool ok = false;
		if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &st) ||
		    !bson_iter_next(&st)) {
			bson_destroy(&rest);
			shard_fail(x, 40323,
				   "A pipeline stage specification object must contain exactly one "
				   "field.");
			return false;
		}
		name = bson_iter_key(&st);
		if (strcmp(name, "$changeStream") == 0) {
			bson_destroy(&rest);
			shard_fail(x, 40602,
				   "$changeStream is only valid as the first stage in a pipeline");
			return false;
		}
		for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
			ok = ok || strcmp(allowed[i], name) == 0;
		if (!ok) {
			bson_destroy(&rest);
			shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION,
				   "%s is not permitted in a $changeStream pipeline", name);
			return false;
		}
		char k[16];
		const char *kp;
		bson_uint32_to_string(nst++, &kp, k, sizeof k);
		bson_append_iter(&rest, kp, -1, it);
	}
	if (nst > 0) {
		sdb_pipeline_opts po = {.let = shard_let(x)};
		if (sdb_pipeline_parse(&rest, &po, p, &code, x->err, sizeof x->err) != 0) {
			bson_destroy(&rest);
			shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
			return false;
		}
	}
	bson_destroy(&rest);
	return true;
}

/* The namespace rules of assertIsLegalSpecification (document_source_change_stream.cpp).
 * Replies and returns false when refused. */
static bool legal_ns(shard_ctx *x, const char *coll, const cs_opts *o)
{
	bool admin = strcmp(x->db, "admin") == 0;
	if (o->cluster && (!admin || coll)) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "A $changeStream with 'allChangesForCluster:true' may only be opened on "
			   "the 'admin' database, and with no collection name; found %s%s%s",
			   x->db, coll ? "." : ".$cmd.aggregate", coll ? coll : "");
		return false;
	}
	if (admin ? !o->cluster : (strcmp(x->db, "local") == 0 || strcmp(x->db, "config") == 0)) {
		shard_fail(x, WIRE_ERR_INVALID_NAMESPACE,
			   "$changeStream may not be opened on the internal %s database", x->db);
		return false;
	}
	if (coll && strncmp(coll, "system.", 7) == 0) {
		shard_fail(x, WIRE_ERR_INVALID_NAMESPACE,
			   "$changeStream may not be opened on the internal %s.%s collection", x->db,
			   coll);
		return false;
	}
	return true;
}

void shard_cs_aggregate(shard_ctx *x)
{
	bson_iter_t it, arr, st;
	const char *coll = NULL;
	int64_t batch = CS_DEFAULT_BATCH;
	cs_opts o;
	sdb_pipeline *p = NULL;

	if (x->in_txn) {
		shard_fail(x, 263, "Cannot run '$changeStream' in a multi-document transaction.");
		return;
	}
	if (bson_iter_init_find(&it, x->cmd, "collation")) {
		/* the stages after $changeStream run without one: refused, never ignored */
		shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
			   "collation on a $changeStream aggregate is not supported");
		return;
	}
	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it)) {
		if (BSON_ITER_HOLDS_UTF8(&it))
			coll = bson_iter_utf8(&it, NULL);
		else if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1) {
			shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
				   "Invalid command format: the 'aggregate' field must specify a "
				   "collection name or 1");
			return;
		}
	}
	if (!bson_iter_init_find(&it, x->cmd, "cursor")) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "The 'cursor' option is required, except for aggregate with the explain "
			   "argument");
		return;
	} else {
		bson_t cur = BSON_INITIALIZER;
		bson_iter_t bi;
		bool ok = util_get_doc(x, "aggregate", &it, &cur);
		if (ok && bson_iter_init_find(&bi, &cur, "batchSize"))
			ok = util_get_int(x, "aggregate", &bi, 0, INT64_MAX, &batch);
		bson_destroy(&cur);
		if (!ok)
			return;
	}
	bson_iter_init_find(&it, x->cmd, "pipeline");
	bson_iter_recurse(&it, &arr);
	bson_iter_next(&arr);
	bson_iter_recurse(&arr, &st);
	bson_iter_next(&st);
	{
		bson_iter_t more = st;
		if (bson_iter_next(&more)) {
			shard_fail(x, 40323,
				   "A pipeline stage specification object must contain exactly one "
				   "field.");
			return;
		}
	}
	if (!parse_spec(x, &st, &o) || !legal_ns(x, coll, &o) || !parse_rest(x, &arr, &p))
		return;

	struct shard_cs *cs = sdb_calloc(1, sizeof *cs);
	cs->kind = o.cluster ? SHARD_CS_CLUSTER : coll ? SHARD_CS_COLL : SHARD_CS_DB;
	cs->db = sdb_strdup(x->db);
	cs->coll = coll ? sdb_strdup(coll) : NULL;
	if (o.shard_id[0] != '\0')
		snprintf(cs->shard, sizeof cs->shard, "%s", o.shard_id);
	else
		snprintf(cs->shard, sizeof cs->shard, "%s",
			 shard_repl_set_name(x->sh->repl) ? shard_repl_set_name(x->sh->repl) : "");
	cs->merge = o.merge;
	cs->update_lookup = o.update_lookup && !o.merge;
	cs->p = p;
	if (!shard_begin(x, false)) {
		shard_cs_free(cs);
		return;
	}
	if (coll && shard_coll_is_view(x, coll)) {
		shard_cs_free(cs);
		shard_fail(x, WIRE_ERR_COMMAND_NOT_SUPPORTED_ON_VIEW,
			   "$changeStream is not supported on views.");
		return;
	}
	if (o.have_resume || o.have_start_after) {
		cs->floor = o.tok;
		cs->have_floor = true;
		cs->pos = o.tok;
		cs->scan_after = o.tok.kind == SDB_CS_HWM ? o.tok.ts : (o.tok.ts ? o.tok.ts - 1 : 0);
	} else if (o.have_at) {
		cs->scan_after = o.at ? o.at - 1 : 0;
		cs->pos = hwm(cs->scan_after);
	} else {
		/* mongod: one tick beyond the newest applied operation */
		cs->scan_after = sdb_store_oplog_last(x->conn);
		cs->pos = hwm(cs->scan_after);
	}
	if ((o.have_resume || o.have_start_after || o.have_at) && history_lost(x, cs->scan_after)) {
		shard_cs_free(cs);
		shard_fail(x, 286,
			   "Resume of change stream was not possible, as the resume point may no "
			   "longer be in the oplog.");
		return;
	}
	sdb_store_rollback(x->conn);

	bson_t first = BSON_INITIALIZER;
	size_t n = 0;
	uint64_t snap_last = 0;
	if (batch > 0 && cs_fill(x, cs, (size_t)batch, &first, &n, &snap_last) != 0) {
		bson_destroy(&first);
		shard_cs_free(cs);
		return;
	}
	char *ns = coll ? sdb_ns_join(x->db, coll)
			: sdb_asprintf("%s.$cmd.aggregate", x->db);
	int64_t id = 0;
	shard_cursor *c = NULL;
	if (!cs->closed || cs->n_pending) {
		c = sdb_calloc_bson(1, sizeof *c);
		bson_init(&c->filter);
		c->ns = sdb_strdup(ns);
		c->tailable = true;
		c->await_data = true;
		c->cs = cs;
		id = shard_cursor_add(x->sh, c);
	}
	bson_t *reply = cs_reply(cs, &first, true, id, ns);
	bson_destroy(&first);
	if (!c)
		shard_cs_free(cs);
	free(ns);
	wire_req_reply(x->req, reply);
}
