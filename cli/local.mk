# cli: `stripedb ctl` subcommands.
libstripedb_a_SOURCES += cli/ctl.c
noinst_HEADERS += cli/cli.h
