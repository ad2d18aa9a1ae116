# src/bench: `stripedb bench` (workload generator, histogram, history checker) and
# `stripedb demo` / `stripedb ctl top` (cli/demo.c, cli/top.c) (issue #9).
libstripedb_a_SOURCES += src/bench/hist.c src/bench/bench.c src/bench/check.c src/bench/cmd.c
noinst_HEADERS += src/bench/hist.h src/bench/bench.h src/bench/check.h
libstripedb_a_SOURCES += cli/demo.c cli/top.c cli/failover.c
noinst_HEADERS += cli/dev.h cli/failover.h

check_PROGRAMS += tests/unit/test_bench
tests_unit_test_bench_SOURCES = tests/unit/test_bench.c
tests_unit_test_bench_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_bench_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_bench

EXTRA_DIST += tests/integration/test_bench.py tests/integration/test_demo.py packaging/grafana/stripedb.json \
	docs/demo.md
