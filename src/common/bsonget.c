/* Range-checked numeric fields of a BSON command (see bsonget.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/bsonget.h"
#include "common/err.h"

/* 2^63 as a double: the first double above INT64_MAX (which a double cannot hold). */
#define TWO_POW_63 9223372036854775808.0

const char *sdb_bson_type_name(bson_type_t t)
{
	switch (t) {
	case BSON_TYPE_EOD: return "missing";
	case BSON_TYPE_DOUBLE: return "double";
	case BSON_TYPE_UTF8: return "string";
	case BSON_TYPE_DOCUMENT: return "object";
	case BSON_TYPE_ARRAY: return "array";
	case BSON_TYPE_BINARY: return "binData";
	case BSON_TYPE_UNDEFINED: return "undefined";
	case BSON_TYPE_OID: return "objectId";
	case BSON_TYPE_BOOL: return "bool";
	case BSON_TYPE_DATE_TIME: return "date";
	case BSON_TYPE_NULL: return "null";
	case BSON_TYPE_REGEX: return "regex";
	case BSON_TYPE_DBPOINTER: return "dbPointer";
	case BSON_TYPE_CODE: return "javascript";
	case BSON_TYPE_SYMBOL: return "symbol";
	case BSON_TYPE_CODEWSCOPE: return "javascriptWithScope";
	case BSON_TYPE_INT32: return "int";
	case BSON_TYPE_TIMESTAMP: return "timestamp";
	case BSON_TYPE_INT64: return "long";
	case BSON_TYPE_DECIMAL128: return "decimal";
	case BSON_TYPE_MINKEY: return "minKey";
	case BSON_TYPE_MAXKEY: return "maxKey";
	default: return "unknown";
	}
}

static int fail(sdb_bson_err *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(sdb_bson_err *e, int code, const char *fmt, ...)
{
	va_list ap;

	if (e != NULL) {
		e->code = code;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof e->msg, fmt, ap);
		va_end(ap);
	}
	return SDB_EINVAL;
}

bool sdb_bson_as_int64_exact(const bson_iter_t *it, int64_t *out)
{
	if (BSON_ITER_HOLDS_INT32(it)) {
		*out = bson_iter_int32(it);
		return true;
	}
	if (BSON_ITER_HOLDS_INT64(it)) {
		*out = bson_iter_int64(it);
		return true;
	}
	return false;
}

bool sdb_bson_as_int64(const bson_iter_t *it, int64_t *out)
{
	double d;

	switch (bson_iter_type(it)) {
	case BSON_TYPE_INT32:
		*out = bson_iter_int32(it);
		return true;
	case BSON_TYPE_INT64:
		*out = bson_iter_int64(it);
		return true;
	case BSON_TYPE_DOUBLE:
		d = bson_iter_double(it);
		if (!isfinite(d) || d != trunc(d) || d >= TWO_POW_63 || d < -TWO_POW_63)
			return false;
		*out = (int64_t)d;
		return true;
	default:
		return false;
	}
}

int sdb_bson_get_int64(const bson_iter_t *it, const char *field, int64_t lo, int64_t hi,
		       int64_t *out, sdb_bson_err *e)
{
	bson_type_t t = bson_iter_type(it);
	int64_t v;

	if (t != BSON_TYPE_INT32 && t != BSON_TYPE_INT64 && t != BSON_TYPE_DOUBLE)
		return fail(e, SDB_BSONGET_TYPE_MISMATCH,
			    "BSON field '%s' is the wrong type '%s', expected types '[long, int, "
			    "double]'",
			    field, sdb_bson_type_name(t));
	if (!sdb_bson_as_int64(it, &v))
		return fail(e, SDB_BSONGET_FAILED_TO_PARSE, "Expected an integer: %s: %g", field,
			    bson_iter_double(it));
	if (v < lo)
		return fail(e, SDB_BSONGET_BELOW_MIN,
			    "BSON field '%s' value must be >= %lld, actual value '%lld'", field,
			    (long long)lo, (long long)v);
	if (v > hi)
		return fail(e, SDB_BSONGET_BAD_VALUE,
			    "BSON field '%s' value must be <= %lld, actual value '%lld'", field,
			    (long long)hi, (long long)v);
	*out = v;
	return 0;
}

int sdb_bson_find_int64(const bson_t *doc, const char *name, int64_t lo, int64_t hi,
			int64_t def, int64_t *out, sdb_bson_err *e)
{
	bson_iter_t it;

	if (!bson_iter_init_find(&it, doc, name)) {
		*out = def;
		return 0;
	}
	return sdb_bson_get_int64(&it, name, lo, hi, out, e);
}

bool sdb_bson_iter_doc(const bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

static bool well_formed(const bson_t *doc, int level, int max_depth)
{
	bson_iter_t it;
	if (level > max_depth || !bson_iter_init(&it, doc))
		return false;
	while (bson_iter_next(&it)) {
		/* a field name must be UTF-8, as bson_validate's walk requires; libbson's check
		 * (~300 instructions a name) only for a name that is not ASCII */
		const char *key = bson_iter_key(&it);
		uint32_t klen = bson_iter_key_len(&it);
		bool ascii = true;
		for (uint32_t i = 0; i < klen && ascii; i++)
			ascii = (unsigned char)key[i] < 0x80;
		if (!ascii && !bson_utf8_validate(key, klen, false))
			return false;
		const uint8_t *data = NULL;
		uint32_t len = 0;
		bson_t sub;
		switch (bson_iter_type(&it)) {
		case BSON_TYPE_DOCUMENT:
			bson_iter_document(&it, &len, &data);
			break;
		case BSON_TYPE_ARRAY:
			bson_iter_array(&it, &len, &data);
			break;
		case BSON_TYPE_CODEWSCOPE: {
			/* the scope is a document too, and counts as a level of nesting (as in
			 * mongod's BSON validation): bson_validate recursed into a scope nested
			 * 100,000 deep without a limit and overflowed the loop thread's stack */
			uint32_t code_len = 0;
			bson_iter_codewscope(&it, &code_len, &len, &data);
			break;
		}
		default:
			continue;
		}
		if (data == NULL || !bson_init_static(&sub, data, len) ||
		    !well_formed(&sub, level + 1, max_depth))
			return false;
	}
	return it.err_off == 0;
}

bool sdb_bson_well_formed(const bson_t *doc, int max_depth)
{
	return well_formed(doc, 0, max_depth);
}
