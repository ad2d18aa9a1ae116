/* Range-checked numeric fields of a BSON command (see bsonget.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* A little-endian uint32 at p. */
static inline uint32_t le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof v);
	return BSON_UINT32_FROM_LE(v);
}

/* The walk of sdb_bson_well_formed over the raw bytes of a document d of len bytes whose
 * header (int32 length == len, len >= 5) and last byte (0) the caller has checked, as
 * bson_init_static does. Each element is checked exactly as libbson 1.23's bson_iter_next
 * (_bson_iter_next_internal) checks it before it moves on, in the same order, so a document
 * is accepted here exactly when iterating it with libbson reaches its end without an error
 * (tests/unit/test_common_bsonget.c compares the two on mutated documents); but without
 * libbson's per-element bookkeeping: a walk over libbson's iterator cost ~8,000
 * instructions per proxied point read (the client's command and the shard's reply), 11% of
 * the proxy's instructions (callgrind, issue #19). Embedded documents, arrays and
 * code-with-scope scopes are walked in turn, at most max_depth levels deep. */
static bool well_formed(const uint8_t *d, uint32_t len, int level, int max_depth)
{
	uint32_t off = 4;

	if (level > max_depth)
		return false;
	for (;;) {
		uint8_t type = d[off];
		uint32_t o = off + 1, next, l;
		const uint8_t *sub = NULL;
		uint32_t sublen = 0;

		/* the field name: up to its NUL; none before the document's last byte means the
		 * element is the terminator itself (libbson's iteration ends there cleanly) */
		uint8_t high = 0; /* the bits of the name's bytes, for an ASCII test */
		while (o < len && d[o] != 0)
			high |= d[o++];
		if (o >= len)
			return true;
		/* a field name must be UTF-8, as bson_validate's walk requires; libbson's check
		 * (~300 instructions a name) only for a name that is not ASCII */
		if ((high & 0x80) &&
		    !bson_utf8_validate((const char *)d + off + 1, o - off - 1, false))
			return false;
		o++; /* the value */
		switch (type) {
		case BSON_TYPE_DATE_TIME:
		case BSON_TYPE_DOUBLE:
		case BSON_TYPE_INT64:
		case BSON_TYPE_TIMESTAMP:
			next = o + 8;
			break;
		case BSON_TYPE_CODE:
		case BSON_TYPE_SYMBOL:
		case BSON_TYPE_UTF8:
			if (o + 4 >= len)
				return false;
			l = le32(d + o);
			if (l > len - (o + 4))
				return false;
			next = o + 4 + l;
			/* the length counts the NUL, which ends the string */
			if (l == 0 || next >= len || d[o + 4 + l - 1] != 0)
				return false;
			break;
		case BSON_TYPE_BINARY:
			if (o >= len - 4)
				return false;
			l = le32(d + o);
			if (l >= len - o)
				return false;
			if (d[o + 4] == BSON_SUBTYPE_BINARY_DEPRECATED) {
				/* subtype 2 repeats the length in its data; a data that cannot
				 * hold it would end past the document (refused below anyway) */
				if (l < 4 || o + 9 > len || le32(d + o + 5) + 4 != l)
					return false;
			}
			next = o + 5 + l;
			break;
		case BSON_TYPE_ARRAY:
		case BSON_TYPE_DOCUMENT:
			if (o >= len - 4)
				return false;
			l = le32(d + o);
			if (l > len || l > len - o)
				return false;
			next = o + l;
			sub = d + o;
			sublen = l;
			break;
		case BSON_TYPE_OID:
			next = o + 12;
			break;
		case BSON_TYPE_BOOL:
			if (o >= len || d[o] > 1)
				return false;
			next = o + 1;
			break;
		case BSON_TYPE_REGEX:
			/* the pattern and the options, each up to its NUL */
			while (o < len && d[o] != 0)
				o++;
			if (o >= len)
				return false;
			o++;
			while (o < len && d[o] != 0)
				o++;
			if (o >= len)
				return false;
			next = o + 1;
			break;
		case BSON_TYPE_DBPOINTER:
			if (o >= len - 4)
				return false;
			l = le32(d + o);
			if (l > len || l > len - o)
				return false;
			/* the namespace's NUL; past the document the element would end past it
			 * too (refused below) */
			if (o + l + 3 >= len || d[o + l + 3] != 0)
				return false;
			next = o + 4 + l + 12;
			break;
		case BSON_TYPE_CODEWSCOPE: {
			uint32_t code_len, scope_at;
			if (len < 19 || o >= len - 14)
				return false;
			l = le32(d + o);
			if (l < 14 || l >= len - o)
				return false;
			next = o + l;
			if (next >= len)
				return false;
			code_len = le32(d + o + 4);
			if (code_len >= len - o - 4 - 4)
				return false;
			scope_at = o + 4 + 4 + code_len;
			if (scope_at + 4 >= next)
				return false;
			/* the scope is a document too, and counts as a level of nesting (as in
			 * mongod's BSON validation): bson_validate recursed into a scope nested
			 * 100,000 deep without a limit and overflowed the loop thread's stack */
			sublen = le32(d + scope_at);
			if (scope_at + sublen != next)
				return false;
			sub = d + scope_at;
			break;
		}
		case BSON_TYPE_INT32:
			next = o + 4;
			break;
		case BSON_TYPE_DECIMAL128:
			next = o + 16;
			break;
		case BSON_TYPE_MAXKEY:
		case BSON_TYPE_MINKEY:
		case BSON_TYPE_NULL:
		case BSON_TYPE_UNDEFINED:
			next = o;
			break;
		default: /* an unknown type, or a terminator before the document's end */
			return false;
		}
		if (next >= len)
			return false;
		/* a nested document as bson_init_static takes one (its header is the length
		 * just read), then walked */
		if (sub != NULL &&
		    (sublen < 5 || sub[sublen - 1] != 0 || !well_formed(sub, sublen, level + 1, max_depth)))
			return false;
		off = next;
	}
}

bool sdb_bson_well_formed(const bson_t *doc, int max_depth)
{
	const uint8_t *d = bson_get_data(doc);

	/* bson_iter_init's checks of a document; a bson_t's own length, header and terminator
	 * are checked once more here, as a copy of one could be handed over */
	if (doc->len < 5 || le32(d) != doc->len || d[doc->len - 1] != 0)
		return false;
	return well_formed(d, doc->len, 0, max_depth);
}
