# src/coordinator: the coordinator role (DESIGN.md §2, §6). role.c runs the CDC publishers
# (src/cdc/) and hosts the migration runner; add the Data Movement Platform's files here.
libstripedb_a_SOURCES += src/coordinator/role.c
# the Data Movement Platform (issue #8)
libstripedb_a_SOURCES += src/coordinator/migrate.c src/coordinator/migrate_record.c \
	src/coordinator/migrate_shard.c src/coordinator/migrate_import.c \
	src/coordinator/migrate_replicate.c src/coordinator/migrate_verify.c \
	src/coordinator/migrate_switch.c src/coordinator/migrate_cleanup.c src/coordinator/migrate_sm.c \
	src/coordinator/migrate_sess.c src/coordinator/migrate_hashes.c src/coordinator/filtering.c \
	src/coordinator/reconcile.c cli/migrate.c \
	cli/migrate_plan.c
noinst_HEADERS += src/coordinator/migrate.h src/coordinator/migrate_int.h src/coordinator/migrate_sess.h src/coordinator/migrate_hashes.h src/coordinator/filtering.h \
	src/coordinator/reconcile.h
check_PROGRAMS += tests/unit/test_coordinator_migrate
tests_unit_test_coordinator_migrate_SOURCES = tests/unit/test_coordinator_migrate.c
tests_unit_test_coordinator_migrate_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_coordinator_migrate_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_coordinator_migrate
check_PROGRAMS += tests/unit/test_coordinator_hashes
tests_unit_test_coordinator_hashes_SOURCES = tests/unit/test_coordinator_hashes.c
tests_unit_test_coordinator_hashes_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_coordinator_hashes_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_coordinator_hashes
EXTRA_DIST += tests/integration/test_migration.py tests/integration/test_migration_faults.py \
	tests/integration/migration_helpers.py tests/integration/checker.py \
	tests/bench/migration_bench.py tests/integration/test_retryable_migration.py \
	tests/integration/test_migration_chunk_range.py tests/integration/test_migration_plan.py \
	tests/integration/test_migration_verify.py \
	src/coordinator/README.md
