# src/routing: routing tables (collections, shard keys, chunks), shared by the proxy, the
# coordinator, ctl and the shard (included by the top Makefile.am)
libstripedb_a_SOURCES += src/routing/route.c src/routing/owned.c
noinst_HEADERS += src/routing/route.h src/routing/owned.h

check_PROGRAMS += tests/unit/test_routing
TESTS += tests/unit/test_routing
tests_unit_test_routing_SOURCES = tests/unit/test_routing.c
tests_unit_test_routing_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_routing_LDADD = $(UNIT_LDADD)

check_PROGRAMS += tests/unit/test_routing_owned
TESTS += tests/unit/test_routing_owned
tests_unit_test_routing_owned_SOURCES = tests/unit/test_routing_owned.c
tests_unit_test_routing_owned_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_routing_owned_LDADD = $(UNIT_LDADD)

EXTRA_DIST += src/routing/README.md
