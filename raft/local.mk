# raft: the metadata service's Raft integration (SQLite state machine, node setup) and
# its unit tests (included by the top Makefile.am)
libstripedb_a_SOURCES += raft/fsm.c raft/fsm_query.c raft/fsm_routing.c raft/fsm_migration.c raft/fsm_auth.c raft/migstate.c raft/fsm_peers.c raft/node.c raft/handshake.c raft/msgcheck.c raft/transport.c \
	raft/routing.c
noinst_HEADERS += raft/fsm.h raft/fsm_int.h raft/migstate.h raft/fsm_peers.h raft/node.h raft/handshake.h raft/msgcheck.h raft/transport.h \
	raft/routing.h
EXTRA_DIST += raft/README.md

check_PROGRAMS += tests/unit/test_raft_fsm tests/unit/test_raft_cluster tests/unit/test_raft_node \
	tests/unit/test_raft_routing
TESTS += tests/unit/test_raft_fsm tests/unit/test_raft_cluster tests/unit/test_raft_node \
	tests/unit/test_raft_routing
# issue #23: rate-limit peer membership (raft/fsm_peers.c)
check_PROGRAMS += tests/unit/test_raft_fsm_peers
TESTS += tests/unit/test_raft_fsm_peers
tests_unit_test_raft_fsm_peers_SOURCES = tests/unit/test_raft_fsm_peers.c
tests_unit_test_raft_fsm_peers_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_fsm_peers_LDADD = $(UNIT_LDADD)
tests_unit_test_raft_fsm_SOURCES = tests/unit/test_raft_fsm.c
tests_unit_test_raft_fsm_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_fsm_LDADD = $(UNIT_LDADD)
# issue #26: metadata diffs and cursors, and the proxy's cache applying them
tests_unit_test_raft_routing_SOURCES = tests/unit/test_raft_routing.c
tests_unit_test_raft_routing_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_routing_LDADD = $(UNIT_LDADD)
tests_unit_test_raft_cluster_SOURCES = tests/unit/test_raft_cluster.c
tests_unit_test_raft_cluster_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_cluster_LDADD = $(UNIT_LDADD)
# like every unit test it #includes its module (raft/node.c), here to swap the wrapped append
tests_unit_test_raft_node_SOURCES = tests/unit/test_raft_node.c
tests_unit_test_raft_node_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_node_LDADD = $(UNIT_LDADD)

# the metadata service's integration tests, linearizability checker and benchmark
EXTRA_DIST += src/metadata/README.md tests/integration/metadata_cluster.py \
	tests/integration/test_metadata.py tests/integration/linearizability.py \
	tests/integration/test_metadata_linearizability.py tests/integration/test_metadata_ctl.py \
	tests/integration/test_metadata_key_order.py \
	tests/bench/metadata_bench.py tests/integration/test_raft_security.py \
	tests/integration/test_routing_scale.py tests/bench/routing_bench.py

# libFuzzer target over the state machine (commands, queries and raw entries); built only
# with `CC=clang ./configure --enable-fuzzing`. fsm.c is compiled into the target for
# coverage.
EXTRA_DIST += tests/fuzz/corpus/raft_fsm
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_raft_fsm
tests_fuzz_fuzz_raft_fsm_SOURCES = tests/fuzz/fuzz_raft_fsm.c raft/fsm.c raft/routing.c
tests_fuzz_fuzz_raft_fsm_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_fsm_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_fsm_LDADD = libstripedb.a $(SDB_LIBS)
endif

# the Raft transport (issue #21): handshake codec and the transport on a real loop
check_PROGRAMS += tests/unit/test_raft_transport
TESTS += tests/unit/test_raft_transport
tests_unit_test_raft_transport_SOURCES = tests/unit/test_raft_transport.c
tests_unit_test_raft_transport_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_raft_transport_LDADD = $(UNIT_LDADD)

# benchmark of the transport itself (never in make check): tests/bench/README.md
noinst_PROGRAMS += tests/bench/raft_transport_bench
tests_bench_raft_transport_bench_SOURCES = tests/bench/raft_transport_bench.c
tests_bench_raft_transport_bench_LDADD = libstripedb.a $(SDB_LIBS)
