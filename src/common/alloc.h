/* Memory allocation policy: decided once, here.
 *
 * stripedb aborts the process with a clear message on out-of-memory rather than
 * threading NOMEM through every path (the redis zmalloc choice). Every allocation in
 * stripedb code goes through these wrappers; libbson already aborts on OOM, and
 * sdb_alloc_init() points libbson's vtable at the same wrappers so one message is
 * printed whichever path ran out.
 */
#ifndef SDB_COMMON_ALLOC_H
#define SDB_COMMON_ALLOC_H

#include <stddef.h>
#include <stdlib.h>

/* Never return NULL: on failure print "stripedb: out of memory (N bytes)" and abort().
 * Free with free(). sdb_malloc(0) returns a unique pointer. */
void *sdb_malloc(size_t n);
void *sdb_calloc(size_t count, size_t size);
void *sdb_realloc(void *p, size_t n);
char *sdb_strdup(const char *s);
char *sdb_strndup(const char *s, size_t n);
/* Zeroed memory aligned to `alignment` bytes (a power of two), for structs that embed a
 * bson_t, which libbson declares 128-byte aligned (BSON_ALIGNOF(bson_t)). Free with free(). */
void *sdb_aligned_calloc(size_t alignment, size_t size);
/* The one allocator for objects that embed a bson_t: zeroed memory for count objects of
 * size bytes, 128-byte aligned (BSON_ALIGNOF(bson_t)); count 0 gives room for one; a
 * count * size that overflows aborts as out of memory. Free with free(). */
void *sdb_calloc_bson(size_t count, size_t size);
/* printf into a fresh heap string (caller frees). */
char *sdb_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A namespace "db.coll" (heap, caller frees; aborts on OOM like sdb_malloc): what
 * sdb_asprintf("%s.%s", db, coll) gives, without formatting (vasprintf's two passes were
 * ~1% of a shard's point read, issue #19). */
char *sdb_ns_join(const char *db, const char *coll);

/* qsort(3) that accepts an empty or one-element array with base NULL: qsort(NULL, 0, ...)
 * is undefined behaviour (C11 7.22.5: base must be valid even when nmemb is 0), which
 * UBSan reports. Same arguments as qsort. */
static inline void sdb_qsort(void *base, size_t nmemb, size_t size,
			     int (*cmp)(const void *, const void *))
{
	if (nmemb > 1)
		qsort(base, nmemb, size, cmp);
}

/* Install the wrappers into libbson's allocator vtable (including aligned_alloc, so
 * bson_new() stays 128-byte aligned). Call once from main(). */
void sdb_alloc_init(void);

#endif
