/* Unit tests of src/common/aggwrite.c: $out / $merge specifications parsed as MongoDB 6.0
 * (codes of every refusal), the `on` filter, the supporting unique index and the update
 * statements $merge writes. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/aggwrite.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* Parse the pipeline given as JSON ({"p": [...]}) in database "db". */
static int parse(const char *json, sdb_aggw *w)
{
	bson_error_t e;
	bson_t *d = bson_new_from_json((const uint8_t *)json, -1, &e);
	bson_iter_t it;
	bson_t arr;
	uint32_t len;
	const uint8_t *data;
	char err[512];
	assert_non_null(d);
	assert_true(bson_iter_init_find(&it, d, "p"));
	bson_iter_array(&it, &len, &data);
	assert_true(bson_init_static(&arr, data, len));
	int rc = sdb_aggw_parse(&arr, "db", w, err, sizeof err);
	bson_destroy(d);
	return rc;
}

static void expect_code(const char *json, int code)
{
	sdb_aggw w;
	assert_int_equal(parse(json, &w), code);
	sdb_aggw_destroy(&w);
}

static void test_out_forms(void **state)
{
	sdb_aggw w;
	(void)state;
	assert_int_equal(parse("{\"p\": [{\"$match\": {}}, {\"$out\": \"o\"}]}", &w), 0);
	assert_int_equal(w.kind, SDB_AGGW_OUT);
	assert_string_equal(w.db, "db");
	assert_string_equal(w.coll, "o");
	assert_int_equal(bson_count_keys(&w.stages), 1);
	sdb_aggw_destroy(&w);
	assert_int_equal(parse("{\"p\": [{\"$out\": {\"db\": \"x\", \"coll\": \"y\"}}]}", &w), 0);
	assert_string_equal(w.db, "x");
	assert_string_equal(w.coll, "y");
	assert_int_equal(bson_count_keys(&w.stages), 0);
	sdb_aggw_destroy(&w);
	assert_int_equal(parse("{\"p\": [{\"$match\": {}}]}", &w), 0);
	assert_int_equal(w.kind, SDB_AGGW_NONE);
	assert_int_equal(bson_count_keys(&w.stages), 1);
	sdb_aggw_destroy(&w);
	expect_code("{\"p\": [{\"$out\": \"o\"}, {\"$match\": {}}]}", 40601);
	expect_code("{\"p\": [{\"$out\": 1}]}", 16990);
	expect_code("{\"p\": [{\"$out\": {\"coll\": \"o\"}}]}", 40414);
	expect_code("{\"p\": [{\"$out\": {\"db\": \"d\", \"coll\": 1}}]}", 14);
	expect_code("{\"p\": [{\"$out\": {\"db\": \"d\", \"coll\": \"c\", \"x\": 1}}]}", 40415);
	expect_code("{\"p\": [{\"$out\": {\"db\": \"d\", \"coll\": \"c\", \"timeseries\": {}}}]}",
		    238);
	expect_code("{\"p\": [{\"$out\": \"system.x\"}]}", 17385);
	expect_code("{\"p\": [{\"$out\": {\"db\": \"local\", \"coll\": \"c\"}}]}", 31321);
	expect_code("{\"p\": [{\"$out\": \"\"}]}", 73);
	expect_code("{\"p\": [{\"$out\": {\"db\": \"a.b\", \"coll\": \"c\"}}]}", 73);
}

static void test_merge_forms(void **state)
{
	sdb_aggw w;
	(void)state;
	assert_int_equal(parse("{\"p\": [{\"$merge\": \"t\"}]}", &w), 0);
	assert_int_equal(w.kind, SDB_AGGW_MERGE);
	assert_int_equal(w.when_matched, SDB_WM_MERGE);
	assert_int_equal(w.when_not_matched, SDB_WNM_INSERT);
	assert_int_equal(w.n_on, 1);
	assert_string_equal(w.on[0], "_id");
	assert_false(w.on_given);
	sdb_aggw_destroy(&w);
	assert_int_equal(parse("{\"p\": [{\"$merge\": {\"into\": {\"db\": \"x\", \"coll\": \"t\"}, "
			       "\"on\": [\"a\", \"b.c\"], \"whenMatched\": [{\"$set\": {\"z\": 1}}], "
			       "\"whenNotMatched\": \"discard\", \"let\": {\"v\": \"$a\"}}}]}",
			       &w),
			 0);
	assert_string_equal(w.db, "x");
	assert_int_equal(w.n_on, 2);
	assert_string_equal(w.on[1], "b.c");
	assert_int_equal(w.when_matched, SDB_WM_PIPELINE);
	assert_int_equal(w.when_not_matched, SDB_WNM_DISCARD);
	assert_int_equal(bson_count_keys(&w.let), 1); /* new only added for insert */
	sdb_aggw_destroy(&w);
	assert_int_equal(parse("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": []}}]}",
			       &w),
			 0);
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, &w.let, "new"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "$$ROOT");
	sdb_aggw_destroy(&w);
	expect_code("{\"p\": [{\"$merge\": \"t\"}, {\"$match\": {}}]}", 40601);
	expect_code("{\"p\": [{\"$merge\": 1}]}", 51182);
	expect_code("{\"p\": [{\"$merge\": {}}]}", 40414);
	expect_code("{\"p\": [{\"$merge\": {\"into\": 1}}]}", 51178);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"\"}}]}", 5786800);
	expect_code("{\"p\": [{\"$merge\": {\"into\": {\"db\": \"x\"}}}]}", 5786801);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"on\": 1}}]}", 51186);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"on\": [1]}}]}", 51134);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"on\": []}}]}", 51187);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"on\": [\"a\", \"a\"]}}]}", 31465);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": 1}}]}", 51191);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": \"x\"}}]}", 2);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": \"pipeline\"}}]}", 2);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenNotMatched\": \"x\"}}]}", 2);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenNotMatched\": 1}}]}", 14);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"let\": {}}}]}", 51199);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": [], "
		    "\"let\": {\"new\": 1}}}]}",
		    51273);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": \"keepExisting\", "
		    "\"whenNotMatched\": \"fail\"}}]}",
		    51181);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": \"fail\", "
		    "\"whenNotMatched\": \"discard\"}}]}",
		    51181);
	expect_code("{\"p\": [{\"$merge\": {\"into\": \"t\", \"bogus\": 1}}]}", 40415);
	expect_code("{\"p\": [{\"$merge\": \"system.views\"}]}", 31319);
	expect_code("{\"p\": [{\"$merge\": {\"into\": {\"db\": \"admin\", \"coll\": \"c\"}}}]}", 31320);
}

static void test_on_filter_and_index(void **state)
{
	sdb_aggw w;
	bson_t f;
	char err[256];
	(void)state;
	assert_int_equal(parse("{\"p\": [{\"$merge\": {\"into\": \"t\", \"on\": [\"b.c\", \"a\"]}}]}",
			       &w),
			 0);
	bson_t *doc = BCON_NEW("a", BCON_INT32(1), "b", "{", "c", "x", "}");
	assert_int_equal(sdb_aggw_on_filter(&w, doc, &f, err, sizeof err), 0);
	bson_t *want = BCON_NEW("b.c", "x", "a", BCON_INT32(1));
	assert_true(bson_equal(&f, want));
	bson_destroy(&f);
	bson_destroy(want);
	bson_destroy(doc);
	doc = BCON_NEW("a", "[", BCON_INT32(1), "]", "b", "{", "c", "x", "}");
	assert_int_equal(sdb_aggw_on_filter(&w, doc, &f, err, sizeof err), 51185);
	bson_destroy(&f);
	bson_destroy(doc);
	doc = BCON_NEW("a", BCON_NULL, "b", "{", "c", "x", "}");
	assert_int_equal(sdb_aggw_on_filter(&w, doc, &f, err, sizeof err), 51132);
	bson_destroy(&f);
	bson_destroy(doc);
	/* the supporting index: unique, not partial, exactly the fields in any order */
	bson_t *key = BCON_NEW("a", BCON_INT32(1), "b.c", BCON_INT32(-1));
	bson_t *spec = BCON_NEW("unique", BCON_BOOL(true));
	assert_true(sdb_aggw_index_supports(&w, key, spec));
	bson_destroy(spec);
	spec = BCON_NEW("unique", BCON_BOOL(false));
	assert_false(sdb_aggw_index_supports(&w, key, spec));
	bson_destroy(spec);
	spec = BCON_NEW("unique", BCON_BOOL(true), "partialFilterExpression", "{", "}");
	assert_false(sdb_aggw_index_supports(&w, key, spec));
	bson_destroy(spec);
	bson_destroy(key);
	key = BCON_NEW("a", BCON_INT32(1));
	spec = BCON_NEW("unique", BCON_BOOL(true));
	assert_false(sdb_aggw_index_supports(&w, key, spec));
	bson_destroy(spec);
	bson_destroy(key);
	sdb_aggw_destroy(&w);
}

static int eval_fixed(const bson_iter_t *expr, const bson_t *vars, const bson_t *doc,
		      bson_t *out, int *code, char *err, size_t errlen)
{
	(void)expr;
	(void)vars;
	(void)doc;
	(void)code;
	(void)err;
	(void)errlen;
	bson_init(out);
	BSON_APPEND_INT32(out, "v", 7);
	return 0;
}

static void test_merge_statements(void **state)
{
	sdb_aggw w;
	char err[256];
	bson_iter_t it;
	(void)state;
	bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "x", BCON_INT32(2));
	/* keepExisting: {$setOnInsert: doc}, upsert */
	assert_int_equal(parse("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": "
			       "\"keepExisting\"}}]}",
			       &w),
			 0);
	bson_t st = BSON_INITIALIZER;
	assert_int_equal(sdb_aggw_merge_stmt(&w, doc, NULL, eval_fixed, &st, err, sizeof err), 0);
	assert_true(bson_iter_init_find(&it, &st, "u"));
	bson_t *want = BCON_NEW("q", "{", "_id", BCON_INT32(1), "}", "u", "{", "$setOnInsert",
				BCON_DOCUMENT(doc), "}", "upsert", BCON_BOOL(true), "multi",
				BCON_BOOL(false));
	assert_true(bson_equal(&st, want));
	bson_destroy(want);
	bson_destroy(&st);
	sdb_aggw_destroy(&w);
	/* a pipeline with fail: c holds the let variables' values (constants), no upsert */
	assert_int_equal(parse("{\"p\": [{\"$merge\": {\"into\": \"t\", \"whenMatched\": [], "
			       "\"whenNotMatched\": \"fail\", \"let\": {\"v\": \"$x\"}}}]}",
			       &w),
			 0);
	bson_init(&st);
	assert_int_equal(sdb_aggw_merge_stmt(&w, doc, NULL, eval_fixed, &st, err, sizeof err), 0);
	want = BCON_NEW("q", "{", "_id", BCON_INT32(1), "}", "u", "[", "]", "c", "{", "v",
			BCON_INT32(7), "}", "upsert", BCON_BOOL(false), "multi", BCON_BOOL(false));
	assert_true(bson_equal(&st, want));
	bson_destroy(want);
	bson_destroy(&st);
	sdb_aggw_destroy(&w);
	/* an _id is added when `on` includes it */
	bson_t *noid = BCON_NEW("x", BCON_INT32(2));
	bson_t out;
	assert_int_equal(parse("{\"p\": [{\"$merge\": \"t\"}]}", &w), 0);
	sdb_aggw_with_id(&w, noid, &out);
	assert_true(bson_iter_init(&it, &out) && bson_iter_next(&it));
	assert_string_equal(bson_iter_key(&it), "_id");
	assert_true(BSON_ITER_HOLDS_OID(&it));
	bson_destroy(&out);
	sdb_aggw_destroy(&w);
	bson_destroy(noid);
	bson_destroy(doc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_out_forms),
		cmocka_unit_test(test_merge_forms),
		cmocka_unit_test(test_on_filter_and_index),
		cmocka_unit_test(test_merge_statements),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
