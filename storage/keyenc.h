/* Order-preserving byte encoding of BSON values (index keys of the embedded shard).
 *
 * For any two values a, b:  sign(memcmp-order(enc(a), enc(b))) == sign(sdb_bson_cmp(a, b))
 * where memcmp-order compares the common prefix with memcmp and then the lengths (SQLite's
 * BLOB order, also sdb_key_cmp below). Equal values encode to identical bytes (1, 1.0 and
 * NumberLong(1) are one key), so a key is usable as a SQLite BLOB primary key. Every
 * encoding is prefix-free (no encoding is a proper prefix of another), so compound keys
 * are plain concatenations and compare component by component. Keys are NOT decodable:
 * the document is stored separately.
 *
 * Byte layout of one value (ascending):  BRACKET-BYTE BODY
 *   bracket bytes (ascending = MongoDB's canonical order, common/bsonval.h):
 *     0x0A MinKey  0x0F undefined  0x14 null   0x1E number  0x28 string/symbol
 *     0x32 object  0x3C array      0x46 binData 0x50 ObjectId 0x5A bool  0x64 date
 *     0x6E timestamp 0x78 regex    0x82 dbPointer 0x8C code  0x96 code w/ scope
 *     0xF0 MaxKey
 *   BODY by bracket:
 *     MinKey, MaxKey, undefined, null: empty
 *     number: CLS [EXP2 FRAC8 [DEXP2 COEF15]]  CLS 0x00 NaN, 0x01 -inf, 0x02 negative,
 *             0x03 zero, 0x04 positive, 0x05 +inf. Finite non-zero values carry
 *             EXP2 = (exp + 32768) as 2 bytes big-endian and FRAC8 = frac as 8 bytes
 *             big-endian (sdb_bson_num of bsonval.h). When frac's bit 0 is set (a
 *             decimal128 that no 64-bit binary value equals), DEXP2 = (dexp + 32768)
 *             and COEF15 = the 34-digit coefficient (dhi:dlo, 120 bits big-endian)
 *             follow; bit 0 tells the two lengths apart, so the encoding stays
 *             prefix-free. For negatives all those bytes are bit-inverted so larger
 *             magnitudes sort lower. int, long, double and the decimals equal to them
 *             encode exactly as before the exact decimal order; keys that earlier
 *             versions wrote for other decimals differ, and the store re-keys them once
 *             when it opens a data directory without meta keyenc = 2 (storage/store.c).
 *     string: STR = the bytes with each 0x00 written as 0x00 0xFF, then 0x00 0x00.
 *     object: for each element: BRACKET-BYTE(element) STR(field name) BODY(element),
 *             then 0x00 (below every bracket byte, so a shorter document sorts first).
 *     array:  for each element: BRACKET-BYTE(element) BODY(element), then 0x00.
 *     binData: LEN4 (big-endian uint32) SUBTYPE1 BYTES[LEN]
 *     ObjectId: 12 bytes.  bool: 0x00 or 0x01.
 *     date:  int64 ms big-endian with the sign bit flipped.
 *     timestamp: t as 4 bytes big-endian, then i as 4 bytes big-endian.
 *     regex: STR(pattern) STR(flags).
 *     dbPointer: LEN4(namespace) namespace bytes, 12 ObjectId bytes.
 *     code: STR(code).  code with scope: STR(code) BODY-of-object(scope).
 *
 * Descending components: every byte of the component's encoding is bit-inverted
 * (x ^ 0xFF). Because encodings are prefix-free, inversion exactly reverses the order and
 * stays prefix-free, so compound keys mixing directions still compare component-wise.
 *
 * Limits: nesting
 * deeper than SDB_BSON_MAX_DEPTH is refused with SDB_EINVAL.
 */
#ifndef SDB_STORAGE_KEYENC_H
#define SDB_STORAGE_KEYENC_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable key buffer. Zero-initialised (or sdb_key_init) is empty; data is heap memory
 * owned by the key (sdb_malloc family), released by sdb_key_free. */
typedef struct sdb_key {
	uint8_t *data;
	size_t len;
	size_t cap;
} sdb_key;

void sdb_key_init(sdb_key *k);
/* Forget the contents (keeps the allocation). */
void sdb_key_reset(sdb_key *k);
void sdb_key_free(sdb_key *k);
/* Append raw bytes (used by callers building bounds). */
void sdb_key_append(sdb_key *k, const void *bytes, size_t n);

/* Append the encoding of one value (an element's value; NULL means missing and encodes
 * as null, which is how MongoDB indexes a missing field). desc inverts the component.
 * Errors: SDB_EINVAL (nesting deeper than SDB_BSON_MAX_DEPTH, or corrupt nested BSON) with
 * a message in err; on error k->len is restored to its value on entry. */
int sdb_keyenc_append_iter(sdb_key *k, const bson_iter_t *it, bool desc, char *err,
			   size_t errlen);
int sdb_keyenc_append_value(sdb_key *k, const bson_value_t *v, bool desc, char *err,
			    size_t errlen);

/* A collator of storage/collation.h (issue #20). */
typedef struct sdb_collator sdb_collator;

/* sdb_keyenc_append_value under a collation (NULL coll: the same as without): strings and
 * symbols, also inside objects and arrays, encode as 0x28, their ICU sort key
 * (sdb_collator_sort_key, no 0x00 inside), then 0x00 0x00; so memcmp order follows the
 * collation and strings equal under it encode identically (sort keys, group keys, distinct
 * dedup of a command with a collation; index keys never use this). Errors: as
 * sdb_keyenc_append_value. */
int sdb_keyenc_append_value_coll(sdb_key *k, const bson_value_t *v, bool desc,
				 const sdb_collator *coll, char *err, size_t errlen);

/* Make coll the collation of every sdb_keyenc_append_value on this thread until the next
 * swap (NULL: none), for code that builds keys through other modules (an index with a
 * collation: storage/keys.c; its bounds: storage/query.c). Returns: the previous one, to
 * restore. */
const sdb_collator *sdb_keyenc_collation_swap(const sdb_collator *coll);

/* The encoded bracket byte of a canonical bracket (SDB_BRACKET_*), e.g. 0x1E for numbers.
 * Bounds of a whole bracket in ascending order: every key of the bracket is >= the one
 * byte {bracket_byte} and < the one byte {bracket_byte + 1} (and every key of a higher
 * bracket is >= {bracket_byte + 1}); this holds for compound keys too (prefix compare). */
uint8_t sdb_keyenc_bracket_byte(int bracket);

/* Compare two keys as SQLite compares BLOBs: memcmp of the common prefix, then length.
 * Returns: <0, 0, >0. */
int sdb_key_cmp(const sdb_key *a, const sdb_key *b);
int sdb_key_cmp_raw(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/* Compute into *out the smallest key that is greater than every key starting with
 * prefix (drop trailing 0xFF bytes, then increment the last byte). Returns false (out
 * empty) when no such key exists (prefix empty or all 0xFF: scan to the end).
 * Use: all compound keys whose first component equals v are in [enc(v), succ(enc(v))). */
bool sdb_key_prefix_successor(const uint8_t *prefix, size_t len, sdb_key *out);

/* While on, this thread encodes numbers in their frozen pre-exact form (decimals through
 * long double, common/bsonval.h sdb_bson_num_canon_legacy): the keys releases before the
 * exact decimal order wrote. For the store's one-time re-key (storage/store.c), which
 * computes a document's old index keys to delete them, and for the hash below. Returns the
 * previous setting (restore it when done). */
bool sdb_keyenc_legacy_numbers(bool on);

/* The hash of a value for hashed indexes and hashed shard keys (one function serves the
 * shard's hashed indexes, storage/keys.c, and the router, src/routing/route.c):
 *     (int64_t) XXH64(legacy-enc(v) ascending, seed 0)
 * legacy-enc is this file's encoding with numbers in their frozen pre-exact form
 * (common/bsonval.h sdb_bson_num_canon_legacy: a decimal128 through its nearest long
 * double). The hash is persistent data (hashed index keys on disk, hashed shard key chunk
 * bounds in metadata), so its bytes never change: MongoDB's hashed index likewise hashes
 * a fixed canonical form (mongo/db/hasher.cpp). Decimals that differ only past ~19
 * significant digits therefore hash equally, a collision like any other (the matcher
 * checks what a hashed index returns). Equal numbers of different types (5, 5.0,
 * NumberLong(5), NumberDecimal("5.00")) hash equally, as in MongoDB. v NULL means missing
 * and hashes as null. A value that cannot be encoded (nested deeper than
 * SDB_BSON_MAX_DEPTH) hashes as 0. Never fails. The index key of a hashed index is the
 * encoding of NumberLong(this hash). tests/unit/test_storage_keyenc.c pins outputs. */
int64_t sdb_keyenc_hash_value(const bson_value_t *v);
/* The same hash from a value's ascending (exact) encoding of len bytes, as
 * sdb_keyenc_append_value wrote it: *out = sdb_keyenc_hash_value(v) for the v that
 * enc(v) encodes. The planner hashes the point bounds of an equality this way
 * (storage/query.c). Returns true with *out set; false (*out untouched) when enc is an
 * object, array or code with scope that may hold a number nested inside (the frozen form
 * of a nested inexact decimal cannot be rebuilt from its bytes): the caller then plans
 * without hashed bounds. */
bool sdb_keyenc_hash_encoded(const uint8_t *enc, size_t len, int64_t *out);

#endif
