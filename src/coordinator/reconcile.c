/* The filtering-metadata reconciler: see reconcile.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "common/indexname.h"
#include "common/log.h"
#include "coordinator/filtering.h"
#include "coordinator/reconcile.h"

typedef struct unowned {
	char *ns, *shard;
} unowned;

/* An install to confirm: shard `shard` got ns's metadata with chunk ids ids[0..nids) from
 * a routing table loaded before the install. */
typedef struct to_check {
	char *ns, *shard;
	int64_t *ids;
	size_t nids;
} to_check;

struct cfilt_reconciler {
	int64_t version; /* the routing version `none` was found at */
	unowned *none;
	size_t n, cap;
	to_check *check; /* installs not yet confirmed (kept across passes until they are) */
	size_t ncheck;
	const atomic_int *stop; /* non-zero: end the pass early */
};

cfilt_reconciler *cfilt_reconciler_new(const atomic_int *stop)
{
	cfilt_reconciler *r = sdb_calloc(1, sizeof(cfilt_reconciler));
	r->stop = stop;
	return r;
}

static bool stopping(const cfilt_reconciler *r)
{
	return r->stop && atomic_load(r->stop);
}

static void forget(cfilt_reconciler *r)
{
	for (size_t i = 0; i < r->n; i++) {
		free(r->none[i].ns);
		free(r->none[i].shard);
	}
	r->n = 0;
}

static void check_free(to_check *c)
{
	free(c->ns);
	free(c->shard);
	free(c->ids);
}

void cfilt_reconciler_free(cfilt_reconciler *r)
{
	if (!r)
		return;
	forget(r);
	free(r->none);
	for (size_t i = 0; i < r->ncheck; i++)
		check_free(&r->check[i]);
	free(r->check);
	free(r);
}

static bool known_unowned(const cfilt_reconciler *r, const char *ns, const char *shard)
{
	for (size_t i = 0; i < r->n; i++)
		if (strcmp(r->none[i].ns, ns) == 0 && strcmp(r->none[i].shard, shard) == 0)
			return true;
	return false;
}

static void remember_unowned(cfilt_reconciler *r, const char *ns, const char *shard)
{
	if (r->n == r->cap) {
		r->cap = r->cap ? r->cap * 2 : 16;
		r->none = sdb_realloc(r->none, r->cap * sizeof *r->none);
	}
	r->none[r->n].ns = sdb_strdup(ns);
	r->none[r->n++].shard = sdb_strdup(shard);
}

/* The namespaces of the array field `field` of reply whose documents carry {ns: string}:
 * a NULL-terminated heap array of heap strings (free_names). */
static char **names_of(const bson_t *reply, const char *field)
{
	bson_iter_t it, ai, d;
	char **v = sdb_calloc(1, sizeof *v);
	size_t n = 0;
	if (!bson_iter_init_find(&it, reply, field) || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &ai))
		return v;
	while (bson_iter_next(&ai))
		if (BSON_ITER_HOLDS_DOCUMENT(&ai) && bson_iter_recurse(&ai, &d) &&
		    bson_iter_find(&d, "ns") && BSON_ITER_HOLDS_UTF8(&d)) {
			v = sdb_realloc(v, (n + 2) * sizeof *v);
			v[n++] = sdb_strdup(bson_iter_utf8(&d, NULL));
			v[n] = NULL;
		}
	return v;
}

static void free_names(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

static bool has_name(char **v, const char *ns)
{
	for (size_t i = 0; v && v[i]; i++)
		if (strcmp(v[i], ns) == 0)
			return true;
	return false;
}

/* Metadata's sharded namespaces and routing version. */
static int read_metadata(mongoc_client_t *meta, char ***names, int64_t *version, char *err,
			 size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it;
	char e[256];
	int rc;

	*names = NULL;
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	rc = cfilt_command(meta, &cmd, &reply, e, sizeof e);
	if (rc == 0)
		*names = names_of(&reply, "collections");
	bson_destroy(&reply);
	bson_reinit(&cmd);
	/* a sinceVersion no routing version reaches: the answer is the version alone */
	BSON_APPEND_UTF8(&cmd, "getRoutingTable", "all");
	BSON_APPEND_INT64(&cmd, "sinceVersion", INT64_MAX);
	if (rc == 0)
		rc = cfilt_command(meta, &cmd, &reply, e, sizeof e);
	else
		bson_init(&reply);
	if (rc == 0 && !(bson_iter_init_find(&it, &reply, "routingVersion") &&
			 sdb_bson_as_int64(&it, version)))
		rc = -1, snprintf(e, sizeof e, "getRoutingTable gave no routingVersion");
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (rc != 0) {
		free_names(*names);
		*names = NULL;
		return sdb_errf(err, errlen, SDB_EIO, "metadata: %s", e);
	}
	return 0;
}

/* Does index spec ix (a listIndexes entry) serve shard key pattern key: for a hashed key
 * the same {f: "hashed"}, for a ranged one an index whose fields start with the key's, in
 * order (directions ignored), not partial and not sparse (MongoDB's rule for a shard key
 * index, ShardKeyPattern::isIndexUniqueCompatible / findShardKeyPrefixedIndex). */
static bool serves_key(const bson_t *ix, const bson_t *key)
{
	bson_iter_t it, k, i;
	bson_t kd;
	uint32_t len;
	const uint8_t *data;

	if (bson_has_field(ix, "partialFilterExpression") ||
	    (bson_iter_init_find(&it, ix, "sparse") && bson_iter_as_bool(&it)) ||
	    !bson_iter_init_find(&it, ix, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&kd, data, len) || !bson_iter_init(&k, key) ||
	    !bson_iter_init(&i, &kd))
		return false;
	while (bson_iter_next(&k)) {
		if (!bson_iter_next(&i) || strcmp(bson_iter_key(&k), bson_iter_key(&i)) != 0)
			return false;
		bool kh = BSON_ITER_HOLDS_UTF8(&k), ih = BSON_ITER_HOLDS_UTF8(&i);
		if (kh != ih || (kh && strcmp(bson_iter_utf8(&k, NULL), bson_iter_utf8(&i, NULL))))
			return false;
	}
	return true;
}

/* Before an install: the shard-key index a proxy's shardCollection creates (ranged and
 * hashed keys: keyRange reads and cleanup are bounded on it) is created on the shard when
 * the collection there has no index serving the key and holds no document (an empty or
 * missing collection: cheap). On a collection with documents it is only logged: the build
 * would hold the shard's writes for its whole length, which the operator schedules
 * (createIndexes); until then reads of a chunk examine the collection. */
static bool table_current(mongoc_client_t *meta, const char *ns, const cfilt_table *tab);

static void ensure_key_index(mongoc_client_t *meta, mongoc_client_t *sc, const char *shard,
			     const char *ns, const cfilt_table *tab)
{
	const bson_t *key = &tab->key;
	bool missing = false;
	char db[128], name[256];
	const char *coll = strchr(ns, '.');
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, ai, cur;
	bool served = false, empty = false;

	if (!coll || (size_t)(coll - ns) >= sizeof db)
		return;
	memcpy(db, ns, (size_t)(coll - ns));
	db[coll - ns] = '\0';
	coll++;
	if (bson_iter_init(&it, key) && bson_iter_next(&it) && !BSON_ITER_HOLDS_UTF8(&it) &&
	    strcmp(bson_iter_key(&it), "_id") == 0)
		return; /* {_id: 1, ...} starts with the _id index */
	BSON_APPEND_UTF8(&cmd, "listIndexes", coll);
	bson_error_t be;
	mongoc_database_t *d = mongoc_client_get_database(sc, db);
	bool ok = mongoc_database_command_simple(d, &cmd, NULL, &reply, &be);
	if (!ok && be.domain == MONGOC_ERROR_SERVER && be.code == 26) {
		empty = missing = true; /* no such collection on this shard yet */
	} else if (ok && bson_iter_init_find(&it, &reply, "cursor") &&
		   bson_iter_recurse(&it, &cur) && bson_iter_find(&cur, "firstBatch") &&
		   bson_iter_recurse(&cur, &ai)) {
		while (bson_iter_next(&ai) && !served) {
			uint32_t len;
			const uint8_t *data;
			bson_t ix;
			if (!BSON_ITER_HOLDS_DOCUMENT(&ai))
				continue;
			bson_iter_document(&ai, &len, &data);
			served = bson_init_static(&ix, data, len) && serves_key(&ix, key);
		}
	} else {
		served = true; /* unknown: leave it */
	}
	bson_destroy(&reply);
	bson_reinit(&cmd);
	if (!served && !empty) {
		BSON_APPEND_UTF8(&cmd, "count", coll);
		if (mongoc_database_command_simple(d, &cmd, NULL, &reply, &be) &&
		    bson_iter_init_find(&it, &reply, "n"))
			empty = bson_iter_as_int64(&it) == 0;
		bson_destroy(&reply);
		bson_reinit(&cmd);
	}
	/* creating the index creates a missing collection: not for one dropped since the table
	 * was loaded (the proxy drops it in metadata before the shards); a drop landing
	 * between this check and the build can still leave an empty collection behind */
	if (!served && empty && missing && !table_current(meta, ns, tab)) {
		served = true;
		empty = false;
	}
	if (!served && empty) {
		sdb_index_default_name(key, name, sizeof name);
		sdb_index_create_cmd(&cmd, coll, key, false);
		if (!mongoc_database_command_simple(d, &cmd, NULL, &reply, &be)) {
			sdb_warn("filtering reconciler: shard key index not created", "ns=%s "
				 "shard=%s index=%s error=\"%s\"", ns, shard, name, be.message);
		} else {
			sdb_info("filtering reconciler: shard key index created", "ns=%s shard=%s "
				 "index=%s", ns, shard, name);
		}
		bson_destroy(&reply);
	} else if (!served) {
		sdb_warn("filtering reconciler: no shard key index on a collection with documents "
			 "(create it: reads of a chunk examine the whole collection until then)",
			 "ns=%s shard=%s", ns, shard);
	}
	bson_destroy(&cmd);
	mongoc_database_destroy(d);
}

static void id_fn(const bson_t *ch, int64_t id, void *arg)
{
	to_check *c = arg;
	(void)ch;
	c->ids = sdb_realloc(c->ids, (c->nids + 1) * sizeof *c->ids);
	c->ids[c->nids++] = id;
}

static void remember_install(cfilt_reconciler *r, const char *ns, const char *shard,
			     const cfilt_table *tab)
{
	to_check c = {sdb_strdup(ns), sdb_strdup(shard), NULL, 0};
	cfilt_each_chunk_id(tab, shard, id_fn, &c);
	r->check = sdb_realloc(r->check, (r->ncheck + 1) * sizeof *r->check);
	r->check[r->ncheck++] = c;
}

/* Is c's install still of the collection metadata has under that name: listed, and at
 * least one chunk id installed still among its chunks (a collection dropped and sharded
 * again has new chunk ids; splits and merges keep some). 1 yes, 0 no, -1 unknown
 * (metadata did not answer). */
static int still_same(mongoc_client_t *meta, char **names, const to_check *c)
{
	cfilt_table tab;
	char e[512];
	bool found = false;

	if (!has_name(names, c->ns))
		return 0;
	if (cfilt_load(meta, c->ns, &tab, e, sizeof e) != 0) {
		cfilt_table_destroy(&tab);
		return -1;
	}
	for (size_t i = 0; i < c->nids && !found; i++)
		found = cfilt_has_chunk(&tab, c->ids[i]);
	cfilt_table_destroy(&tab);
	return found ? 1 : 0;
}

static void any_id_fn(const bson_t *ch, int64_t id, void *arg)
{
	(void)ch;
	*(int64_t *)arg = id;
}

/* Does metadata still have the collection tab was loaded from (listed, and the chunk of tab
 * found last still there)? False also when metadata does not answer. */
static bool table_current(mongoc_client_t *meta, const char *ns, const cfilt_table *tab)
{
	to_check c = {(char *)ns, NULL, NULL, 0};
	char **names = NULL, e[256];
	int64_t v, id = 0;
	bool ok;

	cfilt_each_chunk_id(tab, NULL, any_id_fn, &id);
	if (read_metadata(meta, &names, &v, e, sizeof e) != 0)
		return false;
	c.ids = &id;
	c.nids = 1;
	ok = still_same(meta, names, &c) == 1;
	free_names(names);
	return ok;
}

/* A collection dropped (and maybe sharded again under the same name) between the routing
 * table's load and the install would leave the shard with metadata of a collection
 * metadata no longer has; a later collection of that name, whose tokens start again at 1,
 * could not be installed over it (an older collection version), and the reconciler never
 * replaces an install. So every install is confirmed afterwards against metadata
 * (still_same) and dropped when it is of another collection: missing metadata heals itself
 * at the next pass, stale metadata would not. An install that cannot be confirmed or
 * dropped now (metadata or the shard not answering) is kept in r and tried again at the
 * next passes, while its shard is held. */
static void confirm_installs(cfilt_reconciler *r, mongoc_client_t *meta, const cfilt_target *t,
			     size_t n)
{
	char **now = NULL, e[256];
	int64_t v;
	size_t k = 0;

	if (r->ncheck == 0)
		return;
	if (read_metadata(meta, &now, &v, e, sizeof e) != 0) {
		sdb_warn("filtering reconciler: installs not confirmed (retried)", "error=\"%s\"", e);
		return;
	}
	for (size_t i = 0; i < r->ncheck; i++) {
		to_check *c = &r->check[i];
		if (stopping(r)) { /* kept as they are */
			r->check[k++] = *c;
			continue;
		}
		mongoc_client_t *sc = NULL;
		for (size_t s = 0; s < n && !sc; s++)
			if (strcmp(t[s].shard, c->shard) == 0)
				sc = t[s].client;
		int same = sc ? still_same(meta, now, c) : 1; /* not held any more: its holder's */
		bool keep = same < 0;
		if (same == 0) {
			bson_t cmd = BSON_INITIALIZER, reply;
			BSON_APPEND_UTF8(&cmd, "stripedbSetFiltering", c->ns);
			BSON_APPEND_BOOL(&cmd, "drop", true);
			int rc = cfilt_command(sc, &cmd, &reply, e, sizeof e);
			keep = rc != 0;
			sdb_warn(rc ? "filtering reconciler: install of a dropped collection, its drop "
				      "failed (retried)"
				    : "filtering reconciler: install of a dropped collection dropped",
				 "ns=%s shard=%s code=%d", c->ns, c->shard, rc);
			bson_destroy(&reply);
			bson_destroy(&cmd);
		}
		if (keep)
			r->check[k++] = *c;
		else
			check_free(c);
	}
	r->ncheck = k;
	free_names(now);
}

/* Installs of namespaces metadata does not list (dropped through `ctl collection drop`,
 * which leaves the shards alone, or by a drop whose shard broadcast failed): dropped from
 * the shard, so that a later collection of the same name, whose tokens start again at 1,
 * can be installed (an install older than the one present is refused). Metadata is read
 * again first: a shard that lists a namespace got it after metadata had it (a proxy's
 * shardCollection writes metadata first), so a collection sharded while this pass ran is
 * listed by then. */
static void drop_unsharded(cfilt_reconciler *r, mongoc_client_t *meta, const cfilt_target *t,
			   size_t n, char **names, char ***have)
{
	char **now = NULL, e[256];
	int64_t v;
	bool any = false;

	for (size_t s = 0; s < n && !any; s++)
		for (size_t i = 0; have[s] && have[s][i] && !any; i++)
			any = !has_name(names, have[s][i]);
	if (!any || stopping(r) || read_metadata(meta, &now, &v, e, sizeof e) != 0)
		return;
	for (size_t s = 0; s < n; s++)
		for (size_t i = 0; have[s] && have[s][i]; i++) {
			bson_t cmd = BSON_INITIALIZER, reply;
			if (has_name(now, have[s][i]))
				continue;
			BSON_APPEND_UTF8(&cmd, "stripedbSetFiltering", have[s][i]);
			BSON_APPEND_BOOL(&cmd, "drop", true);
			int rc = cfilt_command(t[s].client, &cmd, &reply, e, sizeof e);
			sdb_info("filtering reconciler: metadata of a collection no longer sharded "
				 "dropped", "ns=%s shard=%s code=%d", have[s][i], t[s].shard, rc);
			bson_destroy(&reply);
			bson_destroy(&cmd);
		}
	free_names(now);
}

int cfilt_reconcile(cfilt_reconciler *r, mongoc_client_t *meta, const cfilt_target *t, size_t n,
		    size_t *installed, char *err, size_t errlen)
{
	char **names, ***have = sdb_calloc(n ? n : 1, sizeof *have);
	int64_t version = 0;
	int rc;

	*installed = 0;
	if ((rc = read_metadata(meta, &names, &version, err, errlen)) != 0) {
		free(have);
		return rc;
	}
	if (version != r->version) {
		forget(r);
		r->version = version;
	}
	for (size_t s = 0; s < n; s++) {
		bson_t cmd = BSON_INITIALIZER, reply;
		char e[256];
		BSON_APPEND_INT32(&cmd, "stripedbListFiltering", 1);
		int src = cfilt_command(t[s].client, &cmd, &reply, e, sizeof e);
		if (src == 0)
			have[s] = names_of(&reply, "namespaces");
		else /* skipped this pass: a shard that is down cannot take an install either */
			sdb_warn("filtering reconciler: shard did not answer", "shard=%s code=%d "
				 "error=\"%s\"", t[s].shard, src, e);
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	for (size_t i = 0; names[i] && !stopping(r); i++) {
		const char *ns = names[i];
		bool need = false;
		cfilt_table tab;
		for (size_t s = 0; s < n && !need; s++)
			need = have[s] && !has_name(have[s], ns) && !known_unowned(r, ns, t[s].shard);
		if (!need)
			continue;
		char e[512];
		if (cfilt_load(meta, ns, &tab, e, sizeof e) != 0) {
			/* dropped since listCollections, or metadata failing: the next pass sees */
			sdb_warn("filtering reconciler: routing table not loaded", "ns=%s error=\"%s\"",
				 ns, e);
			cfilt_table_destroy(&tab);
			continue;
		}
		for (size_t s = 0; s < n && !stopping(r); s++) {
			if (!have[s] || has_name(have[s], ns) || known_unowned(r, ns, t[s].shard))
				continue;
			size_t owned = cfilt_chunks_on(&tab, t[s].shard);
			if (owned == 0) {
				remember_unowned(r, ns, t[s].shard);
				continue;
			}
			ensure_key_index(meta, t[s].client, t[s].shard, ns, &tab);
			if (cfilt_install(t[s].client, ns, t[s].shard, &tab, 0, 0, e, sizeof e) != 0) {
				/* refused (a switch installed newer metadata meanwhile: StaleConfig)
				 * or unreachable: the next pass sees what the shard has */
				sdb_warn("filtering reconciler: install failed", "ns=%s shard=%s "
					 "error=\"%s\"", ns, t[s].shard, e);
				continue;
			}
			(*installed)++;
			remember_install(r, ns, t[s].shard, &tab);
			sdb_info("filtering reconciler: filtering metadata installed",
				 "ns=%s shard=%s chunks=%zu collection_version=%" PRId64, ns,
				 t[s].shard, owned, tab.max_token);
		}
		cfilt_table_destroy(&tab);
	}
	drop_unsharded(r, meta, t, n, names, have);
	confirm_installs(r, meta, t, n);
	for (size_t s = 0; s < n; s++)
		free_names(have[s]);
	free(have);
	free_names(names);
	return 0;
}

mongoc_client_t *cfilt_shard_client(const char *uri, const char *appname)
{
	const char *opts = "serverSelectionTimeoutMS=2000&connectTimeoutMS=2000"
			   "&socketTimeoutMS=60000&serverSelectionTryOnce=true";
	char *u;
	if (strlen(uri) > 10 && strchr(uri + 10, '?'))
		u = sdb_asprintf("%s&%s", uri, opts);
	else if (strlen(uri) > 10 && strchr(uri + 10, '/'))
		u = sdb_asprintf("%s?%s", uri, opts);
	else
		u = sdb_asprintf("%s/?%s", uri, opts);
	mongoc_client_t *c = auth_cluster_client_new(u); /* issue #10 */
	free(u);
	if (c) {
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
		mongoc_client_set_appname(c, appname);
	}
	return c;
}
