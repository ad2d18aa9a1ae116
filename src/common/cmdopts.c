/* Refusal of command options stripedb does not implement: see cmdopts.h. */
#include "common/cmdopts.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define CODE_NOT_IMPLEMENTED 238 /* NotImplemented */
#define CODE_UNKNOWN_FIELD 40415 /* IDL: "BSON field '...' is an unknown field." */
#define CODE_INVALID_OPTIONS 72  /* InvalidOptions */

/* A collation that compares as stripedb does: exactly {locale: "simple"}. */
static bool collation_is_simple(const bson_iter_t *field)
{
	bson_iter_t c;

	if (!BSON_ITER_HOLDS_DOCUMENT(field) || !bson_iter_recurse(field, &c) || !bson_iter_next(&c))
		return false;
	if (strcmp(bson_iter_key(&c), "locale") != 0 || !BSON_ITER_HOLDS_UTF8(&c) ||
	    strcmp(bson_iter_utf8(&c, NULL), "simple") != 0)
		return false;
	return !bson_iter_next(&c);
}

/* One document: a command (where NULL) or one statement of its array (where names the array's
 * path, e.g. "update.updates"). */
static int scan(const bson_t *doc, const char *where, bool update_statement,
		bool delete_statement, bool retryable, char *err, size_t errlen)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, doc))
		return 0;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "collation") == 0 && !collation_is_simple(&it)) {
			snprintf(err, errlen,
				 "collation is not supported by stripedb: strings compare by their "
				 "bytes (only {locale: \"simple\"} is accepted; see docs/compat.md)");
			return CODE_NOT_IMPLEMENTED;
		}
		if (where == NULL && strcmp(k, "let") == 0) {
			snprintf(err, errlen,
				 "let variables are not supported by stripedb (see docs/compat.md)");
			return CODE_NOT_IMPLEMENTED;
		}
		/* an update statement's constants for its pipeline (MongoDB 5.0 `c`): the
		 * pipeline engine has no variables but $$ROOT/$$CURRENT, so they are refused as
		 * `let` is rather than accepted unused */
		if (update_statement && strcmp(k, "c") == 0) {
			snprintf(err, errlen,
				 "BSON field '%s.c': update constants are not supported by stripedb "
				 "(see docs/compat.md)",
				 where);
			return CODE_NOT_IMPLEMENTED;
		}
		if (update_statement && strcmp(k, "sort") == 0) {
			snprintf(err, errlen, "BSON field '%s.sort' is an unknown field.", where);
			return CODE_UNKNOWN_FIELD;
		}
		/* a multi-document statement cannot be made exactly-once: MongoDB refuses it in
		 * a retryable write (write_ops_exec.cpp) rather than run it without the record */
		if (retryable &&
		    ((update_statement && strcmp(k, "multi") == 0 && bson_iter_as_bool(&it)) ||
		     (delete_statement && strcmp(k, "limit") == 0 && BSON_ITER_HOLDS_NUMBER(&it) &&
		      bson_iter_as_int64(&it) == 0))) {
			snprintf(err, errlen, "Cannot use (or request) retryable writes with multi=true");
			return CODE_INVALID_OPTIONS;
		}
	}
	return 0;
}

static bool sub_document(const bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

int sdb_cmd_unsupported_option(const char *name, const bson_t *cmd, char *err, size_t errlen)
{
	static const struct {
		const char *cmd, *array, *where;
		bool update;
	} arrays[] = {
		{"update", "updates", "update.updates", true},
		{"delete", "deletes", "delete.deletes", false},
		{"createIndexes", "indexes", "createIndexes.indexes", false},
	};
	bson_iter_t it, arr;
	bson_t sub;
	/* a transaction's statement (autocommit: false) is not a retryable write */
	bool retryable = bson_iter_init_find(&it, cmd, "txnNumber") &&
			 !bson_has_field(cmd, "autocommit");
	int code = scan(cmd, NULL, false, false, false, err, errlen);

	if (code != 0)
		return code;
	if (strcmp(name, "explain") == 0 && bson_iter_init_find(&it, cmd, "explain") &&
	    sub_document(&it, &sub)) {
		bson_iter_t first;
		if (bson_iter_init(&first, &sub) && bson_iter_next(&first))
			return sdb_cmd_unsupported_option(bson_iter_key(&first), &sub, err, errlen);
		return 0;
	}
	for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
		if (strcmp(arrays[i].cmd, name) != 0 || !bson_iter_init_find(&it, cmd, arrays[i].array) ||
		    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
			continue;
		while (bson_iter_next(&arr))
			if (sub_document(&arr, &sub) &&
			    (code = scan(&sub, arrays[i].where, arrays[i].update,
					 strcmp(arrays[i].cmd, "delete") == 0, retryable, err, errlen)) != 0)
				return code;
	}
	return 0;
}
