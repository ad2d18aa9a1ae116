/* The proxy's authentication and authorization gate. See auth/gate.h. */
#include "auth/gate.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "auth/audit.h"
#include "auth/policy.h"
#include "auth/scram.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"

#define AUTH_FAILURE_WINDOW_MS 60000
#define AUTH_USER_CACHE 64          /* verifiers kept for speculative authentication */
#define AUTH_USER_CACHE_TTL_NS (10 * 1000000000ull)
/* Nesting bound of the pipeline walk, $facet levels counted: mongod's 20 nested
 * sub-pipelines (storage/pipeline.h SDB_PIPELINE_MAX_SUB_DEPTH), each of which may hold one
 * $facet (not directly nested), so twice that plus one (src/proxy/foreign.c, the same). */
#define AUTH_MAX_PIPELINE_DEPTH 41

struct auth_gate {
	uv_loop_t *loop;
	auth_meta_fn meta;
	void *meta_arg;
	int64_t failure_limit;
	int64_t fail_delay_ms;
	auth_failures_fn failures_local;   /* NULL: no brute-force limit */
	auth_failures_fn failures_cluster; /* NULL: the local counts only */
	void *failures_ctx;
	bool has_cluster;
	auth_scram_creds cluster[AUTH_GATE_CLUSTER_MAX]; /* __system's verifiers (under mu) */
	size_t n_cluster;
	uv_mutex_t mu; /* guards pol and cluster, n_cluster */
	auth_policy *pol;
	/* Speculative authentication (hello's speculativeAuthenticate): verifiers of recent
	 * saslStart lookups, and the server-first the hello hook adds to the reply of the
	 * hello being dispatched (spec_cmd). Loop thread only. */
	struct cached_user {
		char user[AUTH_SCRAM_MAX_USER + 1];
		char tenant[256];
		auth_scram_creds creds; /* creds.mech: one entry per user and mechanism */
		uint64_t at_ns;
		int64_t users_version; /* metadata usersVersion the verifier was read at */
	} cache[AUTH_USER_CACHE];
	size_t cache_next;
	const bson_t *spec_cmd;
	char spec_payload[AUTH_SCRAM_MAX_MSG + 1];
	sdb_counter *m_speculative;
	/* Highest metadata usersVersion seen (listTenants poll, getUser replies); cache
	 * entries of an older version are not used. Any thread. */
	_Atomic int64_t users_version;
	sdb_gauge *m_users_version;
	/* The users that exist (listUsers at users_list_version; sorted), guarded by mu:
	 * an authenticated connection whose user is missing from a list at least as new as
	 * its authentication was dropped, and loses its authentication (MongoDB logs a
	 * dropped user out of its sessions). users_list_known: a list was loaded. */
	char **users;
	size_t nusers;
	int64_t users_list_version;
	bool users_list_known;
};

static const sdb_metric_def gate_metrics[] = {
	SDB_METRIC_COUNTER(auth_gate, m_speculative, "stripedb_auth_speculative_total",
			   "Conversations started in hello (speculativeAuthenticate)."),
	SDB_METRIC_GAUGE(auth_gate, m_users_version,
		"stripedb_auth_users_version",
		"Highest metadata usersVersion seen (cached verifiers of older ones are unused)."),
};

/* Per-connection state (wire_conn_set_data). Loop thread only. */
typedef enum { CONN_NONE = 0, CONN_CONVERSING, CONN_AUTHENTICATED } conn_state;

typedef struct auth_conn {
	conn_state state;
	bool busy;          /* a saslStart is looking up its user */
	bool is_system;     /* authenticated as the internal user __system */
	bool recheck;       /* conversation started from the cache (speculative): the verifier
			     * is read again from metadata before the connection is authenticated */
	int64_t auth_version; /* usersVersion of the verifier the user authenticated with */
	auth_scram scram;
	char user[AUTH_SCRAM_MAX_USER + 1];
	char tenant[256];
} auth_conn;

auth_gate *auth_gate_new(const auth_gate_opts *opts)
{
	auth_gate *g = sdb_calloc(1, sizeof *g);
	g->loop = opts->loop;
	g->meta = opts->meta;
	g->meta_arg = opts->meta_arg;
	g->failure_limit = opts->failure_limit > 0 ? opts->failure_limit : 10;
	g->fail_delay_ms = opts->fail_delay_ms > 0 ? opts->fail_delay_ms : AUTH_GATE_FAIL_DELAY_MS;
	g->failures_local = opts->failures_local;
	g->failures_cluster = opts->failures_cluster;
	g->failures_ctx = opts->failures_ctx;
	uv_mutex_init(&g->mu);
	g->pol = auth_policy_build(NULL, NULL);
	SDB_METRICS_REGISTER(g, gate_metrics, NULL);
	if (opts->cluster) {
		g->has_cluster = true;
		auth_gate_set_cluster(g, opts->cluster, opts->n_cluster ? opts->n_cluster : 1);
	}
	return g;
}

void auth_gate_set_cluster(auth_gate *g, const auth_scram_creds *creds, size_t n)
{
	if (n > AUTH_GATE_CLUSTER_MAX)
		n = AUTH_GATE_CLUSTER_MAX;
	uv_mutex_lock(&g->mu);
	memcpy(g->cluster, creds, n * sizeof *creds);
	g->n_cluster = n;
	uv_mutex_unlock(&g->mu);
}

/* Copy the __system verifiers into out (AUTH_GATE_CLUSTER_MAX); their count. */
static size_t cluster_creds(auth_gate *g, auth_scram_creds *out)
{
	size_t n;
	uv_mutex_lock(&g->mu);
	n = g->n_cluster;
	memcpy(out, g->cluster, n * sizeof *out);
	uv_mutex_unlock(&g->mu);
	return n;
}

/* client-final of a __system conversation against every current verifier with the salt
 * and iterations that server-first announced (any key of the rotation): 0 for the first
 * that accepts the proof, else the refusal (s is FAILED then). */
static int cluster_final(auth_gate *g, auth_scram *s, const uint8_t *payload, uint32_t plen,
			 char *out, size_t outlen, char *err, size_t errlen)
{
	auth_scram_creds all[AUTH_GATE_CLUSTER_MAX];
	size_t n = cluster_creds(g, all);
	auth_scram *t = sdb_malloc(sizeof *t);
	int rc = SDB_EAUTH;
	bool tried = false;

	for (size_t i = 0; i < n; i++) {
		if (all[i].salt_len != s->creds.salt_len || all[i].iterations != s->creds.iterations ||
		    all[i].mech != s->creds.mech ||
		    memcmp(all[i].salt, s->creds.salt, s->creds.salt_len) != 0)
			continue;
		*t = *s;
		t->creds = all[i];
		tried = true;
		rc = auth_scram_client_final(t, payload, plen, out, outlen, err, errlen);
		if (rc != SDB_EAUTH) /* accepted, or malformed whatever the key */
			break;
	}
	if (tried) {
		*s = *t;
	} else {
		s->state = AUTH_SCRAM_FAILED;
		rc = sdb_errf(err, errlen, SDB_EAUTH, "SCRAM: the cluster keys changed");
	}
	OPENSSL_cleanse(t, sizeof *t);
	free(t);
	OPENSSL_cleanse(all, sizeof all);
	return rc;
}

static void free_users(char **users, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(users[i]);
	free(users);
}

void auth_gate_free(auth_gate *g)
{
	if (!g)
		return;
	free_users(g->users, g->nusers);
	auth_policy_free(g->pol);
	uv_mutex_destroy(&g->mu);
	free(g);
}

static void see_users_version(auth_gate *g, int64_t v)
{
	int64_t cur = atomic_load(&g->users_version);
	while (v > cur && !atomic_compare_exchange_weak(&g->users_version, &cur, v))
		;
	if (v > cur)
		sdb_gauge_set(g->m_users_version, atomic_load(&g->users_version));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Re-read the list of users (listUsers) when usersVersion moved past the loaded list. */
static void load_users(auth_gate *g, int64_t version)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr, f;
	char err[256], **users = NULL;
	size_t n = 0, cap = 0;
	int code = 0;
	int64_t lv = -1;
	bool ok = false, known;

	uv_mutex_lock(&g->mu);
	known = g->users_list_known && g->users_list_version >= version;
	uv_mutex_unlock(&g->mu);
	if (known || !g->meta)
		return;
	BSON_APPEND_INT32(&cmd, "listUsers", 1);
	if (g->meta(g->meta_arg, &cmd, &reply, &code, err, sizeof err) == 0 &&
	    bson_iter_init_find(&it, &reply, "usersVersion") && BSON_ITER_HOLDS_NUMBER(&it) &&
	    (lv = bson_iter_as_int64(&it)) >= 0 && bson_iter_init_find(&it, &reply, "users") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
		ok = true;
		while (bson_iter_next(&arr)) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &f) ||
			    !bson_iter_find(&f, "name") || !BSON_ITER_HOLDS_UTF8(&f))
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				users = sdb_realloc(users, cap * sizeof *users);
			}
			users[n++] = sdb_strdup(bson_iter_utf8(&f, NULL));
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (!ok) { /* an older metadata service: no list, nobody is logged out */
		free_users(users, n);
		return;
	}
	sdb_qsort(users, n, sizeof *users, cmp_str);
	uv_mutex_lock(&g->mu);
	if (g->users_list_known && g->users_list_version > lv) { /* a newer one won */
		uv_mutex_unlock(&g->mu);
		free_users(users, n);
		return;
	}
	{
		char **old = g->users;
		size_t on = g->nusers;
		g->users = users;
		g->nusers = n;
		g->users_list_version = lv;
		g->users_list_known = true;
		uv_mutex_unlock(&g->mu);
		free_users(old, on);
	}
	see_users_version(g, lv); /* after the swap: the gauge implies the list */
}

void auth_gate_load(auth_gate *g, const bson_t *tenants, const bson_t *dbs)
{
	auth_policy *np = auth_policy_build(tenants, dbs), *old;
	bson_iter_t it;
	if (tenants && bson_iter_init_find(&it, tenants, "usersVersion") &&
	    BSON_ITER_HOLDS_NUMBER(&it)) {
		load_users(g, bson_iter_as_int64(&it));
		see_users_version(g, bson_iter_as_int64(&it));
	}
	uv_mutex_lock(&g->mu);
	old = g->pol;
	g->pol = np;
	uv_mutex_unlock(&g->mu);
	auth_policy_free(old);
}

/* Was the connection's user dropped after it authenticated? (a list at least as new as
 * the verifier it authenticated with does not name it) */
static bool user_dropped(auth_gate *g, const auth_conn *c)
{
	const char *key = c->user;
	bool dropped;
	uv_mutex_lock(&g->mu);
	dropped = g->users_list_known && g->users_list_version >= c->auth_version &&
		  !(g->nusers &&
		    bsearch(&key, g->users, g->nusers, sizeof *g->users, cmp_str) != NULL);
	uv_mutex_unlock(&g->mu);
	return dropped;
}

void auth_gate_hello(auth_gate *g, const bson_t *cmd, bson_t *reply)
{
	bson_t arr, sp;
	if (g->spec_cmd == cmd && g->spec_payload[0]) {
		BSON_APPEND_DOCUMENT_BEGIN(reply, "speculativeAuthenticate", &sp);
		BSON_APPEND_INT32(&sp, "conversationId", 1);
		BSON_APPEND_BOOL(&sp, "done", false);
		BSON_APPEND_BINARY(&sp, "payload", BSON_SUBTYPE_BINARY,
				   (const uint8_t *)g->spec_payload,
				   (uint32_t)strlen(g->spec_payload));
		bson_append_document_end(reply, &sp);
		sdb_counter_inc(g->m_speculative);
	}
	g->spec_cmd = NULL;
	g->spec_payload[0] = '\0';
	if (!bson_has_field(cmd, "saslSupportedMechs"))
		return;
	/* the same answer for every user name: no user enumeration */
	BSON_APPEND_ARRAY_BEGIN(reply, "saslSupportedMechs", &arr);
	BSON_APPEND_UTF8(&arr, "0", "SCRAM-SHA-1");
	BSON_APPEND_UTF8(&arr, "1", "SCRAM-SHA-256");
	bson_append_array_end(reply, &arr);
}

/* ------------------------------------------------------------ brute-force limit */

/* Failures allowed per client host and window: a multiple of the per-user limit, so one
 * client host mistyping one password does not lock every user of that host out (a
 * shared NAT), while spraying many user names from one host is still bounded. */
#define AUTH_HOST_LIMIT_FACTOR 10

/* Count (hits 1) or check (hits 0: is any attempt left?) the failures of user (may be
 * NULL or empty) and of host through g->failures_cluster. May block: thread-pool threads
 * only. Returns true when under the limits; a counter that cannot answer lets attempts
 * through (the fixed delay still applies), as the quota path does. */
static bool failures_take(auth_gate *g, const char *user, const char *host, int64_t hits)
{
	char ukey[300], hkey[300], err[160];
	auth_failure_key k[2];
	size_t n = 0;
	bool under = true;

	if (user && user[0]) {
		snprintf(ukey, sizeof ukey, "user:%s", user);
		k[n++] = (auth_failure_key){ukey, g->failure_limit};
	}
	snprintf(hkey, sizeof hkey, "host:%s", host);
	k[n++] = (auth_failure_key){hkey, g->failure_limit * AUTH_HOST_LIMIT_FACTOR};
	if (g->failures_cluster(g->failures_ctx, k, n, hits, AUTH_FAILURE_WINDOW_MS, &under, err,
				sizeof err) != 0) {
		sdb_warn("auth failure count: the rate limiter did not answer", "err=\"%s\"", err);
		return true;
	}
	return under;
}

/* The local view, for hello's speculative path on the loop thread (never blocks): only
 * this gate's private counts (g->failures_local), so it can only refuse early; the
 * conversation's lookup on the thread pool asks the cluster (failures_take). True when
 * under the limit (always without a local counter); a counter error refuses. */
static bool limiter_take(auth_gate *g, const char *kind, const char *val, int64_t hits)
{
	char key[300], err[160];
	auth_failure_key k;
	bool under = false;

	if (!g->failures_local)
		return true;
	snprintf(key, sizeof key, "%s:%s", kind, val);
	k.key = key;
	k.limit = g->failure_limit * (strcmp(kind, "host") == 0 ? AUTH_HOST_LIMIT_FACTOR : 1);
	if (g->failures_local(g->failures_ctx, &k, 1, hits, AUTH_FAILURE_WINDOW_MS, &under, err,
			      sizeof err) != 0)
		return false;
	return under;
}

/* A failure counted on the thread pool (g->decide may block); the AuthenticationFailed
 * answer is sent after the count is in (and no sooner than the fixed delay), so a
 * client's next attempt, on any proxy, sees it. */
typedef struct fail_count {
	uv_work_t work;
	auth_gate *g;
	wire_req *req;
	char user[AUTH_SCRAM_MAX_USER + 1];
	char host[80];
	sdb_log_ctx log; /* the loop thread's log context, for the thread-pool thread */
} fail_count;

static void reply_failed_later(auth_gate *g, wire_req *req);

static void fail_count_work(uv_work_t *w)
{
	fail_count *f = w->data;
	sdb_log_set_thread_ctx(&f->log); /* a shared libuv pool thread: lines as the role's */
	failures_take(f->g, f->user, f->host, 1);
}

static void fail_count_done(uv_work_t *w, int status)
{
	fail_count *f = w->data;
	(void)status;
	reply_failed_later(f->g, f->req);
	free(f);
}

static void peer_host(const char *peer, char *host, size_t hostlen)
{
	const char *c = strrchr(peer, ':');
	size_t n = c ? (size_t)(c - peer) : strlen(peer);
	if (n >= hostlen)
		n = hostlen - 1;
	memcpy(host, peer, n);
	host[n] = '\0';
}

/* ------------------------------------------------------------ failures */

typedef struct delayed {
	uv_timer_t timer;
	wire_req *req;
} delayed;

static void on_delayed_closed(uv_handle_t *h)
{
	free(h->data);
}

static void on_delay(uv_timer_t *t)
{
	delayed *d = t->data;
	wire_req_error(d->req, WIRE_ERR_AUTH_FAILED, "Authentication failed.");
	uv_close((uv_handle_t *)&d->timer, on_delayed_closed);
}

/* Answer AuthenticationFailed fail_delay_ms after the request arrived; count the failure. */
static void auth_fail(auth_gate *g, wire_req *req, auth_conn *c, auth_audit_event ev,
		      const char *user, const char *why)
{
	wire_conn *conn = wire_req_conn(req);
	char host[80];

	fail_count *f = NULL;

	peer_host(wire_conn_peer(conn), host, sizeof host);
	if (ev == AUTH_AUDIT_AUTH_FAILED) {
		if (user && user[0])
			limiter_take(g, "user", user, 1);
		limiter_take(g, "host", host, 1);
		/* and in the cluster's limiter, shared by every proxy */
		if (g->loop && g->failures_cluster) {
			f = sdb_calloc(1, sizeof *f);
			f->g = g;
			f->req = req;
			f->work.data = f;
			snprintf(f->user, sizeof f->user, "%s", user ? user : "");
			snprintf(f->host, sizeof f->host, "%s", host);
		}
	}
	auth_audit(ev, user, NULL, wire_conn_peer(conn), why);
	if (c) {
		c->state = CONN_NONE;
		c->busy = false;
		c->is_system = false;
		c->recheck = false;
		auth_scram_init(&c->scram, AUTH_SCRAM_SHA256);
	}
	if (!g->loop) { /* internal listener: no delay */
		wire_req_error(req, WIRE_ERR_AUTH_FAILED, "Authentication failed.");
		return;
	}
	if (f != NULL) {
		sdb_log_get_thread(&f->log);
		if (uv_queue_work(g->loop, &f->work, fail_count_work, fail_count_done) == 0)
			return; /* answered by fail_count_done */
		free(f);
	}
	reply_failed_later(g, req);
}

/* AuthenticationFailed, fail_delay_ms after the request arrived (at once when that has
 * passed). Loop thread. */
static void reply_failed_later(auth_gate *g, wire_req *req)
{
	uint64_t elapsed_ms = (sdb_mono_ns() - wire_req_start_ns(req)) / 1000000;
	uint64_t wait = elapsed_ms < (uint64_t)g->fail_delay_ms
				? (uint64_t)g->fail_delay_ms - elapsed_ms
				: 0;
	delayed *d = sdb_calloc(1, sizeof *d);
	d->req = req;
	uv_timer_init(g->loop, &d->timer);
	d->timer.data = d;
	uv_timer_start(&d->timer, on_delay, wait, 0);
}

/* ------------------------------------------------------------ SASL */

static auth_conn *conn_state_get(wire_req *req)
{
	wire_conn *conn = wire_req_conn(req);
	auth_conn *c = wire_conn_data(conn);
	if (!c) {
		c = sdb_calloc(1, sizeof *c);
		wire_conn_set_data(conn, c, free);
	}
	return c;
}

/* auth_sasl_payload (gate.h): binary (drivers) or a string (mongosh tests). */
bool auth_sasl_payload(const bson_t *cmd, const uint8_t **data, uint32_t *len)
{
	bson_iter_t it;
	bson_subtype_t st;
	if (!bson_iter_init_find(&it, cmd, "payload"))
		return false;
	if (BSON_ITER_HOLDS_BINARY(&it)) {
		bson_iter_binary(&it, &st, len, data);
		return true;
	}
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		*data = (const uint8_t *)bson_iter_utf8(&it, len);
		return true;
	}
	return false;
}

static void reply_sasl(wire_req *req, const char *payload, bool done)
{
	bson_t *r = bson_new();
	BSON_APPEND_INT32(r, "conversationId", 1);
	BSON_APPEND_BOOL(r, "done", done);
	BSON_APPEND_BINARY(r, "payload", BSON_SUBTYPE_BINARY, (const uint8_t *)payload,
			   (uint32_t)strlen(payload));
	wire_req_reply(req, r);
}

/* A getUser on the thread pool: for saslStart (the verifier to start with), or with
 * recheck for the last step of a conversation started from the cache (is the verifier
 * still the one the proof was checked against? out then holds server-final). */
typedef struct lookup {
	uv_work_t work;
	auth_gate *g;
	wire_req *req;
	char user[AUTH_SCRAM_MAX_USER + 1];
	auth_mech mech;
	bool recheck;
	bool found;
	char tenant[256];
	auth_scram_creds creds;
	int64_t users_version;
	char out[AUTH_SCRAM_MAX_MSG + 1];
	char err[256];
	sdb_log_ctx log; /* the loop thread's log context, for the thread-pool thread */
	char host[80];  /* the client's host (brute-force key) */
	bool limited;   /* the cluster's limiter refuses more attempts of user or host */
} lookup;

static bool bin_field(bson_iter_t *d, const char *key, uint8_t *out, size_t cap, size_t *len)
{
	bson_iter_t f = *d;
	bson_subtype_t st;
	uint32_t l;
	const uint8_t *p;
	if (!bson_iter_find(&f, key) || !BSON_ITER_HOLDS_BINARY(&f))
		return false;
	bson_iter_binary(&f, &st, &l, &p);
	if (l > cap)
		return false;
	memcpy(out, p, l);
	*len = l;
	return true;
}

/* The verifier of mech in a getUser reply's user document: SCRAM-SHA-256 at the top
 * level, SCRAM-SHA-1 in scramSha1 (absent for users created before it was stored). */
static bool parse_creds(bson_iter_t *user, auth_mech mech, auth_scram_creds *c)
{
	bson_iter_t d = *user, f, sub;
	size_t kl = auth_scram_key_len(mech), n;
	if (mech == AUTH_SCRAM_SHA1) {
		if (!bson_iter_find(&d, "scramSha1") || !BSON_ITER_HOLDS_DOCUMENT(&d) ||
		    !bson_iter_recurse(&d, &sub))
			return false;
		d = sub;
	}
	c->mech = mech;
	f = d;
	if (bson_iter_find(&f, "iterations") && BSON_ITER_HOLDS_NUMBER(&f) &&
	    bson_iter_as_int64(&f) <= 10000000)
		c->iterations = (int)bson_iter_as_int64(&f);
	return c->iterations >= AUTH_SCRAM_MIN_ITERATIONS &&
	       bin_field(&d, "salt", c->salt, sizeof c->salt, &c->salt_len) && c->salt_len >= 16 &&
	       bin_field(&d, "storedKey", c->stored_key, kl, &n) && n == kl &&
	       bin_field(&d, "serverKey", c->server_key, kl, &n) && n == kl;
}

static void lookup_work(uv_work_t *w)
{
	lookup *l = w->data;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, d, f;
	int code = 0;

	sdb_log_set_thread_ctx(&l->log); /* a shared libuv pool thread: lines as the role's */

	l->limited = l->g->failures_cluster && !failures_take(l->g, l->user, l->host, 0);
	BSON_APPEND_UTF8(&cmd, "getUser", l->user);
	if (l->g->meta(l->g->meta_arg, &cmd, &reply, &code, l->err, sizeof l->err) == 0 &&
	    bson_iter_init_find(&it, &reply, "user") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &d)) {
		f = d;
		if (bson_iter_find(&f, "tenant") && BSON_ITER_HOLDS_UTF8(&f))
			snprintf(l->tenant, sizeof l->tenant, "%s", bson_iter_utf8(&f, NULL));
		l->found = l->tenant[0] && parse_creds(&d, l->mech, &l->creds);
		if (l->mech == AUTH_SCRAM_SHA1 && !l->found && !l->err[0])
			snprintf(l->err, sizeof l->err, "no SCRAM-SHA-1 verifier stored");
		if (bson_iter_init_find(&it, &reply, "usersVersion") && BSON_ITER_HOLDS_NUMBER(&it))
			l->users_version = bson_iter_as_int64(&it);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

static void conn_authenticated(auth_gate *g, wire_req *req, auth_conn *c, const char *out)
{
	c->state = CONN_AUTHENTICATED;
	c->recheck = false;
	c->is_system = strcmp(c->user, "__system") == 0 && g->has_cluster;
	sdb_info("authenticated", "user=\"%s\" tenant=\"%s\" mechanism=%s peer=%s", c->user,
		 c->tenant, auth_scram_mech_name(c->scram.mech), wire_conn_peer(wire_req_conn(req)));
	reply_sasl(req, out, true);
}

static bool same_creds(const auth_scram_creds *a, const auth_scram_creds *b)
{
	return a->mech == b->mech && a->iterations == b->iterations &&
	       a->salt_len == b->salt_len && memcmp(a->salt, b->salt, a->salt_len) == 0 &&
	       CRYPTO_memcmp(a->stored_key, b->stored_key, auth_scram_key_len(a->mech)) == 0 &&
	       CRYPTO_memcmp(a->server_key, b->server_key, auth_scram_key_len(a->mech)) == 0;
}

static void lookup_done(uv_work_t *w, int status)
{
	lookup *l = w->data;
	auth_gate *g = l->g;
	wire_req *req = l->req;
	auth_conn *c = wire_conn_data(wire_req_conn(req));
	uint8_t snonce[24];
	char out[AUTH_SCRAM_MAX_MSG + 1], err[256], host[80];

	peer_host(wire_conn_peer(wire_req_conn(req)), host, sizeof host);
	c->busy = false;
	if (status == 0 && l->found)
		see_users_version(g, l->users_version);
	if (l->limited) {
		auth_fail(g, req, c, AUTH_AUDIT_RATE_LIMITED, l->user,
			  "too many failed authentications");
	} else if (l->recheck) {
		/* the proof matched the cached verifier: is it still the user's? (a dropped
		 * user or a changed password fails here, whatever the cache held) */
		if (status != 0 || !l->found || strcmp(l->tenant, c->tenant) != 0 ||
		    !same_creds(&l->creds, &c->scram.creds))
			auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, l->user,
				  l->err[0] ? l->err : "user dropped or password changed");
		else {
			c->auth_version = l->users_version;
			conn_authenticated(g, req, c, l->out);
		}
	} else if (status != 0 || !l->found) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, l->user,
			  l->err[0] ? l->err : "unknown user");
	} else if (!limiter_take(g, "user", l->user, 0) || !limiter_take(g, "host", host, 0)) {
		auth_fail(g, req, c, AUTH_AUDIT_RATE_LIMITED, l->user,
			  "too many failed authentications");
	} else if (RAND_bytes(snonce, sizeof snonce) != 1 ||
		   auth_scram_server_first(&c->scram, &l->creds, snonce, sizeof snonce, out,
					   sizeof out, err, sizeof err) != 0) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, l->user, "server-first failed");
	} else {
		struct cached_user *u = NULL;
		for (size_t i = 0; i < AUTH_USER_CACHE && !u; i++)
			if (strcmp(g->cache[i].user, l->user) == 0 &&
			    g->cache[i].creds.mech == l->mech)
				u = &g->cache[i];
		if (!u)
			u = &g->cache[g->cache_next++ % AUTH_USER_CACHE];
		snprintf(u->user, sizeof u->user, "%s", l->user);
		snprintf(u->tenant, sizeof u->tenant, "%s", l->tenant);
		u->creds = l->creds;
		u->at_ns = sdb_mono_ns();
		u->users_version = l->users_version;
		c->auth_version = l->users_version;
		snprintf(c->tenant, sizeof c->tenant, "%s", l->tenant);
		reply_sasl(req, out, false);
	}
	OPENSSL_cleanse(&l->creds, sizeof l->creds);
	OPENSSL_cleanse(l->out, sizeof l->out);
	free(l);
}

/* Queue a getUser for the conversation of c (see struct lookup). Returns 0 or -1. */
static int lookup_start(auth_gate *g, wire_req *req, auth_conn *c, bool recheck, const char *out)
{
	lookup *l = sdb_calloc(1, sizeof *l);
	l->g = g;
	l->req = req;
	l->work.data = l;
	l->mech = c->scram.mech;
	l->recheck = recheck;
	if (out)
		snprintf(l->out, sizeof l->out, "%s", out);
	snprintf(l->user, sizeof l->user, "%s", c->scram.user);
	peer_host(wire_conn_peer(wire_req_conn(req)), l->host, sizeof l->host);
	c->busy = true;
	sdb_log_get_thread(&l->log);
	if (uv_queue_work(g->loop, &l->work, lookup_work, lookup_done) != 0) {
		OPENSSL_cleanse(l->out, sizeof l->out);
		free(l);
		c->busy = false;
		return -1;
	}
	return 0;
}

static void sasl_start(auth_gate *g, wire_req *req, auth_conn *c)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	const uint8_t *payload;
	uint32_t plen;
	auth_mech mech = 0;
	char err[256];

	if (bson_iter_init_find(&it, cmd, "mechanism") && BSON_ITER_HOLDS_UTF8(&it))
		mech = auth_scram_mech_parse(bson_iter_utf8(&it, NULL));
	if (c->busy) {
		wire_req_error(req, WIRE_ERR_PROTOCOL_ERROR, "saslStart: a conversation is in progress");
		return;
	}
	/* a new conversation drops any previous authentication of the connection */
	c->state = CONN_NONE;
	c->is_system = false;
	c->recheck = false;
	c->user[0] = c->tenant[0] = '\0';
	if (mech != AUTH_SCRAM_SHA256 && mech != AUTH_SCRAM_SHA1) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, NULL, "unsupported mechanism");
		return;
	}
	auth_scram_init(&c->scram, mech);
	if (!auth_sasl_payload(cmd, &payload, &plen) ||
	    auth_scram_client_first(&c->scram, payload, plen, err, sizeof err) != 0) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, NULL, "malformed client-first");
		return;
	}
	c->state = CONN_CONVERSING;
	snprintf(c->user, sizeof c->user, "%s", c->scram.user);
	if (g->has_cluster && strcmp(c->scram.user, "__system") == 0) {
		uint8_t snonce[24];
		char out[AUTH_SCRAM_MAX_MSG + 1];
		auth_scram_creds all[AUTH_GATE_CLUSTER_MAX];
		size_t n = cluster_creds(g, all);
		if (n == 0 || RAND_bytes(snonce, sizeof snonce) != 1 ||
		    auth_scram_server_first(&c->scram, &all[0], snonce, sizeof snonce, out,
					    sizeof out, err, sizeof err) != 0) {
			auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, c->user, "server-first failed");
			return;
		}
		reply_sasl(req, out, false);
		return;
	}
	if (!g->meta) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, c->user,
			  "only cluster members authenticate here");
		return;
	}
	if (lookup_start(g, req, c, false, NULL) != 0)
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, c->user, "cannot queue user lookup");
}

static void sasl_continue(auth_gate *g, wire_req *req, auth_conn *c)
{
	const uint8_t *payload;
	uint32_t plen;
	char out[AUTH_SCRAM_MAX_MSG + 1], err[256], user[AUTH_SCRAM_MAX_USER + 1];
	int rc;

	snprintf(user, sizeof user, "%s", c->user);
	if (c->state != CONN_CONVERSING || c->busy || c->scram.state != AUTH_SCRAM_SENT_FIRST) {
		if (c->state == CONN_AUTHENTICATED) { /* the optional empty last step */
			reply_sasl(req, "", true);
			return;
		}
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, user, "saslContinue without saslStart");
		return;
	}
	if (!auth_sasl_payload(wire_req_cmd(req), &payload, &plen)) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, user, "saslContinue without payload");
		return;
	}
	if (g->has_cluster && strcmp(c->scram.user, "__system") == 0)
		rc = cluster_final(g, &c->scram, payload, plen, out, sizeof out, err, sizeof err);
	else
		rc = auth_scram_client_final(&c->scram, payload, plen, out, sizeof out, err,
					     sizeof err);
	if (rc != 0) {
		auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, user, err);
		return;
	}
	if (c->recheck) {
		if (lookup_start(g, req, c, true, out) != 0)
			auth_fail(g, req, c, AUTH_AUDIT_AUTH_FAILED, user, "cannot queue user lookup");
		OPENSSL_cleanse(out, sizeof out);
		return;
	}
	conn_authenticated(g, req, c, out);
}

/* ------------------------------------------------------------ authorization */

typedef struct authz {
	const auth_policy *pol;
	const char *tenant;
	const char *db;
	bool ok;
	char *what;
	size_t whatlen;
	/* the command carries bypassDocumentValidation: true: its write targets also need
	 * MongoDB's bypassDocumentValidation action (dbAdmin/restore, not readWrite), which
	 * a tenant holds as the admin action */
	bool bypass;
} authz;

static void need(authz *a, const char *db, const char *coll, unsigned action)
{
	if (!a->ok)
		return;
	for (unsigned bit = 1; bit <= AUTH_ACT_ALL; bit <<= 1) {
		if (!(action & bit))
			continue;
		if (!auth_policy_allowed(a->pol, a->tenant, db, coll, bit)) {
			a->ok = false;
			snprintf(a->what, a->whatlen, "%s on %s%s%s", auth_action_name(bit), db,
				 coll ? "." : "", coll ? coll : "");
			return;
		}
	}
}

static void deny(authz *a, const char *why)
{
	if (a->ok) {
		a->ok = false;
		snprintf(a->what, a->whatlen, "%s", why);
	}
}

static const char *str_field(const bson_t *d, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

static bool bool_field(const bson_t *d, const char *key)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, d, key) && bson_iter_as_bool(&it);
}

/* A namespace given as "coll" or {db, coll}; the stage's action on it. */
static void need_target(authz *a, bson_iter_t *v, const char *coll_key, unsigned action)
{
	if (BSON_ITER_HOLDS_UTF8(v)) {
		need(a, a->db, bson_iter_utf8(v, NULL), action);
	} else if (BSON_ITER_HOLDS_DOCUMENT(v)) {
		bson_iter_t d;
		const char *db = a->db, *coll = NULL;
		if (!bson_iter_recurse(v, &d))
			return deny(a, "malformed namespace");
		while (bson_iter_next(&d)) {
			if (!BSON_ITER_HOLDS_UTF8(&d))
				continue;
			if (strcmp(bson_iter_key(&d), "db") == 0)
				db = bson_iter_utf8(&d, NULL);
			else if (strcmp(bson_iter_key(&d), coll_key) == 0)
				coll = bson_iter_utf8(&d, NULL);
		}
		if (!coll)
			return deny(a, "namespace without a collection");
		need(a, db, coll, action);
	} else {
		deny(a, "malformed namespace");
	}
}

static void walk_pipeline(authz *a, bson_iter_t *arr, int depth);

/* A $changeStream spec (at v) that asks for every database (allChangesForCluster: true,
 * or not a document): a cluster-wide view, not for tenants. A collection or database
 * stream needs only find on the command's namespace, as the aggregate itself (MongoDB's
 * changeStream action is part of read). */
static bool cs_cluster(const bson_iter_t *v)
{
	bson_iter_t f;
	if (!BSON_ITER_HOLDS_DOCUMENT(v) || !bson_iter_recurse(v, &f))
		return true;
	return bson_iter_find(&f, "allChangesForCluster") && bson_iter_as_bool(&f);
}

static void walk_sub_pipeline(authz *a, bson_iter_t *spec, int depth)
{
	bson_iter_t f, p;
	if (!BSON_ITER_HOLDS_DOCUMENT(spec) || !bson_iter_recurse(spec, &f))
		return;
	if (bson_iter_find(&f, "pipeline")) {
		if (!BSON_ITER_HOLDS_ARRAY(&f) || !bson_iter_recurse(&f, &p))
			return deny(a, "malformed pipeline");
		walk_pipeline(a, &p, depth + 1);
	}
}

/* Every namespace a pipeline touches (the stages that name another collection, and the
 * sub-pipelines of $lookup, $unionWith, $facet). */
static void walk_pipeline(authz *a, bson_iter_t *arr, int depth)
{
	if (depth > AUTH_MAX_PIPELINE_DEPTH)
		return deny(a, "pipeline nested too deeply");
	while (a->ok && bson_iter_next(arr)) {
		bson_iter_t st, v, f;
		const char *op;
		if (!BSON_ITER_HOLDS_DOCUMENT(arr) || !bson_iter_recurse(arr, &st) ||
		    !bson_iter_next(&st))
			return deny(a, "malformed pipeline stage");
		op = bson_iter_key(&st);
		v = st;
		if (strcmp(op, "$lookup") == 0 || strcmp(op, "$graphLookup") == 0) {
			if (bson_iter_recurse(&v, &f) && bson_iter_find(&f, "from"))
				need_target(a, &f, "coll", AUTH_ACT_FIND);
			walk_sub_pipeline(a, &v, depth);
		} else if (strcmp(op, "$unionWith") == 0) {
			if (BSON_ITER_HOLDS_UTF8(&v)) {
				need_target(a, &v, "coll", AUTH_ACT_FIND);
			} else {
				if (bson_iter_recurse(&v, &f) && bson_iter_find(&f, "coll"))
					need_target(a, &f, "coll", AUTH_ACT_FIND);
				walk_sub_pipeline(a, &v, depth);
			}
		} else if (strcmp(op, "$out") == 0) {
			need_target(a, &v, "coll",
				    AUTH_ACT_INSERT | AUTH_ACT_REMOVE | (a->bypass ? AUTH_ACT_ADMIN : 0));
		} else if (strcmp(op, "$merge") == 0) {
			unsigned mact = AUTH_ACT_INSERT | AUTH_ACT_UPDATE |
					(a->bypass ? AUTH_ACT_ADMIN : 0);
			if (BSON_ITER_HOLDS_UTF8(&v))
				need_target(a, &v, "coll", mact);
			else if (bson_iter_recurse(&v, &f) && bson_iter_find(&f, "into"))
				need_target(a, &f, "coll", mact);
			else
				deny(a, "$merge without into");
		} else if (strcmp(op, "$facet") == 0) {
			bson_iter_t fa, p;
			if (!BSON_ITER_HOLDS_DOCUMENT(&v) || !bson_iter_recurse(&v, &fa))
				return deny(a, "malformed $facet");
			while (bson_iter_next(&fa)) {
				if (!BSON_ITER_HOLDS_ARRAY(&fa) || !bson_iter_recurse(&fa, &p))
					return deny(a, "malformed $facet");
				walk_pipeline(a, &p, depth + 1);
			}
		} else if (strcmp(op, "$currentOp") == 0 || strcmp(op, "$listLocalSessions") == 0 ||
			   strcmp(op, "$listSessions") == 0 || strcmp(op, "$planCacheStats") == 0 ||
			   strcmp(op, "$indexStats") == 0 ||
			   (strcmp(op, "$changeStream") == 0 && (depth > 0 || cs_cluster(&v))) ||
			   strcmp(op, "$listSearchIndexes") == 0) {
			/* cluster-wide or cross-tenant views: not for tenants */
			char why[64];
			snprintf(why, sizeof why, "stage %s", op);
			deny(a, why);
		}
	}
}

static void need_pipeline_field(authz *a, const bson_t *cmd)
{
	bson_iter_t it, p;
	if (!bson_iter_init_find(&it, cmd, "pipeline"))
		return;
	if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &p))
		return deny(a, "malformed pipeline");
	walk_pipeline(a, &p, 0);
}

/* Any element of array `key` with a true `field` (updates[].upsert)? */
static bool any_true(const bson_t *cmd, const char *key, const char *field)
{
	bson_iter_t it, arr, d;
	if (!bson_iter_init_find(&it, cmd, key) || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return false;
	while (bson_iter_next(&arr))
		if (BSON_ITER_HOLDS_DOCUMENT(&arr) && bson_iter_recurse(&arr, &d) &&
		    bson_iter_find(&d, field) && bson_iter_as_bool(&d))
			return true;
	return false;
}

/* Commands any authenticated tenant may run (no namespace). */
static const char *const open_cmds[] = {"hello", "isMaster", "ismaster", "ping", "buildInfo",
					"buildinfo", "whatsmyuri", "connectionStatus",
					"endSessions", "saslStart", "saslContinue", NULL};

/* Commands on the collection named by their first value, and the actions they need. */
static const struct {
	const char *name;
	unsigned action;
} coll_cmds[] = {
	{"find", AUTH_ACT_FIND},          {"count", AUTH_ACT_FIND},
	{"distinct", AUTH_ACT_FIND},      {"listIndexes", AUTH_ACT_FIND},
	{"killCursors", AUTH_ACT_FIND},   {"insert", AUTH_ACT_INSERT},
	{"update", AUTH_ACT_UPDATE},      {"delete", AUTH_ACT_REMOVE},
	{"createIndexes", AUTH_ACT_CREATE_INDEX}, {"dropIndexes", AUTH_ACT_CREATE_INDEX},
	{"deleteIndexes", AUTH_ACT_CREATE_INDEX},
	{"drop", AUTH_ACT_ADMIN},         {"collMod", AUTH_ACT_ADMIN},
	{"create", AUTH_ACT_ADMIN},       {"findAndModify", AUTH_ACT_FIND},
	{"findandmodify", AUTH_ACT_FIND}, {"aggregate", AUTH_ACT_FIND},
	{"collStats", AUTH_ACT_FIND},     {"collstats", AUTH_ACT_FIND},
	{"validate", AUTH_ACT_ADMIN}, /* MongoDB's validate action: dbAdmin */
};

/* Commands explain may wrap (the proxy's explainable commands); explain needs the rights
 * of the command it explains. */
static const char *const explain_cmds[] = {"find",     "count",  "distinct",
					   "aggregate", "update", "delete",
					   "findAndModify", "findandmodify", NULL};

bool auth_gate_authorize(const auth_policy *pol, const char *tenant, const char *name,
			 const char *db, const bson_t *cmd, char *what, size_t whatlen)
{
	authz a = {pol, tenant, db, true, what, whatlen, false};
	bson_iter_t it;
	size_t i;

	what[0] = '\0';
	for (i = 0; open_cmds[i]; i++)
		if (strcmp(name, open_cmds[i]) == 0)
			return true;
	if (!db || !db[0] || !tenant)
		return false;
	/* issue #20: a tenant has neither MongoDB's inprog nor killop action, but, as any
	 * MongoDB user, may list its own operations (currentOp {$ownOps: true}) and kill one
	 * of them (killOp of a number: the proxy checks it is the tenant's, else 13) */
	if (strcmp(name, "currentOp") == 0 && bool_field(cmd, "$ownOps"))
		return true;
	if (strcmp(name, "killOp") == 0) {
		if (bson_iter_init_find(&it, cmd, "op") &&
		    (BSON_ITER_HOLDS_NUMBER(&it) || BSON_ITER_HOLDS_DECIMAL128(&it)))
			return true;
		snprintf(what, whatlen, "killOp of another than its own operations");
		return false;
	}
	if (strcmp(name, "getMore") == 0) {
		need(&a, db, str_field(cmd, "collection") ? str_field(cmd, "collection") : "",
		     AUTH_ACT_FIND);
		return a.ok;
	}
	if (strcmp(name, "listCollections") == 0) {
		need(&a, db, NULL, AUTH_ACT_FIND);
		return a.ok;
	}
	if (strcmp(name, "appendOplogNote") == 0) {
		/* mongod: the appendOplogNote cluster action (clusterManager), never a
		 * reader's: the admin action on the admin database, which no tenant owns */
		need(&a, "admin", NULL, AUTH_ACT_ADMIN);
		return a.ok;
	}
	if (strcmp(name, "dropDatabase") == 0) {
		need(&a, db, NULL, AUTH_ACT_ADMIN);
		return a.ok;
	}
	if (strcmp(name, "dbStats") == 0 || strcmp(name, "dbstats") == 0) {
		need(&a, db, NULL, AUTH_ACT_FIND);
		return a.ok;
	}
	if (strcmp(name, "explain") == 0) {
		bson_t inner;
		uint32_t len;
		const uint8_t *data;
		snprintf(what, whatlen, "explain needs a command document");
		if (!bson_iter_init_find(&it, cmd, "explain") || !BSON_ITER_HOLDS_DOCUMENT(&it))
			return false;
		bson_iter_document(&it, &len, &data);
		if (!bson_init_static(&inner, data, len) || !bson_iter_init(&it, &inner) ||
		    !bson_iter_next(&it))
			return false;
		for (i = 0; explain_cmds[i]; i++)
			if (strcmp(bson_iter_key(&it), explain_cmds[i]) == 0)
				return auth_gate_authorize(pol, tenant, explain_cmds[i], db, &inner,
							   what, whatlen);
		snprintf(what, whatlen, "explain of %s", bson_iter_key(&it));
		return false;
	}
	if (strcmp(name, "renameCollection") == 0) {
		/* sent to admin but about the two namespaces it names: the admin action on
		 * both, as drop and create (MongoDB's checkAuthForRenameCollectionCommand asks
		 * renameCollectionSameDB, or across databases find + dropCollection on the source
		 * and insert + createIndex + createCollection on the target) */
		const char *from = str_field(cmd, "renameCollection"), *to = str_field(cmd, "to");
		const char *fdot = from ? strchr(from, '.') : NULL, *tdot = to ? strchr(to, '.') : NULL;
		char fdb[128], tdb[128];
		if (!fdot || !tdot || (size_t)(fdot - from) >= sizeof fdb ||
		    (size_t)(tdot - to) >= sizeof tdb) {
			snprintf(what, whatlen, "renameCollection needs two namespaces db.coll");
			return false;
		}
		snprintf(fdb, sizeof fdb, "%.*s", (int)(fdot - from), from);
		snprintf(tdb, sizeof tdb, "%.*s", (int)(tdot - to), to);
		need(&a, fdb, fdot + 1, AUTH_ACT_ADMIN);
		need(&a, tdb, tdot + 1, AUTH_ACT_ADMIN);
		if (strcmp(fdb, tdb) != 0) {
			need(&a, fdb, fdot + 1, AUTH_ACT_FIND);
			need(&a, tdb, tdot + 1, AUTH_ACT_INSERT | AUTH_ACT_CREATE_INDEX);
		}
		return a.ok;
	}
	for (i = 0; i < sizeof coll_cmds / sizeof coll_cmds[0]; i++) {
		unsigned act = coll_cmds[i].action;
		const char *coll = NULL;
		if (strcmp(name, coll_cmds[i].name) != 0)
			continue;
		if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
			return false;
		if (BSON_ITER_HOLDS_UTF8(&it))
			coll = bson_iter_utf8(&it, NULL);
		else if (strcmp(name, "aggregate") != 0 || !BSON_ITER_HOLDS_NUMBER(&it)) {
			snprintf(what, whatlen, "%s needs a collection name", name);
			return false;
		}
		if (strncmp(name, "findAndModify", 13) == 0 || strcmp(name, "findandmodify") == 0) {
			act |= bool_field(cmd, "remove") ? AUTH_ACT_REMOVE : AUTH_ACT_UPDATE;
			if (bool_field(cmd, "upsert"))
				act |= AUTH_ACT_INSERT;
		}
		if (strcmp(name, "update") == 0 && any_true(cmd, "updates", "upsert"))
			act |= AUTH_ACT_INSERT;
		/* MongoDB: bypassDocumentValidation: true (truthy) needs the
		 * bypassDocumentValidation action (auth/authorization_checks.cpp,
		 * checkAuthForInsert/Update/FindAndModify, and for aggregate on the $out/$merge
		 * target), else 13 Unauthorized; the tenant's equivalent is the admin action */
		if (bool_field(cmd, "bypassDocumentValidation")) {
			if (strcmp(name, "aggregate") == 0)
				a.bypass = true;
			else if (strcmp(name, "insert") == 0 || strcmp(name, "update") == 0 ||
				 strncmp(name, "findAndModify", 13) == 0 ||
				 strcmp(name, "findandmodify") == 0)
				act |= AUTH_ACT_ADMIN;
		}
		need(&a, db, coll, act); /* coll NULL: aggregate: 1 needs the database */
		if (strcmp(name, "aggregate") == 0) {
			need_pipeline_field(&a, cmd);
		} else if (strcmp(name, "create") == 0) {
			const char *on = str_field(cmd, "viewOn");
			if (on)
				need(&a, db, on, AUTH_ACT_FIND);
			need_pipeline_field(&a, cmd);
		}
		return a.ok;
	}
	snprintf(what, whatlen, "command %s", name);
	return false; /* deny by default: a command without a rule here is refused */
}

static void add_db_cb(void *arg, const char *db)
{
	bson_t *arr = arg;
	char k[16];
	bson_t d;
	snprintf(k, sizeof k, "%u", bson_count_keys(arr));
	bson_append_document_begin(arr, k, -1, &d);
	BSON_APPEND_UTF8(&d, "name", db);
	BSON_APPEND_INT64(&d, "sizeOnDisk", 0);
	BSON_APPEND_BOOL(&d, "empty", false);
	bson_append_document_end(arr, &d);
}

/* listDatabases for a tenant: its databases only (from the same table as the checks). */
static void list_databases(auth_gate *g, wire_req *req, auth_conn *c)
{
	bson_t *r = bson_new(), arr;
	BSON_APPEND_ARRAY_BEGIN(r, "databases", &arr);
	uv_mutex_lock(&g->mu);
	auth_policy_each_db(g->pol, c->tenant, add_db_cb, &arr);
	uv_mutex_unlock(&g->mu);
	bson_append_array_end(r, &arr);
	BSON_APPEND_INT64(r, "totalSize", 0);
	wire_req_reply(req, r);
}

/* hello with speculativeAuthenticate: {saslStart: 1, mechanism, payload, db}. When the
 * user's verifier is cached (a saslStart looked it up less than 10 s ago) the conversation
 * starts here and the hello hook returns server-first in the same reply; otherwise
 * nothing happens and the driver runs saslStart (the specification's fallback). */
static void speculative(auth_gate *g, wire_req *req, auth_conn *c)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	bson_t spec;
	uint32_t len;
	const uint8_t *data, *payload;
	uint32_t plen;
	auth_scram s;
	auth_mech mech;
	uint8_t snonce[24];
	char err[256], host[80];
	uint64_t now = sdb_mono_ns();
	int64_t version = atomic_load(&g->users_version);

	g->spec_cmd = NULL;
	if (!g->meta || c->busy || bson_has_field(cmd, "topologyVersion") ||
	    !bson_iter_init_find(&it, cmd, "speculativeAuthenticate") ||
	    !BSON_ITER_HOLDS_DOCUMENT(&it))
		return;
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&spec, data, len) || !bson_iter_init_find(&it, &spec, "mechanism") ||
	    !BSON_ITER_HOLDS_UTF8(&it) ||
	    !(mech = auth_scram_mech_parse(bson_iter_utf8(&it, NULL))) ||
	    !auth_sasl_payload(&spec, &payload, &plen))
		return;
	auth_scram_init(&s, mech);
	if (auth_scram_client_first(&s, payload, plen, err, sizeof err) != 0)
		return;
	peer_host(wire_conn_peer(wire_req_conn(req)), host, sizeof host);
	if (!limiter_take(g, "user", s.user, 0) || !limiter_take(g, "host", host, 0))
		return; /* saslStart will answer (and audit) the refusal */
	for (size_t i = 0; i < AUTH_USER_CACHE; i++) {
		struct cached_user *u = &g->cache[i];
		if (!u->user[0] || strcmp(u->user, s.user) != 0 || u->creds.mech != mech ||
		    u->users_version != version || now - u->at_ns > AUTH_USER_CACHE_TTL_NS)
			continue;
		if (RAND_bytes(snonce, sizeof snonce) != 1 ||
		    auth_scram_server_first(&s, &u->creds, snonce, sizeof snonce, g->spec_payload,
					    sizeof g->spec_payload, err, sizeof err) != 0) {
			g->spec_payload[0] = '\0';
			return;
		}
		c->scram = s;
		c->state = CONN_CONVERSING;
		c->is_system = false;
		c->recheck = true;
		snprintf(c->user, sizeof c->user, "%s", s.user);
		snprintf(c->tenant, sizeof c->tenant, "%s", u->tenant);
		g->spec_cmd = cmd;
		return;
	}
}

const char *auth_gate_conn_user(const wire_conn *conn)
{
	const auth_conn *c = conn ? wire_conn_data(conn) : NULL;
	return c && c->state == CONN_AUTHENTICATED && c->user[0] ? c->user : NULL;
}

void auth_gate_append_effective_users(const wire_conn *conn, bson_t *op)
{
	const char *u = auth_gate_conn_user(conn);
	bson_t arr, d;

	if (!u)
		return;
	BSON_APPEND_ARRAY_BEGIN(op, "effectiveUsers", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &d);
	BSON_APPEND_UTF8(&d, "user", u);
	BSON_APPEND_UTF8(&d, "db", strcmp(u, "__system") == 0 ? "local" : "admin");
	bson_append_document_end(&arr, &d);
	bson_append_array_end(op, &arr);
}

bool auth_gate_check(auth_gate *g, wire_req *req)
{
	const char *name = wire_req_name(req);
	auth_conn *c = conn_state_get(req);
	char what[300];
	bool ok;

	if (strcmp(name, "saslStart") == 0) {
		sasl_start(g, req, c);
		return false;
	}
	if (strcmp(name, "saslContinue") == 0) {
		sasl_continue(g, req, c);
		return false;
	}
	if (strcmp(name, "hello") == 0 || strcmp(name, "isMaster") == 0 ||
	    strcmp(name, "ismaster") == 0) {
		speculative(g, req, c);
		return true;
	}
	if (strcmp(name, "ping") == 0)
		return true;
	if (c->state != CONN_AUTHENTICATED) {
		auth_audit(AUTH_AUDIT_UNAUTHENTICATED, NULL, NULL, wire_conn_peer(wire_req_conn(req)),
			   name);
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED, "command %s requires authentication",
			       name);
		return false;
	}
	if (c->is_system)
		return true;
	if (user_dropped(g, c)) {
		auth_audit(AUTH_AUDIT_UNAUTHENTICATED, c->user, c->tenant,
			   wire_conn_peer(wire_req_conn(req)), "user dropped: logged out");
		c->state = CONN_NONE;
		c->user[0] = c->tenant[0] = '\0';
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED, "command %s requires authentication",
			       name);
		return false;
	}
	if (strcmp(name, "listDatabases") == 0) {
		list_databases(g, req, c);
		return false;
	}
	uv_mutex_lock(&g->mu);
	ok = auth_gate_authorize(g->pol, c->tenant, name, wire_req_db(req), wire_req_cmd(req),
				 what, sizeof what);
	uv_mutex_unlock(&g->mu);
	if (ok)
		return true;
	{
		/* the command and the refused action: "drop: admin on bdb.secret" */
		char line[600];
		snprintf(line, sizeof line, "%s: %s", name, what);
		auth_audit(AUTH_AUDIT_DENIED, c->user, c->tenant, wire_conn_peer(wire_req_conn(req)),
			   line);
	}
	wire_req_error(req, WIRE_ERR_UNAUTHORIZED, "not authorized on %s to execute command %s",
		       wire_req_db(req), name);
	return false;
}
