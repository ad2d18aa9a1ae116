/* Helpers shared by the proxy's sharding administration files (sharding.c: databases,
 * collections, shards, balancer; chunks.c: split, moves, merges, removeShard drains) and the
 * read-only config database (configdb.c). */
#ifndef SDB_PROXY_SHARDING_INT_H
#define SDB_PROXY_SHARDING_INT_H

#include <bson/bson.h>
#include <stdbool.h>

#include "proxy/exec.h"

/* MongoDB's refusal of a mongos admin command sent to another database than admin.
 * Returns: 0 when c->db is admin, else Unauthorized (13) answered on c. */
int px_need_admin_db(ctx *c, const char *name);
/* Run cmd on metadata. Returns: 0 with reply initialised (the caller destroys it) on
 * success, or when the metadata error's code is in ok_codes (0-terminated, may be NULL):
 * then *code_out (may be NULL) gets that code; else the code answered on c (the metadata
 * error's, or HostUnreachable 6 when metadata is unreachable), reply not initialised. */
int px_sharding_meta_call(ctx *c, const bson_t *cmd, bson_t *reply, const int *ok_codes,
			   int *code_out);
/* The command's first value when it is a string (the namespace or shard id), else NULL. */
const char *px_first_utf8(const bson_t *cmd);
/* The document it holds into out (a static view); false when it holds another type. */
bool px_doc_of(const bson_iter_t *it, bson_t *out);
/* The string field name of d (a view into d), or NULL when absent or of another type. */
const char *px_str_of(const bson_t *d, const char *name);
/* fn(doc, arg) for each document element of the array field name of d, in order (other
 * elements skipped; nothing when d has no such array). doc is a static view into d. */
void px_each_doc(const bson_t *d, const char *name, void (*fn)(const bson_t *doc, void *arg),
		 void *arg);
/* fn(chunk, arg) for every chunk of every collection metadata holds (getRoutingTable "all",
 * batch by batch; a chunk is {id, ns, min, max, shard, ...}). Blocks on metadata. Returns: 0,
 * or the code answered on c as px_sharding_meta_call does (fn may have seen the batches
 * before). */
int px_each_routing_chunk(ctx *c, void (*fn)(const bson_t *chunk, void *arg), void *arg);

#endif
