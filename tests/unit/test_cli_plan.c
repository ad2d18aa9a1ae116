/* Unit tests of cli/migrate_plan.c (issue #17): the translation of an import filter into one
 * shard-key range (filter_range) and the checks of a plan document (parse_plan_doc), without
 * a cluster. */

/* The module under test, compiled into this binary (statics included); the helpers of
 * cli/migrate.c come from libstripedb.a. */
#include "../../cli/migrate_plan.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Translate filter (JSON) on key pattern key (JSON); on success the bounds as relaxed
 * extended JSON into lo/hi (caller frees with bson_free) and 0; else 2 with the message in
 * why (n bytes). */
static int translate(const char *key, bool hashed, const char *filter, char **lo, char **hi,
		     char *why, size_t n)
{
	plan p;
	plan_ns t;
	bson_error_t e;
	memset(&p, 0, sizeof p);
	memset(&t, 0, sizeof t);
	bson_t *k = bson_new_from_json((const uint8_t *)key, -1, &e);
	assert_non_null(k);
	bson_copy_to(k, &t.key);
	bson_destroy(k);
	t.hashed = hashed;
	snprintf(t.ns, sizeof t.ns, "app.t");
	plan_move *m = add_move(&p, "app.t", "shard-b");
	m->filter = bson_new_from_json((const uint8_t *)filter, -1, &e);
	assert_non_null(m->filter);
	int rc = filter_range(&p, m, &t, 0);
	*lo = *hi = NULL;
	if (rc == 0) {
		*lo = bson_as_relaxed_extended_json(m->lo, NULL);
		*hi = bson_as_relaxed_extended_json(m->hi, NULL);
	}
	snprintf(why, n, "%s", p.err);
	bson_destroy(&t.key);
	plan_free(&p);
	return rc;
}

static void accepted(void **state)
{
	static const struct {
		const char *key, *filter, *lo, *hi;
	} cases[] = {
		{"{\"t\": 1, \"k\": 1}", "{\"t\": \"acme\"}",
		 "{ \"t\" : \"acme\", \"k\" : { \"$minKey\" : 1 } }",
		 "{ \"t\" : \"acme\", \"k\" : { \"$maxKey\" : 1 } }"},
		{"{\"t\": 1, \"k\": 1}", "{\"t\": {\"$eq\": \"acme\"}}",
		 "{ \"t\" : \"acme\", \"k\" : { \"$minKey\" : 1 } }",
		 "{ \"t\" : \"acme\", \"k\" : { \"$maxKey\" : 1 } }"},
		{"{\"t\": 1, \"k\": 1}", "{\"k\": {\"$gte\": 10, \"$lt\": 20}, \"t\": \"acme\"}",
		 "{ \"t\" : \"acme\", \"k\" : 10 }", "{ \"t\" : \"acme\", \"k\" : 20 }"},
		/* $gt a: above every key of t = a; $lte c: every key of t = c included */
		{"{\"t\": 1, \"k\": 1}", "{\"t\": {\"$gt\": \"a\", \"$lte\": \"c\"}}",
		 "{ \"t\" : \"a\", \"k\" : { \"$maxKey\" : 1 } }",
		 "{ \"t\" : \"c\", \"k\" : { \"$maxKey\" : 1 } }"},
		{"{\"k\": 1}", "{\"k\": {\"$gte\": 1.5, \"$lt\": 7}}", "{ \"k\" : 1.5 }",
		 "{ \"k\" : 7 }"},
		{"{\"a\": 1, \"b\": 1, \"c\": 1}", "{\"a\": 1, \"b\": 2}",
		 "{ \"a\" : 1, \"b\" : 2, \"c\" : { \"$minKey\" : 1 } }",
		 "{ \"a\" : 1, \"b\" : 2, \"c\" : { \"$maxKey\" : 1 } }"},
	};
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *lo, *hi, why[1024];
		int rc = translate(cases[i].key, false, cases[i].filter, &lo, &hi, why, sizeof why);
		if (rc != 0)
			fail_msg("%s: refused: %s", cases[i].filter, why);
		assert_string_equal(lo, cases[i].lo);
		assert_string_equal(hi, cases[i].hi);
		bson_free(lo);
		bson_free(hi);
	}
}

static void refused(void **state)
{
	static const struct {
		const char *key;
		bool hashed;
		const char *filter, *why;
	} cases[] = {
		{"{\"t\": 1, \"k\": 1}", false, "{\"v\": 1}", "field 'v' is not in the shard key"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"k\": 5}", "equality on a prefix"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": \"a\", \"k\": 5}", "every shard key field"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"$or\": [{\"t\": \"a\"}]}", "operator $or"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": {\"$in\": [\"a\"]}}", "$in is not supported"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": {\"$gte\": \"a\"}}", "needs both"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": {\"$gte\": \"a\", \"$lt\": 3}}", "one type"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": {\"$gte\": \"c\", \"$lt\": \"a\"}}", "empty"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": [\"a\"]}", "an array value"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": {\"x\": 1}}", "an embedded document"},
		{"{\"t\": 1, \"k\": 1}", false, "{}", "empty filter"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": \"a\", \"k\": {\"$gt\": 1, \"$lt\": 5}}",
		 "last shard key field"},
		{"{\"t\": \"hashed\"}", true, "{\"t\": \"a\"}", "hashed shard key"},
		{"{\"t\": 1, \"k\": 1}", false, "{\"t\": \"a\", \"t\": \"b\"}", "given twice"},
	};
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *lo, *hi, why[1024];
		int rc = translate(cases[i].key, cases[i].hashed, cases[i].filter, &lo, &hi, why,
				   sizeof why);
		if (rc != 2)
			fail_msg("%s: accepted", cases[i].filter);
		if (!strstr(why, cases[i].why))
			fail_msg("%s: '%s' does not say '%s'", cases[i].filter, why, cases[i].why);
	}
}

/* parse_plan_doc: the moves of a good plan; a bad one refused with its reason. */
static void plan_documents(void **state)
{
	static const struct {
		const char *json, *why; /* why NULL: accepted */
		size_t n;
	} cases[] = {
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": 3, \"to\": \"s1\"}, {\"ns\": \"a.d\", "
		 "\"filter\": {\"t\": 1}, \"to\": \"s2\"}]}",
		 NULL, 2},
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": {\"$numberLong\": \"9\"}, \"to\": \"s\"}]}",
		 NULL, 1},
		{"{\"moves\": []}", "no moves", 0},
		{"{\"mvoes\": []}", "unknown field 'mvoes'", 0},
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": \"3\", \"to\": \"s\"}]}", "chunk must be",
		 0},
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": 3}]}", "needs to", 0},
		{"{\"moves\": [{\"ns\": \"ac\", \"chunk\": 3, \"to\": \"s\"}]}", "needs ns", 0},
		{"{\"moves\": [{\"ns\": \"a.c\", \"to\": \"s\"}]}", "either chunk or filter", 0},
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": 1, \"filter\": {}, \"to\": \"s\"}]}",
		 "either chunk or filter", 0},
		{"{\"moves\": [{\"ns\": \"a.c\", \"chunk\": 1, \"to\": \"s\", \"x\": 1}]}",
		 "unknown or mistyped field 'x'", 0},
		{"{\"moves\": [5]}", "not a document", 0},
	};
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		plan p;
		bson_error_t e;
		memset(&p, 0, sizeof p);
		bson_t *d = bson_new_from_json((const uint8_t *)cases[i].json, -1, &e);
		assert_non_null(d);
		int rc = parse_plan_doc(&p, d);
		if (cases[i].why == NULL) {
			if (rc != 0)
				fail_msg("%s: refused: %s", cases[i].json, p.err);
			assert_int_equal(p.n, cases[i].n);
		} else if (rc != 2 || !strstr(p.err, cases[i].why)) {
			fail_msg("%s: rc %d, '%s' does not say '%s'", cases[i].json, rc, p.err,
				 cases[i].why);
		}
		bson_destroy(d);
		plan_free(&p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(accepted),
		cmocka_unit_test(refused),
		cmocka_unit_test(plan_documents),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
