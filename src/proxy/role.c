/* The proxy role: what applications connect to, as to a mongos (issue #6, DESIGN.md §5).
 *
 * Threads: the wire server runs on the role's loop; every command is handed to a worker
 * thread (proxy/shardconn.h), which routes, talks to shards with libmongoc (blocking) and
 * completes the request with wire_req_reply (thread-safe). A refresh thread long-polls the
 * metadata service (waitRoutingVersion) and reloads the cached routing tables whenever the
 * routing version moves; workers also reload a table on demand after a StaleConfig.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/role.h"
#include "auth/cluster.h"
#include "auth/gate.h"
#include "auth/raftsec.h"
#include "tls/tls.h"
#include "proxy/cswait.h"
#include "proxy/forwarder.h"
#include "proxy/proxy.h"
#include "proxy/txnroute.h"

#define PROXY_REAP_EVERY_MS 1000

/* ---------- lifecycle ---------- */

static void reap_job(void *arg)
{
	proxy_cursor_reap(arg, false);
}

static void on_reap_timer(uv_timer_t *t)
{
	proxy *p = t->data;

	shardconn_submit(p->sc, reap_job, p);
}

/* /healthz: ready once the shard list and quotas were read from metadata once. */
static int health(void *data, char *msg, size_t msglen)
{
	proxy *p = data;
	bool ready;

	uv_mutex_lock(&p->mu);
	ready = p->ready;
	uv_mutex_unlock(&p->mu);
	if (!ready)
		snprintf(msg, msglen, "proxy: metadata not reached yet");
	return ready ? 1 : 0;
}

static void hello_hook(void *data, const bson_t *cmd, bson_t *reply)
{
	proxy *p = data;
	/* msg: "isdbgrid" comes from is_mongos */
	if (p->auth) /* issue #10: saslSupportedMechs */
		auth_gate_hello(p->auth, cmd, reply);
}

/* ---- issue #10: authentication and authorization hook (src/auth/gate.h) ---- */
static int auth_meta(void *arg, const bson_t *cmd, bson_t *reply, int *code, char *err,
		     size_t errlen)
{
	return proxy_meta_command(arg, cmd, reply, code, err, errlen);
}

static bool auth_gate_hook(wire_req *req, void *data)
{
	return auth_gate_check(((proxy *)data)->auth, req);
}

/* connectionStatus with authentication on: authInfo.authenticatedUsers names the user
 * the connection authenticated as ({user, db: "admin"}, MongoDB's shape; roles are not a
 * stripedb concept: tenants are, so authenticatedUserRoles stays empty). Loop thread. */
static void h_connection_status(wire_req *req, void *data)
{
	const char *user = auth_gate_conn_user(wire_req_conn(req));
	bson_t *reply = bson_new();
	bson_t auth, arr, u;
	bson_iter_t it;

	(void)data;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "authInfo", &auth);
	BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUsers", &arr);
	if (user) {
		BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &u);
		BSON_APPEND_UTF8(&u, "user", user);
		BSON_APPEND_UTF8(&u, "db", "admin");
		bson_append_document_end(&arr, &u);
	}
	bson_append_array_end(&auth, &arr);
	BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUserRoles", &arr);
	bson_append_array_end(&auth, &arr);
	if (bson_iter_init_find(&it, wire_req_cmd(req), "showPrivileges") &&
	    bson_iter_as_bool(&it)) {
		BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUserPrivileges", &arr);
		bson_append_array_end(&auth, &arr);
	}
	bson_append_document_end(reply, &auth);
	wire_req_reply(req, reply);
}

/* --tls-*: TLS of the client listener (tls/tls.h); --auth=enabled|disabled: create the
 * gate (p->auth) or leave it NULL. */
static int auth_setup(sdb_role *role, proxy *p)
{
	const char *mode = sdb_config_get(role->cfg, SDB_OPT_auth);
	auth_gate_opts ao;

	/* --raft-tls is bad usage in every role (auth/raftsec.h) */
	int rc = auth_raft_check_mode(role->cfg, role->err, sizeof role->err);

	if (rc == 0)
		rc = tls_setup(role->cfg, "proxy", TLS_CLIENTS_APPLICATIONS, role->err, sizeof role->err);

	if (rc != 0)
		return rc;
	/* auto (the default): on in a keyed cluster, as MongoDB's keyFile implies
	 * authorization; a key with --auth=disabled is an explicit choice */
	if (mode == NULL || strcmp(mode, "auto") == 0)
		mode = sdb_config_get(role->cfg, SDB_OPT_cluster_key_file) ? "enabled" : "disabled";
	if (strcmp(mode, "disabled") == 0) {
		if (sdb_config_get(role->cfg, SDB_OPT_cluster_key_file))
			sdb_warn("proxy: --auth=disabled in a keyed cluster: every client may use "
				 "every tenant's data",
				 NULL);
		return 0;
	}
	if (strcmp(mode, "enabled") != 0)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"proxy: --auth must be auto, enabled or disabled, not '%s'", mode);
	memset(&ao, 0, sizeof ao);
	ao.loop = role->loop;
	ao.meta = auth_meta;
	ao.meta_arg = p;
	ao.failure_limit = sdb_config_get_int(role->cfg, SDB_OPT_auth_failure_limit, 10);
	/* failures counted on the peer ring: one count per user and host for every proxy;
	 * the gate's own view on a limiter private to it (proxy/quota.h) */
	ao.failures_local = proxy_quota_auth_local;
	ao.failures_cluster = proxy_quota_auth_cluster;
	ao.failures_ctx = p->quota;
	p->auth = auth_gate_new(&ao);
	sdb_info("proxy authentication enabled", "mechanisms=%s failure_limit=%lld",
		 "SCRAM-SHA-1,SCRAM-SHA-256", (long long)ao.failure_limit);
	return 0;
}
/* ---- end of issue #10 hook ---- */

/* "host:port" for config.mongos: listen's host ("H:P" or "[V6]:P"; the machine's host
 * name for an empty or wildcard host) and the bound port. Heap string. */
static char *advertise_of(const char *listen, int port)
{
	char host[256] = "";
	const char *colon = strrchr(listen, ':');
	size_t n = colon ? (size_t)(colon - listen) : strlen(listen);
	char *out;

	if (n >= sizeof host)
		n = sizeof host - 1;
	memcpy(host, listen, n);
	host[n] = '\0';
	if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 ||
	    strcmp(host, "::") == 0) {
		if (gethostname(host, sizeof host) != 0)
			snprintf(host, sizeof host, "localhost");
		host[sizeof host - 1] = '\0';
	}
	out = sdb_malloc(strlen(host) + 16);
	snprintf(out, strlen(host) + 16, "%s:%d", host, port);
	return out;
}

static const sdb_metric_def proxy_metrics[] = {
	SDB_METRIC_COUNTER(proxy, m_stale_retries, "stripedb_proxy_stale_retries_total",
			   "Requests retried after StaleConfig."),
	SDB_METRIC_COUNTER(proxy, m_shard_retries,
		"stripedb_proxy_shard_retries_total",
		"Shard commands re-sent because the shard had not executed them (restarting, no "
		"primary) or, for reads and retryable writes, the outcome was unknown."),
	SDB_METRIC_COUNTER_L(proxy, m_scatter, "stripedb_proxy_routed_total",
			     "Requests routed, by kind.", "kind=\"scatter\""),
	SDB_METRIC_COUNTER_L(proxy, m_targeted, "stripedb_proxy_routed_total",
			     "Requests routed, by kind.", "kind=\"targeted\""),
	SDB_METRIC_COUNTER(proxy, m_refreshes, "stripedb_proxy_routing_fetches_total",
			   "Routing tables fetched from metadata."),
	SDB_METRIC_COUNTER(proxy, m_routing_bytes, "stripedb_proxy_routing_bytes_total",
			   "Bytes of getRoutingTable replies received (full loads and diffs)."),
	SDB_METRIC_GAUGE(proxy, m_routing_chunks, "stripedb_proxy_routing_chunks",
			 "Chunks held in the routing cache."),
	SDB_METRIC_GAUGE(proxy, m_routing_version, "stripedb_proxy_routing_version",
			 "Routing version every cached table is up to date with (long poll)."),
	SDB_METRIC_HISTOGRAM(proxy, m_refresh_time, "stripedb_proxy_routing_refresh_seconds",
			     "Time to apply one routing change notified by the long poll."),
	SDB_METRIC_COUNTER(proxy, m_rejected, "stripedb_proxy_quota_rejected_total",
			   "Requests refused by quota."),
	SDB_METRIC_GAUGE(proxy, m_ring_ready, "stripedb_proxy_quota_ring_ready",
			 "1 once every rate-limit peer answered this proxy."),
	SDB_METRIC_GAUGE(proxy, m_cursors, "stripedb_proxy_cursors_open",
			 "Proxy cursors open (merged cursors kept for getMore)."),
};

/* wire_server_opts.gone (loop thread): a watched request's client closed its connection; a
 * parked change stream getMore is handed back to a worker, which drops it (cswait.h). */
static void proxy_req_gone(wire_req *req, void *role_data)
{
	proxy *p = role_data;

	if (p->csw != NULL)
		px_cswait_wake_req(p->csw, req);
}

static int proxy_start(sdb_role *role)
{
	proxy *p = sdb_calloc(1, sizeof *p);
	const char *listen = sdb_config_get(role->cfg, SDB_OPT_listen);
	const char *meta = sdb_config_get(role->cfg, SDB_OPT_metadata);
	wire_server_opts o;
	int rc;

	if (listen == NULL) {
		free(p);
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE, "proxy: --listen is required");
	}
	if (meta == NULL) {
		free(p);
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"proxy: --metadata=HOST:PORT,... is required");
	}
	p->loop = role->loop;
	p->stale_retry_ms = sdb_config_get_int(role->cfg, SDB_OPT_stale_retry_ms, 5000);
	p->cursor_timeout_ms = sdb_config_get_int(role->cfg, SDB_OPT_cursor_timeout_ms, 600000);
	p->known_version = -1;
	uv_mutex_init(&p->mu);
	uv_cond_init(&p->cv);
	uv_mutex_init(&p->cmu);
	p->rc = route_cache_new();
	p->txns = pxtxn_table_new();
	p->sc = shardconn_new();
	p->csw = px_cswait_new(p);
	/* issue #10: the cluster key before any pool to shards or metadata is made */
	rc = auth_cluster_setup(role->cfg, role->err, sizeof role->err);
	if (rc != 0)
		goto err;
	if (shardconn_set_metadata(p->sc, meta, role->err, sizeof role->err) != 0) {
		rc = SDB_EUSAGE;
		goto err;
	}
	rc = proxy_quota_new(role, &p->quota, role->err, sizeof role->err);
	if (rc != 0)
		goto err;
	rc = auth_setup(role, p);
	if (rc != 0)
		goto err;
	SDB_METRICS_REGISTER(p, proxy_metrics, NULL);
	memset(&o, 0, sizeof o);
	o.listen = listen;
	o.role = "proxy";
	o.max_connections = (int)sdb_config_get_int(role->cfg, SDB_OPT_max_connections, 10000);
	o.role_data = p;
	o.hello = hello_hook;
	o.ct_in = proxy_ct_in; /* issue #20: cluster-time gossip (clustertime.c) */
	o.gone = proxy_req_gone; /* a parked getMore's client closed (cswait.h) */
	o.ct_out = proxy_ct_out;
	o.is_mongos = true;
	/* configureFailPoint failCommand (issue #16): wire/failpoint.c */
	o.test_commands = sdb_config_get_bool(role->cfg, SDB_OPT_enable_test_commands, 0) != 0;
	o.quiesce_ms = (uint64_t)sdb_config_get_int(role->cfg, SDB_OPT_shutdown_quiesce_ms, 0);
	if (p->auth)
		o.gate = auth_gate_hook;
	o.tls = tls_listener_get("proxy"); /* issue #10: NULL when not set up */
	rc = wire_server_new(role->loop, &o, &p->srv, role->err, sizeof role->err);
	if (rc != 0)
		goto err;
	p->fw = px_forwarder_new(p); /* issue #19: point reads and small writes on the loop */
	proxy_exec_register(p);
	if (p->auth)
		wire_server_register(p->srv, "connectionStatus", h_connection_status);
	p->advertise = advertise_of(listen, wire_server_port(p->srv));
	p->started_ms = sdb_wall_ms();
	if (sdb_uv_thread_create(&p->refresher, proxy_catalog_refresher, p) != 0) {
		rc = sdb_errf(role->err, sizeof role->err, SDB_EIO, "proxy: cannot start a thread");
		goto err_srv;
	}
	if (role->http)
		sdb_http_add_health(role->http, "proxy", health, p);
	uv_timer_init(role->loop, &p->reap_timer);
	p->reap_timer.data = p;
	uv_timer_start(&p->reap_timer, on_reap_timer, PROXY_REAP_EVERY_MS, PROXY_REAP_EVERY_MS);
	role->impl = p;
	sdb_info("proxy listening", "addr=%s port=%d metadata=%s", listen,
		 wire_server_port(p->srv), meta);
	return 0;
err_srv:
	px_forwarder_stop(p->fw);
	px_forwarder_free(p->fw);
	wire_server_close(p->srv, 0, NULL, NULL);
err:
	px_cswait_free(p->csw);
	auth_gate_free(p->auth);
	proxy_quota_free(p->quota);
	shardconn_free(p->sc); /* and its metadata pool */
	route_cache_free(p->rc);
	pxtxn_table_free(p->txns);
	free(p->advertise);
	uv_mutex_destroy(&p->cmu);
	uv_cond_destroy(&p->cv);
	uv_mutex_destroy(&p->mu);
	free(p);
	return rc;
}

static void on_timer_closed(uv_handle_t *h)
{
	sdb_role *role = h->data;
	proxy *p = role->impl;

	uv_mutex_lock(&p->mu);
	p->stopping = true;
	uv_cond_broadcast(&p->cv);
	uv_mutex_unlock(&p->mu);
	uv_thread_join(&p->refresher);
	px_cswait_free(p->csw); /* its watchers call shards */
	p->csw = NULL;
	proxy_cursor_reap(p, true);
	px_forwarder_free(p->fw); /* stopped in proxy_stop */
	p->fw = NULL;
	shardconn_free(p->sc); /* runs queued jobs first, joins the workers */
	p->sc = NULL; /* the metadata pool went with it */
	proxy_quota_free(p->quota);
	auth_gate_free(p->auth);
	route_cache_free(p->rc);
	pxtxn_table_free(p->txns);
	free(p->primary);
	free(p->advertise);
	if (p->db_primaries)
		bson_destroy(p->db_primaries);
	if (p->db_checked)
		bson_destroy(p->db_checked);
	uv_mutex_destroy(&p->cmu);
	uv_cond_destroy(&p->cv);
	uv_mutex_destroy(&p->mu);
	free(p);
	role->impl = NULL;
	sdb_role_stopped(role);
}

static void on_server_closed(void *arg)
{
	sdb_role *role = arg;
	proxy *p = role->impl;

	p->reap_timer.data = role;
	uv_close((uv_handle_t *)&p->reap_timer, on_timer_closed);
}

static void proxy_stop(sdb_role *role)
{
	proxy *p = role->impl;

	uv_timer_stop(&p->reap_timer);
	px_cswait_stop(p->csw); /* parked getMores answer now, none parks again */
	px_forwarder_stop(p->fw); /* no new command on the loop; those in flight finish */
	if (role->http)
		sdb_http_unroute(role->http, p);
	wire_server_close(p->srv, (uint64_t)sdb_config_get_int(role->cfg,
								 SDB_OPT_shutdown_timeout_ms, 10000),
			  on_server_closed, role);
}

const sdb_role_def sdb_role_proxy = {
	.name = "proxy",
	.start = proxy_start,
	.stop = proxy_stop,
};
