/* Write commands of the shard role: insert, update, delete, findAndModify (MongoDB 6.0
 * semantics). A command's whole batch is one SQLite transaction (one fsync); each item runs
 * inside a savepoint so that a failed item leaves no trace and, for unordered batches, the
 * others still apply. The version check of $stripedbVersion runs first in the same
 * transaction. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/bsonget.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "shard/validation.h"
#include "common/bsonval.h"
#include "storage/pipeline.h"
#include "storage/projection.h"
#include "storage/query.h"
#include "storage/update.h"

/* mongod's budget for the errmsgs of one write reply (MongoDB manual, bulk write batches:
 * "if the error report for a single batch grows too large, MongoDB truncates all remaining
 * error messages to the empty string", past 1 MB): once the errmsgs
 * reach 1 MiB the remaining ones are "", so that 100,000 failed statements (maxWriteBatchSize)
 * answer under maxBsonObjectSize. */
#define WERR_ERRMSG_BUDGET (1024 * 1024)

/* Accumulated writeErrors of one command; errmsg_bytes: errmsg bytes appended so far. */
typedef struct werrs {
	bson_t arr;
	int n;
	size_t errmsg_bytes;
	size_t info_bytes; /* errInfo bytes appended so far (SHARD_VALID_INFO_BUDGET) */
} werrs;

static void werr_add(werrs *w, int64_t index, int code, const char *msg,
		     const sdb_store_dup *dup, const bson_t *info)
{
	char key[16];
	snprintf(key, sizeof key, "%d", w->n++);
	bson_t e;
	BSON_APPEND_DOCUMENT_BEGIN(&w->arr, key, &e);
	BSON_APPEND_INT32(&e, "index", (int32_t)index);
	BSON_APPEND_INT32(&e, "code", code);
	BSON_APPEND_UTF8(&e, "codeName", wire_code_name(code));
	if (w->errmsg_bytes < WERR_ERRMSG_BUDGET) {
		w->errmsg_bytes += strlen(msg);
		BSON_APPEND_UTF8(&e, "errmsg", msg);
	} else {
		BSON_APPEND_UTF8(&e, "errmsg", "");
	}
	if (dup && dup->set) {
		BSON_APPEND_DOCUMENT(&e, "keyPattern", &dup->key_pattern);
		BSON_APPEND_DOCUMENT(&e, "keyValue", &dup->key_value);
	}
	if (info && w->info_bytes + info->len <= SHARD_VALID_INFO_BUDGET) {
		w->info_bytes += info->len;
		BSON_APPEND_DOCUMENT(&e, "errInfo", info);
	} else if (info) {
		bson_t *t = shard_valid_info_truncated(info);
		BSON_APPEND_DOCUMENT(&e, "errInfo", t);
		bson_destroy(t);
	}
	bson_append_document_end(&w->arr, &e);
}

static bool get_ordered(const bson_t *cmd)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, cmd, "ordered"))
		return bson_iter_as_bool(&it);
	return true;
}

/* The statements array of a write command. Replies and returns false when missing. */
static bool get_array(shard_ctx *x, const char *cmd, const char *field, bson_iter_t *arr,
		      uint32_t *count)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, x->cmd, field)) {
		shard_fail(x, 40414, "BSON field '%s.%s' is missing but a required field", cmd,
			   field);
		return false;
	}
	if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, arr)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "BSON field '%s.%s' is the wrong type '%s', expected type 'array'", cmd,
			   field, util_type_name(bson_iter_type(&it)));
		return false;
	}
	bson_iter_t c = *arr;
	uint32_t n = 0;
	while (bson_iter_next(&c))
		n++;
	if (n > WIRE_MAX_WRITE_BATCH) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "Write batch sizes must be between 1 and %d. Got %u operations.",
			   WIRE_MAX_WRITE_BATCH, n);
		return false;
	}
	*count = n;
	return true;
}

/* The code of a failed document write (sdb_store_insert / sdb_store_replace returned rc on
 * conn): DuplicateKey, the store's own code of the document's fault
 * (sdb_store_write_code: InvalidIdField, CannotIndexParallelArrays), BadValue, else
 * InternalError. */
static int write_code(int rc, const sdb_store_conn *conn)
{
	int code;

	if (rc == SDB_EEXISTS)
		return WIRE_ERR_DUPLICATE_KEY;
	if (rc == SDB_EINVAL)
		return (code = sdb_store_write_code(conn)) != 0 ? code : WIRE_ERR_BAD_VALUE;
	return WIRE_ERR_INTERNAL;
}

/* MongoDB's storage validation of _id (storage_validation.cpp, validIdField and
 * storageValidEmbedded): a document or array _id may not hold a $-prefixed field name at any
 * depth ($ref, $id and $db, DBRef's fields, excepted). False with MongoDB's message in err
 * (code 52 DollarPrefixedFieldName) when it does (the document was checked to nest at most 100 levels before, which bounds the recursion). */
static bool id_storage_valid(const bson_iter_t *id, char *err, size_t errlen)
{
	bson_iter_t sub;

	if ((!BSON_ITER_HOLDS_DOCUMENT(id) && !BSON_ITER_HOLDS_ARRAY(id)) ||
	    !bson_iter_recurse(id, &sub))
		return true;
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (BSON_ITER_HOLDS_DOCUMENT(id) && k[0] == '$' && strcmp(k, "$ref") != 0 &&
		    strcmp(k, "$id") != 0 && strcmp(k, "$db") != 0) {
			snprintf(err, errlen,
				 "_id fields may not contain '$'-prefixed fields: %s is not valid for "
				 "storage.",
				 k);
			return false;
		}
		if (!id_storage_valid(&sub, err, errlen))
			return false;
	}
	return true;
}

/* id_storage_valid for the _id of doc (true when it has none). */
static bool doc_id_storage_valid(const bson_t *doc, char *err, size_t errlen)
{
	bson_iter_t it;

	return !bson_iter_init_find(&it, doc, "_id") || id_storage_valid(&it, err, errlen);
}

/* A document ready to store: _id first (generated when missing). */
static void prepare_insert(shard_ctx *x, const bson_t *in, bson_t *out)
{
	bson_iter_t it;
	bson_init(out);
	if (bson_iter_init_find(&it, in, "_id")) {
		bson_append_iter(out, "_id", 3, &it);
	} else {
		bson_oid_t oid;
		sdb_store_new_oid(x->conn, &oid);
		BSON_APPEND_OID(out, "_id", &oid);
	}
	if (bson_iter_init(&it, in)) {
		while (bson_iter_next(&it)) {
			if (strcmp(bson_iter_key(&it), "_id") == 0)
				continue;
			bson_append_iter(out, bson_iter_key(&it), -1, &it);
		}
	}
}

static void reply_write(shard_ctx *x, int64_t n, int64_t n_modified, bool with_modified,
			bson_t *upserted, int n_upserted, werrs *w)
{
	bson_t *reply = bson_new();
	BSON_APPEND_INT32(reply, "n", (int32_t)n);
	if (with_modified)
		BSON_APPEND_INT32(reply, "nModified", (int32_t)n_modified);
	if (upserted && n_upserted > 0)
		BSON_APPEND_ARRAY(reply, "upserted", upserted);
	if (w->n > 0)
		BSON_APPEND_ARRAY(reply, "writeErrors", &w->arr);
	wire_req_reply(x->req, reply);
}

/* One write command's batch: the statements array, its retryable-write fields and the
 * writeErrors gathered so far. what names a statement in the error for one that is not a
 * document ("update statement"). Opened by wbatch_open, ended by wbatch_close or
 * wbatch_abort. */
typedef struct wbatch {
	const char *coll;
	const char *what;
	bson_iter_t arr;
	bool ordered;
	shard_txn t;
	werrs w;
	int64_t i; /* the current statement's index, -1 before the first */
} wbatch;

/* Open the batch of the write command cmd (its statements in x->cmd's array field): the
 * collection, the array, ordered and the retryable-write fields, then the write transaction
 * (version check, refusal of a view, the session's txnNumber and, with import_sessions, the
 * migrated sessions). Replies and returns false on failure (b then holds nothing). */
static bool wbatch_open(shard_ctx *x, const char *cmd, const char *field, const char *what,
			bool import_sessions, wbatch *b)
{
	uint32_t count;
	b->coll = shard_coll_arg(x);
	if (!b->coll || !get_array(x, cmd, field, &b->arr, &count))
		return false;
	b->what = what;
	b->ordered = get_ordered(x->cmd);
	if (!shard_txn_parse(x, &b->t, count))
		return false;
	if (!shard_begin(x, true) || shard_refuse_view(x, b->coll) ||
	    !shard_txn_start(x, &b->t) || (import_sessions && !shard_mig_sessions_import(x))) {
		shard_txn_free(&b->t);
		return false;
	}
	b->w = (werrs){.n = 0};
	bson_init(&b->w.arr);
	b->i = -1;
	return true;
}

/* Record a writeError for the current statement; returns true when the batch stops there
 * (ordered). */
static bool wbatch_error(wbatch *b, int code, const char *msg, const sdb_store_dup *dup)
{
	werr_add(&b->w, b->i, code, msg, dup, NULL);
	return b->ordered;
}

/* wbatch_error with the errInfo of x's failure (x->err_info: a DocumentValidationFailure's,
 * taken here) when there is one. */
static bool wbatch_error_x(shard_ctx *x, wbatch *b, int code, const char *msg,
			   const sdb_store_dup *dup)
{
	werr_add(&b->w, b->i, code, msg, dup, x->err_info);
	if (x->err_info) {
		bson_destroy(x->err_info);
		x->err_info = NULL;
	}
	return b->ordered;
}

/* Step to the next statement. Returns 1 with *done set (the recorded outcome of a retried
 * statement that ran before, sdb_doc_free) or with *done NULL and st a static view of the
 * statement to run; 0 at the end (or after an ordered batch's statement that is not a
 * document, whose writeError is recorded; an unordered batch records it and goes on); -1
 * after the session lookup replied an error (the caller then calls wbatch_abort). */
static int wbatch_next(shard_ctx *x, wbatch *b, bson_t *st, bson_t **done)
{
	while (bson_iter_next(&b->arr)) {
		b->i++;
		*done = NULL;
		int seen = shard_txn_lookup(x, &b->t, (uint32_t)b->i, done);
		if (seen != 0)
			return seen;
		if (BSON_ITER_HOLDS_DOCUMENT(&b->arr)) {
			util_iter_bson(&b->arr, st);
			return 1;
		}
		char msg[64];
		snprintf(msg, sizeof msg, "%s must be an object", b->what);
		if (wbatch_error(b, WIRE_ERR_TYPE_MISMATCH, msg, NULL))
			return 0;
	}
	return 0;
}

/* Before the current statement's writes: its savepoint, and the session fields (ms: those
 * of a migrated statement, or NULL) its oplog entries carry. */
static void wbatch_stmt_begin(shard_ctx *x, wbatch *b, shard_mig_sess *ms)
{
	sdb_store_savepoint(x->conn);
	shard_txn_tag(x, &b->t, (uint32_t)b->i);
	if (ms)
		shard_mig_sess_tag(x, ms);
}

/* After the current statement succeeded, in its savepoint: the migrated statement's record
 * (ms, or NULL), then its outcome res for retries (when the command has a session). 0 or the
 * store error (message in x->err). */
static int wbatch_stmt_record(shard_ctx *x, wbatch *b, shard_mig_sess *ms, const bson_t *res)
{
	int rc;
	if (ms && (rc = shard_mig_sess_record(x, ms)) != 0)
		return rc;
	return b->t.on ? shard_txn_record(x, &b->t, (uint32_t)b->i, res) : 0;
}

/* End the current statement: keep its writes when ok, else undo them and stop tagging
 * oplog entries with a migrated statement's session (ms, or NULL). */
static void wbatch_stmt_end(shard_ctx *x, shard_mig_sess *ms, bool ok)
{
	if (ok) {
		sdb_store_savepoint_release(x->conn);
		return;
	}
	sdb_store_savepoint_rollback(x->conn);
	if (ms && ms->on) /* the next statement's entries must not carry this one's session */
		sdb_store_set_op_session(x->conn, NULL, 0, 0);
}

/* Release the batch of a command that failed (the reply is the caller's). */
static void wbatch_abort(wbatch *b)
{
	bson_destroy(&b->w.arr);
	shard_txn_free(&b->t);
}

/* Commit the batch and reply {n, nModified (with_modified), upserted, writeErrors};
 * releases b (upserted stays the caller's). */
static void wbatch_close(shard_ctx *x, wbatch *b, int64_t n, int64_t n_modified,
			 bool with_modified, bson_t *upserted, int n_upserted)
{
	shard_txn_free(&b->t);
	if (shard_commit(x))
		reply_write(x, n, n_modified, with_modified, upserted, n_upserted, &b->w);
	bson_destroy(&b->w.arr);
}

/* ------------------------------------------------------------------ insert */

void shard_cmd_insert(shard_ctx *x)
{
	wbatch b;
	shard_valid sv;
	if (!wbatch_open(x, "insert", "documents", "document to insert", false, &b))
		return;
	/* an $out's temporary collection is created explicitly with the target's options and
	 * indexes; one that is gone (dropped at a primary change, shard/cmd_outmerge.c) must
	 * not come back implicitly, empty and without them, under a proxy's later inserts:
	 * that $out fails instead of renaming an incomplete output over its target */
	const sdb_store_coll *tco = NULL;
	if (strncmp(b.coll, "tmp.agg_out.", 12) == 0 && x->origin == NULL &&
	    (sdb_store_coll_get(x->conn, x->db, b.coll, &tco, NULL, 0) != 0 || tco == NULL)) {
		wbatch_abort(&b);
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND,
			   "the $out temporary collection %s.%s no longer exists (dropped at a "
			   "change of primary): the $out failed, its target is unchanged",
			   x->db, b.coll);
		return;
	}
	if (!shard_valid_open(x, b.coll, &sv)) {
		wbatch_abort(&b);
		return;
	}
	int64_t n = 0;
	bson_t in, *done;
	int more;
	while ((more = wbatch_next(x, &b, &in, &done)) > 0) {
		if (done) { /* a retry: executed before, not again */
			sdb_doc_free(done);
			n++;
			continue;
		}
		if (in.len > WIRE_MAX_BSON_SIZE) {
			if (wbatch_error(&b, WIRE_ERR_BSON_TOO_LARGE, "object to insert too large",
					 NULL))
				break;
			continue;
		}
		if (!sdb_bson_depth_ok(&in, 100)) {
			if (wbatch_error(&b, WIRE_ERR_OVERFLOW,
					 "Document exceeds maximum nesting depth of 100", NULL))
				break;
			continue;
		}
		if (!doc_id_storage_valid(&in, x->err, sizeof x->err)) {
			if (wbatch_error(&b, WIRE_ERR_DOLLAR_PREFIXED, x->err, NULL))
				break;
			continue;
		}
		bson_t doc;
		prepare_insert(x, &in, &doc);
		int vcode = shard_valid_doc(x, &sv, NULL, &doc);
		if (vcode != 0) {
			bson_destroy(&doc);
			if (wbatch_error_x(x, &b, vcode, x->err, NULL))
				break;
			continue;
		}
		sdb_store_dup dup = {0};
		wbatch_stmt_begin(x, &b, NULL);
		int rc = sdb_store_insert(x->conn, x->db, b.coll, &doc, x->origin, &dup, x->err,
					  sizeof x->err);
		bson_destroy(&doc);
		if (rc == 0) {
			bson_t res = BSON_INITIALIZER;
			BSON_APPEND_INT32(&res, "n", 1);
			rc = wbatch_stmt_record(x, &b, NULL, &res);
			bson_destroy(&res);
		}
		wbatch_stmt_end(x, NULL, rc == 0);
		if (rc == 0) {
			n++;
			continue;
		}
		if (rc == SDB_EIO || rc == SDB_EBUSY || rc == SDB_ECORRUPT) {
			sdb_store_dup_clear(&dup);
			wbatch_abort(&b);
			shard_valid_close(&sv);
			shard_fail(x, WIRE_ERR_INTERNAL, "insert: %s", x->err);
			return;
		}
		bool stop = wbatch_error(&b, write_code(rc, x->conn),
					 dup.set ? dup.errmsg : x->err, &dup);
		sdb_store_dup_clear(&dup);
		if (stop)
			break;
	}
	shard_valid_close(&sv);
	if (more < 0) {
		wbatch_abort(&b);
		return;
	}
	wbatch_close(x, &b, n, 0, false, NULL, 0);
}

/* ------------------------------------------------------------------ update */

/* Collect copies of the documents q matches (at most limit, 0 = all); with key_range (a
 * delete's keyRange, shard_filtering_key_range) only those of that shard-key range. */
static int match_docs_in(shard_ctx *x, const char *coll, const bson_t *filter,
			 const bson_t *sort, const bson_iter_t *hint, int64_t limit,
			 const bson_t *key_range, bson_t ***docs, size_t *n, int *code)
{
	sdb_query_spec spec = {.filter = filter, .sort = sort, .hint = hint, .limit = limit,
			       .let = shard_let(x)};
	shard_key_range kr;
	*docs = NULL;
	*n = 0;
	if (key_range) {
		char ns[512];
		snprintf(ns, sizeof ns, "%s.%s", x->db, coll);
		if ((*code = shard_filtering_key_range(x, ns, key_range, &kr, &spec)) != 0)
			return SDB_EINVAL;
	} else {
		shard_filtering_spec(x, &spec);
	}
	sdb_query *q = NULL;
	size_t cap = 0;
	int rc = sdb_query_open(x->conn, x->db, coll, &spec, &q, code, x->err, sizeof x->err);
	if (rc)
		return rc;
	const bson_t *d;
	while ((rc = sdb_query_next(q, &d, code, x->err, sizeof x->err)) == 1)
		util_docs_push(docs, n, &cap, sdb_doc_copy(d));
	sdb_query_free(q);
	if (rc < 0) {
		util_docs_free(*docs, *n);
		*docs = NULL;
		*n = 0;
		return rc;
	}
	return 0;
}

static int match_docs(shard_ctx *x, const char *coll, const bson_t *filter,
		      const bson_t *sort, const bson_iter_t *hint, int64_t limit,
		      bson_t ***docs, size_t *n, int *code)
{
	return match_docs_in(x, coll, filter, sort, hint, limit, NULL, docs, n, code);
}

typedef struct upd_stmt {
	bson_t q;
	bson_iter_t u;
	bool have_u;
	bool upsert, multi;
	bson_t array_filters;
	bool have_af;
	bson_iter_t hint;
	bool have_hint;
	bson_iter_t c; /* the statement's constants (MongoDB 5.0), for a pipeline update */
	bool have_c;
	/* MongoDB's upsertSupplied (write_ops.idl, what $merge sends for a pipeline with
	 * whenNotMatched insert): an upsert inserts the constant `new` as is */
	bool upsert_supplied;
} upd_stmt;

/* Parse one update statement {q, u, upsert, multi, arrayFilters, hint}. Returns 0 or a
 * MongoDB code with the message in x->err. */
static int parse_upd_stmt(shard_ctx *x, const bson_t *st, upd_stmt *s)
{
	memset(s, 0, sizeof *s);
	bson_init(&s->q);
	bson_init(&s->array_filters);
	bson_iter_t it;
	if (!bson_iter_init(&it, st))
		return WIRE_ERR_BAD_VALUE;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "q") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				snprintf(x->err, sizeof x->err,
					 "BSON field 'q' is the wrong type '%s', expected type "
					 "'object'",
					 util_type_name(bson_iter_type(&it)));
				return WIRE_ERR_TYPE_MISMATCH;
			}
			util_iter_copy(&it, &s->q);
		} else if (strcmp(k, "u") == 0) {
			s->u = it;
			s->have_u = true;
		} else if (strcmp(k, "upsert") == 0) {
			s->upsert = bson_iter_as_bool(&it);
		} else if (strcmp(k, "multi") == 0) {
			s->multi = bson_iter_as_bool(&it);
		} else if (strcmp(k, "arrayFilters") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&it)) {
				snprintf(x->err, sizeof x->err,
					 "BSON field 'arrayFilters' is the wrong type '%s', "
					 "expected type 'array'",
					 util_type_name(bson_iter_type(&it)));
				return WIRE_ERR_TYPE_MISMATCH;
			}
			util_iter_copy(&it, &s->array_filters);
			s->have_af = true;
		} else if (strcmp(k, "hint") == 0) {
			if (BSON_ITER_HOLDS_UTF8(&it) ||
			    (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_value(&it)->value.v_doc.data_len > 5)) {
				s->hint = it;
				s->have_hint = true;
			}
		} else if (strcmp(k, "c") == 0) {
			s->c = it;
			s->have_c = true;
		} else if (strcmp(k, "upsertSupplied") == 0) {
			s->upsert_supplied = bson_iter_as_bool(&it);
		}
	}
	if (s->upsert_supplied && !s->upsert) {
		snprintf(x->err, sizeof x->err,
			 "the parameter 'upsertSupplied' is set but 'upsert' is false");
		return WIRE_ERR_FAILED_TO_PARSE;
	}
	if (!s->have_u) {
		snprintf(x->err, sizeof x->err, "BSON field 'u' is missing but a required field");
		return 40414;
	}
	return 0;
}

static void upd_stmt_destroy(upd_stmt *s)
{
	bson_destroy(&s->q);
	bson_destroy(&s->array_filters);
}

/* $currentDate's clock: the store's (the entry's leader time when replicated). */
static int64_t clock_ms(void *ctx)
{
	return sdb_store_now_ms(ctx);
}

static void new_oid(void *ctx, bson_oid_t *out)
{
	sdb_store_new_oid(ctx, out);
}

/* $stripedbShardKey: ["k", "a.b"] on an update or findAndModify a proxy routed to a
 * sharded collection's chunk with a pipeline-style update: the proxy cannot tell from the
 * stages whether the shard key changes (it checks operator updates and replacements itself:
 * routing/route.h route_update_changes_key), so the shard checks the new document. A
 * changed shard key value is refused with 66 ImmutableField and the message the proxy uses,
 * before anything is written (a document moved out of its chunk would be an orphan: hidden
 * from reads and lost at the next cleanup). before: the document, or for an upsert the
 * seed built from the filter. Returns 0 or 66 (message in x->err). */
static int shard_key_kept(shard_ctx *x, const bson_t *before, const bson_t *after)
{
	bson_iter_t it, k;
	if (!bson_iter_init_find(&it, x->cmd, "$stripedbShardKey") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &k))
		return 0;
	while (bson_iter_next(&k)) {
		bson_iter_t a, b;
		if (!BSON_ITER_HOLDS_UTF8(&k))
			continue;
		const char *path = bson_iter_utf8(&k, NULL);
		bool ha = bson_iter_init(&a, before) && bson_iter_find_descendant(&a, path, &a);
		bool hb = bson_iter_init(&b, after) && bson_iter_find_descendant(&b, path, &b);
		/* binary even under the statement's collation: "a" -> "A" moves the key */
		if (ha == hb &&
		    (!ha || sdb_bson_value_eq_simple(bson_iter_value(&a), bson_iter_value(&b))))
			continue;
		snprintf(x->err, sizeof x->err,
			 "After applying the update, the (immutable) field '%s' was found to have "
			 "been altered: updating the shard key of a document is not supported",
			 path);
		return WIRE_ERR_IMMUTABLE_FIELD;
	}
	return 0;
}

/* The outcome of one update statement. */
typedef struct upd_result {
	int64_t matched, modified;
	bool upserted;
	bson_value_t upserted_id;
	bson_t *before, *after; /* for findAndModify: the single document's images */
} upd_result;

/* Run one update statement in the open transaction (caller manages savepoints). Returns 0
 * or a MongoDB code (message in x->err, dup filled for 11000). */
static int run_update(shard_ctx *x, const char *coll, upd_stmt *s, const bson_t *sort,
		      bool keep_images, const shard_valid *sv, upd_result *r, sdb_store_dup *dup)
{
	memset(r, 0, sizeof *r);
	/* the variables a pipeline update reads: the command's let, then the statement's c */
	bson_t vars;
	int code = 0;
	if (s->have_c && !BSON_ITER_HOLDS_ARRAY(&s->u)) {
		/* update_driver.cpp: constants belong to a pipeline */
		snprintf(x->err, sizeof x->err,
			 "Constant values may only be specified for pipeline updates");
		return 51198;
	}
	if (s->have_c) {
		/* constants, not expressions (mongod's PipelineExecutor: setConstantValue of each
		 * element): each value wrapped in $literal, then parsed as let is (the names'
		 * rules, 14 for a c that is not a document) */
		bson_t lits = BSON_INITIALIZER, lit;
		bson_iter_t ci;
		const bson_iter_t *src = &s->c;
		if (BSON_ITER_HOLDS_DOCUMENT(&s->c) && bson_iter_recurse(&s->c, &ci)) {
			while (bson_iter_next(&ci)) {
				bson_append_document_begin(&lits, bson_iter_key(&ci), -1, &lit);
				bson_append_iter(&lit, "$literal", -1, &ci);
				bson_append_document_end(&lits, &lit);
			}
		}
		bson_t holder = BSON_INITIALIZER;
		bson_iter_t hi;
		BSON_APPEND_DOCUMENT(&holder, "c", &lits);
		if (BSON_ITER_HOLDS_DOCUMENT(&s->c) && bson_iter_init_find(&hi, &holder, "c"))
			src = &hi;
		int prc = sdb_let_parse(src, shard_let(x), "update.updates.c", &vars, &code,
					x->err, sizeof x->err);
		bson_destroy(&holder);
		bson_destroy(&lits);
		if (prc != 0) {
			bson_destroy(&vars);
			return code ? code : WIRE_ERR_BAD_VALUE;
		}
	}
	bson_t supplied = BSON_INITIALIZER; /* upsertSupplied: the constant `new` */
	if (s->upsert_supplied) {
		bson_iter_t nv;
		if (!s->have_c || !bson_iter_init_find(&nv, &vars, "new") ||
		    !BSON_ITER_HOLDS_DOCUMENT(&nv)) {
			if (s->have_c)
				bson_destroy(&vars);
			snprintf(x->err, sizeof x->err,
				 "the parameter 'upsertSupplied' is set but no document was supplied "
				 "as the constant 'new'");
			return WIRE_ERR_FAILED_TO_PARSE;
		}
		util_iter_copy(&nv, &supplied);
	}
	sdb_update_opts uo = {
		.array_filters = s->have_af ? &s->array_filters : NULL,
		.query = &s->q,
		.vars = s->have_c ? &vars : shard_let(x),
		.clock = clock_ms,
		.clock_ctx = x->conn,
		.oid = new_oid,
		.oid_ctx = x->conn,
	};
	sdb_update *u = NULL;
	int prc = sdb_update_parse_value(&s->u, &uo, &u, &code, x->err, sizeof x->err);
	if (s->have_c)
		bson_destroy(&vars); /* parse copied what it uses */
	if (prc != 0) {
		bson_destroy(&supplied);
		return code ? code : WIRE_ERR_FAILED_TO_PARSE;
	}
	if (s->multi && sdb_update_get_kind(u) == SDB_UPDATE_REPLACEMENT) {
		bson_destroy(&supplied);
		sdb_update_free(u);
		snprintf(x->err, sizeof x->err,
			 "multi update is not supported for replacement-style update");
		return WIRE_ERR_FAILED_TO_PARSE;
	}
	/* what the "u" oplog entries say: an updateDescription, or none for a replacement */
	sdb_store_upd_kind ukind = SDB_STORE_UPD_REPLACE;
	if (sdb_update_get_kind(u) == SDB_UPDATE_OPERATORS)
		ukind = SDB_STORE_UPD_MODIFIER;
	else if (sdb_update_get_kind(u) == SDB_UPDATE_PIPELINE)
		ukind = SDB_STORE_UPD_PIPELINE;
	bson_t **docs = NULL;
	size_t n = 0;
	int rc = match_docs(x, coll, &s->q, sort, s->have_hint ? &s->hint : NULL,
			    s->multi ? 0 : 1, &docs, &n, &code);
	if (rc) {
		bson_destroy(&supplied);
		sdb_update_free(u);
		return code ? code : WIRE_ERR_BAD_VALUE;
	}
	int ret = 0;
	for (size_t i = 0; i < n; i++) {
		bson_t out;
		bool changed = false;
		if (sdb_update_apply(u, docs[i], false, &out, &changed, &code, x->err,
				     sizeof x->err) != 0) {
			bson_destroy(&out);
			ret = code ? code : WIRE_ERR_BAD_VALUE;
			break;
		}
		r->matched++;
		if (changed && (ret = shard_key_kept(x, docs[i], &out)) != 0) {
			bson_destroy(&out);
			break;
		}
		if (changed) {
			if (out.len > WIRE_MAX_BSON_SIZE) {
				bson_destroy(&out);
				snprintf(x->err, sizeof x->err,
					 "Resulting document after update is larger than %d",
					 WIRE_MAX_BSON_SIZE);
				ret = WIRE_ERR_BSON_TOO_LARGE;
				break;
			}
			if ((ret = shard_valid_doc(x, sv, docs[i], &out)) != 0) {
				bson_destroy(&out);
				break;
			}
			/* docs[i]: the stored image, read by match_docs in this transaction */
			rc = sdb_store_update_stored(x->conn, x->db, coll, docs[i], &out, ukind,
						     NULL, x->origin, dup, x->err, sizeof x->err);
			if (rc) {
				bson_destroy(&out);
				ret = write_code(rc, x->conn);
				if (dup && dup->set)
					snprintf(x->err, sizeof x->err, "%s", dup->errmsg);
				break;
			}
			r->modified++;
		}
		if (keep_images && !r->before) {
			r->before = sdb_doc_copy(docs[i]);
			r->after = sdb_doc_copy(&out);
		}
		bson_destroy(&out);
	}
	util_docs_free(docs, n);
	if (ret == 0 && r->matched == 0 && s->upsert) {
		bson_t doc;
		if (s->upsert_supplied) {
			bson_copy_to(&supplied, &doc);
		} else if (sdb_update_upsert_doc(u, &s->q, &doc, &code, x->err, sizeof x->err) !=
			   0) {
			bson_destroy(&doc);
			bson_destroy(&supplied);
			sdb_update_free(u);
			return code ? code : WIRE_ERR_BAD_VALUE;
		}
		bson_destroy(&supplied); /* inline again: the returns below need not free it */
		bson_init(&supplied);
		bson_t ready, seed;
		int sc = 0;
		char se[128];
		if (sdb_update_upsert_seed(&s->q, &seed, &sc, se, sizeof se) == 0)
			ret = shard_key_kept(x, &seed, &doc);
		bson_destroy(&seed);
		if (ret) {
			bson_destroy(&doc);
			sdb_update_free(u);
			return ret;
		}
		if (!doc_id_storage_valid(&doc, x->err, sizeof x->err)) {
			bson_destroy(&doc);
			sdb_update_free(u);
			return WIRE_ERR_DOLLAR_PREFIXED;
		}
		prepare_insert(x, &doc, &ready);
		bson_destroy(&doc);
		if ((ret = shard_valid_doc(x, sv, NULL, &ready)) != 0) {
			bson_destroy(&ready);
			sdb_update_free(u);
			return ret;
		}
		rc = sdb_store_insert(x->conn, x->db, coll, &ready, x->origin, dup, x->err,
				      sizeof x->err);
		if (rc) {
			ret = write_code(rc, x->conn);
			if (dup && dup->set)
				snprintf(x->err, sizeof x->err, "%s", dup->errmsg);
		} else {
			bson_iter_t it;
			bson_iter_init_find(&it, &ready, "_id");
			bson_value_copy(bson_iter_value(&it), &r->upserted_id);
			r->upserted = true;
			if (keep_images)
				r->after = sdb_doc_copy(&ready);
		}
		bson_destroy(&ready);
	}
	bson_destroy(&supplied);
	sdb_update_free(u);
	return ret;
}

static void upd_result_destroy(upd_result *r)
{
	if (r->upserted)
		bson_value_destroy(&r->upserted_id);
	if (r->before)
		sdb_doc_free(r->before);
	if (r->after)
		sdb_doc_free(r->after);
	memset(r, 0, sizeof *r);
}

/* Add {index, _id} to the upserted array being built. */
static void append_upserted(bson_t *upserted, int *n_upserted, int64_t i, const bson_value_t *id)
{
	char key[16];
	bson_t e;
	snprintf(key, sizeof key, "%d", (*n_upserted)++);
	BSON_APPEND_DOCUMENT_BEGIN(upserted, key, &e);
	BSON_APPEND_INT32(&e, "index", (int32_t)i);
	BSON_APPEND_VALUE(&e, "_id", id);
	bson_append_document_end(upserted, &e);
}

void shard_cmd_update(shard_ctx *x)
{
	wbatch b;
	shard_valid sv;
	if (!wbatch_open(x, "update", "updates", "update statement", true, &b))
		return;
	if (!shard_valid_open(x, b.coll, &sv)) {
		wbatch_abort(&b);
		return;
	}
	bson_t upserted = BSON_INITIALIZER;
	int n_upserted = 0;
	int64_t matched = 0, modified = 0;
	bson_t st, *done;
	int more;
	while ((more = wbatch_next(x, &b, &st, &done)) > 0) {
		if (done) { /* a retry: the recorded outcome, not a second execution */
			bson_iter_t rit;
			if (bson_iter_init_find(&rit, done, "n"))
				matched += bson_iter_as_int64(&rit);
			if (bson_iter_init_find(&rit, done, "nModified"))
				modified += bson_iter_as_int64(&rit);
			if (bson_iter_init_find(&rit, done, "upserted"))
				append_upserted(&upserted, &n_upserted, b.i, bson_iter_value(&rit));
			sdb_doc_free(done);
			continue;
		}
		upd_stmt s;
		shard_mig_sess ms;
		int code = parse_upd_stmt(x, &st, &s);
		if (code == 0)
			code = shard_mig_sess_parse(x, &st, &ms);
		if (code) {
			upd_stmt_destroy(&s);
			/* malformed statements fail the whole command, as mongod */
			wbatch_abort(&b);
			shard_valid_close(&sv);
			bson_destroy(&upserted);
			shard_fail(x, code, "%s", x->err);
			return;
		}
		/* the statement's collation, else the collection's: a bad one is this
		 * statement's write error, as mongod's */
		if ((code = shard_collation_set(x, b.coll, &st)) != 0) {
			upd_stmt_destroy(&s);
			if (wbatch_error(&b, code, x->err, NULL))
				break;
			continue;
		}
		upd_result r;
		sdb_store_dup dup = {0};
		wbatch_stmt_begin(x, &b, &ms);
		code = run_update(x, b.coll, &s, NULL, false, &sv, &r, &dup);
		upd_stmt_destroy(&s);
		if (code == 0) {
			bson_t res = BSON_INITIALIZER;
			BSON_APPEND_INT64(&res, "n", r.matched);
			BSON_APPEND_INT64(&res, "nModified", r.modified);
			if (r.upserted)
				BSON_APPEND_VALUE(&res, "upserted", &r.upserted_id);
			if (wbatch_stmt_record(x, &b, &ms, &res) != 0)
				code = WIRE_ERR_INTERNAL;
			bson_destroy(&res);
		}
		wbatch_stmt_end(x, &ms, code == 0);
		if (code == 0) {
			matched += r.matched;
			modified += r.modified;
			if (r.upserted)
				append_upserted(&upserted, &n_upserted, b.i, &r.upserted_id);
			upd_result_destroy(&r);
			sdb_store_dup_clear(&dup);
			continue;
		}
		upd_result_destroy(&r);
		if (code == WIRE_ERR_INTERNAL) {
			sdb_store_dup_clear(&dup);
			wbatch_abort(&b);
			shard_valid_close(&sv);
			bson_destroy(&upserted);
			shard_fail(x, WIRE_ERR_INTERNAL, "update: %s", x->err);
			return;
		}
		bool stop = wbatch_error_x(x, &b, code, x->err, &dup);
		sdb_store_dup_clear(&dup);
		if (stop)
			break;
	}
	shard_valid_close(&sv);
	if (more < 0) {
		wbatch_abort(&b);
		bson_destroy(&upserted);
		return;
	}
	wbatch_close(x, &b, matched + n_upserted, modified, true, &upserted, n_upserted);
	bson_destroy(&upserted);
}

/* ------------------------------------------------------------------ delete */

void shard_cmd_delete(shard_ctx *x)
{
	wbatch b;
	if (!wbatch_open(x, "delete", "deletes", "delete statement", false, &b))
		return;
	int64_t n = 0, part = 0;
	{
		/* one part of a multi-document delete the primary splits (shard/repl.h) */
		bson_iter_t pi;
		if (bson_iter_init_find(&pi, x->cmd, SHARD_DELETE_PART_FIELD) &&
		    BSON_ITER_HOLDS_INT64(&pi))
			part = bson_iter_int64(&pi);
	}
	bson_t st, *done;
	int more;
	while ((more = wbatch_next(x, &b, &st, &done)) > 0) {
		if (done) { /* a retry: the recorded outcome */
			bson_iter_t rit;
			if (bson_iter_init_find(&rit, done, "n"))
				n += bson_iter_as_int64(&rit);
			sdb_doc_free(done);
			continue;
		}
		bson_t q = BSON_INITIALIZER;
		bson_iter_t it, hint;
		bool have_hint = false, have_q = false, have_kr = false;
		/* limit: -1 while absent; limit_bad: present but not exactly 0 or 1 */
		int64_t limit = -1, kr_limit = 0;
		bool limit_bad = false;
		bson_iter_t limit_it = {0};
		bson_t kr;
		if (bson_iter_init(&it, &st)) {
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (strcmp(k, "q") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
					util_iter_copy(&it, &q);
					have_q = true;
				} else if (strcmp(k, "limit") == 0) {
					/* write_ops.cpp readMultiDeleteProperty compares the
					 * double: 0.5 is not 0 ("delete all"), and 1e300 is
					 * never cast */
					double d = BSON_ITER_HOLDS_NUMBER(&it)
							   ? bson_iter_as_double(&it)
							   : NAN;
					limit_bad = d != 0 && d != 1;
					limit = d == 1 ? 1 : 0;
					limit_it = it;
				} else if (strcmp(k, "hint") == 0 &&
					   (BSON_ITER_HOLDS_UTF8(&it) ||
					    BSON_ITER_HOLDS_DOCUMENT(&it))) {
					hint = it;
					have_hint = true;
				} else if (strcmp(k, "keyRange") == 0 &&
					   BSON_ITER_HOLDS_DOCUMENT(&it)) {
					util_iter_bson(&it, &kr);
					have_kr = true;
				} else if (strcmp(k, "keyRangeLimit") == 0 &&
					   BSON_ITER_HOLDS_NUMBER(&it)) {
					if (!sdb_bson_as_int64(&it, &kr_limit))
						kr_limit = -1; /* refused below */
				}
			}
		}
		if (have_kr || kr_limit) {
			/* a migration's cleanup (src/shard/README.md): q is the marker
			 * {$stripedbKeyRange: true}, which a shard without this extension refuses
			 * as an unknown operator instead of deleting everything */
			bson_iter_t qi;
			bool marker = bson_count_keys(&q) == 1 &&
				      bson_iter_init_find(&qi, &q, "$stripedbKeyRange");
			if (!x->origin || !have_kr || !marker || limit != 0 || kr_limit < 0 ||
			    have_hint) {
				bson_destroy(&q);
				wbatch_abort(&b);
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "keyRange on a delete statement (a migration's cleanup) "
					   "needs $stripedbOrigin, q: {$stripedbKeyRange: true}, limit: "
					   "0 and no hint; keyRangeLimit >= 0 needs keyRange");
				return;
			}
			bson_reinit(&q);
		}
		if (!have_q || limit == -1 || limit_bad) {
			bson_destroy(&q);
			wbatch_abort(&b);
			if (!have_q)
				shard_fail(x, 40414, "BSON field 'delete.deletes.q' is missing but a "
						     "required field");
			else if (limit == -1)
				shard_fail(x, 40414, "BSON field 'delete.deletes.limit' is missing "
						     "but a required field");
			else if (!BSON_ITER_HOLDS_NUMBER(&limit_it))
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field 'delete.deletes.limit' is the wrong type '%s', "
					   "expected types '[long, int, double]'",
					   sdb_bson_type_name(bson_iter_type(&limit_it)));
			else
				shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
					   "The limit field in delete objects must be 0 or 1. Got %g",
					   bson_iter_as_double(&limit_it));
			return;
		}
		shard_mig_sess ms;
		int code = shard_mig_sess_parse(x, &st, &ms);
		if (code) {
			bson_destroy(&q);
			wbatch_abort(&b);
			shard_fail(x, code, "%s", x->err);
			return;
		}
		if ((code = shard_collation_set(x, b.coll, &st)) != 0) {
			bson_destroy(&q);
			if (wbatch_error(&b, code, x->err, NULL))
				break;
			continue;
		}
		bson_t **docs = NULL;
		size_t nd = 0;
		wbatch_stmt_begin(x, &b, &ms);
		int64_t lim = have_kr ? kr_limit : limit;
		if (!have_kr && limit == 0 && part > 0)
			lim = part;
		int rc = match_docs_in(x, b.coll, &q, NULL, have_hint ? &hint : NULL, lim,
				       have_kr ? &kr : NULL, &docs, &nd, &code);
		bson_destroy(&q);
		int64_t deleted = 0;
		for (size_t j = 0; rc == 0 && j < nd; j++) {
			rc = sdb_store_delete(x->conn, x->db, b.coll, docs[j], x->origin, x->err,
					      sizeof x->err);
			if (rc == 0)
				deleted++;
			else
				code = WIRE_ERR_INTERNAL;
		}
		util_docs_free(docs, nd);
		if (rc == 0) {
			bson_t res = BSON_INITIALIZER;
			BSON_APPEND_INT64(&res, "n", deleted);
			if ((rc = wbatch_stmt_record(x, &b, &ms, &res)) != 0)
				code = WIRE_ERR_INTERNAL;
			bson_destroy(&res);
		}
		wbatch_stmt_end(x, &ms, rc == 0);
		if (rc == 0) {
			n += deleted;
			continue;
		}
		if (wbatch_error(&b, code ? code : WIRE_ERR_BAD_VALUE, x->err, NULL))
			break;
	}
	if (more < 0) {
		wbatch_abort(&b);
		return;
	}
	wbatch_close(x, &b, n, 0, false, NULL, 0);
}

/* ------------------------------------------------------------------ findAndModify */

static void fam_fail_dup(shard_ctx *x, int code, sdb_store_dup *dup)
{
	if (x->err_info) { /* a DocumentValidationFailure: its errInfo */
		bson_t *extra = bson_new();
		BSON_APPEND_DOCUMENT(extra, "errInfo", x->err_info);
		bson_destroy(x->err_info);
		x->err_info = NULL;
		sdb_store_rollback(x->conn);
		wire_req_error_extra(x->req, code, extra, "%s", x->err);
		return;
	}
	if (code == WIRE_ERR_DUPLICATE_KEY && dup->set) {
		bson_t *extra = bson_new();
		BSON_APPEND_DOCUMENT(extra, "keyPattern", &dup->key_pattern);
		BSON_APPEND_DOCUMENT(extra, "keyValue", &dup->key_value);
		sdb_store_rollback(x->conn);
		wire_req_error_extra(x->req, code, extra, "%s", dup->errmsg);
		return;
	}
	shard_fail(x, code, "%s", x->err);
}

void shard_cmd_findandmodify(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	bson_t query = BSON_INITIALIZER, sort = BSON_INITIALIZER, fields = BSON_INITIALIZER;
	bson_t af = BSON_INITIALIZER;
	bool remove = false, want_new = false, upsert = false, have_update = false;
	bool have_sort = false, have_fields = false, have_af = false, have_hint = false;
	bson_iter_t it, update, hint;
	sdb_projection *proj = NULL;
	shard_txn t;
	memset(&t, 0, sizeof t);
	bool ok = bson_iter_init(&it, x->cmd);
	while (ok && bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "query") == 0)
			ok = util_get_doc(x, "findAndModify", &it, &query);
		else if (strcmp(k, "sort") == 0) {
			ok = util_get_doc(x, "findAndModify", &it, &sort);
			have_sort = !bson_empty(&sort);
		} else if (strcmp(k, "fields") == 0) {
			ok = util_get_doc(x, "findAndModify", &it, &fields);
			have_fields = !bson_empty(&fields);
		} else if (strcmp(k, "remove") == 0)
			remove = bson_iter_as_bool(&it);
		else if (strcmp(k, "new") == 0)
			want_new = bson_iter_as_bool(&it);
		else if (strcmp(k, "upsert") == 0)
			upsert = bson_iter_as_bool(&it);
		else if (strcmp(k, "update") == 0) {
			update = it;
			have_update = true;
		} else if (strcmp(k, "arrayFilters") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			util_iter_copy(&it, &af);
			have_af = true;
		} else if (strcmp(k, "hint") == 0 &&
			   (BSON_ITER_HOLDS_UTF8(&it) || BSON_ITER_HOLDS_DOCUMENT(&it))) {
			hint = it;
			have_hint = true;
		}
	}
	if (!ok)
		goto out;
	if (remove && have_update) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE, "Cannot specify both an update and "
							"remove=true");
		goto out;
	}
	if (!remove && !have_update) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "Either an update or remove=true must be specified");
		goto out;
	}
	if (remove && want_new) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "Cannot specify both new=true and remove=true; 'remove' always returns "
			   "the deleted document");
		goto out;
	}
	if (remove && upsert) {
		shard_fail(x, WIRE_ERR_FAILED_TO_PARSE,
			   "Cannot specify both upsert=true and remove=true ");
		goto out;
	}
	int code = 0;
	if (have_fields &&
	    sdb_projection_new_vars(&fields, SDB_PROJECTION_FIND, shard_let(x), &proj, &code,
				    x->err, sizeof x->err) != 0) {
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		goto out;
	}
	if (!shard_txn_parse(x, &t, 1))
		goto out;
	if (!shard_begin(x, true) || !shard_txn_start(x, &t))
		goto out;
	bson_t *done = NULL;
	int seen = shard_txn_lookup(x, &t, 0, &done);
	if (seen < 0)
		goto out;
	if (seen == 1) { /* a retry: the recorded reply (pre/post image), not a second run */
		bson_t *again = bson_new();
		bson_copy_to_excluding_noinit(done, again, "ok", NULL);
		sdb_doc_free(done);
		if (shard_commit(x))
			wire_req_reply(x->req, again);
		else
			bson_destroy(again);
		goto out;
	}
	shard_txn_tag(x, &t, 0);
	bson_t *reply = bson_new();
	bson_t leo;
	const bson_t *value = NULL;
	bson_t *value_own = NULL;
	if (remove) {
		bson_t **docs = NULL;
		size_t n = 0;
		int rc = match_docs(x, coll, &query, have_sort ? &sort : NULL,
				    have_hint ? &hint : NULL, 1, &docs, &n, &code);
		if (rc == 0 && n == 1)
			rc = sdb_store_delete(x->conn, x->db, coll, docs[0], x->origin, x->err,
					      sizeof x->err);
		if (rc) {
			util_docs_free(docs, n);
			bson_destroy(reply);
			shard_fail(x, code ? code : WIRE_ERR_INTERNAL, "%s", x->err);
			goto out;
		}
		BSON_APPEND_DOCUMENT_BEGIN(reply, "lastErrorObject", &leo);
		BSON_APPEND_INT32(&leo, "n", (int32_t)n);
		bson_append_document_end(reply, &leo);
		if (n == 1)
			value_own = sdb_doc_copy(docs[0]);
		util_docs_free(docs, n);
	} else {
		upd_stmt s;
		memset(&s, 0, sizeof s);
		bson_copy_to(&query, &s.q);
		bson_init(&s.array_filters);
		if (have_af) {
			bson_destroy(&s.array_filters);
			bson_copy_to(&af, &s.array_filters);
			s.have_af = true;
		}
		s.u = update;
		s.have_u = true;
		s.upsert = upsert;
		s.multi = false;
		if (have_hint) {
			s.hint = hint;
			s.have_hint = true;
		}
		upd_result r;
		sdb_store_dup dup = {0};
		shard_valid sv;
		if (!shard_valid_open(x, coll, &sv)) {
			upd_stmt_destroy(&s);
			bson_destroy(reply);
			goto out;
		}
		code = run_update(x, coll, &s, have_sort ? &sort : NULL, true, &sv, &r, &dup);
		shard_valid_close(&sv);
		upd_stmt_destroy(&s);
		if (code) {
			upd_result_destroy(&r);
			bson_destroy(reply);
			fam_fail_dup(x, code, &dup);
			sdb_store_dup_clear(&dup);
			goto out;
		}
		sdb_store_dup_clear(&dup);
		BSON_APPEND_DOCUMENT_BEGIN(reply, "lastErrorObject", &leo);
		BSON_APPEND_INT32(&leo, "n", (int32_t)(r.matched + (r.upserted ? 1 : 0)));
		BSON_APPEND_BOOL(&leo, "updatedExisting", r.matched > 0);
		if (r.upserted)
			BSON_APPEND_VALUE(&leo, "upserted", &r.upserted_id);
		bson_append_document_end(reply, &leo);
		if (want_new && r.after)
			value_own = sdb_doc_copy(r.after);
		else if (!want_new && r.before)
			value_own = sdb_doc_copy(r.before);
		upd_result_destroy(&r);
	}
	value = value_own;
	if (value && proj) {
		bson_t *p = sdb_doc_new();
		sdb_projection_apply(proj, value, p, x->err, sizeof x->err);
		sdb_doc_free(value_own);
		value_own = p;
		value = p;
	}
	if (value)
		BSON_APPEND_DOCUMENT(reply, "value", value);
	else
		BSON_APPEND_NULL(reply, "value");
	if (value_own)
		sdb_doc_free(value_own);
	if (shard_txn_record(x, &t, 0, reply) != 0) {
		bson_destroy(reply);
		shard_fail(x, WIRE_ERR_INTERNAL, "findAndModify: %s", x->err);
		goto out;
	}
	if (!shard_commit(x)) {
		bson_destroy(reply);
		goto out;
	}
	wire_req_reply(x->req, reply);
out:
	shard_txn_free(&t);
	sdb_projection_free(proj);
	bson_destroy(&query);
	bson_destroy(&sort);
	bson_destroy(&fields);
	bson_destroy(&af);
}
