# cli: `stripedb ctl` subcommands.
libstripedb_a_SOURCES += cli/ctl.c cli/dev.c cli/metadata.c cli/tenant.c
noinst_HEADERS += cli/cli.h
