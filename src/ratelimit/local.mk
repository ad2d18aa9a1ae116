# src/ratelimit: sources and unit tests of this folder (included by the top Makefile.am)

# --- decision library, HTTP gateway, role (issue #3, limiter engineer) ---
libstripedb_a_SOURCES += src/ratelimit/role.c src/ratelimit/limiter.c src/ratelimit/algo.c \
	src/ratelimit/cache.c src/ratelimit/json.c
noinst_HEADERS += src/ratelimit/limiter.h src/ratelimit/algo.h src/ratelimit/cache.h \
	src/ratelimit/json.h

check_PROGRAMS += tests/unit/test_ratelimit_algo tests/unit/test_ratelimit_limiter \
	tests/unit/test_ratelimit_json
tests_unit_test_ratelimit_algo_SOURCES = tests/unit/test_ratelimit_algo.c
tests_unit_test_ratelimit_algo_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_algo_LDADD = $(UNIT_LDADD)
tests_unit_test_ratelimit_limiter_SOURCES = tests/unit/test_ratelimit_limiter.c
tests_unit_test_ratelimit_limiter_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_limiter_LDADD = $(UNIT_LDADD)
tests_unit_test_ratelimit_json_SOURCES = tests/unit/test_ratelimit_json.c
tests_unit_test_ratelimit_json_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_json_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_ratelimit_algo tests/unit/test_ratelimit_limiter \
	tests/unit/test_ratelimit_json

# benchmark (never in make check): tests/bench/ratelimit_bench.sh drives it
noinst_PROGRAMS += tests/bench/ratelimit_bench
tests_bench_ratelimit_bench_SOURCES = tests/bench/ratelimit_bench.c
tests_bench_ratelimit_bench_LDADD = libstripedb.a $(SDB_LIBS)
EXTRA_DIST += tests/bench/ratelimit_bench.sh tests/bench/ratelimit_grpc_vs_redis.sh tests/bench/ratelimit_wrk.lua \
	tests/bench/ratelimit_token_bucket.lua tests/bench/README.md src/ratelimit/README.md
# --- end limiter engineer block ---

# --- gRPC service and peer cluster (issue #3, cluster engineer) ---
# protoc-c 1.4 cannot generate proto3 `optional`: it reads a copy of gubernator.proto
# with `optional` removed (same wire format; created_at 0 means unset).
RL_PB_GEN = src/ratelimit/gubernator_c.pb-c.c src/ratelimit/gubernator_c.pb-c.h
src/ratelimit/gubernator_c.pb-c.c: src/ratelimit/gubernator.proto
	$(AM_V_GEN)$(MKDIR_P) src/ratelimit && \
	sed -e 's/^\([[:space:]]*\)optional /\1/' $(srcdir)/src/ratelimit/gubernator.proto \
		> src/ratelimit/gubernator_c.proto && \
	$(PROTOC_C) --proto_path=src/ratelimit --c_out=src/ratelimit src/ratelimit/gubernator_c.proto
src/ratelimit/gubernator_c.pb-c.h: src/ratelimit/gubernator_c.pb-c.c
	@if test ! -f $@; then rm -f $<; $(MAKE) $(AM_MAKEFLAGS) $<; else :; fi
BUILT_SOURCES += $(RL_PB_GEN)
nodist_libstripedb_a_SOURCES += $(RL_PB_GEN)
CLEANFILES += $(RL_PB_GEN) src/ratelimit/gubernator_c.proto
EXTRA_DIST += src/ratelimit/gubernator.proto
libstripedb_a_SOURCES += src/ratelimit/ring.c src/ratelimit/proto.c src/ratelimit/peers.c \
	src/ratelimit/cluster.c src/ratelimit/cluster_global.c src/ratelimit/grpc_server.c \
	src/ratelimit/grpc_role.c src/ratelimit/membership.c
noinst_HEADERS += src/ratelimit/ring.h src/ratelimit/proto.h src/ratelimit/peers.h \
	src/ratelimit/cluster.h src/ratelimit/cluster_int.h src/ratelimit/grpc_server.h \
	src/ratelimit/membership.h

check_PROGRAMS += tests/unit/test_ratelimit_ring tests/unit/test_ratelimit_cluster
tests_unit_test_ratelimit_ring_SOURCES = tests/unit/test_ratelimit_ring.c
tests_unit_test_ratelimit_ring_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_ring_LDADD = $(UNIT_LDADD)
tests_unit_test_ratelimit_cluster_SOURCES = tests/unit/test_ratelimit_cluster.c
tests_unit_test_ratelimit_cluster_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ratelimit_cluster_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_ratelimit_ring tests/unit/test_ratelimit_cluster
EXTRA_DIST += tests/integration/test_ratelimit_grpc.py
# gRPC load generator for tests/bench/ratelimit_bench.sh (never in make check)
noinst_PROGRAMS += tests/bench/ratelimit_grpc_bench
tests_bench_ratelimit_grpc_bench_SOURCES = tests/bench/ratelimit_grpc_bench.c
tests_bench_ratelimit_grpc_bench_LDADD = libstripedb.a $(SDB_LIBS)
# libFuzzer target over the gRPC messages a client or peer controls (proto.c, the peer side
# of cluster.c and cluster_global.c, and the limiter compiled in for coverage); built only
# with --enable-fuzzing
EXTRA_DIST += tests/fuzz/corpus/ratelimit_pb
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_ratelimit_pb
tests_fuzz_fuzz_ratelimit_pb_SOURCES = tests/fuzz/fuzz_ratelimit_pb.c src/ratelimit/proto.c \
	src/ratelimit/cluster.c src/ratelimit/cluster_global.c src/ratelimit/limiter.c \
	src/ratelimit/algo.c src/ratelimit/cache.c
nodist_tests_fuzz_fuzz_ratelimit_pb_SOURCES = src/ratelimit/gubernator_c.pb-c.c
tests_fuzz_fuzz_ratelimit_pb_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined
tests_fuzz_fuzz_ratelimit_pb_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined
tests_fuzz_fuzz_ratelimit_pb_LDADD = libstripedb.a $(SDB_LIBS)
endif
# --- end cluster engineer block ---
