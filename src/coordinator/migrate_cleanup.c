/* Step cleaning (the source's copy of a switched chunk, after the grace period) and an
 * aborted migration's target copy: the chunk's documents read by key range and deleted in
 * throttled batches. See migrate.h for the states. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "coordinator/migrate_int.h"

typedef struct id_batch {
	bson_t arr;
	uint32_t n;
	mongoc_client_t *c;
} id_batch;

static int flush_deletes(mig *m, id_batch *b)
{
	if (b->n == 0)
		return 0;
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "delete", m->coll);
	BSON_APPEND_ARRAY(&cmd, "deletes", &b->arr);
	BSON_APPEND_BOOL(&cmd, "ordered", false);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	int rc = mig_shard_run(m, b->c, &cmd, NULL);
	bson_destroy(&cmd);
	bson_reinit(&b->arr);
	if (rc == 0)
		m->deleted += b->n;
	b->n = 0;
	if (rc == 0 && m->state == MIG_CLEANING)
		mig_crash_point("mid", "clean");
	return rc;
}

static int add_delete(mig *m, const bson_t *doc, void *arg)
{
	id_batch *b = arg;
	bson_iter_t it;
	bson_t s, q;
	char k[16];
	if (!bson_iter_init_find(&it, doc, "_id"))
		return 0;
	snprintf(k, sizeof k, "%u", b->n++);
	BSON_APPEND_DOCUMENT_BEGIN(&b->arr, k, &s);
	BSON_APPEND_DOCUMENT_BEGIN(&s, "q", &q);
	bson_append_iter(&q, "_id", 3, &it);
	bson_append_document_end(&s, &q);
	BSON_APPEND_INT32(&s, "limit", 1);
	bson_append_document_end(&b->arr, &s);
	if (b->n >= (uint32_t)m->delete_batch) {
		int rc = flush_deletes(m, b);
		if (rc)
			return rc;
		if (m->delete_delay_ms > 0)
			mig_nap(m, m->delete_delay_ms);
		mig_keepalive(m);
	}
	return 0;
}

static void key_projection(mig *m, bson_t *proj)
{
	bson_init(proj);
	BSON_APPEND_INT32(proj, "_id", 1);
	for (size_t i = 0; i < m->rc->nkeys; i++)
		if (strcmp(m->rc->keys[i], "_id") != 0)
			BSON_APPEND_INT32(proj, m->rc->keys[i], 1);
}

/* Delete the chunk's documents from c (throttled batches). */
int mig_delete_chunk(mig *m, mongoc_client_t *c)
{
	id_batch b = {.c = c};
	bson_t proj;
	bson_init(&b.arr);
	key_projection(m, &proj);
	int rc = mig_scan_chunk(m, c, NULL, &proj, NULL, add_delete, &b);
	if (rc == 0)
		rc = flush_deletes(m, &b);
	bson_destroy(&b.arr);
	bson_destroy(&proj);
	return rc;
}

int mig_step_clean(mig *m)
{
	int rc;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	mig_repl_close(&m->rev);
	if ((rc = mig_delete_chunk(m, m->sc)) != 0)
		return rc;
	return mig_save(m, MIG_COMPLETE);
}

/* An aborted migration: delete the target's copy unless routing points at the target. */
int mig_step_aborted_cleanup(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = mig_connect_shards(m)) != 0)
		return rc;
	rc = mig_routing_chunk(m, shard, sizeof shard, &token);
	if (rc && rc != SDB_ENOTFOUND)
		return rc;
	if (rc == 0 && strcmp(shard, m->dst) != 0 && mig_build_view(m) == 0 &&
	    (rc = mig_delete_chunk(m, m->dc)) != 0)
		return rc;
	m->target_cleaned = true;
	return mig_save(m, m->state);
}
