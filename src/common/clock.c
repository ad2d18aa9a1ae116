/* The injectable wall clock and monotonic condition-variable waits (see clock.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"

static _Atomic(int64_t (*)(void)) wall_hook;
static pthread_once_t offset_once = PTHREAD_ONCE_INIT;
static int64_t offset_ms;

/* STRIPEDB_TEST_CLOCK_OFFSET_MS (clock.h), read once */
static void offset_init(void)
{
	const char *v = getenv("STRIPEDB_TEST_CLOCK_OFFSET_MS");
	char *end;
	long long n;

	if (v == NULL || *v == '\0')
		return;
	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || *end != '\0' || n < -86400000LL * 366 || n > 86400000LL * 366) {
		fprintf(stderr, "stripedb: ignoring STRIPEDB_TEST_CLOCK_OFFSET_MS=%s (an integer "
				"of ms within a year is expected)\n",
			v);
		return;
	}
	offset_ms = n;
	if (n != 0)
		fprintf(stderr, "stripedb: TEST HOOK: wall clock offset by %lld ms "
			"(STRIPEDB_TEST_CLOCK_OFFSET_MS)\n",
		n);
}

int64_t sdb_wall_ms(void)
{
	int64_t (*fn)(void) = atomic_load(&wall_hook);
	struct timespec ts;

	if (fn != NULL)
		return fn();
	pthread_once(&offset_once, offset_init);
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + offset_ms;
}

void sdb_clock_set_wall(int64_t (*fn)(void))
{
	atomic_store(&wall_hook, fn);
}

void sdb_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t ca;

	if (pthread_condattr_init(&ca) != 0 ||
	    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(cv, &ca) != 0) {
		fprintf(stderr, "stripedb: cannot create a CLOCK_MONOTONIC condition variable\n");
		abort();
	}
	pthread_condattr_destroy(&ca);
}

int sdb_cond_wait_until_us(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_us)
{
	struct timespec ts = {.tv_sec = (time_t)(deadline_us / 1000000u),
			      .tv_nsec = (long)(deadline_us % 1000000u) * 1000L};
	int rc = pthread_cond_timedwait(cv, mu, &ts);

	return rc == ETIMEDOUT ? ETIMEDOUT : 0;
}

int sdb_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ms)
{
	return sdb_cond_wait_until_us(cv, mu, deadline_ms * 1000u);
}

int sdb_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
	if (ms <= 0)
		return ETIMEDOUT;
	return sdb_cond_wait_until(cv, mu, sdb_mono_ms() + (uint64_t)ms);
}
