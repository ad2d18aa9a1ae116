/* An elastic thread pool (the proxy's request, fan-out and deadline-call threads,
 * shardconn.c). min threads always run; when a job is queued and no thread is idle, one
 * more starts, up to max; a thread above min that has been idle for 30 s exits. A request
 * that waits long on one shard (a primary cut off the network, where packets vanish and
 * nothing answers until the socket timeout) so holds one thread, and the requests behind
 * it still get threads and reach the new primary (issue #15). Jobs run in no particular
 * order beyond "queued ones before exit". Thread-safe. */
#ifndef SDB_PROXY_TPOOL_H
#define SDB_PROXY_TPOOL_H

#include <semaphore.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "common/metrics.h"

typedef struct job {
	void (*fn)(void *arg);
	void *arg;
	struct job *next;
} job;

typedef struct tpool tpool;

/* One thread of a pool. An idle thread waits on its own semaphore and is handed its next
 * job directly (tpool_push): the hand-off is one futex wake and one wait. With a
 * condition variable and the pool's mutex (before), glibc re-takes the mutex after the
 * wait as contended, so the thread's unlock was a third futex call per request (issue
 * #19: proxy syscalls per point read). */
typedef struct tworker {
	tpool *p;
	sem_t sem;    /* posted when the thread is handed a job, or told to stop */
	job *job;     /* the job handed over (set under p->mu before the post), or NULL */
	struct tworker *next; /* p->idle */
} tworker;

struct tpool {
	uv_mutex_t mu;
	uv_cond_t gone;  /* a thread exited (tpool_destroy waits for n == 0) */
	job *head, *tail; /* jobs no idle thread was there for */
	tworker *idle;    /* idle threads, the most recently idle first (its cache is warm) */
	bool stop;
	size_t n, min, max;
	sdb_gauge *g_threads; /* may be NULL */
};

/* Start min threads (aborts when one cannot be created: at start-up only); up to max
 * later. g (may be NULL) follows the number of threads. p is the caller's (embedded). */
void tpool_init(tpool *p, size_t min, size_t max, sdb_gauge *g);
/* Run fn(arg) on a thread of p: an idle one at once (handed over directly), else a new
 * one when fewer than max run, else the next that becomes idle. Never fails (allocation
 * aborts). */
void tpool_push(tpool *p, void (*fn)(void *), void *arg);
/* Stop: the jobs already queued run first, then every thread exits; returns when all
 * have. No tpool_push may come after. */
void tpool_destroy(tpool *p);

#endif
