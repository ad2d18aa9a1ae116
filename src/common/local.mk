# src/common: shared infrastructure (errors, allocation, logging, config, metrics, HTTP, role runner).
libstripedb_a_SOURCES += \
	src/common/alloc.c \
	src/common/bsonget.c \
	src/common/bsonval.c \
	src/common/changestream.c \
	src/common/clock.c \
	src/common/clustertime.c \
	src/common/cmdopts.c \
	src/common/loopread.c \
	src/common/readconcern.c \
	src/common/curop.c \
	src/common/config.c \
	src/common/dblist.c \
	src/common/err.c \
	src/common/fieldscan.c \
	src/common/http.c \
	src/common/indexname.c \
	src/common/renamecoll.c \
	src/common/aggwrite.c \
	src/common/log.c \
	src/common/metauri.c \
	src/common/metrics.c \
	src/common/role.c \
	src/common/shardref.c \
	src/common/thread.c \
	src/common/throttle.c
noinst_HEADERS += \
	src/common/changestream.h \
	src/common/clock.h \
	src/common/clustertime.h \
	src/common/indexname.h \
	src/common/renamecoll.h \
	src/common/aggwrite.h \
	src/common/cmdopts.h \
	src/common/loopread.h \
	src/common/readconcern.h \
	src/common/curop.h \
	src/common/alloc.h \
	src/common/bsonget.h \
	src/common/bsonval.h \
	src/common/config.h \
	src/common/dblist.h \
	src/common/err.h \
	src/common/fieldscan.h \
	src/common/http.h \
	src/common/log.h \
	src/common/metauri.h \
	src/common/metrics.h \
	src/common/role.h \
	src/common/shardref.h \
	src/common/thread.h \
	src/common/throttle.h

EXTRA_DIST += src/common/README.md

check_PROGRAMS += tests/unit/test_common_config tests/unit/test_common_metrics tests/unit/test_common_bsonget tests/unit/test_common_clock tests/unit/test_common_metauri tests/unit/test_common_throttle tests/unit/test_common_dblist tests/unit/test_common_cmdopts tests/unit/test_common_aggwrite tests/unit/test_common_curop tests/unit/test_common_changestream tests/unit/test_common_clustertime tests/unit/test_common_fieldscan
TESTS += tests/unit/test_common_config tests/unit/test_common_metrics tests/unit/test_common_bsonget tests/unit/test_common_clock tests/unit/test_common_metauri tests/unit/test_common_throttle tests/unit/test_common_dblist tests/unit/test_common_cmdopts tests/unit/test_common_aggwrite tests/unit/test_common_curop tests/unit/test_common_changestream tests/unit/test_common_clustertime tests/unit/test_common_fieldscan
tests_unit_test_common_config_SOURCES = tests/unit/test_common_config.c
tests_unit_test_common_config_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_config_LDADD = $(UNIT_LDADD)
tests_unit_test_common_metrics_SOURCES = tests/unit/test_common_metrics.c
tests_unit_test_common_metrics_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_metrics_LDADD = $(UNIT_LDADD)
tests_unit_test_common_bsonget_SOURCES = tests/unit/test_common_bsonget.c
tests_unit_test_common_bsonget_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_bsonget_LDADD = $(UNIT_LDADD)
tests_unit_test_common_clustertime_SOURCES = tests/unit/test_common_clustertime.c
tests_unit_test_common_clustertime_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_clustertime_LDADD = $(UNIT_LDADD)
tests_unit_test_common_clock_SOURCES = tests/unit/test_common_clock.c
tests_unit_test_common_clock_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_clock_LDADD = $(UNIT_LDADD)
tests_unit_test_common_metauri_SOURCES = tests/unit/test_common_metauri.c
tests_unit_test_common_metauri_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_metauri_LDADD = $(UNIT_LDADD)
tests_unit_test_common_throttle_SOURCES = tests/unit/test_common_throttle.c
tests_unit_test_common_throttle_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_throttle_LDADD = $(UNIT_LDADD)
tests_unit_test_common_dblist_SOURCES = tests/unit/test_common_dblist.c
tests_unit_test_common_dblist_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_dblist_LDADD = $(UNIT_LDADD)
tests_unit_test_common_fieldscan_SOURCES = tests/unit/test_common_fieldscan.c
tests_unit_test_common_fieldscan_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_fieldscan_LDADD = $(UNIT_LDADD)
tests_unit_test_common_cmdopts_SOURCES = tests/unit/test_common_cmdopts.c
tests_unit_test_common_cmdopts_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_cmdopts_LDADD = $(UNIT_LDADD)
tests_unit_test_common_aggwrite_SOURCES = tests/unit/test_common_aggwrite.c
tests_unit_test_common_aggwrite_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_aggwrite_LDADD = $(UNIT_LDADD)
tests_unit_test_common_curop_SOURCES = tests/unit/test_common_curop.c
tests_unit_test_common_curop_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_curop_LDADD = $(UNIT_LDADD)
tests_unit_test_common_changestream_SOURCES = tests/unit/test_common_changestream.c
tests_unit_test_common_changestream_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_common_changestream_LDADD = $(UNIT_LDADD)
