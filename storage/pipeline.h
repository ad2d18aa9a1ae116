/* The aggregation pipeline engine of the embedded shard.
 *
 * A pipeline (the `pipeline` array of the MongoDB `aggregate` command,
 * https://www.mongodb.com/docs/manual/reference/operator/aggregation-pipeline/) is parsed
 * once into an sdb_pipeline, then run as a pull-based cursor over an input iterator that
 * the store supplies (the collection scan or index scan). Stages are iterators: streaming
 * stages ($match $project $addFields/$set $unset $limit $skip $unwind) pass documents one
 * at a time; blocking stages ($sort $group $count $sortByCount $bucket $bucketAuto $facet)
 * consume their input on the first pull.
 *
 * Stages: $match (the query matcher; $expr is evaluated with the expression
 * engine below), $project (inclusion, exclusion, computed fields, nested specs), $addFields /
 * $set, $unset, $sort (stable; followed by $limit it keeps only the top documents, as
 * MongoDB does), $limit, $skip, $group, $count, $unwind (string form and
 * {path, includeArrayIndex, preserveNullAndEmptyArrays}), $sortByCount, $bucket (a $group
 * on a $switch over the boundaries, then a $sort on _id, as MongoDB desugars it:
 * pipeline_bucket.c), $facet (sub-pipelines over its whole input, one output document of
 * at most 16 MiB: pipeline_facet.c), $replaceRoot / $replaceWith, $bucketAuto (MongoDB
 * 6.0's DocumentSourceBucketAuto: its input sorted by groupBy, about documents/buckets per
 * bucket, equal values never split, {_id: {min, max}}, output accumulators, granularity:
 * pipeline_bucketauto.c and run_bucket_auto in pipeline.c), $unionWith (its input, then
 * another collection's documents through a sub-pipeline, read by the caller's
 * sdb_pipeline_opts.foreign: pipeline_lookup.c), $lookup (equality, pipeline with let,
 * and the two combined: the same reader, once per distinct foreign read in a cursor),
 * $graphLookup (MongoDB 6.0's DocumentSourceGraphLookUp: a breadth-first search of another
 * collection through the same reader, one read per round: pipeline_graph.c), $sample
 * (DocumentSourceSample: size documents without replacement, uniformly, by a random key
 * per document and a bounded heap of the size smallest: pipeline_sample.c), $redact
 * (DocumentSourceRedact: $$DESCEND / $$PRUNE / $$KEEP, recursing into subdocuments and
 * arrays of them with $$CURRENT the subdocument and $$ROOT the document: pipeline_redact.c).
 * Expressions: field paths ("$a.b", mapped over arrays as MongoDB does), $$ROOT, $$CURRENT,
 * $$REMOVE, literals, {$literal: v}, documents and arrays of expressions, and the operators
 * $add $subtract $multiply $divide $mod (int32 -> int64 -> double widening; dates in $add and
 * $subtract), $concat $toUpper $toLower, $cond (array and document forms) $ifNull, $eq $ne
 * $gt $gte $lt $lte $cmp (MongoDB's comparison order; missing sorts below null), $and $or
 * $not, $size $in $arrayElemAt $abs, $sum $avg $min $max $stdDevPop $stdDevSamp (expression
 * forms: over one array argument or over the arguments), $type $isArray $concatArrays $floor $ceil $strLenBytes
 * $substrBytes/$substr $toString $switch. Decimal128 operands give Decimal128 results as
 * in MongoDB 6.0 ($add $subtract $multiply $divide $mod $abs $floor $ceil, $sum and $avg in
 * both forms; doubles mixed in converted as mongod does: storage/decimal.h).
 * Variables ($let $map $filter $reduce: $$name[.path], $$this, $$value: pipeline_expr_var.c),
 * arrays and sets ($slice $reverseArray $range $indexOfArray $zip $first $last
 * $allElementsTrue $anyElementTrue $setUnion $setIntersection $setDifference $setEquals
 * $setIsSubset $sortArray, the array forms of $maxN $minN $firstN $lastN:
 * pipeline_expr_array.c) and objects ($mergeObjects $objectToArray
 * $arrayToObject $getField $setField $unsetField: pipeline_expr_obj.c), MongoDB 6.0's.
 * Numeric, string, conversion and date operators (storage/pipeline_expr_ext.c and its
 * family files, pipeline_ext.h): $round $trunc $exp $ln $log $log10 $pow $sqrt $isNumber,
 * $split $trim $ltrim $rtrim $indexOfBytes $indexOfCP $strLenCP $substrCP $strcasecmp
 * $replaceOne $replaceAll $regexMatch $regexFind $regexFindAll, $convert $toInt $toLong
 * $toDouble $toDecimal $toBool $toString $toObjectId $toDate, $year $month $dayOfMonth
 * $dayOfWeek $dayOfYear $hour $minute $second $millisecond $week $isoWeek $isoWeekYear
 * $isoDayOfWeek $dateToString $dateToParts $dateFromParts $dateFromString $dateAdd
 * $dateSubtract $dateDiff $dateTrunc (time zones: UTC and fixed offsets; another Olson name
 * is 238; $exp/$ln/$log/$log10/$pow/$sqrt of a Decimal128 are 238).
 * $group accumulators: $sum $avg $min $max $first $last $push $addToSet $count $stdDevPop
 * $stdDevSamp ($sum/$avg: MongoDB's compensated double-double sum, a Decimal128 when a
 * decimal was added; $stdDevPop/$stdDevSamp: AccumulatorStdDev's Welford over doubles). Groups are
 * keyed by the order-preserving encoding of _id (storage/keyenc.h), so 1, 1.0 and
 * NumberLong(1) are one group; groups come out in first-seen order.
 *
 * Errors use MongoDB's codes and messages, among them:
 *   40324 "Unrecognized pipeline stage name: '$foo'"
 *   40323 "A pipeline stage specification object must contain exactly one field."
 *   14    TypeMismatch: a stage that is not a document
 *   168   InvalidPipelineOperator "Unrecognized expression '$foo'"
 *   17276 "Use of undefined variable: x"
 *   15955 "a group specification must include an _id"
 *   40234 "The field 'x' must be an accumulator object"; 15952 unknown group operator
 *   15976 "$sort stage must have at least one sort key"; 15975 bad sort direction
 *   15958 "the limit must be positive"; 15957/15972 $limit/$skip not a number;
 *   5107200 negative $skip
 *   40156-40160 $count field name rules; 28808-28822 $unwind options
 *   31253/31254 $project mixing inclusion and exclusion; 31250 path collision
 *   16554/16555/16556/16609 arithmetic type errors; 16608 "can't $divide by zero";
 *   17124 $size of a non-array; 16702 $concat of a non-string; 16020 wrong argument count
 *   40228 $replaceRoot to a non-document
 *   40060-40068 $switch's form; 40066 no branch matched and no default
 *   40169-40171, 40600 $facet's form and the stages it may not hold; 4031700 its
 *        output over 16 MiB
 *   40191-40202 $bucket's options (boundaries constant, of one type, ascending; default
 *        outside them)
 *   40239-40246, 40257, 40261 $bucketAuto's options; 40258-40260 a groupBy value under a
 *        granularity (not a number, NaN, negative)
 *   292  QueryExceededMemoryLimitNoDiskUseAllowed: a $sort, $group or $bucketAuto holds more than
 *        max_memory_bytes (default 100 MB, MongoDB's internalQueryMaxBlockingSortMemoryUsage
 *        and internalDocumentSourceGroupMaxMemoryBytes); we never spill to disk, so
 *        allowDiskUse does not lift the limit.
 *   28745-28749 $sample's form; 17053 $redact's expression returned something else than
 *        $$KEEP, $$PRUNE or $$DESCEND
 *   238  NotImplemented: a stage MongoDB knows but the embedded shard does not run
 *        ($geoNear, ...): "$geoNear is not supported by the embedded
 *        shard"; $unionWith/$lookup without a foreign reader in the options; $rand (expressions are deterministic: shard members
 *        replicate commands)
 *   40601 $out or $merge: the caller runs a last one itself (common/aggwrite.h), so
 *        the engine sees one only before the last stage
 *   40602 $documents or $collStats anywhere but first (the shard runs a leading one
 *        itself: src/shard/cmd_read.c)
 *   16866-16868, 4890500 a `let` variable's name or value (sdb_let_parse)
 *   9, 14, 40415, 31441 $unionWith's form and its sub-pipeline; 9, 51047, 4568 $lookup's
 *        (pipeline_lookup.c)
 *   9, 73, 40100-40105, 40185, 13111 $graphLookup's form; 40271 a foreign document
 *        without _id; 40099 its search over max_memory_bytes (pipeline_graph.c)
 *
 * Threading: an sdb_pipeline is immutable after parse/pushdown and may back several
 * cursors at once; one cursor is used by one thread at a time.
 */
#ifndef SDB_STORAGE_PIPELINE_H
#define SDB_STORAGE_PIPELINE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sdb_pipeline sdb_pipeline;
typedef struct sdb_pipeline_cursor sdb_pipeline_cursor;

/* Default memory bound of one blocking stage ($sort, $group, $bucketAuto): 100 MB. */
#define SDB_PIPELINE_MAX_MEMORY (100u * 1024u * 1024u)

/* The input iterator the store supplies.
 * Return 1 with *doc pointing at the next input document (borrowed: it must stay valid
 * until the next call of next or until the cursor is freed), 0 at the end of the input
 * (then next is not called again), or a negative SDB_E* code with a message in err (the
 * cursor then fails with code 1 InternalError and that message, unless *code was set to a
 * MongoDB code by the callback). */
typedef int (*sdb_pipeline_next_fn)(void *ctx, const bson_t **doc, int *code, char *err,
				    size_t errlen);

/* The documents of another collection, for $unionWith and $lookup: an input iterator (next
 * and ctx as sdb_pipeline_next_fn's contract) and close (called once, on ctx, when the
 * stage is done with it or its cursor is freed; may be NULL). */
typedef struct sdb_pipeline_source {
	sdb_pipeline_next_fn next;
	void (*close)(void *ctx);
	void *ctx;
} sdb_pipeline_source;

/* How the engine reads another collection (the caller's job: the shard reads its own store
 * in the same transaction, the proxy runs an aggregate through its routing): open the
 * output of the pipeline stages (a BSON array of stage documents, possibly empty) over the
 * collection coll of the same database, with the user variables let ({name: value}, already
 * evaluated: constants, to be read as $$name; never NULL) in scope. arg is
 * sdb_pipeline_opts.foreign_arg. On success fill *out (its close is called exactly once).
 * Errors: any negative SDB_E* code with MongoDB's *code and the message in err (the stage
 * fails with them); out is then not used. */
typedef int (*sdb_pipeline_foreign_fn)(void *arg, const char *coll, const bson_t *stages,
				       const bson_t *let, sdb_pipeline_source *out, int *code,
				       char *err, size_t errlen);

typedef struct sdb_pipeline_opts {
	/* Bound on the bytes held by one $sort, $group or $bucketAuto (BSON sizes of held
	 * documents and group states), and by one $graphLookup search (the documents reached
	 * for one input document plus the next frontier); 0 means SDB_PIPELINE_MAX_MEMORY. */
	size_t max_memory_bytes;
	/* User variables ({name: constant}, sdb_let_parse) the stages' expressions and $match's
	 * $expr may read as $$name; NULL = none. Copied where used. */
	const bson_t *let;
	/* Reads another collection for $unionWith, $lookup and $graphLookup (and the
	 * sub-pipelines of $facet, $unionWith and $lookup get it too); NULL: those stages are
	 * refused (238). */
	sdb_pipeline_foreign_fn foreign;
	void *foreign_arg;
	/* How deep this pipeline is nested as a $lookup / $unionWith sub-pipeline (0: the
	 * command's own; $facet's pipelines are at their stage's depth, as in mongod): a
	 * sub-pipeline deeper than SDB_PIPELINE_MAX_SUB_DEPTH fails the parse with 232
	 * MaxSubPipelineDepthExceeded, as mongod's ExpressionContext::subPipelineDepth. */
	int sub_depth;
	/* $sample across processes (the proxy's sharded $sample, src/proxy/read.c): with
	 * sample_key_out (a shard answering the proxy's $stripedbSampleKey) a $sample that is
	 * the pipeline's last stage emits each document with its random key, a double in
	 * [0, 1), in the field SDB_PIPELINE_SAMPLE_KEY; with sample_key_in (the proxy) a $sample
	 * takes an input document's key from that field (and removes it) instead of drawing
	 * one. The merger's $sample over the shards' samples of size N then keeps the N
	 * smallest keys of the union: a uniform sample of the whole collection. */
	bool sample_key_out;
	bool sample_key_in;
} sdb_pipeline_opts;

/* The field carrying a document's $sample key between a shard and the proxy. */
#define SDB_PIPELINE_SAMPLE_KEY "$stripedbSampleKey"

/* mongod 6.0's kMaxSubPipelineDepth (DocumentSourceLookUp, DocumentSourceUnionWith). */
#define SDB_PIPELINE_MAX_SUB_DEPTH 20

/* Parse a pipeline.
 * stages: a BSON array of stage documents (the value of the command's `pipeline` field,
 * as a bson_t read from the array). opts may be NULL. On success *out is the new pipeline
 * (free with sdb_pipeline_free).
 * Errors: SDB_EINVAL with *code (40324, 40323, 14, 168, 15955, ...) and the message in err
 * (errlen bytes, always NUL-terminated).
 */
int sdb_pipeline_parse(const bson_t *stages, const sdb_pipeline_opts *opts, sdb_pipeline **out,
		       int *code, char *err, size_t errlen);

void sdb_pipeline_free(sdb_pipeline *p);

/* p's first stage (after sdb_pipeline_pushdown: the first stage not pushed down).
 * Returns: its size when it is a $sample, else -1. */
int64_t sdb_pipeline_first_sample(const sdb_pipeline *p);

/* What the store can do itself (flags for sdb_pipeline_pushdown). */
enum {
	SDB_PUSHDOWN_MATCH = 1 << 0, /* filter the input with a query filter */
	SDB_PUSHDOWN_SORT = 1 << 1,  /* deliver the input in a sort order */
	SDB_PUSHDOWN_LIMIT = 1 << 2, /* skip and limit the (sorted) input */
};

/* The leading part of a pipeline handed to the store (all members owned by the struct;
 * release with sdb_pipeline_pushdown_destroy). */
typedef struct sdb_pipeline_pushdown_t {
	bson_t filter; /* query filter; empty document = match everything */
	bson_t sort;   /* sort spec {a: 1, b: -1}; empty = input order does not matter */
	int64_t skip;  /* documents to skip after filter and sort; 0 = none */
	int64_t limit; /* at most this many documents after skip; -1 = no limit */
} sdb_pipeline_pushdown_t;

/* Remove from the front of p the stages the store will execute, and describe them in *pd
 * (pd uninitialised, always initialised: release with sdb_pipeline_pushdown_destroy):
 * every leading $match (several are ANDed: {$and: [f1, f2]}; $expr included) when
 * SDB_PUSHDOWN_MATCH; then
 * a $sort when SDB_PUSHDOWN_SORT; then, after a pushed $sort only, the following run of
 * $skip/$limit stages folded into one (skip, limit) when SDB_PUSHDOWN_LIMIT. The store
 * must then feed the cursor exactly the documents filter -> sort -> skip -> limit selects.
 * Call it before opening any cursor on p. The store's query runs $expr as $match does
 * (storage/matcher.h SDB_MATCHER_EXPR).
 * Returns: 0 always (it cannot fail).
 */
int sdb_pipeline_pushdown(sdb_pipeline *p, unsigned flags, sdb_pipeline_pushdown_t *pd);
void sdb_pipeline_pushdown_destroy(sdb_pipeline_pushdown_t *pd);

/* Open a cursor of p over the input given by next/ctx (next is called only from
 * sdb_pipeline_cursor_next, on the caller's thread). p must outlive the cursor.
 * *out: the new cursor; free it with sdb_pipeline_cursor_free. Never fails. */
void sdb_pipeline_open(const sdb_pipeline *p, sdb_pipeline_next_fn next, void *ctx,
		       sdb_pipeline_cursor **out);

/* Pull the next output document.
 * Returns 1 with *doc set (borrowed from the cursor, valid until the next call or free), 0
 * at the end. Errors: SDB_EINVAL (a stage or expression failed), SDB_ETOOBIG (the 292
 * memory limit of a blocking stage), or whatever negative code the input's next function
 * returned, with the MongoDB error code in *code and the message in err. After an error or
 * the end, every later call returns the same result again. */
int sdb_pipeline_cursor_next(sdb_pipeline_cursor *c, const bson_t **doc, int *code, char *err,
			     size_t errlen);

void sdb_pipeline_cursor_free(sdb_pipeline_cursor *c);

/* Run p over the single input document doc (borrowed). Returns: 1 with *out (a heap copy
 * of the output, bson_destroy it), 0 when the stages dropped it (*out NULL). Errors:
 * sdb_pipeline_cursor_next's, with the MongoDB code in *code (0 when the failing stage gave
 * none: the caller picks its default) and the message in err. Used where a pipeline transforms one document at a time (update
 * pipelines, the stages after $changeStream). */
int sdb_pipeline_run_one(const sdb_pipeline *p, const bson_t *doc, bson_t **out, int *code,
			 char *err, size_t errlen);

/* Evaluate one aggregation expression (the $project/$addFields language above) against
 * doc, e.g. for the shard's own use in $expr-like places. expr is the value at iter.
 * out: uninitialised bson_t, always initialised; on success it holds {"v": <result>} or
 * {} when the expression evaluated to "missing".
 * Errors: SDB_EINVAL with *code and err. */
int sdb_pipeline_eval_expr(const bson_iter_t *expr, const bson_t *doc, bson_t *out, int *code,
			   char *err, size_t errlen);
/* sdb_pipeline_eval_expr with user variables vars ({name: constant}, sdb_let_parse; may
 * be NULL) in scope as $$name, e.g. an aggregate command's `let` in $merge's `let`.
 * Errors: as sdb_pipeline_eval_expr. */
int sdb_pipeline_eval_expr_vars(const bson_iter_t *expr, const bson_t *vars, const bson_t *doc,
				bson_t *out, int *code, char *err, size_t errlen);

/* A compiled aggregation expression, for $expr in query filters (storage/matcher.h). */
typedef struct sdb_expr sdb_expr;

/* User variables (MongoDB 5.0's `let` of find, aggregate, update, delete and findAndModify,
 * and an update statement's `c`): let is the command's document {name: expression}; each
 * value is an aggregation expression evaluated once, before any document is read, as
 * mongod does (Variables::seedVariablesWithLetParameters), so it may not read a field (a
 * path or $$ROOT/$$CURRENT: 4890500). *out (uninitialised; always initialised, the caller
 * destroys it) gets {name: value} (a value that is missing is null): the vars of
 * sdb_pipeline_opts.let, sdb_matcher_new_vars, sdb_projection_new_vars and
 * sdb_update_opts.vars, where $$name then reads it. base (may be NULL): variables already
 * defined (the command's `let` when parsing a statement's `c`), kept unless let names them
 * again. what names the field for messages ("let", "update.updates.c").
 * Errors: SDB_EINVAL with *code (may be NULL) and err: let not a document (14), a name
 * MongoDB refuses for a user variable (16866 empty, 16867 "'X' starts with an invalid
 * character for a user variable name", 16868 "... contains an invalid character"; CURRENT,
 * which MongoDB lets a command rebind, is 238 here), an expression error (its code). */
int sdb_let_parse(const bson_iter_t *let, const bson_t *base, const char *what, bson_t *out,
		  int *code, char *err, size_t errlen);

/* Compile the expression at it (a value of the language above). 0 and *out (free with
 * sdb_expr_free). Errors: SDB_EINVAL with MongoDB's *code (may be NULL) and message in err
 * (e.g. 168 "Unrecognized expression '$foo'"). */
int sdb_expr_parse(const bson_iter_t *it, const bson_t *vars, sdb_expr **out, int *code,
		   char *err, size_t errlen);

/* Evaluate x against the document root and tell whether the result is true in MongoDB's
 * sense (not missing, null, undefined, false or a zero number): $expr's rule. 0 with *out.
 * Errors: SDB_EINVAL with the evaluation's *code (may be NULL) and message (e.g. 16608
 * "can't $divide by zero"). Pure: any thread. */
int sdb_expr_truthy(const sdb_expr *x, const bson_t *root, bool *out, int *code, char *err,
		    size_t errlen);

void sdb_expr_free(sdb_expr *x);

#endif
