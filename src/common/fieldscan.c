/* One pass over a document for several field names (fieldscan.h). */
#include "common/fieldscan.h"

#include "common/err.h"

#include <stdbool.h>

/* Whether key k matches name nm (fieldscan.h: equal, or nm is "P*" and k begins with P). */
static inline bool key_matches(const char *nm, const char *k)
{
	for (size_t j = 0;; j++) {
		if (nm[j] != k[j])
			return j > 0 && nm[j] == '*' && nm[j + 1] == '\0';
		if (nm[j] == '\0')
			return true;
	}
}

/* The bit of a first byte in the prefilter mask (64 buckets: a key whose first byte has no
 * name's bit is skipped without looking at the names; a shared bucket only costs a look). */
static inline uint64_t first_bit(const char *s)
{
	return (uint64_t)1 << ((unsigned char)s[0] & 63);
}

int sdb_bson_find_fields(const bson_t *doc, const char *const *names, size_t n,
			 uint64_t *found, sdb_field_iter *its)
{
	uint64_t all, has = 0, firsts = 0;
	bson_iter_t it;

	*found = 0;
	if (n > SDB_FIELDS_MAX || (names == NULL && n > 0))
		return SDB_EINVAL;
	if (n == 0 || !bson_iter_init(&it, doc))
		return 0;
	all = n == SDB_FIELDS_MAX ? UINT64_MAX : SDB_FIELD_BIT(n) - 1;
	for (size_t i = 0; i < n; i++)
		firsts |= first_bit(names[i]);
	while (has != all && bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (!(firsts & first_bit(k)))
			continue;
		for (size_t i = 0; i < n; i++) {
			const char *nm = names[i];

			if (nm[0] != k[0] || (has & SDB_FIELD_BIT(i)) || !key_matches(nm, k))
				continue;
			has |= SDB_FIELD_BIT(i);
			if (its != NULL)
				its[i].it = it;
		}
	}
	*found = has;
	return 0;
}
