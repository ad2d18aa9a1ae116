/* Merging shard results on the proxy: sort order, k-way pick, skip/limit windows.
 *
 * Source of the behaviour: MongoDB's sharded query merge (mongos AsyncResultsMerger):
 * each shard returns its results already sorted by the query's sort; the proxy merges the
 * sorted streams, and applies skip and limit after the merge (the shards got limit+skip
 * pushed down). Sort order: MongoDB manual cursor.sort() and "Comparison/Sort Order": per
 * field, the path's sort value (storage/path.h sdb_path_sort_value: smallest array element
 * ascending, largest descending, missing == null), compared with sdb_bson_value_cmp; ties
 * fall through to the next field; full ties keep stream order (lowest stream first), so
 * the merge is deterministic.
 */
#ifndef SDB_PROXY_MERGE_H
#define SDB_PROXY_MERGE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MERGE_MAX_SORT_FIELDS 32

typedef struct merge_sort merge_sort;

/* Parse a sort spec ({a: 1, "b.c": -1}); values 1/-1 as int32, int64 or double.
 * {$natural: ...} and {} parse as "no order" (nfields 0). Returns 0 and *out (free with
 * merge_sort_free). Errors: SDB_EINVAL with MongoDB's message ("$sort key ordering must be
 * 1 (for ascending) or -1 (for descending)", code 15975, in *code when code is not NULL;
 * code 2 for an empty field name or more than MERGE_MAX_SORT_FIELDS fields). */
int merge_sort_parse(const bson_t *spec, merge_sort **out, int *code, char *err, size_t errlen);
void merge_sort_free(merge_sort *s);
size_t merge_sort_nfields(const merge_sort *s);
const char *merge_sort_path(const merge_sort *s, size_t i);

/* Strings compare under coll (storage/collation.h), the command's collation (issue #20):
 * merge_sort_cmp uses it whatever thread merges (a cursor's getMore); without one (the
 * default) it compares under the calling thread's collation. */
typedef struct sdb_collator sdb_collator;
void merge_sort_set_collation(merge_sort *s, const sdb_collator *coll);

/* Returns: <0 when a sorts before b, 0 tie, >0 after. s may be NULL (every pair ties). */
int merge_sort_cmp(const merge_sort *s, const bson_t *a, const bson_t *b);

/* Index of the head that comes first (heads[i] NULL = stream i has nothing buffered and is
 * finished; ties go to the lowest index), or -1 when every head is NULL. */
ssize_t merge_pick(const merge_sort *s, const bson_t *const *heads, size_t n);

/* What a count with skip and limit returns for total matching documents (MongoDB count:
 * limit 0 = no limit, a negative limit counts as its absolute value; INT64_MIN, which
 * callers refuse, counts as INT64_MAX rather than overflowing). */
int64_t merge_count_window(int64_t total, int64_t skip, int64_t limit);

/* The limit to push down to each shard for a find with skip and limit (limit + skip, or
 * 0 = none when limit is 0; a negative limit counts as its absolute value, INT64_MIN as
 * INT64_MAX). Saturates instead of overflowing. */
int64_t merge_pushdown_limit(int64_t skip, int64_t limit);

/* A set of distinct values (MongoDB distinct: values equal under sdb_bson_value_cmp are one
 * value, so 1 and 1.0 are one; under the calling thread's collation, common/bsonval.h, so
 * a distinct with a collation dedups by it), kept sorted: O(log n) lookups. Values are
 * copied. */
typedef struct merge_distinct merge_distinct;
merge_distinct *merge_distinct_new(void);
void merge_distinct_free(merge_distinct *d);
/* Add the values reached by path in doc (array leaves expand into their elements, as
 * MongoDB's distinct does). */
void merge_distinct_add_doc(merge_distinct *d, const bson_t *doc, const char *path);
void merge_distinct_add_value(merge_distinct *d, const bson_value_t *v);
/* Append the values, sorted in MongoDB order, as array field name of out. */
void merge_distinct_append(merge_distinct *d, bson_t *out, const char *name);
size_t merge_distinct_count(const merge_distinct *d);

#endif
