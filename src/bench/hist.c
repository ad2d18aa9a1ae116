/* Log-linear histogram. See hist.h. */
#include "bench/hist.h"

#include <string.h>

int bench_hist_index(uint64_t v)
{
	int e;

	if (v < BENCH_HIST_SUB) {
		return (int)v;
	}
	if (v >= (1ull << 40)) {
		return BENCH_HIST_BUCKETS - 1;
	}
	e = 63 - __builtin_clzll(v); /* 4..39 */
	return (e - 3) * BENCH_HIST_SUB + (int)((v >> (e - 4)) & (BENCH_HIST_SUB - 1));
}

uint64_t bench_hist_lower(int i)
{
	int e;

	if (i < BENCH_HIST_SUB) {
		return (uint64_t)i;
	}
	e = i / BENCH_HIST_SUB + 3;
	return (1ull << e) + ((uint64_t)(i % BENCH_HIST_SUB) << (e - 4));
}

void bench_hist_record(bench_hist *h, uint64_t v)
{
	h->counts[bench_hist_index(v)]++;
	h->n++;
	h->sum += v;
	if (v > h->max) {
		h->max = v;
	}
}

void bench_hist_merge(bench_hist *dst, const bench_hist *src)
{
	for (int i = 0; i < BENCH_HIST_BUCKETS; i++) {
		dst->counts[i] += src->counts[i];
	}
	dst->n += src->n;
	dst->sum += src->sum;
	if (src->max > dst->max) {
		dst->max = src->max;
	}
}

void bench_hist_diff(bench_hist *dst, const bench_hist *a, const bench_hist *b)
{
	for (int i = 0; i < BENCH_HIST_BUCKETS; i++) {
		dst->counts[i] = a->counts[i] >= b->counts[i] ? a->counts[i] - b->counts[i] : 0;
	}
	dst->n = a->n >= b->n ? a->n - b->n : 0;
	dst->sum = a->sum >= b->sum ? a->sum - b->sum : 0;
	dst->max = a->max;
}

uint64_t bench_hist_percentile(const bench_hist *h, double p)
{
	uint64_t rank, seen = 0;

	if (h->n == 0) {
		return 0;
	}
	rank = (uint64_t)((p / 100.0) * (double)h->n + 0.999999);
	if (rank == 0) {
		rank = 1;
	}
	if (rank > h->n) {
		rank = h->n;
	}
	for (int i = 0; i < BENCH_HIST_BUCKETS; i++) {
		seen += h->counts[i];
		if (seen >= rank) {
			uint64_t lo = bench_hist_lower(i);
			uint64_t hi = i + 1 < BENCH_HIST_BUCKETS ? bench_hist_lower(i + 1) : lo + 1;
			uint64_t mid = lo + (hi - lo) / 2;
			return mid > h->max ? h->max : mid;
		}
	}
	return h->max;
}
