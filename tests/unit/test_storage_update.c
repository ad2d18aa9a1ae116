/* Unit tests of storage/update.c: MongoDB's documented examples for every update
 * operator, field order, error codes. Expected documents are compared as canonical
 * extended JSON strings, so types (int32 vs int64 vs double) and field order count. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/update.c"
#include "../../storage/update_apply.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/update.h"

/* Tests write JSON with single quotes; turn them into double quotes. */
static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++) {
		if (*p == '\'') {
			*p = '"';
		}
	}
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (b == NULL) {
		fail_msg("bad test JSON %s: %s", s, e.message);
	}
	free(s);
	return b;
}

static char *canon(const bson_t *b)
{
	return bson_as_canonical_extended_json(b, NULL);
}

static int64_t fixed_clock(void *ctx)
{
	return *(int64_t *)ctx;
}

static int64_t clock_value = 1700000000123;

/* Apply update (with optional arrayFilters / query) to doc; expect `want` (relaxed JSON of
 * the expected document) and the changed flag. */
static void check_full(const char *doc, const char *update, const char *filters, const char *query,
		       bool upsert, const char *want, bool want_changed)
{
	bson_t *d = J(doc), *u = J(update), *w = J(want);
	bson_t *f = filters != NULL ? J(filters) : NULL;
	bson_t *q = query != NULL ? J(query) : NULL;
	sdb_update_opts o = {.array_filters = f, .query = q, .clock = fixed_clock,
			     .clock_ctx = &clock_value};
	sdb_update *up = NULL;
	bson_t out;
	bool changed = false;
	int code = -1;
	char err[512] = "";
	int rc = sdb_update_parse(u, &o, &up, &code, err, sizeof err);

	if (rc != 0) {
		fail_msg("parse %s: code %d %s", update, code, err);
	}
	rc = sdb_update_apply(up, d, upsert, &out, &changed, &code, err, sizeof err);
	if (rc != 0) {
		fail_msg("apply %s: code %d %s", update, code, err);
	}
	char *got = canon(&out), *exp = canon(w);

	assert_string_equal(got, exp);
	assert_int_equal(changed, want_changed);
	bson_free(got);
	bson_free(exp);
	bson_destroy(&out);
	sdb_update_free(up);
	bson_destroy(d);
	bson_destroy(u);
	bson_destroy(w);
	if (f != NULL) {
		bson_destroy(f);
	}
	if (q != NULL) {
		bson_destroy(q);
	}
}

static void check(const char *doc, const char *update, const char *want)
{
	check_full(doc, update, NULL, NULL, false, want, true);
}

/* Expect an error code, at parse or at apply time. */
static void check_err(const char *doc, const char *update, const char *filters, int want_code,
		      const char *msg_part)
{
	bson_t *d = J(doc), *u = J(update);
	bson_t *f = filters != NULL ? J(filters) : NULL;
	sdb_update_opts o = {.array_filters = f};
	sdb_update *up = NULL;
	bson_t out;
	bool changed;
	int code = 0;
	char err[512] = "";
	int rc = sdb_update_parse(u, &o, &up, &code, err, sizeof err);

	if (rc == 0) {
		rc = sdb_update_apply(up, d, false, &out, &changed, &code, err, sizeof err);
		bson_destroy(&out);
	}
	assert_int_not_equal(rc, 0);
	if (code != want_code) {
		fail_msg("%s: want code %d, got %d (%s)", update, want_code, code, err);
	}
	if (msg_part != NULL && strstr(err, msg_part) == NULL) {
		fail_msg("message '%s' lacks '%s'", err, msg_part);
	}
	sdb_update_free(up);
	bson_destroy(d);
	bson_destroy(u);
	if (f != NULL) {
		bson_destroy(f);
	}
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/set/ */
static void test_set(void **state)
{
	/* top-level $-prefixed names are not storable (DollarPrefixedFieldName, 52); nested
	 * ones are (MongoDB 5.0+) */
	check_err("{'_id': 1}", "{'$set': {'$x': 1}}", NULL, 52, "'$x' in '$x' is not valid");
	check_err("{'_id': 1}", "{'$inc': {'$x.y': 1}}", NULL, 52, "'$x' in '$x.y'");
	check("{'_id': 1}", "{'$set': {'a.$b': 1}}", "{'_id': 1, 'a': {'$b': 1}}");
	(void)state;
	const char *doc = "{'_id': 100, 'quantity': 250, 'instock': true, 'reorder': false, "
			  "'details': {'model': '14QQ', 'make': 'Clothes Corp'}, "
			  "'tags': ['apparel', 'clothing'], 'ratings': [{'by': 'Customer007', 'rating': 4}]}";

	check(doc,
	      "{'$set': {'quantity': 500, 'details': {'model': '2600', 'make': 'Fashionaires'}, "
	      "'tags': ['coats', 'outerwear', 'clothing']}}",
	      "{'_id': 100, 'quantity': 500, 'instock': true, 'reorder': false, "
	      "'details': {'model': '2600', 'make': 'Fashionaires'}, "
	      "'tags': ['coats', 'outerwear', 'clothing'], 'ratings': [{'by': 'Customer007', 'rating': 4}]}");
	check(doc, "{'$set': {'details.make': 'Kustom Kidz', 'tags.1': 'rain gear', 'ratings.0.rating': 2}}",
	      "{'_id': 100, 'quantity': 250, 'instock': true, 'reorder': false, "
	      "'details': {'model': '14QQ', 'make': 'Kustom Kidz'}, "
	      "'tags': ['apparel', 'rain gear'], 'ratings': [{'by': 'Customer007', 'rating': 2}]}");
	/* new fields are appended in lexicographic order of their names (MongoDB 5.0+) */
	check("{'_id': 1, 'k': 0}", "{'$set': {'z': 1, 'a': 2, 'm.b': 3, 'm.a': 4}}",
	      "{'_id': 1, 'k': 0, 'a': 2, 'm': {'a': 4, 'b': 3}, 'z': 1}");
	/* numeric names are ordered numerically; an index past the end pads with null */
	check("{'_id': 1, 'a': [0]}", "{'$set': {'a.10': 10, 'a.2': 2}}",
	      "{'_id': 1, 'a': [0, null, 2, null, null, null, null, null, null, null, 10]}");
	/* the canonical form checks the type: $set 1 over 1.0 is a change */
	check("{'_id': 1, 'a': 1.0}", "{'$set': {'a': 1}}", "{'_id': 1, 'a': {'$numberInt': '1'}}");
	/* the same value of the same type changes nothing */
	check_full("{'_id': 1, 'a': 1, 'b': {'c': [1, 2]}}", "{'$set': {'a': 1, 'b.c': [1, 2]}}", NULL,
		   NULL, false, "{'_id': 1, 'a': 1, 'b': {'c': [1, 2]}}", false);
	/* _id may be set to its own value */
	check_full("{'_id': 1, 'a': 1}", "{'$set': {'_id': 1}}", NULL, NULL, false,
		   "{'_id': 1, 'a': 1}", false);
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/unset/ */
static void test_unset(void **state)
{
	(void)state;
	check("{'_id': 1, 'sku': 'abc123', 'quantity': 10, 'instock': true}",
	      "{'$unset': {'quantity': '', 'instock': ''}}", "{'_id': 1, 'sku': 'abc123'}");
	/* an array element becomes null; missing paths are a no-op */
	check("{'_id': 1, 'a': [1, 2, 3]}", "{'$unset': {'a.1': 1, 'x.y': 1}}",
	      "{'_id': 1, 'a': [1, null, 3]}");
	check_full("{'_id': 1, 'a': 5}", "{'$unset': {'b': 1, 'a.c': 1}}", NULL, NULL, false,
		   "{'_id': 1, 'a': 5}", false);
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/inc/ */
static void test_inc(void **state)
{
	(void)state;
	check("{'_id': 1, 'sku': 'abc123', 'quantity': 10, 'metrics': {'orders': 2, 'ratings': 3.5}}",
	      "{'$inc': {'quantity': -2, 'metrics.orders': 1}}",
	      "{'_id': 1, 'sku': 'abc123', 'quantity': 8, 'metrics': {'orders': 3, 'ratings': 3.5}}");
	/* missing field: created with the increment; int32 overflow widens to int64; double wins */
	check("{'_id': 1, 'a': 2147483647, 'b': 1}", "{'$inc': {'a': 1, 'b': 0.5, 'c': 5}}",
	      "{'_id': 1, 'a': {'$numberLong': '2147483648'}, 'b': 1.5, 'c': 5}");
	check_err("{'_id': 1, 'a': 'x'}", "{'$inc': {'a': 1}}", NULL, 14, "non-numeric");
	check_err("{'_id': 1}", "{'$inc': {'a': 'x'}}", NULL, 14, "non-numeric argument");
	check_err("{'_id': 1, 'a': {'$numberLong': '9223372036854775807'}}", "{'$inc': {'a': 1}}",
		  NULL, 2, "overflow");
}

#define DEC(s) "{'$numberDecimal': '" s "'}"

/* $inc/$mul with a Decimal128 on either side: a Decimal128 (mongod's SafeNum: the other
 * operand converted exactly, a double to 15 significant digits) */
static void test_inc_mul_decimal(void **state)
{
	(void)state;
	check("{'_id': 1, 'bal': " DEC("100.10") ", 'n': 5, 'l': {'$numberLong': '9223372036854775807'},"
	      " 'd': " DEC("1") "}",
	      "{'$inc': {'bal': " DEC("-0.15") ", 'n': " DEC("0.5") ", 'l': " DEC("1") ","
	      " 'd': 0.1, 'new': " DEC("2.00") "}}",
	      "{'_id': 1, 'bal': " DEC("99.95") ", 'n': " DEC("5.5") ","
	      " 'l': " DEC("9223372036854775808") ", 'd': " DEC("1.100000000000000") ","
	      " 'new': " DEC("2.00") "}");
	check("{'_id': 1, 'bal': " DEC("100.10") "}", "{'$inc': {'bal': 1}}",
	      "{'_id': 1, 'bal': " DEC("101.10") "}");
	check("{'_id': 1, 'p': " DEC("2.50") ", 'q': 3}",
	      "{'$mul': {'p': 3, 'q': " DEC("1.1") ", 'z': " DEC("1.50") ", 'zd': -1.5}}",
	      "{'_id': 1, 'p': " DEC("7.50") ", 'q': " DEC("3.3") ", 'z': " DEC("0.00") ","
	      " 'zd': {'$numberDouble': '-0.0'}}");
	check("{'_id': 1, 'x': " DEC("NaN") ", 'y': " DEC("9E+6144") "}",
	      "{'$inc': {'x': 1}, '$mul': {'y': 10}}",
	      "{'_id': 1, 'x': " DEC("NaN") ", 'y': " DEC("Infinity") "}");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/mul/ */
static void test_mul(void **state)
{
	(void)state;
	check("{'_id': 1, 'item': 'Hats', 'price': 10.5, 'quantity': 25}",
	      "{'$mul': {'price': 1.25, 'quantity': 2}}",
	      "{'_id': 1, 'item': 'Hats', 'price': 13.125, 'quantity': 50}");
	/* a missing field is created as 0 of the multiplier's type */
	check("{'_id': 2, 'item': 'Unknown'}", "{'$mul': {'price': {'$numberLong': '100'}}}",
	      "{'_id': 2, 'item': 'Unknown', 'price': {'$numberLong': '0'}}");
	/* mixed types: int32 * double -> double */
	check("{'_id': 3, 'item': 'Scarf', 'price': 10}", "{'$mul': {'price': 5.0}}",
	      "{'_id': 3, 'item': 'Scarf', 'price': 50.0}");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/min/ and max/ */
static void test_min_max(void **state)
{
	(void)state;
	check("{'_id': 1, 'highScore': 800, 'lowScore': 200}", "{'$min': {'lowScore': 150}}",
	      "{'_id': 1, 'highScore': 800, 'lowScore': 150}");
	check_full("{'_id': 1, 'highScore': 800, 'lowScore': 150}", "{'$min': {'lowScore': 250}}",
		   NULL, NULL, false, "{'_id': 1, 'highScore': 800, 'lowScore': 150}", false);
	check("{'_id': 1, 'highScore': 800, 'lowScore': 200}", "{'$max': {'highScore': 950}}",
	      "{'_id': 1, 'highScore': 950, 'lowScore': 200}");
	/* comparison across types uses MongoDB's order: a string is above any number */
	check("{'_id': 1, 'v': 5}", "{'$max': {'v': 'a'}, '$min': {'w': 3}}",
	      "{'_id': 1, 'v': 'a', 'w': 3}");
	check("{'_id': 1, 'dateEntered': {'$date': '2023-01-01T00:00:00Z'}}",
	      "{'$min': {'dateEntered': {'$date': '2022-01-01T00:00:00Z'}}}",
	      "{'_id': 1, 'dateEntered': {'$date': '2022-01-01T00:00:00Z'}}");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/rename/ */
static void test_rename(void **state)
{
	(void)state;
	const char *doc = "{'_id': 1, 'alias': ['The American Cincinnatus', 'The American Fabius'], "
			  "'mobile': '555-555-5555', 'nmae': {'first': 'george', 'last': 'washington'}}";

	check(doc, "{'$rename': {'nmae': 'name'}}",
	      "{'_id': 1, 'alias': ['The American Cincinnatus', 'The American Fabius'], "
	      "'mobile': '555-555-5555', 'name': {'first': 'george', 'last': 'washington'}}");
	check(doc, "{'$rename': {'nmae.first': 'fname', 'mobile': 'contact.mobile'}}",
	      "{'_id': 1, 'alias': ['The American Cincinnatus', 'The American Fabius'], "
	      "'nmae': {'last': 'washington'}, 'contact': {'mobile': '555-555-5555'}, 'fname': 'george'}");
	/* a missing source changes nothing */
	check_full(doc, "{'$rename': {'wife': 'spouse'}}", NULL, NULL, false, doc, false);
	/* an existing destination keeps its position */
	check("{'_id': 1, 'a': 1, 'b': 2, 'c': 3}", "{'$rename': {'c': 'a'}}",
	      "{'_id': 1, 'a': 3, 'b': 2}");
	check_err(doc, "{'$rename': {'alias.0': 'x'}}", NULL, 2, "array element");
	/* nor into one (mongod: "The destination field cannot be an array element") */
	check_err(doc, "{'$rename': {'mobile': 'alias.0'}}", NULL, 2,
		  "destination field cannot be an array element, 'alias.0'");
	check_err(doc, "{'$rename': {'mobile': 'alias.x.y'}}", NULL, 2, "field called 'alias'");
	/* a missing source renames nothing, wherever the destination points */
	check_full(doc, "{'$rename': {'wife': 'alias.0'}}", NULL, NULL, false, doc, false);
	check_err(doc, "{'$rename': {'a': 'a'}}", NULL, 2, "must differ");
	check_err(doc, "{'$rename': {'a': 5}}", NULL, 2, "must be a string");
	check_err(doc, "{'$rename': {'a': 'b'}, '$set': {'b.c': 1}}", NULL, 40, "conflict");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/setOnInsert/ */
static void test_set_on_insert(void **state)
{
	(void)state;
	/* only for an upsert insert; new fields in lexicographic order */
	check_full("{'_id': 1}", "{'$set': {'item': 'apple'}, '$setOnInsert': {'defaultQty': 100}}",
		   NULL, NULL, true, "{'_id': 1, 'defaultQty': 100, 'item': 'apple'}", true);
	check_full("{'_id': 1, 'item': 'pear'}",
		   "{'$set': {'item': 'apple'}, '$setOnInsert': {'defaultQty': 100}}", NULL, NULL, false,
		   "{'_id': 1, 'item': 'apple'}", true);
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/push/ and its modifiers */
static void test_push(void **state)
{
	(void)state;
	check("{'_id': 1, 'scores': [44, 78, 38, 80]}", "{'$push': {'scores': 89}}",
	      "{'_id': 1, 'scores': [44, 78, 38, 80, 89]}");
	check("{'_id': 1, 'scores': [44, 78, 38, 80]}", "{'$push': {'scores': {'$each': [90, 92, 85]}}}",
	      "{'_id': 1, 'scores': [44, 78, 38, 80, 90, 92, 85]}");
	/* a missing field becomes an array; pushing an array pushes one element */
	check("{'_id': 1}", "{'$push': {'a': [1, 2]}}", "{'_id': 1, 'a': [[1, 2]]}");
	/* $position */
	check("{'_id': 1, 'scores': [100]}",
	      "{'$push': {'scores': {'$each': [50, 60, 70], '$position': 0}}}",
	      "{'_id': 1, 'scores': [50, 60, 70, 100]}");
	check("{'_id': 1, 'scores': [50, 60, 70, 100]}",
	      "{'$push': {'scores': {'$each': [20, 30], '$position': 2}}}",
	      "{'_id': 1, 'scores': [50, 60, 20, 30, 70, 100]}");
	check("{'_id': 1, 'scores': [50, 60, 20, 30, 70, 100]}",
	      "{'$push': {'scores': {'$each': [90, 80], '$position': -2}}}",
	      "{'_id': 1, 'scores': [50, 60, 20, 30, 90, 80, 70, 100]}");
	/* $slice */
	check("{'_id': 1, 'scores': [40, 50, 60]}",
	      "{'$push': {'scores': {'$each': [80, 78, 86], '$slice': -5}}}",
	      "{'_id': 1, 'scores': [50, 60, 80, 78, 86]}");
	check("{'_id': 2, 'scores': [89, 90]}",
	      "{'$push': {'scores': {'$each': [100, 20], '$slice': 3}}}",
	      "{'_id': 2, 'scores': [89, 90, 100]}");
	check("{'_id': 3, 'scores': [89, 70, 100, 20]}",
	      "{'$push': {'scores': {'$each': [], '$slice': -3}}}",
	      "{'_id': 3, 'scores': [70, 100, 20]}");
	/* $sort on a field plus $slice (the manual's quizzes example) */
	check("{'_id': 5, 'quizzes': [{'wk': 1, 'score': 10}, {'wk': 2, 'score': 8}, "
	      "{'wk': 3, 'score': 5}, {'wk': 4, 'score': 6}]}",
	      "{'$push': {'quizzes': {'$each': [{'wk': 5, 'score': 8}, {'wk': 6, 'score': 7}, "
	      "{'wk': 7, 'score': 6}], '$sort': {'score': -1}, '$slice': 3}}}",
	      "{'_id': 5, 'quizzes': [{'wk': 1, 'score': 10}, {'wk': 2, 'score': 8}, {'wk': 5, 'score': 8}]}");
	/* the manual's "$sort embedded documents" example: ties keep their order */
	check("{'_id': 1, 'quizzes': [{'id': 1, 'score': 6}, {'id': 2, 'score': 9}]}",
	      "{'$push': {'quizzes': {'$each': [{'id': 3, 'score': 8}, {'id': 4, 'score': 7}, {'id': 5, 'score': 6}], "
	      "'$sort': {'score': 1}}}}",
	      "{'_id': 1, 'quizzes': [{'id': 1, 'score': 6}, {'id': 5, 'score': 6}, {'id': 4, 'score': 7}, "
	      "{'id': 3, 'score': 8}, {'id': 2, 'score': 9}]}");
	/* $sort of whole elements */
	check("{'_id': 2, 'tests': [89, 70, 89, 50]}", "{'$push': {'tests': {'$each': [40, 60], '$sort': 1}}}",
	      "{'_id': 2, 'tests': [40, 50, 60, 70, 89, 89]}");
	check("{'_id': 2, 'tests': [40, 50, 60, 70, 89, 89]}", "{'$push': {'tests': {'$each': [], '$sort': -1}}}",
	      "{'_id': 2, 'tests': [89, 89, 70, 60, 50, 40]}");
	/* $sort by a field: non-documents have the field missing (null sorts first), ties stable */
	check("{'_id': 1, 'q': [{'s': 2, 'k': 'a'}, 7, {'s': 1}, {'s': 2, 'k': 'b'}]}",
	      "{'$push': {'q': {'$each': [{'k': 'c'}], '$sort': {'s': 1}}}}",
	      "{'_id': 1, 'q': [7, {'k': 'c'}, {'s': 1}, {'s': 2, 'k': 'a'}, {'s': 2, 'k': 'b'}]}");
	check("{'_id': 1, 'q': [{'a': {'b': 2}}, {'a': {'b': 1}}]}",
	      "{'$push': {'q': {'$each': [], '$sort': {'a.b': -1}, '$slice': 1}}}",
	      "{'_id': 1, 'q': [{'a': {'b': 2}}]}");
	check_err("{'_id': 1, 'a': 5}", "{'$push': {'a': 1}}", NULL, 2, "must be an array");
	check_err("{'_id': 1}", "{'$push': {'a': {'$each': 1}}}", NULL, 2, "$each");
	check_err("{'_id': 1}", "{'$push': {'a': {'$each': [1], '$slice': 'x'}}}", NULL, 2, "$slice");
	check_err("{'_id': 1}", "{'$push': {'a': {'$each': [1], '$sort': 2}}}", NULL, 2, "$sort");
	check_err("{'_id': 1}", "{'$push': {'a': {'$each': [1], '$foo': 2}}}", NULL, 2,
		  "Unrecognized clause in $push: $foo");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/pull/ and pullAll/ */
static void test_pull(void **state)
{
	(void)state;
	check("{'_id': 1, 'fruits': ['apples', 'pears', 'oranges', 'grapes', 'bananas'], "
	      "'vegetables': ['carrots', 'celery', 'squash', 'carrots']}",
	      "{'$pull': {'fruits': {'$in': ['apples', 'oranges']}, 'vegetables': 'carrots'}}",
	      "{'_id': 1, 'fruits': ['pears', 'grapes', 'bananas'], 'vegetables': ['celery', 'squash']}");
	check("{'_id': 1, 'votes': [3, 5, 6, 7, 7, 8]}", "{'$pull': {'votes': {'$gte': 6}}}",
	      "{'_id': 1, 'votes': [3, 5]}");
	/* a document condition is a query on each element */
	check("{'_id': 1, 'results': [{'item': 'A', 'score': 5}, {'item': 'B', 'score': 8}]}",
	      "{'$pull': {'results': {'score': 8, 'item': 'B'}}}",
	      "{'_id': 1, 'results': [{'item': 'A', 'score': 5}]}");
	check("{'_id': 1, 'scores': [0, 2, 5, 5, 1, 0]}", "{'$pullAll': {'scores': [0, 5]}}",
	      "{'_id': 1, 'scores': [2, 1]}");
	/* values compare numerically across types */
	check("{'_id': 1, 'a': [1, 2.0, {'$numberLong': '3'}]}", "{'$pull': {'a': 2}}",
	      "{'_id': 1, 'a': [1, {'$numberLong': '3'}]}");
	check_err("{'_id': 1, 'a': 1}", "{'$pull': {'a': 1}}", NULL, 2, "non-array");
	check_err("{'_id': 1}", "{'$pullAll': {'a': 1}}", NULL, 2, "requires an array");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/addToSet/ */
static void test_add_to_set(void **state)
{
	(void)state;
	check("{'_id': 1, 'letters': ['a', 'b']}", "{'$addToSet': {'letters': ['c', 'd']}}",
	      "{'_id': 1, 'letters': ['a', 'b', ['c', 'd']]}");
	check("{'_id': 1, 'item': 'polarizing_filter', 'tags': ['electronics', 'camera']}",
	      "{'$addToSet': {'tags': 'accessories'}}",
	      "{'_id': 1, 'item': 'polarizing_filter', 'tags': ['electronics', 'camera', 'accessories']}");
	check_full("{'_id': 1, 'tags': ['electronics', 'camera']}", "{'$addToSet': {'tags': 'camera'}}",
		   NULL, NULL, false, "{'_id': 1, 'tags': ['electronics', 'camera']}", false);
	check("{'_id': 2, 'item': 'cable', 'tags': ['electronics', 'supplies']}",
	      "{'$addToSet': {'tags': {'$each': ['camera', 'electronics', 'accessories']}}}",
	      "{'_id': 2, 'item': 'cable', 'tags': ['electronics', 'supplies', 'camera', 'accessories']}");
	check("{'_id': 1}", "{'$addToSet': {'t': {'$each': [1, 1.0, 2]}}}", "{'_id': 1, 't': [1, 2]}");
	/* documents are equal only with the same fields in the same order */
	check("{'_id': 1, 't': [{'x': 1, 'y': 2}]}", "{'$addToSet': {'t': {'$each': [{'x': 1.0, 'y': 2}, {'y': 2, 'x': 1}]}}}",
	      "{'_id': 1, 't': [{'x': 1, 'y': 2}, {'y': 2, 'x': 1}]}");
	check_err("{'_id': 1, 't': 3}", "{'$addToSet': {'t': 1}}", NULL, 2, "non-array");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/pop/ */
/* Large arrays: sorting and set insertion use encoded keys (no quadratic compare). */
static void test_large_arrays(void **state)
{
	(void)state;
	bson_t doc = BSON_INITIALIZER, arr, out;
	bson_t *u1 = J("{'$push': {'a': {'$each': [], '$sort': 1, '$slice': 3}}}");
	bson_t *u2 = J("{'$addToSet': {'a': {'$each': [5, 100000, 100000.0, {'$numberLong': '100001'}]}}}");
	sdb_update *u;
	bson_iter_t it, el;
	bool changed;
	int code;
	char err[256];
	char *got;

	BSON_APPEND_INT32(&doc, "_id", 1);
	BSON_APPEND_ARRAY_BEGIN(&doc, "a", &arr);
	for (int i = 0; i < 100000; i++) {
		char key[16];

		snprintf(key, sizeof key, "%d", i);
		BSON_APPEND_INT32(&arr, key, 100000 - 1 - i);
	}
	bson_append_array_end(&doc, &arr);

	assert_int_equal(sdb_update_parse(u1, NULL, &u, &code, err, sizeof err), 0);
	assert_int_equal(sdb_update_apply(u, &doc, false, &out, &changed, &code, err, sizeof err), 0);
	got = bson_as_canonical_extended_json(&out, NULL);
	assert_string_equal(got, "{ \"_id\" : { \"$numberInt\" : \"1\" }, \"a\" : [ { \"$numberInt\" : \"0\" }, "
				 "{ \"$numberInt\" : \"1\" }, { \"$numberInt\" : \"2\" } ] }");
	bson_free(got);
	bson_destroy(&out);
	sdb_update_free(u);

	assert_int_equal(sdb_update_parse(u2, NULL, &u, &code, err, sizeof err), 0);
	assert_int_equal(sdb_update_apply(u, &doc, false, &out, &changed, &code, err, sizeof err), 0);
	assert_true(changed);
	assert_true(bson_iter_init_find(&it, &out, "a"));
	assert_true(bson_iter_recurse(&it, &el));
	int n = 0;
	int64_t last = 0;

	while (bson_iter_next(&el)) {
		n++;
		last = bson_iter_as_int64(&el);
	}
	/* 5 is there; 100000 and 100000.0 are one new value; 100001 is new */
	assert_int_equal(n, 100002);
	assert_int_equal(last, 100001);
	bson_destroy(&out);
	sdb_update_free(u);
	bson_destroy(&doc);
	bson_destroy(u1);
	bson_destroy(u2);
}

static void test_pop(void **state)
{
	(void)state;
	check("{'_id': 1, 'scores': [8, 9, 10]}", "{'$pop': {'scores': -1}}", "{'_id': 1, 'scores': [9, 10]}");
	check("{'_id': 10, 'scores': [9, 10]}", "{'$pop': {'scores': 1}}", "{'_id': 10, 'scores': [9]}");
	check_full("{'_id': 1, 's': []}", "{'$pop': {'s': 1, 'x': 1}}", NULL, NULL, false,
		   "{'_id': 1, 's': []}", false);
	check_err("{'_id': 1, 's': [1]}", "{'$pop': {'s': 2}}", NULL, 9, "$pop expects 1 or -1");
	check_err("{'_id': 1, 's': 1}", "{'$pop': {'s': 1}}", NULL, 14, "non-array");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/currentDate/ with an
 * injected clock */
static void test_current_date(void **state)
{
	(void)state;
	check("{'_id': 1, 'status': 'a', 'lastModified': {'$date': '2013-10-02T01:11:18.965Z'}}",
	      "{'$currentDate': {'lastModified': true, 'cancellation.date': {'$type': 'timestamp'}}, "
	      "'$set': {'cancellation.reason': 'user request', 'status': 'D'}}",
	      "{'_id': 1, 'status': 'D', 'lastModified': {'$date': {'$numberLong': '1700000000123'}}, "
	      "'cancellation': {'date': {'$timestamp': {'t': 1700000000, 'i': 1}}, 'reason': 'user request'}}");
	check_err("{'_id': 1}", "{'$currentDate': {'a': {'$type': 'int'}}}", NULL, 2, "'date' or 'timestamp'");
	check_err("{'_id': 1}", "{'$currentDate': {'a': 1}}", NULL, 2, "not valid type");
}

/* https://www.mongodb.com/docs/manual/reference/operator/update/positional-all/ and
 * positional-filtered/ and positional/ */
static void test_positional(void **state)
{
	(void)state;
	check("{'_id': 1, 'grades': [85, 82, 80]}", "{'$inc': {'grades.$[]': 10}}",
	      "{'_id': 1, 'grades': [95, 92, 90]}");
	check("{'_id': 1, 'grades': [{'grade': 80, 'mean': 75, 'std': 8}, {'grade': 85, 'mean': 90, 'std': 6}]}",
	      "{'$inc': {'grades.$[].std': -2}}",
	      "{'_id': 1, 'grades': [{'grade': 80, 'mean': 75, 'std': 6}, {'grade': 85, 'mean': 90, 'std': 4}]}");
	check_full("{'_id': 2, 'grades': [98, 102, 100]}", "{'$set': {'grades.$[element]': 100}}",
		   "[{'element': {'$gte': 100}}]", NULL, false, "{'_id': 2, 'grades': [98, 100, 100]}",
		   true);
	check_full("{'_id': 1, 'grades': [{'grade': 80, 'mean': 75, 'std': 6}, "
		   "{'grade': 85, 'mean': 90, 'std': 4}, {'grade': 85, 'mean': 85, 'std': 6}]}",
		   "{'$set': {'grades.$[elem].mean': 100}}", "[{'elem.grade': {'$gte': 85}}]", NULL, false,
		   "{'_id': 1, 'grades': [{'grade': 80, 'mean': 75, 'std': 6}, "
		   "{'grade': 85, 'mean': 100, 'std': 4}, {'grade': 85, 'mean': 100, 'std': 6}]}",
		   true);
	/* nested: $[] and $[id] together */
	check_full("{'_id': 1, 'a': [{'b': [1, 5]}, {'b': [7]}]}", "{'$set': {'a.$[].b.$[x]': 0}}",
		   "[{'x': {'$gt': 4}}]", NULL, false, "{'_id': 1, 'a': [{'b': [1, 0]}, {'b': [0]}]}",
		   true);
	/* `$` with the query's match */
	check_full("{'_id': 1, 'grades': [85, 80, 80]}", "{'$set': {'grades.$': 82}}", NULL,
		   "{'_id': 1, 'grades': 80}", false, "{'_id': 1, 'grades': [85, 82, 80]}", true);
	check_full("{'_id': 4, 'grades': [{'grade': 80, 'mean': 75}, {'grade': 85, 'mean': 90}]}",
		   "{'$set': {'grades.$.std': 6}}", NULL, "{'_id': 4, 'grades.grade': 85}", false,
		   "{'_id': 4, 'grades': [{'grade': 80, 'mean': 75}, {'grade': 85, 'mean': 90, 'std': 6}]}",
		   true);
	check_full("{'_id': 1, 'g': [{'a': 1, 'b': 1}, {'a': 1, 'b': 2}]}", "{'$set': {'g.$.c': 9}}",
		   NULL, "{'g': {'$elemMatch': {'a': 1, 'b': 2}}}", false,
		   "{'_id': 1, 'g': [{'a': 1, 'b': 1}, {'a': 1, 'b': 2, 'c': 9}]}", true);
	/* errors */
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.$': 1}}", NULL, 2, "positional operator");
	check_err("{'_id': 1}", "{'$set': {'a.$[]': 1}}", NULL, 2, "must exist");
	check_err("{'_id': 1, 'a': 5}", "{'$set': {'a.$[]': 1}}", NULL, 2, "non-array");
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.$[x]': 1}}", NULL, 2,
		  "No array filter found for identifier 'x'");
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.$[x]': 1}}", "[{'x': 1}, {'y': 2}]", 9,
		  "identifier 'y' was not used");
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.$[x]': 1}}", "[{'x': 1}, {'x': 2}]", 9,
		  "multiple array filters");
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.$[X]': 1}}", "[{'X': 1}]", 2, "lowercase");
}

static void test_errors(void **state)
{
	(void)state;
	check_err("{'_id': 1}", "{'$foo': {'a': 1}}", NULL, 9, "Unknown modifier: $foo");
	check_err("{'_id': 1}", "{'$set': {}}", NULL, 9, "'$set' is empty");
	check_err("{'_id': 1}", "{'$set': {'b': 1}, 'a': 1}", NULL, 9, "Unknown modifier: a");
	check_err("{'_id': 1}", "{'$set': 5}", NULL, 9, "Modifiers operate on fields");
	check_err("{'_id': 1}", "{'$set': {'a': 1}, '$inc': {'a.b': 1}}", NULL, 40,
		  "Updating the path 'a.b' would create a conflict at 'a'");
	check_err("{'_id': 1}", "{'$set': {'a.b': 1}, '$unset': {'a': 1}}", NULL, 40,
		  "Updating the path 'a' would create a conflict at 'a'");
	check_err("{'_id': 1}", "{'$set': {'a': 1}, '$inc': {'a': 1}}", NULL, 40, "conflict at 'a'");
	check_err("{'_id': 1}", "{'$set': {'_id': 2}}", NULL, 66, "immutable field '_id'");
	check_err("{'_id': 1}", "{'$unset': {'_id': 1}}", NULL, 66, "immutable field '_id'");
	check_err("{'_id': {'a': 1}}", "{'$set': {'_id.a': 2}}", NULL, 66, "immutable");
	check_err("{'_id': 1, 'a': 1}", "{'$set': {'a.b': 1}}", NULL, 28, "Cannot create field 'b'");
	check_err("{'_id': 1, 'a': [1]}", "{'$set': {'a.b': 1}}", NULL, 28, "Cannot create field 'b'");
	check_err("{'_id': 1}", "{'$set': {'a..b': 1}}", NULL, 56, "empty field name");
	check_err("{'_id': 1}", "{'$set': {'$[]': 1}}", NULL, 2, "first position");
	/* replacement documents */
	check_err("{'_id': 1}", "{'a': 1, '$set': {'b': 1}}", NULL, 52, "dollar ($) prefixed field '$set'");
	check_err("{'_id': 1}", "{'_id': 2, 'a': 1}", NULL, 66, "(immutable) field '_id'");
	check_err("{'_id': 1}", "{'_id': [1], 'a': 1}", NULL, 53, "array");
}

/* Hostile shapes: very long paths, deep nesting, a result deeper than MongoDB allows. */
static void test_limits(void **state)
{
	(void)state;
	char *path = malloc(4 * 300 + 8), *json = malloc(4 * 300 + 64);
	size_t n = 0;
	bson_t *u;
	sdb_update *up;
	int code;
	char err[256];

	for (int i = 0; i < 300; i++) {
		n += (size_t)sprintf(path + n, "%sa", i ? "." : "");
	}
	snprintf(json, 4 * 300 + 64, "{'$set': {'%s': 1}}", path);
	for (char *p = json; *p; p++) {
		if (*p == '\'') {
			*p = '"';
		}
	}
	u = bson_new_from_json((const uint8_t *)json, -1, NULL);
	assert_non_null(u);
	assert_int_not_equal(sdb_update_parse(u, NULL, &up, &code, err, sizeof err), 0);
	assert_int_equal(code, 2);
	assert_non_null(strstr(err, "more than 255 components"));
	bson_destroy(u);

	/* 120 levels: parses, but the result would nest beyond 100 */
	n = 0;
	for (int i = 0; i < 120; i++) {
		n += (size_t)sprintf(path + n, "%sa", i ? "." : "");
	}
	snprintf(json, 4 * 300 + 64, "{\"$set\": {\"%s\": 1}}", path);
	check_err("{'_id': 1}", json, NULL, 15, "maximum nesting depth of 100");

	/* an update nested 250 levels deep is refused before any recursion */
	bson_t *deep = bson_new(), *w;

	BSON_APPEND_INT32(deep, "x", 1);
	for (int i = 0; i < 250; i++) {
		w = bson_new();
		BSON_APPEND_DOCUMENT(w, "d", deep);
		bson_destroy(deep);
		deep = w;
	}
	w = bson_new();
	BSON_APPEND_DOCUMENT(w, "$set", deep);
	assert_int_not_equal(sdb_update_parse(w, NULL, &up, &code, err, sizeof err), 0);
	assert_int_equal(code, 15);
	bson_destroy(w);
	bson_destroy(deep);
	free(path);
	free(json);
}

/* Apply a pipeline-style update (the array of `u`) to doc; code 0 and the expected result,
 * or the expected error code. */
static void check_pipeline(const char *doc, const char *stages, const char *want, int want_code)
{
	bson_t *d = J(doc), *cmd = bson_new(), *st = J(stages), out;
	bson_iter_t it;
	sdb_update *u = NULL;
	int code = 0;
	bool changed = false;
	char err[256] = "";
	int rc;

	BSON_APPEND_ARRAY(cmd, "u", st);
	assert_true(bson_iter_init_find(&it, cmd, "u"));
	rc = sdb_update_parse_value(&it, NULL, &u, &code, err, sizeof err);
	if (rc == 0) {
		assert_int_equal(sdb_update_get_kind(u), SDB_UPDATE_PIPELINE);
		rc = sdb_update_apply(u, d, false, &out, &changed, &code, err, sizeof err);
		if (rc == 0 && want != NULL) {
			bson_t *w = J(want);
			if (!bson_equal(&out, w)) {
				char *a = bson_as_relaxed_extended_json(&out, NULL);
				fail_msg("pipeline %s on %s: got %s", stages, doc, a);
			}
			bson_destroy(w);
		}
		bson_destroy(&out);
	}
	if (want_code) {
		if (code != want_code)
			fail_msg("pipeline %s: code %d (%s), want %d", stages, code, err, want_code);
	} else if (rc != 0) {
		fail_msg("pipeline %s: %s", stages, err);
	}
	sdb_update_free(u);
	bson_destroy(d);
	bson_destroy(st);
	bson_destroy(cmd);
}

/* MongoDB 4.2+ pipeline-style updates: the admitted stages with aggregation expressions;
 * the _id rules of a replacement (kept first, kept when the result drops it, 66 when it
 * changes); other stages 72; a `u` that is neither a document nor an array 14. */
static void test_pipeline_update(void **state)
{
	(void)state;
	check_pipeline("{'_id': 1, 'a': 1, 'b': 2}",
		       "[{'$set': {'c': {'$add': ['$a', '$b']}}}, {'$unset': 'a'}]",
		       "{'_id': 1, 'b': 2, 'c': 3}", 0);
	check_pipeline("{'_id': 1, 'a': {'x': 5}}", "[{'$replaceWith': '$a'}]",
		       "{'_id': 1, 'x': 5}", 0);
	check_pipeline("{'_id': 1, 'a': 1, 'b': 2}", "[{'$project': {'_id': 0, 'b': 1}}]",
		       "{'_id': 1, 'b': 2}", 0);
	check_pipeline("{'_id': 1, 'a': 1}", "[{'$addFields': {'a': {'$concat': ['x', 'y']}}}]",
		       "{'_id': 1, 'a': 'xy'}", 0);
	check_pipeline("{'_id': 1, 'a': 1}", "[]", "{'_id': 1, 'a': 1}", 0);
	check_pipeline("{'_id': 1, 'a': 1}", "[{'$set': {'_id': 2}}]", NULL, 66);
	check_pipeline("{'_id': 1, 'a': 1}", "[{'$group': {'_id': null}}]", NULL, 72);
	check_pipeline("{'_id': 1, 'a': 1}", "[{'$match': {'a': 1}}]", NULL, 72);
	check_pipeline("{'_id': 1, 'a': 1}", "[5]", NULL, 14);

	bson_t *cmd = J("{'v': 5}");
	bson_iter_t it;
	sdb_update *u = (sdb_update *)1;
	int code = 0;
	char err[256];
	assert_true(bson_iter_init_find(&it, cmd, "v"));
	assert_int_not_equal(sdb_update_parse_value(&it, NULL, &u, &code, err, sizeof err), 0);
	assert_int_equal(code, 14);
	bson_destroy(cmd);
}

static void test_replacement(void **state)
{
	(void)state;
	check("{'_id': 1, 'a': 1, 'b': 2}", "{'c': 3}", "{'_id': 1, 'c': 3}");
	/* the original _id goes first even when the replacement names it later */
	check("{'_id': 1, 'a': 1}", "{'c': 3, '_id': 1}", "{'_id': 1, 'c': 3}");
	check_full("{'_id': 1, 'a': 1}", "{'a': 1}", NULL, NULL, false, "{'_id': 1, 'a': 1}", false);

	bson_t *r = J("{'a': 1}");
	sdb_update *u;
	int code;
	char err[128];

	assert_int_equal(sdb_update_parse(r, NULL, &u, &code, err, sizeof err), 0);
	assert_int_equal(sdb_update_get_kind(u), SDB_UPDATE_REPLACEMENT);
	sdb_update_free(u);
	bson_destroy(r);
}

static void check_seed(const char *filter, const char *want)
{
	bson_t *f = J(filter), *w = J(want);
	bson_t out;
	int code = 0;
	char err[256] = "";

	if (sdb_update_upsert_seed(f, &out, &code, err, sizeof err) != 0) {
		fail_msg("seed %s: %d %s", filter, code, err);
	}
	char *got = canon(&out), *exp = canon(w);

	assert_string_equal(got, exp);
	bson_free(got);
	bson_free(exp);
	bson_destroy(&out);
	bson_destroy(f);
	bson_destroy(w);
}

static void test_upsert_seed(void **state)
{
	(void)state;
	check_seed("{'a': 1, 'b.c': 2, '$or': [{'x': 1}], 'd': {'$gt': 1}, '$and': [{'e': 5}, {'f': {'$eq': 6}}], "
		   "'_id': 7, 'g': {'h': 1}, 'i': {'$in': [9]}, 'j': {'$in': [1, 2]}}",
		   "{'_id': 7, 'a': 1, 'b': {'c': 2}, 'e': 5, 'f': 6, 'g': {'h': 1}, 'i': 9}");
	check_seed("{'a.b': 1, 'a.c': 2}", "{'a': {'b': 1, 'c': 2}}");
	check_seed("{}", "{}");

	bson_t *f = J("{'a': 1, 'a.b': 2}");
	bson_t out;
	int code = 0;
	char err[256];

	assert_int_not_equal(sdb_update_upsert_seed(f, &out, &code, err, sizeof err), 0);
	assert_int_equal(code, 54);
	bson_destroy(&out);
	bson_destroy(f);
}

static void check_upsert(const char *filter, const char *update, const char *want_without_id,
			 bool want_generated_id)
{
	bson_t *f = J(filter), *u = J(update), *w = J(want_without_id);
	sdb_update *up;
	bson_t out, rest = BSON_INITIALIZER;
	bson_iter_t it;
	int code = 0;
	char err[256] = "";

	assert_int_equal(sdb_update_parse(u, NULL, &up, &code, err, sizeof err), 0);
	if (sdb_update_upsert_doc(up, f, &out, &code, err, sizeof err) != 0) {
		fail_msg("upsert %s: %d %s", update, code, err);
	}
	assert_true(bson_iter_init(&it, &out));
	assert_true(bson_iter_next(&it));
	assert_string_equal(bson_iter_key(&it), "_id");
	if (want_generated_id) {
		assert_int_equal(bson_iter_type(&it), BSON_TYPE_OID);
		while (bson_iter_next(&it)) {
			bson_append_iter(&rest, NULL, 0, &it);
		}
	} else {
		bson_concat(&rest, &out);
	}
	char *got = canon(&rest), *exp = canon(w);

	assert_string_equal(got, exp);
	bson_free(got);
	bson_free(exp);
	bson_destroy(&rest);
	bson_destroy(&out);
	sdb_update_free(up);
	bson_destroy(f);
	bson_destroy(u);
	bson_destroy(w);
}

static void test_upsert_doc(void **state)
{
	(void)state;
	check_upsert("{'name': 'x', 'qty': {'$gt': 0}}", "{'$set': {'qty': 1}, '$setOnInsert': {'a': 2}}",
		     "{'name': 'x', 'a': 2, 'qty': 1}", true);
	check_upsert("{'_id': 5, 'name': 'x'}", "{'$inc': {'n': 1}}", "{'_id': 5, 'name': 'x', 'n': 1}",
		     false);
	/* a replacement takes the filter's _id, not its other fields */
	check_upsert("{'_id': 5, 'name': 'x'}", "{'b': 1}", "{'_id': 5, 'b': 1}", false);
	check_upsert("{'name': 'x'}", "{'b': 1}", "{'b': 1}", true);
	/* an _id set by the update is moved first */
	check_upsert("{'name': 'x'}", "{'$set': {'_id': 9}}", "{'_id': 9, 'name': 'x'}", false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_set),
		cmocka_unit_test(test_unset),
		cmocka_unit_test(test_inc),
		cmocka_unit_test(test_inc_mul_decimal),
		cmocka_unit_test(test_mul),
		cmocka_unit_test(test_min_max),
		cmocka_unit_test(test_rename),
		cmocka_unit_test(test_set_on_insert),
		cmocka_unit_test(test_push),
		cmocka_unit_test(test_pull),
		cmocka_unit_test(test_add_to_set),
		cmocka_unit_test(test_pop),
		cmocka_unit_test(test_large_arrays),
		cmocka_unit_test(test_current_date),
		cmocka_unit_test(test_positional),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_pipeline_update),
		cmocka_unit_test(test_replacement),
		cmocka_unit_test(test_upsert_seed),
		cmocka_unit_test(test_upsert_doc),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
