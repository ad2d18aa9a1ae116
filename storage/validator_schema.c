/* $jsonSchema of document validators (issue #20; split from validator.c): the check of a
 * schema when a validator is built (vd_js_check: MongoDB's parser codes) and its
 * evaluation against a document (vd_js_eval: the failing rules in MongoDB 5.0's errInfo
 * shape). Internal to the validator: storage/validator_int.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/bsonval.h"
#include "common/err.h"
#include "storage/decimal.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/validator_int.h"

/* ------------------------------------------------------------------ $jsonSchema: types */

static const struct {
	const char *name;
	int code;
} bson_aliases[] = {
	{"double", 1},	    {"string", 2},     {"object", 3},	   {"array", 4},
	{"binData", 5},	    {"undefined", 6},  {"objectId", 7},	   {"bool", 8},
	{"date", 9},	    {"null", 10},      {"regex", 11},	   {"dbPointer", 12},
	{"javascript", 13}, {"symbol", 14},    {"javascriptWithScope", 15},
	{"int", 16},	    {"timestamp", 17}, {"long", 18},	   {"decimal", 19},
	{"minKey", 255},    {"maxKey", 127},
};

/* Does type t belong to the alias name (json: the `type` keyword's JSON aliases)? -1 when
 * the alias is unknown. */
static int alias_has(const char *name, bool json, bson_type_t t)
{
	if (json) {
		if (strcmp(name, "object") == 0)
			return t == BSON_TYPE_DOCUMENT;
		if (strcmp(name, "array") == 0)
			return t == BSON_TYPE_ARRAY;
		if (strcmp(name, "number") == 0)
			return vd_is_num(t);
		if (strcmp(name, "boolean") == 0)
			return t == BSON_TYPE_BOOL;
		if (strcmp(name, "string") == 0)
			return t == BSON_TYPE_UTF8;
		if (strcmp(name, "null") == 0)
			return t == BSON_TYPE_NULL;
		return -1;
	}
	if (strcmp(name, "number") == 0)
		return vd_is_num(t);
	for (size_t i = 0; i < sizeof bson_aliases / sizeof bson_aliases[0]; i++)
		if (strcmp(name, bson_aliases[i].name) == 0)
			return (int)t == bson_aliases[i].code;
	return -1;
}

static bool type_ok(const bson_iter_t *spec, bool json, bson_type_t t)
{
	bson_iter_t a;

	if (BSON_ITER_HOLDS_UTF8(spec))
		return alias_has(bson_iter_utf8(spec, NULL), json, t) == 1;
	if (!bson_iter_recurse(spec, &a))
		return false;
	while (bson_iter_next(&a))
		if (BSON_ITER_HOLDS_UTF8(&a) && alias_has(bson_iter_utf8(&a, NULL), json, t) == 1)
			return true;
	return false;
}

/* ------------------------------------------------------------------ $jsonSchema: parse check */


static int check_type_spec(const bson_iter_t *it, bool json, int *code, char *err,
			   size_t errlen)
{
	const char *kw = bson_iter_key(it);
	bson_iter_t a;
	int n = 0;

	if (BSON_ITER_HOLDS_UTF8(it)) {
		const char *s = bson_iter_utf8(it, NULL);
		if (strcmp(s, "integer") == 0)
			return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "$jsonSchema type 'integer' is not currently supported.");
		if (alias_has(s, json, BSON_TYPE_EOD) < 0)
			return vd_failf(code, C_BAD_VALUE, err, errlen, "Unknown type name alias: %s",
				     s);
		return 0;
	}
	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be either a string or an array of "
			     "strings",
			     kw);
	while (bson_iter_next(&a)) {
		if (!BSON_ITER_HOLDS_UTF8(&a))
			return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' array elements must be strings", kw);
		const char *s = bson_iter_utf8(&a, NULL);
		if (strcmp(s, "integer") == 0)
			return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "$jsonSchema type 'integer' is not currently supported.");
		if (alias_has(s, json, BSON_TYPE_EOD) < 0)
			return vd_failf(code, C_BAD_VALUE, err, errlen, "Unknown type name alias: %s",
				     s);
		n++;
	}
	if (n == 0)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' must name at least one type", kw);
	return 0;
}

static int check_len(const bson_iter_t *it, int *code, char *err, size_t errlen)
{
	if (!vd_is_num(bson_iter_type(it)))
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen, "Expected a number in: %s",
			     bson_iter_key(it));
	double d = vd_num_of(it);
	if (d < 0)
		return vd_failf(code, C_BAD_VALUE, err, errlen, "Expected a positive number in: %s",
			     bson_iter_key(it));
	if (d != floor(d))
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "Expected an integer in: %s", bson_iter_key(it));
	return 0;
}

static int check_nested(const bson_iter_t *it, const char *what, int depth, int *code,
			char *err, size_t errlen)
{
	bson_t sub;

	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !vd_sub_static(it, &sub))
		return vd_failf(code, C_TYPE_MISMATCH, err, errlen, "%s must be an object", what);
	return vd_js_check(&sub, depth + 1, code, err, errlen);
}

static int check_schema_list(const bson_iter_t *it, int depth, int *code, char *err,
			     size_t errlen)
{
	const char *kw = bson_iter_key(it);
	bson_iter_t a;
	int n = 0, rc;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be an array", kw);
	while (bson_iter_next(&a)) {
		char what[96];
		n++;
		if (!BSON_ITER_HOLDS_DOCUMENT(&a))
			return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' must be an array of objects, but "
				     "found an element of type %s",
				     kw, sdb_bson_type_name(bson_iter_type(&a)));
		snprintf(what, sizeof what, "$jsonSchema keyword '%s'", kw);
		if ((rc = check_nested(&a, what, depth, code, err, errlen)) != 0)
			return rc;
	}
	if (n == 0)
		return vd_failf(code, C_BAD_VALUE, err, errlen,
			     "$jsonSchema keyword '%s' must be a non-empty array", kw);
	return 0;
}

static int check_unique_array(const bson_iter_t *it, const char *kw, bool strings, int *code,
			      char *err, size_t errlen)
{
	bson_iter_t a;
	size_t n = 0;
	bool dup;

	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
			     "$jsonSchema keyword '%s' must be an array", kw);
	while (bson_iter_next(&a))
		if (strings && !BSON_ITER_HOLDS_UTF8(&a))
			return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
				     "$jsonSchema keyword '%s' must contain only strings", kw);
	dup = vd_array_has_duplicate(it, NULL, &n);
	if (dup)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' array cannot contain duplicate values", kw);
	if (n == 0)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword '%s' cannot be an empty array", kw);
	return 0;
}

static int check_regex(const char *pat, int *code, char *err, size_t errlen)
{
	char msg[256];
	pcre2_code *re = vd_regex_compile(pat, msg, sizeof msg);

	if (!re)
		return vd_failf(code, C_REGEX_INVALID, err, errlen,
			     "Regular expression is invalid: %s", msg);
	pcre2_code_free(re);
	return 0;
}

int vd_js_check(const bson_t *schema, int depth, int *code, char *err, size_t errlen)
{
	static const char *const unsupported[] = {"$ref", "$schema", "default", "definitions",
						  "format", "id"};
	bson_iter_t it, a;
	bool have_type = false, have_bson_type = false, have_min = false, have_max = false;
	bool have_xmin = false, have_xmax = false;
	int rc;

	if (depth > 100)
		return vd_failf(code, C_BAD_VALUE, err, errlen, "$jsonSchema nested too deeply");
	if (!bson_iter_init(&it, schema))
		return vd_failf(code, C_BAD_VALUE, err, errlen, "invalid $jsonSchema");
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bson_type_t t = bson_iter_type(&it);
		for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
			if (strcmp(k, unsupported[i]) == 0)
				return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
					     "$jsonSchema keyword '%s' is not currently supported",
					     k);
		if (strcmp(k, "type") == 0 || strcmp(k, "bsonType") == 0) {
			bool json = k[0] == 't';
			if (json)
				have_type = true;
			else
				have_bson_type = true;
			if ((rc = check_type_spec(&it, json, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "title") == 0 || strcmp(k, "description") == 0) {
			if (t != BSON_TYPE_UTF8)
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be of type string", k);
		} else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0 ||
			   strcmp(k, "multipleOf") == 0) {
			if (!vd_is_num(t))
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be a number", k);
			if (k[1] == 'u' && vd_num_of(&it) <= 0)
				return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
					     "$jsonSchema keyword 'multipleOf' must have a "
					     "positive value");
			if (strcmp(k, "minimum") == 0)
				have_min = true;
			if (strcmp(k, "maximum") == 0)
				have_max = true;
		} else if (strcmp(k, "exclusiveMinimum") == 0 ||
			   strcmp(k, "exclusiveMaximum") == 0 || strcmp(k, "uniqueItems") == 0) {
			if (t != BSON_TYPE_BOOL)
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be a boolean", k);
			if (strcmp(k, "exclusiveMinimum") == 0)
				have_xmin = true;
			if (strcmp(k, "exclusiveMaximum") == 0)
				have_xmax = true;
		} else if (strcmp(k, "minLength") == 0 || strcmp(k, "maxLength") == 0 ||
			   strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0 ||
			   strcmp(k, "minProperties") == 0 || strcmp(k, "maxProperties") == 0) {
			if ((rc = check_len(&it, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "pattern") == 0) {
			if (t != BSON_TYPE_UTF8)
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'pattern' must be a string");
			if ((rc = check_regex(bson_iter_utf8(&it, NULL), code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "required") == 0) {
			if ((rc = check_unique_array(&it, k, true, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "enum") == 0) {
			if ((rc = check_unique_array(&it, k, false, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 ||
			   strcmp(k, "oneOf") == 0) {
			if ((rc = check_schema_list(&it, depth, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "not") == 0) {
			if ((rc = check_nested(&it, "$jsonSchema keyword 'not'", depth, code, err,
					       errlen)) != 0)
				return rc;
		} else if (strcmp(k, "properties") == 0 || strcmp(k, "patternProperties") == 0) {
			if (t != BSON_TYPE_DOCUMENT || !bson_iter_recurse(&it, &a))
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be an object", k);
			while (bson_iter_next(&a)) {
				char what[320];
				snprintf(what, sizeof what,
					 "Nested schema for $jsonSchema property '%s'",
					 bson_iter_key(&a));
				if (k[0] == 'p' && k[1] == 'a' &&
				    (rc = check_regex(bson_iter_key(&a), code, err, errlen)) != 0)
					return rc;
				if ((rc = check_nested(&a, what, depth, code, err, errlen)) != 0)
					return rc;
			}
		} else if (strcmp(k, "additionalProperties") == 0 ||
			   strcmp(k, "additionalItems") == 0) {
			if (t == BSON_TYPE_BOOL)
				continue;
			if (t != BSON_TYPE_DOCUMENT)
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword '%s' must be either an object or "
					     "a boolean, but got a %s",
					     k, sdb_bson_type_name(t));
			char what[96];
			snprintf(what, sizeof what, "$jsonSchema keyword '%s'", k);
			if ((rc = check_nested(&it, what, depth, code, err, errlen)) != 0)
				return rc;
		} else if (strcmp(k, "items") == 0) {
			if (t == BSON_TYPE_DOCUMENT) {
				if ((rc = check_nested(&it, "$jsonSchema keyword 'items'", depth,
						       code, err, errlen)) != 0)
					return rc;
			} else if (t == BSON_TYPE_ARRAY) {
				bson_iter_recurse(&it, &a);
				while (bson_iter_next(&a)) {
					if (!BSON_ITER_HOLDS_DOCUMENT(&a))
						return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
							     "$jsonSchema keyword 'items' requires "
							     "that each element of the array is an "
							     "object, but found a %s",
							     sdb_bson_type_name(bson_iter_type(&a)));
					if ((rc = check_nested(&a, "$jsonSchema keyword 'items'",
							       depth, code, err, errlen)) != 0)
						return rc;
				}
			} else {
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'items' must be an array or an "
					     "object, not %s",
					     sdb_bson_type_name(t));
			}
		} else if (strcmp(k, "dependencies") == 0) {
			if (t != BSON_TYPE_DOCUMENT || !bson_iter_recurse(&it, &a))
				return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
					     "$jsonSchema keyword 'dependencies' must be an object");
			while (bson_iter_next(&a)) {
				if (BSON_ITER_HOLDS_DOCUMENT(&a)) {
					if ((rc = check_nested(&a, "Nested schema for $jsonSchema "
								   "dependent field",
							       depth, code, err, errlen)) != 0)
						return rc;
				} else if (BSON_ITER_HOLDS_ARRAY(&a)) {
					if ((rc = check_unique_array(&a, "dependencies", true, code,
								     err, errlen)) != 0)
						return rc;
				} else {
					return vd_failf(code, C_TYPE_MISMATCH, err, errlen,
						     "property '%s' in $jsonSchema keyword "
						     "'dependencies' must be either an object or an "
						     "array",
						     bson_iter_key(&a));
				}
			}
		} else {
			return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
				     "Unknown $jsonSchema keyword: %s", k);
		}
	}
	if (have_type && have_bson_type)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "Cannot specify both $jsonSchema keywords 'type' and 'bsonType'");
	if (have_xmin && !have_min)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword 'minimum' must be a present if exclusiveMinimum "
			     "is present");
	if (have_xmax && !have_max)
		return vd_failf(code, C_FAILED_TO_PARSE, err, errlen,
			     "$jsonSchema keyword 'maximum' must be a present if exclusiveMaximum "
			     "is present");
	return 0;
}

/* ------------------------------------------------------------------ $jsonSchema: evaluation */



static void rule_begin(rules *r, bson_t *rule, const char *op)
{
	char key[16];

	snprintf(key, sizeof key, "%u", r->n++);
	BSON_APPEND_DOCUMENT_BEGIN(r->arr, key, rule);
	BSON_APPEND_UTF8(rule, "operatorName", op);
}

static void spec_as(bson_t *rule, const bson_iter_t *kw)
{
	bson_t s;

	BSON_APPEND_DOCUMENT_BEGIN(rule, "specifiedAs", &s);
	bson_append_iter(&s, bson_iter_key(kw), -1, kw);
	bson_append_document_end(rule, &s);
}

/* A leaf rule: {operatorName: kw, specifiedAs: {kw: spec}, reason, consideredValue}. */
static void leaf_rule(rules *r, const bson_iter_t *kw, const char *reason,
		      const bson_iter_t *val, bool with_type)
{
	bson_t rule;

	if (!r)
		return;
	rule_begin(r, &rule, bson_iter_key(kw));
	spec_as(&rule, kw);
	BSON_APPEND_UTF8(&rule, "reason", reason);
	if (val) {
		bson_append_iter(&rule, "consideredValue", -1, val);
		if (with_type)
			BSON_APPEND_UTF8(&rule, "consideredType",
					 sdb_bson_type_name(bson_iter_type(val)));
	}
	bson_append_document_end(r->arr, &rule);
}

/* Evaluate the sub-schema held by it on val; with r, the sub-schema's failing rules go
 * into a "details" array of parent. */
static bool sub_eval(const bson_iter_t *sch, const bson_iter_t *val, bson_t *parent,
		     const char *field)
{
	bson_t sub, arr;
	rules rr;
	bool ok;

	if (!vd_sub_static(sch, &sub))
		return true;
	if (!parent)
		return vd_js_eval(&sub, val, false, NULL);
	BSON_APPEND_ARRAY_BEGIN(parent, field, &arr);
	rr.arr = &arr;
	rr.n = 0;
	ok = vd_js_eval(&sub, val, false, &rr);
	bson_append_array_end(parent, &arr);
	return ok;
}

/* An array item's rule, for items and additionalItems: {operatorName: op, reason,
 * itemIndex: index, details: [the failing rules of sub-schema sch on the item]}. r not NULL. */
static void item_rule(rules *r, const char *op, const char *reason, int32_t index,
		      const bson_iter_t *sch, const bson_iter_t *item)
{
	bson_t rule;

	rule_begin(r, &rule, op);
	BSON_APPEND_UTF8(&rule, "reason", reason);
	BSON_APPEND_INT32(&rule, "itemIndex", index);
	sub_eval(sch, item, &rule, "details");
	bson_append_document_end(r->arr, &rule);
}

/* minItems, maxItems, minProperties, maxProperties (k, with its limit kw): whether the
 * number of elements of val (an array or a document), left in *n, is at least the limit
 * (min...) or at most it (max...). */
static bool count_within(const char *k, const bson_iter_t *kw, const bson_iter_t *val, double *n)
{
	bson_iter_t a;
	double lim = vd_num_of(kw);

	*n = 0;
	if (bson_iter_recurse(val, &a))
		while (bson_iter_next(&a))
			(*n)++;
	return k[1] == 'i' ? *n >= lim : *n <= lim;
}

/* A sub-schema's title and description (sch: its element), appended to an entry that
 * reports it (mongod's appendSchemaAnnotations). */
static void annotations(const bson_iter_t *sch, bson_t *entry)
{
	bson_t sub;
	bson_iter_t d;

	if (!vd_sub_static(sch, &sub))
		return;
	if (bson_iter_init_find(&d, &sub, "title"))
		bson_append_iter(entry, "title", -1, &d);
	if (bson_iter_init_find(&d, &sub, "description"))
		bson_append_iter(entry, "description", -1, &d);
}

static bool has_field(const bson_iter_t *obj, const char *name)
{
	bson_iter_t c;

	return bson_iter_recurse(obj, &c) && bson_iter_find(&c, name);
}

/* Is name a property listed in properties or matched by a patternProperties regex? */
static bool prop_known(const bson_t *schema, const char *name)
{
	bson_iter_t it, p;

	if (bson_iter_init_find(&it, schema, "properties") && bson_iter_recurse(&it, &p) &&
	    bson_iter_find(&p, name))
		return true;
	if (bson_iter_init_find(&it, schema, "patternProperties") && bson_iter_recurse(&it, &p))
		while (bson_iter_next(&p))
			if (vd_regex_test(bson_iter_key(&p), name, strlen(name)))
				return true;
	return false;
}

static size_t utf8_len(const char *s, size_t n)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++)
		if (((unsigned char)s[i] & 0xc0) != 0x80)
			c++;
	return c;
}

/* One schema on one value (top: the document itself). Returns true when satisfied; with
 * out, appends the failing rules. */
bool vd_js_eval(const bson_t *schema, const bson_iter_t *val, bool top, rules *out)
{
	bson_iter_t kw, a, b;
	bson_type_t t = bson_iter_type(val);
	bool all = true;
	bool is_obj = t == BSON_TYPE_DOCUMENT, is_arr = t == BSON_TYPE_ARRAY;
	bson_t rule;

	if (!bson_iter_init(&kw, schema))
		return true;
	while (bson_iter_next(&kw)) {
		const char *k = bson_iter_key(&kw);
		bool ok = true;

		if (strcmp(k, "type") == 0 || strcmp(k, "bsonType") == 0) {
			ok = type_ok(&kw, k[0] == 't', t);
			if (!ok)
				leaf_rule(out, &kw, "type did not match", val, true);
		} else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0) {
			if (top || !vd_is_num(t))
				continue;
			bool excl = false, mx = k[1] == 'a';
			if (bson_iter_init_find(&a, schema,
						mx ? "exclusiveMaximum" : "exclusiveMinimum"))
				excl = bson_iter_as_bool(&a);
			int c = sdb_bson_value_cmp(bson_iter_value((bson_iter_t *)val),
						   bson_iter_value(&kw));
			ok = mx ? (excl ? c < 0 : c <= 0) : (excl ? c > 0 : c >= 0);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				bson_t s;
				BSON_APPEND_DOCUMENT_BEGIN(&rule, "specifiedAs", &s);
				bson_append_iter(&s, k, -1, &kw);
				if (excl)
					bson_append_iter(&s, bson_iter_key(&a), -1, &a);
				bson_append_document_end(&rule, &s);
				BSON_APPEND_UTF8(&rule, "reason", "comparison failed");
				bson_append_iter(&rule, "consideredValue", -1, val);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "multipleOf") == 0) {
			if (top || !vd_is_num(t))
				continue;
			ok = vd_multiple_of(val, &kw);
			if (!ok)
				leaf_rule(out, &kw,
					  "considered value is not a multiple of the specified "
					  "value",
					  val, false);
		} else if (strcmp(k, "minLength") == 0 || strcmp(k, "maxLength") == 0) {
			if (top || t != BSON_TYPE_UTF8)
				continue;
			uint32_t len;
			const char *s = bson_iter_utf8(val, &len);
			double n = (double)utf8_len(s, len), lim = vd_num_of(&kw);
			ok = k[1] == 'i' ? n >= lim : n <= lim;
			if (!ok)
				leaf_rule(out, &kw, "specified string length was not satisfied", val,
					  false);
		} else if (strcmp(k, "pattern") == 0) {
			if (top || t != BSON_TYPE_UTF8)
				continue;
			uint32_t len;
			const char *s = bson_iter_utf8(val, &len);
			ok = vd_regex_test(bson_iter_utf8(&kw, NULL), s, len);
			if (!ok)
				leaf_rule(out, &kw, "regular expression did not match", val, false);
		} else if (strcmp(k, "enum") == 0) {
			ok = false;
			if (bson_iter_recurse(&kw, &a))
				while (!ok && bson_iter_next(&a))
					ok = sdb_bson_iter_eq(&a, val);
			if (!ok)
				leaf_rule(out, &kw, "value was not found in enum", val, false);
		} else if (strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0) {
			if (!is_arr)
				continue;
			double n;
			ok = count_within(k, &kw, val, &n);
			if (!ok)
				leaf_rule(out, &kw, "array did not match specified length", val,
					  false);
		} else if (strcmp(k, "uniqueItems") == 0) {
			if (!is_arr || !bson_iter_as_bool(&kw))
				continue;
			ok = !vd_array_has_duplicate(val, &a, NULL);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason", "found a duplicate item");
				bson_append_iter(&rule, "consideredValue", -1, val);
				bson_append_iter(&rule, "duplicatedValue", -1, &a);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "minProperties") == 0 || strcmp(k, "maxProperties") == 0) {
			if (!is_obj)
				continue;
			double n;
			ok = count_within(k, &kw, val, &n);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason",
						 "specified number of properties was not satisfied");
				BSON_APPEND_INT32(&rule, "numberOfProperties", (int32_t)n);
				bson_append_document_end(out->arr, &rule);
			}
		} else if (strcmp(k, "required") == 0) {
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			bson_t miss = BSON_INITIALIZER;
			uint32_t nm = 0;
			while (bson_iter_next(&a)) {
				const char *p = bson_iter_utf8(&a, NULL);
				if (!has_field(val, p)) {
					char key[16];
					snprintf(key, sizeof key, "%u", nm++);
					BSON_APPEND_UTF8(&miss, key, p);
				}
			}
			ok = nm == 0;
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_ARRAY(&rule, "missingProperties", &miss);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&miss);
		} else if (strcmp(k, "properties") == 0 || strcmp(k, "patternProperties") == 0) {
			bool pattern = k[1] == 'a';
			bson_t pns, arr;
			uint32_t np = 0;
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			bson_init(&pns);
			while (bson_iter_next(&a)) {
				bson_iter_t f;
				if (!bson_iter_recurse(val, &f))
					break;
				while (bson_iter_next(&f)) {
					const char *fname = bson_iter_key(&f);
					if (pattern ? !vd_regex_test(bson_iter_key(&a), fname,
								  strlen(fname))
						    : strcmp(fname, bson_iter_key(&a)) != 0)
						continue;
					if (sub_eval(&a, &f, NULL, NULL))
						continue;
					ok = false;
					if (out) {
						bson_t e;
						char key[16];
						snprintf(key, sizeof key, "%u", np++);
						BSON_APPEND_DOCUMENT_BEGIN(&pns, key, &e);
						BSON_APPEND_UTF8(&e, "propertyName", fname);
						annotations(&a, &e);
						if (pattern)
							BSON_APPEND_UTF8(&e, "regexMatched",
									 bson_iter_key(&a));
						sub_eval(&a, &f, &e, "details");
						bson_append_document_end(&pns, &e);
					}
				}
			}
			if (!ok && out) {
				rule_begin(out, &rule, k);
				BSON_APPEND_ARRAY_BEGIN(&rule, "propertiesNotSatisfied", &arr);
				bson_concat(&arr, &pns);
				bson_append_array_end(&rule, &arr);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&pns);
		} else if (strcmp(k, "additionalProperties") == 0) {
			bson_iter_t f;
			bson_t extra = BSON_INITIALIZER;
			uint32_t ne = 0;
			if (!is_obj || !bson_iter_recurse(val, &f))
				continue;
			while (bson_iter_next(&f)) {
				const char *fname = bson_iter_key(&f);
				if (prop_known(schema, fname))
					continue;
				bool fine = BSON_ITER_HOLDS_BOOL(&kw) ? bson_iter_bool(&kw)
								      : sub_eval(&kw, &f, NULL, NULL);
				if (fine)
					continue;
				ok = false;
				if (!out)
					break;
				if (BSON_ITER_HOLDS_BOOL(&kw)) {
					char key[16];
					snprintf(key, sizeof key, "%u", ne++);
					BSON_APPEND_UTF8(&extra, key, fname);
				} else if (ne++ == 0) {
					rule_begin(out, &rule, k);
					BSON_APPEND_UTF8(&rule, "reason",
							 "at least one additional property did not "
							 "match the subschema");
					BSON_APPEND_UTF8(&rule, "failingProperty", fname);
					sub_eval(&kw, &f, &rule, "details");
					bson_append_document_end(out->arr, &rule);
				}
			}
			if (!ok && out && BSON_ITER_HOLDS_BOOL(&kw)) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_ARRAY(&rule, "additionalProperties", &extra);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&extra);
		} else if (strcmp(k, "dependencies") == 0) {
			bson_t fails = BSON_INITIALIZER;
			uint32_t nf = 0;
			if (!is_obj || !bson_iter_recurse(&kw, &a))
				continue;
			while (bson_iter_next(&a)) {
				const char *dep = bson_iter_key(&a);
				if (!has_field(val, dep))
					continue;
				char key[16];
				bson_t e;
				if (BSON_ITER_HOLDS_ARRAY(&a)) {
					bson_t miss = BSON_INITIALIZER;
					uint32_t nm = 0;
					bson_iter_recurse(&a, &b);
					while (bson_iter_next(&b)) {
						const char *p = bson_iter_utf8(&b, NULL);
						if (!has_field(val, p)) {
							char mk[16];
							snprintf(mk, sizeof mk, "%u", nm++);
							BSON_APPEND_UTF8(&miss, mk, p);
						}
					}
					if (nm > 0) {
						ok = false;
						snprintf(key, sizeof key, "%u", nf++);
						BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
						BSON_APPEND_UTF8(&e, "conditionalProperty", dep);
						BSON_APPEND_ARRAY(&e, "missingProperties", &miss);
						bson_append_document_end(&fails, &e);
					}
					bson_destroy(&miss);
				} else if (!sub_eval(&a, val, NULL, NULL)) {
					ok = false;
					snprintf(key, sizeof key, "%u", nf++);
					BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
					BSON_APPEND_UTF8(&e, "conditionalProperty", dep);
					sub_eval(&a, val, &e, "details");
					bson_append_document_end(&fails, &e);
				}
			}
			if (!ok && out) {
				rule_begin(out, &rule, k);
				BSON_APPEND_ARRAY(&rule, "failingDependencies", &fails);
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&fails);
		} else if (strcmp(k, "items") == 0) {
			if (!is_arr || !bson_iter_recurse(val, &a))
				continue;
			if (BSON_ITER_HOLDS_DOCUMENT(&kw)) {
				int32_t i = 0;
				while (bson_iter_next(&a)) {
					if (!sub_eval(&kw, &a, NULL, NULL)) {
						ok = false;
						if (out)
							item_rule(out, k,
								  "At least one item did not "
								  "match the sub-schema",
								  i, &kw, &a);
						break;
					}
					i++;
				}
			} else {
				int32_t i = 0;
				bson_iter_recurse(&kw, &b);
				while (bson_iter_next(&b) && bson_iter_next(&a)) {
					if (!sub_eval(&b, &a, NULL, NULL)) {
						ok = false;
						if (out)
							item_rule(out, k,
								  "An array item did not match "
								  "the specified subschema at "
								  "the same index",
								  i, &b, &a);
						break;
					}
					i++;
				}
			}
		} else if (strcmp(k, "additionalItems") == 0) {
			bson_iter_t items;
			if (!is_arr || !bson_iter_init_find(&items, schema, "items") ||
			    !BSON_ITER_HOLDS_ARRAY(&items) || !bson_iter_recurse(val, &a))
				continue;
			int32_t nt = 0, i = 0;
			bson_iter_recurse(&items, &b);
			while (bson_iter_next(&b))
				nt++;
			while (bson_iter_next(&a)) {
				if (i++ < nt)
					continue;
				bool fine = BSON_ITER_HOLDS_BOOL(&kw) ? bson_iter_bool(&kw)
								      : sub_eval(&kw, &a, NULL, NULL);
				if (fine)
					continue;
				ok = false;
				if (out && BSON_ITER_HOLDS_BOOL(&kw)) {
					rule_begin(out, &rule, k);
					spec_as(&rule, &kw);
					BSON_APPEND_UTF8(&rule, "reason", "found additional items");
					bson_append_iter(&rule, "additionalItems", -1, val);
					bson_append_document_end(out->arr, &rule);
				} else if (out) {
					item_rule(out, k,
						  "At least one additional item did not match the "
						  "sub-schema",
						  i - 1, &kw, &a);
				}
				break;
			}
		} else if (strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 ||
			   strcmp(k, "oneOf") == 0) {
			int32_t i = 0, nmatch = 0;
			bson_t fails = BSON_INITIALIZER, matched = BSON_INITIALIZER;
			uint32_t nf = 0;
			bson_iter_recurse(&kw, &a);
			while (bson_iter_next(&a)) {
				char key[16];
				if (sub_eval(&a, val, NULL, NULL)) {
					snprintf(key, sizeof key, "%d", nmatch++);
					BSON_APPEND_INT32(&matched, key, i);
				} else if (out) {
					bson_t e;
					snprintf(key, sizeof key, "%u", nf++);
					BSON_APPEND_DOCUMENT_BEGIN(&fails, key, &e);
					BSON_APPEND_INT32(&e, "index", i);
					annotations(&a, &e);
					sub_eval(&a, val, &e, "details");
					bson_append_document_end(&fails, &e);
				}
				i++;
			}
			bool one = strcmp(k, "oneOf") == 0;
			if (strcmp(k, "allOf") == 0)
				ok = nmatch == i;
			else if (strcmp(k, "anyOf") == 0)
				ok = nmatch > 0;
			else
				ok = nmatch == 1;
			if (!ok && out) {
				rule_begin(out, &rule, k);
				if (one && nmatch > 1) {
					BSON_APPEND_UTF8(&rule, "reason",
							 "more than one subschema matched");
					BSON_APPEND_ARRAY(&rule, "matchingSchemaIndexes", &matched);
				} else {
					BSON_APPEND_ARRAY(&rule, "schemasNotSatisfied", &fails);
				}
				bson_append_document_end(out->arr, &rule);
			}
			bson_destroy(&fails);
			bson_destroy(&matched);
		} else if (strcmp(k, "not") == 0) {
			ok = !sub_eval(&kw, val, NULL, NULL);
			if (!ok && out) {
				rule_begin(out, &rule, k);
				spec_as(&rule, &kw);
				BSON_APPEND_UTF8(&rule, "reason", "child expression matched");
				bson_append_document_end(out->arr, &rule);
			}
		}
		/* title, description, exclusive*: no rule of their own */
		if (!ok) {
			all = false;
			if (!out)
				return false;
		}
	}
	return all;
}
