/* Range-checked numeric fields of a BSON command: one set of rules for every role.
 *
 * A command argument that must be an integer (find's limit, skip and batchSize, count's
 * limit, a maxTimeMS, a version token ...) is read with sdb_bson_get_int64, which follows
 * the MongoDB server's BSONElement::parseIntegerElementToLong
 * (src/mongo/bson/bsonelement.cpp) and the IDL range validators
 * (src/mongo/db/query/find_command.idl, `validator: { gte: 0 }`):
 *   - int32 and int64 are taken as they are;
 *   - a double only when it is finite, integral and inside the int64 range;
 *   - anything else (string, bool, null, decimal128 ...) is a type mismatch;
 *   - the value must then lie in [lo, hi], so that no caller negates or adds to a value it
 *     has not bounded (`limit = -limit` on INT64_MIN is undefined behaviour).
 * The error names the field as the caller spells it ("limit", "find.limit").
 * To find several fields of a command in one pass first, see common/fieldscan.h.
 */
#ifndef SDB_COMMON_BSONGET_H
#define SDB_COMMON_BSONGET_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

/* MongoDB error codes the getters answer with (error_codes.yml; 51024 is the code of the
 * IDL `gte` validator's "BSON field 'F' value must be >= N, actual value 'V'"). */
#define SDB_BSONGET_BAD_VALUE 2
#define SDB_BSONGET_FAILED_TO_PARSE 9
#define SDB_BSONGET_TYPE_MISMATCH 14
#define SDB_BSONGET_BELOW_MIN 51024

/* The MongoDB name of a BSON type, as $type and error messages spell it ("double",
 * "string", "object", "array", "binData", "objectId", "bool", "date", "null", "regex",
 * "int", "timestamp", "long", "decimal", "minKey", "maxKey", ...); BSON_TYPE_EOD (no value)
 * is "missing". Static string, never NULL. Source: MongoDB manual, $type "Available Types". */
const char *sdb_bson_type_name(bson_type_t t);

/* Why a getter refused a value: a MongoDB code and the message to send with it. */
typedef struct sdb_bson_err {
	int code;      /* one of SDB_BSONGET_* above */
	char msg[256]; /* NUL-terminated, names the field */
} sdb_bson_err;

/* Read the field under `it` as an int64 in [lo, hi] (lo <= hi) into *out.
 * field: the name used in messages (not looked up; the caller found it).
 * Returns 0, or SDB_EINVAL with *e filled in and *out untouched. e may be NULL.
 * Errors:
 *   SDB_BSONGET_TYPE_MISMATCH (14)  not an int32, int64 or double:
 *       "BSON field 'F' is the wrong type 'string', expected types '[long, int, double]'"
 *   SDB_BSONGET_FAILED_TO_PARSE (9) a double that is NaN, infinite, not integral or
 *       outside the int64 range: "Expected an integer: F: 1.5"
 *   SDB_BSONGET_BELOW_MIN (51024)    value < lo: "BSON field 'F' value must be >= LO,
 *       actual value 'V'"
 *   SDB_BSONGET_BAD_VALUE (2)        value > hi: "BSON field 'F' value must be <= HI,
 *       actual value 'V'" */
int sdb_bson_get_int64(const bson_iter_t *it, const char *field, int64_t lo, int64_t hi,
		       int64_t *out, sdb_bson_err *e);

/* Look `name` up in the top level of doc: absent gives *out = def and returns 0 (def is
 * not range-checked); present is sdb_bson_get_int64 with field = name. Errors: the same
 * (SDB_EINVAL with e's MongoDB code). */
int sdb_bson_find_int64(const bson_t *doc, const char *name, int64_t lo, int64_t hi,
			int64_t def, int64_t *out, sdb_bson_err *e);

/* The same rules without a range or a message: true and *out when the value under `it`
 * is an int32, int64 or an integral double inside the int64 range. For values read back
 * from our own replies and records, where a refusal needs no MongoDB error. */
bool sdb_bson_as_int64(const bson_iter_t *it, int64_t *out);

/* The rule of MongoDB's IDL integer types that take no double ("long" of txnNumber, "int"
 * of stmtId, src/mongo/db/session/logical_session_id.idl): true and *out when the value
 * under `it` is an int32 or an int64; a double, even an integral one, and every other type
 * give false with *out untouched. The caller checks the range and words its error. */
bool sdb_bson_as_int64_exact(const bson_iter_t *it, int64_t *out);

/* A static view of the embedded document at it in *out (no copy: valid while the
 * enclosing document is). Returns: false when the element is not a document or its bytes
 * do not form one (*out then unusable). */
bool sdb_bson_iter_doc(const bson_iter_t *it, bson_t *out);

/* Whether doc is valid BSON for the wire: every element well formed to the document's
 * end, every field name UTF-8 (an empty name is allowed), and every nested document, array
 * and code-with-scope scope well formed in turn, at most max_depth levels deep (the
 * top-level document is level 0; {a: {}} nests 1). This is everything bson_validate with
 * BSON_VALIDATE_NONE refuses (as libbson 1.23 implements it) and more: that walk skips a
 * nested document it cannot open, stops quietly at a malformed element inside one (a
 * document it accepted aborted bson_init_static deeper in the update engine, found by
 * fuzz_storage_update), and recurses into nested documents and scopes without a limit. The
 * values of strings are not checked for UTF-8, as neither bson_validate(NONE) nor mongod's
 * default BSON validation does. One pass over the raw bytes, element by element exactly as
 * libbson's bson_iter_next checks them (a document is accepted exactly when iterating it
 * with libbson reaches its end without error: tests/unit/test_common_bsonget.c compares
 * the two on 200,000 mutated documents); no allocation; recursion bounded by max_depth.
 * Returns: true when well formed; false otherwise, also for a bson_t whose length, header
 * and terminator disagree. Errors: none (a verdict, not a status). */
bool sdb_bson_well_formed(const bson_t *doc, int max_depth);

#endif
