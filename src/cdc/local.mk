# src/cdc: the CDC pipeline (issue #7): log backends, archive, publisher, consumer API.
libstripedb_a_SOURCES += src/cdc/log.c src/cdc/segdir.c src/cdc/embedded.c src/cdc/kafka.c \
	src/cdc/archive.c src/cdc/archive_s3.c src/cdc/s3.c src/cdc/reader.c src/cdc/publisher.c \
	src/cdc/backup.c
noinst_HEADERS += src/cdc/log.h src/cdc/segdir.h src/cdc/archive.h src/cdc/s3.h src/cdc/reader.h \
	src/cdc/publisher.h src/cdc/backup.h

check_PROGRAMS += tests/unit/test_cdc_log
tests_unit_test_cdc_log_SOURCES = tests/unit/test_cdc_log.c
tests_unit_test_cdc_log_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_cdc_log_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_cdc_log
check_PROGRAMS += tests/unit/test_cdc_backup
tests_unit_test_cdc_backup_SOURCES = tests/unit/test_cdc_backup.c
tests_unit_test_cdc_backup_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_cdc_backup_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_cdc_backup
check_PROGRAMS += tests/unit/test_cdc_kafka
tests_unit_test_cdc_kafka_SOURCES = tests/unit/test_cdc_kafka.c
tests_unit_test_cdc_kafka_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_cdc_kafka_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_cdc_kafka

# benchmark of the S3 archive client (never in make check): tests/bench/README.md
noinst_PROGRAMS += tests/bench/s3_archive_bench
tests_bench_s3_archive_bench_SOURCES = tests/bench/s3_archive_bench.c
tests_bench_s3_archive_bench_LDADD = libstripedb.a $(SDB_LIBS)

# `stripedb ctl cdc status|read` (cli/ctl.c dispatches to cli_cdc_main)
libstripedb_a_SOURCES += cli/cdc.c
# `stripedb ctl backup create|list|delete` and `stripedb ctl restore` (issue #22)
libstripedb_a_SOURCES += cli/backup.c cli/restore.c
noinst_HEADERS += cli/backup_int.h

# Test helper: a librdkafka mock cluster (a real Kafka protocol broker on loopback), started
# by tests/integration/test_cdc.py.
check_PROGRAMS += tests/integration/kafka_mock
tests_integration_kafka_mock_SOURCES = tests/integration/kafka_mock.c
tests_integration_kafka_mock_LDADD = $(RDKAFKA_LIBS)

EXTRA_DIST += src/cdc/README.md tests/integration/test_cdc.py tests/integration/cdc_helpers.py \
	tests/integration/test_cdc_s3.py tests/integration/s3_server.py tests/integration/test_backup.py tests/integration/test_backup_s3.py \
	tests/bench/cdc_bench.py tests/bench/s3_archive_bench.py tests/bench/backup_bench.py
