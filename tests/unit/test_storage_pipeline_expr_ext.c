/* Unit tests of the expression language's numeric, string, conversion and date operators
 * (storage/pipeline_expr_ext.c, _str.c, _conv.c, _date.c): MongoDB manual and
 * expression.cpp examples with their expected outputs (compared as canonical extended
 * JSON: types count), error codes, and edge cases (overflow, NaN/Infinity, huge places,
 * invalid UTF-8, dates before 1970 and far in the future). Evaluated through the public
 * sdb_pipeline_eval_expr. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "storage/pipeline.h"

#include "pipeline_check.h"

static const char *doc_json = "{'s': 'héllo wörld', 'n': 7, 'd': {'$date': '2014-01-01T08:15:39.736Z'},"
			      " 'old': {'$date': {'$numberLong': '-2208988800001'}}}";

/* Evaluate {'e': expr} against doc_json; *code gets the error code (0 on success). */
static char *eval_json(const char *expr, int *code)
{
	char buf[4096], err[512] = "";
	bson_t *x, *doc, out;
	bson_iter_t it;
	char *json = NULL;
	int rc;

	snprintf(buf, sizeof buf, "{'e': %s}", expr);
	x = J(buf);
	doc = J(doc_json);
	assert_true(bson_iter_init_find(&it, x, "e"));
	*code = 0;
	rc = sdb_pipeline_eval_expr(&it, doc, &out, code, err, sizeof err);
	if (rc == 0) {
		json = bson_as_canonical_extended_json(&out, NULL);
	} else {
		json = bson_strdup(err);
	}
	bson_destroy(&out);
	bson_destroy(x);
	bson_destroy(doc);
	return json;
}

/* expr evaluates to want ({'v': ...} JSON; "{}" for missing). */
static void ok(const char *expr, const char *want)
{
	int code;
	char *got = eval_json(expr, &code);
	bson_t *w = J(want);
	char *wj = bson_as_canonical_extended_json(w, NULL);

	if (code != 0 || strcmp(got, wj) != 0) {
		fail_msg("%s: got %s (code %d), want %s", expr, got, code, wj);
	}
	bson_free(got);
	bson_free(wj);
	bson_destroy(w);
}

/* expr fails with code (and, when msg is not NULL, a message containing msg). */
static void err(const char *expr, int want, const char *msg)
{
	int code;
	char *got = eval_json(expr, &code);

	if (code != want || (msg != NULL && strstr(got, msg) == NULL)) {
		fail_msg("%s: got code %d (%s), want %d %s", expr, code, got, want, msg ? msg : "");
	}
	bson_free(got);
}

static void test_round_trunc(void **state)
{
	(void)state;
	/* MongoDB manual $round / $trunc examples */
	ok("{'$round': [19.25, 1]}", "{'v': 19.2}");
	ok("{'$round': [28.73, 1]}", "{'v': 28.7}");
	ok("{'$round': [34.32, 1]}", "{'v': 34.3}");
	ok("{'$round': [-45.39, 1]}", "{'v': -45.4}");
	ok("{'$round': [19.25, 0]}", "{'v': 19.0}");
	ok("{'$round': [19.25, -1]}", "{'v': 20.0}");
	ok("{'$round': [2.5]}", "{'v': 2.0}");
	ok("{'$round': [3.5]}", "{'v': 4.0}");
	ok("{'$round': [-2.5]}", "{'v': -2.0}");
	ok("{'$round': [25, -1]}", "{'v': 20}");
	ok("{'$round': [35, -1]}", "{'v': 40}");
	ok("{'$round': [1234, 2]}", "{'v': 1234}");
	ok("{'$round': [{'$numberLong': '1250'}, -2]}", "{'v': {'$numberLong': '1200'}}");
	ok("{'$round': [2147483647, -1]}", "{'v': {'$numberLong': '2147483650'}}");
	ok("{'$round': [{'$numberDecimal': '1.2345'}, 2]}", "{'v': {'$numberDecimal': '1.23'}}");
	ok("{'$round': [{'$numberDecimal': '1.235'}, 2]}", "{'v': {'$numberDecimal': '1.24'}}");
	ok("{'$round': [{'$numberDecimal': '1.225'}, 2]}", "{'v': {'$numberDecimal': '1.22'}}");
	ok("{'$round': [{'$numberDecimal': '1234.5'}, -2]}", "{'v': {'$numberDecimal': '1.2E+3'}}");
	ok("{'$round': [{'$numberDecimal': 'Infinity'}, 2]}", "{'v': {'$numberDecimal': 'Infinity'}}");
	ok("{'$round': [{'$numberDouble': 'NaN'}, 2]}", "{'v': {'$numberDouble': 'NaN'}}");
	ok("{'$round': [{'$numberDouble': '-Infinity'}, 2]}", "{'v': {'$numberDouble': '-Infinity'}}");
	ok("{'$trunc': [19.25, 1]}", "{'v': 19.2}");
	ok("{'$trunc': [-45.39, 1]}", "{'v': -45.3}");
	ok("{'$trunc': [19.25, -1]}", "{'v': 10.0}");
	ok("{'$trunc': 7.9}", "{'v': 7.0}");
	ok("{'$trunc': [-7.9]}", "{'v': -7.0}");
	ok("{'$trunc': [{'$numberDecimal': '-1.999'}, 1]}", "{'v': {'$numberDecimal': '-1.9'}}");
	ok("{'$trunc': [null, 1]}", "{'v': null}");
	ok("{'$round': [1.5, null]}", "{'v': null}");
	ok("{'$round': ['$missing', 1]}", "{'v': null}");
	/* a place beyond Decimal128's 34 digits: mongod's quantize is invalid (NaN) */
	ok("{'$round': [1.5, 100]}", "{'v': {'$numberDouble': 'NaN'}}");
	err("{'$round': [{'$numberLong': '9223372036854775807'}, -1]}", 51080,
	    "invalid conversion from Decimal128 result in $round resulting from arguments: [9223372036854775807, -1]");
	ok("{'$round': [{'$numberLong': '9223372036854775807'}, -20]}", "{'v': {'$numberLong': '0'}}");
	err("{'$round': ['a', 1]}", 51081, "$round only supports numeric types, not string");
	err("{'$round': [1, 1.5]}", 51082, "must be a integral value");
	err("{'$round': [1, 101]}", 51083, "value must be in [-20, 100]");
	err("{'$round': [1, -21]}", 51083, NULL);
	err("{'$round': [1, 1e300]}", 51082, NULL);
	err("{'$trunc': [1, 2, 3]}", 28667, "Expression $trunc takes at least 1 arguments, and at most 2, but 3 were passed in.");
}

static void test_math(void **state)
{
	(void)state;
	ok("{'$exp': 0}", "{'v': 1.0}");
	ok("{'$ln': 1}", "{'v': 0.0}");
	ok("{'$log10': 100}", "{'v': 2.0}");
	ok("{'$log': [100, 10]}", "{'v': 2.0}");
	ok("{'$log': [8, 2]}", "{'v': 3.0}");
	ok("{'$sqrt': 25}", "{'v': 5.0}");
	ok("{'$sqrt': null}", "{'v': null}");
	ok("{'$pow': [5, 0]}", "{'v': 1}");
	ok("{'$pow': [5, 2]}", "{'v': 25}");
	ok("{'$pow': [5, -2]}", "{'v': 0.04}");
	ok("{'$pow': [-5, 0.5]}", "{'v': {'$numberDouble': 'NaN'}}");
	ok("{'$pow': [2, 31]}", "{'v': {'$numberLong': '2147483648'}}");
	ok("{'$pow': [2, 64]}", "{'v': 1.8446744073709552e+19}");
	ok("{'$pow': [{'$numberLong': '2'}, 3]}", "{'v': {'$numberLong': '8'}}");
	ok("{'$pow': [-1, 7]}", "{'v': -1}");
	ok("{'$pow': [0, 0]}", "{'v': 1}");
	err("{'$pow': [0, -1]}", 28764, "$pow cannot take a base of 0 and a negative exponent");
	err("{'$pow': ['a', 1]}", 28762, NULL);
	err("{'$pow': [1, 'a']}", 28763, NULL);
	err("{'$sqrt': -1}", 28714, "$sqrt's argument must be greater than or equal to 0");
	err("{'$ln': 0}", 28766, "$ln's argument must be a positive number, but is 0");
	err("{'$log10': -1}", 28761, NULL);
	err("{'$log': [-1, 10]}", 28758, NULL);
	err("{'$log': [10, 1]}", 28759, NULL);
	err("{'$log': ['a', 10]}", 28756, NULL);
	err("{'$log': [10, 'a']}", 28757, NULL);
	err("{'$exp': 'a'}", 28765, "$exp only supports numeric types, not string");
	err("{'$sqrt': {'$numberDecimal': '4'}}", 238, NULL);
	ok("{'$isNumber': 1}", "{'v': true}");
	ok("{'$isNumber': {'$numberDecimal': '1'}}", "{'v': true}");
	ok("{'$isNumber': '1'}", "{'v': false}");
	ok("{'$isNumber': '$missing'}", "{'v': false}");
	err("{'$sqrt': [1, 2]}", 16020, NULL);
}

static void test_strings(void **state)
{
	(void)state;
	ok("{'$split': ['June-15-2013', '-']}", "{'v': ['June', '15', '2013']}");
	ok("{'$split': ['a,b,', ',']}", "{'v': ['a', 'b', '']}");
	ok("{'$split': [null, ',']}", "{'v': null}");
	err("{'$split': ['a', '']}", 40087, "$split requires a non-empty separator");
	err("{'$split': [1, ',']}", 40085, NULL);
	err("{'$split': ['a', 1]}", 40086, NULL);
	ok("{'$trim': {'input': '  \\t ggggoodbyeeee\\n '}}", "{'v': 'ggggoodbyeeee'}");
	ok("{'$trim': {'input': 'ggggoodbyeeee', 'chars': 'ge'}}", "{'v': 'oodby'}");
	ok("{'$ltrim': {'input': '  x  '}}", "{'v': 'x  '}");
	ok("{'$rtrim': {'input': '  x  '}}", "{'v': '  x'}");
	ok("{'$trim': {'input': '\\u00a0x\\u2000'}}", "{'v': 'x'}");
	ok("{'$trim': {'input': 'éaé', 'chars': 'é'}}", "{'v': 'a'}");
	ok("{'$trim': {'input': null}}", "{'v': null}");
	ok("{'$trim': {'input': 'x', 'chars': null}}", "{'v': null}");
	err("{'$trim': {'input': 1}}", 50699, "$trim requires its input to be a string, got 1 (of type int) instead.");
	err("{'$trim': {'input': 'x', 'chars': 1}}", 50700, NULL);
	err("{'$trim': {'chars': 'x'}}", 50695, "$trim requires an 'input' field");
	err("{'$trim': {'input': 'x', 'y': 1}}", 50694, "$trim found an unknown argument: y");
	err("{'$trim': 'x'}", 50696, NULL);
	ok("{'$indexOfBytes': ['cafeteria', 'e']}", "{'v': 3}");
	ok("{'$indexOfBytes': ['cafétéria', 'é']}", "{'v': 3}");
	ok("{'$indexOfBytes': ['cafétéria', 't']}", "{'v': 5}");
	ok("{'$indexOfBytes': ['foo.bar.fi', '.', 5]}", "{'v': 7}");
	ok("{'$indexOfBytes': ['vanilla', 'll', 0, 2]}", "{'v': -1}");
	err("{'$indexOfBytes': ['vanilla', 'll', -1]}", 40097, NULL);
	ok("{'$indexOfBytes': [null, 'a']}", "{'v': null}");
	ok("{'$indexOfBytes': ['abc', '', 3]}", "{'v': 3}");
	ok("{'$indexOfBytes': ['abc', 'b', 5]}", "{'v': -1}");
	ok("{'$indexOfCP': ['cafétéria', 'é']}", "{'v': 3}");
	ok("{'$indexOfCP': ['cafétéria', 't']}", "{'v': 4}");
	ok("{'$indexOfCP': ['cafétéria', 'a', 2]}", "{'v': 8}");
	err("{'$indexOfCP': [1, 'a']}", 40093, NULL);
	err("{'$indexOfCP': ['a', 1]}", 40094, NULL);
	err("{'$indexOfCP': ['a', 'a', 1.5]}", 40096, NULL);
	ok("{'$strLenCP': 'cafétéria'}", "{'v': 9}");
	ok("{'$strLenCP': '$s'}", "{'v': 11}");
	ok("{'$strLenCP': ''}", "{'v': 0}");
	err("{'$strLenCP': 1}", 34471, "$strLenCP requires a string argument, found: int");
	ok("{'$substrCP': ['cafétéria', 0, 5]}", "{'v': 'cafét'}");
	ok("{'$substrCP': ['cafétéria', 5, 4]}", "{'v': 'éria'}");
	ok("{'$substrCP': ['cafétéria', 7, 3]}", "{'v': 'ia'}");
	ok("{'$substrCP': ['cafétéria', 100, 3]}", "{'v': ''}");
	ok("{'$substrCP': [null, 0, 3]}", "{'v': ''}");
	ok("{'$substrCP': [12345, 1, 2]}", "{'v': '23'}");
	err("{'$substrCP': ['abc', -1, 2]}", 34455, NULL);
	err("{'$substrCP': ['abc', 0, -1]}", 34454, NULL);
	err("{'$substrCP': ['abc', 'a', 1]}", 34450, NULL);
	err("{'$substrCP': ['abc', 0.5, 1]}", 34451, NULL);
	err("{'$substrCP': ['abc', 0, 'a']}", 34452, NULL);
	err("{'$substrCP': ['abc', 0, 1e10]}", 34453, NULL);
	ok("{'$strcasecmp': ['ABC', 'abc']}", "{'v': 0}");
	ok("{'$strcasecmp': ['abd', 'ABC']}", "{'v': 1}");
	ok("{'$strcasecmp': ['ab', 'abc']}", "{'v': -1}");
	ok("{'$strcasecmp': [null, '']}", "{'v': 0}");
	ok("{'$replaceOne': {'input': 'blue paint', 'find': 'blue', 'replacement': 'red'}}",
	   "{'v': 'red paint'}");
	ok("{'$replaceOne': {'input': 'a.b.c', 'find': '.', 'replacement': '-'}}", "{'v': 'a-b.c'}");
	ok("{'$replaceAll': {'input': 'a.b.c', 'find': '.', 'replacement': '-'}}", "{'v': 'a-b-c'}");
	ok("{'$replaceAll': {'input': 'aaa', 'find': 'aa', 'replacement': 'b'}}", "{'v': 'ba'}");
	ok("{'$replaceAll': {'input': 'x', 'find': null, 'replacement': 'b'}}", "{'v': null}");
	err("{'$replaceAll': {'input': 1, 'find': 'a', 'replacement': 'b'}}", 51746, NULL);
	err("{'$replaceAll': {'input': 'a', 'find': 1, 'replacement': 'b'}}", 51745, NULL);
	err("{'$replaceAll': {'input': 'a', 'find': 'a', 'replacement': 1}}", 51744, NULL);
	err("{'$replaceOne': {'input': 'a', 'find': 'a'}}", 51747, NULL);
	err("{'$replaceOne': {'input': 'a', 'replacement': 'a'}}", 51748, NULL);
	err("{'$replaceOne': {'find': 'a', 'replacement': 'a'}}", 51749, NULL);
	err("{'$replaceOne': {'input': 'a', 'find': 'a', 'replacement': 'a', 'x': 1}}", 51750, NULL);
	err("{'$replaceOne': 1}", 51751, NULL);
}

static void test_regex(void **state)
{
	(void)state;
	ok("{'$regexMatch': {'input': 'Single LINE description.', 'regex': 'line', 'options': 'i'}}",
	   "{'v': true}");
	ok("{'$regexMatch': {'input': 'Single LINE description.', 'regex': 'line'}}", "{'v': false}");
	ok("{'$regexMatch': {'input': 'abc', 'regex': {'$regularExpression': {'pattern': 'B', 'options': 'i'}}}}",
	   "{'v': true}");
	ok("{'$regexMatch': {'input': null, 'regex': 'a'}}", "{'v': false}");
	ok("{'$regexFind': {'input': 'cafétéria', 'regex': 't(é)'}}",
	   "{'v': {'match': 'té', 'idx': 4, 'captures': ['é']}}");
	ok("{'$regexFind': {'input': 'abc', 'regex': 'x'}}", "{'v': null}");
	ok("{'$regexFind': {'input': 'ab', 'regex': '(x)?b'}}",
	   "{'v': {'match': 'b', 'idx': 1, 'captures': [null]}}");
	ok("{'$regexFindAll': {'input': 'a1b22c333', 'regex': '[0-9]+'}}",
	   "{'v': [{'match': '1', 'idx': 1, 'captures': []}, {'match': '22', 'idx': 3, 'captures': []},"
	   " {'match': '333', 'idx': 6, 'captures': []}]}");
	ok("{'$regexFindAll': {'input': 'éa', 'regex': ''}}",
	   "{'v': [{'match': '', 'idx': 0, 'captures': []}, {'match': '', 'idx': 1, 'captures': []},"
	   " {'match': '', 'idx': 2, 'captures': []}]}");
	ok("{'$regexFindAll': {'input': null, 'regex': 'a'}}", "{'v': []}");
	err("{'$regexMatch': {'input': 1, 'regex': 'a'}}", 51104, NULL);
	err("{'$regexMatch': {'input': 'a', 'regex': 1}}", 51105, NULL);
	err("{'$regexMatch': {'input': 'a', 'regex': 'a', 'options': 1}}", 51106, NULL);
	err("{'$regexMatch': {'input': 'a', 'regex': {'$regularExpression': {'pattern': 'a', 'options': 'i'}}, 'options': 'm'}}",
	    51107, NULL);
	err("{'$regexMatch': {'input': 'a', 'regex': 'a', 'options': 'z'}}", 51108,
	    "$regexMatch invalid flag in regex options: z");
	err("{'$regexMatch': {'input': 'a', 'regex': '('}}", 51111, "Invalid Regex in $regexMatch");
	err("{'$regexMatch': {'regex': 'a'}}", 31022, NULL);
	err("{'$regexMatch': {'input': 'a'}}", 31023, NULL);
	err("{'$regexMatch': {'input': 'a', 'regex': 'a', 'z': 1}}", 31024, NULL);
	err("{'$regexMatch': 'a'}", 51103, NULL);
	/* catastrophic backtracking hits the match limit: an error, never a hang */
	err("{'$regexMatch': {'input': 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!', 'regex': '^(a+)+$'}}",
	    51156, NULL);
}

static void test_convert(void **state)
{
	(void)state;
	ok("{'$toInt': 2.5}", "{'v': 2}");
	ok("{'$toInt': -2.5}", "{'v': -2}");
	ok("{'$toInt': true}", "{'v': 1}");
	ok("{'$toInt': '-5'}", "{'v': -5}");
	ok("{'$toInt': {'$numberDecimal': '-5.5'}}", "{'v': -5}");
	ok("{'$toInt': null}", "{'v': null}");
	ok("{'$toInt': '$missing'}", "{'v': null}");
	err("{'$toInt': 1e10}", 241, "Conversion would overflow target type in $convert with no onError value");
	err("{'$toInt': {'$numberLong': '2147483648'}}", 241, NULL);
	err("{'$toInt': {'$numberDouble': 'NaN'}}", 241, "Attempt to convert NaN value to integer type");
	err("{'$toInt': {'$numberDouble': 'Infinity'}}", 241, "Attempt to convert infinity value");
	err("{'$toInt': '2.5'}", 241, "Failed to parse number '2.5' in $convert with no onError value");
	err("{'$toInt': '99999999999'}", 241, NULL);
	err("{'$toInt': ''}", 241, NULL);
	err("{'$toInt': '$d'}", 241, "Unsupported conversion from date to int in $convert with no onError value");
	ok("{'$toLong': '$d'}", "{'v': {'$numberLong': '1388564139736'}}");
	ok("{'$toLong': '9223372036854775807'}", "{'v': {'$numberLong': '9223372036854775807'}}");
	err("{'$toLong': '9223372036854775808'}", 241, NULL);
	err("{'$toLong': 1e19}", 241, NULL);
	ok("{'$toLong': -9.2233720368547758e18}", "{'v': {'$numberLong': '-9223372036854775808'}}");
	ok("{'$toDouble': '5.5'}", "{'v': 5.5}");
	ok("{'$toDouble': '-1e3'}", "{'v': -1000.0}");
	ok("{'$toDouble': false}", "{'v': 0.0}");
	ok("{'$toDouble': {'$numberDecimal': '2.5'}}", "{'v': 2.5}");
	err("{'$toDouble': {'$numberDecimal': '1E+400'}}", 241, NULL);
	err("{'$toDouble': '5.5x'}", 241, NULL);
	err("{'$toDouble': ' 5'}", 241, NULL);
	ok("{'$toDecimal': 2.5}", "{'v': {'$numberDecimal': '2.50000000000000'}}");
	ok("{'$toDecimal': '1.0001'}", "{'v': {'$numberDecimal': '1.0001'}}");
	ok("{'$toDecimal': true}", "{'v': {'$numberDecimal': '1'}}");
	err("{'$toDecimal': 'abc'}", 241, NULL);
	ok("{'$toBool': 0}", "{'v': false}");
	ok("{'$toBool': {'$numberDecimal': '-0'}}", "{'v': false}");
	ok("{'$toBool': 'false'}", "{'v': true}");
	ok("{'$toBool': ''}", "{'v': true}");
	ok("{'$toBool': {'$numberDouble': 'NaN'}}", "{'v': true}");
	ok("{'$toBool': {'a': 1}}", "{'v': true}");
	ok("{'$toString': 2.5}", "{'v': '2.5'}");
	ok("{'$toString': 0.1}", "{'v': '0.1'}");
	ok("{'$toString': {'$numberLong': '5'}}", "{'v': '5'}");
	ok("{'$toString': '$d'}", "{'v': '2014-01-01T08:15:39.736Z'}");
	ok("{'$toString': '$old'}", "{'v': '1899-12-31T23:59:59.999Z'}");
	ok("{'$toString': {'$oid': '5ab9cbfa31c2ab715d42129e'}}", "{'v': '5ab9cbfa31c2ab715d42129e'}");
	ok("{'$toString': null}", "{'v': null}");
	err("{'$toString': {'a': 1}}", 241, "Unsupported conversion from object to string");
	ok("{'$toObjectId': '5ab9cbfa31c2ab715d42129e'}", "{'v': {'$oid': '5ab9cbfa31c2ab715d42129e'}}");
	err("{'$toObjectId': '5ab9cbfa31c2ab715d42129'}", 241,
	    "Invalid string length for parsing to OID, expected 24 but found 23");
	err("{'$toObjectId': '5ab9cbfa31c2ab715d42129z'}", 241, NULL);
	ok("{'$toDate': {'$numberLong': '1388564139736'}}", "{'v': {'$date': '2014-01-01T08:15:39.736Z'}}");
	ok("{'$toDate': 1388564139736.9}", "{'v': {'$date': '2014-01-01T08:15:39.736Z'}}");
	ok("{'$toDate': '2018-03-03'}", "{'v': {'$date': '2018-03-03T00:00:00Z'}}");
	ok("{'$toDate': '2018-03-20 11:00:06 +0500'}", "{'v': {'$date': '2018-03-20T06:00:06Z'}}");
	ok("{'$toDate': '2018-03-20T11:00:06.575Z'}", "{'v': {'$date': '2018-03-20T11:00:06.575Z'}}");
	ok("{'$toDate': {'$oid': '5ab9cbfa31c2ab715d42129e'}}", "{'v': {'$date': '2018-03-27T04:43:38Z'}}");
	err("{'$toDate': 5}", 241, "Unsupported conversion from int to date");
	err("{'$toDate': 'not a date'}", 241, "Error parsing date string");
	err("{'$toDate': '2018-02-30'}", 241, NULL);
	/* $convert */
	ok("{'$convert': {'input': '5', 'to': 'int'}}", "{'v': 5}");
	ok("{'$convert': {'input': '5', 'to': 16}}", "{'v': 5}");
	ok("{'$convert': {'input': 'x', 'to': 'int', 'onError': 'bad'}}", "{'v': 'bad'}");
	ok("{'$convert': {'input': null, 'to': 'int', 'onNull': 0}}", "{'v': 0}");
	ok("{'$convert': {'input': '$missing', 'to': 'int', 'onNull': '$missing'}}", "{}");
	ok("{'$convert': {'input': 1, 'to': null}}", "{'v': null}");
	ok("{'$convert': {'input': 1, 'to': 'array', 'onError': 'no'}}", "{'v': 'no'}");
	err("{'$convert': {'input': 1, 'to': 'array'}}", 241, "Unsupported conversion from int to array");
	err("{'$convert': {'input': 1, 'to': 'foo', 'onError': 0}}", 2, "Unknown type name: foo");
	err("{'$convert': {'input': 1, 'to': 1.5}}", 9, NULL);
	err("{'$convert': {'input': 1, 'to': 99}}", 9, NULL);
	err("{'$convert': {'input': 1, 'to': {}}}", 9, NULL);
	err("{'$convert': {'input': 1}}", 9, "Missing 'to' parameter to $convert");
	err("{'$convert': {'to': 'int'}}", 9, "Missing 'input' parameter to $convert");
	err("{'$convert': {'input': 1, 'to': 'int', 'x': 1}}", 9, "$convert found an unknown argument: x");
	err("{'$convert': 1}", 9, NULL);
}

static void test_dates(void **state)
{
	(void)state;
	/* MongoDB manual: ISODate("2014-01-01T08:15:39.736Z") */
	ok("{'$year': '$d'}", "{'v': 2014}");
	ok("{'$month': '$d'}", "{'v': 1}");
	ok("{'$dayOfMonth': '$d'}", "{'v': 1}");
	ok("{'$hour': '$d'}", "{'v': 8}");
	ok("{'$minute': '$d'}", "{'v': 15}");
	ok("{'$second': '$d'}", "{'v': 39}");
	ok("{'$millisecond': '$d'}", "{'v': 736}");
	ok("{'$dayOfYear': '$d'}", "{'v': 1}");
	ok("{'$dayOfWeek': '$d'}", "{'v': 4}");
	ok("{'$week': '$d'}", "{'v': 0}");
	ok("{'$isoWeek': '$d'}", "{'v': 1}");
	ok("{'$isoWeekYear': '$d'}", "{'v': 2014}");
	ok("{'$isoDayOfWeek': '$d'}", "{'v': 3}");
	ok("{'$hour': {'date': '$d', 'timezone': '+05:30'}}", "{'v': 13}");
	ok("{'$minute': {'date': '$d', 'timezone': '-0130'}}", "{'v': 45}");
	ok("{'$hour': {'date': '$d', 'timezone': 'UTC'}}", "{'v': 8}");
	ok("{'$year': ['$d']}", "{'v': 2014}");
	ok("{'$year': null}", "{'v': null}");
	ok("{'$year': {'date': '$d', 'timezone': null}}", "{'v': null}");
	ok("{'$year': {'$oid': '5ab9cbfa31c2ab715d42129e'}}", "{'v': 2018}");
	/* before 1970 */
	ok("{'$year': '$old'}", "{'v': 1899}");
	ok("{'$dayOfWeek': '$old'}", "{'v': 1}");
	ok("{'$millisecond': '$old'}", "{'v': 999}");
	/* ISO weeks across year boundaries */
	ok("{'$isoWeek': {'$toDate': '2021-01-03'}}", "{'v': 53}");
	ok("{'$isoWeekYear': {'$toDate': '2021-01-03'}}", "{'v': 2020}");
	ok("{'$isoWeek': {'$toDate': '2019-12-30'}}", "{'v': 1}");
	ok("{'$isoWeekYear': {'$toDate': '2019-12-30'}}", "{'v': 2020}");
	ok("{'$isoWeek': {'$toDate': '2016-01-01'}}", "{'v': 53}");
	ok("{'$week': {'$toDate': '2016-12-31'}}", "{'v': 52}");
	/* far future */
	ok("{'$year': {'$toDate': {'$numberLong': '253402300800000'}}}", "{'v': 10000}");
	err("{'$year': 'x'}", 16006, "can't convert from BSON type string to Date");
	err("{'$year': {'date': '$d', 'timezone': 'America/New_York'}}", 238, NULL);
	err("{'$year': {'date': '$d', 'timezone': '+5:3'}}", 40485, NULL);
	/* offsets as mongod 6.0's parseUtcOffset: any two digits (no range check: +24:00 is a
	 * day ahead, +00:99 is 1 h 39 min), every other shape refused */
	ok("{'$dayOfMonth': {'date': '$d', 'timezone': '+24:00'}}", "{'v': 2}");
	ok("{'$hour': {'date': '$d', 'timezone': '+24:00'}}", "{'v': 8}");
	ok("{'$minute': {'date': '$d', 'timezone': '+00:99'}}", "{'v': 54}");
	ok("{'$dayOfMonth': {'date': '$d', 'timezone': '-99'}}", "{'v': 28}");
	ok("{'$hour': {'date': '$d', 'timezone': '-99'}}", "{'v': 5}");
	err("{'$year': {'date': '$d', 'timezone': '+1'}}", 40485,
	    "unrecognized time zone identifier: \"+1\"");
	err("{'$year': {'date': '$d', 'timezone': '+123'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': '+12:3'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': '+12-30'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': '+12:345'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': '24:00'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': '+ab'}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': ''}}", 40485, NULL);
	err("{'$year': {'date': '$d', 'timezone': 5}}", 40517, NULL);
	err("{'$year': {'date': '$d', 'zone': 5}}", 40535, NULL);
	err("{'$year': {'timezone': 'UTC'}}", 40539, NULL);
	err("{'$year': ['$d', '$d']}", 40536, NULL);
	ok("{'$dateToString': {'date': '$d', 'format': '%Y-%m-%d'}}", "{'v': '2014-01-01'}");
	ok("{'$dateToString': {'date': '$d', 'format': '%H:%M:%S:%L%z', 'timezone': '+04:30'}}",
	   "{'v': '12:45:39:736+0430'}");
	ok("{'$dateToString': {'date': '$d', 'format': '%Z', 'timezone': '+04:30'}}", "{'v': '270'}");
	/* the last day above Date(-2^63 ms) (Java's Long.MIN_VALUE): no overflow splitting it
	 * into days (UBSan stopped the shard, and a replicated update pipeline every member) */
	ok("{'$year': {'$toDate': {'$numberLong': '-9223372036854775808'}}}",
	   "{'v': -292275055}");
	ok("{'$year': {'date': {'$toDate': {'$numberLong': '-9223372036854775808'}}, "
	   "'timezone': '-23:59'}}",
	   "{'v': -292275055}");
	ok("{'$dateDiff': {'startDate': {'$toDate': {'$numberLong': '-9223372036854775808'}}, "
	   "'endDate': {'$toDate': {'$numberLong': '9223372036854775807'}}, 'unit': 'year'}}",
	   "{'v': {'$numberLong': '584554049'}}");
	/* %Z is unpadded minutes (date_time_support.h) */
	ok("{'$dateToString': {'date': '$d', 'format': '%Z', 'timezone': 'UTC'}}", "{'v': '0'}");
	ok("{'$dateToString': {'date': '$d', 'format': '%Z', 'timezone': '-01:00'}}", "{'v': '-60'}");
	ok("{'$dateToString': {'date': '$d', 'format': '%j %w %u %U %V %G %%'}}",
	   "{'v': '001 4 3 00 01 2014 %'}");
	ok("{'$dateToString': {'date': '$d'}}", "{'v': '2014-01-01T08:15:39.736Z'}");
	ok("{'$dateToString': {'date': '$missing', 'onNull': 'none'}}", "{'v': 'none'}");
	ok("{'$dateToString': {'date': null}}", "{'v': null}");
	err("{'$dateToString': {'date': '$d', 'format': '%Q'}}", 18536, "Invalid format character '%Q' in format string");
	err("{'$dateToString': {'date': '$d', 'format': 'abc%'}}", 18535, NULL);
	err("{'$dateToString': {'date': '$d', 'format': 1}}", 18533, NULL);
	err("{'$dateToString': {'format': '%Y'}}", 18628, NULL);
	err("{'$dateToString': {'date': '$d', 'x': 1}}", 18534, NULL);
	err("{'$dateToString': '$d'}", 18629, NULL);
	err("{'$dateToString': {'date': {'$toDate': {'$numberLong': '253402300800000'}}, 'format': '%Y'}}",
	    18537, NULL);
	ok("{'$dateToParts': {'date': '$d'}}",
	   "{'v': {'year': 2014, 'month': 1, 'day': 1, 'hour': 8, 'minute': 15, 'second': 39, 'millisecond': 736}}");
	ok("{'$dateToParts': {'date': '$d', 'iso8601': true}}",
	   "{'v': {'isoWeekYear': 2014, 'isoWeek': 1, 'isoDayOfWeek': 3, 'hour': 8, 'minute': 15, 'second': 39, 'millisecond': 736}}");
	err("{'$dateToParts': {'date': '$d', 'iso8601': 1}}", 40521, NULL);
}


static void test_date_build(void **state)
{
	(void)state;
	ok("{'$dateFromParts': {'year': 2017, 'month': 2, 'day': 8, 'hour': 12}}",
	   "{'v': {'$date': '2017-02-08T12:00:00Z'}}");
	ok("{'$dateFromParts': {'isoWeekYear': 2017, 'isoWeek': 6, 'isoDayOfWeek': 3, 'hour': 12}}",
	   "{'v': {'$date': '2017-02-08T12:00:00Z'}}");
	ok("{'$dateFromParts': {'year': 2017, 'month': 2, 'day': 8, 'hour': 12, 'timezone': '+05:30'}}",
	   "{'v': {'$date': '2017-02-08T06:30:00Z'}}");
	ok("{'$dateFromParts': {'year': 2017, 'month': 14, 'day': 1}}", "{'v': {'$date': '2018-02-01T00:00:00Z'}}");
	ok("{'$dateFromParts': {'year': 2017, 'month': 3, 'day': 0}}", "{'v': {'$date': '2017-02-28T00:00:00Z'}}");
	ok("{'$dateFromParts': {'year': 1900, 'millisecond': -1}}", "{'v': {'$date': {'$numberLong': '-2208988800001'}}}");
	ok("{'$dateFromParts': {'year': 2017, 'month': null}}", "{'v': null}");
	err("{'$dateFromParts': {'year': 10000}}", 40523, "'year' must evaluate to an integer in the range 1 to 9999, found 10000");
	err("{'$dateFromParts': {'year': 2017, 'month': 32768}}", 31034, NULL);
	err("{'$dateFromParts': {'year': 2017.5}}", 40515, NULL);
	err("{'$dateFromParts': {'isoWeekYear': 0}}", 31095, NULL);
	err("{'$dateFromParts': {'year': 2017, 'isoWeek': 1}}", 40489, NULL);
	err("{'$dateFromParts': {'month': 1}}", 40516, NULL);
	err("{'$dateFromParts': {'year': 2017, 'x': 1}}", 40518, NULL);
	err("{'$dateFromParts': 1}", 40519, NULL);
	ok("{'$dateFromString': {'dateString': '2017-02-08T12:10:40.787', 'timezone': '+05:00'}}",
	   "{'v': {'$date': '2017-02-08T07:10:40.787Z'}}");
	ok("{'$dateFromString': {'dateString': '2017-02-08T12:10:40.787Z'}}",
	   "{'v': {'$date': '2017-02-08T12:10:40.787Z'}}");
	ok("{'$dateFromString': {'dateString': '15-06-2018', 'format': '%d-%m-%Y'}}",
	   "{'v': {'$date': '2018-06-15T00:00:00Z'}}");
	ok("{'$dateFromString': {'dateString': '2018/06/15 10:20:30.5 +0100', 'format': '%Y/%m/%d %H:%M:%S.%L %z'}}",
	   "{'v': {'$date': '2018-06-15T09:20:30.500Z'}}");
	ok("{'$dateFromString': {'dateString': 'garbage', 'onError': 'bad'}}", "{'v': 'bad'}");
	ok("{'$dateFromString': {'dateString': null, 'onNull': 'none'}}", "{'v': 'none'}");
	ok("{'$dateFromString': {'dateString': 5, 'onError': 'bad'}}", "{'v': 'bad'}");
	err("{'$dateFromString': {'dateString': 'garbage'}}", 241, "Error parsing date string 'garbage'");
	err("{'$dateFromString': {'dateString': '2017-02-08Z', 'format': '%Y-%m-%dZ%G'}}", 241, NULL);
	err("{'$dateFromString': {'dateString': '2017-02-08T00:00Z', 'timezone': '+01:00'}}", 241, NULL);
	err("{'$dateFromString': {'dateString': 'x', 'format': 1}}", 40684, NULL);
	err("{'$dateFromString': {'format': '%Y'}}", 40542, NULL);
	err("{'$dateFromString': {'dateString': 'x', 'y': 1}}", 40541, NULL);
	err("{'$dateFromString': 'x'}", 40540, NULL);
}

static void test_date_arith(void **state)
{
	(void)state;
	ok("{'$dateAdd': {'startDate': {'$toDate': '2020-01-31'}, 'unit': 'month', 'amount': 1}}",
	   "{'v': {'$date': '2020-02-29T00:00:00Z'}}");
	ok("{'$dateAdd': {'startDate': {'$toDate': '2021-03-31T10:00:00Z'}, 'unit': 'quarter', 'amount': -1}}",
	   "{'v': {'$date': '2020-12-31T10:00:00Z'}}");
	ok("{'$dateAdd': {'startDate': '$d', 'unit': 'day', 'amount': 3}}", "{'v': {'$date': '2014-01-04T08:15:39.736Z'}}");
	ok("{'$dateAdd': {'startDate': '$d', 'unit': 'year', 'amount': {'$numberLong': '-200'}}}",
	   "{'v': {'$date': '1814-01-01T08:15:39.736Z'}}");
	ok("{'$dateSubtract': {'startDate': '$d', 'unit': 'hour', 'amount': 9}}",
	   "{'v': {'$date': '2013-12-31T23:15:39.736Z'}}");
	ok("{'$dateAdd': {'startDate': '$d', 'unit': 'month', 'amount': 1, 'timezone': '-10:00'}}",
	   "{'v': {'$date': '2014-02-01T08:15:39.736Z'}}"); /* 2013-12-31T22:15 local + 1 month */
	ok("{'$dateAdd': {'startDate': null, 'unit': 'day', 'amount': 1}}", "{'v': null}");
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'day', 'amount': 1.5}}", 5166405, NULL);
	err("{'$dateAdd': {'startDate': 'x', 'unit': 'day', 'amount': 1}}", 5166403, NULL);
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'days', 'amount': 1}}", 9, "unknown time unit value: days");
	err("{'$dateAdd': {'startDate': '$d', 'unit': 1, 'amount': 1}}", 5439013, NULL);
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'millisecond', 'amount': {'$numberLong': '9223372036854775807'}}}",
	    5166406, NULL);
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'year', 'amount': {'$numberLong': '9223372036854775807'}}}",
	    5166406, NULL);
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'day'}}", 5166402, NULL);
	err("{'$dateAdd': {'startDate': '$d', 'unit': 'day', 'amount': 1, 'x': 1}}", 5166401, NULL);
	err("{'$dateSubtract': 1}", 5166400, NULL);
	ok("{'$dateDiff': {'startDate': {'$toDate': '2021-01-01'}, 'endDate': {'$toDate': '2021-12-31T23:00:00Z'}, 'unit': 'year'}}",
	   "{'v': {'$numberLong': '0'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2021-01-01'}, 'endDate': {'$toDate': '2021-12-31T23:00:00Z'}, 'unit': 'month'}}",
	   "{'v': {'$numberLong': '11'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2021-01-01'}, 'endDate': {'$toDate': '2021-12-31T23:00:00Z'}, 'unit': 'day'}}",
	   "{'v': {'$numberLong': '364'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2022-01-01'}, 'endDate': {'$toDate': '2022-01-02'}, 'unit': 'week'}}",
	   "{'v': {'$numberLong': '1'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2022-01-01'}, 'endDate': {'$toDate': '2022-01-02'}, 'unit': 'week', 'startOfWeek': 'MON'}}",
	   "{'v': {'$numberLong': '0'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2021-12-31T23:00:00Z'}, 'endDate': {'$toDate': '2022-01-01T01:00:00Z'}, 'unit': 'quarter'}}",
	   "{'v': {'$numberLong': '1'}}");
	ok("{'$dateDiff': {'startDate': {'$toDate': '2021-12-31T23:00:00Z'}, 'endDate': {'$toDate': '2022-01-01T01:00:00Z'}, 'unit': 'year', 'timezone': '-05:00'}}",
	   "{'v': {'$numberLong': '0'}}");
	ok("{'$dateDiff': {'startDate': '$d', 'endDate': '$old', 'unit': 'millisecond'}}",
	   "{'v': {'$numberLong': '-3597552939737'}}");
	ok("{'$dateDiff': {'startDate': '$d', 'endDate': null, 'unit': 'day'}}", "{'v': null}");
	err("{'$dateDiff': {'startDate': 1, 'endDate': '$d', 'unit': 'day'}}", 5166307, NULL);
	err("{'$dateDiff': {'startDate': '$d', 'endDate': '$d', 'unit': 'week', 'startOfWeek': 'funday'}}", 5439016, NULL);
	err("{'$dateDiff': {'endDate': '$d', 'unit': 'day'}}", 5166303, NULL);
	err("{'$dateDiff': {'startDate': '$d', 'unit': 'day'}}", 5166304, NULL);
	err("{'$dateDiff': {'startDate': '$d', 'endDate': '$d'}}", 5166305, NULL);
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'month'}}",
	   "{'v': {'$date': '2021-03-01T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'week', 'startOfWeek': 'monday'}}",
	   "{'v': {'$date': '2021-03-15T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'week'}}",
	   "{'v': {'$date': '2021-03-14T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'hour', 'binSize': 2}}",
	   "{'v': {'$date': '2021-03-20T10:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'quarter'}}",
	   "{'v': {'$date': '2021-01-01T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T11:30:05Z'}, 'unit': 'year', 'binSize': 5}}",
	   "{'v': {'$date': '2020-01-01T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': {'$toDate': '2021-03-20T01:30:05Z'}, 'unit': 'day', 'timezone': '+05:00'}}",
	   "{'v': {'$date': '2021-03-19T19:00:00Z'}}");
	ok("{'$dateTrunc': {'date': '$old', 'unit': 'second'}}", "{'v': {'$date': {'$numberLong': '-2208988801000'}}}");
	ok("{'$dateTrunc': {'date': '$d', 'unit': 'day', 'binSize': {'$numberLong': '9223372036854775807'}}}",
	   "{'v': {'$date': '2000-01-01T00:00:00Z'}}");
	ok("{'$dateTrunc': {'date': null, 'unit': 'day'}}", "{'v': null}");
	err("{'$dateTrunc': {'date': '$d', 'unit': 'day', 'binSize': 0}}", 5439018, NULL);
	err("{'$dateTrunc': {'date': '$d', 'unit': 'day', 'binSize': 'x'}}", 5439017, NULL);
	err("{'$dateTrunc': {'date': '$d', 'unit': 'week', 'startOfWeek': 1}}", 5439015, NULL);
	err("{'$dateTrunc': {'unit': 'day'}}", 5439009, NULL);
	err("{'$dateTrunc': {'date': '$d'}}", 5439010, NULL);
	err("{'$dateTrunc': {'date': '$d', 'unit': 'day', 'x': 1}}", 5439008, NULL);
	err("{'$dateTrunc': 1}", 5439007, NULL);
}


/* Results that would outgrow a BSON document are refused (10334) quickly, and searches are
 * linear: a 2 MB input never hangs the shard nor holds gigabytes. */
static void test_big_inputs(void **state)
{
	size_t n = 2 * 1024 * 1024;
	char *big = malloc(n + 1);
	bson_t doc = BSON_INITIALIZER, *x, out;
	bson_iter_t it;
	char errmsg[256];
	static const struct {
		const char *expr;
		int code;
	} cases[] = {
		{"{'e': {'$split': ['$b', ',']}}", 10334},
		{"{'e': {'$regexFindAll': {'input': '$b', 'regex': ''}}}", 10334},
		{"{'e': {'$replaceAll': {'input': '$b', 'find': '', 'replacement': '$b'}}}", 10334},
		{"{'e': {'$replaceAll': {'input': '$b', 'find': ',', 'replacement': '$b'}}}", 10334},
		{"{'e': {'$indexOfBytes': ['$b', {'$concat': ['$h', 'x']}]}}", 0},
		{"{'e': {'$indexOfCP': ['$b', {'$concat': ['$h', 'x']}]}}", 0},
		{"{'e': {'$strLenCP': '$b'}}", 0},
	};

	(void)state;
	memset(big, ',', n);
	big[n] = '\0';
	bson_append_utf8(&doc, "b", 1, big, (int)n);
	bson_append_utf8(&doc, "h", 1, big, (int)(n / 2));
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int code = 0;

		x = J(cases[i].expr);
		assert_true(bson_iter_init_find(&it, x, "e"));
		(void)sdb_pipeline_eval_expr(&it, &doc, &out, &code, errmsg, sizeof errmsg);
		if (code != cases[i].code) {
			fail_msg("%s: code %d (%s), want %d", cases[i].expr, code, errmsg, cases[i].code);
		}
		bson_destroy(&out);
		bson_destroy(x);
	}
	bson_destroy(&doc);
	free(big);
}

static void test_invalid_utf8(void **state)
{
	bson_t doc = BSON_INITIALIZER, *x;
	bson_iter_t it;
	bson_t out;
	char err[256];
	int code = 0;
	static const char bad[] = "a\xC3\xC3\x80\x80z\xE2";
	static const char *exprs[] = {
		"{'e': {'$strLenCP': '$b'}}",
		"{'e': {'$substrCP': ['$b', 1, 3]}}",
		"{'e': {'$indexOfCP': ['$b', 'z']}}",
		"{'e': {'$trim': {'input': '$b', 'chars': '$b'}}}",
		"{'e': {'$replaceAll': {'input': '$b', 'find': '', 'replacement': 'x'}}}",
		"{'e': {'$regexFindAll': {'input': '$b', 'regex': ''}}}",
		"{'e': {'$split': ['$b', '\\u00c3']}}",
	};

	(void)state;
	bson_append_utf8(&doc, "b", 1, bad, (int)sizeof bad - 1);
	for (size_t i = 0; i < sizeof exprs / sizeof exprs[0]; i++) {
		x = J(exprs[i]);
		assert_true(bson_iter_init_find(&it, x, "e"));
		/* any answer or error, never a crash (ASan) */
		(void)sdb_pipeline_eval_expr(&it, &doc, &out, &code, err, sizeof err);
		bson_destroy(&out);
		bson_destroy(x);
	}
	bson_destroy(&doc);
}

static void test_still_refused(void **state)
{
	(void)state;
	err("{'$function': {'body': 'x', 'args': [], 'lang': 'js'}}", 168, "Unrecognized expression '$function'");
	err("{'$sin': 1}", 168, "Unrecognized expression '$sin'");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trunc),
		cmocka_unit_test(test_math),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_regex),
		cmocka_unit_test(test_convert),
		cmocka_unit_test(test_dates),
		cmocka_unit_test(test_date_build),
		cmocka_unit_test(test_date_arith),
		cmocka_unit_test(test_big_inputs),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_still_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
