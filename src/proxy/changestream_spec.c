/* Parsing of a client's $changeStream stage and the stages after it, for the proxy's
 * change streams (changestream.c; changestream_int.h). */
#include "proxy/changestream_int.h"

/* Parse the client's $changeStream spec into cs (spec for shards, start fields, options).
 * Returns: 0, or the code of the error answered on c. */
int cs_parse_spec(ctx *c, px_cs *cs, const bson_iter_t *specit, bool *cluster)
{
	bson_iter_t it;
	bool resume = false, start_after = false, at_time = false;

	*cluster = false;
	if (!BSON_ITER_HOLDS_DOCUMENT(specit))
		return px_error(c, 50808, "$changeStream stage expects a document as argument");
	bson_iter_recurse(specit, &it);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "fullDocument") == 0) {
			const char *v = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : NULL;
			if (v == NULL)
				return px_error(c, WIRE_ERR_TYPE_MISMATCH,
						"BSON field '$changeStream.fullDocument' is the wrong type "
						"'%s', expected type 'string'",
						sdb_bson_type_name(bson_iter_type(&it)));
			if (strcmp(v, "updateLookup") == 0) {
				cs->update_lookup = true;
			} else if (strcmp(v, "whenAvailable") == 0 || strcmp(v, "required") == 0) {
				return px_error(c, WIRE_ERR_NOT_IMPLEMENTED,
						"fullDocument: '%s' needs change stream pre- and "
						"post-images, which stripedb does not implement", v);
			} else if (strcmp(v, "default") != 0) {
				return px_error(c, WIRE_ERR_BAD_VALUE,
						"Enumeration value '%s' for field "
						"'$changeStream.fullDocument' is not a valid value.",
						v);
			}
		} else if (strcmp(k, "fullDocumentBeforeChange") == 0) {
			const char *v = BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL) : "";
			if (strcmp(v, "off") != 0)
				return px_error(c, WIRE_ERR_NOT_IMPLEMENTED,
						"fullDocumentBeforeChange: '%s' needs change stream pre- "
						"and post-images, which stripedb does not implement", v);
		} else if (strcmp(k, "resumeAfter") == 0 || strcmp(k, "startAfter") == 0) {
			bson_t tok;
			sdb_cs_token t;
			int code = 0;
			char err[256];
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				return px_error(c, WIRE_ERR_TYPE_MISMATCH,
						"BSON field '$changeStream.%s' is the wrong type '%s', "
						"expected type 'object'",
						k, sdb_bson_type_name(bson_iter_type(&it)));
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&tok, data, len) ||
			    sdb_cs_token_parse_code(&tok, &t, &code, err, sizeof err) != 0)
				return px_error(c, code ? code : WIRE_ERR_FAILED_TO_PARSE, "%s", err);
			if (strcmp(k, "resumeAfter") == 0 && t.kind == SDB_CS_INVALIDATE)
				return px_error(c, 260 /* InvalidResumeToken */,
						"Attempting to resume a change stream using "
						"'resumeAfter' is not allowed from an invalidate "
						"notification.");
			if (strcmp(k, "resumeAfter") == 0)
				resume = true;
			else
				start_after = true;
			bson_append_iter(&cs->start, k, -1, &it);
			cs->pos = t;
			cs->have_pos = true;
		} else if (strcmp(k, "startAtOperationTime") == 0) {
			uint32_t ts, inc;
			if (!BSON_ITER_HOLDS_TIMESTAMP(&it))
				return px_error(c, WIRE_ERR_TYPE_MISMATCH,
						"BSON field '$changeStream.startAtOperationTime' is the "
						"wrong type '%s', expected type 'timestamp'",
						sdb_bson_type_name(bson_iter_type(&it)));
			bson_iter_timestamp(&it, &ts, &inc);
			at_time = true;
			bson_append_iter(&cs->start, k, -1, &it);
			uint64_t v = (uint64_t)ts << 32 | inc;
			if (v > 0) {
				cs_hwm_token(&cs->pos, v - 1);
				cs->have_pos = true;
			}
		} else if (strcmp(k, "allChangesForCluster") == 0) {
			*cluster = bson_iter_as_bool(&it);
			bson_append_iter(&cs->spec, k, -1, &it);
		} else if (strcmp(k, "showExpandedEvents") == 0) {
			bson_append_iter(&cs->spec, k, -1, &it);
		} else {
			return px_error(c, 40415, "BSON field '$changeStream.%s' is an unknown field.",
					k);
		}
	}
	if (resume && start_after)
		return px_error(c, 50865,
				"Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream "
				"stage.");
	if (at_time && (resume || start_after))
		return px_error(c, 40674,
				"Only one type of resume option is allowed, but multiple were found.");
	BSON_APPEND_UTF8(&cs->spec, "fullDocument", "default");
	return 0;
}

/* The stages after $changeStream: only those mongos allows in a change stream; parsed for
 * the proxy's engine. Returns: 0, or the code of the error answered on c. */
int cs_parse_stages(ctx *c, px_cs *cs, const bson_t *stages)
{
	static const char *const ok[] = {"$match",	 "$project",	 "$addFields", "$set",
					 "$unset",	 "$replaceRoot", "$replaceWith", "$redact",
					 NULL};
	bson_t rest = BSON_INITIALIZER;
	bson_iter_t it, st;
	uint32_t i = 0;
	int code = 0, rc;
	char err[512], key[16];
	const char *kp;

	if (!bson_iter_init(&it, stages) || !bson_iter_next(&it))
		return 0;
	while (bson_iter_next(&it)) {
		const char *name = NULL;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) && bson_iter_next(&st))
			name = bson_iter_key(&st);
		if (name != NULL && strcmp(name, "$changeStream") == 0) {
			bson_destroy(&rest);
			return px_error(c, 40602,
					"$changeStream is only valid as the first stage in a pipeline");
		}
		bool allowed = false;
		for (size_t k = 0; name != NULL && ok[k]; k++)
			if (strcmp(ok[k], name) == 0)
				allowed = true;
		if (name != NULL && !allowed) {
			bson_destroy(&rest);
			return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
					"%s is not permitted in a $changeStream pipeline", name);
		}
		bson_uint32_to_string(i++, &kp, key, sizeof key);
		bson_append_iter(&rest, kp, -1, &it);
	}
	if (i == 0) {
		bson_destroy(&rest);
		return 0;
	}
	bson_t vars;
	int st2 = px_let(c, &vars);
	if (st2 != 0) {
		bson_destroy(&rest);
		return st2;
	}
	sdb_pipeline_opts po = {.let = &vars};
	rc = sdb_pipeline_parse(&rest, &po, &cs->pl, &code, err, sizeof err);
	bson_destroy(&vars);
	bson_destroy(&rest);
	if (rc != 0)
		return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
	return 0;
}

int px_cs_pipeline_kind(const bson_t *stages)
{
	bson_iter_t it, st;
	int i = 0;

	if (!bson_iter_init(&it, stages))
		return 0;
	while (bson_iter_next(&it)) {
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) &&
		    bson_iter_next(&st) && strcmp(bson_iter_key(&st), "$changeStream") == 0)
			return i == 0 ? 1 : -1;
		i++;
	}
	return 0;
}

