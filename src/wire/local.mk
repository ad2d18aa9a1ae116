# src/wire: the MongoDB wire protocol server shared by the shard, proxy and metadata roles.
libstripedb_a_SOURCES += \
	src/wire/codes.c \
	src/wire/commands.c \
	src/wire/currentop.c \
	src/wire/failpoint.c \
	src/wire/msg.c \
	src/wire/reply.c \
	src/wire/request.c \
	src/wire/server.c \
	src/wire/tls_io.c
noinst_HEADERS += \
	src/wire/internal.h \
	src/wire/msg.h \
	src/wire/server.h \
	src/wire/topology.h

check_PROGRAMS += tests/unit/test_wire_msg tests/unit/test_wire_server
TESTS += tests/unit/test_wire_msg tests/unit/test_wire_server
tests_unit_test_wire_msg_SOURCES = tests/unit/test_wire_msg.c
tests_unit_test_wire_msg_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_wire_msg_LDADD = $(UNIT_LDADD)
tests_unit_test_wire_server_SOURCES = tests/unit/test_wire_server.c
tests_unit_test_wire_server_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_wire_server_LDADD = $(UNIT_LDADD)

# A stand-alone wire server (shared commands only) for tests/integration/test_wire.py while
# no role serves the wire protocol yet; built by `make check`, not installed, not a test.
check_PROGRAMS += tests/integration/wire_test_server
tests_integration_wire_test_server_SOURCES = tests/integration/wire_test_server.c
tests_integration_wire_test_server_LDADD = libstripedb.a $(SDB_LIBS)
EXTRA_DIST += tests/integration/test_wire.py tests/integration/package.json tests/integration/README.md \
	tests/integration/package-lock.json

