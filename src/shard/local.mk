# src/shard: sources and unit tests of this folder (included by the top Makefile.am)
libstripedb_a_SOURCES += src/shard/role.c
