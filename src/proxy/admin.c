/* Proxy admin commands (issue #6): broadcasts (drop, create, collMod, dropIndexes,
 * dropDatabase), createIndexes, listings (listIndexes, listCollections, listDatabases)
 * and the combined statistics of collStats / $collStats / dbStats, as mongos combines
 * them. */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth/gate.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/cmdopts.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "proxy/txn.h"
#include "storage/matcher.h"
#include "storage/pipeline.h"
#include "storage/projection.h"

/* ---------- broadcast and listings ---------- */

typedef struct bcast {
	ctx *c;
	char **ids;
	const bson_t *cmd;
	bson_t *replies;
	int *cls;
	char (*nerr)[256];
} bcast;

static void bcast_one(void *arg, size_t i)
{
	bcast *b = arg;

	b->cls[i] = px_run_on(b->c, b->ids[i], b->cmd, NULL, &b->replies[i], b->nerr[i],
			   sizeof b->nerr[i]);
}

/* Run cmd (stripped) on every shard. Returns the number of shards; fills b. */
static size_t broadcast(ctx *c, const bson_t *cmd, bcast *b)
{
	bson_t *fwd = bson_new();
	size_t n;

	px_copy_cmd(cmd, fwd, NULL);
	memset(b, 0, sizeof *b);
	b->c = c;
	n = px_shard_ids(c, &b->ids);
	b->cmd = fwd;
	b->replies = sdb_calloc_bson(n, sizeof *b->replies);
	b->cls = sdb_calloc(n ? n : 1, sizeof *b->cls);
	b->nerr = sdb_calloc(n ? n : 1, sizeof *b->nerr);
	px_fanout(c, n, bcast_one, b);
	return n;
}

static void bcast_free(bcast *b, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		bson_destroy(&b->replies[i]);
		free(b->ids[i]);
	}
	free(b->ids);
	free(b->replies);
	free(b->cls);
	free(b->nerr);
	bson_destroy((bson_t *)b->cmd);
}

int px_do_broadcast(ctx *c)
{
	bcast b;
	size_t n = broadcast(c, c->cmd, &b), i, ok_i = SIZE_MAX, err_i = SIZE_MAX;
	int st;

	if (n == 0) {
		bcast_free(&b, n);
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
	}
	for (i = 0; i < n; i++) {
		if (b.cls[i] == SHARDCONN_OK) {
			if (ok_i == SIZE_MAX)
				ok_i = i;
		} else if (err_i == SIZE_MAX) {
			int code = (int)px_get_int(&b.replies[i], "code", 0);
			/* dropping what a shard never had is fine */
			if (b.cls[i] == SHARDCONN_CMD_ERR &&
			    (code == WIRE_ERR_NAMESPACE_NOT_FOUND || code == WIRE_ERR_INDEX_NOT_FOUND ||
			     code == WIRE_ERR_NAMESPACE_EXISTS))
				continue;
			err_i = i;
		}
	}
	if (err_i != SIZE_MAX)
		st = px_reply_shard_error(c, b.cls[err_i], &b.replies[err_i], b.nerr[err_i]);
	else if (ok_i != SIZE_MAX)
		st = px_reply_copy(c, &b.replies[ok_i]);
	else
		st = px_reply_copy(c, &b.replies[0]);
	bcast_free(&b, n);
	return st;
}

/* createIndexes on a sharded collection: a unique index each shard cannot enforce alone
 * (not prefixed by the shard key, nor by _id) is refused with CannotCreateIndex (67) before any
 * shard builds it, as mongod refuses it on a sharded collection; everything else is broadcast.
 * Source: MongoDB's checkUniqueIndexConstraints (create_indexes.cpp). */
int px_do_create_indexes(ctx *c)
{
	route_coll *rc;
	bson_iter_t it, arr, spec;
	int st;

	/* routing unavailable: answered, no shard builds an unchecked index */
	if ((st = px_route_or_fail(c, &rc)) != 0)
		return st;
	if (rc->nkeys > 0 && bson_iter_init_find(&it, c->cmd, "indexes") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t f;
			bson_t key;
			const uint8_t *data;
			uint32_t len;
			bool unique = false, has_key = false;

			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &spec))
				continue; /* the shards refuse a malformed spec */
			while (bson_iter_next(&spec)) {
				if (strcmp(bson_iter_key(&spec), "unique") == 0)
					unique = bson_iter_as_bool(&spec);
				else if (strcmp(bson_iter_key(&spec), "key") == 0 &&
					 BSON_ITER_HOLDS_DOCUMENT(&spec))
					f = spec, has_key = true;
			}
			if (!unique || !has_key)
				continue;
			bson_iter_document(&f, &len, &data);
			if (!bson_init_static(&key, data, len) || route_unique_index_compatible(rc, &key))
				continue;
			{
				char *ks = bson_as_relaxed_extended_json(&key, NULL);
				bson_t sk = BSON_INITIALIZER;
				char *ss;
				size_t i;
				for (i = 0; i < rc->nkeys; i++) {
					if (rc->hashed)
						BSON_APPEND_UTF8(&sk, rc->keys[i], "hashed");
					else
						BSON_APPEND_INT32(&sk, rc->keys[i], 1);
				}
				ss = bson_as_relaxed_extended_json(&sk, NULL);
				st = px_error(c, WIRE_ERR_CANNOT_CREATE_INDEX,
					      "cannot create unique index over %s with shard key pattern %s",
					      ks ? ks : "?", ss ? ss : "?");
				bson_free(ks);
				bson_free(ss);
				bson_destroy(&sk);
			}
			route_coll_unref(rc);
			return st;
		}
	}
	route_coll_unref(rc);
	return px_do_broadcast(c);
}

int px_do_list_indexes(ctx *c)
{
	route_coll *rc;
	char *shard = NULL;
	int st;

	if ((st = px_route_or_fail(c, &rc)) != 0)
		return st;
	if (rc->nchunks > 0)
		shard = sdb_strdup(rc->chunks[0].shard);
	route_coll_unref(rc);
	if (shard == NULL && (st = px_with_primary(c, &shard)) != 0)
		return st;
	st = px_forward_cursor(c, shard, c->cmd, -1, false);
	free(shard);
	return st;
}

/* Sharded collections metadata knows that no shard has created yet (nothing inserted):
 * listed too, unless the client filtered the listing (the filter ran on the shards). */
static void add_metadata_collections(ctx *c, bson_t *merged, size_t *count)
{
	bson_t cmd = BSON_INITIALIZER, reply, f;
	bson_iter_t it, arr, e;
	char err[256];
	int code;
	bool name_only = px_get_bool(c->cmd, "nameOnly", false);

	if (px_get_doc(c->cmd, "filter", &f) && !bson_empty(&f))
		return;
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_UTF8(&cmd, "db", c->db);
	if (proxy_meta_command(c->p, &cmd, &reply, &code, err, sizeof err) == 0 &&
	    bson_iter_init_find(&it, &reply, "collections") && bson_iter_recurse(&it, &arr)) {
		size_t dblen = strlen(c->db);
		while (bson_iter_next(&arr)) {
			const char *ns, *name;
			bool dup = false;
			bson_iter_t m;
			if (!bson_iter_recurse(&arr, &e) || !bson_iter_find(&e, "ns") ||
			    !BSON_ITER_HOLDS_UTF8(&e))
				continue;
			ns = bson_iter_utf8(&e, NULL);
			if (strncmp(ns, c->db, dblen) != 0 || ns[dblen] != '.')
				continue;
			name = ns + dblen + 1;
			if (bson_iter_init(&m, merged))
				while (bson_iter_next(&m)) {
					bson_iter_t mf;
					if (bson_iter_recurse(&m, &mf) && bson_iter_find(&mf, "name") &&
					    BSON_ITER_HOLDS_UTF8(&mf) && strcmp(bson_iter_utf8(&mf, NULL), name) == 0)
						dup = true;
				}
			if (!dup) {
				char k[24];
				bson_t d, o, info;
				snprintf(k, sizeof k, "%zu", (*count)++);
				bson_append_document_begin(merged, k, -1, &d);
				BSON_APPEND_UTF8(&d, "name", name);
				BSON_APPEND_UTF8(&d, "type", "collection");
				if (!name_only) {
					bson_append_document_begin(&d, "options", -1, &o);
					bson_append_document_end(&d, &o);
					bson_append_document_begin(&d, "info", -1, &info);
					BSON_APPEND_BOOL(&info, "readOnly", false);
					bson_append_document_end(&d, &info);
				}
				bson_append_document_end(merged, &d);
			}
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* A database's sizeOnDisk summed over the shards' listDatabases replies of b (n). */
static int64_t db_size(const bcast *b, size_t n, const char *name)
{
	int64_t size = 0;

	for (size_t i = 0; i < n; i++) {
		bson_iter_t it, arr, f;
		bool this_db;

		if (b->cls[i] != SHARDCONN_OK || !bson_iter_init_find(&it, &b->replies[i], "databases") ||
		    !bson_iter_recurse(&it, &arr))
			continue;
		while (bson_iter_next(&arr)) {
			int64_t s = 0;

			this_db = false;
			if (!bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "name") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					this_db = strcmp(bson_iter_utf8(&f, NULL), name) == 0;
				else if (strcmp(bson_iter_key(&f), "sizeOnDisk") == 0 &&
					 BSON_ITER_HOLDS_NUMBER(&f))
					s = bson_iter_as_int64(&f);
			}
			if (this_db)
				size += s;
		}
	}
	return size;
}

/* listDatabases through the proxy: *merged (the union by name, each the first shard's
 * document) rebuilt as {name, sizeOnDisk (summed over the shards), empty} ({name} with
 * name_only) keeping the documents match (the client's filter, may match all) matches.
 * Returns: the sum of the kept databases' sizes (totalSize). */
static int64_t filter_databases(const bcast *b, size_t n, bson_t *merged, bool name_only,
				const sdb_matcher *match)
{
	bson_t kept = BSON_INITIALIZER;
	bson_iter_t it, f;
	int64_t total = 0;
	size_t k = 0;

	if (bson_iter_init(&it, merged))
		while (bson_iter_next(&it)) {
			const char *name;
			int64_t size;
			bson_t d = BSON_INITIALIZER;
			char key[24];

			if (!bson_iter_recurse(&it, &f) || !bson_iter_find(&f, "name") ||
			    !BSON_ITER_HOLDS_UTF8(&f))
				continue;
			name = bson_iter_utf8(&f, NULL);
			size = db_size(b, n, name);
			BSON_APPEND_UTF8(&d, "name", name);
			if (!name_only) {
				BSON_APPEND_INT64(&d, "sizeOnDisk", size);
				BSON_APPEND_BOOL(&d, "empty", size == 0);
			}
			if (sdb_matcher_match(match, &d)) {
				total += size;
				snprintf(key, sizeof key, "%zu", k++);
				BSON_APPEND_DOCUMENT(&kept, key, &d);
			}
			bson_destroy(&d);
		}
	bson_destroy(merged);
	bson_steal(merged, &kept);
	return total;
}

/* Union over shards of a listing: arrays at path cursor.firstBatch or `field`, deduplicated
 * by `name`; sizes (sizeOnDisk) summed for databases. */
int px_do_list_union(ctx *c, bool databases)
{
	static const char *const no_filter[] = {"filter", NULL};
	bcast b;
	size_t n, i, count = 0;
	bson_t merged = BSON_INITIALIZER, *out, fwd = BSON_INITIALIZER, filter = BSON_INITIALIZER;
	int64_t total = 0;
	bool any_ok = false, name_only = px_get_bool(c->cmd, "nameOnly", false);
	sdb_matcher *match = NULL;
	bson_iter_t fi;
	char err[512];
	int st, code = 0;

	/* listDatabases' filter (MongoDB list_databases.cpp, cluster_list_databases_cmd.cpp):
	 * a query over each database's merged document ({name, sizeOnDisk summed over the
	 * shards, empty}; {name} with nameOnly), run here on the merged listing: the shards
	 * are asked without it, since a size condition holds of the sum, not of one shard's
	 * part. totalSize sums the databases kept and is left out with nameOnly, as mongos. */
	if (databases) {
		if (bson_iter_init_find(&fi, c->cmd, "filter")) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&fi))
				return px_error(c, WIRE_ERR_TYPE_MISMATCH,
						"BSON field 'listDatabases.filter' is the wrong type "
						"'%s', expected type 'object'",
						sdb_bson_type_name(bson_iter_type(&fi)));
			px_get_doc(c->cmd, "filter", &filter);
		}
		if (sdb_matcher_new(&filter, &match, &code, err, sizeof err) != 0)
			return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		px_copy_cmd(c->cmd, &fwd, no_filter);
	} else {
		px_copy_cmd(c->cmd, &fwd, NULL);
	}
	n = broadcast(c, &fwd, &b);
	bson_destroy(&fwd);

	for (i = 0; i < n; i++) {
		bson_iter_t it, sub, arr;
		if (b.cls[i] != SHARDCONN_OK)
			continue;
		any_ok = true;
		if (databases) {
			if (!bson_iter_init_find(&it, &b.replies[i], "databases") ||
			    !bson_iter_recurse(&it, &arr))
				continue;
		} else {
			if (!bson_iter_init_find(&it, &b.replies[i], "cursor") ||
			    !bson_iter_recurse(&it, &sub) || !bson_iter_find(&sub, "firstBatch") ||
			    !bson_iter_recurse(&sub, &arr))
				continue;
		}
		while (bson_iter_next(&arr)) {
			bson_iter_t f, m;
			const char *name = NULL;
			bool dup = false;
			int64_t size = 0;
			if (!bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "name") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					name = bson_iter_utf8(&f, NULL);
				if (strcmp(bson_iter_key(&f), "sizeOnDisk") == 0 &&
				    BSON_ITER_HOLDS_NUMBER(&f))
					size = bson_iter_as_int64(&f);
			}
			total += size;
			if (name == NULL)
				continue;
			if (bson_iter_init(&m, &merged))
				while (bson_iter_next(&m)) {
					bson_iter_t mf;
					bson_iter_recurse(&m, &mf);
					if (bson_iter_find(&mf, "name") &&
					    strcmp(bson_iter_utf8(&mf, NULL), name) == 0)
						dup = true;
				}
			if (!dup) {
				char k[24];
				uint32_t len;
				const uint8_t *data;
				bson_t d;
				snprintf(k, sizeof k, "%zu", count++);
				bson_iter_document(&arr, &len, &data);
				bson_init_static(&d, data, len);
				BSON_APPEND_DOCUMENT(&merged, k, &d);
			}
		}
	}
	if (!any_ok) {
		if (n > 0)
			st = px_reply_shard_error(c, b.cls[0], &b.replies[0], b.nerr[0]);
		else
			st = px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
		bcast_free(&b, n);
		bson_destroy(&merged);
		sdb_matcher_free(match);
		return st;
	}
	if (databases)
		total = filter_databases(&b, n, &merged, name_only, match);
	sdb_matcher_free(match);
	if (!databases)
		add_metadata_collections(c, &merged, &count);
	out = bson_new();
	if (databases) {
		bson_append_array(out, "databases", -1, &merged);
		if (!name_only)
			BSON_APPEND_INT64(out, "totalSize", total);
	} else {
		bson_t cd;
		char ns[512];
		snprintf(ns, sizeof ns, "%s.$cmd.listCollections", c->db);
		bson_append_document_begin(out, "cursor", -1, &cd);
		BSON_APPEND_INT64(&cd, "id", 0);
		BSON_APPEND_UTF8(&cd, "ns", ns);
		bson_append_array(&cd, "firstBatch", -1, &merged);
		bson_append_document_end(out, &cd);
	}
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	st = px_reply(c, out);
	bson_destroy(&merged);
	bcast_free(&b, n);
	return st;
}

/* ---------- collStats / dbStats / explain (mongos' combined replies) ---------- */

/* A shard's reply as a sub-document, without the cluster time fields. */
static void append_shard_reply(bson_t *out, const char *key, const bson_t *reply)
{
	bson_t d;
	bson_iter_t it;

	bson_append_document_begin(out, key, -1, &d);
	if (bson_iter_init(&it, reply))
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "$clusterTime") == 0 || strcmp(k, "operationTime") == 0)
				continue;
			bson_append_iter(&d, k, -1, &it);
		}
	bson_append_document_end(out, &d);
}

/* cmd with its command name (first key) replaced by name (dbstats -> dbStats: the shards
 * know the canonical names only), other fields as px_copy_cmd keeps them. */
static void copy_renamed(const bson_t *cmd, bson_t *out, const char *name)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return;
	bson_append_value(out, name, -1, bson_iter_value(&it));
	while (bson_iter_next(&it))
		if (!px_is_session_field(bson_iter_key(&it)))
			bson_append_iter(out, bson_iter_key(&it), -1, &it);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards owning a chunk of rc, sorted by id (heap array of heap strings). */
static size_t owning_shards(const route_coll *rc, char ***out)
{
	char **ids = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *ids);
	size_t i, k, n = 0;

	for (i = 0; i < rc->nchunks; i++) {
		bool dup = false;
		for (k = 0; k < n && !dup; k++)
			dup = strcmp(ids[k], rc->chunks[i].shard) == 0;
		if (!dup)
			ids[n++] = sdb_strdup(rc->chunks[i].shard);
	}
	sdb_qsort(ids, n, sizeof *ids, str_cmp);
	*out = ids;
	return n;
}

/* Per-index sums of collStats.indexSizes. */
typedef struct isizes {
	char **names;
	int64_t *vals;
	size_t n, cap;
} isizes;

static void isizes_add(isizes *s, const char *name, int64_t v)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		if (strcmp(s->names[i], name) == 0) {
			s->vals[i] += v;
			return;
		}
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 8;
		s->names = sdb_realloc(s->names, s->cap * sizeof *s->names);
		s->vals = sdb_realloc(s->vals, s->cap * sizeof *s->vals);
	}
	s->names[s->n] = sdb_strdup(name);
	s->vals[s->n++] = v;
}

static void isizes_free(isizes *s)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		free(s->names[i]);
	free(s->names);
	free(s->vals);
}

/* collStats (mongos' cluster collStats): sent to every shard owning a chunk of the
 * collection (unsharded: its primary shard); count, size, storageSize, totalIndexSize and
 * indexSizes are summed, nindexes is the largest, avgObjSize = size / count, the replies
 * are kept under shards.<id>. A shard that has no document of a sharded collection yet
 * answers NamespaceNotFound and adds nothing. */
/* Run command `name` on every shard owning a chunk of c->ns (unsharded: its primary): the
 * client's command renamed to name (bare false) or {name: coll} (bare true, e.g. for the
 * $collStats aggregation stage). Returns: 0 with the calls in *out (px_pcalls_free them),
 * *n, *sharded and *nchunks; else *out NULL and the status of the answer given (the error,
 * or a shard's reply copied: 0 or its code). A shard of a sharded collection answering
 * NamespaceNotFound (no document there yet) is left out (its cls is not SHARDCONN_OK). */
static int owner_calls(ctx *c, const char *name, bool bare, size_t *n_out, bool *sharded,
		       int64_t *nchunks, pcall **out)
{
	static const int absent[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};
	route_coll *rc;
	char **ids = NULL;
	size_t n, i;
	pcall *pc, *bad;
	int st;

	*out = NULL;
	if ((st = px_route_or_fail(c, &rc)) != 0)
		return st;
	*sharded = rc->nkeys > 0;
	*nchunks = *sharded ? (int64_t)rc->nchunks : 1;
	if (*sharded) {
		n = owning_shards(rc, &ids);
		route_coll_unref(rc);
	} else {
		char *primary;
		route_coll_unref(rc);
		if ((st = px_with_primary(c, &primary)) != 0)
			return st;
		ids = sdb_calloc(1, sizeof *ids);
		ids[0] = primary;
		n = 1;
	}
	pc = px_pcalls_new(c, ids, n);
	for (i = 0; i < n; i++) {
		if (bare)
			BSON_APPEND_UTF8(&pc[i].cmd, name, c->coll);
		else
			copy_renamed(c->cmd, &pc[i].cmd, name);
	}
	px_fanout(c, n, px_pcall_one, pc);
	bad = px_pcalls_failed(pc, n, *sharded ? absent : NULL);
	if (bad) {
		if (bad->cls == SHARDCONN_NET_ERR)
			st = px_reply_shard_error(c, bad->cls, &bad->reply, bad->nerr);
		else /* e.g. the collection does not exist: its {ok: 0} reply */
			st = px_reply_copy(c, &bad->reply);
		px_pcalls_free(pc, n);
		return st;
	}
	*n_out = n;
	*out = pc;
	return 0;
}

/* {$collStats: {storageStats: {...}, count: {}}} as the first stage of an aggregate (what
 * mongosh's coll.stats() runs): one document per shard, as mongos answers,
 * {ns, shard, host, localTime, storageStats: <the shard's collStats>, count: N}; the later
 * stages run over them on the proxy (read.c). latencyStats and queryExecStats are not kept
 * by stripedb: FailedToParse (9), as a server that does not know them, so mongosh falls
 * back to the collStats command. */
int px_coll_stats_stage_docs(ctx *c, const bson_t *spec, bson_t ***docs, size_t *ndocs)
{
	bson_iter_t it;
	size_t n = 0, i;
	bool sharded, want_storage = false, want_count = false;
	int64_t nchunks;
	pcall *pc;
	int rst;

	*docs = NULL;
	*ndocs = 0;
	if (bson_iter_init(&it, spec)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "storageStats") == 0)
				want_storage = true;
			else if (strcmp(k, "count") == 0)
				want_count = true;
			else if (strcmp(k, "latencyStats") == 0 || strcmp(k, "queryExecStats") == 0)
				/* MongoDB 6.0's, not kept by stripedb: refused, as a shard */
				return px_error(c, WIRE_ERR_NOT_IMPLEMENTED,
						"$collStats: %s is not supported by stripedb "
						"(storageStats and count are)",
						k);
			else
				return px_error(c, 40415,
						"BSON field '$collStats.%s' is an unknown field.", k);
		}
	}
	if ((rst = owner_calls(c, "collStats", true, &n, &sharded, &nchunks, &pc)) != 0 || pc == NULL)
		return rst; /* answered (a shard's reply copied: maybe 0) */
	*docs = sdb_calloc(n ? n : 1, sizeof **docs);
	for (i = 0; i < n; i++) {
		bson_t *d, st;
		char *hosts;
		bson_iter_t f;
		if (pc[i].cls != SHARDCONN_OK)
			continue;
		d = bson_new();
		BSON_APPEND_UTF8(d, "ns", c->ns);
		BSON_APPEND_UTF8(d, "shard", pc[i].shard);
		hosts = px_shard_hosts(c, pc[i].shard);
		if (hosts)
			BSON_APPEND_UTF8(d, "host", hosts);
		free(hosts);
		bson_append_now_utc(d, "localTime", -1);
		if (want_storage) {
			bson_append_document_begin(d, "storageStats", -1, &st);
			if (bson_iter_init(&f, &pc[i].reply))
				while (bson_iter_next(&f))
					if (strcmp(bson_iter_key(&f), "ok") != 0 &&
					    strcmp(bson_iter_key(&f), "$clusterTime") != 0 &&
					    strcmp(bson_iter_key(&f), "operationTime") != 0)
						bson_append_iter(&st, NULL, 0, &f);
			bson_append_document_end(d, &st);
		}
		if (want_count) /* a top-level long, as each mongod answers it to mongos */
			BSON_APPEND_INT64(d, "count", px_get_int(&pc[i].reply, "count", 0));
		(*docs)[(*ndocs)++] = d;
	}
	px_pcalls_free(pc, n);
	return 0;
}

int px_do_coll_stats(ctx *c)
{
	size_t n = 0, i;
	pcall *pc;
	bool sharded;
	int64_t nchunks, count = 0, size = 0, storage = 0, total_idx = 0, nindexes = 0;
	isizes sizes;
	bson_t *out, shards, idx;
	int st;

	if ((st = owner_calls(c, "collStats", false, &n, &sharded, &nchunks, &pc)) != 0 || pc == NULL)
		return st;
	memset(&sizes, 0, sizeof sizes);
	out = bson_new();
	BSON_APPEND_UTF8(out, "ns", c->ns);
	BSON_APPEND_BOOL(out, "sharded", sharded);
	if (!sharded)
		BSON_APPEND_UTF8(out, "primary", pc[0].shard);
	bson_append_document_begin(out, "shards", -1, &shards);
	for (i = 0; i < n; i++) {
		bson_iter_t it, sub;
		if (pc[i].cls != SHARDCONN_OK)
			continue;
		count += px_get_int(&pc[i].reply, "count", 0);
		size += px_get_int(&pc[i].reply, "size", 0);
		storage += px_get_int(&pc[i].reply, "storageSize", 0);
		total_idx += px_get_int(&pc[i].reply, "totalIndexSize", 0);
		if (px_get_int(&pc[i].reply, "nindexes", 0) > nindexes)
			nindexes = px_get_int(&pc[i].reply, "nindexes", 0);
		if (bson_iter_init_find(&it, &pc[i].reply, "indexSizes") &&
		    BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub))
			while (bson_iter_next(&sub))
				if (BSON_ITER_HOLDS_NUMBER(&sub))
					isizes_add(&sizes, bson_iter_key(&sub), bson_iter_as_int64(&sub));
		append_shard_reply(&shards, pc[i].shard, &pc[i].reply);
	}
	bson_append_document_end(out, &shards);
	BSON_APPEND_INT64(out, "count", count);
	BSON_APPEND_INT64(out, "size", size);
	BSON_APPEND_INT64(out, "storageSize", storage);
	BSON_APPEND_INT64(out, "totalIndexSize", total_idx);
	BSON_APPEND_INT64(out, "avgObjSize", count ? size / count : 0);
	BSON_APPEND_INT64(out, "nindexes", nindexes);
	bson_append_document_begin(out, "indexSizes", -1, &idx);
	for (i = 0; i < sizes.n; i++)
		BSON_APPEND_INT64(&idx, sizes.names[i], sizes.vals[i]);
	bson_append_document_end(out, &idx);
	BSON_APPEND_BOOL(out, "capped", false);
	BSON_APPEND_INT64(out, "nchunks", nchunks);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	isizes_free(&sizes);
	px_pcalls_free(pc, n);
	return px_reply(c, out);
}

/* validate (mongos' cluster_validate_cmd.cpp): sent to every shard owning a chunk of the
 * collection (unsharded: its primary shard); each shard's reply under raw.<id>; a sharded
 * collection answers {valid: every shard's valid, raw}, an unsharded one its shard's reply
 * plus raw. A shard's error is the answer (the first one, as mongos). */
int px_do_validate(ctx *c)
{
	size_t n = 0, i;
	pcall *pc;
	bool sharded, valid = true;
	int64_t nchunks;
	bson_t *out, raw;
	bson_iter_t it;
	int st;

	if ((st = owner_calls(c, "validate", false, &n, &sharded, &nchunks, &pc)) != 0 ||
	    pc == NULL)
		return st;
	out = bson_new();
	for (i = 0; i < n; i++) {
		if (pc[i].cls != SHARDCONN_OK)
			continue;
		valid = valid && bson_iter_init_find(&it, &pc[i].reply, "valid") &&
			bson_iter_as_bool(&it);
		if (!sharded && bson_iter_init(&it, &pc[i].reply))
			while (bson_iter_next(&it)) {
				const char *k = bson_iter_key(&it);
				if (strcmp(k, "ok") != 0 && strcmp(k, "$clusterTime") != 0 &&
				    strcmp(k, "operationTime") != 0)
					bson_append_iter(out, k, -1, &it);
			}
	}
	if (sharded)
		BSON_APPEND_BOOL(out, "valid", valid);
	bson_append_document_begin(out, "raw", -1, &raw);
	for (i = 0; i < n; i++)
		if (pc[i].cls == SHARDCONN_OK)
			append_shard_reply(&raw, pc[i].shard, &pc[i].reply);
	bson_append_document_end(out, &raw);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	px_pcalls_free(pc, n);
	(void)nchunks;
	return px_reply(c, out);
}

/* dbStats (mongos' cluster dbStats): sent to every shard, as mongos does; collections,
 * views, objects, dataSize, storageSize, indexes and indexSize are summed (a collection
 * with documents on k shards counts k times, as on mongos), avgObjSize = dataSize /
 * objects, each shard's reply under raw.<id>. */
int px_do_db_stats(ctx *c)
{
	static const char *const sums[] = {"collections", "views",   "objects",   "dataSize",
					   "storageSize", "indexes", "indexSize", NULL};
	int64_t tot[7] = {0};
	bcast b;
	bson_t fwd = BSON_INITIALIZER, *out, raw;
	size_t n, i, k;
	int st;

	copy_renamed(c->cmd, &fwd, "dbStats");
	n = broadcast(c, &fwd, &b);
	bson_destroy(&fwd);

	if (n == 0) {
		bcast_free(&b, n);
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
	}
	for (i = 0; i < n; i++)
		if (b.cls[i] != SHARDCONN_OK) {
			st = px_reply_shard_error(c, b.cls[i], &b.replies[i], b.nerr[i]);
			bcast_free(&b, n);
			return st;
		}
	out = bson_new();
	bson_append_document_begin(out, "raw", -1, &raw);
	for (i = 0; i < n; i++) {
		for (k = 0; sums[k]; k++)
			tot[k] += px_get_int(&b.replies[i], sums[k], 0);
		append_shard_reply(&raw, b.ids[i], &b.replies[i]);
	}
	bson_append_document_end(out, &raw);
	BSON_APPEND_UTF8(out, "db", c->db);
	for (k = 0; sums[k]; k++) {
		BSON_APPEND_INT64(out, sums[k], tot[k]);
		if (strcmp(sums[k], "objects") == 0)
			BSON_APPEND_DOUBLE(out, "avgObjSize",
					   tot[k] ? (double)tot[3] / (double)tot[k] : 0.0);
	}
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	bcast_free(&b, n);
	return px_reply(c, out);
}

