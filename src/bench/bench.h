/* `stripedb bench`: a workload generator through MongoDB drivers (issue #9).
 *
 * Runs YCSB core workloads A-F (Cooper et al., "Benchmarking Cloud Serving Systems with
 * YCSB", SoCC 2010; the CoreWorkload mixes and request distributions) or a payments
 * workload against any MongoDB-wire endpoint (a shard, or the proxies) with libmongoc: N
 * threads share one mongoc_client_pool. Latencies go into per-thread log-linear
 * histograms (hist.h) per phase and operation kind; the caller may cut the run into
 * phases (bench_mark) to compare latency before, during and after an event.
 *
 * Every key is written by exactly one thread (key % threads), one operation at a time,
 * and each write sets the document's field `v` to the next version of that key, so the
 * history of a key is a sequence of increasing versions. The history of every
 * operation (bench_write_history, JSON lines) and the built-in checker (bench_check)
 * rely on that: see check.c.
 *
 * Workloads (YCSB defaults: 10 fields of value_bytes/10 bytes, keys "user%012lld"):
 *   a  50% read, 50% update, zipfian       d  95% read, 5% insert, latest
 *   b  95% read,  5% update, zipfian       e  95% scan (<=100), 5% insert, zipfian
 *   c 100% read, zipfian                   f  50% read, 50% read-modify-write, zipfian
 *   payments  collection `charges` of merchants (zipfian: a few big merchants), keys
 *      "ch_mMMMM_KKKKKKKKKKKK", documents ~600 bytes (customer, card, amount, currency,
 *      status, created epoch ms, metadata, billing address); 35% new charge (insert),
 *      15% refund (update status/amountRefunded), 30% get a charge by _id and merchant,
 *      20% charges of a merchant in a 10-minute window of `created` (index
 *      {merchant: 1, created: 1}).
 */
#ifndef SDB_BENCH_BENCH_H
#define SDB_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <mongoc/mongoc.h>

#include "bench/hist.h"

#define BENCH_MAX_PHASES 16
#define BENCH_N_OPS 6
#define BENCH_N_ERRS 6

/* Operation kinds (index into per-phase histograms). */
typedef enum { BENCH_READ, BENCH_UPDATE, BENCH_INSERT, BENCH_SCAN, BENCH_RMW, BENCH_QUERY } bench_op;
/* Error kinds: 462 over quota, 11000 duplicate key, a network / server selection error,
 * a routing error the proxy gave up retrying (StaleConfig 13388, ShardNotFound 70,
 * HostUnreachable 6), a timeout (50 MaxTimeMSExpired, client socket timeout), other. */
typedef enum {
	BENCH_ERR_QUOTA,
	BENCH_ERR_DUP,
	BENCH_ERR_NETWORK,
	BENCH_ERR_ROUTING,
	BENCH_ERR_TIMEOUT,
	BENCH_ERR_OTHER
} bench_err;

/* MongoDB's default serverSelectionTimeoutMS (server selection spec), when the URI has none. */
#define BENCH_SELECT_TIMEOUT_DEFAULT_MS 30000

/* The kind of error e (a libmongoc error, error API version 2) of an operation that took
 * elapsed_ms: server errors by code (bench_err above); a stream or client error is a
 * TIMEOUT when the operation took at least socket_timeout_ms, else NETWORK; a server
 * selection error likewise against select_timeout_ms (libmongoc gives a timeout and a
 * reset the same code, so the time the operation took decides, never the message text;
 * a timeout of 0 or less counts as none). *definite is 1 when the server certainly did
 * not apply the operation (quota, duplicate key, bad arguments), else 0.
 * Returns: a bench_err. */
bench_err bench_error_class(const bson_error_t *e, uint64_t elapsed_ms, int32_t socket_timeout_ms,
			    int32_t select_timeout_ms, int *definite);

typedef struct bench_opts {
	const char *uri;      /* mongodb:// URI; required */
	const char *db;       /* default "ycsb" (payments: "pay") */
	const char *workload; /* "a".."f" or "payments" (default "a") */
	const char *dist;     /* "zipfian" | "uniform" | "latest" | NULL: the workload's own */
	int threads;          /* default 4 */
	int64_t records;      /* documents loaded before the run (default 10000) */
	double seconds;       /* run time; 0 = until bench_stop() (default 10 via the CLI) */
	int load;             /* 1: drop the collection and load `records` first */
	int value_bytes;      /* YCSB record size (default 1000) */
	int merchants;        /* payments: number of merchants (default 200) */
	int create_indexes;   /* payments: create {merchant: 1, created: 1} (default 1) */
	uint64_t seed;        /* 0 = from the clock */
	const char *label;    /* the first phase's label (default "run") */
} bench_opts;

typedef struct bench_phase_stats {
	char label[64];
	uint64_t start_ns, end_ns; /* monotonic, relative to the run's start */
	bench_hist h[BENCH_N_OPS];
	uint64_t errs[BENCH_N_ERRS];
} bench_phase_stats;

typedef struct bench_verdict {
	int ok;               /* 1 when no violation was found */
	int64_t keys, writes, acked, failed, unknown, reads, docs;
	int64_t violations;
	char first[4][256];   /* the first violations, human-readable */
	double check_ms;
} bench_verdict;

typedef struct bench bench;

/* Connect, optionally load, and start the threads; returns at once with the workload
 * running (phase 0, label "run"). *out is freed with bench_free. The load phase runs
 * inside this call (threads in parallel), its history is kept. Options are copied.
 * Errors: SDB_EINVAL (bad option, message in err), SDB_EIO (the endpoint cannot be
 * reached or the load failed). */
int bench_start(const bench_opts *o, bench **out, char *err, size_t errlen);

/* Close the current phase and open one named label (copied; at most BENCH_MAX_PHASES,
 * later calls rename the last phase). Thread-safe against the workers. */
void bench_mark(bench *b, const char *label);

/* Whether the run ended by itself (opts.seconds elapsed). Returns: 1 yes, 0 no. */
int bench_done(const bench *b);

/* One line of interval statistics since the previous call (ops/s, p50/p99 ms, errors)
 * into buf. Call from one thread. */
void bench_status_line(bench *b, char *buf, size_t n);

/* Stop the workers and join them (idempotent). */
void bench_stop(bench *b);

/* Totals of phase i merged over threads into *out (after bench_stop, or racy-but-safe
 * while running). Returns: the number of phases (never an error; *out zeroed when i
 * is not below it). */
int bench_phase(bench *b, int i, bench_phase_stats *out);

/* The text report (per phase: ops, ops/s, p50/p95/p99/max per kind, errors by kind) to f;
 * when json_path is set, the same as one JSON document. Errors: SDB_EIO (json_path cannot
 * be written; no message). */
int bench_report(bench *b, FILE *f, const char *json_path, const bench_verdict *v);

/* Write the history, one JSON object per line:
 *   {"op": "insert|update|read", "key": "_id", "value": V, "ok": "ok|fail|unknown",
 *    "n": N, "start_ns": T0, "end_ns": T1}
 * value: the version written, or for a read the version seen (0 = absent); n: matched
 * count of an update. Errors: SDB_EIO (path cannot be written; no message). The fields
 * map one to one onto the tuples of
 * tests/integration/checker.py: (op, writer, key, value or None for an absent read,
 * start_ns, end_ns, ok, n for an update); test_bench.py checks a history with it. */
int bench_write_history(bench *b, const char *path);

/* Read every document of the workload's collection through the URI and check the
 * history against it (check.c): per key a single-writer register of increasing versions;
 * an acknowledged write must be visible to reads that start after it and in the final
 * state; a read must not see a version older than one acknowledged before it started,
 * nor a version not yet written, nor one that failed; no document may exist that no
 * write produced. Call after bench_stop. Returns 0 (verdict in *v). Errors: SDB_EIO (the
 * final read failed, message in err). */
int bench_check(bench *b, bench_verdict *v, char *err, size_t errlen);

void bench_free(bench *b);

/* `stripedb bench ARGS...` (argv excludes "stripedb bench"). Returns: the exit code, 0,
 * 1 (failure or interrupted), 2 usage. */
int bench_main(int argc, char **argv);

/* `stripedb demo ARGS...` (cli/demo.c; argv excludes "stripedb demo"): see that file.
 * Returns: the exit code, 0 (every check passed), 1, 2 usage, 130 interrupted. */
int cli_demo_main(int argc, char **argv);

#endif
