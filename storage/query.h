/* The embedded shard's query planner and executor: filter + sort + skip + limit over a
 * collection of storage/store.h, through an index when one helps (issue #4).
 *
 * Planner (deliberately simple, after MongoDB's single-solution cases):
 *   1. a hint ({$natural: 1|-1}, an index name, or a key pattern) forces the plan;
 *      an unknown hint fails with code 2 BadValue "hint provided does not correspond to
 *      an existing index";
 *   2. equality/$in on _id -> point lookups on the collection itself (IXSCAN of "_id_");
 *   3. otherwise the secondary index whose first field has the tightest bounds
 *      (sdb_matcher_bounds: points beat ranges), ties broken by the index that also
 *      provides the sort; a hashed index {f: "hashed"} only for equality / $in on f
 *      (the points' hashes), never for ranges of f nor for a sort (its keys are hashes);
 *   4. otherwise an index (or _id) whose key pattern equals the sort spec (or its exact
 *      reverse) to avoid a blocking sort;
 *   5. otherwise a collection scan (COLLSCAN).
 * The matcher always re-checks every candidate document, so bounds only need to be a
 * superset. A sort the plan does not provide is done in memory (stable, MongoDB order)
 * after filtering; with a limit, only skip + limit documents are kept... not yet: the
 * whole filtered set is held (bounded by the 100 MB blocking-sort limit, error 292).
 *
 * explain (find/count/aggregate/... {explain: ...}): queryPlanner.winningPlan is
 *   {stage: "IXSCAN", indexName, keyPattern, direction: "forward"|"backward",
 *    isMultiKey: true}  or  {stage: "COLLSCAN", direction}
 * with `sortStage: true` when an in-memory sort follows; executionStats has nReturned,
 * totalKeysExamined, totalDocsExamined, executionTimeMillis.
 */
#ifndef SDB_STORAGE_QUERY_H
#define SDB_STORAGE_QUERY_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "storage/store.h"

typedef struct sdb_query sdb_query;

typedef struct sdb_query_spec {
	const bson_t *filter; /* NULL = {} */
	const bson_t *sort;   /* NULL or {} = none */
	const bson_iter_t *hint; /* NULL = none; a string (index name) or a document */
	int64_t skip;         /* >= 0 */
	int64_t limit;        /* 0 = no limit */
	size_t max_sort_bytes; /* 0 = 100 MB */
	/* Orphan filter (issue #17): when owns is set, a document that matches the filter is
	 * returned only if owns(owns_arg, doc) is true (the shard owns its shard key). The
	 * query takes owns_arg and releases it with owns_free (when set) in sdb_query_free,
	 * also when sdb_query_open fails. */
	bool (*owns)(void *owns_arg, const bson_t *doc);
	void *owns_arg;
	void (*owns_free)(void *owns_arg);
	/* Key range (issue #17, a migration reading one chunk): when range_field is set and no
	 * hint is given, the plan scans the index whose FIRST field is range_field (the _id
	 * index for "_id"; a secondary index neither sparse nor multikey, its pattern
	 * preferred when it also gives the sort) over the first-component values from
	 * range_lo (inclusive; NULL = from the start) to range_hi (inclusive when
	 * range_hi_incl, else exclusive; NULL = to the end), in the index's own value order
	 * (storage/keyenc.h: MongoDB's cross-type order, no type bracketing). Bounds are a
	 * superset: the caller's exact check is owns. Without such an index the plan is
	 * chosen as without a range (owns still filters). */
	const char *range_field;
	const bson_value_t *range_lo, *range_hi;
	bool range_hi_incl;
	/* The range is over the hashes of range_field (a hashed shard key's chunk: NumberLong
	 * bounds): only a hashed index {range_field: "hashed"} serves it (keys compared as
	 * NumberLongs); without one the plan is chosen as without a range. */
	bool range_hashed;
	/* User variables the filter's $expr may read ({name: constant}, the command's `let`
	 * after sdb_let_parse, storage/pipeline.h), or NULL. Copied by sdb_query_open. */
	const bson_t *let;
} sdb_query_spec;

/* Plan and open a query over db.coll in the connection's open transaction. A missing
 * collection is an empty result. Returns 0 and *out (free with sdb_query_free before the
 * transaction ends). Errors: message in err; SDB_EINVAL with *code (2, 9, 14, 15975,
 * 51108, ...) for a filter, sort, projection or hint MongoDB refuses; SDB_EINVAL or
 * SDB_EIO with *code 1 when the store's scan cannot be opened. */
int sdb_query_open(sdb_store_conn *c, const char *db, const char *coll,
		   const sdb_query_spec *spec, sdb_query **out, int *code, char *err,
		   size_t errlen);

/* Next result: 1 with *doc (borrowed, valid until the next call), 0 at the end. Errors:
 * message in err; SDB_ETOOBIG with *code 292 (a blocking sort over its memory limit),
 * SDB_EINVAL with the expression's *code (a $expr evaluation failed), SDB_ECORRUPT or
 * SDB_EIO with *code 1 (storage). */
int sdb_query_next(sdb_query *q, const bson_t **doc, int *code, char *err, size_t errlen);

/* Append the explain sections for this query: queryPlanner {namespace, parsedQuery,
 * winningPlan, rejectedPlans: []} and, when stats is true, executionStats. Drain the
 * query (sdb_query_next until 0) first for exact stats. */
void sdb_query_explain(const sdb_query *q, bool stats, bson_t *out);

/* Whether q's plan reads at most max_points documents whatever the data: it looks up at
 * most max_points _id values in the _id index (an equality or a short $in on _id, planned
 * without a hint or a keyRange), or its bounds proved nothing matches. A shard runs such a
 * read on its event loop thread (src/shard/pool.c shard_pool_run_inline): its cost does
 * not grow with the collection. */
bool sdb_query_is_point(const sdb_query *q, size_t max_points);

/* Counters so far. */
void sdb_query_stats(const sdb_query *q, int64_t *n_returned, int64_t *keys, int64_t *docs);

/* Process-wide totals of keys and documents examined, and documents returned, by every
 * query freed so far (each query adds its sdb_query_stats at sdb_query_free): the shard's
 * stripedb_shard_{keys,docs}_examined_total and stripedb_shard_docs_returned_total. */
void sdb_query_totals(uint64_t *keys, uint64_t *docs, uint64_t *returned);

void sdb_query_free(sdb_query *q);

#endif
