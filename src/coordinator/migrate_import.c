/* Steps registered and importing (DESIGN.md §6): the chunk is checked on the source, the
 * indexes are copied, then a point-in-time snapshot of the chunk is loaded into the target
 * and the forward replicator's start is placed (the session history window before the
 * snapshot, issue #16). See migrate.h for the states. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/migrate_int.h"

typedef struct ins_batch {
	bson_t arr;
	uint32_t n;
	size_t bytes;
	int64_t t0;       /* monotonic ms the snapshot was asked for */
	int64_t first_ms; /* ms until its first document arrived (0: none yet) */
} ins_batch;

static int flush_inserts(mig *m, ins_batch *b)
{
	if (b->n == 0)
		return 0;
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "insert", m->coll);
	BSON_APPEND_ARRAY(&cmd, "documents", &b->arr);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	int rc = mig_shard_run(m, m->dc, &cmd, NULL);
	bson_destroy(&cmd);
	bson_reinit(&b->arr);
	if (rc == 0) {
		m->imported += b->n;
		m->import_bytes += (int64_t)b->bytes;
	}
	b->n = 0;
	b->bytes = 0;
	return rc;
}

static int add_insert(mig *m, const bson_t *doc, void *arg)
{
	ins_batch *b = arg;
	int rc;
	if (b->first_ms == 0)
		b->first_ms = (int64_t)sdb_mono_ms() - b->t0 + 1;
	if (b->n && (b->n >= IMPORT_BATCH_DOCS || b->bytes + doc->len > APPLY_BATCH_BYTES) &&
	    (rc = flush_inserts(m, b)) != 0)
		return rc;
	if (m->imported > 0)
		mig_crash_point("mid", "import");
	/* the verification's view of the snapshot */
	if (!m->imp_over) {
		if (m->imp.n >= IMPORT_HASHES_MAX) {
			m->imp_over = true;
			mig_hashes_free(&m->imp);
		} else {
			mig_hashes_add_doc(&m->imp, doc);
		}
	}
	char k[16];
	snprintf(k, sizeof k, "%u", b->n++);
	BSON_APPEND_DOCUMENT(&b->arr, k, doc);
	b->bytes += doc->len;
	mig_keepalive(m);
	return 0;
}

/* Copy the collection's indexes from the source to the target (idempotent). */
static int copy_indexes(mig *m)
{
	bson_t cmd = BSON_INITIALIZER, reply, specs;
	bson_iter_t it, cur, fb;
	int rc;
	BSON_APPEND_UTF8(&cmd, "listIndexes", m->coll);
	rc = mig_shard_run(m, m->sc, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc) {
		if (m->code != 26) /* NamespaceNotFound: nothing to copy, create it empty */
			return rc;
		bson_init(&reply);
	}
	uint32_t n = 0;
	bson_init(&specs);
	if (bson_iter_init_find(&it, &reply, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "firstBatch") && bson_iter_recurse(&cur, &fb))
		while (bson_iter_next(&fb)) {
			bson_t ix, out;
			const uint8_t *data;
			uint32_t len;
			char name[256];
			if (!BSON_ITER_HOLDS_DOCUMENT(&fb))
				continue;
			bson_iter_document(&fb, &len, &data);
			bson_init_static(&ix, data, len);
			if (!mig_it_str(&ix, "name", name, sizeof name) || strcmp(name, "_id_") == 0)
				continue;
			char k[16];
			snprintf(k, sizeof k, "%u", n++);
			bson_init(&out);
			bson_copy_to_excluding_noinit(&ix, &out, "v", "ns", NULL);
			BSON_APPEND_DOCUMENT(&specs, k, &out);
			bson_destroy(&out);
		}
	bson_destroy(&reply);
	bson_t c2 = BSON_INITIALIZER;
	if (n) {
		BSON_APPEND_UTF8(&c2, "createIndexes", m->coll);
		BSON_APPEND_ARRAY(&c2, "indexes", &specs);
	} else {
		BSON_APPEND_UTF8(&c2, "create", m->coll);
	}
	BSON_APPEND_UTF8(&c2, "$stripedbOrigin", m->id);
	rc = mig_shard_run(m, m->dc, &c2, NULL);
	if (rc && n == 0 && m->code == 48) /* NamespaceExists */
		rc = 0;
	bson_destroy(&c2);
	bson_destroy(&specs);
	return rc;
}

/* Copy the collection's document validation options (validator, validationLevel,
 * validationAction; issue #20) from the source to the target with collMod (idempotent: it
 * sets them again), so that a shard that receives its first chunk of a collection enforces
 * what the others do. The migration's own writes carry $stripedbOrigin and are not checked.
 * Nothing to do when the source has none. */
static int copy_validation(mig *m)
{
	static const char *const fields[] = {"validator", "validationLevel", "validationAction"};
	bson_t cmd = BSON_INITIALIZER, filter, reply, mod = BSON_INITIALIZER;
	bson_iter_t it, cur, fb, opts, f;
	bool any = false;
	int rc;

	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &filter);
	BSON_APPEND_UTF8(&filter, "name", m->coll);
	bson_append_document_end(&cmd, &filter);
	rc = mig_shard_run(m, m->sc, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc)
		return rc;
	BSON_APPEND_UTF8(&mod, "collMod", m->coll);
	if (bson_iter_init_find(&it, &reply, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "firstBatch") && bson_iter_recurse(&cur, &fb) &&
	    bson_iter_next(&fb) && BSON_ITER_HOLDS_DOCUMENT(&fb) && bson_iter_recurse(&fb, &opts) &&
	    bson_iter_find(&opts, "options") && BSON_ITER_HOLDS_DOCUMENT(&opts))
		for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
			if (bson_iter_recurse(&opts, &f) && bson_iter_find(&f, fields[i])) {
				bson_append_iter(&mod, fields[i], -1, &f);
				any = true;
			}
	bson_destroy(&reply);
	if (any) {
		BSON_APPEND_UTF8(&mod, "$stripedbOrigin", m->id);
		rc = mig_shard_run(m, m->dc, &mod, NULL);
	}
	bson_destroy(&mod);
	return rc;
}

int mig_step_register(mig *m)
{
	char shard[64] = "";
	int64_t token = 0;
	int rc = mig_routing_chunk(m, shard, sizeof shard, &token);
	if (rc == SDB_ENOTFOUND)
		return mig_fail(m, m->err);
	if (rc)
		return rc;
	if (strcmp(shard, m->src) != 0) {
		char why[300];
		snprintf(why, sizeof why, "chunk %" PRId64 " is on %s, not on the source %s", m->chunk,
			 shard, m->src);
		return mig_fail(m, why);
	}
	m->token = token;
	if ((rc = mig_build_view(m)) != 0)
		return mig_fail(m, m->err);
	if ((rc = mig_connect_shards(m)) != 0)
		return rc;
	if ((rc = copy_indexes(m)) != 0 || (rc = copy_validation(m)) != 0)
		return rc;
	return mig_save(m, MIG_IMPORTING);
}

/* Where the forward replicator starts: spec.sessionHistoryMS (default 31 minutes: the
 * logical session timeout, 30, and a minute of slack) before the import's snapshot at,
 * so that the session records of retryable writes to the chunk that ran before the
 * snapshot travel too (their documents are in the snapshot: only the records are written,
 * repl_history). Events of that window are read from the source's CDC log; when the log
 * no longer reaches back that far (retention), the window starts at its oldest event (the
 * older history is not carried: *complete is cleared, and the caller marks the source's
 * sessions incomplete on the target). */
static uint64_t session_history_start(mig *m, uint64_t at, bool *complete)
{
	uint64_t secs = at >> 32, back = (uint64_t)(m->session_history_ms / 1000);
	uint64_t start = secs > back ? (secs - back) << 32 : 0;
	*complete = true;
	if (m->session_history_ms <= 0) {
		*complete = false;
		return at;
	}
	cdc_reader *rd = NULL;
	char err[256];
	int rc = cdc_reader_open(m->r->log, m->src, start, &rd, err, sizeof err);
	if (rd)
		cdc_reader_close(rd);
	if (rc != SDB_ENOTFOUND)
		return start;
	cdc_range g;
	if (cdc_log_range(m->r->log, m->src, &g, err, sizeof err) == 0 && g.first_ts > start &&
	    g.first_ts < at) {
		rc = cdc_reader_open(m->r->log, m->src, g.first_ts, &rd, err, sizeof err);
		if (rd)
			cdc_reader_close(rd);
		if (rc == 0)
			start = g.first_ts;
		else
			start = at;
	} else {
		start = at;
	}
	sdb_warn("migration: session history not carried in full", "id=%s from_ts=%u:%u",
		 m->id, (unsigned)(start >> 32), (unsigned)start);
	*complete = false;
	return start;
}

/* The session history before the import could not be carried in full: every session live
 * on the source gets an incomplete-history marker for its txnNumber on the target
 * (MongoDB's dead-end sentinel of a truncated history), so a retry there of one of its
 * statements that has no record is refused (217) instead of running a second time. */
static int mark_unknown_sessions(mig *m)
{
	bson_t *after = NULL;
	int rc = 0;
	int64_t marked = 0;
	for (;;) {
		bson_t cmd = BSON_INITIALIZER, reply, recs = BSON_INITIALIZER;
		bson_iter_t it, arr;
		uint32_t n = 0;
		bool more = false;
		BSON_APPEND_INT32(&cmd, "stripedbSessionList", 1);
		BSON_APPEND_INT32(&cmd, "limit", 1000);
		if (after)
			BSON_APPEND_DOCUMENT(&cmd, "after", after);
		rc = mig_shard_run(m, m->sc, &cmd, &reply);
		bson_destroy(&cmd);
		if (rc) {
			bson_destroy(&recs);
			break;
		}
		if (bson_iter_init_find(&it, &reply, "sessions") && bson_iter_recurse(&it, &arr))
			while (bson_iter_next(&arr)) {
				bson_t d;
				mig_sess s;
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				const uint8_t *data;
				uint32_t len;
				bson_iter_document(&arr, &len, &data);
				if (!bson_init_static(&d, data, len))
					continue;
				mig_sess_of_event(&d, &s);
				if (!s.on)
					continue;
				mig_sess_append_record(&recs, n++, &s, true);
				if (after)
					bson_destroy(after);
				after = bson_copy(&s.lsid);
			}
		more = bson_iter_init_find(&it, &reply, "more") && bson_iter_as_bool(&it);
		bson_destroy(&reply);
		if (n) {
			bson_t up = BSON_INITIALIZER, none = BSON_INITIALIZER;
			BSON_APPEND_UTF8(&up, "update", m->coll);
			BSON_APPEND_ARRAY(&up, "updates", &none);
			BSON_APPEND_BOOL(&up, "ordered", true);
			BSON_APPEND_UTF8(&up, "$stripedbOrigin", m->id);
			BSON_APPEND_ARRAY(&up, "$stripedbSessions", &recs);
			rc = mig_shard_run(m, m->dc, &up, NULL);
			bson_destroy(&up);
			bson_destroy(&none);
			marked += n;
		}
		bson_destroy(&recs);
		if (rc || !more || !n)
			break;
		mig_keepalive(m);
	}
	if (after)
		bson_destroy(after);
	if (rc == 0 && marked)
		sdb_warn("migration: sessions marked with incomplete history on the target",
			 "id=%s sessions=%" PRId64, m->id, marked);
	return rc;
}

/* Is migration id on the runner's list of imports not to sort (struct migrate_runner)? */
static bool sortless(migrate_runner *r, const char *id)
{
	bool found = false;
	pthread_mutex_lock(&r->mu);
	for (size_t i = 0; i < r->nsortless && !found; i++)
		found = strcmp(r->sortless[i], id) == 0;
	pthread_mutex_unlock(&r->mu);
	return found;
}

static void add_sortless(migrate_runner *r, const char *id)
{
	if (sortless(r, id))
		return;
	pthread_mutex_lock(&r->mu);
	r->sortless = sdb_realloc(r->sortless, (r->nsortless + 1) * sizeof *r->sortless);
	r->sortless[r->nsortless++] = sdb_strdup(id);
	pthread_mutex_unlock(&r->mu);
}

int mig_step_import(mig *m)
{
	int rc;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	int64_t t0 = (int64_t)sdb_mono_ms();
	/* a restarted import starts from a clean target */
	if ((rc = mig_delete_chunk(m, m->dc)) != 0)
		return rc;
	m->imported = m->import_bytes = 0;
	mig_hashes_free(&m->imp);
	m->imp_ts = 0;
	m->imp_over = false;
	ins_batch b = {.n = 0};
	bson_init(&b.arr);
	bson_t sort = BSON_INITIALIZER;
	bool by_id = m->import_order == MIG_ORDER_ID ||
		     (m->import_order == MIG_ORDER_INDEX && m->rc->hashed);
	bool arrival = m->import_order == MIG_ORDER_ARRIVAL;
	if (by_id && sortless(m->r, m->id)) {
		sdb_warn("migration: importing in arrival order (sorting by _id took too long "
			 "before)", "id=%s", m->id);
		by_id = false;
		arrival = true;
	}
	if (by_id) {
		/* the target's clustering key: appends to the embedded store's _id B-tree */
		BSON_APPEND_INT32(&sort, "_id", 1);
	} else if (m->import_order == MIG_ORDER_INDEX) {
		/* the shard-key index order (locality in that index on the target) */
		for (size_t i = 0; i < m->rc->nkeys; i++)
			BSON_APPEND_INT32(&sort, m->rc->keys[i], 1);
	}
	uint64_t at = 0;
	b.t0 = (int64_t)sdb_mono_ms();
	rc = mig_scan_chunk(m, m->sc, arrival ? NULL : &sort, NULL, &at, add_insert, &b);
	if (by_id && (b.first_ms == 0 ? (int64_t)sdb_mono_ms() - b.t0 : b.first_ms - 1) >
			     m->r->lease_ms / 2) {
		/* one call that long stalls the import (the lease survives it: its own
		 * thread renews it), and a retry would wait as long again */
		sdb_warn("migration: sorting the chunk by _id on the source took over half the "
			 "lease before the first batch; a retry imports in arrival order",
			 "id=%s first_batch_ms=%" PRId64 " lease_ms=%" PRId64, m->id,
			 b.first_ms == 0 ? (int64_t)sdb_mono_ms() - b.t0 : b.first_ms - 1,
			 m->r->lease_ms);
		add_sortless(m->r, m->id);
	}
	if (rc != 0 && by_id && m->code == 292 && m->imported == 0 && b.n == 0) {
		/* the source sorts by _id in memory (the chunk is read through its shard-key
		 * index) and refused a chunk over its blocking-sort limit before returning a
		 * document: take its scan order instead */
		sdb_warn("migration: chunk too big to sort by _id, importing in arrival order",
			 "id=%s", m->id);
		rc = mig_scan_chunk(m, m->sc, NULL, NULL, &at, add_insert, &b);
	}
	if (rc == 0)
		rc = flush_inserts(m, &b);
	bson_destroy(&b.arr);
	bson_destroy(&sort);
	if (rc)
		return rc;
	m->import_ts = at;
	if (!m->imp_over) {
		mig_hashes_sort_unique(&m->imp);
		m->imp_ts = at;
	}
	bool complete = true;
	uint64_t start = session_history_start(m, at, &complete);
	if (!complete && (rc = mark_unknown_sessions(m)) != 0)
		return rc;
	m->ts = m->fwd.pos = start;
	m->import_ms = (int64_t)sdb_mono_ms() - t0;
	sdb_info("migration imported", "id=%s docs=%" PRId64 " bytes=%" PRId64 " ms=%" PRId64,
		 m->id, m->imported, m->import_bytes, m->import_ms);
	return mig_save(m, MIG_REPLICATING);
}
