/* The databases of a listDatabases reply (dblist.h). */
#include "common/dblist.h"

#include <string.h>

void sdb_dblist_init(sdb_dblist *l, const bson_t *reply)
{
	bson_iter_t it;

	l->ok = bson_iter_init_find(&it, reply, "databases") && BSON_ITER_HOLDS_ARRAY(&it) &&
		bson_iter_recurse(&it, &l->arr);
}

bool sdb_dblist_next(sdb_dblist *l, const char *field, const char **name, const char **value)
{
	bson_iter_t d;

	while (l->ok && bson_iter_next(&l->arr)) {
		if (!BSON_ITER_HOLDS_DOCUMENT(&l->arr) || !bson_iter_recurse(&l->arr, &d))
			continue;
		*name = NULL;
		*value = NULL;
		while (bson_iter_next(&d)) {
			if (!BSON_ITER_HOLDS_UTF8(&d))
				continue;
			if (strcmp(bson_iter_key(&d), "name") == 0)
				*name = bson_iter_utf8(&d, NULL);
			else if (strcmp(bson_iter_key(&d), field) == 0)
				*value = bson_iter_utf8(&d, NULL);
		}
		return true;
	}
	l->ok = false;
	return false;
}
