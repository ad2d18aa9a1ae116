/* `stripedb ctl restore` (issue #22): point-in-time restore of a collection, or of every
 * collection of a shard, from the backups in the CDC archive (cli/backup.c) plus the CDC
 * events after them. Design: src/cdc/README.md ("Backups and point-in-time restore").
 *
 * Restore to TIME (epoch ms, compared with the oplog entries' `wall`): per shard, the newest
 * backup whose snapshot of the collection is at or before TIME; its documents, then the
 * shard's CDC events (cdc_reader: archive, then live log) after the snapshot's atOplogTs
 * while their wall <= TIME, applied to the target in order (insert/update: replace with
 * upsert by _id, the oplog's `o` being the full post-image; delete; drop of the
 * collection or of its database: the documents restored from that shard removed). Each
 * shard's history is replayed alone; a migration's events for documents of another
 * shard's history are skipped, one _id in two shards' histories is refused (apply_events,
 * overlap). The target must be empty (a failed restore drops it). The
 * restore keeps, per _id, the SHA-256 of the document it wrote last (memory: ~100 bytes a
 * document), and verifies at the end that the target holds exactly that: the same count
 * and the same order-independent hash (the sum of the documents' SHA-256).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cdc/archive.h"
#include "cdc/backup.h"
#include "cdc/log.h"
#include "cdc/reader.h"
#include "cli/backup_int.h"
#include "cli/cli.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

int cli_restore_main(cli_ctx *ctx, int argc, char **argv);

/* ------------------------------------------------------------ restore: the _id map */

/* _id (as a one-element BSON value, type byte included) -> SHA-256 of the document the
 * restore wrote last for it, and the shard whose history holds it (its index in the
 * restore's shard list; set by the first backup document or write of the _id). Open
 * addressing, linear probing; a deleted document keeps its slot (live = 0). */
typedef struct id_ent {
	uint8_t *key; /* NULL: empty slot */
	uint32_t klen;
	uint8_t live, seen;
	uint16_t shard;
	uint8_t h[32];
} id_ent;

typedef struct id_map {
	id_ent *e;
	size_t cap, used; /* slots, slots with a key */
} id_map;

static id_ent *map_slot(id_map *m, const uint8_t *k, uint32_t kl)
{
	size_t i = (size_t)XXH64(k, kl, 0) & (m->cap - 1);
	while (m->e[i].key && (m->e[i].klen != kl || memcmp(m->e[i].key, k, kl) != 0))
		i = (i + 1) & (m->cap - 1);
	return &m->e[i];
}

static id_ent *map_get(id_map *m, const uint8_t *k, uint32_t kl)
{
	if (2 * (m->used + 1) > m->cap) {
		id_map n = {.cap = m->cap ? m->cap * 2 : 1024};
		n.e = sdb_calloc(n.cap, sizeof *n.e);
		for (size_t i = 0; i < m->cap; i++)
			if (m->e[i].key) {
				*map_slot(&n, m->e[i].key, m->e[i].klen) = m->e[i];
				n.used++;
			}
		free(m->e);
		*m = n;
	}
	id_ent *s = map_slot(m, k, kl);
	if (s->key == NULL) {
		s->key = sdb_malloc(kl);
		memcpy(s->key, k, kl);
		s->klen = kl;
		m->used++;
	}
	return s;
}

static void map_free(id_map *m)
{
	for (size_t i = 0; i < m->cap; i++)
		free(m->e[i].key);
	free(m->e);
}

static void sha256(const uint8_t *d, size_t n, uint8_t out[32])
{
	unsigned l;
	EVP_Digest(d, n, out, &l, EVP_sha256(), NULL);
}

/* The order-independent hash of a set of documents: the sum, per 64-bit lane, of their
 * SHA-256 (as 4 little-endian u64), printed as 64 hex digits. */
typedef struct set_hash {
	uint64_t lane[4];
	int64_t count;
} set_hash;

static void set_add(set_hash *s, const uint8_t h[32])
{
	for (int i = 0; i < 4; i++) {
		uint64_t v;
		memcpy(&v, h + 8 * i, 8);
		s->lane[i] += v;
	}
	s->count++;
}

static void set_hex(const set_hash *s, char out[65])
{
	for (int i = 0; i < 4; i++)
		sprintf(out + 16 * i, "%016" PRIx64, s->lane[i]);
}

/* ------------------------------------------------------------ restore: applying */

typedef struct restore {
	const cli_ctx *ctx;
	const char *db, *coll, *ns; /* source */
	char *tdb, *tcoll;          /* target */
	int64_t to_ms;
	int dry_run;
	mongoc_client_t *c;
	mongoc_collection_t *tc;
	mongoc_bulk_operation_t *bulk;
	int pending;
	id_map ids;
	int64_t docs_in, events_in; /* read from the backups, applied from the CDC log */
	int64_t migration_skipped;  /* migration events of documents not restored from there */
	int64_t indexes;            /* created on the target (create_indexes) */
	const shard_ref *shards;    /* the shards in metadata; cur: the one being replayed */
	uint16_t cur;
	int64_t docs_total;         /* of the chosen backups' manifests: progress's total */
	progress pg;
	char err[1024];
} restore;

/* Show the restore's progress: backup documents of docs_total, events (total unknown). */
static void restore_progress(restore *r, int final)
{
	bk_progress_show(&r->pg, r->docs_in, r->docs_total, r->docs_in + r->events_in, final, NULL,
		      "restore %s: %" PRId64 "/%" PRId64 " backup documents + %" PRId64 " events",
		      r->ns, r->docs_in, r->docs_total, r->events_in);
}

static int flush_bulk(restore *r)
{
	bson_error_t e;
	bson_t reply;
	int rc = 0;
	if (r->bulk == NULL)
		return 0;
	if (r->pending && !mongoc_bulk_operation_execute(r->bulk, &reply, &e))
		rc = sdb_errf(r->err, sizeof r->err, SDB_EIO, "writing %s.%s: %s", r->tdb, r->tcoll,
			      e.message);
	if (r->pending)
		bson_destroy(&reply);
	mongoc_bulk_operation_destroy(r->bulk);
	r->bulk = NULL;
	r->pending = 0;
	return rc;
}

static mongoc_bulk_operation_t *bulk(restore *r)
{
	if (r->bulk == NULL) {
		bson_t opts = BSON_INITIALIZER;
		BSON_APPEND_BOOL(&opts, "ordered", true);
		r->bulk = mongoc_collection_create_bulk_operation_with_opts(r->tc, &opts);
		bson_destroy(&opts);
	}
	return r->bulk;
}

static int queued(restore *r)
{
	return ++r->pending >= BATCH ? flush_bulk(r) : 0;
}

/* Key of doc's _id in the map (a one-element document holding it), 0 when it has none. */
static int id_key(const bson_t *doc, bson_t *key)
{
	bson_iter_t it;
	bson_init(key);
	if (!bson_iter_init_find(&it, doc, "_id")) {
		bson_destroy(key);
		return 0;
	}
	bson_append_iter(key, "_id", 3, &it);
	return 1;
}

/* The _id is in the history of shard s->shard (a backup document, a write or a delete)
 * and the current shard's history holds it too: a chunk migration moved it between the
 * backup and TIME (or the collection holds one _id on two shards, or a shard key update
 * moved it), and the two histories cannot be ordered without the chunk's ownership at
 * TIME. Refused, whatever the order the shards are replayed in; exit 1. */
static int overlap(restore *r, const id_ent *s, const bson_t *key)
{
	char *id = bson_as_relaxed_extended_json(key, NULL);
	int rc = sdb_errf(r->err, sizeof r->err, SDB_ECONFLICT,
			  "%s: document %s is in the histories of shards %s and %s (a chunk "
			  "migration moved it between the backup and the restore time): a restore "
			  "across a migration is not supported",
			  r->ns, id ? id : "?", r->shards[s->shard].id, r->shards[r->cur].id);
	bson_free(id);
	return rc;
}

/* doc is the document of _id now (insert, or update's full post-image), in the history of
 * shard r->cur. A dry run only keeps the map. */
static int put_doc(restore *r, const bson_t *doc, int insert)
{
	bson_t key;
	bson_error_t e;
	if (!id_key(doc, &key))
		return sdb_errf(r->err, sizeof r->err, SDB_ECORRUPT, "a document without _id");
	id_ent *s = map_get(&r->ids, bson_get_data(&key), key.len);
	if (s->seen && s->shard != r->cur) {
		int rc = overlap(r, s, &key);
		bson_destroy(&key);
		return rc;
	}
	int was = s->live;
	s->live = s->seen = 1;
	s->shard = r->cur;
	sha256(bson_get_data(doc), doc->len, s->h);
	if (r->dry_run) {
		bson_destroy(&key);
		return 0;
	}
	int ok;
	if (insert && !was) {
		ok = mongoc_bulk_operation_insert_with_opts(bulk(r), doc, NULL, &e);
	} else {
		bson_t opts = BSON_INITIALIZER;
		BSON_APPEND_BOOL(&opts, "upsert", true);
		ok = mongoc_bulk_operation_replace_one_with_opts(bulk(r), &key, doc, &opts, &e);
		bson_destroy(&opts);
	}
	bson_destroy(&key);
	if (!ok)
		return sdb_errf(r->err, sizeof r->err, SDB_EINVAL, "%s", e.message);
	return queued(r);
}

static int del_doc(restore *r, const bson_t *doc)
{
	bson_t key;
	bson_error_t e;
	if (!id_key(doc, &key))
		return 0;
	id_ent *s = map_get(&r->ids, bson_get_data(&key), key.len);
	if (s->seen && s->shard != r->cur) {
		int rc = overlap(r, s, &key);
		bson_destroy(&key);
		return rc;
	}
	s->live = 0;
	s->seen = 1;
	s->shard = r->cur;
	if (r->dry_run) {
		bson_destroy(&key);
		return 0;
	}
	int ok = mongoc_bulk_operation_remove_one_with_opts(bulk(r), &key, NULL, &e);
	bson_destroy(&key);
	if (!ok)
		return sdb_errf(r->err, sizeof r->err, SDB_EINVAL, "%s", e.message);
	return queued(r);
}

/* A drop of the collection (or of its database) in shard r->cur's history: the documents
 * restored from that shard go (a sharded collection is dropped on every shard, each in
 * its own history). */
static int drop_all(restore *r)
{
	bson_error_t e;
	int rc = 0;
	for (size_t i = 0; i < r->ids.cap && rc == 0; i++) {
		id_ent *s = &r->ids.e[i];
		if (!s->key || !s->live || s->shard != r->cur)
			continue;
		s->live = 0;
		if (r->dry_run)
			continue;
		bson_t key;
		if (!bson_init_static(&key, s->key, s->klen))
			continue;
		if (!mongoc_bulk_operation_remove_one_with_opts(bulk(r), &key, NULL, &e))
			rc = sdb_errf(r->err, sizeof r->err, SDB_EINVAL, "%s", e.message);
		else
			rc = queued(r);
	}
	return rc;
}

/* Load the backup data object (documents back to back) into the target. */
static int apply_backup(restore *r, cdc_archive *a, const char *obj, const char *tmp)
{
	char *path = sdb_asprintf("%s/data.bson", tmp);
	int rc = cdc_archive_obj_get(a, obj, path, r->err, sizeof r->err);
	if (rc) {
		free(path);
		return rc;
	}
	FILE *f = fopen(path, "rb");
	bson_reader_t *rd = f ? bson_reader_new_from_fd(fileno(f), false) : NULL;
	const bson_t *doc;
	bool eof = false;
	while (rc == 0 && rd && (doc = bson_reader_read(rd, &eof)) != NULL) {
		r->docs_in++;
		rc = put_doc(r, doc, 1);
		if (r->docs_in % BATCH == 0)
			restore_progress(r, 0);
	}
	if (rc == 0 && (rd == NULL || !eof))
		rc = sdb_errf(r->err, sizeof r->err, SDB_ECORRUPT, "%s: not a BSON file", obj);
	if (rd)
		bson_reader_destroy(rd);
	if (f)
		fclose(f);
	unlink(path);
	free(path);
	return rc;
}

/* Whether the _id of the event's document is in the history of the shard being replayed
 * (a backup document, a write or a delete restored from it). */
static int restored_here(restore *r, const bson_t *doc)
{
	bson_t key;
	if (!id_key(doc, &key))
		return 0;
	id_ent *s = r->ids.cap ? map_slot(&r->ids, bson_get_data(&key), key.len) : NULL;
	bson_destroy(&key);
	return s && s->key && s->seen && s->shard == r->cur;
}

/* Apply the shard's CDC events after `after` while their wall <= to_ms: user writes of
 * DB.COLL, drops of it or its database. An event of a chunk migration (origin: an import's
 * copy, the grace period's reverse replication, a cleanup) is skipped when its document
 * is not in the state restored from this shard (the document's owner holds the write in
 * its own history; backups hold only owned documents), and refused when it is (the
 * document moved between the backup and TIME, which needs the chunk's ownership at TIME). */
static int apply_events(restore *r, cdc_log *log, const char *shard, uint64_t after)
{
	cdc_reader *rd;
	cdc_event ev;
	int rc = cdc_reader_open(log, shard, after, &rd, r->err, sizeof r->err);
	if (rc)
		return sdb_errwrap(r->err, sizeof r->err, rc, "CDC log of %s", shard);
	char dbcmd[512];
	snprintf(dbcmd, sizeof dbcmd, "%s.$cmd", r->db);
	while ((rc = cdc_reader_next(rd, &ev, 0, r->err, sizeof r->err)) == 1) {
		bson_t e, o;
		bson_iter_t it;
		rc = 0; /* the result of applying this event (a command event of the database
			 * that is not a drop applies nothing and must not end the replay) */
		if (!bson_init_static(&e, ev.data, ev.len)) {
			rc = sdb_errf(r->err, sizeof r->err, SDB_ECORRUPT, "event %" PRIu64, ev.offset);
			break;
		}
		if (cdc_bson_i64(&e, "wall") > r->to_ms)
			break;
		const char *ns = cdc_bson_str(&e, "ns"), *op = cdc_bson_str(&e, "op");
		if (ns == NULL || op == NULL || !bson_iter_init_find(&it, &e, "o") ||
		    !BSON_ITER_HOLDS_DOCUMENT(&it))
			continue;
		uint32_t ol;
		const uint8_t *od;
		bson_iter_document(&it, &ol, &od);
		if (!bson_init_static(&o, od, ol))
			continue;
		int mine = strcmp(ns, r->ns) == 0;
		if (!mine && strcmp(op, "c") != 0)
			continue;
		if (mine && cdc_bson_str(&e, "origin") && !restored_here(r, &o)) {
			/* a migration's copy of a document this shard did not own (an import
			 * before the switch, the reverse replication of the grace period) or its
			 * cleanup: the owner's own history holds the write */
			r->migration_skipped++;
			continue;
		}
		if (mine && cdc_bson_str(&e, "origin")) {
			rc = sdb_errf(r->err, sizeof r->err, SDB_ECONFLICT,
				      "%s: event %u:%u of %s comes from chunk migration %s: a "
				      "restore across a migration is not supported",
				      r->ns, (unsigned)(ev.ts >> 32), (unsigned)ev.ts, shard,
				      cdc_bson_str(&e, "origin"));
			break;
		}
		int apply = 0;
		if (mine) {
			apply = 1;
			if (!strcmp(op, "i") || !strcmp(op, "u"))
				rc = put_doc(r, &o, 0);
			else if (!strcmp(op, "d"))
				rc = del_doc(r, &o);
			else
				apply = 0;
		} else if (cdc_bson_str(&o, "renameCollection") && cdc_bson_str(&o, "to")) {
			/* renameCollection (any database's: it may cross databases): renamed
			 * away, the documents left the collection as by a drop; renamed onto
			 * it, the documents come from another collection's history, which this
			 * replay does not follow: refused rather than restored incomplete */
			if (strcmp(cdc_bson_str(&o, "to"), r->ns) == 0) {
				rc = sdb_errf(r->err, sizeof r->err, SDB_ECONFLICT,
					      "%s: event %u:%u of %s renames %s onto it: a restore "
					      "across a renameCollection into the collection is not "
					      "supported",
					      r->ns, (unsigned)(ev.ts >> 32), (unsigned)ev.ts, shard,
					      cdc_bson_str(&o, "renameCollection"));
				break;
			}
			if (strcmp(cdc_bson_str(&o, "renameCollection"), r->ns) == 0) {
				apply = 1;
				rc = drop_all(r);
			}
		} else if (strcmp(ns, dbcmd) == 0) {
			const char *dropped = cdc_bson_str(&o, "drop");
			if ((dropped && strcmp(dropped, r->coll) == 0) ||
			    bson_iter_init_find(&it, &o, "dropDatabase")) {
				apply = 1;
				rc = drop_all(r);
			}
		}
		r->events_in += apply;
		if (apply && r->events_in % BATCH == 0)
			restore_progress(r, 0);
		if (rc)
			break;
	}
	cdc_reader_close(rd);
	return rc < 0 ? rc : 0;
}

/* Count and set hash of the target as it is now. */
static int target_hash(restore *r, set_hash *h)
{
	bson_t q = BSON_INITIALIZER;
	bson_error_t e;
	const bson_t *doc;
	memset(h, 0, sizeof *h);
	mongoc_cursor_t *cs = mongoc_collection_find_with_opts(r->tc, &q, NULL, NULL);
	while (mongoc_cursor_next(cs, &doc)) {
		uint8_t d[32];
		sha256(bson_get_data(doc), doc->len, d);
		set_add(h, d);
	}
	int rc = 0;
	if (mongoc_cursor_error(cs, &e))
		rc = sdb_errf(r->err, sizeof r->err, SDB_EIO, "reading %s.%s back: %s", r->tdb,
			      r->tcoll, e.message);
	mongoc_cursor_destroy(cs);
	bson_destroy(&q);
	return rc;
}

/* ------------------------------------------------------------ restore: planning */

typedef struct plan {
	const shard_ref *s;
	const manifest *m; /* chosen backup, NULL when none */
	uint64_t at;       /* its snapshot of the collection */
	int64_t at_wall, oldest_wall, newest_ms, docs;
	const char *obj; /* data object, NULL: the collection was empty */
	const uint8_t *entry; /* its manifest entry for the collection (in m->doc), NULL: none */
	uint32_t entry_len;
} plan;

/* The manifest's collections array: colls_begin points c at it (false when absent),
 * colls_next gives each entry as a static view d (false at the end). */
static bool colls_begin(const bson_t *manifest_doc, bson_iter_t *c)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, manifest_doc, "collections") &&
	       BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, c);
}

static bool colls_next(bson_iter_t *c, bson_t *d)
{
	while (bson_iter_next(c)) {
		uint32_t l;
		const uint8_t *data;
		if (!BSON_ITER_HOLDS_DOCUMENT(c))
			continue;
		bson_iter_document(c, &l, &data);
		if (bson_init_static(d, data, l))
			return true;
	}
	return false;
}

/* Snapshot point of ns in backup m: its collection entry, else the backup's head. */
static void point_of(const manifest *m, const char *ns, uint64_t *at, int64_t *wall,
		     const char **obj, int64_t *docs, const uint8_t **entry, uint32_t *entry_len)
{
	bson_iter_t c;
	*at = cdc_bson_ts(m->doc, "headTs");
	*wall = cdc_bson_i64(m->doc, "headWall");
	*obj = NULL;
	*docs = 0;
	*entry = NULL;
	*entry_len = 0;
	bson_t d;
	if (!colls_begin(m->doc, &c))
		return;
	while (colls_next(&c, &d)) {
		const char *n = cdc_bson_str(&d, "ns");
		if (n && strcmp(n, ns) == 0) {
			*at = cdc_bson_ts(&d, "atOplogTs");
			*wall = cdc_bson_i64(&d, "atWall");
			*obj = cdc_bson_str(&d, "object");
			*docs = cdc_bson_i64(&d, "count");
			*entry = bson_get_data(&d); /* inside m->doc (a bson_t must not be copied) */
			*entry_len = d.len;
			return;
		}
	}
}

/* Create on the target the indexes the chosen backups hold for the collection (each
 * manifest entry's `indexes`, the union by name; the _id index exists already), after the
 * documents are in, as mongorestore does. Indexes created or dropped after the backups
 * are not replayed. r->indexes gets their number. Errors: SDB_EIO with r->err. */
static int create_indexes(restore *r, const plan *plans, size_t n)
{
	bson_t cmd = BSON_INITIALIZER, arr, reply;
	bson_error_t be;
	char **names = NULL;
	size_t nn = 0;
	BSON_APPEND_UTF8(&cmd, "createIndexes", r->tcoll);
	BSON_APPEND_ARRAY_BEGIN(&cmd, "indexes", &arr);
	for (size_t i = 0; i < n; i++) {
		bson_iter_t it, ix;
		bson_t entry;
		if (!plans[i].m || !plans[i].entry ||
		    !bson_init_static(&entry, plans[i].entry, plans[i].entry_len) ||
		    !bson_iter_init_find(&it, &entry, "indexes") ||
		    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &ix))
			continue;
		while (bson_iter_next(&ix)) {
			bson_t spec;
			uint32_t l;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&ix))
				continue;
			bson_iter_document(&ix, &l, &data);
			if (!bson_init_static(&spec, data, l))
				continue;
			const char *name = cdc_bson_str(&spec, "name");
			bool seen = name == NULL;
			for (size_t k = 0; k < nn && !seen; k++)
				seen = strcmp(names[k], name) == 0;
			if (seen)
				continue;
			names = sdb_realloc(names, (nn + 1) * sizeof *names);
			names[nn] = sdb_strdup(name);
			char key[16];
			snprintf(key, sizeof key, "%zu", nn++);
			BSON_APPEND_DOCUMENT(&arr, key, &spec);
		}
	}
	bson_append_array_end(&cmd, &arr);
	int rc = 0;
	if (nn && !mongoc_client_write_command_with_opts(r->c, r->tdb, &cmd, NULL, &reply, &be))
		rc = sdb_errf(r->err, sizeof r->err, SDB_EIO, "creating the %zu indexes of %s on %s.%s: %s",
			      nn, r->ns, r->tdb, r->tcoll, be.message);
	if (nn)
		bson_destroy(&reply);
	r->indexes = (int64_t)nn;
	cdc_backup_names_free(names, nn);
	bson_destroy(&cmd);
	return rc;
}

/* Newest time the shard's history is complete to: now when its CDC log holds its oplog
 * head (nothing unpublished), else the wall of the last event in the log. */
static int newest_ms(const cli_ctx *ctx, cdc_log *log, const shard_ref *s, int64_t *out,
		     char *err, size_t errlen)
{
	cdc_range live = {0}, ar = {0};
	int rc = cdc_log_range(log, s->id, &live, err, errlen);
	if (rc == 0 && cdc_log_archive(log))
		rc = cdc_archive_range(cdc_log_archive(log), s->id, &ar, err, errlen);
	if (rc)
		return rc;
	uint64_t last = live.last_ts > ar.last_ts ? live.last_ts : ar.last_ts;
	int64_t now = sdb_wall_ms();
	mongoc_client_t *c = cdc_backup_client(s->uri, ctx->timeout_ms);
	cdc_snap head = {0};
	*out = 0;
	if (c) {
		char *tmp = cdc_backup_tmpdir();
		char *p = sdb_asprintf("%s/probe.bson", tmp ? tmp : "/tmp");
		char e2[512];
		if (cdc_backup_snapshot(c, "admin", "stripedb.backup.probe", p, NULL, NULL, &head, e2,
					sizeof e2) == 0 &&
		    head.at == last)
			*out = now;
		unlink(p);
		free(p);
		if (tmp) {
			rmdir(tmp);
			free(tmp);
		}
		mongoc_client_destroy(c);
	}
	if (*out == 0 && last) {
		cdc_reader *rd;
		cdc_event ev;
		rc = cdc_reader_open(log, s->id, last - 1, &rd, err, errlen);
		if (rc)
			return rc;
		if (cdc_reader_next(rd, &ev, 0, err, errlen) == 1) {
			bson_t e;
			if (bson_init_static(&e, ev.data, ev.len))
				*out = cdc_bson_i64(&e, "wall");
		}
		cdc_reader_close(rd);
	}
	return 0;
}

/* What every namespace of one `ctl restore` shares. */
typedef struct rs_env {
	cli_ctx *ctx;
	const bk_opts *o;
	cdc_log *log;
	cdc_archive *a;        /* the log's archive (borrowed) */
	shard_ref *shards;     /* the shards replayed: every shard, or --shard */
	size_t nsh;
	int64_t *newest;       /* per shard: newest_ms, -1 until asked */
	manifest *ms;          /* every backup in the archive */
	size_t nm;
	char *tmp;             /* private directory for downloaded data objects */
	const char *uri;       /* the target: --uri, or the --to-shard's URI */
	int64_t to_ms;         /* INT64_MAX with latest */
	int latest;            /* --to-time=latest */
	char tstr[40];
} rs_env;

/* Slack for the clocks of the metadata leader and the shards when a migration's times
 * are compared with snapshot and event times (ms). */
#define MIGRATION_CLOCK_SLACK_MS 5000

/* A chunk migration of ns whose life [createdMS, updatedMS at its end] (metadata's
 * listMigrations; not ended: to now) meets [from_ms, to_ms] widened by the clock slack:
 * -1 with its description in why, 0 when none, or the exit code 1 after one line on
 * stderr (metadata unreachable).
 * Such a migration may have moved documents between the shards' snapshots or inside the
 * events replayed: each shard's backup holds only the chunks it owned at its own snapshot,
 * so a chunk that switched between two snapshots is in neither, and ordering two shards'
 * histories of a document needs the chunk's ownership at every point (not built). */
static int migration_overlaps(rs_env *e, const char *ns, int64_t from_ms, int64_t to_ms,
			      char *why, size_t n)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	int found = 0;
	BSON_APPEND_INT32(&cmd, "listMigrations", 1);
	int rc = cli_meta_run(e->ctx, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc) {
		bson_destroy(&reply);
		return rc;
	}
	if (bson_iter_init_find(&it, &reply, "migrations") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (!found && bson_iter_next(&arr)) {
			bson_t m;
			uint32_t l;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &l, &data);
			if (!bson_init_static(&m, data, l))
				continue;
			const char *mns = cdc_bson_str(&m, "ns"), *st = cdc_bson_str(&m, "state");
			if (!mns || strcmp(mns, ns) != 0 || !st)
				continue;
			bool ended = !strcmp(st, "complete") || !strcmp(st, "aborted") ||
				     !strcmp(st, "rolled_back");
			int64_t c0 = cdc_bson_i64(&m, "createdMS"), c1 = cdc_bson_i64(&m, "updatedMS");
			if (c0 > to_ms + MIGRATION_CLOCK_SLACK_MS ||
			    (ended && c1 < from_ms - MIGRATION_CLOCK_SLACK_MS))
				continue;
			char a[40], b[40];
			bk_fmt_ms(c0, a, sizeof a);
			bk_fmt_ms(c1, b, sizeof b);
			snprintf(why, n, "chunk migration %s of chunk %" PRId64 " (%s -> %s, %s %s .. %s)",
				 cdc_bson_str(&m, "id") ? cdc_bson_str(&m, "id") : "?",
				 cdc_bson_i64(&m, "spec.chunk"),
				 cdc_bson_str(&m, "spec.from") ? cdc_bson_str(&m, "spec.from") : "?",
				 cdc_bson_str(&m, "spec.to") ? cdc_bson_str(&m, "spec.to") : "?", st,
				 a, ended ? b : "now");
			found = 1;
		}
	}
	bson_destroy(&reply);
	return found ? -1 : 0;
}

/* The position of shard i's oldest event still in its CDC log (archive, else live log)
 * when older events were dropped by retention (its first offset is not 0), else 0 (the
 * whole history is there). A backup whose snapshot is older cannot be replayed forward. */
static int retained_from(rs_env *e, size_t i, uint64_t *out, char *err, size_t errlen)
{
	cdc_range live = {0}, ar = {0};
	int rc = cdc_log_range(e->log, e->shards[i].id, &live, err, errlen);
	if (rc == 0 && cdc_log_archive(e->log))
		rc = cdc_archive_range(cdc_log_archive(e->log), e->shards[i].id, &ar, err, errlen);
	if (rc)
		return rc;
	const cdc_range *r = ar.next_offset > ar.first_offset ? &ar : &live;
	*out = r->first_offset > 0 ? r->first_ts : 0;
	return 0;
}

/* newest_ms of shard i, asked once per restore. */
static int shard_newest(rs_env *e, size_t i, int64_t *out, char *err, size_t errlen)
{
	if (e->newest[i] < 0) {
		int rc = newest_ms(e->ctx, e->log, &e->shards[i], &e->newest[i], err, errlen);
		if (rc)
			return rc;
	}
	*out = e->newest[i];
	return 0;
}

/* Restore ns (DB.COLL) as of e->to_ms into tdb.tcoll through e->uri (or plan it with
 * --dry-run): per shard of e, the newest backup of ns at or before TIME and the shard's
 * events after it; refused outside the available range or over a non-empty target;
 * verified (count and set hash). Prints one line per shard and a result line (or a JSON
 * document with --json). Returns the exit code: 0, 1 (refused or failed: one line on
 * stderr), 2 (usage). tdb and tcoll are borrowed. */
static int restore_ns(rs_env *e, const char *ns, const char *tdb, const char *tcoll)
{
	restore r;
	plan *plans = NULL;
	int applying = 0, rc = 0;
	const char *dot = strchr(ns, '.');
	char *db = sdb_strndup(ns, (size_t)(dot - ns));
	memset(&r, 0, sizeof r);
	r.ctx = e->ctx;
	r.dry_run = e->o->dry_run;
	r.to_ms = e->to_ms;
	bk_progress_init(&r.pg, e->ctx, e->o->progress);
	r.db = db;
	r.coll = dot + 1;
	r.ns = ns;
	r.tdb = (char *)tdb;
	r.tcoll = (char *)tcoll;
	/* per shard: the newest backup at or before TIME, the available range */
	plans = sdb_calloc(e->nsh ? e->nsh : 1, sizeof *plans);
	int64_t lower = 0, upper = INT64_MAX;
	char tstr[40];
	snprintf(tstr, sizeof tstr, "%s", e->tstr);
	if (e->latest) { /* --to-time=latest: the newest time every shard's history reaches */
		for (size_t i = 0; i < e->nsh; i++) {
			int64_t n;
			if ((rc = shard_newest(e, i, &n, r.err, sizeof r.err)) != 0) {
				fprintf(stderr, "stripedb ctl restore: %s: %s\n", e->shards[i].id,
					r.err);
				rc = 1;
				goto out;
			}
			r.to_ms = n < r.to_ms ? n : r.to_ms;
		}
		bk_fmt_ms(r.to_ms, tstr, sizeof tstr);
	}
	for (size_t i = 0; i < e->nsh; i++) {
		plan *p = &plans[i];
		p->s = &e->shards[i];
		p->oldest_wall = INT64_MAX;
		uint64_t kept = 0; /* oldest retained event when older ones were dropped */
		if ((rc = retained_from(e, i, &kept, r.err, sizeof r.err)) != 0) {
			fprintf(stderr, "stripedb ctl restore: %s: %s\n", e->shards[i].id, r.err);
			rc = 1;
			goto out;
		}
		size_t unusable = 0;
		for (size_t k = 0; k < e->nm; k++) {
			if (strcmp(e->ms[k].shard, e->shards[i].id) != 0)
				continue;
			uint64_t at;
			int64_t wall, docs;
			const char *obj;
			const uint8_t *entry;
			uint32_t entry_len;
			point_of(&e->ms[k], r.ns, &at, &wall, &obj, &docs, &entry, &entry_len);
			if (kept && at < kept) {
				/* events after its snapshot may be gone (retention): unusable */
				unusable++;
				continue;
			}
			if (wall < p->oldest_wall)
				p->oldest_wall = wall;
			if (wall <= r.to_ms && (p->m == NULL || wall >= p->at_wall)) {
				p->m = &e->ms[k];
				p->at = at;
				p->at_wall = wall;
				p->obj = obj;
				p->docs = docs;
				p->entry = entry;
				p->entry_len = entry_len;
			}
		}
		if (p->oldest_wall == INT64_MAX && unusable) {
			fprintf(stderr, "stripedb ctl restore: shard %s: its %zu backups are older than "
					"its oldest retained CDC event %u:%u (older events were dropped "
					"by retention): no time can be restored; take a backup (`stripedb "
					"ctl backup create --all`) and keep --archive-retention longer "
					"than the backup interval\n",
				e->shards[i].id, unusable, (unsigned)(kept >> 32), (unsigned)kept);
			rc = 1;
			goto out;
		}
		if (p->oldest_wall == INT64_MAX) {
			fprintf(stderr, "stripedb ctl restore: shard %s has no backup in %s (run "
					"`stripedb ctl backup create --all`)\n",
				e->shards[i].id, e->o->archive);
			rc = 1;
			goto out;
		}
		if ((rc = shard_newest(e, i, &p->newest_ms, r.err, sizeof r.err)) != 0) {
			fprintf(stderr, "stripedb ctl restore: %s: %s\n", e->shards[i].id, r.err);
			rc = 1;
			goto out;
		}
		if (p->oldest_wall > lower)
			lower = p->oldest_wall;
		if (p->newest_ms < upper)
			upper = p->newest_ms;
	}
	if (e->nsh == 0) {
		fprintf(stderr, "stripedb ctl restore: no shard in metadata\n");
		rc = 1;
		goto out;
	}
	if (r.to_ms < lower || r.to_ms > upper) {
		char lo_s[40], up_s[40];
		bk_fmt_ms(lower, lo_s, sizeof lo_s);
		bk_fmt_ms(upper, up_s, sizeof up_s);
		fprintf(stderr, "stripedb ctl restore: %s is outside the available range %s .. %s "
				"(oldest backup .. newest archived event)\n",
			tstr, lo_s, up_s);
		rc = 1;
		goto out;
	}
	/* no chunk migration of ns between the oldest snapshot used and TIME */
	{
		int64_t from = INT64_MAX;
		char why[512];
		/* a snapshot shows the ownership of when it was read: at or after its backup's
		 * start (its atWall is the last write before it, maybe much older) */
		for (size_t i = 0; i < e->nsh; i++) {
			if (!plans[i].m)
				continue;
			int64_t read = cdc_bson_i64(plans[i].m->doc, "startedAt");
			read = read > plans[i].at_wall ? read : plans[i].at_wall;
			from = read < from ? read : from;
		}
		int mo = migration_overlaps(e, r.ns, from == INT64_MAX ? r.to_ms : from, r.to_ms,
					    why, sizeof why);
		if (mo > 0) {
			rc = mo;
			goto out;
		}
		if (mo < 0) {
			fprintf(stderr, "stripedb ctl restore: %s: %s meets the backups used and %s: a "
					"restore across a migration is not supported (restore to a time "
					"before it, or take a backup after it ended)\n",
				r.ns, why, tstr);
			rc = 1;
			goto out;
		}
	}
	/* the target: never over live data (a dry run with a target checks it too) */
	if (e->uri) {
		bson_error_t be;
		r.c = cdc_backup_client(e->uri, e->ctx->timeout_ms);
		if (r.c == NULL) {
			fprintf(stderr, "stripedb ctl restore: bad target URI %s\n", e->uri);
			rc = 2;
			goto out;
		}
		r.tc = mongoc_client_get_collection(r.c, r.tdb, r.tcoll);
		bson_t q = BSON_INITIALIZER;
		int64_t n = mongoc_collection_count_documents(r.tc, &q, NULL, NULL, NULL, &be);
		bson_destroy(&q);
		if (n < 0) {
			fprintf(stderr, "stripedb ctl restore: count %s.%s: %s\n", r.tdb, r.tcoll,
				be.message);
			rc = 1;
			goto out;
		}
		if (n > 0) {
			fprintf(stderr, "stripedb ctl restore: target %s.%s exists and holds %" PRId64
					" documents: a restore never writes over live data\n",
				r.tdb, r.tcoll, n);
			rc = 1;
			goto out;
		}
	}
	int64_t t0 = (int64_t)sdb_mono_ms();
	applying = !e->o->dry_run;
	for (size_t i = 0; i < e->nsh; i++)
		r.docs_total += plans[i].obj ? plans[i].docs : 0;
	bk_progress_start(&r.pg);
	restore_progress(&r, 0);
	for (size_t i = 0; i < e->nsh; i++) {
		plan *p = &plans[i];
		int64_t d0 = r.docs_in, e0 = r.events_in;
		int64_t o0 = r.migration_skipped;
		r.shards = e->shards;
		r.cur = (uint16_t)i;
		if (p->obj)
			rc = apply_backup(&r, e->a, p->obj, e->tmp);
		if (rc == 0)
			rc = apply_events(&r, e->log, p->s->id, p->at);
		if (rc == 0)
			rc = flush_bulk(&r);
		if (rc) {
			bk_progress_break(&r.pg);
			fprintf(stderr, "stripedb ctl restore: %s\n", r.err);
			rc = 1;
			goto out;
		}
		bk_progress_break(&r.pg);
		if (!e->ctx->json)
			printf("%s: backup %s (snapshot at %u:%u) %" PRId64 " documents + %" PRId64
			       " events up to %s%s\n",
			       p->s->id, p->m ? p->m->id : "-", (unsigned)(p->at >> 32),
			       (unsigned)p->at, r.docs_in - d0, r.events_in - e0, tstr,
			       r.migration_skipped - o0 ? " (copies of another shard's documents by a "
							  "chunk migration skipped)"
							: "");
	}
	if (!e->o->dry_run && (rc = create_indexes(&r, plans, e->nsh)) != 0) {
		fprintf(stderr, "stripedb ctl restore: %s\n", r.err);
		rc = 1;
		goto out;
	}
	applying = 0;
	int64_t took = (int64_t)sdb_mono_ms() - t0;
	restore_progress(&r, 1);
	if (e->o->dry_run) {
		if (e->ctx->json)
			printf("{\"dryRun\": true, \"toTime\": \"%s\", \"target\": \"%s.%s\", "
			       "\"documents\": %" PRId64 ", \"events\": %" PRId64 "}\n",
			       tstr, r.tdb, r.tcoll, r.docs_in, r.events_in);
		else
			printf("dry run: would restore %s as of %s into %s.%s from %" PRId64
			       " backed-up documents and %" PRId64 " events\n",
			       r.ns, tstr, r.tdb, r.tcoll, r.docs_in, r.events_in);
		rc = 0;
		goto out;
	}
	/* verification: the target holds exactly the documents computed for TIME */
	set_hash want = {0}, got;
	for (size_t i = 0; i < r.ids.cap; i++)
		if (r.ids.e[i].key && r.ids.e[i].live)
			set_add(&want, r.ids.e[i].h);
	char wh[65], gh[65];
	set_hex(&want, wh);
	if ((rc = target_hash(&r, &got)) != 0) {
		fprintf(stderr, "stripedb ctl restore: %s\n", r.err);
		rc = 1;
		goto out;
	}
	set_hex(&got, gh);
	if (want.count != got.count || strcmp(wh, gh) != 0) {
		fprintf(stderr, "stripedb ctl restore: verification failed: %s.%s holds %" PRId64
				" documents (hash %s), expected %" PRId64 " (hash %s)\n",
			r.tdb, r.tcoll, got.count, gh, want.count, wh);
		rc = 1;
		goto out;
	}
	double rate = took > 0 ? (double)(r.docs_in + r.events_in) * 1000.0 / (double)took : 0;
	if (e->ctx->json)
		printf("{\"target\": \"%s.%s\", \"toTime\": \"%s\", \"documents\": %" PRId64
		       ", \"hash\": \"%s\", \"backupDocuments\": %" PRId64 ", \"events\": %" PRId64
		       ", \"migrationEventsSkipped\": %" PRId64 ", \"indexes\": %" PRId64
		       ", \"ms\": %" PRId64 ", \"docsPerSec\": %.0f}\n",
		       r.tdb, r.tcoll, tstr, got.count, gh, r.docs_in, r.events_in,
		       r.migration_skipped, r.indexes, took, rate);
	else
		printf("restored %s as of %s into %s.%s: %" PRId64 " documents, verified (hash %s); "
		       "%" PRId64 " backed-up documents + %" PRId64 " events in %" PRId64
		       " ms; %" PRId64 " indexes\n",
		       r.ns, tstr, r.tdb, r.tcoll, got.count, gh, r.docs_in, r.events_in, took,
		       r.indexes);
	rc = 0;
out:
	if (r.bulk)
		mongoc_bulk_operation_destroy(r.bulk);
	if (applying && r.tc) {
		/* a refused or failed restore leaves no half-restored target (it was empty) */
		bson_error_t de;
		if (!mongoc_collection_drop(r.tc, &de) && de.code != 26 /* NamespaceNotFound */)
			fprintf(stderr, "stripedb ctl restore: dropping the partial target %s.%s: %s\n",
				r.tdb, r.tcoll, de.message);
	}
	if (r.tc)
		mongoc_collection_destroy(r.tc);
	if (r.c)
		mongoc_client_destroy(r.c);
	map_free(&r.ids);
	free(plans);
	free(db);
	return rc;
}

/* Add ns (a "db.coll" string; NULL, admin, local, config and system.* are ignored) to the
 * heap set *out of *n heap strings. */
static void ns_add(char ***out, size_t *n, const char *ns)
{
	if (ns == NULL || strchr(ns, '.') == NULL || ns[0] == '.' || strchr(ns, '$') ||
	    !strncmp(ns, "admin.", 6) || !strncmp(ns, "local.", 6) || !strncmp(ns, "config.", 7) ||
	    strstr(ns, ".system."))
		return;
	for (size_t i = 0; i < *n; i++)
		if (strcmp((*out)[i], ns) == 0)
			return;
	*out = sdb_realloc(*out, (*n + 1) * sizeof **out);
	(*out)[(*n)++] = sdb_strdup(ns);
}

/* The namespaces of shard i's history up to TIME: every collection of its backups, and
 * every namespace its CDC events write after the newest of them (a collection created
 * since), skipping admin, local, config and system.*. Heap array of heap strings. */
static int shard_namespaces(rs_env *e, char ***out, size_t *n, char *err, size_t errlen)
{
	const shard_ref *s = &e->shards[0];
	uint64_t after = 0;
	int64_t newest_wall = -1;
	*out = NULL;
	*n = 0;
	for (size_t k = 0; k < e->nm; k++) {
		if (strcmp(e->ms[k].shard, s->id) != 0)
			continue;
		int64_t wall = cdc_bson_i64(e->ms[k].doc, "headWall");
		if (wall <= e->to_ms && wall > newest_wall) {
			newest_wall = wall;
			after = cdc_bson_ts(e->ms[k].doc, "headTs");
		}
		bson_iter_t c;
		bson_t d;
		if (!colls_begin(e->ms[k].doc, &c))
			continue;
		while (colls_next(&c, &d))
			ns_add(out, n, cdc_bson_str(&d, "ns"));
	}
	cdc_reader *rd;
	cdc_event ev;
	int rc = cdc_reader_open(e->log, s->id, after, &rd, err, errlen);
	if (rc)
		return rc;
	while ((rc = cdc_reader_next(rd, &ev, 0, err, errlen)) == 1) {
		bson_t d;
		if (!bson_init_static(&d, ev.data, ev.len))
			continue;
		if (cdc_bson_i64(&d, "wall") > e->to_ms)
			break;
		const char *op = cdc_bson_str(&d, "op");
		if (op && (!strcmp(op, "i") || !strcmp(op, "u") || !strcmp(op, "d")) &&
		    !cdc_bson_str(&d, "origin"))
			ns_add(out, n, cdc_bson_str(&d, "ns"));
	}
	cdc_reader_close(rd);
	return rc < 0 ? rc : 0;
}

int cli_restore_main(cli_ctx *ctx, int argc, char **argv)
{
	bk_opts o;
	rs_env e;
	shard_ref *all = NULL;
	size_t nall = 0;
	char err[1024], **nss = NULL;
	size_t nns = 0;
	char *tdb = NULL, *tcoll = NULL;
	int rc = bk_parse("restore", argc, argv, &o);
	if (rc)
		return rc;
	memset(&e, 0, sizeof e);
	e.ctx = ctx;
	e.o = &o;
	int whole = o.npos == 0 && o.shard;
	if (o.npos != 1 && !whole)
		return bk_usage("restore", "restore takes one DB.COLL, or --shard=ID for every "
					"collection of a shard");
	if (o.all || o.import_latency)
		return bk_usage("restore", "--all and --import-latency-ms are backup flags (a restore "
					"reads every shard, or --shard=ID)");
	const char *dot = whole ? NULL : strchr(o.pos[0], '.');
	if (!whole && (dot == NULL || dot == o.pos[0] || dot[1] == '\0'))
		return bk_usage("restore", "expected DB.COLL");
	if (whole && o.into)
		return bk_usage("restore", "--into restores one collection: a whole shard keeps its "
					"namespaces");
	e.latest = o.to_time && strcmp(o.to_time, "latest") == 0;
	if (e.latest)
		e.to_ms = INT64_MAX;
	else if (o.to_time == NULL || bk_parse_time(o.to_time, &e.to_ms) != 0)
		return bk_usage("restore", "--to-time must be YYYY-MM-DDTHH:MM:SS[.mmm]Z, epoch "
					"seconds[.mmm] or latest");
	if (o.cdc == NULL || o.cdc[0] == '\0')
		return bk_usage("restore", "no CDC log: pass --cdc=SPEC or set STRIPEDB_CDC");
	if (o.to_shard && o.uri && getenv("STRIPEDB_URI") != o.uri)
		return bk_usage("restore", "--to-shard and --uri both name the target: pass one");
	if (!o.dry_run && !o.to_shard && (o.uri == NULL || o.uri[0] == '\0'))
		return bk_usage("restore", "no target: pass --uri=mongodb://PROXY, --to-shard=ID or "
					"set STRIPEDB_URI");
	if (e.latest)
		snprintf(e.tstr, sizeof e.tstr, "latest");
	else
		bk_fmt_ms(e.to_ms, e.tstr, sizeof e.tstr);
	if (o.into) {
		const char *d2 = strchr(o.into, '.');
		if (d2 == NULL || d2 == o.into || d2[1] == '\0')
			return bk_usage("restore", "--into expects DB.COLL");
		tdb = sdb_strndup(o.into, (size_t)(d2 - o.into));
		tcoll = sdb_strdup(d2 + 1);
	} else if (!whole) {
		time_t s = (time_t)((e.latest ? sdb_wall_ms() : e.to_ms) / 1000);
		struct tm tm;
		char b[32];
		gmtime_r(&s, &tm);
		strftime(b, sizeof b, "%Y%m%dT%H%M%S", &tm);
		tdb = sdb_strndup(o.pos[0], (size_t)(dot - o.pos[0]));
		tcoll = sdb_asprintf("%s_restored_%s", dot + 1, b);
	}
	if (!whole && strncmp(o.pos[0], tdb, strlen(tdb)) == 0 &&
	    o.pos[0][strlen(tdb)] == '.' && strcmp(o.pos[0] + strlen(tdb) + 1, tcoll) == 0 &&
	    !o.to_shard) {
		fprintf(stderr, "stripedb ctl restore: the target is the source collection %s: "
				"a restore never writes over live data\n",
			o.pos[0]);
		rc = 2;
		goto out;
	}
	cdc_log_opts lo = bk_log_opts(&o);
	sdb_log_set_level(SDB_LOG_ERROR); /* as open_archive */
	if ((rc = cdc_log_open(o.cdc, &lo, &e.log, err, sizeof err)) != 0) {
		fprintf(stderr, "stripedb ctl restore: %s\n", err);
		rc = rc == SDB_EINVAL ? 2 : 1;
		goto out;
	}
	e.a = cdc_log_archive(e.log);
	if ((rc = bk_list_shards(ctx, &all, &nall)) != 0)
		goto out;
	e.shards = all;
	e.nsh = nall;
	e.uri = o.uri;
	for (size_t i = 0; i < nall; i++) {
		if (o.shard && strcmp(all[i].id, o.shard) == 0) {
			e.shards = &all[i];
			e.nsh = 1;
		}
		if (o.to_shard && strcmp(all[i].id, o.to_shard) == 0)
			e.uri = all[i].uri;
	}
	if (o.shard && (e.nsh != 1 || strcmp(e.shards[0].id, o.shard) != 0)) {
		fprintf(stderr, "stripedb ctl restore: no shard %s in metadata\n", o.shard);
		rc = 1;
		goto out;
	}
	if (o.to_shard && e.uri == o.uri) {
		fprintf(stderr, "stripedb ctl restore: no shard %s in metadata (--to-shard names a "
				"shard added with addShard)\n",
			o.to_shard);
		rc = 1;
		goto out;
	}
	e.newest = sdb_calloc(e.nsh ? e.nsh : 1, sizeof *e.newest);
	for (size_t i = 0; i < e.nsh; i++)
		e.newest[i] = -1;
	e.tmp = cdc_backup_tmpdir();
	if (e.tmp == NULL) {
		fprintf(stderr, "stripedb ctl restore: temporary directory: %s\n", strerror(errno));
		rc = 1;
		goto out;
	}
	rc = bk_list_manifests(e.a, NULL, 1, e.tmp, &e.ms, &e.nm, err, sizeof err);
	if (rc) {
		fprintf(stderr, "stripedb ctl restore: %s\n", err);
		rc = 1;
		goto out;
	}
	if (!whole) {
		rc = restore_ns(&e, o.pos[0], tdb, tcoll);
		goto out;
	}
	/* a whole shard: every namespace of its history, into the same names */
	if ((rc = shard_namespaces(&e, &nss, &nns, err, sizeof err)) != 0) {
		fprintf(stderr, "stripedb ctl restore: %s: %s\n", o.shard, err);
		rc = 1;
		goto out;
	}
	if (nns == 0) {
		fprintf(stderr, "stripedb ctl restore: shard %s has no backup in %s and no event "
				"up to %s\n",
			o.shard, o.archive ? o.archive : "the archive", e.tstr);
		rc = 1;
		goto out;
	}
	for (size_t i = 0; i < nns && rc == 0; i++) {
		const char *d = strchr(nss[i], '.');
		char *ndb = sdb_strndup(nss[i], (size_t)(d - nss[i]));
		rc = restore_ns(&e, nss[i], ndb, d + 1);
		free(ndb);
	}
	if (rc == 0 && !ctx->json)
		printf("%s shard %s as of %s: %zu collections into %s\n",
		       o.dry_run ? "dry run: would restore" : "restored", o.shard, e.tstr, nns,
		       o.to_shard ? o.to_shard : e.uri ? e.uri : "-");
out:
	cdc_backup_names_free(nss, nns);
	free(e.newest);
	bk_manifests_free(e.ms, e.nm);
	sdb_shard_refs_free(all, nall);
	if (e.tmp) {
		rmdir(e.tmp);
		free(e.tmp);
	}
	if (e.log)
		cdc_log_close(e.log);
	free(tdb);
	free(tcoll);
	return rc;
}
