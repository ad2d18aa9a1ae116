/* Find projections (the `projection` argument of find / findAndModify).
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
 *     (storage/matcher.h elem semantics), field left out when none matches.
 * Output field order: the document's own order (MongoDB 4.4+).
 * Refused with MongoDB codes:
 *   31254 "Cannot do exclusion on field F in inclusion projection"
 *   31253 "Cannot do inclusion on field F in exclusion projection"
 *   31250 "Path collision at F" (e.g. {a: 1, "a.b": 1})
 *   2     BadValue: positional "a.$" projection (not supported by stripedb), $meta,
 *         unknown operator "Unknown expression $foo", a literal value other than a
 *         number/bool (computed fields are not supported), a bad $slice argument,
 *         $elemMatch on a dotted path (MongoDB's message "Cannot use $elemMatch
 *         projection on a nested field.").
 */
#ifndef SDB_STORAGE_PROJECTION_H
#define SDB_STORAGE_PROJECTION_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sdb_projection sdb_projection;

/* Compile spec. Returns 0 and *out (free with sdb_projection_free; spec may be freed
 * afterwards), or SDB_EINVAL with *code (may be NULL) and MongoDB's message in err. */
int sdb_projection_new(const bson_t *spec, sdb_projection **out, int *code, char *err,
		       size_t errlen);

/* Apply to doc, appending the projected fields to out (an initialised, normally empty,
 * bson_t owned by the caller). Pure: any thread. Returns 0 (it cannot fail on valid
 * BSON; SDB_EINVAL for nesting beyond SDB_BSON_MAX_DEPTH). */
int sdb_projection_apply(const sdb_projection *p, const bson_t *doc, bson_t *out, char *err,
			 size_t errlen);

/* True for an inclusion projection (fields not named are dropped). */
bool sdb_projection_is_inclusion(const sdb_projection *p);

void sdb_projection_free(sdb_projection *p);

#endif
