/* The renameCollection admin command's arguments (MongoDB 6.0: rename_collection.idl,
 * src/mongo/db/commands/rename_collection_cmd.cpp and validateAndRunRenameCollection in
 * src/mongo/db/catalog/rename_collection.cpp), parsed and checked the same way by a shard
 * and by a proxy, so both refuse the same requests with the same codes before anything
 * runs. Depends on libbson only. */
#ifndef SDB_COMMON_RENAMECOLL_H
#define SDB_COMMON_RENAMECOLL_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

/* {renameCollection: "db.from", to: "db.to", dropTarget?, stayTemp?}, parsed. The strings
 * point into the parsed command (valid while it is) or into the struct itself. */
typedef struct sdb_rename_args {
	char from_db[64], to_db[64];    /* database names (at most 63 bytes, checked) */
	const char *from_coll, *to_coll; /* collection names, into the command's "db.coll" */
	const char *from_ns, *to_ns;     /* the fully qualified names as given */
	bool drop_target;                /* dropTarget (default false) */
	bool stay_temp;                  /* stayTemp (default false): accepted; stripedb has no
					  * temporary collections, so it changes nothing */
} sdb_rename_args;

/* Parse and check cmd, a renameCollection command sent to database db, as mongod does
 * before it looks at any collection: the command runs on `admin` only (13 Unauthorized
 * "renameCollection may only be run against the admin database."); `renameCollection` and
 * `to` are strings (14 TypeMismatch; `to` missing: 40414); `dropTarget` and `stayTemp` a
 * bool or a number (14); `collectionUUID` (6.0's expected source UUID) 238 NotImplemented;
 * any other field that is not a generic argument 40415 (also checked by common/cmdopts.h);
 * the same namespace twice: 20 IllegalOperation "Can't rename a collection to itself"; a
 * namespace that is not "db.coll" with a valid database name and a collection name that
 * does not start with '.': 73 InvalidNamespace "Invalid source namespace: X" / "Invalid
 * target namespace: X"; a collection name with '$': 20 "error with source namespace:
 * Invalid collection name: c"; the oplog (`local.oplog.*`): 20 "can't rename live oplog
 * while replicating"; `system.views` / `system.profile`: 20 "error with source namespace:
 * cannot write to db.system.views"; any other `system.*` collection: 20 "error with source
 * namespace: Invalid system namespace: db.system.x" (mongod's userAllowedWriteNS, wrapped
 * as validateAndRunRenameCollection wraps it; "target" for the target); into or out of
 * the `local` database: 20 "Cannot rename collections between a replicated and an
 * unreplicated database" (rename_collection.cpp).
 * Returns: 0 with *out filled, else the MongoDB error code with the message in err (errlen
 * bytes, NUL-terminated); *out is then unspecified. */
int sdb_rename_parse(const bson_t *cmd, const char *db, sdb_rename_args *out, char *err,
		     size_t errlen);

#endif
