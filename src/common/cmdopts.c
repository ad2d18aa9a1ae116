/* Refusal of command options stripedb does not implement: see cmdopts.h. */
#include "common/cmdopts.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define CODE_NOT_IMPLEMENTED 238 /* NotImplemented */
#define CODE_UNKNOWN_FIELD 40415 /* IDL: "BSON field '...' is an unknown field." */
#define CODE_INVALID_OPTIONS 72  /* InvalidOptions */

/* ---- strict parsing: the fields a command may carry (issue #20) ----
 * MongoDB parses each command with its IDL and answers 40415 "BSON field '<cmd>.<f>' is an
 * unknown field." for any other. The lists follow MongoDB 6.0's IDL files (the version we
 * advertise): generic_argument.idl for the fields every command may carry, and the
 * command's own (find_command.idl, aggregate_command.idl, count_command.idl,
 * distinct_command.idl, write_ops.idl with findAndModify's, getmore_command.idl; `create`
 * checks its own options, src/shard/cmd_admin.c). A field listed here is parsed: the
 * command either honours it or refuses it with its own error (collation, let, ...).
 * Commands without a list here are not checked. */

/* generic_argument.idl (6.0): the arguments any command may carry. */
static const char *const generic_fields[] = {
	"$db", "apiVersion", "apiStrict", "apiDeprecationErrors", "maxTimeMS", "readConcern",
	"writeConcern", "lsid", "clientOperationKey", "txnNumber", "txnRetryCounter",
	"autocommit", "startTransaction", "stmtId", "comment", "$readPreference",
	"$clusterTime", "$audit", "$client", "$configServerState", "$configTime",
	"$topologyTime", "allowImplicitCollectionCreation", "$oplogQueryData", "$queryOptions",
	"$replData", "databaseVersion", "shardVersion", "tracking_info", "coordinator",
	"maxTimeMSOpOnly", "usesDefaultMaxTimeMS", "mayBypassWriteBlocking", "$traceCtx",
	NULL};

static const char *const find_fields[] = {
	"filter", "projection", "sort", "hint", "skip", "limit", "batchSize", "singleBatch",
	"max", "min", "returnKey", "showRecordId", "tailable", "oplogReplay", "noCursorTimeout",
	"awaitData", "allowPartialResults", "collation", "allowDiskUse", "let", "readOnce",
	"allowSpeculativeMajorityRead", "$_requestResumeToken", "$_resumeAfter",
	"requestResumeToken", "resumeAfter", "term", "ntoreturn", "encryptionInformation",
	"includeQueryStatsMetrics", NULL};
static const char *const aggregate_fields[] = {
	"pipeline", "explain", "allowDiskUse", "cursor", "bypassDocumentValidation", "collation",
	"hint", "let", "needsMerge", "fromMongos", "fromRouter", "$_needsMerge", "exchange",
	"runtimeConstants", "isMapReduceCommand", "$_isMapReduceCommand", "collectionUUID",
	"encryptionInformation", "$_requestReshardingResumeToken", "$_generateV2ResumeTokens",
	"includeQueryStatsMetrics", NULL};
static const char *const count_fields[] = {
	"query", "limit", "skip", "hint", "collation", "fields", "encryptionInformation", NULL};
static const char *const distinct_fields[] = {"key", "query", "collation", "hint",
					      "sampleId", NULL};
static const char *const insert_fields[] = {
	"documents", "ordered", "bypassDocumentValidation", "stmtIds", "collectionUUID",
	"encryptionInformation", "isTimeseriesNamespace", NULL};
static const char *const update_fields[] = {
	"updates", "ordered", "bypassDocumentValidation", "let", "stmtIds", "runtimeConstants",
	"collectionUUID", "encryptionInformation", "isTimeseriesNamespace", NULL};
static const char *const delete_fields[] = {
	"deletes", "ordered", "bypassDocumentValidation", "let", "stmtIds", "collectionUUID",
	"encryptionInformation", "isTimeseriesNamespace", NULL};
static const char *const fam_fields[] = {
	"query", "fields", "sort", "remove", "update", "new", "upsert",
	"bypassDocumentValidation", "collation", "arrayFilters", "hint", "let",
	"runtimeConstants", "encryptionInformation", "batchSize",
	"stmtIds", /* stripedb: the proxy sends a retryable findAndModify's stmtIds as a write's */
	NULL};
static const char *const getmore_fields[] = {
	"collection", "batchSize", "term", "lastKnownCommittedOpTime",
	"includeQueryStatsMetrics", NULL};
/* stripedb's own fields of these commands, sent to shards by the coordinator and backups
 * (src/shard/README.md): a find's keyRange and stripedbSnapshot flag, a delete statement's
 * keyRange and keyRangeLimit (a migration's range cleanup). Known to a shard only
 * (sdb_cmd_check with internal), as are a statement's $stripedb* fields (the migration's
 * session records, $stripedbSession): through a proxy they are unknown fields. */
static const char *const internal_find_fields[] = {"keyRange", "stripedbSnapshot", NULL};
static const char *const internal_delete_stmt_fields[] = {"keyRange", "keyRangeLimit", NULL};

/* update and delete statements (write_ops.idl UpdateOpEntry, DeleteOpEntry) */
static const char *const update_stmt_fields[] = {
	"q", "u", "c", "upsert", "multi", "arrayFilters", "hint", "collation", "upsertSupplied",
	"sampleId", NULL};
static const char *const delete_stmt_fields[] = {"q", "limit", "hint", "collation",
						 "sampleId", NULL};

static const struct {
	const char *cmd;
	const char *const *fields;
} cmd_fields[] = {
	{"find", find_fields},	     {"aggregate", aggregate_fields}, {"count", count_fields},
	{"distinct", distinct_fields}, {"insert", insert_fields},	      {"update", update_fields},
	{"delete", delete_fields},   {"findAndModify", fam_fields},   {"findandmodify", fam_fields},
	{"getMore", getmore_fields},
};

static bool listed(const char *const *list, const char *k)
{
	for (size_t i = 0; list[i] != NULL; i++)
		if (strcmp(list[i], k) == 0)
			return true;
	return false;
}

/* The first field of cmd (after its first, the command name) that neither the command's
 * list nor the generic arguments name; NULL when all are known or the command has no
 * list. stripedb's own fields ($stripedb*: between proxy, coordinator and shard, checked by
 * the commands that read them) are known. */
static const char *unknown_field(const char *name, const bson_t *cmd, bool internal)
{
	const char *const *fields = NULL;
	bson_iter_t it;

	for (size_t i = 0; i < sizeof cmd_fields / sizeof cmd_fields[0]; i++)
		if (strcmp(cmd_fields[i].cmd, name) == 0)
			fields = cmd_fields[i].fields;
	if (fields == NULL || !bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return NULL;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (!listed(fields, k) && !listed(generic_fields, k) &&
		    strncmp(k, "$stripedb", 9) != 0 &&
		    !(internal && strcmp(name, "find") == 0 && listed(internal_find_fields, k)))
			return k;
	}
	return NULL;
}

/* The same for one statement of update.updates / delete.deletes. */
static const char *unknown_stmt_field(const bson_t *stmt, bool update, bool internal)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, stmt))
		return NULL;
	while (bson_iter_next(&it))
		if (!listed(update ? update_stmt_fields : delete_stmt_fields, bson_iter_key(&it)) &&
		    !(internal && !update &&
		      listed(internal_delete_stmt_fields, bson_iter_key(&it))) &&
		    !(internal && strncmp(bson_iter_key(&it), "$stripedb", 9) == 0))
			return bson_iter_key(&it);
	return NULL;
}

/* A collation that compares as stripedb does: exactly {locale: "simple"}. */
static bool collation_is_simple(const bson_iter_t *field)
{
	bson_iter_t c;

	if (!BSON_ITER_HOLDS_DOCUMENT(field) || !bson_iter_recurse(field, &c) || !bson_iter_next(&c))
		return false;
	if (strcmp(bson_iter_key(&c), "locale") != 0 || !BSON_ITER_HOLDS_UTF8(&c) ||
	    strcmp(bson_iter_utf8(&c, NULL), "simple") != 0)
		return false;
	return !bson_iter_next(&c);
}

/* One document: a command (where NULL) or one statement of its array (where names the array's
 * path, e.g. "update.updates"). */
static int scan(const bson_t *doc, const char *where, bool update_statement,
		bool delete_statement, bool retryable, char *err, size_t errlen)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, doc))
		return 0;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "collation") == 0 && !collation_is_simple(&it)) {
			snprintf(err, errlen,
				 "collation is not supported by stripedb: strings compare by their "
				 "bytes (only {locale: \"simple\"} is accepted; see docs/compat.md)");
			return CODE_NOT_IMPLEMENTED;
		}
		if (update_statement && strcmp(k, "sort") == 0) {
			snprintf(err, errlen, "BSON field '%s.sort' is an unknown field.", where);
			return CODE_UNKNOWN_FIELD;
		}
		/* a multi-document statement cannot be made exactly-once: MongoDB refuses it in
		 * a retryable write (write_ops_exec.cpp) rather than run it without the record */
		if (retryable &&
		    ((update_statement && strcmp(k, "multi") == 0 && bson_iter_as_bool(&it)) ||
		     (delete_statement && strcmp(k, "limit") == 0 && BSON_ITER_HOLDS_NUMBER(&it) &&
		      bson_iter_as_int64(&it) == 0))) {
			snprintf(err, errlen, "Cannot use (or request) retryable writes with multi=true");
			return CODE_INVALID_OPTIONS;
		}
	}
	return 0;
}

static bool sub_document(const bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

int sdb_cmd_unsupported_option(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	return sdb_cmd_check(name, cmd, false, err, errlen);
}

int sdb_cmd_check(const char *name, const bson_t *cmd, bool internal, char *err, size_t errlen)
{
	static const struct {
		const char *cmd, *array, *where;
		bool update;
	} arrays[] = {
		{"update", "updates", "update.updates", true},
		{"delete", "deletes", "delete.deletes", false},
		{"createIndexes", "indexes", "createIndexes.indexes", false},
	};
	bson_iter_t it, arr;
	bson_t sub;
	/* a transaction's statement (autocommit: false) is not a retryable write */
	bool retryable = bson_iter_init_find(&it, cmd, "txnNumber") &&
			 !bson_has_field(cmd, "autocommit");
	static const char *const with_let[] = {"find",	 "aggregate",	  "update",
					       "delete", "findAndModify", "findandmodify"};
	bool let_ok = false;
	const char *unknown = unknown_field(name, cmd, internal);
	int code;

	/* `let` (MongoDB 5.0) is honoured by find, aggregate, update, delete and findAndModify
	 * (storage/pipeline.h sdb_let_parse); no other command has it */
	for (size_t i = 0; i < sizeof with_let / sizeof with_let[0]; i++)
		let_ok = let_ok || strcmp(with_let[i], name) == 0;
	if (unknown == NULL && !let_ok && bson_has_field(cmd, "let"))
		unknown = "let";
	if (unknown != NULL) {
		snprintf(err, errlen, "BSON field '%s.%s' is an unknown field.", name, unknown);
		return CODE_UNKNOWN_FIELD;
	}
	code = scan(cmd, NULL, false, false, false, err, errlen);
	if (code != 0)
		return code;
	if (strcmp(name, "explain") == 0 && bson_iter_init_find(&it, cmd, "explain") &&
	    sub_document(&it, &sub)) {
		bson_iter_t first;
		if (bson_iter_init(&first, &sub) && bson_iter_next(&first))
			return sdb_cmd_check(bson_iter_key(&first), &sub, internal, err, errlen);
		return 0;
	}
	for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
		if (strcmp(arrays[i].cmd, name) != 0 || !bson_iter_init_find(&it, cmd, arrays[i].array) ||
		    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
			continue;
		while (bson_iter_next(&arr)) {
			if (!sub_document(&arr, &sub))
				continue;
			code = scan(&sub, arrays[i].where, arrays[i].update,
				    strcmp(arrays[i].cmd, "delete") == 0, retryable, err, errlen);
			if (code != 0)
				return code;
			if (strcmp(arrays[i].cmd, "createIndexes") != 0 &&
			    (unknown = unknown_stmt_field(&sub, arrays[i].update, internal)) != NULL) {
				snprintf(err, errlen, "BSON field '%s.%s' is an unknown field.",
					 arrays[i].where, unknown);
				return CODE_UNKNOWN_FIELD;
			}
		}
	}
	return 0;
}
