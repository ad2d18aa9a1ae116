# src/metadata: the metadata role (wire commands over the raft/ state machine), the
# migration state table it shares with the coordinator and ctl, and rate-limit peer membership
libstripedb_a_SOURCES += src/metadata/role.c src/metadata/peers.c
noinst_HEADERS += src/metadata/peers.h
