/* Document validation (issue #20): a collection's `validator`, as MongoDB 6.0's
 * (src/mongo/db/catalog/collection_impl.cpp parseValidator, the query language of
 * storage/matcher.h plus `$jsonSchema`, src/mongo/db/matcher/schema/json_schema_parser.cpp)
 * and the detailed `errInfo.details` of a failed validation (MongoDB 5.0+,
 * src/mongo/db/matcher/doc_validation_error.cpp).
 *
 * A validator is a query filter. Its top-level clauses, and the members of a top-level
 * `$and` / `$or` / `$nor` (recursively), are evaluated one by one so that the failing ones can
 * be reported; each other clause is compiled with storage/matcher.h (`$expr` included).
 * `$jsonSchema` is accepted at those places (not under `$not` or `$elemMatch`, where the
 * matcher refuses it). Supported keywords: bsonType, type, required, properties,
 * patternProperties, additionalProperties, minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum, multipleOf, minLength, maxLength, pattern, enum, items, additionalItems,
 * minItems, maxItems, uniqueItems, minProperties, maxProperties, allOf, anyOf, oneOf, not,
 * dependencies, title, description; `$ref`, `$schema`, `default`, `definitions`, `format`,
 * `id` are FailedToParse "$jsonSchema keyword 'format' is not currently supported", any
 * other keyword FailedToParse "Unknown $jsonSchema keyword: x", as mongod.
 *
 * The details document: {operatorName: "$jsonSchema", schemaRulesNotSatisfied: [...]} for a
 * schema, {operatorName: "$gt", specifiedAs: {a: {$gt: 0}}, reason, consideredValue} for a
 * query leaf, {operatorName: "$and" | "$or" | "$nor", clausesNotSatisfied: [{index,
 * details}]} for several clauses. The reasons are MongoDB's where known; the shape of deep
 * schema rules is close to, not byte-equal with, mongod's.
 *
 * A compiled validator is immutable: check may be called from several threads at once. */
#ifndef SDB_STORAGE_VALIDATOR_H
#define SDB_STORAGE_VALIDATOR_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sdb_validator sdb_validator;

/* Compile validator (a document; {} accepts everything). On success *out (free with
 * sdb_validator_free); validator is copied. Errors: SDB_EINVAL with *code (MongoDB's: 2
 * BadValue for an unknown operator, 9 FailedToParse / 14 TypeMismatch for a bad $jsonSchema,
 * the matcher's codes otherwise) and the message in err, prefixed as mongod's
 * "Parsing of collection validator failed :: caused by :: ". */
int sdb_validator_new(const bson_t *validator, sdb_validator **out, int *code, char *err,
		      size_t errlen);

/* Does doc satisfy v? Returns 1 yes, 0 no; with details != NULL and 0, *details is
 * initialised to the failure's details document (the caller bson_destroys it; untouched on
 * 1). Errors: SDB_EINVAL when a $expr's evaluation fails (*code, err: the caller treats the
 * document as failing validation, as mongod 6.0's checkValidation); SDB_ETOOBIG when a
 * $jsonSchema pattern / patternProperties regex hits PCRE2's match or depth limit (*code 2
 * BadValue, err): an error of the write, never a silent pass. The regexes are compiled once
 * by sdb_validator_new. */
int sdb_validator_check(const sdb_validator *v, const bson_t *doc, bson_t *details, int *code,
			char *err, size_t errlen);

void sdb_validator_free(sdb_validator *v);

#endif
