/* A migration's shard I/O: the source's and target's clients, commands, the oplog head,
 * and the read of the chunk's documents (mig_scan_chunk). See migrate_int.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/throttle.h"
#include "coordinator/migrate_int.h"
#include "coordinator/reconcile.h" /* cfilt_shard_client */

static int shard_uri(mig *m, const char *id, char **out)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	int rc;
	*out = NULL;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	rc = mig_meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&cmd);
	if (rc == 0 && bson_iter_init_find(&it, &reply, "shards") && bson_iter_recurse(&it, &arr))
		while (bson_iter_next(&arr)) {
			bson_t s;
			const uint8_t *data;
			uint32_t len;
			char sid[64], uri[512];
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &len, &data);
			bson_init_static(&s, data, len);
			if (mig_it_str(&s, "id", sid, sizeof sid) && strcmp(sid, id) == 0 &&
			    mig_it_str(&s, "uri", uri, sizeof uri))
				*out = sdb_strdup(uri);
		}
	bson_destroy(&reply);
	if (rc != 0)
		return SDB_EIO;
	if (!*out) /* permanent: the worker aborts a migration that has not started (SDB_EINVAL) */
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL,
				"shard %s is not registered (removed from the cluster?)", id);
	return 0;
}

static mongoc_client_t *shard_client(const char *uri)
{
	return cfilt_shard_client(uri, "stripedb-migration");
}

int mig_connect_shards(mig *m)
{
	int rc;
	if (!m->src_uri && (rc = shard_uri(m, m->src, &m->src_uri)) != 0)
		return rc;
	if (!m->dst_uri && (rc = shard_uri(m, m->dst, &m->dst_uri)) != 0)
		return rc;
	if (!m->sc)
		m->sc = shard_client(m->src_uri);
	if (!m->dc)
		m->dc = shard_client(m->dst_uri);
	if (!m->sc || !m->dc)
		return sdb_errf(m->err, sizeof m->err, SDB_EINVAL, "bad shard uri");
	m->fwd.to = m->dc;
	m->fwd.shard = m->src;
	m->rev.to = m->sc;
	m->rev.shard = m->dst;
	return 0;
}

/* Run a command on a shard; a write reply with writeErrors is an error too. */
int mig_shard_run(mig *m, mongoc_client_t *c, const bson_t *cmd, bson_t *reply_out)
{
	bson_t reply;
	bson_error_t e;
	bson_iter_t it;
	int rc = 0;
	m->code = 0;
	if (!mongoc_client_command_simple(c, m->db, cmd, NULL, &reply, &e)) {
		m->code = e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "%s", e.message);
	} else if (bson_iter_init_find(&it, &reply, "writeErrors")) {
		char *j = bson_as_relaxed_extended_json(&reply, NULL);
		rc = sdb_errf(m->err, sizeof m->err, SDB_EIO, "write errors: %.300s", j);
		bson_free(j);
	}
	if (reply_out && rc == 0)
		bson_copy_to(&reply, reply_out);
	bson_destroy(&reply);
	return rc;
}

/* The shard's oplog head: atOplogTs of an empty snapshot read. */
int mig_oplog_head(mig *m, mongoc_client_t *c, uint64_t *ts)
{
	bson_t cmd = BSON_INITIALIZER, reply, f, cur;
	BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", m->coll);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
	BSON_APPEND_UTF8(&f, "_id", "\x01stripedb-oplog-head-probe");
	bson_append_document_end(&cmd, &f);
	int rc = mig_shard_run(m, c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc)
		return rc;
	if (!mig_it_doc(&reply, "cursor", &cur) || !(*ts = mig_it_ts(&cur, "atOplogTs"))) {
		/* an empty oplog has head 0 */
		*ts = 0;
	}
	bson_destroy(&reply);
	return 0;
}

int mig_ts_floor(mig *m, mongoc_client_t *c, uint64_t ts)
{
	bson_t cmd = BSON_INITIALIZER, data, reply;
	bson_error_t e;
	int rc = 0;
	BSON_APPEND_INT32(&cmd, "appendOplogNote", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "data", &data);
	BSON_APPEND_UTF8(&data, "msg", "stripedb migration switch");
	BSON_APPEND_UTF8(&data, "migration", m->id);
	bson_append_document_end(&cmd, &data);
	BSON_APPEND_TIMESTAMP(&cmd, "maxClusterTime", (uint32_t)(ts >> 32), (uint32_t)ts);
	m->code = 0;
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		m->code = e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "appendOplogNote: %s",
			      e.message);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* ------------------------------------------------------------ copying documents */

int mig_cursor_open(mig *m, mongoc_client_t *c, const char *db, const bson_t *cmd,
		    uint64_t *at, const char *what, mongoc_cursor_t **out)
{
	bson_t reply, cur;
	bson_error_t e;
	mongoc_server_description_t *sd = mongoc_client_select_server(c, false, NULL, &e);

	*out = NULL;
	if (!sd)
		return sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "%s: %s", what, e.message);
	uint32_t server_id = mongoc_server_description_id(sd);
	mongoc_server_description_destroy(sd);
	m->code = 0;
	if (!mongoc_client_command_simple_with_server_id(c, db, cmd, NULL, server_id, &reply,
							 &e)) {
		m->code = e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
		bson_destroy(&reply);
		return sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "%s: %s", what, e.message);
	}
	if (at) {
		*at = 0;
		if (mig_it_doc(&reply, "cursor", &cur))
			*at = mig_it_ts(&cur, "atOplogTs");
	}
	bson_t copts = BSON_INITIALIZER;
	BSON_APPEND_INT32(&copts, "serverId", (int32_t)server_id);
	/* takes ownership of reply */
	*out = mongoc_cursor_new_from_command_reply_with_opts(c, &reply, &copts);
	bson_destroy(&copts);
	return 0;
}

int mig_has_key_index(mig *m, mongoc_client_t *c, bool *has)
{
	bson_t cmd = BSON_INITIALIZER, reply, ix, kp;
	bson_iter_t it, cur, fb, ki;
	uint32_t len;
	const uint8_t *data;
	*has = false;
	BSON_APPEND_UTF8(&cmd, "listIndexes", m->coll);
	int rc = mig_shard_run(m, c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc)
		return m->code == 26 ? 0 : rc; /* NamespaceNotFound: no index */
	if (bson_iter_init_find(&it, &reply, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "firstBatch") && bson_iter_recurse(&cur, &fb))
		while (!*has && bson_iter_next(&fb)) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&fb))
				continue;
			bson_iter_document(&fb, &len, &data);
			if (!bson_init_static(&ix, data, len) ||
			    !bson_iter_init_find(&ki, &ix, "key") || !BSON_ITER_HOLDS_DOCUMENT(&ki))
				continue;
			bson_iter_document(&ki, &len, &data);
			/* as the shard's planner uses it: neither sparse nor partial */
			*has = bson_init_static(&kp, data, len) && bson_equal(&kp, m->key) &&
			       !bson_has_field(&ix, "partialFilterExpression") &&
			       !(bson_iter_init_find(&ki, &ix, "sparse") && bson_iter_as_bool(&ki));
		}
	bson_destroy(&reply);
	return 0;
}

/* Iterate the documents of the chunk in collection coll on client c: a snapshot
 * (stripedbSnapshot, *at = atOplogTs) when at != NULL, else a plain find; sorted by sort
 * (or none). Only documents of the chunk reach fn. */
int mig_scan_chunk(mig *m, mongoc_client_t *c, const bson_t *sort, const bson_t *proj,
		      uint64_t *at, doc_fn fn, void *arg)
{
	bson_t cmd = BSON_INITIALIZER;
	bson_error_t e;
	int rc = 0;
	if (at) {
		BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", m->coll);
		bson_t f = BSON_INITIALIZER;
		BSON_APPEND_DOCUMENT(&cmd, "filter", &f);
	} else {
		BSON_APPEND_UTF8(&cmd, "find", m->coll);
	}
	/* issue #17: the shard returns the chunk's documents only, reading its shard-key
	 * index between the bounds (ranged keys; hashed keys on the hashed index between the
	 * chunk's NumberLong bounds, or through the hash of every document where a shard has
	 * no hashed index); mig_in_chunk below stays as a check */
	bson_t kr;
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "keyRange", &kr);
	BSON_APPEND_DOCUMENT(&kr, "key", m->key);
	BSON_APPEND_DOCUMENT(&kr, "min", m->min);
	BSON_APPEND_DOCUMENT(&kr, "max", m->max);
	bson_append_document_end(&cmd, &kr);
	if (sort)
		BSON_APPEND_DOCUMENT(&cmd, "sort", sort);
	if (proj)
		BSON_APPEND_DOCUMENT(&cmd, "projection", proj);
	BSON_APPEND_INT32(&cmd, "batchSize", 1000);
	mongoc_cursor_t *cs;
	rc = mig_cursor_open(m, c, m->db, &cmd, at, "scan", &cs);
	bson_destroy(&cmd);
	if (rc)
		return rc;
	const bson_t *doc;
	int64_t t_next = (int64_t)sdb_mono_us();
	while (rc == 0 && mongoc_cursor_next(cs, &doc)) {
		/* import throttle (common/throttle.h): a getMore of the snapshot slower than
		 * importLatencyMS means the source is busy; back off as long as it took */
		int64_t nap = at ? sdb_import_backoff_ms((int64_t)sdb_mono_us() - t_next,
							 m->import_latency_ms)
				 : 0;
		if (nap > 0) {
			m->throttled_ms += nap;
			mig_nap(m, nap);
		}
		if (mig_in_chunk(m, doc))
			rc = fn(m, doc, arg);
		if (mig_stopping(m))
			rc = sdb_errf(m->err, sizeof m->err, SDB_ECANCELED, "stopping");
		t_next = (int64_t)sdb_mono_us();
	}
	if (rc == 0 && mongoc_cursor_error(cs, &e))
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "scan: %s", e.message);
	mongoc_cursor_destroy(cs);
	return rc;
}
