# src/shard: sources and unit tests of this folder (included by the top Makefile.am)
# The shard role (issue #4): wire commands over storage/store.h, run on a worker pool.
libstripedb_a_SOURCES += src/shard/role.c src/shard/pool.c src/shard/cursors.c \
	src/shard/commands.c src/shard/clustertime.c src/shard/util.c src/shard/cmd_read.c src/shard/cmd_aggregate.c src/shard/cmd_outmerge.c src/shard/cmd_write.c \
	src/shard/cmd_admin.c src/shard/retry.c src/shard/retry_mig.c src/shard/filtering.c \
	src/shard/repl.c src/shard/repl_wc.c src/shard/repl_parts.c src/shard/repl_hello.c src/shard/repl_causal.c src/shard/repl_view.c src/shard/snapfile.c \
	src/shard/members.c \
	src/shard/ttl.c src/shard/txn.c src/shard/txn_apply.c src/shard/currentop.c src/shard/validation.c \
	src/shard/changestream.c src/shard/cs_event.c
noinst_HEADERS += src/shard/shard.h src/shard/util.h src/shard/repl.h src/shard/snapfile.h \
	src/shard/members.h src/shard/ttl.h src/shard/repl_int.h src/shard/txn.h src/shard/txn_int.h \
	src/shard/cmd_read_int.h src/shard/validation.h src/shard/changestream.h
EXTRA_DIST += tests/integration/crud_unified.py tests/integration/test_crud_unified.py \
	tests/integration/test_compat_refusals.py docs/compat.md docs/compat-crud.md \
	tests/integration/test_crud_report.py tests/integration/test_let.py \
	tests/integration/test_strict_commands.py tests/integration/test_arg_types.py \
	tests/integration/crud_unified_node.js tests/integration/test_shard_node.py \
	tests/integration/test_shard.py tests/integration/test_retryable_writes.py \
	tests/integration/test_shard_filtering.py tests/integration/test_validation.py \
	tests/integration/test_change_streams_shard.py \
	src/shard/README.md

check_PROGRAMS += tests/unit/test_shard_cs_event
TESTS += tests/unit/test_shard_cs_event
tests_unit_test_shard_cs_event_SOURCES = tests/unit/test_shard_cs_event.c
tests_unit_test_shard_cs_event_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_shard_cs_event_LDADD = $(UNIT_LDADD)

# benchmark (never in make check): see tests/bench/README.md "shard_bench"
noinst_PROGRAMS += tests/bench/shard_bench
tests_bench_shard_bench_SOURCES = tests/bench/shard_bench.c
tests_bench_shard_bench_LDADD = $(SDB_LIBS)
