/* `stripedb bench`: the command line around bench.h.
 *
 *   stripedb bench --uri URI [--uri URI2 ...] [--label NAME ...] [--workload a..f|payments]
 *                  [--threads N] [--records N] [--seconds S] [--distribution D]
 *                  [--value-bytes N] [--merchants N] [--no-load] [--json FILE]
 *                  [--history FILE] [--no-check] [--quiet]
 *
 * With several --uri the same workload runs against each in turn (loaded afresh) and a
 * comparison table follows (e.g. one shard directly vs. the cluster through the proxies).
 * With --json FILE the report of the last (or only) run goes to FILE; with several URIs,
 * FILE gets the suffix .1, .2 ... per run. Exit codes: 0 ok, 1 an endpoint failed or the
 * checker found a violation, 2 bad usage.
 */
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/alloc.h"

#define MAX_URIS 8 /* targets of one invocation (--uri) */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: stripedb bench --uri URI [--uri URI2 ...] [--label NAME ...]\n"
		   "         [--workload a|b|c|d|e|f|payments] [--threads N] [--records N]\n"
		   "         [--seconds S] [--distribution zipfian|uniform|latest] [--value-bytes N]\n"
		   "         [--merchants N] [--no-load] [--json FILE] [--history FILE] [--no-check]\n"
		   "         [--quiet]\n");
}

typedef struct run_result {
	char label[64];
	double secs, ops_s;
	uint64_t ops, errs;
	double p50, p99;
	int check_ok;
	int checked;
} run_result;

static int one_run(bench_opts *o, const char *label, const char *json, const char *history,
		   int check, int quiet, run_result *res)
{
	char err[512], line[256];
	bench *b;
	bench_verdict v;
	bench_phase_stats *ps;
	bench_hist all;
	int rc, tty = isatty(2);
	struct timespec tick = {0, 200000000L};
	int ticks = 0;

	memset(res, 0, sizeof *res);
	snprintf(res->label, sizeof res->label, "%s", label);
	fprintf(stderr, "%s: workload %s, %d threads, %" PRId64 " records, %.0f s against %s\n", label,
		o->workload ? o->workload : "a", o->threads, o->records, o->seconds, o->uri);
	rc = bench_start(o, &b, err, sizeof err);
	if (rc != 0) {
		fprintf(stderr, "stripedb bench: %s\n", err);
		return 1;
	}
	while (!bench_done(b) && !interrupted) {
		nanosleep(&tick, NULL);
		if (++ticks % 5 == 0 && !quiet) {
			bench_status_line(b, line, sizeof line);
			fprintf(stderr, tty ? "\r%s   " : "%s\n", line);
		}
	}
	bench_stop(b);
	if (tty && !quiet) {
		fprintf(stderr, "\n");
	}
	memset(&v, 0, sizeof v);
	if (check) {
		rc = bench_check(b, &v, err, sizeof err);
		if (rc != 0) {
			fprintf(stderr, "stripedb bench: check: %s\n", err);
		}
		res->checked = rc == 0;
		res->check_ok = rc == 0 && v.ok;
	}
	printf("== %s: %s\n", label, o->uri);
	bench_report(b, stdout, json, res->checked ? &v : NULL);
	if (res->checked) {
		printf("checker: %s: %" PRId64 " keys, %" PRId64 " writes (%" PRId64 " acknowledged, %" PRId64
		       " failed, %" PRId64 " unknown), %" PRId64 " reads, %" PRId64
		       " documents, %" PRId64 " violations (%.0f ms)\n",
		       v.ok ? "OK" : "VIOLATIONS", v.keys, v.writes, v.acked, v.failed, v.unknown, v.reads,
		       v.docs, v.violations, v.check_ms);
		for (int i = 0; i < 4 && i < v.violations; i++) {
			printf("  %s\n", v.first[i]);
		}
	}
	if (history != NULL && bench_write_history(b, history) != 0) {
		rc = 1;
	}
	ps = sdb_calloc(1, sizeof *ps);
	bench_phase(b, 0, ps);
	memset(&all, 0, sizeof all);
	for (int k = 0; k < BENCH_N_OPS; k++) {
		bench_hist_merge(&all, &ps->h[k]);
	}
	for (int k = 0; k < BENCH_N_ERRS; k++) {
		res->errs += ps->errs[k];
	}
	res->secs = (double)(ps->end_ns - ps->start_ns) / 1e9;
	res->ops = all.n;
	res->ops_s = res->secs > 0 ? (double)all.n / res->secs : 0;
	res->p50 = (double)bench_hist_percentile(&all, 50) / 1000.0;
	res->p99 = (double)bench_hist_percentile(&all, 99) / 1000.0;
	free(ps);
	bench_free(b);
	fflush(stdout);
	return rc != 0 || (check && !res->check_ok) ? 1 : 0;
}

static int parse_num(const char *flag, const char *v, double lo, double hi, double *out)
{
	char *end;
	double d = strtod(v, &end);

	if (*v == '\0' || *end != '\0' || d < lo || d > hi) {
		fprintf(stderr, "stripedb bench: %s wants a number in [%g, %g], not '%s'\n", flag, lo, hi, v);
		return -1;
	}
	*out = d;
	return 0;
}

int bench_main(int argc, char **argv)
{
	bench_opts o = {.threads = 4, .records = 10000, .seconds = 10, .load = 1, .create_indexes = 1};
	const char *uris[MAX_URIS], *labels[MAX_URIS] = {0}, *json = NULL, *history = NULL;
	int nuris = 0, nlabels = 0, check = 1, quiet = 0, rc = 0;
	run_result res[MAX_URIS];
	struct sigaction sa;

	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = NULL;
		char flag[64];
		const char *eq = strchr(a, '=');
		double d;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		}
		if (strncmp(a, "--", 2) != 0) {
			fprintf(stderr, "stripedb bench: unexpected argument '%s'\n", a);
			usage(stderr);
			return 2;
		}
		if (eq != NULL) {
			snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
			v = eq + 1;
		} else {
			snprintf(flag, sizeof flag, "%s", a);
		}
		if (strcmp(flag, "--no-load") == 0) {
			o.load = 0;
			continue;
		} else if (strcmp(flag, "--no-check") == 0) {
			check = 0;
			continue;
		} else if (strcmp(flag, "--quiet") == 0) {
			quiet = 1;
			continue;
		}
		if (v == NULL) {
			if (i + 1 >= argc) {
				fprintf(stderr, "stripedb bench: %s needs a value\n", flag);
				return 2;
			}
			v = argv[++i];
		}
		if ((strcmp(flag, "--uri") == 0 && nuris == MAX_URIS) ||
		    (strcmp(flag, "--label") == 0 && nlabels == MAX_URIS)) {
			fprintf(stderr, "stripedb bench: at most %d %s\n", MAX_URIS, flag);
			return 2;
		} else if (strcmp(flag, "--uri") == 0) {
			uris[nuris++] = v;
		} else if (strcmp(flag, "--label") == 0) {
			labels[nlabels++] = v;
		} else if (strcmp(flag, "--workload") == 0) {
			o.workload = v;
		} else if (strcmp(flag, "--distribution") == 0) {
			o.dist = v;
		} else if (strcmp(flag, "--db") == 0) {
			o.db = v;
		} else if (strcmp(flag, "--json") == 0) {
			json = v;
		} else if (strcmp(flag, "--history") == 0) {
			history = v;
		} else if (strcmp(flag, "--threads") == 0) {
			if (parse_num(flag, v, 1, 256, &d) != 0) {
				return 2;
			}
			o.threads = (int)d;
		} else if (strcmp(flag, "--records") == 0) {
			if (parse_num(flag, v, 1, 1e8, &d) != 0) {
				return 2;
			}
			o.records = (int64_t)d;
		} else if (strcmp(flag, "--seconds") == 0) {
			if (parse_num(flag, v, 0.1, 86400, &d) != 0) {
				return 2;
			}
			o.seconds = d;
		} else if (strcmp(flag, "--value-bytes") == 0) {
			if (parse_num(flag, v, 10, 40000, &d) != 0) {
				return 2;
			}
			o.value_bytes = (int)d;
		} else if (strcmp(flag, "--merchants") == 0) {
			if (parse_num(flag, v, 1, 9999, &d) != 0) {
				return 2;
			}
			o.merchants = (int)d;
		} else if (strcmp(flag, "--seed") == 0) {
			if (parse_num(flag, v, 0, 1e18, &d) != 0) {
				return 2;
			}
			o.seed = (uint64_t)d;
		} else {
			fprintf(stderr, "stripedb bench: unknown flag %s\n", flag);
			usage(stderr);
			return 2;
		}
	}
	if (nuris == 0) {
		fprintf(stderr, "stripedb bench: --uri is required\n");
		usage(stderr);
		return 2;
	}
	if (!o.load) {
		check = 0; /* the history does not cover documents of an earlier run */
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_sigint;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	mongoc_init();
	for (int i = 0; i < nuris && !interrupted; i++) {
		char lbl[64], jpath[1024], hpath[1024];
		snprintf(lbl, sizeof lbl, "%s", labels[i] ? labels[i] : nuris > 1 ? "run" : "bench");
		if (labels[i] == NULL && nuris > 1) {
			snprintf(lbl, sizeof lbl, "run %d", i + 1);
		}
		if (json != NULL) {
			snprintf(jpath, sizeof jpath, nuris > 1 ? "%s.%d" : "%s", json, i + 1);
		}
		if (history != NULL) {
			snprintf(hpath, sizeof hpath, nuris > 1 ? "%s.%d" : "%s", history, i + 1);
		}
		o.uri = uris[i];
		rc |= one_run(&o, lbl, json ? jpath : NULL, history ? hpath : NULL, check, quiet, &res[i]);
	}
	if (nuris > 1 && !interrupted) {
		printf("\n%-24s %10s %10s %9s %9s %8s %s\n", "comparison", "ops", "ops/s", "p50 ms",
		       "p99 ms", "errors", check ? "checker" : "");
		for (int i = 0; i < nuris; i++) {
			printf("%-24s %10" PRIu64 " %10.0f %9.2f %9.2f %8" PRIu64 " %s\n", res[i].label,
			       res[i].ops, res[i].ops_s, res[i].p50, res[i].p99, res[i].errs,
			       !check ? "" : res[i].check_ok ? "OK" : "VIOLATIONS");
		}
	}
	mongoc_cleanup();
	return interrupted ? 1 : rc;
}
