/* Unit tests of the limiter API (ratelimit/limiter.c) and its cache (ratelimit/cache.c):
 * validation, batches, the injectable clock, LRU bounds, the cluster hooks (decide as
 * owner, GLOBAL state set/get) and concurrent callers. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/ratelimit/limiter.c"
#include "../../src/ratelimit/cache.c"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/metrics.h"
#include "ratelimit/cache.h"
#include "ratelimit/limiter.h"

#define T0 INT64_C(1700000000000)

static int64_t fake_now = T0;

static int64_t fake_clock(void *d)
{
	(void)d;
	return fake_now;
}

static rl_limiter *new_limiter(size_t size, size_t shards)
{
	rl_limiter_opts o = {.cache_size = size, .cache_shards = shards, .clock = fake_clock};
	return rl_limiter_new(&o);
}

static rl_req base_req(const char *key)
{
	rl_req r = {.name = "n", .unique_key = key, .hits = 1, .limit = 10, .duration = 1000,
		    .created_at = T0};
	return r;
}

static void expect_error(rl_req r, const char *msg)
{
	rl_limiter *lim = new_limiter(10, 1);
	rl_resp out;
	char err[128];
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error, msg);
	assert_int_equal(out.remaining, 0);
	assert_int_equal(out.reset_time, 0);
	assert_int_equal(rl_req_validate(&r, err, sizeof err), SDB_EINVAL);
	assert_string_equal(err, msg);
	assert_int_equal(rl_limiter_size(lim), 0);
	rl_limiter_free(lim);
}

static void test_validation(void **state)
{
	(void)state;
	rl_req r = base_req("k");
	char err[128];
	assert_int_equal(rl_req_validate(&r, err, sizeof err), 0);

	r = base_req("k");
	r.name = "";
	expect_error(r, "field 'namespace' cannot be empty");
	r = base_req("k");
	r.name = NULL;
	expect_error(r, "field 'namespace' cannot be empty");
	r = base_req("");
	expect_error(r, "field 'unique_key' cannot be empty");
	r = base_req("k");
	r.algorithm = 3;
	expect_error(r, "invalid rate limit algorithm '3'; want TOKEN_BUCKET (0), LEAKY_BUCKET (1) or GCRA (2)");
	r.algorithm = -1;
	expect_error(r, "invalid rate limit algorithm '-1'; want TOKEN_BUCKET (0), LEAKY_BUCKET (1) or GCRA (2)");
	r = base_req("k");
	r.limit = -1;
	expect_error(r, "field 'limit' cannot be negative");
	r = base_req("k");
	r.burst = -5;
	expect_error(r, "field 'burst' cannot be negative");
	r = base_req("k");
	r.duration = -1;
	expect_error(r, "field 'duration' cannot be negative");
	r = base_req("k");
	r.duration = 0;
	expect_error(r, "field 'duration' must be greater than 0 (ms) unless DURATION_IS_GREGORIAN is set");
	r = base_req("k");
	r.behavior = 64;
	expect_error(r, "invalid behavior '64'; known bits are 1, 2, 4, 8, 16 and 32");
	r.behavior = -1;
	expect_error(r, "invalid behavior '-1'; known bits are 1, 2, 4, 8, 16 and 32");
	r = base_req("k");
	r.created_at = -1;
	expect_error(r, "field 'created_at' cannot be negative");
	/* zero duration is fine with DURATION_IS_GREGORIAN (it means minutes) */
	r = base_req("k");
	r.duration = 0;
	r.behavior = RL_DURATION_IS_GREGORIAN | RL_GLOBAL | RL_NO_BATCHING | RL_MULTI_REGION;
	assert_int_equal(rl_req_validate(&r, err, sizeof err), 0);
}

static void test_batch(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 4);
	rl_req reqs[3] = {base_req("a"), base_req(""), base_req("b")};
	rl_resp out[3];
	reqs[2].hits = 4;
	assert_int_equal(rl_limiter_decide(lim, reqs, 3, out, NULL, 0), 0);
	assert_int_equal(out[0].remaining, 9);
	assert_string_equal(out[0].error, "");
	assert_string_equal(out[1].error, "field 'unique_key' cannot be empty");
	assert_int_equal(out[2].remaining, 6);
	assert_int_equal(out[2].limit, 10);
	assert_int_equal(out[2].reset_time, T0 + 1000);

	/* an empty batch is fine */
	assert_int_equal(rl_limiter_decide(lim, reqs, 0, out, NULL, 0), 0);

	/* more than 1000 requests is a call error and decides nothing */
	static rl_req many[RL_MAX_BATCH + 1];
	static rl_resp many_out[RL_MAX_BATCH + 1];
	for (size_t i = 0; i <= RL_MAX_BATCH; i++)
		many[i] = base_req("a");
	char err[128] = "";
	assert_int_equal(rl_limiter_decide(lim, many, RL_MAX_BATCH + 1, many_out, err, sizeof err),
			 SDB_EINVAL);
	assert_string_equal(err, "Requests.RateLimits list too large; max size is '1000'");
	/* exactly 1000 is allowed: key "a" had 9 left, so 9 granted and 991 refused */
	assert_int_equal(rl_limiter_decide(lim, many, RL_MAX_BATCH, many_out, err, sizeof err), 0);
	assert_int_equal(many_out[8].status, RL_UNDER_LIMIT);
	assert_int_equal(many_out[8].remaining, 0);
	assert_int_equal(many_out[9].status, RL_OVER_LIMIT);
	assert_int_equal(many_out[999].status, RL_OVER_LIMIT);
	rl_limiter_free(lim);
}

/* Without created_at the limiter's clock is the request's clock. */
static void test_injected_clock(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 4);
	rl_req r = base_req("c");
	rl_resp out;
	r.created_at = 0;
	fake_now = T0 + 500;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(out.reset_time, T0 + 1500);
	assert_int_equal(out.remaining, 9);
	fake_now = T0 + 1500;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(out.reset_time, T0 + 2500);
	assert_int_equal(out.remaining, 9);
	fake_now = T0;
	/* the default clock is the real one: a plausible epoch ms (after 2020-01-01) */
	assert_true(rl_clock_realtime_ms(NULL) > INT64_C(1577836800000));
	rl_limiter_free(lim);
}

/* The cache holds at most its capacity; the least recently used key goes first. */
static void test_lru_bound(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(4, 1);
	rl_req r = base_req("x");
	rl_resp out;
	char key[16];
	for (int i = 0; i < 4; i++) {
		snprintf(key, sizeof key, "k%d", i);
		r.unique_key = key;
		assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	}
	assert_int_equal(rl_limiter_size(lim), 4);
	/* touch k0 so that k1 is the least recently used */
	r.unique_key = "k0";
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(out.remaining, 8);
	r.unique_key = "k4";
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(rl_limiter_size(lim), 4);
	rl_state st;
	assert_int_equal(rl_limiter_get_state(lim, "n", "k1", &st), SDB_ENOTFOUND);
	assert_int_equal(rl_limiter_get_state(lim, "n", "k0", &st), 0);
	assert_int_equal(st.remaining, 8);
	assert_int_equal(rl_limiter_get_state(lim, "n", "k2", &st), 0);
	rl_limiter_free(lim);
}

/* Many shards, capacity split exactly: never more keys than the capacity. */
static void test_cache_capacity_sharded(void **state)
{
	(void)state;
	rl_cache *c = rl_cache_new(1000, 64);
	char key[32];
	for (int i = 0; i < 20000; i++) {
		int n = snprintf(key, sizeof key, "key-%d", i);
		uint64_t h = (uint64_t)i * UINT64_C(0x9E3779B97F4A7C15);
		rl_cache_shard *s = rl_cache_lock(c, h);
		if (rl_cache_find(s, h, key, (size_t)n) == NULL)
			rl_cache_insert(s, h, key, (size_t)n, T0)->expire_at = T0 + 1000;
		rl_cache_unlock(s);
		assert_true(rl_cache_size(c) <= 1000);
	}
	assert_int_equal(rl_cache_capacity(c), 1000);
	assert_int_equal(rl_cache_size(c), 1000);
	assert_int_equal(rl_cache_evictions(c) + rl_cache_size(c), 20000);
	/* remove */
	rl_cache_shard *s = rl_cache_lock(c, 19999 * UINT64_C(0x9E3779B97F4A7C15));
	int n = snprintf(key, sizeof key, "key-%d", 19999);
	assert_int_equal(rl_cache_remove(s, 19999 * UINT64_C(0x9E3779B97F4A7C15), key, (size_t)n), 1);
	assert_int_equal(rl_cache_remove(s, 19999 * UINT64_C(0x9E3779B97F4A7C15), key, (size_t)n), 0);
	rl_cache_unlock(s);
	rl_cache_free(c);
	/* a tiny cache with many requested shards still works */
	c = rl_cache_new(3, 64);
	assert_int_equal(rl_cache_capacity(c), 3);
	rl_cache_free(c);

	/* the capacity is global: 1000 distinct keys fit in a cache of 1000 over 64 shards,
	 * however unevenly they hash (here: all into one shard, whose table grows) */
	c = rl_cache_new(1000, 64);
	for (int i = 0; i < 1000; i++) {
		n = snprintf(key, sizeof key, "key-%d", i);
		uint64_t h = (uint64_t)i; /* high bits 0: every key in shard 0 */
		s = rl_cache_lock(c, h);
		rl_cache_insert(s, h, key, (size_t)n, T0)->expire_at = T0 + 1000;
		rl_cache_unlock(s);
	}
	assert_int_equal(rl_cache_size(c), 1000);
	assert_int_equal(rl_cache_evictions(c), 0);
	for (int i = 0; i < 1000; i++) {
		n = snprintf(key, sizeof key, "key-%d", i);
		s = rl_cache_lock(c, (uint64_t)i);
		assert_non_null(rl_cache_find(s, (uint64_t)i, key, (size_t)n));
		rl_cache_unlock(s);
	}
	/* one more key into another (empty) shard evicts from shard 0 */
	s = rl_cache_lock(c, UINT64_C(1) << 40);
	rl_cache_insert(s, UINT64_C(1) << 40, "other", 5, T0);
	rl_cache_unlock(s);
	assert_int_equal(rl_cache_size(c), 1000);
	assert_int_equal(rl_cache_evictions(c), 1);
	s = rl_cache_lock(c, 0);
	assert_null(rl_cache_find(s, 0, "key-0", 5)); /* the least recently used went */
	rl_cache_unlock(s);
	rl_cache_free(c);
}

/* An expired key's state is not reported, and it is the preferred eviction victim. */
static void test_expiry(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 1);
	rl_req r = base_req("e");
	rl_resp out;
	rl_state st;
	r.created_at = 0;
	fake_now = T0;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(rl_limiter_get_state(lim, "n", "e", &st), 0);
	assert_int_equal(st.expire_at, T0 + 1000);
	fake_now = T0 + 1000;
	assert_int_equal(rl_limiter_get_state(lim, "n", "e", &st), SDB_ENOTFOUND);
	fake_now = T0;
	rl_limiter_free(lim);
}

/* Cluster hooks: the owner's state, installed on another node, answers the same there. */
static void test_owner_and_global_state(void **state)
{
	(void)state;
	rl_limiter *owner = new_limiter(100, 4), *peer = new_limiter(100, 4);
	rl_req r = base_req("g");
	rl_resp out;
	rl_state st, st2;
	r.limit = 5;
	r.hits = 2;
	r.behavior = RL_GLOBAL;
	assert_int_equal(rl_limiter_decide_owner(owner, &r, &out, &st), 0);
	assert_int_equal(out.remaining, 3);
	assert_int_equal(st.algorithm, RL_TOKEN_BUCKET);
	assert_int_equal(st.remaining, 3);
	assert_int_equal(st.limit, 5);
	assert_int_equal(st.expire_at, T0 + 1000);
	assert_int_equal(st.status, RL_UNDER_LIMIT);

	assert_int_equal(rl_limiter_get_state(peer, "n", "g", &st2), SDB_ENOTFOUND);
	assert_int_equal(rl_limiter_set_state(peer, "n", "g", &st), 0);
	assert_int_equal(rl_limiter_get_state(peer, "n", "g", &st2), 0);
	assert_int_equal(st2.remaining, 3);
	/* a hit on the peer decides from the installed state */
	r.hits = 1;
	assert_int_equal(rl_limiter_decide(peer, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(out.remaining, 2);
	assert_int_equal(out.reset_time, T0 + 1000);

	/* rendering a state as a query's answer */
	rl_state_to_resp(&st, T0 + 10, &out);
	assert_int_equal(out.status, RL_UNDER_LIMIT);
	assert_int_equal(out.remaining, 3);
	assert_int_equal(out.limit, 5);
	assert_int_equal(out.reset_time, T0 + 1000);
	/* the owner's OVER_LIMIT verdict is carried until the window ends */
	r.hits = 4;
	assert_int_equal(rl_limiter_decide_owner(owner, &r, &out, &st), 0);
	assert_int_equal(out.status, RL_OVER_LIMIT);
	rl_state_to_resp(&st, T0 + 10, &out);
	assert_int_equal(out.status, RL_OVER_LIMIT);
	assert_int_equal(out.remaining, 3);
	rl_state_to_resp(&st, T0 + 1000, &out);
	assert_int_equal(out.status, RL_UNDER_LIMIT);
	assert_int_equal(out.remaining, 5);

	/* invalid input */
	r.unique_key = "";
	assert_int_equal(rl_limiter_decide_owner(owner, &r, &out, &st), SDB_EINVAL);
	assert_string_equal(out.error, "field 'unique_key' cannot be empty");
	assert_int_equal(rl_limiter_set_state(peer, "", "g", &st), SDB_EINVAL);
	st.algorithm = 7;
	assert_int_equal(rl_limiter_set_state(peer, "n", "g", &st), SDB_EINVAL);
	rl_limiter_free(owner);
	rl_limiter_free(peer);
}

static void test_long_keys(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 4);
	static char big[5000];
	memset(big, 'z', sizeof big - 1);
	rl_req r = base_req(big);
	rl_resp out;
	/* name + unique_key beyond RL_MAX_KEY_LEN: a per-item error, nothing cached */
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error,
			    "fields 'name' and 'unique_key' are longer than 4096 bytes together");
	assert_int_equal(rl_limiter_size(lim), 0);
	/* exactly RL_MAX_KEY_LEN together is decided */
	big[RL_MAX_KEY_LEN - strlen(r.name)] = '\0';
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_string_equal(out.error, "");
	assert_int_equal(out.remaining, 8);
	assert_int_equal(rl_key_hash("n", big), rl_key_hash("n", big));
	assert_true(rl_key_hash("a_b", "c") != rl_key_hash("a", "b_c"));
	char small[4];
	assert_int_equal(rl_key_make("ab", "cd", small, sizeof small), 8);
	rl_limiter_free(lim);
}

/* Saturating arithmetic: extreme values never overflow (UBSan would abort). */
static void test_extremes(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 4);
	rl_req r = base_req("x");
	rl_resp out;
	r.limit = INT64_MAX;
	r.duration = INT64_MAX;
	r.hits = INT64_MIN;
	for (int algo = 0; algo <= RL_ALGORITHM_MAX; algo++) {
		r.algorithm = algo;
		r.hits = INT64_MIN;
		assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
		assert_string_equal(out.error, "");
		r.hits = INT64_MIN;
		assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
		r.hits = INT64_MAX;
		r.limit = 1;
		assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
		assert_int_equal(out.status, RL_OVER_LIMIT);
		r.limit = INT64_MAX;
		r.created_at = INT64_MAX;
		assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
		r.created_at = T0;
	}
	r = base_req("y");
	r.burst = INT64_MAX;
	r.algorithm = RL_LEAKY_BUCKET;
	r.limit = 1;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	r.algorithm = RL_GCRA;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	r.limit = 0;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	assert_int_equal(out.status, RL_OVER_LIMIT);
	r.algorithm = RL_LEAKY_BUCKET;
	assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
	rl_limiter_free(lim);
}

/* A state from a peer is not trusted: any field values decide without UB. */
static void test_hostile_state(void **state)
{
	(void)state;
	rl_limiter *lim = new_limiter(100, 4);
	const int64_t vals[] = {INT64_MIN, -1, 0, 1, T0, INT64_MAX};
	const double fvals[] = {-1e300, -1.0, 0.0, 0.5, 1e300};
	rl_resp out;
	for (int algo = 0; algo <= RL_ALGORITHM_MAX; algo++) {
		for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
			for (size_t j = 0; j < sizeof fvals / sizeof fvals[0]; j++) {
				rl_state st = {.algorithm = algo, .behavior = (int32_t)vals[i],
					       .status = (int32_t)vals[i], .limit = vals[i],
					       .duration = vals[(i + 1) % 6], .burst = vals[(i + 2) % 6],
					       .remaining = vals[(i + 3) % 6], .remaining_f = fvals[j],
					       .tat = fvals[(j + 1) % 5], .created_at = vals[(i + 4) % 6],
					       .updated_at = vals[(i + 5) % 6], .expire_at = vals[i]};
				assert_int_equal(rl_limiter_set_state(lim, "n", "h", &st), 0);
				rl_req r = base_req("h");
				r.algorithm = algo;
				r.hits = (int64_t)j - 2;
				assert_int_equal(rl_limiter_decide(lim, &r, 1, &out, NULL, 0), 0);
				assert_string_equal(out.error, "");
				assert_true(out.remaining >= 0);
				rl_state_to_resp(&st, T0, &out);
			}
		}
	}
	rl_state bad = {.algorithm = RL_LEAKY_BUCKET, .remaining_f = NAN};
	assert_int_equal(rl_limiter_set_state(lim, "n", "h", &bad), SDB_EINVAL);
	bad.remaining_f = 0;
	bad.tat = INFINITY;
	assert_int_equal(rl_limiter_set_state(lim, "n", "h", &bad), SDB_EINVAL);
	rl_limiter_free(lim);
}

/* Concurrent callers on one key: exactly `limit` hits are granted. */
#define THREADS 8
#define HITS_PER_THREAD 5000
static rl_limiter *shared;
static int granted[THREADS];

static void *hammer(void *arg)
{
	int id = (int)(intptr_t)arg;
	rl_req r = base_req("hot");
	rl_resp out;
	char key[16];
	r.limit = 20000;
	r.duration = 60000;
	for (int i = 0; i < HITS_PER_THREAD; i++) {
		r.unique_key = "hot";
		rl_limiter_decide(shared, &r, 1, &out, NULL, 0);
		if (out.status == RL_UNDER_LIMIT)
			granted[id]++;
		/* and some private keys to exercise other shards */
		snprintf(key, sizeof key, "t%d-%d", id, i % 50);
		r.unique_key = key;
		rl_limiter_decide(shared, &r, 1, &out, NULL, 0);
	}
	return NULL;
}

static void test_concurrency(void **state)
{
	(void)state;
	pthread_t th[THREADS];
	int total = 0;
	sdb_counter *under = sdb_metrics_counter("stripedb_ratelimit_decisions_total",
						 "Rate-limit decisions by outcome",
						 "status=\"under_limit\"");
	sdb_counter *over = sdb_metrics_counter("stripedb_ratelimit_decisions_total",
						"Rate-limit decisions by outcome",
						"status=\"over_limit\"");
	size_t len;
	uint64_t before;
	shared = new_limiter(10000, 16);
	free(sdb_metrics_render(&len));
	before = sdb_counter_value(under) + sdb_counter_value(over);
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)i);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < THREADS; i++)
		total += granted[i];
	assert_int_equal(total, 20000);
	/* the per-shard tallies are exact once folded (every render folds them) */
	free(sdb_metrics_render(&len));
	assert_int_equal(sdb_counter_value(under) + sdb_counter_value(over) - before,
			 2 * THREADS * HITS_PER_THREAD);
	assert_int_equal(rl_limiter_size(shared), 1 + THREADS * 50);
	rl_state st;
	assert_int_equal(rl_limiter_get_state(shared, "n", "hot", &st), 0);
	assert_int_equal(st.remaining, 0);
	rl_limiter_free(shared);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_validation),
		cmocka_unit_test(test_batch),
		cmocka_unit_test(test_injected_clock),
		cmocka_unit_test(test_lru_bound),
		cmocka_unit_test(test_cache_capacity_sharded),
		cmocka_unit_test(test_expiry),
		cmocka_unit_test(test_owner_and_global_state),
		cmocka_unit_test(test_long_keys),
		cmocka_unit_test(test_extremes),
		cmocka_unit_test(test_hostile_state),
		cmocka_unit_test(test_concurrency),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
