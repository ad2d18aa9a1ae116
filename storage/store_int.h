/* Internals of the store shared with its other files (storage/session.c): not for use
 * outside storage/. Each takes a connection inside a transaction opened with
 * sdb_store_begin unless said. */
#ifndef SDB_STORAGE_STORE_INT_H
#define SDB_STORAGE_STORE_INT_H

#include <sqlite3.h>

#include "storage/store.h"

/* A prepared statement from c's cache, reset and unbound (owned by the cache: never
 * finalize it). NULL with a message on error. */
sqlite3_stmt *sdb_store_int_stmt(sdb_store_conn *c, const char *sql, char *err, size_t errlen);
/* Step s to its end and reset it; 0 or SDB_EIO with a message naming what. */
int sdb_store_int_step_done(sdb_store_conn *c, sqlite3_stmt *s, char *err, size_t errlen,
			    const char *what);
/* SDB_EIO with SQLite's message for c, prefixed by what. */
int sdb_store_int_sqlerr(sdb_store_conn *c, char *err, size_t errlen, const char *what);
/* The store's injectable wall clock, epoch ms. */
int64_t sdb_store_int_now_ms(sdb_store_conn *c);
/* The session record timeout in force, ms. */
int64_t sdb_store_int_session_timeout_ms(sdb_store_conn *c);
/* The time of the next expired-session sweep (epoch ms); read and write it only inside a
 * write transaction (serialized by the store's write lock). */
int64_t *sdb_store_int_sweep_mark(sdb_store_conn *c);
/* True inside a write transaction. */
bool sdb_store_int_in_write(const sdb_store_conn *c);

#endif
