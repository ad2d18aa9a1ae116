/* The embedded shard's durable store: documents, indexes, oplog and version tokens in
 * one SQLite database (DESIGN.md §8, issue #4).
 *
 * On disk: DIR/shard.db (+ -wal, -shm), one database file for every logical database,
 * so that a write, its index entries, its oplog entry and the version-token check are one
 * SQLite transaction. journal_mode=WAL, synchronous=FULL: a write is acknowledged only
 * after its transaction's commit record has been fsync'ed to the WAL, so an acknowledged
 * write survives kill -9 of the process and a power loss (synchronous=NORMAL would survive
 * kill -9 only).
 *
 * Schema (all tables WITHOUT ROWID unless said):
 *   meta(k TEXT PRIMARY KEY, v)                          format version, last oplog ts,
 *                                                        keyenc = 2 once decimal keys are exact
 *                                                        (set by sdb_store_open, which re-keys
 *                                                        older stores' decimals first)
 *   catalog_coll(db, coll, tbl INTEGER, uuid BLOB, options BLOB, PRIMARY KEY(db, coll))
 *   catalog_index(db, coll, name, tbl INTEGER, spec BLOB, multikey INTEGER,
 *                 PRIMARY KEY(db, coll, name))
 *   c_N(k BLOB PRIMARY KEY, doc BLOB)                  one per collection; k = keyenc(_id)
 *   i_N(k BLOB, id BLOB, PRIMARY KEY(k, id))            one per secondary index;
 *                                                        k = compound key, id = c_N.k
 *   oplog(ts INTEGER PRIMARY KEY, wall INTEGER, entry BLOB)   (rowid table; ts = secs<<32|inc)
 *   versions(chunk TEXT PRIMARY KEY, token INTEGER)
 *   txn_sessions(lsid BLOB PRIMARY KEY, txn INTEGER, last_use INTEGER)   retryable writes
 *   txn_stmts(lsid BLOB, stmt INTEGER, result BLOB, PRIMARY KEY(lsid, stmt))  (session.c)
 *
 * Threading: one sdb_store per data directory, shared by every thread; each thread opens
 * its own sdb_store_conn (a SQLite connection) and uses it alone. Write transactions are
 * serialized by SQLite's write lock (BEGIN IMMEDIATE); readers see a consistent snapshot
 * for the whole of their transaction (WAL).
 *
 * Oplog entries follow local.oplog.rs of a replica-set member:
 *   { ts: Timestamp(secs, inc), t: 1, v: 2, op: "i"|"u"|"d"|"c"|"n", ns: "db.coll",
 *     ui: UUID, o: {...}, o2: <documentKey> (i, u), updateDescription (u, optional),
 *     docKey: true (i, u, d), wall: Date, origin: "mig-42" (optional),
 *     lsid: {id: UUID, ...}, txnNumber: long, stmtId: int (retryable writes only) }
 * op "u" carries the full post-image in o (replacement form; applying it is idempotent);
 * one written by a modifier or pipeline update also carries updateDescription: {updatedFields,
 * removedFields, truncatedArrays} after o2 (sdb_store_update, storage/docdiff.h).
 * documentKey (issue #20, MongoDB 5.3+'s oplog: o2 of "i" and "u", o of "d"): the
 * document's shard key fields (in the key pattern's order, those present) then _id when
 * the store has filtering metadata for the collection at the time of the write, else
 * {_id}: an insert's from the new document, an update's and a delete's from the stored
 * pre-image; a migration's update (origin) has {_id} (mongod's internal writes). Entries
 * that record it say so with docKey: true (SDB_STORE_OPLOG_DOCKEY_FIELD); those written
 * before (an "i" without o2, an "u" whose o2 is {_id} whatever the collection) lack it and
 * their readers fall back (src/shard/cs_event.c).
 * op "c" carries {create: coll} / {drop: coll} / {createIndexes: coll, ...spec} /
 * {dropIndexes: coll, index: name} / {dropDatabase: 1} with ns "db.$cmd".
 * ts: seconds from the injectable wall clock (sdb_store_opts.clock_ms) and a counter;
 * strictly increasing within a process and across restarts (the last ts is persisted).
 */
#ifndef SDB_STORAGE_STORE_H
#define SDB_STORAGE_STORE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The field with which an "i", "u" or "d" oplog entry says that it records its write-time
 * documentKey (o2 of "i"/"u", o of "d"; see above): `docKey: true`. */
#define SDB_STORE_OPLOG_DOCKEY_FIELD "docKey"

typedef struct sdb_store sdb_store;
typedef struct sdb_store_conn sdb_store_conn;
typedef struct sdb_store_cursor sdb_store_cursor;

typedef struct sdb_store_opts {
	/* Oplog cap: trim oldest entries beyond this many bytes (0 = default 256 MiB). */
	int64_t oplog_max_bytes;
	/* Oplog cap by age in seconds of wall clock (0 = no age limit). */
	int64_t oplog_max_age_s;
	/* synchronous=NORMAL instead of FULL (benchmarks only; survives kill -9, not power loss). */
	bool sync_normal;
	/* Wall clock in epoch ms for oplog ts and wall (NULL = sdb_wall_ms(), common/clock.h). Tests inject it. */
	int64_t (*clock_ms)(void *arg);
	void *clock_arg;
	/* Retryable-write session records expire after this many ms without use (0 = the
	 * default SDB_STORE_SESSION_TIMEOUT_MS, MongoDB's logicalSessionTimeoutMinutes 30). */
	int64_t session_timeout_ms;
} sdb_store_opts;

#define SDB_STORE_SESSION_TIMEOUT_MS (30LL * 60 * 1000)

/* Open (creating if needed) the store in directory dir (created if missing, mode 0700).
 * opts may be NULL for defaults. Free with sdb_store_close() after every connection has
 * been closed. Errors: message in err, *out untouched; SDB_EIO (dir cannot be created,
 * the database cannot be opened, configured or given its schema), SDB_ECORRUPT (the
 * file's format version is not one this build reads). A store written before Decimal128
 * keys were exact (format 1, no meta keyenc = 2) is re-keyed here first, in one write
 * transaction over the documents that hold a decimal, and becomes format 2 (which format-1
 * binaries refuse); its errors (SDB_EIO, SDB_ECORRUPT, SDB_EINVAL for a document whose _id
 * cannot be keyed, SDB_EEXISTS on a unique partial index whose filter now admits a
 * duplicate) leave the store as it was, message "store: re-keying Decimal128 keys ...". */
int sdb_store_open(const char *dir, const sdb_store_opts *opts, sdb_store **out, char *err,
		   size_t errlen);
void sdb_store_close(sdb_store *st);

/* WAL checkpoints (storage/checkpoint.c): a store copies its WAL into the database file on
 * a thread of its own, woken when the WAL holds 1,000 frames (SQLite's automatic
 * checkpoint threshold), so no committing thread stops for a whole checkpoint; a
 * committing connection copies the last few hundred frames after the thread (so that the
 * WAL restarts), and waits for the thread's copy only when the WAL grew by 8,000 frames
 * during it (writes outpace the copy). Counts since open: *background, checkpoints run by
 * the thread; *inlined, those run by committing connections; *waits, commits that waited.
 * Any thread. */
void sdb_store_checkpoint_counts(sdb_store *st, uint64_t *background, uint64_t *inlined,
				 uint64_t *waits);
/* Whether a checkpoint failed with a disk error writing the database file (anything but
 * SQLITE_BUSY/LOCKED), which commits, writing only the WAL, do not see. The store cannot
 * checkpoint any more: its owner should stop using it (a shard member stops, as on a
 * failed apply). Any thread. Returns: the SQLite extended error code of the first such
 * checkpoint, 0 when none. */
int sdb_store_checkpoint_fault(sdb_store *st);

/* Open a connection for the calling thread. Close with sdb_store_conn_close() on the same
 * thread. Errors: SDB_EIO (SQLite cannot open or configure it; *out = NULL). */
int sdb_store_conn_open(sdb_store *st, sdb_store_conn **out, char *err, size_t errlen);
void sdb_store_conn_close(sdb_store_conn *c);

/* --- transactions --- */

/* Begin a read (snapshot) or write (BEGIN IMMEDIATE: takes the write lock, waiting up to
 * 10 s) transaction. Every other call below needs an open transaction (writes need a
 * write one). Inside an apply transaction it opens the savepoint "cmd" instead. Errors:
 * SDB_EINVAL (a transaction is already open), SDB_EBUSY (lock timeout), SDB_EIO (SQLite
 * error, or the catalog cache could not be loaded). */
int sdb_store_begin(sdb_store_conn *c, bool write, char *err, size_t errlen);
/* Commit (durable when it returns 0, see synchronous=FULL above); inside an apply
 * transaction it releases the savepoint "cmd". Errors: SDB_EINVAL (no transaction open),
 * SDB_EIO (oplog trim or COMMIT failed; the transaction is rolled back). */
int sdb_store_commit(sdb_store_conn *c, char *err, size_t errlen);
/* Roll back; safe to call with no transaction open, and with c NULL (no connection:
 * nothing to roll back). */
void sdb_store_rollback(sdb_store_conn *c);
/* True when c has no transaction open and is not inside a replicated apply
 * (sdb_store_apply_begin .. commit): a read may begin on it. */
bool sdb_store_conn_idle(const sdb_store_conn *c);
/* Keep c's read transactions open between reads (issue #19): sdb_store_rollback of a
 * read-only transaction then leaves it open, and the next sdb_store_begin(c, false)
 * takes it over (the same snapshot and catalog cache: no BEGIN, no catalog read, no
 * ROLLBACK, none of SQLite's two lock calls per read transaction) if no transaction
 * committed on the store since that snapshot began. Commits are counted by the store's
 * WAL hook, which runs after each commit of each of its connections, and by the
 * whole-store replace, so a store without its checkpoint thread (no hook) keeps nothing;
 * the hook runs only after the commit became visible to new readers, so nothing is taken
 * over either while a COMMIT of sdb_store_commit or sdb_store_apply_commit runs (another
 * connection may already have read its writes);
 * writes by another process are not counted (a data directory is one process's: the
 * role's stripedb.lock). Any other use of c ends the kept transaction first: a write or
 * apply transaction, a statement outside a transaction, a copy, check or sync. The
 * caller ends it with sdb_store_release_read soon after c falls idle (the shard: 1 ms
 * later): an open read transaction keeps WAL checkpoints from passing its snapshot and
 * the WAL from restarting. For a connection of one
 * thread, as every connection. on=false ends a kept transaction. */
void sdb_store_keep_reads(sdb_store_conn *c, bool on);
/* End the read transaction kept open on c (sdb_store_keep_reads), if any; c may be NULL. */
void sdb_store_release_read(sdb_store_conn *c);
/* Is a read transaction kept open on c (sdb_store_keep_reads)? c may be NULL (false). */
bool sdb_store_read_kept(const sdb_store_conn *c);
/* How many sdb_store_begin(c, false) took a kept read transaction over, on any of st's
 * connections, since st opened (any thread). */
uint64_t sdb_store_reads_taken_over(sdb_store *st);
/* Replicated apply (shard replica sets, issue #15): the inputs a Raft entry carries so
 * that every member running the same commands on the same state writes the same bytes.
 * now_ms: the leader's wall clock when it proposed (epoch ms: oplog ts and wall,
 * $currentDate, session expiry); term: the entry's Raft term (the oplog's `t`); seed: the
 * leader's random bytes for the entry (generated ObjectIds and collection UUIDs); min_ts:
 * see below. */
typedef struct sdb_store_det {
	int64_t now_ms;
	int64_t term;
	uint8_t seed[5];
	/* Cluster-time floor (issue #20, src/shard/clustertime.c): every oplog entry the
	 * apply writes gets a ts above this packed Timestamp (0 = none). The leader's
	 * gossiped cluster time, carried in the entry, so every member computes the same
	 * ts. */
	uint64_t min_ts;
} sdb_store_det;

/* Open the write transaction of one Raft entry (takes the write lock). Until
 * sdb_store_apply_commit/rollback, sdb_store_begin/commit/rollback of the commands run
 * inside it act on a savepoint ("cmd"), so one failed command leaves no trace and the
 * others stay; clocks, ObjectIds and UUIDs come from det; the oplog ts counter is
 * re-read from disk. Errors: SDB_EINVAL (a transaction is already open),
 * SDB_EBUSY (write lock timeout), SDB_EIO. */
int sdb_store_apply_begin(sdb_store_conn *c, const sdb_store_det *det, char *err,
			  size_t errlen);
/* Record index as the last applied Raft entry (meta 'raft_applied', same transaction),
 * trim the oplog and commit. Durable only as the connection's synchronous setting says:
 * the Raft log is the durable record, replayed after a crash from the last applied
 * index. Errors: SDB_EINVAL (no apply transaction open), SDB_EIO (then rolled back). */
int sdb_store_apply_commit(sdb_store_conn *c, uint64_t index, char *err, size_t errlen);
/* Roll back an open apply transaction (no-op when none); the oplog ts counter is re-read
 * from disk, so a rolled-back apply (a transaction's tentative statement, src/shard/txn.c)
 * leaves no trace in memory either. */
void sdb_store_apply_rollback(sdb_store_conn *c);
/* The last applied Raft entry recorded by sdb_store_apply_commit (0: none). Outside a
 * transaction. */
uint64_t sdb_store_applied_index(sdb_store_conn *c);
/* synchronous=FULL (fsync at every commit) or NORMAL (fsync at checkpoints) for this
 * connection. Errors: SDB_EIO (the PRAGMA failed). */
int sdb_store_set_durability(sdb_store_conn *c, bool full, char *err, size_t errlen);
/* Make every commit so far durable (one fsync of the WAL); leaves the connection at
 * synchronous=NORMAL. Outside a transaction. Errors: SDB_EIO (a PRAGMA or the empty
 * synchronous commit that fsyncs the WAL failed). */
int sdb_store_sync(sdb_store_conn *c, char *err, size_t errlen);
/* Whole-database copies (a shard member's snapshot installation, issue #15).
 * copy_to: write a consistent copy of the store (one read transaction) to the file path
 * (replaced), a plain SQLite file; *applied is its meta 'raft_applied'. Memory stays
 * bounded by SQLite's page caches (no sqlite3_serialize). page_size: the copy's page size
 * (rewritten to it beside path when the store's differs: a receiver of a release that
 * cannot install another size), 0 the store's own. Errors: SDB_EIO (path cannot be
 * opened or written, the read failed).
 * sdb_store_page_size: the page size of the store's file in bytes (4096 for a store made
 * before 8 KiB pages, STORE_PAGE_BYTES for a new one), 0 if it cannot be read.
 * replace_from: make this store's content the copy at path (same format), in place: other
 * connections keep working and see the new content from their next transaction (their
 * catalog caches reload); in-memory oplog counters are re-read. *applied is the new
 * 'raft_applied'. Outside a transaction. Errors: SDB_EINVAL (a transaction is open on c),
 * SDB_ECORRUPT (path is not a store copy), SDB_EIO (path cannot be read, or the copy into
 * the store failed). A copy of another page size than this store's is rewritten at this
 * store's beside path first (VACUUM INTO: disk for one more copy), since SQLite's backup
 * into a WAL database refuses another page size. */
int sdb_store_copy_to(sdb_store_conn *c, const char *path, int page_size, uint64_t *applied,
		      char *err, size_t errlen);
int sdb_store_page_size(sdb_store_conn *c);
int sdb_store_replace_from(sdb_store_conn *c, const char *path, uint64_t *applied, char *err,
			   size_t errlen);
/* Text settings in the meta table (replica-set name, member addresses). put: inside a
 * write or apply transaction; Errors: SDB_EINVAL (no write transaction), SDB_EIO. scan:
 * fn(arg, key, value) for each key starting with prefix (both valid during the call),
 * outside or inside a transaction; Errors: SDB_EIO (no message: scan takes no err). */
int sdb_store_meta_put(sdb_store_conn *c, const char *key, const char *value, char *err,
		       size_t errlen);
int sdb_store_meta_scan(sdb_store_conn *c, const char *prefix,
			void (*fn)(void *arg, const char *key, const char *value), void *arg);
/* Returns: the extended SQLite code (not an SDB_E* status) of this thread's last
 * disk/memory failure (SQLITE_FULL, SQLITE_IOERR_*, SQLITE_CORRUPT, SQLITE_NOMEM ...) since
 * the previous call, then cleared; 0 when none. A replicated apply that saw one must stop
 * the member: the other members applied the entry. */
int sdb_store_take_io_fault(void);
/* Now in epoch ms as the store sees it: the apply's det.now_ms inside a replicated apply,
 * else the store's clock (sdb_store_opts.clock_ms). */
int64_t sdb_store_now_ms(const sdb_store_conn *c);
/* A new ObjectId: bson_oid_init outside an apply; inside it, seconds of det.now_ms, the
 * 5 seed bytes and a counter of the apply (the same on every member). */
void sdb_store_new_oid(sdb_store_conn *c, bson_oid_t *oid);

/* Savepoints, to undo one failed item of a batch without losing the others: each
 * sdb_store_savepoint is closed by one release (keep its writes) or rollback (undo them),
 * innermost first. Errors: sdb_store_savepoint returns SDB_EIO (no message: it takes no
 * err). */
int sdb_store_savepoint(sdb_store_conn *c);
void sdb_store_savepoint_release(sdb_store_conn *c);
void sdb_store_savepoint_rollback(sdb_store_conn *c);

/* --- catalog --- */

typedef struct sdb_store_index {
	char *name;   /* "a_1" */
	bson_t *spec; /* {v: 2, key: {...}, name: ..., unique?: true, ...} (as listIndexes) */
	bson_t *key;  /* the key pattern {a: 1, b: -1} (points into spec's data copy) */
	bool unique;
	bool sparse;
	bool multikey; /* some document gave it several keys (arrays): bounds and sorts are
			* restricted as in MongoDB */
	bool hidden;   /* spec hidden: true (collMod / createIndexes): maintained, never
			* chosen by the planner (MongoDB 4.4's hidden indexes) */
	bool hashed;   /* {f: "hashed"}: one key per document, enc(NumberLong(hash of f)),
			* sdb_keyenc_hash_value; bounds for equality / $in on f only, no
			* sort */
	int64_t tbl;   /* i_N table number */
	/* the index's collation (issue #20, storage/collation.h; spec's `collation`), NULL
	 * for simple: its string keys are ICU sort keys, so it serves bounds and sorts only
	 * to a query of the same collation */
	const struct sdb_collator *coll;
	/* the index's partialFilterExpression compiled (issue #20, storage/partial.c), NULL
	 * when it has none: only the documents it matches (under coll) have entries, and the
	 * planner uses the index only for a query whose filter implies it */
	struct sdb_matcher *partial;
} sdb_store_index;

typedef struct sdb_store_coll {
	char *db, *coll;
	int64_t tbl;      /* c_N table number */
	uint8_t uuid[16]; /* collection UUID (oplog ui, listCollections info.uuid) */
	bson_t *options;  /* create options as given (may be empty) */
	size_t n_indexes; /* secondary indexes (not _id_) */
	sdb_store_index *indexes;
} sdb_store_coll;

/* Look db.coll up. *out is owned by the connection's catalog cache and valid until the
 * transaction ends. Errors: SDB_ENOTFOUND (no such collection; *out = NULL). */
int sdb_store_coll_get(sdb_store_conn *c, const char *db, const char *coll,
		       const sdb_store_coll **out, char *err, size_t errlen);
/* Create db.coll (write txn). options (may be NULL) is stored as given. Logs a "c" oplog
 * entry {create: coll} with origin (may be NULL). *out (out may be NULL) is the new
 * catalog entry, as sdb_store_coll_get. Errors: SDB_EEXISTS (already there; *out still set
 * when out != NULL), SDB_EINVAL (bad database or collection name; or a database whose name
 * differs from db only in ASCII case exists: then sdb_store_write_code is 13297
 * DatabaseDifferCase, mongod's), SDB_EIO. */
int sdb_store_coll_create(sdb_store_conn *c, const char *db, const char *coll,
			  const bson_t *options, const char *origin, const sdb_store_coll **out,
			  char *err, size_t errlen);
/* collMod (issue #20, MongoDB's coll_mod.cpp): in a write txn, replace db.coll's stored
 * options by options (NULL: unchanged) and/or the spec of its index index_name by
 * index_spec (NULL: unchanged; the caller builds the new spec: hidden, expireAfterSeconds),
 * and log one "c" oplog entry with o = oplog_o (MongoDB's {collMod: coll, ...}) and origin
 * (may be NULL). Errors: SDB_ENOTFOUND (no such collection), SDB_EIO. */
int sdb_store_coll_mod(sdb_store_conn *c, const char *db, const char *coll,
		       const bson_t *options, const char *index_name, const bson_t *index_spec,
		       const bson_t *oplog_o, const char *origin, char *err, size_t errlen);
/* Drop db.coll with its indexes (write txn); logs a "c" oplog entry {drop: coll}. Errors:
 * SDB_ENOTFOUND (no such collection), SDB_EIO. */
int sdb_store_coll_drop(sdb_store_conn *c, const char *db, const char *coll,
			const char *origin, char *err, size_t errlen);
/* Rename from_db.from_coll to to_db.to_coll (write txn; the databases may differ: a
 * collection's tables do not depend on its name, so this only moves its catalog rows),
 * keeping its documents, indexes, options and UUID. With drop_target an existing target
 * (a collection or a view) is dropped first in the same transaction; stay_temp is only
 * recorded (stripedb has no temporary collections). Logs one "c" oplog entry as MongoDB's
 * (ns "<from_db>.$cmd", ui the source's UUID, o {renameCollection: "from_db.from_coll", to:
 * "to_db.to_coll", stayTemp, dropTarget: <the dropped target's UUID, only when one was
 * dropped>}) with origin (may be NULL). Filtering metadata and views are the caller's to
 * check (the shard refuses sharded collections and views). Errors: SDB_ENOTFOUND (no
 * source), SDB_EEXISTS (the target exists and drop_target is false: "target namespace
 * exists"), SDB_EINVAL (bad target name, or the same namespace; or to_db differs from an
 * existing database only in case: sdb_store_write_code 13297), SDB_EIO. */
int sdb_store_coll_rename(sdb_store_conn *c, const char *from_db, const char *from_coll,
			  const char *to_db, const char *to_coll, bool drop_target,
			  bool stay_temp, const char *origin, char *err, size_t errlen);
/* Drop every collection of db (write txn). *n_dropped receives the count (may be 0);
 * logs each collection's "c" oplog entry {drop: coll} and then {dropDatabase: 1} when it
 * is not 0 (mongod's oplog). Errors: SDB_EIO (collections
 * dropped before the failure stay dropped until the transaction is rolled back). */
int sdb_store_db_drop(sdb_store_conn *c, const char *db, const char *origin, int *n_dropped,
		      char *err, size_t errlen);
/* List the collections of db (db NULL = every database) as a heap array of heap strings
 * "db\0coll" pairs: names[i*2] is the db, names[i*2+1] the collection. Free with
 * sdb_store_names_free(names, n). Returns: always 0 (read from the connection's catalog
 * cache; err unused). */
int sdb_store_coll_list(sdb_store_conn *c, const char *db, char ***names, size_t *n,
			char *err, size_t errlen);
void sdb_store_names_free(char **names, size_t n);

/* Create a secondary index from spec (MongoDB createIndexes shape: {key: {...}, name,
 * unique?, sparse?}; key {f: 1, g: -1} or one hashed field {f: "hashed"}) on an existing
 * collection, indexing the existing documents (write txn), creating the collection when
 * it is missing. A unique hashed index is refused (mongo code 16764), a document with an
 * array at or along a hashed path fails the build (16766). Errors: SDB_EEXISTS (same name and
 * same key: nothing to do, *created = false; also a unique index over duplicate values,
 * with the duplicate-key message), SDB_ECONFLICT (same name with another key or options,
 * or same key with another name: msg says which; code 85/86 by *mongo_code), SDB_EINVAL
 * (bad spec or key pattern, mongo code 67 or 2; a document whose keys cannot be built,
 * e.g. parallel arrays), SDB_ECORRUPT (a stored document does not parse), SDB_EINTERNAL,
 * SDB_EIO. */
int sdb_store_index_create(sdb_store_conn *c, const char *db, const char *coll,
			   const bson_t *spec, const char *origin, bool *created, int *mongo_code,
			   char *err, size_t errlen);
/* Drop one secondary index by name (write txn); logs a "c" oplog entry {dropIndexes}.
 * Errors: SDB_ENOTFOUND (no such collection or index), SDB_EINVAL (_id_), SDB_EIO. */
int sdb_store_index_drop(sdb_store_conn *c, const char *db, const char *coll,
			 const char *name, const char *origin, char *err, size_t errlen);

/* --- documents --- */

/* A duplicate-key violation, filled by insert/replace when they return SDB_EEXISTS:
 * errmsg as MongoDB ("E11000 duplicate key error collection: db.c index: a_1 dup key:
 * { a: 1 }"), keyPattern and keyValue as in the writeError. Free with
 * sdb_store_dup_clear(). */
typedef struct sdb_store_dup {
	char *errmsg;
	bson_t key_pattern;
	bson_t key_value;
	bool set;
} sdb_store_dup;
void sdb_store_dup_clear(sdb_store_dup *d);

/* The MongoDB code of the document's fault in c's last failed sdb_store_insert or
 * sdb_store_replace: 53 InvalidIdField (an array/regex/undefined _id), 171
 * CannotIndexParallelArrays, 2 BadValue (no _id), 13297 DatabaseDifferCase (the
 * collection had to be created in a database whose name differs from an existing one only
 * in case; also after a failed sdb_store_coll_create); 0 when the failure had no such code (then
 * SDB_EEXISTS is DuplicateKey, other SDB_EINVAL BadValue). Returns: that MongoDB code,
 * never an SDB_E* status. */
int sdb_store_write_code(const sdb_store_conn *c);

/* Insert doc (which must have _id as its first field; the caller adds one) into db.coll,
 * creating the collection if missing (write txn). Appends an "i" oplog entry tagged with
 * origin (may be NULL), o2 the document's documentKey (see the top of this file).
 * Errors: SDB_EEXISTS (duplicate key on _id or a unique index: dup filled), SDB_EINVAL
 * (no _id, _id an array/regex/undefined, index keys that cannot be built such as parallel
 * arrays: sdb_store_write_code tells which; a bad collection name when it has to be
 * created; an oplog entry that would exceed 16 MiB + 15 KiB with its documentKey), SDB_EIO. */
int sdb_store_insert(sdb_store_conn *c, const char *db, const char *coll, const bson_t *doc,
		     const char *origin, sdb_store_dup *dup, char *err, size_t errlen);
/* Replace the document whose _id is old_doc's _id by new_doc (same _id) (write txn):
 * rewrites index entries and appends a "u" oplog entry with o = new_doc, o2 = the stored
 * document's documentKey (see the top of this file; {_id} with origin).
 * Errors: SDB_ENOTFOUND (no such collection or document), SDB_EEXISTS (unique index
 * violation, dup filled), SDB_EINVAL (a bad _id, the _ids differ, keys that cannot be
 * built), SDB_ECORRUPT (the stored document does not parse), SDB_EIO. */
int sdb_store_replace(sdb_store_conn *c, const char *db, const char *coll,
		      const bson_t *old_doc, const bson_t *new_doc, const char *origin,
		      sdb_store_dup *dup, char *err, size_t errlen);
/* The kind of update that made a document's new image (what its "u" oplog entry says). */
typedef enum {
	SDB_STORE_UPD_REPLACE = 0, /* a replacement document: no updateDescription */
	SDB_STORE_UPD_MODIFIER,	   /* update operators: an updateDescription always */
	SDB_STORE_UPD_PIPELINE,	   /* an update pipeline: an updateDescription unless the diff
				      is not smaller than new_doc (then none, as mongod logs a
				      replacement; sdb_docdiff_describe) */
} sdb_store_upd_kind;
/* Largest new_doc plus updateDescription that a "u" entry carries: a larger update is
 * logged without its description (a replace for the change stream), so that every oplog
 * entry, with its other fields, fits in one cursor batch of a 16 MiB reply (the shard's
 * SHARD_MAX_REPLY_BYTES, 16 MiB - 64 KiB) and CDC tailing never sticks on an entry. */
#define SDB_STORE_UD_MAX_BYTES (16 * 1024 * 1024 - 128 * 1024)
/* sdb_store_replace for an update: the "u" oplog entry also carries updateDescription
 * ({updatedFields, removedFields, truncatedArrays}, storage/docdiff.h), ud when it is not
 * NULL (written as given, kind ignored: the replay of a transaction's captured entry),
 * else the diff of the stored image and new_doc for kind; none when new_doc and the
 * description together exceed SDB_STORE_UD_MAX_BYTES. o stays the whole new_doc.
 * Deterministic: every member applying the same write writes the same entry.
 * Errors: sdb_store_replace's; SDB_ECORRUPT also when an image's nested BSON does not
 * parse. */
int sdb_store_update(sdb_store_conn *c, const char *db, const char *coll,
		     const bson_t *old_doc, const bson_t *new_doc, sdb_store_upd_kind kind,
		     const bson_t *ud, const char *origin, sdb_store_dup *dup, char *err,
		     size_t errlen);
/* sdb_store_update where the caller holds the stored document itself: stored is, byte for
 * byte, the document with new_doc's _id as this write transaction reads it now (a query's
 * or sdb_store_get_by_id's result on c, nothing written to that document since), and takes
 * old_doc's place. The document is then not read again: index entries are removed from
 * stored's keys, the updateDescription and o2 come from it, and the UPDATE by key is the
 * write's only descent of the collection's B-tree. An image that is not the stored one
 * would leave index entries of keys the document no longer has: debug builds
 * (--enable-debug) read the document and abort on a difference. The caller keeps
 * ownership of stored. Errors: sdb_store_update's (SDB_ENOTFOUND when no document has
 * that _id, nothing written then). */
int sdb_store_update_stored(sdb_store_conn *c, const char *db, const char *coll,
			    const bson_t *stored, const bson_t *new_doc, sdb_store_upd_kind kind,
			    const bson_t *ud, const char *origin, sdb_store_dup *dup, char *err,
			    size_t errlen);
/* Delete doc (by its _id) (write txn): removes index entries, appends a "d" oplog entry
 * {o: {_id}}, or, when the store has filtering metadata for db.coll, {o: {<the shard key's
 * fields of the deleted document>, _id}} (MongoDB's documentKey, of the stored image). Errors: SDB_ENOTFOUND (no such collection or document), SDB_EINVAL (doc has
 * no usable _id), SDB_ECORRUPT (the stored document does not parse), SDB_EIO. */
int sdb_store_delete(sdb_store_conn *c, const char *db, const char *coll, const bson_t *doc,
		     const char *origin, char *err, size_t errlen);
/* Find the document with this _id value (iter positioned on an _id element). On found,
 * *out (uninitialised) receives a copy: bson_destroy it. Errors: SDB_ENOTFOUND (no such
 * collection or document), SDB_EINVAL (a value that cannot be encoded as a key),
 * SDB_ECORRUPT (the stored document does not parse), SDB_EIO. */
int sdb_store_get_by_id(sdb_store_conn *c, const char *db, const char *coll,
			const bson_iter_t *id, bson_t *out, char *err, size_t errlen);
/* Count documents of db.coll (0 if missing). */
int64_t sdb_store_count(sdb_store_conn *c, const char *db, const char *coll);
/* Sum of document sizes in bytes (collStats size). */
int64_t sdb_store_data_size(sdb_store_conn *c, const char *db, const char *coll);

/* --- scans --- */

/* One range of encoded index keys; lo/hi NULL = unbounded. Keys compare as byte strings
 * (memcmp order); the encoding (storage/keyenc.h) makes that MongoDB's order. */
typedef struct sdb_store_range {
	const uint8_t *lo;
	size_t lo_len;
	bool lo_incl;
	const uint8_t *hi;
	size_t hi_len;
	bool hi_incl;
} sdb_store_range;

/* Open a scan of db.coll in a transaction: index NULL = every document in _id order
 * (collection scan; ranges then apply to the _id key), otherwise the secondary index of
 * that name over ranges (each in key order, ranges given in ascending order; n_ranges 0 =
 * the whole index), documents deduplicated (multikey). reverse walks backwards. Close with
 * sdb_store_cursor_close() before the transaction ends. Errors: SDB_ENOTFOUND (no
 * collection: *out = NULL, an empty result), SDB_EINVAL (no such index), SDB_EIO. */
int sdb_store_scan(sdb_store_conn *c, const char *db, const char *coll, const char *index,
		   const sdb_store_range *ranges, size_t n_ranges, bool reverse,
		   sdb_store_cursor **out, char *err, size_t errlen);
/* Next document: 1 with *doc initialised read-only over memory valid until the next call
 * (do not destroy), 0 at the end. Errors: SDB_ECORRUPT (a stored document does not
 * parse), SDB_ECANCELED (interrupted: sdb_store_set_interrupt), SDB_EIO. */
int sdb_store_cursor_next(sdb_store_cursor *cur, bson_t *doc, char *err, size_t errlen);
/* Interruption (killOp, issue #20): while set on a thread, every sdb_store_cursor_next on
 * that thread (every document a query, an aggregation or a $lookup reads) first asks
 * fn(arg) and, when it says true, fails with SDB_ECANCELED "operation was interrupted".
 * fn NULL clears it. Thread-local: set by the thread that runs a client's command, around
 * it (src/shard/pool.c); fn must be cheap and callable from that thread. */
void sdb_store_set_interrupt(bool (*fn)(const void *arg), const void *arg);
/* The same check on demand, for work that reads no document for a long time (the loops of
 * one aggregation expression, storage/pipeline_expr*.c): true when the fn set on this
 * thread says the operation is to stop (false when none is set). As cheap as fn. */
bool sdb_store_interrupted(void);
/* Keys and documents examined so far (explain executionStats). */
void sdb_store_cursor_stats(const sdb_store_cursor *cur, int64_t *keys, int64_t *docs);
void sdb_store_cursor_close(sdb_store_cursor *cur);

/* --- oplog --- */

/* Read up to max oplog entries with ts > after (a Timestamp packed as secs<<32|inc), in ts
 * order, appending each entry document to *docs (an array of heap bson_t*, *n updated; free
 * each with sdb_doc_free and the array with free). Read txn. Errors: SDB_EIO (entries
 * appended before the failure stay in *docs for the caller to free). */
int sdb_store_oplog_read(sdb_store_conn *c, uint64_t after, size_t max, bson_t ***docs,
			 size_t *n, char *err, size_t errlen);
/* Up to max entries with after < ts < before (before 0 = no upper bound), newest first
 * (the `sort: {$natural: -1}` read, in chunks). Same ownership and errors as
 * sdb_store_oplog_read: Errors: SDB_EIO. */
int sdb_store_oplog_read_desc(sdb_store_conn *c, uint64_t after, uint64_t before, size_t max,
			      bson_t ***docs, size_t *n, char *err, size_t errlen);
/* Newest committed oplog ts visible to the transaction (0 when the oplog is empty). */
uint64_t sdb_store_oplog_last(sdb_store_conn *c);
/* Oldest ts in the oplog (0 if empty). */
uint64_t sdb_store_oplog_first(sdb_store_conn *c);
/* Count of oplog entries. */
int64_t sdb_store_oplog_count(sdb_store_conn *c);
/* Has the oplog ever been trimmed (meta 'oplog_trimmed')? When not, it holds every entry
 * since the store was created, so a change stream may start at any point (any txn). */
bool sdb_store_oplog_trimmed(sdb_store_conn *c);
/* The newest ts the oplog's trimming deleted (any txn): 0 never trimmed, 1 trimmed up to a
 * ts not recorded (a store trimmed by an earlier version), else the packed ts. An entry
 * with a ts above it was never trimmed: a reader positioned at P lost history exactly when
 * this is above P. */
uint64_t sdb_store_oplog_trimmed_upto(sdb_store_conn *c);
/* MongoDB's appendOplogNote (write txn; inside a replicated apply the result is the same on
 * every member): append a no-op entry {op: "n", ns: "", o: data} whose ts is above
 * min_ts (a packed Timestamp; 0 = no floor). When the newest oplog entry already is above
 * min_ts (min_ts != 0; not the ts counter, which failed writes move too), nothing is written and *written is false. The floor comes from the
 * command (its maxClusterTime), so every member computes the same ts: the ts counter is
 * raised to min_ts first, then allocated as for any entry. Errors: SDB_EINVAL (min_ts
 * more than an hour of seconds ahead of the store's clock: a ts that far ahead would hold
 * the oplog's clock there), SDB_EIO. */
int sdb_store_oplog_note(sdb_store_conn *c, const bson_t *data, uint64_t min_ts, bool *written,
			 char *err, size_t errlen);
/* The highest ts ever committed by this process or found at open (atomic read). Used by
 * awaitData cursors to know whether to re-read. */
uint64_t sdb_store_oplog_committed(sdb_store *st);

/* --- retryable writes (storage/session.c; MongoDB's config.transactions) ---
 *
 * A session (lsid: the command's lsid document, compared byte for byte) has one active
 * txnNumber; for it the store keeps the result document of every executed statement
 * (stmtId -> result, opaque to the store), written in the same transaction as the write
 * itself, so a retry after a crash or a lost reply finds exactly what was applied.
 * A newer txnNumber forgets the older statements; an older one is refused. Records unused
 * for sdb_store_opts.session_timeout_ms are gone (treated as absent at once, deleted by a
 * sweep that runs inside some later session write, at most once a minute). */

/* Start or continue txn of session lsid in the open write transaction (and mark the
 * session used). Errors: SDB_ESTALE when a newer txnNumber has started (*stored gets it:
 * MongoDB's TransactionTooOld, 225), SDB_EINVAL (no write transaction), SDB_EIO. */
int sdb_store_session_begin(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int64_t *stored,
			    char *err, size_t errlen);
/* The recorded result of statement stmt of lsid's active txnNumber (call after
 * sdb_store_session_begin in the same transaction): 1 with *out a heap copy (sdb_doc_free),
 * 0 when not executed (*out NULL). Errors: SDB_ECORRUPT (the record does not parse),
 * SDB_EIO. */
int sdb_store_session_stmt_get(sdb_store_conn *c, const bson_t *lsid, int32_t stmt,
			       bson_t **out, char *err, size_t errlen);
/* Record stmt's result for lsid's active txnNumber (write txn, same transaction or
 * savepoint as the statement's writes). Errors: SDB_EIO. */
int sdb_store_session_stmt_put(sdb_store_conn *c, const bson_t *lsid, int32_t stmt,
			       const bson_t *result, char *err, size_t errlen);
/* Tag the oplog entries written next on c with lsid (borrowed: keep it alive until the
 * next call or the end of the transaction), txnNumber and stmtId, as MongoDB's oplog
 * carries them; lsid NULL stops tagging. Reset when the transaction ends. */
void sdb_store_set_op_session(sdb_store_conn *c, const bson_t *lsid, int64_t txn,
			      int32_t stmt);
/* Mark the ops tagged by the last sdb_store_set_op_session (lsid not NULL) as a
 * multi-document transaction's commit (stripedbApplyTxn): their oplog entries also get
 * `inTxn: true`, which change streams read to report lsid and txnNumber (a retryable
 * write's entries carry the session fields too, without it). Until the next
 * sdb_store_set_op_session. */
void sdb_store_set_op_txn(sdb_store_conn *c);
/* Add {stmtResult: result} to every oplog entry written for the statement tagged by the
 * last sdb_store_set_op_session (write txn, before the tag is cleared), so that the
 * statement's recorded outcome travels with its entries (CDC, migrations: MongoDB carries
 * the same through its oplog chain and config.image_collection). An entry that would
 * grow past SDB_STORE_UD_MAX_BYTES (a findAndModify of a document near 16 MiB carries it
 * twice) keeps no stmtResult, so that every entry stays readable by one oplog batch (CDC
 * tailing never sticks on it); a migration then carries the session's incomplete-history
 * marker (a retry on the new owner is 217, never run twice). The shard's own session
 * record is unaffected. 0 when the statement wrote no entry. Errors: SDB_EIO. */
int sdb_store_oplog_stmt_result(sdb_store_conn *c, const bson_t *result, char *err,
				size_t errlen);
/* The statement id of a session's "incomplete history" marker (MongoDB's
 * kIncompleteHistoryStmtId): a retry of a statement of that txnNumber with no record is
 * refused (IncompleteTransactionHistory, 217) instead of being run again. */
#define SDB_STMT_INCOMPLETE_HISTORY (-1)
/* Import a statement record written elsewhere (a migrated chunk's session history, write
 * txn): when lsid has no live record or an older txnNumber, the session moves to txn
 * (older statements forgotten); when it has a newer txnNumber the record is dropped (the
 * client moved on); then stmt's result is stored (result NULL with stmt
 * SDB_STMT_INCOMPLETE_HISTORY stores the marker). Errors: SDB_EINVAL (no write
 * transaction), SDB_EIO. */
int sdb_store_session_import(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int32_t stmt,
			     const bson_t *result, char *err, size_t errlen);
/* Read-only look-up (any txn): 1 when lsid's active txnNumber is txn (not expired) and
 * stmt is recorded for it (*out a heap copy, sdb_doc_free), else 0 (*out NULL). Errors:
 * SDB_ECORRUPT (the record does not parse), SDB_EIO. */
int sdb_store_session_peek(sdb_store_conn *c, const bson_t *lsid, int64_t txn, int32_t stmt,
			   bson_t **out, char *err, size_t errlen);
/* The live sessions (not expired) in lsid byte order after `after` (NULL: from the start),
 * at most max: fn(lsid, txnNumber, arg) each (lsid valid during the call). Any txn.
 * Returns the count listed (== max: there may be more), or SDB_EIO. A migration marks the
 * sessions of its source whose history it cannot carry (src/coordinator/migrate_sess.h). */
int64_t sdb_store_session_list(sdb_store_conn *c, const bson_t *after, int64_t max,
			       void (*fn)(const bson_t *lsid, int64_t txn, void *arg), void *arg,
			       char *err, size_t errlen);
/* The live (not expired) txnNumber of session lsid (any txn): 1 with *txn set, 0 when the
 * session has no live record. Errors: SDB_EIO. */
int sdb_store_session_txn(sdb_store_conn *c, const bson_t *lsid, int64_t *txn, char *err,
			  size_t errlen);
/* Number of live session records (tests, metrics). Any txn. */
int64_t sdb_store_session_count(sdb_store_conn *c);

/* --- version tokens --- */

/* Check a request's token for chunk against the stored one (any txn). Returns 0 when
 * token >= stored (or nothing stored); *stored gets the stored token (0 when none).
 * Errors: SDB_ESTALE (token older than the stored one), SDB_EIO. */
int sdb_store_version_check(sdb_store_conn *c, const char *chunk, int64_t token,
			    int64_t *stored, char *err, size_t errlen);
/* Move chunk's token forward to token (write txn); never backwards. *stored gets the
 * token in force afterwards (max of old and new). Errors: SDB_EIO. */
int sdb_store_version_set(sdb_store_conn *c, const char *chunk, int64_t token,
			  int64_t *stored, char *err, size_t errlen);

/* --- filtering metadata (storage/filtering.c, issue #17) ---
 *
 * What a shard owns of one sharded collection "db.coll": a document
 *   {key: <shard key pattern>, chunks: [{id: "17", min: {...}, max: {...}, token: N}]}
 * with two numbers: cversion, the collection version the installer saw (the largest chunk
 * token of the whole collection at the time of the install), and sversion, this shard's
 * version (the largest token over the chunks listed, 0 when none). One row per namespace
 * in table `filtering`, written only by replicated commands (stripedbSetFiltering). */

/* Read ns's row (any txn): 0 with *cver, *sver, *gen (the install count of ns: a new value
 * at every install, the same on every member), and *doc (a heap copy, bson_destroy)
 * when doc is not NULL. Errors: SDB_ENOTFOUND when the shard has no filtering metadata for
 * ns, SDB_EIO (also a stored document that does not parse). */
int sdb_store_filtering_get(sdb_store_conn *c, const char *ns, int64_t *cver, int64_t *sver,
			    int64_t *gen, bson_t **doc, char *err, size_t errlen);
/* Install ns's metadata (write txn). SDB_ESTALE (nothing written) when cver is older than
 * the installed collection version: an installer never moves the metadata back. Errors:
 * SDB_ESTALE, SDB_EIO. */
int sdb_store_filtering_set(sdb_store_conn *c, const char *ns, int64_t cver, int64_t sver,
			    const bson_t *doc, char *err, size_t errlen);
/* One installed namespace for sdb_store_filtering_list: ns (valid during the call), its
 * collection version, shard version and install count. Return false to stop the walk. */
typedef bool (*sdb_store_filtering_fn)(void *arg, const char *ns, int64_t cver, int64_t sver,
				       int64_t gen);
/* Call fn for every namespace with filtering metadata, in ns order (any txn; the documents
 * are not read). Errors: SDB_EIO. */
int sdb_store_filtering_list(sdb_store_conn *c, sdb_store_filtering_fn fn, void *arg, char *err,
			     size_t errlen);
/* Forget ns's metadata (write txn); nothing installed is not an error. Errors: SDB_EIO. */
int sdb_store_filtering_drop(sdb_store_conn *c, const char *ns, char *err, size_t errlen);
/* Forget the metadata of every collection of database db (write txn). Errors: SDB_EIO. */
int sdb_store_filtering_drop_db(sdb_store_conn *c, const char *db, char *err, size_t errlen);

/* --- integrity --- */

/* Verify (read txn) that every index holds exactly the keys its collection's documents
 * produce, that every document parses and its key matches its _id, and that the oplog
 * agrees with the data (each live document's latest oplog entry within the retained
 * oplog is an insert/update whose image equals the stored document; no deleted document
 * has a later insert/update without delete). Problems are appended to problems
 * (an array builder: strings) and counted in *n_problems (problems found are not errors).
 * Errors: SDB_EIO (a read failed; problems holds what was found before). */
int sdb_store_check(sdb_store_conn *c, bson_t *problems, int *n_problems, char *err,
		    size_t errlen);

/* What sdb_store_validate counted of one collection (the validate command's nrecords,
 * nInvalidDocuments, nIndexes and keysPerIndex). Free with sdb_store_validation_free. */
typedef struct sdb_store_validation {
	int64_t nrecords;   /* documents read */
	int64_t n_invalid;  /* of them: not valid BSON, or stored under another _id key */
	size_t n_indexes;   /* secondary indexes (not _id_) */
	char **index_names; /* [n_indexes], heap */
	int64_t *index_keys; /* [n_indexes]: the rows each index holds */
} sdb_store_validation;

/* MongoDB's validate of db.coll (read txn): the checks of sdb_store_check for that one
 * collection (documents parse and match their _id key; every index holds exactly the keys
 * the documents give), problems appended to problems (an array builder: strings, at most
 * 1,000) and counted in *n_problems; v gets the counts (always initialised: free it). With
 * metadata_only (validate {metadata: true}) only the index specifications are checked and
 * no document is read. Errors: SDB_ENOTFOUND (no such collection), SDB_EIO. */
int sdb_store_validate(sdb_store_conn *c, const char *db, const char *coll, bool metadata_only,
		       sdb_store_validation *v, bson_t *problems, int *n_problems, char *err,
		       size_t errlen);
void sdb_store_validation_free(sdb_store_validation *v);

/* The byte length of a document, read from its data: heap bson_t (bson_new, bson_copy)
 * are not allocated with the 128-byte alignment the type declares, so their members must
 * not be read directly (UBSan), only through libbson. */
static inline uint32_t sdb_store_doc_len(const bson_t *b)
{
	const uint8_t *d = bson_get_data(b);
	return (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
}

/* Structs that embed a bson_t: sdb_calloc_bson (common/alloc.h). */

/* Heap documents that other modules may read through the bson_t members: allocated with
 * the type's alignment (bson_new's are not). Every document array of the store and the
 * shard (oplog reads, query results, cursors) holds these; free with sdb_doc_free, never
 * bson_destroy alone. sdb_doc_new_from_data returns NULL for invalid BSON framing. */
bson_t *sdb_doc_new(void);
bson_t *sdb_doc_copy(const bson_t *src);
bson_t *sdb_doc_new_from_data(const uint8_t *data, size_t len);
void sdb_doc_free(bson_t *b);

/* Pack/unpack a BSON Timestamp into the oplog's 64-bit ts. */
static inline uint64_t sdb_store_ts_pack(uint32_t secs, uint32_t inc)
{
	return ((uint64_t)secs << 32) | inc;
}

#endif
