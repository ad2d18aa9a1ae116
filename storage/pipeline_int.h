/* Internals of the aggregation pipeline engine shared by its stages (pipeline.c), its
 * expression language (pipeline_expr.c) and the projection engine's computed fields
 * (projection.c): error context, value constructors and
 * comparisons over docbuild nodes (NULL meaning "missing"), and the compiled expression
 * tree. Not for use outside storage/pipeline*.c and storage/projection.c. */
#ifndef SDB_STORAGE_PIPELINE_INT_H
#define SDB_STORAGE_PIPELINE_INT_H

#include "storage/pipeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/decimal.h"
#include "storage/docbuild.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"
#include "storage/projection.h"
#define C_INTERNAL 1
#define C_BAD_VALUE 2
#define C_TYPE_MISMATCH 14
#define C_FAILED_TO_PARSE 9
#define C_INVALID_OP 168
#define C_NOT_IMPLEMENTED 238
#define C_MEMORY 292
#define C_MAX_SUB_PIPELINE_DEPTH 232 /* MaxSubPipelineDepthExceeded */

/* ---- errors ------------------------------------------------------------------------ */

typedef struct {
	int *code;
	char *err;
	size_t errlen;
	/* user variables in scope while parsing ({name: constant value}: the command's `let`
	 * and an update statement's `c`, evaluated; see sdb_let_parse), or NULL: $$name
	 * resolves to its value, another $$name is 17276 */
	const bson_t *vars;
	/* while parsing: the options of the pipeline being parsed (the foreign-collection
	 * callback for $unionWith/$lookup and sub-pipelines), or NULL */
	const sdb_pipeline_opts *opts;
	/* while evaluating: the document $$ROOT reads when it is not the one the expression is
	 * evaluated against (CURRENT): $redact's subdocuments (pipeline_redact.c); NULL = the
	 * same document */
	const bson_t *root;
	/* the variables bound by $let/$map/$filter/$reduce around the expression: while
	 * parsing their names (val NULL), while evaluating their values; innermost first,
	 * NULL = none (pipeline_expr_var.c) */
	const struct agg_var *lvars;
	/* while evaluating the `in` of a $reduce: the size of its accumulator, kept up to date
	 * by a $concatArrays that appends to it in place (pipeline_expr_var.c), or NULL */
	struct agg_acc_size *acc;
} ectx;

/* While parsing a $reduce's `in`: the tag of its $$value binding. agg_lvar_parse stamps
 * every read of the variable with it (expr.bind, expr.rep), and parse_reduce then walks the
 * parsed tree (never pointers kept during the parse: a repeated key frees what was parsed
 * first) to find which single read may move the accumulator instead of copying it. */
typedef struct agg_var_use {
	char tag; /* only its address is used */
} agg_var_use;

/* The accumulator of a running $reduce: its size in bytes (node_size) and whether this
 * iteration's $concatArrays or $mergeObjects grew it in place (then bytes is up to date
 * unless stale: a $mergeObjects of the chain rebuilt it instead). */
typedef struct agg_acc_size {
	long long bytes;
	bool appended;
	bool stale;
	/* the field-name index of the accumulator document that $mergeObjects last grew in
	 * place (pipeline_expr_obj.c), kept between elements so that the next merge does
	 * not rebuild it: valid for the node idx_of only (NULL: none); owned, freed by
	 * eval_reduce */
	size_t *idx_slots;
	size_t idx_cap;
	const docbuild_node *idx_of;
} agg_acc_size;

/* One variable bound by an expression ($let, $map/$filter's `as`, $reduce's this/value):
 * a link of a chain living on the C stack of the parse or evaluation that binds it.
 * Reads borrow the value (agg_expr_eval_ref); none copies it unless its consumer keeps
 * it. */
typedef struct agg_var {
	const struct agg_var *up;
	const char *name;
	size_t len;
	const docbuild_node *val; /* while evaluating: the value (NULL = missing) */
	/* while evaluating: when non-NULL the binding owns the value *own (val unused) and
	 * the one read marked `take` moves it out (*own becomes NULL): $reduce's $$value */
	docbuild_node **own;
	/* while parsing: the frame's expression is evaluated once per element ($map,
	 * $filter, $reduce), and (or NULL) where to count the reads of the variable */
	bool loop;
	agg_var_use *use;
} agg_var;

static inline int efail(const ectx *e, int c, const char *fmt, ...)
{
	va_list ap;

	if (e->code != NULL) {
		*e->code = c;
	}
	if (e->err != NULL && e->errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(e->err, e->errlen, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
}

static inline const char *type_name(bson_type_t t)
{
	return sdb_bson_type_name(t);
}

static inline bson_type_t ntype(const docbuild_node *n)
{
	return n == NULL ? BSON_TYPE_EOD : n->type;
}

/* ---- values -------------------------------------------------------------------------- */

static inline docbuild_node *v_scalar(const bson_value_t *v)
{
	return docbuild_from_value(v, NULL);
}

static inline docbuild_node *v_null(void)
{
	return docbuild_new_null(NULL);
}

static inline docbuild_node *v_bool(bool b)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_BOOL;
	v.value.v_bool = b;
	return v_scalar(&v);
}

static inline docbuild_node *v_int32(int32_t i)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_INT32;
	v.value.v_int32 = i;
	return v_scalar(&v);
}

static inline docbuild_node *v_int64(int64_t i)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_INT64;
	v.value.v_int64 = i;
	return v_scalar(&v);
}

static inline docbuild_node *v_double(double d)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_DOUBLE;
	v.value.v_double = d;
	return v_scalar(&v);
}

static inline docbuild_node *v_decimal(bson_decimal128_t d)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_DECIMAL128;
	v.value.v_decimal128 = d;
	return v_scalar(&v);
}

static inline docbuild_node *v_date(int64_t ms)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_DATE_TIME;
	v.value.v_datetime = ms;
	return v_scalar(&v);
}

static inline docbuild_node *v_string(const char *s, size_t len)
{
	bson_value_t v = {0};

	v.value_type = BSON_TYPE_UTF8;
	v.value.v_utf8.str = (char *)s;
	v.value.v_utf8.len = (uint32_t)len;
	return v_scalar(&v);
}

static inline bool is_nullish(const docbuild_node *n)
{
	return n == NULL || n->type == BSON_TYPE_NULL || n->type == BSON_TYPE_UNDEFINED;
}

static inline bool is_number(const docbuild_node *n)
{
	return n != NULL && (n->type == BSON_TYPE_INT32 || n->type == BSON_TYPE_INT64 ||
			     n->type == BSON_TYPE_DOUBLE || n->type == BSON_TYPE_DECIMAL128);
}

static inline double num_double(const docbuild_node *n)
{
	switch (n->type) {
	case BSON_TYPE_INT32: return n->value.value.v_int32;
	case BSON_TYPE_INT64: return (double)n->value.value.v_int64;
	case BSON_TYPE_DOUBLE: return n->value.value.v_double;
	case BSON_TYPE_DECIMAL128: {
		char s[BSON_DECIMAL128_STRING];

		bson_decimal128_to_string(&n->value.value.v_decimal128, s);
		return strtod(s, NULL);
	}
	default: return 0;
	}
}

/* Value::integral(): is v a number whose value is an integer in int32's range? *out gets
 * it (the $slice/$range/$indexOf* and code-point operators' index arguments). */
static inline bool agg_integral32(const docbuild_node *v, int32_t *out)
{
	double d;

	*out = 0; /* set on every path: callers read it after a false too (-Wmaybe-uninitialized) */
	if (!is_number(v)) {
		return false;
	}
	if (v->type == BSON_TYPE_INT32) {
		*out = v->value.value.v_int32;
		return true;
	}
	if (v->type == BSON_TYPE_INT64) {
		if (v->value.value.v_int64 < INT32_MIN || v->value.value.v_int64 > INT32_MAX) {
			return false;
		}
		*out = (int32_t)v->value.value.v_int64;
		return true;
	}
	d = num_double(v);
	if (!(d == floor(d) && d >= (double)INT32_MIN && d <= (double)INT32_MAX)) {
		return false;
	}
	*out = (int32_t)d;
	return true;
}

/* Aggregation truthiness: false, null, undefined, missing and 0 are false. */
static inline bool truthy(const docbuild_node *n)
{
	if (is_nullish(n)) {
		return false;
	}
	if (n->type == BSON_TYPE_BOOL) {
		return n->value.value.v_bool;
	}
	if (is_number(n)) {
		return num_double(n) != 0;
	}
	return true;
}

/* Compare in MongoDB order; missing sorts below everything (aggregation semantics). */
static inline int vcmp(const docbuild_node *a, const docbuild_node *b)
{
	bson_t sa, sb;
	bson_value_t va, vb;
	int r;

	if (a == NULL || b == NULL) {
		return (a != NULL) - (b != NULL);
	}
	docbuild_value(a, &sa, &va);
	docbuild_value(b, &sb, &vb);
	r = sdb_bson_value_cmp(&va, &vb);
	bson_destroy(&sa);
	bson_destroy(&sb);
	return r;
}

static inline size_t node_size(const docbuild_node *n)
{
	size_t s = sizeof *n + 16;

	if (n->type == BSON_TYPE_DOCUMENT || n->type == BSON_TYPE_ARRAY) {
		for (size_t i = 0; i < n->n; i++) {
			s += node_size(n->kids[i]);
		}
	} else if (n->type == BSON_TYPE_UTF8) {
		s += n->value.value.v_utf8.len;
	} else if (n->type == BSON_TYPE_BINARY) {
		s += n->value.value.v_binary.data_len;
	}
	return s;
}

/* ---- $sum / $avg (pipeline_expr.c) ---------------------------------------------------- */

/* The state of a $sum or $avg, as MongoDB 6.0's AccumulatorSum / AccumulatorAvg keep it
 * (accumulator_sum.cpp, accumulator_avg.cpp): the ints, longs and doubles in a
 * DoubleDoubleSummation, the decimals in a Decimal128 total, the widest type seen (int <
 * long < double < decimal) and the number of numeric inputs. Zero-initialise ({0}). */
typedef struct {
	sdb_ddsum nondec;
	bson_decimal128_t dec; /* valid when has_dec */
	bool has_dec;
	int widest; /* 0 int32, 1 int64, 2 double, 3 decimal */
	int64_t count;
} agg_sum;

/* Add v (NULL = missing) to s; non-numeric values are ignored, as mongod ignores them. */
void agg_sum_add(agg_sum *s, const docbuild_node *v);

/* The $sum (avg false) or $avg result of s as a new node (the caller frees it): $sum an
 * int32 or int64 when every input was an integer and the total fits (an int32 total
 * outgrowing int32 becomes an int64, an int64 one a double), a double when a double was
 * added, a Decimal128 (the decimal total plus the other values' exact sum converted to 34
 * digits) when a decimal was; $avg null without numeric inputs, else the total divided by
 * the count, a Decimal128 division when a decimal was added, else a double. */
docbuild_node *agg_sum_result(const agg_sum *s, bool avg);

/* ---- $stdDevPop / $stdDevSamp (pipeline_arith.c) ----------------------------------- */

/* The state of a $stdDevPop or $stdDevSamp, as MongoDB 6.0's AccumulatorStdDev
 * (accumulator_std_dev.cpp): Welford's online mean and sum of squared differences over
 * the numeric inputs read as doubles. Zero-initialise ({0}). */
typedef struct {
	int64_t count;
	double mean;
	double m2;
} agg_stddev;

/* Add v (NULL = missing) to s; non-numeric values are ignored, as mongod ignores them. */
void agg_stddev_add(agg_stddev *s, const docbuild_node *v);

/* The result of s as a new double node (the caller frees it): sqrt(m2 / count) for the
 * population (samp false), sqrt(m2 / (count - 1)) for the sample; null when that count
 * is not positive (no numeric input; one for the sample), as mongod. */
docbuild_node *agg_stddev_result(const agg_stddev *s, bool samp);

/* ---- expressions (pipeline_expr.c) ---------------------------------------------------- */

typedef enum {
	X_LIT = 0,
	X_PATH, /* "$a.b" (path), "$$ROOT"/"$$CURRENT" (path NULL) */
	X_OBJ,
	X_ARR,
	X_OP,
	X_REMOVE, /* $$REMOVE: missing */
	X_VAR,    /* $$name / $$name.a.b of a user variable: path into var */
	X_LVAR,   /* $$name[.a.b] of a variable an expression binds (ectx.lvars): path */
} xkind;

typedef enum {
	OP_ADD = 0,
	OP_SUBTRACT,
	OP_MULTIPLY,
	OP_DIVIDE,
	OP_MOD,
	OP_CONCAT,
	OP_TOUPPER,
	OP_TOLOWER,
	OP_COND,
	OP_IFNULL,
	OP_EQ,
	OP_NE,
	OP_GT,
	OP_GTE,
	OP_LT,
	OP_LTE,
	OP_CMP,
	OP_AND,
	OP_OR,
	OP_NOT,
	OP_SIZE,
	OP_ABS,
	OP_IN,
	OP_ARRAYELEMAT,
	OP_LITERAL,
	OP_SUM,
	OP_AVG,
	OP_MIN,
	OP_MAX,
	OP_TYPE,
	OP_ISARRAY,
	OP_CONCATARRAYS,
	OP_FLOOR,
	OP_CEIL,
	OP_STRLENBYTES,
	OP_SUBSTRBYTES,
	OP_SWITCH, /* args: case0, then0, case1, then1, ... [, default when n is odd] */
	OP_STDDEVPOP,
	OP_STDDEVSAMP,
	OP_XVAR,   /* $let/$map/$filter/$reduce (pipeline_expr_var.c): sub */
	OP_XARR,   /* array and set operators (pipeline_expr_array.c): sub */
	OP_XOBJ,   /* object operators (pipeline_expr_obj.c): sub */
	OP_EXT,    /* an operator of the extension tables (pipeline_ext.h): expr.ext names it */
} xop;

typedef struct expr expr;
struct expr {
	xkind kind;
	docbuild_node *lit; /* X_LIT */
	char *path;         /* X_PATH; X_VAR: "v" or "v.a.b" */
	bson_t *var;        /* X_VAR: {v: the variable's value} (owned) */
	xop op;             /* X_OP */
	expr **args;        /* X_OP, X_OBJ, X_ARR */
	char **keys;        /* X_OBJ */
	size_t n;
	bool root;          /* X_PATH: $$ROOT[.path] (reads ectx.root when set), not CURRENT */
	int sub;            /* OP_XVAR/OP_XARR/OP_XOBJ: the operator in its file's table */
	int ext;            /* OP_EXT: the operator's ext_id (pipeline_ext.h) */
	bool take;          /* X_LVAR: the only read of $reduce's $$value, outside any loop:
			     * moves the accumulator out instead of copying it */
	/* X_LVAR, while its $reduce is parsed: the agg_var_use of the binding it reads (NULL
	 * for other variables; cleared when that parse ends) and whether it sits inside a
	 * $map/$filter/$reduce loop of that `in` */
	const agg_var_use *bind;
	bool rep;
};

/* Compile the aggregation expression at it (a literal, "$path", "$$VAR", {op: args} or an
 * object/array of expressions) into *out (caller frees with agg_expr_free). Errors:
 * SDB_EINVAL with MongoDB's code and message in e. */
int agg_expr_parse(const bson_iter_t *it, expr **out, const ectx *e);

/* Evaluate x against the document root into *out (a new node the caller frees with
 * docbuild_free, or NULL for "missing"). Errors: SDB_EINVAL with code and message in e. */
int agg_expr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);

/* Evaluate x like agg_expr_eval, but without copying what is already there: a variable
 * ($$name, bound by an expression) or a literal is lent (*owned false: *out is read-only
 * and lives as long as the binding or x), anything else is a new node (*owned true: the
 * caller frees it with docbuild_free, and may change it). Errors: agg_expr_eval's. */
int agg_expr_eval_ref(const expr *x, const bson_t *root, docbuild_node **out, bool *owned,
		      const ectx *e);
/* Free v when owned (agg_expr_eval_ref's pairs). */
static inline void agg_ref_free(docbuild_node *v, bool owned)
{
	if (owned) {
		docbuild_free(v);
	}
}
/* The interruption check of the loops of the expression operators ($map, $filter,
 * $reduce, $range, $zip, the set operators, $sortArray, string loops): on every
 * iteration (i, the iteration's index, is not used), ask storage's interruption check
 * (sdb_store_interrupted: killOp, or the command's maxTimeMS passed). That check is an
 * atomic load and a vDSO clock read (tens of ns), less than any loop body (which builds
 * nodes); checking every iteration bounds the time to an interruption by one body's
 * cost, however expensive the body, and a loop nested in a body checks on its own
 * iterations. (Every 1,024 iterations let a body of ~5 ms run ~5 s past maxTimeMS.)
 * Returns: 0.
 * Errors: SDB_ECANCELED with 11601 Interrupted in e (the wire layer answers 50
 * MaxTimeMSExpired instead when the request's maxTimeMS expired), as mongod's
 * OperationContext::checkForInterrupt at its interruption points. */
int agg_check_interrupt(size_t i, const ectx *e);
/* Free x (NULL is fine). */
void agg_expr_free(expr *x);

/* ---- the operators of pipeline_expr_var.c, _array.c and _obj.c ------------------------
 * agg_x*_parse: when name is one of the file's operators, compile its argument arg into x
 * (an X_OP node the caller allocated and frees; args are pushed with agg_expr_push) and
 * return 0 or SDB_EINVAL with MongoDB's code and message in e; return 1 when name is not
 * the file's. agg_x*_eval: evaluate such an x against root into *out (a new node, NULL =
 * missing). Errors: SDB_EINVAL with MongoDB's code and message in e. */
int agg_xvar_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e);
int agg_xvar_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);
int agg_xarr_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e);
int agg_xarr_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);
int agg_xobj_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e);
int agg_xobj_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);
/* Append arg (owned by x from now on; may be NULL) to x's arguments. */
void agg_expr_push(expr *x, expr *arg);
/* Parse arg as an operator's argument list (an array: its elements, else the one value)
 * into x's args and check the count against min..max (max -1 = any), as
 * ExpressionNary::parseArguments and ExpressionFixedArity do. Returns: 0. Errors:
 * SDB_EINVAL with the arguments' parse errors or 16020, in e. */
int agg_expr_parse_list(const char *name, const bson_iter_t *arg, expr *x, int min, int max,
			const ectx *e);
/* $$name[.path] (var: the text after "$$", len: the name's length) when name is a
 * variable bound in e->lvars: x becomes an X_LVAR. Returns: 0 when bound, 1 when not.
 * Errors: the path's FieldPath errors (SDB_EINVAL, in e). */
int agg_lvar_parse(const char *var, size_t len, expr *x, const ectx *e);
/* Evaluate the X_LVAR x (its variable's value, or the path below it with aggregation's
 * array rules) into *out (a new node, NULL = missing). Errors: 17276 when unbound. */
int agg_lvar_eval(const expr *x, docbuild_node **out, const ectx *e);
/* The value of the X_LVAR x without a path, lent (*out: read-only, NULL = missing, valid
 * while the binding lives). Errors: 17276 when unbound. */
int agg_lvar_ref(const expr *x, const docbuild_node **out, const ectx *e);
/* The expr.sub of $mergeObjects among the OP_XOBJ operators (pipeline_expr_obj.c). */
#define AGG_XOBJ_MERGE 0
/* Is x a $concatArrays or $mergeObjects whose first operand is, through inner ones, the
 * accumulator its $reduce moved out (its result is that accumulator grown in place), or a
 * $cond/$switch each of whose branches is such an operator or the moved $$value itself
 * (its result is the accumulator, grown in place or unchanged)? */
bool agg_expr_grows_acc(const expr *x);
/* Is a (an operand of $concatArrays/$mergeObjects) the accumulator of the $reduce whose
 * `in` holds it, moved out ($$value marked take), possibly through inner $concatArrays/
 * $mergeObjects that grew it in place? */
bool agg_expr_moved_acc(const expr *a);
/* The value at the dotted path below node v (NULL = missing), with aggregation's array
 * rules (an array maps the rest of the path over its documents): a new node or NULL. */
docbuild_node *agg_node_path(const docbuild_node *v, const char *path);
/* The most bytes (node_size) the values $map, $filter, $reduce and $let build may hold:
 * MongoDB's internalQueryMaxRangeBytes (100 MiB), so that nested loops cannot exhaust the
 * memory; past it an evaluation is 146 ExceededMemoryLimit. */
#define AGG_EXPR_MAX_BYTES (100LL * 1024 * 1024)
/* v (NULL = missing) as text for an error message, as MongoDB's Value::toString: relaxed
 * extended JSON (a new string the caller frees). */
char *agg_node_str(const docbuild_node *v);
/* The numeric, string, conversion and date operators (pipeline_expr_ext.c and its family
 * files, pipeline_ext.h). agg_ext_parse compiles {name: arg} into x (kind X_OP, op OP_EXT)
 * when name is one of them. Returns: 1 (x untouched) when name is not an extension
 * operator, 0 when compiled, SDB_EINVAL with MongoDB's parse error in e.
 * agg_ext_eval evaluates such an x against root. Errors: SDB_EINVAL with MongoDB's code and
 * message in e. */
int agg_ext_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e);
int agg_ext_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);

/* $bucket (pipeline_bucket.c): the stage's argument at it turned into the argument of a
 * $group (*group) and of the $sort after it (*sort), as MongoDB 6.0 desugars it: _id is a
 * $switch over the [b_i, b_i+1) ranges of `boundaries` (then the lower bound), with
 * `default`; the fields are `output` or {count: {$sum: 1}}; sorted by _id. On success
 * both are initialised (the caller destroys them); on failure neither is.
 * Errors: SDB_EINVAL with MongoDB's code and message in e (40191-40202; 15948 for an
 * `_id` in output). */
int agg_bucket_desugar(const bson_iter_t *it, bson_t *group, bson_t *sort, const ectx *e);

/* $bucketAuto (pipeline_bucketauto.c): check the stage's argument at it as MongoDB 6.0
 * does and turn it into the argument of a $group whose _id is the groupBy expression and
 * whose fields are `output` (or {count: {$sum: 1}} when output is absent or empty), for the
 * compiler to read the expression and the accumulators from; *buckets gets `buckets` (> 0)
 * and *gran the granularity (0 = none, else the rounder's number for agg_gran_round). On
 * success *group is initialised (the caller destroys it); on failure it is not.
 * Errors: SDB_EINVAL with MongoDB's code and message in e: 40240 not an object, 40239 a
 * groupBy that is not a $path or an operator object, 40241 buckets not a number, 40242 not
 * an int32, 40243 not positive, 40244 output not an object, 40261 granularity not a
 * string, 40257 unknown granularity, 40245 unknown option, 40246 groupBy or buckets
 * missing; 15948 an output field named _id (mongod would emit a second _id). */
int agg_bucketauto_desugar(const bson_iter_t *it, bson_t *group, int32_t *buckets, int *gran,
			   const ectx *e);
/* The granularity check mongod makes on each groupBy value (extractKey): 0 when key (NULL =
 * missing) is a non-negative number. Errors: SDB_EINVAL with 40258 not a number (missing and
 * null included), 40259 NaN, 40260 negative; 2 BadValue for Infinity (mongod's rounders loop
 * forever on it) and 238 for a Decimal128 (its rounders in decimal are not implemented). */
int agg_gran_check(const docbuild_node *key, const ectx *e);
/* Round v up (up: the smallest value of the granularity strictly above v) or down (the
 * largest strictly below) with the rounder gran (1..13, agg_bucketauto_desugar); 0 rounds to
 * itself. *out: a new node (the caller frees it with docbuild_free): a double for the
 * preferred-number series, {$pow: [2, n]}'s int, long or double for POWERSOF2.
 * Errors: agg_gran_check's. */
int agg_gran_round(int gran, bool up, const docbuild_node *v, docbuild_node **out,
		   const ectx *e);

/* The largest document $facet builds: a BSON document's limit (maxBsonObjectSize). */
#define AGG_FACET_MAX_BYTES (16 * 1024 * 1024)

/* $facet (pipeline_facet.c): its sub-pipelines, compiled. */
typedef struct agg_facet agg_facet;
/* Compile the $facet argument at it (each sub-pipeline with the enclosing `let` variables
 * of e and the memory bound max_mem) into *out (free with agg_facet_free).
 * Errors: SDB_EINVAL with MongoDB's code and message in e: 40169 not a non-empty object,
 * 40170 a facet that is not an array, 40171 a stage that is not an object, 40600 a stage
 * not allowed inside $facet ($facet, $out, $merge, $collStats, ...), 15998/16410/16412 a
 * bad facet name, or any error of the sub-pipeline's own parse. */
int agg_facet_parse(const bson_iter_t *it, size_t max_mem, agg_facet **out, const ectx *e);
/* Run every sub-pipeline of f over the n documents docs (borrowed; each sub-pipeline reads
 * them all, in order) into one new document {name: [outputs], ...} in *out (the caller
 * destroys it with bson_destroy). Errors: a sub-pipeline's error (code and message in e),
 * or SDB_EINVAL with 4031700 when the document would exceed max_bytes. */
int agg_facet_run(const agg_facet *f, bson_t *const *docs, size_t n, size_t max_bytes,
		  bson_t **out, const ectx *e);
/* Free f (NULL is fine). */
void agg_facet_free(agg_facet *f);

/* 0 when p is a valid field path (no empty component, no leading '$'). Errors: SDB_EINVAL
 * with MongoDB's code and message in e. */
int agg_field_path_ok(const char *p, const ectx *e);

/* Set field name of document node doc to v (ownership of v passes to doc; replaces an
 * existing field in place). */
void agg_set_field(docbuild_node *doc, const char *name, docbuild_node *v);

/* ---- the compiled pipeline (built by pipeline_parse.c, run by pipeline.c) ------------- */

/* The kind of a compiled stage ($bucket and $sortByCount compile to S_GROUP + S_SORT,
 * $count to S_GROUP + S_PROJECT). */
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
	S_BUCKET_AUTO, /* $bucketAuto: id = groupBy, accs = output, n = buckets, gran */
	S_UNION_WITH,  /* $unionWith: its input, then coll's documents through sub */
	S_LOOKUP,      /* $lookup: each input document with `as` = the foreign matches */
	S_GRAPH_LOOKUP, /* $graphLookup: each input document with `as` = the documents its
			 * breadth-first search reached (pipeline_graph.c) */
	S_SAMPLE, /* $sample: n = size; the n documents of smallest random key (pipeline_sample.c) */
	S_REDACT, /* $redact: id = the expression (pipeline_redact.c) */
} skind;

/* A $group accumulator. */
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
	A_STDDEVPOP,
	A_STDDEVSAMP,
} akind;

/* One output field of a $group: its name (owned), accumulator and argument expression
 * (owned; NULL for $count). */
typedef struct {
	char *name;
	akind kind;
	expr *x;
} acc_spec;

/* One compiled stage: the fields its kind uses, all owned (pipeline_parse.c frees them). */
typedef struct stage {
	skind kind;
	bson_t *spec;     /* a copy of the stage's argument (for pushdown) */
	sdb_matcher *m;   /* $match */
	sdb_projection *proj; /* S_PROJECT */
	sdb_sortspec *sort;
	int64_t n;        /* $limit/$skip; $sort: top-k bound from a following $limit (0 = none);
			   * $bucketAuto: buckets */
	expr *id;         /* $group _id, $replaceRoot newRoot, $bucketAuto groupBy */
	acc_spec *accs;
	size_t n_accs;
	char *path;       /* $unwind */
	char *index_field;
	bool preserve;
	bool sort_by_count_desc; /* $sortByCount: the group is followed by a count sort */
	agg_facet *facet;         /* $facet */
	int gran;                 /* $bucketAuto: granularity rounder (0 = none) */
	/* $unionWith / $lookup: the foreign collection, the sub-pipeline (a BSON array;
	 * empty when none) */
	char *coll;
	bson_t *sub;
	/* $lookup: `as`, localField/foreignField (NULL in the pipeline-only form), the `let`
	 * variables' names and compiled expressions */
	char *as;
	char *local_field;
	char *foreign_field;
	char **let_names;
	expr **let_exprs;
	size_t n_let;
	/* $graphLookup (also coll, as, and id = startWith): connectFromField, connectToField,
	 * depthField (NULL = none), restrictSearchWithMatch (NULL = none), maxDepth (-1 =
	 * none) */
	char *connect_from;
	char *connect_to;
	char *depth_field;
	bson_t *restrict_match;
	int64_t max_depth;
} stage;

/* The compiled pipeline: its stages in order, and the bytes one blocking stage may hold. */
struct sdb_pipeline {
	stage *st;
	size_t n;
	size_t max_mem;
	/* for $unionWith / $lookup: the reader of other collections and the command's `let`
	 * variables (owned copy; NULL = none) the sub-pipelines see */
	sdb_pipeline_foreign_fn foreign;
	void *foreign_arg;
	bson_t *let;
	/* $sample's random keys across processes (sdb_pipeline_opts.sample_key_out/in) */
	bool sample_key_out;
	bool sample_key_in;
};

/* $sample (pipeline_sample.c): parse the stage's argument at it into a new S_SAMPLE stage
 * of p (n = size), as MongoDB 6.0's DocumentSourceSample::createFromBson.
 * Errors: SDB_EINVAL with 28745 not an object, 28746 size not a number, 28747 size
 * negative, 28748 an unknown option, 28749 no size, in e. */
int agg_sample_parse(sdb_pipeline *p, const bson_iter_t *it, const ectx *e);
/* One $sample's selection: a bounded max-heap of the n documents of smallest random key
 * (keys are uniform doubles in [0, 1) from a PRNG seeded by getrandom(2) per sampler), so
 * memory is bounded by n documents, never by the input. */
typedef struct agg_sampler agg_sampler;
/* A new sampler keeping n (>= 0) documents of at most max_mem bytes in all; key_in: take
 * an input document's key from its double field SDB_PIPELINE_SAMPLE_KEY (removed) when it
 * has one; key_out: emit each document with its key in that field. Free with
 * agg_sampler_free. Never fails. */
agg_sampler *agg_sampler_new(int64_t n, size_t max_mem, bool key_in, bool key_out);
/* Offer doc (ownership passes to the sampler). Returns: 0. Errors: SDB_ETOOBIG with 292
 * QueryExceededMemoryLimitNoDiskUseAllowed in e when the kept documents exceed max_mem. */
int agg_sampler_add(agg_sampler *s, bson_t *doc, const ectx *e);
/* After the last agg_sampler_add: the next kept document in ascending key order (the
 * caller's; NULL at the end). */
bson_t *agg_sampler_next(agg_sampler *s);
/* Free s and the documents it still holds (NULL is fine). */
void agg_sampler_free(agg_sampler *s);

/* $redact (pipeline_redact.c): compile the stage's argument at it (an expression in which
 * $$DESCEND, $$PRUNE and $$KEEP are defined) into a new S_REDACT stage of p.
 * Errors: the expression's parse errors (SDB_EINVAL, code and message in e). */
int agg_redact_parse(sdb_pipeline *p, const bson_iter_t *it, const ectx *e);
/* Redact one document in with the expression x, as MongoDB 6.0's
 * DocumentSourceRedact::redactObject: *out gets the new document (the caller destroys it
 * with bson_destroy), or NULL when the document is pruned.
 * Errors: SDB_EINVAL with the expression's error, or 17053 when it evaluates to something
 * other than "descend", "prune" or "keep", in e. */
int agg_redact_doc(const expr *x, const bson_t *in, bson_t **out, const ectx *e);

/* $unionWith and $lookup (pipeline_lookup.c): parse the stage's argument at it into a new
 * stage of p (name is "$unionWith" or "$lookup"). Errors: SDB_EINVAL with MongoDB's code
 * and message in e (see pipeline_lookup.c), 238 when p has no foreign reader. */
int agg_lookup_parse(sdb_pipeline *p, const char *name, const bson_iter_t *it, const ectx *e);
/* A stage that reads another collection ($lookup, $unionWith, $graphLookup) in a pipeline
 * already SDB_PIPELINE_MAX_SUB_DEPTH deep (e->opts->sub_depth): mongod's
 * ExpressionContext::copyForSubPipeline check. Returns: 0, or SDB_EINVAL with 232
 * MaxSubPipelineDepthExceeded in e. */
int agg_sub_depth_check(const ectx *e);
/* Free what agg_lookup_parse put in s (the coll/sub/as/... fields). */
void agg_lookup_clear(stage *s);
/* 0 when name is a valid user variable name (MongoDB's
 * Variables::uassertValidNameForUserWrite). Errors: SDB_EINVAL with 16866 (empty), 16867
 * (bad first character), 16868 (bad character), 238 (CURRENT) in e. */
int agg_let_name_ok(const char *name, const ectx *e);
/* The results a $lookup already read in one cursor: the foreign read's stages and
 * variables ({s: stages, v: vars}) -> the array it gave, so that equal local values (or an
 * uncorrelated pipeline) read the foreign collection once. Bounded by
 * AGG_LOOKUP_CACHE_ENTRIES entries and AGG_LOOKUP_CACHE_BYTES bytes (past them: no caching). */
#define AGG_LOOKUP_CACHE_ENTRIES 256
#define AGG_LOOKUP_CACHE_BYTES (16u * 1024u * 1024u)
typedef struct agg_lookup_cache {
	bson_t **keys;
	docbuild_node **vals;
	size_t n;
	size_t bytes;
} agg_lookup_cache;
/* Free what cache holds (it may then be used again, empty). */
void agg_lookup_cache_clear(agg_lookup_cache *cache);
/* $lookup's matches for one input document in (borrowed): *out gets a new array node (the
 * caller sets it as `as` or frees it with docbuild_free) of the foreign documents the
 * sub-pipeline returns (from cache when the same read was made before; cache may be NULL).
 * Errors: the foreign reader's or a `let` expression's (code and message in e), 4568 when
 * the array would exceed 16 MiB. */
int agg_lookup_one(const sdb_pipeline *p, const stage *st, const bson_t *in,
		   agg_lookup_cache *cache, docbuild_node **out, const ectx *e);
/* A set of encoded values (storage/keyenc.h; open addressing, linear probing): a slot is
 * empty when its data is NULL (an encoded value is never empty). Zero-initialised is
 * empty; agg_keyset_free releases it. */
typedef struct agg_keyset {
	sdb_key *slots;
	size_t cap;
	size_t n;
} agg_keyset;
/* Add k (taking ownership of its data) unless an equal key is there (then k is freed).
 * Returns: true when added. */
bool agg_keyset_add(agg_keyset *s, sdb_key *k);
/* Free what s holds (it may then be used again, empty). */
void agg_keyset_free(agg_keyset *s);
/* Set the dotted path of document node doc to v (ownership of v passes to doc; v NULL
 * removes it): the intermediate fields that are missing or not documents become empty
 * documents, as MutableDocument::setNestedField. */
void agg_set_path(docbuild_node *doc, const char *path, docbuild_node *v);

/* $graphLookup (pipeline_graph.c): parse the stage's argument at it into a new stage of p.
 * Errors: SDB_EINVAL with MongoDB 6.0's code and message in e (document_source_graph_lookup
 * .cpp: 9 not an object / no or bad from, 73 an invalid from, 40103 an argument not a
 * string, 13111 an object where a string is wanted, 40100-40102 maxDepth, 40185 and the
 * matcher's own codes for restrictSearchWithMatch, 40104 an unknown argument, 40105 a
 * required argument missing, FieldPath's codes for as/connectFromField/connectToField/
 * depthField, startWith's expression errors), 238 when p has no foreign reader. */
int agg_graph_parse(sdb_pipeline *p, const bson_iter_t *it, const ectx *e);
/* Free what agg_graph_parse put in s (connect_from ... restrict_match). */
void agg_graph_clear(stage *s);
/* $graphLookup's breadth-first search for one input document in (borrowed): *out gets a
 * new array node (the caller sets it as `as` or frees it with docbuild_free) of the
 * foreign documents reached, each once (by _id), in the order they were reached (mongod's
 * order is unspecified). Errors: the foreign reader's or startWith's (code and message in
 * e), 40271 a foreign document without _id, 40099 when the documents reached and the
 * values to search next exceed p's memory bound. */
int agg_graph_one(const sdb_pipeline *p, const stage *st, const bson_t *in,
		  docbuild_node **out, const ectx *e);

/* Open the foreign source of a $unionWith stage st of p (sub-pipeline over coll, with p's
 * `let`). Errors: the foreign reader's. */
int agg_union_open(const sdb_pipeline *p, const stage *st, sdb_pipeline_source *src,
		   const ectx *e);

/* pipeline_arith.c: the expressions' arithmetic. agg_eval_add / agg_eval_multiply take the
 * x->n evaluated operands vals (borrowed) and set *out (a new node); agg_eval_subtract its
 * two operands. Returns: 0, or SDB_EINVAL with MongoDB's code and message in e (16554/16555
 * non-numeric, 16612 two dates in $add, 15 date overflow, 16556 $subtract types, 159
 * DurationOverflow). agg_eval_sum_avg: the $sum ($avg when avg) of n values (non-numbers
 * ignored, as MongoDB's), a new node (int 0 / null for no numbers). */
int agg_eval_add(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e);
int agg_eval_multiply(const expr *x, docbuild_node **vals, docbuild_node **out, const ectx *e);
int agg_eval_subtract(docbuild_node *a, docbuild_node *b, docbuild_node **out, const ectx *e);
docbuild_node *agg_eval_sum_avg(bool avg, docbuild_node **items, size_t n);

#endif
