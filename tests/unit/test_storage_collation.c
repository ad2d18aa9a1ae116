/* Unit tests of storage/collation.c (issue #20): parsing and validating a collation spec as
 * MongoDB 6.0's CollatorFactoryICU (codes and messages), comparisons, sort keys, the keyenc
 * encoding under a collation and the thread's collation hook of common/bsonval.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/bsonval.h"
#include "storage/collation.h"
#include "storage/keyenc.h"

static bson_t *J(const char *json)
{
	bson_error_t e;
	bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &e);

	assert_non_null(b);
	return b;
}

/* parse json; returns the code (0 ok) and the collator in *out */
static int parse(const char *json, const sdb_collator **out, char *err, size_t errlen)
{
	bson_t *b = J(json);
	int code = 0;
	int rc = sdb_collation_parse_doc(b, out, &code, err, errlen);

	bson_destroy(b);
	if (rc == 0)
		assert_int_equal(code, 0);
	else
		assert_int_not_equal(code, 0);
	return rc ? code : 0;
}

static void test_parse_ok(void **state)
{
	(void)state;
	const sdb_collator *c, *c2;
	char err[512];
	bson_iter_t it;

	assert_int_equal(parse("{\"locale\": \"simple\"}", &c, err, sizeof err), 0);
	assert_null(c);
	assert_int_equal(parse("{\"locale\": \"en_US\", \"strength\": 2}", &c, err, sizeof err), 0);
	assert_non_null(c);
	/* the same spec again: the cached collator */
	assert_int_equal(parse("{\"locale\": \"en_US\", \"strength\": 2}", &c2, err, sizeof err), 0);
	assert_ptr_equal(c, c2);
	/* the full spec with the locale's defaults */
	const bson_t *spec = sdb_collator_spec(c);
	assert_true(bson_iter_init_find(&it, spec, "strength"));
	assert_int_equal(bson_iter_int32(&it), 2);
	assert_true(bson_iter_init_find(&it, spec, "alternate"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "non-ignorable");
	assert_true(bson_iter_init_find(&it, spec, "maxVariable"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "punct");
	assert_true(bson_iter_init_find(&it, spec, "caseFirst"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "off");
	assert_true(bson_iter_init_find(&it, spec, "locale"));
	assert_string_equal(bson_iter_utf8(&it, NULL), "en_US");
	assert_int_equal(parse("{\"locale\": \"fr\", \"strength\": 3, \"caseLevel\": true, "
			       "\"caseFirst\": \"upper\", \"numericOrdering\": true, "
			       "\"alternate\": \"shifted\", \"maxVariable\": \"space\", "
			       "\"normalization\": true, \"backwards\": true}",
			       &c, err, sizeof err),
			 0);
	assert_true(bson_iter_init_find(&it, sdb_collator_spec(c), "backwards"));
	assert_true(bson_iter_bool(&it));
	assert_int_equal(parse("{\"locale\": \"root\"}", &c, err, sizeof err), 0);
	assert_int_equal(parse("{\"locale\": \"de@collation=phonebook\"}", &c, err, sizeof err), 0);
}

static void test_parse_errors(void **state)
{
	(void)state;
	const sdb_collator *c;
	char err[512];

	assert_int_equal(parse("{\"locale\": \"bogus\"}", &c, err, sizeof err), 2);
	assert_non_null(strstr(err, "Field 'locale' is invalid in:"));
	assert_int_equal(parse("{\"locale\": \"\"}", &c, err, sizeof err), 2);
	assert_non_null(strstr(err, "cannot be the empty string"));
	assert_int_equal(parse("{\"strength\": 2}", &c, err, sizeof err), 4);
	assert_int_equal(parse("{\"locale\": 1}", &c, err, sizeof err), 14);
	assert_int_equal(parse("{\"locale\": \"simple\", \"strength\": 2}", &c, err, sizeof err), 9);
	assert_non_null(strstr(err, "If locale=simple, no other fields should be present"));
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": 7}", &c, err, sizeof err), 9);
	assert_string_equal(err, "Field 'strength' must be an integer 1 through 5. Got: 7");
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": 0}", &c, err, sizeof err), 9);
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": 1.5}", &c, err, sizeof err), 2);
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": \"2\"}", &c, err, sizeof err), 14);
	assert_int_equal(parse("{\"locale\": \"en\", \"caseFirst\": \"x\"}", &c, err, sizeof err), 9);
	assert_string_equal(err, "Field 'caseFirst' must be 'upper', 'lower', or 'off'. Got: x");
	assert_int_equal(parse("{\"locale\": \"en\", \"alternate\": \"x\"}", &c, err, sizeof err), 9);
	assert_int_equal(parse("{\"locale\": \"en\", \"maxVariable\": \"x\"}", &c, err, sizeof err),
			 9);
	assert_int_equal(parse("{\"locale\": \"en\", \"caseLevel\": 1}", &c, err, sizeof err), 14);
	assert_int_equal(parse("{\"locale\": \"en\", \"foo\": 1}", &c, err, sizeof err), 9);
	assert_non_null(strstr(err, "Collation spec contains unknown field. Collation spec:"));
	assert_int_equal(parse("{\"locale\": \"en\", \"version\": \"1.0\"}", &c, err, sizeof err),
			 161);
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": 1, \"backwards\": true}", &c, err,
			       sizeof err),
			 2);
	assert_int_equal(parse("{\"locale\": \"en\", \"strength\": 2, \"caseFirst\": \"upper\"}", &c,
			       err, sizeof err),
			 2);
}

static int cmp(const sdb_collator *c, const char *a, const char *b)
{
	return sdb_collator_cmp(c, a, strlen(a), b, strlen(b));
}

static void key_of(const sdb_collator *c, const char *s, sdb_key *k)
{
	bson_value_t v = {.value_type = BSON_TYPE_UTF8};
	char err[64];

	v.value.v_utf8.str = (char *)s;
	v.value.v_utf8.len = (uint32_t)strlen(s);
	sdb_key_reset(k);
	assert_int_equal(sdb_keyenc_append_value_coll(k, &v, false, c, err, sizeof err), 0);
}

static void test_compare_and_keys(void **state)
{
	(void)state;
	const sdb_collator *s2, *num;
	char err[256];
	sdb_key a, b;

	assert_int_equal(parse("{\"locale\": \"en_US\", \"strength\": 2}", &s2, err, sizeof err), 0);
	assert_int_equal(parse("{\"locale\": \"en\", \"numericOrdering\": true}", &num, err, sizeof err),
			 0);
	assert_int_equal(cmp(s2, "PING", "ping"), 0);
	assert_true(cmp(s2, "pinG", "pong") < 0);
	assert_true(cmp(s2, "cafe", "café") < 0); /* strength 2 sees accents */
	assert_true(cmp(NULL, "PING", "ping") < 0);
	assert_true(cmp(num, "10", "9") > 0);
	assert_true(cmp(NULL, "10", "9") < 0);
	/* invalid UTF-8 does not crash */
	(void)sdb_collator_cmp(s2, "\xff\xfe", 2, "a", 1);

	sdb_key_init(&a);
	sdb_key_init(&b);
	key_of(s2, "PING", &a);
	key_of(s2, "ping", &b);
	assert_int_equal(sdb_key_cmp(&a, &b), 0);
	key_of(s2, "pong", &b);
	assert_true(sdb_key_cmp(&a, &b) < 0);
	key_of(num, "10", &a);
	key_of(num, "9", &b);
	assert_true(sdb_key_cmp(&a, &b) > 0);
	for (size_t i = 0; i + 2 < a.len; i++)
		assert_int_not_equal(a.data[i], 0); /* no 0x00 before the terminator */
	sdb_key_free(&a);
	sdb_key_free(&b);
}

static void test_thread_hook(void **state)
{
	(void)state;
	const sdb_collator *s2;
	char err[256];
	bson_t *x = J("{\"v\": \"PING\"}"), *y = J("{\"v\": \"ping\"}");
	bson_t *kx = J("{\"k\": \"PING\"}"), *ky = J("{\"k\": \"ping\"}");

	assert_int_equal(parse("{\"locale\": \"en_US\", \"strength\": 2}", &s2, err, sizeof err), 0);
	assert_true(sdb_bson_doc_cmp(x, y) != 0);
	assert_null(sdb_collation_use(s2));
	assert_ptr_equal(sdb_collation_current(), s2);
	assert_int_equal(sdb_bson_doc_cmp(x, y), 0);
	assert_true(sdb_bson_key_cmp(kx, ky) < 0); /* chunk bounds: always binary */
	assert_ptr_equal(sdb_collation_use(NULL), s2);
	assert_true(sdb_bson_doc_cmp(x, y) != 0);
	bson_destroy(x);
	bson_destroy(y);
	bson_destroy(kx);
	bson_destroy(ky);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ok),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_compare_and_keys),
		cmocka_unit_test(test_thread_hook),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
