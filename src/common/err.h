/* Status codes shared by every stripedb module.
 *
 * Functions return an int: 0 on success or one of the negative SDB_E* codes below.
 * Detail travels upward in a caller-provided error buffer (char *err, size_t errlen),
 * each layer prefixing its own context ("shard: open data dir: ..."). The table is an
 * X-macro so that codes and messages cannot drift apart (after libuv's UV_ERRNO_MAP).
 */
#ifndef SDB_COMMON_ERR_H
#define SDB_COMMON_ERR_H

#include <stddef.h>

#define SDB_ERRNO_MAP(X)                                              \
	X(NOMEM, 1, "out of memory")                                  \
	X(INVAL, 2, "invalid argument")                               \
	X(IO, 3, "I/O error")                                         \
	X(PROTO, 4, "protocol error")                                 \
	X(TOOBIG, 5, "too large")                                     \
	X(NOTFOUND, 6, "not found")                                   \
	X(EXISTS, 7, "already exists")                                \
	X(BUSY, 8, "busy")                                            \
	X(STALE, 9, "stale config")                                   \
	X(NOTLEADER, 10, "not leader")                                \
	X(TIMEOUT, 11, "timed out")                                   \
	X(CANCELED, 12, "canceled")                                   \
	X(INTERNAL, 13, "internal error")                             \
	X(AUTH, 14, "authentication failed")                          \
	X(UNAVAILABLE, 15, "unavailable")                             \
	X(CORRUPT, 16, "data corrupt")                                \
	X(USAGE, 17, "bad usage")                                     \
	X(CONFLICT, 18, "conflict")                                   \
	X(NSNOTFOUND, 19, "namespace not found")

enum {
	SDB_OK = 0,
#define SDB__ERR_ENUM(name, num, msg) SDB_E##name = -(num),
	SDB_ERRNO_MAP(SDB__ERR_ENUM)
#undef SDB__ERR_ENUM
};

/* sdb_strerror returns the static message of an SDB_E* code ("unknown error" for
 * anything else). Never NULL; never freed. */
const char *sdb_strerror(int rc);

/* sdb_errf formats into err (errlen bytes, always NUL-terminated when errlen > 0)
 * and returns rc, so error paths read `return sdb_errf(err, n, SDB_EINVAL, "...")`.
 * err may be NULL. Returns: rc, unchanged (it cannot fail). */
int sdb_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* sdb_errwrap prefixes the message already in err with "CONTEXT: " (in place) and
 * returns rc. Used by each layer to add where the error happened. Returns: rc,
 * unchanged. */
int sdb_errwrap(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
