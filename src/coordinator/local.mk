# src/coordinator: the coordinator role (DESIGN.md §2, §6). role.c runs the CDC publishers
# (src/cdc/) and hosts the migration runner; add the Data Movement Platform's files here.
libstripedb_a_SOURCES += src/coordinator/role.c
