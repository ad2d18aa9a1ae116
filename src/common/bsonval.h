/* BSON value comparison in MongoDB's order: the one comparator of the tree, shared by the
 * embedded shard's query core (storage/), routing (src/routing/route_key_cmp) and the
 * metadata state machine's chunk bounds (raft/fsm.c fsm_cmp_key from op version 4), which
 * is why it lives in common/ (raft/ and storage/ may include only common/).
 *
 * Source of the behaviour: MongoDB manual "Comparison/Sort Order"
 * (https://www.mongodb.com/docs/manual/reference/bson-type-comparison-order/) and
 * mongo/bson/bsonelement.cpp compareElementValues() / canonicalizeBSONType().
 *
 * Order of the type brackets (lowest first):
 *   MinKey < undefined < null (and missing, where the caller maps missing to null)
 *   < numbers (int32, int64, double, decimal128) < string, symbol < object < array
 *   < binData < ObjectId < bool < date < timestamp < regex < dbPointer < code
 *   < code with scope < MaxKey
 * Within a bracket:
 *   numbers    by value across types; NaN == NaN and NaN is below every other number;
 *              -0 == 0; int64 vs double is exact (no precision loss for |v| > 2^53).
 *              decimal128 compares by exact value, as mongod does (mongo/base/
 *              compare_numbers.h compareDecimals, compareDecimalToDouble/Long/Int):
 *              1.0 == 1.00 == 1 == NumberLong(1), -0 == 0, NaN (any payload) == NaN,
 *              +-Infinity equal to the double infinities; NumberDecimal("0.1") is below
 *              the double 0.1 (0.1000000000000000055511...). Non-canonical decimals
 *              (coefficient above 10^34 - 1) read as zero, as IEEE 754-2008 says.
 *   strings    by bytes (simple binary collation), shorter prefix first; symbol == string.
 *   objects    element by element: canonical type bracket, then field name (bytes),
 *              then value; a document that ends first is smaller.
 *   arrays     element by element (type bracket, then value); shorter prefix first.
 *   binData    by length, then subtype, then bytes.
 *   ObjectId   by its 12 bytes; bool false < true; date as signed int64 ms;
 *   timestamp  as unsigned (t, i); regex by pattern then flags (bytes);
 *   dbPointer  by namespace length, then namespace bytes, then ObjectId;
 *   code       by code string; code with scope by code, then scope object.
 *
 * These comparisons are exactly the ones the order-preserving key encoding of
 * storage/keyenc.h reproduces with memcmp: both use sdb_bson_num_canon() for numbers.
 *
 * Untrusted input: every function here expects BSON that already passed
 * bson_validate() (corrupt nested documents are treated as empty). Recursion stops at
 * SDB_BSON_MAX_DEPTH nesting levels: deeper sub-documents compare by raw bytes, never
 * crash. Callers should refuse documents deeper than that (sdb_bson_depth_ok) before
 * storing them, as MongoDB refuses nesting beyond 100 levels (+ margin for the shell).
 */
#ifndef SDB_COMMON_BSONVAL_H
#define SDB_COMMON_BSONVAL_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/bsonget.h"

/* Maximum nesting depth (documents and arrays) the comparison and key encoding recurse
 * into. MongoDB's own limit for stored documents is 100 (BSONDepth::kDefaultMaxAllowableDepth
 * is 200 for reading). */
#define SDB_BSON_MAX_DEPTH 200

/* Canonical type brackets, values of MongoDB's canonicalizeBSONType() (an int; equal
 * bracket means "comparable by value"). */
enum {
	SDB_BRACKET_MINKEY = -1,
	SDB_BRACKET_UNDEFINED = 0,
	SDB_BRACKET_NULL = 5,
	SDB_BRACKET_NUMBER = 10,
	SDB_BRACKET_STRING = 15,
	SDB_BRACKET_OBJECT = 20,
	SDB_BRACKET_ARRAY = 25,
	SDB_BRACKET_BINARY = 30,
	SDB_BRACKET_OID = 35,
	SDB_BRACKET_BOOL = 40,
	SDB_BRACKET_DATE = 45,
	SDB_BRACKET_TIMESTAMP = 47,
	SDB_BRACKET_REGEX = 50,
	SDB_BRACKET_DBPOINTER = 55,
	SDB_BRACKET_CODE = 60,
	SDB_BRACKET_CODEWSCOPE = 65,
	SDB_BRACKET_MAXKEY = 127,
};

/* Returns: sdb_bson_bracket returns the canonical bracket of a BSON type (table above).
 * BSON_TYPE_EOD (used for "missing") maps to SDB_BRACKET_NULL; an unknown type byte maps
 * to SDB_BRACKET_MAXKEY. Pure function, any thread. */
int sdb_bson_bracket(bson_type_t t);

/* A number in the canonical form shared by comparison and key encoding:
 *   cls  0 NaN, 1 -inf, 2 negative finite, 3 zero, 4 positive finite, 5 +inf
 *   exp  for finite non-zero: floor(log2(|v|)) (int32 1 -> 0, 0.5 -> -1)
 *   frac for finite non-zero: the bits of |v| after the leading 1, left-aligned in 64
 *        bits; bit 0 is the "inexact" flag:
 *        - bit 0 clear: |v| = 2^exp * (1 + frac / 2^64) exactly, with at most 63 bits
 *          after the leading 1. Every int32, int64 and double is such a value, and so
 *          is every decimal128 equal to one (decimal 1.0 and int 1 are the same number).
 *        - bit 0 set (only for decimal128 values that need more than 64 significant
 *          bits, e.g. 0.1 or 1.000000000000000000001): frac's bits 63..1 are |v|
 *          rounded toward zero, so the value sorts strictly between that 64-bit value
 *          and the next; dexp/dhi:dlo then order the decimals inside that gap:
 *   dexp, dhi, dlo  (bit 0 of frac set only, zero otherwise) the decimal's adjusted
 *        exponent (exponent of its leading digit: 1.5 -> 0, 0.01 -> -2) and its
 *        coefficient left-aligned to 34 digits (1.5 -> 15 * 10^32) as a 113-bit
 *        integer dhi * 2^64 + dlo. Equal decimals (1.50 and 1.5) get equal fields.
 * Comparing (cls, exp, frac, dexp, dhi, dlo) lexicographically, with magnitudes reversed
 * for cls 2, is exact numeric order (sdb_bson_num_cmp). */
typedef struct sdb_bson_num {
	int cls;
	int32_t exp;
	uint64_t frac;
	int32_t dexp;
	uint64_t dhi;
	uint64_t dlo;
} sdb_bson_num;

/* Fill *out from a numeric value (BSON_TYPE_INT32, INT64, DOUBLE, DECIMAL128). Returns
 * false (and sets *out to zero) when v is not a number. */
bool sdb_bson_num_canon(const bson_value_t *v, sdb_bson_num *out);

/* sdb_bson_num_canon as releases before the exact decimal order computed it: a decimal128
 * through its nearest long double (x86-64: 64-bit significand; strtold of its string, so
 * decimals below the long double range read as 0 and above it as +-inf); int32, int64 and
 * double exactly as sdb_bson_num_canon. Bit 0 of frac is never set (dexp/dhi/dlo zero).
 * Frozen: the hashed index and hashed shard key hash (storage/keyenc.h
 * sdb_keyenc_hash_value) and the op-version-4 chunk-bound order (sdb_bson_key_cmp_v4)
 * are defined by it, so its output must never change. Returns false (and *out zero) when
 * v is not a number. */
bool sdb_bson_num_canon_legacy(const bson_value_t *v, sdb_bson_num *out);

/* Three-way compare of two canonical numbers. Returns: <0, 0, >0 (never an error). */
int sdb_bson_num_cmp(const sdb_bson_num *a, const sdb_bson_num *b);

/* Compare the values of two elements in MongoDB order (field names are ignored).
 * Returns: <0, 0 or >0 (never an error). Either iterator may be NULL meaning "missing",
 * which compares as null (equal to null, MongoDB's sort semantics). The iterators are not
 * advanced. */
int sdb_bson_cmp(const bson_iter_t *a, const bson_iter_t *b);

/* sdb_bson_type_name (MongoDB $type names) lives in common/bsonget.h. */

/* The same on bson_value_t (for documents/arrays, value.v_doc.data must point at a whole
 * BSON document of data_len bytes). NULL means missing (== null). Returns: <0, 0 or >0. */
int sdb_bson_value_cmp(const bson_value_t *a, const bson_value_t *b);

/* A string collation (issue #20): how the values of the string bracket (string, symbol)
 * compare, for MongoDB's collation option. The comparator lives in storage/collation.h
 * (ICU); common/ only holds the hook, since raft/ and storage/ may include only common/.
 * cmp returns <0, 0, >0 for two UTF-8 strings of the given byte lengths (not NUL-terminated).
 * Code and code with scope keep their binary order, as in MongoDB (bsonelement.cpp
 * compareElements passes the collator to String and Symbol only). */
typedef struct sdb_bson_collator sdb_bson_collator;
struct sdb_bson_collator {
	int (*cmp)(const sdb_bson_collator *self, const char *a, size_t alen, const char *b,
		   size_t blen);
};

/* The calling thread's collation: every sdb_bson_cmp / sdb_bson_value_cmp /
 * sdb_bson_value_eq / sdb_bson_iter_eq / sdb_bson_doc_cmp on this thread compares strings
 * with c (NULL: simple binary order, the default). sdb_bson_key_cmp always compares
 * binary (chunk bounds and routing never follow a query's collation). A command that runs
 * with a collation sets it for its duration and restores the previous one:
 *     const sdb_bson_collator *prev = sdb_bson_collator_set(c); ...; sdb_bson_collator_set(prev);
 * Returns: the previous collation of this thread. c is borrowed and must outlive its use. */
const sdb_bson_collator *sdb_bson_collator_set(const sdb_bson_collator *c);

/* Returns: the calling thread's collation (NULL: simple). */
const sdb_bson_collator *sdb_bson_collator_get(void);

/* sdb_bson_value_eq under the simple collation whatever the thread's: for identity (an
 * _id or a shard key that must not change: "a" and "A" differ even under a case-insensitive
 * collation). NULL means missing. Returns: true when equal. */
bool sdb_bson_value_eq_simple(const bson_value_t *a, const bson_value_t *b);

/* sdb_bson_value_cmp under the simple collation whatever the thread's (routing: chunk
 * bounds order strings by their bytes). Returns: <0, 0 or >0. */
int sdb_bson_value_cmp_simple(const bson_value_t *a, const bson_value_t *b);

/* Compare two shard-key value documents (e.g. chunk bounds {a: 1, b: MinKey}) component by
 * component in the order above, ignoring field names; when one document ends first it
 * compares below. Returns: <0, 0 or >0; a document libbson cannot iterate compares equal
 * to anything (callers pass validated BSON). Exact for decimals; chunk bounds use
 * sdb_bson_key_cmp_v4 below (routing and the metadata state machine). */
int sdb_bson_key_cmp(const bson_t *a, const bson_t *b);

/* sdb_bson_key_cmp as it was before Decimal128 compared exactly: a decimal128 compares
 * through its nearest long double (x86-64: 64-bit significand, so decimals closer than
 * about 1 part in 2^64 to each other or to a double compare equal; the order is a
 * coarsening of the exact one, never an inversion). Returns: <0, 0 or >0. The
 * chunk-membership order (issue #20): the metadata state machine for entries stamped op
 * version 4 (raft/fsm.c fsm_cmp_key), routing (src/routing route_key_cmp), the shard's
 * ownership filter and keyRange reads; every existing chunk placement was made by it, so it
 * must not change (exact placement would move a stored document that ties a bound). */
int sdb_bson_key_cmp_v4(const bson_t *a, const bson_t *b);

/* One value in the sdb_bson_key_cmp_v4 order, under the simple (binary) collation whatever
 * the thread's: how routing compares a query's shard-key bound with a chunk bound
 * (src/routing/route.c). Returns: <0, 0 or >0. */
int sdb_bson_value_cmp_v4(const bson_value_t *a, const bson_value_t *b);

/* Compare two whole documents as objects (element by element: bracket, name, value).
 * Returns: <0, 0 or >0. */
int sdb_bson_doc_cmp(const bson_t *a, const bson_t *b);

/* Equality under the order above (1 == 1.0 == NumberLong(1); "a" symbol == "a" string;
 * {a: 1} == {a: 1.0}; field order matters as in MongoDB). */
bool sdb_bson_value_eq(const bson_value_t *a, const bson_value_t *b);
bool sdb_bson_iter_eq(const bson_iter_t *a, const bson_iter_t *b);

/* True when the document nests objects/arrays at most max_depth levels deep (the
 * top-level document is level 0, {a: {}} is level 1). Expects validated BSON; returns
 * false on corrupt nested BSON. */
bool sdb_bson_depth_ok(const bson_t *doc, int max_depth);

#endif
