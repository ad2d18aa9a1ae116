/* Step verifying: the chunk on the source (a snapshot at P) and on the target (after
 * replaying up to P) compared as (_id, XXH64 of the document) in _id order. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/migrate_int.h"
#include "storage/bsonval.h"

typedef struct vdoc {
	bson_value_t id; /* copied */
	uint64_t hash;
} vdoc;

typedef struct vlist {
	vdoc *v;
	size_t n, cap;
} vlist;

static int collect(mig *m, const bson_t *doc, void *arg)
{
	(void)m;
	vlist *l = arg;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return 0;
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 1024;
		l->v = sdb_realloc(l->v, l->cap * sizeof *l->v);
	}
	bson_value_copy(bson_iter_value(&it), &l->v[l->n].id);
	l->v[l->n++].hash = XXH64(bson_get_data(doc), doc->len, 0);
	return 0;
}

static int vcmp(const void *a, const void *b)
{
	return sdb_bson_value_cmp(&((const vdoc *)a)->id, &((const vdoc *)b)->id);
}

static void vfree(vlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		bson_value_destroy(&l->v[i].id);
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
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

int mig_step_verify(mig *m)
{
	int rc;
	vlist s = {0}, t = {0};
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if (mig_paused(m)) {
		mig_nap(m, 100);
		return 0;
	}
	/* both sides are read in the shard-key index's order (no sort on the shards: a
	 * blocking sort of a large chunk would hit their 100 MB limit) and sorted by _id here */
	uint64_t at = 0;
	rc = mig_scan_chunk(m, m->sc, NULL, NULL, &at, collect, &s);
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
			vfree(&s);
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
		vfree(&s);
		vfree(&t);
		return rc == SDB_ENOTFOUND ? mig_fail(m, m->err) : rc;
	}
	if (s.n > 1)
		sdb_qsort(s.v, s.n, sizeof *s.v, vcmp);
	if (t.n > 1)
		sdb_qsort(t.v, t.n, sizeof *t.v, vcmp);
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
	vfree(&s);
	vfree(&t);
	sdb_info("migration verified", "id=%s count=%" PRId64 " missing=%" PRId64 " extra=%" PRId64
		 " different=%" PRId64, m->id, m->verify_count, miss, extra, diff);
	if (miss || extra || diff) {
		char msg[700];
		snprintf(msg, sizeof msg, "verification failed at ts %u:%u: %s", (unsigned)(at >> 32),
			 (unsigned)at, why);
		return mig_fail(m, msg);
	}
	return mig_save(m, MIG_SWITCHING);
}
