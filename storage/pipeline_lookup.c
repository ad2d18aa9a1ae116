/* The cross-collection stages $unionWith and $lookup (MongoDB 6.0's
 * document_source_union_with.cpp and document_source_lookup.cpp). The engine does not read
 * other collections itself: the caller's sdb_pipeline_opts.foreign opens a foreign
 * collection's documents through a sub-pipeline (the shard from its own store, the proxy
 * through its routing), so storage/ knows nothing of roles.
 *
 * $unionWith: "coll" or {coll, pipeline}: the input's documents, then those of the
 * sub-pipeline over coll. Errors as mongod's: 9 not a string or object; 40415 an unknown
 * field; 14 coll not a string, pipeline not an array of objects; 9 no coll (without a
 * $documents first stage; with one: 238, $documents in $unionWith is not supported);
 * 31441 $out/$merge/$changeStream in the sub-pipeline; any error of the sub-pipeline's
 * parse.
 *
 * $lookup: {from, localField, foreignField, as} (equality: a foreign document matches
 * when its foreignField equals one of the local values: every value at localField, the
 * elements of an array one by one; missing/null matches a null or missing foreignField),
 * {from, let, pipeline, as} ($$name of the let variables, evaluated against each input
 * document, inside the sub-pipeline) and MongoDB 5.0's combined form (the equality $match
 * first, then the pipeline). The matches become the array `as` of each input document.
 * Errors (all 9 FailedToParse as mongod unless said): not an object; an argument that is
 * not a string (let: an object, pipeline: an array); an unknown argument; no `as`; no
 * `from` (238 with a pipeline: $documents in $lookup is not supported); only one of
 * localField/foreignField; neither those nor a pipeline; 16866-16868 a let name;
 * 51047 $out/$merge in the sub-pipeline; 4568 the matches of one document over 16 MiB. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include "storage/path.h"

#define LOOKUP_MAX_BYTES (16 * 1024 * 1024)

void agg_lookup_clear(stage *s)
{
	free(s->coll);
	if (s->sub != NULL) {
		bson_destroy(s->sub);
	}
	free(s->as);
	free(s->local_field);
	free(s->foreign_field);
	for (size_t i = 0; i < s->n_let; i++) {
		free(s->let_names[i]);
		agg_expr_free(s->let_exprs[i]);
	}
	free(s->let_names);
	free(s->let_exprs);
}

/* The first stage's name of the stage array arr ("" when none). */
static const char *first_stage_name(const bson_t *arr)
{
	bson_iter_t it, st;

	if (bson_iter_init(&it, arr) && bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &st) && bson_iter_next(&st)) {
		return bson_iter_key(&st);
	}
	return "";
}

/* Check the sub-pipeline arr of stage `who` ("$unionWith" / "$lookup"): stages it may not
 * hold (code forbidden_code), then a trial parse with vars in scope (the real one runs
 * where the foreign collection is read). */
static int check_sub(const bson_t *arr, const char *who, int forbidden_code, const bson_t *vars,
		     const ectx *e)
{
	static const char *const forbidden[] = {"$out", "$merge", "$changeStream"};
	bson_iter_t it, st;
	uint32_t i = 0;

	if (!bson_iter_init(&it, arr)) {
		return efail(e, C_FAILED_TO_PARSE, "malformed %s pipeline", who);
	}
	while (bson_iter_next(&it)) {
		if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
			if (forbidden_code == 51047) { /* $lookup's parsePipelineFromBSON */
				return efail(e, C_FAILED_TO_PARSE,
					     "'pipeline' element %u is not an object", i);
			}
			return efail(e, C_TYPE_MISMATCH,
				     "BSON field '%s.pipeline.%u' is the wrong type '%s', expected type "
				     "'object'",
				     who, i, type_name(bson_iter_type(&it)));
		}
		if (bson_iter_recurse(&it, &st) && bson_iter_next(&st)) {
			for (size_t k = 0; k < sizeof forbidden / sizeof forbidden[0]; k++) {
				if (strcmp(bson_iter_key(&st), forbidden[k]) == 0) {
					return efail(e, forbidden_code,
						     "%s is not allowed within a %s's sub-pipeline",
						     forbidden[k], who);
				}
			}
		}
		i++;
	}
	sdb_pipeline_opts o = {0};
	sdb_pipeline *p = NULL;
	int rc;

	if (e->opts != NULL) {
		o = *e->opts;
	}
	o.let = vars;
	o.sub_depth++; /* agg_sub_depth_check bounded it */
	rc = sdb_pipeline_parse(arr, &o, &p, e->code, e->err, e->errlen);
	sdb_pipeline_free(p);
	return rc;
}

static bool iter_array(const bson_iter_t *it, bson_t *out)
{
	uint32_t len;
	const uint8_t *data;

	if (!BSON_ITER_HOLDS_ARRAY(it)) {
		return false;
	}
	bson_iter_array(it, &len, &data);
	return bson_init_static(out, data, len);
}

static int parse_union_with(sdb_pipeline *p, const bson_iter_t *arg, const ectx *e)
{
	const char *coll = NULL;
	bson_t sub;
	bool have_sub = false;
	bson_iter_t f;
	int rc;

	uint32_t clen = 0;

	if (BSON_ITER_HOLDS_UTF8(arg)) {
		coll = bson_iter_utf8(arg, &clen);
	} else if (BSON_ITER_HOLDS_DOCUMENT(arg)) {
		bson_iter_recurse(arg, &f);
		while (bson_iter_next(&f)) {
			const char *k = bson_iter_key(&f);

			if (strcmp(k, "coll") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&f)) {
					return efail(e, C_TYPE_MISMATCH,
						     "BSON field '$unionWith.coll' is the wrong type '%s', "
						     "expected type 'string'",
						     type_name(bson_iter_type(&f)));
				}
				coll = bson_iter_utf8(&f, &clen);
			} else if (strcmp(k, "pipeline") == 0) {
				if (!iter_array(&f, &sub)) {
					return efail(e, C_TYPE_MISMATCH,
						     "BSON field '$unionWith.pipeline' is the wrong type "
						     "'%s', expected type 'array'",
						     type_name(bson_iter_type(&f)));
				}
				have_sub = true;
			} else {
				return efail(e, 40415, "BSON field '$unionWith.%s' is an unknown field.", k);
			}
		}
		if (coll == NULL) {
			if (have_sub && strcmp(first_stage_name(&sub), "$documents") == 0) {
				return efail(e, C_NOT_IMPLEMENTED,
					     "$unionWith with a $documents pipeline and no collection is "
					     "not supported by stripedb");
			}
			return efail(e, C_FAILED_TO_PARSE,
				     "$unionWith stage without explicit collection must have a "
				     "pipeline with $documents as first stage");
		}
	} else {
		return efail(e, C_FAILED_TO_PARSE,
			     "the $unionWith stage specification must be an object or string, but "
			     "found %s",
			     type_name(bson_iter_type(arg)));
	}
	if (coll[0] == '\0' || coll[0] == '$' || strlen(coll) != clen) {
		/* (a NUL inside: C strings would read another collection) */
		return efail(e, 73, "Invalid collection name: '%s'", coll);
	}
	if (p->foreign == NULL) {
		return efail(e, C_NOT_IMPLEMENTED, "$unionWith is not supported here");
	}
	if (have_sub && (rc = check_sub(&sub, "$unionWith", 31441, e->vars, e)) != 0) {
		return rc;
	}
	stage *s = NULL;

	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	s = &p->st[p->n++];
	memset(s, 0, sizeof *s);
	s->kind = S_UNION_WITH;
	s->coll = sdb_strdup(coll);
	s->sub = have_sub ? bson_copy(&sub) : bson_new();
	return 0;
}

static int parse_lookup(sdb_pipeline *p, const bson_iter_t *arg, const ectx *e)
{
	const char *from = NULL, *as = NULL, *lf = NULL, *ff = NULL;
	bson_t sub, let;
	bool have_sub = false, have_let = false;
	bson_iter_t f;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, C_FAILED_TO_PARSE, "the $lookup specification must be an Object");
	}
	bson_iter_recurse(arg, &f);
	while (bson_iter_next(&f)) {
		const char *k = bson_iter_key(&f);

		if (strcmp(k, "pipeline") == 0) {
			if (!iter_array(&f, &sub)) {
				return efail(e, C_FAILED_TO_PARSE,
					     "'pipeline' option must be specified as an array");
			}
			have_sub = true;
			continue;
		}
		if (strcmp(k, "let") == 0) {
			uint32_t len;
			const uint8_t *data;

			if (!BSON_ITER_HOLDS_DOCUMENT(&f)) {
				return efail(e, C_FAILED_TO_PARSE,
					     "$lookup argument 'let' must be an object, is type %s",
					     type_name(bson_iter_type(&f)));
			}
			bson_iter_document(&f, &len, &data);
			if (!bson_init_static(&let, data, len)) {
				return efail(e, C_FAILED_TO_PARSE, "malformed $lookup let");
			}
			have_let = true;
			continue;
		}
		if (strcmp(k, "from") != 0 && strcmp(k, "as") != 0 && strcmp(k, "localField") != 0 &&
		    strcmp(k, "foreignField") != 0) {
			return efail(e, C_FAILED_TO_PARSE, "unknown argument to $lookup: %s", k);
		}
		if (!BSON_ITER_HOLDS_UTF8(&f)) {
			if (strcmp(k, "from") == 0 && BSON_ITER_HOLDS_DOCUMENT(&f)) {
				return efail(e, C_NOT_IMPLEMENTED,
					     "$lookup 'from' as {db, coll} is not supported by stripedb");
			}
			if (strcmp(k, "from") == 0) {
				return efail(e, C_FAILED_TO_PARSE,
					     "$lookup 'from' field must be a string or an object, but "
					     "found %s",
					     type_name(bson_iter_type(&f)));
			}
			return efail(e, C_FAILED_TO_PARSE,
				     "$lookup argument '%s' must be a string, found %s", k,
				     type_name(bson_iter_type(&f)));
		}
		uint32_t vlen = 0;
		const char *v = bson_iter_utf8(&f, &vlen);

		if (strlen(v) != vlen) {
			/* C strings would stop at the NUL and read another collection */
			return efail(e, 73, "$lookup argument '%s' contains a null byte", k);
		}
		if (strcmp(k, "from") == 0) {
			from = v;
		} else if (strcmp(k, "as") == 0) {
			as = v;
		} else if (strcmp(k, "localField") == 0) {
			lf = v;
		} else {
			ff = v;
		}
	}
	if (as == NULL || as[0] == '\0') {
		return efail(e, C_FAILED_TO_PARSE, "must specify 'as' field for a $lookup");
	}
	if (from == NULL) {
		if (have_sub && strcmp(first_stage_name(&sub), "$documents") == 0) {
			return efail(e, C_NOT_IMPLEMENTED,
				     "$lookup with a $documents pipeline and no 'from' is not "
				     "supported by stripedb");
		}
		return efail(e, C_FAILED_TO_PARSE, "must specify 'from' field for a $lookup");
	}
	if (have_sub) {
		if ((lf == NULL) != (ff == NULL)) {
			return efail(e, C_FAILED_TO_PARSE,
				     "$lookup requires both or neither of 'localField' and "
				     "'foreignField' to be specified");
		}
	} else if (lf == NULL || ff == NULL) {
		return efail(e, C_FAILED_TO_PARSE,
			     "$lookup requires either 'pipeline' or both 'localField' and "
			     "'foreignField' to be specified");
	} else if (have_let) {
		return efail(e, C_FAILED_TO_PARSE,
			     "$lookup with a 'let' argument must also specify 'pipeline'");
	}
	/* MongoDB's FieldPath checks of `as`, localField and foreignField */
	if ((rc = agg_field_path_ok(as, e)) != 0 ||
	    (lf != NULL && (rc = agg_field_path_ok(lf, e)) != 0) ||
	    (ff != NULL && (rc = agg_field_path_ok(ff, e)) != 0)) {
		return rc;
	}
	if (from[0] == '\0' || from[0] == '$') {
		return efail(e, 73, "Invalid collection name: '%s'", from);
	}
	if (p->foreign == NULL) {
		return efail(e, C_NOT_IMPLEMENTED, "$lookup is not supported here");
	}

	stage *s;

	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	s = &p->st[p->n++];
	memset(s, 0, sizeof *s);
	s->kind = S_LOOKUP;
	s->coll = sdb_strdup(from);
	s->as = sdb_strdup(as);
	s->local_field = lf != NULL ? sdb_strdup(lf) : NULL;
	s->foreign_field = ff != NULL ? sdb_strdup(ff) : NULL;
	s->sub = have_sub ? bson_copy(&sub) : bson_new();
	/* the let variables: names checked, expressions compiled in the outer scope; the
	 * trial parse of the sub-pipeline sees them as null placeholders */
	bson_t vars = BSON_INITIALIZER;

	if (have_let) {
		bson_iter_t l;

		bson_iter_init(&l, &let);
		while (bson_iter_next(&l)) {
			const char *name = bson_iter_key(&l);

			if ((rc = agg_let_name_ok(name, e)) != 0) {
				bson_destroy(&vars);
				return rc;
			}
			s->let_names = sdb_realloc(s->let_names, (s->n_let + 1) * sizeof *s->let_names);
			s->let_exprs = sdb_realloc(s->let_exprs, (s->n_let + 1) * sizeof *s->let_exprs);
			s->let_names[s->n_let] = sdb_strdup(name);
			s->let_exprs[s->n_let] = NULL;
			s->n_let++;
			if ((rc = agg_expr_parse(&l, &s->let_exprs[s->n_let - 1], e)) != 0) {
				bson_destroy(&vars);
				return rc;
			}
		}
	}
	if (e->vars != NULL) {
		bson_iter_t v;

		bson_iter_init(&v, e->vars);
		while (bson_iter_next(&v)) {
			bool shadowed = false;

			for (size_t i = 0; i < s->n_let; i++) {
				shadowed = shadowed || strcmp(s->let_names[i], bson_iter_key(&v)) == 0;
			}
			if (!shadowed) {
				bson_append_iter(&vars, bson_iter_key(&v), -1, &v);
			}
		}
	}
	for (size_t i = 0; i < s->n_let; i++) {
		BSON_APPEND_NULL(&vars, s->let_names[i]);
	}
	rc = check_sub(s->sub, "$lookup", 51047, &vars, e);
	bson_destroy(&vars);
	return rc;
}

int agg_sub_depth_check(const ectx *e)
{
	if (e->opts != NULL && e->opts->sub_depth >= SDB_PIPELINE_MAX_SUB_DEPTH) {
		return efail(e, C_MAX_SUB_PIPELINE_DEPTH,
			     "Maximum number of nested sub-pipelines exceeded. Limit is %d",
			     SDB_PIPELINE_MAX_SUB_DEPTH);
	}
	return 0;
}

int agg_lookup_parse(sdb_pipeline *p, const char *name, const bson_iter_t *it, const ectx *e)
{
	int rc = agg_sub_depth_check(e);

	if (rc != 0) {
		return rc;
	}
	if (strcmp(name, "$unionWith") == 0) {
		return parse_union_with(p, it, e);
	}
	return parse_lookup(p, it, e);
}

int agg_union_open(const sdb_pipeline *p, const stage *st, sdb_pipeline_source *src,
		   const ectx *e)
{
	bson_t empty = BSON_INITIALIZER;
	int rc;

	memset(src, 0, sizeof *src);
	rc = p->foreign(p->foreign_arg, st->coll, st->sub, p->let != NULL ? p->let : &empty, src,
			e->code, e->err, e->errlen);
	if (rc < 0 && e->code != NULL && *e->code == 0) {
		*e->code = C_INTERNAL;
	}
	return rc < 0 ? rc : 0;
}

/* ---- $lookup at run time ---- */

typedef struct local_vals {
	bson_t arr; /* the values, as an array */
	uint32_t n;
} local_vals;

/* MongoDB's document_path_support::visitAllValuesAtPath: every value at the path, the
 * elements of a leaf array one by one (not the array itself). */
static bool collect_local(void *ctx, const bson_iter_t *it, unsigned flags)
{
	local_vals *lv = ctx;
	char buf[16];
	const char *key;

	if ((flags & SDB_PATH_MISSING) || it == NULL) {
		return false;
	}
	if (BSON_ITER_HOLDS_ARRAY(it) && !(flags & SDB_PATH_ELEM)) {
		return false;
	}
	bson_uint32_to_string(lv->n++, &key, buf, sizeof buf);
	bson_append_value(&lv->arr, key, -1, bson_iter_value((bson_iter_t *)it));
	return false;
}

/* The stages the foreign reader runs for one input document: the equality $match (when
 * localField/foreignField), then the user's sub-pipeline. */
static void lookup_stages(const stage *st, const bson_t *in, bson_t *out)
{
	uint32_t n = 0;
	char buf[16];
	const char *key;
	bson_iter_t it;

	bson_init(out);
	if (st->local_field != NULL) {
		local_vals lv;
		bson_t stage, match, or, cond, eq;
		bson_iter_t v;

		bson_init(&lv.arr);
		lv.n = 0;
		sdb_path_walk(in, st->local_field, SDB_PATH_EXPAND_LEAF, collect_local, &lv);
		if (lv.n == 0) {
			BSON_APPEND_NULL(&lv.arr, "0");
			lv.n = 1;
		}
		bson_uint32_to_string(n++, &key, buf, sizeof buf);
		bson_append_document_begin(out, key, -1, &stage);
		bson_append_document_begin(&stage, "$match", -1, &match);
		bson_iter_init(&v, &lv.arr);
		if (lv.n == 1 && bson_iter_next(&v)) {
			/* one value: {ff: {$eq: v}}, which the store's planner serves from an
			 * index on ff */
			bson_append_document_begin(&match, st->foreign_field, -1, &eq);
			bson_append_value(&eq, "$eq", -1, bson_iter_value(&v));
			bson_append_document_end(&match, &eq);
		} else {
			bson_append_array_begin(&match, "$or", -1, &or);
			for (uint32_t i = 0; bson_iter_next(&v); i++) {
				bson_uint32_to_string(i, &key, buf, sizeof buf);
				bson_append_document_begin(&or, key, -1, &cond);
				bson_append_document_begin(&cond, st->foreign_field, -1, &eq);
				bson_append_value(&eq, "$eq", -1, bson_iter_value(&v));
				bson_append_document_end(&cond, &eq);
				bson_append_document_end(&or, &cond);
			}
			bson_append_array_end(&match, &or);
		}
		bson_append_document_end(&stage, &match);
		bson_append_document_end(out, &stage);
		bson_destroy(&lv.arr);
	}
	if (bson_iter_init(&it, st->sub)) {
		while (bson_iter_next(&it)) {
			bson_uint32_to_string(n++, &key, buf, sizeof buf);
			bson_append_iter(out, key, -1, &it);
		}
	}
}

void agg_lookup_cache_clear(agg_lookup_cache *cache)
{
	for (size_t i = 0; i < cache->n; i++) {
		bson_destroy(cache->keys[i]);
		docbuild_free(cache->vals[i]);
	}
	free(cache->keys);
	free(cache->vals);
	memset(cache, 0, sizeof *cache);
}

static const docbuild_node *cache_find(const agg_lookup_cache *cache, const bson_t *key)
{
	for (size_t i = 0; cache != NULL && i < cache->n; i++) {
		if (cache->keys[i]->len == key->len &&
		    memcmp(bson_get_data(cache->keys[i]), bson_get_data(key), key->len) == 0) {
			return cache->vals[i];
		}
	}
	return NULL;
}

static void cache_add(agg_lookup_cache *cache, const bson_t *key, const docbuild_node *v,
		      size_t vbytes)
{
	if (cache == NULL || cache->n >= AGG_LOOKUP_CACHE_ENTRIES ||
	    cache->bytes + vbytes + key->len > AGG_LOOKUP_CACHE_BYTES) {
		return;
	}
	cache->keys = sdb_realloc(cache->keys, (cache->n + 1) * sizeof *cache->keys);
	cache->vals = sdb_realloc(cache->vals, (cache->n + 1) * sizeof *cache->vals);
	cache->keys[cache->n] = bson_copy(key);
	cache->vals[cache->n] = docbuild_clone(v);
	cache->n++;
	cache->bytes += vbytes + key->len;
}

/* Whether a sub-pipeline (or anything nested in it) has a field named $sample or $rand:
 * its result differs from one run to the next, so MongoDB runs it again for every input
 * document (lookup_random.js: "$sample in the inner pipeline should be rerun per outer
 * document") and it must not be cached. depth bounds the walk (a command's BSON is). */
static bool has_random_stage(const bson_t *b, int depth)
{
	bson_iter_t it;

	if (depth > SDB_BSON_MAX_DEPTH || !bson_iter_init(&it, b))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bson_t sub;
		const uint8_t *data;
		uint32_t len;

		if (strcmp(k, "$sample") == 0 || strcmp(k, "$rand") == 0)
			return true;
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			if (BSON_ITER_HOLDS_DOCUMENT(&it))
				bson_iter_document(&it, &len, &data);
			else
				bson_iter_array(&it, &len, &data);
			if (bson_init_static(&sub, data, len) && has_random_stage(&sub, depth + 1))
				return true;
		}
	}
	return false;
}

int agg_lookup_one(const sdb_pipeline *p, const stage *st, const bson_t *in,
		   agg_lookup_cache *cache, docbuild_node **out, const ectx *e)
{
	bson_t vars = BSON_INITIALIZER, stages;
	sdb_pipeline_source src;
	docbuild_node *arr = NULL;
	size_t bytes = 0;
	int rc = 0;

	*out = NULL;
	if (cache != NULL && st->sub != NULL && has_random_stage(st->sub, 0))
		cache = NULL;
	/* the command's variables, then this stage's let evaluated against in */
	if (p->let != NULL) {
		bson_iter_t v;

		bson_iter_init(&v, p->let);
		while (bson_iter_next(&v)) {
			bool shadowed = false;

			for (size_t i = 0; i < st->n_let; i++) {
				shadowed = shadowed || strcmp(st->let_names[i], bson_iter_key(&v)) == 0;
			}
			if (!shadowed) {
				bson_append_iter(&vars, bson_iter_key(&v), -1, &v);
			}
		}
	}
	for (size_t i = 0; i < st->n_let; i++) {
		docbuild_node *v = NULL;

		if ((rc = agg_expr_eval(st->let_exprs[i], in, &v, e)) != 0) {
			bson_destroy(&vars);
			return rc;
		}
		if (v == NULL) {
			BSON_APPEND_NULL(&vars, st->let_names[i]);
		} else {
			docbuild_append(&vars, st->let_names[i], -1, v);
			docbuild_free(v);
		}
	}
	lookup_stages(st, in, &stages);
	bson_t key = BSON_INITIALIZER;
	const docbuild_node *hit;

	BSON_APPEND_ARRAY(&key, "s", &stages);
	BSON_APPEND_DOCUMENT(&key, "v", &vars);
	if ((hit = cache_find(cache, &key)) != NULL) {
		bson_destroy(&key);
		bson_destroy(&stages);
		bson_destroy(&vars);
		*out = docbuild_clone(hit);
		return 0;
	}
	memset(&src, 0, sizeof src);
	rc = p->foreign(p->foreign_arg, st->coll, &stages, &vars, &src, e->code, e->err, e->errlen);
	bson_destroy(&stages);
	bson_destroy(&vars);
	if (rc < 0) {
		bson_destroy(&key);
		if (e->code != NULL && *e->code == 0) {
			*e->code = C_INTERNAL;
		}
		return rc;
	}
	arr = docbuild_new_array(NULL);
	for (;;) {
		const bson_t *d = NULL;

		rc = src.next(src.ctx, &d, e->code, e->err, e->errlen);
		if (rc < 0) {
			if (e->code != NULL && *e->code == 0) {
				*e->code = C_INTERNAL;
			}
			break;
		}
		if (rc == 0 || d == NULL) {
			rc = 0;
			break;
		}
		bytes += d->len;
		if (bytes > LOOKUP_MAX_BYTES) {
			rc = efail(e, 4568,
				   "Total size of documents in %s matching pipeline's $lookup stage "
				   "exceeds %d bytes",
				   st->coll, LOOKUP_MAX_BYTES);
			break;
		}
		docbuild_push(arr, docbuild_from_bson(d));
	}
	if (src.close != NULL) {
		src.close(src.ctx);
	}
	if (rc != 0) {
		bson_destroy(&key);
		docbuild_free(arr);
		return rc;
	}
	cache_add(cache, &key, arr, bytes);
	bson_destroy(&key);
	*out = arr;
	return 0;
}
