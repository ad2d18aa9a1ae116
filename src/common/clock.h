/* Time, decided once (CONVENTIONS.md: monotonic time for timeouts, deadlines and
 * durations; the wall clock only where a protocol demands epoch ms, and then from one
 * injectable clock so that tests can drive it).
 *
 * sdb_mono_ms/us/ns: CLOCK_MONOTONIC (an arbitrary origin; compare and subtract only).
 * sdb_sleep_ms: sleep ms milliseconds, or less when a signal arrives (a wait between polls
 * of a condition with a deadline, never a synchronisation).
 * sdb_wall_ms: epoch ms (oplog ts, rate-limit reset_time, leases, $currentDate, ids),
 * CLOCK_REALTIME unless a test installed a clock with sdb_clock_set_wall.
 * sdb_cond_*: timed condition-variable waits on CLOCK_MONOTONIC, so a jump of the wall
 * clock neither stalls nor hurries them (a deadline computed from CLOCK_REALTIME waits an
 * hour when the clock steps back an hour).
 * Log lines and the process start time metric read the real wall clock on purpose: they
 * are for humans and Prometheus, and must not follow a test's injected clock.
 * All thread-safe. */
#ifndef SDB_COMMON_CLOCK_H
#define SDB_COMMON_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t sdb_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t sdb_mono_us(void)
{
	return sdb_mono_ns() / 1000u;
}

static inline uint64_t sdb_mono_ms(void)
{
	return sdb_mono_ns() / 1000000u;
}

static inline void sdb_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL); /* a signal ends it early: callers re-check their condition */
}

/* Epoch milliseconds from the process's wall clock: CLOCK_REALTIME, or the function a
 * test installed. Never use it for a duration or a deadline.
 * Test hook (issue #20): the environment variable STRIPEDB_TEST_CLOCK_OFFSET_MS (an
 * integer of ms, within +-366 days; read once, announced on stderr) is added to
 * CLOCK_REALTIME, so integration tests can run shards whose clocks disagree (oplog ts,
 * leases, everything that reads this clock). Never set it in production. */
int64_t sdb_wall_ms(void);

/* Test hook: every later sdb_wall_ms() returns fn() (NULL restores CLOCK_REALTIME).
 * Not for production code; safe to call while other threads read the clock. */
void sdb_clock_set_wall(int64_t (*fn)(void));

/* pthread_cond_init with CLOCK_MONOTONIC (pthread_condattr_setclock), the clock every
 * sdb_cond_wait_* below waits against. Aborts with a message if the platform refuses
 * (POSIX requires CLOCK_MONOTONIC support for condition variables where it exists). */
void sdb_cond_init_mono(pthread_cond_t *cv);

/* Wait on cv (initialised by sdb_cond_init_mono; mu held) until signalled or until the
 * monotonic time reaches deadline_ms (an sdb_mono_ms() value). Returns: 0 when woken
 * (possibly spuriously: callers re-check their predicate) or ETIMEDOUT (the positive
 * errno value, not an SDB_E* code); mu is held again either way. */
int sdb_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ms);

/* sdb_cond_wait_until with a deadline in microseconds (an sdb_mono_us() value), for waits
 * shorter than a millisecond (the rate-limit cluster's 500 us batch wait).
 * Returns: as sdb_cond_wait_until (0 or ETIMEDOUT). */
int sdb_cond_wait_until_us(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_us);

/* sdb_cond_wait_until(cv, mu, sdb_mono_ms() + ms); ms <= 0 returns ETIMEDOUT at once.
 * Returns: as sdb_cond_wait_until (0 or ETIMEDOUT). */
int sdb_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms);

#endif
