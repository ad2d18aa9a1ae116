/* Which finds a shard runs on its loop thread (issue #19). See common/loopread.h. */
#include "common/loopread.h"

#include <string.h>

/* Does the query filter at it (a document or an array of a $and/$or/$nor) hold an
 * operator whose cost per document has no bound but the server's (an aggregation
 * expression: $expr; JavaScript: $where, $function)? Walks every nested document. */
bool sdb_filter_has_expr(bson_iter_t *it)
{
	bson_iter_t sub;

	while (bson_iter_next(it)) {
		const char *k = bson_iter_key(it);
		if (strcmp(k, "$expr") == 0 || strcmp(k, "$where") == 0 ||
		    strcmp(k, "$function") == 0)
			return true;
		if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) &&
		    bson_iter_recurse(it, &sub) && sdb_filter_has_expr(&sub))
			return true;
	}
	return false;
}

/* Is the find projection at it made only of inclusions and exclusions (numbers, bools),
 * nested sub-projections of those, $slice and expression-free $elemMatch? Anything else
 * (an aggregation expression, $meta, a literal) is evaluated per document at a cost the
 * projection alone bounds. */
bool sdb_projection_plain(bson_iter_t *it)
{
	bson_iter_t sub, op;

	while (bson_iter_next(it)) {
		if (BSON_ITER_HOLDS_NUMBER(it) || BSON_ITER_HOLDS_BOOL(it))
			continue;
		if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &sub))
			return false;
		op = sub;
		if (!bson_iter_next(&op))
			return false; /* {}: the find answers the error */
		if (bson_iter_key(&op)[0] != '$') {
			if (!sdb_projection_plain(&sub))
				return false;
			continue;
		}
		if (strcmp(bson_iter_key(&op), "$slice") == 0) {
			if (!BSON_ITER_HOLDS_NUMBER(&op) && !BSON_ITER_HOLDS_ARRAY(&op))
				return false;
		} else if (strcmp(bson_iter_key(&op), "$elemMatch") == 0) {
			bson_iter_t em;
			if (!BSON_ITER_HOLDS_DOCUMENT(&op) || !bson_iter_recurse(&op, &em) ||
			    sdb_filter_has_expr(&em))
				return false;
		} else {
			return false;
		}
		if (bson_iter_next(&op))
			return false;
	}
	return true;
}
