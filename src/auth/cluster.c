/* Cluster key: internal authentication between roles. See auth/cluster.h. */
#include "auth/cluster.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/gate.h"
#include "auth/scram.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

#define CLUSTER_KEY_MAX 1024
#define CLUSTER_ITERATIONS 15000

static uv_mutex_t mu;
static uv_once_t once = UV_ONCE_INIT;
static char key[CLUSTER_KEY_MAX + 1];
static auth_gate *gate; /* set once; never freed (process lifetime) */
static char peer_token[65];

static void init_mu(void)
{
	uv_mutex_init(&mu);
}

static bool cluster_gate_fn(wire_req *req, void *role_data)
{
	(void)role_data;
	return auth_gate_check(gate, req);
}

int auth_cluster_load(const char *path, char *err, size_t errlen)
{
	char buf[4 * CLUSTER_KEY_MAX], k[CLUSTER_KEY_MAX + 1];
	struct stat st;
	size_t n = 0;
	ssize_t r;
	int fd, rc = 0;

	uv_once(&once, init_mu);
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
	r = read(fd, buf, sizeof buf);
	close(fd);
	if (r < 0 || (size_t)r == sizeof buf)
		return sdb_errf(err, errlen, SDB_EINVAL, "cluster key file %s: unreadable or too large",
				path);
	for (ssize_t i = 0; i < r; i++) {
		unsigned char c = (unsigned char)buf[i];
		if (isspace(c))
			continue;
		if (!(isalnum(c) || c == '+' || c == '/' || c == '=') || n >= CLUSTER_KEY_MAX)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"cluster key file %s: only base64 characters, at most %d",
					path, CLUSTER_KEY_MAX);
		k[n++] = (char)c;
	}
	k[n] = '\0';
	if (n < 6)
		return sdb_errf(err, errlen, SDB_EINVAL, "cluster key file %s: key shorter than 6",
				path);
	uv_mutex_lock(&mu);
	if (gate) {
		if (strcmp(key, k) != 0)
			rc = sdb_errf(err, errlen, SDB_EINVAL,
				      "cluster key file %s: differs from the key already loaded", path);
	} else {
		uint8_t salt[28]; /* MongoDB's SCRAM-SHA-256 salt length; libmongoc insists on it */
		auth_scram_creds creds;
		auth_gate_opts o;
		if (RAND_bytes(salt, sizeof salt) != 1 ||
		    auth_scram_verifier(AUTH_SCRAM_SHA256, AUTH_CLUSTER_USER, k, salt, sizeof salt,
					CLUSTER_ITERATIONS, &creds, err, errlen) != 0) {
			rc = SDB_EINTERNAL;
		} else {
			memcpy(key, k, n + 1);
			{
				uint8_t mac[32];
				unsigned int ml = 0;
				HMAC(EVP_sha256(), key, (int)n, (const uint8_t *)"stripedb PeersV1", 16,
				     mac, &ml);
				for (int i = 0; i < 32; i++)
					snprintf(peer_token + 2 * i, 3, "%02x", mac[i]);
			}
			memset(&o, 0, sizeof o);
			o.cluster = &creds;
			gate = auth_gate_new(&o);
			sdb_info("cluster key loaded", "path=%s", path);
		}
	}
	uv_mutex_unlock(&mu);
	OPENSSL_cleanse(k, sizeof k);
	OPENSSL_cleanse(buf, sizeof buf);
	return rc;
}

int auth_cluster_setup(const sdb_config *cfg, char *err, size_t errlen)
{
	const char *path = sdb_config_get(cfg, SDB_OPT_cluster_key_file);
	return path ? auth_cluster_load(path, err, errlen) : 0;
}

bool auth_cluster_enabled(void)
{
	bool on;
	uv_once(&once, init_mu);
	uv_mutex_lock(&mu);
	on = gate != NULL;
	uv_mutex_unlock(&mu);
	return on;
}

wire_gate_fn auth_cluster_gate(void)
{
	return auth_cluster_enabled() ? cluster_gate_fn : NULL;
}

bool auth_cluster_uri_apply(mongoc_uri_t *uri)
{
	bool ok;
	if (!auth_cluster_enabled())
		return true;
	uv_mutex_lock(&mu);
	ok = mongoc_uri_set_username(uri, AUTH_CLUSTER_USER) && mongoc_uri_set_password(uri, key) &&
	     mongoc_uri_set_auth_source(uri, "admin") &&
	     mongoc_uri_set_auth_mechanism(uri, "SCRAM-SHA-256");
	uv_mutex_unlock(&mu);
	return ok;
}

const char *auth_cluster_peer_token(void)
{
	return auth_cluster_enabled() ? peer_token : NULL;
}

bool auth_cluster_peer_token_ok(const char *value, size_t len)
{
	const char *t = auth_cluster_peer_token();
	if (!t)
		return true;
	return value && len == 64 && CRYPTO_memcmp(value, t, 64) == 0;
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
