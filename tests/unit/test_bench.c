/* Unit tests of src/bench: error classes, the histogram and the history checker. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. bench.c (bench_error_class) comes from the
 * archive. */
#include "../../src/bench/hist.c"
#include "../../src/bench/check.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bench/bench.h"
#include "bench/check.h"
#include "bench/hist.h"

/* Timeouts are told by the time the operation took, not by libmongoc's message text. */
static void test_error_class(void **state)
{
	bson_error_t e;
	int definite = -1;

	(void)state;
	memset(&e, 0, sizeof e);
	e.domain = MONGOC_ERROR_STREAM;
	e.code = MONGOC_ERROR_STREAM_SOCKET;
	snprintf(e.message, sizeof e.message, "Failed to read 4 bytes: socket error or timeout");
	assert_int_equal(bench_error_class(&e, 12, 2000, 30000, &definite), BENCH_ERR_NETWORK);
	assert_int_equal(definite, 0);
	assert_int_equal(bench_error_class(&e, 2000, 2000, 30000, &definite), BENCH_ERR_TIMEOUT);
	assert_int_equal(bench_error_class(&e, 99999, 0, 30000, &definite), BENCH_ERR_NETWORK);
	/* the message no longer decides: "timed out" after 5 ms is a network error */
	snprintf(e.message, sizeof e.message, "connection timed out");
	assert_int_equal(bench_error_class(&e, 5, 2000, 30000, &definite), BENCH_ERR_NETWORK);
	e.domain = MONGOC_ERROR_SERVER_SELECTION;
	e.code = MONGOC_ERROR_SERVER_SELECTION_FAILURE;
	assert_int_equal(bench_error_class(&e, 29999, 2000, 30000, &definite), BENCH_ERR_NETWORK);
	assert_int_equal(bench_error_class(&e, 30000, 2000, 30000, &definite), BENCH_ERR_TIMEOUT);
	e.domain = MONGOC_ERROR_SERVER;
	e.code = 50; /* MaxTimeMSExpired */
	assert_int_equal(bench_error_class(&e, 1, 2000, 30000, &definite), BENCH_ERR_TIMEOUT);
	e.code = 11000;
	assert_int_equal(bench_error_class(&e, 1, 2000, 30000, &definite), BENCH_ERR_DUP);
	assert_int_equal(definite, 1);
}

static void test_hist_buckets(void **state)
{
	(void)state;
	/* every value maps into a bucket whose range holds it; buckets are contiguous */
	for (uint64_t v = 0; v < 100000; v += 7) {
		int i = bench_hist_index(v);
		assert_true(bench_hist_lower(i) <= v);
		assert_true(v < bench_hist_lower(i + 1));
	}
	assert_int_equal(bench_hist_index(15), 15);
	assert_int_equal(bench_hist_index(16), 16);
	assert_int_equal(bench_hist_index(31), 31);
	assert_int_equal(bench_hist_index(32), 32);
	assert_int_equal(bench_hist_index(33), 32); /* 32..33 share a bucket of width 2 */
	assert_int_equal(bench_hist_index(1ull << 45), BENCH_HIST_BUCKETS - 1);
}

static void test_hist_percentiles(void **state)
{
	static bench_hist h, h2, d;
	(void)state;
	assert_int_equal(bench_hist_percentile(&h, 50), 0);
	for (uint64_t v = 1; v <= 1000; v++) {
		bench_hist_record(&h, v);
	}
	assert_int_equal(h.n, 1000);
	assert_int_equal(h.max, 1000);
	/* the 500th value (500) lies in bucket [496, 512): midpoint 504 */
	assert_int_equal(bench_hist_percentile(&h, 50), 504);
	/* the 990th value (990) lies in bucket [960, 992): midpoint 976 */
	assert_int_equal(bench_hist_percentile(&h, 99), 976);
	assert_int_equal(bench_hist_percentile(&h, 100), 1000); /* capped at max */
	h2 = h;
	bench_hist_record(&h2, 5);
	bench_hist_record(&h2, 5);
	bench_hist_diff(&d, &h2, &h);
	assert_int_equal(d.n, 2);
	assert_int_equal(bench_hist_percentile(&d, 50), 5);
	bench_hist_merge(&d, &h);
	assert_int_equal(d.n, 1002);
	assert_int_equal(d.sum, 500500 + 10);
}

static bench_ev ev(int op, int64_t key, int64_t value, int outcome, int n, uint64_t t0, uint64_t t1)
{
	bench_ev e;
	memset(&e, 0, sizeof e);
	e.op = (uint8_t)op;
	e.key = key;
	e.value = value;
	e.outcome = (uint8_t)outcome;
	e.n = n;
	e.t0 = t0;
	e.t1 = t1;
	return e;
}

static void test_check_good(void **state)
{
	bench_ev h[8];
	int64_t final[4] = {3, 1, 0, 0};
	bench_verdict v;
	(void)state;
	h[0] = ev(BENCH_EV_INSERT, 0, 1, BENCH_OK, 1, 0, 10);
	h[1] = ev(BENCH_EV_UPDATE, 0, 2, BENCH_OK, 1, 20, 30);
	h[2] = ev(BENCH_EV_UPDATE, 0, 3, BENCH_UNKNOWN, 0, 40, 50); /* applied after all */
	h[3] = ev(BENCH_EV_READ, 0, 2, BENCH_OK, 0, 35, 38);
	h[4] = ev(BENCH_EV_READ, 0, 3, BENCH_OK, 0, 45, 60);  /* concurrent with the write */
	h[5] = ev(BENCH_EV_INSERT, 1, 1, BENCH_OK, 1, 0, 10);
	h[6] = ev(BENCH_EV_READ, 1, 0, BENCH_OK, 0, 2, 5);    /* before the insert finished */
	h[7] = ev(BENCH_EV_INSERT, 2, 1, BENCH_FAIL, 0, 0, 10); /* 462: not applied */
	bench_check_history(h, 8, final, 4, 0, &v);
	assert_int_equal(v.ok, 1);
	assert_int_equal(v.violations, 0);
	assert_int_equal(v.keys, 3);
	assert_int_equal(v.writes, 5);
	assert_int_equal(v.acked, 3);
	assert_int_equal(v.failed, 1);
	assert_int_equal(v.unknown, 1);
	assert_int_equal(v.reads, 3);
	assert_int_equal(v.docs, 2);
}

static void test_check_violations(void **state)
{
	bench_ev h[6];
	int64_t final[4] = {1, 0, 7, 1};
	bench_verdict v;
	(void)state;
	h[0] = ev(BENCH_EV_INSERT, 0, 1, BENCH_OK, 1, 0, 10);
	h[1] = ev(BENCH_EV_UPDATE, 0, 2, BENCH_OK, 1, 20, 30);  /* lost: final is 1 */
	h[2] = ev(BENCH_EV_READ, 0, 1, BENCH_OK, 0, 40, 45);    /* stale read */
	h[3] = ev(BENCH_EV_INSERT, 1, 1, BENCH_OK, 1, 0, 10);   /* document missing */
	h[4] = ev(BENCH_EV_INSERT, 2, 1, BENCH_OK, 1, 0, 10);
	h[5] = ev(BENCH_EV_READ, 2, 5, BENCH_OK, 0, 20, 25);    /* a value never written */
	/* key 2's final v=7 was never written; key 3 has a document but no history */
	bench_check_history(h, 6, final, 4, 1, &v);
	assert_int_equal(v.ok, 0);
	/* key 0: stale read + final; key 1: missing; key 2: read + final; key 3: orphan;
	 * plus one extra document */
	assert_int_equal(v.violations, 7);
	assert_non_null(strstr(v.first[0], "stale read"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error_class),
		cmocka_unit_test(test_hist_buckets),
		cmocka_unit_test(test_hist_percentiles),
		cmocka_unit_test(test_check_good),
		cmocka_unit_test(test_check_violations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
