# cli: `stripedb ctl` subcommands.
libstripedb_a_SOURCES += cli/ctl.c cli/dev.c cli/metadata.c cli/tenant.c cli/cluster.c cli/cluster_ssh.c cli/cluster_spec.c cli/cluster_agent.c cli/ratelimit.c \
	cli/shardset.c cli/catalog.c
noinst_HEADERS += cli/cli.h cli/shardset.h cli/cluster_int.h cli/migrate_int.h
EXTRA_DIST += tests/integration/test_multihost.py docs/operations.md

check_PROGRAMS += tests/unit/test_cli_args
tests_unit_test_cli_args_SOURCES = tests/unit/test_cli_args.c
tests_unit_test_cli_args_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_cli_args_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_cli_args

check_PROGRAMS += tests/unit/test_cli_plan
tests_unit_test_cli_plan_SOURCES = tests/unit/test_cli_plan.c
tests_unit_test_cli_plan_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_cli_plan_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_cli_plan
