/* Unit tests of src/shard/cs_event.c: one oplog entry -> its change events (MongoDB 6.0's
 * shapes, scopes, invalidation, transactions, migration copies). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/shard/cs_event.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static const bson_t *key_s(void *arg, const char *ns)
{
	static bson_t *key;
	(void)arg;
	if (!key)
		key = BCON_NEW("k", BCON_INT32(1), "a.b", BCON_INT32(1));
	return strcmp(ns, "db.s") == 0 ? key : NULL;
}

static bool lookup_none(void *arg, const char *db, const char *coll, const bson_iter_t *id,
			bson_t *out)
{
	(void)arg;
	(void)db;
	(void)coll;
	(void)id;
	(void)out;
	return false;
}

static shard_cs_scope scope(shard_cs_kind kind, const char *db, const char *coll)
{
	shard_cs_scope s = {.kind = kind, .db = db, .coll = coll, .shard = "sh1",
			    .key_of = key_s, .lookup = lookup_none};
	return s;
}

static bson_t *entry(const char *op, const char *ns, const bson_t *o)
{
	bson_t *e = bson_new();
	BSON_APPEND_TIMESTAMP(e, "ts", 100, 7);
	BSON_APPEND_UTF8(e, "op", op);
	BSON_APPEND_UTF8(e, "ns", ns);
	BSON_APPEND_DOCUMENT(e, "o", o);
	BSON_APPEND_DATE_TIME(e, "wall", 100000);
	return e;
}

static const char *str_of(const bson_t *d, const char *path)
{
	bson_iter_t it, x;
	if (!bson_iter_init(&it, d) || !bson_iter_find_descendant(&it, path, &x) ||
	    !BSON_ITER_HOLDS_UTF8(&x))
		return NULL;
	return bson_iter_utf8(&x, NULL);
}

static bool has(const bson_t *d, const char *path)
{
	bson_iter_t it, x;
	return bson_iter_init(&it, d) && bson_iter_find_descendant(&it, path, &x);
}

/* Is the document at it byte-for-byte want (fields, order and values)? */
static bool doc_eq_at(const bson_iter_t *it, const bson_t *want)
{
	const uint8_t *data;
	uint32_t len;
	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return false;
	bson_iter_document(it, &len, &data);
	return len == want->len && memcmp(data, bson_get_data(want), len) == 0;
}

static void free_all(bson_t **ev, size_t n)
{
	for (size_t i = 0; i < n; i++)
		bson_destroy(ev[i]);
}

static void test_insert_document_key_and_scope(void **state)
{
	bson_t *o = BCON_NEW("_id", BCON_INT32(1), "k", BCON_INT32(5), "a", "{", "b",
			     BCON_INT32(6), "}", "x", BCON_INT32(0));
	bson_t *e = entry("i", "db.s", o);
	shard_cs_scope s = scope(SHARD_CS_COLL, "db", "s");
	bson_t *ev[2];
	sdb_cs_token tok[2];
	bool inv = true;
	size_t n;
	bson_iter_t it;

	(void)state;
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_false(inv);
	assert_string_equal(str_of(ev[0], "operationType"), "insert");
	assert_string_equal(str_of(ev[0], "ns.coll"), "s");
	assert_true(has(ev[0], "fullDocument.x"));
	/* shard key fields in the pattern's order, then _id; a dotted field keeps its path */
	assert_true(bson_iter_init_find(&it, ev[0], "documentKey"));
	{
		bson_iter_t d;
		const char *keys[3] = {NULL, NULL, NULL};
		int i = 0;
		assert_true(bson_iter_recurse(&it, &d));
		while (bson_iter_next(&d) && i < 3)
			keys[i++] = bson_iter_key(&d);
		assert_int_equal(i, 3);
		assert_string_equal(keys[0], "k");
		assert_string_equal(keys[1], "a.b");
		assert_string_equal(keys[2], "_id");
	}
	assert_true(tok[0].ts == sdb_store_ts_pack(100, 7));
	assert_string_equal(tok[0].shard, "sh1");
	free_all(ev, n);
	/* other scopes */
	s = scope(SHARD_CS_COLL, "db", "t");
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	s = scope(SHARD_CS_DB, "other", NULL);
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	s = scope(SHARD_CS_CLUSTER, NULL, NULL);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	free_all(ev, n);
	bson_destroy(e);
	/* internal databases and system collections are never events */
	e = entry("i", "admin.x", o);
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
	e = entry("i", "db.system.views", o);
	s = scope(SHARD_CS_DB, "db", NULL);
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
	bson_destroy(o);
}

static void test_update_replace_delete(void **state)
{
	bson_t *o = BCON_NEW("_id", BCON_INT32(1), "v", BCON_INT32(2));
	bson_t *id = BCON_NEW("_id", BCON_INT32(1));
	bson_t *ud = BCON_NEW("updatedFields", "{", "v", BCON_INT32(2), "}", "removedFields", "[",
			      "]", "truncatedArrays", "[", "]");
	bson_t *e = entry("u", "db.c", o), *e2;
	shard_cs_scope s = scope(SHARD_CS_COLL, "db", "c");
	bson_t *ev[2];
	sdb_cs_token tok[2];
	bool inv;
	size_t n;

	(void)state;
	BSON_APPEND_DOCUMENT(e, "o2", id);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_string_equal(str_of(ev[0], "operationType"), "replace");
	assert_true(has(ev[0], "fullDocument.v"));
	assert_false(has(ev[0], "updateDescription"));
	free_all(ev, n);
	e2 = bson_copy(e);
	BSON_APPEND_DOCUMENT(e2, "updateDescription", ud);
	n = shard_cs_transform(&s, e2, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_string_equal(str_of(ev[0], "operationType"), "update");
	assert_false(has(ev[0], "fullDocument")); /* fullDocument "default" */
	assert_true(has(ev[0], "updateDescription.updatedFields.v"));
	free_all(ev, n);
	s.update_lookup = true; /* gone: null */
	n = shard_cs_transform(&s, e2, ev, tok, &inv);
	{
		bson_iter_t it;
		assert_true(bson_iter_init_find(&it, ev[0], "fullDocument"));
		assert_true(BSON_ITER_HOLDS_NULL(&it));
	}
	free_all(ev, n);
	bson_destroy(e);
	bson_destroy(e2);
	e = entry("d", "db.c", id);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_string_equal(str_of(ev[0], "operationType"), "delete");
	assert_false(has(ev[0], "fullDocument"));
	assert_true(has(ev[0], "documentKey._id"));
	free_all(ev, n);
	bson_destroy(e);
	bson_destroy(o);
	bson_destroy(id);
	bson_destroy(ud);
}

static void test_not_events(void **state)
{
	bson_t *o = BCON_NEW("_id", BCON_INT32(1));
	bson_t *e = entry("i", "db.c", o);
	shard_cs_scope s = scope(SHARD_CS_CLUSTER, NULL, NULL);
	bson_t *ev[2];
	sdb_cs_token tok[2];
	bool inv;

	(void)state;
	BSON_APPEND_UTF8(e, "origin", "mig-1"); /* a migration's copy */
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
	e = entry("n", "", o); /* appendOplogNote */
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
	bson_destroy(o);
	o = BCON_NEW("create", "c");
	e = entry("c", "db.$cmd", o);
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
	bson_destroy(o);
	/* malformed: no ts */
	e = BCON_NEW("op", "i", "ns", "db.c", "o", "{", "}");
	assert_int_equal(shard_cs_transform(&s, e, ev, tok, &inv), 0);
	bson_destroy(e);
}

static void test_ddl_and_invalidate(void **state)
{
	bson_t *drop = BCON_NEW("drop", "c");
	bson_t *ren = BCON_NEW("renameCollection", "db.x", "to", "db.c", "stayTemp", BCON_BOOL(0));
	bson_t *dd = BCON_NEW("dropDatabase", BCON_INT32(1));
	bson_t *e;
	shard_cs_scope s = scope(SHARD_CS_COLL, "db", "c");
	bson_t *ev[2];
	sdb_cs_token tok[2];
	bool inv;
	size_t n;

	(void)state;
	e = entry("c", "db.$cmd", drop);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 2);
	assert_true(inv);
	assert_string_equal(str_of(ev[0], "operationType"), "drop");
	assert_string_equal(str_of(ev[1], "operationType"), "invalidate");
	assert_int_equal(tok[1].kind, SDB_CS_INVALIDATE);
	assert_true(sdb_cs_token_cmp(&tok[0], &tok[1]) < 0);
	free_all(ev, n);
	s.merge = true; /* the proxy decides: no invalidate, but still told */
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_true(inv);
	free_all(ev, n);
	s.merge = false;
	bson_destroy(e);
	/* a rename onto the watched collection invalidates too */
	e = entry("c", "db.$cmd", ren);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 2);
	assert_string_equal(str_of(ev[0], "ns.coll"), "x");
	assert_string_equal(str_of(ev[0], "to.coll"), "c");
	free_all(ev, n);
	bson_destroy(e);
	/* dropDatabase: a database stream ends, a cluster stream goes on */
	e = entry("c", "db.$cmd", dd);
	s = scope(SHARD_CS_DB, "db", NULL);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 2);
	assert_string_equal(str_of(ev[0], "ns.db"), "db");
	assert_false(has(ev[0], "ns.coll"));
	free_all(ev, n);
	s = scope(SHARD_CS_CLUSTER, NULL, NULL);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_false(inv);
	free_all(ev, n);
	bson_destroy(e);
	bson_destroy(drop);
	bson_destroy(ren);
	bson_destroy(dd);
}

static void test_transaction_ops(void **state)
{
	bson_t *o = BCON_NEW("_id", BCON_INT32(1));
	bson_t *lsid = BCON_NEW("id", BCON_INT32(9));
	bson_t *e = entry("i", "db.c", o);
	shard_cs_scope s = scope(SHARD_CS_DB, "db", NULL);
	bson_t *ev[2];
	sdb_cs_token tok[2];
	bool inv;
	size_t n;

	(void)state;
	BSON_APPEND_DOCUMENT(e, "lsid", lsid);
	BSON_APPEND_INT64(e, "txnNumber", 4);
	BSON_APPEND_INT32(e, "stmtId", 3);
	/* a retryable write: session fields without inTxn, no lsid in the event */
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_false(has(ev[0], "lsid"));
	assert_int_equal(tok[0].idx, 0);
	free_all(ev, n);
	BSON_APPEND_BOOL(e, "inTxn", true);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	assert_true(has(ev[0], "lsid.id"));
	assert_true(has(ev[0], "txnNumber"));
	assert_int_equal(tok[0].idx, 3);
	free_all(ev, n);
	bson_destroy(e);
	bson_destroy(o);
	bson_destroy(lsid);
}

/* The documentKey an entry recorded (docKey: true: o2 of "i"/"u", o of "d") is the event's,
 * verbatim, whatever the shard key is now (key_s says db.s is sharded on {k, a.b}): an
 * entry written while db.s was sharded on {j: 1}, or unsharded, keeps its key. Entries
 * without the field (an earlier stripedb) still get the pattern known now. */
static void test_recorded_document_key(void **state)
{
	bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "j", BCON_INT32(7), "k", BCON_INT32(5));
	bson_t *key_j = BCON_NEW("j", BCON_INT32(7), "_id", BCON_INT32(1));
	bson_t *key_id = BCON_NEW("_id", BCON_INT32(1));
	shard_cs_scope s = scope(SHARD_CS_COLL, "db", "s");
	bson_t *ev[2], want;
	sdb_cs_token tok[2];
	bool inv;
	size_t n;
	bson_iter_t it;
	const char *ops[3] = {"i", "u", "d"};

	(void)state;
	for (int i = 0; i < 3; i++) {
		for (int unsharded = 0; unsharded < 2; unsharded++) {
			const bson_t *rec = unsharded ? key_id : key_j;
			bson_t *e = entry(ops[i], "db.s", i == 2 ? rec : doc);
			if (i < 2)
				BSON_APPEND_DOCUMENT(e, "o2", rec);
			BSON_APPEND_BOOL(e, SDB_STORE_OPLOG_DOCKEY_FIELD, true);
			n = shard_cs_transform(&s, e, ev, tok, &inv);
			assert_int_equal(n, 1);
			assert_true(bson_iter_init_find(&it, ev[0], "documentKey"));
			assert_true(doc_eq_at(&it, rec));
			free_all(ev, n);
			bson_destroy(e);
		}
	}
	/* the same insert without the field: today's pattern on the document */
	bson_t *e = entry("i", "db.s", doc);
	BSON_APPEND_DOCUMENT(e, "o2", key_j);
	n = shard_cs_transform(&s, e, ev, tok, &inv);
	assert_int_equal(n, 1);
	bson_init(&want);
	BSON_APPEND_INT32(&want, "k", 5);
	BSON_APPEND_INT32(&want, "_id", 1);
	assert_true(bson_iter_init_find(&it, ev[0], "documentKey"));
	assert_true(doc_eq_at(&it, &want));
	bson_destroy(&want);
	free_all(ev, n);
	bson_destroy(e);
	bson_destroy(doc);
	bson_destroy(key_j);
	bson_destroy(key_id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_insert_document_key_and_scope),
		cmocka_unit_test(test_update_replace_delete),
		cmocka_unit_test(test_recorded_document_key),
		cmocka_unit_test(test_not_events),
		cmocka_unit_test(test_ddl_and_invalidate),
		cmocka_unit_test(test_transaction_ops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
