/* The shards of a listShards reply: see shardref.h. */
#include "common/shardref.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

void sdb_shard_refs_parse(const bson_t *reply, sdb_shard_ref **out, size_t *n)
{
	bson_iter_t it, arr;
	size_t cap = 0;

	*out = NULL;
	*n = 0;
	if (!bson_iter_init_find(&it, reply, "shards") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return;
	while (bson_iter_next(&arr)) {
		bson_iter_t f;
		const char *id = NULL, *uri = NULL;
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &f))
			continue;
		while (bson_iter_next(&f)) {
			if (strcmp(bson_iter_key(&f), "id") == 0 && BSON_ITER_HOLDS_UTF8(&f))
				id = bson_iter_utf8(&f, NULL);
			else if (strcmp(bson_iter_key(&f), "uri") == 0 && BSON_ITER_HOLDS_UTF8(&f))
				uri = bson_iter_utf8(&f, NULL);
		}
		if (id == NULL || uri == NULL)
			continue;
		if (*n == cap) {
			cap = cap ? 2 * cap : 8;
			*out = sdb_realloc(*out, cap * sizeof **out);
		}
		(*out)[*n].id = sdb_strdup(id);
		(*out)[(*n)++].uri = sdb_strdup(uri);
	}
}

void sdb_shard_refs_free(sdb_shard_ref *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(s[i].id);
		free(s[i].uri);
	}
	free(s);
}
