/* The conversion operators of the expression language (issue #20, pipeline_ext.h):
 * $convert {input, to, onError, onNull} and its shorthands $toInt, $toLong, $toDouble,
 * $toDecimal, $toBool, $toString, $toObjectId, $toDate, with MongoDB 6.0's conversion
 * table and its 241 ConversionFailure messages (expression.cpp ExpressionConvert). */
#include "storage/pipeline_ext.h"

#include <ctype.h>
#include <errno.h>

#define NOERR " in $convert with no onError value"

/* A value for a conversion failure message: numbers as MongoDB prints them. */
static const char *show_num(const docbuild_node *v, char *buf, size_t len)
{
	if (v->type == BSON_TYPE_DOUBLE) {
		double d = v->value.value.v_double;

		if (isnan(d)) {
			snprintf(buf, len, "nan");
		} else if (isinf(d)) {
			snprintf(buf, len, d > 0 ? "inf" : "-inf");
		} else {
			snprintf(buf, len, "%.17g", d);
		}
		return buf;
	}
	if (v->type == BSON_TYPE_DECIMAL128) {
		char tmp[BSON_DECIMAL128_STRING];

		bson_decimal128_to_string(&v->value.value.v_decimal128, tmp);
		snprintf(buf, len, "%s", tmp);
		return buf;
	}
	return ext_show(v, buf, len);
}

/* A numeric conversion of v refused: ConversionFailure with reason, the $convert suffix and
 * v as show_num prints it ("Conversion would overflow target type in $convert with no
 * onError value: 1e+300"). Returns: efail's code. */
static int num_refused(const docbuild_node *v, const char *reason, const ectx *e)
{
	char show[128];

	return efail(e, C_CONVERSION_FAILURE, "%s" NOERR ": %s", reason,
		     show_num(v, show, sizeof show));
}

/* NumberParser (base 10, no whitespace) of an integer: Errors: -1 with the reason. */
static int parse_int64(const char *s, size_t len, int64_t *out, const char **why)
{
	size_t i = 0;
	bool neg = false;
	uint64_t acc = 0;

	if (len == 0) {
		*why = "No digits";
		return -1;
	}
	if (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-';
		i = 1;
	}
	if (i == len) {
		*why = "No digits";
		return -1;
	}
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9') {
			*why = "Bad digit";
			return -1;
		}
		if (acc > (UINT64_MAX - 9) / 10) {
			*why = "Overflow";
			return -1;
		}
		acc = acc * 10 + (uint64_t)(s[i] - '0');
		if (acc > (uint64_t)INT64_MAX + 1) {
			*why = "Overflow";
			return -1;
		}
	}
	if (!neg && acc > (uint64_t)INT64_MAX) {
		*why = "Overflow";
		return -1;
	}
	*out = neg ? (int64_t)(0 - acc) : (int64_t)acc;
	return 0;
}

static int parse_double(const char *s, size_t len, double *out, const char **why)
{
	char buf[400];
	char *end;

	if (len == 0) {
		*why = "No digits";
		return -1;
	}
	if (isspace((unsigned char)s[0])) {
		*why = "Leading whitespace";
		return -1;
	}
	if (len >= sizeof buf || memchr(s, '\0', len) != NULL || memchr(s, 'x', len) != NULL ||
	    memchr(s, 'X', len) != NULL) {
		*why = "Did not consume whole string.";
		return -1;
	}
	memcpy(buf, s, len);
	buf[len] = '\0';
	errno = 0;
	*out = strtod(buf, &end);
	if (end != buf + len) {
		*why = "Did not consume whole string.";
		return -1;
	}
	if (errno == ERANGE && isinf(*out)) {
		*why = "Out of range";
		return -1;
	}
	return 0;
}

/* The target of 'to' (a type name or number) into *t. Errors: 2 / 9 as
 * ExpressionConvert::computeTargetType. */
static int target_type(const docbuild_node *to, int *t, const ectx *e)
{
	if (to->type == BSON_TYPE_UTF8) {
		if (sdb_bson_type_code(to->value.value.v_utf8.str, to->value.value.v_utf8.len, t)) {
			return 0;
		}
		return efail(e, C_BAD_VALUE, "Unknown type name: %.*s", (int)to->value.value.v_utf8.len,
			     to->value.value.v_utf8.str);
	}
	if (is_number(to)) {
		double d = num_double(to);

		if (d != floor(d)) {
			return efail(e, C_FAILED_TO_PARSE, "In $convert, numeric 'to' argument is not an integer");
		}
		if (d >= -1 && d <= 127 && sdb_bson_type_known((int)d)) {
			*t = (int)d;
			return 0;
		}
		return efail(e, C_FAILED_TO_PARSE,
			     "In $convert, numeric value for 'to' does not correspond to a BSON type: %g", d);
	}
	return efail(e, C_FAILED_TO_PARSE, "$convert's 'to' argument must be a string or number, but is %s",
		     type_name(to->type));
}

/* The name of the type numbered t as $type says it (-1: minKey). */
static const char *tname(int t)
{
	return type_name(t == -1 ? BSON_TYPE_MINKEY : (bson_type_t)t);
}

/* A double or decimal to an integer in [lo, hi]: NaN, infinity and overflow refused. */
static int float_to_int(const docbuild_node *v, int64_t lo, int64_t hi, int64_t *out, const ectx *e)
{
	if (v->type == BSON_TYPE_DOUBLE) {
		double d = v->value.value.v_double;

		if (isnan(d)) {
			return num_refused(v, "Attempt to convert NaN value to integer type", e);
		}
		if (isinf(d)) {
			return num_refused(v, "Attempt to convert infinity value to integer type",
					   e);
		}
		d = trunc(d);
		if (!(d >= (double)lo && d < (double)hi + 1.0)) {
			return num_refused(v, "Conversion would overflow target type", e);
		}
		*out = (int64_t)d;
		return 0;
	}
	{
		bson_decimal128_t d = v->value.value.v_decimal128;

		if (sdb_dec_is_nan(d)) {
			return num_refused(v, "Attempt to convert NaN value to integer type", e);
		}
		if (sdb_dec_is_inf(d)) {
			return num_refused(v, "Attempt to convert infinity value to integer type",
					   e);
		}
		if (!sdb_dec_to_int64_trunc(d, out) || *out < lo || *out > hi) {
			return num_refused(v, "Conversion would overflow target type", e);
		}
		return 0;
	}
}

static int unsupported(const docbuild_node *v, int t, const ectx *e)
{
	return efail(e, C_CONVERSION_FAILURE, "Unsupported conversion from %s to %s" NOERR,
		     type_name(v->type), tname(t));
}

static int bad_number(const docbuild_node *v, const char *why, const ectx *e)
{
	return efail(e, C_CONVERSION_FAILURE, "Failed to parse number '%.*s'" NOERR ": %s",
		     (int)(v->value.value.v_utf8.len > 200 ? 200 : v->value.value.v_utf8.len),
		     v->value.value.v_utf8.str, why);
}

static int to_integer(const docbuild_node *v, int t, docbuild_node **out, const ectx *e)
{
	int64_t lo = t == 16 ? INT32_MIN : INT64_MIN, hi = t == 16 ? INT32_MAX : INT64_MAX;
	int64_t r;
	const char *why;
	int rc;

	switch (v->type) {
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128:
		if ((rc = float_to_int(v, lo, hi, &r, e)) != 0) {
			return rc;
		}
		break;
	case BSON_TYPE_INT32:
		r = v->value.value.v_int32;
		break;
	case BSON_TYPE_INT64:
		r = v->value.value.v_int64;
		if (r < lo || r > hi) {
			return num_refused(v, "Conversion would overflow target type", e);
		}
		break;
	case BSON_TYPE_BOOL:
		r = v->value.value.v_bool;
		break;
	case BSON_TYPE_DATE_TIME:
		if (t == 16) {
			return unsupported(v, t, e);
		}
		r = v->value.value.v_datetime;
		break;
	case BSON_TYPE_UTF8:
		if (parse_int64(v->value.value.v_utf8.str, v->value.value.v_utf8.len, &r, &why) != 0) {
			return bad_number(v, why, e);
		}
		if (r < lo || r > hi) {
			return bad_number(v, "Overflow", e);
		}
		break;
	default:
		return unsupported(v, t, e);
	}
	*out = t == 16 ? v_int32((int32_t)r) : v_int64(r);
	return 0;
}

/* performConversion of a non-null input to target type t. */
static int convert(const docbuild_node *v, int t, docbuild_node **out, const ectx *e)
{
	char buf[64];
	const char *why;

	switch (t) {
	case 16:
	case 18:
		return to_integer(v, t, out, e);
	case 1: /* double */
		switch (v->type) {
		case BSON_TYPE_DOUBLE:
			*out = docbuild_clone(v);
			return 0;
		case BSON_TYPE_INT32:
		case BSON_TYPE_INT64:
			*out = v_double(num_double(v));
			return 0;
		case BSON_TYPE_DECIMAL128: {
			double d = sdb_dec_to_double(v->value.value.v_decimal128);

			if (isinf(d) && !sdb_dec_is_inf(v->value.value.v_decimal128)) {
				return num_refused(v, "Conversion would overflow target type", e);
			}
			*out = v_double(d);
			return 0;
		}
		case BSON_TYPE_BOOL:
			*out = v_double(v->value.value.v_bool ? 1 : 0);
			return 0;
		case BSON_TYPE_DATE_TIME:
			*out = v_double((double)v->value.value.v_datetime);
			return 0;
		case BSON_TYPE_UTF8: {
			double d;

			if (parse_double(v->value.value.v_utf8.str, v->value.value.v_utf8.len, &d, &why) != 0) {
				return bad_number(v, why, e);
			}
			*out = v_double(d);
			return 0;
		}
		default:
			return unsupported(v, t, e);
		}
	case 19: { /* decimal */
		bson_decimal128_t d;

		switch (v->type) {
		case BSON_TYPE_DECIMAL128:
		case BSON_TYPE_DOUBLE:
		case BSON_TYPE_INT32:
		case BSON_TYPE_INT64:
			(void)sdb_dec_from_value(&v->value, &d);
			break;
		case BSON_TYPE_BOOL:
			d = sdb_dec_from_int64(v->value.value.v_bool ? 1 : 0);
			break;
		case BSON_TYPE_DATE_TIME:
			d = sdb_dec_from_int64(v->value.value.v_datetime);
			break;
		case BSON_TYPE_UTF8: {
			char tmp[128];
			size_t l = v->value.value.v_utf8.len;

			if (l == 0 || l >= sizeof tmp || memchr(v->value.value.v_utf8.str, '\0', l) != NULL) {
				return bad_number(v, "Failed to parse string to decimal", e);
			}
			memcpy(tmp, v->value.value.v_utf8.str, l);
			tmp[l] = '\0';
			if (!bson_decimal128_from_string(tmp, &d)) {
				return bad_number(v, "Failed to parse string to decimal", e);
			}
			break;
		}
		default:
			return unsupported(v, t, e);
		}
		*out = v_decimal(d);
		return 0;
	}
	case 8: /* bool */
		switch (v->type) {
		case BSON_TYPE_BOOL:
			*out = docbuild_clone(v);
			return 0;
		case BSON_TYPE_INT32:
		case BSON_TYPE_INT64:
		case BSON_TYPE_DOUBLE:
			*out = v_bool(num_double(v) != 0);
			return 0;
		case BSON_TYPE_DECIMAL128:
			*out = v_bool(!sdb_dec_is_zero(v->value.value.v_decimal128));
			return 0;
		default:
			*out = v_bool(true);
			return 0;
		}
	case 2: /* string */
		switch (v->type) {
		case BSON_TYPE_UTF8:
			*out = docbuild_clone(v);
			return 0;
		case BSON_TYPE_BOOL:
			*out = v_string(v->value.value.v_bool ? "true" : "false",
					v->value.value.v_bool ? 4 : 5);
			return 0;
		case BSON_TYPE_OID:
			bson_oid_to_string(&v->value.value.v_oid, buf);
			break;
		case BSON_TYPE_DATE_TIME:
			agg_date_iso(v->value.value.v_datetime, buf, sizeof buf);
			break;
		case BSON_TYPE_INT32:
			snprintf(buf, sizeof buf, "%d", v->value.value.v_int32);
			break;
		case BSON_TYPE_INT64:
			snprintf(buf, sizeof buf, "%lld", (long long)v->value.value.v_int64);
			break;
		case BSON_TYPE_DECIMAL128:
			bson_decimal128_to_string(&v->value.value.v_decimal128, buf);
			break;
		case BSON_TYPE_DOUBLE: {
			double d = v->value.value.v_double;

			if (isnan(d)) {
				snprintf(buf, sizeof buf, "NaN");
			} else if (isinf(d)) {
				snprintf(buf, sizeof buf, d > 0 ? "Infinity" : "-Infinity");
			} else {
				/* the shortest representation that reads back as the same double */
				for (int prec = 15; prec <= 17; prec++) {
					snprintf(buf, sizeof buf, "%.*g", prec, d);
					if (strtod(buf, NULL) == d) {
						break;
					}
				}
			}
			break;
		}
		default:
			return unsupported(v, t, e);
		}
		*out = v_string(buf, strlen(buf));
		return 0;
	case 7: /* objectId */
		if (v->type == BSON_TYPE_OID) {
			*out = docbuild_clone(v);
			return 0;
		}
		if (v->type == BSON_TYPE_UTF8) {
			bson_value_t o = {0};
			size_t l = v->value.value.v_utf8.len;
			const char *s = v->value.value.v_utf8.str;

			if (l != 24) {
				return efail(e, C_CONVERSION_FAILURE,
					     "Failed to parse objectId '%.*s'" NOERR
					     ": Invalid string length for parsing to OID, expected 24 but found %zu",
					     (int)(l > 200 ? 200 : l), s, l);
			}
			for (size_t i = 0; i < 24; i++) {
				if (!isxdigit((unsigned char)s[i])) {
					return efail(e, C_CONVERSION_FAILURE,
						     "Failed to parse objectId '%.*s'" NOERR
						     ": Invalid character found in hex string: '%c'",
						     24, s, s[i] >= 32 && s[i] < 127 ? s[i] : '?');
				}
			}
			memcpy(buf, s, 24);
			buf[24] = '\0';
			o.value_type = BSON_TYPE_OID;
			bson_oid_init_from_string(&o.value.v_oid, buf);
			*out = v_scalar(&o);
			return 0;
		}
		return unsupported(v, t, e);
	case 9: { /* date */
		int64_t ms;

		switch (v->type) {
		case BSON_TYPE_DATE_TIME:
			*out = docbuild_clone(v);
			return 0;
		case BSON_TYPE_INT64:
			ms = v->value.value.v_int64;
			break;
		case BSON_TYPE_DOUBLE:
		case BSON_TYPE_DECIMAL128: {
			int rc = float_to_int(v, INT64_MIN, INT64_MAX, &ms, e);

			if (rc != 0) {
				return rc;
			}
			break;
		}
		case BSON_TYPE_OID:
			ms = (int64_t)bson_oid_get_time_t(&v->value.value.v_oid) * 1000;
			break;
		case BSON_TYPE_TIMESTAMP:
			ms = (int64_t)v->value.value.v_timestamp.timestamp * 1000;
			break;
		case BSON_TYPE_UTF8: {
			char why2[160];
			size_t l = v->value.value.v_utf8.len;

			if (agg_date_parse_iso(v->value.value.v_utf8.str, l, &ms, why2, sizeof why2) != 0) {
				return efail(e, C_CONVERSION_FAILURE, "Error parsing date string '%.*s'; %s",
					     (int)(l > 200 ? 200 : l), v->value.value.v_utf8.str, why2);
			}
			break;
		}
		default:
			return unsupported(v, t, e);
		}
		*out = v_date(ms);
		return 0;
	}
	default:
		return unsupported(v, t, e);
	}
}

int agg_conv_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *in = NULL, *to = NULL;
	int t = 0, rc;
	bool have_t = true;

	*out = NULL;
	switch (x->ext) {
	case E_TOINT: t = 16; break;
	case E_TOLONG: t = 18; break;
	case E_TODOUBLE: t = 1; break;
	case E_TODECIMAL: t = 19; break;
	case E_TOBOOL: t = 8; break;
	case E_TOSTRING: t = 2; break;
	case E_TOOBJECTID: t = 7; break;
	case E_TODATE: t = 9; break;
	default: break;
	}
	if (x->ext == E_CONVERT) {
		rc = ext_arg(x, 1, root, &to, e);
		if (rc == 0 && is_nullish(to)) {
			have_t = false;
		} else if (rc == 0) {
			rc = target_type(to, &t, e);
		}
		docbuild_free(to);
		if (rc != 0) {
			return rc;
		}
	}
	rc = ext_arg(x, 0, root, &in, e);
	if (rc != 0) {
		return rc;
	}
	if (is_nullish(in)) {
		docbuild_free(in);
		if (x->ext == E_CONVERT && !ext_absent(x->args[3])) {
			return ext_arg(x, 3, root, out, e);
		}
		*out = v_null();
		return 0;
	}
	if (!have_t) {
		docbuild_free(in);
		*out = v_null();
		return 0;
	}
	{
		/* a conversion failure goes to onError when there is one (the code is read from
		 * a context of our own: the caller's may not keep one) */
		int code = 0;
		ectx mine = *e;

		mine.code = &code;
		rc = convert(in, t, out, &mine);
		docbuild_free(in);
		if (rc != 0) {
			docbuild_free(*out);
			*out = NULL;
			if (code == C_CONVERSION_FAILURE && x->ext == E_CONVERT && !ext_absent(x->args[2])) {
				return ext_arg(x, 2, root, out, e);
			}
			if (e->code != NULL) {
				*e->code = code;
			}
		}
	}
	return rc;
}
