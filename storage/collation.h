/* Collations (issue #20): MongoDB's `collation` option, with ICU as MongoDB does.
 *
 * A collation document {locale, caseLevel, caseFirst, strength, numericOrdering, alternate,
 * maxVariable, normalization, backwards, version} is parsed and validated as MongoDB 6.0's
 * CollatorFactoryICU::makeFromBSON (src/mongo/db/query/collation/collator_factory_icu.cpp)
 * does, with the same codes and messages:
 *   - locale missing: 4 NoSuchKey "Missing expected field \"locale\""; not a string: 14
 *     TypeMismatch; with a NUL byte: 2 BadValue; "" : 2 "Field 'locale' cannot be the empty
 *     string in: {...}"; a locale ICU does not know or would canonicalise: 2 BadValue
 *     "Field 'locale' is invalid in: {...}" (with ". Did you mean 'X'?" when ICU falls back to
 *     a locale other than root);
 *   - {locale: "simple"} with any other field: 9 FailedToParse "If locale=simple, no other
 *     fields should be present in: {...}";
 *   - caseLevel, numericOrdering, normalization, backwards not a bool: 14; caseFirst not
 *     "upper"/"lower"/"off", alternate not "non-ignorable"/"shifted", maxVariable not
 *     "punct"/"space": 9 FailedToParse "Field 'caseFirst' must be 'upper', 'lower', or
 *     'off'. Got: x"; strength not an integer 1..5: 9 "Field 'strength' must be an integer 1
 *     through 5. Got: 7" (a non-integral number: 2 BadValue, bsonExtractIntegerField);
 *   - version other than this ICU's: 161 IncompatibleCollationVersion;
 *   - an unknown field: 9 FailedToParse "Collation spec contains unknown field. Collation
 *     spec: {...}";
 *   - backwards: true with strength 1: 2 BadValue; caseFirst other than "off" with strength
 *     1 or 2 and caseLevel off: 2 BadValue (validateCollationSpec).
 * Defaults come from the locale's ICU collator (e.g. strength 3, alternate "non-ignorable",
 * maxVariable "punct"); sdb_collator_spec gives the whole spec as MongoDB reports it
 * (listCollections options.collation, listIndexes).
 *
 * Strings compare with ucol_strcollUTF8; sdb_collator_sort_key gives ICU's sort key (the
 * bytes memcmp-order as the collator orders, no 0x00 inside), which storage/keyenc.h uses for
 * sort keys, group keys and distinct. Invalid UTF-8 is compared with U+FFFD in its place.
 *
 * Collators are made once per distinct normalised spec and kept for the life of the process
 * (a process-wide cache behind a mutex). Once made, a UCollator is only read
 * (ucol_strcollIter, ucol_getSortKey), concurrently from any thread, as MongoDB shares one
 * ICU collator between operations. So a returned collator never needs freeing and stays
 * valid. The cache is not bounded: each distinct spec a client sends costs one collator
 * (tens of KB) until the process exits.
 */
#ifndef SDB_STORAGE_COLLATION_H
#define SDB_STORAGE_COLLATION_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/bsonval.h"
#include "storage/keyenc.h"

/* MongoDB error code of a collation version mismatch (error_codes.yml) */
#define SDB_CODE_INCOMPATIBLE_COLLATION_VERSION 161

typedef struct sdb_collator sdb_collator;

/* Parse the collation document at it (the value of a `collation` field). *out = NULL for the
 * simple collation ({locale: "simple"}), else the cached collator (never freed). Returns 0.
 * Errors: SDB_EINVAL with MongoDB's *code and message in err (list above; 14 when it is not an
 * object: "BSON field 'collation' is the wrong type ..."), SDB_EINTERNAL with *code 96
 * OperationFailed when ICU fails to open or configure a collator. */
int sdb_collation_parse(const bson_iter_t *it, const sdb_collator **out, int *code, char *err,
			size_t errlen);

/* The same for a collation document given as a bson_t. Returns: as sdb_collation_parse. */
int sdb_collation_parse_doc(const bson_t *spec, const sdb_collator **out, int *code, char *err,
			    size_t errlen);

/* The full spec of c as MongoDB reports it ({locale, caseLevel, caseFirst, strength,
 * numericOrdering, alternate, maxVariable, normalization, backwards, version}); for NULL
 * (simple) {locale: "simple"}. Borrowed, valid for the life of the process. */
const bson_t *sdb_collator_spec(const sdb_collator *c);

/* Compare two UTF-8 strings (byte lengths; no NUL needed). NULL c compares bytes.
 * Returns: <0, 0, >0. */
int sdb_collator_cmp(const sdb_collator *c, const char *a, size_t alen, const char *b,
		     size_t blen);

/* Append the ICU sort key of the UTF-8 string s (len bytes) to out, without ICU's final
 * 0x00: the appended bytes never contain 0x00, and memcmp order of two keys is the
 * collator's order of the strings (equal strings under c give identical keys). */
void sdb_collator_sort_key(const sdb_collator *c, const char *s, size_t len, sdb_key *out);

/* The hook common/bsonval.h's comparisons use (for sdb_bson_collator_set); NULL for NULL. */
const sdb_bson_collator *sdb_collator_hook(const sdb_collator *c);

/* The calling thread's collation as set by sdb_collation_use (NULL: simple). */
const sdb_collator *sdb_collation_current(void);

/* Make c the calling thread's collation (sdb_bson_collator_set). Returns: the previous one,
 * to restore with another sdb_collation_use when the command ends. */
const sdb_collator *sdb_collation_use(const sdb_collator *c);

/* Is the spec at it the simple collation, i.e. exactly {locale: "simple"}? (A malformed or
 * any other spec: false.) */
bool sdb_collation_is_simple_spec(const bson_iter_t *it);

#endif
