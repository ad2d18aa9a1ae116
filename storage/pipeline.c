/* The aggregation pipeline engine (see pipeline.h).
 *
 * Stages are pulled: cursor_next asks the last stage for a document, which asks the
 * stage before it, down to the store's input iterator. Documents travel between stages
 * as heap bson_t (bson_new/bson_copy give libbson's 128-byte alignment). Expressions are
 * compiled once into a tree and evaluated into docbuild nodes (NULL meaning "missing";
 * pipeline_expr.c); $project, $unset and $addFields/$set are compiled by the projection engine
 * that find projections use too (projection.h).
 *
 * Why this file is over 1,500 lines: stage parsing, pushdown, the pull cursor and the
 * blocking stages ($sort, $group, $unwind) share the cursor's private state (sdb_pipeline_
 * cursor, its memory accounting and sort/keyset helpers) in both directions; moving $group
 * and $unwind out would put that state in pipeline_int.h for ~550 lines.
 */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"
#include "storage/projection.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/bsonval.h"
#include "storage/docbuild.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"

/* ---- stages -------------------------------------------------------------------------- */

typedef enum {
	S_MATCH = 0,
	S_PROJECT, /* $project, $unset, $addFields/$set, $count's _id removal (projection.h) */
	S_SORT,
	S_LIMIT,
	S_SKIP,
	S_GROUP,
	S_UNWIND,
	S_REPLACE_ROOT,
	S_FACET, /* $facet: buffers its input, runs each sub-pipeline over it (pipeline_facet.c) */
} skind;

typedef enum {
	A_SUM = 0,
	A_AVG,
	A_MIN,
	A_MAX,
	A_FIRST,
	A_LAST,
	A_PUSH,
	A_ADDTOSET,
	A_COUNT,
} akind;

typedef struct {
	char *name;
	akind kind;
	expr *x;
} acc_spec;

typedef struct stage {
	skind kind;
	bson_t *spec;     /* a copy of the stage's argument (for pushdown) */
	sdb_matcher *m;   /* $match */
	sdb_projection *proj; /* S_PROJECT */
	sdb_sortspec *sort;
	int64_t n;        /* $limit/$skip; $sort: top-k bound from a following $limit (0 = none) */
	expr *id;         /* $group _id, $replaceRoot newRoot */
	acc_spec *accs;
	size_t n_accs;
	char *path;       /* $unwind */
	char *index_field;
	bool preserve;
	bool sort_by_count_desc; /* $sortByCount: the group is followed by a count sort */
	agg_facet *facet;         /* $facet */
} stage;

struct sdb_pipeline {
	stage *st;
	size_t n;
	size_t max_mem;
};

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
			return efail(e, 40236, "The field name '%s' cannot %s", k,
				     k[0] == '$' ? "be an operator name" : "contain '.'");
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
	static const char *const known[] = {
		"$lookup", "$out", "$merge", "$bucketAuto", "$graphLookup",
		"$geoNear", "$sample", "$redact", "$densify", "$fill", "$setWindowFields",
		"$unionWith", "$indexStats", "$currentOp", "$listSessions",
		"$search", "$changeStream", "$planCacheStats", "$listLocalSessions",
	};
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
	ectx e = {code, err, errlen, opts != NULL ? opts->let : NULL};
	sdb_pipeline *p = sdb_calloc(1, sizeof *p);
	bson_iter_t it;
	int rc = 0;

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

/* ---- cursors ------------------------------------------------------------------------- */

/* A set of encoded keys (open addressing, linear probing); a slot is empty when its data
 * is NULL (an encoded value is never empty). */
typedef struct {
	sdb_key *slots;
	size_t cap;
	size_t n;
} keyset;

static uint64_t key_hash(const sdb_key *k);

static void keyset_free(keyset *s)
{
	for (size_t i = 0; i < s->cap; i++) {
		sdb_key_free(&s->slots[i]);
	}
	free(s->slots);
	memset(s, 0, sizeof *s);
}

static void keyset_place(sdb_key *slots, size_t cap, sdb_key *k)
{
	size_t i = (size_t)(key_hash(k) & (cap - 1));

	while (slots[i].data != NULL) {
		i = (i + 1) & (cap - 1);
	}
	slots[i] = *k;
}

/* Add k (taking ownership) unless an equal key is there (then k is freed). Returns true
 * when added. */
static bool keyset_add(keyset *s, sdb_key *k)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t cap = s->cap == 0 ? 16 : s->cap * 2;
		sdb_key *slots = sdb_calloc(cap, sizeof *slots);

		for (size_t i = 0; i < s->cap; i++) {
			if (s->slots[i].data != NULL) {
				keyset_place(slots, cap, &s->slots[i]);
			}
		}
		free(s->slots);
		s->slots = slots;
		s->cap = cap;
	}
	for (size_t i = (size_t)(key_hash(k) & (s->cap - 1));; i = (i + 1) & (s->cap - 1)) {
		if (s->slots[i].data == NULL) {
			s->slots[i] = *k;
			s->n++;
			return true;
		}
		if (sdb_key_cmp(&s->slots[i], k) == 0) {
			sdb_key_free(k);
			return false;
		}
	}
}

typedef struct {
	akind kind;
	keyset seen;      /* $addToSet: keys of the values in v */
	docbuild_node *v; /* min/max/first/last value, or push/addToSet array */
	bool set;
	int64_t isum;
	double dsum;
	bool is_long, is_double, overflow;
	int64_t count;
} acc_state;

typedef struct group {
	sdb_key key;
	docbuild_node *id;
	acc_state *acc;
	struct group *next_in_bucket;
} group;

typedef struct sitem {
	bson_t *doc;
	uint64_t seq;
	sdb_key key;
} sitem;

typedef struct {
	/* $sort */
	sitem *items; /* $sort: held documents with their sort keys */
	size_t n, cap;
	size_t pos;
	bool loaded;
	size_t mem;
	/* $limit/$skip */
	int64_t count;
	/* $group */
	group **buckets;
	size_t n_buckets;
	group **order;
	size_t n_groups;
	/* $unwind */
	bson_t *cur;
	docbuild_node *cur_arr;
	size_t cur_i;
} stage_state;

struct sdb_pipeline_cursor {
	const sdb_pipeline *p;
	sdb_pipeline_next_fn next;
	void *ctx;
	stage_state *ss;
	bson_t *out;
	int done_rc; /* 1 = running, 0 = ended, <0 = failed */
	int done_code;
	char done_err[256];
	bool input_done;
};

void sdb_pipeline_open(const sdb_pipeline *p, sdb_pipeline_next_fn next, void *ctx,
		       sdb_pipeline_cursor **out)
{
	sdb_pipeline_cursor *c = sdb_calloc(1, sizeof *c);

	c->p = p;
	c->next = next;
	c->ctx = ctx;
	c->ss = sdb_calloc(p->n + 1, sizeof *c->ss);
	c->done_rc = 1;
	*out = c;
}

static void state_clear(stage_state *s)
{
	for (size_t i = s->pos; i < s->n; i++) {
		bson_destroy(s->items[i].doc);
		sdb_key_free(&s->items[i].key);
	}
	free(s->items);
	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];

		sdb_key_free(&g->key);
		docbuild_free(g->id);
		/* accumulator values are freed when emitted; leftovers here */
		free(g->acc);
		free(g);
	}
	free(s->order);
	free(s->buckets);
	if (s->cur != NULL) {
		bson_destroy(s->cur);
	}
	docbuild_free(s->cur_arr);
}

void sdb_pipeline_cursor_free(sdb_pipeline_cursor *c)
{
	if (c == NULL) {
		return;
	}
	for (size_t i = 0; i < c->p->n; i++) {
		stage_state *s = &c->ss[i];

		if (c->p->st[i].kind == S_GROUP) {
			for (size_t g = s->pos; g < s->n_groups; g++) {
				for (size_t a = 0; a < c->p->st[i].n_accs; a++) {
					docbuild_free(s->order[g]->acc[a].v);
					keyset_free(&s->order[g]->acc[a].seen);
				}
			}
		}
		state_clear(s);
	}
	free(c->ss);
	if (c->out != NULL) {
		bson_destroy(c->out);
	}
	free(c);
}

static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e);

static int pull_input(sdb_pipeline_cursor *c, bson_t **doc, const ectx *e)
{
	const bson_t *in = NULL;
	int rc;

	*doc = NULL;
	if (c->input_done) {
		return 0;
	}
	rc = c->next(c->ctx, &in, e->code, e->err, e->errlen);
	if (rc < 0) {
		if (e->code != NULL && *e->code == 0) {
			*e->code = C_INTERNAL;
		}
		return rc;
	}
	if (rc == 0 || in == NULL) {
		c->input_done = true;
		return 0;
	}
	*doc = bson_copy(in);
	return 0;
}

static bson_t *node_to_heap(const docbuild_node *n)
{
	bson_t tmp;
	bson_t *b;

	docbuild_to_bson(n, &tmp);
	b = bson_copy(&tmp);
	bson_destroy(&tmp);
	return b;
}

static int memory_error(const ectx *e, const char *stage)
{
	if (e->code != NULL) {
		*e->code = C_MEMORY;
	}
	snprintf(e->err, e->errlen,
		 "Exceeded memory limit for %s, but didn't allow external sort. Pass allowDiskUse:true to opt in.",
		 stage);
	return SDB_ETOOBIG;
}

static int sitem_cmp(const sitem *x, const sitem *y)
{
	int r = sdb_key_cmp(&x->key, &y->key);

	if (r != 0) {
		return r;
	}
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Merge sort of items[0..n) with scratch space tmp (n entries); no global state, so
 * cursors on several threads may sort at once. */
static void msort(sitem *items, sitem *tmp, size_t n)
{
	size_t h, i, j, k;

	if (n < 2) {
		return;
	}
	h = n / 2;
	msort(items, tmp, h);
	msort(items + h, tmp, n - h);
	for (i = 0, j = h, k = 0; i < h && j < n;) {
		tmp[k++] = sitem_cmp(&items[j], &items[i]) < 0 ? items[j++] : items[i++];
	}
	while (i < h) {
		tmp[k++] = items[i++];
	}
	while (j < n) {
		tmp[k++] = items[j++];
	}
	memcpy(items, tmp, n * sizeof *items);
}

static size_t sitem_mem(const sitem *it)
{
	return it->doc->len + sizeof(bson_t) + it->key.len + sizeof *it;
}

/* Sort s->items[0..n) stably; keep at most keep (0 = all). */
static void sort_docs(stage_state *s, size_t keep)
{
	sitem *tmp = sdb_malloc((s->n + 1) * sizeof *tmp);

	msort(s->items, tmp, s->n);
	free(tmp);
	if (keep > 0 && s->n > keep) {
		for (size_t i = keep; i < s->n; i++) {
			s->mem -= sitem_mem(&s->items[i]);
			bson_destroy(s->items[i].doc);
			sdb_key_free(&s->items[i].key);
		}
		s->n = keep;
	}
}

static int run_sort(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];
	size_t keep = st->n > 0 ? (size_t)st->n : 0;
	uint64_t seq = 0;

	for (;;) {
		bson_t *d = NULL;
		sitem *it;
		int rc = pull(c, i, &d, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		if (s->n == s->cap) {
			s->cap = s->cap == 0 ? 64 : s->cap * 2;
			s->items = sdb_realloc(s->items, s->cap * sizeof *s->items);
		}
		it = &s->items[s->n];
		it->doc = d;
		it->seq = seq++;
		sdb_key_init(&it->key);
		/* the sort key is computed once per document (storage/sortspec.h) */
		rc = sdb_sortspec_key(st->sort, d, &it->key, e->err, e->errlen);
		s->n++;
		if (rc != 0) {
			if (e->code != NULL) {
				*e->code = C_BAD_VALUE;
			}
			return rc;
		}
		s->mem += sitem_mem(it);
		if (keep > 0 && s->n >= 2 * keep + 64) {
			sort_docs(s, keep);
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$sort");
		}
	}
	sort_docs(s, keep);
	return 0;
}

/* ---- $group ---- */

static uint64_t key_hash(const sdb_key *k)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < k->len; i++) {
		h ^= k->data[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void groups_grow(stage_state *s)
{
	size_t nb = s->n_buckets == 0 ? 64 : s->n_buckets * 2;
	group **b = sdb_calloc(nb, sizeof *b);

	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];
		size_t h = (size_t)(key_hash(&g->key) % nb);

		g->next_in_bucket = b[h];
		b[h] = g;
	}
	free(s->buckets);
	s->buckets = b;
	s->n_buckets = nb;
}

static void acc_add(acc_state *a, docbuild_node *v, size_t *mem)
{
	switch (a->kind) {
	case A_COUNT:
		a->count++;
		break;
	case A_SUM:
	case A_AVG:
		if (!is_number(v)) {
			break;
		}
		a->count++;
		a->dsum += num_double(v);
		if (v->type == BSON_TYPE_DOUBLE || v->type == BSON_TYPE_DECIMAL128) {
			a->is_double = true;
		} else {
			int64_t iv = v->type == BSON_TYPE_INT64 ? v->value.value.v_int64 : v->value.value.v_int32;

			if (v->type == BSON_TYPE_INT64) {
				a->is_long = true;
			}
			if (__builtin_add_overflow(a->isum, iv, &a->isum)) {
				a->overflow = true;
			}
		}
		break;
	case A_MIN:
	case A_MAX:
		if (is_nullish(v)) {
			break;
		}
		if (a->v == NULL || (a->kind == A_MIN ? vcmp(v, a->v) < 0 : vcmp(v, a->v) > 0)) {
			docbuild_free(a->v);
			a->v = v;
			return;
		}
		break;
	case A_FIRST:
		if (!a->set) {
			a->set = true;
			a->v = v;
			return;
		}
		break;
	case A_LAST:
		docbuild_free(a->v);
		a->v = v;
		return;
	case A_PUSH:
	case A_ADDTOSET:
		if (v == NULL) {
			break;
		}
		if (a->v == NULL) {
			a->v = docbuild_new_array(NULL);
		}
		if (a->kind == A_ADDTOSET) {
			sdb_key k;
			bson_t scratch;
			bson_value_t bv;

			sdb_key_init(&k);
			docbuild_value(v, &scratch, &bv);
			(void)sdb_keyenc_append_value(&k, &bv, false, NULL, 0);
			bson_destroy(&scratch);
			if (!keyset_add(&a->seen, &k)) {
				docbuild_free(v);
				return;
			}
			*mem += k.len + sizeof k;
		}
		*mem += node_size(v);
		docbuild_push(a->v, v);
		return;
	}
	docbuild_free(v);
}

static docbuild_node *acc_result(acc_state *a)
{
	docbuild_node *v;

	keyset_free(&a->seen);

	switch (a->kind) {
	case A_COUNT:
		return a->count <= INT32_MAX ? v_int32((int32_t)a->count) : v_int64(a->count);
	case A_SUM:
		if (a->is_double || a->overflow) {
			return v_double(a->dsum);
		}
		if (a->is_long || a->isum < INT32_MIN || a->isum > INT32_MAX) {
			return v_int64(a->isum);
		}
		return v_int32((int32_t)a->isum);
	case A_AVG:
		return a->count == 0 ? v_null() : v_double(a->dsum / (double)a->count);
	case A_PUSH:
	case A_ADDTOSET:
		v = a->v != NULL ? a->v : docbuild_new_array(NULL);
		a->v = NULL;
		return v;
	default:
		v = a->v != NULL ? a->v : v_null();
		a->v = NULL;
		return v;
	}
}

static int run_group(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		bson_t *d = NULL;
		docbuild_node *id = NULL;
		bson_t scratch;
		bson_value_t idv;
		sdb_key key;
		group *g;
		int rc = pull(c, i, &d, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		rc = agg_expr_eval(st->id, d, &id, e);
		if (rc != 0) {
			bson_destroy(d);
			return rc;
		}
		if (id == NULL) {
			id = v_null();
		}
		sdb_key_init(&key);
		docbuild_value(id, &scratch, &idv);
		rc = sdb_keyenc_append_value(&key, &idv, false, e->err, e->errlen);
		bson_destroy(&scratch);
		if (rc != 0) {
			sdb_key_free(&key);
			docbuild_free(id);
			bson_destroy(d);
			if (e->code != NULL) {
				*e->code = C_BAD_VALUE;
			}
			return rc;
		}
		if (s->n_groups >= s->n_buckets) {
			groups_grow(s);
		}
		size_t h = (size_t)(key_hash(&key) % s->n_buckets);

		for (g = s->buckets[h]; g != NULL; g = g->next_in_bucket) {
			if (sdb_key_cmp(&g->key, &key) == 0) {
				break;
			}
		}
		if (g == NULL) {
			g = sdb_calloc(1, sizeof *g);
			g->key = key;
			g->id = id;
			g->acc = sdb_calloc(st->n_accs + 1, sizeof *g->acc);
			for (size_t a = 0; a < st->n_accs; a++) {
				g->acc[a].kind = st->accs[a].kind;
			}
			g->next_in_bucket = s->buckets[h];
			s->buckets[h] = g;
			s->order = sdb_realloc(s->order, (s->n_groups + 1) * sizeof *s->order);
			s->order[s->n_groups++] = g;
			s->mem += key.len * 2 + node_size(id) + sizeof *g + st->n_accs * sizeof *g->acc;
		} else {
			sdb_key_free(&key);
			docbuild_free(id);
		}
		for (size_t a = 0; a < st->n_accs && rc == 0; a++) {
			docbuild_node *v = NULL;

			if (st->accs[a].x != NULL) {
				rc = agg_expr_eval(st->accs[a].x, d, &v, e);
			}
			if (rc == 0) {
				size_t before = 0;
				acc_state *as = &g->acc[a];

				if (as->kind == A_MIN || as->kind == A_MAX || as->kind == A_FIRST ||
				    as->kind == A_LAST) {
					before = as->v != NULL ? node_size(as->v) : 0;
					acc_add(as, v, &s->mem);
					s->mem += (as->v != NULL ? node_size(as->v) : 0);
					s->mem -= before < s->mem ? before : s->mem;
				} else {
					acc_add(as, v, &s->mem);
				}
			} else {
				docbuild_free(v);
			}
		}
		bson_destroy(d);
		if (rc != 0) {
			return rc;
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$group");
		}
	}
	return 0;
}

static bson_t *group_emit(const stage *st, stage_state *s)
{
	group *g = s->order[s->pos++];
	docbuild_node *d = docbuild_new_doc(NULL);
	bson_t *out;

	docbuild_set_key(g->id, "_id");
	docbuild_push(d, g->id);
	g->id = NULL;
	for (size_t a = 0; a < st->n_accs; a++) {
		docbuild_node *v = acc_result(&g->acc[a]);

		docbuild_set_key(v, st->accs[a].name);
		docbuild_push(d, v);
	}
	out = node_to_heap(d);
	docbuild_free(d);
	return out;
}

void agg_set_field(docbuild_node *doc, const char *name, docbuild_node *v)
{
	size_t idx;

	if (docbuild_field(doc, name, strlen(name), &idx) != NULL) {
		if (v == NULL) {
			docbuild_free(docbuild_take(doc, idx));
		} else {
			docbuild_replace(doc, idx, v);
		}
		return;
	}
	if (v != NULL) {
		docbuild_set_key(v, name);
		docbuild_push(doc, v);
	}
}

/* ---- $unwind ---- */

static void set_path(docbuild_node *doc, const char *path, docbuild_node *v)
{
	const char *dot = strchr(path, '.');
	size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
	size_t idx;
	docbuild_node *f = docbuild_field(doc, path, len, &idx);

	if (dot == NULL) {
		char *k = sdb_strndup(path, len);

		agg_set_field(doc, k, v);
		free(k);
		return;
	}
	if (f == NULL || f->type != BSON_TYPE_DOCUMENT) {
		char *k = sdb_strndup(path, len);
		docbuild_node *sub = docbuild_new_doc(NULL);

		agg_set_field(doc, k, sub);
		free(k);
		f = docbuild_field(doc, path, len, &idx);
	}
	set_path(f, dot + 1, v);
}

/* The value at a dotted path through documents only (no array traversal). */
static docbuild_node *unwind_value(const bson_t *doc, const char *path)
{
	bson_iter_t it, found;

	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &found)) {
		return docbuild_from_iter(&found, false);
	}
	return NULL;
}

static int unwind_next(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		if (s->cur != NULL && s->cur_arr != NULL && s->cur_i < s->cur_arr->n) {
			docbuild_node *d = docbuild_from_bson(s->cur);
			docbuild_node *el = docbuild_clone(s->cur_arr->kids[s->cur_i]);

			set_path(d, st->path, el);
			if (st->index_field != NULL) {
				set_path(d, st->index_field, v_int64((int64_t)s->cur_i));
			}
			s->cur_i++;
			*doc = node_to_heap(d);
			docbuild_free(d);
			return 0;
		}
		if (s->cur != NULL) {
			bson_destroy(s->cur);
			s->cur = NULL;
		}
		docbuild_free(s->cur_arr);
		s->cur_arr = NULL;

		bson_t *in = NULL;
		int rc = pull(c, i, &in, e);

		if (rc != 0 || in == NULL) {
			*doc = NULL;
			return rc;
		}
		docbuild_node *v = unwind_value(in, st->path);

		if (v != NULL && v->type == BSON_TYPE_ARRAY && v->n > 0) {
			s->cur = in;
			s->cur_arr = v;
			s->cur_i = 0;
			continue;
		}
		bool emptyish = v == NULL || v->type == BSON_TYPE_NULL || v->type == BSON_TYPE_ARRAY ||
				v->type == BSON_TYPE_UNDEFINED;

		if (emptyish && !st->preserve) {
			docbuild_free(v);
			bson_destroy(in);
			continue;
		}
		/* a non-array value passes as is; preserved null/missing/empty too */
		if (st->index_field != NULL) {
			docbuild_node *d = docbuild_from_bson(in);

			if (v != NULL && v->type == BSON_TYPE_ARRAY) {
				/* preserved empty array: MongoDB drops the field */
				set_path(d, st->path, NULL);
			}
			set_path(d, st->index_field, v_null());
			bson_destroy(in);
			in = node_to_heap(d);
			docbuild_free(d);
		} else if (v != NULL && v->type == BSON_TYPE_ARRAY) {
			docbuild_node *d = docbuild_from_bson(in);

			set_path(d, st->path, NULL);
			bson_destroy(in);
			in = node_to_heap(d);
			docbuild_free(d);
		}
		docbuild_free(v);
		*doc = in;
		return 0;
	}
}

/* $facet: read all of stage i's input (held within max_mem bytes, as $sort), then its one
 * output document (agg_facet_run; at most a BSON document's 16 MiB, where mongod allows
 * 100 MB for a document that a later stage reduces). */
static int run_facet(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	bson_t **docs = NULL;
	size_t n = 0, cap = 0, mem = 0;
	int rc;

	for (;;) {
		bson_t *d = NULL;

		rc = pull(c, i, &d, e);
		if (rc != 0 || d == NULL) {
			break;
		}
		if (n == cap) {
			cap = cap == 0 ? 64 : cap * 2;
			docs = sdb_realloc(docs, cap * sizeof *docs);
		}
		docs[n++] = d;
		mem += d->len;
		if (mem > c->p->max_mem) {
			rc = memory_error(e, "$facet");
			break;
		}
	}
	if (rc == 0) {
		rc = agg_facet_run(c->p->st[i].facet, docs, n, AGG_FACET_MAX_BYTES, doc, e);
	}
	for (size_t k = 0; k < n; k++) {
		bson_destroy(docs[k]);
	}
	free(docs);
	return rc;
}

/* Pull the output of stage i-1 (the input of stage i); i == 0 reads the store. */
static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st;
	stage_state *s;
	int rc;

	*doc = NULL;
	if (i == 0) {
		return pull_input(c, doc, e);
	}
	st = &c->p->st[i - 1];
	s = &c->ss[i - 1];
	for (;;) {
		bson_t *in = NULL;

		switch (st->kind) {
		case S_SORT:
			if (!s->loaded) {
				s->loaded = true;
				rc = run_sort(c, i - 1, e);
				if (rc != 0) {
					return rc;
				}
			}
			if (s->pos < s->n) {
				sdb_key_free(&s->items[s->pos].key);
				*doc = s->items[s->pos++].doc;
			}
			return 0;
		case S_GROUP:
			if (!s->loaded) {
				s->loaded = true;
				rc = run_group(c, i - 1, e);
				if (rc != 0) {
					return rc;
				}
			}
			if (s->pos < s->n_groups) {
				*doc = group_emit(st, s);
			}
			return 0;
		case S_UNWIND:
			return unwind_next(c, i - 1, doc, e);
		case S_FACET:
			if (s->loaded) {
				return 0; /* its one document is out */
			}
			s->loaded = true;
			return run_facet(c, i - 1, doc, e);
		case S_LIMIT:
			if (s->count >= st->n) {
				return 0;
			}
			rc = pull(c, i - 1, doc, e);
			if (rc == 0 && *doc != NULL) {
				s->count++;
			}
			return rc;
		default:
			break;
		}
		rc = pull(c, i - 1, &in, e);
		if (rc != 0 || in == NULL) {
			return rc;
		}
		switch (st->kind) {
		case S_MATCH:
			rc = sdb_matcher_eval(st->m, in, e->code, e->err, e->errlen);
			if (rc == 1) {
				*doc = in;
				return 0;
			}
			bson_destroy(in);
			if (rc < 0) {
				return rc; /* a $expr failed */
			}
			continue;
		case S_SKIP:
			if (s->count < st->n) {
				s->count++;
				bson_destroy(in);
				continue;
			}
			*doc = in;
			return 0;
		case S_PROJECT: {
			bson_t *r = bson_new();

			rc = sdb_projection_eval(st->proj, in, r, e->code, e->err, e->errlen);
			bson_destroy(in);
			if (rc != 0) {
				bson_destroy(r);
				return rc;
			}
			*doc = r;
			return 0;
		}
		case S_REPLACE_ROOT: {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(st->id, in, &v, e);
			bson_destroy(in);
			if (rc != 0) {
				return rc;
			}
			if (ntype(v) != BSON_TYPE_DOCUMENT) {
				rc = efail(e, 40228,
					   "'newRoot' expression must evaluate to an object, but resulting value was of type: %s",
					   type_name(ntype(v)));
				docbuild_free(v);
				return rc;
			}
			*doc = node_to_heap(v);
			docbuild_free(v);
			return 0;
		}
		default:
			bson_destroy(in);
			return efail(e, C_INTERNAL, "unhandled stage");
		}
	}
}

int sdb_pipeline_cursor_next(sdb_pipeline_cursor *c, const bson_t **doc, int *code, char *err,
			     size_t errlen)
{
	ectx e = {code, err, errlen};
	bson_t *d = NULL;
	int rc;

	*doc = NULL;
	if (code != NULL) {
		*code = 0;
	}
	if (c->done_rc <= 0) {
		if (code != NULL) {
			*code = c->done_code;
		}
		if (err != NULL && errlen > 0) {
			snprintf(err, errlen, "%s", c->done_err);
		}
		return c->done_rc;
	}
	if (c->out != NULL) {
		bson_destroy(c->out);
		c->out = NULL;
	}
	rc = pull(c, c->p->n, &d, &e);
	if (rc != 0) {
		if (code != NULL && *code == 0) {
			*code = C_INTERNAL;
		}
		c->done_rc = rc;
		c->done_code = code != NULL ? *code : C_INTERNAL;
		snprintf(c->done_err, sizeof c->done_err, "%s", err != NULL ? err : "");
		return rc;
	}
	if (d == NULL) {
		c->done_rc = 0;
		return 0;
	}
	c->out = d;
	*doc = d;
	return 1;
}
