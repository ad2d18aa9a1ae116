# src/metadata: the metadata role (wire commands over the raft/ state machine) and the
# migration state table it shares with the coordinator and ctl
libstripedb_a_SOURCES += src/metadata/role.c src/metadata/migstate.c
noinst_HEADERS += src/metadata/migstate.h
