/* $out and $merge specifications, parsed as MongoDB 6.0 does (aggwrite.h). */
#include "common/aggwrite.h"

#include <stdio.h>
#include <string.h>

#include "common/bsonget.h"

bool sdb_aggw_is_stage(const char *name)
{
	return strcmp(name, "$out") == 0 || strcmp(name, "$merge") == 0;
}

const char *sdb_aggw_matched_name(sdb_aggw_matched m)
{
	switch (m) {
	case SDB_WM_REPLACE:
		return "replace";
	case SDB_WM_KEEP_EXISTING:
		return "keepExisting";
	case SDB_WM_FAIL:
		return "fail";
	case SDB_WM_PIPELINE:
		return "pipeline";
	case SDB_WM_MERGE:
	default:
		return "merge";
	}
}

const char *sdb_aggw_not_matched_name(sdb_aggw_not_matched m)
{
	switch (m) {
	case SDB_WNM_DISCARD:
		return "discard";
	case SDB_WNM_FAIL:
		return "fail";
	case SDB_WNM_INSERT:
	default:
		return "insert";
	}
}

/* NamespaceString::validDBName on Linux. */
static bool valid_db(const char *db)
{
	size_t len = strlen(db);
	if (len == 0 || len > 63)
		return false;
	for (size_t i = 0; i < len; i++)
		if (strchr("/\\. \"$", db[i]) != NULL)
			return false;
	return true;
}

/* The target's checks of DocumentSourceOut::create / DocumentSourceMerge::create. */
static int check_target(sdb_aggw *w, const char *stage, char *err, size_t errlen)
{
	bool out = w->kind == SDB_AGGW_OUT;
	if (!valid_db(w->db) || w->coll[0] == '\0' || w->coll[0] == '.' ||
	    strchr(w->coll, '$') != NULL) {
		if (out)
			snprintf(err, errlen, "Invalid %s target namespace, %s.%s", stage, w->db,
				 w->coll);
		else
			snprintf(err, errlen, "Invalid %s target namespace: '%s.%s'", stage, w->db,
				 w->coll);
		return 73; /* InvalidNamespace */
	}
	if (strncmp(w->coll, "system.", 7) == 0) {
		if (out)
			snprintf(err, errlen, "Can't %s to special collection: %s", stage, w->coll);
		else
			snprintf(err, errlen, "Cannot %s to special collection: %s", stage, w->coll);
		return out ? 17385 : 31319;
	}
	if (strcmp(w->db, "admin") == 0 || strcmp(w->db, "config") == 0 ||
	    strcmp(w->db, "local") == 0) {
		if (out)
			snprintf(err, errlen, "Can't %s to internal database: %s", stage, w->db);
		else
			snprintf(err, errlen, "Cannot %s to internal database: %s", stage, w->db);
		return out ? 31321 : 31320;
	}
	return 0;
}

static int copy_str(char *dst, size_t dstlen, const char *src, const char *what, char *err,
		    size_t errlen)
{
	if (strlen(src) >= dstlen) {
		snprintf(err, errlen, "%s is too long", what);
		return 73;
	}
	snprintf(dst, dstlen, "%s", src);
	return 0;
}

static int parse_out(const bson_iter_t *spec, const char *db, sdb_aggw *w, char *err,
		     size_t errlen)
{
	bson_iter_t it;
	w->kind = SDB_AGGW_OUT;
	if (BSON_ITER_HOLDS_UTF8(spec)) {
		snprintf(w->db, sizeof w->db, "%s", db);
		if (copy_str(w->coll, sizeof w->coll, bson_iter_utf8(spec, NULL), "$out", err,
			     errlen))
			return 73;
		return check_target(w, "$out", err, errlen);
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(spec)) {
		snprintf(err, errlen, "$out only supports a string or object argument, but found %s",
			 sdb_bson_type_name(bson_iter_type(spec)));
		return 16990;
	}
	bool have_db = false, have_coll = false;
	bson_iter_recurse(spec, &it);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "db") == 0 || strcmp(k, "coll") == 0) {
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				snprintf(err, errlen,
					 "BSON field '$out.%s' is the wrong type '%s', expected type "
					 "'string'",
					 k, sdb_bson_type_name(bson_iter_type(&it)));
				return 14;
			}
			if (k[0] == 'd') {
				have_db = true;
				if (copy_str(w->db, sizeof w->db, bson_iter_utf8(&it, NULL), "$out.db",
					     err, errlen))
					return 73;
			} else {
				have_coll = true;
				if (copy_str(w->coll, sizeof w->coll, bson_iter_utf8(&it, NULL),
					     "$out.coll", err, errlen))
					return 73;
			}
		} else if (strcmp(k, "timeseries") == 0) {
			snprintf(err, errlen, "$out with timeseries is not supported: stripedb has no "
				 "time series collections");
			return 238;
		} else {
			snprintf(err, errlen, "BSON field '$out.%s' is an unknown field.", k);
			return 40415;
		}
	}
	if (!have_coll || !have_db) {
		snprintf(err, errlen, "BSON field '$out.%s' is missing but a required field",
			 have_coll ? "db" : "coll");
		return 40414;
	}
	return check_target(w, "$out", err, errlen);
}

static int parse_into(const bson_iter_t *it, const char *db, sdb_aggw *w, char *err,
		      size_t errlen)
{
	if (BSON_ITER_HOLDS_UTF8(it)) {
		const char *s = bson_iter_utf8(it, NULL);
		if (!*s) {
			snprintf(err, errlen, "$merge 'into' field cannot be an empty string");
			return 5786800;
		}
		snprintf(w->db, sizeof w->db, "%s", db);
		return copy_str(w->coll, sizeof w->coll, s, "$merge.into", err, errlen);
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		snprintf(err, errlen,
			 "$merge 'into' field  must be either a string or an object, but found %s",
			 sdb_bson_type_name(bson_iter_type(it)));
		return 51178;
	}
	bson_iter_t sub;
	bool have_coll = false;
	snprintf(w->db, sizeof w->db, "%s", db);
	bson_iter_recurse(it, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "db") != 0 && strcmp(k, "coll") != 0) {
			snprintf(err, errlen, "BSON field 'into.%s' is an unknown field.", k);
			return 40415;
		}
		if (BSON_ITER_HOLDS_NULL(&sub) || BSON_ITER_HOLDS_UNDEFINED(&sub))
			continue;
		if (!BSON_ITER_HOLDS_UTF8(&sub)) {
			snprintf(err, errlen,
				 "BSON field 'into.%s' is the wrong type '%s', expected type 'string'",
				 k, sdb_bson_type_name(bson_iter_type(&sub)));
			return 14;
		}
		const char *v = bson_iter_utf8(&sub, NULL);
		if (k[0] == 'd') {
			if (*v && copy_str(w->db, sizeof w->db, v, "$merge.into.db", err, errlen))
				return 73;
		} else if (*v) {
			have_coll = true;
			if (copy_str(w->coll, sizeof w->coll, v, "$merge.into.coll", err, errlen))
				return 73;
		}
	}
	if (!have_coll) {
		snprintf(err, errlen, "$merge 'into' field must specify a 'coll' that is not empty, "
			 "null or undefined");
		return 5786801;
	}
	return 0;
}

static int add_on(sdb_aggw *w, const char *f, char *err, size_t errlen)
{
	for (size_t i = 0; i < w->n_on; i++)
		if (strcmp(w->on[i], f) == 0) {
			snprintf(err, errlen, "Found a duplicate field '%s'", f);
			return 31465;
		}
	if (w->n_on >= SDB_AGGW_MAX_ON || strlen(f) >= sizeof w->on[0] || !*f || f[0] == '$' ||
	    strstr(f, "..") || f[strlen(f) - 1] == '.' || f[0] == '.') {
		snprintf(err, errlen, "$merge 'on' field '%s' is not a valid field path (or too "
			 "many fields)", f);
		return 2;
	}
	snprintf(w->on[w->n_on++], sizeof w->on[0], "%s", f);
	return 0;
}

static int parse_on(const bson_iter_t *it, sdb_aggw *w, char *err, size_t errlen)
{
	int rc;
	w->on_given = true;
	if (BSON_ITER_HOLDS_UTF8(it)) {
		if ((rc = add_on(w, bson_iter_utf8(it, NULL), err, errlen)) != 0)
			return rc;
	} else if (BSON_ITER_HOLDS_ARRAY(it)) {
		bson_iter_t a;
		bson_iter_recurse(it, &a);
		while (bson_iter_next(&a)) {
			if (!BSON_ITER_HOLDS_UTF8(&a)) {
				snprintf(err, errlen,
					 "$merge 'on' array elements must be strings, but found %s",
					 sdb_bson_type_name(bson_iter_type(&a)));
				return 51134;
			}
			if ((rc = add_on(w, bson_iter_utf8(&a, NULL), err, errlen)) != 0)
				return rc;
		}
	} else {
		snprintf(err, errlen,
			 "$merge 'on' field  must be either a string or an array of strings, but "
			 "found %s",
			 sdb_bson_type_name(bson_iter_type(it)));
		return 51186;
	}
	if (w->n_on == 0) {
		snprintf(err, errlen, "If explicitly specifying $merge 'on', must include at least "
			 "one field");
		return 51187;
	}
	return 0;
}

/* merge_processor.cpp's descriptor map: the supported combinations. */
static bool supported(sdb_aggw_matched m, sdb_aggw_not_matched n)
{
	if (m == SDB_WM_KEEP_EXISTING || m == SDB_WM_FAIL)
		return n == SDB_WNM_INSERT;
	return true;
}

static int parse_merge(const bson_iter_t *spec, const char *db, sdb_aggw *w, char *err,
		       size_t errlen)
{
	bson_iter_t it;
	int rc;
	bool have_into = false, have_let = false;
	bson_t user_let = BSON_INITIALIZER;
	w->kind = SDB_AGGW_MERGE;
	if (BSON_ITER_HOLDS_UTF8(spec)) {
		const char *s = bson_iter_utf8(spec, NULL);
		snprintf(w->db, sizeof w->db, "%s", db);
		if ((rc = copy_str(w->coll, sizeof w->coll, s, "$merge", err, errlen)) != 0)
			return rc;
		have_into = true;
	} else if (!BSON_ITER_HOLDS_DOCUMENT(spec)) {
		snprintf(err, errlen, "$merge only supports a string or object argument, not %s",
			 sdb_bson_type_name(bson_iter_type(spec)));
		return 51182;
	} else {
		bson_iter_recurse(spec, &it);
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "into") == 0) {
				if ((rc = parse_into(&it, db, w, err, errlen)) != 0)
					goto fail;
				have_into = true;
			} else if (strcmp(k, "on") == 0) {
				if ((rc = parse_on(&it, w, err, errlen)) != 0)
					goto fail;
			} else if (strcmp(k, "let") == 0) {
				if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
					snprintf(err, errlen,
						 "BSON field '$merge.let' is the wrong type '%s', "
						 "expected type 'object'",
						 sdb_bson_type_name(bson_iter_type(&it)));
					rc = 14;
					goto fail;
				}
				uint32_t len;
				const uint8_t *data;
				bson_iter_document(&it, &len, &data);
				bson_destroy(&user_let);
				bson_init_static(&user_let, data, len);
				have_let = true;
			} else if (strcmp(k, "whenMatched") == 0) {
				if (BSON_ITER_HOLDS_ARRAY(&it)) {
					uint32_t len;
					const uint8_t *data;
					bson_t tmp;
					bson_iter_array(&it, &len, &data);
					bson_init_static(&tmp, data, len);
					bson_destroy(&w->pipeline);
					bson_copy_to(&tmp, &w->pipeline);
					w->when_matched = SDB_WM_PIPELINE;
				} else if (BSON_ITER_HOLDS_UTF8(&it)) {
					const char *v = bson_iter_utf8(&it, NULL);
					if (strcmp(v, "replace") == 0)
						w->when_matched = SDB_WM_REPLACE;
					else if (strcmp(v, "keepExisting") == 0)
						w->when_matched = SDB_WM_KEEP_EXISTING;
					else if (strcmp(v, "merge") == 0)
						w->when_matched = SDB_WM_MERGE;
					else if (strcmp(v, "fail") == 0)
						w->when_matched = SDB_WM_FAIL;
					else {
						snprintf(err, errlen,
							 "Enumeration value '%s' for field "
							 "'whenMatched' is not a valid value.",
							 v);
						rc = 2;
						goto fail;
					}
				} else {
					snprintf(err, errlen,
						 "$merge 'whenMatched' field  must be either a string "
						 "or an array, but found %s",
						 sdb_bson_type_name(bson_iter_type(&it)));
					rc = 51191;
					goto fail;
				}
			} else if (strcmp(k, "whenNotMatched") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&it)) {
					snprintf(err, errlen,
						 "BSON field '$merge.whenNotMatched' is the wrong type "
						 "'%s', expected type 'string'",
						 sdb_bson_type_name(bson_iter_type(&it)));
					rc = 14;
					goto fail;
				}
				const char *v = bson_iter_utf8(&it, NULL);
				if (strcmp(v, "insert") == 0)
					w->when_not_matched = SDB_WNM_INSERT;
				else if (strcmp(v, "discard") == 0)
					w->when_not_matched = SDB_WNM_DISCARD;
				else if (strcmp(v, "fail") == 0)
					w->when_not_matched = SDB_WNM_FAIL;
				else {
					snprintf(err, errlen,
						 "Enumeration value '%s' for field 'whenNotMatched' "
						 "is not a valid value.",
						 v);
					rc = 2;
					goto fail;
				}
			} else {
				snprintf(err, errlen, "BSON field '$merge.%s' is an unknown field.", k);
				rc = 40415;
				goto fail;
			}
		}
	}
	if (!have_into) {
		snprintf(err, errlen, "BSON field '$merge.into' is missing but a required field");
		rc = 40414;
		goto fail;
	}
	if (!supported(w->when_matched, w->when_not_matched)) {
		snprintf(err, errlen,
			 "Combination of $merge modes 'whenMatched: %s' and 'whenNotMatched: %s' "
			 "is not supported",
			 sdb_aggw_matched_name(w->when_matched),
			 sdb_aggw_not_matched_name(w->when_not_matched));
		rc = 51181;
		goto fail;
	}
	if ((rc = check_target(w, "$merge", err, errlen)) != 0)
		goto fail;
	if (w->when_matched == SDB_WM_PIPELINE) {
		bson_iter_t nit;
		bool has_new = have_let && bson_iter_init_find(&nit, &user_let, "new");
		if (has_new && (!BSON_ITER_HOLDS_UTF8(&nit) ||
				strcmp(bson_iter_utf8(&nit, NULL), "$$ROOT") != 0)) {
			snprintf(err, errlen, "'let' may not define a value for the reserved 'new' "
				 "variable other than '$$ROOT'");
			rc = 51273;
			goto fail;
		}
		bson_destroy(&w->let);
		bson_init(&w->let);
		if (have_let)
			bson_concat(&w->let, &user_let);
		else
			BSON_APPEND_UTF8(&w->let, "new", "$$ROOT");
		if (have_let && !has_new && w->when_not_matched == SDB_WNM_INSERT)
			BSON_APPEND_UTF8(&w->let, "new", "$$ROOT");
	} else if (have_let) {
		snprintf(err, errlen, "Cannot use 'let' variables with 'whenMatched: %s' mode",
			 sdb_aggw_matched_name(w->when_matched));
		rc = 51199;
		goto fail;
	}
	if (w->n_on == 0)
		snprintf(w->on[w->n_on++], sizeof w->on[0], "_id");
	bson_destroy(&user_let);
	return 0;
fail:
	bson_destroy(&user_let);
	return rc;
}

int sdb_aggw_parse(const bson_t *pipeline, const char *db, sdb_aggw *out, char *err,
		   size_t errlen)
{
	bson_iter_t it, st;
	uint32_t n = 0, i = 0;
	memset(out, 0, sizeof *out);
	bson_init(&out->pipeline);
	bson_init(&out->let);
	bson_init(&out->stages);
	if (!bson_iter_init(&it, pipeline))
		return 0;
	while (bson_iter_next(&it))
		n++;
	bson_iter_init(&it, pipeline);
	while (bson_iter_next(&it)) {
		const char *name = NULL;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) && bson_iter_next(&st))
			name = bson_iter_key(&st);
		if (name && sdb_aggw_is_stage(name)) {
			if (i + 1 != n) {
				snprintf(err, errlen, "%s can only be the final stage in the pipeline",
					 name);
				return 40601;
			}
			bson_iter_t more = st;
			if (bson_iter_next(&more))
				break; /* two fields: the engine answers 40323 */
			if (name[1] == 'o')
				return parse_out(&st, db, out, err, errlen);
			return parse_merge(&st, db, out, err, errlen);
		}
		char k[16];
		const char *kp;
		bson_uint32_to_string(i, &kp, k, sizeof k);
		bson_append_iter(&out->stages, kp, -1, &it);
		i++;
	}
	/* not a writing pipeline (or a malformed last stage): the whole pipeline */
	bson_destroy(&out->stages);
	bson_copy_to(pipeline, &out->stages);
	out->kind = SDB_AGGW_NONE;
	return 0;
}

void sdb_aggw_destroy(sdb_aggw *w)
{
	bson_destroy(&w->pipeline);
	bson_destroy(&w->let);
	bson_destroy(&w->stages);
	memset(w, 0, sizeof *w);
}

int sdb_aggw_on_filter(const sdb_aggw *w, const bson_t *doc, bson_t *out, char *err,
		       size_t errlen)
{
	bson_init(out);
	for (size_t i = 0; i < w->n_on; i++) {
		bson_iter_t it, d;
		bool found = bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, w->on[i], &d);
		if (found && BSON_ITER_HOLDS_ARRAY(&d)) {
			snprintf(err, errlen, "$merge write error: 'on' field '%s' is an array",
				 w->on[i]);
			return 51185;
		}
		if (!found || BSON_ITER_HOLDS_NULL(&d) || BSON_ITER_HOLDS_UNDEFINED(&d)) {
			snprintf(err, errlen,
				 "$merge write error: 'on' field '%s' cannot be missing, null, "
				 "undefined or an array",
				 w->on[i]);
			return 51132;
		}
		/* an array on the path ({a: [{b: 1}]} for a.b) is found by find_descendant as
		 * a.0.b only when the path names the index: a plain path through an array is
		 * not found, so it is refused above as missing */
		bson_append_iter(out, w->on[i], -1, &d);
	}
	return 0;
}

bool sdb_aggw_index_supports(const sdb_aggw *w, const bson_t *key, const bson_t *spec)
{
	bson_iter_t it;
	size_t n = 0;
	if (!bson_iter_init_find(&it, spec, "unique") || !bson_iter_as_bool(&it))
		return false;
	if (bson_iter_init_find(&it, spec, "partialFilterExpression"))
		return false;
	if (bson_iter_init_find(&it, spec, "collation")) {
		bson_iter_t c;
		if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &c) ||
		    !bson_iter_find(&c, "locale") || !BSON_ITER_HOLDS_UTF8(&c) ||
		    strcmp(bson_iter_utf8(&c, NULL), "simple") != 0)
			return false;
	}
	if (!bson_iter_init(&it, key))
		return false;
	while (bson_iter_next(&it)) {
		bool in = false;
		for (size_t i = 0; i < w->n_on; i++)
			if (strcmp(w->on[i], bson_iter_key(&it)) == 0)
				in = true;
		if (!in)
			return false;
		n++;
	}
	return n == w->n_on;
}

void sdb_aggw_with_id(const sdb_aggw *w, const bson_t *doc, bson_t *out)
{
	bson_iter_t it;
	bool id_in_on = false;
	for (size_t i = 0; i < w->n_on; i++)
		id_in_on |= strcmp(w->on[i], "_id") == 0;
	bson_init(out);
	if (id_in_on && !bson_iter_init_find(&it, doc, "_id")) {
		bson_oid_t oid;
		bson_oid_init(&oid, NULL);
		BSON_APPEND_OID(out, "_id", &oid);
	}
	bson_concat(out, doc);
}

/* The statement's c for a pipeline whenMatched: each let variable evaluated against doc
 * ($$ROOT: the output document); c's values are constants to the shard (mongod's
 * PipelineExecutor), so they go as they are. Returns 0 or a code (message in err). */
static int pipeline_constants(const sdb_aggw *w, const bson_t *doc, const bson_t *vars,
			      sdb_aggw_eval_fn eval, bson_t *c, char *err, size_t errlen)
{
	bson_iter_t it, vi;
	bool have_vars = vars && !bson_empty(vars);
	bson_iter_init(&it, &w->let);
	while (bson_iter_next(&it)) {
		bson_t v;
		int code = 0;
		int rc;
		/* the command's `let` in scope (mongod evaluates $merge's let with the
		 * aggregate's variables) */
		rc = eval(&it, have_vars ? vars : NULL, doc, &v, &code, err, errlen);
		if (rc != 0) {
			bson_destroy(&v);
			return code ? code : 2;
		}
		if (bson_iter_init_find(&vi, &v, "v"))
			bson_append_iter(c, bson_iter_key(&it), -1, &vi);
		else
			bson_append_null(c, bson_iter_key(&it), -1);
		bson_destroy(&v);
	}
	/* and visible in the whenMatched pipeline, unless $merge's let names them too */
	if (have_vars) {
		bson_iter_init(&vi, vars);
		while (bson_iter_next(&vi))
			if (!bson_has_field(&w->let, bson_iter_key(&vi)))
				bson_append_iter(c, bson_iter_key(&vi), -1, &vi);
	}
	return 0;
}

int sdb_aggw_merge_stmt(const sdb_aggw *w, const bson_t *doc, const bson_t *vars,
			sdb_aggw_eval_fn eval, bson_t *st, char *err, size_t errlen)
{
	bson_t q, u, c;
	int rc = sdb_aggw_on_filter(w, doc, &q, err, errlen);
	if (rc != 0) {
		bson_destroy(&q);
		return rc;
	}
	BSON_APPEND_DOCUMENT(st, "q", &q);
	bson_destroy(&q);
	switch (w->when_matched) {
	case SDB_WM_REPLACE:
		BSON_APPEND_DOCUMENT(st, "u", doc);
		break;
	case SDB_WM_KEEP_EXISTING:
	case SDB_WM_MERGE:
		bson_append_document_begin(st, "u", -1, &u);
		BSON_APPEND_DOCUMENT(&u, w->when_matched == SDB_WM_MERGE ? "$set" : "$setOnInsert",
				     doc);
		bson_append_document_end(st, &u);
		break;
	case SDB_WM_PIPELINE:
	case SDB_WM_FAIL: /* not an update: the caller inserts */
	default:
		BSON_APPEND_ARRAY(st, "u", &w->pipeline);
		bson_append_document_begin(st, "c", -1, &c);
		rc = pipeline_constants(w, doc, vars, eval, &c, err, errlen);
		bson_append_document_end(st, &c);
		if (w->when_not_matched == SDB_WNM_INSERT)
			BSON_APPEND_BOOL(st, "upsertSupplied", true);
		break;
	}
	BSON_APPEND_BOOL(st, "upsert", w->when_not_matched == SDB_WNM_INSERT);
	BSON_APPEND_BOOL(st, "multi", false);
	return rc;
}

bool sdb_aggw_first_write_error(const bson_t *reply, int *code, char *errmsg, size_t errlen,
				bson_t *extra)
{
	bson_iter_t we, e0, sub;

	if (!bson_iter_init_find(&we, reply, "writeErrors") || !BSON_ITER_HOLDS_ARRAY(&we) ||
	    !bson_iter_recurse(&we, &e0) || !bson_iter_next(&e0) ||
	    !BSON_ITER_HOLDS_DOCUMENT(&e0) || !bson_iter_recurse(&e0, &sub))
		return false;
	*code = 1;
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "code") == 0)
			*code = (int)bson_iter_as_int64(&sub);
		else if (strcmp(k, "errmsg") == 0 && BSON_ITER_HOLDS_UTF8(&sub))
			snprintf(errmsg, errlen, "%s", bson_iter_utf8(&sub, NULL));
		else if (strcmp(k, "keyPattern") == 0 || strcmp(k, "keyValue") == 0)
			bson_append_iter(extra, k, -1, &sub);
	}
	return true;
}

void sdb_aggw_insert_batch(bson_t *cmd, const char *coll, bson_t *const *docs, size_t n,
			   size_t *pos)
{
	bson_t arr;
	size_t bytes = 0, k = 0;

	BSON_APPEND_UTF8(cmd, "insert", coll);
	BSON_APPEND_ARRAY_BEGIN(cmd, "documents", &arr);
	while (*pos < n && k < SDB_AGGW_BATCH_DOCS &&
	       (k == 0 || bytes + docs[*pos]->len < SDB_AGGW_BATCH_BYTES)) {
		char key[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)k++, &kp, key, sizeof key);
		BSON_APPEND_DOCUMENT(&arr, kp, docs[*pos]);
		bytes += docs[*pos]->len;
		(*pos)++;
	}
	bson_append_array_end(cmd, &arr);
	BSON_APPEND_BOOL(cmd, "ordered", true);
}
