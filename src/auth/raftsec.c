/* Security of the Raft port: --raft-tls, the key derivation and the TLS contexts of the
 * Raft transport. See auth/raftsec.h. */
#include "auth/raftsec.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/role.h"
#include "raft/handshake.h"

#define RAFT_KEY_LABEL "stripedb raft transport v1"
_Static_assert(AUTH_CLUSTER_KEYS_MAX <= SDB_HS_KEYS_MAX, "the handshake accepts every key");

static uv_once_t once = UV_ONCE_INIT;
static uv_mutex_t mu;
static char *f_cert, *f_key, *f_ca; /* NULL: Raft TLS off in this process */
static SSL_CTX *srv, *cli;

static void init_mu(void)
{
	uv_mutex_init(&mu);
}

static int ssl_errf(char *err, size_t errlen, const char *what)
{
	char buf[256];
	unsigned long e = ERR_get_error();
	ERR_error_string_n(e, buf, sizeof buf);
	ERR_clear_error();
	return sdb_errf(err, errlen, SDB_EINVAL, "raft tls: %s: %s", what, e ? buf : "failed");
}

/* A context that presents cert/key and requires a peer certificate signed by ca. */
static int make_ctx(bool server, SSL_CTX **out, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!ctx)
		return ssl_errf(err, errlen, "SSL_CTX_new");
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	/* long-lived member connections: no resumption, every connection verifies */
	SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	if (server)
		SSL_CTX_set_num_tickets(ctx, 0);
	if (SSL_CTX_use_certificate_chain_file(ctx, f_cert) != 1) {
		SSL_CTX_free(ctx);
		return ssl_errf(err, errlen, f_cert);
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, f_key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1) {
		SSL_CTX_free(ctx);
		return ssl_errf(err, errlen, f_key);
	}
	if (SSL_CTX_load_verify_locations(ctx, f_ca, NULL) != 1) {
		SSL_CTX_free(ctx);
		return ssl_errf(err, errlen, f_ca);
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	SSL_CTX_set_verify_depth(ctx, 8);
	if (server) {
		STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(f_ca);
		if (names)
			SSL_CTX_set_client_CA_list(ctx, names);
	}
	*out = ctx;
	return 0;
}

/* Both contexts from the files; on success they replace the current ones. Call with mu. */
static int build(char *err, size_t errlen)
{
	SSL_CTX *s = NULL, *c = NULL;
	int rc = make_ctx(true, &s, err, errlen);
	if (rc == 0)
		rc = make_ctx(false, &c, err, errlen);
	if (rc != 0) {
		SSL_CTX_free(s);
		return rc;
	}
	SSL_CTX_free(srv); /* connections keep their own reference */
	SSL_CTX_free(cli);
	srv = s;
	cli = c;
	return 0;
}

static struct ssl_ctx_st *tls_ctx(bool server, void *arg)
{
	SSL_CTX *ctx;
	(void)arg;
	uv_mutex_lock(&mu);
	ctx = server ? srv : cli;
	if (ctx)
		SSL_CTX_up_ref(ctx);
	uv_mutex_unlock(&mu);
	return ctx;
}

/* sdb_transport_opts.keys: the Raft keys of every key of the key file, now. */
static size_t raft_keys(uint8_t (*out)[32], size_t max, void *arg)
{
	(void)arg;
	return auth_cluster_derive_all(RAFT_KEY_LABEL, out, max);
}

bool auth_raft_is_loopback(const char *hp)
{
	size_t n;

	if (hp[0] == '[')
		return strncmp(hp, "[::1]:", 6) == 0;
	n = strcspn(hp, ":");
	if (n == 9 && strncmp(hp, "localhost", 9) == 0)
		return true;
	return n >= 4 && strncmp(hp, "127.", 4) == 0;
}

int auth_raft_check_mode(const sdb_config *cfg, char *err, size_t errlen)
{
	const char *mode = sdb_config_get(cfg, SDB_OPT_raft_tls);

	if (!mode || strcmp(mode, "auto") == 0 || strcmp(mode, "enabled") == 0 ||
	    strcmp(mode, "disabled") == 0)
		return 0;
	return sdb_errf(err, errlen, SDB_EUSAGE,
			"--raft-tls must be enabled, disabled or auto, not '%s'", mode);
}

int auth_raft_setup(const sdb_config *cfg, sdb_transport_opts *opts, uint8_t key_buf[32],
		    bool *secure, char *err, size_t errlen)
{
	const char *mode = sdb_config_get(cfg, SDB_OPT_raft_tls);
	const char *cert = sdb_config_get(cfg, SDB_OPT_tls_cert);
	const char *key = sdb_config_get(cfg, SDB_OPT_tls_key);
	const char *ca = sdb_config_get(cfg, SDB_OPT_tls_ca);
	const char *raft = sdb_config_get(cfg, SDB_OPT_raft_listen);
	bool explicit_on, has_key, tls;
	int rc = 0;

	uv_once(&once, init_mu);
	*secure = false;
	if (!mode)
		mode = "auto";
	if (strcmp(mode, "disabled") == 0) {
		sdb_warn("raft: the raft transport is plaintext and unauthenticated "
			 "(--raft-tls=disabled): anyone who reaches --raft-listen can read the "
			 "replicated commands and inject Raft messages",
			 "raft_listen=%s", raft ? raft : "-");
		return 0;
	}
	if (strcmp(mode, "enabled") != 0 && strcmp(mode, "auto") != 0)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--raft-tls must be enabled, disabled or auto, not '%s'", mode);
	explicit_on = strcmp(mode, "enabled") == 0;
	has_key = auth_cluster_derive(RAFT_KEY_LABEL, key_buf);
	tls = cert && key && ca;
	if ((cert || key) && !tls && explicit_on)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--raft-tls=enabled with a certificate needs --tls-cert, --tls-key "
				"and --tls-ca (mutual TLS between members)");
	if (!has_key && !tls) {
		if (explicit_on)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"--raft-tls=enabled needs --tls-cert, --tls-key and --tls-ca, "
					"or --cluster-key-file");
		/* auto never falls back to plaintext behind an operator's back: a partial TLS
		 * setup (server TLS for the wire listener) does not secure the Raft port, and a
		 * member reachable from other hosts needs a key or certificates (issue #21:
		 * plaintext only when explicitly chosen). Loopback stays open for laptops. */
		if (cert || key || ca)
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"--raft-tls=auto: --tls-cert, --tls-key and --tls-ca are not all "
					"set, so the Raft port would be plaintext and unauthenticated: set "
					"all three (mutual TLS between members) or --cluster-key-file, or "
					"choose --raft-tls=disabled");
		if (raft && !auth_raft_is_loopback(raft))
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"--raft-tls=auto: --raft-listen=%s is not a loopback address and "
					"neither --cluster-key-file nor --tls-cert/--tls-key/--tls-ca is "
					"set: the Raft port would be plaintext and unauthenticated; set one, "
					"or choose --raft-tls=disabled",
					raft);
		sdb_warn("raft: the raft transport is plaintext and unauthenticated: set "
			 "--cluster-key-file and/or --tls-cert, --tls-key and --tls-ca (or "
			 "--raft-tls=disabled to choose plaintext explicitly)",
			 "raft_listen=%s", raft ? raft : "-");
		return 0;
	}
	memset(opts, 0, sizeof *opts);
	if (has_key) {
		opts->key = key_buf;
		opts->keys = raft_keys; /* key rotation: the current keys at each connection */
	}
	if (tls) {
		uv_mutex_lock(&mu);
		if (!f_cert) {
			f_cert = sdb_strdup(cert);
			f_key = sdb_strdup(key);
			f_ca = sdb_strdup(ca);
			rc = build(err, errlen);
			if (rc != 0) {
				free(f_cert);
				free(f_key);
				free(f_ca);
				f_cert = f_key = f_ca = NULL;
			}
		}
		uv_mutex_unlock(&mu);
		if (rc != 0)
			return rc;
		sdb_on_sighup("Raft TLS", "certificates", auth_raft_reload); /* once */
		opts->tls_ctx = tls_ctx;
	} else {
		sdb_warn("raft: the raft transport authenticates members with the cluster key but "
			 "is not encrypted: set --tls-cert, --tls-key and --tls-ca to encrypt it",
			 "raft_listen=%s", raft ? raft : "-");
	}
	sdb_info("raft: secure transport", "tls=%s cluster_key=%s", tls ? "mutual" : "off",
		 has_key ? "hmac" : "off");
	*secure = true;
	return 0;
}

int auth_raft_reload(char *err, size_t errlen)
{
	int rc = 0;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	if (f_cert) {
		rc = build(err, errlen);
		if (rc == 0)
			sdb_info("raft: tls certificate reloaded", "cert=%s ca=%s", f_cert, f_ca);
	}
	uv_mutex_unlock(&mu);
	return rc;
}
