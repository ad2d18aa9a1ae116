/* `stripedb demo`: the main job on one command (issue #9).
 *
 *   stripedb demo [--dir DIR] [--cdc embedded|kafka] [--seconds N] [--records N]
 *                 [--threads N] [--shard-members 1|3|5] [--json FILE]
 *
 * 1. `stripedb dev up` in DIR (default ./stripedb-demo, wiped first when no cluster runs
 *    there): metadata x3, shards a-d as replica sets of --shard-members members (default
 *    3), a rate limiter, 1 proxy, 1 coordinator (18 processes: sized for a 2-core machine).
 * 2. Tenants: `acme` (the payments tenant, a generous quota) owns database `pay`;
 *    `burst` (requestsPerSec 20) owns database `burst`. pay.charges is sharded by
 *    {merchant: 1} in 8 ranges placed so that shard-a holds the busiest merchants (a
 *    zipfian workload), shard-b and shard-c warm and cold ranges, shard-d a cold one.
 * 3. The payments workload of `stripedb bench` (src/bench) runs through the proxies for
 *    the whole demo, in phases: before; bin-pack (drain the cold shard-d into shard-c:
 *    `stripedb ctl shard drain shard-d --to shard-c`); between; split the busiest shard
 *    (`stripedb ctl shard split shard-a --to shard-d`: half of its chunks move to the
 *    shard the bin-pack freed); after. A progress bar per migration follows its state in
 *    metadata (getMigration).
 * 3c. Failover (replica sets of 3 or 5): SIGKILL the primary of the busiest shard (the
 *    one holding merchant m0000) while the workload runs (cli/failover.c): the time from
 *    the kill to the first acknowledged write on the new primary, as a client through the
 *    proxies sees it, then `dev restart` of the killed member and its catch-up.
 * 4. Tenant `burst` is pushed over its quota (inserts as fast as one client goes):
 *    error 462 with retryAfterMS.
 * 5. The report: per phase operations, errors by kind, latency percentiles per kind; per
 *    migration the chunk, the write pause of each switch attempt, documents and bytes
 *    moved; the failover time and the probe's check (nothing lost or duplicated); the
 *    quota result; the verdict of the history checker (src/bench/check.c,
 *    in-process C: no Python needed) over every acknowledged operation and the final
 *    documents read through the proxies.
 * 6. `dev down`: every process stops; on Ctrl-C (SIGINT/SIGTERM/SIGHUP) the demo stops
 *    the workload and the cluster before it exits.
 *
 * Exit codes: 0 the demo ran and the checker found nothing, 1 a step failed or the checker
 * found a violation, 2 bad usage, 130 interrupted.
 */
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/dev.h"
#include "cli/failover.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/metauri.h"

#define DEMO_MAX_MIGS 32
#define DEMO_MIG_TIMEOUT_MS 180000

int cli_demo_main(int argc, char **argv);

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}


/* Run `stripedb ARGS...` (this binary) and wait; its stdout goes to out (n bytes, NUL
 * terminated) when out is set, else to ours. Returns the exit code, or -1. */
static int run_self(char *const *args, char *out, size_t n)
{
	char exe[PATH_MAX];
	char *argv[32];
	int fds[2] = {-1, -1}, st = 0, i = 0;
	size_t got = 0;
	pid_t pid;

	dev_self_exe(exe, sizeof exe);
	argv[i++] = exe;
	for (; args[i - 1] != NULL && i < 31; i++) {
		argv[i] = args[i - 1];
	}
	argv[i] = NULL;
	if (out != NULL && pipe(fds) != 0) {
		return -1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		return -1;
	}
	if (pid == 0) {
		/* own process group: a terminal's Ctrl-C reaches the demo only, which lets `dev up`
		 * finish recording what it started and then stops all of it */
		setpgid(0, 0);
		if (out != NULL) {
			dup2(fds[1], 1);
			close(fds[0]);
			close(fds[1]);
		}
		setenv("STRIPEDB_CONFIG", "/dev/null", 1);
		execv(exe, argv);
		_exit(127);
	}
	if (out != NULL) {
		ssize_t r;
		close(fds[1]);
		while ((r = read(fds[0], out + got, n - 1 - got)) > 0 || (r < 0 && errno == EINTR)) {
			if (r > 0) {
				got += (size_t)r;
			}
			if (got == n - 1) {
				break;
			}
		}
		out[got] = '\0';
		close(fds[0]);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

/* Make dir ready for a fresh cluster: a missing or empty directory is fine; one left by an
 * earlier demo or dev cluster loses exactly what `dev up` creates (data/, logs/,
 * cluster.json, kafka.bootstrap); a directory with anything else is refused, so a mistyped
 * --dir never deletes a user's files. Returns 0 or -1 (one line on stderr). */
static int clear_dir(const char *dir)
{
	static const char *const made[] = {"data", "logs", "cluster.json", "cluster.json.tmp",
					   "kafka.bootstrap"};
	DIR *d = opendir(dir);
	struct dirent *e;
	int foreign = 0;

	if (d == NULL) {
		return 0; /* dev up creates it */
	}
	while ((e = readdir(d)) != NULL) {
		int ours = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
		for (size_t i = 0; i < sizeof made / sizeof made[0] && !ours; i++) {
			ours = strcmp(e->d_name, made[i]) == 0;
		}
		foreign += !ours;
	}
	closedir(d);
	if (foreign > 0) {
		fprintf(stderr, "stripedb demo: %s holds files that are not a stripedb cluster's; "
				"give an empty or new --dir\n", dir);
		return -1;
	}
	for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
		char *p = sdb_asprintf("%s/%s", dir, made[i]);
		nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
		free(p);
	}
	return 0;
}

/* --- metadata --- */

static int meta_cmd(mongoc_client_t *m, bson_t *cmd, bson_t *reply, int tolerate)
{
	bson_error_t e;
	bson_t tmp;
	int ok = mongoc_client_command_simple(m, "admin", cmd, NULL, reply ? reply : &tmp, &e);

	if (reply == NULL) {
		bson_destroy(&tmp);
	}
	bson_destroy(cmd);
	if (!ok && (int)e.code != tolerate) {
		char *j = NULL;
		fprintf(stderr, "stripedb demo: metadata: %s\n", e.message);
		bson_free(j);
		return -1;
	}
	return 0;
}

static int setup_cluster(mongoc_client_t *m)
{
	static const char *const splits[] = {"m0001", "m0002", "m0004", "m0008",
					     "m0016", "m0040", "m0100"};
	static const char *const place[] = {"shard-a", "shard-a", "shard-a", "shard-a",
					    "shard-b", "shard-b", "shard-c", "shard-d"};
	bson_t *c, q, a, d, k;

	c = BCON_NEW("createTenant", "acme");
	if (meta_cmd(m, c, NULL, 11000) != 0) {
		return -1;
	}
	c = BCON_NEW("setQuota", "acme", "quota", "{", "requestsPerSec", BCON_INT32(1000000),
		     "docsWrittenPerSec", BCON_INT32(1000000), "periodMS", BCON_INT32(1000), "}");
	if (meta_cmd(m, c, NULL, 0) != 0) {
		return -1;
	}
	c = BCON_NEW("createTenant", "burst");
	if (meta_cmd(m, c, NULL, 11000) != 0) {
		return -1;
	}
	c = BCON_NEW("setQuota", "burst", "quota", "{", "requestsPerSec", BCON_INT32(20),
		     "periodMS", BCON_INT32(1000), "}");
	if (meta_cmd(m, c, NULL, 0) != 0) {
		return -1;
	}
	c = BCON_NEW("createDatabase", "pay", "tenant", "acme");
	if (meta_cmd(m, c, NULL, 48) != 0) {
		return -1;
	}
	c = BCON_NEW("createDatabase", "burst", "tenant", "burst");
	if (meta_cmd(m, c, NULL, 48) != 0) {
		return -1;
	}
	c = bson_new();
	BSON_APPEND_UTF8(c, "shardCollection", "pay.charges");
	BSON_APPEND_DOCUMENT_BEGIN(c, "key", &k);
	BSON_APPEND_INT32(&k, "merchant", 1);
	bson_append_document_end(c, &k);
	BSON_APPEND_ARRAY_BEGIN(c, "splitPoints", &a);
	for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
		char key[8];
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&a, key, -1, &d);
		BSON_APPEND_UTF8(&d, "merchant", splits[i]);
		bson_append_document_end(&a, &d);
	}
	bson_append_array_end(c, &a);
	BSON_APPEND_ARRAY_BEGIN(c, "shards", &q);
	for (size_t i = 0; i < sizeof place / sizeof place[0]; i++) {
		char key[8];
		snprintf(key, sizeof key, "%zu", i);
		bson_append_utf8(&q, key, -1, place[i], -1);
	}
	bson_append_array_end(c, &q);
	return meta_cmd(m, c, NULL, 48);
}

/* --- migrations --- */

typedef struct demo_mig {
	char id[128];
	char step[32];   /* which demo step registered it */
	char state[32];
	char from[32], to[32];
	int64_t chunk;
	int64_t imported, import_bytes, applied, reverse, deleted, verified;
	int64_t pauses[16];
	int npauses;
	char error[256];
	int terminal;
} demo_mig;

static int64_t i64(const bson_t *d, const char *k)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
}

static void str(const bson_t *d, const char *k, char *buf, size_t n)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_UTF8(&it)) {
		snprintf(buf, n, "%s", bson_iter_utf8(&it, NULL));
	}
}

static int subdoc(const bson_t *d, const char *k, bson_t *out)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;

	if (!bson_iter_init_find(&it, d, k) ||
	    !(BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it))) {
		return 0;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_iter_document(&it, &len, &data);
	} else {
		bson_iter_array(&it, &len, &data);
	}
	return bson_init_static(out, data, len);
}

static void mig_poll(mongoc_client_t *m, demo_mig *g)
{
	bson_t *c = BCON_NEW("getMigration", BCON_UTF8(g->id)), reply, rec, spec, st, p;
	bson_error_t e;
	bson_iter_t it;

	if (!mongoc_client_command_simple(m, "admin", c, NULL, &reply, &e)) {
		bson_destroy(c);
		bson_destroy(&reply);
		return;
	}
	if (subdoc(&reply, "migration", &rec)) {
		str(&rec, "state", g->state, sizeof g->state);
		if (subdoc(&rec, "spec", &spec)) {
			str(&spec, "from", g->from, sizeof g->from);
			str(&spec, "to", g->to, sizeof g->to);
			g->chunk = i64(&spec, "chunk");
		}
		if (subdoc(&rec, "stats", &st)) {
			bson_t v;
			g->imported = i64(&st, "imported");
			g->import_bytes = i64(&st, "importBytes");
			g->applied = i64(&st, "applied");
			g->reverse = i64(&st, "reverseApplied");
			g->deleted = i64(&st, "deleted");
			if (subdoc(&st, "verify", &v)) {
				g->verified = i64(&v, "count");
			}
			str(&st, "error", g->error, sizeof g->error);
			g->npauses = 0;
			if (subdoc(&st, "pausesMS", &p) && bson_iter_init(&it, &p)) {
				while (bson_iter_next(&it) && g->npauses < 16) {
					g->pauses[g->npauses++] = bson_iter_as_int64(&it);
				}
			}
		}
	}
	g->terminal = strcmp(g->state, "complete") == 0 || strcmp(g->state, "aborted") == 0 ||
		      strcmp(g->state, "rolled_back") == 0;
	bson_destroy(c);
	bson_destroy(&reply);
}

static double state_progress(const char *s)
{
	static const struct {
		const char *s;
		double p;
	} t[] = {{"registered", 0.02}, {"importing", 0.2},  {"replicating", 0.45},
		 {"verifying", 0.6},   {"switching", 0.7},  {"switched", 0.8},
		 {"cleaning", 0.92},   {"complete", 1.0},   {"aborted", 1.0},
		 {"rolling_back", 0.8}, {"rolled_back", 1.0}};

	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		if (strcmp(s, t[i].s) == 0) {
			return t[i].p;
		}
	}
	return 0;
}

static void mig_line(const demo_mig *g, char *buf, size_t n)
{
	char bar[32];
	int fill = (int)(state_progress(g->state) * 20 + 0.5);

	for (int i = 0; i < 20; i++) {
		bar[i] = i < fill ? '#' : '.';
	}
	bar[20] = '\0';
	snprintf(buf, n, "  chunk %-3" PRId64 " %s -> %s [%s] %-12s %6" PRId64 " docs %7.1f KiB%s",
		 g->chunk, g->from, g->to, bar, g->state[0] ? g->state : "registered", g->imported,
		 (double)g->import_bytes / 1024.0, g->npauses ? "  switched" : "");
}

/* Follow migs[first..n) to a terminal state with progress bars and the workload's status
 * line. Returns 0 when all completed, -1 otherwise (timeout, abort, Ctrl-C). */
static int follow(mongoc_client_t *m, bench *b, demo_mig *migs, int first, int n)
{
	uint64_t deadline = sdb_mono_ms() + DEMO_MIG_TIMEOUT_MS;
	int tty = isatty(1), drawn = 0, done = 0;
	char last[DEMO_MAX_MIGS][32];
	char line[512], status[256];
	uint64_t next_status = 0;

	memset(last, 0, sizeof last);
	while (!interrupted && sdb_mono_ms() < deadline) {
		done = 1;
		for (int i = first; i < n; i++) {
			mig_poll(m, &migs[i]);
			done &= migs[i].terminal;
		}
		if (tty) {
			if (drawn) {
				printf("\033[%dA", drawn);
			}
			drawn = 0;
			for (int i = first; i < n; i++) {
				mig_line(&migs[i], line, sizeof line);
				printf("\r\033[K%s\n", line);
				drawn++;
			}
			bench_status_line(b, status, sizeof status);
			printf("\r\033[K  workload %s\n", status);
			drawn++;
		} else {
			for (int i = first; i < n; i++) {
				if (strcmp(last[i], migs[i].state) != 0) {
					mig_line(&migs[i], line, sizeof line);
					printf("%s\n", line);
					snprintf(last[i], sizeof last[i], "%s", migs[i].state);
				}
			}
			if (sdb_mono_ms() >= next_status) {
				bench_status_line(b, status, sizeof status);
				printf("  workload %s\n", status);
				next_status = sdb_mono_ms() + 2000;
			}
		}
		fflush(stdout);
		if (done) {
			break;
		}
		sdb_sleep_ms(tty ? 250 : 200);
	}
	for (int i = first; i < n; i++) {
		if (strcmp(migs[i].state, "complete") != 0) {
			fprintf(stderr, "stripedb demo: migration %s ended %s%s%s\n", migs[i].id,
				migs[i].state[0] ? migs[i].state : "nowhere (timeout)",
				migs[i].error[0] ? ": " : "", migs[i].error);
			return -1;
		}
	}
	return done ? 0 : -1;
}

/* Register migrations with `stripedb ctl ... shard drain|split` and record their ids. */
static int start_step(const char *meta, const char *step, char *const *ctl_args, demo_mig *migs,
		      int *n)
{
	char out[8192], *save = NULL;
	char *args[16];
	int i = 0, k = 0, rc;

	args[i++] = "ctl";
	args[i++] = sdb_asprintf("--metadata=%s", meta);
	for (; ctl_args[k] != NULL && i < 14; k++) {
		args[i++] = ctl_args[k];
	}
	args[i++] = "--grace-ms=2000";
	args[i] = NULL;
	rc = run_self(args, out, sizeof out);
	free(args[1]);
	if (rc != 0) {
		fprintf(stderr, "stripedb demo: `stripedb ctl %s` failed (exit %d)\n", step, rc);
		return -1;
	}
	for (char *tok = strtok_r(out, "\n", &save); tok != NULL; tok = strtok_r(NULL, "\n", &save)) {
		if (*n < DEMO_MAX_MIGS && tok[0] != '\0') {
			memset(&migs[*n], 0, sizeof migs[*n]);
			snprintf(migs[*n].id, sizeof migs[*n].id, "%s", tok);
			snprintf(migs[*n].step, sizeof migs[*n].step, "%s", step);
			(*n)++;
		}
	}
	return 0;
}

/* start_step then follow its migrations to their end (progress bars). 0 or -1. */
static int run_step(const char *meta, mongoc_client_t *m, bench *b, const char *step,
		    char *const *ctl_args, demo_mig *migs, int *n)
{
	int first = *n;
	if (start_step(meta, step, ctl_args, migs, n) != 0)
		return -1;
	return follow(m, b, migs, first, *n);
}

/* Print the workload's status line every second until until (monotonic ms) or Ctrl-C. */
static void show_workload_until(bench *b, uint64_t until)
{
	char status[256];

	while (!interrupted && sdb_mono_ms() < until) {
		sdb_sleep_ms(1000);
		bench_status_line(b, status, sizeof status);
		printf("  workload %s\n", status);
		fflush(stdout);
	}
}

/* --- quota --- */

typedef struct quota_result {
	int sent, ok, over, other;
	int64_t retry_after_ms;
	char other_msg[256];
} quota_result;

static void push_quota(const char *proxy_uri, quota_result *q)
{
	mongoc_client_t *cl = mongoc_client_new(proxy_uri);
	mongoc_collection_t *c;

	memset(q, 0, sizeof *q);
	if (cl == NULL) {
		return;
	}
	mongoc_client_set_error_api(cl, MONGOC_ERROR_API_VERSION_2);
	c = mongoc_client_get_collection(cl, "burst", "events");
	for (int i = 0; i < 200 && !interrupted; i++) {
		bson_t *d = BCON_NEW("insert", "events", "documents", "[", "{", "seq", BCON_INT32(i),
				     "kind", "page_view", "}", "]");
		bson_t reply;
		bson_error_t e;
		q->sent++;
		/* the insert command itself: the raw reply carries retryAfterMS */
		if (mongoc_collection_write_command_with_opts(c, d, NULL, &reply, &e)) {
			q->ok++;
		} else if (e.code == 462) {
			q->over++;
			if (q->retry_after_ms == 0) {
				q->retry_after_ms = i64(&reply, "retryAfterMS");
			}
		} else {
			q->other++;
			snprintf(q->other_msg, sizeof q->other_msg, "%.200s", e.message);
		}
		bson_destroy(&reply);
		bson_destroy(d);
	}
	mongoc_collection_destroy(c);
	mongoc_client_destroy(cl);
}

/* --- the report --- */

static void print_report(bench *b, demo_mig *migs, int nmigs, const quota_result *q,
			 const demo_failover *fo, const bench_verdict *v, int checked)
{
	int64_t docs = 0, bytes = 0;

	printf("\n================ stripedb demo report ================\n\n");
	printf("workload (payments through the proxies; latency per phase):\n");
	bench_report(b, stdout, NULL, checked ? v : NULL);
	printf("\nmigrations (%d):\n", nmigs);
	for (int i = 0; i < nmigs; i++) {
		const demo_mig *g = &migs[i];
		printf("  %-9s chunk %-3" PRId64 " %s -> %s  %-9s imported %" PRId64 " docs (%.1f KiB), "
		       "replicated %" PRId64 ", verified %" PRId64 ", cleaned %" PRId64 "; write pause",
		       g->step, g->chunk, g->from, g->to, g->state, g->imported,
		       (double)g->import_bytes / 1024.0, g->applied, g->verified, g->deleted);
		if (g->npauses == 0) {
			printf(" -");
		}
		for (int k = 0; k < g->npauses; k++) {
			printf("%s %" PRId64 " ms", k ? "," : "", g->pauses[k]);
		}
		printf("\n");
		docs += g->imported + g->applied;
		bytes += g->import_bytes;
	}
	printf("  data moved: %" PRId64 " documents imported or replicated, %.1f KiB imported\n", docs,
	       (double)bytes / 1024.0);
	printf("\n");
	if (fo != NULL) {
		demo_failover_print(fo, stdout);
	} else {
		printf("failover: skipped (one-member shards: --shard-members 1)\n");
	}
	printf("\nquota: tenant burst (20 requests/s): %d inserts sent, %d accepted, %d refused with "
	       "462 (retryAfterMS %" PRId64 ")%s%s\n",
	       q->sent, q->ok, q->over, q->retry_after_ms, q->other ? ", other errors: " : "",
	       q->other ? q->other_msg : "");
	if (checked) {
		printf("\nchecker verdict: %s: %" PRId64 " keys, %" PRId64 " writes (%" PRId64
		       " acknowledged, %" PRId64 " failed, %" PRId64 " unknown), %" PRId64
		       " reads, %" PRId64 " final documents, %" PRId64 " violations\n",
		       v->ok ? "OK" : "VIOLATIONS", v->keys, v->writes, v->acked, v->failed, v->unknown,
		       v->reads, v->docs, v->violations);
		for (int i = 0; i < 4 && i < v->violations; i++) {
			printf("  %s\n", v->first[i]);
		}
	} else {
		printf("\nchecker verdict: NOT RUN\n");
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: stripedb demo [--dir DIR] [--cdc embedded|kafka] [--seconds N] "
		   "[--records N] [--threads N] [--shard-members 1|3|5] [--json FILE]\n");
}

static int run_self_wait(char *const *args)
{
	return run_self(args, NULL, 0);
}

static void tick_workload(void *arg)
{
	char status[256];
	bench_status_line(arg, status, sizeof status);
	printf("  workload %s\n", status);
	fflush(stdout);
}

int cli_demo_main(int argc, char **argv)
{
	const char *dir = "stripedb-demo", *cdc = "embedded", *json = NULL;
	double seconds = 60;
	int64_t records = 20000;
	int threads = 4, rc = 1, nmigs = 0, checked = 0, up = 0, members = 3, fo_rc = 0;
	char members_arg[8];
	demo_failover fo;
	char err[512], meta[512], proxies[512], uri[1024], metauri[1024], *mu;
	demo_mig migs[DEMO_MAX_MIGS];
	dev_cluster *cl = sdb_calloc(1, sizeof *cl);
	mongoc_client_t *m = NULL;
	bench *b = NULL;
	bench_verdict v;
	quota_result q;
	struct sigaction sa;
	uint64_t t_start = sdb_mono_ms(), t_end;

	memset(&q, 0, sizeof q);
	memset(&v, 0, sizeof v);
	memset(&fo, 0, sizeof fo);
	for (int i = 0; i < argc; i += 2) { /* --flag value pairs */
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			free(cl);
			return 0;
		}
		if (val == NULL) {
			fprintf(stderr, "stripedb demo: %s needs a value\n", a);
			free(cl);
			return 2;
		}
		if (strcmp(a, "--dir") == 0) {
			dir = val;
		} else if (strcmp(a, "--cdc") == 0 && (strcmp(val, "embedded") == 0 || strcmp(val, "kafka") == 0)) {
			cdc = val;
		} else if (strcmp(a, "--seconds") == 0 && atof(val) >= 10 && atof(val) <= 3600) {
			seconds = atof(val);
		} else if (strcmp(a, "--records") == 0 && atoll(val) >= 100 && atoll(val) <= 10000000) {
			records = atoll(val);
		} else if (strcmp(a, "--threads") == 0 && atoi(val) >= 1 && atoi(val) <= 64) {
			threads = atoi(val);
		} else if (strcmp(a, "--shard-members") == 0 &&
			   (strcmp(val, "1") == 0 || strcmp(val, "3") == 0 || strcmp(val, "5") == 0)) {
			members = atoi(val);
		} else if (strcmp(a, "--json") == 0) {
			json = val;
		} else {
			fprintf(stderr, "stripedb demo: bad flag or value: %s %s (--cdc embedded|kafka, "
					"--seconds 10..3600, --records 100.., --threads 1..64, --shard-members 1|3|5)\n", a, val);
			free(cl);
			return 2;
		}
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	mongoc_init();

	/* 1. a fresh cluster */
	{
		char *cj = sdb_asprintf("%s/cluster.json", dir);
		if (access(cj, F_OK) == 0 && dev_cluster_load(dir, cl) == 0) {
			int alive = dev_cluster_alive(cl);
			dev_cluster_free(cl);
			memset(cl, 0, sizeof *cl);
			if (alive > 0) {
				fprintf(stderr, "stripedb demo: a cluster is running in %s; stop it first "
						"(stripedb dev down --dir %s)\n", dir, dir);
				free(cj);
				rc = 1;
				goto out;
			}
		}
		if (clear_dir(dir) != 0) {
			free(cj);
			rc = 1;
			goto out;
		}
		free(cj);
	}
	snprintf(members_arg, sizeof members_arg, "%d", members);
	printf("== 1. a local cluster: stripedb dev up --dir %s --shards 4 --shard-members %d "
	       "--proxies 1 --coordinators 1 --cdc %s\n",
	       dir, members, cdc);
	{
		char *args[] = {"dev", "up", "--dir", (char *)dir, "--shards", "4", "--shard-members",
				members_arg, "--proxies", "1", "--coordinators", "1", "--cdc",
				(char *)cdc, "--log-level", "warn", NULL};
		int r = run_self(args, NULL, 0);
		up = 1; /* whatever happened, cluster.json names what must be stopped */
		if (r != 0 || interrupted) {
			fprintf(stderr, "stripedb demo: dev up failed (exit %d); logs in %s/logs\n", r, dir);
			goto out;
		}
	}
	if (dev_cluster_load(dir, cl) != 0) {
		goto out;
	}
	dev_cluster_addrs(cl, "metadata", 0, meta, sizeof meta);
	dev_cluster_addrs(cl, "proxy", 0, proxies, sizeof proxies);
	mu = sdb_meta_uri(meta, false, 20000, 0, 0);
	snprintf(metauri, sizeof metauri, "%s", mu);
	free(mu);
	snprintf(uri, sizeof uri, "mongodb://%s/?serverSelectionTimeoutMS=10000&socketTimeoutMS=20000", proxies);
	m = mongoc_client_new(metauri);
	if (m == NULL) {
		fprintf(stderr, "stripedb demo: bad metadata URI %s\n", metauri);
		goto out;
	}
	mongoc_client_set_error_api(m, MONGOC_ERROR_API_VERSION_2);

	/* 2. tenants, quotas, a sharded collection */
	printf("\n== 2. tenants acme (pay) and burst (20 req/s); pay.charges sharded by merchant in 8 "
	       "ranges:\n   shard-a m0000-m0007 (the busiest merchants), shard-b m0008-m0039, "
	       "shard-c m0040-m0099, shard-d m0100+\n");
	if (setup_cluster(m) != 0) {
		goto out;
	}

	/* 3. the workload */
	printf("\n== 3. loading %" PRId64 " charges, then the payments workload (%d threads) "
	       "through the proxies %s\n", records, threads, proxies);
	fflush(stdout);
	{
		bench_opts o = {.uri = uri, .workload = "payments", .threads = threads,
				.records = records, .seconds = 0, .load = 1, .merchants = 200,
				.create_indexes = 1, .label = "before"};
		if (bench_start(&o, &b, err, sizeof err) != 0) {
			fprintf(stderr, "stripedb demo: workload: %s\n", err);
			goto out;
		}
	}
	t_end = sdb_mono_ms() + (uint64_t)(seconds * 1000);
	show_workload_until(b, sdb_mono_ms() + (uint64_t)(seconds * 150)); /* 15 % of the run */
	if (interrupted) {
		goto out;
	}

	/* 4. bin-pack the two cold shards, then split the busiest */
	printf("\n== 4a. bin-pack: the cold shard-d drains into shard-c "
	       "(stripedb ctl shard drain shard-d --to shard-c)\n");
	bench_mark(b, "bin-pack d->c (during)");
	{
		char *a[] = {"shard", "drain", "shard-d", "--to", "shard-c", NULL};
		if (run_step(meta, m, b, "bin-pack", a, migs, &nmigs) != 0) {
			goto out;
		}
	}
	bench_mark(b, "between");
	show_workload_until(b, sdb_mono_ms() + (uint64_t)(seconds * 100));
	if (interrupted) {
		goto out;
	}
	printf("\n== 4b. split the busiest shard: half of shard-a's chunks move to shard-d "
	       "(stripedb ctl shard split shard-a --to shard-d)\n");
	bench_mark(b, "split a->d (during)");
	{
		char *a[] = {"shard", "split", "shard-a", "--to", "shard-d", NULL};
		if (run_step(meta, m, b, "split", a, migs, &nmigs) != 0) {
			goto out;
		}
	}
	if (members > 1) {
		printf("\n== 4c. failover: SIGKILL the primary of the busiest shard while the workload "
		       "runs\n");
		fflush(stdout);
		bench_mark(b, "failover (during)");
		fo_rc = demo_failover_run(cl, uri, m, run_self_wait, tick_workload, b, &interrupted,
					  &fo);
		if (interrupted) {
			goto out;
		}
	}
	bench_mark(b, "after");
	{
		uint64_t min_after = sdb_mono_ms() + (uint64_t)(seconds * 150);
		show_workload_until(b, t_end > min_after ? t_end : min_after);
	}
	if (interrupted) {
		goto out;
	}

	/* 5. quota */
	printf("\n== 5. tenant burst goes over its quota (200 inserts as fast as one client can)\n");
	push_quota(uri, &q);

	/* 6. stop, check, report */
	bench_stop(b);
	printf("\n== 6. checking the history of every operation against the final documents...\n");
	fflush(stdout);
	if (bench_check(b, &v, err, sizeof err) != 0) {
		fprintf(stderr, "stripedb demo: checker: %s\n", err);
	} else {
		checked = 1;
	}
	print_report(b, migs, nmigs, &q, members > 1 ? &fo : NULL, &v, checked);
	if (json != NULL) {
		bench_report(b, NULL, json, checked ? &v : NULL);
	}
	rc = checked && v.ok && q.over > 0 && fo_rc == 0 ? 0 : 1;
	if (fo_rc != 0) {
		fprintf(stderr, "stripedb demo: the failover step failed or found a violation\n");
	}
	if (q.over == 0) {
		fprintf(stderr, "stripedb demo: tenant burst was never refused (462 expected)\n");
	}
out:
	if (interrupted) {
		printf("\ninterrupted: stopping the workload and the cluster\n");
		rc = 130;
	}
	if (b != NULL) {
		bench_stop(b);
		bench_free(b);
	}
	if (m != NULL) {
		mongoc_client_destroy(m);
	}
	if (up) {
		dev_cluster_free(cl);
		memset(cl, 0, sizeof *cl);
		if (dev_cluster_load(dir, cl) == 0) {
			dev_cluster_stop(cl, SIGTERM);
			printf("\n== 7. stripedb dev down: %s (logs and data kept in %s)\n",
			       dev_cluster_alive(cl) == 0 ? "every process stopped" : "SOME PROCESSES ARE LEFT", dir);
			dev_cluster_free(cl);
		}
	}
	printf("demo finished in %.0f s\n", (double)(sdb_mono_ms() - t_start) / 1000.0);
	free(cl);
	mongoc_cleanup();
	return rc;
}
