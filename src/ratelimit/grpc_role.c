/* The ratelimit role's gRPC hook (grpc_server.h rl_grpc_start / rl_grpc_stop): the peer
 * cluster from --peers or metadata membership, the gRPC server in front of it, the
 * GUBER_* connection limits and GET /debug/ratelimit/peers. The server itself (HTTP/2 on
 * nghttp2, gRPC framing) is grpc_server.c. */
#include "build_config.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/membership.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "auth/raftsec.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/http.h"
#include "common/log.h"
#include "tls/tls.h"

/* ---- role hook ---- */

struct rl_grpc {
	rl_frontend *fe;
	rl_cluster *cluster;
	rl_grpc_server *server;
	rl_membership *membership; /* issue #23: peers from metadata, or NULL */
	sdb_http *http;            /* where GET /debug/ratelimit/peers is routed, or NULL */
};

/* GET /debug/ratelimit/peers (issue #23): this node's ring, as JSON
 * {"advertise", "version", "peers": [{"address", "self", "state": "alive"|"dead",
 * "dead_for_ms"}]} in ring order; version is the metadata membership version the ring
 * was built from (0: --peers or not yet known). */
static void h_debug_peers(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	rl_grpc *g = data;
	rl_member m[64];
	uint64_t version = 0;
	size_t n = rl_cluster_members(g->cluster, m, 64, &version), i;
	bson_t doc = BSON_INITIALIZER, arr, d;
	char key[16], *json;

	(void)req;
	BSON_APPEND_UTF8(&doc, "advertise", rl_cluster_advertise(g->cluster));
	BSON_APPEND_INT64(&doc, "version", (int64_t)version);
	BSON_APPEND_INT32(&doc, "peer_count", (int32_t)n);
	bson_append_array_begin(&doc, "peers", -1, &arr);
	for (i = 0; i < n && i < 64; i++) {
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "address", m[i].addr);
		BSON_APPEND_BOOL(&d, "self", m[i].self);
		BSON_APPEND_UTF8(&d, "state", m[i].alive ? "alive" : "dead");
		BSON_APPEND_INT64(&d, "dead_for_ms", m[i].dead_for_ms);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&doc, &arr);
	json = bson_as_relaxed_extended_json(&doc, NULL);
	resp->status = 200;
	resp->content_type = "application/json";
	resp->body = sdb_strdup(json);
	resp->body_len = strlen(resp->body);
	bson_free(json);
	bson_destroy(&doc);
}

/* Connection limits of the gRPC listener from GUBER_GRPC_HANDSHAKE_TIMEOUT and
 * GUBER_GRPC_MAX_CONN_IDLE (Go durations, 1ms..24h) and GUBER_GRPC_MAX_CONNS (1..1000000);
 * unset: the server's defaults. Errors: SDB_EUSAGE (a bad value), with a message in err. */
static int conn_limits_from_env(rl_grpc_server_opts *o, char *err, size_t errlen)
{
	static const char *const durs[2] = {"GUBER_GRPC_HANDSHAKE_TIMEOUT",
					    "GUBER_GRPC_MAX_CONN_IDLE"};
	int64_t *dst[2] = {&o->handshake_ms, &o->max_idle_ms};
	const char *v;

	for (int i = 0; i < 2; i++) {
		int64_t us = 0;
		if ((v = getenv(durs[i])) == NULL || *v == '\0')
			continue;
		if (rl_parse_go_duration(v, &us) != 0 || us < 1000 || us > 86400000000LL)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"%s: bad duration '%s' (1ms..24h, e.g. 20s, 5m)", durs[i], v);
		*dst[i] = us / 1000;
	}
	if ((v = getenv("GUBER_GRPC_MAX_CONNS")) != NULL && *v != '\0') {
		char *end;
		long long n = strtoll(v, &end, 10);
		if (*end != '\0' || n < 1 || n > 1000000)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"GUBER_GRPC_MAX_CONNS: bad count '%s' (1..1000000)", v);
		o->max_conns = n;
	}
	return 0;
}

/* Split a comma-separated list into a NULL-terminated heap array of heap strings. */
static char **split_list(const char *s, size_t *n)
{
	char **v = NULL;
	const char *p = s;

	*n = 0;
	while (p && *p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		while (len > 0 && (*p == ' ' || *p == '\t')) {
			p++;
			len--;
		}
		while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (len > 0) {
			v = sdb_realloc(v, (*n + 2) * sizeof(*v));
			v[(*n)++] = sdb_strndup(p, len);
			v[*n] = NULL;
		}
		p = comma ? comma + 1 : NULL;
	}
	return v;
}

static void free_list(char **v, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* rl_frontend.health adapter: Gubernator's HealthCheck is unhealthy while a peer is
 * unreachable. */
static bool cluster_health(void *ctx, char *msg, size_t msglen)
{
	int peers;

	return rl_cluster_health(ctx, &peers, msg, msglen);
}

int rl_grpc_start(sdb_role *role, rl_frontend *fe, rl_grpc **out, char *err, size_t errlen)
{
	const sdb_config *cfg = role->cfg;
	const char *listen = sdb_config_get(cfg, SDB_OPT_grpc_listen);
	const char *advertise = sdb_config_get(cfg, SDB_OPT_advertise);
	const char *peers_s = sdb_config_get(cfg, SDB_OPT_peers);
	const char *metadata = sdb_config_get(cfg, SDB_OPT_metadata);
	int64_t lease_ms = sdb_config_get_int(cfg, SDB_OPT_ratelimit_lease_ms, 3000);
	rl_cluster_opts copts;
	rl_grpc_server_opts sopts;
	rl_grpc *g;
	char **peers = NULL;
	size_t n_peers = 0;
	bool is_proxy, has_peers, has_meta;
	int rv;

	*out = NULL;
	if (listen == NULL || *listen == '\0')
		listen = getenv("GUBER_GRPC_ADDRESS");
	if (advertise == NULL || *advertise == '\0')
		advertise = getenv("GUBER_ADVERTISE_ADDRESS");
	is_proxy = strcmp(role->def->name, "proxy") == 0;
	has_peers = peers_s != NULL && *peers_s != '\0';
	has_meta = metadata != NULL && *metadata != '\0';
	if (listen == NULL || *listen == '\0') {
		if (has_peers)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"ratelimit: --peers needs --grpc-listen (or GUBER_GRPC_ADDRESS)");
		/* A rate limiter's --metadata is only for its peer membership: without a gRPC
		 * address it would run unregistered, alone, which nobody asks for. A proxy's
		 * --metadata is its routing; without --grpc-listen it just keeps out of the
		 * rate-limit ring (documented, docs/operations.md). */
		if (has_meta && !is_proxy)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"ratelimit: --metadata needs --grpc-listen (or "
					"GUBER_GRPC_ADDRESS): the peer address registered in metadata");
		sdb_info("ratelimit gRPC not configured (no --grpc-listen)", NULL);
		return 0;
	}
	/* The ring comes from --peers or from --metadata, not both: --peers (a static ring)
	 * wins. A proxy needs --metadata for its routing anyway; a rate limiter may get both
	 * from a configuration file with a global `metadata` (the one `stripedb cluster`
	 * writes has a static `peers` list per section), so this is a warning, not a
	 * refusal (docs/operations.md). */
	if (has_peers && has_meta) {
		if (is_proxy)
			sdb_info("proxy: rate-limit ring from --peers (static); not registered in "
				 "metadata", NULL);
		else
			sdb_warn("ratelimit: --peers and --metadata both given: the ring is --peers "
				 "(static), --metadata is ignored (not registered, no discovery)",
				 NULL);
	}
	if (advertise == NULL || *advertise == '\0')
		advertise = listen;
	if ((peers_s == NULL || *peers_s == '\0') && metadata != NULL && *metadata != '\0' &&
	    (lease_ms < 1000 || lease_ms > 600000))
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--ratelimit-lease-ms must be in 1000..600000, got %lld",
				(long long)lease_ms);

	/* issue #10: TLS of the gRPC listener from --tls-mode/--tls-cert/--tls-key/--tls-ca */
	rv = auth_raft_check_mode(cfg, err, errlen); /* bad usage in every role */
	if (rv == 0)
		rv = tls_setup(cfg, RL_GRPC_TLS_ROLE, TLS_CLIENTS_INTERNAL, err, errlen);
	if (rv != 0)
		return rv;
	memset(&copts, 0, sizeof(copts));
	rv = rl_cluster_opts_from_env(&copts, err, errlen);
	if (rv != 0)
		return rv;
	if (peers_s != NULL)
		peers = split_list(peers_s, &n_peers);
	copts.advertise = advertise;
	copts.peers = (const char *const *)peers;
	copts.n_peers = n_peers;

	g = sdb_calloc(1, sizeof(*g));
	g->fe = fe;
	rv = rl_cluster_new(fe->limiter, &copts, &g->cluster, err, errlen);
	free_list(peers, n_peers);
	if (rv != 0)
		goto err_after_alloc;

	memset(&sopts, 0, sizeof(sopts));
	sopts.listen = listen;
	sopts.cluster = g->cluster;
	rv = conn_limits_from_env(&sopts, err, errlen);
	if (rv == 0)
		rv = rl_grpc_server_new(&sopts, &g->server, err, errlen);
	if (rv != 0)
		goto err_after_cluster;

	fe->decide = rl_cluster_decide;
	fe->decide_ctx = g->cluster;
	fe->peer_count = rl_cluster_peer_count;
	fe->peer_ctx = g->cluster;
	fe->health = cluster_health;
	sdb_info("ratelimit gRPC listening", "addr=%s port=%d advertise=%s", listen,
		 rl_grpc_server_port(g->server), advertise);
	/* issue #23: without --peers, the peers are whoever registered in metadata */
	if ((peers_s == NULL || *peers_s == '\0') && metadata != NULL && *metadata != '\0') {
		rv = rl_membership_start(metadata, advertise,
					 strcmp(role->def->name, "proxy") == 0 ? "proxy" : "ratelimit",
					 lease_ms, g->cluster, &g->membership, err, errlen);
		if (rv != 0) {
			rl_grpc_stop(g);
			return rv;
		}
	}
	if (role->http != NULL) {
		if (sdb_http_route(role->http, "GET", "/debug/ratelimit/peers", h_debug_peers, g) ==
		    0)
			g->http = role->http;
		else /* another role of this process routed it first */
			sdb_debug("ratelimit: /debug/ratelimit/peers already routed", NULL);
	}
	*out = g;
	return 0;

err_after_cluster:
	rl_cluster_free(g->cluster);
err_after_alloc:
	free(g);
	return rv;
}

void rl_grpc_stop(rl_grpc *g)
{
	if (g == NULL)
		return;
	if (g->http != NULL)
		sdb_http_unroute(g->http, g); /* waits for handlers in flight */
	rl_membership_stop(g->membership); /* deregisters: peers drop this node at once */
	g->fe->decide = rl_decide_local;
	g->fe->decide_ctx = g->fe->limiter;
	g->fe->peer_count = NULL;
	g->fe->peer_ctx = NULL;
	g->fe->health = NULL;
	rl_grpc_server_shutdown(g->server);
	rl_cluster_free(g->cluster);
	rl_grpc_server_free(g->server);
	free(g);
}

int rl_grpc_port(const rl_grpc *g)
{
	return g ? rl_grpc_server_port(g->server) : 0;
}
