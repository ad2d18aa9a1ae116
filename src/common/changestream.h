/* Change streams (issue #20): the resume token shared by shards and proxies.
 *
 * A resume token is MongoDB's shape `{_data: "<uppercase hex>"}`; its bytes are ours (the
 * contract between shard and proxy, /work/cs/CONTRACT.md), not MongoDB's KeyString:
 *
 *   offset  size  field
 *   0       1     version, always 1
 *   1       8     ts: the oplog timestamp, seconds << 32 | increment, big-endian
 *   9       1     kind: SDB_CS_EVENT 0, SDB_CS_INVALIDATE 1, SDB_CS_HWM 2
 *   10      1     n: length of the shard id (0..64; 0 for HWM tokens)
 *   11      n     shard id bytes (the shard whose oplog holds the entry)
 *   11+n    4     idx: position of the event inside its oplog entry (a transaction's ops), BE
 *
 * so a token is 15..79 bytes, 30..158 hex digits. Tokens compare by sdb_cs_token_cmp (not by
 * their hex): ts; then, at equal ts, events and invalidates before the high-water mark; then
 * shard id bytewise, idx, kind. A high-water mark HWM(T) says "every event with ts <= T has
 * been delivered"; resuming after a token X on any shard delivers that shard's events whose
 * token is greater than X (MongoDB: resume_token.cpp, document_source_change_stream*.cpp).
 */
#ifndef SDB_COMMON_CHANGESTREAM_H
#define SDB_COMMON_CHANGESTREAM_H

#include <bson/bson.h>
#include <stddef.h>
#include <stdint.h>

enum { SDB_CS_EVENT = 0, SDB_CS_INVALIDATE = 1, SDB_CS_HWM = 2 };

/* Longest shard id a token carries (bytes, without the NUL). */
#define SDB_CS_SHARD_MAX 64

/* One decoded resume token. */
typedef struct {
	uint64_t ts;	/* oplog ts, secs << 32 | inc */
	uint8_t kind;	/* SDB_CS_EVENT, SDB_CS_INVALIDATE (startAfter only), SDB_CS_HWM */
	char shard[65]; /* id of the shard whose oplog holds the entry ("" for HWM tokens) */
	uint32_t idx;	/* position of the event inside its oplog entry (a transaction's
			   ops, an applyOps), 0 otherwise */
} sdb_cs_token;

/* Append `name: {_data: "<uppercase hex>"}` to out (MongoDB's token shape). A shard id
 * longer than SDB_CS_SHARD_MAX bytes is cut there (ids are short: shard ids are checked at
 * `shard add`). No errors. */
void sdb_cs_token_append(bson_t *out, const char *name, const sdb_cs_token *t);

/* Fill t from a token document {_data: "..."} (other fields, e.g. a MongoDB `_typeBits`,
 * are ignored). Errors: SDB_EINVAL with the message in err; use sdb_cs_token_parse_code for
 * the wire code. */
int sdb_cs_token_parse(const bson_t *doc, sdb_cs_token *t, char *err, size_t errlen);

/* As sdb_cs_token_parse, also giving the MongoDB error code of a rejection in *code (may be
 * NULL): 40647 when _data is missing or not a string, 9 FailedToParse when it is not hex or
 * does not decode as a token of ours (MongoDB's codes for the same faults, resume_token.cpp).
 * Errors: SDB_EINVAL. */
int sdb_cs_token_parse_code(const bson_t *doc, sdb_cs_token *t, int *code, char *err,
			    size_t errlen);

/* Total order on tokens (see the header comment); <0, 0, >0 as strcmp. Returns: the sign. */
int sdb_cs_token_cmp(const sdb_cs_token *a, const sdb_cs_token *b);

/* The check mongod makes on each event after the stages that follow $changeStream: the
 * output's `_id` (the resume token) must be the event's, byte for byte. Returns: 0 when it
 * is; SDB_EINVAL with mongod's ChangeStreamFatalError (280) message in err otherwise
 * (the caller answers 280). */
int sdb_cs_check_id(const bson_t *event, const bson_t *out, char *err, size_t errlen);

#endif
