/* Roles: what a `stripedb --role=ROLE` process runs.
 *
 * Each role runs on its own thread with its own libuv loop (DESIGN.md §2). The runner
 * (sdb_roles_run) starts every requested role, waits for SIGTERM/SIGINT, then asks each
 * role to stop gracefully (stop accepting, drain in-flight work, flush) and joins the
 * threads. A role signals it has finished stopping with sdb_role_stopped(); the runner then
 * closes any handles left on the loop and checks the loop closed cleanly.
 *
 * Lifecycle (checked at runtime in debug builds):
 *   NEW -> STARTING -> RUNNING -> STOPPING -> STOPPED
 *                 \-> FAILED (start returned an error; the process exits 1)
 */
#ifndef SDB_COMMON_ROLE_H
#define SDB_COMMON_ROLE_H

#include <stddef.h>
#include <uv.h>

#include "common/config.h"
#include "common/http.h"

typedef struct sdb_role sdb_role;

typedef struct sdb_role_def {
	const char *name; /* "shard", "proxy", ... */
	/* Called on the role's loop thread. Open listeners, set role->impl. Return 0 or an
	 * SDB_E* code with a one-line message in role->err. On error, stop is not called and
	 * start must have released what it took. */
	int (*start)(sdb_role *role);
	/* Called on the loop thread when shutdown begins. Stop accepting, let in-flight work
	 * finish (bounded by shutdown-timeout-ms), flush, free role->impl's resources, and call
	 * sdb_role_stopped(role) exactly once when done (possibly from a later callback). */
	void (*stop)(sdb_role *role);
} sdb_role_def;

struct sdb_role {
	const sdb_role_def *def;
	const sdb_config *cfg; /* this role's resolved options; valid for the role's life */
	uv_loop_t *loop;       /* the role's own loop */
	sdb_http *http;        /* shared HTTP endpoint, or NULL without --http-listen */
	void *impl;            /* the role's private state */
	char err[256];         /* start failure message */
	/* runner-private */
	int state;
	uv_thread_t thread;
	uv_async_t stop_async;
	uv_timer_t stop_timer;
	uv_sem_t started;
	int start_rc;
	int lock_fd; /* flock on DATA_DIR/stripedb.lock, or -1 */
	char node[64]; /* node id used in logs: --node-id, else the first listen address */
};

/* The role definitions, implemented in their folders. */
extern const sdb_role_def sdb_role_shard;
extern const sdb_role_def sdb_role_proxy;
extern const sdb_role_def sdb_role_metadata;
extern const sdb_role_def sdb_role_coordinator;
extern const sdb_role_def sdb_role_ratelimit;

/* Look a definition up by name; NULL if unknown. */
const sdb_role_def *sdb_role_find(const char *name);

/* Signal from a role's stop() path that it has fully stopped (loop thread only). */
void sdb_role_stopped(sdb_role *role);

/* A SIGHUP reload hook: re-read files (certificates, keys) and swap them in, keeping the
 * old ones on failure. Returns 0, or an SDB_E* code with a message in err. */
typedef int (*sdb_reload_fn)(char *err, size_t errlen);

#define SDB_SIGHUP_MAX 16 /* reload hooks at most */

/* Run fn on every SIGHUP that sdb_roles_run receives, in registration order. On failure
 * the runner logs "SIGHUP: WHAT reload failed, keeping the old KEPT" (an error line with
 * the message); what and kept are static strings. The one list of reloads: each is
 * registered by the code that owns it when it first loads its files (tls/tls.c: the
 * listener certificates, auth/cluster.c: the cluster key and the internal client
 * certificate, auth/raftsec.c: the Raft port's TLS, common/http.c: the --http-tls
 * servers), so no reload calls another. Registering fn again is a no-op; beyond
 * SDB_SIGHUP_MAX hooks an error is logged and fn is ignored. Thread-safe, any time (a
 * SIGHUP runs the hooks registered when it arrives). */
void sdb_on_sighup(const char *what, const char *kept, sdb_reload_fn fn);

/* Run every role of set until SIGTERM/SIGINT and a graceful stop. Before a role with a
 * --data-dir starts, the directory is created if missing and locked (flock on
 * DIR/stripedb.lock, holding the pid), so two processes never share one data directory.
 * Returns: the process exit code (not an SDB_E* status): 0 after a clean shutdown; 2 when
 * a role refused its configuration (start returned SDB_EUSAGE or SDB_EINVAL: a missing
 * flag, an address that does not resolve); 1 for any other start failure (port in use,
 * data dir locked, I/O).
 * Start failures print exactly one line on stderr: "stripedb: ROLE: MESSAGE". */
int sdb_roles_run(const sdb_config_set *set);

#endif
