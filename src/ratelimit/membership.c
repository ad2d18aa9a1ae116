/* Rate-limit peer membership through the metadata service: see membership.h. */
#include "ratelimit/membership.h"

#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metauri.h"

#define POLL_MAX_MS 1000
#define RETRY_MS 250

struct rl_membership {
	char *uri;
	char *advertise;
	char *kind;
	int64_t lease_ms;
	rl_cluster *cl;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
};

/* Sleep up to ms unless stopping; returns true when stopping. */
static bool nap(rl_membership *m, int64_t ms)
{
	bool stop;

	pthread_mutex_lock(&m->mu);
	if (!m->stopping)
		sdb_cond_wait_ms(&m->cv, &m->mu, ms);
	stop = m->stopping;
	pthread_mutex_unlock(&m->mu);
	return stop;
}

static bool stopping(rl_membership *m)
{
	bool s;
	pthread_mutex_lock(&m->mu);
	s = m->stopping;
	pthread_mutex_unlock(&m->mu);
	return s;
}

/* Run cmd on the metadata primary; reply initialised either way (destroy it). */
static bool run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, bson_error_t *e)
{
	return mongoc_client_command_simple(c, "admin", cmd, NULL, reply, e);
}

static bool do_register(rl_membership *m, mongoc_client_t *c, bool *logged)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bool ok;

	BSON_APPEND_UTF8(&cmd, "registerRatelimitPeer", m->advertise);
	BSON_APPEND_UTF8(&cmd, "kind", m->kind);
	BSON_APPEND_INT64(&cmd, "ttlMS", m->lease_ms);
	ok = run(c, &cmd, &reply, &e);
	if (!ok && !*logged) {
		sdb_warn("ratelimit: peer registration in metadata failed, retrying", "error=\"%s\"",
			 e.message);
		*logged = true;
	} else if (ok && *logged) {
		sdb_info("ratelimit: peer registered in metadata", "addr=%s", m->advertise);
		*logged = false;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return ok;
}

/* Read the member list and install it; returns its version, or -1. */
static int64_t refresh(rl_membership *m, mongoc_client_t *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it, arr, doc;
	int64_t version = -1;
	const char **addrs = NULL;
	size_t n = 0, cap = 0;
	char err[256];

	BSON_APPEND_INT32(&cmd, "listRatelimitPeers", 1);
	if (!run(c, &cmd, &reply, &e))
		goto out;
	if (bson_iter_init_find(&it, &reply, "version") && BSON_ITER_HOLDS_NUMBER(&it))
		version = bson_iter_as_int64(&it);
	if (version < 0 || !bson_iter_init_find(&it, &reply, "peers") ||
	    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr)) {
		version = -1;
		goto out;
	}
	while (bson_iter_next(&arr)) {
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &doc) ||
		    !bson_iter_find(&doc, "addr") || !BSON_ITER_HOLDS_UTF8(&doc))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			addrs = sdb_realloc(addrs, cap * sizeof(*addrs));
		}
		addrs[n++] = bson_iter_utf8(&doc, NULL); /* valid while reply lives */
	}
	if (rl_cluster_set_peers(m->cl, addrs, n, (uint64_t)version, err, sizeof err) != 0) {
		sdb_warn("ratelimit: membership from metadata not installed", "error=\"%s\"", err);
		version = -1;
	}
out:
	free(addrs);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return version;
}

/* Long-poll for a version above gt for up to ms; returns the version seen, or -1. */
static int64_t wait_version(mongoc_client_t *c, int64_t gt, int64_t ms)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it;
	int64_t v = -1;

	BSON_APPEND_INT32(&cmd, "waitRatelimitPeers", 1);
	BSON_APPEND_INT64(&cmd, "gt", gt);
	BSON_APPEND_INT64(&cmd, "timeoutMS", ms);
	if (run(c, &cmd, &reply, &e) && bson_iter_init_find(&it, &reply, "version") &&
	    BSON_ITER_HOLDS_NUMBER(&it))
		v = bson_iter_as_int64(&it);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return v;
}

/* After a failed command: a fresh client next time. A single-threaded libmongoc client
 * keeps a server it failed to reach in a 5 s cooldown, which would delay registration
 * and ring updates by that much after a metadata election or restart. */
static bool fail(rl_membership *m, mongoc_client_t **c)
{
	mongoc_client_destroy(*c);
	*c = NULL;
	return nap(m, RETRY_MS);
}

static void *membership_main(void *arg)
{
	rl_membership *m = arg;
	mongoc_client_t *c = NULL;
	int64_t version = -1, next_renew = 0;
	bool logged = false;

	sdb_log_set_thread("ratelimit", NULL);
	while (!stopping(m)) {
		int64_t now = (int64_t)sdb_mono_ms(), wait, v;

		if (c == NULL) {
			c = auth_cluster_client_new(m->uri);
			if (c == NULL) {
				if (nap(m, RETRY_MS))
					break;
				continue;
			}
		}
		if (now >= next_renew) {
			if (do_register(m, c, &logged))
				next_renew = now + m->lease_ms / 3;
			else if (fail(m, &c))
				break;
			else
				continue;
		}
		wait = next_renew - (int64_t)sdb_mono_ms();
		if (wait > POLL_MAX_MS)
			wait = POLL_MAX_MS;
		if (wait < 0)
			wait = 0;
		v = version < 0 ? 0 : wait_version(c, version, wait);
		if (v < 0) {
			if (fail(m, &c))
				break;
			continue;
		}
		if (v != version || version < 0) {
			int64_t got = refresh(m, c);
			if (got >= 0)
				version = got;
			else if (fail(m, &c))
				break;
		}
	}
	if (c != NULL) {
		/* leave at once rather than after the lease (best effort) */
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		BSON_APPEND_UTF8(&cmd, "deregisterRatelimitPeer", m->advertise);
		run(c, &cmd, &reply, &e);
		bson_destroy(&reply);
		bson_destroy(&cmd);
		mongoc_client_destroy(c);
	}
	return NULL;
}

/* Release m and what it owns; its thread is not running (never started, or joined). */
static void membership_free(rl_membership *m)
{
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	free(m->uri);
	free(m->advertise);
	free(m->kind);
	free(m);
}

int rl_membership_start(const char *metadata, const char *advertise, const char *kind,
			int64_t lease_ms, rl_cluster *cl, rl_membership **out, char *err,
			size_t errlen)
{
	rl_membership *m;
	int rv;

	*out = NULL;
	if (lease_ms < 1000 || lease_ms > 600000)
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--ratelimit-lease-ms must be in 1000..600000, got %lld",
				(long long)lease_ms);
	mongoc_init(); /* idempotent; the ratelimit role has no other libmongoc user */
	m = sdb_calloc(1, sizeof(*m));
	/* socketTimeoutMS above the longest poll (POLL_MAX_MS) */
	m->uri = sdb_meta_uri(metadata, false, 1000, 1000, 5000);
	m->advertise = sdb_strdup(advertise);
	m->kind = sdb_strdup(kind);
	m->lease_ms = lease_ms;
	m->cl = cl;
	pthread_mutex_init(&m->mu, NULL);
	sdb_cond_init_mono(&m->cv);
	rv = pthread_create(&m->thread, NULL, membership_main, m);
	if (rv != 0) {
		membership_free(m);
		return sdb_errf(err, errlen, SDB_EIO, "ratelimit membership: thread: %s",
				strerror(rv));
	}
	sdb_info("ratelimit: peers from metadata", "metadata=%s advertise=%s kind=%s lease_ms=%lld",
		 metadata, advertise, kind, (long long)lease_ms);
	*out = m;
	return 0;
}

void rl_membership_stop(rl_membership *m)
{
	if (m == NULL)
		return;
	pthread_mutex_lock(&m->mu);
	m->stopping = true;
	pthread_cond_signal(&m->cv);
	pthread_mutex_unlock(&m->mu);
	pthread_join(m->thread, NULL);
	membership_free(m);
}
