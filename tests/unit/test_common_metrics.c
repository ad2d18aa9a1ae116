/* Unit tests of src/common/metrics.c: values and exposition format. */
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_counter_gauge_histogram),
		cmocka_unit_test(test_gauge_hide),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
