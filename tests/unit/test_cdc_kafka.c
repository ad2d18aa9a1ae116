/* Unit tests of the Kafka CDC backend (src/cdc/kafka.c) and the reader over it, against
 * librdkafka's mock cluster in this process (a real Kafka protocol broker on loopback). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/cdc/kafka.c"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "cdc/archive.h"
#include "cdc/log.h"
#include "cdc/reader.h"
#include "common/err.h"

static rd_kafka_t *mock_rk;
static rd_kafka_mock_cluster_t *mock;
static char spec[256];

static int group_setup(void **state)
{
	char e[256];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	(void)state;
	rd_kafka_conf_set(conf, "log_level", "0", e, sizeof e);
	mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof e);
	assert_non_null(mock_rk);
	mock = rd_kafka_mock_cluster_new(mock_rk, 1);
	assert_non_null(mock);
	assert_int_equal(rd_kafka_mock_topic_create(mock, CDC_TOPIC_PREFIX "s1", 1, 1), 0);
	assert_int_equal(rd_kafka_mock_topic_create(mock, CDC_TOPIC_PREFIX "s2", 1, 1), 0);
	snprintf(spec, sizeof spec, "kafka:%s", rd_kafka_mock_cluster_bootstraps(mock));
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	rd_kafka_mock_cluster_destroy(mock);
	rd_kafka_destroy(mock_rk);
	return 0;
}

static uint64_t ts_of(unsigned i)
{
	return ((uint64_t)(2000 + i) << 32) | 7;
}

static void event(unsigned i, uint8_t *buf, size_t *len)
{
	memset(buf, 0, 64);
	*len = (size_t)snprintf((char *)buf, 64, "event-%u", i) + 1;
}

static void expect_read(cdc_log *log, const char *shard, uint64_t after, unsigned from,
			unsigned to)
{
	cdc_reader *r;
	cdc_event ev;
	char err[256];
	assert_int_equal(cdc_reader_open(log, shard, after, &r, err, sizeof err), 0);
	for (unsigned i = from; i < to; i++) {
		uint8_t buf[64];
		size_t len;
		event(i, buf, &len);
		int rc = cdc_reader_next(r, &ev, 5000, err, sizeof err);
		if (rc != 1)
			fail_msg("event %u: rc %d %s", i, rc, err);
		assert_int_equal(ev.ts, ts_of(i));
		assert_int_equal(ev.len, len);
		assert_memory_equal(ev.data, buf, len);
	}
	assert_int_equal(cdc_reader_next(r, &ev, 0, err, sizeof err), 0);
	cdc_reader_close(r);
}

static void test_append_reopen_read(void **state)
{
	cdc_log *log;
	cdc_writer *w;
	cdc_range g;
	char err[256];
	cdc_log_opts o = {0};
	(void)state;
	assert_int_equal(cdc_log_open(spec, &o, &log, err, sizeof err), 0);
	assert_string_equal(cdc_log_backend(log), "kafka");
	assert_int_equal(cdc_log_writer_open(log, "s1", &w, err, sizeof err), 0);
	assert_int_equal(cdc_writer_next_offset(w), 0);
	assert_int_equal(cdc_writer_last_ts(w), 0);
	for (unsigned i = 0; i < 10; i++) {
		uint8_t buf[64];
		size_t len;
		event(i, buf, &len);
		assert_int_equal(cdc_writer_append(w, ts_of(i), buf, len, err, sizeof err), 0);
	}
	assert_int_equal(cdc_writer_flush(w, err, sizeof err), 0);
	cdc_writer_close(w);

	assert_int_equal(cdc_log_range(log, "s1", &g, err, sizeof err), 0);
	assert_int_equal(g.first_offset, 0);
	assert_int_equal(g.next_offset, 10);
	assert_int_equal(g.first_ts, ts_of(0));
	assert_int_equal(g.last_ts, ts_of(9));

	/* the published position is read back from the topic's last message */
	assert_int_equal(cdc_log_writer_open(log, "s1", &w, err, sizeof err), 0);
	assert_int_equal(cdc_writer_next_offset(w), 10);
	assert_int_equal(cdc_writer_last_ts(w), ts_of(9));
	cdc_writer_close(w);

	expect_read(log, "s1", 0, 0, 10);
	expect_read(log, "s1", ts_of(4), 5, 10);
	expect_read(log, "s1", ts_of(9), 10, 10);
	cdc_log_close(log);
}

/* A publisher that died after its produce was delivered, and the one that took over and
 * sent the same entries again: the topic holds the duplicates, readers drop them. */
static void test_resent_tail_is_deduped(void **state)
{
	cdc_log *log;
	void *w;
	uint64_t next, last;
	char err[256];
	cdc_log_opts o = {0};
	(void)state;
	assert_int_equal(cdc_log_open(spec, &o, &log, err, sizeof err), 0);
	assert_int_equal(cdc_backend_kafka.writer_open(log, "s2", &w, &next, &last, err, sizeof err),
			 0);
	unsigned order[] = {0, 1, 2, 3, 2, 3, 4, 5};
	for (unsigned k = 0; k < sizeof order / sizeof order[0]; k++) {
		uint8_t buf[64];
		size_t len;
		event(order[k], buf, &len);
		assert_int_equal(cdc_backend_kafka.append(w, k, ts_of(order[k]), buf, len, err,
							  sizeof err),
				 0);
	}
	assert_int_equal(cdc_backend_kafka.flush(w, err, sizeof err), 0);
	cdc_backend_kafka.writer_close(w);
	cdc_range g;
	assert_int_equal(cdc_log_range(log, "s2", &g, err, sizeof err), 0);
	assert_int_equal(g.next_offset, 8);
	expect_read(log, "s2", 0, 0, 6);
	expect_read(log, "s2", ts_of(2), 3, 6);
	cdc_log_close(log);
}

static void test_unknown_topic_is_empty(void **state)
{
	cdc_log *log;
	cdc_range g;
	char err[256];
	(void)state;
	assert_int_equal(cdc_log_open(spec, NULL, &log, err, sizeof err), 0);
	assert_int_equal(cdc_log_range(log, "never-written", &g, err, sizeof err), 0);
	assert_int_equal(g.next_offset, 0);
	assert_int_equal(g.last_ts, 0);
	cdc_log_close(log);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_reopen_read),
		cmocka_unit_test(test_resent_tail_is_deduped),
		cmocka_unit_test(test_unknown_topic_is_empty),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
