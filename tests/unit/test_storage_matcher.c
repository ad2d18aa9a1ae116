/* Unit tests of storage/matcher.c: table-driven (filter, document, expected match) cases
 * taken from the MongoDB manual's query pages, error codes and messages for bad filters,
 * the value-form matcher used by $pull / $elemMatch projection, and planner bounds. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/matcher.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/collation.h"
#include "storage/matcher.h"
#include "storage/path.h"

/* Copy src into dst renaming keys that start with '%' to '$' (libbson's JSON reader
 * takes {"$type": ...} for the legacy binary syntax, so tests write %type). */
static void fix_keys(const bson_t *src, bson_t *dst)
{
	bson_iter_t it;

	bson_iter_init(&it, src);
	while (bson_iter_next(&it)) {
		char key[128];

		snprintf(key, sizeof key, "%s", bson_iter_key(&it));
		if (key[0] == '%')
			key[0] = '$';
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			const uint8_t *data;
			uint32_t len;
			bson_t sub, child;

			if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
				bson_iter_document(&it, &len, &data);
				bson_append_document_begin(dst, key, -1, &child);
			} else {
				bson_iter_array(&it, &len, &data);
				bson_append_array_begin(dst, key, -1, &child);
			}
			bson_init_static(&sub, data, len);
			fix_keys(&sub, &child);
			if (BSON_ITER_HOLDS_DOCUMENT(&it))
				bson_append_document_end(dst, &child);
			else
				bson_append_array_end(dst, &child);
			continue;
		}
		bson_append_iter(dst, key, -1, &it);
	}
}

static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b, *fixed;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (!b)
		fail_msg("bad test JSON %s: %s", s, e.message);
	free(s);
	fixed = bson_new();
	fix_keys(b, fixed);
	bson_destroy(b);
	return fixed;
}

typedef struct mcase {
	const char *filter;
	const char *doc;
	bool want;
} mcase;

static void run_cases(const mcase *cases, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		bson_t *f = J(cases[i].filter), *d = J(cases[i].doc);
		sdb_matcher *m = NULL;
		int code = 0;
		char err[256] = "";
		bool got;

		if (sdb_matcher_new(f, &m, &code, err, sizeof err) != 0)
			fail_msg("filter %s did not compile: %d %s", cases[i].filter, code, err);
		got = sdb_matcher_match(m, d);
		if (got != cases[i].want)
			fail_msg("filter %s on %s: got %s, want %s", cases[i].filter, cases[i].doc,
				 got ? "match" : "no match", cases[i].want ? "match" : "no match");
		sdb_matcher_free(m);
		bson_destroy(f);
		bson_destroy(d);
	}
}

#define RUN(cases) run_cases(cases, sizeof cases / sizeof cases[0])

static void test_equality(void **state)
{
	static const mcase cases[] = {
		{"{}", "{'a': 1}", true},
		{"{'a': 1}", "{'a': 1}", true},
		{"{'a': 1}", "{'a': 1.0}", true},
		{"{'a': 1}", "{'a': {'$numberLong': '1'}}", true},
		{"{'a': 1}", "{'a': {'$numberDecimal': '1.00'}}", true},
		{"{'a': 1}", "{'a': '1'}", false},
		{"{'a': 1}", "{'b': 1}", false},
		{"{'a': {'$eq': 2}}", "{'a': 2}", true},
		{"{'a': 'x', 'b': 2}", "{'a': 'x', 'b': 2}", true},
		{"{'a': 'x', 'b': 2}", "{'a': 'x', 'b': 3}", false},
		/* embedded document equality is exact, including field order */
		{"{'size': {'h': 14, 'w': 21, 'uom': 'cm'}}",
		 "{'size': {'h': 14, 'w': 21, 'uom': 'cm'}}", true},
		{"{'size': {'w': 21, 'h': 14, 'uom': 'cm'}}",
		 "{'size': {'h': 14, 'w': 21, 'uom': 'cm'}}", false},
		{"{'size.uom': 'in'}", "{'size': {'h': 14, 'uom': 'in'}}", true},
		{"{'a.b.c': 1}", "{'a': {'b': {'c': 1}}}", true},
		{"{'a.b.c': 1}", "{'a': {'b': 1}}", false},
		{"{'_id': {'$oid': '5f0000000000000000000001'}}",
		 "{'_id': {'$oid': '5f0000000000000000000001'}}", true},
		{"{'$comment': 'ignored', 'a': 1}", "{'a': 1}", true},
		/* a DBRef is a literal, not an operator document */
		{"{'r': {'$ref': 'c', '$id': 1}}", "{'r': {'$ref': 'c', '$id': 1}}", true},
		{"{'r': {'$ref': 'c', '$id': 1}}", "{'r': {'$ref': 'c', '$id': 2}}", false},
	};

	(void)state;
	RUN(cases);
}

static void test_arrays(void **state)
{
	static const mcase cases[] = {
		/* "Query an Array": exact array, element, order matters for whole-array */
		{"{'tags': ['red', 'blank']}", "{'tags': ['red', 'blank']}", true},
		{"{'tags': ['red', 'blank']}", "{'tags': ['blank', 'red']}", false},
		{"{'tags': 'red'}", "{'tags': ['blank', 'red']}", true},
		{"{'tags': 'plain'}", "{'tags': ['blank', 'red']}", false},
		/* an array value matches an element that is that array */
		{"{'a': [1, 2]}", "{'a': [[1, 2], 3]}", true},
		{"{'a': [1, 2]}", "{'a': [1, 2, 3]}", false},
		/* compound conditions: different elements may satisfy each predicate */
		{"{'dim': {'$gt': 15, '$lt': 20}}", "{'dim': [14, 21]}", true},
		{"{'a': {'$gt': 1, '$lt': 5}}", "{'a': [0, 6]}", true},
		{"{'a': {'$gt': 1, '$lt': 5}}", "{'a': [0, 0]}", false},
		{"{'a': {'$elemMatch': {'$gt': 1, '$lt': 5}}}", "{'a': [0, 6]}", false},
		{"{'a': {'$elemMatch': {'$gt': 1, '$lt': 5}}}", "{'a': [0, 3]}", true},
		{"{'dim': {'$elemMatch': {'$gt': 22, '$lt': 30}}}", "{'dim': [22.85, 30]}", true},
		{"{'a': {'$elemMatch': {'$gt': 1}}}", "{'a': 5}", false},
		/* index position */
		{"{'dim.1': {'$gt': 25}}", "{'dim': [14, 30]}", true},
		{"{'dim.1': {'$gt': 25}}", "{'dim': [30, 14]}", false},
		{"{'a.0.b': 1}", "{'a': [{'b': 1}, {'b': 2}]}", true},
		{"{'a.1.b': 1}", "{'a': [{'b': 1}, {'b': 2}]}", false},
		/* $size */
		{"{'tags': {'$size': 3}}", "{'tags': ['a', 'b', 'c']}", true},
		{"{'tags': {'$size': 2}}", "{'tags': ['a', 'b', 'c']}", false},
		{"{'tags': {'$size': 0}}", "{'tags': []}", true},
		{"{'tags': {'$size': 1}}", "{'tags': 'a'}", false},
		{"{'a': {'$size': 1}}", "{'a': [[1, 2]]}", true},
		{"{'a': {'$size': 2}}", "{'a': [[1, 2]]}", false},
		/* arrays of embedded documents */
		{"{'instock': {'warehouse': 'A', 'qty': 5}}",
		 "{'instock': [{'warehouse': 'A', 'qty': 5}, {'warehouse': 'C', 'qty': 15}]}", true},
		{"{'instock': {'qty': 5, 'warehouse': 'A'}}",
		 "{'instock': [{'warehouse': 'A', 'qty': 5}]}", false},
		{"{'instock.qty': {'$lte': 20}}", "{'instock': [{'qty': 5}, {'qty': 25}]}", true},
		{"{'instock.qty': {'$lte': 20}}", "{'instock': [{'qty': 25}, {'qty': 35}]}", false},
		{"{'instock.0.qty': {'$lte': 20}}", "{'instock': [{'qty': 25}, {'qty': 5}]}", false},
		{"{'instock': {'$elemMatch': {'qty': 5, 'warehouse': 'A'}}}",
		 "{'instock': [{'warehouse': 'A', 'qty': 15}, {'warehouse': 'B', 'qty': 5}]}", false},
		{"{'instock.qty': 5, 'instock.warehouse': 'A'}",
		 "{'instock': [{'warehouse': 'A', 'qty': 15}, {'warehouse': 'B', 'qty': 5}]}", true},
		{"{'instock': {'$elemMatch': {'qty': {'$gt': 10, '$lte': 20}}}}",
		 "{'instock': [{'qty': 5}, {'qty': 15}]}", true},
		{"{'instock': {'$elemMatch': {'qty': {'$gt': 10, '$lte': 20}}}}",
		 "{'instock': [{'qty': 5}, {'qty': 25}]}", false},
		{"{'instock.qty': {'$gt': 10, '$lte': 20}}", "{'instock': [{'qty': 5}, {'qty': 25}]}",
		 true},
		/* nested arrays are not traversed by a field name */
		{"{'a.b': 1}", "{'a': [[{'b': 1}]]}", false},
		/* whole-array comparison */
		{"{'a': {'$gt': [1]}}", "{'a': [[2]]}", true},
		{"{'a': {'$lt': [2]}}", "{'a': [1, 5]}", true},
	};

	(void)state;
	RUN(cases);
}

static void test_all(void **state)
{
	static const mcase cases[] = {
		{"{'tags': {'$all': ['red', 'blank']}}", "{'tags': ['blank', 'red', 'x']}", true},
		{"{'tags': {'$all': ['red', 'blank']}}", "{'tags': ['red']}", false},
		{"{'tags': {'$all': ['red']}}", "{'tags': 'red'}", true},
		{"{'tags': {'$all': [['a', 'b']]}}", "{'tags': [['a', 'b'], 'c']}", true},
		{"{'tags': {'$all': []}}", "{'tags': ['a']}", false},
		/* $all with $elemMatch (MongoDB manual example) */
		{"{'qty': {'$all': [{'$elemMatch': {'size': 'M', 'num': {'$gt': 50}}}, "
		 "{'$elemMatch': {'num': 100, 'color': 'green'}}]}}",
		 "{'qty': [{'size': 'S', 'num': 10, 'color': 'blue'}, "
		 "{'size': 'M', 'num': 100, 'color': 'green'}]}",
		 true},
		{"{'qty': {'$all': [{'$elemMatch': {'size': 'M', 'num': {'$gt': 50}}}, "
		 "{'$elemMatch': {'num': 100, 'color': 'green'}}]}}",
		 "{'qty': [{'size': 'M', 'num': 60, 'color': 'blue'}, "
		 "{'size': 'L', 'num': 100, 'color': 'red'}]}",
		 false},
		{"{'tags': {'$all': [{'$regularExpression': {'pattern': '^r', 'options': ''}}]}}",
		 "{'tags': ['blank', 'red']}", true},
	};

	(void)state;
	RUN(cases);
}

static void test_null_missing_exists(void **state)
{
	static const mcase cases[] = {
		/* "Query for Null or Missing Fields" */
		{"{'item': null}", "{'item': null}", true},
		{"{'item': null}", "{}", true},
		{"{'item': null}", "{'item': 1}", false},
		{"{'item': {'$eq': null}}", "{}", true},
		{"{'item': {'%type': 10}}", "{'item': null}", true},
		{"{'item': {'%type': 10}}", "{}", false},
		{"{'item': {'$exists': false}}", "{}", true},
		{"{'item': {'$exists': false}}", "{'item': null}", false},
		{"{'item': {'$exists': true}}", "{'item': null}", true},
		{"{'item': {'$exists': 1}}", "{'item': false}", true},
		{"{'item': {'$exists': 0}}", "{'item': false}", false},
		{"{'item': {'$ne': null}}", "{}", false},
		{"{'item': {'$ne': null}}", "{'item': 0}", true},
		{"{'item': {'$in': [null, 5]}}", "{}", true},
		{"{'item': {'$nin': [null, 5]}}", "{}", false},
		{"{'item': {'$nin': [4, 5]}}", "{}", true},
		{"{'item': {'$gte': null}}", "{}", true},
		{"{'item': {'$lte': null}}", "{'item': null}", true},
		{"{'item': {'$gt': null}}", "{}", false},
		{"{'item': null}", "{'item': {'$undefined': true}}", true},
		/* dotted paths: missing in a sub-document or through a scalar */
		{"{'a.b': null}", "{'a': {'c': 1}}", true},
		{"{'a.b': null}", "{'a': 5}", true},
		{"{'a.b': null}", "{'a': [{'b': 1}, {'c': 2}]}", true},
		{"{'a.b': null}", "{'a': [{'b': 1}, {'b': 2}]}", false},
		{"{'a.b': {'$exists': true}}", "{'a': [{'b': 1}, {'c': 2}]}", true},
		{"{'a.b': {'$exists': false}}", "{'a': [1, 2]}", true},
		{"{'a.b': {'$exists': false}}", "{'a': [{'b': null}]}", false},
		{"{'a': null}", "{'a': [1, null]}", true},
		{"{'a': null}", "{'a': [1, 2]}", false},
		{"{'a': {'$exists': true}}", "{'a': []}", true},
	};

	(void)state;
	RUN(cases);
}

/* The document set and expected results of MongoDB's jstests/core/not_equals_null.js
 * (MongoDB 5.0 semantics), one bit per document in the order of null_docs. */
static const char *const null_docs[] = {
	"{'_id': 'a_empty_subobject', 'a': {}}",
	"{'_id': 'a_null', 'a': null}",
	"{'_id': 'a_number', 'a': 4}",
	"{'_id': 'a_subobject_b_not_null', 'a': {'b': 'hi'}}",
	"{'_id': 'a_subobject_b_null', 'a': {'b': null}}",
	"{'_id': 'a_subobject_b_undefined', 'a': {'b': {'$undefined': true}}}",
	"{'_id': 'a_undefined', 'a': {'$undefined': true}}",
	"{'_id': 'no_a'}",
	"{'_id': 'a_double_array', 'a': [[]]}",
	"{'_id': 'a_empty_array', 'a': []}",
	"{'_id': 'a_object_array_all_b_nulls', 'a': [{'b': null}, {'b': {'$undefined': true}}, "
	"{'b': null}, {}]}",
	"{'_id': 'a_object_array_no_b_nulls', 'a': [{'b': 1}, {'b': 3}, {'b': 'string'}]}",
	"{'_id': 'a_object_array_some_b_nulls', 'a': [{'b': null}, {'b': 3}, {'b': null}]}",
	"{'_id': 'a_object_array_some_b_undefined', 'a': [{'b': {'$undefined': true}}, {'b': 3}]}",
	"{'_id': 'a_object_array_some_b_missing', 'a': [{'b': 3}, {}]}",
	"{'_id': 'a_value_array_all_nulls', 'a': [null, null]}",
	"{'_id': 'a_value_array_no_nulls', 'a': [1, 'string', 4]}",
	"{'_id': 'a_value_array_with_null', 'a': [1, 'string', null, 4]}",
	"{'_id': 'a_value_array_with_undefined', 'a': [1, 'string', {'$undefined': true}, 4]}",
};
#define N_NULL_DOCS (sizeof null_docs / sizeof null_docs[0])

static void expect_ids(const char *filter, const char *want)
{
	bson_t *f = J(filter);
	sdb_matcher *m = NULL;
	char err[256], got[2048] = "";

	assert_int_equal(sdb_matcher_new(f, &m, NULL, err, sizeof err), 0);
	for (size_t i = 0; i < N_NULL_DOCS; i++) {
		bson_t *d = J(null_docs[i]);
		bson_iter_t it;

		if (sdb_matcher_match(m, d)) {
			assert_true(bson_iter_init_find(&it, d, "_id"));
			if (got[0])
				strcat(got, " ");
			strcat(got, bson_iter_utf8(&it, NULL));
		}
		bson_destroy(d);
	}
	if (strcmp(got, want) != 0)
		fail_msg("%s:\n got  %s\n want %s", filter, got, want);
	sdb_matcher_free(m);
	bson_destroy(f);
}

static void test_not_equals_null_jstest(void **state)
{
	(void)state;
	expect_ids("{'a': {'$eq': null}}",
		   "a_null a_undefined no_a a_value_array_all_nulls a_value_array_with_null "
		   "a_value_array_with_undefined");
	expect_ids("{'a': {'$ne': null}}",
		   "a_empty_subobject a_number a_subobject_b_not_null a_subobject_b_null "
		   "a_subobject_b_undefined a_double_array a_empty_array a_object_array_all_b_nulls "
		   "a_object_array_no_b_nulls a_object_array_some_b_nulls "
		   "a_object_array_some_b_undefined a_object_array_some_b_missing "
		   "a_value_array_no_nulls");
	expect_ids("{'a.b': {'$eq': null}}",
		   "a_empty_subobject a_null a_number a_subobject_b_null a_subobject_b_undefined "
		   "a_undefined no_a a_object_array_all_b_nulls a_object_array_some_b_nulls "
		   "a_object_array_some_b_undefined a_object_array_some_b_missing");
	expect_ids("{'a.b': {'$ne': null}}",
		   "a_subobject_b_not_null a_double_array a_empty_array a_object_array_no_b_nulls "
		   "a_value_array_all_nulls a_value_array_no_nulls a_value_array_with_null "
		   "a_value_array_with_undefined");
	expect_ids("{'a': {'$elemMatch': {'$eq': null}}}",
		   "a_value_array_all_nulls a_value_array_with_null a_value_array_with_undefined");
	expect_ids("{'a': {'$elemMatch': {'$ne': null}}}",
		   "a_double_array a_object_array_all_b_nulls a_object_array_no_b_nulls "
		   "a_object_array_some_b_nulls a_object_array_some_b_undefined "
		   "a_object_array_some_b_missing a_value_array_no_nulls a_value_array_with_null "
		   "a_value_array_with_undefined");
	expect_ids("{'a.b': {'$elemMatch': {'$eq': null}}}", "");
	expect_ids("{'a.b': {'$elemMatch': {'$ne': null}}}", "");
	expect_ids("{'a': {'$elemMatch': {'b': {'$eq': null}}}}",
		   "a_double_array a_object_array_all_b_nulls a_object_array_some_b_nulls "
		   "a_object_array_some_b_undefined a_object_array_some_b_missing");
	expect_ids("{'a': {'$elemMatch': {'b': {'$ne': null}}}}",
		   "a_object_array_no_b_nulls a_object_array_some_b_nulls "
		   "a_object_array_some_b_undefined a_object_array_some_b_missing");
}

static void test_comparison_brackets(void **state)
{
	static const mcase cases[] = {
		{"{'a': {'$gt': 1}}", "{'a': 'z'}", false},
		{"{'a': {'$lt': 'a'}}", "{'a': 5}", false},
		{"{'a': {'$gt': 1}}", "{'a': 1.5}", true},
		{"{'a': {'$gt': 1}}", "{'a': {'$numberLong': '2'}}", true},
		{"{'a': {'$gte': 1}}", "{'a': {'$numberDecimal': '1'}}", true},
		{"{'a': {'$lt': {'$numberLong': '9007199254740993'}}}", "{'a': 9007199254740992.0}",
		 true},
		{"{'a': {'$gt': 9007199254740992.0}}", "{'a': {'$numberLong': '9007199254740993'}}",
		 true},
		{"{'a': {'$gt': 'abc'}}", "{'a': 'abd'}", true},
		{"{'a': {'$gt': 'abc'}}", "{'a': 'ab'}", false},
		{"{'a': {'$lt': {'$date': {'$numberLong': '100'}}}}",
		 "{'a': {'$date': {'$numberLong': '5'}}}", true},
		{"{'a': {'$lt': {'$date': {'$numberLong': '100'}}}}", "{'a': 5}", false},
		{"{'a': {'$gt': {'$minKey': 1}}}", "{'a': 'x'}", true},
		{"{'a': {'$gt': {'$minKey': 1}}}", "{'a': {'$minKey': 1}}", false},
		{"{'a': {'$lt': {'$maxKey': 1}}}", "{'a': null}", true},
		{"{'a': {'$ne': 1}}", "{'a': [1, 2]}", false},
		{"{'a': {'$ne': 3}}", "{'a': [1, 2]}", true},
		{"{'a': {'$gt': {'$numberDouble': 'NaN'}}}", "{'a': 5}", false},
		{"{'a': {'$lt': 5}}", "{'a': {'$numberDouble': 'NaN'}}", false},
		{"{'a': {'$eq': {'$numberDouble': 'NaN'}}}", "{'a': {'$numberDouble': 'NaN'}}", true},
		{"{'a': {'$gte': {'$numberDouble': 'NaN'}}}", "{'a': {'$numberDecimal': 'NaN'}}", true},
		{"{'a': {'$in': [1, 'x']}}", "{'a': 'x'}", true},
		{"{'a': {'$in': [1, 'x']}}", "{'a': [3, 1.0]}", true},
		{"{'a': {'$in': []}}", "{'a': 1}", false},
		{"{'a': {'$nin': [1, 2]}}", "{'a': [3, 2]}", false},
		{"{'a': {'$nin': [1, 2]}}", "{'a': [3, 4]}", true},
		{"{'a': {'$in': [{'$regularExpression': {'pattern': '^x', 'options': ''}}, 5]}}",
		 "{'a': 'xyz'}", true},
	};

	(void)state;
	RUN(cases);
}

static void test_logical(void **state)
{
	static const mcase cases[] = {
		{"{'$or': [{'a': 1}, {'b': 2}]}", "{'b': 2}", true},
		{"{'$or': [{'a': 1}, {'b': 2}]}", "{'b': 3}", false},
		{"{'$and': [{'a': {'$gt': 1}}, {'a': {'$lt': 3}}]}", "{'a': 2}", true},
		{"{'$and': [{'a': {'$gt': 1}}, {'a': {'$lt': 3}}]}", "{'a': 3}", false},
		{"{'$nor': [{'a': 1}, {'b': 2}]}", "{'a': 2}", true},
		{"{'$nor': [{'a': 1}, {'b': 2}]}", "{'a': 1}", false},
		{"{'$nor': [{'price': 1.99}, {'sale': true}]}", "{}", true},
		{"{'a': {'$not': {'$gt': 5}}}", "{'a': 3}", true},
		{"{'a': {'$not': {'$gt': 5}}}", "{}", true},
		{"{'a': {'$not': {'$gt': 5}}}", "{'a': [1, 7]}", false},
		{"{'a': {'$not': {'$regularExpression': {'pattern': '^p', 'options': ''}}}}",
		 "{'a': 'pear'}", false},
		{"{'a': {'$not': {'$regularExpression': {'pattern': '^p', 'options': ''}}}}",
		 "{'a': 'apple'}", true},
		{"{'a': {'$not': {'%regex': '^P', '%options': 'i'}}}", "{'a': 'pear'}", false},
		{"{'$or': [{'a': 1}, {'$and': [{'b': 2}, {'c': {'$exists': false}}]}]}", "{'b': 2}",
		 true},
	};

	(void)state;
	RUN(cases);
}

static void test_type_mod_regex(void **state)
{
	static const mcase cases[] = {
		{"{'a': {'%type': 'string'}}", "{'a': 'x'}", true},
		{"{'a': {'%type': 2}}", "{'a': 'x'}", true},
		{"{'a': {'%type': 2.0}}", "{'a': 1}", false},
		{"{'a': {'%type': 'number'}}", "{'a': {'$numberDecimal': '1'}}", true},
		{"{'a': {'%type': 'number'}}", "{'a': '1'}", false},
		{"{'a': {'%type': ['string', 'long']}}", "{'a': {'$numberLong': '1'}}", true},
		{"{'a': {'%type': 'int'}}", "{'a': {'$numberLong': '1'}}", false},
		{"{'a': {'%type': 'array'}}", "{'a': []}", true},
		{"{'a': {'%type': 'array'}}", "{'a': 1}", false},
		{"{'a': {'%type': 'string'}}", "{'a': [1, 'x']}", true},
		{"{'a': {'%type': 'minKey'}}", "{'a': {'$minKey': 1}}", true},
		{"{'a': {'%type': -1}}", "{'a': {'$minKey': 1}}", true},
		{"{'a': {'%type': 'objectId'}}", "{'a': {'$oid': '5f0000000000000000000001'}}", true},
		{"{'a': {'$mod': [4, 0]}}", "{'a': 8}", true},
		{"{'a': {'$mod': [4, 0]}}", "{'a': 9}", false},
		{"{'a': {'$mod': [4, 1]}}", "{'a': 9.7}", true},
		{"{'a': {'$mod': [4, -1]}}", "{'a': -5}", true},
		{"{'a': {'$mod': [4, 0]}}", "{'a': '8'}", false},
		{"{'a': {'$mod': [-1, 0]}}", "{'a': {'$numberLong': '-9223372036854775808'}}", true},
		{"{'a': {'%regex': '^ab'}}", "{'a': 'abc'}", true},
		{"{'a': {'%regex': '^AB'}}", "{'a': 'abc'}", false},
		{"{'a': {'%regex': '^AB', '%options': 'i'}}", "{'a': 'abc'}", true},
		{"{'a': {'$regularExpression': {'pattern': '^AB', 'options': 'i'}}}", "{'a': 'abc'}",
		 true},
		{"{'a': {'%regex': '^b', '%options': 'm'}}", "{'a': 'a\\nb'}", true},
		{"{'a': {'%regex': '^b'}}", "{'a': 'a\\nb'}", false},
		{"{'a': {'%regex': 'a.b', '%options': 's'}}", "{'a': 'a\\nb'}", true},
		{"{'a': {'%regex': 'a.b'}}", "{'a': 'a\\nb'}", false},
		{"{'a': {'%regex': 'a b # comment', '%options': 'x'}}", "{'a': 'ab'}", true},
		{"{'a': {'%regex': '\\\\d+'}}", "{'a': ['x', 'y12']}", true},
		{"{'a': {'%regex': 'x'}}", "{'a': 5}", false},
		{"{'a': {'%regex': 'caf\\u00e9', '%options': 'i'}}", "{'a': 'CAF\\u00c9'}", true},
		{"{'a': {'%regex': {'$regularExpression': {'pattern': '^a', 'options': ''}}, "
		 "'%options': 'i'}}",
		 "{'a': 'Abc'}", true},
		/* a regex literal also matches an equal regex value */
		{"{'a': {'$regularExpression': {'pattern': 'x', 'options': 'i'}}}",
		 "{'a': {'$regularExpression': {'pattern': 'x', 'options': 'i'}}}", true},
		{"{'a': {'$eq': {'$regularExpression': {'pattern': 'x', 'options': ''}}}}",
		 "{'a': 'x'}", false},
	};

	(void)state;
	RUN(cases);
}

static void test_elem_match_nested(void **state)
{
	static const mcase cases[] = {
		{"{'results': {'$elemMatch': {'product': 'xyz', 'score': {'$gte': 8}}}}",
		 "{'results': [{'product': 'abc', 'score': 10}, {'product': 'xyz', 'score': 9}]}",
		 true},
		{"{'results': {'$elemMatch': {'product': 'xyz', 'score': {'$gte': 8}}}}",
		 "{'results': [{'product': 'abc', 'score': 10}, {'product': 'xyz', 'score': 5}]}",
		 false},
		{"{'a': {'$elemMatch': {'$or': [{'b': 1}, {'c': 1}]}}}", "{'a': [{'c': 1}]}", true},
		{"{'a': {'$elemMatch': {'$in': [3, 4]}}}", "{'a': [1, 4]}", true},
		{"{'a': {'$elemMatch': {'$not': {'$gt': 3}}}}", "{'a': [5, 6]}", false},
		{"{'a': {'$elemMatch': {'$elemMatch': {'$gt': 3}}}}", "{'a': [[1], [5]]}", true},
		{"{'a.b': {'$elemMatch': {'c': 1}}}", "{'a': [{'b': [{'c': 1}]}]}", true},
		{"{'a': {'$elemMatch': {'b': {'$exists': false}}}}", "{'a': [{'b': 1}, {'c': 1}]}",
		 true},
	};

	(void)state;
	RUN(cases);
}

typedef struct ecase {
	const char *filter;
	int code;
	const char *msg;
} ecase;

static void test_errors(void **state)
{
	static const ecase cases[] = {
		{"{'a': {'$foo': 1}}", 2, "unknown operator: $foo"},
		{"{'$foo': 1}", 2, "unknown top level operator: $foo"},
		{"{'a': {'$gt': 1, 'b': 2}}", 2, "unknown operator: b"},
		{"{'$expr': {'$eq': ['$a', 1]}}", 2,
		 "$expr is not supported here by stripedb (only in the filters of find, count, "
		 "distinct, update, delete, findAndModify and $match)"},
		{"{'$where': 'this.a == 1'}", 2, "$where is not supported by stripedb"},
		{"{'a': {'$in': 1}}", 2, "$in needs an array"},
		{"{'a': {'$nin': {}}}", 2, "$nin needs an array"},
		{"{'a': {'$in': [{'$gt': 1}]}}", 2, "cannot nest $ under $in"},
		{"{'a': {'$all': 1}}", 2, "$all needs an array"},
		{"{'$and': []}", 2, "$and/$or/$nor must be a nonempty array"},
		{"{'$or': {}}", 2, "$or must be an array"},
		{"{'$nor': [1]}", 2, "$or/$and/$nor entries need to be full objects"},
		{"{'a': {'$size': -1}}", 2, "$size may not be negative"},
		{"{'a': {'$size': 1.5}}", 2, "$size must be a whole number"},
		{"{'a': {'$size': 'x'}}", 2, "$size needs a number"},
		{"{'a': {'%type': 'nope'}}", 2, "Unknown type name alias: nope"},
		{"{'a': {'%type': 99}}", 2, "Invalid numerical type code: 99"},
		{"{'a': {'%type': []}}", 2, "$type must match at least one type"},
		{"{'a': {'$mod': [0, 1]}}", 2, "divisor cannot be 0"},
		{"{'a': {'$mod': [1]}}", 2, "malformed mod, not enough elements"},
		{"{'a': {'$mod': [1, 2, 3]}}", 2, "malformed mod, too many elements"},
		{"{'a': {'$mod': 4}}", 2, "malformed mod, needs to be an array"},
		{"{'a': {'$mod': ['x', 1]}}", 2, "malformed mod, divisor not a number"},
		{"{'a': {'%regex': '(' }}", 51091,
		 "Regular expression is invalid: missing closing parenthesis"},
		{"{'a': {'%regex': 'a', '%options': 'q'}}", 51108, "invalid flag in regex options: q"},
		{"{'a': {'%options': 'i'}}", 2, "$options needs a $regex"},
		{"{'a': {'%regex': 5}}", 2, "$regex has to be a string"},
		{"{'a': {'$not': 5}}", 2, "$not needs a regex or a document"},
		{"{'a': {'$not': {}}}", 2, "$not cannot be empty"},
		{"{'a': {'$elemMatch': 1}}", 2, "$elemMatch needs an Object"},
		{"{'a': {'$all': [{'$elemMatch': {'b': 1}}, 2]}}", 2,
		 "$all/$elemMatch has to be consistent"},
		{"{'$or': [{'a': {'$bad': 1}}]}", 2, "unknown operator: $bad"},
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *f = J(cases[i].filter);
		sdb_matcher *m = (sdb_matcher *)1;
		int code = 0;
		char err[256] = "";

		if (sdb_matcher_new(f, &m, &code, err, sizeof err) != -2)
			fail_msg("filter %s compiled", cases[i].filter);
		assert_null(m);
		if (code != cases[i].code || strcmp(err, cases[i].msg) != 0)
			fail_msg("filter %s: got %d '%s', want %d '%s'", cases[i].filter, code, err,
				 cases[i].code, cases[i].msg);
		bson_destroy(f);
	}
}

/* $expr (SDB_MATCHER_EXPR): aggregation expressions over the whole document, at the top
 * and inside $and/$or/$nor; refused inside $elemMatch; evaluation errors fail the match. */
static void test_expr(void **state)
{
	static const struct {
		const char *filter;
		const char *doc;
		int want; /* 1, 0, or -1 for an evaluation error */
	} cases[] = {
		{"{'$expr': {'$gt': ['$a', '$b']}}", "{'a': 2, 'b': 1}", 1},
		{"{'$expr': {'$gt': ['$a', '$b']}}", "{'a': 1, 'b': 2}", 0},
		{"{'$expr': '$flag'}", "{'flag': 0}", 0},
		{"{'$expr': '$flag'}", "{'flag': 'x'}", 1},
		{"{'$expr': '$missing'}", "{'a': 1}", 0},
		{"{'a': 1, '$expr': {'$eq': ['$b', 2]}}", "{'a': 1, 'b': 2}", 1},
		{"{'a': 1, '$expr': {'$eq': ['$b', 2]}}", "{'a': 2, 'b': 2}", 0},
		{"{'$or': [{'a': 5}, {'$expr': {'$eq': ['$b', 2]}}]}", "{'a': 1, 'b': 2}", 1},
		{"{'$nor': [{'$expr': {'$eq': ['$b', 2]}}]}", "{'b': 2}", 0},
		{"{'$expr': {'$eq': [{'$divide': [1, '$z']}, 1]}}", "{'z': 0}", -1},
		/* an error under $nor or $or is still an error, not a match */
		{"{'$nor': [{'$expr': {'$divide': [1, '$z']}}]}", "{'z': 0}", -1},
		{"{'$or': [{'$expr': {'$divide': [1, '$z']}}, {'z': 0}]}", "{'z': 0}", -1},
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *f = J(cases[i].filter), *d = J(cases[i].doc);
		sdb_matcher *m = NULL;
		int code = 0, r;
		char err[256] = "";

		if (sdb_matcher_new_opts(f, SDB_MATCHER_EXPR, &m, &code, err, sizeof err) != 0)
			fail_msg("filter %s: %d %s", cases[i].filter, code, err);
		r = sdb_matcher_eval(m, d, &code, err, sizeof err);
		if (cases[i].want < 0) {
			if (r >= 0 || code != 16608)
				fail_msg("filter %s on %s: got %d (code %d), want the $divide error",
					 cases[i].filter, cases[i].doc, r, code);
			assert_false(sdb_matcher_match(m, d));
		} else if (r != cases[i].want) {
			fail_msg("filter %s on %s: got %d, want %d", cases[i].filter, cases[i].doc, r,
				 cases[i].want);
		}
		sdb_matcher_free(m);
		bson_destroy(f);
		bson_destroy(d);
	}

	static const struct {
		const char *filter;
		int code;
		const char *msg;
	} bad[] = {
		{"{'a': {'$elemMatch': {'$expr': {'$eq': ['$b', 1]}}}}", 2,
		 "$expr can only be applied to the top-level document"},
		{"{'$expr': {'$nosuch': 1}}", 168, "Unrecognized expression '$nosuch'"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		bson_t *f = J(bad[i].filter);
		sdb_matcher *m = NULL;
		int code = 0;
		char err[256] = "";

		assert_int_not_equal(
			sdb_matcher_new_opts(f, SDB_MATCHER_EXPR, &m, &code, err, sizeof err), 0);
		assert_null(m);
		if (code != bad[i].code || strcmp(err, bad[i].msg) != 0)
			fail_msg("filter %s: got %d '%s', want %d '%s'", bad[i].filter, code, err,
				 bad[i].code, bad[i].msg);
		bson_destroy(f);
	}
}

static void test_value_form(void **state)
{
	bson_t *c = J("{'$gte': 6}");
	bson_t *obj = J("{'b': {'$lt': 3}}");
	bson_t *vals = J("{'x': 5, 'y': 6, 'z': {'b': 1}, 'w': {'b': 4}}");
	sdb_matcher *m = NULL, *mo = NULL;
	bson_iter_t it;
	char err[128];

	(void)state;
	assert_int_equal(sdb_matcher_new_elem(c, &m, NULL, err, sizeof err), 0);
	assert_int_equal(sdb_matcher_new_elem(obj, &mo, NULL, err, sizeof err), 0);
	assert_true(bson_iter_init_find(&it, vals, "x"));
	assert_false(sdb_matcher_match_value(m, &it));
	assert_false(sdb_matcher_match_value(mo, &it));
	assert_true(bson_iter_init_find(&it, vals, "y"));
	assert_true(sdb_matcher_match_value(m, &it));
	assert_true(bson_iter_init_find(&it, vals, "z"));
	assert_false(sdb_matcher_match_value(m, &it));
	assert_true(sdb_matcher_match_value(mo, &it));
	assert_true(bson_iter_init_find(&it, vals, "w"));
	assert_false(sdb_matcher_match_value(mo, &it));
	sdb_matcher_free(m);
	sdb_matcher_free(mo);
	bson_destroy(c);
	bson_destroy(obj);
	bson_destroy(vals);
}

/* ---- bounds ----------------------------------------------------------------------- */

/* Render bounds as "[lo, hi]" strings using reference encodings of values from JSON:
 * each expected interval is (lo_json or NULL for "start of bracket B", lo_incl, ...). */
typedef struct xiv {
	const char *lo;	 /* JSON value, or "#N" for the bare bracket byte N (hex) */
	bool lo_incl;
	const char *hi;
	bool hi_incl;
} xiv;

static void enc_ref(const char *s, sdb_key *k)
{
	char buf[256];
	bson_t *d;
	bson_iter_t it;
	char err[64];

	sdb_key_init(k);
	if (s[0] == '#') {
		uint8_t b = (uint8_t)strtoul(s + 1, NULL, 16);

		sdb_key_append(k, &b, 1);
		return;
	}
	snprintf(buf, sizeof buf, "{'v': %s}", s);
	d = J(buf);
	assert_true(bson_iter_init_find(&it, d, "v"));
	assert_int_equal(sdb_keyenc_append_iter(k, &it, false, err, sizeof err), 0);
	bson_destroy(d);
}

static void expect_bounds(const char *filter, const char *path, bool multikey,
			  sdb_bounds_kind kind, const xiv *want, size_t n)
{
	bson_t *f = J(filter);
	sdb_bounds b;
	char err[128];

	assert_int_equal(sdb_matcher_bounds(f, path, multikey, &b, err, sizeof err), 0);
	if (b.kind != kind || b.n != n)
		fail_msg("bounds(%s, %s): kind %d n %zu, want kind %d n %zu", filter, path, b.kind,
			 b.n, kind, n);
	for (size_t i = 0; i < n; i++) {
		sdb_key lo, hi;

		enc_ref(want[i].lo, &lo);
		enc_ref(want[i].hi, &hi);
		if (sdb_key_cmp(&lo, &b.iv[i].lo) || sdb_key_cmp(&hi, &b.iv[i].hi) ||
		    b.iv[i].lo_incl != want[i].lo_incl || b.iv[i].hi_incl != want[i].hi_incl)
			fail_msg("bounds(%s, %s): interval %zu differs from %s..%s", filter, path, i,
				 want[i].lo, want[i].hi);
		sdb_key_free(&lo);
		sdb_key_free(&hi);
	}
	sdb_bounds_free(&b);
	bson_destroy(f);
}

static void test_bounds(void **state)
{
	(void)state;
	{
		static const xiv w[] = {{"5", true, "5", true}};

		expect_bounds("{'a': 5, 'b': 1}", "a", false, SDB_BOUNDS_POINTS, w, 1);
		expect_bounds("{'a': {'$eq': 5.0}}", "a", false, SDB_BOUNDS_POINTS, w, 1);
	}
	expect_bounds("{'a': 5}", "b", false, SDB_BOUNDS_ALL, NULL, 0);
	expect_bounds("{'a': {'$ne': 5}}", "a", false, SDB_BOUNDS_ALL, NULL, 0);
	expect_bounds("{'$or': [{'a': 1}, {'a': 2}]}", "a", false, SDB_BOUNDS_ALL, NULL, 0);
	expect_bounds("{'a': [1, 2]}", "a", false, SDB_BOUNDS_ALL, NULL, 0);
	{
		/* null also covers undefined (and missing, which is indexed as null) */
		static const xiv w[] = {{"{'$undefined': true}", true, "{'$undefined': true}", true},
					{"null", true, "null", true}};

		expect_bounds("{'a': null}", "a", false, SDB_BOUNDS_POINTS, w, 2);
	}
	{
		/* $in: sorted, deduplicated points */
		static const xiv w[] = {{"1", true, "1", true},
					{"3", true, "3", true},
					{"'x'", true, "'x'", true}};

		expect_bounds("{'a': {'$in': ['x', 3, 1, 1.0]}}", "a", false, SDB_BOUNDS_POINTS, w, 3);
	}
	expect_bounds("{'a': {'$in': []}}", "a", false, SDB_BOUNDS_EMPTY, NULL, 0);
	{
		/* {$gt: 5}: (5, end of numbers) */
		static const xiv w[] = {{"5", false, "#1F", false}};

		expect_bounds("{'a': {'$gt': 5}}", "a", false, SDB_BOUNDS_RANGE, w, 1);
	}
	{
		static const xiv w[] = {{"#28", true, "'m'", true}};

		expect_bounds("{'a': {'$lte': 'm'}}", "a", false, SDB_BOUNDS_RANGE, w, 1);
	}
	{
		/* intersected for a non-multikey index */
		static const xiv w[] = {{"1", false, "5", false}};

		expect_bounds("{'a': {'$gt': 1, '$lt': 5}}", "a", false, SDB_BOUNDS_RANGE, w, 1);
		expect_bounds("{'$and': [{'a': {'$gt': 1}}, {'a': {'$lt': 5}}]}", "a", false,
			      SDB_BOUNDS_RANGE, w, 1);
	}
	{
		/* multikey: only one predicate is used ({a: [0, 6]} must still be found) */
		static const xiv w[] = {{"1", false, "#1F", false}};

		expect_bounds("{'a': {'$gt': 1, '$lt': 5}}", "a", true, SDB_BOUNDS_RANGE, w, 1);
	}
	{
		/* multikey prefers the equality */
		static const xiv w[] = {{"3", true, "3", true}};

		expect_bounds("{'a': {'$gt': 1}, '$and': [{'a': 3}]}", "a", true, SDB_BOUNDS_POINTS,
			      w, 1);
	}
	{
		static const xiv w[] = {{"2", true, "2", true}, {"3", true, "3", true}};

		expect_bounds("{'a': {'$in': [1, 2, 3, 'z']}, 'b': 1, '$and': [{'a': {'$gte': 2}}]}",
			      "a", false, SDB_BOUNDS_POINTS, w, 2);
	}
	{
		/* $elemMatch intersects even on a multikey index */
		static const xiv w[] = {{"1", true, "5", false}};

		expect_bounds("{'a': {'$elemMatch': {'$gte': 1, '$lt': 5}}}", "a", true,
			      SDB_BOUNDS_RANGE, w, 1);
	}
	{
		/* ... and combines with other predicates by the multikey rule (points first) */
		static const xiv w[] = {{"3", true, "3", true}};

		expect_bounds("{'a': {'$elemMatch': {'$gte': 1, '$lt': 5}, '$in': [3]}}", "a", true,
			      SDB_BOUNDS_POINTS, w, 1);
	}
	expect_bounds("{'a': {'$elemMatch': {'$gte': 5, '$lt': 1}}}", "a", true, SDB_BOUNDS_EMPTY,
		      NULL, 0);
	/* the object form says nothing about the values of a itself */
	expect_bounds("{'a': {'$elemMatch': {'b': 1}}}", "a", true, SDB_BOUNDS_ALL, NULL, 0);
	/* contradiction: intersection is empty */
	expect_bounds("{'a': {'$gt': 5, '$lt': 1}}", "a", false, SDB_BOUNDS_EMPTY, NULL, 0);
	expect_bounds("{'a': {'$gt': 5, '$lt': 'x'}}", "a", false, SDB_BOUNDS_EMPTY, NULL, 0);
	{
		static const xiv w[] = {{"2", true, "2", true}};

		expect_bounds("{'a.b': 2}", "a.b", false, SDB_BOUNDS_POINTS, w, 1);
	}
	{
		bson_t *f = J("{'a': {'$foo': 1}}");
		sdb_bounds b;
		char err[128];

		assert_int_equal(sdb_matcher_bounds(f, "a", false, &b, err, sizeof err), -2);
		assert_string_equal(err, "unknown operator: $foo");
		bson_destroy(f);
	}
}

/* Bounds are a superset: every document that matches has its key inside the bounds. */
static void test_bounds_superset(void **state)
{
	static const char *const filters[] = {
		"{'a': {'$gt': 2, '$lte': 7}}", "{'a': {'$in': [1, 4, 'x']}}", "{'a': {'$lt': 'q'}}",
		"{'a': 4}", "{'a': {'$gte': 3}, 'b': 1}",
	};
	static const char *const values[] = {"0", "1", "2", "2.5", "3", "4", "7", "7.5", "'p'",
					     "'x'", "'z'", "null", "{'$numberLong': '4'}", "true"};

	(void)state;
	for (size_t f = 0; f < sizeof filters / sizeof filters[0]; f++) {
		bson_t *fb = J(filters[f]);
		sdb_matcher *m;
		sdb_bounds b;
		char err[128];
		int hits = 0;

		assert_int_equal(sdb_matcher_new(fb, &m, NULL, err, sizeof err), 0);
		assert_int_equal(sdb_matcher_bounds(fb, "a", false, &b, err, sizeof err), 0);
		for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
			char buf[128];
			bson_t *d;
			sdb_key k;
			bool inside = b.kind == SDB_BOUNDS_ALL;

			snprintf(buf, sizeof buf, "{'a': %s, 'b': 1}", values[v]);
			d = J(buf);
			enc_ref(values[v], &k);
			for (size_t i = 0; i < b.n; i++) {
				int lo = sdb_key_cmp(&k, &b.iv[i].lo), hi = sdb_key_cmp(&k, &b.iv[i].hi);

				if ((lo > 0 || (lo == 0 && b.iv[i].lo_incl)) &&
				    (hi < 0 || (hi == 0 && b.iv[i].hi_incl)))
					inside = true;
			}
			if (sdb_matcher_match(m, d)) {
				hits++;
				if (!inside)
					fail_msg("%s matches %s but its key is outside the bounds",
						 filters[f], values[v]);
			}
			sdb_key_free(&k);
			bson_destroy(d);
		}
		assert_true(hits > 0);
		sdb_bounds_free(&b);
		sdb_matcher_free(m);
		bson_destroy(fb);
	}
}

/* Random planner property (fixed seed): for random filters over "a" built from a pool of
 * values of every bracket, and documents whose "a" is a pool value, missing, or an array
 * of pool values: whenever the matcher accepts a document, one of the document's index
 * keys for {a: 1} lies inside the bounds (computed with multikey = the document's own
 * multikey flag, as a store would for a collection holding only such documents). */
static const char *const pool[] = {
	"{'$minKey': 1}", "null", "{'$undefined': true}", "{'$numberDouble': 'NaN'}",
	"{'$numberDouble': '-Infinity'}", "-5", "-1.5", "0", "1", "1.0",
	"{'$numberLong': '2'}", "{'$numberDecimal': '2.5'}", "3", "9007199254740993",
	"{'$numberDouble': 'Infinity'}", "''", "'a'", "'b'", "'ba'", "{}", "{'x': 1}",
	"{'x': 'y'}", "[]", "[1]", "[1, 2]", "{'$binary': {'base64': 'AA==', 'subType': '00'}}",
	"{'$oid': '000000000000000000000001'}", "false", "true",
	"{'$date': {'$numberLong': '0'}}", "{'$date': {'$numberLong': '99'}}",
	"{'$timestamp': {'t': 1, 'i': 1}}",
	"{'$regularExpression': {'pattern': 'a', 'options': ''}}", "{'$maxKey': 1}",
};
#define N_POOL (sizeof pool / sizeof pool[0])

static uint64_t prng = 0x9E3779B97F4A7C15ULL;

static unsigned rnd(unsigned n)
{
	prng ^= prng << 13;
	prng ^= prng >> 7;
	prng ^= prng << 17;
	return (unsigned)(prng % n);
}

static void test_bounds_random_property(void **state)
{
	static const char *const ops[] = {"$eq", "$gt", "$gte", "$lt", "$lte", "$in", "$ne"};
	char filter[1024], doc[512];
	int checked = 0, matched = 0;

	(void)state;
	for (int round = 0; round < 3000; round++) {
		int npred = 1 + (int)rnd(3);
		bson_t *f;
		sdb_matcher *m;
		sdb_bounds bounds[2]; /* [0] non-multikey, [1] multikey */
		char err[256];

		snprintf(filter, sizeof filter, "{'$and': [");
		for (int i = 0; i < npred; i++) {
			const char *op = ops[rnd(7)];
			size_t len = strlen(filter);

			if (rnd(6) == 0)
				snprintf(filter + len, sizeof filter - len,
					 "%s{'a': {'$elemMatch': {'$gte': %s, '$lt': %s}}}", i ? ", " : "",
					 pool[rnd(N_POOL)], pool[rnd(N_POOL)]);
			else if (strcmp(op, "$in") == 0)
				snprintf(filter + len, sizeof filter - len, "%s{'a': {'$in': [%s, %s]}}",
					 i ? ", " : "", pool[rnd(N_POOL)], pool[rnd(N_POOL)]);
			else
				snprintf(filter + len, sizeof filter - len, "%s{'a': {'%s': %s}}",
					 i ? ", " : "", op, pool[rnd(N_POOL)]);
		}
		strncat(filter, "]}", sizeof filter - strlen(filter) - 1);
		f = J(filter);
		assert_int_equal(sdb_matcher_new(f, &m, NULL, err, sizeof err), 0);
		assert_int_equal(sdb_matcher_bounds(f, "a", false, &bounds[0], err, sizeof err), 0);
		assert_int_equal(sdb_matcher_bounds(f, "a", true, &bounds[1], err, sizeof err), 0);
		for (int d = 0; d < 60; d++) {
			unsigned shape = rnd(4);
			bson_t *db;
			const char *path = "a";
			sdb_key *keys = NULL;
			size_t nkeys = 0;
			bool mk = false, inside = false;
			int code;

			if (shape == 0)
				snprintf(doc, sizeof doc, "{'b': 1}");
			else if (shape == 1)
				snprintf(doc, sizeof doc, "{'a': %s}", pool[rnd(N_POOL)]);
			else
				snprintf(doc, sizeof doc, "{'a': [%s, %s]}", pool[rnd(N_POOL)],
					 pool[rnd(N_POOL)]);
			db = J(doc);
			if (!sdb_matcher_match(m, db)) {
				bson_destroy(db);
				continue;
			}
			matched++;
			assert_int_equal(sdb_index_keys(db, &path, NULL, 1, &keys, &nkeys, &mk, &code,
							err, sizeof err),
					 0);
			{
				const sdb_bounds *b = &bounds[mk ? 1 : 0];

				inside = b->kind == SDB_BOUNDS_ALL;
				for (size_t k = 0; k < nkeys && !inside; k++) {
					for (size_t i = 0; i < b->n; i++) {
						int lo = sdb_key_cmp(&keys[k], &b->iv[i].lo);
						int hi = sdb_key_cmp(&keys[k], &b->iv[i].hi);

						if ((lo > 0 || (lo == 0 && b->iv[i].lo_incl)) &&
						    (hi < 0 || (hi == 0 && b->iv[i].hi_incl)))
							inside = true;
					}
				}
			}
			if (!inside)
				fail_msg("filter %s matches %s but no index key is inside the bounds",
					 filter, doc);
			checked++;
			sdb_index_keys_free(keys, nkeys);
			bson_destroy(db);
		}
		sdb_bounds_free(&bounds[0]);
		sdb_bounds_free(&bounds[1]);
		sdb_matcher_free(m);
		bson_destroy(f);
	}
	/* the random filters matched a meaningful number of documents */
	assert_true(matched > 5000);
	assert_int_equal(checked, matched);
}

/* Found by fuzzing: a nested document whose length field is inconsistent (libbson's
 * bson_validate() accepts the outer document, bson_iter_value() gives NULL data for the
 * inner one). Matching it against a filter compiled from itself must not abort. */
static void test_malformed_nested(void **state)
{
	static const uint8_t bytes[] = {
		0x38, 0x00, 0x00, 0x00, 0x03, 0x61, 0x00, 0x30, 0x00, 0x00, 0x00, 0x04,
		0x24, 0x61, 0x6c, 0x6c, 0x00, 0x25, 0x00, 0x00, 0x00, 0x03, 0x30, 0x06,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x24, 0x4d, 0x65, 0x74, 0x6d,
		0x6c, 0x63, 0x68, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x10, 0x78, 0x00, 0x01,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00,
	};
	bson_t doc;
	sdb_matcher *m = NULL;
	char err[128];

	(void)state;
	assert_true(bson_init_static(&doc, bytes, sizeof bytes));
	/* {a: {$all: [<malformed>]}}: compiles to an equality with the malformed value */
	assert_int_equal(sdb_matcher_new(&doc, &m, NULL, err, sizeof err), 0);
	assert_false(sdb_matcher_match(m, &doc));
	sdb_matcher_free(m);
}

/* A $in of IN_SORTED_MIN or more values is answered by a binary search over a sorted copy
 * (in_sorted_has): random lists drawn from values of every bracket (numbers of four types
 * that compare equal, NaN, null, undefined, strings that a case-insensitive collation makes
 * equal, arrays, documents, MinKey/MaxKey) must match exactly the documents the same list
 * matches as an $or of $eq clauses, under the simple collation, under a case-insensitive
 * one, and when the list was sorted under one collation and is evaluated under the other
 * (the linear scan then answers). */
static void append_pool_value(bson_t *b, const char *k, int i)
{
	bson_t sub;
	bson_decimal128_t d;

	switch (i) {
	case 0: BSON_APPEND_INT32(b, k, 1); break;
	case 1: BSON_APPEND_INT64(b, k, 1); break;
	case 2: BSON_APPEND_DOUBLE(b, k, 1.0); break;
	case 3: bson_decimal128_from_string("1.0", &d); BSON_APPEND_DECIMAL128(b, k, &d); break;
	case 4: BSON_APPEND_DOUBLE(b, k, 2.5); break;
	case 5: BSON_APPEND_DOUBLE(b, k, NAN); break;
	case 6: BSON_APPEND_NULL(b, k); break;
	case 7: BSON_APPEND_UNDEFINED(b, k); break;
	case 8: BSON_APPEND_UTF8(b, k, "ping"); break;
	case 9: BSON_APPEND_UTF8(b, k, "PING"); break;
	case 10: BSON_APPEND_UTF8(b, k, "pong"); break;
	case 11: BSON_APPEND_BOOL(b, k, true); break;
	case 12: BSON_APPEND_BOOL(b, k, false); break;
	case 13: BSON_APPEND_MINKEY(b, k); break;
	case 14: BSON_APPEND_MAXKEY(b, k); break;
	case 15: BSON_APPEND_DATE_TIME(b, k, 1000); break;
	case 16:
		BSON_APPEND_ARRAY_BEGIN(b, k, &sub);
		BSON_APPEND_INT32(&sub, "0", 1);
		BSON_APPEND_UTF8(&sub, "1", "ping");
		bson_append_array_end(b, &sub);
		break;
	case 17:
		BSON_APPEND_DOCUMENT_BEGIN(b, k, &sub);
		BSON_APPEND_UTF8(&sub, "x", "PONG");
		bson_append_document_end(b, &sub);
		break;
	case 18:
		BSON_APPEND_DOCUMENT_BEGIN(b, k, &sub);
		BSON_APPEND_UTF8(&sub, "x", "pong");
		bson_append_document_end(b, &sub);
		break;
	case 19: BSON_APPEND_INT32(b, k, -7); break;
	case 20: BSON_APPEND_DOUBLE(b, k, 1e300); break;
	case 21: BSON_APPEND_UTF8(b, k, ""); break;
	default: BSON_APPEND_INT64(b, k, (int64_t)i * 1000003); break;
	}
}

#define POOL 40

static sdb_matcher *in_filter(const int *vals, int n, bool as_or)
{
	bson_t f = BSON_INITIALIZER, a, in, arr;
	char key[16];
	sdb_matcher *m = NULL;
	char err[256];

	if (as_or) {
		BSON_APPEND_ARRAY_BEGIN(&f, "$or", &arr);
		for (int i = 0; i < n; i++) {
			bson_t cl, eq;

			snprintf(key, sizeof key, "%d", i);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, key, &cl);
			BSON_APPEND_DOCUMENT_BEGIN(&cl, "a", &eq);
			append_pool_value(&eq, "$eq", vals[i]);
			bson_append_document_end(&cl, &eq);
			bson_append_document_end(&arr, &cl);
		}
		bson_append_array_end(&f, &arr);
	} else {
		BSON_APPEND_DOCUMENT_BEGIN(&f, "a", &a);
		BSON_APPEND_ARRAY_BEGIN(&a, "$in", &in);
		for (int i = 0; i < n; i++) {
			snprintf(key, sizeof key, "%d", i);
			append_pool_value(&in, key, vals[i]);
		}
		bson_append_array_end(&a, &in);
		bson_append_document_end(&f, &a);
	}
	assert_int_equal(sdb_matcher_new(&f, &m, NULL, err, sizeof err), 0);
	bson_destroy(&f);
	return m;
}

static void test_in_sorted_equals_linear(void **state)
{
	(void)state;
	const sdb_collator *ci = NULL;
	bson_t spec = BSON_INITIALIZER;
	int code = 0;
	char err[256];

	BSON_APPEND_UTF8(&spec, "locale", "en_US");
	BSON_APPEND_INT32(&spec, "strength", 2);
	assert_int_equal(sdb_collation_parse_doc(&spec, &ci, &code, err, sizeof err), 0);
	bson_destroy(&spec);
	/* the documents: {a: v} for each pool value, {a: [v, w]}, and {} */
	bson_t *docs[POOL + POOL + 1];
	int nd = 0;
	for (int i = 0; i < POOL; i++) {
		docs[nd] = bson_new();
		append_pool_value(docs[nd++], "a", i);
	}
	for (int i = 0; i < POOL; i++) {
		bson_t arr;

		docs[nd] = bson_new();
		BSON_APPEND_ARRAY_BEGIN(docs[nd], "a", &arr);
		append_pool_value(&arr, "0", i);
		append_pool_value(&arr, "1", (i * 7 + 3) % POOL);
		bson_append_array_end(docs[nd++], &arr);
	}
	docs[nd++] = bson_new();
	unsigned seed = 12345;
	int checked_sorted = 0;
	for (int trial = 0; trial < 300; trial++) {
		int vals[64], n = IN_SORTED_MIN + (int)(rand_r(&seed) % 30);

		for (int i = 0; i < n; i++)
			vals[i] = (int)(rand_r(&seed) % POOL);
		/* 0: simple/simple, 1: ci/ci, 2: sorted simple evaluated ci, 3: sorted ci
		 * evaluated simple */
		int mode = trial % 4;
		const sdb_collator *at_parse = (mode == 1 || mode == 3) ? ci : NULL;
		const sdb_collator *at_eval = (mode == 1 || mode == 2) ? ci : NULL;
		const sdb_collator *prev = sdb_collation_use(at_parse);
		sdb_matcher *in = in_filter(vals, n, false);
		sdb_collation_use(at_eval);
		sdb_matcher *ors = in_filter(vals, n, true);
		for (int d = 0; d < nd; d++) {
			bool a = sdb_matcher_match(in, docs[d]), b = sdb_matcher_match(ors, docs[d]);
			if (a != b) {
				char *j = bson_as_relaxed_extended_json(docs[d], NULL);
				fail_msg("trial %d mode %d doc %s: $in %d, $or %d", trial, mode, j, a, b);
			}
		}
		checked_sorted += at_parse == at_eval;
		sdb_matcher_free(in);
		sdb_matcher_free(ors);
		sdb_collation_use(prev);
	}
	assert_true(checked_sorted > 100);
	for (int d = 0; d < nd; d++)
		bson_destroy(docs[d]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_equality),
		cmocka_unit_test(test_arrays),
		cmocka_unit_test(test_all),
		cmocka_unit_test(test_null_missing_exists),
		cmocka_unit_test(test_not_equals_null_jstest),
		cmocka_unit_test(test_comparison_brackets),
		cmocka_unit_test(test_logical),
		cmocka_unit_test(test_type_mod_regex),
		cmocka_unit_test(test_elem_match_nested),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_expr),
		cmocka_unit_test(test_value_form),
		cmocka_unit_test(test_bounds),
		cmocka_unit_test(test_bounds_superset),
		cmocka_unit_test(test_bounds_random_property),
		cmocka_unit_test(test_malformed_nested),
		cmocka_unit_test(test_in_sorted_equals_linear),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
