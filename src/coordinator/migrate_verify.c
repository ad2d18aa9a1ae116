/* Step verifying: the chunk on the source at position P and on the target (after
 * replaying up to P) compared as (_id, XXH64 of the document) in _id order.
 *
 * The source's side (issue #17) is built without reading the chunk again when it can be:
 * the hashes the import recorded at T (m->imp), with every _id that the SOURCE SHARD'S OWN
 * OPLOG (local.oplog.rs, not the CDC log the replicator reads) shows changed in the
 * namespace in (T, P] replaced by its state at P, read from the source by _id. The whole
 * chunk is read again (the "full" mode, as before) when the import's hashes are not here
 * (coordinator restarted, more than IMPORT_HASHES_MAX documents), when
 * the oplog no longer reaches back to T, when it holds a command entry of the database
 * (drop, rename, ...), or when at least as many _ids changed as the import loaded. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/migrate_int.h"
#include "common/bsonval.h"

/* _ids per snapshot read of the changed documents */
#define CHANGED_BATCH 1000

static int collect(mig *m, const bson_t *doc, void *arg)
{
	(void)m;
	mig_hashes_add_doc(arg, doc);
	return 0;
}

static void describe_id(const bson_value_t *v, char *out, size_t n)
{
	bson_t d = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&d, "_id", v);
	char *j = bson_as_relaxed_extended_json(&d, NULL);
	snprintf(out, n, "%s", j ? j : "?");
	bson_free(j);
	bson_destroy(&d);
}

/* Run cmd (a find-shaped command answering a cursor) on database db of shard c and call
 * fn for every document, pinned to one server for its getMores. With at: *at = the
 * reply's cursor.atOplogTs (stripedbSnapshot), set before the first fn call. Errors:
 * SDB_EUNAVAILABLE (the command or a getMore failed), SDB_ECANCELED, fn's non-zero. */
static int cursor_each(mig *m, mongoc_client_t *c, const char *db, const bson_t *cmd,
		       uint64_t *at, doc_fn fn, void *arg)
{
	bson_error_t e;
	mongoc_cursor_t *cs;
	int rc = mig_cursor_open(m, c, db, cmd, at, "verify", &cs);
	if (rc)
		return rc;
	const bson_t *doc;
	while (rc == 0 && mongoc_cursor_next(cs, &doc)) {
		rc = fn(m, doc, arg);
		mig_keepalive(m); /* renews mig/<id> when a third of its ttl passed */
		if (rc == 0 && mig_stopping(m))
			rc = sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
	}
	if (rc == 0 && mongoc_cursor_error(cs, &e))
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "verify: %s", e.message);
	mongoc_cursor_destroy(cs);
	return rc;
}

/* What an oplog read collects: the namespace's changed _ids in oplog order (with_images:
 * their state after each entry, from the entry's full post-image; otherwise state
 * unknown, present false), the entries read, and whether an entry was one this
 * verification cannot follow (a command of the database, an update without a full
 * post-image). */
typedef struct oplog_acc {
	mig_hashes *ch;
	bool with_images;
	int64_t entries;
	bool unsupported;
} oplog_acc;

static int on_oplog_entry(mig *m, const bson_t *e, void *arg)
{
	oplog_acc *a = arg;
	char op[4] = "";
	bson_t o, o2;
	bson_iter_t it;
	a->entries++;
	mig_it_str(e, "op", op, sizeof op);
	uint64_t ts = mig_it_ts(e, "ts");
	if (strcmp(op, "n") == 0)
		return 0;
	bool ins = strcmp(op, "i") == 0, upd = strcmp(op, "u") == 0, del = strcmp(op, "d") == 0;
	if (!(ins || upd || del) || !mig_it_doc(e, "o", &o)) {
		a->unsupported = true;
		return 0;
	}
	/* the _id: o2._id of an update, o._id otherwise (an update's o is the full
	 * post-image, src/shard/README.md "Oplog": it carries the _id too) */
	if (upd && mig_it_doc(e, "o2", &o2) && bson_iter_init_find(&it, &o2, "_id"))
		;
	else if (!bson_iter_init_find(&it, &o, "_id")) {
		a->unsupported = true;
		return 0;
	}
	bool present = false;
	uint64_t hash = 0;
	if (a->with_images && !del) {
		bson_iter_t oi;
		if (!bson_iter_init_find(&oi, &o, "_id")) {
			a->unsupported = true;
			return 0;
		}
		present = mig_in_chunk(m, &o);
		hash = present ? mig_doc_hash(&o) : 0;
	}
	mig_hashes_add(a->ch, bson_iter_value(&it), hash, present, ts);
	return 0;
}

/* Oplog entries per find: bounds what the shard holds in memory for one reply (its
 * non-tailable oplog find materializes its matches) and what it scans per command. */
#define OPLOG_PAGE 10000

/* One page of an oplog read: the accumulator, the last entry's ts and the entries. */
typedef struct oplog_page {
	oplog_acc *a;
	uint64_t last;
	int64_t n;
} oplog_page;

static int last_ts_fn(mig *m, const bson_t *e, void *arg)
{
	oplog_page *pg = arg;
	pg->n++;
	pg->last = mig_it_ts(e, "ts");
	return on_oplog_entry(m, e, pg->a);
}

/* The source shard's oplog entries of m->ns (and commands of m->db) with ts in
 * (after, upto], into a (see oplog_acc), OPLOG_PAGE entries a find. Stops early (setting
 * a->unsupported) when more distinct _ids changed than `most` (0: no limit): reading the
 * chunk again is then no dearer. Errors: as cursor_each. */
static int read_oplog(mig *m, uint64_t after, uint64_t upto, oplog_acc *a, size_t most)
{
	char cmdns[160];
	snprintf(cmdns, sizeof cmdns, "%s.$cmd", m->db);
	for (;;) {
		bson_t cmd = BSON_INITIALIZER, f, r, in;
		BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
		BSON_APPEND_DOCUMENT_BEGIN(&f, "ts", &r);
		BSON_APPEND_TIMESTAMP(&r, "$gt", (uint32_t)(after >> 32), (uint32_t)after);
		BSON_APPEND_TIMESTAMP(&r, "$lte", (uint32_t)(upto >> 32), (uint32_t)upto);
		bson_append_document_end(&f, &r);
		BSON_APPEND_DOCUMENT_BEGIN(&f, "ns", &r);
		BSON_APPEND_ARRAY_BEGIN(&r, "$in", &in);
		BSON_APPEND_UTF8(&in, "0", m->ns);
		BSON_APPEND_UTF8(&in, "1", cmdns);
		bson_append_array_end(&r, &in);
		bson_append_document_end(&f, &r);
		bson_append_document_end(&cmd, &f);
		BSON_APPEND_INT32(&cmd, "limit", OPLOG_PAGE);
		BSON_APPEND_INT32(&cmd, "batchSize", 1000);
		oplog_page pg = {.a = a};
		int rc = cursor_each(m, m->sc, "local", &cmd, NULL, last_ts_fn, &pg);
		bson_destroy(&cmd);
		if (rc || a->unsupported)
			return rc;
		if (most && a->ch->n > most) {
			mig_hashes_sort_unique(a->ch);
			if (a->ch->n > most) {
				a->unsupported = true;
				return 0;
			}
		}
		if (pg.n < OPLOG_PAGE || pg.last <= after)
			return 0;
		after = pg.last;
		mig_keepalive(m);
	}
}

static int oldest_fn(mig *m, const bson_t *e, void *arg)
{
	(void)m;
	uint64_t *ts = arg;
	if (!*ts)
		*ts = mig_it_ts(e, "ts");
	return 0;
}

/* The oldest entry still in the source's oplog (0: empty). Errors: as cursor_each. */
static int oplog_oldest(mig *m, uint64_t *ts)
{
	bson_t cmd = BSON_INITIALIZER, f = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
	BSON_APPEND_DOCUMENT(&cmd, "filter", &f);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	*ts = 0;
	int rc = cursor_each(m, m->sc, "local", &cmd, NULL, oldest_fn, ts);
	bson_destroy(&cmd);
	return rc;
}

/* A snapshot read of a batch of changed _ids: each found document's state replaces the
 * unknown one (present when it lies in the chunk). */
typedef struct read_acc {
	mig_hashes *ch;
	int64_t read;
} read_acc;

static int on_changed_doc(mig *m, const bson_t *doc, void *arg)
{
	read_acc *a = arg;
	bson_iter_t it;
	a->read++;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return 0;
	ptrdiff_t k = mig_hashes_find(a->ch, bson_iter_value(&it));
	if (k < 0)
		return 0;
	a->ch->v[k].present = mig_in_chunk(m, doc);
	a->ch->v[k].hash = a->ch->v[k].present ? mig_doc_hash(doc) : 0;
	return 0;
}

/* Read ch->v[from, to) from a snapshot of the source: every entry's ts becomes the
 * snapshot's position (*at), present only when found and in the chunk. */
static int read_changed(mig *m, mig_hashes *ch, size_t from, size_t to, uint64_t *at,
			int64_t *read)
{
	bson_t cmd = BSON_INITIALIZER, f, idf, in;
	BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", m->coll);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
	BSON_APPEND_DOCUMENT_BEGIN(&f, "_id", &idf);
	BSON_APPEND_ARRAY_BEGIN(&idf, "$in", &in);
	for (size_t i = from; i < to; i++) {
		char k[24];
		snprintf(k, sizeof k, "%zu", i - from);
		BSON_APPEND_VALUE(&in, k, &ch->v[i].id);
		ch->v[i].present = false;
		ch->v[i].hash = 0;
	}
	bson_append_array_end(&idf, &in);
	bson_append_document_end(&f, &idf);
	bson_append_document_end(&cmd, &f);
	BSON_APPEND_INT32(&cmd, "batchSize", 1000);
	read_acc a = {.ch = ch};
	int rc = cursor_each(m, m->sc, m->db, &cmd, at, on_changed_doc, &a);
	bson_destroy(&cmd);
	*read += a.read;
	for (size_t i = from; rc == 0 && i < to; i++)
		ch->v[i].ts = *at;
	return rc;
}

/* The source's expected content at *at without reading the chunk: see the top of this
 * file. *usable false (and nothing in *out): fall back to the full read. Errors: as
 * cursor_each and mig_oplog_head. */
static int source_from_import(mig *m, mig_hashes *out, uint64_t *at, bool *usable)
{
	mig_hashes ch = {0}, tail = {0}, add = {0};
	uint64_t t = m->import_ts, head = 0, oldest = 0;
	int rc;
	*usable = false;
	if (m->imp_over || m->imp_ts != t || t == 0)
		return 0;
	if ((rc = mig_oplog_head(m, m->sc, &head)) != 0)
		return rc;
	if (head < t)
		head = t;
	oplog_acc a = {.ch = &ch};
	if (head > t && (rc = read_oplog(m, t, head, &a, m->imp.n)) != 0)
		goto out;
	/* the oplog is trimmed from its oldest end: if its oldest entry is still at or before
	 * T after the read, the read saw every entry after T */
	if ((rc = oplog_oldest(m, &oldest)) != 0)
		goto out;
	m->verify_oplog = a.entries;
	if (a.unsupported || oldest == 0 || oldest > t)
		goto out;
	mig_hashes_sort_unique(&ch);
	if (ch.n >= m->imp.n && ch.n > 0) /* reading the chunk again costs no more */
		goto out;
	uint64_t p = head;
	int64_t read = 0;
	for (size_t i = 0; i < ch.n; i += CHANGED_BATCH) {
		uint64_t pb = 0;
		size_t to = i + CHANGED_BATCH < ch.n ? i + CHANGED_BATCH : ch.n;
		if ((rc = read_changed(m, &ch, i, to, &pb, &read)) != 0)
			goto out;
		if (pb > p)
			p = pb;
		mig_keepalive(m);
	}
	/* writes between the oplog read (head) and the snapshots (up to p): each _id changed
	 * after the position it was read at (or not read at all) takes its state at p from
	 * its last entry's full post-image */
	int64_t post = 0;
	if (p > head) {
		oplog_acc b = {.ch = &tail, .with_images = true};
		if ((rc = read_oplog(m, head, p, &b, 0)) != 0)
			goto out;
		m->verify_oplog += b.entries;
		if (b.unsupported)
			goto out;
		for (size_t i = 0; i < tail.n; i++) {
			mig_hash *e = &tail.v[i];
			ptrdiff_t k = mig_hashes_find(&ch, &e->id);
			if (k < 0) {
				mig_hashes_add(&add, &e->id, e->hash, e->present, e->ts);
			} else if (ch.v[k].ts < e->ts) {
				ch.v[k].hash = e->hash;
				ch.v[k].present = e->present;
				ch.v[k].ts = e->ts;
				post++;
			}
		}
		if (add.n) {
			for (size_t i = 0; i < add.n; i++)
				mig_hashes_add(&ch, &add.v[i].id, add.v[i].hash, add.v[i].present,
					       add.v[i].ts);
			/* `add` is in oplog order: after the sort each new _id keeps its last */
			post += (int64_t)add.n;
			mig_hashes_sort_unique(&ch);
		}
	}
	mig_hashes_merge(&m->imp, &ch, out);
	m->verify_changed = (int64_t)ch.n;
	m->verify_read = read;
	m->verify_post = post;
	*at = p;
	*usable = true;
out:
	mig_hashes_free(&ch);
	mig_hashes_free(&tail);
	mig_hashes_free(&add);
	return rc;
}

int mig_step_verify(mig *m)
{
	int rc;
	mig_hashes s = {0}, t = {0};
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if (mig_paused(m)) {
		mig_nap(m, 100);
		return 0;
	}
	uint64_t at = 0;
	bool usable = false;
	m->verify_oplog = m->verify_changed = m->verify_read = m->verify_post = 0;
	rc = source_from_import(m, &s, &at, &usable);
	if (rc == 0 && !usable) {
		/* the full read: both sides are read in the shard-key index's order (no sort on
		 * the shards: a blocking sort of a large chunk would hit their 100 MB limit) and
		 * sorted by _id here */
		snprintf(m->verify_mode, sizeof m->verify_mode, "full");
		m->verify_changed = m->verify_post = 0;
		rc = mig_scan_chunk(m, m->sc, NULL, NULL, &at, collect, &s);
		m->verify_read = (int64_t)s.n;
		mig_hashes_sort_unique(&s);
	} else if (rc == 0) {
		snprintf(m->verify_mode, sizeof m->verify_mode, "imported");
	}
	mig_crash_point("mid", "verify");
	/* the target at the same position: apply exactly up to `at`, within maxCatchUpMS (at
	 * most 30 s a try): a replicator that cannot reach the position in that time cannot
	 * keep up with the source's writes, and the migration aborts cleanly as it does in
	 * replicating (it used to stall 30 s a try with an empty error until its lease ran
	 * out: test_catch_up_under_a_write_rate_the_target_cannot_match) */
	if (rc == 0) {
		int64_t budget = m->max_catchup_ms < 30000 ? m->max_catchup_ms : 30000;
		rc = mig_repl_run(m, &m->fwd, m->ts, at, (int64_t)sdb_mono_ms() + budget);
		if (rc == SDB_ETIMEOUT && budget == m->max_catchup_ms) {
			char why[200];
			mig_hashes_free(&s);
			snprintf(why, sizeof why,
				 "replication could not catch up with the source within "
				 "maxCatchUpMS=%" PRId64 " (verifying)",
				 m->max_catchup_ms);
			return mig_fail(m, why);
		}
		if (rc == SDB_ETIMEOUT)
			snprintf(m->err, sizeof m->err,
				 "verify: the target did not reach the source's position in 30 s");
	}
	if (rc == 0)
		rc = mig_scan_chunk(m, m->dc, NULL, NULL, NULL, collect, &t);
	if (rc) {
		mig_hashes_free(&s);
		mig_hashes_free(&t);
		return rc == SDB_ENOTFOUND ? mig_fail(m, m->err) : rc;
	}
	mig_hashes_sort_unique(&t);
	size_t i = 0, j = 0;
	int64_t miss = 0, extra = 0, diff = 0;
	char why[512] = "", one[160];
	size_t wl = 0;
	int listed = 0;
	while (i < s.n || j < t.n) {
		int c = i == s.n ? 1 : j == t.n ? -1 : sdb_bson_value_cmp(&s.v[i].id, &t.v[j].id);
		const char *kind = NULL;
		const bson_value_t *id = NULL;
		if (c < 0) {
			miss++;
			kind = "missing";
			id = &s.v[i++].id;
		} else if (c > 0) {
			extra++;
			kind = "extra";
			id = &t.v[j++].id;
		} else {
			if (s.v[i].hash != t.v[j].hash) {
				diff++;
				kind = "different";
				id = &s.v[i].id;
			}
			i++;
			j++;
		}
		if (kind && listed < MAX_LISTED_DIFFS && wl < sizeof why - 1) {
			char idj[120];
			describe_id(id, idj, sizeof idj);
			snprintf(one, sizeof one, "%s%s %s", listed ? "; " : "", kind, idj);
			wl += (size_t)snprintf(why + wl, sizeof why - wl, "%s", one);
			if (wl >= sizeof why)
				wl = sizeof why - 1;
			listed++;
		}
	}
	m->verify_count = (int64_t)s.n;
	m->verify_missing = miss;
	m->verify_extra = extra;
	m->verify_different = diff;
	mig_hashes_free(&s);
	mig_hashes_free(&t);
	sdb_info("migration verified",
		 "id=%s count=%" PRId64 " missing=%" PRId64 " extra=%" PRId64
		 " different=%" PRId64 " source=%s oplog_entries=%" PRId64 " changed=%" PRId64
		 " read=%" PRId64 " post_images=%" PRId64,
		 m->id, m->verify_count, miss, extra, diff, m->verify_mode, m->verify_oplog,
		 m->verify_changed, m->verify_read, m->verify_post);
	if (miss || extra || diff) {
		char msg[700];
		snprintf(msg, sizeof msg, "verification failed at ts %u:%u: %s", (unsigned)(at >> 32),
			 (unsigned)at, why);
		return mig_fail(m, msg);
	}
	return mig_save(m, MIG_SWITCHING);
}
