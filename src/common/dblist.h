/* The databases of a listDatabases reply (metadata's `listDatabases`: {databases: [{name,
 * tenant?, primary?, ...}]}), read entry by entry, as the auth gate (tenant owners) and the
 * proxy (primary shards) need them. */
#ifndef SDB_COMMON_DBLIST_H
#define SDB_COMMON_DBLIST_H

#include <bson/bson.h>
#include <stdbool.h>

/* A position in a reply's "databases" array. Holds pointers into the reply: use it only
 * while the reply lives and is not modified. */
typedef struct sdb_dblist {
	bson_iter_t arr;
	bool ok; /* false: no array (nothing to iterate) */
} sdb_dblist;

/* Start before the first entry of reply's "databases" array; a reply without it, or with
 * another type there, has no entries. No errors. */
void sdb_dblist_init(sdb_dblist *l, const bson_t *reply);

/* Move to the next entry that is a document (others are skipped). *name and *value get its
 * string fields "name" and `field` (the last one when repeated; NULL when it has none or
 * another type): static views into the reply, never freed. Returns false after the last
 * entry (*name and *value then untouched). No errors. */
bool sdb_dblist_next(sdb_dblist *l, const char *field, const char **name, const char **value);

#endif
