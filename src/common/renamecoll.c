/* renameCollection's arguments, parsed and checked as mongod 6.0 does (renamecoll.h). */
#include "common/renamecoll.h"

#include <stdio.h>
#include <string.h>

#include "common/bsonget.h"

/* MongoDB's NamespaceString::validDBName (the characters it refuses on Linux). */
static bool valid_db(const char *db, size_t len)
{
	if (len == 0 || len > 63)
		return false;
	for (size_t i = 0; i < len; i++)
		if (strchr("/\\. \"$", db[i]) != NULL)
			return false;
	return true;
}

/* Split ns ("db.coll") into the db buffer (64 bytes) and the collection pointer, checking
 * that it is a valid namespace as validateAndRunRenameCollection does first. which: "source" or "target". Returns: 0 or the
 * code with the message in err. */
static int split_ns(const char *ns, const char *which, char *db, const char **coll,
		    char *err, size_t errlen)
{
	const char *dot = strchr(ns, '.');
	size_t dlen = dot ? (size_t)(dot - ns) : 0;

	/* NamespaceString::isValid: a valid database name, a non-empty collection name that
	 * does not start with '.' */
	if (!dot || !valid_db(ns, dlen) || dot[1] == '\0' || dot[1] == '.' ||
	    strlen(ns) > 255) {
		snprintf(err, errlen, "Invalid %s namespace: %s", which, ns);
		return 73; /* InvalidNamespace */
	}
	memcpy(db, ns, dlen);
	db[dlen] = '\0';
	*coll = dot + 1;
	return 0;
}

/* The checks of a valid namespace (split by split_ns) that follow in
 * validateAndRunRenameCollection. Returns: 0 or the code with the message in err. */
static int check_ns(const char *ns, const char *which, const char *db, const char *coll,
		    char *err, size_t errlen)
{
	/* the live oplog (mongod refuses it on a replica set member; a shard is always one) */
	if (strcmp(db, "local") == 0 && strncmp(coll, "oplog.", 6) == 0) {
		snprintf(err, errlen, "%s", strcmp(which, "source") == 0
						    ? "can't rename live oplog while replicating"
						    : "can't rename to live oplog while replicating");
		return 20;
	}
	/* userAllowedWriteNS / userAllowedCreateNS, wrapped with "error with ... namespace" */
	if (strchr(coll, '$') != NULL) {
		snprintf(err, errlen, "error with %s namespace: Invalid collection name: %s",
			 which, coll);
		return 20;
	}
	if (strcmp(coll, "system.views") == 0 || strcmp(coll, "system.profile") == 0) {
		snprintf(err, errlen, "error with %s namespace: cannot write to %s", which, ns);
		return 20;
	}
	if (strncmp(coll, "system.", 7) == 0) {
		snprintf(err, errlen, "error with %s namespace: Invalid system namespace: %s",
			 which, ns);
		return 20;
	}
	return 0;
}

/* A bool option: true/false, or a number read by its truth. Returns: 0 or 14. */
static int bool_opt(const bson_iter_t *it, const char *name, bool *out, char *err,
		    size_t errlen)
{
	if (BSON_ITER_HOLDS_BOOL(it) || BSON_ITER_HOLDS_NUMBER(it)) {
		*out = bson_iter_as_bool(it);
		return 0;
	}
	snprintf(err, errlen,
		 "BSON field 'renameCollection.%s' is the wrong type '%s', expected type 'bool'",
		 name, sdb_bson_type_name(bson_iter_type(it)));
	return 14; /* TypeMismatch */
}

int sdb_rename_parse(const bson_t *cmd, const char *db, sdb_rename_args *out, char *err,
		     size_t errlen)
{
	static const char *const generic[] = {
		"$db", "apiVersion", "apiStrict", "apiDeprecationErrors", "maxTimeMS",
		"readConcern", "writeConcern", "lsid", "clientOperationKey", "comment",
		"$readPreference", "$clusterTime", "$audit", "$client", "$configServerState",
		"$configTime", "$topologyTime", "databaseVersion", "shardVersion",
		"maxTimeMSOpOnly", "mayBypassWriteBlocking", "$traceCtx", "txnNumber",
		"autocommit", "startTransaction", "stmtId", "txnRetryCounter", NULL};
	bson_iter_t it;
	bool have_to = false;
	int rc;

	memset(out, 0, sizeof *out);
	err[0] = '\0';
	if (db == NULL || strcmp(db, "admin") != 0) {
		snprintf(err, errlen, "renameCollection may only be run against the admin database.");
		return 13; /* Unauthorized */
	}
	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it)) {
		snprintf(err, errlen, "renameCollection needs a namespace");
		return 2;
	}
	if (!BSON_ITER_HOLDS_UTF8(&it)) {
		snprintf(err, errlen,
			 "collection name has invalid type %s",
			 sdb_bson_type_name(bson_iter_type(&it)));
		return 14;
	}
	out->from_ns = bson_iter_utf8(&it, NULL);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool known = false;

		if (strcmp(k, "to") == 0) {
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				snprintf(err, errlen,
					 "BSON field 'renameCollection.to' is the wrong type '%s', "
					 "expected type 'string'",
					 sdb_bson_type_name(bson_iter_type(&it)));
				return 14;
			}
			out->to_ns = bson_iter_utf8(&it, NULL);
			have_to = true;
		} else if (strcmp(k, "dropTarget") == 0) {
			if ((rc = bool_opt(&it, k, &out->drop_target, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "stayTemp") == 0) {
			if ((rc = bool_opt(&it, k, &out->stay_temp, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "collectionUUID") == 0) {
			snprintf(err, errlen,
				 "BSON field 'renameCollection.collectionUUID' is not supported by "
				 "stripedb (see docs/compat.md)");
			return 238; /* NotImplemented: never ignored */
		} else {
			for (size_t i = 0; generic[i] != NULL; i++)
				known = known || strcmp(generic[i], k) == 0;
			if (!known && strncmp(k, "$stripedb", 9) != 0) {
				snprintf(err, errlen,
					 "BSON field 'renameCollection.%s' is an unknown field.", k);
				return 40415;
			}
		}
	}
	if (!have_to) {
		snprintf(err, errlen,
			 "BSON field 'renameCollection.to' is missing but a required field");
		return 40414;
	}
	if (strcmp(out->from_ns, out->to_ns) == 0) {
		snprintf(err, errlen, "Can't rename a collection to itself");
		return 20; /* IllegalOperation */
	}
	if ((rc = split_ns(out->from_ns, "source", out->from_db, &out->from_coll, err,
			   errlen)) != 0 ||
	    (rc = split_ns(out->to_ns, "target", out->to_db, &out->to_coll, err, errlen)) != 0 ||
	    (rc = check_ns(out->from_ns, "source", out->from_db, out->from_coll, err,
			   errlen)) != 0 ||
	    (rc = check_ns(out->to_ns, "target", out->to_db, out->to_coll, err, errlen)) != 0)
		return rc;
	/* rename_collection.cpp: the local database is not replicated on a mongod, so a
	 * rename into or out of it is refused (a stripedb shard happens to replicate it) */
	if ((strcmp(out->from_db, "local") == 0) != (strcmp(out->to_db, "local") == 0)) {
		snprintf(err, errlen,
			 "Cannot rename collections between a replicated and an unreplicated "
			 "database");
		return 20; /* IllegalOperation */
	}
	return 0;
}
