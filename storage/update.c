/* The update engine's parser (see update.h; the applier is update_apply.c, the shared
 * tree and helpers update_int.h).
 *
 * Parsing builds MongoDB's update tree (mongo/db/update/update_object_node.cpp): one node
 * per path component, leaves carrying one modifier; two modifiers whose paths are equal or
 * one a prefix of the other conflict (code 40); array filters and $rename are checked here.
 */
#include "storage/update.h"
#include "storage/update_int.h"
#include "storage/pipeline.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/docbuild.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/keyenc.h"
#include "storage/sortspec.h"

static const struct {
	const char *name;
	op_t op;
} op_names[] = {
	{"$set", OP_SET},
	{"$unset", OP_UNSET},
	{"$inc", OP_INC},
	{"$mul", OP_MUL},
	{"$min", OP_MIN},
	{"$max", OP_MAX},
	{"$rename", OP_RENAME_TO},
	{"$setOnInsert", OP_SET_ON_INSERT},
	{"$push", OP_PUSH},
	{"$pull", OP_PULL},
	{"$pullAll", OP_PULL_ALL},
	{"$addToSet", OP_ADD_TO_SET},
	{"$pop", OP_POP},
	{"$currentDate", OP_CURRENT_DATE},
};

/* ---- errors ---------------------------------------------------------------------- */

int upd_fail(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (code != NULL) {
		*code = c;
	}
	if (err != NULL && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
}

/* Relaxed extended JSON of a value, for messages (caller frees). */
char *upd_value_json(const bson_value_t *v)
{
	bson_t b = BSON_INITIALIZER;
	char *s, *out;
	size_t len;

	bson_append_value(&b, "v", 1, v);
	s = bson_as_relaxed_extended_json(&b, &len);
	bson_destroy(&b);
	/* s is `{ "v" : VALUE }`: keep VALUE */
	if (s != NULL && len > 9) {
		out = sdb_strndup(s + 8, len - 10);
	} else {
		out = sdb_strdup("?");
	}
	bson_free(s);
	return out;
}

char *upd_node_json(const docbuild_node *n)
{
	bson_t scratch;
	bson_value_t v;
	char *s;

	docbuild_value(n, &scratch, &v);
	s = upd_value_json(&v);
	bson_destroy(&scratch);
	return s;
}

const char *upd_type_name(bson_type_t t)
{
	return sdb_bson_type_name(t);
}

/* ---- parse ----------------------------------------------------------------------- */

static void unode_free(unode *n)
{
	if (n == NULL) {
		return;
	}
	for (size_t i = 0; i < n->n; i++) {
		unode_free(n->kids[i]);
	}
	free(n->kids);
	free(n->name);
	free(n->path);
	if (n->leaf) {
		bson_value_destroy(&n->arg);
		if (n->has_sort && n->sort_dir == 0) {
			sdb_sortspec_free(n->sort_spec);
		}
		if (n->pull != NULL) {
			sdb_matcher_free(n->pull);
		}
	}
	free(n);
}

bool upd_is_numeric_name(const char *s, size_t *v)
{
	return docbuild_parse_index(s, strlen(s), v);
}

/* MongoDB 5.0+ order of update children: numeric names numerically, first; then bytes. */
static int name_cmp(const char *a, const char *b)
{
	size_t ia, ib;
	bool na = upd_is_numeric_name(a, &ia), nb = upd_is_numeric_name(b, &ib);

	if (na && nb) {
		return ia < ib ? -1 : ia > ib;
	}
	if (na != nb) {
		return na ? -1 : 1;
	}
	return strcmp(a, b);
}

static unode *unode_child(unode *parent, const char *name)
{
	for (size_t i = 0; i < parent->n; i++) {
		if (strcmp(parent->kids[i]->name, name) == 0) {
			return parent->kids[i];
		}
	}
	return NULL;
}

static void unode_add(unode *parent, unode *kid)
{
	size_t i = 0;

	while (i < parent->n && name_cmp(parent->kids[i]->name, kid->name) < 0) {
		i++;
	}
	parent->kids = sdb_realloc(parent->kids, (parent->n + 1) * sizeof *parent->kids);
	memmove(&parent->kids[i + 1], &parent->kids[i], (parent->n - i) * sizeof *parent->kids);
	parent->kids[i] = kid;
	parent->n++;
}

static int find_filter(sdb_update *u, const char *ident, size_t len)
{
	for (size_t i = 0; i < u->n_filters; i++) {
		if (strlen(u->filters[i].ident) == len && memcmp(u->filters[i].ident, ident, len) == 0) {
			return (int)i;
		}
	}
	return -1;
}

/* Insert path into the tree; returns the new leaf (with path/name set) or fails with
 * a conflict or a bad path. allow_positional: $rename refuses positional components. */
static int tree_insert(sdb_update *u, const char *path, bool allow_positional, unode **leaf,
		       int *code, char *err, size_t errlen)
{
	unode *cur = u->root;
	const char *p = path;
	size_t plen = strlen(path);

	if (plen == 0) {
		return upd_fail(code, C_EMPTY_FIELD_NAME, err, errlen,
			    "An empty update path is not valid.");
	}
	{
		size_t dots = 0;

		for (const char *c = path; *c; c++) {
			dots += *c == '.';
		}
		if (dots >= MAX_COMPONENTS) {
			return upd_fail(code, C_BAD_VALUE, err, errlen,
				    "The update path '%.64s...' has more than %d components", path,
				    MAX_COMPONENTS);
		}
	}
	while (true) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
		char *name = sdb_strndup(p, len);
		comp_t comp = C_FIELD;
		int filter = -1;
		unode *next;

		if (len == 0) {
			free(name);
			return upd_fail(code, C_EMPTY_FIELD_NAME, err, errlen,
				    "The update path '%s' contains an empty field name, which is not "
				    "allowed.",
				    path);
		}
		if (strcmp(name, "$") == 0) {
			comp = C_POSITIONAL;
		} else if (strcmp(name, "$[]") == 0) {
			comp = C_ALL;
		} else if (len > 3 && name[0] == '$' && name[1] == '[' && name[len - 1] == ']') {
			comp = C_FILTERED;
			filter = find_filter(u, name + 2, len - 3);
			if (filter < 0) {
				int rc = upd_fail(code, C_BAD_VALUE, err, errlen,
					      "No array filter found for identifier '%.*s' in path '%s'",
					      (int)(len - 3), name + 2, path);
				free(name);
				return rc;
			}
			u->filters[filter].used = true;
		}
		if (comp == C_FIELD && p == path && name[0] == '$') {
			/* mongod 5.0+: $-prefixed names are allowed below the top level only */
			int rc = upd_fail(code, C_DOLLAR_PREFIXED, err, errlen,
				      "The dollar ($) prefixed field '%s' in '%s' is not valid for "
				      "storage.",
				      name, path);
			free(name);
			return rc;
		}
		if (comp != C_FIELD && (!allow_positional || p == path)) {
			int rc;

			if (!allow_positional) {
				rc = upd_fail(code, C_BAD_VALUE, err, errlen,
					  "The source field for $rename may not be dynamic: %s", path);
			} else {
				rc = upd_fail(code, C_BAD_VALUE, err, errlen,
					  "Cannot have array filter identifier (i.e. '$[<id>]') element "
					  "in the first position in path '%s'",
					  path);
			}
			free(name);
			return rc;
		}
		if (comp == C_POSITIONAL) {
			u->uses_positional = true;
		}
		next = unode_child(cur, name);
		if (next != NULL && (next->leaf || dot == NULL)) {
			/* MongoDB names the shorter of the two paths as the conflict point */
			size_t at = next->leaf ? (size_t)(p - path) + len : plen;
			int rc = upd_fail(code, C_CONFLICT, err, errlen,
				      "Updating the path '%s' would create a conflict at '%.*s'", path,
				      (int)at, path);
			free(name);
			return rc;
		}
		if (next == NULL) {
			next = sdb_calloc(1, sizeof *next);
			next->name = name;
			next->comp = comp;
			next->filter = filter;
			unode_add(cur, next);
		} else {
			free(name);
		}
		cur = next;
		if (dot == NULL) {
			break;
		}
		p = dot + 1;
	}
	cur->leaf = true;
	cur->path = sdb_strdup(path);
	*leaf = cur;
	return 0;
}

bool upd_value_is_number(const bson_value_t *v)
{
	return v->value_type == BSON_TYPE_INT32 || v->value_type == BSON_TYPE_INT64 ||
	       v->value_type == BSON_TYPE_DOUBLE || v->value_type == BSON_TYPE_DECIMAL128;
}

/* An integral number that fits int64 (for $slice, $position, $pop). */
static bool value_as_int(const bson_value_t *v, int64_t *out)
{
	switch (v->value_type) {
	case BSON_TYPE_INT32: *out = v->value.v_int32; return true;
	case BSON_TYPE_INT64: *out = v->value.v_int64; return true;
	case BSON_TYPE_DOUBLE: {
		double d = v->value.v_double;

		if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18) {
			return false;
		}
		*out = (int64_t)d;
		return true;
	}
	default: return false;
	}
}

static int parse_sort(unode *n, const bson_iter_t *it, int *code, char *err, size_t errlen)
{
	const bson_value_t *v = bson_iter_value((bson_iter_t *)it);
	int64_t d;

	n->has_sort = true;
	if (value_as_int(v, &d)) {
		if (d != 1 && d != -1) {
			goto bad;
		}
		n->sort_dir = (int)d;
		return 0;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(it)) {
		bson_iter_t sub;
		const uint8_t *data;
		uint32_t len;
		bson_t spec;

		bson_iter_document(it, &len, &data);
		if (!bson_init_static(&spec, data, len) || bson_count_keys(&spec) == 0) {
			goto bad;
		}
		bson_iter_init(&sub, &spec);
		while (bson_iter_next(&sub)) {
			const char *k = bson_iter_key(&sub);

			if (!value_as_int(bson_iter_value(&sub), &d) || (d != 1 && d != -1)) {
				goto bad;
			}
			if (k[0] == '\0' || k[0] == '$' || k[strlen(k) - 1] == '.' ||
			    strstr(k, "..") != NULL || k[0] == '.') {
				n->has_sort = false;
				return upd_fail(code, C_BAD_VALUE, err, errlen,
					    "The $sort field is a dotted field but has an empty part: %s",
					    k);
			}
		}
		if (sdb_sortspec_parse(&spec, &n->sort_spec, NULL, NULL, 0) != 0) {
			goto bad;
		}
		n->sort_dir = 0;
		return 0;
	}
bad:
	n->has_sort = false;
	return upd_fail(code, C_BAD_VALUE, err, errlen,
		    "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to "
		    "sort embedded fields");
}

/* $push {$each: [...], $slice, $sort, $position} or $addToSet {$each: [...]} */
static int parse_each(unode *n, const char *opname, const bson_iter_t *it, int *code, char *err,
		      size_t errlen)
{
	bson_iter_t sub;
	bool seen_each = false;

	bson_iter_recurse(it, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		const bson_value_t *v = bson_iter_value(&sub);

		if (strcmp(k, "$each") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&sub)) {
				return upd_fail(code, C_BAD_VALUE, err, errlen,
					    "The argument to $each in %s must be an array but it was of "
					    "type: %s",
					    opname, upd_type_name(bson_iter_type(&sub)));
			}
			bson_value_destroy(&n->arg);
			bson_value_copy(v, &n->arg);
			seen_each = true;
		} else if (strcmp(opname, "$push") != 0) {
			return upd_fail(code, C_BAD_VALUE, err, errlen,
				    "Found unexpected fields after $each in $addToSet: %s", k);
		} else if (strcmp(k, "$slice") == 0) {
			if (!value_as_int(v, &n->slice)) {
				return upd_fail(code, C_BAD_VALUE, err, errlen,
					    "The value for $slice must be an integral value but was "
					    "given type: %s",
					    upd_type_name(v->value_type));
			}
			n->has_slice = true;
		} else if (strcmp(k, "$position") == 0) {
			if (!value_as_int(v, &n->position)) {
				return upd_fail(code, C_BAD_VALUE, err, errlen,
					    "The value for $position must be an integer value, not of "
					    "type: %s",
					    upd_type_name(v->value_type));
			}
			n->has_position = true;
		} else if (strcmp(k, "$sort") == 0) {
			int rc = parse_sort(n, &sub, code, err, errlen);

			if (rc != 0) {
				return rc;
			}
		} else {
			return upd_fail(code, C_BAD_VALUE, err, errlen, "Unrecognized clause in $push: %s",
				    k);
		}
	}
	if (!seen_each) {
		return upd_fail(code, C_BAD_VALUE, err, errlen, "Missing $each in %s", opname);
	}
	n->each = true;
	return 0;
}

/* True when a document value's first field is $each (the modifier form). */
static bool has_each(const bson_iter_t *it)
{
	bson_iter_t sub;

	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &sub)) {
		return false;
	}
	while (bson_iter_next(&sub)) {
		if (strcmp(bson_iter_key(&sub), "$each") == 0) {
			return true;
		}
	}
	return false;
}

static int parse_leaf(unode *n, op_t op, const char *opname, const bson_iter_t *it,
		      int *code, char *err, size_t errlen)
{
	const bson_value_t *v = bson_iter_value((bson_iter_t *)it);

	n->op = op;
	bson_value_copy(v, &n->arg);
	switch (op) {
	case OP_INC:
	case OP_MUL:
		if (!upd_value_is_number(v)) {
			return upd_fail(code, C_TYPE_MISMATCH, err, errlen,
				    "Cannot %s with non-numeric argument: {%s: %s}",
				    op == OP_INC ? "increment" : "multiply", n->path,
				    upd_type_name(v->value_type));
		}
		return 0;
	case OP_PUSH:
	case OP_ADD_TO_SET:
		if (has_each(it)) {
			return parse_each(n, opname, it, code, err, errlen);
		}
		return 0;
	case OP_PULL_ALL:
		if (!BSON_ITER_HOLDS_ARRAY(it)) {
			return upd_fail(code, C_BAD_VALUE, err, errlen,
				    "$pullAll requires an array argument but was given a %s",
				    upd_type_name(v->value_type));
		}
		return 0;
	case OP_POP: {
		int64_t d;

		if (!value_as_int(v, &d) || (d != 1 && d != -1)) {
			char *j = upd_value_json(v);
			int rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				      "$pop expects 1 or -1, found: %s", j);

			free(j);
			return rc;
		}
		n->pop_first = d == -1;
		return 0;
	}
	case OP_PULL:
		if (BSON_ITER_HOLDS_DOCUMENT(it)) {
			bson_t cond;
			int rc;

			bson_init_static(&cond, v->value.v_doc.data, v->value.v_doc.data_len);
			rc = sdb_matcher_new_elem(&cond, &n->pull, code, err, errlen);
			if (rc != 0) {
				return rc;
			}
		}
		return 0;
	case OP_CURRENT_DATE:
		if (BSON_ITER_HOLDS_BOOL(it)) {
			n->as_timestamp = false;
			return 0;
		}
		if (BSON_ITER_HOLDS_DOCUMENT(it)) {
			bson_iter_t sub;
			bool ok = false;

			bson_iter_recurse(it, &sub);
			while (bson_iter_next(&sub)) {
				if (strcmp(bson_iter_key(&sub), "$type") != 0 ||
				    !BSON_ITER_HOLDS_UTF8(&sub)) {
					return upd_fail(code, C_BAD_VALUE, err, errlen,
						    "Unrecognized $currentDate option: %s",
						    bson_iter_key(&sub));
				}
				if (strcmp(bson_iter_utf8(&sub, NULL), "timestamp") == 0) {
					n->as_timestamp = true;
					ok = true;
				} else if (strcmp(bson_iter_utf8(&sub, NULL), "date") == 0) {
					ok = true;
				} else {
					break;
				}
			}
			if (ok) {
				return 0;
			}
			return upd_fail(code, C_BAD_VALUE, err, errlen,
				    "The '$type' string field is required to be 'date' or "
				    "'timestamp': {$currentDate: {field : {$type: 'date'}}}");
		}
		return upd_fail(code, C_BAD_VALUE, err, errlen,
			    "%s is not valid type for $currentDate. Please use a boolean ('true') or "
			    "a $type expression ({$type: 'timestamp/date'}).",
			    upd_type_name(v->value_type));
	default:
		return 0;
	}
}

/* $rename {from: "to"}: a leaf at each path (conflicts checked for both). */
static int parse_rename(sdb_update *u, const char *from, const bson_iter_t *it, int *code,
			char *err, size_t errlen)
{
	unode *leaf;
	const char *to;
	size_t idx = u->n_renames;
	int rc;

	if (!BSON_ITER_HOLDS_UTF8(it)) {
		char *j = upd_value_json(bson_iter_value((bson_iter_t *)it));

		rc = upd_fail(code, C_BAD_VALUE, err, errlen,
			  "The 'to' field for $rename must be a string: %s: %s", from, j);
		free(j);
		return rc;
	}
	to = bson_iter_utf8(it, NULL);
	if (strcmp(from, to) == 0) {
		return upd_fail(code, C_BAD_VALUE, err, errlen,
			    "The source and target field for $rename must differ: %s: \"%s\"", from,
			    to);
	}
	if (to[0] == '\0' || from[0] == '\0') {
		return upd_fail(code, C_EMPTY_FIELD_NAME, err, errlen,
			    "An empty update path is not valid.");
	}
	if (strstr(to, ".$") != NULL || to[0] == '$') {
		return upd_fail(code, C_BAD_VALUE, err, errlen,
			    "The destination field for $rename may not be dynamic: %s", to);
	}
	if (strstr(from, ".$") != NULL || from[0] == '$') {
		return upd_fail(code, C_BAD_VALUE, err, errlen,
			    "The source field for $rename may not be dynamic: %s", from);
	}
	u->renames = sdb_realloc(u->renames, (idx + 1) * sizeof *u->renames);
	u->renames[idx].from = sdb_strdup(from);
	u->renames[idx].to = sdb_strdup(to);
	u->n_renames++;
	rc = tree_insert(u, from, false, &leaf, code, err, errlen);
	if (rc != 0) {
		return rc;
	}
	leaf->op = OP_RENAME_FROM;
	leaf->rename = (int)idx;
	bson_value_copy(bson_iter_value((bson_iter_t *)it), &leaf->arg);
	rc = tree_insert(u, to, false, &leaf, code, err, errlen);
	if (rc != 0) {
		return rc;
	}
	leaf->op = OP_RENAME_TO;
	leaf->rename = (int)idx;
	bson_value_copy(bson_iter_value((bson_iter_t *)it), &leaf->arg);
	return 0;
}

static int parse_filters(sdb_update *u, const bson_t *filters, int *code, char *err,
			 size_t errlen)
{
	bson_iter_t it;

	if (filters == NULL) {
		return 0;
	}
	bson_iter_init(&it, filters);
	while (bson_iter_next(&it)) {
		bson_iter_t f;
		bson_t fdoc;
		const uint8_t *data;
		uint32_t len;
		char *ident = NULL;
		afilter *af;
		int rc;

		if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
			return upd_fail(code, C_TYPE_MISMATCH, err, errlen,
				    "Each array filter must be an object");
		}
		bson_iter_document(&it, &len, &data);
		bson_init_static(&fdoc, data, len);
		bson_iter_init(&f, &fdoc);
		while (bson_iter_next(&f)) {
			const char *k = bson_iter_key(&f);
			const char *dot = strchr(k, '.');
			size_t klen = dot != NULL ? (size_t)(dot - k) : strlen(k);

			if (k[0] == '$') {
				/* $and/$or/... inside a filter: not analysed here */
				continue;
			}
			if (ident == NULL) {
				bool ok = klen > 0 && k[0] >= 'a' && k[0] <= 'z';

				for (size_t i = 0; ok && i < klen; i++) {
					ok = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') ||
					     (k[i] >= '0' && k[i] <= '9');
				}
				if (!ok) {
					return upd_fail(code, C_BAD_VALUE, err, errlen,
						    "Error parsing array filter :: caused by :: The "
						    "top-level field name must be an alphanumeric string "
						    "beginning with a lowercase letter, found '%.*s'",
						    (int)klen, k);
				}
				ident = sdb_strndup(k, klen);
			} else if (strlen(ident) != klen || memcmp(ident, k, klen) != 0) {
				rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
					  "Error parsing array filter :: caused by :: Expected a single "
					  "top-level field name, found '%s' and '%.*s'",
					  ident, (int)klen, k);
				free(ident);
				return rc;
			}
		}
		if (ident == NULL) {
			return upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				    "Cannot use an expression without a top-level field name in "
				    "arrayFilters");
		}
		if (find_filter(u, ident, strlen(ident)) >= 0) {
			rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				  "Found multiple array filters with the same top-level field name %s",
				  ident);
			free(ident);
			return rc;
		}
		u->filters = sdb_realloc(u->filters, (u->n_filters + 1) * sizeof *u->filters);
		af = &u->filters[u->n_filters++];
		af->ident = ident;
		af->used = false;
		af->m = NULL;
		rc = sdb_matcher_new(&fdoc, &af->m, code, err, errlen);
		if (rc != 0) {
			return sdb_errwrap(err, errlen, rc, "Error parsing array filter");
		}
	}
	return 0;
}

static int parse_ops(sdb_update *u, const bson_t *spec, int *code, char *err, size_t errlen)
{
	bson_iter_t it;

	bson_iter_init(&it, spec);
	while (bson_iter_next(&it)) {
		const char *opname = bson_iter_key(&it);
		bson_iter_t sub;
		int op = -1;

		for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++) {
			if (strcmp(op_names[i].name, opname) == 0) {
				op = (int)op_names[i].op;
			}
		}
		if (op < 0) {
			/* also a plain field after an operator ({$set: {...}, a: 1}) */
			return upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				    "Unknown modifier: %s. Expected a valid update modifier or "
				    "pipeline-style update specified as an array",
				    opname);
		}
		if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
			char *j = upd_value_json(bson_iter_value(&it));
			int rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				      "Modifiers operate on fields but we found type %s instead. For "
				      "example: {$mod: {<field>: ...}} not {%s: %s}",
				      upd_type_name(bson_iter_type(&it)), opname, j);

			free(j);
			return rc;
		}
		bson_iter_recurse(&it, &sub);
		if (!bson_iter_next(&sub)) {
			return upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				    "'%s' is empty. You must specify a field like so: {%s: {<field>: "
				    "...}}",
				    opname, opname);
		}
		do {
			const char *path = bson_iter_key(&sub);
			unode *leaf;
			int rc;

			if (op == OP_RENAME_TO) {
				rc = parse_rename(u, path, &sub, code, err, errlen);
			} else {
				rc = tree_insert(u, path, true, &leaf, code, err, errlen);
				if (rc == 0) {
					rc = parse_leaf(leaf, (op_t)op, opname, &sub, code, err, errlen);
				}
			}
			if (rc != 0) {
				return rc;
			}
		} while (bson_iter_next(&sub));
	}
	for (size_t i = 0; i < u->n_filters; i++) {
		if (!u->filters[i].used) {
			char *j = bson_as_relaxed_extended_json(spec, NULL);
			int rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				      "The array filter for identifier '%s' was not used in the "
				      "update %s",
				      u->filters[i].ident, j != NULL ? j : "");

			bson_free(j);
			return rc;
		}
	}
	return 0;
}

/* The parts of a new update every kind has: an empty operator tree, the clock and the
 * ObjectId source of opts (NULL: the defaults). */
static void upd_init(sdb_update *u, const sdb_update_opts *opts)
{
	u->root = sdb_calloc(1, sizeof *u->root);
	u->root->name = sdb_strdup("");
	if (opts != NULL) {
		u->clock = opts->clock;
		u->clock_ctx = opts->clock_ctx;
		u->oid = opts->oid;
		u->oid_ctx = opts->oid_ctx;
	}
}

int sdb_update_parse(const bson_t *spec, const sdb_update_opts *opts, sdb_update **out,
		     int *code, char *err, size_t errlen)
{
	sdb_update *u = sdb_calloc(1, sizeof *u);
	bson_iter_t it;
	int rc;

	*out = NULL;
	if (code != NULL) {
		*code = 0;
	}
	upd_init(u, opts);
	if (opts != NULL) {
		if (opts->query != NULL) {
			docbuild_blob_set(&u->query, opts->query);
			u->has_query = true;
		}
	}
	if (!sdb_bson_depth_ok(spec, SDB_BSON_MAX_DEPTH) ||
	    (opts != NULL && opts->array_filters != NULL &&
	     !sdb_bson_depth_ok(opts->array_filters, SDB_BSON_MAX_DEPTH)) ||
	    (opts != NULL && opts->query != NULL && !sdb_bson_depth_ok(opts->query, SDB_BSON_MAX_DEPTH))) {
		rc = upd_fail(code, C_OVERFLOW, err, errlen,
			  "update, query or arrayFilters nest deeper than %d levels", SDB_BSON_MAX_DEPTH);
	} else if (bson_iter_init(&it, spec) && bson_iter_next(&it) && bson_iter_key(&it)[0] == '$') {
		u->kind = SDB_UPDATE_OPERATORS;
		rc = parse_filters(u, opts != NULL ? opts->array_filters : NULL, code, err, errlen);
		if (rc == 0) {
			rc = parse_ops(u, spec, code, err, errlen);
		}
	} else {
		u->kind = SDB_UPDATE_REPLACEMENT;
		if (opts != NULL && opts->array_filters != NULL &&
		    bson_count_keys(opts->array_filters) > 0) {
			rc = upd_fail(code, C_FAILED_TO_PARSE, err, errlen,
				  "arrayFilters may not be specified for replacement-style updates");
		} else {
			rc = sdb_update_check_replacement(spec, code, err, errlen);
		}
		if (rc == 0) {
			docbuild_blob_set(&u->replacement, spec);
		}
	}
	if (rc != 0) {
		sdb_update_free(u);
		return rc;
	}
	*out = u;
	return 0;
}

int sdb_update_parse_value(const bson_iter_t *uv, const sdb_update_opts *opts, sdb_update **out,
			   int *code, char *err, size_t errlen)
{
	const uint8_t *data;
	uint32_t len;
	bson_t spec;

	*out = NULL;
	if (BSON_ITER_HOLDS_ARRAY(uv)) {
		sdb_update *u = sdb_calloc(1, sizeof *u);
		int rc;
		bson_iter_array(uv, &len, &data);
		if (!bson_init_static(&spec, data, len)) {
			free(u);
			return upd_fail(code, C_BAD_VALUE, err, errlen, "invalid BSON in update");
		}
		if (code != NULL)
			*code = 0;
		u->kind = SDB_UPDATE_PIPELINE;
		upd_init(u, opts);
		rc = !sdb_bson_depth_ok(&spec, SDB_BSON_MAX_DEPTH)
			     ? upd_fail(code, C_OVERFLOW, err, errlen,
					"update pipeline nests deeper than %d levels",
					SDB_BSON_MAX_DEPTH)
			     : upd_pipeline_parse(u, &spec, opts, code, err, errlen);
		if (rc != 0) {
			sdb_update_free(u);
			return rc;
		}
		*out = u;
		return 0;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(uv)) {
		return upd_fail(code, C_TYPE_MISMATCH, err, errlen,
			    "Update argument must be either an object or an array");
	}
	bson_iter_document(uv, &len, &data);
	if (!bson_init_static(&spec, data, len)) {
		return upd_fail(code, C_BAD_VALUE, err, errlen, "invalid BSON in update");
	}
	return sdb_update_parse(&spec, opts, out, code, err, errlen);
}

void sdb_update_free(sdb_update *u)
{
	if (u == NULL) {
		return;
	}
	unode_free(u->root);
	for (size_t i = 0; i < u->n_filters; i++) {
		free(u->filters[i].ident);
		sdb_matcher_free(u->filters[i].m);
	}
	free(u->filters);
	for (size_t i = 0; i < u->n_renames; i++) {
		free(u->renames[i].from);
		free(u->renames[i].to);
	}
	free(u->renames);
	docbuild_blob_free(&u->replacement);
	docbuild_blob_free(&u->query);
	sdb_pipeline_free(u->pipe);
	free(u);
}

sdb_update_kind sdb_update_get_kind(const sdb_update *u)
{
	return u->kind;
}

int sdb_update_check_replacement(const bson_t *doc, int *code, char *err, size_t errlen)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, doc)) {
		return upd_fail(code, C_BAD_VALUE, err, errlen, "invalid BSON document");
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (k[0] == '$') {
			return upd_fail(code, C_DOLLAR_PREFIXED, err, errlen,
				    "The dollar ($) prefixed field '%s' in '%s' is not allowed in the "
				    "context of an update's replacement document. Consider using an "
				    "aggregation pipeline with $replaceWith.",
				    k, k);
		}
		if (strcmp(k, "_id") == 0) {
			if (BSON_ITER_HOLDS_ARRAY(&it)) {
				return upd_fail(code, C_INVALID_ID, err, errlen,
					    "The '_id' value cannot be of type array");
			}
			if (BSON_ITER_HOLDS_REGEX(&it)) {
				return upd_fail(code, C_INVALID_ID, err, errlen,
					    "The '_id' value cannot be of type regex");
			}
		}
	}
	return 0;
}
