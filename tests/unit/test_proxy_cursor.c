/* Unit tests of src/proxy/cursor.c without any network: streams filled from cursor replies,
 * the ownership filter (a shard's documents of other chunks are dropped), the k-way merge
 * with skip, limit and projection, and batch boundaries. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/proxy/cursor.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/proxy.h"
#include "storage/projection.h"

/* chunks [MinKey,100) id 1 and [100,MaxKey) id 2 on key k */
static route_coll *table(void)
{
	bson_t *t = BCON_NEW("chunks", "[",
			     "{", "id", BCON_INT64(1), "min", "{", "k", BCON_MINKEY, "}",
			     "max", "{", "k", BCON_INT32(100), "}", "shard", "a", "token", BCON_INT64(1), "}",
			     "{", "id", BCON_INT64(2), "min", "{", "k", BCON_INT32(100), "}",
			     "max", "{", "k", BCON_MAXKEY, "}", "shard", "a", "token", BCON_INT64(1), "}",
			     "]");
	bson_t *key = BCON_NEW("k", BCON_INT32(1));
	route_coll *c = NULL;
	char err[128];

	assert_int_equal(route_coll_build("db.c", key, t, &c, err, sizeof err), 0);
	bson_destroy(t);
	bson_destroy(key);
	return c;
}

/* A cursor reply whose firstBatch holds {_id: v, k: v} for each v. */
static bson_t *reply_of(const int *ks, size_t n)
{
	bson_t *r = bson_new(), cur, arr, d;
	char key[16];
	size_t i;

	bson_append_document_begin(r, "cursor", -1, &cur);
	BSON_APPEND_INT64(&cur, "id", 0);
	bson_append_array_begin(&cur, "firstBatch", -1, &arr);
	for (i = 0; i < n; i++) {
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_INT32(&d, "_id", ks[i]);
		BSON_APPEND_INT32(&d, "k", ks[i]);
		BSON_APPEND_UTF8(&d, "pad", "x");
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&cur, &arr);
	bson_append_document_end(r, &cur);
	return r;
}

static void fill_stream(pstream *s, route_coll *rc, ssize_t chunk, const int *ks, size_t n)
{
	bson_t *heap = reply_of(ks, n), r;

	/* pstream_take_batch takes over a bson_t of the caller's, never a bson_new one
	 * (bson_steal frees that struct) */
	bson_copy_to(heap, &r);
	bson_destroy(heap);

	memset(s, 0, sizeof *s);
	bson_init(&s->err_reply);
	s->chunk = chunk;
	if (rc) {
		s->rcoll = rc;
		route_coll_ref(rc);
	}
	assert_int_equal(pstream_take_batch(s, &r, "firstBatch"), 0);
	assert_true(bson_empty(&r)); /* taken over, left empty */
	bson_destroy(&r);
}

static int64_t k_of(const bson_t *d)
{
	bson_iter_t it;

	assert_true(bson_iter_init_find(&it, d, "k"));
	return bson_iter_as_int64(&it);
}

static void test_ownership_filter(void **state)
{
	route_coll *rc = table();
	pstream *s = sdb_calloc_bson(1, sizeof *s);
	/* the shard holds both chunks: the request for chunk 1 keeps k < 100 only */
	int ks[] = {5, 150, 99, 100, 42};

	(void)state;
	fill_stream(s, rc, 0, ks, 5);
	assert_int_equal(s->n, 3);
	s->pos = 0;
	assert_int_equal(k_of(stream_head(s)), 5);
	s->pos = 1;
	assert_int_equal(k_of(stream_head(s)), 99);
	s->pos = 2;
	assert_int_equal(k_of(stream_head(s)), 42);
	s->pos = 0;
	assert_int_equal(s->cursor_id, 0);
	pstream_clear(s);
	bson_destroy(&s->err_reply);
	free(s);
	/* most of the reply another chunk's: the stream keeps a copy of its own documents,
	 * not the shard's whole batch */
	{
		int many[40];
		size_t i;
		s = sdb_calloc_bson(1, sizeof *s);
		for (i = 0; i < 40; i++)
			many[i] = i == 7 ? 3 : 200 + (int)i;
		fill_stream(s, rc, 0, many, 40);
		assert_int_equal(s->n, 1);
		assert_true(s->batch->len < 100);
		assert_int_equal(k_of(stream_head(s)), 3);
		pstream_clear(s);
		bson_destroy(&s->err_reply);
		free(s);
	}
	route_coll_unref(rc);
}

static void test_merge_skip_limit_projection(void **state)
{
	proxy p;
	pstream *s = sdb_calloc_bson(2, sizeof *s);
	int a[] = {1, 4, 7, 10}, b[] = {2, 3, 8, 9, 11};
	merge_sort *sort = NULL;
	sdb_projection *proj = NULL;
	bson_t *spec = BCON_NEW("k", BCON_INT32(1)), *pspec = BCON_NEW("pad", BCON_INT32(0));
	proxy_cursor *c;
	bson_t arr = BSON_INITIALIZER;
	char err[256], *json;
	int code = 0;

	(void)state;
	memset(&p, 0, sizeof p);
	fill_stream(&s[0], NULL, -1, a, 4);
	fill_stream(&s[1], NULL, -1, b, 5);
	assert_int_equal(merge_sort_parse(spec, &sort, &code, err, sizeof err), 0);
	assert_int_equal(sdb_projection_new(pspec, &proj, &code, err, sizeof err), 0);
	/* skip 2, limit 5 over 1 2 3 4 7 8 9 10 11 -> 3 4 7 8 9, in batches of 3 then 2 */
	c = proxy_cursor_new(&p, "db.c", s, 2, sort, proj, 2, 5);
	assert_int_equal(proxy_cursor_fill(&p, c, &arr, 3, &code, err, sizeof err), 0);
	json = bson_as_relaxed_extended_json(&arr, NULL);
	assert_string_equal(json, "{ \"0\" : { \"_id\" : 3, \"k\" : 3 }, \"1\" : { \"_id\" : 4, "
				  "\"k\" : 4 }, \"2\" : { \"_id\" : 7, \"k\" : 7 } }");
	bson_free(json);
	bson_reinit(&arr);
	assert_int_equal(proxy_cursor_fill(&p, c, &arr, 3, &code, err, sizeof err), 1);
	json = bson_as_relaxed_extended_json(&arr, NULL);
	assert_string_equal(json, "{ \"0\" : { \"_id\" : 8, \"k\" : 8 }, \"1\" : { \"_id\" : 9, "
				  "\"k\" : 9 } }");
	bson_free(json);
	bson_destroy(&arr);
	proxy_cursor_destroy(&p, c);
	bson_destroy(spec);
	bson_destroy(pspec);
}

static void test_unsorted_streams_in_order(void **state)
{
	proxy p;
	pstream *s = sdb_calloc_bson(2, sizeof *s);
	int a[] = {9, 1}, b[] = {5};
	proxy_cursor *c;
	const bson_t *d;
	int64_t got[3];
	int code = 0, i;
	char err[64];

	(void)state;
	memset(&p, 0, sizeof p);
	fill_stream(&s[0], NULL, -1, a, 2);
	fill_stream(&s[1], NULL, -1, b, 1);
	c = proxy_cursor_new(&p, "db.c", s, 2, NULL, NULL, 0, 0);
	for (i = 0; i < 3; i++) {
		assert_int_equal(proxy_cursor_next(&p, c, &d, &code, err, sizeof err), 1);
		got[i] = k_of(d);
	}
	assert_int_equal(proxy_cursor_next(&p, c, &d, &code, err, sizeof err), 0);
	/* stream order, then each stream's order */
	assert_int_equal(got[0], 9);
	assert_int_equal(got[1], 1);
	assert_int_equal(got[2], 5);
	assert_false(proxy_cursor_has_more(c));
	proxy_cursor_destroy(&p, c);
}

/* killCursors of a cursor in use (issue #20): proxy_cursor_kill marks it, nobody checks it
 * out again, the reaper leaves it while busy and frees it once checked in. */
static void test_kill_while_in_use(void **state)
{
	proxy p;
	pstream *s = sdb_calloc_bson(1, sizeof *s);
	int a[] = {1, 2};
	proxy_cursor *c;
	int64_t id;

	(void)state;
	memset(&p, 0, sizeof p);
	assert_int_equal(uv_mutex_init(&p.cmu), 0);
	p.cursor_timeout_ms = 600000;
	p.m_cursors = sdb_metrics_gauge("test_proxy_cursors_open", "test", NULL);
	fill_stream(&s[0], NULL, -1, a, 2);
	c = proxy_cursor_new(&p, "db.c", s, 1, NULL, NULL, 0, 0);
	id = proxy_cursor_register(&p, c, NULL);
	assert_ptr_equal(proxy_cursor_checkout(&p, id, NULL), c); /* a getMore runs */
	assert_null(proxy_cursor_checkout(&p, id, NULL));
	assert_true(proxy_cursor_kill(&p, id));
	assert_false(proxy_cursor_kill(&p, id)); /* already killed */
	assert_false(proxy_cursor_kill(&p, id + 1));
	proxy_cursor_reap(&p, false);
	assert_ptr_equal(p.cursors, c); /* still in use: not freed under the getMore */
	proxy_cursor_checkin(&p, c);
	assert_null(proxy_cursor_checkout(&p, id, NULL)); /* killed: CursorNotFound */
	proxy_cursor_reap(&p, false);
	assert_null(p.cursors);
	assert_int_equal(sdb_gauge_value(p.m_cursors), 0);
	/* a cursor nobody uses is killed the same way */
	s = sdb_calloc_bson(1, sizeof *s);
	fill_stream(&s[0], NULL, -1, a, 2);
	c = proxy_cursor_new(&p, "db.c", s, 1, NULL, NULL, 0, 0);
	id = proxy_cursor_register(&p, c, NULL);
	assert_true(proxy_cursor_kill(&p, id));
	assert_null(proxy_cursor_checkout(&p, id, NULL));
	proxy_cursor_reap(&p, false);
	assert_null(p.cursors);
	uv_mutex_destroy(&p.cmu);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ownership_filter),
		cmocka_unit_test(test_merge_skip_limit_projection),
		cmocka_unit_test(test_unsorted_streams_in_order),
		cmocka_unit_test(test_kill_while_in_use),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
