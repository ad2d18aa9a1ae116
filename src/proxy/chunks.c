/* Chunk administration through the proxy, as on a mongos (issue #18): split (middle, or
 * find / bounds at the median of the chunk's documents), moveChunk and moveRange (one Data
 * Movement Platform migration, waited for), mergeChunks, and removeShard (a drain by
 * migrations). Each is translated to the metadata service's commands; the shared checks
 * are in sharding.c (sharding_int.h). Sources: MongoDB's split, moveChunk, moveRange,
 * mergeChunks and removeShard commands (mongos), sharding_catalog_manager. */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "proxy/sharding_int.h"

/* A chunk command's namespace (its first value). Returns: 0, or InvalidNamespace (73)
 * answered on c when it is not a "db.coll" string. */
static int ns_check(ctx *c, const char *ns)
{
	if (ns != NULL && strchr(ns, '.') != NULL)
		return 0;
	return px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
			ns ? ns : "(not a string)");
}

/* ns's routing, refreshed from metadata, into *out, with *sub = c aimed at ns (for the
 * refreshes and moves that follow); the caller unrefs it. Returns: 0, or the code answered
 * on c (*out NULL): HostUnreachable (6) when metadata could not be asked,
 * NamespaceNotSharded (118) for an unsharded collection. */
static int sharded_route(ctx *c, ctx *sub, const char *ns, route_coll **out)
{
	route_coll *rc;
	char err[256];

	*out = NULL;
	*sub = *c;
	snprintf(sub->ns, sizeof sub->ns, "%s", ns);
	rc = px_route(sub, true, err, sizeof err);
	if (rc == NULL)
		return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
	if (rc->nkeys == 0) {
		route_coll_unref(rc);
		return px_error(c, 118 /* NamespaceNotSharded */, "%s is not sharded", ns);
	}
	*out = rc;
	return 0;
}

/* sub's routing as this proxy holds it (px_route without a refresh: split_at refreshed it)
 * into *out; the caller unrefs it. Returns: 0, or HostUnreachable (6) answered on c. */
static int cached_route(ctx *c, ctx *sub, route_coll **out)
{
	char err[256];

	*out = px_route(sub, false, err, sizeof err);
	if (*out == NULL)
		return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
	return 0;
}

/* Run the chunk change cmd on metadata; once done, refresh sub's routing (this proxy's next
 * command sees the change) and answer c ok. Returns: the status of the answer (a metadata
 * failure is answered as px_sharding_meta_call answers it). */
static int meta_change(ctx *c, ctx *sub, const bson_t *cmd)
{
	bson_t reply;
	route_coll *rc;
	char err[256];
	int st;

	if ((st = px_sharding_meta_call(c, cmd, &reply, NULL, NULL)) != 0)
		return st;
	bson_destroy(&reply);
	rc = px_route(sub, true, err, sizeof err);
	if (rc)
		route_coll_unref(rc);
	return px_reply(c, bson_new());
}

/* The chunk of rc named by c->cmd's `find` (the chunk holding that document's shard key)
 * or `bounds` ([min, max]: exactly a chunk's bounds), as moveChunk and split take them; -1
 * when neither names a chunk. */
static ssize_t chunk_of_find_or_bounds(ctx *c, const route_coll *rc)
{
	bson_t find, bounds, lo, hi;
	ssize_t ci = -1;
	char err[256];

	if (px_get_doc(c->cmd, "find", &find)) {
		bson_t key = BSON_INITIALIZER;
		if (route_key_from_doc(rc, &find, &key, err, sizeof err) == 0)
			ci = route_find_chunk(rc, &key);
		bson_destroy(&key);
	} else if (px_get_array(c->cmd, "bounds", &bounds) && px_get_doc(&bounds, "0", &lo) &&
		   px_get_doc(&bounds, "1", &hi)) {
		ci = route_find_chunk(rc, &lo);
		if (ci >= 0 && (route_key_cmp(rc->chunks[ci].min, &lo) != 0 ||
				route_key_cmp(rc->chunks[ci].max, &hi) != 0))
			ci = -1;
	}
	return ci;
}

/* The median shard-key value of chunk ci of rc (ranged, single-field key) from its shard:
 * count the chunk's documents (filter {k: {$gte: min, $lt: max}}, a MinKey/MaxKey side
 * left out), then the key of the one in the middle by key order, into median (initialised
 * when 0 is returned). Returns: 0, or the code answered on c: the shard's error, or
 * BadValue (2) when the chunk has no key strictly inside it to split at (empty, or every
 * document has its min key). */
static int chunk_median(ctx *c, const route_coll *rc, ssize_t ci, bson_t *median)
{
	const route_chunk *ch = &rc->chunks[ci];
	const char *k = rc->keys[0];
	bson_t filter = BSON_INITIALIZER, f, cmd = BSON_INITIALIZER, reply, sort, proj, cur, batch;
	bson_iter_t lo, hi, it;
	char nerr[256];
	int cls, st;
	int64_t n;

	bson_iter_init(&lo, ch->min);
	bson_iter_init(&hi, ch->max);
	bson_iter_next(&lo);
	bson_iter_next(&hi);
	bson_append_document_begin(&filter, k, -1, &f);
	if (bson_iter_type(&lo) != BSON_TYPE_MINKEY)
		bson_append_iter(&f, "$gte", 4, &lo);
	if (bson_iter_type(&hi) != BSON_TYPE_MAXKEY)
		bson_append_iter(&f, "$lt", 3, &hi);
	bson_append_document_end(&filter, &f);
	BSON_APPEND_UTF8(&cmd, "count", c->coll);
	BSON_APPEND_DOCUMENT(&cmd, "query", &filter);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls != SHARDCONN_OK) {
		st = px_reply_shard_error(c, cls, &reply, nerr);
		goto out;
	}
	n = px_get_int(&reply, "n", 0);
	bson_destroy(&reply);
	bson_reinit(&cmd);
	BSON_APPEND_UTF8(&cmd, "find", c->coll);
	BSON_APPEND_DOCUMENT(&cmd, "filter", &filter);
	bson_append_document_begin(&cmd, "sort", -1, &sort);
	BSON_APPEND_INT32(&sort, k, 1);
	bson_append_document_end(&cmd, &sort);
	bson_append_document_begin(&cmd, "projection", -1, &proj);
	BSON_APPEND_INT32(&proj, k, 1);
	BSON_APPEND_INT32(&proj, "_id", 0);
	bson_append_document_end(&cmd, &proj);
	BSON_APPEND_INT64(&cmd, "skip", n / 2);
	BSON_APPEND_INT64(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls != SHARDCONN_OK) {
		st = px_reply_shard_error(c, cls, &reply, nerr);
		goto out;
	}
	bson_init(median);
	if (n > 0 && px_get_doc(&reply, "cursor", &cur) && px_get_array(&cur, "firstBatch", &batch)) {
		bson_t d;
		if (px_get_doc(&batch, "0", &d) && bson_iter_init_find(&it, &d, k))
			bson_append_iter(median, k, -1, &it);
	}
	bson_destroy(&reply);
	if (bson_empty(median) || route_key_cmp(median, ch->min) <= 0 ||
	    route_key_cmp(median, ch->max) >= 0) {
		bson_destroy(median);
		st = px_error(c, WIRE_ERR_BAD_VALUE,
			      "cannot split chunk of %s at its median: it holds %lld documents and "
			      "no shard-key value strictly inside its bounds",
			      rc->ns, (long long)n);
		goto out;
	}
	st = 0;
out:
	bson_destroy(&cmd);
	bson_destroy(&filter);
	return st;
}

/* {split: "db.coll", middle: {key...} | find: {key...} | bounds: [min, max]} (mongosh
 * sh.splitAt / sh.splitFind): metadata splitChunk of the chunk holding middle, at middle
 * (for a hashed key, middle is a value of the hash space, as in MongoDB); with find (the
 * chunk holding that document's key) or bounds (exactly a chunk's), at the median key of
 * the chunk's documents, read from its shard (ranged single-field keys; hashed and compound
 * keys: CommandNotSupported 115, give middle). */
int px_do_split(ctx *c)
{
	const char *ns = px_first_utf8(c->cmd);
	ctx sub;
	bson_t middle, cmd = BSON_INITIALIZER, median;
	route_coll *rc;
	ssize_t ci = -1;
	int64_t id;
	int given = 0, st;
	bool have_median = false;

	if ((st = px_need_admin_db(c, "split")) != 0 || (st = ns_check(c, ns)) != 0)
		return st;
	given += px_get_doc(c->cmd, "middle", &middle) && !bson_empty(&middle);
	given += bson_has_field(c->cmd, "find");
	given += bson_has_field(c->cmd, "bounds");
	if (given != 1) {
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"need to specify exactly one of middle, find or bounds (the split point)");
	}
	if ((st = sharded_route(c, &sub, ns, &rc)) != 0)
		return st;
	if (bson_has_field(c->cmd, "middle")) {
		ci = route_find_chunk(rc, &middle);
	} else {
		if (rc->hashed || rc->nkeys != 1) {
			route_coll_unref(rc);
			return px_error(c, 115 /* CommandNotSupported */,
					"split with find or bounds (at the median of the chunk's documents) "
					"needs a ranged single-field shard key in stripedb: give the split "
					"point as middle");
		}
		ci = chunk_of_find_or_bounds(c, rc);
		if (ci >= 0) {
			/* the shard reads run in the collection's database */
			ctx in_db = sub;
			char dbname[256];
			const char *dot = strchr(ns, '.');
			snprintf(dbname, sizeof dbname, "%.*s", (int)(dot - ns), ns);
			in_db.db = dbname;
			in_db.coll = dot + 1;
			if ((st = chunk_median(&in_db, rc, ci, &median)) != 0) {
				route_coll_unref(rc);
				return st;
			}
			have_median = true;
		}
	}
	id = ci >= 0 ? rc->chunks[ci].nid : 0;
	route_coll_unref(rc);
	if (ci < 0 || id == 0) {
		if (have_median)
			bson_destroy(&median);
		return px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s holds the split point", ns);
	}
	BSON_APPEND_INT64(&cmd, "splitChunk", id);
	BSON_APPEND_DOCUMENT(&cmd, "at", have_median ? &median : &middle);
	if (have_median)
		bson_destroy(&median);
	st = meta_change(c, &sub, &cmd);
	bson_destroy(&cmd);
	return st;
}


/* A chunk of the shard being removed: its collection and metadata id. */
typedef struct owned_chunk {
	char ns[256];
	int64_t nid;
} owned_chunk;

/* chunks_on's list: the chunks of shard, n of cap. */
typedef struct owned_list {
	const char *shard;
	owned_chunk *v;
	size_t n, cap;
} owned_list;

static void add_owned(const bson_t *ch, void *arg)
{
	owned_list *l = arg;
	const char *cs = px_str_of(ch, "shard"), *cns = px_str_of(ch, "ns");

	if (cs == NULL || cns == NULL || strcmp(cs, l->shard) != 0)
		return;
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 64;
		l->v = sdb_realloc(l->v, l->cap * sizeof *l->v);
	}
	snprintf(l->v[l->n].ns, sizeof l->v[l->n].ns, "%s", cns);
	l->v[l->n].nid = px_get_int(ch, "id", 0);
	l->n++;
}

/* The chunks of every collection that shard owns (getRoutingTable "all", batch by batch),
 * into *out (heap, may be NULL when none), their number into *n. Returns: 0, or the code
 * answered on c (*out NULL). */
static int chunks_on(ctx *c, const char *shard, owned_chunk **out, int64_t *n)
{
	owned_list l = {.shard = shard};
	int st;

	*out = NULL;
	*n = 0;
	if ((st = px_each_routing_chunk(c, add_owned, &l)) != 0) {
		free(l.v);
		return st;
	}
	*out = l.v;
	*n = (int64_t)l.n;
	return 0;
}

/* The migrations of the listMigrations reply list that have not ended (registered ...
 * cleanup) and move chunk nid (nid != 0) or move a chunk from or to shard (shard != NULL). */
static int64_t active_migrations(const bson_t *list, int64_t nid, const char *shard)
{
	bson_iter_t it, arr;
	int64_t n = 0;

	if (!bson_iter_init_find(&it, list, "migrations") || !bson_iter_recurse(&it, &arr))
		return 0;
	while (bson_iter_next(&arr)) {
		bson_t m, spec;
		const char *st, *from, *to;
		/* the migration's spec is its registerMigration {ns, chunk, from, to} */
		if (!px_doc_of(&arr, &m) || !px_get_doc(&m, "spec", &spec))
			continue;
		st = px_str_of(&m, "state");
		if (st == NULL || strcmp(st, "complete") == 0 || strcmp(st, "aborted") == 0 ||
		    strcmp(st, "rolled_back") == 0)
			continue;
		from = px_str_of(&spec, "from");
		to = px_str_of(&spec, "to");
		if ((nid != 0 && px_get_int(&spec, "chunk", 0) == nid) ||
		    (shard && ((from && strcmp(from, shard) == 0) || (to && strcmp(to, shard) == 0))))
			n++;
	}
	return n;
}

/* Mark shard id draining in metadata (setShardDraining), so that shardCollection places no
 * new chunk on it. Needs cluster op version 3 (raft/migstate.h): below it metadata answers
 * IllegalOperation and the drain goes on unmarked, as before. Returns: 0, or the code
 * answered on c (metadata unreachable or another error). */
static int mark_draining(ctx *c, const char *id)
{
	static const int below_v3[] = {WIRE_ERR_ILLEGAL_OPERATION, 0};
	bson_t cmd = BSON_INITIALIZER, r;
	int code = 0, st;

	BSON_APPEND_UTF8(&cmd, "setShardDraining", id);
	BSON_APPEND_BOOL(&cmd, "draining", true);
	st = px_sharding_meta_call(c, &cmd, &r, below_v3, &code);
	if (st == 0)
		bson_destroy(&r);
	bson_destroy(&cmd);
	return st;
}

/* drop_draining's question about one shard of a listShards reply. */
typedef struct draining_q {
	const char *id;
	bool draining; /* set when an entry of id has state "draining" */
} draining_q;

static void is_draining(const bson_t *sh, void *arg)
{
	draining_q *q = arg;
	const char *sid = px_str_of(sh, "id"), *st = px_str_of(sh, "state");

	if (sid && st && strcmp(sid, q->id) == 0 && strcmp(st, "draining") == 0)
		q->draining = true;
}

/* Drop the draining shards (metadata listShards state "draining") from ids[0..n), freeing
 * them; the count kept. On a metadata error the list is kept whole. */
static size_t drop_draining(ctx *c, char **ids, size_t n)
{
	bson_t q = BSON_INITIALIZER, reply;
	char err[256];
	int code = 0;
	size_t i, kept = 0;

	BSON_APPEND_INT32(&q, "listShards", 1);
	if (proxy_meta_command(c->p, &q, &reply, &code, err, sizeof err) != 0) {
		bson_destroy(&reply);
		bson_destroy(&q);
		return n;
	}
	for (i = 0; i < n; i++) {
		draining_q q = {.id = ids[i]};
		px_each_doc(&reply, "shards", is_draining, &q);
		if (q.draining)
			free(ids[i]);
		else
			ids[kept++] = ids[i];
	}
	bson_destroy(&reply);
	bson_destroy(&q);
	return kept;
}

/* {removeShard: ID} as on a mongos. A shard that owns chunks is drained: the first call
 * registers one Data Movement Platform migration per chunk it owns, spread round-robin over
 * the other shards (run by the coordinators, as `stripedb ctl shard drain`), and answers
 * state "started"; later calls answer "ongoing" with remaining.chunks, registering a
 * migration again for any chunk whose migration ended without moving it (aborted, rolled
 * back) or that appeared since; once it owns nothing and no migration from or to it is still
 * running (a switched migration still cleans up on the donor) the shard is removed (state
 * "completed"). A shard that is the primary shard of a database still holding unsharded
 * collections on it is refused (IllegalOperation 20, naming them: there is no movePrimary;
 * issue #18); metadata then moves the primary of its other databases to the lowest
 * remaining shard id. From cluster op version 3 the shard is marked draining in metadata
 * (setShardDraining): shardCollection places no chunk on it, listShards and config.shards
 * show draining: true, and no drain sends chunks to another draining shard. Below op
 * version 3 there is no mark: a shardCollection meanwhile may still place chunks on it
 * (the next call drains them). */
int px_do_remove_shard(ctx *c)
{
	const char *id = px_first_utf8(c->cmd);
	int64_t n, i;
	bson_t cmd = BSON_INITIALIZER, reply, *out;
	char **ids = NULL, err[256];
	size_t nids, j, nothers = 0;
	bool known = false, have_migs = false;
	owned_chunk *owned = NULL;
	bson_t migs;
	int64_t running;
	int st;

	if ((st = px_need_admin_db(c, "removeShard")) != 0)
		return st;
	if (id == NULL || id[0] == '\0') {
		return px_error(c, WIRE_ERR_BAD_VALUE, "removeShard needs a shard id string");
	}
	nids = px_shard_ids(c, &ids);
	for (j = 0; j < nids; j++) {
		if (strcmp(ids[j], id) == 0) {
			known = true;
			free(ids[j]);
		} else {
			ids[nothers++] = ids[j]; /* the other shards, kept for the drain */
		}
	}
	if (!known) {
		st = px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %s not found", id);
		goto out;
	}
	if (nids > 1) {
		char names[2048];
		int64_t nu;
		if ((st = px_unsharded_on(c, id, names, sizeof names, &nu)) != 0)
			goto out;
		if (nu > 0) {
			st = px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				      "cannot remove shard %s: it is the primary shard of databases "
				      "that still hold %lld unsharded collection(s): %s%s; you need to "
				      "call movePrimary (not supported by stripedb: drop them, or copy "
				      "them to a database with another primary shard)",
				      id, (long long)nu, names, nu > 20 ? ", ..." : "");
			goto out;
		}
	}
	if ((st = chunks_on(c, id, &owned, &n)) != 0)
		goto out;
	{
		bson_t q = BSON_INITIALIZER;
		BSON_APPEND_INT32(&q, "listMigrations", 1);
		if ((st = px_sharding_meta_call(c, &q, &migs, NULL, NULL)) != 0) {
			bson_destroy(&q);
			goto out;
		}
		have_migs = true;
		bson_destroy(&q);
	}
	running = active_migrations(&migs, 0, id);
	if (n > 0 || running > 0) {
		bson_t rem;
		int64_t moving = 0, started = 0;
		nothers = drop_draining(c, ids, nothers);
		if (n > 0 && nothers == 0) {
			st = px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				      "cannot remove shard %s: it owns %lld chunks and there is no "
				      "other shard (that is not draining) to drain them to",
				      id, (long long)n);
			goto out;
		}
		if ((st = mark_draining(c, id)) != 0)
			goto out;
		for (i = 0; i < n; i++) {
			char mid[160];
			bson_t r;
			if (active_migrations(&migs, owned[i].nid, NULL) > 0) {
				moving++;
				continue;
			}
			snprintf(mid, sizeof mid, "drain-%s-%lld-%llx", id, (long long)owned[i].nid,
				 (unsigned long long)sdb_wall_ms());
			bson_reinit(&cmd);
			BSON_APPEND_UTF8(&cmd, "registerMigration", mid);
			BSON_APPEND_UTF8(&cmd, "ns", owned[i].ns);
			BSON_APPEND_INT64(&cmd, "chunk", owned[i].nid);
			BSON_APPEND_UTF8(&cmd, "from", id);
			BSON_APPEND_UTF8(&cmd, "to", ids[(size_t)i % nothers]);
			if ((st = px_sharding_meta_call(c, &cmd, &r, NULL, NULL)) != 0)
				goto out;
			bson_destroy(&r);
			started++;
		}
		sdb_info("shard drain", "shard=%s chunks=%lld moving=%lld registered=%lld "
			 "running=%lld", id, (long long)n, (long long)moving, (long long)started,
			 (long long)running);
		out = bson_new();
		if (running == 0) {
			BSON_APPEND_UTF8(out, "msg", "draining started successfully");
			BSON_APPEND_UTF8(out, "state", "started");
			BSON_APPEND_UTF8(out, "shard", id);
		} else {
			BSON_APPEND_UTF8(out, "msg", "draining ongoing");
			BSON_APPEND_UTF8(out, "state", "ongoing");
			bson_append_document_begin(out, "remaining", -1, &rem);
			BSON_APPEND_INT64(&rem, "chunks", n);
			BSON_APPEND_INT64(&rem, "dbs", 0);
			BSON_APPEND_INT64(&rem, "jumboChunks", 0);
			bson_append_document_end(out, &rem);
		}
		BSON_APPEND_UTF8(out, "note",
				 "the Data Movement Platform moves each chunk (stripedb ctl migration "
				 "list); call removeShard again to see the progress");
		{
			bson_t dbs;
			bson_append_array_begin(out, "dbsToMove", -1, &dbs);
			bson_append_array_end(out, &dbs);
		}
		st = px_reply(c, out);
		goto out;
	}
	BSON_APPEND_UTF8(&cmd, "removeShard", id);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) == 0) {
		bson_destroy(&reply);
		if (proxy_load_shards(c->p, err, sizeof err) != 0)
			sdb_warn("shard list reload failed", "err=\"%s\"", err);
		out = bson_new();
		BSON_APPEND_UTF8(out, "msg", "removeshard completed successfully");
		BSON_APPEND_UTF8(out, "state", "completed");
		BSON_APPEND_UTF8(out, "shard", id);
		st = px_reply(c, out);
	}
out:
	for (j = 0; j < nothers; j++)
		free(ids[j]);
	free(ids);
	free(owned);
	if (have_migs)
		bson_destroy(&migs);
	bson_destroy(&cmd);
	return st;
}

/* The state of migration id into state (heap) and its migration document into mig
 * (initialised when 0 is returned). Returns: 0, or the code answered on c. */
static int migration_state(ctx *c, const char *id, char **state, bson_t *mig)
{
	bson_t cmd = BSON_INITIALIZER, reply, m;
	int st;

	BSON_APPEND_UTF8(&cmd, "getMigration", id);
	st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL);
	bson_destroy(&cmd);
	if (st != 0)
		return st;
	bson_init(mig);
	*state = NULL;
	if (px_get_doc(&reply, "migration", &m)) {
		bson_destroy(mig);
		bson_copy_to(&m, mig);
		bson_iter_t it;
		if (bson_iter_init_find(&it, &m, "state") && BSON_ITER_HOLDS_UTF8(&it))
			*state = sdb_strdup(bson_iter_utf8(&it, NULL));
	}
	bson_destroy(&reply);
	if (*state == NULL)
		*state = sdb_strdup("?");
	return 0;
}

/* Register one migration of chunk nid of ns from -> to (metadata registerMigration, run by
 * the coordinators) and wait for its end, answering c: {millis, migration} when complete
 * (the routing of sub->ns refreshed), OperationFailed (96) when it ended otherwise,
 * MaxTimeMSExpired (50) when it still runs after max_ms (it goes on). what names the
 * command in messages. Returns: the status of the answer. */
static int move_and_wait(ctx *c, ctx *sub, const char *what, const char *ns, int64_t nid,
			 const char *from, const char *to, int64_t max_ms, uint64_t start)
{
	bson_t cmd = BSON_INITIALIZER, reply, mig, *out;
	route_coll *rc;
	char err[256], mid[128], *state = NULL;
	int st;

	/* one migration of a chunk at a time, as MongoDB's ActiveMigrationsRegistry answers a
	 * second moveChunk of a chunk being moved. A registration racing this one (another
	 * proxy, ctl migrate) is refused by metadata itself with the same 117 from cluster op
	 * version 3 (raft/migstate.h); below it, the coordinators end the second record. */
	{
		bson_t q = BSON_INITIALIZER, migs;
		BSON_APPEND_INT32(&q, "listMigrations", 1);
		st = px_sharding_meta_call(c, &q, &migs, NULL, NULL);
		bson_destroy(&q);
		if (st != 0)
			return st;
		int64_t busy = active_migrations(&migs, nid, NULL);
		bson_destroy(&migs);
		if (busy > 0)
			return px_error(c, WIRE_ERR_CONFLICTING_OPERATION,
					"%s: chunk %lld of %s is already being migrated; try again "
					"once that migration has ended",
					what, (long long)nid, ns);
	}
	/* unique across proxies and calls in the same millisecond (two moveChunks of one chunk
	 * at once got the same id, hence 11000) */
	snprintf(mid, sizeof mid, "mig-proxy-%lld-%llx-%08x", (long long)nid,
		 (unsigned long long)sdb_wall_ms(), arc4random());
	BSON_APPEND_UTF8(&cmd, "registerMigration", mid);
	BSON_APPEND_UTF8(&cmd, "ns", ns);
	BSON_APPEND_INT64(&cmd, "chunk", nid);
	BSON_APPEND_UTF8(&cmd, "from", from);
	BSON_APPEND_UTF8(&cmd, "to", to);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) != 0) {
		bson_destroy(&cmd);
		return st;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	for (;;) {
		if ((st = migration_state(c, mid, &state, &mig)) != 0)
			return st;
		if (strcmp(state, "complete") == 0 || strcmp(state, "aborted") == 0 ||
		    strcmp(state, "rolled_back") == 0)
			break;
		bson_destroy(&mig);
		free(state);
		state = NULL;
		if (sdb_mono_ms() - start > (uint64_t)max_ms)
			return px_error(c, WIRE_ERR_MAX_TIME_EXPIRED,
					"%s: migration %s still running after %lld ms (it goes on: "
					"stripedb ctl migration status %s)",
					what, mid, (long long)max_ms, mid);
		shardconn_wait_begin(); /* the coordinators' progress, polled: slow, answered */
		sdb_sleep_ms(100);
		shardconn_wait_end();
	}
	bson_destroy(&mig);
	if (strcmp(state, "complete") == 0) {
		rc = px_route(sub, true, err, sizeof err);
		if (rc)
			route_coll_unref(rc);
		out = bson_new();
		BSON_APPEND_INT64(out, "millis", (int64_t)(sdb_mono_ms() - start));
		BSON_APPEND_UTF8(out, "migration", mid);
		st = px_reply(c, out);
	} else {
		st = px_error(c, WIRE_ERR_OPERATION_FAILED, "%s: migration %s ended %s", what, mid,
			      state);
	}
	free(state);
	return st;
}

/* The checks moveChunk and moveRange share: the admin database, ns (the command's first
 * value) a sharded namespace, the destination (field to_field) a known shard, maxTimeMS.
 * On success *rc is ns's routing (refreshed; unref it), *to points into c->cmd, sub is c
 * for ns. Returns: 0, or the code answered on c (*rc not set). */
static int move_prepare(ctx *c, const char *what, const char *to_field, ctx *sub,
			route_coll **rc, const char **to, int64_t *max_ms)
{
	const char *ns = px_first_utf8(c->cmd);
	bson_iter_t it;
	char **ids = NULL;
	size_t n, i;
	bool known = false;
	int st;

	if ((st = px_need_admin_db(c, what)) != 0 || (st = ns_check(c, ns)) != 0)
		return st;
	*to = NULL;
	if (bson_iter_init_find(&it, c->cmd, to_field) && BSON_ITER_HOLDS_UTF8(&it))
		*to = bson_iter_utf8(&it, NULL);
	if (*to == NULL || (*to)[0] == '\0')
		return px_error(c, WIRE_ERR_BAD_VALUE, "%s needs the destination shard as %s",
				what, to_field);
	if ((st = px_client_int(c, "maxTimeMS", 0, INT32_MAX, 15 * 60 * 1000, max_ms)) != 0)
		return st;
	if (*max_ms == 0)
		*max_ms = 15 * 60 * 1000;
	n = px_shard_ids(c, &ids);
	for (i = 0; i < n; i++) {
		known |= strcmp(ids[i], *to) == 0;
		free(ids[i]);
	}
	free(ids);
	if (!known)
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %s not found", *to);
	return sharded_route(c, sub, ns, rc);
}

/* {moveChunk: "db.coll", find: {key...} | bounds: [min, max], to: SHARD} (sh.moveChunk): one
 * migration of the Data Movement Platform (metadata registerMigration {ns, chunk, from, to}),
 * run by the coordinators; answered when it is complete, as MongoDB's moveChunk is
 * synchronous (`_waitForDelete`, `secondaryThrottle`, `writeConcern` are accepted: a migration
 * completes after its cleanup). A migration that ends otherwise: OperationFailed (96) with
 * its id and state; still running after maxTimeMS (default 15 minutes): MaxTimeMSExpired (50)
 * with its id (it goes on). Already on `to`: ok at once. */
int px_do_move_chunk(ctx *c)
{
	const char *ns = px_first_utf8(c->cmd), *to = NULL;
	ctx sub;
	route_coll *rc;
	ssize_t ci = -1;
	char *from = NULL;
	int64_t nid = 0, max_ms;
	uint64_t start = sdb_mono_ms();
	int st;

	if ((st = move_prepare(c, "moveChunk", "to", &sub, &rc, &to, &max_ms)) != 0)
		return st;
	if (bson_has_field(c->cmd, "find") || bson_has_field(c->cmd, "bounds")) {
		ci = chunk_of_find_or_bounds(c, rc);
	} else {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE, "moveChunk needs find or bounds");
	}
	if (ci >= 0) {
		nid = rc->chunks[ci].nid;
		from = sdb_strdup(rc->chunks[ci].shard);
	}
	route_coll_unref(rc);
	if (ci < 0 || nid == 0) {
		free(from);
		return px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s matches the find or bounds given", ns);
	}
	if (strcmp(from, to) == 0) {
		free(from);
		return px_reply(c, bson_new()); /* already there (MongoDB: ok) */
	}
	st = move_and_wait(c, &sub, "moveChunk", ns, nid, from, to, max_ms, start);
	free(from);
	return st;
}

/* Split chunk nid of sub->ns at key (metadata splitChunk) and refresh sub's routing.
 * Returns: 0, or the code answered on c. */
static int split_at(ctx *c, ctx *sub, int64_t nid, const bson_t *key)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	route_coll *rc;
	char err[256];
	int st;

	BSON_APPEND_INT64(&cmd, "splitChunk", nid);
	BSON_APPEND_DOCUMENT(&cmd, "at", key);
	st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL);
	bson_destroy(&cmd);
	if (st != 0)
		return st;
	bson_destroy(&reply);
	rc = px_route(sub, true, err, sizeof err);
	if (rc)
		route_coll_unref(rc);
	return 0;
}

/* {moveRange: "db.coll", toShard: SHARD, min: {key...}, max: {key...}} (MongoDB 6.0,
 * sh.moveRange): the range [min, max) must lie within one chunk (MongoDB's rule: a range
 * spanning chunks is refused); a missing max is the chunk's max, a missing min the min of the
 * chunk that max ends or holds (stripedb does not cut by chunk size). When the range is a
 * part of its chunk, the chunk is split at min and/or max first (metadata splitChunk), then
 * the range's chunk moves as moveChunk's does (waited for; forceJumbo, waitForDelete,
 * secondaryThrottle and writeConcern accepted: migrations have no jumbo limit and complete
 * after their cleanup). A range already on toShard: ok. Hashed keys: min/max are values of
 * the hash space (NumberLong), as in MongoDB. */
int px_do_move_range(ctx *c)
{
	const char *ns = px_first_utf8(c->cmd), *to = NULL;
	ctx sub;
	bson_t lo, hi, lo_c, hi_c; /* lo_c, hi_c: the range, initialised by bson_copy_to */
	bool have_lo, have_hi;
	route_coll *rc;
	ssize_t ci;
	char *from = NULL;
	int64_t nid, max_ms;
	uint64_t start = sdb_mono_ms();
	int st;

	if ((st = move_prepare(c, "moveRange", "toShard", &sub, &rc, &to, &max_ms)) != 0)
		return st;
	have_lo = px_get_doc(c->cmd, "min", &lo) && !bson_empty(&lo);
	have_hi = px_get_doc(c->cmd, "max", &hi) && !bson_empty(&hi);
	if (!have_lo && !have_hi) {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE, "moveRange needs min or max (the range to move)");
	}
	if (have_lo) {
		ci = route_find_chunk(rc, &lo);
	} else {
		/* the chunk that ends at max, else the one holding it */
		ci = route_find_chunk(rc, &hi);
		if (ci > 0 && route_key_cmp(rc->chunks[ci].min, &hi) == 0)
			ci--;
		else if (ci < 0 && rc->nchunks > 0 &&
			 route_key_cmp(rc->chunks[rc->nchunks - 1].max, &hi) == 0)
			ci = (ssize_t)rc->nchunks - 1;
	}
	if (ci < 0) {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s holds the range given", ns);
	}
	bson_copy_to(have_lo ? &lo : rc->chunks[ci].min, &lo_c);
	bson_copy_to(have_hi ? &hi : rc->chunks[ci].max, &hi_c);
	if (route_key_cmp(&lo_c, &hi_c) >= 0 || route_key_cmp(&lo_c, rc->chunks[ci].min) < 0 ||
	    route_key_cmp(&hi_c, rc->chunks[ci].max) > 0) {
		route_coll_unref(rc);
		st = px_error(c, WIRE_ERR_BAD_VALUE,
			      "moveRange: [min, max) of %s must be a non-empty range within one "
			      "chunk (a range spanning several chunks is not allowed, as in MongoDB)",
			      ns);
		goto out;
	}
	nid = rc->chunks[ci].nid;
	if (strcmp(rc->chunks[ci].shard, to) == 0) {
		route_coll_unref(rc);
		st = px_reply(c, bson_new()); /* already there */
		goto out;
	}
	/* cut the range out of its chunk */
	if (route_key_cmp(&lo_c, rc->chunks[ci].min) > 0) {
		route_coll_unref(rc);
		rc = NULL;
		if ((st = split_at(c, &sub, nid, &lo_c)) != 0)
			goto out;
	}
	if (rc == NULL || route_key_cmp(&hi_c, rc->chunks[ci].max) < 0) {
		if (rc == NULL && (st = cached_route(c, &sub, &rc)) != 0)
			goto out;
		ci = route_find_chunk(rc, &lo_c);
		if (ci >= 0 && route_key_cmp(&hi_c, rc->chunks[ci].max) < 0) {
			nid = rc->chunks[ci].nid;
			route_coll_unref(rc);
			rc = NULL;
			if ((st = split_at(c, &sub, nid, &hi_c)) != 0)
				goto out;
		}
	}
	if (rc == NULL && (st = cached_route(c, &sub, &rc)) != 0)
		goto out;
	ci = route_find_chunk(rc, &lo_c);
	if (ci < 0 || route_key_cmp(rc->chunks[ci].min, &lo_c) != 0 ||
	    route_key_cmp(rc->chunks[ci].max, &hi_c) != 0) {
		route_coll_unref(rc);
		st = px_error(c, 117 /* ConflictingOperationInProgress */,
			      "moveRange: the chunks of %s changed while the range was cut out: "
			      "retry",
			      ns);
		goto out;
	}
	nid = rc->chunks[ci].nid;
	from = sdb_strdup(rc->chunks[ci].shard);
	route_coll_unref(rc);
	st = move_and_wait(c, &sub, "moveRange", ns, nid, from, to, max_ms, start);
	free(from);
out:
	bson_destroy(&lo_c);
	bson_destroy(&hi_c);
	return st;
}

/* {mergeChunks: "db.coll", bounds: [min, max]} (sh.mergeChunks): the chunks that exactly
 * cover [min, max) (contiguous, on one shard) become one (metadata mergeChunks; its token is
 * the largest of theirs, so shard versions do not change). Bounds that are not chunk bounds,
 * chunks on several shards: IllegalOperation (20); one chunk: ok (nothing to merge). */
int px_do_merge_chunks(ctx *c)
{
	const char *ns = px_first_utf8(c->cmd), *shard = NULL;
	ctx sub;
	bson_t bounds, lo, hi, cmd = BSON_INITIALIZER, ids;
	route_coll *rc;
	ssize_t ci;
	size_t n = 0;
	char k[24];
	int st;

	if ((st = px_need_admin_db(c, "mergeChunks")) != 0 || (st = ns_check(c, ns)) != 0)
		return st;
	if (!px_get_array(c->cmd, "bounds", &bounds) || !px_get_doc(&bounds, "0", &lo) ||
	    !px_get_doc(&bounds, "1", &hi) || bson_count_keys(&bounds) != 2) {
		return px_error(c, WIRE_ERR_BAD_VALUE, "mergeChunks needs bounds: [min, max]");
	}
	if ((st = sharded_route(c, &sub, ns, &rc)) != 0)
		return st;
	ci = route_find_chunk(rc, &lo);
	if (ci < 0 || route_key_cmp(rc->chunks[ci].min, &lo) != 0) {
		route_coll_unref(rc);
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"could not merge chunks of %s: min is not the lower bound of a chunk", ns);
	}
	BSON_APPEND_UTF8(&cmd, "mergeChunks", ns);
	bson_append_array_begin(&cmd, "ids", -1, &ids);
	for (; (size_t)ci < rc->nchunks; ci++) {
		const route_chunk *ch = &rc->chunks[ci];
		if (shard && strcmp(shard, ch->shard) != 0)
			break;
		shard = ch->shard;
		snprintf(k, sizeof k, "%zu", n++);
		BSON_APPEND_INT64(&ids, k, ch->nid);
		if (route_key_cmp(ch->max, &hi) >= 0)
			break;
	}
	bson_append_array_end(&cmd, &ids);
	if ((size_t)ci >= rc->nchunks || route_key_cmp(rc->chunks[ci].max, &hi) != 0) {
		route_coll_unref(rc);
		bson_destroy(&cmd);
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"could not merge chunks of %s: [min, max) must be exactly covered by "
				"contiguous chunks of one shard", ns);
	}
	route_coll_unref(rc);
	if (n < 2) {
		bson_destroy(&cmd);
		return px_reply(c, bson_new()); /* one chunk: nothing to merge */
	}
	st = meta_change(c, &sub, &cmd);
	bson_destroy(&cmd);
	return st;
}
