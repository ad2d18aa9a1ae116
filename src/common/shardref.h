/* The shards of a listShards reply (metadata's `listShards`: {shards: [{id, uri, ...}]}), as
 * the coordinator and `stripedb ctl` need them: id and connection string. */
#ifndef SDB_COMMON_SHARDREF_H
#define SDB_COMMON_SHARDREF_H

#include <bson/bson.h>
#include <stddef.h>

/* One registered shard: its id and its URI (a replica-set URI or "H:P"); heap strings. */
typedef struct sdb_shard_ref {
	char *id, *uri;
} sdb_shard_ref;

/* Read reply's "shards" array into *out (heap array of *n entries, NULL/0 when none);
 * entries without a string id and uri are skipped. Free with sdb_shard_refs_free. */
void sdb_shard_refs_parse(const bson_t *reply, sdb_shard_ref **out, size_t *n);

/* Free the n entries of s and s itself (NULL is fine). */
void sdb_shard_refs_free(sdb_shard_ref *s, size_t n);

#endif
