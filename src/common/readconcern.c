/* readConcern parsing shared by the shard and the proxy (readconcern.h). */
#include "common/readconcern.h"

#include <stdio.h>
#include <string.h>

#include "common/aggwrite.h"

/* MongoDB's codes (error_codes.yml) */
#define RC_FAILED_TO_PARSE 9
#define RC_TYPE_MISMATCH 14
#define RC_INVALID_OPTIONS 72

/* The writing stage ($out or $merge) of an aggregate command's top-level pipeline, or NULL
 * (not an aggregate, no pipeline array, no such stage). Points into cmd. */
static const char *agg_write_stage(const bson_t *cmd)
{
	bson_iter_t it, pipe, st;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) ||
	    strcmp(bson_iter_key(&it), "aggregate") != 0)
		return NULL;
	if (!bson_iter_init_find(&it, cmd, "pipeline") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &pipe))
		return NULL;
	while (bson_iter_next(&pipe)) {
		if (BSON_ITER_HOLDS_DOCUMENT(&pipe) && bson_iter_recurse(&pipe, &st) &&
		    bson_iter_next(&st) && sdb_aggw_is_stage(bson_iter_key(&st)))
			return bson_iter_key(&st);
	}
	return NULL;
}

int sdb_read_concern_parse(const bson_t *cmd, bool linearizable_ok, sdb_read_concern *rc,
			   char *err, size_t errlen)
{
	bson_iter_t it;

	return sdb_read_concern_parse_field(
		cmd, bson_iter_init_find(&it, cmd, "readConcern") ? &it : NULL, linearizable_ok, rc,
		err, errlen);
}

int sdb_read_concern_parse_field(const bson_t *cmd, const bson_iter_t *field,
				 bool linearizable_ok, sdb_read_concern *rc, char *err,
				 size_t errlen)
{
	bson_iter_t sub;

	memset(rc, 0, sizeof *rc);
	if (field == NULL)
		return 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(field) || !bson_iter_recurse(field, &sub)) {
		snprintf(err, errlen, "readConcern must be an object");
		return RC_FAILED_TO_PARSE;
	}
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "level") == 0) {
			if (!BSON_ITER_HOLDS_UTF8(&sub)) {
				snprintf(err, errlen, "readConcern.level must be a string");
				return RC_FAILED_TO_PARSE;
			}
			rc->level = bson_iter_utf8(&sub, NULL);
		} else if (strcmp(k, "atClusterTime") == 0) {
			snprintf(err, errlen,
				 "readConcern atClusterTime is not supported by stripedb (no snapshot "
				 "reads at a cluster time)");
			return RC_INVALID_OPTIONS;
		} else if (strcmp(k, "afterClusterTime") == 0) {
			if (!BSON_ITER_HOLDS_TIMESTAMP(&sub)) {
				snprintf(err, errlen,
					 "BSON field 'readConcern.afterClusterTime' is the wrong type, "
					 "expected type 'timestamp'");
				return RC_TYPE_MISMATCH;
			}
			bson_iter_timestamp(&sub, &rc->after_t, &rc->after_i);
		} else if (strcmp(k, "afterOpTime") == 0) {
			snprintf(err, errlen,
				 "readConcern afterOpTime is not supported by stripedb; use "
				 "afterClusterTime");
			return RC_INVALID_OPTIONS;
		} else if (strcmp(k, "provenance") != 0) {
			snprintf(err, errlen, "unrecognized readConcern field: %s", k);
			return RC_FAILED_TO_PARSE;
		}
	}
	if (!rc->level || strcmp(rc->level, "local") == 0 ||
	    strcmp(rc->level, "available") == 0 || strcmp(rc->level, "majority") == 0)
		return 0;
	if (strcmp(rc->level, "snapshot") == 0) {
		snprintf(err, errlen,
			 "readConcern level \"snapshot\" is not supported by stripedb outside a "
			 "transaction (no snapshot reads at a cluster time)");
		return RC_INVALID_OPTIONS;
	}
	if (strcmp(rc->level, "linearizable") != 0) {
		snprintf(err, errlen,
			 "%s is not a valid readConcern level (local, available, majority, "
			 "linearizable)",
			 rc->level);
		return RC_FAILED_TO_PARSE;
	}
	/* MongoDB refuses a writing stage under linearizable whatever the node
	 * (document_source_out.h / document_source_merge.h, supportsReadConcern) */
	const char *stage = agg_write_stage(cmd);
	if (stage) {
		snprintf(err, errlen, "%s cannot be used with a 'linearizable' read concern level",
			 stage);
		return RC_INVALID_OPTIONS;
	}
	if (!linearizable_ok) {
		snprintf(err, errlen,
			 "readConcern level \"linearizable\" is not supported by the stripedb "
			 "shard yet");
		return RC_INVALID_OPTIONS;
	}
	rc->linearizable = true;
	return 0;
}
