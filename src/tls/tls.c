/* TLS for the listeners of the roles with OpenSSL memory BIOs. See tls/tls.h. */
#include "tls/tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/role.h"

#define TLS_MAX_LISTENERS 8

struct tls_listener {
	char role[32];
	tls_mode mode;
	bool internal; /* TLS_CLIENTS_INTERNAL: with a CA, a client certificate is required */
	unsigned gen;  /* bumped by each successful reload */
	bool alpn_h2;  /* select ALPN "h2" (tls_listener_set_alpn_h2) */
	char *cert, *key, *ca;
	SSL_CTX *ctx;
};
typedef struct tls_listener listener;

static uv_once_t once = UV_ONCE_INIT;
static uv_mutex_t mu;
static listener lst[TLS_MAX_LISTENERS];
static size_t n_lst;

struct tls_conn {
	SSL *ssl;
	BIO *rbio, *wbio; /* owned by ssl */
};

static void init_mu(void)
{
	uv_mutex_init(&mu);
}

static int ssl_errf(char *err, size_t errlen, int rc, const char *what)
{
	char buf[256];
	unsigned long e = ERR_get_error();
	ERR_error_string_n(e, buf, sizeof buf);
	ERR_clear_error();
	return sdb_errf(err, errlen, rc, "tls: %s: %s", what, e ? buf : "failed");
}

/* ALPN selection for an HTTP/2 listener: "h2" when the client offers it; otherwise no
 * protocol is selected (the handshake goes on, as RFC 7301 allows). */
static int alpn_select_h2(SSL *ssl, const unsigned char **out, unsigned char *outlen,
			  const unsigned char *in, unsigned int inlen, void *arg)
{
	static const unsigned char h2[] = {2, 'h', '2'};
	unsigned char *sel;

	(void)ssl;
	(void)arg;
	if (SSL_select_next_proto(&sel, outlen, h2, sizeof h2, in, inlen) !=
	    OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_NOACK;
	*out = sel;
	return SSL_TLSEXT_ERR_OK;
}

static int make_ctx(const listener *l, SSL_CTX **out, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx)
		return ssl_errf(err, errlen, SDB_EINVAL, "SSL_CTX_new");
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	if (SSL_CTX_use_certificate_chain_file(ctx, l->cert) != 1) {
		SSL_CTX_free(ctx);
		return ssl_errf(err, errlen, SDB_EINVAL, l->cert);
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, l->key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		SSL_CTX_free(ctx);
		return ssl_errf(err, errlen, SDB_EINVAL, l->key);
	}
	if (l->ca) {
		if (SSL_CTX_load_verify_locations(ctx, l->ca, NULL) != 1) {
			SSL_CTX_free(ctx);
			return ssl_errf(err, errlen, SDB_EINVAL, l->ca);
		}
		/* proxy: client certificates are checked when presented; internal listeners
		 * (shard, metadata, ratelimit): a client certificate is required (mutual TLS,
		 * MongoDB's default net.tls.allowConnectionsWithoutCertificates=false) */
		SSL_CTX_set_verify(ctx,
				   SSL_VERIFY_PEER |
					   (l->internal ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
				   NULL);
		SSL_CTX_set_verify_depth(ctx, 8);
		{
			/* send the CA names in the CertificateRequest so clients pick the
			 * right certificate */
			STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(l->ca);
			if (names)
				SSL_CTX_set_client_CA_list(ctx, names);
		}
		SSL_CTX_set_session_id_context(ctx, (const unsigned char *)l->role,
					       (unsigned)strlen(l->role));
	}
	if (l->alpn_h2)
		SSL_CTX_set_alpn_select_cb(ctx, alpn_select_h2, NULL);
	*out = ctx;
	return 0;
}

void tls_listener_set_alpn_h2(tls_listener *l)
{
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	if (!l->alpn_h2) {
		l->alpn_h2 = true;
		SSL_CTX_set_alpn_select_cb(l->ctx, alpn_select_h2, NULL);
	}
	uv_mutex_unlock(&mu);
}

int tls_setup(const sdb_config *cfg, const char *role, tls_clients clients, char *err,
	      size_t errlen)
{
	const char *mode = sdb_config_get(cfg, SDB_OPT_tls_mode);
	const char *cert = sdb_config_get(cfg, SDB_OPT_tls_cert);
	const char *key = sdb_config_get(cfg, SDB_OPT_tls_key);
	const char *ca = sdb_config_get(cfg, SDB_OPT_tls_ca);
	listener l;
	int rc;

	uv_once(&once, init_mu);
	memset(&l, 0, sizeof l);
	if (!mode || strcmp(mode, "disabled") == 0)
		return 0;
	if (strcmp(mode, "allowed") == 0)
		l.mode = TLS_MODE_ALLOWED;
	else if (strcmp(mode, "required") == 0)
		l.mode = TLS_MODE_REQUIRED;
	else
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--tls-mode must be disabled, allowed or required, not '%s'", mode);
	if (!cert || !key)
		return sdb_errf(err, errlen, SDB_EUSAGE, "--tls-mode=%s needs --tls-cert and --tls-key",
				mode);
	snprintf(l.role, sizeof l.role, "%s", role);
	l.internal = clients == TLS_CLIENTS_INTERNAL;
	l.gen = 1;
	l.cert = (char *)cert;
	l.key = (char *)key;
	l.ca = (char *)ca;
	rc = make_ctx(&l, &l.ctx, err, errlen);
	if (rc)
		return rc;
	l.cert = sdb_strdup(cert);
	l.key = sdb_strdup(key);
	l.ca = ca ? sdb_strdup(ca) : NULL;
	uv_mutex_lock(&mu);
	if (n_lst == TLS_MAX_LISTENERS) {
		uv_mutex_unlock(&mu);
		SSL_CTX_free(l.ctx);
		free(l.cert);
		free(l.key);
		free(l.ca);
		return sdb_errf(err, errlen, SDB_EUSAGE, "tls: too many listeners");
	}
	lst[n_lst++] = l;
	uv_mutex_unlock(&mu);
	sdb_on_sighup("TLS", "certificates", tls_reload); /* once: later calls are no-ops */
	sdb_info("tls configured", "role=%s mode=%s cert=%s ca=%s client_cert=%s", role, mode,
		 cert, ca ? ca : "-", !ca ? "not-requested" : l.internal ? "required" : "optional");
	return 0;
}

tls_listener *tls_listener_get(const char *role)
{
	tls_listener *l = NULL;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	for (size_t i = 0; i < n_lst; i++) /* the last one wins, as in tls_listener_mode */
		if (strcmp(lst[i].role, role) == 0)
			l = &lst[i];
	uv_mutex_unlock(&mu);
	return l;
}

tls_mode tls_listener_get_mode(const tls_listener *l)
{
	tls_mode m;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	m = l->mode;
	uv_mutex_unlock(&mu);
	return m;
}

tls_mode tls_listener_mode(const char *role)
{
	tls_mode m = TLS_MODE_DISABLED;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	for (size_t i = 0; i < n_lst; i++)
		if (strcmp(lst[i].role, role) == 0)
			m = lst[i].mode;
	uv_mutex_unlock(&mu);
	return m;
}

int tls_reload(char *err, size_t errlen)
{
	int rc = 0;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	for (size_t i = 0; i < n_lst; i++) { /* every listener; the first error is reported */
		SSL_CTX *ctx;
		char e[256];
		int r = make_ctx(&lst[i], &ctx, e, sizeof e);
		if (r != 0 && rc == 0) {
			rc = r;
			snprintf(err, errlen, "%s: %s", lst[i].role, e);
		}
		if (r == 0) {
			SSL_CTX_free(lst[i].ctx); /* sessions keep their own reference */
			lst[i].ctx = ctx;
			lst[i].gen++;
			sdb_info("tls certificate reloaded", "role=%s cert=%s", lst[i].role,
				 lst[i].cert);
		}
	}
	uv_mutex_unlock(&mu);
	return rc;
}

static int read_file(const char *path, char **out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0, cap = 0, n;

	*out = NULL;
	if (!f)
		return sdb_errf(err, errlen, SDB_EIO, "tls: %s: %s", path, strerror(errno));
	for (;;) {
		if (cap - len < 4096) {
			if (cap >= TLS_PEM_MAX) {
				fclose(f);
				free(buf);
				return sdb_errf(err, errlen, SDB_EINVAL,
						"tls: %s: larger than %d bytes", path,
						TLS_PEM_MAX);
			}
			cap = cap ? cap * 2 : 16384;
			buf = sdb_realloc(buf, cap + 1);
		}
		n = fread(buf + len, 1, cap - len, f);
		if (n == 0)
			break;
		len += n;
	}
	fclose(f);
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int tls_read_pem(const char *path, char **out, char *err, size_t errlen)
{
	return read_file(path, out, err, errlen);
}

int tls_listener_pem(const char *role, unsigned *gen, char **cert, char **key, char **ca,
		     char *err, size_t errlen)
{
	char *c = NULL, *k = NULL, *a = NULL, *pc = NULL, *pk = NULL, *pa = NULL;
	unsigned g = 0;
	int rc = 0, found = 0;

	*cert = *key = *ca = NULL;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	for (size_t i = 0; i < n_lst; i++)
		if (strcmp(lst[i].role, role) == 0) { /* the last one wins, as in _mode */
			found = 1;
			g = lst[i].gen;
			free(pc);
			free(pk);
			free(pa);
			pc = sdb_strdup(lst[i].cert);
			pk = sdb_strdup(lst[i].key);
			pa = lst[i].ca ? sdb_strdup(lst[i].ca) : NULL;
		}
	uv_mutex_unlock(&mu);
	if (!found)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "tls: no listener for %s", role);
	if (*gen == g)
		goto out; /* unchanged */
	if ((rc = read_file(pc, &c, err, errlen)) != 0 ||
	    (rc = read_file(pk, &k, err, errlen)) != 0 ||
	    (pa && (rc = read_file(pa, &a, err, errlen)) != 0)) {
		free(c);
		free(k);
		free(a);
		goto out;
	}
	*cert = c;
	*key = k;
	*ca = a;
	*gen = g;
	rc = 1;
out:
	free(pc);
	free(pk);
	free(pa);
	return rc;
}

tls_conn *tls_conn_new(tls_listener *l)
{
	tls_conn *c = NULL;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	for (size_t i = 0; i < n_lst; i++) {
		if (&lst[i] != l)
			continue;
		c = sdb_calloc(1, sizeof *c);
		c->ssl = SSL_new(lst[i].ctx);
		c->rbio = BIO_new(BIO_s_mem());
		c->wbio = BIO_new(BIO_s_mem());
		if (!c->ssl || !c->rbio || !c->wbio) {
			BIO_free(c->rbio);
			BIO_free(c->wbio);
			SSL_free(c->ssl);
			free(c);
			c = NULL;
			break;
		}
		SSL_set_bio(c->ssl, c->rbio, c->wbio);
		SSL_set_accept_state(c->ssl);
		break;
	}
	uv_mutex_unlock(&mu);
	return c;
}

void tls_conn_free(tls_conn *c)
{
	if (!c)
		return;
	SSL_free(c->ssl);
	free(c);
}

static void flush(tls_conn *c, tls_out_fn send, void *arg)
{
	uint8_t buf[16384];
	int n;
	while ((n = BIO_read(c->wbio, buf, sizeof buf)) > 0)
		send(arg, buf, (size_t)n);
}

int tls_conn_feed(tls_conn *c, const uint8_t *in, size_t len, tls_out_fn plain, tls_out_fn send,
		  void *arg)
{
	uint8_t buf[16384];
	int n, e;

	while (len > 0) {
		int w = BIO_write(c->rbio, in, len > 1 << 20 ? 1 << 20 : (int)len);
		if (w <= 0)
			return SDB_EPROTO;
		in += w;
		len -= (size_t)w;
	}
	if (!SSL_is_init_finished(c->ssl)) {
		n = SSL_do_handshake(c->ssl);
		flush(c, send, arg);
		if (n <= 0) {
			e = SSL_get_error(c->ssl, n);
			ERR_clear_error();
			return e == SSL_ERROR_WANT_READ ? 0 : SDB_EPROTO;
		}
	}
	for (;;) {
		n = SSL_read(c->ssl, buf, sizeof buf);
		if (n > 0) {
			plain(arg, buf, (size_t)n);
			continue;
		}
		e = SSL_get_error(c->ssl, n);
		ERR_clear_error();
		flush(c, send, arg);
		if (e == SSL_ERROR_ZERO_RETURN)
			return 1; /* close_notify */
		return e == SSL_ERROR_WANT_READ ? 0 : SDB_EPROTO;
	}
}

int tls_conn_write(tls_conn *c, const uint8_t *data, size_t len, tls_out_fn send, void *arg)
{
	while (len > 0) {
		int chunk = len > 1 << 20 ? 1 << 20 : (int)len;
		int n = SSL_write(c->ssl, data, chunk);
		if (n <= 0) {
			ERR_clear_error();
			return SDB_EPROTO;
		}
		flush(c, send, arg);
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

bool tls_conn_ready(const tls_conn *c)
{
	return SSL_is_init_finished(c->ssl) == 1;
}
