/* Internals shared by storage/validator.c (clauses, the validator's API, the regex cache)
 * and storage/validator_schema.c ($jsonSchema). Not for use outside the validator. */
#ifndef SDB_STORAGE_VALIDATOR_INT_H
#define SDB_STORAGE_VALIDATOR_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>

#include <bson/bson.h>

#define C_BAD_VALUE 2
#define C_FAILED_TO_PARSE 9
#define C_TYPE_MISMATCH 14
#define C_REGEX_INVALID 51091

/* Failing rules are appended to an array being built (arr, its next index n); a NULL
 * rules pointer when only the verdict is wanted. */
typedef struct rules {
	bson_t *arr;
	uint32_t n;
} rules;

/* Write MongoDB's code c into *code (when not NULL) and the message into err. Returns:
 * SDB_EINVAL, always (for `return vd_failf(...)`). */
int vd_failf(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* The embedded document or array at it as a heap bson_t (caller destroys), NULL if it is
 * neither. */
bson_t *vd_iter_doc(const bson_iter_t *it);
/* A static view of the document or array at it in *out. Returns: false when it is neither. */
bool vd_sub_static(const bson_iter_t *it, bson_t *out);
/* Is t a numeric BSON type (int32, int64, double, decimal128)? */
bool vd_is_num(bson_type_t t);
/* The number at it as a double (decimals through their nearest double). */
double vd_num_of(const bson_iter_t *it);
/* Compile pat (PCRE2, MongoDB's options) for a schema's check; NULL with PCRE2's message in
 * msg when it does not compile. The caller frees it with pcre2_code_free. */
pcre2_code *vd_regex_compile(const char *pat, char *msg, size_t msglen);
/* Does the UTF-8 string s (len bytes) match pat? Uses the validator's compiled cache (the
 * thread's, set by sdb_validator_check) under PCRE2 match limits; a limit hit is recorded
 * and fails the check (2). */
bool vd_regex_test(const char *pat, const char *s, size_t len);
/* JSON Schema's multipleOf: is the number at val an exact multiple of the one at div
 * (decimal arithmetic)? */
bool vd_multiple_of(const bson_iter_t *val, const bson_iter_t *div);
/* Does the array at arr hold two equal values (MongoDB's comparison)? *dup: the second
 * one; *n_out: the element count. Sorts a copy: O(n log n). */
bool vd_array_has_duplicate(const bson_iter_t *arr, bson_iter_t *dup, size_t *n_out);

/* Check a $jsonSchema (nested depth levels deep) as MongoDB's parser does. Returns: 0, or
 * SDB_EINVAL with MongoDB's code (2, 9, 14, 51091 ...) in *code and the message in err. */
int vd_js_check(const bson_t *schema, int depth, int *code, char *err, size_t errlen);
/* Does the value at val satisfy schema (top: val is the whole document)? The failing rules
 * go to out (NULL: the verdict only). */
bool vd_js_eval(const bson_t *schema, const bson_iter_t *val, bool top, rules *out);

#endif
