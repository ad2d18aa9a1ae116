/* Benchmarks of the rate limiter's decision library (issue #3). Not part of `make check`;
 * run through tests/bench/ratelimit_bench.sh, which also drives HTTP (wrk) and Redis.
 *
 *   ratelimit_bench api [--threads N] [--ops N] [--keys N] [--batch N]
 *       in-process C API: N threads call rl_limiter_decide() with batches of --batch
 *       requests (default 1) over --keys distinct keys (token bucket, limit 100 per
 *       minute, hits 1); prints decisions/s and per-call p50/p99 latency.
 *   ratelimit_bench scale [--threads N] [--rounds R] [--ops N] [--keys N]
 *       R rounds of: 1 thread, N threads (default 2) on one limiter, N threads on a
 *       limiter each (the machine's ceiling); prints each round's ratios and their
 *       medians (issue #23's 1 vs 2 threads).
 *   ratelimit_bench memory [--keys N] [--cache N]
 *       inserts N distinct keys into a limiter whose cache holds --cache keys; prints the
 *       keys held, heap bytes in use (mallinfo2) and RSS growth, and bytes per held key.
 *
 * Output: one line of key=value pairs per measurement, e.g.
 *   api threads=2 batch=1 keys=10000 decisions=4000000 seconds=1.234 rate=3241491 p50_ns=420 p99_ns=1300
 */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "ratelimit/limiter.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long opt_long(int argc, char **argv, const char *name, long def)
{
	for (int i = 2; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return strtol(argv[i + 1], NULL, 10);
	return def;
}

typedef struct worker {
	rl_limiter *lim;
	int id;
	long ops;
	long keys;
	long batch;
	long limit;    /* the token bucket's limit per minute */
	uint64_t *lat; /* ns per call */
	long over;
	uint64_t cpu_ns; /* this thread's CPU time (CLOCK_THREAD_CPUTIME_ID) */
} worker;

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *run_worker(void *arg)
{
	worker *w = arg;
	rl_req *reqs = sdb_calloc((size_t)w->batch, sizeof(rl_req));
	rl_resp *out = sdb_calloc((size_t)w->batch, sizeof(rl_resp));
	char(*keys)[32] = sdb_calloc((size_t)w->batch, 32);
	uint64_t seed = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
	long calls = w->ops / w->batch, over = 0;
	uint64_t cpu0 = thread_cpu_ns();

	for (long c = 0; c < calls; c++) {
		for (long b = 0; b < w->batch; b++) {
			seed ^= seed << 13;
			seed ^= seed >> 7;
			seed ^= seed << 17;
			snprintf(keys[b], 32, "account:%07lu", (unsigned long)(seed % (uint64_t)w->keys));
			reqs[b] = (rl_req){.name = "requests_per_sec", .unique_key = keys[b],
					   .hits = 1, .limit = w->limit, .duration = 60000};
		}
		uint64_t t0 = now_ns();
		rl_limiter_decide(w->lim, reqs, (size_t)w->batch, out, NULL, 0);
		w->lat[c] = now_ns() - t0;
		/* a local count: the workers' structs share cache lines */
		for (long b = 0; b < w->batch; b++)
			over += out[b].status == RL_OVER_LIMIT;
	}
	w->over = over;
	w->cpu_ns = thread_cpu_ns() - cpu0;
	free(keys);
	free(out);
	free(reqs);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* One measurement of the C API: what api_run() saw. */
typedef struct api_result {
	long decisions;
	double secs;      /* wall clock */
	double cpu_s;     /* the workers' CPU time, summed */
	uint64_t p50_ns;  /* per call */
	uint64_t p99_ns;
	long over;        /* OVER_LIMIT answers */
} api_result;

/* threads workers, each making ops/batch calls of batch requests over keys distinct keys
 * on a fresh limiter (cache of 2 x keys): one limiter shared by all workers, or, with
 * private_limiters, one per worker (nothing shared: the same work with no shared memory,
 * the machine's own ceiling for scaling). Fills *res. */
static void api_run(long threads, long ops, long keys, long batch, long limit,
		    bool private_limiters, api_result *res)
{
	rl_limiter_opts o = {.cache_size = (size_t)keys * 2};
	rl_limiter **lims = sdb_calloc((size_t)threads, sizeof(rl_limiter *));
	worker *w = sdb_calloc((size_t)threads, sizeof(worker));
	pthread_t *th = sdb_calloc((size_t)threads, sizeof(pthread_t));
	long calls = ops / batch;
	uint64_t cpu_ns = 0;
	uint64_t *all = sdb_malloc(sizeof(uint64_t) * (size_t)(calls * threads));

	*res = (api_result){0};
	for (long i = 0; i < threads; i++)
		lims[i] = (private_limiters || i == 0) ? rl_limiter_new(&o) : lims[0];
	for (long i = 0; i < threads; i++) {
		w[i] = (worker){.lim = lims[i], .id = (int)i, .ops = ops, .keys = keys, .batch = batch,
				.limit = limit,
				.lat = sdb_malloc(sizeof(uint64_t) * (size_t)calls)};
	}
	uint64_t t0 = now_ns();
	for (long i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, run_worker, &w[i]);
	for (long i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	res->secs = (double)(now_ns() - t0) / 1e9;
	for (long i = 0; i < threads; i++) {
		memcpy(all + i * calls, w[i].lat, sizeof(uint64_t) * (size_t)calls);
		res->over += w[i].over;
		cpu_ns += w[i].cpu_ns;
		free(w[i].lat);
	}
	qsort(all, (size_t)(calls * threads), sizeof(uint64_t), cmp_u64);
	long n = calls * threads;
	res->decisions = n * batch;
	res->cpu_s = (double)cpu_ns / 1e9;
	res->p50_ns = all[n / 2];
	res->p99_ns = all[(n * 99) / 100];
	free(all);
	free(th);
	free(w);
	for (long i = 0; i < threads; i++)
		if (private_limiters || i == 0)
			rl_limiter_free(lims[i]);
	free(lims);
}

static int bench_api(int argc, char **argv)
{
	long threads = opt_long(argc, argv, "--threads", 2);
	long ops = opt_long(argc, argv, "--ops", 2000000);
	long keys = opt_long(argc, argv, "--keys", 10000);
	long batch = opt_long(argc, argv, "--batch", 1);
	api_result r;

	if (threads < 1 || ops < 1 || keys < 1 || batch < 1 || batch > ops) {
		fprintf(stderr, "ratelimit_bench api: --threads, --ops, --keys, --batch >= 1 and "
				"--batch <= --ops\n");
		return 2;
	}
	api_run(threads, ops, keys, batch, 100, false, &r);
	/* rate: decisions per wall-clock second (what the threads got of the machine);
	 * cpu_rate: decisions per CPU-second of the workers, a measure of the cost per
	 * decision that other processes on a shared machine do not move, except through
	 * the caches; cpu_util: CPUs the workers actually had on average (a thread that
	 * waits for a lock or a CPU does not count) */
	printf("api threads=%ld batch=%ld keys=%ld decisions=%ld seconds=%.3f rate=%.0f "
	       "p50_ns=%" PRIu64 " p99_ns=%" PRIu64 " over_limit=%ld cpu_seconds=%.3f "
	       "cpu_rate=%.0f cpu_util=%.2f\n",
	       threads, batch, keys, r.decisions, r.secs, (double)r.decisions / r.secs, r.p50_ns,
	       r.p99_ns, r.over, r.cpu_s, (double)r.decisions / r.cpu_s, r.cpu_s / r.secs);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Scaling with threads (issue #23): --rounds rounds, each one run on 1 thread, one on
 * --threads threads sharing one limiter (what the proxy's threads do), and one on
 * --threads threads with a limiter each (the same work sharing nothing: what the machine
 * itself allows, e.g. when its vCPUs are hyperthreads of one core), all with the same
 * --ops per thread and keys, so every ratio compares runs seconds apart. Prints each round
 * and the medians of the rounds' ratios: shared (decisions/s of N threads on one limiter
 * over 1 thread's), ceiling (the same for N private limiters) and shared/ceiling (the
 * share of the machine's scaling the limiter keeps); then the same medians over the
 * "clean" rounds only, those whose N-thread runs both had at least 0.9 x N CPUs. */
static int bench_scale(int argc, char **argv)
{
	long threads = opt_long(argc, argv, "--threads", 2);
	long ops = opt_long(argc, argv, "--ops", 2000000);
	long keys = opt_long(argc, argv, "--keys", 10000);
	long rounds = opt_long(argc, argv, "--rounds", 7);
	long limit = ops * threads + 1;
	double *wall = sdb_calloc((size_t)rounds, sizeof(double));
	double *ceiling = sdb_calloc((size_t)rounds, sizeof(double));
	double *eff = sdb_calloc((size_t)rounds, sizeof(double));
	double *cwall = sdb_calloc((size_t)rounds, sizeof(double));
	double *cceil = sdb_calloc((size_t)rounds, sizeof(double));
	double *ceff = sdb_calloc((size_t)rounds, sizeof(double));
	long nclean = 0;
	api_result one, many, priv;

	if (threads < 2 || rounds < 1 || ops < 1 || keys < 1) {
		fprintf(stderr, "ratelimit_bench scale: --threads >= 2, --rounds/--ops/--keys >= 1\n");
		free(wall);
		free(ceiling);
		free(eff);
		free(cwall);
		free(cceil);
		free(ceff);
		return 2;
	}
	for (long i = 0; i < rounds; i++) {
		/* a limit no key reaches: every decision of every run takes the same path (an
		 * under-limit update), though the shared run hits each key N times as often */
		api_run(1, ops, keys, 1, limit, false, &one);
		api_run(threads, ops, keys, 1, limit, false, &many);
		api_run(threads, ops, keys, 1, limit, true, &priv);
		double r1 = (double)one.decisions / one.secs, rn = (double)many.decisions / many.secs;
		double rp = (double)priv.decisions / priv.secs;
		wall[i] = rn / r1;
		ceiling[i] = rp / r1;
		eff[i] = rn / rp;
		/* a round whose N-thread runs did not get N CPUs (another process took them)
		 * measured the neighbours: the "clean" medians leave it out */
		double us = many.cpu_s / many.secs, up = priv.cpu_s / priv.secs;
		if (us >= 0.9 * (double)threads && up >= 0.9 * (double)threads) {
			cwall[nclean] = wall[i];
			cceil[nclean] = ceiling[i];
			ceff[nclean++] = eff[i];
		}
		printf("scale round=%ld threads=%ld rate_1=%.0f rate_shared=%.0f rate_private=%.0f "
		       "cpu_util_shared=%.2f cpu_util_private=%.2f shared_ratio=%.2f "
		       "ceiling_ratio=%.2f shared_of_ceiling=%.2f\n",
		       i + 1, threads, r1, rn, rp, many.cpu_s / many.secs, priv.cpu_s / priv.secs,
		       wall[i], ceiling[i], eff[i]);
	}
	qsort(wall, (size_t)rounds, sizeof(double), cmp_double);
	qsort(ceiling, (size_t)rounds, sizeof(double), cmp_double);
	qsort(eff, (size_t)rounds, sizeof(double), cmp_double);
	qsort(cwall, (size_t)nclean, sizeof(double), cmp_double);
	qsort(cceil, (size_t)nclean, sizeof(double), cmp_double);
	qsort(ceff, (size_t)nclean, sizeof(double), cmp_double);
	printf("scale threads=%ld rounds=%ld keys=%ld median_shared_ratio=%.2f min=%.2f max=%.2f "
	       "median_ceiling_ratio=%.2f median_shared_of_ceiling=%.2f clean_rounds=%ld "
	       "clean_median_shared_ratio=%.2f clean_median_ceiling_ratio=%.2f "
	       "clean_median_shared_of_ceiling=%.2f\n",
	       threads, rounds, keys, wall[rounds / 2], wall[0], wall[rounds - 1], ceiling[rounds / 2],
	       eff[rounds / 2], nclean, nclean ? cwall[nclean / 2] : 0.0,
	       nclean ? cceil[nclean / 2] : 0.0, nclean ? ceff[nclean / 2] : 0.0);
	free(cwall);
	free(cceil);
	free(ceff);
	free(eff);
	free(ceiling);
	free(wall);
	return 0;
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

static int bench_memory(int argc, char **argv)
{
	long keys = opt_long(argc, argv, "--keys", 1000000);
	long cache = opt_long(argc, argv, "--cache", 1000000);
	char key[32];
	rl_resp out;
	struct mallinfo2 m0 = mallinfo2();
	long rss0 = rss_kib();
	rl_limiter_opts o = {.cache_size = (size_t)cache};
	rl_limiter *lim = rl_limiter_new(&o);
	size_t peak_held = 0;

	for (long i = 0; i < keys; i++) {
		snprintf(key, sizeof key, "account:%07ld", i);
		rl_req r = {.name = "requests_per_sec", .unique_key = key, .hits = 1,
			    .limit = 100, .duration = 60000};
		rl_limiter_decide(lim, &r, 1, &out, NULL, 0);
		if ((i & 0xffff) == 0 && rl_limiter_size(lim) > peak_held)
			peak_held = rl_limiter_size(lim);
	}
	size_t held = rl_limiter_size(lim);
	if (held > peak_held)
		peak_held = held;
	struct mallinfo2 m1 = mallinfo2();
	long rss1 = rss_kib();
	size_t heap = m1.uordblks + m1.hblkhd - m0.uordblks - m0.hblkhd;
	printf("memory keys=%ld cache=%ld held=%zu peak_held=%zu heap_bytes=%zu rss_growth_bytes=%ld "
	       "heap_bytes_per_key=%.1f rss_bytes_per_key=%.1f within_capacity=%s\n",
	       keys, cache, held, peak_held, heap, (rss1 - rss0) * 1024, (double)heap / (double)held,
	       (double)(rss1 - rss0) * 1024.0 / (double)held,
	       peak_held <= (size_t)cache ? "yes" : "NO");
	rl_limiter_free(lim);
	return peak_held <= (size_t)cache ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "api") == 0)
		return bench_api(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "scale") == 0)
		return bench_scale(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "memory") == 0)
		return bench_memory(argc, argv);
	fprintf(stderr, "usage: ratelimit_bench api|scale|memory [options] (see the source)\n");
	return 2;
}
