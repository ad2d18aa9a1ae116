# src/proxy: sources and unit tests of this folder (included by the top Makefile.am)
libstripedb_a_SOURCES += \
	src/proxy/admin.c \
	src/proxy/sharding.c \
	src/proxy/chunks.c \
	src/proxy/catalog.c \
	src/proxy/changestream.c \
	src/proxy/changestream_spec.c \
	src/proxy/configdb.c \
	src/proxy/currentop.c \
	src/proxy/cswait.c \
	src/proxy/cursor.c \
	src/proxy/dbprimary.c \
	src/proxy/ddllock.c \
	src/proxy/exec.c \
	src/proxy/explain.c \
	src/proxy/findandmodify.c \
	src/proxy/foreign.c \
	src/proxy/forwarder.c \
	src/proxy/merge.c \
	src/proxy/outmerge.c \
	src/proxy/policy.c \
	src/proxy/quota.c \
	src/proxy/read.c \
	src/proxy/readpref.c \
	src/proxy/renamecoll.c \
	src/proxy/retry.c \
	src/proxy/role.c \
	src/proxy/clustertime.c \
	src/proxy/shardconn.c \
	src/proxy/shardwire.c \
	src/proxy/tpool.c \
	src/proxy/shardver.c \
	src/proxy/txn.c \
	src/proxy/txnroute.c \
	src/proxy/write.c
noinst_HEADERS += \
	src/proxy/changestream_int.h \
	src/proxy/cswait.h \
	src/proxy/ddllock.h \
	src/proxy/exec.h \
	src/proxy/forwarder.h \
	src/proxy/merge.h \
	src/proxy/proxy.h \
	src/proxy/quota.h \
	src/proxy/retry.h \
	src/proxy/shardconn.h \
	src/proxy/shardwire.h \
	src/proxy/tpool.h \
	src/proxy/sharding_int.h \
	src/proxy/txn.h \
	src/proxy/txnroute.h \
	src/proxy/write_int.h

check_PROGRAMS += tests/unit/test_proxy_merge \
	tests/unit/test_proxy_cursor tests/unit/test_proxy_txn tests/unit/test_proxy_exec \
	tests/unit/test_proxy_changestream tests/unit/test_proxy_shardconn
TESTS += tests/unit/test_proxy_merge tests/unit/test_proxy_cursor \
	tests/unit/test_proxy_txn tests/unit/test_proxy_exec tests/unit/test_proxy_changestream \
	tests/unit/test_proxy_shardconn
tests_unit_test_proxy_merge_SOURCES = tests/unit/test_proxy_merge.c
tests_unit_test_proxy_merge_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_merge_LDADD = $(UNIT_LDADD)
tests_unit_test_proxy_cursor_SOURCES = tests/unit/test_proxy_cursor.c
tests_unit_test_proxy_cursor_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_cursor_LDADD = $(UNIT_LDADD)
tests_unit_test_proxy_txn_SOURCES = tests/unit/test_proxy_txn.c
tests_unit_test_proxy_txn_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_txn_LDADD = $(UNIT_LDADD)
tests_unit_test_proxy_exec_SOURCES = tests/unit/test_proxy_exec.c
tests_unit_test_proxy_exec_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_exec_LDADD = $(UNIT_LDADD)
tests_unit_test_proxy_changestream_SOURCES = tests/unit/test_proxy_changestream.c
tests_unit_test_proxy_changestream_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_changestream_LDADD = $(UNIT_LDADD)
tests_unit_test_proxy_shardconn_SOURCES = tests/unit/test_proxy_shardconn.c
tests_unit_test_proxy_shardconn_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_proxy_shardconn_LDADD = $(UNIT_LDADD)

EXTRA_DIST += tests/integration/test_proxy.py tests/integration/proxy_helpers.py \
	tests/bench/proxy_bench.py tests/bench/cs_starvation_bench.py src/proxy/README.md \
	tests/integration/test_proxy_filtering.py tests/bench/chunk_bench.py \
	tests/integration/test_rolling.py tests/integration/test_int_args.py \
	tests/integration/test_proxy_leaks.py tests/integration/test_retryable_proxy.py \
	tests/integration/test_proxy_forwarder.py tests/integration/test_proxy_forwarder_review.py \
	tests/integration/forwarder_helpers.py tests/integration/test_proxy_forwarder_sharded.py \
	tests/integration/test_proxy_forwarder_sharded_review.py

# benchmark tool (never in make check): see tests/bench/README.md "The floor of an
# event-driven proxy"
noinst_PROGRAMS += tests/bench/relay_floor
tests_bench_relay_floor_SOURCES = tests/bench/relay_floor.c
tests_bench_relay_floor_LDADD = $(SDB_LIBS)
