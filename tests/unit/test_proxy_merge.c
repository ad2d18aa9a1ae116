/* Unit tests of src/proxy/merge.c: sort order across types, k-way pick, skip/limit
 * windows, distinct sets. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/proxy/merge.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/merge.h"
#include "storage/collation.h"

static merge_sort *parse(bson_t *spec)
{
	merge_sort *s = NULL;
	char err[256];
	int code = 0;

	assert_int_equal(merge_sort_parse(spec, &s, &code, err, sizeof err), 0);
	bson_destroy(spec);
	return s;
}

static void test_sort_cmp(void **state)
{
	merge_sort *s = parse(BCON_NEW("a", BCON_INT32(1), "b", BCON_INT32(-1)));
	bson_t *x = BCON_NEW("a", BCON_INT32(1), "b", BCON_INT32(5));
	bson_t *y = BCON_NEW("a", BCON_DOUBLE(1.0), "b", BCON_INT32(7));
	bson_t *z = BCON_NEW("a", BCON_UTF8("s"));
	bson_t *m = BCON_NEW("b", BCON_INT32(1)); /* a missing == null: first */
	bson_t *arr = BCON_NEW("a", "[", BCON_INT32(9), BCON_INT32(0), "]"); /* asc: min 0 */

	(void)state;
	assert_int_equal(merge_sort_nfields(s), 2);
	assert_true(merge_sort_cmp(s, y, x) < 0); /* a ties (1 == 1.0), b descending */
	assert_true(merge_sort_cmp(s, x, z) < 0); /* numbers before strings */
	assert_true(merge_sort_cmp(s, m, x) < 0);
	assert_true(merge_sort_cmp(s, arr, x) < 0);
	assert_int_equal(merge_sort_cmp(s, x, x), 0);
	assert_int_equal(merge_sort_cmp(NULL, x, z), 0);
	bson_destroy(x);
	bson_destroy(y);
	bson_destroy(z);
	bson_destroy(m);
	bson_destroy(arr);
	merge_sort_free(s);
}

/* issue #20: the merge compares under the sort's collation whatever the thread's, and
 * distinct dedups under the thread's */
static void test_collation(void **state)
{
	merge_sort *s = parse(BCON_NEW("a", BCON_INT32(1)));
	bson_t *ten = BCON_NEW("a", BCON_UTF8("10")), *nine = BCON_NEW("a", BCON_UTF8("9"));
	bson_t *up = BCON_NEW("x", BCON_UTF8("PING")), *low = BCON_NEW("x", BCON_UTF8("ping"));
	bson_t *num = BCON_NEW("locale", BCON_UTF8("en"), "numericOrdering", BCON_BOOL(true));
	bson_t *ci = BCON_NEW("locale", BCON_UTF8("en_US"), "strength", BCON_INT32(2));
	const sdb_collator *cn = NULL, *cc = NULL;
	char err[256];
	int code = 0;
	merge_distinct *d;

	(void)state;
	assert_int_equal(sdb_collation_parse_doc(num, &cn, &code, err, sizeof err), 0);
	assert_int_equal(sdb_collation_parse_doc(ci, &cc, &code, err, sizeof err), 0);
	assert_true(merge_sort_cmp(s, ten, nine) < 0); /* bytes: "10" < "9" */
	merge_sort_set_collation(s, cn);
	assert_true(merge_sort_cmp(s, ten, nine) > 0); /* numericOrdering: 10 > 9 */
	assert_null(sdb_collation_current());	       /* the thread's is left as it was */
	d = merge_distinct_new();
	assert_null(sdb_collation_use(cc));
	merge_distinct_add_doc(d, up, "x");
	merge_distinct_add_doc(d, low, "x");
	sdb_collation_use(NULL);
	assert_int_equal(merge_distinct_count(d), 1);
	merge_distinct_free(d);
	bson_destroy(ten);
	bson_destroy(nine);
	bson_destroy(up);
	bson_destroy(low);
	bson_destroy(num);
	bson_destroy(ci);
	merge_sort_free(s);
}

static void test_sort_parse_errors(void **state)
{
	merge_sort *s = NULL;
	char err[256];
	int code = 0;
	bson_t *bad = BCON_NEW("a", BCON_INT32(2));
	bson_t *nat = BCON_NEW("$natural", BCON_INT32(1));

	(void)state;
	assert_int_equal(merge_sort_parse(bad, &s, &code, err, sizeof err), -2);
	assert_int_equal(code, 15975);
	assert_string_equal(err, "$sort key ordering must be 1 (for ascending) or -1 (for descending)");
	assert_int_equal(merge_sort_parse(nat, &s, &code, err, sizeof err), 0);
	assert_int_equal(merge_sort_nfields(s), 0);
	merge_sort_free(s);
	bson_destroy(bad);
	bson_destroy(nat);
}

static void test_pick_merges_streams(void **state)
{
	merge_sort *s = parse(BCON_NEW("k", BCON_INT32(1)));
	/* three sorted streams; merged order must be 1 2 3 4 5 6 7 8 9 */
	int st[3][3] = {{1, 4, 7}, {2, 5, 8}, {3, 6, 9}};
	size_t pos[3] = {0, 0, 0}, i;
	bson_t *docs[3][3];
	const bson_t *heads[3];
	int out[9], n = 0;

	(void)state;
	for (i = 0; i < 9; i++)
		docs[i / 3][i % 3] = BCON_NEW("k", BCON_INT32(st[i / 3][i % 3]));
	for (;;) {
		ssize_t p;
		for (i = 0; i < 3; i++)
			heads[i] = pos[i] < 3 ? docs[i][pos[i]] : NULL;
		p = merge_pick(s, heads, 3);
		if (p < 0)
			break;
		{
			bson_iter_t it;
			bson_iter_init_find(&it, heads[p], "k");
			out[n++] = bson_iter_int32(&it);
		}
		pos[p]++;
	}
	assert_int_equal(n, 9);
	for (i = 0; i < 9; i++)
		assert_int_equal(out[i], (int)i + 1);
	/* ties go to the lowest stream */
	heads[0] = NULL;
	heads[1] = docs[0][0];
	heads[2] = docs[0][0];
	assert_int_equal(merge_pick(s, heads, 3), 1);
	for (i = 0; i < 9; i++)
		bson_destroy(docs[i / 3][i % 3]);
	merge_sort_free(s);
}

static void test_windows(void **state)
{
	(void)state;
	assert_int_equal(merge_count_window(10, 0, 0), 10);
	assert_int_equal(merge_count_window(10, 3, 0), 7);
	assert_int_equal(merge_count_window(10, 3, 5), 5);
	assert_int_equal(merge_count_window(10, 8, 5), 2);
	assert_int_equal(merge_count_window(10, 20, 5), 0);
	assert_int_equal(merge_count_window(10, 0, -4), 4);
	assert_int_equal(merge_pushdown_limit(5, 10), 15);
	assert_int_equal(merge_pushdown_limit(5, 0), 0);
	assert_int_equal(merge_pushdown_limit(INT64_MAX, 10), 0);
	/* issue #24: -INT64_MIN overflowed here (UBSan at merge.c:131) */
	assert_true(merge_count_window(10, 0, INT64_MIN) == 10);
	assert_true(merge_pushdown_limit(0, INT64_MIN) == INT64_MAX);
	assert_true(merge_pushdown_limit(1, INT64_MIN) == 0); /* saturated: no pushdown */
}

static void test_distinct(void **state)
{
	merge_distinct *d = merge_distinct_new();
	bson_t *a = BCON_NEW("x", BCON_INT32(1));
	bson_t *b = BCON_NEW("x", BCON_DOUBLE(1.0));
	bson_t *c = BCON_NEW("x", "[", BCON_INT32(3), BCON_UTF8("z"), BCON_INT32(1), "]");
	bson_t *e = BCON_NEW("y", BCON_INT32(1));
	bson_t out = BSON_INITIALIZER;
	bson_iter_t it, arr;
	char *json;

	(void)state;
	merge_distinct_add_doc(d, a, "x");
	merge_distinct_add_doc(d, b, "x");
	merge_distinct_add_doc(d, c, "x");
	merge_distinct_add_doc(d, e, "x");
	assert_int_equal(merge_distinct_count(d), 3);
	merge_distinct_append(d, &out, "values");
	assert_true(bson_iter_init_find(&it, &out, "values"));
	bson_iter_recurse(&it, &arr);
	json = bson_as_relaxed_extended_json(&out, NULL);
	assert_string_equal(json, "{ \"values\" : [ 1, 3, \"z\" ] }");
	bson_free(json);
	bson_destroy(&out);
	bson_destroy(a);
	bson_destroy(b);
	bson_destroy(c);
	bson_destroy(e);
	merge_distinct_free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sort_cmp),         cmocka_unit_test(test_sort_parse_errors),
		cmocka_unit_test(test_pick_merges_streams), cmocka_unit_test(test_windows),
		cmocka_unit_test(test_distinct),     cmocka_unit_test(test_collation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
