# src/metadata: the metadata role (wire commands over the raft/ state machine)
libstripedb_a_SOURCES += src/metadata/role.c src/metadata/peers.c
noinst_HEADERS += src/metadata/peers.h

