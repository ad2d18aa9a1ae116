/* Unit tests of raft/fsm_peers.c through the state machine (sdb_fsm_apply_doc): rate-limit
 * peer registration, renewal without a version bump, expiry decided by the command's ts,
 * deregistration, the listing, and two members that apply the same entries agreeing. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/fsm_peers.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "raft/fsm.h"
#include "raft/fsm_peers.h"

static bson_t *apply_at(sdb_fsm *f, uint64_t index, const char *op, int64_t ts, const char *json)
{
	bson_error_t e;
	bson_t *args = bson_new_from_json((const uint8_t *)json, -1, &e);
	bson_t cmd = BSON_INITIALIZER;
	bson_t *res = bson_new();
	if (!args)
		fail_msg("bad json %s: %s", json, e.message);
	BSON_APPEND_UTF8(&cmd, "op", op);
	BSON_APPEND_INT64(&cmd, "ts", ts);
	BSON_APPEND_DOCUMENT(&cmd, "args", args);
	assert_int_equal(sdb_fsm_apply_doc(f, index, &cmd, res), 0);
	bson_destroy(&cmd);
	bson_destroy(args);
	return res;
}

static int64_t int_of(const bson_t *r, const char *key)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, r, key))
		fail_msg("no field %s in %s", key, bson_as_relaxed_extended_json(r, NULL));
	return bson_iter_as_int64(&it);
}

static double ok_of(const bson_t *r)
{
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, r, "ok"));
	return bson_iter_as_double(&it);
}

/* The addresses listed, comma-joined. */
static void listed(sdb_fsm *f, char *out, size_t n, int64_t *version)
{
	bson_t reply = BSON_INITIALIZER;
	bson_iter_t it, arr, d;
	char err[128];
	out[0] = '\0';
	assert_int_equal(sdb_fsm_query(f, "listRatelimitPeers", &reply, &reply, err, sizeof err), 0);
	*version = int_of(&reply, "version");
	assert_true(bson_iter_init_find(&it, &reply, "peers") && bson_iter_recurse(&it, &arr));
	while (bson_iter_next(&arr)) {
		assert_true(bson_iter_recurse(&arr, &d) && bson_iter_find(&d, "addr"));
		if (out[0])
			strncat(out, ",", n - strlen(out) - 1);
		strncat(out, bson_iter_utf8(&d, NULL), n - strlen(out) - 1);
	}
	bson_destroy(&reply);
}

static void test_register_renew_expire(void **state)
{
	sdb_fsm *f, *g;
	char err[128], list[256];
	int64_t v;
	bson_t *r;
	uint64_t i = 0;
	/* the same entries applied to two members */
	static const struct {
		const char *op;
		int64_t ts;
		const char *args;
	} log[] = {
		{"registerRatelimitPeer", 1000, "{\"addr\": \"127.0.0.1:2\", \"ttlMS\": 3000}"},
		{"registerRatelimitPeer", 1100,
		 "{\"addr\": \"127.0.0.1:1\", \"kind\": \"proxy\", \"ttlMS\": 3000}"},
		{"registerRatelimitPeer", 2000, "{\"addr\": \"127.0.0.1:2\", \"ttlMS\": 3000}"},
		{"expireRatelimitPeers", 4500, "{\"sinceMS\": 3000}"},
		{"expireRatelimitPeers", 4600, "{}"},
		{"deregisterRatelimitPeer", 4700, "{\"addr\": \"127.0.0.1:2\"}"},
	};

	(void)state;
	assert_int_equal(sdb_fsm_open(":memory:", &f, err, sizeof err), 0);
	assert_int_equal(sdb_fsm_open(":memory:", &g, err, sizeof err), 0);
	listed(f, list, sizeof list, &v);
	assert_int_equal(v, 0);
	assert_string_equal(list, "");

	/* a new peer bumps the version; its lease is the command's ts + ttl */
	r = apply_at(f, ++i, log[0].op, log[0].ts, log[0].args);
	assert_true(ok_of(r) == 1.0);
	assert_int_equal(int_of(r, "version"), 1);
	assert_int_equal(int_of(r, "expiresMS"), 4000);
	bson_destroy(r);
	r = apply_at(f, ++i, log[1].op, log[1].ts, log[1].args);
	assert_int_equal(int_of(r, "version"), 2);
	bson_destroy(r);
	/* a renewal moves the lease, not the version */
	r = apply_at(f, ++i, log[2].op, log[2].ts, log[2].args);
	assert_int_equal(int_of(r, "version"), 2);
	assert_int_equal(int_of(r, "expiresMS"), 5000);
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "127.0.0.1:1,127.0.0.1:2");
	assert_int_equal(sdb_fsm_peers_next_expiry(sdb_fsm_db(f), 0), 4100);
	/* a leader in office since 3000 waits one ttl (3000) before expiring anyone */
	assert_int_equal(sdb_fsm_peers_next_expiry(sdb_fsm_db(f), 3000), 6000);
	/* :1's lease (4100) has run out at 4500, but that leader has not had it for a ttl */
	r = apply_at(f, ++i, log[3].op, log[3].ts, log[3].args);
	assert_int_equal(int_of(r, "version"), 2);
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "127.0.0.1:1,127.0.0.1:2");
	/* expiry by the entry's ts: :1 (4100) lapsed, :2 (5000) not */
	r = apply_at(f, ++i, log[4].op, log[4].ts, log[4].args);
	assert_int_equal(int_of(r, "version"), 3);
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "127.0.0.1:2");
	assert_int_equal(v, 3);
	r = apply_at(f, ++i, log[5].op, log[5].ts, log[5].args);
	assert_int_equal(int_of(r, "version"), 4);
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "");
	assert_int_equal(sdb_fsm_peers_next_expiry(sdb_fsm_db(f), 0), INT64_MAX);

	/* refused: no addr, bad kind, ttl out of range (logical errors, nothing changes) */
	r = apply_at(f, ++i, "registerRatelimitPeer", 5000, "{\"ttlMS\": 3000}");
	assert_true(ok_of(r) == 0.0);
	assert_int_equal(int_of(r, "code"), 2);
	bson_destroy(r);
	r = apply_at(f, ++i, "registerRatelimitPeer", 5000,
		     "{\"addr\": \"h:1\", \"kind\": \"shard\", \"ttlMS\": 3000}");
	assert_true(ok_of(r) == 0.0);
	bson_destroy(r);
	r = apply_at(f, ++i, "registerRatelimitPeer", 5000, "{\"addr\": \"h:1\", \"ttlMS\": 10}");
	assert_true(ok_of(r) == 0.0);
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_int_equal(v, 4);

	/* another member applying the same entries reaches the same state */
	for (size_t k = 0; k < sizeof log / sizeof log[0]; k++)
		bson_destroy(apply_at(g, k + 1, log[k].op, log[k].ts, log[k].args));
	for (uint64_t k = sizeof log / sizeof log[0] + 1; k <= i; k++) {
		const char *a[] = {"{\"ttlMS\": 3000}",
				   "{\"addr\": \"h:1\", \"kind\": \"shard\", \"ttlMS\": 3000}",
				   "{\"addr\": \"h:1\", \"ttlMS\": 10}"};
		bson_destroy(apply_at(g, k, "registerRatelimitPeer", 5000,
				      a[k - sizeof log / sizeof log[0] - 1]));
	}
	assert_int_equal(sdb_fsm_hash(f), sdb_fsm_hash(g));
	sdb_fsm_close(f);
	sdb_fsm_close(g);
}

/* Issue #23 retest: instance ids. A live address held by another instance is refused
 * (DuplicateKey); a lapsed one is taken over; a deregistration removes only its own
 * instance's entry; entries without instance (older binaries) apply as before. */
static void test_instances(void **state)
{
	sdb_fsm *f;
	char err[128], list[256];
	int64_t v;
	bson_t *r;
	uint64_t i = 0;

	(void)state;
	assert_int_equal(sdb_fsm_open(":memory:", &f, err, sizeof err), 0);
	r = apply_at(f, ++i, "registerRatelimitPeer", 1000,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"a\"}");
	assert_true(ok_of(r) == 1.0);
	assert_int_equal(int_of(r, "version"), 1);
	bson_destroy(r);
	/* another process with the same address while a's lease is live: refused */
	r = apply_at(f, ++i, "registerRatelimitPeer", 2000,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"b\"}");
	assert_true(ok_of(r) == 0.0);
	assert_int_equal(int_of(r, "code"), 11000);
	bson_destroy(r);
	/* b's deregistration does not remove a's entry */
	r = apply_at(f, ++i, "deregisterRatelimitPeer", 2100,
		     "{\"addr\": \"h:1\", \"opVersion\": 6, \"instance\": \"b\"}");
	assert_true(ok_of(r) == 1.0);
	assert_false(int_of(r, "removed"));
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "h:1");
	assert_int_equal(v, 1);
	/* a's renewal; then an older binary's renewal (no instance) keeps the holder */
	r = apply_at(f, ++i, "registerRatelimitPeer", 2200,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"a\"}");
	assert_true(ok_of(r) == 1.0);
	bson_destroy(r);
	r = apply_at(f, ++i, "registerRatelimitPeer", 2300, "{\"addr\": \"h:1\", \"ttlMS\": 3000}");
	assert_true(ok_of(r) == 1.0);
	assert_int_equal(int_of(r, "expiresMS"), 5300);
	bson_destroy(r);
	r = apply_at(f, ++i, "registerRatelimitPeer", 2400,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"b\"}");
	assert_int_equal(int_of(r, "code"), 11000);
	bson_destroy(r);
	/* once a's lease has lapsed (5300) b takes the address over, without a version bump */
	r = apply_at(f, ++i, "registerRatelimitPeer", 5300,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"b\"}");
	assert_true(ok_of(r) == 1.0);
	assert_int_equal(int_of(r, "version"), 1);
	bson_destroy(r);
	/* now a's deregistration is the stale one */
	r = apply_at(f, ++i, "deregisterRatelimitPeer", 5400,
		     "{\"addr\": \"h:1\", \"opVersion\": 6, \"instance\": \"a\"}");
	assert_false(int_of(r, "removed"));
	bson_destroy(r);
	r = apply_at(f, ++i, "deregisterRatelimitPeer", 5500,
		     "{\"addr\": \"h:1\", \"opVersion\": 6, \"instance\": \"b\"}");
	assert_true(int_of(r, "removed"));
	assert_int_equal(int_of(r, "version"), 2);
	bson_destroy(r);
	/* an older binary's deregistration (no instance) removes whatever holds it */
	bson_destroy(apply_at(f, ++i, "registerRatelimitPeer", 6000,
			      "{\"addr\": \"h:2\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"c\"}"));
	r = apply_at(f, ++i, "deregisterRatelimitPeer", 6100, "{\"addr\": \"h:2\"}");
	assert_true(int_of(r, "removed"));
	bson_destroy(r);
	/* expiry drops the instance too: a new instance registers at once afterwards */
	bson_destroy(apply_at(f, ++i, "registerRatelimitPeer", 7000,
			      "{\"addr\": \"h:3\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"d\"}"));
	r = apply_at(f, ++i, "expireRatelimitPeers", 10000, "{}");
	assert_int_equal(int_of(r, "version"), 6);
	bson_destroy(r);
	{
		sqlite3_stmt *st;
		assert_int_equal(sqlite3_prepare_v2(sdb_fsm_db(f),
						    "SELECT count(*) FROM ratelimit_peer_instances",
						    -1, &st, NULL),
				 SQLITE_OK);
		assert_int_equal(sqlite3_step(st), SQLITE_ROW);
		assert_int_equal(sqlite3_column_int(st, 0), 0);
		sqlite3_finalize(st);
	}
	/* a bad instance is BadValue */
	r = apply_at(f, ++i, "registerRatelimitPeer", 10000,
		     "{\"addr\": \"h:4\", \"ttlMS\": 3000, \"opVersion\": 6, \"instance\": \"\"}");
	assert_int_equal(int_of(r, "code"), 2);
	bson_destroy(r);
	sdb_fsm_close(f);
}

/* Entries with an instance but stamped below MIGSTATE_OP_VERSION_PEER_INSTANCE (or not
 * stamped: a leader of an older binary) apply as before instance ids existed, as an older
 * member applies them: no refusal, a deregistration removes the address. */
static void test_instances_need_op_version(void **state)
{
	sdb_fsm *f;
	char err[128], list[256];
	int64_t v;
	bson_t *r;
	uint64_t i = 0;

	(void)state;
	assert_int_equal(sdb_fsm_open(":memory:", &f, err, sizeof err), 0);
	bson_destroy(apply_at(f, ++i, "registerRatelimitPeer", 1000,
			      "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"opVersion\": 5, "
			      "\"instance\": \"a\"}"));
	r = apply_at(f, ++i, "registerRatelimitPeer", 2000,
		     "{\"addr\": \"h:1\", \"ttlMS\": 3000, \"instance\": \"b\"}");
	assert_true(ok_of(r) == 1.0); /* a renewal, as an older member applies it */
	bson_destroy(r);
	r = apply_at(f, ++i, "deregisterRatelimitPeer", 2100,
		     "{\"addr\": \"h:1\", \"opVersion\": 5, \"instance\": \"c\"}");
	assert_true(int_of(r, "removed"));
	bson_destroy(r);
	listed(f, list, sizeof list, &v);
	assert_string_equal(list, "");
	sdb_fsm_close(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_register_renew_expire),
		cmocka_unit_test(test_instances),
		cmocka_unit_test(test_instances_need_op_version),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
