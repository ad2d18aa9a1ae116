# tests/fuzz: libFuzzer targets, built only with `CC=clang ./configure --enable-fuzzing`.
# Build one with `make tests/fuzz/fuzz_wire_msg`, run it with `tests/fuzz/run.sh SECONDS`.
EXTRA_DIST += tests/fuzz/run.sh tests/fuzz/corpus/wire
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_wire_msg
# The codec is compiled into the target itself so that it carries the fuzzer's coverage
# instrumentation (libstripedb.a is built without it).
tests_fuzz_fuzz_wire_msg_SOURCES = tests/fuzz/fuzz_wire_msg.c src/wire/msg.c src/wire/codes.c
tests_fuzz_fuzz_wire_msg_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_wire_msg_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_wire_msg_LDADD = libstripedb.a $(SDB_LIBS)
endif

# The shard's query core (matcher, projection, sort spec, paths, key encoding).
EXTRA_DIST += tests/fuzz/corpus/storage_query
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_storage_query
tests_fuzz_fuzz_storage_query_SOURCES = tests/fuzz/fuzz_storage_query.c src/common/bsonval.c \
	storage/keyenc.c storage/matcher.c storage/bounds.c storage/path.c storage/projection.c storage/sortspec.c \
	storage/pipeline_expr.c storage/docbuild.c
tests_fuzz_fuzz_storage_query_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_storage_query_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_storage_query_LDADD = libstripedb.a $(SDB_LIBS)
endif

# Authentication (issue #10): the SCRAM conversation parser, and the authorization evaluator
# with the proxy gate's command classification.
EXTRA_DIST += tests/fuzz/corpus/sasl tests/fuzz/corpus/policy
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_sasl tests/fuzz/fuzz_policy
tests_fuzz_fuzz_sasl_SOURCES = tests/fuzz/fuzz_sasl.c src/auth/scram.c
tests_fuzz_fuzz_sasl_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_sasl_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_sasl_LDADD = libstripedb.a $(SDB_LIBS)
tests_fuzz_fuzz_policy_SOURCES = tests/fuzz/fuzz_policy.c src/auth/policy.c src/auth/gate.c
tests_fuzz_fuzz_policy_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_policy_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_policy_LDADD = libstripedb.a $(SDB_LIBS)
endif

# The Raft transport's handshake decoder (issue #21): hello, key proof, libraft preamble.
EXTRA_DIST += tests/fuzz/corpus/raft_handshake
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_raft_handshake
tests_fuzz_fuzz_raft_handshake_SOURCES = tests/fuzz/fuzz_raft_handshake.c raft/handshake.c
tests_fuzz_fuzz_raft_handshake_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_handshake_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_handshake_LDADD = libstripedb.a $(SDB_LIBS)
endif

# The update engine (operator updates, replacements, pipeline-style updates over the
# aggregation expression engine).
EXTRA_DIST += tests/fuzz/corpus/storage_update
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_storage_update
tests_fuzz_fuzz_storage_update_SOURCES = tests/fuzz/fuzz_storage_update.c storage/update.c \
	storage/update_apply.c storage/update_pipeline.c storage/docbuild.c storage/pipeline.c \
	storage/pipeline_expr.c storage/docdiff.c
tests_fuzz_fuzz_storage_update_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_storage_update_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_storage_update_LDADD = libstripedb.a $(SDB_LIBS)
endif

# The validator of libraft's message stream on accepted Raft connections (raft/msgcheck.h).
if FUZZING
noinst_PROGRAMS += tests/fuzz/fuzz_raft_msgcheck
tests_fuzz_fuzz_raft_msgcheck_SOURCES = tests/fuzz/fuzz_raft_msgcheck.c raft/msgcheck.c
tests_fuzz_fuzz_raft_msgcheck_CFLAGS = $(AM_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_msgcheck_LDFLAGS = $(AM_LDFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
tests_fuzz_fuzz_raft_msgcheck_LDADD = libstripedb.a $(SDB_LIBS)
endif
