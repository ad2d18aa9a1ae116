/* Shard connections and worker threads of the proxy: see shardconn.h. */
#include "proxy/shardconn.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/clustertime.h"
#include "common/err.h"
#include "common/fieldscan.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"
#include "common/metauri.h"
#include "proxy/shardwire.h"
#include "proxy/tpool.h"
#include "wire/server.h"

/* ---------- shards ---------- */

#define SHARD_WIRE_MEMBERS 16 /* members of one shard with own connections (more: libmongoc) */

typedef struct shard {
	char *id;
	char *uri;
	mongoc_client_pool_t *pool;
	/* a retry budget was spent on this shard and it has not answered since: commands
	 * get one attempt (a shard that is down for good fails fast, as before issue #11) */
	atomic_bool down;
	/* the URI names one host and no replica set: libmongoc's Single topology, whose one
	 * server keeps its id for the pool's life */
	bool single;
	/* single: that server's id once a primary selection found it (0 = not yet or
	 * forgotten after a failed call), so a primary command skips server selection (a
	 * copy of the server description, ~5% of the proxy's CPU per point read) */
	atomic_uint_least32_t server_id;
	/* calls under a client's deadline running (or queued) on the calls pool for this
	 * shard, abandoned ones included (under shardconn.dl_mu) */
	int dl_running;
	/* The own connections (issue #19, shardwire.h; see "The own connections" below).
	 * wire_ok: the URI asks for nothing they lack (no TLS, no credentials or mechanism of
	 * its own, no compression, not load balanced); wire_cto / wire_sto: its connect and
	 * socket timeouts (ms). wires: one per member (libmongoc server id and host) a primary
	 * command learned, kept until shard_free (commands may be running on them); primary:
	 * the one libmongoc last selected as primary and that answered as one, or NULL, and
	 * then the next primary command goes through libmongoc, which selects again. */
	bool wire_ok;
	int wire_cto, wire_sto;
	uv_mutex_t wire_mu; /* wires, n_wires, wire_retired */
	bool wire_retired;  /* shard_retire: nothing more is learned */
	shardwire *wires[SHARD_WIRE_MEMBERS];
	size_t n_wires;
	_Atomic(shardwire *) primary;
	/* the server id libmongoc's monitoring last described as neither a primary nor a
	 * standalone (0: none, or it became one again): wire_learn checks it after it set
	 * primary, for an event that came between its look at the description and the store */
	_Atomic uint32_t demoted;
	struct shard *next;
} shard;

struct shardconn {
	uv_rwlock_t lock;
	shard *shards;
	shard *retired; /* replaced pools stay alive until free (clients may be out) */
	tpool req, io;
	tpool calls; /* shard calls under a client's maxTimeMS (shardconn_set_op_deadline) */
	uv_mutex_t dl_mu; /* shard.dl_running */
	uv_cond_t dl_cv;  /* a dl_running went down */
	sdb_counter *m_abandoned; /* those answered MaxTimeMSExpired before the shard did */
	sdb_counter *m_wire;      /* commands answered on the own connections (issue #19) */
	shard *meta;            /* the metadata pool (uri: the full URI), or NULL */
	atomic_uint_least64_t key_gen; /* auth_cluster_generation the pools were made with */
	_Atomic uint64_t cluster_time; /* issue #20: the highest cluster time seen */
};

shardconn *shardconn_new(void)
{
	shardconn *sc = sdb_calloc(1, sizeof *sc);

	mongoc_init();
	uv_rwlock_init(&sc->lock);
	tpool_init(&sc->req, SHARDCONN_WORKERS, SHARDCONN_MAX_WORKERS,
		   sdb_metrics_gauge("stripedb_proxy_request_threads",
				     "Threads of the proxy's shard request pool (grows when requests "
				     "wait on a slow or unreachable shard).",
				     NULL));
	tpool_init(&sc->io, SHARDCONN_IO_WORKERS, SHARDCONN_MAX_WORKERS,
		   sdb_metrics_gauge("stripedb_proxy_fanout_threads",
				     "Threads of the proxy's fan-out pool.", NULL));
	uv_mutex_init(&sc->dl_mu);
	uv_cond_init(&sc->dl_cv);
	tpool_init(&sc->calls, 2, SHARDCONN_MAX_WORKERS,
		   sdb_metrics_gauge("stripedb_proxy_deadline_call_threads",
				     "Threads running shard calls under a client's maxTimeMS (one "
				     "stays busy per abandoned call until the shard answers or the "
				     "socket times out).",
				     NULL));
	sc->m_wire = sdb_metrics_counter(
		"stripedb_proxy_shard_wire_commands_total",
		"Shard commands the proxy sent on its own connections (shardwire.c) rather than "
		"through libmongoc, and that were answered.",
		NULL);
	sc->m_abandoned = sdb_metrics_counter(
		"stripedb_proxy_shard_calls_abandoned_total",
		"Shard calls answered MaxTimeMSExpired (50) by the proxy because the shard had not "
		"answered when the client's maxTimeMS ran out.",
		NULL);
	atomic_init(&sc->key_gen, auth_cluster_generation());
	return sc;
}

static void shard_free(shard *s)
{
	if (s->pool)
		mongoc_client_pool_destroy(s->pool);
	for (size_t i = 0; i < s->n_wires; i++)
		shardwire_free(s->wires[i]);
	uv_mutex_destroy(&s->wire_mu);
	free(s->id);
	free(s->uri);
	free(s);
}

static void shard_free_job(void *arg)
{
	shard_free(arg);
}

void shardconn_free(shardconn *sc)
{
	shard *s, *n;

	if (sc == NULL)
		return;
	tpool_destroy(&sc->req);
	tpool_destroy(&sc->calls);
	uv_cond_destroy(&sc->dl_cv);
	uv_mutex_destroy(&sc->dl_mu);
	/* Destroying a pool waits for its monitor threads (a few hundred ms each): destroy
	 * them in parallel on the I/O pool. */
	for (s = sc->retired; s && s->next; s = s->next)
		;
	if (s)
		s->next = sc->shards;
	else
		sc->retired = sc->shards;
	sc->shards = NULL;
	if (sc->meta) {
		sc->meta->next = sc->retired;
		sc->retired = sc->meta;
		sc->meta = NULL;
	}
	for (s = sc->retired; s; s = n) {
		n = s->next;
		tpool_push(&sc->io, shard_free_job, s);
	}
	sc->retired = NULL;
	tpool_destroy(&sc->io);
	uv_rwlock_destroy(&sc->lock);
	free(sc);
}

static char *uri_with_defaults(const char *uri)
{
	char *base, *out;
	char t[128];

	if (strncmp(uri, "mongodb://", 10) == 0 || strncmp(uri, "mongodb+srv://", 14) == 0)
		base = sdb_strdup(uri);
	else
		base = sdb_asprintf("mongodb://%s/", uri);
	t[0] = '\0';
	if (strstr(base, "serverSelectionTimeoutMS") == NULL)
		snprintf(t + strlen(t), sizeof t - strlen(t), "%sserverSelectionTimeoutMS=%d",
			 t[0] ? "&" : "", SHARDCONN_CONNECT_TIMEOUT_MS);
	if (strstr(base, "connectTimeoutMS") == NULL)
		snprintf(t + strlen(t), sizeof t - strlen(t), "%sconnectTimeoutMS=%d",
			 t[0] ? "&" : "", SHARDCONN_CONNECT_TIMEOUT_MS);
	if (strstr(base, "heartbeatFrequencyMS") == NULL)
		snprintf(t + strlen(t), sizeof t - strlen(t), "%sheartbeatFrequencyMS=%d",
			 t[0] ? "&" : "", SHARDCONN_HEARTBEAT_MS);
	if (t[0] == '\0')
		return base;
	if (strchr(base, '?'))
		out = sdb_asprintf("%s&%s", base, t);
	else if (strchr(base + 10, '/'))
		out = sdb_asprintf("%s?%s", base, t);
	else
		out = sdb_asprintf("%s/?%s", base, t);
	free(base);
	return out;
}

/* True when u makes a libmongoc Single topology: one host (not SRV), no replicaSet, not
 * loadBalanced, directConnection not false. */
static bool uri_single(const mongoc_uri_t *u)
{
	const mongoc_host_list_t *h = mongoc_uri_get_hosts(u);

	return h != NULL && h->next == NULL && mongoc_uri_get_srv_hostname(u) == NULL &&
	       mongoc_uri_get_replica_set(u) == NULL &&
	       !mongoc_uri_get_option_as_bool(u, MONGOC_URI_LOADBALANCED, false) &&
	       mongoc_uri_get_option_as_bool(u, MONGOC_URI_DIRECTCONNECTION, true);
}

/* What pool_for tells about a URI. */
typedef struct pool_info {
	bool single;  /* a Single topology (uri_single) */
	bool wire_ok; /* the own connections can serve it (shard.wire_ok) */
	int cto, sto; /* its connectTimeoutMS and socketTimeoutMS (libmongoc's defaults) */
} pool_info;

/* True when the own connections (shardwire.h) can carry what u asks for: checked before
 * the cluster credentials are applied (credentials of the URI's own are a user's, whose
 * mechanism they do not speak), tls after (internal TLS sets it). */
static bool uri_wire_ok(const mongoc_uri_t *u)
{
	const bson_t *comp = mongoc_uri_get_compressors(u);
	return mongoc_uri_get_username(u) == NULL && mongoc_uri_get_auth_mechanism(u) == NULL &&
	       (comp == NULL || bson_empty(comp)) &&
	       !mongoc_uri_get_option_as_bool(u, MONGOC_URI_LOADBALANCED, false);
}

/* A pool for URI full (the proxy's settings applied); *info (may be NULL) tells what the
 * URI asks for. */
static mongoc_client_pool_t *pool_for(const char *full, pool_info *info, char *err,
				      size_t errlen)
{
	bson_error_t e;
	mongoc_uri_t *u = mongoc_uri_new_with_error(full, &e);
	mongoc_client_pool_t *p;
	bool wire_ok;

	if (u == NULL) {
		sdb_errf(err, errlen, SDB_EINVAL, "bad URI %s: %s", full, e.message);
		return NULL;
	}
	wire_ok = uri_wire_ok(u);
	auth_cluster_uri_apply(u); /* issue #10: authenticate as a cluster member */
	if (info) {
		info->single = uri_single(u);
		info->wire_ok = wire_ok && !mongoc_uri_get_tls(u);
		info->cto = mongoc_uri_get_option_as_int32(u, MONGOC_URI_CONNECTTIMEOUTMS,
						   (int32_t)MONGOC_DEFAULT_CONNECTTIMEOUTMS);
		info->sto = mongoc_uri_get_option_as_int32(u, MONGOC_URI_SOCKETTIMEOUTMS,
						   (int32_t)MONGOC_DEFAULT_SOCKETTIMEOUTMS);
	}
	p = mongoc_client_pool_new(u);
	mongoc_uri_destroy(u);
	if (p == NULL) {
		sdb_errf(err, errlen, SDB_EINVAL, "cannot create a client pool for %s", full);
		return NULL;
	}
	mongoc_client_pool_max_size(p, SHARDCONN_MAX_INFLIGHT);
	mongoc_client_pool_set_error_api(p, MONGOC_ERROR_API_VERSION_2);
	mongoc_client_pool_set_appname(p, "stripedb-proxy");
	return p;
}

static void on_server_changed(const mongoc_apm_server_changed_t *ev);
static void wire_forget(shard *sh, shardwire *w);

/* A shard entry (not linked) owning pool (not popped yet: its monitoring events are
 * set here when the own connections may serve it). */
static shard *shard_new(const char *id, const char *uri, mongoc_client_pool_t *pool,
			const pool_info *info)
{
	shard *s = sdb_calloc(1, sizeof *s);

	s->id = sdb_strdup(id);
	s->uri = sdb_strdup(uri);
	s->pool = pool;
	s->single = info->single;
	s->wire_ok = info->wire_ok;
	s->wire_cto = info->cto;
	s->wire_sto = info->sto;
	uv_mutex_init(&s->wire_mu);
	atomic_init(&s->primary, NULL);
	atomic_init(&s->demoted, 0);
	if (s->wire_ok) {
		mongoc_apm_callbacks_t *cbs = mongoc_apm_callbacks_new();
		mongoc_apm_set_server_changed_cb(cbs, on_server_changed);
		if (!mongoc_client_pool_set_apm_callbacks(pool, cbs, s))
			s->wire_ok = false; /* cannot follow the members: libmongoc only */
		mongoc_apm_callbacks_destroy(cbs);
	}
	return s;
}

/* Move old (unlinked by the caller, under sc->lock held for writing) to the retired
 * list: its pool and own connections stay allocated (commands may still run on them),
 * its idle own connections are closed now rather than at exit. */
static void shard_retire(shardconn *sc, shard *old)
{
	atomic_store(&old->primary, NULL);
	uv_mutex_lock(&old->wire_mu);
	old->wire_retired = true;
	for (size_t i = 0; i < old->n_wires; i++)
		shardwire_retire(old->wires[i]);
	uv_mutex_unlock(&old->wire_mu);
	old->next = sc->retired;
	sc->retired = old;
}

int shardconn_set_shard(shardconn *sc, const char *id, const char *uri, char *err, size_t errlen)
{
	shard *s, **pp;
	char *full = uri_with_defaults(uri);
	mongoc_client_pool_t *pool;
	pool_info info = {0};

	uv_rwlock_rdlock(&sc->lock);
	for (s = sc->shards; s; s = s->next) {
		if (strcmp(s->id, id) == 0 && strcmp(s->uri, uri) == 0) {
			uv_rwlock_rdunlock(&sc->lock);
			free(full);
			return 0;
		}
	}
	uv_rwlock_rdunlock(&sc->lock);
	pool = pool_for(full, &info, err, errlen);
	free(full);
	if (pool == NULL)
		return SDB_EINVAL;
	s = shard_new(id, uri, pool, &info);
	uv_rwlock_wrlock(&sc->lock);
	for (pp = &sc->shards; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->id, id) == 0) {
			shard *old = *pp;
			*pp = old->next;
			shard_retire(sc, old);
			break;
		}
	}
	s->next = sc->shards;
	sc->shards = s;
	uv_rwlock_wrunlock(&sc->lock);
	sdb_info("shard registered", "shard=%s uri=%s", id, uri);
	return 0;
}

bool shardconn_has_shard(shardconn *sc, const char *id)
{
	shard *s;
	bool found = false;

	uv_rwlock_rdlock(&sc->lock);
	for (s = sc->shards; s; s = s->next)
		if (strcmp(s->id, id) == 0)
			found = true;
	uv_rwlock_rdunlock(&sc->lock);
	return found;
}

static int strp_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void shardconn_retain_shards(shardconn *sc, char *const *ids, size_t n)
{
	shard *s, **pp;
	size_t i;

	uv_rwlock_wrlock(&sc->lock);
	for (pp = &sc->shards; (s = *pp) != NULL;) {
		for (i = 0; i < n; i++)
			if (strcmp(s->id, ids[i]) == 0)
				break;
		if (i < n) {
			pp = &s->next;
			continue;
		}
		*pp = s->next; /* removed from the cluster: its pool retires (clients may be out) */
		shard_retire(sc, s);
	}
	uv_rwlock_wrunlock(&sc->lock);
}

size_t shardconn_shard_ids(shardconn *sc, char ***out)
{
	shard *s;
	size_t n = 0, i = 0;

	uv_rwlock_rdlock(&sc->lock);
	for (s = sc->shards; s; s = s->next)
		n++;
	*out = sdb_calloc(n ? n : 1, sizeof **out);
	for (s = sc->shards; s; s = s->next)
		(*out)[i++] = sdb_strdup(s->id);
	uv_rwlock_rdunlock(&sc->lock);
	sdb_qsort(*out, n, sizeof **out, strp_cmp);
	return n;
}

char *shardconn_shard_hosts(shardconn *sc, const char *id)
{
	shard *s;
	char *out = NULL;

	uv_rwlock_rdlock(&sc->lock);
	for (s = sc->shards; s && out == NULL; s = s->next)
		if (strcmp(s->id, id) == 0) {
			const char *h = s->uri, *at, *end;
			if (strncmp(h, "mongodb://", 10) == 0)
				h += 10;
			else if (strncmp(h, "mongodb+srv://", 14) == 0)
				h += 14;
			end = h + strcspn(h, "/?");
			at = memchr(h, '@', (size_t)(end - h));
			if (at)
				h = at + 1;
			out = sdb_strndup(h, (size_t)(end - h));
		}
	uv_rwlock_rdunlock(&sc->lock);
	return out;
}

/* A copy of old (id, uri) with a new pool made with the current cluster key, or NULL
 * (logged). meta: old->uri is the full metadata URI, else a shard URI. */
static shard *renewed(const shard *old, bool meta)
{
	char err[256];
	char *full = meta ? sdb_strdup(old->uri) : uri_with_defaults(old->uri);
	pool_info info = {0};
	mongoc_client_pool_t *pool = pool_for(full, &info, err, sizeof err);
	shard *s;

	free(full);
	if (!pool) {
		sdb_warn("proxy: cannot renew a pool with the new cluster key", "shard=%s err=\"%s\"",
			 old->id, err);
		return NULL;
	}
	if (meta)
		info.wire_ok = false; /* metadata commands go through libmongoc only */
	s = shard_new(old->id, old->uri, pool, &info);
	return s;
}

/* Key rotation (issue #21): libmongoc keeps the credentials a pool was made with, so
 * after the cluster key's first key changed every pool is made anew (new connections
 * authenticate with the new key); the old ones are retired, not destroyed (clients of
 * them may be out). A pool that cannot be made keeps the old one. */
static void rekey(shardconn *sc)
{
	uint64_t gen = auth_cluster_generation();

	if (atomic_load(&sc->key_gen) == gen)
		return;
	uv_rwlock_wrlock(&sc->lock);
	if (atomic_load(&sc->key_gen) != gen) {
		for (shard **pp = &sc->shards; *pp; pp = &(*pp)->next) {
			shard *old = *pp, *s = renewed(old, false);
			if (!s)
				continue;
			s->next = old->next;
			*pp = s;
			shard_retire(sc, old);
		}
		if (sc->meta) {
			shard *s = renewed(sc->meta, true);
			if (s) {
				sc->meta->next = sc->retired;
				sc->retired = sc->meta;
				sc->meta = s;
			}
		}
		atomic_store(&sc->key_gen, gen);
		sdb_info("proxy: pools renewed with the new cluster key", "generation=%llu",
			 (unsigned long long)gen);
	}
	uv_rwlock_wrunlock(&sc->lock);
}

/* The shard entry of id, or NULL. Entries live until shardconn_free (replaced ones are
 * retired, not freed). */
static shard *find_shard(shardconn *sc, const char *id)
{
	shard *s, *found = NULL;

	uv_rwlock_rdlock(&sc->lock);
	for (s = sc->shards; s; s = s->next)
		if (strcmp(s->id, id) == 0)
			found = s;
	uv_rwlock_rdunlock(&sc->lock);
	return found;
}

/* The current entry of shard id (its pool made with the current cluster key), or NULL. */
static shard *find_pool(shardconn *sc, const char *id)
{
	rekey(sc);
	return find_shard(sc, id);
}

/* The read preference cmd carries ($readPreference {mode} other than primary), NULL for
 * primary or none. Caller destroys. */
static mongoc_read_prefs_t *cmd_read_prefs(const bson_t *cmd)
{
	static const struct {
		const char *name;
		mongoc_read_mode_t mode;
	} modes[] = {{"primaryPreferred", MONGOC_READ_PRIMARY_PREFERRED},
		     {"secondary", MONGOC_READ_SECONDARY},
		     {"secondaryPreferred", MONGOC_READ_SECONDARY_PREFERRED},
		     {"nearest", MONGOC_READ_NEAREST}};
	bson_iter_t it, sub;

	if (!bson_iter_init_find(&it, cmd, "$readPreference") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &sub) || !bson_iter_find(&sub, "mode") ||
	    !BSON_ITER_HOLDS_UTF8(&sub))
		return NULL;
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
		if (strcmp(bson_iter_utf8(&sub, NULL), modes[i].name) == 0)
			return mongoc_read_prefs_new(modes[i].mode);
	return NULL;
}

static _Thread_local wire_req *current_req;

/* The signing state of this thread's last shard command: the secret derived for one
 * cluster key generation and the signature of one cluster time. The secret's derivation
 * (HMAC-SHA-256 under the key file's mutex, shared by every request thread) and the
 * signature (HMAC-SHA-1) were redone for every shard command; the cluster time moves with
 * writes only (issue #19). */
static _Thread_local struct {
	bool derived;          /* secret/keyed are those of gen */
	uint64_t gen;          /* auth_cluster_generation() they were derived at */
	bool keyed;            /* a cluster key was loaded: sign with secret */
	uint8_t secret[32];
	bool built;            /* doc holds time, signed with secret */
	uint64_t time;
	uint8_t doc[128];      /* the document {$clusterTime: ...} for time, signed */
	uint32_t doc_len;
	bool located;          /* time_at and hash_at point into doc */
	bson_iter_t time_at;   /* on doc's clusterTime: a new time overwrites it there */
	uint8_t *hash_at;      /* doc's signature hash (CT_HASH_LEN bytes) */
} ct_state;

/* Point ct_state.time_at and hash_at into doc (just built by ct_append_signed, whose
 * layout a new time keeps: a Timestamp and 20 bytes of hash, fixed sizes). */
static void ct_state_locate(void)
{
	bson_t doc;
	bson_iter_t top, it;
	bson_subtype_t st;
	uint32_t len = 0;
	const uint8_t *data = NULL;

	ct_state.located = false;
	if (!bson_init_static(&doc, ct_state.doc, ct_state.doc_len))
		return;
	if (!bson_iter_init(&top, &doc) ||
	    !bson_iter_find_descendant(&top, "$clusterTime.clusterTime", &it) ||
	    !BSON_ITER_HOLDS_TIMESTAMP(&it))
		return;
	ct_state.time_at = it;
	if (!bson_iter_init(&top, &doc) ||
	    !bson_iter_find_descendant(&top, "$clusterTime.signature.hash", &it) ||
	    !BSON_ITER_HOLDS_BINARY(&it))
		return;
	bson_iter_binary(&it, &st, &len, &data);
	if (len != CT_HASH_LEN || data == NULL)
		return;
	/* data points into ct_state.doc, which is ours to write */
	ct_state.hash_at = ct_state.doc + (data - ct_state.doc);
	ct_state.located = true;
}

void shardconn_cluster_time_doc(uint64_t ct, bson_t *out)
{
	/* read before deriving: a key change after the read makes the next call derive
	 * again (its generation differs), never keep an older secret under a newer one */
	uint64_t gen = auth_cluster_generation();
	bson_t doc;

	if (!ct_state.derived || ct_state.gen != gen) {
		ct_state.keyed = auth_cluster_derive(CT_SIGN_LABEL, ct_state.secret);
		ct_state.gen = gen;
		ct_state.derived = true;
		ct_state.built = false;
	}
	if (ct_state.built && ct_state.time != ct && ct_state.located) {
		/* a new time (writes move it): the same document, its time and hash
		 * overwritten in place, not built again */
		bson_iter_overwrite_timestamp(&ct_state.time_at, (uint32_t)(ct >> 32),
					      (uint32_t)ct);
		if (ct_state.keyed)
			ct_sign(ct_state.secret, ct, ct_state.hash_at);
		ct_state.time = ct;
	}
	if (!ct_state.built || ct_state.time != ct) {
		uint8_t hash[CT_HASH_LEN];

		if (ct_state.keyed)
			ct_sign(ct_state.secret, ct, hash);
		bson_init(&doc);
		ct_append_signed(&doc, ct, ct_state.keyed ? hash : NULL);
		/* ~90 bytes: in the bson_t itself, never on the heap */
		BSON_ASSERT(doc.len <= sizeof ct_state.doc);
		memcpy(ct_state.doc, bson_get_data(&doc), doc.len);
		ct_state.doc_len = doc.len;
		ct_state.time = ct;
		ct_state.built = true;
		bson_destroy(&doc);
		ct_state_locate();
	}
	if (!bson_init_static(out, ct_state.doc, ct_state.doc_len))
		bson_init(out); /* cannot happen: built by libbson above */
}

void shardconn_set_current_req(wire_req *req)
{
	current_req = req;
}

void shardconn_wait_begin(void)
{
	if (current_req != NULL)
		wire_req_wait_begin(current_req);
}

void shardconn_wait_end(void)
{
	if (current_req != NULL)
		wire_req_wait_end(current_req);
}

static int command_io(shardconn *sc, const char *id, const char *db, const bson_t *cmd,
		      uint32_t *server_id, bson_t *reply, char *err, size_t errlen, int *fate);

/* The client's deadline of the request this thread works for (monotonic ms, 0 = none):
 * set by the job runner, carried to fan-out units by shardconn_fanout. */
static _Thread_local uint64_t op_deadline_ms;

void shardconn_set_op_deadline(uint64_t deadline_ms)
{
	op_deadline_ms = deadline_ms;
}

uint64_t shardconn_op_deadline(void)
{
	return op_deadline_ms;
}

/* One shard call run on the calls pool for a waiter that may give up at its deadline.
 * Owned by the waiter and the worker (refs); the last to let go frees it, so an abandoned
 * call finishes with its own copies of everything it needs. */
typedef struct dcall {
	uv_mutex_t mu;
	uv_cond_t cv;
	int refs;
	bool done;
	bool abandoned;    /* the waiter gave up (under mu): a call not started is not sent */
	uint64_t deadline; /* monotonic ms */
	shardconn *sc;
	shard *sh; /* its dl_running slot (entries live until shardconn_free), or NULL */
	char *id, *db;
	bson_t *cmd, reply;
	uint32_t server_id;
	int rc, fate;
	char err[512];
} dcall;

static void dcall_unref(dcall *k)
{
	bool last;

	uv_mutex_lock(&k->mu);
	last = --k->refs == 0;
	uv_mutex_unlock(&k->mu);
	if (!last)
		return;
	uv_cond_destroy(&k->cv);
	uv_mutex_destroy(&k->mu);
	bson_destroy(&k->reply);
	bson_destroy(k->cmd);
	free(k->id);
	free(k->db);
	free(k);
}

static int max_time_expired(bson_t *reply, int *fate);

static void dcall_run(void *arg)
{
	dcall *k = arg;
	bool send;

	/* queued behind other calls past its deadline, or given up on: never sent late (a
	 * write the client was told had failed must not be applied minutes later) */
	uv_mutex_lock(&k->mu);
	send = !k->abandoned && sdb_mono_ms() < k->deadline;
	uv_mutex_unlock(&k->mu);
	if (send)
		k->rc = command_io(k->sc, k->id, k->db, k->cmd, &k->server_id, &k->reply,
				   k->err, sizeof k->err, &k->fate);
	else
		k->rc = max_time_expired(&k->reply, &k->fate);
	if (k->sh != NULL) {
		uv_mutex_lock(&k->sc->dl_mu);
		k->sh->dl_running--;
		uv_cond_broadcast(&k->sc->dl_cv);
		uv_mutex_unlock(&k->sc->dl_mu);
	}
	uv_mutex_lock(&k->mu);
	k->done = true;
	uv_cond_signal(&k->cv);
	uv_mutex_unlock(&k->mu);
	dcall_unref(k);
}

/* MongoDB's answer when an operation's maxTimeMS ran out (mongos answers it too when a
 * shard does not reply in time: the remote call is cancelled at the operation's
 * deadline). */
static int max_time_expired(bson_t *reply, int *fate)
{
	bson_reinit(reply);
	BSON_APPEND_DOUBLE(reply, "ok", 0);
	BSON_APPEND_UTF8(reply, "errmsg", "operation exceeded time limit");
	BSON_APPEND_INT32(reply, "code", WIRE_ERR_MAX_TIME_EXPIRED);
	BSON_APPEND_UTF8(reply, "codeName", "MaxTimeMSExpired");
	*fate = SHARDCONN_ANSWERED;
	return SHARDCONN_CMD_ERR;
}

/* command_io bounded by deadline (monotonic ms): the call runs on the calls pool and the
 * caller waits for it at most until the deadline; then the call is abandoned (it goes on
 * with its own copies until the shard answers or the socket times out, its result
 * dropped) and the answer is MaxTimeMSExpired. Same contract as command_io. */
static int command_until(shardconn *sc, const char *id, const char *db, const bson_t *cmd,
			 uint32_t *server_id, bson_t *reply, char *err, size_t errlen, int *fate,
			 uint64_t deadline)
{
	dcall *k;
	uint64_t now = sdb_mono_ms();
	int rc;

	bson_init(reply);
	if (now >= deadline)
		return max_time_expired(reply, fate); /* nothing sent */
	/* at most SHARDCONN_MAX_INFLIGHT calls per shard on the calls pool, abandoned ones
	 * included: a shard that stopped answering holds that many threads, not the whole
	 * pool, so calls to the other shards still run (a call waits for a slot as for a
	 * pooled client, until its deadline) */
	shard *sh = find_shard(sc, id);
	if (sh != NULL) {
		uv_mutex_lock(&sc->dl_mu);
		while (sh->dl_running >= SHARDCONN_MAX_INFLIGHT && (now = sdb_mono_ms()) < deadline)
			(void)uv_cond_timedwait(&sc->dl_cv, &sc->dl_mu,
						(deadline - now) * 1000000ULL);
		if (sh->dl_running >= SHARDCONN_MAX_INFLIGHT) {
			uv_mutex_unlock(&sc->dl_mu);
			if (sc->m_abandoned)
				sdb_counter_inc(sc->m_abandoned);
			return max_time_expired(reply, fate); /* nothing sent */
		}
		sh->dl_running++;
		uv_mutex_unlock(&sc->dl_mu);
	}
	k = sdb_calloc(1, sizeof *k);
	k->sh = sh;
	k->deadline = deadline;
	uv_mutex_init(&k->mu);
	uv_cond_init(&k->cv);
	k->refs = 2;
	k->sc = sc;
	k->id = sdb_strdup(id);
	k->db = sdb_strdup(db);
	k->cmd = bson_copy(cmd);
	k->server_id = *server_id;
	bson_init(&k->reply);
	tpool_push(&sc->calls, dcall_run, k);
	uv_mutex_lock(&k->mu);
	while (!k->done && (now = sdb_mono_ms()) < deadline)
		(void)uv_cond_timedwait(&k->cv, &k->mu, (deadline - now) * 1000000ULL);
	if (k->done) {
		uv_mutex_unlock(&k->mu);
		*server_id = k->server_id;
		bson_destroy(reply);
		bson_copy_to(&k->reply, reply);
		snprintf(err, errlen, "%s", k->err);
		*fate = k->fate;
		rc = k->rc;
	} else {
		k->abandoned = true;
		uv_mutex_unlock(&k->mu);
		sdb_debug("shard call abandoned at the client's maxTimeMS", "shard=%s", id);
		if (sc->m_abandoned)
			sdb_counter_inc(sc->m_abandoned);
		rc = max_time_expired(reply, fate);
	}
	dcall_unref(k);
	return rc;
}

int shardconn_command(shardconn *sc, const char *id, const char *db, const bson_t *cmd,
		      uint32_t *server_id, bson_t *reply, char *err, size_t errlen, int *fate)
{
	int rc;
	uint64_t deadline = op_deadline_ms;

	shardconn_wait_begin();
	if (deadline != 0)
		rc = command_until(sc, id, db, cmd, server_id, reply, err, errlen, fate,
				   deadline);
	else
		rc = command_io(sc, id, db, cmd, server_id, reply, err, errlen, fate);
	shardconn_wait_end();
	return rc;
}

/* ---------- The own connections (issue #19) ----------
 * libmongoc selects a shard's primary and watches its members; once a primary command it
 * sent was answered by a member libmongoc describes as a primary (or the one server of a
 * Single topology, a standalone), that member's own connections (shardwire.h) carry the
 * shard's primary commands, and getMores pinned to its server id, until libmongoc's
 * monitoring describes that member as anything but a primary or another member as the
 * primary (on_server_changed) or a command fails. Any failure hands the shard back to
 * libmongoc: a network error or an answer that the member is not (or no longer) a
 * primary forgets the member as primary; a refusal as not a primary (refused_code) on
 * the own connection is then sent again through libmongoc at once (it did not run), so
 * libmongoc sees the error, marks the member and selects again, exactly as when it had
 * sent the command itself; an interruption by a step-down or a shutdown (11602, 11600,
 * 189: it may have run) is answered as it came, for retry.c. What reaches the member
 * differs from libmongoc's commands in two ways: no implicit session (lsid) libmongoc would have started for a command
 * without one, and no $readPreference primaryPreferred that libmongoc adds in a Single
 * topology to a member that is not a mongos (the member is a primary here). */

static int64_t reply_code(const bson_t *reply)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it)
		       ? bson_iter_as_int64(&it)
		       : 0;
}

/* The setName of the hello a server description was made from, or NULL (borrowed). */
static const char *set_name_of(const mongoc_server_description_t *sd)
{
	bson_iter_t it;
	const bson_t *hello = mongoc_server_description_hello_response(sd);

	return hello && bson_iter_init_find(&it, hello, "setName") && BSON_ITER_HOLDS_UTF8(&it)
		       ? bson_iter_utf8(&it, NULL)
		       : NULL;
}

/* After a primary command libmongoc sent to server_id was answered (not with a
 * not-primary error): make that member the shard's own-connection primary when
 * libmongoc describes it as a primary or a standalone. */
static void wire_learn(shard *sh, mongoc_client_t *cl, uint32_t server_id)
{
	mongoc_server_description_t *sd;
	const char *type;
	shardwire *w = NULL;

	if (!sh->wire_ok || atomic_load(&sh->primary) != NULL)
		return;
	if (atomic_load(&sh->demoted) == server_id)
		return; /* libmongoc's monitoring already saw it stop being the primary */
	sd = mongoc_client_get_server_description(cl, server_id);
	if (sd == NULL)
		return;
	type = mongoc_server_description_type(sd);
	if (strcmp(type, "RSPrimary") == 0 || strcmp(type, "Standalone") == 0) {
		const char *host = mongoc_server_description_host(sd)->host_and_port;
		uv_mutex_lock(&sh->wire_mu);
		for (size_t i = 0; i < sh->n_wires && !w; i++)
			if (shardwire_server_id(sh->wires[i]) == server_id &&
			    strcmp(shardwire_host(sh->wires[i]), host) == 0)
				w = sh->wires[i];
		if (sh->wire_retired)
			w = NULL; /* replaced or removed: its entry learns nothing more */
		else if (!w && sh->n_wires < SHARD_WIRE_MEMBERS) {
			w = shardwire_new(host, server_id, sh->wire_cto, sh->wire_sto,
					  set_name_of(sd));
			sh->wires[sh->n_wires++] = w;
		}
		uv_mutex_unlock(&sh->wire_mu);
		if (w) {
			atomic_store(&sh->primary, w);
			/* an event may have come after the description was copied */
			if (atomic_load(&sh->demoted) == server_id)
				wire_forget(sh, w);
		}
	}
	mongoc_server_description_destroy(sd);
}

/* Forget w as the shard's primary (when it still is). */
static void wire_forget(shard *sh, shardwire *w)
{
	shardwire *expect = w;
	atomic_compare_exchange_strong(&sh->primary, &expect, NULL);
}

/* libmongoc's monitoring (SDAM "server description changed" events; its monitor
 * threads, or a request thread after a network or not-primary error): the own
 * connections must follow what it learns, or a primary that was stopped or cut off (its
 * connections open, no error) keeps the shard's primary commands until a socket times
 * out, long after libmongoc found the new primary. A member described as anything but a
 * primary (or standalone) is forgotten when it is the own connections' primary; another
 * member described as the primary makes them forget theirs. Either way the next primary
 * command goes through libmongoc, which selects and learns again. */
static void on_server_changed(const mongoc_apm_server_changed_t *ev)
{
	shard *sh = mongoc_apm_server_changed_get_context(ev);
	const mongoc_server_description_t *nd = mongoc_apm_server_changed_get_new_description(ev);
	const char *type = mongoc_server_description_type(nd);
	uint32_t id = mongoc_server_description_id(nd);
	bool is_primary = strcmp(type, "RSPrimary") == 0 || strcmp(type, "Standalone") == 0;
	shardwire *w;

	if (is_primary) {
		uint32_t expect = id;
		atomic_compare_exchange_strong(&sh->demoted, &expect, 0);
	} else {
		atomic_store(&sh->demoted, id);
	}
	w = atomic_load(&sh->primary);
	if (w && (shardwire_server_id(w) == id) != is_primary)
		wire_forget(sh, w);
}

/* The fields of a shard command that command_io and sent_cmd ask about, found in one
 * walk of it (cmd_fields): bits of sdb_bson_find_fields's mask. */
#define CMD_HAS_READ_PREF SDB_FIELD_BIT(0)    /* $readPreference */
#define CMD_HAS_CLUSTER_TIME SDB_FIELD_BIT(1) /* $clusterTime */
#define CMD_HAS_DB SDB_FIELD_BIT(2)           /* $db */

static uint64_t cmd_fields(const bson_t *cmd)
{
	static const char *const names[] = {"$readPreference", "$clusterTime", "$db"};
	uint64_t found = 0;

	sdb_bson_find_fields(cmd, names, sizeof names / sizeof names[0], &found, NULL);
	return found;
}

/* The command as sent: cmd without its $clusterTime, the proxy's signed one instead
 * (issue #20), and $db when with_db (the own connections; libmongoc adds its own).
 * fields: cmd_fields(cmd). */
static void sent_cmd(const char *db, const bson_t *cmd, uint64_t fields, bool with_db,
		     uint64_t ct, bson_t *sent)
{
	/* the commands the proxy builds carry no $clusterTime (px_copy_cmd drops it):
	 * one copy of the bytes then, not a field by field rebuild (issue #19) */
	if (fields & CMD_HAS_CLUSTER_TIME) {
		bson_init(sent);
		bson_copy_to_excluding_noinit(cmd, sent, "$clusterTime", NULL);
	} else {
		bson_copy_to(cmd, sent);
	}
	if (ct) {
		bson_t ctdoc;
		shardconn_cluster_time_doc(ct, &ctdoc);
		bson_concat(sent, &ctdoc);
	}
	if (with_db && !(fields & CMD_HAS_DB))
		BSON_APPEND_UTF8(sent, "$db", db);
}

/* shardconn_command's attempt on the own connections of w. Returns -1 when the member
 * refused the command as not a primary (refused_code: it did not run; the caller sends
 * it through libmongoc), else shardconn_command's result (an interrupted command's
 * 11602/11600/189 answer is a CMD_ERR, as through libmongoc, the member forgotten). */
static int command_wire(shardconn *sc, shard *sh, shardwire *w, const char *db,
			const bson_t *cmd, uint64_t fields, uint32_t *server_id, bson_t *reply,
			char *err, size_t errlen, int *fate)
{
	bson_t sent;
	bson_iter_t it;
	uint64_t ct = atomic_load(&sc->cluster_time);
	char why[512];
	int rc;

	sent_cmd(db, cmd, fields, true, ct, &sent);
	rc = shardwire_command(w, &sent, reply, why, sizeof why);
	bson_destroy(&sent);
	if (rc != SHARDWIRE_OK) {
		wire_forget(sh, w);
		sdb_errf(err, errlen, SDB_EUNAVAILABLE, "shard %s: %s", sh->id, why);
		*fate = rc == SHARDWIRE_UNSENT ? SHARDCONN_UNSENT : SHARDCONN_UNKNOWN_OUTCOME;
		return SHARDCONN_NET_ERR;
	}
	sdb_counter_inc(sc->m_wire);
	ct_advance(&sc->cluster_time, ct_of_reply(reply));
	*server_id = shardwire_server_id(w);
	if (bson_iter_init_find(&it, reply, "ok") && bson_iter_as_bool(&it))
		return SHARDCONN_OK;
	{
		int64_t code = reply_code(reply);
		if (wire_state_change_code(code)) {
			wire_forget(sh, w);
			if (!wire_not_executed_code(code))
				return SHARDCONN_CMD_ERR; /* it may have run: retry.c decides */
			bson_reinit(reply);
			return -1;
		}
		return code == WIRE_ERR_STALE_CONFIG ? SHARDCONN_STALE : SHARDCONN_CMD_ERR;
	}
}

/* shardconn_command's attempt (its contract), inside the caller's wait bracket. */
static int command_io(shardconn *sc, const char *id, const char *db, const bson_t *cmd,
		      uint32_t *server_id, bson_t *reply, char *err, size_t errlen, int *fate)
{
	shard *sh = find_pool(sc, id);
	mongoc_client_pool_t *pool = sh ? sh->pool : NULL;
	mongoc_client_t *cl;
	shardwire *w;
	bson_error_t e;
	bson_iter_t it;
	bool ok, cached = false, primary = false;
	uint32_t entry_id = *server_id;
	uint64_t fields;
	int rc;

	*fate = SHARDCONN_ANSWERED;
	if (pool == NULL) {
		bson_init(reply);
		sdb_errf(err, errlen, SDB_ENOTFOUND, "shard %s is not registered", id);
		*fate = SHARDCONN_UNREGISTERED;
		return SHARDCONN_NET_ERR;
	}
	cl = mongoc_client_pool_pop(pool); /* also the in-flight bound of the own connections */
	fields = cmd_fields(cmd);
	if (sh->wire_ok && (w = atomic_load(&sh->primary)) != NULL &&
	    (*server_id != 0 ? *server_id == shardwire_server_id(w)
			     : !(fields & CMD_HAS_READ_PREF))) {
		rc = command_wire(sc, sh, w, db, cmd, fields, server_id, reply, err, errlen,
				  fate);
		if (rc >= 0) {
			mongoc_client_pool_push(pool, cl);
			return rc;
		}
		/* not a primary any more: through libmongoc, which selects again */
		bson_destroy(reply);
		*server_id = entry_id;
	}
	if (*server_id == 0) {
		/* a read with a read preference (the proxy forwards the client's, readpref.c)
		 * selects a member by it; everything else goes to the primary */
		mongoc_read_prefs_t *rp = cmd_read_prefs(cmd);
		mongoc_server_description_t *sd = NULL;

		primary = rp == NULL;
		/* A Single topology has one server, with one id: a primary command goes to
		 * it without selecting it again (a down server then fails to connect, UNSENT,
		 * as selection would have failed). The id is forgotten after any failure. */
		if (primary && sh->single &&
		    (*server_id = (uint32_t)atomic_load(&sh->server_id)) != 0)
			cached = true;
		else
			sd = mongoc_client_select_server(cl, primary, rp, &e);
		if (rp)
			mongoc_read_prefs_destroy(rp);
		if (!cached && sd == NULL) {
			mongoc_client_pool_push(pool, cl);
			bson_init(reply);
			sdb_errf(err, errlen, SDB_EUNAVAILABLE, "shard %s is unreachable: %s", id,
				 e.message);
			*fate = SHARDCONN_UNSENT;
			return SHARDCONN_NET_ERR;
		}
		if (!cached) {
			*server_id = mongoc_server_description_id(sd);
			mongoc_server_description_destroy(sd);
			if (primary && sh->single)
				atomic_store(&sh->server_id, *server_id);
		}
	}
	{
		/* issue #20: gossip the proxy's cluster time to the shard (its next write sorts
		 * above it) and take the shard's from the reply (clustertime.h) */
		bson_t sent;
		uint64_t ct = atomic_load(&sc->cluster_time);

		sent_cmd(db, cmd, fields, false, ct, &sent);
		ok = mongoc_client_command_simple_with_server_id(cl, db, &sent, NULL, *server_id,
								 reply, &e);
		bson_destroy(&sent);
		ct_advance(&sc->cluster_time, ct_of_reply(reply));
	}
	if (primary && (ok || ((e.domain == MONGOC_ERROR_SERVER ||
				e.domain == MONGOC_ERROR_WRITE_CONCERN) &&
			       !wire_state_change_code(reply_code(reply)))))
		wire_learn(sh, cl, *server_id);
	mongoc_client_pool_push(pool, cl);
	if (ok)
		return SHARDCONN_OK;
	if (cached)
		atomic_store(&sh->server_id, 0);
	if (e.domain == MONGOC_ERROR_SERVER || e.domain == MONGOC_ERROR_WRITE_CONCERN) {
		rc = SHARDCONN_CMD_ERR;
		if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it) &&
		    bson_iter_as_int64(&it) == WIRE_ERR_STALE_CONFIG)
			rc = SHARDCONN_STALE;
		if (bson_empty(reply)) {
			BSON_APPEND_DOUBLE(reply, "ok", 0);
			BSON_APPEND_UTF8(reply, "errmsg", e.message);
			BSON_APPEND_INT32(reply, "code", (int32_t)e.code);
		}
		return rc;
	}
	sdb_errf(err, errlen, SDB_EUNAVAILABLE, "shard %s: %s", id, e.message);
	if (e.domain == MONGOC_ERROR_SERVER_SELECTION ||
	    (e.domain == MONGOC_ERROR_STREAM && (e.code == MONGOC_ERROR_STREAM_CONNECT ||
						 e.code == MONGOC_ERROR_STREAM_NAME_RESOLUTION)))
		*fate = SHARDCONN_UNSENT;
	else
		*fate = SHARDCONN_UNKNOWN_OUTCOME;
	return SHARDCONN_NET_ERR;
}

bool shardconn_unexecuted(const bson_t *reply)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, reply, SHARDCONN_UNEXECUTED_FIELD) &&
	       BSON_ITER_HOLDS_BOOL(&it) && bson_iter_bool(&it);
}

bool shardconn_shard_down(shardconn *sc, const char *id)
{
	shard *sh = find_shard(sc, id);

	return sh != NULL && atomic_load(&sh->down);
}

void shardconn_set_shard_down(shardconn *sc, const char *id, bool down)
{
	shard *sh = find_shard(sc, id);

	if (sh != NULL)
		atomic_store(&sh->down, down);
}

void shardconn_submit(shardconn *sc, void (*fn)(void *arg), void *arg)
{
	tpool_push(&sc->req, fn, arg);
}

typedef struct fan {
	uv_mutex_t mu;
	uv_cond_t cv;
	size_t left;
	uint64_t op_deadline_ms; /* the waiting request's (shardconn_set_op_deadline) */
	void (*fn)(void *ctx, size_t i);
	void *ctx;
} fan;

typedef struct fan_item {
	fan *f;
	size_t i;
} fan_item;

static void fan_run(void *arg)
{
	fan_item *it = arg;
	fan *f = it->f;

	op_deadline_ms = f->op_deadline_ms;
	f->fn(f->ctx, it->i);
	op_deadline_ms = 0;
	uv_mutex_lock(&f->mu);
	if (--f->left == 0)
		uv_cond_signal(&f->cv);
	uv_mutex_unlock(&f->mu);
	free(it);
}

void shardconn_fanout(shardconn *sc, size_t n, void (*fn)(void *ctx, size_t i), void *ctx)
{
	fan f;
	size_t i;

	if (n == 0)
		return;
	if (n == 1) {
		fn(ctx, 0);
		return;
	}
	uv_mutex_init(&f.mu);
	uv_cond_init(&f.cv);
	f.left = n - 1;
	f.op_deadline_ms = op_deadline_ms;
	f.fn = fn;
	f.ctx = ctx;
	for (i = 1; i < n; i++) {
		fan_item *it = sdb_calloc(1, sizeof *it);
		it->f = &f;
		it->i = i;
		tpool_push(&sc->io, fan_run, it);
	}
	/* unit 0 on this thread, which would only wait otherwise: one hand-off to the I/O
	 * pool (a wake-up and a switch each way) less per fan-out (issue #19: a short scan
	 * through a proxy fans out to every shard from its start key on) */
	fn(ctx, 0);
	uv_mutex_lock(&f.mu);
	while (f.left > 0)
		uv_cond_wait(&f.cv, &f.mu);
	uv_mutex_unlock(&f.mu);
	uv_cond_destroy(&f.cv);
	uv_mutex_destroy(&f.mu);
}

int shardconn_set_metadata(shardconn *sc, const char *addrs, char *err, size_t errlen)
{
	char *uri = sdb_meta_uri(addrs, false, 1500, 2000, 30000);
	mongoc_client_pool_t *p = pool_for(uri, NULL, err, errlen);
	shard *s;

	if (!p) {
		free(uri);
		return SDB_EINVAL;
	}
	{
		pool_info none = {0}; /* metadata commands go through libmongoc only */
		s = shard_new("metadata", uri, p, &none);
		free(uri);
	}
	uv_rwlock_wrlock(&sc->lock);
	if (sc->meta) {
		sc->meta->next = sc->retired;
		sc->retired = sc->meta;
	}
	sc->meta = s;
	uv_rwlock_wrunlock(&sc->lock);
	return 0;
}

mongoc_client_pool_t *shardconn_metadata(shardconn *sc)
{
	mongoc_client_pool_t *p;

	rekey(sc);
	uv_rwlock_rdlock(&sc->lock);
	p = sc->meta ? sc->meta->pool : NULL;
	uv_rwlock_rdunlock(&sc->lock);
	return p;
}

uint64_t shardconn_cluster_time(shardconn *sc)
{
	return atomic_load(&sc->cluster_time);
}

uint64_t shardconn_advance_cluster_time(shardconn *sc, uint64_t time)
{
	return ct_advance(&sc->cluster_time, time);
}

/* ---------- the loop thread's forwarder (forwarder.h) ---------- */

shardwire *shardconn_forward_target(shardconn *sc, const char *id)
{
	shard *sh;
	shardwire *w;

	/* a rotated cluster key renews the pools (rekey, a request thread's job): until
	 * then the request threads serve the shard */
	if (atomic_load(&sc->key_gen) != auth_cluster_generation())
		return NULL;
	sh = find_shard(sc, id);
	if (sh == NULL || !sh->wire_ok || atomic_load(&sh->down))
		return NULL;
	w = atomic_load(&sh->primary);
	if (w == NULL || atomic_load(&sh->demoted) == shardwire_server_id(w))
		return NULL;
	return w;
}

void shardconn_forward_finish(shardconn *sc, const char *db, bson_t *cmd)
{
	uint64_t ct = atomic_load(&sc->cluster_time);

	/* as sent_cmd, appended in place: cmd has neither field */
	if (ct) {
		bson_t ctdoc;
		shardconn_cluster_time_doc(ct, &ctdoc);
		bson_concat(cmd, &ctdoc);
	}
	BSON_APPEND_UTF8(cmd, "$db", db);
}

bool shardconn_forward_done(shardconn *sc, const char *id, shardwire *w, const bson_t *reply)
{
	shard *sh = find_shard(sc, id);
	bson_iter_t it;

	if (reply == NULL) {
		if (sh)
			wire_forget(sh, w);
		return false;
	}
	sdb_counter_inc(sc->m_wire);
	ct_advance(&sc->cluster_time, ct_of_reply(reply));
	if (bson_iter_init_find(&it, reply, "ok") && bson_iter_as_bool(&it))
		return true;
	if (sh && wire_state_change_code(reply_code(reply)))
		wire_forget(sh, w);
	return false;
}
