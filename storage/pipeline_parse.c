/* Compiling an aggregation pipeline (see pipeline.h): each stage's argument parsed into a
 * stage of the compiled form (pipeline_int.h), with MongoDB's checks and codes; the
 * $sort + $limit coalescing; and the pushdown of a leading $match / $sort / $limit to the
 * caller's query (sdb_pipeline_pushdown). Running the compiled pipeline is pipeline.c. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"
#include "storage/projection.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/sortspec.h"

static void stage_clear(stage *s)
{
	if (s->spec != NULL) {
		bson_destroy(s->spec);
	}
	if (s->m != NULL) {
		sdb_matcher_free(s->m);
	}
	sdb_projection_free(s->proj);
	if (s->sort != NULL) {
		sdb_sortspec_free(s->sort);
	}
	agg_expr_free(s->id);
	for (size_t i = 0; i < s->n_accs; i++) {
		free(s->accs[i].name);
		agg_expr_free(s->accs[i].x);
	}
	free(s->accs);
	free(s->path);
	free(s->index_field);
	agg_facet_free(s->facet);
	agg_lookup_clear(s);
	agg_graph_clear(s);
	memset(s, 0, sizeof *s);
}

void sdb_pipeline_free(sdb_pipeline *p)
{
	if (p == NULL) {
		return;
	}
	for (size_t i = 0; i < p->n; i++) {
		stage_clear(&p->st[i]);
	}
	free(p->st);
	if (p->let != NULL) {
		bson_destroy(p->let);
	}
	free(p);
}

static stage *add_stage(sdb_pipeline *p, skind kind)
{
	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	memset(&p->st[p->n], 0, sizeof p->st[p->n]);
	p->st[p->n].kind = kind;
	return &p->st[p->n++];
}

static bool iter_doc(const bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		return false;
	}
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

static int parse_count_name(const bson_iter_t *it, const char *stagename, char **out, const ectx *e)
{
	const char *s;

	if (!BSON_ITER_HOLDS_UTF8(it)) {
		return efail(e, 40156, "the %s field must be a non-empty string", stagename);
	}
	s = bson_iter_utf8(it, NULL);
	if (s[0] == '\0') {
		return efail(e, 40157, "the %s field must be a non-empty string", stagename);
	}
	if (s[0] == '$') {
		return efail(e, 40158, "the %s field cannot be a $-prefixed path", stagename);
	}
	if (strchr(s, '.') != NULL) {
		return efail(e, 40160, "the %s field cannot contain '.'", stagename);
	}
	*out = sdb_strdup(s);
	return 0;
}

static int parse_group(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	static const struct {
		const char *name;
		akind kind;
	} accs[] = {
		{"$sum", A_SUM},	 {"$avg", A_AVG},	    {"$min", A_MIN},
		{"$max", A_MAX},	 {"$first", A_FIRST},	    {"$last", A_LAST},
		{"$push", A_PUSH},	 {"$addToSet", A_ADDTOSET}, {"$count", A_COUNT},
		{"$stdDevPop", A_STDDEVPOP}, {"$stdDevSamp", A_STDDEVSAMP},
	};
	stage *s;
	bson_iter_t sub;
	bool has_id = false;
	int rc = 0;

	if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
		return efail(e, 15947, "a group's fields must be specified in an object");
	}
	s = add_stage(p, S_GROUP);
	bson_iter_recurse(it, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		bson_iter_t a;
		int kind = -1;

		if (strcmp(k, "_id") == 0) {
			has_id = true;
			rc = agg_expr_parse(&sub, &s->id, e);
			continue;
		}
		if (k[0] == '$' || strchr(k, '.') != NULL) {
			/* mongod's AccumulationStatement: 40235 a dotted name (checked
			 * first), 40236 an operator */
			bool dot = strchr(k, '.') != NULL;

			return efail(e, dot ? 40235 : 40236, "The field name '%s' cannot %s", k,
				     dot ? "contain '.'" : "be an operator name");
		}
		if (!BSON_ITER_HOLDS_DOCUMENT(&sub)) {
			return efail(e, 40234, "The field '%s' must be an accumulator object", k);
		}
		bson_iter_recurse(&sub, &a);
		if (!bson_iter_next(&a)) {
			return efail(e, 40234, "The field '%s' must be an accumulator object", k);
		}
		for (size_t i = 0; i < sizeof accs / sizeof accs[0]; i++) {
			if (strcmp(accs[i].name, bson_iter_key(&a)) == 0) {
				kind = (int)accs[i].kind;
			}
		}
		if (kind < 0) {
			return efail(e, 15952, "unknown group operator '%s'", bson_iter_key(&a));
		}
		s->accs = sdb_realloc(s->accs, (s->n_accs + 1) * sizeof *s->accs);
		acc_spec *ac = &s->accs[s->n_accs++];

		ac->name = sdb_strdup(k);
		ac->kind = (akind)kind;
		ac->x = NULL;
		if (kind == A_COUNT) {
			bson_t empty;

			if (!iter_doc(&a, &empty) || !bson_empty(&empty)) {
				return efail(e, 40237, "The $count accumulator is a unary operator");
			}
			continue;
		}
		rc = agg_expr_parse(&a, &ac->x, e);
		bson_iter_t extra = a;

		if (rc == 0 && bson_iter_next(&extra)) {
			return efail(e, 40238, "The field '%s' must specify one accumulator", k);
		}
	}
	if (rc == 0 && !has_id) {
		return efail(e, 15955, "a group specification must include an _id");
	}
	return rc;
}

static int parse_sort(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	bson_t spec;
	stage *s;

	if (!iter_doc(it, &spec)) {
		return efail(e, 15973, "the $sort key specification must be an object");
	}
	if (bson_empty(&spec)) {
		return efail(e, 15976, "$sort stage must have at least one sort key");
	}
	s = add_stage(p, S_SORT);
	s->spec = bson_copy(&spec);
	return sdb_sortspec_parse(&spec, &s->sort, e->code, e->err, e->errlen);
}

static int parse_unwind(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	stage *s = add_stage(p, S_UNWIND);
	const char *path = NULL;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		path = bson_iter_utf8(it, NULL);
	} else if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;

		bson_iter_recurse(it, &sub);
		while (bson_iter_next(&sub)) {
			const char *k = bson_iter_key(&sub);

			if (strcmp(k, "path") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					return efail(e, 28808, "expected a string as the path for $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				path = bson_iter_utf8(&sub, NULL);
			} else if (strcmp(k, "includeArrayIndex") == 0) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					return efail(e, 28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				const char *f = bson_iter_utf8(&sub, NULL);

				if (f[0] == '\0' || f[0] == '$') {
					return efail(e, 28822, "includeArrayIndex option to $unwind stage should not be prefixed with a '$': %s", f);
				}
				free(s->index_field);
				s->index_field = sdb_strdup(f);
			} else if (strcmp(k, "preserveNullAndEmptyArrays") == 0) {
				if (!BSON_ITER_HOLDS_BOOL(&sub)) {
					return efail(e, 28809, "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got %s",
						     type_name(bson_iter_type(&sub)));
				}
				s->preserve = bson_iter_bool(&sub);
			} else {
				return efail(e, 28811, "unrecognized option to $unwind stage: %s", k);
			}
		}
		if (path == NULL) {
			return efail(e, 28812, "no path specified to $unwind stage");
		}
	} else {
		return efail(e, 15981, "expected either a string or an object as specification for $unwind stage, got %s",
			     type_name(bson_iter_type(it)));
	}
	if (path[0] != '$') {
		return efail(e, 28818, "path option to $unwind stage should be prefixed with a '$': %s", path);
	}
	s->path = sdb_strdup(path + 1);
	return agg_field_path_ok(s->path, e);
}

static int parse_num_arg(const bson_iter_t *it, const char *stagename, int64_t *out, const ectx *e)
{
	docbuild_node *n;
	double d;

	if (!BSON_ITER_HOLDS_NUMBER(it) && !BSON_ITER_HOLDS_DECIMAL128(it)) {
		return efail(e, strcmp(stagename, "$limit") == 0 ? 15957 : 15972,
			     "the %s must be specified as a number", stagename + 1);
	}
	if (!sdb_bson_as_int64(it, out)) { /* int32, int64 exactly; integral doubles */
		n = docbuild_from_iter(it, false);
		d = num_double(n); /* decimal128 */
		docbuild_free(n);
		if (d != floor(d) || d > 9.2e18 || d < -9.2e18) {
			return efail(e, 5107200, "invalid argument to %s stage: Cannot represent as a 64-bit integer",
				     stagename);
		}
		*out = (int64_t)d;
	}
	if (strcmp(stagename, "$limit") == 0 && *out <= 0) {
		return efail(e, 15958, "the limit must be positive");
	}
	if (*out < 0) {
		return efail(e, 5107200, "invalid argument to $skip stage: Expected a non-negative number in: $skip: %lld",
			     (long long)*out);
	}
	return 0;
}

static int parse_stage(sdb_pipeline *p, const bson_iter_t *st, const ectx *e)
{
	bson_iter_t it;
	const char *name;
	int rc = 0;
	bson_t spec;

	if (!BSON_ITER_HOLDS_DOCUMENT(st)) {
		return efail(e, C_TYPE_MISMATCH, "Each element of the 'pipeline' array must be an object");
	}
	bson_iter_recurse(st, &it);
	if (!bson_iter_next(&it)) {
		return efail(e, 40323, "A pipeline stage specification object must contain exactly one field.");
	}
	{
		bson_iter_t two = it;

		if (bson_iter_next(&two)) {
			return efail(e, 40323, "A pipeline stage specification object must contain exactly one field.");
		}
	}
	name = bson_iter_key(&it);
	if (strcmp(name, "$match") == 0) {
		stage *s;

		if (!iter_doc(&it, &spec)) {
			return efail(e, 15959, "the match filter must be an expression in an object");
		}
		s = add_stage(p, S_MATCH);
		s->spec = bson_copy(&spec);
		/* $expr (at the top or in $and/$or/$nor) is built by the matcher over the
		 * expression engine; such a $match may be pushed down to the store's query,
		 * which evaluates it the same way */
		return sdb_matcher_new_vars(s->spec, SDB_MATCHER_EXPR, e->vars, &s->m, e->code,
					    e->err, e->errlen);
	}
	if (strcmp(name, "$project") == 0 || strcmp(name, "$addFields") == 0 ||
	    strcmp(name, "$set") == 0) {
		const bool addfields = name[1] != 'p';

		if (!iter_doc(&it, &spec)) {
			return efail(e, addfields ? 40272 : 15969, "%s specification must be an object", name);
		}
		if (bson_empty(&spec)) {
			return efail(e, addfields ? 40177 : 51272,
				     addfields ? "Invalid %s :: caused by :: specification must have at least one field"
					       : "Invalid %s :: caused by :: projection specification must have at least one field",
				     name);
		}
		return sdb_projection_new_vars(&spec,
					       addfields ? SDB_PROJECTION_ADD_FIELDS : SDB_PROJECTION_PROJECT,
					       e->vars, &add_stage(p, S_PROJECT)->proj, e->code, e->err,
					       e->errlen);
	}
	if (strcmp(name, "$unset") == 0) {
		/* {$project: {path: 0, ...}} */
		bson_t excl = BSON_INITIALIZER;

		if (BSON_ITER_HOLDS_UTF8(&it)) {
			BSON_APPEND_INT32(&excl, bson_iter_utf8(&it, NULL), 0);
		} else if (BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			while (bson_iter_next(&sub)) {
				if (!BSON_ITER_HOLDS_UTF8(&sub)) {
					bson_destroy(&excl);
					return efail(e, 31120, "$unset specification must be a string or an array containing only string values");
				}
				BSON_APPEND_INT32(&excl, bson_iter_utf8(&sub, NULL), 0);
			}
			if (bson_empty(&excl)) {
				bson_destroy(&excl);
				return efail(e, 31119, "$unset specification must be a string or an array with at least one field");
			}
		} else {
			bson_destroy(&excl);
			return efail(e, 31002, "$unset specification must be a string or an array");
		}
		rc = sdb_projection_new_vars(&excl, SDB_PROJECTION_PROJECT, e->vars, &add_stage(p, S_PROJECT)->proj,
					     e->code, e->err, e->errlen);
		bson_destroy(&excl);
		return rc;
	}
	if (strcmp(name, "$sort") == 0) {
		return parse_sort(p, &it, e);
	}
	if (strcmp(name, "$limit") == 0 || strcmp(name, "$skip") == 0) {
		stage *s = add_stage(p, name[1] == 'l' ? S_LIMIT : S_SKIP);

		return parse_num_arg(&it, name, &s->n, e);
	}
	if (strcmp(name, "$group") == 0) {
		return parse_group(p, &it, e);
	}
	if (strcmp(name, "$unwind") == 0) {
		return parse_unwind(p, &it, e);
	}
	if (strcmp(name, "$count") == 0) {
		/* {$group: {_id: null, NAME: {$sum: 1}}}, {$project: {_id: 0}} */
		char *field = NULL;
		stage *s;

		rc = parse_count_name(&it, "count", &field, e);
		if (rc != 0) {
			return rc;
		}
		s = add_stage(p, S_GROUP);
		s->id = sdb_calloc(1, sizeof *s->id);
		s->id->kind = X_LIT;
		s->id->lit = v_null();
		s->accs = sdb_calloc(1, sizeof *s->accs);
		s->n_accs = 1;
		s->accs[0].name = field;
		s->accs[0].kind = A_COUNT;
		{
			bson_t no_id = BSON_INITIALIZER;

			BSON_APPEND_INT32(&no_id, "_id", 0);
			rc = sdb_projection_new_vars(&no_id, SDB_PROJECTION_PROJECT, NULL,
						     &add_stage(p, S_PROJECT)->proj, e->code, e->err,
						     e->errlen);
			bson_destroy(&no_id);
		}
		return rc;
	}
	if (strcmp(name, "$sortByCount") == 0) {
		/* {$group: {_id: EXPR, count: {$sum: 1}}}, {$sort: {count: -1}} */
		stage *s;
		bson_t spec2 = BSON_INITIALIZER;

		if (BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL)[0] != '$'
					       : !BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_destroy(&spec2);
			return efail(e, 40148, "the sortByCount field must be defined as a $-prefixed path or an expression");
		}
		s = add_stage(p, S_GROUP);
		rc = agg_expr_parse(&it, &s->id, e);
		s->accs = sdb_calloc(1, sizeof *s->accs);
		s->n_accs = 1;
		s->accs[0].name = sdb_strdup("count");
		s->accs[0].kind = A_COUNT;
		if (rc != 0) {
			bson_destroy(&spec2);
			return rc;
		}
		s = add_stage(p, S_SORT);
		BSON_APPEND_INT32(&spec2, "count", -1);
		s->spec = bson_copy(&spec2);
		rc = sdb_sortspec_parse(&spec2, &s->sort, e->code, e->err, e->errlen);
		bson_destroy(&spec2);
		return rc;
	}
	if (strcmp(name, "$facet") == 0) {
		return agg_facet_parse(&it, p->max_mem, &add_stage(p, S_FACET)->facet, e);
	}
	if (strcmp(name, "$bucket") == 0) {
		/* a $group and a $sort (pipeline_bucket.c), parsed as those stages */
		bson_t group, sort, wrap = BSON_INITIALIZER;
		bson_iter_t g, so;

		rc = agg_bucket_desugar(&it, &group, &sort, e);
		if (rc != 0) {
			return rc;
		}
		BSON_APPEND_DOCUMENT(&wrap, "g", &group);
		BSON_APPEND_DOCUMENT(&wrap, "s", &sort);
		bson_destroy(&group);
		bson_destroy(&sort);
		bson_iter_init_find(&g, &wrap, "g");
		bson_iter_init_find(&so, &wrap, "s");
		rc = parse_group(p, &g, e);
		if (rc == 0) {
			rc = parse_sort(p, &so, e);
		}
		bson_destroy(&wrap);
		return rc;
	}
	if (strcmp(name, "$bucketAuto") == 0) {
		/* groupBy and output compiled as a $group's _id and accumulators
		 * (pipeline_bucketauto.c), run by pipeline.c's run_bucket_auto */
		bson_t group, wrap = BSON_INITIALIZER;
		bson_iter_t g;
		int32_t buckets;
		int gran;

		rc = agg_bucketauto_desugar(&it, &group, &buckets, &gran, e);
		if (rc != 0) {
			return rc;
		}
		BSON_APPEND_DOCUMENT(&wrap, "g", &group);
		bson_destroy(&group);
		bson_iter_init_find(&g, &wrap, "g");
		rc = parse_group(p, &g, e);
		bson_destroy(&wrap);
		if (rc == 0) {
			stage *s = &p->st[p->n - 1];

			s->kind = S_BUCKET_AUTO;
			s->n = buckets;
			s->gran = gran;
		}
		return rc;
	}
	if (strcmp(name, "$replaceRoot") == 0 || strcmp(name, "$replaceWith") == 0) {
		stage *s = add_stage(p, S_REPLACE_ROOT);

		if (name[8] == 'R') {
			bson_iter_t nr;

			if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &nr) ||
			    !bson_iter_find(&nr, "newRoot")) {
				return efail(e, 40231, "no newRoot specified for the $replaceRoot stage");
			}
			return agg_expr_parse(&nr, &s->id, e);
		}
		return agg_expr_parse(&it, &s->id, e);
	}
	if (strcmp(name, "$unionWith") == 0 || strcmp(name, "$lookup") == 0) {
		return agg_lookup_parse(p, name, &it, e);
	}
	if (strcmp(name, "$graphLookup") == 0) {
		return agg_graph_parse(p, &it, e);
	}
	if (strcmp(name, "$sample") == 0) {
		return agg_sample_parse(p, &it, e); /* pipeline_sample.c */
	}
	if (strcmp(name, "$redact") == 0) {
		return agg_redact_parse(p, &it, e); /* pipeline_redact.c */
	}
	static const char *const known[] = {
		"$geoNear", "$densify", "$fill", "$setWindowFields",
		"$indexStats", "$currentOp", "$listSessions",
		"$search", "$planCacheStats", "$listLocalSessions",
	};
	if (strcmp(name, "$out") == 0 || strcmp(name, "$merge") == 0) {
		/* the caller runs a last $out/$merge itself (common/aggwrite.h): one seen here
		 * is not the last stage, as mongod's PositionRequirement::kLast refuses */
		return efail(e, 40601, "%s can only be the final stage in the pipeline", name);
	}
	if (strcmp(name, "$changeStream") == 0) {
		/* the shard runs a leading one itself (src/shard/changestream.c) */
		return efail(e, 40602, "$changeStream is only valid as the first stage in a pipeline");
	}
	if (strcmp(name, "$documents") == 0 || strcmp(name, "$collStats") == 0) {
		/* the shard runs a leading $documents (of {aggregate: 1}) or $collStats itself
		 * (src/shard/cmd_read.c agg_exec) */
		return efail(e, 40602, "%s is only valid as the first stage in a pipeline", name);
	}
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		if (strcmp(known[i], name) == 0) {
			return efail(e, C_NOT_IMPLEMENTED, "%s is not supported by the embedded shard", name);
		}
	}
	return efail(e, 40324, "Unrecognized pipeline stage name: '%s'", name);
}

int sdb_pipeline_parse(const bson_t *stages, const sdb_pipeline_opts *opts, sdb_pipeline **out,
		       int *code, char *err, size_t errlen)
{
	ectx e = {code, err, errlen, opts != NULL ? opts->let : NULL, opts};
	sdb_pipeline *p = sdb_calloc(1, sizeof *p);
	bson_iter_t it;
	int rc = 0;

	if (opts != NULL) {
		p->foreign = opts->foreign;
		p->foreign_arg = opts->foreign_arg;
		p->sample_key_out = opts->sample_key_out;
		p->sample_key_in = opts->sample_key_in;
		if (opts->let != NULL) {
			p->let = bson_copy(opts->let);
		}
	}

	*out = NULL;
	if (code != NULL) {
		*code = 0;
	}
	p->max_mem = opts != NULL && opts->max_memory_bytes > 0 ? opts->max_memory_bytes
								: SDB_PIPELINE_MAX_MEMORY;
	if (!bson_iter_init(&it, stages)) {
		rc = efail(&e, C_TYPE_MISMATCH, "'pipeline' option must be specified as an array");
	} else if (!sdb_bson_depth_ok(stages, SDB_BSON_MAX_DEPTH)) {
		rc = efail(&e, 15, "pipeline nests deeper than %d levels", SDB_BSON_MAX_DEPTH);
	}
	while (rc == 0 && bson_iter_next(&it)) {
		rc = parse_stage(p, &it, &e);
	}
	if (rc != 0) {
		if (code != NULL && *code == 0) {
			*code = C_BAD_VALUE;
		}
		sdb_pipeline_free(p);
		return rc;
	}
	/* $sort followed by $skip/$limit: keep only the top skip+limit documents (MongoDB
	 * coalesces $sort and $limit the same way) */
	for (size_t i = 0; i < p->n; i++) {
		int64_t skipped = 0, bound = -1;

		if (p->st[i].kind != S_SORT) {
			continue;
		}
		for (size_t j = i + 1; j < p->n; j++) {
			if (p->st[j].kind == S_SKIP) {
				if (__builtin_add_overflow(skipped, p->st[j].n, &skipped)) {
					break;
				}
			} else if (p->st[j].kind == S_LIMIT) {
				int64_t end;

				if (!__builtin_add_overflow(skipped, p->st[j].n, &end) &&
				    (bound < 0 || end < bound)) {
					bound = end;
				}
			} else {
				break;
			}
		}
		if (bound > 0 && bound <= INT32_MAX) {
			p->st[i].n = bound;
		}
	}
	*out = p;
	return 0;
}

/* ---- pushdown ------------------------------------------------------------------------ */

static void drop_front(sdb_pipeline *p, size_t k)
{
	for (size_t i = 0; i < k; i++) {
		stage_clear(&p->st[i]);
	}
	if (k > 0) { /* p->st is NULL for an empty pipeline: no memmove(NULL, ...) (UBSan) */
		memmove(p->st, p->st + k, (p->n - k) * sizeof *p->st);
		p->n -= k;
	}
}

int sdb_pipeline_pushdown(sdb_pipeline *p, unsigned flags, sdb_pipeline_pushdown_t *pd)
{
	size_t i = 0;
	size_t n_match = 0;

	bson_init(&pd->filter);
	bson_init(&pd->sort);
	pd->skip = 0;
	pd->limit = -1;
	if (flags & SDB_PUSHDOWN_MATCH) {
		while (i < p->n && p->st[i].kind == S_MATCH) {
			i++;
		}
		n_match = i;
		if (n_match == 1) {
			bson_concat(&pd->filter, p->st[0].spec);
		} else if (n_match > 1) {
			bson_t arr;
			char buf[16];
			const char *key;

			bson_append_array_begin(&pd->filter, "$and", 4, &arr);
			for (size_t k = 0; k < n_match; k++) {
				bson_uint32_to_string((uint32_t)k, &key, buf, sizeof buf);
				bson_append_document(&arr, key, -1, p->st[k].spec);
			}
			bson_append_array_end(&pd->filter, &arr);
		}
	}
	if ((flags & SDB_PUSHDOWN_SORT) && i < p->n && p->st[i].kind == S_SORT) {
		bson_concat(&pd->sort, p->st[i].spec);
		i++;
		if (flags & SDB_PUSHDOWN_LIMIT) {
			/* fold $skip/$limit runs: skip a then limit b = window [a, a+b) */
			while (i < p->n && (p->st[i].kind == S_SKIP || p->st[i].kind == S_LIMIT)) {
				if (p->st[i].kind == S_SKIP) {
					pd->skip = pd->skip > INT64_MAX - p->st[i].n ? INT64_MAX
										     : pd->skip + p->st[i].n;
					if (pd->limit >= 0) {
						pd->limit = pd->limit > p->st[i].n ? pd->limit - p->st[i].n : 0;
					}
				} else if (pd->limit < 0 || p->st[i].n < pd->limit) {
					pd->limit = p->st[i].n;
				}
				i++;
			}
		}
	}
	drop_front(p, i);
	return 0;
}

void sdb_pipeline_pushdown_destroy(sdb_pipeline_pushdown_t *pd)
{
	bson_destroy(&pd->filter);
	bson_destroy(&pd->sort);
}
