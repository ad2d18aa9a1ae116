/* Dotted paths with MongoDB's array semantics (matcher, index keys, sort keys).
 *
 * Source of the behaviour: MongoDB manual "Query an Array", "Query on Embedded/Nested
 * Documents", "Query an Array of Embedded Documents", "Multikey Indexes" and
 * "Comparison/Sort Order" (arrays), mongo/db/matcher/path.cpp (BSONElementIterator).
 *
 * A path is a dotted string of components ("a.b.0.c").
 * Walking a path through a document:
 *   - a component on a document looks the field up; a missing field ends that branch as
 *     MISSING; a scalar (non-document, non-array) before the last component also ends the
 *     branch as MISSING ({a: 5} and path "a.b": b is missing);
 *   - a component on an array that is not at the end of the path does two things: when
 *     the component is a decimal index ("0", "12", no sign, no leading zero) it continues
 *     with the element at that index (if present); and it continues into every element
 *     that is a document (field lookup by name, so {a: [{"0": 1}]} reaches 1 via "a.0").
 *     Documents that lack the field report MISSING, except for index components;
 *     scalar and array elements are skipped (nested arrays are not traversed by name);
 *   - at the end of the path, the value is reported; when it is an array and the walk
 *     expands leaf arrays (SDB_PATH_EXPAND_LEAF), the array itself is reported and then
 *     each of its elements (flag SDB_PATH_ELEM); nested arrays are not expanded further.
 */
#ifndef SDB_STORAGE_PATH_H
#define SDB_STORAGE_PATH_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "storage/keyenc.h"

/* Walk options. */
#define SDB_PATH_EXPAND_LEAF 0x1u /* report the elements of an array found at the leaf */

/* Flags given to the visitor. */
#define SDB_PATH_MISSING 0x1u /* it is NULL: the path is missing on this branch */
#define SDB_PATH_ELEM 0x2u    /* it is an element of a leaf array expanded by the walk */
#define SDB_PATH_VIA_ARRAY 0x4u /* an array was traversed at a non-leaf component */

/* Visitor: return true to stop the walk early (e.g. "found a match"). it (when not NULL)
 * is valid only during the call; it points into the walked document. */
typedef bool (*sdb_path_visit_fn)(void *ctx, const bson_iter_t *it, unsigned flags);

/* Walk path through doc, calling fn for every value reached (see top). Returns true when
 * the visitor stopped the walk, false when it ran to the end. A path that reaches
 * nothing at all (only possible through arrays without sub-documents: {a: [1, 2]} or
 * {a: []} and "a.b") calls fn with nothing: the matcher treats that as "no value but not
 * missing" ({"a.b": null} does not match, MongoDB 5.0+), sort and index keys as null. Recursion is bounded by the number of path components.
 * Any path string is accepted (the matcher may query odd names): an empty component
 * looks up the empty field name; a path of more than 256 components reports nothing.
 * Callers that need a proper field path validate with sdb_path_valid. */
bool sdb_path_walk(const bson_t *doc, const char *path, unsigned opts, sdb_path_visit_fn fn,
		   void *ctx);

/* Same, starting from an element that is a document (or array) value. */
bool sdb_path_walk_iter(const bson_iter_t *container, const char *path, unsigned opts,
			sdb_path_visit_fn fn, void *ctx);

/* The most components a field path may have (MongoDB: FieldPath's length is at most
 * BSONDepth::getMaxAllowableDepth(), 200, else Overflow, 15, "FieldPath is too long").
 * Projections and expressions refuse longer paths when they are parsed, so nothing recurses
 * once per component of an unbounded path. */
#define SDB_PATH_MAX_COMPONENTS 200
#define SDB_ERR_PATH_TOO_LONG 15

/* The number of components of path ("a.b.c": 3). */
static inline size_t sdb_path_components(const char *path)
{
	size_t n = 1;

	for (; *path; path++)
		n += *path == '.';
	return n;
}

/* True when path is a valid field path: non-empty, no empty component, at most
 * 255 components, no component starting with '$'. On false, err says why
 * (MongoDB's messages: "FieldPath cannot be constructed with empty string",
 * "FieldPath field names may not be empty strings.", "FieldPath field names may not start
 * with '$'."). */
bool sdb_path_valid(const char *path, char *err, size_t errlen);

/* The sort key of one document for one path (MongoDB sort semantics): among all values
 * the path reaches with leaf arrays expanded into their elements, the smallest (asc) or
 * the largest (desc, sdb_bson_cmp order); missing anywhere counts as null; an empty leaf
 * array counts as undefined (below null, MongoDB: "treats the empty array as less than
 * null or a missing field"). *out is a shallow copy pointing into doc (or a constant
 * null/undefined value): valid while doc is. */
void sdb_path_sort_value(const bson_t *doc, const char *path, bool desc, bson_value_t *out);

/* Index keys of one document for a (possibly compound) index (MongoDB multikey rules):
 * for each field, the values the path reaches with leaf arrays expanded to their
 * elements (an empty array gives undefined; missing gives null; the leaf array itself is
 * not a key), the cartesian product across fields, each key the concatenation of the
 * fields' encodings (storage/keyenc.h, desc per field), sorted by sdb_key_cmp and
 * deduplicated.
 *   paths/desc: nfields entries (1..32).
 *   *keys: heap array of *nkeys sdb_key (caller frees with sdb_index_keys_free).
 *   *multikey: true when any field traversed or expanded an array.
 * Errors: SDB_EINVAL with *code 171 (CannotIndexParallelArrays) and MongoDB's message
 * "cannot index parallel arrays [b] [a]" when two fields of the index reach arrays;
 * SDB_EINVAL with *code 2 for a bad path or a document nested too deeply.
 * On error *keys is NULL and *nkeys 0. */
int sdb_index_keys(const bson_t *doc, const char *const *paths, const bool *desc, size_t nfields,
		   sdb_key **keys, size_t *nkeys, bool *multikey, int *code, char *err,
		   size_t errlen);
void sdb_index_keys_free(sdb_key *keys, size_t nkeys);

#endif
