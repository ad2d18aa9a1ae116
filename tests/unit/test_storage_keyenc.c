/* Unit tests of storage/keyenc.c (order-preserving key encoding) and storage/path.c
 * (path walks, index keys). The property test checks, on thousands of random values from
 * a fixed seed, that memcmp order of the keys equals sdb_bson_cmp order for every pair,
 * ascending and descending, single and compound. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/keyenc.c"
#include "../../storage/path.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/bsonval.h"
#include "storage/keyenc.h"
#include "storage/path.h"

static bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (!b)
		fail_msg("bad test JSON %s: %s", s, e.message);
	free(s);
	return b;
}

static int sign(int x)
{
	return (x > 0) - (x < 0);
}

/* Encode {'v': json}'s value into k (reset first). */
static void enc_json(const char *json, bool desc, sdb_key *k)
{
	char buf[512];
	bson_t *d;
	bson_iter_t it;
	char err[128];

	snprintf(buf, sizeof buf, "{'v': %s}", json);
	d = J(buf);
	assert_true(bson_iter_init_find(&it, d, "v"));
	sdb_key_reset(k);
	assert_int_equal(sdb_keyenc_append_iter(k, &it, desc, err, sizeof err), 0);
	bson_destroy(d);
}

static void expect_bytes(const char *json, const char *hex)
{
	sdb_key k;
	char got[512] = "";

	sdb_key_init(&k);
	enc_json(json, false, &k);
	for (size_t i = 0; i < k.len && strlen(got) + 4 < sizeof got; i++)
		snprintf(got + strlen(got), 4, "%s%02X", i ? " " : "", k.data[i]);
	if (strcmp(got, hex) != 0)
		fail_msg("enc(%s) = %s, want %s", json, got, hex);
	sdb_key_free(&k);
}

static void test_layout(void **state)
{
	(void)state;
	expect_bytes("null", "14");
	expect_bytes("{'$minKey': 1}", "0A");
	expect_bytes("{'$maxKey': 1}", "F0");
	/* numbers: 1 = 2^0 * 1.0 -> CLS 04, EXP 0x8000, FRAC 0; int, long, double alike */
	expect_bytes("1", "1E 04 80 00 00 00 00 00 00 00 00 00");
	expect_bytes("{'$numberLong': '1'}", "1E 04 80 00 00 00 00 00 00 00 00 00");
	expect_bytes("1.0", "1E 04 80 00 00 00 00 00 00 00 00 00");
	expect_bytes("{'$numberDecimal': '1'}", "1E 04 80 00 00 00 00 00 00 00 00 00");
	/* -1: the 10 bytes after CLS inverted */
	expect_bytes("-1", "1E 02 7F FF FF FF FF FF FF FF FF FF");
	/* 6 = 2^2 * 1.5 */
	expect_bytes("6", "1E 04 80 02 80 00 00 00 00 00 00 00");
	expect_bytes("0", "1E 03");
	expect_bytes("-0.0", "1E 03");
	expect_bytes("{'$numberDouble': 'NaN'}", "1E 00");
	expect_bytes("{'$numberDouble': '-Infinity'}", "1E 01");
	expect_bytes("{'$numberDouble': 'Infinity'}", "1E 05");
	expect_bytes("'ab'", "28 61 62 00 00");
	expect_bytes("{'$symbol': 'ab'}", "28 61 62 00 00");
	expect_bytes("''", "28 00 00");
	expect_bytes("{}", "32 00");
	expect_bytes("{'a': null}", "32 14 61 00 00 00");
	expect_bytes("[]", "3C 00");
	expect_bytes("[true]", "3C 5A 01 00");
	expect_bytes("{'$binary': {'base64': 'AQI=', 'subType': '05'}}", "46 00 00 00 02 05 01 02");
	expect_bytes("false", "5A 00");
	expect_bytes("{'$date': {'$numberLong': '1'}}", "64 80 00 00 00 00 00 00 01");
	expect_bytes("{'$date': {'$numberLong': '-1'}}", "64 7F FF FF FF FF FF FF FF");
	expect_bytes("{'$timestamp': {'t': 1, 'i': 2}}", "6E 00 00 00 01 00 00 00 02");
	expect_bytes("{'$regularExpression': {'pattern': 'a', 'options': 'i'}}",
		     "78 61 00 00 69 00 00");
	expect_bytes("{'$code': 'x'}", "8C 78 00 00");
}

static void test_embedded_nul_and_missing(void **state)
{
	bson_t d = BSON_INITIALIZER;
	bson_iter_t it;
	sdb_key k, a, b;
	char err[128];
	static const uint8_t want[] = {0x28, 'a', 0x00, 0xff, 'b', 0x00, 0x00};

	(void)state;
	sdb_key_init(&k);
	sdb_key_init(&a);
	sdb_key_init(&b);
	bson_append_utf8(&d, "v", 1, "a\0b", 3);
	assert_true(bson_iter_init_find(&it, &d, "v"));
	assert_int_equal(sdb_keyenc_append_iter(&k, &it, false, err, sizeof err), 0);
	assert_int_equal(k.len, sizeof want);
	assert_memory_equal(k.data, want, sizeof want);
	/* "a" < "a\0b" < "ab" in both orders */
	enc_json("'a'", false, &a);
	assert_true(sdb_key_cmp(&a, &k) < 0);
	enc_json("'ab'", false, &b);
	assert_true(sdb_key_cmp(&k, &b) < 0);
	/* missing encodes as null */
	sdb_key_reset(&k);
	assert_int_equal(sdb_keyenc_append_iter(&k, NULL, false, err, sizeof err), 0);
	assert_int_equal(k.len, 1);
	assert_int_equal(k.data[0], 0x14);
	/* desc inverts */
	sdb_key_reset(&k);
	assert_int_equal(sdb_keyenc_append_iter(&k, NULL, true, err, sizeof err), 0);
	assert_int_equal(k.data[0], 0xEB);
	sdb_key_free(&k);
	sdb_key_free(&a);
	sdb_key_free(&b);
	bson_destroy(&d);
}

static void test_too_deep(void **state)
{
	bson_t *cur = bson_new();
	bson_iter_t it;
	sdb_key k;
	char err[128] = "";

	(void)state;
	BSON_APPEND_INT32(cur, "x", 1);
	for (int i = 0; i < SDB_BSON_MAX_DEPTH + 5; i++) {
		bson_t *outer = bson_new();

		BSON_APPEND_DOCUMENT(outer, "v", cur);
		bson_destroy(cur);
		cur = outer;
	}
	sdb_key_init(&k);
	sdb_key_append(&k, "zz", 2);
	assert_true(bson_iter_init_find(&it, cur, "v"));
	assert_int_equal(sdb_keyenc_append_iter(&k, &it, false, err, sizeof err), -2);
	assert_int_equal(k.len, 2); /* restored */
	assert_string_equal(err, "key encoding: document nested deeper than 200 levels");
	sdb_key_free(&k);
	bson_destroy(cur);
}

static void test_prefix_successor(void **state)
{
	static const uint8_t p1[] = {0x1e, 0x04, 0xff, 0xff};
	static const uint8_t p2[] = {0xff, 0xff};
	sdb_key out;

	(void)state;
	sdb_key_init(&out);
	assert_true(sdb_key_prefix_successor(p1, sizeof p1, &out));
	assert_int_equal(out.len, 2);
	assert_int_equal(out.data[0], 0x1e);
	assert_int_equal(out.data[1], 0x05);
	assert_false(sdb_key_prefix_successor(p2, sizeof p2, &out));
	assert_int_equal(out.len, 0);
	assert_int_equal(sdb_keyenc_bracket_byte(SDB_BRACKET_NUMBER), 0x1e);
	assert_int_equal(sdb_key_cmp_raw(p1, 2, p1, 4), -1);
	sdb_key_free(&out);
}

/* ---- property test ------------------------------------------------------------------ */

static uint64_t rng_state = 0x5DEECE66DULL; /* fixed seed */

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	rng_state = x;
	return x;
}

static unsigned pick(unsigned n)
{
	return (unsigned)(rnd() % n);
}

static void gen_value(bson_t *parent, const char *key, int depth);

static void gen_doc_body(bson_t *d, bool array, int depth)
{
	static const char *const names[] = {"a", "b", "", "ab"};
	unsigned n = pick(4);
	char ibuf[16];

	for (unsigned i = 0; i < n; i++) {
		const char *k;

		if (array) {
			snprintf(ibuf, sizeof ibuf, "%u", i);
			k = ibuf;
		} else {
			k = names[pick(4)];
		}
		gen_value(d, k, depth + 1);
	}
}

static void gen_value(bson_t *parent, const char *key, int depth)
{
	static const int64_t ints[] = {0, 1, -1, 2, -2, 3, 100, -100, 9007199254740992LL,
				       9007199254740993LL, -9007199254740993LL, INT64_MAX,
				       INT64_MIN, INT64_MAX - 1, 1LL << 62};
	static const double dbls[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1.5, 100.0, 1e300,
				      -1e300, 5e-324, -5e-324, 9007199254740992.0,
				      9223372036854775808.0, -9223372036854775808.0, 0.1, 3.0,
				      2.5e-310};
	static const char *const decs[] = {"0", "1", "-1", "1.5", "0.1", "1E+400", "-1E+400",
					   "NaN", "Infinity", "-Infinity", "100", "2.50",
					   "9007199254740993", "-0",
					   "0.1000000000000000055511151231257827",
					   "1.000000000000000000001", "-1.000000000000000000001",
					   "18446744073709551617", "1E-6176", "-1.0000",
					   "9.999999999999999999999999999999999E+6144"};
	static const char *const strs[] = {"", "a", "b", "ab", "a\0", "\0", "ba", "\xc3\xa9",
					   "\xff"};
	static const size_t strl[] = {0, 1, 1, 2, 2, 1, 2, 2, 1};
	unsigned t = pick(depth >= 3 ? 20 : 22);
	bson_t sub;
	uint8_t bin[2];
	bson_oid_t oid;

	switch (t) {
	case 0:
		bson_append_int32(parent, key, -1, (int32_t)(pick(7)) - 3);
		break;
	case 1:
		bson_append_int64(parent, key, -1, ints[pick(sizeof ints / sizeof ints[0])]);
		break;
	case 2:
	case 3: {
		double d = dbls[pick(sizeof dbls / sizeof dbls[0])];

		if (pick(10) == 0)
			d = pick(2) ? 1.0 / 0.0 : -1.0 / 0.0;
		if (pick(20) == 0)
			d = 0.0 / 0.0;
		bson_append_double(parent, key, -1, d);
		break;
	}
	case 4: {
		bson_decimal128_t dec;

		bson_decimal128_from_string(decs[pick(sizeof decs / sizeof decs[0])], &dec);
		bson_append_decimal128(parent, key, -1, &dec);
		break;
	}
	case 5:
	case 6: {
		unsigned i = pick(sizeof strs / sizeof strs[0]);

		if (t == 5)
			bson_append_utf8(parent, key, -1, strs[i], (int)strl[i]);
		else
			bson_append_symbol(parent, key, -1, strs[i], (int)strl[i]);
		break;
	}
	case 7:
		bson_append_null(parent, key, -1);
		break;
	case 8:
		bson_append_undefined(parent, key, -1);
		break;
	case 9:
		bson_append_minkey(parent, key, -1);
		break;
	case 10:
		bson_append_maxkey(parent, key, -1);
		break;
	case 11:
		bin[0] = (uint8_t)pick(3);
		bin[1] = (uint8_t)(pick(2) * 255);
		bson_append_binary(parent, key, -1, pick(2) ? BSON_SUBTYPE_BINARY : BSON_SUBTYPE_UUID,
				   bin, pick(3));
		break;
	case 12:
		memset(oid.bytes, 0, 12);
		oid.bytes[pick(12)] = (uint8_t)pick(256);
		bson_append_oid(parent, key, -1, &oid);
		break;
	case 13:
		bson_append_bool(parent, key, -1, pick(2));
		break;
	case 14:
		bson_append_date_time(parent, key, -1, (int64_t)pick(5) - 2 + (pick(2) ? INT64_MIN / 2 : 0));
		break;
	case 15:
		bson_append_timestamp(parent, key, -1, pick(2) ? 0xffffffffu : pick(3), pick(3));
		break;
	case 16:
		bson_append_regex(parent, key, -1, pick(2) ? "a" : "ab", pick(2) ? "" : "i");
		break;
	case 17:
		bson_append_code(parent, key, -1, pick(2) ? "x" : "y");
		break;
	case 18: {
		bson_t scope = BSON_INITIALIZER;

		if (pick(2))
			BSON_APPEND_INT32(&scope, "a", (int32_t)pick(2));
		bson_append_code_with_scope(parent, key, -1, pick(2) ? "x" : "y", &scope);
		bson_destroy(&scope);
		break;
	}
	case 19:
		memset(oid.bytes, 0, 12);
		oid.bytes[11] = (uint8_t)pick(2);
		bson_append_dbpointer(parent, key, -1, pick(2) ? "b" : "aa", &oid);
		break;
	case 20:
		bson_append_document_begin(parent, key, -1, &sub);
		gen_doc_body(&sub, false, depth);
		bson_append_document_end(parent, &sub);
		break;
	default:
		bson_append_array_begin(parent, key, -1, &sub);
		gen_doc_body(&sub, true, depth);
		bson_append_array_end(parent, &sub);
		break;
	}
}

#define N_RANDOM 2500

/* Number of values equal to an earlier value (so distinct = n - n_dups). */
static size_t n_dups(const bson_value_t *v, size_t n)
{
	size_t d = 0;

	for (size_t i = 1; i < n; i++) {
		for (size_t j = 0; j < i; j++) {
			if (sdb_bson_value_cmp(&v[i], &v[j]) == 0) {
				d++;
				break;
			}
		}
	}
	return d;
}

static void test_property_random(void **state)
{
	bson_t **docs = calloc(N_RANDOM, sizeof *docs);
	sdb_key *asc = calloc(N_RANDOM, sizeof *asc), *desc = calloc(N_RANDOM, sizeof *desc);
	/* shallow values pointing into docs[i] (arrays of bson_iter_t are misaligned) */
	bson_value_t *vals = calloc(N_RANDOM, sizeof *vals);
	char err[128];
	size_t n_equal = 0, n_pairs = 0;

	(void)state;
	for (size_t i = 0; i < N_RANDOM; i++) {
		docs[i] = bson_new();
		gen_value(docs[i], "v", 0);
		bson_iter_t it;

		assert_true(bson_iter_init_find(&it, docs[i], "v"));
		vals[i] = *bson_iter_value(&it);
		assert_int_equal(sdb_keyenc_append_value(&asc[i], &vals[i], false, err, sizeof err), 0);
		assert_int_equal(sdb_keyenc_append_value(&desc[i], &vals[i], true, err, sizeof err), 0);
	}
	for (size_t i = 0; i < N_RANDOM; i++) {
		for (size_t j = i; j < N_RANDOM; j++) {
			int c = sign(sdb_bson_value_cmp(&vals[i], &vals[j]));
			int ka = sign(sdb_key_cmp(&asc[i], &asc[j]));
			int kd = sign(sdb_key_cmp(&desc[i], &desc[j]));

			n_pairs++;
			n_equal += c == 0;
			if (ka != c || kd != -c) {
				char *a = bson_as_relaxed_extended_json(docs[i], NULL);
				char *b = bson_as_relaxed_extended_json(docs[j], NULL);

				fail_msg("cmp(%s, %s) = %d but asc keys %d, desc keys %d", a, b, c, ka,
					 kd);
			}
		}
	}
	/* the generator produced both equal and unequal pairs in quantity */
	assert_true(n_equal > 1000);
	assert_true(n_pairs - n_equal > 1000000);

	/* compound keys (v_i asc, v_k desc) vs (v_j asc, v_l desc) */
	for (int r = 0; r < 200000; r++) {
		size_t i = pick(N_RANDOM), j = pick(N_RANDOM), k = pick(N_RANDOM), l = pick(N_RANDOM);
		sdb_key x, y;
		int want, got;

		if (pick(4) == 0)
			j = i; /* force ties on the first component */
		sdb_key_init(&x);
		sdb_key_init(&y);
		sdb_key_append(&x, asc[i].data, asc[i].len);
		sdb_key_append(&x, desc[k].data, desc[k].len);
		sdb_key_append(&y, asc[j].data, asc[j].len);
		sdb_key_append(&y, desc[l].data, desc[l].len);
		want = sign(sdb_bson_value_cmp(&vals[i], &vals[j]));
		if (want == 0)
			want = -sign(sdb_bson_value_cmp(&vals[k], &vals[l]));
		got = sign(sdb_key_cmp(&x, &y));
		if (got != want)
			fail_msg("compound mismatch at round %d: got %d want %d", r, got, want);
		sdb_key_free(&x);
		sdb_key_free(&y);
	}
	/* SQLite orders BLOB primary keys the same way: insert every key (duplicates
	 * ignored), read them back in index order and check the values ascend. */
	{
		sqlite3 *db;
		sqlite3_stmt *ins, *sel;
		int prev = -1, rows = 0;

		assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
		assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(k BLOB PRIMARY KEY, i INT) WITHOUT ROWID",
					      NULL, NULL, NULL),
				 SQLITE_OK);
		assert_int_equal(sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO t VALUES(?, ?)", -1, &ins,
						    NULL),
				 SQLITE_OK);
		for (size_t i = 0; i < N_RANDOM; i++) {
			sqlite3_bind_blob(ins, 1, asc[i].data, (int)asc[i].len, SQLITE_STATIC);
			sqlite3_bind_int(ins, 2, (int)i);
			assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
			sqlite3_reset(ins);
		}
		sqlite3_finalize(ins);
		assert_int_equal(sqlite3_prepare_v2(db, "SELECT i FROM t ORDER BY k", -1, &sel, NULL),
				 SQLITE_OK);
		while (sqlite3_step(sel) == SQLITE_ROW) {
			int i = sqlite3_column_int(sel, 0);

			if (prev >= 0 && sdb_bson_value_cmp(&vals[prev], &vals[i]) >= 0)
				fail_msg("SQLite order: value %d does not sort after value %d", i, prev);
			prev = i;
			rows++;
		}
		sqlite3_finalize(sel);
		sqlite3_close(db);
		/* one row per distinct value */
		assert_int_equal(rows, (int)(N_RANDOM - n_dups(vals, N_RANDOM)));
	}
	for (size_t i = 0; i < N_RANDOM; i++) {
		sdb_key_free(&asc[i]);
		sdb_key_free(&desc[i]);
		bson_destroy(docs[i]);
	}
	free(docs);
	free(asc);
	free(desc);
	free(vals);
}

/* ---- path walks ------------------------------------------------------------------- */

typedef struct collect {
	char out[512];
} collect;

static bool collect_visit(void *ctx, const bson_iter_t *it, unsigned flags)
{
	collect *c = ctx;
	char buf[128];

	if (flags & SDB_PATH_MISSING) {
		snprintf(buf, sizeof buf, "%sMISSING", c->out[0] ? " " : "");
	} else {
		bson_t tmp = BSON_INITIALIZER;
		char *j;
		size_t n;

		bson_append_iter(&tmp, "", 0, it);
		j = bson_as_relaxed_extended_json(&tmp, NULL);
		/* j is '{ "" : VALUE }' */
		n = strlen(j);
		snprintf(buf, sizeof buf, "%s%s%.*s", c->out[0] ? " " : "",
			 (flags & SDB_PATH_ELEM) ? "e:" : "", (int)(n - 9), j + 7);
		bson_free(j);
		bson_destroy(&tmp);
	}
	strncat(c->out, buf, sizeof c->out - strlen(c->out) - 1);
	return false;
}

static void expect_walk(const char *doc, const char *path, unsigned opts, const char *want)
{
	bson_t *d = J(doc);
	collect c = {{0}};

	sdb_path_walk(d, path, opts, collect_visit, &c);
	if (strcmp(c.out, want) != 0)
		fail_msg("walk(%s, %s) = '%s', want '%s'", doc, path, c.out, want);
	bson_destroy(d);
}

static void test_path_walk(void **state)
{
	(void)state;
	expect_walk("{'a': 1}", "a", 0, "1");
	expect_walk("{'a': 1}", "b", 0, "MISSING");
	expect_walk("{'a': 5}", "a.b", 0, "MISSING");
	expect_walk("{'a': {'b': 2}}", "a.b", 0, "2");
	expect_walk("{'a': [1, 2]}", "a", SDB_PATH_EXPAND_LEAF, "[ 1, 2 ] e:1 e:2");
	expect_walk("{'a': [1, 2]}", "a", 0, "[ 1, 2 ]");
	expect_walk("{'a': [1, [2]]}", "a", SDB_PATH_EXPAND_LEAF, "[ 1, [ 2 ] ] e:1 e:[ 2 ]");
	expect_walk("{'a': [1, 2]}", "a.b", SDB_PATH_EXPAND_LEAF, "");
	expect_walk("{'a': [{'b': 1}, {'b': [2, 3]}, {'c': 1}, 7]}", "a.b", SDB_PATH_EXPAND_LEAF,
		    "1 [ 2, 3 ] e:2 e:3 MISSING");
	expect_walk("{'a': [5, 6]}", "a.1", 0, "6");
	expect_walk("{'a': [5, 6]}", "a.2", 0, "");
	expect_walk("{'a': [{'b': 1}, {'b': 2}]}", "a.1.b", 0, "2");
	expect_walk("{'a': [{'0': 'x'}, 4]}", "a.0", 0, "{ \"0\" : \"x\" } \"x\"");
	expect_walk("{'a': [[{'b': 1}]]}", "a.b", 0, "");
	expect_walk("{'a': {'b': {'c': [1]}}}", "a.b.c", SDB_PATH_EXPAND_LEAF, "[ 1 ] e:1");
	{
		/* walking from an element: a document and an array container */
		bson_t *d = J("{'doc': {'b': [7, 8]}, 'arr': [{'b': 1}, 2, {'c': 3}]}");
		bson_iter_t it;
		collect c1 = {{0}}, c2 = {{0}};

		assert_true(bson_iter_init_find(&it, d, "doc"));
		assert_false(sdb_path_walk_iter(&it, "b", SDB_PATH_EXPAND_LEAF, collect_visit, &c1));
		assert_string_equal(c1.out, "[ 7, 8 ] e:7 e:8");
		assert_true(bson_iter_init_find(&it, d, "arr"));
		assert_false(sdb_path_walk_iter(&it, "b", 0, collect_visit, &c2));
		assert_string_equal(c2.out, "1 MISSING");
		bson_destroy(d);
	}
}

/* ---- index keys ------------------------------------------------------------------- */

/* Keys of doc for an index, rendered as one string "K1 | K2 | ..." where each key is
 * the concatenation of the fields' rendered values (via a reference encoding). */
static void expect_keys(const char *doc, const char *const *paths, const bool *desc, size_t n,
			const char *const *want_values, size_t n_want, bool want_multikey)
{
	bson_t *d = J(doc);
	sdb_key *keys = NULL;
	size_t nkeys = 0;
	bool multikey = false;
	int code = -1;
	char err[256] = "";

	assert_int_equal(sdb_index_keys(d, paths, desc, n, &keys, &nkeys, &multikey, &code, err,
					sizeof err),
			 0);
	if (nkeys != n_want)
		fail_msg("%s: %zu keys, want %zu", doc, nkeys, n_want);
	assert_int_equal(multikey, want_multikey);
	/* want_values[i] is a JSON array of the field values of key i, ascending key order */
	for (size_t i = 0; i < n_want; i++) {
		char buf[256];
		bson_t *w;
		bson_iter_t it, arr;
		sdb_key ref;
		size_t f = 0;

		snprintf(buf, sizeof buf, "{'k': %s}", want_values[i]);
		w = J(buf);
		sdb_key_init(&ref);
		assert_true(bson_iter_init_find(&it, w, "k"));
		assert_true(bson_iter_recurse(&it, &arr));
		while (bson_iter_next(&arr)) {
			assert_int_equal(sdb_keyenc_append_iter(&ref, &arr, desc ? desc[f] : false, err,
								sizeof err),
					 0);
			f++;
		}
		if (sdb_key_cmp(&ref, &keys[i]) != 0)
			fail_msg("%s: key %zu differs from %s", doc, i, want_values[i]);
		sdb_key_free(&ref);
		bson_destroy(w);
	}
	sdb_index_keys_free(keys, nkeys);
	bson_destroy(d);
}

static void test_index_keys(void **state)
{
	static const char *const pa[] = {"a"};
	static const char *const pab[] = {"a.b"};
	static const char *const pa_c[] = {"a", "c"};
	static const bool asc_desc[] = {false, true};

	(void)state;
	{
		static const char *const w[] = {"[1]"};

		expect_keys("{'a': 1}", pa, NULL, 1, w, 1, false);
	}
	{
		static const char *const w[] = {"[null]"};

		expect_keys("{'b': 1}", pa, NULL, 1, w, 1, false);
	}
	{
		static const char *const w[] = {"[{'$undefined': true}]"};

		expect_keys("{'a': []}", pa, NULL, 1, w, 1, true);
	}
	{
		/* duplicates collapse; 1 and 1.0 are one key; nested arrays stay whole */
		static const char *const w[] = {"[1]", "[2]", "[[3]]"};

		expect_keys("{'a': [2, 1, 1.0, [3]]}", pa, NULL, 1, w, 3, true);
	}
	{
		static const char *const w[] = {"[null]", "[1]", "[2]", "[3]"};

		expect_keys("{'a': [{'b': 1}, {'b': [2, 3]}, {'c': 1}]}", pab, NULL, 1, w, 4, true);
	}
	{
		/* compound (a asc, c desc): keys sort by a, then c descending */
		static const char *const w[] = {"[1, 5]", "[2, 5]"};

		expect_keys("{'a': [2, 1], 'c': 5}", pa_c, asc_desc, 2, w, 2, true);
	}
	{
		static const char *const w[] = {"[3, 9]", "[3, 1]"};

		expect_keys("{'a': 3, 'c': [1, 9]}", pa_c, asc_desc, 2, w, 2, true);
	}
}

static void test_index_keys_errors(void **state)
{
	static const char *const pab[] = {"a", "b"};
	static const char *const pxy[] = {"x.y", "x.z"};
	static const char *const pbad[] = {"a..b"};
	bson_t *d = J("{'a': [1, 2], 'b': [3]}");
	bson_t *ok = J("{'x': [{'y': 1, 'z': 2}]}");
	sdb_key *keys = (sdb_key *)1;
	size_t nkeys = 7;
	bool mk;
	int code = 0;
	char err[256] = "";

	(void)state;
	assert_int_equal(sdb_index_keys(d, pab, NULL, 2, &keys, &nkeys, &mk, &code, err, sizeof err),
			 -2);
	assert_int_equal(code, 171);
	assert_string_equal(err, "cannot index parallel arrays [b] [a]");
	assert_null(keys);
	assert_int_equal(nkeys, 0);
	/* two fields through the same array are not parallel */
	assert_int_equal(
		sdb_index_keys(ok, pxy, NULL, 2, &keys, &nkeys, &mk, &code, err, sizeof err), 0);
	assert_int_equal(nkeys, 1);
	assert_true(mk);
	sdb_index_keys_free(keys, nkeys);
	assert_int_equal(
		sdb_index_keys(ok, pbad, NULL, 1, &keys, &nkeys, &mk, &code, err, sizeof err), -2);
	assert_int_equal(code, 2);
	assert_string_equal(err, "FieldPath field names may not be empty strings.");
	bson_destroy(d);
	bson_destroy(ok);
}

static void test_sort_value(void **state)
{
	bson_t *d = J("{'a': [3, 'x', 1], 'e': [], 'n': {'m': [{'k': 2}, {'k': 8}]}}");
	bson_value_t v;

	(void)state;
	sdb_path_sort_value(d, "a", false, &v);
	assert_int_equal(v.value_type, BSON_TYPE_INT32);
	assert_int_equal(v.value.v_int32, 1);
	sdb_path_sort_value(d, "a", true, &v);
	assert_int_equal(v.value_type, BSON_TYPE_UTF8);
	assert_string_equal(v.value.v_utf8.str, "x");
	sdb_path_sort_value(d, "e", false, &v);
	assert_int_equal(v.value_type, BSON_TYPE_UNDEFINED);
	sdb_path_sort_value(d, "zz", true, &v);
	assert_int_equal(v.value_type, BSON_TYPE_NULL);
	sdb_path_sort_value(d, "n.m.k", true, &v);
	assert_int_equal(v.value.v_int32, 8);
	bson_destroy(d);
}

static void test_path_valid(void **state)
{
	char err[128];

	(void)state;
	assert_true(sdb_path_valid("a.b.0", err, sizeof err));
	assert_false(sdb_path_valid("", err, sizeof err));
	assert_string_equal(err, "FieldPath cannot be constructed with empty string");
	assert_false(sdb_path_valid("a.", err, sizeof err));
	assert_string_equal(err, "FieldPath field names may not be empty strings.");
	assert_false(sdb_path_valid("a.$b", err, sizeof err));
	assert_string_equal(err, "FieldPath field names may not start with '$'.");
}


/* comp_index (static of path.c, reachable because the test includes it): which path
 * components are array indexes. MongoDB treats "a.01" as the field "01", not index 1, so a
 * leading zero makes a name; at most 9 digits; only the given length is read. -1 = a name. */
static void test_static_path_comp_index(void **state)
{
	(void)state;
	assert_int_equal(comp_index("0", 1), 0);
	assert_int_equal(comp_index("7", 1), 7);
	assert_int_equal(comp_index("12", 2), 12);
	assert_int_equal(comp_index("123456789", 9), 123456789);
	assert_int_equal(comp_index("12x", 2), 12);
	assert_int_equal(comp_index("01", 2), -1);
	assert_int_equal(comp_index("00", 2), -1);
	assert_int_equal(comp_index("1234567890", 10), -1);
	assert_int_equal(comp_index("", 0), -1);
	assert_int_equal(comp_index("1a", 2), -1);
	assert_int_equal(comp_index("-1", 2), -1);
	assert_int_equal(comp_index("a", 1), -1);
}

/* The hashed index / hashed shard key hash is persistent (index keys on disk, chunk bounds in
 * metadata): these outputs were computed by the build of main before Decimal128 compared
 * exactly (935bb4b) and must never change. Decimals that differ only past ~19 digits hash
 * equally (their frozen form is the nearest long double). */
enum pin_type { DEC, DBL, LNG, INT };
static const struct hash_pin {
	enum pin_type t;
	const char *dec;
	double d;
	int64_t i;
	int64_t hash;
} hash_pins[] = {
	{DEC, "0", 0, 0, INT64_C(8924569608518389251)},
	{DEC, "-0", 0, 0, INT64_C(8924569608518389251)},
	{DEC, "1", 0, 0, INT64_C(3235034393090097035)},
	{DEC, "1.0", 0, 0, INT64_C(3235034393090097035)},
	{DEC, "1.00", 0, 0, INT64_C(3235034393090097035)},
	{DEC, "-1", 0, 0, INT64_C(3303350807650136534)},
	{DEC, "0.1", 0, 0, INT64_C(3748836102303173800)},
	{DEC, "0.3", 0, 0, INT64_C(-7883631219378635812)},
	{DEC, "-0.1", 0, 0, INT64_C(2643124114823560814)},
	{DEC, "2.5", 0, 0, INT64_C(-6245402185582680816)},
	{DEC, "1234567890123456789012.901", 0, 0, INT64_C(6369089137331914789)},
	{DEC, "1234567890123456789012.902", 0, 0, INT64_C(6369089137331914789)},
	{DEC, "1234567890123456789012.903", 0, 0, INT64_C(6369089137331914789)},
	{DEC, "-1234567890123456789012.902", 0, 0, INT64_C(5254113816263918968)},
	{DEC, "1.000000000000000000000000000000001", 0, 0, INT64_C(3235034393090097035)},
	{DEC, "9.999999999999999999999999999999999E+6144", 0, 0, INT64_C(6289209090275509736)},
	{DEC, "1E-6176", 0, 0, INT64_C(8924569608518389251)},
	{DEC, "-1E-6176", 0, 0, INT64_C(8924569608518389251)},
	{DEC, "12345678901234567890", 0, 0, INT64_C(-2967700490945852055)},
	{DEC, "9223372036854775807", 0, 0, INT64_C(8478723752207645926)},
	{DEC, "9223372036854775808", 0, 0, INT64_C(5640208316659734213)},
	{DEC, "3.14159265358979323846264338327950", 0, 0, INT64_C(-2000934187601772887)},
	{DEC, "1E+400", 0, 0, INT64_C(-1103611042455361292)},
	{DEC, "NaN", 0, 0, INT64_C(1568093803270359220)},
	{DEC, "-NaN", 0, 0, INT64_C(1568093803270359220)},
	{DEC, "Infinity", 0, 0, INT64_C(6289209090275509736)},
	{DEC, "-Infinity", 0, 0, INT64_C(6979476090002606672)},
	{DEC, "100.25", 0, 0, INT64_C(8328670909868852328)},
	{DEC, "0.000001", 0, 0, INT64_C(2102949069190224993)},
	{DBL, NULL, 0.0, 0, INT64_C(8924569608518389251)},
	{DBL, NULL, -0.0, 0, INT64_C(8924569608518389251)},
	{DBL, NULL, 1.0, 0, INT64_C(3235034393090097035)},
	{DBL, NULL, 0.1, 0, INT64_C(-357099500260382941)},
	{DBL, NULL, -2.5, 0, INT64_C(-756075230481211806)},
	{DBL, NULL, 1e300, 0, INT64_C(466133786247615008)},
	{DBL, NULL, 9007199254740993.0, 0, INT64_C(8595103018120587114)},
	{DBL, NULL, 1.0 / 3.0, 0, INT64_C(7190172037984143058)},
	{LNG, NULL, 0, INT64_C(0), INT64_C(8924569608518389251)},
	{LNG, NULL, 0, INT64_C(1), INT64_C(3235034393090097035)},
	{LNG, NULL, 0, INT64_C(-1), INT64_C(3303350807650136534)},
	{LNG, NULL, 0, INT64_C(9223372036854775807), INT64_C(8478723752207645926)},
	{LNG, NULL, 0, INT64_MIN, INT64_C(-6572878590374656841)},
	{LNG, NULL, 0, INT64_C(1234567890123), INT64_C(-8169827024519678077)},
	{INT, NULL, 0, 0, INT64_C(8924569608518389251)},
	{INT, NULL, 0, 1, INT64_C(3235034393090097035)},
	{INT, NULL, 0, -1, INT64_C(3303350807650136534)},
	{INT, NULL, 0, 2147483647, INT64_C(-448167640339093878)},
	{INT, NULL, 0, -2147483648, INT64_C(7098782309295932069)},
	{INT, NULL, 0, 42, INT64_C(8206821337190021826)},
};

static void test_hash_pinned(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof hash_pins / sizeof hash_pins[0]; i++) {
		const struct hash_pin *p = &hash_pins[i];
		bson_value_t v;
		sdb_key k;
		char err[64];
		int64_t h = 0;

		memset(&v, 0, sizeof v);
		switch (p->t) {
		case DEC:
			v.value_type = BSON_TYPE_DECIMAL128;
			assert_true(bson_decimal128_from_string(p->dec, &v.value.v_decimal128));
			break;
		case DBL:
			v.value_type = BSON_TYPE_DOUBLE;
			v.value.v_double = p->d;
			break;
		case LNG:
			v.value_type = BSON_TYPE_INT64;
			v.value.v_int64 = p->i;
			break;
		case INT:
			v.value_type = BSON_TYPE_INT32;
			v.value.v_int32 = (int32_t)p->i;
			break;
		}
		if (sdb_keyenc_hash_value(&v) != p->hash)
			fail_msg("pin %zu (%s): hash %lld, pinned %lld", i, p->dec ? p->dec : "-",
				 (long long)sdb_keyenc_hash_value(&v), (long long)p->hash);
		/* the planner's path: the same hash from the exact encoding */
		sdb_key_init(&k);
		assert_int_equal(sdb_keyenc_append_value(&k, &v, false, err, sizeof err), 0);
		assert_true(sdb_keyenc_hash_encoded(k.data, k.len, &h));
		if (h != p->hash)
			fail_msg("pin %zu (%s): hash from encoding %lld, pinned %lld", i,
				 p->dec ? p->dec : "-", (long long)h, (long long)p->hash);
		sdb_key_free(&k);
	}
}

/* Nested numbers: the frozen hash of a document or array holding a decimal (pinned as
 * above); from an exact encoding it is not computable, and hash_encoded says so. */
static void test_hash_pinned_nested(void **state)
{
	static const struct {
		const char *json;
		int64_t hash;
	} pins[] = {
		{"{\"a\": [{\"$numberDecimal\": \"0.1\"}, 2.5]}", INT64_C(-5499634122029085523)},
		{"{\"a\": {\"x\": {\"$numberDecimal\": \"-7.000000000000000000000000000000001\"}}}",
		 INT64_C(-7055928438284443264)},
	};

	(void)state;
	for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++) {
		bson_error_t e;
		bson_t *d = bson_new_from_json((const uint8_t *)pins[i].json, -1, &e);
		bson_iter_t it;
		sdb_key k;
		char err[64];
		int64_t h = 0;

		assert_non_null(d);
		assert_true(bson_iter_init_find(&it, d, "a"));
		assert_int_equal(sdb_keyenc_hash_value(bson_iter_value(&it)), pins[i].hash);
		sdb_key_init(&k);
		assert_int_equal(sdb_keyenc_append_value(&k, bson_iter_value(&it), false, err,
							 sizeof err), 0);
		assert_false(sdb_keyenc_hash_encoded(k.data, k.len, &h));
		sdb_key_free(&k);
		bson_destroy(d);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_embedded_nul_and_missing),
		cmocka_unit_test(test_too_deep),
		cmocka_unit_test(test_prefix_successor),
		cmocka_unit_test(test_property_random),
		cmocka_unit_test(test_path_walk),
		cmocka_unit_test(test_index_keys),
		cmocka_unit_test(test_index_keys_errors),
		cmocka_unit_test(test_sort_value),
		cmocka_unit_test(test_path_valid),
		cmocka_unit_test(test_static_path_comp_index),
		cmocka_unit_test(test_hash_pinned),
		cmocka_unit_test(test_hash_pinned_nested),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
