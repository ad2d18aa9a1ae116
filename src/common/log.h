/* Leveled, structured logging to stderr (journald picks it up under systemd).
 *
 * One line per event, logfmt (key=value, values with spaces quoted):
 *   ts=2026-11-30T01:02:03.456Z level=info role=shard node=1 msg="listening" addr=127.0.0.1:27018
 * `role` and `node` come from the calling thread's context (sdb_log_set_thread), so every
 * line names the role that wrote it even when several roles share one process.
 * Lines are written with a single write(2) so concurrent threads never interleave.
 * ts is wall-clock UTC: a log timestamp is the one place wall time belongs.
 */
#ifndef SDB_COMMON_LOG_H
#define SDB_COMMON_LOG_H

typedef enum {
	SDB_LOG_DEBUG = 0,
	SDB_LOG_INFO = 1,
	SDB_LOG_WARN = 2,
	SDB_LOG_ERROR = 3,
} sdb_log_level;

/* Set the process-wide minimum level (default INFO). Thread-safe. */
void sdb_log_set_level(sdb_log_level level);

/* Parse "debug|info|warn|error" into *out. Errors: SDB_EINVAL (anything else; *out
 * untouched). */
int sdb_log_parse_level(const char *s, sdb_log_level *out);

/* Set this thread's role and node id for every later line it logs; either may be NULL
 * (then the key is left out). The strings are copied (at most 31 bytes each). */
void sdb_log_set_thread(const char *role, const char *node);

/* A thread's log context: the role and node id its lines carry (empty: left out). */
typedef struct sdb_log_ctx {
	char role[32];
	char node[32];
} sdb_log_ctx;

/* Copy this thread's log context into *out (for a thread it starts: common/thread.h). */
void sdb_log_get_thread(sdb_log_ctx *out);

/* Make *ctx this thread's log context (as sdb_log_set_thread(ctx->role, ctx->node)). */
void sdb_log_set_thread_ctx(const sdb_log_ctx *ctx);

/* Set this thread's role (NULL or empty: left out), keeping its node id: for a thread
 * that started with its creator's context (common/thread.h) and works for another role
 * (the rate limiter's threads in a proxy). The string is copied (at most 31 bytes). */
void sdb_log_set_thread_role(const char *role);

/* Log msg with extra key=value pairs given by printf-style fmt (may be NULL).
 * Example: sdb_log(SDB_LOG_WARN, "connection closed", "peer=%s reason=%s", peer, why);
 * Values the caller formats must already be quoted if they contain spaces;
 * sdb_logq() below helps. */
void sdb_log(sdb_log_level level, const char *msg, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Quote s for logfmt into buf (n bytes): returns buf. Quotes only when needed. */
const char *sdb_logq(char *buf, unsigned n, const char *s);

#define sdb_debug(msg, ...) sdb_log(SDB_LOG_DEBUG, msg, __VA_ARGS__)
#define sdb_info(msg, ...) sdb_log(SDB_LOG_INFO, msg, __VA_ARGS__)
#define sdb_warn(msg, ...) sdb_log(SDB_LOG_WARN, msg, __VA_ARGS__)
#define sdb_error(msg, ...) sdb_log(SDB_LOG_ERROR, msg, __VA_ARGS__)

#endif
