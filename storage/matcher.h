/* Query matcher: MongoDB's query language over BSON documents (the embedded shard).
 *
 * Source of the behaviour: MongoDB manual "Query and Projection Operators"
 * (https://www.mongodb.com/docs/manual/reference/operator/query/), "Query an Array",
 * "Query for Null or Missing Fields", and the comparison order of common/bsonval.h.
 *
 * Supported: implicit equality {f: v}; $eq $ne $gt $gte $lt $lte $in $nin $exists
 * $type (numbers, aliases, "number", arrays of them) $and $or $nor $not $elemMatch (value
 * form {$elemMatch: {$gt: 1}} and object form {$elemMatch: {b: 1}}) $size $all (values and
 * {$elemMatch: ...} entries) $regex/$options and regex literals (PCRE2; flags i m s x)
 * $mod, $comment (ignored). Refused: $expr, $where, $text, $jsonSchema, geo operators and
 * any unknown operator (code 2 BadValue "unknown operator: $foo" / "unknown top level
 * operator: $foo").
 *
 * Semantics (MongoDB's):
 *   - dotted paths walk arrays (storage/path.h); a leaf array matches a predicate when the
 *     whole array or any element does ({a: 2} matches {a: [1, 2]}, {a: [1, 2]} matches it
 *     too); each predicate of {a: {$gt: 1, $lt: 5}} may be satisfied by a different element
 *     (so a: [0, 6] matches) while $elemMatch needs one element satisfying all;
 *   - {f: null} and {f: {$eq: null}} match null and missing (and undefined); "a.b" is
 *     missing when a is missing or a scalar, or when a is an array with a sub-document
 *     lacking b, not when a is an array without sub-documents ({a: [1]}); $ne/$nin are
 *     the exact negations of $eq/$in; $exists: false matches only missing;
 *   - comparison operators are type-bracketed: {$gt: 1} never matches a string; MinKey
 *     and MaxKey operands compare across brackets; $gte/$lte null also match missing;
 *   - $size counts elements of a leaf array (not expanded); $type "array" matches a
 *     leaf array (not its elements).
 *
 * Compiled matchers are immutable: match may be called from several threads at once.
 */
#ifndef SDB_STORAGE_MATCHER_H
#define SDB_STORAGE_MATCHER_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "storage/keyenc.h"

typedef struct sdb_matcher sdb_matcher;

/* Compile a filter document ({} matches everything). On success returns 0 and *out
 * (free with sdb_matcher_free); the matcher copies what it needs (filter may be freed).
 * Errors: SDB_EINVAL with *code the MongoDB error code and MongoDB's message in err:
 *   2 BadValue   unknown operator, $where refused, $expr refused (see
 *                sdb_matcher_new_opts), $in/$nin/$all needs an
 *                array, $and/$or/$nor must be a nonempty array, bad $mod divisor or
 *                remainder, $not needs a regex or a document, $size needs a whole
 *                non-negative number, unknown $type alias or code, ...
 *   51108 invalid regex flag ("invalid flag in regex options: z")
 *   51091 bad PCRE2 pattern ("Regular expression is invalid: ...")
 * code may be NULL. */
int sdb_matcher_new(const bson_t *filter, sdb_matcher **out, int *code, char *err,
		    size_t errlen);

/* sdb_matcher_new's flags. */
#define SDB_MATCHER_EXPR 1u /* build $expr (aggregation expressions over the whole document,
			     * storage/pipeline.h), at the top level and in $and/$or/$nor; the
			     * caller matches with sdb_matcher_eval, which reports evaluation
			     * errors. Without it $expr is refused (2). Inside $elemMatch it is
			     * always refused ("$expr can only be applied to the top-level
			     * document", 2). */

/* sdb_matcher_new with flags (SDB_MATCHER_EXPR). Errors: as sdb_matcher_new (SDB_EINVAL
 * with *code), and also $expr's parse errors (e.g. 168 "Unrecognized expression
 * '$foo'"). */
int sdb_matcher_new_opts(const bson_t *filter, unsigned flags, sdb_matcher **out, int *code,
			 char *err, size_t errlen);

/* sdb_matcher_new_opts with user variables in scope for $expr: vars ({name: constant},
 * the command's `let` after sdb_let_parse, storage/pipeline.h; may be NULL) resolves
 * $$name (copied where used). Errors: as sdb_matcher_new_opts. */
int sdb_matcher_new_vars(const bson_t *filter, unsigned flags, const bson_t *vars,
			 sdb_matcher **out, int *code, char *err, size_t errlen);

/* Compile a condition on one value with $elemMatch semantics (used by $pull and by the
 * $elemMatch projection): when cond's first field starts with '$' and is not
 * $and/$or/$nor, cond is a set of operators applied to the value itself
 * ({$gt: 3}); otherwise cond is a query applied to the value when it is a document
 * ({b: 1}). Errors: as sdb_matcher_new (SDB_EINVAL with *code). */
int sdb_matcher_new_elem(const bson_t *cond, sdb_matcher **out, int *code, char *err,
			 size_t errlen);

/* Does doc match? doc must be valid BSON (as stored). Any thread. A $expr whose
 * evaluation fails counts as no match here: matchers built with SDB_MATCHER_EXPR are
 * matched with sdb_matcher_eval. */
bool sdb_matcher_match(const sdb_matcher *m, const bson_t *doc);

/* Does doc match? 1 yes, 0 no (always 0 for a matcher from sdb_matcher_new_elem). Errors:
 * SDB_EINVAL when a $expr's evaluation fails, with its MongoDB *code (may be NULL) and
 * message in err (e.g. 16608 "can't $divide by zero"), as MongoDB fails the whole query. Any
 * thread. */
int sdb_matcher_eval(const sdb_matcher *m, const bson_t *doc, int *code, char *err,
		     size_t errlen);

/* For a matcher from sdb_matcher_new_elem: does one value match? (For a matcher from
 * sdb_matcher_new: true when the value is a document that matches.) */
bool sdb_matcher_match_value(const sdb_matcher *m, const bson_iter_t *value);

void sdb_matcher_free(sdb_matcher *m);

/* ---- planner support ---------------------------------------------------------------- */

/* One interval of encoded keys (storage/keyenc.h, ascending encoding of the single field).
 * Keys here are bare components: for an index whose first field is this path, the index
 * keys k with lo <= k[component] <= hi (per inclusivity) are candidates. A point is
 * lo == hi, both inclusive. */
typedef struct sdb_interval {
	sdb_key lo;
	sdb_key hi;
	bool lo_incl;
	bool hi_incl;
} sdb_interval;

typedef enum {
	SDB_BOUNDS_ALL = 0, /* no usable constraint on the path: scan everything */
	SDB_BOUNDS_POINTS,  /* equality or $in: every interval is a point */
	SDB_BOUNDS_RANGE,   /* intervals (at least one is not a point) */
	SDB_BOUNDS_EMPTY,   /* contradiction: nothing can match (e.g. $in: []) */
} sdb_bounds_kind;

typedef struct sdb_bounds {
	sdb_bounds_kind kind;
	size_t n;         /* number of intervals (0 for ALL and EMPTY) */
	sdb_interval *iv; /* n intervals, sorted ascending and disjoint */
} sdb_bounds;

/* Report what the filter's top-level AND (the top-level fields and $and members,
 * recursively) implies for the values of path (a field path exactly as written in the
 * filter, e.g. "a" or "a.b"), as ascending key intervals:
 *   {f: v} / $eq v  -> the point v (v scalar); null and undefined give both; an array or
 *                      regex operand gives ALL (the matcher re-checks);
 *   $in [..]        -> the points of the list (ALL if it contains an array or regex);
 *   $gt/$gte/$lt/$lte -> an interval inside the operand's type bracket
 *                      ({$gt: 5} -> (5, +inf]; {$lt: "m"} -> ["", "m"));
 *   several on one path -> intersected, unless multikey is true: then (MongoDB's rule
 *                      for multikey indexes) only one predicate is used, points first;
 *   $elemMatch value form ({f: {$elemMatch: {$gte: 1, $lt: 5}}}) -> its comparison and
 *                      equality predicates intersected, also on a multikey index.
 * Every other operator ($ne, $nin, $not, $exists, $type, $regex, $or, $expr ...) gives
 * ALL. $expr is accepted and not compiled here (it constrains no path, and may read `let`
 * variables the caller has not given).
 * The bounds are a superset of the matching documents' keys: the caller must still run
 * the matcher on every candidate. Errors: SDB_EINVAL with a message when the
 * filter does not compile (same errors as sdb_matcher_new). Free with sdb_bounds_free
 * (also safe on a zeroed struct). */
int sdb_matcher_bounds(const bson_t *filter, const char *path, bool multikey,
		       sdb_bounds *out, char *err, size_t errlen);
void sdb_bounds_free(sdb_bounds *b);

/* The matcher's $regex compilation of pattern with flags (i m s x, u accepted; PCRE2_UTF),
 * shared with the expression operators $regexMatch/$regexFind/$regexFindAll
 * (pipeline_expr_str.c). The result is PCRE2's pcre2_code (8-bit): the caller frees it
 * with pcre2_code_free. Returns: the compiled pattern, or NULL with *code 51108 (an
 * invalid flag) or 51091 (an invalid pattern: "Regular expression is invalid: <PCRE2's
 * reason>") and the message in err. */
struct pcre2_real_code_8;
struct pcre2_real_code_8 *sdb_regex_compile(const char *pattern, const char *flags, int *code,
					    char *err, size_t errlen);

/* MongoDB's BSON type aliases ("double" 1 ... "decimal" 19, "minKey" -1, "maxKey" 127, as
 * $type and $convert's `to` name them): the code of name (len bytes) in *code. Returns:
 * false when name is no alias. */
bool sdb_bson_type_code(const char *name, size_t len, int *code);
/* Whether code is the number of one of those types. */
bool sdb_bson_type_known(int code);

#endif
