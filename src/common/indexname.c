/* MongoDB's default index names: see indexname.h. */
#include <stdio.h>

#include "common/indexname.h"

size_t sdb_index_default_name(const bson_t *key, char *out, size_t outlen)
{
	bson_iter_t it;
	size_t off = 0;

	if (outlen)
		out[0] = '\0';
	if (!bson_iter_init(&it, key))
		return 0;
	while (bson_iter_next(&it)) {
		char v[32];
		if (BSON_ITER_HOLDS_UTF8(&it))
			snprintf(v, sizeof v, "%s", bson_iter_utf8(&it, NULL));
		else if (BSON_ITER_HOLDS_DOUBLE(&it) &&
			 bson_iter_double(&it) != (double)(long long)bson_iter_double(&it))
			snprintf(v, sizeof v, "%g", bson_iter_double(&it));
		else
			snprintf(v, sizeof v, "%lld", (long long)bson_iter_as_int64(&it));
		int w = snprintf(off < outlen ? out + off : NULL, off < outlen ? outlen - off : 0,
				 "%s%s_%s", off ? "_" : "", bson_iter_key(&it), v);
		off += w > 0 ? (size_t)w : 0;
	}
	return off;
}
