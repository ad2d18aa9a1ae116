/* Threads that log as the thread that started them: see thread.h. */
#include "common/thread.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/log.h"

/* What a new thread needs before its function: the function, and its creator's context.
 * Allocated by the creator, freed by the thread (or by the creator when none started). */
typedef struct start {
	void *(*fn)(void *);	/* sdb_thread_create's, or NULL */
	void (*uv_fn)(void *);	/* sdb_uv_thread_create's, or NULL */
	void *arg;
	sdb_log_ctx log;
} start;

static void *trampoline(void *p)
{
	start s = *(start *)p;

	free(p);
	sdb_log_set_thread_ctx(&s.log);
	if (s.uv_fn != NULL) {
		s.uv_fn(s.arg);
		return NULL;
	}
	return s.fn(s.arg);
}

static void uv_trampoline(void *p)
{
	(void)trampoline(p);
}

int sdb_thread_create(pthread_t *t, void *(*fn)(void *), void *arg)
{
	start *s = sdb_calloc(1, sizeof *s);
	int rc;

	s->fn = fn;
	s->arg = arg;
	sdb_log_get_thread(&s->log);
	rc = pthread_create(t, NULL, trampoline, s);
	if (rc != 0)
		free(s);
	return rc;
}

int sdb_uv_thread_create(uv_thread_t *t, void (*fn)(void *), void *arg)
{
	start *s = sdb_calloc(1, sizeof *s);
	int rc;

	s->uv_fn = fn;
	s->arg = arg;
	sdb_log_get_thread(&s->log);
	rc = uv_thread_create(t, uv_trampoline, s);
	if (rc != 0)
		free(s);
	return rc;
}
