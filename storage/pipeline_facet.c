/* $facet (see pipeline_int.h agg_facet_*): several sub-pipelines over the same input, one
 * output document {name: [results], ...}, with MongoDB 6.0's checks and codes
 * (mongo/db/pipeline/document_source_facet.cpp). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <stdio.h>
#include <string.h>

struct agg_facet {
	size_t n;
	char **names;
	sdb_pipeline **subs;
};

void agg_facet_free(agg_facet *f)
{
	if (f == NULL)
		return;
	for (size_t i = 0; i < f->n; i++) {
		free(f->names[i]);
		sdb_pipeline_free(f->subs[i]);
	}
	free(f->names);
	free(f->subs);
	free(f);
}

/* The stages a sub-pipeline may not hold (DocumentSourceFacet's constraints). */
static const char *const not_in_facet[] = {
	"$facet",	  "$collStats", "$indexStats", "$geoNear", "$out",
	"$merge",	  "$planCacheStats", "$changeStream", "$documents",
};

/* 0 when name is a valid facet name (FieldPath::uassertValidFieldName). */
static int check_name(const char *name, const ectx *e)
{
	if (name[0] == '\0')
		return efail(e, 15998, "FieldPath field names may not be empty strings.");
	if (name[0] == '$')
		return efail(e, 16410, "FieldPath field names may not start with '$'.");
	if (strchr(name, '.') != NULL)
		return efail(e, 16412, "FieldPath field names may not contain '.'.");
	return 0;
}

int agg_facet_parse(const bson_iter_t *it, size_t max_mem, agg_facet **out, const ectx *e)
{
	bson_iter_t sub, st, first;
	agg_facet *f;
	int rc = 0;

	*out = NULL;
	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &sub) || !bson_iter_next(&sub))
		return efail(e, 40169, "the $facet specification must be a non-empty object");
	f = sdb_calloc(1, sizeof *f);
	bson_iter_recurse(it, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *name = bson_iter_key(&sub);
		bson_t stages;
		const uint8_t *data;
		uint32_t len;

		rc = check_name(name, e);
		if (rc != 0)
			break;
		if (!BSON_ITER_HOLDS_ARRAY(&sub)) {
			rc = efail(e, 40170, "arguments to $facet must be arrays, %s is type %s", name,
				   type_name(bson_iter_type(&sub)));
			break;
		}
		bson_iter_recurse(&sub, &st);
		while (rc == 0 && bson_iter_next(&st)) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&st)) {
				rc = efail(e, 40171,
					   "elements of arrays in $facet spec must be non-empty objects, "
					   "%s argument contained an element of type %s",
					   name, type_name(bson_iter_type(&st)));
				break;
			}
			if (!bson_iter_recurse(&st, &first) || !bson_iter_next(&first))
				continue; /* the sub-pipeline's parser refuses an empty stage */
			for (size_t k = 0; k < sizeof not_in_facet / sizeof not_in_facet[0]; k++)
				if (strcmp(bson_iter_key(&first), not_in_facet[k]) == 0) {
					rc = efail(e, 40600, "%s is not allowed to be used within a $facet stage",
						   not_in_facet[k]);
					break;
				}
		}
		if (rc != 0)
			break;
		bson_iter_array(&sub, &len, &data);
		if (!bson_init_static(&stages, data, len)) {
			rc = efail(e, C_FAILED_TO_PARSE, "malformed $facet pipeline %s", name);
			break;
		}
		sdb_pipeline_opts opts = {.max_memory_bytes = max_mem, .let = e->vars};
		if (e->opts != NULL) {
			opts.foreign = e->opts->foreign;
			opts.foreign_arg = e->opts->foreign_arg;
			opts.sub_depth = e->opts->sub_depth;
		}
		sdb_pipeline *p = NULL;

		rc = sdb_pipeline_parse(&stages, &opts, &p, e->code, e->err, e->errlen);
		if (rc != 0)
			break;
		f->names = sdb_realloc(f->names, (f->n + 1) * sizeof *f->names);
		f->subs = sdb_realloc(f->subs, (f->n + 1) * sizeof *f->subs);
		f->names[f->n] = sdb_strdup(name);
		f->subs[f->n++] = p;
	}
	if (rc != 0) {
		agg_facet_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

/* The buffered input of one sub-pipeline run. */
typedef struct {
	bson_t *const *docs;
	size_t n, pos;
} facet_input;

static int facet_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	facet_input *in = ctx;

	(void)code;
	(void)err;
	(void)errlen;
	if (in->pos >= in->n) {
		*doc = NULL;
		return 0;
	}
	*doc = in->docs[in->pos++];
	return 1;
}

int agg_facet_run(const agg_facet *f, bson_t *const *docs, size_t n, size_t max_bytes,
		  bson_t **out, const ectx *e)
{
	bson_t *res = bson_new();
	int rc = 0;

	*out = NULL;
	for (size_t i = 0; rc == 0 && i < f->n; i++) {
		facet_input in = {docs, n, 0};
		sdb_pipeline_cursor *c;
		bson_t arr;
		char k[16];
		uint32_t j = 0;

		sdb_pipeline_open(f->subs[i], facet_next, &in, &c);
		bson_append_array_begin(res, f->names[i], -1, &arr);
		for (;;) {
			const bson_t *d;

			rc = sdb_pipeline_cursor_next(c, &d, e->code, e->err, e->errlen);
			if (rc <= 0)
				break;
			snprintf(k, sizeof k, "%u", j++);
			bson_append_document(&arr, k, -1, d);
			if ((size_t)res->len + arr.len > max_bytes) {
				rc = efail(e, 4031700,
					   "document constructed by $facet is %zu bytes, which exceeds "
					   "the limit of %zu bytes",
					   (size_t)res->len + arr.len, max_bytes);
				break;
			}
		}
		bson_append_array_end(res, &arr);
		sdb_pipeline_cursor_free(c);
	}
	if (rc != 0) {
		bson_destroy(res);
		return rc < 0 ? rc : SDB_EINVAL;
	}
	*out = res;
	return 0;
}
