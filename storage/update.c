/* The update engine (see update.h).
 *
 * Parsing builds MongoDB's update tree (mongo/db/update/update_object_node.cpp): one node
 * per path component, leaves carrying one modifier; two modifiers whose paths are equal or
 * one a prefix of the other conflict (code 40). Applying walks the tree over a mutable copy
 * of the document (storage/docbuild.h), visiting the children of every node in the order
 * MongoDB 5.0+ uses: numeric field names in numeric order, other names lexicographically,
 * so fields created by one update are appended in that order.
 */
#include "storage/update.h"

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
#include "storage/bsonval.h"
#include "storage/docbuild.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/keyenc.h"
#include "storage/sortspec.h"

/* MongoDB error codes used here (src/mongo/base/error_codes.yml). */
#define C_BAD_VALUE 2
#define C_FAILED_TO_PARSE 9
#define C_TYPE_MISMATCH 14
#define C_PATH_NOT_VIABLE 28
#define C_CONFLICT 40
#define C_INVALID_ID 53
#define C_NOT_SINGLE_VALUE 54
#define C_EMPTY_FIELD_NAME 56
#define C_IMMUTABLE 66
#define C_DOLLAR_PREFIXED 52
#define C_NOT_IMPLEMENTED 238
#define C_TOO_LARGE 17419

#define C_OVERFLOW 15
#define MAX_DOC_SIZE (16 * 1024 * 1024)
#define MAX_NESTING 100     /* MongoDB's storage limit on document nesting */
#define MAX_COMPONENTS 255  /* longest update path we accept (bounds recursion) */
#define MAX_PADDING 1500000 /* MongoDB: "can't backfill more than 1500000 elements" */

typedef enum {
	OP_SET = 0,
	OP_UNSET,
	OP_INC,
	OP_MUL,
	OP_MIN,
	OP_MAX,
	OP_RENAME_FROM, /* the source of a $rename: removed when the source exists */
	OP_RENAME_TO,   /* the destination of a $rename: set to the source's value */
	OP_SET_ON_INSERT,
	OP_PUSH,
	OP_PULL,
	OP_PULL_ALL,
	OP_ADD_TO_SET,
	OP_POP,
	OP_CURRENT_DATE,
} op_t;

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

/* A component kind of an update path. */
typedef enum {
	C_FIELD = 0,  /* a field name or array index */
	C_ALL,        /* $[] */
	C_FILTERED,   /* $[identifier] */
	C_POSITIONAL, /* $ */
} comp_t;

typedef struct unode unode;
struct unode {
	char *name; /* this component as written */
	comp_t comp;
	int filter; /* C_FILTERED: index into sdb_update.filters */
	/* interior */
	unode **kids;
	size_t n;
	/* leaf */
	bool leaf;
	op_t op;
	char *path;        /* the whole path as written (messages) */
	bson_value_t arg;  /* owned copy of the modifier argument */
	int rename;        /* OP_RENAME_*: index into sdb_update.renames */
	/* $push / $addToSet */
	bool each;         /* arg is the $each array */
	bool has_slice;
	int64_t slice;
	bool has_position;
	int64_t position;
	bool has_sort;
	int sort_dir;      /* whole-element sort: 1/-1; 0 when sort_spec is used */
	sdb_sortspec *sort_spec; /* {field: 1/-1, ...} when has_sort && sort_dir == 0 */
	/* $pull with a condition */
	sdb_matcher *pull;
	/* $pop */
	bool pop_first;
	/* $currentDate */
	bool as_timestamp;
};

typedef struct {
	char *ident;
	sdb_matcher *m;
	bool used;
} afilter;

typedef struct {
	char *from;
	char *to;
} rename_t;

struct sdb_update {
	sdb_update_kind kind;
	docbuild_blob replacement;
	unode *root;
	afilter *filters;
	size_t n_filters;
	rename_t *renames;
	size_t n_renames;
	docbuild_blob query; /* for `$` */
	bool has_query;
	bool uses_positional;
	sdb_update_clock_fn clock;
	void *clock_ctx;
	void (*oid)(void *ctx, bson_oid_t *out);
	void *oid_ctx;
};

/* ---- errors ---------------------------------------------------------------------- */

static int fail(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int fail(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
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
static char *value_json(const bson_value_t *v)
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

static char *node_json(const docbuild_node *n)
{
	bson_t scratch;
	bson_value_t v;
	char *s;

	docbuild_value(n, &scratch, &v);
	s = value_json(&v);
	bson_destroy(&scratch);
	return s;
}

static const char *type_name(bson_type_t t)
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

static bool is_numeric_name(const char *s, size_t *v)
{
	return docbuild_parse_index(s, strlen(s), v);
}

/* MongoDB 5.0+ order of update children: numeric names numerically, first; then bytes. */
static int name_cmp(const char *a, const char *b)
{
	size_t ia, ib;
	bool na = is_numeric_name(a, &ia), nb = is_numeric_name(b, &ib);

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
		return fail(code, C_EMPTY_FIELD_NAME, err, errlen,
			    "An empty update path is not valid.");
	}
	{
		size_t dots = 0;

		for (const char *c = path; *c; c++) {
			dots += *c == '.';
		}
		if (dots >= MAX_COMPONENTS) {
			return fail(code, C_BAD_VALUE, err, errlen,
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
			return fail(code, C_EMPTY_FIELD_NAME, err, errlen,
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
				int rc = fail(code, C_BAD_VALUE, err, errlen,
					      "No array filter found for identifier '%.*s' in path '%s'",
					      (int)(len - 3), name + 2, path);
				free(name);
				return rc;
			}
			u->filters[filter].used = true;
		}
		if (comp == C_FIELD && p == path && name[0] == '$') {
			/* mongod 5.0+: $-prefixed names are allowed below the top level only */
			int rc = fail(code, C_DOLLAR_PREFIXED, err, errlen,
				      "The dollar ($) prefixed field '%s' in '%s' is not valid for "
				      "storage.",
				      name, path);
			free(name);
			return rc;
		}
		if (comp != C_FIELD && (!allow_positional || p == path)) {
			int rc;

			if (!allow_positional) {
				rc = fail(code, C_BAD_VALUE, err, errlen,
					  "The source field for $rename may not be dynamic: %s", path);
			} else {
				rc = fail(code, C_BAD_VALUE, err, errlen,
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
			int rc = fail(code, C_CONFLICT, err, errlen,
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

static bool value_is_number(const bson_value_t *v)
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
				return fail(code, C_BAD_VALUE, err, errlen,
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
	return fail(code, C_BAD_VALUE, err, errlen,
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
				return fail(code, C_BAD_VALUE, err, errlen,
					    "The argument to $each in %s must be an array but it was of "
					    "type: %s",
					    opname, type_name(bson_iter_type(&sub)));
			}
			bson_value_destroy(&n->arg);
			bson_value_copy(v, &n->arg);
			seen_each = true;
		} else if (strcmp(opname, "$push") != 0) {
			return fail(code, C_BAD_VALUE, err, errlen,
				    "Found unexpected fields after $each in $addToSet: %s", k);
		} else if (strcmp(k, "$slice") == 0) {
			if (!value_as_int(v, &n->slice)) {
				return fail(code, C_BAD_VALUE, err, errlen,
					    "The value for $slice must be an integral value but was "
					    "given type: %s",
					    type_name(v->value_type));
			}
			n->has_slice = true;
		} else if (strcmp(k, "$position") == 0) {
			if (!value_as_int(v, &n->position)) {
				return fail(code, C_BAD_VALUE, err, errlen,
					    "The value for $position must be an integer value, not of "
					    "type: %s",
					    type_name(v->value_type));
			}
			n->has_position = true;
		} else if (strcmp(k, "$sort") == 0) {
			int rc = parse_sort(n, &sub, code, err, errlen);

			if (rc != 0) {
				return rc;
			}
		} else {
			return fail(code, C_BAD_VALUE, err, errlen, "Unrecognized clause in $push: %s",
				    k);
		}
	}
	if (!seen_each) {
		return fail(code, C_BAD_VALUE, err, errlen, "Missing $each in %s", opname);
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
		if (!value_is_number(v)) {
			return fail(code, C_TYPE_MISMATCH, err, errlen,
				    "Cannot %s with non-numeric argument: {%s: %s}",
				    op == OP_INC ? "increment" : "multiply", n->path,
				    type_name(v->value_type));
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
			return fail(code, C_BAD_VALUE, err, errlen,
				    "$pullAll requires an array argument but was given a %s",
				    type_name(v->value_type));
		}
		return 0;
	case OP_POP: {
		int64_t d;

		if (!value_as_int(v, &d) || (d != 1 && d != -1)) {
			char *j = value_json(v);
			int rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
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
					return fail(code, C_BAD_VALUE, err, errlen,
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
			return fail(code, C_BAD_VALUE, err, errlen,
				    "The '$type' string field is required to be 'date' or "
				    "'timestamp': {$currentDate: {field : {$type: 'date'}}}");
		}
		return fail(code, C_BAD_VALUE, err, errlen,
			    "%s is not valid type for $currentDate. Please use a boolean ('true') or "
			    "a $type expression ({$type: 'timestamp/date'}).",
			    type_name(v->value_type));
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
		char *j = value_json(bson_iter_value((bson_iter_t *)it));

		rc = fail(code, C_BAD_VALUE, err, errlen,
			  "The 'to' field for $rename must be a string: %s: %s", from, j);
		free(j);
		return rc;
	}
	to = bson_iter_utf8(it, NULL);
	if (strcmp(from, to) == 0) {
		return fail(code, C_BAD_VALUE, err, errlen,
			    "The source and target field for $rename must differ: %s: \"%s\"", from,
			    to);
	}
	if (to[0] == '\0' || from[0] == '\0') {
		return fail(code, C_EMPTY_FIELD_NAME, err, errlen,
			    "An empty update path is not valid.");
	}
	if (strstr(to, ".$") != NULL || to[0] == '$') {
		return fail(code, C_BAD_VALUE, err, errlen,
			    "The destination field for $rename may not be dynamic: %s", to);
	}
	if (strstr(from, ".$") != NULL || from[0] == '$') {
		return fail(code, C_BAD_VALUE, err, errlen,
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
			return fail(code, C_TYPE_MISMATCH, err, errlen,
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
					return fail(code, C_BAD_VALUE, err, errlen,
						    "Error parsing array filter :: caused by :: The "
						    "top-level field name must be an alphanumeric string "
						    "beginning with a lowercase letter, found '%.*s'",
						    (int)klen, k);
				}
				ident = sdb_strndup(k, klen);
			} else if (strlen(ident) != klen || memcmp(ident, k, klen) != 0) {
				rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
					  "Error parsing array filter :: caused by :: Expected a single "
					  "top-level field name, found '%s' and '%.*s'",
					  ident, (int)klen, k);
				free(ident);
				return rc;
			}
		}
		if (ident == NULL) {
			return fail(code, C_FAILED_TO_PARSE, err, errlen,
				    "Cannot use an expression without a top-level field name in "
				    "arrayFilters");
		}
		if (find_filter(u, ident, strlen(ident)) >= 0) {
			rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
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
			return fail(code, C_FAILED_TO_PARSE, err, errlen,
				    "Unknown modifier: %s. Expected a valid update modifier or "
				    "pipeline-style update specified as an array",
				    opname);
		}
		if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
			char *j = value_json(bson_iter_value(&it));
			int rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
				      "Modifiers operate on fields but we found type %s instead. For "
				      "example: {$mod: {<field>: ...}} not {%s: %s}",
				      type_name(bson_iter_type(&it)), opname, j);

			free(j);
			return rc;
		}
		bson_iter_recurse(&it, &sub);
		if (!bson_iter_next(&sub)) {
			return fail(code, C_FAILED_TO_PARSE, err, errlen,
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
			int rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
				      "The array filter for identifier '%s' was not used in the "
				      "update %s",
				      u->filters[i].ident, j != NULL ? j : "");

			bson_free(j);
			return rc;
		}
	}
	return 0;
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
	u->root = sdb_calloc(1, sizeof *u->root);
	u->root->name = sdb_strdup("");
	if (opts != NULL) {
		u->clock = opts->clock;
		u->clock_ctx = opts->clock_ctx;
		u->oid = opts->oid;
		u->oid_ctx = opts->oid_ctx;
		if (opts->query != NULL) {
			docbuild_blob_set(&u->query, opts->query);
			u->has_query = true;
		}
	}
	if (!sdb_bson_depth_ok(spec, SDB_BSON_MAX_DEPTH) ||
	    (opts != NULL && opts->array_filters != NULL &&
	     !sdb_bson_depth_ok(opts->array_filters, SDB_BSON_MAX_DEPTH)) ||
	    (opts != NULL && opts->query != NULL && !sdb_bson_depth_ok(opts->query, SDB_BSON_MAX_DEPTH))) {
		rc = fail(code, C_OVERFLOW, err, errlen,
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
			rc = fail(code, C_FAILED_TO_PARSE, err, errlen,
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
		return fail(code, C_NOT_IMPLEMENTED, err, errlen,
			    "pipeline-style updates are not supported by the embedded shard");
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(uv)) {
		return fail(code, C_TYPE_MISMATCH, err, errlen,
			    "Update argument must be either an object or an array");
	}
	bson_iter_document(uv, &len, &data);
	if (!bson_init_static(&spec, data, len)) {
		return fail(code, C_BAD_VALUE, err, errlen, "invalid BSON in update");
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
		return fail(code, C_BAD_VALUE, err, errlen, "invalid BSON document");
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (k[0] == '$') {
			return fail(code, C_DOLLAR_PREFIXED, err, errlen,
				    "The dollar ($) prefixed field '%s' in '%s' is not allowed in the "
				    "context of an update's replacement document. Consider using an "
				    "aggregation pipeline with $replaceWith.",
				    k, k);
		}
		if (strcmp(k, "_id") == 0) {
			if (BSON_ITER_HOLDS_ARRAY(&it)) {
				return fail(code, C_INVALID_ID, err, errlen,
					    "The '_id' value cannot be of type array");
			}
			if (BSON_ITER_HOLDS_REGEX(&it)) {
				return fail(code, C_INVALID_ID, err, errlen,
					    "The '_id' value cannot be of type regex");
			}
		}
	}
	return 0;
}

/* ---- apply ----------------------------------------------------------------------- */

typedef struct {
	const sdb_update *u;
	bool upsert;
	docbuild_node **rename_vals; /* per rename: the source's value, or NULL when missing */
	bool pos_found;
	size_t pos_index; /* `$` */
	int *code;
	char *err;
	size_t errlen;
} actx;

static int apply_obj(actx *a, const unode *un, docbuild_node *c, const char *cname, bool fresh);

/* Numbers: MongoDB's SafeNum for $inc/$mul (int32 -> int64 on overflow, int64 overflow is
 * an error, doubles win). Returns false on int64 overflow or decimal operands. */
static bool arith(bool mul, const bson_value_t *a, const bson_value_t *b, bson_value_t *out)
{
	bson_type_t ta = a->value_type, tb = b->value_type;

	memset(out, 0, sizeof *out);
	if (ta == BSON_TYPE_DECIMAL128 || tb == BSON_TYPE_DECIMAL128) {
		return false;
	}
	if (ta == BSON_TYPE_DOUBLE || tb == BSON_TYPE_DOUBLE) {
		double x = ta == BSON_TYPE_DOUBLE	? a->value.v_double
			   : ta == BSON_TYPE_INT64 ? (double)a->value.v_int64
						   : (double)a->value.v_int32;
		double y = tb == BSON_TYPE_DOUBLE	? b->value.v_double
			   : tb == BSON_TYPE_INT64 ? (double)b->value.v_int64
						   : (double)b->value.v_int32;

		out->value_type = BSON_TYPE_DOUBLE;
		out->value.v_double = mul ? x * y : x + y;
		return true;
	}
	int64_t x = ta == BSON_TYPE_INT64 ? a->value.v_int64 : a->value.v_int32;
	int64_t y = tb == BSON_TYPE_INT64 ? b->value.v_int64 : b->value.v_int32;
	int64_t r;

	if (mul ? __builtin_mul_overflow(x, y, &r) : __builtin_add_overflow(x, y, &r)) {
		return false;
	}
	if (ta == BSON_TYPE_INT32 && tb == BSON_TYPE_INT32 && r >= INT32_MIN && r <= INT32_MAX) {
		out->value_type = BSON_TYPE_INT32;
		out->value.v_int32 = (int32_t)r;
	} else {
		out->value_type = BSON_TYPE_INT64;
		out->value.v_int64 = r;
	}
	return true;
}

static docbuild_node *scalar_node(const bson_value_t *v)
{
	return docbuild_from_value(v, NULL);
}

static int64_t now_ms(const sdb_update *u)
{
	if (u->clock != NULL) {
		return u->clock(u->clock_ctx);
	}
	return sdb_wall_ms();
}

/* Compare two nodes in MongoDB order. */
static int node_cmp(const docbuild_node *x, const docbuild_node *y)
{
	bson_t sx, sy;
	bson_value_t vx, vy;
	int r;

	docbuild_value(x, &sx, &vx);
	docbuild_value(y, &sy, &vy);
	r = sdb_bson_value_cmp(&vx, &vy);
	bson_destroy(&sx);
	bson_destroy(&sy);
	return r;
}

/* The memcmp-ordered sort key of one array element for $push's $sort: the element itself
 * (1/-1), or the fields of {field: 1/-1} (non-documents have every field missing). */
static void elem_sort_key(const unode *n, const docbuild_node *x, sdb_key *k)
{
	bson_t scratch;

	if (n->sort_dir != 0) {
		bson_value_t v;

		docbuild_value(x, &scratch, &v);
		(void)sdb_keyenc_append_value(k, &v, n->sort_dir < 0, NULL, 0);
	} else {
		if (x->type == BSON_TYPE_DOCUMENT) {
			docbuild_to_bson(x, &scratch);
		} else {
			bson_init(&scratch);
		}
		(void)sdb_sortspec_key(n->sort_spec, &scratch, k, NULL, 0);
	}
	bson_destroy(&scratch);
}

typedef struct {
	sdb_key key;
	docbuild_node *node;
} keyed;

/* Stable merge sort by key (MongoDB's $push $sort is stable). */
static void keyed_sort(keyed *items, keyed *tmp, size_t n)
{
	size_t h, i, j, k;

	if (n < 2) {
		return;
	}
	h = n / 2;
	keyed_sort(items, tmp, h);
	keyed_sort(items + h, tmp, n - h);
	for (i = 0, j = h, k = 0; i < h && j < n;) {
		tmp[k++] = sdb_key_cmp(&items[j].key, &items[i].key) < 0 ? items[j++] : items[i++];
	}
	while (i < h) {
		tmp[k++] = items[i++];
	}
	while (j < n) {
		tmp[k++] = items[j++];
	}
	memcpy(items, tmp, n * sizeof *items);
}

static void sort_array(const unode *n, docbuild_node *arr)
{
	keyed *items = sdb_calloc(arr->n + 1, sizeof *items);
	keyed *tmp = sdb_calloc(arr->n + 1, sizeof *tmp);

	for (size_t i = 0; i < arr->n; i++) {
		sdb_key_init(&items[i].key);
		elem_sort_key(n, arr->kids[i], &items[i].key);
		items[i].node = arr->kids[i];
	}
	keyed_sort(items, tmp, arr->n);
	for (size_t i = 0; i < arr->n; i++) {
		arr->kids[i] = items[i].node;
		sdb_key_free(&items[i].key);
	}
	free(items);
	free(tmp);
}

static void do_push(const unode *n, docbuild_node *arr)
{
	size_t pos = arr->n;

	if (n->has_position) {
		if (n->position >= 0) {
			pos = (size_t)n->position < arr->n ? (size_t)n->position : arr->n;
		} else {
			uint64_t back = (uint64_t)(-(n->position + 1)) + 1;

			pos = back >= arr->n ? 0 : arr->n - (size_t)back;
		}
	}
	if (n->each) {
		bson_iter_t it;
		bson_t each;

		bson_init_static(&each, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &each);
		while (bson_iter_next(&it)) {
			docbuild_insert(arr, pos++, docbuild_from_iter(&it, false));
		}
	} else {
		docbuild_insert(arr, pos, scalar_node(&n->arg));
	}
	if (n->has_sort) {
		sort_array(n, arr);
	}
	if (n->has_slice) {
		if (n->slice >= 0) {
			while ((int64_t)arr->n > n->slice) {
				docbuild_free(docbuild_take(arr, arr->n - 1));
			}
		} else {
			uint64_t keep = (uint64_t)(-(n->slice + 1)) + 1;

			while ((uint64_t)arr->n > keep) {
				docbuild_free(docbuild_take(arr, 0));
			}
		}
	}
}

/* The equality key of a value (storage/keyenc.h: 1, 1.0 and NumberLong(1) are one key). */
static void value_key(const docbuild_node *x, sdb_key *k)
{
	bson_t scratch;
	bson_value_t v;

	docbuild_value(x, &scratch, &v);
	(void)sdb_keyenc_append_value(k, &v, false, NULL, 0);
	bson_destroy(&scratch);
}

static int key_qsort_cmp(const void *a, const void *b)
{
	return sdb_key_cmp(a, b);
}

/* Add x to arr unless an equal element is there; keys: arr's keys, sorted. */
static void add_unique(docbuild_node *arr, sdb_key **keys, size_t *nkeys, docbuild_node *x)
{
	sdb_key k;
	size_t lo = 0, hi = *nkeys;

	sdb_key_init(&k);
	value_key(x, &k);
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = sdb_key_cmp(&(*keys)[mid], &k);

		if (c == 0) {
			sdb_key_free(&k);
			docbuild_free(x);
			return;
		}
		if (c < 0) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	*keys = sdb_realloc(*keys, (*nkeys + 1) * sizeof **keys);
	memmove(&(*keys)[lo + 1], &(*keys)[lo], (*nkeys - lo) * sizeof **keys);
	(*keys)[lo] = k;
	(*nkeys)++;
	docbuild_push(arr, x);
}

static void do_add_to_set(const unode *n, docbuild_node *arr)
{
	size_t nkeys = arr->n;
	sdb_key *keys = sdb_calloc(nkeys + 1, sizeof *keys);

	for (size_t i = 0; i < arr->n; i++) {
		sdb_key_init(&keys[i]);
		value_key(arr->kids[i], &keys[i]);
	}
	sdb_qsort(keys, nkeys, sizeof *keys, key_qsort_cmp);
	if (n->each) {
		bson_iter_t it;
		bson_t each;

		bson_init_static(&each, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &each);
		while (bson_iter_next(&it)) {
			add_unique(arr, &keys, &nkeys, docbuild_from_iter(&it, false));
		}
	} else {
		add_unique(arr, &keys, &nkeys, scalar_node(&n->arg));
	}
	for (size_t i = 0; i < nkeys; i++) {
		sdb_key_free(&keys[i]);
	}
	free(keys);
}

static bool pull_matches(const unode *n, const docbuild_node *x)
{
	bson_t scratch, wrap = BSON_INITIALIZER;
	bson_iter_t it;
	bool r;

	if (n->op == OP_PULL_ALL) {
		bson_t arr;

		bson_init_static(&arr, n->arg.value.v_doc.data, n->arg.value.v_doc.data_len);
		bson_iter_init(&it, &arr);
		while (bson_iter_next(&it)) {
			bson_value_t v;

			docbuild_value(x, &scratch, &v);
			r = sdb_bson_value_eq(&v, bson_iter_value(&it));
			bson_destroy(&scratch);
			if (r) {
				bson_destroy(&wrap);
				return true;
			}
		}
		bson_destroy(&wrap);
		return false;
	}
	if (n->pull == NULL) {
		bson_value_t v;

		docbuild_value(x, &scratch, &v);
		r = sdb_bson_value_eq(&v, &n->arg);
		bson_destroy(&scratch);
		bson_destroy(&wrap);
		return r;
	}
	docbuild_append(&wrap, "v", 1, x);
	bson_iter_init_find(&it, &wrap, "v");
	r = sdb_matcher_match_value(n->pull, &it);
	bson_destroy(&wrap);
	return r;
}

/* The value a creating modifier gives a missing field, or NULL when it creates nothing. */
static docbuild_node *create_value(actx *a, const unode *n)
{
	const sdb_update *u = a->u;

	switch (n->op) {
	case OP_SET:
	case OP_INC:
	case OP_MIN:
	case OP_MAX:
		return scalar_node(&n->arg);
	case OP_SET_ON_INSERT:
		return a->upsert ? scalar_node(&n->arg) : NULL;
	case OP_MUL: {
		bson_value_t z = {0};

		z.value_type = n->arg.value_type;
		if (z.value_type == BSON_TYPE_DECIMAL128) {
			bson_decimal128_from_string("0", &z.value.v_decimal128);
		}
		return scalar_node(&z);
	}
	case OP_RENAME_TO:
		return a->rename_vals[n->rename] != NULL ? docbuild_clone(a->rename_vals[n->rename])
							 : NULL;
	case OP_PUSH: {
		docbuild_node *arr = docbuild_new_array(NULL);

		do_push(n, arr);
		return arr;
	}
	case OP_ADD_TO_SET: {
		docbuild_node *arr = docbuild_new_array(NULL);

		do_add_to_set(n, arr);
		return arr;
	}
	case OP_CURRENT_DATE: {
		bson_value_t v = {0};
		int64_t ms = now_ms(u);

		if (n->as_timestamp) {
			v.value_type = BSON_TYPE_TIMESTAMP;
			v.value.v_timestamp.timestamp = (uint32_t)(ms / 1000);
			v.value.v_timestamp.increment = 1;
		} else {
			v.value_type = BSON_TYPE_DATE_TIME;
			v.value.v_datetime = ms;
		}
		return scalar_node(&v);
	}
	default:
		return NULL;
	}
}

/* Apply leaf n to the existing element c->kids[i] (cname: c's field name for messages). */
static int apply_leaf(actx *a, const unode *n, docbuild_node *c, size_t i)
{
	docbuild_node *e = c->kids[i];

	switch (n->op) {
	case OP_SET_ON_INSERT:
		if (!a->upsert) {
			return 0;
		}
		/* fallthrough */
	case OP_SET:
		docbuild_replace(c, i, scalar_node(&n->arg));
		return 0;
	case OP_RENAME_TO:
		if (a->rename_vals[n->rename] != NULL) {
			docbuild_replace(c, i, docbuild_clone(a->rename_vals[n->rename]));
		}
		return 0;
	case OP_UNSET:
	case OP_RENAME_FROM:
		if (c->type == BSON_TYPE_ARRAY) {
			docbuild_replace(c, i, docbuild_new_null(NULL));
		} else {
			docbuild_free(docbuild_take(c, i));
		}
		return 0;
	case OP_INC:
	case OP_MUL: {
		bson_value_t r;

		if (!value_is_number(&e->value) || e->type == BSON_TYPE_DOCUMENT ||
		    e->type == BSON_TYPE_ARRAY) {
			char *j = node_json(e);
			int rc = fail(a->code, C_TYPE_MISMATCH, a->err, a->errlen,
				      "Cannot apply %s to a value of non-numeric type. The field '%s' "
				      "has the non-numeric value %s of type %s",
				      n->op == OP_INC ? "$inc" : "$mul", n->path, j, type_name(e->type));

			free(j);
			return rc;
		}
		if (!arith(n->op == OP_MUL, &e->value, &n->arg, &r)) {
			char *j = node_json(e);
			int rc = fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				      "Failed to apply %s operations to current value (%s) for the "
				      "field '%s' (overflow or decimal operands)",
				      n->op == OP_INC ? "$inc" : "$mul", j, n->path);

			free(j);
			return rc;
		}
		docbuild_replace(c, i, scalar_node(&r));
		return 0;
	}
	case OP_MIN:
	case OP_MAX: {
		docbuild_node *x = scalar_node(&n->arg);
		int cmp = node_cmp(x, e);

		if ((n->op == OP_MIN && cmp < 0) || (n->op == OP_MAX && cmp > 0)) {
			docbuild_replace(c, i, x);
		} else {
			docbuild_free(x);
		}
		return 0;
	}
	case OP_PUSH:
	case OP_ADD_TO_SET:
		if (e->type != BSON_TYPE_ARRAY) {
			if (n->op == OP_PUSH) {
				return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The field '%s' must be an array but is of type %s", n->path,
					    type_name(e->type));
			}
			return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "Cannot apply $addToSet to non-array field. Field named '%s' has "
				    "non-array type %s",
				    n->name, type_name(e->type));
		}
		if (n->op == OP_PUSH) {
			do_push(n, e);
		} else {
			do_add_to_set(n, e);
		}
		return 0;
	case OP_PULL:
	case OP_PULL_ALL:
		if (e->type != BSON_TYPE_ARRAY) {
			return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "Cannot apply $pull to a non-array value");
		}
		for (size_t k = e->n; k > 0; k--) {
			if (pull_matches(n, e->kids[k - 1])) {
				docbuild_free(docbuild_take(e, k - 1));
			}
		}
		return 0;
	case OP_POP:
		if (e->type != BSON_TYPE_ARRAY) {
			return fail(a->code, C_TYPE_MISMATCH, a->err, a->errlen,
				    "Path '%s' contains an element of non-array type '%s'", n->path,
				    type_name(e->type));
		}
		if (e->n > 0) {
			docbuild_free(docbuild_take(e, n->pop_first ? 0 : e->n - 1));
		}
		return 0;
	case OP_CURRENT_DATE:
		docbuild_replace(c, i, create_value(a, n));
		return 0;
	}
	return 0;
}

static bool arrayfilter_match(const afilter *f, const docbuild_node *e)
{
	bson_t wrap = BSON_INITIALIZER;
	bool r;

	docbuild_append(&wrap, f->ident, -1, e);
	r = sdb_matcher_match(f->m, &wrap);
	bson_destroy(&wrap);
	return r;
}

/* Apply un (a child of the node that addressed container c) to the element at i. */
static int apply_at(actx *a, const unode *un, docbuild_node *c, size_t i)
{
	docbuild_node *e = c->kids[i];

	if (un->leaf) {
		return apply_leaf(a, un, c, i);
	}
	if (e->type == BSON_TYPE_DOCUMENT || e->type == BSON_TYPE_ARRAY) {
		return apply_obj(a, un, e, un->name, false);
	}
	/* a scalar on the way: array updates fail, children that would create something fail */
	for (size_t k = 0; k < un->n; k++) {
		if (un->kids[k]->comp != C_FIELD) {
			char *j = node_json(e);
			int rc = fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				      "Cannot apply array updates to non-array element %s: %s",
				      un->name, j);

			free(j);
			return rc;
		}
	}
	docbuild_node *tmp = docbuild_new_doc(NULL);
	int rc = apply_obj(a, un, tmp, un->name, true);
	bool created = tmp->n > 0;

	docbuild_free(tmp);
	if (rc != 0) {
		return rc;
	}
	if (created) {
		char *j = node_json(e);
		const char *child = un->n > 0 ? un->kids[0]->name : "";

		rc = fail(a->code, C_PATH_NOT_VIABLE, a->err, a->errlen,
			  "Cannot create field '%s' in element {%s: %s}", child,
			  c->type == BSON_TYPE_DOCUMENT ? e->key : un->name, j);
		free(j);
	}
	return rc;
}

static int array_updates_missing(actx *a, const char *cname)
{
	return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
		    "The path '%s' must exist in the document in order to apply array updates.",
		    cname);
}

/* Apply the children of un to container c (a document or an array). fresh: c was just
 * created for a missing path (positional children then fail). */
static int apply_obj(actx *a, const unode *un, docbuild_node *c, const char *cname, bool fresh)
{
	for (size_t k = 0; k < un->n; k++) {
		const unode *kid = un->kids[k];
		int rc = 0;

		if (kid->comp != C_FIELD) {
			if (fresh) {
				return array_updates_missing(a, cname);
			}
			if (c->type != BSON_TYPE_ARRAY) {
				char *j = node_json(c);

				rc = fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					  "Cannot apply array updates to non-array element %s: %s",
					  cname, j);
				free(j);
				return rc;
			}
			if (kid->comp == C_POSITIONAL) {
				if (!a->pos_found) {
					return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
						    "The positional operator did not find the match "
						    "needed from the query.");
				}
				if (a->pos_index < c->n) {
					rc = apply_at(a, kid, c, a->pos_index);
				}
			} else {
				for (size_t i = 0; i < c->n && rc == 0; i++) {
					if (kid->comp == C_FILTERED &&
					    !arrayfilter_match(&a->u->filters[kid->filter], c->kids[i])) {
						continue;
					}
					rc = apply_at(a, kid, c, i);
				}
			}
			if (rc != 0) {
				return rc;
			}
			continue;
		}

		size_t idx = 0;
		bool found = false, is_index = false;

		if (c->type == BSON_TYPE_DOCUMENT) {
			found = docbuild_field(c, kid->name, strlen(kid->name), &idx) != NULL;
		} else {
			is_index = is_numeric_name(kid->name, &idx);
			found = is_index && idx < c->n;
		}
		if (found) {
			if (c->type == BSON_TYPE_ARRAY &&
			    ((kid->op == OP_RENAME_TO && a->rename_vals[kid->rename] != NULL) ||
			     kid->op == OP_RENAME_FROM) &&
			    kid->leaf) {
				return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The %s field cannot be an array element, '%s' in doc with "
					    "%s",
					    kid->op == OP_RENAME_TO ? "destination" : "source", kid->path,
					    cname);
			}
			rc = apply_at(a, kid, c, idx);
			if (rc != 0) {
				return rc;
			}
			continue;
		}
		/* missing: create when a modifier below creates something */
		docbuild_node *v;

		if (kid->leaf) {
			v = create_value(a, kid);
		} else {
			v = docbuild_new_doc(NULL);
			rc = apply_obj(a, kid, v, kid->name, true);
			if (rc != 0 || v->n == 0) {
				docbuild_free(v);
				if (rc != 0) {
					return rc;
				}
				v = NULL;
			}
		}
		if (v == NULL) {
			continue;
		}
		if (c->type == BSON_TYPE_DOCUMENT) {
			docbuild_set_key(v, kid->name);
			docbuild_push(c, v);
			continue;
		}
		if (!is_index) {
			char *j = node_json(c);

			rc = fail(a->code, C_PATH_NOT_VIABLE, a->err, a->errlen,
				  "Cannot create field '%s' in element {%s: %s}", kid->name, cname, j);
			free(j);
			docbuild_free(v);
			return rc;
		}
		if (kid->leaf && (kid->op == OP_RENAME_TO)) {
			docbuild_free(v);
			return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "The destination field cannot be an array element, '%s' in doc "
				    "with %s",
				    kid->path, cname);
		}
		if (idx - c->n > MAX_PADDING) {
			docbuild_free(v);
			return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "can't backfill more than %d elements", MAX_PADDING);
		}
		while (c->n < idx) {
			docbuild_push(c, docbuild_new_null(NULL));
		}
		docbuild_push(c, v);
	}
	return 0;
}

/* mongod refuses a $rename whose destination path goes through an array (BadValue:
 * "The destination field cannot be an array element, 'b.0' in doc with _id: 1 has an
 * array field called 'b'"): walk `to` in the document; 0 or the failure. */
static int rename_dest_check(actx *a, const docbuild_node *root, const char *to)
{
	const docbuild_node *cur = root;
	const char *p = to;

	while (cur != NULL && cur->type == BSON_TYPE_DOCUMENT) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);

		if (dot == NULL) {
			return 0;
		}
		cur = docbuild_field(cur, p, len, NULL);
		if (cur != NULL && cur->type == BSON_TYPE_ARRAY) {
			return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
				    "The destination field cannot be an array element, '%s' in doc "
				    "has an array field called '%.*s'",
				    to, (int)(dot - to), to);
		}
		p = dot + 1;
	}
	return 0;
}

/* Resolve the value each $rename moves (a clone of the source, or NULL when missing). */
static int resolve_renames(actx *a, const docbuild_node *root)
{
	for (size_t r = 0; r < a->u->n_renames; r++) {
		const char *p = a->u->renames[r].from;
		const docbuild_node *cur = root;

		a->rename_vals[r] = NULL;
		while (cur != NULL) {
			const char *dot = strchr(p, '.');
			size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);

			if (cur->type == BSON_TYPE_ARRAY) {
				return fail(a->code, C_BAD_VALUE, a->err, a->errlen,
					    "The source field cannot be an array element, '%s' in doc "
					    "with %s",
					    a->u->renames[r].from, "an array on its path");
			}
			if (cur->type != BSON_TYPE_DOCUMENT) {
				cur = NULL;
				break;
			}
			cur = docbuild_field(cur, p, len, NULL);
			if (dot == NULL) {
				break;
			}
			p = dot + 1;
		}
		if (cur != NULL) {
			a->rename_vals[r] = docbuild_clone(cur);
		}
		if (a->rename_vals[r] != NULL) {
			int rc = rename_dest_check(a, root, a->u->renames[r].to);
			if (rc != 0) {
				return rc;
			}
		}
	}
	return 0;
}

/* ---- positional `$`: the first array element the query matched ---------------------- */

/* Rewrite the query's conditions on array path P into a filter over {e: element}. */
static void positional_filter(const bson_t *query, const char *arr, bson_t *out)
{
	bson_iter_t it;
	size_t alen = strlen(arr);

	bson_iter_init(&it, query);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (strcmp(k, "$and") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			while (bson_iter_next(&sub)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&sub)) {
					bson_t d;
					const uint8_t *data;
					uint32_t len;

					bson_iter_document(&sub, &len, &data);
					bson_init_static(&d, data, len);
					positional_filter(&d, arr, out);
				}
			}
			continue;
		}
		if (strncmp(k, arr, alen) != 0 || (k[alen] != '\0' && k[alen] != '.')) {
			continue;
		}
		char *nk = sdb_asprintf("e%s", k + alen);

		/* {arr: {$elemMatch: C}} -> the element itself must satisfy C */
		if (k[alen] == '\0' && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			if (bson_iter_next(&sub) && strcmp(bson_iter_key(&sub), "$elemMatch") == 0 &&
			    BSON_ITER_HOLDS_DOCUMENT(&sub)) {
				bson_iter_t cond;
				bool ops = false;

				bson_iter_recurse(&sub, &cond);
				if (bson_iter_next(&cond)) {
					ops = bson_iter_key(&cond)[0] == '$';
				}
				bson_iter_recurse(&sub, &cond);
				if (ops) {
					bson_t d;

					bson_append_document_begin(out, "e", 1, &d);
					while (bson_iter_next(&cond)) {
						bson_append_iter(&d, NULL, 0, &cond);
					}
					bson_append_document_end(out, &d);
				} else {
					while (bson_iter_next(&cond)) {
						char *ck = sdb_asprintf("e.%s", bson_iter_key(&cond));

						bson_append_iter(out, ck, -1, &cond);
						free(ck);
					}
				}
				free(nk);
				continue;
			}
		}
		bson_append_iter(out, nk, -1, &it);
		free(nk);
	}
}

/* The array path before the first `$` component of any positional leaf. */
static const unode *find_positional(const unode *n, char *buf, size_t cap, size_t used)
{
	for (size_t i = 0; i < n->n; i++) {
		const unode *k = n->kids[i];
		size_t len = strlen(k->name);

		if (k->comp == C_POSITIONAL) {
			buf[used > 0 ? used - 1 : 0] = '\0';
			return k;
		}
		if (used + len + 1 >= cap) {
			continue;
		}
		memcpy(buf + used, k->name, len);
		buf[used + len] = '.';
		if (find_positional(k, buf, cap, used + len + 1) != NULL) {
			return k;
		}
	}
	return NULL;
}

static int resolve_positional(actx *a, const bson_t *doc)
{
	char arr[1024];
	bson_t f = BSON_INITIALIZER;
	sdb_matcher *m = NULL;
	bson_iter_t it, elems;
	int rc;

	a->pos_found = false;
	if (!a->u->uses_positional || !a->u->has_query) {
		return 0;
	}
	if (find_positional(a->u->root, arr, sizeof arr, 0) == NULL) {
		return 0;
	}
	bson_t query;

	docbuild_blob_view(&a->u->query, &query);
	positional_filter(&query, arr, &f);
	if (bson_count_keys(&f) == 0) {
		bson_destroy(&f);
		return 0;
	}
	rc = sdb_matcher_new(&f, &m, a->code, a->err, a->errlen);
	bson_destroy(&f);
	if (rc != 0) {
		return rc;
	}
	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, arr, &elems) &&
	    BSON_ITER_HOLDS_ARRAY(&elems)) {
		bson_iter_t e;
		size_t i = 0;

		bson_iter_recurse(&elems, &e);
		while (bson_iter_next(&e)) {
			bson_t w = BSON_INITIALIZER;
			bool hit;

			bson_append_iter(&w, "e", 1, &e);
			hit = sdb_matcher_match(m, &w);
			bson_destroy(&w);
			if (hit) {
				a->pos_found = true;
				a->pos_index = i;
				break;
			}
			i++;
		}
	}
	sdb_matcher_free(m);
	return 0;
}

/* ---- entry points ------------------------------------------------------------------ */

static bool id_equal(const bson_t *a, const bson_t *b, bool *a_has, bool *b_has)
{
	bson_iter_t ia, ib;

	*a_has = bson_iter_init_find(&ia, a, "_id");
	*b_has = bson_iter_init_find(&ib, b, "_id");
	if (!*a_has || !*b_has) {
		return *a_has == *b_has;
	}
	if (bson_iter_type(&ia) != bson_iter_type(&ib)) {
		return false;
	}
	return sdb_bson_iter_eq(&ia, &ib) && bson_iter_type(&ia) == bson_iter_type(&ib);
}

static int apply_replacement(const sdb_update *u, const bson_t *doc, bson_t *out, int *code,
			     char *err, size_t errlen)
{
	bson_iter_t it, oid, rid;
	bool doc_has = bson_iter_init_find(&oid, doc, "_id");
	bson_t rep;
	bool rep_has;

	docbuild_blob_view(&u->replacement, &rep);
	rep_has = bson_iter_init_find(&rid, &rep, "_id");

	if (doc_has && rep_has &&
	    (bson_iter_type(&oid) != bson_iter_type(&rid) || !sdb_bson_iter_eq(&oid, &rid))) {
		char *j = value_json(bson_iter_value(&rid));
		int rc = fail(code, C_IMMUTABLE, err, errlen,
			      "After applying the update, the (immutable) field '_id' was found to "
			      "have been altered to _id: %s",
			      j);

		free(j);
		return rc;
	}
	if (doc_has) {
		bson_append_iter(out, "_id", 3, &oid);
	} else if (rep_has) {
		bson_append_iter(out, "_id", 3, &rid);
	}
	bson_iter_init(&it, &rep);
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "_id") != 0) {
			bson_append_iter(out, NULL, 0, &it);
		}
	}
	return 0;
}

int sdb_update_apply(const sdb_update *u, const bson_t *doc, bool is_upsert_insert, bson_t *out,
		     bool *changed, int *code, char *err, size_t errlen)
{
	actx a = {0};
	docbuild_node *root = NULL;
	int rc = 0;
	bool old_has, new_has;

	bson_init(out);
	*changed = false;
	if (code != NULL) {
		*code = 0;
	}
	if (u->kind == SDB_UPDATE_REPLACEMENT) {
		rc = apply_replacement(u, doc, out, code, err, errlen);
		goto done;
	}
	a.u = u;
	a.upsert = is_upsert_insert;
	a.code = code;
	a.err = err;
	a.errlen = errlen;
	a.rename_vals = sdb_calloc(u->n_renames + 1, sizeof *a.rename_vals);
	root = docbuild_from_bson(doc);
	rc = resolve_renames(&a, root);
	if (rc == 0) {
		rc = resolve_positional(&a, doc);
	}
	if (rc == 0) {
		rc = apply_obj(&a, u->root, root, "", false);
	}
	for (size_t i = 0; i < u->n_renames; i++) {
		docbuild_free(a.rename_vals[i]);
	}
	free(a.rename_vals);
	if (rc != 0) {
		goto done;
	}
	bson_destroy(out);
	docbuild_to_bson(root, out);
	if (!id_equal(doc, out, &old_has, &new_has) && old_has) {
		rc = fail(code, C_IMMUTABLE, err, errlen,
			  "Performing an update on the path '_id' would modify the immutable field "
			  "'_id'");
		goto done;
	}
	if (new_has) {
		bson_iter_t id;

		bson_iter_init_find(&id, out, "_id");
		if (BSON_ITER_HOLDS_ARRAY(&id) || BSON_ITER_HOLDS_REGEX(&id)) {
			rc = fail(code, C_INVALID_ID, err, errlen, "The '_id' value cannot be of type %s",
				  type_name(bson_iter_type(&id)));
			goto done;
		}
	}
done:
	docbuild_free(root);
	if (rc == 0 && out->len > MAX_DOC_SIZE) {
		rc = fail(code, C_TOO_LARGE, err, errlen,
			  "Resulting document after update is larger than %d", MAX_DOC_SIZE);
	}
	if (rc == 0 && !sdb_bson_depth_ok(out, MAX_NESTING)) {
		rc = fail(code, C_OVERFLOW, err, errlen,
			  "Document exceeds maximum nesting depth of %d", MAX_NESTING);
	}
	if (rc != 0) {
		bson_reinit(out);
		return rc;
	}
	*changed = out->len != doc->len || memcmp(bson_get_data(out), bson_get_data(doc), doc->len) != 0;
	return 0;
}

/* ---- upsert seed ----------------------------------------------------------------- */

/* Set path (dotted) in root to the value at it; fail with 54 on a clash. */
static int seed_set(docbuild_node *root, const char *path, const bson_iter_t *it, int *code,
		    char *err, size_t errlen)
{
	docbuild_node *cur = root;
	const char *p = path;

	while (true) {
		const char *dot = strchr(p, '.');
		size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
		docbuild_node *next;

		if (len == 0) {
			return fail(code, C_EMPTY_FIELD_NAME, err, errlen,
				    "An empty update path is not valid.");
		}
		next = docbuild_field(cur, p, len, NULL);
		if (dot == NULL) {
			if (next != NULL) {
				goto clash;
			}
			docbuild_node *v = docbuild_from_iter(it, false);
			char *k = sdb_strndup(p, len);

			docbuild_set_key(v, k);
			free(k);
			docbuild_push(cur, v);
			return 0;
		}
		if (next == NULL) {
			char *k = sdb_strndup(p, len);

			next = docbuild_new_doc(k);
			free(k);
			docbuild_push(cur, next);
		} else if (next->type != BSON_TYPE_DOCUMENT || next->key == NULL) {
			goto clash;
		}
		cur = next;
		p = dot + 1;
	}
clash:
	return fail(code, C_NOT_SINGLE_VALUE, err, errlen,
		    "cannot infer query fields to set, path '%s' is matched twice", path);
}

static int seed_from(docbuild_node *root, const bson_t *filter, int *code, char *err,
		     size_t errlen)
{
	bson_iter_t it;

	bson_iter_init(&it, filter);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		int rc = 0;

		if (strcmp(k, "$and") == 0 && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			while (rc == 0 && bson_iter_next(&sub)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&sub)) {
					bson_t d;
					const uint8_t *data;
					uint32_t len;

					bson_iter_document(&sub, &len, &data);
					bson_init_static(&d, data, len);
					rc = seed_from(root, &d, code, err, errlen);
				}
			}
		} else if (k[0] == '$' || BSON_ITER_HOLDS_REGEX(&it)) {
			continue;
		} else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t sub;

			bson_iter_recurse(&it, &sub);
			if (bson_iter_next(&sub) && bson_iter_key(&sub)[0] == '$') {
				/* operators: only $eq (and a one-element $in) seed */
				bson_iter_recurse(&it, &sub);
				while (rc == 0 && bson_iter_next(&sub)) {
					const char *op = bson_iter_key(&sub);

					if (strcmp(op, "$eq") == 0 && !BSON_ITER_HOLDS_REGEX(&sub)) {
						rc = seed_set(root, k, &sub, code, err, errlen);
					} else if (strcmp(op, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&sub)) {
						bson_iter_t one;

						bson_iter_recurse(&sub, &one);
						if (bson_iter_next(&one) && !BSON_ITER_HOLDS_REGEX(&one)) {
							bson_iter_t two = one;

							if (!bson_iter_next(&two)) {
								rc = seed_set(root, k, &one, code, err,
									      errlen);
							}
						}
					}
				}
			} else {
				rc = seed_set(root, k, &it, code, err, errlen);
			}
		} else {
			rc = seed_set(root, k, &it, code, err, errlen);
		}
		if (rc != 0) {
			return rc;
		}
	}
	return 0;
}

/* Move _id to the front of a document. */
static void id_first(bson_t *doc)
{
	bson_iter_t it;
	bson_t tmp = BSON_INITIALIZER;

	if (!bson_iter_init(&it, doc) || !bson_iter_next(&it) ||
	    strcmp(bson_iter_key(&it), "_id") == 0 || !bson_iter_init_find(&it, doc, "_id")) {
		bson_destroy(&tmp);
		return;
	}
	bson_append_iter(&tmp, "_id", 3, &it);
	bson_iter_init(&it, doc);
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "_id") != 0) {
			bson_append_iter(&tmp, NULL, 0, &it);
		}
	}
	bson_destroy(doc);
	bson_init(doc);
	bson_concat(doc, &tmp);
	bson_destroy(&tmp);
}

int sdb_update_upsert_seed(const bson_t *filter, bson_t *out, int *code, char *err,
			   size_t errlen)
{
	docbuild_node *root = docbuild_new_doc(NULL);
	int rc;

	bson_init(out);
	if (code != NULL) {
		*code = 0;
	}
	if (!sdb_bson_depth_ok(filter, SDB_BSON_MAX_DEPTH)) {
		docbuild_free(root);
		return fail(code, C_OVERFLOW, err, errlen, "query nests deeper than %d levels",
			    SDB_BSON_MAX_DEPTH);
	}
	rc = seed_from(root, filter, code, err, errlen);
	if (rc == 0) {
		bson_destroy(out);
		docbuild_to_bson(root, out);
		id_first(out);
		bson_iter_t id;

		if (bson_iter_init_find(&id, out, "_id") &&
		    (BSON_ITER_HOLDS_ARRAY(&id) || BSON_ITER_HOLDS_REGEX(&id))) {
			rc = fail(code, C_BAD_VALUE, err, errlen,
				  "The '_id' value cannot be of type %s", type_name(bson_iter_type(&id)));
			bson_reinit(out);
		}
	}
	docbuild_free(root);
	return rc;
}

int sdb_update_upsert_doc(const sdb_update *u, const bson_t *filter, bson_t *out, int *code,
			  char *err, size_t errlen)
{
	bson_t seed, res;
	bool changed;
	int rc;

	bson_init(out);
	rc = sdb_update_upsert_seed(filter, &seed, code, err, errlen);
	if (rc != 0) {
		bson_destroy(&seed);
		return rc;
	}
	if (u->kind == SDB_UPDATE_REPLACEMENT) {
		/* the replacement, with the filter's _id when it has none */
		bson_t idonly = BSON_INITIALIZER;
		bson_iter_t id;

		if (bson_iter_init_find(&id, &seed, "_id")) {
			bson_append_iter(&idonly, "_id", 3, &id);
		}
		rc = sdb_update_apply(u, &idonly, true, &res, &changed, code, err, errlen);
		bson_destroy(&idonly);
	} else {
		rc = sdb_update_apply(u, &seed, true, &res, &changed, code, err, errlen);
	}
	bson_destroy(&seed);
	if (rc != 0) {
		bson_destroy(&res);
		return rc;
	}
	bson_iter_t it;

	if (!bson_iter_init_find(&it, &res, "_id")) {
		bson_oid_t oid;

		if (u->oid != NULL)
			u->oid(u->oid_ctx, &oid);
		else
			bson_oid_init(&oid, NULL);
		bson_append_oid(out, "_id", 3, &oid);
		bson_concat(out, &res);
	} else {
		bson_concat(out, &res);
		id_first(out);
	}
	bson_destroy(&res);
	return 0;
}
