/* Unit tests of src/ratelimit/ring.c: consistent hashing with virtual nodes. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/ratelimit/ring.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "ratelimit/limiter.h"
#include "ratelimit/ring.h"

#define NKEYS 30000

static uint64_t key_hash(int i)
{
	char uk[32];

	snprintf(uk, sizeof(uk), "account:%d", i);
	return rl_key_hash("requests_per_second", uk);
}

static rl_ring *mk(const char *const *peers, size_t n)
{
	rl_ring *r = NULL;
	char err[128];

	assert_int_equal(rl_ring_new(peers, n, 0, &r, err, sizeof(err)), 0);
	return r;
}

static void test_errors(void **state)
{
	const char *empty[] = {"a:1", ""};
	rl_ring *r = NULL;
	char err[128];

	(void)state;
	assert_int_equal(rl_ring_new(NULL, 0, 0, &r, err, sizeof(err)), SDB_EINVAL);
	assert_null(r);
	assert_int_equal(rl_ring_new(empty, 2, 0, &r, err, sizeof(err)), SDB_EINVAL);
	assert_string_equal(err, "ring: empty peer address");
	assert_int_equal(rl_ring_new(empty, 1, 5000, &r, err, sizeof(err)), SDB_EINVAL);
}

static void test_order_and_duplicates(void **state)
{
	const char *a[] = {"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"};
	const char *b[] = {"127.0.0.1:9003", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9001"};
	rl_ring *ra = mk(a, 3), *rb = mk(b, 4);
	int i;

	(void)state;
	assert_int_equal(rl_ring_size(rb), 3);
	assert_string_equal(rl_ring_peer(rb, 0), "127.0.0.1:9001");
	assert_string_equal(rl_ring_peer(rb, 2), "127.0.0.1:9003");
	assert_int_equal(rl_ring_find(rb, "127.0.0.1:9002"), 1);
	assert_int_equal(rl_ring_find(rb, "127.0.0.1:9004"), -1);
	for (i = 0; i < NKEYS; i++)
		assert_int_equal(rl_ring_owner(ra, key_hash(i), NULL, NULL),
				 rl_ring_owner(rb, key_hash(i), NULL, NULL));
	rl_ring_free(ra);
	rl_ring_free(rb);
}

static void test_balance(void **state)
{
	const char *a[] = {"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"};
	rl_ring *r = mk(a, 3);
	int count[3] = {0, 0, 0}, i;

	(void)state;
	for (i = 0; i < NKEYS; i++)
		count[rl_ring_owner(r, key_hash(i), NULL, NULL)]++;
	/* 512 virtual nodes each: every peer within 20% of a third */
	for (i = 0; i < 3; i++) {
		assert_in_range(count[i], 8000, 12000);
	}
	rl_ring_free(r);
}

/* A joining peer takes keys only for itself: every key that moves, moves to it. */
static void test_join_moves_only_its_keys(void **state)
{
	const char *three[] = {"10.0.0.1:81", "10.0.0.2:81", "10.0.0.3:81"};
	const char *four[] = {"10.0.0.1:81", "10.0.0.2:81", "10.0.0.3:81", "10.0.0.4:81"};
	rl_ring *r3 = mk(three, 3), *r4 = mk(four, 4);
	int i, moved = 0;

	(void)state;
	for (i = 0; i < NKEYS; i++) {
		const char *before = rl_ring_peer(r3, (size_t)rl_ring_owner(r3, key_hash(i), NULL, NULL));
		const char *after = rl_ring_peer(r4, (size_t)rl_ring_owner(r4, key_hash(i), NULL, NULL));
		if (strcmp(before, after) != 0) {
			assert_string_equal(after, "10.0.0.4:81");
			moved++;
		}
	}
	/* about a quarter of the keys move to the new peer */
	assert_in_range(moved, NKEYS / 4 - NKEYS / 16, NKEYS / 4 + NKEYS / 16);
	rl_ring_free(r3);
	rl_ring_free(r4);
}

static bool not_two(size_t idx, void *arg)
{
	(void)arg;
	return idx != 1; /* "10.0.0.2:81" is dead */
}

static bool none(size_t idx, void *arg)
{
	(void)idx;
	(void)arg;
	return false;
}

/* A dead peer's keys go to the next peer clockwise, which is exactly the owner in the
 * ring without it; the other keys stay where they are. */
static void test_dead_peer_next_owner(void **state)
{
	const char *three[] = {"10.0.0.1:81", "10.0.0.2:81", "10.0.0.3:81"};
	const char *two[] = {"10.0.0.1:81", "10.0.0.3:81"};
	rl_ring *r3 = mk(three, 3), *r2 = mk(two, 2);
	int i;

	(void)state;
	for (i = 0; i < NKEYS; i++) {
		int live = rl_ring_owner(r3, key_hash(i), not_two, NULL);
		int all = rl_ring_owner(r3, key_hash(i), NULL, NULL);
		const char *want = rl_ring_peer(r2, (size_t)rl_ring_owner(r2, key_hash(i), NULL, NULL));
		assert_string_equal(rl_ring_peer(r3, (size_t)live), want);
		if (all != 1)
			assert_int_equal(live, all);
	}
	assert_int_equal(rl_ring_owner(r3, key_hash(1), none, NULL), -1);
	rl_ring_free(r3);
	rl_ring_free(r2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_order_and_duplicates),
		cmocka_unit_test(test_balance),
		cmocka_unit_test(test_join_moves_only_its_keys),
		cmocka_unit_test(test_dead_peer_next_owner),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
