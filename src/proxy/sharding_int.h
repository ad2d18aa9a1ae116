/* Helpers shared by the proxy's sharding administration files (sharding.c: databases,
 * collections, shards, balancer; chunks.c: split, moves, merges, removeShard drains). */
#ifndef SDB_PROXY_SHARDING_INT_H
#define SDB_PROXY_SHARDING_INT_H

#include <bson/bson.h>
#include <stdbool.h>

#include "proxy/exec.h"

/* MongoDB's refusal of a mongos admin command sent to another database than admin:
 * Unauthorized (13) answered on c, false; true when c->db is admin. */
bool px_need_admin_db(ctx *c, const char *name);
/* Run cmd on metadata. On failure answers c (the metadata error code, or HostUnreachable
 * when metadata is unreachable) and returns false, unless the code is in ok_codes
 * (0-terminated, may be NULL): then *code_out (may be NULL) gets it and true is returned with
 * reply initialised. On success reply is initialised (the caller destroys it). */
bool px_sharding_meta_call(ctx *c, const bson_t *cmd, bson_t *reply, const int *ok_codes,
			   int *code_out);
/* The command's first value when it is a string (the namespace or shard id), else NULL. */
const char *px_first_utf8(const bson_t *cmd);
/* The document it holds into out (a static view); false when it holds another type. */
bool px_doc_of(const bson_iter_t *it, bson_t *out);

#endif
