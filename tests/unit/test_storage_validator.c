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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keywords),
		cmocka_unit_test(test_details),
		cmocka_unit_test(test_parse_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
