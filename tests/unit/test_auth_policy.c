/* Unit tests of src/auth/policy.c and the command classification of src/auth/gate.c. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. gate.c still comes from the archive (one
 * translation unit cannot hold both: each has a static cmp_str). */
#include "../../src/auth/policy.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "auth/gate.h"
#include "auth/policy.h"
#include "common/err.h"

static auth_policy *make(void)
{
	bson_t *t = BCON_NEW("tenants", "[",
			     "{", "name", "A", "}",
			     "{", "name", "B", "policy", "{", "databases", "[", "shared", "]",
			     "actions", "[", "find", "insert", "]", "collections", "{", "b1.ro",
			     "{", "actions", "[", "find", "]", "}", "b1.rw", "{", "actions", "[",
			     "find", "insert", "update", "remove", "admin", "]", "}", "}", "}", "}",
			     "{", "name", BCON_INT32(7), "}", /* malformed: skipped */
			     "]");
	bson_t *d = BCON_NEW("databases", "[", "{", "name", "a1", "tenant", "A", "}", "{", "name",
			     "b1", "tenant", "B", "}", "{", "name", "nobody", "}", "{", "name",
			     "ghost", "tenant", "Z", "}", "]");
	auth_policy *p = auth_policy_build(t, d);
	bson_destroy(t);
	bson_destroy(d);
	return p;
}

static void test_ownership(void **state)
{
	(void)state;
	auth_policy *p = make();
	assert_true(auth_policy_allowed(p, "A", "a1", "c", AUTH_ACT_ALL));
	assert_true(auth_policy_allowed(p, "A", "a1", NULL, AUTH_ACT_ADMIN));
	assert_false(auth_policy_allowed(p, "A", "b1", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "A", "nobody", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "A", "a1x", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "B", "a1", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "Z", "ghost", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, NULL, "a1", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "A", "a1", "c", 0));
	assert_false(auth_policy_allowed(p, "A", "a1", "c", 64));
	assert_true(auth_policy_has_tenant(p, "B"));
	assert_false(auth_policy_has_tenant(p, "Z"));
	auth_policy_free(p);
}

static void test_actions(void **state)
{
	(void)state;
	auth_policy *p = make();
	/* tenant-wide: find + insert */
	assert_true(auth_policy_allowed(p, "B", "b1", "c", AUTH_ACT_FIND | AUTH_ACT_INSERT));
	assert_false(auth_policy_allowed(p, "B", "b1", "c", AUTH_ACT_UPDATE));
	assert_true(auth_policy_allowed(p, "B", "shared", "x", AUTH_ACT_FIND));
	/* per collection */
	assert_false(auth_policy_allowed(p, "B", "b1", "ro", AUTH_ACT_INSERT));
	assert_true(auth_policy_allowed(p, "B", "b1", "ro", AUTH_ACT_FIND));
	assert_true(auth_policy_allowed(p, "B", "b1", "rw", AUTH_ACT_REMOVE | AUTH_ACT_ADMIN));
	assert_int_equal(auth_action_parse("createIndex"), AUTH_ACT_CREATE_INDEX);
	assert_int_equal(auth_action_parse("nope"), 0);
	assert_string_equal(auth_action_name(AUTH_ACT_REMOVE), "remove");
	auth_policy_free(p);
}

static void collect(void *arg, const char *db)
{
	char *s = arg;
	strcat(s, db);
	strcat(s, ";");
}

static void test_each_db(void **state)
{
	(void)state;
	auth_policy *p = make();
	char s[128] = "";
	auth_policy_each_db(p, "B", collect, s);
	assert_string_equal(s, "b1;shared;");
	s[0] = '\0';
	auth_policy_each_db(p, "Z", collect, s);
	assert_string_equal(s, "");
	auth_policy_free(p);
}

static bool authz(auth_policy *p, const char *tenant, const char *db, bson_t *cmd)
{
	char what[300];
	bson_iter_t it;
	bool ok;
	bson_iter_init(&it, cmd);
	bson_iter_next(&it);
	ok = auth_gate_authorize(p, tenant, bson_iter_key(&it), db, cmd, what, sizeof what);
	bson_destroy(cmd);
	return ok;
}

static void test_commands(void **state)
{
	(void)state;
	auth_policy *p = make();
	/* own data */
	assert_true(authz(p, "A", "a1", BCON_NEW("find", "c")));
	assert_true(authz(p, "A", "a1", BCON_NEW("getMore", BCON_INT64(5), "collection", "c")));
	assert_true(authz(p, "A", "a1", BCON_NEW("dropDatabase", BCON_INT32(1))));
	assert_true(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{", "$lookup",
						 "{", "from", "d", "}", "}", "]")));
	assert_true(authz(p, "A", "admin", BCON_NEW("endSessions", "[", "]")));
	/* another tenant's database, by every route */
	assert_false(authz(p, "A", "b1", BCON_NEW("find", "c")));
	assert_false(authz(p, "A", "b1", BCON_NEW("listCollections", BCON_INT32(1))));
	assert_false(authz(p, "A", "b1", BCON_NEW("getMore", BCON_INT64(5), "collection", "c")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						  "$lookup", "{", "from", "{", "db", "b1", "coll",
						  "x", "}", "}", "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{", "$out",
						  "{", "db", "b1", "coll", "x", "}", "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						  "$merge", "{", "into", "{", "db", "b1", "coll",
						  "x", "}", "}", "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						  "$facet", "{", "f", "[", "{", "$unionWith", "{",
						  "coll", "x", "pipeline", "[", "{", "$lookup", "{",
						  "from", "{", "db", "b1", "coll", "y", "}", "}",
						  "}", "]", "}", "}", "]", "}", "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", BCON_INT32(1), "pipeline", "[",
						  "{", "$currentOp", "{", "}", "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("create", "v", "viewOn", "c", "pipeline", "[",
						  "{", "$lookup", "{", "from", "{", "db", "b1",
						  "coll", "x", "}", "}", "}", "]")));
	/* change streams: a collection or database stream is a read of the tenant's own
	 * namespace; a cluster-wide one, one nested in a sub-pipeline, or one on another
	 * tenant's database is refused; appendOplogNote is an admin action on admin */
	assert_true(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						 "$changeStream", "{", "}", "}", "]")));
	assert_true(authz(p, "A", "a1", BCON_NEW("aggregate", BCON_INT32(1), "pipeline", "[", "{",
						 "$changeStream", "{", "}", "}", "]")));
	assert_false(authz(p, "A", "b1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						  "$changeStream", "{", "}", "}", "]")));
	assert_false(authz(p, "A", "admin", BCON_NEW("aggregate", BCON_INT32(1), "pipeline", "[",
						     "{", "$changeStream", "{",
						     "allChangesForCluster", BCON_BOOL(true), "}",
						     "}", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("aggregate", "c", "pipeline", "[", "{",
						  "$unionWith", "{", "coll", "d", "pipeline", "[",
						  "{", "$changeStream", "{", "}", "}", "]", "}", "}",
						  "]")));
	assert_false(authz(p, "A", "admin", BCON_NEW("appendOplogNote", BCON_INT32(1), "data",
						     "{", "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("appendOplogNote", BCON_INT32(1), "data", "{",
						  "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("getLog", "global")));
	assert_false(authz(p, "A", "a1", BCON_NEW("killAllSessions", "[", "]")));
	assert_false(authz(p, "A", "a1", BCON_NEW("find", BCON_INT32(1))));
	/* actions */
	assert_true(authz(p, "B", "b1", BCON_NEW("insert", "c")));
	assert_false(authz(p, "B", "b1", BCON_NEW("update", "c")));
	assert_false(authz(p, "B", "b1", BCON_NEW("insert", "ro")));
	assert_false(authz(p, "B", "b1", BCON_NEW("findAndModify", "c", "remove", BCON_BOOL(true))));
	assert_true(authz(p, "B", "b1", BCON_NEW("findAndModify", "rw", "remove", BCON_BOOL(true))));
	assert_true(authz(p, "B", "b1", BCON_NEW("update", "rw", "updates", "[", "{", "upsert",
						 BCON_BOOL(true), "}", "]")));
	assert_false(authz(p, "B", "b1", BCON_NEW("update", "ro", "updates", "[", "{", "upsert",
						  BCON_BOOL(true), "}", "]")));
	assert_false(authz(p, "B", "b1", BCON_NEW("drop", "c")));
	assert_false(authz(p, "B", "b1", BCON_NEW("createIndexes", "c")));
	/* stats and explain: find on the namespace; explain of a write needs the write's */
	assert_true(authz(p, "B", "b1", BCON_NEW("collStats", "ro")));
	assert_true(authz(p, "B", "b1", BCON_NEW("dbStats", BCON_INT32(1))));
	assert_false(authz(p, "A", "b1", BCON_NEW("collStats", "ro")));
	assert_false(authz(p, "A", "b1", BCON_NEW("dbStats", BCON_INT32(1))));
	assert_true(authz(p, "B", "b1", BCON_NEW("explain", "{", "find", "ro", "}")));
	assert_false(authz(p, "A", "b1", BCON_NEW("explain", "{", "count", "ro", "}")));
	assert_false(authz(p, "B", "b1", BCON_NEW("explain", "{", "delete", "ro", "}")));
	assert_true(authz(p, "B", "b1", BCON_NEW("explain", "{", "delete", "rw", "}")));
	assert_false(authz(p, "B", "b1", BCON_NEW("explain", "{", "findAndModify", "ro", "update",
						  "{", "}", "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("explain", "{", "aggregate", "c", "pipeline",
						  "[", "{", "$lookup", "{", "from", "{", "db",
						  "b1", "coll", "x", "}", "}", "}", "]", "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("explain", "{", "explain", "{", "find", "c",
						  "}", "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("explain", "{", "drop", "c", "}")));
	assert_false(authz(p, "A", "a1", BCON_NEW("explain", "c")));
	auth_policy_free(p);
}

static void expect_invalid(const char *json, const char *msg)
{
	bson_error_t e;
	bson_t *doc = bson_new_from_json((const uint8_t *)json, -1, &e);
	char err[300] = "";
	assert_non_null(doc);
	assert_int_equal(auth_policy_validate(doc, err, sizeof err), SDB_EINVAL);
	if (strstr(err, msg) == NULL)
		fail_msg("%s: message '%s' lacks '%s'", json, err, msg);
	bson_destroy(doc);
}

/* setPolicy refuses what the proxy could not read; a stored bad policy grants nothing */
static void test_validate_and_fail_closed(void **state)
{
	(void)state;
	bson_error_t e;
	char err[300];
	const char *good = "{\"actions\": [\"find\"], \"databases\": [\"x\"], \"collections\": "
			   "{\"d.c\": {\"actions\": [\"insert\"], \"forbidScatter\": true}}}";
	bson_t *doc = bson_new_from_json((const uint8_t *)good, -1, &e);
	assert_int_equal(auth_policy_validate(doc, err, sizeof err), 0);
	bson_destroy(doc);
	expect_invalid("{\"actions\": \"find\"}", "policy.actions must be an array");
	expect_invalid("{\"actions\": [\"find\", \"bogus\"]}", "unknown action 'bogus'");
	expect_invalid("{\"actions\": [1]}", "unknown action of a non-string type");
	expect_invalid("{\"databases\": \"x\"}", "policy.databases must be an array");
	expect_invalid("{\"databases\": [\"\"]}", "non-empty strings");
	expect_invalid("{\"collections\": {\"secret\": [\"find\"]}}", "'secret' must be");
	expect_invalid("{\"collections\": {\"d.c\": {\"action\": [\"find\"]}}}",
		       "policy.collections.d.c.action: unknown field");
	expect_invalid("{\"secret\": {\"actions\": []}}", "unknown field 'secret'");
	/* a tenant whose stored policy does not validate may do nothing, not everything */
	bson_t *t = BCON_NEW("tenants", "[", "{", "name", "B", "policy", "{", "actions", "find",
			     "}", "}", "]");
	bson_t *d = BCON_NEW("databases", "[", "{", "name", "b1", "tenant", "B", "}", "]");
	auth_policy *p = auth_policy_build(t, d);
	assert_false(auth_policy_allowed(p, "B", "b1", "c", AUTH_ACT_FIND));
	assert_false(auth_policy_allowed(p, "B", "b1", "c", AUTH_ACT_INSERT));
	auth_policy_free(p);
	bson_destroy(t);
	bson_destroy(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ownership),
		cmocka_unit_test(test_actions),
		cmocka_unit_test(test_each_db),
		cmocka_unit_test(test_commands),
		cmocka_unit_test(test_validate_and_fail_closed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
