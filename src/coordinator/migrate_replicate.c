/* The CDC replicator of a migration (both directions) and the step replicating: the
 * source's events for the chunk are applied to the target idempotently, with the session
 * records of retryable writes (migrate_sess.h). See migrate.h for the states. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "coordinator/migrate_int.h"

/* ------------------------------------------------------------ replication */

static void repl_reset_batch(repl *p)
{
	bson_reinit(&p->batch);
	p->nbatch = 0;
	p->batch_bytes = 0;
	bson_reinit(&p->recs);
	p->nrecs = 0;
}

/* Statements or records waiting for repl_flush. */
static bool repl_pending(const repl *p)
{
	return p->nbatch || p->nrecs;
}

static int repl_flush(mig *m, repl *p)
{
	if (!repl_pending(p)) {
		if (p->batch_pos > p->pos)
			p->pos = p->batch_pos;
		return 0;
	}
	/* one command, one transaction on the target: the session records alone first,
	 * then the replayed statements (each with its own record, if any) */
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "update", m->coll);
	BSON_APPEND_ARRAY(&cmd, "updates", &p->batch);
	BSON_APPEND_BOOL(&cmd, "ordered", true);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	if (p->nrecs)
		BSON_APPEND_ARRAY(&cmd, "$stripedbSessions", &p->recs);
	int rc = mig_shard_run(m, p->to, &cmd, NULL);
	bson_destroy(&cmd);
	if (rc)
		return rc; /* the batch stays; retried */
	p->applied += p->nbatch;
	repl_reset_batch(p);
	p->pos = p->batch_pos;
	if (m->state == MIG_REPLICATING)
		mig_crash_point("mid", "replicate");
	return 0;
}

/* Delete _id on the replica when its document there belongs to the chunk; the delete
 * carries the source statement's session record when sess has one. */
static int repl_delete(mig *m, repl *p, const bson_iter_t *idit, const mig_sess *sess)
{
	bson_t q = BSON_INITIALIZER;
	int rc = 0;
	bool del = false;
	bson_append_iter(&q, "_id", 3, idit);
	if (mig_key_is_id(m)) {
		del = mig_in_chunk(m, &q);
	} else {
		bson_t cmd = BSON_INITIALIZER, reply, cur;
		bson_iter_t it, fb;
		BSON_APPEND_UTF8(&cmd, "find", m->coll);
		BSON_APPEND_DOCUMENT(&cmd, "filter", &q);
		BSON_APPEND_INT32(&cmd, "limit", 1);
		BSON_APPEND_BOOL(&cmd, "singleBatch", true);
		rc = mig_shard_run(m, p->to, &cmd, &reply);
		bson_destroy(&cmd);
		if (rc == 0) {
			if (mig_it_doc(&reply, "cursor", &cur) && bson_iter_init_find(&it, &cur, "firstBatch") &&
			    bson_iter_recurse(&it, &fb) && bson_iter_next(&fb) &&
			    BSON_ITER_HOLDS_DOCUMENT(&fb)) {
				bson_t d;
				const uint8_t *data;
				uint32_t len;
				bson_iter_document(&fb, &len, &data);
				bson_init_static(&d, data, len);
				del = mig_in_chunk(m, &d);
			}
			bson_destroy(&reply);
		}
	}
	if (rc == 0 && del) {
		bson_t cmd = BSON_INITIALIZER, arr, s;
		BSON_APPEND_UTF8(&cmd, "delete", m->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "deletes", &arr);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &s);
		BSON_APPEND_DOCUMENT(&s, "q", &q);
		BSON_APPEND_INT32(&s, "limit", 1);
		if (sess && sess->have_result)
			mig_sess_append_stmt(&s, sess);
		bson_append_document_end(&arr, &s);
		bson_append_array_end(&cmd, &arr);
		BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
		rc = mig_shard_run(m, p->to, &cmd, NULL);
		bson_destroy(&cmd);
		if (rc == 0)
			p->applied++;
	}
	bson_destroy(&q);
	return rc;
}

/* Skip an event: the position moves with it once nothing before it is pending. */
static int repl_skip(repl *p, uint64_t ts)
{
	p->skipped++;
	p->batch_pos = ts;
	if (!repl_pending(p))
		p->pos = ts;
	return 0;
}

/* A statement whose replay and record together would not fit in one command (16 MiB
 * BSON): its record is replaced by its session's incomplete-history marker (a retry is
 * refused, never run twice). */
#define SESS_RECORD_MAX_BYTES (15u << 20)

/* Queue a session record alone (or the session's incomplete-history marker). */
static void repl_add_record(repl *p, const mig_sess *sess, bool incomplete)
{
	if (sess->have_result && sess->result.len > SESS_RECORD_MAX_BYTES)
		incomplete = true;
	mig_sess_append_record(&p->recs, p->nrecs++, sess, incomplete);
	p->batch_bytes += sess->lsid.len + (sess->have_result ? sess->result.len : 0) + 64;
}

/* An event of a retryable write older than the import's snapshot (its document is already
 * on the target): only its session record travels, when the statement touched the chunk.
 * A delete whose chunk cannot be told (the shard key is not _id and the document is gone)
 * marks its session's history incomplete on the target. */
static int repl_history(mig *m, repl *p, uint64_t ts, const char *op, const bson_t *o,
			const mig_sess *sess)
{
	bool in, known = true;
	if (op[0] == 'd') {
		bson_iter_t it;
		bson_t q = BSON_INITIALIZER;
		if (bson_iter_init_find(&it, o, "_id"))
			bson_append_iter(&q, "_id", 3, &it);
		known = mig_key_is_id(m);
		in = known && mig_in_chunk(m, &q);
		bson_destroy(&q);
	} else {
		in = mig_in_chunk(m, o);
	}
	if (known && !in)
		return repl_skip(p, ts);
	int rc;
	if (p->nrecs >= APPLY_BATCH_DOCS && (rc = repl_flush(m, p)) != 0)
		return rc;
	repl_add_record(p, sess, !known);
	p->batch_pos = ts;
	return 0;
}

/* Apply one event (already known to be after p->pos). Returns 0 or an error (the event
 * must then be retried: it is kept pending by the caller). */
static int repl_event(mig *m, repl *p, uint64_t ts, const uint8_t *data, size_t len)
{
	bson_t e, o;
	bson_iter_t it;
	char op[4] = "", ns[256] = "", origin[128] = "";
	int rc;
	if (!bson_init_static(&e, data, len))
		return sdb_errf(m->err, sizeof m->err, SDB_ECORRUPT, "bad CDC event");
	mig_it_str(&e, "op", op, sizeof op);
	mig_it_str(&e, "ns", ns, sizeof ns);
	mig_it_str(&e, "origin", origin, sizeof origin);
	if (strcmp(ns, m->ns) != 0 || strcmp(origin, m->id) == 0 ||
	    (strcmp(op, "i") && strcmp(op, "u") && strcmp(op, "d")) || !mig_it_doc(&e, "o", &o))
		return repl_skip(p, ts);
	mig_sess sess;
	mig_sess_of_event(&e, &sess);
	bool too_big = sess.have_result && (size_t)o.len + sess.result.len > SESS_RECORD_MAX_BYTES;
	if (p == &m->fwd && ts <= m->import_ts) {
		/* the session history window before the import's snapshot */
		if (!sess.on)
			return repl_skip(p, ts);
		return repl_history(m, p, ts, op, &o, &sess);
	}
	if (op[0] == 'd' || (op[0] == 'u' && !mig_in_chunk(m, &o))) {
		/* a delete (or an update that left the chunk): in order with the batch */
		bool with_record = op[0] == 'd' && sess.have_result && !too_big;
		if (op[0] == 'd' && sess.on && !with_record)
			repl_add_record(p, &sess, true);
		if ((rc = repl_flush(m, p)) != 0)
			return rc;
		if (!bson_iter_init_find(&it, &o, "_id"))
			return 0;
		if ((rc = repl_delete(m, p, &it, with_record ? &sess : NULL)) != 0)
			return rc;
		p->pos = p->batch_pos = ts;
		return 0;
	}
	if (!mig_in_chunk(m, &o))
		return repl_skip(p, ts);
	size_t extra = sess.have_result && !too_big ? sess.result.len + sess.lsid.len + 64 : 0;
	if (repl_pending(p) &&
	    (p->nbatch >= APPLY_BATCH_DOCS || p->nrecs >= APPLY_BATCH_DOCS ||
	     p->batch_bytes + o.len + extra > APPLY_BATCH_BYTES) &&
	    (rc = repl_flush(m, p)) != 0)
		return rc;
	if (!bson_iter_init_find(&it, &o, "_id"))
		return 0;
	bson_t s, q;
	char k[16];
	snprintf(k, sizeof k, "%u", p->nbatch++);
	BSON_APPEND_DOCUMENT_BEGIN(&p->batch, k, &s);
	BSON_APPEND_DOCUMENT_BEGIN(&s, "q", &q);
	bson_append_iter(&q, "_id", 3, &it);
	bson_append_document_end(&s, &q);
	BSON_APPEND_DOCUMENT(&s, "u", &o);
	BSON_APPEND_BOOL(&s, "upsert", true);
	if (sess.have_result && !too_big)
		mig_sess_append_stmt(&s, &sess);
	else if (sess.on)
		repl_add_record(p, &sess, true); /* a write whose outcome is unknown or too big */
	bson_append_document_end(&p->batch, &s);
	p->batch_bytes += o.len + extra;
	p->batch_pos = ts;
	return 0;
}

void mig_repl_close(repl *p)
{
	if (p->rd)
		cdc_reader_close(p->rd);
	p->rd = NULL;
	free(p->pend.data);
	memset(&p->pend, 0, sizeof p->pend);
	/* unapplied statements are read again from the log after pos */
	if (repl_pending(p))
		repl_reset_batch(p);
	p->batch_pos = p->pos;
}

/* Run the replicator until its position reaches `until` (0: until a poll finds nothing),
 * or until deadline_ms (monotonic; 0 = none). Returns 0 when reached (p->caught_up tells
 * whether the log was drained), SDB_ETIMEOUT at the deadline, or an error (target down:
 * SDB_EUNAVAILABLE; the position never moves past an unapplied event). */
int mig_repl_run(mig *m, repl *p, uint64_t start, uint64_t until, int64_t deadline_ms)
{
	int rc;
	if (!p->rd) {
		if (p->pos < start)
			p->pos = start;
		p->batch_pos = p->pos;
		if (!p->batch.len)
			bson_init(&p->batch);
		if (!p->recs.len)
			bson_init(&p->recs);
		rc = cdc_reader_open(m->r->log, p->shard, p->pos, &p->rd, m->err, sizeof m->err);
		if (rc)
			return rc;
	}
	p->caught_up = false;
	for (;;) {
		if (mig_stopping(m))
			return sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
		if (until && p->pos >= until && !repl_pending(p))
			return 0;
		if (deadline_ms && (int64_t)sdb_mono_ms() >= deadline_ms) {
			(void)repl_flush(m, p);
			return (until && p->pos >= until) ? 0 : SDB_ETIMEOUT;
		}
		if (!p->pend.have) {
			cdc_event ev;
			rc = cdc_reader_next(p->rd, &ev, until ? 20 : 100, m->err, sizeof m->err);
			if (rc < 0)
				return rc;
			if (rc == 0) {
				if ((rc = repl_flush(m, p)) != 0)
					return rc;
				if (!until) {
					p->caught_up = true;
					return 0;
				}
				continue;
			}
			if (ev.len > p->pend.cap) {
				p->pend.cap = ev.len;
				p->pend.data = sdb_realloc(p->pend.data, ev.len);
			}
			memcpy(p->pend.data, ev.data, ev.len);
			p->pend.len = ev.len;
			p->pend.ts = ev.ts;
			p->pend.have = true;
		}
		if (p->pend.ts <= p->batch_pos) { /* already applied (resume) */
			p->pend.have = false;
			continue;
		}
		if (until && p->pend.ts > until) {
			/* beyond the stop position: keep it pending */
			if ((rc = repl_flush(m, p)) != 0)
				return rc;
			if (p->pos < until)
				p->pos = until;
			return 0;
		}
		rc = repl_event(m, p, p->pend.ts, p->pend.data, p->pend.len);
		if (rc)
			return rc;
		p->pend.have = false;
		mig_keepalive(m);
		if (m->apply_rate > 0) {
			/* throttle: at most apply_rate events per second */
			int64_t now = (int64_t)sdb_mono_ms();
			if (now - m->rate_t0 >= 1000) {
				m->rate_t0 = now;
				m->rate_n = 0;
			}
			if (++m->rate_n >= m->apply_rate) {
				(void)repl_flush(m, p);
				mig_nap(m, 1000 - ((int64_t)sdb_mono_ms() - m->rate_t0));
			}
		}
	}
}

/* Catch up with the head of the source's CDC log as it is now (events keep arriving under
 * load, so "a poll found nothing" is not the test), and with the source's oplog head when
 * src is given: the publisher publishes every oplog entry, so the log reaches that head
 * once it has caught up with the source itself. Without it, a coordinator that took over
 * while the source's publisher was still down (its lease held by the crashed holder)
 * declared replication caught up with a log older than the import and went on to verify
 * (test_coordinator_killed_at_every_step_boundary_and_mid_step, mid:replicate).
 * p->caught_up when the position reached that head before deadline_ms. Returns 0,
 * SDB_ETIMEOUT or an error of repl_run or of reading the oplog head. */
int mig_repl_catch_up(mig *m, repl *p, uint64_t start, mongoc_client_t *src,
		      int64_t deadline_ms)
{
	cdc_range g;
	uint64_t oplog_head = 0;
	int rc = cdc_log_range(m->r->log, p->shard, &g, m->err, sizeof m->err);
	if (rc == 0 && src)
		rc = mig_oplog_head(m, src, &oplog_head);
	if (rc)
		return rc;
	uint64_t head = g.last_ts > oplog_head ? g.last_ts : oplog_head;
	if (head <= (p->pos > start ? p->pos : start)) {
		rc = mig_repl_run(m, p, start, 0, deadline_ms);
		return rc;
	}
	rc = mig_repl_run(m, p, start, head, deadline_ms);
	p->caught_up = rc == 0;
	return rc;
}

int mig_step_replicate(mig *m)
{
	int rc;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if (mig_catchup_paused(m))
		return 0;
	rc = mig_repl_catch_up(m, &m->fwd, m->ts, m->sc, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT)
		rc = 0;
	if (rc == SDB_ENOTFOUND)
		return mig_fail(m, m->err);
	if (rc == 0 && m->fwd.caught_up) {
		m->lag_since = 0;
		return mig_save(m, MIG_VERIFYING);
	}
	/* a write rate the target cannot match: abort cleanly instead of lagging forever */
	if (m->lag_since == 0)
		m->lag_since = (int64_t)sdb_mono_ms();
	if (rc == 0 && (int64_t)sdb_mono_ms() - m->lag_since > m->max_catchup_ms) {
		char why[200];
		snprintf(why, sizeof why,
			 "replication could not catch up with the source within maxCatchUpMS=%" PRId64,
			 m->max_catchup_ms);
		return mig_fail(m, why);
	}
	if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS) {
		int r2 = mig_save(m, m->state);
		if (rc == 0)
			rc = r2;
	}
	return rc;
}
