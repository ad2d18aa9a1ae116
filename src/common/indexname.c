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

void sdb_index_create_cmd(bson_t *out, const char *coll, const bson_t *key, bool unique)
{
	bson_t arr, spec;
	char name[256];

	bson_iter_t it;
	if (bson_count_keys(key) == 1 && bson_iter_init_find(&it, key, "_id") &&
	    BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_double(&it) == 1.0)
		snprintf(name, sizeof name, "_id_");
	else
		sdb_index_default_name(key, name, sizeof name);
	BSON_APPEND_UTF8(out, "createIndexes", coll);
	BSON_APPEND_ARRAY_BEGIN(out, "indexes", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &spec);
	BSON_APPEND_DOCUMENT(&spec, "key", key);
	BSON_APPEND_UTF8(&spec, "name", name);
	if (unique)
		BSON_APPEND_BOOL(&spec, "unique", true);
	bson_append_document_end(&arr, &spec);
	bson_append_array_end(out, &arr);
}
