# src/ratelimit: sources and unit tests of this folder (included by the top Makefile.am)

# --- decision library, HTTP gateway, role (issue #3, limiter engineer) ---
libstripedb_a_SOURCES += src/ratelimit/role.c src/ratelimit/limiter.c src/ratelimit/algo.c \
	src/ratelimit/cache.c
noinst_HEADERS += src/ratelimit/limiter.h src/ratelimit/algo.h src/ratelimit/cache.h

check_PROGRAMS += tests/unit/test_ratelimit_algo tests/unit/test_ratelimit_limiter
tests_unit_test_ratelimit_algo_SOURCES = tests/unit/test_ratelimit_algo.c
tests_unit_test_ratelimit_algo_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_algo_LDADD = $(UNIT_LDADD)
tests_unit_test_ratelimit_limiter_SOURCES = tests/unit/test_ratelimit_limiter.c
tests_unit_test_ratelimit_limiter_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_limiter_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_ratelimit_algo tests/unit/test_ratelimit_limiter
# --- end limiter engineer block ---
