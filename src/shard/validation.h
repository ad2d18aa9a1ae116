/* Document validation on the shard (issue #20): a collection's validator, validationLevel
 * and validationAction (stored in its catalog options by create and collMod), enforced by
 * insert, update (and upserts), findAndModify as mongod 6.0 does
 * (src/mongo/db/catalog/collection_impl.cpp checkValidation; storage/validator.h evaluates
 * the validator and builds errInfo.details), and the collMod command
 * (src/mongo/db/catalog/coll_mod.cpp). */
#ifndef SDB_SHARD_VALIDATION_H
#define SDB_SHARD_VALIDATION_H

#include <bson/bson.h>
#include <stdbool.h>

#include "shard/shard.h"
#include "storage/validator.h"

/* A write command's view of its collection's validation: v NULL when nothing is checked
 * (no validator, validationLevel "off", bypassDocumentValidation, a migration's write). */
struct shard_vcache_ent;
typedef struct shard_valid {
	sdb_validator *v;		/* shared with the compiled-validator cache (below) */
	struct shard_vcache_ent *ent; /* its cache entry (a reference, dropped by close) */
	bool moderate; /* validationLevel "moderate": updates of invalid documents pass */
	bool warn;     /* validationAction "warn": log and write */
	/* the collection's default collation, under which the validator compares strings
	 * (mongod parses a validator with the collection's collator); NULL: simple */
	const struct sdb_collator *coll;
	char ns[256];
} shard_valid;

/* Check one validation option of create or collMod (cmd: "create" / "collMod" for the
 * messages): `validator` an object that compiles, `validationLevel` "off" / "strict" /
 * "moderate", `validationAction` "error" / "warn"; db.coll the collection (NULL: not
 * checked): a non-empty validator on a system.* collection or in admin/local/config is 72
 * InvalidOptions, as mongod's parseValidator. Returns: 0, or MongoDB's code (14
 * TypeMismatch, 2 BadValue, 72 InvalidOptions, the validator's parse code) with the message
 * in err. */
int shard_valid_check_opt(const bson_iter_t *it, const char *cmd, const char *db,
			  const char *coll, char *err, size_t errlen);

/* Set sv up for writes to db.coll (x->db) inside the command's open transaction. The
 * compiled validator comes from a process-wide cache keyed by the collection's UUID and the
 * validator's bytes (a collMod that changes it misses the cache), so a write command does
 * not recompile it (an enum of 100,000 values). Returns:
 * true, or false after replying the error (a stored validator that no longer compiles). */
bool shard_valid_open(shard_ctx *x, const char *coll, shard_valid *sv);

/* Validate doc, the new version of old (NULL for an insert or an upsert's new document).
 * Returns: 0 (valid, not checked, or only warned about), or 121 DocumentValidationFailure
 * with "Document failed validation" in x->err and x->err_info set to the errInfo document
 * {failingDocumentId, details} (heap; taken by the code that replies); a validator whose
 * evaluation throws (a $expr dividing by zero) fails the document the same way (121, with
 * the error in details), as mongod 6.0; or 2 BadValue when a $jsonSchema regex hits
 * PCRE2's match limit (message in x->err). */
int shard_valid_doc(shard_ctx *x, const shard_valid *sv, const bson_t *old, const bson_t *doc);

void shard_valid_close(shard_valid *sv);

/* The largest errInfo one failure carries (bytes): beyond it, and in a write reply once
 * SHARD_VALID_INFO_BUDGET bytes of errInfo were reported, the errInfo is truncated (as
 * mongod truncates a detailed error that would not fit a reply). */
#define SHARD_VALID_INFO_MAX (1024 * 1024)
#define SHARD_VALID_INFO_BUDGET (4 * 1024 * 1024)

/* A new errInfo {failingDocumentId, details: {operatorName, reason: "details omitted: ..."}}
 * from info (a full errInfo), for replies that cannot carry the full one. Caller
 * bson_destroys it. */
bson_t *shard_valid_info_truncated(const bson_t *info);

/* collMod: validator, validationLevel, validationAction; index {keyPattern | name, hidden,
 * expireAfterSeconds}; viewOn/pipeline of a view. A replicated command (one Raft entry,
 * one "c" oplog entry {collMod: coll, ...} as mongod's). */
void shard_cmd_coll_mod(shard_ctx *x);

#endif
