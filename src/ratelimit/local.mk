# src/ratelimit: sources and unit tests of this folder (included by the top Makefile.am)
libstripedb_a_SOURCES += src/ratelimit/role.c
