/* Unit tests of the HTTP/JSON gateway codec (ratelimit/json.c): every accepted spelling,
 * every error message, the exact output, and random mutations of a valid body (no
 * crash, no leak under ASan). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/ratelimit/json.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "ratelimit/json.h"
#include "ratelimit/limiter.h"

static int parse(const char *body, rl_json_reqs *out, char *err, size_t errlen)
{
	return rl_json_parse_reqs(body, strlen(body), out, err, errlen);
}

static void test_parse_full(void **state)
{
	(void)state;
	rl_json_reqs r;
	char err[256];
	const char *body =
		"{\"requests\": ["
		"{\"name\": \"n1\", \"unique_key\": \"k1\", \"hits\": 1, \"limit\": \"10\","
		" \"duration\": 60000, \"algorithm\": \"LEAKY_BUCKET\", \"behavior\": \"GLOBAL|NO_BATCHING\","
		" \"burst\": \"20\", \"created_at\": \"1700000000000\","
		" \"metadata\": {\"a\": \"1\", \"b\": \"2\"}},"
		"{\"name\": \"n2\", \"uniqueKey\": \"k2\", \"hits\": \"-3\", \"limit\": 5.0,"
		" \"duration\": \"4\", \"algorithm\": 2, \"behavior\": \"DURATION_IS_GREGORIAN,DRAIN_OVER_LIMIT\","
		" \"createdAt\": 1700000000001, \"burst\": null, \"metadata\": {\"c\": \"3\"}, \"extra\": {\"x\": [1]}},"
		"{\"name\": \"n3\", \"unique_key\": \"k3\", \"behavior\": 36, \"algorithm\": \"TOKEN_BUCKET\"}"
		"], \"ignored\": true}";
	assert_int_equal(parse(body, &r, err, sizeof err), 0);
	assert_int_equal(r.n, 3);
	assert_string_equal(r.reqs[0].name, "n1");
	assert_string_equal(r.reqs[0].unique_key, "k1");
	assert_int_equal(r.reqs[0].hits, 1);
	assert_int_equal(r.reqs[0].limit, 10);
	assert_int_equal(r.reqs[0].duration, 60000);
	assert_int_equal(r.reqs[0].algorithm, RL_LEAKY_BUCKET);
	assert_int_equal(r.reqs[0].behavior, RL_GLOBAL | RL_NO_BATCHING);
	assert_int_equal(r.reqs[0].burst, 20);
	assert_int_equal(r.reqs[0].created_at, INT64_C(1700000000000));
	assert_int_equal(r.reqs[0].n_metadata, 2);
	assert_string_equal(r.reqs[0].metadata[0].key, "a");
	assert_string_equal(r.reqs[0].metadata[0].value, "1");
	assert_string_equal(r.reqs[0].metadata[1].key, "b");
	assert_string_equal(r.reqs[0].metadata[1].value, "2");
	assert_string_equal(r.reqs[1].unique_key, "k2");
	assert_int_equal(r.reqs[1].hits, -3);
	assert_int_equal(r.reqs[1].limit, 5);
	assert_int_equal(r.reqs[1].duration, 4);
	assert_int_equal(r.reqs[1].algorithm, RL_GCRA);
	assert_int_equal(r.reqs[1].behavior, RL_DURATION_IS_GREGORIAN | RL_DRAIN_OVER_LIMIT);
	assert_int_equal(r.reqs[1].created_at, INT64_C(1700000000001));
	assert_int_equal(r.reqs[1].burst, 0);
	assert_int_equal(r.reqs[1].n_metadata, 1);
	assert_string_equal(r.reqs[1].metadata[0].value, "3");
	assert_int_equal(r.reqs[2].hits, 0);
	assert_int_equal(r.reqs[2].behavior, 36);
	assert_int_equal(r.reqs[2].n_metadata, 0);
	rl_json_reqs_free(&r);
	rl_json_reqs_free(&r); /* safe twice */

	/* no requests at all */
	assert_int_equal(parse("{}", &r, err, sizeof err), 0);
	assert_int_equal(r.n, 0);
	rl_json_reqs_free(&r);
	assert_int_equal(parse(" {\"requests\": null}", &r, err, sizeof err), 0);
	assert_int_equal(r.n, 0);
	rl_json_reqs_free(&r);
	/* empty strings and unknown enum numbers are the limiter's business (per item) */
	assert_int_equal(parse("{\"requests\": [{\"name\": \"\", \"algorithm\": 9}]}", &r, err, sizeof err), 0);
	assert_string_equal(r.reqs[0].name, "");
	assert_string_equal(r.reqs[0].unique_key, "");
	assert_int_equal(r.reqs[0].algorithm, 9);
	rl_json_reqs_free(&r);
}

static void expect_parse_error(const char *body, int rc, const char *msg)
{
	rl_json_reqs r;
	char err[256] = "";
	assert_int_equal(rl_json_parse_reqs(body, strlen(body), &r, err, sizeof err), rc);
	if (msg[strlen(msg) - 1] == '*')
		assert_int_equal(strncmp(err, msg, strlen(msg) - 1), 0);
	else
		assert_string_equal(err, msg);
	assert_null(r.reqs);
	assert_int_equal(r.n, 0);
	rl_json_reqs_free(&r);
}

static void test_parse_errors(void **state)
{
	(void)state;
	expect_parse_error("", SDB_EPROTO, "empty request body: want a JSON object");
	expect_parse_error("  \n", SDB_EPROTO, "empty request body: want a JSON object");
	expect_parse_error("[1]", SDB_EPROTO, "malformed JSON: want an object");
	expect_parse_error("{\"requests\": [", SDB_EPROTO, "malformed JSON: *");
	/* one object only, each field once (Go's decoder and protojson) */
	expect_parse_error("{\"requests\": []} {\"requests\": []}", SDB_EPROTO,
			   "malformed JSON: unexpected data after the top-level object");
	expect_parse_error("{\"requests\": []} x", SDB_EPROTO, "malformed JSON: *");
	expect_parse_error("{\"requests\": [], \"requests\": []}", SDB_EPROTO,
			   "duplicate field 'requests'");
	expect_parse_error("{\"requests\": [{\"hits\": 1, \"hits\": 2}]}", SDB_EPROTO,
			   "duplicate field 'hits' in a request");
	expect_parse_error("{\"requests\": [{\"unique_key\": \"a\", \"uniqueKey\": \"b\"}]}",
			   SDB_EPROTO, "duplicate field 'uniqueKey' in a request");
	expect_parse_error("{\"requests\": 5}", SDB_EPROTO,
			   "invalid value for field 'requests': want an array");
	expect_parse_error("{\"requests\": [5]}", SDB_EPROTO,
			   "invalid value for field 'requests': want an array of objects");
	expect_parse_error("{\"requests\": [{\"hits\": \"1x\"}]}", SDB_EPROTO,
			   "invalid value for field 'hits': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"hits\": \" 1\"}]}", SDB_EPROTO,
			   "invalid value for field 'hits': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"limit\": 1.5}]}", SDB_EPROTO,
			   "invalid value for field 'limit': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"duration\": 1e300}]}", SDB_EPROTO,
			   "invalid value for field 'duration': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"created_at\": \"99999999999999999999\"}]}", SDB_EPROTO,
			   "invalid value for field 'created_at': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"burst\": true}]}", SDB_EPROTO,
			   "invalid value for field 'burst': want an int64 (number or decimal string)");
	expect_parse_error("{\"requests\": [{\"name\": 1}]}", SDB_EPROTO,
			   "invalid value for field 'name': want a string");
	expect_parse_error("{\"requests\": [{\"unique_key\": [\"a\"]}]}", SDB_EPROTO,
			   "invalid value for field 'unique_key': want a string");
	expect_parse_error("{\"requests\": [{\"name\": \"a\\u0000b\"}]}", SDB_EPROTO,
			   "invalid value for field 'name': contains a NUL character");
	expect_parse_error("{\"requests\": [{\"algorithm\": \"FAST\"}]}", SDB_EPROTO,
			   "invalid value for enum field 'algorithm': want TOKEN_BUCKET, LEAKY_BUCKET, GCRA or a number");
	expect_parse_error("{\"requests\": [{\"algorithm\": 4294967296}]}", SDB_EPROTO,
			   "invalid value for enum field 'algorithm': want TOKEN_BUCKET, LEAKY_BUCKET, GCRA or a number");
	expect_parse_error("{\"requests\": [{\"behavior\": \"GLOBAL|\"}]}", SDB_EPROTO,
			   "invalid value for enum field 'behavior': want names such as \"GLOBAL|DRAIN_OVER_LIMIT\" or a number");
	expect_parse_error("{\"requests\": [{\"behavior\": \"GLOBAL||NO_BATCHING\"}]}", SDB_EPROTO,
			   "invalid value for enum field 'behavior': want names such as \"GLOBAL|DRAIN_OVER_LIMIT\" or a number");
	expect_parse_error("{\"requests\": [{\"behavior\": \"\"}]}", SDB_EPROTO,
			   "invalid value for enum field 'behavior': want names such as \"GLOBAL|DRAIN_OVER_LIMIT\" or a number");
	expect_parse_error("{\"requests\": [{\"metadata\": [1]}]}", SDB_EPROTO,
			   "invalid value for field 'metadata': want an object of strings");
	expect_parse_error("{\"requests\": [{\"metadata\": {\"k\": 1}}]}", SDB_EPROTO,
			   "invalid value for field 'metadata.k': want a string");

	/* 1001 items: refused before any per-item allocation */
	size_t cap = 20 + 1001 * 3;
	char *big = malloc(cap);
	size_t off = (size_t)snprintf(big, cap, "{\"requests\": [");
	for (int i = 0; i < 1001; i++)
		off += (size_t)snprintf(big + off, cap - off, "%s{}", i ? "," : "");
	snprintf(big + off, cap - off, "]}");
	expect_parse_error(big, SDB_ETOOBIG, "Requests.RateLimits list too large; max size is '1000'");
	/* 1000 is fine */
	off = (size_t)snprintf(big, cap, "{\"requests\": [");
	for (int i = 0; i < 1000; i++)
		off += (size_t)snprintf(big + off, cap - off, "%s{}", i ? "," : "");
	snprintf(big + off, cap - off, "]}");
	rl_json_reqs r;
	char err[256];
	assert_int_equal(parse(big, &r, err, sizeof err), 0);
	assert_int_equal(r.n, 1000);
	rl_json_reqs_free(&r);
	free(big);
}

/* The body need not be NUL-terminated: only len bytes are read. */
static void test_parse_length_bound(void **state)
{
	(void)state;
	const char body[] = "{\"requests\": [{\"name\": \"a\"}]}GARBAGE";
	rl_json_reqs r;
	char err[256];
	assert_int_equal(rl_json_parse_reqs(body, strlen(body) - 7, &r, err, sizeof err), 0);
	assert_int_equal(r.n, 1);
	assert_string_equal(r.reqs[0].name, "a");
	rl_json_reqs_free(&r);
}

static void test_render(void **state)
{
	(void)state;
	rl_resp resps[2];
	size_t len;
	char *s;
	memset(resps, 0, sizeof resps);
	resps[0].status = RL_OVER_LIMIT;
	resps[0].limit = 2;
	resps[0].remaining = 0;
	resps[0].reset_time = INT64_C(1700000005000);
	resps[0].retry_after = 4998;
	snprintf(resps[0].owner, sizeof resps[0].owner, "127.0.0.1:81");
	snprintf(resps[1].error, sizeof resps[1].error, "field \"x\" \\ bad");
	s = rl_json_render_resps(resps, 2, &len);
	assert_string_equal(s,
			    "{ \"responses\" : [ { \"status\" : \"OVER_LIMIT\", \"limit\" : \"2\", "
			    "\"remaining\" : \"0\", \"reset_time\" : \"1700000005000\", \"error\" : \"\", "
			    "\"metadata\" : { \"owner\" : \"127.0.0.1:81\", \"retry_after\" : \"4998\" } }, "
			    "{ \"status\" : \"UNDER_LIMIT\", \"limit\" : \"0\", \"remaining\" : \"0\", "
			    "\"reset_time\" : \"0\", \"error\" : \"field \\\"x\\\" \\\\ bad\", "
			    "\"metadata\" : {  } } ] }");
	assert_int_equal(len, strlen(s));
	free(s);
	s = rl_json_render_resps(resps, 0, &len);
	assert_string_equal(s, "{ \"responses\" : [  ] }");
	free(s);
	s = rl_json_render_error(11, "too \"many\"", &len);
	assert_string_equal(s, "{ \"code\" : 11, \"message\" : \"too \\\"many\\\"\", \"details\" : [  ] }");
	free(s);
	s = rl_json_render_health("healthy", "", 3, "10.0.0.1:1051", &len);
	assert_string_equal(s, "{ \"status\" : \"healthy\", \"message\" : \"\", \"peer_count\" : 3, "
			       "\"advertise_address\" : \"10.0.0.1:1051\" }");
	free(s);
	assert_string_equal(rl_algorithm_name(RL_GCRA), "GCRA");
	assert_null(rl_algorithm_name(3));
	assert_string_equal(rl_status_name(RL_OVER_LIMIT), "OVER_LIMIT");
	assert_null(rl_status_name(2));
}

/* Random byte mutations of a valid body: parse succeeds or fails cleanly, never crashes
 * or leaks (ASan/UBSan in CI). Deterministic seed. */
static void test_parse_mutations(void **state)
{
	(void)state;
	const char *seed_body =
		"{\"requests\": [{\"name\": \"n\", \"unique_key\": \"k\", \"hits\": \"1\", \"limit\": 10,"
		" \"duration\": 1000, \"algorithm\": \"GCRA\", \"behavior\": \"GLOBAL|RESET_REMAINING\","
		" \"metadata\": {\"a\": \"b\"}, \"created_at\": 1}]}";
	const char alphabet[] = "{}[]\":,0123456789-.eE\\u nulltrue";
	size_t n = strlen(seed_body);
	char *buf = malloc(n + 1);
	uint64_t x = 88172645463325252ull;
	int ok = 0, bad = 0;
	for (int iter = 0; iter < 20000; iter++) {
		memcpy(buf, seed_body, n + 1);
		int muts = 1 + iter % 4;
		for (int m = 0; m < muts; m++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[x % n] = alphabet[(x >> 20) % (sizeof alphabet - 1)];
		}
		rl_json_reqs r;
		char err[256];
		size_t len = (size_t)((x >> 40) % (n + 1));
		if (rl_json_parse_reqs(buf, iter % 2 ? n : len, &r, err, sizeof err) == 0) {
			ok++;
			for (size_t i = 0; i < r.n; i++) {
				assert_non_null(r.reqs[i].name);
				assert_non_null(r.reqs[i].unique_key);
			}
		} else {
			bad++;
			assert_true(strlen(err) > 0);
		}
		rl_json_reqs_free(&r);
	}
	free(buf);
	assert_true(ok > 100);
	assert_true(bad > 100);
}


/* parse_decimal and has_oversized_number (statics of json.c, reachable because the test
 * includes it). parse_decimal reads protojson's int64 string form: whole, in range, no
 * sign but '-', no leading space, and *out untouched on refusal. has_oversized_number
 * refuses a run of 20+ digits outside string literals (libbson's reader would wrap it
 * modulo 2^64), honouring escapes inside strings. */
static void test_static_number_scanners(void **state)
{
	static const char *bad[] = {"", " 5", "\t5", "\n5", "+5", "5 ", "5x", "0x10", "1e3", "-",
				    "9223372036854775808", "-9223372036854775809"};
	int64_t v = 0;

	(void)state;
	assert_true(parse_decimal("42", &v));
	assert_true(v == 42);
	assert_true(parse_decimal("-17", &v));
	assert_true(v == -17);
	assert_true(parse_decimal("9223372036854775807", &v));
	assert_true(v == INT64_MAX);
	assert_true(parse_decimal("-9223372036854775808", &v));
	assert_true(v == INT64_MIN);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		v = 7;
		if (parse_decimal(bad[i], &v))
			fail_msg("parse_decimal accepted \"%s\"", bad[i]);
		assert_true(v == 7);
	}

#define OVERSIZED(s) has_oversized_number((s), strlen(s))
	/* 19 digits is the most an int64 needs; 20 is refused */
	assert_false(OVERSIZED("{\"limit\": 1234567890123456789}"));
	assert_true(OVERSIZED("{\"limit\": 12345678901234567890}"));
	assert_true(OVERSIZED("{\"limit\": -18446744073709551617}"));
	/* separated runs do not add up */
	assert_false(OVERSIZED("{\"a\": 1234567890, \"b\": 1234567890}"));
	/* inside strings digits are text, also after an escaped quote */
	assert_false(OVERSIZED("{\"name\": \"12345678901234567890\"}"));
	assert_false(OVERSIZED("{\"name\": \"a\\\"12345678901234567890\"}"));
	/* an escaped backslash ends before the closing quote: the number after is outside */
	assert_true(OVERSIZED("{\"k\": \"\\\\\", \"limit\": 12345678901234567890}"));
	/* only the given length is scanned */
	assert_false(has_oversized_number("{\"limit\": 12345678901234567890}", 28));
#undef OVERSIZED
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_full),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_parse_length_bound),
		cmocka_unit_test(test_render),
		cmocka_unit_test(test_parse_mutations),
		cmocka_unit_test(test_static_number_scanners),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
