/* Allocation wrappers: abort on out-of-memory (see alloc.h). */
#include "common/alloc.h"

#include <bson/bson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void oom(size_t n)
{
	char msg[96];
	int len = snprintf(msg, sizeof msg, "stripedb: out of memory (%zu bytes)\n", n);

	if (len > 0) {
		ssize_t w = write(STDERR_FILENO, msg, (size_t)len);
		(void)w;
	}
	abort();
}

void *sdb_malloc(size_t n)
{
	void *p = malloc(n == 0 ? 1 : n);

	if (p == NULL) {
		oom(n);
	}
	return p;
}

void *sdb_calloc(size_t count, size_t size)
{
	void *p = calloc(count == 0 ? 1 : count, size == 0 ? 1 : size);

	if (p == NULL) {
		oom(count * size);
	}
	return p;
}

void *sdb_realloc(void *p, size_t n)
{
	void *q = realloc(p, n == 0 ? 1 : n);

	if (q == NULL) {
		oom(n);
	}
	return q;
}

char *sdb_strdup(const char *s)
{
	return sdb_strndup(s, strlen(s));
}

char *sdb_strndup(const char *s, size_t n)
{
	size_t len = strnlen(s, n);
	char *p = sdb_malloc(len + 1);

	memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

/* posix_memalign, with its minimum alignment, or the OOM abort: the one aligned path. */
static void *aligned_alloc_or_die(size_t alignment, size_t size)
{
	void *p = NULL;

	if (alignment < sizeof(void *)) {
		alignment = sizeof(void *);
	}
	if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0 || p == NULL) {
		oom(size);
	}
	return p;
}

void *sdb_aligned_calloc(size_t alignment, size_t size)
{
	void *p = aligned_alloc_or_die(alignment, size);

	memset(p, 0, size);
	return p;
}

void *sdb_calloc_bson(size_t count, size_t size)
{
	size_t total;

	if (__builtin_mul_overflow(count ? count : 1, size, &total))
		oom(SIZE_MAX);
	return sdb_aligned_calloc(128, total);
}

char *sdb_asprintf(const char *fmt, ...)
{
	va_list ap;
	int n;
	char *p;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		oom(0);
	}
	p = sdb_malloc((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(p, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return p;
}

char *sdb_ns_join(const char *db, const char *coll)
{
	size_t nd = strlen(db), nc = strlen(coll);
	char *p = sdb_malloc(nd + nc + 2);

	memcpy(p, db, nd);
	p[nd] = '.';
	memcpy(p + nd + 1, coll, nc + 1);
	return p;
}

static void *bson_vt_malloc(size_t n) { return sdb_malloc(n); }
static void *bson_vt_calloc(size_t c, size_t s) { return sdb_calloc(c, s); }
static void *bson_vt_realloc(void *p, size_t n) { return sdb_realloc(p, n); }
static void bson_vt_free(void *p) { free(p); }
/* bson_new()/bson_copy() allocate bson_t (declared 128-byte aligned) through this hook;
 * without it libbson falls back to malloc and every member access is misaligned (UBSan). */
static void *bson_vt_aligned_alloc(size_t alignment, size_t n)
{
	return aligned_alloc_or_die(alignment, n);
}

void sdb_alloc_init(void)
{
	static bson_mem_vtable_t vt = {
		.malloc = bson_vt_malloc,
		.calloc = bson_vt_calloc,
		.realloc = bson_vt_realloc,
		.free = bson_vt_free,
		.aligned_alloc = bson_vt_aligned_alloc,
	};

	bson_mem_set_vtable(&vt);
}
