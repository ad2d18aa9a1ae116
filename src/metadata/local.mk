# src/metadata: the metadata role (wire commands over the raft/ state machine)
libstripedb_a_SOURCES += src/metadata/role.c

