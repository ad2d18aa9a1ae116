/* Backups of shards into the CDC archive (issue #22). A backup of a shard is, in the
 * archive (cdc_archive_obj_*):
 *   backups/<shard>/<id>/data-NNNNN.bson  one collection's documents back to back, read
 *                                          with the shard's point-in-time read
 *                                          (stripedbSnapshot), one object per collection
 *   backups/<shard>/<id>/manifest.json    canonical Extended JSON, uploaded last (the
 *                                          commit point): {id, shard, startedAt, headTs,
 *                                          headWall, collections: [{ns, object, atOplogTs,
 *                                          atWall, count, bytes, sha256, ownedOnly,
 *                                          collectionVersion, shardVersion, indexes}], finishedAt,
 *                                          documents, bytes, importLatencyMS,
 *                                          throttledMS}
 * <id> is the start time "YYYYMMDDTHHMMSS.mmmZ" (UTC; sorts as time). Used by
 * `stripedb ctl backup|restore` (cli/backup.c) and the coordinator's --backup-interval.
 */
#ifndef SDB_CDC_BACKUP_H
#define SDB_CDC_BACKUP_H

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <stddef.h>
#include <stdint.h>

#include "cdc/archive.h"

/* What one stripedbSnapshot read gave: its oplog position (secs << 32 | inc), documents,
 * bytes and the SHA-256 (hex) of the documents as written; filtered = 1 when the read kept
 * only the documents of the chunks the shard owned at that snapshot (its filtering
 * metadata, with those collection and shard versions), 0 for a collection the shard has
 * no filtering metadata for (unsharded, or never part of a migration on this shard). */
typedef struct cdc_snap {
	uint64_t at;
	int64_t count, bytes;
	char sha[65];
	int filtered;
	int64_t collection_version, shard_version;
} cdc_snap;

/* Totals of one shard's backup; throttled_ms: time spent backing off by the import
 * throttle (common/throttle.h). */
typedef struct cdc_backup_stats {
	int collections;
	int64_t documents, bytes, throttled_ms;
} cdc_backup_stats;

/* Progress of one shard's backup, given to cdc_backup_opts.progress after every batch
 * (1000 documents) of a snapshot read and once more when the shard's manifest is
 * uploaded (finished = 1; never after a failure). done: documents read so far;
 * expected: the sum of the collections' counts taken before the reads, an estimate
 * (writes during the backup make done end above or below it); throttled_ms: back-off so
 * far. shard is borrowed for the call. */
typedef struct cdc_backup_progress {
	const char *shard;
	int64_t done, expected, throttled_ms;
	int finished;
} cdc_backup_progress;

/* How to run a backup: timeout_ms for server selection and connect; import_latency_ms
 * the import throttle's limit (a snapshot batch slower than that backs off as long as it
 * took; 0 disables; SDB_IMPORT_LATENCY_MS by default); progress (NULL: none) is called
 * with arg from the backing-up thread. */
typedef struct cdc_backup_opts {
	int timeout_ms;
	int64_t import_latency_ms;
	void (*progress)(const cdc_backup_progress *p, void *arg);
	void *arg;
} cdc_backup_opts;

/* Back up the shard (id, mongodb uri) into a as backup id: head probe, listDatabases,
 * listCollections (admin, local, config, system.* skipped), each collection snapshot
 * streamed to a temporary file under $TMPDIR (memory: one batch of 1000) and uploaded, the
 * manifest last. Just before the manifest, every data object is checked to be still in
 * the archive (list), and the backup is refused when it started more than
 * CDC_BACKUP_COMMIT_MS ago, so that a manifest never names an object deleted by
 * cdc_backup_sweep. On failure the uploaded data objects are deleted. Blocking
 * (libmongoc, archive I/O). Errors: SDB_EINVAL (bad uri), SDB_EUNAVAILABLE (shard),
 * SDB_EIO, SDB_ENOTFOUND (a
 * data object vanished), SDB_ETIMEOUT (too slow to commit), archive errors; err names
 * the shard and the operation. */
int cdc_backup_shard(cdc_archive *a, const char *shard, const char *uri, const char *id,
		     int timeout_ms, cdc_backup_stats *st, char *err, size_t errlen);

/* cdc_backup_shard with options o (throttle limit, progress callback); the collections
 * are counted (`count`) before the reads, for the progress's expected total.
 * cdc_backup_shard is this with timeout_ms, SDB_IMPORT_LATENCY_MS and no progress.
 * Errors: as cdc_backup_shard. */
int cdc_backup_shard_opts(cdc_archive *a, const char *shard, const char *uri, const char *id,
			  const cdc_backup_opts *o, cdc_backup_stats *st, char *err,
			  size_t errlen);

/* Format the backup id of now_ms (epoch ms) into buf (>= 24 bytes). */
void cdc_backup_id(int64_t now_ms, char *buf, size_t n);

/* Id of shard's newest committed backup into id ("" when none). Errors: archive errors. */
int cdc_backup_newest(cdc_archive *a, const char *shard, char *id, size_t n, char *err,
		      size_t errlen);

/* Age past which an incomplete backup (data objects without a manifest: a ctl or
 * coordinator died mid-backup) may be deleted by cdc_backup_sweep: 24 h, measured from its
 * id (its start time). A backup writer refuses to commit (upload its manifest) later than
 * CDC_BACKUP_COMMIT_MS after its start, so the sweep (which also needs a newer committed
 * backup) can never delete the objects of a backup that is still going to commit, even
 * with 1 h of clock skew between the two machines. */
#define CDC_BACKUP_ORPHAN_AGE_MS (24LL * 3600 * 1000)
#define CDC_BACKUP_COMMIT_MS (CDC_BACKUP_ORPHAN_AGE_MS - 3600LL * 1000)

/* One backup found in the archive: the objects under backups/<shard>/<id>/. committed is 1
 * when its manifest.json is there (a backup), 0 when not (incomplete: being written, or
 * left behind by a writer that died); objects counts every object, manifest included. */
typedef struct cdc_backup_ent {
	char *shard, *id;
	int committed;
	size_t objects;
} cdc_backup_ent;

/* The backups of shard (NULL: of every shard) in the archive, committed or not, sorted
 * by shard then id (oldest first). *out: heap array, free with cdc_backup_ents_free.
 * Errors: archive errors (cdc_archive_obj_list). */
int cdc_backup_scan(cdc_archive *a, const char *shard, cdc_backup_ent **out, size_t *n,
		    char *err, size_t errlen);
void cdc_backup_ents_free(cdc_backup_ent *e, size_t n);

/* Delete backup id of shard, committed or not: its manifest first (the backup stops
 * existing), then every other object under backups/<shard>/<id>/. *deleted gets the
 * number of objects deleted (0: there was no such backup; not an error). Used by `ctl
 * backup delete` and cdc_backup_sweep. Errors: archive errors. */
int cdc_backup_delete(cdc_archive *a, const char *shard, const char *id, size_t *deleted,
		      char *err, size_t errlen);

/* Whether the incomplete backup id is certainly dead at now_ms (epoch ms): id is a
 * well-formed backup id older than now_ms - CDC_BACKUP_ORPHAN_AGE_MS and older than
 * newest, the shard's newest committed backup ("" when none: then never). Returns: 1
 * dead, 0 not (or not a backup id). */
int cdc_backup_orphan_dead(const char *id, const char *newest, int64_t now_ms);

/* Delete shard's incomplete backups that are certainly dead (cdc_backup_orphan_dead)
 * at now_ms; *removed gets how many incomplete backups were deleted, *kept how many were
 * left (maybe still being written). Run by the holder of the shard's cdc/<shard> lease
 * (src/coordinator/role.c). Errors: archive errors (the backups deleted before the error
 * stay deleted). */
int cdc_backup_sweep(cdc_archive *a, const char *shard, int64_t now_ms, size_t *removed,
		     size_t *kept, char *err, size_t errlen);

/* A client of uri with server selection and connect timeouts of timeout_ms, the cluster
 * key (auth/cluster.h) and error API v2; NULL for a bad uri. Caller destroys it. */
mongoc_client_t *cdc_backup_client(const char *uri, int timeout_ms);

/* The point-in-time read of db.coll on c (stripedbSnapshot, batches of 1000, one server)
 * streamed into the file path (documents back to back); *out gets its atOplogTs, count,
 * bytes and SHA-256. For a collection with filtering metadata on the shard the read is
 * gated by the installed shard version, so only owned documents are kept (no orphans, no
 * chunk being imported); a StaleConfig reads again (5 tries). With o and p (both or
 * neither NULL): the import throttle with limit o->import_latency_ms (the back-off added
 * to p->throttled_ms), each document added to p->done, and o->progress called after every
 * batch. Errors: SDB_EUNAVAILABLE, SDB_EIO. */
int cdc_backup_snapshot(mongoc_client_t *c, const char *db, const char *coll, const char *path,
			const cdc_backup_opts *o, cdc_backup_progress *p, cdc_snap *out,
			char *err, size_t errlen);

/* A fresh private directory under $TMPDIR (heap path), NULL with errno on failure. */
char *cdc_backup_tmpdir(void);

/* Fields of doc by dotted path: a Timestamp packed (0 when absent), an integer or Date as
 * int64 (0 when absent), a string (NULL when absent; borrowed from doc). */
uint64_t cdc_bson_ts(const bson_t *doc, const char *path);
int64_t cdc_bson_i64(const bson_t *doc, const char *path);
const char *cdc_bson_str(const bson_t *doc, const char *path);

/* Free a heap array of n heap strings. */
void cdc_backup_names_free(char **names, size_t n);

#endif
