/* Role runner: one thread and one libuv loop per role; graceful stop on SIGTERM/SIGINT.
 * See role.h. */
#include "common/role.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <pthread.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"

/* SIGHUP reload hooks (sdb_on_sighup), registered by the code that owns each reload,
 * mostly while the roles start; guarded by sighup_mu. */
typedef struct sighup_hook {
	const char *what, *kept;
	sdb_reload_fn fn;
} sighup_hook;
static pthread_mutex_t sighup_mu = PTHREAD_MUTEX_INITIALIZER;
static sighup_hook sighup[SDB_SIGHUP_MAX];
static size_t n_sighup;

void sdb_on_sighup(const char *what, const char *kept, sdb_reload_fn fn)
{
	pthread_mutex_lock(&sighup_mu);
	for (size_t i = 0; i < n_sighup; i++)
		if (sighup[i].fn == fn)
			goto out; /* registered already */
	if (n_sighup < SDB_SIGHUP_MAX)
		sighup[n_sighup++] = (sighup_hook){what, kept, fn};
	else
		sdb_log(SDB_LOG_ERROR, "SIGHUP: too many reload hooks, ignoring one", "what=\"%s\"",
			what);
out:
	pthread_mutex_unlock(&sighup_mu);
}

/* Run every SIGHUP hook in registration order, logging each failure. Main thread. */
static void run_sighup_hooks(void)
{
	sighup_hook hooks[SDB_SIGHUP_MAX];
	size_t n;

	pthread_mutex_lock(&sighup_mu); /* a copy: a hook may take its time */
	n = n_sighup;
	memcpy(hooks, sighup, n * sizeof *hooks);
	pthread_mutex_unlock(&sighup_mu);
	for (size_t i = 0; i < n; i++) {
		char rerr[256] = "";
		char msg[128];
		if (hooks[i].fn(rerr, sizeof rerr) == 0)
			continue;
		snprintf(msg, sizeof msg, "SIGHUP: %s reload failed, keeping the old %s",
			 hooks[i].what, hooks[i].kept);
		sdb_log(SDB_LOG_ERROR, msg, "err=\"%s\"", rerr);
	}
}

enum { ST_NEW, ST_STARTING, ST_RUNNING, ST_STOPPING, ST_STOPPED, ST_FAILED };

/* Allowed lifecycle transitions (CONVENTIONS.md: explicit state machines). */
static int transition_ok(int from, int to)
{
	switch (from) {
	case ST_NEW:
		return to == ST_STARTING;
	case ST_STARTING:
		return to == ST_RUNNING || to == ST_FAILED;
	case ST_RUNNING:
		return to == ST_STOPPING;
	case ST_STOPPING:
		return to == ST_STOPPED;
	default:
		return 0;
	}
}

static void set_state(sdb_role *r, int to)
{
#ifdef SDB_DEBUG
	if (!transition_ok(r->state, to)) {
		fprintf(stderr, "stripedb: role %s: bad state transition %d -> %d\n", r->def->name,
			r->state, to);
		abort();
	}
#else
	(void)transition_ok;
#endif
	__atomic_store_n(&r->state, to, __ATOMIC_RELEASE);
}

static const sdb_role_def *const all_roles[] = {
	&sdb_role_metadata, &sdb_role_proxy, &sdb_role_coordinator, &sdb_role_ratelimit,
	&sdb_role_shard,
};

const sdb_role_def *sdb_role_find(const char *name)
{
	for (size_t i = 0; i < sizeof all_roles / sizeof all_roles[0]; i++) {
		if (strcmp(all_roles[i]->name, name) == 0) {
			return all_roles[i];
		}
	}
	return NULL;
}

static void close_cb(uv_handle_t *h)
{
	(void)h;
}

void sdb_role_stopped(sdb_role *r)
{
	set_state(r, ST_STOPPED);
	uv_close((uv_handle_t *)&r->stop_async, close_cb);
	uv_timer_stop(&r->stop_timer);
	uv_close((uv_handle_t *)&r->stop_timer, close_cb);
}

static void stop_timeout_cb(uv_timer_t *t)
{
	sdb_role *r = t->data;

	sdb_log(SDB_LOG_ERROR, "graceful stop timed out, forcing exit", NULL);
	(void)r;
	_exit(1);
}

/* The process-wide bound of a graceful stop, on a thread of its own: a role's loop can be
 * blocked in a library call (libmongoc ending sessions on a shard whose host is
 * unreachable waits for its 300 s socket timeout) and then its own stop_timer never
 * fires. arg: the bound in ms (intptr_t). */
static void stop_watchdog(void *arg)
{
	uint64_t ms = (uint64_t)(uintptr_t)arg;
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0) {
		/* EINTR: sleep the rest */
	}
	sdb_log(SDB_LOG_ERROR, "graceful stop timed out, forcing exit", "after_ms=%llu",
		(unsigned long long)ms);
	_exit(1);
}

static void stop_async_cb(uv_async_t *a)
{
	sdb_role *r = a->data;

	if (r->state != ST_RUNNING) {
		return;
	}
	set_state(r, ST_STOPPING);
	sdb_log(SDB_LOG_INFO, "stopping", NULL);
	/* Hard bound: the role's own drain timeout plus 5 s of slack. */
	uv_timer_start(&r->stop_timer, stop_timeout_cb,
		       (uint64_t)sdb_config_get_int(r->cfg, SDB_OPT_shutdown_timeout_ms, 10000) + 5000,
		       0);
	r->def->stop(r);
}

static void walk_leak(uv_handle_t *h, void *arg)
{
	int *n = arg;

	if (!uv_is_closing(h)) {
		sdb_log(SDB_LOG_WARN, "handle left open at stop", "type=%s",
			uv_handle_type_name(uv_handle_get_type(h)));
		uv_close(h, close_cb);
		(*n)++;
	}
}

/* Create DIR if missing and take an exclusive flock on DIR/stripedb.lock (kept for the
 * process lifetime, released by the kernel on exit or crash). Returns 0 or SDB_EIO. */
static int lock_data_dir(sdb_role *r, const char *dir)
{
	char path[4096];
	char pid[32] = "";
	int fd;
	ssize_t n;

	if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
		return sdb_errf(r->err, sizeof r->err, SDB_EIO, "cannot create data dir %s: %s", dir,
				strerror(errno));
	}
	snprintf(path, sizeof path, "%s/stripedb.lock", dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0) {
		return sdb_errf(r->err, sizeof r->err, SDB_EIO, "cannot open %s: %s", path,
				strerror(errno));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		n = read(fd, pid, sizeof pid - 1);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		close(fd);
		return sdb_errf(r->err, sizeof r->err, SDB_EIO,
				"data dir %s is in use by another stripedb process%s%s%s", dir,
				pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "");
	}
	if (ftruncate(fd, 0) == 0) {
		n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
		if (write(fd, pid, (size_t)n) != n) {
			/* the pid is informational only */
		}
	}
	r->lock_fd = fd;
	return 0;
}

/* The node id in every log line: --node-id, else the role's first listen address. */
static void pick_node(sdb_role *r)
{
	static const sdb_opt addrs[] = {SDB_OPT_node_id, SDB_OPT_listen, SDB_OPT_grpc_listen,
					SDB_OPT_http_listen};

	r->node[0] = '\0';
	for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++) {
		const char *v = sdb_config_get(r->cfg, addrs[i]);
		if (v != NULL) {
			snprintf(r->node, sizeof r->node, "%s", v);
			return;
		}
	}
}

/* "ROLE: msg" from a role's own error text would print as "stripedb: ROLE: ROLE: msg". */
static const char *strip_role_prefix(const sdb_role *r)
{
	size_t n = strlen(r->def->name);

	if (strncmp(r->err, r->def->name, n) == 0 && r->err[n] == ':' && r->err[n + 1] == ' ') {
		return r->err + n + 2;
	}
	return r->err;
}

static void role_thread(void *arg)
{
	sdb_role *r = arg;
	uv_loop_t loop;
	int leaks = 0;

	sdb_log_set_thread(r->def->name, r->node[0] ? r->node : NULL);
	uv_loop_init(&loop);
	r->loop = &loop;
	uv_async_init(&loop, &r->stop_async, stop_async_cb);
	r->stop_async.data = r;
	uv_timer_init(&loop, &r->stop_timer);
	r->stop_timer.data = r;
	set_state(r, ST_STARTING);
	r->start_rc = r->def->start(r);
	if (r->start_rc != 0) {
		set_state(r, ST_FAILED);
		uv_close((uv_handle_t *)&r->stop_async, close_cb);
		uv_close((uv_handle_t *)&r->stop_timer, close_cb);
		uv_run(&loop, UV_RUN_DEFAULT);
		uv_loop_close(&loop);
		r->loop = NULL;
		uv_sem_post(&r->started);
		return;
	}
	set_state(r, ST_RUNNING);
	sdb_log(SDB_LOG_INFO, "started", NULL);
	uv_sem_post(&r->started);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_walk(&loop, walk_leak, &leaks);
	uv_run(&loop, UV_RUN_DEFAULT);
	if (uv_loop_close(&loop) != 0) {
		sdb_log(SDB_LOG_ERROR, "event loop did not close cleanly", NULL);
	} else {
		sdb_log(SDB_LOG_INFO, "stopped", "leaked_handles=%d", leaks);
	}
	r->loop = NULL;
}

/* /healthz check per role: healthy only while RUNNING, so a probe never sees "ok" before
 * the role's listeners are open or after shutdown began. */
static int role_health(void *data, char *msg, size_t msglen)
{
	sdb_role *r = data;
	int st = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);

	if (st == ST_RUNNING) {
		return 1;
	}
	snprintf(msg, msglen, "%s", st == ST_NEW || st == ST_STARTING ? "starting"
				    : st == ST_FAILED		   ? "failed to start"
								   : "stopping");
	return 0;
}

int sdb_roles_run(const sdb_config_set *set)
{
	sdb_role *roles = sdb_calloc(set->n_roles, sizeof *roles);
	sigset_t sigs;
	int failed = 0;
	size_t started = 0;
	int exit_code = 0;

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	for (size_t i = 0; i < set->n_roles; i++) {
		roles[i].lock_fd = -1;
	}
	/* every role's /healthz check is registered before any role starts: a probe between
	 * one role's start and the next one's registration would see only running roles and
	 * answer ready while a role of the process is not (a test or an orchestrator then
	 * connects to a listener that is not open yet) */
	for (size_t i = 0; i < set->n_roles && !failed; i++) {
		sdb_role *r = &roles[i];
		const char *data_dir = sdb_config_get(&set->roles[i], SDB_OPT_data_dir);
		r->def = sdb_role_find(set->roles[i].role);
		r->cfg = &set->roles[i];
		r->state = ST_NEW;
		pick_node(r);
		/* the data directories first: a second instance of the same configuration says
		 * its directory is locked, not that the HTTP port is taken */
		if (data_dir != NULL && lock_data_dir(r, data_dir) != 0) {
			fprintf(stderr, "stripedb: %s: %s\n", r->def->name, r->err);
			exit_code = 1;
			failed = 1;
		}
	}
	for (size_t i = 0; i < set->n_roles && !failed; i++) {
		sdb_role *r = &roles[i];
		const char *http = sdb_config_get(&set->roles[i], SDB_OPT_http_listen);
		if (http != NULL) {
			int rc = sdb_http_acquire_cfg(http, &set->roles[i], &r->http, r->err,
						      sizeof r->err);
			if (rc != 0) {
				fprintf(stderr, "stripedb: %s: %s\n", r->def->name, r->err);
				exit_code = rc == SDB_EINVAL ? 2 : 1;
				failed = 1;
				break;
			}
			sdb_http_add_health(r->http, r->def->name, role_health, r);
		}
	}
	for (size_t i = 0; i < set->n_roles && !failed; i++) {
		sdb_role *r = &roles[i];
		uv_sem_init(&r->started, 0);
		uv_thread_create(&r->thread, role_thread, r);
		uv_sem_wait(&r->started);
		started++;
		if (r->start_rc != 0) {
			fprintf(stderr, "stripedb: %s: %s\n", r->def->name, strip_role_prefix(r));
			exit_code = r->start_rc == SDB_EUSAGE || r->start_rc == SDB_EINVAL ? 2 : 1;
			failed = 1;
		}
	}

	if (!failed) {
		/* systemd Type=notify readiness: every role has opened its listeners. A no-op
		 * when not started by systemd (NOTIFY_SOCKET unset). */
		sd_notifyf(0, "READY=1\nSTATUS=serving %zu role(s)\nMAINPID=%lu", set->n_roles,
			   (unsigned long)getpid());
		for (;;) {
			int sig = 0;
			if (sigwait(&sigs, &sig) != 0) {
				continue;
			}
			if (sig == SIGHUP) {
				/* issue #10 and #21: TLS certificates, the cluster key (rotation) */
				sdb_log(SDB_LOG_INFO, "SIGHUP received", "action=reload");
				run_sighup_hooks();
				continue;
			}
			sdb_log(SDB_LOG_INFO, "shutdown requested", "signal=%s",
				sig == SIGTERM ? "SIGTERM" : "SIGINT");
			sd_notify(0, "STOPPING=1");
			break;
		}
	}

	/* Stop every role that is running, then join all started threads, within the
	 * longest role's shutdown-timeout-ms plus 5 s whatever a role's loop is doing. */
	if (started > 0) {
		uint64_t bound = 0;
		uv_thread_t wd;
		for (size_t i = 0; i < set->n_roles; i++) {
			uint64_t t = (uint64_t)sdb_config_get_int(&set->roles[i],
								  SDB_OPT_shutdown_timeout_ms, 10000);
			if (t > bound)
				bound = t;
		}
		bound += 6000; /* after the roles' own bound (their timeout + 5 s) */
		if (sdb_uv_thread_create(&wd, stop_watchdog, (void *)(uintptr_t)bound) != 0)
			sdb_log(SDB_LOG_WARN, "no stop watchdog thread", NULL);
	}
	for (size_t i = 0; i < started; i++) {
		if (roles[i].start_rc == 0) {
			uv_async_send(&roles[i].stop_async);
		}
	}
	for (size_t i = 0; i < started; i++) {
		uv_thread_join(&roles[i].thread);
		uv_sem_destroy(&roles[i].started);
	}
	for (size_t i = 0; i < set->n_roles; i++) {
		if (roles[i].http != NULL) {
			sdb_http_unroute(roles[i].http, &roles[i]);
			sdb_http_release(roles[i].http);
		}
		if (roles[i].lock_fd >= 0) {
			close(roles[i].lock_fd);
		}
	}
	free(roles);
	return exit_code;
}
