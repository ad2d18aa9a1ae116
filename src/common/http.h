/* HTTP/1.1 endpoint of every role, on libmicrohttpd (no hand-written HTTP here).
 *
 * Serves GET /healthz and GET /metrics (Prometheus text from common/metrics.h) itself;
 * roles add their own routes (e.g. the rate limiter's POST /v1/GetRateLimits).
 * Handlers run on libmicrohttpd's thread pool, never on a role's event loop: they must
 * be thread-safe. Several roles in one process given the same --http-listen address share
 * one server (sdb_http_acquire counts references).
 */
#ifndef SDB_COMMON_HTTP_H
#define SDB_COMMON_HTTP_H

#include <stddef.h>

#include <bson/bson.h>

typedef struct sdb_http sdb_http;

/* A response filled in by a handler. body is heap memory taken over by the server
 * (freed after sending); content_type defaults to "application/json". status defaults to
 * 200. Extra headers: at most 4 "Name: value" strings (static or heap in hdr_owned). */
typedef struct sdb_http_resp {
	int status;
	const char *content_type;
	char *body;
	size_t body_len;
	const char *headers[4];
} sdb_http_resp;

/* A request as seen by a handler: method ("GET"), path ("/v1/GetRateLimits", without the
 * query string), query string or NULL, and the full body (at most 4 MiB; larger bodies
 * get 413 before any handler runs). */
typedef struct sdb_http_req {
	const char *method;
	const char *path;
	const char *query;
	const char *body;
	size_t body_len;
} sdb_http_req;

typedef void (*sdb_http_handler)(void *data, const sdb_http_req *req, sdb_http_resp *resp);

/* Health check: return 1 when healthy, 0 otherwise, with a short reason in msg. Each role
 * registers one; /healthz answers 200 "ok" only when every registered check passes, else
 * 503 with the reasons. */
typedef int (*sdb_http_health_fn)(void *data, char *msg, size_t msglen);

/* Start (or share) the server on "HOST:PORT". Release with sdb_http_release(); the server
 * stops when the last reference goes. Errors: with a message, SDB_EINVAL (bad or
 * unresolvable address; an HTTPS role already shares it), SDB_EIO (bind/listen failed). */
int sdb_http_acquire(const char *addr, sdb_http **out, char *err, size_t errlen);
void sdb_http_release(sdb_http *h);

/* sdb_http_acquire with the role's options (issue #10): with --http-tls=true the server
 * speaks HTTPS only (libmicrohttpd + GnuTLS, MHD_USE_TLS), certificate chain --tls-cert
 * and key --tls-key (re-read by sdb_http_tls_reload); no client certificates are
 * requested. Roles sharing an address must agree on --http-tls (the first one's files
 * are used). Errors: as sdb_http_acquire, plus SDB_EUSAGE
 * (--http-tls without --tls-cert/--tls-key), SDB_EIO/SDB_EINVAL (unreadable PEM, or
 * libmicrohttpd without TLS), SDB_EINVAL (sharing roles disagree). */
struct sdb_config;
int sdb_http_acquire_cfg(const char *addr, const struct sdb_config *cfg, sdb_http **out,
			 char *err, size_t errlen);

/* Re-read the certificate and key of every HTTPS server (the "HTTP TLS" SIGHUP hook that
 * the first sdb_http_acquire_cfg with --http-tls registers). New connections get the new
 * certificate: a new daemon accepts on the same listening socket and the old one stops
 * accepting, finishing its open connections (it is stopped at the next reload or
 * release). Errors: the first one, SDB_EIO or SDB_EINVAL (unreadable or refused files;
 * that server keeps its old certificate; the other servers are still reloaded).
 * Thread-safe. */
int sdb_http_tls_reload(char *err, size_t errlen);

/* Register a route (exact path match; method "GET", "POST", ... or "*"). May be called
 * while the server runs. Errors: SDB_EEXISTS (method and path already routed). */
int sdb_http_route(sdb_http *h, const char *method, const char *path, sdb_http_handler fn,
		   void *data);
/* Remove every route and health check registered with this data pointer (a role calls
 * it when it stops, before freeing data). */
void sdb_http_unroute(sdb_http *h, void *data);
void sdb_http_add_health(sdb_http *h, const char *name, sdb_http_health_fn fn, void *data);

/* The detail of a health check for `GET /healthz?format=json`: append this role's state
 * to out (e.g. a shard member's replica set: state, term, primary, each member's lag).
 * Runs on an HTTP thread: read only what is safe there (a copy the role keeps under a
 * lock, atomics). */
typedef void (*sdb_http_health_detail_fn)(void *data, bson_t *out);
/* sdb_http_add_health plus a detail. `GET /healthz?format=json` answers (200 or 503 as
 * the text form) {"status": "ok"|"unavailable", "checks": [{"name", "ok", "reason"?,
 * ...detail}]}; plain /healthz is unchanged ("ok" or the reasons, one a line). */
void sdb_http_add_health_detail(sdb_http *h, const char *name, sdb_http_health_fn fn,
				sdb_http_health_detail_fn detail, void *data);

/* Returns: the port actually bound (useful with port 0). */
int sdb_http_port(const sdb_http *h);

#endif
