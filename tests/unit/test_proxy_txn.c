/* Unit tests of src/proxy/txn.c: the session fields of a retryable write (issue #16) and
 * the stmtIds each shard's share of a batch is sent with (MongoDB: stmtIds[i], else
 * stmtId + i, stmtId defaulting to 0). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/proxy/txn.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/txn.h"

static bson_t *lsid_doc(void)
{
	static const uint8_t id[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	bson_t *l = bson_new();
	bson_append_binary(l, "id", 2, BSON_SUBTYPE_UUID, id, 16);
	return l;
}

/* The stmtIds array appended for client statements idx[0..n). */
static void appended_ids(const proxy_txn *t, const int64_t *idx, size_t n, int32_t *out)
{
	bson_t cmd = BSON_INITIALIZER;
	bson_iter_t it, a;
	size_t k = 0;

	proxy_txn_append(t, &cmd, idx, n);
	assert_true(bson_iter_init_find(&it, &cmd, "txnNumber"));
	assert_int_equal(bson_iter_int64(&it), t->txn);
	assert_true(bson_iter_init_find(&it, &cmd, "lsid"));
	assert_true(bson_iter_init_find(&it, &cmd, "stmtIds"));
	assert_true(bson_iter_recurse(&it, &a));
	while (bson_iter_next(&a))
		out[k++] = bson_iter_int32(&a);
	assert_int_equal(k, n);
	bson_destroy(&cmd);
}

static void test_implicit_and_base_stmt_ids(void **state)
{
	(void)state;
	bson_t *l = lsid_doc();
	bson_t *cmd = BCON_NEW("update", "c", "updates", "[", "{", "}", "{", "}", "{", "}", "]",
			       "lsid", BCON_DOCUMENT(l), "txnNumber", BCON_INT64(7));
	proxy_txn t;
	int code = 0;
	char err[256];
	int64_t idx[2] = {2, 0};
	int32_t ids[2];

	assert_true(proxy_txn_parse(cmd, "updates", &t, &code, err, sizeof err));
	assert_true(t.on);
	assert_int_equal(t.txn, 7);
	appended_ids(&t, idx, 2, ids);
	assert_int_equal(ids[0], 2); /* statement 2 of the client keeps stmtId 2 */
	assert_int_equal(ids[1], 0);
	proxy_txn_free(&t);
	bson_destroy(cmd);

	cmd = BCON_NEW("update", "c", "updates", "[", "{", "}", "{", "}", "]", "lsid",
		       BCON_DOCUMENT(l), "txnNumber", BCON_INT64(7), "stmtId", BCON_INT32(40));
	assert_true(proxy_txn_parse(cmd, "updates", &t, &code, err, sizeof err));
	assert_int_equal(proxy_txn_stmt_id(&t, 1), 41);
	proxy_txn_free(&t);
	bson_destroy(cmd);
	bson_destroy(l);
}

static void test_explicit_stmt_ids_and_errors(void **state)
{
	(void)state;
	bson_t *l = lsid_doc();
	bson_t *cmd = BCON_NEW("insert", "c", "documents", "[", "{", "}", "{", "}", "{", "}",
			       "]", "lsid", BCON_DOCUMENT(l), "txnNumber", BCON_INT64(1),
			       "stmtIds", "[", BCON_INT32(10), BCON_INT32(20), BCON_INT32(30), "]");
	proxy_txn t;
	int code = 0;
	char err[256];
	int64_t idx[2] = {1, 2};
	int32_t ids[2];

	assert_true(proxy_txn_parse(cmd, "documents", &t, &code, err, sizeof err));
	appended_ids(&t, idx, 2, ids);
	assert_int_equal(ids[0], 20);
	assert_int_equal(ids[1], 30);
	proxy_txn_free(&t);
	bson_destroy(cmd);

	/* one stmtId too few: InvalidOptions */
	cmd = BCON_NEW("insert", "c", "documents", "[", "{", "}", "{", "}", "]", "lsid",
		       BCON_DOCUMENT(l), "txnNumber", BCON_INT64(1), "stmtIds", "[",
		       BCON_INT32(1), "]");
	assert_false(proxy_txn_parse(cmd, "documents", &t, &code, err, sizeof err));
	assert_int_equal(code, WIRE_ERR_INVALID_OPTIONS);
	assert_null(t.ids);
	bson_destroy(cmd);

	/* txnNumber without lsid: InvalidOptions, as mongod */
	cmd = BCON_NEW("insert", "c", "txnNumber", BCON_INT64(1));
	assert_false(proxy_txn_parse(cmd, "documents", &t, &code, err, sizeof err));
	assert_int_equal(code, WIRE_ERR_INVALID_OPTIONS);
	bson_destroy(cmd);

	/* no txnNumber: not retryable, nothing appended */
	cmd = BCON_NEW("insert", "c", "lsid", BCON_DOCUMENT(l));
	assert_true(proxy_txn_parse(cmd, "documents", &t, &code, err, sizeof err));
	assert_false(t.on);
	bson_t out = BSON_INITIALIZER;
	proxy_txn_append(&t, &out, idx, 2);
	assert_true(bson_empty(&out));
	bson_destroy(&out);
	proxy_txn_free(&t);
	bson_destroy(cmd);
	bson_destroy(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_implicit_and_base_stmt_ids),
		cmocka_unit_test(test_explicit_stmt_ids_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
