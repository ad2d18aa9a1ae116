/* Refusal of command options stripedb does not implement: see cmdopts.h. */
#include "common/cmdopts.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/bsonget.h"
#include "common/fieldscan.h"

#define CODE_NOT_IMPLEMENTED 238 /* NotImplemented */
#define CODE_UNKNOWN_FIELD 40415 /* IDL: "BSON field '...' is an unknown field." */
#define CODE_INVALID_OPTIONS 72  /* InvalidOptions */
#define CODE_INVALID_NAMESPACE 73 /* InvalidNamespace */
#define CODE_UNAUTHORIZED 13      /* Unauthorized */
#define CODE_DUPLICATE_FIELD 40413 /* IDLDuplicateField */

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
	"collectionUUID", NULL};
static const char *const aggregate_fields[] = {
	"pipeline", "explain", "allowDiskUse", "cursor", "bypassDocumentValidation", "collation",
	"hint", "let", "needsMerge", "fromMongos", "exchange", "runtimeConstants",
	"isMapReduceCommand", "$_isMapReduceCommand", "collectionUUID", "encryptionInformation",
	"$_requestReshardingResumeToken", "$_generateV2ResumeTokens", NULL};
static const char *const count_fields[] = {
	"query", "limit", "skip", "hint", "collation", "fields", "encryptionInformation",
	"collectionUUID", NULL};
static const char *const distinct_fields[] = {"key", "query", "collation", "hint",
					      "collectionUUID", NULL};
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
	"collectionUUID", NULL};
static const char *const getmore_fields[] = {
	"collection", "batchSize", "term", "lastKnownCommittedOpTime", NULL};
/* Left out above, MongoDB 7.0 and later only (unknown to 6.0, 40415): find's, aggregate's
 * and getMore's includeQueryStatsMetrics, distinct's and the update/delete statements'
 * sampleId, aggregate's fromRouter and $_needsMerge (8.0's names of fromMongos and
 * needsMerge). */

/* stripedb's own fields of these commands, sent to shards by the coordinator and backups
 * (src/shard/README.md): a find's keyRange and stripedbSnapshot flag, a delete statement's
 * keyRange and keyRangeLimit (a migration's range cleanup). Known to a shard only
 * (sdb_cmd_check with internal), as are a statement's $stripedb* fields (the migration's
 * session records, $stripedbSession): through a proxy they are unknown fields. */
static const char *const internal_find_fields[] = {"keyRange", "stripedbSnapshot", NULL};
static const char *const internal_delete_stmt_fields[] = {"keyRange", "keyRangeLimit", NULL};

/* The catalog and cursor commands (MongoDB 6.0 create_indexes.idl, drop_indexes.idl,
 * drop.idl, drop_database.idl, list_indexes.idl, list_collections.idl, list_databases.idl,
 * kill_cursors.idl, commands/explain.idl: each `strict: true`). A field listed here that
 * stripedb does not read is one mongod reads for a feature stripedb has no counterpart
 * for (commitQuorum: every index is built on the primary and replicated as one Raft entry;
 * collectionUUID, isTimeseriesNamespace: sent between MongoDB's own roles). */
static const char *const create_indexes_fields[] = {
	"indexes",	"v",	"ignoreUnknownIndexOptions", "commitQuorum", "returnOnStart",
	"isTimeseriesNamespace", "collectionUUID", NULL};
static const char *const drop_indexes_fields[] = {"index", "isTimeseriesNamespace",
						  "collectionUUID", NULL};
static const char *const drop_fields[] = {"collectionUUID", NULL};
static const char *const no_fields[] = {NULL};
static const char *const list_indexes_fields[] = {
	"cursor", "includeBuildUUIDs", "isTimeseriesNamespace", NULL};
static const char *const list_collections_fields[] = {
	"cursor", "filter", "nameOnly", "authorizedCollections", "includePendingDrops", NULL};
static const char *const list_databases_fields[] = {"filter", "nameOnly",
						    "authorizedDatabases", NULL};
static const char *const kill_cursors_fields[] = {"cursors", NULL};
static const char *const explain_fields[] = {"verbosity", NULL};

/* validate (MongoDB 6.0 src/mongo/db/commands/validate.cpp: the options it reads) */
static const char *const validate_fields[] = {"full", "background", "repair", "enforceFastCount",
					      "metadata", NULL};

/* stripedbSetFiltering (src/shard/filtering.c, sent by the coordinator): an install or a
 * drop of a namespace's filtering metadata; an unknown field is a sender's mistake */
static const char *const setfiltering_fields[] = {"key", "collectionVersion", "chunks", "drop",
						  NULL};

/* update and delete statements (write_ops.idl UpdateOpEntry, DeleteOpEntry) */
static const char *const update_stmt_fields[] = {
	"q", "u", "c", "upsert", "multi", "arrayFilters", "hint", "collation", "upsertSupplied",
	NULL};
static const char *const delete_stmt_fields[] = {"q", "limit", "hint", "collation", NULL};

static const struct {
	const char *cmd;
	const char *const *fields;
} cmd_fields[] = {
	{"find", find_fields},	     {"aggregate", aggregate_fields}, {"count", count_fields},
	{"distinct", distinct_fields}, {"insert", insert_fields},	      {"update", update_fields},
	{"delete", delete_fields},   {"findAndModify", fam_fields},   {"findandmodify", fam_fields},
	{"getMore", getmore_fields}, {"validate", validate_fields},
	{"createIndexes", create_indexes_fields}, {"dropIndexes", drop_indexes_fields},
	{"deleteIndexes", drop_indexes_fields}, {"drop", drop_fields},
	{"dropDatabase", no_fields}, {"listIndexes", list_indexes_fields},
	{"listCollections", list_collections_fields}, {"listDatabases", list_databases_fields},
	{"killCursors", kill_cursors_fields}, {"explain", explain_fields},
	{"stripedbSetFiltering", setfiltering_fields},
};

/* strcmp(a, b) == 0, the first bytes compared inline first: most names of the lists below
 * differ from a command's field in their first byte, and the calls to strcmp were ~2% of a
 * proxy point read (issue #19). */
static inline bool same(const char *a, const char *b)
{
	return a[0] == b[0] && strcmp(a, b) == 0;
}

static bool listed(const char *const *list, const char *k)
{
	for (size_t i = 0; list[i] != NULL; i++)
		if (same(list[i], k))
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

	for (size_t i = 0; i < sizeof cmd_fields / sizeof cmd_fields[0] && fields == NULL; i++)
		if (same(cmd_fields[i].cmd, name))
			fields = cmd_fields[i].fields;
	if (fields == NULL || !bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return NULL;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (!listed(fields, k) && !listed(generic_fields, k) &&
		    !(k[0] == '$' && strncmp(k, "$stripedb", 9) == 0) &&
		    !(internal && strcmp(name, "find") == 0 && listed(internal_find_fields, k)))
			return k;
	}
	return NULL;
}

/* Commands that never write, whose MongoDB 6.0 invocation answers supportsWriteConcern()
 * false: service_entry_point_common.cpp refuses one that carries a writeConcern with 72
 * InvalidOptions "Command does not support writeConcern" (mongos the same,
 * strategy.cpp), rather than accept a durability request it cannot honour. aggregate
 * takes one only with a $out or $merge stage (run_aggregate's supportsWriteConcern);
 * explain never (explain_cmd.cpp: CmdExplain::Invocation::supportsWriteConcern() is false,
 * whatever it explains: the explain's own writeConcern is refused; the explained command's
 * is not looked at, see cmd_check). */
static const char *const no_write_concern[] = {
	"find",		"getMore",	  "count",	 "distinct",	    "killCursors",
	"listCollections", "listIndexes",   "listDatabases", "dbStats",	    "collStats",
	"dataSize",	"validate",	  "ping",	 "hello",	    "isMaster",
	"ismaster",	"buildInfo",	  "buildinfo",	 "serverStatus",    "hostInfo",
	"connectionStatus", "whatsmyuri",   "getParameter",  "listCommands",    "currentOp",
	"getLog",	"explain",	NULL};

/* Does pipeline (an aggregate's `pipeline` array) hold a $out or $merge stage? */
static bool pipeline_writes(const bson_t *cmd)
{
	bson_iter_t it, arr, st;

	if (!bson_iter_init_find(&it, cmd, "pipeline") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return false;
	while (bson_iter_next(&arr))
		if (BSON_ITER_HOLDS_DOCUMENT(&arr) && bson_iter_recurse(&arr, &st) &&
		    bson_iter_next(&st) &&
		    (strcmp(bson_iter_key(&st), "$out") == 0 ||
		     strcmp(bson_iter_key(&st), "$merge") == 0))
			return true;
	return false;
}

int sdb_cmd_write_concern_check(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	if (!bson_has_field(cmd, "writeConcern"))
		return 0;
	if (!(strcmp(name, "aggregate") == 0 && !pipeline_writes(cmd)) &&
	    !listed(no_write_concern, name))
		return 0;
	snprintf(err, errlen, "Command does not support writeConcern");
	return CODE_INVALID_OPTIONS;
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

/* Commands that honour a collation (issue #20, storage/collation.h): their own top-level
 * `collation` (update and delete: each statement's, createIndexes each index's;
 * an explained command as itself; shardCollection's is still refused). */
static bool collated(const char *name)
{
	static const char *const names[] = {"find",	     "count",	      "distinct",
					    "aggregate",     "findAndModify", "findandmodify",
					    "create"};

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (same(names[i], name))
			return true;
	return false;
}

/* One document: a command (where NULL) or one statement of its array (where names the array's
 * path, e.g. "update.updates"). */
static int scan(const bson_t *doc, const char *where, bool update_statement,
		bool delete_statement, bool retryable, bool collation_ok, char *err,
		size_t errlen)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, doc))
		return 0;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (!collation_ok && same(k, "collation") && !collation_is_simple(&it)) {
			snprintf(err, errlen,
				 "collation is not supported by stripedb %s: strings compare by "
				 "their bytes there (only {locale: \"simple\"} is accepted; see "
				 "docs/compat.md)",
				 where ? where : "by this command");
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

/* ---- IDL types: the type of each known field (issue #20) ----
 * mongod parses a command with its IDL before running it: a field of the wrong type is
 * refused with 14 TypeMismatch "BSON field 'find.filter' is the wrong type 'string', expected
 * type 'object'", a safeInt64 with its range validator, and a few fields with their own
 * parsers (maxTimeMS, writeConcern, a delete statement's limit). Without this the proxy read
 * a wrong-typed filter as no filter (a findAndModify with query: "k == 5" removed a random
 * document). Checking here, before either role runs the command, gives both roles the same
 * answer. Types follow MongoDB 6.0's IDL (find_command.idl, aggregate_command.idl,
 * count_command.idl, distinct_command.idl, write_ops.idl, getmore_command.idl,
 * kill_cursors.idl, generic_argument.idl); where stripedb is stricter it says so:
 *   - null is refused like any other wrong type (the IDL skips a null as if absent; the
 *     commands' own getters do not, so refusing keeps proxy and shard in agreement);
 *   - the boolean fields take a bool or a number (IDL safeBool; optionalBool takes bool only
 *     in mongod, and drivers send bools);
 *   - integer fields take int, long or an integral double (common/bsonget.h): a decimal is
 *     refused with 14, a fractional or out-of-range double with 9;
 *   - killCursors' cursor ids take int or long (IDL `array<long>` takes long only);
 *     getMore's id is a long only, as in the IDL. */
typedef enum arg_type {
	ARG_OBJECT,	/* object */
	ARG_ARRAY,	/* array */
	ARG_STRING,	/* string */
	ARG_BOOL,	/* bool or number */
	ARG_INT,	/* safeInt64, any value */
	ARG_UINT,	/* safeInt64, validator gte: 0 (51024) */
	ARG_HINT,	/* indexHint: an index name or a key pattern */
	ARG_UPDATE,	/* update modification: an object or a pipeline (array) */
	ARG_CURSOR_ID,	/* long (getMore's cursor id) */
	ARG_CURSOR_IDS, /* array of longs, an int accepted (killCursors.cursors) */
	ARG_MAX_TIME,	/* maxTimeMS: parseMaxTimeMS, 2 BadValue */
	ARG_WC,		/* writeConcern: 9 FailedToParse for a malformed one */
	ARG_CURSOR,	/* aggregate's cursor: {batchSize: safeInt64 >= 0} */
	ARG_GETMORE_BATCH, /* getMore's batchSize: a safeInt64 > 0 (getmore_cmd.cpp, 2) */
	ARG_DELETE_LIMIT,  /* a delete statement's limit: exactly 0 or 1 (9) */
	ARG_VERBOSITY,	   /* explain's verbosity: an enum string (explain_verbosity.idl, 2) */
	ARG_UUID,	   /* collectionUUID: binData of subtype 4 (IDL uuid, 14 otherwise) */
} arg_type;

typedef struct arg_rule {
	const char *field;
	arg_type type;
} arg_rule;

#define CODE_BAD_VALUE 2
#define CODE_FAILED_TO_PARSE 9
#define CODE_TYPE_MISMATCH 14
#define CODE_UNKNOWN_REPL_WRITE_CONCERN 79

/* generic_argument.idl, for every command with a type list */
static const arg_rule generic_types[] = {
	{"maxTimeMS", ARG_MAX_TIME}, {"writeConcern", ARG_WC}, {"readConcern", ARG_OBJECT},
	{"lsid", ARG_OBJECT},	     {NULL, 0}};
static const arg_rule find_types[] = {
	{"filter", ARG_OBJECT},	   {"projection", ARG_OBJECT},	{"sort", ARG_OBJECT},
	{"hint", ARG_HINT},	   {"collation", ARG_OBJECT},	{"skip", ARG_UINT},
	{"limit", ARG_UINT},	   {"batchSize", ARG_UINT},	{"ntoreturn", ARG_UINT},
	{"singleBatch", ARG_BOOL}, {"allowDiskUse", ARG_BOOL},	{"min", ARG_OBJECT},
	{"max", ARG_OBJECT},	   {"returnKey", ARG_BOOL},	{"showRecordId", ARG_BOOL},
	{"tailable", ARG_BOOL},	   {"noCursorTimeout", ARG_BOOL}, {"awaitData", ARG_BOOL},
	{"allowPartialResults", ARG_BOOL}, {"let", ARG_OBJECT},	{"term", ARG_INT},
	{"readOnce", ARG_BOOL},	   {"$_requestResumeToken", ARG_BOOL},
	{"$_resumeAfter", ARG_OBJECT}, {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule aggregate_types[] = {
	{"pipeline", ARG_ARRAY},   {"explain", ARG_BOOL},	  {"allowDiskUse", ARG_BOOL},
	{"cursor", ARG_CURSOR},	   {"bypassDocumentValidation", ARG_BOOL},
	{"collation", ARG_OBJECT}, {"hint", ARG_HINT},		  {"let", ARG_OBJECT},
	{"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule count_types[] = {
	{"query", ARG_OBJECT}, {"limit", ARG_INT},    {"skip", ARG_INT}, {"hint", ARG_HINT},
	{"collation", ARG_OBJECT}, {"fields", ARG_OBJECT}, {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule distinct_types[] = {{"key", ARG_STRING},	     {"query", ARG_OBJECT},
					  {"collation", ARG_OBJECT}, {"hint", ARG_HINT},
					  {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule insert_types[] = {{"documents", ARG_ARRAY},
					{"ordered", ARG_BOOL},
					{"bypassDocumentValidation", ARG_BOOL},
					{"stmtIds", ARG_ARRAY},
					{"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule update_types[] = {
	{"updates", ARG_ARRAY}, {"ordered", ARG_BOOL}, {"bypassDocumentValidation", ARG_BOOL},
	{"let", ARG_OBJECT},	{"stmtIds", ARG_ARRAY}, {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule delete_types[] = {
	{"deletes", ARG_ARRAY}, {"ordered", ARG_BOOL}, {"bypassDocumentValidation", ARG_BOOL},
	{"let", ARG_OBJECT},	{"stmtIds", ARG_ARRAY}, {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule fam_types[] = {
	{"query", ARG_OBJECT},	  {"fields", ARG_OBJECT},    {"sort", ARG_OBJECT},
	{"remove", ARG_BOOL},	  {"update", ARG_UPDATE},    {"new", ARG_BOOL},
	{"upsert", ARG_BOOL},	  {"bypassDocumentValidation", ARG_BOOL},
	{"collation", ARG_OBJECT}, {"arrayFilters", ARG_ARRAY}, {"hint", ARG_HINT},
	{"let", ARG_OBJECT},	  {"stmtIds", ARG_ARRAY},    {"collectionUUID", ARG_UUID}, {NULL, 0}};
static const arg_rule getmore_types[] = {{"getMore", ARG_CURSOR_ID},
					 {"collection", ARG_STRING},
					 {"batchSize", ARG_GETMORE_BATCH},
					 {"term", ARG_INT},
					 {NULL, 0}};
static const arg_rule killcursors_types[] = {
	{"killCursors", ARG_STRING}, {"cursors", ARG_CURSOR_IDS}, {NULL, 0}};
/* write_ops.idl UpdateOpEntry, DeleteOpEntry */
static const arg_rule update_stmt_types[] = {
	{"q", ARG_OBJECT},	   {"u", ARG_UPDATE},		{"c", ARG_OBJECT},
	{"upsert", ARG_BOOL},	   {"multi", ARG_BOOL},		{"arrayFilters", ARG_ARRAY},
	{"hint", ARG_HINT},	   {"collation", ARG_OBJECT},	{"upsertSupplied", ARG_BOOL},
	{NULL, 0}};
static const arg_rule delete_stmt_types[] = {{"q", ARG_OBJECT},
					     {"limit", ARG_DELETE_LIMIT},
					     {"hint", ARG_HINT},
					     {"collation", ARG_OBJECT},
					     {NULL, 0}};

static const arg_rule explain_types[] = {{"verbosity", ARG_VERBOSITY}, {NULL, 0}};
static const arg_rule drop_types[] = {{"collectionUUID", ARG_UUID}, {NULL, 0}};

static const struct {
	const char *cmd;
	const arg_rule *rules;
} cmd_types[] = {
	{"explain", explain_types},
	{"find", find_types},	       {"aggregate", aggregate_types},
	{"count", count_types},	       {"distinct", distinct_types},
	{"insert", insert_types},      {"update", update_types},
	{"delete", delete_types},      {"findAndModify", fam_types},
	{"findandmodify", fam_types},  {"getMore", getmore_types},
	{"killCursors", killcursors_types}, {"drop", drop_types},
};

static const arg_rule *command_types(const char *name)
{
	for (size_t i = 0; i < sizeof cmd_types / sizeof cmd_types[0]; i++)
		if (same(cmd_types[i].cmd, name))
			return cmd_types[i].rules;
	return NULL;
}

static int wrong_type(const bson_iter_t *it, const char *path, const char *expected,
		      char *err, size_t errlen)
{
	snprintf(err, errlen, "BSON field '%s' is the wrong type '%s', expected %s", path,
		 sdb_bson_type_name(bson_iter_type(it)), expected);
	return CODE_TYPE_MISMATCH;
}

/* An integer field through the shared getter: its code and message as they are. */
static int int_field(const bson_iter_t *it, const char *path, int64_t lo, char *err,
		     size_t errlen, int64_t *out)
{
	sdb_bson_err e;

	if (sdb_bson_get_int64(it, path, lo, INT64_MAX, out, &e) == 0)
		return 0;
	snprintf(err, errlen, "%s", e.msg);
	return e.code;
}

/* max_time_ms_parser.cpp parseMaxTimeMS: a number in [0, INT32_MAX], integral (2 BadValue) */
static int check_max_time(const bson_iter_t *it, const char *field, char *err, size_t errlen)
{
	double d;

	switch (bson_iter_type(it)) {
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
		if (bson_iter_as_int64(it) < 0 || bson_iter_as_int64(it) > INT32_MAX)
			goto out_of_range;
		return 0;
	case BSON_TYPE_DOUBLE:
		d = bson_iter_double(it);
		if (isnan(d))
			goto non_integral;
		if (d < 0 || d >= (double)INT32_MAX + 1.0)
			goto out_of_range;
		if (d != trunc(d))
			goto non_integral;
		return 0;
	default:
		snprintf(err, errlen, "%s must be a number", field);
		return CODE_BAD_VALUE;
	}
out_of_range:
	snprintf(err, errlen, "%s is out of range", field);
	return CODE_BAD_VALUE;
non_integral:
	snprintf(err, errlen, "%s has non-integral value", field);
	return CODE_BAD_VALUE;
}

/* write_concern_options.cpp: a malformed writeConcern is 9 FailedToParse; the rules of the
 * shard's repl_wc_parse (w a number in [0, 50] or "majority" (another mode: 79
 * UnknownReplWriteConcern), wtimeout an integer in [0, INT32_MAX] ms, j and fsync bool or
 * number; any other field but provenance and getLastError: 9). */
static int check_write_concern(const bson_iter_t *wc, char *err, size_t errlen)
{
	bson_iter_t it;

	if (!BSON_ITER_HOLDS_DOCUMENT(wc) || !bson_iter_recurse(wc, &it)) {
		snprintf(err, errlen, "writeConcern must be an object");
		return CODE_FAILED_TO_PARSE;
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		double d = BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_double(&it) : NAN;

		/* as the shard's repl_wc_parse: a proxy splitting a sharded write would
		 * otherwise accept what a shard refuses (a fresh user's find) */
		if (strcmp(k, "w") != 0 && strcmp(k, "wtimeout") != 0 &&
		    strcmp(k, "wtimeoutMS") != 0 && strcmp(k, "j") != 0 && strcmp(k, "fsync") != 0 &&
		    strcmp(k, "provenance") != 0 && strcmp(k, "getLastError") != 0) {
			snprintf(err, errlen, "unrecognized write concern field: %s", k);
			return CODE_FAILED_TO_PARSE;
		}
		if (strcmp(k, "w") == 0 && BSON_ITER_HOLDS_UTF8(&it) &&
		    strcmp(bson_iter_utf8(&it, NULL), "majority") != 0) {
			/* a mode the shards cannot honour (no tag sets), refused whole before a
			 * proxy splits the write (it would come back per document) */
			snprintf(err, errlen,
				 "unrecognized write concern mode: %s (tag sets are not supported; "
				 "use a number or \"majority\")",
				 bson_iter_utf8(&it, NULL));
			return CODE_UNKNOWN_REPL_WRITE_CONCERN;
		}
		if (strcmp(k, "w") == 0 && !BSON_ITER_HOLDS_UTF8(&it)) {
			if (!BSON_ITER_HOLDS_NUMBER(&it)) {
				snprintf(err, errlen, "w has to be a number or a string");
				return CODE_FAILED_TO_PARSE;
			}
			if (!(d >= 0 && d <= 50 && d == trunc(d))) {
				snprintf(err, errlen, "w has to be a non-negative integer not greater "
						      "than 50, or \"majority\"");
				return CODE_FAILED_TO_PARSE;
			}
		} else if ((strcmp(k, "wtimeout") == 0 || strcmp(k, "wtimeoutMS") == 0) &&
			   !(d >= 0 && d <= INT32_MAX && d == trunc(d))) {
			snprintf(err, errlen, "wtimeout must be a non-negative integer (ms)");
			return CODE_FAILED_TO_PARSE;
		} else if ((strcmp(k, "j") == 0 || strcmp(k, "fsync") == 0) &&
			   !BSON_ITER_HOLDS_BOOL(&it) && !BSON_ITER_HOLDS_NUMBER(&it)) {
			snprintf(err, errlen, "%s must be numeric or a boolean value", k);
			return CODE_FAILED_TO_PARSE;
		}
	}
	return 0;
}

/* "a.b" into out (size bytes), cut short if it does not fit (a message only). */
static void join(char *out, size_t size, const char *a, const char *b)
{
	if (snprintf(out, size, "%s.%s", a, b) >= (int)size)
		out[size - 1] = '\0';
}

/* One field under `it`, named `path` in messages ("find.filter"), against its type. */
static int check_arg(const bson_iter_t *it, arg_type type, const char *path, char *err,
		     size_t errlen)
{
	bson_type_t t = bson_iter_type(it);
	bson_iter_t sub;
	char subpath[160];
	int64_t v;
	int code;

	switch (type) {
	case ARG_OBJECT:
		return t == BSON_TYPE_DOCUMENT ? 0 : wrong_type(it, path, "type 'object'", err, errlen);
	case ARG_ARRAY:
		return t == BSON_TYPE_ARRAY ? 0 : wrong_type(it, path, "type 'array'", err, errlen);
	case ARG_STRING:
		return t == BSON_TYPE_UTF8 ? 0 : wrong_type(it, path, "type 'string'", err, errlen);
	case ARG_BOOL:
		return t == BSON_TYPE_BOOL || BSON_ITER_HOLDS_NUMBER(it)
			       ? 0
			       : wrong_type(it, path, "types '[bool, long, int, double]'", err,
					    errlen);
	case ARG_HINT:
		return t == BSON_TYPE_DOCUMENT || t == BSON_TYPE_UTF8
			       ? 0
			       : wrong_type(it, path, "types '[string, object]'", err, errlen);
	case ARG_UUID:
		if (t != BSON_TYPE_BINARY)
			return wrong_type(it, path, "type 'binData'", err, errlen);
		{
			bson_subtype_t st;
			uint32_t len;
			const uint8_t *data;

			bson_iter_binary(it, &st, &len, &data);
			if (st != BSON_SUBTYPE_UUID || len != 16) {
				snprintf(err, errlen,
					 "BSON field '%s' is the wrong binData type '%d', expected type "
					 "'4'",
					 path, (int)st);
				return CODE_TYPE_MISMATCH;
			}
		}
		return 0;
	case ARG_UPDATE:
		return t == BSON_TYPE_DOCUMENT || t == BSON_TYPE_ARRAY
			       ? 0
			       : wrong_type(it, path, "types '[object, array]'", err, errlen);
	case ARG_INT:
		return int_field(it, path, INT64_MIN, err, errlen, &v);
	case ARG_UINT:
		return int_field(it, path, 0, err, errlen, &v);
	case ARG_CURSOR_ID:
		return t == BSON_TYPE_INT64 ? 0 : wrong_type(it, path, "type 'long'", err, errlen);
	case ARG_CURSOR_IDS:
		if (t != BSON_TYPE_ARRAY || !bson_iter_recurse(it, &sub))
			return wrong_type(it, path, "type 'array'", err, errlen);
		while (bson_iter_next(&sub)) {
			join(subpath, sizeof subpath, path, bson_iter_key(&sub));
			if (!sdb_bson_as_int64_exact(&sub, &v))
				return wrong_type(&sub, subpath, "type 'long'", err, errlen);
		}
		return 0;
	case ARG_MAX_TIME:
		return check_max_time(it, bson_iter_key(it), err, errlen);
	case ARG_WC:
		return check_write_concern(it, err, errlen);
	case ARG_CURSOR:
		if (t != BSON_TYPE_DOCUMENT || !bson_iter_recurse(it, &sub))
			return wrong_type(it, path, "type 'object'", err, errlen);
		if (bson_iter_find(&sub, "batchSize")) {
			join(subpath, sizeof subpath, path, "batchSize");
			return int_field(&sub, subpath, 0, err, errlen, &v);
		}
		return 0;
	case ARG_GETMORE_BATCH:
		code = int_field(it, path, INT64_MIN, err, errlen, &v);
		if (code == 0 && v <= 0) {
			snprintf(err, errlen,
				 "Batch size for getMore must be positive, but received: %lld",
				 (long long)v);
			code = CODE_BAD_VALUE;
		}
		return code;
	case ARG_VERBOSITY:
		if (t != BSON_TYPE_UTF8)
			return wrong_type(it, path, "type 'string'", err, errlen);
		if (strcmp(bson_iter_utf8(it, NULL), "queryPlanner") != 0 &&
		    strcmp(bson_iter_utf8(it, NULL), "executionStats") != 0 &&
		    strcmp(bson_iter_utf8(it, NULL), "allPlansExecution") != 0) {
			/* idl_parser.cpp throwBadEnumValue */
			snprintf(err, errlen,
				 "Enumeration value '%s' for field '%s' is not a valid value.",
				 bson_iter_utf8(it, NULL), path);
			return CODE_BAD_VALUE;
		}
		return 0;
	case ARG_DELETE_LIMIT: {
		double d;
		if (!BSON_ITER_HOLDS_NUMBER(it))
			return wrong_type(it, path, "types '[long, int, double]'", err, errlen);
		/* write_ops.cpp readMultiDeleteProperty reads a double, so 0.5 is not 0 */
		d = bson_iter_as_double(it);
		if (d != 0 && d != 1) {
			snprintf(err, errlen, "The limit field in delete objects must be 0 or 1. Got %g",
				 d);
			return CODE_FAILED_TO_PARSE;
		}
		return 0;
	}
	}
	return 0;
}

/* Every field of doc that rules (and, when generic, generic_types) name, checked; where is
 * the message prefix ("find", "update.updates"). */
static int check_types(const bson_t *doc, const char *where, const arg_rule *rules,
		       bool generic, char *err, size_t errlen)
{
	bson_iter_t it;
	char path[160];

	if (!bson_iter_init(&it, doc))
		return 0;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		for (int pass = 0; pass < 2; pass++) {
			const arg_rule *r = pass == 0 ? rules : generic ? generic_types : NULL;
			for (; r != NULL && r->field != NULL; r++) {
				if (!same(r->field, k))
					continue;
				/* the "where.k" path only names the field in an error message:
				 * built (and the check run again for its message) only then,
				 * not for every field of every command (~1% of a proxy point
				 * read) */
				if (check_arg(&it, r->type, where, err, errlen) == 0)
					continue;
				join(path, sizeof path, where, k);
				int code = check_arg(&it, r->type, path, err, errlen);
				if (code != 0)
					return code;
			}
		}
	}
	return 0;
}

int sdb_cmd_unsupported_option(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	return sdb_cmd_check(name, cmd, false, err, errlen);
}

/* The fields cmd_check looks up by name, found in one pass over the command
 * (sdb_bson_find_fields, common/fieldscan.h): a lookup of a field the command does not
 * have walks every field (bson_iter_init_find), and ~15 such walks per command were ~2% of
 * a proxy point read (issue #19). OPT_ indexes opt_names; HAS(OPT_X) is its bit in
 * opt_fields.has and at[OPT_X].it is on its first occurrence when the bit is set (the element
 * a lookup by name would give). */
enum {
	OPT_TXN_NUMBER,
	OPT_AUTOCOMMIT,
	OPT_LET,
	OPT_ENCRYPTION,
	OPT_TIMESERIES,
	OPT_EXCHANGE,
	OPT_RUNTIME_CONSTANTS,
	OPT_NEEDS_MERGE,
	OPT_FROM_MONGOS,
	OPT_MIN,
	OPT_MAX,
	OPT_RETURN_KEY,
	OPT_SHOW_RECORD_ID,
	OPT_COLLECTION_UUID,
	OPT_DB,
	OPT_TO,
	OPT_VIEW_ON,
	OPT_WRITE_CONCERN,
	OPT_N
};
_Static_assert(OPT_N <= SDB_FIELDS_MAX, "cmd_check's fields fit one sdb_bson_find_fields");
#define HAS(opt) SDB_FIELD_BIT(opt)

static const char *const opt_names[OPT_N] = {
	[OPT_TXN_NUMBER] = "txnNumber",
	[OPT_AUTOCOMMIT] = "autocommit",
	[OPT_LET] = "let",
	[OPT_ENCRYPTION] = "encryptionInformation",
	[OPT_TIMESERIES] = "isTimeseriesNamespace",
	[OPT_EXCHANGE] = "exchange",
	[OPT_RUNTIME_CONSTANTS] = "runtimeConstants",
	[OPT_NEEDS_MERGE] = "needsMerge",
	[OPT_FROM_MONGOS] = "fromMongos",
	[OPT_MIN] = "min",
	[OPT_MAX] = "max",
	[OPT_RETURN_KEY] = "returnKey",
	[OPT_SHOW_RECORD_ID] = "showRecordId",
	[OPT_COLLECTION_UUID] = "collectionUUID",
	[OPT_DB] = "$db",
	[OPT_TO] = "to",
	[OPT_VIEW_ON] = "viewOn",
	[OPT_WRITE_CONCERN] = "writeConcern",
};

/* opt_names in a command: which occur, and each one's first occurrence. */
typedef struct opt_fields {
	uint64_t has;		  /* HAS(OPT_X) bits */
	sdb_field_iter at[OPT_N]; /* at[OPT_X].it valid when HAS(OPT_X) is set */
} opt_fields;

/* The field OPT_X of *f as a boolean (bson_iter_as_bool), false when absent. */
static bool opt_true(const opt_fields *f, int opt)
{
	return (f->has & HAS(opt)) && bson_iter_as_bool(&f->at[opt].it);
}

/* A namespace string with a NUL byte inside: C strings would stop at it and the command
 * would act on a shorter name (`renameCollection: "db.a\0x"` renamed db.a). Checked: the
 * command's first field when it is a string (the collection or namespace), renameCollection's
 * `to`, create's `viewOn` and `$db`. MongoDB refuses such names with 73 InvalidNamespace.
 * Returns: 0, or 73 with the message in err. */
static int nul_in_namespace(const bson_t *cmd, const opt_fields *f, char *err, size_t errlen)
{
	static const int named[] = {OPT_TO, OPT_VIEW_ON, OPT_DB};
	bson_iter_t it;
	uint32_t len;
	const char *v;

	if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it) &&
	    (v = bson_iter_utf8(&it, &len)) != NULL && strlen(v) != len) {
		snprintf(err, errlen, "Invalid namespace specified '%s': a name contains a null byte",
			 v);
		return CODE_INVALID_NAMESPACE;
	}
	for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
		if ((f->has & HAS(named[i])) && BSON_ITER_HOLDS_UTF8(&f->at[named[i]].it) &&
		    (v = bson_iter_utf8(&f->at[named[i]].it, &len)) != NULL && strlen(v) != len) {
			snprintf(err, errlen,
				 "Invalid namespace specified '%s' (%s): a name contains a null byte",
				 v, opt_names[named[i]]);
			return CODE_INVALID_NAMESPACE;
		}
	return 0;
}

/* Fields of the 6.0 IDL that stripedb knows but does not honour, refused rather than
 * ignored (issue #20): encryptionInformation (Queryable Encryption, rewritten by mongod),
 * isTimeseriesNamespace: true (a mongos-rewritten time-series request; stripedb has no
 * time-series collections): 238. An aggregate's internal fields, as mongos
 * (cluster_aggregate.cpp) refuses them from a client: exchange 51028, runtimeConstants
 * 51143, needsMerge or fromMongos true 51089; a shard (internal) refuses exchange and
 * needsMerge: true with 238, since it has no exchange and never answers in the merge
 * format (no role of ours sends them). f: the command's opt_fields. Returns: 0 or the code,
 * the message in err. */
static int not_honoured(const char *name, const opt_fields *f, bool internal, char *err,
			size_t errlen)
{
	if (f->has & HAS(OPT_ENCRYPTION)) {
		snprintf(err, errlen,
			 "BSON field '%s.encryptionInformation' is not supported by stripedb: it "
			 "has no Queryable Encryption (see docs/compat.md)",
			 name);
		return CODE_NOT_IMPLEMENTED;
	}
	if (opt_true(f, OPT_TIMESERIES)) {
		snprintf(err, errlen,
			 "BSON field '%s.isTimeseriesNamespace' is not supported by stripedb: it "
			 "has no time-series collections",
			 name);
		return CODE_NOT_IMPLEMENTED;
	}
	if (strcmp(name, "aggregate") != 0 ||
	    !(f->has & (HAS(OPT_EXCHANGE) | HAS(OPT_RUNTIME_CONSTANTS) | HAS(OPT_NEEDS_MERGE) |
			HAS(OPT_FROM_MONGOS))))
		return 0;
	if (!internal) {
		if (f->has & HAS(OPT_EXCHANGE)) {
			snprintf(err, errlen, "Cannot specify exchange option to a mongos");
			return 51028;
		}
		if (f->has & HAS(OPT_RUNTIME_CONSTANTS)) {
			snprintf(err, errlen, "Cannot specify runtime constants option to a mongos");
			return 51143;
		}
		if (opt_true(f, OPT_NEEDS_MERGE) || opt_true(f, OPT_FROM_MONGOS)) {
			snprintf(err, errlen, "Internal parameter(s) [needsMerge, fromMongos] cannot "
					      "be set to 'true' when sent to mongos");
			return 51089;
		}
		return 0;
	}
	if ((f->has & HAS(OPT_EXCHANGE)) || opt_true(f, OPT_NEEDS_MERGE)) {
		snprintf(err, errlen,
			 "aggregate's internal %s is not supported by a stripedb shard: it never "
			 "answers in a merge format",
			 (f->has & HAS(OPT_EXCHANGE)) ? "exchange" : "needsMerge");
		return CODE_NOT_IMPLEMENTED;
	}
	return 0;
}

/* sdb_cmd_check; explained: cmd is the command an explain explains, whose own writeConcern
 * mongod never looks at (only the explain's: service_entry_point_common.cpp checks the
 * request's body against the outer invocation's supportsWriteConcern(), false for explain;
 * the inner command's IDL parser takes writeConcern as a generic argument, and explaining
 * runs no write), so an explained find, delete or aggregate accepts one alike. */
static int cmd_check(const char *name, const bson_t *cmd, bool internal, bool explained,
		     char *err, size_t errlen);

int sdb_cmd_check(const char *name, const bson_t *cmd, bool internal, char *err, size_t errlen)
{
	return cmd_check(name, cmd, internal, false, err, errlen);
}

static int cmd_check(const char *name, const bson_t *cmd, bool internal, bool explained,
		     char *err, size_t errlen)
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
	opt_fields f;
	/* cannot fail: OPT_N <= SDB_FIELDS_MAX (asserted above) */
	(void)sdb_bson_find_fields(cmd, opt_names, OPT_N, &f.has, f.at);
	/* a transaction's statement (autocommit: false) is not a retryable write */
	bool retryable = (f.has & HAS(OPT_TXN_NUMBER)) && !(f.has & HAS(OPT_AUTOCOMMIT));
	static const char *const with_let[] = {"find",	 "aggregate",	  "update",
					       "delete", "findAndModify", "findandmodify"};
	bool let_ok = false;
	const char *unknown = unknown_field(name, cmd, internal);
	int code;

	if ((code = nul_in_namespace(cmd, &f, err, errlen)) != 0)
		return code;

	/* `let` (MongoDB 5.0) is honoured by find, aggregate, update, delete and findAndModify
	 * (storage/pipeline.h sdb_let_parse); no other command has it */
	for (size_t i = 0; i < sizeof with_let / sizeof with_let[0]; i++)
		let_ok = let_ok || strcmp(with_let[i], name) == 0;
	if (unknown == NULL && !let_ok && (f.has & HAS(OPT_LET)))
		unknown = "let";
	if (unknown != NULL) {
		snprintf(err, errlen, "BSON field '%s.%s' is an unknown field.", name, unknown);
		return CODE_UNKNOWN_FIELD;
	}
	if ((code = not_honoured(name, &f, internal, err, errlen)) != 0)
		return code;
	/* find options that shape what is returned and that no role implements: refused,
	 * never ignored (a max bound ignored returned every document; a fresh user's find) */
	if (strcmp(name, "find") == 0 &&
	    (f.has &
	     (HAS(OPT_MIN) | HAS(OPT_MAX) | HAS(OPT_RETURN_KEY) | HAS(OPT_SHOW_RECORD_ID)))) {
		if (f.has & (HAS(OPT_MIN) | HAS(OPT_MAX))) {
			snprintf(err, errlen, "find's min and max (index key bounds) are not supported "
					      "by stripedb: use a filter on the indexed fields");
			return CODE_NOT_IMPLEMENTED;
		}
		if (opt_true(&f, OPT_RETURN_KEY) || opt_true(&f, OPT_SHOW_RECORD_ID)) {
			snprintf(err, errlen, "find's returnKey and showRecordId are not supported by "
					      "stripedb: use a projection");
			return CODE_NOT_IMPLEMENTED;
		}
	}
	/* collectionUUID on the index commands and in an explained command: a shard checks it
	 * on the CRUD commands and drop (src/shard/commands.c), not there: refused, never
	 * ignored */
	if ((explained || strcmp(name, "createIndexes") == 0 || strcmp(name, "dropIndexes") == 0 ||
	     strcmp(name, "deleteIndexes") == 0) &&
	    (f.has & HAS(OPT_COLLECTION_UUID))) {
		snprintf(err, errlen, "collectionUUID on %s%s is not supported by stripedb",
			 explained ? "an explained " : "", name);
		return CODE_NOT_IMPLEMENTED;
	}
	/* listDatabases runs on admin only (list_databases.cpp: 13 Unauthorized) */
	if (strcmp(name, "listDatabases") == 0 && (f.has & HAS(OPT_DB)) &&
	    BSON_ITER_HOLDS_UTF8(&f.at[OPT_DB].it) &&
	    strcmp(bson_iter_utf8(&f.at[OPT_DB].it, NULL), "admin") != 0) {
		snprintf(err, errlen, "listDatabases may only be run against the admin database.");
		return CODE_UNAUTHORIZED;
	}
	/* before the types: mongod refuses any writeConcern of such a command, well-formed or
	 * not, without parsing it (uassertCommandDoesNotSpecifyWriteConcern) */
	if (!explained && (f.has & HAS(OPT_WRITE_CONCERN)) &&
	    (code = sdb_cmd_write_concern_check(name, cmd, err, errlen)) != 0)
		return code;
	const arg_rule *rules = command_types(name);
	if (rules != NULL && (code = check_types(cmd, name, rules, true, err, errlen)) != 0)
		return code;
	code = scan(cmd, NULL, false, false, false, collated(name), err, errlen);
	if (code != 0)
		return code;
	if (strcmp(name, "explain") == 0 && bson_iter_init_find(&it, cmd, "explain") &&
	    sdb_bson_iter_doc(&it, &sub)) {
		bson_iter_t first;
		if (bson_iter_init(&first, &sub) && bson_iter_next(&first))
			return cmd_check(bson_iter_key(&first), &sub, internal, true, err,
					 errlen);
		return 0;
	}
	for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
		if (strcmp(arrays[i].cmd, name) != 0 || !bson_iter_init_find(&it, cmd, arrays[i].array) ||
		    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
			continue;
		while (bson_iter_next(&arr)) {
			bool stmt = strcmp(arrays[i].cmd, "createIndexes") != 0;

			if (!sdb_bson_iter_doc(&arr, &sub))
				continue;
			if (stmt && (unknown = unknown_stmt_field(&sub, arrays[i].update,
								  internal)) != NULL) {
				snprintf(err, errlen, "BSON field '%s.%s' is an unknown field.",
					 arrays[i].where, unknown);
				return CODE_UNKNOWN_FIELD;
			}
			if (stmt && (code = check_types(&sub, arrays[i].where,
							arrays[i].update ? update_stmt_types
									 : delete_stmt_types,
							false, err, errlen)) != 0)
				return code;
			/* statements and createIndexes' indexes honour their collation */
			code = scan(&sub, arrays[i].where, arrays[i].update,
				    strcmp(arrays[i].cmd, "delete") == 0, retryable, true, err,
				    errlen);
			if (code != 0)
				return code;
		}
	}
	return 0;
}

/* ---- the API parameters (issue #20) ----
 * MongoDB 6.0 initialize_api_parameters.cpp initializeAPIParameters, run for every command
 * but the internal ones (skipApiVersionCheck: server to server) before the command parses:
 * the types (IDL struct APIParametersFromClient: apiVersion a string, apiStrict and
 * apiDeprecationErrors bools: 14), apiStrict or apiDeprecationErrors present (true or false)
 * without apiVersion: 4886600, an apiVersion other than "1": 322 APIVersionError, and with
 * apiStrict: true a command outside API Version 1: 323 APIStrictError. The commands of API
 * Version 1 are those whose IDL or Command class declares `api_version: "1"` (kApiVersions1)
 * in 6.0. No 6.0 command is deprecated in Version 1, so apiDeprecationErrors: true refuses
 * nothing. */
static const char *const api_v1_commands[] = {
	"abortTransaction", "aggregate",     "authenticate",   "collMod",	   "commitTransaction",
	"count",	    "create",	     "createIndexes",  "delete",	   "drop",
	"dropDatabase",	    "dropIndexes",   "deleteIndexes",  "endSessions",	   "explain",
	"find",		    "findAndModify", "findandmodify",  "getMore",	   "hello",
	"isMaster",	    "ismaster",	     "insert",	       "killCursors",	   "listCollections",
	"listDatabases",    "listIndexes",   "ping",	       "refreshSessions", "update",
	/* authentication: accepted under apiStrict, as `authenticate` (a driver may send its
	 * API parameters with the handshake's SCRAM conversation) */
	"saslStart", "saslContinue", NULL};

#define CODE_API_VERSION_ERROR 322 /* APIVersionError */
#define CODE_API_STRICT_ERROR 323  /* APIStrictError */
#define CODE_API_PARAM_WITHOUT_VERSION 4886600

static const struct {
	const char *field;
	bson_type_t type;
	const char *expected;
} api_params[] = {{"apiVersion", BSON_TYPE_UTF8, "string"},
		  {"apiStrict", BSON_TYPE_BOOL, "bool"},
		  {"apiDeprecationErrors", BSON_TYPE_BOOL, "bool"}};
#define N_API_PARAMS (sizeof api_params / sizeof api_params[0])

/* The API parameters of a command, as one pass over its fields collects them: each one's
 * first occurrence. */
typedef struct api_fields {
	struct {
		bool found;
		bson_iter_t it;
	} at[N_API_PARAMS];
} api_fields;

/* Note the field under it in *a when it is an API parameter not seen before. Cheap for
 * the others: one byte compared. */
static inline void api_collect(api_fields *a, const char *k, const bson_iter_t *it)
{
	if (k[0] != 'a')
		return;
	for (size_t i = 0; i < N_API_PARAMS; i++)
		if (!a->at[i].found && strcmp(k, api_params[i].field) == 0) {
			a->at[i].found = true;
			a->at[i].it = *it;
			return;
		}
}

/* sdb_cmd_api_check on the parameters collected in *a. */
static int api_judge(const char *name, const api_fields *a, char *err, size_t errlen);

int sdb_cmd_api_check(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	bson_iter_t it;
	api_fields a;

	/* stripedb's own commands between roles: as mongod's internal commands */
	if (strncmp(name, "stripedb", 8) == 0)
		return 0;
	memset(&a, 0, sizeof a);
	/* the first occurrence of each, in one pass (three lookups of fields most commands
	 * do not have walked the command three times: issue #19) */
	if (bson_iter_init(&it, cmd))
		while (bson_iter_next(&it))
			api_collect(&a, bson_iter_key(&it), &it);
	return api_judge(name, &a, err, errlen);
}

/* ---- duplicate top-level fields (MongoDB's IDL parsers: 40413 IDLDuplicateField) ----
 * A set of the keys met so far, open addressing on xxHash's XXH3 of the key's bytes
 * (libxxhash): 64 slots on the stack hold the ~5-15 fields of a command (half full at most), a
 * command with more (a client may send thousands) grows it on the heap, so the pass stays
 * linear in the number of fields, never quadratic. The keys are pointers into the
 * command (valid while it is). */
typedef struct key_slot {
	const char *k; /* NULL: free */
	uint32_t len, hash;
} key_slot;

typedef struct key_set {
	key_slot *slots; /* local, or bson_malloc0'd when grown */
	uint32_t cap, n; /* cap a power of two; n < cap / 2 */
	key_slot local[64];
} key_set;

static uint32_t key_hash(const char *k, uint32_t len)
{
	return (uint32_t)XXH3_64bits(k, len);
}

/* Place a key known to be absent. */
static void key_place(key_slot *slots, uint32_t cap, const key_slot *s)
{
	uint32_t i = s->hash & (cap - 1);

	while (slots[i].k != NULL)
		i = (i + 1) & (cap - 1);
	slots[i] = *s;
}

/* Add k (len bytes) to *set. Returns: true when it was there already (a duplicate). */
static bool key_seen(key_set *set, const char *k, uint32_t len)
{
	key_slot s = {k, len, key_hash(k, len)};

	for (uint32_t i = s.hash & (set->cap - 1); set->slots[i].k != NULL;
	     i = (i + 1) & (set->cap - 1))
		if (set->slots[i].hash == s.hash && set->slots[i].len == len &&
		    memcmp(set->slots[i].k, k, len) == 0)
			return true;
	if ((set->n + 1) * 2 > set->cap) {
		uint32_t cap = set->cap * 2;
		key_slot *grown = bson_malloc0(cap * sizeof *grown);

		for (uint32_t i = 0; i < set->cap; i++)
			if (set->slots[i].k != NULL)
				key_place(grown, cap, &set->slots[i]);
		if (set->slots != set->local)
			bson_free(set->slots);
		set->slots = grown;
		set->cap = cap;
	}
	key_place(set->slots, set->cap, &s);
	set->n++;
	return false;
}

/* The first repeated key of the statement documents of an update's `updates` or a delete's
 * `deletes` (arr: at the array), or NULL; *stmts: the array's name. MongoDB's IDL parses
 * each statement as a struct (write_ops.idl UpdateOpEntry, DeleteOpEntry) and refuses a
 * repeated field of it as of the command ("BSON field 'update.updates.q' is a duplicate
 * field"). stripedb's roles must refuse it too: the proxy routes a statement by the first
 * `q` (every lookup takes the first occurrence) while a shard's parser kept the last one,
 * so {q: {_id: 1}, q: {_id: 150}, upsert: true} was routed to the chunk of 1 and upserted
 * _id 150 on that chunk's shard, which does not own it (a second document with that
 * _id in the cluster). */
static const char *stmt_dup(bson_iter_t *arr)
{
	enum { FEW = 16 }; /* a statement's keys compared pairwise up to this many */
	struct {
		const char *k;
		uint32_t len;
	} seen[FEW];
	bson_iter_t st;

	while (bson_iter_next(arr)) {
		uint32_t n = 0;

		if (!BSON_ITER_HOLDS_DOCUMENT(arr) || !bson_iter_recurse(arr, &st))
			continue; /* the command's own checks answer a statement of another type */
		/* a statement has a handful of fields (q, u, upsert, multi, ...): pairwise
		 * compares, no hashing, until there are more than FEW */
		while (bson_iter_next(&st)) {
			const char *k = bson_iter_key(&st);
			uint32_t len = bson_iter_key_len(&st);

			for (uint32_t i = 0; i < n; i++)
				if (seen[i].len == len && memcmp(seen[i].k, k, len) == 0)
					return k;
			if (n == FEW)
				break;
			seen[n].k = k;
			seen[n++].len = len;
		}
		if (n < FEW)
			continue;
		/* a statement of more than FEW fields (refused later by its parser anyway, but
		 * never a repeat accepted here): a hash set over all of them */
		key_set set;
		const char *dup = NULL;

		memset(set.local, 0, sizeof set.local);
		set.slots = set.local;
		set.cap = sizeof set.local / sizeof set.local[0];
		set.n = 0;
		(void)bson_iter_recurse(arr, &st);
		while (dup == NULL && bson_iter_next(&st))
			if (key_seen(&set, bson_iter_key(&st), bson_iter_key_len(&st)))
				dup = bson_iter_key(&st);
		if (set.slots != set.local)
			bson_free(set.slots);
		if (dup)
			return dup;
	}
	return NULL;
}

int sdb_cmd_fields_check(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	key_set set;
	api_fields a;
	bson_iter_t it;
	const char *dup = NULL;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return 0;
	memset(&a, 0, sizeof a);
	memset(set.local, 0, sizeof set.local);
	set.slots = set.local;
	set.cap = sizeof set.local / sizeof set.local[0];
	set.n = 0;
	/* the first field, the command's name, is not in the set: mongod's IDL parsers skip
	 * it (firstFieldFound) and answer a repeat of it as any other field they do not
	 * define (40415), which is left to the command's own checks */
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		/* lsid and $clusterTime again are let through: libmongoc, with which every
		 * role sends its commands to the others (DESIGN.md §2), appends its implicit
		 * session's lsid and its topology's $clusterTime after a command that carries
		 * its own (a proxy's forward of a client's retryable write; every command of a
		 * proxy to a replica-set shard, which gossips its cluster time), and the
		 * first, the command's, is the one every lookup takes */
		if (key_seen(&set, k, bson_iter_key_len(&it)) && strcmp(k, "lsid") != 0 &&
		    strcmp(k, "$clusterTime") != 0) {
			dup = k;
			break;
		}
		api_collect(&a, k, &it);
	}
	if (set.slots != set.local)
		bson_free(set.slots);
	if (dup != NULL) {
		snprintf(err, errlen, "BSON field '%s.%s' is a duplicate field", name, dup);
		return CODE_DUPLICATE_FIELD;
	}
	{
		const char *stmts = strcmp(name, "update") == 0	  ? "updates"
				    : strcmp(name, "delete") == 0 ? "deletes"
								  : NULL;
		bson_iter_t arr;

		if (stmts && bson_iter_init_find(&it, cmd, stmts) && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &arr) && (dup = stmt_dup(&arr)) != NULL) {
			snprintf(err, errlen, "BSON field '%s.%s.%s' is a duplicate field", name,
				 stmts, dup);
			return CODE_DUPLICATE_FIELD;
		}
	}
	/* stripedb's own commands between roles: as mongod's internal commands */
	if (strncmp(name, "stripedb", 8) == 0)
		return 0;
	return api_judge(name, &a, err, errlen);
}

static int api_judge(const char *name, const api_fields *a, char *err, size_t errlen)
{
	bson_iter_t it;
	char path[64];
	const char *version = NULL;
	bool strict = false, strict_or_dep = false;

	for (size_t i = 0; i < N_API_PARAMS; i++) {
		if (!a->at[i].found)
			continue;
		it = a->at[i].it;
		if (bson_iter_type(&it) != api_params[i].type) {
			snprintf(path, sizeof path, "APIParametersFromClient.%s", api_params[i].field);
			snprintf(err, errlen, "BSON field '%s' is the wrong type '%s', expected type '%s'",
				 path, sdb_bson_type_name(bson_iter_type(&it)), api_params[i].expected);
			return CODE_TYPE_MISMATCH;
		}
		if (i == 0)
			version = bson_iter_utf8(&it, NULL);
		else
			strict_or_dep = true;
		if (i == 1)
			strict = bson_iter_bool(&it);
	}
	if (strict_or_dep && version == NULL) {
		snprintf(err, errlen, "Provided apiStrict and/or apiDeprecationErrors without "
				      "passing apiVersion");
		return CODE_API_PARAM_WITHOUT_VERSION;
	}
	if (version != NULL && strcmp(version, "2") == 0) {
		snprintf(err, errlen, "Cannot accept API version 2");
		return CODE_API_VERSION_ERROR;
	}
	if (version != NULL && strcmp(version, "1") != 0) {
		snprintf(err, errlen, "API version must be \"1\"");
		return CODE_API_VERSION_ERROR;
	}
	if (strict && !listed(api_v1_commands, name)) {
		snprintf(err, errlen,
			 "Provided apiStrict:true, but the command %s is not in API Version 1. "
			 "Information on supported commands and migrations in API Version 1 can be "
			 "found at https://dochub.mongodb.org/core/manual-versioned-api",
			 name);
		return CODE_API_STRICT_ERROR;
	}
	return 0;
}

bool sdb_cmd_is_generic(const char *field)
{
	for (size_t i = 0; generic_fields[i]; i++)
		if (strcmp(generic_fields[i], field) == 0)
			return true;
	return false;
}
