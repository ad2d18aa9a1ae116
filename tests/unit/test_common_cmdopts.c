/* Unit tests of src/common/cmdopts.c: the IDL type table every command passes before either
 * role runs it (unknown fields, wrong types, the value rules mongod applies at parse). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/common/cmdopts.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Run one of the checks (api true: sdb_cmd_api_check, else sdb_cmd_check with internal)
 * on the command in canonical extended JSON (its first key names it); asserts the code
 * and, when text is not NULL, that the message contains it. */
static void check_cmd(const char *json, bool api, bool internal, int code, const char *text)
{
	bson_error_t berr;
	bson_t *cmd = bson_new_from_json((const uint8_t *)json, -1, &berr);
	bson_iter_t it;
	char err[256] = "";
	int got;

	if (cmd == NULL)
		fail_msg("bad JSON %s: %s", json, berr.message);
	assert_true(bson_iter_init(&it, cmd) && bson_iter_next(&it));
	got = api ? sdb_cmd_api_check(bson_iter_key(&it), cmd, err, sizeof err)
		  : sdb_cmd_check(bson_iter_key(&it), cmd, internal, err, sizeof err);
	if (got != code)
		fail_msg("%s: code %d (%s), expected %d", json, got, err, code);
	if (text != NULL && strstr(err, text) == NULL)
		fail_msg("%s: message \"%s\" lacks \"%s\"", json, err, text);
	bson_destroy(cmd);
}

/* sdb_cmd_check of the command in canonical extended JSON: code and message text. */
static void expect(const char *json, bool internal, int code, const char *text)
{
	check_cmd(json, false, internal, code, text);
}

static void ok(const char *json)
{
	expect(json, false, 0, NULL);
}

static void test_object_fields(void **state)
{
	(void)state;
	expect("{\"find\": \"c\", \"filter\": \"x\"}", false, 14,
	       "BSON field 'find.filter' is the wrong type 'string', expected type 'object'");
	expect("{\"find\": \"c\", \"projection\": 1}", false, 14,
	       "'find.projection' is the wrong type 'int'");
	expect("{\"find\": \"c\", \"sort\": [1]}", false, 14, "'find.sort' is the wrong type 'array'");
	expect("{\"find\": \"c\", \"filter\": null}", false, 14, "wrong type 'null'");
	expect("{\"count\": \"c\", \"query\": \"bad\"}", false, 14, "'count.query'");
	expect("{\"distinct\": \"c\", \"key\": \"a\", \"query\": \"bad\"}", false, 14,
	       "'distinct.query'");
	expect("{\"findAndModify\": \"c\", \"query\": \"k == 5\", \"remove\": true}", false, 14,
	       "'findAndModify.query' is the wrong type 'string', expected type 'object'");
	expect("{\"findAndModify\": \"c\", \"sort\": 1, \"remove\": true}", false, 14,
	       "'findAndModify.sort'");
	expect("{\"findAndModify\": \"c\", \"fields\": \"a\", \"remove\": true}", false, 14,
	       "'findAndModify.fields'");
	expect("{\"findandmodify\": \"c\", \"query\": 5, \"remove\": true}", false, 14,
	       "'findandmodify.query'");
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {}, \"let\": 1}", false, 14,
	       "'aggregate.let'");
	expect("{\"find\": \"c\", \"readConcern\": \"local\"}", false, 14, "'find.readConcern'");
	ok("{\"find\": \"c\", \"filter\": {\"a\": 1}, \"projection\": {}, \"sort\": {\"a\": 1}}");
	ok("{\"findAndModify\": \"c\", \"query\": {}, \"sort\": {}, \"fields\": {}, \"remove\": true}");
}

static void test_other_types(void **state)
{
	(void)state;
	expect("{\"aggregate\": \"c\", \"pipeline\": {}, \"cursor\": {}}", false, 14,
	       "'aggregate.pipeline' is the wrong type 'object', expected type 'array'");
	expect("{\"distinct\": \"c\", \"key\": 5}", false, 14,
	       "'distinct.key' is the wrong type 'int', expected type 'string'");
	expect("{\"find\": \"c\", \"hint\": 5}", false, 14, "expected types '[string, object]'");
	ok("{\"find\": \"c\", \"hint\": \"a_1\"}");
	ok("{\"find\": \"c\", \"hint\": {\"a\": 1}}");
	expect("{\"findAndModify\": \"c\", \"query\": {}, \"update\": \"x\"}", false, 14,
	       "'findAndModify.update' is the wrong type 'string', expected types '[object, "
	       "array]'");
	ok("{\"findAndModify\": \"c\", \"query\": {}, \"update\": [{\"$set\": {\"a\": 1}}]}");
	expect("{\"insert\": \"c\", \"documents\": {}}", false, 14, "'insert.documents'");
	expect("{\"insert\": \"c\", \"documents\": [], \"stmtIds\": 1}", true, 14,
	       "'insert.stmtIds'");
}

static void test_bools(void **state)
{
	(void)state;
	expect("{\"findAndModify\": \"c\", \"query\": {}, \"remove\": \"yes\"}", false, 14,
	       "'findAndModify.remove' is the wrong type 'string', expected types '[bool, long, "
	       "int, double]'");
	expect("{\"findAndModify\": \"c\", \"query\": {}, \"update\": {}, \"new\": null}", false,
	       14, "'findAndModify.new'");
	expect("{\"findAndModify\": \"c\", \"query\": {}, \"update\": {}, \"upsert\": {}}", false,
	       14, "'findAndModify.upsert'");
	expect("{\"find\": \"c\", \"singleBatch\": \"x\"}", false, 14, "'find.singleBatch'");
	expect("{\"insert\": \"c\", \"documents\": [], \"ordered\": \"x\"}", false, 14,
	       "'insert.ordered'");
	ok("{\"find\": \"c\", \"singleBatch\": 1, \"tailable\": false}");
	ok("{\"findAndModify\": \"c\", \"query\": {}, \"remove\": 1.0}");
}

static void test_integers(void **state)
{
	(void)state;
	expect("{\"find\": \"c\", \"limit\": -1}", false, 51024,
	       "BSON field 'find.limit' value must be >= 0, actual value '-1'");
	expect("{\"find\": \"c\", \"batchSize\": {\"$numberLong\": \"-9223372036854775808\"}}",
	       false, 51024, "'find.batchSize' value must be >= 0");
	expect("{\"find\": \"c\", \"skip\": 1.5}", false, 9, "Expected an integer");
	expect("{\"find\": \"c\", \"limit\": {\"$numberDouble\": \"1e300\"}}", false, 9,
	       "Expected an integer");
	expect("{\"find\": \"c\", \"limit\": \"1\"}", false, 14,
	       "'find.limit' is the wrong type 'string'");
	expect("{\"count\": \"c\", \"limit\": \"1\"}", false, 14, "'count.limit'");
	/* count's limit may be negative (the command refuses INT64_MIN itself) */
	ok("{\"count\": \"c\", \"limit\": -2}");
	ok("{\"count\": \"c\", \"limit\": {\"$numberLong\": \"-9223372036854775808\"}}");
	ok("{\"find\": \"c\", \"limit\": 5.0, \"skip\": {\"$numberLong\": \"3\"}, \"batchSize\": 0}");
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {\"batchSize\": -1}}", false,
	       51024, "'aggregate.cursor.batchSize' value must be >= 0");
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {\"batchSize\": 1.5}}", false,
	       9, NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {\"batchSize\": \"5\"}}",
	       false, 14, NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {\"batchSize\": null}}", false,
	       14, NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": 1}", false, 14,
	       "'aggregate.cursor' is the wrong type 'int', expected type 'object'");
	ok("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {\"batchSize\": 0}}");
}

static void test_max_time_ms(void **state)
{
	(void)state;
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {}, \"maxTimeMS\": null}",
	       false, 2, "maxTimeMS must be a number");
	expect("{\"distinct\": \"c\", \"key\": \"a\", \"maxTimeMS\": true}", false, 2,
	       "maxTimeMS must be a number");
	expect("{\"find\": \"c\", \"maxTimeMS\": -1}", false, 2, "maxTimeMS is out of range");
	expect("{\"find\": \"c\", \"maxTimeMS\": {\"$numberLong\": \"9223372036854775807\"}}", false,
	       2, "maxTimeMS is out of range");
	expect("{\"find\": \"c\", \"maxTimeMS\": 2147483648}", false, 2, "out of range");
	expect("{\"find\": \"c\", \"maxTimeMS\": {\"$numberDouble\": \"Infinity\"}}", false, 2,
	       "out of range");
	expect("{\"find\": \"c\", \"maxTimeMS\": {\"$numberDouble\": \"NaN\"}}", false, 2,
	       "non-integral");
	expect("{\"find\": \"c\", \"maxTimeMS\": 1.5}", false, 2, "maxTimeMS has non-integral value");
	ok("{\"find\": \"c\", \"maxTimeMS\": 2147483647}");
	ok("{\"find\": \"c\", \"maxTimeMS\": 0}");
	ok("{\"find\": \"c\", \"maxTimeMS\": 100.0}");
}

static void test_write_concern(void **state)
{
	(void)state;
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"wtimeout\": "
	       "{\"$numberDouble\": \"Infinity\"}}}",
	       false, 9, "wtimeout must be a non-negative integer");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"wtimeout\": null}}", false,
	       9, "wtimeout");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"wtimeout\": \"5\"}}",
	       false, 9, "wtimeout");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"wtimeout\": 1e300}}",
	       false, 9, "wtimeout");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"w\": 1.5}}", false, 9,
	       "w has to be a non-negative integer");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"w\": {}}}", false, 9,
	       "w has to be a number or a string");
	/* a mode other than majority (tag sets): refused whole, before a proxy splits it */
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"w\": \"dc2\"}}",
	       false, 79, "unrecognized write concern mode: dc2");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"j\": \"x\"}}", false, 9,
	       "j must be numeric or a boolean value");
	expect("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": 1}", false, 9,
	       "writeConcern must be an object");
	ok("{\"insert\": \"c\", \"documents\": [], \"writeConcern\": {\"w\": \"majority\", "
	   "\"wtimeout\": 100, \"j\": true, \"fsync\": 1}}");
	ok("{\"delete\": \"c\", \"deletes\": [], \"writeConcern\": {\"w\": 0}}");
}

static void test_delete_statements(void **state)
{
	(void)state;
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0.5}]}", false, 9,
	       "The limit field in delete objects must be 0 or 1. Got 0.5");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 1e300}]}", false, 9,
	       "Got 1e+300");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": -1}]}", false, 9,
	       "Got -1");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 2}]}", false, 9, "Got 2");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": \"1\"}]}", false, 14,
	       "'delete.deletes.limit' is the wrong type 'string'");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": \"x\", \"limit\": 0}]}", false, 14,
	       "'delete.deletes.q' is the wrong type 'string'");
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0, \"hint\": 1}]}", false,
	       14, "'delete.deletes.hint'");
	ok("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0}, {\"q\": {}, \"limit\": "
	   "1.0}, {\"q\": {}, \"limit\": {\"$numberLong\": \"1\"}}]}");
	/* the second statement is checked too */
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0}, {\"q\": {}, \"limit\": "
	       "0.5}]}",
	       false, 9, NULL);
	/* a retryable write: 0.5 is a bad limit (9), not a multi-document delete (72) */
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0.5}], \"txnNumber\": 1}",
	       false, 9, NULL);
	/* a migration's range cleanup passes on a shard */
	expect("{\"delete\": \"c\", \"deletes\": [{\"q\": {\"$stripedbKeyRange\": true}, \"limit\": "
	       "0, \"keyRange\": {}, \"keyRangeLimit\": 100}]}",
	       true, 0, NULL);
}

static void test_update_statements(void **state)
{
	(void)state;
	expect("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {}, \"multi\": \"yes\"}]}", false,
	       14, "'update.updates.multi' is the wrong type 'string'");
	expect("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {}, \"upsert\": null}]}", false,
	       14, "'update.updates.upsert'");
	expect("{\"update\": \"c\", \"updates\": [{\"q\": 1, \"u\": {}}]}", false, 14,
	       "'update.updates.q'");
	expect("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": \"x\"}]}", false, 14,
	       "'update.updates.u' is the wrong type 'string', expected types '[object, array]'");
	expect("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {}, \"arrayFilters\": {}}]}",
	       false, 14, "'update.updates.arrayFilters'");
	ok("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": [{\"$set\": {\"a\": 1}}], "
	   "\"multi\": true, \"upsert\": 0}]}");
}

static void test_cursors(void **state)
{
	(void)state;
	expect("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": \"c\", \"batchSize\": -1}",
	       false, 2, "Batch size for getMore must be positive, but received: -1");
	expect("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": \"c\", \"batchSize\": 0}",
	       false, 2, "received: 0");
	expect("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": \"c\", \"batchSize\": "
	       "{\"$numberLong\": \"-9223372036854775808\"}}",
	       false, 2, "must be positive");
	expect("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": \"c\", \"batchSize\": 1.5}",
	       false, 9, NULL);
	expect("{\"getMore\": 1e300, \"collection\": \"c\"}", false, 14,
	       "'getMore.getMore' is the wrong type 'double', expected type 'long'");
	expect("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": 1}", false, 14,
	       "'getMore.collection'");
	ok("{\"getMore\": {\"$numberLong\": \"5\"}, \"collection\": \"c\", \"batchSize\": 3}");
	expect("{\"getMore\": 5, \"collection\": \"c\"}", false, 14,
	       "'getMore.getMore' is the wrong type 'int', expected type 'long'");
	expect("{\"killCursors\": \"c\", \"cursors\": \"notarray\"}", false, 14,
	       "'killCursors.cursors' is the wrong type 'string', expected type 'array'");
	expect("{\"killCursors\": \"c\", \"cursors\": [{\"$numberLong\": \"1\"}, 2.0]}", false, 14,
	       "'killCursors.cursors.1' is the wrong type 'double', expected type 'long'");
	ok("{\"killCursors\": \"c\", \"cursors\": [{\"$numberLong\": \"1\"}, 2]}");
}

static void test_explain_and_internal(void **state)
{
	(void)state;
	expect("{\"explain\": {\"find\": \"c\", \"filter\": \"x\"}}", false, 14, "'find.filter'");
	expect("{\"explain\": {\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0.5}]}}",
	       false, 9, NULL);
	/* stripedb's own fields keep passing on a shard (internal), typed or not */
	ok("{\"find\": \"c\", \"filter\": {}, \"$stripedbOrigin\": \"x\"}");
	expect("{\"find\": \"c\", \"keyRange\": {}, \"stripedbSnapshot\": true}", true, 0, NULL);
	expect("{\"insert\": \"c\", \"documents\": [], \"stmtIds\": [0, 1]}", true, 0, NULL);
	/* commands without a type list are not checked */
	ok("{\"ping\": 1, \"maxTimeMS\": \"x\"}");
	/* an unknown field is still reported before a type */
	expect("{\"find\": \"c\", \"filter\": \"x\", \"bogus\": 1}", false, 40415, "'find.bogus'");
	/* a collation of the wrong type is a type error; a non-simple one passes where it is
	 * honoured (issue #20; the command validates it) and is not implemented elsewhere */
	expect("{\"find\": \"c\", \"collation\": \"fr\"}", false, 14, "'find.collation'");
	ok("{\"find\": \"c\", \"collation\": {\"locale\": \"fr\"}}");
	ok("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {}, \"collation\": "
	   "{\"locale\": \"fr\"}}]}");
	ok("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"a\": 1}, \"name\": \"a_1\", "
	   "\"collation\": {\"locale\": \"fr\"}}]}");
	expect("{\"shardCollection\": \"d.c\", \"key\": {\"a\": 1}, \"collation\": "
	       "{\"locale\": \"fr\"}}",
	       false, 238, NULL);
	ok("{\"explain\": {\"find\": \"c\", \"collation\": {\"locale\": \"fr\"}}}");
	ok("{\"explain\": {\"find\": \"c\", \"collation\": {\"locale\": \"simple\"}}}");
	/* explain never takes a writeConcern, whatever it explains (mongod 6.0's
	 * CmdExplain::Invocation::supportsWriteConcern() is false) */
	expect("{\"explain\": {\"find\": \"c\"}, \"writeConcern\": {\"w\": 1}}", false, 72,
	       "Command does not support writeConcern");
	expect("{\"explain\": {\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0}]},"
	       " \"writeConcern\": {\"w\": \"majority\"}}",
	       false, 72, "Command does not support writeConcern");
	ok("{\"explain\": {\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {}}]}, "
	   "\"verbosity\": \"queryPlanner\"}");
}

/* sdb_cmd_fields_check of cmd (its first key names it): code and, when text is not NULL,
 * the whole message. */
static void expect_fields(const bson_t *cmd, int code, const char *text)
{
	bson_iter_t it;
	char err[256] = "";
	int got;

	assert_true(bson_iter_init(&it, cmd) && bson_iter_next(&it));
	got = sdb_cmd_fields_check(bson_iter_key(&it), cmd, err, sizeof err);
	if (got != code)
		fail_msg("code %d (%s), expected %d", got, err, code);
	if (text != NULL)
		assert_string_equal(err, text);
}

/* A duplicate top-level field: 40413 IDLDuplicateField, the message of MongoDB's
 * IDLParserContext::throwDuplicateField, the first repeat in the command's order named;
 * the command's own name is not counted; then the API parameters, checked alike. */
static void test_duplicate_fields(void **state)
{
	bson_t *cmd;
	char key[16];

	(void)state;
	cmd = BCON_NEW("insert", BCON_UTF8("c"), "documents", "[", "]", "ordered", BCON_BOOL(true),
		       "ordered", BCON_BOOL(false), "$db", BCON_UTF8("d"));
	expect_fields(cmd, 40413, "BSON field 'insert.ordered' is a duplicate field");
	bson_destroy(cmd);
	/* the first field whose repeat comes first: b, though a was seen before it */
	cmd = BCON_NEW("find", BCON_UTF8("c"), "a", BCON_INT32(1), "b", BCON_INT32(1), "b",
		       BCON_INT32(2), "a", BCON_INT32(2));
	expect_fields(cmd, 40413, "BSON field 'find.b' is a duplicate field");
	bson_destroy(cmd);
	cmd = BCON_NEW("find", BCON_UTF8("c"), "$db", BCON_UTF8("d"), "$db", BCON_UTF8("e"));
	expect_fields(cmd, 40413, "BSON field 'find.$db' is a duplicate field");
	bson_destroy(cmd);
	/* a duplicate is found before the API parameters are judged (mongod parses first) */
	cmd = BCON_NEW("find", BCON_UTF8("c"), "apiVersion", BCON_INT32(1), "x", BCON_INT32(1), "x",
		       BCON_INT32(2));
	expect_fields(cmd, 40413, "BSON field 'find.x' is a duplicate field");
	bson_destroy(cmd);
	/* stripedb's own commands: duplicates refused, API parameters not checked */
	cmd = BCON_NEW("stripedbSetVersion", BCON_UTF8("c"), "t", BCON_INT32(1), "t",
		       BCON_INT32(1));
	expect_fields(cmd, 40413, "BSON field 'stripedbSetVersion.t' is a duplicate field");
	bson_destroy(cmd);
	cmd = BCON_NEW("stripedbSetVersion", BCON_UTF8("c"), "apiStrict", BCON_BOOL(true));
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* lsid and $clusterTime again: what libmongoc appends after a role's command that
	 * carries its own (its implicit session, its cluster time), let through */
	cmd = BCON_NEW("update", BCON_UTF8("c"), "lsid", "{", "id", BCON_INT32(1), "}",
		       "$clusterTime", "{", "}", "$db", BCON_UTF8("d"), "lsid", "{", "id",
		       BCON_INT32(2), "}", "$clusterTime", "{", "}");
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* a field twice in an update's or a delete's statement (MongoDB's IDL parses each as
	 * a struct): the proxy routes by the first q, a shard's parser kept the last */
	cmd = BCON_NEW("update", BCON_UTF8("c"), "updates", "[", "{", "q", "{", "}", "u", "{", "}",
		       "}", "{", "q", "{", "_id", BCON_INT32(1), "}", "u", "{", "}", "q", "{", "_id",
		       BCON_INT32(2), "}", "}", "]");
	expect_fields(cmd, 40413, "BSON field 'update.updates.q' is a duplicate field");
	bson_destroy(cmd);
	cmd = BCON_NEW("delete", BCON_UTF8("c"), "deletes", "[", "{", "q", "{", "}", "limit",
		       BCON_INT32(1), "limit", BCON_INT32(0), "}", "]");
	expect_fields(cmd, 40413, "BSON field 'delete.deletes.limit' is a duplicate field");
	bson_destroy(cmd);
	/* a statement of more fields than the pairwise compare takes (16): the repeat after
	 * them is found by the hash set, and 20 distinct fields are not a repeat */
	{
		bson_t *many = bson_new(), stmts, st;
		char k[8];

		BSON_APPEND_UTF8(many, "update", "c");
		BSON_APPEND_ARRAY_BEGIN(many, "updates", &stmts);
		BSON_APPEND_DOCUMENT_BEGIN(&stmts, "0", &st);
		for (int i = 0; i < 20; i++) {
			snprintf(k, sizeof k, "f%d", i);
			BSON_APPEND_INT32(&st, k, i);
		}
		bson_append_document_end(&stmts, &st);
		BSON_APPEND_DOCUMENT_BEGIN(&stmts, "1", &st);
		for (int i = 0; i < 20; i++) {
			snprintf(k, sizeof k, "f%d", i);
			BSON_APPEND_INT32(&st, k, i);
		}
		BSON_APPEND_INT32(&st, "f17", 0);
		bson_append_document_end(&stmts, &st);
		bson_append_array_end(many, &stmts);
		expect_fields(many, 40413, "BSON field 'update.updates.f17' is a duplicate field");
		bson_destroy(many);
	}
	/* each statement is a set of its own; what is inside q or u is not a statement field;
	 * a statement that is not a document is left to the command's checks */
	cmd = BCON_NEW("update", BCON_UTF8("c"), "updates", "[", "{", "q", "{", "a", BCON_INT32(1),
		       "a", BCON_INT32(2), "}", "u", "{", "}", "}", "{", "q", "{", "}", "u", "{",
		       "}", "}", BCON_INT32(3), "]");
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* the command's name again is no duplicate here (the command's checks answer it) */
	cmd = BCON_NEW("find", BCON_UTF8("c"), "find", BCON_UTF8("d"));
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* fields alike but for case or a prefix are distinct */
	cmd = BCON_NEW("find", BCON_UTF8("c"), "filter", "{", "}", "Filter", "{", "}", "filte",
		       BCON_INT32(1), "filter2", BCON_INT32(1), "", BCON_INT32(1));
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* API parameters through this check as through sdb_cmd_api_check */
	cmd = BCON_NEW("find", BCON_UTF8("c"), "apiVersion", BCON_UTF8("2"));
	expect_fields(cmd, 322, "Cannot accept API version 2");
	bson_destroy(cmd);
	cmd = BCON_NEW("collStats", BCON_UTF8("c"), "apiVersion", BCON_UTF8("1"), "apiStrict",
		       BCON_BOOL(true));
	expect_fields(cmd, 323, NULL);
	bson_destroy(cmd);
	cmd = BCON_NEW("find", BCON_UTF8("c"), "apiVersion", BCON_UTF8("1"), "apiStrict",
		       BCON_BOOL(true), "filter", "{", "}", "$db", BCON_UTF8("d"));
	expect_fields(cmd, 0, NULL);
	bson_destroy(cmd);
	/* many fields: the set grows past its 64 slots on the stack; every one distinct, then
	 * one repeated at the end */
	cmd = BCON_NEW("find", BCON_UTF8("c"));
	for (int i = 0; i < 1000; i++) {
		snprintf(key, sizeof key, "f%d", i);
		BSON_APPEND_INT32(cmd, key, i);
	}
	expect_fields(cmd, 0, NULL);
	BSON_APPEND_INT32(cmd, "f777", 0);
	expect_fields(cmd, 40413, "BSON field 'find.f777' is a duplicate field");
	bson_destroy(cmd);
}

/* sdb_cmd_api_check of the command in canonical extended JSON: code and message text. */
static void expect_api(const char *json, int code, const char *text)
{
	check_cmd(json, true, false, code, text);
}

/* The API parameters (MongoDB 6.0 initializeAPIParameters) and the 6.0 IDL of the catalog
 * commands. */
static void test_api_and_catalog(void **state)
{
	(void)state;
	expect_api("{\"find\": \"c\"}", 0, NULL);
	expect_api("{\"find\": \"c\", \"apiVersion\": \"1\", \"apiStrict\": true}", 0, NULL);
	expect_api("{\"collStats\": \"c\", \"apiVersion\": \"1\", \"apiStrict\": false}", 0,
		   NULL);
	expect_api("{\"isMaster\": 1, \"apiVersion\": \"1\", \"apiStrict\": true}", 0, NULL);
	expect_api("{\"find\": \"c\", \"apiVersion\": \"2\"}", 322, "Cannot accept API version 2");
	expect_api("{\"find\": \"c\", \"apiVersion\": \"v1\"}", 322, "API version must be");
	expect_api("{\"find\": \"c\", \"apiStrict\": false}", 4886600, "without passing");
	expect_api("{\"find\": \"c\", \"apiDeprecationErrors\": true}", 4886600, NULL);
	expect_api("{\"find\": \"c\", \"apiVersion\": 1}", 14,
		   "'APIParametersFromClient.apiVersion' is the wrong type 'int'");
	expect_api("{\"find\": \"c\", \"apiVersion\": \"1\", \"apiStrict\": 1}", 14, NULL);
	expect_api("{\"collStats\": \"c\", \"apiVersion\": \"1\", \"apiStrict\": true}", 323,
		   "the command collStats is not in API Version 1");
	/* stripedb's own commands are internal: not checked */
	expect_api("{\"stripedbSetVersion\": \"c\", \"apiStrict\": true}", 0, NULL);

	expect("{\"listCollections\": 1, \"x\": 1}", false, 40415,
	       "'listCollections.x' is an unknown field.");
	expect("{\"dropDatabase\": 1, \"x\": 1}", true, 40415, NULL);
	ok("{\"listCollections\": 1, \"filter\": {}, \"nameOnly\": true, \"$db\": \"d\"}");
	ok("{\"createIndexes\": \"c\", \"indexes\": [], \"$stripedbIndexCopy\": true}");
	expect("{\"explain\": {\"find\": \"c\"}, \"verbosity\": \"x\"}", false, 2,
	       "Enumeration value 'x' for field 'explain.verbosity' is not a valid value.");
	expect("{\"explain\": {\"find\": \"c\"}, \"verbosity\": 1}", false, 14, NULL);
	expect("{\"find\": \"c\", \"includeQueryStatsMetrics\": true}", true, 40415, NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"fromMongos\": true}", false, 51089,
	       NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"fromMongos\": true}", true, 0, NULL);
	expect("{\"aggregate\": \"c\", \"pipeline\": [], \"needsMerge\": true}", true, 238,
	       NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_object_fields),	  cmocka_unit_test(test_other_types),
		cmocka_unit_test(test_bools),		  cmocka_unit_test(test_integers),
		cmocka_unit_test(test_max_time_ms),	  cmocka_unit_test(test_write_concern),
		cmocka_unit_test(test_delete_statements), cmocka_unit_test(test_update_statements),
		cmocka_unit_test(test_cursors),		  cmocka_unit_test(test_explain_and_internal),
		cmocka_unit_test(test_api_and_catalog),	  cmocka_unit_test(test_duplicate_fields),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
