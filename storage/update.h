/* The update engine of the embedded shard: parse a MongoDB update (an operator document
 * such as {$set: {...}, $inc: {...}} or a replacement document) once, then apply it to
 * documents, producing new documents.
 *
 * Semantics follow MongoDB 6.0 (https://www.mongodb.com/docs/manual/reference/operator/update/)
 * and its error codes (src/mongo/base/error_codes.yml):
 *   9  FailedToParse               unknown modifier ("Unknown modifier: $foo"), empty modifier
 *                                   document ("'$set' is empty. You must specify a field like
 *                                   so: {$set: {<field>: ...}}"), a modifier that is not a document
 *   40 ConflictingUpdateOperators   two operators touch paths that conflict ("Updating the path
 *                                   'a.b' would create a conflict at 'a'")
 *   66 ImmutableField               the update would change _id ("Performing an update on the
 *                                   path '_id' would modify the immutable field '_id'")
 *   14 TypeMismatch                 $inc/$mul on a non-number (or with a non-number
 *                                   argument), $pop on a non-array
 *   2  BadValue                     bad argument shapes ($slice/$position not integral, bad
 *                                   $sort, $each not an array, ...), $push/$addToSet/$pull on
 *                                   a non-array, $rename through an array, int64 overflow
 *   28 PathNotViable                a path goes through a non-document/non-array value
 *                                   ("Cannot create field 'b' in element {a: 1}")
 *   52 DollarPrefixedFieldName      $-prefixed field inside $set values is allowed by 5.0+, but a
 *                                   replacement's top-level "$x" is refused with this code
 *   54 NotSingleValueField          upsert seed: a path is matched twice
 *   56 EmptyFieldName               an update path with an empty component ("a..b")
 *   2  BadValue                     arrayFilters: an identifier used without a filter ("No
 *                                   array filter found for identifier 'x' in path 'a.$[x]'"),
 *                                   a bad top-level name; array updates on a missing path or
 *                                   a non-array; `$` without a match from the query
 *   9  FailedToParse                arrayFilters: a filter no update uses ("The array filter
 *                                   for identifier 'x' was not used in the update ..."), two
 *                                   filters for one identifier; $pop not 1/-1
 *   53 InvalidIdField               _id becomes an array or a regex
 *   17419                           the new document is larger than 16 MB
 *   72 InvalidOptions               a pipeline-style update with a stage other than
 *                                   $addFields/$set/$project/$unset/$replaceRoot/$replaceWith
 *
 * Supported: $set $unset $inc $mul $min $max $rename $setOnInsert $push ($each $slice $sort
 * $position) $pull (value, or condition through storage/matcher.h) $pullAll $addToSet
 * ($each) $pop $currentDate (date or timestamp, from an injectable clock), positional `$`
 * (the first array element the query matched), `$[]` and `$[<identifier>]` with
 * arrayFilters. $inc/$mul follow mongod's SafeNum: a Decimal128 operand (field or
 * argument) gives a Decimal128 (the other one converted, a double to 15 digits:
 * storage/decimal.h); an int64 overflow fails with code 2.
 *
 * Field order follows MongoDB: $set on an existing field keeps its position, new fields are
 * appended (in the order of the update's paths, which MongoDB sorts: fields created by one
 * update are appended in lexicographic path order), _id stays first, and a replacement keeps
 * the original _id first.
 *
 * An sdb_update is immutable after sdb_update_parse() and may be applied from several
 * threads at once.
 */
#ifndef SDB_STORAGE_UPDATE_H
#define SDB_STORAGE_UPDATE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct sdb_update sdb_update;

/* Wall clock for $currentDate, in milliseconds since the Unix epoch (the protocol demands
 * epoch time here). ctx is sdb_update_opts.clock_ctx. */
typedef int64_t (*sdb_update_clock_fn)(void *ctx);

typedef enum {
	SDB_UPDATE_OPERATORS = 0, /* {$set: ..., $inc: ...} */
	SDB_UPDATE_REPLACEMENT,   /* {a: 1, b: 2} (a whole new document) */
	SDB_UPDATE_PIPELINE,      /* [{$set: ...}, {$unset: ...}] (update_pipeline.c) */
} sdb_update_kind;

typedef struct sdb_update_opts {
	/* The command's arrayFilters: a BSON array of filter documents, each about one
	 * identifier ({"x.grade": {$gte: 85}} or {x: {$gt: 1}}), or NULL. Copied by parse. */
	const bson_t *array_filters;
	/* The query filter of the update, used only to resolve the positional `$` operator
	 * (the index of the first array element the query matched). May be NULL; then an
	 * update that uses `$` fails at apply time with code 2 "The positional operator did
	 * not find the match needed from the query." Copied by parse. */
	const bson_t *query;
	/* User variables of a pipeline-style update ({name: constant}: the command's `let`
	 * and the statement's `c`, storage/pipeline.h sdb_let_parse), or NULL. Copied by
	 * parse. */
	const bson_t *vars;
	/* Clock for $currentDate; NULL means sdb_wall_ms() (common/clock.h). */
	sdb_update_clock_fn clock;
	void *clock_ctx;
	/* ObjectId for an upsert's generated _id; NULL means bson_oid_init. A replicated
	 * shard passes sdb_store_new_oid so that every member generates the same id. */
	void (*oid)(void *ctx, bson_oid_t *out);
	void *oid_ctx;
} sdb_update_opts;

/* Parse an update document.
 *
 * spec: the `u` field of an update statement as a document: when its first field starts
 * with '$' it is an operator update (every field must then be a known operator), otherwise
 * a replacement (checked with sdb_update_check_replacement). Use sdb_update_parse_value()
 * when the field may be an array (pipeline update). opts may be NULL (no arrayFilters, no
 * query, real clock).
 * On success *out is a new update (free with sdb_update_free) and 0 is returned.
 * Errors: SDB_EINVAL with *code set to the MongoDB code (9, 40, 2, 14, 52, 66, 238 ...)
 *         and a MongoDB-style message in err (errlen bytes, always NUL-terminated).
 */
int sdb_update_parse(const bson_t *spec, const sdb_update_opts *opts, sdb_update **out,
		     int *code, char *err, size_t errlen);

/* Same as sdb_update_parse, but takes the raw `u` field of an update statement (any BSON
 * type): a document is parsed as above, an array is a pipeline-style update (MongoDB 4.2+:
 * $addFields/$set, $project/$unset, $replaceRoot/$replaceWith stages with aggregation
 * expressions, run over the document; the result replaces it, _id kept; other stages 72,
 * arrayFilters 9), anything else code 14 TypeMismatch ("Update argument must be either an
 * object or an array"). Errors: SDB_EINVAL with *code and err, as sdb_update_parse. */
int sdb_update_parse_value(const bson_iter_t *u, const sdb_update_opts *opts, sdb_update **out,
			   int *code, char *err, size_t errlen);

void sdb_update_free(sdb_update *u);

/* Whether the update is a replacement or an operator update. */
sdb_update_kind sdb_update_get_kind(const sdb_update *u);

/* Apply u to doc.
 *
 * doc: the current document (for an upsert insert: the seed document built by
 * sdb_update_upsert_seed, possibly empty). is_upsert_insert: true when the result will be
 * inserted by an upsert ($setOnInsert applies only then).
 * out: uninitialised bson_t, initialised here on success and on failure (always
 * bson_destroy it); on success it holds the new document. For a replacement, out is the
 * replacement with doc's _id first (or the replacement's own _id when doc has none).
 * *changed: false when the new document is byte-identical to doc (MongoDB's nModified
 * counts only changed documents; a $set to the same value of the same type changes
 * nothing).
 * Does not generate an _id: an upsert insert whose result has none must get one from the
 * caller (see sdb_update_upsert_doc).
 * Errors: SDB_EINVAL with *code/err as MongoDB (14 TypeMismatch for $inc on a string,
 *         66 ImmutableField when _id would change, 28 PathNotViable, 2 BadValue ...);
 *         doc is never modified.
 */
int sdb_update_apply(const sdb_update *u, const bson_t *doc, bool is_upsert_insert, bson_t *out,
		     bool *changed, int *code, char *err, size_t errlen);

/* Build the document an upsert inserts before applying the update: the equality
 * conditions of filter (MongoDB "upsert with a query"): top-level and dotted equalities
 * ({a: 1}, {"b.c": 2} -> {a: 1, b: {c: 2}}), {$eq: v} and one-element {$in: [v]}
 * conditions, and $and of those; $or/$nor/regexes/other operators contribute nothing.
 * Fields come in the filter's order, except _id which comes first when present.
 * out: uninitialised bson_t, always initialised (bson_destroy it).
 * Errors: SDB_EINVAL with *code 54 NotSingleValueField when a path is given twice
 *         ({a: 1, "a.b": 2}), *code 2 when a seeded _id is not allowed.
 */
int sdb_update_upsert_seed(const bson_t *filter, bson_t *out, int *code, char *err,
			   size_t errlen);

/* The whole upsert insert path in one call: seed from filter (for an operator update) or
 * take the replacement, apply u with is_upsert_insert = true, then give the result an
 * ObjectId _id first when it has none (MongoDB puts a generated _id first).
 * out: uninitialised bson_t, always initialised (bson_destroy it).
 * Errors: as sdb_update_upsert_seed and sdb_update_apply. */
int sdb_update_upsert_doc(const sdb_update *u, const bson_t *filter, bson_t *out, int *code,
			  char *err, size_t errlen);

/* Check a document to insert or a replacement the way MongoDB does before storing it:
 * no $-prefixed top-level field names (code 52 DollarPrefixedFieldName: "The dollar ($)
 * prefixed field '$x' in '$x' is not allowed in the context of an update's replacement
 * document. Consider using an aggregation pipeline with $replaceWith."), _id not an array
 * (code 53 InvalidIdField "The '_id' value cannot be of type array") nor a regex.
 * Errors: SDB_EINVAL with *code and err. */
int sdb_update_check_replacement(const bson_t *doc, int *code, char *err, size_t errlen);

#endif
