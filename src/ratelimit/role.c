/* The ratelimit role: a Gubernator-compatible rate-limit service (issue #3).
 *
 * Starts the decision library (limiter.h) with the configured cache size, the HTTP/JSON
 * gateway on the role's HTTP endpoint (POST /v1/GetRateLimits, GET /v1/HealthCheck,
 * GET /v1/LiveCheck; /metrics and /healthz come from common/http), and the gRPC service
 * (pb.gubernator.V1 and PeersV1 and the peer cluster, src/ratelimit/grpc_server.h), which
 * points the front door (rl_frontend) at the cluster so HTTP requests are forwarded too.
 *
 * Configuration, in order of precedence: --cache-size (or STRIPEDB_CACHE_SIZE, or the
 * config file), then Gubernator's GUBER_CACHE_SIZE, then 50,000. Without --http-listen,
 * GUBER_HTTP_ADDRESS gives the HTTP address, so a Gubernator deployment can swap binaries.
 *
 * Threads: HTTP handlers run on libmicrohttpd's threads and call the front door's decide
 * function directly; the limiter is thread-safe. Nothing runs on the role's loop.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "auth/cluster.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/http.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/json.h"
#include "ratelimit/limiter.h"

#define RL_DEFAULT_CACHE_SIZE 50000

typedef struct rl_role {
	rl_limiter *lim;
	rl_frontend fe;
	sdb_http *http; /* where our routes are (role->http or own_http) */
	sdb_http *own_http;
	rl_grpc *grpc; /* gRPC service + peer cluster, or NULL without a gRPC address */
	sdb_histogram *m_latency;
} rl_role;

static void set_body(sdb_http_resp *resp, int status, char *body, size_t len)
{
	resp->status = status;
	resp->content_type = "application/json";
	resp->body = body;
	resp->body_len = len;
}

static void reply_error(sdb_http_resp *resp, int http_status, int grpc_code, const char *msg)
{
	size_t len;
	char *body = rl_json_render_error(grpc_code, msg, &len);
	set_body(resp, http_status, body, len);
}

/* POST /v1/GetRateLimits: GetRateLimitsReq -> GetRateLimitsResp (protojson). */
static void h_get_rate_limits(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	rl_role *rr = data;
	uint64_t t0 = sdb_mono_ns();
	rl_json_reqs reqs;
	rl_resp *out;
	char err[256];
	size_t len;
	int rc;

	rc = rl_json_parse_reqs(req->body, req->body_len, &reqs, err, sizeof err);
	if (rc == SDB_ETOOBIG) {
		reply_error(resp, 400, RL_GRPC_OUT_OF_RANGE, err);
		return;
	}
	if (rc != 0) {
		reply_error(resp, 400, RL_GRPC_INVALID_ARGUMENT, err);
		return;
	}
	if (rl_v1_reserved(reqs.reqs, reqs.n, err, sizeof err)) {
		rl_json_reqs_free(&reqs);
		reply_error(resp, 403, RL_GRPC_PERMISSION_DENIED, err);
		return;
	}
	out = sdb_malloc(reqs.n * sizeof(rl_resp));
	err[0] = '\0';
	rc = rr->fe.decide(rr->fe.decide_ctx, reqs.reqs, reqs.n, out, err, sizeof err);
	if (rc == 0) {
		char *body = rl_json_render_resps(out, reqs.n, &len);
		set_body(resp, 200, body, len);
	} else if (rc == SDB_EINVAL || rc == SDB_ETOOBIG) {
		reply_error(resp, 400, RL_GRPC_OUT_OF_RANGE, err);
	} else if (rc == SDB_EUNAVAILABLE || rc == SDB_ETIMEOUT) {
		reply_error(resp, 503, RL_GRPC_UNAVAILABLE, err);
	} else {
		reply_error(resp, 500, RL_GRPC_INTERNAL, err[0] ? err : sdb_strerror(rc));
	}
	free(out);
	rl_json_reqs_free(&reqs);
	sdb_histogram_observe_ns(rr->m_latency, sdb_mono_ns() - t0);
}

static bool frontend_health(rl_role *rr, int *peers, char *msg, size_t msglen)
{
	*peers = rr->fe.peer_count != NULL ? rr->fe.peer_count(rr->fe.peer_ctx) : 1;
	msg[0] = '\0';
	if (rr->fe.health != NULL)
		return rr->fe.health(rr->fe.peer_ctx, msg, msglen);
	return true;
}

/* rl_frontend.health over the cluster (peer_ctx is the rl_cluster). */
static bool cluster_health(void *ctx, char *msg, size_t msglen)
{
	int peers;
	return rl_cluster_health(ctx, &peers, msg, msglen);
}

/* GET /v1/HealthCheck: {"status": "healthy"|"unhealthy", "message", "peer_count",
 * "advertise_address"} (Gubernator's HealthCheckResp). */
static void h_health_check(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	rl_role *rr = data;
	char msg[256];
	int peers;
	size_t len;
	bool ok;
	char *body;

	(void)req;
	ok = frontend_health(rr, &peers, msg, sizeof msg);
	body = rl_json_render_health(ok ? "healthy" : "unhealthy", msg, peers,
				     rr->fe.peer_count == rl_cluster_peer_count
					     ? rl_cluster_advertise(rr->fe.peer_ctx)
					     : NULL,
				     &len);
	set_body(resp, 200, body, len);
}

/* GET /v1/LiveCheck: LiveCheckResp is an empty message. */
static void h_live_check(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	(void)data;
	(void)req;
	set_body(resp, 200, sdb_strdup("{}"), 2);
}

/* /healthz contribution: local health only. A dead peer is reported by HealthCheck
 * (status "unhealthy", Gubernator's semantics) but must not fail every survivor's
 * liveness probe: its keys are already served by the next owner on the ring. */
static int healthz(void *data, char *msg, size_t msglen)
{
	(void)data;
	(void)msg;
	(void)msglen;
	return 1;
}

/* The cache size: --cache-size, else GUBER_CACHE_SIZE, else 50,000. */
static int cache_size_of(const sdb_config *cfg, size_t *out, char *err, size_t errlen)
{
	const char *env;
	char *end;
	long long v;

	if (sdb_config_get(cfg, SDB_OPT_cache_size) != NULL) {
		int64_t n = sdb_config_get_int(cfg, SDB_OPT_cache_size, RL_DEFAULT_CACHE_SIZE);
		if (n <= 0)
			return sdb_errf(err, errlen, SDB_EUSAGE, "--cache-size must be at least 1");
		*out = (size_t)n;
		return 0;
	}
	env = getenv("GUBER_CACHE_SIZE");
	if (env != NULL && env[0] != '\0') {
		v = strtoll(env, &end, 10);
		if (*end != '\0' || v <= 0)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"GUBER_CACHE_SIZE: want a positive integer, got '%s'", env);
		*out = (size_t)v;
		return 0;
	}
	*out = RL_DEFAULT_CACHE_SIZE;
	return 0;
}

static int ratelimit_start(sdb_role *role)
{
	rl_limiter_opts lo = {0};
	rl_role *rr;
	const char *guber_http;
	int rc;

	rc = cache_size_of(role->cfg, &lo.cache_size, role->err, sizeof role->err);
	if (rc != 0)
		return rc;
	/* issue #10: PeersV1 checks the cluster token with --cluster-key-file */
	rc = auth_cluster_setup(role->cfg, role->err, sizeof role->err);
	if (rc != 0)
		return rc;
	rr = sdb_calloc(1, sizeof(*rr));
	rr->lim = rl_limiter_new(&lo);
	rr->fe.limiter = rr->lim;
	rr->fe.decide = rl_decide_local;
	rr->fe.decide_ctx = rr->lim;
	rr->m_latency = sdb_metrics_histogram("stripedb_ratelimit_http_request_seconds",
					      "POST /v1/GetRateLimits handling time", NULL);

	/* gRPC (pb.gubernator.V1/PeersV1) and the peer cluster: may point rr->fe at the
	 * cluster's entry point, before any HTTP route can call it. */
	rc = rl_grpc_start(role, &rr->fe, &rr->grpc, role->err, sizeof role->err);
	if (rc != 0)
		goto err_after_limiter;
	/* HTTP HealthCheck answers as the gRPC one: from the cluster's view of its peers */
	if (rr->fe.health == NULL && rr->fe.peer_count == rl_cluster_peer_count)
		rr->fe.health = cluster_health;

	rr->http = role->http;
	guber_http = getenv("GUBER_HTTP_ADDRESS");
	if (rr->http == NULL && guber_http != NULL && guber_http[0] != '\0') {
		/* Go's ":PORT" (Gubernator's default form) listens on every interface */
		char any[300];
		if (guber_http[0] == ':') {
			snprintf(any, sizeof any, "0.0.0.0%s", guber_http);
			guber_http = any;
		}
		rc = sdb_http_acquire_cfg(guber_http, role->cfg, &rr->own_http, role->err,
					  sizeof role->err);
		if (rc != 0) {
			sdb_errwrap(role->err, sizeof role->err, rc, "GUBER_HTTP_ADDRESS");
			goto err_after_grpc;
		}
		rr->http = rr->own_http;
	}
	if (rr->http != NULL) {
		if ((rc = sdb_http_route(rr->http, "POST", "/v1/GetRateLimits", h_get_rate_limits,
					 rr)) != 0 ||
		    (rc = sdb_http_route(rr->http, "GET", "/v1/HealthCheck", h_health_check,
					 rr)) != 0 ||
		    (rc = sdb_http_route(rr->http, "GET", "/v1/LiveCheck", h_live_check, rr)) !=
			    0) {
			sdb_errf(role->err, sizeof role->err, rc,
				 "ratelimit: HTTP routes already registered on this address");
			goto err_after_routes;
		}
		sdb_http_add_health(rr->http, "ratelimit", healthz, rr);
	} else {
		sdb_warn("ratelimit: no HTTP listener (--http-listen or GUBER_HTTP_ADDRESS)",
			 NULL);
	}
	role->impl = rr;
	sdb_info("ratelimit started", "cache_size=%zu http_port=%d grpc_port=%d", lo.cache_size,
		 rr->http != NULL ? sdb_http_port(rr->http) : 0,
		 rr->grpc != NULL ? rl_grpc_port(rr->grpc) : 0);
	return 0;

err_after_routes:
	sdb_http_unroute(rr->http, rr);
	if (rr->own_http != NULL)
		sdb_http_release(rr->own_http);
err_after_grpc:
	rr->fe.health = NULL;
	rl_grpc_stop(rr->grpc);
err_after_limiter:
	rl_limiter_free(rr->lim);
	free(rr);
	return rc;
}

static void ratelimit_stop(sdb_role *role)
{
	rl_role *rr = role->impl;

	if (rr != NULL) {
		/* unroute waits for handlers in flight, so the limiter is idle after it */
		if (rr->http != NULL)
			sdb_http_unroute(rr->http, rr);
		if (rr->own_http != NULL)
			sdb_http_release(rr->own_http);
		/* drains the gRPC calls that use the limiter, then the limiter goes */
		rr->fe.health = NULL;
		rl_grpc_stop(rr->grpc);
		rl_limiter_free(rr->lim);
		free(rr);
		role->impl = NULL;
	}
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_ratelimit = {
	.name = "ratelimit",
	.start = ratelimit_start,
	.stop = ratelimit_stop,
};
