/* Sort specifications ({a: 1, "b.c": -1}) for find, aggregate $sort and the proxy's merge.
 *
 * Source of the behaviour: MongoDB manual cursor.sort() and "Comparison/Sort Order":
 * each field sorts by the path's sort value (storage/path.h sdb_path_sort_value: the
 * smallest array element for ascending, the largest for descending, missing == null,
 * empty array below null), values compared with sdb_bson_cmp; ties fall through to the
 * next field; full ties keep the caller's order (use a stable sort).
 * {$natural: 1|-1} alone means storage order (no comparison); it cannot be mixed with
 * other fields.
 */
#ifndef SDB_STORAGE_SORTSPEC_H
#define SDB_STORAGE_SORTSPEC_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "storage/keyenc.h"

typedef struct sdb_sortspec sdb_sortspec;

/* Parse spec. Values must be 1 or -1 (int32, int64 or a whole double). Returns 0 and
 * *out (free with sdb_sortspec_free; spec may be freed afterwards). Errors: SDB_EINVAL
 * with *code (may be NULL) and MongoDB's message in err:
 *   15975 "$sort key ordering must be 1 (for ascending) or -1 (for descending)"
 *   40352 "FieldPath cannot be constructed with empty string"
 *   2     BadValue: {$meta: ...} (not supported), $natural mixed with fields, a field
 *         name starting with '$', more than 32 fields.
 * An empty spec {} is valid and compares every pair equal. */
int sdb_sortspec_parse(const bson_t *spec, sdb_sortspec **out, int *code, char *err,
		       size_t errlen);
void sdb_sortspec_free(sdb_sortspec *s);

/* Number of sort fields (0 for {} and for $natural). */
size_t sdb_sortspec_nfields(const sdb_sortspec *s);
/* Field i's path (owned by s) and direction, i < nfields. Returns: (dir) 1 or -1. */
const char *sdb_sortspec_path(const sdb_sortspec *s, size_t i);
int sdb_sortspec_dir(const sdb_sortspec *s, size_t i);
/* Returns: 0 unless the spec is {$natural: d}: then d (1 or -1). */
int sdb_sortspec_natural(const sdb_sortspec *s);

/* Compare two documents. Returns: <0 when a sorts before b, 0 tie, >0 after (never an
 * error). Any thread. */
int sdb_sortspec_cmp(const sdb_sortspec *s, const bson_t *a, const bson_t *b);

/* Build a memcmp-ordered sort key for doc into out (appended; reset it first): comparing
 * two keys with sdb_key_cmp gives the same order as sdb_sortspec_cmp (exact, decimals
 * included). Useful to sort many documents once or to merge sorted streams.
 * Errors: SDB_EINVAL (nesting deeper than SDB_BSON_MAX_DEPTH, corrupt nested BSON). */
int sdb_sortspec_key(const sdb_sortspec *s, const bson_t *doc, sdb_key *out, char *err,
		     size_t errlen);

#endif
