/* The metadata state machine's routing ops: shards, databases, sharded collections and
 * their chunks (split, merge, owner), each bumping the routing version. Command reference
 * in src/metadata/README.md; internals in fsm_int.h. */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "raft/migstate.h"
#include "raft/fsm_peers.h"
#include "raft/routing.h"
#include "raft/fsm_int.h"

int fsm_op_add_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id"), *uri = fsm_arg_str(&c->args, "uri");
	if (!id || !*id || !uri || !*uri)
		return fsm_lerr(res, E_BAD_VALUE, "addShard needs string fields id and uri");
	int e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", id);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_DUPLICATE, "shard %s already exists", id);
	if (fsm_x(f, "INSERT INTO shards(id, uri, state, created_ms) VALUES(?, ?, 'active', ?)", "tti",
	      id, uri, c->ts))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "shardAdded", id);
	return 0;
}

int fsm_op_remove_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id");
	int64_t n = 0;
	if (!id)
		return fsm_lerr(res, E_BAD_VALUE, "removeShard needs a string field id");
	int e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", id);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", id);
	if (fsm_q_int(f, &n, "SELECT count(*) FROM chunks WHERE shard = ?", "t", id) < 0)
		return SDB_EIO;
	if (n > 0)
		return fsm_lerr(res, E_ILLEGAL, "shard %s still owns %lld chunks", id, (long long)n);
	/* databases whose primary it was move to the lowest remaining shard id (the caller,
	 * the proxy's removeShard, first checks that it holds none of their unsharded
	 * collections) */
	if (fsm_x(f, "DELETE FROM shards WHERE id = ?", "t", id) ||
	    fsm_x(f, "UPDATE dbs SET primary_shard = (SELECT min(id) FROM shards)"
		     " WHERE primary_shard = ?", "t", id))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "shardRemoved", id);
	return 0;
}

int fsm_op_set_shard_draining(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *id = fsm_arg_str(&c->args, "id");
	int64_t opv = 1;
	bson_iter_t it;
	bool draining = true;
	if (!fsm_arg_int(&c->args, "opVersion", &opv) || opv < MIGSTATE_OP_VERSION_EXCLUSIVE)
		return fsm_lerr(res, E_ILLEGAL, "setShardDraining needs cluster op version %d "
				"(setOpVersion)", MIGSTATE_OP_VERSION_EXCLUSIVE);
	if (!id)
		return fsm_lerr(res, E_BAD_VALUE, "setShardDraining needs a string field id");
	if (bson_iter_init_find(&it, &c->args, "draining"))
		draining = bson_iter_as_bool(&it);
	int e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", id);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", id);
	if (fsm_x(f, "UPDATE shards SET state = ? WHERE id = ?", "tt",
		  draining ? "draining" : "active", id))
		return SDB_EIO;
	BSON_APPEND_UTF8(res, "shard", id);
	BSON_APPEND_BOOL(res, "draining", draining);
	return 0;
}

int fsm_dbs_schema(sqlite3 *db)
{
	sqlite3_stmt *st;
	int has = 0;
	if (sqlite3_prepare_v2(db, "SELECT 1 FROM pragma_table_info('dbs')"
				   " WHERE name = 'primary_shard'", -1, &st, NULL) != SQLITE_OK)
		return SDB_EIO;
	has = sqlite3_step(st) == SQLITE_ROW;
	sqlite3_finalize(st);
	if (has)
		return 0;
	/* rows of earlier versions get NULL: they follow the lowest shard id, as before */
	if (sqlite3_exec(db, "ALTER TABLE dbs ADD COLUMN primary_shard TEXT", NULL, NULL, NULL) !=
	    SQLITE_OK) {
		sdb_error("fsm: dbs schema upgrade failed", "err=\"%s\"", sqlite3_errmsg(db));
		return SDB_EIO;
	}
	sdb_info("fsm: schema upgraded", "table=dbs column=primary_shard");
	return 0;
}

int fsm_op_create_database(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name"), *tenant = fsm_arg_str(&c->args, "tenant");
	const char *primary = fsm_arg_str(&c->args, "primary");
	int rc;
	if (!name || !*name || strchr(name, '.'))
		return fsm_lerr(res, E_BAD_VALUE, "createDatabase needs a name without dots");
	if (bson_has_field(&c->args, "primary") && (primary == NULL || !*primary))
		return fsm_lerr(res, E_BAD_VALUE, "createDatabase: primary must be a shard id string");
	if (tenant) {
		int e = fsm_exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
		if (e < 0)
			return e;
		if (!e)
			return fsm_lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	}
	if (primary) {
		int e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", primary);
		if (e < 0)
			return e;
		if (!e)
			return fsm_lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", primary);
	}
	int e = fsm_exists(f, "SELECT 1 FROM dbs WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_NS_EXISTS, "database %s already exists", name);
	/* without primary the row records none (NULL): the database follows the lowest shard
	 * id, as every database did before primaries were recorded. Choosing a default here
	 * would not be deterministic on a member replaying entries of an earlier version. */
	rc = fsm_x(f, "INSERT INTO dbs(name, tenant, created_ms, primary_shard) VALUES(?, ?, ?, ?)",
		   "ttit", name, tenant, c->ts, primary);
	if (rc == 0 && primary)
		BSON_APPEND_UTF8(res, "primary", primary);
	return rc ? SDB_EIO : 0;
}

int fsm_op_drop_database(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name");
	int64_t n = 0, rv;
	if (!name)
		return fsm_lerr(res, E_BAD_VALUE, "dropDatabase needs a string field name");
	int e = fsm_exists(f, "SELECT 1 FROM dbs WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NS_NOT_FOUND, "database %s not found", name);
	if (fsm_q_int(f, &n, "SELECT count(*) FROM colls WHERE db = ?", "t", name) < 0)
		return SDB_EIO;
	/* the routing change (and its tombstones, issue #26) before the rows go */
	if (n > 0 && (fsm_bump_routing(f, &rv) || fsm_routing_remove_db(f->db, rv, name)))
		return SDB_EIO;
	if (fsm_x(f, "DELETE FROM chunks WHERE ns IN (SELECT ns FROM colls WHERE db = ?)", "t", name) ||
	    fsm_x(f, "DELETE FROM colls WHERE db = ?", "t", name) ||
	    fsm_x(f, "DELETE FROM dbs WHERE name = ?", "t", name))
		return SDB_EIO;
	if (n > 0)
		BSON_APPEND_INT64(res, "routingVersion", rv);
	return 0;
}

/* Build a key document {f1: v, f2: v, ...} with the same value for every field of
 * keypat (used for MinKey/MaxKey bounds). */
static bson_t *key_fill(const bson_t *keypat, bson_type_t t)
{
	bson_iter_t it;
	bson_t *out = bson_new();
	if (!bson_iter_init(&it, keypat))
		return out;
	while (bson_iter_next(&it)) {
		if (t == BSON_TYPE_MINKEY)
			bson_append_minkey(out, bson_iter_key(&it), -1);
		else
			bson_append_maxkey(out, bson_iter_key(&it), -1);
	}
	return out;
}

/* Length of a heap document, read from its data: libbson declares bson_t 128-byte
 * aligned but its allocator does not align that much, so we never touch members of a
 * heap bson_t (UBSan's alignment check). */
int fsm_doc_len(const bson_t *b)
{
	uint32_t len;
	memcpy(&len, bson_get_data(b), 4);
	return (int)BSON_UINT32_FROM_LE(len);
}

static int insert_chunk(sdb_fsm *f, int64_t id, const char *ns, const bson_t *min,
			const bson_t *max, const char *shard, int64_t token, int64_t version)
{
	return fsm_x(f,
		 "INSERT INTO chunks(id, ns, min, max, shard, token, version) VALUES(?, ?, ?, ?, ?, ?, ?)",
		 "itbbtii", id, ns, bson_get_data(min), fsm_doc_len(min), bson_get_data(max),
		 fsm_doc_len(max), shard, token, version);
}

/* The k-th (1..n-1) inner bound of an n-chunk split of the int64 hash space: with half
 * (INT64_MAX / n, op version 3) MongoDB's symmetric point (2k - n) * half, else the
 * earlier INT64_MIN + k * step (step = UINT64_MAX / n). */
/* Does a split point hold an array in one of its fields? MongoDB refuses such a shard-key
 * value ("Shard key cannot contain an array"; no document's key is one, and routing
 * refuses it), so a chunk bound at one would only order documents no proxy routes there.
 * Checked from MIGSTATE_OP_VERSION_KEY_ORDER on. Returns: true or false. */
static bool key_has_array(const bson_t *k)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, k))
		return false;
	while (bson_iter_next(&it))
		if (BSON_ITER_HOLDS_ARRAY(&it))
			return true;
	return false;
}

static int64_t hashed_point(int64_t k, int64_t n, uint64_t step, int64_t half)
{
	if (half)
		return (2 * k - n) * half;
	return (int64_t)((uint64_t)INT64_MIN + (uint64_t)k * step);
}

int fsm_op_shard_collection(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *ns = fsm_arg_str(&c->args, "ns");
	bson_t key, split, shards_arr;
	bson_iter_t it;
	int hashed = 0, nfields = 0, have_split, have_shards, rc = 0;
	int64_t nchunks = 0, rv, n, opv = 1;
	char dbname[256];
	char **shards = NULL;
	size_t nshards = 0, i;
	bson_t **bounds = NULL; /* bson_new()'d: bson_t needs libbson's alignment */
	size_t nbounds = 0;

	if (!ns || !strchr(ns, '.') || strchr(ns, '.') == ns || strlen(ns) >= sizeof dbname)
		return fsm_lerr(res, E_BAD_VALUE, "shardCollection needs ns of the form db.coll");
	if (!fsm_arg_doc(&c->args, "key", &key, 0))
		return fsm_lerr(res, E_BAD_VALUE, "shardCollection needs a key document");
	bson_iter_init(&it, &key);
	while (bson_iter_next(&it)) {
		nfields++;
		if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0)
			hashed = 1;
		else if (!BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) != 1)
			return fsm_lerr(res, E_BAD_VALUE, "shard key field %s must be 1 or \"hashed\"",
				    bson_iter_key(&it));
	}
	if (nfields == 0)
		return fsm_lerr(res, E_BAD_VALUE, "shard key must have at least one field");
	/* the leader's stamp (src/metadata/role.c); entries without it apply as before */
	fsm_arg_int(&c->args, "opVersion", &opv);
	if (opv >= MIGSTATE_OP_VERSION_DDL_LEASE) {
		/* the proxy's DDL lock (src/proxy/ddllock.h): committed only while held */
		bson_t dl;
		if (fsm_arg_doc(&c->args, "ddlLease", &dl, 0)) {
			const char *ln = fsm_arg_str(&dl, "name"), *lh = fsm_arg_str(&dl, "holder");
			int held;
			if (!ln || !lh)
				return fsm_lerr(res, E_BAD_VALUE, "ddlLease needs name and holder");
			if ((held = fsm_lease_held(f, ln, lh, c->ts)) < 0)
				return held;
			if (!held)
				return fsm_lerr(res, E_LOCK_BUSY,
					    "the DDL lock %s is no longer held by %s (it expired); "
					    "nothing was sharded", ln, lh);
		}
	}
	if (hashed && nfields != 1)
		return fsm_lerr(res, E_BAD_VALUE, "a hashed shard key has exactly one field");
	memcpy(dbname, ns, (size_t)(strchr(ns, '.') - ns));
	dbname[strchr(ns, '.') - ns] = '\0';
	int e = fsm_exists(f, "SELECT 1 FROM dbs WHERE name = ?", dbname);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NS_NOT_FOUND, "database %s not found (createDatabase first)",
			    dbname);
	e = fsm_exists(f, "SELECT 1 FROM colls WHERE ns = ?", ns);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_NS_EXISTS, "collection %s is already sharded", ns);

	/* Placement: the given shards, or every shard in id order. */
	have_shards = fsm_arg_doc(&c->args, "shards", &shards_arr, 1);
	if (have_shards) {
		bson_iter_init(&it, &shards_arr);
		while (bson_iter_next(&it)) {
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				rc = fsm_lerr(res, E_BAD_VALUE, "shards must be an array of shard ids");
				goto out;
			}
			const char *sid = bson_iter_utf8(&it, NULL);
			e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", sid);
			if (e < 0) {
				rc = e;
				goto out;
			}
			if (!e) {
				rc = fsm_lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", sid);
				goto out;
			}
			shards = sdb_realloc(shards, (nshards + 1) * sizeof *shards);
			shards[nshards++] = sdb_strdup(sid);
		}
	} else {
		/* op version 3: never on a draining shard (removeShard), as MongoDB places
		 * initial chunks on non-draining shards only */
		sqlite3_stmt *st = fsm_q(f, opv >= MIGSTATE_OP_VERSION_EXCLUSIVE
					     ? "SELECT id FROM shards WHERE state != 'draining'"
					       " ORDER BY id"
					     : "SELECT id FROM shards ORDER BY id", NULL);
		if (!st)
			return SDB_EIO;
		while (sqlite3_step(st) == SQLITE_ROW) {
			shards = sdb_realloc(shards, (nshards + 1) * sizeof *shards);
			shards[nshards++] = sdb_strdup((const char *)sqlite3_column_text(st, 0));
		}
		sqlite3_finalize(st);
	}
	if (nshards == 0) {
		int64_t draining = 0;
		if (fsm_q_int(f, &draining, "SELECT count(*) FROM shards WHERE state = 'draining'",
			      NULL) < 0) {
			rc = SDB_EIO;
			goto out;
		}
		rc = draining ? fsm_lerr(res, E_SHARD_NOT_FOUND,
					 "no shard to place %s on: every shard (%lld) is draining "
					 "(removeShard); add a shard first", ns, (long long)draining)
			      : fsm_lerr(res, E_SHARD_NOT_FOUND, "no shards to place %s on", ns);
		goto out;
	}

	/* Boundaries: MinKey, split points..., MaxKey. */
	have_split = fsm_arg_doc(&c->args, "splitPoints", &split, 1);
	if (!fsm_arg_int(&c->args, "numChunks", &nchunks))
		nchunks = 0;
	if (have_split && nchunks) {
		rc = fsm_lerr(res, E_BAD_VALUE, "give splitPoints or numChunks, not both");
		goto out;
	}
	/* No fixed cap here (issue #26): the leader refuses more than
	 * --max-chunks-per-command before proposing (src/metadata/role.c); apply only
	 * bounds the value to what the id space can hold. */
	if (nchunks < 0 || nchunks > INT32_MAX) {
		rc = fsm_lerr(res, E_BAD_VALUE, "numChunks must be 1..%d", INT32_MAX);
		goto out;
	}
	if (nchunks > 1 && !hashed) {
		rc = fsm_lerr(res, E_BAD_VALUE, "numChunks needs a hashed key; use splitPoints");
		goto out;
	}
	if (!have_split && nchunks == 0)
		nchunks = hashed ? (int64_t)nshards : 1;
	if (have_split) {
		/* Explicit boundaries: MinKey, split points..., MaxKey (views into args). */
		size_t cap = 2;
		bson_iter_init(&it, &split);
		while (bson_iter_next(&it))
			cap++;
		bounds = sdb_calloc(cap, sizeof *bounds);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MINKEY);
		bson_iter_init(&it, &split);
		while (bson_iter_next(&it)) {
			bson_t sp;
			const uint8_t *d;
			uint32_t l;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				rc = fsm_lerr(res, E_BAD_VALUE, "splitPoints must be key documents");
				goto out;
			}
			bson_iter_document(&it, &l, &d);
			if (!bson_init_static(&sp, d, l) || !fsm_key_matches(&key, &sp)) {
				rc = fsm_lerr(res, E_BAD_VALUE, "split point does not match the shard key");
				goto out;
			}
			if (opv >= MIGSTATE_OP_VERSION_KEY_ORDER && key_has_array(&sp)) {
				rc = fsm_lerr(res, E_BAD_VALUE,
					      "a split point cannot contain an array");
				goto out;
			}
			/* op version 4: MongoDB's order (raft/migstate.h); before it, the
			 * earlier one, so that an old log replays as it applied */
			if (fsm_cmp_key(bounds[nbounds - 1], &sp, opv) >= 0) {
				rc = fsm_lerr(res, E_BAD_VALUE, "splitPoints must be strictly increasing");
				goto out;
			}
			bounds[nbounds++] = bson_copy(&sp);
		}
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MAXKEY);
		nchunks = (int64_t)nbounds - 1;
	} else {
		/* MinKey and MaxKey only: the inner bounds of an even split of the int64
		 * hash space are generated while inserting (no per-chunk memory). */
		bounds = sdb_calloc(2, sizeof *bounds);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MINKEY);
		bounds[nbounds++] = key_fill(&key, BSON_TYPE_MAXKEY);
	}

	if (fsm_x(f, "INSERT INTO colls(ns, db, key, hashed, created_ms) VALUES(?, ?, ?, ?, ?)", "ttbii",
	      ns, dbname, bson_get_data(&key), (int)key.len, (int64_t)hashed, c->ts) ||
	    fsm_bump_routing(f, &rv)) {
		rc = SDB_EIO;
		goto out;
	}
	{
		/* One prepared statement and one id reservation for all chunks: a million
		 * chunks insert in seconds, not minutes. */
		int64_t first_id;
		const char *fld = NULL;
		uint64_t step = 0;
		int64_t half = 0;
		sqlite3_stmt *ins;
		if (fsm_meta_get(f, "next_chunk_id", &first_id) != 0 ||
		    fsm_meta_set(f, "next_chunk_id", first_id + nchunks) != 0) {
			rc = SDB_EIO;
			goto out;
		}
		if (!have_split && nchunks > 1) {
			bson_iter_init(&it, &key);
			bson_iter_next(&it);
			fld = bson_iter_key(&it);
			step = UINT64_MAX / (uint64_t)nchunks;
			/* op version 3: MongoDB's split points (initial_split_policy.cpp
			 * calculateHashedSplitPoints), symmetric around 0: interval I =
			 * (INT64_MAX / n) * 2, points 0, +-I, +-2I... for an even n and +-I/2,
			 * +-3I/2... for an odd n, i.e. the k-th (1..n-1) is (2k - n) * (I / 2),
			 * which never overflows (|2k - n| <= n - 2). Older entries keep the
			 * earlier even split from INT64_MIN, so a log replays as it was. */
			if (opv >= MIGSTATE_OP_VERSION_EXCLUSIVE)
				half = INT64_MAX / nchunks;
		}
		ins = fsm_q(f, "INSERT INTO chunks(id, ns, min, max, shard, token, version)"
			   " VALUES(?, ?, ?, ?, ?, 1, ?)", NULL);
		if (!ins) {
			rc = SDB_EIO;
			goto out;
		}
		for (int64_t k = 0; k < nchunks; k++) {
			bson_t lo, hi;
			const bson_t *plo, *phi;
			int step_rc;
			bson_init(&lo);
			bson_init(&hi);
			if (have_split) {
				plo = bounds[k];
				phi = bounds[k + 1];
			} else {
				if (k == 0)
					plo = bounds[0];
				else {
					BSON_APPEND_INT64(&lo, fld, hashed_point(k, nchunks, step, half));
					plo = &lo;
				}
				if (k + 1 == nchunks)
					phi = bounds[1];
				else {
					BSON_APPEND_INT64(&hi, fld,
							  hashed_point(k + 1, nchunks, step, half));
					phi = &hi;
				}
			}
			sqlite3_reset(ins);
			sqlite3_bind_int64(ins, 1, first_id + k + 1);
			sqlite3_bind_text(ins, 2, ns, -1, SQLITE_STATIC);
			sqlite3_bind_blob(ins, 3, bson_get_data(plo), fsm_doc_len(plo), SQLITE_TRANSIENT);
			sqlite3_bind_blob(ins, 4, bson_get_data(phi), fsm_doc_len(phi), SQLITE_TRANSIENT);
			sqlite3_bind_text(ins, 5, shards[(size_t)k % nshards], -1, SQLITE_STATIC);
			sqlite3_bind_int64(ins, 6, rv);
			step_rc = sqlite3_step(ins);
			bson_destroy(&lo);
			bson_destroy(&hi);
			if (step_rc != SQLITE_DONE) {
				sdb_error("fsm: insert chunk failed", "err=\"%s\"", sqlite3_errmsg(f->db));
				sqlite3_finalize(ins);
				rc = SDB_EIO;
				goto out;
			}
		}
		sqlite3_finalize(ins);
	}
	n = nchunks;
	BSON_APPEND_UTF8(res, "collectionSharded", ns);
	BSON_APPEND_INT64(res, "chunks", n);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	for (i = 0; i < nbounds; i++)
		bson_destroy(bounds[i]);
	free(bounds);
	for (i = 0; i < nshards; i++)
		free(shards[i]);
	free(shards);
	return rc;
}

int fsm_op_drop_collection(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *ns = fsm_arg_str(&c->args, "ns");
	int64_t rv;
	if (!ns)
		return fsm_lerr(res, E_BAD_VALUE, "dropCollection needs a string field ns");
	int e = fsm_exists(f, "SELECT 1 FROM colls WHERE ns = ?", ns);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NS_NOT_FOUND, "collection %s not found", ns);
	if (fsm_bump_routing(f, &rv) || fsm_routing_remove_ns(f->db, rv, ns) ||
	    fsm_x(f, "DELETE FROM chunks WHERE ns = ?", "t", ns) ||
	    fsm_x(f, "DELETE FROM colls WHERE ns = ?", "t", ns))
		return SDB_EIO;
	BSON_APPEND_INT64(res, "routingVersion", rv);
	return 0;
}

typedef struct chunk_row {
	int64_t id;
	char ns[512];
	char shard[256];
	bson_t *min, *max; /* owned, bson_new()'d */
	int64_t token;
} chunk_row;

/* Load one chunk; 1 found, 0 missing, SDB_EIO. Found rows must be freed with
 * chunk_free. */
static int chunk_load(sdb_fsm *f, int64_t id, chunk_row *out)
{
	sqlite3_stmt *st = fsm_q(f, "SELECT ns, min, max, shard, token FROM chunks WHERE id = ?", "i", id);
	int rc;
	if (!st)
		return SDB_EIO;
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		return rc == SQLITE_DONE ? 0 : SDB_EIO;
	}
	out->id = id;
	snprintf(out->ns, sizeof out->ns, "%s", (const char *)sqlite3_column_text(st, 0));
	snprintf(out->shard, sizeof out->shard, "%s", (const char *)sqlite3_column_text(st, 3));
	out->token = sqlite3_column_int64(st, 4);
	out->min = bson_new_from_data(sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1));
	out->max = bson_new_from_data(sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2));
	if (!out->min)
		out->min = bson_new();
	if (!out->max)
		out->max = bson_new();
	sqlite3_finalize(st);
	return 1;
}

static void chunk_free(chunk_row *c)
{
	bson_destroy(c->min);
	bson_destroy(c->max);
}

/* Op version 4: a chunk that a non-terminal migration holds is not split or merged (the
 * migration copies and deletes the range it read at its start, and routes only the chunk
 * id it holds: a split during it would leave the other half routed to a source whose
 * documents the cleanup deletes). Returns: 0, LOGICAL (ConflictingOperationInProgress in
 * res), SDB_EIO. */
static int refuse_migrating(sdb_fsm *f, const chunk_row *ch, bson_t *res)
{
	char busy[256];
	int e = fsm_active_migration_of_chunk(f, ch->ns, ch->id, busy, sizeof busy);
	if (e <= 0)
		return e;
	fsm_lerr(res, E_CONFLICTING_OPERATION,
		 "chunk %lld of %s is being migrated by %s; split or merge it once that "
		 "migration has ended",
		 (long long)ch->id, ch->ns, busy);
	BSON_APPEND_UTF8(res, "activeMigration", busy);
	return LOGICAL;
}

int fsm_op_split_chunk(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id, nid, rv, opv = 1;
	bson_t at, key;
	chunk_row ch;
	int rc = 0;
	if (!fsm_arg_int(&c->args, "id", &id) || !fsm_arg_doc(&c->args, "at", &at, 0))
		return fsm_lerr(res, E_BAD_VALUE, "splitChunk needs id and an at key document");
	/* the leader's stamp (src/metadata/role.c); entries without it apply as before */
	fsm_arg_int(&c->args, "opVersion", &opv);
	int e = chunk_load(f, id, &ch);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NO_SUCH_KEY, "chunk %lld not found", (long long)id);
	/* The split point must match the collection's key and lie strictly inside. */
	sqlite3_stmt *st = fsm_q(f, "SELECT key FROM colls WHERE ns = ?", "t", ch.ns);
	if (!st) {
		rc = SDB_EIO;
		goto out;
	}
	if (sqlite3_step(st) != SQLITE_ROW ||
	    !bson_init_static(&key, sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0)) ||
	    !fsm_key_matches(&key, &at)) {
		sqlite3_finalize(st);
		rc = fsm_lerr(res, E_BAD_VALUE, "split point does not match the shard key of %s", ch.ns);
		goto out;
	}
	sqlite3_finalize(st);
	if (opv >= MIGSTATE_OP_VERSION_KEY_ORDER && key_has_array(&at)) {
		rc = fsm_lerr(res, E_BAD_VALUE, "a split point cannot contain an array");
		goto out;
	}
	if (opv >= MIGSTATE_OP_VERSION_KEY_ORDER && (rc = refuse_migrating(f, &ch, res)) != 0)
		goto out;
	/* strictly inside by the entry's order: from op version 4 MongoDB's, the one the
	 * proxies route by, so a Decimal128 or NaN split point lands where routing expects
	 * it (the earlier order read a Decimal128 as 0: a split could invert the chunks) */
	if (fsm_cmp_key(ch.min, &at, opv) >= 0 || fsm_cmp_key(&at, ch.max, opv) >= 0) {
		rc = fsm_lerr(res, E_BAD_VALUE, "split point is not inside chunk %lld", (long long)id);
		goto out;
	}
	if (fsm_bump_routing(f, &rv) || fsm_next_id(f, "next_chunk_id", &nid) ||
	    fsm_x(f, "UPDATE chunks SET max = ?, version = ? WHERE id = ?", "bii", bson_get_data(&at),
	      (int)at.len, rv, id) ||
	    insert_chunk(f, nid, ch.ns, &at, ch.max, ch.shard, ch.token, rv)) {
		rc = SDB_EIO;
		goto out;
	}
	BSON_APPEND_INT64(res, "left", id);
	BSON_APPEND_INT64(res, "right", nid);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	chunk_free(&ch);
	return rc;
}

int fsm_op_merge_chunks(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	bson_t ids;
	bson_iter_t it;
	chunk_row *rows = NULL;
	size_t n = 0, i;
	int rc = 0;
	int64_t rv, token = 0, opv = 1;
	if (!fsm_arg_doc(&c->args, "ids", &ids, 1))
		return fsm_lerr(res, E_BAD_VALUE, "mergeChunks needs an ids array");
	/* the leader's stamp: the key order of the sort and adjacency check below */
	fsm_arg_int(&c->args, "opVersion", &opv);
	bson_iter_init(&it, &ids);
	while (bson_iter_next(&it)) {
		if (!BSON_ITER_HOLDS_NUMBER(&it) || n >= 1000) {
			rc = fsm_lerr(res, E_BAD_VALUE, "ids must be at most 1000 chunk ids");
			goto out;
		}
		rows = sdb_realloc(rows, (n + 1) * sizeof *rows);
		int e = chunk_load(f, bson_iter_as_int64(&it), &rows[n]);
		if (e < 0) {
			rc = e;
			goto out;
		}
		if (!e) {
			rc = fsm_lerr(res, E_NO_SUCH_KEY, "chunk %lld not found",
				  (long long)bson_iter_as_int64(&it));
			goto out;
		}
		n++;
	}
	if (n < 2) {
		rc = fsm_lerr(res, E_BAD_VALUE, "mergeChunks needs at least two chunks");
		goto out;
	}
	/* Sort by min (insertion sort; n is small). */
	for (i = 1; i < n; i++) {
		chunk_row t = rows[i];
		size_t j = i;
		while (j > 0 && fsm_cmp_key(rows[j - 1].min, t.min, opv) > 0) {
			rows[j] = rows[j - 1];
			j--;
		}
		rows[j] = t;
	}
	for (i = 0; i < n; i++) {
		if (strcmp(rows[i].ns, rows[0].ns) || strcmp(rows[i].shard, rows[0].shard)) {
			rc = fsm_lerr(res, E_ILLEGAL, "chunks to merge must share collection and shard");
			goto out;
		}
		if (opv >= MIGSTATE_OP_VERSION_KEY_ORDER &&
		    (rc = refuse_migrating(f, &rows[i], res)) != 0)
			goto out;
		if (i > 0 && fsm_cmp_key(rows[i - 1].max, rows[i].min, opv) != 0) {
			rc = fsm_lerr(res, E_ILLEGAL, "chunks %lld and %lld are not adjacent",
				  (long long)rows[i - 1].id, (long long)rows[i].id);
			goto out;
		}
		if (rows[i].token > token)
			token = rows[i].token;
	}
	if (fsm_bump_routing(f, &rv) ||
	    fsm_x(f, "UPDATE chunks SET max = ?, token = ?, version = ? WHERE id = ?", "biii",
	      bson_get_data(rows[n - 1].max), fsm_doc_len(rows[n - 1].max), token, rv, rows[0].id)) {
		rc = SDB_EIO;
		goto out;
	}
	for (i = 1; i < n; i++)
		if (fsm_routing_remove_chunk(f->db, rv, rows[i].id) ||
		    fsm_x(f, "DELETE FROM chunks WHERE id = ?", "i", rows[i].id)) {
			rc = SDB_EIO;
			goto out;
		}
	BSON_APPEND_INT64(res, "merged", rows[0].id);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	for (i = 0; i < n; i++)
		chunk_free(&rows[i]);
	free(rows);
	return rc;
}

int fsm_op_set_chunk_shard(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	int64_t id, token, expect, rv;
	const char *shard = fsm_arg_str(&c->args, "shard");
	chunk_row ch;
	int rc = 0;
	if (!fsm_arg_int(&c->args, "id", &id) || !shard)
		return fsm_lerr(res, E_BAD_VALUE, "setChunkShard needs id and shard");
	int e = chunk_load(f, id, &ch);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NO_SUCH_KEY, "chunk %lld not found", (long long)id);
	e = fsm_exists(f, "SELECT 1 FROM shards WHERE id = ?", shard);
	if (e <= 0) {
		rc = e < 0 ? e : fsm_lerr(res, E_SHARD_NOT_FOUND, "shard %s not found", shard);
		goto out;
	}
	if (fsm_arg_int(&c->args, "expectToken", &expect) && expect != ch.token) {
		rc = fsm_lerr(res, E_WRITE_CONFLICT, "chunk %lld has token %lld, expected %lld",
			  (long long)id, (long long)ch.token, (long long)expect);
		BSON_APPEND_INT64(res, "currentToken", ch.token);
		goto out;
	}
	if (!fsm_arg_int(&c->args, "token", &token))
		token = ch.token + 1;
	if (token < ch.token) {
		rc = fsm_lerr(res, E_BAD_VALUE, "token %lld is older than the chunk's %lld",
			  (long long)token, (long long)ch.token);
		goto out;
	}
	if (fsm_bump_routing(f, &rv) ||
	    fsm_x(f, "UPDATE chunks SET shard = ?, token = ?, version = ? WHERE id = ?", "tiii", shard,
	      token, rv, id)) {
		rc = SDB_EIO;
		goto out;
	}
	BSON_APPEND_INT64(res, "token", token);
	BSON_APPEND_INT64(res, "routingVersion", rv);
out:
	chunk_free(&ch);
	return rc;
}
