/* Unit tests of src/proxy/changestream.c's merge without any network: the high-water-mark
 * rule (an event is released only when every shard without buffered events has a
 * postBatchResumeToken above it), token order across shards at equal ts, batch limits (the
 * position is then the last event), the position never below the client's resume point, a
 * shard not yet opened holding the merge back, a shard that left the list not holding it,
 * and the stages after $changeStream (a changed _id: 280). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/proxy/changestream.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static sdb_cs_token ev_tok(uint64_t ts, const char *shard)
{
	sdb_cs_token t;

	memset(&t, 0, sizeof t);
	t.ts = ts;
	t.kind = SDB_CS_EVENT;
	snprintf(t.shard, sizeof t.shard, "%s", shard);
	return t;
}

static sdb_cs_token hwm(uint64_t ts)
{
	sdb_cs_token t;

	cs_hwm_token(&t, ts);
	return t;
}

/* A stream over shards "a" and "b" (both opened, no PBRT yet). */
static px_cs *stream(void)
{
	px_cs *cs = sdb_calloc(1, sizeof *cs);

	bson_init(&cs->spec);
	bson_init(&cs->start);
	cs->level = CS_COLL;
	cs->db = sdb_strdup("db");
	cs->coll = sdb_strdup("c");
	cs->gm_coll = sdb_strdup("c");
	cs->sh = sdb_calloc(2, sizeof *cs->sh);
	shard_entry_init(&cs->sh[0], "a", false);
	shard_entry_init(&cs->sh[1], "b", false);
	cs->nsh = 2;
	return cs;
}

/* Buffer an insert event of document id with token (ts, shard) in s. */
static void push(cs_shard *s, uint64_t ts, int id)
{
	sdb_cs_token t = ev_tok(ts, s->id);
	bson_t *d = proxy_doc_new(), ns, key;

	sdb_cs_token_append(d, "_id", &t);
	BSON_APPEND_UTF8(d, "operationType", "insert");
	bson_append_document_begin(d, "ns", -1, &ns);
	BSON_APPEND_UTF8(&ns, "db", "db");
	BSON_APPEND_UTF8(&ns, "coll", "c");
	bson_append_document_end(d, &ns);
	bson_append_document_begin(d, "documentKey", -1, &key);
	BSON_APPEND_INT32(&key, "_id", id);
	bson_append_document_end(d, &key);
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 8;
		s->ev = sdb_realloc(s->ev, s->cap * sizeof *s->ev);
		s->tok = sdb_realloc(s->tok, s->cap * sizeof *s->tok);
	}
	s->tok[s->n] = t;
	s->ev[s->n++] = d;
	s->cursor_id = 1;
}

static void set_pbrt(cs_shard *s, sdb_cs_token t)
{
	s->pbrt = t;
	s->have_pbrt = true;
	s->opened = true;
	s->cursor_id = 1;
}

/* The documentKey._id values of the batch arr, in order, into ids (at most max). */
static size_t batch_ids(const bson_t *arr, int *ids, size_t max)
{
	bson_iter_t it, f;
	size_t n = 0;

	assert_true(bson_iter_init(&it, arr));
	while (bson_iter_next(&it) && n < max) {
		bson_iter_t d;
		assert_true(bson_iter_recurse(&it, &d));
		assert_true(bson_iter_find_descendant(&d, "documentKey._id", &f));
		ids[n++] = bson_iter_int32(&f);
	}
	return n;
}

typedef struct fixture {
	ctx c;
	px_answer ans;
	px_cs *cs;
	bson_t arr;
	size_t k, bytes;
} fixture;

static void fx_init(fixture *f)
{
	memset(f, 0, sizeof *f);
	f->c.ans = &f->ans;
	f->cs = stream();
	bson_init(&f->arr);
}

static void fx_done(fixture *f)
{
	bson_destroy(&f->arr);
	f->cs->sh[0].cursor_id = f->cs->sh[1].cursor_id = 0; /* no killCursors to send */
	px_cs_free(NULL, f->cs);
	px_answer_clear(&f->ans);
}

static int run_release(fixture *f, int64_t batch)
{
	bson_reinit(&f->arr);
	f->k = f->bytes = 0;
	return release(&f->c, f->cs, &f->arr, &f->k, &f->bytes, batch);
}

static void test_high_water_mark(void **state)
{
	fixture f;
	int ids[8];
	sdb_cs_token want;

	(void)state;
	fx_init(&f);
	push(&f.cs->sh[0], 10, 1);
	push(&f.cs->sh[0], 12, 2);
	set_pbrt(&f.cs->sh[0], hwm(12));
	set_pbrt(&f.cs->sh[1], hwm(11)); /* b promises nothing at or below ts 11 */
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1);
	assert_int_equal(ids[0], 1); /* ts 12 waits: b may still have an event at ts 12 */
	want = hwm(11);
	assert_true(f.cs->have_pos);
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &want), 0);
	/* b's next reply passes ts 12: the second event goes, the position is b's HWM */
	set_pbrt(&f.cs->sh[1], hwm(13));
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1);
	assert_int_equal(ids[0], 2);
	want = hwm(12); /* the smallest PBRT: a's */
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &want), 0);
	fx_done(&f);
}

static void test_equal_ts_by_shard_then_batch_limit(void **state)
{
	fixture f;
	int ids[8];

	(void)state;
	fx_init(&f);
	push(&f.cs->sh[1], 20, 2); /* b's event at ts 20 ... */
	push(&f.cs->sh[0], 20, 1); /* ... and a's: a's first (shard id order) */
	push(&f.cs->sh[0], 21, 3);
	set_pbrt(&f.cs->sh[0], hwm(21));
	set_pbrt(&f.cs->sh[1], hwm(21));
	assert_int_equal(run_release(&f, 2), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 2);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 2);
	/* cut by the batch size: the position is the last event, not the HWM */
	sdb_cs_token last = ev_tok(20, "b");
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &last), 0);
	assert_int_equal(run_release(&f, 2), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1);
	assert_int_equal(ids[0], 3);
	sdb_cs_token h = hwm(21);
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &h), 0);
	fx_done(&f);
}

static void test_unopened_shard_holds_gone_shard_does_not(void **state)
{
	fixture f;
	int ids[8];

	(void)state;
	fx_init(&f);
	push(&f.cs->sh[0], 30, 1);
	set_pbrt(&f.cs->sh[0], hwm(30));
	/* b has no PBRT yet (a shard found later, not opened): nothing goes */
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 0);
	assert_false(f.cs->have_pos);
	/* b left the shard list: it holds nothing back */
	f.cs->sh[1].gone = true;
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1);
	fx_done(&f);
}

static void test_position_never_below_resume_point(void **state)
{
	fixture f;

	(void)state;
	fx_init(&f);
	/* resumed after a's event at ts 50; b's oplog ends at 40 */
	f.cs->pos = ev_tok(50, "a");
	f.cs->have_pos = true;
	set_pbrt(&f.cs->sh[0], hwm(55));
	set_pbrt(&f.cs->sh[1], hwm(40));
	assert_int_equal(run_release(&f, -1), 0);
	sdb_cs_token was = ev_tok(50, "a");
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &was), 0);
	fx_done(&f);
}

static void test_floor_of_a_stream_without_start(void **state)
{
	fixture f;
	int ids[8];

	(void)state;
	fx_init(&f);
	/* opened without a start point: a started at ts 70, b at 75; the stream starts at 75 */
	f.cs->floor = hwm(75);
	f.cs->have_floor = true;
	f.cs->pos = f.cs->floor;
	f.cs->have_pos = true;
	push(&f.cs->sh[0], 72, 1); /* before the start: dropped */
	push(&f.cs->sh[0], 76, 2);
	set_pbrt(&f.cs->sh[0], hwm(76));
	set_pbrt(&f.cs->sh[1], hwm(80));
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1);
	assert_int_equal(ids[0], 2);
	fx_done(&f);
}

static void test_stages_and_changed_id(void **state)
{
	fixture f;
	int ids[8];
	bson_t *stages;

	(void)state;
	fx_init(&f);
	stages = BCON_NEW("0", "{", "$changeStream", "{", "}", "}", "1", "{", "$match", "{",
			  "documentKey._id", "{", "$gt", BCON_INT32(1), "}", "}", "}");
	f.c.cmd = stages; /* px_let reads the command's let: none */
	assert_int_equal(cs_parse_stages(&f.c, f.cs, stages), 0);
	push(&f.cs->sh[0], 60, 1);
	push(&f.cs->sh[0], 61, 2);
	set_pbrt(&f.cs->sh[0], hwm(61));
	set_pbrt(&f.cs->sh[1], hwm(61));
	assert_int_equal(run_release(&f, -1), 0);
	assert_int_equal(batch_ids(&f.arr, ids, 8), 1); /* filtered by $match */
	assert_int_equal(ids[0], 2);
	sdb_cs_token h = hwm(61);
	assert_int_equal(sdb_cs_token_cmp(&f.cs->pos, &h), 0);
	bson_destroy(stages);
	sdb_pipeline_free(f.cs->pl);
	f.cs->pl = NULL;
	/* a stage that changes _id: 280 */
	stages = BCON_NEW("0", "{", "$changeStream", "{", "}", "}", "1", "{", "$set", "{", "_id",
			  BCON_INT32(1), "}", "}");
	f.c.cmd = stages;
	assert_int_equal(cs_parse_stages(&f.c, f.cs, stages), 0);
	push(&f.cs->sh[0], 62, 3);
	set_pbrt(&f.cs->sh[0], hwm(62));
	set_pbrt(&f.cs->sh[1], hwm(62));
	assert_int_equal(run_release(&f, -1), 280);
	assert_int_equal(f.ans.code, 280);
	bson_destroy(stages);
	fx_done(&f);
}

static void test_refused_stages(void **state)
{
	fixture f;
	bson_t *stages;

	(void)state;
	fx_init(&f);
	stages = BCON_NEW("0", "{", "$changeStream", "{", "}", "}", "1", "{", "$group", "{", "_id",
			  BCON_INT32(1), "}", "}");
	f.c.cmd = stages;
	assert_int_equal(cs_parse_stages(&f.c, f.cs, stages), WIRE_ERR_ILLEGAL_OPERATION);
	bson_destroy(stages);
	px_answer_clear(&f.ans);
	stages = BCON_NEW("0", "{", "$match", "{", "}", "}", "1", "{", "$changeStream", "{", "}",
			  "}");
	assert_int_equal(px_cs_pipeline_kind(stages), -1);
	bson_destroy(stages);
	fx_done(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_high_water_mark),
		cmocka_unit_test(test_equal_ts_by_shard_then_batch_limit),
		cmocka_unit_test(test_unopened_shard_holds_gone_shard_does_not),
		cmocka_unit_test(test_position_never_below_resume_point),
		cmocka_unit_test(test_floor_of_a_stream_without_start),
		cmocka_unit_test(test_stages_and_changed_id),
		cmocka_unit_test(test_refused_stages),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
