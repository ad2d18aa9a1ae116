/* MongoDB's default index name for a key pattern (src/mongo/db/catalog/index_key_validate
 * and the drivers' index-name rule): each field and its value joined by '_', fields joined
 * by '_': {a: 1} -> "a_1", {a: 1, b: -1} -> "a_1_b_-1", {k: "hashed"} -> "k_hashed". */
#ifndef SDB_COMMON_INDEXNAME_H
#define SDB_COMMON_INDEXNAME_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

/* Write the default name of key (a key pattern: numbers or strings) into out (NUL-terminated,
 * truncated to outlen - 1 bytes). Returns: the length the whole name needs (>= outlen:
 * truncated, as snprintf). */
size_t sdb_index_default_name(const bson_t *key, char *out, size_t outlen);

/* Append to out (an empty command document) MongoDB's createIndexes of one index on coll:
 * {createIndexes: coll, indexes: [{key, name: the default name, unique: true when unique}]}.
 * The key {_id: 1} is named "_id_", the index every collection has (a shard answers that
 * it exists; under another name it is 85 IndexOptionsConflict: shardCollection {_id: 1} of
 * a new collection failed so). */
void sdb_index_create_cmd(bson_t *out, const char *coll, const bson_t *key, bool unique);

#endif
