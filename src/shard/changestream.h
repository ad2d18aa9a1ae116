/* Change streams on the shard (issue #20): `aggregate` with a first stage $changeStream, a
 * tailable, awaitData cursor over this member's oplog that turns entries into MongoDB 6.0
 * change events. The contract with the proxy (token bytes, high-water marks,
 * $stripedbMerge) is common/changestream.h and src/shard/README.md "Change streams".
 *
 * changestream.c: the command, the cursor, its getMore; cs_event.c: one oplog entry ->
 * its events (pure but for the lookups it is given). */
#ifndef SDB_SHARD_CHANGESTREAM_H
#define SDB_SHARD_CHANGESTREAM_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/changestream.h"
#include "shard/shard.h"

/* What a stream watches. */
typedef enum { SHARD_CS_COLL = 0, SHARD_CS_DB = 1, SHARD_CS_CLUSTER = 2 } shard_cs_kind;

/* The scope and options an entry is transformed with (all borrowed). */
typedef struct shard_cs_scope {
	shard_cs_kind kind;
	const char *db;	      /* the watched database (SHARD_CS_COLL, SHARD_CS_DB) */
	const char *coll;     /* the watched collection (SHARD_CS_COLL) */
	const char *shard;    /* this shard's id, for tokens */
	bool merge;	      /* $stripedbMerge: no invalidate events (the proxy decides) */
	bool update_lookup;   /* fullDocument "updateLookup": update events get the current
			       * document through lookup */
	/* The shard key pattern of ns now (a view valid until the next call), or NULL when
	 * the shard has no filtering metadata for it. Only for entries written before
	 * entries recorded their documentKey (storage/store.h SDB_STORE_OPLOG_DOCKEY_FIELD):
	 * their documentKey is built with it ({_id} with NULL). */
	const bson_t *(*key_of)(void *arg, const char *ns);
	/* The current document of db.coll with the _id at id: true with *out (initialised,
	 * the caller destroys it), false when it is gone (fullDocument null). Errors: a
	 * failed read is reported as gone (the lookup is best effort, as mongod's after a
	 * drop). */
	bool (*lookup)(void *arg, const char *db, const char *coll, const bson_iter_t *id,
		       bson_t *out);
	void *arg;
} shard_cs_scope;

/* The events of one oplog entry for scope s: 0, 1 or 2 (an event and the invalidate that
 * follows it) heap documents in out[] (bson_destroy each; set *n), each with its token in
 * tok[]. Entries with `origin` (migration copies, range deletions), no-ops ("n"), other
 * namespaces and command entries other than drop, renameCollection and dropDatabase give
 * none. An "i" entry is an insert, "u" with updateDescription an update, "u" without a
 * replace, "d" a delete; a transaction's op (inTxn: true, storage/store.h
 * sdb_store_set_op_txn) carries lsid and txnNumber and idx = its stmtId. *invalidates is true when the entry ends the
 * stream (the second event is then the invalidate; with s->merge none is produced but
 * *invalidates still tells). Returns: the number of events. Never fails: a malformed
 * entry gives none. */
size_t shard_cs_transform(const shard_cs_scope *s, const bson_t *entry, bson_t *out[2],
			  sdb_cs_token tok[2], bool *invalidates);

/* Is x->cmd an aggregate whose first stage is $changeStream? */
bool shard_cs_wanted(const bson_t *cmd);
/* The aggregate of a change stream (worker thread, x->cmd an aggregate for which
 * shard_cs_wanted is true): parses the stage and its options as mongod 6.0, registers the
 * cursor and answers the first batch with postBatchResumeToken. Completes x->req. */
void shard_cs_aggregate(shard_ctx *x);
/* A getMore of a change stream cursor c (checked out): the next events after its
 * position, waiting (parked, holding no worker) until deadline_ms (monotonic) when there
 * are none. batch: documents at most (0: the reply size limit only). Completes x->req and
 * puts c back. */
void shard_cs_getmore(shard_ctx *x, shard_cursor *c, int64_t batch, int64_t deadline_ms);
/* Free a stream's state (shard_cursor.cs), NULL allowed. */
void shard_cs_free(struct shard_cs *cs);

#endif
