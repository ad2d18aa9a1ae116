/* Unit tests of src/common/metrics.c: values and exposition format. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/metrics.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"

/* A hidden gauge leaves the rendering until it is set again; other series stay. */
static void test_gauge_hide(void **state)
{
	sdb_gauge *a = sdb_metrics_gauge("t_member_lag", "Lag.", "member=\"1\"");
	sdb_gauge *b = sdb_metrics_gauge("t_member_lag", "Lag.", "member=\"2\"");
	size_t len;
	char *text;

	(void)state;
	sdb_gauge_set(a, 3);
	sdb_gauge_set(b, 4);
	sdb_gauge_hide(b);
	text = sdb_metrics_render(&len);
	assert_non_null(strstr(text, "t_member_lag{member=\"1\"} 3\n"));
	assert_null(strstr(text, "member=\"2\""));
	free(text);
	sdb_gauge_set(b, 5);
	text = sdb_metrics_render(&len);
	assert_non_null(strstr(text, "t_member_lag{member=\"2\"} 5\n"));
	free(text);
}

static void test_counter_gauge_histogram(void **state)
{
	sdb_counter *c = sdb_metrics_counter("t_requests_total", "Requests.", "cmd=\"find\"");
	sdb_counter *c2 = sdb_metrics_counter("t_requests_total", "Requests.", "cmd=\"find\"");
	sdb_gauge *g = sdb_metrics_gauge("t_conns", "Connections.", NULL);
	sdb_histogram *h = sdb_metrics_histogram("t_latency_seconds", "Latency.", "cmd=\"find\"");
	size_t len;
	char *text;

	assert_ptr_equal(c, c2);
	sdb_counter_add(c, 41);
	sdb_counter_inc(c2);
	assert_int_equal(sdb_counter_value(c), 42);
	sdb_gauge_set(g, 7);
	sdb_gauge_add(g, -2);
	assert_int_equal(sdb_gauge_value(g), 5);
	sdb_histogram_observe_ns(h, 200000);     /* 0.2 ms -> le 0.00025 */
	sdb_histogram_observe_ns(h, 3000000000); /* 3 s -> le 5 */
	sdb_histogram_observe_ns(h, 20000000000ull); /* 20 s -> only +Inf */
	text = sdb_metrics_render(&len);
	assert_int_equal(strlen(text), len);
	assert_non_null(strstr(text, "# TYPE t_requests_total counter\nt_requests_total{cmd=\"find\"} 42\n"));
	assert_non_null(strstr(text, "# TYPE t_conns gauge\nt_conns 5\n"));
	assert_non_null(strstr(text, "t_latency_seconds_bucket{cmd=\"find\",le=\"0.0001\"} 0\n"));
	assert_non_null(strstr(text, "t_latency_seconds_bucket{cmd=\"find\",le=\"0.00025\"} 1\n"));
	assert_non_null(strstr(text, "t_latency_seconds_bucket{cmd=\"find\",le=\"2.5\"} 1\n"));
	assert_non_null(strstr(text, "t_latency_seconds_bucket{cmd=\"find\",le=\"5\"} 2\n"));
	assert_non_null(strstr(text, "t_latency_seconds_bucket{cmd=\"find\",le=\"+Inf\"} 3\n"));
	assert_non_null(strstr(text, "t_latency_seconds_count{cmd=\"find\"} 3\n"));
	assert_non_null(strstr(text, "t_latency_seconds_sum{cmd=\"find\"} 23.000200000\n"));
	assert_non_null(strstr(text, "# TYPE process_resident_memory_bytes gauge\n"));
	free(text);
}

/* A struct as the roles keep them, and its table. */
typedef struct reg_obj {
	int before;
	sdb_gauge *g_lag;
	sdb_counter *c_full;
	sdb_counter *c_diff;
	sdb_histogram *h_apply;
	int after;
} reg_obj;

static const sdb_metric_def reg_obj_metrics[] = {
	SDB_METRIC_GAUGE(reg_obj, g_lag, "t_reg_lag_seconds", "Reg: lag (s)."),
	SDB_METRIC_COUNTER_L(reg_obj, c_full, "t_reg_replies_total", "Reg: replies, by kind.",
			     "kind=\"full\""),
	SDB_METRIC_COUNTER_L(reg_obj, c_diff, "t_reg_replies_total", "Reg: replies, by kind.",
			     "kind=\"diff\""),
	SDB_METRIC_HISTOGRAM(reg_obj, h_apply, "t_reg_apply_seconds", "Reg: apply time."),
};

/* Registering a table fills every field with the series the one-by-one calls return,
 * labels joined (call's first), and leaves the rest of the struct alone. */
static void test_register_table(void **state)
{
	reg_obj o = {.before = 11, .after = 22};
	reg_obj bare = {0};
	size_t len;
	char *text;

	(void)state;
	SDB_METRICS_REGISTER(&o, reg_obj_metrics, "shard=\"a\"");
	SDB_METRICS_REGISTER(&bare, reg_obj_metrics, NULL);
	assert_int_equal(o.before, 11);
	assert_int_equal(o.after, 22);
	assert_ptr_equal(o.g_lag, sdb_metrics_gauge("t_reg_lag_seconds", "Reg: lag (s).",
						    "shard=\"a\""));
	assert_ptr_equal(o.c_full, sdb_metrics_counter("t_reg_replies_total",
						       "Reg: replies, by kind.",
						       "shard=\"a\",kind=\"full\""));
	assert_ptr_equal(o.c_diff, sdb_metrics_counter("t_reg_replies_total",
						       "Reg: replies, by kind.",
						       "shard=\"a\",kind=\"diff\""));
	assert_ptr_equal(o.h_apply, sdb_metrics_histogram("t_reg_apply_seconds",
							  "Reg: apply time.", "shard=\"a\""));
	assert_ptr_equal(bare.g_lag, sdb_metrics_gauge("t_reg_lag_seconds", "Reg: lag (s).", NULL));
	assert_ptr_equal(bare.c_full, sdb_metrics_counter("t_reg_replies_total",
							  "Reg: replies, by kind.",
							  "kind=\"full\""));
	assert_ptr_not_equal(o.c_full, o.c_diff);
	assert_ptr_not_equal(o.g_lag, bare.g_lag);

	sdb_gauge_set(o.g_lag, 9);
	sdb_counter_add(o.c_full, 4);
	sdb_counter_inc(bare.c_diff);
	sdb_histogram_observe_ns(o.h_apply, 2000000); /* 2 ms -> le 0.0025 */
	text = sdb_metrics_render(&len);
	assert_non_null(strstr(text, "# HELP t_reg_lag_seconds Reg: lag (s).\n"
				     "# TYPE t_reg_lag_seconds gauge\n"
				     "t_reg_lag_seconds{shard=\"a\"} 9\n"
				     "t_reg_lag_seconds 0\n"));
	assert_non_null(strstr(text, "# HELP t_reg_replies_total Reg: replies, by kind.\n"
				     "# TYPE t_reg_replies_total counter\n"
				     "t_reg_replies_total{shard=\"a\",kind=\"full\"} 4\n"
				     "t_reg_replies_total{shard=\"a\",kind=\"diff\"} 0\n"
				     "t_reg_replies_total{kind=\"full\"} 0\n"
				     "t_reg_replies_total{kind=\"diff\"} 1\n"));
	assert_non_null(strstr(text, "# TYPE t_reg_apply_seconds histogram\n"));
	assert_non_null(strstr(text, "t_reg_apply_seconds_bucket{shard=\"a\",le=\"0.0025\"} 1\n"));
	assert_non_null(strstr(text, "t_reg_apply_seconds_count{shard=\"a\"} 1\n"));
	assert_non_null(strstr(text, "t_reg_apply_seconds_count 0\n"));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_counter_gauge_histogram),
		cmocka_unit_test(test_gauge_hide),
		cmocka_unit_test(test_register_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
