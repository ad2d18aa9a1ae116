/* What the shard's read command files share (cmd_read.c: find, getMore, killCursors, count,
 * distinct, explain; cmd_aggregate.c: aggregate and the executor the others run pipelines
 * through). Not a public contract: only src/shard/cmd_*.c include it. Worker threads, in
 * a command's read transaction (shard_ctx). */
#ifndef SDB_SHARD_CMD_READ_INT_H
#define SDB_SHARD_CMD_READ_INT_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "shard/shard.h"
#include "storage/query.h"

/* Open the next stage of the pipeline array stages (*nst stages so far, incremented) as st;
 * the caller appends the stage's field and closes it with bson_append_document_end(stages,
 * st). */
void shard_stage_open(bson_t *stages, uint32_t *nst, bson_t *st);
/* Append {name: v} (a document) as the next stage of stages. */
void shard_stage_doc(bson_t *stages, uint32_t *nst, const char *name, const bson_t *v);
/* Append {name: v} (an int64) as the next stage of stages. */
void shard_stage_int(bson_t *stages, uint32_t *nst, const char *name, int64_t v);

/* Answer x with a cursor over the n documents docs of ns (the array and the documents are
 * taken over): the first batch (batch documents, batch < 0 the default, cut to the reply
 * size limit), the rest registered as a cursor unless single; with tail (a tailable
 * cursor, taken over) the cursor is registered even when drained. extra: fields appended
 * to the reply, or NULL. */
void shard_reply_cursor(shard_ctx *x, const char *ns, bson_t **docs, size_t n, int64_t batch,
			bool single, const bson_t *extra, shard_cursor *tail);

/* True when db.coll (x->db) is a view. */
bool shard_coll_is_view(shard_ctx *x, const char *coll);

/* Run the pipeline stages (an array) over db.coll (coll NULL: a database-level aggregate
 * whose input is empty, or the sessions of $listLocalSessions) in the open read
 * transaction; a view's pipeline runs first; hint (may be NULL) picks the index. On
 * success true, with *docs_out / *n_out the output documents (the caller frees each with
 * sdb_doc_free and the array with free); with q_out the query is kept for explain (the
 * caller frees it; the transaction is then left open). On failure false after answering x
 * with the error (MongoDB's code). */
bool shard_agg_exec(shard_ctx *x, const char *coll, const bson_t *stages,
		    const bson_iter_t *hint, bson_t ***docs_out, size_t *n_out, sdb_query **q_out);

/* Parse and run the aggregate command cmd (its pipeline, cursor.batchSize into *batch,
 * hint, let) in x's read transaction: true with *coll_out the collection (a reference into
 * cmd, NULL for {aggregate: 1}) and *docs_out / *n_out the output as shard_agg_exec's.
 * With explain, *q_out keeps the query for the explain output (the caller frees it). On
 * failure false after answering x with the error. */
bool shard_run_aggregate(shard_ctx *x, const bson_t *cmd, const char **coll_out,
			 bson_t ***docs_out, size_t *n_out, int64_t *batch, bool explain,
			 sdb_query **q_out);

struct sdb_aggw;
/* $out / $merge (cmd_outmerge.c, common/aggwrite.h). Before the pipeline runs: refuse
 * them in a transaction (263), into a view (166), and $merge whose `on` has no supporting
 * unique index (51183); true when the aggregate may go on (else x was answered). Uses
 * (and rolls back) a read transaction of x. */
bool shard_aggw_check(shard_ctx *x, const struct sdb_aggw *w);
/* After the pipeline ran (no transaction open): write its n output documents docs
 * (borrowed) to the target through the replicated write path (one command and one Raft
 * entry per batch, waited for in turn). True when every write succeeded, with *wce a
 * writeConcernError of the writes (heap, bson_destroy) or NULL; false after answering x
 * with the write's error (mongod's code: 11000, 13113, 10107 on a secondary, ...). What
 * was written before an error stays (as on mongod; $out's temporary collection is
 * dropped). */
bool shard_aggw_run(shard_ctx *x, const struct sdb_aggw *w, bson_t **docs, size_t n,
		    bson_t **wce);
/* On this member becoming the ready primary (repl.c on_change, loop thread; also the
 * first election after a start): drop, through the replicated write path (a detached
 * `drop` per collection, not waited for), every collection whose name starts with
 * `tmp.agg_out.` left by a $out that a crash or failover interrupted, except those of a
 * $out running on this member now; as mongod drops its temporary collections at
 * step-up (dropTempCollections). Errors are logged (the next step-up retries). */
void shard_aggw_drop_temps(shard *sh);

#endif
