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

/* Table-driven registration: one row per series a struct keeps a pointer to.
 *
 *	typedef struct pub { sdb_gauge *g_lag; sdb_counter *c_events; } pub;
 *	static const sdb_metric_def pub_metrics[] = {
 *		SDB_METRIC_GAUGE(pub, g_lag, "stripedb_cdc_lag_seconds", "CDC: lag (seconds)"),
 *		SDB_METRIC_COUNTER(pub, c_events, "stripedb_cdc_events_total", "CDC: events"),
 *	};
 *	SDB_METRICS_REGISTER(p, pub_metrics, "shard=\"a\"");
 *
 * is the same as p->g_lag = sdb_metrics_gauge(..., "shard=\"a\""); p->c_events = ... in
 * table order (series render in registration order). Build rows with the SDB_METRIC_*
 * macros, not by hand: they take offsetof(struct, field) and fail to compile
 * (_Static_assert) when the field's type is not the pointer type of the kind, so a
 * counter row cannot fill a gauge field. The table is static data; nothing is copied. */
typedef enum sdb_metric_kind {
	SDB_METRIC_KIND_COUNTER,   /* field is sdb_counter * */
	SDB_METRIC_KIND_GAUGE,     /* field is sdb_gauge * */
	SDB_METRIC_KIND_HISTOGRAM, /* field is sdb_histogram * */
} sdb_metric_kind;

typedef struct sdb_metric_def {
	sdb_metric_kind kind;
	const char *name;   /* as for sdb_metrics_counter() */
	const char *help;
	const char *labels; /* this row's own labels, e.g. `kind="full"`, put after the
			     * labels of the sdb_metrics_register() call; NULL for none */
	size_t offset;      /* offsetof(struct, field) of the field the pointer goes to */
} sdb_metric_def;

/* Create (or find) the series of each of the n rows of defs and store its pointer in the
 * field at (char *)obj + defs[i].offset, in row order. The series' labels are `labels`
 * (the call's, NULL or "" for none) and the row's, joined with a comma. obj is the
 * struct the rows were built for (not checked: use SDB_METRICS_REGISTER next to the
 * table); it keeps nothing of labels. Errors: none returned; aborts with a message on
 * what sdb_metrics_counter() aborts on (bad name, one name with two types) and on a
 * row whose kind is not a sdb_metric_kind. Any thread. */
void sdb_metrics_register(void *obj, const sdb_metric_def *defs, size_t n, const char *labels);

/* sdb_metrics_register() over a whole static array (given a pointer, -Wall's
 * -Wsizeof-pointer-div fails the build). */
#define SDB_METRICS_REGISTER(obj, table, labels)                                          \
	sdb_metrics_register((obj), (table), sizeof(table) / sizeof((table)[0]), (labels))

/* offsetof(type, field), failing to compile unless field has type ptrtype. */
#define SDB_METRIC_OFFSET_(type, field, ptrtype)                                          \
	(offsetof(type, field) +                                                          \
	 0 * sizeof(struct {                                                              \
		 _Static_assert(__builtin_types_compatible_p(__typeof__(((type *)0)->field), \
							     ptrtype),                     \
				#type "." #field " is not a " #ptrtype);                  \
		 int unused_;                                                             \
	 }))

/* Rows of a sdb_metric_def table: (struct type, field, name, help[, row labels]). */
#define SDB_METRIC_COUNTER_L(type, field, name, help, labels)                              \
	{SDB_METRIC_KIND_COUNTER, (name), (help), (labels),                               \
	 SDB_METRIC_OFFSET_(type, field, sdb_counter *)}
#define SDB_METRIC_GAUGE_L(type, field, name, help, labels)                                \
	{SDB_METRIC_KIND_GAUGE, (name), (help), (labels),                                 \
	 SDB_METRIC_OFFSET_(type, field, sdb_gauge *)}
#define SDB_METRIC_HISTOGRAM_L(type, field, name, help, labels)                            \
	{SDB_METRIC_KIND_HISTOGRAM, (name), (help), (labels),                             \
	 SDB_METRIC_OFFSET_(type, field, sdb_histogram *)}
#define SDB_METRIC_COUNTER(type, field, name, help)                                       \
	SDB_METRIC_COUNTER_L(type, field, name, help, NULL)
#define SDB_METRIC_GAUGE(type, field, name, help) SDB_METRIC_GAUGE_L(type, field, name, help, NULL)
#define SDB_METRIC_HISTOGRAM(type, field, name, help)                                     \
	SDB_METRIC_HISTOGRAM_L(type, field, name, help, NULL)

void sdb_counter_add(sdb_counter *c, uint64_t v);
static inline void sdb_counter_inc(sdb_counter *c) { sdb_counter_add(c, 1); }
void sdb_gauge_set(sdb_gauge *g, int64_t v);
void sdb_gauge_add(sdb_gauge *g, int64_t v);
/* Leave the series out of /metrics until its next sdb_gauge_set or sdb_gauge_add: a
 * series whose subject went away (a removed replica-set member) disappears instead of
 * showing a stale or sentinel value. The pointer stays valid. Any thread. */
void sdb_gauge_hide(sdb_gauge *g);
/* Observe a duration in nanoseconds (as from sdb_mono_ns() differences, common/clock.h). */
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
