/* renameCollection through the proxy (issue #20), as mongos 6.0 renames an unsharded
 * collection: routed to the database's primary shard under the DDL lock of both names
 * (ddllock.h), then the empty copies other shards hold follow. Split out of sharding.c. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/renamecoll.h"
#include "proxy/ddllock.h"
#include "proxy/exec.h"
#include "proxy/sharding_int.h"

/* Whether ns is sharded in metadata (routing reloaded: a rename is rare and must not act on
 * a stale "unsharded"). Returns: 0 with *sharded set, or HostUnreachable (6) answered on c
 * when metadata cannot be reached. */
static int ns_sharded(ctx *c, const char *ns, bool *sharded)
{
	ctx c2 = *c;
	char err[256];
	route_coll *rc;

	snprintf(c2.ns, sizeof c2.ns, "%s", ns);
	rc = px_route(&c2, true, err, sizeof err);
	if (rc == NULL)
		return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "routing of %s unavailable: %s", ns,
				err);
	*sharded = rc->nkeys > 0;
	route_coll_unref(rc);
	return 0;
}

/* The primary shard of database db (heap; the database's own, else the cluster's default),
 * as px_primary, or NULL when no shard is registered. */
static char *db_primary(ctx *c, const char *db)
{
	ctx c2 = *c;

	c2.db = db;
	return px_primary(&c2);
}

/* The other shards' part of a rename (one fan-out unit per shard). */
typedef struct rename_rest {
	ctx *c;
	const sdb_rename_args *a;
	char **ids;
	const char *primary;
} rename_rest;

/* On a shard other than the primary: the empty collections that `create` and
 * `createIndexes` (broadcast to every shard) leave there follow the primary's rename, so
 * listCollections through a proxy and a later shardCollection see one name. The source is
 * renamed over any target there (the primary's target is now the source); where there is
 * no source and dropTarget was asked, the target is dropped as on the primary. Failures are
 * logged: the primary, which holds the documents, has renamed already. */
static void rename_rest_one(void *arg, size_t i)
{
	rename_rest *r = arg;
	const char *id = r->ids[i];
	bson_t cmd = BSON_INITIALIZER, reply;
	char nerr[256];
	int cls, code;

	if (strcmp(id, r->primary) == 0) {
		bson_destroy(&cmd);
		return;
	}
	BSON_APPEND_UTF8(&cmd, "renameCollection", r->a->from_ns);
	BSON_APPEND_UTF8(&cmd, "to", r->a->to_ns);
	BSON_APPEND_BOOL(&cmd, "dropTarget", true);
	cls = px_run_on(r->c, id, &cmd, NULL, &reply, nerr, sizeof nerr);
	code = cls == SHARDCONN_CMD_ERR ? (int)px_get_int(&reply, "code", 0) : 0;
	bson_destroy(&cmd);
	if (cls == SHARDCONN_CMD_ERR && code == WIRE_ERR_NAMESPACE_NOT_FOUND &&
	    r->a->drop_target) {
		ctx c2 = *r->c;

		c2.db = r->a->to_db;
		bson_destroy(&reply);
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "drop", r->a->to_coll);
		cls = px_run_on(&c2, id, &cmd, NULL, &reply, nerr, sizeof nerr);
		code = cls == SHARDCONN_CMD_ERR ? (int)px_get_int(&reply, "code", 0) : 0;
		bson_destroy(&cmd);
	}
	if (cls != SHARDCONN_OK && !(cls == SHARDCONN_CMD_ERR &&
				     code == WIRE_ERR_NAMESPACE_NOT_FOUND))
		sdb_warn("renameCollection: the primary shard renamed the collection; another "
			 "shard's empty copy was not renamed",
			 "from=%s to=%s shard=%s code=%d err=%s", r->a->from_ns, r->a->to_ns, id,
			 code, cls == SHARDCONN_CMD_ERR ? px_str_of(&reply, "errmsg") : nerr);
	bson_destroy(&reply);
}

/* renameCollection through a proxy (issue #20), as mongos 6.0 renames an unsharded
 * collection (cluster_rename_collection_cmd.cpp, rename_collection_coordinator.cpp): the
 * arguments are checked as a shard checks them (common/renamecoll.h); a source or a target
 * that metadata lists as sharded is refused with IllegalOperation (20: stripedb does not
 * rename sharded collections, their chunks live in the metadata service); across
 * databases both must have the same primary shard (else CommandFailed 125 "Source and
 * destination collections must be on same shard", as mongos). Then the command goes as it
 * is to that primary shard, which renames atomically and replicates it; then the empty
 * copies that broadcast `create`/`createIndexes` left on the other shards follow
 * (rename_rest_one). Unsharded
 * collections live on their database's primary shard and metadata records nothing per
 * unsharded collection, so the new name routes where the old one did and nothing else
 * changes; the shard refuses too when it holds filtering metadata for either name (a
 * collection sharded meanwhile). The whole command holds the DDL locks of both names
 * (ddllock.h), renewed before the shard is asked, so a shardCollection of either name runs
 * wholly before or wholly after it. */
static int rename_locked(ctx *c, const sdb_rename_args *ap, px_ddl_lock *l)
{
	sdb_rename_args a = *ap;
	char *from_primary = NULL, *to_primary = NULL;
	bool sharded = false;
	int st;

	if ((st = ns_sharded(c, a.from_ns, &sharded)) != 0)
		return st;
	if (sharded)
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"source namespace '%s' must not be sharded: stripedb does not rename "
				"sharded collections (their chunks are recorded in the metadata "
				"service)",
				a.from_ns);
	if ((st = ns_sharded(c, a.to_ns, &sharded)) != 0)
		return st;
	if (sharded)
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"cannot rename to sharded collection '%s': stripedb does not rename "
				"sharded collections",
				a.to_ns);
	from_primary = db_primary(c, a.from_db);
	if (from_primary == NULL)
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND,
				"no shard is registered in the metadata service");
	to_primary = db_primary(c, a.to_db);
	if (to_primary == NULL || strcmp(from_primary, to_primary) != 0) {
		free(from_primary);
		free(to_primary);
		return px_error(c, 125 /* CommandFailed */,
				"Source and destination collections must be on same shard");
	}
	free(to_primary);
	{
		bson_t fwd = BSON_INITIALIZER, reply;
		char nerr[256];
		int r;

		/* the checks above were made under the locks: still held, or nothing is done */
		if ((st = px_ddl_lock_renew(c, l)) != 0) {
			free(from_primary);
			return st;
		}
		px_copy_cmd(c->cmd, &fwd, NULL);
		r = px_run_on(c, from_primary, &fwd, NULL, &reply, nerr, sizeof nerr);
		if (r == SHARDCONN_OK) {
			rename_rest rest = {c, &a, NULL, from_primary};
			size_t n = px_shard_ids(c, &rest.ids);

			px_fanout(c, n, rename_rest_one, &rest);
			for (size_t i = 0; i < n; i++)
				free(rest.ids[i]);
			free(rest.ids);
		}
		st = px_reply_write_result(c, r, &reply, nerr);
		bson_destroy(&reply);
		bson_destroy(&fwd);
	}
	free(from_primary);
	return st;
}

int px_do_rename_collection(ctx *c)
{
	sdb_rename_args a;
	px_ddl_lock l;
	char err[512];
	int st = sdb_rename_parse(c->cmd, c->db, &a, err, sizeof err);

	if (st != 0)
		return px_error(c, st, "%s", err);
	/* through a proxy `config` is metadata's read-only view (configdb.c), on no shard */
	if (strcmp(a.from_db, "config") == 0 || strcmp(a.to_db, "config") == 0)
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"cannot rename %s to %s: the config database is a read-only view "
				"of the metadata service",
				a.from_ns, a.to_ns);
	/* serialised with shardCollection of either name (ddllock.h) */
	{
		const char *nss[2] = {a.from_ns, a.to_ns};
		if ((st = px_ddl_lock_acquire(c, nss, 2, &l)) != 0)
			return st;
	}
	st = rename_locked(c, &a, &l);
	px_ddl_lock_release(c, &l);
	return st;
}
