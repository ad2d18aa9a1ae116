/* Unit tests of the embedded CDC log, the file: archive and the reader (src/cdc). */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. segdir.c still comes from the archive (its
 * static copy_file clashes with archive.c's). */
#include "../../src/cdc/log.c"
#include "../../src/cdc/embedded.c"
#include "../../src/cdc/archive.c"
#include "../../src/cdc/reader.c"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdc/archive.h"
#include "cdc/log.h"
#include "cdc/reader.h"
#include "cdc/segdir.h"
#include "common/err.h"

static char root[256];

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof root, "/tmp/test_cdc_log.XXXXXX");
	assert_non_null(mkdtemp(root));
	return 0;
}

static int teardown(void **state)
{
	char cmd[300];
	(void)state;
	snprintf(cmd, sizeof cmd, "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	return 0;
}

static cdc_log *open_log(uint64_t seg, uint64_t keep, int archive)
{
	char spec[300], arch[300];
	cdc_log *log = NULL;
	char err[256];
	cdc_log_opts o = {.fsync = CDC_FSYNC_BATCH, .segment_bytes = seg, .retention_bytes = keep};
	snprintf(spec, sizeof spec, "embedded:%s/log", root);
	snprintf(arch, sizeof arch, "file:%s/archive", root);
	if (archive)
		o.archive = arch;
	assert_int_equal(cdc_log_open(spec, &o, &log, err, sizeof err), 0);
	return log;
}

/* event i: ts (1000+i)<<32 | 1, payload "ev-i" padded to 100 bytes */
static void make_event(unsigned i, uint8_t *buf, size_t *len, uint64_t *ts)
{
	memset(buf, 'x', 100);
	snprintf((char *)buf, 100, "ev-%u", i);
	*len = 100;
	*ts = ((uint64_t)(1000 + i) << 32) | 1;
}

static void append_n(cdc_log *log, unsigned from, unsigned to)
{
	cdc_writer *w;
	char err[256];
	assert_int_equal(cdc_log_writer_open(log, "s1", &w, err, sizeof err), 0);
	assert_int_equal(cdc_writer_next_offset(w), from);
	for (unsigned i = from; i < to; i++) {
		uint8_t buf[100];
		size_t len;
		uint64_t ts;
		make_event(i, buf, &len, &ts);
		assert_int_equal(cdc_writer_append(w, ts, buf, len, err, sizeof err), 0);
	}
	assert_int_equal(cdc_writer_flush(w, err, sizeof err), 0);
	cdc_writer_close(w);
}

/* Read everything after after_ts and check events from..to-1 arrive in order. */
static void expect_events(cdc_log *log, uint64_t after_ts, unsigned from, unsigned to,
			  uint64_t *archived)
{
	cdc_reader *r;
	cdc_event ev;
	char err[256];
	assert_int_equal(cdc_reader_open(log, "s1", after_ts, &r, err, sizeof err), 0);
	for (unsigned i = from; i < to; i++) {
		uint8_t buf[100];
		size_t len;
		uint64_t ts;
		make_event(i, buf, &len, &ts);
		int rc = cdc_reader_next(r, &ev, 1000, err, sizeof err);
		if (rc != 1)
			fail_msg("event %u: rc %d %s", i, rc, err);
		assert_int_equal(ev.offset, i);
		assert_int_equal(ev.ts, ts);
		assert_int_equal(ev.len, 100);
		assert_memory_equal(ev.data, buf, 100);
	}
	assert_int_equal(cdc_reader_next(r, &ev, 0, err, sizeof err), 0);
	if (archived)
		*archived = cdc_reader_archived_events(r);
	cdc_reader_close(r);
}

static void test_append_read_reopen(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 0, 0);
	append_n(log, 0, 25); /* 132-byte records: 8 per segment */
	append_n(log, 25, 40); /* reopen resumes at offset 25 */
	cdc_range g;
	char err[256];
	assert_int_equal(cdc_log_range(log, "s1", &g, err, sizeof err), 0);
	assert_int_equal(g.first_offset, 0);
	assert_int_equal(g.next_offset, 40);
	assert_int_equal(g.first_ts, ((uint64_t)1000 << 32) | 1);
	assert_int_equal(g.last_ts, ((uint64_t)1039 << 32) | 1);
	expect_events(log, 0, 0, 40, NULL);
	/* from a position in the middle: ts of event 17 -> events 18.. */
	expect_events(log, ((uint64_t)1017 << 32) | 1, 18, 40, NULL);
	/* a ts between two events */
	expect_events(log, ((uint64_t)1017 << 32) | 5, 18, 40, NULL);
	cdc_log_close(log);
}

static void test_writer_refuses_replay_and_second_writer(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 0, 0);
	cdc_writer *w, *w2;
	char err[256];
	append_n(log, 0, 3);
	assert_int_equal(cdc_log_writer_open(log, "s1", &w, err, sizeof err), 0);
	assert_int_equal(cdc_writer_last_ts(w), ((uint64_t)1002 << 32) | 1);
	assert_int_equal(cdc_writer_append(w, ((uint64_t)1002 << 32) | 1, (const uint8_t *)"x", 1,
					   err, sizeof err),
			 SDB_EINVAL);
	assert_int_equal(cdc_log_writer_open(log, "s1", &w2, err, sizeof err), SDB_EBUSY);
	cdc_writer_close(w);
	cdc_log_close(log);
}

static void test_torn_tail_is_cut(void **state)
{
	(void)state;
	cdc_log *log = open_log(1 << 20, 0, 0);
	char path[400], err[256];
	append_n(log, 0, 5);
	/* a crash in the middle of appending event 5: half a record at the tail */
	snprintf(path, sizeof path, "%s/log/s1/%020d.seg", root, 0);
	int fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	uint8_t junk[50] = {0x43, 0x44, 0x43, 0x31, 100, 0, 0, 0, 5};
	assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
	close(fd);
	/* a reader meanwhile sees 5 events and waits at the incomplete record */
	expect_events(log, 0, 0, 5, NULL);
	append_n(log, 5, 8); /* recovery cuts the tail; offsets continue at 5 */
	expect_events(log, 0, 0, 8, NULL);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 8 * (CDC_REC_HDR + 100));
	(void)err;
	cdc_log_close(log);
}

static void test_retention_reads_through_archive(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 1500, 1);
	char err[256];
	append_n(log, 0, 60);
	cdc_range live, arch;
	assert_int_equal(cdc_log_range(log, "s1", &live, err, sizeof err), 0);
	assert_int_equal(cdc_archive_range(cdc_log_archive(log), "s1", &arch, err, sizeof err), 0);
	/* 8 records per segment; at most 1500 bytes (one 1056-byte closed segment) kept */
	assert_int_equal(live.next_offset, 60);
	assert_int_equal(live.first_offset, 48);
	assert_int_equal(arch.first_offset, 0);
	assert_int_equal(arch.next_offset, 48);
	uint64_t archived = 0;
	expect_events(log, 0, 0, 60, &archived);
	assert_int_equal(archived, 48);
	expect_events(log, ((uint64_t)1030 << 32) | 1, 31, 60, &archived);
	assert_int_equal(archived, 17);
	cdc_log_close(log);
}

/* --archive-retention on a file: archive: segments whose last event is older than the
 * cutoff go, oldest first, and never one after a younger one; then a position in the
 * deleted range exists nowhere, a later one still reads. */
static void test_archive_expire(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 1500, 1);
	cdc_archive *a;
	cdc_range arch;
	size_t removed = 99;
	char err[256];
	cdc_reader *r = NULL;
	append_n(log, 0, 60);
	a = cdc_log_archive(log);
	assert_string_equal(cdc_archive_scheme(a), "file");
	/* segments of 8 events: [0,8) ends at ts 1007, [8,16) at 1015, ... archive [0,48) */
	assert_int_equal(cdc_archive_expire(a, "s1", (uint64_t)1000 << 32, &removed, err,
					    sizeof err),
			 0);
	assert_int_equal(removed, 0);
	assert_int_equal(cdc_archive_expire(a, "s1", ((uint64_t)1016 << 32), &removed, err,
					    sizeof err),
			 0);
	assert_int_equal(removed, 2);
	assert_int_equal(cdc_archive_range(a, "s1", &arch, err, sizeof err), 0);
	assert_int_equal(arch.first_offset, 16);
	assert_int_equal(arch.next_offset, 48);
	assert_int_equal(cdc_reader_open(log, "s1", 0, &r, err, sizeof err), SDB_ENOTFOUND);
	assert_non_null(strstr(err, "exists nowhere"));
	expect_events(log, ((uint64_t)1020 << 32) | 1, 21, 60, NULL);
	/* everything older than the newest archived event: the archive empties, the log stays */
	assert_int_equal(cdc_archive_expire(a, "s1", (uint64_t)2000 << 32, &removed, err,
					    sizeof err),
			 0);
	assert_int_equal(removed, 4);
	assert_int_equal(cdc_archive_range(a, "s1", &arch, err, sizeof err), 0);
	assert_int_equal(arch.next_offset, 0);
	expect_events(log, ((uint64_t)1050 << 32) | 1, 51, 60, NULL);
	cdc_log_close(log);
}

static void test_retention_parse(void **state)
{
	(void)state;
	uint64_t s = 1;
	assert_int_equal(cdc_archive_retention_parse("7d", &s), 0);
	assert_int_equal(s, 7 * 86400);
	assert_int_equal(cdc_archive_retention_parse("90", &s), 0);
	assert_int_equal(s, 90);
	assert_int_equal(cdc_archive_retention_parse("3h", &s), 0);
	assert_int_equal(s, 3 * 3600);
	assert_int_equal(cdc_archive_retention_parse("15m", &s), 0);
	assert_int_equal(s, 900);
	assert_int_equal(cdc_archive_retention_parse("0", &s), 0);
	assert_int_equal(s, 0);
	assert_int_equal(cdc_archive_retention_parse("7 days", &s), SDB_EINVAL);
	assert_int_equal(cdc_archive_retention_parse("-1d", &s), SDB_EINVAL);
	assert_int_equal(cdc_archive_retention_parse("", &s), SDB_EINVAL);
	assert_int_equal(cdc_archive_retention_parse(NULL, &s), SDB_EINVAL);
}

/* An archive that lost a segment: the reader stops with an error at the hole, after the
 * events before it, and never skips to the events after it. */
static void test_gap_in_the_archive_is_an_error(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 1500, 1);
	cdc_reader *r;
	cdc_event ev;
	char err[256], path[400];
	append_n(log, 0, 60);
	snprintf(path, sizeof path, "%s/archive/s1/%020d.seg", root, 16);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(cdc_reader_open(log, "s1", 0, &r, err, sizeof err), 0);
	for (unsigned i = 0; i < 16; i++) {
		assert_int_equal(cdc_reader_next(r, &ev, 0, err, sizeof err), 1);
		assert_int_equal(ev.offset, i);
	}
	assert_int_equal(cdc_reader_next(r, &ev, 0, err, sizeof err), SDB_ENOTFOUND);
	assert_non_null(strstr(err, "offset 16 is neither in the log"));
	assert_int_equal(cdc_reader_position(r), ((uint64_t)1015 << 32) | 1);
	cdc_reader_close(r);
	cdc_log_close(log);
}

static void test_position_that_exists_nowhere(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 1500, 0); /* retention without archive */
	cdc_reader *r = NULL;
	char err[256];
	append_n(log, 0, 60);
	assert_int_equal(cdc_reader_open(log, "s1", 0, &r, err, sizeof err), SDB_ENOTFOUND);
	assert_non_null(strstr(err, "exists nowhere"));
	assert_int_equal(cdc_reader_open(log, "s1", ((uint64_t)1010 << 32) | 1, &r, err,
					 sizeof err),
			 SDB_ENOTFOUND);
	/* a position inside what is kept works */
	expect_events(log, ((uint64_t)1050 << 32) | 1, 51, 60, NULL);
	cdc_log_close(log);
}

static void test_empty_log_waits(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 0, 0);
	cdc_reader *r;
	cdc_event ev;
	char err[256];
	assert_int_equal(cdc_reader_open(log, "s1", 0, &r, err, sizeof err), 0);
	assert_int_equal(cdc_reader_next(r, &ev, 10, err, sizeof err), 0);
	append_n(log, 0, 2);
	assert_int_equal(cdc_reader_next(r, &ev, 1000, err, sizeof err), 1);
	assert_int_equal(ev.offset, 0);
	assert_int_equal(cdc_reader_next(r, &ev, 1000, err, sizeof err), 1);
	assert_int_equal(ev.offset, 1);
	assert_int_equal(cdc_reader_position(r), ((uint64_t)1001 << 32) | 1);
	cdc_reader_close(r);
	cdc_log_close(log);
}

/* A log whose writer opened its first segment but wrote nothing (a shard with an empty
 * oplog): a reader finds nothing within its timeout, then the first event once it is
 * written. It used to reopen the empty segment forever (the end of a segment switched to
 * "the next one", which for an empty segment is itself). */
static void test_empty_segment_waits(void **state)
{
	(void)state;
	cdc_log *log = open_log(1000, 0, 0);
	cdc_writer *w;
	cdc_reader *r;
	cdc_event ev;
	char err[256];
	assert_int_equal(cdc_log_writer_open(log, "s1", &w, err, sizeof err), 0);
	assert_int_equal(cdc_reader_open(log, "s1", 0, &r, err, sizeof err), 0);
	assert_int_equal(cdc_reader_next(r, &ev, 10, err, sizeof err), 0);
	assert_int_equal(cdc_reader_next(r, &ev, 10, err, sizeof err), 0);
	uint8_t buf[100];
	size_t len;
	uint64_t ts;
	make_event(0, buf, &len, &ts);
	assert_int_equal(cdc_writer_append(w, ts, buf, len, err, sizeof err), 0);
	assert_int_equal(cdc_writer_flush(w, err, sizeof err), 0);
	assert_int_equal(cdc_reader_next(r, &ev, 1000, err, sizeof err), 1);
	assert_int_equal(ev.offset, 0);
	cdc_reader_close(r);
	cdc_writer_close(w);
	cdc_log_close(log);
}

static void test_bad_specs(void **state)
{
	(void)state;
	cdc_log *log;
	cdc_archive *a;
	char err[256];
	cdc_fsync_policy p;
	assert_int_equal(cdc_log_open("s3:bucket", NULL, &log, err, sizeof err), SDB_EINVAL);
	assert_int_equal(cdc_archive_open("ftp://bucket", NULL, &a, err, sizeof err), SDB_EINVAL);
	/* s3: no endpoint, a bad bucket name: refused before any request */
	cdc_log_opts o = {0};
	assert_int_equal(cdc_archive_open("s3://bucket/p", &o, &a, err, sizeof err), SDB_EINVAL);
	assert_non_null(strstr(err, "--s3-endpoint=URL is required"));
	o.s3_endpoint = "http://127.0.0.1:1";
	assert_int_equal(cdc_archive_open("s3://Bad_Bucket/p", &o, &a, err, sizeof err),
			 SDB_EINVAL);
	assert_non_null(strstr(err, "Bad_Bucket"));
	assert_int_equal(cdc_fsync_parse("segment", &p), 0);
	assert_int_equal(p, CDC_FSYNC_SEGMENT);
	assert_int_equal(cdc_fsync_parse("sometimes", &p), SDB_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_append_read_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_writer_refuses_replay_and_second_writer, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_torn_tail_is_cut, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retention_reads_through_archive, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_gap_in_the_archive_is_an_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_position_that_exists_nowhere, setup, teardown),
		cmocka_unit_test_setup_teardown(test_empty_log_waits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_empty_segment_waits, setup, teardown),
		cmocka_unit_test(test_bad_specs),
		cmocka_unit_test_setup_teardown(test_archive_expire, setup, teardown),
		cmocka_unit_test(test_retention_parse),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
