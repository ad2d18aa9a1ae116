/* Pipeline-style updates (MongoDB 4.2+): the `u` of an update statement given as an array
 * of aggregation stages, run over the one document being updated by the pipeline engine
 * (storage/pipeline.h). MongoDB admits only the stages that reshape one document
 * (src/mongo/db/pipeline/pipeline.cpp, Pipeline::parse with the update's stage list):
 * $addFields / $set, $project / $unset and $replaceRoot / $replaceWith; any other stage is
 * refused with 72 InvalidOptions "<stage> is not allowed to be used within an update".
 * The result replaces the document the way a replacement does (ObjectReplaceExecutor): the
 * original _id stays first, a result without _id keeps it, a different _id is 66. The
 * expressions the engine knows have no clock or randomness ($$NOW, $rand are undefined
 * there), so every replica set member computes the same document. */
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/pipeline.h"
#include "storage/update_int.h"

#define C_INVALID_OPTIONS 72

static const char *const allowed[] = {"$addFields", "$set",	    "$project",
				      "$unset",	    "$replaceRoot", "$replaceWith"};

int upd_pipeline_parse(sdb_update *u, const bson_t *stages, const sdb_update_opts *opts,
		       int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	if (opts != NULL && opts->array_filters != NULL && bson_count_keys(opts->array_filters) > 0)
		return upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				"arrayFilters may not be specified for pipeline-style updates");
	if (!bson_iter_init(&it, stages))
		return upd_fail(code, C_BAD_VALUE, err, errlen, "invalid BSON in update pipeline");
	while (bson_iter_next(&it)) {
		bson_iter_t st;
		bool ok = false;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &st) ||
		    !bson_iter_next(&st))
			return upd_fail(code, C_TYPE_MISMATCH, err, errlen,
					"Each element of the 'pipeline' array must be an object");
		const char *name = bson_iter_key(&st);
		for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
			ok = ok || strcmp(name, allowed[i]) == 0;
		if (!ok)
			return upd_fail(code, C_INVALID_OPTIONS, err, errlen,
					"%s is not allowed to be used within an update", name);
	}
	sdb_pipeline_opts po = {.let = opts != NULL ? opts->vars : NULL};

	return sdb_pipeline_parse(stages, &po, &u->pipe, code, err, errlen);
}

int upd_pipeline_run(const sdb_update *u, const bson_t *doc, bson_t *out, int *code, char *err,
		     size_t errlen)
{
	bson_t *r = NULL;
	int c = 0;
	int rc = sdb_pipeline_run_one(u->pipe, doc, &r, &c, err, errlen);

	bson_init(out);
	if (rc == 1) {
		bson_concat(out, r);
		bson_destroy(r);
		return 0;
	}
	if (rc == 0) /* none of the admitted stages drops a document */
		return upd_fail(code, C_BAD_VALUE, err, errlen,
				"the update pipeline produced no document");
	if (code != NULL)
		*code = c ? c : C_BAD_VALUE;
	return rc;
}
