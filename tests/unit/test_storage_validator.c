/* Unit tests of storage/validator.c: $jsonSchema verdicts per keyword, the details document
 * of a failure (MongoDB 5.0's shape) and parse errors with mongod's codes. */

/* The module under test, compiled into this binary (statics included). */
#include "../../storage/validator.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static bson_t *J(const char *json)
{
	bson_error_t e;
	bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &e);
	if (!b)
		fail_msg("bad test JSON %s: %s", json, e.message);
	return b;
}

/* 1 / 0 for doc against validator (which must compile). */
static int verdict(const char *validator, const char *doc)
{
	bson_t *v = J(validator), *d = J(doc);
	sdb_validator *val = NULL;
	char err[512];
	int code = 0;
	if (sdb_validator_new(v, &val, &code, err, sizeof err) != 0)
		fail_msg("%s does not compile: %s", validator, err);
	int r = sdb_validator_check(val, d, NULL, &code, err, sizeof err);
	sdb_validator_free(val);
	bson_destroy(v);
	bson_destroy(d);
	return r;
}

static void test_keywords(void **state)
{
	(void)state;
	static const struct {
		const char *v, *doc;
		int want;
	} cases[] = {
		{"{\"$jsonSchema\": {\"required\": [\"a\"]}}", "{\"a\": 1}", 1},
		{"{\"$jsonSchema\": {\"required\": [\"a\"]}}", "{\"b\": 1}", 0},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"bsonType\": \"number\"}}}}",
		 "{\"a\": 1.5}", 1},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"bsonType\": \"number\"}}}}",
		 "{\"a\": \"x\"}", 0},
		/* restrictions ignore other types and missing properties */
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"minimum\": 5}}}}", "{\"a\": \"x\"}", 1},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"minimum\": 5}}}}", "{}", 1},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"minimum\": 5}}}}", "{\"a\": 4}", 0},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"maximum\": 5, \"exclusiveMaximum\": "
		 "true}}}}",
		 "{\"a\": 5}", 0},
		{"{\"$jsonSchema\": {\"properties\": {\"s\": {\"maxLength\": 2}}}}",
		 "{\"s\": \"\\u00e9\\u00e9\"}", 1},
		{"{\"$jsonSchema\": {\"properties\": {\"s\": {\"pattern\": \"^a\"}}}}", "{\"s\": \"ba\"}",
		 0},
		{"{\"$jsonSchema\": {\"properties\": {\"l\": {\"uniqueItems\": true}}}}",
		 "{\"l\": [1, 2, 1]}", 0},
		{"{\"$jsonSchema\": {\"properties\": {\"l\": {\"items\": {\"type\": \"string\"}}}}}",
		 "{\"l\": [\"a\", 2]}", 0},
		{"{\"$jsonSchema\": {\"oneOf\": [{\"required\": [\"a\"]}, {\"required\": [\"b\"]}]}}",
		 "{\"a\": 1, \"b\": 1}", 0},
		{"{\"$jsonSchema\": {\"anyOf\": [{\"required\": [\"a\"]}, {\"required\": [\"b\"]}]}}",
		 "{\"b\": 1}", 1},
		{"{\"$jsonSchema\": {\"not\": {\"required\": [\"a\"]}}}", "{\"a\": 1}", 0},
		{"{\"$jsonSchema\": {\"additionalProperties\": false, \"properties\": {\"_id\": {}}}}",
		 "{\"_id\": 1, \"x\": 1}", 0},
		{"{\"$jsonSchema\": {\"dependencies\": {\"a\": [\"b\"]}}}", "{\"a\": 1}", 0},
		{"{\"$jsonSchema\": {\"dependencies\": {\"a\": [\"b\"]}}}", "{\"c\": 1}", 1},
		/* a top-level type other than object matches nothing */
		{"{\"$jsonSchema\": {\"type\": \"array\"}}", "{}", 0},
		/* query clauses beside it, and $or / $nor */
		{"{\"$jsonSchema\": {}, \"a\": {\"$gt\": 1}}", "{\"a\": 2}", 1},
		{"{\"$or\": [{\"a\": 1}, {\"$jsonSchema\": {\"required\": [\"b\"]}}]}", "{\"b\": 0}", 1},
		{"{\"$nor\": [{\"a\": 1}]}", "{\"a\": 1}", 0},
		{"{}", "{\"a\": 1}", 1},
		/* decimal128 values and limits */
		{"{\"$jsonSchema\": {\"properties\": {\"n\": {\"multipleOf\": 3}}}}",
		 "{\"n\": {\"$numberDecimal\": \"10\"}}", 0},
		{"{\"$jsonSchema\": {\"properties\": {\"n\": {\"multipleOf\": {\"$numberDecimal\": "
		 "\"2.5\"}}}}}",
		 "{\"n\": 5}", 1},
		{"{\"$jsonSchema\": {\"properties\": {\"s\": {\"maxLength\": {\"$numberDecimal\": "
		 "\"1\"}}}}}",
		 "{\"s\": \"ab\"}", 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (verdict(cases[i].v, cases[i].doc) != cases[i].want)
			fail_msg("case %zu: %s on %s: want %d", i, cases[i].v, cases[i].doc,
				 cases[i].want);
}

static void test_details(void **state)
{
	(void)state;
	bson_t *v = J("{\"$jsonSchema\": {\"required\": [\"a\", \"b\"], \"properties\": {\"b\": "
		      "{\"bsonType\": \"string\"}}}}");
	bson_t *d = J("{\"_id\": 1, \"b\": 5}");
	bson_t det;
	sdb_validator *val = NULL;
	char err[512];
	int code = 0;
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), 0);
	assert_int_equal(sdb_validator_check(val, d, &det, &code, err, sizeof err), 0);
	bson_t *want = J("{\"operatorName\": \"$jsonSchema\", \"schemaRulesNotSatisfied\": ["
			 "{\"operatorName\": \"required\", \"specifiedAs\": {\"required\": [\"a\", "
			 "\"b\"]}, \"missingProperties\": [\"a\"]},"
			 "{\"operatorName\": \"properties\", \"propertiesNotSatisfied\": ["
			 "{\"propertyName\": \"b\", \"details\": [{\"operatorName\": \"bsonType\", "
			 "\"specifiedAs\": {\"bsonType\": \"string\"}, \"reason\": \"type did not "
			 "match\", \"consideredValue\": 5, \"consideredType\": \"int\"}]}]}]}");
	if (!bson_equal(&det, want)) {
		char *got = bson_as_relaxed_extended_json(&det, NULL);
		fail_msg("details: %s", got);
	}
	bson_destroy(&det);
	bson_destroy(want);
	sdb_validator_free(val);
	bson_destroy(v);
	bson_destroy(d);
}

static void test_parse_errors(void **state)
{
	(void)state;
	static const struct {
		const char *v;
		int code;
		const char *msg;
	} cases[] = {
		{"{\"$jsonSchema\": {\"format\": \"x\"}}", 9, "keyword 'format' is not currently supported"},
		{"{\"$jsonSchema\": {\"id\": \"x\"}}", 9, "keyword 'id' is not currently supported"},
		{"{\"$jsonSchema\": {\"zzz\": 1}}", 9, "Unknown $jsonSchema keyword: zzz"},
		{"{\"$jsonSchema\": {\"type\": \"integer\"}}", 9, "type 'integer' is not currently"},
		{"{\"$jsonSchema\": {\"type\": \"date\"}}", 2, "Unknown type name alias: date"},
		{"{\"$jsonSchema\": {\"required\": [\"a\", \"a\"]}}", 9, "duplicate values"},
		{"{\"$jsonSchema\": {\"maxItems\": -1}}", 2, "Expected a positive number"},
		{"{\"$jsonSchema\": {\"oneOf\": [1]}}", 14, "must be an array of objects"},
		{"{\"$jsonSchema\": {\"properties\": {\"a\": {\"pattern\": \"[\"}}}}", 51091,
		 "Regular expression is invalid"},
		{"{\"$jsonSchema\": 1}", 14, "$jsonSchema must be an object"},
		{"{\"$zz\": 1}", 2, "unknown top level operator"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *v = J(cases[i].v);
		sdb_validator *val = NULL;
		char err[512];
		int code = 0;
		assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), SDB_EINVAL);
		assert_null(val);
		if (code != cases[i].code || !strstr(err, cases[i].msg) ||
		    !strstr(err, "Parsing of collection validator failed :: caused by :: "))
			fail_msg("case %zu: %s: got %d %s", i, cases[i].v, code, err);
		bson_destroy(v);
	}
}

/* A validator {$jsonSchema: {properties: {a: {KW: [0, 1, ..., n-1 (+ extra)]}}}}. */
static bson_t *big_array_schema(const char *kw, int n, int extra)
{
	bson_t *v = bson_new(), js, props, a, spec, arr;
	char k[16];
	BSON_APPEND_DOCUMENT_BEGIN(v, "$jsonSchema", &js);
	BSON_APPEND_DOCUMENT_BEGIN(&js, "properties", &props);
	BSON_APPEND_DOCUMENT_BEGIN(&props, "a", &a);
	if (strcmp(kw, "uniqueItems") == 0) {
		BSON_APPEND_BOOL(&a, "uniqueItems", true);
	} else {
		BSON_APPEND_ARRAY_BEGIN(&a, kw, &arr);
		for (int i = 0; i < n; i++) {
			snprintf(k, sizeof k, "%d", i);
			if (strcmp(kw, "required") == 0) {
				char f[16];
				snprintf(f, sizeof f, "f%d", i);
				BSON_APPEND_UTF8(&arr, k, f);
			} else {
				BSON_APPEND_INT32(&arr, k, i);
			}
		}
		if (extra >= 0) {
			snprintf(k, sizeof k, "%d", n);
			if (strcmp(kw, "required") == 0) {
				char f[16];
				snprintf(f, sizeof f, "f%d", extra);
				BSON_APPEND_UTF8(&arr, k, f);
			} else {
				BSON_APPEND_INT64(&arr, k, extra);
			}
		}
		bson_append_array_end(&a, &arr);
	}
	(void)spec;
	bson_append_document_end(&props, &a);
	bson_append_document_end(&js, &props);
	bson_append_document_end(v, &js);
	return v;
}

/* {a: [0, 1, ..., n-1 (+ extra as a double)]} */
static bson_t *big_array_doc(int n, int extra)
{
	bson_t *d = bson_new(), arr;
	char k[16];
	BSON_APPEND_ARRAY_BEGIN(d, "a", &arr);
	for (int i = 0; i < n; i++) {
		snprintf(k, sizeof k, "%d", i);
		BSON_APPEND_INT32(&arr, k, n - 1 - i);
	}
	if (extra >= 0) {
		snprintf(k, sizeof k, "%d", n);
		BSON_APPEND_DOUBLE(&arr, k, extra);
	}
	bson_append_array_end(d, &arr);
	return d;
}

/* uniqueItems, enum and required compare values in n log n (the shard's write lock is held
 * while a document is validated): large arrays give the same verdicts as the pairwise scan. */
static void test_large_arrays(void **state)
{
	(void)state;
	char err[512];
	int code = 0;
	sdb_validator *val = NULL;
	bson_t *v = big_array_schema("uniqueItems", 0, -1), det;
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), 0);
	bson_t *d = big_array_doc(20000, -1);
	assert_int_equal(sdb_validator_check(val, d, NULL, &code, err, sizeof err), 1);
	bson_destroy(d);
	/* 7.0 after 20,000 ints: equal to the int 7 (numbers compare by value) */
	d = big_array_doc(20000, 7);
	assert_int_equal(sdb_validator_check(val, d, &det, &code, err, sizeof err), 0);
	char *js = bson_as_relaxed_extended_json(&det, NULL);
	/* the first item (in array order) that has a duplicate: the int 7 */
	assert_non_null(strstr(js, "\"duplicatedValue\" : 7 "));
	bson_free(js);
	bson_destroy(&det);
	bson_destroy(d);
	sdb_validator_free(val);
	bson_destroy(v);

	/* enum of 100,000 distinct values compiles; one duplicate (an int64 equal to an int32)
	 * is FailedToParse */
	v = big_array_schema("enum", 100000, -1);
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), 0);
	d = big_array_doc(3, -1);
	bson_destroy(d);
	sdb_validator_free(val);
	bson_destroy(v);
	v = big_array_schema("enum", 100000, 99999);
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), SDB_EINVAL);
	assert_int_equal(code, 9);
	assert_non_null(strstr(err, "array cannot contain duplicate values"));
	bson_destroy(v);
	v = big_array_schema("required", 50000, 12345);
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), SDB_EINVAL);
	assert_int_equal(code, 9);
	bson_destroy(v);
	v = big_array_schema("required", 50000, -1);
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), 0);
	sdb_validator_free(val);
	bson_destroy(v);

	/* the helper on small mixed arrays */
	static const struct {
		const char *doc;
		int want;
	} cases[] = {
		{"{\"a\": []}", 1},
		{"{\"a\": [1]}", 1},
		{"{\"a\": [1, \"1\", {\"x\": 1}, [1], null]}", 1},
		{"{\"a\": [{\"x\": 1}, {\"x\": 1.0}]}", 0},
		{"{\"a\": [[1, 2], [1, 2]]}", 0},
		{"{\"a\": [{\"x\": 1, \"y\": 2}, {\"y\": 2, \"x\": 1}]}", 1},
		{"{\"a\": [null, null]}", 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (verdict("{\"$jsonSchema\": {\"properties\": {\"a\": {\"uniqueItems\": true}}}}",
			    cases[i].doc) != cases[i].want)
			fail_msg("uniqueItems case %zu: %s", i, cases[i].doc);
}

/* pattern / patternProperties: compiled once with the validator; a catastrophic backtrack
 * hits PCRE2's match limit and is an error (2 BadValue), never a pass or a silent fail. */
static void test_regex_limits(void **state)
{
	(void)state;
	char err[512];
	int code = 0;
	sdb_validator *val = NULL;
	bson_t *v = J("{\"$jsonSchema\": {\"properties\": {\"s\": {\"pattern\": \"^(a+)+$\"}, "
		      "\"t\": {\"pattern\": \"^x\"}, \"u\": {\"pattern\": \"^x\"}}, "
		      "\"patternProperties\": {\"^(a+)+$\": {\"bsonType\": \"int\"}}}}");
	assert_int_equal(sdb_validator_new(v, &val, &code, err, sizeof err), 0);
	assert_int_equal(val->rx.n, 2); /* ^(a+)+$ (twice) and ^x, each once */
	bson_t *d = J("{\"s\": \"aaaa\", \"t\": \"xy\"}");
	assert_int_equal(sdb_validator_check(val, d, NULL, &code, err, sizeof err), 1);
	bson_destroy(d);
	d = J("{\"t\": \"yx\"}");
	assert_int_equal(sdb_validator_check(val, d, NULL, &code, err, sizeof err), 0);
	bson_destroy(d);
	const char *bad[] = {
		"{\"s\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab\"}",
		/* a field name the patternProperties regex cannot decide */
		"{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab\": 1}",
	};
	for (size_t i = 0; i < 2; i++) {
		bson_t det;
		d = J(bad[i]);
		code = 0;
		assert_int_equal(sdb_validator_check(val, d, NULL, &code, err, sizeof err),
				 SDB_ETOOBIG);
		assert_int_equal(code, 2);
		assert_non_null(strstr(err, "match limit"));
		assert_int_equal(sdb_validator_check(val, d, &det, &code, err, sizeof err),
				 SDB_ETOOBIG);
		bson_destroy(d);
	}
	/* the next check starts clean */
	d = J("{\"t\": \"x\"}");
	assert_int_equal(sdb_validator_check(val, d, NULL, &code, err, sizeof err), 1);
	bson_destroy(d);
	sdb_validator_free(val);
	bson_destroy(v);
}

/* multipleOf as mongod's Decimal128 remainder (a double rounded to 15 digits). */
static void test_multiple_of(void **state)
{
	(void)state;
	static const struct {
		const char *div, *val;
		int want;
	} cases[] = {
		{"0.1", "0.3", 1},
		{"0.1", "0.35", 0},
		{"0.01", "1.23", 1},
		{"3", "9", 1},
		{"3", "10", 0},
		{"3", "-9", 1},
		{"2.5", "7.5", 1},
		{"2.5", "7", 0},
		{"0.1", "0", 1},
		{"7", "1e300", 0},
		{"5", "1e300", 1},
		{"1e-300", "3e-299", 1},
		{"0.3", "0.1", 0},
		{"{\"$numberDecimal\": \"0.1\"}", "{\"$numberDecimal\": \"0.30\"}", 1},
		{"{\"$numberDecimal\": \"0.1\"}", "{\"$numberDecimal\": \"0.31\"}", 0},
		{"{\"$numberLong\": \"4\"}", "{\"$numberLong\": \"1000000000000000000\"}", 1},
		{"1", "{\"$numberDouble\": \"Infinity\"}", 0},
		{"1", "{\"$numberDouble\": \"NaN\"}", 0},
		/* beyond a double's digits: exact (2^63 - 2 is a multiple of 3, 2^63 is not) */
		{"{\"$numberLong\": \"3\"}", "{\"$numberLong\": \"9223372036854775806\"}", 1},
		{"{\"$numberLong\": \"3\"}", "{\"$numberLong\": \"9223372036854775807\"}", 0},
		{"{\"$numberDecimal\": \"1E-25\"}",
		 "{\"$numberDecimal\": \"0.1234567890123456789012345\"}", 1},
		{"{\"$numberDecimal\": \"1E-24\"}",
		 "{\"$numberDecimal\": \"0.1234567890123456789012345\"}", 0},
		{"{\"$numberDecimal\": \"0.1\"}", "{\"$numberDecimal\": \"Infinity\"}", 0},
	};
	char v[256], d[256];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(v, sizeof v,
			 "{\"$jsonSchema\": {\"properties\": {\"a\": {\"multipleOf\": %s}}}}",
			 cases[i].div);
		snprintf(d, sizeof d, "{\"a\": %s}", cases[i].val);
		if (verdict(v, d) != cases[i].want)
			fail_msg("multipleOf %s of %s: want %d", cases[i].div, cases[i].val,
				 cases[i].want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keywords),
		cmocka_unit_test(test_details),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_large_arrays),
		cmocka_unit_test(test_regex_limits),
		cmocka_unit_test(test_multiple_of),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
