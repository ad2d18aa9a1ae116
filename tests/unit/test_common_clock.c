/* Unit tests of src/common/clock.c: the injectable wall clock, and timed condition-variable
 * waits that a jump of the wall clock neither stalls nor hurries (issue #24: shard/pool.c,
 * cdc/publisher.c and coordinator/role.c computed their deadlines from CLOCK_REALTIME, so
 * stepping the clock back an hour made a 500 ms wait last an hour). CLOCK_REALTIME cannot
 * be stepped in CI, so the test steps both the injected wall clock that every protocol-time
 * read goes through (sdb_wall_ms) and, at the OS boundary, CLOCK_REALTIME as this process
 * reads it: this executable defines clock_gettime, which takes precedence over libc's for
 * every call in it (the library code linked in included), and returns the kernel's
 * CLOCK_REALTIME shifted by a skew the test moves. A wait that took its deadline from
 * CLOCK_REALTIME, or waited on a CLOCK_REALTIME condition variable with a monotonic
 * deadline, then stalls or ends early, and the test fails. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/clock.c"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"

static _Atomic int64_t fake_wall;
static _Atomic int64_t realtime_skew_ms; /* added to CLOCK_REALTIME by clock_gettime below */

/* The process's clock_gettime in this test: the kernel's clocks (by system call, not the
 * vDSO), CLOCK_REALTIME shifted by realtime_skew_ms. */
int clock_gettime(clockid_t id, struct timespec *ts)
{
	if (syscall(SYS_clock_gettime, id, ts) != 0)
		return -1;
	if (id == CLOCK_REALTIME) {
		int64_t skew = atomic_load(&realtime_skew_ms); /* whole seconds, then the rest */
		long nsec = ts->tv_nsec + (long)(skew % 1000) * 1000000L;

		ts->tv_sec += (time_t)(skew / 1000);
		if (nsec < 0) {
			nsec += 1000000000L;
			ts->tv_sec--;
		} else if (nsec >= 1000000000L) {
			nsec -= 1000000000L;
			ts->tv_sec++;
		}
		ts->tv_nsec = nsec;
	}
	return 0;
}

static int64_t fake_clock(void)
{
	return atomic_load(&fake_wall);
}

static void test_wall_clock_injectable(void **state)
{
	int64_t real;

	(void)state;
	atomic_store(&fake_wall, 42);
	sdb_clock_set_wall(fake_clock);
	assert_int_equal(sdb_wall_ms(), 42);
	atomic_store(&fake_wall, -3600000);
	assert_int_equal(sdb_wall_ms(), -3600000);
	sdb_clock_set_wall(NULL);
	real = sdb_wall_ms();
	assert_true(real > 1577836800000LL); /* after 2020-01-01: the real clock again */
}

typedef struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int64_t wait_ms;
	bool in_us; /* wait with sdb_cond_wait_until_us instead of sdb_cond_wait_ms */
	uint64_t started, ended; /* sdb_mono_ms */
	int rc;
	bool signalled;
	bool waiting; /* set under mu just before the first wait: a thread that then holds mu
		       * knows the waiter is inside the condition variable wait */
	atomic_bool done;
} waiter;

/* Wait on w->cv for w->wait_ms (until signalled, ignoring spurious wake-ups). */
static void *wait_main(void *arg)
{
	waiter *w = arg;
	uint64_t deadline;

	pthread_mutex_lock(&w->mu);
	w->started = sdb_mono_ms();
	deadline = w->started + (uint64_t)w->wait_ms;
	w->rc = 0;
	w->waiting = true; /* mu stays held until the wait below releases it */
	if (w->in_us) {
		/* sdb_cond_wait_until_us on one deadline, as the rate-limit flusher calls it */
		uint64_t deadline_us = sdb_mono_us() + (uint64_t)w->wait_ms * 1000u;

		while (!w->signalled && w->rc != ETIMEDOUT)
			w->rc = sdb_cond_wait_until_us(&w->cv, &w->mu, deadline_us);
	}
	while (!w->signalled && w->rc != ETIMEDOUT) {
		uint64_t now = sdb_mono_ms();

		/* sdb_cond_wait_ms as the roles call it, re-armed for what is left after a
		 * spurious wake-up */
		w->rc = now >= deadline ? ETIMEDOUT
					: sdb_cond_wait_ms(&w->cv, &w->mu, (int64_t)(deadline - now));
	}
	w->ended = sdb_mono_ms();
	pthread_mutex_unlock(&w->mu);
	atomic_store(&w->done, true);
	return NULL;
}

/* Run one wait of wait_ms while the injected wall clock jumps by jump_ms every poll;
 * the waiter must end (a stalled one fails the poll deadline of 60 s) by its timeout,
 * and not before it: the jumps neither stall nor hurry it. */
static void wait_across_jumps(int64_t jump_ms, bool in_us)
{
	waiter w = {.wait_ms = 200, .in_us = in_us};
	pthread_t t;
	uint64_t give_up;

	pthread_mutex_init(&w.mu, NULL);
	sdb_cond_init_mono(&w.cv);
	atomic_store(&fake_wall, 1700000000000LL);
	sdb_clock_set_wall(fake_clock);
	assert_int_equal(pthread_create(&t, NULL, wait_main, &w), 0);
	give_up = sdb_mono_ms() + 60000;
	while (!atomic_load(&w.done) && sdb_mono_ms() < give_up) {
		atomic_fetch_add(&fake_wall, jump_ms);
		atomic_fetch_add(&realtime_skew_ms, jump_ms);
		sdb_sleep_ms(5);
	}
	atomic_store(&realtime_skew_ms, 0);
	assert_true(atomic_load(&w.done)); /* not stalled */
	pthread_join(t, NULL);
	sdb_clock_set_wall(NULL);
	assert_int_equal(w.rc, ETIMEDOUT);
	assert_true(w.ended - w.started >= (uint64_t)w.wait_ms); /* not hurried */
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
}

static void test_wait_survives_backward_jumps(void **state)
{
	(void)state;
	wait_across_jumps(-3600000, false); /* the wall clock steps back an hour per poll */
}

static void test_wait_us_survives_backward_jumps(void **state)
{
	(void)state;
	wait_across_jumps(-3600000, true); /* the same for a microsecond deadline */
}

static void test_wait_survives_forward_jumps(void **state)
{
	(void)state;
	wait_across_jumps(86400000LL * 365, false); /* and forward a year per poll */
}

static void test_signal_wakes_monotonic_wait(void **state)
{
	waiter w = {.wait_ms = 3600000}; /* an hour: only the signal can end it */
	pthread_t t;
	uint64_t give_up;

	(void)state;
	pthread_mutex_init(&w.mu, NULL);
	sdb_cond_init_mono(&w.cv);
	assert_int_equal(pthread_create(&t, NULL, wait_main, &w), 0);
	/* signal only once the waiter is inside the wait (it holds mu from setting waiting
	 * until the wait releases it), so the wake-up path is what ends it */
	for (;;) {
		pthread_mutex_lock(&w.mu);
		if (w.waiting)
			break;
		pthread_mutex_unlock(&w.mu);
		sdb_sleep_ms(1);
	}
	w.signalled = true;
	pthread_cond_signal(&w.cv);
	pthread_mutex_unlock(&w.mu);
	give_up = sdb_mono_ms() + 60000;
	while (!atomic_load(&w.done) && sdb_mono_ms() < give_up)
		sdb_sleep_ms(5);
	assert_true(atomic_load(&w.done));
	pthread_join(t, NULL);
	assert_int_equal(w.rc, 0);
	assert_int_equal(sdb_cond_wait_ms(&w.cv, &w.mu, 0), ETIMEDOUT); /* no wait at all */
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wall_clock_injectable),
		cmocka_unit_test(test_wait_survives_backward_jumps),
		cmocka_unit_test(test_wait_survives_forward_jumps),
		cmocka_unit_test(test_wait_us_survives_backward_jumps),
		cmocka_unit_test(test_signal_wakes_monotonic_wait),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
