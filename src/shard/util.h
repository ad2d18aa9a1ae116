/* Small helpers of the shard's command files: typed command fields with MongoDB's error
 * messages, and arrays of documents. */
#ifndef SDB_SHARD_UTIL_H
#define SDB_SHARD_UTIL_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "shard/shard.h"

/* A copy of the document at it into *out, which must be initialised (its old content is
 * destroyed). Replies TypeMismatch
 * 14 ("BSON field 'CMD.F' is the wrong type 'T', expected type 'object'") and returns
 * false otherwise. */
bool util_get_doc(shard_ctx *x, const char *cmd, const bson_iter_t *it, bson_t *out);
/* A whole number (int32, int64 or integral double) in [lo, hi] at it, by the rules of
 * common/bsonget.h (sdb_bson_get_int64, field named "CMD.F"). Replies its error (14, 9,
 * 51024 below lo, 2 above hi) and returns false otherwise. */
bool util_get_int(shard_ctx *x, const char *cmd, const bson_iter_t *it, int64_t lo, int64_t hi,
		  int64_t *out);
/* MongoDB's name of a BSON type ("object", "string", ...). */
const char *util_type_name(bson_type_t t);

/* A version token from a command field: an int32, an int64, or a double that is finite,
 * integral and within int64 (|v| < 2^63). Anything else (NaN, inf, 1.5, 1e300, strings)
 * returns false, so a fencing token can never be rounded or wrapped (an infinite token once
 * became INT64_MIN and disabled the gate). sdb_bson_as_int64 of common/bsonget.h. */
bool util_token(const bson_iter_t *it, int64_t *out);

/* A static view in *out of the document or array at it (the caller has checked that it holds
 * one); it borrows its bytes, so there is nothing to free. False when those bytes are not
 * a BSON document (bson_init_static), *out then unusable. */
bool util_iter_bson(const bson_iter_t *it, bson_t *out);
/* Replace *out (initialised; its old content is destroyed) with a copy of the document or
 * array at it, as util_iter_bson reads it. False, *out unchanged, when that fails. */
bool util_iter_copy(const bson_iter_t *it, bson_t *out);

/* The top-level field name of cmd: bson_iter_init_find(it, cmd, name), answered from
 * req's index of its command's keys (wire_req_cmd_find) when cmd is that command, so the
 * lookup does not walk it; req may be NULL. Returns whether the field is there. */
bool util_cmd_find(const wire_req *req, const bson_t *cmd, const char *name, bson_iter_t *it);
/* util_cmd_find of x's command (x->cmd, x->req). */
bool util_ctx_find(const shard_ctx *x, const char *name, bson_iter_t *it);

/* Arrays of heap documents (bson_new/bson_copy). */
void util_docs_push(bson_t ***docs, size_t *n, size_t *cap, bson_t *d);
void util_docs_free(bson_t **docs, size_t n);

#endif
