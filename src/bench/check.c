/* The history checker. See check.h. */
#include "bench/check.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"

static int ev_cmp(const void *a, const void *b)
{
	const bench_ev *x = a, *y = b;

	if (x->key != y->key) {
		return x->key < y->key ? -1 : 1;
	}
	if (x->t0 != y->t0) {
		return x->t0 < y->t0 ? -1 : 1;
	}
	return (int)x->op - (int)y->op;
}

static void violation(bench_verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(bench_verdict *v, const char *fmt, ...)
{
	va_list ap;

	if (v->violations < 4) {
		va_start(ap, fmt);
		vsnprintf(v->first[v->violations], sizeof v->first[0], fmt, ap);
		va_end(ap);
	}
	v->violations++;
	v->ok = 0;
}

/* Whether write w took effect for sure (acknowledged and, for an update, matched). */
static int applied(const bench_ev *w)
{
	return w->outcome == BENCH_OK && (w->op == BENCH_EV_INSERT || w->n >= 1);
}

static void check_key(bench_ev *ev, size_t n, int64_t final, bench_verdict *v)
{
	int64_t key = ev[0].key, last_acked = 0;
	uint64_t insert_acked_at = 0;
	int insert_acked = 0, final_ok;

	v->keys++;
	for (size_t i = 0; i < n; i++) {
		const bench_ev *w = &ev[i];
		if (w->op == BENCH_EV_READ) {
			v->reads++;
			continue;
		}
		v->writes++;
		v->acked += w->outcome == BENCH_OK;
		v->failed += w->outcome == BENCH_FAIL;
		v->unknown += w->outcome == BENCH_UNKNOWN;
		if (w->op == BENCH_EV_INSERT && w->outcome == BENCH_OK && !insert_acked) {
			insert_acked = 1;
			insert_acked_at = w->t1;
		}
		if (w->op == BENCH_EV_UPDATE && w->outcome == BENCH_OK && w->n == 0 && insert_acked &&
		    insert_acked_at < w->t0) {
			violation(v, "key %" PRId64 ": acknowledged update to v=%" PRId64
				     " matched no document after an acknowledged insert (lost document)",
				  key, w->value);
		}
		if (applied(w) && w->value > last_acked) {
			last_acked = w->value;
		}
	}
	/* reads: linearizable per key */
	for (size_t i = 0; i < n; i++) {
		const bench_ev *r = &ev[i];
		int64_t lo = 0;
		int found = r->value == 0;
		if (r->op != BENCH_EV_READ) {
			continue;
		}
		for (size_t j = 0; j < n; j++) {
			const bench_ev *w = &ev[j];
			if (w->op == BENCH_EV_READ) {
				continue;
			}
			if (applied(w) && w->t1 < r->t0 && w->value > lo) {
				lo = w->value;
			}
			if (w->value == r->value && w->t0 < r->t1 && w->outcome != BENCH_FAIL) {
				found = 1;
			}
		}
		if (r->value < lo) {
			violation(v, "key %" PRId64 ": stale read: saw v=%" PRId64 " after v=%" PRId64
				     " was acknowledged",
				  key, r->value, lo);
		} else if (!found) {
			violation(v, "key %" PRId64 ": read saw v=%" PRId64
				     ", a value no successful write had started",
				  key, r->value);
		}
	}
	/* the final state */
	final_ok = final == last_acked;
	for (size_t i = 0; i < n && !final_ok; i++) {
		const bench_ev *w = &ev[i];
		final_ok = w->op != BENCH_EV_READ && w->outcome == BENCH_UNKNOWN && w->value == final &&
			   final > last_acked;
	}
	if (!final_ok) {
		if (final == 0) {
			violation(v, "key %" PRId64 ": document missing, v=%" PRId64 " was acknowledged",
				  key, last_acked);
		} else {
			violation(v, "key %" PRId64 ": final v=%" PRId64 " but the last acknowledged write "
				     "was v=%" PRId64,
				  key, final, last_acked);
		}
	}
}

void bench_check_history(bench_ev *ev, size_t n, const int64_t *final, int64_t maxkeys,
			 int64_t extra, bench_verdict *v)
{
	uint8_t *seen = sdb_calloc((size_t)maxkeys, 1);
	uint64_t t0;

	t0 = sdb_mono_ns();
	memset(v, 0, sizeof *v);
	v->ok = 1;
	sdb_qsort(ev, n, sizeof *ev, ev_cmp);
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j < n && ev[j].key == ev[i].key) {
			j++;
		}
		if (ev[i].key >= 0 && ev[i].key < maxkeys) {
			check_key(ev + i, j - i, final[ev[i].key], v);
			seen[ev[i].key] = 1;
		}
		i = j;
	}
	for (int64_t k = 0; k < maxkeys; k++) {
		if (final[k] != 0) {
			v->docs++;
			if (!seen[k]) {
				violation(v, "key %" PRId64 ": a document (v=%" PRId64 ") no write produced",
					  k, final[k]);
			}
		}
	}
	if (extra > 0) {
		v->docs += extra;
		violation(v, "%" PRId64 " documents with ids of no key or duplicated ids", extra);
	}
	free(seen);
	v->check_ms = (double)(sdb_mono_ns() - t0) / 1e6;
}

int bench_check_run(const bench *b, mongoc_collection_t *c, bench_ev *ev, size_t n,
		    int64_t maxkeys, bench_verdict *v, char *err, size_t errlen)
{
	int64_t *final = sdb_calloc((size_t)maxkeys, sizeof *final);
	bson_t f = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	const bson_t *doc;
	bson_error_t e;
	mongoc_cursor_t *cur;
	int64_t extra = 0;
	int rc = 0;

	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "v", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT32(&opts, "batchSize", 5000);
	cur = mongoc_collection_find_with_opts(c, &f, &opts, NULL);
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		int64_t k = -1, val = -1;
		if (bson_iter_init_find(&it, doc, "_id") && BSON_ITER_HOLDS_UTF8(&it)) {
			k = bench_key_parse(b, bson_iter_utf8(&it, NULL));
		}
		if (bson_iter_init_find(&it, doc, "v") && BSON_ITER_HOLDS_NUMBER(&it)) {
			val = bson_iter_as_int64(&it);
		}
		if (k < 0 || k >= maxkeys || final[k] != 0) {
			extra++;
			continue;
		}
		final[k] = val <= 0 ? -1 : val;
	}
	if (mongoc_cursor_error(cur, &e)) {
		rc = sdb_errf(err, errlen, SDB_EIO, "reading the final documents: %s", e.message);
	}
	mongoc_cursor_destroy(cur);
	if (rc == 0) {
		bench_check_history(ev, n, final, maxkeys, extra, v);
	}
	free(final);
	bson_destroy(&f);
	bson_destroy(&opts);
	return rc;
}
