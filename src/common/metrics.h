/* Process-wide metrics registry, rendered in the Prometheus text exposition format
 * (version 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * Series are identified by (name, labels). Labels are passed pre-rendered without braces,
 * e.g. `role="shard",cmd="find"` (NULL or "" for none). Looking a series up takes a mutex;
 * updating one is a relaxed atomic operation and safe from any thread, so callers look a
 * series up once and keep the pointer (series are never freed before process exit).
 * Every series of one name must have the same type and help text.
 *
 * sdb_metrics_render() also emits process metrics read at render time from /proc/self:
 * process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds, process_max_fds, process_start_time_seconds, and
 * stripedb_build_info{version="..."} 1.
 */
#ifndef SDB_COMMON_METRICS_H
#define SDB_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct sdb_counter sdb_counter;
typedef struct sdb_gauge sdb_gauge;
typedef struct sdb_histogram sdb_histogram;

/* Return the series, creating it on first use. name must match [a-zA-Z_:][a-zA-Z0-9_:]*;
 * counters should end in _total. Never NULL (aborts on a programming error such as a
 * type clash, with a message). */
sdb_counter *sdb_metrics_counter(const char *name, const char *help, const char *labels);
sdb_gauge *sdb_metrics_gauge(const char *name, const char *help, const char *labels);
/* Histogram of seconds with the default latency buckets
 * 0.0001 .. 10 s (100 us, 250 us, 500 us, 1 ms, 2.5 ms, 5 ms, 10 ms, 25 ms, 50 ms,
 * 100 ms, 250 ms, 500 ms, 1 s, 2.5 s, 5 s, 10 s). */
sdb_histogram *sdb_metrics_histogram(const char *name, const char *help, const char *labels);

void sdb_counter_add(sdb_counter *c, uint64_t v);
static inline void sdb_counter_inc(sdb_counter *c) { sdb_counter_add(c, 1); }
void sdb_gauge_set(sdb_gauge *g, int64_t v);
void sdb_gauge_add(sdb_gauge *g, int64_t v);
/* Leave the series out of /metrics until its next sdb_gauge_set or sdb_gauge_add: a
 * series whose subject went away (a removed replica-set member) disappears instead of
 * showing a stale or sentinel value. The pointer stays valid. Any thread. */
void sdb_gauge_hide(sdb_gauge *g);
/* Observe a duration in nanoseconds (as from uv_hrtime() differences). */
void sdb_histogram_observe_ns(sdb_histogram *h, uint64_t ns);

uint64_t sdb_counter_value(const sdb_counter *c);
int64_t sdb_gauge_value(const sdb_gauge *g);

/* A function that sdb_metrics_render() runs first, e.g. to fold counts that a hot path
 * keeps per shard (without a shared atomic per event) into its counters. Hooks run one
 * at a time, in registration order. After sdb_metrics_remove_hook() returns, the hook
 * is not running and never runs again. At most 64 hooks (aborts beyond). */
typedef void (*sdb_metrics_hook_fn)(void *arg);
void sdb_metrics_add_hook(sdb_metrics_hook_fn fn, void *arg);
void sdb_metrics_remove_hook(sdb_metrics_hook_fn fn, void *arg);

/* Render every series; returns a heap string (caller frees) and its length in *len. */
char *sdb_metrics_render(size_t *len);

#endif
