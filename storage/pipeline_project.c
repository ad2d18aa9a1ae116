/* Projection trees of the pipeline engine ($project, $addFields/$set, $unset; see
 * pipeline_int.h): a spec is parsed once into a tree of path components whose leaves
 * include, exclude or compute a field, then applied to each document (MongoDB's
 * mongo/db/exec/projection_executor semantics and error codes). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

void agg_pnode_free(pnode *p)
{
	if (p == NULL) {
		return;
	}
	for (size_t i = 0; i < p->n; i++) {
		agg_pnode_free(p->kids[i]);
	}
	free(p->kids);
	free(p->name);
	agg_expr_free(p->x);
	free(p);
}

pnode *agg_pnode_child(pnode *p, const char *name, size_t len)
{
	for (size_t i = 0; i < p->n; i++) {
		if (strlen(p->kids[i]->name) == len && memcmp(p->kids[i]->name, name, len) == 0) {
			return p->kids[i];
		}
	}
	return NULL;
}

pnode *agg_pnode_add(pnode *p, const char *name, size_t len)
{
	pnode *k = sdb_calloc(1, sizeof *k);

	k->name = sdb_strndup(name, len);
	p->kids = sdb_realloc(p->kids, (p->n + 1) * sizeof *p->kids);
	p->kids[p->n++] = k;
	return k;
}

/* Place a leaf at the dotted path under root; 31250 on a collision. */
int agg_pnode_put(pnode *root, const char *path, const char *full, pnode **leaf, const ectx *e)
{
	pnode *cur = root;
	const char *p = path;

	while (true) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
		pnode *k;

		if (len == 0) {
			return efail(e, 40352, "FieldPath field names may not be empty strings.");
		}
		if (p[0] == '$') {
			return efail(e, 16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.");
		}
		k = agg_pnode_child(cur, p, len);
		if (dot == NULL) {
			if (k != NULL) {
				return efail(e, 31250, "Path collision at %s", full);
			}
			*leaf = agg_pnode_add(cur, p, len);
			return 0;
		}
		if (k == NULL) {
			k = agg_pnode_add(cur, p, len);
			k->kind = P_SUB;
		} else if (k->kind != P_SUB) {
			return efail(e, 31250, "Path collision at %s", full);
		}
		cur = k;
		p = dot + 1;
	}
}

static bool is_true_value(const bson_iter_t *it, bool *is_flag)
{
	*is_flag = true;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_BOOL: return bson_iter_bool(it);
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128: {
		docbuild_node *n = docbuild_from_iter(it, false);
		bool t = num_double(n) != 0;

		docbuild_free(n);
		return t;
	}
	default: *is_flag = false; return false;
	}
}



static int pspec_value(pnode *root, const char *path, const bson_iter_t *it, pctx *pc, const ectx *e)
{
	pnode *leaf;
	bool flag;
	bool t = is_true_value(it, &flag);
	int rc;

	if (!pc->addfields && flag) {
		bool is_id = strcmp(path, "_id") == 0;

		if (is_id) {
			pc->id_set = true;
		} else if (t && pc->mode < 0) {
			return efail(e, 31253, "Invalid $project :: caused by :: Cannot do inclusion on field %s in exclusion projection", path);
		} else if (!t && pc->mode > 0) {
			return efail(e, 31254, "Invalid $project :: caused by :: Cannot do exclusion on field %s in inclusion projection", path);
		}
		if (!is_id) {
			pc->mode = t ? 1 : -1;
		}
		rc = agg_pnode_put(root, path, path, &leaf, e);
		if (rc == 0) {
			leaf->kind = t ? P_INCLUDE : P_EXCLUDE;
		}
		return rc;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;

		bson_iter_recurse(it, &sub);
		if (!bson_iter_next(&sub)) {
			if (pc->addfields) {
				goto as_expr;
			}
			return efail(e, 51270, "An empty sub-projection is not a valid value. Found empty object at path");
		}
		if (bson_iter_key(&sub)[0] != '$') {
			/* a nested specification */
			const uint8_t *data;
			uint32_t len;
			bson_t nested;
			char *pre = sdb_asprintf("%s.", path);

			bson_iter_document(it, &len, &data);
			if (data == NULL || !bson_init_static(&nested, data, len)) {
				free(pre);
				return efail(e, 2, "invalid BSON in the specification at path %s", path);
			}
			rc = agg_pspec_parse(root, &nested, pre, pc, e);
			free(pre);
			return rc;
		}
	}
as_expr:
	if (strcmp(path, "_id") == 0) {
		pc->id_set = true;
	}
	if (!pc->addfields) {
		if (pc->mode < 0) {
			return efail(e, 31252, "Invalid $project :: caused by :: Cannot use expression other than $meta in exclusion projection");
		}
		pc->mode = 1;
	}
	rc = agg_pnode_put(root, path, path, &leaf, e);
	if (rc != 0) {
		return rc;
	}
	leaf->kind = P_EXPR;
	return agg_expr_parse(it, &leaf->x, e);
}

int agg_pspec_parse(pnode *root, const bson_t *spec, const char *prefix, pctx *pc, const ectx *e)
{
	bson_iter_t it;

	bson_iter_init(&it, spec);
	while (bson_iter_next(&it)) {
		char *path = sdb_asprintf("%s%s", prefix, bson_iter_key(&it));
		int rc = pspec_value(root, path, &it, pc, e);

		free(path);
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
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

static bool has_expr(const pnode *p)
{
	if (p->kind == P_EXPR) {
		return true;
	}
	for (size_t i = 0; i < p->n; i++) {
		if (has_expr(p->kids[i])) {
			return true;
		}
	}
	return false;
}

int agg_p_include(const pnode *spec, const docbuild_node *in, const bson_t *root,
		     docbuild_node **out, const ectx *e);

static int p_include_array(const pnode *spec, const docbuild_node *in, const bson_t *root,
			   docbuild_node **out, const ectx *e)
{
	docbuild_node *arr = docbuild_new_array(NULL);
	int rc = 0;

	for (size_t i = 0; i < in->n && rc == 0; i++) {
		docbuild_node *k = in->kids[i], *r = NULL;

		if (k->type == BSON_TYPE_DOCUMENT) {
			rc = agg_p_include(spec, k, root, &r, e);
		} else if (k->type == BSON_TYPE_ARRAY) {
			rc = p_include_array(spec, k, root, &r, e);
		} else if (has_expr(spec)) {
			/* computed fields replace scalar elements by documents */
			docbuild_node *empty = docbuild_new_doc(NULL);

			rc = agg_p_include(spec, empty, root, &r, e);
			docbuild_free(empty);
		}
		if (r != NULL) {
			docbuild_push(arr, r);
		}
	}
	*out = arr;
	return rc;
}

int agg_p_include(const pnode *spec, const docbuild_node *in, const bson_t *root,
		     docbuild_node **out, const ectx *e)
{
	docbuild_node *d = docbuild_new_doc(NULL);
	int rc = 0;

	*out = d;
	for (size_t i = 0; i < in->n && rc == 0; i++) {
		const docbuild_node *f = in->kids[i];
		pnode *s = agg_pnode_child((pnode *)spec, f->key, strlen(f->key));
		docbuild_node *r = NULL;

		if (s == NULL || s->kind == P_EXCLUDE || s->kind == P_EXPR) {
			continue;
		}
		if (s->kind == P_INCLUDE) {
			r = docbuild_clone(f);
		} else if (f->type == BSON_TYPE_DOCUMENT) {
			rc = agg_p_include(s, f, root, &r, e);
		} else if (f->type == BSON_TYPE_ARRAY) {
			rc = p_include_array(s, f, root, &r, e);
		}
		if (r != NULL) {
			docbuild_set_key(r, f->key);
			docbuild_push(d, r);
		}
	}
	for (size_t i = 0; i < spec->n && rc == 0; i++) {
		const pnode *s = spec->kids[i];

		if (s->kind == P_EXPR) {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(s->x, root, &v, e);
			if (rc == 0) {
				agg_set_field(d, s->name, v);
			}
		} else if (s->kind == P_SUB && has_expr(s) &&
			   docbuild_field(d, s->name, strlen(s->name), NULL) == NULL) {
			docbuild_node *empty = docbuild_new_doc(NULL), *r = NULL;

			rc = agg_p_include(s, empty, root, &r, e);
			docbuild_free(empty);
			if (r != NULL && r->n > 0) {
				agg_set_field(d, s->name, r);
			} else {
				docbuild_free(r);
			}
		}
	}
	return rc;
}

void agg_p_exclude(const pnode *spec, docbuild_node *d)
{
	for (size_t i = d->n; i > 0; i--) {
		docbuild_node *f = d->kids[i - 1];
		const pnode *s = f->key != NULL ? agg_pnode_child((pnode *)spec, f->key, strlen(f->key)) : NULL;

		if (s == NULL) {
			continue;
		}
		if (s->kind == P_EXCLUDE) {
			docbuild_free(docbuild_take(d, i - 1));
		} else if (s->kind == P_SUB) {
			if (f->type == BSON_TYPE_DOCUMENT) {
				agg_p_exclude(s, f);
			} else if (f->type == BSON_TYPE_ARRAY) {
				for (size_t k = 0; k < f->n; k++) {
					if (f->kids[k]->type == BSON_TYPE_DOCUMENT) {
						agg_p_exclude(s, f->kids[k]);
					}
				}
			}
		}
	}
}

int agg_p_addfields(const pnode *spec, docbuild_node *d, const bson_t *root, const ectx *e)
{
	int rc = 0;

	for (size_t i = 0; i < spec->n && rc == 0; i++) {
		const pnode *s = spec->kids[i];

		if (s->kind == P_EXPR) {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(s->x, root, &v, e);
			if (rc == 0) {
				agg_set_field(d, s->name, v);
			}
			continue;
		}
		docbuild_node *f = docbuild_field(d, s->name, strlen(s->name), NULL);

		if (f != NULL && f->type == BSON_TYPE_DOCUMENT) {
			rc = agg_p_addfields(s, f, root, e);
		} else if (f != NULL && f->type == BSON_TYPE_ARRAY) {
			for (size_t k = 0; k < f->n && rc == 0; k++) {
				if (f->kids[k]->type != BSON_TYPE_DOCUMENT) {
					docbuild_replace(f, k, docbuild_new_doc(NULL));
				}
				rc = agg_p_addfields(s, f->kids[k], root, e);
			}
		} else {
			docbuild_node *sub = docbuild_new_doc(NULL);

			rc = agg_p_addfields(s, sub, root, e);
			agg_set_field(d, s->name, sub);
		}
	}
	return rc;
}
