/* Step cleaning (the source's copy of a switched chunk, after the grace period) and an
 * aborted migration's target copy: the chunk's documents deleted by key range on the shard
 * (its shard-key index), in throttled batches. See migrate.h for the states. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "coordinator/migrate_int.h"

/* Hashed keys: the shard has no index on the hash, so a range delete would scan the whole
 * collection once per batch; the chunk is read once instead (mig_scan_chunk: the shard
 * checks the hash of every document and returns only the chunk's _ids and keys) and
 * deleted by _id in batches. */
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

/* One batch: {delete: coll, deletes: [{q: {$stripedbKeyRange: true}, limit: 0, keyRange,
 * keyRangeLimit: spec.deleteBatch}], $stripedbOrigin}: the shard deletes at most that many
 * documents of the chunk's key range, found through its shard-key index (ranged keys, or
 * the hashed index of a hashed key, src/shard/README.md). *n = how many it deleted. */
static int delete_batch(mig *m, mongoc_client_t *c, int64_t *n)
{
	bson_t cmd = BSON_INITIALIZER, arr, st, q, kr, reply;
	BSON_APPEND_UTF8(&cmd, "delete", m->coll);
	BSON_APPEND_ARRAY_BEGIN(&cmd, "deletes", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &st);
	BSON_APPEND_DOCUMENT_BEGIN(&st, "q", &q);
	BSON_APPEND_BOOL(&q, "$stripedbKeyRange", true);
	bson_append_document_end(&st, &q);
	BSON_APPEND_INT32(&st, "limit", 0);
	BSON_APPEND_DOCUMENT_BEGIN(&st, "keyRange", &kr);
	BSON_APPEND_DOCUMENT(&kr, "key", m->key);
	BSON_APPEND_DOCUMENT(&kr, "min", m->min);
	BSON_APPEND_DOCUMENT(&kr, "max", m->max);
	bson_append_document_end(&st, &kr);
	BSON_APPEND_INT64(&st, "keyRangeLimit", m->delete_batch);
	bson_append_document_end(&arr, &st);
	bson_append_array_end(&cmd, &arr);
	BSON_APPEND_UTF8(&cmd, "$stripedbOrigin", m->id);
	int rc = mig_shard_run(m, c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc)
		return rc;
	*n = mig_it_int(&reply, "n", 0);
	bson_destroy(&reply);
	return 0;
}

static int delete_by_id(mig *m, mongoc_client_t *c)
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

int mig_delete_chunk(mig *m, mongoc_client_t *c)
{
	if (m->rc->hashed) {
		/* without the hashed index every batch would examine the whole collection:
		 * read the chunk once and delete by _id instead */
		bool has = false;
		int rc = mig_has_key_index(m, c, &has);
		if (rc)
			return rc;
		if (!has)
			return delete_by_id(m, c);
	}
	for (;;) {
		int64_t n = 0;
		int rc = delete_batch(m, c, &n);
		if (rc)
			return rc;
		m->deleted += n;
		if (n > 0 && m->state == MIG_CLEANING)
			mig_crash_point("mid", "clean");
		if (n < m->delete_batch)
			return 0;
		if (m->delete_delay_ms > 0)
			mig_nap(m, m->delete_delay_ms);
		mig_keepalive(m);
		if (mig_stopping(m))
			return sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
	}
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
	if ((rc = mig_connect_shards(m)) == SDB_EINVAL) {
		/* a shard of it is no longer registered: nothing of it can be cleaned there */
		sdb_warn("aborted migration: no cleanup", "id=%s reason=\"%s\"", m->id, m->err);
		m->target_cleaned = true;
		return mig_save(m, m->state);
	}
	if (rc != 0)
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
