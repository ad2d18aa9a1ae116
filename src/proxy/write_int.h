/* Helpers shared by the proxy's write files (write.c: insert, update, delete;
 * findandmodify.c: findAndModify). Both block on shards: worker threads only. */
#ifndef SDB_PROXY_WRITE_INT_H
#define SDB_PROXY_WRITE_INT_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/exec.h"

/* A pipeline-style update (holder's `field` is an array of stages) of a sharded collection,
 * or any update whose holder carries a non-simple collation (px_holder_collated): whether
 * it changes the shard key cannot be told here, as route_update_changes_key tells it by
 * bytes for operators and replacements, so the shard is asked to check the new document:
 * appends $stripedbShardKey (the key paths but _id, which the shard keeps immutable anyway)
 * to cmd. Appends nothing when rc is NULL or unsharded, or neither holds. No errors. */
/* Whether holder (an update statement, a findAndModify) carries a `collation` that is not
 * simple: its filter's string equalities do not pin shard key bytes. */
bool px_holder_collated(const bson_t *holder);
void px_append_key_check(const route_coll *rc, const bson_t *holder, const char *field,
			 bson_t *cmd);

/* A retryable single-document write without an exact shard key runs where its collect
 * phase finds a document, which may differ between an attempt and its retry: ask each
 * shard owning a chunk selected in sel (rc->nchunks flags) whether it already executed
 * statement idx of c's session (issue #16; stripedbStmtResult).
 * Returns: 1: executed there, *res (initialised by the caller) gets its recorded result;
 * 0: nowhere; -1: a shard did not answer or refused (unknown: the caller fails the statement
 * with a retryable error): *err_reply (initialised by the caller) gets the shard's reply and
 * nerr (nelen bytes) the network error, if any. The caller destroys res and err_reply. */
int px_probe_executed(ctx *c, route_coll *rc, const bool *sel, int64_t idx, bson_t *res,
		      bson_t *err_reply, char *nerr, size_t nelen);

#endif
