/* Helpers of the shard's command files (see util.h). */
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "shard/util.h"
#include "common/bsonval.h"

bool util_cmd_find(const wire_req *req, const bson_t *cmd, const char *name, bson_iter_t *it)
{
	if (req != NULL && cmd == wire_req_cmd(req))
		return wire_req_cmd_find(req, name, it);
	return bson_iter_init_find(it, cmd, name);
}

bool util_ctx_find(const shard_ctx *x, const char *name, bson_iter_t *it)
{
	return util_cmd_find(x->req, x->cmd, name, it);
}

bool util_token(const bson_iter_t *it, int64_t *out)
{
	return sdb_bson_as_int64(it, out);
}

const char *util_type_name(bson_type_t t)
{
	return sdb_bson_type_name(t);
}

bool util_get_doc(shard_ctx *x, const char *cmd, const bson_iter_t *it, bson_t *out)
{
	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "BSON field '%s.%s' is the wrong type '%s', expected type 'object'", cmd,
			   bson_iter_key(it), util_type_name(bson_iter_type(it)));
		return false;
	}
	uint32_t len;
	const uint8_t *d;
	bson_iter_document(it, &len, &d);
	bson_t tmp;
	if (!bson_init_static(&tmp, d, len)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "BSON field '%s.%s' is not valid BSON", cmd,
			   bson_iter_key(it));
		return false;
	}
	/* out may already hold an initialised empty document: replace it */
	bson_destroy(out);
	bson_copy_to(&tmp, out);
	return true;
}

bool util_get_int(shard_ctx *x, const char *cmd, const bson_iter_t *it, int64_t lo, int64_t hi,
		  int64_t *out)
{
	sdb_bson_err e;

	/* the "cmd.field" name only appears in an error message: built (and the check run
	 * again for its message) only then; formatting it for every limit and batchSize was
	 * 1.4% of a shard's CPU on point reads (issue #19) */
	if (sdb_bson_get_int64(it, bson_iter_key(it), lo, hi, out, NULL) == 0)
		return true;
	char *field = sdb_asprintf("%s.%s", cmd, bson_iter_key(it));
	int rc = sdb_bson_get_int64(it, field, lo, hi, out, &e);

	free(field);
	if (rc != 0)
		shard_fail(x, e.code, "%s", e.msg);
	return rc == 0;
}

bool util_iter_bson(const bson_iter_t *it, bson_t *out)
{
	uint32_t len;
	const uint8_t *d;
	if (BSON_ITER_HOLDS_ARRAY(it))
		bson_iter_array(it, &len, &d);
	else
		bson_iter_document(it, &len, &d);
	return bson_init_static(out, d, len);
}

bool util_iter_copy(const bson_iter_t *it, bson_t *out)
{
	bson_t tmp;
	if (!util_iter_bson(it, &tmp))
		return false;
	bson_destroy(out);
	bson_copy_to(&tmp, out);
	return true;
}

void util_docs_free(bson_t **docs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sdb_doc_free(docs[i]);
	free(docs);
}

void util_docs_push(bson_t ***docs, size_t *n, size_t *cap, bson_t *d)
{
	if (*n == *cap) {
		*cap = *cap ? *cap * 2 : 16;
		*docs = sdb_realloc(*docs, *cap * sizeof **docs);
	}
	(*docs)[(*n)++] = d;
}
