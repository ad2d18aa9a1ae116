/* Internals of the expression language's numeric, string, conversion and date operators
 * (issue #20): one operator table and parser (pipeline_expr_ext.c, which also holds the
 * numeric operators) and one evaluator per family (pipeline_expr_str.c,
 * pipeline_expr_conv.c, pipeline_expr_date.c). pipeline_expr.c reaches them through
 * agg_ext_parse / agg_ext_eval (pipeline_int.h). Semantics, codes and messages are MongoDB
 * 6.0's (src/mongo/db/pipeline/expression.cpp, expression_convert, datetime/). Not for use
 * outside storage/pipeline_expr*.c. */
#ifndef SDB_STORAGE_PIPELINE_EXT_H
#define SDB_STORAGE_PIPELINE_EXT_H

#include "storage/pipeline_int.h"

#define C_CONVERSION_FAILURE 241

/* The extension operators (expr.ext). */
typedef enum {
	/* numeric (pipeline_expr_ext.c) */
	E_ROUND = 0,
	E_TRUNC,
	E_EXP,
	E_LN,
	E_LOG,
	E_LOG10,
	E_POW,
	E_SQRT,
	E_ISNUMBER,
	/* strings (pipeline_expr_str.c) */
	E_SPLIT,
	E_TRIM,
	E_LTRIM,
	E_RTRIM,
	E_INDEXOFBYTES,
	E_INDEXOFCP,
	E_STRLENCP,
	E_SUBSTRCP,
	E_STRCASECMP,
	E_REPLACEONE,
	E_REPLACEALL,
	E_REGEXMATCH,
	E_REGEXFIND,
	E_REGEXFINDALL,
	/* conversion (pipeline_expr_conv.c): args input, to, onError, onNull */
	E_CONVERT,
	E_TOINT,
	E_TOLONG,
	E_TODOUBLE,
	E_TODECIMAL,
	E_TOBOOL,
	E_TOSTRING,
	E_TOOBJECTID,
	E_TODATE,
	/* dates (pipeline_expr_date.c) */
	E_YEAR,
	E_MONTH,
	E_DAYOFMONTH,
	E_DAYOFWEEK,
	E_DAYOFYEAR,
	E_HOUR,
	E_MINUTE,
	E_SECOND,
	E_MILLISECOND,
	E_WEEK,
	E_ISOWEEK,
	E_ISOWEEKYEAR,
	E_ISODAYOFWEEK,
	E_DATETOSTRING,
	E_DATETOPARTS,
	E_DATEFROMSTRING,
	E_DATEFROMPARTS,
	E_DATEADD,
	E_DATESUBTRACT,
	E_DATEDIFF,
	E_DATETRUNC,
} ext_id;

/* The operator's name ("$round") for messages. */
const char *ext_name(const expr *x);

/* True when x's argument slot a was not given (a named argument left out). */
bool ext_absent(const expr *a);

/* Evaluate x's argument slot i (an absent one is missing: NULL) into *out (caller frees).
 * Errors: the argument's evaluation errors. */
int ext_arg(const expr *x, size_t i, const bson_t *root, docbuild_node **out, const ectx *e);

/* A value's MongoDB Value::toString form for messages (strings quoted, documents as
 * relaxed JSON), in buf (always NUL-terminated). Returns: buf. */
const char *ext_show(const docbuild_node *v, char *buf, size_t len);

/* The family evaluators: x->ext selects the operator. Errors: SDB_EINVAL with MongoDB's
 * code and message in e. */
int agg_str_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);
int agg_conv_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);
int agg_date_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e);

/* $toDate / $convert to date of a string: MongoDB's dateFromString without a format (ISO
 * 8601 dates "2018-03-20", date-times with 'T' or ' ', optional seconds, fraction, 'Z' or
 * a +hh[:]mm offset) into *ms. Returns: 0, or -1 with a reason in why (why may be NULL). */
int agg_date_parse_iso(const char *s, size_t len, int64_t *ms, char *why, size_t whylen);

/* A date's ISO form "2018-03-20T10:00:00.000Z" into buf (at least 32 bytes): MongoDB's
 * $toString of a date, for any int64 milliseconds (years past 9999 or before 0 printed as
 * they are). */
void agg_date_iso(int64_t ms, char *buf, size_t len);

#endif
