/* Rate-limit peer membership through the metadata service: see membership.h. */
#include "ratelimit/membership.h"

#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metauri.h"

#define POLL_MAX_MS 1000
#define RETRY_MS 250
#define DUPLICATE_KEY 11000 /* the metadata's refusal of an address another instance holds */

enum reg_result { REG_OK, REG_DUPLICATE, REG_FAILED };

struct rl_membership {
	char *uri;       /* the watch client's: socket timeout above one long poll */
	char *lease_uri; /* the renewal client's: every timeout lease_ms / 6 (call_ms) */
	char *advertise;
	char *kind;
	char instance[17]; /* random per process start, hex */
	int64_t lease_ms;
	int64_t call_ms;  /* per-call timeout of a renewal */
	int64_t retry_ms; /* pause after a failed renewal */
	rl_cluster *cl;
	mongoc_client_t *first; /* the renewal client of the start, handed to the thread */
	int64_t next_renew;     /* sdb_mono_ms of the first renewal after the start (0: now) */
	pthread_t watcher, renewer;
	bool watcher_started, renewer_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
};

/* Sleep up to ms unless stopping; returns true when stopping. */
static bool nap(rl_membership *m, int64_t ms)
{
	bool stop;

	pthread_mutex_lock(&m->mu);
	if (!m->stopping && ms > 0)
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

/* One registration (or renewal) of this instance's address. *logged: a failure was
 * logged and not yet followed by a success (one line per streak); err gets the message
 * of a refusal (REG_DUPLICATE). */
static enum reg_result do_register(rl_membership *m, mongoc_client_t *c, bool *logged,
				   char *err, size_t errlen, int64_t *lease_left)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	enum reg_result r = REG_OK;

	BSON_APPEND_UTF8(&cmd, "registerRatelimitPeer", m->advertise);
	BSON_APPEND_UTF8(&cmd, "kind", m->kind);
	BSON_APPEND_INT64(&cmd, "ttlMS", m->lease_ms);
	BSON_APPEND_UTF8(&cmd, "instance", m->instance);
	if (!run(c, &cmd, &reply, &e)) {
		r = e.code == DUPLICATE_KEY ? REG_DUPLICATE : REG_FAILED;
		if (r == REG_DUPLICATE && err != NULL)
			snprintf(err, errlen, "%s", e.message);
		bson_iter_t it;
		if (r == REG_DUPLICATE && lease_left != NULL &&
		    bson_iter_init_find(&it, &reply, "leaseLeftMS") && BSON_ITER_HOLDS_NUMBER(&it))
			*lease_left = bson_iter_as_int64(&it);
		if (!*logged) {
			if (r == REG_DUPLICATE)
				sdb_error("ratelimit: peer registration refused by metadata, retrying"
					  " (not in any ring meanwhile)",
					  "addr=%s error=\"%s\"", m->advertise, e.message);
			else
				sdb_warn("ratelimit: peer registration in metadata failed, retrying",
					 "error=\"%s\"", e.message);
			*logged = true;
		}
	} else if (*logged) {
		sdb_info("ratelimit: peer registered in metadata", "addr=%s", m->advertise);
		*logged = false;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return r;
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
 * and ring updates by that much after a metadata election or restart; a fresh one
 * discovers the current leader from every --metadata seed (hello's primary). */
static bool fail(rl_membership *m, mongoc_client_t **c, int64_t ms)
{
	mongoc_client_destroy(*c);
	*c = NULL;
	return nap(m, ms);
}

/* The watcher: long-polls the membership version and installs each new member list. */
static void *watch_main(void *arg)
{
	rl_membership *m = arg;
	mongoc_client_t *c = NULL;
	int64_t version = -1;

	sdb_log_set_thread_role("ratelimit"); /* the node id: from the thread that started it */
	while (!stopping(m)) {
		int64_t v;

		if (c == NULL) {
			c = auth_cluster_client_new(m->uri);
			if (c == NULL) {
				if (nap(m, RETRY_MS))
					break;
				continue;
			}
		}
		v = version < 0 ? 0 : wait_version(c, version, POLL_MAX_MS);
		if (v < 0) {
			if (fail(m, &c, RETRY_MS))
				break;
			continue;
		}
		if (v != version || version < 0) {
			int64_t got = refresh(m, c);
			if (got >= 0)
				version = got;
			else if (fail(m, &c, RETRY_MS))
				break;
		}
	}
	if (c != NULL)
		mongoc_client_destroy(c);
	return NULL;
}

/* The renewer: registers every lease/3 on a client of its own whose every timeout is
 * call_ms (lease/6), so a metadata leader that hangs (SIGSTOP: TCP accepted, no answer)
 * costs one short timeout, after which a fresh client finds the new leader well within
 * the lease; a long poll of the watcher never delays a renewal. On stop it deregisters
 * this instance (the metadata removes the address only while this instance holds it). */
static void *renew_main(void *arg)
{
	rl_membership *m = arg;
	mongoc_client_t *c = m->first;
	int64_t next = m->next_renew;
	bool logged = false;

	m->first = NULL;
	sdb_log_set_thread_role("ratelimit"); /* the node id: from the thread that started it */
	while (!stopping(m)) {
		int64_t now = (int64_t)sdb_mono_ms();

		if (now < next) {
			if (nap(m, next - now))
				break;
			continue;
		}
		if (c == NULL) {
			c = auth_cluster_client_new(m->lease_uri);
			if (c == NULL) {
				next = now + m->retry_ms;
				continue;
			}
		}
		if (do_register(m, c, &logged, NULL, 0, NULL) == REG_OK) {
			next = now + m->lease_ms / 3;
		} else {
			mongoc_client_destroy(c);
			c = NULL;
			next = (int64_t)sdb_mono_ms() + m->retry_ms;
		}
	}
	if (c == NULL)
		c = auth_cluster_client_new(m->lease_uri);
	if (c != NULL) {
		/* leave at once rather than after the lease (best effort) */
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		BSON_APPEND_UTF8(&cmd, "deregisterRatelimitPeer", m->advertise);
		BSON_APPEND_UTF8(&cmd, "instance", m->instance);
		run(c, &cmd, &reply, &e);
		bson_destroy(&reply);
		bson_destroy(&cmd);
		mongoc_client_destroy(c);
	}
	return NULL;
}

/* Release m and what it owns; its threads are not running (never started, or joined). */
static void membership_free(rl_membership *m)
{
	if (m->first != NULL)
		mongoc_client_destroy(m->first);
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	free(m->uri);
	free(m->lease_uri);
	free(m->advertise);
	free(m->kind);
	free(m);
}

/* A random instance id for this process start (16 hex digits). */
static void new_instance(char out[17])
{
	uint64_t r = 0;

	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = sdb_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)sdb_wall_ms();
	snprintf(out, 17, "%016llx", (unsigned long long)r);
}

/* The first registration, before the role reports itself started: an address that
 * another live process holds (a duplicate --advertise) is refused by the metadata; this
 * waits for that lease to lapse (the holder may be a predecessor killed without
 * deregistering), up to one lease of its own or the holder's lease left as the first
 * refusal reports it (leaseLeftMS: a predecessor may have had a longer lease), whichever
 * is longer, +1 s, and then fails, so the process exits non-zero with the reason. When the metadata cannot be reached now the threads keep trying (a refusal
 * seen later is logged as an error and retried). Returns 0 or SDB_EEXISTS (err set). */
static int first_registration(rl_membership *m, char *err, size_t errlen)
{
	int64_t deadline = (int64_t)sdb_mono_ms() + m->lease_ms + 1000;
	bool logged = false, extended = false;
	char why[512] = "";

	for (;;) {
		int64_t t0 = (int64_t)sdb_mono_ms(), left = -1;
		enum reg_result r;

		if (m->first == NULL)
			m->first = auth_cluster_client_new(m->lease_uri);
		if (m->first == NULL)
			return 0;
		r = do_register(m, m->first, &logged, why, sizeof why, &left);
		/* only the first refusal's figure: a live holder renews, and waiting on its
		 * renewed lease would wait for ever */
		if (r == REG_DUPLICATE && !extended && left >= 0) {
			extended = true;
			if (t0 + left + 1000 > deadline)
				deadline = t0 + left + 1000;
		}
		if (r == REG_OK) {
			m->next_renew = t0 + m->lease_ms / 3;
			return 0;
		}
		if (r == REG_FAILED) {
			mongoc_client_destroy(m->first);
			m->first = NULL;
			return 0; /* the renewer retries */
		}
		if ((int64_t)sdb_mono_ms() >= deadline)
			return sdb_errf(err, errlen, SDB_EEXISTS,
					"ratelimit: --advertise %s is registered in metadata by another"
					" live process; refusing to start (%s)",
					m->advertise, why);
		usleep(RETRY_MS * 1000);
	}
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
	/* the watcher: socketTimeoutMS above the longest poll (POLL_MAX_MS) */
	m->uri = sdb_meta_uri(metadata, false, 1000, 1000, POLL_MAX_MS + 1000);
	/* the renewer: lease/6 for everything (250 ms..2 s), well below the renewal period
	 * lease/3, so a hung leader is left for the new one within the lease */
	m->call_ms = lease_ms / 6 < 250 ? 250 : lease_ms / 6 > 2000 ? 2000 : lease_ms / 6;
	m->retry_ms = m->call_ms < RETRY_MS ? m->call_ms : RETRY_MS;
	m->lease_uri = sdb_meta_uri(metadata, false, (int)m->call_ms, (int)m->call_ms,
				    (int)m->call_ms);
	m->advertise = sdb_strdup(advertise);
	m->kind = sdb_strdup(kind);
	m->lease_ms = lease_ms;
	m->cl = cl;
	new_instance(m->instance);
	pthread_mutex_init(&m->mu, NULL);
	sdb_cond_init_mono(&m->cv);
	rv = first_registration(m, err, errlen);
	if (rv != 0) {
		membership_free(m);
		return rv;
	}
	rv = sdb_thread_create(&m->renewer, renew_main, m);
	if (rv == 0) {
		m->renewer_started = true;
		rv = sdb_thread_create(&m->watcher, watch_main, m);
		if (rv == 0)
			m->watcher_started = true;
	}
	if (rv != 0) {
		rl_membership_stop(m);
		return sdb_errf(err, errlen, SDB_EIO, "ratelimit membership: thread: %s",
				strerror(rv));
	}
	sdb_info("ratelimit: peers from metadata",
		 "metadata=%s advertise=%s kind=%s lease_ms=%lld instance=%s", metadata, advertise,
		 kind, (long long)lease_ms, m->instance);
	*out = m;
	return 0;
}

void rl_membership_stop(rl_membership *m)
{
	if (m == NULL)
		return;
	pthread_mutex_lock(&m->mu);
	m->stopping = true;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	if (m->watcher_started)
		pthread_join(m->watcher, NULL);
	if (m->renewer_started)
		pthread_join(m->renewer, NULL);
	membership_free(m);
}
