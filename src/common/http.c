/* HTTP endpoint on libmicrohttpd: see http.h. */
#include "common/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role.h"

#define MAX_BODY (4u * 1024u * 1024u)

typedef struct route {
	struct route *next;
	char *method;
	char *path;
	sdb_http_handler fn;
	void *data;
} route;

typedef struct health {
	struct health *next;
	char *name;
	sdb_http_health_fn fn;
	sdb_http_health_detail_fn detail; /* NULL: none */
	void *data;
} health;

struct sdb_http {
	struct sdb_http *next;
	char *addr;
	int refs;
	int port;
	struct MHD_Daemon *d;
	pthread_mutex_t mu;     /* guards checks */
	pthread_rwlock_t rw;    /* guards routes; held for reading while a handler runs, so
				 * sdb_http_unroute() returns only after its handlers finished */
	route *routes;
	health *checks;
	char *tls_cert, *tls_key; /* PEM texts (issue #10 --http-tls), NULL: plaintext */
	char *cert_path, *key_path;
	unsigned flags;                /* of MHD_start_daemon, reused by a reload */
	struct MHD_Daemon *old;        /* quiesced by the last reload, stopped by the next */
	char *old_cert, *old_key;      /* its PEM texts */
};

/* Per-request upload buffer. */
typedef struct upload {
	char *buf;
	size_t len;
	int too_big;
} upload;

static pthread_mutex_t servers_mu = PTHREAD_MUTEX_INITIALIZER;
static sdb_http *servers;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
				 char *body, size_t len, int owned, const char *const *headers)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (r == NULL) {
		if (owned) {
			free(body);
		}
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	for (int i = 0; headers != NULL && i < 4; i++) {
		const char *h = headers[i];
		const char *colon;
		char name[128];
		if (h == NULL || (colon = strchr(h, ':')) == NULL || (size_t)(colon - h) >= sizeof name) {
			continue;
		}
		memcpy(name, h, (size_t)(colon - h));
		name[colon - h] = '\0';
		MHD_add_response_header(r, name, colon[1] == ' ' ? colon + 2 : colon + 1);
	}
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* GET /healthz?format=json: every check with its detail, as JSON written by libbson. */
static enum MHD_Result serve_health_json(sdb_http *h, struct MHD_Connection *c)
{
	bson_t doc = BSON_INITIALIZER, arr;
	int ok = 1;
	uint32_t i = 0;
	char key[16];

	bson_append_array_begin(&doc, "checks", -1, &arr);
	pthread_mutex_lock(&h->mu);
	ok = h->checks != NULL; /* no role registered yet: starting, not ready */
	for (health *k = h->checks; k != NULL; k = k->next) {
		char msg[256] = "";
		bson_t one;
		int good = k->fn(k->data, msg, sizeof msg);
		ok &= good != 0;
		snprintf(key, sizeof key, "%u", i++);
		bson_append_document_begin(&arr, key, -1, &one);
		BSON_APPEND_UTF8(&one, "name", k->name);
		BSON_APPEND_BOOL(&one, "ok", good != 0);
		if (!good)
			BSON_APPEND_UTF8(&one, "reason", msg);
		if (k->detail)
			k->detail(k->data, &one);
		bson_append_document_end(&arr, &one);
	}
	pthread_mutex_unlock(&h->mu);
	bson_append_array_end(&doc, &arr);
	BSON_APPEND_UTF8(&doc, "status", ok ? "ok" : "unavailable");
	size_t len = 0;
	char *j = bson_as_relaxed_extended_json(&doc, &len);
	bson_destroy(&doc);
	char *body = sdb_malloc(len + 2);
	memcpy(body, j, len);
	body[len] = '\n';
	body[len + 1] = '\0';
	bson_free(j);
	return send_text(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "application/json",
			 body, len + 1, 1, NULL);
}

static enum MHD_Result serve_health(sdb_http *h, struct MHD_Connection *c)
{
	char reasons[2048] = "";
	size_t o = 0;
	int ok = 1;

	pthread_mutex_lock(&h->mu);
	if (h->checks == NULL) {
		/* the server listens before a role registers its check: not ready yet */
		ok = 0;
		o = (size_t)snprintf(reasons, sizeof reasons, "starting: no role registered yet\n");
	}
	for (health *k = h->checks; k != NULL; k = k->next) {
		char msg[256] = "";
		if (!k->fn(k->data, msg, sizeof msg)) {
			ok = 0;
			o += (size_t)snprintf(reasons + o, o < sizeof reasons ? sizeof reasons - o : 0,
					      "%s: %s\n", k->name, msg);
			if (o >= sizeof reasons) {
				o = sizeof reasons - 1;
			}
		}
	}
	pthread_mutex_unlock(&h->mu);
	if (ok) {
		return send_text(c, MHD_HTTP_OK, "text/plain; charset=utf-8", (char *)"ok\n", 3, 0,
				 NULL);
	}
	return send_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
			 sdb_strdup(reasons), strlen(reasons), 1, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_data_size, void **con_cls)
{
	sdb_http *h = cls;
	upload *up = *con_cls;
	route *match = NULL;
	int path_known = 0;
	sdb_http_req req;
	sdb_http_resp resp;

	if (up == NULL) {
		up = sdb_calloc(1, sizeof *up);
		*con_cls = up;
		return MHD_YES;
	}
	if (*upload_data_size != 0) {
		if (!up->too_big) {
			if (up->len + *upload_data_size > MAX_BODY) {
				up->too_big = 1;
			} else {
				up->buf = sdb_realloc(up->buf, up->len + *upload_data_size + 1);
				memcpy(up->buf + up->len, upload_data, *upload_data_size);
				up->len += *upload_data_size;
			}
		}
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (up->too_big) {
		static const char msg[] = "{\"code\":3,\"message\":\"request body larger than 4 MiB\"}";
		return send_text(c, MHD_HTTP_CONTENT_TOO_LARGE, "application/json", (char *)msg,
				 sizeof msg - 1, 0, NULL);
	}
	if (strcmp(url, "/healthz") == 0 && strcmp(method, "GET") == 0) {
		const char *fmt = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
		if (fmt != NULL && strcmp(fmt, "json") == 0) {
			return serve_health_json(h, c);
		}
		return serve_health(h, c);
	}
	if (strcmp(url, "/metrics") == 0 && strcmp(method, "GET") == 0) {
		size_t len;
		char *body = sdb_metrics_render(&len);
		return send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
				 1, NULL);
	}
	pthread_rwlock_rdlock(&h->rw);
	for (route *r = h->routes; r != NULL; r = r->next) {
		if (strcmp(r->path, url) == 0) {
			path_known = 1;
			if (strcmp(r->method, "*") == 0 || strcmp(r->method, method) == 0) {
				match = r;
				break;
			}
		}
	}
	sdb_http_handler fn = match != NULL ? match->fn : NULL;
	void *data = match != NULL ? match->data : NULL;
	if (fn == NULL) {
		pthread_rwlock_unlock(&h->rw);
		static const char nf[] = "not found\n";
		static const char na[] = "method not allowed\n";
		return path_known ? send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", (char *)na,
					      sizeof na - 1, 0, NULL)
				  : send_text(c, MHD_HTTP_NOT_FOUND, "text/plain", (char *)nf,
					      sizeof nf - 1, 0, NULL);
	}
	if (up->buf != NULL) {
		up->buf[up->len] = '\0';
	}
	req.method = method;
	req.path = url;
	req.query = NULL;
	req.body = up->buf != NULL ? up->buf : "";
	req.body_len = up->len;
	memset(&resp, 0, sizeof resp);
	fn(data, &req, &resp);
	pthread_rwlock_unlock(&h->rw);
	return send_text(c, resp.status != 0 ? (unsigned)resp.status : MHD_HTTP_OK,
			 resp.content_type != NULL ? resp.content_type : "application/json",
			 resp.body != NULL ? resp.body : sdb_strdup(""),
			 resp.body != NULL ? resp.body_len : 0, 1, resp.headers);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	upload *up = *con_cls;

	if (up != NULL) {
		free(up->buf);
		free(up);
		*con_cls = NULL;
	}
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	char q[600];

	vsnprintf(msg, sizeof msg, fmt, ap);
	msg[strcspn(msg, "\n")] = '\0';
	sdb_log(SDB_LOG_WARN, "http", "detail=%s", sdb_logq(q, sizeof q, msg));
}

static int http_start(sdb_http *h, char *err, size_t errlen)
{
	char host[256];
	char portstr[16];
	int port;
	struct addrinfo hints, *ai = NULL;
	int rc;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
	const union MHD_DaemonInfo *info;

	if (sdb_addr_split(h->addr, host, sizeof host, &port, err, errlen) != 0) {
		return SDB_EINVAL;
	}
	snprintf(portstr, sizeof portstr, "%d", port);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(host, portstr, &hints, &ai);
	if (rc != 0) {
		return sdb_errf(err, errlen, SDB_EINVAL, "http: cannot resolve %s: %s", host,
				gai_strerror(rc));
	}
	if (ai->ai_family == AF_INET6) {
		flags |= MHD_USE_IPv6;
	}
	if (h->tls_cert) {
		/* issue #10: HTTPS (libmicrohttpd's GnuTLS build, Debian 12 has it) */
		if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
			freeaddrinfo(ai);
			return sdb_errf(err, errlen, SDB_EINVAL,
					"http: --http-tls: libmicrohttpd was built without TLS");
		}
		flags |= MHD_USE_TLS | MHD_USE_ITC; /* ITC: MHD_quiesce_daemon on reload */
	}
	h->flags = flags;
	h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
				ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
				MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
				/* plaintext: the list ends here */
				h->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END,
				h->tls_cert, MHD_OPTION_HTTPS_MEM_KEY, h->tls_key, MHD_OPTION_END);
	freeaddrinfo(ai);
	if (h->d == NULL) {
		return sdb_errf(err, errlen, SDB_EIO, "http: cannot listen on %s", h->addr);
	}
	info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info != NULL ? info->port : port;
	return 0;
}

static void free_pem(char *s)
{
	if (s) {
		memset(s, 0, strlen(s));
		free(s);
	}
}

/* Read a PEM file (at most 1 MiB) into a heap string. */
static int read_pem(const char *path, char **out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	size_t n;

	*out = NULL;
	if (f == NULL)
		return sdb_errf(err, errlen, SDB_EIO, "http: --http-tls: cannot read %s", path);
	buf = sdb_malloc((1u << 20) + 1);
	n = fread(buf, 1, 1u << 20, f);
	fclose(f);
	if (n == 0 || n == 1u << 20) {
		free(buf);
		return sdb_errf(err, errlen, SDB_EINVAL,
				"http: --http-tls: %s is empty or too large", path);
	}
	buf[n] = '\0';
	*out = sdb_realloc(buf, n + 1); /* kept for the daemon's lifetime: trim */
	return 0;
}

static int acquire(const char *addr, char *cert, char *key, sdb_http **out, char *err,
		   size_t errlen);

static int read_pem(const char *path, char **out, char *err, size_t errlen);

/* Swap one HTTPS server's daemon for one with the new PEM texts (taken over): the new
 * daemon accepts on a dup of the listening socket, then the old one is quiesced (stops
 * accepting; its open connections finish with the old certificate) and stopped at the
 * next reload or at release. On failure nothing changes. Called with servers_mu held. */
static int swap_daemon(sdb_http *h, char *cert, char *key, char *err, size_t errlen)
{
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_LISTEN_FD);
	struct MHD_Daemon *nd;
	MHD_socket fd, q;

	if (info == NULL || (fd = dup(info->listen_fd)) < 0) {
		free_pem(cert);
		free_pem(key);
		return sdb_errf(err, errlen, SDB_EIO, "http: %s: no listening socket to share",
				h->addr);
	}
	nd = MHD_start_daemon(h->flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
			      mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
			      MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
			      MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
			      MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
			      MHD_OPTION_END);
	if (nd == NULL) {
		close(fd);
		free_pem(cert);
		free_pem(key);
		return sdb_errf(err, errlen, SDB_EINVAL,
				"http: %s: the new certificate or key was refused", h->addr);
	}
	if (h->old != NULL) {
		MHD_stop_daemon(h->old);
		free_pem(h->old_cert);
		free_pem(h->old_key);
	}
	q = MHD_quiesce_daemon(h->d);
	if (q != MHD_INVALID_SOCKET)
		close(q); /* the new daemon listens on its dup */
	h->old = h->d;
	h->old_cert = h->tls_cert;
	h->old_key = h->tls_key;
	h->d = nd;
	h->tls_cert = cert;
	h->tls_key = key;
	return 0;
}

int sdb_http_tls_reload(char *err, size_t errlen)
{
	int rc = 0;

	pthread_mutex_lock(&servers_mu);
	for (sdb_http *h = servers; h != NULL; h = h->next) {
		char *cert = NULL, *key = NULL, e[256];
		int r;

		if (h->tls_cert == NULL || h->cert_path == NULL)
			continue;
		r = read_pem(h->cert_path, &cert, e, sizeof e);
		if (r == 0 && (r = read_pem(h->key_path, &key, e, sizeof e)) != 0)
			free_pem(cert);
		if (r == 0)
			r = swap_daemon(h, cert, key, e, sizeof e);
		if (r == 0)
			sdb_log(SDB_LOG_INFO, "http: TLS certificate reloaded", "addr=%s cert=%s",
				h->addr, h->cert_path);
		else if (rc == 0) {
			rc = r;
			snprintf(err, errlen, "%s", e);
		}
	}
	pthread_mutex_unlock(&servers_mu);
	return rc;
}

int sdb_http_acquire(const char *addr, sdb_http **out, char *err, size_t errlen)
{
	return acquire(addr, NULL, NULL, out, err, errlen);
}

int sdb_http_acquire_cfg(const char *addr, const sdb_config *cfg, sdb_http **out, char *err,
			 size_t errlen)
{
	const char *cp = sdb_config_get(cfg, SDB_OPT_tls_cert);
	const char *kp = sdb_config_get(cfg, SDB_OPT_tls_key);
	char *cert = NULL, *key = NULL;
	int rc;

	if (!sdb_config_get_bool(cfg, SDB_OPT_http_tls, 0))
		return acquire(addr, NULL, NULL, out, err, errlen);
	if (cp == NULL || kp == NULL)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--http-tls needs --tls-cert and --tls-key");
	if ((rc = read_pem(cp, &cert, err, errlen)) != 0)
		return rc;
	if ((rc = read_pem(kp, &key, err, errlen)) != 0) {
		free_pem(cert);
		return rc;
	}
	rc = acquire(addr, cert, key, out, err, errlen); /* takes cert and key */
	if (rc == 0 && (*out)->cert_path == NULL) {
		pthread_mutex_lock(&servers_mu);
		(*out)->cert_path = sdb_strdup(cp);
		(*out)->key_path = sdb_strdup(kp);
		pthread_mutex_unlock(&servers_mu);
	}
	if (rc == 0) /* the HTTPS servers' certificates, re-read on SIGHUP (once) */
		sdb_on_sighup("HTTP TLS", "certificate", sdb_http_tls_reload);
	return rc;
}

static int acquire(const char *addr, char *cert, char *key, sdb_http **out, char *err,
		   size_t errlen)
{
	sdb_http *h;
	int rc;

	pthread_mutex_lock(&servers_mu);
	for (h = servers; h != NULL; h = h->next) {
		if (strcmp(h->addr, addr) == 0) {
			if ((h->tls_cert != NULL) != (cert != NULL)) {
				pthread_mutex_unlock(&servers_mu);
				free_pem(cert);
				free_pem(key);
				return sdb_errf(err, errlen, SDB_EINVAL,
						"http: roles sharing %s disagree on "
						"--http-tls",
						addr);
			}
			free_pem(cert);
			free_pem(key);
			h->refs++;
			*out = h;
			pthread_mutex_unlock(&servers_mu);
			return 0;
		}
	}
	h = sdb_calloc(1, sizeof *h);
	h->addr = sdb_strdup(addr);
	h->refs = 1;
	h->tls_cert = cert;
	h->tls_key = key;
	pthread_mutex_init(&h->mu, NULL);
	pthread_rwlock_init(&h->rw, NULL);
	rc = http_start(h, err, errlen);
	if (rc != 0) {
		pthread_mutex_unlock(&servers_mu);
		free_pem(h->tls_cert);
		free_pem(h->tls_key);
		pthread_mutex_destroy(&h->mu);
		pthread_rwlock_destroy(&h->rw);
		free(h->addr);
		free(h);
		return rc;
	}
	h->next = servers;
	servers = h;
	pthread_mutex_unlock(&servers_mu);
	sdb_log(SDB_LOG_INFO, "http listening", "addr=%s port=%d tls=%s", addr, h->port,
		h->tls_cert ? "https" : "no");
	*out = h;
	return 0;
}

void sdb_http_release(sdb_http *h)
{
	sdb_http **pp;

	pthread_mutex_lock(&servers_mu);
	if (--h->refs > 0) {
		pthread_mutex_unlock(&servers_mu);
		return;
	}
	for (pp = &servers; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	pthread_mutex_unlock(&servers_mu);
	MHD_stop_daemon(h->d);
	if (h->old != NULL)
		MHD_stop_daemon(h->old);
	free_pem(h->old_cert);
	free_pem(h->old_key);
	free(h->cert_path);
	free(h->key_path);
	while (h->routes != NULL) {
		route *r = h->routes;
		h->routes = r->next;
		free(r->method);
		free(r->path);
		free(r);
	}
	while (h->checks != NULL) {
		health *k = h->checks;
		h->checks = k->next;
		free(k->name);
		free(k);
	}
	pthread_mutex_destroy(&h->mu);
	pthread_rwlock_destroy(&h->rw);
	free_pem(h->tls_cert);
	free_pem(h->tls_key);
	free(h->addr);
	free(h);
}

int sdb_http_route(sdb_http *h, const char *method, const char *path, sdb_http_handler fn, void *data)
{
	route *r;

	pthread_rwlock_wrlock(&h->rw);
	for (r = h->routes; r != NULL; r = r->next) {
		if (strcmp(r->path, path) == 0 && strcmp(r->method, method) == 0) {
			pthread_rwlock_unlock(&h->rw);
			return SDB_EEXISTS;
		}
	}
	r = sdb_calloc(1, sizeof *r);
	r->method = sdb_strdup(method);
	r->path = sdb_strdup(path);
	r->fn = fn;
	r->data = data;
	r->next = h->routes;
	h->routes = r;
	pthread_rwlock_unlock(&h->rw);
	return 0;
}

void sdb_http_unroute(sdb_http *h, void *data)
{
	pthread_rwlock_wrlock(&h->rw);
	for (route **pp = &h->routes; *pp != NULL;) {
		route *r = *pp;
		if (r->data == data) {
			*pp = r->next;
			free(r->method);
			free(r->path);
			free(r);
		} else {
			pp = &r->next;
		}
	}
	pthread_rwlock_unlock(&h->rw);
	pthread_mutex_lock(&h->mu);
	for (health **pp = &h->checks; *pp != NULL;) {
		health *k = *pp;
		if (k->data == data) {
			*pp = k->next;
			free(k->name);
			free(k);
		} else {
			pp = &k->next;
		}
	}
	pthread_mutex_unlock(&h->mu);
}

void sdb_http_add_health(sdb_http *h, const char *name, sdb_http_health_fn fn, void *data)
{
	sdb_http_add_health_detail(h, name, fn, NULL, data);
}

void sdb_http_add_health_detail(sdb_http *h, const char *name, sdb_http_health_fn fn,
				sdb_http_health_detail_fn detail, void *data)
{
	health *k = sdb_calloc(1, sizeof *k);

	k->name = sdb_strdup(name);
	k->fn = fn;
	k->detail = detail;
	k->data = data;
	pthread_mutex_lock(&h->mu);
	k->next = h->checks;
	h->checks = k;
	pthread_mutex_unlock(&h->mu);
}

int sdb_http_port(const sdb_http *h)
{
	return h->port;
}
