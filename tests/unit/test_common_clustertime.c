/* Unit tests of src/common/clustertime.c (issue #20): $clusterTime parsing and its
 * refusals, mongod's drift guard (205 and its message), signing, the reply fields and the
 * monotonic clock advance. */
#include "../../src/common/clustertime.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void test_parse(void **state)
{
	ct_gossip g;
	char err[256];
	uint8_t h[CT_HASH_LEN] = {1, 2, 3};
	(void)state;

	bson_t *none = BCON_NEW("ping", BCON_INT32(1));
	assert_int_equal(ct_parse(none, &g, err, sizeof err), 0);
	assert_false(g.present);
	bson_destroy(none);

	bson_t *ok = BCON_NEW("ping", BCON_INT32(1), "$clusterTime", "{", "clusterTime",
			      BCON_TIMESTAMP(100, 7), "signature", "{", "hash",
			      BCON_BIN(BSON_SUBTYPE_BINARY, h, CT_HASH_LEN), "keyId", BCON_INT64(1),
			      "}", "}");
	assert_int_equal(ct_parse(ok, &g, err, sizeof err), 0);
	assert_true(g.present);
	assert_true(g.signed_);
	assert_int_equal(g.time, ((uint64_t)100 << 32) | 7);
	assert_int_equal(g.key_id, 1);
	assert_memory_equal(g.hash, h, CT_HASH_LEN);
	bson_destroy(ok);

	bson_t *nosig = BCON_NEW("$clusterTime", "{", "clusterTime", BCON_TIMESTAMP(5, 1), "}");
	assert_int_equal(ct_parse(nosig, &g, err, sizeof err), 0);
	assert_true(g.present);
	assert_false(g.signed_);
	bson_destroy(nosig);

	bson_t *notobj = BCON_NEW("$clusterTime", BCON_INT32(5));
	assert_int_equal(ct_parse(notobj, &g, err, sizeof err), 14);
	assert_string_equal(err, "$clusterTime must be an object, found int");
	bson_destroy(notobj);

	bson_t *badts = BCON_NEW("$clusterTime", "{", "clusterTime", BCON_INT64(5), "}");
	assert_int_equal(ct_parse(badts, &g, err, sizeof err), 14);
	bson_destroy(badts);

	bson_t *missing = BCON_NEW("$clusterTime", "{", "signature", "{", "}", "}");
	assert_int_equal(ct_parse(missing, &g, err, sizeof err), 4);
	assert_false(g.present);
	bson_destroy(missing);

	bson_t *badkey = BCON_NEW("$clusterTime", "{", "clusterTime", BCON_TIMESTAMP(5, 1),
				  "signature", "{", "keyId", BCON_UTF8("x"), "}", "}");
	assert_int_equal(ct_parse(badkey, &g, err, sizeof err), 14);
	bson_destroy(badkey);
}

static void test_drift(void **state)
{
	char err[256];
	int64_t wall = 1750000000123LL; /* ms */
	uint64_t wsecs = 1750000000ULL;
	(void)state;

	/* exactly a year ahead is accepted, one second more is not (mongod: > drift) */
	assert_int_equal(ct_check_drift((wsecs + CT_MAX_DRIFT_SECS) << 32, wall, err, sizeof err),
			 0);
	assert_int_equal(
		ct_check_drift((wsecs + CT_MAX_DRIFT_SECS + 1) << 32 | 5, wall, err, sizeof err),
		CT_ERR_RATE_LIMITER);
	assert_string_equal(err, "New $clusterTime, 1781536001, is too far from this node's wall "
				 "clock time, 1750000000.");
	/* a floor at the edge is lowered so its next ts (+1, carrying) passes the guard */
	{
		uint64_t edge = (wsecs + CT_MAX_DRIFT_SECS) << 32 | 0xFFFFFFFFu;
		uint64_t f = ct_floor_clamp(edge, wall);
		assert_true(f < edge);
		assert_int_equal(ct_check_drift(f + 1, wall, err, sizeof err), 0);
		assert_int_equal(ct_floor_clamp((uint64_t)5 << 32 | 7, wall), (uint64_t)5 << 32 | 7);
	}
	/* the past is always fine */
	assert_int_equal(ct_check_drift((uint64_t)1 << 32, wall, err, sizeof err), 0);
	assert_int_equal(ct_check_drift(0, wall, err, sizeof err), 0);
}

static void test_append_and_sign(void **state)
{
	uint8_t secret[32], h1[CT_HASH_LEN], h2[CT_HASH_LEN];
	bson_iter_t it;
	(void)state;

	bson_t *r = bson_new();
	ct_append(r, ((uint64_t)9 << 32) | 2, ((uint64_t)8 << 32) | 1, NULL);
	assert_int_equal(ct_of_reply(r), ((uint64_t)9 << 32) | 2);
	assert_true(bson_iter_init_find(&it, r, "operationTime"));
	uint32_t t, i;
	bson_iter_timestamp(&it, &t, &i);
	assert_int_equal(t, 8);
	assert_int_equal(i, 1);
	assert_true(bson_iter_init_find(&it, r, "$clusterTime"));
	bson_iter_t f;
	assert_true(bson_iter_recurse(&it, &f) && bson_iter_find_descendant(&f, "signature.keyId", &f));
	assert_int_equal(bson_iter_as_int64(&f), 0);
	/* present fields are kept */
	ct_append(r, (uint64_t)100 << 32, (uint64_t)100 << 32, NULL);
	assert_int_equal(ct_of_reply(r), ((uint64_t)9 << 32) | 2);
	bson_destroy(r);

	memset(secret, 7, sizeof secret);
	ct_sign(secret, 42, h1);
	ct_sign(secret, 42, h2);
	assert_memory_equal(h1, h2, CT_HASH_LEN);
	ct_sign(secret, 43, h2);
	assert_memory_not_equal(h1, h2, CT_HASH_LEN);

	r = bson_new();
	ct_append(r, 42, 42, secret);
	ct_gossip g;
	char err[64];
	assert_int_equal(ct_parse(r, &g, err, sizeof err), 0);
	assert_true(g.signed_);
	assert_int_equal(g.key_id, 1);
	assert_memory_equal(g.hash, h1, CT_HASH_LEN);
	bson_destroy(r);

	bson_t *empty = bson_new();
	assert_int_equal(ct_of_reply(empty), 0);
	bson_destroy(empty);
}

static void test_advance(void **state)
{
	_Atomic uint64_t c = 5;
	(void)state;

	assert_int_equal(ct_advance(&c, 3), 5);
	assert_int_equal(atomic_load(&c), 5);
	assert_int_equal(ct_advance(&c, 9), 9);
	assert_int_equal(atomic_load(&c), 9);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_drift),
		cmocka_unit_test(test_append_and_sign),
		cmocka_unit_test(test_advance),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
