/* The proxy's catalog: its access to the metadata service (metadata commands, the shard
 * list, tenants and quotas) and its routing cache with the refresh thread that keeps it
 * current (issue #6, #26; split out of role.c, issue #24).
 *
 * The refresh thread long-polls metadata (waitRoutingVersion {gt, timeoutMS: 500,
 * namespaces: true}) and, when a cached collection changed, loads one diff of the cached
 * collections (getRoutingTable with sinceVersion, in cursor batches); workers reload one
 * table on demand after a StaleConfig (proxy_route with force). Routing tables themselves
 * are src/routing/route.h.
 */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/dblist.h"
#include "common/err.h"
#include "common/log.h"
#include "auth/gate.h"
#include "proxy/proxy.h"

#define PROXY_WAIT_MS 500       /* long-poll timeout (bounds shutdown latency) */
#define PROXY_RETRY_MS 200      /* pause after a failed metadata call */
#define PROXY_QUOTA_RELOAD_MS 1000  /* tenants and quotas are re-read this often */
#define PROXY_PING_MS 10000         /* config.mongos ping, as MongoDB's uptime reporter */
#define PROXY_PING_RETRY_MS 1000    /* after a failed ping (metadata unreachable ...) */
/* config.mongos mongoVersion: what buildInfo answers (src/wire/commands.c) */
#define PROXY_MONGO_VERSION "6.0.0-stripedb-" PACKAGE_VERSION

/* ---------- metadata access ---------- */

int proxy_meta_command(proxy *p, const bson_t *cmd, bson_t *reply, int *code, char *err,
		       size_t errlen)
{
	mongoc_client_pool_t *pool;
	mongoc_client_t *cl;
	bson_error_t e;
	bool ok;
	bson_iter_t it;

	/* issue #21: the current pool (renewed when the cluster key rotates); pushed back to
	 * the pool it was popped from */
	pool = p->sc ? shardconn_metadata(p->sc) : NULL;
	if (pool == NULL) {
		bson_init(reply);
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "no metadata service configured");
	}
	shardconn_wait_begin(); /* a request's metadata call: slow, never unanswered */
	cl = mongoc_client_pool_pop(pool);
	ok = mongoc_client_command_simple(cl, "admin", cmd, NULL, reply, &e);
	mongoc_client_pool_push(pool, cl);
	shardconn_wait_end();
	if (ok)
		return 0;
	*code = 0;
	if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		*code = (int)bson_iter_as_int64(&it);
	return sdb_errf(err, errlen, e.domain == MONGOC_ERROR_SERVER ? SDB_EPROTO : SDB_EUNAVAILABLE,
			"metadata: %s", e.message);
}

int proxy_load_shards(proxy *p, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr, sh;
	int code, rc;
	char *first = NULL, **ids = NULL;
	size_t nids = 0, cap = 0, i;

	BSON_APPEND_INT32(&cmd, "listShards", 1);
	rc = proxy_meta_command(p, &cmd, &reply, &code, err, errlen);
	if (rc != 0)
		goto out;
	if (bson_iter_init_find(&it, &reply, "shards") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			const char *id = NULL, *uri = NULL;
			if (!bson_iter_recurse(&arr, &sh))
				continue;
			while (bson_iter_next(&sh)) {
				const char *k = bson_iter_key(&sh);
				if (!BSON_ITER_HOLDS_UTF8(&sh))
					continue;
				if (strcmp(k, "id") == 0 || strcmp(k, "_id") == 0)
					id = bson_iter_utf8(&sh, NULL);
				else if (strcmp(k, "uri") == 0 || strcmp(k, "host") == 0)
					uri = bson_iter_utf8(&sh, NULL);
			}
			if (id == NULL || uri == NULL)
				continue;
			if (nids == cap) {
				cap = cap ? cap * 2 : 16;
				ids = sdb_realloc(ids, cap * sizeof *ids);
			}
			ids[nids++] = sdb_strdup(id);
			if (shardconn_set_shard(p->sc, id, uri, err, errlen) != 0)
				sdb_warn("bad shard uri", "shard=%s err=\"%s\"", id, err);
			if (first == NULL || strcmp(id, first) < 0) {
				free(first);
				first = sdb_strdup(id);
			}
		}
		/* a shard no longer listed was removed: never target it again */
		shardconn_retain_shards(p->sc, ids, nids);
	}
	uv_mutex_lock(&p->mu);
	if (first) {
		free(p->primary);
		p->primary = first;
		first = NULL;
	}
	uv_mutex_unlock(&p->mu);
out:
	for (i = 0; i < nids; i++)
		free(ids[i]);
	free(ids);
	free(first);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

char *proxy_primary(proxy *p)
{
	char *s = NULL;
	char err[256];

	uv_mutex_lock(&p->mu);
	if (p->primary)
		s = sdb_strdup(p->primary);
	uv_mutex_unlock(&p->mu);
	if (s == NULL && proxy_load_shards(p, err, sizeof err) == 0) {
		uv_mutex_lock(&p->mu);
		if (p->primary)
			s = sdb_strdup(p->primary);
		uv_mutex_unlock(&p->mu);
	}
	return s;
}

/* proxy_db_primary, and with or_default the default for a name db_checked holds
 * (proxy_db_primary_cached). */
static char *db_primary(proxy *p, const char *db, bool or_default)
{
	bson_iter_t it;
	char *s = NULL;

	if (db == NULL)
		return NULL;
	uv_mutex_lock(&p->mu);
	if (p->db_primaries && bson_iter_init_find(&it, p->db_primaries, db) &&
	    BSON_ITER_HOLDS_UTF8(&it))
		s = sdb_strdup(bson_iter_utf8(&it, NULL));
	else if (or_default && p->primary && p->db_checked &&
		 bson_iter_init_find(&it, p->db_checked, db))
		s = sdb_strdup(p->primary); /* asked about and not found: the default */
	uv_mutex_unlock(&p->mu);
	return s;
}

char *proxy_db_primary(proxy *p, const char *db)
{
	return db_primary(p, db, false);
}

#define PROXY_DB_CHECKED_MAX 1024 /* bound of p->db_checked */

char *proxy_db_primary_cached(proxy *p, const char *db)
{
	return db_primary(p, db, true);
}

char *proxy_db_primary_lookup(proxy *p, const char *db)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it;
	char err[256], *s = proxy_db_primary(p, db);
	bool ask;
	int code;

	if (s || db == NULL || strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 ||
	    strcmp(db, "local") == 0)
		goto out;
	uv_mutex_lock(&p->mu);
	if (p->db_checked == NULL)
		p->db_checked = bson_new();
	ask = !bson_iter_init_find(&it, p->db_checked, db) &&
	      bson_count_keys(p->db_checked) < PROXY_DB_CHECKED_MAX;
	if (ask) /* marked before asking: one lookup per name, even when metadata is down */
		BSON_APPEND_BOOL(p->db_checked, db, true);
	uv_mutex_unlock(&p->mu);
	if (!ask)
		goto out;
	BSON_APPEND_INT32(&cmd, "listDatabases", 1);
	if (proxy_meta_command(p, &cmd, &reply, &code, err, sizeof err) == 0)
		proxy_set_db_primaries(p, &reply);
	bson_destroy(&reply);
	s = proxy_db_primary(p, db);
out:
	bson_destroy(&cmd);
	return s;
}

void proxy_set_db_primaries(proxy *p, const bson_t *reply)
{
	bson_t *m = bson_new(), *old;
	const char *name, *primary;
	sdb_dblist l;

	sdb_dblist_init(&l, reply);
	while (sdb_dblist_next(&l, "primary", &name, &primary))
		if (name && primary)
			BSON_APPEND_UTF8(m, name, primary);
	uv_mutex_lock(&p->mu);
	old = p->db_primaries;
	p->db_primaries = m;
	uv_mutex_unlock(&p->mu);
	if (old)
		bson_destroy(old);
}

/* One getRoutingTable round trip (a cursor batch). since < 0: full load; resume: the
 * previous batch's resumeAfter or NULL. Counts the reply bytes. */
static int routing_batch(proxy *p, const char *ns, int64_t since, const bson_t *resume,
			 bson_t *reply, int *code, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, cur;
	int rc;

	BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
	if (since >= 0)
		BSON_APPEND_INT64(&cmd, "sinceVersion", since);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
	bson_append_document_end(&cmd, &cur);
	if (resume)
		BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", resume);
	rc = proxy_meta_command(p, &cmd, reply, code, err, errlen);
	bson_destroy(&cmd);
	if (rc == 0)
		sdb_counter_add(p->m_routing_bytes, proxy_bson_len(reply));
	return rc;
}

static bool reply_bool(const bson_t *reply, const char *key)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, reply, key) && bson_iter_as_bool(&it);
}

static int64_t reply_int(const bson_t *reply, const char *key, int64_t def)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, reply, key) && BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_int64(&it);
	return def;
}

/* The resumeAfter document of a batch that says more: true (appended to out, an empty
 * initialised document). */
static bool reply_resume(const bson_t *reply, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;
	bson_t view;

	if (!reply_bool(reply, "more") || !bson_iter_init_find(&it, reply, "resumeAfter") ||
	    !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&view, data, len))
		return false;
	/* out is an initialised (reinit'ed) document: append, never re-initialise it
	 * (bson_copy_to would drop its buffer) */
	return bson_concat(out, &view);
}

/* Feed the chunks and removals of one batch to the updates (sorted by ns, n of them);
 * entries of other namespaces are skipped. "collections" entries give key patterns.
 * Returns 0 or SDB_EINVAL (a malformed chunk). */
static int feed_batch(route_update **u, char **names, size_t n, const bson_t *reply,
		      bool single, char *err, size_t errlen)
{
	static const char *const arrays[] = {"removed", "chunks", "collections"};
	bson_iter_t it, arr, f;

	for (size_t a = 0; a < 3; a++) {
		if (!bson_iter_init_find(&it, reply, arrays[a]) || !BSON_ITER_HOLDS_ARRAY(&it) ||
		    !bson_iter_recurse(&it, &arr))
			continue;
		while (bson_iter_next(&arr)) {
			route_update *t = NULL;
			if (single) {
				t = u[0];
			} else {
				const char *ns;
				size_t lo = 0, hi = n;
				if (!bson_iter_recurse(&arr, &f) || !bson_iter_find(&f, "ns") ||
				    !BSON_ITER_HOLDS_UTF8(&f))
					continue;
				ns = bson_iter_utf8(&f, NULL);
				while (lo < hi) {
					size_t mid = lo + (hi - lo) / 2;
					int r = strcmp(names[mid], ns);
					if (r == 0) {
						t = u[mid];
						break;
					}
					if (r < 0)
						lo = mid + 1;
					else
						hi = mid;
				}
				if (t == NULL)
					continue; /* a collection this proxy does not cache */
			}
			if (a == 0) {
				route_update_removed(t, &arr);
			} else if (a == 1) {
				if (route_update_chunk(t, &arr, err, errlen) != 0)
					return SDB_EINVAL;
			} else {
				uint32_t len;
				const uint8_t *data;
				bson_t key;
				if (bson_iter_recurse(&arr, &f) && bson_iter_find(&f, "key") &&
				    BSON_ITER_HOLDS_DOCUMENT(&f)) {
					bson_iter_document(&f, &len, &data);
					if (bson_init_static(&key, data, len))
						route_update_set_key(t, &key);
				}
			}
		}
	}
	return 0;
}

/* One batch of a cursor of getRoutingTable replies: fed to the updates (feed_batch), then
 * its resumeAfter into resume (emptied first; *more: whether another batch follows) and
 * the reply destroyed. Returns feed_batch's status (then *more is false). */
static int feed_and_resume(route_update **u, char **names, size_t n, bson_t *reply,
			   bool single, bson_t *resume, bool *more, char *err, size_t errlen)
{
	int rc = feed_batch(u, names, n, reply, single, err, errlen);

	bson_reinit(resume);
	*more = rc == 0 && reply_resume(reply, resume);
	bson_destroy(reply);
	return rc;
}

/* Load ns from metadata: a diff since old's version when old is a sharded snapshot, else
 * a full load, in cursor batches (issue #26). NULL with a message on failure. */
static route_coll *fetch_route(proxy *p, const char *ns, const route_coll *old, char *err,
			       size_t errlen)
{
	bson_t reply, resume = BSON_INITIALIZER;
	bool have_resume = false, full;
	route_update *u = NULL;
	route_coll *c = NULL;
	int64_t since = old ? old->version : -1, v0 = 0;
	int code = 0, rc, batches = 0;
	size_t i;
	bool unknown_shard = false;
	char *name = (char *)ns;

	sdb_counter_inc(p->m_refreshes);
	for (;;) {
		rc = routing_batch(p, ns, since, have_resume ? &resume : NULL, &reply, &code, err,
				   errlen);
		if (rc == SDB_EPROTO && batches == 0 && code == WIRE_ERR_NAMESPACE_NOT_FOUND) {
			/* metadata's "collection ... is not sharded" */
			c = route_coll_unsharded(ns, reply_int(&reply, "routingVersion", 0));
			bson_destroy(&reply);
			goto out;
		}
		if (rc != 0) {
			bson_destroy(&reply);
			goto out;
		}
		if (batches++ == 0) {
			v0 = reply_int(&reply, "routingVersion", 0);
			if (old != NULL && !reply_bool(&reply, "changed")) {
				/* nothing new for this collection */
				bson_destroy(&reply);
				c = (route_coll *)old;
				route_coll_ref(c);
				goto out;
			}
			full = reply_bool(&reply, "full") || old == NULL;
			if (full)
				since = -1; /* the next batches of a full load */
			u = route_update_new(ns, full);
			{
				bson_iter_t it;
				uint32_t len;
				const uint8_t *data;
				bson_t key;
				if (bson_iter_init_find(&it, &reply, "key") &&
				    BSON_ITER_HOLDS_DOCUMENT(&it)) {
					bson_iter_document(&it, &len, &data);
					if (bson_init_static(&key, data, len))
						route_update_set_key(u, &key);
				}
			}
		}
		rc = feed_and_resume(&u, &name, 1, &reply, true, &resume, &have_resume, err, errlen);
		if (rc != 0)
			goto out;
		if (!have_resume)
			break;
	}
	if (route_update_apply(u, old, v0, &c, err, errlen) != 0) {
		c = NULL;
		if (old != NULL) { /* an inconsistent diff: reload in full */
			route_update_free(u);
			u = NULL;
			bson_destroy(&resume);
			return fetch_route(p, ns, NULL, err, errlen);
		}
		goto out;
	}
	{
		char *const *sh;
		bool many;
		size_t ns = route_update_shards(u, &sh, &many);
		for (i = 0; i < ns && !unknown_shard; i++)
			unknown_shard = !shardconn_has_shard(p->sc, sh[i]);
		if (unknown_shard || many)
			proxy_load_shards(p, err, errlen);
	}
out:
	route_update_free(u);
	bson_destroy(&resume);
	return c;
}

/* The cached-chunks gauge (memory per chunk = RSS growth / this). */
static void publish_chunks(proxy *p)
{
	sdb_gauge_set(p->m_routing_chunks, (int64_t)route_cache_chunks(p->rc));
}

route_coll *proxy_route(proxy *p, const char *ns, bool force, char *err, size_t errlen)
{
	route_coll *c = NULL;

	route_coll *old = route_cache_get(p->rc, ns);

	if (!force && old)
		return old;
	/* forced (after StaleConfig): only what changed since the cached snapshot */
	c = fetch_route(p, ns, old && old->nkeys ? old : NULL, err, errlen);
	if (c == NULL)
		return old; /* metadata down: keep serving the cached table */
	if (old)
		route_coll_unref(old);
	route_coll_ref(c);
	route_cache_put(p->rc, c);
	publish_chunks(p);
	return c;
}

/* Reload tenants and database owners for the quota tables, and the databases' primary
 * shards. */
static bool load_quotas(proxy *p)
{
	bool ok = false;
	bson_t c1 = BSON_INITIALIZER, c2 = BSON_INITIALIZER, r1, r2;
	char err[256];
	int code;

	BSON_APPEND_INT32(&c1, "listTenants", 1);
	BSON_APPEND_INT32(&c2, "listDatabases", 1);
	/* meta_command always initialises its reply */
	if (proxy_meta_command(p, &c1, &r1, &code, err, sizeof err) == 0) {
		if (proxy_meta_command(p, &c2, &r2, &code, err, sizeof err) == 0) {
			proxy_quota_load(p->quota, &r1, &r2);
			proxy_set_db_primaries(p, &r2); /* issue #18: databases' primary shards */
			if (p->auth) /* issue #10: tenant tables of the auth gate */
				auth_gate_load(p->auth, &r1, &r2);
			ok = true;
		}
		bson_destroy(&r2);
	}
	bson_destroy(&r1);
	bson_destroy(&c1);
	bson_destroy(&c2);
	return ok;
}

static int ns_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Bring every cached namespace up to date with one diff of all collections since the
 * version this proxy holds (issue #26): getRoutingTable "all" with sinceVersion, in
 * cursor batches; each cached collection gets only its own changes, untouched ones are
 * left alone. names: the cached namespaces, sorted. *v0 gets the version now held.
 * Returns 0, SDB_ESTALE when metadata answered a full load (too far behind its removal
 * horizon: the caller reloads namespace by namespace), or an error. */
static int refresh_all(proxy *p, char **names, size_t n, int64_t since, int64_t *v0)
{
	route_update **u = sdb_calloc(n ? n : 1, sizeof *u);
	bson_t reply, resume = BSON_INITIALIZER;
	bool have_resume = false;
	char err[256];
	int code, rc = 0, batches = 0;
	size_t i, changed = 0;

	for (i = 0; i < n; i++)
		u[i] = route_update_new(names[i], false);
	for (;;) {
		rc = routing_batch(p, "all", since, have_resume ? &resume : NULL, &reply, &code, err,
				   sizeof err);
		if (rc != 0) {
			bson_destroy(&reply);
			goto out;
		}
		if (batches++ == 0) {
			*v0 = reply_int(&reply, "routingVersion", since);
			if (reply_bool(&reply, "full")) {
				bson_destroy(&reply);
				rc = SDB_ESTALE;
				goto out;
			}
		}
		rc = feed_and_resume(u, names, n, &reply, false, &resume, &have_resume, err,
				     sizeof err);
		if (rc != 0)
			goto out;
		if (!have_resume)
			break;
	}
	for (i = 0; i < n; i++) {
		route_coll *old, *c = NULL;
		if (route_update_size(u[i]) == 0)
			continue;
		changed++;
		old = route_cache_get(p->rc, names[i]);
		if (route_update_apply(u[i], old, *v0, &c, err, sizeof err) != 0) {
			sdb_warn("routing diff refused, reloading", "ns=%s err=\"%s\"", names[i], err);
			c = fetch_route(p, names[i], NULL, err, sizeof err);
		}
		if (old)
			route_coll_unref(old);
		if (c) {
			/* only the shards the diff names (a walk of every chunk would cost
			 * O(chunks of the collection) per change) */
			char *const *sh;
			bool many, unknown = false;
			size_t ns = route_update_shards(u[i], &sh, &many);
			for (size_t k = 0; k < ns && !unknown; k++)
				unknown = !shardconn_has_shard(p->sc, sh[k]);
			if (unknown || many)
				proxy_load_shards(p, err, sizeof err);
			route_cache_put(p->rc, c);
		}
	}
	sdb_debug("routing diff applied", "since=%lld version=%lld collections=%zu",
		  (long long)since, (long long)*v0, changed);
out:
	for (i = 0; i < n; i++)
		route_update_free(u[i]);
	free(u);
	bson_destroy(&resume);
	return rc;
}

/* Bring one cached table up to date (a diff since its own version; a full load when it
 * was not sharded). */
static void refresh_one(proxy *p, const char *ns)
{
	char err[256];
	route_coll *old = route_cache_get(p->rc, ns), *c;

	c = fetch_route(p, ns, old && old->nkeys ? old : NULL, err, sizeof err);
	if (old)
		route_coll_unref(old);
	if (c)
		route_cache_put(p->rc, c);
	else
		sdb_warn("routing refresh failed", "ns=%s err=\"%s\"", ns, err);
}

/* Does the long poll's reply name a cached namespace (names sorted)? True when it cannot
 * tell (namespacesAll, or an older metadata without the list). */
static bool touches_cache(const bson_t *reply, char **names, size_t n)
{
	bson_iter_t it, arr;

	if (reply_bool(reply, "namespacesAll") || !bson_iter_init_find(&it, reply, "namespaces") ||
	    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
		return true;
	while (bson_iter_next(&arr)) {
		const char *ns;
		if (!BSON_ITER_HOLDS_UTF8(&arr))
			continue;
		ns = bson_iter_utf8(&arr, NULL);
		if (bsearch(&ns, names, n, sizeof *names, ns_cmp) != NULL)
			return true;
	}
	return false;
}

/* ---------- refresh thread ---------- */

static bool wait_stop(proxy *p, uint64_t ms)
{
	bool stop;

	uv_mutex_lock(&p->mu);
	if (!p->stopping)
		uv_cond_timedwait(&p->cv, &p->mu, ms * 1000000u);
	stop = p->stopping;
	uv_mutex_unlock(&p->mu);
	return stop;
}

/* config.mongos (issue #18): record this proxy in metadata (pingProxy {addr, startedMS,
 * version}); again in PROXY_PING_MS (also after IllegalOperation: cluster op version below
 * 3), or in PROXY_PING_RETRY_MS after another failure (metadata unreachable). Refresh
 * thread. */
static void ping_proxy(proxy *p)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	char err[256];
	int code = 0, rc;

	BSON_APPEND_UTF8(&cmd, "pingProxy", p->advertise ? p->advertise : "unknown");
	BSON_APPEND_INT64(&cmd, "startedMS", p->started_ms);
	BSON_APPEND_UTF8(&cmd, "version", PROXY_MONGO_VERSION);
	rc = proxy_meta_command(p, &cmd, &reply, &code, err, sizeof err);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (rc != 0)
		sdb_debug("proxy: pingProxy failed", "code=%d err=\"%s\"", code, err);
	/* refused below op version 3 (IllegalOperation): that lasts, ask again at the
	 * ordinary pace; other failures (metadata unreachable, an election) sooner */
	p->ping_next_ms = sdb_mono_ms() +
			  (rc == 0 || code == WIRE_ERR_ILLEGAL_OPERATION ? PROXY_PING_MS
									 : PROXY_PING_RETRY_MS);
}

void proxy_catalog_refresher(void *arg)
{
	proxy *p = arg;
	char err[256];
	bool have_shards = false, ring_ready = false;

	sdb_log_set_thread_role("proxy"); /* the node id: from its role thread */
	for (;;) {
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_iter_t it;
		int code, rc;
		int64_t v;

		uv_mutex_lock(&p->mu);
		if (p->stopping) {
			uv_mutex_unlock(&p->mu);
			bson_destroy(&cmd);
			return;
		}
		uv_mutex_unlock(&p->mu);
		if (!have_shards) {
			if (proxy_load_shards(p, err, sizeof err) == 0)
				have_shards = true;
		}
		if (!ring_ready && proxy_quota_ring_probe(p->quota)) {
			ring_ready = true;
			sdb_gauge_set(p->m_ring_ready, 1);
		}
		if (have_shards &&
		    sdb_mono_ms() >= p->quota_loaded_ms + PROXY_QUOTA_RELOAD_MS) {
			proxy_load_shards(p, err, sizeof err); /* shard URIs may change */
			if (load_quotas(p)) {
				uv_mutex_lock(&p->mu);
				p->ready = true;
				uv_mutex_unlock(&p->mu);
			}
			p->quota_loaded_ms = sdb_mono_ms();
		}
		if (have_shards && sdb_mono_ms() >= p->ping_next_ms)
			ping_proxy(p);
		BSON_APPEND_INT32(&cmd, "waitRoutingVersion", 1);
		BSON_APPEND_INT64(&cmd, "gt", p->known_version);
		BSON_APPEND_INT64(&cmd, "timeoutMS", PROXY_WAIT_MS);
		BSON_APPEND_BOOL(&cmd, "namespaces", true);
		rc = proxy_meta_command(p, &cmd, &reply, &code, err, sizeof err);
		bson_destroy(&cmd);
		if (rc != 0) {
			bson_destroy(&reply);
			if (wait_stop(p, PROXY_RETRY_MS))
				return;
			continue;
		}
		v = p->known_version;
		if (bson_iter_init_find(&it, &reply, "routingVersion") && BSON_ITER_HOLDS_NUMBER(&it))
			v = bson_iter_as_int64(&it);
		if (v > p->known_version) {
			char **names, **after;
			size_t n = route_cache_names(p->rc, &names), na, i;
			int64_t held = v;
			uint64_t t0 = sdb_mono_ns();
			rc = 0;
			if (p->known_version < 0) {
				/* first contact: each cached table since its own version */
				for (i = 0; i < n; i++)
					refresh_one(p, names[i]);
			} else if (n > 0 && touches_cache(&reply, names, n)) {
				rc = refresh_all(p, names, n, p->known_version, &held);
				if (rc == SDB_ESTALE) {
					/* too far behind for a diff of all: one by one */
					for (i = 0; i < n; i++)
						refresh_one(p, names[i]);
					/* held is the version of that answer (refresh_all set it),
					 * not the long poll's older v: another round from v would be
					 * beyond the horizon again */
					rc = 0;
				}
				sdb_histogram_observe_ns(p->m_refresh_time, sdb_mono_ns() - t0);
			}
			/* tables cached by workers meanwhile may predate the change */
			na = route_cache_names(p->rc, &after);
			for (i = 0; i < na; i++) {
				route_coll *c;
				if (bsearch(&after[i], names, n, sizeof *names, ns_cmp) != NULL)
					continue;
				c = route_cache_get(p->rc, after[i]);
				if (c && c->version < held)
					refresh_one(p, after[i]);
				route_coll_unref(c);
			}
			for (i = 0; i < na; i++)
				free(after[i]);
			free(after);
			for (i = 0; i < n; i++)
				free(names[i]);
			free(names);
			if (rc == 0) {
				sdb_debug("routing refreshed", "version=%lld collections=%zu",
					  (long long)held, n);
				p->known_version = held;
				sdb_gauge_set(p->m_routing_version, held);
				publish_chunks(p);
			}
		}
		bson_destroy(&reply);
	}
}

