/* Unit tests of storage/projection.c, the one projection engine: find's inclusion/exclusion
 * with _id rules, dotted paths through arrays, $slice, $elemMatch; aggregation's $project
 * and $addFields with computed fields; MongoDB's error codes. Results are compared as
 * canonical extended JSON, so field order and numeric types count. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/projection.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "storage/projection.h"

static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (!b)
		fail_msg("bad test JSON %s: %s", s, e.message);
	free(s);
	return b;
}

typedef struct pcase {
	const char *spec;
	const char *doc;
	const char *want;
} pcase;

static void run_kind(const pcase *c, size_t n, sdb_projection_kind kind)
{
	for (size_t i = 0; i < n; i++) {
		bson_t *spec = J(c[i].spec), *doc = J(c[i].doc), *want = J(c[i].want);
		sdb_projection *p = NULL;
		bson_t out = BSON_INITIALIZER;
		int code = 0;
		char err[256] = "";
		char *g, *w;

		if (sdb_projection_new_kind(spec, kind, &p, &code, err, sizeof err) != 0)
			fail_msg("projection %s: %d %s", c[i].spec, code, err);
		if (sdb_projection_eval(p, doc, &out, &code, err, sizeof err) != 0)
			fail_msg("projection %s of %s: %d %s", c[i].spec, c[i].doc, code, err);
		g = bson_as_canonical_extended_json(&out, NULL);
		w = bson_as_canonical_extended_json(want, NULL);
		if (strcmp(g, w) != 0)
			fail_msg("projection %s of %s:\n got  %s\n want %s", c[i].spec, c[i].doc, g, w);
		bson_free(g);
		bson_free(w);
		bson_destroy(&out);
		sdb_projection_free(p);
		bson_destroy(spec);
		bson_destroy(doc);
		bson_destroy(want);
	}
}

#define RUN(cases) run_kind(cases, sizeof cases / sizeof cases[0], SDB_PROJECTION_FIND)
#define RUN_AS(kind, cases) run_kind(cases, sizeof cases / sizeof cases[0], kind)

static const char *const inventory =
	"{'_id': 1, 'item': 'journal', 'status': 'A', 'size': {'h': 14, 'w': 21, 'uom': 'cm'}, "
	"'instock': [{'warehouse': 'A', 'qty': 5}, {'warehouse': 'C', 'qty': 15}]}";

static void test_inclusion_exclusion(void **state)
{
	const pcase cases[] = {
		{"{}", "{'_id': 1, 'a': 1}", "{'_id': 1, 'a': 1}"},
		{"{'item': 1, 'status': 1}", inventory, "{'_id': 1, 'item': 'journal', 'status': 'A'}"},
		{"{'status': true, 'item': 1}", inventory,
		 "{'_id': 1, 'item': 'journal', 'status': 'A'}"},
		{"{'item': 1, 'status': 1, '_id': 0}", inventory, "{'item': 'journal', 'status': 'A'}"},
		{"{'status': 0, 'instock': 0}", inventory,
		 "{'_id': 1, 'item': 'journal', 'size': {'h': 14, 'w': 21, 'uom': 'cm'}}"},
		{"{'_id': 0}", "{'_id': 1, 'a': 2}", "{'a': 2}"},
		{"{'_id': 1}", "{'_id': 1, 'a': 2}", "{'_id': 1}"},
		{"{'a': 1}", "{'b': 1}", "{}"},
		{"{'a': 1}", "{'_id': 5, 'b': 1}", "{'_id': 5}"},
		/* output keeps the document's field order */
		{"{'b': 1, 'a': 1}", "{'a': 1, 'b': 2, 'c': 3}", "{'a': 1, 'b': 2}"},
		/* embedded documents */
		{"{'item': 1, 'size.uom': 1}", inventory,
		 "{'_id': 1, 'item': 'journal', 'size': {'uom': 'cm'}}"},
		{"{'item': 1, 'size': {'uom': 1}}", inventory,
		 "{'_id': 1, 'item': 'journal', 'size': {'uom': 'cm'}}"},
		{"{'size.uom': 0}", "{'_id': 1, 'size': {'h': 14, 'uom': 'cm'}}",
		 "{'_id': 1, 'size': {'h': 14}}"},
		/* through arrays of documents */
		{"{'item': 1, 'instock.qty': 1}", inventory,
		 "{'_id': 1, 'item': 'journal', 'instock': [{'qty': 5}, {'qty': 15}]}"},
		{"{'a.b': 1}", "{'a': [{'b': 1, 'c': 2}, 3, [{'b': 4, 'd': 5}]]}",
		 "{'a': [{'b': 1}, [{'b': 4}]]}"},
		{"{'a.b': 0}", "{'a': [{'b': 1, 'c': 2}, 3]}", "{'a': [{'c': 2}, 3]}"},
		{"{'a.b': 1}", "{'a': 5}", "{}"},
		{"{'a.b': 0}", "{'a': 5}", "{'a': 5}"},
		{"{'a.b': 1}", "{'a': {'c': 1}}", "{'a': {}}"},
		{"{'a.b.c': 1}", "{'a': {'b': {'c': 1, 'd': 2}, 'e': 3}}", "{'a': {'b': {'c': 1}}}"},
		/* from MongoDB's jstests/core/not_equals_null.js, projection {_id: 0, 'a.b': 1} */
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': [[]]}", "{'a': [[]]}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': [null, null]}", "{'a': []}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': [1, 'string', 4]}", "{'a': []}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': [{'b': 3}, {}]}", "{'a': [{'b': 3}, {}]}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': null}", "{}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': {}}", "{'a': {}}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1, 'a': {'b': 'hi'}}", "{'a': {'b': 'hi'}}"},
		{"{'_id': 0, 'a.b': 1}", "{'_id': 1}", "{}"},
	};

	(void)state;
	RUN(cases);
}

static void test_slice(void **state)
{
	const pcase cases[] = {
		{"{'a': {'$slice': 2}}", "{'_id': 1, 'a': [1, 2, 3], 'b': 1}",
		 "{'_id': 1, 'a': [1, 2], 'b': 1}"},
		{"{'a': {'$slice': -2}}", "{'a': [1, 2, 3]}", "{'a': [2, 3]}"},
		{"{'a': {'$slice': 5}}", "{'a': [1, 2, 3]}", "{'a': [1, 2, 3]}"},
		{"{'a': {'$slice': -5}}", "{'a': [1, 2, 3]}", "{'a': [1, 2, 3]}"},
		{"{'a': {'$slice': 0}}", "{'a': [1, 2, 3]}", "{'a': []}"},
		{"{'a': {'$slice': [1, 1]}}", "{'a': [1, 2, 3]}", "{'a': [2]}"},
		{"{'a': {'$slice': [-2, 5]}}", "{'a': [1, 2, 3]}", "{'a': [2, 3]}"},
		{"{'a': {'$slice': [5, 1]}}", "{'a': [1, 2, 3]}", "{'a': []}"},
		{"{'a': {'$slice': [-9, 2]}}", "{'a': [1, 2, 3]}", "{'a': [1, 2]}"},
		{"{'a': {'$slice': 1}}", "{'a': 'scalar'}", "{'a': 'scalar'}"},
		/* with an inclusion the other fields are dropped */
		{"{'a': {'$slice': 1}, 'c': 1}", "{'_id': 7, 'a': [1, 2], 'b': 1, 'c': 2}",
		 "{'_id': 7, 'a': [1], 'c': 2}"},
		/* with an exclusion */
		{"{'a': {'$slice': -1}, 'b': 0}", "{'a': [1, 2], 'b': 1, 'c': 2}",
		 "{'a': [2], 'c': 2}"},
		/* dotted, through an array of documents */
		{"{'x.a': {'$slice': 1}}", "{'x': [{'a': [1, 2]}, {'a': [3, 4]}]}",
		 "{'x': [{'a': [1]}, {'a': [3]}]}"},
	};

	(void)state;
	RUN(cases);
}

static void test_elem_match(void **state)
{
	const pcase cases[] = {
		/* MongoDB manual: schools example */
		{"{'students': {'$elemMatch': {'school': 102}}}",
		 "{'_id': 1, 'zipcode': '63109', 'students': [{'name': 'john', 'school': 102, 'age': 10}, "
		 "{'name': 'jess', 'school': 102, 'age': 11}, {'name': 'jeff', 'school': 108, 'age': 15}]}",
		 "{'_id': 1, 'students': [{'name': 'john', 'school': 102, 'age': 10}]}"},
		{"{'students': {'$elemMatch': {'school': 102, 'age': {'$gt': 10}}}}",
		 "{'_id': 1, 'students': [{'name': 'john', 'school': 102, 'age': 10}, "
		 "{'name': 'jess', 'school': 102, 'age': 11}]}",
		 "{'_id': 1, 'students': [{'name': 'jess', 'school': 102, 'age': 11}]}"},
		{"{'students': {'$elemMatch': {'school': 999}}}",
		 "{'_id': 3, 'students': [{'school': 1}]}", "{'_id': 3}"},
		{"{'a': {'$elemMatch': {'$gt': 2}}}", "{'_id': 1, 'a': [1, 5, 7]}",
		 "{'_id': 1, 'a': [5]}"},
		{"{'students': {'$elemMatch': {'school': 1}}, 'zip': 1}",
		 "{'_id': 3, 'zip': 'z', 'other': 1, 'students': [{'school': 1}]}",
		 "{'_id': 3, 'zip': 'z', 'students': [{'school': 1}]}"},
	};

	(void)state;
	RUN(cases);
}

typedef struct ecase {
	const char *spec;
	int code;
	const char *msg;
} ecase;

static void test_errors(void **state)
{
	static const ecase cases[] = {
		{"{'a': 1, 'b': 0}", 31254, "Cannot do exclusion on field b in inclusion projection"},
		{"{'a': 0, 'b': 1}", 31253, "Cannot do inclusion on field b in exclusion projection"},
		{"{'a': 1, 'a.b': 1}", 31250, "Path collision at a.b"},
		{"{'a.b': 1, 'a': 1}", 31250, "Path collision at a"},
		{"{'a.$': 1}", 2,
		 "positional projection operator $ is not supported by stripedb (field a.$)"},
		{"{'a': {'$foo': 1}}", 168, "Unrecognized expression '$foo'"},
		{"{'a': 0, 'b': 'x'}", 31252,
		 "Cannot use expression other than $meta in exclusion projection"},
		{"{'a': {'$meta': 'textScore'}}", 2, "$meta projection is not supported by stripedb"},
		{"{'a': {'$slice': 'x'}}", 2, "$slice only supports numbers and [skip, limit] arrays"},
		{"{'a': {'$slice': [1, 0]}}", 28724, "$slice limit must be positive"},
		{"{'a.b': {'$elemMatch': {'c': 1}}}", 2,
		 "Cannot use $elemMatch projection on a nested field."},
		{"{'a': {'$elemMatch': 1}}", 2, "elemMatch: Invalid argument, object required."},
		{"{'a': {'$elemMatch': {'$bad': 1}}}", 2, "unknown operator: $bad"},
		{"{'$a': 1}", 16410,
		 "FieldPath field names may not start with '$'. Consider using $getField or "
		 "$setField."},
		{"{'a..b': 1}", 40352, "FieldPath field names may not be empty strings."},
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *s = J(cases[i].spec);
		sdb_projection *p = (sdb_projection *)1;
		int code = 0;
		char err[256] = "";

		if (sdb_projection_new(s, &p, &code, err, sizeof err) != -2)
			fail_msg("projection %s compiled", cases[i].spec);
		assert_null(p);
		if (code != cases[i].code || strcmp(err, cases[i].msg) != 0)
			fail_msg("projection %s: got %d '%s', want %d '%s'", cases[i].spec, code, err,
				 cases[i].code, cases[i].msg);
		bson_destroy(s);
	}
}

static void test_mode(void **state)
{
	static const struct {
		const char *spec;
		bool inclusion;
	} cases[] = {
		{"{}", false},
		{"{'a': 1}", true},
		{"{'a': 0}", false},
		{"{'_id': 0}", false},
		{"{'_id': 1}", true},
		{"{'_id': 0, 'a': 1}", true},
		{"{'a': {'$slice': 1}}", false},
		{"{'a': {'$elemMatch': {'b': 1}}}", true},
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *s = J(cases[i].spec);
		sdb_projection *p = NULL;
		char err[128];

		assert_int_equal(sdb_projection_new(s, &p, NULL, err, sizeof err), 0);
		if (sdb_projection_is_inclusion(p) != cases[i].inclusion)
			fail_msg("%s: inclusion %d", cases[i].spec, !cases[i].inclusion);
		sdb_projection_free(p);
		bson_destroy(s);
	}
}

/* The aggregation kinds: computed fields, their order, and paths through scalars, missing
 * fields and arrays (MongoDB's inclusion_node / add_fields semantics). */
/* Find takes computed fields (MongoDB 4.4+) next to its own operators. */
static void test_find_computed(void **state)
{
	const pcase cases[] = {
		{"{'a': 1, 'k': 'lit', 'n': {'$size': '$arr'}}", "{'_id': 1, 'arr': [1, 2], 'a': 3}",
		 "{'_id': 1, 'a': 3, 'k': 'lit', 'n': 2}"},
		{"{'_id': 0, 'x': '$s.t'}", "{'_id': 1, 's': {'t': 7}}", "{'x': 7}"},
		{"{'arr': {'$slice': 1}, 'y': {'$add': [1, 2]}}", "{'_id': 1, 'arr': [5, 6]}",
		 "{'_id': 1, 'arr': [5], 'y': 3}"},
	};

	(void)state;
	RUN(cases);
}

static void test_aggregation(void **state)
{
	const pcase project[] = {
		/* computed fields after the included ones, in specification order */
		{"{'c': {'$add': ['$a', 1]}, 'b': 1}", "{'_id': 1, 'a': 1, 'b': 2, 'c': 3}",
		 "{'_id': 1, 'b': 2, 'c': 2}"},
		{"{'_id': 0, 'x': '$a', 'y': 'lit'}", "{'_id': 1, 'a': 5}", "{'x': 5, 'y': 'lit'}"},
		/* $$REMOVE and a missing path add nothing */
		{"{'x': '$$REMOVE', 'y': '$nope', 'a': 1}", "{'_id': 1, 'a': 5}", "{'_id': 1, 'a': 5}"},
		/* a computed path through a scalar or a missing field makes documents */
		{"{'s.t': 'v'}", "{'_id': 1, 's': 3}", "{'_id': 1, 's': {'t': 'v'}}"},
		{"{'s': {'t': 'v'}}", "{'_id': 1}", "{'_id': 1, 's': {'t': 'v'}}"},
		/* through an array: each document gets it, scalars become documents */
		{"{'a.b': 1, 'a.c': 'k'}", "{'_id': 1, 'a': [{'b': 1, 'z': 0}, 2, [{'b': 3}]]}",
		 "{'_id': 1, 'a': [{'b': 1, 'c': 'k'}, {'c': 'k'}, [{'b': 3, 'c': 'k'}]]}"},
		/* exclusion recurses into nested arrays and keeps scalars */
		{"{'a.b': 0}", "{'_id': 1, 'a': [{'b': 1, 'c': 2}, 3, [{'b': 4, 'd': 5}]]}",
		 "{'_id': 1, 'a': [{'c': 2}, 3, [{'d': 5}]]}"},
		{"{'_id': 0}", "{'_id': 1, 'a': 2}", "{'a': 2}"},
		/* an _id expression is a computed field of an inclusion */
		{"{'_id': '$a'}", "{'_id': 1, 'a': 2, 'b': 3}", "{'_id': 2}"},
		{"{'s': {'$size': '$a'}}", "{'_id': 1, 'a': [7, 8]}", "{'_id': 1, 's': 2}"},
	};
	const pcase add_fields[] = {
		/* an existing field is replaced in place, a new one appended */
		{"{'a': 9, 'z': 1}", "{'_id': 1, 'a': 1, 'b': 2}", "{'_id': 1, 'a': 9, 'b': 2, 'z': 1}"},
		{"{'e': {}}", "{'_id': 1}", "{'_id': 1, 'e': {}}"},
		{"{'s.t': '$a'}", "{'_id': 1, 'a': 4, 's': {'u': 1}}",
		 "{'_id': 1, 'a': 4, 's': {'u': 1, 't': 4}}"},
		{"{'s.t': 1}", "{'_id': 1, 's': 'x'}", "{'_id': 1, 's': {'t': 1}}"},
		{"{'s.t': 1}", "{'_id': 1, 's': [{'u': 1}, 2]}",
		 "{'_id': 1, 's': [{'u': 1, 't': 1}, {'t': 1}]}"},
		{"{'s.t': '$$REMOVE'}", "{'_id': 1}", "{'_id': 1, 's': {}}"},
		/* nested arrays recurse, scalars become documents (MongoDB's
		 * applyExpressionsToValue) */
		{"{'arr.z': 1}", "{'_id': 1, 'arr': [[{'x': 6}], 5, {'x': 1}]}",
		 "{'_id': 1, 'arr': [[{'x': 6, 'z': 1}], {'z': 1}, {'x': 1, 'z': 1}]}"},
		{"{'_id': 'new'}", "{'_id': 1, 'a': 2}", "{'_id': 'new', 'a': 2}"},
	};

	(void)state;
	RUN_AS(SDB_PROJECTION_PROJECT, project);
	RUN_AS(SDB_PROJECTION_ADD_FIELDS, add_fields);
}

static void test_aggregation_errors(void **state)
{
	static const struct {
		sdb_projection_kind kind;
		const char *spec;
		int code;
		const char *msg;
	} cases[] = {
		{SDB_PROJECTION_PROJECT, "{'a': 0, 'b': '$x'}", 31252,
		 "Invalid $project :: caused by :: Cannot use expression other than $meta in "
		 "exclusion projection"},
		{SDB_PROJECTION_PROJECT, "{'b': '$x', 'a': 0}", 31254,
		 "Invalid $project :: caused by :: Cannot do exclusion on field a in inclusion "
		 "projection"},
		{SDB_PROJECTION_PROJECT, "{'a': 0, 'b': 1}", 31253,
		 "Invalid $project :: caused by :: Cannot do inclusion on field b in exclusion "
		 "projection"},
		{SDB_PROJECTION_PROJECT, "{'a': {}}", 51270,
		 "An empty sub-projection is not a valid value. Found empty object at path"},
		{SDB_PROJECTION_PROJECT, "{'a.$': 1}", 16410,
		 "FieldPath field names may not start with '$'. Consider using $getField or "
		 "$setField."},
		{SDB_PROJECTION_ADD_FIELDS, "{'a': 1, 'a.b': 1}", 31250, "Path collision at a.b"},
		{SDB_PROJECTION_ADD_FIELDS, "{'a': {'$nosuch': 1}}", 168, NULL},
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bson_t *s = J(cases[i].spec);
		sdb_projection *p = (sdb_projection *)1;
		int code = 0;
		char err[256] = "";

		if (sdb_projection_new_kind(s, cases[i].kind, &p, &code, err, sizeof err) == 0)
			fail_msg("projection %s compiled", cases[i].spec);
		assert_null(p);
		if (code != cases[i].code || (cases[i].msg && strcmp(err, cases[i].msg) != 0))
			fail_msg("projection %s: got %d '%s', want %d '%s'", cases[i].spec, code, err,
				 cases[i].code, cases[i].msg ? cases[i].msg : "");
		bson_destroy(s);
	}
}

/* More than 200 path components: Overflow (15) "FieldPath is too long" for every kind, at
 * parse time (a 20,000-component path used to overflow the stack when applied). */
static void test_path_too_long(void **state)
{
	static const sdb_projection_kind kinds[] = {SDB_PROJECTION_FIND, SDB_PROJECTION_PROJECT,
						    SDB_PROJECTION_ADD_FIELDS};
	const size_t ns[] = {200, 201, 20000};

	(void)state;
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
			char *path = malloc(ns[i] * 2);
			bson_t spec = BSON_INITIALIZER;
			sdb_projection *p = NULL;
			int code = 0;
			char err[128] = "";
			int rc;

			for (size_t c = 0; c < ns[i]; c++) {
				path[2 * c] = 'a';
				path[2 * c + 1] = c + 1 < ns[i] ? '.' : '\0';
			}
			BSON_APPEND_INT32(&spec, path, 1);
			rc = sdb_projection_new_kind(&spec, kinds[k], &p, &code, err, sizeof err);
			if (ns[i] <= 200) {
				assert_int_equal(rc, 0);
			} else {
				assert_int_not_equal(rc, 0);
				assert_int_equal(code, 15);
				assert_string_equal(err, "FieldPath is too long");
			}
			sdb_projection_free(p);
			bson_destroy(&spec);
			free(path);
		}
	}
}

/* A computed field's evaluation error is the expression's code, from eval. */
static void test_aggregation_eval_error(void **state)
{
	bson_t *spec = J("{'x': {'$divide': [1, '$z']}}"), *doc = J("{'_id': 1, 'z': 0}");
	bson_t out = BSON_INITIALIZER;
	sdb_projection *p = NULL;
	int code = 0;
	char err[256] = "";

	(void)state;
	assert_int_equal(sdb_projection_new_kind(spec, SDB_PROJECTION_PROJECT, &p, &code, err,
						 sizeof err),
			 0);
	assert_int_not_equal(sdb_projection_eval(p, doc, &out, &code, err, sizeof err), 0);
	assert_int_equal(code, 16608); /* MongoDB's "can't $divide by zero" */
	assert_string_equal(err, "can't $divide by zero");
	bson_destroy(&out);
	sdb_projection_free(p);
	bson_destroy(spec);
	bson_destroy(doc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inclusion_exclusion),
		cmocka_unit_test(test_slice),
		cmocka_unit_test(test_elem_match),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_mode),
		cmocka_unit_test(test_find_computed),
		cmocka_unit_test(test_aggregation),
		cmocka_unit_test(test_aggregation_errors),
		cmocka_unit_test(test_aggregation_eval_error),
		cmocka_unit_test(test_path_too_long),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
