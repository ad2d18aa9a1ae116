/* The projection engine: find projections (the `projection` argument of find /
 * findAndModify) and the aggregation stages that reshape documents ($project, $unset,
 * $addFields/$set; storage/pipeline.c compiles them here), one parse into a path tree and
 * one pass over the input BSON (MongoDB's projection_ast / projection_executor: one engine
 * for both, with find's and aggregation's differences as policies of the kind).
 *
 * Every kind takes computed fields (MongoDB 4.4+ find projections too): any value other
 * than a number/bool flag, or an object whose first key is an operator, is an aggregation
 * expression (storage/pipeline_expr.c). Only find has the $slice / $elemMatch projection
 * operators (in aggregation those names are expressions). Inclusion puts
 * computed fields after the included ones in specification order; $addFields replaces an
 * existing field in place and appends new ones; a computed path through a scalar or a
 * missing field makes documents, and through an array applies to each element; nested
 * arrays are recursed into by both (MongoDB's default ArrayRecursionPolicy, which
 * findProjectionPolicies and aggregateProjectionPolicies share). Parse errors of $project carry
 * MongoDB's "Invalid $project :: caused by :: " prefix; 31252 refuses an expression in an
 * exclusion.
 *
 * Find:
 *
 * Source of the behaviour: MongoDB manual "Project Fields to Return from Query" and
 * "Projection" reference (https://www.mongodb.com/docs/manual/reference/method/db.collection.find/#projection),
 * $slice and $elemMatch projection operators.
 *
 * Supported:
 *   - inclusion {a: 1, "b.c": true} (values: true, or any number other than 0) and
 *     exclusion {a: 0, "b.c": false}; _id is included unless {_id: 0}; _id: 0/1 may be
 *     combined with either mode; {} returns the whole document;
 *   - dotted paths through sub-documents and arrays of sub-documents (an inclusion of
 *     "a.b" on {a: [{b: 1, c: 2}, 3]} gives {a: [{b: 1}]}: non-document array elements are
 *     dropped by inclusion, kept by exclusion);
 *   - {a: {$slice: N}} / {$slice: [skip, limit]} (negative counts from the end) on arrays
 *     (non-arrays returned as is); $slice alone keeps every other field (exclusion mode);
 *   - {a: {$elemMatch: cond}}: the first element of the top-level array a matching cond
 *     (storage/matcher.h elem semantics), field left out when none matches;
 *   - computed fields {a: "$b.c", n: {$size: "$arr"}, k: "literal"} in an inclusion.
 * Output field order: the document's own order (MongoDB 4.4+), computed fields last.
 * Refused with MongoDB codes:
 *   31254 "Cannot do exclusion on field F in inclusion projection"
 *   31253 "Cannot do inclusion on field F in exclusion projection"
 *   31250 "Path collision at F" (e.g. {a: 1, "a.b": 1})
 *   40352 "FieldPath field names may not be empty strings."
 *   16410 a path component starting with '$'
 *   31252 an expression in an exclusion projection
 *   168   an unknown expression operator ("Unrecognized expression '$foo'")
 *   2     BadValue: positional "a.$" projection (not supported by stripedb), $meta
 *         (not supported by stripedb), a bad $slice argument, $elemMatch on a dotted path
 *         (MongoDB's message "Cannot use $elemMatch projection on a nested field.").
 */
#ifndef SDB_STORAGE_PROJECTION_H
#define SDB_STORAGE_PROJECTION_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sdb_projection sdb_projection;

/* What a specification is, and so how it is read and applied. */
typedef enum {
	SDB_PROJECTION_FIND = 0,   /* find/findAndModify: flags, $slice, $elemMatch */
	SDB_PROJECTION_PROJECT,    /* aggregation $project (and $unset as {path: 0, ...}) */
	SDB_PROJECTION_ADD_FIELDS, /* aggregation $addFields/$set: every leaf computed */
} sdb_projection_kind;

/* Compile spec as kind. Returns 0 and *out (free with sdb_projection_free; spec may be
 * freed afterwards). Errors: SDB_EINVAL with *code (may be NULL) and MongoDB's message in
 * err.
 * An empty spec is accepted (the pipeline refuses an empty $project/$addFields itself). */
int sdb_projection_new_kind(const bson_t *spec, sdb_projection_kind kind, sdb_projection **out,
			    int *code, char *err, size_t errlen);

/* sdb_projection_new_kind with user variables in scope for computed fields: vars
 * ({name: constant}, see sdb_let_parse in pipeline.h; may be NULL) is copied where used.
 * Errors: as sdb_projection_new_kind (SDB_EINVAL with *code), and 17276 for a $$name that
 * vars does not define. */
int sdb_projection_new_vars(const bson_t *spec, sdb_projection_kind kind, const bson_t *vars,
			    sdb_projection **out, int *code, char *err, size_t errlen);

/* Compile spec as a find projection (sdb_projection_new_kind with SDB_PROJECTION_FIND).
 * Returns 0 and *out (free with sdb_projection_free; spec may be freed afterwards).
 * Errors: SDB_EINVAL with *code (may be NULL) and MongoDB's message in err. */
int sdb_projection_new(const bson_t *spec, sdb_projection **out, int *code, char *err,
		       size_t errlen);

/* Apply to doc, appending the projected fields to out (an initialised, normally empty,
 * bson_t owned by the caller; on an error it holds a partial result the caller destroys).
 * Pure: any thread. Errors: SDB_EINVAL with *code (may be NULL) and the message in
 * err: nesting beyond SDB_BSON_MAX_DEPTH or corrupt BSON (2), or a computed field's
 * evaluation error (the expression's MongoDB code). A find projection cannot fail on valid
 * BSON within the depth limit. */
int sdb_projection_eval(const sdb_projection *p, const bson_t *doc, bson_t *out, int *code,
			char *err, size_t errlen);

/* sdb_projection_eval without the code. Errors: as sdb_projection_eval (SDB_EINVAL). */
int sdb_projection_apply(const sdb_projection *p, const bson_t *doc, bson_t *out, char *err,
			 size_t errlen);

/* True for an inclusion projection (fields not named are dropped). */
bool sdb_projection_is_inclusion(const sdb_projection *p);

void sdb_projection_free(sdb_projection *p);

#endif
