/* Metrics registry and Prometheus text rendering: see metrics.h. */
#include "common/metrics.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "build_config.h"

enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };

#define N_BUCKETS 16
static const double bucket_bounds[N_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
						0.01,	0.025,	 0.05,	 0.1,	0.25,	0.5,
						1,	2.5,	 5,	 10};

typedef struct series {
	struct series *next;
	char *labels;
	_Atomic uint64_t u;         /* counter value / histogram count */
	_Atomic int64_t i;          /* gauge value */
	_Atomic uint64_t sum_ns;    /* histogram sum */
	_Atomic uint64_t buckets[N_BUCKETS];
	atomic_bool hidden;         /* gauge left out of the rendering (sdb_gauge_hide) */
} series;

typedef struct family {
	struct family *next;
	char *name;
	char *help;
	int kind;
	series *head;
	series *tail;
} family;

struct sdb_counter { series s; };
struct sdb_gauge { series s; };
struct sdb_histogram { series s; };

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static family *families;
static family *families_tail;

static void bad_name(const char *name)
{
	fprintf(stderr, "stripedb: metrics: invalid metric name '%s'\n", name);
	abort();
}

static series *lookup(const char *name, const char *help, const char *labels, int kind)
{
	family *f;
	series *s;

	if (labels == NULL) {
		labels = "";
	}
	for (const char *p = name; *p != '\0'; p++) {
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':' ||
		      (p != name && *p >= '0' && *p <= '9'))) {
			bad_name(name);
		}
	}
	pthread_mutex_lock(&reg_mu);
	for (f = families; f != NULL; f = f->next) {
		if (strcmp(f->name, name) == 0) {
			break;
		}
	}
	if (f == NULL) {
		f = sdb_calloc(1, sizeof *f);
		f->name = sdb_strdup(name);
		f->help = sdb_strdup(help != NULL ? help : "");
		f->kind = kind;
		if (families_tail != NULL) {
			families_tail->next = f;
		} else {
			families = f;
		}
		families_tail = f;
	} else if (f->kind != kind) {
		pthread_mutex_unlock(&reg_mu);
		fprintf(stderr, "stripedb: metrics: '%s' registered with two types\n", name);
		abort();
	}
	for (s = f->head; s != NULL; s = s->next) {
		if (strcmp(s->labels, labels) == 0) {
			pthread_mutex_unlock(&reg_mu);
			return s;
		}
	}
	/* Series are allocated as the largest wrapper; all wrappers hold only a series. */
	s = sdb_calloc(1, sizeof(series));
	s->labels = sdb_strdup(labels);
	if (f->tail != NULL) {
		f->tail->next = s;
	} else {
		f->head = s;
	}
	f->tail = s;
	pthread_mutex_unlock(&reg_mu);
	return s;
}

sdb_counter *sdb_metrics_counter(const char *name, const char *help, const char *labels)
{
	return (sdb_counter *)lookup(name, help, labels, KIND_COUNTER);
}

sdb_gauge *sdb_metrics_gauge(const char *name, const char *help, const char *labels)
{
	return (sdb_gauge *)lookup(name, help, labels, KIND_GAUGE);
}

sdb_histogram *sdb_metrics_histogram(const char *name, const char *help, const char *labels)
{
	return (sdb_histogram *)lookup(name, help, labels, KIND_HISTOGRAM);
}

void sdb_metrics_register(void *obj, const sdb_metric_def *defs, size_t n, const char *labels)
{
	for (size_t i = 0; i < n; i++) {
		const sdb_metric_def *d = &defs[i];
		char *joined = NULL;
		const char *l = labels;
		void *field = (char *)obj + d->offset;

		if (d->labels != NULL && d->labels[0] != '\0') {
			if (l != NULL && l[0] != '\0')
				l = joined = sdb_asprintf("%s,%s", labels, d->labels);
			else
				l = d->labels;
		}
		/* memcpy of a pointer of the field's own type: no type punning */
		switch (d->kind) {
		case SDB_METRIC_KIND_COUNTER: {
			sdb_counter *c = sdb_metrics_counter(d->name, d->help, l);
			memcpy(field, &c, sizeof c);
			break;
		}
		case SDB_METRIC_KIND_GAUGE: {
			sdb_gauge *g = sdb_metrics_gauge(d->name, d->help, l);
			memcpy(field, &g, sizeof g);
			break;
		}
		case SDB_METRIC_KIND_HISTOGRAM: {
			sdb_histogram *h = sdb_metrics_histogram(d->name, d->help, l);
			memcpy(field, &h, sizeof h);
			break;
		}
		default:
			fprintf(stderr, "stripedb: metrics: '%s' has unknown kind %d\n", d->name,
				(int)d->kind);
			abort();
		}
		free(joined);
	}
}

void sdb_counter_add(sdb_counter *c, uint64_t v)
{
	atomic_fetch_add_explicit(&c->s.u, v, memory_order_relaxed);
}

void sdb_gauge_set(sdb_gauge *g, int64_t v)
{
	atomic_store_explicit(&g->s.i, v, memory_order_relaxed);
	atomic_store_explicit(&g->s.hidden, false, memory_order_relaxed);
}

void sdb_gauge_add(sdb_gauge *g, int64_t v)
{
	atomic_fetch_add_explicit(&g->s.i, v, memory_order_relaxed);
	atomic_store_explicit(&g->s.hidden, false, memory_order_relaxed);
}

void sdb_gauge_hide(sdb_gauge *g)
{
	atomic_store_explicit(&g->s.hidden, true, memory_order_relaxed);
}

void sdb_histogram_observe_ns(sdb_histogram *h, uint64_t ns)
{
	double secs = (double)ns / 1e9;

	for (int b = 0; b < N_BUCKETS; b++) {
		if (secs <= bucket_bounds[b]) {
			atomic_fetch_add_explicit(&h->s.buckets[b], 1, memory_order_relaxed);
			break;
		}
	}
	atomic_fetch_add_explicit(&h->s.sum_ns, ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->s.u, 1, memory_order_relaxed);
}

uint64_t sdb_counter_value(const sdb_counter *c)
{
	return atomic_load_explicit(&c->s.u, memory_order_relaxed);
}

int64_t sdb_gauge_value(const sdb_gauge *g)
{
	return atomic_load_explicit(&g->s.i, memory_order_relaxed);
}

/* A growable output buffer. */
typedef struct obuf {
	char *p;
	size_t len, cap;
} obuf;

static void obuf_printf(obuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void obuf_printf(obuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
		b->p = sdb_realloc(b->p, b->cap);
	}
}

static void help_escape(obuf *b, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '\\') {
			obuf_printf(b, "\\\\");
		} else if (*s == '\n') {
			obuf_printf(b, "\\n");
		} else {
			obuf_printf(b, "%c", *s);
		}
	}
}

static void render_process(obuf *b)
{
	static double start_time;
	struct rusage ru;
	FILE *f;
	long rss_pages = 0, vm_pages = 0;
	int fds = 0;
	struct rlimit rl;
	DIR *d;

	if (start_time == 0) {
		/* first render: compute the start time from /proc/self/stat field 22 */
		char buf[1024];
		f = fopen("/proc/self/stat", "r");
		if (f != NULL) {
			if (fgets(buf, sizeof buf, f) != NULL) {
				char *p = strrchr(buf, ')');
				unsigned long long starttime = 0;
				if (p != NULL &&
				    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d "
						  "%*d %*d %*d %*d %*d %llu",
					   &starttime) == 1) {
					FILE *u = fopen("/proc/uptime", "r");
					double up = 0;
					if (u != NULL) {
						if (fscanf(u, "%lf", &up) != 1) {
							up = 0;
						}
						fclose(u);
					}
					struct timespec now;
					clock_gettime(CLOCK_REALTIME, &now);
					start_time = (double)now.tv_sec - up +
						     (double)starttime / (double)sysconf(_SC_CLK_TCK);
				}
			}
			fclose(f);
		}
	}
	getrusage(RUSAGE_SELF, &ru);
	f = fopen("/proc/self/statm", "r");
	if (f != NULL) {
		if (fscanf(f, "%ld %ld", &vm_pages, &rss_pages) != 2) {
			vm_pages = rss_pages = 0;
		}
		fclose(f);
	}
	d = opendir("/proc/self/fd");
	if (d != NULL) {
		while (readdir(d) != NULL) {
			fds++;
		}
		closedir(d);
		fds -= 3; /* ".", ".." and the DIR's own fd */
	}
	getrlimit(RLIMIT_NOFILE, &rl);
	long page = sysconf(_SC_PAGESIZE);
	obuf_printf(b,
		    "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
		    "# TYPE process_cpu_seconds_total counter\n"
		    "process_cpu_seconds_total %.6f\n",
		    (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
			    (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
	obuf_printf(b,
		    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
		    "# TYPE process_resident_memory_bytes gauge\n"
		    "process_resident_memory_bytes %ld\n"
		    "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
		    "# TYPE process_virtual_memory_bytes gauge\n"
		    "process_virtual_memory_bytes %ld\n",
		    rss_pages * page, vm_pages * page);
	obuf_printf(b,
		    "# HELP process_open_fds Number of open file descriptors.\n"
		    "# TYPE process_open_fds gauge\n"
		    "process_open_fds %d\n"
		    "# HELP process_max_fds Maximum number of open file descriptors.\n"
		    "# TYPE process_max_fds gauge\n"
		    "process_max_fds %llu\n"
		    "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
		    "# TYPE process_start_time_seconds gauge\n"
		    "process_start_time_seconds %.3f\n",
		    fds, (unsigned long long)rl.rlim_cur, start_time);
	obuf_printf(b,
		    "# HELP stripedb_build_info stripedb build information.\n"
		    "# TYPE stripedb_build_info gauge\n"
		    "stripedb_build_info{version=\"%s\"} 1\n",
		    PACKAGE_VERSION);
}

static void series_labels(obuf *b, const char *labels, const char *extra)
{
	int has = labels[0] != '\0';

	if (!has && extra == NULL) {
		return;
	}
	obuf_printf(b, "{%s%s%s}", labels, has && extra != NULL ? "," : "", extra != NULL ? extra : "");
}

#define MAX_HOOKS 64
static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	sdb_metrics_hook_fn fn;
	void *arg;
} hooks[MAX_HOOKS];
static size_t n_hooks;

void sdb_metrics_add_hook(sdb_metrics_hook_fn fn, void *arg)
{
	pthread_mutex_lock(&hook_mu);
	if (n_hooks == MAX_HOOKS) {
		fprintf(stderr, "stripedb: metrics: more than %d render hooks\n", MAX_HOOKS);
		abort();
	}
	hooks[n_hooks].fn = fn;
	hooks[n_hooks].arg = arg;
	n_hooks++;
	pthread_mutex_unlock(&hook_mu);
}

void sdb_metrics_remove_hook(sdb_metrics_hook_fn fn, void *arg)
{
	pthread_mutex_lock(&hook_mu);
	for (size_t i = 0; i < n_hooks; i++) {
		if (hooks[i].fn == fn && hooks[i].arg == arg) {
			memmove(&hooks[i], &hooks[i + 1], (n_hooks - i - 1) * sizeof(hooks[0]));
			n_hooks--;
			break;
		}
	}
	pthread_mutex_unlock(&hook_mu);
}

char *sdb_metrics_render(size_t *len)
{
	obuf b = {0};

	pthread_mutex_lock(&hook_mu);
	for (size_t i = 0; i < n_hooks; i++)
		hooks[i].fn(hooks[i].arg);
	pthread_mutex_unlock(&hook_mu);

	b.cap = 4096;
	b.p = sdb_malloc(b.cap);
	b.p[0] = '\0';
	render_process(&b);
	pthread_mutex_lock(&reg_mu);
	for (family *f = families; f != NULL; f = f->next) {
		obuf_printf(&b, "# HELP %s ", f->name);
		help_escape(&b, f->help);
		obuf_printf(&b, "\n# TYPE %s %s\n", f->name,
			    f->kind == KIND_COUNTER ? "counter"
			    : f->kind == KIND_GAUGE ? "gauge"
						    : "histogram");
		for (series *s = f->head; s != NULL; s = s->next) {
			if (f->kind == KIND_COUNTER) {
				obuf_printf(&b, "%s", f->name);
				series_labels(&b, s->labels, NULL);
				obuf_printf(&b, " %llu\n", (unsigned long long)atomic_load(&s->u));
			} else if (f->kind == KIND_GAUGE) {
				if (atomic_load(&s->hidden))
					continue;
				obuf_printf(&b, "%s", f->name);
				series_labels(&b, s->labels, NULL);
				obuf_printf(&b, " %lld\n", (long long)atomic_load(&s->i));
			} else {
				uint64_t cum = 0;
				char le[32];
				for (int k = 0; k < N_BUCKETS; k++) {
					cum += atomic_load(&s->buckets[k]);
					snprintf(le, sizeof le, "le=\"%g\"", bucket_bounds[k]);
					obuf_printf(&b, "%s_bucket", f->name);
					series_labels(&b, s->labels, le);
					obuf_printf(&b, " %llu\n", (unsigned long long)cum);
				}
				uint64_t count = atomic_load(&s->u);
				obuf_printf(&b, "%s_bucket", f->name);
				series_labels(&b, s->labels, "le=\"+Inf\"");
				obuf_printf(&b, " %llu\n", (unsigned long long)count);
				obuf_printf(&b, "%s_sum", f->name);
				series_labels(&b, s->labels, NULL);
				obuf_printf(&b, " %.9f\n", (double)atomic_load(&s->sum_ns) / 1e9);
				obuf_printf(&b, "%s_count", f->name);
				series_labels(&b, s->labels, NULL);
				obuf_printf(&b, " %llu\n", (unsigned long long)count);
			}
		}
	}
	pthread_mutex_unlock(&reg_mu);
	*len = b.len;
	return b.p;
}
