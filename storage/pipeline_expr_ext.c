/* The extension operators of the expression language (issue #20, pipeline_ext.h): their
 * table, their parsing (positional, named-argument and date-part forms, with MongoDB 6.0's
 * parse codes), the dispatch to the family evaluators, and the numeric operators $round,
 * $trunc, $exp, $ln, $log, $log10, $pow, $sqrt and $isNumber (expression.cpp's
 * evaluateRoundOrTrunc, ExpressionPow, ExpressionLn ...). */
#include "storage/pipeline_ext.h"

#include <float.h>
#include <math.h>

typedef enum { F_POS, F_NAMED, F_DATEPART } ext_form;

typedef struct {
	const char *name;
	ext_id id;
	ext_form form;
	int min, max;            /* F_POS argument counts */
	const char *keys[12];    /* F_NAMED slot names; the first nreq are required */
	int nreq;
	int obj_code, unk_code;  /* not an object / an unknown argument */
	int miss_code[4];        /* a required argument missing, per required slot */
	const char *obj_fmt;     /* args: name, found type */
	const char *unk_fmt;     /* args: name, key */
	const char *miss_fmt;    /* args: name, key */
} ext_op;

#define TRIM_SPEC                                                                            \
	F_NAMED, 0, 0, {"input", "chars"}, 1, 50696, 50694, {50695},                         \
		"%s only supports an object as an argument, found %s",                       \
		"%s found an unknown argument: %s", "%s requires an 'input' field"
#define REPLACE_SPEC                                                                         \
	F_NAMED, 0, 0, {"input", "find", "replacement"}, 3, 51751, 51750,                    \
		{51749, 51748, 51747}, "%s requires an object as an argument, found: %s",     \
		"%s found an unknown argument: %s", "%s requires '%s' to be specified"
#define REGEX_SPEC                                                                           \
	F_NAMED, 0, 0, {"input", "regex", "options"}, 2, 51103, 31024, {31022, 31023},       \
		"%s expects an object of named arguments but found: %s",                     \
		"%s found an unknown argument: %s", "%s requires '%s' parameter"
#define DATEARITH_SPEC                                                                       \
	F_NAMED, 0, 0, {"startDate", "unit", "amount", "timezone"}, 3, 5166400, 5166401,      \
		{5166402, 5166402, 5166402}, "%s expects an object as its argument",          \
		"Unrecognized argument to %s: %s",                                           \
		"%s requires startDate, unit, and amount to be present"
#define DATEPART F_DATEPART, 1, 1, {"date", "timezone"}, 1, 0, 0, {0}, NULL, NULL, NULL
#define POS(a, b) F_POS, a, b, {NULL}, 0, 0, 0, {0}, NULL, NULL, NULL

static const ext_op ext_ops[] = {
	{"$round", E_ROUND, POS(1, 2)},
	{"$trunc", E_TRUNC, POS(1, 2)},
	{"$exp", E_EXP, POS(1, 1)},
	{"$ln", E_LN, POS(1, 1)},
	{"$log", E_LOG, POS(2, 2)},
	{"$log10", E_LOG10, POS(1, 1)},
	{"$pow", E_POW, POS(2, 2)},
	{"$sqrt", E_SQRT, POS(1, 1)},
	{"$isNumber", E_ISNUMBER, POS(1, 1)},
	{"$split", E_SPLIT, POS(2, 2)},
	{"$trim", E_TRIM, TRIM_SPEC},
	{"$ltrim", E_LTRIM, TRIM_SPEC},
	{"$rtrim", E_RTRIM, TRIM_SPEC},
	{"$indexOfBytes", E_INDEXOFBYTES, POS(2, 4)},
	{"$indexOfCP", E_INDEXOFCP, POS(2, 4)},
	{"$strLenCP", E_STRLENCP, POS(1, 1)},
	{"$substrCP", E_SUBSTRCP, POS(3, 3)},
	{"$strcasecmp", E_STRCASECMP, POS(2, 2)},
	{"$replaceOne", E_REPLACEONE, REPLACE_SPEC},
	{"$replaceAll", E_REPLACEALL, REPLACE_SPEC},
	{"$regexMatch", E_REGEXMATCH, REGEX_SPEC},
	{"$regexFind", E_REGEXFIND, REGEX_SPEC},
	{"$regexFindAll", E_REGEXFINDALL, REGEX_SPEC},
	{"$convert", E_CONVERT, F_NAMED, 0, 0, {"input", "to", "onError", "onNull"}, 2,
	 C_FAILED_TO_PARSE, C_FAILED_TO_PARSE, {C_FAILED_TO_PARSE, C_FAILED_TO_PARSE},
	 "%s expects an object of named arguments but found: %s",
	 "%s found an unknown argument: %s", "Missing '%2$s' parameter to %1$s"},
	{"$toInt", E_TOINT, POS(1, 1)},
	{"$toLong", E_TOLONG, POS(1, 1)},
	{"$toDouble", E_TODOUBLE, POS(1, 1)},
	{"$toDecimal", E_TODECIMAL, POS(1, 1)},
	{"$toBool", E_TOBOOL, POS(1, 1)},
	{"$toString", E_TOSTRING, POS(1, 1)},
	{"$toObjectId", E_TOOBJECTID, POS(1, 1)},
	{"$toDate", E_TODATE, POS(1, 1)},
	{"$year", E_YEAR, DATEPART},
	{"$month", E_MONTH, DATEPART},
	{"$dayOfMonth", E_DAYOFMONTH, DATEPART},
	{"$dayOfWeek", E_DAYOFWEEK, DATEPART},
	{"$dayOfYear", E_DAYOFYEAR, DATEPART},
	{"$hour", E_HOUR, DATEPART},
	{"$minute", E_MINUTE, DATEPART},
	{"$second", E_SECOND, DATEPART},
	{"$millisecond", E_MILLISECOND, DATEPART},
	{"$week", E_WEEK, DATEPART},
	{"$isoWeek", E_ISOWEEK, DATEPART},
	{"$isoWeekYear", E_ISOWEEKYEAR, DATEPART},
	{"$isoDayOfWeek", E_ISODAYOFWEEK, DATEPART},
	{"$dateToString", E_DATETOSTRING, F_NAMED, 0, 0, {"date", "format", "timezone", "onNull"},
	 1, 18629, 18534, {18628}, "%s only supports an object as its argument",
	 "Unrecognized argument to %s: %s", "Missing '%2$s' parameter to %1$s"},
	{"$dateFromParts", E_DATEFROMPARTS, F_NAMED, 0, 0,
	 {"year", "month", "day", "hour", "minute", "second", "millisecond", "isoWeekYear",
	  "isoWeek", "isoDayOfWeek", "timezone"},
	 0, 40519, 40518, {0}, "%s only supports an object as its argument",
	 "Unrecognized argument to %s: %s", NULL},
	{"$dateFromString", E_DATEFROMSTRING, F_NAMED, 0, 0,
	 {"dateString", "format", "timezone", "onError", "onNull"}, 1, 40540, 40541, {40542},
	 "%s only supports an object as an argument, found: %s", "Unrecognized argument to %s: %s",
	 "Missing '%2$s' parameter to %1$s"},
	{"$dateAdd", E_DATEADD, DATEARITH_SPEC},
	{"$dateSubtract", E_DATESUBTRACT, DATEARITH_SPEC},
	{"$dateDiff", E_DATEDIFF, F_NAMED, 0, 0,
	 {"startDate", "endDate", "unit", "timezone", "startOfWeek"}, 3, 5166301, 5166302,
	 {5166303, 5166304, 5166305}, "%s only supports an object as its argument",
	 "Unrecognized argument to %s: %s", "Missing '%2$s' parameter to %1$s"},
	{"$dateTrunc", E_DATETRUNC, F_NAMED, 0, 0,
	 {"date", "unit", "binSize", "timezone", "startOfWeek"}, 2, 5439007, 5439008,
	 {5439009, 5439010}, "%s only supports an object as its argument",
	 "Unrecognized argument to %s: %s", "Missing '%2$s' parameter to %1$s"},
	{"$dateToParts", E_DATETOPARTS, F_NAMED, 0, 0, {"date", "timezone", "iso8601"}, 1, 40524,
	 40520, {40522}, "%s only supports an object as its argument",
	 "Unrecognized argument to %s: %s", "Missing '%2$s' parameter to %1$s"},
};

const char *ext_name(const expr *x)
{
	for (size_t i = 0; i < sizeof ext_ops / sizeof ext_ops[0]; i++) {
		if ((int)ext_ops[i].id == x->ext) {
			return ext_ops[i].name;
		}
	}
	return "?";
}

bool ext_absent(const expr *a)
{
	return a->kind == X_LIT && a->lit == NULL;
}

static expr *absent_slot(void)
{
	expr *a = sdb_calloc(1, sizeof *a);

	a->kind = X_LIT;
	return a;
}

static void push_arg(expr *x, expr *a)
{
	x->args = sdb_realloc(x->args, (x->n + 1) * sizeof *x->args);
	x->args[x->n++] = a;
}

int ext_arg(const expr *x, size_t i, const bson_t *root, docbuild_node **out, const ectx *e)
{
	*out = NULL;
	if (i >= x->n || ext_absent(x->args[i])) {
		return 0;
	}
	return agg_expr_eval(x->args[i], root, out, e);
}

const char *ext_show(const docbuild_node *v, char *buf, size_t len)
{
	bson_t b = BSON_INITIALIZER;
	char *json;

	if (v == NULL) {
		snprintf(buf, len, "MISSING");
		return buf;
	}
	if (v->type == BSON_TYPE_UTF8) {
		snprintf(buf, len, "\"%.*s\"", (int)v->value.value.v_utf8.len, v->value.value.v_utf8.str);
		return buf;
	}
	docbuild_append(&b, "v", 1, v);
	json = bson_as_relaxed_extended_json(&b, NULL);
	/* { "v" : X } -> X */
	if (json != NULL && strlen(json) > 10) {
		snprintf(buf, len, "%.*s", (int)(strlen(json) - 10), json + 8);
	} else {
		snprintf(buf, len, "?");
	}
	bson_free(json);
	bson_destroy(&b);
	return buf;
}

/* The named-argument form: arg must be an object of op's keys, each at most once (a repeat
 * replaces, as MongoDB's parsers keep the last). */
static int parse_named(const ext_op *op, const bson_iter_t *arg, expr *x, const ectx *e)
{
	size_t nkeys = 0;
	bson_iter_t sub;
	int rc = 0;

	while (nkeys < 12 && op->keys[nkeys] != NULL) {
		nkeys++;
	}
	for (size_t i = 0; i < nkeys; i++) {
		push_arg(x, absent_slot());
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, op->obj_code, op->obj_fmt, op->name, type_name(bson_iter_type(arg)));
	}
	bson_iter_recurse(arg, &sub);
	while (rc == 0 && bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		size_t slot = nkeys;
		expr *a = NULL;

		for (size_t i = 0; i < nkeys; i++) {
			if (strcmp(op->keys[i], k) == 0) {
				slot = i;
			}
		}
		if (slot == nkeys) {
			return efail(e, op->unk_code, op->unk_fmt, op->name, k);
		}
		rc = agg_expr_parse(&sub, &a, e);
		agg_expr_free(x->args[slot]);
		x->args[slot] = a != NULL ? a : absent_slot();
	}
	for (int i = 0; rc == 0 && i < op->nreq; i++) {
		if (ext_absent(x->args[i])) {
			return efail(e, op->miss_code[i], op->miss_fmt, op->name, op->keys[i]);
		}
	}
	return rc;
}

/* $year ... $isoDayOfWeek: an expression, [expression], or {date, timezone}
 * (DateExpressionAcceptingTimeZone::parse). */
static int parse_datepart(const ext_op *op, const bson_iter_t *arg, expr *x, const ectx *e)
{
	bson_iter_t sub;
	expr *a = NULL;
	int rc;

	if (BSON_ITER_HOLDS_DOCUMENT(arg)) {
		bson_iter_recurse(arg, &sub);
		if (bson_iter_next(&sub) && bson_iter_key(&sub)[0] != '$') {
			bson_iter_t k;
			bson_t b;
			uint32_t len;
			const uint8_t *data;

			push_arg(x, absent_slot());
			push_arg(x, absent_slot());
			bson_iter_recurse(arg, &k);
			rc = 0;
			while (rc == 0 && bson_iter_next(&k)) {
				int slot = strcmp(bson_iter_key(&k), "date") == 0       ? 0
					   : strcmp(bson_iter_key(&k), "timezone") == 0 ? 1
											: -1;
				if (slot < 0) {
					return efail(e, 40535, "unrecognized option to %s: \"%s\"", op->name,
						     bson_iter_key(&k));
				}
				a = NULL;
				rc = agg_expr_parse(&k, &a, e);
				agg_expr_free(x->args[slot]);
				x->args[slot] = a != NULL ? a : absent_slot();
			}
			if (rc == 0 && ext_absent(x->args[0])) {
				char *json;

				bson_iter_document(arg, &len, &data);
				bson_init_static(&b, data, len);
				json = bson_as_relaxed_extended_json(&b, NULL);
				rc = efail(e, 40539, "missing 'date' argument to %s, provided: %s", op->name,
					   json != NULL ? json : "{}");
				bson_free(json);
			}
			return rc;
		}
	}
	if (BSON_ITER_HOLDS_ARRAY(arg)) {
		size_t n = 0;

		bson_iter_recurse(arg, &sub);
		while (bson_iter_next(&sub)) {
			n++;
		}
		if (n != 1) {
			return efail(e, 40536, "%s accepts exactly one argument if given an array, but was given %zu",
				     op->name, n);
		}
		bson_iter_recurse(arg, &sub);
		bson_iter_next(&sub);
		rc = agg_expr_parse(&sub, &a, e);
	} else {
		rc = agg_expr_parse(arg, &a, e);
	}
	push_arg(x, a != NULL ? a : absent_slot());
	push_arg(x, absent_slot());
	return rc;
}

int agg_ext_parse(const char *name, const bson_iter_t *arg, expr *x, const ectx *e)
{
	const ext_op *op = NULL;
	int rc = 0;

	for (size_t i = 0; i < sizeof ext_ops / sizeof ext_ops[0]; i++) {
		if (strcmp(ext_ops[i].name, name) == 0) {
			op = &ext_ops[i];
		}
	}
	if (op == NULL) {
		return 1;
	}
	x->op = OP_EXT;
	x->ext = (int)op->id;
	if (op->form == F_NAMED) {
		rc = parse_named(op, arg, x, e);
		if (rc == 0 && op->id == E_DATEFROMPARTS) {
			/* slots 0-2 year month day, 7-9 isoWeekYear isoWeek isoDayOfWeek */
			bool natural = !ext_absent(x->args[0]) || !ext_absent(x->args[1]) ||
				       !ext_absent(x->args[2]);
			bool iso = !ext_absent(x->args[7]) || !ext_absent(x->args[8]) ||
				   !ext_absent(x->args[9]);

			if (natural && iso) {
				return efail(e, 40489,
					     "$dateFromParts does not allow mixing natural dates with ISO dates");
			}
			if (ext_absent(x->args[0]) && ext_absent(x->args[7])) {
				return efail(e, 40516,
					     "$dateFromParts requires either 'year' or 'isoWeekYear' to be present");
			}
		}
		return rc;
	}
	if (op->form == F_DATEPART) {
		return parse_datepart(op, arg, x, e);
	}
	if (BSON_ITER_HOLDS_ARRAY(arg)) {
		bson_iter_t sub;

		bson_iter_recurse(arg, &sub);
		while (rc == 0 && bson_iter_next(&sub)) {
			expr *a = NULL;

			rc = agg_expr_parse(&sub, &a, e);
			push_arg(x, a != NULL ? a : absent_slot());
		}
	} else {
		expr *a = NULL;

		rc = agg_expr_parse(arg, &a, e);
		push_arg(x, a != NULL ? a : absent_slot());
	}
	if (rc != 0) {
		return rc;
	}
	if ((int)x->n < op->min || (int)x->n > op->max) {
		if (op->min == op->max) {
			return efail(e, 16020, "Expression %s takes exactly %d arguments. %zu were passed in.",
				     name, op->min, x->n);
		}
		return efail(e, 28667,
			     "Expression %s takes at least %d arguments, and at most %d, but %zu were passed in.",
			     name, op->min, op->max, x->n);
	}
	return 0;
}

/* ---- numeric ---------------------------------------------------------------------- */

/* evaluateRoundOrTrunc (expression.cpp): place in [-20, 100]; decimals quantized exactly,
 * doubles through Decimal128(d, 34 digits), integers only for a negative place. */
static int eval_round(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = ext_name(x);
	bool trunc = x->ext == E_TRUNC;
	int64_t place = 0;

	if (is_nullish(v[0])) {
		*out = v_null();
		return 0;
	}
	if (!is_number(v[0])) {
		return efail(e, 51081, "%s only supports numeric types, not %s", name,
			     type_name(v[0]->type));
	}
	if (x->n > 1) {
		double d;

		if (is_nullish(v[1])) {
			*out = v_null();
			return 0;
		}
		if (!is_number(v[1])) {
			return efail(e, 16004, "can't convert from BSON type %s to long",
				     type_name(v[1]->type));
		}
		d = num_double(v[1]);
		if (!(d == floor(d) && fabs(d) < 9.2e18)) {
			return efail(e, 51082, "precision argument to  %s must be a integral value", name);
		}
		place = (int64_t)d;
		if (place < -20 || place > 100) {
			return efail(e, 51083, "cannot apply %s with precision value %lld value must be in [-20, 100]",
				     name, (long long)place);
		}
	}
	switch (v[0]->type) {
	case BSON_TYPE_DECIMAL128: {
		bson_decimal128_t d = v[0]->value.value.v_decimal128;

		*out = sdb_dec_is_inf(d) ? docbuild_clone(v[0])
					 : v_decimal(sdb_dec_quantize(d, (int)-place, trunc));
		return 0;
	}
	case BSON_TYPE_DOUBLE: {
		double dv = v[0]->value.value.v_double;
		bson_decimal128_t d;

		if (isinf(dv)) {
			*out = docbuild_clone(v[0]);
			return 0;
		}
		d = sdb_dec_from_double(dv, false);
		*out = v_double(sdb_dec_to_double(sdb_dec_quantize(d, (int)-place, trunc)));
		return 0;
	}
	default: {
		int64_t i = v[0]->type == BSON_TYPE_INT64 ? v[0]->value.value.v_int64
							  : v[0]->value.value.v_int32;
		bson_decimal128_t q;
		int64_t r;

		if (place >= 0) {
			*out = docbuild_clone(v[0]);
			return 0;
		}
		q = sdb_dec_quantize(sdb_dec_from_int64(i), (int)-place, trunc);
		if (sdb_dec_is_nan(q) || !sdb_dec_to_int64_trunc(q, &r)) {
			return efail(e, 51080, "invalid conversion from Decimal128 result in %s resulting from arguments: [%lld, %lld]",
				     name, (long long)i, (long long)place);
		}
		*out = v[0]->type == BSON_TYPE_INT64 || r > INT32_MAX || r < INT32_MIN ? v_int64(r)
											: v_int32((int32_t)r);
		return 0;
	}
	}
}

/* The operators computed by Intel's decimal transcendental functions in mongod ($exp,
 * $ln, $log, $log10, $pow, $sqrt of a Decimal128) are refused: libgcc has no exact
 * decimal128 exp/log/pow/sqrt, and a double approximation would not give MongoDB's 34
 * digits. */
static int dec_refused(const char *name, const ectx *e)
{
	return efail(e, C_NOT_IMPLEMENTED,
		     "%s of a Decimal128 value is not supported by stripedb (convert it with "
		     "$toDouble first)",
		     name);
}

/* Whether base^exp (integers, exp in [0, 63]) fits an int64 (ExpressionPow). */
static bool pow_fits(int64_t base, int64_t exp, int64_t *res)
{
	int64_t r = 1;

	for (int64_t i = 0; i < exp; i++) {
		if (__builtin_mul_overflow(r, base, &r)) {
			return false;
		}
	}
	*res = r;
	return true;
}

static int eval_pow(docbuild_node **v, docbuild_node **out, const ectx *e)
{
	double b, x;

	if (is_nullish(v[0]) || is_nullish(v[1])) {
		*out = v_null();
		return 0;
	}
	if (!is_number(v[0])) {
		return efail(e, 28762, "$pow's base must be numeric, not %s", type_name(v[0]->type));
	}
	if (!is_number(v[1])) {
		return efail(e, 28763, "$pow's exponent must be numeric, not %s", type_name(v[1]->type));
	}
	if (v[0]->type == BSON_TYPE_DECIMAL128 || v[1]->type == BSON_TYPE_DECIMAL128) {
		bson_decimal128_t bd, xd;

		(void)sdb_dec_from_value(&v[0]->value, &bd);
		(void)sdb_dec_from_value(&v[1]->value, &xd);
		if (sdb_dec_is_zero(bd) && (xd.high >> 63) != 0 && !sdb_dec_is_nan(xd)) {
			return efail(e, 28764, "$pow cannot take a base of 0 and a negative exponent");
		}
		return dec_refused("$pow", e);
	}
	b = num_double(v[0]);
	x = num_double(v[1]);
	if (b == 0 && x < 0) {
		return efail(e, 28764, "$pow cannot take a base of 0 and a negative exponent");
	}
	if (v[0]->type == BSON_TYPE_DOUBLE || v[1]->type == BSON_TYPE_DOUBLE) {
		*out = v_double(pow(b, x));
		return 0;
	}
	{
		bool is_long = v[0]->type == BSON_TYPE_INT64 || v[1]->type == BSON_TYPE_INT64;
		int64_t bl = v[0]->type == BSON_TYPE_INT64 ? v[0]->value.value.v_int64
							   : v[0]->value.value.v_int32;
		int64_t xl = v[1]->type == BSON_TYPE_INT64 ? v[1]->value.value.v_int64
							   : v[1]->value.value.v_int32;
		int64_t r = 0;

		if (bl == 0) {
			r = xl == 0 ? 1 : 0;
		} else if (bl == 1) {
			r = 1;
		} else if (bl == -1) {
			r = xl % 2 == 0 ? 1 : -1;
		} else if (xl > 63 || xl < 0 || !pow_fits(bl, xl, &r)) {
			*out = v_double(pow((double)bl, (double)xl));
			return 0;
		}
		*out = is_long || r > INT32_MAX || r < INT32_MIN ? v_int64(r) : v_int32((int32_t)r);
		return 0;
	}
}

static int eval_num(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = ext_name(x);
	double d;

	switch (x->ext) {
	case E_ROUND:
	case E_TRUNC:
		return eval_round(x, v, out, e);
	case E_ISNUMBER:
		*out = v_bool(is_number(v[0]));
		return 0;
	case E_POW:
		return eval_pow(v, out, e);
	case E_LOG: {
		double b;

		if (is_nullish(v[0]) || is_nullish(v[1])) {
			*out = v_null();
			return 0;
		}
		if (!is_number(v[0])) {
			return efail(e, 28756, "$log's argument must be numeric, not %s",
				     type_name(v[0]->type));
		}
		if (!is_number(v[1])) {
			return efail(e, 28757, "$log's base must be numeric, not %s", type_name(v[1]->type));
		}
		d = num_double(v[0]);
		b = num_double(v[1]);
		if (!(d > 0 || isnan(d))) {
			return efail(e, 28758, "$log's argument must be a positive number, but is %g", d);
		}
		if (!((b > 0 && b != 1) || isnan(b))) {
			return efail(e, 28759, "$log's base must be a positive number not equal to 1, but is %g",
				     b);
		}
		if (v[0]->type == BSON_TYPE_DECIMAL128 || v[1]->type == BSON_TYPE_DECIMAL128) {
			return dec_refused(name, e);
		}
		*out = v_double(log(d) / log(b));
		return 0;
	}
	default:
		break;
	}
	/* one numeric argument: evaluateSingleNumericArg */
	if (is_nullish(v[0])) {
		*out = v_null();
		return 0;
	}
	if (!is_number(v[0])) {
		return efail(e, 28765, "%s only supports numeric types, not %s", name,
			     type_name(v[0]->type));
	}
	d = num_double(v[0]);
	switch (x->ext) {
	case E_EXP:
		if (v[0]->type == BSON_TYPE_DECIMAL128) {
			return dec_refused(name, e);
		}
		*out = v_double(exp(d));
		return 0;
	case E_LN:
	case E_LOG10:
		if (!(d > 0 || isnan(d))) {
			return efail(e, x->ext == E_LN ? 28766 : 28761,
				     "%s's argument must be a positive number, but is %g", name, d);
		}
		if (v[0]->type == BSON_TYPE_DECIMAL128) {
			return dec_refused(name, e);
		}
		*out = v_double(x->ext == E_LN ? log(d) : log10(d));
		return 0;
	case E_SQRT:
		if (d < 0) {
			return efail(e, 28714, "$sqrt's argument must be greater than or equal to 0");
		}
		if (v[0]->type == BSON_TYPE_DECIMAL128) {
			if (sdb_dec_is_nan(v[0]->value.value.v_decimal128)) {
				*out = docbuild_clone(v[0]);
				return 0;
			}
			return dec_refused(name, e);
		}
		*out = v_double(sqrt(d));
		return 0;
	default:
		return efail(e, C_INTERNAL, "unhandled expression %s", name);
	}
}

int agg_ext_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *v[4] = {NULL, NULL, NULL, NULL};
	int rc = 0;

	*out = NULL;
	if (x->ext >= E_SPLIT && x->ext <= E_REGEXFINDALL) {
		return agg_str_eval(x, root, out, e);
	}
	if (x->ext >= E_CONVERT && x->ext <= E_TODATE) {
		return agg_conv_eval(x, root, out, e);
	}
	if (x->ext >= E_YEAR) {
		return agg_date_eval(x, root, out, e);
	}
	for (size_t i = 0; i < x->n && i < 4 && rc == 0; i++) {
		rc = ext_arg(x, i, root, &v[i], e);
	}
	if (rc == 0) {
		rc = eval_num(x, v, out, e);
	}
	for (size_t i = 0; i < 4; i++) {
		docbuild_free(v[i]);
	}
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}
