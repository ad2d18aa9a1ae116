/* The shard's TTL monitor. Contract in ttl.h. */
#include "shard/ttl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "shard/repl.h"

struct shard_ttl {
	shard *sh;
	sdb_store_conn *conn; /* opened and used on the loop thread, read-only */
	uv_timer_t timer;
	int inflight; /* delete commands not answered yet */
	sdb_counter *c_deleted, *c_passes;
	void (*stopped_cb)(void *arg);
	void *stopped_arg;
};

static const sdb_metric_def ttl_metrics[] = {
	SDB_METRIC_COUNTER(shard_ttl, c_deleted, "stripedb_shard_ttl_deleted_total",
			   "Documents deleted by the TTL monitor (on the primary)."),
	SDB_METRIC_COUNTER(shard_ttl, c_passes, "stripedb_shard_ttl_passes_total",
			   "TTL monitor passes run on this member as primary."),
};

typedef struct ttl_del {
	shard_ttl *t;
	char ns[256];
} ttl_del;

static void del_done(void *arg, wire_req *req)
{
	ttl_del *d = arg;
	bson_t *reply = wire_req_detached_take(req);
	bson_iter_t it;
	if (reply && bson_iter_init_find(&it, reply, "n") && BSON_ITER_HOLDS_NUMBER(&it)) {
		int64_t n = bson_iter_as_int64(&it);
		sdb_counter_add(d->t->c_deleted, n);
		if (n > 0)
			sdb_debug("shard: TTL monitor deleted expired documents", "ns=%s n=%lld", d->ns,
				  (long long)n);
	} else if (reply && bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it)) {
		sdb_info("shard: TTL delete not applied, next pass retries", "ns=%s err=\"%s\"",
			 d->ns, bson_iter_utf8(&it, NULL));
	}
	if (reply)
		bson_destroy(reply);
	d->t->inflight--;
	wire_req_detached_free(req);
	free(d);
}

/* Queue the delete of db.coll's documents whose field is a date before cutoff_ms and, for
 * a partial index, that match its partialFilterExpression pfe. spec: the index's spec; the
 * delete runs under the index's collation (its stored `collation`, absent when simple),
 * never the collection's default: the index holds the documents its filter matches under
 * its own collation, and mongod's TTL monitor deletes through the index. */
static void expire(shard_ttl *t, const char *db, const char *coll, const char *field,
		   int64_t cutoff_ms, const bson_iter_t *pfe, const bson_t *spec)
{
	bson_t cmd = BSON_INITIALIZER, dels, del, q, cond, and, one;
	BSON_APPEND_UTF8(&cmd, "delete", coll);
	BSON_APPEND_ARRAY_BEGIN(&cmd, "deletes", &dels);
	BSON_APPEND_DOCUMENT_BEGIN(&dels, "0", &del);
	BSON_APPEND_DOCUMENT_BEGIN(&del, "q", &q);
	if (pfe) {
		/* a partial TTL index expires only the documents it holds (issue #20):
		 * {$and: [{field: {$lt: cutoff}}, partialFilterExpression]} */
		BSON_APPEND_ARRAY_BEGIN(&q, "$and", &and);
		BSON_APPEND_DOCUMENT_BEGIN(&and, "0", &one);
		BSON_APPEND_DOCUMENT_BEGIN(&one, field, &cond);
		BSON_APPEND_DATE_TIME(&cond, "$lt", cutoff_ms);
		bson_append_document_end(&one, &cond);
		bson_append_document_end(&and, &one);
		bson_append_iter(&and, "1", 1, pfe);
		bson_append_array_end(&q, &and);
	} else {
		BSON_APPEND_DOCUMENT_BEGIN(&q, field, &cond);
		BSON_APPEND_DATE_TIME(&cond, "$lt", cutoff_ms);
		bson_append_document_end(&q, &cond);
	}
	bson_append_document_end(&del, &q);
	BSON_APPEND_INT32(&del, "limit", 0);
	bson_iter_t ci;
	if (bson_iter_init_find(&ci, spec, "collation") && BSON_ITER_HOLDS_DOCUMENT(&ci)) {
		bson_append_iter(&del, "collation", -1, &ci);
	} else {
		bson_t simple;
		BSON_APPEND_DOCUMENT_BEGIN(&del, "collation", &simple);
		BSON_APPEND_UTF8(&simple, "locale", "simple");
		bson_append_document_end(&del, &simple);
	}
	bson_append_document_end(&dels, &del);
	bson_append_array_end(&cmd, &dels);
	BSON_APPEND_BOOL(&cmd, "ordered", false);
	wire_req *req = wire_req_detached_new(db, &cmd);
	bson_destroy(&cmd);
	ttl_del *d = sdb_calloc(1, sizeof *d);
	d->t = t;
	snprintf(d->ns, sizeof d->ns, "%s.%s", db, coll);
	wire_req_detached_on_done(req, del_done, d);
	t->inflight++;
	shard_repl_submit(t->sh->repl, req);
}

static void pass(uv_timer_t *h)
{
	shard_ttl *t = h->data;
	char err[256];
	char **names = NULL;
	size_t n = 0;
	int64_t now = sdb_wall_ms(); /* read once here, on the primary; carried in the command */

	if (!t->sh->repl || !shard_repl_writable(t->sh->repl) || t->inflight > 0)
		return;
	sdb_counter_inc(t->c_passes);
	if (sdb_store_begin(t->conn, false, err, sizeof err) != 0)
		return;
	if (sdb_store_coll_list(t->conn, NULL, &names, &n, err, sizeof err) != 0) {
		sdb_store_rollback(t->conn);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		const sdb_store_coll *co = NULL;
		const char *db = names[2 * i], *coll = names[2 * i + 1];
		bson_iter_t it;
		if (sdb_store_coll_get(t->conn, db, coll, &co, NULL, 0) != 0 || !co)
			continue;
		if (bson_iter_init_find(&it, co->options, "viewOn"))
			continue;
		for (size_t j = 0; j < co->n_indexes; j++) {
			const sdb_store_index *ix = &co->indexes[j];
			bson_iter_t k;
			if (!bson_iter_init_find(&it, ix->spec, "expireAfterSeconds") ||
			    !BSON_ITER_HOLDS_NUMBER(&it) || !bson_iter_init(&k, ix->key) ||
			    !bson_iter_next(&k))
				continue;
			int64_t secs = bson_iter_as_int64(&it);
			bson_iter_t pfe;
			bool partial = bson_iter_init_find(&pfe, ix->spec, "partialFilterExpression") &&
				       BSON_ITER_HOLDS_DOCUMENT(&pfe);
			expire(t, db, coll, bson_iter_key(&k), now - secs * 1000,
			       partial ? &pfe : NULL, ix->spec);
		}
	}
	sdb_store_names_free(names, n);
	sdb_store_rollback(t->conn);
}

shard_ttl *shard_ttl_start(shard *sh, int64_t interval_s)
{
	char err[256];
	if (interval_s <= 0)
		return NULL;
	shard_ttl *t = sdb_calloc(1, sizeof *t);
	t->sh = sh;
	if (sdb_store_conn_open(sh->store, &t->conn, err, sizeof err) != 0) {
		sdb_error("shard: TTL monitor disabled: no store connection", "err=\"%s\"", err);
		free(t);
		return NULL;
	}
	SDB_METRICS_REGISTER(t, ttl_metrics, NULL);
	uv_timer_init(sh->role->loop, &t->timer);
	t->timer.data = t;
	uv_timer_start(&t->timer, pass, (uint64_t)interval_s * 1000, (uint64_t)interval_s * 1000);
	return t;
}

static void timer_closed(uv_handle_t *h)
{
	shard_ttl *t = h->data;
	void (*cb)(void *) = t->stopped_cb;
	void *arg = t->stopped_arg;
	sdb_store_conn_close(t->conn);
	free(t); /* in-flight deletes are answered by the replica set's stop, before this */
	cb(arg);
}

void shard_ttl_stop(shard_ttl *t, void (*cb)(void *arg), void *arg)
{
	if (!t) {
		cb(arg);
		return;
	}
	t->stopped_cb = cb;
	t->stopped_arg = arg;
	uv_timer_stop(&t->timer);
	uv_close((uv_handle_t *)&t->timer, timer_closed);
}
