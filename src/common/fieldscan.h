/* Several top-level fields of a BSON document (a command), looked up in one pass.
 *
 * bson_iter_init_find walks the document from its start until it meets the name, so a
 * lookup of a field the document does not have walks all of it (each bson_iter_next is
 * ~100 instructions). A command handler that asks for many options a command seldom has
 * (the option checks of cmdopts.c, the proxy's request checks and find's arguments) paid
 * one walk per name (issue #19). sdb_bson_find_fields walks the document once and answers
 * for every name: which occur, and an iterator on each one's first occurrence.
 */
#ifndef SDB_COMMON_FIELDSCAN_H
#define SDB_COMMON_FIELDSCAN_H

#include <bson/bson.h>
#include <stddef.h>
#include <stdint.h>

/* The most names one sdb_bson_find_fields call takes: one bit each of its uint64_t mask. */
#define SDB_FIELDS_MAX 64

/* Bit i of sdb_bson_find_fields's *found: names[i] occurs. */
#define SDB_FIELD_BIT(i) ((uint64_t)1 << (i))

/* One answer slot of sdb_bson_find_fields: an iterator on a field found. A struct because
 * bson_iter_t is declared 128-byte aligned with an 80-byte size, and C refuses an array of
 * it ("alignment of array elements is greater than element size"). */
typedef struct sdb_field_iter {
	bson_iter_t it;
} sdb_field_iter;

/* Look up the top-level fields names[0..n) of doc in one pass over doc.
 *
 * names: n NUL-terminated key names (n <= SDB_FIELDS_MAX), compared byte for byte
 * (case-sensitive, as bson_iter_init_find). A name of two or more bytes that ends in '*'
 * is a prefix: it matches every key that begins with the bytes before the '*' ("$stripedb*"
 * matches "$stripedb" and "$stripedbOrigin"); any other name matches only the key equal
 * to it (a lone "*" is the key "*"). A name that is a prefix of another key without '*'
 * does not match it ("to" never matches "tomorrow"). A key may match several names, and
 * each name is answered on its own.
 * found: set to the mask of the names that occur, bit i (SDB_FIELD_BIT(i)) for names[i].
 * its: NULL, or an array of n slots: for every name that occurs, its[i].it is left on its
 * first occurrence, the element bson_iter_init_find(name) gives (bson_iter_key(&its[i].it)
 * says which key a prefix name met); the others are not written. The iterators point into
 * doc's bytes: valid while doc is, and the caller owns nothing new (no destroy).
 *
 * Duplicate keys: the first occurrence of a name is the one reported and later ones are
 * not looked at, which is what bson_iter_init_find, and so every single lookup elsewhere
 * in stripedb, takes. MongoDB itself refuses a duplicate field its IDL parser knows
 * ("BSON field 'find.filter' is a duplicate field", 40413); where stripedb does not refuse
 * one, the first wins everywhere alike, so a check on one occurrence and a use of another
 * cannot disagree.
 *
 * The pass stops early when every name has been found. A document whose bytes end early
 * (bson_iter_next stops) answers for the fields before that point. Thread-safe: no state.
 * Returns: 0, or SDB_EINVAL when n > SDB_FIELDS_MAX or names is NULL with n > 0 (*found
 * is then 0 and nothing is looked up). */
int sdb_bson_find_fields(const bson_t *doc, const char *const *names, size_t n,
			 uint64_t *found, sdb_field_iter *its);

#endif
