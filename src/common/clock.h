/* Monotonic time for timeouts, deadlines and durations (CONVENTIONS.md: never the wall
 * clock except where a protocol demands epoch ms).
 *
 * sdb_mono_ms: CLOCK_MONOTONIC in milliseconds (an arbitrary origin; compare and subtract
 * only). sdb_sleep_ms: sleep ms milliseconds, or less when a signal arrives (a wait
 * between polls of a condition with a deadline, never a synchronisation). Both thread-safe. */
#ifndef SDB_COMMON_CLOCK_H
#define SDB_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t sdb_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void sdb_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL); /* a signal ends it early: callers re-check their condition */
}

#endif
