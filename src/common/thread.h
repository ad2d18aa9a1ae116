/* Threads that log as the thread that started them.
 *
 * A log line names its role and node from the writing thread's context
 * (sdb_log_set_thread, common/log.h), which is per thread: a thread started with plain
 * pthread_create or uv_thread_create has none, so its lines lacked role= and node= (the
 * proxy's request threads wrote "wire: command done" without them). Every thread stripedb
 * starts is started through these, so it begins with its creator's context (a role thread's
 * role and node id); it may then set its own (sdb_log_set_thread, sdb_log_set_thread_role).
 */
#ifndef SDB_COMMON_THREAD_H
#define SDB_COMMON_THREAD_H

#include <pthread.h>
#include <uv.h>

/* pthread_create(t, NULL, fn, arg), fn running with the calling thread's log context.
 * Returns: 0, or pthread_create's error number (no thread started, fn never runs). */
int sdb_thread_create(pthread_t *t, void *(*fn)(void *), void *arg);

/* uv_thread_create(t, fn, arg), fn running with the calling thread's log context.
 * Returns: 0, or uv_thread_create's negative error (no thread started, fn never runs). */
int sdb_uv_thread_create(uv_thread_t *t, void (*fn)(void *), void *arg);

#endif
