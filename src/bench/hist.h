/* A log-linear latency histogram (HDR-style, two significant hex digits).
 *
 * Values are non-negative integers in a unit the caller picks (bench uses microseconds).
 * Values below 16 get a bucket each; above, every power of two is cut into 16 equal
 * buckets, so any recorded value is reported within 1/16 (6.25 %) of its true value, from
 * 0 up to 2^40. No allocation: a histogram is a plain struct, zero-initialised to empty.
 * Not thread-safe: one writer per histogram (bench keeps one per thread and merges).
 */
#ifndef SDB_BENCH_HIST_H
#define SDB_BENCH_HIST_H

#include <stdint.h>

#define BENCH_HIST_SUB 16
#define BENCH_HIST_BUCKETS ((40 - 3) * BENCH_HIST_SUB)

typedef struct bench_hist {
	uint64_t counts[BENCH_HIST_BUCKETS];
	uint64_t n;
	uint64_t sum;
	uint64_t max;
} bench_hist;

/* Record one value (values >= 2^40 are clamped into the last bucket). */
void bench_hist_record(bench_hist *h, uint64_t v);

/* dst += src (bucket by bucket; max is the larger). */
void bench_hist_merge(bench_hist *dst, const bench_hist *src);

/* dst = a - b, for a later snapshot a of the same histogram as b (interval statistics);
 * max is a's max (an upper bound for the interval). */
void bench_hist_diff(bench_hist *dst, const bench_hist *a, const bench_hist *b);

/* The value at percentile p (0 < p <= 100): the midpoint of the bucket holding the
 * ceil(p/100 * n)-th smallest value, never above max. 0 for an empty histogram. */
uint64_t bench_hist_percentile(const bench_hist *h, double p);

/* Bucket index of v and the smallest value of bucket i (exposed for the unit test).
 * Returns: (bench_hist_index) the index, 0..BENCH_HIST_BUCKETS-1. */
int bench_hist_index(uint64_t v);
uint64_t bench_hist_lower(int i);

#endif
