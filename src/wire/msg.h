/* MongoDB wire protocol message codec: pure functions, no I/O, no allocation while parsing.
 *
 * Spec: https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/ and
 * https://github.com/mongodb/specifications/blob/master/source/message/OP_MSG.md
 * Every integer on the wire is little-endian.
 *
 * Standard message header (16 bytes), then the op-specific body:
 *   int32 messageLength   total bytes including this header, 16 .. WIRE_MAX_MESSAGE_SIZE
 *   int32 requestID
 *   int32 responseTo
 *   int32 opCode          WIRE_OP_*
 *
 * OP_MSG (2013):
 *   uint32 flagBits       bit 0 checksumPresent, bit 1 moreToCome, bit 16 exhaustAllowed;
 *                         any other bit in 0..15 is required-to-understand -> error;
 *                         bits 17..31 are optional and ignored
 *   sections[]            kind 0: uint8 0, document (the body; exactly one per message)
 *                         kind 1: uint8 1, int32 size (includes itself), cstring identifier,
 *                                 zero or more documents filling the rest of size
 *   [uint32 checksum]     CRC-32C (Castagnoli) of every preceding byte of the message,
 *                         present iff checksumPresent; this codec VERIFIES it
 *
 * OP_QUERY (2004, legacy): a command on <db>.$cmd (drivers' first hello), or a query on a
 *   collection "<db>.<coll>" (drivers before OP_MSG, and pymongo 3.x for exhaust cursors),
 *   run as the find command mongod 3.2 .. 5.0 ran for it (wire_msg_legacy_find):
 *   int32 flags, cstring fullCollectionName, int32 numberToSkip, int32 numberToReturn,
 *   document query, [document returnFieldsSelector]
 *   flags: bit 1 tailable, 2 slaveOk, 3 oplogReplay, 4 noCursorTimeout, 5 awaitData,
 *   6 exhaust, 7 partial (WIRE_QUERY_FLAG_*)
 *
 * OP_GET_MORE (2005, legacy; pymongo 3.x find_raw_batches): int32 ZERO, cstring
 *   fullCollectionName "<db>.<coll>", int32 numberToReturn, int64 cursorID. Run as the
 *   getMore command (wire_msg_legacy_get_more_cmd), answered with an OP_REPLY; an unknown
 *   cursor is answered with responseFlags CursorNotFound (bit 0) and no document.
 *
 * OP_COMPRESSED (2012): int32 originalOpcode, int32 uncompressedSize, uint8 compressorId,
 *   compressed bytes. Parsed (header fields only) so the server can refuse it clearly:
 *   stripedb never offers compression in hello.
 *
 * OP_REPLY (1, encoded only): int32 responseFlags, int64 cursorID, int32 startingFrom,
 *   int32 numberReturned, documents. A failed query is ONE document
 *   {$err: <string>, code: <int>, ok: 0, ...} with responseFlags QueryFailure (bit 1), as
 *   mongod's generateLegacyQueryErrorResponse sends: legacy drivers read `$err` (pymongo
 *   3.x raises KeyError without it).
 *
 * Exhaust (OP_QUERY flag bit 6): after each OP_REPLY whose cursorID is not 0 the server
 * runs the next getMore by itself and sends its OP_REPLY with responseTo = the requestID
 * of the previous reply, until a reply carries cursorID 0 or an error (mongod 3.x/4.x).
 */
#ifndef SDB_WIRE_MSG_H
#define SDB_WIRE_MSG_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/server.h"

#define WIRE_OP_REPLY 1
#define WIRE_OP_QUERY 2004
#define WIRE_OP_GET_MORE 2005
#define WIRE_OP_COMPRESSED 2012
#define WIRE_OP_MSG 2013

#define WIRE_MSG_HEADER_LEN 16

#define WIRE_MSG_FLAG_CHECKSUM_PRESENT (1u << 0)
#define WIRE_MSG_FLAG_MORE_TO_COME (1u << 1)
#define WIRE_MSG_FLAG_EXHAUST_ALLOWED (1u << 16)
/* Bits 0..15 the peer requires us to understand. */
#define WIRE_MSG_FLAG_REQUIRED_MASK 0xffffu

/* OP_QUERY flags bits. */
#define WIRE_QUERY_FLAG_TAILABLE (1 << 1)
#define WIRE_QUERY_FLAG_SLAVE_OK (1 << 2)
#define WIRE_QUERY_FLAG_NO_CURSOR_TIMEOUT (1 << 4)
#define WIRE_QUERY_FLAG_AWAIT_DATA (1 << 5)
#define WIRE_QUERY_FLAG_EXHAUST (1 << 6)
#define WIRE_QUERY_FLAG_PARTIAL (1 << 7)

/* OP_REPLY responseFlags bits. */
#define WIRE_REPLY_FLAG_CURSOR_NOT_FOUND (1 << 0)
#define WIRE_REPLY_FLAG_QUERY_FAILURE (1 << 1)
#define WIRE_REPLY_FLAG_AWAIT_CAPABLE (1 << 3)

/* At most this many kind-1 sections per OP_MSG (commands use one or two: insert's
 * `documents`, bulkWrite's `ops` and `nsInfo`). More is refused as a protocol error. */
#define WIRE_MSG_MAX_SEQS 16

/* MongoDB error codes the codec reports that server.h does not (yet) define. */
#ifndef WIRE_ERR_PROTOCOL_ERROR
#define WIRE_ERR_PROTOCOL_ERROR 17 /* ProtocolError */
#endif
#ifndef WIRE_ERR_INVALID_BSON
#define WIRE_ERR_INVALID_BSON 22 /* InvalidBSON */
#endif
/* mongod's assertion ids (op_msg.cpp), no ErrorCodes name: codeName "Location<code>" */
#define WIRE_ERR_DUPLICATE_DOC_SEQUENCE 40431  /* two document sequences of one name */
#define WIRE_ERR_DUPLICATE_BODY_SEQUENCE 40433 /* a sequence named as a body field */

typedef struct wire_msg_header {
	int32_t message_length;
	int32_t request_id;
	int32_t response_to;
	int32_t op_code;
} wire_msg_header;

/* One kind-1 section: `n_docs` BSON documents laid end to end in docs[0 .. docs_len). */
typedef struct wire_msg_seq {
	const char *identifier; /* NUL-terminated, points into the message buffer */
	const uint8_t *docs;
	size_t docs_len;
	size_t n_docs;
} wire_msg_seq;

/* A parsed message. Every pointer and every bson_t points INTO the buffer given to
 * wire_msg_parse (bson_init_static): the buffer must outlive the wire_msg. Nothing to free. */
typedef struct wire_msg {
	wire_msg_header hdr;
	/* OP_MSG */
	uint32_t flags;
	bool checksum_present;
	bool more_to_come;
	bool exhaust_allowed;
	bson_t body;      /* kind 0 section; for OP_QUERY: the query document */
	size_t n_seqs;
	wire_msg_seq seqs[WIRE_MSG_MAX_SEQS];
	/* OP_QUERY */
	int32_t query_flags;
	const char *full_collection_name; /* "<db>.$cmd" or "<db>.<coll>"; into the buffer */
	int32_t number_to_skip;
	int32_t number_to_return;
	bool has_fields;
	bson_t fields; /* returnFieldsSelector when has_fields */
	/* OP_GET_MORE: full_collection_name and number_to_return above, and */
	int64_t cursor_id;
	/* OP_COMPRESSED */
	int32_t original_op_code;
	int32_t uncompressed_size;
	uint8_t compressor_id;
} wire_msg;

/* Read the messageLength field of a header (first 4 bytes, little-endian). buf must hold
 * at least 4 bytes. No validation: see wire_msg_length_ok. */
int32_t wire_msg_peek_length(const uint8_t *buf);

/* Whether a messageLength is acceptable for framing: 16 <= len <= WIRE_MAX_MESSAGE_SIZE. */
bool wire_msg_length_ok(int32_t len);

/* Parse one complete message of exactly len bytes (len must equal messageLength).
 * Fills *out (see wire_msg for ownership). The header (out->hdr) is filled first, as soon
 * as 16 bytes are available, so that a caller can answer an error to requestID even when
 * the rest is bad; *code is set to the MongoDB error code to answer with (0 on success).
 * Returns 0. Errors:
 *   SDB_EPROTO  malformed message (bad length, truncated or trailing bytes, unknown opCode,
 *               unknown required flag bits, missing or duplicate body, bad section kind,
 *               checksum mismatch, invalid BSON; *code ProtocolError or InvalidBSON)
 *   SDB_ETOOBIG message over maxMessageSizeBytes or a document over maxBsonObjectSize
 *               (*code BSONObjectTooLarge)
 * with a one-line message in err. */
int wire_msg_parse(const uint8_t *buf, size_t len, wire_msg *out, int *code, char *err,
		   size_t errlen);

/* Build the command document a handler sees: the body with each kind-1 section appended
 * as an array named by its identifier (so insert's `documents` sequence becomes
 * `documents: [...]`). For OP_QUERY, the query document, unwrapped from
 * {$query: {...}} when a legacy driver wrapped it. Appends to out, an empty initialised
 * document (bson_new() or bson_init()) that the caller destroys, also on error.
 * Errors: SDB_EPROTO when an identifier is empty (*code BadValue), names two sequences
 * (40431 "Duplicate document sequence: documents") or a body field too (40433 "Duplicate
 * field between body and document sequence documents"), mongod's codes and messages
 * (op_msg.cpp, answered as an error reply), a sequence document or OP_QUERY's $query is
 * not valid BSON (*code InvalidBSON), or the message is not OP_MSG/OP_QUERY
 * (ProtocolError). */
int wire_msg_command(const wire_msg *msg, bson_t *out, int *code, char *err, size_t errlen);

/* Build the find command mongod 3.2 .. 5.0 ran for a legacy OP_QUERY on a collection
 * namespace "<db>.<coll>" (msg->full_collection_name; not "<db>.$cmd"): appends to out
 * (an empty initialised document the caller destroys, also on error)
 *   {find: coll, filter, [projection: returnFieldsSelector], [skip: numberToSkip],
 *    [limit + singleBatch | batchSize: from numberToReturn], [the $-modifiers of a wrapped
 *    query: $orderby -> sort, $hint, $comment, $maxTimeMS, $min, $max, $returnKey,
 *    $showDiskLoc -> showRecordId, $readPreference], [tailable, awaitData,
 *    noCursorTimeout, allowPartialResults from the flags], $db: db}
 * The query is the filter unless it wraps one in `query` or `$query` (a document), as
 * mongod reads it. numberToReturn: < 0 -> limit -n, singleBatch; 1 -> limit 1, singleBatch
 * (legacy: 1 means -1); > 1 -> batchSize n; 0 -> the default. slaveOk without a
 * $readPreference -> {mode: "secondaryPreferred"} (mongos's reading of the bit).
 * On success *db and *coll are heap strings (free()) and *batch the batchSize for the
 * getMores of an exhaust cursor (0: default).
 * Errors: (nothing in *db, *coll) SDB_EINVAL with *code InvalidNamespace (73) for a
 * namespace without a database or a collection, BadValue (2) for a negative numberToSkip,
 * exhaust on a tailable cursor without awaitData,
 * an unsupported modifier ($explain, $snapshot, $maxScan, unknown ones) or a modifier of
 * the wrong type; SDB_EPROTO with InvalidBSON (22) for a query that is not valid BSON. */
int wire_msg_legacy_find(const wire_msg *msg, bson_t *out, char **db, char **coll,
			 int32_t *batch, int *code, char *err, size_t errlen);

/* Build the getMore command of an exhaust cursor's next batch: appends
 * {getMore: cursor_id (int64), collection: coll, [batchSize: batch when > 0], $db: db} to
 * out (an empty initialised document). */
void wire_msg_legacy_get_more(int64_t cursor_id, const char *db, const char *coll,
			      int32_t batch, bson_t *out);

/* Build the getMore command of a legacy OP_GET_MORE (msg->full_collection_name
 * "<db>.<coll>", msg->cursor_id; numberToReturn n != 0 -> batchSize |n|), as
 * wire_msg_legacy_get_more. On success *db and *coll are heap strings (free()).
 * Errors: SDB_EINVAL with *code InvalidNamespace (73) for a namespace without a database or
 * a collection (nothing in *db, *coll). */
int wire_msg_legacy_get_more_cmd(const wire_msg *msg, bson_t *out, char **db, char **coll,
				 int *code, char *err, size_t errlen);

/* Encode the OP_REPLY of a legacy query or exhaust getMore from the reply of the find or
 * getMore command it ran: the documents of reply's cursor.firstBatch (or nextBatch),
 * cursorID cursor.id, startingFrom starting_from, responseFlags response_flags. A reply
 * that is not ok, or is not a cursor reply, becomes one error document with QueryFailure
 * added and cursorID 0 (see wire_msg_encode_reply), except CursorNotFound (43): the
 * CursorNotFound flag and no document, as mongod answers a getMore of an unknown cursor.
 * *cursor_id and *n_returned report what was encoded (0, and 1 or 0, for an error). Returns a heap buffer (free()) of *len bytes.
 * Aborts on OOM (sdb_malloc). */
uint8_t *wire_msg_encode_cursor_reply(int32_t request_id, int32_t response_to,
				      int32_t response_flags, int32_t starting_from,
				      const bson_t *reply, int64_t *cursor_id,
				      int32_t *n_returned, size_t *len);

/* Encode an OP_MSG reply: header (requestID request_id, responseTo response_to), flagBits
 * `flags` (only moreToCome is meaningful in a reply; the checksum bit is cleared: replies
 * carry no checksum), one kind-0 section with body. Returns a heap buffer (free()) of
 * *len bytes. Aborts on OOM (sdb_malloc). */
uint8_t *wire_msg_encode_msg(int32_t request_id, int32_t response_to, uint32_t flags,
			     const bson_t *body, size_t *len);

/* The bytes of an OP_MSG before its one kind-0 section's document: the header
 * (messageLength = WIRE_MSG_PREFIX_LEN + body_len, requestID, responseTo, opCode OP_MSG),
 * flagBits (flags without the checksum bit) and the section kind 0, little-endian, into
 * out. For a sender that writes the document's own bytes after it (writev, no copy:
 * the proxy's shard connections); wire_msg_encode_msg uses it too. */
#define WIRE_MSG_PREFIX_LEN (WIRE_MSG_HEADER_LEN + 5)
void wire_msg_encode_msg_prefix(uint8_t out[WIRE_MSG_PREFIX_LEN], int32_t request_id,
				int32_t response_to, uint32_t flags, uint32_t body_len);
/* Whether prefix, the first WIRE_MSG_PREFIX_LEN bytes of a message, is what
 * wire_msg_encode_msg_prefix writes for an answer to response_to: opCode OP_MSG, no flag
 * bits, a kind 0 section first. The message is then that prefix and one document when its
 * messageLength is the document's length + WIRE_MSG_PREFIX_LEN. For a reader that reads
 * the document's bytes into a buffer of their own (the proxy's shard connections: no copy);
 * anything else goes through wire_msg_parse. */
bool wire_msg_prefix_is_plain(const uint8_t *prefix, int32_t response_to);
/* Check the len bytes at p as wire_msg_parse checks a section's document: one document
 * filling them, at most maxBsonObjectSize, well formed. For the reader of a plain
 * message's document (wire_msg_prefix_is_plain). Returns 0. Errors: SDB_EPROTO (not one
 * well-formed document of len bytes), SDB_ETOOBIG (over maxBsonObjectSize), with a
 * message in err. */
int wire_msg_check_doc(const uint8_t *p, size_t len, char *err, size_t errlen);

/* Encode an OP_REPLY with one document (the reply to a legacy OP_QUERY command).
 * response_flags: WIRE_REPLY_FLAG_*. A failure (doc's `ok` false, or QueryFailure in
 * response_flags) is sent as mongod's legacy error document: `$err` (doc's errmsg) first,
 * then doc's fields, `code` (8 UnknownError when doc has none) and `ok: 0` added when
 * missing, so that a legacy driver reading `$err` and a command reader using `errmsg`
 * both see the error. Returns a heap buffer (free()) of *len bytes. */
uint8_t *wire_msg_encode_reply(int32_t request_id, int32_t response_to, int32_t response_flags,
			       const bson_t *doc, size_t *len);

/* Length in bytes of a document, read from its data. Use it instead of b->len: a bson_t
 * from bson_new() is not 128-byte aligned as the type demands, and UBSan reports every
 * member access through such a pointer. */
uint32_t wire_bson_len(const bson_t *b);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, continuing from crc
 * (start with 0). Table-driven, thread-safe. crc32c("123456789") == 0xE3069283. */
uint32_t wire_crc32c(uint32_t crc, const void *data, size_t n);

#endif
