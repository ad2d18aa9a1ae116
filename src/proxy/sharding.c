/* Sharding administration through the proxy, as on a mongos (issue #18): enableSharding,
 * shardCollection, listShards, addShard, drop (with the sharding metadata), the balancer
 * commands, and clear refusals of refineCollectionShardKey / reshardCollection / movePrimary
 * (the chunk commands, split, moveChunk, moveRange, mergeChunks and removeShard, are in
 * chunks.c). Each command is translated to the metadata
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/indexname.h"
#include "common/clock.h"
#include "common/log.h"
#include "proxy/ddllock.h"
#include "proxy/exec.h"
#include "storage/collation.h"
#include "proxy/sharding_int.h"

#define MAX_INITIAL_CHUNKS_PER_SHARD 8192 /* MongoDB's cap on numInitialChunks per shard */

/* MongoDB's refusal of a mongos admin command sent to another database. */
int px_need_admin_db(ctx *c, const char *name)
{
	if (c->db && strcmp(c->db, "admin") == 0)
		return 0;
	return px_error(c, WIRE_ERR_UNAUTHORIZED,
			"%s may only be run against the admin database.", name);
}

/* Run cmd on metadata (sharding_int.h): 0 with reply, or the code answered on c. */
int px_sharding_meta_call(ctx *c, const bson_t *cmd, bson_t *reply, const int *ok_codes,
			   int *code_out)
{
	char err[512];
	int code = 0, rc = proxy_meta_command(c->p, cmd, reply, &code, err, sizeof err);
	size_t i;

	if (code_out)
		*code_out = 0;
	if (rc == 0)
		return 0;
	for (i = 0; ok_codes && ok_codes[i]; i++)
		if (code == ok_codes[i]) {
			if (code_out)
				*code_out = code;
			return 0;
		}
	bson_destroy(reply);
	if (rc == SDB_EPROTO && code != 0)
		return px_error(c, code, "%s", err);
	return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
}

/* The string value of the command's first field (the command name's argument), or NULL. */
const char *px_first_utf8(const bson_t *cmd)
{
	bson_iter_t it;

	if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* createDatabase on metadata, an existing database being fine (enableSharding and
 * shardCollection create the database implicitly, as MongoDB 6+). */
/* db created in metadata (existing already is fine): 0, or the code answered on c. */
static int ensure_database(ctx *c, const char *db)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int ok[] = {WIRE_ERR_NAMESPACE_EXISTS, WIRE_ERR_DUPLICATE_KEY, 0};
	int st;

	if ((st = px_db_case_check(c, db)) != 0) {
		bson_destroy(&cmd);
		return st;
	}
	BSON_APPEND_UTF8(&cmd, "createDatabase", db);
	st = px_sharding_meta_call(c, &cmd, &reply, ok, NULL);
	if (st == 0)
		bson_destroy(&reply);
	bson_destroy(&cmd);
	return st;
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
static int do_enable_sharding(ctx *c)
{
	const char *db = px_first_utf8(c->cmd), *ps = NULL;
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int ok[] = {WIRE_ERR_NAMESPACE_EXISTS, WIRE_ERR_DUPLICATE_KEY, 0};
	bson_iter_t it;
	int code = 0, st;

	if ((st = px_need_admin_db(c, "enableSharding")) != 0)
		goto out;
	if (db == NULL || !valid_db_name(db)) {
		st = px_error(c, WIRE_ERR_INVALID_NAMESPACE, "invalid db name specified: %s",
			      db ? db : "(not a string)");
		goto out;
	}
	if (strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 || strcmp(db, "local") == 0) {
		st = px_error(c, WIRE_ERR_INVALID_OPTIONS, "can't shard %s database", db);
		goto out;
	}
	if (bson_iter_init_find(&it, c->cmd, "primaryShard")) {
		if (!BSON_ITER_HOLDS_UTF8(&it) || bson_iter_utf8(&it, NULL)[0] == '\0') {
			st = px_error(c, WIRE_ERR_BAD_VALUE, "primaryShard must be a shard id string");
			goto out;
		}
		ps = bson_iter_utf8(&it, NULL);
	}
	if ((st = px_db_case_check(c, db)) != 0)
		goto out;
	if (ps && (st = px_db_data_stays_visible(c, db, ps)) != 0)
		goto out;
	BSON_APPEND_UTF8(&cmd, "createDatabase", db);
	if (ps)
		BSON_APPEND_UTF8(&cmd, "primary", ps);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, ok, &code)) != 0)
		goto out;
	bson_destroy(&reply);
	if (code != 0 && ps) {
		char *cur = px_meta_db_primary(c, db);
		if (cur == NULL || strcmp(cur, ps) != 0) {
			st = px_error(c, WIRE_ERR_NAMESPACE_EXISTS,
				      "database %s already exists with primary shard %s, not %s", db,
				      cur ? cur : "(unknown)", ps);
			free(cur);
			goto out;
		}
		free(cur);
	}
	px_reload_db_primaries(c);
	st = px_reply(c, bson_new());
out:
	bson_destroy(&cmd);
	return st;
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
 * Returns: 0, or the code answered on c (a shard unreachable, or documents on several
 * shards: IllegalOperation 20). */
static int find_data_holder(ctx *c, const char *db, const char *coll, const char *ns,
			    char **holder)
{
	ctx sub = *c;
	probe pr;
	size_t n, i, nhave = 0;
	int st = 0;

	sub.db = db; /* px_run_on runs in c->db */
	memset(&pr, 0, sizeof pr);
	pr.c = &sub;
	pr.coll = coll;
	n = px_shard_ids(c, &pr.ids);
	pr.has = sdb_calloc(n ? n : 1, sizeof *pr.has);
	pr.cls = sdb_calloc(n ? n : 1, sizeof *pr.cls);
	pr.nerr = sdb_calloc(n ? n : 1, sizeof *pr.nerr);
	pr.replies = sdb_calloc_bson(n, sizeof *pr.replies);
	px_fanout(c, n, probe_one, &pr);
	*holder = NULL;
	for (i = 0; i < n && st == 0; i++) {
		if (pr.cls[i] != SHARDCONN_OK) {
			int code = (int)px_get_int(&pr.replies[i], "code", 0);
			if (pr.cls[i] == SHARDCONN_CMD_ERR && code == WIRE_ERR_NAMESPACE_NOT_FOUND)
				continue;
			st = px_reply_shard_error(c, pr.cls[i], &pr.replies[i], pr.nerr[i]);
		} else if (pr.has[i]) {
			nhave++;
			if (*holder == NULL)
				*holder = sdb_strdup(pr.ids[i]);
		}
	}
	if (st == 0 && nhave > 1)
		st = px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
			      "cannot shard %s: its unsharded documents are on %zu shards (an "
			      "unsharded collection must live on one shard); move them to one shard "
			      "first",
			      ns, nhave);
	if (st != 0) {
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
	return st;
}

/* Checks key (the shard key pattern): every value 1 (ranged) or one field "hashed".
 * Sets *hashed. Returns: 0, or the code answered on c (BadValue 2, InvalidOptions 72). */
static int check_key(ctx *c, const bson_t *key, bool *hashed)
{
	bson_iter_t it;
	size_t n = 0, nh = 0;

	*hashed = false;
	if (!bson_iter_init(&it, key) || bson_empty(key))
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"shard key pattern must be a non-empty document");
	while (bson_iter_next(&it)) {
		const char *f = bson_iter_key(&it);
		n++;
		if (f[0] == '\0' || f[0] == '$')
			return px_error(c, WIRE_ERR_BAD_VALUE,
					"Unsupported shard key pattern field: '%s'", f);
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0) {
			nh++;
			continue;
		}
		if (BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_double(&it) == 1.0)
			continue;
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"Unsupported shard key pattern: field '%s' must be 1 or \"hashed\"",
				f);
	}
	if (nh > 0 && n > 1)
		return px_error(c, WIRE_ERR_INVALID_OPTIONS,
				"compound hashed shard keys are not supported by stripedb: a hashed "
				"shard key has exactly one field");
	*hashed = nh > 0;
	return 0;
}

/* collation: only the simple collation (absent, or {locale: "simple"}). Returns: 0, or
 * BadValue (2) answered on c. */
static int check_collation(ctx *c)
{
	bson_t col;
	bson_iter_t it;

	if (!bson_has_field(c->cmd, "collation"))
		return 0;
	if (px_get_doc(c->cmd, "collation", &col) && bson_iter_init(&it, &col) &&
	    bson_iter_next(&it) && strcmp(bson_iter_key(&it), "locale") == 0 &&
	    BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "simple") == 0 &&
	    !bson_iter_next(&it))
		return 0;
	return px_error(c, WIRE_ERR_BAD_VALUE,
			"The collation for shardCollection must be {locale: 'simple'}");
}

/* Options of shardCollection that are refused rather than ignored. Returns: 0, or
 * InvalidOptions (72) answered on c. */
static int check_options(ctx *c)
{
	static const char *const refused[] = {"timeseries", "presplitHashedZones",
					      "implicitlyCreateIndex", "enforceUniquenessCheck",
					      NULL};
	size_t i;

	for (i = 0; refused[i]; i++)
		if (bson_has_field(c->cmd, refused[i]))
			return px_error(c, WIRE_ERR_INVALID_OPTIONS,
					"shardCollection option %s is not supported by stripedb",
					refused[i]);
	return 0;
}

/* The key stored in metadata for ns (into key_out, initialised in every case) when ns is
 * sharded: *found. Returns: 0, or the code answered on c (metadata unreachable...). */
static int sharded_key(ctx *c, const char *db, const char *ns, bson_t *key_out, bool *hashed,
		       bool *found)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr, e;
	int st;

	*found = false;
	bson_init(key_out);
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_UTF8(&cmd, "db", db);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) != 0) {
		bson_destroy(&cmd);
		return st;
	}
	if (bson_iter_init_find(&it, &reply, "collections") && bson_iter_recurse(&it, &arr))
		while (!*found && bson_iter_next(&arr)) {
			bson_t d, k;
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
				continue;
			bson_iter_document(&arr, &len, &data);
			if (!bson_init_static(&d, data, len) || !bson_iter_init_find(&e, &d, "ns") ||
			    !BSON_ITER_HOLDS_UTF8(&e) || strcmp(bson_iter_utf8(&e, NULL), ns) != 0)
				continue;
			*found = true;
			if (px_get_doc(&d, "key", &k)) {
				bson_destroy(key_out);
				bson_copy_to(&k, key_out);
			}
			*hashed = px_get_bool(&d, "hashed", false);
		}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return 0;
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

/* cmd (in sub's database) sent to every registered shard at once: the calls, n of them
 * (free with px_pcalls_free). */
static pcall *fanout_every_shard(ctx *c, ctx *sub, const bson_t *cmd, size_t *n)
{
	char **ids = NULL;
	pcall *pc;

	*n = px_shard_ids(c, &ids);
	pc = px_pcalls_new(sub, ids, *n);
	for (size_t i = 0; i < *n; i++) {
		bson_destroy(&pc[i].cmd);
		bson_copy_to(cmd, &pc[i].cmd);
	}
	px_fanout(c, *n, px_pcall_one, pc);
	return pc;
}

/* cmd sent to every shard (fanout_every_shard). Returns: 0, or the first failure (other
 * than the codes of ok_codes, 0-terminated, may be NULL) answered on c. */
static int on_every_shard(ctx *c, ctx *sub, const bson_t *cmd, const int *ok_codes)
{
	size_t n;
	pcall *pc = fanout_every_shard(c, sub, cmd, &n), *bad;
	int st = 0;

	bad = px_pcalls_failed(pc, n, ok_codes);
	if (bad)
		st = px_reply_shard_error(c, bad->cls, &bad->reply, bad->nerr);
	px_pcalls_free(pc, n);
	return st;
}

/* Creates the index on the shard key on every shard (MongoDB's default name, e.g. k_1 or
 * k_hashed). unique (ranged keys): each shard enforces it for the key ranges it owns, which
 * together enforce it cluster-wide. Returns: 0, or the first shard's error answered on c. */
static int create_key_index(ctx *c, const char *db, const char *coll, const bson_t *key,
			     bool unique)
{
	ctx sub = *c;
	bson_t cmd = BSON_INITIALIZER;
	int st;

	sub.db = db;
	sdb_index_create_cmd(&cmd, coll, key, unique);
	st = on_every_shard(c, &sub, &cmd, NULL);
	bson_destroy(&cmd);
	return st;
}

/* Document validation follows a collection being sharded (issue #20): the validation
 * options (validator, validationLevel, validationAction) of db.coll found on a shard that
 * has them are set with collMod on every shard, so that the shards that get the collection
 * now (the shard key's index) enforce what its first shard does. Best effort for the
 * lookup (no shard answering: nothing to copy); a failed collMod is answered on c.
 * Returns: 0, or the first shard's error. */
static int copy_validation(ctx *c, const char *db, const char *coll)
{
	static const char *const fields[] = {"validator", "validationLevel", "validationAction"};
	ctx sub = *c;
	bson_t cmd = BSON_INITIALIZER, filter, mod = BSON_INITIALIZER;
	size_t n, i;
	pcall *pc;
	bool any = false;
	int st = 0;
	static const int missing[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};

	sub.db = db;
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &filter);
	BSON_APPEND_UTF8(&filter, "name", coll);
	bson_append_document_end(&cmd, &filter);
	pc = fanout_every_shard(c, &sub, &cmd, &n);
	BSON_APPEND_UTF8(&mod, "collMod", coll);
	for (i = 0; i < n && !any; i++) {
		bson_iter_t it, cur, fb, opts, f;
		if (pc[i].cls != SHARDCONN_OK ||
		    !bson_iter_init_find(&it, &pc[i].reply, "cursor") ||
		    !bson_iter_recurse(&it, &cur) || !bson_iter_find(&cur, "firstBatch") ||
		    !bson_iter_recurse(&cur, &fb) || !bson_iter_next(&fb) ||
		    !BSON_ITER_HOLDS_DOCUMENT(&fb) || !bson_iter_recurse(&fb, &opts) ||
		    !bson_iter_find(&opts, "options") || !BSON_ITER_HOLDS_DOCUMENT(&opts))
			continue;
		for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
			if (bson_iter_recurse(&opts, &f) && bson_iter_find(&f, fields[k])) {
				bson_append_iter(&mod, fields[k], -1, &f);
				any = true;
			}
	}
	px_pcalls_free(pc, n);
	bson_destroy(&cmd);
	if (any)
		st = on_every_shard(c, &sub, &mod, missing);
	bson_destroy(&mod);
	return st;
}

/* The document it holds into out (a static view). */
bool px_doc_of(const bson_iter_t *it, bson_t *out)
{
	uint32_t len;
	const uint8_t *data;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

/* sharding_int.h */
const char *px_str_of(const bson_t *d, const char *name)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* sharding_int.h */
void px_each_doc(const bson_t *d, const char *name, void (*fn)(const bson_t *doc, void *arg),
		 void *arg)
{
	bson_iter_t it, arr;
	bson_t doc;

	if (!bson_iter_init_find(&it, d, name) || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return;
	while (bson_iter_next(&arr))
		if (px_doc_of(&arr, &doc))
			fn(&doc, arg);
}

/* sharding_int.h. Each batch's reply says `more` and gives the `resumeAfter` of the next. */
int px_each_routing_chunk(ctx *c, void (*fn)(const bson_t *chunk, void *arg), void *arg)
{
	bson_t resume;
	bool have_resume = false, more = true;
	int st;

	while (more) {
		bson_t cmd = BSON_INITIALIZER, cur, reply, r;
		BSON_APPEND_UTF8(&cmd, "getRoutingTable", "all");
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
		bson_append_document_end(&cmd, &cur);
		if (have_resume) {
			BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", &resume);
			bson_destroy(&resume);
			have_resume = false;
		}
		if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) != 0) {
			bson_destroy(&cmd);
			return st;
		}
		px_each_doc(&reply, "chunks", fn, arg);
		more = px_get_bool(&reply, "more", false) && px_get_doc(&reply, "resumeAfter", &r);
		if (more) {
			bson_copy_to(&r, &resume);
			have_resume = true;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	return 0;
}

/* Whether index key pattern kp starts with the shard key pattern key, field by field with
 * equal values (1 and 1.0 alike; "hashed" for a hashed key): MongoDB's
 * KeyPattern::isPrefixOf as used by shardCollection's shard key index check. */
static bool key_prefixes(const bson_t *key, const bson_t *kp)
{
	bson_iter_t ki, si;
	if (!bson_iter_init(&ki, kp) || !bson_iter_init(&si, key))
		return false;
	while (bson_iter_next(&si)) {
		if (!bson_iter_next(&ki) || strcmp(bson_iter_key(&ki), bson_iter_key(&si)) != 0)
			return false;
		if (BSON_ITER_HOLDS_UTF8(&si) || BSON_ITER_HOLDS_UTF8(&ki)) {
			if (!BSON_ITER_HOLDS_UTF8(&si) || !BSON_ITER_HOLDS_UTF8(&ki) ||
			    strcmp(bson_iter_utf8(&si, NULL), bson_iter_utf8(&ki, NULL)) != 0)
				return false;
		} else if (!BSON_ITER_HOLDS_NUMBER(&si) || !BSON_ITER_HOLDS_NUMBER(&ki) ||
			   bson_iter_as_double(&si) != bson_iter_as_double(&ki)) {
			return false;
		}
	}
	return true;
}

/* A collection with a non-simple default collation (create's `collation`, issue #20) is
 * not sharded: the routing compares shard key strings by their bytes while the shards'
 * commands without a collation compare under the default, so a string equality would be
 * sent to one chunk and miss equal strings in others (mongos broadcasts then; stripedb's
 * proxy does not read collections' defaults). Asked of every shard (an empty collection has
 * no data holder). Returns: 0, or the code answered on c (238, or a shard's error). */
static int check_default_collation(ctx *c, const char *db, const char *coll)
{
	char **ids = NULL;
	size_t n = px_shard_ids(c, &ids), i;
	ctx in_db = *c;
	int st = 0;

	in_db.db = db;
	for (i = 0; i < n; i++) {
		bson_t cmd = BSON_INITIALIZER, filter = BSON_INITIALIZER, reply, cur, batch, info,
		       opts;
		bson_iter_t it;
		char nerr[256];
		int cls;

		if (st == 0) {
			BSON_APPEND_INT32(&cmd, "listCollections", 1);
			BSON_APPEND_UTF8(&filter, "name", coll);
			BSON_APPEND_DOCUMENT(&cmd, "filter", &filter);
			cls = px_run_on(&in_db, ids[i], &cmd, NULL, &reply, nerr, sizeof nerr);
			if (cls != SHARDCONN_OK) {
				st = px_reply_shard_error(c, cls, &reply, nerr);
			} else if (px_get_doc(&reply, "cursor", &cur) &&
				   px_get_array(&cur, "firstBatch", &batch) &&
				   bson_iter_init(&it, &batch) && bson_iter_next(&it) &&
				   px_doc_of(&it, &info) && px_get_doc(&info, "options", &opts) &&
				   bson_iter_init_find(&it, &opts, "collation") &&
				   !sdb_collation_is_simple_spec(&it)) {
				st = px_error(c, 238 /* NotImplemented */,
					      "collation is not supported by stripedb in a shard key: "
					      "%s.%s has a non-simple default collation, and a sharded "
					      "collection's routing compares strings by their bytes",
					      db, coll);
			}
			bson_destroy(&reply);
		}
		bson_destroy(&cmd);
		bson_destroy(&filter);
		free(ids[i]);
	}
	free(ids);
	return st;
}

/* A view is not sharded (MongoDB 6.0's shardCollection: CommandNotSupportedOnView 166,
 * "Namespace db.coll is a view, not a collection"). Views live in the database's catalog on
 * its primary shard (create with viewOn is forwarded there), so the primary is asked
 * {listCollections: 1, filter: {name: coll}, nameOnly: false} before anything is probed or
 * registered: a view over a sharded collection would otherwise show documents on several
 * shards. Returns: 0 (not a view, or no such name), or the code answered on c (166, 70 when
 * no shard is registered, or the primary's error: HostUnreachable 6...). */
static int check_not_view(ctx *c, const char *db, const char *coll, const char *ns)
{
	ctx in_db = *c;
	bson_t cmd = BSON_INITIALIZER, filter = BSON_INITIALIZER, reply, cur, batch, info;
	bson_iter_t it;
	char nerr[256], *primary = NULL;
	int cls, st;

	in_db.db = db;
	if ((st = px_with_primary(&in_db, &primary)) != 0)
		return st;
	BSON_APPEND_INT32(&cmd, "listCollections", 1);
	BSON_APPEND_UTF8(&filter, "name", coll);
	BSON_APPEND_DOCUMENT(&cmd, "filter", &filter);
	cls = px_run_on(&in_db, primary, &cmd, NULL, &reply, nerr, sizeof nerr);
	if (cls != SHARDCONN_OK)
		st = px_reply_shard_error(c, cls, &reply, nerr);
	else if (px_get_doc(&reply, "cursor", &cur) && px_get_array(&cur, "firstBatch", &batch) &&
		 bson_iter_init(&it, &batch) && bson_iter_next(&it) && px_doc_of(&it, &info) &&
		 bson_iter_init_find(&it, &info, "type") && BSON_ITER_HOLDS_UTF8(&it) &&
		 strcmp(bson_iter_utf8(&it, NULL), "view") == 0)
		st = px_error(c, WIRE_ERR_COMMAND_NOT_SUPPORTED_ON_VIEW,
			      "Namespace %s is a view, not a collection", ns);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	bson_destroy(&filter);
	free(primary);
	return st;
}

/* MongoDB's rules for sharding a collection that already has indexes, asked of holder,
 * the shard holding the collection's documents:
 * - every unique index other than _id must have the shard key as its prefix, else
 *   uniqueness could not be kept across shards (InvalidOptions 72, "can't shard collection
 *   ... with unique index on ...");
 * - for a ranged key, some index must start with the shard key, not sparse, not partial
 *   and with the simple collation, for the chunks' range scans (InvalidOptions 72, "Please
 *   create an index that starts with the proposed shard key before sharding the
 *   collection"; MongoDB's validShardKeyIndexExists, which creates it only for an empty
 *   collection). A hashed key needs none here: shardCollection creates {k: "hashed"}
 *   on every shard itself (the embedded shard builds it over existing documents).
 * A collection gone from holder passes. Returns: 0, or the code answered on c. */
static int check_unique_indexes(ctx *c, const char *db, const char *coll, const char *ns,
				 const char *holder, const bson_t *key, bool hashed,
				 bool *have_key_index)
{
	bool key_index = false;
	ctx in_db = *c;
	bson_t cmd = BSON_INITIALIZER, reply, cur, batch;
	bson_iter_t it;
	char nerr[256];
	int cls, st = 0;

	in_db.db = db;
	BSON_APPEND_UTF8(&cmd, "listIndexes", coll);
	cls = px_run_on(&in_db, holder, &cmd, NULL, &reply, nerr, sizeof nerr);
	bson_destroy(&cmd);
	if (cls != SHARDCONN_OK) {
		bool gone = px_get_int(&reply, "code", 0) == WIRE_ERR_NAMESPACE_NOT_FOUND;
		if (!gone) /* else no collection there: no index */
			st = px_reply_shard_error(c, cls, &reply, nerr);
		bson_destroy(&reply);
		return st;
	}
	if (px_get_doc(&reply, "cursor", &cur) && px_get_array(&cur, "firstBatch", &batch) &&
	    bson_iter_init(&it, &batch))
		while (st == 0 && bson_iter_next(&it)) {
			bson_t ix, kp;
			bson_iter_t ki, si;
			bool prefixed = true;
			if (!px_doc_of(&it, &ix) || !px_get_doc(&ix, "key", &kp))
				continue;
			bson_t coll_spec;
			bson_iter_t li;
			const char *locale = "simple";
			if (px_get_doc(&ix, "collation", &coll_spec))
				locale = bson_iter_init_find(&li, &coll_spec, "locale") &&
						 BSON_ITER_HOLDS_UTF8(&li)
					 ? bson_iter_utf8(&li, NULL)
					 : NULL;
			if (key_prefixes(key, &kp) && !px_get_bool(&ix, "sparse", false) &&
			    !bson_has_field(&ix, "partialFilterExpression") && locale &&
			    strcmp(locale, "simple") == 0)
				key_index = true;
			if (!px_get_bool(&ix, "unique", false))
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
				st = px_error(c, WIRE_ERR_INVALID_OPTIONS,
					      "can't shard collection '%s' with unique index on %s and "
					      "proposed shard key %s. Uniqueness can't be maintained "
					      "unless shard key is a prefix",
					      ns, kj, sj);
				bson_free(kj);
				bson_free(sj);
			}
		}
	bson_destroy(&reply);
	*have_key_index = key_index;
	if (st == 0 && !key_index && !hashed)
		st = px_error(c, WIRE_ERR_INVALID_OPTIONS,
			      "Please create an index that starts with the proposed shard key before "
			      "sharding the collection %s (it holds documents on %s)",
			      ns, holder);
	return st;
}

/* Install on every shard that owns chunks of rc its filtering metadata (issue #17,
 * src/shard/filtering.c): {stripedbSetFiltering: ns, key, collectionVersion: the largest
 * token, chunks: [{id, min, max, token}]}, as the coordinator does at a migration's switch
 * (src/coordinator/filtering.c), so a newly sharded collection is served with ONE request
 * per shard (and orphans dropped by the shards) from the start instead of after its first
 * migration. Best effort: a shard that refuses (a newer install by a migration: StaleConfig)
 * or cannot be reached keeps what it has, and proxies use the per-chunk requests for it
 * (src/proxy/shardver.c); the outcome is logged. */
static void install_filtering(ctx *c, const route_coll *rc)
{
	ctx sub = *c;
	bson_t key = BSON_INITIALIZER;
	int64_t cver = 0;
	char **ids = NULL;
	size_t n = 0, i, k;

	if (rc->nkeys == 0 || rc->nchunks == 0)
		return;
	sub.db = "admin";
	for (k = 0; k < rc->nkeys; k++) {
		if (rc->hashed)
			BSON_APPEND_UTF8(&key, rc->keys[k], "hashed");
		else
			BSON_APPEND_INT32(&key, rc->keys[k], 1);
	}
	for (i = 0; i < rc->nchunks; i++) {
		const route_chunk *ch = &rc->chunks[i];
		bool seen = false;
		cver = ch->token > cver ? ch->token : cver;
		for (k = 0; k < n && !seen; k++)
			seen = strcmp(ids[k], ch->shard) == 0;
		if (!seen) {
			ids = sdb_realloc(ids, (n + 1) * sizeof *ids);
			ids[n++] = sdb_strdup(ch->shard);
		}
	}
	pcall *pc = px_pcalls_new(&sub, ids, n);
	for (k = 0; k < n; k++) {
		bson_t *cmd = &pc[k].cmd, arr, d;
		uint32_t m = 0;
		bson_reinit(cmd);
		BSON_APPEND_UTF8(cmd, "stripedbSetFiltering", rc->ns);
		BSON_APPEND_DOCUMENT(cmd, "key", &key);
		BSON_APPEND_INT64(cmd, "collectionVersion", cver);
		BSON_APPEND_ARRAY_BEGIN(cmd, "chunks", &arr);
		for (i = 0; i < rc->nchunks; i++) {
			const route_chunk *ch = &rc->chunks[i];
			char idx[16];
			if (strcmp(ch->shard, pc[k].shard) != 0)
				continue;
			snprintf(idx, sizeof idx, "%u", m++);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, idx, &d);
			BSON_APPEND_UTF8(&d, "id", ch->id);
			BSON_APPEND_DOCUMENT(&d, "min", ch->min);
			BSON_APPEND_DOCUMENT(&d, "max", ch->max);
			BSON_APPEND_INT64(&d, "token", ch->token);
			bson_append_document_end(&arr, &d);
		}
		bson_append_array_end(cmd, &arr);
	}
	px_fanout(c, n, px_pcall_one, pc);
	for (k = 0; k < n; k++)
		if (pc[k].cls == SHARDCONN_OK)
			sdb_info("shardCollection: filtering metadata installed", "ns=%s shard=%s "
				 "collection_version=%lld", rc->ns, pc[k].shard, (long long)cver);
		else
			sdb_warn("shardCollection: filtering metadata not installed (proxies use "
				 "per-chunk requests for this shard)", "ns=%s shard=%s code=%lld",
				 rc->ns, pc[k].shard, (long long)px_get_int(&pc[k].reply, "code", -1));
	px_pcalls_free(pc, n);
	bson_destroy(&key);
}

/* {shardCollection: "db.coll", key, unique?, numInitialChunks?, collation?}. */
static int do_shard_collection(ctx *c, const px_ddl_lock *l)
{
	const char *ns = px_first_utf8(c->cmd), *dot;
	char db[128], *holder = NULL;
	const char *coll;
	bson_t key, cmd = BSON_INITIALIZER, reply, have, shards, out;
	bool hashed, unique = px_get_bool(c->cmd, "unique", false), have_hashed = false;
	bool have_key_index = false; /* holder: an index serving the key exists */
	bool newly_sharded = false;
	int64_t nchunks = 0;
	char **ids = NULL, err[256];
	size_t n, i;
	static const int exists[] = {WIRE_ERR_NAMESPACE_EXISTS, 0};
	int code, st;

	bool found;

	if ((st = px_need_admin_db(c, "shardCollection")) != 0)
		return st;
	if (ns == NULL || (dot = strchr(ns, '.')) == NULL || dot == ns || dot[1] == '\0' ||
	    (size_t)(dot - ns) >= sizeof db) {
		return px_error(c, WIRE_ERR_INVALID_NAMESPACE, "Invalid namespace: %s",
				ns ? ns : "(not a string)");
	}
	memcpy(db, ns, (size_t)(dot - ns));
	db[dot - ns] = '\0';
	coll = dot + 1;
	if (!valid_db_name(db) || strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 ||
	    strcmp(db, "local") == 0 || strncmp(coll, "system.", 7) == 0) {
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION, "can't shard collection %s", ns);
	}
	if (!px_get_doc(c->cmd, "key", &key)) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS, "no shard key");
	}
	if ((st = check_key(c, &key, &hashed)) != 0 || (st = check_collation(c)) != 0 ||
	    (st = check_options(c)) != 0)
		return st;
	if (unique && hashed) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS, "hashed shard keys cannot be declared unique.");
	}
	if (bson_has_field(c->cmd, "numInitialChunks")) {
		if ((st = px_client_int(c, "numInitialChunks", 0, INT32_MAX, 0, &nchunks)) != 0)
			return st;
		if (!hashed && nchunks > 0) {
			return px_error(c, WIRE_ERR_INVALID_OPTIONS,
					"numInitialChunks is only supported when the shard key is hashed.");
		}
	}
	/* already sharded: the same key is fine (MongoDB answers ok), another one is not */
	if ((st = sharded_key(c, db, ns, &have, &have_hashed, &found)) != 0) {
		bson_destroy(&have);
		return st;
	}
	if (found) {
		bool same = same_key(&key, hashed, &have, have_hashed);
		if (same) {
			bson_destroy(&have);
			goto done_ok;
		}
		st = px_error(c, 23 /* AlreadyInitialized */,
			      "sharding already enabled for collection %s with a different shard key", ns);
		bson_destroy(&have);
		return st;
	}
	bson_destroy(&have);
	if ((st = check_not_view(c, db, coll, ns)) != 0)
		return st;
	if ((st = find_data_holder(c, db, coll, ns, &holder)) != 0)
		return st;
	n = px_shard_ids(c, &ids);
	for (i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
	if (n == 0)
		st = px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "no shard is registered");
	else if (nchunks > (int64_t)MAX_INITIAL_CHUNKS_PER_SHARD * (int64_t)n)
		st = px_error(c, WIRE_ERR_INVALID_OPTIONS,
			      "numInitialChunks cannot be more than 8192 * number of shards (%zu)",
			      n);
	else if (holder)
		st = check_unique_indexes(c, db, coll, ns, holder, &key, hashed, &have_key_index);
	if (st == 0)
		st = check_default_collation(c, db, coll);
	if (st == 0)
		st = ensure_database(c, db);
	if (st != 0) {
		free(holder);
		return st;
	}
	/* the shard key's index: MongoDB creates it for an empty collection (a collection with
	 * documents must have one, checked above); unique: the unique index asked for. A
	 * hashed key's index {k: "hashed"} is created in every case (over the documents the
	 * holder has: an array value refuses the build, code 16766, as MongoDB refuses to
	 * shard such a collection): it bounds migrations' chunk reads on the shards. */
	if ((unique || holder == NULL || hashed) &&
	    ((st = create_key_index(c, db, coll, &key, unique)) != 0 ||
	     (st = copy_validation(c, db, coll)) != 0)) {
		free(holder);
		return st;
	}
	BSON_APPEND_UTF8(&cmd, "shardCollection", ns);
	BSON_APPEND_DOCUMENT(&cmd, "key", &key);
	if (hashed && nchunks > 0)
		BSON_APPEND_INT64(&cmd, "numChunks", nchunks);
	if (l && l->n > 0) {
		/* committed only while this command's DDL lock is held (op version 5) */
		bson_t dl;
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "ddlLease", &dl);
		BSON_APPEND_UTF8(&dl, "name", l->names[0]);
		BSON_APPEND_UTF8(&dl, "holder", l->holder);
		bson_append_document_end(&cmd, &dl);
	}
	if (holder) {
		/* MongoDB: the documents stay on the shard that holds them; every initial chunk
		 * is placed there */
		BSON_APPEND_ARRAY_BEGIN(&cmd, "shards", &shards);
		BSON_APPEND_UTF8(&shards, "0", holder);
		bson_append_array_end(&cmd, &shards);
	}
	if ((st = px_sharding_meta_call(c, &cmd, &reply, exists, &code)) != 0) {
		bson_destroy(&cmd);
		free(holder);
		return st;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (code == WIRE_ERR_NAMESPACE_EXISTS) { /* sharded meanwhile: as the check above */
		bool hh = false, same;
		bson_t hk;

		st = sharded_key(c, db, ns, &hk, &hh, &found);
		same = found && same_key(&key, hashed, &hk, hh);
		bson_destroy(&hk);
		if (st != 0) {
			free(holder);
			return st;
		}
		if (!same) {
			free(holder);
			return px_error(c, 23, "sharding already enabled for collection %s with a "
					"different shard key", ns);
		}
	}
	free(holder);
	newly_sharded = code != WIRE_ERR_NAMESPACE_EXISTS;
done_ok:
	{
		/* this proxy routes by the new table from now on (others follow their refresh) */
		ctx sub = *c;
		route_coll *rc;
		snprintf(sub.ns, sizeof sub.ns, "%s", ns);
		rc = px_route(&sub, true, err, sizeof err);
		if (rc) {
			if (newly_sharded)
				install_filtering(c, rc);
			route_coll_unref(rc);
		}
	}
	bson_init(&out);
	BSON_APPEND_UTF8(&out, "collectionsharded", ns);
	st = px_reply(c, bson_copy(&out));
	bson_destroy(&out);
	return st;
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
static int do_list_shards(ctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply, *out, arr;
	bson_iter_t it, sh, f;
	uint32_t i = 0;

	int st;

	if ((st = px_need_admin_db(c, "listShards")) != 0)
		return st;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) != 0) {
		bson_destroy(&cmd);
		return st;
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
	return px_reply(c, out);
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

/* The checks MongoDB makes of a new shard before registering it
 * (ShardingCatalogManager::_validateHostAsShard): the seed list's first host answers hello
 * (else HostUnreachable, 6); it is not a router (msg "isdbgrid": OperationFailed, 96); a
 * replica-set connection string names the set the host is in, and a host in a set is given
 * with the set's name (else 96, with MongoDB's messages). Asked directly, for at most 5 s
 * (or the command's maxTimeMS when shorter). Returns: 0 when valid, else the code
 * answered on c. */
static int validate_new_shard(ctx *c, const char *uri_s, const char *rs)
{
	mongoc_uri_t *u = mongoc_uri_new(uri_s);
	const mongoc_host_list_t *h = u ? mongoc_uri_get_hosts(u) : NULL;
	char direct[600];
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	int st = 0;
	bool ok;
	int64_t ms = px_get_int(c->cmd, "maxTimeMS", 0);

	if (h == NULL) {
		mongoc_uri_destroy(u);
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"invalid connection string for addShard: %s", uri_s);
	}
	if (ms <= 0 || ms > 5000)
		ms = 5000;
	snprintf(direct, sizeof direct,
		 "mongodb://%s/?directConnection=true&serverSelectionTimeoutMS=%lld"
		 "&connectTimeoutMS=%lld&socketTimeoutMS=%lld",
		 h->host_and_port, (long long)ms, (long long)ms, (long long)ms);
	mongoc_uri_destroy(u);
	/* as the proxy's own shard connections: cluster credentials and internal TLS */
	mongoc_client_t *cl = auth_cluster_client_new(direct);
	if (cl == NULL)
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"invalid connection string for addShard: %s", uri_s);
	BSON_APPEND_INT32(&cmd, "hello", 1);
	shardconn_wait_begin();
	ok = mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e);
	shardconn_wait_end();
	if (!ok) {
		st = px_error(c, WIRE_ERR_HOST_UNREACHABLE, "couldn't connect to new shard %s: %s",
			      uri_s, e.message);
		bson_destroy(&reply); /* libmongoc initialises it on failure too */
		goto out;
	}
	bson_iter_t it;
	const char *set = NULL;
	if (bson_iter_init_find(&it, &reply, "setName") && BSON_ITER_HOLDS_UTF8(&it))
		set = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, &reply, "msg") && BSON_ITER_HOLDS_UTF8(&it) &&
	    strcmp(bson_iter_utf8(&it, NULL), "isdbgrid") == 0)
		st = px_error(c, WIRE_ERR_OPERATION_FAILED, "can't add a mongos process as a shard");
	else if (rs && set == NULL)
		st = px_error(c, WIRE_ERR_OPERATION_FAILED,
			      "host did not return a set name; is the replica set still "
			      "initializing? %s is not a member of replica set %s",
			      uri_s, rs);
	else if (rs && strcmp(rs, set) != 0)
		st = px_error(c, WIRE_ERR_OPERATION_FAILED,
			      "the provided connection string (%s) does not match the actual set "
			      "name %s",
			      uri_s, set);
	else if (!rs && set)
		st = px_error(c, WIRE_ERR_OPERATION_FAILED,
			      "host is part of set %s; use replica set url format "
			      "<setname>/<server1>,<server2>, ...",
			      set);
	bson_destroy(&reply);
out:
	bson_destroy(&cmd);
	mongoc_client_destroy(cl);
	return st;
}

/* Whether metadata lists shard `name` at exactly `uri` (a repeated addShard): *same.
 * Returns: 0, or the code answered on c (metadata unreachable). */
static int same_shard_registered(ctx *c, const char *name, const char *uri, bool *same_out)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	bool same = false;
	int st;

	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, NULL, NULL)) == 0) {
		if (bson_iter_init_find(&it, &reply, "shards") && bson_iter_recurse(&it, &arr))
			while (!same && bson_iter_next(&arr)) {
				bson_iter_t f;
				const char *id = NULL, *u = NULL;
				if (!bson_iter_recurse(&arr, &f))
					continue;
				while (bson_iter_next(&f)) {
					if (BSON_ITER_HOLDS_UTF8(&f) && strcmp(bson_iter_key(&f), "id") == 0)
						id = bson_iter_utf8(&f, NULL);
					else if (BSON_ITER_HOLDS_UTF8(&f) &&
						 strcmp(bson_iter_key(&f), "uri") == 0)
						u = bson_iter_utf8(&f, NULL);
				}
				same = id && u && strcmp(id, name) == 0 && strcmp(u, uri) == 0;
			}
		bson_destroy(&reply);
	}
	bson_destroy(&cmd);
	*same_out = same;
	return st;
}

/* Issue #20: raise a shard just added above the cluster time this proxy has seen, so its
 * first writes do not sort below a change stream's merged position (its own clock may be
 * behind the other shards'): an appendOplogNote sent with the proxy's $clusterTime
 * (shardconn_command attaches it), which the shard applies with that time as the ts
 * floor (no maxClusterTime needed). Best effort: the shard is
 * registered already; a failure is logged (the writes proxies send it carry their
 * cluster time anyway). */
static void raise_new_shard_clock(ctx *c, const char *name)
{
	bson_t cmd = BSON_INITIALIZER, data, reply;
	uint32_t server_id = 0;
	char err[256] = "";
	int fate;

	if (shardconn_cluster_time(c->p->sc) == 0)
		return;
	BSON_APPEND_INT32(&cmd, "appendOplogNote", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "data", &data);
	BSON_APPEND_UTF8(&data, "msg", "stripedb addShard: cluster time");
	bson_append_document_end(&cmd, &data);
	int rc = shardconn_command(c->p->sc, name, "admin", &cmd, &server_id, &reply, err,
				   sizeof err, &fate);
	if (rc != SHARDCONN_OK) {
		char *s = bson_as_relaxed_extended_json(&reply, NULL);
		sdb_warn("addShard: could not raise the new shard's cluster time", "shard=%s "
			 "err=\"%s\" reply=%s", name, err, s ? s : "");
		bson_free(s);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* {addShard: "rs/h:p,..." | "h:p" | "mongodb://...", name?} → {shardAdded: name}. The name
 * defaults to the replica-set name, else shardNNNN (MongoDB's rules). The host is checked
 * first (validate_new_shard): nothing is registered for a host that does not answer. */
static int do_add_shard(ctx *c)
{
	const char *arg = px_first_utf8(c->cmd);
	char *uri, *rs = NULL, gen[32];
	const char *name = NULL;
	bson_iter_t it;
	bson_t cmd = BSON_INITIALIZER, reply, *out;
	char **ids = NULL;
	size_t n, i;
	int st;

	if ((st = px_need_admin_db(c, "addShard")) != 0)
		return st;
	if (arg == NULL || arg[0] == '\0') {
		return px_error(c, WIRE_ERR_BAD_VALUE, "addShard needs a connection string");
	}
	if (bson_iter_init_find(&it, c->cmd, "name")) {
		if (!BSON_ITER_HOLDS_UTF8(&it) || bson_iter_utf8(&it, NULL)[0] == '\0') {
			return px_error(c, WIRE_ERR_BAD_VALUE, "shard name must be a non-empty string");
		}
		name = bson_iter_utf8(&it, NULL);
	}
	if (bson_has_field(c->cmd, "maxSize")) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS, "maxSize is not supported");
	}
	uri = shard_uri(arg, &rs);
	if (uri == NULL) {
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE, "invalid connection string for addShard: %s",
				arg);
	}
	if ((st = validate_new_shard(c, uri, rs)) != 0) {
		free(uri);
		free(rs);
		return st;
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
	static const int taken[] = {11000, 0};
	int code = 0;
	if ((st = px_sharding_meta_call(c, &cmd, &reply, taken, &code)) == 0) {
		char err[256];
		bool same = true;
		bson_destroy(&reply);
		if (code == 11000 && (st = same_shard_registered(c, name, uri, &same)) != 0)
			goto done;
		if (!same) {
			/* the name is taken by another shard (an identical repeat is ok, as on a
			 * mongos) */
			st = px_error(c, 11000, "shard name %s is already taken by another shard",
				      name);
			goto done;
		}
		if (proxy_load_shards(c->p, err, sizeof err) != 0)
			sdb_warn("shard list reload failed", "err=\"%s\"", err);
		else
			raise_new_shard_clock(c, name);
		out = bson_new();
		BSON_APPEND_UTF8(out, "shardAdded", name);
		st = px_reply(c, out);
	}
done:
	bson_destroy(&cmd);
	free(uri);
	free(rs);
	return st;
}

/* ---------- the balancer (there is none) ---------- */

#define NO_BALANCER                                                                         \
	"stripedb has no balancer: chunks move only when an operator moves them (stripedb "   \
	"ctl shard drain, migrations)"

/* balancerStatus: the truth, in MongoDB's shape (mode "off", never in a round). */
static int do_balancer_status(ctx *c)
{
	bson_t *out;
	int st;

	if ((st = px_need_admin_db(c, "balancerStatus")) != 0)
		return st;
	out = bson_new();
	BSON_APPEND_UTF8(out, "mode", "off");
	BSON_APPEND_BOOL(out, "inBalancerRound", false);
	BSON_APPEND_INT64(out, "numBalancerRounds", 0);
	BSON_APPEND_UTF8(out, "note", NO_BALANCER);
	return px_reply(c, out);
}

/* balancerStop: the balancer is off already (ok, with the note). */
static int do_balancer_stop(ctx *c)
{
	bson_t *out;
	int st;

	if ((st = px_need_admin_db(c, "balancerStop")) != 0)
		return st;
	out = bson_new();
	BSON_APPEND_UTF8(out, "note", NO_BALANCER);
	return px_reply(c, out);
}

/* balancerStart: refused, there is nothing to start. */
static int do_balancer_start(ctx *c)
{
	int st;

	if ((st = px_need_admin_db(c, "balancerStart")) != 0)
		return st;
	return px_error(c, 115 /* CommandNotSupported */, "balancerStart: %s", NO_BALANCER);
}

static int do_refine(ctx *c)
{
	return px_error(c, 115 /* CommandNotSupported */,
			"refineCollectionShardKey is not supported by stripedb: a collection's shard "
			"key is fixed when it is sharded");
}

static int do_reshard(ctx *c)
{
	return px_error(c, 115 /* CommandNotSupported */,
			"reshardCollection is not supported by stripedb: a collection's shard key is "
			"fixed when it is sharded");
}

int px_do_enable_sharding(ctx *c)
{
	return do_enable_sharding(c);
}

int px_do_shard_collection(ctx *c)
{
	const char *ns = px_first_utf8(c->cmd);
	px_ddl_lock l;
	int st;

	if ((st = px_need_admin_db(c, "shardCollection")) != 0)
		return st;
	/* an invalid namespace is refused by do_shard_collection, without a lock */
	if (ns == NULL || strchr(ns, '.') == NULL || strlen(ns) >= sizeof l.names[0] - 8)
		return do_shard_collection(c, NULL);
	/* serialised with renameCollection of the same name (ddllock.h) */
	if ((st = px_ddl_lock_acquire(c, &ns, 1, &l)) != 0)
		return st;
	st = do_shard_collection(c, &l);
	px_ddl_lock_release(c, &l);
	return st;
}

int px_do_list_shards(ctx *c)
{
	return do_list_shards(c);
}

int px_do_add_shard(ctx *c)
{
	return do_add_shard(c);
}

int px_do_balancer(ctx *c)
{
	const char *name = wire_req_name(c->req);

	if (strcmp(name, "balancerStatus") == 0)
		return do_balancer_status(c);
	if (strcmp(name, "balancerStop") == 0)
		return do_balancer_stop(c);
	return do_balancer_start(c);
}

int px_do_refused_sharding(ctx *c)
{
	if (strcmp(wire_req_name(c->req), "reshardCollection") == 0)
		return do_reshard(c);
	if (strcasecmp(wire_req_name(c->req), "movePrimary") == 0)
		return px_error(c, 115 /* CommandNotSupported */,
				"movePrimary is not supported by stripedb: a database's primary "
				"shard is chosen when it is created (enableSharding primaryShard, "
				"`stripedb ctl db create --primary`)");
	return do_refine(c);
}

/* drop through the proxy (issue #18): the collection's sharding metadata is dropped first
 * (metadata dropCollection; "not sharded", 26, is fine), this proxy's routing reloaded, then
 * the collection is dropped on every shard (px_do_broadcast). In this order a write racing
 * the drop lands on the primary shard and is dropped with the rest; a failed broadcast is
 * repaired by sending drop again (the shards' part is idempotent). */
int px_do_drop_database(ctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int fine[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};
	int st;

	/* metadata's record of the database, its sharded collections and their chunks go
	 * first (as px_do_drop's dropCollection): a reviewer found them left behind, so
	 * sharding the collection again with another key was 23 and the name stayed taken */
	BSON_APPEND_UTF8(&cmd, "dropDatabase", c->db);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, fine, NULL)) != 0) {
		bson_destroy(&cmd);
		return st;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	px_reload_db_primaries(c);
	return px_do_broadcast(c);
}

int px_do_drop(ctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	static const int fine[] = {WIRE_ERR_NAMESPACE_NOT_FOUND, 0};
	char err[256];
	route_coll *rc;
	int st;

	BSON_APPEND_UTF8(&cmd, "dropCollection", c->ns);
	if ((st = px_sharding_meta_call(c, &cmd, &reply, fine, NULL)) != 0) {
		bson_destroy(&cmd);
		return st;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	rc = px_route(c, true, err, sizeof err);
	if (rc)
		route_coll_unref(rc);
	return px_do_broadcast(c);
}
