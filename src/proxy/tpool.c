/* The proxy's elastic thread pool. See proxy/tpool.h. */
#include "proxy/tpool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/thread.h"

#define TPOOL_IDLE_NS (30ULL * 1000 * 1000 * 1000) /* an extra thread idle this long exits */

static void tpool_main(void *arg);

/* Start one more thread; mu held. False when the thread cannot be created (the queued
 * jobs still run on the threads there are). */
static bool tpool_spawn(tpool *p)
{
	uv_thread_t t;
	tworker *w = sdb_calloc(1, sizeof *w);

	w->p = p;
	if (sem_init(&w->sem, 0, 0) != 0) {
		free(w);
		return false;
	}
	if (sdb_uv_thread_create(&t, tpool_main, w) != 0) {
		sem_destroy(&w->sem);
		free(w);
		return false;
	}
	pthread_detach(t); /* tpool_destroy waits on n, not on joins */
	p->n++;
	if (p->g_threads)
		sdb_gauge_set(p->g_threads, (int64_t)p->n);
	return true;
}

/* Take w off p->idle if it is there; mu held. True when it was (nobody handed it a job
 * or a stop). */
static bool tpool_unidle(tpool *p, tworker *w)
{
	for (tworker **pp = &p->idle; *pp; pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			w->next = NULL;
			return true;
		}
	}
	return false;
}

/* Wait for w's semaphore at most timeout_ns; false on timeout. The deadline is on the
 * wall clock (sem_timedwait): a clock step only moves when an idle thread exits. */
static bool tpool_wait(tworker *w, uint64_t timeout_ns)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(timeout_ns / 1000000000ULL);
	ts.tv_nsec += (long)(timeout_ns % 1000000000ULL);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	for (;;) {
		if (sem_timedwait(&w->sem, &ts) == 0)
			return true;
		if (errno == ETIMEDOUT)
			return false;
		/* EINTR: wait again */
	}
}

static void tpool_main(void *arg)
{
	tworker *w = arg;
	tpool *p = w->p;

	uv_mutex_lock(&p->mu);
	for (;;) {
		job *j = p->head;
		if (j != NULL) {
			p->head = j->next;
			if (p->head == NULL)
				p->tail = NULL;
		} else {
			if (p->stop)
				break;
			w->job = NULL;
			w->next = p->idle;
			p->idle = w;
			uv_mutex_unlock(&p->mu);
			bool woken = tpool_wait(w, TPOOL_IDLE_NS);
			if (!woken) {
				uv_mutex_lock(&p->mu);
				if (tpool_unidle(p, w)) {
					if (p->n > p->min)
						break; /* idle too long: exit */
					continue;  /* stay: wait again */
				}
				/* handed a job (or a stop) as the wait timed out: its post is
				 * there or coming */
				uv_mutex_unlock(&p->mu);
				while (sem_wait(&w->sem) != 0)
					;
			}
			/* the job was set before the post that woke this thread */
			j = w->job;
			w->job = NULL;
			if (j == NULL) { /* stop */
				uv_mutex_lock(&p->mu);
				continue; /* the queued jobs first, then exit */
			}
			j->fn(j->arg);
			free(j);
			uv_mutex_lock(&p->mu);
			continue;
		}
		uv_mutex_unlock(&p->mu);
		j->fn(j->arg);
		free(j);
		uv_mutex_lock(&p->mu);
	}
	p->n--;
	if (p->g_threads)
		sdb_gauge_set(p->g_threads, (int64_t)p->n);
	uv_cond_broadcast(&p->gone);
	uv_mutex_unlock(&p->mu);
	sem_destroy(&w->sem);
	free(w);
}

void tpool_init(tpool *p, size_t min, size_t max, sdb_gauge *g)
{
	memset(p, 0, sizeof *p);
	uv_mutex_init(&p->mu);
	uv_cond_init(&p->gone);
	p->min = min;
	p->max = max;
	p->g_threads = g;
	uv_mutex_lock(&p->mu);
	for (size_t i = 0; i < min; i++)
		if (!tpool_spawn(p))
			abort();
	uv_mutex_unlock(&p->mu);
}

void tpool_push(tpool *p, void (*fn)(void *), void *arg)
{
	job *j = sdb_calloc(1, sizeof *j);
	tworker *w;

	j->fn = fn;
	j->arg = arg;
	uv_mutex_lock(&p->mu);
	w = p->idle;
	if (w != NULL) {
		/* an idle thread takes it directly */
		p->idle = w->next;
		w->next = NULL;
		w->job = j;
	} else {
		if (p->tail)
			p->tail->next = j;
		else
			p->head = j;
		p->tail = j;
		if (p->n < p->max)
			tpool_spawn(p);
	}
	uv_mutex_unlock(&p->mu);
	/* posted after unlocking: the woken thread does not run into the held mutex */
	if (w != NULL)
		sem_post(&w->sem);
}

void tpool_destroy(tpool *p)
{
	tworker *w, *next;

	uv_mutex_lock(&p->mu);
	p->stop = true;
	w = p->idle;
	p->idle = NULL;
	for (; w; w = next) {
		next = w->next;
		w->next = NULL;
		w->job = NULL;
		sem_post(&w->sem);
	}
	while (p->n > 0)
		uv_cond_wait(&p->gone, &p->mu);
	uv_mutex_unlock(&p->mu);
	uv_cond_destroy(&p->gone);
	uv_mutex_destroy(&p->mu);
}
