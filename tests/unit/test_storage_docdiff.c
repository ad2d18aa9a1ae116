/* Unit tests of storage/docdiff.c: the updateDescription of a pre-image/post-image pair,
 * as MongoDB 6.0 reports it in a change stream update event (document_diff_calculator.cpp,
 * change_stream_document_diff_parser.cpp). Expected documents are compared as canonical
 * extended JSON, so types (int32 vs int64) and field order count. Sizes quoted in comments
 * are the $v:2 diff sizes of MongoDB's size heuristic. */
#include "../../storage/docdiff.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Tests write JSON with single quotes; turn them into double quotes. */
static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (b == NULL)
		fail_msg("bad test JSON %s: %s", s, e.message);
	free(s);
	return b;
}

/* Describe pre -> post with kind; expect rc and (rc 1) the description `want`. */
static void check_kind(const char *pre, const char *post, sdb_docdiff_kind kind, int want_rc,
		       const char *want)
{
	bson_t *a = J(pre), *b = J(post), out;
	int rc = sdb_docdiff_describe(a, b, kind, &out);

	assert_int_equal(rc, want_rc);
	if (want_rc == 1) {
		bson_t *w = J(want);
		char *got = bson_as_canonical_extended_json(&out, NULL);
		char *exp = bson_as_canonical_extended_json(w, NULL);
		assert_string_equal(got, exp);
		bson_free(got);
		bson_free(exp);
		bson_destroy(w);
	} else {
		assert_int_equal(out.len, 5); /* empty */
	}
	bson_destroy(&out);
	bson_destroy(a);
	bson_destroy(b);
}

static void check(const char *pre, const char *post, const char *want)
{
	check_kind(pre, post, SDB_DOCDIFF_MODIFIER, 1, want);
}

#define UD(upd, rem, tr)                                                                   \
	"{'updatedFields': " upd ", 'removedFields': " rem ", 'truncatedArrays': " tr "}"

static void test_empty(void **state)
{
	(void)state;
	check("{'_id': 1, 'a': 1}", "{'_id': 1, 'a': 1}", UD("{}", "[]", "[]"));
	check("{}", "{}", UD("{}", "[]", "[]"));
}

static void test_top_level(void **state)
{
	(void)state;
	/* a: type change (int32 -> string), c removed, d inserted */
	check("{'_id': 1, 'a': 1, 'b': 'x', 'c': 3}", "{'_id': 1, 'a': '1', 'b': 'x', 'd': 4}",
	      UD("{'a': '1', 'd': 4}", "['c']", "[]"));
	/* values byte-exact: int32 -> int64 -> double are updates */
	check("{'_id': 1, 'a': 1}", "{'_id': 1, 'a': {'$numberLong': '1'}}",
	      UD("{'a': {'$numberLong': '1'}}", "[]", "[]"));
	check("{'_id': 1, 'a': 1}", "{'_id': 1, 'a': 1.0}", UD("{'a': 1.0}", "[]", "[]"));
	/* updated fields first, then inserted ones, then sub-diffs (the parser's order) */
	check("{'_id': 1, 's': {'x': 1, 'y': 2, 'z': 'abcdefghij'}, 'b': 1}",
	      "{'_id': 1, 's': {'x': 1, 'y': 3, 'z': 'abcdefghij'}, 'b': 2, 'n': 5}",
	      UD("{'b': 2, 'n': 5, 's.y': 3}", "[]", "[]"));
}

static void test_moved_and_removed(void **state)
{
	(void)state;
	/* a moved after b: re-inserted, not removed */
	check("{'_id': 1, 'a': 1, 'b': 2}", "{'_id': 1, 'b': 2, 'a': 1}",
	      UD("{'a': 1}", "[]", "[]"));
	/* fields removed before a matching one: the calculator's std::set order */
	check("{'_id': 1, 'z': 1, 'm': 1, 'a': 1, 'k': 1}", "{'_id': 1, 'k': 1}",
	      UD("{}", "['a', 'm', 'z']", "[]"));
	/* trailing removals (pre-image order) come before the set's */
	check("{'_id': 1, 'z': 1, 'k': 1, 'c': 1, 'b': 1}", "{'_id': 1, 'k': 1}",
	      UD("{}", "['c', 'b', 'z']", "[]"));
	/* everything replaced: removals after the inserts, sorted */
	check("{'b': 1, 'a': 1}", "{'x': 1}", UD("{'x': 1}", "['a', 'b']", "[]"));
}

static void test_nested(void **state)
{
	(void)state;
	/* s's sub-diff (20 bytes) is smaller than s (37): dotted path */
	check("{'_id': 1, 's': {'x': 1, 'y': 2, 'z': 'abcdefghij'}}",
	      "{'_id': 1, 's': {'x': 1, 'y': 3, 'z': 'abcdefghij'}}",
	      UD("{'s.y': 3}", "[]", "[]"));
	/* $unset of a nested field */
	check("{'_id': 1, 's': {'x': 1, 'y': 2, 'z': 'abcdefghij'}}",
	      "{'_id': 1, 's': {'x': 1, 'z': 'abcdefghij'}}", UD("{}", "['s.y']", "[]"));
	/* a new nested field */
	check("{'_id': 1, 's': {'x': 1, 'z': 'abcdefghij'}}",
	      "{'_id': 1, 's': {'x': 1, 'z': 'abcdefghij', 'w': true}}",
	      UD("{'s.w': true}", "[]", "[]"));
	/* three levels */
	check("{'a': {'b': {'c': 1, 'p': 'abcdefghijklmnop'}, 'p': 'abcdefghijklmnop'}}",
	      "{'a': {'b': {'c': 2, 'p': 'abcdefghijklmnop'}, 'p': 'abcdefghijklmnop'}}",
	      UD("{'a.b.c': 2}", "[]", "[]"));
	/* a small sub-document: its sub-diff (20) is larger than it (12): replaced whole */
	check("{'_id': 1, 'x': {'y': 1}}", "{'_id': 1, 'x': {'y': 2}}",
	      UD("{'x': {'y': 2}}", "[]", "[]"));
	/* a sub-document that becomes an array (type change): whole */
	check("{'a': {'0': 1}}", "{'a': [1]}", UD("{'a': [1]}", "[]", "[]"));
	/* a scalar that becomes a document */
	check("{'a': 1}", "{'a': {'b': 1}}", UD("{'a': {'b': 1}}", "[]", "[]"));
}

static void test_arrays(void **state)
{
	(void)state;
	/* grown ($push): 17 < 33 */
	check("{'_id': 1, 'arr': [1, 2, 3]}", "{'_id': 1, 'arr': [1, 2, 3, 4]}",
	      UD("{'arr.3': 4}", "[]", "[]"));
	/* several appended */
	check("{'_id': 1, 'arr': [1, 2, 3]}", "{'_id': 1, 'arr': [1, 2, 3, 4, 5]}",
	      UD("{'arr.3': 4, 'arr.4': 5}", "[]", "[]"));
	/* one element changed */
	check("{'_id': 1, 'arr': [1, 2, 3]}", "{'_id': 1, 'arr': [1, 5, 3]}",
	      UD("{'arr.1': 5}", "[]", "[]"));
	/* shrunk: 16 < 26 */
	check("{'_id': 1, 'arr': [1, 2, 3, 4, 5]}", "{'_id': 1, 'arr': [1, 2, 3]}",
	      UD("{}", "[]", "[{'field': 'arr', 'newSize': 3}]"));
	/* $pull from a short array: the diff (24) is larger than [1, 3] (19): whole */
	check("{'_id': 1, 'arr': [1, 2, 3]}", "{'_id': 1, 'arr': [1, 3]}",
	      UD("{'arr': [1, 3]}", "[]", "[]"));
	/* $pull from a longer array: truncation first, then the changed element */
	check("{'arr': [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}", "{'arr': [1, 2, 3, 4, 5, 6, 7, 8, 10]}",
	      UD("{'arr.8': 10}", "[]", "[{'field': 'arr', 'newSize': 9}]"));
	/* two-digit index */
	check("{'arr': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}",
	      "{'arr': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 'x']}", UD("{'arr.11': 'x'}", "[]", "[]"));
	/* an element's sub-document field */
	check("{'arr': [{'a': 1, 'b': 'abcdefghij'}, {'a': 2, 'b': 'abcdefghij'}]}",
	      "{'arr': [{'a': 1, 'b': 'abcdefghij'}, {'a': 3, 'b': 'abcdefghij'}]}",
	      UD("{'arr.1.a': 3}", "[]", "[]"));
	/* nested arrays shrunk */
	check("{'m': [[1, 2, 3, 4, 5], 'abcdefghijklmnop']}",
	      "{'m': [[1, 2, 3], 'abcdefghijklmnop']}",
	      UD("{}", "[]", "[{'field': 'm.0', 'newSize': 3}]"));
	/* emptied: the diff (16) is larger than [] (5): whole */
	check("{'arr': [1, 2]}", "{'arr': []}", UD("{'arr': []}", "[]", "[]"));
	/* first element pushed onto an empty array: 17 > 12: whole */
	check("{'arr': []}", "{'arr': [1]}", UD("{'arr': [1]}", "[]", "[]"));
}

static void test_pipeline(void **state)
{
	(void)state;
	/* the diff (20 + 15 padding) is not smaller than the post-image (21): a replacement */
	check_kind("{'_id': 1, 'a': 1}", "{'_id': 1, 'a': 2}", SDB_DOCDIFF_PIPELINE, 0, NULL);
	/* a modifier update is always described */
	check_kind("{'_id': 1, 'a': 1}", "{'_id': 1, 'a': 2}", SDB_DOCDIFF_MODIFIER, 1,
		   UD("{'a': 2}", "[]", "[]"));
	/* a large document: the diff is smaller */
	check_kind("{'_id': 1, 'a': 1, 'p': 'abcdefghijklmnopqrstuvwxyz0123456789'}",
		   "{'_id': 1, 'a': 2, 'p': 'abcdefghijklmnopqrstuvwxyz0123456789'}",
		   SDB_DOCDIFF_PIPELINE, 1, UD("{'a': 2}", "[]", "[]"));
}

static void test_corrupt(void **state)
{
	(void)state;
	bson_t *pre = J("{'a': {'b': 1}}"), *post = J("{'a': {'b': 2}}"), bad, out;
	uint8_t *buf = malloc(post->len);

	memcpy(buf, bson_get_data(post), post->len);
	assert_int_equal(buf[11], 0x10); /* the inner element's type byte (int32) */
	buf[11] = 0x20;			 /* no such type */
	assert_true(bson_init_static(&bad, buf, post->len));
	assert_int_equal(sdb_docdiff_describe(pre, &bad, SDB_DOCDIFF_MODIFIER, &out), SDB_EINVAL);
	assert_int_equal(out.len, 5);
	bson_destroy(&out);
	assert_int_equal(sdb_docdiff_describe(&bad, pre, SDB_DOCDIFF_MODIFIER, &out), SDB_EINVAL);
	bson_destroy(&out);
	free(buf);
	bson_destroy(pre);
	bson_destroy(post);
}

/* Nesting deeper than SDB_BSON_MAX_DEPTH: no recursion past it, the value is whole. */
static void test_deep(void **state)
{
	(void)state;
	enum { D = SDB_BSON_MAX_DEPTH + 20 };
	bson_t *pre = bson_new(), *post = bson_new(), out;
	for (int k = 0; k < 2; k++) {
		bson_t *doc = k ? post : pre, *cur = doc;
		bson_t kids[D];
		/* {p: pad, d: {p: pad, d: {... {v: k}}}}: every level's pad keeps its sub-diff
		 * smaller than it, so the heuristic never replaces a level whole */
		for (int i = 0; i < D; i++) {
			BSON_APPEND_UTF8(cur, "p", "abcdefghijklmnopqrst");
			bson_append_document_begin(cur, "d", 1, &kids[i]);
			cur = &kids[i];
		}
		BSON_APPEND_INT32(cur, "v", k);
		for (int i = D - 1; i >= 0; i--)
			bson_append_document_end(i ? &kids[i - 1] : doc, &kids[i]);
	}
	assert_int_equal(sdb_docdiff_describe(pre, post, SDB_DOCDIFF_MODIFIER, &out), 1);
	bson_iter_t it, f;
	assert_true(bson_iter_init_find(&it, &out, "updatedFields"));
	assert_true(bson_iter_recurse(&it, &f));
	assert_true(bson_iter_next(&f));
	/* one path of SDB_BSON_MAX_DEPTH + 1 components: "d.d. ... .d" */
	size_t want = 2 * (SDB_BSON_MAX_DEPTH + 1) - 1;
	assert_int_equal(strlen(bson_iter_key(&f)), want);
	assert_true(BSON_ITER_HOLDS_DOCUMENT(&f));
	assert_false(bson_iter_next(&f));
	bson_destroy(&out);
	bson_destroy(pre);
	bson_destroy(post);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),	   cmocka_unit_test(test_top_level),
		cmocka_unit_test(test_moved_and_removed), cmocka_unit_test(test_nested),
		cmocka_unit_test(test_arrays),	   cmocka_unit_test(test_pipeline),
		cmocka_unit_test(test_corrupt),	   cmocka_unit_test(test_deep),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
