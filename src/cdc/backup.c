/* Backups of shards into the CDC archive (issue #22): the part of `stripedb ctl backup
 * create` (cli/backup.c) that reads a shard and writes the archive, kept here so that a
 * server-side scheduler can run it too (the coordinator's --backup-interval). Format and
 * design: src/cdc/README.md "Backups and point-in-time restore". */
#define _GNU_SOURCE
#include "cdc/backup.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/throttle.h"

/* Documents per snapshot batch (memory bound of a backup). */
#define BATCH 1000

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

mongoc_client_t *cdc_backup_client(const char *uri, int timeout_ms)
{
	char *u = sdb_asprintf("%s%sserverSelectionTimeoutMS=%d&connectTimeoutMS=%d", uri,
			       strchr(uri, '?') ? "&" : (uri[strlen(uri) - 1] == '/' ? "?" : "/?"),
			       timeout_ms, timeout_ms);
	mongoc_client_t *c = auth_cluster_client_new(u);
	free(u);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	return c;
}

char *cdc_backup_tmpdir(void)
{
	const char *t = getenv("TMPDIR");
	char *d = sdb_asprintf("%s/stripedb-backup-XXXXXX", t && t[0] ? t : "/tmp");
	if (mkdtemp(d) == NULL) {
		free(d);
		return NULL;
	}
	return d;
}

uint64_t cdc_bson_ts(const bson_t *doc, const char *path)
{
	bson_iter_t it;
	uint32_t t, i;
	if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &it) ||
	    !BSON_ITER_HOLDS_TIMESTAMP(&it))
		return 0;
	bson_iter_timestamp(&it, &t, &i);
	return ((uint64_t)t << 32) | i;
}

int64_t cdc_bson_i64(const bson_t *doc, const char *path)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &it))
		return 0;
	if (BSON_ITER_HOLDS_DATE_TIME(&it))
		return bson_iter_date_time(&it);
	return bson_iter_as_int64(&it);
}

const char *cdc_bson_str(const bson_t *doc, const char *path)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, path, &it) ||
	    !BSON_ITER_HOLDS_UTF8(&it))
		return NULL;
	return bson_iter_utf8(&it, NULL);
}

/* Wall clock (epoch ms) of the shard's oplog entry at ts (0 for ts 0); the caller's
 * clock now when that entry is gone (trimmed: an upper bound, which only makes the
 * backup usable later). */
static int oplog_wall(mongoc_client_t *c, uint64_t ts, int64_t *wall, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply, f;
	bson_error_t e;
	*wall = 0;
	if (ts == 0)
		return 0;
	BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
	BSON_APPEND_TIMESTAMP(&f, "ts", (uint32_t)(ts >> 32), (uint32_t)ts);
	bson_append_document_end(&cmd, &f);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	int ok = mongoc_client_command_simple(c, "local", &cmd, NULL, &reply, &e);
	bson_destroy(&cmd);
	if (!ok) {
		bson_destroy(&reply);
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "find local.oplog.rs: %s",
				e.message);
	}
	*wall = cdc_bson_i64(&reply, "cursor.firstBatch.0.wall");
	if (*wall == 0)
		*wall = sdb_wall_ms();
	bson_destroy(&reply);
	return 0;
}


/* The shard's filtering metadata of db.coll on server sid (stripedbGetFiltering): 1 with
 * *cver and *sver when installed, 0 when not (or the shard predates the command), -1 with
 * err on failure. */
static int owned_versions(mongoc_client_t *c, uint32_t sid, const char *db, const char *coll,
			  int64_t *cver, int64_t *sver, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it;
	char *ns = sdb_asprintf("%s.%s", db, coll);
	BSON_APPEND_UTF8(&cmd, "stripedbGetFiltering", ns);
	free(ns);
	bool ok = mongoc_client_command_simple_with_server_id(c, "admin", &cmd, NULL, sid, &reply,
							      &e);
	bson_destroy(&cmd);
	if (!ok) {
		bson_destroy(&reply);
		if (e.domain == MONGOC_ERROR_SERVER && e.code == 59) /* CommandNotFound */
			return 0;
		sdb_errf(err, errlen, SDB_EUNAVAILABLE, "stripedbGetFiltering %s.%s: %s", db, coll,
			 e.message);
		return -1;
	}
	int installed = bson_iter_init_find(&it, &reply, "installed") &&
			BSON_ITER_HOLDS_BOOL(&it) && bson_iter_bool(&it);
	*cver = cdc_bson_i64(&reply, "collectionVersion");
	*sver = cdc_bson_i64(&reply, "shardVersion");
	bson_destroy(&reply);
	return installed;
}

/* Stream the point-in-time read of db.coll on c into path (documents back to back). When
 * the shard has filtering metadata for db.coll (a sharded collection), the read carries
 * the shard version it installed ($stripedbShardVersion, src/shard/filtering.c), so the
 * shard keeps only the documents of the chunks it owns in that same snapshot: orphans a
 * migration left behind and documents of a chunk being imported are not backed up. A
 * StaleConfig (the ownership changed between the two commands) reads again, at most 5
 * times. */
int cdc_backup_snapshot(mongoc_client_t *c, const char *db, const char *coll, const char *path,
			const cdc_backup_opts *o, cdc_backup_progress *p, cdc_snap *so, char *err,
			size_t errlen)
{
	bson_t cmd, reply, f = BSON_INITIALIZER;
	bson_error_t e;
	int rc = 0;
	memset(so, 0, sizeof *so);
	/* the command and its getMores on one server */
	mongoc_server_description_t *sd = mongoc_client_select_server(c, false, NULL, &e);
	if (!sd)
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "%s", e.message);
	uint32_t sid = mongoc_server_description_id(sd);
	mongoc_server_description_destroy(sd);
	for (int attempt = 0;; attempt++) {
		int64_t cver = 0, sver = 0;
		int inst = owned_versions(c, sid, db, coll, &cver, &sver, err, errlen);
		if (inst < 0)
			return SDB_EUNAVAILABLE;
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "stripedbSnapshot", coll);
		BSON_APPEND_DOCUMENT(&cmd, "filter", &f);
		BSON_APPEND_INT32(&cmd, "batchSize", BATCH);
		so->filtered = inst;
		so->collection_version = cver;
		so->shard_version = sver;
		if (inst) {
			bson_t sv;
			char *ns = sdb_asprintf("%s.%s", db, coll);
			BSON_APPEND_DOCUMENT_BEGIN(&cmd, "$stripedbShardVersion", &sv);
			BSON_APPEND_UTF8(&sv, "ns", ns);
			BSON_APPEND_INT64(&sv, "collectionVersion", cver);
			BSON_APPEND_INT64(&sv, "shardVersion", sver);
			bson_append_document_end(&cmd, &sv);
			free(ns);
		}
		if (mongoc_client_command_simple_with_server_id(c, db, &cmd, NULL, sid, &reply, &e))
			break;
		bson_destroy(&reply);
		bson_destroy(&cmd);
		if (!(inst && e.domain == MONGOC_ERROR_SERVER && e.code == 13388 && attempt < 4))
			return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "stripedbSnapshot %s.%s: %s",
					db, coll, e.message);
	}
	bson_destroy(&cmd);
	so->at = cdc_bson_ts(&reply, "cursor.atOplogTs");
	FILE *out = fopen(path, "wb");
	if (out == NULL) {
		bson_destroy(&reply);
		return sdb_errf(err, errlen, SDB_EIO, "create %s: %s", path, strerror(errno));
	}
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	bson_t copts = BSON_INITIALIZER;
	BSON_APPEND_INT32(&copts, "serverId", (int32_t)sid);
	mongoc_cursor_t *cs = mongoc_cursor_new_from_command_reply_with_opts(c, &reply, &copts);
	bson_destroy(&copts);
	const bson_t *doc;
	int64_t t_next = (int64_t)sdb_mono_us();
	while (rc == 0 && mongoc_cursor_next(cs, &doc)) {
		/* the import throttle (common/throttle.h), as the migration's: a getMore slower
		 * than the limit means the shard is busy; back off as long as it took */
		int64_t nap = o ? sdb_import_backoff_ms((int64_t)sdb_mono_us() - t_next,
							o->import_latency_ms)
				: 0;
		if (nap > 0) {
			if (p)
				p->throttled_ms += nap;
			sdb_sleep_ms((int)nap);
		}
		if (fwrite(bson_get_data(doc), 1, doc->len, out) != doc->len)
			rc = sdb_errf(err, errlen, SDB_EIO, "write %s: %s", path, strerror(errno));
		EVP_DigestUpdate(md, bson_get_data(doc), doc->len);
		so->count++;
		so->bytes += doc->len;
		if (p) {
			p->done++;
			if (so->count % BATCH == 0 && o && o->progress)
				o->progress(p, o->arg);
		}
		t_next = (int64_t)sdb_mono_us();
	}
	if (rc == 0 && mongoc_cursor_error(cs, &e))
		rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "stripedbSnapshot %s.%s: %s", db, coll,
			      e.message);
	mongoc_cursor_destroy(cs);
	uint8_t dg[32];
	unsigned dl = 0;
	EVP_DigestFinal_ex(md, dg, &dl);
	EVP_MD_CTX_free(md);
	hex(dg, 32, so->sha);
	if (fclose(out) != 0 && rc == 0)
		rc = sdb_errf(err, errlen, SDB_EIO, "close %s: %s", path, strerror(errno));
	return rc;
}

/* Names under `field` of the first batch of cmd's reply (listDatabases: "databases",
 * listCollections: "cursor.firstBatch"), skipping views. Heap array of heap strings. */
static int list_names(mongoc_client_t *c, const char *db, const bson_t *cmd, const char *field,
		      char ***names, size_t *n, char *err, size_t errlen)
{
	bson_t reply;
	bson_error_t e;
	bson_iter_t it, arr;
	*names = NULL;
	*n = 0;
	if (!mongoc_client_command_simple(c, db, cmd, NULL, &reply, &e)) {
		bson_destroy(&reply);
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "%s", e.message);
	}
	if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, field, &it) &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_t d;
			uint32_t l;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &l, &data);
			if (!bson_init_static(&d, data, l))
				continue;
			const char *name = cdc_bson_str(&d, "name"), *type = cdc_bson_str(&d, "type");
			if (name == NULL || (type && strcmp(type, "collection") != 0))
				continue;
			*names = sdb_realloc(*names, (*n + 1) * sizeof **names);
			(*names)[(*n)++] = sdb_strdup(name);
		}
	}
	bson_destroy(&reply);
	return 0;
}

void cdc_backup_names_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Write doc as canonical Extended JSON to path. */
static int write_json(const bson_t *doc, const char *path, char *err, size_t errlen)
{
	size_t l;
	char *j = bson_as_canonical_extended_json(doc, &l);
	FILE *f = fopen(path, "wb");
	int rc = 0;
	if (f == NULL || fwrite(j, 1, l, f) != l || fclose(f) != 0)
		rc = sdb_errf(err, errlen, SDB_EIO, "write %s: %s", path, strerror(errno));
	else
		f = NULL;
	if (f)
		fclose(f);
	bson_free(j);
	return rc;
}

/* Append to out (an array being built) the index specs of db.coll on c (listIndexes),
 * each as the shard lists it minus `v` and `ns`, the _id index left out: what a restore
 * creates on its target after loading the documents (as mongorestore does). A collection
 * gone meanwhile has none. Errors: SDB_EUNAVAILABLE with err. */
static int list_indexes(mongoc_client_t *c, const char *db, const char *coll, bson_t *out,
			char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it, arr;
	uint32_t n = 0;
	BSON_APPEND_UTF8(&cmd, "listIndexes", coll);
	bool ok = mongoc_client_command_simple(c, db, &cmd, NULL, &reply, &e);
	bson_destroy(&cmd);
	if (!ok) {
		bson_destroy(&reply);
		if (e.domain == MONGOC_ERROR_SERVER && e.code == 26) /* NamespaceNotFound */
			return 0;
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "listIndexes %s.%s: %s", db, coll,
				e.message);
	}
	if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "cursor.firstBatch", &it) &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_t spec, copy;
			bson_iter_t f;
			uint32_t l;
			const uint8_t *data;
			char k[16];
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &l, &data);
			if (!bson_init_static(&spec, data, l))
				continue;
			const char *name = cdc_bson_str(&spec, "name");
			if (name == NULL || strcmp(name, "_id_") == 0)
				continue;
			snprintf(k, sizeof k, "%u", n++);
			bson_append_document_begin(out, k, -1, &copy);
			if (bson_iter_init(&f, &spec))
				while (bson_iter_next(&f))
					if (strcmp(bson_iter_key(&f), "v") != 0 &&
					    strcmp(bson_iter_key(&f), "ns") != 0)
						bson_append_iter(&copy, NULL, 0, &f);
			bson_append_document_end(out, &copy);
		}
	}
	bson_destroy(&reply);
	return 0;
}

/* Documents in db.coll now (`count`, the shard's stored count): the progress's estimate;
 * 0 when the count fails (the snapshot read reports the error). */
static int64_t count_docs(mongoc_client_t *c, const char *db, const char *coll)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_UTF8(&cmd, "count", coll);
	int64_t n = mongoc_client_command_simple(c, db, &cmd, NULL, &reply, NULL)
			    ? cdc_bson_i64(&reply, "n")
			    : 0;
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return n;
}

static bool skip_db(const char *db)
{
	return !strcmp(db, "local") || !strcmp(db, "config") || !strcmp(db, "admin");
}

/* Epoch ms of a backup id "YYYYMMDDTHHMMSS.mmmZ"; -1 when id is not one. */
static int64_t id_ms(const char *id)
{
	struct tm tm = {0};
	int ms = 0;
	if (strlen(id) != 20 || id[8] != 'T' || id[15] != '.' || id[19] != 'Z')
		return -1;
	for (int i = 0; i < 19; i++)
		if (i != 8 && i != 15 && (id[i] < '0' || id[i] > '9'))
			return -1;
	if (sscanf(id, "%4d%2d%2dT%2d%2d%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm) * 1000 + ms;
}

/* The commit check of a backup about to upload its manifest: it started (its id) less
 * than CDC_BACKUP_COMMIT_MS ago, and its data objects 0..nobj-1 are all in the archive
 * (none deleted by a sweep of incomplete backups). */
static int check_objects(cdc_archive *a, const char *shard, const char *id, int nobj,
			 char *err, size_t errlen)
{
	int64_t started = id_ms(id);
	if (started >= 0 && sdb_wall_ms() - started > CDC_BACKUP_COMMIT_MS)
		return sdb_errf(err, errlen, SDB_ETIMEOUT,
				"backup %s started more than %lld h ago: not committed (an "
				"incomplete backup this old may be deleted by the coordinator)",
				id, (long long)(CDC_BACKUP_COMMIT_MS / 3600000));
	char **keys = NULL;
	size_t nk = 0;
	char *prefix = sdb_asprintf("backups/%s/%s/", shard, id);
	int rc = cdc_archive_obj_list(a, prefix, &keys, &nk, err, errlen);
	for (int i = 0; rc == 0 && i < nobj; i++) {
		char *obj = sdb_asprintf("%sdata-%05d.bson", prefix, i);
		size_t k = 0;
		while (k < nk && strcmp(keys[k], obj) != 0)
			k++;
		if (k == nk)
			rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
				      "data object %s is no longer in the archive (deleted as an "
				      "incomplete backup?): manifest not written",
				      obj);
		free(obj);
	}
	free(prefix);
	cdc_backup_names_free(keys, nk);
	return rc;
}

/* See backup.h. */
int cdc_backup_shard(cdc_archive *a, const char *shard, const char *uri, const char *id,
		     int timeout_ms, cdc_backup_stats *st, char *err, size_t errlen)
{
	cdc_backup_opts o = {.timeout_ms = timeout_ms,
			     .import_latency_ms = SDB_IMPORT_LATENCY_MS};
	return cdc_backup_shard_opts(a, shard, uri, id, &o, st, err, errlen);
}

/* See backup.h. */
int cdc_backup_shard_opts(cdc_archive *a, const char *shard, const char *uri, const char *id,
			  const cdc_backup_opts *o, cdc_backup_stats *st, char *err,
			  size_t errlen)
{
	mongoc_client_t *c = cdc_backup_client(uri, o->timeout_ms);
	char **dbs = NULL, ***colls = NULL;
	size_t ndb = 0, *ncs = NULL;
	cdc_backup_progress pr = {.shard = shard};
	int rc = 0, nobj = 0;
	int64_t started = sdb_wall_ms(), docs = 0, bytes = 0;
	cdc_snap head;
	bson_t man = BSON_INITIALIZER, arr;
	if (c == NULL)
		return sdb_errf(err, errlen, SDB_EINVAL, "shard %s: bad uri %s", shard, uri);
	char *tmp = cdc_backup_tmpdir();
	if (tmp == NULL) {
		mongoc_client_destroy(c);
		return sdb_errf(err, errlen, SDB_EIO, "temporary directory: %s", strerror(errno));
	}
	memset(st, 0, sizeof *st);
	/* the head first: a collection not listed below was empty then */
	char *probe = sdb_asprintf("%s/probe.bson", tmp);
	rc = cdc_backup_snapshot(c, "admin", "stripedb.backup.probe", probe, NULL, NULL, &head,
				 err, errlen);
	unlink(probe);
	free(probe);
	int64_t head_wall = 0;
	if (rc == 0)
		rc = oplog_wall(c, head.at, &head_wall, err, errlen);
	BSON_APPEND_UTF8(&man, "id", id);
	BSON_APPEND_UTF8(&man, "shard", shard);
	BSON_APPEND_DATE_TIME(&man, "startedAt", started);
	BSON_APPEND_TIMESTAMP(&man, "headTs", (uint32_t)(head.at >> 32), (uint32_t)head.at);
	BSON_APPEND_DATE_TIME(&man, "headWall", head_wall);
	BSON_APPEND_ARRAY_BEGIN(&man, "collections", &arr);
	if (rc == 0) {
		bson_t cmd = BSON_INITIALIZER;
		BSON_APPEND_INT32(&cmd, "listDatabases", 1);
		BSON_APPEND_BOOL(&cmd, "nameOnly", true);
		rc = list_names(c, "admin", &cmd, "databases", &dbs, &ndb, err, errlen);
		bson_destroy(&cmd);
	}
	/* every collection and its count first: the progress's expected total (an estimate) */
	colls = sdb_calloc(ndb ? ndb : 1, sizeof *colls);
	ncs = sdb_calloc(ndb ? ndb : 1, sizeof *ncs);
	for (size_t d = 0; rc == 0 && d < ndb; d++) {
		if (skip_db(dbs[d]))
			continue;
		bson_t cmd = BSON_INITIALIZER;
		BSON_APPEND_INT32(&cmd, "listCollections", 1);
		rc = list_names(c, dbs[d], &cmd, "cursor.firstBatch", &colls[d], &ncs[d], err,
				errlen);
		bson_destroy(&cmd);
		for (size_t i = 0; rc == 0 && i < ncs[d]; i++)
			if (strncmp(colls[d][i], "system.", 7) != 0)
				pr.expected += count_docs(c, dbs[d], colls[d][i]);
	}
	for (size_t d = 0; rc == 0 && d < ndb; d++) {
		for (size_t i = 0; rc == 0 && i < ncs[d]; i++) {
			if (strncmp(colls[d][i], "system.", 7) == 0)
				continue;
			cdc_snap so;
			char *path = sdb_asprintf("%s/data.bson", tmp);
			char *obj = sdb_asprintf("backups/%s/%s/data-%05d.bson", shard, id, nobj++);
			int64_t wall = 0;
			rc = cdc_backup_snapshot(c, dbs[d], colls[d][i], path, o, &pr, &so, err,
						 errlen);
			if (rc == 0)
				rc = oplog_wall(c, so.at, &wall, err, errlen);
			if (rc == 0)
				rc = cdc_archive_obj_put(a, obj, path, err, errlen);
			unlink(path);
			if (rc == 0) {
				bson_t e;
				char k[16], *ns = sdb_asprintf("%s.%s", dbs[d], colls[d][i]);
				snprintf(k, sizeof k, "%d", nobj - 1);
				BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &e);
				BSON_APPEND_UTF8(&e, "ns", ns);
				BSON_APPEND_UTF8(&e, "object", obj);
				BSON_APPEND_TIMESTAMP(&e, "atOplogTs", (uint32_t)(so.at >> 32),
						      (uint32_t)so.at);
				BSON_APPEND_DATE_TIME(&e, "atWall", wall);
				BSON_APPEND_INT64(&e, "count", so.count);
				BSON_APPEND_INT64(&e, "bytes", so.bytes);
				BSON_APPEND_UTF8(&e, "sha256", so.sha);
				BSON_APPEND_BOOL(&e, "ownedOnly", so.filtered);
				if (so.filtered) {
					BSON_APPEND_INT64(&e, "collectionVersion",
							  so.collection_version);
					BSON_APPEND_INT64(&e, "shardVersion", so.shard_version);
				}
				bson_t ix;
				BSON_APPEND_ARRAY_BEGIN(&e, "indexes", &ix);
				rc = list_indexes(c, dbs[d], colls[d][i], &ix, err, errlen);
				bson_append_array_end(&e, &ix);
				bson_append_document_end(&arr, &e);
				free(ns);
				docs += so.count;
				bytes += so.bytes;
			}
			free(path);
			free(obj);
		}
	}
	bson_append_array_end(&man, &arr);
	BSON_APPEND_DATE_TIME(&man, "finishedAt", sdb_wall_ms());
	BSON_APPEND_INT64(&man, "documents", docs);
	BSON_APPEND_INT64(&man, "bytes", bytes);
	BSON_APPEND_INT64(&man, "importLatencyMS", o->import_latency_ms);
	BSON_APPEND_INT64(&man, "throttledMS", pr.throttled_ms);
	if (rc == 0)
		rc = check_objects(a, shard, id, nobj, err, errlen);
	if (rc == 0) {
		char *path = sdb_asprintf("%s/manifest.json", tmp);
		char *obj = sdb_asprintf("backups/%s/%s/manifest.json", shard, id);
		rc = write_json(&man, path, err, errlen);
		if (rc == 0)
			rc = cdc_archive_obj_put(a, obj, path, err, errlen);
		unlink(path);
		free(path);
		free(obj);
	}
	if (rc == 0) {
		st->collections = nobj;
		st->documents = docs;
		st->bytes = bytes;
		st->throttled_ms = pr.throttled_ms;
		pr.finished = 1;
		if (o->progress)
			o->progress(&pr, o->arg);
	} else {
		/* a backup without its manifest does not exist: remove what was uploaded */
		for (int i = 0; i < nobj; i++) {
			char e2[256], *obj = sdb_asprintf("backups/%s/%s/data-%05d.bson", shard, id, i);
			(void)cdc_archive_obj_delete(a, obj, e2, sizeof e2);
			free(obj);
		}
		sdb_errwrap(err, errlen, rc, "backup of %s", shard);
	}
	bson_destroy(&man);
	for (size_t d = 0; colls && d < ndb; d++)
		cdc_backup_names_free(colls[d], ncs[d]);
	free(colls);
	free(ncs);
	cdc_backup_names_free(dbs, ndb);
	mongoc_client_destroy(c);
	rmdir(tmp);
	free(tmp);
	return rc;
}

void cdc_backup_id(int64_t now_ms, char *buf, size_t n)
{
	time_t s = (time_t)(now_ms / 1000);
	struct tm tm;
	gmtime_r(&s, &tm);
	size_t l = strftime(buf, n, "%Y%m%dT%H%M%S", &tm);
	snprintf(buf + l, n - l, ".%03dZ", (int)(now_ms % 1000));
}

int cdc_backup_newest(cdc_archive *a, const char *shard, char *id, size_t n, char *err,
		      size_t errlen)
{
	char **keys = NULL;
	size_t nk = 0;
	char *prefix = sdb_asprintf("backups/%s/", shard);
	int rc = cdc_archive_obj_list(a, prefix, &keys, &nk, err, errlen);
	id[0] = '\0';
	for (size_t i = 0; rc == 0 && i < nk; i++) {
		const char *k = keys[i] + strlen(prefix), *slash = strchr(k, '/');
		if (slash && strcmp(slash, "/manifest.json") == 0 && (size_t)(slash - k) < n &&
		    strncmp(k, id, (size_t)(slash - k)) > 0)
			snprintf(id, n, "%.*s", (int)(slash - k), k);
	}
	free(prefix);
	cdc_backup_names_free(keys, nk);
	return rc;
}

void cdc_backup_ents_free(cdc_backup_ent *e, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(e[i].shard);
		free(e[i].id);
	}
	free(e);
}

int cdc_backup_scan(cdc_archive *a, const char *shard, cdc_backup_ent **out, size_t *n,
		    char *err, size_t errlen)
{
	char **keys = NULL;
	size_t nk = 0;
	char *prefix = shard ? sdb_asprintf("backups/%s/", shard) : sdb_strdup("backups/");
	int rc = cdc_archive_obj_list(a, prefix, &keys, &nk, err, errlen);
	free(prefix);
	*out = NULL;
	*n = 0;
	for (size_t i = 0; rc == 0 && i < nk; i++) {
		/* backups/<shard>/<id>/<file> */
		const char *sh = keys[i] + strlen("backups/"), *s2 = strchr(sh, '/');
		const char *s3 = s2 ? strchr(s2 + 1, '/') : NULL;
		if (strncmp(keys[i], "backups/", 8) != 0 || s3 == NULL || s3 == s2 + 1 ||
		    s2 == sh || strchr(s3 + 1, '/') != NULL)
			continue;
		size_t shl = (size_t)(s2 - sh), idl = (size_t)(s3 - s2 - 1);
		size_t j = 0;
		while (j < *n && !(strlen((*out)[j].shard) == shl &&
				   strncmp((*out)[j].shard, sh, shl) == 0 &&
				   strlen((*out)[j].id) == idl &&
				   strncmp((*out)[j].id, s2 + 1, idl) == 0))
			j++;
		if (j == *n) {
			*out = sdb_realloc(*out, (*n + 1) * sizeof **out);
			(*out)[j] = (cdc_backup_ent){.shard = sdb_strndup(sh, shl),
						     .id = sdb_strndup(s2 + 1, idl)};
			(*n)++;
		}
		(*out)[j].objects++;
		if (strcmp(s3 + 1, "manifest.json") == 0)
			(*out)[j].committed = 1;
	}
	cdc_backup_names_free(keys, nk);
	if (rc) {
		cdc_backup_ents_free(*out, *n);
		*out = NULL;
		*n = 0;
	}
	return rc;
}

int cdc_backup_delete(cdc_archive *a, const char *shard, const char *id, size_t *deleted,
		      char *err, size_t errlen)
{
	char **keys = NULL;
	size_t nk = 0;
	char *prefix = sdb_asprintf("backups/%s/%s/", shard, id);
	char *man = sdb_asprintf("%smanifest.json", prefix);
	int rc = cdc_archive_obj_list(a, prefix, &keys, &nk, err, errlen);
	*deleted = 0;
	/* the manifest first: the backup stops existing, then its data goes */
	for (size_t k = 0; rc == 0 && k < nk; k++)
		if (strcmp(keys[k], man) == 0 &&
		    (rc = cdc_archive_obj_delete(a, keys[k], err, errlen)) == 0)
			(*deleted)++;
	for (size_t k = 0; rc == 0 && k < nk; k++)
		if (strcmp(keys[k], man) != 0 &&
		    (rc = cdc_archive_obj_delete(a, keys[k], err, errlen)) == 0)
			(*deleted)++;
	cdc_backup_names_free(keys, nk);
	free(man);
	free(prefix);
	return rc;
}

int cdc_backup_orphan_dead(const char *id, const char *newest, int64_t now_ms)
{
	int64_t t = id_ms(id);
	return t >= 0 && t < now_ms - CDC_BACKUP_ORPHAN_AGE_MS && newest[0] &&
	       strcmp(id, newest) < 0;
}

int cdc_backup_sweep(cdc_archive *a, const char *shard, int64_t now_ms, size_t *removed,
		     size_t *kept, char *err, size_t errlen)
{
	cdc_backup_ent *e;
	size_t n;
	char newest[64] = "";
	*removed = *kept = 0;
	int rc = cdc_backup_scan(a, shard, &e, &n, err, errlen);
	for (size_t i = 0; rc == 0 && i < n; i++)
		if (e[i].committed && strcmp(e[i].id, newest) > 0)
			snprintf(newest, sizeof newest, "%s", e[i].id);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		size_t d;
		if (e[i].committed)
			continue;
		if (!cdc_backup_orphan_dead(e[i].id, newest, now_ms)) {
			(*kept)++;
			continue;
		}
		rc = cdc_backup_delete(a, shard, e[i].id, &d, err, errlen);
		if (rc == 0)
			(*removed)++;
		else
			sdb_errwrap(err, errlen, rc, "delete incomplete backup %s of %s", e[i].id,
				    shard);
	}
	cdc_backup_ents_free(e, n);
	return rc;
}
