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

/* The bucket of a key's first byte: 64 buckets (byte & 63), so a bucket may hold names of
 * two or four first bytes ('a' and '!'); a shared bucket only costs a comparison. */
static inline unsigned bucket_of(const char *s)
{
	return (unsigned char)s[0] & 63;
}

int sdb_bson_find_fields(const bson_t *doc, const char *const *names, size_t n,
			 uint64_t *found, sdb_field_iter *its)
{
	/* used: the buckets that hold a name; by_first[b] (written only for b in used, read
	 * only then): the names in bucket b. A key whose bucket holds no name costs a shift
	 * and a test; one that does is compared with those names only. */
	uint64_t all, has = 0, used = 0, by_first[64];
	bson_iter_t it;

	*found = 0;
	if (n > SDB_FIELDS_MAX || (names == NULL && n > 0))
		return SDB_EINVAL;
	if (n == 0 || !bson_iter_init(&it, doc))
		return 0;
	all = n == SDB_FIELDS_MAX ? UINT64_MAX : SDB_FIELD_BIT(n) - 1;
	for (size_t i = 0; i < n; i++) {
		unsigned b = bucket_of(names[i]);

		if (!(used & SDB_FIELD_BIT(b))) {
			used |= SDB_FIELD_BIT(b);
			by_first[b] = 0;
		}
		by_first[b] |= SDB_FIELD_BIT(i);
	}
	while (has != all && bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		unsigned b = bucket_of(k);
		uint64_t cand;

		if (!(used & SDB_FIELD_BIT(b)))
			continue;
		for (cand = by_first[b] & ~has; cand != 0; cand &= cand - 1) {
			unsigned i = (unsigned)__builtin_ctzll(cand);

			if (!key_matches(names[i], k))
				continue;
			has |= SDB_FIELD_BIT(i);
			if (its != NULL)
				its[i].it = it;
		}
	}
	*found = has;
	return 0;
}
