/* Internals of the update engine shared by its parser (update.c) and its applier
 * (update_apply.c): the update tree (one node per path component, leaves carrying one
 * modifier; mongo/db/update/update_object_node.cpp), the MongoDB error codes used, and the
 * message helpers. Not for use outside storage/update*.c. */
#ifndef SDB_STORAGE_UPDATE_INT_H
#define SDB_STORAGE_UPDATE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "storage/docbuild.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"
#include "storage/update.h"

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
	struct sdb_pipeline *pipe; /* SDB_UPDATE_PIPELINE: its stages (update_pipeline.c) */
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

/* update_pipeline.c: parse the stages of a pipeline-style update into u->pipe (only the
 * stages MongoDB admits in an update; arrayFilters refused), and run them over doc (out
 * always initialised; the pipeline's document, before the _id rules of a replacement).
 * Errors: SDB_EINVAL with *code and err. */
int upd_pipeline_parse(sdb_update *u, const bson_t *stages, const sdb_update_opts *opts,
		       int *code, char *err, size_t errlen);
int upd_pipeline_run(const sdb_update *u, const bson_t *doc, bson_t *out, int *code, char *err,
		     size_t errlen);

/* Set *code (may be NULL) to c and err (may be NULL) to the formatted message; returns
 * SDB_EINVAL, so that callers can `return upd_fail(...)`. Returns: always SDB_EINVAL. */
int upd_fail(int *code, int c, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* Relaxed extended JSON of a value or a document node, for messages (caller frees). */
char *upd_value_json(const bson_value_t *v);
char *upd_node_json(const docbuild_node *n);

/* MongoDB's name of a BSON type ("double", "object", ...), for messages. */
const char *upd_type_name(bson_type_t t);

/* True when s is a non-negative decimal array index without leading zeros; *v its value. */
bool upd_is_numeric_name(const char *s, size_t *v);

/* True when v is a double, int32, int64 or decimal128. */
bool upd_value_is_number(const bson_value_t *v);

#endif
