# src/auth: authentication (SCRAM), authorization (tenant policies), audit (issue #10).
libstripedb_a_SOURCES += src/auth/scram.c src/auth/policy.c src/auth/audit.c src/auth/gate.c \
	src/auth/cluster.c src/auth/raftsec.c
noinst_HEADERS += src/auth/scram.h src/auth/policy.h src/auth/audit.h src/auth/gate.h \
	src/auth/cluster.h src/auth/raftsec.h

check_PROGRAMS += tests/unit/test_auth_scram tests/unit/test_auth_policy \
	tests/unit/test_auth_cluster
TESTS += tests/unit/test_auth_scram tests/unit/test_auth_policy tests/unit/test_auth_cluster
tests_unit_test_auth_cluster_SOURCES = tests/unit/test_auth_cluster.c
tests_unit_test_auth_cluster_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_auth_cluster_LDADD = $(UNIT_LDADD)
tests_unit_test_auth_scram_SOURCES = tests/unit/test_auth_scram.c
tests_unit_test_auth_scram_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_auth_scram_LDADD = $(UNIT_LDADD)
tests_unit_test_auth_policy_SOURCES = tests/unit/test_auth_policy.c
tests_unit_test_auth_policy_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_auth_policy_LDADD = $(UNIT_LDADD)

EXTRA_DIST += src/auth/README.md tests/integration/test_security.py \
	tests/integration/test_security_cluster.py tests/integration/test_security_ctl.py \
	tests/integration/test_security_tls.py tests/integration/security_node.js \
	tests/integration/security_mongoc_client.c
