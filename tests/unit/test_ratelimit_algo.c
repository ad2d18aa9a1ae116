/* Unit tests of the rate-limit algorithms (ratelimit/algo.c) through the limiter API,
 * with created_at as the request clock: Gubernator's documented scenarios
 * (functional_test.go) with exact remaining/status/reset_time, Gregorian intervals, GCRA,
 * and one test per Gubernator defect that stripedb fixes. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/ratelimit/algo.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "ratelimit/algo.h"
#include "ratelimit/limiter.h"

#define T0 INT64_C(1700000000000) /* 2023-11-14T22:13:20Z */

static int64_t fake_now = T0;

static int64_t fake_clock(void *d)
{
	(void)d;
	return fake_now;
}

static rl_limiter *new_limiter(void)
{
	rl_limiter_opts o = {.cache_size = 1000, .clock = fake_clock};
	return rl_limiter_new(&o);
}

/* One request, answered. */
static rl_resp ask(rl_limiter *lim, const char *key, int32_t algo, int32_t behavior,
		   int64_t hits, int64_t limit, int64_t duration, int64_t burst, int64_t at)
{
	rl_req r = {.name = "test", .unique_key = key, .hits = hits, .limit = limit,
		    .duration = duration, .algorithm = algo, .behavior = behavior,
		    .burst = burst, .created_at = at};
	rl_resp out;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error, "");
	return out;
}

#define EXPECT(resp, st, rem, reset)                            \
	do {                                                    \
		rl_resp r_ = (resp);                            \
		assert_int_equal(r_.status, (st));              \
		assert_int_equal(r_.remaining, (rem));          \
		assert_int_equal(r_.reset_time, (reset));       \
	} while (0)

#define TB(lim, key, beh, hits, limit, dur, at) ask(lim, key, RL_TOKEN_BUCKET, beh, hits, limit, dur, 0, at)
#define LB(lim, key, beh, hits, limit, dur, burst, at) ask(lim, key, RL_LEAKY_BUCKET, beh, hits, limit, dur, burst, at)

/* --- token bucket ------------------------------------------------------------------ */

/* Gubernator TestOverTheLimit / the scenario: limit 2, duration 5 s, hits 1,1,1. */
static void test_token_bucket_over_limit(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "k", 0, 1, 2, 5000, T0), RL_UNDER_LIMIT, 1, T0 + 5000);
	EXPECT(TB(lim, "k", 0, 1, 2, 5000, T0 + 1), RL_UNDER_LIMIT, 0, T0 + 5000);
	rl_resp r = TB(lim, "k", 0, 1, 2, 5000, T0 + 2);
	EXPECT(r, RL_OVER_LIMIT, 0, T0 + 5000);
	assert_int_equal(r.limit, 2);
	assert_int_equal(r.retry_after, 4998);
	/* still inside the window one ms before the reset */
	EXPECT(TB(lim, "k", 0, 1, 2, 5000, T0 + 4999), RL_OVER_LIMIT, 0, T0 + 5000);
	/* at reset_time the bucket is new */
	EXPECT(TB(lim, "k", 0, 1, 2, 5000, T0 + 5000), RL_UNDER_LIMIT, 1, T0 + 10000);
	rl_limiter_free(lim);
}

static void test_token_bucket_query(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "q", 0, 0, 10, 1000, T0), RL_UNDER_LIMIT, 10, T0 + 1000);
	EXPECT(TB(lim, "q", 0, 3, 10, 1000, T0 + 10), RL_UNDER_LIMIT, 7, T0 + 1000);
	EXPECT(TB(lim, "q", 0, 0, 10, 1000, T0 + 20), RL_UNDER_LIMIT, 7, T0 + 1000);
	EXPECT(TB(lim, "q", 0, 0, 10, 1000, T0 + 30), RL_UNDER_LIMIT, 7, T0 + 1000);
	rl_limiter_free(lim);
}

/* Gubernator TestTokenBucketNegativeHits: limit 2; -1, -1, 4, -1 -> 3, 4, 0, 1. */
static void test_token_bucket_negative_hits(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "n", 0, -1, 2, 5000, T0), RL_UNDER_LIMIT, 3, T0 + 5000);
	EXPECT(TB(lim, "n", 0, -1, 2, 5000, T0), RL_UNDER_LIMIT, 4, T0 + 5000);
	EXPECT(TB(lim, "n", 0, 4, 2, 5000, T0), RL_UNDER_LIMIT, 0, T0 + 5000);
	EXPECT(TB(lim, "n", 0, -1, 2, 5000, T0), RL_UNDER_LIMIT, 1, T0 + 5000);
	rl_limiter_free(lim);
}

/* A request for more than remaining is refused without consuming. */
static void test_token_bucket_refuse_without_consuming(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "r", 0, 7, 10, 1000, T0), RL_UNDER_LIMIT, 3, T0 + 1000);
	rl_resp r = TB(lim, "r", 0, 5, 10, 1000, T0 + 100);
	EXPECT(r, RL_OVER_LIMIT, 3, T0 + 1000);
	assert_int_equal(r.retry_after, 900);
	EXPECT(TB(lim, "r", 0, 3, 10, 1000, T0 + 200), RL_UNDER_LIMIT, 0, T0 + 1000);
	/* more than the limit on a fresh key: refused, nothing consumed, never succeeds */
	r = TB(lim, "big", 0, 11, 10, 1000, T0);
	EXPECT(r, RL_OVER_LIMIT, 10, T0 + 1000);
	assert_int_equal(r.retry_after, -1);
	/* limit 0 (Gubernator TestMissingFields): always over */
	EXPECT(TB(lim, "zero", 0, 1, 0, 1000, T0), RL_OVER_LIMIT, 0, T0 + 1000);
	rl_limiter_free(lim);
}

/* Gubernator TestDrainOverLimit, token bucket: 0, 1, 100, 0 -> 10, 9, 0 (over), 0. */
static void test_token_bucket_drain_over_limit(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "d", RL_DRAIN_OVER_LIMIT, 0, 10, 30000, T0), RL_UNDER_LIMIT, 10, T0 + 30000);
	EXPECT(TB(lim, "d", RL_DRAIN_OVER_LIMIT, 1, 10, 30000, T0), RL_UNDER_LIMIT, 9, T0 + 30000);
	EXPECT(TB(lim, "d", RL_DRAIN_OVER_LIMIT, 100, 10, 30000, T0), RL_OVER_LIMIT, 0, T0 + 30000);
	EXPECT(TB(lim, "d", RL_DRAIN_OVER_LIMIT, 0, 10, 30000, T0), RL_UNDER_LIMIT, 0, T0 + 30000);
	rl_limiter_free(lim);
}

/* Gubernator TestResetRemaining: 1, 1, RESET(1), 1 -> 99, 98, 100, 99. */
static void test_token_bucket_reset_remaining(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "rr", 0, 1, 100, 9000, T0), RL_UNDER_LIMIT, 99, T0 + 9000);
	EXPECT(TB(lim, "rr", 0, 1, 100, 9000, T0), RL_UNDER_LIMIT, 98, T0 + 9000);
	EXPECT(TB(lim, "rr", RL_RESET_REMAINING, 1, 100, 9000, T0 + 5), RL_UNDER_LIMIT, 100, T0 + 9000);
	EXPECT(TB(lim, "rr", 0, 1, 100, 9000, T0 + 6), RL_UNDER_LIMIT, 99, T0 + 9000);
	rl_limiter_free(lim);
}

/* Gubernator TestChangeLimit (token bucket): 100: 99, 98; 10: 7, 6; 200: 195. */
static void test_token_bucket_change_limit(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "cl", 0, 1, 100, 9000, T0), RL_UNDER_LIMIT, 99, T0 + 9000);
	EXPECT(TB(lim, "cl", 0, 1, 100, 9000, T0), RL_UNDER_LIMIT, 98, T0 + 9000);
	rl_resp r = TB(lim, "cl", 0, 1, 10, 9000, T0);
	EXPECT(r, RL_UNDER_LIMIT, 7, T0 + 9000);
	assert_int_equal(r.limit, 10);
	EXPECT(TB(lim, "cl", 0, 1, 10, 9000, T0), RL_UNDER_LIMIT, 6, T0 + 9000);
	r = TB(lim, "cl", 0, 1, 200, 9000, T0);
	EXPECT(r, RL_UNDER_LIMIT, 195, T0 + 9000);
	assert_int_equal(r.limit, 200);
	rl_limiter_free(lim);
}

/* A changed duration moves the window's end at once (window start kept). */
static void test_token_bucket_change_duration(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "cd", 0, 1, 5, 10000, T0), RL_UNDER_LIMIT, 4, T0 + 10000);
	EXPECT(TB(lim, "cd", 0, 1, 5, 20000, T0 + 3000), RL_UNDER_LIMIT, 3, T0 + 20000);
	EXPECT(TB(lim, "cd", 0, 1, 5, 4000, T0 + 3500), RL_UNDER_LIMIT, 2, T0 + 4000);
	rl_limiter_free(lim);
}

/* Switching a live key between a ms duration and a Gregorian interval moves the window's
 * end to the interval's end (computed from the request's clock), keeping the count. */
static void test_token_bucket_switch_to_gregorian(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	const int32_t G = RL_DURATION_IS_GREGORIAN;
	const int64_t t = INT64_C(1709210096789), minute_end = INT64_C(1709210100000);
	EXPECT(TB(lim, "sw", 0, 1, 5, 60000, t), RL_UNDER_LIMIT, 4, t + 60000);
	EXPECT(TB(lim, "sw", G, 1, 5, RL_GREGORIAN_MINUTES, t + 1000), RL_UNDER_LIMIT, 3, minute_end - 1);
	/* and back: the window still starts at the first hit, so it ends at t + 10 s */
	EXPECT(TB(lim, "sw", 0, 1, 5, 10000, t + 2000), RL_UNDER_LIMIT, 2, t + 10000);
	/* switching to minutes in the next minute: the window began before this interval,
	 * so the bucket is renewed for the current minute */
	EXPECT(TB(lim, "sw", G, 1, 5, RL_GREGORIAN_MINUTES, minute_end + 5), RL_UNDER_LIMIT, 4,
	       minute_end + 60000 - 1);
	rl_limiter_free(lim);
}

/* --- leaky bucket ------------------------------------------------------------------ */

/* Gubernator TestLeakyBucket: limit 10 per 30 s (one token per 3 s), with its sleeps. */
static void test_leaky_bucket(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	int64_t t = T0;
	EXPECT(LB(lim, "l", 0, 1, 10, 30000, 0, t), RL_UNDER_LIMIT, 9, t + 1 * 3000);
	t += 1000;
	EXPECT(LB(lim, "l", 0, 1, 10, 30000, 0, t), RL_UNDER_LIMIT, 8, t + 2 * 3000);
	t += 1000;
	EXPECT(LB(lim, "l", 0, 1, 10, 30000, 0, t), RL_UNDER_LIMIT, 7, t + 3 * 3000);
	t += 1500; /* 3.5 s after the first hit: one token leaked */
	EXPECT(LB(lim, "l", 0, 0, 10, 30000, 0, t), RL_UNDER_LIMIT, 8, t + 2 * 3000);
	t += 3000;
	EXPECT(LB(lim, "l", 0, 0, 10, 30000, 0, t), RL_UNDER_LIMIT, 9, t + 1 * 3000);
	EXPECT(LB(lim, "l", 0, 9, 10, 30000, 0, t), RL_UNDER_LIMIT, 0, t + 10 * 3000);
	rl_resp r = LB(lim, "l", 0, 1, 10, 30000, 0, t);
	EXPECT(r, RL_OVER_LIMIT, 0, t + 10 * 3000);
	/* 1/6 of a token is left over from the leak above, but leaks count only once a
	 * whole token leaked since the last one (Gubernator's rule), 3000 ms from now: at
	 * 2500 ms the hit is still refused, at 3000 ms allowed (checked on a twin bucket) */
	assert_int_equal(r.retry_after, 3000);
	{
		rl_limiter *twin = new_limiter();
		int64_t u = T0;
		LB(twin, "l", 0, 10, 10, 30000, 0, u);
		u += 2000; /* 2/3 of a token leaked, not counted yet */
		r = LB(twin, "l", 0, 1, 10, 30000, 0, u);
		assert_int_equal(r.status, RL_OVER_LIMIT);
		assert_int_equal(r.retry_after, 1000); /* the elapsed 2000 ms count */
		assert_int_equal(LB(twin, "l", 0, 1, 10, 30000, 0, u + 999).status, RL_OVER_LIMIT);
		assert_int_equal(LB(twin, "l", 0, 1, 10, 30000, 0, u + 1000).status,
				 RL_UNDER_LIMIT);
		rl_limiter_free(twin);
	}
	t += 3000;
	EXPECT(LB(lim, "l", 0, 0, 10, 30000, 0, t), RL_UNDER_LIMIT, 1, t + 9 * 3000);
	t += 60000;
	EXPECT(LB(lim, "l", 0, 0, 10, 30000, 0, t), RL_UNDER_LIMIT, 10, t);
	t += 60000;
	EXPECT(LB(lim, "l", 0, 10, 10, 30000, 0, t), RL_UNDER_LIMIT, 0, t + 10 * 3000);
	t += 29000;
	EXPECT(LB(lim, "l", 0, 9, 10, 30000, 0, t), RL_UNDER_LIMIT, 0, t + 10 * 3000);
	t += 3000;
	EXPECT(LB(lim, "l", 0, 1, 10, 30000, 0, t), RL_UNDER_LIMIT, 0, t + 10 * 3000);
	rl_limiter_free(lim);
}

/* Gubernator TestLeakyBucketWithBurst: limit 10 per 30 s, burst 20. reset_time is when the
 * bucket is full again: (burst - remaining) * 3 s (Gubernator uses limit - remaining,
 * which points into the past here). */
static void test_leaky_bucket_burst(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	int64_t t = T0;
	EXPECT(LB(lim, "b", 0, 1, 10, 30000, 20, t), RL_UNDER_LIMIT, 19, t + 3000);
	t += 1000;
	EXPECT(LB(lim, "b", 0, 1, 10, 30000, 20, t), RL_UNDER_LIMIT, 18, t + 6000);
	t += 1000;
	EXPECT(LB(lim, "b", 0, 1, 10, 30000, 20, t), RL_UNDER_LIMIT, 17, t + 9000);
	t += 1500;
	EXPECT(LB(lim, "b", 0, 0, 10, 30000, 20, t), RL_UNDER_LIMIT, 18, t + 6000);
	t += 3000;
	EXPECT(LB(lim, "b", 0, 0, 10, 30000, 20, t), RL_UNDER_LIMIT, 19, t + 3000);
	EXPECT(LB(lim, "b", 0, 19, 10, 30000, 20, t), RL_UNDER_LIMIT, 0, t + 60000);
	EXPECT(LB(lim, "b", 0, 1, 10, 30000, 20, t), RL_OVER_LIMIT, 0, t + 60000);
	t += 3000;
	EXPECT(LB(lim, "b", 0, 0, 10, 30000, 20, t), RL_UNDER_LIMIT, 1, t + 57000);
	t += 60000;
	EXPECT(LB(lim, "b", 0, 0, 10, 30000, 20, t), RL_UNDER_LIMIT, 20, t);
	rl_limiter_free(lim);
}

/* Gubernator TestLeakyBucketNegativeHits: 1, -1, 10, -1 -> 9, 10, 0, 1. */
static void test_leaky_bucket_negative_hits(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(LB(lim, "n", 0, 1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 9, T0 + 3000);
	EXPECT(LB(lim, "n", 0, -1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 10, T0);
	EXPECT(LB(lim, "n", 0, 10, 10, 30000, 0, T0), RL_UNDER_LIMIT, 0, T0 + 30000);
	EXPECT(LB(lim, "n", 0, -1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 1, T0 + 27000);
	rl_limiter_free(lim);
}

/* Gubernator TestDrainOverLimit, leaky bucket; and TestResetRemaining-style refill. */
static void test_leaky_bucket_drain_and_reset(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(LB(lim, "d", RL_DRAIN_OVER_LIMIT, 0, 10, 30000, 0, T0), RL_UNDER_LIMIT, 10, T0);
	EXPECT(LB(lim, "d", RL_DRAIN_OVER_LIMIT, 1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 9, T0 + 3000);
	EXPECT(LB(lim, "d", RL_DRAIN_OVER_LIMIT, 100, 10, 30000, 0, T0), RL_OVER_LIMIT, 0, T0 + 30000);
	EXPECT(LB(lim, "d", RL_DRAIN_OVER_LIMIT, 0, 10, 30000, 0, T0), RL_UNDER_LIMIT, 0, T0 + 30000);
	EXPECT(LB(lim, "d", RL_RESET_REMAINING, 1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 10, T0);
	EXPECT(LB(lim, "d", 0, 1, 10, 30000, 0, T0), RL_UNDER_LIMIT, 9, T0 + 3000);
	rl_limiter_free(lim);
}

/* Gubernator TestChangeLimit (leaky): limit 100 -> 99; lowered to 10 -> capped, 9; 8. */
static void test_leaky_bucket_lower_limit(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(LB(lim, "cl", 0, 1, 100, 9000, 0, T0), RL_UNDER_LIMIT, 99, T0 + 90);
	EXPECT(LB(lim, "cl", 0, 1, 10, 9000, 0, T0), RL_UNDER_LIMIT, 9, T0 + 900);
	EXPECT(LB(lim, "cl", 0, 1, 10, 9000, 0, T0), RL_UNDER_LIMIT, 8, T0 + 1800);
	rl_limiter_free(lim);
}

/* Gubernator TestLeakyBucketDivBug: limit 2000 per 1 s (0.5 ms per token). */
static void test_leaky_bucket_fractional_rate(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(LB(lim, "div", 0, 1, 2000, 1000, 0, T0), RL_UNDER_LIMIT, 1999, T0 + 1);
	EXPECT(LB(lim, "div", 0, 100, 2000, 1000, 0, T0), RL_UNDER_LIMIT, 1899, T0 + 51);
	/* 10 ms later 20 tokens leaked back */
	EXPECT(LB(lim, "div", 0, 0, 2000, 1000, 0, T0 + 10), RL_UNDER_LIMIT, 1919, T0 + 10 + 41);
	rl_limiter_free(lim);
}

/* --- Gregorian ----------------------------------------------------------------------- */

static void test_gregorian_bounds(void **state)
{
	(void)state;
	int64_t s, e;
	/* 2024-02-29T12:34:56.789Z */
	const int64_t now = INT64_C(1709210096789);
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_MINUTES, &s, &e), 0);
	assert_int_equal(s, INT64_C(1709210040000));
	assert_int_equal(e, INT64_C(1709210100000));
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_HOURS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1709208000000));
	assert_int_equal(e, INT64_C(1709211600000));
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_DAYS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1709164800000));
	assert_int_equal(e, INT64_C(1709251200000));
	/* February 2024 is 29 days (leap year) */
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_MONTHS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1706745600000));
	assert_int_equal(e, INT64_C(1709251200000));
	assert_int_equal(e - s, INT64_C(29) * 86400000);
	/* February 2023 is 28 days */
	assert_int_equal(rl_gregorian_bounds(INT64_C(1675209600000) + 5, RL_GREGORIAN_MONTHS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1675209600000));
	assert_int_equal(e, INT64_C(1677628800000));
	assert_int_equal(e - s, INT64_C(28) * 86400000);
	/* December wraps into the next year */
	assert_int_equal(rl_gregorian_bounds(INT64_C(1704067199999), RL_GREGORIAN_MONTHS, &s, &e), 0);
	assert_int_equal(e, INT64_C(1704067200000));
	assert_int_equal(e - s, INT64_C(31) * 86400000);
	/* years: 2024 has 366 days, 2023 has 365 */
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_YEARS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1704067200000));
	assert_int_equal(e, INT64_C(1735689600000));
	assert_int_equal(e - s, INT64_C(366) * 86400000);
	assert_int_equal(rl_gregorian_bounds(INT64_C(1700000000000), RL_GREGORIAN_YEARS, &s, &e), 0);
	assert_int_equal(s, INT64_C(1672531200000));
	assert_int_equal(e - s, INT64_C(365) * 86400000);
	/* 2000 is a leap year, 1900 is not */
	assert_int_equal(rl_gregorian_bounds(INT64_C(949363200000), RL_GREGORIAN_MONTHS, &s, &e), 0);
	assert_int_equal(e, INT64_C(951868800000));
	assert_int_equal(rl_gregorian_bounds(INT64_C(-2206310400000), RL_GREGORIAN_MONTHS, &s, &e), 0);
	assert_int_equal(s, INT64_C(-2206310400000));
	assert_int_equal(e, INT64_C(-2203891200000));
	assert_int_equal(e - s, INT64_C(28) * 86400000);
	/* the request's clock comes from the network: at the ends of int64 the interval
	 * saturates instead of overflowing (found by fuzz_ratelimit_pb) */
	static const int64_t ivs[] = {RL_GREGORIAN_MINUTES, RL_GREGORIAN_HOURS, RL_GREGORIAN_DAYS,
				      RL_GREGORIAN_MONTHS, RL_GREGORIAN_YEARS};
	for (size_t i = 0; i < sizeof(ivs) / sizeof(ivs[0]); i++) {
		assert_int_equal(rl_gregorian_bounds(INT64_MAX, ivs[i], &s, &e), 0);
		assert_true(s <= e && e == INT64_MAX);
		assert_int_equal(rl_gregorian_bounds(INT64_C(9223372036854720000), ivs[i], &s, &e), 0);
		assert_true(s <= INT64_C(9223372036854720000) && e == INT64_MAX);
		assert_int_equal(rl_gregorian_bounds(INT64_MIN, ivs[i], &s, &e), 0);
		assert_true(s == INT64_MIN && e > INT64_MIN);
	}
	/* weeks and unknown values are refused */
	assert_int_equal(rl_gregorian_bounds(now, RL_GREGORIAN_WEEKS, &s, &e), SDB_EINVAL);
	assert_int_equal(rl_gregorian_bounds(now, 6, &s, &e), SDB_EINVAL);
}

static void test_civil_round_trip(void **state)
{
	(void)state;
	int64_t y;
	unsigned m, d;
	int64_t days;
	assert_int_equal(rl_days_from_civil(1970, 1, 1), 0);
	assert_int_equal(rl_days_from_civil(2024, 2, 29), 19782);
	for (days = -800000; days <= 800000; days += 37) {
		rl_civil_from_days(days, &y, &m, &d);
		assert_int_equal(rl_days_from_civil(y, m, d), days);
	}
}

/* Gubernator TestTokenBucketGregorian: limit 60 per minute; reset_time is the minute's
 * last millisecond; at the next minute the bucket is new. */
static void test_gregorian_token_bucket_minute(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	const int64_t t = INT64_C(1709210096789), end = INT64_C(1709210100000);
	const int32_t G = RL_DURATION_IS_GREGORIAN;
	EXPECT(TB(lim, "g", G, 1, 60, RL_GREGORIAN_MINUTES, t), RL_UNDER_LIMIT, 59, end - 1);
	EXPECT(TB(lim, "g", G, 1, 60, RL_GREGORIAN_MINUTES, t + 1), RL_UNDER_LIMIT, 58, end - 1);
	EXPECT(TB(lim, "g", G, 58, 60, RL_GREGORIAN_MINUTES, t + 2), RL_UNDER_LIMIT, 0, end - 1);
	rl_resp r = TB(lim, "g", G, 1, 60, RL_GREGORIAN_MINUTES, end - 1);
	EXPECT(r, RL_OVER_LIMIT, 0, end - 1);
	assert_int_equal(r.retry_after, 1);
	EXPECT(TB(lim, "g", G, 0, 60, RL_GREGORIAN_MINUTES, end), RL_UNDER_LIMIT, 60, end + 59999);
	rl_limiter_free(lim);
}

/* Month windows follow the calendar (UTC): a February 2024 window ends on March 1st. */
static void test_gregorian_token_bucket_month(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	const int32_t G = RL_DURATION_IS_GREGORIAN;
	const int64_t feb15 = INT64_C(1707991200000), mar1 = INT64_C(1709251200000);
	EXPECT(TB(lim, "m", G, 1, 1000, RL_GREGORIAN_MONTHS, feb15), RL_UNDER_LIMIT, 999, mar1 - 1);
	EXPECT(TB(lim, "m", G, 1, 1000, RL_GREGORIAN_MONTHS, mar1 - 1), RL_UNDER_LIMIT, 998, mar1 - 1);
	EXPECT(TB(lim, "m", G, 1, 1000, RL_GREGORIAN_MONTHS, mar1), RL_UNDER_LIMIT, 999,
	       INT64_C(1711929600000) - 1 /* 2024-04-01 */);
	EXPECT(TB(lim, "y", G, 1, 5, RL_GREGORIAN_YEARS, feb15), RL_UNDER_LIMIT, 4,
	       INT64_C(1735689600000) - 1);
	EXPECT(TB(lim, "d", G, 1, 5, RL_GREGORIAN_DAYS, feb15), RL_UNDER_LIMIT, 4,
	       INT64_C(1708041600000) - 1);
	EXPECT(TB(lim, "h", G, 1, 5, RL_GREGORIAN_HOURS, feb15), RL_UNDER_LIMIT, 4,
	       feb15 + 3600000 - 1);
	rl_limiter_free(lim);
}

/* Gubernator TestLeakyBucketGregorian: limit 60 per minute = one token per second. */
static void test_gregorian_leaky_bucket_minute(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	const int32_t G = RL_DURATION_IS_GREGORIAN;
	const int64_t t = INT64_C(1709210040000); /* 12:34:00.000 */
	EXPECT(LB(lim, "lg", G, 1, 60, RL_GREGORIAN_MINUTES, 0, t), RL_UNDER_LIMIT, 59, t + 1000);
	EXPECT(LB(lim, "lg", G, 1, 60, RL_GREGORIAN_MINUTES, 0, t + 500), RL_UNDER_LIMIT, 58, t + 500 + 2000);
	EXPECT(LB(lim, "lg", G, 1, 60, RL_GREGORIAN_MINUTES, 0, t + 1500), RL_UNDER_LIMIT, 58, t + 1500 + 2000);
	rl_limiter_free(lim);
}

static void test_gregorian_invalid(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	rl_req r = {.name = "n", .unique_key = "k", .hits = 1, .limit = 5,
		    .duration = RL_GREGORIAN_WEEKS, .behavior = RL_DURATION_IS_GREGORIAN,
		    .created_at = T0};
	rl_resp out;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error, "`Duration = GregorianWeeks` not yet supported");
	r.duration = 6;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error, "behavior DURATION_IS_GREGORIAN is set; but `Duration` is "
				       "not a valid gregorian interval");
	rl_limiter_free(lim);
}

/* --- GCRA (stripedb extension) ------------------------------------------------------- */

static void test_gcra(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	/* 10 per second: one token per 100 ms, burst 10 */
	EXPECT(ask(lim, "g", RL_GCRA, 0, 10, 10, 1000, 0, T0), RL_UNDER_LIMIT, 0, T0 + 1000);
	rl_resp r = ask(lim, "g", RL_GCRA, 0, 1, 10, 1000, 0, T0);
	EXPECT(r, RL_OVER_LIMIT, 0, T0 + 1000);
	assert_int_equal(r.retry_after, 100);
	EXPECT(ask(lim, "g", RL_GCRA, 0, 1, 10, 1000, 0, T0 + 100), RL_UNDER_LIMIT, 0, T0 + 1100);
	EXPECT(ask(lim, "g", RL_GCRA, 0, 0, 10, 1000, 0, T0 + 350), RL_UNDER_LIMIT, 2, T0 + 1100);
	EXPECT(ask(lim, "g", RL_GCRA, 0, -3, 10, 1000, 0, T0 + 350), RL_UNDER_LIMIT, 5, T0 + 800);
	EXPECT(ask(lim, "g", RL_GCRA, 0, 0, 10, 1000, 0, T0 + 5000), RL_UNDER_LIMIT, 10, T0 + 5000);
	/* burst 2 of a 10/s limit: two at once, then one per 100 ms */
	EXPECT(ask(lim, "b", RL_GCRA, 0, 2, 10, 1000, 2, T0), RL_UNDER_LIMIT, 0, T0 + 200);
	r = ask(lim, "b", RL_GCRA, 0, 3, 10, 1000, 2, T0);
	assert_int_equal(r.status, RL_OVER_LIMIT);
	assert_int_equal(r.retry_after, -1);
	r = ask(lim, "b", RL_GCRA, RL_DRAIN_OVER_LIMIT, 2, 10, 1000, 2, T0 + 100);
	EXPECT(r, RL_OVER_LIMIT, 0, T0 + 300);
	/* drained: 2 hits need 2 tokens back, 200 ms (not the 100 ms before the drain) */
	assert_int_equal(r.retry_after, 200);
	assert_int_equal(ask(lim, "b", RL_GCRA, 0, 2, 10, 1000, 2, T0 + 299).status,
			 RL_OVER_LIMIT);
	EXPECT(ask(lim, "b", RL_GCRA, RL_RESET_REMAINING, 0, 10, 1000, 2, T0 + 100), RL_UNDER_LIMIT, 2, T0 + 100);
	rl_limiter_free(lim);
}

/* --- the five Gubernator defects --------------------------------------------------- */

/* 1. Gubernator keys the cache by name + "_" + unique_key: ("a_b", "c") and ("a", "b_c")
 *    share one bucket there. Here they are independent. */
static void test_defect_key_collision(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	rl_req a = {.name = "a_b", .unique_key = "c", .hits = 1, .limit = 1, .duration = 60000,
		    .created_at = T0};
	rl_req b = {.name = "a", .unique_key = "b_c", .hits = 1, .limit = 1, .duration = 60000,
		    .created_at = T0};
	rl_resp ra, rb;
	assert_int_equal(rl_limiter_decide(lim, &a, 1, &ra, NULL, 0), 0);
	assert_int_equal(rl_limiter_decide(lim, &b, 1, &rb, NULL, 0), 0);
	assert_int_equal(ra.status, RL_UNDER_LIMIT);
	assert_int_equal(ra.remaining, 0);
	assert_int_equal(rb.status, RL_UNDER_LIMIT);
	assert_int_equal(rb.remaining, 0);
	assert_int_equal(rl_limiter_size(lim), 2);
	char k1[64], k2[64];
	size_t l1 = rl_key_make("a_b", "c", k1, sizeof k1), l2 = rl_key_make("a", "b_c", k2, sizeof k2);
	assert_int_equal(l1, 8);
	assert_int_equal(l2, 8);
	assert_true(memcmp(k1, k2, l1) != 0);
	rl_limiter_free(lim);
}

/* 2. Gubernator stores OVER_LIMIT in the token bucket and keeps answering it after tokens
 *    come back (negative hits, a raised limit). Here status is per request. */
static void test_defect_over_limit_not_sticky(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "s", 0, 1, 1, 60000, T0), RL_UNDER_LIMIT, 0, T0 + 60000);
	EXPECT(TB(lim, "s", 0, 1, 1, 60000, T0), RL_OVER_LIMIT, 0, T0 + 60000);
	EXPECT(TB(lim, "s", 0, -1, 1, 60000, T0), RL_UNDER_LIMIT, 1, T0 + 60000);
	EXPECT(TB(lim, "s", 0, 1, 1, 60000, T0), RL_UNDER_LIMIT, 0, T0 + 60000);
	EXPECT(TB(lim, "s", 0, 1, 1, 60000, T0), RL_OVER_LIMIT, 0, T0 + 60000);
	/* raising the limit brings tokens back: the next hit is granted and says so */
	EXPECT(TB(lim, "s", 0, 1, 3, 60000, T0), RL_UNDER_LIMIT, 1, T0 + 60000);
	EXPECT(TB(lim, "s", 0, 0, 3, 60000, T0), RL_UNDER_LIMIT, 1, T0 + 60000);
	rl_limiter_free(lim);
}

/* 3. A changed duration whose window has already passed renews the bucket, and the
 *    request is decided against the renewed bucket (Gubernator answers from the stale
 *    response it built before renewing: OVER_LIMIT with remaining 0). */
static void test_defect_duration_change_renews(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(TB(lim, "dc", 0, 2, 2, 10000, T0), RL_UNDER_LIMIT, 0, T0 + 10000);
	EXPECT(TB(lim, "dc", 0, 1, 2, 10000, T0 + 6000), RL_OVER_LIMIT, 0, T0 + 10000);
	/* duration 5 s: the window [T0, T0+5000) is over at T0+6000 -> a new window */
	EXPECT(TB(lim, "dc", 0, 1, 2, 5000, T0 + 6000), RL_UNDER_LIMIT, 1, T0 + 11000);
	EXPECT(TB(lim, "dc", 0, 1, 2, 5000, T0 + 7000), RL_UNDER_LIMIT, 0, T0 + 11000);
	rl_limiter_free(lim);
}

/* 4. Raising a leaky bucket's limit (burst defaults to limit) must not refill it:
 *    Gubernator sets remaining to the new burst. Here the drained bucket stays drained and
 *    refills at the new rate. */
static void test_defect_leaky_raise_limit_no_refill(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	EXPECT(LB(lim, "rl", 0, 10, 10, 10000, 0, T0), RL_UNDER_LIMIT, 0, T0 + 10000);
	/* limit 20 per 10 s: 500 ms per token, bucket of 20, still empty */
	EXPECT(LB(lim, "rl", 0, 0, 20, 10000, 0, T0), RL_UNDER_LIMIT, 0, T0 + 10000);
	EXPECT(LB(lim, "rl", 0, 1, 20, 10000, 0, T0), RL_OVER_LIMIT, 0, T0 + 10000);
	/* 1 s later: two tokens at the new rate */
	EXPECT(LB(lim, "rl", 0, 0, 20, 10000, 0, T0 + 1000), RL_UNDER_LIMIT, 2, T0 + 1000 + 9000);
	/* an explicit burst raised from 10 to 30 keeps the tokens too */
	EXPECT(LB(lim, "rb", 0, 4, 10, 10000, 10, T0), RL_UNDER_LIMIT, 6, T0 + 4000);
	EXPECT(LB(lim, "rb", 0, 0, 10, 10000, 30, T0), RL_UNDER_LIMIT, 6, T0 + 24000);
	rl_limiter_free(lim);
}

/* 5. Gregorian month and year rates use the real calendar. Gubernator's GregorianDuration
 *    subtracts ms from ns for months and years, so its leak rate is off by ~1e6. Here a
 *    limit of 29 per month leaks one token per day in February 2024 (29 days), and 28 per
 *    month leaks one per day in February 2023. */
static void test_defect_gregorian_month_rate(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter();
	const int32_t G = RL_DURATION_IS_GREGORIAN;
	const int64_t day = 86400000, feb2024 = INT64_C(1706745600000), feb2023 = INT64_C(1675209600000);
	EXPECT(LB(lim, "m24", G, 29, 29, RL_GREGORIAN_MONTHS, 0, feb2024), RL_UNDER_LIMIT, 0, feb2024 + 29 * day);
	EXPECT(LB(lim, "m24", G, 0, 29, RL_GREGORIAN_MONTHS, 0, feb2024 + day), RL_UNDER_LIMIT, 1, feb2024 + 29 * day);
	EXPECT(LB(lim, "m24", G, 0, 29, RL_GREGORIAN_MONTHS, 0, feb2024 + day - 1), RL_UNDER_LIMIT, 1, feb2024 + 29 * day - 1);
	EXPECT(LB(lim, "m23", G, 28, 28, RL_GREGORIAN_MONTHS, 0, feb2023), RL_UNDER_LIMIT, 0, feb2023 + 28 * day);
	EXPECT(LB(lim, "m23", G, 0, 28, RL_GREGORIAN_MONTHS, 0, feb2023 + 2 * day), RL_UNDER_LIMIT, 2, feb2023 + 28 * day);
	/* a year of 366 tokens in 2024: one per day */
	const int64_t y2024 = INT64_C(1704067200000);
	EXPECT(LB(lim, "y24", G, 366, 366, RL_GREGORIAN_YEARS, 0, y2024), RL_UNDER_LIMIT, 0, y2024 + 366 * day);
	EXPECT(LB(lim, "y24", G, 0, 366, RL_GREGORIAN_YEARS, 0, y2024 + 3 * day), RL_UNDER_LIMIT, 3, y2024 + 366 * day);
	rl_limiter_free(lim);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_token_bucket_over_limit),
		cmocka_unit_test(test_token_bucket_query),
		cmocka_unit_test(test_token_bucket_negative_hits),
		cmocka_unit_test(test_token_bucket_refuse_without_consuming),
		cmocka_unit_test(test_token_bucket_drain_over_limit),
		cmocka_unit_test(test_token_bucket_reset_remaining),
		cmocka_unit_test(test_token_bucket_change_limit),
		cmocka_unit_test(test_token_bucket_change_duration),
		cmocka_unit_test(test_token_bucket_switch_to_gregorian),
		cmocka_unit_test(test_leaky_bucket),
		cmocka_unit_test(test_leaky_bucket_burst),
		cmocka_unit_test(test_leaky_bucket_negative_hits),
		cmocka_unit_test(test_leaky_bucket_drain_and_reset),
		cmocka_unit_test(test_leaky_bucket_lower_limit),
		cmocka_unit_test(test_leaky_bucket_fractional_rate),
		cmocka_unit_test(test_gregorian_bounds),
		cmocka_unit_test(test_civil_round_trip),
		cmocka_unit_test(test_gregorian_token_bucket_minute),
		cmocka_unit_test(test_gregorian_token_bucket_month),
		cmocka_unit_test(test_gregorian_leaky_bucket_minute),
		cmocka_unit_test(test_gregorian_invalid),
		cmocka_unit_test(test_gcra),
		cmocka_unit_test(test_defect_key_collision),
		cmocka_unit_test(test_defect_over_limit_not_sticky),
		cmocka_unit_test(test_defect_duration_change_renews),
		cmocka_unit_test(test_defect_leaky_raise_limit_no_refill),
		cmocka_unit_test(test_defect_gregorian_month_rate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
