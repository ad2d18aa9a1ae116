/* Internals of the store shared with its other files (storage/session.c, oplog.c,
 * index.c, check.c): not for use outside storage/. Each takes a connection inside a
 * transaction opened with sdb_store_begin unless said. */
#ifndef SDB_STORAGE_STORE_INT_H
#define SDB_STORAGE_STORE_INT_H

#include <sqlite3.h>

#include "storage/store.h"

#include <pthread.h>
#include <stdatomic.h>

#include "storage/keyenc.h"

/* ---- shared by store.c, oplog.c, index.c and check.c ---- */

/* The store format this build writes: 2 = Decimal128 keys exact (issue #20). Format 1 files
 * (decimals keyed through long double) are read too and upgraded in place on open
 * (store_rekey.c store_migrate_decimal_keys, which sets format 2 and meta keyenc = 2 in the
 * transaction that re-keys); a binary of format 1 refuses a format 2 file, so a downgraded
 * member or an older member installing a newer snapshot stops instead of misreading keys. */
#define STORE_FORMAT 2
#define STORE_FORMAT_LONG_DOUBLE_KEYS 1
#define STORE_DEFAULT_OPLOG_BYTES (256LL * 1024 * 1024)
#define STORE_STMT_CACHE 64
#define STORE_SCAN_IDLE 16 /* idle scan statements kept per connection (scan.c) */

/* ---- WAL checkpoints (checkpoint.c) ---- */

/* The page size of a new shard.db in bytes (PRAGMA page_size, set in store.c's connection
 * setup before the file exists; the reasons are there). An existing store keeps the size
 * it was made with. */
#define STORE_PAGE_BYTES 8192
#define STORE_STR_(x) #x
#define STORE_STR(x) STORE_STR_(x)

/* A checkpoint is asked of the store's checkpoint thread once the WAL holds this many
 * frames (pages; SQLite's automatic checkpoint threshold of 1,000 frames of 4 KiB, 4 MB);
 * a committing connection copies the last STORE_CKPT_TAIL frames after the thread's copy,
 * and waits for the thread's copy when the WAL grew by STORE_CKPT_FRAMES_BEHIND frames
 * during it; a big WAL allows a bigger tail, and at STORE_CKPT_FRAMES_MAX a commit copies
 * it all (checkpoint.c). Counted in frames of STORE_PAGE_BYTES, so that the bytes are those
 * measured with 4 KiB pages; a store of another page size (one made with 4 KiB pages) counts
 * the same bytes in its own frames (store_ckpt_frames). */
#define STORE_CKPT_FRAMES (1000 * 4096 / STORE_PAGE_BYTES)
#define STORE_CKPT_FRAMES_BEHIND (8000 * 4096 / STORE_PAGE_BYTES)
#define STORE_CKPT_FRAMES_MAX (32000 * 4096 / STORE_PAGE_BYTES)
/* Once the thread has copied all but this many frames, a commit copies the rest itself,
 * so that the next write restarts the WAL (checkpoint.c): 1 MiB. */
#define STORE_CKPT_TAIL (256 * 4096 / STORE_PAGE_BYTES)

typedef struct store_ckpt store_ckpt;

/* Open the checkpoint connection (configured by pragmas, store.c's conn_pragmas) and
 * start the thread; st->ckpt is set. Errors: SDB_EIO with a message (no connection, no
 * thread), st->ckpt stays NULL. */
int store_ckpt_start(sdb_store *st, int (*pragmas)(sdb_store *, sqlite3 *, char *, size_t),
		     char *err, size_t errlen);
/* Stop and join the thread, close its connection (a checkpoint under way finishes
 * first). No-op when none was started. */
void store_ckpt_stop(sdb_store *st);
/* Give connection db the store's WAL hook, which replaces SQLite's automatic checkpoint
 * (no-op without a checkpoint thread: the automatic checkpoint stays). */
void store_ckpt_attach(sdb_store *st, sqlite3 *db);
/* A threshold above, n frames of STORE_PAGE_BYTES, in frames of st's own page size.
 * Returns: the same bytes in st's frames (at least 1), or n itself without a checkpoint
 * thread. No errors. */
int store_ckpt_frames(const sdb_store *st, int n);

struct sdb_store {
	char *path; /* DIR/shard.db */
	store_ckpt *ckpt; /* the checkpoint thread (checkpoint.c), NULL before it starts */
	sdb_store_opts opts;
	pthread_mutex_t write_mu; /* serializes write transactions inside the process */
	pthread_mutex_t ts_mu;
	uint64_t last_ts;              /* newest ts allocated (under ts_mu) */
	_Atomic uint64_t committed_ts; /* newest ts committed */
	/* Moves after every commit on the store's connections (the WAL hook, checkpoint.c
	 * ckpt_hook; txn_end and apply_end) and every whole-store replace (copy.c): a read
	 * transaction kept open (sdb_store_keep_reads) is taken over only while this has not
	 * moved since it began. */
	_Atomic uint64_t commit_epoch;
	/* COMMITs running on the store's connections (sdb_store_commit, apply_commit, and
	 * sdb_store_replace_from's backup): from before the commit can become visible to new
	 * readers until after it moved commit_epoch. The WAL hook moves the epoch only after
	 * the commit is visible (and its write lock released), so a kept transaction is not
	 * taken over while one runs: another connection may already have read what it
	 * wrote. */
	_Atomic uint64_t commits_running;
	_Atomic uint64_t reads_taken_over; /* reads that took a kept transaction over */
	int64_t oplog_bytes;           /* bytes in the oplog table (under write_mu) */
	uint64_t writes_since_trim;    /* under write_mu */
	int64_t session_sweep_ms;      /* next expired-session sweep, epoch ms (under write_mu) */
};

typedef struct stmt_slot {
	char *sql;
	sqlite3_stmt *stmt;
} stmt_slot;

/* What a scan statement's SQL depends on (scan.c builds the text from it): the collection's
 * table, the index's table (0: a collection scan), and the shape bits SCAN_* (which bounds
 * are bound, inclusive or not, and the direction). Equal keys mean equal SQL. */
typedef struct scan_key {
	int64_t tbl, ix_tbl;
	unsigned shape;
} scan_key;

/* An idle scan statement (reset, unbound) and its key; stmt NULL: a free slot. */
typedef struct scan_slot {
	scan_key key;
	sqlite3_stmt *stmt;
} scan_slot;

struct sdb_store_conn {
	sdb_store *st;
	sqlite3 *db;
	stmt_slot stmts[STORE_STMT_CACHE];
	unsigned stmt_next; /* round-robin eviction */
	/* scan statements of closed cursors, reset, for the next cursor with the same SQL:
	 * preparing one was 15% of a shard's CPU on point reads (perf, YCSB C). Not in stmts:
	 * a cursor's statement is its own while it is open (several can be open at once). */
	scan_slot scan_idle[STORE_SCAN_IDLE];
	unsigned scan_next; /* round-robin eviction */
	bool in_txn, write;
	/* sdb_store_keep_reads: a read transaction ended by sdb_store_rollback stays open
	 * (kept) for the next sdb_store_begin(c, false); txn_epoch: commit_epoch read before
	 * the open transaction's snapshot began */
	bool keep_reads, kept;
	uint64_t txn_epoch;
	int savepoints;
	/* catalog cache, valid for catalog_gen */
	int64_t cache_gen;
	size_t n_colls;
	sdb_store_coll *colls;
	/* per-transaction accounting applied at commit */
	int64_t pending_oplog_bytes;
	uint64_t pending_ts;
	bool ddl;
	/* this transaction changed the catalog cache in place (store_index_mark_multikey),
	 * which a rollback outside an apply must drop: catalog_gen goes back to the cache's, so
	 * no reload would undo it */
	bool cache_touched;
	/* the statement being written for a retryable write (sdb_store_set_op_session):
	 * borrowed lsid bytes, recorded into each oplog entry; NULL = none */
	const uint8_t *op_lsid;
	uint32_t op_lsid_len;
	int64_t op_txn;
	int32_t op_stmt;
	/* the tagged ops are a multi-document transaction's (sdb_store_set_op_txn): entries
	 * get inTxn: true; reset by every sdb_store_set_op_session */
	bool op_in_txn;
	/* ts of the first oplog entry written for the tagged statement (0 = none yet):
	 * sdb_store_oplog_stmt_result adds the statement's outcome to its entries */
	uint64_t op_first_ts;
	/* A replicated apply transaction (sdb_store_apply_begin) is open: sdb_store_begin/
	 * commit/rollback of the commands it runs work on the savepoint "cmd" inside it. */
	bool apply;
	sdb_store_det det;         /* the apply's deterministic inputs */
	uint32_t det_counter;      /* ObjectIds generated in this apply */
	int64_t cmd_pending_bytes; /* pending_oplog_bytes when the current command began */
	uint64_t cmd_last_ts;      /* st->last_ts when the current command began */
	/* MongoDB code of the document's fault in the last failed insert/replace (53, 171 ...),
	 * 0 when none: sdb_store_write_code */
	int write_code;
};

/* The keys of one document for one index. */
typedef struct store_keyset {
	sdb_key *keys;
	size_t n;
} store_keyset;

#define STORE_MAX_INDEX_FIELDS 32

/* Helpers shared by store.c, oplog.c, index.c and check.c (definitions in the file named;
 * errors: SDB_E* codes with a message in err where they take one). */
/* End the read transaction kept open on c (sdb_store_keep_reads), if any: every use of c
 * other than sdb_store_begin(c, false) does this first (store_stmt_get, the write and
 * apply transactions, the copies and checks that run SQL on c->db directly). (store.c) */
void store_release_kept(sdb_store_conn *c);
/* A prepared statement from c's cache (as sdb_store_int_stmt). (store.c) */
sqlite3_stmt *store_stmt_get(sdb_store_conn *c, const char *sql, char *err, size_t errlen);
/* Step s to its end and reset it (as sdb_store_int_step_done). Errors: SDB_EIO with
 * SQLite's message prefixed by what. (store.c) */
int store_step_done(sdb_store_conn *c, sqlite3_stmt *s, char *err, size_t errlen,
		     const char *what);
/* Fill err with SQLite's message for db, prefixed by what, and note a disk/memory fault
 * for sdb_store_take_io_fault. Returns: always SDB_EIO. (store.c) */
int store_sqlerr(sqlite3 *db, char *err, size_t errlen, const char *what);
/* The integer in the first column of the first row of sql (no parameters), def when there
 * is no row or on error. (store.c) */
int64_t store_query_int(sdb_store_conn *c, const char *sql, int64_t def);
/* The store's injectable wall clock, epoch ms. (store.c) */
int64_t store_conn_now_ms(const sdb_store_conn *c);
/* Run sql (one or more statements, no parameters) on db. Errors: SDB_EIO with a message.
 * (store.c) */
int store_exec_sql(sqlite3 *db, const char *sql, char *err, size_t errlen);
/* Run sql (one statement, no result rows wanted: BEGIN, COMMIT, SAVEPOINT ...) through c's
 * statement cache (store_stmt_get), so it is parsed once per connection. Returns: 0.
 * Errors: SDB_EIO with the SQLite message in err (err may be NULL); sqlite3_errcode(c->db)
 * still tells the SQLite error (SQLITE_BUSY ...). */
int store_exec_cached(sdb_store_conn *c, const char *sql, char *err, size_t errlen);
/* The catalog entry of db.coll in c's catalog cache (borrowed until the cache reloads), or
 * NULL. (store.c) */
sdb_store_coll *store_cache_find(sdb_store_conn *c, const char *db, const char *coll);
/* Bump the catalog generation (every connection reloads its cache at its next
 * transaction) and reload c's cache. Errors: SDB_EIO. (catalog.c) */
int store_catalog_bump(sdb_store_conn *c, char *err, size_t errlen);
/* Drop table PREFIX_<tbl> (a collection's documents or an index's keys). Errors: SDB_EIO.
 * (catalog.c) */
int store_drop_table(sdb_store_conn *c, const char *prefix, int64_t tbl, char *err,
		      size_t errlen);
/* Insert one document's keys into one index table. Errors: SDB_EEXISTS (duplicate key of a
 * unique index, MongoDB's message, dup filled), SDB_EIO. (store.c) */
int store_index_insert_keys(sdb_store_conn *c, const sdb_store_coll *co,
			     const sdb_store_index *ix, const store_keyset *ks,
			     const sdb_key *idk, const bson_t *doc, sdb_store_dup *dup,
			     char *err, size_t errlen);
/* Record that an index became multikey (this transaction; the cache entry is updated in
 * place). Errors: SDB_EIO. (store.c) */
int store_index_mark_multikey(sdb_store_conn *c, const sdb_store_coll *co,
			       sdb_store_index *ix, char *err, size_t errlen);
/* Append an oplog entry in the current write transaction (its ts allocated here): op
 * "i"/"u"/"d"/"c"; o2 and ui may be NULL. Errors: SDB_EIO. (oplog.c) */
int store_oplog_append(sdb_store_conn *c, const char *op, const char *ns, const uint8_t *ui,
			const bson_t *o, const bson_t *o2, const char *origin, char *err,
			size_t errlen);
/* store_oplog_append with ud (may be NULL): an "u" entry's updateDescription, written
 * after o2 (src/shard/README.md "Oplog"); doc_key: the entry records its write-time
 * documentKey (o2 of an "i" or "u", o of a "d": store.h SDB_STORE_OPLOG_DOCKEY_FIELD), which it
 * says with `docKey: true` after updateDescription. Errors: SDB_EIO. (oplog.c) */
int store_oplog_append_ud(sdb_store_conn *c, const char *op, const char *ns, const uint8_t *ui,
			  const bson_t *o, const bson_t *o2, const bson_t *ud, bool doc_key,
			  const char *origin, char *err, size_t errlen);
/* Delete the oldest oplog entries beyond the byte cap (write transaction). Errors:
 * SDB_EIO. (oplog.c) */
int store_oplog_trim(sdb_store_conn *c, char *err, size_t errlen);
/* Append the order-preserving key of doc's _id to kb (id_it: the _id element found).
 * Errors: SDB_EINVAL when _id is missing (*code 2 BadValue), of a type _id cannot have
 * (*code 53 InvalidIdField) or cannot be encoded (too deep); code may be NULL. (store.c) */
int store_id_key(const bson_t *doc, sdb_key *kb, bson_iter_t *id_it, int *code, char *err,
		 size_t errlen);
/* The index keys of doc for index ix into ks (multikey expands arrays). Errors: SDB_EINVAL
 * (parallel arrays, too many keys). (store.c) */
int store_index_keys(const sdb_store_index *ix, const bson_t *doc, store_keyset *ks,
		      bool *all_missing, char *err, size_t errlen);
/* Check an index key pattern: field -> 1 / -1 (any non-zero number), at most
 * STORE_MAX_INDEX_FIELDS, or {f: "hashed"} alone; "text", "2d" and compound hashed
 * patterns refused. Errors: SDB_EINVAL. (keys.c) */
int store_key_check_pattern(const bson_t *pattern, char *err, size_t errlen);
/* The field of a hashed key pattern {f: "hashed"} (points into pattern), or NULL when
 * pattern is not one. (keys.c) */
const char *store_key_hashed_field(const bson_t *pattern);
/* The keys of doc for key pattern into ks (the caller destroys ks). A hashed pattern gives
 * one key, the encoding of NumberLong(sdb_keyenc_hash_value(value at the path)), missing
 * hashing as null; never multikey. Errors: SDB_EINVAL with *code (may be NULL) the MongoDB
 * code (171 CannotIndexParallelArrays; 16766 an array at or along a hashed index's path,
 * "hashed indexes do not currently support array values"; else 0). coll (NULL: simple) is
 * the index's collation: strings encode as its sort keys. (keys.c) */
int store_key_index_keys(const bson_t *pattern, const struct sdb_collator *coll,
			 const bson_t *doc, store_keyset *ks, bool *all_missing,
			 bool *multikey_out, int *code, char *err, size_t errlen);
/* Free a keyset's keys (it stays usable, empty). (store.c) */
void store_keyset_destroy(store_keyset *ks);
/* An empty keyset. (store.c) */
void store_keyset_init(store_keyset *ks);

/* A prepared statement from c's cache, reset and unbound (owned by the cache: never
 * finalize it). NULL with a message on error. */
sqlite3_stmt *sdb_store_int_stmt(sdb_store_conn *c, const char *sql, char *err, size_t errlen);
/* Step s to its end and reset it. Errors: SDB_EIO with a message naming what. */
int sdb_store_int_step_done(sdb_store_conn *c, sqlite3_stmt *s, char *err, size_t errlen,
			    const char *what);
/* Fill err with SQLite's message for c, prefixed by what. Returns: always SDB_EIO. */
int sdb_store_int_sqlerr(sdb_store_conn *c, char *err, size_t errlen, const char *what);
/* The store's injectable wall clock, epoch ms. */
int64_t sdb_store_int_now_ms(sdb_store_conn *c);
/* The session record timeout in force, ms. */
int64_t sdb_store_int_session_timeout_ms(sdb_store_conn *c);
/* The time of the next expired-session sweep (epoch ms); read and write it only inside a
 * write transaction (serialized by the store's write lock). */
int64_t *sdb_store_int_sweep_mark(sdb_store_conn *c);
/* True inside a write transaction. */
bool sdb_store_int_in_write(const sdb_store_conn *c);


/* ---- shared by store.c and the files split out of it (catalog.c, keys.c, scan.c, copy.c) */

/* Finalize every cached prepared statement of c (before a schema change or a database
 * replacement). store.c. */
void store_stmt_forget_all(sdb_store_conn *c);
/* Drop c's catalog cache (collections, indexes); reloaded by store_cache_load. store.c. */
void store_cache_clear(sdb_store_conn *c);
/* One collection's step of a one-time upgrade (store_upgrade_once), inside its write
 * transaction: 0, or an error with err set (the upgrade then stops and rolls back). */
typedef int (*store_upgrade_fn)(sdb_store_conn *c, sdb_store_coll *co, char *err,
				size_t errlen);
/* A one-time upgrade of st, in one write transaction on a connection of its own: nothing
 * when meta `flag` is already >= done; else load the catalog, run coll on every collection
 * (until one fails), set meta flag = done, run finish_sql (no parameters; NULL: none) and
 * commit. On a failure after the transaction began everything is rolled back (the store
 * is left as it was) and, when fail_what is not NULL, err becomes "store: <fail_what>
 * failed, store left as it was: <the step's error>". Errors: the step's, SDB_EIO.
 * (store_rekey.c; used by store_migrate_decimal_keys and store_partial_rebuild) */
int store_upgrade_once(sdb_store *st, const char *flag, int done, store_upgrade_fn coll,
		       const char *finish_sql, const char *fail_what, char *err, size_t errlen);
/* Re-key, once, the decimal _id and index keys of a store written before Decimal128 keys
 * were exact (meta keyenc absent or below 2), then set keyenc = 2; a no-op when set. One
 * write transaction on a connection of its own (see store_rekey.c for crash safety and
 * cost). Errors: SDB_EIO, SDB_ECORRUPT (a document does not parse), SDB_EINVAL (an _id
 * that cannot be keyed), SDB_EEXISTS (a unique index refuses): the store is left as it
 * was. store_rekey.c; called by sdb_store_open and sdb_store_replace_from (copy.c). */
int store_migrate_decimal_keys(sdb_store *st, char *err, size_t errlen);

/* Check an index's partialFilterExpression (pfe: the spec's element) as MongoDB 6.0's
 * createIndexes does: a document the query language accepts, of equality, $exists: true,
 * $gt $gte $lt $lte, $type, $in, $and and $or only. Errors: SDB_EINVAL with *code
 * MongoDB's: 14 TypeMismatch (not a document), the query language's code (2 BadValue
 * unknown operator ...), 67 CannotCreateIndex "Expression not supported in partial index:
 * ..." (partial.c). */
int store_partial_check(const bson_iter_t *pfe, int *code, char *err, size_t errlen);
/* Are two partialFilterExpression elements the same filter to mongod
 * (IndexDescriptor::compareIndexOptions: parseAndNormalize, then
 * MatchExpression::equivalent)? Compares a canonical form: $and flattened, {f: v} as
 * {f: {$eq: v}}, a path's operators split, $in as a sorted set without duplicates (one
 * value: $eq), $type as a type set, $all of values as equalities, a one-branch $or or $and
 * as its branch, conjuncts and branches sorted; values
 * compare as MongoDB compares them (1 == 1.0, NaN == NaN), strings by their bytes. The
 * specs as given are kept (listIndexes shows them). Returns: true when equivalent. */
bool store_partial_same(const bson_iter_t *a, const bson_iter_t *b);
/* Does doc belong in ix (no partial filter, or doc matches it under ix's collation)?
 * (partial.c) */
bool store_partial_covers(const sdb_store_index *ix, const bson_t *doc);
/* Does every document matching query also match ix's partial filter (true when ix has
 * none)? Conservative: the query's top-level conjuncts ($and flattened) must contain, for
 * each of the filter's conjuncts, the same predicate or one that implies it (a narrower
 * range of the same type bracket, a value of the $in list, any predicate that needs the
 * field for $exists: true); false when unsure. Compares strings under the calling
 * thread's collation: call it only when the query's collation is the index's.
 * (partial.c) */
bool store_partial_implied(const bson_t *query, const sdb_store_index *ix);

/* Once per store (meta partial_idx unset): empty and rebuild every partial index, in one
 * write transaction on a connection of its own. Releases before issue #20's partial
 * indexes built them whole (an entry for every document); this gives them their entries
 * under the filter. Called by sdb_store_open and sdb_store_replace_from after the
 * decimal re-keying. Errors: SDB_EIO, SDB_ECORRUPT (a document does not parse), SDB_EINVAL
 * (a document's keys cannot be built): the store is left as it was. (index.c) */
int store_partial_rebuild(sdb_store *st, char *err, size_t errlen);

/* Add doc's keys (its _id key idk) to every index of co, skipping a sparse index whose
 * fields are all missing and a partial index whose filter doc does not match; a unique conflict fills *dup when dup is not NULL (store.c).
 * Returns: 0, or an SDB_E* code with a message in err (c->write_code set to MongoDB's). */
int store_indexes_add(sdb_store_conn *c, sdb_store_coll *co, const bson_t *doc,
		      const sdb_key *idk, sdb_store_dup *dup, char *err, size_t errlen);

/* Remove doc's keys (its _id key idk) from every index of co (store.c). Returns: 0, or an
 * SDB_E* code with a message in err. */
int store_indexes_remove(sdb_store_conn *c, const sdb_store_coll *co, const bson_t *doc,
			 const sdb_key *idk, char *err, size_t errlen);
/* Index maintenance of the document with _id key idk replaced, old_doc (the stored image)
 * by new_doc (index.c): an index whose entries stay the same is not written, but is still
 * marked multikey when new_doc makes it so. Errors: store_indexes_remove's / _add's. */
int store_indexes_update(sdb_store_conn *c, sdb_store_coll *co, const bson_t *old_doc,
			 const bson_t *new_doc, const sdb_key *idk, sdb_store_dup *dup, char *err,
			 size_t errlen);
/* Fill *dup (when not NULL) with a duplicate key's namespace, index name, key pattern and
 * value (MongoDB's keyPattern / keyValue of an E11000 error); copies them. */
void store_dup_fill(sdb_store_dup *dup, const char *db, const char *coll, const char *index,
		    const bson_t *pattern, const bson_t *value);
/* Load c's catalog cache from the catalog tables when the catalog generation moved.
 * Errors: SDB_EIO (message in err). catalog.c. */
int store_cache_load(sdb_store_conn *c, char *err, size_t errlen);

/* A set of _id keys (open addressing; keys copied): the _ids a multi-range scan returned,
 * so a document matched by two ranges is returned once. keys.c. */
typedef struct store_idset {
	sdb_key *slots;
	size_t cap, n;
} store_idset;
void store_idset_init(store_idset *s);
void store_idset_destroy(store_idset *s);
/* Add the key bytes p[0..n); false when already present. */
bool store_idset_add(store_idset *s, const void *p, size_t n);
/* The values of pattern's fields in doc (the first value of each path; null when missing)
 * as a key document ({f: v, ...}) into out (initialised here; the caller destroys it): the
 * keyValue of an E11000 error. keys.c. */
void store_key_dup_value(const bson_t *pattern, const bson_t *doc, bson_t *out);
/* Whether key[0..len) (an index key encoding, storage/keyenc.h) is one of doc's keys for
 * pattern (multikey arrays expanded); the values that make it up into out (always
 * initialised here; the caller destroys it): the keyValue of an E11000 error on a multikey
 * index. keys.c. */
bool store_key_dup_value_of(const bson_t *pattern, const bson_t *doc, const uint8_t *key,
			    size_t len, bson_t *out);


/* Bytes of shard.db every connection reads through SQLite's memory map (PRAGMA mmap_size,
 * set in store.c's connection setup; the reasons are there), as the pragma's text. */
#define STORE_MMAP_SIZE "1073741824"

#endif
