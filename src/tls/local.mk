# src/tls: TLS of the roles' listeners (OpenSSL over memory BIOs), below wire (issue #24).
libstripedb_a_SOURCES += src/tls/tls.c
noinst_HEADERS += src/tls/tls.h

EXTRA_DIST += src/tls/README.md
