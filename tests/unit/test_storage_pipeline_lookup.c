/* Unit tests of storage/pipeline.c's stages that read other collections ($lookup,
 * $unionWith, $graphLookup) through a fake foreign reader: MongoDB's documented examples
 * and error codes. Outputs are compared as canonical extended JSON. */


/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/pipeline.c"
#include "../../storage/pipeline_parse.c"
#include "../../storage/pipeline_expr.c"

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


/* A foreign reader for $unionWith/$lookup: collection "o" holds FOREIGN (any other name is
 * empty); the stages run with this engine (nested stages through this reader again).
 * Counts its calls. */
static const char *const FOREIGN = "[{'_id': 10, 'k': 1}, {'_id': 11, 'k': 2}, {'_id': 12, 'k': [1, 3]},"
				   " {'_id': 13}, {'_id': 14, 'k': null}]";
static int foreign_calls;
/* $graphLookup's collections (the MongoDB manual's $graphLookup examples): emp, air, ppl */
static const char *const EMPLOYEES =
	"[{'_id': 1, 'name': 'Dev'}, {'_id': 2, 'name': 'Eliot', 'reportsTo': 'Dev'},"
	" {'_id': 3, 'name': 'Ron', 'reportsTo': 'Eliot'}, {'_id': 4, 'name': 'Andrew', 'reportsTo': 'Eliot'},"
	" {'_id': 5, 'name': 'Asya', 'reportsTo': 'Ron'}, {'_id': 6, 'name': 'Dan', 'reportsTo': 'Andrew'}]";
static const char *const AIRPORTS =
	"[{'_id': 0, 'airport': 'JFK', 'connects': ['BOS', 'ORD']}, {'_id': 1, 'airport': 'BOS', 'connects': ['JFK', 'PWM']},"
	" {'_id': 2, 'airport': 'ORD', 'connects': ['JFK']}, {'_id': 3, 'airport': 'PWM', 'connects': ['BOS', 'LHR']},"
	" {'_id': 4, 'airport': 'LHR', 'connects': ['PWM']}]";
static const char *const PEOPLE =
	"[{'_id': 1, 'name': 'Tanya', 'friends': ['Shirley', 'Terry', 'Carole'], 'hobbies': ['tennis', 'golf']},"
	" {'_id': 2, 'name': 'Carole', 'friends': ['Joseph', 'Tanya', 'Terry'], 'hobbies': ['archery', 'golf']},"
	" {'_id': 3, 'name': 'Terry', 'friends': ['Tanya', 'Carole', 'Angelo'], 'hobbies': ['knitting']},"
	" {'_id': 4, 'name': 'Joseph', 'friends': ['Angelo', 'Carole'], 'hobbies': ['tennis', 'golf']},"
	" {'_id': 5, 'name': 'Angelo', 'friends': ['Terry', 'Shirley', 'Joseph'], 'hobbies': ['golf']},"
	" {'_id': 6, 'name': 'Shirley', 'friends': ['Angelo', 'Tanya', 'Carole'], 'hobbies': ['frisbee']}]";

typedef struct fsrc {
	bson_t arr;  /* the output documents */
	bson_iter_t it;
	bson_t cur;
} fsrc;

static int fsrc_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	fsrc *f = ctx;
	const uint8_t *data;
	uint32_t len;

	(void)code;
	(void)err;
	(void)errlen;
	if (!bson_iter_next(&f->it)) {
		return 0;
	}
	bson_iter_document(&f->it, &len, &data);
	bson_init_static(&f->cur, data, len);
	*doc = &f->cur;
	return 1;
}

static void fsrc_close(void *ctx)
{
	fsrc *f = ctx;

	bson_destroy(&f->arr);
	free(f);
}

static int fake_foreign(void *arg, const char *coll, const bson_t *stages, const bson_t *let,
			sdb_pipeline_source *out, int *code, char *err, size_t errlen)
{
	sdb_pipeline_opts o = {.let = let, .foreign = fake_foreign, .foreign_arg = arg};
	bson_t darr;
	bson_t *dw = JA(strcmp(coll, "o") == 0	    ? FOREIGN
			: strcmp(coll, "emp") == 0  ? EMPLOYEES
			: strcmp(coll, "air") == 0  ? AIRPORTS
			: strcmp(coll, "ppl") == 0  ? PEOPLE
			: strcmp(coll, "noid") == 0 ? "[{'a': 1}]"
						    : "[]",
			&darr);
	sdb_pipeline *p = NULL;
	fsrc *f;
	int rc;

	foreign_calls++;
	rc = sdb_pipeline_parse(stages, &o, &p, code, err, errlen);
	if (rc != 0) {
		bson_destroy(dw);
		return rc;
	}
	{
		void *mem = NULL;

		/* bson_t wants 128-byte alignment */
		assert_int_equal(posix_memalign(&mem, 128, sizeof *f), 0);
		memset(mem, 0, sizeof *f);
		f = mem;
	}
	bson_init(&f->arr);
	rc = drain(p, &darr, &f->arr, code, err, errlen);
	sdb_pipeline_free(p);
	bson_destroy(dw);
	if (rc < 0) {
		fsrc_close(f);
		return rc;
	}
	bson_iter_init(&f->it, &f->arr);
	out->next = fsrc_next;
	out->close = fsrc_close;
	out->ctx = f;
	return 0;
}

/* $unionWith and $lookup over the fake reader (pipeline_lookup.c). */
static void test_lookup_union(void **state)
{
	sdb_pipeline_opts o = {.foreign = fake_foreign};
	const char *docs = "[{'_id': 1, 'x': 1}, {'_id': 2, 'x': [2, 3]}, {'_id': 3}, {'_id': 4, 'x': 1}]";
	int code;
	char err[256];

	(void)state;
	check_opts("[{'$match': {'_id': 1}}, {'$unionWith': {'coll': 'o', 'pipeline': [{'$match': {'k': 2}}]}}]",
		   docs, &o, "[{'_id': 1, 'x': 1}, {'_id': 11, 'k': 2}]");
	check_opts("[{'$match': {'_id': 9}}, {'$unionWith': 'none'}]", docs, &o, "[]");
	/* equality: arrays element by element (3 matches k [1, 3]); missing matches null/missing;
	 * _id 1 and 4 (the same value) make one foreign read */
	foreign_calls = 0;
	check_opts("[{'$lookup': {'from': 'o', 'localField': 'x', 'foreignField': 'k', 'as': 'm'}},"
		   " {'$project': {'m': '$m._id'}}]",
		   docs, &o,
		   "[{'_id': 1, 'm': [10, 12]}, {'_id': 2, 'm': [11, 12]}, {'_id': 3, 'm': [13, 14]},"
		   " {'_id': 4, 'm': [10, 12]}]");
	assert_int_equal(foreign_calls, 3);
	/* let + $expr; combined form */
	check_opts("[{'$match': {'_id': 1}}, {'$lookup': {'from': 'o', 'let': {'v': {'$add': ['$x', 1]}}, 'as': 'm',"
		   " 'pipeline': [{'$match': {'$expr': {'$eq': ['$k', '$$v']}}}]}}]",
		   docs, &o, "[{'_id': 1, 'x': 1, 'm': [{'_id': 11, 'k': 2}]}]");
	check_opts("[{'$match': {'_id': 1}}, {'$lookup': {'from': 'o', 'localField': 'x', 'foreignField': 'k',"
		   " 'as': 'a.b', 'pipeline': [{'$project': {'_id': 1}}, {'$limit': 1}]}}]",
		   docs, &o, "[{'_id': 1, 'x': 1, 'a': {'b': [{'_id': 10}]}}]");
	/* the let placeholders of the parse-time check are not evaluated: $size of a let
	 * variable holding an array */
	check_opts("[{'$match': {'_id': 2}}, {'$lookup': {'from': 'o', 'let': {'v': '$x'}, 'as': 'm',"
		   " 'pipeline': [{'$limit': 1}, {'$project': {'_id': 0, 'n': {'$size': '$$v'}}}]}}]",
		   docs, &o, "[{'_id': 2, 'x': [2, 3], 'm': [{'n': 2}]}]");
	/* errors */
	assert_null(run("[{'$unionWith': {'coll': 'o', 'bogus': 1}}]", "[]", &o, &code, err, sizeof err));
	assert_int_equal(code, 40415);
	assert_null(run("[{'$lookup': {'from': 'o', 'as': 'm', 'pipeline': [{'$out': 'z'}]}}]", "[]", &o,
			&code, err, sizeof err));
	assert_int_equal(code, 51047);
	assert_null(run("[{'$lookup': {'from': 'o', 'as': 'm', 'let': {'v': '$x'},"
			" 'pipeline': [{'$project': {'q': {'$divide': [1, 0]}}}]}}]",
			docs, &o, &code, err, sizeof err));
	assert_int_equal(code, 16608);
}

/* $graphLookup over the fake reader (pipeline_graph.c): the manual's examples (the results
 * in the order reached: breadth first, each round in the foreign collection's order). */
static void test_graph_lookup(void **state)
{
	sdb_pipeline_opts o = {.foreign = fake_foreign};
	int code;
	char err[512];

	(void)state;
	/* reportsTo: Dan -> Andrew -> Eliot -> Dev; Dev reports to nobody (startWith missing) */
	check_opts("[{'$match': {'_id': {'$in': [1, 6]}}}, {'$graphLookup': {'from': 'emp', 'startWith': '$reportsTo',"
		   " 'connectFromField': 'reportsTo', 'connectToField': 'name', 'as': 'h', 'depthField': 'd'}},"
		   " {'$project': {'_id': 0, 'n': '$h.name', 'd': '$h.d'}}]",
		   EMPLOYEES, &o,
		   "[{'n': [], 'd': []}, {'n': ['Andrew', 'Eliot', 'Dev'], 'd': [{'$numberLong': '0'},"
		   " {'$numberLong': '1'}, {'$numberLong': '2'}]}]");
	/* airports: arrays followed element by element, cycles, maxDepth 2 */
	check_opts("[{'$graphLookup': {'from': 'air', 'startWith': '$nearestAirport', 'connectFromField': 'connects',"
		   " 'connectToField': 'airport', 'maxDepth': 2, 'depthField': 'numConnections', 'as': 'dest'}},"
		   " {'$project': {'_id': 0, 'name': 1, 'a': '$dest.airport', 'n': '$dest.numConnections'}}]",
		   "[{'_id': 1, 'name': 'Dev', 'nearestAirport': 'JFK'}, {'_id': 3, 'name': 'Jeff', 'nearestAirport': 'BOS'}]",
		   &o,
		   "[{'name': 'Dev', 'a': ['JFK', 'BOS', 'ORD', 'PWM'], 'n': [{'$numberLong': '0'}, {'$numberLong': '1'},"
		   " {'$numberLong': '1'}, {'$numberLong': '2'}]},"
		   " {'name': 'Jeff', 'a': ['BOS', 'JFK', 'PWM', 'ORD', 'LHR'], 'n': [{'$numberLong': '0'}, {'$numberLong': '1'},"
		   " {'$numberLong': '1'}, {'$numberLong': '2'}, {'$numberLong': '2'}]}]");
	/* maxDepth 0: the first round only; a startWith array: every element */
	check_opts("[{'$graphLookup': {'from': 'air', 'startWith': ['LHR', 'ORD', 'XXX'], 'connectFromField': 'connects',"
		   " 'connectToField': 'airport', 'maxDepth': 0.0, 'as': 'dest'}}, {'$project': {'_id': 0, 'a': '$dest.airport'}}]",
		   "[{'_id': 1}]", &o, "[{'a': ['ORD', 'LHR']}]");
	/* the whole graph from one node: each airport once */
	check_opts("[{'$graphLookup': {'from': 'air', 'startWith': 'LHR', 'connectFromField': 'connects',"
		   " 'connectToField': 'airport', 'as': 'dest'}}, {'$project': {'_id': 0, 'a': '$dest._id'}}]",
		   "[{'_id': 1}]", &o, "[{'a': [4, 3, 1, 0, 2]}]");
	/* restrictSearchWithMatch: only golfers are reached (and followed) */
	check_opts("[{'$match': {'name': 'Tanya'}}, {'$graphLookup': {'from': 'ppl', 'startWith': '$friends',"
		   " 'connectFromField': 'friends', 'connectToField': 'name', 'as': 'g',"
		   " 'restrictSearchWithMatch': {'hobbies': 'golf'}}}, {'$project': {'_id': 0, 'g': '$g.name'}}]",
		   PEOPLE, &o, "[{'g': ['Carole', 'Tanya', 'Joseph', 'Angelo']}]");
	/* null searches an explicit null only (not a missing field); 1.0 finds 1 and [1, 3] */
	check_opts("[{'$graphLookup': {'from': 'o', 'startWith': '$s', 'connectFromField': 'none',"
		   " 'connectToField': 'k', 'as': 'm'}}, {'$project': {'m': '$m._id'}}]",
		   "[{'_id': 1, 's': null}, {'_id': 2, 's': 1.0}, {'_id': 3}]", &o,
		   "[{'_id': 1, 'm': [14]}, {'_id': 2, 'm': [10, 12]}, {'_id': 3, 'm': []}]");
	/* as a nested path, and inside $facet */
	check_opts("[{'$match': {'_id': 6}}, {'$facet': {'f': [{'$graphLookup': {'from': 'emp', 'startWith': '$reportsTo',"
		   " 'connectFromField': 'reportsTo', 'connectToField': 'name', 'as': 'x.y', 'maxDepth': 0}},"
		   " {'$project': {'_id': 0, 'n': '$x.y.name'}}]}}]",
		   EMPLOYEES, &o, "[{'f': [{'n': ['Andrew']}]}]");
	/* errors, as mongod's */
	static const struct {
		const char *pipeline;
		int code;
	} bad[] = {
		{"[{'$graphLookup': 1}]", 9},
		{"[{'$graphLookup': {'startWith': 1}}]", 9},
		{"[{'$graphLookup': {'from': 1}}]", 9},
		{"[{'$graphLookup': {'from': {'db': 'x', 'coll': 'y'}}}]", 9},
		{"[{'$graphLookup': {'from': ''}}]", 73},
		{"[{'$graphLookup': {'from': 'air', 'as': 1}}]", 40103},
		{"[{'$graphLookup': {'from': 'air', 'as': {}}}]", 13111},
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': 'x'}}]", 40100},
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': -1}}]", 40101},
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': 1.5}}]", 40102},
		/* a Decimal128 rounds half to even (Decimal128::toLong): -0.6 is -1 */
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': {'$numberDecimal': '-0.6'}}}]", 40101},
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': {'$numberDecimal': '2.5'}}}]", 40102},
		/* INT64_MAX is accepted (mongod compares as doubles); the stage then fails on
		 * its missing arguments */
		{"[{'$graphLookup': {'from': 'air', 'maxDepth': {'$numberLong': '9223372036854775807'}}}]", 40105},
		{"[{'$graphLookup': {'from': 'air', 'restrictSearchWithMatch': 1}}]", 40185},
		{"[{'$graphLookup': {'from': 'air', 'restrictSearchWithMatch': {'a': {'$bogus': 1}}}}]", 2},
		{"[{'$graphLookup': {'from': 'air', 'bogus': 1}}]", 40104},
		{"[{'$graphLookup': {'from': 'air', 'startWith': '$a', 'connectFromField': 'a', 'as': 'x'}}]", 40105},
		{"[{'$graphLookup': {'from': 'air', 'startWith': '$a', 'connectFromField': 'a', 'connectToField': 'b',"
		 " 'as': ''}}]", 40105},
		{"[{'$graphLookup': {'from': 'air', 'startWith': '$a', 'connectFromField': 'a', 'connectToField': 'b',"
		 " 'as': '$x'}}]", 16410},
		{"[{'$graphLookup': {'from': 'air', 'startWith': '$a', 'connectFromField': 'a', 'connectToField': 'b',"
		 " 'as': 'x', 'depthField': 'a..b'}}]", 15998},
		{"[{'$graphLookup': {'from': 'air', 'startWith': {'$bogus': 1}, 'connectFromField': 'a',"
		 " 'connectToField': 'b', 'as': 'x'}}]", 168},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_null(run(bad[i].pipeline, "[]", &o, &code, err, sizeof err));
		if (code != bad[i].code) {
			fail_msg("%s: code %d (%s), want %d", bad[i].pipeline, code, err, bad[i].code);
		}
	}
	assert_null(run("[{'$graphLookup': {'from': 'air', 'restrictSearchWithMatch': {'a': {'$bogus': 1}}}}]", "[]",
			&o, &code, err, sizeof err));
	assert_non_null(strstr(err, "Failed to parse 'restrictSearchWithMatch' option to $graphLookup :: caused by :: "));
	/* a foreign document without _id: 40271 */
	assert_null(run("[{'$graphLookup': {'from': 'noid', 'startWith': 1, 'connectFromField': 'a', 'connectToField': 'a',"
			" 'as': 'x'}}]",
			"[{'_id': 1}]", &o, &code, err, sizeof err));
	assert_int_equal(code, 40271);
	/* the memory bound: 40099 */
	{
		sdb_pipeline_opts small = {.foreign = fake_foreign, .max_memory_bytes = 200};

		assert_null(run("[{'$graphLookup': {'from': 'air', 'startWith': 'LHR', 'connectFromField': 'connects',"
				" 'connectToField': 'airport', 'as': 'dest'}}]",
				"[{'_id': 1}]", &small, &code, err, sizeof err));
		assert_int_equal(code, 40099);
		assert_string_equal(err, "$graphLookup reached maximum memory consumption");
	}
	/* without a foreign reader: 238 */
	check_err("[{'$graphLookup': {'from': 'air', 'startWith': '$a', 'connectFromField': 'a',"
		  " 'connectToField': 'b', 'as': 'x'}}]",
		  "[]", 238, "$graphLookup is not supported");
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lookup_union),
		cmocka_unit_test(test_graph_lookup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
