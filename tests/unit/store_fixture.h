/* The store fixture of the storage unit tests (test_storage_store.c,
 * test_storage_index.c, test_storage_checkpoint.c): a store in a fresh temp directory with an injected clock
 * and one connection, and the assertions they share. Include after cmocka.h and
 * storage/store.h. */
#ifndef SDB_TESTS_UNIT_STORE_FIXTURE_H
#define SDB_TESTS_UNIT_STORE_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fx {
	char dir[256];
	int64_t now_ms;
	sdb_store *st;
	sdb_store_conn *c;
	char err[512];
} fx;

static inline int64_t fake_clock(void *arg)
{
	return ((fx *)arg)->now_ms;
}

static inline void fx_open(fx *f, int64_t oplog_max)
{
	sdb_store_opts o = {.clock_ms = fake_clock, .clock_arg = f, .oplog_max_bytes = oplog_max};
	assert_int_equal(sdb_store_open(f->dir, &o, &f->st, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_conn_open(f->st, &f->c, f->err, sizeof f->err), 0);
}

static inline void fx_close(fx *f)
{
	sdb_store_conn_close(f->c);
	sdb_store_close(f->st);
	f->c = NULL;
	f->st = NULL;
}

static inline int setup(void **state)
{
	fx *f = calloc(1, sizeof *f);
	snprintf(f->dir, sizeof f->dir, "/tmp/sdb-store-test-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	f->now_ms = 1700000000000LL;
	fx_open(f, 0);
	*state = f;
	return 0;
}

static inline int teardown(void **state)
{
	fx *f = *state;
	fx_close(f);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

/* {_id: id, a: a} (caller destroys). */
static inline bson_t *doc_id_a(int id, int a)
{
	bson_t *d = bson_new();
	BSON_APPEND_INT32(d, "_id", id);
	BSON_APPEND_INT32(d, "a", a);
	return d;
}

/* Insert {_id: id, a: a} into db.c (in the caller's write transaction); the store's
 * status, *dup filled on a duplicate key. */
static inline int insert(fx *f, int id, int a, sdb_store_dup *dup)
{
	bson_t *d = doc_id_a(id, a);
	int rc = sdb_store_insert(f->c, "db", "c", d, NULL, dup, f->err, sizeof f->err);
	bson_destroy(d);
	return rc;
}

static inline void begin_w(fx *f)
{
	assert_int_equal(sdb_store_begin(f->c, true, f->err, sizeof f->err), 0);
}

static inline void commit(fx *f)
{
	assert_int_equal(sdb_store_commit(f->c, f->err, sizeof f->err), 0);
}

/* Inside the open transaction: sdb_store_check finds no problem; then roll it back. */
static inline void assert_store_clean(fx *f)
{
	bson_t problems = BSON_INITIALIZER;
	int np = -1;
	assert_int_equal(sdb_store_check(f->c, &problems, &np, f->err, sizeof f->err), 0);
	assert_int_equal(np, 0);
	bson_destroy(&problems);
	sdb_store_rollback(f->c);
}

/* In a read transaction: db.c holds n documents and sdb_store_check finds no problem. */
static inline void assert_count_and_clean(fx *f, int64_t n)
{
	assert_int_equal(sdb_store_begin(f->c, false, f->err, sizeof f->err), 0);
	assert_int_equal(sdb_store_count(f->c, "db", "c"), n);
	assert_store_clean(f);
}

#endif
