/* Cluster key: internal authentication between roles. See auth/cluster.h. */
#include "auth/cluster.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/gate.h"
#include "auth/scram.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/role.h"
#include "tls/tls.h"

#define CLUSTER_KEY_MAX AUTH_CLUSTER_KEY_MAX
#define CLUSTER_ITERATIONS 15000
_Static_assert(AUTH_CLUSTER_KEYS_MAX <= AUTH_GATE_CLUSTER_MAX, "the gate holds every key");
#define CLUSTER_FILE_MAX (AUTH_CLUSTER_KEYS_MAX * (4 * CLUSTER_KEY_MAX + 64))

static uv_mutex_t mu; /* taken through lock_mu (initialised on first use) */
static uv_once_t once = UV_ONCE_INIT;
/* the key file's keys, keys[0] first (outgoing); nkeys == 0: no key loaded */
static char keys[AUTH_CLUSTER_KEYS_MAX][CLUSTER_KEY_MAX + 1];
static size_t nkeys;
static char *key_path;     /* the file loaded, re-read by auth_cluster_reload */
static _Atomic uint64_t generation; /* bumped when the keys change (written under mu) */
static uint8_t salt[28];   /* one SCRAM salt for every key (one server-first for all) */
static auth_gate *gate;    /* set once; never freed (process lifetime) */
/* The first key's PeersV1 token; callers may hold it without a lock (a static gRPC slice),
 * so the tokens of earlier first keys stay allocated, chained (80 bytes per rotation). */
typedef struct token_node {
	struct token_node *prev;
	char s[65];
} token_node;
static token_node *peer_token_node;
static const char *peer_token;
static char peer_tokens[AUTH_CLUSTER_KEYS_MAX][65];

static void init_mu(void)
{
	uv_mutex_init(&mu);
}

/* Lock mu, initialising it on first use. Any thread. */
static void lock_mu(void)
{
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
}

static bool cluster_gate_fn(wire_req *req, void *role_data)
{
	(void)role_data;
	return auth_gate_check(gate, req);
}

static bool b64char(unsigned char c)
{
	return isalnum(c) || c == '+' || c == '/' || c == '=';
}

/* Append the base64 characters of [p, e) (whitespace skipped) to key k (*kn chars).
 * 0 or SDB_EINVAL. */
static int key_append(const char *p, const char *e, char *k, size_t *kn, const char *what,
		      int line, char *err, size_t errlen)
{
	for (; p < e; p++) {
		unsigned char c = (unsigned char)*p;
		if (isspace(c))
			continue;
		if (!b64char(c))
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cluster key file %s: line %d: only base64 characters "
					"(A-Z a-z 0-9 + / =) in a key",
					what, line);
		if (*kn >= CLUSTER_KEY_MAX)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cluster key file %s: line %d: key longer than %d characters",
					what, line, CLUSTER_KEY_MAX);
		k[(*kn)++] = (char)c;
	}
	k[*kn] = '\0';
	return 0;
}

int auth_cluster_parse_keys(const char *text, size_t len, const char *what,
			    char out[][AUTH_CLUSTER_KEY_MAX + 1], size_t *n, char *err,
			    size_t errlen)
{
	const char *p = text, *end = text + len;
	size_t kn = 0;
	bool list = false;
	int line = 0, rc;

	*n = 0;
	if (memchr(text, '\0', len))
		return sdb_errf(err, errlen, SDB_EINVAL, "cluster key file %s: NUL byte", what);
	/* the form: a YAML list when the first non-blank, non-comment line starts with '-' */
	for (const char *q = text; q < end;) {
		const char *e = memchr(q, '\n', (size_t)(end - q));
		const char *b = q;
		e = e ? e : end;
		while (b < e && isspace((unsigned char)*b))
			b++;
		if (b < e && *b != '#') {
			list = *b == '-';
			break;
		}
		q = e < end ? e + 1 : end;
	}
	if (!list) { /* one key; whitespace (line breaks) ignored, as MongoDB does */
		line = 1;
		for (const char *q = text; q < end; q++) {
			if (*q == '\n')
				line++;
			else if ((rc = key_append(q, q + 1, out[0], &kn, what, line, err, errlen)) != 0)
				return rc;
		}
		out[0][kn] = '\0';
		if (kn < 6)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cluster key file %s: key shorter than 6 characters", what);
		*n = 1;
		return 0;
	}
	while (p < end) {
		const char *e = memchr(p, '\n', (size_t)(end - p)), *b = p;
		line++;
		e = e ? e : end;
		while (b < e && isspace((unsigned char)*b))
			b++;
		if (b == e || *b == '#') {
			/* blank or comment */
		} else if (*b == '-') {
			const char *v = b + 1, *ve = e;
			if (v < e && !isspace((unsigned char)*v))
				return sdb_errf(err, errlen, SDB_EINVAL,
						"cluster key file %s: line %d: a list item is '- KEY'",
						what, line);
			if (*n > 0 && kn < 6)
				return sdb_errf(err, errlen, SDB_EINVAL,
						"cluster key file %s: key %zu shorter than 6 characters",
						what, *n);
			if (*n >= AUTH_CLUSTER_KEYS_MAX)
				return sdb_errf(err, errlen, SDB_EINVAL,
						"cluster key file %s: more than %d keys", what,
						AUTH_CLUSTER_KEYS_MAX);
			while (v < ve && isspace((unsigned char)*v))
				v++;
			while (ve > v && isspace((unsigned char)ve[-1]))
				ve--;
			if (ve - v >= 2 && (*v == '\'' || *v == '"') && ve[-1] == *v) {
				v++;
				ve--;
			}
			kn = 0;
			(*n)++;
			out[*n - 1][0] = '\0';
			if ((rc = key_append(v, ve, out[*n - 1], &kn, what, line, err, errlen)) != 0)
				return rc;
		} else if (b > p && *n > 0) { /* indented: continues the item above */
			if ((rc = key_append(b, e, out[*n - 1], &kn, what, line, err, errlen)) != 0)
				return rc;
		} else {
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cluster key file %s: line %d: expected '- KEY' (a YAML list "
					"of keys) or one key alone",
					what, line);
		}
		p = e < end ? e + 1 : end;
	}
	if (*n == 0 || kn < 6)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"cluster key file %s: key %zu shorter than 6 characters", what,
				*n ? *n : 1);
	return 0;
}

/* Read and parse path (mode and size checked) into k[], *n keys. */
static int read_keys(const char *path, char k[][CLUSTER_KEY_MAX + 1], size_t *n, char *err,
		     size_t errlen)
{
	char *buf;
	struct stat st;
	ssize_t r;
	size_t got = 0;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sdb_errf(err, errlen, SDB_EIO, "cluster key file %s: %s", path,
				strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sdb_errf(err, errlen, SDB_EIO, "cluster key file %s: not a regular file", path);
	}
	if (st.st_mode & 077) {
		close(fd);
		return sdb_errf(err, errlen, SDB_EINVAL,
				"cluster key file %s: permissions are too open (chmod 600)", path);
	}
	buf = sdb_malloc(CLUSTER_FILE_MAX);
	while (got < CLUSTER_FILE_MAX && (r = read(fd, buf + got, CLUSTER_FILE_MAX - got)) > 0)
		got += (size_t)r;
	close(fd);
	if (got == CLUSTER_FILE_MAX)
		rc = sdb_errf(err, errlen, SDB_EINVAL, "cluster key file %s: too large", path);
	else
		rc = auth_cluster_parse_keys(buf, got, path, k, n, err, errlen);
	OPENSSL_cleanse(buf, CLUSTER_FILE_MAX);
	free(buf);
	return rc;
}

/* Install k[0..n) as the keys (mu held): SCRAM verifiers with the process's salt, PeersV1
 * tokens, and the gate (made at the first call). */
static int install(char k[][CLUSTER_KEY_MAX + 1], size_t n, char *err, size_t errlen)
{
	auth_scram_creds creds[AUTH_CLUSTER_KEYS_MAX];
	char tok[AUTH_CLUSTER_KEYS_MAX][65];

	if (!gate && RAND_bytes(salt, sizeof salt) != 1) /* MongoDB's length; libmongoc wants it */
		return sdb_errf(err, errlen, SDB_EINTERNAL, "cluster key: no randomness");
	for (size_t i = 0; i < n; i++) {
		uint8_t mac[32];
		unsigned int ml = 0;
		if (auth_scram_verifier(AUTH_SCRAM_SHA256, AUTH_CLUSTER_USER, k[i], salt, sizeof salt,
					CLUSTER_ITERATIONS, &creds[i], err, errlen) != 0)
			return SDB_EINTERNAL;
		HMAC(EVP_sha256(), k[i], (int)strlen(k[i]), (const uint8_t *)"stripedb PeersV1", 16,
		     mac, &ml);
		for (int j = 0; j < 32; j++)
			snprintf(tok[i] + 2 * j, 3, "%02x", mac[j]);
	}
	if (!peer_token || strcmp(peer_token, tok[0]) != 0) {
		token_node *t = sdb_calloc(1, sizeof *t); /* the previous one stays valid */
		memcpy(t->s, tok[0], sizeof t->s);
		t->prev = peer_token_node;
		peer_token_node = t;
		peer_token = t->s;
	}
	memcpy(peer_tokens, tok, sizeof tok);
	for (size_t i = 0; i < AUTH_CLUSTER_KEYS_MAX; i++)
		OPENSSL_cleanse(keys[i], sizeof keys[i]);
	for (size_t i = 0; i < n; i++)
		memcpy(keys[i], k[i], sizeof keys[i]);
	nkeys = n;
	generation++;
	if (gate) {
		auth_gate_set_cluster(gate, creds, n);
	} else {
		auth_gate_opts o;
		memset(&o, 0, sizeof o);
		o.cluster = creds;
		o.n_cluster = n;
		gate = auth_gate_new(&o);
	}
	OPENSSL_cleanse(creds, sizeof creds);
	return 0;
}

static bool same_keys(char k[][CLUSTER_KEY_MAX + 1], size_t n)
{
	if (n != nkeys)
		return false;
	for (size_t i = 0; i < n; i++)
		if (strcmp(k[i], keys[i]) != 0)
			return false;
	return true;
}

int auth_cluster_load(const char *path, char *err, size_t errlen)
{
	char(*k)[CLUSTER_KEY_MAX + 1] = sdb_calloc(AUTH_CLUSTER_KEYS_MAX, sizeof *k);
	size_t n = 0;
	int rc;

	rc = read_keys(path, k, &n, err, errlen);
	if (rc == 0) {
		lock_mu();
		if (gate) {
			if (!same_keys(k, n))
				rc = sdb_errf(err, errlen, SDB_EINVAL,
					      "cluster key file %s: differs from the keys already "
					      "loaded",
					      path);
		} else if ((rc = install(k, n, err, errlen)) == 0) {
			key_path = sdb_strdup(path);
			sdb_info("cluster key loaded", "path=%s keys=%zu", path, n);
		}
		uv_mutex_unlock(&mu);
	}
	if (rc == 0) /* the key file, re-read on SIGHUP (registered once) */
		sdb_on_sighup("cluster key", "keys", auth_cluster_reload);
	OPENSSL_cleanse(k, AUTH_CLUSTER_KEYS_MAX * sizeof *k);
	free(k);
	return rc;
}

int auth_cluster_reload(char *err, size_t errlen)
{
	char(*k)[CLUSTER_KEY_MAX + 1];
	char *path = NULL;
	size_t n = 0;
	int rc;

	lock_mu();
	if (key_path)
		path = sdb_strdup(key_path);
	uv_mutex_unlock(&mu);
	if (!path)
		return 0;
	k = sdb_calloc(AUTH_CLUSTER_KEYS_MAX, sizeof *k);
	rc = read_keys(path, k, &n, err, errlen);
	if (rc == 0) {
		lock_mu();
		if (same_keys(k, n))
			sdb_info("cluster key file reloaded, keys unchanged", "path=%s keys=%zu", path,
				 n);
		else if ((rc = install(k, n, err, errlen)) == 0)
			sdb_info("cluster key file reloaded", "path=%s keys=%zu generation=%llu", path,
				 n, (unsigned long long)generation);
		uv_mutex_unlock(&mu);
	}
	OPENSSL_cleanse(k, AUTH_CLUSTER_KEYS_MAX * sizeof *k);
	free(k);
	free(path);
	return rc;
}

size_t auth_cluster_key_count(void)
{
	size_t n;
	lock_mu();
	n = nkeys;
	uv_mutex_unlock(&mu);
	return n;
}

uint64_t auth_cluster_generation(void)
{
	return atomic_load(&generation); /* lock-free: read on every proxy command */
}

int auth_cluster_setup(const sdb_config *cfg, char *err, size_t errlen)
{
	const char *path = sdb_config_get(cfg, SDB_OPT_cluster_key_file);
	int rc = path ? auth_cluster_load(path, err, errlen) : 0;
	if (rc == SDB_EIO)
		rc = SDB_EINVAL; /* a missing or unreadable key file is a configuration error:
				  * exit 2, as a missing TLS certificate */
	if (rc == 0 && sdb_config_get_bool(cfg, SDB_OPT_tls_internal, 0)) {
		const char *ca = sdb_config_get(cfg, SDB_OPT_tls_ca);
		const char *cert = sdb_config_get(cfg, SDB_OPT_tls_cert);
		if (!ca)
			return sdb_errf(err, errlen, SDB_EUSAGE, "--tls-internal needs --tls-ca");
		rc = auth_cluster_tls_load(ca, cert, sdb_config_get(cfg, SDB_OPT_tls_key), err,
					   errlen);
		if (rc == 0) /* here, not in _load: ctl keeps stderr for its one error line */
			sdb_info("internal TLS configured", "ca=%s client_cert=%s", ca,
				 cert ? cert : "-");
	}
	return rc;
}

/* ---- internal TLS (see cluster.h) ---- */

static char *tls_ca, *tls_cert, *tls_key; /* paths as configured; NULL: internal TLS off */
static char *tls_pem;                     /* the file given to libmongoc: cert+key */
static bool tls_pem_ours;                 /* tls_pem is our temporary file */

static void tls_pem_unlink(void)
{
	if (tls_pem_ours && tls_pem)
		unlink(tls_pem);
}

static bool streq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Do cert (a PEM chain) and key (PEM) parse, and does the key match the certificate?
 * 0, or SDB_EINVAL with OpenSSL's reason. A reload checks this before replacing anything,
 * so a half-written or wrong file keeps the old certificate in use. */
static int pair_check(const char *cert, const char *key, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	int rc = 0;

	if (ctx == NULL)
		return sdb_errf(err, errlen, SDB_EINTERNAL, "tls-internal: SSL_CTX_new failed");
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
		rc = sdb_errf(err, errlen, SDB_EINVAL, "tls-internal: %s: not a PEM certificate",
			      cert);
	else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
		rc = sdb_errf(err, errlen, SDB_EINVAL, "tls-internal: %s: not a PEM private key",
			      key);
	else if (SSL_CTX_check_private_key(ctx) != 1)
		rc = sdb_errf(err, errlen, SDB_EINVAL,
			      "tls-internal: %s does not match the certificate %s", key, cert);
	SSL_CTX_free(ctx);
	return rc;
}

/* Write cert then key (once when they are one file) into a new private file and rename
 * it over tls_pem (or make tls_pem when it is NULL), after pair_check: a bad pair leaves
 * the old file untouched. Called with mu held. */
static int write_combined(char *err, size_t errlen)
{
	const char *dir = getenv("TMPDIR");
	char *c = NULL, *k = NULL, *tmp;
	int fd, rc;
	FILE *f;

	if ((rc = pair_check(tls_cert, tls_key, err, errlen)) != 0)
		return rc;
	if ((rc = tls_read_pem(tls_cert, &c, err, errlen)) != 0)
		return rc;
	if (strcmp(tls_cert, tls_key) == 0)
		k = sdb_strdup("");
	else if ((rc = tls_read_pem(tls_key, &k, err, errlen)) != 0) {
		free(c);
		return rc;
	}
	tmp = sdb_asprintf("%s/stripedb-client-XXXXXX.pem", dir && dir[0] ? dir : "/tmp");
	fd = mkstemps(tmp, 4); /* mode 600 */
	if (fd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "tls-internal: %s: %s", tmp, strerror(errno));
		goto out;
	}
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		rc = sdb_errf(err, errlen, SDB_EIO, "tls-internal: %s: %s", tmp, strerror(errno));
		goto out;
	}
	fputs(c, f);
	if (c[0] && c[strlen(c) - 1] != '\n')
		fputc('\n', f);
	fputs(k, f);
	if (fclose(f) != 0) {
		unlink(tmp);
		rc = sdb_errf(err, errlen, SDB_EIO, "tls-internal: %s: write failed", tmp);
		goto out;
	}
	if (tls_pem) {
		if (rename(tmp, tls_pem) != 0) {
			unlink(tmp);
			rc = sdb_errf(err, errlen, SDB_EIO, "tls-internal: %s: %s", tls_pem,
				      strerror(errno));
		}
	} else {
		tls_pem = tmp;
		tmp = NULL;
		tls_pem_ours = true;
		atexit(tls_pem_unlink);
	}
out:
	free(tmp);
	OPENSSL_cleanse(k, strlen(k));
	free(k);
	free(c);
	return rc;
}

int auth_cluster_tls_load(const char *ca, const char *cert, const char *key, char *err,
			  size_t errlen)
{
	char *t = NULL;
	int rc = 0;

	if (!ca)
		return sdb_errf(err, errlen, SDB_EUSAGE, "--tls-internal needs --tls-ca");
	if (!cert != !key)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--tls-internal: --tls-cert and --tls-key go together");
	/* the CA must be readable now, not at the first connection */
	if ((rc = tls_read_pem(ca, &t, err, errlen)) != 0)
		return rc;
	free(t);
	lock_mu();
	if (tls_ca) {
		if (!streq(tls_ca, ca) || !streq(tls_cert, cert) || !streq(tls_key, key))
			rc = sdb_errf(err, errlen, SDB_EINVAL,
				      "--tls-internal: another role of this process set other "
				      "--tls-ca/--tls-cert/--tls-key");
		goto out;
	}
	tls_ca = sdb_strdup(ca);
	tls_cert = cert ? sdb_strdup(cert) : NULL;
	tls_key = key ? sdb_strdup(key) : NULL;
	if (cert) /* a private copy (also of a combined file): a reload replaces it atomically */
		rc = write_combined(err, errlen);
	if (rc != 0) {
		free(tls_ca);
		free(tls_cert);
		free(tls_key);
		tls_ca = tls_cert = tls_key = NULL;
		goto out;
	}
out:
	uv_mutex_unlock(&mu);
	if (rc == 0) /* the client certificate, rewritten on SIGHUP (registered once) */
		sdb_on_sighup("internal TLS", "client certificate", auth_cluster_tls_reload);
	return rc;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && v[0] ? v : NULL;
}

int auth_cluster_tls_setup_env(char *err, size_t errlen)
{
	const char *t = env("STRIPEDB_TLS_INTERNAL");

	if (!t || !(strcmp(t, "true") == 0 || strcmp(t, "1") == 0 || strcmp(t, "yes") == 0))
		return 0;
	if (!env("STRIPEDB_TLS_CA"))
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"STRIPEDB_TLS_INTERNAL needs STRIPEDB_TLS_CA");
	return auth_cluster_tls_load(env("STRIPEDB_TLS_CA"), env("STRIPEDB_TLS_CERT"),
				     env("STRIPEDB_TLS_KEY"), err, errlen);
}

bool auth_cluster_tls_enabled(void)
{
	bool on;
	lock_mu();
	on = tls_ca != NULL;
	uv_mutex_unlock(&mu);
	return on;
}

int auth_cluster_tls_reload(char *err, size_t errlen)
{
	int rc = 0;
	lock_mu();
	if (tls_ca && tls_cert && tls_pem_ours)
		rc = write_combined(err, errlen);
	if (rc == 0 && tls_cert)
		sdb_info("internal TLS client certificate reloaded", "cert=%s", tls_cert);
	uv_mutex_unlock(&mu);
	return rc;
}

int auth_cluster_tls_pem(char **ca, char **cert, char **key, char *err, size_t errlen)
{
	char *pa = NULL, *pc = NULL, *pk = NULL;
	int rc;

	*ca = *cert = *key = NULL;
	lock_mu();
	if (tls_ca) {
		pa = sdb_strdup(tls_ca);
		pc = tls_cert ? sdb_strdup(tls_cert) : NULL;
		pk = tls_key ? sdb_strdup(tls_key) : NULL;
	}
	uv_mutex_unlock(&mu);
	if (!pa)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "internal TLS is not configured");
	rc = tls_read_pem(pa, ca, err, errlen);
	if (rc == 0 && pc)
		rc = tls_read_pem(pc, cert, err, errlen);
	if (rc == 0 && pk)
		rc = tls_read_pem(pk, key, err, errlen);
	if (rc != 0) {
		free(*ca);
		free(*cert);
		free(*key);
		*ca = *cert = *key = NULL;
	}
	free(pa);
	free(pc);
	free(pk);
	return rc;
}

bool auth_cluster_enabled(void)
{
	bool on;
	lock_mu();
	on = gate != NULL;
	uv_mutex_unlock(&mu);
	return on;
}

bool auth_cluster_derive(const char *label, uint8_t out[32])
{
	uint8_t all[1][32];
	if (auth_cluster_derive_all(label, all, 1) == 0)
		return false;
	memcpy(out, all[0], 32);
	OPENSSL_cleanse(all, sizeof all);
	return true;
}

size_t auth_cluster_derive_all(const char *label, uint8_t out[][32], size_t max)
{
	size_t n;
	lock_mu();
	n = nkeys < max ? nkeys : max;
	for (size_t i = 0; i < n; i++) {
		unsigned int ml = 0;
		HMAC(EVP_sha256(), keys[i], (int)strlen(keys[i]), (const uint8_t *)label,
		     strlen(label), out[i], &ml);
	}
	uv_mutex_unlock(&mu);
	return n;
}

wire_gate_fn auth_cluster_gate(void)
{
	return auth_cluster_enabled() ? cluster_gate_fn : NULL;
}

bool auth_cluster_uri_apply(mongoc_uri_t *uri)
{
	bool ok = true;
	lock_mu();
	if (gate)
		ok = mongoc_uri_set_username(uri, AUTH_CLUSTER_USER) &&
		     mongoc_uri_set_password(uri, keys[0]) &&
		     mongoc_uri_set_auth_source(uri, "admin") &&
		     mongoc_uri_set_auth_mechanism(uri, "SCRAM-SHA-256");
	/* issue #10: internal TLS; explicit options of the URI win */
	if (ok && tls_ca && !mongoc_uri_has_option(uri, MONGOC_URI_TLS) &&
	    !mongoc_uri_has_option(uri, MONGOC_URI_SSL))
		ok = mongoc_uri_set_option_as_bool(uri, MONGOC_URI_TLS, true);
	if (ok && tls_ca && !mongoc_uri_has_option(uri, MONGOC_URI_TLSCAFILE))
		ok = mongoc_uri_set_option_as_utf8(uri, MONGOC_URI_TLSCAFILE, tls_ca);
	if (ok && tls_pem && !mongoc_uri_has_option(uri, MONGOC_URI_TLSCERTIFICATEKEYFILE))
		ok = mongoc_uri_set_option_as_utf8(uri, MONGOC_URI_TLSCERTIFICATEKEYFILE, tls_pem);
	uv_mutex_unlock(&mu);
	return ok;
}

const char *auth_cluster_peer_token(void)
{
	const char *t;
	lock_mu();
	t = gate ? peer_token : NULL;
	uv_mutex_unlock(&mu);
	return t;
}

bool auth_cluster_reserved_name(const char *name, char *msg, size_t msglen)
{
	if (name == NULL || !auth_cluster_enabled() ||
	    strncmp(name, AUTH_CLUSTER_RESERVED_LIMIT_PREFIX,
		    sizeof AUTH_CLUSTER_RESERVED_LIMIT_PREFIX - 1) != 0)
		return false;
	snprintf(msg, msglen,
		 "name '%.100s': the prefix " AUTH_CLUSTER_RESERVED_LIMIT_PREFIX
		 " is reserved for the cluster's own limits",
		 name);
	return true;
}

bool auth_cluster_peer_token_ok(const char *value, size_t len)
{
	bool ok = false;
	lock_mu();
	if (!gate)
		ok = true;
	else if (value && len == 64)
		for (size_t i = 0; i < nkeys; i++) /* every key: no early exit */
			ok |= CRYPTO_memcmp(value, peer_tokens[i], 64) == 0;
	uv_mutex_unlock(&mu);
	return ok;
}

mongoc_client_t *auth_cluster_client_new(const char *s)
{
	mongoc_uri_t *u = mongoc_uri_new(s);
	mongoc_client_t *c = NULL;
	if (!u)
		return NULL;
	if (auth_cluster_uri_apply(u))
		c = mongoc_client_new_from_uri(u);
	mongoc_uri_destroy(u);
	return c;
}

/* ------------------------------------------------------------------ peer commands */

typedef struct cluster_cmd_work {
	uv_work_t work;
	char *host;
	char *what;
	bson_t cmd;
	bson_t reply; /* initialised by cluster_cmd_run (empty when no client) */
	bool ok;
	auth_cluster_command_cb cb;
	void *arg;
	sdb_log_ctx log; /* the loop thread's log context, for the thread-pool thread */
} cluster_cmd_work;

/* Idle clients of peer commands, kept for the next command to the same host: a new client
 * costs a TCP connection, a SCRAM-SHA-256 conversation (PBKDF2 on both ends) and, with
 * internal TLS, a handshake; the shard's causal reads ask the primary for a no-op each
 * time their T is ahead of the oplog (src/shard/repl_causal.c). A client is taken out
 * while a command runs (a mongoc_client_t is one thread's at a time), put back after a
 * command the peer answered, destroyed after a network error; one idle longer than
 * PEER_IDLE_MS is dropped when next seen (libmongoc itself re-checks a socket idle for
 * 5 s before using it). Under peer_mu. */
#define PEER_IDLE_MAX 8
#define PEER_IDLE_MS 60000
static struct peer_idle {
	char *host;
	mongoc_client_t *client;
	uint64_t since_ms;
} peer_idle[PEER_IDLE_MAX];
static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;

static mongoc_client_t *peer_client_take(const char *host)
{
	mongoc_client_t *c = NULL, *old[PEER_IDLE_MAX];
	size_t nold = 0;
	uint64_t now = sdb_mono_ms();

	pthread_mutex_lock(&peer_mu);
	for (size_t i = 0; i < PEER_IDLE_MAX; i++) {
		struct peer_idle *p = &peer_idle[i];
		if (!p->client)
			continue;
		if (now - p->since_ms > PEER_IDLE_MS) {
			old[nold++] = p->client;
		} else if (!c && strcmp(p->host, host) == 0) {
			c = p->client;
		} else {
			continue;
		}
		free(p->host);
		p->host = NULL;
		p->client = NULL;
	}
	pthread_mutex_unlock(&peer_mu);
	for (size_t i = 0; i < nold; i++)
		mongoc_client_destroy(old[i]);
	return c;
}

static void peer_client_put(const char *host, mongoc_client_t *c)
{
	mongoc_client_t *evict = NULL;
	size_t slot = 0;

	pthread_mutex_lock(&peer_mu);
	for (size_t i = 0; i < PEER_IDLE_MAX; i++) {
		if (!peer_idle[i].client) {
			slot = i;
			break;
		}
		if (peer_idle[i].since_ms < peer_idle[slot].since_ms)
			slot = i; /* full: the longest idle goes */
	}
	if (peer_idle[slot].client) {
		evict = peer_idle[slot].client;
		free(peer_idle[slot].host);
	}
	peer_idle[slot].host = sdb_strdup(host);
	peer_idle[slot].client = c;
	peer_idle[slot].since_ms = sdb_mono_ms();
	pthread_mutex_unlock(&peer_mu);
	if (evict)
		mongoc_client_destroy(evict);
}

static void cluster_cmd_run(uv_work_t *w)
{
	cluster_cmd_work *cw = w->data;
	mongoc_client_t *c;
	bson_error_t e;

	sdb_log_set_thread_ctx(&cw->log); /* a shared libuv pool thread: lines as the role's */
	c = peer_client_take(cw->host);

	if (!c) {
		char *uri = sdb_asprintf("mongodb://%s/?directConnection=true&connectTimeoutMS=1000&"
					 "serverSelectionTimeoutMS=2000&socketTimeoutMS=2000",
					 cw->host);
		c = auth_cluster_client_new(uri);
		free(uri);
	}
	if (!c) {
		bson_init(&cw->reply);
		return;
	}
	cw->ok = mongoc_client_command_simple(c, "admin", &cw->cmd, NULL, &cw->reply, &e);
	if (!cw->ok) {
		char *j = bson_as_relaxed_extended_json(&cw->reply, NULL);
		sdb_debug("cluster: a command to a peer failed, will retry", "what=%s peer=%s "
			  "err=\"%s\" reply=%s", cw->what, cw->host, e.message, j ? j : "");
		bson_free(j);
	}
	/* the peer answered (ok or a command error): the connection is sound */
	if (cw->ok || e.domain == MONGOC_ERROR_SERVER || e.domain == MONGOC_ERROR_WRITE_CONCERN)
		peer_client_put(cw->host, c);
	else
		mongoc_client_destroy(c);
}

static void cluster_cmd_after(uv_work_t *w, int status)
{
	cluster_cmd_work *cw = w->data;
	if (status != 0) /* canceled before it ran: no reply was made */
		bson_init(&cw->reply);
	cw->cb(cw->arg, cw->ok, &cw->reply);
	bson_destroy(&cw->reply);
	bson_destroy(&cw->cmd);
	free(cw->host);
	free(cw->what);
	free(cw);
}

int auth_cluster_command_async(uv_loop_t *loop, const char *host, const bson_t *cmd,
			       const char *what, auth_cluster_command_cb cb, void *arg)
{
	cluster_cmd_work *cw = sdb_calloc(1, sizeof *cw);
	cw->host = sdb_strdup(host);
	cw->what = sdb_strdup(what);
	bson_copy_to(cmd, &cw->cmd);
	cw->cb = cb;
	cw->arg = arg;
	cw->work.data = cw;
	sdb_log_get_thread(&cw->log);
	if (uv_queue_work(loop, &cw->work, cluster_cmd_run, cluster_cmd_after) != 0) {
		bson_destroy(&cw->cmd);
		free(cw->host);
		free(cw->what);
		free(cw);
		return SDB_EIO;
	}
	return 0;
}

/* ------------------------------------------------------------------ client side */

/* The payload of a SASL reply as a NUL-terminated string in out (outlen bytes). */
static bool sasl_payload(const bson_t *reply, char *out, size_t outlen)
{
	const uint8_t *data = NULL;
	uint32_t len = 0;

	if (!auth_sasl_payload(reply, &data, &len) || len >= outlen ||
	    memchr(data, '\0', len) != NULL)
		return false;
	memcpy(out, data, len);
	out[len] = '\0';
	return true;
}

static bool reply_flag(const bson_t *reply, const char *name)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, reply, name) && bson_iter_as_bool(&it);
}

/* One SASL step: run cmd, 0 when it answered ok: 1 (payload and done read), else an
 * error naming what. */
static int sasl_step(auth_cluster_run_fn run, void *arg, const bson_t *cmd, bson_t *reply,
		     char *payload, size_t plen, bool *done, char *err, size_t errlen)
{
	bson_iter_t it;
	int rc = run(arg, cmd, reply, err, errlen);

	if (rc != 0)
		return rc;
	if (!reply_flag(reply, "ok")) {
		const char *msg = bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it)
					  ? bson_iter_utf8(&it, NULL)
					  : "no message";
		return sdb_errf(err, errlen, SDB_EAUTH, "authentication refused: %s", msg);
	}
	if (!sasl_payload(reply, payload, plen))
		return sdb_errf(err, errlen, SDB_EPROTO, "authentication: no payload in the answer");
	*done = reply_flag(reply, "done");
	return 0;
}

int auth_cluster_authenticate(auth_cluster_run_fn run, void *arg, char *err, size_t errlen)
{
	char password[CLUSTER_KEY_MAX + 1], first[128], server_first[AUTH_SCRAM_MAX_MSG + 1],
		final[AUTH_SCRAM_MAX_MSG + 1], expect[AUTH_SCRAM_SERVER_FINAL_MAX],
		server_final[AUTH_SCRAM_MAX_MSG + 1], nonce[48];
	uint8_t raw[24];
	bson_t cmd, reply;
	bson_iter_t it;
	int32_t conv = 0;
	bool done = false;
	int rc;

	lock_mu();
	if (gate == NULL || nkeys == 0) {
		uv_mutex_unlock(&mu);
		return 0;
	}
	memcpy(password, keys[0], sizeof password);
	uv_mutex_unlock(&mu);
	if (RAND_bytes(raw, sizeof raw) != 1 || auth_b64_encode(raw, sizeof raw, nonce, sizeof nonce) < 0) {
		rc = sdb_errf(err, errlen, SDB_EINTERNAL, "authentication: no randomness");
		goto out;
	}
	snprintf(first, sizeof first, "n,,n=" AUTH_CLUSTER_USER ",r=%s", nonce);
	/* MongoDB auth spec, SCRAM: saslStart {mechanism, payload: client-first} */
	bson_init(&cmd);
	BSON_APPEND_INT32(&cmd, "saslStart", 1);
	BSON_APPEND_UTF8(&cmd, "mechanism", "SCRAM-SHA-256");
	bson_append_binary(&cmd, "payload", -1, BSON_SUBTYPE_BINARY, (const uint8_t *)first,
			   (uint32_t)strlen(first));
	BSON_APPEND_INT32(&cmd, "autoAuthorize", 1);
	BSON_APPEND_UTF8(&cmd, "$db", "admin");
	rc = sasl_step(run, arg, &cmd, &reply, server_first, sizeof server_first, &done, err,
		       errlen);
	bson_destroy(&cmd);
	if (rc == 0 && bson_iter_init_find(&it, &reply, "conversationId") &&
	    BSON_ITER_HOLDS_NUMBER(&it))
		conv = (int32_t)bson_iter_as_int64(&it);
	bson_destroy(&reply);
	if (rc != 0)
		goto out;
	rc = auth_scram_client_final_ex(AUTH_SCRAM_SHA256, AUTH_CLUSTER_USER, password, first + 3,
					server_first, final, sizeof final, expect, err, errlen);
	if (rc != 0)
		goto out;
	bson_init(&cmd);
	BSON_APPEND_INT32(&cmd, "saslContinue", 1);
	BSON_APPEND_INT32(&cmd, "conversationId", conv);
	bson_append_binary(&cmd, "payload", -1, BSON_SUBTYPE_BINARY, (const uint8_t *)final,
			   (uint32_t)strlen(final));
	BSON_APPEND_UTF8(&cmd, "$db", "admin");
	rc = sasl_step(run, arg, &cmd, &reply, server_final, sizeof server_final, &done, err,
		       errlen);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	if (rc != 0)
		goto out;
	/* RFC 5802 §3: the server proves it knows the key too */
	if (strlen(server_final) != strlen(expect) ||
	    CRYPTO_memcmp(server_final, expect, strlen(expect)) != 0) {
		rc = sdb_errf(err, errlen, SDB_EAUTH, "authentication: wrong server signature");
		goto out;
	}
	if (!done) { /* the optional empty last step (auth spec: skipEmptyExchange not asked) */
		bson_init(&cmd);
		BSON_APPEND_INT32(&cmd, "saslContinue", 1);
		BSON_APPEND_INT32(&cmd, "conversationId", conv);
		bson_append_binary(&cmd, "payload", -1, BSON_SUBTYPE_BINARY, (const uint8_t *)"", 0);
		BSON_APPEND_UTF8(&cmd, "$db", "admin");
		rc = sasl_step(run, arg, &cmd, &reply, server_final, sizeof server_final, &done,
			       err, errlen);
		bson_destroy(&cmd);
		bson_destroy(&reply);
		if (rc == 0 && !done)
			rc = sdb_errf(err, errlen, SDB_EPROTO,
				      "authentication: the conversation did not end");
	}
out:
	OPENSSL_cleanse(password, sizeof password);
	OPENSSL_cleanse(final, sizeof final);
	return rc;
}
