/* The writing stages of an aggregation, `$out` and `$merge` (issue #20), parsed the same
 * way by a shard and by a proxy, so both refuse the same pipelines with the same codes
 * before anything runs. MongoDB 6.0's parsers: src/mongo/db/pipeline/document_source_out.cpp
 * (+ document_source_out.idl), document_source_merge.cpp, document_source_merge_spec.cpp
 * (+ document_source_merge.idl), merge_processor.cpp (the supported whenMatched /
 * whenNotMatched combinations). Depends on libbson only.
 *
 * What runs the stage is the caller's: the shard (src/shard/cmd_outmerge.c) writes through
 * its replicated write path, a proxy (src/proxy/outmerge.c) through its routing. */
#ifndef SDB_COMMON_AGGWRITE_H
#define SDB_COMMON_AGGWRITE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum sdb_aggw_kind {
	SDB_AGGW_NONE = 0, /* the pipeline does not end with $out or $merge */
	SDB_AGGW_OUT,
	SDB_AGGW_MERGE,
} sdb_aggw_kind;

/* $merge's whenMatched (document_source_merge.idl MergeWhenMatchedMode). */
typedef enum sdb_aggw_matched {
	SDB_WM_MERGE = 0, /* the default */
	SDB_WM_REPLACE,
	SDB_WM_KEEP_EXISTING,
	SDB_WM_FAIL,
	SDB_WM_PIPELINE,
} sdb_aggw_matched;

/* $merge's whenNotMatched (MergeWhenNotMatchedMode). */
typedef enum sdb_aggw_not_matched {
	SDB_WNM_INSERT = 0, /* the default */
	SDB_WNM_DISCARD,
	SDB_WNM_FAIL,
} sdb_aggw_not_matched;

#define SDB_AGGW_MAX_ON 32

/* A parsed writing stage. Strings are NUL-terminated copies; bson_t members are owned
 * (release everything with sdb_aggw_destroy). */
typedef struct sdb_aggw {
	sdb_aggw_kind kind;
	char db[64];    /* the target database (the command's when not given) */
	char coll[256]; /* the target collection */
	/* $merge only */
	sdb_aggw_matched when_matched;
	sdb_aggw_not_matched when_not_matched;
	bson_t pipeline;      /* whenMatched pipeline (an array) when SDB_WM_PIPELINE */
	bson_t let;           /* {name: expression}: user let, plus new: "$$ROOT" as mongod
			       * adds it for a pipeline with whenNotMatched insert; empty
			       * otherwise */
	bool on_given;        /* `on` was given (else on = ["_id"]) */
	size_t n_on;
	char on[SDB_AGGW_MAX_ON][256]; /* the `on` fields, dotted paths */
	bson_t stages;        /* the pipeline without its last ($out/$merge) stage */
} sdb_aggw;

/* Look at pipeline (a BSON array of stages) run against database db: when its last stage
 * is $out or $merge, parse it into *out (kind OUT or MERGE, stages = the others);
 * otherwise kind NONE (stages is then a copy of the whole pipeline). *out is always
 * initialised: release it with sdb_aggw_destroy.
 * Errors (MongoDB 6.0's codes, nothing initialised beyond what destroy releases):
 * $out/$merge before the last stage 40601 "$out can only be the final stage in the
 * pipeline"; $out not a string or object 16990; its object form: `coll`/`db` missing
 * 40414, not strings 14, another field 40415 (`timeseries` 238: no time series
 * collections); $merge not a string or object 51182; `into` missing 40414, of another type
 * 51178, an empty string 5786800, an object without a non-empty `coll` 5786801; `on` not a
 * string or array of strings 51186 / 51134, empty 51187, a field twice 31465;
 * `whenMatched` neither a string nor an array 51191, an unknown mode 2 BadValue;
 * `whenNotMatched` unknown 2 BadValue (not a string 14); `let` not an object 14, with a
 * mode other than a pipeline 51199, `new` other than "$$ROOT" 51273; an unsupported
 * combination 51181; an unknown field 40415; an invalid target namespace 73; a `system.*`
 * target 17385 ($out) / 31319 ($merge); `admin`, `config` or `local` as target database
 * 31321 ($out) / 31320 ($merge).
 * Returns: 0, or the MongoDB code with the message in err (errlen bytes, NUL-terminated). */
int sdb_aggw_parse(const bson_t *pipeline, const char *db, sdb_aggw *out, char *err,
		   size_t errlen);

/* Release what sdb_aggw_parse built. */
void sdb_aggw_destroy(sdb_aggw *w);

/* Is the stage name (a pipeline stage's only key) a writing stage? */
bool sdb_aggw_is_stage(const char *name);

/* The `on` filter of $merge for doc (an output document): {f1: v1, f2: v2} with each value
 * read at its dotted path, into out (uninitialised; always initialised, caller destroys).
 * Errors (merge_processor.cpp): a value that is an array 51185 "$merge write error: 'on'
 * field 'f' is an array"; missing, null or undefined 51132 "$merge write error: 'on' field
 * 'f' cannot be missing, null, undefined or an array".
 * Returns: 0 or the code with the message in err. */
int sdb_aggw_on_filter(const sdb_aggw *w, const bson_t *doc, bson_t *out, char *err,
		       size_t errlen);

/* Does the index (its key pattern and its listIndexes spec) support `on` as mongod's
 * fieldsHaveSupportingUniqueIndex: unique, not partial, a simple (or no) collation, and
 * its key fields exactly the set of `on` fields? Pure. */
bool sdb_aggw_index_supports(const sdb_aggw *w, const bson_t *key, const bson_t *spec);

/* Evaluates an aggregation expression (expr) against doc for sdb_aggw_merge_stmt, with the
 * user variables vars ({name: constant} or NULL) in scope: out (uninitialised, always
 * initialised) gets {v: result} or {} when missing. storage/pipeline.h
 * sdb_pipeline_eval_expr_vars has this shape. Returns: 0, or non-zero with *code and err. */
typedef int (*sdb_aggw_eval_fn)(const bson_iter_t *expr, const bson_t *vars, const bson_t *doc,
				bson_t *out, int *code, char *err, size_t errlen);

/* doc with an `_id` (a new ObjectId) first when `on` includes _id and doc has none, as
 * MergeProcessor::makeBatchObject: a copy into out (uninitialised, always initialised). */
void sdb_aggw_with_id(const sdb_aggw *w, const bson_t *doc, bson_t *out);

/* The fields of the update statement that $merge (whenMatched other than fail) writes for
 * the output document doc, appended to st (a statement document being built): q (the `on`
 * filter), u (replace: doc; merge: {$set: doc}; keepExisting: {$setOnInsert: doc}; a
 * pipeline: the pipeline), c (a pipeline: the let variables evaluated by eval against doc,
 * as {$literal}s), upsert (whenNotMatched insert), upsertSupplied (a pipeline with insert),
 * multi false (merge_processor.cpp's strategies). vars (may be NULL): the aggregate
 * command's `let` constants ({name: value}, storage/pipeline.h sdb_let_parse), in scope in
 * $merge's let expressions and added to c (where $merge's let does not name them), so
 * the whenMatched pipeline sees them as on mongod.
 * Returns: 0, or the code of sdb_aggw_on_filter or of the evaluation (message in err). */
int sdb_aggw_merge_stmt(const sdb_aggw *w, const bson_t *doc, const bson_t *vars,
			sdb_aggw_eval_fn eval, bson_t *st, char *err, size_t errlen);

/* Names of the modes for messages ("replace", "insert", ...). Static strings. */
/* One write of $out/$merge output: at most SDB_AGGW_BATCH_DOCS documents and (past the
 * first) SDB_AGGW_BATCH_BYTES of them, well under a shard's message limit. */
#define SDB_AGGW_BATCH_DOCS 250
#define SDB_AGGW_BATCH_BYTES (4 * 1024 * 1024)

/* Append to cmd the ordered insert of the next batch of docs[*pos..n) into coll
 * ({insert: coll, documents: [...], ordered: true}) and advance *pos past it (at least
 * one document when *pos < n). docs stay the caller's. */
void sdb_aggw_insert_batch(bson_t *cmd, const char *coll, bson_t *const *docs, size_t n,
			   size_t *pos);

/* The first writeError of a write command's reply (the writes of $out/$merge, on a shard and
 * through a proxy): true with *code (1 when it has none), its errmsg into errmsg (errlen
 * bytes, truncated) and its keyPattern/keyValue appended to extra (initialised by the
 * caller); false, nothing touched, when the reply has none. */
bool sdb_aggw_first_write_error(const bson_t *reply, int *code, char *errmsg, size_t errlen,
				bson_t *extra);
const char *sdb_aggw_matched_name(sdb_aggw_matched m);
const char *sdb_aggw_not_matched_name(sdb_aggw_not_matched m);

#endif
