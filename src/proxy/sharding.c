/* Sharding administration through the proxy, as on a mongos (issue #18): enableSharding,
 * shardCollection, listShards, addShard, removeShard (a drain by migrations), split (at
 * middle), moveChunk and moveRange (one migration, waited for), mergeChunks, drop (with the
 * sharding metadata), the balancer commands, and clear refusals of
 * refineCollectionShardKey / reshardCollection. Each command is translated to the metadata
 * service's own commands (src/metadata/README.md "Commands") and runs on the admin
 * database, as on a mongos (elsewhere: Unauthorized, 13, with MongoDB's message).
 *
 * shardCollection of a collection that already holds documents follows MongoDB: the
 * documents stay where they are, on the one shard that holds the unsharded collection,
 * and every initial chunk is placed on that shard (so no document becomes invisible to the
 * chunk-ownership filter, and a re-insert of an existing _id meets the existing one).
 * Documents found on several shards are refused (IllegalOperation, 20). There is no
 * balancer: the chunks stay there until moved by a migration (`stripedb ctl shard drain`).
 * Sources: MongoDB's shardcollection / configsvr_shard_collection commands,
 * sharding_catalog_manager_shard_operations.cpp (addShard), balancer_commands (mongos). */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/clock.h"
#include "common/log.h"
#include "proxy/exec.h"

#define MAX_INITIAL_CHUNKS_PER_SHARD 8192 /* MongoDB's cap on numInitialChunks per shard */

/* MongoDB's refusal of a mongos admin command sent to another database. */
static bool need_admin_db(ctx *c, const char *name)
{
	if (c->db && strcmp(c->db, "admin") == 0)
		return true;
	px_error(c, WIRE_ERR_UNAUTHORIZED, "%s may only be run against the admin database.",
		 name);
	return false;
}

/* Run cmd on metadata. On failure answers c (the metadata error code, or HostUnreachable
 * when metadata is unreachable) unless the code is in ok_codes (0-terminated), in which
 * case *code_out gets it and true is returned with reply initialised. */
static bool meta_call(ctx *c, const bson_t *cmd, bson_t *reply, const int *ok_codes,
		      int *code_out)
{
	char err[512];
	int code = 0, rc = proxy_meta_command(c->p, cmd, reply, &code, err, sizeof err);
	size_t i;

	if (code_out)
		*code_out = 0;
	if (rc == 0)
		return true;
	for (i = 0; ok_codes && ok_codes[i]; i++)
		if (code == ok_codes[i]) {
			if (code_out)
				*code_out = code;
			return true;
		}
	bson_destroy(reply);
	if (rc == SDB_EPROTO && code != 0)
		px_error(c, code, "%s", err);
	else
		px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
	return false;
}

/* The string value of the command's first field (the command name's argument), or NULL. */
static const char *first_utf8(const bson_t *cmd)
{
	bson_iter_t it;

	if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* createDatabase on metadata, an existing database being fine (enableSharding and
 * shardCollection create the database implicitly, as MongoDB 6+). */
static bool ensure_database(ctx *c, const char *db)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int ok[] = {WIRE_ERR_NAMESPACE_EXISTS, WIRE_ERR_DUPLICATE_KEY, 0};
	bool r;

	BSON_APPEND_UTF8(&cmd, "createDatabase", db);
	r = meta_call(c, &cmd, &reply, ok, NULL);
	if (r)
		bson_destroy(&reply);
	bson_destroy(&cmd);
	return r;
}

static bool valid_db_name(const char *db)
{
	return db[0] && strlen(db) < 64 && strpbrk(db, "/\\. \"$") == NULL;
}

/* {enableSharding: "db", primaryShard?}: creates the database in metadata (idempotent),
 * with primaryShard as its primary shard (the shard its unsharded collections live on,
 * issue #18; an unknown shard: ShardNotFound 70, from metadata). Without it the database
 * follows the cluster's default primary, the lowest shard id. An existing database with
 * another primary shard: NamespaceExists (48), as MongoDB. */
static void do_enable_sharding(ctx *c)
{
	const char *db = first_utf8(c->cmd), *ps = NULL;
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int ok[] = {WIRE_ERR_NAMESPACE_EXISTS, WIRE_ERR_DUPLICATE_KEY, 0};
	bson_iter_t it;
	int code = 0;

	if (!need_admin_db(c, "enableSharding"))
		goto out;
	if (db == NULL || !valid_db_name(db)) {
		px_error(c, WIRE_ERR_INVALID_NAMESPACE, "invalid db name specified: %s",
			 db ? db : "(not a string)");
		goto out;
	}
	if (strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 || strcmp(db, "local") == 0) {
		px_error(c, WIRE_ERR_INVALID_OPTIONS, "can't shard %s database", db);
		goto out;
	}
	if (bson_iter_init_find(&it, c->cmd, "primaryShard")) {
		if (!BSON_ITER_HOLDS_UTF8(&it) || bson_iter_utf8(&it, NULL)[0] == '\0') {
			px_error(c, WIRE_ERR_BAD_VALUE, "primaryShard must be a shard id string");
			goto out;
		}
		ps = bson_iter_utf8(&it, NULL);
	}
	if (ps && !px_db_data_stays_visible(c, db, ps))
		goto out;
	BSON_APPEND_UTF8(&cmd, "createDatabase", db);
	if (ps)
		BSON_APPEND_UTF8(&cmd, "primary", ps);
	if (!meta_call(c, &cmd, &reply, ok, &code))
		goto out;
	bson_destroy(&reply);
	if (code != 0 && ps) {
		char *cur = px_meta_db_primary(c, db);
		if (cur == NULL || strcmp(cur, ps) != 0) {
			px_error(c, WIRE_ERR_NAMESPACE_EXISTS,
				 "database %s already exists with primary shard %s, not %s", db,
				 cur ? cur : "(unknown)", ps);
			free(cur);
			goto out;
		}
		free(cur);
	}
	px_reload_db_primaries(c);
	px_reply(c, bson_new());
out:
	bson_destroy(&cmd);
}

/* ---------- shardCollection ---------- */

/* Which shards hold at least one document of db.coll: a `find limit 1` on every shard. */
typedef struct probe {
	ctx *c;
	char **ids;
	const char *coll;
	bool *has;
	int *cls;
	bson_t *replies;
	char (*nerr)[256];
} probe;

static void probe_one(void *arg, size_t i)
{
	probe *pr = arg;
	bson_t cmd = BSON_INITIALIZER, proj = BSON_INITIALIZER;
	bson_iter_t it, b;

	BSON_APPEND_UTF8(&cmd, "find", pr->coll);
	BSON_APPEND_INT32(&proj, "_id", 1);
	BSON_APPEND_DOCUMENT(&cmd, "projection", &proj);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	pr->cls[i] = px_run_on(pr->c, pr->ids[i], &cmd, NULL, &pr->replies[i], pr->nerr[i],
			       sizeof pr->nerr[i]);
	if (pr->cls[i] == SHARDCONN_OK &&
	    bson_iter_init(&it, &pr->replies[i]) &&
	    bson_iter_find_descendant(&it, "cursor.firstBatch", &b) &&
	    BSON_ITER_HOLDS_ARRAY(&b) && bson_iter_recurse(&b, &it) && bson_iter_next(&it))
		pr->has[i] = true;
	bson_destroy(&cmd);
	bson_destroy(&proj);
}

/* The shard holding db.coll's documents into *holder (heap; NULL when empty everywhere).
 * False after answering (a shard unreachable, or documents on several shards). */
static bool find_data_holder(ctx *c, const char *db, const char *coll, const char *ns,
			     char **holder)
{
	ctx sub = *c;
	probe pr;
	size_t n, i, nhave = 0;
	bool ok = true;

	sub.db = db; /* px_run_on runs in c->db */
	memset(&pr, 0, sizeof pr);
	pr.c = &sub;
	pr.coll = coll;
	n = px_shard_ids(c, &pr.ids);
	pr.has = sdb_calloc(n ? n : 1, sizeof *pr.has);
	pr.cls = sdb_calloc(n ? n : 1, sizeof *pr.cls);
	pr.nerr = sdb_calloc(n ? n : 1, sizeof *pr.nerr);
	pr.replies = proxy_calloc_bson(n, sizeof *pr.replies);
	px_fanout(c, n, probe_one, &pr);
	*holder = NULL;
	for (i = 0; i < n && ok; i++) {
		if (pr.cls[i] != SHARDCONN_OK) {
			int code = (int)px_get_int(&pr.replies[i], "code", 0);
			if (pr.cls[i] == SHARDCONN_CMD_ERR && code == WIRE_ERR_NAMESPACE_NOT_FOUND)
				continue;
			px_reply_shard_error(c, pr.cls[i], &pr.replies[i], pr.nerr[i]);
			ok = false;
		} else if (pr.has[i]) {
			nhave++;
			if (*holder == NULL)
				*holder = sdb_strdup(pr.ids[i]);
		}
	}
	if (ok && nhave > 1) {
		px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
			 "cannot shard %s: its unsharded documents are on %zu shards (an unsharded "
			 "collection must live on one shard); move them to one shard first",
			 ns, nhave);
		ok = false;
	}
	if (!ok) {
		free(*holder);
		*holder = NULL;
	}
	for (i = 0; i < n; i++) {
		bson_destroy(&pr.replies[i]);
		free(pr.ids[i]);
	}
	free(pr.ids);
	free(pr.replies);
	free(pr.has);
	free(pr.cls);
	free(pr.nerr);
	return ok;
}

/* Checks key (the shard key pattern): every value 1 (ranged) or one field "hashed".
 * Sets *hashed. False after answering. */
static bool check_key(ctx *c, const bson_t *key, bool *hashed)
{
	bson_iter_t it;
	size_t n = 0, nh = 0;

	*hashed = false;
	if (!bson_iter_init(&it, key) || bson_empty(key)) {
		px_error(c, WIRE_ERR_BAD_VALUE, "shard key pattern must be a non-empty document");
		return false;
	}
	while (bson_iter_next(&it)) {
		const char *f = bson_iter_key(&it);
		n++;
		if (f[0] == '\0' || f[0] == '$') {
			px_error(c, WIRE_ERR_BAD_VALUE, "Unsupported shard key pattern field: '%s'",
				 f);
			return false;
		}
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0) {
			nh++;
			continue;
		}
		if (BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_double(&it) == 1.0)
			continue;
		px_error(c, WIRE_ERR_BAD_VALUE,
			 "Unsupported shard key pattern: field '%s' must be 1 or \"hashed\"", f);
		return false;
	}
	if (nh > 0 && n > 1) {
		px_error(c, WIRE_ERR_INVALID_OPTIONS,
			 "compound hashed shard keys are not supported by stripedb: a hashed "
			 "shard key has exactly one field");
		return false;
	}
	*hashed = nh > 0;
	return true;
}

/* collation: only the simple collation (absent, or {locale: "simple"}). */
static bool check_collation(ctx *c)
{
	bson_t col;
	bson_iter_t it;

	if (!bson_has_field(c->cmd, "collation"))
		return true;
	if (px_get_doc(c->cmd, "collation", &col) && bson_iter_init(&it, &col) &&
	    bson_iter_next(&it) && strcmp(bson_iter_key(&it), "locale") == 0 &&
	    BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "simple") == 0 &&
	    !bson_iter_next(&it))
		return true;
	px_error(c, WIRE_ERR_BAD_VALUE,
		 "The collation for shardCollection must be {locale: 'simple'}: stripedb has "
		 "no collations");
	return false;
}

/* Options of shardCollection that are refused rather than ignored. */
static bool check_options(ctx *c)
{
	static const char *const refused[] = {"timeseries", "presplitHashedZones",
					      "implicitlyCreateIndex", "enforceUniquenessCheck",
					      NULL};
	size_t i;

	for (i = 0; refused[i]; i++)
		if (bson_has_field(c->cmd, refused[i])) {
			px_error(c, WIRE_ERR_INVALID_OPTIONS,
				 "shardCollection option %s is not supported by stripedb",
				 refused[i]);
			return false;
		}
	return true;
}

/* The key stored in metadata for ns (into key_out, initialised) when ns is sharded. */
static bool sharded_key(ctx *c, const char *db, const char *ns, bson_t *key_out, bool *hashed)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr, e;
	bool found = false;

	bson_init(key_out);
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_UTF8(&cmd, "db", db);
	if (!meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&cmd);
		return false;
	}
	if (bson_iter_init_find(&it, &reply, "collections") && bson_iter_recurse(&it, &arr))
		while (!found && bson_iter_next(&arr)) {
			bson_t d, k;
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &len, &data);
			if (!bson_init_static(&d, data, len) || !bson_iter_init_find(&e, &d, "ns") ||
			    !BSON_ITER_HOLDS_UTF8(&e) || strcmp(bson_iter_utf8(&e, NULL), ns) != 0)
				continue;
			found = true;
			if (px_get_doc(&d, "key", &k)) {
				bson_destroy(key_out);
				bson_copy_to(&k, key_out);
			}
			*hashed = px_get_bool(&d, "hashed", false);
		}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return found;
}

/* The key as metadata records it ({f: 1} / {f: "hashed"}), to compare with a request. */
static bool same_key(const bson_t *want, bool want_hashed, const bson_t *have, bool have_hashed)
{
	bson_iter_t a, b;

	if (want_hashed != have_hashed || !bson_iter_init(&a, want) || !bson_iter_init(&b, have))
		return false;
	for (;;) {
		bool na = bson_iter_next(&a), nb = bson_iter_next(&b);
		if (na != nb)
			return false;
		if (!na)
			return true;
		if (strcmp(bson_iter_key(&a), bson_iter_key(&b)) != 0)
			return false;
	}
}

/* Creates the unique index on the shard key on every shard (unique: true, ranged keys):
 * each shard enforces it for the key ranges it owns, which together enforce it cluster-wide. */
static bool create_unique_key_index(ctx *c, const char *db, const char *coll, const bson_t *key)
{
	ctx sub = *c;
	bson_t cmd = BSON_INITIALIZER, arr, spec;
	char **ids = NULL, name[256] = "";
	size_t n, i, off = 0;
	pcall *pc, *bad;
	bson_iter_t it;
	bool ok = true;

	sub.db = db;
	bson_iter_init(&it, key);
	while (bson_iter_next(&it) && off < sizeof name)
		off += (size_t)snprintf(name + off, sizeof name - off, "%s%s_1", off ? "_" : "",
					bson_iter_key(&it));
	BSON_APPEND_UTF8(&cmd, "createIndexes", coll);
	BSON_APPEND_ARRAY_BEGIN(&cmd, "indexes", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &spec);
	BSON_APPEND_DOCUMENT(&spec, "key", key);
	BSON_APPEND_UTF8(&spec, "name", name);
	BSON_APPEND_BOOL(&spec, "unique", true);
	bson_append_document_end(&arr, &spec);
	bson_append_array_end(&cmd, &arr);
	n = px_shard_ids(c, &ids);
	pc = px_pcalls_new(&sub, ids, n);
	for (i = 0; i < n; i++) {
		bson_destroy(&pc[i].cmd);
		bson_copy_to(&cmd, &pc[i].cmd);
	}
	px_fanout(c, n, px_pcall_one, pc);
	bad = px_pcalls_failed(pc, n, NULL);
	if (bad) {
		px_reply_shard_error(c, bad->cls, &bad->reply, bad->nerr);
		ok = false;
	}
	px_pcalls_free(pc, n);
	bson_destroy(&cmd);
	return ok;
}

/* {shardCollection: "db.coll", key, unique?, numInitialChunks?, collation?}. */
/* The document it holds into out (a static view). */
static bool doc_of(const bson_iter_t *it, bson_t *out)
{
	uint32_t len;
	const uint8_t *data;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

/* MongoDB's rule for sharding a collection that already has indexes: every unique index
 * other than _id must have the shard key as its prefix, else uniqueness could not be kept
 * across shards (InvalidOptions 72, "can't shard collection ... with unique index on ...").
 * Asked of holder, the shard holding the collection's documents. False after answering c. */
static bool check_unique_indexes(ctx *c, const char *db, const char *coll, const char *ns,
				 const char *holder, const bson_t *key, bool hashed)
{
	ctx in_db = *c;
	bson_t cmd = BSON_INITIALIZER, reply, cur, batch;
	bson_iter_t it;
	char nerr[256];
	int cls;
	bool ok = true;

	in_db.db = db;
	BSON_APPEND_UTF8(&cmd, "listIndexes", coll);
	cls = px_run_on(&in_db, holder, &cmd, NULL, &reply, nerr, sizeof nerr);
	bson_destroy(&cmd);
	if (cls != SHARDCONN_OK) {
		bool gone = px_get_int(&reply, "code", 0) == WIRE_ERR_NAMESPACE_NOT_FOUND;
		if (!gone)
			px_reply_shard_error(c, cls, &reply, nerr);
		bson_destroy(&reply);
		return gone; /* no collection there: no index */
	}
	if (px_get_doc(&reply, "cursor", &cur) && px_get_array(&cur, "firstBatch", &batch) &&
	    bson_iter_init(&it, &batch))
		while (ok && bson_iter_next(&it)) {
			bson_t ix, kp;
			bson_iter_t ki, si;
			bool prefixed = true;
			if (!doc_of(&it, &ix) || !px_get_bool(&ix, "unique", false) ||
			    !px_get_doc(&ix, "key", &kp))
				continue;
			if (bson_iter_init(&ki, &kp) && bson_iter_next(&ki) &&
			    strcmp(bson_iter_key(&ki), "_id") == 0 && bson_count_keys(&kp) == 1)
				continue; /* the _id index */
			/* the index's first fields are the shard key's fields, in order */
			bson_iter_init(&ki, &kp);
			bson_iter_init(&si, key);
			while (bson_iter_next(&si))
				if (!bson_iter_next(&ki) ||
				    strcmp(bson_iter_key(&ki), bson_iter_key(&si)) != 0)
					prefixed = false;
			if (hashed || !prefixed) {
				char *kj = bson_as_relaxed_extended_json(&kp, NULL);
				char *sj = bson_as_relaxed_extended_json(key, NULL);
				px_error(c, WIRE_ERR_INVALID_OPTIONS,
					 "can't shard collection '%s' with unique index on %s and proposed "
					 "shard key %s. Uniqueness can't be maintained unless shard key is "
					 "a prefix", ns, kj, sj);
				bson_free(kj);
				bson_free(sj);
				ok = false;
			}
		}
	bson_destroy(&reply);
	return ok;
}

static void do_shard_collection(ctx *c)
{
	const char *ns = first_utf8(c->cmd), *dot;
	char db[128], *holder = NULL;
	const char *coll;
	bson_t key, cmd = BSON_INITIALIZER, reply, have, shards, out;
	bool hashed, unique = px_get_bool(c->cmd, "unique", false), have_hashed = false;
	int64_t nchunks = 0;
	char **ids = NULL, err[256];
	size_t n, i;
	static const int exists[] = {WIRE_ERR_NAMESPACE_EXISTS, 0};
	int code;

	if (!need_admin_db(c, "shardCollection"))
		return;
	if (ns == NULL || (dot = strchr(ns, '.')) == NULL || dot == ns || dot[1] == '\0' ||
	    (size_t)(dot - ns) >= sizeof db) {
		px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
			 ns ? ns : "(not a string)");
		return;
	}
	memcpy(db, ns, (size_t)(dot - ns));
	db[dot - ns] = '\0';
	coll = dot + 1;
	if (!valid_db_name(db) || strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 ||
	    strcmp(db, "local") == 0 || strncmp(coll, "system.", 7) == 0) {
		px_error(c, WIRE_ERR_ILLEGAL_OPERATION, "can't shard collection %s", ns);
		return;
	}
	if (!px_get_doc(c->cmd, "key", &key)) {
		px_error(c, WIRE_ERR_INVALID_OPTIONS, "no shard key");
		return;
	}
	if (!check_key(c, &key, &hashed) || !check_collation(c) || !check_options(c))
		return;
	if (unique && hashed) {
		px_error(c, WIRE_ERR_INVALID_OPTIONS, "hashed shard keys cannot be declared unique.");
		return;
	}
	if (bson_has_field(c->cmd, "numInitialChunks")) {
		if (!px_client_int(c, "numInitialChunks", 0, INT32_MAX, 0, &nchunks))
			return;
		if (!hashed && nchunks > 0) {
			px_error(c, WIRE_ERR_INVALID_OPTIONS,
				 "numInitialChunks is only supported when the shard key is hashed.");
			return;
		}
	}
	/* already sharded: the same key is fine (MongoDB answers ok), another one is not */
	if (sharded_key(c, db, ns, &have, &have_hashed)) {
		bool same = same_key(&key, hashed, &have, have_hashed);
		if (same) {
			bson_destroy(&have);
			goto done_ok;
		}
		px_error(c, 23 /* AlreadyInitialized */,
			 "sharding already enabled for collection %s with a different shard key", ns);
		bson_destroy(&have);
		return;
	}
	bson_destroy(&have);
	if (px_answered(c))
		return;
	if (!find_data_holder(c, db, coll, ns, &holder))
		return;
	n = px_shard_ids(c, &ids);
	for (i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
	if (n == 0)
		px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
	else if (nchunks > (int64_t)MAX_INITIAL_CHUNKS_PER_SHARD * (int64_t)n)
		px_error(c, WIRE_ERR_INVALID_OPTIONS,
			 "numInitialChunks cannot be more than 8192 * number of shards (%zu)", n);
	if (px_answered(c)) {
		free(holder);
		return;
	}
	if (holder && !check_unique_indexes(c, db, coll, ns, holder, &key, hashed)) {
		free(holder);
		return;
	}
	if (!ensure_database(c, db)) {
		free(holder);
		return;
	}
	if (unique && !create_unique_key_index(c, db, coll, &key)) {
		free(holder);
		return;
	}
	BSON_APPEND_UTF8(&cmd, "shardCollection", ns);
	BSON_APPEND_DOCUMENT(&cmd, "key", &key);
	if (hashed && nchunks > 0)
		BSON_APPEND_INT64(&cmd, "numChunks", nchunks);
	if (holder) {
		/* MongoDB: the documents stay on the shard that holds them; every initial chunk
		 * is placed there */
		BSON_APPEND_ARRAY_BEGIN(&cmd, "shards", &shards);
		BSON_APPEND_UTF8(&shards, "0", holder);
		bson_append_array_end(&cmd, &shards);
	}
	if (!meta_call(c, &cmd, &reply, exists, &code)) {
		bson_destroy(&cmd);
		free(holder);
		return;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (code == WIRE_ERR_NAMESPACE_EXISTS) { /* sharded meanwhile: as the check above */
		bool hh = false;
		bson_t hk;
		bool found = sharded_key(c, db, ns, &hk, &hh);
		bool same = found && same_key(&key, hashed, &hk, hh);
		bson_destroy(&hk);
		if (px_answered(c)) {
			free(holder);
			return;
		}
		if (!same) {
			free(holder);
			px_error(c, 23, "sharding already enabled for collection %s with a "
				 "different shard key", ns);
			return;
		}
	}
	free(holder);
done_ok:
	{
		/* this proxy routes by the new table from now on (others follow their refresh) */
		ctx sub = *c;
		route_coll *rc;
		snprintf(sub.ns, sizeof sub.ns, "%s", ns);
		rc = px_route(&sub, true, err, sizeof err);
		if (rc)
			route_coll_unref(rc);
	}
	bson_init(&out);
	BSON_APPEND_UTF8(&out, "collectionsharded", ns);
	px_reply(c, bson_copy(&out));
	bson_destroy(&out);
}

/* ---------- shards ---------- */

char *px_shard_host_string(const char *uri)
{
	mongoc_uri_t *u = mongoc_uri_new(uri);
	const mongoc_host_list_t *h;
	const char *rs;
	char *out;
	size_t cap = 1024, off = 0;

	if (u == NULL)
		return sdb_strdup(uri);
	out = sdb_calloc(1, cap);
	rs = mongoc_uri_get_replica_set(u);
	if (rs)
		off += (size_t)snprintf(out + off, cap - off, "%s/", rs);
	for (h = mongoc_uri_get_hosts(u); h && off < cap; h = h->next)
		off += (size_t)snprintf(out + off, cap - off, "%s%s", h == mongoc_uri_get_hosts(u)
			? "" : ",", h->host_and_port);
	mongoc_uri_destroy(u);
	return out;
}

/* {listShards: 1} → {shards: [{_id, host, state: 1, draining?}]}. */
static void do_list_shards(ctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply, *out, arr;
	bson_iter_t it, sh, f;
	uint32_t i = 0;

	if (!need_admin_db(c, "listShards"))
		return;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&cmd);
		return;
	}
	out = bson_new();
	BSON_APPEND_ARRAY_BEGIN(out, "shards", &arr);
	if (bson_iter_init_find(&it, &reply, "shards") && bson_iter_recurse(&it, &sh))
		while (bson_iter_next(&sh)) {
			const char *id = NULL, *uri = NULL, *state = NULL;
			char k[16], *host;
			bson_t d;
			if (!bson_iter_recurse(&sh, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (!BSON_ITER_HOLDS_UTF8(&f))
					continue;
				if (strcmp(bson_iter_key(&f), "id") == 0)
					id = bson_iter_utf8(&f, NULL);
				else if (strcmp(bson_iter_key(&f), "uri") == 0)
					uri = bson_iter_utf8(&f, NULL);
				else if (strcmp(bson_iter_key(&f), "state") == 0)
					state = bson_iter_utf8(&f, NULL);
			}
			if (id == NULL || uri == NULL)
				continue;
			snprintf(k, sizeof k, "%u", i++);
			host = px_shard_host_string(uri);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &d);
			BSON_APPEND_UTF8(&d, "_id", id);
			BSON_APPEND_UTF8(&d, "host", host);
			BSON_APPEND_INT32(&d, "state", 1);
			if (state && strcmp(state, "active") != 0) {
				BSON_APPEND_BOOL(&d, "draining", true);
				BSON_APPEND_UTF8(&d, "stripedbState", state);
			}
			bson_append_document_end(&arr, &d);
			free(host);
		}
	bson_append_array_end(out, &arr);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	px_reply(c, out);
}

/* MongoDB's addShard argument as a URI (heap): "rs/h1,h2" → mongodb://h1,h2/?replicaSet=rs,
 * "h:p" → mongodb://h:p/, a mongodb:// URI as is. *rs_name: the replica-set name (heap) or
 * NULL. NULL when unparsable. */
static char *shard_uri(const char *arg, char **rs_name)
{
	char buf[2048];
	const char *slash = strchr(arg, '/');
	mongoc_uri_t *u;
	const char *rs;

	*rs_name = NULL;
	if (strncmp(arg, "mongodb://", 10) == 0)
		snprintf(buf, sizeof buf, "%s", arg);
	else if (slash && slash != arg)
		snprintf(buf, sizeof buf, "mongodb://%s/?replicaSet=%.*s", slash + 1,
			 (int)(slash - arg), arg);
	else
		snprintf(buf, sizeof buf, "mongodb://%s/", arg);
	u = mongoc_uri_new(buf);
	if (u == NULL)
		return NULL;
	rs = mongoc_uri_get_replica_set(u);
	if (rs)
		*rs_name = sdb_strdup(rs);
	mongoc_uri_destroy(u);
	return sdb_strdup(buf);
}

/* {addShard: "rs/h:p,..." | "h:p" | "mongodb://...", name?} → {shardAdded: name}. The name
 * defaults to the replica-set name, else shardNNNN (MongoDB's rules). */
static void do_add_shard(ctx *c)
{
	const char *arg = first_utf8(c->cmd);
	char *uri, *rs = NULL, gen[32];
	const char *name = NULL;
	bson_iter_t it;
	bson_t cmd = BSON_INITIALIZER, reply, *out;
	char **ids = NULL;
	size_t n, i;

	if (!need_admin_db(c, "addShard"))
		return;
	if (arg == NULL || arg[0] == '\0') {
		px_error(c, WIRE_ERR_BAD_VALUE, "addShard needs a connection string");
		return;
	}
	if (bson_iter_init_find(&it, c->cmd, "name")) {
		if (!BSON_ITER_HOLDS_UTF8(&it) || bson_iter_utf8(&it, NULL)[0] == '\0') {
			px_error(c, WIRE_ERR_BAD_VALUE, "shard name must be a non-empty string");
			return;
		}
		name = bson_iter_utf8(&it, NULL);
	}
	if (bson_has_field(c->cmd, "maxSize")) {
		px_error(c, WIRE_ERR_INVALID_OPTIONS, "maxSize is not supported");
		return;
	}
	uri = shard_uri(arg, &rs);
	if (uri == NULL) {
		px_error(c, WIRE_ERR_FAILED_TO_PARSE, "invalid connection string for addShard: %s",
			 arg);
		return;
	}
	n = px_shard_ids(c, &ids);
	if (name == NULL && rs)
		name = rs;
	if (name == NULL) {
		snprintf(gen, sizeof gen, "shard%04zu", n);
		name = gen;
	}
	for (i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
	BSON_APPEND_UTF8(&cmd, "addShard", name);
	BSON_APPEND_UTF8(&cmd, "uri", uri);
	if (meta_call(c, &cmd, &reply, NULL, NULL)) {
		char err[256];
		bson_destroy(&reply);
		if (proxy_load_shards(c->p, err, sizeof err) != 0)
			sdb_warn("shard list reload failed", "err=\"%s\"", err);
		out = bson_new();
		BSON_APPEND_UTF8(out, "shardAdded", name);
		px_reply(c, out);
	}
	bson_destroy(&cmd);
	free(uri);
	free(rs);
}

/* ---------- the balancer (there is none) ---------- */

#define NO_BALANCER                                                                         \
	"stripedb has no balancer: chunks move only when an operator moves them (stripedb "   \
	"ctl shard drain, migrations)"

/* balancerStatus: the truth, in MongoDB's shape (mode "off", never in a round). */
static void do_balancer_status(ctx *c)
{
	bson_t *out;

	if (!need_admin_db(c, "balancerStatus"))
		return;
	out = bson_new();
	BSON_APPEND_UTF8(out, "mode", "off");
	BSON_APPEND_BOOL(out, "inBalancerRound", false);
	BSON_APPEND_INT64(out, "numBalancerRounds", 0);
	BSON_APPEND_UTF8(out, "note", NO_BALANCER);
	px_reply(c, out);
}

/* balancerStop: the balancer is off already (ok, with the note). */
static void do_balancer_stop(ctx *c)
{
	bson_t *out;

	if (!need_admin_db(c, "balancerStop"))
		return;
	out = bson_new();
	BSON_APPEND_UTF8(out, "note", NO_BALANCER);
	px_reply(c, out);
}

/* balancerStart: refused, there is nothing to start. */
static void do_balancer_start(ctx *c)
{
	if (need_admin_db(c, "balancerStart"))
		px_error(c, 115 /* CommandNotSupported */, "balancerStart: %s", NO_BALANCER);
}

static void do_refine(ctx *c)
{
	px_error(c, 115 /* CommandNotSupported */,
		 "refineCollectionShardKey is not supported by stripedb: a collection's shard "
		 "key is fixed when it is sharded");
}

static void do_reshard(ctx *c)
{
	px_error(c, 115 /* CommandNotSupported */,
		 "reshardCollection is not supported by stripedb: a collection's shard key is "
		 "fixed when it is sharded");
}

void px_do_enable_sharding(ctx *c)
{
	do_enable_sharding(c);
}

void px_do_shard_collection(ctx *c)
{
	do_shard_collection(c);
}

void px_do_list_shards(ctx *c)
{
	do_list_shards(c);
}

void px_do_add_shard(ctx *c)
{
	do_add_shard(c);
}

void px_do_balancer(ctx *c)
{
	const char *name = wire_req_name(c->req);

	if (strcmp(name, "balancerStatus") == 0)
		do_balancer_status(c);
	else if (strcmp(name, "balancerStop") == 0)
		do_balancer_stop(c);
	else
		do_balancer_start(c);
}

void px_do_refused_sharding(ctx *c)
{
	if (strcmp(wire_req_name(c->req), "reshardCollection") == 0)
		do_reshard(c);
	else if (strcasecmp(wire_req_name(c->req), "movePrimary") == 0)
		px_error(c, 115 /* CommandNotSupported */,
			 "movePrimary is not supported by stripedb: a database's primary shard is "
			 "chosen when it is created (enableSharding primaryShard, `stripedb ctl db "
			 "create --primary`)");
	else
		do_refine(c);
}

/* drop through the proxy (issue #18): the collection's sharding metadata is dropped first
 * (metadata dropCollection; "not sharded", 26, is fine), this proxy's routing reloaded, then
 * the collection is dropped on every shard (px_do_broadcast). In this order a write racing
 * the drop lands on the primary shard and is dropped with the rest; a failed broadcast is
 * repaired by sending drop again (the shards' part is idempotent). */
void px_do_drop(ctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int fine[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};
	char err[256];
	route_coll *rc;

	BSON_APPEND_UTF8(&cmd, "dropCollection", c->ns);
	if (!meta_call(c, &cmd, &reply, fine, NULL)) {
		bson_destroy(&cmd);
		return;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	rc = px_route(c, true, err, sizeof err);
	if (rc)
		route_coll_unref(rc);
	px_do_broadcast(c);
}

/* The chunk of rc named by c->cmd's `find` (the chunk holding that document's shard key)
 * or `bounds` ([min, max]: exactly a chunk's bounds), as moveChunk and split take them; -1
 * when neither names a chunk. */
static ssize_t chunk_of_find_or_bounds(ctx *c, const route_coll *rc)
{
	bson_t find, bounds, lo, hi;
	ssize_t ci = -1;
	char err[256];

	if (px_get_doc(c->cmd, "find", &find)) {
		bson_t key = BSON_INITIALIZER;
		if (route_key_from_doc(rc, &find, &key, err, sizeof err) == 0)
			ci = route_find_chunk(rc, &key);
		bson_destroy(&key);
	} else if (px_get_array(c->cmd, "bounds", &bounds) && px_get_doc(&bounds, "0", &lo) &&
		   px_get_doc(&bounds, "1", &hi)) {
		ci = route_find_chunk(rc, &lo);
		if (ci >= 0 && (route_key_cmp(rc->chunks[ci].min, &lo) != 0 ||
				route_key_cmp(rc->chunks[ci].max, &hi) != 0))
			ci = -1;
	}
	return ci;
}

/* The median shard-key value of chunk ci of rc (ranged, single-field key) from its shard:
 * count the chunk's documents (filter {k: {$gte: min, $lt: max}}, a MinKey/MaxKey side
 * left out), then the key of the one in the middle by key order, into median (initialised
 * when true). False after answering c: the shard's error, or BadValue when the chunk has
 * no key strictly inside it to split at (empty, or every document has its min key). */
static bool chunk_median(ctx *c, const route_coll *rc, ssize_t ci, bson_t *median)
{
	const route_chunk *ch = &rc->chunks[ci];
	const char *k = rc->keys[0];
	bson_t filter = BSON_INITIALIZER, f, cmd = BSON_INITIALIZER, reply, sort, proj, cur, batch;
	bson_iter_t lo, hi, it;
	char nerr[256];
	int cls;
	int64_t n;
	bool ok = false;

	bson_iter_init(&lo, ch->min);
	bson_iter_init(&hi, ch->max);
	bson_iter_next(&lo);
	bson_iter_next(&hi);
	bson_append_document_begin(&filter, k, -1, &f);
	if (bson_iter_type(&lo) != BSON_TYPE_MINKEY)
		bson_append_iter(&f, "$gte", 4, &lo);
	if (bson_iter_type(&hi) != BSON_TYPE_MAXKEY)
		bson_append_iter(&f, "$lt", 3, &hi);
	bson_append_document_end(&filter, &f);
	BSON_APPEND_UTF8(&cmd, "count", c->coll);
	BSON_APPEND_DOCUMENT(&cmd, "query", &filter);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls != SHARDCONN_OK) {
		px_reply_shard_error(c, cls, &reply, nerr);
		goto out;
	}
	n = px_get_int(&reply, "n", 0);
	bson_destroy(&reply);
	bson_reinit(&cmd);
	BSON_APPEND_UTF8(&cmd, "find", c->coll);
	BSON_APPEND_DOCUMENT(&cmd, "filter", &filter);
	bson_append_document_begin(&cmd, "sort", -1, &sort);
	BSON_APPEND_INT32(&sort, k, 1);
	bson_append_document_end(&cmd, &sort);
	bson_append_document_begin(&cmd, "projection", -1, &proj);
	BSON_APPEND_INT32(&proj, k, 1);
	BSON_APPEND_INT32(&proj, "_id", 0);
	bson_append_document_end(&cmd, &proj);
	BSON_APPEND_INT64(&cmd, "skip", n / 2);
	BSON_APPEND_INT64(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	cls = px_run_on(c, ch->shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls != SHARDCONN_OK) {
		px_reply_shard_error(c, cls, &reply, nerr);
		goto out;
	}
	bson_init(median);
	if (n > 0 && px_get_doc(&reply, "cursor", &cur) && px_get_array(&cur, "firstBatch", &batch)) {
		bson_t d;
		if (px_get_doc(&batch, "0", &d) && bson_iter_init_find(&it, &d, k))
			bson_append_iter(median, k, -1, &it);
	}
	bson_destroy(&reply);
	if (bson_empty(median) || route_key_cmp(median, ch->min) <= 0 ||
	    route_key_cmp(median, ch->max) >= 0) {
		bson_destroy(median);
		px_error(c, WIRE_ERR_BAD_VALUE,
			 "cannot split chunk of %s at its median: it holds %lld documents and no "
			 "shard-key value strictly inside its bounds", rc->ns, (long long)n);
		goto out;
	}
	ok = true;
out:
	bson_destroy(&cmd);
	bson_destroy(&filter);
	return ok;
}

/* {split: "db.coll", middle: {key...} | find: {key...} | bounds: [min, max]} (mongosh
 * sh.splitAt / sh.splitFind): metadata splitChunk of the chunk holding middle, at middle
 * (for a hashed key, middle is a value of the hash space, as in MongoDB); with find (the
 * chunk holding that document's key) or bounds (exactly a chunk's), at the median key of
 * the chunk's documents, read from its shard (ranged single-field keys; hashed and compound
 * keys: CommandNotSupported 115, give middle). */
void px_do_split(ctx *c)
{
	const char *ns = first_utf8(c->cmd);
	ctx sub = *c;
	bson_t middle, cmd = BSON_INITIALIZER, reply, *out, median;
	route_coll *rc;
	ssize_t ci = -1;
	char err[256];
	int64_t id;
	int given = 0;
	bool have_median = false;

	if (!need_admin_db(c, "split"))
		return;
	if (ns == NULL || strchr(ns, '.') == NULL) {
		px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
			 ns ? ns : "(not a string)");
		return;
	}
	given += px_get_doc(c->cmd, "middle", &middle) && !bson_empty(&middle);
	given += bson_has_field(c->cmd, "find");
	given += bson_has_field(c->cmd, "bounds");
	if (given != 1) {
		px_error(c, WIRE_ERR_BAD_VALUE,
			 "need to specify exactly one of middle, find or bounds (the split point)");
		return;
	}
	snprintf(sub.ns, sizeof sub.ns, "%s", ns);
	rc = px_route(&sub, true, err, sizeof err);
	if (rc == NULL) {
		px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
		return;
	}
	if (rc->nkeys == 0) {
		route_coll_unref(rc);
		px_error(c, 118 /* NamespaceNotSharded */, "%s is not sharded", ns);
		return;
	}
	if (bson_has_field(c->cmd, "middle")) {
		ci = route_find_chunk(rc, &middle);
	} else {
		if (rc->hashed || rc->nkeys != 1) {
			route_coll_unref(rc);
			px_error(c, 115 /* CommandNotSupported */,
				 "split with find or bounds (at the median of the chunk's documents) "
				 "needs a ranged single-field shard key in stripedb: give the split "
				 "point as middle");
			return;
		}
		ci = chunk_of_find_or_bounds(c, rc);
		if (ci >= 0) {
			/* the shard reads run in the collection's database */
			ctx in_db = sub;
			char dbname[256];
			const char *dot = strchr(ns, '.');
			snprintf(dbname, sizeof dbname, "%.*s", (int)(dot - ns), ns);
			in_db.db = dbname;
			in_db.coll = dot + 1;
			if (!chunk_median(&in_db, rc, ci, &median)) {
				route_coll_unref(rc);
				return;
			}
			have_median = true;
		}
	}
	id = ci >= 0 ? rc->chunks[ci].nid : 0;
	route_coll_unref(rc);
	if (ci < 0 || id == 0) {
		if (have_median)
			bson_destroy(&median);
		px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s holds the split point", ns);
		return;
	}
	BSON_APPEND_INT64(&cmd, "splitChunk", id);
	BSON_APPEND_DOCUMENT(&cmd, "at", have_median ? &median : &middle);
	if (have_median)
		bson_destroy(&median);
	if (meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&reply);
		rc = px_route(&sub, true, err, sizeof err);
		if (rc)
			route_coll_unref(rc);
		out = bson_new();
		px_reply(c, out);
	}
	bson_destroy(&cmd);
}


/* The UTF-8 string field name of d, or NULL. */
static const char *str_of(const bson_t *d, const char *name)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* A chunk of the shard being removed: its collection and metadata id. */
typedef struct owned_chunk {
	char ns[256];
	int64_t nid;
} owned_chunk;

/* The chunks of every collection that shard owns (getRoutingTable "all", batch by batch),
 * into *out (heap, may be NULL when none); their number, or -1 after answering c. */
static int64_t chunks_on(ctx *c, const char *shard, owned_chunk **out)
{
	bson_t resume;
	bool have_resume = false, more = true;
	int64_t n = 0;
	size_t cap = 0;

	*out = NULL;
	while (more) {
		bson_t cmd = BSON_INITIALIZER, cur, reply, r;
		bson_iter_t it, arr;
		BSON_APPEND_UTF8(&cmd, "getRoutingTable", "all");
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
		bson_append_document_end(&cmd, &cur);
		if (have_resume) {
			BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", &resume);
			bson_destroy(&resume);
			have_resume = false;
		}
		if (!meta_call(c, &cmd, &reply, NULL, NULL)) {
			bson_destroy(&cmd);
			free(*out);
			*out = NULL;
			return -1;
		}
		if (bson_iter_init_find(&it, &reply, "chunks") && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &arr))
			while (bson_iter_next(&arr)) {
				bson_t ch;
				const char *cs, *cns;
				if (!doc_of(&arr, &ch))
					continue;
				cs = str_of(&ch, "shard");
				cns = str_of(&ch, "ns");
				if (cs == NULL || cns == NULL || strcmp(cs, shard) != 0)
					continue;
				if ((size_t)n == cap) {
					cap = cap ? cap * 2 : 64;
					*out = sdb_realloc(*out, cap * sizeof **out);
				}
				snprintf((*out)[n].ns, sizeof (*out)[n].ns, "%s", cns);
				(*out)[n].nid = px_get_int(&ch, "id", 0);
				n++;
			}
		more = px_get_bool(&reply, "more", false) && px_get_doc(&reply, "resumeAfter", &r);
		if (more) {
			bson_copy_to(&r, &resume);
			have_resume = true;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	return n;
}

/* The migrations of the listMigrations reply list that have not ended (registered ...
 * cleanup) and move chunk nid (nid != 0) or move a chunk from or to shard (shard != NULL). */
static int64_t active_migrations(const bson_t *list, int64_t nid, const char *shard)
{
	bson_iter_t it, arr;
	int64_t n = 0;

	if (!bson_iter_init_find(&it, list, "migrations") || !bson_iter_recurse(&it, &arr))
		return 0;
	while (bson_iter_next(&arr)) {
		bson_t m, spec;
		const char *st, *from, *to;
		/* the migration's spec is its registerMigration {ns, chunk, from, to} */
		if (!doc_of(&arr, &m) || !px_get_doc(&m, "spec", &spec))
			continue;
		st = str_of(&m, "state");
		if (st == NULL || strcmp(st, "complete") == 0 || strcmp(st, "aborted") == 0 ||
		    strcmp(st, "rolled_back") == 0)
			continue;
		from = str_of(&spec, "from");
		to = str_of(&spec, "to");
		if ((nid != 0 && px_get_int(&spec, "chunk", 0) == nid) ||
		    (shard && ((from && strcmp(from, shard) == 0) || (to && strcmp(to, shard) == 0))))
			n++;
	}
	return n;
}

/* {removeShard: ID} as on a mongos. A shard that owns chunks is drained: the first call
 * registers one Data Movement Platform migration per chunk it owns, spread round-robin over
 * the other shards (run by the coordinators, as `stripedb ctl shard drain`), and answers
 * state "started"; later calls answer "ongoing" with remaining.chunks, registering a
 * migration again for any chunk whose migration ended without moving it (aborted, rolled
 * back) or that appeared since; once it owns nothing and no migration from or to it is still
 * running (a switched migration still cleans up on the donor) the shard is removed (state
 * "completed"). A shard that is the primary shard of a database still holding unsharded
 * collections on it is refused (IllegalOperation 20, naming them: there is no movePrimary;
 * issue #18); metadata then moves the primary of its other databases to the lowest
 * remaining shard id. Not built: a "draining" mark in metadata, so a
 * shardCollection meanwhile may still place chunks on it (the next call drains them). */
void px_do_remove_shard(ctx *c)
{
	const char *id = first_utf8(c->cmd);
	int64_t n, i;
	bson_t cmd = BSON_INITIALIZER, reply, *out;
	char **ids = NULL, err[256];
	size_t nids, j, nothers = 0;
	bool known = false, have_migs = false;
	owned_chunk *owned = NULL;
	bson_t migs;
	int64_t running;

	if (!need_admin_db(c, "removeShard"))
		return;
	if (id == NULL || id[0] == '\0') {
		px_error(c, WIRE_ERR_BAD_VALUE, "removeShard needs a shard id string");
		return;
	}
	nids = px_shard_ids(c, &ids);
	for (j = 0; j < nids; j++) {
		if (strcmp(ids[j], id) == 0) {
			known = true;
			free(ids[j]);
		} else {
			ids[nothers++] = ids[j]; /* the other shards, kept for the drain */
		}
	}
	if (!known) {
		px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %s not found", id);
		goto out;
	}
	if (nids > 1) {
		char names[2048];
		int64_t nu = px_unsharded_on(c, id, names, sizeof names);
		if (nu < 0)
			goto out;
		if (nu > 0) {
			px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				 "cannot remove shard %s: it is the primary shard of databases that "
				 "still hold %lld unsharded collection(s): %s%s; you need to call "
				 "movePrimary (not supported by stripedb: drop them, or copy them to a "
				 "database with another primary shard)", id, (long long)nu, names,
				 nu > 20 ? ", ..." : "");
			goto out;
		}
	}
	n = chunks_on(c, id, &owned);
	if (n < 0)
		goto out;
	{
		bson_t q = BSON_INITIALIZER;
		BSON_APPEND_INT32(&q, "listMigrations", 1);
		if (!meta_call(c, &q, &migs, NULL, NULL)) {
			bson_destroy(&q);
			goto out;
		}
		have_migs = true;
		bson_destroy(&q);
	}
	running = active_migrations(&migs, 0, id);
	if (n > 0 || running > 0) {
		bson_t rem;
		int64_t moving = 0, started = 0;
		if (n > 0 && nothers == 0) {
			px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				 "cannot remove shard %s: it owns %lld chunks and there is no other "
				 "shard to drain them to", id, (long long)n);
			goto out;
		}
		for (i = 0; i < n; i++) {
			char mid[160];
			bson_t r;
			if (active_migrations(&migs, owned[i].nid, NULL) > 0) {
				moving++;
				continue;
			}
			snprintf(mid, sizeof mid, "drain-%s-%lld-%llx", id, (long long)owned[i].nid,
				 (unsigned long long)sdb_wall_ms());
			bson_reinit(&cmd);
			BSON_APPEND_UTF8(&cmd, "registerMigration", mid);
			BSON_APPEND_UTF8(&cmd, "ns", owned[i].ns);
			BSON_APPEND_INT64(&cmd, "chunk", owned[i].nid);
			BSON_APPEND_UTF8(&cmd, "from", id);
			BSON_APPEND_UTF8(&cmd, "to", ids[(size_t)i % nothers]);
			if (!meta_call(c, &cmd, &r, NULL, NULL))
				goto out;
			bson_destroy(&r);
			started++;
		}
		sdb_info("shard drain", "shard=%s chunks=%lld moving=%lld registered=%lld "
			 "running=%lld", id, (long long)n, (long long)moving, (long long)started,
			 (long long)running);
		out = bson_new();
		if (running == 0) {
			BSON_APPEND_UTF8(out, "msg", "draining started successfully");
			BSON_APPEND_UTF8(out, "state", "started");
			BSON_APPEND_UTF8(out, "shard", id);
		} else {
			BSON_APPEND_UTF8(out, "msg", "draining ongoing");
			BSON_APPEND_UTF8(out, "state", "ongoing");
			bson_append_document_begin(out, "remaining", -1, &rem);
			BSON_APPEND_INT64(&rem, "chunks", n);
			BSON_APPEND_INT64(&rem, "dbs", 0);
			BSON_APPEND_INT64(&rem, "jumboChunks", 0);
			bson_append_document_end(out, &rem);
		}
		BSON_APPEND_UTF8(out, "note",
				 "the Data Movement Platform moves each chunk (stripedb ctl migration "
				 "list); call removeShard again to see the progress");
		{
			bson_t dbs;
			bson_append_array_begin(out, "dbsToMove", -1, &dbs);
			bson_append_array_end(out, &dbs);
		}
		px_reply(c, out);
		goto out;
	}
	BSON_APPEND_UTF8(&cmd, "removeShard", id);
	if (meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&reply);
		if (proxy_load_shards(c->p, err, sizeof err) != 0)
			sdb_warn("shard list reload failed", "err=\"%s\"", err);
		out = bson_new();
		BSON_APPEND_UTF8(out, "msg", "removeshard completed successfully");
		BSON_APPEND_UTF8(out, "state", "completed");
		BSON_APPEND_UTF8(out, "shard", id);
		px_reply(c, out);
	}
out:
	for (j = 0; j < nothers; j++)
		free(ids[j]);
	free(ids);
	free(owned);
	if (have_migs)
		bson_destroy(&migs);
	bson_destroy(&cmd);
}

/* The state of migration id into state (heap) and its migration document into mig (initialised
 * when true). False after answering c. */
static bool migration_state(ctx *c, const char *id, char **state, bson_t *mig)
{
	bson_t cmd = BSON_INITIALIZER, reply, m;
	bool ok;

	BSON_APPEND_UTF8(&cmd, "getMigration", id);
	ok = meta_call(c, &cmd, &reply, NULL, NULL);
	bson_destroy(&cmd);
	if (!ok)
		return false;
	bson_init(mig);
	*state = NULL;
	if (px_get_doc(&reply, "migration", &m)) {
		bson_destroy(mig);
		bson_copy_to(&m, mig);
		bson_iter_t it;
		if (bson_iter_init_find(&it, &m, "state") && BSON_ITER_HOLDS_UTF8(&it))
			*state = sdb_strdup(bson_iter_utf8(&it, NULL));
	}
	bson_destroy(&reply);
	if (*state == NULL)
		*state = sdb_strdup("?");
	return true;
}

/* Register one migration of chunk nid of ns from -> to (metadata registerMigration, run by
 * the coordinators) and wait for its end, answering c: {millis, migration} when complete
 * (the routing of sub->ns refreshed), OperationFailed (96) when it ended otherwise,
 * MaxTimeMSExpired (50) when it still runs after max_ms (it goes on). what names the
 * command in messages. */
static void move_and_wait(ctx *c, ctx *sub, const char *what, const char *ns, int64_t nid,
			  const char *from, const char *to, int64_t max_ms, uint64_t start)
{
	bson_t cmd = BSON_INITIALIZER, reply, mig, *out;
	route_coll *rc;
	char err[256], mid[128], *state = NULL;

	snprintf(mid, sizeof mid, "mig-proxy-%lld-%llx", (long long)nid,
		 (unsigned long long)sdb_wall_ms());
	BSON_APPEND_UTF8(&cmd, "registerMigration", mid);
	BSON_APPEND_UTF8(&cmd, "ns", ns);
	BSON_APPEND_INT64(&cmd, "chunk", nid);
	BSON_APPEND_UTF8(&cmd, "from", from);
	BSON_APPEND_UTF8(&cmd, "to", to);
	if (!meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&cmd);
		return;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	for (;;) {
		if (!migration_state(c, mid, &state, &mig))
			return;
		if (strcmp(state, "complete") == 0 || strcmp(state, "aborted") == 0 ||
		    strcmp(state, "rolled_back") == 0)
			break;
		bson_destroy(&mig);
		free(state);
		state = NULL;
		if (sdb_mono_ms() - start > (uint64_t)max_ms) {
			px_error(c, WIRE_ERR_MAX_TIME_EXPIRED,
				 "%s: migration %s still running after %lld ms (it goes on: "
				 "stripedb ctl migration status %s)", what, mid, (long long)max_ms, mid);
			return;
		}
		sdb_sleep_ms(100); /* the coordinators' progress, polled */
	}
	bson_destroy(&mig);
	if (strcmp(state, "complete") == 0) {
		rc = px_route(sub, true, err, sizeof err);
		if (rc)
			route_coll_unref(rc);
		out = bson_new();
		BSON_APPEND_INT64(out, "millis", (int64_t)(sdb_mono_ms() - start));
		BSON_APPEND_UTF8(out, "migration", mid);
		px_reply(c, out);
	} else {
		px_error(c, WIRE_ERR_OPERATION_FAILED, "%s: migration %s ended %s", what, mid, state);
	}
	free(state);
}

/* The checks moveChunk and moveRange share: the admin database, ns (the command's first
 * value) a sharded namespace, the destination (field to_field) a known shard, maxTimeMS.
 * On success *rc is ns's routing (refreshed; unref it), *to points into c->cmd, sub is c
 * for ns. False after answering c. */
static bool move_prepare(ctx *c, const char *what, const char *to_field, ctx *sub,
			 route_coll **rc, const char **to, int64_t *max_ms)
{
	const char *ns = first_utf8(c->cmd);
	bson_iter_t it;
	char err[256], **ids = NULL;
	size_t n, i;
	bool known = false;

	if (!need_admin_db(c, what))
		return false;
	if (ns == NULL || strchr(ns, '.') == NULL) {
		px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
			 ns ? ns : "(not a string)");
		return false;
	}
	*to = NULL;
	if (bson_iter_init_find(&it, c->cmd, to_field) && BSON_ITER_HOLDS_UTF8(&it))
		*to = bson_iter_utf8(&it, NULL);
	if (*to == NULL || (*to)[0] == '\0') {
		px_error(c, WIRE_ERR_BAD_VALUE, "%s needs the destination shard as %s", what,
			 to_field);
		return false;
	}
	if (!px_client_int(c, "maxTimeMS", 0, INT32_MAX, 15 * 60 * 1000, max_ms))
		return false;
	if (*max_ms == 0)
		*max_ms = 15 * 60 * 1000;
	n = px_shard_ids(c, &ids);
	for (i = 0; i < n; i++) {
		known |= strcmp(ids[i], *to) == 0;
		free(ids[i]);
	}
	free(ids);
	if (!known) {
		px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %s not found", *to);
		return false;
	}
	*sub = *c;
	snprintf(sub->ns, sizeof sub->ns, "%s", ns);
	*rc = px_route(sub, true, err, sizeof err);
	if (*rc == NULL) {
		px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
		return false;
	}
	if ((*rc)->nkeys == 0) {
		route_coll_unref(*rc);
		px_error(c, 118 /* NamespaceNotSharded */, "%s is not sharded", ns);
		return false;
	}
	return true;
}

/* {moveChunk: "db.coll", find: {key...} | bounds: [min, max], to: SHARD} (sh.moveChunk): one
 * migration of the Data Movement Platform (metadata registerMigration {ns, chunk, from, to}),
 * run by the coordinators; answered when it is complete, as MongoDB's moveChunk is
 * synchronous (`_waitForDelete`, `secondaryThrottle`, `writeConcern` are accepted: a migration
 * completes after its cleanup). A migration that ends otherwise: OperationFailed (96) with
 * its id and state; still running after maxTimeMS (default 15 minutes): MaxTimeMSExpired (50)
 * with its id (it goes on). Already on `to`: ok at once. */
void px_do_move_chunk(ctx *c)
{
	const char *ns = first_utf8(c->cmd), *to = NULL;
	ctx sub;
	route_coll *rc;
	ssize_t ci = -1;
	char *from = NULL;
	int64_t nid = 0, max_ms;
	uint64_t start = sdb_mono_ms();

	if (!move_prepare(c, "moveChunk", "to", &sub, &rc, &to, &max_ms))
		return;
	if (bson_has_field(c->cmd, "find") || bson_has_field(c->cmd, "bounds")) {
		ci = chunk_of_find_or_bounds(c, rc);
	} else {
		route_coll_unref(rc);
		px_error(c, WIRE_ERR_BAD_VALUE, "moveChunk needs find or bounds");
		return;
	}
	if (ci >= 0) {
		nid = rc->chunks[ci].nid;
		from = sdb_strdup(rc->chunks[ci].shard);
	}
	route_coll_unref(rc);
	if (ci < 0 || nid == 0) {
		free(from);
		px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s matches the find or bounds given", ns);
		return;
	}
	if (strcmp(from, to) == 0) {
		free(from);
		px_reply(c, bson_new()); /* already there (MongoDB: ok) */
		return;
	}
	move_and_wait(c, &sub, "moveChunk", ns, nid, from, to, max_ms, start);
	free(from);
}

/* Split chunk nid of sub->ns at key (metadata splitChunk) and refresh sub's routing. False
 * after answering c. */
static bool split_at(ctx *c, ctx *sub, int64_t nid, const bson_t *key)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	route_coll *rc;
	char err[256];
	bool ok;

	BSON_APPEND_INT64(&cmd, "splitChunk", nid);
	BSON_APPEND_DOCUMENT(&cmd, "at", key);
	ok = meta_call(c, &cmd, &reply, NULL, NULL);
	bson_destroy(&cmd);
	if (!ok)
		return false;
	bson_destroy(&reply);
	rc = px_route(sub, true, err, sizeof err);
	if (rc)
		route_coll_unref(rc);
	return true;
}

/* {moveRange: "db.coll", toShard: SHARD, min: {key...}, max: {key...}} (MongoDB 6.0,
 * sh.moveRange): the range [min, max) must lie within one chunk (MongoDB's rule: a range
 * spanning chunks is refused); a missing max is the chunk's max, a missing min the min of the
 * chunk that max ends or holds (stripedb does not cut by chunk size). When the range is a
 * part of its chunk, the chunk is split at min and/or max first (metadata splitChunk), then
 * the range's chunk moves as moveChunk's does (waited for; forceJumbo, waitForDelete,
 * secondaryThrottle and writeConcern accepted: migrations have no jumbo limit and complete
 * after their cleanup). A range already on toShard: ok. Hashed keys: min/max are values of
 * the hash space (NumberLong), as in MongoDB. */
void px_do_move_range(ctx *c)
{
	const char *ns = first_utf8(c->cmd), *to = NULL;
	ctx sub;
	bson_t lo, hi, lo_c, hi_c; /* lo_c, hi_c: the range, initialised by bson_copy_to */
	bool have_lo, have_hi;
	route_coll *rc;
	ssize_t ci;
	char *from = NULL;
	int64_t nid, max_ms;
	uint64_t start = sdb_mono_ms();

	if (!move_prepare(c, "moveRange", "toShard", &sub, &rc, &to, &max_ms))
		return;
	have_lo = px_get_doc(c->cmd, "min", &lo) && !bson_empty(&lo);
	have_hi = px_get_doc(c->cmd, "max", &hi) && !bson_empty(&hi);
	if (!have_lo && !have_hi) {
		route_coll_unref(rc);
		px_error(c, WIRE_ERR_BAD_VALUE, "moveRange needs min or max (the range to move)");
		return;
	}
	if (have_lo) {
		ci = route_find_chunk(rc, &lo);
	} else {
		/* the chunk that ends at max, else the one holding it */
		ci = route_find_chunk(rc, &hi);
		if (ci > 0 && route_key_cmp(rc->chunks[ci].min, &hi) == 0)
			ci--;
		else if (ci < 0 && rc->nchunks > 0 &&
			 route_key_cmp(rc->chunks[rc->nchunks - 1].max, &hi) == 0)
			ci = (ssize_t)rc->nchunks - 1;
	}
	if (ci < 0) {
		route_coll_unref(rc);
		px_error(c, WIRE_ERR_BAD_VALUE, "no chunk of %s holds the range given", ns);
		return;
	}
	bson_copy_to(have_lo ? &lo : rc->chunks[ci].min, &lo_c);
	bson_copy_to(have_hi ? &hi : rc->chunks[ci].max, &hi_c);
	if (route_key_cmp(&lo_c, &hi_c) >= 0 || route_key_cmp(&lo_c, rc->chunks[ci].min) < 0 ||
	    route_key_cmp(&hi_c, rc->chunks[ci].max) > 0) {
		route_coll_unref(rc);
		px_error(c, WIRE_ERR_BAD_VALUE,
			 "moveRange: [min, max) of %s must be a non-empty range within one chunk "
			 "(a range spanning several chunks is not allowed, as in MongoDB)", ns);
		goto out;
	}
	nid = rc->chunks[ci].nid;
	if (strcmp(rc->chunks[ci].shard, to) == 0) {
		route_coll_unref(rc);
		px_reply(c, bson_new()); /* already there */
		goto out;
	}
	/* cut the range out of its chunk */
	if (route_key_cmp(&lo_c, rc->chunks[ci].min) > 0) {
		route_coll_unref(rc);
		rc = NULL;
		if (!split_at(c, &sub, nid, &lo_c))
			goto out;
	}
	if (rc == NULL || route_key_cmp(&hi_c, rc->chunks[ci].max) < 0) {
		if (rc == NULL) {
			char err[256];
			rc = px_route(&sub, false, err, sizeof err);
			if (rc == NULL) {
				px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
				goto out;
			}
		}
		ci = route_find_chunk(rc, &lo_c);
		if (ci >= 0 && route_key_cmp(&hi_c, rc->chunks[ci].max) < 0) {
			nid = rc->chunks[ci].nid;
			route_coll_unref(rc);
			rc = NULL;
			if (!split_at(c, &sub, nid, &hi_c))
				goto out;
		}
	}
	if (rc == NULL) {
		char err[256];
		rc = px_route(&sub, false, err, sizeof err);
		if (rc == NULL) {
			px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
			goto out;
		}
	}
	ci = route_find_chunk(rc, &lo_c);
	if (ci < 0 || route_key_cmp(rc->chunks[ci].min, &lo_c) != 0 ||
	    route_key_cmp(rc->chunks[ci].max, &hi_c) != 0) {
		route_coll_unref(rc);
		px_error(c, 117 /* ConflictingOperationInProgress */,
			 "moveRange: the chunks of %s changed while the range was cut out: retry", ns);
		goto out;
	}
	nid = rc->chunks[ci].nid;
	from = sdb_strdup(rc->chunks[ci].shard);
	route_coll_unref(rc);
	move_and_wait(c, &sub, "moveRange", ns, nid, from, to, max_ms, start);
	free(from);
out:
	bson_destroy(&lo_c);
	bson_destroy(&hi_c);
}

/* {mergeChunks: "db.coll", bounds: [min, max]} (sh.mergeChunks): the chunks that exactly
 * cover [min, max) (contiguous, on one shard) become one (metadata mergeChunks; its token is
 * the largest of theirs, so shard versions do not change). Bounds that are not chunk bounds,
 * chunks on several shards: IllegalOperation (20); one chunk: ok (nothing to merge). */
void px_do_merge_chunks(ctx *c)
{
	const char *ns = first_utf8(c->cmd), *shard = NULL;
	ctx sub = *c;
	bson_t bounds, lo, hi, cmd = BSON_INITIALIZER, ids, reply, *out;
	route_coll *rc;
	ssize_t ci;
	size_t n = 0;
	char err[256], k[24];

	if (!need_admin_db(c, "mergeChunks"))
		return;
	if (ns == NULL || strchr(ns, '.') == NULL) {
		px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
			 ns ? ns : "(not a string)");
		return;
	}
	if (!px_get_array(c->cmd, "bounds", &bounds) || !px_get_doc(&bounds, "0", &lo) ||
	    !px_get_doc(&bounds, "1", &hi) || bson_count_keys(&bounds) != 2) {
		px_error(c, WIRE_ERR_BAD_VALUE, "mergeChunks needs bounds: [min, max]");
		return;
	}
	snprintf(sub.ns, sizeof sub.ns, "%s", ns);
	rc = px_route(&sub, true, err, sizeof err);
	if (rc == NULL) {
		px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
		return;
	}
	if (rc->nkeys == 0) {
		route_coll_unref(rc);
		px_error(c, 118 /* NamespaceNotSharded */, "%s is not sharded", ns);
		return;
	}
	ci = route_find_chunk(rc, &lo);
	if (ci < 0 || route_key_cmp(rc->chunks[ci].min, &lo) != 0) {
		route_coll_unref(rc);
		px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
			 "could not merge chunks of %s: min is not the lower bound of a chunk", ns);
		return;
	}
	BSON_APPEND_UTF8(&cmd, "mergeChunks", ns);
	bson_append_array_begin(&cmd, "ids", -1, &ids);
	for (; (size_t)ci < rc->nchunks; ci++) {
		const route_chunk *ch = &rc->chunks[ci];
		if (shard && strcmp(shard, ch->shard) != 0)
			break;
		shard = ch->shard;
		snprintf(k, sizeof k, "%zu", n++);
		BSON_APPEND_INT64(&ids, k, ch->nid);
		if (route_key_cmp(ch->max, &hi) >= 0)
			break;
	}
	bson_append_array_end(&cmd, &ids);
	if ((size_t)ci >= rc->nchunks || route_key_cmp(rc->chunks[ci].max, &hi) != 0) {
		route_coll_unref(rc);
		bson_destroy(&cmd);
		px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
			 "could not merge chunks of %s: [min, max) must be exactly covered by "
			 "contiguous chunks of one shard", ns);
		return;
	}
	route_coll_unref(rc);
	if (n < 2) {
		bson_destroy(&cmd);
		px_reply(c, bson_new()); /* one chunk: nothing to merge */
		return;
	}
	if (meta_call(c, &cmd, &reply, NULL, NULL)) {
		bson_destroy(&reply);
		rc = px_route(&sub, true, err, sizeof err);
		if (rc)
			route_coll_unref(rc);
		out = bson_new();
		px_reply(c, out);
	}
	bson_destroy(&cmd);
}
